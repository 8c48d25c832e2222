//! Agent card signatures (spec §8.4): signing the cards this server
//! publishes, and checking a card's signatures against a JWK set.
//!
//! Owns:
//! - the signing key (`serve --card-signing-key`): a PEM private key for
//!   ES256 (P-256), ES384 (P-384), RS256 (RSA, 2048 bits or more) or EdDSA
//!   (Ed25519), its `kid` (given, else the RFC 7638 thumbprint of the public
//!   key), and the public JWK set a verifier needs;
//! - the canonical payload of §8.4.1: the card's ProtoJSON with proto field
//!   presence respected (an `optional` field set to its default stays,
//!   another field at its default goes, a `REQUIRED` field is always
//!   there), `signatures` left out, canonicalized by RFC 8785 (JCS);
//! - the JWS of §8.4.2: protected header `{"alg","typ":"JOSE","kid"[,"jku"]}`
//!   over that payload, detached (the card carries `protected` and
//!   `signature`; the payload is the card itself);
//! - verification (§8.4.3), for `a2a-lifecycle card --verify`.
//!
//! Two canonical forms exist in the wild. §8.4.1 keeps `REQUIRED` fields at
//! their default and every empty object a set message or a map value
//! serializes to (`"schemes":{"bearer":{}}`); the official Python SDK's
//! verifier (`a2a.utils.signing`) instead drops every empty string, list
//! and object, recursively, before canonicalizing. On a card with no empty
//! value the two forms are the same bytes and the card carries one
//! signature. Where they differ (a card with `--auth` declares
//! `securityRequirements` whose scope lists are empty), the card carries
//! a second signature, by the same key, over the empties-dropped form:
//! spec §8.4.3 lets several signatures sit side by side and asks a client
//! to verify at least one, so both kinds of verifier accept the card.

use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::jwk::{Jwk, JwkSet, PublicKeyUse, ThumbprintHash};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey};
use prost_reflect::{Kind, MessageDescriptor};
use serde_json::{Map, Value};

use crate::json::{self, JsonError};
use crate::proto::{AgentCard, AgentCardSignature};

/// RSA keys shorter than this are refused (RFC 7518 §3.3: 2048 bits or
/// larger MUST be used with RS256).
pub const MIN_RSA_BITS: usize = 2048;

/// What went wrong loading a key or signing a card.
#[derive(Debug, thiserror::Error)]
pub enum SigningError {
    #[error("card signing key {path}: {problem}")]
    Key { path: String, problem: String },
    #[error("agent card cannot be canonicalized: {0}")]
    Json(#[from] JsonError),
    #[error("signing the agent card with {algorithm:?}: {problem}")]
    Sign {
        algorithm: Algorithm,
        problem: String,
    },
}

/// The key the cards are signed with, and what a verifier needs to know
/// of it.
pub struct CardSigner {
    key: EncodingKey,
    algorithm: Algorithm,
    kid: String,
    jku: Option<String>,
    public: Jwk,
}

impl std::fmt::Debug for CardSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the private key.
        f.debug_struct("CardSigner")
            .field("algorithm", &self.algorithm)
            .field("kid", &self.kid)
            .field("jku", &self.jku)
            .finish_non_exhaustive()
    }
}

impl CardSigner {
    /// Reads a PEM private key (PKCS#8, or PKCS#1 / SEC 1 for RSA and EC).
    /// `kid` defaults to the key's RFC 7638 thumbprint (SHA-256); `jku`,
    /// when given, goes into every protected header (spec §8.4.2).
    pub fn from_file(
        path: &Path,
        kid: Option<String>,
        jku: Option<String>,
    ) -> Result<Self, SigningError> {
        let pem = std::fs::read(path).map_err(|e| SigningError::Key {
            path: path.display().to_string(),
            problem: e.to_string(),
        })?;
        Self::from_pem(&pem, kid, jku).map_err(|problem| SigningError::Key {
            path: path.display().to_string(),
            problem,
        })
    }

    /// [`CardSigner::from_file`] on the PEM text itself.
    pub fn from_pem(pem: &[u8], kid: Option<String>, jku: Option<String>) -> Result<Self, String> {
        let (key, algorithm, public) = read_private_key(pem)?;
        let kid = match kid {
            Some(kid) if kid.is_empty() => return Err("the key id (kid) is empty".into()),
            Some(kid) => kid,
            None => public
                .thumbprint(ThumbprintHash::SHA256)
                .map_err(|e| format!("cannot compute the key's thumbprint: {e}"))?,
        };
        let mut public = public;
        public.common.key_id = Some(kid.clone());
        public.common.public_key_use = Some(PublicKeyUse::Signature);
        Ok(CardSigner {
            key,
            algorithm,
            kid,
            jku,
            public,
        })
    }

    /// The JWS algorithm (`ES256`, `ES384`, `RS256` or `EdDSA`).
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The key id every signature names.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The public key as a JWK set (RFC 7517 §5), with `kid`, `alg` and
    /// `use: sig`: what a verifier of the cards needs (`card --verify`).
    pub fn jwks(&self) -> JwkSet {
        JwkSet {
            keys: vec![self.public.clone()],
        }
    }

    /// Replaces the card's signatures with this server's: one over the
    /// §8.4.1 canonical form, and a second over the empties-dropped form
    /// where the two differ (module docs).
    pub fn sign(&self, card: &mut AgentCard) -> Result<(), SigningError> {
        card.signatures.clear();
        let spec = canonical_payload(card, Form::Spec)?;
        let dropped = canonical_payload(card, Form::EmptiesDropped)?;
        let mut signatures = vec![self.signature(&spec)?];
        if dropped != spec {
            signatures.push(self.signature(&dropped)?);
        }
        card.signatures = signatures;
        Ok(())
    }

    /// The detached JWS of `payload` (spec §8.4.2 steps 2-4).
    fn signature(&self, payload: &[u8]) -> Result<AgentCardSignature, SigningError> {
        #[derive(serde::Serialize)]
        struct Protected<'a> {
            alg: Algorithm,
            typ: &'static str,
            kid: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            jku: Option<&'a str>,
        }
        let header = serde_json::to_vec(&Protected {
            alg: self.algorithm,
            typ: "JOSE",
            kid: &self.kid,
            jku: self.jku.as_deref(),
        })
        .map_err(|e| JsonError::from_display(&e))?;
        let protected = URL_SAFE_NO_PAD.encode(header);
        let input = signing_input(&protected, payload);
        let signature = jsonwebtoken::crypto::sign(input.as_bytes(), &self.key, self.algorithm)
            .map_err(|e| SigningError::Sign {
                algorithm: self.algorithm,
                problem: e.to_string(),
            })?;
        Ok(AgentCardSignature {
            protected,
            signature,
            header: None,
        })
    }
}

/// `BASE64URL(protected) || '.' || BASE64URL(payload)` (RFC 7515 §5.1).
fn signing_input(protected: &str, payload: &[u8]) -> String {
    format!("{protected}.{}", URL_SAFE_NO_PAD.encode(payload))
}

/// Tries each key family the issue names; the algorithm follows from the
/// key (a P-256 key signs ES256, never RS256), so no flag can mismatch it.
fn read_private_key(pem: &[u8]) -> Result<(EncodingKey, Algorithm, Jwk), String> {
    if let Ok(key) = EncodingKey::from_ec_pem(pem) {
        for algorithm in [Algorithm::ES256, Algorithm::ES384] {
            if let Ok(public) = Jwk::from_encoding_key(&key, algorithm) {
                return Ok((key, algorithm, public));
            }
        }
        return Err("an EC key on a curve other than P-256 or P-384".into());
    }
    if let Ok(key) = EncodingKey::from_ed_pem(pem) {
        let public = Jwk::from_encoding_key(&key, Algorithm::EdDSA)
            .map_err(|e| format!("an EdDSA key other than Ed25519: {e}"))?;
        return Ok((key, Algorithm::EdDSA, public));
    }
    if let Ok(key) = EncodingKey::from_rsa_pem(pem) {
        let public = Jwk::from_encoding_key(&key, Algorithm::RS256)
            .map_err(|e| format!("not a usable RSA private key: {e}"))?;
        if let jsonwebtoken::jwk::AlgorithmParameters::RSA(rsa) = &public.algorithm {
            let bits = URL_SAFE_NO_PAD
                .decode(&rsa.n)
                .map(|n| {
                    let n = n.iter().skip_while(|b| **b == 0).count();
                    n * 8
                })
                .unwrap_or(0);
            if bits < MIN_RSA_BITS {
                return Err(format!(
                    "an RSA key of about {bits} bits; RS256 needs at least {MIN_RSA_BITS} \
                     (RFC 7518 §3.3)"
                ));
            }
        }
        return Ok((key, Algorithm::RS256, public));
    }
    Err(
        "not a PEM private key for ES256 (P-256), ES384 (P-384), RS256 (RSA) or EdDSA \
         (Ed25519); a public key or certificate cannot sign"
            .into(),
    )
}

/// Which canonical form a payload is (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// Spec §8.4.1: presence respected, `REQUIRED` fields always present.
    Spec,
    /// Every empty string, list and object dropped, recursively (the
    /// official Python SDK's verifier).
    EmptiesDropped,
}

impl std::fmt::Display for Form {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Form::Spec => "the canonical form of spec §8.4.1",
            Form::EmptiesDropped => "the empties-dropped form (official Python SDK)",
        })
    }
}

/// The RFC 8785 bytes a signature of `form` covers: the card's ProtoJSON
/// without `signatures`.
pub fn canonical_payload(card: &AgentCard, form: Form) -> Result<Vec<u8>, JsonError> {
    let mut value = json::to_value(card)?;
    if let Value::Object(fields) = &mut value {
        fields.remove("signatures");
    }
    let value = match form {
        Form::Spec => {
            let descriptor = json::POOL
                .get_message_by_name("lf.a2a.v1.AgentCard")
                .ok_or_else(|| JsonError::from_display(&"no descriptor for AgentCard"))?;
            add_required(&mut value, &descriptor);
            value
        }
        Form::EmptiesDropped => drop_empties(value).unwrap_or(Value::Object(Map::new())),
    };
    serde_json_canonicalizer::to_vec(&value).map_err(|e| JsonError::from_display(&e))
}

/// `google.api.field_behavior = REQUIRED` (google/api/field_behavior.proto).
const FIELD_BEHAVIOR_REQUIRED: i32 = 2;

fn is_required(field: &prost_reflect::FieldDescriptor) -> bool {
    let Some(extension) = json::POOL.get_extension_by_name("google.api.field_behavior") else {
        return false;
    };
    let options = field.options();
    let behaviors = options.get_extension(&extension);
    behaviors.as_list().is_some_and(|list| {
        list.iter()
            .any(|b| b.as_enum_number() == Some(FIELD_BEHAVIOR_REQUIRED))
    })
}

/// Puts back the `REQUIRED` fields ProtoJSON left out at their default
/// (spec §8.4.1 rule 1), at every depth of the card. Well-known types keep
/// their own JSON; a member of a real `oneof` is never filled in (only the
/// member that is set exists).
fn add_required(value: &mut Value, descriptor: &MessageDescriptor) {
    if descriptor.full_name().starts_with("google.protobuf.") {
        return;
    }
    let Value::Object(object) = value else {
        return;
    };
    for field in descriptor.fields() {
        let in_oneof = field
            .containing_oneof()
            .is_some_and(|oneof| !oneof.is_synthetic());
        let name = field.json_name();
        if !object.contains_key(name) && !in_oneof && is_required(&field) {
            object.insert(name.to_owned(), default_json(&field));
        }
        let Some(child) = object.get_mut(name) else {
            continue;
        };
        let Kind::Message(message) = field.kind() else {
            continue;
        };
        if field.is_map() {
            if let Kind::Message(values) = message.map_entry_value_field().kind()
                && let Value::Object(entries) = child
            {
                for entry in entries.values_mut() {
                    add_required(entry, &values);
                }
            }
        } else if field.is_list() {
            if let Value::Array(items) = child {
                for item in items {
                    add_required(item, &message);
                }
            }
        } else {
            add_required(child, &message);
        }
    }
}

/// The ProtoJSON of a field at its default value.
fn default_json(field: &prost_reflect::FieldDescriptor) -> Value {
    if field.is_map() {
        return Value::Object(Map::new());
    }
    if field.is_list() {
        return Value::Array(Vec::new());
    }
    match field.kind() {
        Kind::String | Kind::Bytes => Value::String(String::new()),
        Kind::Bool => Value::Bool(false),
        // ProtoJSON writes 64-bit integers as strings.
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 | Kind::Uint64 | Kind::Fixed64 => {
            Value::String("0".into())
        }
        Kind::Enum(e) => Value::String(e.default_value().name().to_owned()),
        Kind::Message(message) => {
            // The message's own ProtoJSON at its default: `{}` for an A2A
            // message (whose REQUIRED fields the caller then adds), the
            // well-known types' forms otherwise.
            serde::Serialize::serialize(
                &prost_reflect::DynamicMessage::new(message),
                serde_json::value::Serializer,
            )
            .unwrap_or(Value::Object(Map::new()))
        }
        _ => Value::from(0),
    }
}

/// The Python SDK's `_clean_empty`: `None` for an empty string, list or
/// object (after cleaning its members), the value otherwise.
fn drop_empties(value: Value) -> Option<Value> {
    match value {
        Value::String(s) if s.is_empty() => None,
        Value::Array(items) => {
            let items: Vec<Value> = items.into_iter().filter_map(drop_empties).collect();
            (!items.is_empty()).then_some(Value::Array(items))
        }
        Value::Object(fields) => {
            let fields: Map<String, Value> = fields
                .into_iter()
                .filter_map(|(k, v)| drop_empties(v).map(|v| (k, v)))
                .collect();
            (!fields.is_empty()).then_some(Value::Object(fields))
        }
        other => Some(other),
    }
}

/// A signature that checked out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    /// Its place in `signatures`.
    pub index: usize,
    pub kid: String,
    pub algorithm: String,
    /// The canonical form it covers.
    pub form: Form,
}

/// Why no signature of a card checked out: one line per signature.
#[derive(Debug, thiserror::Error)]
#[error("{}", .0.join("; "))]
pub struct VerifyError(pub Vec<String>);

/// The algorithms a signature may name: asymmetric ones only (a card
/// signed with a shared secret proves nothing to the public).
const VERIFIABLE: [Algorithm; 9] = [
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::EdDSA,
];

/// Spec §8.4.3: the first of `card`'s signatures that a key of `keys`
/// (by `kid`; the only key when the header names none) verifies over
/// either canonical form.
pub fn verify(card: &AgentCard, keys: &JwkSet) -> Result<Verified, VerifyError> {
    if card.signatures.is_empty() {
        return Err(VerifyError(vec!["the card has no signatures".into()]));
    }
    let payloads = [Form::Spec, Form::EmptiesDropped]
        .into_iter()
        .map(|form| canonical_payload(card, form).map(|payload| (form, payload)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| VerifyError(vec![e.to_string()]))?;
    let mut problems = Vec::new();
    for (index, signature) in card.signatures.iter().enumerate() {
        match verify_one(signature, keys, &payloads) {
            Ok((kid, algorithm, form)) => {
                return Ok(Verified {
                    index,
                    kid,
                    algorithm,
                    form,
                });
            }
            Err(problem) => problems.push(format!("signature {index}: {problem}")),
        }
    }
    Err(VerifyError(problems))
}

fn verify_one(
    signature: &AgentCardSignature,
    keys: &JwkSet,
    payloads: &[(Form, Vec<u8>)],
) -> Result<(String, String, Form), String> {
    let header = URL_SAFE_NO_PAD
        .decode(signature.protected.trim_end_matches('='))
        .map_err(|e| format!("protected header is not base64url: {e}"))?;
    let header: Value = serde_json::from_slice(&header)
        .map_err(|e| format!("protected header is not JSON: {e}"))?;
    let alg = header
        .get("alg")
        .and_then(Value::as_str)
        .ok_or("protected header has no alg")?;
    let algorithm: Algorithm = alg
        .parse()
        .ok()
        .filter(|a| VERIFIABLE.contains(a))
        .ok_or_else(|| format!("algorithm {alg:?} is not an asymmetric JWS algorithm"))?;
    let kid = header.get("kid").and_then(Value::as_str);
    let jwk = match kid {
        Some(kid) => keys
            .find(kid)
            .ok_or_else(|| format!("no key with kid {kid:?} in the key set"))?,
        None if keys.keys.len() == 1 => &keys.keys[0],
        None => return Err("protected header has no kid and the key set has several".into()),
    };
    if let Some(declared) = jwk.common.key_algorithm
        && declared.to_string() != alg
    {
        return Err(format!(
            "key {:?} is for {declared}, the signature says {alg}",
            kid.unwrap_or("")
        ));
    }
    let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("unusable key: {e}"))?;
    for (form, payload) in payloads {
        let input = signing_input(&signature.protected, payload);
        if jsonwebtoken::crypto::verify(&signature.signature, input.as_bytes(), &key, algorithm)
            .unwrap_or(false)
        {
            return Ok((kid.unwrap_or("").to_owned(), alg.to_owned(), *form));
        }
    }
    Err(format!(
        "does not verify (kid {:?}, {alg}) over either canonical form: the card changed \
         after signing, or another key signed it",
        kid.unwrap_or("")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{AgentCapabilities, AgentInterface, AgentSkill};

    fn card() -> AgentCard {
        AgentCard {
            name: "Example Agent".into(),
            version: "1".into(),
            capabilities: Some(AgentCapabilities {
                streaming: Some(false),
                push_notifications: Some(false),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The example of spec §8.4.1, plus the REQUIRED fields it leaves out
    /// (version, interfaces, modes) present at their defaults.
    #[test]
    fn canonical_form_follows_presence_and_required() {
        let mut card = card();
        card.version = String::new();
        let payload = String::from_utf8(canonical_payload(&card, Form::Spec).unwrap()).unwrap();
        assert_eq!(
            payload,
            r#"{"capabilities":{"pushNotifications":false,"streaming":false},"defaultInputModes":[],"defaultOutputModes":[],"description":"","name":"Example Agent","skills":[],"supportedInterfaces":[],"version":""}"#
        );
        // The Python SDK's form drops every empty value and keeps `false`.
        let dropped =
            String::from_utf8(canonical_payload(&card, Form::EmptiesDropped).unwrap()).unwrap();
        assert_eq!(
            dropped,
            r#"{"capabilities":{"pushNotifications":false,"streaming":false},"name":"Example Agent"}"#
        );
    }

    #[test]
    fn nested_required_fields_and_unset_optionals() {
        let mut card = card();
        card.capabilities = Some(AgentCapabilities::default());
        card.supported_interfaces = vec![AgentInterface {
            url: "http://x".into(),
            ..Default::default()
        }];
        card.skills = vec![AgentSkill {
            id: "s".into(),
            ..Default::default()
        }];
        let payload = String::from_utf8(canonical_payload(&card, Form::Spec).unwrap()).unwrap();
        assert!(payload.contains(r#""capabilities":{}"#), "{payload}");
        assert!(
            payload.contains(r#"{"protocolBinding":"","protocolVersion":"","url":"http://x"}"#),
            "{payload}"
        );
        assert!(
            payload.contains(r#"{"description":"","id":"s","name":"","tags":[]}"#),
            "{payload}"
        );
        // Not REQUIRED and not set: absent.
        assert!(!payload.contains("tenant"), "{payload}");
        assert!(!payload.contains("iconUrl"), "{payload}");
    }

    macro_rules! key {
        ($name:literal) => {
            include_bytes!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/fixtures/card-signing/",
                $name
            ))
            .as_slice()
        };
    }

    #[test]
    fn every_offered_key_kind_signs_and_verifies() {
        for (pem, algorithm) in [
            (key!("es256.pem"), Algorithm::ES256),
            (key!("es384.pem"), Algorithm::ES384),
            (key!("rs256.pem"), Algorithm::RS256),
            (key!("rs256-pkcs1.pem"), Algorithm::RS256),
            (key!("ed25519.pem"), Algorithm::EdDSA),
        ] {
            let signer = CardSigner::from_pem(pem, None, None).unwrap();
            assert_eq!(signer.algorithm(), algorithm);
            // RFC 7638 thumbprint: 32 bytes of SHA-256, base64url.
            assert_eq!(signer.kid().len(), 43, "{algorithm:?}");
            let mut card = card();
            signer.sign(&mut card).unwrap();
            assert_eq!(card.signatures.len(), 2, "{algorithm:?}: the forms differ");
            let verified = verify(&card, &signer.jwks()).unwrap();
            assert_eq!(verified.index, 0);
            assert_eq!(verified.form, Form::Spec);
            assert_eq!(verified.kid, signer.kid());

            let header = URL_SAFE_NO_PAD
                .decode(&card.signatures[0].protected)
                .unwrap();
            let header: Value = serde_json::from_slice(&header).unwrap();
            assert_eq!(header["typ"], "JOSE");
            assert_eq!(header["kid"], signer.kid());
            assert_eq!(header["alg"], serde_json::to_value(algorithm).unwrap());

            // Any change to the card breaks every signature.
            card.description = "changed".into();
            let err = verify(&card, &signer.jwks()).unwrap_err();
            assert_eq!(err.0.len(), 2, "{err}");
        }
    }

    #[test]
    fn a_card_without_empty_values_carries_one_signature() {
        let signer = CardSigner::from_pem(key!("es256.pem"), Some("k1".into()), None).unwrap();
        let mut card = card();
        card.description = "d".into();
        card.supported_interfaces = vec![AgentInterface {
            url: "http://x".into(),
            protocol_binding: "JSONRPC".into(),
            protocol_version: "1.0".into(),
            tenant: String::new(),
        }];
        card.default_input_modes = vec!["text/plain".into()];
        card.default_output_modes = vec!["text/plain".into()];
        card.skills = vec![AgentSkill {
            id: "s".into(),
            name: "n".into(),
            description: "d".into(),
            tags: vec!["t".into()],
            ..Default::default()
        }];
        signer.sign(&mut card).unwrap();
        assert_eq!(card.signatures.len(), 1);
        assert_eq!(
            canonical_payload(&card, Form::Spec).unwrap(),
            canonical_payload(&card, Form::EmptiesDropped).unwrap()
        );
        assert_eq!(verify(&card, &signer.jwks()).unwrap().kid, "k1");
    }

    #[test]
    fn only_the_signing_key_verifies() {
        let signer = CardSigner::from_pem(key!("es256.pem"), Some("k".into()), None).unwrap();
        let other = CardSigner::from_pem(key!("es384.pem"), Some("k".into()), None).unwrap();
        let mut card = card();
        signer.sign(&mut card).unwrap();
        let err = verify(&card, &other.jwks()).unwrap_err().to_string();
        assert!(
            err.contains("is for ES384, the signature says ES256"),
            "{err}"
        );
        let unknown = CardSigner::from_pem(key!("es256.pem"), Some("k2".into()), None).unwrap();
        let err = verify(&card, &unknown.jwks()).unwrap_err().to_string();
        assert!(err.contains(r#"no key with kid "k""#), "{err}");
        let err = verify(&self::card(), &signer.jwks())
            .unwrap_err()
            .to_string();
        assert!(err.contains("no signatures"), "{err}");
    }

    #[test]
    fn the_jku_rides_in_the_protected_header() {
        let jku = "https://agent.example/jwks.json".to_owned();
        let signer = CardSigner::from_pem(key!("ed25519.pem"), None, Some(jku.clone())).unwrap();
        let mut card = card();
        signer.sign(&mut card).unwrap();
        let header = URL_SAFE_NO_PAD
            .decode(&card.signatures[0].protected)
            .unwrap();
        let header: Value = serde_json::from_slice(&header).unwrap();
        assert_eq!(header["jku"], jku.as_str());
    }

    #[test]
    fn unusable_keys_are_refused_with_the_reason() {
        for (pem, expected) in [
            (key!("rsa1024.pem"), "at least 2048"),
            (key!("p521.pem"), "P-256 or P-384"),
            (
                key!("es256.pub.pem"),
                "a public key or certificate cannot sign",
            ),
            (b"not a key".as_slice(), "not a PEM private key"),
        ] {
            let err = CardSigner::from_pem(pem, None, None).unwrap_err();
            assert!(err.contains(expected), "{err}");
        }
        let err = CardSigner::from_pem(key!("es256.pem"), Some(String::new()), None).unwrap_err();
        assert!(err.contains("empty"), "{err}");
    }

    #[test]
    fn signatures_are_left_out() {
        let mut card = card();
        let before = canonical_payload(&card, Form::Spec).unwrap();
        card.signatures.push(AgentCardSignature {
            protected: "x".into(),
            signature: "y".into(),
            header: None,
        });
        assert_eq!(canonical_payload(&card, Form::Spec).unwrap(), before);
    }
}
