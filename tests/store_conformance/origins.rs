//! Idempotency (issue "idempotent sends"): a creating message makes one task
//! per tenant, and `find_by_origin` finds that task.

use a2a_lifecycle::proto::TaskState;
use a2a_lifecycle::store::StoreError;

use super::Store;
use super::helpers::{T, at, create, get, list, query, record};

/// A second task created by the same message (tenant, first history
/// message id) is refused as a duplicate naming the first; another tenant
/// may reuse the message id.
pub async fn same_creating_message_is_a_duplicate_within_a_tenant_only(store: Store) {
    let first = record("t1", "c", TaskState::Submitted, at(1));
    create(&store, T, &first).await;
    let mut again = record("t2", "c", TaskState::Submitted, at(2));
    again.task.history[0].message_id = first.task.history[0].message_id.clone();
    match store.create(T, &again).await {
        Err(StoreError::DuplicateMessage { task_id }) => assert_eq!(task_id, "t1"),
        other => panic!("expected DuplicateMessage, got {other:?}"),
    }
    assert!(
        get(&store, T, "t2").await.is_none(),
        "the duplicate was not stored"
    );
    create(&store, "tenant-b", &again).await;
    assert_eq!(list(&store, T, &query()).await.total_size, 1);
}

pub async fn find_by_origin_finds_the_created_task(store: Store) {
    let r = record("t1", "c", TaskState::Working, at(1));
    create(&store, T, &r).await;
    let origin = r.task.history[0].message_id.clone();
    let found = store
        .find_by_origin(T, "", &origin)
        .await
        .unwrap()
        .expect("found");
    assert_eq!(found.record, r);
    assert_eq!(found.version, 1);
    assert!(
        store
            .find_by_origin(T, "", "no-such-message")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        store
            .find_by_origin("tenant-b", "", &origin)
            .await
            .unwrap()
            .is_none()
    );
}
