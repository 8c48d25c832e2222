//! ProtoJSON (spec §5.5) for every JSON the project reads or writes.
//!
//! The codec is generated: `build.rs` has pbjson-build write serde impls
//! for every `lf.a2a.v1` message from the same descriptors the prost
//! types come from, so field names (camelCase `json_name`), enum names,
//! 64-bit integers as strings, bytes as base64, proto3 `optional`
//! presence and `oneof`s follow the protobuf JSON mapping without
//! hand-written JSON, and a message is written straight from its struct
//! (no transcoding on the request path). The well-known types' forms are
//! in `crate::wkt`.
//!
//! The descriptor pool stays for what needs reflection: the HTTP+JSON
//! routes and query parameters, card canonicalization, and reading
//! operator-written files strictly ([`from_str`]).

use std::sync::LazyLock;

use prost::{Message, Name};
use prost_reflect::{DescriptorPool, DeserializeOptions, DynamicMessage, MessageDescriptor};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::proto::FILE_DESCRIPTOR_SET;

/// The descriptors of `a2a.proto` and everything it imports.
pub static POOL: LazyLock<DescriptorPool> = LazyLock::new(|| {
    DescriptorPool::decode(FILE_DESCRIPTOR_SET).expect("build.rs wrote a valid descriptor set")
});

/// A message could not be read from or written as ProtoJSON.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct JsonError(String);

impl JsonError {
    /// An error of the JSON layer that is not the codec's own (a JSON
    /// library around it, a missing descriptor).
    pub fn from_display(error: &impl std::fmt::Display) -> Self {
        JsonError(error.to_string())
    }
}

fn descriptor<M: Name>() -> Result<MessageDescriptor, JsonError> {
    POOL.get_message_by_name(&M::full_name())
        .ok_or_else(|| JsonError(format!("no descriptor for {}", M::full_name())))
}

/// The ProtoJSON value of `message` (fields at their default are left out).
pub fn to_value<M: Serialize>(message: &M) -> Result<serde_json::Value, JsonError> {
    serde_json::to_value(message).map_err(|e| JsonError(e.to_string()))
}

/// `message` as indented ProtoJSON text, fields in proto order.
pub fn to_string_pretty<M: Serialize>(message: &M) -> Result<String, JsonError> {
    serde_json::to_string_pretty(message).map_err(|e| JsonError(e.to_string()))
}

/// `message` as one line of ProtoJSON text, fields in proto order.
pub fn to_string<M: Serialize>(message: &M) -> Result<String, JsonError> {
    serde_json::to_string(message).map_err(|e| JsonError(e.to_string()))
}

/// Reads a message from ProtoJSON text that the operator wrote (a card
/// file, a CLI argument): camelCase or proto field names, enum names or
/// numbers, as ProtoJSON parsers must; an unknown field is an error, so
/// a typo is reported rather than ignored. Through the descriptors, as
/// the generated codec ignores unknown fields.
pub fn from_str<M: Message + Name + Default>(text: &str) -> Result<M, JsonError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let dynamic = DynamicMessage::deserialize(descriptor::<M>()?, &mut de)
        .map_err(|e| JsonError(e.to_string()))?;
    de.end().map_err(|e| JsonError(e.to_string()))?;
    M::decode(dynamic.encode_to_vec().as_slice()).map_err(|e| JsonError(e.to_string()))
}

/// `message` as compact ProtoJSON bytes, appended to `out`.
pub fn write<M: Serialize>(message: &M, out: &mut Vec<u8>) -> Result<(), JsonError> {
    serde_json::to_writer(out, message).map_err(|e| JsonError(e.to_string()))
}

/// Reads a request from a client's ProtoJSON: field names camelCase or as
/// in the proto, enums by name or number, 64-bit integers as numbers or
/// strings, bytes as base64; unknown fields are ignored (spec §5.7:
/// implementations SHOULD ignore unrecognized fields).
///
/// The generated codec reads what clients send; what it refuses is read
/// again through the descriptors, which also take what ProtoJSON allows
/// and the generated code does not (`null` for a field at its default),
/// and whose error names the offending field the same way on every
/// input. Only refused or unusual bodies pay for the second reading.
pub fn from_request_slice<M: DeserializeOwned + Message + Name + Default>(
    bytes: &[u8],
) -> Result<M, JsonError> {
    if let Ok(message) = serde_json::from_slice(bytes) {
        return Ok(message);
    }
    let dynamic = dynamic_from_request(descriptor::<M>()?, bytes)?;
    M::decode(dynamic.encode_to_vec().as_slice()).map_err(|e| JsonError(e.to_string()))
}

/// [`from_request_slice`] into a message of the given descriptor.
pub fn dynamic_from_request(
    descriptor: MessageDescriptor,
    bytes: &[u8],
) -> Result<DynamicMessage, JsonError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let options = DeserializeOptions::new().deny_unknown_fields(false);
    let dynamic = DynamicMessage::deserialize_with_options(descriptor, &mut de, &options)
        .map_err(|e| JsonError(e.to_string()))?;
    de.end().map_err(|e| JsonError(e.to_string()))?;
    Ok(dynamic)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{AgentCapabilities, AgentCard, Task, TaskState, TaskStatus};

    #[test]
    fn fields_are_camel_case_and_enums_are_names() {
        let task = Task {
            id: "t-1".into(),
            context_id: "c-1".into(),
            status: Some(TaskStatus {
                state: TaskState::InputRequired as i32,
                ..Default::default()
            }),
            ..Default::default()
        };
        let value = to_value(&task).unwrap();
        assert_eq!(value["contextId"], "c-1");
        assert_eq!(value["status"]["state"], "TASK_STATE_INPUT_REQUIRED");
        assert!(value.get("context_id").is_none());
    }

    #[test]
    fn round_trips_and_refuses_unknown_fields() {
        let card = AgentCard {
            name: "n".into(),
            capabilities: Some(AgentCapabilities {
                streaming: Some(true),
                extended_agent_card: Some(false),
                ..Default::default()
            }),
            default_input_modes: vec!["text/plain".into()],
            ..Default::default()
        };
        let text = to_string_pretty(&card).unwrap();
        assert!(text.contains("\"defaultInputModes\""));
        // Proto field order: `name` (1) before `capabilities` (7).
        assert!(
            text.find("\"name\"") < text.find("\"capabilities\""),
            "{text}"
        );
        assert!(!to_string(&card).unwrap().contains('\n'));
        // An explicitly set optional `false` is present.
        assert!(text.contains("\"extendedAgentCard\": false"));
        assert_eq!(from_str::<AgentCard>(&text).unwrap(), card);
        assert!(from_str::<AgentCard>(r#"{"nmae": "typo"}"#).is_err());
        assert!(from_str::<AgentCard>(r#"{"name": "x"} trailing"#).is_err());
    }
}
