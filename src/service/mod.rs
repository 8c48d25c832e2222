//! The tonic `A2AService`: decode and validate a request, hand it to the
//! [`TaskManager`], map the result and errors to gRPC.
//!
//! One file per concern: [`validate`] (input rules and limits),
//! [`send`] (SendMessage, SendStreamingMessage), [`tasks`] (GetTask,
//! ListTasks, CancelTask, SubscribeToTask), [`unsupported`] (push config and
//! extended card RPCs this agent does not offer).

pub mod send;
pub mod tasks;
pub mod unsupported;
pub mod validate;

use std::pin::Pin;

use futures_util::Stream;
use tonic::{Request, Response, Status};

use crate::proto::a2a_service_server::A2aService;
use crate::proto::{
    AgentCard, CancelTaskRequest, DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest, GetTaskPushNotificationConfigRequest, GetTaskRequest,
    ListTaskPushNotificationConfigsRequest, ListTaskPushNotificationConfigsResponse,
    ListTasksRequest, ListTasksResponse, SendMessageRequest, SendMessageResponse, StreamResponse,
    SubscribeToTaskRequest, Task, TaskPushNotificationConfig,
};
use crate::runtime::TaskManager;

/// A server stream of A2A events.
pub type EventStream = Pin<Box<dyn Stream<Item = Result<StreamResponse, Status>> + Send>>;

/// The A2A gRPC service over a [`TaskManager`].
#[derive(Clone)]
pub struct A2aGrpc {
    manager: TaskManager,
}

impl A2aGrpc {
    pub fn new(manager: TaskManager) -> Self {
        A2aGrpc { manager }
    }
}

#[tonic::async_trait]
impl A2aService for A2aGrpc {
    async fn send_message(
        &self,
        request: Request<SendMessageRequest>,
    ) -> Result<Response<SendMessageResponse>, Status> {
        send::send_message(&self.manager, request.into_inner()).await
    }

    type SendStreamingMessageStream = EventStream;

    async fn send_streaming_message(
        &self,
        request: Request<SendMessageRequest>,
    ) -> Result<Response<EventStream>, Status> {
        send::send_streaming_message(&self.manager, request.into_inner()).await
    }

    async fn get_task(&self, request: Request<GetTaskRequest>) -> Result<Response<Task>, Status> {
        tasks::get_task(&self.manager, request.into_inner()).await
    }

    async fn list_tasks(
        &self,
        request: Request<ListTasksRequest>,
    ) -> Result<Response<ListTasksResponse>, Status> {
        tasks::list_tasks(&self.manager, request.into_inner()).await
    }

    async fn cancel_task(
        &self,
        request: Request<CancelTaskRequest>,
    ) -> Result<Response<Task>, Status> {
        tasks::cancel_task(&self.manager, request.into_inner()).await
    }

    type SubscribeToTaskStream = EventStream;

    async fn subscribe_to_task(
        &self,
        request: Request<SubscribeToTaskRequest>,
    ) -> Result<Response<EventStream>, Status> {
        tasks::subscribe_to_task(&self.manager, request.into_inner()).await
    }

    async fn create_task_push_notification_config(
        &self,
        _request: Request<TaskPushNotificationConfig>,
    ) -> Result<Response<TaskPushNotificationConfig>, Status> {
        Err(unsupported::push_not_supported())
    }

    async fn get_task_push_notification_config(
        &self,
        _request: Request<GetTaskPushNotificationConfigRequest>,
    ) -> Result<Response<TaskPushNotificationConfig>, Status> {
        Err(unsupported::push_not_supported())
    }

    async fn list_task_push_notification_configs(
        &self,
        _request: Request<ListTaskPushNotificationConfigsRequest>,
    ) -> Result<Response<ListTaskPushNotificationConfigsResponse>, Status> {
        Err(unsupported::push_not_supported())
    }

    async fn get_extended_agent_card(
        &self,
        _request: Request<GetExtendedAgentCardRequest>,
    ) -> Result<Response<AgentCard>, Status> {
        Err(unsupported::extended_card_not_supported())
    }

    async fn delete_task_push_notification_config(
        &self,
        _request: Request<DeleteTaskPushNotificationConfigRequest>,
    ) -> Result<Response<()>, Status> {
        Err(unsupported::push_not_supported())
    }
}
