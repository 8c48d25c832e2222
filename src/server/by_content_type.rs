//! Routes each request on the one port by its content type: gRPC calls
//! to the gRPC services, the rest to the HTTP routes.

/// One port for every binding: gRPC calls (by their content type,
/// `application/grpc...`) go to the gRPC services, whatever their path;
/// everything else (the JSON bindings, cards, probes, `/metrics`) to the
/// HTTP routes.
#[derive(Clone)]
pub(super) struct ByContentType<G, H> {
    pub(super) grpc: G,
    pub(super) http: H,
}

impl<G, H, B> tower::Service<http::Request<B>> for ByContentType<G, H>
where
    G: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    H: tower::Service<
            http::Request<B>,
            Response = http::Response<tonic::body::Body>,
            Error = G::Error,
        >,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = G::Error;
    type Future = futures_util::future::Either<G::Future, H::Future>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        // Both are always ready (routers); each is asked when called.
        match self.grpc.poll_ready(cx) {
            std::task::Poll::Ready(Ok(())) => self.http.poll_ready(cx),
            other => other,
        }
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if crate::metrics::is_grpc(request.headers()) {
            futures_util::future::Either::Left(self.grpc.call(request))
        } else {
            futures_util::future::Either::Right(self.http.call(request))
        }
    }
}
