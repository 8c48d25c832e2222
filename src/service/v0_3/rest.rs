//! The 0.3 HTTP+JSON routes (A2A 0.3 §3.5.6; the `google.api.http`
//! annotations of `proto/a2a_v0_3.proto`), beside the 1.0 ones:
//!
//! | route | operation |
//! | --- | --- |
//! | `POST /v1/message:send`, `POST /v1/message:stream` | send, streamed send |
//! | `GET /v1/tasks/{id}` (`?historyLength=`) | get |
//! | `POST /v1/tasks/{id}:cancel` | cancel |
//! | `GET` or `POST /v1/tasks/{id}:subscribe` | subscribe |
//! | `POST /v1/tasks/{id}/pushNotificationConfigs` | create a push config |
//! | `GET /v1/tasks/{id}/pushNotificationConfigs[/{config}]` | list, get |
//! | `DELETE /v1/tasks/{id}/pushNotificationConfigs/{config}` | delete |
//! | `GET /v1/card` | the extended card |
//!
//! Each may follow a `/{tenant}` prefix: 0.3 has no tenant field, so a
//! tenant's 0.3 base URL carries it. `v1` is therefore no tenant name
//! while 0.3 is served. Bodies are the ProtoJSON of 0.3's proto (read
//! leniently, unknown fields ignored); answers too, streams as SSE of 0.3
//! `StreamResponse`s. Errors are 1.0's AIP-193 objects with 1.0's
//! statuses: the official 0.3 client reads only the status.

use axum::body::Body;
use axum::response::Response;
use futures_util::StreamExt;
use http::{HeaderValue, Method, header};
use tracing::Instrument;

use super::pb;
use crate::error::A2aError;
use crate::json;
use crate::proto::{self, v0_3 as old};
use crate::service::web::{HttpBindings, call_context, read_body};
use crate::service::{Binding, CallContext, EventStream, http_json, sse};

/// A 0.3 route's operation, with the ids its path names.
#[derive(Debug, PartialEq, Eq)]
pub enum RestRoute {
    Send,
    Stream,
    Get(String),
    Cancel(String),
    Subscribe(String),
    CreateConfig(String),
    ListConfigs(String),
    GetConfig(String, String),
    DeleteConfig(String, String),
    Card,
}

impl RestRoute {
    fn operation(&self) -> &'static str {
        match self {
            RestRoute::Send => "SendMessage",
            RestRoute::Stream => "SendStreamingMessage",
            RestRoute::Get(_) => "GetTask",
            RestRoute::Cancel(_) => "CancelTask",
            RestRoute::Subscribe(_) => "SubscribeToTask",
            RestRoute::CreateConfig(_) => "CreateTaskPushNotificationConfig",
            RestRoute::ListConfigs(_) => "ListTaskPushNotificationConfigs",
            RestRoute::GetConfig(..) => "GetTaskPushNotificationConfig",
            RestRoute::DeleteConfig(..) => "DeleteTaskPushNotificationConfig",
            RestRoute::Card => "GetExtendedAgentCard",
        }
    }

    fn has_body(&self) -> bool {
        matches!(
            self,
            RestRoute::Send | RestRoute::Stream | RestRoute::CreateConfig(_) | RestRoute::Cancel(_)
        )
    }
}

static POST: [Method; 1] = [Method::POST];
static GET: [Method; 1] = [Method::GET];
static GET_POST: [Method; 2] = [Method::GET, Method::POST];
static DELETE_GET: [Method; 2] = [Method::DELETE, Method::GET];

/// What a path under `/v1/` is: `None` when it is not a 0.3 path at
/// all (the 1.0 routes are tried next); `Some(Err(allowed))` when the
/// path is one but not for this method.
pub fn find(method: &Method, path: &str) -> Option<(String, Result<RestRoute, &'static [Method]>)> {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (tenant, rest) = match segments.as_slice() {
        ["v1", rest @ ..] => (String::new(), rest),
        [tenant, "v1", rest @ ..] if !tenant.is_empty() => {
            (crate::service::web::decode_component(tenant, false), rest)
        }
        _ => return None,
    };
    let decode = |s: &str| crate::service::web::decode_component(s, false);
    let route = match (rest, method) {
        (["message:send"], &Method::POST) => Ok(RestRoute::Send),
        (["message:stream"], &Method::POST) => Ok(RestRoute::Stream),
        (["message:send" | "message:stream"], _) => Err(&POST[..]),
        (["card"], &Method::GET) => Ok(RestRoute::Card),
        (["card"], _) => Err(&GET[..]),
        (["tasks", id], m) => match id.rsplit_once(':') {
            Some((id, "cancel")) if m == Method::POST => Ok(RestRoute::Cancel(decode(id))),
            Some((_, "cancel")) => Err(&POST[..]),
            Some((id, "subscribe")) if m == Method::GET || m == Method::POST => {
                Ok(RestRoute::Subscribe(decode(id)))
            }
            Some((_, "subscribe")) => Err(&GET_POST[..]),
            Some(_) => return None,
            None if m == Method::GET => Ok(RestRoute::Get(decode(id))),
            None => Err(&GET[..]),
        },
        (["tasks", id, "pushNotificationConfigs"], m) => match *m {
            Method::POST => Ok(RestRoute::CreateConfig(decode(id))),
            Method::GET => Ok(RestRoute::ListConfigs(decode(id))),
            _ => Err(&GET_POST[..]),
        },
        (["tasks", id, "pushNotificationConfigs", config], m) => match *m {
            Method::GET => Ok(RestRoute::GetConfig(decode(id), decode(config))),
            Method::DELETE => Ok(RestRoute::DeleteConfig(decode(id), decode(config))),
            _ => Err(&DELETE_GET[..]),
        },
        _ => return None,
    };
    Some((tenant, route))
}

/// Serves one 0.3 route.
pub async fn serve(
    bindings: &HttpBindings,
    tenant: String,
    route: RestRoute,
    parts: http::request::Parts,
    body: Body,
) -> Response {
    let mut call = call_context(Binding::HttpJson, &parts);
    let mut record = bindings.observe_version(
        Binding::HttpJson,
        crate::metrics::V0_3,
        crate::metrics::operation_label(route.operation()),
    );
    let span = crate::telemetry::rpc_span(|| record.method(), "http-json", call.trace.as_ref());
    let answer = async {
        // Before the body: a caller without credentials costs no read.
        if let Err(e) = bindings.api().authenticate_headers(&mut call).await {
            return Err((None, e));
        }
        let bytes = if route.has_body() {
            match read_body(&parts, body).await {
                Ok(bytes) => bytes,
                Err(e) => return Err((Some(e.status()), e.into_error())),
            }
        } else {
            bytes::Bytes::new()
        };
        dispatch(bindings, &call, &tenant, route, &parts, &bytes)
            .await
            .map_err(|e| (None, e))
    }
    .instrument(span)
    .await;
    match answer {
        Ok(RestAnswer::Result(body)) => {
            record.end(None);
            let mut response = Response::new(Body::from(body));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            response
        }
        Ok(RestAnswer::Stream(events)) => stream(events, record, bindings.keepalive()),
        Err((status, err)) => {
            record.end(Some(&err));
            let mut response = http_json::error_response(&err);
            if let Some(status) = status {
                *response.status_mut() = status;
            }
            response
        }
    }
}

enum RestAnswer {
    Result(Vec<u8>),
    Stream(EventStream),
}

fn encoded<M: serde::Serialize>(message: &M) -> Result<RestAnswer, A2aError> {
    let mut out = Vec::with_capacity(256);
    json::write(message, &mut out).map_err(|e| A2aError::Internal(e.to_string()))?;
    Ok(RestAnswer::Result(out))
}

fn body<M: prost::Message + prost::Name + Default + serde::de::DeserializeOwned>(
    bytes: &[u8],
) -> Result<M, A2aError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(M::default());
    }
    json::from_request_slice(bytes).map_err(|e| A2aError::invalid("body", e.to_string()))
}

fn history_length(parts: &http::request::Parts) -> Result<Option<i32>, A2aError> {
    let Some(query) = parts.uri.query() else {
        return Ok(None);
    };
    for pair in query.split('&') {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if name == "historyLength" || name == "history_length" {
            let n: i32 = value.parse().map_err(|_| {
                A2aError::invalid("historyLength", format!("{value:?} is not a number"))
            })?;
            return Ok((n != 0).then_some(n));
        }
    }
    Ok(None)
}

async fn dispatch(
    bindings: &HttpBindings,
    call: &CallContext,
    tenant: &str,
    route: RestRoute,
    parts: &http::request::Parts,
    bytes: &[u8],
) -> Result<RestAnswer, A2aError> {
    let api = bindings.api();
    let call = &super::jsonrpc::call_for(api, call)?;
    let tenant = tenant.to_owned();
    match route {
        RestRoute::Send => {
            let request = pb::send_in(body(bytes)?, &tenant)?;
            encoded(&pb::send_response_out(
                api.send_message(call, request).await?,
            ))
        }
        RestRoute::Stream => {
            let request = pb::send_in(body(bytes)?, &tenant)?;
            Ok(RestAnswer::Stream(
                api.send_streaming_message(call, request).await?,
            ))
        }
        RestRoute::Get(id) => {
            let request = proto::GetTaskRequest {
                tenant,
                id,
                history_length: history_length(parts)?,
            };
            encoded(&pb::task_out(api.get_task(call, request).await?))
        }
        RestRoute::Cancel(id) => {
            let request = proto::CancelTaskRequest {
                tenant,
                id,
                metadata: None,
            };
            encoded(&pb::task_out(api.cancel_task(call, request).await?))
        }
        RestRoute::Subscribe(id) => {
            let request = proto::SubscribeToTaskRequest { tenant, id };
            Ok(RestAnswer::Stream(
                api.subscribe_to_task(call, request).await?,
            ))
        }
        RestRoute::CreateConfig(task_id) => {
            // The annotation's body is the config; the official 0.3
            // client sends the whole request (`{"parent", "configId",
            // "config"}`): both are read.
            let config = match body::<old::CreateTaskPushNotificationConfigRequest>(bytes) {
                Ok(request) if request.config.is_some() => {
                    let mut config = request.config.expect("checked");
                    if let Some(push) = &mut config.push_notification_config
                        && push.id.is_empty()
                    {
                        push.id = request.config_id;
                    }
                    config
                }
                _ => body::<old::TaskPushNotificationConfig>(bytes)?,
            };
            let push = config.push_notification_config.ok_or_else(|| {
                A2aError::invalid("pushNotificationConfig", "the config is required")
            })?;
            let config = pb::push_config_in(push, task_id, &tenant);
            encoded(&pb::push_config_out(
                api.create_task_push_notification_config(call, config)
                    .await?,
            ))
        }
        RestRoute::GetConfig(task_id, id) => {
            let request = proto::GetTaskPushNotificationConfigRequest {
                tenant,
                task_id,
                id,
            };
            encoded(&pb::push_config_out(
                api.get_task_push_notification_config(call, request).await?,
            ))
        }
        RestRoute::ListConfigs(task_id) => {
            let request = proto::ListTaskPushNotificationConfigsRequest {
                tenant,
                task_id,
                page_size: 0,
                page_token: String::new(),
            };
            let page = api
                .list_task_push_notification_configs(call, request)
                .await?;
            encoded(&old::ListTaskPushNotificationConfigResponse {
                configs: page.configs.into_iter().map(pb::push_config_out).collect(),
                next_page_token: page.next_page_token,
            })
        }
        RestRoute::DeleteConfig(task_id, id) => {
            let request = proto::DeleteTaskPushNotificationConfigRequest {
                tenant,
                task_id,
                id,
            };
            api.delete_task_push_notification_config(call, request)
                .await?;
            Ok(RestAnswer::Result(b"{}".to_vec()))
        }
        RestRoute::Card => {
            // 0.3's GetAgentCard answers the card in 0.3's JSON shape
            // (the official client validates it so): the extended card
            // with the 0.3 fields, as the public card carries them.
            let request = proto::GetExtendedAgentCardRequest {
                tenant: tenant.clone(),
            };
            let card = api.get_extended_agent_card(call, request).await?;
            let mut value = json::to_value(&card).map_err(|e| A2aError::Internal(e.to_string()))?;
            let interfaces = api.cards().v03_interfaces(&tenant);
            crate::discovery::v0_3::add_fields(&mut value, &card, &interfaces);
            serde_json::to_vec(&value)
                .map(RestAnswer::Result)
                .map_err(|e| A2aError::Internal(e.to_string()))
        }
    }
}

/// SSE of 0.3 `StreamResponse`s; an error ends it as `event: error`.
fn stream(
    events: EventStream,
    mut record: crate::service::web::CallRecord,
    keepalive: std::time::Duration,
) -> Response {
    let frames = async_stream::stream! {
        let mut events = events;
        let mut old = pb::PbStreamOut::default();
        while let Some(event) = events.next().await {
            let event = event.and_then(|event| {
                let event = old.event(event)?;
                let mut out = Vec::with_capacity(256);
                json::write(&event, &mut out).map_err(|e| A2aError::Internal(e.to_string()))?;
                Ok(out)
            });
            match event {
                Ok(json) => yield sse::frame(&json),
                Err(err) => {
                    record.end(Some(&err));
                    let status = crate::service::web::http_status(&err);
                    yield sse::named_frame("error", &http_json::error_json(&err, status));
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
    fn routes() {
        let get = |p| find(&Method::GET, p);
        let post = |p| find(&Method::POST, p);
        assert_eq!(
            post("/v1/message:send"),
            Some((String::new(), Ok(RestRoute::Send)))
        );
        assert_eq!(
            post("/deployer/v1/message:stream"),
            Some(("deployer".into(), Ok(RestRoute::Stream)))
        );
        assert_eq!(
            get("/v1/tasks/t1"),
            Some((String::new(), Ok(RestRoute::Get("t1".into()))))
        );
        assert_eq!(
            post("/v1/tasks/t1:cancel"),
            Some((String::new(), Ok(RestRoute::Cancel("t1".into()))))
        );
        assert_eq!(
            get("/v1/tasks/t1:subscribe"),
            Some((String::new(), Ok(RestRoute::Subscribe("t1".into()))))
        );
        assert_eq!(
            find(&Method::DELETE, "/v1/tasks/t/pushNotificationConfigs/c"),
            Some((
                String::new(),
                Ok(RestRoute::DeleteConfig("t".into(), "c".into()))
            ))
        );
        assert_eq!(
            get("/v1/message:send"),
            Some((String::new(), Err(&POST[..])))
        );
        assert_eq!(get("/message:send"), None);
        assert_eq!(get("/tasks/t1"), None);
        assert_eq!(get("/v1/nothing"), None);
    }
}
