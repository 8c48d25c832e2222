//! The server's metrics, as an operator scrapes them from `GET /metrics`
//! (the OpenMetrics text format, which Prometheus reads).
//!
//! This module owns every metric's name, help text, labels and histogram
//! buckets; the parts of the server record into the handles it gives out
//! ([`Metrics::rpc`], ...). One registry per server, not a process-wide
//! one, so that servers embedded side by side (and tests) count apart.
//!
//! Label values are bounded: RPC methods from the service's own list
//! (anything else is `other`), gRPC code names, agents as configured,
//! task states, outcomes; never a task id, a tenant a client made up, or
//! free text.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

mod labels;
mod observed;
use labels::{HEALTH, METHODS, OTHER, REFLECTION};
pub use labels::{V0_3, V1_0, code_label, method_label, operation_label, protocol_version_label};
pub use observed::{Observed, is_grpc};

/// The content type of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Latency buckets (seconds): 50 µs doubling to about 52 s, fine enough
/// for a GetTask on the memory store and wide enough for a blocking send.
fn latency_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.000_05, 2.0, 21)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcLabels {
    binding: &'static str,
    protocol_version: &'static str,
    method: &'static str,
    code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    binding: &'static str,
    protocol_version: &'static str,
    method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AgentLabels {
    agent: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    agent: Arc<str>,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateOnlyLabels {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

/// RPCs: how many by method and code, and how long they took (to the end
/// of the response: a stream's whole life for the streaming methods).
#[derive(Clone)]
pub struct RpcMetrics {
    requests: Family<RpcLabels, Counter>,
    duration: Family<MethodLabels, Histogram, fn() -> Histogram>,
    /// Each label set's handles, looked up in the families once: a call's
    /// record is then an index, an atomic add and a histogram observation,
    /// where the families hash four labels under a lock for each handle
    /// (callgrind: 1,400 instructions a call; see docs/performance.md).
    handles: Arc<[RpcHandles]>,
}

/// The labels a call's record can take without a lookup: every method
/// label [`method_label`] and [`operation_label`] give.
const METHOD_LABELS: [&str; METHODS.len() + 3] = {
    let mut all = [""; METHODS.len() + 3];
    let mut i = 0;
    while i < METHODS.len() {
        all[i] = METHODS[i];
        i += 1;
    }
    all[METHODS.len()] = HEALTH;
    all[METHODS.len() + 1] = REFLECTION;
    all[METHODS.len() + 2] = OTHER;
    all
};
/// The protocol versions, in the handles' order.
const VERSIONS: [&str; 2] = [V1_0, V0_3];
/// gRPC codes 0 (`OK`) to 16 (`UNAUTHENTICATED`).
const CODES: usize = 17;

/// One (binding, version, method)'s handles, each taken from its family
/// the first time it is used (a label set appears in the exposition only
/// once it has counted).
#[derive(Default)]
struct RpcHandles {
    requests: [std::sync::OnceLock<Counter>; CODES],
    duration: std::sync::OnceLock<Histogram>,
}

impl RpcMetrics {
    fn new() -> Self {
        let slots = crate::bindings::Binding::ALL.len() * VERSIONS.len() * METHOD_LABELS.len();
        RpcMetrics {
            requests: Family::default(),
            duration: Family::new_with_constructor(|| Histogram::new(latency_buckets())),
            handles: (0..slots).map(|_| RpcHandles::default()).collect(),
        }
    }

    /// The handles of a label set, when its labels are among the known
    /// ones (they always are for the server's own calls).
    fn handles(
        &self,
        binding: crate::bindings::Binding,
        protocol_version: &str,
        method: &str,
    ) -> Option<&RpcHandles> {
        let b = crate::bindings::Binding::ALL
            .iter()
            .position(|x| *x == binding)?;
        let v = VERSIONS.iter().position(|x| *x == protocol_version)?;
        let m = METHOD_LABELS.iter().position(|x| *x == method)?;
        self.handles
            .get((b * VERSIONS.len() + v) * METHOD_LABELS.len() + m)
    }

    /// One call of `method` ([`method_label`]) over `binding` ended with
    /// `code` (a JSON binding's error by its gRPC code, so one label set
    /// serves every binding) after `elapsed`.
    pub fn record(
        &self,
        binding: crate::bindings::Binding,
        protocol_version: &'static str,
        method: &'static str,
        code: tonic::Code,
        elapsed: Duration,
    ) {
        let counter = || {
            self.requests
                .get_or_create(&RpcLabels {
                    binding: binding.name(),
                    protocol_version,
                    method,
                    code: code_label(code),
                })
                .clone()
        };
        let histogram = || {
            self.duration
                .get_or_create(&MethodLabels {
                    binding: binding.name(),
                    protocol_version,
                    method,
                })
                .clone()
        };
        let seconds = elapsed.as_secs_f64();
        match self.handles(binding, protocol_version, method) {
            Some(handles) => {
                let slot = usize::try_from(code as i32).unwrap_or(CODES);
                match handles.requests.get(slot) {
                    Some(once) => once.get_or_init(counter).inc(),
                    None => counter().inc(),
                };
                handles.duration.get_or_init(histogram).observe(seconds);
            }
            None => {
                counter().inc();
                histogram().observe(seconds);
            }
        }
    }
}

/// Tasks and runs: created and reaching each state, by agent; runs going
/// on now.
#[derive(Clone)]
pub struct TaskMetrics {
    created: Family<AgentLabels, Counter>,
    states: Family<StateLabels, Counter>,
    runs_active: Gauge,
    unfinished: Family<StateOnlyLabels, Gauge>,
}

/// The `state` label's values: every `TaskState`, by number.
const TASK_STATES: usize = 9;

/// One agent's task counters, each taken from its family the first time
/// it counts (a label set appears in the exposition only once it has
/// counted), as [`RpcHandles`] are: a commit's counts are then atomic
/// adds, where the families hash the labels under a lock for each (a
/// send counts four: the task created, SUBMITTED, WORKING, COMPLETED).
/// Made once per served agent by the runtime, for one [`Metrics`].
pub struct AgentCounters {
    agent: Arc<str>,
    created: std::sync::OnceLock<Counter>,
    states: [std::sync::OnceLock<Counter>; TASK_STATES],
}

impl AgentCounters {
    pub fn new(agent: Arc<str>) -> Self {
        AgentCounters {
            agent,
            created: Default::default(),
            states: Default::default(),
        }
    }

    /// The `agent` label: the agent's name.
    pub fn agent(&self) -> &Arc<str> {
        &self.agent
    }
}

impl TaskMetrics {
    /// A task of `agent` was created (committed).
    pub fn created(&self, agent: &AgentCounters) {
        agent
            .created
            .get_or_init(|| {
                self.created
                    .get_or_create(&AgentLabels {
                        agent: agent.agent.clone(),
                    })
                    .clone()
            })
            .inc();
    }

    /// A task of `agent` reached `state` (a committed status change).
    pub fn reached(&self, agent: &AgentCounters, state: crate::proto::TaskState) {
        let Some(slot) = agent.states.get(state as usize) else {
            return;
        };
        slot.get_or_init(|| {
            self.states
                .get_or_create(&StateLabels {
                    agent: agent.agent.clone(),
                    state: state.as_str_name(),
                })
                .clone()
        })
        .inc();
    }

    /// A run started: counted until the guard is dropped.
    pub fn run(&self) -> GaugeGuard {
        GaugeGuard::new(&self.runs_active)
    }

    /// The store now holds `count` tasks in `state` (a state that has not
    /// ended; its ProtoJSON name).
    pub fn unfinished(&self, state: &'static str, count: u64) {
        self.unfinished
            .get_or_create(&StateOnlyLabels { state })
            .set(count.min(i64::MAX as u64) as i64);
    }
}

/// Streams: open ones by kind (`send` for SendStreamingMessage,
/// `subscribe` for SubscribeToTask), and resyncs of subscribers that fell
/// behind.
#[derive(Clone)]
pub struct StreamMetrics {
    open: Family<KindLabels, Gauge>,
    resyncs: Counter,
}

impl StreamMetrics {
    /// A stream opened: counted until the guard is dropped.
    pub fn open(&self, kind: &'static str) -> GaugeGuard {
        GaugeGuard::new(&self.open.get_or_create(&KindLabels { kind }))
    }

    /// A subscriber fell behind and was sent a fresh snapshot.
    pub fn resynced(&self) {
        self.resyncs.inc();
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackendLabels {
    backend: &'static str,
}

/// Store writes, by backend (`memory`, `sqlite`, `postgres`): how long a
/// task write took to commit as the runtime waited for it, how many
/// failed, and for the backends that group writes into transactions, the
/// batch sizes and the writes still queued.
#[derive(Clone)]
pub struct StoreMetrics {
    write_seconds: Family<BackendLabels, Histogram, fn() -> Histogram>,
    write_failures: Family<BackendLabels, Counter>,
    batch_writes: Family<BackendLabels, Histogram, fn() -> Histogram>,
    queue_depth: Family<BackendLabels, Gauge>,
}

impl StoreMetrics {
    /// The handles of one backend, looked up once.
    pub fn backend(&self, backend: &'static str) -> BackendMetrics {
        let labels = BackendLabels { backend };
        BackendMetrics {
            write_seconds: self.write_seconds.get_or_create(&labels).clone(),
            write_failures: self.write_failures.get_or_create(&labels).clone(),
            writer: WriterMetrics {
                batch_writes: self.batch_writes.get_or_create(&labels).clone(),
                queue_depth: self.queue_depth.get_or_create(&labels).clone(),
            },
        }
    }
}

/// One backend's store metrics, as the runtime records them.
#[derive(Clone)]
pub struct BackendMetrics {
    write_seconds: Histogram,
    write_failures: Counter,
    /// What the store's own writer records (`TaskStore::instrument`).
    pub writer: WriterMetrics,
}

impl BackendMetrics {
    /// A task write ended after `elapsed`, committed or not.
    pub fn written(&self, elapsed: Duration, ok: bool) {
        self.write_seconds.observe(elapsed.as_secs_f64());
        if !ok {
            self.write_failures.inc();
        }
    }
}

/// What a store's writer records: the size of each transaction it
/// commits, and the writes left queued when it took them.
#[derive(Clone)]
pub struct WriterMetrics {
    batch_writes: Histogram,
    queue_depth: Gauge,
}

impl WriterMetrics {
    /// A batch of `writes` taken, `queued` left waiting behind it.
    pub fn batch(&self, writes: usize, queued: usize) {
        self.batch_writes.observe(writes as f64);
        self.queue_depth.set(queued as i64);
    }
}

/// Authentication failures, by reason (`missing`, `malformed`,
/// `unknown_key`, `unknown_certificate`, `invalid_token`: the kinds of
/// `auth::AuthError`).
#[derive(Clone)]
pub struct AuthMetrics {
    failures: Family<AuthLabels, Counter>,
}

/// The `reason` label's values: every `auth::AuthError` kind.
pub const AUTH_FAILURE_REASONS: [&str; 5] = [
    "missing",
    "malformed",
    "unknown_key",
    "unknown_certificate",
    "invalid_token",
];
/// The `route` label's values: where a credential was refused (an A2A
/// call over each binding, or a `/metrics` scrape, apart so that a
/// scraper left without its token is not taken for a caller guessing).
pub const AUTH_ROUTES: [&str; 4] = ["grpc", "jsonrpc", "http-json", "metrics"];

impl AuthMetrics {
    pub fn failed(&self, reason: &'static str, route: &'static str) {
        self.failures
            .get_or_create(&AuthLabels { reason, route })
            .inc();
    }

    /// Every series at zero, so that dashboards and alerts see them
    /// before the first failure.
    fn expose(&self) {
        for reason in AUTH_FAILURE_REASONS {
            for route in AUTH_ROUTES {
                drop(self.failures.get_or_create(&AuthLabels { reason, route }));
            }
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AuthLabels {
    reason: &'static str,
    route: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

/// The `outcome` label's values ([`PushMetrics::ended`]).
pub const PUSH_OUTCOMES: [&str; 5] = ["delivered", "refused", "given_up", "dropped", "shed"];

/// Push notifications: how each entry of the outbox ended, retries
/// scheduled, attempt latency, and the entries this process has read from
/// the outbox and not yet finished.
#[derive(Clone, Debug)]
pub struct PushMetrics {
    deliveries: Family<OutcomeLabels, Counter>,
    retries: Counter,
    attempt_seconds: Histogram,
    pending: Gauge,
}

impl PushMetrics {
    /// An outbox entry ended: `delivered` (a 2xx answer), `refused` (an
    /// answer or address not worth another try), `given_up` (out of
    /// attempts), `dropped` (its config or task gone), `shed` (given up
    /// while the backlog was full, its principal over its share).
    /// Every outcome's series at zero (see [`AuthMetrics`]).
    fn expose(&self) {
        for outcome in PUSH_OUTCOMES {
            drop(self.deliveries.get_or_create(&OutcomeLabels { outcome }));
        }
    }

    pub fn ended(&self, outcome: &'static str) {
        self.deliveries
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    /// An attempt failed and the entry waits for another.
    pub fn retried(&self) {
        self.retries.inc();
    }

    /// One POST to a webhook took `elapsed` (to its answer or failure).
    pub fn attempted(&self, elapsed: Duration) {
        self.attempt_seconds.observe(elapsed.as_secs_f64());
    }

    /// The outbox entries read and not yet finished.
    pub fn pending(&self, entries: usize) {
        self.pending.set(entries as i64);
    }
}

/// Adds one to a gauge until dropped.
pub struct GaugeGuard(Gauge);

impl GaugeGuard {
    fn new(gauge: &Gauge) -> Self {
        gauge.inc();
        GaugeGuard(gauge.clone())
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Registers `metric` as `name` (under the `a2a` prefix), noting its
/// full name.
fn register(
    (registry, names): (&mut Registry, &mut Vec<String>),
    name: &str,
    help: &str,
    metric: impl prometheus_client::registry::Metric,
) {
    names.push(format!("a2a_{name}"));
    registry.register(name, help, metric);
}

/// Every metric of one server, and the registry that renders them.
pub struct Metrics {
    registry: Registry,
    names: Vec<String>,
    pub rpc: RpcMetrics,
    pub tasks: TaskMetrics,
    pub streams: StreamMetrics,
    pub store: StoreMetrics,
    pub auth: AuthMetrics,
    pub push: PushMetrics,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("a2a");
        let mut names = Vec::new();
        let rpc = RpcMetrics::new();
        register(
            (&mut registry, &mut names),
            "rpc_requests",
            "RPCs answered, by binding (grpc, jsonrpc, http-json), method and gRPC status code",
            rpc.requests.clone(),
        );
        register(
            (&mut registry, &mut names),
            "rpc_duration_seconds",
            "RPC latency to the end of the response (a stream's whole life for streaming methods)",
            rpc.duration.clone(),
        );
        let tasks = TaskMetrics {
            created: Family::default(),
            states: Family::default(),
            runs_active: Gauge::default(),
            unfinished: Family::default(),
        };
        register(
            (&mut registry, &mut names),
            "tasks_created",
            "Tasks created, by agent",
            tasks.created.clone(),
        );
        register(
            (&mut registry, &mut names),
            "task_states",
            "Committed status changes into each state, by agent and state",
            tasks.states.clone(),
        );
        register(
            (&mut registry, &mut names),
            "runs_active",
            "Agent runs going on now",
            tasks.runs_active.clone(),
        );
        register(
            (&mut registry, &mut names),
            "tasks",
            "Tasks in the store in each state that has not ended (all tenants and replicas), counted every 2 s",
            tasks.unfinished.clone(),
        );
        let streams = StreamMetrics {
            open: Family::default(),
            resyncs: Counter::default(),
        };
        register(
            (&mut registry, &mut names),
            "streams_open",
            "Open event streams, by kind (send: SendStreamingMessage, subscribe: SubscribeToTask)",
            streams.open.clone(),
        );
        register(
            (&mut registry, &mut names),
            "stream_resyncs",
            "Subscribers that fell behind and were sent a fresh task snapshot",
            streams.resyncs.clone(),
        );
        let store = StoreMetrics {
            write_seconds: Family::new_with_constructor(|| Histogram::new(latency_buckets())),
            write_failures: Family::default(),
            batch_writes: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(1.0, 2.0, 9))
            }),
            queue_depth: Family::default(),
        };
        register(
            (&mut registry, &mut names),
            "store_write_seconds",
            "Task writes, from the runtime's request to the store's commit, by backend",
            store.write_seconds.clone(),
        );
        register(
            (&mut registry, &mut names),
            "store_write_failures",
            "Task writes the store failed (refusals of a stale version included), by backend",
            store.write_failures.clone(),
        );
        register(
            (&mut registry, &mut names),
            "store_batch_writes",
            "Writes per transaction of the store's writer (SQLite, PostgreSQL), by backend",
            store.batch_writes.clone(),
        );
        register(
            (&mut registry, &mut names),
            "store_queue_depth",
            "Writes waiting for the store's writer when it last took a batch, by backend",
            store.queue_depth.clone(),
        );
        let auth = AuthMetrics {
            failures: Family::default(),
        };
        auth.expose();
        register(
            (&mut registry, &mut names),
            "auth_failures",
            "Requests refused authentication, by reason and route (grpc, jsonrpc, http-json: an A2A call; metrics: a scrape)",
            auth.failures.clone(),
        );
        let push = PushMetrics {
            deliveries: Family::default(),
            retries: Counter::default(),
            attempt_seconds: Histogram::new(latency_buckets()),
            pending: Gauge::default(),
        };
        push.expose();
        register(
            (&mut registry, &mut names),
            "push_deliveries",
            "Push notifications ended, by outcome (delivered, refused, given_up, dropped, shed)",
            push.deliveries.clone(),
        );
        register(
            (&mut registry, &mut names),
            "push_retries",
            "Push notification attempts that failed and were scheduled again",
            push.retries.clone(),
        );
        register(
            (&mut registry, &mut names),
            "push_attempt_seconds",
            "Push notification POSTs, to the webhook's answer or the attempt's failure",
            push.attempt_seconds.clone(),
        );
        register(
            (&mut registry, &mut names),
            "push_outbox_pending",
            "Push outbox entries this process has read and not finished (at most 65536)",
            push.pending.clone(),
        );
        Metrics {
            registry,
            names,
            rpc,
            tasks,
            streams,
            store,
            auth,
            push,
        }
    }

    /// Every metric family registered, by its full name (`a2a_...`,
    /// without a counter's `_total`), whether it has series yet or not: a
    /// family without any is not rendered.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The metrics now, in the OpenMetrics text format ([`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String does not fail");
        text
    }
}
