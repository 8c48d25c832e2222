//! ListTasks filters (spec §3.1.4): `context_id`, `status`,
//! `status_timestamp_after`, their combination, and `total_size`.

use a2a_lifecycle::proto::TaskState;
use a2a_lifecycle::store::ListQuery;
use a2a_lifecycle::wkt::Timestamp;

use super::Store;
use super::helpers::{
    BASE, T, at, create, list, list_ids, query, record, set_status, ts, via_token,
};

/// Spec §3.1.4 `context_id`: only tasks of that context, exact match.
pub async fn list_filters_by_context_id(store: Store) {
    create(&store, T, &record("t1", "ctx-1", TaskState::Working, at(1))).await;
    create(&store, T, &record("t2", "ctx-2", TaskState::Working, at(2))).await;
    create(
        &store,
        T,
        &record("t3", "ctx-1", TaskState::Completed, at(3)),
    )
    .await;
    create(
        &store,
        T,
        &record("t4", "ctx-10", TaskState::Working, at(4)),
    )
    .await;
    create(&store, T, &record("t5", "CTX-1", TaskState::Working, at(5))).await;
    let q = |c: &str| ListQuery {
        context_id: Some(c.into()),
        ..query()
    };
    assert_eq!(list_ids(&store, T, &q("ctx-1")).await, ["t3", "t1"]);
    assert_eq!(list_ids(&store, T, &q("ctx-2")).await, ["t2"]);
    assert_eq!(list_ids(&store, T, &q("ctx-10")).await, ["t4"]);
    assert!(
        list_ids(&store, T, &q("ctx")).await.is_empty(),
        "no prefix match"
    );
    assert!(
        list_ids(&store, T, &q("ctx-%")).await.is_empty(),
        "no LIKE pattern"
    );
    assert!(
        list_ids(&store, T, &q("ctx-_")).await.is_empty(),
        "no LIKE pattern"
    );
    assert!(list_ids(&store, T, &q("nope")).await.is_empty());
    assert_eq!(
        list_ids(&store, T, &query()).await.len(),
        5,
        "no filter: all"
    );
}

/// Spec §3.1.4 `status`: only tasks whose current state is that state.
pub async fn list_filters_by_state(store: Store) {
    let states = TaskState::REAL;
    for (i, s) in states.iter().enumerate() {
        create(&store, T, &record(&format!("t{i}"), "c", *s, at(i as i64))).await;
        create(
            &store,
            T,
            &record(&format!("u{i}"), "c", *s, at(100 + i as i64)),
        )
        .await;
    }
    for (i, s) in states.iter().enumerate() {
        let q = ListQuery {
            state: Some(*s),
            ..query()
        };
        assert_eq!(
            list_ids(&store, T, &q).await,
            [format!("u{i}"), format!("t{i}")],
            "state {s:?}"
        );
    }
    assert_eq!(list_ids(&store, T, &query()).await.len(), 2 * states.len());
}

/// Spec §3.1.4 `status_timestamp_after`: tasks whose status timestamp is
/// greater than or equal to the bound; the bound itself is included, to the
/// nanosecond.
pub async fn list_filters_by_status_after_inclusively(store: Store) {
    let when = |s: i64, n: i32| ts(BASE + s, n);
    create(
        &store,
        T,
        &record("old", "c", TaskState::Working, when(-100, 0)),
    )
    .await;
    create(
        &store,
        T,
        &record("edge", "c", TaskState::Working, when(10, 500)),
    )
    .await;
    create(
        &store,
        T,
        &record("new", "c", TaskState::Working, when(20, 0)),
    )
    .await;
    create(
        &store,
        T,
        &record("newer", "c", TaskState::Working, when(30, 999_999_999)),
    )
    .await;
    let after = |t: Timestamp| ListQuery {
        status_after: Some(t),
        ..query()
    };
    assert_eq!(
        list_ids(&store, T, &after(when(10, 500))).await,
        ["newer", "new", "edge"],
        "bound equal to a timestamp includes it"
    );
    assert_eq!(
        list_ids(&store, T, &after(when(10, 501))).await,
        ["newer", "new"],
        "one nanosecond later excludes it"
    );
    assert_eq!(
        list_ids(&store, T, &after(when(10, 499))).await,
        ["newer", "new", "edge"]
    );
    assert_eq!(
        list_ids(&store, T, &after(when(30, 999_999_999))).await,
        ["newer"]
    );
    assert!(list_ids(&store, T, &after(when(31, 0))).await.is_empty());
    assert_eq!(list_ids(&store, T, &after(ts(0, 0))).await.len(), 4);
    assert_eq!(
        list_ids(&store, T, &after(ts(-1_000_000, 0))).await.len(),
        4,
        "a bound before the epoch"
    );
}

/// Spec §3.1.4: filters combine with AND.
pub async fn list_combines_filters(store: Store) {
    use TaskState::{Completed, Working};
    let rows = [
        ("t1", "c1", Working, 1),
        ("t2", "c1", Completed, 2),
        ("t3", "c2", Working, 3),
        ("t4", "c1", Working, 4),
        ("t5", "c1", Working, 5),
        ("t6", "c2", Completed, 6),
        ("t7", "c1", Completed, 7),
    ];
    for (id, ctx, s, t) in rows {
        create(&store, T, &record(id, ctx, s, at(t))).await;
    }
    let q = |ctx: Option<&str>, s: Option<TaskState>, after: Option<i64>| ListQuery {
        context_id: ctx.map(str::to_owned),
        state: s,
        status_after: after.map(at),
        ..query()
    };
    assert_eq!(
        list_ids(&store, T, &q(Some("c1"), Some(Working), None)).await,
        ["t5", "t4", "t1"]
    );
    assert_eq!(
        list_ids(&store, T, &q(Some("c1"), Some(Working), Some(4))).await,
        ["t5", "t4"]
    );
    assert_eq!(
        list_ids(&store, T, &q(Some("c1"), None, Some(3))).await,
        ["t7", "t5", "t4"]
    );
    assert_eq!(
        list_ids(&store, T, &q(None, Some(Completed), Some(3))).await,
        ["t7", "t6"]
    );
    assert_eq!(
        list_ids(&store, T, &q(Some("c2"), Some(Completed), Some(1))).await,
        ["t6"]
    );
    assert!(
        list_ids(&store, T, &q(Some("c2"), Some(Working), Some(4)))
            .await
            .is_empty()
    );
}

/// Filters see the current state of a task after an update, not the state
/// it was created in.
pub async fn list_filters_see_updates(store: Store) {
    let mut r = record("t1", "c1", TaskState::Submitted, at(1));
    create(&store, T, &r).await;
    create(&store, T, &record("t2", "c1", TaskState::Submitted, at(5))).await;
    let by_state = |s| ListQuery {
        state: Some(s),
        ..query()
    };
    let after5 = ListQuery {
        status_after: Some(at(5)),
        ..query()
    };
    assert_eq!(list_ids(&store, T, &after5).await, ["t2"]);

    set_status(&mut r, TaskState::Working, at(9));
    assert_eq!(store.update(T, &r, 1).await, Ok(2));
    assert_eq!(
        list_ids(&store, T, &by_state(TaskState::Working)).await,
        ["t1"]
    );
    assert_eq!(
        list_ids(&store, T, &by_state(TaskState::Submitted)).await,
        ["t2"]
    );
    assert_eq!(list_ids(&store, T, &after5).await, ["t1", "t2"]);
}

/// Spec §3.1.4 `total_size`: the number of matching tasks in all pages,
/// the same on every page of a walk.
pub async fn total_size_counts_all_matches_across_pages(store: Store) {
    for i in 0..23 {
        let ctx = if i % 3 == 0 { "odd-one" } else { "main" };
        let state = if i % 2 == 0 {
            TaskState::Working
        } else {
            TaskState::Completed
        };
        create(&store, T, &record(&format!("t{i:02}"), ctx, state, at(i))).await;
    }
    let expected = |ctx: Option<&str>, state: Option<TaskState>, after: i64| {
        (0..23)
            .filter(|i| ctx.is_none_or(|c| (c == "odd-one") == (i % 3 == 0)))
            .filter(|i| state.is_none_or(|s| (s == TaskState::Working) == (i % 2 == 0)))
            .filter(|i| *i >= after)
            .count()
    };
    for (ctx, state, after) in [
        (None, None, 0),
        (Some("main"), None, 0),
        (Some("main"), Some(TaskState::Working), 0),
        (None, Some(TaskState::Completed), 5),
        (Some("odd-one"), None, 7),
    ] {
        let mut q = ListQuery {
            context_id: ctx.map(str::to_owned),
            state,
            status_after: Some(at(after)),
            page_size: 4,
            ..query()
        };
        let want = expected(ctx, state, after);
        let mut seen = 0;
        loop {
            let page = list(&store, T, &q).await;
            assert_eq!(page.total_size, want, "{ctx:?} {state:?} {after}");
            seen += page.tasks.len();
            match page.next {
                Some(c) => q.cursor = Some(via_token(&c)),
                None => break,
            }
        }
        assert_eq!(seen, want, "pages hold total_size tasks");
    }
}

/// A tenant with no tasks lists as one empty page: no tasks, no next cursor,
/// total_size 0.
pub async fn list_of_unknown_or_empty_tenant_is_an_empty_last_page(store: Store) {
    let page = list(&store, "nobody", &query()).await;
    assert!(page.tasks.is_empty());
    assert!(page.next.is_none());
    assert_eq!(page.total_size, 0);
    create(&store, T, &record("t1", "c", TaskState::Working, at(1))).await;
    let page = list(
        &store,
        T,
        &ListQuery {
            context_id: Some("other".into()),
            ..query()
        },
    )
    .await;
    assert!(page.tasks.is_empty() && page.next.is_none() && page.total_size == 0);
}
