//! What each peer holds: the key a client address counts under (an IPv6
//! host as its /64), and a table of holdings per peer.

use std::sync::Arc;

/// The peer a client address counts as for per-peer bounds (connections,
/// authentication failures): an IPv4 address itself (an IPv4-mapped IPv6
/// address as its IPv4 address), an IPv6 address as its /64, which one
/// host is usually given whole (RFC 6177) and may spread over at will.
pub fn peer_key(addr: std::net::IpAddr) -> std::net::IpAddr {
    match addr.to_canonical() {
        std::net::IpAddr::V6(v6) => {
            std::net::IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into())
        }
        v4 => v4,
    }
}

/// What peers ([`peer_key`]) hold, counted per peer: each holding is
/// given back when its [`PeerHeld`] drops, and a peer leaves the table with
/// its last, so the table holds no more peers than holdings.
#[derive(Default, Clone)]
pub struct PerPeer(Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>);

impl PerPeer {
    /// One more holding for `peer`, unless it holds `max` already.
    pub fn enter(&self, peer: std::net::IpAddr, max: usize) -> Option<PeerHeld> {
        let mut held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let count = held.get(&peer).copied().unwrap_or(0);
        if count >= max {
            return None;
        }
        held.insert(peer, count + 1);
        Some(PeerHeld {
            table: self.clone(),
            peer,
        })
    }
}

/// A peer's holding in a [`PerPeer`], given back when dropped.
pub struct PeerHeld {
    table: PerPeer,
    peer: std::net::IpAddr,
}

impl Drop for PeerHeld {
    fn drop(&mut self) {
        let mut held = self.table.0.lock().unwrap_or_else(|e| e.into_inner());
        if let std::collections::hash_map::Entry::Occupied(mut count) = held.entry(self.peer) {
            *count.get_mut() -= 1;
            if *count.get() == 0 {
                count.remove();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_peer_is_its_64() {
        let key = |s: &str| peer_key(s.parse().unwrap()).to_string();
        assert_eq!(key("2001:db8:1:2:aaaa::1"), "2001:db8:1:2::");
        assert_eq!(key("2001:db8:1:2:ffff:ffff:ffff:ffff"), "2001:db8:1:2::");
        assert_eq!(key("::ffff:10.1.2.3"), "10.1.2.3");
        assert_eq!(key("192.0.2.7"), "192.0.2.7");
    }
}
