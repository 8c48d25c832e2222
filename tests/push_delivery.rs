//! Push delivery (issue "push notifications") with a real HTTP receiver on
//! loopback: every committed event reaches each config in order with its
//! headers; failures are retried without losing or reordering events; an
//! address the policy refuses is never reached; a deleted config gets
//! nothing more.

use crate::support;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use a2a_lifecycle::agent::demo::demo_router;
use a2a_lifecycle::proto::{
    AuthenticationInfo, StreamResponse, TaskPushNotificationConfig, TaskState,
    stream_response::Payload,
};
use a2a_lifecycle::push::deliver::{Dispatcher, Settings};
use a2a_lifecycle::push::egress::Egress;
use a2a_lifecycle::runtime::{MessageRequest, RuntimeConfig, TaskManager};
use a2a_lifecycle::store::{Caller, MemoryStore, TaskStore};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use support::{user_message, within};

const TENANT: &str = "code-reviewer";

/// One POST as the receiver saw it.
#[derive(Debug)]
struct Received {
    authorization: Option<String>,
    token: Option<String>,
    content_type: Option<String>,
    traceparent: Option<String>,
    event: String,
    /// Which of the receiver's connections it came on, counted from 0.
    connection: usize,
}

/// An HTTP/1.1 receiver on loopback that answers the first `fail` POSTs
/// 503 (`Retry-After: 0`), then 200; each POST it takes goes to the
/// channel.
async fn receiver(fail: usize) -> (u16, mpsc::UnboundedReceiver<Received>) {
    receiver_answering(fail, 503, None).await
}

/// [`receiver`], failing with `status` (with a `Location` when given); a
/// failed POST goes to the channel too unless `status` is 503.
async fn receiver_answering(
    fail: usize,
    status: u16,
    location: Option<String>,
) -> (u16, mpsc::UnboundedReceiver<Received>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    serve_receiver(listener, fail, status, location, true)
}

/// [`receiver`], closing each connection after one answer.
async fn receiver_closing() -> (u16, mpsc::UnboundedReceiver<Received>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    serve_receiver(listener, 0, 503, None, false)
}

/// [`receiver`] on a given port.
async fn receiver_on(port: u16) -> (u16, mpsc::UnboundedReceiver<Received>) {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    serve_receiver(listener, 0, 503, None, true)
}

fn serve_receiver(
    listener: tokio::net::TcpListener,
    fail: usize,
    status: u16,
    location: Option<String>,
    keep_alive: bool,
) -> (u16, mpsc::UnboundedReceiver<Received>) {
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::unbounded_channel();
    let failures = Arc::new(AtomicUsize::new(fail));
    tokio::spawn(async move {
        for connection in 0.. {
            let (tcp, _) = listener.accept().await.unwrap();
            let (tx, failures, location) = (tx.clone(), failures.clone(), location.clone());
            let service = hyper::service::service_fn(
                move |request: hyper::Request<hyper::body::Incoming>| {
                    let (tx, failures, location) = (tx.clone(), failures.clone(), location.clone());
                    answer(request, tx, failures, status, location, connection)
                },
            );
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .keep_alive(keep_alive)
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    (port, rx)
}

/// One POST to the test receiver.
async fn answer(
    request: hyper::Request<hyper::body::Incoming>,
    tx: mpsc::UnboundedSender<Received>,
    failures: Arc<AtomicUsize>,
    fail_status: u16,
    location: Option<String>,
    connection: usize,
) -> Result<hyper::Response<http_body_util::Empty<bytes::Bytes>>, Infallible> {
    use http_body_util::BodyExt;
    let header = |name: &str| {
        request
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let received = Received {
        authorization: header("authorization"),
        token: header("x-a2a-notification-token"),
        content_type: header("content-type"),
        traceparent: header("traceparent"),
        event: String::new(),
        connection,
    };
    let body = request.into_body().collect().await.unwrap().to_bytes();
    let received = Received {
        event: String::from_utf8(body.to_vec()).unwrap(),
        ..received
    };
    let failing = failures
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    let status = if failing { fail_status } else { 200 };
    if status != 503 {
        let _ = tx.send(received);
    }
    let mut response = hyper::Response::builder()
        .status(status)
        .header("retry-after", "0");
    if let Some(location) = location.filter(|_| failing) {
        response = response.header("location", location);
    }
    Ok(response
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap())
}

struct Setup {
    manager: TaskManager,
    store: Arc<MemoryStore>,
    stop: CancellationToken,
}

fn setup(egress: Egress) -> Setup {
    let (setup, dispatcher) = setup_stopped(egress);
    tokio::spawn(dispatcher.run(setup.stop.clone()));
    setup
}

/// [`setup`] with the dispatcher not yet running: notifications wait in
/// the outbox until it runs.
fn setup_stopped(egress: Egress) -> (Setup, Dispatcher) {
    setup_stopped_with(Settings {
        egress,
        ..Settings::default()
    })
}

fn setup_stopped_with(settings: Settings) -> (Setup, Dispatcher) {
    let store = Arc::new(MemoryStore::new());
    let manager = TaskManager::new(
        store.clone() as Arc<dyn TaskStore>,
        demo_router(),
        RuntimeConfig::default(),
    );
    let dispatcher = Dispatcher::new(
        store.clone() as Arc<dyn TaskStore>,
        settings,
        manager.outbox_signal(),
    );
    let setup = Setup {
        manager,
        store,
        stop: CancellationToken::new(),
    };
    (setup, dispatcher)
}

fn loopback() -> Egress {
    Egress::new(vec!["127.0.0.0/8".parse().unwrap()])
}

/// A code-reviewer task waiting for the diff, with a webhook on `port`.
async fn task_with_hook(manager: &TaskManager, port: u16, id: &str) -> String {
    task_with_hook_at(manager, &format!("127.0.0.1:{port}"), id).await
}

/// [`task_with_hook`] at `authority` (`host:port`). The runtime takes the
/// config as given: the policy's check at creation is the service's, so
/// only the check at connection time stands between it and the address.
async fn task_with_hook_at(manager: &TaskManager, authority: &str, id: &str) -> String {
    let request = MessageRequest::from(user_message("review my change"));
    let task = support::run_to_rest(manager, TENANT, &Caller::ANONYMOUS, request).await;
    manager
        .set_push_config(
            TENANT,
            &Caller::ANONYMOUS,
            TaskPushNotificationConfig {
                tenant: TENANT.into(),
                task_id: task.id.clone(),
                id: id.into(),
                url: format!("http://{authority}/hooks/a2a?x=1"),
                token: "opaque-token".into(),
                authentication: Some(AuthenticationInfo {
                    scheme: "Bearer".into(),
                    credentials: "secret-credential".into(),
                }),
            },
        )
        .await
        .unwrap();
    task.id
}

/// Sends the diff: WORKING, the review artifact, COMPLETED.
async fn finish(manager: &TaskManager, task_id: &str) {
    let mut diff = user_message("diff --git a/x b/x");
    diff.task_id = task_id.into();
    let request = MessageRequest::from(diff);
    let done = support::run_to_rest(manager, TENANT, &Caller::ANONYMOUS, request).await;
    assert_eq!(support::state_of(&done), TaskState::Completed);
}

fn describe(event: &str) -> String {
    let event: StreamResponse = a2a_lifecycle::json::from_str(event).unwrap();
    match event.payload {
        Some(Payload::StatusUpdate(u)) => TaskState::try_from(u.status.unwrap().state)
            .unwrap()
            .as_str_name()
            .to_owned(),
        Some(Payload::ArtifactUpdate(a)) => format!("artifact {}", a.artifact.unwrap().artifact_id),
        other => panic!("not an update: {other:?}"),
    }
}

/// The next `n` notifications the receiver took, each awaited with a
/// timeout.
async fn next_notifications(
    received: &mut mpsc::UnboundedReceiver<Received>,
    n: usize,
) -> Vec<Received> {
    let mut got = Vec::with_capacity(n);
    for _ in 0..n {
        got.push(within("a notification", received.recv()).await.unwrap());
    }
    got
}

/// What each notification reports (see [`describe`]).
fn described(notifications: &[Received]) -> Vec<String> {
    notifications.iter().map(|r| describe(&r.event)).collect()
}

const EXPECTED: [&str; 3] = [
    "TASK_STATE_WORKING",
    "artifact review",
    "TASK_STATE_COMPLETED",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_reaches_the_webhook_in_order_with_its_headers() {
    let (port, mut received) = receiver(0).await;
    let s = setup(loopback());
    let task = task_with_hook(&s.manager, port, "hook").await;
    finish(&s.manager, &task).await;
    let got = next_notifications(&mut received, EXPECTED.len()).await;
    for r in &got {
        assert_eq!(r.authorization.as_deref(), Some("Bearer secret-credential"));
        assert_eq!(r.token.as_deref(), Some("opaque-token"));
        assert_eq!(r.content_type.as_deref(), Some("application/a2a+json"));
        assert_eq!(r.traceparent, None, "no trace was sent, none is made up");
        // One connection, kept alive from one POST to the next.
        assert_eq!(r.connection, 0);
    }
    assert_eq!(described(&got), EXPECTED);
    // Done: the outbox empties.
    drained(&s.store).await;
    s.stop.cancel();
}

/// A webhook that closes each connection after answering: every POST goes
/// on a new one, none lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_that_closes_connections_gets_every_event() {
    let (port, mut received) = receiver_closing().await;
    let s = setup(loopback());
    let task = task_with_hook(&s.manager, port, "hook").await;
    finish(&s.manager, &task).await;
    let got = next_notifications(&mut received, EXPECTED.len()).await;
    for (n, r) in got.iter().enumerate() {
        assert_eq!(r.connection, n, "a new connection each time");
    }
    assert_eq!(described(&got), EXPECTED);
    drained(&s.store).await;
    s.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_that_fails_twice_still_gets_every_event_in_order() {
    let (port, mut received) = receiver(2).await;
    let s = setup(loopback());
    let task = task_with_hook(&s.manager, port, "hook").await;
    finish(&s.manager, &task).await;
    let got = next_notifications(&mut received, EXPECTED.len()).await;
    assert_eq!(described(&got), EXPECTED, "retried, in order");
    s.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_address_is_never_reached() {
    let (port, mut received) = receiver(0).await;
    // The default policy: loopback is refused.
    let s = setup(Egress::default());
    let task = task_with_hook(&s.manager, port, "hook").await;
    finish(&s.manager, &task).await;
    // Each entry is given up (refused is final), and nothing arrived.
    drained(&s.store).await;
    assert!(
        received.try_recv().is_err(),
        "a refused address was reached"
    );
    s.stop.cancel();
}

/// Waits until every notification has been delivered, refused or given up.
async fn drained(store: &MemoryStore) {
    within("outbox drained", async {
        // Polled: the store has no signal for an emptied outbox.
        while !store.outbox().pending(0, 10).await.unwrap().is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// A name is judged by what it resolves to when the connection is made:
/// `localhost` (loopback) reaches nothing under the default policy, and
/// reaches the receiver once loopback is allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_name_resolving_to_a_refused_address_is_refused_at_connection_time() {
    let (port, mut received) = receiver(0).await;
    let s = setup(Egress::default());
    let task = task_with_hook_at(&s.manager, &format!("localhost:{port}"), "hook").await;
    finish(&s.manager, &task).await;
    drained(&s.store).await;
    assert!(received.try_recv().is_err(), "localhost was reached");
    s.stop.cancel();

    let s = setup(loopback());
    let task = task_with_hook_at(&s.manager, &format!("localhost:{port}"), "hook").await;
    finish(&s.manager, &task).await;
    for expected in EXPECTED {
        let r = within("a notification", received.recv()).await.unwrap();
        assert_eq!(describe(&r.event), expected);
    }
    s.stop.cancel();
}

/// Deleting a config drops what is still waiting for it: the events were
/// committed (and queued) while delivery was stopped, the config was
/// deleted, and then nothing reached the webhook.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_config_stops_its_deliveries() {
    let (port, mut received) = receiver(0).await;
    let (s, dispatcher) = setup_stopped(loopback());
    let task = task_with_hook(&s.manager, port, "hook").await;
    finish(&s.manager, &task).await;
    assert_eq!(
        s.store.outbox().pending(0, 10).await.unwrap().len(),
        EXPECTED.len(),
        "queued with their events"
    );
    deliver_after_deleting(&s, dispatcher, &task).await;
    assert!(
        received.try_recv().is_err(),
        "a deleted config was notified"
    );
    s.stop.cancel();
}

/// A notification carries the trace of the run whose events it reports:
/// the caller's trace id, the run's own span as the parent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_carries_the_trace_of_the_run_behind_it() {
    use a2a_lifecycle::telemetry::TraceParent;
    const CALLER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let caller = TraceParent::parse(CALLER).unwrap();
    let (port, mut received) = receiver(0).await;
    let s = setup(loopback());
    let task = task_with_hook(&s.manager, port, "hook").await;
    let mut diff = user_message("diff --git a/x b/x");
    diff.task_id = task.clone();
    let mut request = MessageRequest::from(diff);
    request.trace = Some(caller);
    let done = support::run_to_rest(&s.manager, TENANT, &Caller::ANONYMOUS, request).await;
    assert_eq!(support::state_of(&done), TaskState::Completed);
    let got = next_notifications(&mut received, EXPECTED.len()).await;
    assert_eq!(described(&got), EXPECTED);
    let carried: Vec<TraceParent> = got
        .iter()
        .map(|r| TraceParent::parse(r.traceparent.as_deref().expect("a traceparent")).unwrap())
        .collect();
    for trace in &carried {
        assert_eq!(trace.trace_id, caller.trace_id, "the caller's trace");
        assert_eq!(trace.flags, caller.flags);
        assert_ne!(
            trace.parent_id, caller.parent_id,
            "the run's span, not the caller's"
        );
        assert_eq!(trace.parent_id, carried[0].parent_id, "one run");
    }
    s.stop.cancel();
}

/// The push metrics move by exactly what happened: a webhook failing
/// twice (two retries, three delivered, five POSTs timed), a refused
/// address (three refused), a deleted config (three dropped); and the
/// outbox backlog returns to zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_outcomes_retries_and_backlog_are_counted() {
    let metrics = Arc::new(a2a_lifecycle::metrics::Metrics::new());
    let counted = |egress| Settings {
        egress,
        metrics: Some(metrics.push.clone()),
        ..Settings::default()
    };
    let value = |name: &str, labels: &[(&str, &str)]| {
        support::metric_value(&support::parse_metrics(&metrics.render()), name, labels)
    };

    let (port, mut received) = receiver(2).await;
    let (s, dispatcher) = setup_stopped_with(counted(loopback()));
    let task = task_with_hook(&s.manager, port, "hook").await;
    finish(&s.manager, &task).await;
    tokio::spawn(dispatcher.run(s.stop.clone()));
    let got = next_notifications(&mut received, EXPECTED.len()).await;
    assert_eq!(described(&got), EXPECTED);
    drained(&s.store).await;
    let delivered = [("outcome", "delivered")];
    assert_eq!(value("a2a_push_deliveries_total", &delivered), 3.0);
    assert_eq!(value("a2a_push_retries_total", &[]), 2.0);
    assert_eq!(value("a2a_push_attempt_seconds", &[]), 5.0);
    within("the backlog back to zero", async {
        while value("a2a_push_outbox_pending", &[]) != 0.0 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await;
    s.stop.cancel();

    // The default policy refuses loopback: final, not retried.
    let (s, dispatcher) = setup_stopped_with(counted(Egress::default()));
    let task = task_with_hook(&s.manager, port, "hook").await;
    finish(&s.manager, &task).await;
    tokio::spawn(dispatcher.run(s.stop.clone()));
    drained(&s.store).await;
    assert_eq!(
        value("a2a_push_deliveries_total", &[("outcome", "refused")]),
        3.0
    );
    assert_eq!(value("a2a_push_retries_total", &[]), 2.0, "no retry");

    let (s, dispatcher) = setup_stopped_with(counted(loopback()));
    let task = task_with_hook(&s.manager, port, "hook").await;
    finish(&s.manager, &task).await;
    deliver_after_deleting(&s, dispatcher, &task).await;
    assert_eq!(
        value("a2a_push_deliveries_total", &[("outcome", "dropped")]),
        3.0
    );
    assert_eq!(value("a2a_push_deliveries_total", &delivered), 3.0);
    assert!(received.try_recv().is_err(), "nothing more was POSTed");
    s.stop.cancel();
}

/// Deletes `task`'s config "hook", then lets the dispatcher deliver what
/// was queued for it, until the outbox is empty.
async fn deliver_after_deleting(s: &Setup, dispatcher: Dispatcher, task: &str) {
    s.manager
        .delete_push_config(TENANT, &Caller::ANONYMOUS, task, "hook")
        .await
        .unwrap();
    tokio::spawn(dispatcher.run(s.stop.clone()));
    drained(&s.store).await;
}

/// `request` with `config` as its push notification config.
fn with_webhook(
    mut request: a2a_lifecycle::proto::SendMessageRequest,
    config: TaskPushNotificationConfig,
) -> a2a_lifecycle::proto::SendMessageRequest {
    request
        .configuration
        .get_or_insert_with(Default::default)
        .task_push_notification_config = Some(config);
    request
}

/// A server with push on, webhooks allowed on loopback, the demo agents.
struct PushServer {
    addr: std::net::SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    served: tokio::task::JoinHandle<Result<(), Box<dyn std::error::Error + Send + Sync>>>,
}

impl PushServer {
    async fn start() -> Self {
        Self::start_with(loopback()).await
    }

    async fn start_with(egress: Egress) -> Self {
        use a2a_lifecycle::server::{ServerParts, serve};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let parts = ServerParts {
            agents: demo_router(),
            push: Some(Settings {
                egress,
                ..Settings::default()
            }),
            ..Default::default()
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(serve(listener, parts, async {
            let _ = stopped.await;
        }));
        PushServer { addr, stop, served }
    }

    async fn client(
        &self,
    ) -> a2a_lifecycle::proto::a2a_service_client::A2aServiceClient<tonic::transport::Channel> {
        within(
            "connect",
            a2a_lifecycle::proto::a2a_service_client::A2aServiceClient::connect(format!(
                "http://{}",
                self.addr
            )),
        )
        .await
        .unwrap()
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        within("shutdown", self.served).await.unwrap().unwrap();
    }
}

/// The config RPCs over real gRPC on a server with push on: the URL is
/// checked against the policy when the config is created, the server
/// assigns an id, a missing config is TASK_NOT_FOUND naming it, delete is
/// idempotent, the cards declare push, and the webhook gets the events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_config_rpcs_over_grpc() {
    use a2a_lifecycle::proto::*;
    use tonic_types::StatusExt;

    let (port, mut received) = receiver(0).await;
    let server = PushServer::start().await;
    let (addr, mut client) = (server.addr, server.client().await);
    let card = support::http_get(addr, "/code-reviewer/.well-known/agent-card.json", &[]).await;
    assert!(
        card.body.contains("\"pushNotifications\": true"),
        "{}",
        card.body
    );

    let task = support::send_task(
        &mut client,
        support::request(TENANT, user_message("review my change"), false),
    )
    .await;
    let hook = |url: String, id: &str| TaskPushNotificationConfig {
        tenant: TENANT.into(),
        task_id: task.id.clone(),
        id: id.into(),
        url,
        token: "opaque-token".into(),
        authentication: None,
    };
    // Refused addresses, and a URL that is no URL, name the field.
    for url in [
        "http://10.0.0.1/hook".to_owned(),
        "http://169.254.169.254/latest".to_owned(),
        "ftp://example.test/x".to_owned(),
        "http://user:pw@127.0.0.1/x".to_owned(),
    ] {
        let refused = client
            .create_task_push_notification_config(hook(url.clone(), ""))
            .await
            .unwrap_err();
        support::assert_bad_field(&refused, "url");
    }
    let created = client
        .create_task_push_notification_config(hook(format!("http://127.0.0.1:{port}/hook"), ""))
        .await
        .unwrap()
        .into_inner();
    assert!(!created.id.is_empty(), "the server assigns an id");
    let got = client
        .get_task_push_notification_config(GetTaskPushNotificationConfigRequest {
            tenant: TENANT.into(),
            task_id: task.id.clone(),
            id: created.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got, created);
    let missing = client
        .get_task_push_notification_config(GetTaskPushNotificationConfigRequest {
            tenant: TENANT.into(),
            task_id: task.id.clone(),
            id: "no-such-config".into(),
        })
        .await
        .unwrap_err();
    support::assert_a2a_error(&missing, tonic::Code::NotFound, "TASK_NOT_FOUND");
    let info = missing.get_details_error_info().unwrap();
    assert_eq!(
        info.metadata.get("config_id").map(String::as_str),
        Some("no-such-config")
    );
    let listed = client
        .list_task_push_notification_configs(ListTaskPushNotificationConfigsRequest {
            tenant: TENANT.into(),
            task_id: task.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.configs, vec![created.clone()]);
    assert_eq!(listed.next_page_token, "");

    // The diff completes the task; the webhook gets its three events.
    let mut diff = user_message("diff --git a/x b/x");
    diff.task_id = task.id.clone();
    support::send_task(&mut client, support::request(TENANT, diff, false)).await;
    let got = next_notifications(&mut received, EXPECTED.len()).await;
    assert!(
        got.iter()
            .all(|r| r.token.as_deref() == Some("opaque-token"))
    );
    assert_eq!(described(&got), EXPECTED);

    for _ in 0..2 {
        client
            .delete_task_push_notification_config(DeleteTaskPushNotificationConfigRequest {
                tenant: TENANT.into(),
                task_id: task.id.clone(),
                id: created.id.clone(),
            })
            .await
            .expect("delete is idempotent");
    }
    server.stop().await;
}

/// A config sent with a new message is registered with the task before
/// its first event, so that event is notified too; the server's own tests
/// of a push-off server keep PUSH_NOTIFICATION_NOT_SUPPORTED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sends_config_sees_the_new_tasks_first_event() {
    use a2a_lifecycle::proto::*;

    let (port, mut received) = receiver(0).await;
    let server = PushServer::start().await;
    let mut client = server.client().await;
    let request = with_webhook(
        support::request(TENANT, user_message("review my change"), false),
        TaskPushNotificationConfig {
            url: format!("http://127.0.0.1:{port}/hook"),
            token: "with-the-send".into(),
            ..Default::default()
        },
    );
    let task = support::send_task(&mut client, request).await;
    let first = within("first notification", received.recv()).await.unwrap();
    assert_eq!(describe(&first.event), "TASK_STATE_INPUT_REQUIRED");
    assert_eq!(first.token.as_deref(), Some("with-the-send"));
    let listed = client
        .list_task_push_notification_configs(ListTaskPushNotificationConfigsRequest {
            tenant: TENANT.into(),
            task_id: task.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.configs.len(), 1);
    assert!(!listed.configs[0].id.is_empty());
    server.stop().await;
}

/// A redirect is a final answer: not followed (the address it names gets
/// nothing) and not retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_is_not_followed() {
    let (elsewhere, mut redirected) = receiver(0).await;
    let (port, mut received) = receiver_answering(
        usize::MAX,
        302,
        Some(format!("http://127.0.0.1:{elsewhere}/stolen")),
    )
    .await;
    let s = setup(loopback());
    let task = task_with_hook(&s.manager, port, "hook").await;
    finish(&s.manager, &task).await;
    drained(&s.store).await;
    // Each event was tried once, and each answer was final.
    let mut tried = 0;
    while received.try_recv().is_ok() {
        tried += 1;
    }
    assert_eq!(tried, EXPECTED.len(), "each event once, no retry");
    assert!(redirected.try_recv().is_err(), "the redirect was followed");
    s.stop.cancel();
}

/// The SSRF guard over gRPC: by default loopback (by address, by name, in
/// IPv6 and IPv4-mapped form), private, shared, link-local, multicast and
/// unspecified URLs are refused, naming the `url` field, and a public
/// address is taken; `--push-allow-cidr` opens its ranges and only them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_addresses_are_refused_unless_their_range_is_allowed() {
    use a2a_lifecycle::proto::TaskPushNotificationConfig;

    const LOOPBACK: [&str; 4] = [
        "http://127.0.0.1:9/hook",
        "http://localhost:9/hook",
        "http://[::ffff:127.0.0.1]:9/hook",
        "https://127.8.9.10/hook",
    ];
    const OTHERS: [&str; 10] = [
        "http://[::1]:9/hook",
        "http://10.1.2.3/hook",
        "http://172.16.0.1/hook",
        "http://192.168.1.1/hook",
        "http://100.64.0.1/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://[fe80::1]/hook",
        "http://[fc00::1]/hook",
        "http://224.0.0.1/hook",
        "http://0.0.0.0/hook",
    ];
    // A public address (TEST-NET-3 is reserved, so not one of those).
    const PUBLIC: &str = "https://8.8.8.8/hook";
    // A name that does not resolve is taken, and judged at each connection.
    const UNRESOLVED: &str = "https://no-such-host.invalid/hook";

    for (egress, allowed) in [
        (Egress::default(), vec![PUBLIC, UNRESOLVED]),
        (loopback(), [&LOOPBACK[..], &[PUBLIC, UNRESOLVED]].concat()),
    ] {
        let server = PushServer::start_with(egress).await;
        let mut client = server.client().await;
        let task = support::send_task(
            &mut client,
            support::request(TENANT, user_message("review my change"), false),
        )
        .await;
        for url in LOOPBACK.iter().chain(&OTHERS).chain([&PUBLIC, &UNRESOLVED]) {
            let created = client
                .create_task_push_notification_config(TaskPushNotificationConfig {
                    tenant: TENANT.into(),
                    task_id: task.id.clone(),
                    url: (*url).into(),
                    ..Default::default()
                })
                .await;
            match created {
                Ok(_) => assert!(allowed.contains(url), "{url} was taken"),
                Err(status) => {
                    assert!(!allowed.contains(url), "{url} was refused: {status:?}");
                    support::assert_bad_field(&status, "url");
                }
            }
        }
        server.stop().await;
    }
}

/// Durable delivery (the transactional outbox): the webhook is down while
/// the task completes and the server is SIGKILLed; after a restart on the
/// same SQLite file every event reaches it, in commit order. Neither
/// server's log, at debug level, shows the token or the credentials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_survive_sigkill_while_the_webhook_is_down() {
    use a2a_lifecycle::proto::a2a_service_client::A2aServiceClient;

    let db = support::certs::scratch_dir("push-sigkill").join("tasks.db");
    let store = format!("sqlite:{}", db.display());
    let args = ["--store", &store, "--push-allow-cidr", "127.0.0.0/8"];
    // A port nothing listens on, yet: connections to it are refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();

    const LOG: &str = "a2a_lifecycle=debug";
    let (mut first, url, first_log) = support::spawn_serve_logging(LOG, &args);
    let mut client = within("connect", A2aServiceClient::connect(url))
        .await
        .unwrap();
    let request = with_webhook(
        support::request(TENANT, user_message("review my change"), false),
        TaskPushNotificationConfig {
            url: format!("http://127.0.0.1:{port}/hook"),
            token: "durable-token".into(),
            authentication: Some(AuthenticationInfo {
                scheme: "Bearer".into(),
                credentials: "secret-credential".into(),
            }),
            ..Default::default()
        },
    );
    let task = support::send_task(&mut client, request).await;
    let mut diff = user_message("diff --git a/x b/x");
    diff.task_id = task.id.clone();
    let done = support::send_task(&mut client, support::request(TENANT, diff, false)).await;
    assert_eq!(support::state_of(&done), TaskState::Completed);
    // Tried, and refused by the closed port, before the kill; every line
    // is kept for the check below.
    let mut lines = Vec::new();
    loop {
        let line = first_log
            .recv_timeout(support::WAIT)
            .expect("a retry logged");
        let retried = line.contains("push notification to be retried");
        lines.push(line);
        if retried {
            break;
        }
    }
    first.kill().unwrap(); // SIGKILL
    first.wait().unwrap();

    let (port, mut received) = receiver_on(port).await;
    let (mut second, _, second_log) = support::spawn_serve_logging(LOG, &args);
    let got = next_notifications(&mut received, EXPECTED.len() + 1).await;
    for r in &got {
        assert_eq!(r.token.as_deref(), Some("durable-token"));
        assert_eq!(r.authorization.as_deref(), Some("Bearer secret-credential"));
    }
    let seen = described(&got);
    assert_eq!(seen[0], "TASK_STATE_INPUT_REQUIRED");
    assert_eq!(seen[1..], EXPECTED, "in commit order (port {port})");
    second.kill().unwrap();
    second.wait().unwrap();
    // Both are dead: their logs end.
    lines.extend(first_log.iter().chain(second_log.iter()));
    for secret in ["durable-token", "secret-credential"] {
        assert!(
            !lines.iter().any(|l| l.contains(secret)),
            "{secret} logged: {lines:#?}"
        );
    }
}

/// A webhook host that accepts connections and never answers; each
/// connection it takes is counted in `accepted`.
async fn dead_host(accepted: &Arc<AtomicUsize>) -> std::net::SocketAddr {
    let black_hole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead = black_hole.local_addr().unwrap();
    let counting = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = black_hole.accept().await {
            counting.fetch_add(1, Ordering::SeqCst);
            held.push(tcp);
        }
    });
    dead
}

/// With dead webhooks queued first, a healthy webhook (at `port`, the
/// receiver's) on a task made after them gets every event while their
/// POSTs hang: the dispatcher starts here.
async fn healthy_webhook_gets_every_event(
    s: &Setup,
    dispatcher: Dispatcher,
    port: u16,
    received: &mut mpsc::UnboundedReceiver<Received>,
) {
    let task = task_with_hook(&s.manager, port, "hook").await;
    finish(&s.manager, &task).await;
    tokio::spawn(dispatcher.run(s.stop.clone()));
    for expected in EXPECTED {
        let r = within("the healthy webhook", received.recv())
            .await
            .unwrap();
        assert_eq!(describe(&r.event), expected);
    }
}

/// One dead webhook never delays another's deliveries: more queues than
/// POSTs may be in flight name a host that accepts connections and never answers
/// (with a timeout longer than the test), and a healthy webhook's
/// notifications, queued after all of them, still arrive while those
/// POSTs hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_webhook_does_not_delay_another() {
    use a2a_lifecycle::push::deliver::{MAX_IN_FLIGHT, MAX_IN_FLIGHT_PER_HOST};
    let accepted = Arc::new(AtomicUsize::new(0));
    let dead = dead_host(&accepted).await;
    let (port, mut received) = receiver(0).await;
    let (s, dispatcher) = setup_stopped_with(Settings {
        egress: loopback(),
        timeout: std::time::Duration::from_secs(3600),
        ..Settings::default()
    });
    for _ in 0..MAX_IN_FLIGHT + 100 {
        let mut request = MessageRequest::from(user_message("review my change"));
        request.push_config = Some(TaskPushNotificationConfig {
            url: format!("http://{dead}/hook"),
            ..Default::default()
        });
        support::run_to_rest(&s.manager, TENANT, &Caller::ANONYMOUS, request).await;
    }
    healthy_webhook_gets_every_event(&s, dispatcher, port, &mut received).await;
    let hanging = accepted.load(Ordering::SeqCst);
    assert!(
        (1..=MAX_IN_FLIGHT_PER_HOST).contains(&hanging),
        "{hanging} connections to the dead host"
    );
    s.stop.cancel();
}

/// One principal's dead webhooks, under more host names than the slots
/// allow (each host its own share), never take every delivery slot: another
/// principal's notifications, queued after all of them, still arrive while
/// those POSTs hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_principals_dead_webhooks_do_not_starve_another() {
    use a2a_lifecycle::push::deliver::{
        MAX_IN_FLIGHT, MAX_IN_FLIGHT_PER_HOST, MAX_IN_FLIGHT_PER_PRINCIPAL,
    };
    // Enough dead hosts that their per-host slots cover every slot.
    let hosts = MAX_IN_FLIGHT / MAX_IN_FLIGHT_PER_HOST + 2;
    let accepted = Arc::new(AtomicUsize::new(0));
    let mut dead = Vec::new();
    for _ in 0..hosts {
        dead.push(dead_host(&accepted).await);
    }
    let (port, mut received) = receiver(0).await;
    let (s, dispatcher) = setup_stopped_with(Settings {
        egress: loopback(),
        timeout: std::time::Duration::from_secs(3600),
        ..Settings::default()
    });
    let hog = Caller {
        name: "hog".into(),
        own_tasks_only: true,
        ..Caller::ANONYMOUS
    };
    for i in 0..hosts * MAX_IN_FLIGHT_PER_HOST {
        let mut request = MessageRequest::from(user_message("review my change"));
        request.push_config = Some(TaskPushNotificationConfig {
            url: format!("http://{}/hook", dead[i % hosts]),
            ..Default::default()
        });
        support::run_to_rest(&s.manager, TENANT, &hog, request).await;
    }
    healthy_webhook_gets_every_event(&s, dispatcher, port, &mut received).await;
    let hanging = accepted.load(Ordering::SeqCst);
    assert!(
        (1..=MAX_IN_FLIGHT_PER_PRINCIPAL).contains(&hanging),
        "{hanging} connections to the hog's dead hosts"
    );
    s.stop.cancel();
}

/// More notifications than the backlog holds, for one principal and one
/// host: the dispatcher sheds the newest past the principal's share and
/// delivers all it keeps, at the receiver's pace. Shed queues parked for
/// their host or their principal once took the wakes of the slots that
/// came free, and delivery stalled at a few a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_full_backlog_keeps_is_delivered() {
    use a2a_lifecycle::push::deliver::{MAX_LOADED, MAX_LOADED_PER_PRINCIPAL};
    let metrics = Arc::new(a2a_lifecycle::metrics::Metrics::new());
    let value = |name: &str, labels: &[(&str, &str)]| {
        support::metric_value(&support::parse_metrics(&metrics.render()), name, labels)
    };
    let (port, mut received) = receiver(0).await;
    let (s, dispatcher) = setup_stopped_with(Settings {
        egress: loopback(),
        metrics: Some(metrics.push.clone()),
        ..Settings::default()
    });
    let manager = Arc::new(s.manager);
    let tasks = MAX_LOADED + MAX_LOADED / 4;
    let writers = 8;
    let mut creating = tokio::task::JoinSet::new();
    for w in 0..writers {
        let manager = manager.clone();
        creating.spawn(async move {
            for _ in (w..tasks).step_by(writers) {
                let mut request = MessageRequest::from(user_message("review my change"));
                request.push_config = Some(TaskPushNotificationConfig {
                    url: format!("http://127.0.0.1:{port}/hook"),
                    ..Default::default()
                });
                support::run_to_rest(&manager, TENANT, &Caller::ANONYMOUS, request).await;
            }
        });
    }
    within("the tasks made", async {
        while let Some(done) = creating.join_next().await {
            done.unwrap();
        }
    })
    .await;
    let queued = s.store.outbox().pending(0, usize::MAX).await.unwrap().len();
    assert!(
        queued > MAX_LOADED,
        "{queued} notifications fill the backlog"
    );
    tokio::spawn(dispatcher.run(s.stop.clone()));
    // What is kept goes at the receiver's pace: a minute is ample.
    let mut got = 0;
    tokio::time::timeout(std::time::Duration::from_secs(60), async {
        while !s.store.outbox().pending(0, 1).await.unwrap().is_empty() {
            while received.try_recv().is_ok() {
                got += 1;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| {
        let left = value("a2a_push_outbox_pending", &[]);
        panic!("delivery stalled: {got} delivered, {left} pending");
    });
    // An attempt counts its outcome just after it leaves the outbox.
    let outcome = |o: &str| value("a2a_push_deliveries_total", &[("outcome", o)]) as usize;
    within("every entry counted", async {
        while outcome("delivered") + outcome("shed") < queued {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await;
    let (delivered, shed) = (outcome("delivered"), outcome("shed"));
    while got < delivered {
        within("a delivered notification", received.recv())
            .await
            .unwrap();
        got += 1;
    }
    assert_eq!(delivered + shed, queued, "each delivered or shed, once");
    assert!(shed > 0, "the backlog was full");
    assert!(
        delivered >= MAX_LOADED_PER_PRINCIPAL,
        "{delivered} delivered"
    );
    assert!(received.try_recv().is_err(), "nothing more was POSTed");
    s.stop.cancel();
}
