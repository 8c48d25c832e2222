//! Client connections, from accept to close, and the bounds on them: how
//! many, how long a new one may take to say what it is and each HTTP/1.1
//! request to send its headers, how long one may stay open with nothing
//! to do, how many streams each may open, how dead peers are found, and
//! how long shutdown waits for the rest.
//!
//! An A2A server is reachable by clients it does not control; without these
//! a few silent sockets or one connection opening thousands of streams take
//! it down for everyone. Every bound is named here with its default, and
//! `serve` has a flag for each (README, Limits).
//!
//! The accept loop and each connection's task are this module's own, on
//! hyper's server connections (the ones tonic's server uses): tonic's
//! server has no idle timeout, no header deadline for HTTP/1.1 and no way
//! to close one connection gracefully, and each of those needs the
//! connection's task. What tonic's server did per request is done here
//! too: the connection's addresses in the request's extensions
//! ([`tonic::Request::remote_addr`]). The client's `grpc-timeout` is the
//! gRPC binding's to read (`service::grpc`).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::server::{Connected, TcpConnectInfo};
use tower::Service;

/// The peer a client address counts as for per-peer bounds (connections,
/// authentication failures): an IPv4 address itself (an IPv4-mapped IPv6
/// address as its IPv4 address), an IPv6 address as its /64, which one
/// host is usually given whole (RFC 6177) and may spread over at will.
pub fn peer_key(addr: std::net::IpAddr) -> std::net::IpAddr {
    match addr.to_canonical() {
        std::net::IpAddr::V6(v6) => {
            std::net::IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into())
        }
        v4 => v4,
    }
}

/// Connections served at once; one more is closed at accept.
pub const MAX_CONNECTIONS: usize = 4096;
/// Connections one peer ([`peer_key`]) may hold at once; one more is
/// closed at accept. Well under [`MAX_CONNECTIONS`], so one address can
/// never take them all.
pub const MAX_CONNECTIONS_PER_PEER: usize = 512;
/// Time a request has, once its headers arrived, to send its whole body;
/// past it the request ends with an error (A2A's requests are one message
/// each: none streams its body).
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// Concurrent HTTP/2 streams per connection, advertised in SETTINGS
/// (`SETTINGS_MAX_CONCURRENT_STREAMS`); h2 refuses streams past it.
pub const MAX_CONCURRENT_STREAMS: u32 = 256;
/// Time a new connection has to send the HTTP/2 preface, and an HTTP/1.1
/// connection the headers of each request (counted from when it is ready
/// for the next one); it is closed otherwise.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Interval of the HTTP/2 pings that find dead peers.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// How long a ping may go unanswered before the connection is closed.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long shutdown waits for open connections to finish their calls
/// before cutting them.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// How long a connection may stay open with no request in flight (no open
/// HTTP/2 stream) before the server closes it: gracefully, with GOAWAY
/// over HTTP/2, so a request crossing it is retried by the client instead
/// of failing. An HTTP/1.1 connection waiting for its next request is
/// closed sooner, at [`HANDSHAKE_TIMEOUT`]: hyper times the wait for a
/// request's headers from the moment it is ready for them.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a JSON binding's event stream (SSE) may go without an event
/// before a comment line is sent: below the idle timeouts of proxies
/// (commonly 60 s) and below the 5 s read timeout the official Python
/// client's HTTP library has by default, so an idle subscription is not
/// cut by either.
pub const SSE_KEEPALIVE: Duration = Duration::from_secs(4);
/// The pause after a failed accept (out of descriptors, most often), so
/// the accept loop does not spin while the condition lasts.
const ACCEPT_RETRY: Duration = Duration::from_millis(10);

/// The bounds a server applies (see the constants for what each means).
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub max_connections_per_peer: usize,
    pub body_timeout: Duration,
    pub max_concurrent_streams: u32,
    pub handshake_timeout: Duration,
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    pub shutdown_grace: Duration,
    pub idle_timeout: Duration,
    pub sse_keepalive: Duration,
    /// Bytes of answers one caller is sent per second
    /// ([`READ_BYTES_PER_SECOND`]; 0: unpaced).
    pub read_bytes_per_second: u64,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: MAX_CONNECTIONS,
            max_connections_per_peer: MAX_CONNECTIONS_PER_PEER,
            body_timeout: BODY_TIMEOUT,
            max_concurrent_streams: MAX_CONCURRENT_STREAMS,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            keepalive_interval: KEEPALIVE_INTERVAL,
            keepalive_timeout: KEEPALIVE_TIMEOUT,
            shutdown_grace: SHUTDOWN_GRACE,
            idle_timeout: IDLE_TIMEOUT,
            sse_keepalive: SSE_KEEPALIVE,
            read_bytes_per_second: READ_BYTES_PER_SECOND,
        }
    }
}

/// Raises the soft limit on open descriptors to the hard limit (a server
/// starts with 1,024 on most systems, below [`MAX_CONNECTIONS`]), and warns
/// when the connection cap still exceeds it: past it, accepting fails for
/// everyone instead of refusing one more client.
pub fn raise_descriptor_limit(max_connections: usize) {
    #[cfg(unix)]
    {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit/setrlimit read and write the struct passed.
        let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
        if !ok {
            tracing::warn!("could not read the descriptor limit");
            return;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            // SAFETY: as above.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
                limit = raised;
            }
        }
        // Room for the store's files, the listener and logs beside the
        // connections.
        let needed = max_connections as u64 + 64;
        // `rlim_t` is u64 here, another width elsewhere.
        #[allow(clippy::unnecessary_cast)]
        let current = limit.rlim_cur as u64;
        if current < needed {
            tracing::warn!(
                descriptors = current,
                max_connections,
                "the descriptor limit is below the connection cap: lower --max-connections or raise the hard limit"
            );
        }
    }
    #[cfg(not(unix))]
    let _ = max_connections;
}

/// Accepted connections under the caps: one past the server's cap, or
/// past its peer's ([`ConnectionLimits::max_connections_per_peer`]), is
/// closed unread after [`REFUSED_HELD_FOR`] (the client sees the
/// connection end; the log says which cap), and those being served are
/// unaffected.
pub fn bounded<S>(
    accepted: S,
    limits: &ConnectionLimits,
    tls: bool,
) -> impl Stream<Item = std::io::Result<Conn>> + Send + 'static
where
    S: Stream<Item = std::io::Result<TcpStream>> + Send + 'static,
{
    let open = Arc::new(Open::default());
    let max = limits.max_connections;
    let per_peer = limits.max_connections_per_peer;
    let handshake = limits.handshake_timeout;
    accepted.filter_map(move |accepted| {
        let open = open.clone();
        async move {
            let stream = match accepted {
                Ok(stream) => stream,
                // Accept errors (EMFILE, a reset before accept) are the
                // listener's; tonic logs and goes on.
                Err(e) => return Some(Err(e)),
            };
            let peer = stream.peer_addr().ok().map(|a| peer_key(a.ip()));
            let slot = match open.take(peer, max, per_peer) {
                Ok(slot) => slot,
                Err(Full::Server) => {
                    if let Some(refused) = open.refusals.count_refusal(tokio::time::Instant::now())
                    {
                        tracing::warn!(
                            max_connections = max,
                            refused,
                            "connections refused: at the cap"
                        );
                    }
                    open.hold_refused(stream);
                    return None;
                }
                Err(Full::Peer) => {
                    if let Some(refused) = open.refusals.count_refusal(tokio::time::Instant::now())
                    {
                        tracing::warn!(
                            peer = ?peer,
                            max_connections_per_peer = per_peer,
                            refused,
                            "connections refused: a peer at its cap (the last one named)"
                        );
                    }
                    open.hold_refused(stream);
                    return None;
                }
            };
            Some(Ok(Conn {
                stream,
                _slot: slot,
                // Under TLS the first bytes are a ClientHello, not HTTP:
                // the TLS handshake has the deadline instead (`serve`).
                handshake: (!tls).then(|| Handshake::new(handshake)),
            }))
        }
    })
}

/// What peers ([`peer_key`]) hold, counted per peer: each holding is
/// given back when its [`PeerHeld`] drops, and a peer leaves the table with
/// its last, so the table holds no more peers than holdings.
#[derive(Default, Clone)]
pub struct PerPeer(Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>);

impl PerPeer {
    /// One more holding for `peer`, unless it holds `max` already.
    pub fn enter(&self, peer: std::net::IpAddr, max: usize) -> Option<PeerHeld> {
        let mut held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let count = held.get(&peer).copied().unwrap_or(0);
        if count >= max {
            return None;
        }
        held.insert(peer, count + 1);
        Some(PeerHeld {
            table: self.clone(),
            peer,
        })
    }
}

/// A peer's holding in a [`PerPeer`], given back when dropped.
pub struct PeerHeld {
    table: PerPeer,
    peer: std::net::IpAddr,
}

impl Drop for PeerHeld {
    fn drop(&mut self) {
        let mut held = self.table.0.lock().unwrap_or_else(|e| e.into_inner());
        if let std::collections::hash_map::Entry::Occupied(mut count) = held.entry(self.peer) {
            *count.get_mut() -= 1;
            if *count.get() == 0 {
                count.remove();
            }
        }
    }
}

/// The connections open, in all and per peer.
#[derive(Default)]
struct Open {
    /// Refusals, logged at most once per [`REFUSALS_LOGGED_EVERY`].
    refusals: Refusals,
    all: AtomicUsize,
    by_peer: PerPeer,
    /// Refused connections held ([`REFUSED_HELD_FOR`]).
    held: Arc<AtomicUsize>,
}

/// Bytes of answers one caller (a principal, or an address) may be sent
/// per second, by default, paced by the service (`--read-bytes-per-second`;
/// 0 turns pacing off): thousands of reads a
/// second of a typical task (kilobytes), two or three of the largest
/// (`MAX_TASK_BYTES`, 3 MiB).
pub const READ_BYTES_PER_SECOND: u64 = 8 << 20;

/// How long a refused connection is held, unread, before it is closed: a
/// client that connects again the moment it is closed (a loop past its
/// cap) makes one attempt per hold instead of thousands a second, each an
/// accept, a close and its own connect on the machine's cores.
pub const REFUSED_HELD_FOR: Duration = Duration::from_secs(1);
/// Refused connections held at once ([`REFUSED_HELD_FOR`]); past it one is
/// closed at once, so holding costs at most this many descriptors.
pub const MAX_REFUSED_HELD: usize = 256;

/// How often refused connections are logged at most: a client opening
/// connections in a loop past its cap must not write a log line each.
pub const REFUSALS_LOGGED_EVERY: Duration = Duration::from_secs(1);

/// Refused connections since the last log line, and when that was.
#[derive(Default)]
struct Refusals {
    since_logged: AtomicU64,
    last_logged: std::sync::Mutex<Option<tokio::time::Instant>>,
}

impl Refusals {
    /// Counts a refusal; `Some(n)` when it is time to log the `n` refused
    /// since the last line (this one included).
    fn count_refusal(&self, now: tokio::time::Instant) -> Option<u64> {
        let refused = self.since_logged.fetch_add(1, Ordering::AcqRel) + 1;
        let mut last = self.last_logged.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|at| now.duration_since(at) < REFUSALS_LOGGED_EVERY) {
            return None;
        }
        *last = Some(now);
        self.since_logged.fetch_sub(refused, Ordering::AcqRel);
        Some(refused)
    }
}

/// Which cap refused a connection.
enum Full {
    Server,
    Peer,
}

impl Open {
    /// Closes a refused connection after [`REFUSED_HELD_FOR`], or at once
    /// when [`MAX_REFUSED_HELD`] are held already.
    fn hold_refused(&self, stream: TcpStream) {
        if self.held.fetch_add(1, Ordering::AcqRel) >= MAX_REFUSED_HELD {
            self.held.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        let held = self.held.clone();
        tokio::spawn(async move {
            tokio::time::sleep(REFUSED_HELD_FOR).await;
            drop(stream);
            held.fetch_sub(1, Ordering::AcqRel);
        });
    }

    fn take(
        self: &Arc<Self>,
        peer: Option<std::net::IpAddr>,
        max: usize,
        per_peer: usize,
    ) -> Result<ConnectionSlot, Full> {
        if self.all.fetch_add(1, Ordering::AcqRel) >= max {
            self.all.fetch_sub(1, Ordering::AcqRel);
            return Err(Full::Server);
        }
        let held = match peer.map(|peer| self.by_peer.enter(peer, per_peer)) {
            Some(None) => {
                self.all.fetch_sub(1, Ordering::AcqRel);
                return Err(Full::Peer);
            }
            Some(held) => held,
            None => None,
        };
        Ok(ConnectionSlot {
            open: self.clone(),
            _peer: held,
        })
    }
}

/// A connection's place under the caps, given back when it closes.
struct ConnectionSlot {
    open: Arc<Open>,
    _peer: Option<PeerHeld>,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.open.all.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Watches a new connection's first bytes until it has said what it is:
/// the HTTP/2 preface (24 bytes), or the end of an HTTP/1.1 request's
/// headers (an empty line).
struct Handshake {
    deadline: Pin<Box<Sleep>>,
    seen: usize,
    /// The last bytes read (at most 3), to find `\r\n\r\n` across reads.
    tail: Vec<u8>,
    http2: Option<bool>,
}

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

impl Handshake {
    fn new(timeout: Duration) -> Self {
        Handshake {
            deadline: Box::pin(tokio::time::sleep(timeout)),
            seen: 0,
            tail: Vec::new(),
            http2: None,
        }
    }

    /// Takes newly read bytes; true once the handshake is complete.
    fn read(&mut self, bytes: &[u8]) -> bool {
        if self.http2.is_none() && !bytes.is_empty() {
            self.http2 = Some(bytes[0] == PREFACE[0]);
        }
        if self.http2 == Some(true) {
            self.seen += bytes.len();
            return self.seen >= PREFACE.len();
        }
        let mut window = std::mem::take(&mut self.tail);
        window.extend_from_slice(bytes);
        if window.windows(4).any(|w| w == b"\r\n\r\n") {
            return true;
        }
        let keep = window.len().saturating_sub(3);
        self.tail = window.split_off(keep);
        false
    }
}

/// An accepted connection: its place under the cap, its handshake
/// deadline, and no vectored writes, so small responses share a write.
///
/// h2 copies a DATA frame's payload into its write buffer, where the frames
/// of many responses accumulate and go out in one write, only below a
/// chaining threshold: 256 bytes when the connection supports vectored
/// writes, 1 KiB when not. A larger payload is chained instead, and the
/// buffer must be written before another frame can join it. Most of this
/// server's responses (a task with its artifact and history) are between
/// the two, so with vectored writes each cost a `writev` of its own;
/// without, the responses of many requests share one (measured on blocking
/// SendMessage: 1.2 writes per response before, a fraction after).
pub struct Conn {
    stream: TcpStream,
    _slot: ConnectionSlot,
    handshake: Option<Handshake>,
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        let Some(handshake) = this.handshake.as_mut() else {
            return polled;
        };
        match polled {
            Poll::Ready(Ok(())) => {
                if handshake.read(&buf.filled()[before..]) {
                    this.handshake = None;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => match handshake.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the client did not finish its handshake in time",
                ))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    // `is_write_vectored` keeps its default, false: see [`Conn`].
}

impl Connected for Conn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

/// Serves the connections `incoming` yields with `service` until
/// `shutdown` completes; then closes each gracefully (HTTP/2 GOAWAY: calls
/// in flight finish, no new ones start), waits up to
/// `limits.shutdown_grace` for them, and cuts whatever is left.
pub async fn serve<S>(
    incoming: impl Stream<Item = std::io::Result<Conn>>,
    service: S,
    limits: &ConnectionLimits,
    tls: Option<Arc<Tls>>,
    shutdown: impl Future<Output = ()>,
) where
    S: Service<Request<TimedBody>, Response = Response<tonic::body::Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let builder = Arc::new(builder(limits));
    let connections = TaskTracker::new();
    // Fired at shutdown: each connection closes gracefully.
    let draining = CancellationToken::new();
    // Fired when the grace is over: each connection is dropped.
    let cut = CancellationToken::new();
    let idle_timeout = limits.idle_timeout;
    let body_timeout = limits.body_timeout;
    let mut incoming = std::pin::pin!(incoming);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let conn = tokio::select! {
            () = &mut shutdown => break,
            next = incoming.next() => match next {
                Some(Ok(conn)) => conn,
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_RETRY).await;
                    continue;
                }
                None => break,
            },
        };
        let (service, builder, draining, cut) = (
            service.clone(),
            builder.clone(),
            draining.clone(),
            cut.clone(),
        );
        let tls = tls.clone();
        let handshake_timeout = limits.handshake_timeout;
        connections.spawn(async move {
            let info = conn.connect_info();
            let Some(tls) = tls else {
                let info = ConnInfo {
                    tcp: info,
                    client: None,
                    body_timeout,
                };
                return serve_one(conn, info, service, builder, idle_timeout, draining, cut).await;
            };
            let accepted = tokio::select! {
                accepted = tokio::time::timeout(handshake_timeout, tls.accept(conn)) => accepted,
                () = cut.cancelled() => return,
            };
            match accepted {
                Ok(Ok(stream)) => {
                    // Verified by rustls against the client CA during the
                    // handshake; only its name is read here.
                    let client = stream
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|chain| chain.first())
                        .and_then(|cert| certificate_name(cert))
                        .map(|name| ClientCertificate { name });
                    let info = ConnInfo {
                        tcp: info,
                        client,
                        body_timeout,
                    };
                    serve_one(stream, info, service, builder, idle_timeout, draining, cut).await
                }
                Ok(Err(e)) => {
                    tracing::debug!(peer = ?info.remote_addr, error = %e, "TLS handshake failed")
                }
                Err(_) => tracing::debug!(peer = ?info.remote_addr, "TLS handshake timed out"),
            }
        });
    }
    draining.cancel();
    connections.close();
    if tokio::time::timeout(limits.shutdown_grace, connections.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            grace = ?limits.shutdown_grace,
            left = connections.len(),
            "shutdown grace period over: cutting the connections left"
        );
        cut.cancel();
        connections.wait().await;
    }
}

/// TLS on the port (`--tls-cert`, `--tls-key`): rustls, so TLS 1.2 and 1.3
/// only (older versions are not implemented at all), with ALPN offering
/// HTTP/2 and HTTP/1.1 so gRPC and the cards share the port as in plain
/// text. With `--tls-client-ca`, client certificates are verified against
/// that CA (mutual TLS) and name their principal ([`ClientCertificate`]).
///
/// [`Tls::reload`] reads the files again (SIGHUP: certificate rotation):
/// each new connection takes the configuration current when it arrives,
/// and connections already open keep theirs.
pub struct Tls {
    config: std::sync::RwLock<Arc<rustls::ServerConfig>>,
    files: Option<TlsFiles>,
    clients: ClientCerts,
}

/// Where [`Tls`] reads its certificate, key and client CA from.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    /// `--tls-client-ca`: mutual TLS.
    pub client_ca: Option<std::path::PathBuf>,
}

/// Whether clients present certificates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientCerts {
    /// No client certificates are asked for.
    None,
    /// Asked for and verified when sent; a client may authenticate by a
    /// bearer credential instead (mutual TLS beside `--auth`).
    Optional,
    /// A connection without a verified client certificate fails its
    /// handshake (mutual TLS as the only authentication).
    Required,
}

/// The principal name of the verified client certificate a request came
/// with: the certificate's subject common name, else its first DNS
/// subject alternative name. Put in the request's extensions; absent when
/// the client sent no certificate or one naming nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCertificate {
    pub name: String,
}

impl Tls {
    /// A certificate chain and its private key, both PEM files, and a
    /// client CA for mutual TLS (`clients` is then Optional or Required).
    pub fn from_files(files: TlsFiles, clients: ClientCerts) -> Result<Self, String> {
        let config = Self::load(&files, clients)?;
        Ok(Tls {
            config: std::sync::RwLock::new(config),
            files: Some(files),
            clients,
        })
    }

    /// A certificate chain and its private key, PEM; no client
    /// certificates.
    pub fn from_pem(cert: &[u8], key: &[u8]) -> Result<Self, String> {
        Ok(Tls {
            config: std::sync::RwLock::new(server_config(cert, key, None, ClientCerts::None)?),
            files: None,
            clients: ClientCerts::None,
        })
    }

    /// Reads the files again and makes them the configuration of new
    /// connections; on an error the one in force stays. `Ok(false)` when
    /// there are no files to read.
    pub fn reload(&self) -> Result<bool, String> {
        let Some(files) = &self.files else {
            return Ok(false);
        };
        let config = Self::load(files, self.clients)?;
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = config;
        Ok(true)
    }

    /// Whether client certificates are asked for (the cards then declare
    /// the mutual TLS scheme).
    pub fn client_certs(&self) -> ClientCerts {
        self.clients
    }

    fn load(files: &TlsFiles, clients: ClientCerts) -> Result<Arc<rustls::ServerConfig>, String> {
        let read = |path: &std::path::Path| {
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
        };
        let ca = files.client_ca.as_deref().map(read).transpose()?;
        server_config(
            &read(&files.cert)?,
            &read(&files.key)?,
            ca.as_deref(),
            clients,
        )
        .map_err(|e| format!("{} / {}: {e}", files.cert.display(), files.key.display()))
    }

    fn accept(&self, conn: Conn) -> tokio_rustls::Accept<Conn> {
        let config = self
            .config
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        tokio_rustls::TlsAcceptor::from(config).accept(conn)
    }
}

/// The rustls configuration of [`Tls`].
fn server_config(
    cert: &[u8],
    key: &[u8],
    client_ca: Option<&[u8]>,
    clients: ClientCerts,
) -> Result<Arc<rustls::ServerConfig>, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("certificate: {e}"))?;
    if chain.is_empty() {
        return Err("no certificate in the certificate file".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("private key: {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| e.to_string())?;
    let builder = match (clients, client_ca) {
        (ClientCerts::None, _) => builder.with_no_client_auth(),
        (_, None) => return Err("mutual TLS needs a client CA (--tls-client-ca)".into()),
        (clients, Some(ca)) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca) {
                let cert = cert.map_err(|e| format!("client CA: {e}"))?;
                roots.add(cert).map_err(|e| format!("client CA: {e}"))?;
            }
            if roots.is_empty() {
                return Err("no certificate in the client CA file".into());
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            );
            let verifier = match clients {
                ClientCerts::Optional => verifier.allow_unauthenticated(),
                _ => verifier,
            };
            builder
                .with_client_cert_verifier(verifier.build().map_err(|e| format!("client CA: {e}"))?)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("certificate and key: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The principal name a verified client certificate carries: its subject
/// common name, else its first DNS subject alternative name. Only the
/// first common name counts, and one that is not text (or is empty) names
/// nothing rather than letting a later field speak for the certificate.
fn certificate_name(der: &[u8]) -> Option<String> {
    use x509_parser::extensions::GeneralName;
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    if let Some(cn) = cert.subject().iter_common_name().next() {
        return cn
            .as_str()
            .ok()
            .filter(|cn| !cn.is_empty())
            .map(str::to_owned);
    }
    let san = cert.subject_alternative_name().ok()??;
    san.value.general_names.iter().find_map(|name| match name {
        GeneralName::DNSName(dns) if !dns.is_empty() => Some((*dns).to_owned()),
        _ => None,
    })
}

/// hyper's HTTP/1.1 and HTTP/2 server connections under `limits`.
fn builder(limits: &ConnectionLimits) -> ConnBuilder<TokioExecutor> {
    let mut builder = ConnBuilder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.handshake_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        .keep_alive_interval(limits.keepalive_interval)
        .keep_alive_timeout(limits.keepalive_timeout);
    builder
}

/// One connection's task: serves it until it ends, closing it gracefully
/// when it has been idle for `idle_timeout` or the server drains, and
/// dropping it when the grace is over.
async fn serve_one<IO, S>(
    io: IO,
    connect_info: ConnInfo,
    service: S,
    builder: Arc<ConnBuilder<TokioExecutor>>,
    idle_timeout: Duration,
    draining: CancellationToken,
    cut: CancellationToken,
) where
    S: Service<Request<TimedBody>, Response = Response<tonic::body::Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new());
    let service = Counted {
        inner: service,
        activity: activity.clone(),
        connect_info,
    };
    let served = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(service));
    let mut served = std::pin::pin!(served);
    let mut idle = std::pin::pin!(activity.idle_for(idle_timeout));
    let mut closing = false;
    loop {
        tokio::select! {
            done = served.as_mut() => {
                if let Err(e) = done {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            () = &mut idle, if !closing => {
                tracing::debug!(idle = ?idle_timeout, "closing an idle connection");
                closing = true;
                served.as_mut().graceful_shutdown();
            }
            () = draining.cancelled(), if !closing => {
                closing = true;
                served.as_mut().graceful_shutdown();
            }
            () = cut.cancelled() => return,
        }
    }
}

/// What a connection is doing: how many requests are in flight on it (an
/// HTTP/2 stream counts from its request to the end of its response
/// body), and since when it has had none.
struct Activity {
    open: AtomicUsize,
    /// When the last request ended, in milliseconds since `since`.
    last_end: AtomicU64,
    since: Instant,
}

impl Activity {
    fn new() -> Self {
        Activity {
            open: AtomicUsize::new(0),
            last_end: AtomicU64::new(0),
            since: Instant::now(),
        }
    }

    /// Completes once no request has been in flight for `timeout`.
    ///
    /// Requests touch only two atomics; this wakes at most once per
    /// `timeout` to look, so a busy connection costs nothing per request
    /// beyond them.
    async fn idle_for(&self, timeout: Duration) {
        let mut wake = self.since + timeout;
        loop {
            tokio::time::sleep_until(wake).await;
            if self.open.load(Ordering::Acquire) > 0 {
                wake = Instant::now() + timeout;
                continue;
            }
            let last_end =
                self.since + Duration::from_millis(self.last_end.load(Ordering::Acquire));
            if last_end + timeout <= Instant::now() {
                return;
            }
            wake = last_end + timeout;
        }
    }
}

/// A request in flight; dropped with its response body (or its handler, if
/// the request is dropped before answering).
struct InFlight(Arc<Activity>);

impl InFlight {
    /// Counts a request in flight on the connection until dropped.
    fn start(activity: Arc<Activity>) -> Self {
        activity.open.fetch_add(1, Ordering::AcqRel);
        InFlight(activity)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // The time first, then the count: a watcher that sees no request
        // in flight also sees when the last one ended.
        let elapsed = self.0.since.elapsed().as_millis() as u64;
        self.0.last_end.fetch_max(elapsed, Ordering::AcqRel);
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What every request of a connection is told about it.
#[derive(Clone)]
struct ConnInfo {
    tcp: TcpConnectInfo,
    client: Option<ClientCertificate>,
    /// [`ConnectionLimits::body_timeout`].
    body_timeout: Duration,
}

/// The per-connection service: counts requests in flight and gives each
/// the connection's addresses and client certificate.
#[derive(Clone)]
struct Counted<S> {
    inner: S,
    activity: Arc<Activity>,
    connect_info: ConnInfo,
}

impl<S> Service<Request<Incoming>> for Counted<S>
where
    S: Service<Request<TimedBody>, Response = Response<tonic::body::Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = Response<CountedBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<CountedBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Incoming>) -> Self::Future {
        let in_flight = InFlight::start(self.activity.clone());
        let deadline = Instant::now() + self.connect_info.body_timeout;
        let mut request = request.map(|body| TimedBody {
            inner: body,
            deadline,
            timer: None,
        });
        request
            .extensions_mut()
            .insert(self.connect_info.tcp.clone());
        if let Some(client) = &self.connect_info.client {
            request.extensions_mut().insert(client.clone());
        }
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            Ok(response.map(|body| CountedBody {
                body,
                _in_flight: in_flight,
            }))
        })
    }
}

/// A request body with a deadline for its end
/// ([`ConnectionLimits::body_timeout`], counted from its headers): one that
/// stalls past it ends with [`BodyTimedOut`], so a caller cannot hold a
/// request (and what it holds) open by sending its body slowly.
pub struct TimedBody {
    inner: Incoming,
    deadline: Instant,
    /// Made the first time the body has to wait: most bodies arrive with
    /// their headers, and never do.
    timer: Option<Pin<Box<Sleep>>>,
}

/// A request body not received by its deadline.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive in time")]
pub struct BodyTimedOut;

impl http_body::Body for TimedBody {
    type Data = bytes::Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(frame.map(|f| f.map_err(Into::into))),
            Poll::Pending => {
                let deadline = self.deadline;
                let timer = self
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(BodyTimedOut.into()))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A response body that keeps its request counted until it is sent or
/// dropped.
pub struct CountedBody {
    body: tonic::body::Body,
    _in_flight: InFlight,
}

impl http_body::Body for CountedBody {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, tonic::Status>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {

    /// A loop of refused connections writes a log line a second, saying
    /// how many were refused since the last.
    #[test]
    fn refusals_are_logged_at_most_once_a_second() {
        let refusals = Refusals::default();
        let start = tokio::time::Instant::now();
        assert_eq!(refusals.count_refusal(start), Some(1));
        for i in 1..1000 {
            let now = start + Duration::from_micros(i);
            assert_eq!(refusals.count_refusal(now), None);
        }
        let later = start + REFUSALS_LOGGED_EVERY;
        assert_eq!(refusals.count_refusal(later), Some(1000));
        assert_eq!(refusals.count_refusal(later), None);
    }

    #[test]
    fn an_ipv6_peer_is_its_64() {
        let key = |s: &str| peer_key(s.parse().unwrap()).to_string();
        assert_eq!(key("2001:db8:1:2:aaaa::1"), "2001:db8:1:2::");
        assert_eq!(key("2001:db8:1:2:ffff:ffff:ffff:ffff"), "2001:db8:1:2::");
        assert_eq!(key("::ffff:10.1.2.3"), "10.1.2.3");
        assert_eq!(key("192.0.2.7"), "192.0.2.7");
    }

    use super::*;

    /// The subject's first common name, else the first DNS name; a
    /// certificate naming neither names nothing.
    #[test]
    fn a_certificate_is_named_by_its_first_common_name_or_dns_name() {
        use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair};
        let name = |cns: &[&str], dns: &[&str]| {
            let mut params =
                CertificateParams::new(dns.iter().map(|d| d.to_string()).collect::<Vec<_>>())
                    .unwrap();
            params.distinguished_name = DistinguishedName::new();
            for cn in cns {
                params.distinguished_name.push(DnType::CommonName, *cn);
            }
            let cert = params.self_signed(&KeyPair::generate().unwrap()).unwrap();
            certificate_name(cert.der())
        };
        assert_eq!(
            name(&["alice"], &["bob.example.test"]).as_deref(),
            Some("alice")
        );
        assert_eq!(
            name(&[], &["bob.example.test", "c.example.test"]).as_deref(),
            Some("bob.example.test")
        );
        assert_eq!(name(&[], &[]), None);
        assert_eq!(certificate_name(b"not a certificate"), None);
    }

    #[tokio::test]
    async fn handshake_ends_at_the_preface_or_the_end_of_headers() {
        let mut h = Handshake::new(HANDSHAKE_TIMEOUT);
        assert!(!h.read(&PREFACE[..10]));
        assert!(h.read(&PREFACE[10..]));
        let mut h = Handshake::new(HANDSHAKE_TIMEOUT);
        assert!(!h.read(b"GET / HTTP/1.1\r\nHost: x\r"));
        assert!(!h.read(b"\n"));
        assert!(h.read(b"\r\n"));
        let mut h = Handshake::new(HANDSHAKE_TIMEOUT);
        assert!(!h.read(b"GET / HTTP/1.1\r\n"));
        assert!(h.read(b"\r\n"));
    }
}
