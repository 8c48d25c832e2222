//! The 0.3 gRPC service, `a2a.v1.A2AService` (`proto/a2a_v0_3.proto`),
//! beside 1.0's `lf.a2a.v1.A2AService` on the same port: each RPC's 0.3
//! request becomes the 1.0 request (`pb`), the 1.0 answer and events go
//! back in 0.3 types, errors are the same gRPC statuses and details as
//! 1.0's. The two are told apart by the service in the call's path.

use futures_util::StreamExt;
use tonic::{Request, Response, Status};

use super::pb;
use crate::error::A2aError;
use crate::proto::v0_3 as old;
use crate::proto::v0_3::a2a_service_server::A2aService;
use crate::proto::{self};
use crate::service::{A2aApi, CallContext};

/// A server stream of 0.3 events.
pub type OldEventStream =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<old::StreamResponse, Status>> + Send>>;

/// The 0.3 gRPC service over the one API.
#[derive(Clone)]
pub struct A2aGrpcV03 {
    api: A2aApi,
}

impl A2aGrpcV03 {
    pub fn new(api: A2aApi) -> Self {
        A2aGrpcV03 { api }
    }

    /// The call's context, checked for 0.3 (spec §3.6.2).
    fn call<T>(&self, request: &Request<T>) -> Result<CallContext, Status> {
        let call = crate::service::grpc::context(request);
        Ok(super::jsonrpc::call_for(&self.api, &call)?)
    }
}

fn streamed(events: crate::service::EventStream) -> Response<OldEventStream> {
    let mut out = pb::PbStreamOut::default();
    Response::new(Box::pin(events.map(move |event| {
        event
            .and_then(|event| out.event(event))
            .map_err(Status::from)
    })))
}

#[tonic::async_trait]
impl A2aService for A2aGrpcV03 {
    async fn send_message(
        &self,
        request: Request<old::SendMessageRequest>,
    ) -> Result<Response<old::SendMessageResponse>, Status> {
        let call = self.call(&request)?;
        let request = pb::send_in(request.into_inner(), "")?;
        let answer = self.api.send_message(&call, request).await?;
        Ok(Response::new(pb::send_response_out(answer)))
    }

    type SendStreamingMessageStream = OldEventStream;

    async fn send_streaming_message(
        &self,
        request: Request<old::SendMessageRequest>,
    ) -> Result<Response<OldEventStream>, Status> {
        let call = self.call(&request)?;
        let request = pb::send_in(request.into_inner(), "")?;
        Ok(streamed(
            self.api.send_streaming_message(&call, request).await?,
        ))
    }

    async fn get_task(
        &self,
        request: Request<old::GetTaskRequest>,
    ) -> Result<Response<old::Task>, Status> {
        let call = self.call(&request)?;
        let request = request.into_inner();
        let request = proto::GetTaskRequest {
            tenant: String::new(),
            id: pb::task_id(&request.name, "name")?,
            history_length: (request.history_length != 0).then_some(request.history_length),
        };
        Ok(Response::new(pb::task_out(
            self.api.get_task(&call, request).await?,
        )))
    }

    async fn cancel_task(
        &self,
        request: Request<old::CancelTaskRequest>,
    ) -> Result<Response<old::Task>, Status> {
        let call = self.call(&request)?;
        let request = proto::CancelTaskRequest {
            tenant: String::new(),
            id: pb::task_id(&request.into_inner().name, "name")?,
            metadata: None,
        };
        Ok(Response::new(pb::task_out(
            self.api.cancel_task(&call, request).await?,
        )))
    }

    type TaskSubscriptionStream = OldEventStream;

    async fn task_subscription(
        &self,
        request: Request<old::TaskSubscriptionRequest>,
    ) -> Result<Response<OldEventStream>, Status> {
        let call = self.call(&request)?;
        let request = proto::SubscribeToTaskRequest {
            tenant: String::new(),
            id: pb::task_id(&request.into_inner().name, "name")?,
        };
        Ok(streamed(self.api.subscribe_to_task(&call, request).await?))
    }

    async fn create_task_push_notification_config(
        &self,
        request: Request<old::CreateTaskPushNotificationConfigRequest>,
    ) -> Result<Response<old::TaskPushNotificationConfig>, Status> {
        let call = self.call(&request)?;
        let request = request.into_inner();
        let task_id = pb::task_id(&request.parent, "parent")?;
        let mut push = request
            .config
            .and_then(|c| c.push_notification_config)
            .ok_or_else(|| {
                A2aError::invalid("config.pushNotificationConfig", "the config is required")
            })?;
        if push.id.is_empty() {
            push.id = request.config_id;
        }
        let config = pb::push_config_in(push, task_id, "");
        let made = self
            .api
            .create_task_push_notification_config(&call, config)
            .await?;
        Ok(Response::new(pb::push_config_out(made)))
    }

    async fn get_task_push_notification_config(
        &self,
        request: Request<old::GetTaskPushNotificationConfigRequest>,
    ) -> Result<Response<old::TaskPushNotificationConfig>, Status> {
        let call = self.call(&request)?;
        let (task_id, id) = pb::config_name(&request.into_inner().name, "name")?;
        let request = proto::GetTaskPushNotificationConfigRequest {
            tenant: String::new(),
            task_id,
            id,
        };
        Ok(Response::new(pb::push_config_out(
            self.api
                .get_task_push_notification_config(&call, request)
                .await?,
        )))
    }

    async fn list_task_push_notification_config(
        &self,
        request: Request<old::ListTaskPushNotificationConfigRequest>,
    ) -> Result<Response<old::ListTaskPushNotificationConfigResponse>, Status> {
        let call = self.call(&request)?;
        let request = request.into_inner();
        let request = proto::ListTaskPushNotificationConfigsRequest {
            tenant: String::new(),
            task_id: pb::task_id(&request.parent, "parent")?,
            page_size: request.page_size,
            page_token: request.page_token,
        };
        let page = self
            .api
            .list_task_push_notification_configs(&call, request)
            .await?;
        Ok(Response::new(old::ListTaskPushNotificationConfigResponse {
            configs: page.configs.into_iter().map(pb::push_config_out).collect(),
            next_page_token: page.next_page_token,
        }))
    }

    async fn get_agent_card(
        &self,
        request: Request<old::GetAgentCardRequest>,
    ) -> Result<Response<old::AgentCard>, Status> {
        // A 0.3 gRPC client asks for the card when the one it read says
        // `supportsAuthenticatedExtendedCard`: the extended card then,
        // else the public one; in 0.3's form with the 0.3 interfaces.
        let call = self.call(&request)?;
        let cards = self.api.cards();
        let public = cards
            .card("")
            .ok_or_else(|| A2aError::invalid("tenant", "no agent is served without a tenant"))?;
        let extended = public
            .capabilities
            .as_ref()
            .and_then(|c| c.extended_agent_card)
            .unwrap_or(false);
        let card = if extended {
            let request = proto::GetExtendedAgentCardRequest::default();
            self.api.get_extended_agent_card(&call, request).await?
        } else {
            public.clone()
        };
        Ok(Response::new(pb::card_out(
            &card,
            &cards.v03_interfaces(""),
        )))
    }

    async fn delete_task_push_notification_config(
        &self,
        request: Request<old::DeleteTaskPushNotificationConfigRequest>,
    ) -> Result<Response<()>, Status> {
        let call = self.call(&request)?;
        let (task_id, id) = pb::config_name(&request.into_inner().name, "name")?;
        let request = proto::DeleteTaskPushNotificationConfigRequest {
            tenant: String::new(),
            task_id,
            id,
        };
        self.api
            .delete_task_push_notification_config(&call, request)
            .await?;
        Ok(Response::new(()))
    }
}
