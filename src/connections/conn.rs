//! An accepted connection as it is served: its place under the caps, the
//! deadline for its first bytes, and no vectored writes.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;
use tonic::transport::server::{Connected, TcpConnectInfo};

use super::caps::ConnectionSlot;

/// Watches a new connection's first bytes until it has said what it is:
/// the HTTP/2 preface (24 bytes), or the end of an HTTP/1.1 request's
/// headers (an empty line).
pub(super) struct HandshakeWatch {
    deadline: Pin<Box<Sleep>>,
    seen: usize,
    /// The last bytes read (at most 3), to find `\r\n\r\n` across reads.
    tail: Vec<u8>,
    http2: Option<bool>,
}

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

impl HandshakeWatch {
    pub(super) fn new(timeout: Duration) -> Self {
        HandshakeWatch {
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
/// deadline, and no vectored writes, so small responses share a write.
///
/// h2 copies a DATA frame's payload into its write buffer, where the frames
/// of many responses accumulate and go out in one write, only below a
/// chaining threshold: 256 bytes when the connection supports vectored
/// writes, 1 KiB when not. A larger payload is chained instead, and the
/// buffer must be written before another frame can join it. Most of this
/// server's responses (a task with its artifact and history) are between
/// the two, so with vectored writes each cost a `writev` of its own;
/// without, the responses of many requests share one (measured on blocking
/// SendMessage: 1.2 writes per response before, a fraction after).
pub struct Conn {
    pub(super) stream: TcpStream,
    pub(super) _slot: ConnectionSlot,
    pub(super) handshake: Option<HandshakeWatch>,
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

    // `is_write_vectored` keeps its default, false: see [`Conn`].
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
    use crate::connections::HANDSHAKE_TIMEOUT;

    #[tokio::test]
    async fn handshake_ends_at_the_preface_or_the_end_of_headers() {
        let mut h = HandshakeWatch::new(HANDSHAKE_TIMEOUT);
        assert!(!h.read(&PREFACE[..10]));
        assert!(h.read(&PREFACE[10..]));
        let mut h = HandshakeWatch::new(HANDSHAKE_TIMEOUT);
        assert!(!h.read(b"GET / HTTP/1.1\r\nHost: x\r"));
        assert!(!h.read(b"\n"));
        assert!(h.read(b"\r\n"));
        let mut h = HandshakeWatch::new(HANDSHAKE_TIMEOUT);
        assert!(!h.read(b"GET / HTTP/1.1\r\n"));
        assert!(h.read(b"\r\n"));
    }
}
