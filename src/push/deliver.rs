//! Delivering the outbox: each queued notification is POSTed to its
//! config's webhook, in commit order per config, retried until it is taken
//! or given up.
//!
//! - Each (tenant, task, config) is a queue: only its oldest entry is ever
//!   in flight, so a config sees its events in commit order (the terminal
//!   one last), and the queues run side by side, so one slow or dead
//!   webhook never delays another's: at most [`MAX_IN_FLIGHT`] POSTs at
//!   once, of which at most [`MAX_IN_FLIGHT_PER_HOST`] to one webhook host
//!   (however many tasks name it), and queues due soonest go first, so
//!   those waiting out a retry never hold up one that is due.
//! - A 2xx answer finishes an entry. Connection errors, timeouts
//!   ([`Settings::timeout`]) and 408, 429 or 5xx answers are retried with
//!   exponential backoff and jitter ([`FIRST_RETRY`] doubling to
//!   [`MAX_RETRY`]), honouring `Retry-After`; after
//!   [`Settings::max_attempts`] the entry is given up and logged. Any other
//!   answer is final. Redirects are not followed.
//! - The config is read from the task at each attempt: a deleted config (or
//!   a purged task) gets nothing more.
//! - Connections go only to addresses [`Egress`] permits, resolved at each
//!   attempt. Credentials and tokens are never logged.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::egress::{Egress, Target};
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
/// Queues looked at in one pass over the outbox, besides those in flight.
pub const QUEUES_PER_PASS: usize = 1024;
/// POSTs in flight at once, over all webhooks.
pub const MAX_IN_FLIGHT: usize = 512;
/// POSTs in flight at once to one webhook host (`scheme://host:port`): a
/// slow or dead host holds at most this many of [`MAX_IN_FLIGHT`].
pub const MAX_IN_FLIGHT_PER_HOST: usize = 16;
/// Queues whose webhook host is remembered (the pass skips a queue whose
/// host is at [`MAX_IN_FLIGHT_PER_HOST`]); past this the memory is
/// cleared and learnt again.
const MAX_KNOWN_QUEUES: usize = 100_000;
/// How often the outbox is looked at without a signal (entries that
/// became due, entries another process wrote).
pub const POLL_EVERY: Duration = Duration::from_secs(1);
/// The media type of a notification's body (spec §4.3).
pub const CONTENT_TYPE: &str = "application/a2a+json";
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
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            egress: Egress::default(),
            timeout: DEFAULT_TIMEOUT,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
        }
    }
}

/// What one attempt came to.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
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

/// Delivers the store's outbox until shut down.
pub struct Dispatcher {
    store: Arc<dyn TaskStore>,
    settings: Arc<Settings>,
    /// Raised when a commit added to the outbox, and when an attempt ends.
    signal: Arc<Notify>,
    load: Arc<Mutex<Load>>,
}

/// What is in flight, by queue and by webhook host, and which hosts are
/// down.
#[derive(Default)]
struct Load {
    in_flight: HashSet<QueueKey>,
    /// Queues due but waiting for a slot at their host: the pass reads
    /// this many more heads, so that they never hide a queue behind them.
    parked: HashSet<QueueKey>,
    /// The host of each queue seen (learnt when its config is read).
    host_of: HashMap<QueueKey, Arc<str>>,
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

impl Load {
    fn host_is_full(&self, key: &QueueKey) -> bool {
        self.host_of
            .get(key)
            .and_then(|host| self.per_host.get(host))
            .is_some_and(|&n| n >= MAX_IN_FLIGHT_PER_HOST)
    }

    /// Takes one of `host`'s slots for `key`'s attempt, if it is up and has
    /// one free.
    fn enter_host(&mut self, key: &QueueKey, host: Arc<str>, now: Instant) -> Gate {
        if self.host_of.len() >= MAX_KNOWN_QUEUES {
            self.host_of.clear();
            self.parked.clear();
        }
        self.host_of.insert(key.clone(), host.clone());
        if let Some(&(_, until)) = self.down.get(&host)
            && until > now
        {
            return Gate::Down(until - now);
        }
        let n = self.per_host.entry(host).or_default();
        if *n >= MAX_IN_FLIGHT_PER_HOST {
            self.parked.insert(key.clone());
            return Gate::Full;
        }
        *n += 1;
        Gate::Go
    }

    /// Gives the slot back. A host that did not answer is down for
    /// [`backoff`] of its consecutive failures (counted once per down
    /// period, however many attempts were in flight); any answer brings
    /// it back up.
    fn leave_host(&mut self, host: &Arc<str>, outcome: &Outcome, now: Instant) {
        if let Some(n) = self.per_host.get_mut(host) {
            *n -= 1;
            if *n == 0 {
                self.per_host.remove(host);
            }
        }
        if !matches!(outcome, Outcome::Unreachable(_)) {
            self.down.remove(host);
            return;
        }
        if self.down.len() >= MAX_KNOWN_QUEUES {
            self.down.retain(|_, (_, until)| *until > now);
        }
        let (failures, until) = self.down.entry(host.clone()).or_insert((0, now));
        if *until <= now {
            *failures += 1;
            *until = now + backoff(*failures);
        }
    }
}

impl Dispatcher {
    pub fn new(store: Arc<dyn TaskStore>, settings: Settings, signal: Arc<Notify>) -> Self {
        Dispatcher {
            store,
            settings: Arc::new(settings),
            signal,
            load: Default::default(),
        }
    }

    /// Runs until `shutdown`: each pass starts an attempt at every queue's
    /// head that is due, not already in flight and whose host has a slot
    /// free, then waits for a signal, the next entry to fall due, or
    /// [`POLL_EVERY`]. Attempts in flight at shutdown are dropped; their
    /// entries stay in the outbox for the next start.
    pub async fn run(self, shutdown: CancellationToken) {
        let attempts = tokio_util::task::TaskTracker::new();
        loop {
            let wait = match self.pass(&attempts).await {
                Ok(next_due) => next_due.map_or(POLL_EVERY, |d| d.min(POLL_EVERY)),
                Err(e) => {
                    tracing::warn!(error = %e, "push outbox unreadable; retrying");
                    POLL_EVERY
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = self.signal.notified() => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
        attempts.close();
    }

    /// One pass; how long until the next entry not yet due falls due.
    async fn pass(
        &self,
        attempts: &tokio_util::task::TaskTracker,
    ) -> Result<Option<Duration>, crate::store::StoreError> {
        let (busy, parked) = {
            let load = self.lock_load();
            (load.in_flight.len(), load.parked.len())
        };
        if busy >= MAX_IN_FLIGHT {
            // An attempt's end raises the signal.
            return Ok(None);
        }
        let heads = self
            .store
            .outbox_heads(QUEUES_PER_PASS + busy + parked)
            .await?;
        let now = now_ms();
        for delivery in heads {
            // Soonest due first: the rest are later still.
            if delivery.not_before_ms > now {
                let wait = Duration::from_millis((delivery.not_before_ms - now) as u64);
                return Ok(Some(wait));
            }
            let key = (
                delivery.tenant.clone(),
                delivery.task_id.clone(),
                delivery.config_id.clone(),
            );
            {
                let mut load = self.lock_load();
                if load.in_flight.len() >= MAX_IN_FLIGHT {
                    break;
                }
                if load.in_flight.contains(&key) || load.host_is_full(&key) {
                    continue;
                }
                load.parked.remove(&key);
                load.in_flight.insert(key.clone());
            }
            let (store, settings, signal, load) = (
                self.store.clone(),
                self.settings.clone(),
                self.signal.clone(),
                self.load.clone(),
            );
            attempts.spawn(async move {
                attempt(&*store, &settings, &load, &key, delivery).await;
                lock(&load).in_flight.remove(&key);
                signal.notify_one();
            });
        }
        Ok(None)
    }

    fn lock_load(&self) -> std::sync::MutexGuard<'_, Load> {
        lock(&self.load)
    }
}

fn lock(load: &Mutex<Load>) -> std::sync::MutexGuard<'_, Load> {
    load.lock().unwrap_or_else(|e| e.into_inner())
}

/// One attempt at `delivery`, and what the outbox records of it. None
/// when the webhook's host has no slot free: the queue waits for one.
async fn attempt(
    store: &dyn TaskStore,
    settings: &Settings,
    load: &Mutex<Load>,
    key: &QueueKey,
    delivery: Delivery,
) {
    let config = match store.get(&delivery.tenant, &delivery.task_id).await {
        Ok(stored) => stored.and_then(|s| {
            s.record
                .push_configs
                .into_iter()
                .find(|c| c.id == delivery.config_id)
        }),
        Err(e) => {
            tracing::warn!(error = %e, "push delivery: task unreadable; retrying");
            // Not at once: the queue is tried again when this returns.
            tokio::time::sleep(POLL_EVERY).await;
            return;
        }
    };
    let result = match config {
        // Deleted (or the task purged): nothing more goes to it.
        None => store.finish_delivery(delivery.seq).await,
        Some(config) => {
            let host = host_key(&config.url);
            let gate = lock(load).enter_host(key, host.clone(), Instant::now());
            let outcome = match gate {
                // Waits, in memory, for a slot: the pass skips it meanwhile.
                Gate::Full => return,
                // Counted as an attempt, so a dead host's backlog is given
                // up in time without a connection per notification.
                Gate::Down(left) => Outcome::Retry {
                    why: "the host did not answer lately".into(),
                    after: Some(left),
                },
                Gate::Go => {
                    let outcome = post(settings, &config, &delivery.event).await;
                    lock(load).leave_host(&host, &outcome, Instant::now());
                    outcome
                }
            };
            record(store, settings, &delivery, &config, outcome).await
        }
    };
    if let Err(e) = result {
        tracing::warn!(error = %e, seq = delivery.seq, "push outbox not updated");
        tokio::time::sleep(POLL_EVERY).await;
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

/// Records an attempt's outcome in the outbox.
async fn record(
    store: &dyn TaskStore,
    settings: &Settings,
    delivery: &Delivery,
    config: &TaskPushNotificationConfig,
    outcome: Outcome,
) -> Result<(), crate::store::StoreError> {
    let host = super::egress::parse(&config.url)
        .map(|t| t.host)
        .unwrap_or_default();
    let attempts = delivery.attempts + 1;
    let (why, after) = match outcome {
        Outcome::Delivered => return store.finish_delivery(delivery.seq).await,
        Outcome::Final(why) => {
            tracing::warn!(task = %delivery.task_id, config = %config.id, %host, %why, "push notification refused; not retried");
            return store.finish_delivery(delivery.seq).await;
        }
        Outcome::Retry { why, after } => (why, after),
        Outcome::Unreachable(why) => (why, None),
    };
    if attempts >= settings.max_attempts {
        tracing::warn!(task = %delivery.task_id, config = %config.id, %host, %why, attempts, "push notification given up");
        return store.finish_delivery(delivery.seq).await;
    }
    let wait = after.unwrap_or_else(|| backoff(attempts)).min(MAX_RETRY);
    tracing::debug!(task = %delivery.task_id, config = %config.id, %host, %why, attempts, ?wait, "push notification to be retried");
    store
        .defer_delivery(delivery.seq, attempts, now_ms() + wait.as_millis() as i64)
        .await
}

/// The wait after `attempts` failed attempts: [`FIRST_RETRY`] doubling,
/// at most [`MAX_RETRY`], with full jitter over its upper half so that
/// retries of many notifications do not arrive together.
fn backoff(attempts: u32) -> Duration {
    let exp = FIRST_RETRY.saturating_mul(1 << attempts.saturating_sub(1).min(16));
    let cap = exp.min(MAX_RETRY);
    cap.mul_f64(0.5 + fastrand::f64() / 2.0)
}

/// POSTs the event (an encoded `StreamResponse`) to the config's webhook
/// as ProtoJSON, within the timeout.
async fn post(settings: &Settings, config: &TaskPushNotificationConfig, event: &[u8]) -> Outcome {
    use prost::Message as _;
    let body = match StreamResponse::decode(event)
        .map_err(|e| e.to_string())
        .and_then(|e| crate::json::to_string(&e).map_err(|e| e.to_string()))
    {
        Ok(body) => body,
        Err(e) => return Outcome::Final(format!("the stored event does not encode: {e}")),
    };
    match tokio::time::timeout(settings.timeout, send(settings, config, body)).await {
        Ok(outcome) => outcome,
        Err(_) => Outcome::Unreachable(format!("no answer within {:?}", settings.timeout)),
    }
}

async fn send(settings: &Settings, config: &TaskPushNotificationConfig, body: String) -> Outcome {
    let retry = Outcome::Unreachable;
    let target = match super::egress::parse(&config.url) {
        Ok(target) => target,
        Err(e) => return Outcome::Final(e.to_string()),
    };
    // Resolved now, connecting only to what the policy permits (DNS
    // rebinding gets nowhere).
    let addrs = match settings.egress.resolve(&target).await {
        Ok(addrs) => addrs,
        Err(e @ super::egress::UrlError::Refused { .. }) => return Outcome::Final(e.to_string()),
        Err(e) => return retry(e.to_string()),
    };
    let tcp = match connect(&addrs).await {
        Ok(tcp) => tcp,
        Err(e) => return retry(format!("connect: {e}")),
    };
    let request = match request(&target, config, body) {
        Ok(request) => request,
        Err(e) => return Outcome::Final(e),
    };
    let response = if target.https {
        match tls(&target, tcp).await {
            Ok(stream) => exchange(stream, request).await,
            Err(e) => return retry(format!("TLS: {e}")),
        }
    } else {
        exchange(tcp, request).await
    };
    match response {
        Ok(response) => classify(&response),
        Err(e) => retry(e),
    }
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

async fn tls(
    target: &Target,
    tcp: tokio::net::TcpStream,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let name =
        rustls_pki_types::ServerName::try_from(target.host.clone()).map_err(|e| e.to_string())?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())
}

/// The POST: the config's credentials as `Authorization`, its token as
/// [`TOKEN_HEADER`].
fn request(
    target: &Target,
    config: &TaskPushNotificationConfig,
    body: String,
) -> Result<http::Request<http_body_util::Full<bytes::Bytes>>, String> {
    let uri: http::Uri = config.url.parse().map_err(|e| format!("{e}"))?;
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let host = if target.host.contains(':') {
        format!("[{}]:{}", target.host, target.port)
    } else {
        format!("{}:{}", target.host, target.port)
    };
    let mut request = http::Request::post(path)
        .header(http::header::HOST, host)
        .header(http::header::CONTENT_TYPE, CONTENT_TYPE)
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
    // The header values came from the client: one it could not send is
    // refused here without saying what it held.
    request
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .map_err(|_| "the config's credentials or token are not valid header values".to_owned())
}

/// Sends the request over one HTTP/1.1 connection; the status and the
/// `Retry-After` header of the answer.
async fn exchange<IO>(
    io: IO,
    request: http::Request<http_body_util::Full<bytes::Bytes>>,
) -> Result<(http::StatusCode, Option<Duration>), String>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io))
            .await
            .map_err(|e| e.to_string())?;
    let driver = tokio::spawn(connection);
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string());
    driver.abort();
    let response = response?;
    let retry_after = response
        .headers()
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(retry_after);
    Ok((response.status(), retry_after))
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
fn classify((status, after): &(http::StatusCode, Option<Duration>)) -> Outcome {
    let code = status.as_u16();
    if status.is_success() {
        Outcome::Delivered
    } else if code == 408 || code == 429 || status.is_server_error() {
        Outcome::Retry {
            why: format!("answered {code}"),
            after: *after,
        }
    } else {
        Outcome::Final(format!("answered {code}"))
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
            assert_eq!(class(code), Outcome::Delivered, "{code}");
        }
        for code in [408, 429, 500, 502, 503, 504] {
            assert!(matches!(class(code), Outcome::Retry { .. }), "{code}");
        }
        for code in [301, 302, 307, 400, 401, 403, 404, 410, 422] {
            assert!(matches!(class(code), Outcome::Final(_)), "{code}");
        }
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

    fn queue(n: usize) -> QueueKey {
        ("t".into(), format!("task-{n}"), "hook".into())
    }

    #[test]
    fn a_host_takes_at_most_its_share_of_attempts() {
        let mut load = Load::default();
        let (host, other): (Arc<str>, Arc<str>) = ("http://a:80".into(), "http://b:80".into());
        let now = Instant::now();
        for n in 0..MAX_IN_FLIGHT_PER_HOST {
            assert_eq!(load.enter_host(&queue(n), host.clone(), now), Gate::Go);
        }
        let waiting = queue(MAX_IN_FLIGHT_PER_HOST);
        assert_eq!(load.enter_host(&waiting, host.clone(), now), Gate::Full);
        assert!(load.host_is_full(&waiting), "the pass skips it");
        assert!(load.parked.contains(&waiting), "and reads past it");
        assert_eq!(load.enter_host(&queue(99), other, now), Gate::Go);
        load.leave_host(&host, &Outcome::Delivered, now);
        assert!(!load.host_is_full(&waiting));
        assert_eq!(load.enter_host(&waiting, host, now), Gate::Go);
    }

    #[test]
    fn a_host_that_does_not_answer_is_down_for_a_growing_while() {
        let mut load = Load::default();
        let host: Arc<str> = "http://dead:80".into();
        let now = Instant::now();
        let unreachable = Outcome::Unreachable("connect: refused".into());
        assert_eq!(load.enter_host(&queue(1), host.clone(), now), Gate::Go);
        assert_eq!(load.enter_host(&queue(2), host.clone(), now), Gate::Go);
        load.leave_host(&host, &unreachable, now);
        // The second failure of the same burst does not extend it.
        load.leave_host(&host, &unreachable, now);
        let Gate::Down(first) = load.enter_host(&queue(3), host.clone(), now) else {
            panic!("down after failing")
        };
        assert!(first <= FIRST_RETRY, "{first:?}");
        // After it, an attempt goes; failing again doubles the wait.
        let later = now + first;
        assert_eq!(load.enter_host(&queue(3), host.clone(), later), Gate::Go);
        load.leave_host(&host, &unreachable, later);
        let Gate::Down(second) = load.enter_host(&queue(4), host.clone(), later) else {
            panic!("down again")
        };
        assert!(
            second >= FIRST_RETRY && second <= 2 * FIRST_RETRY,
            "{second:?}"
        );
        // Any answer, even a refusal, brings it back.
        let after = later + second;
        assert_eq!(load.enter_host(&queue(4), host.clone(), after), Gate::Go);
        load.leave_host(&host, &Outcome::Final("answered 404".into()), after);
        assert_eq!(load.enter_host(&queue(5), host, after), Gate::Go);
    }
}
