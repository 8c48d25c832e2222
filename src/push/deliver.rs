//! Delivering the outbox: each queued notification is POSTed to its
//! config's webhook, in commit order per config, retried until it is taken
//! or given up.
//!
//! - The store's outbox is read once, in commit order, from where the last
//!   read ended ([`TaskStore::outbox`]); the [`Dispatcher`] keeps what it
//!   read as one queue per (tenant, task, config), at most [`MAX_LOADED`]
//!   entries and [`MAX_LOADED_BYTES`]. Only a queue's head is ever in
//!   flight, so a config sees its events in commit order (the terminal one
//!   last), and the queues run side by side, so one slow or dead webhook
//!   does not delay another's: at most [`MAX_IN_FLIGHT`] POSTs at once, of
//!   which at most [`MAX_IN_FLIGHT_PER_HOST`] to one webhook host however
//!   many tasks name it; a queue waiting for its host, or for a retry,
//!   holds no slot. (A backlog past [`MAX_LOADED`] for dead webhooks does
//!   hold up newer notifications until it is given up.)
//! - A 2xx answer finishes an entry. Connection errors, timeouts
//!   ([`Settings::timeout`]) and 408, 429 or 5xx answers are retried with
//!   exponential backoff and jitter ([`FIRST_RETRY`] doubling to
//!   [`MAX_RETRY`]), honouring `Retry-After`; after
//!   [`Settings::max_attempts`] the entry is given up and logged. Any other
//!   answer is final. Redirects are not followed. A host that does not
//!   answer is left alone for a doubling while, its notifications' attempts
//!   counted as failed meanwhile.
//! - The config is read from the task at each attempt: a deleted config (or
//!   a purged task) gets nothing more.
//! - Connections go only to addresses [`Egress`] permits, resolved for
//!   each new connection; connections are kept alive per host
//!   ([`IDLE_CONNECTION`]). Credentials and tokens are never logged.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::egress::{Egress, WebhookTarget};
use super::fenced::{Fenced, WriteUntil};
use crate::lifecycle::Protocol;
use crate::proto::{StreamResponse, TaskPushNotificationConfig};
use crate::store::{Delivery, TaskStore};

/// Default time one POST may take, connection included.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default attempts at one notification before it is given up.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 8;
/// The wait before the first retry; each further one doubles it...
pub const FIRST_RETRY: Duration = Duration::from_secs(1);
/// ... up to this (also the longest `Retry-After` honoured).
pub const MAX_RETRY: Duration = Duration::from_secs(300);
/// Outbox entries read per store call.
pub const READ_BATCH: usize = 1024;
/// Outbox entries held in memory at once (the queues' backlog); past this,
/// or past [`MAX_LOADED_BYTES`] of events, reading waits until deliveries
/// finish some.
pub const MAX_LOADED: usize = 65_536;
/// Event bytes held in memory at once.
pub const MAX_LOADED_BYTES: usize = 64 * 1024 * 1024;
/// POSTs in flight at once, over all webhooks.
pub const MAX_IN_FLIGHT: usize = 512;
/// POSTs in flight at once to one webhook host (`scheme://host:port`): a
/// slow or dead host holds at most this many of [`MAX_IN_FLIGHT`].
pub const MAX_IN_FLIGHT_PER_HOST: usize = 16;
/// POSTs in flight at once for the tasks of one principal (tenant and
/// owner): one whose webhooks are slow or dead, under however many host
/// names, holds at most this many of [`MAX_IN_FLIGHT`], and the others'
/// notifications go on.
pub const MAX_IN_FLIGHT_PER_PRINCIPAL: usize = 64;
/// Entries of one principal held while the backlog is full
/// ([`MAX_LOADED`]): past it, that principal's newest entries are given
/// up (counted as `shed`), so reading the outbox goes on for the others.
pub const MAX_LOADED_PER_PRINCIPAL: usize = MAX_LOADED / 8;
/// Down hosts remembered; past this, those back up are forgotten.
const MAX_DOWN_HOSTS: usize = 100_000;
/// How long an idle connection to a webhook is kept for the next POST.
pub const IDLE_CONNECTION: Duration = Duration::from_secs(30);
/// Hosts with idle connections kept.
const MAX_POOLED_HOSTS: usize = 1024;
/// The longest answer body read (and dropped) to keep a connection.
pub const MAX_ANSWER_BYTES: usize = 64 * 1024;
/// How often the outbox is read without a signal (a safety net: commits
/// raise one), parked queues are looked at and idle connections closed;
/// also the wait after a store error.
pub const POLL_EVERY: Duration = Duration::from_secs(1);
/// The media type of a notification's body (spec §4.3).
pub const CONTENT_TYPE: &str = "application/a2a+json";
/// A 0.3 notification's: 0.3 predates the A2A media type.
pub const CONTENT_TYPE_V0_3: &str = "application/json";
/// The header carrying the config's token.
pub const TOKEN_HEADER: &str = "x-a2a-notification-token";

/// How deliveries are made.
#[derive(Debug, Clone)]
pub struct Settings {
    pub egress: Egress,
    /// `--push-timeout`.
    pub timeout: Duration,
    /// `--push-max-attempts`.
    pub max_attempts: u32,
    /// Where outcomes, retries and the outbox backlog are counted (the
    /// server fills it in from its runtime's metrics when it is `None`).
    pub metrics: Option<crate::metrics::PushMetrics>,
    /// How the body for a protocol 0.3 client's webhook is written from
    /// its outbox event (the server sets `service::v0_3`'s, which owns the
    /// 0.3 shapes); `None`: such a webhook gets the 1.0 body.
    pub v0_3_body: Option<BodyWriter>,
}

/// Writes a notification's body from its event.
pub type BodyWriter = fn(StreamResponse) -> Result<String, String>;

impl Default for Settings {
    fn default() -> Self {
        Settings {
            egress: Egress::default(),
            timeout: DEFAULT_TIMEOUT,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            metrics: None,
            v0_3_body: None,
        }
    }
}

/// What one attempt's POST came to.
#[derive(Debug, PartialEq, Eq)]
enum PostOutcome {
    /// A 2xx answer.
    Delivered,
    /// Worth another try, after at least this long if the webhook said.
    Retry {
        why: String,
        after: Option<Duration>,
    },
    /// Not worth another try.
    Final(String),
    /// No answer: the host did not resolve or accept a connection, the
    /// connection broke, or the time ran out. Retried, and the host is
    /// taken to be down for a while ([`Load::leave_host`]).
    Unreachable(String),
}

type QueueKey = (String, String, String);

/// Whose share a notification uses: the task's tenant and owner.
type Principal = (String, String);

fn queue_of(delivery: &Delivery) -> QueueKey {
    (
        delivery.tenant.clone(),
        delivery.task_id.clone(),
        delivery.config_id.clone(),
    )
}

/// Delivers the store's outbox until shut down.
pub struct Dispatcher {
    store: Arc<dyn TaskStore>,
    settings: Arc<Settings>,
    /// Raised when a commit added to the outbox.
    signal: Arc<Notify>,
    /// How long this process certainly holds [`DELIVERY_ROLE`]: an attempt
    /// starts only if it would end within it.
    tenure: Arc<Tenure>,
    hosts: Arc<Mutex<Hosts>>,
    pool: Arc<Pool>,
}

/// Attempts in flight per webhook host, and which hosts are down; shared
/// with the attempts, which take a host's slot once they know its URL.
#[derive(Default)]
struct Hosts {
    per_host: HashMap<Arc<str>, usize>,
    /// Hosts that did not answer: consecutive failures, and until when no
    /// connection is tried.
    down: HashMap<Arc<str>, (u32, Instant)>,
}

/// Whether an attempt at a host may go ahead.
#[derive(Debug, PartialEq, Eq)]
enum Gate {
    Go,
    /// [`MAX_IN_FLIGHT_PER_HOST`] attempts are in flight to it.
    Full,
    /// It failed to answer lately; tried again after this long.
    Down(Duration),
}

impl Hosts {
    fn is_full(&self, host: &str) -> bool {
        self.in_use(host) >= MAX_IN_FLIGHT_PER_HOST
    }

    /// Slots of `host` taken.
    fn in_use(&self, host: &str) -> usize {
        self.per_host.get(host).copied().unwrap_or(0)
    }

    /// Takes one of `host`'s slots, if it is up and has one free.
    fn enter(&mut self, host: &Arc<str>, now: Instant) -> Gate {
        if let Some(&(_, until)) = self.down.get(host)
            && until > now
        {
            return Gate::Down(until - now);
        }
        let n = self.per_host.entry(host.clone()).or_default();
        if *n >= MAX_IN_FLIGHT_PER_HOST {
            return Gate::Full;
        }
        *n += 1;
        Gate::Go
    }

    /// Gives the slot back. A host that did not answer is down for
    /// [`backoff`] of its consecutive failures (counted once per down
    /// period, however many attempts were in flight); any answer brings
    /// it back up.
    fn leave(&mut self, host: &Arc<str>, outcome: &PostOutcome, now: Instant) {
        if let Some(n) = self.per_host.get_mut(host) {
            *n -= 1;
            if *n == 0 {
                self.per_host.remove(host);
            }
        }
        if !matches!(outcome, PostOutcome::Unreachable(_)) {
            self.down.remove(host);
            return;
        }
        if self.down.len() >= MAX_DOWN_HOSTS {
            self.down.retain(|_, (_, until)| *until > now);
        }
        let (failures, until) = self.down.entry(host.clone()).or_insert((0, now));
        if *until <= now {
            // Failures long ago do not make a new one count double.
            if now.duration_since(*until) > MAX_RETRY {
                *failures = 0;
            }
            *failures += 1;
            *until = now + backoff(*failures);
        }
    }
}

/// What an attempt came to for its outbox entry, for the schedule.
#[derive(Debug, PartialEq, Eq)]
enum DeliveryOutcome {
    /// The entry left the outbox: delivered, refused, given up, or its
    /// config is gone.
    Finished,
    /// It stays, with `attempts` made, until `not_before_ms`.
    Deferred { attempts: u32, not_before_ms: i64 },
    /// Its host had no slot free: nothing was tried.
    Parked(Arc<str>),
    /// The store failed; the entry is tried again after [`POLL_EVERY`].
    StoreFailed,
}

/// An attempt's end: its queue, what came of it, and the host whose slot
/// it gave back.
struct Ended {
    key: QueueKey,
    done: DeliveryOutcome,
    freed: Option<Arc<str>>,
}

/// The dispatcher's view of the outbox: what it has read (each queue's
/// entries in commit order), which queue heads are due, waiting for a time
/// or for a slot at their host, and in flight. The store is read once, in
/// `seq` order, from where the last read ended; the schedule keeps each
/// queue's order itself, so one queue's backlog costs the others nothing.
#[derive(Default)]
struct Schedule {
    read_up_to: u64,
    loaded: usize,
    /// The events' bytes held in `queues`.
    loaded_bytes: usize,
    queues: HashMap<QueueKey, VecDeque<Delivery>>,
    /// Queues whose head is due, oldest first.
    ready: VecDeque<QueueKey>,
    /// Queues whose head waits for a time (ms since the epoch).
    timers: BinaryHeap<Reverse<(i64, QueueKey)>>,
    in_flight: HashSet<QueueKey>,
    /// Queues whose head waits for a slot at its host.
    parked: HashMap<Arc<str>, VecDeque<QueueKey>>,
    /// Each queue's principal.
    principal_of: HashMap<QueueKey, Principal>,
    /// Entries held per principal.
    held: HashMap<Principal, usize>,
    /// Attempts in flight per principal.
    principal_in_flight: HashMap<Principal, usize>,
    /// Queues whose head waits for a slot of its principal's.
    principal_parked: HashMap<Principal, VecDeque<QueueKey>>,
}

impl Schedule {
    /// Whether there is room to read more of the outbox.
    fn can_read(&self) -> bool {
        self.loaded < MAX_LOADED && self.loaded_bytes < MAX_LOADED_BYTES
    }

    fn add(&mut self, delivery: Delivery, now_ms: i64) {
        self.read_up_to = self.read_up_to.max(delivery.seq);
        self.loaded += 1;
        self.loaded_bytes += delivery.event.len();
        let key = queue_of(&delivery);
        let principal = (delivery.tenant.clone(), delivery.owner.clone());
        *self.held.entry(principal.clone()).or_default() += 1;
        self.principal_of.entry(key.clone()).or_insert(principal);
        let not_before = delivery.not_before_ms;
        let queue = self.queues.entry(key.clone()).or_default();
        queue.push_back(delivery);
        if queue.len() == 1 {
            self.queue_at(key, not_before, now_ms);
        }
    }

    /// Puts the queue in `ready`, or among the timers until its time.
    fn queue_at(&mut self, key: QueueKey, not_before_ms: i64, now_ms: i64) {
        if not_before_ms <= now_ms {
            self.ready.push_back(key);
        } else {
            self.timers.push(Reverse((not_before_ms, key)));
        }
    }

    /// Moves the queues whose time has come to `ready`; how long until the
    /// next one's does.
    fn wake(&mut self, now_ms: i64) -> Option<Duration> {
        while let Some(Reverse((at, _))) = self.timers.peek() {
            if *at > now_ms {
                return Some(Duration::from_millis((*at - now_ms) as u64));
            }
            if let Some(Reverse((_, key))) = self.timers.pop() {
                self.ready.push_back(key);
            }
        }
        None
    }

    /// The next head to attempt, counted in flight from now on, while
    /// fewer than [`MAX_IN_FLIGHT`] are and its principal has fewer than
    /// [`MAX_IN_FLIGHT_PER_PRINCIPAL`] (else the queue waits for one of
    /// them to end).
    fn start_next(&mut self) -> Option<Delivery> {
        while self.in_flight.len() < MAX_IN_FLIGHT {
            let key = self.ready.pop_front()?;
            let Some(head) = self.queues.get(&key).and_then(|q| q.front()) else {
                continue;
            };
            if self.in_flight.contains(&key) {
                continue;
            }
            let head = head.clone();
            let principal = self.principal_of.get(&key).cloned().unwrap_or_default();
            let busy = self
                .principal_in_flight
                .entry(principal.clone())
                .or_default();
            if *busy >= MAX_IN_FLIGHT_PER_PRINCIPAL {
                self.principal_parked
                    .entry(principal)
                    .or_default()
                    .push_back(key);
                continue;
            }
            *busy += 1;
            self.in_flight.insert(key);
            return Some(head);
        }
        None
    }

    /// A principal's attempt ended: one of its waiting queues may go.
    fn principal_freed(&mut self, key: &QueueKey) {
        let Some(principal) = self.principal_of.get(key) else {
            return;
        };
        if let Some(busy) = self.principal_in_flight.get_mut(principal) {
            *busy -= 1;
            if *busy == 0 {
                self.principal_in_flight.remove(principal);
            }
        }
        if let Some(waiting) = self.principal_parked.get_mut(principal) {
            if let Some(next) = waiting.pop_front() {
                self.ready.push_back(next);
            }
            if waiting.is_empty() {
                self.principal_parked.remove(principal);
            }
        }
    }

    /// An entry leaves what is held.
    fn release(&mut self, key: &QueueKey, delivery: &Delivery) {
        self.loaded -= 1;
        self.loaded_bytes -= delivery.event.len();
        if let Some(principal) = self.principal_of.get(key)
            && let Some(n) = self.held.get_mut(principal)
        {
            *n -= 1;
            if *n == 0 {
                self.held.remove(principal);
            }
        }
    }

    /// While the backlog is full: gives up the newest entries of each
    /// principal holding more than [`MAX_LOADED_PER_PRINCIPAL`] (a queue's
    /// head only when it is not in flight), so that reading goes on for
    /// the others. Returns what was given up, for the store to drop.
    fn shed(&mut self) -> Vec<Delivery> {
        if self.can_read() {
            return Vec::new();
        }
        let over: HashSet<Principal> = self
            .held
            .iter()
            .filter(|(_, n)| **n > MAX_LOADED_PER_PRINCIPAL)
            .map(|(p, _)| p.clone())
            .collect();
        let mut shed = Vec::new();
        if over.is_empty() {
            return shed;
        }
        let keys: Vec<QueueKey> = self
            .queues
            .keys()
            .filter(|k| self.principal_of.get(*k).is_some_and(|p| over.contains(p)))
            .cloned()
            .collect();
        for key in keys {
            let principal = self.principal_of[&key].clone();
            let keep = usize::from(self.in_flight.contains(&key));
            loop {
                let held = self.held.get(&principal).copied().unwrap_or(0);
                let Some(queue) = self.queues.get_mut(&key) else {
                    break;
                };
                if held <= MAX_LOADED_PER_PRINCIPAL || queue.len() <= keep {
                    break;
                }
                let Some(dropped) = queue.pop_back() else {
                    break;
                };
                let emptied = queue.is_empty();
                self.release(&key, &dropped);
                shed.push(dropped);
                if emptied {
                    // Its keys elsewhere (ready, timers, parked) find no
                    // queue and are passed over.
                    self.queues.remove(&key);
                    self.principal_of.remove(&key);
                    break;
                }
            }
        }
        shed
    }

    fn ended(&mut self, ended: Ended, hosts: &Mutex<Hosts>, now_ms: i64) {
        let Ended { key, done, freed } = ended;
        if self.in_flight.remove(&key) {
            self.principal_freed(&key);
        }
        if let Some(host) = freed {
            self.unpark(&host, 1);
        }
        match done {
            DeliveryOutcome::Finished => {
                let Some(done) = self.queues.get_mut(&key).and_then(|q| q.pop_front()) else {
                    return;
                };
                self.release(&key, &done);
                match self.queues.get(&key).and_then(|q| q.front()) {
                    Some(next) => {
                        let not_before = next.not_before_ms;
                        self.queue_at(key, not_before, now_ms);
                    }
                    None => {
                        self.queues.remove(&key);
                        self.principal_of.remove(&key);
                    }
                }
            }
            DeliveryOutcome::Deferred {
                attempts,
                not_before_ms,
            } => {
                if let Some(head) = self.queues.get_mut(&key).and_then(|q| q.front_mut()) {
                    head.attempts = attempts;
                    head.not_before_ms = not_before_ms;
                }
                self.queue_at(key, not_before_ms, now_ms);
            }
            DeliveryOutcome::Parked(host) => {
                // Its slot may have come free before this was heard.
                let full = lock(hosts).is_full(&host);
                if full {
                    self.parked.entry(host).or_default().push_back(key);
                } else {
                    self.ready.push_back(key);
                }
            }
            DeliveryOutcome::StoreFailed => {
                self.queue_at(key, now_ms + POLL_EVERY.as_millis() as i64, now_ms);
            }
        }
    }

    /// Lets `n` of the queues waiting for `host` go.
    fn unpark(&mut self, host: &Arc<str>, n: usize) {
        if let Some(waiting) = self.parked.get_mut(host) {
            for _ in 0..n {
                match waiting.pop_front() {
                    Some(key) => self.ready.push_back(key),
                    None => break,
                }
            }
            if waiting.is_empty() {
                self.parked.remove(host);
            }
        }
    }

    /// Lets as many queues go as their hosts have slots free: for a slot
    /// that came free without an attempt there ending (checked when an
    /// attempt ends without having taken a slot, and each [`POLL_EVERY`]).
    /// No more than that, or they would only be parked again.
    fn unpark_all(&mut self, hosts: &Mutex<Hosts>) {
        if self.parked.is_empty() {
            return;
        }
        let free: Vec<(Arc<str>, usize)> = {
            let hosts = lock(hosts);
            self.parked
                .keys()
                .map(|h| {
                    (
                        h.clone(),
                        MAX_IN_FLIGHT_PER_HOST.saturating_sub(hosts.in_use(h)),
                    )
                })
                .filter(|(_, n)| *n > 0)
                .collect()
        };
        for (host, n) in free {
            self.unpark(&host, n);
        }
    }
}

pub use crate::store::DELIVERY_ROLE;

/// How long this process certainly holds [`DELIVERY_ROLE`]: from the
/// moment its last successful hold was sent, the store's lease less a
/// tenth (the database dated the hold later, and another replica takes
/// the role only a whole lease after that), and no longer than this
/// process holds its own lease ([`TaskStore::held_for`]).
pub struct Tenure {
    base: Instant,
    /// Nanoseconds after `base`; 0: not held.
    until: std::sync::atomic::AtomicU64,
    lease: Option<Duration>,
}

impl Tenure {
    fn new(lease: Option<Duration>) -> Self {
        Tenure {
            base: Instant::now(),
            until: std::sync::atomic::AtomicU64::new(0),
            lease,
        }
    }

    /// Held for ever: a store of one process.
    fn for_ever() -> Self {
        let tenure = Tenure::new(None);
        tenure.record_hold(Instant::now());
        tenure
    }

    /// A hold sent at `sent` succeeded.
    fn record_hold(&self, sent: Instant) {
        let until = match self.lease {
            None => u64::MAX,
            Some(lease) => {
                let end = (sent + lease - lease / 10).saturating_duration_since(self.base);
                u64::try_from(end.as_nanos()).unwrap_or(u64::MAX).max(1)
            }
        };
        self.until
            .fetch_max(until, std::sync::atomic::Ordering::AcqRel);
    }

    fn end(&self) {
        self.until.store(0, std::sync::atomic::Ordering::Release);
    }

    fn held_for(&self, store: &dyn TaskStore) -> Duration {
        let until = self.until.load(std::sync::atomic::Ordering::Acquire);
        let now = Instant::now().saturating_duration_since(self.base);
        let now = u64::try_from(now.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(until.saturating_sub(now)).min(store.held_for())
    }
}

/// Delivers push notifications until `shutdown` while this process holds
/// [`DELIVERY_ROLE`], so that replicas sharing a store deliver each once
/// (at least once) and in order. The role is renewed every third of the
/// store's lease; an attempt starts only if it ends (its timeout, capped
/// at half the lease) while the role is certainly held, so no two
/// processes' attempts overlap: the next holder takes the role a lease
/// after the last renewal, when this one's attempts are over. A renewal
/// that fails is tried again while the role is still held; once it is
/// lost (taken, or run out), delivery stops, waits for the attempts in
/// flight, and starts again, from the outbox's start, once the role is
/// held again. What the old holder finishes or defers after the role
/// changed hands is refused by the store (the role's epoch). A store of
/// one process is always held.
pub async fn deliver_while_held(
    store: Arc<dyn TaskStore>,
    mut settings: Settings,
    signal: Arc<Notify>,
    shutdown: CancellationToken,
) {
    let lease = store.lease();
    let every = lease.map_or(POLL_EVERY, |l| l / 3);
    if let Some(lease) = lease
        && settings.timeout > lease / 2
    {
        tracing::info!(
            timeout = ?lease / 2,
            "push delivery attempts time out after half the replicas' lease (less than --push-timeout)"
        );
        settings.timeout = lease / 2;
    }
    loop {
        let tenure = Arc::new(Tenure::new(lease));
        loop {
            let sent = Instant::now();
            match store.hold(DELIVERY_ROLE).await {
                Ok(true) => {
                    tenure.record_hold(sent);
                    break;
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "cannot tell who delivers push notifications"),
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
        }
        tracing::info!("delivering push notifications");
        let held = shutdown.child_token();
        let dispatcher = Dispatcher::holding(
            store.clone(),
            settings.clone(),
            signal.clone(),
            tenure.clone(),
        );
        let mut running = tokio::spawn(dispatcher.run(held.clone()));
        loop {
            tokio::select! {
                _ = &mut running => return,
                () = tokio::time::sleep(every) => {}
            }
            let sent = Instant::now();
            match store.hold(DELIVERY_ROLE).await {
                Ok(true) => {
                    tenure.record_hold(sent);
                    continue;
                }
                Ok(false) => tracing::info!("another replica delivers push notifications now"),
                Err(e) if !tenure.held_for(&*store).is_zero() => {
                    tracing::warn!(error = %e, "cannot renew the push delivery role; trying again");
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot renew the push delivery role; stopping")
                }
            }
            break;
        }
        tenure.end();
        held.cancel();
        // The dispatcher ends once its attempts in flight have.
        let _ = running.await;
    }
}

impl Dispatcher {
    pub fn new(store: Arc<dyn TaskStore>, settings: Settings, signal: Arc<Notify>) -> Self {
        Self::holding(store, settings, signal, Arc::new(Tenure::for_ever()))
    }

    /// A dispatcher that delivers while `tenure` lasts.
    fn holding(
        store: Arc<dyn TaskStore>,
        settings: Settings,
        signal: Arc<Notify>,
        tenure: Arc<Tenure>,
    ) -> Self {
        Dispatcher {
            store,
            settings: Arc::new(settings),
            signal,
            tenure,
            hosts: Default::default(),
            pool: Default::default(),
        }
    }

    /// Runs until `shutdown`: reads what was committed to the outbox since
    /// the last read (on a signal, each [`POLL_EVERY`], or at once while
    /// reads come back full), starts an attempt at every due queue head
    /// while slots are free, and hears attempts end. At shutdown it stops
    /// starting attempts; those in flight end with the runtime, and what
    /// they did not finish stays in the outbox for the next start.
    pub async fn run(self, shutdown: CancellationToken) {
        let attempts = tokio_util::task::TaskTracker::new();
        let (ended_tx, mut ended_rx) = tokio::sync::mpsc::unbounded_channel::<Ended>();
        let mut schedule = Schedule::default();
        let mut read = true;
        // A steady tick, not a sleep restarted each turn: under load the
        // loop never idles for a whole POLL_EVERY.
        let mut tick = tokio::time::interval(POLL_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if read && schedule.can_read() {
                read = false;
                let limit = READ_BATCH.min(MAX_LOADED - schedule.loaded);
                match self.store.outbox(schedule.read_up_to, limit).await {
                    Ok(batch) => {
                        read = batch.len() == limit;
                        let now = now_ms();
                        for delivery in batch {
                            schedule.add(delivery, now);
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "push outbox unreadable; retrying"),
                }
            }
            let shed = schedule.shed();
            if !shed.is_empty() {
                tracing::warn!(
                    entries = shed.len(),
                    "push backlog full: gave up the newest notifications of the principals over their share"
                );
                read = true;
                let store = self.store.clone();
                let settings = self.settings.clone();
                attempts.spawn(async move {
                    for delivery in shed {
                        count(&settings, |m| m.ended("shed"));
                        if let Err(e) = store.finish_delivery(delivery.seq).await {
                            tracing::warn!(error = %e, "a shed push notification stays in the outbox");
                        }
                    }
                });
            }
            let next_timer = schedule.wake(now_ms());
            while let Some(delivery) = schedule.start_next() {
                let (store, settings, hosts, pool, ended, tenure) = (
                    self.store.clone(),
                    self.settings.clone(),
                    self.hosts.clone(),
                    self.pool.clone(),
                    ended_tx.clone(),
                    self.tenure.clone(),
                );
                attempts.spawn(async move {
                    use futures_util::FutureExt as _;
                    let key = queue_of(&delivery);
                    let attempt = attempt(&*store, &settings, &hosts, &pool, &tenure, delivery);
                    // A panic must not leave the queue in flight for good
                    // (the host's slot is given back by its guard).
                    let (done, freed) = std::panic::AssertUnwindSafe(attempt)
                        .catch_unwind()
                        .await
                        .unwrap_or_else(|_| {
                            tracing::error!("push delivery attempt panicked; retrying");
                            (DeliveryOutcome::StoreFailed, None)
                        });
                    let _ = ended.send(Ended { key, done, freed });
                });
            }
            if let Some(metrics) = &self.settings.metrics {
                metrics.pending(schedule.loaded);
            }
            // Read on at once while reads come back full and there is room;
            // at the limit, only when deliveries have finished some.
            if read && schedule.can_read() {
                continue;
            }
            let wait = next_timer.unwrap_or(POLL_EVERY);
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = self.signal.notified() => read = true,
                Some(ended) = ended_rx.recv() => {
                    let now = now_ms();
                    // An attempt that took no slot (its config gone, the
                    // store failing, its host down) lets no parked queue
                    // go by itself; then every host with room does.
                    let mut slotless = false;
                    for ended in std::iter::once(ended).chain(std::iter::from_fn(|| ended_rx.try_recv().ok())) {
                        slotless |= ended.freed.is_none() && !matches!(ended.done, DeliveryOutcome::Parked(_));
                        schedule.ended(ended, &self.hosts, now);
                    }
                    if slotless {
                        schedule.unpark_all(&self.hosts);
                    }
                }
                () = tokio::time::sleep(wait) => {}
                _ = tick.tick() => {
                    read = true;
                    schedule.unpark_all(&self.hosts);
                    self.pool.sweep();
                }
            }
        }
        attempts.close();
        // Among replicas, the attempts in flight end within their timeout
        // before the role is given up: the next holder must not deliver
        // beside them. (Alone, they end with the runtime.)
        if self.tenure.lease.is_some()
            && tokio::time::timeout(self.settings.timeout * 2, attempts.wait())
                .await
                .is_err()
        {
            tracing::warn!("push delivery attempts still in flight after twice their timeout");
        }
        // What is left is no longer this process's to deliver.
        if let Some(metrics) = &self.settings.metrics {
            metrics.pending(0);
        }
    }
}

fn lock(hosts: &Mutex<Hosts>) -> std::sync::MutexGuard<'_, Hosts> {
    hosts.lock().unwrap_or_else(|e| e.into_inner())
}

/// One attempt at `delivery`, and what the outbox records of it; the host
/// whose slot it took and gave back, if it took one.
async fn attempt(
    store: &dyn TaskStore,
    settings: &Settings,
    hosts: &Mutex<Hosts>,
    pool: &Pool,
    tenure: &Tenure,
    delivery: Delivery,
) -> (DeliveryOutcome, Option<Arc<str>>) {
    // The config, the version of the client that set it, and the trace of
    // the run that last wrote the task.
    let found = match store.get(&delivery.tenant, &delivery.task_id).await {
        Ok(stored) => stored.and_then(|s| {
            let protocol = s.record.push_protocol(&delivery.config_id);
            let trace = s.record.trace;
            s.record
                .push_configs
                .into_iter()
                .find(|c| c.id == delivery.config_id)
                .map(|config| (config, protocol, trace))
        }),
        Err(e) => {
            tracing::warn!(error = %e, "push delivery: task unreadable; retrying");
            return (DeliveryOutcome::StoreFailed, None);
        }
    };
    // Deleted (or the task purged): nothing more goes to it.
    let Some((config, protocol, trace)) = found else {
        count(settings, |m| m.ended("dropped"));
        return (finish(store, &delivery).await, None);
    };
    let host = host_key(&config.url);
    // Only an attempt that ends while the role is certainly held: another
    // holder must never deliver beside it (tried again after POLL_EVERY,
    // by this process if it renews the role, else by the next holder).
    if tenure.held_for(store) < settings.timeout {
        return (DeliveryOutcome::StoreFailed, None);
    }
    // Its connection writes nothing after this (a pause mid-attempt must
    // not put a stale request on the wire once another holder may exist).
    let deadline = Instant::now() + settings.timeout;
    let gate = lock(hosts).enter(&host, Instant::now());
    let (outcome, freed) = match gate {
        Gate::Full => return (DeliveryOutcome::Parked(host), None),
        // Counted as an attempt, so a dead host's backlog is given up in
        // time without a connection per notification.
        Gate::Down(left) => (
            PostOutcome::Retry {
                why: "the host did not answer lately".into(),
                after: Some(left),
            },
            None,
        ),
        Gate::Go => {
            let slot = HostSlot {
                hosts,
                host: host.clone(),
                left: false,
            };
            let start = Instant::now();
            let webhook = Webhook {
                config: &config,
                protocol,
                v0_3_body: settings.v0_3_body.is_some(),
                trace: &trace,
            };
            let outcome = post(settings, pool, &host, webhook, &delivery.event, deadline).await;
            count(settings, |m| m.attempted(start.elapsed()));
            slot.leave(&outcome);
            (outcome, Some(host))
        }
    };
    (
        record(store, settings, &delivery, &config, outcome).await,
        freed,
    )
}

/// A host slot taken by an attempt: given back with the outcome, or, if
/// the attempt unwinds, as if the host had answered.
struct HostSlot<'a> {
    hosts: &'a Mutex<Hosts>,
    host: Arc<str>,
    left: bool,
}

impl HostSlot<'_> {
    fn leave(mut self, outcome: &PostOutcome) {
        self.left = true;
        lock(self.hosts).leave(&self.host, outcome, Instant::now());
    }
}

impl Drop for HostSlot<'_> {
    fn drop(&mut self) {
        if !self.left {
            let unwound = PostOutcome::Final(String::new());
            lock(self.hosts).leave(&self.host, &unwound, Instant::now());
        }
    }
}

/// Removes a finished entry. If the store fails, the entry stays at the
/// head of its queue and is tried again (POSTed again: a duplicate) before
/// anything after it: a queue that went on past an entry still in the
/// outbox would have it sent again after the task's later events, the
/// terminal one included, by whoever delivers next (measured by the fault
/// harness: a stale WORKING after COMPLETED, after a 0.6 s cut from the
/// database).
async fn finish(store: &dyn TaskStore, delivery: &Delivery) -> DeliveryOutcome {
    match store.finish_delivery(delivery.seq).await {
        Ok(()) => DeliveryOutcome::Finished,
        Err(e) => {
            tracing::warn!(error = %e, seq = delivery.seq, "push outbox entry not removed; it is sent again before the next");
            DeliveryOutcome::StoreFailed
        }
    }
}

/// What [`MAX_IN_FLIGHT_PER_HOST`] counts by: `scheme://host:port`.
fn host_key(url: &str) -> Arc<str> {
    match super::egress::parse(url) {
        Ok(t) => format!(
            "{}://{}:{}",
            if t.https { "https" } else { "http" },
            t.host,
            t.port
        )
        .into(),
        Err(_) => url.into(),
    }
}

/// Records in the push metrics, when there are any.
fn count(settings: &Settings, record: impl FnOnce(&crate::metrics::PushMetrics)) {
    if let Some(metrics) = &settings.metrics {
        record(metrics);
    }
}

/// Records an attempt's outcome in the outbox (and the metrics).
async fn record(
    store: &dyn TaskStore,
    settings: &Settings,
    delivery: &Delivery,
    config: &TaskPushNotificationConfig,
    outcome: PostOutcome,
) -> DeliveryOutcome {
    let host = super::egress::parse(&config.url)
        .map(|t| t.host)
        .unwrap_or_default();
    let attempts = delivery.attempts + 1;
    let (why, after) = match outcome {
        PostOutcome::Delivered => {
            count(settings, |m| m.ended("delivered"));
            return finish(store, delivery).await;
        }
        PostOutcome::Final(why) => {
            tracing::warn!(task = %delivery.task_id, config = %config.id, %host, %why, "push notification refused; not retried");
            count(settings, |m| m.ended("refused"));
            return finish(store, delivery).await;
        }
        PostOutcome::Retry { why, after } => (why, after),
        PostOutcome::Unreachable(why) => (why, None),
    };
    if attempts >= settings.max_attempts {
        tracing::warn!(task = %delivery.task_id, config = %config.id, %host, %why, attempts, "push notification given up");
        count(settings, |m| m.ended("given_up"));
        return finish(store, delivery).await;
    }
    count(settings, |m| m.retried());
    let wait = after.unwrap_or_else(|| backoff(attempts)).min(MAX_RETRY);
    tracing::debug!(task = %delivery.task_id, config = %config.id, %host, %why, attempts, ?wait, "push notification to be retried");
    // Rounded up: a wait under a millisecond is still a wait.
    let not_before_ms = now_ms() + wait.as_micros().div_ceil(1000) as i64;
    // The schedule keeps the attempt count and the wait even when the
    // store does not take them (a restart then counts from the last ones
    // stored).
    if let Err(e) = store
        .defer_delivery(delivery.seq, attempts, not_before_ms)
        .await
    {
        tracing::warn!(error = %e, seq = delivery.seq, "push outbox retry not recorded");
    }
    DeliveryOutcome::Deferred {
        attempts,
        not_before_ms,
    }
}

/// The wait after `attempts` failed attempts: [`FIRST_RETRY`] doubling,
/// at most [`MAX_RETRY`], with full jitter over its upper half so that
/// retries of many notifications do not arrive together.
fn backoff(attempts: u32) -> Duration {
    let exp = FIRST_RETRY.saturating_mul(1 << attempts.saturating_sub(1).min(16));
    let cap = exp.min(MAX_RETRY);
    cap.mul_f64(0.5 + fastrand::f64() / 2.0)
}

/// Where a notification goes, and the trace it carries on.
#[derive(Clone, Copy)]
struct Webhook<'a> {
    config: &'a TaskPushNotificationConfig,
    /// The version of the client that set the config: its payloads'.
    protocol: Protocol,
    /// Whether a 0.3 body is written (`Settings::v0_3_body`).
    v0_3_body: bool,
    /// A W3C `traceparent`, or "".
    trace: &'a str,
}

/// POSTs the event (an encoded `StreamResponse`) to the config's webhook
/// within the timeout, writing nothing after `deadline`: as ProtoJSON
/// (spec §4.3), or for a 0.3 client's config in 0.3's JSON form
/// ([`Settings::v0_3_body`]).
async fn post(
    settings: &Settings,
    pool: &Pool,
    host: &Arc<str>,
    webhook: Webhook<'_>,
    event: &[u8],
    deadline: Instant,
) -> PostOutcome {
    use prost::Message as _;
    let body = match StreamResponse::decode(event)
        .map_err(|e| e.to_string())
        .and_then(|e| match (webhook.protocol, settings.v0_3_body) {
            (Protocol::V0_3, Some(write)) => write(e),
            _ => crate::json::to_string(&e).map_err(|e| e.to_string()),
        }) {
        Ok(body) => body,
        Err(e) => return PostOutcome::Final(format!("the stored event does not encode: {e}")),
    };
    let send = send(settings, pool, host, webhook, body, deadline);
    match tokio::time::timeout(settings.timeout, send).await {
        Ok(outcome) => outcome,
        Err(_) => PostOutcome::Unreachable(format!("no answer within {:?}", settings.timeout)),
    }
}

async fn send(
    settings: &Settings,
    pool: &Pool,
    host: &Arc<str>,
    webhook: Webhook<'_>,
    body: String,
    deadline: Instant,
) -> PostOutcome {
    let target = match super::egress::parse(&webhook.config.url) {
        Ok(target) => target,
        Err(e) => return PostOutcome::Final(e.to_string()),
    };
    let body = bytes::Bytes::from(body);
    let build = || request(&target, webhook, body.clone());
    // A kept-alive connection first: its address passed the policy when it
    // was made. If the webhook closed it meanwhile, a new one is made.
    if let Some((sender, until)) = pool.take(host) {
        let request = match build() {
            Ok(request) => request,
            Err(e) => return PostOutcome::Final(e),
        };
        until.set(deadline);
        if let Ok((answer, sender)) = exchange(sender, request).await {
            pool.keep(host, sender, until);
            return classify(&answer);
        }
    }
    // Resolved now, connecting only to what the policy permits (DNS
    // rebinding gets nowhere).
    let addrs = match settings.egress.resolve(&target).await {
        Ok(addrs) => addrs,
        Err(e @ super::egress::UrlError::Refused { .. }) => {
            return PostOutcome::Final(e.to_string());
        }
        Err(e) => return PostOutcome::Unreachable(e.to_string()),
    };
    let until = WriteUntil::new(deadline);
    let tcp = match connect(&addrs).await {
        Ok(tcp) => Fenced::new(tcp, until.clone()),
        Err(e) => return PostOutcome::Unreachable(format!("connect: {e}")),
    };
    let request = match build() {
        Ok(request) => request,
        Err(e) => return PostOutcome::Final(e),
    };
    let sender = if target.https {
        match tls(&target, tcp).await {
            Ok(stream) => handshake(stream).await,
            Err(e) => return PostOutcome::Unreachable(format!("TLS: {e}")),
        }
    } else {
        handshake(tcp).await
    };
    let answer = match sender {
        Ok(sender) => exchange(sender, request).await,
        Err(e) => Err(e),
    };
    match answer {
        Ok((answer, sender)) => {
            pool.keep(host, sender, until);
            classify(&answer)
        }
        Err(e) => PostOutcome::Unreachable(e),
    }
}

type Sender = hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>;
/// A kept connection, since when it is idle, and the end of the time its
/// socket may write in ([`WriteUntil`]), which the next attempt moves.
type Idle = (Instant, Sender, Arc<WriteUntil>);

/// Idle HTTP/1.1 connections kept alive per webhook host, at most
/// [`MAX_IN_FLIGHT_PER_HOST`] each, for [`IDLE_CONNECTION`].
#[derive(Default)]
struct Pool {
    idle: Mutex<HashMap<Arc<str>, Vec<Idle>>>,
}

impl Pool {
    fn take(&self, host: &Arc<str>) -> Option<(Sender, Arc<WriteUntil>)> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let senders = idle.get_mut(host)?;
        let found = std::iter::from_fn(|| senders.pop())
            .find(|(since, sender, _)| since.elapsed() < IDLE_CONNECTION && !sender.is_closed())
            .map(|(_, sender, until)| (sender, until));
        if senders.is_empty() {
            idle.remove(host);
        }
        found
    }

    fn keep(&self, host: &Arc<str>, sender: Option<Sender>, until: Arc<WriteUntil>) {
        let Some(sender) = sender.filter(|s| !s.is_closed()) else {
            return;
        };
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() >= MAX_POOLED_HOSTS && !idle.contains_key(host) {
            sweep(&mut idle);
            if idle.len() >= MAX_POOLED_HOSTS {
                return;
            }
        }
        let senders = idle.entry(host.clone()).or_default();
        if senders.len() < MAX_IN_FLIGHT_PER_HOST {
            senders.push((Instant::now(), sender, until));
        }
    }

    /// Closes the connections idle longer than [`IDLE_CONNECTION`].
    fn sweep(&self) {
        sweep(&mut self.idle.lock().unwrap_or_else(|e| e.into_inner()));
    }
}

fn sweep(idle: &mut HashMap<Arc<str>, Vec<Idle>>) {
    idle.retain(|_, senders| {
        senders
            .retain(|(since, sender, _)| since.elapsed() < IDLE_CONNECTION && !sender.is_closed());
        !senders.is_empty()
    });
}

async fn connect(addrs: &[std::net::SocketAddr]) -> std::io::Result<tokio::net::TcpStream> {
    let mut last = None;
    for addr in addrs {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(tcp) => {
                let _ = tcp.set_nodelay(true);
                return Ok(tcp);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no address")))
}

async fn tls<IO>(
    target: &WebhookTarget,
    tcp: IO,
) -> Result<tokio_rustls::client::TlsStream<IO>, String>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    // Built once: the web PKI's roots do not change while serving.
    static CONFIG: std::sync::OnceLock<Result<Arc<rustls::ClientConfig>, String>> =
        std::sync::OnceLock::new();
    let config = CONFIG
        .get_or_init(|| {
            let mut roots = rustls::RootCertStore::empty();
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
            rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map(|b| Arc::new(b.with_root_certificates(roots).with_no_client_auth()))
            .map_err(|e| e.to_string())
        })
        .clone()?;
    let name =
        rustls_pki_types::ServerName::try_from(target.host.clone()).map_err(|e| e.to_string())?;
    tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())
}

/// The POST: the config's credentials as `Authorization`, its token as
/// [`TOKEN_HEADER`], the run's trace as `traceparent`.
fn request(
    target: &WebhookTarget,
    webhook: Webhook<'_>,
    body: bytes::Bytes,
) -> Result<http::Request<http_body_util::Full<bytes::Bytes>>, String> {
    let config = webhook.config;
    let uri: http::Uri = config.url.parse().map_err(|e| format!("{e}"))?;
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let host = if target.host.contains(':') {
        format!("[{}]:{}", target.host, target.port)
    } else {
        format!("{}:{}", target.host, target.port)
    };
    let mut request = http::Request::post(path)
        .header(http::header::HOST, host)
        .header(
            http::header::CONTENT_TYPE,
            match webhook.protocol {
                Protocol::V0_3 if webhook.v0_3_body => CONTENT_TYPE_V0_3,
                _ => CONTENT_TYPE,
            },
        )
        .header(http::header::USER_AGENT, "a2a-lifecycle");
    if let Some(auth) = &config.authentication
        && !auth.scheme.is_empty()
    {
        request = request.header(
            http::header::AUTHORIZATION,
            format!("{} {}", auth.scheme, auth.credentials).trim_end(),
        );
    }
    if !config.token.is_empty() {
        request = request.header(TOKEN_HEADER, &config.token);
    }
    if !webhook.trace.is_empty() {
        request = request.header(crate::telemetry::TRACEPARENT, webhook.trace);
    }
    // The header values came from the client: one it could not send is
    // refused here without saying what it held.
    request
        .body(http_body_util::Full::new(body))
        .map_err(|_| "the config's credentials or token are not valid header values".to_owned())
}

/// An HTTP/1.1 connection over `io`; its driver runs until the connection
/// closes or its sender is dropped.
async fn handshake<IO>(io: IO) -> Result<Sender, String>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    Ok(sender)
}

/// Sends the request; the status and the `Retry-After` header of the
/// answer, and the connection, once the answer's body is read (at most
/// [`MAX_ANSWER_BYTES`], else it is not kept).
async fn exchange(
    mut sender: Sender,
    request: http::Request<http_body_util::Full<bytes::Bytes>>,
) -> Result<((http::StatusCode, Option<Duration>), Option<Sender>), String> {
    use http_body_util::BodyExt;
    sender.ready().await.map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let retry_after = response
        .headers()
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(retry_after);
    let status = response.status();
    // The answer is read to its end, so the connection can take the next
    // request; a webhook that answers at length does not keep it.
    let read = http_body_util::Limited::new(response.into_body(), MAX_ANSWER_BYTES)
        .collect()
        .await;
    Ok(((status, retry_after), read.ok().map(|_| sender)))
}

/// `Retry-After`: seconds, or an HTTP date.
fn retry_after(value: &str) -> Option<Duration> {
    if let Ok(seconds) = value.trim().parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(
        at.duration_since(std::time::SystemTime::now())
            .unwrap_or_default(),
    )
}

/// 2xx: delivered; 408, 429, 5xx: retried; anything else (a redirect
/// included) is final.
fn classify((status, after): &(http::StatusCode, Option<Duration>)) -> PostOutcome {
    let code = status.as_u16();
    if status.is_success() {
        PostOutcome::Delivered
    } else if code == 408 || code == 429 || status.is_server_error() {
        PostOutcome::Retry {
            why: format!("answered {code}"),
            after: *after,
        }
    } else {
        PostOutcome::Final(format!("answered {code}"))
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_classified_by_status() {
        let class = |code: u16| classify(&(http::StatusCode::from_u16(code).unwrap(), None));
        for code in [200, 201, 202, 204] {
            assert_eq!(class(code), PostOutcome::Delivered, "{code}");
        }
        for code in [408, 429, 500, 502, 503, 504] {
            assert!(matches!(class(code), PostOutcome::Retry { .. }), "{code}");
        }
        for code in [301, 302, 307, 400, 401, 403, 404, 410, 422] {
            assert!(matches!(class(code), PostOutcome::Final(_)), "{code}");
        }
    }

    /// A request whose attempt's time ended before it was written (the
    /// process paused past it) is never written: not on a kept connection,
    /// not on a new one. Among replicas another holder may be delivering
    /// the task's later events by then.
    #[tokio::test]
    async fn a_request_is_not_written_once_its_attempts_time_has_ended() {
        let wait = Duration::from_secs(10);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let (tx, mut received) = tokio::sync::mpsc::unbounded_channel();
        let shutdown = CancellationToken::new();
        tokio::spawn(super::super::receiver::receive(
            listener,
            None,
            move |n| drop(tx.send(n)),
            shutdown.clone(),
        ));
        let settings = Settings {
            egress: Egress::new(vec!["127.0.0.0/8".parse().unwrap()]),
            ..Default::default()
        };
        let config = TaskPushNotificationConfig {
            id: "c".into(),
            url,
            ..Default::default()
        };
        let webhook = Webhook {
            config: &config,
            protocol: Protocol::V1_0,
            v0_3_body: false,
            trace: "",
        };
        let (pool, host) = (Pool::default(), host_key(&config.url));
        let body = || crate::json::to_string(&StreamResponse::default()).unwrap();
        let post = |deadline| {
            tokio::time::timeout(
                wait,
                send(&settings, &pool, &host, webhook, body(), deadline),
            )
        };
        // In time: delivered, and its connection kept.
        assert_eq!(
            post(Instant::now() + wait).await.unwrap(),
            PostOutcome::Delivered
        );
        tokio::time::timeout(wait, received.recv())
            .await
            .unwrap()
            .unwrap();
        // Too late: the kept connection refuses to write, then a new one.
        let late = post(Instant::now()).await.unwrap();
        assert!(matches!(late, PostOutcome::Unreachable(_)), "{late:?}");
        // The next attempt in time is delivered, and it is the only other
        // notification the webhook got.
        assert_eq!(
            post(Instant::now() + wait).await.unwrap(),
            PostOutcome::Delivered
        );
        tokio::time::timeout(wait, received.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(received.try_recv().is_err(), "the late request was written");
        shutdown.cancel();
    }

    #[test]
    fn backoff_doubles_with_jitter_up_to_the_cap() {
        for attempts in 1..20 {
            let wait = backoff(attempts);
            let cap = FIRST_RETRY
                .saturating_mul(1 << (attempts - 1).min(16))
                .min(MAX_RETRY);
            assert!(
                wait >= cap / 2 && wait <= cap,
                "{attempts}: {wait:?} of {cap:?}"
            );
        }
        assert_eq!(retry_after("7"), Some(Duration::from_secs(7)));
        assert_eq!(retry_after("soon"), None);
        let past = httpdate::fmt_http_date(std::time::SystemTime::UNIX_EPOCH);
        assert_eq!(retry_after(&past), Some(Duration::ZERO));
    }

    fn entry(seq: u64, task: &str) -> Delivery {
        owned_entry(seq, task, "u")
    }

    fn owned_entry(seq: u64, task: &str, owner: &str) -> Delivery {
        Delivery {
            seq,
            tenant: "t".into(),
            task_id: task.into(),
            owner: owner.into(),
            config_id: "hook".into(),
            event: Vec::new(),
            attempts: 0,
            not_before_ms: 0,
        }
    }

    /// One principal's tasks hold at most their share of the slots; the
    /// others' heads go past them, and its own go as its attempts end.
    #[test]
    fn a_principal_holds_at_most_its_share_of_the_slots() {
        let hosts = Mutex::new(Hosts::default());
        let mut schedule = Schedule::default();
        let mut seq = 0;
        for i in 0..MAX_IN_FLIGHT_PER_PRINCIPAL + 10 {
            seq += 1;
            schedule.add(owned_entry(seq, &format!("hog-{i}"), "hog"), 0);
        }
        seq += 1;
        schedule.add(owned_entry(seq, "other", "other"), 0);
        let mut started = Vec::new();
        while let Some(d) = schedule.start_next() {
            started.push(d);
        }
        let hog = started.iter().filter(|d| d.owner == "hog").count();
        assert_eq!(hog, MAX_IN_FLIGHT_PER_PRINCIPAL);
        assert!(started.iter().any(|d| d.owner == "other"), "the other went");
        // One of the hog's ends: one more of its own goes.
        let first = started.remove(0);
        schedule.ended(ended(&first, DeliveryOutcome::Finished), &hosts, 0);
        let next = schedule.start_next().expect("the hog's next");
        assert_eq!(next.owner, "hog");
        assert!(schedule.start_next().is_none());
    }

    /// With the backlog full, a principal over its share gives up its
    /// newest entries (never a head in flight) so reading can go on; one
    /// within its share loses nothing.
    #[test]
    fn a_full_backlog_sheds_the_principals_over_their_share() {
        let mut schedule = Schedule::default();
        let mut seq = 0;
        // The hog: one queue in flight and many of one entry each.
        for i in 0..MAX_LOADED - 100 {
            seq += 1;
            schedule.add(owned_entry(seq, &format!("hog-{}", i % 1000), "hog"), 0);
        }
        for i in 0..100 {
            seq += 1;
            schedule.add(owned_entry(seq, &format!("small-{i}"), "small"), 0);
        }
        assert!(!schedule.can_read());
        let in_flight: Vec<Delivery> = std::iter::from_fn(|| schedule.start_next()).collect();
        let shed = schedule.shed();
        assert!(shed.iter().all(|d| d.owner == "hog"), "only the hog's");
        assert_eq!(
            schedule.held[&("t".to_owned(), "hog".to_owned())],
            MAX_LOADED_PER_PRINCIPAL
        );
        assert_eq!(schedule.held[&("t".to_owned(), "small".to_owned())], 100);
        assert!(schedule.can_read(), "room to read again");
        // Every head in flight is still there.
        for d in &in_flight {
            let queue = &schedule.queues[&queue_of(d)];
            assert_eq!(queue.front().map(|h| h.seq), Some(d.seq));
        }
        assert_eq!(schedule.loaded, MAX_LOADED_PER_PRINCIPAL + 100);
    }

    fn ended(delivery: &Delivery, done: DeliveryOutcome) -> Ended {
        Ended {
            key: queue_of(delivery),
            done,
            freed: None,
        }
    }

    #[test]
    fn a_queue_has_one_head_in_flight_and_keeps_its_order() {
        let hosts = Mutex::new(Hosts::default());
        let mut schedule = Schedule::default();
        for (seq, task) in [(1, "a"), (2, "a"), (3, "b"), (4, "a")] {
            schedule.add(entry(seq, task), 0);
        }
        assert_eq!(schedule.read_up_to, 4);
        let first = schedule.start_next().unwrap();
        let second = schedule.start_next().unwrap();
        assert_eq!((first.seq, second.seq), (1, 3), "one head per queue");
        assert!(
            schedule.start_next().is_none(),
            "a's next waits for its head"
        );
        schedule.ended(ended(&first, DeliveryOutcome::Finished), &hosts, 0);
        assert_eq!(schedule.start_next().unwrap().seq, 2);
        // A retry waits for its time and holds no slot meanwhile.
        schedule.ended(
            ended(
                &second,
                DeliveryOutcome::Deferred {
                    attempts: 1,
                    not_before_ms: 500,
                },
            ),
            &hosts,
            0,
        );
        assert!(schedule.start_next().is_none());
        assert_eq!(schedule.wake(100), Some(Duration::from_millis(400)));
        assert_eq!(schedule.wake(500), None);
        let retried = schedule.start_next().unwrap();
        assert_eq!((retried.seq, retried.attempts), (3, 1));
        assert_eq!(schedule.loaded, 3);
    }

    #[test]
    fn a_queue_parked_for_its_host_goes_when_a_slot_frees() {
        let hosts = Mutex::new(Hosts::default());
        let host: Arc<str> = "http://a:80".into();
        let mut schedule = Schedule::default();
        schedule.add(entry(1, "a"), 0);
        let head = schedule.start_next().unwrap();
        for _ in 0..MAX_IN_FLIGHT_PER_HOST {
            assert_eq!(lock(&hosts).enter(&host, Instant::now()), Gate::Go);
        }
        assert_eq!(lock(&hosts).enter(&host, Instant::now()), Gate::Full);
        schedule.ended(
            ended(&head, DeliveryOutcome::Parked(host.clone())),
            &hosts,
            0,
        );
        assert!(schedule.start_next().is_none(), "waits for its host");
        lock(&hosts).leave(&host, &PostOutcome::Delivered, Instant::now());
        schedule.unpark(&host, 1);
        assert_eq!(schedule.start_next().unwrap().seq, 1);
        // Parked after its host had room again: it goes at once.
        schedule.ended(
            ended(&head, DeliveryOutcome::Parked(host.clone())),
            &hosts,
            0,
        );
        assert_eq!(schedule.start_next().unwrap().seq, 1);
        // Parked while full; the slot comes free without the schedule
        // hearing of it (the attempt that had it went elsewhere): the
        // look at every parked host lets it go.
        assert_eq!(lock(&hosts).enter(&host, Instant::now()), Gate::Go);
        assert_eq!(lock(&hosts).enter(&host, Instant::now()), Gate::Full);
        schedule.ended(
            ended(&head, DeliveryOutcome::Parked(host.clone())),
            &hosts,
            0,
        );
        schedule.unpark_all(&hosts);
        assert!(schedule.start_next().is_none(), "still full");
        lock(&hosts).leave(&host, &PostOutcome::Delivered, Instant::now());
        schedule.unpark_all(&hosts);
        assert_eq!(schedule.start_next().unwrap().seq, 1);
    }

    #[test]
    fn a_store_failure_retries_after_a_poll_interval_and_bytes_bound_reading() {
        let hosts = Mutex::new(Hosts::default());
        let mut schedule = Schedule::default();
        let mut big = entry(1, "a");
        big.event = vec![0; MAX_LOADED_BYTES];
        schedule.add(big, 0);
        assert!(!schedule.can_read(), "a full byte budget stops reading");
        let head = schedule.start_next().unwrap();
        schedule.ended(ended(&head, DeliveryOutcome::StoreFailed), &hosts, 0);
        assert!(schedule.start_next().is_none());
        let poll = POLL_EVERY.as_millis() as i64;
        assert_eq!(schedule.wake(poll - 1), Some(Duration::from_millis(1)));
        assert_eq!(schedule.wake(poll), None);
        let head = schedule.start_next().unwrap();
        schedule.ended(ended(&head, DeliveryOutcome::Finished), &hosts, poll);
        assert!(schedule.can_read(), "room again");
        assert_eq!((schedule.loaded, schedule.loaded_bytes), (0, 0));
    }

    #[test]
    fn a_host_that_does_not_answer_is_down_for_a_growing_while() {
        let mut hosts = Hosts::default();
        let host: Arc<str> = "http://dead:80".into();
        let now = Instant::now();
        let unreachable = PostOutcome::Unreachable("connect: refused".into());
        assert_eq!(hosts.enter(&host, now), Gate::Go);
        assert_eq!(hosts.enter(&host, now), Gate::Go);
        hosts.leave(&host, &unreachable, now);
        // The second failure of the same burst does not extend it.
        hosts.leave(&host, &unreachable, now);
        let Gate::Down(first) = hosts.enter(&host, now) else {
            panic!("down after failing")
        };
        assert!(first <= FIRST_RETRY, "{first:?}");
        // After it, an attempt goes; failing again doubles the wait.
        let later = now + first;
        assert_eq!(hosts.enter(&host, later), Gate::Go);
        hosts.leave(&host, &unreachable, later);
        let Gate::Down(second) = hosts.enter(&host, later) else {
            panic!("down again")
        };
        assert!(
            second >= FIRST_RETRY && second <= 2 * FIRST_RETRY,
            "{second:?}"
        );
        // Any answer, even a refusal, brings it back.
        let after = later + second;
        assert_eq!(hosts.enter(&host, after), Gate::Go);
        hosts.leave(&host, &PostOutcome::Final("answered 404".into()), after);
        assert_eq!(hosts.enter(&host, after), Gate::Go);
        assert!(!hosts.is_full(&host));
    }
}
