//! The store conformance suite ([`store_conformance`]) run against
//! [`SqliteStore`], each test on its own database file.

use crate::store_conformance;

use std::sync::Arc;

use a2a_lifecycle::store::{SqliteStore, TaskStore};

/// A fresh database file under cargo's per-target scratch folder.
fn scratch_db() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("store-sqlite")
        .join(format!("{}.db", uuid::Uuid::new_v4()))
}

/// Drops the store and waits until its writer has released the database.
async fn close(store: SqliteStore) {
    let stopped = store.stopped();
    drop(store);
    tokio::time::timeout(std::time::Duration::from_secs(10), stopped)
        .await
        .expect("store stopped");
}

store_conformance::store_conformance_tests!(|| async {
    let store = SqliteStore::open(scratch_db()).await.unwrap();
    Arc::new(store) as Arc<dyn TaskStore>
});

mod origin_log {
    //! SQLite-only: the creating messages are appended to a log and merged
    //! into a sorted table in bulk (`src/store/sqlite/writer.rs`).
    //! Idempotency must hold on both sides of a merge, across a restart,
    //! after retention purges, and after a batch rolls back.

    use a2a_lifecycle::lifecycle::TaskRecord;
    use a2a_lifecycle::proto::{Message, TaskState};
    use a2a_lifecycle::store::sqlite::writer::ORIGIN_LOG_MIN;
    use a2a_lifecycle::store::{SqliteStore, StoreError, TaskStore};
    use a2a_lifecycle::wkt::Timestamp;

    /// A COMPLETED task created by `message_id`, old enough to purge.
    pub(super) fn record(id: &str, message_id: &str) -> TaskRecord {
        let message = Message {
            message_id: message_id.into(),
            ..Default::default()
        };
        let mut r = TaskRecord::submitted(
            id.into(),
            "c".into(),
            message,
            Timestamp {
                seconds: 1_700_000_000,
                nanos: 0,
            },
        );
        r.task.status.as_mut().unwrap().state = TaskState::Completed as i32;
        r
    }

    async fn counts(path: &std::path::Path) -> (i64, i64) {
        let conn =
            rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                .unwrap();
        let count = |table: &str| -> i64 {
            conn.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0))
                .unwrap()
        };
        (count("origins"), count("origin_log"))
    }

    async fn assert_duplicate(store: &SqliteStore, i: usize) {
        let again = record(&format!("again-{i}"), &format!("m{i}"));
        match store.create("", &again).await {
            Err(StoreError::DuplicateMessage { task_id }) => assert_eq!(task_id, format!("t{i}")),
            other => panic!("message m{i}: expected DuplicateMessage, got {other:?}"),
        }
        let found = store
            .find_by_origin("", "", &format!("m{i}"))
            .await
            .unwrap();
        assert_eq!(found.expect("found").record.task.id, format!("t{i}"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idempotency_holds_across_merges_restarts_and_purges() {
        let path = super::scratch_db();
        let store = SqliteStore::open(&path).await.unwrap();
        // One process owns a database: a second open is refused.
        match SqliteStore::open(&path).await {
            Err(StoreError::Unavailable(m)) => assert!(m.contains("in use"), "{m}"),
            Err(other) => panic!("expected UNAVAILABLE, got {other:?}"),
            Ok(_) => panic!("a second open of a held database succeeded"),
        }

        // Enough new tasks for at least one merge, and some left in the log.
        let n = ORIGIN_LOG_MIN + 500;
        for chunk in (0..n).collect::<Vec<_>>().chunks(256) {
            let creates = chunk.iter().map(|&i| {
                let store = store.clone();
                async move {
                    store
                        .create("", &record(&format!("t{i}"), &format!("m{i}")))
                        .await
                }
            });
            for result in futures_util::future::join_all(creates).await {
                assert_eq!(result, Ok(1));
            }
        }
        let (merged, log) = counts(&path).await;
        assert_eq!(
            merged + log,
            n as i64,
            "every origin is in exactly one table"
        );
        assert!(merged >= ORIGIN_LOG_MIN as i64, "merged: {merged}");
        assert!(log > 0, "the last creates are still in the log");
        // Merged (m0) and logged (the last) messages are both duplicates,
        // and a message in the same batch as its first use too.
        for i in [0, n / 2, n - 1] {
            assert_duplicate(&store, i).await;
        }
        let twice = [record("x1", "mx"), record("x2", "mx")];
        let (a, b) = futures_util::join!(store.create("", &twice[0]), store.create("", &twice[1]));
        assert!(
            matches!(
                (&a, &b),
                (Ok(1), Err(StoreError::DuplicateMessage { .. }))
                    | (Err(StoreError::DuplicateMessage { .. }), Ok(1))
            ),
            "{a:?} {b:?}"
        );

        // After a restart the log is read back.
        super::close(store).await;
        let store = SqliteStore::open(&path).await.unwrap();
        for i in [0, n - 1] {
            assert_duplicate(&store, i).await;
        }

        // Purged tasks free their messages, merged or logged.
        let purged = store
            .purge_terminal_before(&Timestamp {
                seconds: 1_700_000_001,
                nanos: 0,
            })
            .await
            .unwrap();
        assert_eq!(purged, n as u64 + 1);
        assert_eq!(counts(&path).await, (0, 0));
        for i in [0, n - 1] {
            assert_eq!(
                store
                    .create("", &record(&format!("new-{i}"), &format!("m{i}")))
                    .await,
                Ok(1)
            );
        }
        let found = store.find_by_origin("", "", "m0").await.unwrap();
        assert_eq!(found.expect("found").record.task.id, "new-0");
    }

    /// A batch that rolls back must not leave its creating messages behind
    /// in the writer's memory: each may create its task again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rolled_back_batch_frees_its_messages() {
        let path = super::scratch_db();
        let store = SqliteStore::open(&path).await.unwrap();
        let side = rusqlite::Connection::open(&path).unwrap();
        // Logging this message fails, which aborts its whole batch.
        side.execute_batch(
            "CREATE TRIGGER boom BEFORE INSERT ON origin_log WHEN NEW.message_id = x'626f6f6d' \
             BEGIN SELECT RAISE(ABORT, 'boom'); END",
        )
        .unwrap();
        let creates = (0..64).map(|i| {
            let store = store.clone();
            async move {
                let message_id = if i == 32 {
                    "boom".to_owned()
                } else {
                    format!("m{i}")
                };
                let result = store
                    .create("", &record(&format!("t{i}"), &message_id))
                    .await;
                (i, message_id, result)
            }
        });
        let results = futures_util::future::join_all(creates).await;
        let failed: Vec<_> = results.iter().filter(|r| r.2.is_err()).collect();
        assert!(
            failed.iter().any(|r| r.1 == "boom"),
            "the refused message failed"
        );
        side.execute_batch("DROP TRIGGER boom").unwrap();
        for (i, message_id, result) in &results {
            let again = store
                .create("", &record(&format!("again-{i}"), message_id))
                .await;
            match result {
                // Committed: the message is taken.
                Ok(_) => assert!(
                    matches!(&again, Err(StoreError::DuplicateMessage { task_id }) if *task_id == format!("t{i}")),
                    "{message_id}: {again:?}"
                ),
                // Rolled back with the batch: the message is free.
                Err(_) => assert_eq!(again, Ok(1), "{message_id} after its batch rolled back"),
            }
        }
    }
}

/// A database is known by its file (issue "hardening", items 5 and 8): no
/// symlink, path spelling or hard link opens it twice, and a database file
/// removed or replaced while serving refuses writes instead of
/// acknowledging them into a file that is gone.
mod file_identity {
    use a2a_lifecycle::lifecycle::TaskRecord;
    use a2a_lifecycle::store::{SqliteStore, StoreError, TaskStore};

    fn record(id: &str) -> TaskRecord {
        super::origin_log::record(id, &format!("m-{id}"))
    }

    fn refused(result: Result<SqliteStore, StoreError>, what: &str) -> String {
        match result {
            Err(StoreError::Unavailable(m)) => m,
            Err(other) => panic!("{what}: expected UNAVAILABLE, got {other:?}"),
            Ok(_) => panic!("{what}: the database was opened twice"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_link_or_spelling_opens_a_database_twice() {
        let path = super::scratch_db();
        let store = SqliteStore::open(&path).await.unwrap();
        let dir = path.parent().unwrap();
        let name = path.file_name().unwrap().to_str().unwrap();
        // Another spelling of the same path.
        let spelled = dir.join("..").join("store-sqlite").join(name);
        let m = refused(SqliteStore::open(&spelled).await, "path spelling");
        assert!(m.contains("in use"), "{m}");
        // A symlink to it.
        let link = dir.join(format!("link-{name}"));
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let m = refused(SqliteStore::open(&link).await, "symlink");
        assert!(m.contains("in use"), "{m}");
        // A hard link: refused whoever holds it, since each link would get
        // a WAL of its own.
        let hard = dir.join(format!("hard-{name}"));
        std::fs::hard_link(&path, &hard).unwrap();
        let m = refused(SqliteStore::open(&hard).await, "hard link");
        assert!(m.contains("hard links"), "{m}");
        // The first store is unaffected.
        assert_eq!(store.create("", &record("t1")).await, Ok(1));
        let _ = std::fs::remove_file(&hard);
        let _ = std::fs::remove_file(&link);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_are_refused_once_the_file_is_removed_or_replaced() {
        let path = super::scratch_db();
        let store = SqliteStore::open(&path).await.unwrap();
        assert_eq!(store.create("", &record("t1")).await, Ok(1));
        std::fs::remove_file(&path).unwrap();
        match store.create("", &record("t2")).await {
            Err(StoreError::Unavailable(m)) => assert!(m.contains("gone"), "{m}"),
            other => panic!("a write after the file was removed: {other:?}"),
        }
        // Replaced by another file at the same path.
        std::fs::write(&path, b"").unwrap();
        match store.create("", &record("t3")).await {
            Err(StoreError::Unavailable(m)) => assert!(m.contains("replaced"), "{m}"),
            other => panic!("a write after the file was replaced: {other:?}"),
        }
    }
}

mod migrations {
    //! Databases migrated by earlier versions of the server recorded their
    //! migrations in sqlx's `_sqlx_migrations` table; they open at the
    //! version recorded there and take the migrations they lack.

    use a2a_lifecycle::store::{SqliteStore, TaskStore};

    /// The schema version a database opened by this build has: one per
    /// migration in `migrations/sqlite`.
    fn latest_schema() -> i64 {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/sqlite");
        std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == "sql")
            })
            .count() as i64
    }

    /// A database written by the release before long tasks (schema 8:
    /// `tests/fixtures/sqlite-schema-8.sql`, made by `serve` at ea82b54
    /// with the demo agents: a completed test run, a code review waiting
    /// for input, a bench fan-out of 20 updates, a rejected deploy) opens
    /// at the latest schema and reads every task as it was; its waiting task then
    /// takes writes of changes (issue "long-lived tasks"), read back
    /// whole, also after a restart.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_database_of_the_previous_release_migrates_in_place_and_takes_changes() {
        let path = super::scratch_db();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let built = rusqlite::Connection::open(&path).unwrap();
        built
            .execute_batch(include_str!("fixtures/sqlite-schema-8.sql"))
            .expect("the fixture's SQL loads");
        built.close().unwrap();
        let store = SqliteStore::open(&path).await.expect("opens");
        let (waiting_id, record, version) =
            crate::support::previous_release::check_and_continue(&store).await;
        let read = store
            .get("code-reviewer", &waiting_id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (read.record.clone(), read.version),
            (record.clone(), version)
        );
        super::close(store).await;
        let store = SqliteStore::open(&path).await.expect("opens again");
        let read = store
            .get("code-reviewer", &waiting_id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((read.record, read.version), (record, version));
        super::close(store).await;
        let side = rusqlite::Connection::open(&path).unwrap();
        let schema: i64 = side
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(schema, latest_schema());
        // 0010: the open-tasks index rebuilt without its IN list.
        let open_index: String = side
            .query_row(
                "SELECT sql FROM sqlite_master WHERE name = 'tasks_open_by_owner'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert!(open_index.contains("BETWEEN 1 AND 2"), "{open_index}");
        let changes: i64 = side
            .query_row("SELECT COUNT(*) FROM task_changes", [], |r| r.get(0))
            .unwrap();
        assert_eq!(changes, 2, "the follow-up and its status, as changes");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_database_migrated_by_sqlx_opens_and_takes_the_rest() {
        let path = super::scratch_db();
        let store = SqliteStore::open(&path).await.unwrap();
        let record = super::origin_log::record("kept", "m-kept");
        store.create("", &record).await.unwrap();
        super::close(store).await;

        // What an sqlx-era server left at migration 3: no quarantine
        // table, no owners, no outbox, no user_version, sqlx's own record
        // of 1 to 3.
        let side = rusqlite::Connection::open(&path).unwrap();
        side.execute_batch(
            "DROP TABLE quarantine;
             DROP INDEX tasks_by_owner;
             DROP INDEX tasks_by_owner_id;
             DROP INDEX tasks_open_by_owner;
             DROP TABLE push_outbox;
             DROP TABLE task_changes;
             ALTER TABLE tasks DROP COLUMN owner;
             ALTER TABLE tasks DROP COLUMN changes_bytes;
             PRAGMA user_version = 0;
             CREATE TABLE _sqlx_migrations (
                 version BIGINT PRIMARY KEY, description TEXT NOT NULL,
                 installed_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
                 success BOOLEAN NOT NULL, checksum BLOB NOT NULL,
                 execution_time BIGINT NOT NULL);
             INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
                 VALUES (1, 'tasks', TRUE, x'00', 0),
                        (2, 'ascending time indexes', TRUE, x'00', 0),
                        (3, 'origin log', TRUE, x'00', 0);",
        )
        .unwrap();
        side.close().unwrap();

        // Re-running migration 1 would fail on the existing table: the
        // database must open at version 3 and take 4 to 9.
        let store = SqliteStore::open(&path).await.expect("opens");
        let kept = store.get("", "kept").await.unwrap().expect("task kept");
        assert_eq!(kept.record.task.id, "kept");
        // A task stored before owners has none, and keeps its idempotency
        // key.
        assert_eq!(kept.record.owner, "");
        let again = store.find_by_origin("", "", "m-kept").await.unwrap();
        assert_eq!(again.map(|s| s.record.task.id).as_deref(), Some("kept"));
        super::close(store).await;
        let side = rusqlite::Connection::open(&path).unwrap();
        let version: i64 = side
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, latest_schema());
        let quarantine: i64 = side
            .query_row(
                "SELECT COUNT(*) FROM sqlite_master WHERE name = 'quarantine'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(quarantine, 1, "migration 4 applied");
    }
}
