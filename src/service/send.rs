//! SendMessage (spec §3.1.1, §3.2.2) and SendStreamingMessage (§3.1.2).

use super::{EventStream, validate};
use crate::error::A2aError;
use crate::proto::{
    SendMessageRequest, SendMessageResponse, StreamResponse, send_message_response, stream_response,
};
use crate::push::egress::Egress;
use crate::runtime::stream::CloseAt;
use crate::runtime::{SendOutcome, TaskManager};
use crate::store::Caller;

/// A send's push notification config: PUSH_NOTIFICATION_NOT_SUPPORTED
/// when push is off; else checked like CreateTaskPushNotificationConfig's
/// (spec §3.2.1), for the message's task or the one it creates.
async fn checked(
    manager: &TaskManager,
    caller: &Caller,
    mut req: validate::SendRequest,
    push: Option<&Egress>,
) -> Result<validate::SendRequest, A2aError> {
    let Some(mut config) = req.request.push_config.take() else {
        return Ok(req);
    };
    let egress = push.ok_or(A2aError::PushNotificationNotSupported)?;
    config.tenant = req.tenant.clone();
    config.task_id = req.request.message.task_id.clone();
    // A follow-up's task first, as CreateTaskPushNotificationConfig's
    // (`push::create`).
    if !config.task_id.is_empty() {
        manager
            .check_visible(&config.tenant, caller, &config.task_id)
            .await?;
    }
    req.request.push_config = Some(super::push::checked(egress, config, false).await?);
    Ok(req)
}

/// Blocking by default: returns once the task is terminal or interrupted
/// (UNAVAILABLE when it cannot get there: shutdown, a failed write); with
/// `return_immediately`, returns the task as soon as it exists, or for a
/// follow-up as soon as the message is in its history.
pub async fn send_message(
    manager: &TaskManager,
    caller: &Caller,
    push: Option<&Egress>,
    call: &super::CallContext,
    request: SendMessageRequest,
) -> Result<SendMessageResponse, A2aError> {
    let mut req = checked(manager, caller, validate::send_request(request)?, push).await?;
    req.request.trace = call.trace;
    req.request.protocol = call.protocol;
    let outcome = manager
        .send_message(&req.tenant, caller, req.request, req.history, false)
        .await?;
    let payload = match outcome {
        SendOutcome::Message(m) => send_message_response::Payload::Message(m),
        SendOutcome::Task(handle) if req.return_immediately => {
            send_message_response::Payload::Task(handle.snapshot)
        }
        SendOutcome::Task(handle) => {
            send_message_response::Payload::Task(manager.wait(*handle).await?)
        }
    };
    Ok(SendMessageResponse {
        payload: Some(payload),
    })
}

/// A Message reply is a one-message stream; a task streams its snapshot,
/// then its events, and closes at a terminal state or INPUT_REQUIRED.
pub async fn send_streaming_message(
    manager: &TaskManager,
    caller: &Caller,
    push: Option<&Egress>,
    call: &super::CallContext,
    request: SendMessageRequest,
) -> Result<EventStream, A2aError> {
    let mut req = checked(manager, caller, validate::send_request(request)?, push).await?;
    req.request.trace = call.trace;
    req.request.protocol = call.protocol;
    let outcome = manager
        .send_message(&req.tenant, caller, req.request, req.history, true)
        .await?;
    let stream: EventStream = match outcome {
        SendOutcome::Message(m) => Box::pin(futures_util::stream::once(async move {
            Ok(StreamResponse {
                payload: Some(stream_response::Payload::Message(m)),
            })
        })),
        SendOutcome::Task(handle) => {
            Box::pin(manager.event_stream(*handle, CloseAt::TerminalOrInputRequired))
        }
    };
    Ok(stream)
}
