//! Reading an auth file (TOML) into the rules it states: its principals,
//! their API keys and quotas, and its JWT issuer.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::api_keys::{KeyPrincipal, parse_digest};
use super::jwt::JwtIssuer;
use super::{ConfigError, Principal, Role, Tenants};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AuthFile {
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
pub(super) struct QuotaEntry {
    pub(super) max_open_tasks: Option<u32>,
    /// A duration: `"30m"`, `"1h"`.
    pub(super) max_input_wait: Option<String>,
}

impl QuotaEntry {
    pub(super) fn parse(self, whose: &str) -> Result<crate::store::Quota, String> {
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
pub(super) struct JwtEntry {
    pub(super) issuer: String,
    pub(super) audience: String,
    pub(super) jwks_file: PathBuf,
    pub(super) tenants_claim: String,
    pub(super) admin_claim: String,
    pub(super) max_open_tasks: Option<u32>,
    pub(super) max_input_wait: Option<String>,
}

/// What one version of the auth file says.
pub(super) struct Rules {
    pub(super) keys: Vec<KeyPrincipal>,
    /// Every principal of the file, by name: what a client certificate's
    /// name is looked up in.
    pub(super) named: HashMap<String, Principal>,
    pub(super) jwt: Option<JwtIssuer>,
    /// Tokens `jwt` verified, with their principal and `exp`; part of the
    /// rules, so a reload forgets them.
    pub(super) verified: std::sync::Mutex<HashMap<[u8; 32], (Principal, u64)>>,
    /// Mutual TLS without an auth file: a verified client is a `user` of
    /// every tenant.
    pub(super) any_certificate: bool,
}

impl Rules {
    pub(super) fn load(path: &Path) -> Result<Self, ConfigError> {
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

    pub(super) fn parse(text: &str, dir: &Path) -> Result<Self, String> {
        let file: AuthFile = toml::from_str(text).map_err(|e| e.to_string())?;
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
