//! The push notification outbox (issue "push notifications"): entries are
//! written by the task write that makes them due, in the same transaction,
//! and read back in commit order until delivery finishes them.

use a2a_lifecycle::proto::TaskState;
use a2a_lifecycle::store::{EncodedTask, OutboxEntry, StoreError};

use super::Store;
use super::helpers::{T, at, record, set_status};

fn with_outbox(
    record: &a2a_lifecycle::lifecycle::TaskRecord,
    events: &[(&str, &str)],
) -> EncodedTask {
    let mut task = EncodedTask::new(record);
    task.outbox = events
        .iter()
        .map(|(config, event)| OutboxEntry {
            config_id: (*config).into(),
            event: event.as_bytes().to_vec(),
        })
        .collect();
    task
}

fn seen(store_outbox: &[a2a_lifecycle::store::Delivery]) -> Vec<(String, String, String)> {
    store_outbox
        .iter()
        .map(|d| {
            (
                d.task_id.clone(),
                d.config_id.clone(),
                String::from_utf8(d.event.clone()).unwrap(),
            )
        })
        .collect()
}

/// Entries come with the write that made them, in commit order; a write
/// refused (conflict, taken id) adds none; finish removes one, defer
/// records an attempt.
pub async fn outbox_entries_commit_with_their_write(store: Store) {
    let mut a = record("a", "c", TaskState::Submitted, at(1));
    let b = record("b", "c", TaskState::Submitted, at(2));
    store
        .create_encoded(T, &with_outbox(&a, &[("hook", "a1")]))
        .await
        .unwrap();
    store
        .create_encoded("other", &with_outbox(&b, &[("x", "b1"), ("y", "b1")]))
        .await
        .unwrap();
    set_status(&mut a, TaskState::Working, at(3));
    store
        .update_encoded(T, &with_outbox(&a, &[("hook", "a2")]), 1)
        .await
        .unwrap();
    // Refused writes leave nothing behind.
    assert!(matches!(
        store
            .update_encoded(T, &with_outbox(&a, &[("hook", "stale")]), 1)
            .await,
        Err(StoreError::Conflict { .. })
    ));
    assert!(matches!(
        store
            .create_encoded(T, &with_outbox(&a, &[("hook", "dup")]))
            .await,
        Err(StoreError::AlreadyExists(_))
    ));
    let all = store.outbox().pending(0, 100).await.unwrap();
    assert_eq!(
        seen(&all),
        [
            ("a".into(), "hook".into(), "a1".into()),
            ("b".into(), "x".into(), "b1".into()),
            ("b".into(), "y".into(), "b1".into()),
            ("a".into(), "hook".into(), "a2".into()),
        ]
    );
    assert!(all.windows(2).all(|w| w[0].seq < w[1].seq), "in seq order");
    assert_eq!(all[1].tenant, "other");
    assert!(all.iter().all(|d| d.attempts == 0));
    assert_eq!(
        store.outbox().pending(0, 2).await.unwrap().len(),
        2,
        "limit"
    );
    // Read on from where a read ended.
    assert_eq!(
        store.outbox().pending(all[1].seq, 100).await.unwrap(),
        all[2..]
    );
    assert!(
        store
            .outbox()
            .pending(all[3].seq, 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .outbox()
            .pending(u64::MAX, 100)
            .await
            .unwrap()
            .is_empty()
    );

    // Entries are finished and deferred under the delivery role, which a
    // store shared by replicas gives to one process at a time (a store of
    // one process has no roles: its one process delivers).
    if let Some(replicas) = store.coordination() {
        assert!(
            replicas
                .hold(a2a_lifecycle::store::DELIVERY_ROLE)
                .await
                .unwrap()
        );
    }
    store
        .outbox()
        .defer_delivery(all[0].seq, 3, 1_700_000_000_000)
        .await
        .unwrap();
    store.outbox().finish_delivery(all[1].seq).await.unwrap();
    store.outbox().finish_delivery(all[1].seq).await.unwrap();
    store.outbox().finish_delivery(u64::MAX).await.unwrap();
    let left = store.outbox().pending(0, 100).await.unwrap();
    assert_eq!(left.len(), 3);
    assert_eq!(
        (left[0].attempts, left[0].not_before_ms),
        (3, 1_700_000_000_000)
    );
    assert_eq!(left[1].config_id, "y");
    // A new write's entries come after every earlier one.
    set_status(&mut a, TaskState::Completed, at(4));
    store
        .update_encoded(T, &with_outbox(&a, &[("hook", "a3")]), 2)
        .await
        .unwrap();
    let last = store.outbox().pending(left[2].seq, 100).await.unwrap();
    assert_eq!(seen(&last), [("a".into(), "hook".into(), "a3".into())]);
    // A seq is never given twice, even once the highest is finished:
    // delivery reads on from the last one it saw.
    store.outbox().finish_delivery(last[0].seq).await.unwrap();
    let b_next = record("b2", "c", TaskState::Submitted, at(5));
    store
        .create_encoded(T, &with_outbox(&b_next, &[("hook", "b2")]))
        .await
        .unwrap();
    let after = store.outbox().pending(last[0].seq, 100).await.unwrap();
    assert_eq!(seen(&after), [("b2".into(), "hook".into(), "b2".into())]);
}
