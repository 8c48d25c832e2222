//! `GET /metrics` over real sockets: scraped, parsed with a Prometheus
//! text parser, and checked to move by exactly what each test did.

use crate::support;

use a2a_lifecycle::proto::{GetTaskRequest, SubscribeToTaskRequest, TaskState};
use prometheus_parse::Scrape;
use tokio_stream::StreamExt;

use support::metric_value as value;
use support::*;

/// The server's metrics now, parsed.
async fn scrape(server: &TestServer) -> Scrape {
    scrape_with(server, &[]).await
}

/// The same, with extra request headers (credentials).
async fn scrape_with(server: &TestServer, headers: &[(&str, &str)]) -> Scrape {
    let response = http_get(server.addr, "/metrics", headers).await;
    assert_eq!(response.status, 200, "{}", response.body);
    assert!(
        response
            .header("content-type")
            .is_some_and(|t| t.starts_with("application/openmetrics-text")),
        "{:?}",
        response.header("content-type")
    );
    parse_metrics(&response.body)
}

/// What moved between two scrapes.
fn moved(before: &Scrape, after: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    value(after, name, labels) - value(before, name, labels)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpcs_tasks_and_states_move_by_exactly_what_was_done() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let before = scrape(&server).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        let task = within(
            "send",
            send_task(&mut client, request("bench", user_message("go"), false)),
        )
        .await;
        assert_eq!(state_of(&task), TaskState::Completed);
        ids.push(task.id);
    }
    for id in ["nope-1", "nope-2"] {
        let missing = within(
            "get a missing task",
            client.get_task(GetTaskRequest {
                tenant: "bench".into(),
                id: id.into(),
                history_length: None,
            }),
        )
        .await;
        assert_eq!(missing.unwrap_err().code(), tonic::Code::NotFound);
    }
    within("get", get_task(&mut client, "bench", &ids[0]))
        .await
        .expect("the task");
    let after = scrape(&server).await;

    let rpc = "a2a_rpc_requests_total";
    let send_ok = [("method", "SendMessage"), ("code", "OK")];
    assert_eq!(moved(&before, &after, rpc, &send_ok), 3.0);
    let not_found = [("method", "GetTask"), ("code", "NOT_FOUND")];
    assert_eq!(moved(&before, &after, rpc, &not_found), 2.0);
    let get_ok = [("method", "GetTask"), ("code", "OK")];
    assert_eq!(moved(&before, &after, rpc, &get_ok), 1.0);
    let latency = "a2a_rpc_duration_seconds";
    assert_eq!(
        moved(&before, &after, latency, &[("method", "SendMessage")]),
        3.0
    );
    assert_eq!(
        moved(&before, &after, latency, &[("method", "GetTask")]),
        3.0
    );
    // The scrape itself is no RPC.
    assert_eq!(moved(&before, &after, rpc, &[("method", "other")]), 0.0);

    let bench = [("agent", "bench")];
    assert_eq!(
        moved(&before, &after, "a2a_tasks_created_total", &bench),
        3.0
    );
    let completed = [("agent", "bench"), ("state", "TASK_STATE_COMPLETED")];
    assert_eq!(
        moved(&before, &after, "a2a_task_states_total", &completed),
        3.0
    );
    let failed = [("agent", "bench"), ("state", "TASK_STATE_FAILED")];
    assert_eq!(
        moved(&before, &after, "a2a_task_states_total", &failed),
        0.0
    );
    server.stop().await;
}

/// A subscriber counts as an open stream while it is open; the RPC is
/// counted when it ends, CANCELLED when the client walked away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_streams_and_runs_are_gauged_and_an_abandoned_stream_counts_as_cancelled() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let before = scrape(&server).await;
    // The deployer waits for an approval: a run that stays active.
    let task = within(
        "send",
        send_task(
            &mut client,
            request("deployer", user_message("deploy to staging"), true),
        ),
    )
    .await;
    let mut events = within(
        "subscribe",
        client.subscribe_to_task(SubscribeToTaskRequest {
            tenant: "deployer".into(),
            id: task.id.clone(),
        }),
    )
    .await
    .unwrap()
    .into_inner();
    within("the snapshot", events.next())
        .await
        .unwrap()
        .unwrap();
    let open = scrape(&server).await;
    assert_eq!(
        value(&open, "a2a_streams_open", &[("kind", "subscribe")]),
        1.0
    );
    drop(events);
    // The server sees the reset, drops the stream, and counts the call.
    let subscribe_cancelled = [("method", "SubscribeToTask"), ("code", "CANCELLED")];
    let after = eventually_scraped(&server, |s| {
        value(s, "a2a_streams_open", &[("kind", "subscribe")]) == 0.0
            && moved(&before, s, "a2a_rpc_requests_total", &subscribe_cancelled) == 1.0
    })
    .await;
    assert_eq!(
        moved(
            &before,
            &after,
            "a2a_rpc_requests_total",
            &[("method", "SubscribeToTask")]
        ),
        1.0
    );
    // The deployer's approval arrives by itself and the run ends: no run
    // is left counted.
    eventually_scraped(&server, |s| value(s, "a2a_runs_active", &[]) == 0.0).await;
    server.stop().await;
}

/// Scrapes until `done` holds for a scrape (the server counts some things
/// after it answered: a stream's end, a run's).
async fn eventually_scraped(server: &TestServer, done: impl Fn(&Scrape) -> bool) -> Scrape {
    within("the metrics to settle", async {
        loop {
            let scraped = scrape(server).await;
            if done(&scraped) {
                return scraped;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await
}

/// `a2a_tasks` counts the store's unfinished tasks by state: a task
/// waiting for input is counted while it waits, and not once it is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_tasks_are_gauged_by_state() {
    let manager = a2a_lifecycle::runtime::TaskManager::new(
        std::sync::Arc::new(a2a_lifecycle::store::MemoryStore::new()),
        a2a_lifecycle::agent::demo::demo_router(),
        Default::default(),
    );
    let operations = a2a_lifecycle::operations::Operations {
        probe_every: std::time::Duration::from_millis(20),
        ..Default::default()
    };
    let server = a2a_lifecycle::server::Server::new(manager).operations(operations);
    let server = TestServer::serve(server).await;
    let mut client = server.client().await;
    let waiting = [("state", "TASK_STATE_INPUT_REQUIRED")];
    let task = within(
        "a review waiting for its diff",
        send_task(
            &mut client,
            request("code-reviewer", user_message("review"), false),
        ),
    )
    .await;
    assert_eq!(state_of(&task), TaskState::InputRequired);
    let scraped = eventually_scraped(&server, |s| value(s, "a2a_tasks", &waiting) == 1.0).await;
    assert_eq!(
        value(&scraped, "a2a_tasks", &[("state", "TASK_STATE_WORKING")]),
        0.0
    );

    let mut diff = user_message("diff --git a/x b/x");
    diff.task_id = task.id.clone();
    let done = within(
        "the review",
        send_task(&mut client, request("code-reviewer", diff, false)),
    )
    .await;
    assert_eq!(state_of(&done), TaskState::Completed);
    eventually_scraped(&server, |s| value(s, "a2a_tasks", &waiting) == 0.0).await;
    server.stop().await;
}

/// With metrics off, nothing is served at `/metrics`.
#[tokio::test]
async fn metrics_off_serves_no_metrics() {
    let config = a2a_lifecycle::runtime::RuntimeConfig {
        metrics: None,
        ..Default::default()
    };
    let server = TestServer::start_with(a2a_lifecycle::agent::demo::demo_router(), config).await;
    let response = http_get(server.addr, "/metrics", &[]).await;
    assert_eq!(response.status, 404);
    server.stop().await;
}

/// Store writes are timed by backend (none failed), and SQLite's writer
/// reports its batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_writes_and_batches_are_counted_by_backend() {
    let dir = tempfile_dir();
    let store = a2a_lifecycle::store::SqliteStore::open(&dir.join("metrics.db"))
        .await
        .expect("open");
    let server = TestServer::start_full(
        std::sync::Arc::new(store),
        a2a_lifecycle::agent::demo::demo_router(),
        Default::default(),
    )
    .await;
    let mut client = server.client().await;
    let before = scrape(&server).await;
    for _ in 0..4 {
        let task = within(
            "send",
            send_task(&mut client, request("bench", user_message("go"), false)),
        )
        .await;
        assert_eq!(state_of(&task), TaskState::Completed);
    }
    let after = scrape(&server).await;
    let sqlite = [("backend", "sqlite")];
    // At least a write per task (a task's events may share one).
    assert!(moved(&before, &after, "a2a_store_write_seconds", &sqlite) >= 4.0);
    assert_eq!(
        moved(&before, &after, "a2a_store_write_failures_total", &sqlite),
        0.0
    );
    assert!(moved(&before, &after, "a2a_store_batch_writes", &sqlite) >= 1.0);
    assert_eq!(
        value(&after, "a2a_store_write_seconds", &[("backend", "memory")]),
        0.0
    );
    server.stop().await;
}

/// A fresh directory under the target directory, removed by nobody (the
/// test's database is small).
fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("metrics-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Under `--auth`, `/metrics` needs credentials, and refused requests are
/// counted by reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_auth_metrics_need_credentials_and_failures_are_counted() {
    const KEY: &str = "metrics-test-key";
    let file = format!(
        "[[principal]]\nname = \"ops\"\napi_key_sha256 = \"{}\"\ntenants = [\"*\"]\nrole = \"admin\"\n",
        support::jwt::key_digest(KEY),
    );
    let auth = a2a_lifecycle::auth::Authenticator::parse(&file, std::path::Path::new("."))
        .unwrap()
        .with_free_failures(u32::MAX);
    let server = TestServer::start_auth(std::sync::Arc::new(auth)).await;
    let refused = http_get(server.addr, "/metrics", &[]).await;
    assert_eq!(refused.status, 401);
    assert_eq!(refused.header("www-authenticate"), Some("Bearer"));
    let bearer = format!("Bearer {KEY}");
    let key = [("authorization", bearer.as_str())];
    let before = scrape_with(&server, &key).await;
    let mut client = server.client().await;
    for _ in 0..2 {
        let status = within(
            "get without a key",
            client.get_task(GetTaskRequest {
                tenant: String::new(),
                id: "any".into(),
                history_length: None,
            }),
        )
        .await
        .unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
    }
    let mut wrong = tonic::Request::new(GetTaskRequest {
        tenant: String::new(),
        id: "any".into(),
        history_length: None,
    });
    wrong
        .metadata_mut()
        .insert("authorization", "Bearer not-a-key".parse().unwrap());
    let status = within("get with a wrong key", client.get_task(wrong))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    let after = scrape_with(&server, &key).await;
    let failures = "a2a_auth_failures_total";
    assert_eq!(
        moved(&before, &after, failures, &[("reason", "missing")]),
        2.0
    );
    assert_eq!(
        moved(&before, &after, failures, &[("reason", "unknown_key")]),
        1.0
    );
    let unauthenticated = [("method", "GetTask"), ("code", "UNAUTHENTICATED")];
    assert_eq!(
        moved(&before, &after, "a2a_rpc_requests_total", &unauthenticated),
        3.0
    );
    server.stop().await;
}

/// A metric the scrape does not have is a failure, not a 0: a check that
/// something stayed at 0 fails when its metric is renamed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metric_missing_from_the_scrape_fails_its_check() {
    let server = TestServer::start().await;
    let scraped = scrape(&server).await;
    // Declared, with no series yet: 0.
    assert_eq!(
        value(
            &scraped,
            "a2a_rpc_requests_total",
            &[("method", "NoSuchMethod")]
        ),
        0.0
    );
    let renamed = std::panic::catch_unwind(|| value(&scraped, "a2a_rpc_request_total", &[]));
    assert!(renamed.is_err(), "a missing metric read as {renamed:?}");
    server.stop().await;
}
