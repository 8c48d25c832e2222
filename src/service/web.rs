//! What the two JSON bindings share on the HTTP side: one handler that
//! tells a JSON-RPC call (spec §9) from an HTTP+JSON one (spec §11) and
//! hands it to its adapter; the call's [`CallContext`] from the request's
//! headers, query and connection; the request body within its limits;
//! the HTTP status of an [`A2aError`] (spec §5.4) and its
//! `google.rpc` details as ProtoJSON; the authentication challenge; and
//! each call's span and metrics.
//!
//! gRPC requests never reach this module: the server routes by content
//! type first (`server::by_content_type`).

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderValue, Method, StatusCode, header};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde_json::{Value, json};

use super::{A2aApi, Binding, CallContext, http_json, jsonrpc};
use crate::connections::ClientCertificate;
use crate::discovery::VERSION_METADATA;
use crate::error::{A2aError, ERROR_DOMAIN};
use crate::metrics::RpcMetrics;
use crate::proto::MAX_MESSAGE_BYTES;
use crate::telemetry::TraceParent;

/// The largest request body either JSON binding reads: the gRPC message
/// limit, so a request fits every binding or none. Larger is 413.
pub const MAX_BODY_BYTES: usize = MAX_MESSAGE_BYTES;

/// The media type of HTTP+JSON requests and responses (spec §11.1,
/// §14.1.1); requests may also say `application/json`.
pub const A2A_JSON: &str = "application/a2a+json";

/// The `WWW-Authenticate` challenge of a 401 (RFC 6750 §3).
pub const CHALLENGE: &str = "Bearer realm=\"a2a\"";

/// The JSON bindings a server serves, over one [`A2aApi`].
pub struct HttpBindings {
    api: A2aApi,
    jsonrpc: bool,
    http_json: Option<http_json::Routes>,
    metrics: Option<RpcMetrics>,
    keepalive: std::time::Duration,
}

impl HttpBindings {
    /// The bindings of `served` that are JSON ones (gRPC is tonic's).
    pub fn new(api: A2aApi, served: &[Binding], keepalive: std::time::Duration) -> Self {
        let metrics = api.manager().metrics().map(|m| m.rpc.clone());
        HttpBindings {
            api,
            jsonrpc: served.contains(&Binding::JsonRpc),
            http_json: served
                .contains(&Binding::HttpJson)
                .then(http_json::Routes::from_proto),
            metrics,
            keepalive,
        }
    }

    /// How long an event stream may idle before a keep-alive line.
    pub(crate) fn keepalive(&self) -> std::time::Duration {
        self.keepalive
    }

    /// The router answering both bindings (a fallback: the cards,
    /// probes and `/metrics` routes are matched first).
    pub fn router(self: Arc<Self>) -> axum::Router {
        axum::Router::new().fallback(handle).with_state(self)
    }

    pub(crate) fn api(&self) -> &A2aApi {
        &self.api
    }

    /// Starts recording one call of `method` over `binding`.
    pub(crate) fn observe(&self, binding: Binding, method: &'static str) -> CallRecord {
        self.observe_version(binding, crate::metrics::V1_0, method)
    }

    /// [`HttpBindings::observe`] of a call of `protocol_version`.
    pub(crate) fn observe_version(
        &self,
        binding: Binding,
        protocol_version: &'static str,
        method: &'static str,
    ) -> CallRecord {
        CallRecord {
            rpc: self.metrics.clone(),
            binding,
            protocol_version,
            method,
            start: Instant::now(),
            code: None,
        }
    }
}

async fn handle(
    State(bindings): State<Arc<HttpBindings>>,
    request: http::Request<Body>,
) -> Response {
    let (parts, body) = request.into_parts();
    // Protocol 0.3's routes (`/v1/...`, after a tenant or not) first: a
    // 1.0 route would read `v1` as a tenant.
    if bindings.http_json.is_some()
        && bindings.api().cards().serves_v0_3()
        && let Some((tenant, route)) = super::v0_3::rest::find(&parts.method, parts.uri.path())
    {
        return match route {
            Ok(route) => super::v0_3::rest::serve(&bindings, tenant, route, parts, body).await,
            Err(allowed) => http_json::method_not_allowed(allowed),
        };
    }
    if let Some(routes) = &bindings.http_json {
        match routes.find(&parts.method, parts.uri.path()) {
            http_json::Found::Route(route, vars) => {
                return http_json::serve(&bindings, route, vars, parts, body).await;
            }
            http_json::Found::OtherMethods(allowed) => {
                return http_json::method_not_allowed(&allowed);
            }
            http_json::Found::Nothing => {}
        }
    }
    if bindings.jsonrpc
        && parts.method == Method::POST
        && let Some(tenant) = jsonrpc::endpoint_tenant(parts.uri.path())
    {
        return jsonrpc::serve(&bindings, tenant, parts, body).await;
    }
    let err = A2aError::MethodNotFound {
        method: format!("{} {}", parts.method, parts.uri.path()),
    };
    if bindings.http_json.is_some() {
        return http_json::error_response(&err);
    }
    (
        StatusCode::NOT_FOUND,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{err}\n"),
    )
        .into_response()
}

/// The call's context: headers (`Authorization`, `A2A-Version`,
/// `A2A-Extensions`, `traceparent`), the `A2A-Version` query parameter
/// when the header is absent (spec §3.2.6 names it a service parameter;
/// a browser's EventSource cannot set headers), and the connection's peer
/// and verified client certificate.
pub(crate) fn call_context(binding: Binding, parts: &http::request::Parts) -> CallContext {
    let mut call = CallContext::from_headers(binding, &parts.headers);
    if call.params.version.is_none()
        && let Some(query) = parts.uri.query()
    {
        call.params.version = form_urlencoded(query)
            .find(|(name, _)| name.eq_ignore_ascii_case(VERSION_METADATA))
            .map(|(_, value)| value);
    }
    call.client_certificate = parts
        .extensions
        .get::<ClientCertificate>()
        .map(|c| c.name.clone());
    call.peer = parts
        .extensions
        .get::<tonic::transport::server::TcpConnectInfo>()
        .and_then(|info| info.remote_addr());
    call.trace = parts
        .headers
        .get(crate::telemetry::TRACEPARENT)
        .and_then(|v| v.to_str().ok())
        .and_then(TraceParent::parse);
    call
}

/// The pairs of a query string, percent-decoded (`+` is a space, as in
/// HTML forms and most HTTP clients' query encoders).
pub(crate) fn form_urlencoded(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    query.split('&').filter(|p| !p.is_empty()).map(|pair| {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        (decode_component(name, true), decode_component(value, true))
    })
}

/// Percent-decodes one URL component; invalid escapes stay as written
/// and bytes that are not UTF-8 are replaced.
pub(crate) fn decode_component(text: &str, plus_is_space: bool) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b'+' if plus_is_space => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Why a request body was not read.
#[derive(Debug)]
pub(crate) enum BodyError {
    /// Over [`MAX_BODY_BYTES`]: 413.
    TooLarge,
    /// Not JSON by its `Content-Type`: 415.
    MediaType(String),
    /// The client stopped sending, or the connection failed.
    Read(String),
}

impl BodyError {
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            BodyError::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            BodyError::MediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            BodyError::Read(_) => StatusCode::BAD_REQUEST,
        }
    }

    pub(crate) fn message(&self) -> String {
        match self {
            BodyError::TooLarge => {
                format!(
                    "the request body is larger than the {MAX_BODY_BYTES} bytes this server accepts"
                )
            }
            BodyError::MediaType(given) => format!(
                "the request body must be JSON (Content-Type: application/json or {A2A_JSON}), not {given:?}"
            ),
            BodyError::Read(e) => format!("the request body could not be read: {e}"),
        }
    }

    /// The A2A error the binding writes: the size limit names itself; a
    /// body that is not JSON is ContentTypeNotSupported (spec §3.3.2:
    /// JSON-RPC -32005, HTTP 415), naming the `Content-Type`.
    pub(crate) fn into_error(self) -> A2aError {
        match self {
            BodyError::TooLarge => A2aError::TooLarge {
                max_bytes: MAX_BODY_BYTES,
            },
            BodyError::MediaType(given) => A2aError::ContentTypeNotSupported {
                field: "Content-Type".into(),
                media_type: given,
                accepted: vec!["application/json".into(), A2A_JSON.into()],
            },
            other => A2aError::invalid("body", other.message()),
        }
    }
}

/// Whether `content_type` names JSON: `application/json`,
/// `application/a2a+json` or another `+json` type, parameters allowed.
fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// The request body, at most [`MAX_BODY_BYTES`], checked to be JSON by
/// its `Content-Type` (an empty body may have none: `POST
/// /tasks/{id}:cancel` with nothing to say).
pub(crate) async fn read_body(
    parts: &http::request::Parts,
    body: Body,
) -> Result<Bytes, BodyError> {
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let declared_length = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared_length.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return Err(BodyError::TooLarge);
    }
    if let Some(given) = &content_type
        && !is_json(given)
    {
        return Err(BodyError::MediaType(given.clone()));
    }
    let bytes = match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            return Err(BodyError::TooLarge);
        }
        Err(e) => return Err(BodyError::Read(e.to_string())),
    };
    if content_type.is_none() && !bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(BodyError::MediaType(String::new()));
    }
    Ok(bytes)
}

/// The HTTP status of an error (spec §5.4, HTTP column, as released in
/// v1.0.0: TaskNotCancelable 409, ContentTypeNotSupported 415,
/// InvalidAgentResponse 502); errors outside the A2A set by their usual
/// status.
pub fn http_status(err: &A2aError) -> StatusCode {
    match err {
        A2aError::TaskNotFound { .. } | A2aError::PushConfigNotFound { .. } => {
            StatusCode::NOT_FOUND
        }
        A2aError::MethodNotFound { .. } => StatusCode::NOT_FOUND,
        A2aError::TaskNotCancelable { .. } => StatusCode::CONFLICT,
        A2aError::UnsupportedOperation { .. }
        | A2aError::PushNotificationNotSupported
        | A2aError::ExtendedAgentCardNotConfigured
        | A2aError::ExtensionSupportRequired { .. }
        | A2aError::VersionNotSupported { .. }
        | A2aError::InvalidArgument(_) => StatusCode::BAD_REQUEST,
        A2aError::ContentTypeNotSupported { .. } => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        A2aError::InvalidAgentResponse(_) => StatusCode::BAD_GATEWAY,
        A2aError::ResourceExhausted { .. } => StatusCode::TOO_MANY_REQUESTS,
        A2aError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
        A2aError::PermissionDenied { .. } => StatusCode::FORBIDDEN,
        A2aError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        A2aError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        A2aError::DeadlineExceeded { .. } => StatusCode::GATEWAY_TIMEOUT,
        A2aError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
    }
}

/// The error's details as ProtoJSON `Any`s (spec §9.5, §11.6): its
/// `google.rpc.ErrorInfo`, then a `google.rpc.BadRequest` naming the
/// fields of a validation error.
pub fn error_details(err: &A2aError) -> Value {
    let mut details = vec![json!({
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": err.reason(),
        "domain": ERROR_DOMAIN,
        "metadata": err.metadata(),
    })];
    let violations = err.field_violations();
    if !violations.is_empty() {
        let violations: Vec<Value> = violations
            .into_iter()
            .map(|v| json!({"field": v.field, "description": v.description}))
            .collect();
        details.push(json!({
            "@type": "type.googleapis.com/google.rpc.BadRequest",
            "fieldViolations": violations,
        }));
    }
    Value::Array(details)
}

/// Adds what a refusal needs beyond its body: the challenge of a 401
/// (RFC 9110 §11.6.1: a 401 carries `WWW-Authenticate`).
pub(crate) fn with_challenge(mut response: Response, err: &A2aError) -> Response {
    if matches!(err, A2aError::Unauthenticated(_)) {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(CHALLENGE),
        );
    }
    response
}

/// One call of a JSON binding in the RPC metrics: recorded with its
/// code when it ends, or CANCELLED when dropped before (the client went
/// away mid-stream).
pub(crate) struct CallRecord {
    rpc: Option<RpcMetrics>,
    binding: Binding,
    protocol_version: &'static str,
    method: &'static str,
    start: Instant,
    code: Option<tonic::Code>,
}

impl CallRecord {
    /// A record that counts nowhere (tests of the bindings' forms).
    #[cfg(test)]
    pub(crate) fn detached(binding: Binding, method: &'static str) -> Self {
        CallRecord {
            rpc: None,
            binding,
            protocol_version: crate::metrics::V1_0,
            method,
            start: Instant::now(),
            code: None,
        }
    }

    pub(crate) fn method(&self) -> &'static str {
        self.method
    }

    /// The call ended: OK, or with `err`.
    pub(crate) fn end(&mut self, err: Option<&A2aError>) {
        self.code = Some(err.map_or(tonic::Code::Ok, super::grpc::code));
        self.record();
    }

    fn record(&mut self) {
        if let Some(rpc) = self.rpc.take() {
            let code = self.code.unwrap_or(tonic::Code::Cancelled);
            rpc.record(
                self.binding,
                self.protocol_version,
                self.method,
                code,
                self.start.elapsed(),
            );
        }
    }
}

impl Drop for CallRecord {
    fn drop(&mut self) {
        self.record();
    }
}

/// The request headers a browser may send cross-origin (CORS preflight).
const CORS_ALLOWED_HEADERS: &str =
    "authorization, content-type, a2a-version, a2a-extensions, traceparent, last-event-id";
/// How long a browser may reuse a preflight answer, in seconds.
const CORS_MAX_AGE_SECS: &str = "600";

/// `--cors-origin`: browsers on the listed origins may call the JSON
/// bindings (and read `/metrics`, the probes and the cards): a preflight
/// from one of them is answered 204 with what it may send, and every
/// answer to one carries `Access-Control-Allow-Origin` naming it. A
/// preflight from any other origin is 403; other requests from it get no
/// CORS headers, so the browser keeps the answer from the page. No
/// origins (the default): nothing changes (the cards keep their own
/// `*`).
pub fn cors(router: axum::Router, origins: &[String]) -> axum::Router {
    if origins.is_empty() {
        return router;
    }
    let origins: Arc<Vec<String>> = Arc::new(origins.to_vec());
    router.layer(axum::middleware::from_fn_with_state(origins, cors_layer))
}

async fn cors_layer(
    State(origins): State<Arc<Vec<String>>>,
    request: http::Request<Body>,
    next: axum::middleware::Next,
) -> Response {
    let origin = request
        .headers()
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let allowed = origin
        .as_deref()
        .is_some_and(|o| origins.iter().any(|allowed| allowed == o));
    let preflight = request.method() == Method::OPTIONS
        && request
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    if preflight {
        let mut response = if allowed {
            let mut response = StatusCode::NO_CONTENT.into_response();
            let headers = response.headers_mut();
            headers.insert(
                header::ACCESS_CONTROL_ALLOW_METHODS,
                HeaderValue::from_static("GET, POST, DELETE, OPTIONS"),
            );
            headers.insert(
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                HeaderValue::from_static(CORS_ALLOWED_HEADERS),
            );
            headers.insert(
                header::ACCESS_CONTROL_MAX_AGE,
                HeaderValue::from_static(CORS_MAX_AGE_SECS),
            );
            response
        } else {
            (
                StatusCode::FORBIDDEN,
                "this origin may not call this server (serve --cors-origin)\n",
            )
                .into_response()
        };
        allow_origin(&mut response, origin.as_deref().filter(|_| allowed));
        return response;
    }
    let mut response = next.run(request).await;
    allow_origin(&mut response, origin.as_deref().filter(|_| allowed));
    response
}

fn allow_origin(response: &mut Response, origin: Option<&str>) {
    let headers = response.headers_mut();
    headers.append(header::VARY, HeaderValue::from_static("Origin"));
    if let Some(origin) = origin.and_then(|o| HeaderValue::from_str(o).ok()) {
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        headers.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static("www-authenticate, etag"),
        );
    }
}

/// `response` with the `A2A-Extensions` header naming the extensions the
/// call activated, if any (spec §4.6, "Extension Activation": the
/// response SHOULD list them).
pub(crate) fn echo_extensions(
    mut response: axum::response::Response,
    params: &crate::discovery::ServiceParameters,
) -> axum::response::Response {
    if let Some(uri) = params.activated() {
        response.headers_mut().insert(
            crate::discovery::EXTENSIONS_METADATA,
            http::HeaderValue::from_static(uri),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_media_types() {
        for ok in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON",
            "application/a2a+json",
        ] {
            assert!(is_json(ok), "{ok}");
        }
        for bad in ["text/plain", "application/grpc", "", "application/jsonx"] {
            assert!(!is_json(bad), "{bad}");
        }
    }

    #[test]
    fn query_components_are_percent_decoded() {
        let pairs: Vec<_> = form_urlencoded("a=1&b=x%20y+z&c&d=%zz&e=%E2%9C%93").collect();
        assert_eq!(
            pairs,
            [
                ("a".into(), "1".into()),
                ("b".into(), "x y z".into()),
                ("c".into(), "".into()),
                ("d".into(), "%zz".into()),
                ("e".into(), "✓".into()),
            ]
        );
        assert_eq!(decode_component("a%2Fb%", false), "a/b%");
        assert_eq!(decode_component("a+b", false), "a+b");
    }
}
