//! 0.3 <-> 1.0: requests in, answers, events and errors out.
//!
//! What has no counterpart is handled so that nothing a 0.3 client sent
//! is lost on the way in:
//! - roles `user` / `agent`; any other role is refused on `role`;
//! - parts: `text`; `file` with `bytes` (base64) becomes a raw part,
//!   with `uri` a url part (`mimeType` and `name` become `mediaType` and
//!   `filename`); `data` a data part; a part's `kind`, when given, must
//!   name what it holds;
//! - states by their 0.3 names (`input-required`, `canceled`); 1.0's
//!   UNSPECIFIED is 0.3's `unknown`;
//! - `configuration.blocking: false` is 1.0's `returnImmediately`;
//!   absent, the send blocks (0.3's default, and 1.0's);
//!   `historyLength` 0 is 0.3's "no limit" and is left unset;
//! - a status update is `final` when its state is terminal or
//!   interrupted: the states at which a 1.0 stream ends (spec §3.1.2);
//! - push configs: 0.3 nests `pushNotificationConfig` under `taskId`;
//!   `authentication.schemes` (a list) is 1.0's one `scheme`, the first;
//!   a config without an `id` takes the task's id, as 0.3 servers did.

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE};

use super::types as v03;
use crate::error::A2aError;
use crate::lifecycle::{StateClass, classify, parse_state_name, v03_state_name};
use crate::proto::{
    self, AuthenticationInfo, Role, SendMessageConfiguration, TaskState, part::Content,
    stream_response::Payload,
};

/// A 0.3 message as the 1.0 message; `field` names it in errors.
pub fn message_in(m: v03::Message, field: &str) -> Result<proto::Message, A2aError> {
    let role = match m.role.as_str() {
        "user" => Role::User,
        "agent" => Role::Agent,
        other => {
            return Err(A2aError::invalid(
                format!("{field}.role"),
                format!("{other:?} is not a 0.3 role: \"user\" or \"agent\""),
            ));
        }
    };
    if m.kind != "message" {
        return Err(A2aError::invalid(
            format!("{field}.kind"),
            format!("{:?} is not \"message\"", m.kind),
        ));
    }
    let parts = m
        .parts
        .into_iter()
        .enumerate()
        .map(|(i, p)| part_in(p, &format!("{field}.parts[{i}]")))
        .collect::<Result<_, _>>()?;
    Ok(proto::Message {
        message_id: m.message_id,
        context_id: m.context_id.unwrap_or_default(),
        task_id: m.task_id.unwrap_or_default(),
        role: role as i32,
        parts,
        metadata: m.metadata,
        extensions: m.extensions,
        reference_task_ids: m.reference_task_ids,
    })
}

fn part_in(p: v03::Part, field: &str) -> Result<proto::Part, A2aError> {
    let given = [p.text.is_some(), p.file.is_some(), p.data.is_some()]
        .iter()
        .filter(|g| **g)
        .count();
    if given != 1 {
        return Err(A2aError::invalid(
            field,
            "a 0.3 part holds exactly one of text, file and data",
        ));
    }
    let (kind, content, media_type, filename) = if let Some(text) = p.text {
        ("text", Content::Text(text), String::new(), String::new())
    } else if let Some(file) = p.file {
        let content = match (file.bytes, file.uri) {
            (Some(bytes), None) => {
                let raw = STANDARD
                    .decode(bytes.trim())
                    .or_else(|_| URL_SAFE.decode(bytes.trim()))
                    .map_err(|e| {
                        A2aError::invalid(format!("{field}.file.bytes"), format!("not base64: {e}"))
                    })?;
                Content::Raw(raw)
            }
            (None, Some(uri)) => Content::Url(uri),
            _ => {
                return Err(A2aError::invalid(
                    format!("{field}.file"),
                    "a 0.3 file holds exactly one of bytes and uri",
                ));
            }
        };
        (
            "file",
            content,
            file.mime_type.unwrap_or_default(),
            file.name.unwrap_or_default(),
        )
    } else {
        let data = p.data.expect("one content is given");
        ("data", Content::Data(data), String::new(), String::new())
    };
    if let Some(declared) = &p.kind
        && declared != kind
    {
        return Err(A2aError::invalid(
            format!("{field}.kind"),
            format!("{declared:?} does not name a {kind} part"),
        ));
    }
    Ok(proto::Part {
        content: Some(content),
        metadata: p.metadata,
        filename,
        media_type,
    })
}

/// A 1.0 message in 0.3 form.
pub fn message_out(m: proto::Message) -> v03::Message {
    let role = if m.role == Role::User as i32 {
        "user"
    } else {
        "agent"
    };
    v03::Message {
        kind: "message".into(),
        role: role.into(),
        parts: m.parts.into_iter().map(part_out).collect(),
        message_id: m.message_id,
        task_id: non_empty(m.task_id),
        context_id: non_empty(m.context_id),
        reference_task_ids: m.reference_task_ids,
        extensions: m.extensions,
        metadata: m.metadata,
    }
}

fn part_out(p: proto::Part) -> v03::Part {
    let mut out = v03::Part {
        metadata: p.metadata,
        ..Default::default()
    };
    let file = |bytes, uri| v03::FileContent {
        bytes,
        uri,
        mime_type: non_empty(p.media_type.clone()),
        name: non_empty(p.filename.clone()),
    };
    match p.content {
        Some(Content::Text(text)) => {
            out.kind = Some("text".into());
            out.text = Some(text);
        }
        Some(Content::Raw(raw)) => {
            out.kind = Some("file".into());
            out.file = Some(file(Some(STANDARD.encode(raw)), None));
        }
        Some(Content::Url(url)) => {
            out.kind = Some("file".into());
            out.file = Some(file(None, Some(url)));
        }
        Some(Content::Data(data)) => {
            out.kind = Some("data".into());
            out.data = Some(data);
        }
        // Validation admits no empty part; an empty text is the nearest.
        None => {
            out.kind = Some("text".into());
            out.text = Some(String::new());
        }
    }
    out
}

fn non_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

fn state_of(value: i32) -> TaskState {
    TaskState::try_from(value).unwrap_or(TaskState::Unspecified)
}

fn status_out(s: proto::TaskStatus) -> v03::TaskStatus {
    v03::TaskStatus {
        state: v03_state_name(state_of(s.state)).into(),
        message: s.message.map(message_out),
        timestamp: s.timestamp.map(|t| t.to_string()),
    }
}

fn artifact_out(a: proto::Artifact) -> v03::Artifact {
    v03::Artifact {
        artifact_id: a.artifact_id,
        name: non_empty(a.name),
        description: non_empty(a.description),
        parts: a.parts.into_iter().map(part_out).collect(),
        metadata: a.metadata,
        extensions: a.extensions,
    }
}

/// A 1.0 task in 0.3 form.
pub fn task_out(t: proto::Task) -> v03::Task {
    v03::Task {
        kind: "task".into(),
        id: t.id,
        context_id: t.context_id,
        status: status_out(t.status.unwrap_or_default()),
        history: t.history.into_iter().map(message_out).collect(),
        artifacts: t.artifacts.into_iter().map(artifact_out).collect(),
        metadata: t.metadata,
    }
}

/// Whether a 1.0 stream ends at this state (terminal or interrupted).
pub(super) fn ends_stream(state: i32) -> bool {
    matches!(
        classify(state_of(state)),
        Ok(StateClass::Terminal | StateClass::Interrupted)
    )
}

/// A 1.0 send answer in 0.3 form: the task or the message.
pub fn send_response_out(r: proto::SendMessageResponse) -> Result<v03::Event, A2aError> {
    use proto::send_message_response::Payload as P;
    match r.payload {
        Some(P::Task(t)) => Ok(v03::Event::Task(task_out(t))),
        Some(P::Message(m)) => Ok(v03::Event::Message(message_out(m))),
        None => Err(A2aError::Internal("a send answered nothing".into())),
    }
}

/// Translates one stream's events: the first task as a Task, any later
/// task snapshot (a subscriber resynchronised after falling behind) as
/// the status update it amounts to, since a 0.3 client accepts one Task
/// per stream, first.
#[derive(Default)]
pub struct StreamOut {
    task_sent: bool,
}

impl StreamOut {
    pub(super) fn task_sent(&self) -> bool {
        self.task_sent
    }

    pub(super) fn mark_task_sent(&mut self) {
        self.task_sent = true;
    }

    pub fn event(&mut self, e: proto::StreamResponse) -> Result<v03::Event, A2aError> {
        match e.payload {
            Some(Payload::Task(t)) if !self.task_sent => {
                self.task_sent = true;
                Ok(v03::Event::Task(task_out(t)))
            }
            Some(Payload::Task(t)) => {
                let status = t.status.unwrap_or_default();
                Ok(v03::Event::StatusUpdate(v03::StatusUpdateEvent {
                    kind: "status-update",
                    is_final: ends_stream(status.state),
                    task_id: t.id,
                    context_id: t.context_id,
                    status: status_out(status),
                    metadata: None,
                }))
            }
            Some(Payload::Message(m)) => Ok(v03::Event::Message(message_out(m))),
            Some(Payload::StatusUpdate(u)) => {
                let status = u.status.unwrap_or_default();
                Ok(v03::Event::StatusUpdate(v03::StatusUpdateEvent {
                    kind: "status-update",
                    is_final: ends_stream(status.state),
                    task_id: u.task_id,
                    context_id: u.context_id,
                    status: status_out(status),
                    metadata: u.metadata,
                }))
            }
            Some(Payload::ArtifactUpdate(u)) => {
                Ok(v03::Event::ArtifactUpdate(v03::ArtifactUpdateEvent {
                    kind: "artifact-update",
                    task_id: u.task_id,
                    context_id: u.context_id,
                    artifact: artifact_out(u.artifact.unwrap_or_default()),
                    append: u.append,
                    last_chunk: u.last_chunk,
                    metadata: u.metadata,
                }))
            }
            None => Err(A2aError::Internal("an empty stream event".into())),
        }
    }
}

/// A 0.3 push notification's body: the task, as 0.3 servers POST it
/// (its outbox entry is the task written, see
/// `runtime::live::outbox_entries`); any other event as its 0.3 form.
pub fn push_body(event: proto::StreamResponse) -> Result<String, A2aError> {
    let event = StreamOut::default().event(event)?;
    serde_json::to_string(&event).map_err(|e| A2aError::Internal(e.to_string()))
}

/// `MessageSendParams` as the 1.0 `SendMessageRequest`.
pub fn send_in(
    p: v03::MessageSendParams,
    tenant: &str,
) -> Result<proto::SendMessageRequest, A2aError> {
    let configuration = p
        .configuration
        .map(|c| -> Result<_, A2aError> {
            Ok(SendMessageConfiguration {
                accepted_output_modes: c.accepted_output_modes,
                task_push_notification_config: c
                    .push_notification_config
                    .map(|push| push_config_in(push, String::new(), tenant)),
                history_length: c.history_length.filter(|n| *n != 0),
                return_immediately: c.blocking == Some(false),
            })
        })
        .transpose()?;
    Ok(proto::SendMessageRequest {
        tenant: tenant.to_owned(),
        message: Some(message_in(p.message, "message")?),
        configuration,
        metadata: p.metadata,
    })
}

/// A 0.3 push config of `task_id` as the 1.0 config.
pub fn push_config_in(
    c: v03::PushConfig,
    task_id: String,
    tenant: &str,
) -> proto::TaskPushNotificationConfig {
    proto::TaskPushNotificationConfig {
        tenant: tenant.to_owned(),
        id: c.id.unwrap_or_else(|| task_id.clone()),
        task_id,
        url: c.url,
        token: c.token.unwrap_or_default(),
        authentication: c.authentication.map(|a| AuthenticationInfo {
            scheme: a.schemes.into_iter().next().unwrap_or_default(),
            credentials: a.credentials.unwrap_or_default(),
        }),
    }
}

/// A 1.0 push config in 0.3 form.
pub fn push_config_out(c: proto::TaskPushNotificationConfig) -> v03::TaskPushConfig {
    v03::TaskPushConfig {
        task_id: c.task_id,
        push_notification_config: v03::PushConfig {
            id: non_empty(c.id),
            url: c.url,
            token: non_empty(c.token),
            authentication: c.authentication.map(|a| v03::PushAuthentication {
                schemes: vec![a.scheme],
                credentials: non_empty(a.credentials),
            }),
        },
    }
}

/// A state filter's 0.3 or 1.0 name as the state (for callers that take
/// names from 0.3 clients).
pub fn state_in(name: &str, field: &str) -> Result<TaskState, A2aError> {
    parse_state_name(name).map_err(|e| A2aError::invalid(field, e.to_string()))
}

/// The 0.3 JSON-RPC code of an error: 0.3 has the codes -32001..-32007;
/// what 1.0 added (-32008 ExtensionSupportRequired, -32009
/// VersionNotSupported) is -32603 there, as the official SDK answers it,
/// with the ErrorInfo reason telling them apart.
pub fn code(err: &A2aError) -> i64 {
    match super::super::jsonrpc::code(err) {
        -32008 | -32009 => super::super::jsonrpc::INTERNAL_ERROR,
        code => code,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(parts: serde_json::Value) -> v03::Message {
        serde_json::from_value(serde_json::json!({
            "messageId": "m", "role": "user", "parts": parts
        }))
        .unwrap()
    }

    #[test]
    fn parts_round_trip_through_1_0() {
        let parts = serde_json::json!([
            {"kind": "text", "text": "hi"},
            {"kind": "file", "file": {"bytes": "aGVsbG8=", "mimeType": "text/plain", "name": "a.txt"}},
            {"kind": "file", "file": {"uri": "https://x.test/f"}},
            {"kind": "data", "data": {"k": 1}}
        ]);
        let v1 = message_in(msg(parts.clone()), "message").unwrap();
        assert_eq!(v1.role, Role::User as i32);
        assert_eq!(v1.parts[1].content, Some(Content::Raw(b"hello".to_vec())));
        assert_eq!(v1.parts[1].filename, "a.txt");
        let back = serde_json::to_value(message_out(v1)).unwrap();
        assert_eq!(back["parts"], parts);
        assert_eq!(back["kind"], "message");
    }

    #[test]
    fn bad_parts_name_their_field() {
        for (parts, field) in [
            (serde_json::json!([{"kind": "text"}]), "message.parts[0]"),
            (
                serde_json::json!([{"kind": "data", "text": "x"}]),
                "message.parts[0].kind",
            ),
            (
                serde_json::json!([{"file": {"bytes": "%%%"}}]),
                "message.parts[0].file.bytes",
            ),
            (serde_json::json!([{"file": {}}]), "message.parts[0].file"),
        ] {
            let err = message_in(msg(parts), "message").unwrap_err();
            assert_eq!(err.field_violations()[0].field, field);
        }
    }

    #[test]
    fn final_marks_the_states_a_stream_ends_at() {
        for (state, expected) in [
            (TaskState::Working, false),
            (TaskState::Submitted, false),
            (TaskState::InputRequired, true),
            (TaskState::AuthRequired, true),
            (TaskState::Completed, true),
            (TaskState::Canceled, true),
        ] {
            assert_eq!(ends_stream(state as i32), expected, "{state:?}");
        }
    }
}
