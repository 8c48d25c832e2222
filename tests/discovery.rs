//! gRPC server reflection (v1 and v1alpha) and the standard health service,
//! as grpcurl and load balancers use them.

use crate::support;

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

/// The descriptors of the files a reflection answer names: decoded, by
/// file name.
fn descriptor_files(
    response: tonic_reflection::pb::v1::ServerReflectionResponse,
) -> Vec<FileDescriptorProto> {
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let Some(MessageResponse::FileDescriptorResponse(files)) = response.message_response else {
        panic!("expected file descriptors, got {response:?}")
    };
    files
        .file_descriptor_proto
        .iter()
        .map(|b| FileDescriptorProto::decode(b.as_slice()).unwrap())
        .collect()
}

/// Every A2A error carries `google.rpc.ErrorInfo` (and validation errors a
/// `BadRequest`): reflection describes them, with the files they import,
/// so grpcurl prints the details instead of "google.rpc.ErrorInfo is not
/// recognized".
#[tokio::test]
async fn reflection_describes_the_error_details_every_error_carries() {
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest,
    };
    let server = TestServer::start().await;
    let mut client = ServerReflectionClient::new(server.channel().await);
    let ask = |request: MessageRequest| ServerReflectionRequest {
        host: String::new(),
        message_request: Some(request),
    };
    let symbol = |name: &str| ask(MessageRequest::FileContainingSymbol(name.into()));
    let file = |name: &str| ask(MessageRequest::FileByFilename(name.into()));
    let requests = tokio_stream::iter([
        symbol("google.rpc.ErrorInfo"),
        symbol("google.rpc.BadRequest"),
        symbol("google.rpc.BadRequest.FieldViolation"),
        symbol("google.rpc.Status"),
        // What a client asks next: the files those import.
        file("google/protobuf/duration.proto"),
        file("google/protobuf/any.proto"),
    ]);
    let mut responses = tokio::time::timeout(WAIT, client.server_reflection_info(requests))
        .await
        .expect("reflection timed out")
        .unwrap()
        .into_inner();
    let mut next = async || {
        let response = tokio::time::timeout(WAIT, responses.next())
            .await
            .expect("reflection answer timed out")
            .expect("an answer per request")
            .unwrap();
        descriptor_files(response)
    };

    let messages = |f: &FileDescriptorProto| -> Vec<String> {
        f.message_type.iter().map(|m| m.name().to_owned()).collect()
    };
    for symbol in ["ErrorInfo", "BadRequest", "BadRequest.FieldViolation"] {
        let files = next().await;
        let details = files
            .iter()
            .find(|f| f.name() == "google/rpc/error_details.proto")
            .unwrap_or_else(|| panic!("{symbol}: error_details.proto not served: {files:?}"));
        assert_eq!(details.package(), "google.rpc");
        let names = messages(details);
        assert!(names.iter().any(|n| n == "ErrorInfo"), "{names:?}");
        assert!(names.iter().any(|n| n == "BadRequest"), "{names:?}");
        assert_eq!(details.dependency, ["google/protobuf/duration.proto"]);
    }
    let files = next().await;
    let status = files
        .iter()
        .find(|f| f.name() == "google/rpc/status.proto")
        .expect("status.proto served");
    assert_eq!(messages(status), ["Status"]);
    assert_eq!(status.dependency, ["google/protobuf/any.proto"]);
    for (name, message) in [
        ("google/protobuf/duration.proto", "Duration"),
        ("google/protobuf/any.proto", "Any"),
    ] {
        let files = next().await;
        assert_eq!(files.len(), 1, "{files:?}");
        assert_eq!(files[0].name(), name);
        assert_eq!(messages(&files[0]), [message]);
    }
    server.stop().await;
}

#[tokio::test]
async fn reflection_v1alpha_describes_error_info_too() {
    use tonic_reflection::pb::v1alpha::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let server = TestServer::start().await;
    let mut client = ServerReflectionClient::new(server.channel().await);
    let requests = tokio_stream::iter([ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::FileContainingSymbol(
            "google.rpc.ErrorInfo".into(),
        )),
    }]);
    let mut responses = tokio::time::timeout(WAIT, client.server_reflection_info(requests))
        .await
        .expect("reflection timed out")
        .unwrap()
        .into_inner();
    let response = tokio::time::timeout(WAIT, responses.next())
        .await
        .expect("reflection answer timed out")
        .unwrap()
        .unwrap();
    let Some(MessageResponse::FileDescriptorResponse(files)) = response.message_response else {
        panic!("{response:?}")
    };
    let names: Vec<String> = files
        .file_descriptor_proto
        .iter()
        .map(|b| {
            FileDescriptorProto::decode(b.as_slice())
                .unwrap()
                .name()
                .to_owned()
        })
        .collect();
    assert_eq!(names, ["google/rpc/error_details.proto"]);
    server.stop().await;
}
