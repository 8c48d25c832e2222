//! The gRPC binding (spec §10): the tonic `A2AService` over [`A2aApi`].
//!
//! Owns what is gRPC's alone: the call's context from its metadata and
//! connection (`authorization`, `a2a-version`, `a2a-extensions`,
//! `traceparent`, `grpc-timeout`), and the gRPC form of an [`A2aError`]
//! (spec §5.4 status codes, §10.6 `google.rpc.ErrorInfo` and
//! `BadRequest` details).

use std::time::Duration;

use futures_util::StreamExt;
use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt};

use super::{A2aApi, Binding, CallContext};
use crate::connections::ClientCertificate;
use crate::error::{A2aError, ERROR_DOMAIN};
use crate::proto::a2a_service_server::A2aService;
use crate::proto::{
    AgentCard, CancelTaskRequest, DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest, GetTaskPushNotificationConfigRequest, GetTaskRequest,
    ListTaskPushNotificationConfigsRequest, ListTaskPushNotificationConfigsResponse,
    ListTasksRequest, ListTasksResponse, SendMessageRequest, SendMessageResponse, StreamResponse,
    SubscribeToTaskRequest, Task, TaskPushNotificationConfig,
};

/// A server stream of A2A events, in gRPC's form.
pub type GrpcEventStream =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<StreamResponse, Status>> + Send>>;

/// The A2A gRPC service.
#[derive(Clone)]
pub struct A2aGrpc {
    api: A2aApi,
}

impl A2aGrpc {
    pub fn new(api: A2aApi) -> Self {
        A2aGrpc { api }
    }
}

/// The call's context: its metadata, the connection's peer and verified
/// client certificate, the `traceparent` the span layer parsed
/// ([`crate::telemetry::Traced`]) and the client's `grpc-timeout`.
pub(crate) fn context<T>(request: &Request<T>) -> CallContext {
    let headers = request.metadata().as_ref();
    let mut call = CallContext::from_headers(Binding::Grpc, headers);
    call.client_certificate = request
        .extensions()
        .get::<ClientCertificate>()
        .map(|c| c.name.clone());
    call.peer = request.remote_addr();
    call.principal = request
        .extensions()
        .get::<Authenticated>()
        .map(|a| a.0.clone());
    call.trace = request.extensions().get().copied();
    call.deadline = grpc_timeout(headers);
    call
}

fn unary<T>(answer: Result<T, A2aError>) -> Result<Response<T>, Status> {
    answer.map(Response::new).map_err(Status::from)
}

/// GetTask's gRPC answer: the task, or its encoding
/// ([`crate::store::TaskRead`]), naming the extensions the call activated.
pub(crate) fn get_task_response<T>(
    call: &CallContext,
    answer: Result<T, A2aError>,
) -> Result<Response<T>, Status> {
    let mut response = unary(answer)?;
    if let Some(uri) = call.params.activated() {
        // spec §4.6: the response names the extensions it activated.
        response.metadata_mut().insert(
            crate::discovery::EXTENSIONS_METADATA,
            tonic::metadata::MetadataValue::from_static(uri),
        );
    }
    Ok(response)
}

fn streamed(
    answer: Result<super::EventStream, A2aError>,
) -> Result<Response<GrpcEventStream>, Status> {
    let stream = answer?;
    Ok(Response::new(Box::pin(
        stream.map(|item| item.map_err(Status::from)),
    )))
}

#[tonic::async_trait]
impl A2aService for A2aGrpc {
    async fn send_message(
        &self,
        request: Request<SendMessageRequest>,
    ) -> Result<Response<SendMessageResponse>, Status> {
        let call = context(&request);
        unary(self.api.send_message(&call, request.into_inner()).await)
    }

    type SendStreamingMessageStream = GrpcEventStream;

    async fn send_streaming_message(
        &self,
        request: Request<SendMessageRequest>,
    ) -> Result<Response<GrpcEventStream>, Status> {
        let call = context(&request);
        streamed(
            self.api
                .send_streaming_message(&call, request.into_inner())
                .await,
        )
    }

    /// Served by [`super::grpc_server::A2aGrpcServer`] without decoding
    /// the task; this is the same answer for a server built on the
    /// generated service alone.
    async fn get_task(&self, request: Request<GetTaskRequest>) -> Result<Response<Task>, Status> {
        let call = context(&request);
        let answer = self.api.get_task(&call, request.into_inner()).await;
        get_task_response(&call, answer)
    }

    async fn list_tasks(
        &self,
        request: Request<ListTasksRequest>,
    ) -> Result<Response<ListTasksResponse>, Status> {
        let call = context(&request);
        unary(self.api.list_tasks(&call, request.into_inner()).await)
    }

    async fn cancel_task(
        &self,
        request: Request<CancelTaskRequest>,
    ) -> Result<Response<Task>, Status> {
        let call = context(&request);
        unary(self.api.cancel_task(&call, request.into_inner()).await)
    }

    type SubscribeToTaskStream = GrpcEventStream;

    async fn subscribe_to_task(
        &self,
        request: Request<SubscribeToTaskRequest>,
    ) -> Result<Response<GrpcEventStream>, Status> {
        let call = context(&request);
        streamed(
            self.api
                .subscribe_to_task(&call, request.into_inner())
                .await,
        )
    }

    async fn create_task_push_notification_config(
        &self,
        request: Request<TaskPushNotificationConfig>,
    ) -> Result<Response<TaskPushNotificationConfig>, Status> {
        let call = context(&request);
        unary(
            self.api
                .create_task_push_notification_config(&call, request.into_inner())
                .await,
        )
    }

    async fn get_task_push_notification_config(
        &self,
        request: Request<GetTaskPushNotificationConfigRequest>,
    ) -> Result<Response<TaskPushNotificationConfig>, Status> {
        let call = context(&request);
        unary(
            self.api
                .get_task_push_notification_config(&call, request.into_inner())
                .await,
        )
    }

    async fn list_task_push_notification_configs(
        &self,
        request: Request<ListTaskPushNotificationConfigsRequest>,
    ) -> Result<Response<ListTaskPushNotificationConfigsResponse>, Status> {
        let call = context(&request);
        unary(
            self.api
                .list_task_push_notification_configs(&call, request.into_inner())
                .await,
        )
    }

    async fn get_extended_agent_card(
        &self,
        request: Request<GetExtendedAgentCardRequest>,
    ) -> Result<Response<AgentCard>, Status> {
        let call = context(&request);
        unary(
            self.api
                .get_extended_agent_card(&call, request.into_inner())
                .await,
        )
    }

    async fn delete_task_push_notification_config(
        &self,
        request: Request<DeleteTaskPushNotificationConfigRequest>,
    ) -> Result<Response<()>, Status> {
        let call = context(&request);
        unary(
            self.api
                .delete_task_push_notification_config(&call, request.into_inner())
                .await,
        )
    }
}

/// The gRPC status code of spec §5.4 (gRPC column).
pub fn code(err: &A2aError) -> Code {
    match err {
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
        A2aError::DeadlineExceeded { .. } => Code::DeadlineExceeded,
        A2aError::TooLarge { .. } => Code::OutOfRange,
        A2aError::MethodNotFound { .. } => Code::Unimplemented,
    }
}

/// Every error with its `google.rpc.ErrorInfo` (spec §10.6); validation
/// errors add a `google.rpc.BadRequest` naming the field.
impl From<A2aError> for Status {
    fn from(err: A2aError) -> Status {
        let mut details = ErrorDetails::with_error_info(err.reason(), ERROR_DOMAIN, err.metadata());
        for v in err.field_violations() {
            details.add_bad_request_violation(v.field, v.description);
        }
        Status::with_error_details(code(&err), err.message(), details)
    }
}

/// The longest `grpc-timeout` value: eight digits (gRPC over HTTP/2,
/// "Timeout").
const GRPC_TIMEOUT_DIGITS: usize = 8;

/// The client's deadline from `grpc-timeout` (gRPC over HTTP/2: up to
/// eight digits and a unit, H M S m u n). A malformed value is ignored, as
/// tonic's server does: the client enforces its own deadline anyway.
pub fn grpc_timeout(headers: &http::HeaderMap) -> Option<Duration> {
    // A name made once: given as text it is parsed on every lookup.
    const GRPC_TIMEOUT: http::HeaderName = http::HeaderName::from_static("grpc-timeout");
    let value = headers.get(GRPC_TIMEOUT)?.to_str().ok()?;
    if value.len() < 2 {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    if digits.len() > GRPC_TIMEOUT_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount * 3600),
        "M" => Duration::from_secs(amount * 60),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

/// Errors tonic answers itself before a handler runs carry no details; the
/// one a client can cause, a request over [`crate::proto::MAX_MESSAGE_BYTES`]
/// (OUT_OF_RANGE), gets the `google.rpc.ErrorInfo` every error of this
/// server carries (spec §10.6), naming the limit. Only trailers-only
/// answers (status in the headers) of gRPC calls are looked at: a
/// handler's own errors already have their details.
pub fn transport_error_info(
    response: http::Response<tonic::body::Body>,
) -> http::Response<tonic::body::Body> {
    const GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");
    let headers = response.headers();
    let out_of_range = headers
        .get(GRPC_STATUS)
        .is_some_and(|v| v.as_bytes() == b"11");
    if !out_of_range || headers.contains_key("grpc-status-details-bin") {
        return response;
    }
    Status::from(A2aError::TooLarge {
        max_bytes: crate::proto::MAX_MESSAGE_BYTES,
    })
    .into_http()
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

    #[test]
    fn deadline_and_size_errors_name_their_limit() {
        let status = Status::from(A2aError::DeadlineExceeded {
            deadline: Duration::from_millis(1500),
        });
        assert_eq!(status.code(), Code::DeadlineExceeded);
        assert_eq!(info(&status).metadata["timeout_ms"], "1500");
        let status = Status::from(A2aError::TooLarge { max_bytes: 10 });
        assert_eq!(status.code(), Code::OutOfRange);
        assert_eq!(info(&status).metadata["max_bytes"], "10");
    }
}

/// The principal an A2A gRPC call was authenticated as from its metadata,
/// before its message was read ([`AuthFirst`]).
#[derive(Clone)]
pub(crate) struct Authenticated(pub(crate) crate::auth::Principal);

/// Authenticates the A2A gRPC calls (1.0's and 0.3's services) from their
/// metadata before tonic reads their message
/// ([`A2aApi::authenticate_headers`]): a call without credentials is
/// UNAUTHENTICATED with no byte of its body read. The health and
/// reflection services stay public.
#[derive(Clone)]
pub struct AuthFirst<S> {
    inner: S,
    api: A2aApi,
}

impl<S> AuthFirst<S> {
    pub fn new(inner: S, api: A2aApi) -> Self {
        AuthFirst { inner, api }
    }
}

/// Whether a gRPC path is one of the A2A services'.
fn is_a2a_call(path: &str) -> bool {
    ["/lf.a2a.v1.A2AService/", "/a2a.v1.A2AService/"]
        .iter()
        .any(|service| path.starts_with(service))
}

impl<S, B> tower::Service<http::Request<B>> for AuthFirst<S>
where
    S: tower::Service<
            http::Request<B>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        if !self.api.authenticates() || !is_a2a_call(request.uri().path()) {
            return Box::pin(self.inner.call(request));
        }
        // The ready service goes with this call; its clone waits for the
        // next (tower's rule for a service called from a future).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let api = self.api.clone();
        Box::pin(async move {
            let mut call = CallContext::from_headers(Binding::Grpc, request.headers());
            call.client_certificate = request
                .extensions()
                .get::<ClientCertificate>()
                .map(|c| c.name.clone());
            call.peer = request
                .extensions()
                .get::<tonic::transport::server::TcpConnectInfo>()
                .and_then(|info| info.remote_addr());
            match api.authenticate_headers(&mut call).await {
                Ok(()) => {
                    if let Some(principal) = call.principal {
                        request.extensions_mut().insert(Authenticated(principal));
                    }
                    inner.call(request).await
                }
                Err(e) => Ok(Status::from(e).into_http()),
            }
        })
    }
}
