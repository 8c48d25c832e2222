//! A request body's deadline: one that does not arrive in time ends with
//! an error.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::body::Incoming;
use tokio::time::{Instant, Sleep};

/// A request body with a deadline for its end
/// ([`ConnectionLimits::body_timeout`](super::ConnectionLimits::body_timeout),
/// counted from its headers): one that stalls past it ends with
/// [`BodyTimedOut`], so a caller cannot hold a request (and what it holds)
/// open by sending its body slowly.
pub struct TimedBody {
    pub(super) inner: Incoming,
    pub(super) deadline: Instant,
    /// Made the first time the body has to wait: most bodies arrive with
    /// their headers, and never do.
    pub(super) timer: Option<Pin<Box<Sleep>>>,
}

/// A request body not received by its deadline.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive in time")]
pub struct BodyTimedOut;

impl http_body::Body for TimedBody {
    type Data = bytes::Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(frame.map(|f| f.map_err(Into::into))),
            Poll::Pending => {
                let deadline = self.deadline;
                let timer = self
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(BodyTimedOut.into()))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
