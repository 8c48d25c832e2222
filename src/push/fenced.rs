//! A webhook connection that writes only while its attempt may: each
//! attempt sets the moment its time ends ([`WriteUntil::set`]), and the
//! socket refuses every write after it, whichever task does the writing.
//!
//! Why the socket and not the attempt's future: among replicas an attempt
//! starts only if it ends while this process certainly holds the delivery
//! role (`deliver::Tenure`), so that no other holder delivers beside it.
//! A process paused mid-attempt (SIGSTOP, a long GC-like stall of the
//! host) resumes with its timers expired, but a future is polled before
//! its timeout is, and hyper writes the request from the connection's own
//! task: a request queued before the pause would be written after it,
//! when the next holder may already have delivered the task's later
//! events (measured by the fault harness: a stale WORKING 4 ms after a
//! 4.55 s pause, after the new holder's COMPLETED). Checked at the write,
//! the deadline holds however the tasks are polled. What it cannot stop
//! is a write already handed to the kernel when the pause came: that one
//! reaches the webhook at once, before any other holder exists.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The moment after which a connection may not write, shared by the
/// connection's socket and whoever sends on it.
#[derive(Debug)]
pub(super) struct WriteUntil {
    base: Instant,
    /// Nanoseconds after `base`; 0: no write allowed.
    until: AtomicU64,
}

impl WriteUntil {
    pub(super) fn new(deadline: Instant) -> Arc<Self> {
        let until = WriteUntil {
            base: Instant::now(),
            until: AtomicU64::new(0),
        };
        until.set(deadline);
        Arc::new(until)
    }

    /// The attempt about to send on the connection ends at `deadline`.
    pub(super) fn set(&self, deadline: Instant) {
        let nanos = deadline.saturating_duration_since(self.base).as_nanos();
        self.until
            .store(u64::try_from(nanos).unwrap_or(u64::MAX), Ordering::Release);
    }

    fn open(&self) -> bool {
        let now = Instant::now()
            .saturating_duration_since(self.base)
            .as_nanos();
        u64::try_from(now).unwrap_or(u64::MAX) < self.until.load(Ordering::Acquire)
    }
}

/// `io` that refuses writes once its [`WriteUntil`] has passed.
pub(super) struct Fenced<IO> {
    io: IO,
    until: Arc<WriteUntil>,
}

impl<IO> Fenced<IO> {
    pub(super) fn new(io: IO, until: Arc<WriteUntil>) -> Self {
        Fenced { io, until }
    }

    fn refused(&self) -> Option<io::Error> {
        (!self.until.open()).then(|| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                "the attempt's time ran out before its request was written",
            )
        })
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Fenced<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Fenced<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Some(e) = self.refused() {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let Some(e) = self.refused() {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn writes_pass_before_the_deadline_and_are_refused_after() {
        let (near, mut far) = tokio::io::duplex(64);
        let until = WriteUntil::new(Instant::now() + Duration::from_secs(60));
        let mut fenced = Fenced::new(near, until.clone());
        fenced.write_all(b"in time").await.unwrap();
        // The time ends (as after a pause past it): nothing more is written.
        until.set(Instant::now());
        let refused = fenced.write_all(b"late").await.unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::TimedOut);
        // A later attempt on the same connection opens it again.
        until.set(Instant::now() + Duration::from_secs(60));
        fenced.write_all(b"!").await.unwrap();
        drop(fenced);
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), far.read_to_end(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, b"in time!");
    }
}
