//! `a2a-bench`: a load generator that speaks only the A2A gRPC API, so it
//! can be pointed at any A2A server, and the suite that measures this
//! server against a bare tonic server of the same proto (`a2a-bare`).
//!
//! `run` drives one workload against one server: a closed loop of
//! `--concurrency` requests in flight over `--connections` HTTP/2
//! connections, for `--duration` after `--warmup`. It reports throughput,
//! p50/p99 latency (an HDR histogram) and, given `--server-pid`, the
//! server's CPU time per request and peak RSS from `/proc/PID`, as a table
//! and as one JSON line.
//!
//! `suite` starts both servers itself (pinned to other cores than the
//! generator with `taskset` where the machine has them), runs every
//! workload against each alternately, round after round (a ratio measured
//! in one run holds on a noisy machine; an absolute figure does not), and
//! prints each figure as a ratio to the bare server. It also measures what
//! authentication costs (`--auth` with an API key, and with an RS256 JWT
//! from the test key set) against the same server without it, and what
//! the JSON bindings cost against gRPC (`--binding jsonrpc|http-json`:
//! the send, get and stream workloads over HTTP/1.1, and fan-out to SSE
//! subscribers).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand, ValueEnum};
use hdrhistogram::Histogram;
use tokio::sync::Mutex;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use a2a_lifecycle::bindings::Binding;
use a2a_lifecycle::proto::a2a_service_client::A2aServiceClient;
use a2a_lifecycle::proto::{
    GetTaskRequest, Message, Part, Role, SendMessageConfiguration, SendMessageRequest,
    SubscribeToTaskRequest, TaskPushNotificationConfig, TaskState, part::Content,
    send_message_response, stream_response::Payload,
};

type Client = A2aServiceClient<InterceptedService<Channel, Bearer>>;

/// Sends `authorization: Bearer <token>` on every call when set.
#[derive(Clone)]
struct Bearer(Option<tonic::metadata::AsciiMetadataValue>);

impl tonic::service::Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}
type AnyError = Box<dyn std::error::Error + Send + Sync>;

#[path = "a2a-bench/long.rs"]
mod long;

#[path = "a2a-bench/console.rs"]
mod console;

#[path = "a2a-bench/instructions.rs"]
mod instructions;

#[path = "a2a-bench/soak.rs"]
mod soak;

/// Tasks created before a GetTask run, read round robin.
const GET_TASKS: usize = 1000;
/// How long fan-out subscribers get to attach before the updates start.
const FANOUT_WAIT_MS: u64 = 200;
/// The suite's fan-out subscriber counts.
const FANOUT_SUBSCRIBERS: [usize; 4] = [1, 64, 256, 2048];
/// Subscribers per connection in the fan-out rows: the server's default
/// `--max-streams-per-connection`.
const STREAMS_PER_CONNECTION: usize = 256;

/// A server takes [`STREAMS_PER_CONNECTION`] streams per connection (h2
/// refuses the rest, which a fan-out run would count as lost): a fan-out
/// run spreads its subscribers over as many connections as they need, as
/// many clients would.
fn spread_subscribers(args: &mut RunArgs) {
    if args.workload == Workload::Fanout {
        args.load.connections = args
            .load
            .connections
            .max(args.subscribers.div_ceil(STREAMS_PER_CONNECTION));
    }
}
/// Fan-out rounds at least, however short `--duration` is: one round of
/// K=200 is over in about a millisecond, too short to time alone.
const FANOUT_MIN_ROUNDS: u32 = 5;
/// Stored tasks of the create-many workload.
const CREATE_MANY_TASKS: u64 = 100_000;

#[derive(Parser)]
#[command(about = "A2A gRPC load generator and benchmark suite")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// One workload against one A2A server.
    Run(RunArgs),
    /// This server against the bare tonic server, every workload, as ratios.
    Suite(SuiteArgs),
    /// Long-lived tasks: bytes written and server CPU per write of a task
    /// as it grows, per store.
    Long(LongArgs),
    /// The console's task list: its first page with 10,000 tasks stored
    /// (memory and SQLite).
    Console(ConsoleArgs),
    /// Instructions per request of this server and the echo server,
    /// counted by callgrind over a fixed number of requests.
    Instructions(instructions::InstructionsArgs),
    /// A mixed soak of the demo agents' flows (sends, streams, cancels,
    /// follow-ups), the server's memory sampled each second.
    Soak(soak::SoakArgs),
}

#[derive(Args)]
struct ConsoleArgs {
    /// Skip the SQLite store.
    #[arg(long)]
    no_sqlite: bool,
}

#[derive(Args)]
struct LongArgs {
    /// Task lengths (updates per task), smallest first.
    #[arg(long, value_delimiter = ',', default_values_t = [10u32, 1_000, 10_000])]
    updates: Vec<u32>,
    /// Time between a task's updates, long enough for each to be a commit
    /// of its own.
    #[arg(long, default_value = "2ms", value_parser = humantime::parse_duration)]
    interval: Duration,
    /// Skip the SQLite store.
    #[arg(long)]
    no_sqlite: bool,
    /// Skip the PostgreSQL store (and its follower row).
    #[arg(long)]
    no_postgres: bool,
    /// Only these rows (comma-separated); all of them by default.
    #[arg(long, value_delimiter = ',')]
    only: Vec<long::Store>,
    /// The PostgreSQL server (a schema of its own, dropped after).
    #[arg(
        long,
        env = "A2A_BENCH_POSTGRES",
        default_value = "postgres://postgres@127.0.0.1:5432/test"
    )]
    postgres: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Workload {
    /// Non-blocking SendMessage (task creation).
    Send,
    /// Blocking SendMessage; the agent completes at once.
    SendBlocking,
    /// GetTask on existing ids.
    Get,
    /// SendStreamingMessage read to its end.
    Stream,
    /// N SubscribeToTask subscribers of one task while it emits K updates.
    Fanout,
    /// Blocking sends of many small tasks: server RSS growth per task.
    CreateMany,
}

#[derive(Args, Clone)]
struct Load {
    /// Requests in flight.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// HTTP/2 connections the requests share.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Measured time per run.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Unmeasured time before it.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// The tenant to address (the bench agent, or another server's agent).
    #[arg(long, default_value = "")]
    tenant: String,
    /// A bearer credential (API key or JWT) for a server run with --auth.
    #[arg(long, env = "A2A_TOKEN")]
    token: Option<String>,
    /// Register this webhook with each message of the send workloads
    /// (SendMessageConfiguration.task_push_notification_config).
    #[arg(long)]
    webhook: Option<String>,
    /// The binding the send, get and stream workloads (and fan-out's
    /// subscribers) use: grpc, jsonrpc or http-json.
    #[arg(long, default_value = "grpc", value_parser = parse_binding)]
    binding: Binding,
    /// The JSON bindings over HTTP/1.1 (a connection per request in
    /// flight) instead of HTTP/2 over `--connections` connections.
    #[arg(long)]
    http1: bool,
    /// The send and stream workloads of a JSON binding as protocol 0.3
    /// calls (JSON-RPC `message/send`, `message/stream`; HTTP+JSON
    /// `/v1/message:send`, `/v1/message:stream`), translated by the
    /// server to the same 1.0 operations.
    #[arg(long = "v0-3")]
    v0_3: bool,
    /// Exactly this many measured requests instead of `--duration`: the
    /// warm-up runs for `--warmup`, every request of it is answered, and
    /// only then do the counted ones start (`a2a-bench instructions`
    /// counts the server's instructions over just those).
    #[arg(long)]
    requests: Option<u64>,
    /// Called with no request in flight between the warm-up and the
    /// counted requests (`--requests`).
    #[arg(skip)]
    mark: Option<Mark>,
}

/// What a counted run does between its warm-up and its counted requests.
type Mark = Arc<dyn Fn() -> Result<(), AnyError> + Send + Sync>;

fn parse_binding(name: &str) -> Result<Binding, String> {
    Binding::parse(name).ok_or_else(|| format!("{name:?}: grpc, jsonrpc or http-json"))
}

#[derive(Args)]
struct RunArgs {
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    target: String,
    /// Fan-out: send the task to this server, another replica of the
    /// target on one PostgreSQL database, while the subscribers are on
    /// the target (cross-replica fan-out).
    #[arg(long)]
    send_target: Option<String>,
    #[arg(long, value_enum)]
    workload: Workload,
    #[command(flatten)]
    load: Load,
    /// The server's process id: CPU time per request and peak RSS.
    #[arg(long)]
    server_pid: Option<u32>,
    /// Fan-out subscribers (N), spread over at least N / 256 connections
    /// (a server takes 256 streams per connection by default; h2 refuses
    /// the rest).
    #[arg(long, default_value_t = 64)]
    subscribers: usize,
    /// Fan-out updates (K).
    #[arg(long, default_value_t = 200)]
    updates: u32,
    /// Create-many: tasks to create.
    #[arg(long, default_value_t = CREATE_MANY_TASKS)]
    tasks: u64,
}

#[derive(Args)]
struct SuiteArgs {
    #[command(flatten)]
    load: Load,
    /// Rounds; each runs every workload on both servers.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Skip the SQLite-against-memory comparison.
    #[arg(long)]
    no_sqlite: bool,
    /// Skip the PostgreSQL rows (non-blocking sends against the memory
    /// store; fan-out with the subscribers on another replica).
    #[arg(long)]
    no_postgres: bool,
    /// The PostgreSQL server of those rows; each suite uses a schema of its
    /// own there, dropped after.
    #[arg(
        long,
        env = "A2A_BENCH_POSTGRES",
        default_value = "postgres://postgres@127.0.0.1:5432/test"
    )]
    postgres: String,
    /// Skip the cost of authentication (the same server with and without
    /// `--auth`).
    #[arg(long)]
    no_auth: bool,
    /// Skip the cost of push notifications (sends with and without a
    /// webhook, and delivery to a local receiver).
    #[arg(long)]
    no_push: bool,
    /// Skip the cost of metrics and spans (the same server with each off).
    #[arg(long)]
    no_operability: bool,
    /// Skip the JSON bindings' rows (JSON-RPC and HTTP+JSON against
    /// gRPC on the same server).
    #[arg(long)]
    no_json: bool,
    /// Skip the long-lived tasks' rows (`a2a-bench long`, 10, 1,000 and
    /// 10,000 updates per task on each store).
    #[arg(long)]
    no_long: bool,
    /// Skip the console's rows (the task list's first page with 10,000
    /// tasks stored, memory and SQLite).
    #[arg(long)]
    no_console: bool,
}

impl RunArgs {
    /// A run of `workload` against a server the suite started (its CPU
    /// and memory measured); fan-out and create-many sizes left to the
    /// caller.
    fn against(server: &Server, workload: Workload, load: Load) -> Self {
        RunArgs {
            target: server.url.clone(),
            workload,
            load,
            server_pid: Some(server.pid()),
            send_target: None,
            subscribers: 0,
            updates: 0,
            tasks: 0,
        }
    }
}

/// What one run measured.
#[derive(Clone, Debug, Default)]
struct Outcome {
    requests: u64,
    /// Stream events received (stream, fan-out).
    events: u64,
    /// Fan-out subscriptions that ended early, failed or saw a gap.
    lost: u64,
    subscriptions: u64,
    elapsed: Duration,
    p50_us: u64,
    p99_us: u64,
    /// Server CPU seconds in the measured window.
    cpu_s: Option<f64>,
    peak_rss: Option<u64>,
    /// create-many: server RSS growth per created task.
    bytes_per_task: Option<f64>,
}

impl Outcome {
    fn rate(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }
    fn cpu_us_per_request(&self) -> Option<f64> {
        self.cpu_s
            .filter(|_| self.requests > 0)
            .map(|s| s * 1e6 / self.requests as f64)
    }
    fn cpu_us_per_event(&self) -> Option<f64> {
        self.cpu_s
            .filter(|_| self.events > 0)
            .map(|s| s * 1e6 / self.events as f64)
    }
}

// ---------------------------------------------------------------- /proc

fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// User + system CPU seconds of a process, from `/proc/PID/stat`.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which may hold spaces: state is 3rd.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / clock_ticks())
}

/// A `/proc/PID/status` figure in bytes (`VmHWM`, `VmRSS`).
fn status_bytes(pid: u32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

// ------------------------------------------------------------ requests

fn message(text: &str) -> Message {
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

fn send_request(tenant: &str, text: &str, return_immediately: bool) -> SendMessageRequest {
    SendMessageRequest {
        tenant: tenant.into(),
        message: Some(message(text)),
        configuration: Some(SendMessageConfiguration {
            return_immediately,
            ..Default::default()
        }),
        metadata: None,
    }
}

async fn connect(load: &Load, target: &str) -> Result<Vec<Client>, AnyError> {
    let bearer = Bearer(
        load.token
            .as_ref()
            .map(|t| format!("Bearer {t}").parse())
            .transpose()?,
    );
    let mut clients = Vec::new();
    for _ in 0..load.connections.max(1) {
        let channel = Channel::from_shared(target.to_string())?.connect().await?;
        clients.push(A2aServiceClient::with_interceptor(channel, bearer.clone()));
    }
    Ok(clients)
}

/// One client of `target`, without credentials.
async fn connect_one(target: &str) -> Result<Client, AnyError> {
    let channel = Channel::from_shared(target.to_string())?.connect().await?;
    Ok(A2aServiceClient::with_interceptor(channel, Bearer(None)))
}

async fn task_id_of(client: &mut Client, request: SendMessageRequest) -> Result<String, AnyError> {
    match client.send_message(request).await?.into_inner().payload {
        Some(send_message_response::Payload::Task(task)) => Ok(task.id),
        other => Err(format!("expected a task, got {other:?}").into()),
    }
}

// ------------------------------------------------------------ workloads

/// A closed loop of `op` calls; `op` returns the stream events it read.
async fn closed_loop<C, F, Fut>(
    clients: &[C],
    load: &Load,
    server_pid: Option<u32>,
    op: F,
) -> Result<Outcome, AnyError>
where
    C: Clone + Send + 'static,
    F: Fn(C, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<u64, AnyError>> + Send,
{
    let op = Arc::new(op);
    if let Some(requests) = load.requests {
        // The warm-up's loop runs until `--warmup` is over and all its
        // requests are answered, `load.mark` runs with nothing in flight,
        // then the loop starts again for exactly `requests` calls.
        let warmup = Some(Instant::now() + load.warmup);
        counted_pass(clients, load.concurrency, &op, warmup, u64::MAX).await?;
        if let Some(mark) = &load.mark {
            mark()?;
        }
        let cpu_before = server_pid.and_then(cpu_seconds);
        let start = Instant::now();
        let (done, events, hist) =
            counted_pass(clients, load.concurrency, &op, None, requests).await?;
        let elapsed = start.elapsed();
        let cpu_after = server_pid.and_then(cpu_seconds);
        return Ok(Outcome {
            requests: done,
            events,
            elapsed,
            p50_us: hist.value_at_quantile(0.50),
            p99_us: hist.value_at_quantile(0.99),
            cpu_s: cpu_before.zip(cpu_after).map(|(a, b)| b - a),
            peak_rss: server_pid.and_then(|p| status_bytes(p, "VmHWM")),
            ..Default::default()
        });
    }
    let counting = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let events = Arc::new(AtomicU64::new(0));
    let hist = Arc::new(Mutex::new(latency_histogram()));
    let mut workers = Vec::new();
    for i in 0..load.concurrency {
        let client = clients[i % clients.len()].clone();
        let (op, counting, stop, done, events, hist) = (
            op.clone(),
            counting.clone(),
            stop.clone(),
            done.clone(),
            events.clone(),
            hist.clone(),
        );
        workers.push(tokio::spawn(async move {
            let mut local = latency_histogram();
            let mut n = i as u64;
            while !stop.load(Ordering::Relaxed) {
                let start = Instant::now();
                let got = op(client.clone(), n).await?;
                n += ID_STRIDE;
                if counting.load(Ordering::Relaxed) {
                    local.saturating_record(start.elapsed().as_micros() as u64);
                    done.fetch_add(1, Ordering::Relaxed);
                    events.fetch_add(got, Ordering::Relaxed);
                }
            }
            hist.lock()
                .await
                .add(&local)
                .expect("same histogram bounds");
            Ok::<(), AnyError>(())
        }));
    }
    tokio::time::sleep(load.warmup).await;
    let cpu_before = server_pid.and_then(cpu_seconds);
    counting.store(true, Ordering::Relaxed);
    let start = Instant::now();
    tokio::time::sleep(load.duration).await;
    counting.store(false, Ordering::Relaxed);
    let elapsed = start.elapsed();
    let cpu_after = server_pid.and_then(cpu_seconds);
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await??;
    }
    let hist = hist.lock().await;
    Ok(Outcome {
        requests: done.load(Ordering::Relaxed),
        events: events.load(Ordering::Relaxed),
        elapsed,
        p50_us: hist.value_at_quantile(0.50),
        p99_us: hist.value_at_quantile(0.99),
        cpu_s: cpu_before.zip(cpu_after).map(|(a, b)| b - a),
        peak_rss: server_pid.and_then(|p| status_bytes(p, "VmHWM")),
        ..Default::default()
    })
}

/// One pass of `closed_loop` with `--requests`: `concurrency` workers
/// until `deadline`, or while `tickets` last; returns once every request
/// it made is answered, with their count, events and latencies.
async fn counted_pass<C, F, Fut>(
    clients: &[C],
    concurrency: usize,
    op: &Arc<F>,
    deadline: Option<Instant>,
    tickets: u64,
) -> Result<(u64, u64, Histogram<u64>), AnyError>
where
    C: Clone + Send + 'static,
    F: Fn(C, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<u64, AnyError>> + Send,
{
    let issued = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for i in 0..concurrency {
        let (client, op, issued) = (
            clients[i % clients.len()].clone(),
            op.clone(),
            issued.clone(),
        );
        workers.push(tokio::spawn(async move {
            let mut hist = latency_histogram();
            let (mut done, mut events) = (0u64, 0u64);
            let mut n = i as u64;
            loop {
                if deadline.is_some_and(|d| Instant::now() >= d)
                    || issued.fetch_add(1, Ordering::Relaxed) >= tickets
                {
                    break;
                }
                let start = Instant::now();
                events += op(client.clone(), n).await?;
                hist.saturating_record(start.elapsed().as_micros() as u64);
                done += 1;
                n += ID_STRIDE;
            }
            Ok::<_, AnyError>((done, events, hist))
        }));
    }
    let mut total = (0, 0, latency_histogram());
    for w in workers {
        let (done, events, hist) = w.await??;
        total.0 += done;
        total.1 += events;
        total.2.add(&hist).expect("same histogram bounds");
    }
    Ok(total)
}

/// Latencies in µs, 1 µs to 60 s, 3 significant digits.
fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds")
}

/// Workers step their counters by a large prime so that concurrent
/// workers read different GetTask ids.
const ID_STRIDE: u64 = 7919;

async fn run_workload(args: &RunArgs) -> Result<Outcome, AnyError> {
    let clients = connect(&args.load, &args.target).await?;
    if args.load.binding != Binding::Grpc && args.workload != Workload::Fanout {
        return run_json_workload(args, &clients).await;
    }
    let tenant = args.load.tenant.clone();
    let pid = args.server_pid;
    match args.workload {
        Workload::Send | Workload::SendBlocking => {
            let immediately = args.workload == Workload::Send;
            let webhook = args.load.webhook.clone();
            closed_loop(&clients, &args.load, pid, move |mut c, _| {
                let mut req = send_request(&tenant, "go", immediately);
                if let (Some(url), Some(configuration)) = (&webhook, &mut req.configuration) {
                    configuration.task_push_notification_config =
                        Some(TaskPushNotificationConfig {
                            url: url.clone(),
                            token: "bench".into(),
                            ..Default::default()
                        });
                }
                async move { Ok(c.send_message(req).await.map(|_| 0)?) }
            })
            .await
        }
        Workload::Get => {
            let mut ids = Vec::with_capacity(GET_TASKS);
            let mut c = clients[0].clone();
            for _ in 0..GET_TASKS {
                ids.push(task_id_of(&mut c, send_request(&tenant, "go", false)).await?);
            }
            let ids = Arc::new(ids);
            closed_loop(&clients, &args.load, pid, move |mut c, n| {
                let req = GetTaskRequest {
                    tenant: tenant.clone(),
                    id: ids[n as usize % ids.len()].clone(),
                    history_length: None,
                };
                async move { Ok(c.get_task(req).await.map(|_| 0)?) }
            })
            .await
        }
        Workload::Stream => {
            closed_loop(&clients, &args.load, pid, move |mut c, _| {
                let req = send_request(&tenant, "go", false);
                async move {
                    let mut stream = c.send_streaming_message(req).await?.into_inner();
                    let mut n = 0;
                    while stream.message().await?.is_some() {
                        n += 1;
                    }
                    Ok(n)
                }
            })
            .await
        }
        Workload::Fanout => {
            let senders = match &args.send_target {
                Some(target) => connect(&args.load, target).await?,
                None => clients.clone(),
            };
            fanout(
                &args.target,
                &clients,
                &senders,
                &args.load,
                args.subscribers,
                args.updates,
                pid,
            )
            .await
        }
        Workload::CreateMany => create_many(&clients, &args.load, args.tasks, pid).await,
    }
}

// ------------------------------------------------------- JSON bindings

/// A client of the JSON bindings: HTTP/1.1 (reqwest's pool keeps a
/// connection per request in flight), bodies written and read as the
/// server's ProtoJSON.
#[derive(Clone)]
struct JsonClient {
    http: reqwest::Client,
    base: String,
    binding: Binding,
    token: Option<String>,
    /// Events are 0.3's (counted, not decoded as 1.0 StreamResponses).
    v0_3: bool,
}

impl JsonClient {
    fn new(binding: Binding, target: &str, load: &Load) -> Result<Self, AnyError> {
        let builder = reqwest::Client::builder().tcp_nodelay(true);
        // HTTP/2 (prior knowledge, as gRPC's h2c): one connection per
        // client; HTTP/1.1: a pooled connection per request in flight.
        let builder = if load.http1 {
            builder.pool_max_idle_per_host(load.concurrency.max(1))
        } else {
            builder.http2_prior_knowledge()
        };
        Ok(JsonClient {
            http: builder.build()?,
            base: target.trim_end_matches('/').to_owned(),
            binding,
            token: load.token.clone(),
            v0_3: load.v0_3,
        })
    }

    /// The request of `method` (a JSON-RPC method; the HTTP+JSON route
    /// of `rest`), `params` its ProtoJSON.
    fn request(
        &self,
        method: &str,
        rest: (&str, String),
        params: String,
    ) -> reqwest::RequestBuilder {
        let builder = match self.binding {
            Binding::JsonRpc => self
                .http
                .post(format!("{}/", self.base))
                .header("content-type", "application/json")
                .body(format!(
                    r#"{{"jsonrpc":"2.0","id":1,"method":"{method}","params":{params}}}"#
                )),
            _ => {
                let (verb, path) = rest;
                let url = format!("{}{path}", self.base);
                match verb {
                    "GET" => self.http.get(url),
                    _ => self
                        .http
                        .post(url)
                        .header("content-type", "application/json")
                        .body(params),
                }
            }
        };
        match &self.token {
            Some(token) => builder.bearer_auth(token),
            None => builder,
        }
    }

    /// A unary call: its body, checked to be no error.
    async fn call(
        &self,
        method: &str,
        rest: (&str, String),
        params: String,
    ) -> Result<Vec<u8>, AnyError> {
        let response = self.request(method, rest, params).send().await?;
        let status = response.status();
        let body = response.bytes().await?;
        if !status.is_success() || (self.binding == Binding::JsonRpc && has_error(&body)) {
            return Err(format!("{method}: {status} {}", String::from_utf8_lossy(&body)).into());
        }
        Ok(body.to_vec())
    }

    /// A streaming call's events (each `data:` as a StreamResponse), read
    /// to the end, through `each`.
    async fn stream(
        &self,
        method: &str,
        rest: (&str, String),
        params: String,
        mut each: impl FnMut(Payload) -> bool,
    ) -> Result<u64, AnyError> {
        let mut response = self
            .request(method, rest, params)
            .header("accept", "text/event-stream")
            .send()
            .await?;
        if !response.status().is_success() {
            return Err(format!("{method}: {}", response.status()).into());
        }
        let mut buffer: Vec<u8> = Vec::new();
        let mut events = 0;
        while let Some(chunk) = response.chunk().await? {
            buffer.extend_from_slice(&chunk);
            while let Some(end) = buffer.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = buffer.drain(..end + 2).collect();
                let Some(data) = block
                    .split(|b| *b == b'\n')
                    .find_map(|line| line.strip_prefix(b"data: "))
                else {
                    continue;
                };
                events += 1;
                if self.v0_3 {
                    // 0.3 events: an error one ends the call as failed.
                    if data.windows(8).any(|w| w == b"\"error\":") {
                        return Err(format!(
                            "{method}: an error event: {}",
                            String::from_utf8_lossy(data)
                        )
                        .into());
                    }
                    continue;
                }
                let payload = self.payload(data)?;
                if !each(payload) {
                    return Ok(events);
                }
            }
        }
        Ok(events)
    }

    /// The StreamResponse of one event: bare (HTTP+JSON) or a JSON-RPC
    /// response's `result`.
    fn payload(&self, data: &[u8]) -> Result<Payload, AnyError> {
        let event: a2a_lifecycle::proto::StreamResponse = match self.binding {
            Binding::JsonRpc => {
                let value: serde_json::Value = serde_json::from_slice(data)?;
                let result = value
                    .get("result")
                    .ok_or_else(|| format!("an error event: {value}"))?;
                a2a_lifecycle::json::from_request_slice(result.to_string().as_bytes())?
            }
            _ => a2a_lifecycle::json::from_request_slice(data)?,
        };
        event.payload.ok_or_else(|| "an empty event".into())
    }
}

fn has_error(body: &[u8]) -> bool {
    body.windows(8).any(|w| w == b"\"error\":")
}

fn send_json(tenant: &str, text: &str, return_immediately: bool) -> String {
    let tenant = if tenant.is_empty() {
        String::new()
    } else {
        format!(r#""tenant":"{tenant}","#)
    };
    format!(
        r#"{{{tenant}"message":{{"messageId":"{}","role":"ROLE_USER","parts":[{{"text":"{text}"}}]}},"configuration":{{"returnImmediately":{return_immediately}}}}}"#,
        uuid::Uuid::new_v4()
    )
}

/// A protocol 0.3 send: JSON-RPC `MessageSendParams`, or HTTP+JSON the
/// ProtoJSON of 0.3's `SendMessageRequest`.
fn send_json_v0_3(binding: Binding, text: &str, blocking: bool) -> String {
    let id = uuid::Uuid::new_v4();
    match binding {
        Binding::JsonRpc => format!(
            r#"{{"message":{{"kind":"message","messageId":"{id}","role":"user","parts":[{{"kind":"text","text":"{text}"}}]}},"configuration":{{"blocking":{blocking}}}}}"#
        ),
        _ => format!(
            r#"{{"message":{{"messageId":"{id}","role":"ROLE_USER","content":[{{"text":"{text}"}}]}},"configuration":{{"blocking":{blocking}}}}}"#
        ),
    }
}

fn tenant_path(tenant: &str, path: &str) -> String {
    if tenant.is_empty() {
        path.to_owned()
    } else {
        format!("/{tenant}{path}")
    }
}

/// The send, get and stream workloads over a JSON binding.
async fn run_json_workload(args: &RunArgs, grpc: &[Client]) -> Result<Outcome, AnyError> {
    // As many connections as gRPC's runs use (HTTP/2), or a pool of them
    // (HTTP/1.1).
    let count = if args.load.http1 {
        1
    } else {
        args.load.connections.max(1)
    };
    let clients = (0..count)
        .map(|_| JsonClient::new(args.load.binding, &args.target, &args.load))
        .collect::<Result<Vec<_>, _>>()?;
    let tenant = args.load.tenant.clone();
    let pid = args.server_pid;
    let binding = args.load.binding;
    match args.workload {
        Workload::Send | Workload::SendBlocking if args.load.v0_3 => {
            let blocking = args.workload == Workload::SendBlocking;
            closed_loop(&clients, &args.load, pid, move |c, _| {
                let params = send_json_v0_3(binding, "go", blocking);
                let path = tenant_path(&tenant, "/v1/message:send");
                async move {
                    c.call("message/send", ("POST", path), params)
                        .await
                        .map(|_| 0)
                }
            })
            .await
        }
        Workload::Stream if args.load.v0_3 => {
            closed_loop(&clients, &args.load, pid, move |c, _| {
                let params = send_json_v0_3(binding, "go", true);
                let path = tenant_path(&tenant, "/v1/message:stream");
                async move {
                    c.stream("message/stream", ("POST", path), params, |_| true)
                        .await
                }
            })
            .await
        }
        _ if args.load.v0_3 => {
            Err("--v0-3 takes the send, send-blocking and stream workloads".into())
        }
        Workload::Send | Workload::SendBlocking => {
            let immediately = args.workload == Workload::Send;
            closed_loop(&clients, &args.load, pid, move |c, _| {
                let params = send_json(&tenant, "go", immediately);
                let path = tenant_path(&tenant, "/message:send");
                async move {
                    c.call("SendMessage", ("POST", path), params)
                        .await
                        .map(|_| 0)
                }
            })
            .await
        }
        Workload::Get => {
            let mut ids = Vec::with_capacity(GET_TASKS);
            let mut c = grpc[0].clone();
            for _ in 0..GET_TASKS {
                ids.push(task_id_of(&mut c, send_request(&tenant, "go", false)).await?);
            }
            let ids = Arc::new(ids);
            closed_loop(&clients, &args.load, pid, move |c, n| {
                let id = ids[n as usize % ids.len()].clone();
                let params = if tenant.is_empty() {
                    format!(r#"{{"id":"{id}"}}"#)
                } else {
                    format!(r#"{{"tenant":"{tenant}","id":"{id}"}}"#)
                };
                let path = tenant_path(&tenant, &format!("/tasks/{id}"));
                async move { c.call("GetTask", ("GET", path), params).await.map(|_| 0) }
            })
            .await
        }
        Workload::Stream => {
            closed_loop(&clients, &args.load, pid, move |c, _| {
                let params = send_json(&tenant, "go", false);
                let path = tenant_path(&tenant, "/message:stream");
                async move {
                    c.stream("SendStreamingMessage", ("POST", path), params, |_| true)
                        .await
                }
            })
            .await
        }
        other => Err(format!("{other:?} runs over gRPC only").into()),
    }
}

/// [`fanout_round`] with the subscribers on a JSON binding's event
/// stream (the task sent over gRPC).
async fn json_fanout_round(
    json: &JsonClient,
    senders: &[Client],
    tenant: &str,
    subscribers: usize,
    updates: u32,
) -> Result<Outcome, AnyError> {
    let mut c = senders[0].clone();
    let text = format!("fanout:{updates}:{FANOUT_WAIT_MS}:0");
    let id = task_id_of(&mut c, send_request(tenant, &text, true)).await?;
    let first_event: Arc<std::sync::Mutex<Option<Instant>>> = Default::default();
    let mut handles = Vec::new();
    for _ in 0..subscribers {
        let json = json.clone();
        let first_event = first_event.clone();
        let params = if tenant.is_empty() {
            format!(r#"{{"id":"{id}"}}"#)
        } else {
            format!(r#"{{"tenant":"{tenant}","id":"{id}"}}"#)
        };
        let path = tenant_path(tenant, &format!("/tasks/{id}:subscribe"));
        handles.push(tokio::spawn(async move {
            let (mut next, mut received, mut complete) = (1u32, 0u64, false);
            let read = json
                .stream("SubscribeToTask", ("POST", path), params, |payload| {
                    let (n, terminal) = sequence(&payload);
                    if let Some(n) = n {
                        if n == 1 {
                            first_event.lock().unwrap().get_or_insert_with(Instant::now);
                        }
                        if n != next {
                            return false;
                        }
                        next += 1;
                        received += 1;
                    }
                    if terminal {
                        complete = next == updates + 1;
                        return false;
                    }
                    true
                })
                .await;
            (received, read.is_ok() && complete)
        }));
    }
    let mut events = 0;
    let mut lost = 0;
    for h in handles {
        let (received, complete) = h.await?;
        events += received;
        if !complete {
            lost += 1;
        }
    }
    let end = Instant::now();
    let start = first_event.lock().unwrap().unwrap_or(end);
    Ok(Outcome {
        requests: 1,
        events,
        lost,
        subscriptions: subscribers as u64,
        elapsed: end.duration_since(start).max(Duration::from_micros(1)),
        ..Default::default()
    })
}

/// The sequence number an update carries (the bench agent's and the bare
/// server's convention), and whether the event is terminal.
fn sequence(payload: &Payload) -> (Option<u32>, bool) {
    match payload {
        Payload::StatusUpdate(u) => {
            let status = u.status.as_ref();
            let state = status.map(|s| s.state).unwrap_or_default();
            let terminal = TaskState::try_from(state)
                .map(|s| {
                    matches!(
                        s,
                        TaskState::Completed
                            | TaskState::Failed
                            | TaskState::Canceled
                            | TaskState::Rejected
                    )
                })
                .unwrap_or(false);
            let n = status
                .and_then(|s| s.message.as_ref())
                .and_then(|m| m.parts.first())
                .and_then(|p| match &p.content {
                    Some(Content::Text(t)) => t.parse().ok(),
                    _ => None,
                });
            (n, terminal)
        }
        Payload::ArtifactUpdate(u) => {
            let n = u
                .artifact
                .as_ref()
                .and_then(|a| a.parts.first())
                .and_then(|p| match &p.content {
                    Some(Content::Text(t)) => t.parse().ok(),
                    _ => None,
                });
            (n, false)
        }
        _ => (None, false),
    }
}

/// Fan-out rounds for `duration` (at least [`FANOUT_MIN_ROUNDS`]): the
/// events, losses and delivery time (first update to last subscriber done)
/// of every round added up; CPU over all of them.
async fn fanout(
    target: &str,
    clients: &[Client],
    senders: &[Client],
    load: &Load,
    subscribers: usize,
    updates: u32,
    pid: Option<u32>,
) -> Result<Outcome, AnyError> {
    let cpu_before = pid.and_then(cpu_seconds);
    let start = Instant::now();
    let mut total = Outcome::default();
    let mut rounds = 0;
    let json = match load.binding {
        Binding::Grpc => None,
        binding => Some(JsonClient::new(binding, target, load)?),
    };
    while rounds < FANOUT_MIN_ROUNDS || start.elapsed() < load.duration {
        let round = match &json {
            None => fanout_round(clients, senders, &load.tenant, subscribers, updates).await?,
            Some(json) => {
                json_fanout_round(json, senders, &load.tenant, subscribers, updates).await?
            }
        };
        total.requests += 1;
        total.events += round.events;
        total.lost += round.lost;
        total.subscriptions += round.subscriptions;
        total.elapsed += round.elapsed;
        rounds += 1;
    }
    let cpu_after = pid.and_then(cpu_seconds);
    total.cpu_s = cpu_before.zip(cpu_after).map(|(a, b)| b - a);
    total.peak_rss = pid.and_then(|p| status_bytes(p, "VmHWM"));
    Ok(total)
}

/// N subscribers of one task that emits K numbered updates: every
/// subscriber must see 1..=K in order and the terminal event.
async fn fanout_round(
    clients: &[Client],
    senders: &[Client],
    tenant: &str,
    subscribers: usize,
    updates: u32,
) -> Result<Outcome, AnyError> {
    let mut c = senders[0].clone();
    let text = format!("fanout:{updates}:{FANOUT_WAIT_MS}:0");
    let id = task_id_of(&mut c, send_request(tenant, &text, true)).await?;
    let first_event: Arc<std::sync::Mutex<Option<Instant>>> = Default::default();
    let mut handles = Vec::new();
    for i in 0..subscribers {
        let mut client = clients[i % clients.len()].clone();
        let req = SubscribeToTaskRequest {
            tenant: tenant.into(),
            id: id.clone(),
        };
        let first_event = first_event.clone();
        handles.push(tokio::spawn(async move {
            let mut stream = match client.subscribe_to_task(req).await {
                Ok(s) => s.into_inner(),
                Err(_) => return (0u64, false),
            };
            let (mut next, mut received) = (1u32, 0u64);
            loop {
                match stream.message().await {
                    Ok(Some(event)) => {
                        let Some(payload) = event.payload else {
                            continue;
                        };
                        let (n, terminal) = sequence(&payload);
                        if let Some(n) = n {
                            if n == 1 {
                                let mut f = first_event.lock().unwrap();
                                f.get_or_insert_with(Instant::now);
                            }
                            if n != next {
                                return (received, false);
                            }
                            next += 1;
                            received += 1;
                        }
                        if terminal {
                            return (received, next == updates + 1);
                        }
                    }
                    _ => return (received, false),
                }
            }
        }));
    }
    let mut events = 0;
    let mut lost = 0;
    for h in handles {
        let (received, complete) = h.await?;
        events += received;
        if !complete {
            lost += 1;
        }
    }
    let end = Instant::now();
    let start = first_event.lock().unwrap().unwrap_or(end);
    Ok(Outcome {
        requests: 1,
        events,
        lost,
        subscriptions: subscribers as u64,
        elapsed: end.duration_since(start).max(Duration::from_micros(1)),
        ..Default::default()
    })
}

/// Blocking sends of `tasks` small tasks; RSS growth per task.
async fn create_many(
    clients: &[Client],
    load: &Load,
    tasks: u64,
    pid: Option<u32>,
) -> Result<Outcome, AnyError> {
    let rss_before = pid.and_then(|p| status_bytes(p, "VmRSS"));
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut workers = Vec::new();
    for i in 0..load.concurrency {
        let mut client = clients[i % clients.len()].clone();
        let next = next.clone();
        let tenant = load.tenant.clone();
        workers.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < tasks {
                client
                    .send_message(send_request(&tenant, "go", false))
                    .await?;
            }
            Ok::<(), tonic::Status>(())
        }));
    }
    for w in workers {
        w.await??;
    }
    let elapsed = start.elapsed();
    let rss_after = pid.and_then(|p| status_bytes(p, "VmRSS"));
    Ok(Outcome {
        requests: tasks,
        elapsed,
        bytes_per_task: rss_before
            .zip(rss_after)
            .map(|(a, b)| (b as f64 - a as f64) / tasks as f64),
        peak_rss: pid.and_then(|p| status_bytes(p, "VmHWM")),
        ..Default::default()
    })
}

fn outcome_json(workload: &str, o: &Outcome) -> String {
    let opt = |v: Option<f64>| v.map(|v| format!("{v:.3}")).unwrap_or("null".into());
    format!(
        "{{\"workload\":\"{workload}\",\"requests\":{},\"events\":{},\"lost\":{},\"elapsed_s\":{:.6},\"rps\":{:.1},\"events_per_s\":{:.1},\"p50_us\":{},\"p99_us\":{},\"cpu_us_per_request\":{},\"cpu_us_per_event\":{},\"peak_rss\":{},\"bytes_per_task\":{}}}",
        o.requests,
        o.events,
        o.lost,
        o.elapsed.as_secs_f64(),
        o.rate(),
        o.events as f64 / o.elapsed.as_secs_f64(),
        o.p50_us,
        o.p99_us,
        opt(o.cpu_us_per_request()),
        opt(o.cpu_us_per_event()),
        o.peak_rss.map(|v| v.to_string()).unwrap_or("null".into()),
        opt(o.bytes_per_task),
    )
}

// ---------------------------------------------------------------- suite

/// A server process the suite started and owns.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Cores for the servers and for the generator, when there are at least two.
fn cpu_split() -> Option<(String, String)> {
    let n = std::thread::available_parallelism().ok()?.get();
    let has_taskset = Command::new("taskset").arg("-V").output().is_ok();
    if n < 2 || !has_taskset {
        return None;
    }
    let half = n / 2;
    Some((format!("0-{}", half - 1), format!("{half}-{}", n - 1)))
}

fn sibling(name: &str) -> PathBuf {
    let me = std::env::current_exe().expect("own path");
    me.parent().unwrap_or(Path::new(".")).join(name)
}

fn spawn_server(program: &Path, args: &[&str], cpus: Option<&str>) -> Result<Server, AnyError> {
    use std::io::{BufRead, BufReader};
    let mut command = match cpus {
        Some(cpus) => {
            let mut c = Command::new("taskset");
            c.args(["-c", cpus]).arg(program);
            c
        }
        None => Command::new(program),
    };
    // The server's own log filter, as shipped.
    let mut child = command
        .args(args)
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", program.display()))?;
    let mut lines = BufReader::new(child.stderr.take().expect("piped")).lines();
    let addr = loop {
        let line = lines
            .next()
            .ok_or_else(|| format!("{} exited before listening", program.display()))??;
        if let Some(rest) = line.split("addr=").nth(1) {
            break rest
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_string();
        }
        // --log-format json
        if let Some(rest) = line.split("\"addr\":\"").nth(1) {
            break rest.split('"').next().unwrap_or_default().to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    Ok(Server {
        child,
        url: format!("http://{addr}"),
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

struct Row {
    name: String,
    bare: f64,
    /// The bare server with this server's runtime and connection settings.
    tuned: f64,
    ours: f64,
    unit: &'static str,
    ratio: f64,
    ratio_tuned: f64,
    target: String,
    ok: bool,
    extra: String,
}

async fn suite(args: &SuiteArgs, split: Option<(String, String)>) -> Result<(), AnyError> {
    let server_cpus = split.as_ref().map(|(s, _)| s.as_str());
    let main_bin = sibling("a2a-lifecycle");
    let bare_bin = sibling("a2a-bare");
    let ours_args = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--store",
        "memory",
        "--default-agent",
        "bench",
    ];
    let bare = spawn_server(&bare_bin, &["--listen", "127.0.0.1:0"], server_cpus)?;
    let tuned = spawn_server(
        &bare_bin,
        &["--listen", "127.0.0.1:0", "--tuned"],
        server_cpus,
    )?;
    let ours = spawn_server(&main_bin, &ours_args, server_cpus)?;
    eprintln!(
        "suite: {} rounds of {:?} per run after {:?} warm-up, C={} over {} connections, servers on CPUs {}",
        args.rounds,
        args.load.duration,
        args.load.warmup,
        args.load.concurrency,
        args.load.connections,
        server_cpus.unwrap_or("(not pinned)")
    );
    let run =
        |server: &Server, workload: Workload| RunArgs::against(server, workload, args.load.clone());
    let mut rows = Vec::new();
    let mut json = Vec::new();
    // This server's CPU per gRPC request by workload: the JSON bindings'
    // rows are measured against it.
    let mut grpc_cpu: Vec<(Workload, f64)> = Vec::new();
    for (workload, name, target) in [
        (Workload::Get, "GetTask", 1.05),
        (Workload::Send, "SendMessage (non-blocking)", 1.30),
        (Workload::SendBlocking, "SendMessage (blocking)", 1.30),
        (Workload::Stream, "SendStreamingMessage", 1.30),
    ] {
        let (mut b, mut t, mut o, mut r, mut rt) = (vec![], vec![], vec![], vec![], vec![]);
        let (mut last_b, mut last_o) = (Outcome::default(), Outcome::default());
        for round in 1..=args.rounds {
            let ob = run_workload(&run(&bare, workload)).await?;
            let ot = run_workload(&run(&tuned, workload)).await?;
            let oo = run_workload(&run(&ours, workload)).await?;
            let cpu = |o: &Outcome| o.cpu_us_per_request().unwrap_or(f64::NAN);
            let (cb, ct, co) = (cpu(&ob), cpu(&ot), cpu(&oo));
            eprintln!(
                "round {round} {name}: bare {:.0} req/s {cb:.1} µs CPU/req; tuned bare {:.0} req/s {ct:.1}; ours {:.0} req/s {co:.1}",
                ob.rate(),
                ot.rate(),
                oo.rate(),
            );
            b.push(cb);
            t.push(ct);
            o.push(co);
            r.push(co / cb);
            rt.push(co / ct);
            (last_b, last_o) = (ob, oo);
        }
        let ratio = median(r);
        let ratio_tuned = median(rt);
        grpc_cpu.push((workload, median(o.clone())));
        json.push(format!(
            "{{\"name\":\"{name}\",\"ratio\":{ratio:.3},\"ratio_tuned\":{ratio_tuned:.3},\"bare\":{},\"ours\":{}}}",
            outcome_json("bare", &last_b),
            outcome_json("ours", &last_o)
        ));
        rows.push(Row {
            name: name.into(),
            bare: median(b),
            tuned: median(t),
            ours: median(o),
            unit: "µs CPU/req",
            ratio,
            ratio_tuned,
            target: format!("<= {target:.2}"),
            ok: ratio <= target,
            extra: format!(
                "ours {:.0} req/s, p50 {} µs, p99 {} µs",
                last_o.rate(),
                last_o.p50_us,
                last_o.p99_us
            ),
        });
    }

    // Issue 32: none lost up to 2,048 subscribers of one task.
    for n in FANOUT_SUBSCRIBERS {
        let (mut rates_b, mut rates_t, mut rates_o) = (vec![], vec![], vec![]);
        let (mut r, mut rt) = (vec![], vec![]);
        let (mut lost, mut subs) = (0, 0);
        for _ in 1..=args.rounds {
            let fanout = |server: &Server| {
                let mut args = run(server, Workload::Fanout);
                args.subscribers = n;
                args.updates = 200;
                spread_subscribers(&mut args);
                args
            };
            let ob = run_workload(&fanout(&bare)).await?;
            let ot = run_workload(&fanout(&tuned)).await?;
            let oo = run_workload(&fanout(&ours)).await?;
            let rate = |o: &Outcome| o.events as f64 / o.elapsed.as_secs_f64();
            let (eb, et, eo) = (rate(&ob), rate(&ot), rate(&oo));
            eprintln!(
                "fan-out N={n}: bare {eb:.0} events/s, lost {}; tuned bare {et:.0}, lost {}; ours {eo:.0} events/s, lost {}",
                ob.lost, ot.lost, oo.lost
            );
            lost += oo.lost;
            subs += oo.subscriptions;
            rates_b.push(eb);
            rates_t.push(et);
            rates_o.push(eo);
            r.push(eo / eb);
            rt.push(eo / et);
        }
        let ratio = median(r);
        let ratio_tuned = median(rt);
        rows.push(Row {
            name: format!("fan-out N={n}, K=200"),
            bare: median(rates_b),
            tuned: median(rates_t),
            ours: median(rates_o),
            unit: "events/s",
            ratio,
            ratio_tuned,
            target: ">= 0.70, none lost".into(),
            ok: ratio >= 0.70 && lost == 0,
            extra: format!("lost {lost} of {subs} subscriptions"),
        });
        json.push(format!(
            "{{\"name\":\"fanout\",\"subscribers\":{n},\"updates\":200,\"ratio\":{ratio:.3},\"ratio_tuned\":{ratio_tuned:.3},\"lost\":{lost},\"subscriptions\":{subs}}}"
        ));
    }
    if !args.no_json {
        let (json_rows, json_json) = json_bindings_cost(args, &ours, &grpc_cpu).await?;
        rows.extend(json_rows);
        json.extend(json_json);
    }
    drop(ours);
    drop(tuned);

    // RSS per stored task: a fresh server, so earlier runs do not count.
    let fresh = spawn_server(&main_bin, &ours_args, server_cpus)?;
    let mut rc = run(&fresh, Workload::CreateMany);
    rc.tasks = CREATE_MANY_TASKS;
    let created = run_workload(&rc).await?;
    let per_task = created.bytes_per_task.unwrap_or(f64::NAN);
    rows.push(Row {
        name: format!("memory per stored task ({CREATE_MANY_TASKS} tasks)"),
        bare: f64::NAN,
        tuned: f64::NAN,
        ours: per_task,
        unit: "bytes RSS/task",
        ratio: f64::NAN,
        ratio_tuned: f64::NAN,
        target: "<= 600 B".into(),
        ok: per_task <= 600.0,
        extra: format!("{:.0} tasks/s", created.rate()),
    });
    json.push(format!(
        "{{\"name\":\"create_many\",\"tasks\":{CREATE_MANY_TASKS},\"bytes_per_task\":{per_task:.1}}}"
    ));
    drop(fresh);

    if !args.no_sqlite {
        let dir = std::env::temp_dir().join(format!("a2a-bench-{}", uuid::Uuid::new_v4()));
        let store = format!("sqlite:{}", dir.join("tasks.db").display());
        let mem = spawn_server(&main_bin, &ours_args, server_cpus)?;
        let sqlite_args = [
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--store",
            &store,
            "--default-agent",
            "bench",
        ];
        let sql = spawn_server(&main_bin, &sqlite_args, server_cpus)?;
        let (mut r, mut m, mut s) = (vec![], vec![], vec![]);
        for round in 1..=args.rounds {
            let om = run_workload(&run(&mem, Workload::Send)).await?;
            let os = run_workload(&run(&sql, Workload::Send)).await?;
            eprintln!(
                "round {round} SQLite: memory {:.0} req/s, sqlite {:.0} req/s",
                om.rate(),
                os.rate()
            );
            m.push(om.rate());
            s.push(os.rate());
            r.push(os.rate() / om.rate());
        }
        let ratio = median(r);
        rows.push(Row {
            name: "SQLite store, non-blocking send".into(),
            bare: median(m),
            tuned: f64::NAN,
            ours: median(s),
            unit: "req/s (memory vs SQLite)",
            ratio,
            ratio_tuned: f64::NAN,
            target: ">= 0.70 of memory".into(),
            ok: ratio >= 0.7,
            extra: String::new(),
        });
        json.push(format!("{{\"name\":\"sqlite_send\",\"ratio\":{ratio:.3}}}"));
        drop(sql);
        let _ = std::fs::remove_dir_all(&dir);
    }

    if !args.no_postgres {
        let (pg_rows, pg_json) = postgres_rows(args, &main_bin, &ours_args, server_cpus).await?;
        rows.extend(pg_rows);
        json.extend(pg_json);
    }

    if !args.no_auth {
        let (auth_rows, auth_json) = auth_cost(args, &main_bin, &ours_args, server_cpus).await?;
        rows.extend(auth_rows);
        json.extend(auth_json);
    }

    if !args.no_operability {
        let (ops_rows, ops_json) =
            operability_cost(args, &main_bin, &ours_args, server_cpus).await?;
        rows.extend(ops_rows);
        json.extend(ops_json);
    }

    if !args.no_push {
        let (push_rows, push_json) = push_cost(args, &main_bin, &ours_args, server_cpus).await?;
        rows.extend(push_rows);
        json.extend(push_json);
    }

    if !args.no_long {
        let stores = long_stores(args.no_sqlite, args.no_postgres);
        let (long_rows, long_json) = long_rows(
            &main_bin,
            &stores,
            &args.postgres,
            &[10, 1_000, 10_000],
            Duration::from_millis(2),
            server_cpus,
        )
        .await?;
        rows.extend(long_rows);
        json.extend(long_json);
    }

    if !args.no_console {
        let (console_rows, console_json) =
            console_rows(&main_bin, args.no_sqlite, server_cpus).await?;
        rows.extend(console_rows);
        json.extend(console_json);
    }

    // `ratio` is to the bare server as tonic's defaults run it (what the
    // targets name); `to tuned` is to the bare server with this server's
    // runtime and connection settings, which isolates this server's own
    // per-request work.
    println!(
        "| workload | bare | bare, tuned | a2a-lifecycle | unit | ratio | to tuned | target | met | notes |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    let cell = |x: f64, digits: usize| {
        if x.is_finite() {
            format!("{x:.digits$}")
        } else {
            "–".to_owned()
        }
    };
    for row in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            row.name,
            cell(row.bare, 1),
            cell(row.tuned, 1),
            cell(row.ours, 1),
            row.unit,
            cell(row.ratio, 2),
            cell(row.ratio_tuned, 2),
            row.target,
            if row.ok { "yes" } else { "no" },
            row.extra
        );
    }
    println!("{{\"suite\":[{}]}}", json.join(","));
    Ok(())
}

/// The JSON bindings against gRPC on the same server: server CPU per
/// request for GetTask, a non-blocking send and a streamed send over
/// JSON-RPC and HTTP+JSON (HTTP/1.1), as a ratio to the same workload's
/// gRPC figure of this run (target: at most 1.5); and fan-out to 64 SSE
/// subscribers, which must lose no event.
async fn json_bindings_cost(
    args: &SuiteArgs,
    ours: &Server,
    grpc_cpu: &[(Workload, f64)],
) -> Result<(Vec<Row>, Vec<String>), AnyError> {
    let mut rows = Vec::new();
    let mut json = Vec::new();
    for (binding, label) in [
        (Binding::JsonRpc, "JSON-RPC"),
        (Binding::HttpJson, "HTTP+JSON"),
    ] {
        for (workload, name) in [
            (Workload::Get, "GetTask"),
            (Workload::Send, "SendMessage (non-blocking)"),
            (Workload::Stream, "SendStreamingMessage"),
        ] {
            let grpc = grpc_cpu
                .iter()
                .find(|(w, _)| *w == workload)
                .map_or(f64::NAN, |(_, cpu)| *cpu);
            let mut load = args.load.clone();
            load.binding = binding;
            let (cpu, last) = cpu_rounds(
                args.rounds,
                ours,
                workload,
                &load,
                &format!("{label} {name}"),
                &format!("gRPC {grpc:.1}"),
            )
            .await?;
            let ratio = cpu / grpc;
            rows.push(Row {
                name: format!("{label}: {name}"),
                bare: grpc,
                tuned: f64::NAN,
                ours: cpu,
                unit: "µs CPU/req (gRPC vs this binding)",
                ratio,
                ratio_tuned: f64::NAN,
                target: "<= 1.30 of gRPC".into(),
                ok: ratio <= 1.3,
                extra: format!(
                    "{:.0} req/s, p50 {} µs, p99 {} µs",
                    last.rate(),
                    last.p50_us,
                    last.p99_us
                ),
            });
            json.push(format!(
                "{{\"name\":\"{} {name}\",\"ratio_to_grpc\":{ratio:.3}}}",
                binding.name()
            ));
        }
        // Protocol 0.3's send on this binding, beside 1.0's: what the
        // translation at the edge costs.
        let v1_send = rows
            .iter()
            .rev()
            .find(|r: &&Row| r.name == format!("{label}: SendMessage (non-blocking)"))
            .map_or(f64::NAN, |r| r.ours);
        let mut load = args.load.clone();
        load.binding = binding;
        load.v0_3 = true;
        let (cpu, last) = cpu_rounds(
            args.rounds,
            ours,
            Workload::Send,
            &load,
            &format!("{label} 0.3 SendMessage"),
            &format!("1.0 {v1_send:.1}"),
        )
        .await?;
        let ratio = cpu / v1_send;
        rows.push(Row {
            name: format!("{label}: 0.3 SendMessage (non-blocking)"),
            bare: v1_send,
            tuned: f64::NAN,
            ours: cpu,
            unit: "µs CPU/req (1.0 send vs 0.3 send)",
            ratio,
            ratio_tuned: f64::NAN,
            target: "shown beside 1.0".into(),
            ok: ratio.is_finite(),
            extra: format!(
                "{:.0} req/s, p50 {} µs, p99 {} µs",
                last.rate(),
                last.p50_us,
                last.p99_us
            ),
        });
        json.push(format!(
            "{{\"name\":\"{} 0.3 SendMessage (non-blocking)\",\"ratio_to_1_0\":{ratio:.3}}}",
            binding.name()
        ));
        let (mut rates, mut lost, mut subs) = (Vec::new(), 0, 0);
        for _ in 1..=args.rounds {
            let mut load = args.load.clone();
            load.binding = binding;
            let mut run = RunArgs::against(ours, Workload::Fanout, load);
            run.subscribers = 64;
            run.updates = 200;
            let outcome = run_workload(&run).await?;
            let rate = outcome.events as f64 / outcome.elapsed.as_secs_f64();
            eprintln!(
                "{label} fan-out N=64: {rate:.0} events/s, lost {}",
                outcome.lost
            );
            rates.push(rate);
            lost += outcome.lost;
            subs += outcome.subscriptions;
        }
        rows.push(Row {
            name: format!("{label}: fan-out N=64, K=200 over SSE"),
            bare: f64::NAN,
            tuned: f64::NAN,
            ours: median(rates),
            unit: "events/s",
            ratio: f64::NAN,
            ratio_tuned: f64::NAN,
            target: "none lost".into(),
            ok: lost == 0,
            extra: format!("lost {lost} of {subs} subscriptions"),
        });
        json.push(format!(
            "{{\"name\":\"{} fanout\",\"lost\":{lost},\"subscriptions\":{subs}}}",
            binding.name()
        ));
    }
    Ok((rows, json))
}

/// `rounds` runs of `workload` under `load`, each reported as `name`
/// beside `against`: the median server CPU per request, and the last
/// run's outcome.
async fn cpu_rounds(
    rounds: usize,
    ours: &Server,
    workload: Workload,
    load: &Load,
    name: &str,
    against: &str,
) -> Result<(f64, Outcome), AnyError> {
    let mut cpus = Vec::new();
    let mut last = Outcome::default();
    for round in 1..=rounds {
        let outcome = run_workload(&RunArgs::against(ours, workload, load.clone())).await?;
        let cpu = outcome.cpu_us_per_request().unwrap_or(f64::NAN);
        eprintln!(
            "round {round} {name}: {:.0} req/s {cpu:.1} µs CPU/req ({against})",
            outcome.rate()
        );
        cpus.push(cpu);
        last = outcome;
    }
    Ok((median(cpus), last))
}

/// The key sets the test suite uses (`tests/fixtures/auth`): the bench's
/// JWTs are signed with its RS256 test key.
fn auth_fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/auth")
}

/// The same server with and without `--auth`, alternately, per workload:
/// what an authenticated request costs in server CPU, with an API key and
/// with an RS256 JWT. The principal is a `user`, so reads also take the
/// owner-scoped path.
async fn auth_cost(
    args: &SuiteArgs,
    main_bin: &Path,
    ours_args: &[&str],
    server_cpus: Option<&str>,
) -> Result<(Vec<Row>, Vec<String>), AnyError> {
    use sha2::Digest;
    let dir = std::env::temp_dir().join(format!("a2a-bench-auth-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir)?;
    let api_key = format!("bench-{}", uuid::Uuid::new_v4());
    let digest: String = sha2::Sha256::digest(api_key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let file = dir.join("auth.toml");
    std::fs::write(
        &file,
        format!(
            "[[principal]]\nname = \"bench\"\napi_key_sha256 = \"{digest}\"\ntenants = [\"*\"]\nrole = \"user\"\n\n\
             [jwt]\nissuer = \"https://id.example.test\"\naudience = \"a2a-lifecycle\"\n\
             jwks_file = \"{}\"\ntenants_claim = \"tenants\"\nadmin_claim = \"a2a_admin\"\n",
            auth_fixtures().join("jwks.json").display()
        ),
    )?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    let claims = serde_json::json!({
        "sub": "bench-jwt",
        "iss": "https://id.example.test",
        "aud": "a2a-lifecycle",
        "exp": now.as_secs() + 24 * 3600,
        "tenants": "*",
    });
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
    header.kid = Some("rs-1".into());
    let key = std::fs::read(auth_fixtures().join("rs256-test-key.pem"))?;
    let jwt = jsonwebtoken::encode(
        &header,
        &claims,
        &jsonwebtoken::EncodingKey::from_rsa_pem(&key)?,
    )?;

    let plain = spawn_server(main_bin, ours_args, server_cpus)?;
    let mut authed_args = ours_args.to_vec();
    let file_arg = file.display().to_string();
    authed_args.extend(["--auth", &file_arg]);
    let authed = spawn_server(main_bin, &authed_args, server_cpus)?;
    let run = |server: &Server, workload: Workload, token: Option<&str>| {
        let mut load = args.load.clone();
        load.token = token.map(str::to_owned);
        RunArgs::against(server, workload, load)
    };
    let (mut rows, mut json) = (Vec::new(), Vec::new());
    for (workload, name, token, target) in [
        (Workload::Get, "GetTask, API key", api_key.as_str(), 1.10),
        (
            Workload::Send,
            "SendMessage (non-blocking), API key",
            api_key.as_str(),
            1.10,
        ),
        (Workload::Get, "GetTask, RS256 JWT", jwt.as_str(), 1.60),
    ] {
        let measured = paired_cpu(
            args.rounds,
            &format!("auth {name}"),
            &run(&plain, workload, None),
            &run(&authed, workload, Some(token)),
        )
        .await?;
        let unit = "µs CPU/req (without vs with --auth)";
        let (row, line) = cost_row("auth", name, unit, measured, target);
        rows.push(row);
        json.push(line);
    }
    drop((plain, authed));
    let _ = std::fs::remove_dir_all(&dir);
    Ok((rows, json))
}

/// The row and JSON line of a feature's cost: server CPU per request
/// without and with it, and the median ratio, met when at most `target`.
fn cost_row(
    feature: &str,
    workload: &str,
    unit: &'static str,
    (without, with, ratio): (f64, f64, f64),
    target: f64,
) -> (Row, String) {
    let row = Row {
        name: format!("{feature}: {workload}"),
        bare: without,
        tuned: f64::NAN,
        ours: with,
        unit,
        ratio,
        ratio_tuned: f64::NAN,
        target: format!("<= {target:.2}"),
        ok: ratio <= target,
        extra: format!("{:+.2} µs CPU/req", with - without),
    };
    let json = format!(
        "{{\"name\":\"{feature}\",\"workload\":\"{workload}\",\"without_us\":{without:.2},\"with_us\":{with:.2},\"ratio\":{ratio:.3}}}"
    );
    (row, json)
}

/// Server CPU per request of two runs alternated `rounds` times: the
/// medians without and with, and the median of the rounds' ratios. Each
/// round swaps which goes first: in a fixed order the second came out
/// slower (metrics on a send measured 1.28 of off, then 0.98 alternated;
/// the first server is likely still finishing its runs on the same CPU).
async fn paired_cpu(
    rounds: usize,
    what: &str,
    without: &RunArgs,
    with: &RunArgs,
) -> Result<(f64, f64, f64), AnyError> {
    let (mut p, mut a, mut r) = (vec![], vec![], vec![]);
    for round in 1..=rounds {
        let (op, oa) = if round % 2 == 1 {
            let op = run_workload(without).await?;
            (op, run_workload(with).await?)
        } else {
            let oa = run_workload(with).await?;
            (run_workload(without).await?, oa)
        };
        let cpu = |o: &Outcome| o.cpu_us_per_request().unwrap_or(f64::NAN);
        eprintln!(
            "round {round} {what}: without {:.0} req/s {:.1} µs CPU/req; with {:.0} req/s {:.1}",
            op.rate(),
            cpu(&op),
            oa.rate(),
            cpu(&oa)
        );
        p.push(cpu(&op));
        a.push(cpu(&oa));
        r.push(cpu(&oa) / cpu(&op));
    }
    Ok((median(p), median(a), median(r)))
}

/// Metrics and spans, each against the same server without it,
/// alternately, per workload: metrics on (the default) against
/// `--no-metrics`; log lines in JSON, which carry the spans of calls and
/// runs (the default text lines leave them out), against the default.
/// What each costs in server CPU per request.
async fn operability_cost(
    args: &SuiteArgs,
    main_bin: &Path,
    ours_args: &[&str],
    server_cpus: Option<&str>,
) -> Result<(Vec<Row>, Vec<String>), AnyError> {
    let full = spawn_server(main_bin, ours_args, server_cpus)?;
    let mut without_metrics = ours_args.to_vec();
    without_metrics.push("--no-metrics");
    let no_metrics = spawn_server(main_bin, &without_metrics, server_cpus)?;
    let mut json_args = ours_args.to_vec();
    json_args.extend(["--log-format", "json"]);
    let json_logs = spawn_server(main_bin, &json_args, server_cpus)?;
    let run =
        |server: &Server, workload: Workload| RunArgs::against(server, workload, args.load.clone());
    let (mut rows, mut json) = (Vec::new(), Vec::new());
    for (feature, without, with, unit) in [
        (
            "metrics",
            &no_metrics,
            &full,
            "µs CPU/req (--no-metrics vs on)",
        ),
        (
            "spans",
            &full,
            &json_logs,
            "µs CPU/req (text vs --log-format json)",
        ),
    ] {
        for (workload, name) in [
            (Workload::Get, "GetTask"),
            (Workload::Send, "SendMessage (non-blocking)"),
        ] {
            let measured = paired_cpu(
                args.rounds,
                &format!("{feature} {name}"),
                &run(without, workload),
                &run(with, workload),
            )
            .await?;
            // "At most a few percent of CPU per request" (the metrics
            // issue).
            let (row, line) = cost_row(feature, name, unit, measured, 1.05);
            rows.push(row);
            json.push(line);
        }
    }
    drop((full, no_metrics, json_logs));
    Ok((rows, json))
}

/// How long the receiver may see nothing before delivery counts as
/// caught up after a run.
const PUSH_QUIET: Duration = Duration::from_secs(1);
/// The longest the suite waits for delivery to catch up after a run.
const PUSH_DRAIN_LIMIT: Duration = Duration::from_secs(120);
/// Sends of a round with a webhook, after a warm-up of none: two
/// notifications each, 60,000 in all, within the backlog the dispatcher
/// holds before it sheds (`push::deliver::MAX_LOADED`, 65,536) even if
/// none were delivered while the load ran. A longer burst from one
/// principal sheds its newest notifications by design (docs/push.md), and
/// "none lost" would measure that bound rather than delivery.
const PUSH_REQUESTS: u64 = 30_000;

/// Push notifications: the same server (webhooks allowed on loopback),
/// non-blocking sends without a webhook and with one on a receiver in this
/// process, alternately. What a webhook costs in server CPU per request
/// (its delivery included: the CPU is counted until the receiver has had
/// everything), the notifications delivered per second while the load
/// runs, and how long delivery takes to catch up once it stops.
async fn push_cost(
    args: &SuiteArgs,
    main_bin: &Path,
    ours_args: &[&str],
    server_cpus: Option<&str>,
) -> Result<(Vec<Row>, Vec<String>), AnyError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let webhook = format!("http://{}/bench", listener.local_addr()?);
    let received = Arc::new(AtomicU64::new(0));
    let counting = received.clone();
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(a2a_lifecycle::push::receiver::receive(
        listener,
        Some("bench".into()),
        move |_| {
            counting.fetch_add(1, Ordering::Relaxed);
        },
        stop.clone(),
    ));
    let mut server_args = ours_args.to_vec();
    server_args.extend(["--push-allow-cidr", "127.0.0.0/8"]);
    let server = spawn_server(main_bin, &server_args, server_cpus)?;
    let run = |webhook: Option<String>| {
        let mut load = args.load.clone();
        if webhook.is_some() {
            (load.requests, load.warmup) = (Some(PUSH_REQUESTS), Duration::ZERO);
        }
        load.webhook = webhook;
        RunArgs::against(&server, Workload::Send, load)
    };
    // Waits until the receiver has seen nothing for PUSH_QUIET: how long
    // that took, and the server CPU spent meanwhile.
    let drain = || async {
        let start = Instant::now();
        let cpu = cpu_seconds(server.pid());
        let mut last = received.load(Ordering::Relaxed);
        let mut quiet_since = Instant::now();
        while start.elapsed() < PUSH_DRAIN_LIMIT {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let now = received.load(Ordering::Relaxed);
            if now != last {
                (last, quiet_since) = (now, Instant::now());
            } else if quiet_since.elapsed() >= PUSH_QUIET {
                break;
            }
        }
        let cpu = cpu.zip(cpu_seconds(server.pid())).map(|(a, b)| b - a);
        (quiet_since.duration_since(start), cpu.unwrap_or(0.0))
    };
    let (mut without, mut with, mut ratios) = (vec![], vec![], vec![]);
    let (mut during_rates, mut drain_rates, mut per_note, mut drains) =
        (vec![], vec![], vec![], vec![]);
    let mut lost = false;
    for round in 1..=args.rounds {
        let plain = run_workload(&run(None)).await?;
        let before = received.load(Ordering::Relaxed);
        let hooked = run_workload(&run(Some(webhook.clone()))).await?;
        let at_end = received.load(Ordering::Relaxed);
        let (caught_up, drain_cpu) = drain().await;
        let after = received.load(Ordering::Relaxed);
        let cpu = |o: &Outcome| o.cpu_us_per_request().unwrap_or(f64::NAN);
        // The delivery work left when the load stopped counts too.
        let hooked_cpu = cpu(&hooked) + drain_cpu * 1e6 / hooked.requests.max(1) as f64;
        // Notifications taken while the load ran (warm-up included), and
        // after it, with the server free for delivery alone.
        let during = (at_end - before) as f64 / hooked.elapsed.as_secs_f64().max(1e-3);
        let drained = (after - at_end) as f64;
        let drain_rate = drained / caught_up.as_secs_f64().max(1e-3);
        let note_us = drain_cpu * 1e6 / drained.max(1.0);
        // Each bench task makes two notifications (its artifact and
        // COMPLETED); counted requests exclude the warm-up's.
        lost |= after - before < 2 * hooked.requests;
        eprintln!(
            "round {round} push: without {:.0} req/s {:.1} µs CPU/req; with a webhook {:.0} req/s {hooked_cpu:.1} µs CPU/req all told; {during:.0} notifications/s during the load, {drain_rate:.0}/s after it at {note_us:.1} µs CPU each, caught up {caught_up:.1?} after; {} notifications for {} requests",
            plain.rate(),
            cpu(&plain),
            hooked.rate(),
            after - before,
            hooked.requests,
        );
        without.push(cpu(&plain));
        with.push(hooked_cpu);
        ratios.push(hooked_cpu / cpu(&plain));
        during_rates.push(during);
        drain_rates.push(drain_rate);
        per_note.push(note_us);
        drains.push(caught_up.as_secs_f64());
    }
    stop.cancel();
    drop(server);
    let (without, with, ratio) = (median(without), median(with), median(ratios));
    let (during, drain_rate) = (median(during_rates), median(drain_rates));
    let (note_us, drain) = (median(per_note), median(drains));
    let rows = vec![
        Row {
            name: "push: SendMessage (non-blocking), one webhook".into(),
            bare: without,
            tuned: f64::NAN,
            ours: with,
            unit: "µs CPU/req (without vs with a webhook, delivery included)",
            ratio,
            ratio_tuned: f64::NAN,
            target: "(cost)".into(),
            ok: true,
            extra: format!("+{:.1} µs CPU/req: two POSTs per task", with - without),
        },
        Row {
            name: "push: delivery to a local receiver".into(),
            bare: f64::NAN,
            tuned: f64::NAN,
            ours: drain_rate,
            unit: "notifications/s (server free)",
            ratio: f64::NAN,
            ratio_tuned: f64::NAN,
            target: "none lost".into(),
            ok: !lost,
            extra: format!(
                "{note_us:.1} µs server CPU each; {during:.0}/s beside the load; caught up {drain:.1} s after it"
            ),
        },
    ];
    let json = vec![format!(
        "{{\"name\":\"push\",\"without_us\":{without:.2},\"with_us\":{with:.2},\"ratio\":{ratio:.3},\"during_per_s\":{during:.0},\"drain_per_s\":{drain_rate:.0},\"us_per_notification\":{note_us:.2},\"drain_s\":{drain:.2},\"lost\":{lost}}}"
    )];
    Ok((rows, json))
}

/// A row per store of the console's task list ([`console`]): the first
/// page's p99 with [`console::TASKS`] tasks stored, met within
/// [`console::FIRST_PAGE_WITHIN`].
async fn console_rows(
    main_bin: &Path,
    no_sqlite: bool,
    server_cpus: Option<&str>,
) -> Result<(Vec<Row>, Vec<String>), AnyError> {
    let dir = std::env::temp_dir().join(format!("a2a-bench-console-{}", uuid::Uuid::new_v4()));
    let sqlite = format!("sqlite:{}", dir.join("tasks.db").display());
    let mut stores = vec![("memory", None)];
    if !no_sqlite {
        stores.push(("SQLite", Some(sqlite.as_str())));
    }
    let (mut rows, mut json) = (Vec::new(), Vec::new());
    for (name, store) in stores {
        let f = console::measure(main_bin, name, store, server_cpus).await?;
        let _ = std::fs::remove_dir_all(&dir);
        eprintln!(
            "console list, {}: first page p50 {:?}, p99 {:?}; counts p99 {:?}; totalSize {}",
            f.store, f.first_page_p50, f.first_page_p99, f.counts_p99, f.total_size
        );
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        rows.push(Row {
            name: format!(
                "console list, first page of {} tasks ({})",
                console::TASKS,
                f.store
            ),
            bare: f64::NAN,
            tuned: f64::NAN,
            ours: ms(f.first_page_p99),
            unit: "ms p99",
            ratio: f64::NAN,
            ratio_tuned: f64::NAN,
            target: format!("<= {} ms", console::FIRST_PAGE_WITHIN.as_millis()),
            ok: f.first_page_p99 <= console::FIRST_PAGE_WITHIN && f.total_size == console::TASKS,
            extra: format!(
                "p50 {:.2} ms; counts by state (8 calls) p99 {:.2} ms; totalSize {}",
                ms(f.first_page_p50),
                ms(f.counts_p99),
                f.total_size
            ),
        });
        json.push(format!(
            "{{\"name\":\"console_list\",\"store\":\"{}\",\"tasks\":{},\"first_page_p50_ms\":{:.3},\"first_page_p99_ms\":{:.3},\"counts_p99_ms\":{:.3}}}",
            f.store,
            console::TASKS,
            ms(f.first_page_p50),
            ms(f.first_page_p99),
            ms(f.counts_p99)
        ));
    }
    Ok((rows, json))
}

fn long_stores(no_sqlite: bool, no_postgres: bool) -> Vec<long::Store> {
    let mut stores = vec![long::Store::Memory];
    if !no_sqlite {
        stores.push(long::Store::Sqlite);
    }
    if !no_postgres {
        stores.push(long::Store::Postgres);
        stores.push(long::Store::PostgresFollower);
    }
    stores
}

/// A row per store of the long-lived tasks' figures ([`long`]): bytes
/// written per write of the task at the smallest and the largest length
/// (CPU for the memory store), both figures' growth in the notes; met
/// when neither grows past [`long::FLAT`].
async fn long_rows(
    main_bin: &Path,
    stores: &[long::Store],
    postgres: &str,
    lengths: &[u32],
    interval: Duration,
    server_cpus: Option<&str>,
) -> Result<(Vec<Row>, Vec<String>), AnyError> {
    let (mut rows, mut json) = (Vec::new(), Vec::new());
    for &store in stores {
        let figures =
            long::measure(main_bin, store, postgres, lengths, interval, server_cpus).await?;
        let bytes_growth = long::growth(&figures, |l| l.bytes_per_write);
        let cpu_growth = long::growth(&figures, |l| Some(l.cpu_us_per_write)).unwrap_or(f64::NAN);
        let (first, last) = (
            figures.first().ok_or("no task length")?,
            figures.last().ok_or("no task length")?,
        );
        let (bare, ours, unit) = match (first.bytes_per_write, last.bytes_per_write) {
            (Some(a), Some(b)) => (a, b, store.bytes_unit()),
            _ => (
                first.cpu_us_per_write,
                last.cpu_us_per_write,
                "µs CPU/write",
            ),
        };
        let ratio = bytes_growth.unwrap_or(cpu_growth);
        let notes: Vec<String> = figures
            .iter()
            .map(|l| {
                format!(
                    "K={}: {}{:.1} µs CPU ({} writes)",
                    l.updates,
                    l.bytes_per_write
                        .map_or(String::new(), |b| format!("{b:.0} B, ")),
                    l.cpu_us_per_write,
                    l.writes
                )
            })
            .collect();
        rows.push(Row {
            name: format!(
                "long tasks, {} store: K={} vs K={}",
                store.name(),
                first.updates,
                last.updates
            ),
            bare,
            tuned: f64::NAN,
            ours,
            unit,
            ratio,
            ratio_tuned: f64::NAN,
            target: format!("<= {} (bytes and CPU)", long::FLAT),
            ok: ratio <= long::FLAT && cpu_growth <= long::FLAT,
            extra: format!("{}; CPU growth {cpu_growth:.2}", notes.join("; ")),
        });
        json.push(format!(
            r#"{{"name":"long_{}","bytes_growth":{},"cpu_growth":{cpu_growth:.3}}}"#,
            store.key(),
            bytes_growth.map_or("null".to_string(), |g| format!("{g:.3}"))
        ));
    }
    Ok((rows, json))
}

fn main() -> Result<(), AnyError> {
    let cli = Cli::parse();
    // Pin the generator before the runtime starts its threads (they
    // inherit the affinity); the servers get the other cores.
    let split = match &cli.command {
        Cmd::Soak(args) if args.unpinned => None,
        Cmd::Suite(_) | Cmd::Long(_) | Cmd::Console(_) | Cmd::Soak(_) => cpu_split(),
        Cmd::Run(_) | Cmd::Instructions(_) => None,
    };
    if let Some((_, generator)) = &split {
        let _ = Command::new("taskset")
            .args(["-p", "-c", generator, &std::process::id().to_string()])
            .stdout(Stdio::null())
            .status();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        match cli.command {
            Cmd::Run(mut args) => {
                spread_subscribers(&mut args);
                let outcome = run_workload(&args).await?;
                let name = format!("{:?}", args.workload).to_lowercase();
                println!("| workload | requests | req/s | events | lost | p50 µs | p99 µs | server CPU µs/req | peak RSS |");
                println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
                println!(
                    "| {name} | {} | {:.0} | {} | {} | {} | {} | {} | {} |",
                    outcome.requests,
                    outcome.rate(),
                    outcome.events,
                    outcome.lost,
                    outcome.p50_us,
                    outcome.p99_us,
                    outcome
                        .cpu_us_per_request()
                        .map(|v| format!("{v:.1}"))
                        .unwrap_or("-".into()),
                    outcome
                        .peak_rss
                        .map(|v| format!("{:.1} MiB", v as f64 / 1048576.0))
                        .unwrap_or("-".into()),
                );
                println!("{}", outcome_json(&name, &outcome));
                Ok(())
            }
            Cmd::Suite(args) => suite(&args, split).await,
            Cmd::Instructions(args) => instructions::instructions(&args).await,
            Cmd::Soak(args) => {
                let server_cpus = split.as_ref().map(|(s, _)| s.as_str());
                soak::soak(&sibling("a2a-lifecycle"), &args, server_cpus).await
            }
            Cmd::Console(args) => {
                let server_cpus = split.as_ref().map(|(s, _)| s.as_str());
                let (rows, json) =
                    console_rows(&sibling("a2a-lifecycle"), args.no_sqlite, server_cpus).await?;
                println!("| row | ms p99 | target | met | figures |");
                println!("| --- | --- | --- | --- | --- |");
                for row in &rows {
                    println!(
                        "| {} | {:.2} | {} | {} | {} |",
                        row.name,
                        row.ours,
                        row.target,
                        if row.ok { "yes" } else { "no" },
                        row.extra
                    );
                }
                println!("{{\"console\":[{}]}}", json.join(","));
                Ok(())
            }
            Cmd::Long(args) => {
                let mut stores = long_stores(args.no_sqlite, args.no_postgres);
                if !args.only.is_empty() {
                    stores.retain(|s| args.only.contains(s));
                }
                let server_cpus = split.as_ref().map(|(s, _)| s.as_str());
                let (rows, json) = long_rows(
                    &sibling("a2a-lifecycle"),
                    &stores,
                    &args.postgres,
                    &args.updates,
                    args.interval,
                    server_cpus,
                )
                .await?;
                println!("| row | smallest K | largest K | unit | growth | met | figures |");
                println!("| --- | --- | --- | --- | --- | --- | --- |");
                for row in &rows {
                    println!(
                        "| {} | {:.1} | {:.1} | {} | {:.2} | {} | {} |",
                        row.name,
                        row.bare,
                        row.ours,
                        row.unit,
                        row.ratio,
                        if row.ok { "yes" } else { "no" },
                        row.extra
                    );
                }
                println!("{{\"long\":[{}]}}", json.join(","));
                Ok(())
            }
        }
    })
}

/// The PostgreSQL rows: non-blocking sends on the PostgreSQL store against
/// the memory store, round by round; and fan-out with the agent on one
/// replica and the subscribers on another.
async fn postgres_rows(
    args: &SuiteArgs,
    main_bin: &Path,
    ours_args: &[&str],
    server_cpus: Option<&str>,
) -> Result<(Vec<Row>, Vec<String>), AnyError> {
    let (admin, connection) = tokio_postgres::connect(&args.postgres, tokio_postgres::NoTls)
        .await
        .map_err(|e| {
            format!(
                "PostgreSQL at {}: {e} (--no-postgres skips these rows)",
                args.postgres
            )
        })?;
    tokio::spawn(connection);
    let schema = format!("a2a_bench_{}", uuid::Uuid::new_v4().simple());
    admin
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await?;
    let separator = if args.postgres.contains('?') {
        '&'
    } else {
        '?'
    };
    let store = format!(
        "{}{separator}options=-csearch_path%3D{schema}",
        args.postgres
    );
    let replica_args = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--store",
        &store,
        "--default-agent",
        "bench",
    ];
    let run = |server: &Server, workload: Workload| RunArgs {
        subscribers: 64,
        updates: 200,
        ..RunArgs::against(server, workload, args.load.clone())
    };
    let mut rows = Vec::new();
    let mut json = Vec::new();
    {
        let mem = spawn_server(main_bin, ours_args, server_cpus)?;
        let pg = spawn_server(main_bin, &replica_args, server_cpus)?;
        let (mut r, mut m, mut p, mut cpu) = (vec![], vec![], vec![], vec![]);
        for round in 1..=args.rounds {
            let om = run_workload(&run(&mem, Workload::Send)).await?;
            let op = run_workload(&run(&pg, Workload::Send)).await?;
            eprintln!(
                "round {round} PostgreSQL: memory {:.0} req/s, postgres {:.0} req/s",
                om.rate(),
                op.rate()
            );
            m.push(om.rate());
            p.push(op.rate());
            r.push(op.rate() / om.rate());
            cpu.push(op.cpu_us_per_request().unwrap_or(f64::NAN));
        }
        let ratio = median(r);
        rows.push(Row {
            name: "PostgreSQL store, non-blocking send".into(),
            bare: median(m),
            tuned: f64::NAN,
            ours: median(p),
            unit: "req/s (memory vs PostgreSQL)",
            ratio,
            ratio_tuned: f64::NAN,
            target: ">= 0.50 of memory".into(),
            ok: ratio >= 0.50,
            extra: format!("server CPU {:.0} µs/req", median(cpu)),
        });
        json.push(format!(
            "{{\"name\":\"postgres_send\",\"ratio\":{ratio:.3}}}"
        ));
    }
    {
        // Two replicas: the agent runs on `a`, the subscribers are on `b`.
        let a = spawn_server(main_bin, &replica_args, server_cpus)?;
        let b = spawn_server(main_bin, &replica_args, server_cpus)?;
        let mut fan = run(&b, Workload::Fanout);
        fan.send_target = Some(a.url.clone());
        let (mut rates, mut lost, mut subs) = (vec![], 0, 0);
        for round in 1..=args.rounds {
            let o = run_workload(&fan).await?;
            let rate = o.events as f64 / o.elapsed.as_secs_f64();
            eprintln!(
                "round {round} cross-replica fan-out: {rate:.0} events/s, lost {}",
                o.lost
            );
            rates.push(rate);
            lost += o.lost;
            subs += o.subscriptions;
        }
        let rate = median(rates);
        rows.push(Row {
            name: "PostgreSQL, fan-out across replicas (64 subscribers on b, agent on a)".into(),
            bare: f64::NAN,
            tuned: f64::NAN,
            ours: rate,
            unit: "events/s delivered",
            ratio: f64::NAN,
            ratio_tuned: f64::NAN,
            target: "none lost".into(),
            ok: lost == 0,
            extra: format!("lost {lost} of {subs} subscriptions"),
        });
        json.push(format!(
            "{{\"name\":\"postgres_cross_replica_fanout\",\"events_per_s\":{rate:.0},\"lost\":{lost},\"subscriptions\":{subs}}}"
        ));
    }
    admin
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await?;
    Ok((rows, json))
}
