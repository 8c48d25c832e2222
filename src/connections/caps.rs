//! Accepted connections under the caps: the server's and each peer's, a
//! refused connection held a while then closed, and refusals logged at a
//! bounded rate.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use tokio::net::TcpStream;

use super::ConnectionLimits;
use super::conn::{Conn, HandshakeWatch};
use super::peers::{PeerHeld, PerPeer, peer_key};

/// Accepted connections under the caps: one past the server's cap, or
/// past its peer's ([`ConnectionLimits::max_connections_per_peer`]), is
/// closed unread after [`REFUSED_HELD_FOR`] (the client sees the
/// connection end; the log says which cap), and those being served are
/// unaffected.
pub fn bounded<S>(
    accepted: S,
    limits: &ConnectionLimits,
    tls: bool,
) -> impl Stream<Item = std::io::Result<Conn>> + Send + 'static
where
    S: Stream<Item = std::io::Result<TcpStream>> + Send + 'static,
{
    let open = Arc::new(Open::default());
    let max = limits.max_connections;
    let per_peer = limits.max_connections_per_peer;
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
            let peer = stream.peer_addr().ok().map(|a| peer_key(a.ip()));
            let slot = match open.take(peer, max, per_peer) {
                Ok(slot) => slot,
                Err(Full::Server) => {
                    if let Some(refused) = open.refusals.count_refusal(tokio::time::Instant::now())
                    {
                        tracing::warn!(
                            max_connections = max,
                            refused,
                            "connections refused: at the cap"
                        );
                    }
                    open.hold_refused(stream);
                    return None;
                }
                Err(Full::Peer) => {
                    if let Some(refused) = open.refusals.count_refusal(tokio::time::Instant::now())
                    {
                        tracing::warn!(
                            peer = peer.map(tracing::field::display),
                            max_connections_per_peer = per_peer,
                            refused,
                            "connections refused: a peer at its cap (the last one named)"
                        );
                    }
                    open.hold_refused(stream);
                    return None;
                }
            };
            Some(Ok(Conn {
                stream,
                _slot: slot,
                // Under TLS the first bytes are a ClientHello, not HTTP:
                // the TLS handshake has the deadline instead (`serve`).
                handshake: (!tls).then(|| HandshakeWatch::new(handshake)),
            }))
        }
    })
}

/// The connections open, in all and per peer.
#[derive(Default)]
struct Open {
    /// Refusals, logged at most once per [`REFUSALS_LOGGED_EVERY`].
    refusals: Refusals,
    all: AtomicUsize,
    by_peer: PerPeer,
    /// Refused connections held ([`REFUSED_HELD_FOR`]).
    held: Arc<AtomicUsize>,
}

/// How long a refused connection is held, unread, before it is closed: a
/// client that connects again the moment it is closed (a loop past its
/// cap) makes one attempt per hold instead of thousands a second, each an
/// accept, a close and its own connect on the machine's cores.
pub const REFUSED_HELD_FOR: Duration = Duration::from_secs(1);
/// Refused connections held at once ([`REFUSED_HELD_FOR`]); past it one is
/// closed at once, so holding costs at most this many descriptors.
pub const MAX_REFUSED_HELD: usize = 256;

/// How often refused connections are logged at most: a client opening
/// connections in a loop past its cap must not write a log line each.
pub const REFUSALS_LOGGED_EVERY: Duration = Duration::from_secs(1);

/// Refused connections since the last log line, and when that was.
#[derive(Default)]
struct Refusals {
    since_logged: AtomicU64,
    last_logged: std::sync::Mutex<Option<tokio::time::Instant>>,
}

impl Refusals {
    /// Counts a refusal; `Some(n)` when it is time to log the `n` refused
    /// since the last line (this one included).
    fn count_refusal(&self, now: tokio::time::Instant) -> Option<u64> {
        let refused = self.since_logged.fetch_add(1, Ordering::AcqRel) + 1;
        let mut last = self.last_logged.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|at| now.duration_since(at) < REFUSALS_LOGGED_EVERY) {
            return None;
        }
        *last = Some(now);
        self.since_logged.fetch_sub(refused, Ordering::AcqRel);
        Some(refused)
    }
}

/// Which cap refused a connection.
enum Full {
    Server,
    Peer,
}

impl Open {
    /// Closes a refused connection after [`REFUSED_HELD_FOR`], or at once
    /// when [`MAX_REFUSED_HELD`] are held already.
    fn hold_refused(&self, stream: TcpStream) {
        if self.held.fetch_add(1, Ordering::AcqRel) >= MAX_REFUSED_HELD {
            self.held.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        let held = self.held.clone();
        tokio::spawn(async move {
            tokio::time::sleep(REFUSED_HELD_FOR).await;
            drop(stream);
            held.fetch_sub(1, Ordering::AcqRel);
        });
    }

    fn take(
        self: &Arc<Self>,
        peer: Option<std::net::IpAddr>,
        max: usize,
        per_peer: usize,
    ) -> Result<ConnectionSlot, Full> {
        if self.all.fetch_add(1, Ordering::AcqRel) >= max {
            self.all.fetch_sub(1, Ordering::AcqRel);
            return Err(Full::Server);
        }
        let held = match peer.map(|peer| self.by_peer.enter(peer, per_peer)) {
            Some(None) => {
                self.all.fetch_sub(1, Ordering::AcqRel);
                return Err(Full::Peer);
            }
            Some(held) => held,
            None => None,
        };
        Ok(ConnectionSlot {
            open: self.clone(),
            _peer: held,
        })
    }
}

/// A connection's place under the caps, given back when it closes.
pub(super) struct ConnectionSlot {
    open: Arc<Open>,
    _peer: Option<PeerHeld>,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.open.all.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loop of refused connections writes a log line a second, saying
    /// how many were refused since the last.
    #[test]
    fn refusals_are_logged_at_most_once_a_second() {
        let refusals = Refusals::default();
        let start = tokio::time::Instant::now();
        assert_eq!(refusals.count_refusal(start), Some(1));
        for i in 1..1000 {
            let now = start + Duration::from_micros(i);
            assert_eq!(refusals.count_refusal(now), None);
        }
        let later = start + REFUSALS_LOGGED_EVERY;
        assert_eq!(refusals.count_refusal(later), Some(1000));
        assert_eq!(refusals.count_refusal(later), None);
    }
}
