//! Owners (spec §13.1): a `user` reads only the tasks it created, with the
//! owner in the lookup (`get_owned`) or the filter (`ListQuery::owner`);
//! idempotency keys are per owner.

use a2a_lifecycle::proto::TaskState;
use a2a_lifecycle::store::{ListQuery, StoreError};

use super::Store;
use super::helpers::{T, at, create, list, list_ids, query, record, set_status, walk_pages};

fn owned(id: &str, owner: &str, secs: i64) -> a2a_lifecycle::lifecycle::TaskRecord {
    record(id, "ctx", TaskState::Working, at(secs)).owned_by(owner)
}

fn of(owner: &str) -> ListQuery {
    ListQuery {
        owner: Some(owner.into()),
        ..query()
    }
}

/// `get_owned` finds a task only under its owner's name, in its tenant;
/// the owner survives updates and round-trips through `get`.
pub async fn get_owned_finds_only_the_owners_task(store: Store) {
    let mut alice = owned("a1", "alice", 1);
    create(&store, T, &alice).await;
    create(&store, T, &record("anon", "ctx", TaskState::Working, at(2))).await;
    let found = store.get_owned(T, "a1", "alice").await.unwrap();
    assert_eq!(found.map(|s| s.record), Some(alice.clone()));
    for (tenant, id, owner) in [
        (T, "a1", "bob"),
        (T, "a1", ""),
        (T, "a1", "ALICE"),
        (T, "a1", "alice "),
        ("tenant-b", "a1", "alice"),
        (T, "missing", "alice"),
        // An unowned task is nobody's: not even the empty name's.
        (T, "anon", "alice"),
        (T, "anon", ""),
    ] {
        assert_eq!(
            store.get_owned(tenant, id, owner).await,
            Ok(None),
            "{tenant}/{id} as {owner:?}"
        );
        // The task alone (GetTask) under the same rules.
        assert_eq!(
            store.get_task(tenant, id, Some(owner)).await,
            Ok(None),
            "get_task {tenant}/{id} as {owner:?}"
        );
        assert_eq!(
            store.read_task(tenant, id, Some(owner)).await,
            Ok(None),
            "read_task {tenant}/{id} as {owner:?}"
        );
    }
    for owner in [Some("alice"), None] {
        let read = store.read_task(T, "a1", owner).await;
        let task = read
            .expect("read_task")
            .unwrap_or_else(|| panic!("alice's task, read as {owner:?}"))
            .into_task();
        assert_eq!(task, Ok(alice.task.clone()), "read_task as {owner:?}");
    }
    assert_eq!(
        store.get_task(T, "a1", Some("alice")).await,
        Ok(Some(alice.task.clone()))
    );
    assert_eq!(
        store.get_task(T, "a1", None).await,
        Ok(Some(alice.task.clone()))
    );
    assert_eq!(store.owns(T, "a1", "alice").await, Ok(true));
    for (id, owner) in [
        ("a1", "bob"),
        ("a1", ""),
        ("anon", ""),
        ("missing", "alice"),
    ] {
        assert_eq!(
            store.owns(T, id, owner).await,
            Ok(false),
            "{id} as {owner:?}"
        );
    }
    set_status(&mut alice, TaskState::Completed, at(3));
    store.update(T, &alice, 1).await.unwrap();
    let after = store.get_owned(T, "a1", "alice").await.unwrap().unwrap();
    assert_eq!((after.record.owner.as_str(), after.version), ("alice", 2));
    assert_eq!(
        store.get(T, "a1").await.unwrap().unwrap().record.owner,
        "alice"
    );
}

/// An owner filter lists and counts only that owner's tasks, through every
/// page and with the other filters; without it the tenant's tasks are all
/// there.
pub async fn list_with_an_owner_sees_only_that_owners_tasks(store: Store) {
    for i in 0..7 {
        let owner = ["alice", "bob", ""][i % 3];
        create(&store, T, &owned(&format!("t{i}"), owner, i as i64)).await;
    }
    create(&store, "tenant-b", &owned("other", "alice", 50)).await;
    let alice = list(&store, T, &of("alice")).await;
    assert_eq!(alice.total_size, 3);
    assert_eq!(list_ids(&store, T, &of("alice")).await, ["t6", "t3", "t0"]);
    assert_eq!(list_ids(&store, T, &of("bob")).await, ["t4", "t1"]);
    assert_eq!(list(&store, T, &of("carol")).await.total_size, 0);
    // The empty name lists nothing: unowned tasks belong to no user.
    assert_eq!(list(&store, T, &of("")).await.total_size, 0);
    assert_eq!(list(&store, T, &query()).await.total_size, 7);
    let pages = walk_pages(
        &store,
        T,
        ListQuery {
            page_size: 1,
            ..of("alice")
        },
    )
    .await;
    assert_eq!(pages, [["t6"], ["t3"], ["t0"]]);
    let working = ListQuery {
        state: Some(TaskState::Working),
        context_id: Some("ctx".into()),
        ..of("bob")
    };
    assert_eq!(list(&store, T, &working).await.total_size, 2);
}

/// The same message id makes one task per owner: another owner's is no
/// duplicate, and `find_by_origin` answers each owner with its own task.
pub async fn idempotency_keys_are_per_owner(store: Store) {
    let a = owned("a", "alice", 1);
    let mut b = owned("b", "bob", 2);
    b.task.history[0].message_id = a.task.history[0].message_id.clone();
    let mut anon = record("n", "ctx", TaskState::Working, at(3));
    anon.task.history[0].message_id = a.task.history[0].message_id.clone();
    create(&store, T, &a).await;
    create(&store, T, &b).await;
    create(&store, T, &anon).await;
    let message_id = a.task.history[0].message_id.clone();
    for (owner, id) in [("alice", "a"), ("bob", "b"), ("", "n")] {
        let found = store.find_by_origin(T, owner, &message_id).await.unwrap();
        assert_eq!(found.map(|s| s.record.task.id), Some(id.to_owned()));
    }
    assert_eq!(
        store.find_by_origin(T, "carol", &message_id).await,
        Ok(None)
    );
    // Owner and message id cannot be re-cut into another pair's key.
    let mut cut = owned("cut", "alic", 4);
    cut.task.history[0].message_id = format!("e{message_id}");
    create(&store, T, &cut).await;
    // An unowned task whose message id spells an owned key is no
    // duplicate of it: owned keys cannot be written as message ids.
    let mut spelled = record("spelled", "ctx", TaskState::Working, at(6));
    spelled.task.history[0].message_id = "5:alicem-own".into();
    create(&store, T, &spelled).await;
    assert_eq!(store.find_by_origin(T, "alice", "m-own").await, Ok(None));
    create(&store, T, &{
        let mut own = owned("own", "alice", 7);
        own.task.history[0].message_id = "m-own".into();
        own
    })
    .await;
    let found = store.find_by_origin(T, "alice", "m-own").await.unwrap();
    assert_eq!(found.map(|s| s.record.task.id).as_deref(), Some("own"));
    let mut again = owned("a2", "alice", 5);
    again.task.history[0].message_id = message_id.clone();
    assert_eq!(
        store.create(T, &again).await,
        Err(StoreError::DuplicateMessage {
            task_id: "a".into()
        })
    );
}

/// The open-task quota's count: an owner's tasks not yet ended, in every
/// tenant, counted up to the bound asked for; another owner's, ended ones
/// and unowned ones are not counted.
pub async fn open_tasks_are_counted_per_owner_across_tenants(store: Store) {
    let mut n = 0;
    let mut add = |tenant: &'static str, owner: &'static str, state: TaskState| {
        n += 1;
        let r = record(&format!("t{n}"), "ctx", state, at(n)).owned_by(owner);
        (tenant, r)
    };
    let tasks = [
        add(T, "bob", TaskState::Submitted),
        add(T, "bob", TaskState::Working),
        add("other", "bob", TaskState::InputRequired),
        add("other", "bob", TaskState::AuthRequired),
        add(T, "bob", TaskState::Completed),
        add(T, "bob", TaskState::Failed),
        add(T, "alice", TaskState::Working),
        add(T, "", TaskState::Working),
    ];
    for (tenant, r) in &tasks {
        create(&store, tenant, r).await;
    }
    assert_eq!(store.count_open_owned("bob", 100).await.unwrap(), 4);
    assert_eq!(
        store.count_open_owned("bob", 3).await.unwrap(),
        3,
        "at most"
    );
    assert_eq!(store.count_open_owned("alice", 100).await.unwrap(), 1);
    assert_eq!(store.count_open_owned("carol", 100).await.unwrap(), 0);
    assert_eq!(store.count_open_owned("", 100).await.unwrap(), 0, "unowned");
}

/// The input-wait sweep's read: tasks waiting for input (INPUT_REQUIRED,
/// AUTH_REQUIRED) since before a time, in every tenant, oldest first, at
/// most the limit asked for, with their owner.
pub async fn waiting_tasks_are_found_oldest_first(store: Store) {
    let tasks = [
        (T, "w1", "bob", TaskState::InputRequired, 30),
        ("other", "w2", "alice", TaskState::AuthRequired, 10),
        (T, "w3", "bob", TaskState::InputRequired, 50),
        (T, "busy", "bob", TaskState::Working, 5),
        (T, "done", "bob", TaskState::Completed, 5),
        (T, "late", "bob", TaskState::InputRequired, 500),
    ];
    for (tenant, id, owner, state, secs) in tasks {
        create(
            &store,
            tenant,
            &record(id, "ctx", state, at(secs)).owned_by(owner),
        )
        .await;
    }
    let found = store.waiting_before(&at(100), 10).await.unwrap();
    let seen: Vec<(&str, &str, &str)> = found
        .iter()
        .map(|w| (w.tenant.as_str(), w.task_id.as_str(), w.owner.as_str()))
        .collect();
    assert_eq!(
        seen,
        [("other", "w2", "alice"), (T, "w1", "bob"), (T, "w3", "bob")]
    );
    assert_eq!(found[0].since, (at(10).seconds, at(10).nanos));
    assert_eq!(store.waiting_before(&at(100), 1).await.unwrap().len(), 1);
    assert!(
        store.waiting_before(&at(10), 10).await.unwrap().is_empty(),
        "strictly before"
    );
}
