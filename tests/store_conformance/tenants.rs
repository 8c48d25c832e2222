//! Tenants: the same task id in two tenants names two tasks, and no read,
//! update or list reaches from one tenant into another.

use a2a_lifecycle::proto::TaskState;
use a2a_lifecycle::store::{ListQuery, StoreError, StoredTask};

use super::Store;
use super::helpers::{
    at, create, get, list, list_ids, must_get, query, record, set_status, walk_pages,
};

/// The same task id in two tenants names two independent tasks: separate
/// records, separate versions, updates in one never touch the other.
pub async fn same_task_id_in_two_tenants_are_two_tasks(store: Store) {
    let a = record("shared", "ctx-a", TaskState::Submitted, at(1));
    let mut b = record("shared", "ctx-b", TaskState::Working, at(2));
    assert_eq!(store.create("A", &a).await, Ok(1));
    assert_eq!(store.create("B", &b).await, Ok(1), "not AlreadyExists");
    assert_eq!(must_get(&store, "A", "shared").await.record, a);
    assert_eq!(must_get(&store, "B", "shared").await.record, b);

    set_status(&mut b, TaskState::Completed, at(3));
    assert_eq!(store.update("B", &b, 1).await, Ok(2));
    assert_eq!(
        must_get(&store, "A", "shared").await,
        StoredTask {
            record: a.clone(),
            version: 1
        },
        "an update in B leaves A's task alone"
    );
    // A's version is still 1 even though B's is 2.
    assert!(matches!(
        store.update("A", &a, 2).await,
        Err(StoreError::Conflict { actual: 1, .. })
    ));
    assert_eq!(store.update("A", &a, 1).await, Ok(2));
    // A task only in A is not visible or updatable from B.
    create(
        &store,
        "A",
        &record("only-a", "ctx-a", TaskState::Working, at(4)),
    )
    .await;
    assert_eq!(get(&store, "B", "only-a").await, None);
    assert_eq!(
        store
            .update("B", &record("only-a", "x", TaskState::Working, at(5)), 1)
            .await,
        Err(StoreError::NotFound("only-a".into()))
    );
}

/// ListTasks in one tenant never returns or counts another tenant's tasks,
/// with or without filters.
pub async fn list_never_returns_another_tenants_tasks(store: Store) {
    for i in 0..5 {
        create(
            &store,
            "A",
            &record(&format!("a{i}"), "shared-ctx", TaskState::Working, at(i)),
        )
        .await;
    }
    for i in 0..7 {
        create(
            &store,
            "B",
            &record(
                &format!("b{i}"),
                "shared-ctx",
                TaskState::Working,
                at(10 + i),
            ),
        )
        .await;
    }
    create(
        &store,
        "B",
        &record("a0", "shared-ctx", TaskState::Working, at(20)),
    )
    .await;

    let a = list_ids(&store, "A", &query()).await;
    assert_eq!(a, ["a4", "a3", "a2", "a1", "a0"]);
    let filtered = ListQuery {
        context_id: Some("shared-ctx".into()),
        state: Some(TaskState::Working),
        status_after: Some(at(0)),
        ..query()
    };
    assert_eq!(list_ids(&store, "A", &filtered).await, a);
    let b = list_ids(&store, "B", &filtered).await;
    assert_eq!(b, ["a0", "b6", "b5", "b4", "b3", "b2", "b1", "b0"]);
    assert_eq!(
        must_get(&store, "B", "a0")
            .await
            .record
            .task
            .status
            .unwrap()
            .timestamp,
        Some(at(20))
    );

    let pages = walk_pages(
        &store,
        "A",
        ListQuery {
            page_size: 2,
            ..query()
        },
    )
    .await;
    assert_eq!(pages.concat(), a, "pages in A stay in A");
    assert_eq!(list(&store, "C", &query()).await.total_size, 0);
}

/// Keys built by joining tenant and id must not collide: ("a", "b:c") and
/// ("a:b", "c") are different tasks, and so are ("", "x") and ("x", "").
pub async fn tenant_and_task_id_do_not_collide_when_concatenated(store: Store) {
    let pairs = [
        ("a", "b:c"),
        ("a:b", "c"),
        ("a/b", "c"),
        ("a", "b/c"),
        ("", "x"),
        ("x", "y"),
        ("x:", "y"),
        ("a\0b", "c"),
        ("a", "b\0c"),
    ];
    for (i, (tenant, id)) in pairs.iter().enumerate() {
        let r = record(id, &format!("ctx-{i}"), TaskState::Working, at(i as i64));
        assert_eq!(store.create(tenant, &r).await, Ok(1), "{tenant:?}/{id:?}");
    }
    for (i, (tenant, id)) in pairs.iter().enumerate() {
        let stored = must_get(&store, tenant, id).await;
        assert_eq!(
            stored.record.task.context_id,
            format!("ctx-{i}"),
            "{tenant:?}/{id:?}"
        );
        assert_eq!(
            list_ids(&store, tenant, &query()).await.len(),
            pairs.iter().filter(|(t, _)| t == tenant).count()
        );
    }
    assert_eq!(get(&store, "a:b", "b:c").await, None);
    assert_eq!(get(&store, "a", "c").await, None);
    assert_eq!(
        list_ids(&store, "a", &query()).await,
        ["b\0c", "b/c", "b:c"],
        "tenant \"a\" holds exactly its three tasks, newest first"
    );
}
