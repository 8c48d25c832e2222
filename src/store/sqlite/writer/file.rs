//! The database file beside the writer: what it is, to notice it removed
//! or replaced while serving, and the thread that checkpoints its WAL.

use rusqlite::Connection;

use crate::store::StoreError;

/// The database file as it was opened: its path and what it is (device and
/// inode), to notice it being removed or replaced while serving.
pub struct FileIdentity {
    path: std::path::PathBuf,
    dev: u64,
    ino: u64,
    /// Hard links to it when opened.
    pub links: u64,
}

impl FileIdentity {
    pub fn of(path: &std::path::Path) -> Result<Self, StoreError> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path)
            .map_err(|e| StoreError::Unavailable(format!("cannot read {}: {e}", path.display())))?;
        Ok(FileIdentity {
            path: path.to_owned(),
            dev: meta.dev(),
            ino: meta.ino(),
            links: meta.nlink(),
        })
    }

    /// Fails when the path no longer names the opened file.
    pub(super) fn check(&self) -> Result<(), StoreError> {
        use std::os::unix::fs::MetadataExt;
        match std::fs::metadata(&self.path) {
            Ok(meta) if meta.dev() == self.dev && meta.ino() == self.ino => Ok(()),
            Ok(_) => Err(StoreError::Unavailable(format!(
                "the database file {} was replaced while the server ran; writes are refused \
                 so that none is acknowledged and lost (restart the server)",
                self.path.display()
            ))),
            Err(e) => Err(StoreError::Unavailable(format!(
                "the database file {} is gone ({e}); writes are refused so that none is \
                 acknowledged and lost (restart the server)",
                self.path.display()
            ))),
        }
    }
}

/// Checkpoints the WAL into the database on its own connection whenever
/// the writer asks, until the writer stops.
///
/// A checkpoint run by the writer itself (SQLite's automatic one, at
/// [`WAL_CHECKPOINT_PAGES`](super::super::WAL_CHECKPOINT_PAGES)) stalls
/// every caller of the batch behind it while it copies pages. A PASSIVE
/// checkpoint on another connection runs beside the writer, and once it has
/// caught up SQLite restarts the WAL from its start at the next write, so
/// the automatic checkpoint stays a backstop that rarely fires.
pub(super) fn spawn_checkpointer(
    conn: Connection,
) -> Result<std::sync::mpsc::SyncSender<()>, StoreError> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<()>(1);
    std::thread::Builder::new()
        .name("sqlite-checkpoint".into())
        .spawn(move || {
            // Its page copies wait for the worker too (see the writer's).
            crate::os::no_wakeup_preemption();
            while rx.recv().is_ok() {
                if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                    tracing::warn!(error = %e, "sqlite checkpoint failed");
                }
            }
        })
        .map_err(|e| StoreError::Unavailable(format!("sqlite checkpoint thread: {e}")))?;
    Ok(tx)
}
