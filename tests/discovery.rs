//! gRPC server reflection (v1 and v1alpha) and the standard health service,
//! as grpcurl and load balancers use them.

mod support;

use prost::Message as _;
use prost_types::FileDescriptorProto;
use tokio_stream::StreamExt;

use support::*;

#[tokio::test]
async fn reflection_v1_lists_services_and_describes_task_state() {
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let server = TestServer::start().await;
    let mut client = ServerReflectionClient::new(server.channel().await);
    let requests = tokio_stream::iter([
        ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        },
        ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::FileContainingSymbol(
                "lf.a2a.v1.TaskState".into(),
            )),
        },
    ]);
    let mut responses = client
        .server_reflection_info(requests)
        .await
        .unwrap()
        .into_inner();

    let list = responses.next().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(services)) = list.message_response else {
        panic!("{list:?}")
    };
    let names: Vec<_> = services.service.iter().map(|s| s.name.as_str()).collect();
    assert!(names.contains(&"lf.a2a.v1.A2AService"), "{names:?}");
    assert!(names.contains(&"grpc.health.v1.Health"), "{names:?}");

    let file = responses.next().await.unwrap().unwrap();
    let Some(MessageResponse::FileDescriptorResponse(files)) = file.message_response else {
        panic!("{file:?}")
    };
    let a2a = files
        .file_descriptor_proto
        .iter()
        .map(|b| FileDescriptorProto::decode(b.as_slice()).unwrap())
        .find(|f| f.package() == "lf.a2a.v1")
        .expect("a2a.proto served");
    let task_state = a2a
        .enum_type
        .iter()
        .find(|e| e.name() == "TaskState")
        .unwrap();
    let values: Vec<_> = task_state
        .value
        .iter()
        .map(|v| (v.name(), v.number()))
        .collect();
    assert_eq!(values.len(), 9);
    assert_eq!(values[0], ("TASK_STATE_UNSPECIFIED", 0));
    assert_eq!(values[8], ("TASK_STATE_AUTH_REQUIRED", 8));
    server.stop().await;
}

#[tokio::test]
async fn reflection_v1alpha_lists_services() {
    use tonic_reflection::pb::v1alpha::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let server = TestServer::start().await;
    let mut client = ServerReflectionClient::new(server.channel().await);
    let requests = tokio_stream::iter([ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    }]);
    let mut responses = client
        .server_reflection_info(requests)
        .await
        .unwrap()
        .into_inner();
    let list = responses.next().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(services)) = list.message_response else {
        panic!("{list:?}")
    };
    assert!(
        services
            .service
            .iter()
            .any(|s| s.name == "lf.a2a.v1.A2AService")
    );
    server.stop().await;
}

#[tokio::test]
async fn health_reports_serving() {
    use tonic_health::pb::{
        HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
    };
    let server = TestServer::start().await;
    let mut client = HealthClient::new(server.channel().await);
    for service in ["", "lf.a2a.v1.A2AService"] {
        let resp = client
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(resp.status(), ServingStatus::Serving, "{service:?}");
    }
    server.stop().await;
}
