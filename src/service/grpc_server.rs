//! The 1.0 gRPC service as this server serves it: tonic's generated
//! `A2AService` server, except GetTask, which answers with the task's
//! encoding as the store keeps it ([`TaskRead::Encoded`]) instead of
//! decoding the task to encode it again (issue 32: the decode and the
//! encode were about 11,000 of a GetTask's 70,000 instructions). The
//! answer's bytes are those prost writes for the decoded task, so a client
//! sees no difference (store conformance checks `read_task` against
//! `get_task`; the integration tests compare the two answers).

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::BoxFuture;
use tonic::body::Body;
use tonic::codec::{BufferSettings, Codec, EncodeBuf, Encoder};
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Request, Response, Status};

use super::A2aApi;
use super::grpc::{A2aGrpc, context, get_task_response};
use crate::proto::a2a_service_server::A2aServiceServer;
use crate::proto::{GetTaskRequest, MAX_MESSAGE_BYTES};
use crate::store::TaskRead;

/// GetTask's path, which [`A2aGrpcServer`] answers itself.
const GET_TASK_PATH: &str = "/lf.a2a.v1.A2AService/GetTask";

/// The `lf.a2a.v1.A2AService` server: [`A2aGrpc`] in tonic's generated
/// server, with GetTask taken first.
///
/// Cloned for each call (tonic's router), so what it holds is shared.
#[derive(Clone)]
pub struct A2aGrpcServer {
    generated: A2aServiceServer<A2aGrpc>,
    api: Arc<A2aApi>,
}

impl A2aGrpcServer {
    pub fn new(api: A2aApi) -> Self {
        A2aGrpcServer {
            generated: A2aServiceServer::new(A2aGrpc::new(api.clone()))
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            api: Arc::new(api),
        }
    }
}

impl NamedService for A2aGrpcServer {
    const NAME: &'static str = <A2aServiceServer<A2aGrpc> as NamedService>::NAME;
}

impl<B> tower::Service<http::Request<B>> for A2aGrpcServer
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != GET_TASK_PATH {
            return self.generated.call(request);
        }
        let api = self.api.clone();
        Box::pin(async move {
            // The generated server's settings: no compression, the same
            // message size limits.
            let mut grpc = Grpc::new(GetTaskCodec)
                .apply_max_message_size_config(Some(MAX_MESSAGE_BYTES), Some(MAX_MESSAGE_BYTES));
            Ok(grpc.unary(GetTask(api), request).await)
        })
    }
}

struct GetTask(Arc<A2aApi>);

impl UnaryService<GetTaskRequest> for GetTask {
    type Response = TaskRead;
    type Future = BoxFuture<'static, Result<Response<TaskRead>, Status>>;

    fn call(&mut self, request: Request<GetTaskRequest>) -> Self::Future {
        let api = self.0.clone();
        Box::pin(async move {
            let call = context(&request);
            let answer = api.read_task(&call, request.into_inner()).await;
            get_task_response(&call, answer)
        })
    }
}

/// GetTask's codec: the request decoded by prost, the answer written as
/// the store's bytes or, for a task the store handed out decoded, by
/// prost.
struct GetTaskCodec;

impl Codec for GetTaskCodec {
    type Encode = TaskRead;
    type Decode = GetTaskRequest;
    type Encoder = TaskReadEncoder;
    type Decoder = tonic_prost::ProstDecoder<GetTaskRequest>;

    fn encoder(&mut self) -> Self::Encoder {
        TaskReadEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::new(BufferSettings::default())
    }
}

struct TaskReadEncoder;

impl Encoder for TaskReadEncoder {
    type Item = TaskRead;
    type Error = Status;

    fn encode(&mut self, item: TaskRead, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        use bytes::BufMut as _;
        match item {
            TaskRead::Encoded(bytes) => buf.put_slice(&bytes),
            TaskRead::Decoded(task) => {
                prost::Message::encode(&task, buf).expect("an EncodeBuf grows as needed")
            }
        }
        Ok(())
    }
}
