//! The accept loop and each connection's task: connections served until
//! shutdown, closed when idle or draining, cut when the grace is over.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::server::{Connected, TcpConnectInfo};
use tower::Service;

use super::ConnectionLimits;
use super::body_deadline::TimedBody;
use super::conn::Conn;
use super::idle::{Activity, CountedBody, InFlight};
use super::tls::{ClientCertificate, Tls, certificate_name};

/// The pause after a failed accept (out of descriptors, most often), so
/// the accept loop does not spin while the condition lasts.
const ACCEPT_RETRY: Duration = Duration::from_millis(10);

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
                    tracing::debug!(peer = info.remote_addr.map(tracing::field::display), error = %e, "TLS handshake failed")
                }
                Err(_) => tracing::debug!(peer = info.remote_addr.map(tracing::field::display), "TLS handshake timed out"),
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

/// Spawns hyper's tasks (one per HTTP/2 stream) boxed: a stream's task
/// holds the whole call's future, which tokio would otherwise copy whole
/// several times on the way into its task and again as the task ends
/// (callgrind: about 2,000 instructions of `memcpy` per call; one copy
/// into the box and an allocation instead).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct BoxedExecutor;

impl<F> hyper::rt::Executor<F> for BoxedExecutor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, future: F) {
        tokio::spawn(Box::pin(future));
    }
}

/// hyper's HTTP/1.1 and HTTP/2 server connections under `limits`.
fn builder(limits: &ConnectionLimits) -> ConnBuilder<BoxedExecutor> {
    let mut builder = ConnBuilder::new(BoxedExecutor);
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
    builder: Arc<ConnBuilder<BoxedExecutor>>,
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
