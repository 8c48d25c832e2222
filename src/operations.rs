//! What an operator and a load balancer reach besides the A2A service:
//! whether the server should be sent traffic (the gRPC health service's
//! status, `GET /healthz`, `GET /readyz`), the store probe that decides
//! it, and `GET /metrics` ([`crate::metrics`]); on the server's own port
//! and, with `--metrics-listen`, on a second plain-HTTP listener of their
//! own.
//!
//! Ready means: not draining, and the store answered its last probe. The
//! gRPC health service (`grpc.health.v1.Health`, for the whole server `""`
//! and for `lf.a2a.v1.A2AService`) reports SERVING exactly when ready,
//! and NOT_SERVING otherwise, so that a balancer stops sending calls that
//! could only fail with UNAVAILABLE; `/healthz` answers 200 while the
//! process answers at all (a liveness probe that must not restart a server
//! whose database is down: restarting would not bring the database back).

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::auth::Authenticator;
use crate::connections::{ClientCertificate, ConnectionLimits};
use crate::metrics::Metrics;
use crate::store::TaskStore;

/// How often the store is probed ([`probe_store`]).
pub const PROBE_EVERY: Duration = Duration::from_secs(2);
/// A probe not answered within this counts as the store unreachable.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the operations listener's connections get to finish once the
/// server has drained.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// The gRPC service names the health service reports on: the whole server
/// (`""`, per the gRPC health checking protocol) and the A2A service.
const SERVICES: [&str; 2] = ["", "lf.a2a.v1.A2AService"];

/// The operations side of a server: the second listener and the probe.
pub struct Operations {
    /// `--metrics-listen`: `/metrics`, `/healthz` and `/readyz` over plain
    /// HTTP on a listener of their own, without authentication (for a
    /// private network or loopback), and open until the server has
    /// drained, so a balancer can watch the drain.
    pub listener: Option<TcpListener>,
    /// How often the store is probed for readiness.
    pub probe_every: Duration,
}

impl Default for Operations {
    fn default() -> Self {
        Operations {
            listener: None,
            probe_every: PROBE_EVERY,
        }
    }
}

/// Why the server is not ready.
#[derive(Clone, Debug, PartialEq, Eq)]
struct State {
    draining: bool,
    /// The last probe's failure.
    store: Option<String>,
}

impl State {
    fn ready(&self) -> bool {
        !self.draining && self.store.is_none()
    }

    /// What `/readyz` answers a caller that authenticated: the reason.
    fn describe(&self) -> String {
        match (&self.store, self.draining) {
            (_, true) => "draining".to_owned(),
            (Some(why), false) => format!("store unreachable: {why}"),
            (None, false) => "ready".to_owned(),
        }
    }
}

/// Readiness, as the health service, `/readyz` and the logs report it.
#[derive(Clone)]
pub struct Health {
    reporter: HealthReporter,
    state: Arc<watch::Sender<State>>,
}

impl Health {
    /// Ready, reported through `reporter` (the health service's).
    pub async fn new(reporter: HealthReporter) -> Self {
        for service in SERVICES {
            reporter
                .set_service_status(service, ServingStatus::Serving)
                .await;
        }
        let state = State {
            draining: false,
            store: None,
        };
        Health {
            reporter,
            state: Arc::new(watch::channel(state).0),
        }
    }

    /// Whether the server is ready now.
    pub fn ready(&self) -> bool {
        self.state.borrow().ready()
    }

    /// The server stops taking new work: not ready from now on.
    pub async fn draining(&self) {
        self.update(|s| s.draining = true).await;
    }

    /// The store answered a probe (`Ok`), or did not (why).
    pub async fn store_probed(&self, result: Result<(), String>) {
        let was = self.state.borrow().store.clone();
        match (&was, &result) {
            (None, Err(why)) => {
                tracing::error!(%why, "the store cannot be reached: reporting NOT_SERVING")
            }
            (Some(_), Ok(())) => tracing::info!("the store answers again: reporting SERVING"),
            _ => {}
        }
        self.update(|s| s.store = result.err()).await;
    }

    /// Changes the state; tells the health service only when readiness
    /// changed (its watchers see every status it is given).
    async fn update(&self, change: impl FnOnce(&mut State)) {
        let mut flipped = None;
        self.state.send_modify(|state| {
            let was = state.ready();
            change(state);
            if state.ready() != was {
                flipped = Some(state.ready());
            }
        });
        if let Some(ready) = flipped {
            let status = if ready {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            for service in SERVICES {
                self.reporter.set_service_status(service, status).await;
            }
        }
    }

    fn describe(&self) -> String {
        self.state.borrow().describe()
    }
}

/// Probes the store every `every` until `shutdown`, and reports what it
/// finds to `health`. With metrics, the probe is the count of tasks by
/// state the `a2a_tasks` gauge shows; without, a read of nothing.
pub async fn probe_store(
    store: Arc<dyn TaskStore>,
    health: Health,
    metrics: Option<Arc<Metrics>>,
    every: Duration,
    shutdown: CancellationToken,
) {
    use crate::proto::TaskState;
    const UNFINISHED: [TaskState; 4] = [
        TaskState::Submitted,
        TaskState::Working,
        TaskState::InputRequired,
        TaskState::AuthRequired,
    ];
    loop {
        let probe = async {
            let Some(metrics) = &metrics else {
                return store.ping().await;
            };
            let counts = store.count_unfinished().await?;
            for state in UNFINISHED {
                let count = counts
                    .iter()
                    .find(|(s, _)| *s == state)
                    .map_or(0, |(_, n)| *n);
                metrics.tasks.unfinished(state.as_str_name(), count);
            }
            Ok(())
        };
        let result = match tokio::time::timeout(PROBE_TIMEOUT, probe).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {PROBE_TIMEOUT:?}")),
        };
        health.store_probed(result).await;
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
    }
}

/// Who reaches what on a port's operations routes.
#[derive(Clone)]
pub enum Access {
    /// `--metrics-listen`'s listener, for a private network or loopback:
    /// metrics and why the server is not ready, without credentials.
    Private,
    /// The server's own port: with `auth`, metrics and why the server is
    /// not ready for authenticated callers only; without, metrics for all
    /// and the reason for none (it is logged).
    Public(Option<Arc<Authenticator>>),
}

/// What a port serves besides the gRPC services: the probes and, with
/// metrics, `/metrics`.
pub fn http_router(health: Health, metrics: Option<&Arc<Metrics>>, access: Access) -> axum::Router {
    let router = health_router(health, access.clone());
    let auth = match access {
        Access::Private => None,
        Access::Public(auth) => auth,
    };
    match metrics {
        Some(metrics) => router.merge(metrics_router(metrics.clone(), auth)),
        None => router,
    }
}

/// `GET /healthz` (200 while the process answers) and `GET /readyz` (200
/// `ready`, or 503 `not ready`), public like the health service: probes
/// carry no credentials. Why it is not ready (`draining`, `store
/// unreachable: ...`, whose text can name the database's host, user and
/// database) is logged, and told as `access` says.
fn health_router(health: Health, access: Access) -> axum::Router {
    use axum::routing::get;
    let readyz = move |request: axum::extract::Request| {
        let (health, access) = (health.clone(), access.clone());
        async move {
            if health.ready() {
                return (http::StatusCode::OK, "ready\n".to_owned());
            }
            let detail = match access {
                Access::Private => true,
                Access::Public(Some(auth)) => authenticated(&auth, &request).is_ok(),
                Access::Public(None) => false,
            };
            let said = if detail {
                health.describe()
            } else {
                "not ready".to_owned()
            };
            (http::StatusCode::SERVICE_UNAVAILABLE, format!("{said}\n"))
        }
    };
    axum::Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
}

/// Whether an HTTP request on an operations route carries credentials
/// `auth` accepts (a token, or the connection's client certificate).
fn authenticated(
    auth: &Authenticator,
    request: &axum::extract::Request,
) -> Result<(), crate::auth::AuthError> {
    let authorization = request
        .headers()
        .get(http::header::AUTHORIZATION)
        .map(|v| v.to_str().unwrap_or(""));
    let certificate = request
        .extensions()
        .get::<ClientCertificate>()
        .map(|c| c.name.as_str());
    auth.authenticate_request(authorization, certificate)
        .map(drop)
}

/// `GET /metrics`: the server's metrics, in the OpenMetrics text format.
/// With `auth`, for authenticated callers only (any principal: the counts
/// span every tenant but name no task); `401` for others.
fn metrics_router(metrics: Arc<Metrics>, auth: Option<Arc<Authenticator>>) -> axum::Router {
    use axum::response::IntoResponse;
    let scrape = move |request: axum::extract::Request| {
        let (metrics, auth) = (metrics.clone(), auth.clone());
        async move {
            if let Some(auth) = &auth
                && let Err(e) = authenticated(auth, &request)
            {
                let peer = request
                    .extensions()
                    .get::<tonic::transport::server::TcpConnectInfo>()
                    .and_then(|info| info.remote_addr());
                auth.refused(peer, "metrics", &e, Some(&metrics)).await;
                return (
                    http::StatusCode::UNAUTHORIZED,
                    [(http::header::WWW_AUTHENTICATE, "Bearer")],
                    format!("{e}\n"),
                )
                    .into_response();
            }
            (
                [(http::header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
                metrics.render(),
            )
                .into_response()
        }
    };
    axum::Router::new().route("/metrics", axum::routing::get(scrape))
}

/// Public `grpc.health.v1.Health/Watch` streams one peer
/// ([`crate::connections::peer_key`]) may hold at once on the server's
/// port. A Watch never ends by itself and needs no credentials, and a
/// request in flight keeps its connection out of the idle timeout: without
/// a bound, one address could hold connections (and their share of the
/// caps) for ever.
pub const MAX_WATCHES_PER_PEER: usize = 8;

/// The health service with its Watch streams bounded per peer; a Watch
/// past the bound is RESOURCE_EXHAUSTED.
#[derive(Clone)]
pub struct BoundedWatches<S> {
    inner: S,
    open: crate::connections::PerPeer,
    max: usize,
}

impl<S> BoundedWatches<S> {
    pub fn new(inner: S, max: usize) -> Self {
        BoundedWatches {
            inner,
            open: Default::default(),
            max,
        }
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for BoundedWatches<S> {
    const NAME: &'static str = S::NAME;
}

/// A response body holding its Watch's place, until the stream ends.
struct WatchBody {
    inner: tonic::body::Body,
    _watching: crate::connections::PeerHeld,
}

impl http_body::Body for WatchBody {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
}

impl<S, B> tower::Service<http::Request<B>> for BoundedWatches<S>
where
    S: tower::Service<
            http::Request<B>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        >,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let peer = request
            .extensions()
            .get::<tonic::transport::server::TcpConnectInfo>()
            .and_then(|info| info.remote_addr())
            .map(|a| crate::connections::peer_key(a.ip()));
        let watching = match peer {
            Some(peer) if request.uri().path().ends_with("/Watch") => {
                let Some(held) = self.open.enter(peer, self.max) else {
                    tracing::warn!(
                        %peer,
                        max = self.max,
                        "health Watch refused: its peer is at its bound"
                    );
                    let status = tonic::Status::resource_exhausted(format!(
                        "at most {} health Watch streams per client address; use Check, or close one",
                        self.max
                    ));
                    return Box::pin(async move { Ok(status.into_http()) });
                };
                Some(held)
            }
            _ => None,
        };
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            Ok(match watching {
                Some(watching) => response.map(|inner| {
                    tonic::body::Body::new(WatchBody {
                        inner,
                        _watching: watching,
                    })
                }),
                None => response,
            })
        })
    }
}

/// Serves `routes` on `listener` (plain HTTP/1.1 and HTTP/2, under the
/// server's connection `limits`) until `stop` completes.
pub async fn serve_operations(
    listener: TcpListener,
    routes: tonic::service::Routes,
    limits: &ConnectionLimits,
    stop: impl std::future::Future<Output = ()>,
) {
    let incoming = crate::connections::bounded(
        tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
        limits,
        false,
    );
    crate::connections::serve(incoming, routes, limits, None, stop).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt as _;

    async fn readyz(router: &axum::Router, token: Option<&str>) -> (u16, String) {
        let mut request = http::Request::get("/readyz");
        if let Some(token) = token {
            request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = request.body(axum::body::Body::empty()).unwrap();
        let response = router.clone().oneshot(request).await.unwrap();
        let status = response.status().as_u16();
        let body = axum::body::to_bytes(response.into_body(), 1024)
            .await
            .unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    /// Why the server is not ready goes to authenticated callers and the
    /// private listener only: a store's error can name its host and user.
    #[tokio::test]
    async fn only_the_trusted_learn_why_the_server_is_not_ready() {
        let (reporter, _) = tonic_health::server::health_reporter();
        let health = Health::new(reporter).await;
        let digest: String = <sha2::Sha256 as sha2::Digest>::digest(b"ops-key")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let file = format!(
            "[[principal]]\nname = \"ops\"\napi_key_sha256 = \"{digest}\"\ntenants = [\"*\"]\nrole = \"user\"\n"
        );
        let auth = Arc::new(Authenticator::parse(&file, std::path::Path::new(".")).unwrap());
        let public = health_router(health.clone(), Access::Public(Some(auth)));
        let open = health_router(health.clone(), Access::Public(None));
        let private = health_router(health.clone(), Access::Private);
        assert_eq!(readyz(&public, None).await, (200, "ready\n".into()));
        health
            .store_probed(Err(
                "connection to postgres://a2a@db.internal:5432 refused".into()
            ))
            .await;
        let said = "store unreachable: connection to postgres://a2a@db.internal:5432 refused\n";
        assert_eq!(readyz(&public, None).await, (503, "not ready\n".into()));
        assert_eq!(
            readyz(&public, Some("wrong")).await,
            (503, "not ready\n".into())
        );
        assert_eq!(readyz(&open, None).await, (503, "not ready\n".into()));
        assert_eq!(readyz(&public, Some("ops-key")).await, (503, said.into()));
        assert_eq!(readyz(&private, None).await, (503, said.into()));
    }
}
