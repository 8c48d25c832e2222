//! How replicas hear of each other's writes: the notifications a commit
//! sends (LISTEN/NOTIFY) and their payloads, the listening connection
//! that turns them into [`WriteNotice`]s, the tasks a replica watches, and
//! catching up on a task from a version.

use std::time::Duration;

use tokio::sync::broadcast;

use super::reads::snapshot;
use super::{PostgresStore, tls, unavailable};
use crate::store::{CatchUp, Caught, StoreError, WriteNotice, codec};

/// A task as [`Coordination::catch_up`](crate::store::Coordination::catch_up)
/// reads it after version `$3`: its version; its record only when the
/// changes after `$3` are not all kept (`base`, the version before the
/// task's first kept change, is past `$3`), else NULL, never read; and the
/// changes after `$3`, or with the record those after it (`whole_version`),
/// in order. The changes kept run without a gap from `base` to the task's
/// version: a whole write of a running task keeps its own and those since
/// the whole write before it (migration 0012), any other whole write none.
/// One statement: one snapshot.
const CATCH_UP: &str = "SELECT t.version, CASE WHEN b.base > $3 THEN t.record END, \
     CASE WHEN t.version > $3 THEN \
     (SELECT array_agg(c.changes ORDER BY c.version) FROM task_changes c \
     WHERE c.tenant = t.tenant AND c.task_id = t.id \
     AND c.version > CASE WHEN b.base > $3 THEN t.whole_version ELSE $3 END) END \
     FROM tasks t CROSS JOIN LATERAL (SELECT COALESCE((SELECT min(c.version) - 1 \
     FROM task_changes c WHERE c.tenant = t.tenant AND c.task_id = t.id), t.version) AS base) b \
     WHERE t.tenant = $1 AND t.id = $2";

/// [`Coordination::watch`](crate::store::Coordination::watch).
pub(super) async fn watch(
    store: &PostgresStore,
    tenant: &str,
    task_id: &str,
    on: bool,
) -> Result<(), StoreError> {
    let client = store.client().await?;
    let sql = if on {
        "INSERT INTO task_watchers (tenant, task_id, replica) VALUES ($1, $2, $3) \
         ON CONFLICT DO NOTHING"
    } else {
        "DELETE FROM task_watchers WHERE tenant = $1 AND task_id = $2 AND replica = $3"
    };
    client
        .execute(
            sql,
            &[
                &tenant.as_bytes(),
                &task_id.as_bytes(),
                &&*store.standing.id(),
            ],
        )
        .await
        .map_err(unavailable)?;
    Ok(())
}

/// [`Coordination::catch_up`](crate::store::Coordination::catch_up).
pub(super) async fn catch_up(
    store: &PostgresStore,
    tenant: &str,
    task_id: &str,
    after: u64,
) -> Result<Option<CatchUp>, StoreError> {
    let mut client = store.client().await?;
    // One snapshot for the task and its events.
    let tx = snapshot(&mut client).await?;
    let (tenant, id) = (tenant.as_bytes(), task_id.as_bytes());
    let after_version = i64::try_from(after).unwrap_or(i64::MAX);
    let Some(row) = tx
        .query_opt(CATCH_UP, &[&tenant, &id, &after_version])
        .await
        .map_err(unavailable)?
    else {
        return Ok(None);
    };
    let version = row.get::<_, i64>(0) as u64;
    let record: Option<Vec<u8>> = row.get(1);
    let changes: Vec<Vec<u8>> = row.get::<_, Option<_>>(2).unwrap_or_default();
    let rows = if version > after {
        tx.query(
            "SELECT version, events FROM task_events WHERE tenant = $1 AND task_id = $2 \
             AND version > $3 AND version <= $4 ORDER BY version",
            &[&tenant, &id, &after_version, &(version as i64)],
        )
        .await
        .map_err(unavailable)?
    } else {
        Vec::new()
    };
    tx.commit().await.map_err(unavailable)?;
    let task = match record {
        Some(record) => Caught::Whole(Box::new(codec::decode_with_changes(
            &record,
            changes.iter().map(Vec::as_slice),
        )?)),
        None => Caught::Changes(
            changes
                .iter()
                .map(|bytes| codec::decode_changes(bytes))
                .collect::<Result<_, _>>()?,
        ),
    };
    let mut complete = true;
    let mut expected = after + 1;
    let mut events = Vec::new();
    for row in rows {
        let version = row.get::<_, i64>(0) as u64;
        complete &= version == expected;
        expected = version + 1;
        events.extend(codec::split_events(row.get(1))?);
    }
    complete &= expected > version;
    Ok(Some(CatchUp {
        version,
        task,
        events,
        complete,
    }))
}

/// First wait before listening again after the listening connection
/// broke; doubled up to [`LISTEN_RETRY_MAX`].
const LISTEN_RETRY_FIRST: Duration = Duration::from_millis(100);

const LISTEN_RETRY_MAX: Duration = Duration::from_secs(5);

/// Listens for every replica's committed task writes ([`CHANNEL`])
/// and passes them on as [`WriteNotice`]s, on a connection of its own; after
/// that connection broke and was made again, a [`WriteNotice::Gap`] first.
pub(super) async fn listen(connector: tls::Connector, changes: broadcast::Sender<WriteNotice>) {
    use futures_util::StreamExt;
    let mut delay = LISTEN_RETRY_FIRST;
    let mut broken = false;
    loop {
        match connector.connect().await {
            Ok((client, mut connection)) => {
                let (tx, mut payloads) = tokio::sync::mpsc::unbounded_channel();
                let driver = tokio::spawn(async move {
                    let mut messages =
                        futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
                    while let Some(message) = messages.next().await {
                        match message {
                            Ok(tokio_postgres::AsyncMessage::Notification(n)) => {
                                let payload = if n.channel() == OUTBOX_CHANNEL {
                                    None
                                } else {
                                    Some(n.payload().to_owned())
                                };
                                if tx.send(payload).is_err() {
                                    return;
                                }
                            }
                            Ok(_) => {}
                            Err(e) => {
                                tracing::warn!(error = %e, "the PostgreSQL listening connection broke");
                                return;
                            }
                        }
                    }
                });
                match client.batch_execute(&format!("LISTEN {}", CHANNEL)).await {
                    Ok(()) => {
                        delay = LISTEN_RETRY_FIRST;
                        if broken {
                            let _ = changes.send(WriteNotice::Gap);
                        }
                        while let Some(payload) = payloads.recv().await {
                            let Some(payload) = payload else {
                                let _ = changes.send(WriteNotice::Outbox);
                                continue;
                            };
                            for (tenant, task_id, version) in parse_notification(&payload) {
                                let _ = changes.send(WriteNotice::Task {
                                    tenant,
                                    task_id,
                                    version,
                                });
                            }
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "could not listen for task changes"),
                }
                driver.abort();
            }
            Err(e) => tracing::warn!(error = %e, "could not connect to listen for task changes"),
        }
        broken = true;
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(LISTEN_RETRY_MAX);
    }
}

/// The channel replicas hear committed task writes on.
pub(super) const CHANNEL: &str = "a2a_tasks";

/// The channel the replica delivering push notifications hears of new
/// outbox entries on.
pub(super) const OUTBOX_CHANNEL: &str = "a2a_outbox";

/// The payload of the notification announcing a write (tenant, task id,
/// new version): `{len}:{tenant}{len}:{id}{version}` (lengths in bytes of
/// the escaped text, so any text parses back). Ids and tenants are at
/// most `service::validate::MAX_ID_BYTES` (256) bytes, so a payload stays
/// far below PostgreSQL's 8000-byte limit.
pub(super) fn notification(tenant: &str, id: &str, version: u64) -> String {
    format!("{}{version}", notification_prefix(tenant, id))
}

/// A notification's payload up to its version.
pub(super) fn notification_prefix(tenant: &str, id: &str) -> String {
    let (tenant, id) = (escape(tenant), escape(id));
    format!("{}:{tenant}{}:{id}", tenant.len(), id.len())
}

/// A payload is text without NUL: `%` and NUL are written `%25`, `%00`.
fn escape(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains(['%', '\0']) {
        text.replace('%', "%25").replace('\0', "%00").into()
    } else {
        text.into()
    }
}

fn unescape(text: &str) -> String {
    text.replace("%00", "\0").replace("%25", "%")
}

/// The writes a notification's payload announces ([`notification`], one
/// per line); what does not parse is skipped.
pub(super) fn parse_notification(payload: &str) -> Vec<(String, String, u64)> {
    fn field<'a>(rest: &mut &'a str) -> Option<&'a str> {
        let (len, tail) = rest.split_once(':')?;
        let len: usize = len.parse().ok()?;
        let value = tail.get(..len)?;
        *rest = &tail[len..];
        Some(value)
    }
    payload
        .lines()
        .filter_map(|mut line| {
            let tenant = field(&mut line)?;
            let id = field(&mut line)?;
            Some((unescape(tenant), unescape(id), line.parse().ok()?))
        })
        .collect()
}
