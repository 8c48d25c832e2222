//! The HTTP+JSON binding (spec §11): the routes of the
//! `google.api.http` annotations in `proto/a2a.proto`, read from the
//! compiled descriptors at start (not typed out again), including their
//! `/{tenant}/...` bindings; plus `POST /tasks/{id}:subscribe`, which
//! spec §11.3.2 names beside the annotation's `GET`.
//!
//! A request is built the way the annotations say: the body (`body:
//! "*"`) as the ProtoJSON of the proto request, path variables into
//! their fields, and for `GET` and `DELETE` the query parameters, by
//! their camelCase (or proto) names (spec §11.5: strings, numbers,
//! booleans, enum names or numbers, repeated values by repetition or
//! commas, timestamps as RFC 3339; nested messages are refused).
//! Responses are the ProtoJSON of the proto response (`application/json`,
//! or `application/a2a+json` when the request accepts it, spec §11.1); streams are SSE whose `data` is
//! a bare `StreamResponse` (spec §11.7); errors are the AIP-193 form of
//! spec §11.6 with the statuses of §5.4 and the `google.rpc.ErrorInfo`
//! in `details`.

use std::str::FromStr;

use axum::body::Body;
use axum::response::Response;
use futures_util::StreamExt;
use http::{HeaderValue, Method, StatusCode, header};
use prost::{Message, Name};
use prost_reflect::{DynamicMessage, FieldDescriptor, Kind, MessageDescriptor, Value};
use tracing::Instrument;

use super::web::{
    A2A_JSON, CallRecord, HttpBindings, call_context, decode_component, error_details,
    form_urlencoded, http_status, read_body, with_challenge,
};
use super::{A2aApi, Binding, CallContext, EventStream, sse};
use crate::error::A2aError;
use crate::json;

/// The operations, by the RPC the annotation is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    SendMessage,
    SendStreamingMessage,
    GetTask,
    ListTasks,
    CancelTask,
    SubscribeToTask,
    CreateTaskPushNotificationConfig,
    GetTaskPushNotificationConfig,
    ListTaskPushNotificationConfigs,
    DeleteTaskPushNotificationConfig,
    GetExtendedAgentCard,
}

impl Operation {
    const ALL: [Operation; 11] = [
        Operation::SendMessage,
        Operation::SendStreamingMessage,
        Operation::GetTask,
        Operation::ListTasks,
        Operation::CancelTask,
        Operation::SubscribeToTask,
        Operation::CreateTaskPushNotificationConfig,
        Operation::GetTaskPushNotificationConfig,
        Operation::ListTaskPushNotificationConfigs,
        Operation::DeleteTaskPushNotificationConfig,
        Operation::GetExtendedAgentCard,
    ];

    /// The operation of the RPC named `rpc`.
    fn of(rpc: &str) -> Option<Operation> {
        Operation::ALL
            .into_iter()
            .find(|op| operation_label(*op) == rpc)
    }
}

/// One segment of a path template.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Segment {
    Literal(String),
    /// `{field}` or `{field=*}`: one path segment into the field.
    Variable(String),
}

/// A `google.api.http` path template (`/tasks/{id=*}:cancel`).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Template {
    segments: Vec<Segment>,
    verb: Option<String>,
}

impl Template {
    /// Only single-segment variables: what `a2a.proto` uses. Anything
    /// else is a build error (a test reads every annotation).
    fn parse(template: &str) -> Result<Template, String> {
        let path = template
            .strip_prefix('/')
            .ok_or_else(|| format!("{template:?} does not start with /"))?;
        let last_slash = path.rfind('/').map_or(0, |i| i + 1);
        let (path, verb) = match path[last_slash..].rfind(':') {
            Some(at) if !path[last_slash..].ends_with('}') => {
                let at = last_slash + at;
                (&path[..at], Some(path[at + 1..].to_owned()))
            }
            _ => (path, None),
        };
        let segments = path
            .split('/')
            .map(|segment| match segment.strip_prefix('{') {
                Some(variable) => {
                    let variable = variable
                        .strip_suffix('}')
                        .ok_or_else(|| format!("{template:?}: unclosed variable"))?;
                    let (name, pattern) = variable.split_once('=').unwrap_or((variable, "*"));
                    if pattern != "*" {
                        return Err(format!(
                            "{template:?}: only {{field=*}} variables are served"
                        ));
                    }
                    Ok(Segment::Variable(name.to_owned()))
                }
                None => Ok(Segment::Literal(segment.to_owned())),
            })
            .collect::<Result<_, String>>()?;
        Ok(Template { segments, verb })
    }

    /// The variables of `path`, percent-decoded, when it matches.
    fn matches(&self, path: &str) -> Option<Vec<(String, String)>> {
        let mut path = path.strip_prefix('/')?;
        if let Some(verb) = &self.verb {
            path = path.strip_suffix(verb.as_str())?.strip_suffix(':')?;
        }
        let mut vars = Vec::new();
        let mut segments = path.split('/');
        for expected in &self.segments {
            let segment = segments.next()?;
            match expected {
                Segment::Literal(literal) if literal == segment => {}
                Segment::Literal(_) => return None,
                Segment::Variable(_) if segment.is_empty() => return None,
                Segment::Variable(field) => {
                    vars.push((field.clone(), decode_component(segment, false)));
                }
            }
        }
        segments.next().is_none().then_some(vars)
    }
}

/// One route: an HTTP method and template, and the operation it calls.
#[derive(Clone, Debug)]
pub struct HttpRoute {
    method: Method,
    template: Template,
    /// `body: "*"`: the body is the request.
    body: bool,
    operation: Operation,
    input: MessageDescriptor,
}

impl HttpRoute {
    pub fn operation(&self) -> Operation {
        self.operation
    }
}

/// Every route of the binding.
#[derive(Clone, Debug)]
pub struct Routes {
    routes: Vec<HttpRoute>,
}

/// What a request's method and path found.
pub enum Found<'a> {
    Route(&'a HttpRoute, Vec<(String, String)>),
    /// The path is a route's, not for this method: 405 with these.
    OtherMethods(Vec<Method>),
    Nothing,
}

impl Routes {
    /// The routes of the `google.api.http` annotations of
    /// `lf.a2a.v1.A2AService`, primary binding first, then the
    /// additional ones (`/{tenant}/...`), in the order of the proto; a
    /// template with a verb is tried before one without, so
    /// `GET /tasks/t-1:subscribe` is SubscribeToTask, not GetTask of
    /// `t-1:subscribe`.
    pub fn from_proto() -> Routes {
        Routes::read().expect("the google.api.http annotations of a2a.proto are served")
    }

    fn read() -> Result<Routes, String> {
        let pool = &*json::POOL;
        let service = pool
            .get_service_by_name("lf.a2a.v1.A2AService")
            .ok_or("no lf.a2a.v1.A2AService in the descriptors")?;
        let http = pool
            .get_extension_by_name("google.api.http")
            .ok_or("no google.api.http extension in the descriptors")?;
        let mut routes = Vec::new();
        for rpc in service.methods() {
            let operation = Operation::of(rpc.name())
                .ok_or_else(|| format!("no operation serves the RPC {}", rpc.name()))?;
            let options = rpc.options();
            if !options.has_extension(&http) {
                return Err(format!("{} has no google.api.http annotation", rpc.name()));
            }
            let rule = options.get_extension(&http);
            let rule = rule.as_message().ok_or("google.api.http is a message")?;
            let mut rules = vec![rule.clone()];
            if let Some(Value::List(more)) =
                rule.get_field_by_name("additional_bindings").as_deref()
            {
                rules.extend(more.iter().filter_map(|r| r.as_message().cloned()));
            }
            for rule in rules {
                let (method, template) = rule_pattern(&rule)?;
                let body = rule
                    .get_field_by_name("body")
                    .and_then(|b| b.as_str().map(|b| b == "*"))
                    .unwrap_or(false);
                let template = Template::parse(&template)?;
                routes.push(HttpRoute {
                    method: method.clone(),
                    template: template.clone(),
                    body,
                    operation,
                    input: rpc.input(),
                });
                // Spec §11.3.2 (and the official clients) subscribe with
                // POST; the annotation says GET. Both are served.
                if operation == Operation::SubscribeToTask && method == Method::GET {
                    routes.push(HttpRoute {
                        method: Method::POST,
                        template,
                        body: false,
                        operation,
                        input: rpc.input(),
                    });
                }
            }
        }
        routes.sort_by_key(|r| r.template.verb.is_none());
        Ok(Routes { routes })
    }

    /// The route for `method` and `path`.
    pub fn find(&self, method: &Method, path: &str) -> Found<'_> {
        let mut others = Vec::new();
        for route in &self.routes {
            if let Some(vars) = route.template.matches(path) {
                if route.method == method {
                    return Found::Route(route, vars);
                }
                if !others.contains(&route.method) {
                    others.push(route.method.clone());
                }
            }
        }
        if others.is_empty() {
            Found::Nothing
        } else {
            Found::OtherMethods(others)
        }
    }

    /// Every route as `METHOD /template`, for docs and tests.
    pub fn describe(&self) -> Vec<(Method, String, Operation)> {
        self.routes
            .iter()
            .map(|r| {
                let mut path = String::new();
                for segment in &r.template.segments {
                    path.push('/');
                    match segment {
                        Segment::Literal(l) => path.push_str(l),
                        Segment::Variable(v) => {
                            path.push('{');
                            path.push_str(v);
                            path.push('}');
                        }
                    }
                }
                if let Some(verb) = &r.template.verb {
                    path.push(':');
                    path.push_str(verb);
                }
                (r.method.clone(), path, r.operation)
            })
            .collect()
    }
}

/// The method and template of an `HttpRule`.
fn rule_pattern(rule: &DynamicMessage) -> Result<(Method, String), String> {
    for (field, method) in [
        ("get", Method::GET),
        ("post", Method::POST),
        ("delete", Method::DELETE),
        ("put", Method::PUT),
        ("patch", Method::PATCH),
    ] {
        if let Some(template) = rule
            .get_field_by_name(field)
            .and_then(|v| v.as_str().map(str::to_owned))
            && !template.is_empty()
        {
            return Ok((method, template));
        }
    }
    Err("an HttpRule without a pattern".into())
}

/// A tenant named twice, by the path and by the request, must agree; the
/// path's fills in a request that names none.
pub fn merge_tenant(tenant: &mut String, from_path: &str) -> Result<(), A2aError> {
    if from_path.is_empty() || tenant == from_path {
        return Ok(());
    }
    if tenant.is_empty() {
        from_path.clone_into(tenant);
        return Ok(());
    }
    Err(A2aError::invalid(
        "tenant",
        format!("the path names tenant {from_path:?}, the request {tenant:?}"),
    ))
}

/// 405, with the methods the path is served with.
pub fn method_not_allowed(allowed: &[Method]) -> Response {
    let names: Vec<&str> = allowed.iter().map(Method::as_str).collect();
    let err = A2aError::MethodNotFound {
        method: format!("this path is served with {}", names.join(", ")),
    };
    let mut response = error_response(&err);
    *response.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
    if let Ok(allow) = HeaderValue::from_str(&names.join(", ")) {
        response.headers_mut().insert(header::ALLOW, allow);
    }
    response
}

/// The AIP-193 form of spec §11.6: `{"error": {"code", "status",
/// "message", "details"}}` with the status of §5.4.
pub fn error_response(err: &A2aError) -> Response {
    error_response_as(err, JSON)
}

fn error_response_as(err: &A2aError, media_type: &'static str) -> Response {
    let status = http_status(err);
    let body = error_json(err, status);
    let response = respond(status, body, media_type);
    with_challenge(response, err)
}

pub(crate) fn error_json(err: &A2aError, status: StatusCode) -> Vec<u8> {
    let body = serde_json::json!({
        "error": {
            "code": status.as_u16(),
            "status": crate::metrics::code_label(super::grpc::code(err)),
            "message": err.message(),
            "details": error_details(err),
        }
    });
    serde_json::to_vec(&body).expect("a JSON value writes")
}

/// The media type of answers: `application/json`, which every client
/// reads (the conformance kit requires it), unless the request's
/// `Accept` names `application/a2a+json` (spec §11.1, §14.1).
const JSON: &str = "application/json";

fn media_type(parts: &http::request::Parts) -> &'static str {
    let accepts_a2a = parts
        .headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains(A2A_JSON));
    if accepts_a2a { A2A_JSON } else { JSON }
}

fn respond(status: StatusCode, body: Vec<u8>, media_type: &'static str) -> Response {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(media_type));
    response
}

/// Serves one request of `route`.
pub async fn serve(
    bindings: &HttpBindings,
    route: &HttpRoute,
    vars: Vec<(String, String)>,
    parts: http::request::Parts,
    body: Body,
) -> Response {
    let mut call = call_context(Binding::HttpJson, &parts);
    let media = media_type(&parts);
    let mut record = bindings.observe(Binding::HttpJson, operation_label(route.operation));
    let span = crate::telemetry::rpc_span(|| record.method(), "http-json", call.trace.as_ref());
    let answer = async {
        // Before the body: a caller without credentials costs no read.
        bindings
            .api()
            .authenticate_headers(&mut call)
            .await
            .map_err(Refusal::Error)?;
        let bytes = if route.body {
            read_body(&parts, body).await.map_err(Refusal::Body)?
        } else {
            bytes::Bytes::new()
        };
        let query = if route.body { None } else { parts.uri.query() };
        let input = Input {
            route,
            vars: &vars,
            query,
            body: &bytes,
        };
        dispatch(bindings.api(), &call, route.operation, input)
            .await
            .map_err(Refusal::Error)
    }
    .instrument(span)
    .await;
    match answer {
        Ok(HttpAnswer::Result(body)) => {
            record.end(None);
            super::web::echo_extensions(respond(StatusCode::OK, body, media), &call.params)
        }
        Ok(HttpAnswer::Stream(events)) => stream(events, record, bindings.keepalive()),
        Err(Refusal::Error(err)) => {
            record.end(Some(&err));
            error_response_as(&err, media)
        }
        Err(Refusal::Body(e)) => {
            // 413, 415 or 400 as the body says; the error in the
            // binding's form.
            let status = e.status();
            let err = e.into_error();
            record.end(Some(&err));
            let mut response = error_response_as(&err, media);
            *response.status_mut() = status;
            response
        }
    }
}

/// Why a request was not served: its body was not read, or the
/// operation refused it.
enum Refusal {
    Body(super::web::BodyError),
    Error(A2aError),
}

fn operation_label(operation: Operation) -> &'static str {
    use Operation::*;
    match operation {
        SendMessage => "SendMessage",
        SendStreamingMessage => "SendStreamingMessage",
        GetTask => "GetTask",
        ListTasks => "ListTasks",
        CancelTask => "CancelTask",
        SubscribeToTask => "SubscribeToTask",
        CreateTaskPushNotificationConfig => "CreateTaskPushNotificationConfig",
        GetTaskPushNotificationConfig => "GetTaskPushNotificationConfig",
        ListTaskPushNotificationConfigs => "ListTaskPushNotificationConfigs",
        DeleteTaskPushNotificationConfig => "DeleteTaskPushNotificationConfig",
        GetExtendedAgentCard => "GetExtendedAgentCard",
    }
}

/// What a request brings for its proto request.
struct Input<'a> {
    route: &'a HttpRoute,
    vars: &'a [(String, String)],
    query: Option<&'a str>,
    body: &'a [u8],
}

enum HttpAnswer {
    Result(Vec<u8>),
    Stream(EventStream),
}

/// The proto request of `input`: the body, then the path variables and
/// the query parameters.
fn request<M: Message + Name + Default + serde::de::DeserializeOwned + super::Tenanted>(
    input: &Input<'_>,
) -> Result<M, A2aError> {
    let body_given = input.route.body && !input.body.iter().all(u8::is_ascii_whitespace);
    let mut tenant = String::new();
    let mut fields: Vec<(&str, Vec<String>)> = Vec::new();
    for (field, value) in input.vars {
        if field == "tenant" {
            tenant = value.clone();
        } else {
            fields.push((field.as_str(), vec![value.clone()]));
        }
    }
    let query: Vec<(String, String)> = input
        .query
        .map(|q| form_urlencoded(q).collect())
        .unwrap_or_default();
    let descriptor = &input.route.input;
    let mut from_query: Vec<(FieldDescriptor, Vec<String>)> = Vec::new();
    for (name, value) in &query {
        let Some(field) = descriptor
            .get_field_by_json_name(name)
            .or_else(|| descriptor.get_field_by_name(name))
        else {
            // Spec §5.7: unrecognized fields are ignored (A2A-Version
            // among them: a service parameter, read by the call context).
            continue;
        };
        match from_query.iter_mut().find(|(f, _)| *f == field) {
            Some((_, values)) => values.push(value.clone()),
            None => from_query.push((field, vec![value.clone()])),
        }
    }
    let mut message: M = if !body_given {
        M::default()
    } else {
        json::from_request_slice(input.body)
            .map_err(|e| A2aError::invalid("body", e.to_string()))?
    };
    if !fields.is_empty() || !from_query.is_empty() {
        let mut dynamic =
            DynamicMessage::decode(descriptor.clone(), message.encode_to_vec().as_slice())
                .map_err(|e| A2aError::Internal(e.to_string()))?;
        for (name, values) in fields {
            let field = descriptor.get_field_by_name(name).ok_or_else(|| {
                A2aError::Internal(format!("no field {name} in {}", descriptor.name()))
            })?;
            set(&mut dynamic, &field, &values)?;
        }
        for (field, values) in &from_query {
            set(&mut dynamic, field, values)?;
        }
        message = M::decode(dynamic.encode_to_vec().as_slice())
            .map_err(|e| A2aError::Internal(e.to_string()))?;
    }
    merge_tenant(message.tenant_mut(), &tenant)?;
    Ok(message)
}

/// A path variable or query parameter into its field (spec §11.5).
fn set(
    message: &mut DynamicMessage,
    field: &FieldDescriptor,
    values: &[String],
) -> Result<(), A2aError> {
    let name = field.json_name();
    let bad = |why: String| A2aError::invalid(name, why);
    if field.is_map() {
        return Err(bad("a map cannot be given as a query parameter".into()));
    }
    if field.is_list() {
        let mut list = Vec::new();
        for value in values.iter().flat_map(|v| v.split(',')) {
            list.push(scalar(field, value).map_err(&bad)?);
        }
        message.set_field(field, Value::List(list));
        return Ok(());
    }
    let [value] = values else {
        return Err(bad(format!(
            "given {} times; it takes one value",
            values.len()
        )));
    };
    message.set_field(field, scalar(field, value).map_err(&bad)?);
    Ok(())
}

/// One value of a field's kind from its text form.
fn scalar(field: &FieldDescriptor, text: &str) -> Result<Value, String> {
    fn number<T: FromStr>(text: &str) -> Result<T, String> {
        text.parse()
            .map_err(|_| format!("{text:?} is not a number of this field's kind"))
    }
    Ok(match field.kind() {
        Kind::String => Value::String(text.to_owned()),
        Kind::Bool => match text {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => return Err(format!("{text:?} is not true or false")),
        },
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => Value::I32(number(text)?),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => Value::I64(number(text)?),
        Kind::Uint32 | Kind::Fixed32 => Value::U32(number(text)?),
        Kind::Uint64 | Kind::Fixed64 => Value::U64(number(text)?),
        Kind::Float => Value::F32(number(text)?),
        Kind::Double => Value::F64(number(text)?),
        Kind::Enum(e) => match e.get_value_by_name(text) {
            Some(v) => Value::EnumNumber(v.number()),
            None => match text.parse::<i32>() {
                Ok(n) if e.get_value(n).is_some() => Value::EnumNumber(n),
                _ => {
                    let names: Vec<String> = e.values().map(|v| v.name().to_owned()).collect();
                    return Err(format!("{text:?} is not one of {}", names.join(", ")));
                }
            },
        },
        Kind::Message(m) if m.full_name() == "google.protobuf.Timestamp" => {
            let ts = crate::wkt::Timestamp::from_str(text).map_err(|_| {
                format!("{text:?} is not an RFC 3339 timestamp (2025-11-09T10:30:00Z)")
            })?;
            Value::Message(
                DynamicMessage::decode(m, ts.encode_to_vec().as_slice())
                    .map_err(|e| e.to_string())?,
            )
        }
        Kind::Bytes | Kind::Message(_) => {
            return Err("not given as a query parameter (spec §11.5): send it in a body".into());
        }
    })
}

/// Calls `operation` with the request `input` makes.
async fn dispatch(
    api: &A2aApi,
    call: &CallContext,
    operation: Operation,
    input: Input<'_>,
) -> Result<HttpAnswer, A2aError> {
    use Operation::*;
    fn encoded<M: serde::Serialize>(message: M) -> Result<HttpAnswer, A2aError> {
        let mut out = Vec::with_capacity(256);
        json::write(&message, &mut out).map_err(|e| A2aError::Internal(e.to_string()))?;
        Ok(HttpAnswer::Result(out))
    }
    match operation {
        SendMessage => encoded(api.send_message(call, request(&input)?).await?),
        SendStreamingMessage => Ok(HttpAnswer::Stream(
            api.send_streaming_message(call, request(&input)?).await?,
        )),
        GetTask => encoded(api.get_task(call, request(&input)?).await?),
        ListTasks => encoded(api.list_tasks(call, request(&input)?).await?),
        CancelTask => encoded(api.cancel_task(call, request(&input)?).await?),
        SubscribeToTask => Ok(HttpAnswer::Stream(
            api.subscribe_to_task(call, request(&input)?).await?,
        )),
        CreateTaskPushNotificationConfig => encoded(
            api.create_task_push_notification_config(call, request(&input)?)
                .await?,
        ),
        GetTaskPushNotificationConfig => encoded(
            api.get_task_push_notification_config(call, request(&input)?)
                .await?,
        ),
        ListTaskPushNotificationConfigs => encoded(
            api.list_task_push_notification_configs(call, request(&input)?)
                .await?,
        ),
        DeleteTaskPushNotificationConfig => {
            api.delete_task_push_notification_config(call, request(&input)?)
                .await?;
            Ok(HttpAnswer::Result(b"{}".to_vec()))
        }
        GetExtendedAgentCard => encoded(api.get_extended_agent_card(call, request(&input)?).await?),
    }
}

/// The events as SSE `data` lines of bare `StreamResponse`s (spec
/// §11.7); an error ends the stream as one more event, `event: error`,
/// its `data` the AIP-193 error object.
fn stream(events: EventStream, mut record: CallRecord, keepalive: std::time::Duration) -> Response {
    let frames = async_stream::stream! {
        let mut events = events;
        while let Some(event) = events.next().await {
            let event = event.and_then(|event| {
                let mut out = Vec::with_capacity(256);
                json::write(&event, &mut out).map_err(|e| A2aError::Internal(e.to_string()))?;
                Ok(out)
            });
            match event {
                Ok(json) => yield sse::frame(&json),
                Err(err) => {
                    record.end(Some(&err));
                    yield sse::named_frame("error", &error_json(&err, http_status(&err)));
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
    use crate::proto;

    #[test]
    fn templates_parse_with_verbs_and_variables() {
        let t = Template::parse("/tasks/{id=*}:cancel").unwrap();
        assert_eq!(
            t.segments,
            [
                Segment::Literal("tasks".into()),
                Segment::Variable("id".into())
            ]
        );
        assert_eq!(t.verb.as_deref(), Some("cancel"));
        let t = Template::parse("/message:send").unwrap();
        assert_eq!(t.segments, [Segment::Literal("message".into())]);
        assert_eq!(t.verb.as_deref(), Some("send"));
        let t =
            Template::parse("/{tenant}/tasks/{task_id=*}/pushNotificationConfigs/{id=*}").unwrap();
        assert_eq!(t.segments.len(), 5);
        assert_eq!(t.verb, None);
        assert!(Template::parse("/tasks/{id=**}").is_err());
        assert!(Template::parse("tasks").is_err());
    }

    #[test]
    fn matching_decodes_variables_and_needs_the_verb() {
        let t = Template::parse("/{tenant}/tasks/{id=*}:cancel").unwrap();
        assert_eq!(
            t.matches("/deployer/tasks/a%2Fb:cancel"),
            Some(vec![
                ("tenant".into(), "deployer".into()),
                ("id".into(), "a/b".into())
            ])
        );
        assert_eq!(t.matches("/deployer/tasks/x"), None);
        assert_eq!(t.matches("/deployer/tasks/:cancel"), None);
        assert_eq!(t.matches("/deployer/tasks/x:cancel/more"), None);
    }

    /// Every RPC of the service has its routes, from the proto.
    #[test]
    fn every_annotation_is_a_route() {
        let routes = Routes::from_proto().describe();
        let has = |method: Method, path: &str, op: Operation| {
            routes
                .iter()
                .any(|(m, p, o)| *m == method && p == path && *o == op)
        };
        assert!(has(Method::POST, "/message:send", Operation::SendMessage));
        assert!(has(
            Method::POST,
            "/{tenant}/message:stream",
            Operation::SendStreamingMessage
        ));
        assert!(has(Method::GET, "/tasks/{id}", Operation::GetTask));
        assert!(has(Method::GET, "/{tenant}/tasks", Operation::ListTasks));
        assert!(has(
            Method::POST,
            "/tasks/{id}:cancel",
            Operation::CancelTask
        ));
        assert!(has(
            Method::GET,
            "/tasks/{id}:subscribe",
            Operation::SubscribeToTask
        ));
        assert!(has(
            Method::POST,
            "/tasks/{id}:subscribe",
            Operation::SubscribeToTask
        ));
        assert!(has(
            Method::DELETE,
            "/{tenant}/tasks/{task_id}/pushNotificationConfigs/{id}",
            Operation::DeleteTaskPushNotificationConfig
        ));
        assert!(has(
            Method::GET,
            "/extendedAgentCard",
            Operation::GetExtendedAgentCard
        ));
        // 11 RPCs, each with a tenant binding, and POST subscribe twice.
        assert_eq!(routes.len(), 24);
    }

    #[test]
    fn a_verb_route_wins_over_a_variable_one() {
        let routes = Routes::from_proto();
        match routes.find(&Method::GET, "/tasks/t-1:subscribe") {
            Found::Route(route, vars) => {
                assert_eq!(route.operation(), Operation::SubscribeToTask);
                assert_eq!(vars, [("id".to_owned(), "t-1".to_owned())]);
            }
            _ => panic!("no route"),
        }
        match routes.find(&Method::PUT, "/tasks/t-1") {
            Found::OtherMethods(allowed) => assert_eq!(allowed, [Method::GET]),
            _ => panic!("expected 405"),
        }
    }

    #[test]
    fn query_parameters_take_their_field_kinds() {
        let routes = Routes::from_proto();
        let Found::Route(route, vars) = routes.find(&Method::GET, "/deployer/tasks") else {
            panic!("no route");
        };
        let input = Input {
            route,
            vars: &vars,
            query: Some(
                "contextId=c-1&status=TASK_STATE_WORKING&pageSize=5&includeArtifacts=true&statusTimestampAfter=2025-11-09T10:30:00Z&historyLength=2",
            ),
            body: b"",
        };
        let req: proto::ListTasksRequest = request(&input).unwrap();
        assert_eq!(req.tenant, "deployer");
        assert_eq!(req.context_id, "c-1");
        assert_eq!(req.status, proto::TaskState::Working as i32);
        assert_eq!(req.page_size, Some(5));
        assert_eq!(req.include_artifacts, Some(true));
        assert_eq!(req.history_length, Some(2));
        assert_eq!(req.status_timestamp_after.unwrap().seconds, 1_762_684_200);
        for bad in [
            "pageSize=x",
            "includeArtifacts=yes",
            "status=NOPE",
            "statusTimestampAfter=yesterday",
            "pageSize=1&pageSize=2",
        ] {
            let input = Input {
                route,
                vars: &vars,
                query: Some(bad),
                body: b"",
            };
            let err = request::<proto::ListTasksRequest>(&input).unwrap_err();
            assert_eq!(err.reason(), "INVALID_PARAMS", "{bad}");
        }
    }
}

#[cfg(test)]
mod stream_tests {
    use super::*;
    use crate::proto::{StreamResponse, Task, stream_response};

    /// A stream error after the first event is one more event: `event:
    /// error` with the AIP-193 object (spec §11.6, §11.7).
    #[tokio::test]
    async fn a_mid_stream_error_is_an_error_event() {
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
        let record = CallRecord::detached(crate::bindings::Binding::HttpJson, "SubscribeToTask");
        let response = stream(events, record, std::time::Duration::from_secs(60));
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        let body = http_body_util::BodyExt::collect(response.into_body())
            .await
            .unwrap()
            .to_bytes();
        let text = String::from_utf8(body.to_vec()).unwrap();
        let mut events = text.split("\n\n").filter(|e| !e.is_empty());
        assert_eq!(events.next(), Some(r#"data: {"task":{"id":"t"}}"#));
        let error = events.next().unwrap();
        let data = error.strip_prefix("event: error\ndata: ").expect(error);
        let value: serde_json::Value = serde_json::from_str(data).unwrap();
        assert_eq!(value["error"]["code"], 503);
        assert_eq!(value["error"]["status"], "UNAVAILABLE");
        assert_eq!(value["error"]["details"][0]["reason"], "UNAVAILABLE");
        assert_eq!(events.next(), None);
    }
}
