//! The writer's index of creating messages (idempotency, spec §3.3.1):
//! the origin log's entries in memory, the hashes of those merged into
//! `origins`, and the merge, so that a new message is answered without a
//! query.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use rusqlite::{OptionalExtension, params};

use super::{ORIGIN_LOG_MAX, ORIGIN_LOG_MIN, Row};

pub(super) type OriginKey = (Vec<u8>, Vec<u8>);

/// Logged creating messages: tenant, then message id, to the task id.
/// Nested so a lookup borrows its keys instead of building a tuple of
/// owned copies on every create.
pub(super) type Recent = HashMap<Vec<u8>, HashMap<Vec<u8>, Vec<u8>>>;

/// What memory says of a (tenant, message id).
pub enum OriginLookup {
    /// In the origin log: the task id.
    Logged(Vec<u8>),
    /// Its hash is among the merged origins': read `origins` to know.
    MaybeMerged,
    /// Created no task.
    Absent,
}

/// The creating messages in memory: the log's entries, and a 64-bit hash
/// of every pair merged into `origins` (read from the table at start, then
/// added by each merge), so that a lookup of a new message, the common
/// case, needs no query at all. About 16 bytes per merged task. A purge
/// leaves its hashes behind (a later lookup of one reads `origins` and
/// finds nothing, which is only a wasted read) until they are as many as
/// the live ones: then the set is read afresh from `origins`
/// ([`Origins::settle`]), so it never holds more than about twice the
/// tasks kept.
#[derive(Default)]
pub(super) struct OriginIndex {
    pub(super) recent: Recent,
    pub(super) merged: HashSet<u64, foldhash::fast::RandomState>,
    pub(super) hasher: foldhash::fast::RandomState,
}

impl OriginIndex {
    pub(super) fn hash(&self, tenant: &[u8], message_id: &[u8]) -> u64 {
        use std::hash::{BuildHasher, Hasher};
        let mut h = self.hasher.build_hasher();
        h.write_usize(tenant.len());
        h.write(tenant);
        h.write(message_id);
        h.finish()
    }

    pub(super) fn may_be_merged(&self, tenant: &[u8], message_id: &[u8]) -> bool {
        self.merged.contains(&self.hash(tenant, message_id))
    }

    pub(super) fn add_merged(&mut self, tenant: &[u8], message_id: &[u8]) {
        let h = self.hash(tenant, message_id);
        self.merged.insert(h);
    }
}

/// [`OriginIndex`] shared between the writer (which alone changes it) and
/// readers.
pub(super) type SharedRecent = Arc<RwLock<OriginIndex>>;

// A panic while the lock is held cannot leave the index half-changed in a
// way a reader could misuse (each change is one insert or remove), so a
// poisoned lock is used as it is.
pub(super) fn read(recent: &SharedRecent) -> std::sync::RwLockReadGuard<'_, OriginIndex> {
    recent.read().unwrap_or_else(|e| e.into_inner())
}

pub(super) fn write(recent: &SharedRecent) -> std::sync::RwLockWriteGuard<'_, OriginIndex> {
    recent.write().unwrap_or_else(|e| e.into_inner())
}

/// The writer's view of the creating messages: `origin_log`'s entries in
/// memory (the log has no index, so lookups in it are these), and the size
/// of `origins`, which sets when the log is merged.
pub(super) struct Origins {
    pub(super) recent: SharedRecent,
    /// Keys the current batch added to `recent`.
    pub(super) added: Vec<OriginKey>,
    pub(super) merged: usize,
    /// The log in memory may differ from the table (reading it back after
    /// a rollback failed): reload it before the next batch.
    pub(super) stale: bool,
}

impl Origins {
    pub(super) fn load(db: &rusqlite::Connection, recent: SharedRecent) -> rusqlite::Result<Self> {
        let merged: i64 = db.query_row("SELECT COUNT(*) FROM origins", [], |r| r.get(0))?;
        {
            let mut index = write(&recent);
            let mut stmt = db.prepare("SELECT tenant, message_id FROM origins")?;
            let mut rows = stmt.query([])?;
            while let Some(row) = rows.next()? {
                let tenant: Vec<u8> = row.get(0)?;
                let message_id: Vec<u8> = row.get(1)?;
                index.add_merged(&tenant, &message_id);
            }
        }
        let mut origins = Origins {
            recent,
            added: Vec::new(),
            merged: merged as usize,
            stale: true,
        };
        origins.reload(db)?;
        Ok(origins)
    }

    pub(super) fn reload(&mut self, db: &rusqlite::Connection) -> rusqlite::Result<()> {
        let mut stmt = db.prepare("SELECT tenant, message_id, task_id FROM origin_log")?;
        let mut rows = stmt.query([])?;
        let mut recent = Recent::new();
        while let Some(row) = rows.next()? {
            recent
                .entry(row.get(0)?)
                .or_default()
                .insert(row.get(1)?, row.get(2)?);
        }
        write(&self.recent).recent = recent;
        self.stale = false;
        Ok(())
    }

    /// Reads the merged hashes afresh from `origins`, dropping the purged
    /// tasks' ones. Built beside the set and swapped in: lookups go on
    /// meanwhile, and nothing else changes the set (merges run on this
    /// thread).
    pub(super) fn rebuild_merged(&mut self, db: &rusqlite::Connection) -> rusqlite::Result<()> {
        let hasher = read(&self.recent).hasher.clone();
        let mut fresh = OriginIndex {
            hasher,
            ..Default::default()
        };
        let mut stmt = db.prepare("SELECT tenant, message_id FROM origins")?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            let tenant: Vec<u8> = row.get(0)?;
            let message_id: Vec<u8> = row.get(1)?;
            fresh.add_merged(&tenant, &message_id);
        }
        self.merged = fresh.merged.len();
        write(&self.recent).merged = fresh.merged;
        Ok(())
    }

    /// After a rollback: forgets what the batch added, then reads the log
    /// back (a purge in the batch may have removed entries, now restored).
    pub(super) fn rolled_back(&mut self, db: &rusqlite::Connection) {
        {
            let mut index = write(&self.recent);
            for (tenant, message_id) in self.added.drain(..) {
                if let Some(messages) = index.recent.get_mut(&tenant) {
                    messages.remove(&message_id);
                }
            }
        }
        if let Err(e) = self.reload(db) {
            tracing::warn!(error = %e, "sqlite origin log could not be read back");
            self.stale = true;
        }
    }

    /// The task created by `message_id` in `tenant`, if any.
    pub(super) fn find(
        &self,
        db: &rusqlite::Connection,
        tenant: &[u8],
        message_id: &[u8],
    ) -> rusqlite::Result<Option<Vec<u8>>> {
        match read(&self.recent)
            .recent
            .get(tenant)
            .and_then(|m| m.get(message_id))
        {
            Some(id) => return Ok(Some(id.clone())),
            None if !read(&self.recent).may_be_merged(tenant, message_id) => return Ok(None),
            None => {}
        }
        db.prepare_cached("SELECT task_id FROM origins WHERE tenant = ? AND message_id = ?")?
            .query_row(params![tenant, message_id], |r| r.get(0))
            .optional()
    }

    /// Records a new creating message (inside the batch's transaction).
    pub(super) fn append(&mut self, db: &rusqlite::Connection, row: &Row) -> rusqlite::Result<()> {
        db.prepare_cached("INSERT INTO origin_log (tenant, message_id, task_id) VALUES (?, ?, ?)")?
            .execute(params![row.tenant, row.origin, row.id])?;
        write(&self.recent)
            .recent
            .entry(row.tenant.clone())
            .or_default()
            .insert(row.origin.clone(), row.id.clone());
        self.added.push((row.tenant.clone(), row.origin.clone()));
        Ok(())
    }

    /// The log's size that triggers a merge.
    pub(super) fn merge_at(&self) -> usize {
        (self.merged / 4).clamp(ORIGIN_LOG_MIN, ORIGIN_LOG_MAX)
    }

    /// Between batches: reloads the log if it is stale, and merges it into
    /// `origins` once it is large enough, in one transaction of its own.
    pub(super) fn settle(&mut self, db: &rusqlite::Connection) -> rusqlite::Result<()> {
        if self.stale {
            self.reload(db)?;
        }
        let hashes = read(&self.recent).merged.len();
        if hashes > 2 * self.merged + ORIGIN_LOG_MIN {
            self.rebuild_merged(db)?;
        }
        let logged: usize = read(&self.recent).recent.values().map(HashMap::len).sum();
        if logged < self.merge_at() {
            return Ok(());
        }
        let run = |sql: &str| db.prepare_cached(sql).and_then(|mut s| s.execute([]));
        run("BEGIN IMMEDIATE")?;
        let merged = (|| {
            // Sorted, so the inserts walk `origins` from one end to the
            // other and each of its pages is written once. OR IGNORE: the
            // log never repeats a pair the table holds, and should it, the
            // first task stays the message's task.
            let n = db
                .prepare_cached(
                    "INSERT OR IGNORE INTO origins (tenant, message_id, task_id) \
                     SELECT tenant, message_id, task_id FROM origin_log \
                     ORDER BY tenant, message_id",
                )?
                .execute([])?;
            run("DELETE FROM origin_log")?;
            run("COMMIT")?;
            Ok(n)
        })();
        match merged {
            Ok(n) => {
                self.merged += n;
                let mut index = write(&self.recent);
                let recent = std::mem::take(&mut index.recent);
                for (tenant, messages) in &recent {
                    for message_id in messages.keys() {
                        index.add_merged(tenant, message_id);
                    }
                }
                Ok(())
            }
            Err(e) => {
                let _ = run("ROLLBACK");
                Err(e)
            }
        }
    }
}
