//! The push notification outbox as delivery reads and settles it, under
//! the delivery role as last held.

use std::sync::Arc;

use super::{PostgresStore, text, unavailable};
use crate::store::{DELIVERY_ROLE, Delivery, StoreError};

/// [`Outbox::pending`](crate::store::Outbox::pending).
pub(super) async fn pending(
    store: &PostgresStore,
    after_seq: u64,
    limit: usize,
) -> Result<Vec<Delivery>, StoreError> {
    let client = store.client().await?;
    let after = i64::try_from(after_seq).unwrap_or(i64::MAX);
    let rows = client
        .query(
            // The task's owner from its row (by primary key); "" once
            // purged.
            "SELECT o.seq, o.tenant, o.task_id, o.config_id, o.event, o.attempts, \
             o.not_before, t.owner FROM push_outbox o \
             LEFT JOIN tasks t ON t.tenant = o.tenant AND t.id = o.task_id \
             WHERE o.seq > $1 ORDER BY o.seq LIMIT $2",
            &[&after, &(limit as i64)],
        )
        .await
        .map_err(unavailable)?;
    rows.into_iter()
        .map(|r| {
            Ok(Delivery {
                seq: r.get::<_, i64>(0) as u64,
                tenant: text(r.get(1))?,
                task_id: text(r.get(2))?,
                owner: text(r.get::<_, Option<Vec<u8>>>(7).unwrap_or_default())?,
                config_id: text(r.get(3))?,
                event: r.get(4),
                attempts: r.get::<_, i32>(5) as u32,
                not_before_ms: r.get(6),
            })
        })
        .collect()
}

/// [`Outbox::finish_delivery`](crate::store::Outbox::finish_delivery).
pub(super) async fn finish_delivery(store: &PostgresStore, seq: u64) -> Result<(), StoreError> {
    let Ok(seq) = i64::try_from(seq) else {
        return Ok(());
    };
    let (me, epoch) = delivering(store)?;
    let client = store.client().await?;
    // Only under the delivery role as read (its epoch): after it
    // changed hands the entry is the next holder's to deliver.
    client
        .execute(
            "DELETE FROM push_outbox o USING (SELECT a2a_fence($2)) f, a2a_jobs j \
             WHERE o.seq = $1 AND j.name = $3 AND j.holder = $2 AND j.epoch = $4",
            &[&seq, &&*me, &DELIVERY_ROLE, &epoch],
        )
        .await
        .map_err(unavailable)?;
    Ok(())
}

/// [`Outbox::defer_delivery`](crate::store::Outbox::defer_delivery).
pub(super) async fn defer_delivery(
    store: &PostgresStore,
    seq: u64,
    attempts: u32,
    not_before_ms: i64,
) -> Result<(), StoreError> {
    let Ok(seq) = i64::try_from(seq) else {
        return Ok(());
    };
    let (me, epoch) = delivering(store)?;
    let client = store.client().await?;
    client
        .execute(
            "UPDATE push_outbox o SET attempts = $2, not_before = $3 \
             FROM (SELECT a2a_fence($4)) f, a2a_jobs j \
             WHERE o.seq = $1 AND j.name = $5 AND j.holder = $4 AND j.epoch = $6",
            &[
                &seq,
                &(attempts as i32),
                &not_before_ms,
                &&*me,
                &DELIVERY_ROLE,
                &epoch,
            ],
        )
        .await
        .map_err(unavailable)?;
    Ok(())
}

/// This replica's id and the epoch of the delivery role it holds;
/// an error when it holds none.
fn delivering(store: &PostgresStore) -> Result<(Arc<[u8]>, i64), StoreError> {
    store.standing.check()?;
    let epochs = store.epochs.lock().unwrap_or_else(|e| e.into_inner());
    match epochs.get(DELIVERY_ROLE) {
        Some(&epoch) => Ok((store.standing.id(), epoch)),
        None => Err(StoreError::Unavailable(
            "this replica does not hold the push delivery role".into(),
        )),
    }
}
