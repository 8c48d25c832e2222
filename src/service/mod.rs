//! The A2A operations, once, for every protocol binding (spec §5.1:
//! identical functionality, consistent behaviour, the same errors and
//! authentication on every binding).
//!
//! [`A2aApi`] is the seam: a method per operation taking the call's
//! [`CallContext`] (credentials, client certificate, peer, version,
//! extensions, trace, deadline) and the proto request, returning the proto
//! response, an [`EventStream`] of them, or an [`A2aError`]. It checks who
//! is calling ([`crate::auth`]), the protocol rules the cards set
//! ([`Cards::check`]), validates the request ([`validate`]) and hands it
//! to the [`TaskManager`]. The bindings only decode into the proto request
//! type, call it, and write the answer or the error in their own form:
//! [`grpc`] (tonic), [`jsonrpc`] (JSON-RPC 2.0, spec §9) and
//! [`http_json`] (HTTP+JSON, spec §11), with [`sse`] streaming both JSON
//! bindings' events.
//!
//! One file per concern: [`validate`] (input rules and limits), [`send`]
//! (SendMessage, SendStreamingMessage), [`tasks`] (GetTask, ListTasks,
//! CancelTask, SubscribeToTask), [`push`] (the push notification config
//! operations). GetExtendedAgentCard is answered from [`Cards::extended`].
//! The media types a card accepts are checked on SendMessage and
//! SendStreamingMessage by the cards ([`crate::content`]), before anything
//! else is done with the message.

pub mod grpc;
pub mod grpc_server;
pub mod http_json;
pub mod jsonrpc;
pub mod pacing;
pub mod push;
pub mod send;
pub mod sse;
pub mod tasks;
pub mod v0_3;
pub mod validate;
pub mod web;

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;

use crate::auth::{Authenticator, Principal, Role};
use crate::discovery::{Cards, ServiceParameters};
use crate::error::A2aError;
use crate::lifecycle::TRANSITIONS_EXTENSION;
use crate::proto::{
    AgentCard, CancelTaskRequest, DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest, GetTaskPushNotificationConfigRequest, GetTaskRequest,
    ListTaskPushNotificationConfigsRequest, ListTaskPushNotificationConfigsResponse,
    ListTasksRequest, ListTasksResponse, SendMessageRequest, SendMessageResponse, StreamResponse,
    SubscribeToTaskRequest, Task, TaskPushNotificationConfig,
};
use crate::runtime::TaskManager;
use crate::store::{Caller, TaskRead};
use crate::telemetry::TraceParent;

pub use crate::bindings::{Binding, BindingSet};
pub use grpc::A2aGrpc;
pub use grpc_server::A2aGrpcServer;

/// A stream of A2A events, ending at the first error.
pub type EventStream = Pin<Box<dyn Stream<Item = Result<StreamResponse, A2aError>> + Send>>;

/// What a call says beside its request message, as its binding carried
/// it: gRPC metadata, or HTTP headers for the JSON bindings (spec §3.2.6,
/// §9.2, §10.2, §11.2); and what the connection knows of the caller.
#[derive(Clone, Debug, Default)]
pub struct CallContext {
    pub binding: Binding,
    /// The `authorization` value; `Some("")` for a value that is not
    /// visible ASCII (no credential).
    pub authorization: Option<String>,
    /// The principal a client certificate names, verified during the TLS
    /// handshake (`--tls-client-ca`).
    pub client_certificate: Option<String>,
    pub peer: Option<SocketAddr>,
    /// `A2A-Version` and `A2A-Extensions`.
    pub params: ServiceParameters,
    /// The caller's W3C `traceparent`.
    pub trace: Option<TraceParent>,
    /// The caller, authenticated from the headers before the body was read
    /// ([`A2aApi::authenticate_headers`]); `None`: not yet.
    pub principal: Option<Principal>,
    /// The protocol version the caller speaks: 1.0, or 0.3 for a call the
    /// 0.3 edge ([`v0_3`]) translated.
    pub protocol: crate::lifecycle::Protocol,
    /// How long the caller waits for the answer (gRPC's `grpc-timeout`);
    /// past it the call is DEADLINE_EXCEEDED, and a run it started goes
    /// on.
    pub deadline: Option<Duration>,
}

impl CallContext {
    /// The context of a call whose service parameters and credentials are
    /// HTTP headers (gRPC metadata is too).
    pub fn from_headers(binding: Binding, headers: &http::HeaderMap) -> Self {
        CallContext {
            binding,
            authorization: headers
                .get(http::header::AUTHORIZATION)
                .map(|v| v.to_str().unwrap_or("").to_owned()),
            params: ServiceParameters::from_headers(headers),
            ..Default::default()
        }
    }
}

/// The A2A operations over a [`TaskManager`], for every binding.
#[derive(Clone)]
pub struct A2aApi {
    manager: TaskManager,
    cards: Arc<Cards>,
    /// `--auth`: who may call, and which tenants each may use. `None`
    /// serves everyone (loopback only, unless the operator opens it).
    auth: Option<Arc<Authenticator>>,
    /// Push notifications are delivered, webhooks allowed by this policy;
    /// `None`: the push operations answer PUSH_NOTIFICATION_NOT_SUPPORTED.
    push: Option<Arc<crate::push::egress::Egress>>,
    /// ListTasks calls in progress per caller ([`tasks::Lists`]).
    lists: Arc<tasks::Lists>,
    /// The bytes each caller is sent per second ([`pacing`]).
    pacing: Arc<pacing::Pacing>,
}

impl A2aApi {
    pub fn new(manager: TaskManager, cards: Arc<Cards>) -> Self {
        A2aApi {
            manager,
            cards,
            auth: None,
            push: None,
            lists: Default::default(),
            pacing: Default::default(),
        }
    }

    /// Paces each caller to `bytes_per_second` of answers (0: off;
    /// [`pacing`]).
    pub fn with_read_pacing(mut self, bytes_per_second: u64) -> Self {
        self.pacing = Arc::new(pacing::Pacing::new(bytes_per_second));
        self
    }

    /// Who `call` is, for [`pacing`] and [`tasks::Lists`]: its principal,
    /// or without authentication its address.
    fn reader(call: &CallContext, caller: &Caller) -> pacing::Reader {
        if !caller.name.is_empty() {
            pacing::Reader::Principal(caller.name.clone())
        } else if let Some(peer) = call.peer {
            pacing::Reader::Peer(crate::connections::peer_key(peer.ip()))
        } else {
            pacing::Reader::Unknown
        }
    }

    /// Charges `reader` a unary call's `answer`. (The call is awaited where
    /// it is made, after [`pacing::Pacing::wait`], not handed to a helper:
    /// moving a send's future into another cost a copy of it, 11,400
    /// instructions per non-blocking send under callgrind.)
    fn charge<T: prost::Message>(&self, reader: &pacing::Reader, answer: T) -> T {
        self.pacing.charge(reader, answer.encoded_len());
        answer
    }

    /// Charges `reader` each event of `stream` as it is sent (the stream
    /// began once its caller was within its budget).
    fn charged(&self, reader: pacing::Reader, stream: EventStream) -> EventStream {
        use futures_util::StreamExt;
        let pacing = self.pacing.clone();
        Box::pin(stream.inspect(move |event| {
            if let Ok(event) = event {
                pacing.charge(&reader, prost::Message::encoded_len(event));
            }
        }))
    }

    /// Serves the push notification config operations, webhooks allowed
    /// by `egress` (delivery runs beside: `push::deliver::Dispatcher`).
    pub fn with_push(mut self, egress: Option<Arc<crate::push::egress::Egress>>) -> Self {
        self.push = egress;
        self
    }

    /// Requires every request to authenticate with `auth`.
    pub fn with_auth(mut self, auth: Option<Arc<Authenticator>>) -> Self {
        self.auth = auth;
        self
    }

    pub fn manager(&self) -> &TaskManager {
        &self.manager
    }

    pub fn cards(&self) -> &Arc<Cards> {
        &self.cards
    }

    /// The egress policy, or PUSH_NOTIFICATION_NOT_SUPPORTED (spec
    /// §3.3.4: the cards declare `capabilities.pushNotifications` false).
    fn push(&self) -> Result<&crate::push::egress::Egress, A2aError> {
        self.push
            .as_deref()
            .ok_or(A2aError::PushNotificationNotSupported)
    }

    /// Who is calling, before anything else about the request is looked
    /// at, so an unauthenticated caller learns nothing (spec §13.1): not
    /// which tenants exist, not whether a task does. A tenant the principal
    /// may not use is PERMISSION_DENIED whether or not it is served.
    /// Failures are logged with the peer and the reason, never the
    /// credential.
    async fn authenticate(
        &self,
        call: &CallContext,
        tenant: &str,
    ) -> Result<Option<Principal>, A2aError> {
        let Some(auth) = &self.auth else {
            return Ok(None);
        };
        let authenticated = match &call.principal {
            Some(principal) => Ok(principal.clone()),
            None => auth.authenticate_request(
                call.authorization.as_deref(),
                call.client_certificate.as_deref(),
            ),
        };
        match authenticated {
            Ok(principal) if principal.may_use(tenant) => Ok(Some(principal)),
            Ok(principal) => {
                // Not yet validated: as long as the caller made it.
                let tenant = crate::error::cut(tenant, crate::error::MAX_ECHO_BYTES);
                tracing::warn!(peer = call.peer.map(tracing::field::display), principal = %principal.name, %tenant, "tenant not permitted");
                Err(A2aError::PermissionDenied {
                    principal: principal.name,
                    tenant: tenant.into_owned(),
                })
            }
            Err(e) => {
                let metrics = self.manager.metrics().map(|m| &**m);
                auth.refused(call.peer, call.binding.name(), &e, metrics)
                    .await;
                Err(A2aError::Unauthenticated(e.to_string()))
            }
        }
    }

    /// Authenticates the call from its headers (its credential, its
    /// connection's client certificate) before its body is read, and keeps
    /// the principal for the call's checks: a caller without credentials
    /// makes the server read and hold nothing. Nothing to do without
    /// `--auth`. Each binding calls it before reading a body.
    pub async fn authenticate_headers(&self, call: &mut CallContext) -> Result<(), A2aError> {
        let Some(auth) = &self.auth else {
            return Ok(());
        };
        match auth.authenticate_request(
            call.authorization.as_deref(),
            call.client_certificate.as_deref(),
        ) {
            Ok(principal) => {
                call.principal = Some(principal);
                Ok(())
            }
            Err(e) => {
                let metrics = self.manager.metrics().map(|m| &**m);
                auth.refused(call.peer, call.binding.name(), &e, metrics)
                    .await;
                Err(A2aError::Unauthenticated(e.to_string()))
            }
        }
    }

    /// Whether calls are authenticated (`--auth`).
    pub fn authenticates(&self) -> bool {
        self.auth.is_some()
    }

    /// The caller (see [`A2aApi::authenticate`]), then the version,
    /// extensions and capability rules (see [`Cards::check`]), before
    /// anything else about the request.
    /// The call's `tenant` and `task_id` are recorded in its span first
    /// ([`crate::telemetry`]).
    async fn check(
        &self,
        call: &CallContext,
        tenant: &str,
        task_id: &str,
        streaming: bool,
    ) -> Result<Caller, A2aError> {
        crate::telemetry::record_call(tenant, task_id, "");
        let principal = self.authenticate(call, tenant).await?;
        self.cards.check(&call.params, tenant, streaming)?;
        Ok(caller(principal))
    }

    /// [`A2aApi::check`] for SendMessage and SendStreamingMessage, plus the
    /// media types of the message's parts ([`Cards::check_send`]).
    async fn check_send(
        &self,
        call: &CallContext,
        send: &SendMessageRequest,
        streaming: bool,
    ) -> Result<Caller, A2aError> {
        // The task and context: once the runtime has them.
        crate::telemetry::record_call(&send.tenant, "", "");
        let principal = self.authenticate(call, &send.tenant).await?;
        self.cards
            .check_send(&call.params, &send.tenant, streaming, send.message.as_ref())?;
        Ok(caller(principal))
    }

    /// SendMessage (spec §3.1.1).
    pub async fn send_message(
        &self,
        call: &CallContext,
        request: SendMessageRequest,
    ) -> Result<SendMessageResponse, A2aError> {
        within(
            call,
            Box::pin(async {
                let caller = self.check_send(call, &request, false).await?;
                let push = self.push.as_deref();
                let reader = Self::reader(call, &caller);
                self.pacing.wait(&reader).await;
                let sent = send::send_message(&self.manager, &caller, push, call, request).await?;
                Ok(self.charge(&reader, sent))
            }),
        )
        .await
    }

    /// SendStreamingMessage (spec §3.1.2). The deadline covers the call up
    /// to its first event.
    pub async fn send_streaming_message(
        &self,
        call: &CallContext,
        request: SendMessageRequest,
    ) -> Result<EventStream, A2aError> {
        within(
            call,
            Box::pin(async {
                let caller = self.check_send(call, &request, true).await?;
                let push = self.push.as_deref();
                let reader = Self::reader(call, &caller);
                self.pacing.wait(&reader).await;
                let stream =
                    send::send_streaming_message(&self.manager, &caller, push, call, request)
                        .await?;
                Ok(self.charged(reader, stream))
            }),
        )
        .await
    }

    /// GetTask (spec §3.1.3).
    pub async fn get_task(
        &self,
        call: &CallContext,
        request: GetTaskRequest,
    ) -> Result<Task, A2aError> {
        self.read_task(call, request)
            .await?
            .into_task()
            .map_err(crate::runtime::store_error)
    }

    /// GetTask, the task as the store keeps it: its encoding when the
    /// store has it ([`TaskRead::Encoded`]), for the gRPC binding, which
    /// answers with those bytes as they are.
    pub async fn read_task(
        &self,
        call: &CallContext,
        request: GetTaskRequest,
    ) -> Result<TaskRead, A2aError> {
        within(
            call,
            Box::pin(async {
                let caller = self
                    .check(call, &request.tenant, &request.id, false)
                    .await?;
                let reader = Self::reader(call, &caller);
                self.pacing.wait(&reader).await;
                let transitions = call.params.activates(TRANSITIONS_EXTENSION);
                let task = tasks::get_task(&self.manager, &caller, request, transitions).await?;
                self.pacing.charge(&reader, task.encoded_len());
                Ok(task)
            }),
        )
        .await
    }

    /// ListTasks (spec §3.1.4).
    pub async fn list_tasks(
        &self,
        call: &CallContext,
        request: ListTasksRequest,
    ) -> Result<ListTasksResponse, A2aError> {
        within(
            call,
            Box::pin(async {
                let caller = self.check(call, &request.tenant, "", false).await?;
                let reader = Self::reader(call, &caller);
                let _turn = self.lists.turn(&reader).await;
                self.pacing.wait(&reader).await;
                let page = tasks::list_tasks(&self.manager, &caller, request).await?;
                self.pacing.charge(&reader, pacing::list_cost(&page));
                Ok(page)
            }),
        )
        .await
    }

    /// CancelTask (spec §3.1.5).
    pub async fn cancel_task(
        &self,
        call: &CallContext,
        request: CancelTaskRequest,
    ) -> Result<Task, A2aError> {
        within(
            call,
            Box::pin(async {
                let caller = self
                    .check(call, &request.tenant, &request.id, false)
                    .await?;
                let reader = Self::reader(call, &caller);
                self.pacing.wait(&reader).await;
                let task = tasks::cancel_task(&self.manager, &caller, request).await?;
                Ok(self.charge(&reader, task))
            }),
        )
        .await
    }

    /// SubscribeToTask (spec §3.1.6).
    pub async fn subscribe_to_task(
        &self,
        call: &CallContext,
        request: SubscribeToTaskRequest,
    ) -> Result<EventStream, A2aError> {
        within(
            call,
            Box::pin(async {
                let caller = self.check(call, &request.tenant, &request.id, true).await?;
                let reader = Self::reader(call, &caller);
                self.pacing.wait(&reader).await;
                let stream = tasks::subscribe_to_task(&self.manager, &caller, request).await?;
                Ok(self.charged(reader, stream))
            }),
        )
        .await
    }

    /// CreateTaskPushNotificationConfig (spec §3.1.7).
    pub async fn create_task_push_notification_config(
        &self,
        call: &CallContext,
        request: TaskPushNotificationConfig,
    ) -> Result<TaskPushNotificationConfig, A2aError> {
        within(
            call,
            Box::pin(async {
                let caller = self
                    .check(call, &request.tenant, &request.task_id, false)
                    .await?;
                push::create(&self.manager, &caller, self.push()?, request, call.protocol).await
            }),
        )
        .await
    }

    /// GetTaskPushNotificationConfig (spec §3.1.8).
    pub async fn get_task_push_notification_config(
        &self,
        call: &CallContext,
        request: GetTaskPushNotificationConfigRequest,
    ) -> Result<TaskPushNotificationConfig, A2aError> {
        within(
            call,
            Box::pin(async {
                let caller = self
                    .check(call, &request.tenant, &request.task_id, false)
                    .await?;
                self.push()?;
                push::get(&self.manager, &caller, request).await
            }),
        )
        .await
    }

    /// ListTaskPushNotificationConfigs (spec §3.1.9).
    pub async fn list_task_push_notification_configs(
        &self,
        call: &CallContext,
        request: ListTaskPushNotificationConfigsRequest,
    ) -> Result<ListTaskPushNotificationConfigsResponse, A2aError> {
        within(
            call,
            Box::pin(async {
                let caller = self
                    .check(call, &request.tenant, &request.task_id, false)
                    .await?;
                self.push()?;
                push::list(&self.manager, &caller, request).await
            }),
        )
        .await
    }

    /// DeleteTaskPushNotificationConfig (spec §3.1.10).
    pub async fn delete_task_push_notification_config(
        &self,
        call: &CallContext,
        request: DeleteTaskPushNotificationConfigRequest,
    ) -> Result<(), A2aError> {
        within(
            call,
            Box::pin(async {
                let caller = self
                    .check(call, &request.tenant, &request.task_id, false)
                    .await?;
                self.push()?;
                push::delete(&self.manager, &caller, request).await
            }),
        )
        .await
    }

    /// GetExtendedAgentCard (spec §3.1.11): authenticated like every
    /// operation (spec §13.3).
    pub async fn get_extended_agent_card(
        &self,
        call: &CallContext,
        request: GetExtendedAgentCardRequest,
    ) -> Result<AgentCard, A2aError> {
        within(
            call,
            Box::pin(async {
                self.check(call, &request.tenant, "", false).await?;
                self.cards.extended(&request.tenant)
            }),
        )
        .await
    }
}

/// `operation`, or DEADLINE_EXCEEDED once the caller's deadline passes
/// (dropping it: what it started in the runtime, a run, goes on).
///
/// The operation comes boxed: an operation's future is large (a send's
/// holds the runtime's), and every layer that holds it by value copies it
/// when it is moved (measured with callgrind: 15,000 instructions of
/// `memcpy` per gRPC send before the box).
async fn within<T>(
    call: &CallContext,
    operation: Pin<Box<dyn Future<Output = Result<T, A2aError>> + Send + '_>>,
) -> Result<T, A2aError> {
    match call.deadline {
        None => operation.await,
        Some(deadline) => tokio::time::timeout(deadline, operation)
            .await
            .unwrap_or(Err(A2aError::DeadlineExceeded { deadline })),
    }
}

/// Requests that name the tenant, which a `/{tenant}` endpoint fills in.
pub(crate) trait Tenanted {
    fn tenant_mut(&mut self) -> &mut String;
}

macro_rules! tenanted {
    ($($t:ty),*) => {$(
        impl Tenanted for $t {
            fn tenant_mut(&mut self) -> &mut String {
                &mut self.tenant
            }
        }
    )*};
}

tenanted!(
    crate::proto::SendMessageRequest,
    crate::proto::GetTaskRequest,
    crate::proto::ListTasksRequest,
    crate::proto::CancelTaskRequest,
    crate::proto::SubscribeToTaskRequest,
    crate::proto::TaskPushNotificationConfig,
    crate::proto::GetTaskPushNotificationConfigRequest,
    crate::proto::ListTaskPushNotificationConfigsRequest,
    crate::proto::DeleteTaskPushNotificationConfigRequest,
    crate::proto::GetExtendedAgentCardRequest
);

/// Whom the runtime acts for (spec §13.1): a `user` sees only the tasks it
/// created, an `admin` every task of the tenants it may use; without
/// `--auth` everyone is the anonymous caller, who sees every task.
fn caller(principal: Option<Principal>) -> Caller {
    match principal {
        None => Caller::ANONYMOUS,
        Some(p) => Caller {
            own_tasks_only: p.role == Role::User,
            name: p.name,
            quota: p.quota,
        },
    }
}
