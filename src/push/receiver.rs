//! A webhook receiver: the other end of [`super::deliver`], for watching a
//! task's notifications without writing a server (`a2a-lifecycle push
//! listen`) and for the benchmark's delivery rows.
//!
//! It takes HTTP/1.1 POSTs whose body is the ProtoJSON of a
//! `StreamResponse` (spec §4.3) and answers 200 once it has handed the
//! notification on. It answers 401 when a token is expected and the
//! `X-A2A-Notification-Token` header does not carry it (spec §13.2: the
//! receiver checks that a notification comes from the server it gave the
//! token to), 413 beyond [`MAX_NOTIFICATION_BYTES`], 400 to a body that is
//! not a `StreamResponse`, and 405 to anything but POST.

use std::convert::Infallible;
use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::deliver::TOKEN_HEADER;
use crate::proto::StreamResponse;

/// The largest notification body taken.
pub const MAX_NOTIFICATION_BYTES: usize = 16 * 1024 * 1024;

/// One notification as received.
#[derive(Debug, Clone, PartialEq)]
pub struct Notification {
    /// The `X-A2A-Notification-Token` header, when sent.
    pub token: Option<String>,
    /// The `Authorization` header, when sent.
    pub authorization: Option<String>,
    pub event: StreamResponse,
}

/// Serves `listener` until `shutdown`, handing each accepted notification
/// to `on_notification`. With `token`, a POST without that exact token is
/// refused (401) and not handed on.
pub async fn receive<F>(
    listener: TcpListener,
    token: Option<String>,
    on_notification: F,
    shutdown: CancellationToken,
) where
    F: Fn(Notification) + Send + Sync + 'static,
{
    let handler = Arc::new(Handler {
        token,
        on_notification,
    });
    let connections = tokio_util::task::TaskTracker::new();
    loop {
        let tcp = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                // A connection that failed before it was accepted (reset,
                // descriptor limit): the listener itself is fine.
                Err(e) => {
                    tracing::debug!(error = %e, "receiver: accept failed");
                    continue;
                }
            },
        };
        let handler = handler.clone();
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let handler = handler.clone();
                async move { Ok::<_, Infallible>(handler.handle(request).await) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service);
            tokio::select! {
                () = shutdown.cancelled() => {}
                _ = connection => {}
            }
        });
    }
    connections.close();
}

struct Handler<F> {
    token: Option<String>,
    on_notification: F,
}

impl<F: Fn(Notification)> Handler<F> {
    async fn handle(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        if request.method() != Method::POST {
            return answer(StatusCode::METHOD_NOT_ALLOWED, "POST notifications here\n");
        }
        let header = |name: &str| {
            request
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let (token, authorization) = (header(TOKEN_HEADER), header("authorization"));
        if self.token.is_some() && token != self.token {
            return answer(
                StatusCode::UNAUTHORIZED,
                "wrong or missing notification token\n",
            );
        }
        let body = match Limited::new(request.into_body(), MAX_NOTIFICATION_BYTES)
            .collect()
            .await
        {
            Ok(body) => body.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                return answer(StatusCode::PAYLOAD_TOO_LARGE, "notification too large\n");
            }
            Err(_) => return answer(StatusCode::BAD_REQUEST, "the body did not arrive whole\n"),
        };
        let event = match std::str::from_utf8(&body)
            .map_err(|e| e.to_string())
            .and_then(|text| {
                crate::json::from_str::<StreamResponse>(text).map_err(|e| e.to_string())
            }) {
            Ok(event) => event,
            Err(e) => {
                return answer(
                    StatusCode::BAD_REQUEST,
                    &format!("not a StreamResponse: {e}\n"),
                );
            }
        };
        (self.on_notification)(Notification {
            token,
            authorization,
            event,
        });
        answer(StatusCode::OK, "")
    }
}

fn answer(status: StatusCode, text: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(text.to_owned())));
    *response.status_mut() = status;
    response
}
