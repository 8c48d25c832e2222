//! 0.3's protobuf types (`proto::v0_3`, what its HTTP+JSON routes and
//! gRPC service speak) <-> 1.0's. The same rules as the JSON-RPC shapes
//! (`convert`), on the 0.3 proto's names: `content` for a message's
//! parts, `update` for a status's message, `fileWithBytes` /
//! `fileWithUri`, `DataPart{data}`, resource names (`tasks/{id}`,
//! `tasks/{id}/pushNotificationConfigs/{config}`), `blocking` (absent is
//! false here: a proto3 bool has no presence, and the official 0.3
//! servers read it so).
//!
//! `fileWithBytes`: the official 0.3 SDKs put the UTF-8 of the base64
//! text in this `bytes` field (so ProtoJSON carries it base64 twice), and
//! read it back so. It is read as such when it is base64 text, and as
//! the bytes themselves otherwise; it is written as the SDKs read it.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use crate::error::A2aError;
use crate::proto::v0_3 as old;
use crate::proto::{self, part::Content};
use crate::wkt;

/// The task id of a resource name `tasks/{id}` (`field` names it in
/// errors).
pub fn task_id(name: &str, field: &str) -> Result<String, A2aError> {
    match name.strip_prefix("tasks/") {
        Some(id) if !id.is_empty() && !id.contains('/') => Ok(id.to_owned()),
        _ => Err(A2aError::invalid(
            field,
            format!("{name:?} is not a task's name, tasks/{{id}}"),
        )),
    }
}

/// The task and config ids of `tasks/{id}/pushNotificationConfigs/{config}`.
pub fn config_name(name: &str, field: &str) -> Result<(String, String), A2aError> {
    let bad = || {
        A2aError::invalid(
            field,
            format!(
                "{name:?} is not a config's name, tasks/{{id}}/pushNotificationConfigs/{{config}}"
            ),
        )
    };
    let rest = name.strip_prefix("tasks/").ok_or_else(bad)?;
    let (task, config) = rest
        .split_once("/pushNotificationConfigs/")
        .ok_or_else(bad)?;
    if task.is_empty() || config.is_empty() || task.contains('/') || config.contains('/') {
        return Err(bad());
    }
    Ok((task.to_owned(), config.to_owned()))
}

pub fn message_in(m: old::Message, field: &str) -> Result<proto::Message, A2aError> {
    let parts = m
        .content
        .into_iter()
        .enumerate()
        .map(|(i, p)| part_in(p, &format!("{field}.content[{i}]")))
        .collect::<Result<_, _>>()?;
    Ok(proto::Message {
        message_id: m.message_id,
        context_id: m.context_id,
        task_id: m.task_id,
        // The roles have the same numbers in both versions.
        role: m.role,
        parts,
        metadata: m.metadata,
        extensions: m.extensions,
        reference_task_ids: Vec::new(),
    })
}

fn part_in(p: old::Part, field: &str) -> Result<proto::Part, A2aError> {
    use old::file_part::File;
    use old::part::Part as P;
    let (content, media_type, filename) = match p.part {
        Some(P::Text(text)) => (Content::Text(text), String::new(), String::new()),
        Some(P::File(file)) => {
            let content = match file.file {
                Some(File::FileWithUri(uri)) => Content::Url(uri),
                Some(File::FileWithBytes(bytes)) => Content::Raw(sdk_bytes_in(bytes)),
                None => {
                    return Err(A2aError::invalid(
                        format!("{field}.file"),
                        "a file holds fileWithBytes or fileWithUri",
                    ));
                }
            };
            (content, file.mime_type, file.name)
        }
        Some(P::Data(data)) => (
            Content::Data(wkt::Value::from(data.data.unwrap_or_default())),
            String::new(),
            String::new(),
        ),
        None => {
            return Err(A2aError::invalid(
                field,
                "a part holds one of text, file and data",
            ));
        }
    };
    Ok(proto::Part {
        content: Some(content),
        metadata: p.metadata,
        filename,
        media_type,
    })
}

/// `fileWithBytes` as the official 0.3 SDKs write it: the base64 text's
/// bytes; anything that is not base64 text is taken as the content.
fn sdk_bytes_in(bytes: Vec<u8>) -> Vec<u8> {
    match std::str::from_utf8(&bytes)
        .ok()
        .map(|text| STANDARD.decode(text.trim()))
    {
        Some(Ok(decoded)) => decoded,
        _ => bytes,
    }
}

pub fn message_out(m: proto::Message) -> old::Message {
    old::Message {
        message_id: m.message_id,
        context_id: m.context_id,
        task_id: m.task_id,
        role: m.role,
        content: m.parts.into_iter().map(part_out).collect(),
        metadata: m.metadata,
        extensions: m.extensions,
    }
}

fn part_out(p: proto::Part) -> old::Part {
    use old::file_part::File;
    use old::part::Part as P;
    let file = |file| {
        P::File(old::FilePart {
            mime_type: p.media_type.clone(),
            name: p.filename.clone(),
            file: Some(file),
        })
    };
    let part = match p.content {
        Some(Content::Text(text)) => P::Text(text),
        Some(Content::Raw(raw)) => file(File::FileWithBytes(STANDARD.encode(raw).into_bytes())),
        Some(Content::Url(url)) => file(File::FileWithUri(url)),
        Some(Content::Data(value)) => P::Data(old::DataPart {
            data: Some(match value.kind {
                Some(wkt::value::Kind::StructValue(s)) => s,
                // 0.3's data is an object: another value is wrapped.
                other => wkt::Struct {
                    fields: [("value".to_owned(), wkt::Value { kind: other })].into(),
                },
            }),
        }),
        None => P::Text(String::new()),
    };
    old::Part {
        metadata: p.metadata,
        part: Some(part),
    }
}

fn status_out(s: proto::TaskStatus) -> old::TaskStatus {
    old::TaskStatus {
        // TASK_STATE_CANCELED (1.0) and TASK_STATE_CANCELLED (0.3) are
        // both 5: every state has the same number in both versions.
        state: s.state,
        update: s.message.map(message_out),
        timestamp: s.timestamp,
    }
}

fn artifact_out(a: proto::Artifact) -> old::Artifact {
    old::Artifact {
        artifact_id: a.artifact_id,
        name: a.name,
        description: a.description,
        parts: a.parts.into_iter().map(part_out).collect(),
        metadata: a.metadata,
        extensions: a.extensions,
    }
}

pub fn task_out(t: proto::Task) -> old::Task {
    old::Task {
        id: t.id,
        context_id: t.context_id,
        status: t.status.map(status_out),
        artifacts: t.artifacts.into_iter().map(artifact_out).collect(),
        history: t.history.into_iter().map(message_out).collect(),
        metadata: t.metadata,
    }
}

pub fn send_response_out(r: proto::SendMessageResponse) -> old::SendMessageResponse {
    use old::send_message_response::Payload as O;
    use proto::send_message_response::Payload as P;
    old::SendMessageResponse {
        payload: r.payload.map(|p| match p {
            P::Task(t) => O::Task(task_out(t)),
            P::Message(m) => O::Msg(message_out(m)),
        }),
    }
}

/// One stream's events in 0.3 form (see `convert::StreamOut`: one Task,
/// first; `final` where a 1.0 stream ends).
#[derive(Default)]
pub struct PbStreamOut(super::convert::StreamOut);

impl PbStreamOut {
    pub fn event(&mut self, e: proto::StreamResponse) -> Result<old::StreamResponse, A2aError> {
        use old::stream_response::Payload as O;
        use proto::stream_response::Payload as P;
        let first_task = matches!(e.payload, Some(P::Task(_))) && !self.0.task_sent();
        let payload = match e.payload {
            Some(P::Task(t)) if first_task => {
                self.0.mark_task_sent();
                O::Task(task_out(t))
            }
            Some(P::Task(t)) => {
                let status = t.status.unwrap_or_default();
                O::StatusUpdate(old::TaskStatusUpdateEvent {
                    task_id: t.id,
                    context_id: t.context_id,
                    r#final: super::convert::ends_stream(status.state),
                    status: Some(status_out(status)),
                    metadata: None,
                })
            }
            Some(P::Message(m)) => O::Msg(message_out(m)),
            Some(P::StatusUpdate(u)) => {
                let status = u.status.unwrap_or_default();
                O::StatusUpdate(old::TaskStatusUpdateEvent {
                    task_id: u.task_id,
                    context_id: u.context_id,
                    r#final: super::convert::ends_stream(status.state),
                    status: Some(status_out(status)),
                    metadata: u.metadata,
                })
            }
            Some(P::ArtifactUpdate(u)) => O::ArtifactUpdate(old::TaskArtifactUpdateEvent {
                task_id: u.task_id,
                context_id: u.context_id,
                artifact: u.artifact.map(artifact_out),
                append: u.append,
                last_chunk: u.last_chunk,
                metadata: u.metadata,
            }),
            None => return Err(A2aError::Internal("an empty stream event".into())),
        };
        Ok(old::StreamResponse {
            payload: Some(payload),
        })
    }
}

pub fn send_in(
    r: old::SendMessageRequest,
    tenant: &str,
) -> Result<proto::SendMessageRequest, A2aError> {
    let message = r
        .request
        .ok_or_else(|| A2aError::invalid("message", "the message to send is required"))?;
    Ok(proto::SendMessageRequest {
        tenant: tenant.to_owned(),
        message: Some(message_in(message, "message")?),
        // No configuration is `blocking: false` too (a proto3 bool).
        configuration: Some(r.configuration.unwrap_or_default()).map(|c| {
            proto::SendMessageConfiguration {
                accepted_output_modes: c.accepted_output_modes,
                task_push_notification_config: c
                    .push_notification
                    .map(|push| push_config_in(push, String::new(), tenant)),
                history_length: (c.history_length != 0).then_some(c.history_length),
                return_immediately: !c.blocking,
            }
        }),
        metadata: r.metadata,
    })
}

pub fn push_config_in(
    c: old::PushNotificationConfig,
    task_id: String,
    tenant: &str,
) -> proto::TaskPushNotificationConfig {
    proto::TaskPushNotificationConfig {
        tenant: tenant.to_owned(),
        id: if c.id.is_empty() {
            task_id.clone()
        } else {
            c.id
        },
        task_id,
        url: c.url,
        token: c.token,
        authentication: c.authentication.map(|a| proto::AuthenticationInfo {
            scheme: a.schemes.into_iter().next().unwrap_or_default(),
            credentials: a.credentials,
        }),
    }
}

pub fn push_config_out(c: proto::TaskPushNotificationConfig) -> old::TaskPushNotificationConfig {
    old::TaskPushNotificationConfig {
        name: format!("tasks/{}/pushNotificationConfigs/{}", c.task_id, c.id),
        push_notification_config: Some(old::PushNotificationConfig {
            id: c.id,
            url: c.url,
            token: c.token,
            authentication: c.authentication.map(|a| old::AuthenticationInfo {
                schemes: vec![a.scheme],
                credentials: a.credentials,
            }),
        }),
    }
}

/// A message of 1.0 as the 0.3 message with the same wire form (the card's
/// skills, schemes, provider, extensions, signatures: 1.0 only added
/// fields, which 0.3's decoding skips).
fn same_wire<A: prost::Message, B: prost::Message + Default>(a: &A) -> B {
    // Cannot fail: the two share every 0.3 field's number and type.
    B::decode(a.encode_to_vec().as_slice()).unwrap_or_default()
}

/// A 1.0 card as 0.3's proto `AgentCard`: `url` and `preferredTransport`
/// from the first of the 0.3 `interfaces` served (URL, 0.3 transport
/// name), all of them as `additionalInterfaces`, as the card document's
/// 0.3 fields (`discovery::v0_3`).
pub fn card_out(card: &proto::AgentCard, interfaces: &[(String, &str)]) -> old::AgentCard {
    let capabilities = card.capabilities.clone().unwrap_or_default();
    let (url, preferred) = interfaces
        .first()
        .map(|(url, transport)| (url.clone(), (*transport).to_owned()))
        .unwrap_or_default();
    old::AgentCard {
        protocol_version: crate::discovery::v0_3::PROTOCOL_VERSION.into(),
        name: card.name.clone(),
        description: card.description.clone(),
        url,
        preferred_transport: preferred,
        additional_interfaces: interfaces
            .iter()
            .map(|(url, transport)| old::AgentInterface {
                url: url.clone(),
                transport: (*transport).to_owned(),
            })
            .collect(),
        provider: card.provider.as_ref().map(same_wire),
        version: card.version.clone(),
        documentation_url: card.documentation_url.clone().unwrap_or_default(),
        capabilities: Some(old::AgentCapabilities {
            streaming: capabilities.streaming.unwrap_or(false),
            push_notifications: capabilities.push_notifications.unwrap_or(false),
            extensions: capabilities.extensions.iter().map(same_wire).collect(),
        }),
        security_schemes: card
            .security_schemes
            .iter()
            .map(|(name, scheme)| (name.clone(), same_wire(scheme)))
            .collect(),
        security: card.security_requirements.iter().map(same_wire).collect(),
        default_input_modes: card.default_input_modes.clone(),
        default_output_modes: card.default_output_modes.clone(),
        skills: card.skills.iter().map(same_wire).collect(),
        supports_authenticated_extended_card: capabilities.extended_agent_card.unwrap_or(false),
        signatures: card.signatures.iter().map(same_wire).collect(),
        icon_url: card.icon_url.clone().unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_parsed_strictly() {
        assert_eq!(task_id("tasks/t1", "name").unwrap(), "t1");
        for bad in ["t1", "tasks/", "tasks/a/b", "task/t1"] {
            assert!(task_id(bad, "name").is_err(), "{bad}");
        }
        assert_eq!(
            config_name("tasks/t/pushNotificationConfigs/c", "name").unwrap(),
            ("t".into(), "c".into())
        );
        assert!(config_name("tasks/t/pushNotificationConfigs/", "name").is_err());
    }

    #[test]
    fn file_bytes_as_the_official_sdks_write_them() {
        let part = old::Part {
            metadata: None,
            part: Some(old::part::Part::File(old::FilePart {
                mime_type: "text/plain".into(),
                name: "a.txt".into(),
                file: Some(old::file_part::File::FileWithBytes(b"aGVsbG8=".to_vec())),
            })),
        };
        let v1 = part_in(part.clone(), "p").unwrap();
        assert_eq!(v1.content, Some(Content::Raw(b"hello".to_vec())));
        assert_eq!(part_out(v1), part);
        // Not base64 text: the bytes themselves.
        assert_eq!(sdk_bytes_in(vec![0xff, 0x00]), vec![0xff, 0x00]);
    }
}
