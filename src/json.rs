//! ProtoJSON (spec §5.5) for every JSON the project reads or writes.
//!
//! One encoder, driven by the descriptor set `build.rs` writes: a message
//! is re-read as a prost-reflect `DynamicMessage` of its own descriptor and
//! serialized by prost-reflect's serde support, so field names (camelCase
//! `json_name`), enum names, well-known types (`Struct`, `Timestamp`) and
//! `oneof`s follow the protobuf JSON mapping without hand-written JSON.

use std::sync::LazyLock;

use prost::{Message, Name};
use prost_reflect::{
    DescriptorPool, DeserializeOptions, DynamicMessage, MessageDescriptor, SerializeOptions,
};

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

fn dynamic<M: Message + Name>(message: &M) -> Result<DynamicMessage, JsonError> {
    DynamicMessage::decode(descriptor::<M>()?, message.encode_to_vec().as_slice())
        .map_err(|e| JsonError(e.to_string()))
}

/// The ProtoJSON value of `message` (fields at their default are left out).
pub fn to_value<M: Message + Name>(message: &M) -> Result<serde_json::Value, JsonError> {
    let dynamic = dynamic(message)?;
    dynamic
        .serialize_with_options(serde_json::value::Serializer, &SerializeOptions::new())
        .map_err(|e| JsonError(e.to_string()))
}

/// `message` as indented ProtoJSON text, fields in proto order.
pub fn to_string_pretty<M: Message + Name>(message: &M) -> Result<String, JsonError> {
    let mut out = Vec::new();
    let mut serializer = serde_json::Serializer::pretty(&mut out);
    dynamic(message)?
        .serialize_with_options(&mut serializer, &SerializeOptions::new())
        .map_err(|e| JsonError(e.to_string()))?;
    String::from_utf8(out).map_err(|e| JsonError(e.to_string()))
}

/// `message` as one line of ProtoJSON text, fields in proto order.
pub fn to_string<M: Message + Name>(message: &M) -> Result<String, JsonError> {
    let mut out = Vec::new();
    let mut serializer = serde_json::Serializer::new(&mut out);
    dynamic(message)?
        .serialize_with_options(&mut serializer, &SerializeOptions::new())
        .map_err(|e| JsonError(e.to_string()))?;
    String::from_utf8(out).map_err(|e| JsonError(e.to_string()))
}

/// Reads a message from ProtoJSON text. Accepts both camelCase and the
/// proto field names, and enum names or numbers, as ProtoJSON parsers must;
/// unknown fields are an error.
pub fn from_str<M: Message + Name + Default>(text: &str) -> Result<M, JsonError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let dynamic = DynamicMessage::deserialize(descriptor::<M>()?, &mut de)
        .map_err(|e| JsonError(e.to_string()))?;
    de.end().map_err(|e| JsonError(e.to_string()))?;
    M::decode(dynamic.encode_to_vec().as_slice()).map_err(|e| JsonError(e.to_string()))
}

/// `message` as compact ProtoJSON bytes, appended to `out`.
pub fn write<M: Message + Name>(message: &M, out: &mut Vec<u8>) -> Result<(), JsonError> {
    let mut serializer = serde_json::Serializer::new(out);
    dynamic(message)?
        .serialize_with_options(&mut serializer, &SerializeOptions::new())
        .map_err(|e| JsonError(e.to_string()))
}

/// Reads a request from a client's ProtoJSON: field names camelCase or as
/// in the proto, enums by name or number, 64-bit integers as numbers or
/// strings, bytes as base64; unknown fields are ignored (spec §5.7:
/// implementations SHOULD ignore unrecognized fields).
pub fn from_request_slice<M: Message + Name + Default>(bytes: &[u8]) -> Result<M, JsonError> {
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
