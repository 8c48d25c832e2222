//! Push delivery (issue "push notifications") with a real HTTP receiver on
//! loopback: every committed event reaches each config in order with its
//! headers; failures are retried without losing or reordering events; an
//! address the policy refuses is never reached; a deleted config gets
//! nothing more.

mod support;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use a2a_lifecycle::agent::demo::demo_router;
use a2a_lifecycle::lifecycle::HistoryLength;
use a2a_lifecycle::proto::{
    AuthenticationInfo, StreamResponse, TaskPushNotificationConfig, TaskState,
    stream_response::Payload,
};
use a2a_lifecycle::push::deliver::{Dispatcher, Settings};
use a2a_lifecycle::push::egress::Egress;
use a2a_lifecycle::runtime::{MessageRequest, RuntimeConfig, SendOutcome, TaskManager};
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
    event: String,
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
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::unbounded_channel();
    let failures = Arc::new(AtomicUsize::new(fail));
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let (tx, failures, location) = (tx.clone(), failures.clone(), location.clone());
            let service = hyper::service::service_fn(
                move |request: hyper::Request<hyper::body::Incoming>| {
                    let (tx, failures, location) = (tx.clone(), failures.clone(), location.clone());
                    answer(request, tx, failures, status, location)
                },
            );
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
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
        event: String::new(),
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
    let store = Arc::new(MemoryStore::new());
    let manager = TaskManager::new(
        store.clone() as Arc<dyn TaskStore>,
        demo_router(),
        RuntimeConfig::default(),
    );
    let stop = CancellationToken::new();
    let dispatcher = Dispatcher::new(
        store.clone() as Arc<dyn TaskStore>,
        Settings {
            egress,
            ..Settings::default()
        },
        manager.outbox_signal(),
    );
    tokio::spawn(dispatcher.run(stop.clone()));
    Setup {
        manager,
        store,
        stop,
    }
}

fn loopback() -> Egress {
    Egress::new(vec!["127.0.0.0/8".parse().unwrap()])
}

/// A code-reviewer task waiting for the diff, with a webhook on `port`.
async fn task_with_hook(manager: &TaskManager, port: u16, id: &str) -> String {
    let outcome = manager
        .send_message(
            TENANT,
            &Caller::ANONYMOUS,
            MessageRequest::from(user_message("review my change")),
            HistoryLength::All,
            false,
        )
        .await
        .unwrap();
    let SendOutcome::Task(handle) = outcome else {
        panic!("a task")
    };
    let task = within("task", manager.wait(*handle)).await.unwrap();
    manager
        .set_push_config(
            TENANT,
            &Caller::ANONYMOUS,
            TaskPushNotificationConfig {
                tenant: TENANT.into(),
                task_id: task.id.clone(),
                id: id.into(),
                url: format!("http://127.0.0.1:{port}/hooks/a2a?x=1"),
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
    let outcome = manager
        .send_message(
            TENANT,
            &Caller::ANONYMOUS,
            MessageRequest::from(diff),
            HistoryLength::All,
            false,
        )
        .await
        .unwrap();
    let SendOutcome::Task(handle) = outcome else {
        panic!("a task")
    };
    let done = within("review", manager.wait(*handle)).await.unwrap();
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
    let mut seen = Vec::new();
    for _ in EXPECTED {
        let r = within("a notification", received.recv()).await.unwrap();
        assert_eq!(r.authorization.as_deref(), Some("Bearer secret-credential"));
        assert_eq!(r.token.as_deref(), Some("opaque-token"));
        assert_eq!(r.content_type.as_deref(), Some("application/a2a+json"));
        seen.push(describe(&r.event));
    }
    assert_eq!(seen, EXPECTED);
    // Done: the outbox empties.
    within("outbox drained", async {
        while !s.store.outbox(10).await.unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    s.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_that_fails_twice_still_gets_every_event_in_order() {
    let (port, mut received) = receiver(2).await;
    let s = setup(loopback());
    let task = task_with_hook(&s.manager, port, "hook").await;
    finish(&s.manager, &task).await;
    let mut seen = Vec::new();
    for _ in EXPECTED {
        let r = within("a notification", received.recv()).await.unwrap();
        seen.push(describe(&r.event));
    }
    assert_eq!(seen, EXPECTED, "retried, in order");
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
    within("outbox drained", async {
        while !s.store.outbox(10).await.unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(
        received.try_recv().is_err(),
        "a refused address was reached"
    );
    s.stop.cancel();
}

/// A server with push on, webhooks allowed on loopback, the demo agents.
struct PushServer {
    addr: std::net::SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    served: tokio::task::JoinHandle<Result<(), Box<dyn std::error::Error + Send + Sync>>>,
}

impl PushServer {
    async fn start() -> Self {
        use a2a_lifecycle::server::{ServerParts, serve};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let parts = ServerParts {
            agents: demo_router(),
            push: Some(Settings {
                egress: loopback(),
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
    let mut seen = Vec::new();
    for _ in EXPECTED {
        let r = within("a notification", received.recv()).await.unwrap();
        assert_eq!(r.token.as_deref(), Some("opaque-token"));
        seen.push(describe(&r.event));
    }
    assert_eq!(seen, EXPECTED);

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
    let mut request = support::request(TENANT, user_message("review my change"), false);
    request
        .configuration
        .get_or_insert_with(Default::default)
        .task_push_notification_config = Some(TaskPushNotificationConfig {
        url: format!("http://127.0.0.1:{port}/hook"),
        token: "with-the-send".into(),
        ..Default::default()
    });
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
    within("outbox drained", async {
        while !s.store.outbox(10).await.unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    // Each event was tried once, and each answer was final.
    let mut tried = 0;
    while received.try_recv().is_ok() {
        tried += 1;
    }
    assert_eq!(tried, EXPECTED.len(), "each event once, no retry");
    assert!(redirected.try_recv().is_err(), "the redirect was followed");
    s.stop.cancel();
}
