//! Per-caller pacing of what the server sends back: the bytes of tasks
//! and events one caller may take per second.
//!
//! A task may be up to `MAX_TASK_BYTES` and a ListTasks page up to
//! `MAX_PAGE_BYTES`; encoding and writing one is milliseconds of CPU. A
//! caller reading its huge tasks in a loop (GetTask, ListTasks,
//! SubscribeToTask again and again, or a tiny follow-up whose answer is
//! the whole task) would otherwise take a core for itself, and every other
//! caller's latency would grow with it. Each caller has a budget of
//! [`READ_BYTES_PER_SECOND`] with a burst of [`READ_BURST`]: a call waits,
//! before it is served, until the caller's debt is back within the burst;
//! what it was sent (encoded size) is then charged, and for ListTasks the
//! tasks it counted ([`list_cost`]). Answers under [`UNCHARGED_BYTES`] are
//! free: calls and callers that read small tasks never wait.
//!
//! The caller is its principal with `--auth`, and otherwise its address
//! (an IPv6 /64, as [`crate::connections::peer_key`]). The budget is a
//! time at which the caller's debt is paid ("theoretical arrival time" of
//! the generic cell rate algorithm): one instant per caller, forgotten
//! once paid.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Bytes one caller may be sent per second, by default (kept with the
/// connection bounds, which carry it to the server).
pub use crate::connections::READ_BYTES_PER_SECOND;

/// How far ahead of its rate a caller may read before it waits: this many
/// seconds of its budget (16 MiB at the default rate, several pages of the
/// largest tasks).
pub const READ_BURST: Duration = Duration::from_secs(2);

/// What a ListTasks call costs beside its bytes, per task the store
/// counted for its `totalSize` (spec §3.1.4): counting reads an index
/// entry per matching task, however small the page.
pub const COUNTED_TASK_BYTES: usize = 128;

/// The least a ListTasks call costs: a call whose page is empty still
/// reads the store.
pub const LIST_CALL_BYTES: usize = 16 << 10;

/// What a ListTasks answer is charged: its bytes, and the tasks counted.
pub fn list_cost(page: &crate::proto::ListTasksResponse) -> usize {
    let counted = usize::try_from(page.total_size).unwrap_or(0);
    (prost::Message::encoded_len(page) + counted.saturating_mul(COUNTED_TASK_BYTES))
        .max(LIST_CALL_BYTES)
}

/// Answers smaller than this are not charged. What a small answer costs
/// is its call's, not its bytes' (a loop of small calls is a request
/// rate, which this does not bound), and leaving them out keeps the
/// budget's bookkeeping off the path of ordinary calls: while no caller
/// is in debt, waiting is one atomic load.
pub const UNCHARGED_BYTES: usize = 16 << 10;

/// The longest debt a caller can be charged.
const SATURATED: Duration = Duration::from_secs(365 * 24 * 3600);

/// Callers remembered before the paid ones are forgotten.
const FORGET_AT: usize = 1024;

/// Who is paced: a principal, or an address on a server without
/// authentication.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum Reader {
    Principal(String),
    Peer(std::net::IpAddr),
    /// Neither is known (an embedded server called without a peer): not
    /// paced.
    Unknown,
}

/// The callers' budgets.
pub struct Pacing {
    /// Bytes per second; 0: off.
    rate: u64,
    /// When each caller's debt is paid.
    paid_at: Mutex<HashMap<Reader, Instant>>,
    /// How many callers `paid_at` holds (read without its lock).
    debtors: AtomicUsize,
}

impl Default for Pacing {
    fn default() -> Self {
        Pacing::new(READ_BYTES_PER_SECOND)
    }
}

impl Pacing {
    pub fn new(bytes_per_second: u64) -> Self {
        Pacing {
            rate: bytes_per_second,
            paid_at: Mutex::new(HashMap::new()),
            debtors: AtomicUsize::new(0),
        }
    }

    /// Waits until `reader` is within its burst again.
    pub async fn wait(&self, reader: &Reader) {
        if self.rate == 0 || *reader == Reader::Unknown || self.debtors.load(Ordering::Acquire) == 0
        {
            return;
        }
        let start = {
            let mut paid_at = self.lock();
            let Some(at) = paid_at.get(reader).copied() else {
                return;
            };
            if at <= Instant::now() {
                // Paid: forgotten, so the others wait on one load again.
                paid_at.remove(reader);
                self.debtors.store(paid_at.len(), Ordering::Release);
                return;
            }
            at.checked_sub(READ_BURST)
        };
        if let Some(start) = start {
            tokio::time::sleep_until(start).await;
        }
    }

    /// Charges `bytes` sent to `reader`.
    pub fn charge(&self, reader: &Reader, bytes: usize) {
        if self.rate == 0 || *reader == Reader::Unknown || bytes < UNCHARGED_BYTES {
            return;
        }
        // A cost past any real wait (a year) saturates there instead of
        // overflowing the instant.
        let cost = Duration::try_from_secs_f64(bytes as f64 / self.rate as f64)
            .unwrap_or(Duration::MAX)
            .min(SATURATED);
        let now = Instant::now();
        let mut paid_at = self.lock();
        if paid_at.len() >= FORGET_AT {
            paid_at.retain(|_, at| *at > now);
        }
        let at = paid_at.entry(reader.clone()).or_insert(now);
        *at = ((*at).max(now) + cost).min(now + SATURATED);
        self.debtors.store(paid_at.len(), Ordering::Release);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Reader, Instant>> {
        self.paid_at.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> Reader {
        Reader::Principal("alice".into())
    }

    /// A second of budget at [`RATE`].
    const RATE: u64 = UNCHARGED_BYTES as u64;
    const SECOND: usize = UNCHARGED_BYTES;

    #[tokio::test(start_paused = true)]
    async fn a_reader_within_its_burst_does_not_wait() {
        let pacing = Pacing::new(RATE);
        pacing.charge(&alice(), SECOND);
        let start = Instant::now();
        pacing.wait(&alice()).await;
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_past_its_burst_waits_for_its_rate() {
        let pacing = Pacing::new(RATE);
        // 5 s of budget: 3 s past the burst.
        pacing.charge(&alice(), 5 * SECOND);
        let start = Instant::now();
        pacing.wait(&alice()).await;
        assert_eq!(start.elapsed(), Duration::from_secs(3));
        // Another reader is not held back.
        let start = Instant::now();
        pacing.wait(&Reader::Principal("bob".into())).await;
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn debt_accumulates_and_is_paid_off_over_time() {
        let pacing = Pacing::new(RATE);
        for _ in 0..4 {
            pacing.charge(&alice(), SECOND);
        }
        tokio::time::advance(Duration::from_secs(2)).await;
        // 4 s charged, 2 s passed: within the burst.
        let start = Instant::now();
        pacing.wait(&alice()).await;
        assert_eq!(start.elapsed(), Duration::ZERO);
        pacing.charge(&alice(), SECOND * 3 / 2);
        pacing.wait(&alice()).await;
        assert_eq!(start.elapsed(), Duration::from_millis(1500));
    }

    #[tokio::test(start_paused = true)]
    async fn small_answers_are_free_and_paid_debts_forgotten() {
        let pacing = Pacing::new(RATE);
        for _ in 0..1000 {
            pacing.charge(&alice(), UNCHARGED_BYTES - 1);
        }
        assert_eq!(pacing.debtors.load(Ordering::Acquire), 0);
        pacing.charge(&alice(), 3 * SECOND);
        assert_eq!(pacing.debtors.load(Ordering::Acquire), 1);
        let start = Instant::now();
        pacing.wait(&alice()).await;
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        tokio::time::advance(Duration::from_secs(2)).await;
        pacing.wait(&alice()).await;
        assert_eq!(start.elapsed(), Duration::from_secs(3));
        assert_eq!(
            pacing.debtors.load(Ordering::Acquire),
            0,
            "a paid debt is forgotten"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn off_and_unknown_readers_never_wait() {
        let off = Pacing::new(0);
        off.charge(&alice(), usize::MAX);
        let on = Pacing::new(1);
        on.charge(&Reader::Unknown, usize::MAX);
        let start = Instant::now();
        off.wait(&alice()).await;
        on.wait(&Reader::Unknown).await;
        assert_eq!(start.elapsed(), Duration::ZERO);
    }
}
