//! An accepted TCP connection offered to HTTP/2 without vectored writes,
//! as the real server's connections are (`--tuned`).

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// An accepted connection, offered to HTTP/2 without vectored writes.
///
/// h2 copies a DATA frame's payload into its write buffer, where the frames
/// of many responses accumulate and go out in one write, only below a
/// chaining threshold: 256 bytes when the connection supports vectored
/// writes, 1 KiB when not. A larger payload is chained instead, and the
/// buffer must be written before another frame can join it. Most of an A2A
/// server's responses (a task with its artifact and history) are between
/// the two, so with vectored writes each cost a `writev` of its own;
/// without, the responses of many requests share one (measured on blocking
/// SendMessage: 1.2 writes per response before, a fraction after).
pub struct UnvectoredTcp(pub TcpStream);

impl AsyncRead for UnvectoredTcp {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for UnvectoredTcp {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    // `is_write_vectored` keeps its default, false: the point of the type.
}

impl Connected for UnvectoredTcp {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.0.connect_info()
    }
}
