//! Assembles the server: the A2A service, the standard health service,
//! server reflection (v1 and v1alpha, so `grpcurl list/describe` work with
//! no proto files) and, on the same port over HTTP/1.1, the agent cards
//! ([`crate::discovery`]); serves them until a shutdown signal.
//!
//! [`Server`] builds one around a [`TaskManager`], its settings grouped by
//! the part that reads them: the cards ([`DiscoveryConfig`]), the
//! connections ([`ConnectionLimits`]), who may call over what
//! ([`Security`]), push notifications ([`crate::push::deliver::Settings`])
//! and the operators' listener ([`Operations`]). [`serve`] does the same
//! from a store and agents ([`ServerParts`]).
//!
//! Shutdown is designed in: the signal first fires the runtime's shutdown
//! token, which ends every open stream with UNAVAILABLE and cancels running
//! executors, then the server stops accepting and drains in-flight calls
//! ([`crate::connections::serve`]).

mod by_content_type;
mod input_waits;
mod process;

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::service::Routes;
use tonic::transport::server::TcpIncoming;

use crate::agent::AgentRouter;
use crate::auth::Authenticator;
use crate::connections::{self, ClientCerts, ConnectionLimits};
use crate::discovery::{Cards, DiscoveryConfig};
use crate::operations::{Access, Health, Operations, http_router, serve_operations};
use crate::proto::FILE_DESCRIPTOR_SET;
use crate::runtime::{RuntimeConfig, TaskManager};
use crate::service::grpc_server::A2aGrpcServer;
use crate::service::web::HttpBindings;
use crate::service::{A2aApi, Binding};
use crate::store::TaskStore;
use by_content_type::ByContentType;
use input_waits::sweep_input_waits;

pub use crate::proto::MAX_MESSAGE_BYTES;
pub use process::{runtime, shutdown_signal};

/// Everything a server needs, from the store up.
pub struct ServerParts {
    pub store: Arc<dyn TaskStore>,
    pub agents: AgentRouter,
    pub runtime: RuntimeConfig,
    pub discovery: DiscoveryConfig,
    pub connections: ConnectionLimits,
    /// `--auth`, `--tls-cert`, `--tls-key`, `--tls-client-ca`.
    pub security: Security,
    /// Push notifications: the config RPCs served and the outbox
    /// delivered ([`crate::push`]); `None` answers
    /// PUSH_NOTIFICATION_NOT_SUPPORTED.
    pub push: Option<crate::push::deliver::Settings>,
    /// `--metrics-listen` and the store probe ([`crate::operations`]).
    pub operations: Operations,
}

/// No agents, a memory store and every default: set what differs.
impl Default for ServerParts {
    fn default() -> Self {
        ServerParts {
            store: Arc::new(crate::store::MemoryStore::new()),
            agents: AgentRouter::new(),
            runtime: RuntimeConfig::default(),
            discovery: DiscoveryConfig::default(),
            connections: ConnectionLimits::default(),
            security: Security::default(),
            push: None,
            operations: Operations::default(),
        }
    }
}

/// Serves on `listener` until `shutdown` completes. First fails the tasks a
/// previous process left active ([`TaskManager::fail_orphaned_tasks`]).
pub async fn serve(
    listener: TcpListener,
    parts: ServerParts,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let manager = TaskManager::new(parts.store, parts.agents, parts.runtime);
    let orphaned = manager.fail_orphaned_tasks().await?;
    if orphaned > 0 {
        tracing::warn!(
            orphaned,
            "failed tasks left active by a previous run of the server"
        );
    }
    Server::new(manager)
        .discovery(parts.discovery)
        .limits(parts.connections)
        .security(parts.security)
        .push(parts.push)
        .operations(parts.operations)
        .serve(listener, shutdown)
        .await
}

/// Who may call, and over what: what the authentication and the TLS
/// layer read. Agent cards and the health service stay public;
/// GetExtendedAgentCard, like every A2A call, needs credentials (spec
/// §13.3).
#[derive(Clone, Default)]
pub struct Security {
    /// `--auth`: every A2A call must authenticate ([`crate::auth`]);
    /// `None` serves anyone who can reach the port.
    pub auth: Option<Arc<Authenticator>>,
    /// `--tls-cert`, `--tls-key`: gRPC and the cards over TLS on the same
    /// port ([`connections::Tls`]). With client certificates and no
    /// `auth`, the certificates are the authentication
    /// ([`Authenticator::client_certificates`]).
    pub tls: Option<Arc<connections::Tls>>,
}

impl Security {
    /// Reads the auth file and the TLS files again and puts them in force for
    /// new requests and connections (SIGHUP: key and certificate rotation);
    /// connections and streams already open are left as they are. What does
    /// not load is logged and the version in force stays. Returns whether
    /// everything given reloaded.
    pub fn reload(&self) -> bool {
        let mut ok = true;
        if let Some(auth) = &self.auth {
            match auth.reload() {
                Ok(true) => tracing::info!("reloaded the auth file"),
                Ok(false) => {}
                Err(e) => {
                    ok = false;
                    tracing::error!(error = %e, "auth file not reloaded; the previous one stays in force");
                }
            }
        }
        if let Some(tls) = &self.tls {
            match tls.reload() {
                Ok(true) => tracing::info!("reloaded the TLS certificate, key and client CA"),
                Ok(false) => {}
                Err(e) => {
                    ok = false;
                    tracing::error!(error = %e, "TLS files not reloaded; the previous ones stay in force");
                }
            }
        }
        ok
    }
}

/// A server for an existing [`TaskManager`] (for embedding and tests):
/// gRPC and, on the same port, the agent cards and the JSON bindings over
/// HTTP/1.1 or HTTP/2. Every setting not given is its default; push
/// notifications are off until [`Server::push`] gives them.
pub struct Server {
    manager: TaskManager,
    discovery: DiscoveryConfig,
    limits: ConnectionLimits,
    security: Security,
    push: Option<crate::push::deliver::Settings>,
    operations: Operations,
}

impl Server {
    pub fn new(manager: TaskManager) -> Self {
        Server {
            manager,
            discovery: DiscoveryConfig::default(),
            limits: ConnectionLimits::default(),
            security: Security::default(),
            push: None,
            operations: Operations::default(),
        }
    }

    /// What the agent cards say ([`crate::discovery`]); their `security`,
    /// `push` and `tls` are set from the other settings when serving.
    pub fn discovery(mut self, discovery: DiscoveryConfig) -> Self {
        self.discovery = discovery;
        self
    }

    /// The connection bounds ([`crate::connections`]). Once the shutdown
    /// signal completes, open connections get `limits.shutdown_grace` to
    /// finish; then [`Server::serve`] returns and whatever is left is cut.
    pub fn limits(mut self, limits: ConnectionLimits) -> Self {
        self.limits = limits;
        self
    }

    pub fn security(mut self, security: Security) -> Self {
        self.security = security;
        self
    }

    /// Push notifications offered and delivered with these settings;
    /// `None` (the default) answers PUSH_NOTIFICATION_NOT_SUPPORTED.
    pub fn push(mut self, push: impl Into<Option<crate::push::deliver::Settings>>) -> Self {
        self.push = push.into();
        self
    }

    /// `--metrics-listen` and the store probe ([`crate::operations`]).
    pub fn operations(mut self, operations: Operations) -> Self {
        self.operations = operations;
        self
    }

    /// The manager served, for a caller that keeps a handle on it.
    pub fn manager(&self) -> &TaskManager {
        &self.manager
    }

    /// Serves on `listener` until `shutdown` completes, then drains
    /// (connections, then runs). Connections speak HTTP/1.1 or HTTP/2, and
    /// requests are routed by content type, so the gRPC services and the
    /// HTTP routes share the port.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let Server {
            manager,
            mut discovery,
            limits,
            security: Security { auth, tls },
            push,
            operations,
        } = self;
        discovery.push = push.is_some();
        discovery.tls = tls.is_some();
        let client_certs = tls
            .as_ref()
            .map_or(ClientCerts::None, |tls| tls.client_certs());
        // Mutual TLS alone: a verified client certificate is the credential.
        let auth = match (auth, client_certs) {
            (None, ClientCerts::Required | ClientCerts::Optional) => {
                Some(Arc::new(Authenticator::client_certificates()))
            }
            (auth, _) => auth,
        };
        if let Some(auth) = &auth {
            discovery.security = Some(crate::discovery::CardSecurity {
                bearer: auth.accepts_bearer(),
                jwt: auth.accepts_jwt(),
                mtls: client_certs != ClientCerts::None,
            });
        }
        let cards = Arc::new(Cards::build(
            manager.agents(),
            &discovery,
            listener.local_addr()?,
        )?);
        // SERVING while ready: not draining, the store answering its probe.
        let (health_reporter, health_service) = tonic_health::server::health_reporter();
        let health = Health::new(health_reporter).await;
        // Both reflection versions describe the A2A service, the error details
        // every A2A error carries (`google.rpc.ErrorInfo`, `BadRequest`: the
        // descriptor set holds google/rpc/error_details.proto and status.proto,
        // so grpcurl prints them instead of "not recognized") and the health
        // service (whose descriptors tonic-health ships).
        let reflection = || {
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        };
        let reflection_v1 = reflection().build_v1()?;
        let reflection_v1alpha = reflection().build_v1alpha()?;
        let egress = push.as_ref().map(|p| Arc::new(p.egress.clone()));
        if let Some(mut settings) = push {
            if settings.metrics.is_none() {
                settings.metrics = manager.metrics().map(|m| m.push.clone());
            }
            if settings.v0_3_body.is_none() {
                settings.v0_3_body = Some(|event| {
                    crate::service::v0_3::convert::push_body(event).map_err(|e| e.to_string())
                });
            }
            tokio::spawn(crate::push::deliver::deliver_while_held(
                manager.store().clone(),
                settings,
                manager.outbox_signal(),
                manager.shutdown_token(),
            ));
        }
        let auth_shared = auth.clone();
        let api = A2aApi::new(manager.clone(), cards.clone())
            .with_auth(auth)
            .with_push(egress)
            .with_read_pacing(limits.read_bytes_per_second);
        let a2a = A2aGrpcServer::new(api.clone());
        // Protocol 0.3's service (`a2a.v1.A2AService`), beside 1.0's.
        let a2a_v0_3 = crate::proto::v0_3::a2a_service_server::A2aServiceServer::new(
            crate::service::v0_3::grpc::A2aGrpcV03::new(api.clone()),
        )
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let serve_v0_3 = cards.serves_v0_3();

        tokio::spawn(manager.clone().run_maintenance());
        if let Some(auth) = &auth_shared {
            tokio::spawn(sweep_input_waits(manager.clone(), auth.clone()));
        }
        tokio::spawn(manager.clone().follow_changes());
        tokio::spawn(manager.clone().stop_runs_when_lease_lost());
        let token = manager.shutdown_token();
        tokio::spawn(crate::operations::probe_store(
            manager.store().clone(),
            health.clone(),
            manager.metrics().cloned(),
            operations.probe_every,
            token.clone(),
        ));
        let draining = health.clone();
        let signal = async move {
            shutdown.await;
            tracing::info!("shutting down: ending open streams and draining calls");
            draining.draining().await;
            token.cancel();
        };
        tracing::info!(addr = %listener.local_addr()?, "serving A2A gRPC and agent cards");
        // TCP_NODELAY on every accepted connection: with Nagle's algorithm a
        // small response written in two parts (headers, then body and
        // trailers) waits for the client's delayed ACK, about 40 ms per call.
        let incoming = connections::bounded(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            &limits,
            tls.is_some(),
        );
        let metrics = manager.metrics().cloned();
        // The second listener: metrics without authentication, the health
        // probes and the health service, open until the drain is over.
        let operations_done = CancellationToken::new();
        // Reflection of what that port serves (the health service alone),
        // so `grpcurl -plaintext ADDR grpc.health.v1.Health/Check` needs
        // no proto file there either.
        let operations_reflection = || {
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        };
        let operations_reflection_v1 = operations_reflection().build_v1()?;
        let operations_reflection_v1alpha = operations_reflection().build_v1alpha()?;
        let operations_served = operations.listener.map(|listener| {
            if let Ok(addr) = listener.local_addr() {
                tracing::info!(listen = %addr, "serving metrics and health probes");
            }
            let http = http_router(health.clone(), metrics.as_ref(), Access::Private);
            let routes = Routes::from(http)
                .add_service(health_service.clone())
                .add_service(operations_reflection_v1.clone())
                .add_service(operations_reflection_v1alpha.clone());
            // Past the drain, a scrape in flight gets a moment, a health
            // watcher none.
            let limits = ConnectionLimits {
                shutdown_grace: crate::operations::SHUTDOWN_GRACE.min(limits.shutdown_grace),
                ..limits.clone()
            };
            let done = operations_done.clone();
            tokio::spawn(async move {
                serve_operations(listener, routes, &limits, done.cancelled_owned()).await
            })
        });
        let served = discovery.bindings;
        let tenants = cards.tenants();
        let console_url = format!("{}{}", cards.http_url(), crate::console::PATH);
        let mut http = cards.router().merge(http_router(
            health,
            metrics.as_ref(),
            Access::Public(auth_shared),
        ));
        // The console speaks HTTP+JSON: without that binding it has nothing
        // to call.
        if !discovery.no_console && served.contains(Binding::HttpJson) {
            http = http.merge(crate::console::router(&crate::console::ConsoleConfig {
                tenants,
                bearer: discovery.security.as_ref().is_some_and(|s| s.bearer),
            }));
            tracing::info!(url = %console_url, "serving the console");
        }
        let api_for_grpc = api.clone();
        let json_bindings: Vec<Binding> = served.iter().filter(|b| *b != Binding::Grpc).collect();
        if !json_bindings.is_empty() {
            let bindings = Arc::new(HttpBindings::new(api, &json_bindings, limits.sse_keepalive));
            http = http.merge(bindings.router());
        }
        let http = crate::service::web::cors(http, &discovery.cors_origins);
        let mut grpc = Routes::default()
            .add_service(crate::operations::BoundedWatches::new(
                health_service,
                crate::operations::MAX_WATCHES_PER_PEER,
            ))
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha);
        if served.contains(Binding::Grpc) {
            grpc = grpc.add_service(a2a);
            if serve_v0_3 {
                grpc = grpc.add_service(a2a_v0_3);
            }
        }
        let grpc = tower::ServiceBuilder::new()
            .map_response(crate::service::grpc::transport_error_info)
            .service(crate::service::grpc::AuthFirst::new(grpc, api_for_grpc));
        let service = ByContentType {
            grpc,
            http: Routes::from(http),
        };
        // Each call in its span (inside), counted with its whole time (outside).
        let service = crate::telemetry::Traced::new(service);
        let service = crate::metrics::Observed::new(service, metrics.map(|m| m.rpc.clone()));
        // A client holding a half-sent request or a silent connection does not
        // hold shutdown: past the grace period the rest is cut.
        connections::serve(incoming, service, &limits, tls, signal).await;
        // No task is left active in the store: runs end (failing their tasks
        // with the shutdown message), and those that do not are failed here.
        manager.drain_runs(limits.shutdown_grace).await;
        operations_done.cancel();
        if let Some(served) = operations_served {
            let _ = served.await;
        }
        Ok(())
    }
}
