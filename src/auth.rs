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

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The longest `authorization` value looked at; longer is refused unread.
pub const MAX_CREDENTIAL_BYTES: usize = 8 * 1024;
/// Clock skew tolerated on a JWT's `exp` and `nbf`, in seconds.
pub const JWT_LEEWAY_SECS: u64 = 30;
/// Verified JWTs remembered (by the token's SHA-256) until they expire or
/// the file is reloaded. A client sends one token with many calls, and an
/// RS256 signature check costs about 75 µs of CPU (measured: six times a
/// whole GetTask); a remembered token costs a hash and a lookup. When
/// full, expired entries go, then all.
pub const MAX_CACHED_TOKENS: usize = 4096;

/// What a principal may see of its tenants' tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Its own tasks only.
    User,
    /// Every task of its tenants.
    Admin,
}

/// The tenants a principal may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tenants {
    All,
    Only(Vec<String>),
}

impl Tenants {
    fn from_names(names: Vec<String>) -> Self {
        if names.iter().any(|n| n == "*") {
            Tenants::All
        } else {
            Tenants::Only(names)
        }
    }

    pub fn allows(&self, tenant: &str) -> bool {
        match self {
            Tenants::All => true,
            Tenants::Only(names) => names.iter().any(|n| n == tenant),
        }
    }
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The principal's `name`, the JWT's `sub`, or the client
    /// certificate's name.
    pub name: String,
    pub tenants: Tenants,
    pub role: Role,
    /// What the operator allows it (none by default).
    pub quota: crate::store::Quota,
}

impl Principal {
    /// Whether this principal may address `tenant` at all.
    pub fn may_use(&self, tenant: &str) -> bool {
        self.tenants.allows(tenant)
    }
}

/// Why a request is not authenticated. The text is safe to return and to
/// log: it never holds the credential.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("no credentials: send `authorization: Bearer <API key or JWT>`")]
    Missing,
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
            AuthError::Missing => "missing",
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    principal: Vec<PrincipalEntry>,
    jwt: Option<JwtEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PrincipalEntry {
    name: String,
    /// One digest, or several while a key is rotated (old and new both
    /// valid until the old one is removed and the file reloaded). None:
    /// the principal authenticates by client certificate only.
    api_key_sha256: Option<Digests>,
    tenants: Vec<String>,
    role: Role,
    max_open_tasks: Option<u32>,
    max_input_wait: Option<String>,
}

/// A principal's quotas as the file writes them.
struct QuotaEntry {
    max_open_tasks: Option<u32>,
    /// A duration: `"30m"`, `"1h"`.
    max_input_wait: Option<String>,
}

impl QuotaEntry {
    fn parse(self, whose: &str) -> Result<crate::store::Quota, String> {
        if self.max_open_tasks == Some(0) {
            return Err(format!("{whose}: max_open_tasks must be at least 1"));
        }
        let max_input_wait = self
            .max_input_wait
            .map(|text| {
                humantime::parse_duration(&text)
                    .ok()
                    .filter(|d| !d.is_zero())
                    .ok_or_else(|| {
                        format!(
                            "{whose}: max_input_wait {text:?} is not a duration (\"30m\", \"1h\")"
                        )
                    })
            })
            .transpose()?;
        Ok(crate::store::Quota {
            max_open_tasks: self.max_open_tasks,
            max_input_wait,
        })
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Digests {
    One(String),
    Many(Vec<String>),
}

impl Digests {
    fn all(&self) -> &[String] {
        match self {
            Digests::One(one) => std::slice::from_ref(one),
            Digests::Many(many) => many,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JwtEntry {
    issuer: String,
    audience: String,
    jwks_file: PathBuf,
    tenants_claim: String,
    admin_claim: String,
    max_open_tasks: Option<u32>,
    max_input_wait: Option<String>,
}

struct KeyPrincipal {
    digest: [u8; 32],
    principal: Principal,
}

struct JwtIssuer {
    validation: Validation,
    /// By key id; a token names its key in the header's `kid`.
    keys: HashMap<String, (Algorithm, DecodingKey)>,
    tenants_claim: String,
    admin_claim: String,
    /// Every JWT principal's.
    quota: crate::store::Quota,
}

/// What one version of the auth file says.
struct Rules {
    keys: Vec<KeyPrincipal>,
    /// Every principal of the file, by name: what a client certificate's
    /// name is looked up in.
    named: HashMap<String, Principal>,
    jwt: Option<JwtIssuer>,
    /// Tokens `jwt` verified, with their principal and `exp`; part of the
    /// rules, so a reload forgets them.
    verified: std::sync::Mutex<HashMap<[u8; 32], (Principal, u64)>>,
    /// Mutual TLS without an auth file: a verified client is a `user` of
    /// every tenant.
    any_certificate: bool,
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

impl Rules {
    fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, path.parent().unwrap_or(Path::new("."))).map_err(|message| {
            ConfigError::Invalid {
                path: path.to_owned(),
                message,
            }
        })
    }

    fn parse(text: &str, dir: &Path) -> Result<Self, String> {
        let file: File = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut keys = Vec::with_capacity(file.principal.len());
        let mut named = HashMap::with_capacity(file.principal.len());
        for entry in file.principal {
            // The name owns tasks: an empty one would own the tasks created
            // without authentication.
            if entry.name.is_empty() {
                return Err("a principal has an empty name".into());
            }
            let quota = QuotaEntry {
                max_open_tasks: entry.max_open_tasks,
                max_input_wait: entry.max_input_wait,
            }
            .parse(&format!("principal {:?}", entry.name))?;
            let principal = Principal {
                name: entry.name,
                tenants: Tenants::from_names(entry.tenants),
                role: entry.role,
                quota,
            };
            // One name, one principal: a certificate names exactly one.
            if named.contains_key(&principal.name) {
                return Err(format!("principal {:?} is listed twice", principal.name));
            }
            let digests = entry.api_key_sha256.as_ref().map_or(&[][..], Digests::all);
            for hex in digests {
                let digest = parse_digest(hex).ok_or_else(|| {
                    format!(
                        "principal {:?}: api_key_sha256 must be 64 lowercase hex digits",
                        principal.name
                    )
                })?;
                if keys.iter().any(|k: &KeyPrincipal| k.digest == digest) {
                    return Err(format!(
                        "principal {:?}: an API key is listed twice",
                        principal.name
                    ));
                }
                keys.push(KeyPrincipal {
                    digest,
                    principal: principal.clone(),
                });
            }
            named.insert(principal.name.clone(), principal);
        }
        let jwt = file.jwt.map(|jwt| JwtIssuer::load(jwt, dir)).transpose()?;
        if named.is_empty() && jwt.is_none() {
            return Err("no principal and no [jwt]: nobody could authenticate".into());
        }
        Ok(Rules {
            keys,
            named,
            jwt,
            verified: Default::default(),
            any_certificate: false,
        })
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
    /// A2A call on `binding`, `/metrics`): logged with its reason cut
    /// short, counted in `metrics`, and answered only after the peer's
    /// delay, so a guesser gains nothing by moving to another route.
    pub async fn refused(
        &self,
        peer: Option<std::net::SocketAddr>,
        binding: &str,
        error: &AuthError,
        metrics: Option<&crate::metrics::Metrics>,
    ) {
        let reason =
            crate::error::cut(&error.to_string(), crate::error::MAX_MESSAGE_BYTES).into_owned();
        tracing::warn!(?peer, binding, %reason, "authentication failed");
        if let Some(metrics) = metrics {
            metrics.auth.failed(error.kind());
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

impl Rules {
    /// A JWT's principal: remembered if this token was verified before and
    /// has not expired, else verified now (and remembered).
    fn verify_jwt(&self, issuer: &JwtIssuer, token: &str) -> Result<Principal, AuthError> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let now = jsonwebtoken::get_current_timestamp();
        let mut verified = self.verified.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((principal, exp)) = verified.get(&digest) {
            if now <= exp.saturating_add(JWT_LEEWAY_SECS) {
                return Ok(principal.clone());
            }
            verified.remove(&digest);
        }
        // Not held across the signature check: other requests go on.
        drop(verified);
        let (principal, exp) = issuer.verify(token)?;
        // The provider's names and the file's are one name space (a name
        // owns tasks): a `sub` that is a principal of the file would take
        // over that principal's tasks.
        if self.named.contains_key(&principal.name) {
            return Err(AuthError::InvalidToken(
                "its sub names a principal of the auth file".into(),
            ));
        }
        let mut verified = self.verified.lock().unwrap_or_else(|e| e.into_inner());
        if verified.len() >= MAX_CACHED_TOKENS {
            verified.retain(|_, (_, exp)| now <= exp.saturating_add(JWT_LEEWAY_SECS));
            if verified.len() >= MAX_CACHED_TOKENS {
                verified.clear();
            }
        }
        verified.insert(digest, (principal.clone(), exp));
        Ok(principal)
    }

    /// The principal whose API key `credential` is. Every principal is
    /// compared, each in constant time: neither the position of a match
    /// nor a near miss shows in the timing.
    fn key_principal(&self, credential: &str) -> Option<&Principal> {
        let digest: [u8; 32] = Sha256::digest(credential.as_bytes()).into();
        let mut found = None;
        for key in &self.keys {
            if bool::from(key.digest.ct_eq(&digest)) {
                found = Some(&key.principal);
            }
        }
        found
    }
}

/// The credential of `Bearer <credential>` (the scheme case-insensitive,
/// RFC 6750 §2.1).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, credential) = value.trim().split_once(' ')?;
    let credential = credential.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !credential.is_empty()).then_some(credential)
}

fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let mut digest = [0u8; 32];
    for (i, byte) in digest.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(digest)
}

impl JwtIssuer {
    fn load(entry: JwtEntry, dir: &Path) -> Result<Self, String> {
        let path = dir.join(&entry.jwks_file);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("[jwt] jwks_file {}: {e}", path.display()))?;
        let set: JwkSet = serde_json::from_str(&text)
            .map_err(|e| format!("[jwt] jwks_file {}: {e}", path.display()))?;
        let mut keys = HashMap::new();
        for jwk in &set.keys {
            let kid = jwk
                .common
                .key_id
                .clone()
                .ok_or_else(|| format!("[jwt] {}: every key needs a kid", path.display()))?;
            // The key's own type decides the one algorithm it verifies:
            // a token cannot pick another (RS256 for RSA, ES256 for P-256).
            let algorithm = match &jwk.algorithm {
                jsonwebtoken::jwk::AlgorithmParameters::RSA(_) => Algorithm::RS256,
                jsonwebtoken::jwk::AlgorithmParameters::EllipticCurve(ec)
                    if ec.curve == jsonwebtoken::jwk::EllipticCurve::P256 =>
                {
                    Algorithm::ES256
                }
                _ => {
                    return Err(format!(
                        "[jwt] {}: key {kid:?} is neither RSA (RS256) nor P-256 (ES256)",
                        path.display()
                    ));
                }
            };
            let key = DecodingKey::from_jwk(jwk)
                .map_err(|e| format!("[jwt] {}: key {kid:?}: {e}", path.display()))?;
            keys.insert(kid, (algorithm, key));
        }
        if keys.is_empty() {
            return Err(format!("[jwt] {}: no keys", path.display()));
        }
        let mut validation = Validation::new(Algorithm::RS256);
        validation.algorithms = vec![Algorithm::RS256, Algorithm::ES256];
        validation.set_issuer(&[&entry.issuer]);
        validation.set_audience(&[&entry.audience]);
        validation.leeway = JWT_LEEWAY_SECS;
        validation.validate_nbf = true;
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        Ok(JwtIssuer {
            validation,
            keys,
            tenants_claim: entry.tenants_claim,
            admin_claim: entry.admin_claim,
            quota: QuotaEntry {
                max_open_tasks: entry.max_open_tasks,
                max_input_wait: entry.max_input_wait,
            }
            .parse("[jwt]")?,
        })
    }

    /// The token's principal and its `exp`, once its signature, algorithm,
    /// issuer, audience and times check out.
    fn verify(&self, token: &str) -> Result<(Principal, u64), AuthError> {
        let refused = |why: String| AuthError::InvalidToken(why);
        let header = jsonwebtoken::decode_header(token).map_err(|e| refused(e.to_string()))?;
        let kid = header
            .kid
            .ok_or_else(|| refused("the token names no key (kid)".into()))?;
        // The caller chose the kid: said back (and logged) cut short.
        let shown = || crate::error::cut(&kid, crate::error::MAX_ECHO_BYTES).into_owned();
        let (algorithm, key) = self
            .keys
            .get(&kid)
            .ok_or_else(|| refused(format!("unknown key {:?}", shown())))?;
        if header.alg != *algorithm {
            return Err(refused(format!(
                "key {:?} verifies {algorithm:?}, not {:?}",
                shown(),
                header.alg
            )));
        }
        let mut validation = self.validation.clone();
        validation.algorithms = vec![*algorithm];
        let data = jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(
            token,
            key,
            &validation,
        )
        .map_err(|e| refused(e.to_string()))?;
        let claims = data.claims;
        let name = claims
            .get("sub")
            .and_then(|s| s.as_str())
            .filter(|s| !s.is_empty())
            .ok_or_else(|| refused("no sub".into()))?
            .to_owned();
        let tenants = match claims.get(&self.tenants_claim) {
            Some(serde_json::Value::String(s)) if s == "*" => Tenants::All,
            Some(serde_json::Value::Array(names)) => Tenants::from_names(
                names
                    .iter()
                    .map(|n| n.as_str().map(str::to_owned))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| refused(format!("{} must hold strings", self.tenants_claim)))?,
            ),
            _ => {
                return Err(refused(format!(
                    "claim {:?} must be an array of tenants or \"*\"",
                    self.tenants_claim
                )));
            }
        };
        let role = match claims.get(&self.admin_claim) {
            Some(serde_json::Value::Bool(true)) => Role::Admin,
            None | Some(serde_json::Value::Bool(false)) => Role::User,
            Some(_) => {
                return Err(refused(format!(
                    "claim {:?} must be a boolean",
                    self.admin_claim
                )));
            }
        };
        // Required by the validation, so present and a number.
        let exp = claims
            .get("exp")
            .and_then(|e| e.as_u64())
            .ok_or_else(|| refused("exp is not a whole number of seconds".into()))?;
        Ok((
            Principal {
                name,
                tenants,
                role,
                quota: self.quota,
            },
            exp,
        ))
    }
}

/// Failed authentications one peer address may make in a window before
/// its failures are slowed.
pub const FREE_FAILURES: u32 = 5;
/// The window failures are counted in.
pub const FAILURE_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);
/// The delay of the first slowed failure; each further one doubles it...
pub const FIRST_DELAY: std::time::Duration = std::time::Duration::from_millis(100);
/// ... up to this.
pub const MAX_DELAY: std::time::Duration = std::time::Duration::from_secs(2);
/// Peer addresses tracked at once; past it the stalest entry is dropped,
/// so a flood of addresses cannot grow the table.
pub const MAX_TRACKED_PEERS: usize = 4096;

/// Slows repeated authentication failures from one peer address, so keys
/// cannot be guessed at line rate: past [`FREE_FAILURES`] in
/// [`FAILURE_WINDOW`], each failure is answered after a delay that doubles
/// from [`FIRST_DELAY`] to [`MAX_DELAY`]. Successful calls are never
/// delayed, so a client that shares an address with a guesser still gets
/// in with its key. Bounded: at most [`MAX_TRACKED_PEERS`] addresses.
#[derive(Debug)]
pub struct FailureLimiter {
    peers: std::sync::Mutex<HashMap<std::net::IpAddr, Failures>>,
    free: u32,
}

impl Default for FailureLimiter {
    fn default() -> Self {
        FailureLimiter {
            peers: Default::default(),
            free: FREE_FAILURES,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    since: std::time::Instant,
    count: u32,
}

impl FailureLimiter {
    /// Records a failure from `peer` at `now`; how long to wait before
    /// answering it.
    pub fn record_failure(
        &self,
        peer: std::net::IpAddr,
        now: std::time::Instant,
    ) -> std::time::Duration {
        // An IPv6 host holds a /64: its addresses are one peer.
        let peer = crate::connections::peer_key(peer);
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        if !peers.contains_key(&peer) && peers.len() >= MAX_TRACKED_PEERS {
            // Expired entries first; otherwise the one whose window began
            // longest ago.
            peers.retain(|_, f| now.duration_since(f.since) < FAILURE_WINDOW);
            if peers.len() >= MAX_TRACKED_PEERS
                && let Some(stalest) = peers.iter().min_by_key(|(_, f)| f.since).map(|(ip, _)| *ip)
            {
                peers.remove(&stalest);
            }
        }
        let entry = peers.entry(peer).or_insert(Failures {
            since: now,
            count: 0,
        });
        if now.duration_since(entry.since) >= FAILURE_WINDOW {
            *entry = Failures {
                since: now,
                count: 0,
            };
        }
        entry.count = entry.count.saturating_add(1);
        match entry.count.checked_sub(self.free.saturating_add(1)) {
            None => std::time::Duration::ZERO,
            Some(slowed) => FIRST_DELAY
                .saturating_mul(1 << slowed.min(16))
                .min(MAX_DELAY),
        }
    }

    /// Addresses tracked now.
    pub fn tracked(&self) -> usize {
        self.peers.lock().map(|p| p.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr};
    use std::time::{Duration, Instant};

    #[test]
    fn failures_past_the_free_ones_are_slowed_more_and_more_then_forgiven() {
        let limiter = FailureLimiter::default();
        let peer = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
        let start = Instant::now();
        for _ in 0..FREE_FAILURES {
            assert_eq!(limiter.record_failure(peer, start), Duration::ZERO);
        }
        let delays: Vec<_> = (0..6)
            .map(|_| limiter.record_failure(peer, start))
            .collect();
        assert_eq!(
            delays,
            [100, 200, 400, 800, 1600, 2000].map(Duration::from_millis)
        );
        // Another address is not affected.
        let other = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2));
        assert_eq!(limiter.record_failure(other, start), Duration::ZERO);
        // An IPv6 host's addresses are one peer (its /64); another /64 is
        // another peer.
        let v6 = |s: &str| s.parse::<IpAddr>().unwrap();
        for i in 0..FREE_FAILURES {
            let addr = v6(&format!("2001:db8:1:2::{i:x}"));
            assert_eq!(limiter.record_failure(addr, start), Duration::ZERO);
        }
        assert_eq!(
            limiter.record_failure(v6("2001:db8:1:2:ffff::9"), start),
            FIRST_DELAY
        );
        assert_eq!(
            limiter.record_failure(v6("2001:db8:1:3::1"), start),
            Duration::ZERO
        );
        // A new window starts afresh.
        assert_eq!(
            limiter.record_failure(peer, start + FAILURE_WINDOW),
            Duration::ZERO
        );
    }

    #[test]
    fn the_table_is_bounded() {
        let limiter = FailureLimiter::default();
        let start = Instant::now();
        for i in 0..(MAX_TRACKED_PEERS as u32 + 100) {
            let ip = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i));
            limiter.record_failure(ip, start + Duration::from_millis(i as u64));
        }
        assert_eq!(limiter.tracked(), MAX_TRACKED_PEERS);
    }
}
