//! The `a2a-lifecycle` command: `serve` runs the server with the demo
//! agents; the other subcommands are a small gRPC client for it, printing
//! ProtoJSON (streams as one JSON object per line).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::builder::TypedValueParser;
use clap::{Parser, Subcommand};
use tokio::net::TcpListener;
use tonic::transport::Channel;

mod cli;

use a2a_lifecycle::agent::demo::{DefaultAgent, Deployer, demo_router_with};
use a2a_lifecycle::bindings::{Binding, BindingSet};
use a2a_lifecycle::connections;
use a2a_lifecycle::discovery::DiscoveryConfig;
use a2a_lifecycle::discovery::signing::{self, CardSigner};
use a2a_lifecycle::json;
use a2a_lifecycle::lifecycle::{TransitionPolicy, parse_state_name};
use a2a_lifecycle::metrics::Metrics;
use a2a_lifecycle::proto::{
    AuthenticationInfo, CancelTaskRequest, DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest, GetTaskRequest, ListTaskPushNotificationConfigsRequest,
    ListTasksRequest, Message, Part, Role, SendMessageConfiguration, SendMessageRequest,
    SubscribeToTaskRequest, TaskPushNotificationConfig, part::Content,
};
use a2a_lifecycle::runtime::RuntimeConfig;
use a2a_lifecycle::server::{ServerParts, serve, shutdown_signal};
use a2a_lifecycle::store::{MemoryStore, SqliteStore, TaskStore};
use futures_util::StreamExt;

/// mimalloc: a request allocates many small objects (strings and vectors of
/// the proto types), and glibc's malloc spent about a fifth of the
/// server's CPU on them (perf). The bare comparison server uses the same
/// allocator, so benchmark ratios compare code, not allocators.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    version,
    about = "A2A protocol v1.0 gRPC server with a durable task lifecycle"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log lines as `text`, or as `json` (one object per line, with the
    /// fields of the RPC and run spans they are in; README, Operations).
    #[arg(long, global = true, value_enum, default_value = "text")]
    log_format: cli::logging::LogFormat,
    /// Export the RPC and run spans over OTLP/gRPC to this collector
    /// (e.g. `http://127.0.0.1:4317`); off when not given.
    #[arg(long, global = true, env = "A2A_OTLP_ENDPOINT", value_name = "URL")]
    otlp_endpoint: Option<String>,
}

/// Connection bounds (`a2a_lifecycle::connections`; README, Limits).
#[derive(clap::Args)]
struct ConnectionArgs {
    /// Connections served at once; one more is closed at accept.
    #[arg(long, default_value_t = connections::MAX_CONNECTIONS)]
    max_connections: usize,
    /// Connections one client address (an IPv6 /64) may hold at once; one
    /// more is closed at accept.
    #[arg(
        long,
        default_value_t = connections::MAX_CONNECTIONS_PER_PEER,
        value_parser = clap::value_parser!(u64).range(1..).map(|n| n as usize)
    )]
    max_connections_per_peer: usize,
    /// Time a request has, once its headers arrived, to send its whole
    /// body; past it the request ends with an error.
    #[arg(long, default_value = "30s", value_parser = parse_positive_duration)]
    body_timeout: Duration,
    /// Concurrent HTTP/2 streams per connection (advertised in SETTINGS).
    #[arg(long, default_value_t = connections::MAX_CONCURRENT_STREAMS)]
    max_streams_per_connection: u32,
    /// Time a new connection has to send the HTTP/2 preface, and an
    /// HTTP/1.1 connection each request's headers (counted from when it is
    /// ready for the next request, so it also closes idle HTTP/1.1
    /// connections).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    handshake_timeout: Duration,
    /// Interval of HTTP/2 keepalive pings.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    keepalive_interval: Duration,
    /// How long a keepalive ping may go unanswered before the connection
    /// is closed.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    keepalive_timeout: Duration,
    /// How long shutdown waits for open connections before cutting them.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    shutdown_grace: Duration,
    /// How long a connection with no request in flight stays open (HTTP/2:
    /// closed with GOAWAY).
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    idle_timeout: Duration,
    /// How long a JSON binding's event stream may go without an event
    /// before a keep-alive comment line is sent.
    #[arg(long, default_value = "4s", value_parser = humantime::parse_duration)]
    sse_keepalive: Duration,
    /// Bytes of answers (tasks, pages, events) one caller (a principal, or
    /// an address without --auth) is sent per second, after a burst of two
    /// seconds' worth; past it its next call waits. 0: no pacing.
    #[arg(long, default_value_t = a2a_lifecycle::service::pacing::READ_BYTES_PER_SECOND)]
    read_bytes_per_second: u64,
}

impl ConnectionArgs {
    fn limits(&self) -> connections::ConnectionLimits {
        connections::ConnectionLimits {
            max_connections: self.max_connections,
            max_connections_per_peer: self.max_connections_per_peer,
            body_timeout: self.body_timeout,
            max_concurrent_streams: self.max_streams_per_connection,
            handshake_timeout: self.handshake_timeout,
            keepalive_interval: self.keepalive_interval,
            keepalive_timeout: self.keepalive_timeout,
            shutdown_grace: self.shutdown_grace,
            idle_timeout: self.idle_timeout,
            sse_keepalive: self.sse_keepalive,
            read_bytes_per_second: self.read_bytes_per_second,
        }
    }
}

/// Push notifications (`a2a_lifecycle::push`; README, Push notifications).
#[derive(clap::Args)]
struct PushArgs {
    /// Do not offer push notifications: the config RPCs answer
    /// PUSH_NOTIFICATION_NOT_SUPPORTED and the cards say so.
    #[arg(long, conflicts_with_all = ["push_allow_cidr", "push_timeout", "push_max_attempts"])]
    no_push: bool,
    /// An address range webhooks may reach although it is refused by
    /// default (loopback, private, link-local, ...), e.g. `10.1.0.0/16`
    /// or `127.0.0.0/8`; repeat for several.
    #[arg(long = "push-allow-cidr", value_name = "CIDR")]
    push_allow_cidr: Vec<ipnet::IpNet>,
    /// Time one webhook POST may take, connection included.
    #[arg(long, default_value = "10s", value_parser = parse_positive_duration)]
    push_timeout: Duration,
    /// Attempts at one notification before it is given up (and logged).
    #[arg(
        long,
        default_value_t = a2a_lifecycle::push::deliver::DEFAULT_MAX_ATTEMPTS,
        value_parser = clap::value_parser!(u32).range(1..),
    )]
    push_max_attempts: u32,
}

impl PushArgs {
    fn settings(self) -> Option<a2a_lifecycle::push::deliver::Settings> {
        (!self.no_push).then(|| a2a_lifecycle::push::deliver::Settings {
            egress: a2a_lifecycle::push::egress::Egress::new(self.push_allow_cidr),
            timeout: self.push_timeout,
            max_attempts: self.push_max_attempts,
            ..Default::default()
        })
    }
}

// Parsed once at start: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run the server with the demo agents.
    Serve {
        #[arg(long, default_value = "127.0.0.1:50051")]
        listen: SocketAddr,
        /// Task store: `sqlite:PATH` (durable; the folder is created),
        /// `postgres://USER@HOST:PORT/DB` (durable, on a PostgreSQL server;
        /// TLS as libpq's `?sslmode=`: disable, prefer (the default),
        /// require, verify-ca or verify-full with `&sslrootcert=CA.pem`)
        /// or `memory` (lost on exit). A password in it is never shown
        /// (`--help` hides the environment's value) or logged.
        #[arg(
            long,
            env = "A2A_STORE",
            hide_env_values = true,
            default_value = "sqlite:./a2a-data/tasks.db"
        )]
        store: String,
        /// With a PostgreSQL store, shared by replicas: how long this
        /// replica's lease lasts (renewed every third of it, on its own
        /// connection). A replica that dies has its active tasks failed by
        /// another once its lease has run out; one that cannot renew in
        /// time stops its runs and takes no writes until it renews (and
        /// webhook attempts time out after at most half of it).
        #[arg(long, default_value = "10s", value_parser = parse_positive_duration)]
        lease: Duration,
        /// Enforce seed 001's stricter transition table (see README).
        #[arg(long)]
        strict_transitions: bool,
        /// Count nothing and serve no `GET /metrics` (metrics are on by
        /// default; see README, Operations).
        #[arg(long)]
        no_metrics: bool,
        /// Also serve `/metrics` (without authentication), `/healthz`,
        /// `/readyz` and the gRPC health service on this address, over
        /// plain HTTP; open until the server has drained. For a private
        /// network or loopback.
        #[arg(long, value_name = "ADDR")]
        metrics_listen: Option<SocketAddr>,
        /// FAIL a task still SUBMITTED or WORKING this long after its run
        /// started (e.g. `30s`, `10m`); off by default.
        #[arg(long, value_parser = humantime::parse_duration)]
        task_timeout: Option<Duration>,
        /// Purge terminal tasks whose status is older than this (e.g. `7d`,
        /// `12h`); `off` keeps them forever.
        #[arg(long, default_value = "7d", value_parser = parse_retain)]
        retain: Retain,
        /// Demo deployer: how long until the approval arrives by itself.
        #[arg(long, default_value = "200ms", value_parser = humantime::parse_duration)]
        deployer_approval_delay: Duration,
        /// The `host:port` the agent cards advertise, when clients reach
        /// the server at another address than --listen (proxy, container).
        #[arg(long)]
        public_url: Option<String>,
        /// The default agent's extended agent card: a ProtoJSON `AgentCard`
        /// file, served by GetExtendedAgentCard and declared on the card.
        #[arg(long)]
        extended_card: Option<std::path::PathBuf>,
        /// The protocol bindings served on the port, comma-separated:
        /// `grpc`, `jsonrpc` (JSON-RPC 2.0 at `/`), `http-json` (the REST
        /// routes). The cards list exactly these.
        #[arg(long, default_value = "grpc,jsonrpc,http-json", value_parser = BindingSet::parse)]
        bindings: BindingSet,
        /// A browser origin (`https://console.example.com`) allowed to call
        /// the JSON bindings (CORS); repeatable. None by default.
        #[arg(long = "cors-origin", value_name = "ORIGIN")]
        cors_origins: Vec<String>,
        /// Sign every agent card served (public, per tenant, extended)
        /// with this PEM private key (spec §8.4): ES256 (P-256), ES384
        /// (P-384), RS256 (RSA, 2048 bits or more) or EdDSA (Ed25519).
        /// `a2a-lifecycle jwks PEM` prints the public key to publish.
        #[arg(long, value_name = "PEM")]
        card_signing_key: Option<std::path::PathBuf>,
        /// Serve protocol 1.0 only: no 0.3 methods or card fields, and a
        /// request without `A2A-Version` (a 0.3 client's, spec §3.6.2) is
        /// VersionNotSupported.
        #[arg(long = "no-v0-3")]
        no_v0_3: bool,
        /// Serve no browser console at `/console` (it is served with the
        /// http-json binding, which it speaks, by default).
        #[arg(long)]
        no_console: bool,
        /// The `kid` of the signatures' protected header; by default the
        /// key's RFC 7638 thumbprint.
        #[arg(long, value_name = "KID", requires = "card_signing_key")]
        card_signing_kid: Option<String>,
        /// A `jku` for the protected header: the URL where verifiers find
        /// the public key set.
        #[arg(long, value_name = "URL", requires = "card_signing_key")]
        card_signing_jku: Option<String>,
        /// Principals and JWT issuer (TOML; README, Security): every A2A
        /// call must then authenticate with `authorization: Bearer ...`.
        #[arg(long)]
        auth: Option<std::path::PathBuf>,
        /// Serve a non-loopback address without --auth (anyone who reaches
        /// the port may read and change every task).
        #[arg(long)]
        insecure_open: bool,
        /// Certificate chain (PEM) for TLS on the port: gRPC and the cards.
        #[arg(long, requires = "tls_key")]
        tls_cert: Option<std::path::PathBuf>,
        /// The certificate's private key (PEM).
        #[arg(long, requires = "tls_cert")]
        tls_key: Option<std::path::PathBuf>,
        /// CA certificates (PEM) for mutual TLS: a client certificate they
        /// verify names its principal (subject CN, else first DNS name).
        /// Without --auth, every such client is a user of every tenant and
        /// A2A calls without one are refused; cards and health stay public.
        #[arg(long, requires = "tls_cert")]
        tls_client_ca: Option<std::path::PathBuf>,
        /// The agent serving requests without a tenant.
        #[arg(
            long,
            default_value = "test-runner",
            value_parser = clap::builder::PossibleValuesParser::new(DefaultAgent::NAMES)
                .try_map(|name| name.parse::<DefaultAgent>()),
        )]
        default_agent: DefaultAgent,
        #[command(flatten)]
        connections: ConnectionArgs,
        #[command(flatten)]
        push: PushArgs,
    },
    /// Send a text message.
    Send {
        #[command(flatten)]
        target: Target,
        /// Continue this task.
        #[arg(long)]
        task_id: Option<String>,
        #[arg(long)]
        context_id: Option<String>,
        /// Stream events (SendStreamingMessage).
        #[arg(long)]
        stream: bool,
        /// Return as soon as the task exists (for a follow-up: as soon as
        /// the message is in the task's history).
        #[arg(long)]
        return_immediately: bool,
        /// The request's metadata, a JSON object (SendMessageRequest.metadata),
        /// handed to the agent.
        #[arg(long, value_parser = parse_metadata)]
        metadata: Option<a2a_lifecycle::wkt::Struct>,
        /// The message's own metadata, a JSON object (Message.metadata).
        #[arg(long, value_parser = parse_metadata)]
        message_metadata: Option<a2a_lifecycle::wkt::Struct>,
        /// A media type the client accepts in the answer
        /// (accepted_output_modes); repeat for several.
        #[arg(long = "accept")]
        accepted_output_modes: Vec<String>,
        /// A webhook for the task's notifications, registered with the
        /// message (SendMessageConfiguration.task_push_notification_config).
        #[arg(long)]
        push_url: Option<String>,
        /// The token the webhook's notifications carry
        /// (X-A2A-Notification-Token).
        #[arg(long, requires = "push_url")]
        notification_token: Option<String>,
        text: String,
    },
    /// Get a task.
    Get {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        history_length: Option<i32>,
        /// Include the task's transition log (state, time, status message,
        /// cause) in its metadata: the server's transition-log extension,
        /// activated for this call.
        #[arg(long)]
        transitions: bool,
        id: String,
    },
    /// List tasks.
    List {
        #[command(flatten)]
        target: Target,
        /// A state name: TASK_STATE_WORKING or the 0.3 name `working`.
        #[arg(long)]
        state: Option<String>,
        #[arg(long)]
        context_id: Option<String>,
        #[arg(long)]
        page_size: Option<i32>,
        #[arg(long)]
        page_token: Option<String>,
    },
    /// Cancel a task.
    Cancel {
        #[command(flatten)]
        target: Target,
        /// The request's metadata, a JSON object (CancelTaskRequest.metadata),
        /// handed to the agent's cancel hook.
        #[arg(long, value_parser = parse_metadata)]
        metadata: Option<a2a_lifecycle::wkt::Struct>,
        id: String,
    },
    /// Print the agent card: the public one (`GET
    /// /.well-known/agent-card.json`, or the tenant's), or with
    /// `--extended` the extended one (GetExtendedAgentCard, over
    /// `--binding`, authenticated).
    Card {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        extended: bool,
        /// Check the card's signatures (spec §8.4.3) against this JWK set
        /// (a JSON file `{"keys": [...]}`): exit 0 and name the one that
        /// verifies, or exit 1 with why none does.
        #[arg(long, value_name = "JWKS_FILE")]
        verify: Option<std::path::PathBuf>,
    },
    /// Print the public JWK set of a card signing key (`serve
    /// --card-signing-key`): what to publish for verifiers, and what
    /// `card --verify` reads.
    Jwks {
        /// The PEM private key.
        key: std::path::PathBuf,
        /// The key id, as given to `serve --card-signing-kid`; by default
        /// the key's thumbprint (the same default as `serve`).
        #[arg(long)]
        kid: Option<String>,
    },
    /// Stream a task's events.
    Subscribe {
        #[command(flatten)]
        target: Target,
        id: String,
    },
    /// A terminal view of the server's metrics, refreshed every second:
    /// RPC rates, errors and latency, tasks by state, runs, streams,
    /// store writes, push deliveries (`GET /metrics`; `--server` may be
    /// the server or its `--metrics-listen` address).
    Top {
        #[command(flatten)]
        target: Target,
        /// How often the view is refreshed (rates are over this interval).
        #[arg(long, default_value = "1s", value_parser = parse_positive_duration)]
        interval: Duration,
        /// Print one view, over one interval, and exit.
        #[arg(long)]
        once: bool,
    },
    /// A task's webhooks (push notification configs), and a local
    /// receiver that prints what a webhook gets.
    Push {
        #[command(subcommand)]
        command: PushCommand,
    },
}

#[derive(Subcommand)]
enum PushCommand {
    /// Register a webhook on a task (CreateTaskPushNotificationConfig).
    Set {
        #[command(flatten)]
        target: Target,
        /// The config's id; the server assigns one when not given.
        #[arg(long)]
        id: Option<String>,
        /// The token each notification carries (X-A2A-Notification-Token).
        #[arg(long, env = "A2A_NOTIFICATION_TOKEN", hide_env_values = true)]
        notification_token: Option<String>,
        /// The scheme of the webhook's Authorization header, e.g. `Bearer`.
        #[arg(long, requires = "credentials")]
        auth_scheme: Option<String>,
        /// The credentials of the webhook's Authorization header.
        #[arg(
            long,
            env = "A2A_PUSH_CREDENTIALS",
            hide_env_values = true,
            requires = "auth_scheme"
        )]
        credentials: Option<String>,
        task_id: String,
        url: String,
    },
    /// Show one of a task's webhooks.
    Get {
        #[command(flatten)]
        target: Target,
        task_id: String,
        id: String,
    },
    /// List a task's webhooks.
    List {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        page_size: Option<i32>,
        #[arg(long)]
        page_token: Option<String>,
        task_id: String,
    },
    /// Remove a webhook from a task (nothing more is sent to it).
    Delete {
        #[command(flatten)]
        target: Target,
        task_id: String,
        id: String,
    },
    /// Run a webhook receiver: each notification is printed as one line of
    /// ProtoJSON (a StreamResponse) until interrupted.
    Listen {
        /// The port; 0 picks a free one (the address is printed to stderr).
        #[arg(long, default_value_t = 9090)]
        port: u16,
        /// The address to listen on.
        #[arg(long, default_value = "127.0.0.1")]
        host: std::net::IpAddr,
        /// Refuse (401) notifications without this X-A2A-Notification-Token.
        #[arg(long, env = "A2A_NOTIFICATION_TOKEN", hide_env_values = true)]
        notification_token: Option<String>,
    },
}

#[derive(clap::Args)]
struct Target {
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    server: String,
    /// The protocol binding to call the server over: grpc, jsonrpc
    /// (JSON-RPC 2.0, spec §9) or http-json (spec §11).
    #[arg(long, default_value = "grpc", value_parser = parse_binding)]
    binding: Binding,
    /// The agent: "" (the default agent), test-runner, code-reviewer,
    /// deployer, conformance.
    #[arg(long, default_value = "")]
    tenant: String,
    /// API key or JWT for a server run with --auth, sent as
    /// `authorization: Bearer <token>`.
    #[arg(long, env = "A2A_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// CA certificate (PEM) to verify an `https://` server with, instead
    /// of the system's roots.
    #[arg(long)]
    ca_cert: Option<std::path::PathBuf>,
    /// Client certificate chain (PEM) for a server run with
    /// --tls-client-ca (mutual TLS).
    #[arg(long, requires = "client_key")]
    client_cert: Option<std::path::PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, requires = "client_cert")]
    client_key: Option<std::path::PathBuf>,
}

pub(crate) type BearerValue = tonic::metadata::MetadataValue<tonic::metadata::Ascii>;

/// Adds the client's bearer token to every call.
#[derive(Clone)]
pub(crate) struct Bearer(pub(crate) Option<BearerValue>);

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

impl Target {
    /// A connection to the server (over TLS for `https://`), and the
    /// `authorization` value its calls carry.
    async fn channel(&self) -> Result<(Channel, Option<BearerValue>), Box<dyn std::error::Error>> {
        let bearer = self
            .token
            .as_deref()
            .map(|token| {
                format!("Bearer {token}")
                    .parse()
                    .map_err(|_| "--token must be visible ASCII")
            })
            .transpose()?;
        let mut endpoint = Channel::from_shared(self.server.clone())?;
        let read = |path: &std::path::Path| {
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
        };
        if self.ca_cert.is_some() || self.client_cert.is_some() {
            let mut tls = tonic::transport::ClientTlsConfig::new();
            if let Some(ca) = &self.ca_cert {
                tls = tls.ca_certificate(tonic::transport::Certificate::from_pem(read(ca)?));
            }
            if let (Some(cert), Some(key)) = (&self.client_cert, &self.client_key) {
                tls = tls.identity(tonic::transport::Identity::from_pem(
                    read(cert)?,
                    read(key)?,
                ));
            }
            endpoint = endpoint.tls_config(tls)?;
        }
        Ok((endpoint.connect().await?, bearer))
    }

    async fn client(&self) -> Result<cli::client::Client, Box<dyn std::error::Error>> {
        let (channel, bearer) = self.channel().await?;
        cli::client::Client::new(self.binding, channel, bearer)
    }
}

type AnyError = Box<dyn std::error::Error + Send + Sync>;

/// Errors end the process with their message, as written (not Rust's
/// quoted debug form), and exit status 1.
fn main() -> std::process::ExitCode {
    let result = a2a_lifecycle::server::runtime()
        .map_err(|e| Box::new(e) as Box<dyn std::error::Error>)
        .and_then(|runtime| runtime.block_on(run()));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // `a2a-lifecycle ... | head`: the reader has what it wanted.
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    // Flushes the spans not yet exported when the command ends.
    let _logging = cli::logging::init(cli.log_format, cli.otlp_endpoint.as_deref())?;
    match cli.command {
        Command::Serve {
            listen,
            store,
            lease,
            strict_transitions,
            no_metrics,
            metrics_listen,
            task_timeout,
            retain,
            deployer_approval_delay,
            public_url,
            extended_card,
            bindings,
            cors_origins,
            card_signing_key,
            no_v0_3,
            no_console,
            card_signing_kid,
            card_signing_jku,
            auth,
            insecure_open,
            tls_cert,
            tls_key,
            tls_client_ca,
            default_agent,
            connections,
            push,
        } => {
            // Secure by default (spec §13.1): a server others can reach
            // must know who calls it.
            if auth.is_none()
                && tls_client_ca.is_none()
                && !listen.ip().is_loopback()
                && !insecure_open
            {
                return Err(format!(
                    "refusing to serve {listen} without --auth: anyone who can reach it could \
                     read, cancel and continue every task. Give --auth FILE or --tls-client-ca \
                     (README, Security), listen on a loopback address, or pass --insecure-open \
                     to serve it open."
                )
                .into());
            }
            let auth = auth
                .map(|path| {
                    a2a_lifecycle::auth::Authenticator::load(&path).map(std::sync::Arc::new)
                })
                .transpose()?;
            let tls = match (tls_cert, tls_key) {
                (Some(cert), Some(key)) => {
                    use a2a_lifecycle::connections::{ClientCerts, Tls, TlsFiles};
                    // Optional at the TLS layer even with mutual TLS alone:
                    // the cards and health stay reachable without a
                    // certificate, and the A2A service refuses calls
                    // without one (UNAUTHENTICATED, with the reason).
                    let clients = match tls_client_ca {
                        None => ClientCerts::None,
                        Some(_) => ClientCerts::Optional,
                    };
                    let files = TlsFiles {
                        cert,
                        key,
                        client_ca: tls_client_ca,
                    };
                    Some(std::sync::Arc::new(Tls::from_files(files, clients)?))
                }
                _ => None,
            };
            let extended_card = extended_card
                .map(|path| DiscoveryConfig::read_extended_card(&path))
                .transpose()?;
            let signer = card_signing_key
                .map(|path| CardSigner::from_file(&path, card_signing_kid, card_signing_jku))
                .transpose()?
                .map(|signer| {
                    tracing::info!(
                        kid = signer.kid(),
                        algorithm = ?signer.algorithm(),
                        "signing the agent cards"
                    );
                    std::sync::Arc::new(signer)
                });
            let store = open_store(&store, lease)
                .await
                .map_err(|e| e as Box<dyn std::error::Error>)?;
            let listener = TcpListener::bind(listen).await?;
            let operations_listener = match metrics_listen {
                Some(addr) => Some(TcpListener::bind(addr).await?),
                None => None,
            };
            let runtime = RuntimeConfig {
                policy: if strict_transitions {
                    TransitionPolicy::Strict
                } else {
                    TransitionPolicy::Permissive
                },
                task_timeout,
                retain: retain.0,
                metrics: (!no_metrics).then(|| std::sync::Arc::new(Metrics::new())),
                ..Default::default()
            };
            let agents = demo_router_with(
                Deployer {
                    approval_delay: deployer_approval_delay,
                },
                default_agent,
            );
            let parts = ServerParts {
                store,
                agents,
                runtime,
                discovery: DiscoveryConfig {
                    public_url,
                    extended_card,
                    // Declared from --auth when the server starts.
                    security: None,
                    // Declared from `push` when the server starts.
                    push: false,
                    bindings,
                    // Set from `tls` when the server starts.
                    tls: false,
                    cors_origins,
                    signer,
                    no_v0_3,
                    no_console,
                },
                connections: connections.limits(),
                auth,
                tls,
                push: push.settings(),
                operations: a2a_lifecycle::operations::Operations {
                    listener: operations_listener,
                    ..Default::default()
                },
            };
            a2a_lifecycle::connections::raise_descriptor_limit(parts.connections.max_connections);
            reload_on_hangup(parts.auth.clone(), parts.tls.clone())?;
            serve(listener, parts, shutdown_signal())
                .await
                .map_err(|e| e as Box<dyn std::error::Error>)?;
        }
        Command::Send {
            target,
            task_id,
            context_id,
            stream,
            return_immediately,
            metadata,
            message_metadata,
            accepted_output_modes,
            push_url,
            notification_token,
            text,
        } => {
            let mut client = target.client().await?;
            let request = SendMessageRequest {
                tenant: target.tenant.clone(),
                message: Some(Message {
                    message_id: uuid::Uuid::new_v4().to_string(),
                    task_id: task_id.unwrap_or_default(),
                    context_id: context_id.unwrap_or_default(),
                    role: Role::User as i32,
                    parts: vec![Part {
                        content: Some(Content::Text(text)),
                        ..Default::default()
                    }],
                    metadata: message_metadata,
                    ..Default::default()
                }),
                configuration: Some(SendMessageConfiguration {
                    return_immediately,
                    accepted_output_modes,
                    task_push_notification_config: push_url.map(|url| TaskPushNotificationConfig {
                        url,
                        token: notification_token.unwrap_or_default(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                metadata,
            };
            if stream {
                let mut events = client.send_streaming_message(request).await?;
                while let Some(event) = events.next().await {
                    print_line(&event?)?;
                }
            } else {
                print_pretty(&client.send_message(request).await?)?;
            }
        }
        Command::Get {
            target,
            history_length,
            transitions,
            id,
        } => {
            let mut client = target.client().await?;
            if transitions {
                client = client.with_extension(a2a_lifecycle::lifecycle::TRANSITIONS_EXTENSION);
            }
            let task = client
                .get_task(GetTaskRequest {
                    tenant: target.tenant.clone(),
                    id,
                    history_length,
                })
                .await?;
            print_pretty(&task)?;
        }
        Command::List {
            target,
            state,
            context_id,
            page_size,
            page_token,
        } => {
            let status = match state {
                Some(name) => parse_state_name(&name)? as i32,
                None => 0,
            };
            let page = target
                .client()
                .await?
                .list_tasks(ListTasksRequest {
                    tenant: target.tenant.clone(),
                    context_id: context_id.unwrap_or_default(),
                    status,
                    page_size,
                    page_token: page_token.unwrap_or_default(),
                    ..Default::default()
                })
                .await?;
            print_pretty(&page)?;
        }
        Command::Cancel {
            target,
            metadata,
            id,
        } => {
            let task = target
                .client()
                .await?
                .cancel_task(CancelTaskRequest {
                    tenant: target.tenant.clone(),
                    id,
                    metadata,
                })
                .await?;
            print_pretty(&task)?;
        }
        Command::Subscribe { target, id } => {
            let mut events = target
                .client()
                .await?
                .subscribe_to_task(SubscribeToTaskRequest {
                    tenant: target.tenant.clone(),
                    id,
                })
                .await?;
            while let Some(event) = events.next().await {
                print_line(&event?)?;
            }
        }
        Command::Jwks { key, kid } => {
            let signer = CardSigner::from_file(&key, kid, None)?;
            println!("{}", serde_json::to_string_pretty(&signer.jwks())?);
        }
        Command::Card {
            target,
            extended,
            verify,
        } => {
            let card = if extended {
                target
                    .client()
                    .await?
                    .get_extended_agent_card(a2a_lifecycle::proto::GetExtendedAgentCardRequest {
                        tenant: target.tenant.clone(),
                    })
                    .await?
            } else {
                let (channel, _) = target.channel().await?;
                cli::client::public_card(channel, &target.tenant).await?
            };
            // An unverified card is not printed: a script reading stdout
            // must not take it for a checked one.
            let verified = verify
                .map(|path| {
                    let text = std::fs::read_to_string(&path)
                        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
                    let keys: jsonwebtoken::jwk::JwkSet = serde_json::from_str(&text)
                        .map_err(|e| format!("{}: not a JWK set: {e}", path.display()))?;
                    signing::verify(&card, &keys)
                        .map_err(|e| format!("the card's signatures do not verify: {e}"))
                })
                .transpose()?;
            print_pretty(&card)?;
            if let Some(v) = verified {
                eprintln!(
                    "verified: signature {} (kid {:?}, {}) over {}",
                    v.index, v.kid, v.algorithm, v.form
                );
            }
        }
        Command::Top {
            target,
            interval,
            once,
        } => {
            let (channel, bearer) = target.channel().await?;
            let authorization = bearer
                .map(|v| http::HeaderValue::from_bytes(v.as_bytes()))
                .transpose()?;
            let source = cli::top::Source {
                channel,
                authorization,
                server: target.server,
            };
            cli::top::run(source, interval, once).await?;
        }
        Command::Push { command } => push_command(command).await?,
    }
    Ok(())
}

async fn push_command(command: PushCommand) -> Result<(), Box<dyn std::error::Error>> {
    match command {
        PushCommand::Set {
            target,
            id,
            notification_token,
            auth_scheme,
            credentials,
            task_id,
            url,
        } => {
            let config = TaskPushNotificationConfig {
                tenant: target.tenant.clone(),
                task_id,
                id: id.unwrap_or_default(),
                url,
                token: notification_token.unwrap_or_default(),
                authentication: auth_scheme.zip(credentials).map(|(scheme, credentials)| {
                    AuthenticationInfo {
                        scheme,
                        credentials,
                    }
                }),
            };
            let created = target.client().await?.create_push_config(config).await?;
            print_pretty(&created)?;
        }
        PushCommand::Get {
            target,
            task_id,
            id,
        } => {
            let config = target
                .client()
                .await?
                .get_push_config(GetTaskPushNotificationConfigRequest {
                    tenant: target.tenant.clone(),
                    task_id,
                    id,
                })
                .await?;
            print_pretty(&config)?;
        }
        PushCommand::List {
            target,
            page_size,
            page_token,
            task_id,
        } => {
            let page = target
                .client()
                .await?
                .list_push_configs(ListTaskPushNotificationConfigsRequest {
                    tenant: target.tenant.clone(),
                    task_id,
                    page_size: page_size.unwrap_or_default(),
                    page_token: page_token.unwrap_or_default(),
                })
                .await?;
            print_pretty(&page)?;
        }
        PushCommand::Delete {
            target,
            task_id,
            id,
        } => {
            target
                .client()
                .await?
                .delete_push_config(DeleteTaskPushNotificationConfigRequest {
                    tenant: target.tenant.clone(),
                    task_id,
                    id,
                })
                .await?;
        }
        PushCommand::Listen {
            port,
            host,
            notification_token,
        } => {
            let listener = TcpListener::bind((host, port)).await?;
            let addr = listener.local_addr()?;
            // On stderr whatever RUST_LOG says: where to point webhooks.
            eprintln!("receiving push notifications at http://{addr}/");
            let stop = tokio_util::sync::CancellationToken::new();
            let stopping = stop.clone();
            tokio::spawn(async move {
                shutdown_signal().await;
                stopping.cancel();
            });
            a2a_lifecycle::push::receiver::receive(
                listener,
                notification_token,
                |notification| {
                    if let Err(e) = print_line(&notification.event) {
                        tracing::warn!(error = %e, "notification not printable");
                    }
                },
                stop,
            )
            .await;
        }
    }
    Ok(())
}

/// A response as indented ProtoJSON (spec §5.5).
fn print_pretty<M: serde::Serialize>(message: &M) -> Result<(), Box<dyn std::error::Error>> {
    write_out(&json::to_string_pretty(message)?)
}

/// A stream event as one line of ProtoJSON (JSON Lines, for `jq` and
/// scripts).
fn print_line<M: serde::Serialize>(message: &M) -> Result<(), Box<dyn std::error::Error>> {
    write_out(&json::to_string(message)?)
}

/// One line on stdout. A reader that went away (`| head`) is an
/// `io::Error` of kind `BrokenPipe`, which `main` ends on quietly (where
/// `println!` panics).
fn write_out(line: &str) -> Result<(), Box<dyn std::error::Error>> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

/// `--binding`: a binding's name (`grpc`, `jsonrpc`, `http-json`).
fn parse_binding(name: &str) -> Result<Binding, String> {
    Binding::parse(name)
        .ok_or_else(|| format!("{name:?}: the bindings are grpc, jsonrpc, http-json"))
}

async fn open_store(spec: &str, lease: Duration) -> Result<Arc<dyn TaskStore>, AnyError> {
    if spec == "memory" {
        return Ok(Arc::new(MemoryStore::new()));
    }
    if let Some(path) = spec.strip_prefix("sqlite:") {
        let path = path.strip_prefix("//").unwrap_or(path);
        if path.is_empty() {
            return Err("--store sqlite:PATH needs a file path".into());
        }
        let store = SqliteStore::open(path).await?;
        tracing::info!(path, "task store: sqlite");
        return Ok(Arc::new(store));
    }
    if spec.starts_with("postgres://") || spec.starts_with("postgresql://") {
        let store = a2a_lifecycle::store::PostgresStore::open_with_lease(spec, lease).await?;
        tracing::info!(replica = %store.replica_id(), lease = %humantime::format_duration(lease), "task store: postgres");
        return Ok(Arc::new(store));
    }
    Err(format!(
        "unknown --store {:?}; supported: memory, sqlite:PATH, postgres://USER@HOST:PORT/DB",
        without_password(spec)
    )
    .into())
}

/// A store URL as it may be shown: a password in its user information
/// (`USER:PASSWORD@`) or its query (`password=...`) replaced by `***`.
fn without_password(spec: &str) -> String {
    let mut shown = spec.to_owned();
    if let Some(scheme_end) = shown.find("://") {
        let start = scheme_end + 3;
        let authority_end = shown[start..]
            .find(['/', '?'])
            .map_or(shown.len(), |i| start + i);
        if let Some(at) = shown[start..authority_end].rfind('@')
            && let Some(colon) = shown[start..start + at].find(':')
        {
            shown.replace_range(start + colon + 1..start + at, "***");
        }
    }
    if let Some(query) = shown.find('?') {
        let (head, tail) = shown.split_at(query + 1);
        let tail: Vec<String> = tail
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((key, _)) if key.eq_ignore_ascii_case("password") => format!("{key}=***"),
                _ => pair.to_owned(),
            })
            .collect();
        shown = format!("{head}{}", tail.join("&"));
    }
    shown
}

/// `--retain`: a duration, or `off`.
#[derive(Clone, Copy, Debug)]
struct Retain(Option<Duration>);

/// `--metadata '{"k": "v"}'`: a JSON object, read as ProtoJSON reads a
/// `google.protobuf.Struct` (through the request message that holds one,
/// so the same descriptor-driven decoder does it).
fn parse_metadata(text: &str) -> Result<a2a_lifecycle::wkt::Struct, String> {
    let wrapped = format!("{{\"metadata\": {text}}}");
    let request: SendMessageRequest = a2a_lifecycle::json::from_str(&wrapped)
        .map_err(|e| format!("metadata must be a JSON object: {e}"))?;
    request
        .metadata
        .ok_or_else(|| "metadata must be a JSON object".to_owned())
}

fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(d) if d.is_zero() => Err("must be longer than zero".into()),
        Ok(d) => Ok(d),
        Err(e) => Err(e.to_string()),
    }
}

fn parse_retain(text: &str) -> Result<Retain, String> {
    match text {
        "off" | "forever" => Ok(Retain(None)),
        other => humantime::parse_duration(other)
            .map(|d| Retain(Some(d)))
            .map_err(|e| e.to_string()),
    }
}

/// SIGHUP reloads the auth file and the TLS files (key and certificate
/// rotation) without dropping a connection; see [`a2a_lifecycle::server::reload`].
fn reload_on_hangup(
    auth: Option<Arc<a2a_lifecycle::auth::Authenticator>>,
    tls: Option<Arc<connections::Tls>>,
) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangups = signal(SignalKind::hangup())?;
        tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                a2a_lifecycle::server::reload(auth.as_deref(), tls.as_deref());
            }
        });
    }
    #[cfg(not(unix))]
    drop((auth, tls));
    Ok(())
}
