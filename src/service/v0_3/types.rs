//! The 0.3 JSON-RPC payloads (A2A 0.3 `types.ts`), read from and written
//! for 0.3 clients. Field names as 0.3 spells them; fields a client may
//! leave out default; unknown fields are ignored (0.3 servers ignore
//! them too). `kind` is written on every object that has one and read
//! where it is given; a missing `kind` is inferred from the content, as
//! the official 0.3 SDK does.

use serde::{Deserialize, Serialize};

use crate::wkt::{Struct, Value};

fn message_kind() -> String {
    "message".into()
}

fn task_kind() -> String {
    "task".into()
}

/// `Message` (0.3 `types.ts`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Message {
    #[serde(default = "message_kind")]
    pub kind: String,
    /// `user` or `agent`.
    pub role: String,
    pub parts: Vec<Part>,
    pub message_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_id: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reference_task_ids: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extensions: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Struct>,
}

/// `Part`: `{"kind":"text","text"}`, `{"kind":"file","file"}` or
/// `{"kind":"data","data"}`, each with optional `metadata`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Part {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<FileContent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Struct>,
}

/// A file part's content: `bytes` (base64) or `uri`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileContent {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// `Task`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Task {
    #[serde(default = "task_kind")]
    pub kind: String,
    pub id: String,
    pub context_id: String,
    pub status: TaskStatus,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<Message>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<Artifact>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Struct>,
}

/// `TaskStatus`: the state by its 0.3 name.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskStatus {
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<Message>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<String>,
}

/// `Artifact`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Artifact {
    pub artifact_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub parts: Vec<Part>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Struct>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extensions: Vec<String>,
}

/// `TaskStatusUpdateEvent` (`kind: "status-update"`).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusUpdateEvent {
    pub kind: &'static str,
    pub task_id: String,
    pub context_id: String,
    pub status: TaskStatus,
    /// The last event of the stream: the task reached a terminal or an
    /// interrupted state.
    #[serde(rename = "final")]
    pub is_final: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Struct>,
}

/// `TaskArtifactUpdateEvent` (`kind: "artifact-update"`).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ArtifactUpdateEvent {
    pub kind: &'static str,
    pub task_id: String,
    pub context_id: String,
    pub artifact: Artifact,
    pub append: bool,
    pub last_chunk: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Struct>,
}

/// What a 0.3 send or stream answers: one of the four, told apart by
/// `kind`.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Event {
    Task(Task),
    Message(Message),
    StatusUpdate(StatusUpdateEvent),
    ArtifactUpdate(ArtifactUpdateEvent),
}

/// `MessageSendParams`.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageSendParams {
    pub message: Message,
    #[serde(default)]
    pub configuration: Option<SendConfiguration>,
    #[serde(default)]
    pub metadata: Option<Struct>,
}

/// `MessageSendConfiguration`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendConfiguration {
    #[serde(default)]
    pub accepted_output_modes: Vec<String>,
    #[serde(default)]
    pub history_length: Option<i32>,
    #[serde(default)]
    pub push_notification_config: Option<PushConfig>,
    /// Absent: blocking (0.3's default).
    #[serde(default)]
    pub blocking: Option<bool>,
}

/// `PushNotificationConfig`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PushConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authentication: Option<PushAuthentication>,
}

/// `PushNotificationAuthenticationInfo`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PushAuthentication {
    pub schemes: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<String>,
}

/// `TaskPushNotificationConfig`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskPushConfig {
    pub task_id: String,
    pub push_notification_config: PushConfig,
}

/// `TaskIdParams` and `TaskQueryParams` (`historyLength`).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskParams {
    pub id: String,
    #[serde(default)]
    pub history_length: Option<i32>,
    #[serde(default)]
    pub metadata: Option<Struct>,
}

/// The push-config get, list and delete params: the task's `id` and,
/// for get and delete, `pushNotificationConfigId`.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PushConfigParams {
    pub id: String,
    #[serde(default)]
    pub push_notification_config_id: Option<String>,
}
