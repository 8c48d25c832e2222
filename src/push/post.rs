//! One POST of a notification to its webhook over HTTP/1.1: the body, the
//! request, the connection (kept alive, or made to an address the egress
//! policy permits, over TLS for https), and what the answer says.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::deliver::{CONTENT_TYPE, CONTENT_TYPE_V0_3, MAX_ANSWER_BYTES, Settings, TOKEN_HEADER};
use super::egress::WebhookTarget;
use super::fenced::{Fenced, WriteUntil};
use super::pool::{Pool, Sender};
use super::retry::retry_after;
use crate::lifecycle::Protocol;
use crate::proto::{StreamResponse, TaskPushNotificationConfig};

/// What one attempt's POST came to.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum PostOutcome {
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
    /// taken to be down for a while (`Hosts::leave`).
    Unreachable(String),
}

/// Where a notification goes, and the trace it carries on.
#[derive(Clone, Copy)]
pub(super) struct Webhook<'a> {
    pub(super) config: &'a TaskPushNotificationConfig,
    /// The version of the client that set the config: its payloads'.
    pub(super) protocol: Protocol,
    /// Whether a 0.3 body is written (`Settings::v0_3_body`).
    pub(super) v0_3_body: bool,
    /// A W3C `traceparent`, or "".
    pub(super) trace: &'a str,
}

/// POSTs the event (an encoded `StreamResponse`) to the config's webhook
/// within the timeout, writing nothing after `deadline`: as ProtoJSON
/// (spec §4.3), or for a 0.3 client's config in 0.3's JSON form
/// ([`Settings::v0_3_body`]).
pub(super) async fn post(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::push::egress::Egress;
    use crate::push::hosts::host_key;
    use tokio_util::sync::CancellationToken;

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
}
