//! A2A errors and their gRPC form.
//!
//! One home for the mapping of spec §3.3.2 errors to gRPC status codes
//! (spec §5.4, v1.0.1 table) and to `google.rpc` details (spec §10.6): every
//! error carries a `google.rpc.ErrorInfo` with domain `a2a-protocol.org`, a
//! reason in UPPER_SNAKE_CASE without the `Error` suffix and metadata naming
//! the task; validation errors add a `google.rpc.BadRequest` naming the field.

use std::collections::HashMap;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// The `ErrorInfo.domain` of every error this server returns (spec §10.6).
pub const ERROR_DOMAIN: &str = "a2a-protocol.org";

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

    /// The gRPC status code of spec §5.4.
    pub fn code(&self) -> Code {
        match self {
            A2aError::TaskNotFound { .. } | A2aError::PushConfigNotFound { .. } => Code::NotFound,
            A2aError::TaskNotCancelable { .. }
            | A2aError::UnsupportedOperation { .. }
            | A2aError::PushNotificationNotSupported
            | A2aError::ExtendedAgentCardNotConfigured
            | A2aError::ExtensionSupportRequired { .. }
            | A2aError::VersionNotSupported { .. } => Code::FailedPrecondition,
            A2aError::InvalidArgument(_) | A2aError::ContentTypeNotSupported { .. } => {
                Code::InvalidArgument
            }
            A2aError::ResourceExhausted { .. } => Code::ResourceExhausted,
            A2aError::InvalidAgentResponse(_) | A2aError::Internal(_) => Code::Internal,
            A2aError::Unavailable(_) => Code::Unavailable,
            A2aError::Unauthenticated(_) => Code::Unauthenticated,
            A2aError::PermissionDenied { .. } => Code::PermissionDenied,
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
        }
    }

    fn metadata(&self) -> HashMap<String, String> {
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
            _ => {}
        }
        metadata
    }
}

impl From<A2aError> for Status {
    fn from(err: A2aError) -> Status {
        let mut details = ErrorDetails::with_error_info(err.reason(), ERROR_DOMAIN, err.metadata());
        match &err {
            A2aError::InvalidArgument(violations) => {
                for v in violations {
                    details.add_bad_request_violation(v.field.clone(), v.description.clone());
                }
            }
            A2aError::ContentTypeNotSupported { field, .. } => {
                details.add_bad_request_violation(field.clone(), err.to_string());
            }
            _ => {}
        }
        Status::with_error_details(err.code(), err.to_string(), details)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(status: &Status) -> tonic_types::ErrorInfo {
        status.get_details_error_info().expect("ErrorInfo detail")
    }

    #[test]
    fn task_not_found_is_not_found_with_task_id() {
        let status = Status::from(A2aError::TaskNotFound {
            task_id: "t-1".into(),
        });
        assert_eq!(status.code(), Code::NotFound);
        let info = info(&status);
        assert_eq!(info.reason, "TASK_NOT_FOUND");
        assert_eq!(info.domain, ERROR_DOMAIN);
        assert_eq!(
            info.metadata.get("task_id").map(String::as_str),
            Some("t-1")
        );
    }

    /// spec v1.0.1 §5.4: these are FAILED_PRECONDITION.
    #[test]
    fn precondition_errors_map_to_failed_precondition() {
        let cases = [
            A2aError::TaskNotCancelable {
                task_id: "t".into(),
                state: "TASK_STATE_COMPLETED",
            },
            A2aError::unsupported("no", Some("t")),
            A2aError::PushNotificationNotSupported,
            A2aError::ExtendedAgentCardNotConfigured,
            A2aError::ExtensionSupportRequired { uri: "u".into() },
            A2aError::VersionNotSupported {
                requested: "0.3".into(),
            },
        ];
        let reasons = [
            "TASK_NOT_CANCELABLE",
            "UNSUPPORTED_OPERATION",
            "PUSH_NOTIFICATION_NOT_SUPPORTED",
            "EXTENDED_AGENT_CARD_NOT_CONFIGURED",
            "EXTENSION_SUPPORT_REQUIRED",
            "VERSION_NOT_SUPPORTED",
        ];
        for (err, reason) in cases.into_iter().zip(reasons) {
            let status = Status::from(err);
            assert_eq!(status.code(), Code::FailedPrecondition);
            assert_eq!(info(&status).reason, reason);
        }
    }

    #[test]
    fn validation_errors_carry_bad_request() {
        let status = Status::from(A2aError::invalid(
            "message.parts",
            "at least one part is required",
        ));
        assert_eq!(status.code(), Code::InvalidArgument);
        let bad = status.get_details_bad_request().expect("BadRequest detail");
        assert_eq!(bad.field_violations[0].field, "message.parts");
        assert_eq!(info(&status).reason, "INVALID_PARAMS");
        assert!(status.message().contains("message.parts"));
    }
}
