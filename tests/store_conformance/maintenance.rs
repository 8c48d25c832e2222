//! Recovery and retention: `active_tasks` lists what recovery after a
//! restart looks at, in every tenant; `purge_terminal_before` deletes only old
//! terminal tasks.

use a2a_lifecycle::proto::TaskState;

use super::Store;
use super::helpers::{T, at, create, expect_ids, get, list_ids, query, record};

pub async fn active_tasks_lists_submitted_and_working_in_every_tenant(store: Store) {
    let states = [
        TaskState::Submitted,
        TaskState::Working,
        TaskState::InputRequired,
        TaskState::AuthRequired,
        TaskState::Completed,
        TaskState::Failed,
        TaskState::Canceled,
        TaskState::Rejected,
    ];
    for (i, state) in states.iter().enumerate() {
        create(
            &store,
            T,
            &record(&format!("a{i}"), "c", *state, at(i as i64)),
        )
        .await;
        create(
            &store,
            "tenant-b",
            &record(&format!("b{i}"), "c", *state, at(i as i64)),
        )
        .await;
    }
    let mut active: Vec<(String, String, i32)> = store
        .active_tasks()
        .await
        .unwrap()
        .into_iter()
        .map(|(tenant, s)| {
            (
                tenant,
                s.record.task.id.clone(),
                s.record.task.status.unwrap().state,
            )
        })
        .collect();
    active.sort();
    assert_eq!(
        active,
        [
            (T.to_string(), "a0".to_string(), TaskState::Submitted as i32),
            (T.to_string(), "a1".to_string(), TaskState::Working as i32),
            (
                "tenant-b".to_string(),
                "b0".to_string(),
                TaskState::Submitted as i32
            ),
            (
                "tenant-b".to_string(),
                "b1".to_string(),
                TaskState::Working as i32
            ),
        ]
    );
}

/// Retention: terminal tasks whose status timestamp is strictly before the
/// bound are deleted (and their idempotency key freed); active,
/// interrupted and newer tasks stay.
pub async fn purge_deletes_only_old_terminal_tasks(store: Store) {
    let old_terminal = [
        TaskState::Completed,
        TaskState::Failed,
        TaskState::Canceled,
        TaskState::Rejected,
    ];
    for (i, state) in old_terminal.iter().enumerate() {
        create(&store, T, &record(&format!("old{i}"), "c", *state, at(10))).await;
    }
    create(
        &store,
        "tenant-b",
        &record("old-b", "c", TaskState::Completed, at(5)),
    )
    .await;
    create(
        &store,
        T,
        &record("old-working", "c", TaskState::Working, at(1)),
    )
    .await;
    create(
        &store,
        T,
        &record("old-input", "c", TaskState::InputRequired, at(1)),
    )
    .await;
    create(
        &store,
        T,
        &record("at-bound", "c", TaskState::Completed, at(20)),
    )
    .await;
    create(&store, T, &record("new", "c", TaskState::Completed, at(30))).await;
    let purged = store.purge_terminal_before(&at(20)).await.unwrap();
    assert_eq!(purged, 5);
    let mut left = list_ids(&store, T, &query()).await;
    left.sort();
    assert_eq!(
        left,
        expect_ids(&["at-bound", "new", "old-input", "old-working"])
    );
    assert!(get(&store, "tenant-b", "old-b").await.is_none());
    assert!(get(&store, T, "old0").await.is_none());
    // The purged task's creating message may create a task again.
    create(
        &store,
        T,
        &record("old0", "c", TaskState::Submitted, at(40)),
    )
    .await;
    assert_eq!(store.purge_terminal_before(&at(20)).await.unwrap(), 0);
}
