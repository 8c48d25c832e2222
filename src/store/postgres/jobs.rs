//! Work one replica at a time does: the roles a replica holds (push
//! delivery), the turns of periodic jobs, and the jobs themselves
//! (trimming the event log, retention's purge).

use std::time::Duration;

use deadpool_postgres::Pool;

use super::{EVENT_LOG_RETAIN, PostgresStore, unavailable};
use crate::lifecycle::StateClass;
use crate::store::sql::state_list;
use crate::store::{StoreError, time_key};
use crate::wkt::Timestamp;

/// [`Coordination::hold`](crate::store::Coordination::hold).
pub(super) async fn hold(store: &PostgresStore, role: &str) -> Result<bool, StoreError> {
    store.standing.check()?;
    let client = store.client().await?;
    let me = store.standing.id();
    // Fenced like a write; the epoch goes up each time the role
    // changes hands, and what is done under the role names it.
    let row = client
        .query_opt(
            "INSERT INTO a2a_jobs (name, last_run, holder, epoch) \
             SELECT $1, now(), $2, 1 FROM (SELECT a2a_fence($2)) f \
             ON CONFLICT (name) DO UPDATE SET last_run = now(), holder = $2, \
             epoch = CASE WHEN a2a_jobs.holder = $2 THEN a2a_jobs.epoch \
             ELSE a2a_jobs.epoch + 1 END \
             WHERE a2a_jobs.holder = $2 \
             OR a2a_jobs.last_run < now() - make_interval(secs => $3) RETURNING epoch",
            &[&role, &&*me, &store.standing.lease().as_secs_f64()],
        )
        .await
        .map_err(unavailable)?;
    let mut epochs = store.epochs.lock().unwrap_or_else(|e| e.into_inner());
    match row {
        Some(row) => {
            epochs.insert(role.to_owned(), row.get(0));
            Ok(true)
        }
        None => {
            epochs.remove(role);
            Ok(false)
        }
    }
}

/// How often one replica trims the event log.
const EVENT_LOG_TRIM_EVERY: Duration = Duration::from_secs(10);

/// [`Coordination::take_turn`](crate::store::Coordination::take_turn) on `client`.
pub(super) async fn take_turn(
    client: &tokio_postgres::Client,
    job: &str,
    every: Duration,
) -> Result<bool, StoreError> {
    let row = client
        .query_opt(
            "INSERT INTO a2a_jobs (name, last_run) VALUES ($1, now()) \
             ON CONFLICT (name) DO UPDATE SET last_run = now() \
             WHERE a2a_jobs.last_run <= now() - make_interval(secs => $2) RETURNING 1",
            &[&job, &every.as_secs_f64()],
        )
        .await
        .map_err(unavailable)?;
    Ok(row.is_some())
}

/// For as long as the store lives, one replica per
/// [`EVENT_LOG_TRIM_EVERY`] trims the event log and forgets what dead
/// replicas watched (apart from the lease's renewal: a slow trim must
/// never make a renewal late).
pub(super) async fn trim_event_log_while_open(pool: Pool) {
    let mut ticks = tokio::time::interval(EVENT_LOG_TRIM_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if let Err(e) = trim_event_log(&pool).await {
            tracing::warn!(error = %e, "could not trim the event log");
        }
    }
}

async fn trim_event_log(pool: &Pool) -> Result<(), StoreError> {
    let client = pool.get().await.map_err(unavailable)?;
    if !take_turn(&client, "event-log", EVENT_LOG_TRIM_EVERY).await? {
        return Ok(());
    }
    client
        .execute(
            "DELETE FROM task_events WHERE at < now() - make_interval(secs => $1)",
            &[&EVENT_LOG_RETAIN.as_secs_f64()],
        )
        .await
        .map_err(unavailable)?;
    // What replicas whose lease ran out were watching.
    client
        .execute(
            "DELETE FROM task_watchers w USING replicas r \
             WHERE w.replica = r.id AND r.dead",
            &[],
        )
        .await
        .map_err(unavailable)?;
    Ok(())
}

/// [`TaskStore::purge_terminal_before`](crate::store::TaskStore::purge_terminal_before).
pub(super) async fn purge_terminal_before(
    store: &PostgresStore,
    before: &Timestamp,
) -> Result<u64, StoreError> {
    let (s, n) = time_key(before);
    // A purged task's idempotency claim goes with it; so do the claims
    // of replicas dead since before the cutoff whose runs created no
    // task. Not sooner: such a claim says that a run may have acted on
    // its message, and a retry taking it over records the task as lost
    // instead of running the agent again; forgotten at once (a sweep
    // between the replica's death and the retry), the retry would run
    // it a second time. Kept as long as a terminal task, it ends as one
    // would.
    let sql = format!(
        "WITH gone AS (DELETE FROM tasks WHERE state IN ({}) \
         AND (status_seconds, status_nanos) < ($1, $2) RETURNING tenant, id, origin), \
         claims AS (DELETE FROM origin_claims c USING gone \
         WHERE c.tenant = gone.tenant AND c.origin = gone.origin AND gone.origin <> ''::bytea), \
         changes AS (DELETE FROM task_changes c USING gone \
         WHERE c.tenant = gone.tenant AND c.task_id = gone.id), \
         events AS (DELETE FROM task_events e USING gone \
         WHERE e.tenant = gone.tenant AND e.task_id = gone.id) \
         SELECT COUNT(*) FROM gone",
        state_list(StateClass::Terminal)
    );
    let client = store.client().await?;
    let row = client
        .query_one(&sql, &[&s, &n])
        .await
        .map_err(unavailable)?;
    client
        .execute(
            "DELETE FROM origin_claims c USING replicas r WHERE c.replica = r.id \
             AND r.dead AND r.lease_until < to_timestamp($1::int8::float8) \
             AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.tenant = c.tenant AND t.origin = c.origin)",
            &[&s],
        )
        .await
        .map_err(unavailable)?;
    Ok(row.get::<_, i64>(0) as u64)
}
