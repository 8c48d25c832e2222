//! The card as 0.3 clients read it: one document for both generations.
//!
//! A 0.3 client (the official 0.3 SDK validates the card against its
//! model, which requires `url`) reads `url`, `preferredTransport`,
//! `additionalInterfaces` and `protocolVersion`, which 1.0 does not have;
//! a 1.0 client ignores them (ProtoJSON parsers ignore unknown fields,
//! spec §5.7). So the card served carries both: the 1.0 card, and beside
//! it the 0.3 fields naming the 0.3 interfaces this server serves. This
//! is what the official Python and Go servers publish.
//!
//! The one key both generations use with different shapes is
//! `securitySchemes`: 1.0 wraps each scheme (`{"httpAuthSecurityScheme":
//! {...}}`), 0.3 writes it flat with a `type` (`{"type": "http", ...}`).
//! A 0.3 client reading a wrapped entry finds no field it knows and takes
//! it for mutual TLS, the one scheme whose fields are all optional; so
//! each entry carries both forms, the flat one holding everything the
//! wrapped one does (the official 1.0 Python client reads the flat form
//! when both are there).
//!
//! Signatures cover the 1.0 card only (spec §8.4): the 0.3 fields are
//! unknown to a 1.0 verifier's parser and drop out of what it
//! canonicalizes.

use serde_json::{Map, Value, json};

use crate::proto::AgentCard;

/// The version 0.3 clients are told the interface speaks.
pub const PROTOCOL_VERSION: &str = "0.3.0";

/// Adds the 0.3 fields to `card_json` (the card's ProtoJSON): the 0.3
/// `interfaces` served (URL and 0.3 transport name, the preferred one
/// first); none, and nothing is added.
pub fn add_fields(card_json: &mut Value, card: &AgentCard, interfaces: &[(String, &str)]) {
    let (Some((url, preferred)), Value::Object(fields)) = (interfaces.first(), card_json) else {
        return;
    };
    fields.insert("protocolVersion".into(), json!(PROTOCOL_VERSION));
    fields.insert("url".into(), json!(url));
    fields.insert("preferredTransport".into(), json!(preferred));
    let additional: Vec<Value> = interfaces
        .iter()
        .map(|(url, transport)| json!({"url": url, "transport": transport}))
        .collect();
    fields.insert("additionalInterfaces".into(), Value::Array(additional));
    let extended = card
        .capabilities
        .as_ref()
        .and_then(|c| c.extended_agent_card)
        .unwrap_or(false);
    if extended {
        fields.insert("supportsAuthenticatedExtendedCard".into(), json!(true));
    }
    if !card.security_requirements.is_empty() {
        let security: Vec<Value> = card
            .security_requirements
            .iter()
            .map(|r| {
                let schemes: Map<String, Value> = r
                    .schemes
                    .iter()
                    .map(|(name, scopes)| (name.clone(), json!(scopes.list)))
                    .collect();
                Value::Object(schemes)
            })
            .collect();
        fields.insert("security".into(), Value::Array(security));
    }
    if let Some(Value::Object(schemes)) = fields.get_mut("securitySchemes") {
        for scheme in schemes.values_mut() {
            flatten_scheme(scheme);
        }
    }
}

/// Adds the 0.3 flat form of one 1.0 `SecurityScheme` beside it.
fn flatten_scheme(scheme: &mut Value) {
    let Value::Object(entry) = scheme else {
        return;
    };
    let Some((wrapper, Value::Object(inner))) =
        entry.iter().next().map(|(k, v)| (k.clone(), v.clone()))
    else {
        return;
    };
    let kind = match wrapper.as_str() {
        "apiKeySecurityScheme" => "apiKey",
        "httpAuthSecurityScheme" => "http",
        "oauth2SecurityScheme" => "oauth2",
        "openIdConnectSecurityScheme" => "openIdConnect",
        "mtlsSecurityScheme" => "mutualTLS",
        _ => return,
    };
    entry.insert("type".into(), json!(kind));
    for (key, value) in inner {
        // 0.3 names an API key's place `in`; 1.0 `location`.
        let key = if kind == "apiKey" && key == "location" {
            "in".to_owned()
        } else {
            key
        };
        entry.insert(key, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_carry_both_forms() {
        let mut scheme = json!({"apiKeySecurityScheme": {"location": "header", "name": "X-Key"}});
        flatten_scheme(&mut scheme);
        assert_eq!(
            scheme,
            json!({"apiKeySecurityScheme": {"location": "header", "name": "X-Key"},
                   "type": "apiKey", "in": "header", "name": "X-Key"})
        );
        let mut mtls = json!({"mtlsSecurityScheme": {}});
        flatten_scheme(&mut mtls);
        assert_eq!(mtls, json!({"mtlsSecurityScheme": {}, "type": "mutualTLS"}));
    }
}
