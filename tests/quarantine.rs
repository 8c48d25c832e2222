//! A record that no longer decodes does not keep the server from starting
//! (issue "hardening", item 7): start-up recovery moves it to the
//! quarantine table, logs it, and recovers the rest; GetTask of it answers
//! INTERNAL naming the reason, and ListTasks goes on without it.

use crate::support;

use std::sync::Arc;

use tonic::Code;

use a2a_lifecycle::agent::demo::demo_router;
use a2a_lifecycle::lifecycle::TaskRecord;
use a2a_lifecycle::proto::{ListTasksRequest, Message, TaskState};
use a2a_lifecycle::runtime::{RuntimeConfig, TaskManager};
use a2a_lifecycle::store::{SqliteStore, TaskStore};
use a2a_lifecycle::wkt::Timestamp;

fn scratch_db() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("quarantine")
        .join(format!("{}.db", uuid::Uuid::new_v4()))
}

fn record(id: &str) -> TaskRecord {
    TaskRecord::submitted(
        id.into(),
        "c".into(),
        Message {
            message_id: format!("m-{id}"),
            ..Default::default()
        },
        Timestamp {
            seconds: 1_700_000_000,
            nanos: 0,
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_active_record_is_set_aside_and_the_server_starts() {
    let path = scratch_db();
    let store = SqliteStore::open(&path).await.unwrap();
    store.create("", &record("bad")).await.unwrap();
    store.create("", &record("good")).await.unwrap();
    store.close().await;
    let stopped = store.stopped();
    drop(store);
    tokio::time::timeout(support::WAIT, stopped)
        .await
        .expect("store stopped");
    let side = rusqlite::Connection::open(&path).unwrap();
    side.execute_batch("UPDATE tasks SET record = x'ffffffff' WHERE id = x'626164'")
        .unwrap();
    side.close().unwrap();

    let store: Arc<dyn TaskStore> = Arc::new(SqliteStore::open(&path).await.unwrap());
    let manager = TaskManager::new(store.clone(), demo_router(), RuntimeConfig::default());
    // Start-up recovery goes through: the good task is failed (its run
    // was lost), the bad one set aside.
    assert_eq!(manager.fail_orphaned_tasks().await.unwrap(), 1);
    let server =
        support::TestServer::start_full(store, demo_router(), RuntimeConfig::default()).await;
    let mut client = server.client().await;
    let err = support::get_task(&mut client, "", "bad").await.unwrap_err();
    support::assert_a2a_error(&err, Code::Internal, "INTERNAL");
    assert!(err.message().contains("set aside"), "{}", err.message());
    let good = support::get_task(&mut client, "", "good").await.unwrap();
    assert_eq!(support::state_of(&good), TaskState::Failed);
    let page = client
        .list_tasks(ListTasksRequest::default())
        .await
        .unwrap()
        .into_inner();
    let ids: Vec<_> = page.tasks.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["good"]);
    server.stop().await;
}

/// A task kept as a whole record and changes (issue "long-lived tasks")
/// whose changes no longer decode is set aside the same way, its changes
/// kept beside its record in the quarantine table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_whose_changes_do_not_decode_is_set_aside_with_them() {
    use a2a_lifecycle::lifecycle::{Changes, StatusUpdate, TaskEvent, TransitionPolicy};
    use a2a_lifecycle::store::{Body, EncodedTask};
    use prost::Message as _;

    let path = scratch_db();
    let store = SqliteStore::open(&path).await.unwrap();
    let mut bad = record("bad");
    store.create("", &bad).await.unwrap();
    store.create("", &record("good")).await.unwrap();
    let mut log = Vec::new();
    bad.apply_logged(
        TaskEvent::Status(StatusUpdate {
            state: TaskState::Working,
            message: None,
            metadata: None,
        }),
        a2a_lifecycle::runtime::now(),
        TransitionPolicy::Permissive,
        a2a_lifecycle::lifecycle::Cause::Agent,
        &mut log,
    )
    .unwrap();
    let write = EncodedTask::of(
        &bad,
        Body::Changes(Changes::new(log).encode_to_vec().into()),
    );
    store.update_encoded("", &write, 1).await.unwrap();
    let stopped = store.stopped();
    drop(store);
    tokio::time::timeout(support::WAIT, stopped)
        .await
        .expect("store stopped");
    let side = rusqlite::Connection::open(&path).unwrap();
    let corrupted = side
        .execute("UPDATE task_changes SET body = x'ffffffff'", [])
        .unwrap();
    assert_eq!(corrupted, 1, "the write of changes made one row");
    side.close().unwrap();

    let store: Arc<dyn TaskStore> = Arc::new(SqliteStore::open(&path).await.unwrap());
    let manager = TaskManager::new(store.clone(), demo_router(), RuntimeConfig::default());
    assert_eq!(manager.fail_orphaned_tasks().await.unwrap(), 1);
    let err = store.get("", "bad").await.unwrap_err();
    assert!(err.to_string().contains("set aside"), "{err}");
    drop(manager);
    drop(store);
    let side = rusqlite::Connection::open(&path).unwrap();
    let (changes, reason): (Vec<u8>, String) = side
        .query_row(
            "SELECT changes, reason FROM quarantine WHERE id = x'626164'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(
        changes,
        [4, 0xff, 0xff, 0xff, 0xff],
        "kept, length-delimited"
    );
    assert!(reason.contains("changes"), "{reason}");
    let left: i64 = side
        .query_row("SELECT COUNT(*) FROM task_changes", [], |r| r.get(0))
        .unwrap();
    assert_eq!(left, 0, "the changes left the task table's side too");
}
