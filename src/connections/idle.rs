//! Whether a connection is idle: the requests in flight on it, and since
//! when it has had none.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

/// What a connection is doing: how many requests are in flight on it (an
/// HTTP/2 stream counts from its request to the end of its response
/// body), and since when it has had none.
pub(super) struct Activity {
    open: AtomicUsize,
    /// When the last request ended, in milliseconds since `since`.
    last_end: AtomicU64,
    since: Instant,
}

impl Activity {
    pub(super) fn new() -> Self {
        Activity {
            open: AtomicUsize::new(0),
            last_end: AtomicU64::new(0),
            since: Instant::now(),
        }
    }

    /// Completes once no request has been in flight for `timeout`.
    ///
    /// Requests touch only two atomics; this wakes at most once per
    /// `timeout` to look, so a busy connection costs nothing per request
    /// beyond them.
    pub(super) async fn idle_for(&self, timeout: Duration) {
        let mut wake = self.since + timeout;
        loop {
            tokio::time::sleep_until(wake).await;
            if self.open.load(Ordering::Acquire) > 0 {
                wake = Instant::now() + timeout;
                continue;
            }
            let last_end =
                self.since + Duration::from_millis(self.last_end.load(Ordering::Acquire));
            if last_end + timeout <= Instant::now() {
                return;
            }
            wake = last_end + timeout;
        }
    }
}

/// A request in flight; dropped with its response body (or its handler, if
/// the request is dropped before answering).
pub(super) struct InFlight(Arc<Activity>);

impl InFlight {
    /// Counts a request in flight on the connection until dropped.
    pub(super) fn start(activity: Arc<Activity>) -> Self {
        activity.open.fetch_add(1, Ordering::AcqRel);
        InFlight(activity)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // The time first, then the count: a watcher that sees no request
        // in flight also sees when the last one ended.
        let elapsed = self.0.since.elapsed().as_millis() as u64;
        self.0.last_end.fetch_max(elapsed, Ordering::AcqRel);
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its request counted until it is sent or
/// dropped.
pub struct CountedBody {
    pub(super) body: tonic::body::Body,
    pub(super) _in_flight: InFlight,
}

impl http_body::Body for CountedBody {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, tonic::Status>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
