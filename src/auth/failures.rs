//! Slowing a peer's repeated authentication failures.

use std::collections::HashMap;

/// Failed authentications one peer address may make in a window before
/// its failures are slowed.
pub const FREE_FAILURES: u32 = 5;
/// The window failures are counted in.
pub const FAILURE_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);
/// The delay of the first slowed failure; each further one doubles it...
pub const FIRST_DELAY: std::time::Duration = std::time::Duration::from_millis(100);
/// ... up to this.
pub const MAX_DELAY: std::time::Duration = std::time::Duration::from_secs(2);
/// Peer addresses tracked at once; past it the stalest entry is dropped,
/// so a flood of addresses cannot grow the table.
pub const MAX_TRACKED_PEERS: usize = 4096;

/// Slows repeated authentication failures from one peer address, so keys
/// cannot be guessed at line rate: past [`FREE_FAILURES`] in
/// [`FAILURE_WINDOW`], each failure is answered after a delay that doubles
/// from [`FIRST_DELAY`] to [`MAX_DELAY`]. Successful calls are never
/// delayed, so a client that shares an address with a guesser still gets
/// in with its key. Bounded: at most [`MAX_TRACKED_PEERS`] addresses.
#[derive(Debug)]
pub struct FailureLimiter {
    peers: std::sync::Mutex<HashMap<std::net::IpAddr, Failures>>,
    pub(super) free: u32,
}

impl Default for FailureLimiter {
    fn default() -> Self {
        FailureLimiter {
            peers: Default::default(),
            free: FREE_FAILURES,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    since: std::time::Instant,
    count: u32,
}

impl FailureLimiter {
    /// Records a failure from `peer` at `now`; how long to wait before
    /// answering it.
    pub fn record_failure(
        &self,
        peer: std::net::IpAddr,
        now: std::time::Instant,
    ) -> std::time::Duration {
        // An IPv6 host holds a /64: its addresses are one peer.
        let peer = crate::connections::peer_key(peer);
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        if !peers.contains_key(&peer) && peers.len() >= MAX_TRACKED_PEERS {
            // Expired entries first; otherwise the one whose window began
            // longest ago.
            peers.retain(|_, f| now.duration_since(f.since) < FAILURE_WINDOW);
            if peers.len() >= MAX_TRACKED_PEERS
                && let Some(stalest) = peers.iter().min_by_key(|(_, f)| f.since).map(|(ip, _)| *ip)
            {
                peers.remove(&stalest);
            }
        }
        let entry = peers.entry(peer).or_insert(Failures {
            since: now,
            count: 0,
        });
        if now.duration_since(entry.since) >= FAILURE_WINDOW {
            *entry = Failures {
                since: now,
                count: 0,
            };
        }
        entry.count = entry.count.saturating_add(1);
        match entry.count.checked_sub(self.free.saturating_add(1)) {
            None => std::time::Duration::ZERO,
            Some(slowed) => FIRST_DELAY
                .saturating_mul(1 << slowed.min(16))
                .min(MAX_DELAY),
        }
    }

    /// Addresses tracked now.
    pub fn tracked(&self) -> usize {
        self.peers.lock().map(|p| p.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr};
    use std::time::{Duration, Instant};

    #[test]
    fn failures_past_the_free_ones_are_slowed_more_and_more_then_forgiven() {
        let limiter = FailureLimiter::default();
        let peer = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
        let start = Instant::now();
        for _ in 0..FREE_FAILURES {
            assert_eq!(limiter.record_failure(peer, start), Duration::ZERO);
        }
        let delays: Vec<_> = (0..6)
            .map(|_| limiter.record_failure(peer, start))
            .collect();
        assert_eq!(
            delays,
            [100, 200, 400, 800, 1600, 2000].map(Duration::from_millis)
        );
        // Another address is not affected.
        let other = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2));
        assert_eq!(limiter.record_failure(other, start), Duration::ZERO);
        // An IPv6 host's addresses are one peer (its /64); another /64 is
        // another peer.
        let v6 = |s: &str| s.parse::<IpAddr>().unwrap();
        for i in 0..FREE_FAILURES {
            let addr = v6(&format!("2001:db8:1:2::{i:x}"));
            assert_eq!(limiter.record_failure(addr, start), Duration::ZERO);
        }
        assert_eq!(
            limiter.record_failure(v6("2001:db8:1:2:ffff::9"), start),
            FIRST_DELAY
        );
        assert_eq!(
            limiter.record_failure(v6("2001:db8:1:3::1"), start),
            Duration::ZERO
        );
        // A new window starts afresh.
        assert_eq!(
            limiter.record_failure(peer, start + FAILURE_WINDOW),
            Duration::ZERO
        );
    }

    #[test]
    fn the_table_is_bounded() {
        let limiter = FailureLimiter::default();
        let start = Instant::now();
        for i in 0..(MAX_TRACKED_PEERS as u32 + 100) {
            let ip = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i));
            limiter.record_failure(ip, start + Duration::from_millis(i as u64));
        }
        assert_eq!(limiter.tracked(), MAX_TRACKED_PEERS);
    }
}
