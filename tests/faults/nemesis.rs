//! The nemesis: faults on a schedule drawn from the run's seed.
//!
//! The whole schedule is drawn before the run (so a seed names it, and
//! replaying the seed replays it): after a 2 s warm-up, a fault every
//! 0.7-2.5 s until 1 s before the faults end, each on a replica not
//! already under one, never leaving fewer than one replica untouched
//! (PostgreSQL restarts aside, which hit every replica):
//!
//! - **kill**: SIGKILL, down 0.2-3 s, then a new process in the slot (same
//!   store URL, a new port);
//! - **pause**: SIGSTOP, held past the lease (lease + 0.5-3 s) four times
//!   in five, else for less than the lease, then SIGCONT; when no replica
//!   is under a fault, one time in three two replicas are paused at once
//!   for lease + 1-3.5 s;
//! - **cut**: the replica's PostgreSQL proxy cut (reset or blackhole, half
//!   each) for 0.5 s to 2 leases + 2 s, then healed;
//! - **postgres restart** (only with `A2A_TEST_POSTGRES_RESTART=1`): the
//!   machine's cluster stopped (`-m fast`), down 0.5-3 s, started again.
//!
//! A fault whose replica is not in the state the schedule expects when its
//! time comes (a restart still failing) is skipped, and says so.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::task::TaskTracker;

use crate::cluster::{Cluster, Postgres};
use crate::history::Fault;
use crate::proxy::CutMode;

#[derive(Clone, Copy, Debug)]
pub enum Kind {
    Kill { down_ms: u64 },
    Pause { hold_ms: u64 },
    Cut { hold_ms: u64, mode: CutMode },
    PostgresRestart { down_ms: u64 },
}

/// One fault of the schedule.
#[derive(Clone, Copy, Debug)]
pub struct Planned {
    /// Since the faults began.
    pub at_ms: u64,
    pub slot: Option<usize>,
    pub kind: Kind,
}

impl std::fmt::Display for Planned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = self.at_ms as f64 / 1000.0;
        let slot = self.slot.map(|s| format!("r{s}")).unwrap_or_default();
        match self.kind {
            Kind::Kill { down_ms } => write!(f, "{at:.1}s kill {slot} down {down_ms}ms"),
            Kind::Pause { hold_ms } => write!(f, "{at:.1}s pause {slot} {hold_ms}ms"),
            Kind::Cut { hold_ms, mode } => {
                write!(f, "{at:.1}s cut {slot} {mode:?} {hold_ms}ms")
            }
            Kind::PostgresRestart { down_ms } => {
                write!(f, "{at:.1}s postgres restart down {down_ms}ms")
            }
        }
    }
}

/// The schedule for `seed`: faults over `length` on `replicas` replicas.
pub fn plan(
    seed: u64,
    length: Duration,
    lease: Duration,
    replicas: usize,
    postgres: bool,
) -> Vec<Planned> {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x6e65_6d65_7369_7300);
    let lease_ms = u64::try_from(lease.as_millis()).expect("a short lease");
    let end = u64::try_from(length.as_millis()).expect("a short run");
    let mut busy_until = vec![0u64; replicas];
    let mut postgres_busy_until = 0;
    let mut t = 2000;
    let mut plan = Vec::new();
    loop {
        t += rng.u64(700..2500);
        if t + 1000 >= end {
            return plan;
        }
        let left = end - t - 500;
        let pick = rng.u8(..if postgres { 10 } else { 9 });
        if pick == 9 {
            if postgres_busy_until <= t {
                let down_ms = rng.u64(500..3000).min(left);
                plan.push(Planned {
                    at_ms: t,
                    slot: None,
                    kind: Kind::PostgresRestart { down_ms },
                });
                // Stopping and starting take seconds each (and restarts
                // are one at a time anyway).
                postgres_busy_until = t + down_ms + 15_000;
            }
            continue;
        }
        let free: Vec<usize> = (0..replicas).filter(|&s| busy_until[s] <= t).collect();
        if free.len() < 2 {
            continue;
        }
        let slot = free[rng.usize(..free.len())];
        // Two replicas paused past the lease at once, one left (the
        // issue's scenario: push deliveries in flight on a paused holder).
        if pick % 3 == 1 && free.len() == replicas && rng.u8(..3) == 0 {
            let hold_ms = (lease_ms + rng.u64(1000..3500)).min(left);
            let other = free[(free.iter().position(|&s| s == slot).unwrap_or(0)
                + 1
                + rng.usize(..free.len() - 1))
                % free.len()];
            for s in [slot, other] {
                busy_until[s] = t + hold_ms + 500;
                plan.push(Planned {
                    at_ms: t,
                    slot: Some(s),
                    kind: Kind::Pause { hold_ms },
                });
            }
            continue;
        }
        let (kind, busy) = match pick % 3 {
            0 => {
                let down_ms = rng.u64(200..3000).min(left);
                // A restart takes a while (and is retried while
                // PostgreSQL is down).
                (Kind::Kill { down_ms }, down_ms + 6000)
            }
            1 => {
                let hold_ms = if rng.u8(..5) < 4 {
                    lease_ms + rng.u64(500..3000)
                } else {
                    rng.u64(300..lease_ms * 8 / 10)
                }
                .min(left);
                (Kind::Pause { hold_ms }, hold_ms + 500)
            }
            _ => {
                let hold_ms = rng.u64(500..2 * lease_ms + 2000).min(left);
                let mode = if rng.bool() {
                    CutMode::Reset
                } else {
                    CutMode::Blackhole
                };
                (Kind::Cut { hold_ms, mode }, hold_ms + 500)
            }
        };
        busy_until[slot] = t + busy;
        plan.push(Planned {
            at_ms: t,
            slot: Some(slot),
            kind,
        });
    }
}

/// Runs `plan` from now; returns once every fault has been done and
/// undone.
pub async fn run(cluster: Arc<Cluster>, postgres: Option<Arc<Postgres>>, plan: Vec<Planned>) {
    let began = tokio::time::Instant::now();
    let tracker = TaskTracker::new();
    for fault in plan {
        tokio::time::sleep_until(began + Duration::from_millis(fault.at_ms)).await;
        let (cluster, postgres) = (cluster.clone(), postgres.clone());
        tracker.spawn(async move { act(&cluster, postgres.as_deref(), fault).await });
    }
    tracker.close();
    tracker.wait().await;
}

async fn act(cluster: &Cluster, postgres: Option<&Postgres>, fault: Planned) {
    let history = &cluster.history;
    let lease = cluster.lease;
    let skipped = |kind: &str, why: &str| {
        let now = history.now();
        history.fault(Fault {
            kind: format!("{kind} (skipped)"),
            slot: fault.slot,
            process: None,
            start: now,
            end: Some(now),
            past_lease: false,
            note: why.to_owned(),
        });
    };
    let record = |kind: &str, process: Option<String>, note: String| {
        history.fault(Fault {
            kind: kind.to_owned(),
            slot: fault.slot,
            process,
            start: history.now(),
            end: None,
            past_lease: false,
            note,
        })
    };
    match (fault.kind, fault.slot) {
        (Kind::Kill { down_ms }, Some(slot)) => {
            let Some((name, _)) = cluster.kill(slot) else {
                return skipped("kill", "no process in the slot");
            };
            let i = record("kill", Some(name), String::new());
            tokio::time::sleep(Duration::from_millis(down_ms)).await;
            let note = match cluster.start_retrying(slot, Duration::from_secs(30)).await {
                Ok(name) => format!("restarted as {name}"),
                Err(why) => format!("NOT restarted: {why}"),
            };
            history.fault_done(i, true, &note);
        }
        (Kind::Pause { hold_ms }, Some(slot)) => {
            let Some(name) = cluster.pause(slot) else {
                return skipped("pause", "no process in the slot");
            };
            let i = record("pause", Some(name), format!("{hold_ms}ms"));
            tokio::time::sleep(Duration::from_millis(hold_ms)).await;
            cluster.resume(slot);
            history.fault_done(i, Duration::from_millis(hold_ms) >= lease, "");
        }
        (Kind::Cut { hold_ms, mode }, Some(slot)) => {
            let process = cluster.slots[slot].current().map(|p| p.name.clone());
            cluster.slots[slot].proxy.cut(mode);
            let i = record("cut", process, format!("{mode:?} {hold_ms}ms"));
            tokio::time::sleep(Duration::from_millis(hold_ms)).await;
            cluster.slots[slot].proxy.heal();
            history.fault_done(i, Duration::from_millis(hold_ms) >= lease, "");
        }
        (Kind::PostgresRestart { down_ms }, None) => {
            let Some(postgres) = postgres else {
                return skipped("postgres restart", "not asked for");
            };
            let (began, started) = postgres
                .restart(history, Duration::from_millis(down_ms))
                .await;
            history.fault(Fault {
                kind: "postgres restart".into(),
                slot: None,
                process: None,
                start: began,
                end: Some(started),
                past_lease: Duration::from_micros((started.0 - began.0).unsigned_abs()) >= lease,
                note: format!("down {down_ms}ms between stop and start"),
            });
        }
        (kind, slot) => panic!("a fault planned wrong: {kind:?} on {slot:?}"),
    }
}
