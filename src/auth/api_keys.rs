//! API keys: a principal's key known by its SHA-256, and a credential
//! matched against every key in constant time.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::Principal;
use super::file::Rules;

pub(super) struct KeyPrincipal {
    pub(super) digest: [u8; 32],
    pub(super) principal: Principal,
}

impl Rules {
    /// The principal whose API key `credential` is. Every principal is
    /// compared, each in constant time: neither the position of a match
    /// nor a near miss shows in the timing.
    pub(super) fn key_principal(&self, credential: &str) -> Option<&Principal> {
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

pub(super) fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let mut digest = [0u8; 32];
    for (i, byte) in digest.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(digest)
}
