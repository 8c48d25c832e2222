//! Server-Sent Events for the JSON bindings' streams (spec §9.4.2,
//! §11.7): each event one `data:` line, a comment line while the stream
//! is idle so proxies do not cut it
//! ([`crate::connections::SSE_KEEPALIVE`], `serve --sse-keepalive`), and nothing held once the client
//! goes away (its body, and with it the task subscription, is dropped).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures_util::Stream;
use http::{HeaderValue, header};
use tokio::time::{Instant, Sleep};

/// The comment line sent on an idle stream (SSE: a line starting with a
/// colon is ignored by clients).
pub const KEEPALIVE_FRAME: &[u8] = b": keep-alive\n\n";

/// The content type of every event stream.
pub const CONTENT_TYPE: &str = "text/event-stream";

/// One event: `data: <json>` and the blank line that ends it. The JSON
/// this server writes has no raw newlines (serde_json escapes them in
/// strings), so one `data:` line holds it.
pub fn frame(json: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(json.len() + 8);
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(json);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// An event with a name (`event: error`): clients that read events by
/// type tell it from the stream's data events (the official Python
/// client reads an HTTP+JSON stream's error only so).
pub fn named_frame(event: &str, json: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(json.len() + event.len() + 16);
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(event.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(json);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// `events`, with a keep-alive comment whenever `every` passes without
/// one. The timer is re-armed only when it fires: a busy stream pays one
/// clock read per event, not a timer.
pub struct KeepAlive<S> {
    events: S,
    every: Duration,
    timer: Pin<Box<Sleep>>,
    last: Instant,
}

impl<S> KeepAlive<S> {
    pub fn new(events: S, every: Duration) -> Self {
        let now = Instant::now();
        KeepAlive {
            events,
            every,
            timer: Box::pin(tokio::time::sleep_until(now + every)),
            last: now,
        }
    }
}

impl<S> Stream for KeepAlive<S>
where
    S: Stream<Item = Bytes> + Unpin,
{
    type Item = Result<Bytes, std::convert::Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        match Pin::new(&mut this.events).poll_next(cx) {
            Poll::Ready(Some(event)) => {
                this.last = Instant::now();
                return Poll::Ready(Some(Ok(event)));
            }
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => {}
        }
        loop {
            if this.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let due = this.last + this.every;
            let now = Instant::now();
            if due <= now {
                this.last = now;
                this.timer.as_mut().reset(now + this.every);
                return Poll::Ready(Some(Ok(Bytes::from_static(KEEPALIVE_FRAME))));
            }
            // An event passed since the timer was set: wait the rest.
            this.timer.as_mut().reset(due);
        }
    }
}

/// A `text/event-stream` response of `frames`, kept alive when idle.
pub fn response(
    frames: impl futures_util::Stream<Item = Bytes> + Send + 'static,
    keepalive: std::time::Duration,
) -> Response {
    let body = Body::from_stream(KeepAlive::new(Box::pin(frames), keepalive));
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;

    #[tokio::test(start_paused = true)]
    async fn an_idle_stream_gets_comment_lines_and_a_busy_one_none() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
        let mut stream = KeepAlive::new(
            tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
            Duration::from_secs(15),
        );
        tokio::time::advance(Duration::from_secs(10)).await;
        tx.send(frame(b"{}")).unwrap();
        let first = tokio::time::timeout(Duration::from_secs(1), stream.next())
            .await
            .expect("event")
            .unwrap()
            .unwrap();
        assert_eq!(&first[..], b"data: {}\n\n");
        // 15 s after the event, not after the start: a keep-alive.
        let started = Instant::now();
        let next = tokio::time::timeout(Duration::from_secs(60), stream.next())
            .await
            .expect("keep-alive")
            .unwrap()
            .unwrap();
        assert_eq!(&next[..], KEEPALIVE_FRAME);
        assert_eq!(started.elapsed(), Duration::from_secs(15));
        drop(tx);
        let end = tokio::time::timeout(Duration::from_secs(1), stream.next())
            .await
            .expect("end");
        assert!(end.is_none());
    }
}
