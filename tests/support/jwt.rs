//! Test credentials: the key fixtures in `tests/fixtures/auth/` (for tests
//! only), API key digests and signed JWTs.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use sha2::{Digest, Sha256};

/// The issuer and audience the fixtures' `[jwt]` sections name.
pub const ISSUER: &str = "https://id.example.test";
pub const AUDIENCE: &str = "a2a-lifecycle";

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/auth")
}

/// SHA-256 of an API key, lowercase hex (the auth file's form).
pub fn key_digest(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Claims of a valid token for `sub`, changed by `edit`.
pub fn claims(sub: &str, edit: impl FnOnce(&mut serde_json::Value)) -> serde_json::Value {
    let mut claims = serde_json::json!({
        "sub": sub,
        "iss": ISSUER,
        "aud": AUDIENCE,
        "exp": now() + 600,
        "iat": now(),
        "tenants": ["deployer"],
    });
    edit(&mut claims);
    claims
}

/// A JWT over `claims`, signed with the fixture key `key_file` under `kid`.
pub fn sign(alg: Algorithm, kid: &str, key_file: &str, claims: &serde_json::Value) -> String {
    let pem = std::fs::read(fixtures().join(key_file)).unwrap();
    let key = match alg {
        Algorithm::ES256 => EncodingKey::from_ec_pem(&pem).unwrap(),
        _ => EncodingKey::from_rsa_pem(&pem).unwrap(),
    };
    let mut header = Header::new(alg);
    header.kid = Some(kid.to_owned());
    jsonwebtoken::encode(&header, claims, &key).unwrap()
}
