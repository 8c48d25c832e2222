//! Client connections, from accept to close, and the bounds on them: how
//! many, how long a new one may take to say what it is and each HTTP/1.1
//! request to send its headers, how long one may stay open with nothing
//! to do, how many streams each may open, how dead peers are found, and
//! how long shutdown waits for the rest.
//!
//! An A2A server is reachable by clients it does not control; without these
//! a few silent sockets or one connection opening thousands of streams take
//! it down for everyone. Every bound is named here with its default, and
//! `serve` has a flag for each (README, Limits).
//!
//! The accept loop and each connection's task are this module's own, on
//! hyper's server connections (the ones tonic's server uses): tonic's
//! server has no idle timeout, no header deadline for HTTP/1.1 and no way
//! to close one connection gracefully, and each of those needs the
//! connection's task. What tonic's server did per request is done here
//! too: the connection's addresses in the request's extensions
//! ([`tonic::Request::remote_addr`]). The client's `grpc-timeout` is the
//! gRPC binding's to read (`service::grpc`).
//!
//! This file holds the bounds and their defaults; the parts, each in its
//! file beside it: `peers` (what each peer holds), `caps` (accepting under
//! the caps), `conn` (an accepted connection), `accept` (the accept loop
//! and each connection's task), `tls`, `idle` (requests in flight, for the
//! idle timeout) and `body_deadline` (a request body's deadline).

use std::time::Duration;

mod accept;
mod body_deadline;
mod caps;
mod conn;
mod idle;
mod peers;
mod tls;

pub use accept::serve;
pub use body_deadline::{BodyTimedOut, TimedBody};
pub use caps::{MAX_REFUSED_HELD, REFUSALS_LOGGED_EVERY, REFUSED_HELD_FOR, bounded};
pub use conn::Conn;
pub use idle::CountedBody;
pub use peers::{PeerHeld, PerPeer, peer_key};
pub use tls::{ClientCertificate, ClientCerts, Tls, TlsFiles};

/// Connections served at once; one more is closed at accept.
pub const MAX_CONNECTIONS: usize = 4096;
/// Connections one peer ([`peer_key`]) may hold at once; one more is
/// closed at accept. Well under [`MAX_CONNECTIONS`], so one address can
/// never take them all.
pub const MAX_CONNECTIONS_PER_PEER: usize = 512;
/// Time a request has, once its headers arrived, to send its whole body;
/// past it the request ends with an error (A2A's requests are one message
/// each: none streams its body).
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// Concurrent HTTP/2 streams per connection, advertised in SETTINGS
/// (`SETTINGS_MAX_CONCURRENT_STREAMS`); h2 refuses streams past it.
pub const MAX_CONCURRENT_STREAMS: u32 = 256;
/// Time a new connection has to send the HTTP/2 preface, and an HTTP/1.1
/// connection the headers of each request (counted from when it is ready
/// for the next one); it is closed otherwise.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Interval of the HTTP/2 pings that find dead peers.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// How long a ping may go unanswered before the connection is closed.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long shutdown waits for open connections to finish their calls
/// before cutting them.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// How long a connection may stay open with no request in flight (no open
/// HTTP/2 stream) before the server closes it: gracefully, with GOAWAY
/// over HTTP/2, so a request crossing it is retried by the client instead
/// of failing. An HTTP/1.1 connection waiting for its next request is
/// closed sooner, at [`HANDSHAKE_TIMEOUT`]: hyper times the wait for a
/// request's headers from the moment it is ready for them.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a JSON binding's event stream (SSE) may go without an event
/// before a comment line is sent: below the idle timeouts of proxies
/// (commonly 60 s) and below the 5 s read timeout the official Python
/// client's HTTP library has by default, so an idle subscription is not
/// cut by either.
pub const SSE_KEEPALIVE: Duration = Duration::from_secs(4);

/// The bounds a server applies (see the constants for what each means).
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub max_connections_per_peer: usize,
    pub body_timeout: Duration,
    pub max_concurrent_streams: u32,
    pub handshake_timeout: Duration,
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    pub shutdown_grace: Duration,
    pub idle_timeout: Duration,
    pub sse_keepalive: Duration,
    /// Bytes of answers one caller is sent per second
    /// ([`READ_BYTES_PER_SECOND`]; 0: unpaced).
    pub read_bytes_per_second: u64,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: MAX_CONNECTIONS,
            max_connections_per_peer: MAX_CONNECTIONS_PER_PEER,
            body_timeout: BODY_TIMEOUT,
            max_concurrent_streams: MAX_CONCURRENT_STREAMS,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            keepalive_interval: KEEPALIVE_INTERVAL,
            keepalive_timeout: KEEPALIVE_TIMEOUT,
            shutdown_grace: SHUTDOWN_GRACE,
            idle_timeout: IDLE_TIMEOUT,
            sse_keepalive: SSE_KEEPALIVE,
            read_bytes_per_second: READ_BYTES_PER_SECOND,
        }
    }
}

/// Bytes of answers one caller (a principal, or an address) may be sent
/// per second, by default, paced by the service (`--read-bytes-per-second`;
/// 0 turns pacing off): thousands of reads a
/// second of a typical task (kilobytes), two or three of the largest
/// (`MAX_TASK_BYTES`, 3 MiB).
pub const READ_BYTES_PER_SECOND: u64 = 8 << 20;

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
