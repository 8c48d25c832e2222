//! The browser console: `GET /console`, its script and its stylesheet,
//! embedded in the binary (no CDN, no build step, nothing fetched from
//! elsewhere), served on the server's own port beside the HTTP+JSON
//! binding the page speaks (spec §11). It owns the assets and the headers
//! they go out with; everything the page shows comes from the A2A calls
//! any other client makes, under the caller's own authentication.
//!
//! The page holds no data: it is public, like the agent cards. Its
//! Content-Security-Policy lets it load only itself and call only its own
//! origin, so agent or user text the page might mishandle could still run
//! no script and reach no other host (the page itself renders all such
//! text as text).

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use sha2::{Digest, Sha256};
use std::sync::Arc;

/// Where the page is served.
pub const PATH: &str = "/console";

/// The page's Content-Security-Policy: its own script and stylesheet, its
/// own origin for calls (the A2A binding and the cards), `data:` images
/// only (the empty favicon), no plugins, frames, forms posted elsewhere or
/// `<base>`.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
    style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; \
    form-action 'none'; frame-ancestors 'none'";

const INDEX: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/app.js");
const STYLE: &str = include_str!("assets/app.css");

/// One embedded file, ready to serve.
struct Asset {
    body: Bytes,
    content_type: &'static str,
    etag: HeaderValue,
}

impl Asset {
    fn new(body: impl Into<Bytes>, content_type: &'static str) -> Self {
        let body = body.into();
        let digest = Sha256::digest(&body);
        let tag: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
        Self {
            etag: HeaderValue::from_str(&format!("\"{tag}\"")).expect("hex is a header value"),
            body,
            content_type,
        }
    }

    /// The file, or 304 when the browser holds this version. Revalidated
    /// on every load (`no-cache`): a new binary's page is never mixed with
    /// an old script.
    fn respond(&self, request: &HeaderMap) -> Response {
        let fresh = request
            .get_all(header::IF_NONE_MATCH)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|tag| {
                let tag = tag.trim();
                tag == "*" || tag.trim_start_matches("W/").as_bytes() == self.etag.as_bytes()
            });
        let mut response = if fresh {
            StatusCode::NOT_MODIFIED.into_response()
        } else {
            self.body.clone().into_response()
        };
        let h = response.headers_mut();
        if !fresh {
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(self.content_type),
            );
        }
        h.insert(header::ETAG, self.etag.clone());
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CONTENT_SECURITY_POLICY),
        );
        h.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
        h.insert(
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        );
        h.insert(
            "cross-origin-opener-policy",
            HeaderValue::from_static("same-origin"),
        );
        response
    }
}

struct Assets {
    index: Asset,
    script: Asset,
    style: Asset,
}

/// What the page needs to know before its first call.
#[derive(Clone, Debug, Default)]
pub struct ConsoleConfig {
    /// The tenants served, `""` (the default agent) among them.
    pub tenants: Vec<String>,
    /// Calls need a bearer token (`--auth`): the page asks for one first.
    pub bearer: bool,
}

/// The console's routes: `/console`, `/console/app.js`,
/// `/console/app.css`. None of them is a binding's path (a tenant's
/// routes all end in `tasks`, `message:*` or `extendedAgentCard`).
pub fn router(config: &ConsoleConfig) -> Router {
    let mut tenants = config.tenants.clone();
    tenants.sort();
    let list = serde_json::to_string(&tenants).expect("strings serialize");
    let index = INDEX
        .replace("{{TENANTS}}", &escape_attribute(&list))
        .replace("{{AUTH}}", if config.bearer { "bearer" } else { "" });
    let assets = Arc::new(Assets {
        index: Asset::new(index, "text/html; charset=utf-8"),
        script: Asset::new(SCRIPT, "text/javascript; charset=utf-8"),
        style: Asset::new(STYLE, "text/css; charset=utf-8"),
    });
    Router::new()
        .route(PATH, get(index_page))
        .route("/console/", get(index_page))
        .route("/console/app.js", get(script))
        .route("/console/app.css", get(style))
        .with_state(assets)
}

async fn index_page(State(a): State<Arc<Assets>>, request: HeaderMap) -> Response {
    a.index.respond(&request)
}

async fn script(State(a): State<Arc<Assets>>, request: HeaderMap) -> Response {
    a.script.respond(&request)
}

async fn style(State(a): State<Arc<Assets>>, request: HeaderMap) -> Response {
    a.style.respond(&request)
}

/// `s` inside a double-quoted HTML attribute.
fn escape_attribute(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c => out.push(c),
        }
    }
    out
}

/// The most the page's first load (page, script, stylesheet, with their
/// headers) may weigh over the wire: it opens at once on a slow link.
pub const MAX_FIRST_LOAD_BYTES: usize = 150 * 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_names_cannot_break_out_of_the_attribute() {
        let escaped = escape_attribute(r#"["","a\"><script>x</script>'"]"#);
        assert!(!escaped.contains('"'));
        assert!(!escaped.contains('<'));
        assert!(!escaped.contains('\''));
    }

    #[test]
    fn every_placeholder_is_filled() {
        let index = INDEX
            .replace("{{TENANTS}}", "x")
            .replace("{{AUTH}}", "bearer");
        assert!(!index.contains("{{"), "a placeholder is left: {index}");
    }
}
