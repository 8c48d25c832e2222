//! The tonic `A2AService`: check the protocol rules the cards set (version,
//! extensions, capabilities: [`Cards::check`]), decode and validate a
//! request, hand it to the [`TaskManager`], map the result and errors to
//! gRPC.
//!
//! One file per concern: [`validate`] (input rules and limits),
//! [`send`] (SendMessage, SendStreamingMessage), [`tasks`] (GetTask,
//! ListTasks, CancelTask, SubscribeToTask), [`unsupported`] (push config
//! RPCs this server does not offer). GetExtendedAgentCard is answered from
//! [`Cards::extended`]. The media types a card accepts are checked on
//! SendMessage and SendStreamingMessage by the cards ([`crate::content`]),
//! before anything else is done with the message.

pub mod push;
pub mod send;
pub mod tasks;
pub mod unsupported;
pub mod validate;

use std::pin::Pin;
use std::sync::Arc;

use futures_util::Stream;
use tonic::{Request, Response, Status};

use crate::auth::{Authenticator, Principal, Role};
use crate::connections::ClientCertificate;
use crate::discovery::Cards;
use crate::error::A2aError;
use crate::proto::a2a_service_server::A2aService;
use crate::proto::{
    AgentCard, CancelTaskRequest, DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest, GetTaskPushNotificationConfigRequest, GetTaskRequest,
    ListTaskPushNotificationConfigsRequest, ListTaskPushNotificationConfigsResponse,
    ListTasksRequest, ListTasksResponse, SendMessageRequest, SendMessageResponse, StreamResponse,
    SubscribeToTaskRequest, Task, TaskPushNotificationConfig,
};
use crate::runtime::TaskManager;
use crate::store::Caller;

/// A server stream of A2A events.
pub type EventStream = Pin<Box<dyn Stream<Item = Result<StreamResponse, Status>> + Send>>;

/// The A2A gRPC service over a [`TaskManager`].
#[derive(Clone)]
pub struct A2aGrpc {
    manager: TaskManager,
    cards: Arc<Cards>,
    /// `--auth`: who may call, and which tenants each may use. `None`
    /// serves everyone (loopback only, unless the operator opens it).
    auth: Option<Arc<Authenticator>>,
    /// Push notifications are delivered, webhooks allowed by this policy;
    /// `None`: the push RPCs answer PUSH_NOTIFICATION_NOT_SUPPORTED.
    push: Option<Arc<crate::push::egress::Egress>>,
}

impl A2aGrpc {
    pub fn new(manager: TaskManager, cards: Arc<Cards>) -> Self {
        A2aGrpc {
            manager,
            cards,
            auth: None,
            push: None,
        }
    }

    /// Serves the push notification config RPCs, webhooks allowed by
    /// `egress` (delivery runs beside: `push::deliver::Dispatcher`).
    pub fn with_push(mut self, egress: Option<Arc<crate::push::egress::Egress>>) -> Self {
        self.push = egress;
        self
    }

    /// The egress policy, or PUSH_NOTIFICATION_NOT_SUPPORTED.
    fn push(&self) -> Result<&crate::push::egress::Egress, Status> {
        self.push
            .as_deref()
            .ok_or_else(unsupported::push_not_supported)
    }

    /// Requires every request to authenticate with `auth`.
    pub fn with_auth(mut self, auth: Option<Arc<Authenticator>>) -> Self {
        self.auth = auth;
        self
    }

    /// Who is calling, before anything else about the request is looked
    /// at, so an unauthenticated caller learns nothing (spec §13.1): not
    /// which tenants exist, not whether a task does. A tenant the principal
    /// may not use is PERMISSION_DENIED whether or not it is served.
    /// Failures are logged with the peer and the reason, never the
    /// credential.
    async fn authenticate<T: Sync>(
        &self,
        request: &Request<T>,
        tenant: &str,
    ) -> Result<Option<Principal>, Status> {
        let Some(auth) = &self.auth else {
            return Ok(None);
        };
        // A value that is not visible ASCII is no credential.
        let value = request
            .metadata()
            .get("authorization")
            .map(|v| v.to_str().unwrap_or(""));
        // Verified during the TLS handshake (`--tls-client-ca`).
        let certificate = request
            .extensions()
            .get::<ClientCertificate>()
            .map(|c| c.name.as_str());
        match auth.authenticate_request(value, certificate) {
            Ok(principal) if principal.may_use(tenant) => Ok(Some(principal)),
            Ok(principal) => {
                tracing::warn!(peer = ?request.remote_addr(), principal = %principal.name, tenant, "tenant not permitted");
                Err(A2aError::PermissionDenied {
                    principal: principal.name,
                    tenant: tenant.to_owned(),
                }
                .into())
            }
            Err(e) => {
                let peer = request.remote_addr();
                tracing::warn!(peer = ?peer, reason = %e, "authentication failed");
                if let Some(metrics) = self.manager.metrics() {
                    metrics.auth.failed(e.kind());
                }
                // Past a few failures, a peer waits for each answer.
                if let Some(peer) = peer {
                    let delay = auth.failed(peer.ip());
                    if !delay.is_zero() {
                        tokio::time::sleep(delay).await;
                    }
                }
                Err(A2aError::Unauthenticated(e.to_string()).into())
            }
        }
    }

    /// The caller (see [`A2aGrpc::authenticate`]), then the version,
    /// extensions and capability rules (see [`Cards::check`]), before
    /// anything else about the request.
    /// The call's `tenant` and `task_id` are recorded in its span first
    /// ([`crate::telemetry`]).
    async fn check<T: Sync>(
        &self,
        request: &Request<T>,
        tenant: &str,
        task_id: &str,
        streaming: bool,
    ) -> Result<Caller, Status> {
        crate::telemetry::record_call(tenant, task_id, "");
        let principal = self.authenticate(request, tenant).await?;
        self.cards.check(request.metadata(), tenant, streaming)?;
        Ok(caller(principal))
    }

    /// [`A2aGrpc::check`] for SendMessage and SendStreamingMessage, plus the
    /// media types of the message's parts ([`Cards::check_send`]).
    async fn check_send(
        &self,
        request: &Request<SendMessageRequest>,
        streaming: bool,
    ) -> Result<Caller, Status> {
        let send = request.get_ref();
        // The task and context: once the runtime has them.
        crate::telemetry::record_call(&send.tenant, "", "");
        let principal = self.authenticate(request, &send.tenant).await?;
        self.cards.check_send(
            request.metadata(),
            &send.tenant,
            streaming,
            send.message.as_ref(),
        )?;
        Ok(caller(principal))
    }
}

/// Whom the runtime acts for (spec §13.1): a `user` sees only the tasks it
/// created, an `admin` every task of the tenants it may use; without
/// `--auth` everyone is the anonymous caller, who sees every task.
fn caller(principal: Option<Principal>) -> Caller {
    match principal {
        None => Caller::ANONYMOUS,
        Some(p) => Caller {
            own_tasks_only: p.role == Role::User,
            name: p.name,
        },
    }
}

#[tonic::async_trait]
impl A2aService for A2aGrpc {
    async fn send_message(
        &self,
        request: Request<SendMessageRequest>,
    ) -> Result<Response<SendMessageResponse>, Status> {
        let caller = self.check_send(&request, false).await?;
        let push = self.push.as_deref();
        let trace = request.extensions().get().copied();
        send::send_message(&self.manager, &caller, push, trace, request.into_inner()).await
    }

    type SendStreamingMessageStream = EventStream;

    async fn send_streaming_message(
        &self,
        request: Request<SendMessageRequest>,
    ) -> Result<Response<EventStream>, Status> {
        let caller = self.check_send(&request, true).await?;
        let push = self.push.as_deref();
        let trace = request.extensions().get().copied();
        send::send_streaming_message(&self.manager, &caller, push, trace, request.into_inner())
            .await
    }

    async fn get_task(&self, request: Request<GetTaskRequest>) -> Result<Response<Task>, Status> {
        let caller = self
            .check(
                &request,
                &request.get_ref().tenant,
                &request.get_ref().id,
                false,
            )
            .await?;
        tasks::get_task(&self.manager, &caller, request.into_inner()).await
    }

    async fn list_tasks(
        &self,
        request: Request<ListTasksRequest>,
    ) -> Result<Response<ListTasksResponse>, Status> {
        let caller = self
            .check(&request, &request.get_ref().tenant, "", false)
            .await?;
        tasks::list_tasks(&self.manager, &caller, request.into_inner()).await
    }

    async fn cancel_task(
        &self,
        request: Request<CancelTaskRequest>,
    ) -> Result<Response<Task>, Status> {
        let caller = self
            .check(
                &request,
                &request.get_ref().tenant,
                &request.get_ref().id,
                false,
            )
            .await?;
        tasks::cancel_task(&self.manager, &caller, request.into_inner()).await
    }

    type SubscribeToTaskStream = EventStream;

    async fn subscribe_to_task(
        &self,
        request: Request<SubscribeToTaskRequest>,
    ) -> Result<Response<EventStream>, Status> {
        let caller = self
            .check(
                &request,
                &request.get_ref().tenant,
                &request.get_ref().id,
                true,
            )
            .await?;
        tasks::subscribe_to_task(&self.manager, &caller, request.into_inner()).await
    }

    async fn create_task_push_notification_config(
        &self,
        request: Request<TaskPushNotificationConfig>,
    ) -> Result<Response<TaskPushNotificationConfig>, Status> {
        let caller = self
            .check(
                &request,
                &request.get_ref().tenant,
                &request.get_ref().task_id,
                false,
            )
            .await?;
        push::create(&self.manager, &caller, self.push()?, request.into_inner()).await
    }

    async fn get_task_push_notification_config(
        &self,
        request: Request<GetTaskPushNotificationConfigRequest>,
    ) -> Result<Response<TaskPushNotificationConfig>, Status> {
        let caller = self
            .check(
                &request,
                &request.get_ref().tenant,
                &request.get_ref().task_id,
                false,
            )
            .await?;
        self.push()?;
        push::get(&self.manager, &caller, request.into_inner()).await
    }

    async fn list_task_push_notification_configs(
        &self,
        request: Request<ListTaskPushNotificationConfigsRequest>,
    ) -> Result<Response<ListTaskPushNotificationConfigsResponse>, Status> {
        let caller = self
            .check(
                &request,
                &request.get_ref().tenant,
                &request.get_ref().task_id,
                false,
            )
            .await?;
        self.push()?;
        push::list(&self.manager, &caller, request.into_inner()).await
    }

    async fn get_extended_agent_card(
        &self,
        request: Request<GetExtendedAgentCardRequest>,
    ) -> Result<Response<AgentCard>, Status> {
        let tenant = &request.get_ref().tenant;
        self.check(&request, tenant, "", false).await?;
        Ok(Response::new(self.cards.extended(tenant)?))
    }

    async fn delete_task_push_notification_config(
        &self,
        request: Request<DeleteTaskPushNotificationConfigRequest>,
    ) -> Result<Response<()>, Status> {
        let caller = self
            .check(
                &request,
                &request.get_ref().tenant,
                &request.get_ref().task_id,
                false,
            )
            .await?;
        self.push()?;
        push::delete(&self.manager, &caller, request.into_inner()).await
    }
}
