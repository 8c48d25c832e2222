//! The 0.3 JSON-RPC methods (A2A 0.3 §7), on the 1.0 endpoint: each
//! reads its 0.3 params, calls the 1.0 operation, and answers in 0.3
//! form. The envelope, batches, HTTP statuses and SSE framing are the
//! JSON-RPC binding's own (`service::jsonrpc`).
//!
//! The version (spec §3.6.2): a 0.3 client sends no `A2A-Version`, and
//! an empty one means 0.3; a request naming another version than 0.3
//! for a 0.3 method is VersionNotSupported. The core then serves the
//! call as the 1.0 operation it became.

use serde::de::DeserializeOwned;

use super::convert;
use super::types as v03;
use crate::error::A2aError;
use crate::proto;
use crate::service::jsonrpc::RpcAnswer;
use crate::service::{A2aApi, CallContext};

/// The 0.3 methods and the 1.0 operation each becomes (its metrics and
/// span name).
const METHODS: [(&str, &str); 10] = [
    ("message/send", "SendMessage"),
    ("message/stream", "SendStreamingMessage"),
    ("tasks/get", "GetTask"),
    ("tasks/cancel", "CancelTask"),
    ("tasks/resubscribe", "SubscribeToTask"),
    (
        "tasks/pushNotificationConfig/set",
        "CreateTaskPushNotificationConfig",
    ),
    (
        "tasks/pushNotificationConfig/get",
        "GetTaskPushNotificationConfig",
    ),
    (
        "tasks/pushNotificationConfig/list",
        "ListTaskPushNotificationConfigs",
    ),
    (
        "tasks/pushNotificationConfig/delete",
        "DeleteTaskPushNotificationConfig",
    ),
    ("agent/getAuthenticatedExtendedCard", "GetExtendedAgentCard"),
];

/// The 1.0 operation a 0.3 method becomes; `None`: not a 0.3 method.
pub fn operation(method: &str) -> Option<&'static str> {
    METHODS
        .iter()
        .find(|(m, _)| *m == method)
        .map(|(_, op)| *op)
}

/// Whether the method answers with an event stream.
pub fn streaming(method: &str) -> bool {
    matches!(method, "message/stream" | "tasks/resubscribe")
}

/// Spec §3.6.2 for a 0.3 call on any binding: refused when 0.3 is not
/// served (`--no-v0-3`); else no version, an empty one or 0.3 (any patch)
/// is served, and the call goes to the core as a 1.0 call.
pub fn call_for(api: &A2aApi, call: &CallContext) -> Result<CallContext, A2aError> {
    if !api.cards().serves_v0_3() {
        return Err(A2aError::VersionNotSupported {
            requested: "0.3".into(),
        });
    }
    match call.params.version.as_deref() {
        None | Some("") => {}
        Some(v) if v == "0.3" || v.strip_prefix("0.3.").is_some() => {}
        Some(v) => {
            return Err(A2aError::VersionNotSupported {
                requested: v.to_owned(),
            });
        }
    }
    let mut call = call.clone();
    call.params.version = None;
    call.protocol = crate::lifecycle::Protocol::V0_3;
    Ok(call)
}

fn params<T: DeserializeOwned>(raw: Option<&str>) -> Result<T, A2aError> {
    serde_json::from_str(raw.unwrap_or("{}"))
        .map_err(|e| A2aError::invalid("params", format!("not the method's 0.3 params: {e}")))
}

fn result<T: serde::Serialize>(value: &T) -> RpcAnswer {
    match serde_json::to_vec(value) {
        Ok(bytes) => RpcAnswer::Result(bytes),
        Err(e) => RpcAnswer::Error(A2aError::Internal(e.to_string())),
    }
}

/// Serves the 0.3 `method` (one [`operation`] names).
pub(crate) async fn dispatch(
    api: &A2aApi,
    call: &CallContext,
    tenant: &str,
    method: &str,
    raw: Option<&str>,
) -> RpcAnswer {
    match serve(api, call, tenant, method, raw).await {
        Ok(answer) => answer,
        Err(err) => RpcAnswer::Error(err),
    }
}

async fn serve(
    api: &A2aApi,
    call: &CallContext,
    tenant: &str,
    method: &str,
    raw: Option<&str>,
) -> Result<RpcAnswer, A2aError> {
    let call = &call_for(api, call)?;
    let tenant = tenant.to_owned();
    Ok(match method {
        "message/send" => {
            let request = convert::send_in(params(raw)?, &tenant)?;
            let answer = api.send_message(call, request).await?;
            result(&convert::send_response_out(answer)?)
        }
        "message/stream" => {
            let request = convert::send_in(params(raw)?, &tenant)?;
            RpcAnswer::Stream03(api.send_streaming_message(call, request).await?)
        }
        "tasks/get" => {
            let p: v03::TaskParams = params(raw)?;
            let request = proto::GetTaskRequest {
                tenant,
                id: p.id,
                history_length: p.history_length.filter(|n| *n != 0),
            };
            result(&convert::task_out(api.get_task(call, request).await?))
        }
        "tasks/cancel" => {
            let p: v03::TaskParams = params(raw)?;
            let request = proto::CancelTaskRequest {
                tenant,
                id: p.id,
                metadata: p.metadata,
            };
            result(&convert::task_out(api.cancel_task(call, request).await?))
        }
        "tasks/resubscribe" => {
            let p: v03::TaskParams = params(raw)?;
            let request = proto::SubscribeToTaskRequest { tenant, id: p.id };
            RpcAnswer::Stream03(api.subscribe_to_task(call, request).await?)
        }
        "tasks/pushNotificationConfig/set" => {
            let p: v03::TaskPushConfig = params(raw)?;
            let config = convert::push_config_in(p.push_notification_config, p.task_id, &tenant);
            let made = api
                .create_task_push_notification_config(call, config)
                .await?;
            result(&convert::push_config_out(made))
        }
        "tasks/pushNotificationConfig/get" => {
            let p: v03::PushConfigParams = params(raw)?;
            let config = match p.push_notification_config_id {
                Some(id) => {
                    let request = proto::GetTaskPushNotificationConfigRequest {
                        tenant,
                        task_id: p.id,
                        id,
                    };
                    api.get_task_push_notification_config(call, request).await?
                }
                // 0.3 lets the config id be left out: the task's first
                // config, as 0.3 servers answered.
                None => {
                    let request = proto::ListTaskPushNotificationConfigsRequest {
                        tenant,
                        task_id: p.id.clone(),
                        page_size: 1,
                        page_token: String::new(),
                    };
                    api.list_task_push_notification_configs(call, request)
                        .await?
                        .configs
                        .into_iter()
                        .next()
                        .ok_or(A2aError::PushConfigNotFound {
                            task_id: p.id,
                            config_id: String::new(),
                        })?
                }
            };
            result(&convert::push_config_out(config))
        }
        "tasks/pushNotificationConfig/list" => {
            let p: v03::PushConfigParams = params(raw)?;
            let mut all = Vec::new();
            let mut page_token = String::new();
            // 0.3's list has no pages: every config, page by page.
            loop {
                let request = proto::ListTaskPushNotificationConfigsRequest {
                    tenant: tenant.clone(),
                    task_id: p.id.clone(),
                    page_size: 0,
                    page_token,
                };
                let page = api
                    .list_task_push_notification_configs(call, request)
                    .await?;
                all.extend(page.configs.into_iter().map(convert::push_config_out));
                if page.next_page_token.is_empty() {
                    break;
                }
                page_token = page.next_page_token;
            }
            result(&all)
        }
        "tasks/pushNotificationConfig/delete" => {
            let p: v03::PushConfigParams = params(raw)?;
            let Some(id) = p.push_notification_config_id else {
                return Err(A2aError::invalid(
                    "params.pushNotificationConfigId",
                    "the config to delete is required",
                ));
            };
            let request = proto::DeleteTaskPushNotificationConfigRequest {
                tenant,
                task_id: p.id,
                id,
            };
            api.delete_task_push_notification_config(call, request)
                .await?;
            RpcAnswer::Result(b"null".to_vec())
        }
        "agent/getAuthenticatedExtendedCard" => {
            // The 0.3 client validates the answer as a 0.3 card: the
            // extended card with the 0.3 fields, as the public one has.
            let request = proto::GetExtendedAgentCardRequest {
                tenant: tenant.clone(),
            };
            let card = api.get_extended_agent_card(call, request).await?;
            let mut value =
                crate::json::to_value(&card).map_err(|e| A2aError::Internal(e.to_string()))?;
            let interfaces = api.cards().v03_interfaces(&tenant);
            crate::discovery::v0_3::add_fields(&mut value, &card, &interfaces);
            result(&value)
        }
        other => {
            return Err(A2aError::MethodNotFound {
                method: other.to_owned(),
            });
        }
    })
}
