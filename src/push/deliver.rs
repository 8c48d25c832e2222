//! Delivering the outbox: each queued notification is POSTed to its
//! config's webhook, in commit order per config, retried until it is taken
//! or given up.
//!
//! - Each (tenant, task, config) is a queue: only its oldest entry is ever
//!   in flight, so a config sees its events in commit order (the terminal
//!   one last), and the queues run side by side, so one slow or dead
//!   webhook never delays another's.
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

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
/// Queues looked at in one pass over the outbox.
pub const QUEUES_PER_PASS: usize = 1024;
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
}

type QueueKey = (String, String, String);

/// Delivers the store's outbox until shut down.
pub struct Dispatcher {
    store: Arc<dyn TaskStore>,
    settings: Arc<Settings>,
    /// Raised when a commit added to the outbox, and when an attempt ends.
    signal: Arc<Notify>,
    in_flight: Arc<Mutex<HashSet<QueueKey>>>,
}

impl Dispatcher {
    pub fn new(store: Arc<dyn TaskStore>, settings: Settings, signal: Arc<Notify>) -> Self {
        Dispatcher {
            store,
            settings: Arc::new(settings),
            signal,
            in_flight: Default::default(),
        }
    }

    /// Runs until `shutdown`: each pass starts an attempt at every queue's
    /// head that is due and not already in flight, then waits for a signal,
    /// the next entry to fall due, or [`POLL_EVERY`]. Attempts in flight at
    /// shutdown are dropped; their entries stay in the outbox for the next
    /// start.
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
        let heads = self.store.outbox_heads(QUEUES_PER_PASS).await?;
        let now = now_ms();
        let mut next_due: Option<Duration> = None;
        for delivery in heads {
            if delivery.not_before_ms > now {
                let wait = Duration::from_millis((delivery.not_before_ms - now) as u64);
                next_due = Some(next_due.map_or(wait, |d| d.min(wait)));
                continue;
            }
            let key = (
                delivery.tenant.clone(),
                delivery.task_id.clone(),
                delivery.config_id.clone(),
            );
            if !self.lock_in_flight().insert(key.clone()) {
                continue;
            }
            let (store, settings, signal, in_flight) = (
                self.store.clone(),
                self.settings.clone(),
                self.signal.clone(),
                self.in_flight.clone(),
            );
            attempts.spawn(async move {
                attempt(&*store, &settings, delivery).await;
                in_flight
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&key);
                signal.notify_one();
            });
        }
        Ok(next_due)
    }

    fn lock_in_flight(&self) -> std::sync::MutexGuard<'_, HashSet<QueueKey>> {
        self.in_flight.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One attempt at `delivery`, and what the outbox records of it.
async fn attempt(store: &dyn TaskStore, settings: &Settings, delivery: Delivery) {
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
            let outcome = post(settings, &config, &delivery.event).await;
            record(store, settings, &delivery, &config, outcome).await
        }
    };
    if let Err(e) = result {
        tracing::warn!(error = %e, seq = delivery.seq, "push outbox not updated");
        tokio::time::sleep(POLL_EVERY).await;
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
    match outcome {
        Outcome::Delivered => store.finish_delivery(delivery.seq).await,
        Outcome::Final(why) => {
            tracing::warn!(task = %delivery.task_id, config = %config.id, %host, %why, "push notification refused; not retried");
            store.finish_delivery(delivery.seq).await
        }
        Outcome::Retry { why, .. } if attempts >= settings.max_attempts => {
            tracing::warn!(task = %delivery.task_id, config = %config.id, %host, %why, attempts, "push notification given up");
            store.finish_delivery(delivery.seq).await
        }
        Outcome::Retry { why, after } => {
            let wait = after.unwrap_or_else(|| backoff(attempts)).min(MAX_RETRY);
            tracing::debug!(task = %delivery.task_id, config = %config.id, %host, %why, attempts, ?wait, "push notification to be retried");
            store
                .defer_delivery(delivery.seq, attempts, now_ms() + wait.as_millis() as i64)
                .await
        }
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
        Err(_) => Outcome::Retry {
            why: format!("no answer within {:?}", settings.timeout),
            after: None,
        },
    }
}

async fn send(settings: &Settings, config: &TaskPushNotificationConfig, body: String) -> Outcome {
    let retry = |why: String| Outcome::Retry { why, after: None };
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
}
