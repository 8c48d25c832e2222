//! A2A errors (spec §3.3.2), whatever the binding.
//!
//! Each error has what every binding writes of it: a message, the
//! `google.rpc.ErrorInfo` reason (UPPER_SNAKE_CASE without the `Error`
//! suffix, spec §10.6, §11.6) and metadata naming the task or the limit,
//! under domain `a2a-protocol.org`; validation errors name their fields
//! (`google.rpc.BadRequest`). Each binding maps it to its own wire form
//! beside its adapter (spec §5.4): `service::grpc` (status codes),
//! `service::jsonrpc` (error codes), `service::http_json` (HTTP statuses).

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Duration;

/// The `ErrorInfo.domain` of every error this server returns (spec §10.6).
pub const ERROR_DOMAIN: &str = "a2a-protocol.org";

/// The most of one value a caller sent (a tenant, an id, a key id) that an
/// error's metadata, a log line or a span repeats: a caller's megabytes
/// never become the server's log lines.
pub const MAX_ECHO_BYTES: usize = 256;
/// The longest error message written to a caller or a log.
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// `text` cut to at most `max` bytes (at a character boundary), marked
/// `...` when cut.
pub fn cut(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    let mut end = max.saturating_sub(3);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}...", &text[..end]))
}

/// A field that failed validation, for `google.rpc.BadRequest`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldViolation {
    pub field: String,
    pub description: String,
}

/// An error an A2A operation can return.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum A2aError {
    /// TaskNotFoundError: no such task for this tenant (or purged).
    #[error("task {task_id:?} not found")]
    TaskNotFound { task_id: String },
    /// A push notification config the task does not have: TASK_NOT_FOUND
    /// too (spec §3.1.8), with the config's id in the metadata.
    #[error("task {task_id:?} has no push notification config {config_id:?}")]
    PushConfigNotFound { task_id: String, config_id: String },
    /// TaskNotCancelableError: the task is already terminal (spec §3.1.5).
    #[error("task {task_id:?} is {state} and cannot be canceled")]
    TaskNotCancelable {
        task_id: String,
        state: &'static str,
    },
    /// UnsupportedOperationError (spec §3.1.1, §3.1.6, §3.3.4).
    #[error("{message}")]
    UnsupportedOperation {
        message: String,
        task_id: Option<String>,
    },
    /// PushNotificationNotSupportedError (spec §3.3.4).
    #[error("push notifications are not supported by this agent")]
    PushNotificationNotSupported,
    /// ExtendedAgentCardNotConfiguredError: the agent declares an extended
    /// card but none is configured (spec §3.1.11, §3.3.4).
    #[error("this agent declares an extended agent card, but none is configured")]
    ExtendedAgentCardNotConfigured,
    /// ExtensionSupportRequiredError: the agent card marks an extension
    /// `required` and the request did not declare it (spec §3.3.4).
    #[error("extension {uri} is required by this agent; declare it in the a2a-extensions metadata")]
    ExtensionSupportRequired { uri: String },
    /// VersionNotSupportedError: the `a2a-version` asked for is not served
    /// (spec §3.6.2).
    #[error("A2A version {requested:?} is not supported; this interface serves 1.0")]
    VersionNotSupported { requested: String },
    /// ContentTypeNotSupportedError: a message part's media type is not
    /// among the input modes the agent's card declares (spec §3.3.2,
    /// §5.4: INVALID_ARGUMENT).
    #[error(
        "media type {media_type:?} of {field} is not accepted by this agent; it accepts {accepted:?}"
    )]
    ContentTypeNotSupported {
        field: String,
        media_type: String,
        accepted: Vec<String>,
    },
    /// A named limit was reached (a task's queue of follow-up messages);
    /// the request may be retried once the limit frees up.
    #[error("{message}")]
    ResourceExhausted {
        message: String,
        task_id: Option<String>,
        limit: &'static str,
    },
    /// Request validation failed (spec §3.3.2, validation errors).
    #[error("invalid request: {}", describe(.0))]
    InvalidArgument(Vec<FieldViolation>),
    /// InvalidAgentResponseError: the agent broke the protocol.
    #[error("invalid agent response: {0}")]
    InvalidAgentResponse(String),
    /// The request carries no credentials the server accepts (spec §13.1).
    /// The text says why, never what the credential was.
    #[error("{0}")]
    Unauthenticated(String),
    /// The authenticated principal may not use this tenant.
    #[error("{principal:?} may not use tenant {tenant:?}")]
    PermissionDenied { principal: String, tenant: String },
    /// A temporary failure (store unreachable, server shutting down).
    #[error("{0}")]
    Unavailable(String),
    /// A server fault.
    #[error("internal error: {0}")]
    Internal(String),
    /// The caller's deadline passed before the answer (gRPC's
    /// `grpc-timeout`); what the call started goes on.
    #[error("the call did not complete within the client's deadline ({deadline:?})")]
    DeadlineExceeded { deadline: Duration },
    /// No operation by this name (JSON-RPC method) or at this path
    /// (HTTP+JSON route).
    #[error("no A2A operation {method:?} is served here")]
    MethodNotFound { method: String },
    /// A request larger than the named limit, refused unread.
    #[error("a message is larger than the {max_bytes} bytes this server accepts")]
    TooLarge { max_bytes: usize },
}

fn describe(violations: &[FieldViolation]) -> String {
    violations
        .iter()
        .map(|v| format!("{}: {}", v.field, v.description))
        .collect::<Vec<_>>()
        .join("; ")
}

impl A2aError {
    /// A validation error on one field.
    pub fn invalid(field: impl Into<String>, description: impl Into<String>) -> Self {
        A2aError::InvalidArgument(vec![FieldViolation {
            field: field.into(),
            description: description.into(),
        }])
    }

    pub fn unsupported(message: impl Into<String>, task_id: Option<&str>) -> Self {
        A2aError::UnsupportedOperation {
            message: message.into(),
            task_id: task_id.map(str::to_owned),
        }
    }

    /// The `ErrorInfo.reason` (spec §10.6).
    pub fn reason(&self) -> &'static str {
        match self {
            A2aError::TaskNotFound { .. } | A2aError::PushConfigNotFound { .. } => "TASK_NOT_FOUND",
            A2aError::TaskNotCancelable { .. } => "TASK_NOT_CANCELABLE",
            A2aError::UnsupportedOperation { .. } => "UNSUPPORTED_OPERATION",
            A2aError::PushNotificationNotSupported => "PUSH_NOTIFICATION_NOT_SUPPORTED",
            A2aError::ExtendedAgentCardNotConfigured => "EXTENDED_AGENT_CARD_NOT_CONFIGURED",
            A2aError::ExtensionSupportRequired { .. } => "EXTENSION_SUPPORT_REQUIRED",
            A2aError::VersionNotSupported { .. } => "VERSION_NOT_SUPPORTED",
            A2aError::InvalidArgument(_) => "INVALID_PARAMS",
            A2aError::ContentTypeNotSupported { .. } => "CONTENT_TYPE_NOT_SUPPORTED",
            A2aError::ResourceExhausted { .. } => "RESOURCE_EXHAUSTED",
            A2aError::InvalidAgentResponse(_) => "INVALID_AGENT_RESPONSE",
            A2aError::Unavailable(_) => "UNAVAILABLE",
            A2aError::Unauthenticated(_) => "UNAUTHENTICATED",
            A2aError::PermissionDenied { .. } => "PERMISSION_DENIED",
            A2aError::Internal(_) => "INTERNAL",
            A2aError::DeadlineExceeded { .. } => "DEADLINE_EXCEEDED",
            A2aError::TooLarge { .. } => "OUT_OF_RANGE",
            A2aError::MethodNotFound { .. } => "METHOD_NOT_FOUND",
        }
    }

    /// The message every binding writes: the error's text, at most
    /// [`MAX_MESSAGE_BYTES`] (it may quote what the caller sent).
    pub fn message(&self) -> String {
        let text = self.to_string();
        match cut(&text, MAX_MESSAGE_BYTES) {
            Cow::Borrowed(_) => text,
            Cow::Owned(cut) => cut,
        }
    }

    /// The fields a validation error names (`google.rpc.BadRequest`),
    /// each part at most [`MAX_MESSAGE_BYTES`].
    pub fn field_violations(&self) -> Vec<FieldViolation> {
        let bounded = |v: &FieldViolation| FieldViolation {
            field: cut(&v.field, MAX_ECHO_BYTES).into_owned(),
            description: cut(&v.description, MAX_MESSAGE_BYTES).into_owned(),
        };
        match self {
            A2aError::InvalidArgument(violations) => violations.iter().map(bounded).collect(),
            A2aError::ContentTypeNotSupported { field, .. } => vec![bounded(&FieldViolation {
                field: field.clone(),
                description: self.to_string(),
            })],
            _ => Vec::new(),
        }
    }

    /// The `ErrorInfo.metadata`: the task, and what else names the cause;
    /// each value at most [`MAX_ECHO_BYTES`].
    pub fn metadata(&self) -> HashMap<String, String> {
        let task_id = match self {
            A2aError::TaskNotFound { task_id }
            | A2aError::TaskNotCancelable { task_id, .. }
            | A2aError::PushConfigNotFound { task_id, .. } => Some(task_id.clone()),
            A2aError::UnsupportedOperation { task_id, .. }
            | A2aError::ResourceExhausted { task_id, .. } => task_id.clone(),
            _ => None,
        };
        let mut metadata = HashMap::new();
        if let Some(task_id) = task_id {
            metadata.insert("task_id".to_owned(), task_id);
        }
        match self {
            A2aError::TaskNotCancelable { state, .. } => {
                metadata.insert("state".to_owned(), (*state).to_owned());
            }
            A2aError::PushConfigNotFound { config_id, .. } => {
                metadata.insert("config_id".to_owned(), config_id.clone());
            }
            A2aError::ExtensionSupportRequired { uri } => {
                metadata.insert("extension".to_owned(), uri.clone());
            }
            A2aError::ContentTypeNotSupported {
                field,
                media_type,
                accepted,
            } => {
                metadata.insert("field".to_owned(), field.clone());
                metadata.insert("media_type".to_owned(), media_type.clone());
                metadata.insert("accepted_media_types".to_owned(), accepted.join(","));
            }
            A2aError::ResourceExhausted { limit, .. } => {
                metadata.insert("limit".to_owned(), (*limit).to_owned());
            }
            A2aError::PermissionDenied { tenant, .. } => {
                metadata.insert("tenant".to_owned(), tenant.clone());
            }
            A2aError::VersionNotSupported { requested } => {
                metadata.insert("requested_version".to_owned(), requested.clone());
                metadata.insert("supported_versions".to_owned(), "1.0".to_owned());
            }
            A2aError::DeadlineExceeded { deadline } => {
                metadata.insert("timeout_ms".to_owned(), deadline.as_millis().to_string());
            }
            A2aError::MethodNotFound { method } => {
                metadata.insert("method".to_owned(), method.clone());
            }
            A2aError::TooLarge { max_bytes } => {
                metadata.insert("max_bytes".to_owned(), max_bytes.to_string());
            }
            _ => {}
        }
        for value in metadata.values_mut() {
            if let Cow::Owned(cut) = cut(value, MAX_ECHO_BYTES) {
                *value = cut;
            }
        }
        metadata
    }
}
