//! The bounded values of the RPC labels: the method an A2A call, a
//! health or reflection call or any other path counts as, its protocol
//! version and its status code's name.

/// The RPC methods metrics name; any other path is `other`.
pub(super) const METHODS: &[&str] = &[
    "SendMessage",
    "SendStreamingMessage",
    "GetTask",
    "ListTasks",
    "CancelTask",
    "SubscribeToTask",
    "CreateTaskPushNotificationConfig",
    "GetTaskPushNotificationConfig",
    "ListTaskPushNotificationConfigs",
    "DeleteTaskPushNotificationConfig",
    "GetExtendedAgentCard",
];

/// The method labels of the health and reflection services, and of any
/// other path.
pub(super) const HEALTH: &str = "health";
pub(super) const REFLECTION: &str = "reflection";
pub(super) const OTHER: &str = "other";

/// The method label of an A2A operation's name (JSON-RPC method, or the
/// operation an HTTP+JSON route names): `other` when it is none.
pub fn operation_label(name: &str) -> &'static str {
    METHODS
        .iter()
        .find(|m| **m == name)
        .copied()
        .unwrap_or(OTHER)
}

/// The method label of a gRPC request path (`/lf.a2a.v1.A2AService/GetTask`
/// is `GetTask`; the health and reflection services are named by their
/// service; anything else is `other`).
pub fn method_label(path: &str) -> &'static str {
    let Some((service, method)) = path.trim_start_matches('/').split_once('/') else {
        return OTHER;
    };
    if service == "lf.a2a.v1.A2AService" {
        return METHODS
            .iter()
            .find(|m| **m == method)
            .copied()
            .unwrap_or(OTHER);
    }
    // Protocol 0.3's service: its RPCs count as the 1.0 operations they
    // become.
    if service == "a2a.v1.A2AService" {
        let method = match method {
            "TaskSubscription" => "SubscribeToTask",
            "ListTaskPushNotificationConfig" => "ListTaskPushNotificationConfigs",
            "GetAgentCard" => "GetExtendedAgentCard",
            other => other,
        };
        return operation_label(method);
    }
    match service {
        "grpc.health.v1.Health" => HEALTH,
        "grpc.reflection.v1.ServerReflection" | "grpc.reflection.v1alpha.ServerReflection" => {
            REFLECTION
        }
        _ => OTHER,
    }
}

/// The protocol version of a gRPC request path: 0.3's service
/// (`a2a.v1.A2AService`) or 1.0 (everything else).
pub fn protocol_version_label(path: &str) -> &'static str {
    if path.starts_with("/a2a.v1.A2AService/") {
        V0_3
    } else {
        V1_0
    }
}

/// The name of a gRPC status code, as the label `code` shows it.
pub fn code_label(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

/// The `protocol_version` label of a 1.0 call.
pub const V1_0: &str = "1.0";
/// The `protocol_version` label of a 0.3 call (translated at the edge).
pub const V0_3: &str = "0.3";
