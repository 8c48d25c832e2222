//! The JSON-RPC 2.0 binding (spec §9): `POST` a JSON-RPC request to the
//! URL the card names for the `JSONRPC` interface; `params` is the
//! ProtoJSON of the operation's proto request, `result` the ProtoJSON of
//! its proto response, the `id` echoed as sent. The streaming methods
//! answer `text/event-stream`, each event's `data` a JSON-RPC response
//! whose `result` is a `StreamResponse` (spec §9.4.2).
//!
//! Errors (spec §9.5, §5.4): `error.code` is -32700 (the body is not
//! JSON; id null), -32600 (not a JSON-RPC request), -32601 (no such
//! method), -32602 (params that do not decode or validate), -32603, or
//! the A2A code -32001..-32009; errors with no JSON-RPC or A2A code
//! (authentication, permission, limits, availability, deadlines) take
//! -32000, the implementation-defined server error. `error.data` holds
//! the `google.rpc.ErrorInfo` (and `BadRequest`) the gRPC binding sends.
//!
//! HTTP statuses: 200 for every answer to a well-formed JSON-RPC request,
//! errors included, except 401 (with `WWW-Authenticate`) when
//! credentials are missing or bad; 400 for -32700 and -32600; 413 and
//! 415 for a body too large or not JSON.
//!
//! The endpoint is `/` (tenant from `params.tenant`) and `/{tenant}`,
//! whose tenant a request's own `tenant` may repeat but not contradict.
//! Batches (a JSON array of requests) are served call by call, at most
//! [`MAX_BATCH`] calls, streaming methods excepted.

use axum::body::Body;
use axum::response::Response;
use futures_util::StreamExt;
use http::{HeaderValue, StatusCode, header};
use prost::{Message, Name};
use serde::Deserialize;
use serde_json::value::RawValue;
use tracing::Instrument;

use super::sse;
use super::web::{
    BodyError, CallRecord, HttpBindings, call_context, decode_component, error_details, read_body,
    with_challenge,
};
use super::{A2aApi, Binding, CallContext, EventStream, v0_3};
use crate::error::A2aError;
use crate::json;

/// Calls one batch may hold.
pub const MAX_BATCH: usize = 32;

/// JSON-RPC 2.0's own error codes (spec §9.5).
pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;
/// The implementation-defined server error, for errors A2A gives no code.
pub const SERVER_ERROR: i64 = -32000;

/// The JSON-RPC error code of an error (spec §5.4, JSON-RPC column).
pub fn code(err: &A2aError) -> i64 {
    match err {
        A2aError::TaskNotFound { .. } | A2aError::PushConfigNotFound { .. } => -32001,
        A2aError::TaskNotCancelable { .. } => -32002,
        A2aError::PushNotificationNotSupported => -32003,
        A2aError::UnsupportedOperation { .. } => -32004,
        A2aError::ContentTypeNotSupported { .. } => -32005,
        A2aError::InvalidAgentResponse(_) => -32006,
        A2aError::ExtendedAgentCardNotConfigured => -32007,
        A2aError::ExtensionSupportRequired { .. } => -32008,
        A2aError::VersionNotSupported { .. } => -32009,
        A2aError::InvalidArgument(_) => INVALID_PARAMS,
        A2aError::MethodNotFound { .. } => METHOD_NOT_FOUND,
        A2aError::TooLarge { .. } => INVALID_REQUEST,
        A2aError::Internal(_) => INTERNAL_ERROR,
        A2aError::Unauthenticated(_)
        | A2aError::PermissionDenied { .. }
        | A2aError::ResourceExhausted { .. }
        | A2aError::Unavailable(_)
        | A2aError::DeadlineExceeded { .. } => SERVER_ERROR,
    }
}

/// The tenant of a JSON-RPC endpoint path: `/` serves every tenant (by
/// `params.tenant`), `/{tenant}` one. `None`: not an endpoint.
pub fn endpoint_tenant(path: &str) -> Option<String> {
    let rest = path.strip_prefix('/')?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains('/') {
        return None;
    }
    Some(decode_component(rest, false))
}

/// A request's envelope, its parts left as written until they are looked
/// at (`params` is decoded once, into the operation's proto request).
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    jsonrpc: Option<&'a RawValue>,
    /// `null` is an id too (Some), unlike a missing one (None).
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<&'a RawValue>,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// The `id` written back: as sent, or `null`.
const NULL_ID: &str = "null";

pub async fn serve(
    bindings: &HttpBindings,
    path_tenant: String,
    parts: http::request::Parts,
    body: Body,
) -> Response {
    let mut call = call_context(Binding::JsonRpc, &parts);
    // Before the body: a caller without credentials costs no body read
    // (its request's id is unread, so the answer's is null).
    if let Err(e) = bindings.api().authenticate_headers(&mut call).await {
        return error_response(NULL_ID, &e, false);
    }
    let bytes = match read_body(&parts, body).await {
        Ok(bytes) => bytes,
        Err(e) => return body_refused(e),
    };
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace()).copied();
    if first == Some(b'[') {
        return batch(bindings, &call, &path_tenant, &bytes).await;
    }
    let envelope = match serde_json::from_slice::<Envelope>(&bytes) {
        Ok(envelope) => envelope,
        Err(e) => return envelope_error(e),
    };
    let request = match Request::read(&envelope) {
        Ok(request) => request,
        Err(refusal) => return *refusal,
    };
    let id = request.id.to_owned();
    let mut record =
        bindings.observe_version(Binding::JsonRpc, request.version(), request.operation());
    let span = crate::telemetry::rpc_span(|| record.method(), "jsonrpc", call.trace.as_ref());
    let keepalive = bindings.keepalive();
    let answer = dispatch(bindings.api(), &call, &path_tenant, &request)
        .instrument(span)
        .await;
    // Without 0.3 (`--no-v0-3`) a 0.3 method is answered in 1.0 terms.
    let v03 = request.v03() && bindings.api().cards().serves_v0_3();
    match answer {
        RpcAnswer::Result(result) => {
            record.end(None);
            super::web::echo_extensions(
                respond(StatusCode::OK, result_body(&id, &result)),
                &call.params,
            )
        }
        RpcAnswer::Stream(events) => stream(events, id, record, keepalive, false),
        RpcAnswer::Stream03(events) => stream(events, id, record, keepalive, true),
        RpcAnswer::Error(err) => {
            // A streaming call refused before its first event is answered
            // like a unary one (`application/json`): the official 1.0
            // clients read a JSON body in place of an event stream as the
            // call's one response. The 0.3 client reads a stream's
            // errors only as events.
            record.end(Some(&err));
            if v03 && request.streaming() {
                let frame = sse::frame(&error_body_code(&id, v0_3::convert::code(&err), &err));
                return sse::response(futures_util::stream::iter([frame]), keepalive);
            }
            error_response(&id, &err, v03)
        }
    }
}

/// A batch: each call answered in order, in one array.
async fn batch(
    bindings: &HttpBindings,
    call: &CallContext,
    path_tenant: &str,
    bytes: &[u8],
) -> Response {
    let calls = match serde_json::from_slice::<Vec<&RawValue>>(bytes) {
        Ok(calls) => calls,
        Err(e) => return envelope_error(e),
    };
    if calls.is_empty() || calls.len() > MAX_BATCH {
        let err = A2aError::invalid(
            "batch",
            format!(
                "a batch holds 1 to {MAX_BATCH} requests, not {}",
                calls.len()
            ),
        );
        return error_response_status(StatusCode::BAD_REQUEST, NULL_ID, INVALID_REQUEST, &err);
    }
    let mut out = Vec::with_capacity(256 * calls.len());
    out.push(b'[');
    for (n, raw) in calls.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        let body = match serde_json::from_str::<Envelope>(raw.get()) {
            Err(_) => error_body_code(
                NULL_ID,
                INVALID_REQUEST,
                &not_a_request("not a JSON-RPC request object"),
            ),
            Ok(envelope) => match Request::read(&envelope) {
                Err(_) => error_body_code(
                    NULL_ID,
                    INVALID_REQUEST,
                    &not_a_request("not a JSON-RPC 2.0 request"),
                ),
                Ok(request) if request.streaming() => error_body_code(
                    request.id,
                    INVALID_REQUEST,
                    &not_a_request("streaming methods cannot be batched"),
                ),
                Ok(request) => {
                    let mut record = bindings.observe_version(
                        Binding::JsonRpc,
                        request.version(),
                        request.operation(),
                    );
                    match dispatch(bindings.api(), call, path_tenant, &request).await {
                        RpcAnswer::Result(result) => {
                            record.end(None);
                            result_body(request.id, &result)
                        }
                        RpcAnswer::Error(err) => {
                            record.end(Some(&err));
                            let v03 = request.v03() && bindings.api().cards().serves_v0_3();
                            error_body(request.id, &err, v03)
                        }
                        RpcAnswer::Stream(_) | RpcAnswer::Stream03(_) => {
                            unreachable!("streaming methods are refused above")
                        }
                    }
                }
            },
        };
        out.extend_from_slice(&body);
    }
    out.push(b']');
    respond(StatusCode::OK, out)
}

/// A request read off its envelope.
struct Request<'a> {
    id: &'a str,
    method: &'a str,
    params: Option<&'a RawValue>,
}

impl<'a> Request<'a> {
    /// The envelope's `jsonrpc`, `id`, `method` and `params`, checked
    /// (JSON-RPC 2.0 §4): -32600 when they do not make a request.
    fn read(envelope: &Envelope<'a>) -> Result<Request<'a>, Box<Response>> {
        let refuse = |id: &str, why: &str| {
            Box::new(error_response_status(
                StatusCode::BAD_REQUEST,
                id,
                INVALID_REQUEST,
                &not_a_request(why),
            ))
        };
        let id = match envelope.id.map(|id| id.get()) {
            None => {
                return Err(refuse(
                    NULL_ID,
                    "an \"id\" is required: every A2A method answers",
                ));
            }
            Some(id) if is_valid_id(id) => id,
            Some(_) => return Err(refuse(NULL_ID, "\"id\" must be a string, a number or null")),
        };
        if envelope.jsonrpc.map(|v| v.get()) != Some("\"2.0\"") {
            return Err(refuse(id, "\"jsonrpc\" must be \"2.0\""));
        }
        let method = match envelope.method.map(|m| m.get()) {
            Some(m) if m.len() >= 2 && m.starts_with('"') && !m.contains('\\') => {
                &m[1..m.len() - 1]
            }
            _ => {
                return Err(refuse(
                    id,
                    "\"method\" must be a string naming an A2A method",
                ));
            }
        };
        let params = match envelope.params {
            Some(p) if p.get().starts_with('{') => Some(p),
            Some(p) if p.get() == "null" => None,
            None => None,
            Some(_) => {
                let err = A2aError::invalid(
                    "params",
                    "params must be an object: the operation's request",
                );
                return Err(Box::new(error_response(
                    id,
                    &err,
                    v0_3::jsonrpc::operation(method).is_some(),
                )));
            }
        };
        Ok(Request { id, method, params })
    }

    fn streaming(&self) -> bool {
        matches!(self.method, "SendStreamingMessage" | "SubscribeToTask")
            || v0_3::jsonrpc::streaming(self.method)
    }

    /// A 0.3 method (`message/send`): served by `v0_3`, answered in 0.3
    /// form and codes.
    fn v03(&self) -> bool {
        v0_3::jsonrpc::operation(self.method).is_some()
    }

    /// The `protocol_version` label.
    fn version(&self) -> &'static str {
        if self.v03() {
            crate::metrics::V0_3
        } else {
            crate::metrics::V1_0
        }
    }

    /// The operation's metrics label: a 0.3 method counts as the 1.0
    /// operation it becomes.
    fn operation(&self) -> &'static str {
        crate::metrics::operation_label(
            v0_3::jsonrpc::operation(self.method).unwrap_or(self.method),
        )
    }
}

/// A string, a number or null (JSON-RPC 2.0 §4: an id is one of these).
fn is_valid_id(raw: &str) -> bool {
    matches!(raw.as_bytes().first(), Some(b'"' | b'-' | b'0'..=b'9')) || raw == "null"
}

fn not_a_request(why: &str) -> A2aError {
    A2aError::invalid("request", why)
}

/// What an operation answered.
pub(crate) enum RpcAnswer {
    /// The response's JSON.
    Result(Vec<u8>),
    Stream(EventStream),
    /// A stream whose events are written in 0.3 form.
    Stream03(EventStream),
    Error(A2aError),
}

/// `params` as the operation's request, with the endpoint's tenant.
fn params<M: Message + Name + Default + serde::de::DeserializeOwned + super::Tenanted>(
    request: &Request<'_>,
    path_tenant: &str,
) -> Result<M, A2aError> {
    let mut decoded: M = match request.params {
        None => M::default(),
        Some(raw) => json::from_request_slice(raw.get().as_bytes())
            .map_err(|e| A2aError::invalid("params", e.to_string()))?,
    };
    super::http_json::merge_tenant(decoded.tenant_mut(), path_tenant)?;
    Ok(decoded)
}

fn encoded<M: serde::Serialize>(response: Result<M, A2aError>) -> RpcAnswer {
    match response {
        Ok(message) => {
            let mut out = Vec::with_capacity(256);
            match json::write(&message, &mut out) {
                Ok(()) => RpcAnswer::Result(out),
                Err(e) => RpcAnswer::Error(A2aError::Internal(e.to_string())),
            }
        }
        Err(err) => RpcAnswer::Error(err),
    }
}

fn streamed(response: Result<EventStream, A2aError>) -> RpcAnswer {
    match response {
        Ok(events) => RpcAnswer::Stream(events),
        Err(err) => RpcAnswer::Error(err),
    }
}

/// Calls the operation `request.method` names (spec §9.4).
async fn dispatch(
    api: &A2aApi,
    call: &CallContext,
    tenant: &str,
    request: &Request<'_>,
) -> RpcAnswer {
    macro_rules! unary {
        ($op:ident) => {
            match params(request, tenant) {
                Ok(p) => encoded(api.$op(call, p).await),
                Err(err) => RpcAnswer::Error(err),
            }
        };
    }
    macro_rules! streaming {
        ($op:ident) => {
            match params(request, tenant) {
                Ok(p) => streamed(api.$op(call, p).await),
                Err(err) => RpcAnswer::Error(err),
            }
        };
    }
    match request.method {
        "SendMessage" => unary!(send_message),
        "SendStreamingMessage" => streaming!(send_streaming_message),
        "GetTask" => unary!(get_task),
        "ListTasks" => unary!(list_tasks),
        "CancelTask" => unary!(cancel_task),
        "SubscribeToTask" => streaming!(subscribe_to_task),
        "CreateTaskPushNotificationConfig" => unary!(create_task_push_notification_config),
        "GetTaskPushNotificationConfig" => unary!(get_task_push_notification_config),
        "ListTaskPushNotificationConfigs" => unary!(list_task_push_notification_configs),
        "DeleteTaskPushNotificationConfig" => {
            match params::<crate::proto::DeleteTaskPushNotificationConfigRequest>(request, tenant) {
                Ok(p) => match api.delete_task_push_notification_config(call, p).await {
                    Ok(()) => RpcAnswer::Result(b"{}".to_vec()),
                    Err(err) => RpcAnswer::Error(err),
                },
                Err(err) => RpcAnswer::Error(err),
            }
        }
        "GetExtendedAgentCard" => unary!(get_extended_agent_card),
        v03 if request.v03() => {
            v0_3::jsonrpc::dispatch(api, call, tenant, v03, request.params.map(|p| p.get())).await
        }
        other => RpcAnswer::Error(A2aError::MethodNotFound {
            method: other.to_owned(),
        }),
    }
}

/// `{"jsonrpc":"2.0","id":ID,"result":RESULT}`, RESULT already JSON.
fn result_body(id: &str, result: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(result.len() + id.len() + 32);
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(b",\"result\":");
    out.extend_from_slice(result);
    out.push(b'}');
    out
}

fn error_body(id: &str, err: &A2aError, v03: bool) -> Vec<u8> {
    let code = if v03 {
        v0_3::convert::code(err)
    } else {
        code(err)
    };
    error_body_code(id, code, err)
}

fn error_body_code(id: &str, code: i64, err: &A2aError) -> Vec<u8> {
    let error = serde_json::json!({
        "code": code,
        "message": err.message(),
        "data": error_details(err),
    });
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(b",\"error\":");
    serde_json::to_writer(&mut out, &error).expect("a JSON value writes");
    out.push(b'}');
    out
}

fn respond(status: StatusCode, body: Vec<u8>) -> Response {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// An error answer: 200, or 401 with the challenge.
fn error_response(id: &str, err: &A2aError, v03: bool) -> Response {
    let status = match err {
        A2aError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
        _ => StatusCode::OK,
    };
    with_challenge(respond(status, error_body(id, err, v03)), err)
}

fn error_response_status(status: StatusCode, id: &str, code: i64, err: &A2aError) -> Response {
    respond(status, error_body_code(id, code, err))
}

/// A body that was not read: 413 (-32600), 415 (-32005: a content type
/// the endpoint does not take, as the conformance kit expects) or 400,
/// as a JSON-RPC error.
fn body_refused(e: BodyError) -> Response {
    let status = e.status();
    let err = e.into_error();
    let code = match err {
        A2aError::ContentTypeNotSupported { .. } => code(&err),
        _ => INVALID_REQUEST,
    };
    error_response_status(status, NULL_ID, code, &err)
}

/// Not JSON (-32700), or JSON that is no request object (-32600).
fn envelope_error(e: serde_json::Error) -> Response {
    use serde_json::error::Category;
    let (code, why) = match e.classify() {
        Category::Syntax | Category::Eof | Category::Io => {
            (PARSE_ERROR, format!("the body is not valid JSON: {e}"))
        }
        Category::Data => (INVALID_REQUEST, format!("not a JSON-RPC request: {e}")),
    };
    error_response_status(
        StatusCode::BAD_REQUEST,
        NULL_ID,
        code,
        &A2aError::invalid("body", why),
    )
}

/// The events as JSON-RPC responses with the request's id; an error
/// ends the stream as one more response, carrying it.
fn stream(
    events: EventStream,
    id: String,
    mut record: CallRecord,
    keepalive: std::time::Duration,
    v03: bool,
) -> Response {
    let frames = async_stream::stream! {
        let mut events = events;
        let mut old = v0_3::convert::StreamOut::default();
        while let Some(event) = events.next().await {
            let written = event.and_then(|event| {
                let mut result = Vec::with_capacity(256);
                if v03 {
                    let event = old.event(event)?;
                    serde_json::to_writer(&mut result, &event)
                        .map_err(|e| A2aError::Internal(e.to_string()))?;
                } else {
                    json::write(&event, &mut result)
                        .map_err(|e| A2aError::Internal(e.to_string()))?;
                }
                Ok(result)
            });
            match written {
                Ok(result) => yield sse::frame(&result_body(&id, &result)),
                Err(err) => {
                    record.end(Some(&err));
                    yield sse::frame(&error_body(&id, &err, v03));
                    return;
                }
            }
        }
        record.end(None);
    };
    sse::response(frames, keepalive)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_paths() {
        assert_eq!(endpoint_tenant("/").as_deref(), Some(""));
        assert_eq!(endpoint_tenant("/deployer").as_deref(), Some("deployer"));
        assert_eq!(endpoint_tenant("/deployer/").as_deref(), Some("deployer"));
        assert_eq!(endpoint_tenant("/a/b"), None);
        assert_eq!(endpoint_tenant(""), None);
    }

    #[test]
    fn ids_are_strings_numbers_or_null() {
        for ok in ["1", "-2", "\"x\"", "null", "1.5"] {
            assert!(is_valid_id(ok), "{ok}");
        }
        for bad in ["{}", "[]", "true", "false"] {
            assert!(!is_valid_id(bad), "{bad}");
        }
    }

    #[test]
    fn every_a2a_error_has_its_spec_code() {
        assert_eq!(
            code(&A2aError::TaskNotFound {
                task_id: "t".into()
            }),
            -32001
        );
        assert_eq!(
            code(&A2aError::VersionNotSupported {
                requested: "9".into()
            }),
            -32009
        );
        assert_eq!(code(&A2aError::invalid("f", "d")), -32602);
        assert_eq!(code(&A2aError::Internal("x".into())), -32603);
    }
}

#[cfg(test)]
mod stream_tests {
    use super::*;
    use crate::proto::{StreamResponse, Task, stream_response};

    /// A stream error after the first event is one more JSON-RPC response
    /// with the request's id, carrying the error (spec §9.4.2, §9.5).
    #[tokio::test]
    async fn a_mid_stream_error_is_an_error_response() {
        let task = StreamResponse {
            payload: Some(stream_response::Payload::Task(Task {
                id: "t".into(),
                ..Default::default()
            })),
        };
        let events: EventStream = Box::pin(futures_util::stream::iter([
            Ok(task),
            Err(A2aError::Unavailable("shutting down".into())),
        ]));
        let record = CallRecord::detached(Binding::JsonRpc, "SubscribeToTask");
        let response = stream(
            events,
            "\"r-1\"".into(),
            record,
            std::time::Duration::from_secs(60),
            false,
        );
        let body = http_body_util::BodyExt::collect(response.into_body())
            .await
            .unwrap()
            .to_bytes();
        let text = String::from_utf8(body.to_vec()).unwrap();
        let mut events = text.split("\n\n").filter(|e| !e.is_empty());
        assert_eq!(
            events.next(),
            Some(r#"data: {"jsonrpc":"2.0","id":"r-1","result":{"task":{"id":"t"}}}"#)
        );
        let error: serde_json::Value =
            serde_json::from_str(events.next().unwrap().strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(error["id"], "r-1");
        assert_eq!(error["error"]["code"], SERVER_ERROR);
        assert_eq!(error["error"]["data"][0]["reason"], "UNAVAILABLE");
        assert_eq!(events.next(), None);
    }
}
