//! The store conformance suite ([`store_conformance`]) run against
//! [`PostgresStore`], each test in a schema of its own of this run's
//! database (see [`support::postgres`] for when the tests are skipped).

use crate::store_conformance;
use crate::support;

use std::sync::Arc;

use a2a_lifecycle::store::{Coordination, Outbox, PostgresStore, TaskStore};

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
    use a2a_lifecycle::store::OriginState;
    let Some((a, b)) = two_replicas().await else {
        return;
    };
    assert_eq!(
        a.claim_origin("t", "", "m1").await.unwrap(),
        OriginState::First
    );
    assert_eq!(
        b.claim_origin("t", "", "m1").await.unwrap(),
        OriginState::Elsewhere
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
        OriginState::Task(task) => assert_eq!(task.record.task.id, "task-1"),
        other => panic!("expected the task, got {other:?}"),
    }
    // A direct reply: released, and the message may run again.
    assert_eq!(
        a.claim_origin("t", "", "m2").await.unwrap(),
        OriginState::First
    );
    a.release_origin("t", "", "m2").await.unwrap();
    assert_eq!(
        b.claim_origin("t", "", "m2").await.unwrap(),
        OriginState::First
    );
    // A run that ended without its task stored keeps its claim: claimed
    // again, by the same replica too, it is lost (its agent may have
    // acted), not run again.
    assert_eq!(
        b.claim_origin("t", "", "m2").await.unwrap(),
        OriginState::Lost
    );
    assert_eq!(
        a.claim_origin("t", "", "m2").await.unwrap(),
        OriginState::Elsewhere
    );
}

/// A task's runs are claimed by one replica at a time: a create holds
/// them for the first run; another replica is refused until the holder
/// releases them (and hears of the release), or until the holder's lease
/// has expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tasks_runs_are_claimed_by_one_replica_at_a_time() {
    use a2a_lifecycle::store::WriteNotice;
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
    let mut heard = b
        .coordination()
        .expect("a shared store announces changes")
        .changes();
    support::within("b listening", async {
        loop {
            db.execute("SELECT pg_notify('a2a_tasks', '1:t5:probe1')", &[])
                .await
                .unwrap();
            let probe = tokio::time::timeout(std::time::Duration::from_millis(100), heard.recv());
            if let Ok(Ok(WriteNotice::Task { task_id, .. })) = probe.await
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
            if let Ok(WriteNotice::Task {
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
    // The orphan sweep's hold (`take_runs`) obeys the same claim.
    assert!(!a.take_runs("t", "task-1").await.unwrap(), "held by b");
    assert!(b.take_runs("t", "task-1").await.unwrap(), "b's own");
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
    assert!(a.take_runs("t", "task-1").await.unwrap(), "b is dead");
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

/// An admin connection to the schema `url` names (plaintext: the test's
/// own, not the store's).
async fn admin(url: &str) -> tokio_postgres::Client {
    let (client, connection) = support::within(
        "admin connection",
        tokio_postgres::connect(url, tokio_postgres::NoTls),
    )
    .await
    .expect("admin connection");
    tokio::spawn(connection);
    client
}

/// Ends `replica`'s lease in the database, as a pause of its process past
/// the lease would (its own clock still says it holds it).
async fn run_out_lease(admin: &tokio_postgres::Client, replica: uuid::Uuid) {
    let changed = admin
        .execute(
            "UPDATE replicas SET lease_until = now() - interval '1 second' WHERE id = $1",
            &[&replica.as_bytes().as_slice()],
        )
        .await
        .unwrap();
    assert_eq!(changed, 1, "the replica is registered");
}

/// Runs out `replica`'s lease and declares it dead, in one transaction
/// (a renewal cannot come between them).
async fn declare_dead(admin: &tokio_postgres::Client, replica: uuid::Uuid) {
    let id = replica.as_bytes().as_slice();
    admin.batch_execute("BEGIN").await.unwrap();
    run_out_lease(admin, replica).await;
    admin.execute("SELECT a2a_reap()", &[]).await.unwrap();
    admin.batch_execute("COMMIT").await.unwrap();
    let dead: bool = admin
        .query_one("SELECT dead FROM replicas WHERE id = $1", &[&id])
        .await
        .unwrap()
        .get(0);
    assert!(dead, "the replica was declared dead");
}

/// Two replicas' stores with a 2 s lease on a fresh schema, and an admin
/// connection to it; `None` when PostgreSQL is not there (and not
/// required).
async fn two_short_leases() -> Option<(PostgresStore, PostgresStore, tokio_postgres::Client)> {
    let url = support::postgres::fresh_schema().await?;
    let lease = std::time::Duration::from_secs(2);
    let a = PostgresStore::open_with_lease(&url, lease).await.unwrap();
    let b = PostgresStore::open_with_lease(&url, lease).await.unwrap();
    Some((a, b, admin(&url).await))
}

/// A replica's runtime on `store`, with `agent` for every message.
fn replica(
    store: PostgresStore,
    agent: Arc<dyn a2a_lifecycle::agent::AgentExecutor>,
) -> a2a_lifecycle::runtime::TaskManager {
    a2a_lifecycle::runtime::TaskManager::new(
        Arc::new(store),
        a2a_lifecycle::agent::AgentRouter::new().with("", agent),
        a2a_lifecycle::runtime::RuntimeConfig::default(),
    )
}

/// A new task created by `message_id`'s run.
fn created_by(task_id: &str, message_id: &str) -> a2a_lifecycle::lifecycle::TaskRecord {
    let mut message = support::user_message("hello");
    message.message_id = message_id.into();
    a2a_lifecycle::lifecycle::TaskRecord::submitted(
        task_id.into(),
        "ctx".into(),
        message,
        a2a_lifecycle::runtime::now(),
    )
}

/// Fencing (issue "replicas under real faults"): a replica whose lease ran
/// out while it was paused can have its claim taken over; once it is,
/// nothing it writes under its old id commits, even though its own clock
/// has not noticed yet, and it rejoins under a new id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_declared_dead_writes_nothing_more_and_rejoins_under_a_new_id() {
    use a2a_lifecycle::store::{OriginState, StoreError};
    let Some((a, b, admin)) = two_short_leases().await else {
        return;
    };
    assert_eq!(
        a.claim_origin("t", "", "m1").await.unwrap(),
        OriginState::First
    );
    let old = a.replica_id();
    let mut losses = a
        .coordination()
        .expect("a store shared by replicas")
        .lease_losses();
    run_out_lease(&admin, old).await;
    // B declares A dead and takes the message over, told that A may have
    // acted on it (B records its task without running it).
    assert_eq!(
        b.claim_origin("t", "", "m1").await.unwrap(),
        OriginState::Lost
    );
    b.create("t", &created_by("task-b", "m1")).await.unwrap();
    // A, resumed, still holds its lease by its own clock, but what it
    // writes under the dead id is refused in the write's own transaction.
    assert!(!a.held_for().is_zero(), "A has not noticed yet");
    let refused = a.create("t", &created_by("task-a", "other")).await;
    match refused {
        Err(StoreError::Unavailable(why)) => assert!(why.contains("declared dead"), "{why}"),
        other => panic!("a dead replica's write was not refused: {other:?}"),
    }
    assert!(a.get("t", "task-a").await.unwrap().is_none());
    assert!(
        !matches!(a.claim_run("t", "task-b").await, Ok(Some(_))),
        "a dead replica claimed a run"
    );
    // Its renewal finds it dead: it loses its standing, then rejoins.
    support::within("A notices it lost its lease", losses.changed())
        .await
        .unwrap();
    support::within("A rejoins under a new id", async {
        while a.replica_id() == old || a.held_for().is_zero() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    a.create("t", &created_by("task-a", "other")).await.unwrap();
    let dead: bool = admin
        .query_one(
            "SELECT dead FROM replicas WHERE id = $1",
            &[&old.as_bytes().as_slice()],
        )
        .await
        .unwrap()
        .get(0);
    assert!(dead, "the old id stays dead");
}

/// A dead replica's claim on a message whose task was never stored (its
/// agent may have acted on it) outlives a retention sweep: the sweep may
/// run on any replica between the death and the client's retry, and the
/// retry must still be recorded as lost, not run again (the fault
/// harness's seed 4242 ran a message twice this way). Only a claim whose
/// replica died before the retention cutoff, as long ago as a purged
/// terminal task, is forgotten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_replicas_claim_outlives_a_retention_sweep() {
    use a2a_lifecycle::store::OriginState;
    let Some((a, b, admin)) = two_short_leases().await else {
        return;
    };
    for m in ["m1", "m3"] {
        assert_eq!(
            a.claim_origin("t", "", m).await.unwrap(),
            OriginState::First
        );
    }
    let old = a.replica_id();
    declare_dead(&admin, old).await;
    let now = a2a_lifecycle::runtime::now();
    let week_ago = a2a_lifecycle::wkt::Timestamp {
        seconds: now.seconds - 7 * 24 * 3600,
        nanos: 0,
    };
    assert_eq!(b.purge_terminal_before(&week_ago).await.unwrap(), 0);
    assert_eq!(
        b.claim_origin("t", "", "m1").await.unwrap(),
        OriginState::Lost,
        "the retry of a message a dead replica may have acted on ran again"
    );
    // A claim of a replica dead for longer than the retention goes, as
    // its task would have.
    admin
        .execute(
            "UPDATE replicas SET lease_until = now() - interval '8 days' WHERE id = $1",
            &[&old.as_bytes().as_slice()],
        )
        .await
        .unwrap();
    assert_eq!(b.purge_terminal_before(&week_ago).await.unwrap(), 0);
    assert_eq!(
        b.claim_origin("t", "", "m3").await.unwrap(),
        OriginState::First,
        "a claim older than the retention is forgotten"
    );
}

/// The push delivery role's epoch: once the role changed hands, what the
/// old holder finishes or defers is refused (the entry stays for the new
/// holder, who delivers it again: duplicates, never a loss or a reorder).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_old_holder_of_the_delivery_role_can_neither_finish_nor_defer() {
    use a2a_lifecycle::store::{DELIVERY_ROLE, EncodedTask, OutboxEntry};
    let Some((a, b, admin)) = two_short_leases().await else {
        return;
    };
    let record = created_by("task-1", "m1");
    let mut write = EncodedTask::new(&record);
    write.outbox = ["e1", "e2"]
        .iter()
        .map(|e| OutboxEntry {
            config_id: "hook".into(),
            event: e.as_bytes().to_vec(),
        })
        .collect();
    a.create_encoded("t", &write).await.unwrap();
    assert!(a.hold(DELIVERY_ROLE).await.unwrap());
    let entries = a.outbox().pending(0, 10).await.unwrap();
    assert_eq!(entries.len(), 2);
    // A's renewals of the role stop (paused); B takes it.
    admin
        .execute(
            "UPDATE a2a_jobs SET last_run = now() - interval '1 hour' WHERE name = $1",
            &[&DELIVERY_ROLE],
        )
        .await
        .unwrap();
    assert!(b.hold(DELIVERY_ROLE).await.unwrap());
    // A's attempts that end now change nothing.
    a.finish_delivery(entries[0].seq).await.unwrap();
    a.defer_delivery(entries[1].seq, 5, 1_700_000_000_000)
        .await
        .unwrap();
    let left = b.outbox().pending(0, 10).await.unwrap();
    assert_eq!(left, entries, "the old holder changed the outbox");
    // B's do.
    b.finish_delivery(entries[0].seq).await.unwrap();
    b.defer_delivery(entries[1].seq, 1, 1_700_000_000_000)
        .await
        .unwrap();
    let left = b.outbox().pending(0, 10).await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(
        (left[0].attempts, left[0].not_before_ms),
        (1, 1_700_000_000_000)
    );
}

/// A TCP proxy to PostgreSQL that, once armed, forwards the first chunk
/// holding `COMMIT` and then cuts that connection: the transaction
/// commits, its acknowledgement is lost.
async fn commit_cutting_proxy(upstream: String) -> (u16, Arc<std::sync::atomic::AtomicBool>) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let armed = Arc::new(AtomicBool::new(false));
    let arm = armed.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                continue;
            };
            let armed = arm.clone();
            tokio::spawn(async move {
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                // Once the COMMIT went by, nothing the server says reaches
                // the client.
                let muted = Arc::new(AtomicBool::new(false));
                let mute = muted.clone();
                let back = tokio::spawn(async move {
                    let mut buf = vec![0; 64 * 1024];
                    while let Ok(n) = sr.read(&mut buf).await {
                        if n == 0
                            || mute.load(Ordering::SeqCst)
                            || cw.write_all(&buf[..n]).await.is_err()
                        {
                            break;
                        }
                    }
                });
                let mut buf = vec![0; 64 * 1024];
                while let Ok(n) = cr.read(&mut buf).await {
                    let commit = buf[..n].windows(6).any(|w| w == b"COMMIT");
                    let cut = commit && n > 0 && armed.swap(false, Ordering::SeqCst);
                    if cut {
                        muted.store(true, Ordering::SeqCst);
                    }
                    if n == 0 || sw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    if cut {
                        // Let the database commit, then lose its answer.
                        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                        break;
                    }
                }
                back.abort();
            });
        }
    });
    (port, armed)
}

/// A commit whose acknowledgement is lost is read back, never guessed:
/// the write that committed is answered with its version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_acknowledgement_is_lost_is_read_back() {
    use std::sync::atomic::Ordering;
    let Some(url) = support::postgres::fresh_schema().await else {
        return;
    };
    let config: tokio_postgres::Config = url.parse().unwrap();
    let host = match &config.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(h) => h.clone(),
        other => panic!("a TCP host, not {other:?}"),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let (proxy, armed) = commit_cutting_proxy(format!("{host}:{port}")).await;
    // Plaintext, so the proxy can see the COMMIT go by.
    let through = url
        .replace(&format!("{host}:{port}"), &format!("127.0.0.1:{proxy}"))
        .replace("?options", "?sslmode=disable&options");
    assert_ne!(through, url);
    let store = PostgresStore::open(&through).await.unwrap();
    let record = created_by("task-1", "m1");
    assert_eq!(store.create("t", &record).await.unwrap(), 1);
    let mut next = record.clone();
    next.task.context_id = "changed".into();
    armed.store(true, Ordering::SeqCst);
    let version = support::within("the update", store.update("t", &next, 1))
        .await
        .expect("the committed update is answered as committed");
    assert!(!armed.load(Ordering::SeqCst), "the proxy cut the commit");
    assert_eq!(version, 2);
    let stored = store.get("t", "task-1").await.unwrap().unwrap();
    assert_eq!((stored.version, stored.record), (2, next.clone()));
    // The same for a write of changes (issue "long-lived tasks"): read
    // back by its row in task_changes.
    use prost::Message as _;
    let mut log = Vec::new();
    next.apply_logged(
        a2a_lifecycle::lifecycle::TaskEvent::Status(a2a_lifecycle::lifecycle::StatusUpdate {
            state: a2a_lifecycle::proto::TaskState::Working,
            message: None,
            metadata: None,
        }),
        a2a_lifecycle::runtime::now(),
        a2a_lifecycle::lifecycle::TransitionPolicy::Permissive,
        a2a_lifecycle::lifecycle::Cause::Agent,
        &mut log,
    )
    .unwrap();
    let write = a2a_lifecycle::store::EncodedTask::of(
        &next,
        a2a_lifecycle::store::Body::Changes(
            a2a_lifecycle::lifecycle::Changes::new(log)
                .encode_to_vec()
                .into(),
        ),
    );
    armed.store(true, Ordering::SeqCst);
    let version = support::within("the write of changes", store.update_encoded("t", &write, 2))
        .await
        .expect("the committed write of changes is answered as committed");
    assert!(!armed.load(Ordering::SeqCst), "the proxy cut the commit");
    assert_eq!(version, 3);
    let stored = store.get("t", "task-1").await.unwrap().unwrap();
    assert_eq!((stored.version, stored.record), (3, next));
}

/// Waits, once started, until its run is cancelled; counts its runs.
struct Hanging {
    runs: std::sync::atomic::AtomicUsize,
    started: tokio::sync::Notify,
}

#[async_trait::async_trait]
impl a2a_lifecycle::agent::AgentExecutor for Hanging {
    async fn execute(
        &self,
        ctx: a2a_lifecycle::agent::RequestContext,
        _sink: a2a_lifecycle::agent::EventSink,
    ) -> Result<(), a2a_lifecycle::agent::AgentError> {
        self.runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.started.notify_one();
        ctx.cancelled.cancelled().await;
        Ok(())
    }
}

/// An agent's run for a message id happens at most once (issue "replicas
/// under real faults"): a replica declared dead while its agent ran a new
/// message, before the message's task was stored, may have acted on it,
/// so the replica the client's retry reaches does not run it again. It
/// records the message's task as FAILED, saying why, and answers every
/// repeat with that task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_lost_with_its_replica_is_recorded_failed_not_run_again() {
    use a2a_lifecycle::lifecycle::HistoryLength;
    use a2a_lifecycle::runtime::{MessageRequest, SendOutcome, TaskManager};
    use a2a_lifecycle::store::Caller;
    use std::sync::atomic::Ordering;

    let Some((a, b, admin)) = two_short_leases().await else {
        return;
    };
    let dead = a.replica_id();
    let agent = || {
        Arc::new(Hanging {
            runs: Default::default(),
            started: tokio::sync::Notify::new(),
        })
    };
    let (on_a, on_b) = (agent(), agent());
    let (a, b) = (replica(a, on_a.clone()), replica(b, on_b.clone()));
    let mut message = support::user_message("deploy to production");
    message.message_id = "m-lost".into();
    let send = |manager: TaskManager| {
        let message = message.clone();
        async move {
            manager
                .send_message(
                    "",
                    &Caller::ANONYMOUS,
                    MessageRequest::from(message),
                    HistoryLength::All,
                    false,
                )
                .await
        }
    };
    // A's agent takes the message, and A's lease runs out before the
    // agent's first event (so before the task is stored).
    let started = on_a.started.notified();
    let on_a_side = tokio::spawn(send(a.clone()));
    support::within("A's agent starts", started).await;
    run_out_lease(&admin, dead).await;
    // The client's retry reaches B.
    let retried = support::within("the retry on B", send(b.clone()))
        .await
        .unwrap();
    let SendOutcome::Task(handle) = retried else {
        panic!("the retry was answered with a message");
    };
    let task = support::within("the task settles", b.wait(*handle))
        .await
        .unwrap();
    assert_eq!(
        support::state_of(&task),
        a2a_lifecycle::proto::TaskState::Failed
    );
    assert_eq!(
        support::status_text(&task),
        a2a_lifecycle::runtime::LOST_MESSAGE_FAILURE
    );
    assert_eq!(task.history[0].message_id, "m-lost");
    assert_eq!(
        on_b.runs.load(Ordering::SeqCst),
        0,
        "B ran the message again"
    );
    assert_eq!(on_a.runs.load(Ordering::SeqCst), 1);
    // Every repeat gets the same task, still without a run.
    let SendOutcome::Task(again) = support::within("a repeat", send(b.clone())).await.unwrap()
    else {
        panic!("the repeat was answered with a message");
    };
    assert_eq!(again.snapshot.id, task.id);
    assert_eq!(on_b.runs.load(Ordering::SeqCst), 0);
    on_a_side.abort();
}

/// The test agent of [`a_follow_up_lost_with_its_replica_fails_its_task`]:
/// a task's first message runs until `proceed`, then asks for input; each
/// follow-up's run is counted by message id and completes the task, or
/// asks for input again when its text is "again".
/// With `hold_follow_ups`, a follow-up's run waits for
/// `follow_up_proceed` before its first event.
#[derive(Default)]
struct AsksThenCounts {
    started: tokio::sync::Notify,
    proceed: tokio::sync::Notify,
    follow_ups: std::sync::Mutex<Vec<String>>,
    hold_follow_ups: std::sync::atomic::AtomicBool,
    follow_up_started: tokio::sync::Notify,
    follow_up_proceed: tokio::sync::Notify,
}

#[async_trait::async_trait]
impl a2a_lifecycle::agent::AgentExecutor for AsksThenCounts {
    async fn execute(
        &self,
        ctx: a2a_lifecycle::agent::RequestContext,
        sink: a2a_lifecycle::agent::EventSink,
    ) -> Result<(), a2a_lifecycle::agent::AgentError> {
        use a2a_lifecycle::proto::TaskState;
        let first = ctx.task.as_ref().is_none_or(|t| t.history.len() <= 1);
        if first {
            sink.status(TaskState::Working, None).await?;
            self.started.notify_one();
            self.proceed.notified().await;
            sink.status(TaskState::InputRequired, Some("which environment?"))
                .await?;
        } else {
            self.follow_ups
                .lock()
                .unwrap()
                .push(ctx.message.message_id.clone());
            if self
                .hold_follow_ups
                .load(std::sync::atomic::Ordering::SeqCst)
            {
                self.follow_up_started.notify_one();
                self.follow_up_proceed.notified().await;
            }
            if a2a_lifecycle::agent::message_text(&ctx.message) == "again" {
                sink.status(TaskState::InputRequired, Some("and then?"))
                    .await?;
            } else {
                sink.status(TaskState::Completed, Some("deployed")).await?;
            }
        }
        Ok(())
    }
}

/// A non-blocking send to `manager`, anonymous, in the default tenant:
/// the handle of the task it made or continued.
async fn send_non_blocking(
    manager: &a2a_lifecycle::runtime::TaskManager,
    message: a2a_lifecycle::proto::Message,
) -> Box<a2a_lifecycle::runtime::TaskHandle> {
    use a2a_lifecycle::runtime::{MessageRequest, SendOutcome};
    let anonymous = a2a_lifecycle::store::Caller::ANONYMOUS;
    let sent = manager.send_message(
        "",
        &anonymous,
        MessageRequest::from(message),
        a2a_lifecycle::lifecycle::HistoryLength::All,
        false,
    );
    match support::within("a send", sent).await.expect("sent") {
        SendOutcome::Task(handle) => handle,
        _ => panic!("answered with a message"),
    }
}

/// A follow-up committed by a replica that died before its run started
/// (issue "replicas under real faults"; the fault harness met it with a
/// replica paused, then killed): its message is in the task's history and
/// no replica will ever run it. The sweep for orphaned tasks finds it and
/// FAILs the task, saying why, rather than leave it waiting on input the
/// client already gave; no replica runs the message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_lost_with_its_replica_fails_its_task() {
    use a2a_lifecycle::lifecycle::HistoryLength;
    use a2a_lifecycle::proto::TaskState;
    use a2a_lifecycle::store::Caller;

    let Some((a, b, admin)) = two_short_leases().await else {
        return;
    };
    let dead = a.replica_id();
    let (on_a, on_b) = (
        Arc::new(AsksThenCounts::default()),
        Arc::new(AsksThenCounts::default()),
    );
    let (a, b) = (replica(a, on_a.clone()), replica(b, on_b.clone()));
    // B runs the task's first message; while that run goes on, A commits
    // a follow-up, whose run waits for B's.
    let started = on_b.started.notified();
    let first = send_non_blocking(&b, support::user_message("deploy")).await;
    support::within("B's run starts", started).await;
    let task_id = first.snapshot.id.clone();
    let mut follow_up = support::user_message("staging");
    follow_up.message_id = "m-follow-up".into();
    follow_up.task_id = task_id.clone();
    send_non_blocking(&a, follow_up).await;
    // A dies (its lease runs out) before that run starts; B's run then
    // asks for input.
    run_out_lease(&admin, dead).await;
    on_b.proceed.notify_one();
    let asked = support::within("B's run ends", b.wait(*first))
        .await
        .unwrap();
    assert_eq!(support::state_of(&asked), TaskState::InputRequired);
    assert!(
        asked.history.iter().any(|m| m.message_id == "m-follow-up"),
        "the follow-up is in the task's history"
    );

    let failed = support::within("the sweep", b.fail_orphaned_tasks())
        .await
        .unwrap();
    assert_eq!(failed, 1, "the sweep failed no task");
    let task = support::within(
        "the task",
        b.get_task("", &Caller::ANONYMOUS, &task_id, HistoryLength::All),
    )
    .await
    .unwrap();
    assert_eq!(support::state_of(&task), TaskState::Failed);
    assert_eq!(
        support::status_text(&task),
        a2a_lifecycle::runtime::LOST_FOLLOW_UP_FAILURE
    );
    assert!(
        on_a.follow_ups.lock().unwrap().is_empty(),
        "A ran the follow-up"
    );
    assert!(
        on_b.follow_ups.lock().unwrap().is_empty(),
        "B ran the follow-up"
    );
}

/// What the sweep for orphaned tasks leaves alone: an interrupted task
/// whose replica died after its runs asked for input, the last one a
/// follow-up's (no run is owed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_task_of_a_dead_replica_waits_for_its_client() {
    use a2a_lifecycle::lifecycle::HistoryLength;
    use a2a_lifecycle::proto::TaskState;
    use a2a_lifecycle::store::Caller;

    let Some((a, b, admin)) = two_short_leases().await else {
        return;
    };
    let dead = a.replica_id();
    let on_a = Arc::new(AsksThenCounts::default());
    let a = replica(a, on_a.clone());
    let b = replica(b, Arc::new(AsksThenCounts::default()));
    let started = on_a.started.notified();
    let first = send_non_blocking(&a, support::user_message("deploy")).await;
    support::within("A's run starts", started).await;
    on_a.proceed.notify_one();
    let asked = support::within("A's run ends", a.wait(*first))
        .await
        .unwrap();
    assert_eq!(support::state_of(&asked), TaskState::InputRequired);
    let mut again = support::user_message("again");
    again.message_id = "m-again".into();
    again.task_id = asked.id.clone();
    let follow_up = send_non_blocking(&a, again).await;
    let asked = support::within("the follow-up's run ends", a.wait(*follow_up))
        .await
        .unwrap();
    assert_eq!(support::state_of(&asked), TaskState::InputRequired);
    assert_eq!(*on_a.follow_ups.lock().unwrap(), ["m-again"]);
    run_out_lease(&admin, dead).await;
    assert_eq!(
        support::within("the sweep", b.fail_orphaned_tasks())
            .await
            .unwrap(),
        0,
        "the sweep failed a task waiting for its client"
    );
    let task = support::within(
        "the task",
        b.get_task("", &Caller::ANONYMOUS, &asked.id, HistoryLength::All),
    )
    .await
    .unwrap();
    assert_eq!(support::state_of(&task), TaskState::InputRequired);
}

/// A follow-up whose run stays queued while its replica loses its lease
/// and rejoins under a new id (the fault harness's seed 4242 failed such a
/// task as owing a lost follow-up): the run, started under the new id,
/// settles what was owed under the old one, so no sweep fails the task
/// afterwards, on either replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_queued_across_a_rejoin_runs_once_and_is_owed_no_more() {
    use a2a_lifecycle::lifecycle::HistoryLength;
    use a2a_lifecycle::proto::TaskState;
    use a2a_lifecycle::store::Caller;

    let Some((a, b, admin)) = two_short_leases().await else {
        return;
    };
    let (a_store, old) = (a.clone(), a.replica_id());
    let (on_a, on_b) = (
        Arc::new(AsksThenCounts::default()),
        Arc::new(AsksThenCounts::default()),
    );
    let (a, b) = (replica(a, on_a.clone()), replica(b, on_b.clone()));
    // A hears of B's writes (B's run ending, its claim released).
    let following = tokio::spawn(a.clone().follow_changes());
    // B runs the first message; A commits a follow-up meanwhile, whose
    // run waits for B's.
    let started = on_b.started.notified();
    let first = send_non_blocking(&b, support::user_message("deploy")).await;
    support::within("B's run starts", started).await;
    let task_id = first.snapshot.id.clone();
    let mut again = support::user_message("again");
    again.message_id = "m-again".into();
    again.task_id = task_id.clone();
    let follow_up = send_non_blocking(&a, again).await;
    // A is declared dead and rejoins under a new id, its run still queued.
    declare_dead(&admin, old).await;
    assert_eq!(
        support::within("B declares A dead", b.fail_orphaned_tasks())
            .await
            .unwrap(),
        0,
        "the task was failed while its follow-up's run was queued and the task active"
    );
    support::within("A rejoins under a new id", async {
        while a_store.replica_id() == old || a_store.held_for().is_zero() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    on_a.hold_follow_ups
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let follow_up_started = on_a.follow_up_started.notified();
    on_b.proceed.notify_one();
    support::within("A's run of the follow-up starts", follow_up_started).await;
    // A sweep that read the task before A's claim (interrupted, owing a
    // run to A's old id) and fails it now would fail a task whose
    // follow-up runs: it finds the runs held by a live replica and leaves
    // the task alone.
    let owed_as_read = admin
        .execute(
            "UPDATE tasks SET owed = owed || $2::bytea WHERE id = $1",
            &[&task_id.as_bytes(), &old.as_bytes().as_slice()],
        )
        .await
        .unwrap();
    assert_eq!(owed_as_read, 1);
    assert_eq!(
        support::within("B's sweep", b.fail_orphaned_tasks())
            .await
            .unwrap(),
        0,
        "B failed a task whose follow-up's run had started"
    );
    admin
        .execute(
            "UPDATE tasks SET owed = '{}' WHERE id = $1",
            &[&task_id.as_bytes()],
        )
        .await
        .unwrap();
    on_a.follow_up_proceed.notify_one();
    let asked = support::within("A's run of the follow-up ends", a.wait(*follow_up))
        .await
        .unwrap();
    assert_eq!(support::state_of(&asked), TaskState::InputRequired);
    assert_eq!(*on_a.follow_ups.lock().unwrap(), ["m-again"]);
    assert!(on_b.follow_ups.lock().unwrap().is_empty(), "B ran it too");
    let owed: i32 = admin
        .query_one(
            "SELECT cardinality(owed) FROM tasks WHERE id = $1",
            &[&task_id.as_bytes()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(owed, 0, "a run is still owed after it ran");
    for (name, sweeper) in [("B", &b), ("A", &a)] {
        assert_eq!(
            support::within("the sweep", sweeper.fail_orphaned_tasks())
                .await
                .unwrap(),
            0,
            "{name}'s sweep failed a task whose follow-up ran"
        );
    }
    let task = support::within(
        "the task",
        b.get_task("", &Caller::ANONYMOUS, &task_id, HistoryLength::All),
    )
    .await
    .unwrap();
    assert_eq!(support::state_of(&task), TaskState::InputRequired);
    following.abort();
}

/// Loads `dump`, a `pg_dump` of a schema named `placeholder`, into a fresh
/// schema of the database at `url`: that schema, an admin connection, and
/// the URL a store opens it with.
async fn load_dump(
    url: &str,
    dump: &str,
    placeholder: &str,
) -> (String, tokio_postgres::Client, String) {
    let schema = format!("s_{}", uuid::Uuid::new_v4().simple());
    let admin = admin(url).await;
    admin
        .batch_execute(&dump.replace(placeholder, &schema))
        .await
        .expect("the dump loads");
    let store_url = format!("{url}?options=-csearch_path%3D{schema}");
    (schema, admin, store_url)
}

/// Applies a WORKING status with an agent message `text` to `record`, and
/// makes the write of it as this release does: whole (logging its changes,
/// as for a running task on a store shared by replicas) or its changes.
fn status_write(
    record: &mut a2a_lifecycle::lifecycle::TaskRecord,
    text: &str,
    whole: bool,
) -> a2a_lifecycle::store::EncodedTask {
    use a2a_lifecycle::lifecycle::{Changes, StatusUpdate, TaskEvent, TransitionPolicy};
    use a2a_lifecycle::store::{Body, EncodedTask, codec};
    let mut log = Vec::new();
    record
        .apply_logged(
            TaskEvent::Status(StatusUpdate {
                state: a2a_lifecycle::proto::TaskState::Working,
                message: Some(a2a_lifecycle::proto::Message {
                    role: a2a_lifecycle::proto::Role::Agent as i32,
                    ..support::user_message(text)
                }),
                metadata: None,
            }),
            a2a_lifecycle::runtime::now(),
            TransitionPolicy::Permissive,
            a2a_lifecycle::lifecycle::Cause::Agent,
            &mut log,
        )
        .unwrap();
    let changes: Arc<[u8]> = prost::Message::encode_to_vec(&Changes::new(log)).into();
    if whole {
        let mut write = EncodedTask::of(record, Body::Whole(codec::encode(record).into()));
        write.logged = Some(changes);
        write
    } else {
        EncodedTask::of(record, Body::Changes(changes))
    }
}

/// A database written by the release before long tasks (schema 10:
/// `tests/fixtures/postgres-schema-10.sql`, a `pg_dump` of the schema that
/// `serve` at ea82b54 wrote with the demo agents: a completed test run, a
/// code review waiting for input, a bench fan-out of 20 updates, a rejected
/// deploy) migrates in place to schema 12 and reads every task as it was;
/// its waiting task then takes writes of changes (issue "long-lived
/// tasks"), read back whole, also by a second replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_of_the_previous_release_migrates_in_place_and_takes_changes() {
    let Some(url) = support::postgres::database().await else {
        return;
    };
    let (schema, admin, store_url) = load_dump(
        &url,
        include_str!("fixtures/postgres-schema-10.sql"),
        "a2a_fixture_v10",
    )
    .await;
    let store = PostgresStore::open(&store_url).await.expect("opens");
    let (waiting_id, record, version) = support::previous_release::check_and_continue(&store).await;
    let other = PostgresStore::open(&store_url)
        .await
        .expect("a second replica");
    for reader in [&store, &other] {
        let read = reader
            .get("code-reviewer", &waiting_id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((read.record, read.version), (record.clone(), version));
    }
    let schema_version: i32 = admin
        .query_one(
            &format!("SELECT MAX(version) FROM {schema}.a2a_schema_migrations"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(schema_version, 12);
    let changes: i64 = admin
        .query_one(&format!("SELECT COUNT(*) FROM {schema}.task_changes"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(changes, 2, "the follow-up and its status, as changes");
    // Migration 0012: a whole write of the running task, logging its
    // changes for followers, then one more write of changes. Read whole,
    // and caught up by changes from each version since the follow-up.
    let mut versions = vec![(version, record.clone())];
    let (mut record, mut version) = (record, version);
    for (n, whole) in [(1, true), (2, false)] {
        let write = status_write(&mut record, &format!("step {n}"), whole);
        version = store
            .update_encoded("code-reviewer", &write, version)
            .await
            .unwrap();
        versions.push((version, record.clone()));
    }
    for reader in [&store, &other] {
        let read = reader
            .get("code-reviewer", &waiting_id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((read.record, read.version), (record.clone(), version));
    }
    // The follow-up's writes of changes are still kept (the whole write
    // drops only those up to the whole write before it: none, on a task
    // whose record is as created), and the whole write's own.
    for (after, held) in &versions {
        let up = other
            .catch_up("code-reviewer", &waiting_id, *after)
            .await
            .unwrap()
            .unwrap();
        let a2a_lifecycle::store::Caught::Changes(writes) = up.task else {
            panic!("from {after}: the whole task, though its changes are kept");
        };
        assert_eq!(writes.len() as u64, version - after);
        let mut caught = held.clone();
        for changes in writes {
            caught.replay_all(changes).unwrap();
        }
        assert_eq!(caught, record, "caught up from {after}");
    }
}

/// A follow-up committed on a replica while another replica runs the task,
/// by a client that does not wait (its handle dropped at once): its run is
/// queued until the other run ends and releases the task's runs, and then
/// starts here, though nothing here follows the task any more (the fault
/// harness met a follow-up that never ran).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_follow_up_runs_though_its_client_did_not_wait() {
    let Some((a, b, _admin)) = two_short_leases().await else {
        return;
    };
    let (on_a, on_b) = (
        Arc::new(AsksThenCounts::default()),
        Arc::new(AsksThenCounts::default()),
    );
    let (a, b) = (replica(a, on_a.clone()), replica(b, on_b.clone()));
    let following = tokio::spawn(a.clone().follow_changes());
    let started = on_b.started.notified();
    let first = send_non_blocking(&b, support::user_message("deploy")).await;
    support::within("B's run starts", started).await;
    let mut follow_up = support::user_message("staging");
    follow_up.message_id = "m-staging".into();
    follow_up.task_id = first.snapshot.id.clone();
    on_a.hold_follow_ups
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let ran = on_a.follow_up_started.notified();
    drop(send_non_blocking(&a, follow_up).await);
    on_b.proceed.notify_one();
    support::within("the follow-up's run starts on A", ran).await;
    assert_eq!(*on_a.follow_ups.lock().unwrap(), ["m-staging"]);
    on_a.follow_up_proceed.notify_one();
    following.abort();
}

/// A replica of an older release refuses a database a newer release
/// migrated (it would not read what the newer one writes), saying what to
/// do; the database is left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_migrated_by_a_newer_release_is_refused() {
    let Some(url) = support::postgres::fresh_schema().await else {
        return;
    };
    drop(PostgresStore::open(&url).await.expect("opens"));
    let db = admin(&url).await;
    let known: i32 = db
        .query_one("SELECT MAX(version) FROM a2a_schema_migrations", &[])
        .await
        .unwrap()
        .get(0);
    db.execute(
        "INSERT INTO a2a_schema_migrations (version) VALUES ($1)",
        &[&(known + 1)],
    )
    .await
    .unwrap();
    let refused = PostgresStore::open(&url).await;
    let Err(e) = refused else {
        panic!("a database at schema {} was served", known + 1);
    };
    let text = e.to_string();
    assert!(
        text.contains(&format!(
            "schema is at version {}, newer than this release's {known}",
            known + 1
        )) && text.contains("run that release"),
        "{text}"
    );
}

/// The database the release before migration 0012 wrote
/// (`tests/fixtures/postgres-schema-11.sql`: `serve` at a628e08 with the
/// demo agents, the four messages of the schema-10 fixture, and a bench
/// fan-out of 400 updates 10 ms apart killed with SIGKILL mid-run,
/// its task events trimmed as after five minutes). The fan-out is left
/// WORKING at version 220: its record from a whole write at 213, and the
/// seven writes of changes after it. It migrates in place to schema 12,
/// reads as that release read it (the record and every change kept), and
/// a replica following it catches up by changes from any of those
/// versions, across this release's whole writes too (issue "long-lived
/// tasks").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_of_the_release_before_whole_versions_is_followed_by_changes() {
    use a2a_lifecycle::store::{Caught, codec};

    let Some(url) = support::postgres::database().await else {
        return;
    };
    let (schema, admin, store_url) = load_dump(
        &url,
        include_str!("fixtures/postgres-schema-11.sql"),
        "a2a_fixture_v11",
    )
    .await;
    // The fan-out as stored, read raw: its record and each change after.
    let rows = admin
        .query(
            &format!(
                "SELECT t.id, t.version, t.record, c.version, c.changes FROM {schema}.tasks t \
                 JOIN {schema}.task_changes c ON c.tenant = t.tenant AND c.task_id = t.id \
                 ORDER BY c.version"
            ),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 7, "the fixture's writes of changes");
    let id: Vec<u8> = rows[0].get(0);
    let id = String::from_utf8(id).unwrap();
    let version = rows[0].get::<_, i64>(1) as u64;
    assert_eq!(version, 220);
    let mut record = codec::decode(rows[0].get::<_, &[u8]>(2)).unwrap();
    let mut versions = vec![(213u64, record.clone())];
    for row in &rows {
        record
            .replay_all(codec::decode_changes(row.get::<_, &[u8]>(4)).unwrap())
            .unwrap();
        versions.push((row.get::<_, i64>(3) as u64, record.clone()));
    }
    assert_eq!(versions.last().unwrap().0, 220);

    let store = PostgresStore::open(&store_url).await.expect("opens");
    let other = PostgresStore::open(&store_url)
        .await
        .expect("a second replica");
    let read = store.get("bench", &id).await.unwrap().unwrap();
    assert_eq!((&read.record, read.version), (&record, 220));
    let updates = support::fanout_updates_in(&read.record.task);
    assert!(updates > 200, "{updates} updates in the fan-out");
    let catch_up_from = |after: u64, held: a2a_lifecycle::lifecycle::TaskRecord| {
        let (other, id) = (&other, &id);
        async move {
            let up = other
                .catch_up("bench", id, after)
                .await
                .unwrap()
                .expect("the task");
            match up.task {
                Caught::Changes(writes) => {
                    assert_eq!(writes.len() as u64, up.version - after, "from {after}");
                    let mut caught = held;
                    for changes in writes {
                        caught.replay_all(changes).unwrap();
                    }
                    Some(caught)
                }
                Caught::Whole(_) => None,
            }
        }
    };
    for (after, held) in &versions {
        let caught = catch_up_from(*after, held.clone()).await;
        assert_eq!(caught.as_ref(), Some(&record), "caught up from {after}");
    }
    // This release's writes: whole (logging its changes), changes, whole.
    let (mut version, mut current) = (220u64, record);
    for (n, whole) in [(1, true), (2, false), (3, true)] {
        let write = status_write(&mut current, &format!("step {n}"), whole);
        version = store
            .update_encoded("bench", &write, version)
            .await
            .unwrap();
        for reader in [&store, &other] {
            let read = reader.get("bench", &id).await.unwrap().unwrap();
            assert_eq!(
                (&read.record, read.version),
                (&current, version),
                "step {n}"
            );
        }
        versions.push((version, current.clone()));
        // The first whole write keeps every change before it (the record
        // it replaces is the old release's, at version 0 as far as the
        // new column knows); the second drops those up to the first.
        for (after, held) in &versions {
            let caught = catch_up_from(*after, held.clone()).await;
            if n == 3 && *after < 221 {
                assert_eq!(caught, None, "from {after}, after the second whole write");
            } else {
                assert_eq!(caught.as_ref(), Some(&current), "from {after}, step {n}");
            }
        }
    }
}

/// A follow-up on a replica whose copy of the task is stale (another
/// replica finished the task meanwhile, and nothing here followed it):
/// the write meets the conflict, the message no longer applies to the
/// task as stored, and it is refused as if it had come after. The dropped
/// message must leave this replica's copy too: the fault harness met a
/// replica that kept it there and answered the message (and its retry) as
/// already taken, with the task as it was before it ended (seed
/// 3538546132, check 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_refused_after_a_conflict_leaves_no_trace_on_its_replica() {
    use a2a_lifecycle::proto::TaskState;
    use a2a_lifecycle::runtime::{MessageRequest, SendOutcome};
    let Some((a, b)) = two_replicas().await else {
        return;
    };
    let (on_a, on_b) = (
        Arc::new(AsksThenCounts::default()),
        Arc::new(AsksThenCounts::default()),
    );
    let (a, b) = (replica(a, on_a.clone()), replica(b, on_b.clone()));
    // B hears of A's writes, as every server does: B's run of "go" waits
    // for A's release of the task's runs, and a claim refused before that
    // release commits is tried again only on its notice (or the periodic
    // look). A does not follow: its copy must stay stale for the conflict.
    let following = tokio::spawn(b.clone().follow_changes());
    let anonymous = a2a_lifecycle::store::Caller::ANONYMOUS;
    on_a.proceed.notify_one();
    let first = support::user_message("deploy");
    let task = support::run_to_rest(&a, "", &anonymous, MessageRequest::from(first.clone())).await;
    assert_eq!(support::state_of(&task), TaskState::InputRequired);
    // The task held on A (a repeat of its first message: the task as it
    // is), and not followed there.
    let held = send_non_blocking(&a, first).await;
    assert_eq!(support::state_of(&held.snapshot), TaskState::InputRequired);
    let mut go = support::user_message("go");
    go.task_id = task.id.clone();
    let done = support::run_to_rest(&b, "", &anonymous, MessageRequest::from(go)).await;
    assert_eq!(support::state_of(&done), TaskState::Completed);
    let mut late = support::user_message("staging");
    late.message_id = "m-late".into();
    late.task_id = task.id.clone();
    for attempt in ["the follow-up", "its retry"] {
        let answer = support::within(
            attempt,
            a.send_message(
                "",
                &anonymous,
                MessageRequest::from(late.clone()),
                a2a_lifecycle::lifecycle::HistoryLength::All,
                false,
            ),
        )
        .await;
        match answer {
            Err(e) => assert!(
                !matches!(e, a2a_lifecycle::error::A2aError::Unavailable(_)),
                "{attempt}: {e}"
            ),
            Ok(SendOutcome::Task(handle)) => panic!(
                "{attempt} was taken, the task {:?} with {} messages",
                support::state_of(&handle.snapshot),
                handle.snapshot.history.len()
            ),
            Ok(_) => panic!("{attempt}: answered with a message"),
        }
    }
    let stored = a
        .get_task(
            "",
            &anonymous,
            &task.id,
            a2a_lifecycle::lifecycle::HistoryLength::All,
        )
        .await
        .unwrap();
    assert_eq!(support::state_of(&stored), TaskState::Completed);
    assert!(
        stored.history.iter().all(|m| m.message_id != "m-late"),
        "the refused message is in the task's history"
    );
    drop(held);
    following.abort();
}
