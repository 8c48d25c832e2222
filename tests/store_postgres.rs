//! The store conformance suite ([`store_conformance`]) run against
//! [`PostgresStore`], each test in a schema of its own of this run's
//! database (see [`support::postgres`] for when the tests are skipped).

mod store_conformance;
mod support;

use std::sync::Arc;

use a2a_lifecycle::store::{PostgresStore, TaskStore};

/// A store on a fresh schema of this run's database.
async fn fresh_store() -> Option<Arc<dyn TaskStore>> {
    let url = support::postgres::fresh_schema().await?;
    let store = PostgresStore::open(&url).await.expect("open the store");
    Some(Arc::new(store) as Arc<dyn TaskStore>)
}

store_conformance::store_conformance_tests!(fresh_store);

/// `serve --store postgres://...`: tasks are kept across a SIGKILL and a
/// restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_keeps_tasks_in_postgres_across_a_sigkill() {
    use a2a_lifecycle::proto::a2a_service_client::A2aServiceClient;

    let Some(store) = support::postgres::fresh_schema().await else {
        return;
    };
    let (first, server) = support::spawn_serve(&["--store", &store]);
    let mut first = support::KillOnDrop(first);
    let mut grpc = support::within("connect", A2aServiceClient::connect(server))
        .await
        .unwrap();
    let task = support::send_text(&mut grpc, "", "run the tests").await;
    assert_eq!(
        support::state_of(&task),
        a2a_lifecycle::proto::TaskState::Completed
    );
    first.0.kill().unwrap(); // SIGKILL
    first.0.wait().unwrap();
    let (again, server) = support::spawn_serve(&["--store", &store]);
    let _again = support::KillOnDrop(again);
    let mut grpc = support::within("connect", A2aServiceClient::connect(server))
        .await
        .unwrap();
    let kept = support::get_task(&mut grpc, "", &task.id).await.unwrap();
    assert_eq!(kept, task, "the task survived the kill");
}

/// Two replicas' stores on one schema.
async fn two_replicas() -> Option<(PostgresStore, PostgresStore)> {
    let url = support::postgres::fresh_schema().await?;
    let a = PostgresStore::open(&url).await.expect("open a");
    let b = PostgresStore::open(&url).await.expect("open b");
    assert_ne!(a.replica_id(), b.replica_id());
    Some((a, b))
}

/// A periodic job runs once per interval across replicas: the first to
/// ask takes the turn, the others are told no until the interval is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_periodic_job_runs_once_per_interval_across_replicas() {
    let Some((a, b)) = two_replicas().await else {
        return;
    };
    let hour = std::time::Duration::from_secs(3600);
    assert!(a.take_turn("retention", hour).await.unwrap());
    assert!(!b.take_turn("retention", hour).await.unwrap());
    assert!(!a.take_turn("retention", hour).await.unwrap());
    // Another job is its own.
    assert!(b.take_turn("orphans", hour).await.unwrap());
    // An interval of zero has passed already.
    assert!(
        b.take_turn("retention", std::time::Duration::ZERO)
            .await
            .unwrap()
    );
}

/// A role (push delivery) is held by one replica at a time: renewed by
/// its holder, refused to the others while the holder's lease runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_is_held_by_one_replica_at_a_time() {
    let Some((a, b)) = two_replicas().await else {
        return;
    };
    assert!(a.hold("push-delivery").await.unwrap());
    assert!(!b.hold("push-delivery").await.unwrap());
    assert!(
        a.hold("push-delivery").await.unwrap(),
        "renewed by its holder"
    );
    assert!(!b.hold("push-delivery").await.unwrap());
}

/// The same message claimed by two replicas: the first runs it, the
/// second is told another replica answers it; once the first's task
/// exists, the second gets that task; a claim whose run made no task is
/// released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_is_claimed_by_one_replica() {
    use a2a_lifecycle::store::OriginClaim;
    let Some((a, b)) = two_replicas().await else {
        return;
    };
    assert_eq!(
        a.claim_origin("t", "", "m1").await.unwrap(),
        OriginClaim::First
    );
    assert_eq!(
        b.claim_origin("t", "", "m1").await.unwrap(),
        OriginClaim::Elsewhere
    );
    let mut message = support::user_message("hello");
    message.message_id = "m1".into();
    let record = a2a_lifecycle::lifecycle::TaskRecord::submitted(
        "task-1".into(),
        "ctx".into(),
        message,
        a2a_lifecycle::runtime::now(),
    );
    a.create("t", &record).await.unwrap();
    match b.claim_origin("t", "", "m1").await.unwrap() {
        OriginClaim::Task(task) => assert_eq!(task.record.task.id, "task-1"),
        other => panic!("expected the task, got {other:?}"),
    }
    // A direct reply: released, and the message may run again.
    assert_eq!(
        a.claim_origin("t", "", "m2").await.unwrap(),
        OriginClaim::First
    );
    a.release_origin("t", "", "m2").await.unwrap();
    assert_eq!(
        b.claim_origin("t", "", "m2").await.unwrap(),
        OriginClaim::First
    );
}

/// A task's runs are claimed by one replica at a time: a create holds
/// them for the first run; another replica is refused until the holder
/// releases them (and hears of the release), or until the holder's lease
/// has expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tasks_runs_are_claimed_by_one_replica_at_a_time() {
    use a2a_lifecycle::store::Change;
    let Some(url) = support::postgres::fresh_schema().await else {
        return;
    };
    let a = PostgresStore::open(&url).await.expect("open a");
    let b = PostgresStore::open(&url).await.expect("open b");
    let record = a2a_lifecycle::lifecycle::TaskRecord::submitted(
        "task-1".into(),
        "ctx".into(),
        support::user_message("hello"),
        a2a_lifecycle::runtime::now(),
    );
    a.create("t", &record).await.unwrap();
    assert_eq!(
        b.claim_run("t", "task-1").await.unwrap(),
        None,
        "held by its create"
    );
    assert_eq!(
        a.claim_run("t", "task-1").await.unwrap(),
        Some(1),
        "its own"
    );
    let (db, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    // b listens on a connection of its own, opened in the background:
    // announce a probe until b hears one, so the release is not missed.
    let mut heard = b.changes().expect("a shared store announces changes");
    support::within("b listening", async {
        loop {
            db.execute("SELECT pg_notify('a2a_tasks', '1:t5:probe1')", &[])
                .await
                .unwrap();
            let probe = tokio::time::timeout(std::time::Duration::from_millis(100), heard.recv());
            if let Ok(Ok(Change::Task { task_id, .. })) = probe.await
                && task_id == "probe"
            {
                break;
            }
        }
    })
    .await;
    a.release_run("t", "task-1").await.unwrap();
    support::within("the release announced", async {
        loop {
            if let Ok(Change::Task {
                task_id, version, ..
            }) = heard.recv().await
                && task_id == "task-1"
            {
                assert_eq!(version, 1);
                break;
            }
        }
    })
    .await;
    assert_eq!(b.claim_run("t", "task-1").await.unwrap(), Some(1));
    assert_eq!(a.claim_run("t", "task-1").await.unwrap(), None);
    // A release by a replica that does not hold them changes nothing.
    a.release_run("t", "task-1").await.unwrap();
    assert_eq!(a.claim_run("t", "task-1").await.unwrap(), None);
    // The holder's lease runs out: taken over.
    let b_id = b.replica_id();
    drop(b);
    db.execute(
        "UPDATE replicas SET lease_until = now() - interval '1 second' WHERE id = $1",
        &[&b_id.as_bytes().as_slice()],
    )
    .await
    .unwrap();
    assert_eq!(a.claim_run("t", "task-1").await.unwrap(), Some(1));
    assert_eq!(
        a.claim_run("t", "nope").await.unwrap(),
        None,
        "no such task"
    );
}

/// An active record that no longer decodes is moved to `quarantine` when
/// recovery reads the active tasks, so recovery goes on; GetTask of it is
/// INTERNAL naming the table, and ListTasks no longer shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_active_record_is_set_aside() {
    let Some(url) = support::postgres::fresh_schema().await else {
        return;
    };
    let store = PostgresStore::open(&url).await.expect("open the store");
    for id in ["bad", "good"] {
        let record = a2a_lifecycle::lifecycle::TaskRecord::submitted(
            id.into(),
            "ctx".into(),
            support::user_message("hello"),
            a2a_lifecycle::runtime::now(),
        );
        store.create("", &record).await.unwrap();
    }
    let (db, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    db.execute(
        "UPDATE tasks SET record = '\\xffffffff'::bytea WHERE id = 'bad'::bytea",
        &[],
    )
    .await
    .unwrap();
    let active = store.active_tasks().await.unwrap();
    let ids: Vec<&str> = active
        .iter()
        .map(|(_, t)| t.record.task.id.as_str())
        .collect();
    assert_eq!(ids, ["good"]);
    match store.get("", "bad").await {
        Err(a2a_lifecycle::store::StoreError::Internal(why)) => {
            assert!(why.contains("quarantine"), "{why}")
        }
        other => panic!("expected INTERNAL, got {other:?}"),
    }
    let page = store
        .list("", &a2a_lifecycle::store::ListQuery::default())
        .await
        .unwrap();
    assert_eq!(page.total_size, 1);
    let kept: i64 = db
        .query_one("SELECT COUNT(*) FROM quarantine", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(kept, 1);
}
