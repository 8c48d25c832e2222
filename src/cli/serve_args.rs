//! `serve`'s flags: where it listens, its store, agents, discovery,
//! security, connection bounds and push notifications, and what each
//! group of them becomes in the server's settings.

use std::net::SocketAddr;
use std::time::Duration;

use clap::builder::TypedValueParser;

use a2a_lifecycle::agent::demo::DefaultAgent;
use a2a_lifecycle::bindings::BindingSet;
use a2a_lifecycle::connections;

use super::args::parse_positive_duration;

/// Everything `serve` is told (`a2a-lifecycle serve --help`).
#[derive(clap::Args)]
pub struct ServeArgs {
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,
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
    pub store: String,
    /// With a PostgreSQL store, shared by replicas: how long this
    /// replica's lease lasts (renewed every third of it, on its own
    /// connection). A replica that dies has its active tasks failed by
    /// another once its lease has run out; one that cannot renew in
    /// time stops its runs and takes no writes until it renews (and
    /// webhook attempts time out after at most half of it).
    #[arg(long, default_value = "10s", value_parser = parse_positive_duration)]
    pub lease: Duration,
    /// Enforce seed 001's stricter transition table (see README).
    #[arg(long)]
    pub strict_transitions: bool,
    /// Count nothing and serve no `GET /metrics` (metrics are on by
    /// default; see README, Operations).
    #[arg(long)]
    pub no_metrics: bool,
    /// Also serve `/metrics` (without authentication), `/healthz`,
    /// `/readyz` and the gRPC health service on this address, over
    /// plain HTTP; open until the server has drained. For a private
    /// network or loopback.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// FAIL a task still SUBMITTED or WORKING this long after its run
    /// started (e.g. `30s`, `10m`); off by default.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub task_timeout: Option<Duration>,
    /// Purge terminal tasks whose status is older than this (e.g. `7d`,
    /// `12h`); `off` keeps them forever.
    #[arg(long, default_value = "7d", value_parser = parse_retain)]
    pub retain: Retain,
    /// Demo deployer: how long until the approval arrives by itself.
    #[arg(long, default_value = "200ms", value_parser = humantime::parse_duration)]
    pub deployer_approval_delay: Duration,
    /// The address the agent cards advertise, when clients reach the
    /// server at another address than --listen (proxy, container):
    /// `HOST:PORT` (`:443`: HTTPS), or an `http://` or `https://` URL.
    #[arg(long, value_name = "HOST:PORT|URL", value_parser = parse_public_url)]
    pub public_url: Option<String>,
    /// The default agent's extended agent card: a ProtoJSON `AgentCard`
    /// file, served by GetExtendedAgentCard and declared on the card.
    #[arg(long)]
    pub extended_card: Option<std::path::PathBuf>,
    /// The protocol bindings served on the port, comma-separated:
    /// `grpc`, `jsonrpc` (JSON-RPC 2.0 at `/`), `http-json` (the REST
    /// routes). The cards list exactly these.
    #[arg(long, default_value = "grpc,jsonrpc,http-json", value_parser = BindingSet::parse)]
    pub bindings: BindingSet,
    /// A browser origin (`https://console.example.com`) allowed to call
    /// the JSON bindings (CORS); repeatable. None by default.
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    pub cors_origins: Vec<String>,
    /// Sign every agent card served (public, per tenant, extended)
    /// with this PEM private key (spec §8.4): ES256 (P-256), ES384
    /// (P-384), RS256 (RSA, 2048 bits or more) or EdDSA (Ed25519).
    /// `a2a-lifecycle jwks PEM` prints the public key to publish.
    #[arg(long, value_name = "PEM")]
    pub card_signing_key: Option<std::path::PathBuf>,
    /// Serve protocol 1.0 only: no 0.3 methods or card fields, and a
    /// request without `A2A-Version` (a 0.3 client's, spec §3.6.2) is
    /// VersionNotSupported.
    #[arg(long = "no-v0-3")]
    pub no_v0_3: bool,
    /// Serve no browser console at `/console` (it is served with the
    /// http-json binding, which it speaks, by default).
    #[arg(long)]
    pub no_console: bool,
    /// The `kid` of the signatures' protected header; by default the
    /// key's RFC 7638 thumbprint.
    #[arg(long, value_name = "KID", requires = "card_signing_key")]
    pub card_signing_kid: Option<String>,
    /// A `jku` for the protected header: the URL where verifiers find
    /// the public key set.
    #[arg(long, value_name = "URL", requires = "card_signing_key")]
    pub card_signing_jku: Option<String>,
    /// Principals and JWT issuer (TOML; README, Security): every A2A
    /// call must then authenticate with `authorization: Bearer ...`.
    #[arg(long)]
    pub auth: Option<std::path::PathBuf>,
    /// Serve a non-loopback address without --auth (anyone who reaches
    /// the port may read and change every task).
    #[arg(long)]
    pub insecure_open: bool,
    /// Certificate chain (PEM) for TLS on the port: gRPC and the cards.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
    /// CA certificates (PEM) for mutual TLS: a client certificate they
    /// verify names its principal (subject CN, else first DNS name).
    /// Without --auth, every such client is a user of every tenant and
    /// A2A calls without one are refused; cards and health stay public.
    #[arg(long, requires = "tls_cert")]
    pub tls_client_ca: Option<std::path::PathBuf>,
    /// The agent serving requests without a tenant.
    #[arg(
        long,
        default_value = "test-runner",
        value_parser = clap::builder::PossibleValuesParser::new(DefaultAgent::NAMES)
            .try_map(|name| name.parse::<DefaultAgent>()),
    )]
    pub default_agent: DefaultAgent,
    #[command(flatten)]
    pub connections: ConnectionLimitArgs,
    #[command(flatten)]
    pub push: PushArgs,
}

/// Connection bounds (`a2a_lifecycle::connections`; README, Limits).
#[derive(clap::Args)]
pub struct ConnectionLimitArgs {
    /// Connections served at once; one more is closed at accept.
    #[arg(
        long,
        default_value_t = connections::MAX_CONNECTIONS,
        value_parser = parse_connections
    )]
    max_connections: usize,
    /// Connections one client address (an IPv6 /64) may hold at once; one
    /// more is closed at accept.
    #[arg(
        long,
        default_value_t = connections::MAX_CONNECTIONS_PER_PEER,
        value_parser = parse_connections
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

impl ConnectionLimitArgs {
    pub fn limits(&self) -> connections::ConnectionLimits {
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
pub struct PushArgs {
    /// Do not offer push notifications: the config RPCs answer
    /// PUSH_NOTIFICATION_NOT_SUPPORTED and the cards say so.
    #[arg(long, conflicts_with_all = ["push_allow_cidr", "push_timeout", "push_max_attempts"])]
    no_push: bool,
    /// An address range webhooks may reach although it is refused by
    /// default (loopback, private, link-local, ...), e.g. `10.1.0.0/16`
    /// or `127.0.0.0/8`; repeat for several.
    #[arg(long = "push-allow-cidr", value_name = "CIDR", value_parser = parse_cidr)]
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
    pub fn settings(self) -> Option<a2a_lifecycle::push::deliver::Settings> {
        (!self.no_push).then(|| a2a_lifecycle::push::deliver::Settings {
            egress: a2a_lifecycle::push::egress::Egress::new(self.push_allow_cidr),
            timeout: self.push_timeout,
            max_attempts: self.push_max_attempts,
            ..Default::default()
        })
    }
}

/// `--retain`: a duration, or `off`.
#[derive(Clone, Copy, Debug)]
pub struct Retain(pub Option<Duration>);

fn parse_retain(text: &str) -> Result<Retain, String> {
    match text {
        "off" | "forever" => Ok(Retain(None)),
        other => humantime::parse_duration(other)
            .map(|d| Retain(Some(d)))
            .map_err(|e| {
                format!("{e}: give a duration such as 7d, 12h or 30m, or off to keep tasks forever")
            }),
    }
}

/// `--max-connections`, `--max-connections-per-peer`: 1 or more.
fn parse_connections(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("0 would refuse every connection: give 1 or more".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("{e}: give a number of connections, 1 or more")),
    }
}

/// `--push-allow-cidr`: a range; a lone address is told how to write
/// one.
fn parse_cidr(text: &str) -> Result<ipnet::IpNet, String> {
    text.parse()
        .map_err(|e| match text.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V4(_)) => format!(
                "a range is needed, not an address: {text}/32 for this address alone, or a wider \
             range such as 127.0.0.0/8"
            ),
            Ok(std::net::IpAddr::V6(_)) => {
                format!("a range is needed, not an address: {text}/128 for this address alone")
            }
            Err(_) => format!("{e}: expected a range such as 10.1.0.0/16 or 127.0.0.0/8"),
        })
}

/// `--public-url`: `HOST:PORT`, or an `http(s)://HOST[:PORT]` URL with no
/// path (the cards' gRPC address is its authority, the JSON bindings'
/// the URL itself; README, Discovery).
fn parse_public_url(text: &str) -> Result<String, String> {
    let expected = "expected HOST:PORT (a2a.example.com:443) or an http:// or https:// URL \
                    with a host (https://a2a.example.com)";
    let (scheme, rest) = match text.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, text),
    };
    if let Some(scheme) = scheme
        && scheme != "http"
        && scheme != "https"
    {
        return Err(format!("the scheme {scheme:?} is not served: {expected}"));
    }
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.is_empty() || authority.contains(['/', '?', '#', '@', ' ']) {
        return Err(format!("{text:?}: {expected}"));
    }
    let uri: http::uri::Authority = authority
        .parse()
        .map_err(|e| format!("{text:?}: {e}: {expected}"))?;
    if uri.host().is_empty() || (scheme.is_none() && uri.port_u16().is_none()) {
        return Err(format!("{text:?}: {expected}"));
    }
    Ok(text.to_owned())
}
