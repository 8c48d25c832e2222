//! Bearer JWTs from an identity provider: the key set read from the file,
//! a token's signature, claims and principal checked, and verified tokens
//! remembered.

use std::collections::HashMap;
use std::path::Path;

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use sha2::{Digest, Sha256};

use super::file::{JwtEntry, QuotaEntry, Rules};
use super::{AuthError, Principal, Role, Tenants};

/// Clock skew tolerated on a JWT's `exp` and `nbf`, in seconds.
pub const JWT_LEEWAY_SECS: u64 = 30;
/// Verified JWTs remembered (by the token's SHA-256) until they expire or
/// the file is reloaded. A client sends one token with many calls, and an
/// RS256 signature check costs about 75 µs of CPU (measured: six times a
/// whole GetTask); a remembered token costs a hash and a lookup. When
/// full, expired entries go, then all.
pub const MAX_CACHED_TOKENS: usize = 4096;

pub(super) struct JwtIssuer {
    validation: Validation,
    /// By key id; a token names its key in the header's `kid`.
    keys: HashMap<String, (Algorithm, DecodingKey)>,
    tenants_claim: String,
    admin_claim: String,
    /// Every JWT principal's.
    pub(super) quota: crate::store::Quota,
}

impl Rules {
    /// A JWT's principal: remembered if this token was verified before and
    /// has not expired, else verified now (and remembered).
    pub(super) fn verify_jwt(
        &self,
        issuer: &JwtIssuer,
        token: &str,
    ) -> Result<Principal, AuthError> {
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
}

impl JwtIssuer {
    pub(super) fn load(entry: JwtEntry, dir: &Path) -> Result<Self, String> {
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
