//! This replica's standing among the replicas sharing a PostgreSQL
//! database: its lease, renewed on a connection of its own, and the
//! fencing that keeps a replica whose lease ran out from writing what
//! another has taken over (migration `0009_fencing.sql`).
//!
//! - The lease is renewed every third of its length, each renewal with a
//!   deadline of [`RENEWAL_DEADLINE_PART`] of it, on a connection nothing
//!   else uses: a pool busy with writes cannot make a renewal late.
//! - Locally, the lease is held until the moment its last successful
//!   renewal was *sent* plus the lease, less [`SAFETY_MARGIN_PART`]: the
//!   database set its end later than that, so this replica stops before
//!   any other can take it for dead. Past that moment (renewals failing,
//!   the database cut off, the process paused) the replica fences itself:
//!   its store refuses writes at once ([`Standing::check`]), and the
//!   runtime, told by [`Standing::lost`], stops its runs.
//! - In the database, a replica whose lease ran out is declared dead by a
//!   live one (`a2a_reap`) before anything it held is taken over, and a
//!   dead replica's lease is never renewed: the renewal finds it dead and
//!   the replica rejoins under a new id, so what it held under the old one
//!   stays taken over. Every write transaction checks first that its
//!   replica is not dead (`a2a_fence`), holding it alive to its commit.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::tls::Connector;
use super::unavailable;
use crate::store::StoreError;

/// Renewals have this part of the lease to answer (under a third: a late
/// renewal is given up before the next is due).
pub const RENEWAL_DEADLINE_PART: u32 = 4;
/// Leases are renewed this many times per lease.
pub const RENEWALS_PER_LEASE: u32 = 3;
/// The part of the lease this replica stops short of, for the clocks'
/// rates (this process's monotonic clock against the database's).
pub const SAFETY_MARGIN_PART: u32 = 10;
/// SQLSTATE of `a2a_fence`'s refusal.
pub const FENCED_SQLSTATE: &str = "A2A01";
/// How many of the ids this process wrote under before it last rejoined
/// are kept ([`Standing::ids`]): one more per lease lost, 16 bytes each.
pub const MAX_FORMER_IDS: usize = 64;

/// Registers a new replica id with a lease of `lease`.
pub const JOIN: &str = "INSERT INTO replicas (id, lease_until) \
     VALUES ($1, now() + make_interval(secs => $2))";
/// Renews a live replica's lease; no row when it was declared dead.
pub const RENEW: &str = "UPDATE replicas SET lease_until = now() + make_interval(secs => $2) \
     WHERE id = $1 AND NOT dead RETURNING 1";
/// Declares dead the replicas whose lease ran out (see the migration).
pub const REAP: &str = "SELECT a2a_reap()";

/// This replica's id and whether it holds its lease, shared by the store,
/// its writers and the renewal.
pub struct Standing {
    lease: Duration,
    /// The id this replica writes under now; a new one after it was
    /// declared dead.
    id: RwLock<Arc<[u8]>>,
    /// The ids this process wrote under before, newest last (at most
    /// [`MAX_FORMER_IDS`]).
    former: RwLock<Vec<Arc<[u8]>>>,
    /// When [`Self::base`] is zero: nanoseconds after it until which the
    /// lease is held (0: not held).
    held_until: AtomicU64,
    base: Instant,
    /// One more each time the lease is lost: the runtime stops the runs
    /// started before.
    losses: watch::Sender<u64>,
}

impl Standing {
    pub fn new(lease: Duration) -> Arc<Self> {
        Arc::new(Standing {
            lease,
            id: RwLock::new(new_id()),
            former: RwLock::new(Vec::new()),
            held_until: AtomicU64::new(0),
            base: Instant::now(),
            losses: watch::channel(0).0,
        })
    }

    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The id writes are made under now.
    pub fn id(&self) -> Arc<[u8]> {
        self.id.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// How long the lease is certainly still held; zero when it is not.
    pub fn held_for(&self) -> Duration {
        let until = self.held_until.load(Ordering::Acquire);
        let now = self.nanos(Instant::now());
        Duration::from_nanos(until.saturating_sub(now))
    }

    /// `Ok` while the lease is held; the error a write gets otherwise.
    pub fn check(&self) -> Result<(), StoreError> {
        if self.held_for().is_zero() {
            return Err(StoreError::Unavailable(
                "this replica does not hold its lease on the shared PostgreSQL database \
                 (renewals late or failing: the database unreachable, or the process was \
                 paused), so it takes no writes until it holds it again"
                    .into(),
            ));
        }
        Ok(())
    }

    /// A renewal sent at `sent` succeeded.
    pub fn renewed(&self, sent: Instant) {
        let until = sent + self.lease - self.lease / SAFETY_MARGIN_PART;
        self.held_until
            .fetch_max(self.nanos(until).max(1), Ordering::AcqRel);
    }

    /// The lease is not held (any more): writes are refused from now on,
    /// and, if it was held until now, the runtime is told. Returns whether
    /// this was news.
    pub fn lose(&self) -> bool {
        let was = self.held_until.swap(0, Ordering::AcqRel);
        if was == 0 {
            return false;
        }
        self.losses.send_modify(|n| *n += 1);
        true
    }

    /// After the database declared the old id dead: writes are made under
    /// `id` from now on (not yet held: [`Self::renewed`] once it is
    /// registered).
    pub fn rejoin(&self, id: Arc<[u8]>) {
        self.lose();
        let old = std::mem::replace(&mut *self.id.write().unwrap_or_else(|e| e.into_inner()), id);
        let mut former = self.former.write().unwrap_or_else(|e| e.into_inner());
        if former.len() == MAX_FORMER_IDS {
            former.remove(0);
        }
        former.push(old);
    }

    /// Every id this process wrote under: the current one first, then
    /// those it had before it rejoined. A run this process owes a task
    /// (`tasks.owed`) may have been recorded under any of them: its queue
    /// of follow-ups outlives a rejoin.
    pub fn ids(&self) -> Vec<Vec<u8>> {
        let mut ids = vec![self.id().to_vec()];
        let former = self.former.read().unwrap_or_else(|e| e.into_inner());
        ids.extend(former.iter().rev().map(|id| id.to_vec()));
        ids
    }

    /// Counts the losses of the lease.
    pub fn losses(&self) -> watch::Receiver<u64> {
        self.losses.subscribe()
    }

    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos())
            .unwrap_or(u64::MAX)
            // 0 means "not held".
            .max(1)
    }
}

/// A fresh random replica id.
pub fn new_id() -> Arc<[u8]> {
    uuid::Uuid::new_v4().as_bytes().as_slice().into()
}

/// Registers this replica's current id (at start, and after it was
/// declared dead) and takes its lease.
pub async fn join(client: &tokio_postgres::Client, standing: &Standing) -> Result<(), StoreError> {
    let sent = Instant::now();
    let id = standing.id();
    client
        .execute(JOIN, &[&&*id, &standing.lease.as_secs_f64()])
        .await
        .map_err(unavailable)?;
    standing.renewed(sent);
    Ok(())
}

/// What one renewal found.
enum Renewal {
    Renewed,
    /// This id was declared dead.
    Dead,
}

async fn renew(
    client: &tokio_postgres::Client,
    standing: &Standing,
) -> Result<Renewal, StoreError> {
    let id = standing.id();
    let row = client
        .query_opt(RENEW, &[&&*id, &standing.lease.as_secs_f64()])
        .await
        .map_err(unavailable)?;
    Ok(match row {
        Some(_) => Renewal::Renewed,
        None => Renewal::Dead,
    })
}

/// Makes the renewal's own connection.
pub type Connect = Arc<
    dyn Fn() -> futures_util::future::BoxFuture<'static, Result<tokio_postgres::Client, StoreError>>
        + Send
        + Sync,
>;

/// Renews the lease for as long as the store lives, on a connection of its
/// own (made again when it breaks), each attempt with a deadline; loses
/// the standing as soon as the lease is no longer certainly held, and
/// rejoins under a new id once the database says the old one is dead.
pub async fn keep(standing: Arc<Standing>, connect: Connect) {
    let every = standing.lease / RENEWALS_PER_LEASE;
    let deadline = standing.lease / RENEWAL_DEADLINE_PART;
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut client: Option<tokio_postgres::Client> = None;
    loop {
        ticks.tick().await;
        // After a pause of the process, the lease may have run out while
        // nothing here ran: stop before anything else does.
        if standing.held_for().is_zero() && standing.lose() {
            tracing::warn!(
                "this replica's lease ran out before it could renew it; it takes no work until it holds it again"
            );
        }
        let sent = Instant::now();
        let attempt = async {
            if client.as_ref().is_none_or(|c| c.is_closed()) {
                client = Some(connect().await?);
            }
            let c = client.as_ref().expect("connected");
            match renew(c, &standing).await? {
                Renewal::Renewed => Ok::<_, StoreError>(true),
                Renewal::Dead => {
                    standing.rejoin(new_id());
                    join(c, &standing).await?;
                    Ok(false)
                }
            }
        };
        match tokio::time::timeout(deadline, attempt).await {
            Ok(Ok(true)) => standing.renewed(sent),
            Ok(Ok(false)) => tracing::warn!(
                replica = %hex(&standing.id()),
                "this replica was declared dead after its lease ran out; it rejoined under a new id"
            ),
            Ok(Err(e)) => {
                client = None;
                tracing::warn!(error = %e, "could not renew this replica's lease");
            }
            Err(_) => {
                // The connection may be stuck: a fresh one next time.
                client = None;
                tracing::warn!("renewing this replica's lease took over {deadline:?}; given up");
            }
        }
        if standing.held_for().is_zero() && standing.lose() {
            tracing::warn!("this replica lost its lease; it takes no work until it holds it again");
        }
    }
}

pub fn hex(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// The lease renewal's own connection ([`keep`]), made with the
/// store's settings (TLS included); its statements time out with the
/// renewal's deadline.
pub(super) fn renewal_connection(connector: &Connector, lease: Duration) -> Connect {
    let connector = connector.clone();
    let deadline = (lease / RENEWAL_DEADLINE_PART).as_millis().max(1);
    Arc::new(move || {
        let connector = connector.clone();
        Box::pin(async move {
            let (client, connection) = connector.connect().await.map_err(unavailable)?;
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "the lease renewal's connection closed");
                }
            });
            // A renewal need not wait for the disk: one lost with a crash of
            // the database only ends the lease sooner in the database than
            // here, and whatever this replica writes then is fenced there
            // (`a2a_fence`). Waiting for the WAL flush behind the writers'
            // commits made renewals late under load (the fault harness:
            // healthy replicas losing their lease).
            client
                .batch_execute(&format!(
                    "SET statement_timeout = {deadline}; SET synchronous_commit = off"
                ))
                .await
                .map_err(unavailable)?;
            Ok(client)
        })
    })
}

/// Declares dead the replicas whose lease ran out (`a2a_reap`), before
/// anything they held is taken over.
pub(super) async fn reap(client: &tokio_postgres::Client) -> Result<(), StoreError> {
    client.execute(REAP, &[]).await.map_err(unavailable)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_held_until_a_margin_before_its_end_and_lost_once() {
        let standing = Standing::new(Duration::from_secs(10));
        assert!(standing.check().is_err(), "held before any renewal");
        let mut losses = standing.losses();
        standing.renewed(Instant::now());
        let held = standing.held_for();
        assert!(
            held > Duration::from_secs(8) && held <= Duration::from_secs(9),
            "{held:?}"
        );
        assert!(standing.check().is_ok());
        assert!(standing.lose());
        assert!(!standing.lose(), "a loss is news once");
        assert!(losses.has_changed().unwrap());
        assert_eq!(*losses.borrow_and_update(), 1);
        assert!(standing.check().is_err());
    }

    #[test]
    fn a_renewal_sent_long_ago_holds_nothing() {
        let standing = Standing::new(Duration::from_millis(100));
        let long_ago = Instant::now() - Duration::from_secs(1);
        standing.renewed(long_ago);
        assert!(standing.check().is_err());
    }

    #[test]
    fn rejoining_changes_the_id_and_loses_the_lease() {
        let standing = Standing::new(Duration::from_secs(10));
        standing.renewed(Instant::now());
        let old = standing.id();
        standing.rejoin(new_id());
        assert_ne!(old, standing.id());
        assert!(standing.check().is_err());
    }
}
