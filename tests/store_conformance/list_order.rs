//! ListTasks order (spec §3.1.4): status timestamp descending to the
//! nanosecond, ties by task id, over the whole `Timestamp` range, and as
//! updates move a task.

use a2a_lifecycle::lifecycle::TaskRecord;
use a2a_lifecycle::proto::{Role, TaskState};
use a2a_lifecycle::store::ListQuery;

use super::Store;
use super::helpers::{
    BASE, T, at, create, list, list_ids, message, query, record, set_status, ts, walk_pages,
};

/// Spec §3.1.4: tasks are sorted by status timestamp, most recent first,
/// regardless of creation order, including timestamps before the epoch.
pub async fn list_orders_by_status_timestamp_descending(store: Store) {
    // Created in a scrambled order; id order is unrelated to time order.
    let times = [
        ("k", 40),
        ("b", 10),
        ("z", 90),
        ("a", 70),
        ("m", 20),
        ("c", -5_000_000),
        ("y", 0),
        ("d", 3_600),
    ];
    for (id, t) in times {
        create(&store, T, &record(id, "c", TaskState::Working, at(t))).await;
    }
    create(
        &store,
        T,
        &record("pre-epoch", "c", TaskState::Working, ts(-86_400, 5)),
    )
    .await;
    assert_eq!(
        list_ids(&store, T, &query()).await,
        ["d", "z", "a", "k", "m", "b", "y", "c", "pre-epoch"]
    );
}

/// The order uses the full timestamp, nanoseconds included.
pub async fn list_order_distinguishes_nanoseconds(store: Store) {
    let rows = [
        ("a", 0),
        ("b", 1),
        ("c", 999_999_999),
        ("d", 1_000),
        ("e", 500_000_000),
    ];
    for (id, nanos) in rows {
        create(
            &store,
            T,
            &record(id, "c", TaskState::Working, ts(BASE, nanos)),
        )
        .await;
    }
    create(
        &store,
        T,
        &record("f", "c", TaskState::Working, ts(BASE + 1, 0)),
    )
    .await;
    create(
        &store,
        T,
        &record("g", "c", TaskState::Working, ts(BASE - 1, 999_999_999)),
    )
    .await;
    assert_eq!(
        list_ids(&store, T, &query()).await,
        ["f", "c", "e", "d", "b", "a", "g"]
    );
}

/// Equal status timestamps are ordered by task id ascending, compared as
/// bytes (code points), not by a locale collation.
pub async fn ties_break_by_task_id_ascending_in_byte_order(store: Store) {
    let ids = [
        "b", "a", "B", "_x", "a1", "A", "aa", "é", "Z", "10", "9", "a-b", "a b",
    ];
    for id in ids {
        create(&store, T, &record(id, "c", TaskState::Working, at(7))).await;
    }
    create(&store, T, &record("newest", "c", TaskState::Working, at(8))).await;
    create(
        &store,
        T,
        &record("0-oldest", "c", TaskState::Working, at(6)),
    )
    .await;
    let mut sorted: Vec<&str> = ids.to_vec();
    sorted.sort(); // str's Ord is byte order
    let mut want = vec!["newest"];
    want.extend(sorted);
    want.push("0-oldest");
    assert_eq!(list_ids(&store, T, &query()).await, want);
    assert_eq!(
        &want[1..14],
        [
            "10", "9", "A", "B", "Z", "_x", "a", "a b", "a-b", "a1", "aa", "b", "é"
        ]
    );
}

/// The order and the `status_timestamp_after` filter hold over the whole
/// range of `google.protobuf.Timestamp` (years 0001 to 9999), not only the
/// years an `i64` of nanoseconds can hold (1677 to 2262).
pub async fn order_and_status_after_cover_the_whole_timestamp_range(store: Store) {
    const MIN_SECONDS: i64 = -62_135_596_800; // 0001-01-01T00:00:00Z
    const MAX_SECONDS: i64 = 253_402_300_799; // 9999-12-31T23:59:59Z
    const YEAR_1500: i64 = -14_831_769_600;
    const YEAR_1600: i64 = -11_676_096_000;
    const YEAR_2300: i64 = 10_413_792_000;
    const YEAR_2400: i64 = 13_569_465_600;
    // Ids sort opposite to time, so a tie on the timestamp shows.
    let rows = [
        ("g-9999", ts(MAX_SECONDS, 999_999_999)),
        ("f-2400", ts(YEAR_2400, 0)),
        ("e-2300", ts(YEAR_2300, 0)),
        ("d-now", at(0)),
        ("c-1600", ts(YEAR_1600, 0)),
        ("b-1500", ts(YEAR_1500, 0)),
        ("a-0001", ts(MIN_SECONDS, 0)),
    ];
    for (id, when) in rows.iter().rev() {
        create(&store, T, &record(id, "c", TaskState::Working, *when)).await;
    }
    assert_eq!(
        list_ids(&store, T, &query()).await,
        [
            "g-9999", "f-2400", "e-2300", "d-now", "c-1600", "b-1500", "a-0001"
        ]
    );
    let after = |t| ListQuery {
        status_after: Some(t),
        ..query()
    };
    assert_eq!(
        list_ids(&store, T, &after(ts(YEAR_2300 + 1, 0))).await,
        ["g-9999", "f-2400"]
    );
    assert_eq!(
        list_ids(&store, T, &after(ts(YEAR_1500 + 1, 0))).await,
        ["g-9999", "f-2400", "e-2300", "d-now", "c-1600"]
    );
    let pages = walk_pages(
        &store,
        T,
        ListQuery {
            page_size: 2,
            ..query()
        },
    )
    .await;
    assert_eq!(pages.concat().len(), rows.len());
}

/// An update that changes the status timestamp moves the task to its new
/// place in the list order (spec §3.1.4 sorts by the current status).
pub async fn update_that_changes_status_timestamp_moves_task_in_list_order(store: Store) {
    let mut rs: Vec<TaskRecord> = (0..5)
        .map(|i| record(&format!("t{i}"), "c", TaskState::Working, at(i * 10)))
        .collect();
    for r in &rs {
        create(&store, T, r).await;
    }
    assert_eq!(
        list_ids(&store, T, &query()).await,
        ["t4", "t3", "t2", "t1", "t0"]
    );

    // Oldest becomes newest.
    set_status(&mut rs[0], TaskState::Completed, at(100));
    assert_eq!(store.update(T, &rs[0], 1).await, Ok(2));
    assert_eq!(
        list_ids(&store, T, &query()).await,
        ["t0", "t4", "t3", "t2", "t1"]
    );

    // A middle task ties with t3 and sorts by id before it.
    set_status(&mut rs[1], TaskState::Completed, at(30));
    assert_eq!(store.update(T, &rs[1], 1).await, Ok(2));
    assert_eq!(
        list_ids(&store, T, &query()).await,
        ["t0", "t4", "t1", "t3", "t2"]
    );

    // Moving back in time is honoured too.
    set_status(&mut rs[4], TaskState::Completed, at(-1));
    assert_eq!(store.update(T, &rs[4], 1).await, Ok(2));
    assert_eq!(
        list_ids(&store, T, &query()).await,
        ["t0", "t1", "t3", "t2", "t4"]
    );

    // The old position is gone: the status_after window sees only the new one.
    let q = ListQuery {
        status_after: Some(at(40)),
        ..query()
    };
    assert_eq!(list_ids(&store, T, &q).await, ["t0"]);
}

/// An update that leaves the status timestamp alone (a user message joining
/// history) keeps the task where it was.
pub async fn update_that_keeps_status_timestamp_keeps_list_position(store: Store) {
    let mut r = record("t1", "c", TaskState::InputRequired, at(5));
    create(&store, T, &record("t0", "c", TaskState::Working, at(9))).await;
    create(&store, T, &r).await;
    create(&store, T, &record("t2", "c", TaskState::Working, at(1))).await;
    r.task
        .history
        .push(message("t1/u2", Role::User, "more input"));
    assert_eq!(store.update(T, &r, 1).await, Ok(2));
    assert_eq!(list_ids(&store, T, &query()).await, ["t0", "t1", "t2"]);
    let page = list(&store, T, &query()).await;
    assert_eq!(page.tasks[1], r.task);
}
