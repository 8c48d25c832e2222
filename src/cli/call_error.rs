//! How a client command's failed call is printed, the same for every
//! binding: `NOT_FOUND TASK_NOT_FOUND: task "x" not found` (the status
//! code's name, the ErrorInfo reason, the message), read from a gRPC
//! status, a JSON-RPC error object (spec §9.5) or an HTTP+JSON error body
//! (spec §11.6).

use serde_json::Value;
use tonic_types::StatusExt;

/// A failed call, as every binding reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallError {
    /// The gRPC status code's name (`NOT_FOUND`), which every binding's
    /// error maps to.
    pub code: String,
    /// The `google.rpc.ErrorInfo` reason, when the server sent one.
    pub reason: String,
    pub message: String,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.reason.is_empty() || self.reason == self.code {
            write!(f, "{}: {}", self.code, self.message)
        } else {
            write!(f, "{} {}: {}", self.code, self.reason, self.message)
        }
    }
}

impl std::error::Error for CallError {}

impl From<tonic::Status> for CallError {
    fn from(status: tonic::Status) -> Self {
        CallError {
            code: a2a_lifecycle::metrics::code_label(status.code()).to_owned(),
            reason: status
                .get_details_error_info()
                .map(|info| info.reason)
                .unwrap_or_default(),
            message: status.message().to_owned(),
        }
    }
}

impl CallError {
    /// The call did not reach the server or its answer was cut: the
    /// error and its causes (hyper's "transport error" alone says
    /// nothing).
    pub(crate) fn transport(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        let error: Box<dyn std::error::Error + Send + Sync> = error.into();
        CallError {
            code: "UNAVAILABLE".into(),
            reason: String::new(),
            message: super::server_connection::chain(&*error),
        }
    }

    pub(crate) fn protocol(message: impl std::fmt::Display) -> Self {
        CallError {
            code: "INTERNAL".into(),
            reason: String::new(),
            message: format!("the server's answer is not understood: {message}"),
        }
    }

    /// The ErrorInfo reason in a JSON error's details (`data` or
    /// `details`).
    fn reason_of(details: Option<&Value>) -> String {
        details
            .and_then(Value::as_array)
            .and_then(|d| {
                d.iter()
                    .find(|d| d["@type"] == "type.googleapis.com/google.rpc.ErrorInfo")
            })
            .and_then(|info| info["reason"].as_str())
            .unwrap_or_default()
            .to_owned()
    }

    /// A JSON-RPC error object (spec §9.5); its code named as the gRPC
    /// binding would (spec §5.4).
    pub(crate) fn from_jsonrpc(error: &Value) -> Self {
        let reason = Self::reason_of(error.get("data"));
        let code = match error["code"].as_i64().unwrap_or(-32603) {
            -32001 => "NOT_FOUND",
            -32002 | -32003 | -32004 | -32007 | -32008 | -32009 => "FAILED_PRECONDITION",
            -32005 | -32600 | -32602 | -32700 => "INVALID_ARGUMENT",
            -32601 => "UNIMPLEMENTED",
            -32000 if is_code_name(&reason) => reason.as_str(),
            _ => "INTERNAL",
        }
        .to_owned();
        CallError {
            code,
            reason,
            message: error["message"].as_str().unwrap_or_default().to_owned(),
        }
    }

    /// An HTTP+JSON error body (spec §11.6, AIP-193).
    pub(crate) fn from_rest(status: http::StatusCode, body: &[u8]) -> Self {
        match serde_json::from_slice::<Value>(body) {
            Ok(value) if value["error"].is_object() => {
                let error = &value["error"];
                CallError {
                    code: error["status"].as_str().unwrap_or("UNKNOWN").to_owned(),
                    reason: Self::reason_of(error.get("details")),
                    message: error["message"].as_str().unwrap_or_default().to_owned(),
                }
            }
            _ => CallError {
                code: format!("HTTP {}", status.as_u16()),
                reason: String::new(),
                message: String::from_utf8_lossy(body).trim().to_owned(),
            },
        }
    }
}

/// The reasons that are gRPC code names (the errors A2A gives no code).
fn is_code_name(reason: &str) -> bool {
    matches!(
        reason,
        "UNAUTHENTICATED"
            | "PERMISSION_DENIED"
            | "RESOURCE_EXHAUSTED"
            | "UNAVAILABLE"
            | "DEADLINE_EXCEEDED"
            | "OUT_OF_RANGE"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_print_the_same_for_every_binding() {
        let grpc = CallError::from(tonic::Status::from(
            a2a_lifecycle::error::A2aError::TaskNotFound {
                task_id: "x".into(),
            },
        ));
        let rpc = CallError::from_jsonrpc(&serde_json::json!({
            "code": -32001,
            "message": "task \"x\" not found",
            "data": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "TASK_NOT_FOUND"}],
        }));
        let rest = CallError::from_rest(
            http::StatusCode::NOT_FOUND,
            br#"{"error":{"code":404,"status":"NOT_FOUND","message":"task \"x\" not found","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"TASK_NOT_FOUND"}]}}"#,
        );
        let expected = "NOT_FOUND TASK_NOT_FOUND: task \"x\" not found";
        assert_eq!(grpc.to_string(), expected);
        assert_eq!(rpc.to_string(), expected);
        assert_eq!(rest.to_string(), expected);
        let unauthenticated = CallError::from_jsonrpc(&serde_json::json!({
            "code": -32000, "message": "no credentials",
            "data": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "UNAUTHENTICATED"}],
        }));
        assert_eq!(
            unauthenticated.to_string(),
            "UNAUTHENTICATED: no credentials"
        );
    }
}
