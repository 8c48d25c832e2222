//! Who is calling: the principals of `--auth FILE`, and turning a request's
//! `authorization: Bearer ...` into one of them (spec §13.1: every
//! operation is authorized; §13.3: the extended card needs authentication).
//!
//! The file (TOML) lists API-key principals and, optionally, a JWT issuer:
//!
//! ```toml
//! [[principal]]
//! name = "ci-bot"
//! # SHA-256 of the API key, lowercase hex: the key itself is never stored
//! api_key_sha256 = "4f8b42c22dd3729b519ba6f68d2da7cc5b2d606d05daed5ad5128cc03e6c6358"
//! tenants = ["", "code-reviewer"]   # tenants it may use; "*" means all
//! role = "user"                     # "user": its own tasks only; "admin": all tasks of its tenants
//! max_open_tasks = 100              # optional: its tasks not yet ended, at once (all tenants)
//! max_input_wait = "1h"             # optional: a task of its waiting for input longer fails
//!
//! [jwt]                             # optional: bearer JWTs from an identity provider
//! issuer = "https://id.example.test"
//! audience = "a2a-lifecycle"
//! jwks_file = "jwks.json"           # local JSON Web Key Set (RS256, ES256); no network fetch
//! tenants_claim = "tenants"         # array of tenant names, "*" for all
//! admin_claim = "a2a_admin"         # boolean; true gives the admin role
//! max_open_tasks = 20               # optional: the quotas of every JWT principal
//! max_input_wait = "30m"
//! ```
//!
//! - `api_key_sha256` may be a list while a key is rotated (both valid
//!   until the old one is removed and the file reloaded), or absent for a
//!   principal that authenticates by client certificate only.
//! - A bearer credential that is no principal's API key and has three
//!   dot-separated parts is a JWT: its signature is checked against the key set (RS256 or ES256 only, so
//!   `alg: none` and HMAC are refused), and its issuer, audience, expiry and
//!   not-before. The principal is its `sub`, which may not be the name of
//!   a principal of the file (that principal's tasks are not the
//!   provider's to hand out).
//! - Every credential is first taken as an API key: its SHA-256 is
//!   compared with every principal's, each comparison in constant time, so
//!   the answer's timing says nothing about how close a guess was.
//! - A client certificate verified by the TLS layer (`--tls-client-ca`)
//!   names a principal too: its subject common name, else its first DNS
//!   name ([`crate::connections::ClientCertificate`]). With an auth file the
//!   name must be one of its principals (a principal may have no API key
//!   and authenticate by certificate only), whose tenants and role apply;
//!   with mutual TLS alone ([`Authenticator::client_certificates`]) every
//!   verified client is a `user` of every tenant. A bearer credential, when
//!   sent, is what authenticates.
//! - [`Authenticator::reload`] re-reads the file (SIGHUP): requests already
//!   authenticated keep their principal, the next ones use the new file,
//!   and a file that does not load leaves the old one in force.
//! - This module knows nothing of gRPC: the service maps [`AuthError`] to
//!   UNAUTHENTICATED and a tenant a principal may not use to
//!   PERMISSION_DENIED.
//!
//! This file turns a request into its principal; the parts, each in its
//! file beside it: `principal` (who a caller is), `file` (the auth file's
//! rules), `api_keys`, `jwt` and `failures` (slowing a peer's repeated
//! failures).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

mod api_keys;
mod failures;
mod file;
mod jwt;
mod principal;

pub use failures::{
    FAILURE_WINDOW, FIRST_DELAY, FREE_FAILURES, FailureLimiter, MAX_DELAY, MAX_TRACKED_PEERS,
};
pub use jwt::{JWT_LEEWAY_SECS, MAX_CACHED_TOKENS};
pub use principal::{Principal, Role, Tenants};

use file::Rules;

/// The longest `authorization` value looked at; longer is refused unread.
pub const MAX_CREDENTIAL_BYTES: usize = 8 * 1024;

/// Why a request is not authenticated. The text is safe to return and to
/// log: it never holds the credential.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("no credentials: send `authorization: Bearer <API key or JWT>`")]
    Missing,
    /// Mutual TLS alone: only a client certificate authenticates.
    #[error(
        "no client certificate: this server authenticates callers by mutual TLS; connect \
         with a client certificate issued by the CA it trusts"
    )]
    NoCertificate,
    #[error("the authorization value is not `Bearer <credential>`")]
    Malformed,
    #[error("unknown API key")]
    UnknownKey,
    #[error("the client certificate's name {0:?} is no principal of this server")]
    UnknownCertificate(String),
    #[error("the bearer token was refused: {0}")]
    InvalidToken(String),
}

impl AuthError {
    /// A bounded name of the reason, as the `reason` label of
    /// `a2a_auth_failures_total` shows it.
    pub fn kind(&self) -> &'static str {
        match self {
            AuthError::Missing | AuthError::NoCertificate => "missing",
            AuthError::Malformed => "malformed",
            AuthError::UnknownKey => "unknown_key",
            AuthError::UnknownCertificate(_) => "unknown_certificate",
            AuthError::InvalidToken(_) => "invalid_token",
        }
    }
}

/// Why an auth file cannot be used; the server refuses to start.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// The principals of an auth file, ready to check credentials, and the
/// limiter that slows a peer's repeated failures.
pub struct Authenticator {
    /// Replaced whole by [`Authenticator::reload`]; each request reads the
    /// version current when it arrives.
    rules: RwLock<Arc<Rules>>,
    /// The file it was loaded from, for reloads.
    source: Option<PathBuf>,
    failures: FailureLimiter,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rules = self.rules();
        f.debug_struct("Authenticator")
            .field("source", &self.source)
            .field("api_key_principals", &rules.keys.len())
            .field("principals", &rules.named.len())
            .field("jwt", &rules.jwt.is_some())
            .field("any_certificate", &rules.any_certificate)
            .finish()
    }
}

impl Authenticator {
    /// Reads an auth file; a relative `jwks_file` is relative to it.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let rules = Rules::load(path)?;
        Ok(Authenticator {
            rules: RwLock::new(Arc::new(rules)),
            source: Some(path.to_owned()),
            failures: FailureLimiter::default(),
        })
    }

    /// Parses an auth file's text; `dir` resolves a relative `jwks_file`.
    pub fn parse(text: &str, dir: &Path) -> Result<Self, String> {
        Ok(Authenticator {
            rules: RwLock::new(Arc::new(Rules::parse(text, dir)?)),
            source: None,
            failures: FailureLimiter::default(),
        })
    }

    /// Mutual TLS without an auth file: every client whose certificate the
    /// TLS layer verified is a `user` of every tenant, named by its
    /// certificate; nothing else authenticates.
    pub fn client_certificates() -> Self {
        Authenticator {
            rules: RwLock::new(Arc::new(Rules {
                keys: Vec::new(),
                named: HashMap::new(),
                jwt: None,
                verified: Default::default(),
                any_certificate: true,
            })),
            source: None,
            failures: FailureLimiter::default(),
        }
    }

    /// Reads the auth file again (SIGHUP: key rotation) and puts it in
    /// force for the requests that follow. On an error the file in force
    /// stays. Without a file (mutual TLS alone, or parsed text) there is
    /// nothing to reload: `Ok(false)`.
    pub fn reload(&self) -> Result<bool, ConfigError> {
        let Some(path) = &self.source else {
            return Ok(false);
        };
        let rules = Arc::new(Rules::load(path)?);
        *self.rules.write().unwrap_or_else(|e| e.into_inner()) = rules;
        Ok(true)
    }

    fn rules(&self) -> Arc<Rules> {
        // Only a swap happens under the write lock; nothing can poison it
        // half-done.
        self.rules.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Authenticator {
    /// Whether bearer tokens may be JWTs (the file has `[jwt]`).
    pub fn accepts_jwt(&self) -> bool {
        self.rules().jwt.is_some()
    }

    /// The quota of the principal named `owner` (a task's owner): a file
    /// principal's own, else (a JWT's `sub`) the `[jwt]` section's; none
    /// for a name the file does not know.
    pub fn quota_of(&self, owner: &str) -> crate::store::Quota {
        let rules = self.rules();
        match (rules.named.get(owner), &rules.jwt) {
            (Some(principal), _) => principal.quota,
            (None, Some(jwt)) if !owner.is_empty() => jwt.quota,
            _ => crate::store::Quota::NONE,
        }
    }

    /// The shortest `max_input_wait` of the file, if any sets one: how old
    /// a waiting task must be before the sweep looks at it.
    pub fn shortest_input_wait(&self) -> Option<std::time::Duration> {
        let rules = self.rules();
        rules
            .named
            .values()
            .map(|p| p.quota)
            .chain(rules.jwt.as_ref().map(|j| j.quota))
            .filter_map(|q| q.max_input_wait)
            .min()
    }

    /// Whether bearer credentials can authenticate at all (not mutual TLS
    /// alone).
    pub fn accepts_bearer(&self) -> bool {
        !self.rules().any_certificate
    }

    /// Lets each peer fail `free` times per window before it is slowed
    /// (default [`FREE_FAILURES`]).
    pub fn with_free_failures(mut self, free: u32) -> Self {
        self.failures.free = free;
        self
    }

    /// Records a failed authentication from `peer`; how long to wait
    /// before answering it ([`FailureLimiter`]).
    pub fn record_failure(&self, peer: std::net::IpAddr) -> std::time::Duration {
        self.failures
            .record_failure(peer, std::time::Instant::now())
    }

    /// What every refused credential gets, wherever it was offered (an
    /// A2A call over a binding, or `/metrics`: the `route`): logged with its reason cut
    /// short, counted in `metrics`, and answered only after the peer's
    /// delay, so a guesser gains nothing by moving to another route.
    pub async fn refused(
        &self,
        peer: Option<std::net::SocketAddr>,
        route: &'static str,
        error: &AuthError,
        metrics: Option<&crate::metrics::Metrics>,
    ) {
        let reason =
            crate::error::cut(&error.to_string(), crate::error::MAX_MESSAGE_BYTES).into_owned();
        tracing::warn!(
            peer = peer.map(tracing::field::display),
            route,
            %reason,
            "authentication failed"
        );
        if let Some(metrics) = metrics {
            metrics.auth.failed(error.kind(), route);
        }
        if let Some(peer) = peer {
            let delay = self.record_failure(peer.ip());
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
        }
    }

    /// The principal behind an `authorization` value.
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<Principal, AuthError> {
        let value = authorization.ok_or(AuthError::Missing)?;
        if value.len() > MAX_CREDENTIAL_BYTES {
            return Err(AuthError::Malformed);
        }
        let credential = bearer(value).ok_or(AuthError::Malformed)?;
        let rules = self.rules();
        // The keys first, whatever the credential looks like: an API key
        // may have the shape of a JWT (three dot-separated parts).
        if let Some(principal) = rules.key_principal(credential) {
            return Ok(principal.clone());
        }
        if credential.split('.').count() == 3 {
            return match &rules.jwt {
                Some(issuer) => rules.verify_jwt(issuer, credential),
                None => Err(AuthError::InvalidToken(
                    "this server accepts no JWTs (no [jwt] in its auth file)".into(),
                )),
            };
        }
        Err(AuthError::UnknownKey)
    }

    /// The principal a request authenticates as: its `authorization` value
    /// when it sends one, else the name of its verified client certificate
    /// (see the module docs); with mutual TLS alone, always the
    /// certificate.
    pub fn authenticate_request(
        &self,
        authorization: Option<&str>,
        certificate: Option<&str>,
    ) -> Result<Principal, AuthError> {
        match (authorization, certificate) {
            (None, Some(name)) => self.authenticate_certificate(name),
            // Mutual TLS alone: no bearer credential can authenticate, so
            // one sent (a proxy's, say) does not hide the certificate.
            (Some(_), Some(name)) if self.rules().any_certificate => {
                self.authenticate_certificate(name)
            }
            (_, None) if self.rules().any_certificate => Err(AuthError::NoCertificate),
            (authorization, _) => self.authenticate(authorization),
        }
    }

    /// The principal a verified client certificate names.
    pub fn authenticate_certificate(&self, name: &str) -> Result<Principal, AuthError> {
        let rules = self.rules();
        if rules.any_certificate && !name.is_empty() {
            return Ok(Principal {
                name: name.to_owned(),
                tenants: Tenants::All,
                role: Role::User,
                quota: crate::store::Quota::NONE,
            });
        }
        rules
            .named
            .get(name)
            .cloned()
            .ok_or_else(|| AuthError::UnknownCertificate(name.to_owned()))
    }
}

/// The credential of `Bearer <credential>` (the scheme case-insensitive,
/// RFC 6750 §2.1).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, credential) = value.trim().split_once(' ')?;
    let credential = credential.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !credential.is_empty()).then_some(credential)
}
