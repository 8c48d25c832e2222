//! Shared test harness: a real server on an ephemeral port and the
//! generated tonic client.
#![allow(dead_code)]

pub mod certs;
pub mod jwt;
pub mod postgres;
pub mod previous_release;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};
use tonic_types::StatusExt;

use a2a_lifecycle::agent::AgentRouter;
use a2a_lifecycle::agent::demo::demo_router;
use a2a_lifecycle::discovery::DiscoveryConfig;
use a2a_lifecycle::proto::a2a_service_client::A2aServiceClient;
use a2a_lifecycle::proto::{
    Message, Part, Role, SendMessageConfiguration, SendMessageRequest, StreamResponse, Task,
    TaskState, part::Content, send_message_response, stream_response::Payload,
};
use a2a_lifecycle::runtime::{RuntimeConfig, TaskManager};
use a2a_lifecycle::server::{Security, Server};
use a2a_lifecycle::store::{MemoryStore, TaskStore};

pub type Client = A2aServiceClient<Channel>;

/// Generous upper bound for anything a test waits on; a hang fails instead
/// of blocking CI forever.
pub const WAIT: Duration = Duration::from_secs(20);

pub struct TestServer {
    pub addr: SocketAddr,
    pub manager: TaskManager,
    shutdown: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<()>>,
}

impl TestServer {
    pub async fn start() -> Self {
        Self::start_with(demo_router(), RuntimeConfig::default()).await
    }

    pub async fn start_with(agents: AgentRouter, config: RuntimeConfig) -> Self {
        let store: Arc<dyn TaskStore> = Arc::new(MemoryStore::new());
        Self::start_full(store, agents, config).await
    }

    pub async fn start_full(
        store: Arc<dyn TaskStore>,
        agents: AgentRouter,
        config: RuntimeConfig,
    ) -> Self {
        Self::start_discovery(store, agents, config, DiscoveryConfig::default()).await
    }

    pub async fn start_discovery(
        store: Arc<dyn TaskStore>,
        agents: AgentRouter,
        config: RuntimeConfig,
        discovery: DiscoveryConfig,
    ) -> Self {
        Self::start_secured(store, agents, config, discovery, None).await
    }

    /// The demo agents behind `--auth`.
    #[allow(dead_code)]
    pub async fn start_auth(auth: Arc<a2a_lifecycle::auth::Authenticator>) -> Self {
        Self::start_secured(
            Arc::new(MemoryStore::new()),
            demo_router(),
            RuntimeConfig::default(),
            DiscoveryConfig::default(),
            Some(auth),
        )
        .await
    }

    pub async fn start_secured(
        store: Arc<dyn TaskStore>,
        agents: AgentRouter,
        config: RuntimeConfig,
        discovery: DiscoveryConfig,
        auth: Option<Arc<a2a_lifecycle::auth::Authenticator>>,
    ) -> Self {
        let manager = TaskManager::new(store, agents, config);
        let security = Security {
            auth,
            ..Default::default()
        };
        Self::serve(Server::new(manager).discovery(discovery).security(security)).await
    }

    /// Serves `server` with every part given.
    pub async fn serve(server: Server) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let manager = server.manager().clone();
        let handle = tokio::spawn(async move {
            server
                .serve(listener, async {
                    let _ = rx.await;
                })
                .await
                .expect("server failed");
        });
        TestServer {
            addr,
            manager,
            shutdown: Some(tx),
            handle: Some(handle),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn client(&self) -> Client {
        A2aServiceClient::connect(self.url()).await.unwrap()
    }

    pub async fn channel(&self) -> Channel {
        Channel::from_shared(self.url())
            .unwrap()
            .connect()
            .await
            .unwrap()
    }

    /// Graceful shutdown; returns when the server future has finished.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(h) = self.handle.take() {
            tokio::time::timeout(WAIT, h)
                .await
                .expect("shutdown timed out")
                .unwrap();
        }
    }

    /// Fires the shutdown signal without waiting.
    pub fn begin_shutdown(&mut self) -> JoinHandle<()> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        self.handle.take().expect("already stopped")
    }
}

pub fn user_message(text: &str) -> Message {
    Message {
        message_id: uuid::Uuid::new_v4().to_string(),
        role: Role::User as i32,
        parts: vec![Part {
            content: Some(Content::Text(text.into())),
            ..Default::default()
        }],
        ..Default::default()
    }
}

pub fn request(tenant: &str, message: Message, return_immediately: bool) -> SendMessageRequest {
    SendMessageRequest {
        tenant: tenant.into(),
        message: Some(message),
        configuration: Some(SendMessageConfiguration {
            return_immediately,
            ..Default::default()
        }),
        metadata: None,
    }
}

/// SendMessage that must answer with a task.
pub async fn send_task(client: &mut Client, req: SendMessageRequest) -> Task {
    match client.send_message(req).await.unwrap().into_inner().payload {
        Some(send_message_response::Payload::Task(t)) => t,
        other => panic!("expected a task, got {other:?}"),
    }
}

pub async fn send_text(client: &mut Client, tenant: &str, text: &str) -> Task {
    send_task(client, request(tenant, user_message(text), false)).await
}

/// GetTask with the whole history.
pub async fn get_task(client: &mut Client, tenant: &str, id: &str) -> Result<Task, Status> {
    client
        .get_task(a2a_lifecycle::proto::GetTaskRequest {
            tenant: tenant.into(),
            id: id.into(),
            history_length: None,
        })
        .await
        .map(|r| r.into_inner())
}

pub fn state_of(task: &Task) -> TaskState {
    TaskState::try_from(task.status.as_ref().expect("status").state).unwrap()
}

pub fn status_text(task: &Task) -> String {
    task.status
        .as_ref()
        .and_then(|s| s.message.as_ref())
        .map(a2a_lifecycle::agent::message_text)
        .unwrap_or_default()
}

/// Sends `request` to `tenant` through the runtime as `caller` (blocking,
/// whole history) and returns the task it made or continued once that is
/// at rest.
pub async fn run_to_rest(
    manager: &TaskManager,
    tenant: &str,
    caller: &a2a_lifecycle::store::Caller,
    request: a2a_lifecycle::runtime::MessageRequest,
) -> Task {
    use a2a_lifecycle::lifecycle::HistoryLength;
    use a2a_lifecycle::runtime::SendOutcome;
    let sent = manager.send_message(tenant, caller, request, HistoryLength::All, false);
    let SendOutcome::Task(handle) = within("send", sent).await.unwrap() else {
        panic!("a task, not a direct reply")
    };
    within("the task at rest", manager.wait(*handle))
        .await
        .unwrap()
}

/// Polls a SendMessage of `message` once and drops it (a client that
/// went away after its request was first polled): whether that one poll
/// answered it.
pub async fn answered_in_one_poll(
    manager: &a2a_lifecycle::runtime::TaskManager,
    message: a2a_lifecycle::proto::Message,
) -> bool {
    let caller = a2a_lifecycle::store::Caller::ANONYMOUS;
    let request = manager.send_message(
        "",
        &caller,
        a2a_lifecycle::runtime::MessageRequest::from(message),
        a2a_lifecycle::lifecycle::HistoryLength::All,
        false,
    );
    let mut request = std::pin::pin!(request);
    std::future::poll_fn(|cx| std::task::Poll::Ready(request.as_mut().poll(cx).is_ready())).await
}

/// Awaits `f` for at most [`WAIT`]: a regression fails instead of hanging.
pub async fn within<F: std::future::Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(WAIT, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: timed out"))
}

/// The task once nothing more happens to it: a SubscribeToTask followed to
/// its end (none for a task already terminal, which is refused with
/// UNSUPPORTED_OPERATION), then GetTask. Returns the events seen, snapshot
/// first.
pub async fn settled(client: &mut Client, tenant: &str, id: &str) -> (Vec<StreamResponse>, Task) {
    let subscribed = within(
        "subscribe",
        client.subscribe_to_task(a2a_lifecycle::proto::SubscribeToTaskRequest {
            tenant: tenant.into(),
            id: id.into(),
        }),
    )
    .await;
    let events = match subscribed {
        Ok(stream) => within("to the end", collect(stream.into_inner()))
            .await
            .unwrap(),
        Err(e) => {
            assert_a2a_error(&e, Code::FailedPrecondition, "UNSUPPORTED_OPERATION");
            Vec::new()
        }
    };
    let task = within("get", get_task(client, tenant, id)).await.unwrap();
    (events, task)
}

/// Reads a stream to its end (with a timeout), returning every event.
pub async fn collect(mut stream: Streaming<StreamResponse>) -> Result<Vec<StreamResponse>, Status> {
    let mut out = Vec::new();
    loop {
        match tokio::time::timeout(WAIT, stream.message())
            .await
            .expect("stream stalled")
        {
            Ok(Some(ev)) => out.push(ev),
            Ok(None) => return Ok(out),
            Err(status) => return Err(status),
        }
    }
}

/// A compact description of an event, for comparing sequences.
pub fn describe(ev: &StreamResponse) -> String {
    match ev.payload.as_ref().expect("payload") {
        Payload::Task(t) => format!("task:{}", state_of(t).as_str_name()),
        Payload::Message(m) => format!("message:{}", a2a_lifecycle::agent::message_text(m)),
        Payload::StatusUpdate(u) => format!(
            "status:{}",
            TaskState::try_from(u.status.as_ref().unwrap().state)
                .unwrap()
                .as_str_name()
        ),
        Payload::ArtifactUpdate(a) => format!(
            "artifact:{}{}{}",
            a.artifact.as_ref().unwrap().artifact_id,
            if a.append { "+append" } else { "" },
            if a.last_chunk { "+last" } else { "" }
        ),
    }
}

pub fn describe_all(events: &[StreamResponse]) -> Vec<String> {
    events.iter().map(describe).collect()
}

/// Asserts an A2A error: gRPC code plus ErrorInfo reason and domain.
pub fn assert_a2a_error(status: &Status, code: Code, reason: &str) {
    assert_eq!(status.code(), code, "{status:?}");
    let info = status
        .get_details_error_info()
        .unwrap_or_else(|| panic!("no ErrorInfo in {status:?}"));
    assert_eq!(info.reason, reason, "{status:?}");
    assert_eq!(info.domain, "a2a-protocol.org");
}

/// Asserts INVALID_ARGUMENT with a BadRequest naming `field`.
pub fn assert_bad_field(status: &Status, field: &str) {
    assert_a2a_error(status, Code::InvalidArgument, "INVALID_PARAMS");
    let bad = status.get_details_bad_request().expect("BadRequest detail");
    assert!(
        bad.field_violations.iter().any(|v| v.field == field),
        "expected a violation on {field}, got {:?}",
        bad.field_violations
    );
}

/// The `a2a-lifecycle` binary built for these tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_a2a-lifecycle");

/// Runs `a2a-lifecycle serve --listen 127.0.0.1:0 ARGS...` and reads the
/// bound address from its log (no port races); returns the child and the
/// server URL.
/// A child process killed (SIGKILL) and reaped when dropped, so that a
/// test that panics leaves no server behind (holding, say, PostgreSQL
/// connections the next tests need).
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn spawn_serve(args: &[&str]) -> (Child, String) {
    let (child, url, lines) = spawn_serve_logged(args);
    // Keep draining stderr so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (child, url)
}

/// [`spawn_serve`], with the server's log lines after the one that says
/// where it listens.
pub fn spawn_serve_logged(args: &[&str]) -> (Child, String, std::sync::mpsc::Receiver<String>) {
    spawn_serve_logging("info", args)
}

/// [`spawn_serve_logged`] with `RUST_LOG` set to `filter`.
pub fn spawn_serve_logging(
    filter: &str,
    args: &[&str],
) -> (Child, String, std::sync::mpsc::Receiver<String>) {
    spawn_serve_env(&[("RUST_LOG", filter)], args)
}

/// [`spawn_serve_logged`] with environment variables set (`RUST_LOG`
/// is `info` unless given).
pub fn spawn_serve_env(
    env: &[(&str, &str)],
    args: &[&str],
) -> (Child, String, std::sync::mpsc::Receiver<String>) {
    spawn_serve_on("127.0.0.1:0", env, args)
}

/// [`spawn_serve_env`] listening on `listen` (an address a server
/// restarted must keep, say).
pub fn spawn_serve_on(
    listen: &str,
    env: &[(&str, &str)],
    args: &[&str],
) -> (Child, String, std::sync::mpsc::Receiver<String>) {
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", listen])
        .args(args)
        .env("RUST_LOG", "info")
        .envs(env.iter().copied())
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn serve");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines
            .next()
            .expect("serve exited before listening")
            .unwrap();
        if let Some(rest) = line.split("addr=").nth(1) {
            break rest.split_whitespace().next().unwrap().to_string();
        }
        // --log-format json
        if let Some(rest) = line.split("\"addr\":\"").nth(1) {
            break rest.split('"').next().unwrap().to_string();
        }
    };
    let (tx, rx) = std::sync::mpsc::channel();
    // Reads stderr to the end, so the server never blocks on a full pipe.
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    (child, format!("http://{addr}"), rx)
}

/// Lines of `pipe`, read on a thread of their own to the end.
fn lines_of(pipe: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    rx
}

/// `push listen --port 0` with `args` (a notification token, say): the
/// receiver's process, its URL, and what it prints (one JSON line per
/// notification). Its log is read to the end in the background.
pub fn spawn_push_listen(args: &[&str]) -> (Child, String, std::sync::mpsc::Receiver<String>) {
    let mut listen = Command::new(BIN)
        .args(["push", "listen", "--port", "0"])
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn push listen");
    let log = lines_of(listen.stderr.take().unwrap());
    let printed = lines_of(listen.stdout.take().unwrap());
    let url = wait_for_line(&log, "receiving push notifications")
        .split(" at ")
        .nth(1)
        .expect("the receiver's URL")
        .trim()
        .to_owned();
    std::thread::spawn(move || for _ in log {});
    (listen, url, printed)
}

/// Waits (at most [`WAIT`]) for a log line containing `text`.
pub fn wait_for_line(lines: &std::sync::mpsc::Receiver<String>, text: &str) -> String {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.contains(text) => return line,
            Ok(_) => {}
            Err(e) => panic!("no log line with {text:?}: {e}"),
        }
    }
}

/// An HTTP/1.1 response as a test reads it.
pub struct HttpResponse {
    pub status: u16,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A plain HTTP/1.1 GET over a real socket (what `curl` does), with extra
/// request headers.
pub async fn http_get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> HttpResponse {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(WAIT, stream.read_to_end(&mut raw))
        .await
        .expect("HTTP response timed out")
        .unwrap();
    let text = String::from_utf8(raw).expect("UTF-8 response");
    let (head, body) = text.split_once("\r\n\r\n").expect("HTTP head");
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .expect("status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect::<Vec<_>>();
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_owned()
    };
    HttpResponse {
        status,
        headers,
        body,
    }
}

fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n").expect("chunk size");
        let size = usize::from_str_radix(size.trim(), 16).expect("hex chunk size");
        if size == 0 {
            return out;
        }
        out.push_str(&after[..size]);
        rest = &after[size + 2..];
    }
}

/// Sends "go" without blocking, waits until the agent says (through
/// `working`) that it runs, subscribes to the task and reads the snapshot:
/// the task and its open stream, for tests that then break the store.
#[allow(dead_code)]
pub async fn subscribed_while_working(
    client: &mut Client,
    working: &tokio::sync::Notify,
) -> (Task, Streaming<StreamResponse>) {
    let task = within(
        "send",
        send_task(client, request("", user_message("go"), true)),
    )
    .await;
    within("working", working.notified()).await;
    let (_, stream) = subscribed(client, "", &task.id).await;
    (task, stream)
}

/// A subscription to task `id`, with the snapshot it opens with.
pub async fn subscribed(
    client: &mut Client,
    tenant: &str,
    id: &str,
) -> (StreamResponse, Streaming<StreamResponse>) {
    let mut stream = within(
        "subscribe",
        client.subscribe_to_task(a2a_lifecycle::proto::SubscribeToTaskRequest {
            tenant: tenant.into(),
            id: id.into(),
        }),
    )
    .await
    .unwrap()
    .into_inner();
    let snapshot = within("snapshot", stream.message()).await.unwrap().unwrap();
    (snapshot, stream)
}

/// Reads `stream` to its error (a store's failure ends a task's streams
/// with it); a clean end fails the test.
#[allow(dead_code)]
pub async fn stream_error(stream: &mut Streaming<StreamResponse>) -> Status {
    loop {
        match within("stream", stream.message()).await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the stream ended without the store's error"),
            Err(status) => return status,
        }
    }
}

/// Metrics text (OpenMetrics or Prometheus), parsed.
pub fn parse_metrics(text: &str) -> prometheus_parse::Scrape {
    let lines = text.lines().map(|l| Ok(l.to_owned()));
    prometheus_parse::Scrape::parse(lines).expect("the metrics parse")
}

/// The value of the sample `name` whose labels include `labels`, summed
/// over the rest; for a histogram, its count. 0 when the metric is
/// registered but has no such series yet; a metric the server does not
/// register fails the test, so a renamed metric cannot pass a check of
/// `== 0`.
pub fn metric_value(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    use prometheus_parse::Value;
    let family = ["_total", "_count", "_sum", "_bucket", "_created"]
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix))
        .unwrap_or(name);
    // A family without series is not rendered: registered is the test.
    let registered = a2a_lifecycle::metrics::Metrics::new();
    assert!(
        registered.names().iter().any(|n| n == name || n == family)
            || scrape.samples.iter().any(|s| s.metric == name),
        "the server has no metric {name}: renamed, or never registered?"
    );
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match &s.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
            Value::Histogram(buckets) => buckets.last().map_or(0.0, |b| b.count),
            Value::Summary(_) => panic!("{name} is a summary"),
        })
        .sum()
}

pub mod web;

/// An agent that completes every task at once, under the given card
/// (whose rules the server enforces: extensions, streaming, modes).
pub fn agent_with_card(card: a2a_lifecycle::proto::AgentCard) -> AgentRouter {
    use a2a_lifecycle::agent::{AgentError, AgentExecutor, EventSink, RequestContext};
    struct Carded(a2a_lifecycle::proto::AgentCard);
    #[async_trait::async_trait]
    impl AgentExecutor for Carded {
        async fn execute(&self, _ctx: RequestContext, sink: EventSink) -> Result<(), AgentError> {
            sink.status(TaskState::Completed, None).await?;
            Ok(())
        }
        fn card(&self) -> a2a_lifecycle::proto::AgentCard {
            self.0.clone()
        }
    }
    AgentRouter::new().with("", Arc::new(Carded(card)))
}

/// The demo agents with push notifications on, webhooks to loopback
/// allowed.
pub async fn start_with_push() -> TestServer {
    let manager = TaskManager::new(
        Arc::new(MemoryStore::new()),
        demo_router(),
        RuntimeConfig::default(),
    );
    let push = a2a_lifecycle::push::deliver::Settings {
        egress: a2a_lifecycle::push::egress::Egress::new(vec!["127.0.0.0/8".parse().unwrap()]),
        ..Default::default()
    };
    TestServer::serve(Server::new(manager).push(push)).await
}

/// A served card's 1.0 part, read strictly (an unknown field fails): the
/// card without the 0.3 fields it carries beside the 1.0 ones for 0.3
/// clients (`src/discovery/v0_3.rs`), each of which must be one of them.
#[allow(dead_code)]
pub fn card_1_0(body: &str) -> a2a_lifecycle::proto::AgentCard {
    let mut value: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"));
    let fields = value.as_object_mut().expect("a card object");
    for key in [
        "url",
        "preferredTransport",
        "additionalInterfaces",
        "protocolVersion",
        "security",
        "supportsAuthenticatedExtendedCard",
    ] {
        fields.remove(key);
    }
    if let Some(serde_json::Value::Object(schemes)) = fields.get_mut("securitySchemes") {
        for scheme in schemes.values_mut() {
            let entry = scheme.as_object_mut().expect("a scheme object");
            // The 1.0 wrapper is the one key whose value is an object
            // named `...SecurityScheme`; the rest is its 0.3 flat copy.
            entry.retain(|k, _| k.ends_with("SecurityScheme"));
        }
    }
    a2a_lifecycle::json::from_str(&value.to_string())
        .unwrap_or_else(|e| panic!("not a 1.0 AgentCard beside the 0.3 fields ({e}): {body}"))
}

/// One POST a [`webhook`] took.
#[derive(Debug)]
pub struct Posted {
    pub headers: http::HeaderMap,
    pub body: serde_json::Value,
}

/// An HTTP/1.1 webhook on loopback that answers 200 to every POST: its
/// URL, and each POST it took, in order. A body that is not JSON fails
/// the test.
pub async fn webhook() -> (String, tokio::sync::mpsc::UnboundedReceiver<Posted>) {
    use http_body_util::BodyExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let tx = tx.clone();
            let service = hyper::service::service_fn(
                move |request: hyper::Request<hyper::body::Incoming>| {
                    let tx = tx.clone();
                    async move {
                        let (parts, body) = request.into_parts();
                        let bytes = body.collect().await?.to_bytes();
                        let body = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                            panic!("a webhook body that is not JSON ({e}): {bytes:?}")
                        });
                        // The test may have stopped reading.
                        tx.send(Posted {
                            headers: parts.headers,
                            body,
                        })
                        .ok();
                        Ok::<_, hyper::Error>(hyper::Response::new(http_body_util::Empty::<
                            bytes::Bytes,
                        >::new(
                        )))
                    }
                },
            );
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), service),
            );
        }
    });
    (url, rx)
}

/// What a [`webhook`] takes up to and including the first POST `last`
/// accepts.
pub async fn posted_until(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<Posted>,
    last: impl Fn(&serde_json::Value) -> bool,
) -> Vec<Posted> {
    let mut posts = Vec::new();
    loop {
        let post = within("a webhook POST", rx.recv())
            .await
            .expect("the webhook is up");
        let done = last(&post.body);
        posts.push(post);
        if done {
            return posts;
        }
    }
}

/// How many `fanout` updates a snapshot holds: its chunks are 2, 4, ..
/// and its agent messages (history, then status) 1, 3, .., each in order
/// and none missing, together 1..=n. Anything else fails the test.
pub fn fanout_updates_in(snapshot: &Task) -> u32 {
    use a2a_lifecycle::proto::{Role, part::Content};
    let chunks: Vec<u32> = snapshot
        .artifacts
        .iter()
        .flat_map(|a| &a.parts)
        .map(|p| match &p.content {
            Some(Content::Text(t)) => t.parse().expect("a numbered chunk"),
            other => panic!("a chunk that is not text: {other:?}"),
        })
        .collect();
    let mut statuses: Vec<u32> = snapshot
        .history
        .iter()
        .filter(|m| m.role == Role::Agent as i32)
        .map(|m| a2a_lifecycle::agent::message_text(m).parse().unwrap())
        .collect();
    let status = status_text(snapshot);
    if !status.is_empty() {
        statuses.push(status.parse().expect("a numbered status"));
    }
    let expected_chunks: Vec<u32> = (1..=chunks.len() as u32).map(|i| 2 * i).collect();
    let expected_statuses: Vec<u32> = (0..statuses.len() as u32).map(|i| 2 * i + 1).collect();
    assert_eq!(chunks, expected_chunks, "the snapshot's chunks");
    assert_eq!(
        statuses, expected_statuses,
        "the snapshot's status messages"
    );
    let n = chunks.len() + statuses.len();
    assert!(
        chunks.len() == statuses.len() || chunks.len() + 1 == statuses.len(),
        "{} chunks and {} status messages are not one run of updates",
        chunks.len(),
        statuses.len()
    );
    n as u32
}

/// GetTask activating the transition-log extension (spec §4.6) over gRPC:
/// the task, and its log as `state cause` strings, oldest first (a
/// missing log or an answer that does not name the extension fails).
#[allow(dead_code)]
pub async fn transitions(client: &mut Client, tenant: &str, id: &str) -> (Task, Vec<String>) {
    use a2a_lifecycle::lifecycle::TRANSITIONS_EXTENSION;
    let mut request = tonic::Request::new(a2a_lifecycle::proto::GetTaskRequest {
        tenant: tenant.into(),
        id: id.into(),
        history_length: None,
    });
    request.metadata_mut().insert(
        "a2a-extensions",
        tonic::metadata::MetadataValue::from_static(TRANSITIONS_EXTENSION),
    );
    let response = within("get with transitions", client.get_task(request))
        .await
        .unwrap();
    assert_eq!(
        response
            .metadata()
            .get("a2a-extensions")
            .and_then(|v| v.to_str().ok()),
        Some(TRANSITIONS_EXTENSION),
        "the answer names the extension it activated"
    );
    let task = response.into_inner();
    let log = transition_log(&serde_json::to_value(&task).unwrap());
    (task, log)
}

/// The transition log in a task's ProtoJSON, as `state cause` strings
/// (state without its `TASK_STATE_` prefix); fails when there is none.
#[allow(dead_code)]
pub fn transition_log(task: &serde_json::Value) -> Vec<String> {
    let log = &task["metadata"][a2a_lifecycle::lifecycle::TRANSITIONS_EXTENSION]["transitions"];
    log.as_array()
        .unwrap_or_else(|| panic!("no transition log in {task}"))
        .iter()
        .map(|entry| {
            let state = entry["state"].as_str().expect("a state");
            format!(
                "{} {}",
                state.trim_start_matches("TASK_STATE_"),
                entry["cause"].as_str().expect("a cause")
            )
        })
        .collect()
}
