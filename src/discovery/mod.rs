//! Discovery (spec §8): the agent cards this server publishes, and the
//! request rules that follow from them.
//!
//! Owns:
//! - building one public card per tenant from its agent's own
//!   [`AgentExecutor::card`](crate::agent::AgentExecutor::card), with the
//!   gRPC interface it is reached at (spec §4.4.6 `AgentInterface`, with the
//!   tenant), push support (as the server offers it) and the extended-card
//!   flag;
//! - serving them over HTTP on the gRPC port at
//!   `/.well-known/agent-card.json` (the default agent) and
//!   `/{tenant}/.well-known/agent-card.json`, as ProtoJSON, with
//!   `Cache-Control`, `ETag` and `Last-Modified`, answering
//!   `If-None-Match` / `If-Modified-Since` with 304 (spec §8.2, §8.6);
//! - the per-request checks of spec §3.3.4 and §3.6: the `a2a-version`
//!   metadata, the `a2a-extensions` a card marks required, and the
//!   streaming capability; and, on the message RPCs, the media types the
//!   card accepts (spec §3.3.2, [`InputModes`]);
//! - GetExtendedAgentCard (spec §3.1.11): the `--extended-card` file, given
//!   the same server-filled fields as the public card, and refused at start
//!   when it contradicts them;
//! - signing every card it serves with `--card-signing-key` (spec §8.4,
//!   [`signing`]), with an ETag over the unsigned card.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::agent::AgentRouter;
use crate::content::InputModes;
use crate::error::A2aError;
use crate::json::{self, JsonError};
use crate::proto::{AgentCard, AgentInterface, AgentProvider, Message};

mod extended;
mod parameters;
pub mod signing;
pub mod v0_3;

use parameters::check_version;
pub use parameters::{
    EXTENSIONS_METADATA, LEGACY_EXTENSIONS_METADATA, PROTOCOL_VERSION, ServiceParameters,
    VERSION_METADATA,
};

/// How long clients and proxies may reuse a fetched card (spec §8.6).
pub const CARD_MAX_AGE: Duration = Duration::from_secs(300);

/// What the operator says about discovery.
#[derive(Clone, Debug, Default)]
pub struct DiscoveryConfig {
    /// `host:port` clients should use, when the bind address is not it
    /// (behind a proxy, in a container). Defaults to the bound address.
    pub public_url: Option<String>,
    /// The default agent's extended card (spec §3.1.11), from
    /// `--extended-card`. The default agent's public card then declares
    /// `capabilities.extendedAgentCard`.
    pub extended_card: Option<AgentCard>,
    /// How callers authenticate, when the server requires it (`--auth`):
    /// declared on every card (spec §4.5, §13.1); the cards themselves stay
    /// public.
    pub security: Option<CardSecurity>,
    /// Push notifications are delivered (`serve` with push on): the cards
    /// declare `capabilities.pushNotifications` (spec §3.3.4).
    pub push: bool,
    /// The protocol bindings served (`serve --bindings`): one interface
    /// each on every card (spec §8.3.1).
    pub bindings: crate::bindings::BindingSet,
    /// The port speaks TLS: the JSON bindings' URLs are `https://`.
    pub tls: bool,
    /// `--cors-origin`: the browser origins the JSON bindings answer
    /// (preflight and CORS headers); none by default.
    pub cors_origins: Vec<String>,
    /// `--card-signing-key`: every card served (public, per tenant,
    /// extended) carries this key's signatures (spec §8.4).
    pub signer: Option<Arc<signing::CardSigner>>,
    /// Protocol 0.3 is not served (`--no-v0-3`): the cards carry no 0.3
    /// fields.
    pub no_v0_3: bool,
    /// `serve --no-console`: no browser console at `/console` (it is
    /// served with the HTTP+JSON binding it speaks, by default).
    pub no_console: bool,
}

/// Declares the extensions the server itself offers on every agent's
/// card (spec §4.6: `capabilities.extensions`), whatever the agent's
/// card said: the transition log ([`crate::lifecycle::TRANSITIONS_EXTENSION`]).
/// Not required: a client that does not activate it sees tasks unchanged.
pub(crate) fn declare_server_extensions(capabilities: &mut crate::proto::AgentCapabilities) {
    let uri = crate::lifecycle::TRANSITIONS_EXTENSION;
    if capabilities.extensions.iter().any(|e| e.uri == uri) {
        return;
    }
    capabilities.extensions.push(crate::proto::AgentExtension {
        uri: uri.to_owned(),
        description: "The task's transition log (state, timestamp, status message id, cause) \
            in GetTask's task.metadata under this URI, when a call names it in A2A-Extensions."
            .to_owned(),
        required: false,
        params: None,
    });
}

/// What the cards declare of the server's authentication.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CardSecurity {
    /// Bearer credentials authenticate (`--auth`).
    pub bearer: bool,
    /// Bearer tokens may be JWTs (`[jwt]` in the auth file), not only API
    /// keys.
    pub jwt: bool,
    /// Client certificates authenticate (`--tls-client-ca`).
    pub mtls: bool,
}

/// The name of the bearer scheme in `securitySchemes`.
pub const BEARER_SCHEME: &str = "bearer";
/// The name of the mutual TLS scheme in `securitySchemes`.
pub const MTLS_SCHEME: &str = "mtls";

impl CardSecurity {
    /// Declares the schemes on `card` and requires one of them (each
    /// requirement is an alternative), replacing what the agent declared:
    /// the server enforces these on every call.
    fn declare(&self, card: &mut AgentCard) {
        use crate::proto::{
            HttpAuthSecurityScheme, MutualTlsSecurityScheme, SecurityRequirement, SecurityScheme,
            StringList, security_scheme::Scheme,
        };
        let mut schemes = Vec::new();
        let bearer = HttpAuthSecurityScheme {
            description: if self.jwt {
                "An API key or a JWT, as `authorization: Bearer <token>`.".into()
            } else {
                "An API key, as `authorization: Bearer <key>`.".into()
            },
            scheme: "Bearer".into(),
            bearer_format: if self.jwt {
                "JWT".into()
            } else {
                String::new()
            },
        };
        if self.bearer {
            schemes.push((BEARER_SCHEME, Scheme::HttpAuthSecurityScheme(bearer)));
        }
        if self.mtls {
            let mtls = MutualTlsSecurityScheme {
                description: "A client certificate from the server's client CA; its subject \
                              common name (else its first DNS name) is the principal."
                    .into(),
            };
            schemes.push((MTLS_SCHEME, Scheme::MtlsSecurityScheme(mtls)));
        }
        card.security_requirements = schemes
            .iter()
            .map(|(name, _)| SecurityRequirement {
                schemes: [(name.to_string(), StringList::default())]
                    .into_iter()
                    .collect(),
            })
            .collect();
        card.security_schemes = schemes
            .into_iter()
            .map(|(name, scheme)| {
                (
                    name.to_owned(),
                    SecurityScheme {
                        scheme: Some(scheme),
                    },
                )
            })
            .collect();
    }
}

impl DiscoveryConfig {
    /// Reads an extended card file (ProtoJSON of `AgentCard`).
    pub fn read_extended_card(path: &std::path::Path) -> Result<AgentCard, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        json::from_str(&text).map_err(|e| format!("{}: not an AgentCard: {e}", path.display()))
    }
}

/// One tenant's published card, ready to serve.
struct Published {
    card: AgentCard,
    extended: Option<AgentCard>,
    body: bytes::Bytes,
    etag: String,
    /// What [`Cards::check`] enforces, read off the card once instead of on
    /// every RPC.
    streaming: bool,
    required_extensions: Vec<String>,
    input_modes: InputModes,
}

/// Why the cards could not be built.
#[derive(thiserror::Error)]
pub enum CardError {
    #[error(transparent)]
    Json(#[from] JsonError),
    #[error(transparent)]
    Signing(#[from] signing::SigningError),
    /// The `--extended-card` file contradicts what the server fills in on
    /// the public card (spec §3.1.11: clients replace the public card with
    /// the extended one, so both must say the same about these fields).
    #[error("extended agent card: {field} {problem}")]
    ExtendedCard {
        /// The contradicting field, by its ProtoJSON name.
        field: &'static str,
        problem: String,
    },
}

/// The message itself: `serve` ends with this error, and a `main` that
/// returns it prints its `Debug`.
impl std::fmt::Debug for CardError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// Every tenant's card, built once at start (cards do not change while
/// the server runs, so one ETag and one Last-Modified hold for its life).
pub struct Cards {
    /// Looked up on every call, keyed by the operator's tenants: a fast
    /// hash (SipHash's DoS resistance guards maps a client fills).
    by_tenant: HashMap<String, Published, foldhash::fast::RandomState>,
    last_modified: SystemTime,
    /// Protocol 0.3 is served beside 1.0 (not `--no-v0-3`).
    v0_3: bool,
    /// What the 0.3 interfaces are made of: the bindings served and the
    /// HTTP base URL.
    bindings: crate::bindings::BindingSet,
    http_url: String,
}

/// The 0.3 interfaces of `tenant` (URL, 0.3 transport name), JSON-RPC
/// first: its endpoint (`/` or `/{tenant}`: 0.3 has no tenant field, the
/// path carries it), then the HTTP+JSON base its `/v1/...` routes follow.
fn v03_interfaces(
    bindings: crate::bindings::BindingSet,
    http_url: &str,
    tenant: &str,
) -> Vec<(String, &'static str)> {
    use crate::bindings::Binding;
    let mut interfaces = Vec::new();
    if bindings.contains(Binding::JsonRpc) {
        interfaces.push((format!("{http_url}/{tenant}"), "JSONRPC"));
    }
    if bindings.contains(Binding::HttpJson) {
        let base = if tenant.is_empty() {
            http_url.to_owned()
        } else {
            format!("{http_url}/{tenant}")
        };
        interfaces.push((base, "HTTP+JSON"));
    }
    // 0.3's gRPC service has no tenant (no field, no path): the default
    // agent's card lists it.
    if bindings.contains(Binding::Grpc) && tenant.is_empty() {
        let authority = http_url
            .trim_start_matches("https://")
            .trim_start_matches("http://")
            .to_owned();
        interfaces.push((authority, "GRPC"));
    }
    interfaces
}

impl Cards {
    /// Builds the cards of every agent in `agents`, reached at `addr`
    /// unless `config.public_url` says otherwise.
    pub fn build(
        agents: &AgentRouter,
        config: &DiscoveryConfig,
        addr: SocketAddr,
    ) -> Result<Self, CardError> {
        let url = match &config.public_url {
            Some(url) => url.clone(),
            // A wildcard bind address is no address for a client; the
            // loopback one works on this machine, and `--public-url`
            // names the right one elsewhere.
            None if addr.ip().is_unspecified() => format!("127.0.0.1:{}", addr.port()),
            None => addr.to_string(),
        };
        // gRPC's URL is the authority clients dial (`host:port`, as gRPC
        // targets are written); the JSON bindings' an HTTP URL (spec
        // §9, §11: the endpoint and the base of the routes).
        let http_url = if url.starts_with("http://") || url.starts_with("https://") {
            url.trim_end_matches('/').to_owned()
        } else if config.tls || url.ends_with(":443") {
            // Behind a TLS-terminating proxy the server speaks plain HTTP
            // but clients reach it over TLS: port 443 says so.
            format!("https://{url}")
        } else {
            format!("http://{url}")
        };
        let grpc_url = url
            .trim_start_matches("https://")
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        let mut by_tenant = HashMap::default();
        for tenant in agents.tenants() {
            let agent = agents.route(&tenant).expect("listed tenant routes");
            let mut card = agent.card();
            card.supported_interfaces = config
                .bindings
                .iter()
                .map(|binding| AgentInterface {
                    url: match binding {
                        crate::bindings::Binding::Grpc => grpc_url.clone(),
                        _ => http_url.clone(),
                    },
                    protocol_binding: binding.protocol_binding().into(),
                    tenant: tenant.clone(),
                    protocol_version: PROTOCOL_VERSION.into(),
                })
                .collect();
            let provider = card.provider.get_or_insert_with(|| AgentProvider {
                organization: "a2a-lifecycle".into(),
                url: String::new(),
            });
            if provider.url.is_empty() {
                // The demo agents are documented by their own cards.
                provider.url = format!("{http_url}/.well-known/agent-card.json");
            }
            if let Some(security) = &config.security {
                security.declare(&mut card);
            }
            let capabilities = card.capabilities.get_or_insert_with(Default::default);
            // What the server offers, whatever the agent said: with push
            // off, the RPCs answer PUSH_NOTIFICATION_NOT_SUPPORTED.
            capabilities.push_notifications = Some(config.push);
            declare_server_extensions(capabilities);
            let mut extended = match &config.extended_card {
                Some(file) if tenant.is_empty() => {
                    capabilities.extended_agent_card = Some(true);
                    let mut extended = extended::complete(file.clone(), &card)?;
                    if let Some(security) = &config.security {
                        security.declare(&mut extended);
                    }
                    Some(extended)
                }
                _ => None,
            };
            let capabilities = card.capabilities.as_ref().expect("set above");
            let streaming = capabilities.streaming == Some(true);
            let required_extensions = capabilities
                .extensions
                .iter()
                .filter(|e| e.required)
                .map(|e| e.uri.clone())
                .collect();
            let input_modes = InputModes::of(&card);
            if input_modes.declared().is_empty() {
                tracing::warn!(
                    tenant,
                    "the agent's card declares no input modes: every message to it is refused"
                );
            }
            // The tag names the card's content, not its bytes: it is taken
            // before signing, so a new signature (another key, another
            // start) keeps clients' cached copies valid, and it is weak
            // (RFC 9110 §8.8.1) because the signed bytes may differ.
            // Signatures the agent or the extended card file brought cover
            // a card the server has since filled in (interfaces, provider,
            // capabilities): they could not verify, so they go.
            card.signatures.clear();
            if let Some(extended) = &mut extended {
                extended.signatures.clear();
            }
            let mut hasher = DefaultHasher::new();
            json::to_string(&card)?.hash(&mut hasher);
            let etag = format!("W/\"{:016x}\"", hasher.finish());
            if let Some(signer) = &config.signer {
                signer.sign(&mut card)?;
                if let Some(extended) = &mut extended {
                    signer.sign(extended)?;
                }
            }
            let mut value = json::to_value(&card)?;
            let interfaces = if config.no_v0_3 {
                Vec::new()
            } else {
                v03_interfaces(config.bindings, &http_url, &tenant)
            };
            v0_3::add_fields(&mut value, &card, &interfaces);
            let body =
                serde_json::to_string_pretty(&value).map_err(|e| JsonError::from_display(&e))?;
            let body = bytes::Bytes::from(body);
            by_tenant.insert(
                tenant,
                Published {
                    card,
                    extended,
                    body,
                    etag,
                    streaming,
                    required_extensions,
                    input_modes,
                },
            );
        }
        Ok(Cards {
            by_tenant,
            // HTTP dates have whole seconds; a sub-second start time would
            // make every If-Modified-Since look older than the card.
            last_modified: truncate_to_seconds(SystemTime::now()),
            v0_3: !config.no_v0_3,
            bindings: config.bindings,
            http_url,
        })
    }

    /// The 0.3 interfaces of `tenant`'s card (URL, 0.3 transport name).
    pub fn v03_interfaces(&self, tenant: &str) -> Vec<(String, &'static str)> {
        if !self.v0_3 {
            return Vec::new();
        }
        v03_interfaces(self.bindings, &self.http_url, tenant)
    }

    /// Whether protocol 0.3 is served (spec §3.6.2: else a request
    /// without `A2A-Version`, a 0.3 one, is VersionNotSupported).
    pub fn serves_v0_3(&self) -> bool {
        self.v0_3
    }

    /// The base URL of the JSON bindings and the cards, as the cards
    /// advertise it (`--public-url`, else the bound address).
    pub fn http_url(&self) -> &str {
        &self.http_url
    }

    /// The tenants with a card, `""` (the default agent) among them.
    pub fn tenants(&self) -> Vec<String> {
        self.by_tenant.keys().cloned().collect()
    }

    /// The public card of `tenant`'s agent.
    pub fn card(&self, tenant: &str) -> Option<&AgentCard> {
        self.by_tenant.get(tenant).map(|p| &p.card)
    }

    /// GetExtendedAgentCard (spec §3.1.11, §3.3.4).
    pub fn extended(&self, tenant: &str) -> Result<AgentCard, A2aError> {
        let Some(published) = self.by_tenant.get(tenant) else {
            return Err(A2aError::invalid(
                "tenant",
                format!("no agent is served for tenant {tenant:?}"),
            ));
        };
        if let Some(extended) = &published.extended {
            return Ok(extended.clone());
        }
        let declared = published
            .card
            .capabilities
            .as_ref()
            .and_then(|c| c.extended_agent_card)
            .unwrap_or(false);
        if declared {
            Err(A2aError::ExtendedAgentCardNotConfigured)
        } else {
            Err(A2aError::unsupported(
                "this agent has no extended agent card (capabilities.extendedAgentCard is off)",
                None,
            ))
        }
    }

    /// The checks every request passes before it is served: the protocol
    /// version (spec §3.6.2), the extensions the agent requires (spec
    /// §3.3.4), and, for the streaming RPCs, the streaming capability.
    /// An unknown tenant passes here; the request's own validation reports
    /// it on the `tenant` field.
    pub fn check(
        &self,
        params: &ServiceParameters,
        tenant: &str,
        streaming: bool,
    ) -> Result<(), A2aError> {
        self.checked(params, tenant, streaming).map(|_| ())
    }

    /// [`Cards::check`], then, for SendMessage and SendStreamingMessage,
    /// the media type of every part of `message` against the input modes
    /// of the tenant's card (spec §3.3.2: ContentTypeNotSupportedError).
    /// An unknown tenant, or a missing message, is left to validation.
    pub fn check_send(
        &self,
        params: &ServiceParameters,
        tenant: &str,
        streaming: bool,
        message: Option<&Message>,
    ) -> Result<(), A2aError> {
        if let Some(published) = self.checked(params, tenant, streaming)?
            && let Some(message) = message
        {
            published.input_modes.check(message)?;
        }
        Ok(())
    }

    /// The shared checks; the tenant's card when there is one.
    fn checked(
        &self,
        params: &ServiceParameters,
        tenant: &str,
        streaming: bool,
    ) -> Result<Option<&Published>, A2aError> {
        match params.version.as_deref() {
            // Spec §3.6.2: no version, or an empty one, is 0.3. While 0.3
            // is served, a 1.0 operation without one is served as 1.0
            // (the operation's name already says which version it is,
            // and 1.0 clients that leave the header out exist); without
            // 0.3, the request is refused as the spec says.
            None | Some("") if !self.v0_3 => {
                return Err(A2aError::VersionNotSupported {
                    requested: "0.3".into(),
                });
            }
            version => check_version(version)?,
        }
        let Some(published) = self.by_tenant.get(tenant) else {
            // The same answer on every RPC: a tenant no agent serves is a
            // bad argument, not an empty list or a missing task.
            let mut served: Vec<&str> = self.by_tenant.keys().map(String::as_str).collect();
            served.sort_unstable();
            return Err(A2aError::invalid(
                "tenant",
                format!("no agent is served under tenant {tenant:?}; served tenants: {served:?}"),
            ));
        };
        if streaming && !published.streaming {
            return Err(A2aError::unsupported(
                "this agent does not support streaming (capabilities.streaming is off)",
                None,
            ));
        }
        if let Some(missing) = published
            .required_extensions
            .iter()
            .find(|uri| !params.extensions.contains(uri))
        {
            return Err(A2aError::ExtensionSupportRequired {
                uri: missing.clone(),
            });
        }
        Ok(Some(published))
    }

    /// The HTTP routes that serve the cards.
    pub fn router(self: Arc<Self>) -> axum::Router {
        axum::Router::new()
            .route("/.well-known/agent-card.json", get(root_card))
            .route("/{tenant}/.well-known/agent-card.json", get(tenant_card))
            .with_state(self)
    }

    fn respond(&self, tenant: &str, request: &HeaderMap) -> Response {
        let Some(published) = self.by_tenant.get(tenant) else {
            return (
                StatusCode::NOT_FOUND,
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                format!("no agent is served for tenant {tenant:?}\n"),
            )
                .into_response();
        };
        let last_modified = httpdate::fmt_http_date(self.last_modified);
        let cache = format!("public, max-age={}", CARD_MAX_AGE.as_secs());
        let headers = [
            (header::ETAG, published.etag.clone()),
            (header::LAST_MODIFIED, last_modified),
            (header::CACHE_CONTROL, cache),
        ];
        if self.not_modified(published, request) {
            return (StatusCode::NOT_MODIFIED, headers).into_response();
        }
        let mut response = (headers, Body::from(published.body.clone())).into_response();
        let out = response.headers_mut();
        out.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        // Cards are public: browser-based inspectors may read them.
        out.insert(
            header::ACCESS_CONTROL_ALLOW_ORIGIN,
            HeaderValue::from_static("*"),
        );
        response
    }

    /// RFC 9110 §13.1: If-None-Match decides when present (weak
    /// comparison, `*` matches); otherwise If-Modified-Since.
    fn not_modified(&self, published: &Published, request: &HeaderMap) -> bool {
        let if_none_match: Vec<&str> = request
            .get_all(header::IF_NONE_MATCH)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .collect();
        if !if_none_match.is_empty() {
            let ours = published.etag.trim_start_matches("W/");
            return if_none_match
                .iter()
                .any(|tag| *tag == "*" || tag.trim_start_matches("W/") == ours);
        }
        request
            .get(header::IF_MODIFIED_SINCE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| httpdate::parse_http_date(v).ok())
            .is_some_and(|since| self.last_modified <= since)
    }
}

async fn root_card(State(cards): State<Arc<Cards>>, headers: HeaderMap) -> Response {
    cards.respond("", &headers)
}

async fn tenant_card(
    State(cards): State<Arc<Cards>>,
    Path(tenant): Path<String>,
    headers: HeaderMap,
) -> Response {
    cards.respond(&tenant, &headers)
}

fn truncate_to_seconds(t: SystemTime) -> SystemTime {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}
