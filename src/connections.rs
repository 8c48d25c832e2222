//! Bounds on client connections: how many, how long a new one may take to
//! say what it is, how many streams each may open, how dead peers are
//! found, and how long shutdown waits for the rest.
//!
//! An A2A server is reachable by clients it does not control; without these
//! a few silent sockets or one connection opening thousands of streams take
//! it down for everyone. Every bound is named here with its default, and
//! `serve` has a flag for each (README, Limits).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Connections served at once; one more is closed at accept.
pub const MAX_CONNECTIONS: usize = 4096;
/// Concurrent HTTP/2 streams per connection, advertised in SETTINGS
/// (`SETTINGS_MAX_CONCURRENT_STREAMS`); h2 refuses streams past it.
pub const MAX_CONCURRENT_STREAMS: u32 = 256;
/// Time a new connection has to send the HTTP/2 preface, or the headers of
/// its first HTTP/1.1 request; it is closed otherwise.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Interval of the HTTP/2 pings that find dead peers.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// How long a ping may go unanswered before the connection is closed.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long shutdown waits for open connections to finish their calls
/// before cutting them.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// The bounds a server applies (see the constants for what each means).
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub max_concurrent_streams: u32,
    pub handshake_timeout: Duration,
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    pub shutdown_grace: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: MAX_CONNECTIONS,
            max_concurrent_streams: MAX_CONCURRENT_STREAMS,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            keepalive_interval: KEEPALIVE_INTERVAL,
            keepalive_timeout: KEEPALIVE_TIMEOUT,
            shutdown_grace: SHUTDOWN_GRACE,
        }
    }
}

/// Raises the soft limit on open descriptors to the hard limit (a server
/// starts with 1,024 on most systems, below [`MAX_CONNECTIONS`]), and warns
/// when the connection cap still exceeds it: past it, accepting fails for
/// everyone instead of refusing one more client.
pub fn raise_descriptor_limit(max_connections: usize) {
    #[cfg(unix)]
    {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit/setrlimit read and write the struct passed.
        let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
        if !ok {
            tracing::warn!("could not read the descriptor limit");
            return;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            // SAFETY: as above.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
                limit = raised;
            }
        }
        // Room for the store's files, the listener and logs beside the
        // connections.
        let needed = max_connections as u64 + 64;
        // `rlim_t` is u64 here, another width elsewhere.
        #[allow(clippy::unnecessary_cast)]
        let current = limit.rlim_cur as u64;
        if current < needed {
            tracing::warn!(
                descriptors = current,
                max_connections,
                "the descriptor limit is below the connection cap: lower --max-connections or raise the hard limit"
            );
        }
    }
    #[cfg(not(unix))]
    let _ = max_connections;
}

/// Accepted connections under the cap: one past it is closed at once (the
/// client sees the connection end), and those being served are unaffected.
pub fn bounded<S>(
    accepted: S,
    limits: &ConnectionLimits,
) -> impl Stream<Item = std::io::Result<Conn>> + Send + 'static
where
    S: Stream<Item = std::io::Result<TcpStream>> + Send + 'static,
{
    let open = Arc::new(AtomicUsize::new(0));
    let max = limits.max_connections;
    let handshake = limits.handshake_timeout;
    accepted.filter_map(move |accepted| {
        let open = open.clone();
        async move {
            let stream = match accepted {
                Ok(stream) => stream,
                // Accept errors (EMFILE, a reset before accept) are the
                // listener's; tonic logs and goes on.
                Err(e) => return Some(Err(e)),
            };
            if open.fetch_add(1, Ordering::AcqRel) >= max {
                open.fetch_sub(1, Ordering::AcqRel);
                tracing::warn!(max_connections = max, "connection refused: at the cap");
                drop(stream);
                return None;
            }
            Some(Ok(Conn {
                stream,
                _slot: Slot(open),
                handshake: Some(Handshake::new(handshake)),
            }))
        }
    })
}

/// Frees a connection's place under the cap when it closes.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Watches a new connection's first bytes until it has said what it is:
/// the HTTP/2 preface (24 bytes), or the end of an HTTP/1.1 request's
/// headers (an empty line).
struct Handshake {
    deadline: Pin<Box<Sleep>>,
    seen: usize,
    /// The last bytes read (at most 3), to find `\r\n\r\n` across reads.
    tail: Vec<u8>,
    http2: Option<bool>,
}

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

impl Handshake {
    fn new(timeout: Duration) -> Self {
        Handshake {
            deadline: Box::pin(tokio::time::sleep(timeout)),
            seen: 0,
            tail: Vec::new(),
            http2: None,
        }
    }

    /// Takes newly read bytes; true once the handshake is complete.
    fn read(&mut self, bytes: &[u8]) -> bool {
        if self.http2.is_none() && !bytes.is_empty() {
            self.http2 = Some(bytes[0] == PREFACE[0]);
        }
        if self.http2 == Some(true) {
            self.seen += bytes.len();
            return self.seen >= PREFACE.len();
        }
        let mut window = std::mem::take(&mut self.tail);
        window.extend_from_slice(bytes);
        if window.windows(4).any(|w| w == b"\r\n\r\n") {
            return true;
        }
        let keep = window.len().saturating_sub(3);
        self.tail = window.split_off(keep);
        false
    }
}

/// An accepted connection: its place under the cap, its handshake
/// deadline, and (like [`crate::server::UnvectoredTcp`]) no vectored
/// writes, so small responses share a write.
pub struct Conn {
    stream: TcpStream,
    _slot: Slot,
    handshake: Option<Handshake>,
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        let Some(handshake) = this.handshake.as_mut() else {
            return polled;
        };
        match polled {
            Poll::Ready(Ok(())) => {
                if handshake.read(&buf.filled()[before..]) {
                    this.handshake = None;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => match handshake.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the client did not finish its handshake in time",
                ))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    // `is_write_vectored` keeps its default, false: see `UnvectoredTcp`.
}

impl Connected for Conn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn handshake_ends_at_the_preface_or_the_end_of_headers() {
        let mut h = Handshake::new(HANDSHAKE_TIMEOUT);
        assert!(!h.read(&PREFACE[..10]));
        assert!(h.read(&PREFACE[10..]));
        let mut h = Handshake::new(HANDSHAKE_TIMEOUT);
        assert!(!h.read(b"GET / HTTP/1.1\r\nHost: x\r"));
        assert!(!h.read(b"\n"));
        assert!(h.read(b"\r\n"));
        let mut h = Handshake::new(HANDSHAKE_TIMEOUT);
        assert!(!h.read(b"GET / HTTP/1.1\r\n"));
        assert!(h.read(b"\r\n"));
    }
}
