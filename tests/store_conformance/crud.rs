//! Create, get and update: a record reads back as written, and versions give
//! optimistic concurrency (the store-level contract on `a2a_lifecycle::store`).

use a2a_lifecycle::proto::{Artifact, Role, TaskState};
use a2a_lifecycle::store::{ListQuery, StoreError, StoredTask};

use super::Store;
use super::helpers::{
    T, at, create, get, list, list_ids, message, must_get, query, record, rich_record, set_status,
    text_part,
};

/// A created task reads back exactly as written, at version 1.
pub async fn create_then_get_returns_same_record_at_version_1(store: Store) {
    let r = record("t1", "c1", TaskState::Submitted, at(1));
    assert_eq!(store.create(T, &r).await, Ok(1));
    assert_eq!(
        get(&store, T, "t1").await,
        Some(StoredTask {
            record: r.clone(),
            version: 1
        })
    );
    // A second task does not disturb the first.
    let r2 = rich_record("t2");
    assert_eq!(store.create(T, &r2).await, Ok(1));
    assert_eq!(must_get(&store, T, "t1").await.record, r);
    assert_eq!(must_get(&store, T, "t2").await.record, r2);
}

/// `get` of a task that was never created is `Ok(None)`, not an error, in a
/// known tenant and in an unknown one.
pub async fn get_of_missing_task_returns_none(store: Store) {
    assert_eq!(store.get(T, "nope").await, Ok(None), "empty store");
    create(&store, T, &record("t1", "c1", TaskState::Working, at(1))).await;
    assert_eq!(store.get(T, "nope").await, Ok(None), "known tenant");
    assert_eq!(store.get(T, "T1").await, Ok(None), "ids are case-sensitive");
    assert_eq!(store.get(T, "t1 ").await, Ok(None), "ids are not trimmed");
    assert_eq!(store.get("other", "t1").await, Ok(None), "unknown tenant");
}

/// Creating an existing (tenant, id) is `AlreadyExists` and neither replaces
/// the stored record nor bumps its version.
pub async fn create_twice_is_already_exists_and_keeps_first_record(store: Store) {
    let first = record("t1", "c1", TaskState::Submitted, at(1));
    create(&store, T, &first).await;
    let second = record("t1", "c2", TaskState::Working, at(2));
    assert_eq!(
        store.create(T, &second).await,
        Err(StoreError::AlreadyExists("t1".into()))
    );
    assert_eq!(
        must_get(&store, T, "t1").await,
        StoredTask {
            record: first,
            version: 1
        }
    );
    assert_eq!(
        list_ids(&store, T, &query()).await,
        ["t1"],
        "the refused create must not add a list entry"
    );
}

/// Racing creates of one id: exactly one succeeds, the rest are
/// `AlreadyExists`, and the winner's record is the one stored.
pub async fn concurrent_creates_of_one_id_exactly_one_wins(store: Store) {
    const N: usize = 16;
    let mut handles = Vec::new();
    for i in 0..N {
        let store = store.clone();
        handles.push(tokio::spawn(async move {
            let r = record(
                "dup",
                &format!("ctx-{i}"),
                TaskState::Submitted,
                at(i as i64),
            );
            (i, store.create(T, &r).await)
        }));
    }
    let mut winners = Vec::new();
    for h in handles {
        let (i, result) = h.await.unwrap();
        match result {
            Ok(1) => winners.push(i),
            Err(StoreError::AlreadyExists(id)) => assert_eq!(id, "dup"),
            other => panic!("unexpected create result {other:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one create wins: {winners:?}");
    let stored = must_get(&store, T, "dup").await;
    assert_eq!(stored.version, 1);
    assert_eq!(stored.record.task.context_id, format!("ctx-{}", winners[0]));
    assert_eq!(list(&store, T, &query()).await.total_size, 1);
}

/// Optimistic concurrency: an update made from the current version succeeds,
/// returns the next version, and is what `get` and `list` show afterwards.
pub async fn update_with_current_version_bumps_version_and_is_visible(store: Store) {
    let mut r = record("t1", "c1", TaskState::Submitted, at(1));
    create(&store, T, &r).await;
    let other = record("t2", "c1", TaskState::Submitted, at(0));
    create(&store, T, &other).await;

    set_status(&mut r, TaskState::Working, at(2));
    r.task.history.push(message("t1/m1", Role::Agent, "on it"));
    assert_eq!(store.update(T, &r, 1).await, Ok(2));
    assert_eq!(
        must_get(&store, T, "t1").await,
        StoredTask {
            record: r.clone(),
            version: 2
        }
    );

    set_status(&mut r, TaskState::Completed, at(3));
    r.task.artifacts.push(Artifact {
        artifact_id: "a".into(),
        parts: vec![text_part("done")],
        ..Default::default()
    });
    r.sealed_artifacts.push("a".into());
    assert_eq!(store.update(T, &r, 2).await, Ok(3));
    assert_eq!(
        must_get(&store, T, "t1").await,
        StoredTask {
            record: r.clone(),
            version: 3
        }
    );
    let page = list(&store, T, &query()).await;
    assert_eq!(page.tasks[0], r.task, "list shows the updated task");

    // Versions are per task.
    assert_eq!(must_get(&store, T, "t2").await.version, 1);
    assert_eq!(store.update(T, &other, 1).await, Ok(2));
    assert_eq!(must_get(&store, T, "t1").await.version, 3);
}

/// Optimistic concurrency: an update made from a stale (or future) version is
/// `Conflict` carrying the expected and actual versions, and leaves the
/// stored record, its version and its list position untouched.
pub async fn update_with_stale_version_is_conflict_and_changes_nothing(store: Store) {
    let mut r = record("t1", "c1", TaskState::Submitted, at(5));
    create(&store, T, &r).await;
    create(&store, T, &record("t2", "c1", TaskState::Submitted, at(3))).await;
    set_status(&mut r, TaskState::Working, at(6));
    assert_eq!(store.update(T, &r, 1).await, Ok(2));
    let current = must_get(&store, T, "t1").await;

    // A writer that read version 1 tries to move the task to the past and
    // to another state.
    let mut stale = r.clone();
    set_status(&mut stale, TaskState::Failed, at(1));
    stale.task.history.clear();
    for expected in [1, 0, 3, 99] {
        assert_eq!(
            store.update(T, &stale, expected).await,
            Err(StoreError::Conflict {
                id: "t1".into(),
                expected,
                actual: 2
            }),
            "update from version {expected} while stored is 2"
        );
        assert_eq!(must_get(&store, T, "t1").await, current);
    }
    assert_eq!(
        list_ids(&store, T, &query()).await,
        ["t1", "t2"],
        "a refused update must not move the task"
    );
    let failed = ListQuery {
        state: Some(TaskState::Failed),
        ..query()
    };
    assert!(list_ids(&store, T, &failed).await.is_empty());

    // The holder of the current version can still write.
    set_status(&mut r, TaskState::Completed, at(7));
    assert_eq!(store.update(T, &r, 2).await, Ok(3));
}

/// Updating a task that does not exist is `NotFound`, and does not create it.
pub async fn update_of_missing_task_is_not_found(store: Store) {
    let r = record("ghost", "c1", TaskState::Working, at(1));
    assert_eq!(
        store.update(T, &r, 1).await,
        Err(StoreError::NotFound("ghost".into())),
        "unknown tenant"
    );
    create(&store, T, &record("t1", "c1", TaskState::Working, at(1))).await;
    assert_eq!(
        store.update(T, &r, 1).await,
        Err(StoreError::NotFound("ghost".into())),
        "known tenant"
    );
    assert_eq!(get(&store, T, "ghost").await, None);
    assert_eq!(list_ids(&store, T, &query()).await, ["t1"]);
}

/// Racing updates from the same version: exactly one wins, every other is
/// `Conflict`, and the winner's record is stored at version 2.
pub async fn concurrent_updates_from_one_version_exactly_one_wins(store: Store) {
    const N: usize = 16;
    create(&store, T, &record("t1", "c1", TaskState::Submitted, at(0))).await;
    let mut handles = Vec::new();
    for i in 0..N {
        let store = store.clone();
        handles.push(tokio::spawn(async move {
            let mut r = record("t1", "c1", TaskState::Working, at(1 + i as i64));
            r.task
                .history
                .push(message(&format!("w{i}"), Role::Agent, "mine"));
            (i, r.clone(), store.update(T, &r, 1).await)
        }));
    }
    let mut winners = Vec::new();
    for h in handles {
        let (i, r, result) = h.await.unwrap();
        match result {
            Ok(2) => winners.push((i, r)),
            Err(StoreError::Conflict {
                id,
                expected,
                actual,
            }) => {
                assert_eq!((id.as_str(), expected, actual), ("t1", 1, 2));
            }
            other => panic!("unexpected update result {other:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one update from version 1 wins");
    let (_, won) = winners.pop().unwrap();
    assert_eq!(
        must_get(&store, T, "t1").await,
        StoredTask {
            record: won,
            version: 2
        }
    );
}
