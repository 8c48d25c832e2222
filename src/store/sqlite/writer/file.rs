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

/// Puts the calling thread under `SCHED_BATCH`: woken, it waits for the
/// running thread to block or use up its slice instead of preempting it.
///
/// For the writer and the checkpointer. Each write wakes the writer; under
/// the default policy a woken thread preempts the tokio worker that queued
/// the write, so on a busy core the writer took its writes one at a time
/// (measured at C=64 on one core: 9 batches in 10 of a single write),
/// paying a context switch each way and a commit per write. Left to wait
/// for the worker, it finds a batch queued (about 40 writes), and each
/// commit's pages and WAL frames are shared by all of them. Where a core
/// is idle the woken thread runs there at once, as before. Nothing about
/// an acknowledgement changes: a write is still answered after its commit.
/// A policy the system refuses (another kernel, a sandbox) leaves the
/// default, which is only slower.
pub(super) fn no_wakeup_preemption() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `param` is a valid sched_param; pid 0 is the calling
        // thread (Linux schedules threads), and SCHED_BATCH with priority
        // 0 needs no privilege.
        let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
        if rc != 0 {
            tracing::debug!(
                error = %std::io::Error::last_os_error(),
                "SCHED_BATCH refused; the sqlite writer keeps the default policy"
            );
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
            no_wakeup_preemption();
            while rx.recv().is_ok() {
                if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                    tracing::warn!(error = %e, "sqlite checkpoint failed");
                }
            }
        })
        .map_err(|e| StoreError::Unavailable(format!("sqlite checkpoint thread: {e}")))?;
    Ok(tx)
}
