//! A call's A2A service parameters (spec §3.2.6): the `A2A-Version` and
//! `A2A-Extensions` a binding carried (gRPC metadata, HTTP headers), and
//! the version rule of spec §3.6.2.

use crate::error::A2aError;

/// The protocol version this interface serves (spec §3.6).
pub const PROTOCOL_VERSION: &str = "1.0";
/// The service parameter (gRPC metadata key, HTTP header) naming the
/// client's protocol version (spec §3.2.6, §3.6).
pub const VERSION_METADATA: &str = "a2a-version";
/// The service parameter listing the extensions a request uses (spec
/// §3.2.6).
pub const EXTENSIONS_METADATA: &str = "a2a-extensions";
/// The same, as protocol 0.3 clients send it.
pub const LEGACY_EXTENSIONS_METADATA: &str = "x-a2a-extensions";

/// A call's A2A service parameters (spec §3.2.6), as its binding carried
/// them: gRPC metadata or HTTP headers, names case-insensitive.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceParameters {
    /// `A2A-Version`; a value that is not visible ASCII reads as empty.
    pub version: Option<String>,
    /// `A2A-Extensions`: every URI, the values comma-separated and
    /// possibly repeated.
    pub extensions: Vec<String>,
}

impl ServiceParameters {
    /// Whether the call activates the extension `uri` (spec §4.6: named in
    /// `A2A-Extensions`).
    pub fn activates(&self, uri: &str) -> bool {
        self.extensions.iter().any(|u| u == uri)
    }

    /// The extensions this server supports that the call activated, for
    /// the response's `A2A-Extensions` (spec "Extension Activation": the
    /// response lists them); `None` when there are none.
    pub fn activated(&self) -> Option<&'static str> {
        self.activates(crate::lifecycle::TRANSITIONS_EXTENSION)
            .then_some(crate::lifecycle::TRANSITIONS_EXTENSION)
    }

    pub fn from_headers(headers: &http::HeaderMap) -> Self {
        // Names made once: a name given as text is parsed and checked on
        // every lookup (callgrind: about 300 instructions each).
        const VERSION: http::HeaderName = http::HeaderName::from_static(VERSION_METADATA);
        const EXTENSIONS: http::HeaderName = http::HeaderName::from_static(EXTENSIONS_METADATA);
        const LEGACY_EXTENSIONS: http::HeaderName =
            http::HeaderName::from_static(LEGACY_EXTENSIONS_METADATA);
        ServiceParameters {
            version: headers
                .get(VERSION)
                .map(|v| v.to_str().unwrap_or("").to_owned()),
            // 0.3 clients name it `X-A2A-Extensions`: both are read.
            extensions: headers
                .get_all(EXTENSIONS)
                .iter()
                .chain(headers.get_all(LEGACY_EXTENSIONS).iter())
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .map(str::trim)
                .filter(|uri| !uri.is_empty())
                .map(str::to_owned)
                .collect(),
        }
    }
}

/// Spec §3.6.2 for a 1.0 operation: `Major.Minor`, matched on both; a
/// patch part (`1.0.1`) is ignored. No header, or an empty one, is served
/// as 1.0 here; [`super::Cards::checked`] refuses it first when 0.3 is not served
/// (see docs/architecture.md, protocol 0.3).
pub(super) fn check_version(requested: Option<&str>) -> Result<(), A2aError> {
    let Some(requested) = requested else {
        return Ok(());
    };
    if requested.is_empty() || is_v1_0(requested) {
        return Ok(());
    }
    Err(A2aError::VersionNotSupported {
        requested: requested.to_owned(),
    })
}

/// Exactly `1.0` or `1.0.N` (N a decimal number without sign, spaces or
/// leading zeros): the versions this interface serves (spec §3.6.2; the
/// patch is ignored). " 1.0", "01.0" and "1.00" are other strings.
fn is_v1_0(version: &str) -> bool {
    match version.strip_prefix("1.0") {
        Some("") => true,
        Some(rest) => rest.strip_prefix('.').is_some_and(|patch| {
            !patch.is_empty()
                && patch.bytes().all(|b| b.is_ascii_digit())
                && (patch == "0" || !patch.starts_with('0'))
        }),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_rules() {
        assert!(check_version(None).is_ok());
        for ok in ["1.0", "1.0.0", "1.0.7", "1.0.12", ""] {
            assert!(check_version(Some(ok)).is_ok(), "{ok:?}");
        }
        for bad in [
            "0.3", "1.1", "2.0", "1", "1.0.x", "one", "1.0.0.0", " 1.0", "1.0 ", "01.0", "1.00",
            "1.0.", "1.0.01", "1.0.+1", "1.0.-1",
        ] {
            let err = check_version(Some(bad)).unwrap_err();
            assert_eq!(err.reason(), "VERSION_NOT_SUPPORTED", "{bad:?}");
        }
    }

    #[test]
    fn extensions_are_comma_separated_and_may_repeat() {
        let mut m = http::HeaderMap::new();
        m.append(EXTENSIONS_METADATA, "urn:a, urn:b".parse().unwrap());
        m.append("A2A-Extensions", "urn:c".parse().unwrap());
        m.append("X-A2A-Extensions", "urn:d".parse().unwrap());
        let declared = ServiceParameters::from_headers(&m).extensions;
        assert_eq!(declared, ["urn:a", "urn:b", "urn:c", "urn:d"]);
    }
}
