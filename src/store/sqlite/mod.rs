//! The SQLite [`TaskStore`](super::TaskStore): the embedded default,
//! durable with no server to install.
//!
//! One row per task (schema in `migrations/sqlite/`, embedded in the binary
//! and applied at open). The database runs in WAL mode with
//! `synchronous=NORMAL`: a committed write survives the process being
//! killed (SIGKILL, crash); only an OS crash or power loss can lose the
//! last commits, which `synchronous=FULL` would prevent at the cost of an
//! fsync per commit. Writes go through one writer connection with group
//! commit ([`writer`]); reads use reader connections, which WAL lets run
//! beside the writer. Updates carry `WHERE version = ?` for
//! optimistic concurrency.
//!
//! One driver, rusqlite (on its bundled SQLite), for every connection: the
//! writer drives its connection synchronously on a thread of its own, and
//! each reader connection too ([`connections::Readers`]): a read waits for
//! one as a queued job, not on a thread of its own. Migrations are rusqlite_migration's (`PRAGMA user_version`); a
//! database migrated by earlier versions of this server, which recorded
//! its migrations in sqlx's `_sqlx_migrations` table, is adopted at its
//! version (`adopt_sqlx_history`).

mod connections;
mod outbox;
mod reads;
mod recovery;
mod schema;
mod store;
pub mod writer;
mod writes;

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, ErrorCode};

use super::StoreError;
use connections::{Readers, lock_exclusively, open_read_write};

/// How long a statement waits for another connection's write lock before
/// failing with UNAVAILABLE.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Page cache per connection, in KiB.
pub const CACHE_KIB: u32 = 64 * 1024;
/// Memory-mapped I/O window per connection, in bytes.
pub const MMAP_BYTES: u64 = 256 * 1024 * 1024;
/// WAL pages (about 4 KiB each) between automatic checkpoints.
pub const WAL_CHECKPOINT_PAGES: u32 = 20_000;
/// Reader connections: WAL lets readers run beside the one writer.
pub const MAX_READERS: u32 = 4;
/// How long a request waits for a free connection.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// Tasks in a SQLite database file.
#[derive(Clone)]
pub struct SqliteStore {
    readers: Readers,
    writer: writer::WriterHandle,
}

/// The one mapping of SQLite errors to store errors, for reads and writes:
/// what may pass (a busy lock, a full disk, I/O) is UNAVAILABLE, anything
/// else INTERNAL.
pub(super) fn map_err(e: rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        // After BUSY_TIMEOUT: another process holds the write lock.
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
            StoreError::Unavailable(format!("sqlite busy: {e}"))
        }
        Some(ErrorCode::DiskFull | ErrorCode::SystemIoFailure | ErrorCode::CannotOpen) => {
            StoreError::Unavailable(format!("sqlite: {e}"))
        }
        _ => StoreError::Internal(format!("sqlite: {e}")),
    }
}

impl SqliteStore {
    /// Opens (creating if needed, with its folder) the database at `path`
    /// and applies pending migrations.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                StoreError::Unavailable(format!("cannot create {}: {e}", dir.display()))
            })?;
        }
        // The database is known by its file, not by the path spelling: the
        // canonical path names the lock and is what SQLite opens (so a
        // symlink or `a/../b` reaches the same lock and the same WAL), and
        // a file with several hard links, which would give each link a WAL
        // of its own, is refused.
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| StoreError::Unavailable(format!("cannot open {}: {e}", path.display())))?;
        let path = std::fs::canonicalize(path).map_err(|e| {
            StoreError::Unavailable(format!("cannot resolve {}: {e}", path.display()))
        })?;
        let path = path.as_path();
        let identity = writer::FileIdentity::of(path)?;
        if identity.links > 1 {
            return Err(StoreError::Unavailable(format!(
                "{} has {} hard links: a database must be reached through one path \
                 (each link would get a WAL of its own)",
                path.display(),
                identity.links
            )));
        }
        let lock = lock_exclusively(path)?;
        let owned = path.to_owned();
        let (write_conn, checkpoint_conn, readers) = tokio::task::spawn_blocking(move || {
            let path = owned.as_path();
            let mut write_conn = open_read_write(path)?;
            schema::migrate(&mut write_conn)?;
            let checkpoint_conn = open_read_write(path)?;
            Ok::<_, StoreError>((write_conn, checkpoint_conn, Readers::open(path)?))
        })
        .await
        .map_err(|e| StoreError::Internal(format!("sqlite open: {e}")))??;
        Ok(SqliteStore {
            readers,
            writer: writer::WriterHandle::spawn(write_conn, checkpoint_conn, lock, identity)
                .await?,
        })
    }

    /// Runs `read` on the next free reader connection's thread (SQLite
    /// calls block).
    async fn read<T: Send + 'static>(
        &self,
        read: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.readers.run(read).await
    }

    /// Nothing to do: reader connections close with the last clone of the
    /// store, and the writer stops when the last handle goes
    /// ([`SqliteStore::stopped`]). Kept for callers that close explicitly.
    pub async fn close(&self) {}

    /// Resolves once the writer has stopped (after every clone of this
    /// store is dropped) and released the database to another open.
    pub fn stopped(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.writer.stopped()
    }
}

#[cfg(test)]
mod tests {
    use super::reads::{FIND_BY_ORIGIN, GET, GET_OWNED, OWNS, page_query};
    use super::*;
    use crate::proto::TaskState;
    use crate::store::{Cursor, ListQuery, TaskStore};
    use crate::wkt::Timestamp;
    use rusqlite::types::Value;

    /// A fresh database path under the system's temporary directory.
    fn scratch_path() -> std::path::PathBuf {
        std::env::temp_dir()
            .join("a2a-lifecycle-unit")
            .join(format!("{}.db", uuid::Uuid::new_v4()))
    }

    /// Task `t{i}` in context `c`, created by message `m{i}` at `at`.
    fn submitted(i: usize, at: Timestamp) -> crate::lifecycle::TaskRecord {
        let message = crate::proto::Message {
            message_id: format!("m{i}"),
            ..Default::default()
        };
        crate::lifecycle::TaskRecord::submitted(format!("t{i}"), "c".into(), message, at)
    }

    /// The writer and the checkpointer run under `SCHED_BATCH`, so a
    /// write's wake-up does not preempt the worker queueing the next ones
    /// (see `crate::os::no_wakeup_preemption`).
    #[cfg(target_os = "linux")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_writer_threads_do_not_preempt_on_wakeup() {
        let path = scratch_path();
        let store = SqliteStore::open(&path).await.unwrap();
        // Other tests' stores may be open beside this one: every writer
        // and checkpointer thread of the process is checked, and this
        // store's are among them.
        let mut seen = std::collections::BTreeMap::<String, usize>::new();
        for task in std::fs::read_dir("/proc/self/task").unwrap() {
            let task = task.unwrap().path();
            let Ok(name) = std::fs::read_to_string(task.join("comm")) else {
                continue; // the thread has ended
            };
            let name = name.trim_end().to_owned();
            if !matches!(name.as_str(), "sqlite-writer" | "sqlite-checkpoi") {
                continue;
            }
            // Field 41 of a thread's stat is its policy (proc(5)); the
            // fields after the name, which may hold spaces, start at 3.
            let Ok(stat) = std::fs::read_to_string(task.join("stat")) else {
                continue; // ended between the two reads
            };
            let after_name = &stat[stat.rfind(')').unwrap() + 2..];
            let policy: i32 = after_name.split(' ').nth(41 - 3).unwrap().parse().unwrap();
            let tid = task.display();
            assert_eq!(policy, libc::SCHED_BATCH, "{name} (thread {tid})");
            *seen.entry(name).or_default() += 1;
        }
        assert!(seen.contains_key("sqlite-writer"), "{seen:?}");
        assert!(seen.contains_key("sqlite-checkpoi"), "{seen:?}");
        drop(store);
        let _ = std::fs::remove_file(&path);
    }

    /// A write a constraint refuses inside a batch fails alone: the other
    /// writes of its batch commit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_write_fails_alone() {
        let path = scratch_path();
        let store = SqliteStore::open(&path).await.unwrap();
        let side = Connection::open(&path).unwrap();
        side.execute_batch(
            "CREATE TRIGGER refuse BEFORE INSERT ON tasks WHEN NEW.tenant = x'626164' \
             BEGIN SELECT RAISE(ABORT, 'refused by trigger'); END",
        )
        .unwrap();
        drop(side);
        let creates = (0..200).map(|i| {
            let store = store.clone();
            async move {
                let tenant = if i % 2 == 0 { "ok" } else { "bad" };
                let record = submitted(i, Timestamp::default());
                (tenant, store.create(tenant, &record).await)
            }
        });
        let results = futures_util::future::join_all(creates).await;
        for (tenant, result) in results {
            match tenant {
                "ok" => assert_eq!(result.unwrap(), 1),
                _ => assert!(
                    matches!(&result, Err(StoreError::Internal(m)) if m.contains("refused by trigger")),
                    "{result:?}"
                ),
            }
        }
        let page = store
            .list(
                "ok",
                &ListQuery {
                    owner: None,
                    context_id: None,
                    state: None,
                    status_after: None,
                    page_size: 0,
                    cursor: None,
                    history: Default::default(),
                    include_artifacts: false,
                },
            )
            .await
            .unwrap();
        assert_eq!(page.total_size, 100);
        let _ = std::fs::remove_file(&path);
    }

    /// The writer's in-memory index of creating messages does not keep
    /// purged tasks for ever: past as many stale hashes as live ones it is
    /// read afresh, so it holds about the tasks kept, not all ever made.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn purged_tasks_leave_the_origin_index() {
        let path = scratch_path();
        let store = SqliteStore::open(&path).await.unwrap();
        let task = |i: usize| {
            let mut record = submitted(
                i,
                Timestamp {
                    seconds: 1_000,
                    nanos: 0,
                },
            );
            record.task.status.as_mut().unwrap().state = TaskState::Completed as i32;
            record
        };
        // Two merges' worth of creating messages (a merge takes at least
        // ORIGIN_LOG_MIN).
        let made = 3 * writer::ORIGIN_LOG_MIN;
        for chunk in (0..made).collect::<Vec<_>>().chunks(500) {
            let creates = chunk.iter().map(|&i| {
                let store = store.clone();
                async move { store.create("t", &task(i)).await.unwrap() }
            });
            futures_util::future::join_all(creates).await;
        }
        let before = store.writer.merged_hashes();
        assert!(before >= 2 * writer::ORIGIN_LOG_MIN, "{before} merged");
        let purged = store
            .purge_terminal_before(&Timestamp {
                seconds: 2_000,
                nanos: 0,
            })
            .await
            .unwrap();
        assert_eq!(purged, made as u64);
        // The batch after the purge's finds the index read afresh.
        store.create("t", &task(made)).await.unwrap();
        let after = store.writer.merged_hashes();
        assert!(
            after < writer::ORIGIN_LOG_MIN,
            "{after} hashes kept of {before}"
        );
        let _ = std::fs::remove_file(&path);
    }

    /// Every hot-path read uses an index: it neither scans a table nor
    /// sorts, and a ListTasks page after a cursor seeks to it instead of
    /// walking the newer tasks. Checked by what SQLite counts while running
    /// each statement (`sqlite3_stmt_status`), not by the text of its query
    /// plan, which changes between SQLite releases.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hot_reads_use_indexes() {
        let path = scratch_path();
        let store = SqliteStore::open(&path).await.unwrap();
        // Enough tasks that a scan or a walk would show: 2,000 in tenant
        // "t" over two contexts, two states and two owners ("u" and none),
        // one second apart.
        const TASKS: i64 = 2000;
        let creates = (0..TASKS).map(|i| {
            let store = store.clone();
            async move {
                let message = crate::proto::Message {
                    message_id: format!("m{i}"),
                    ..Default::default()
                };
                let mut record = crate::lifecycle::TaskRecord::submitted(
                    format!("task-{i:05}"),
                    if i % 2 == 0 { "c" } else { "d" }.into(),
                    message,
                    Timestamp {
                        seconds: 1_700_000_000 + i,
                        nanos: 0,
                    },
                );
                if i % 3 == 0 {
                    record.task.status.as_mut().unwrap().state = TaskState::Working as i32;
                }
                if i % 5 != 0 {
                    record.owner = "u".into();
                }
                store.create("t", &record).await.unwrap();
            }
        });
        futures_util::future::join_all(creates).await;
        // The creating messages are still in the origin log (below a
        // merge); copy them into `origins`, which FIND_BY_ORIGIN reads, as
        // a merge would.
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "INSERT INTO origins (tenant, message_id, task_id) \
             SELECT tenant, origin_message_id, id FROM tasks",
        )
        .unwrap();

        /// Runs `sql` to the end and returns (rows, full-scan steps,
        /// sorts, virtual machine steps).
        fn run(conn: &Connection, sql: &str, values: &[Value]) -> (usize, i32, i32, i32) {
            use rusqlite::StatementStatus;
            let mut statement = conn.prepare(sql).unwrap();
            let rows = statement
                .query_map(rusqlite::params_from_iter(values), |_| Ok(()))
                .unwrap()
                .count();
            (
                rows,
                statement.get_status(StatementStatus::FullscanStep),
                statement.get_status(StatementStatus::Sort),
                statement.get_status(StatementStatus::VmStep),
            )
        }

        for (sql, key) in [
            (GET, vec![b"t".to_vec(), b"task-01000".to_vec()]),
            (FIND_BY_ORIGIN, vec![b"t".to_vec(), b"m1000".to_vec()]),
            (
                GET_OWNED,
                vec![b"t".to_vec(), b"task-01001".to_vec(), b"u".to_vec()],
            ),
            (
                OWNS,
                vec![b"t".to_vec(), b"task-01001".to_vec(), b"u".to_vec()],
            ),
        ] {
            let values: Vec<Value> = key.into_iter().map(Value::Blob).collect();
            let (rows, full_scan, sorts, _) = run(&conn, sql, &values);
            assert_eq!(rows, 1, "{sql}");
            assert_eq!((full_scan, sorts), (0, 0), "{sql}: scanned or sorted");
        }

        // Every ListTasks page reads its index in order; one after a
        // cursor near the oldest task does about the work of one page,
        // not of the 1,900 newer tasks before it.
        let cursor = Cursor {
            status: (1_700_000_000 + 100, 0),
            task_id: "task-00100".into(),
        };
        for (owner, context, state) in filter_combinations() {
            {
                for cursor in [None, Some(cursor.clone())] {
                    let query = ListQuery {
                        owner: owner.map(Into::into),
                        context_id: context.map(String::from),
                        state,
                        status_after: None,
                        page_size: 10,
                        cursor: cursor.clone(),
                        history: Default::default(),
                        include_artifacts: false,
                    };
                    let page = page_query("SELECT record FROM tasks", "t", &query, 11);
                    let (rows, full_scan, sorts, steps) = run(&conn, &page.text, &page.values);
                    let case = format!(
                        "owner {owner:?}, context {context:?}, state {state:?}, cursor {cursor:?}"
                    );
                    assert_eq!(rows, 11, "{case}");
                    assert_eq!((full_scan, sorts), (0, 0), "{case}: scanned or sorted");
                    // A walk over the skipped tasks costs several steps
                    // each; a seek, a few hundred for the page.
                    assert!(steps < 1000, "{case}: {steps} steps");
                }
            }
        }
        // A user's listing reads the partial owner index (migration 0005):
        // its term must be in the query for SQLite to take it.
        let mine = ListQuery {
            owner: Some("u".into()),
            ..ListQuery::default()
        };
        let page = page_query("SELECT record FROM tasks", "t", &mine, 11);
        let plan: Vec<String> = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {}", page.text))
            .unwrap()
            .query_map(rusqlite::params_from_iter(&page.values), |r| r.get(3))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(
            plan.iter().any(|step| step.contains("tasks_by_owner")),
            "{plan:?}"
        );
        drop(conn);
        let _ = std::fs::remove_file(&path);
    }

    /// The open-tasks quota's count reads `tasks_open_by_owner` (its
    /// query names the index, so it fails to prepare if its condition no
    /// longer implies the index's, migration 0010) and counts the tasks
    /// that have not ended, each of its four states, and no others; also
    /// once the tasks have moved from one class to the other by updates,
    /// which evaluate the index's condition before and after.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_open_task_count_reads_its_index() {
        let path = scratch_path();
        let store = SqliteStore::open(&path).await.unwrap();
        let owner = crate::store::Owner::new("u").unwrap();
        let mut records = Vec::new();
        for (i, state) in TaskState::REAL.iter().enumerate() {
            let mut record = submitted(i, Timestamp::default());
            record.task.status.as_mut().unwrap().state = *state as i32;
            record.owner = "u".into();
            store.create("t", &record).await.unwrap();
            records.push(record);
        }
        // SUBMITTED, WORKING, INPUT_REQUIRED, AUTH_REQUIRED.
        assert_eq!(store.count_open_owned_by(&owner, 100).await.unwrap(), 4);
        assert_eq!(store.count_open_owned_by(&owner, 3).await.unwrap(), 3);
        // Every task moved to the other class: the open ones end, the
        // ended ones are (as no runtime would) made WORKING again.
        for record in &mut records {
            let state = record.task.status.as_ref().unwrap().state;
            let terminal = crate::lifecycle::state_from_i32(state)
                .unwrap()
                .is_terminal();
            record.task.status.as_mut().unwrap().state = if terminal {
                TaskState::Working
            } else {
                TaskState::Completed
            } as i32;
            store.update("t", record, 1).await.unwrap();
        }
        assert_eq!(store.count_open_owned_by(&owner, 100).await.unwrap(), 4);
        let _ = std::fs::remove_file(&path);
    }

    /// Every combination of the owner, context and state filters.
    fn filter_combinations() -> Vec<(
        Option<&'static str>,
        Option<&'static str>,
        Option<TaskState>,
    )> {
        let mut all = Vec::new();
        for owner in [None, Some("u")] {
            for context in [None, Some("c")] {
                for state in [None, Some(TaskState::Working)] {
                    all.push((owner, context, state));
                }
            }
        }
        all
    }
}
