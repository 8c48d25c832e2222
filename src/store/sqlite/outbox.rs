//! The push notification outbox as delivery reads and settles it.

use super::{SqliteStore, map_err, writer};
use crate::store::{Delivery, StoreError};

/// The outbox in commit order, from a point on (by the primary key).
/// The task's owner comes from its row (by primary key); "" once purged.
const OUTBOX: &str = "SELECT o.seq, o.tenant, o.task_id, o.config_id, o.event, o.attempts, \
     o.not_before, t.owner FROM push_outbox o \
     LEFT JOIN tasks t ON t.tenant = o.tenant AND t.id = o.task_id \
     WHERE o.seq > ?1 ORDER BY o.seq LIMIT ?2";

/// [`Outbox::pending`](crate::store::Outbox::pending).
pub(super) async fn pending(
    store: &SqliteStore,
    after_seq: u64,
    limit: usize,
) -> Result<Vec<Delivery>, StoreError> {
    store
        .read(move |conn| {
            let mut statement = conn.prepare_cached(OUTBOX).map_err(map_err)?;
            let text = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).into_owned();
            // SQLite integers are signed: a seq past i64::MAX is never
            // written, so "after" it reads nothing.
            let after = i64::try_from(after_seq).unwrap_or(i64::MAX);
            let rows = statement
                .query_map([after, limit as i64], |r| {
                    Ok(Delivery {
                        seq: r.get::<_, i64>(0)? as u64,
                        tenant: text(r.get(1)?),
                        task_id: text(r.get(2)?),
                        owner: text(r.get::<_, Option<Vec<u8>>>(7)?.unwrap_or_default()),
                        config_id: text(r.get(3)?),
                        event: r.get(4)?,
                        attempts: r.get::<_, i64>(5)? as u32,
                        not_before_ms: r.get(6)?,
                    })
                })
                .map_err(map_err)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(map_err)
        })
        .await
}

/// [`Outbox::finish_delivery`](crate::store::Outbox::finish_delivery).
pub(super) async fn finish_delivery(store: &SqliteStore, seq: u64) -> Result<(), StoreError> {
    store
        .writer
        .write(writer::WriteRequest::FinishDelivery { seq: seq as i64 })
        .await
        .map(drop)
}

/// [`Outbox::defer_delivery`](crate::store::Outbox::defer_delivery).
pub(super) async fn defer_delivery(
    store: &SqliteStore,
    seq: u64,
    attempts: u32,
    not_before_ms: i64,
) -> Result<(), StoreError> {
    let write = writer::WriteRequest::DeferDelivery {
        seq: seq as i64,
        attempts: attempts as i64,
        not_before_ms,
    };
    store.writer.write(write).await.map(drop)
}
