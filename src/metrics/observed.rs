//! The gRPC calls' metrics layer: every call through it counted in
//! [`RpcMetrics`] by method, protocol version and code, with its time.

use crate::bindings::Binding;

use super::{RpcMetrics, method_label, protocol_version_label};

/// Counts every gRPC call through it in [`RpcMetrics`]: its method, the
/// code it ended with (from a trailers-only answer's headers, or from the
/// trailers at the end of its body; `CANCELLED` when the body is dropped
/// before them: the client went away) and how long it took. Other HTTP
/// requests (cards, `/metrics`) pass uncounted.
/// Without metrics (`None`) it only hands requests on.
#[derive(Clone)]
pub struct Observed<S> {
    inner: S,
    rpc: Option<RpcMetrics>,
}

impl<S> Observed<S> {
    pub fn new(inner: S, rpc: Option<RpcMetrics>) -> Self {
        Observed { inner, rpc }
    }
}

type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl<S, B> tower::Service<http::Request<B>> for Observed<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let grpc = is_grpc(request.headers());
        // Read now: the request is handed on.
        let method = method_label(request.uri().path());
        let version = protocol_version_label(request.uri().path());
        let answer = self.inner.call(request);
        let Some(rpc) = self.rpc.clone().filter(|_| grpc) else {
            return Box::pin(answer);
        };
        let start = std::time::Instant::now();
        Box::pin(async move {
            let response = answer.await?;
            if let Some(code) = grpc_status(response.headers()) {
                rpc.record(Binding::Grpc, version, method, code, start.elapsed());
                return Ok(response);
            }
            Ok(response.map(|body| {
                tonic::body::Body::new(ObservedBody {
                    body,
                    ended: Some((rpc, version, method, start)),
                })
            }))
        })
    }
}

/// Whether a request is a gRPC call (its content type), not one of the
/// HTTP routes served beside the services (cards, `/metrics`, probes).
pub fn is_grpc(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// The `grpc-status` of a header or trailer map, if it has one.
fn grpc_status(headers: &http::HeaderMap) -> Option<tonic::Code> {
    // A name made once: given as text it is parsed on every lookup.
    const GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");
    let value = headers.get(GRPC_STATUS)?;
    let code: i32 = value.to_str().ok()?.parse().ok()?;
    Some(tonic::Code::from(code))
}

/// A response body that records its call once its trailers pass, or when
/// dropped without them.
struct ObservedBody {
    body: tonic::body::Body,
    /// Taken when recorded.
    ended: Option<(RpcMetrics, &'static str, &'static str, std::time::Instant)>,
}

impl ObservedBody {
    fn record(&mut self, code: tonic::Code) {
        if let Some((rpc, version, method, start)) = self.ended.take() {
            rpc.record(Binding::Grpc, version, method, code, start.elapsed());
        }
    }
}

impl http_body::Body for ObservedBody {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, tonic::Status>>> {
        let polled = std::pin::Pin::new(&mut self.body).poll_frame(cx);
        if let std::task::Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(trailers) = frame.trailers_ref()
        {
            let code = grpc_status(trailers).unwrap_or(tonic::Code::Unknown);
            self.record(code);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for ObservedBody {
    fn drop(&mut self) {
        self.record(tonic::Code::Cancelled);
    }
}
