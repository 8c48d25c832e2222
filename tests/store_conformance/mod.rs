//! The [`TaskStore`] conformance suite: one set of tests that every backend
//! must pass.
//!
//! Each test is a `pub async fn name(store: Store)` that receives a fresh,
//! empty store. [`store_conformance_tests!`] expands one `#[tokio::test]` per
//! function, so a backend joins the suite with a test file like
//! `tests/store_memory.rs`:
//!
//! ```ignore
//! mod store_conformance;
//! store_conformance::store_conformance_tests!(|| async {
//!     Arc::new(MemoryStore::new()) as Arc<dyn TaskStore>
//! });
//! ```
//!
//! A backend with a documented gap names the tests it is known to fail:
//! `store_conformance_tests!(factory, known_failures = [test_name])`.
//!
//! The module must be mounted at the test crate root under the name
//! `store_conformance` (the macro refers to `$crate::store_conformance::*`).
//! The factory is called once per test and must return a store that shares
//! nothing with the stores of other tests, which run in parallel (a fresh
//! database, schema or file per call).
//!
//! Adding a test: write the `pub async fn` here and add its name to the list
//! in [`store_conformance_tests!`]; a suite function missing from the list is
//! a `dead_code` error under `clippy -D warnings`.
//!
//! "Spec" below is the A2A protocol v1.0 specification; §3.1.4 is ListTasks.
//! The store-level contract (versions, tenants, cursor order) is documented
//! on `a2a_lifecycle::store`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use a2a_lifecycle::lifecycle::{HistoryLength, TaskRecord};
use a2a_lifecycle::proto::{Artifact, Message, Part, Role, Task, TaskState, part::Content};
use a2a_lifecycle::store::{
    Cursor, ListQuery, MAX_PAGE_SIZE, StoreError, StoredTask, TaskPage, TaskStore,
};
use prost_types::value::Kind;
use prost_types::{ListValue, NullValue, Struct, Timestamp, Value};

/// What every suite function receives: a fresh, empty store.
pub type Store = Arc<dyn TaskStore>;

/// Expands one `#[tokio::test]` per conformance test, each on a fresh store
/// from `$factory` (an expression callable as `$factory().await` that yields
/// a [`Store`]).
///
/// `known_failures = [name, ...]` marks tests this backend is known to fail:
/// they still run, and pass only if they fail (and fail, asking to be taken
/// off the list, once the backend passes them). Use it for a documented gap,
/// never to hide a regression.
macro_rules! store_conformance_tests {
    ($factory:expr $(, known_failures = [$($xfail:ident),* $(,)?])? $(,)?) => {
        /// Conformance tests this backend is known to fail.
        const KNOWN_FAILURES: &[&str] = &[$($(stringify!($xfail)),*)?];
        // A misspelt known failure is a compile error.
        #[allow(dead_code)]
        fn known_failures_are_suite_tests() {
            $($(let _ = $crate::store_conformance::$xfail;)*)?
        }
        $crate::store_conformance::store_conformance_tests!(@tests $factory;
            // CRUD and versions
            create_then_get_returns_same_record_at_version_1,
            get_of_missing_task_returns_none,
            create_twice_is_already_exists_and_keeps_first_record,
            concurrent_creates_of_one_id_exactly_one_wins,
            update_with_current_version_bumps_version_and_is_visible,
            update_with_stale_version_is_conflict_and_changes_nothing,
            update_of_missing_task_is_not_found,
            concurrent_updates_from_one_version_exactly_one_wins,
            // tenants
            same_task_id_in_two_tenants_are_two_tasks,
            list_never_returns_another_tenants_tasks,
            tenant_and_task_id_do_not_collide_when_concatenated,
            // ListTasks filters (spec §3.1.4)
            list_filters_by_context_id,
            list_filters_by_state,
            list_filters_by_status_after_inclusively,
            list_combines_filters,
            list_filters_see_updates,
            total_size_counts_all_matches_across_pages,
            list_of_unknown_or_empty_tenant_is_an_empty_last_page,
            // ListTasks order (spec §3.1.4)
            list_orders_by_status_timestamp_descending,
            list_order_distinguishes_nanoseconds,
            ties_break_by_task_id_ascending_in_byte_order,
            order_and_status_after_cover_the_whole_timestamp_range,
            update_that_changes_status_timestamp_moves_task_in_list_order,
            update_that_keeps_status_timestamp_keeps_list_position,
            // ListTasks pages (spec §3.1.4)
            page_size_is_respected_and_last_page_has_no_next,
            walking_pages_visits_every_matching_task_exactly_once,
            tasks_created_between_pages_neither_skip_nor_repeat_originals,
            cursor_survives_an_update_of_its_own_task,
            concurrent_inserts_during_walk_neither_skip_nor_repeat_originals,
            pagination_handles_ids_with_separators_and_unicode,
            // round trips
            every_part_kind_round_trips_in_history_and_artifacts,
            full_record_round_trips_through_create_and_update,
            awkward_strings_bytes_and_numbers_round_trip,
            list_returns_the_stored_task_unchanged_when_nothing_is_trimmed,
            // history / artifacts in ListTasks (spec §3.1.4)
            list_history_last_n_keeps_the_n_most_recent,
            list_include_artifacts_controls_artifacts,
            list_trimming_does_not_change_the_stored_task,
            // idempotency, recovery, retention
            same_creating_message_is_a_duplicate_within_a_tenant_only,
            find_by_origin_finds_the_created_task,
            active_tasks_lists_submitted_and_working_in_every_tenant,
            purge_deletes_only_old_terminal_tasks,
        );
    };
    (@tests $factory:expr; $($name:ident),+ $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let store: $crate::store_conformance::Store = ($factory)().await;
                $crate::store_conformance::run(
                    stringify!($name),
                    KNOWN_FAILURES,
                    $crate::store_conformance::$name(store),
                )
                .await;
            }
        )+
    };
}
pub(crate) use store_conformance_tests;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Runs one conformance test; a test listed in `known_failures` must fail.
pub async fn run(
    name: &str,
    known_failures: &[&str],
    test: impl Future<Output = ()> + Send + 'static,
) {
    if !known_failures.contains(&name) {
        return test.await;
    }
    match tokio::spawn(test).await {
        Err(e) if e.is_panic() => {
            eprintln!("{name}: known failure of this backend, failed as expected");
        }
        Err(e) => panic!("{name}: {e}"),
        Ok(()) => panic!("{name} is listed in known_failures but passed: take it off the list"),
    }
}

const T: &str = "tenant-a";
const BASE: i64 = 1_700_000_000;

pub fn ts(seconds: i64, nanos: i32) -> Timestamp {
    Timestamp { seconds, nanos }
}

/// `BASE + secs` seconds, whole.
pub fn at(secs: i64) -> Timestamp {
    ts(BASE + secs, 0)
}

fn text_part(text: &str) -> Part {
    Part {
        content: Some(Content::Text(text.into())),
        ..Default::default()
    }
}

fn message(id: &str, role: Role, text: &str) -> Message {
    Message {
        message_id: id.into(),
        role: role as i32,
        parts: vec![text_part(text)],
        ..Default::default()
    }
}

/// A task in `state` whose status timestamp is `when`, with one user message
/// in history.
pub fn record(id: &str, ctx: &str, state: TaskState, when: Timestamp) -> TaskRecord {
    let mut r = TaskRecord::submitted(
        id.into(),
        ctx.into(),
        message(&format!("{id}/m0"), Role::User, "hello"),
        when,
    );
    r.task.status.as_mut().unwrap().state = state as i32;
    r
}

/// Sets a record's status state and timestamp.
fn set_status(r: &mut TaskRecord, state: TaskState, when: Timestamp) {
    let st = r.task.status.as_mut().unwrap();
    st.state = state as i32;
    st.timestamp = Some(when);
}

async fn create(store: &Store, tenant: &str, r: &TaskRecord) {
    let v = store
        .create(tenant, r)
        .await
        .unwrap_or_else(|e| panic!("create {tenant}/{}: {e}", r.task.id));
    assert_eq!(v, 1, "a new task starts at version 1");
}

async fn get(store: &Store, tenant: &str, id: &str) -> Option<StoredTask> {
    store
        .get(tenant, id)
        .await
        .unwrap_or_else(|e| panic!("get {tenant}/{id}: {e}"))
}

async fn must_get(store: &Store, tenant: &str, id: &str) -> StoredTask {
    get(store, tenant, id)
        .await
        .unwrap_or_else(|| panic!("task {tenant}/{id} should exist"))
}

/// A query with no filters, the largest page, all history and artifacts.
pub fn query() -> ListQuery {
    ListQuery {
        page_size: MAX_PAGE_SIZE,
        history: HistoryLength::All,
        include_artifacts: true,
        ..Default::default()
    }
}

async fn list(store: &Store, tenant: &str, q: &ListQuery) -> TaskPage {
    store
        .list(tenant, q)
        .await
        .unwrap_or_else(|e| panic!("list {tenant} {q:?}: {e}"))
}

fn ids(tasks: &[Task]) -> Vec<String> {
    tasks.iter().map(|t| t.id.clone()).collect()
}

/// Ids of one page that must be the only one (fewer matches than a page).
async fn list_ids(store: &Store, tenant: &str, q: &ListQuery) -> Vec<String> {
    let page = list(store, tenant, q).await;
    assert!(page.next.is_none(), "expected a single page for {q:?}");
    assert_eq!(
        page.total_size,
        page.tasks.len(),
        "total_size of a single page for {q:?}"
    );
    ids(&page.tasks)
}

/// The cursor a client would send back: through its opaque token form.
fn via_token(c: &Cursor) -> Cursor {
    Cursor::decode(&c.encode()).expect("a cursor the store issued must decode")
}

/// Walks every page of `q`, returning the pages' ids. Checks that no page is
/// larger than `page_size` and that the cursor survives its token form.
async fn walk_pages(store: &Store, tenant: &str, mut q: ListQuery) -> Vec<Vec<String>> {
    let mut pages = Vec::new();
    loop {
        assert!(pages.len() < 10_000, "pagination does not terminate");
        let page = list(store, tenant, &q).await;
        assert!(
            page.tasks.len() <= q.page_size,
            "page of {} tasks exceeds page_size {}",
            page.tasks.len(),
            q.page_size
        );
        pages.push(ids(&page.tasks));
        match page.next {
            Some(c) => q.cursor = Some(via_token(&c)),
            None => return pages,
        }
    }
}

fn expect_ids(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn counts(ids: impl IntoIterator<Item = String>) -> HashMap<String, usize> {
    let mut seen = HashMap::new();
    for id in ids {
        *seen.entry(id).or_insert(0) += 1;
    }
    seen
}

fn assert_each_seen_once<'a>(
    seen: &HashMap<String, usize>,
    expected: impl Iterator<Item = &'a String>,
) {
    for id in expected {
        assert_eq!(
            seen.get(id).copied().unwrap_or(0),
            1,
            "task {id} must be seen exactly once across pages"
        );
    }
}

fn assert_no_repeats(seen: &HashMap<String, usize>) {
    let repeated: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        repeated.is_empty(),
        "tasks seen on more than one page: {repeated:?}"
    );
}

fn sv(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.into())),
    }
}

fn nv(n: f64) -> Value {
    Value {
        kind: Some(Kind::NumberValue(n)),
    }
}

fn bv(b: bool) -> Value {
    Value {
        kind: Some(Kind::BoolValue(b)),
    }
}

fn null() -> Value {
    Value {
        kind: Some(Kind::NullValue(NullValue::NullValue as i32)),
    }
}

fn lv(values: Vec<Value>) -> Value {
    Value {
        kind: Some(Kind::ListValue(ListValue { values })),
    }
}

fn st(fields: Vec<(&str, Value)>) -> Struct {
    Struct {
        fields: fields
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect::<BTreeMap<_, _>>(),
    }
}

fn stv(fields: Vec<(&str, Value)>) -> Value {
    Value {
        kind: Some(Kind::StructValue(st(fields))),
    }
}

/// A `google.protobuf.Value` using every kind, nested.
fn nested_data() -> Value {
    stv(vec![
        ("name", sv("report")),
        ("count", nv(42.0)),
        ("ratio", nv(-0.125)),
        ("big", nv(9_007_199_254_740_992.0)),
        ("ok", bv(true)),
        ("no", bv(false)),
        ("nothing", null()),
        (
            "items",
            lv(vec![
                nv(1.0),
                sv("two"),
                bv(false),
                null(),
                lv(vec![nv(3.5), lv(vec![])]),
                stv(vec![("deep", stv(vec![("deeper", sv("yes"))]))]),
            ]),
        ),
        ("empty_struct", stv(vec![])),
        ("empty_list", lv(vec![])),
    ])
}

/// One part of each content kind, every optional field set, plus a part
/// without content.
fn every_part_kind() -> Vec<(&'static str, Part)> {
    vec![
        (
            "text",
            Part {
                content: Some(Content::Text("plain text, with ünïcödé ✓".into())),
                metadata: Some(st(vec![("lang", sv("en"))])),
                filename: "note.txt".into(),
                media_type: "text/plain".into(),
            },
        ),
        (
            "raw bytes",
            Part {
                content: Some(Content::Raw(vec![0x00, 0xff, 0x80, 0x0a, 0x00, 0x7f, 0xc3])),
                metadata: Some(st(vec![("checksum", sv("abc")), ("size", nv(7.0))])),
                filename: "blob.bin".into(),
                media_type: "application/octet-stream".into(),
            },
        ),
        (
            "url",
            Part {
                content: Some(Content::Url(
                    "https://example.com/files/report.pdf?x=1&y=%20#frag".into(),
                )),
                metadata: Some(st(vec![("expires", nv(3600.0))])),
                filename: "report.pdf".into(),
                media_type: "application/pdf".into(),
            },
        ),
        (
            "structured data",
            Part {
                content: Some(Content::Data(nested_data())),
                metadata: Some(st(vec![
                    ("schema", sv("urn:schema:v1")),
                    ("nested", nested_data()),
                ])),
                filename: String::new(),
                media_type: "application/json".into(),
            },
        ),
        (
            "scalar data",
            Part {
                content: Some(Content::Data(nv(-17.5))),
                ..Default::default()
            },
        ),
        (
            "null data",
            Part {
                content: Some(Content::Data(null())),
                ..Default::default()
            },
        ),
        (
            "list data",
            Part {
                content: Some(Content::Data(lv(vec![sv("a"), nv(0.0), bv(true)]))),
                ..Default::default()
            },
        ),
        (
            "no content",
            Part {
                content: None,
                metadata: Some(st(vec![])),
                filename: "empty".into(),
                media_type: "text/plain".into(),
            },
        ),
    ]
}

/// A record using every field a store must keep: all part kinds in history,
/// status message and artifacts, message/artifact/task metadata, extensions,
/// reference_task_ids, sub-second timestamp and sealed artifacts.
fn rich_record(id: &str) -> TaskRecord {
    let parts: Vec<Part> = every_part_kind().into_iter().map(|(_, p)| p).collect();
    let user = Message {
        message_id: format!("{id}/u1"),
        context_id: "ctx-rich".into(),
        task_id: id.into(),
        role: Role::User as i32,
        parts: parts.clone(),
        metadata: Some(st(vec![("client", sv("cli")), ("attempt", nv(2.0))])),
        extensions: vec!["urn:a2a:ext:one".into(), "urn:a2a:ext:two".into()],
        reference_task_ids: vec!["earlier-1".into(), "earlier-2".into()],
    };
    let agent = Message {
        message_id: format!("{id}/a1"),
        context_id: "ctx-rich".into(),
        task_id: id.into(),
        role: Role::Agent as i32,
        parts: vec![text_part("working on it")],
        metadata: None,
        extensions: vec![],
        reference_task_ids: vec![],
    };
    let status_message = Message {
        message_id: format!("{id}/a2"),
        context_id: "ctx-rich".into(),
        task_id: id.into(),
        role: Role::Agent as i32,
        parts: parts.clone(),
        metadata: Some(st(vec![("reason", sv("need input"))])),
        extensions: vec!["urn:a2a:ext:status".into()],
        reference_task_ids: vec!["earlier-1".into()],
    };
    let mut r = TaskRecord::submitted(id.into(), "ctx-rich".into(), user, ts(BASE, 123_456_789));
    r.task.history.push(agent);
    let status = r.task.status.as_mut().unwrap();
    status.state = TaskState::InputRequired as i32;
    status.message = Some(status_message);
    r.task.artifacts = vec![
        Artifact {
            artifact_id: "art-1".into(),
            name: "Report".into(),
            description: "every part kind".into(),
            parts,
            metadata: Some(st(vec![("pages", nv(12.0)), ("tags", lv(vec![sv("x")]))])),
            extensions: vec!["urn:a2a:ext:artifact".into()],
        },
        Artifact {
            artifact_id: "art-2".into(),
            name: String::new(),
            description: String::new(),
            parts: vec![text_part("partial")],
            metadata: None,
            extensions: vec![],
        },
    ];
    r.task.metadata = Some(st(vec![("owner", sv("alice")), ("data", nested_data())]));
    r.sealed_artifacts = vec!["art-1".into()];
    r
}

// ---------------------------------------------------------------------------
// CRUD and versions
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// Tenants
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// ListTasks filters (spec §3.1.4)
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// ListTasks order (spec §3.1.4)
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// ListTasks pages (spec §3.1.4)
// ---------------------------------------------------------------------------

/// Spec §3.1.4 `page_size`: no page holds more; a page is full while more
/// follow; `next` is absent on the last page, even when the matches divide
/// evenly into pages (no empty trailing page).
pub async fn page_size_is_respected_and_last_page_has_no_next(store: Store) {
    for i in 0..7 {
        create(
            &store,
            T,
            &record(&format!("t{i}"), "c", TaskState::Working, at(i)),
        )
        .await;
    }
    let sizes = |pages: &[Vec<String>]| pages.iter().map(Vec::len).collect::<Vec<_>>();
    let q = |n| ListQuery {
        page_size: n,
        ..query()
    };
    assert_eq!(sizes(&walk_pages(&store, T, q(3)).await), [3, 3, 1]);
    assert_eq!(sizes(&walk_pages(&store, T, q(7)).await), [7]);
    assert_eq!(sizes(&walk_pages(&store, T, q(8)).await), [7]);
    assert_eq!(sizes(&walk_pages(&store, T, q(1)).await), [1; 7]);

    create(&store, T, &record("t7", "c", TaskState::Working, at(7))).await;
    create(&store, T, &record("t8", "c", TaskState::Working, at(8))).await;
    let pages = walk_pages(&store, T, q(3)).await;
    assert_eq!(
        sizes(&pages),
        [3, 3, 3],
        "9 tasks in pages of 3: no 4th page"
    );
    assert_eq!(
        pages,
        [
            expect_ids(&["t8", "t7", "t6"]),
            expect_ids(&["t5", "t4", "t3"]),
            expect_ids(&["t2", "t1", "t0"])
        ]
    );
    // The first page of a walk says there is more.
    let first = list(&store, T, &q(3)).await;
    assert!(first.next.is_some());
    assert_eq!(first.total_size, 9);
}

/// Walking pages with cursors visits every matching task exactly once, in
/// list order, also when ties on the timestamp straddle page boundaries and
/// filters skip tasks.
pub async fn walking_pages_visits_every_matching_task_exactly_once(store: Store) {
    let mut all = Vec::new();
    for i in 0..40i64 {
        // Groups of 5 share a timestamp, so cursors land inside ties.
        let id = format!("t{:02}", (i * 17) % 40);
        let ctx = if i % 4 == 3 { "other" } else { "main" };
        create(&store, T, &record(&id, ctx, TaskState::Working, at(i / 5))).await;
        all.push((id, ctx, i / 5));
    }
    for page_size in [1, 2, 3, 4, 5, 6, 7, 39, 40, 41] {
        for ctx in [None, Some("main")] {
            let q = ListQuery {
                context_id: ctx.map(str::to_owned),
                page_size,
                ..query()
            };
            let walked = walk_pages(&store, T, q.clone()).await.concat();
            let mut want: Vec<_> = all
                .iter()
                .filter(|(_, c, _)| ctx.is_none_or(|w| w == *c))
                .collect();
            want.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.0.cmp(&b.0)));
            let want: Vec<String> = want.into_iter().map(|(id, _, _)| id.clone()).collect();
            assert_eq!(walked, want, "page_size {page_size}, context {ctx:?}");
            assert_eq!(
                walked,
                list_ids(
                    &store,
                    T,
                    &ListQuery {
                        page_size: 100,
                        ..q
                    }
                )
                .await,
                "pages concatenate to the one-page list"
            );
        }
    }
}

/// Spec §3.1.4 with cursors: tasks created between pages (newer status
/// timestamps) make the remaining pages neither skip nor repeat any task that
/// existed when the walk began.
pub async fn tasks_created_between_pages_neither_skip_nor_repeat_originals(store: Store) {
    let mut originals = Vec::new();
    for i in 0..20i64 {
        let id = format!("orig-{i:02}");
        // Pairs share a timestamp.
        create(
            &store,
            T,
            &record(&id, "c", TaskState::Working, at(100 + i / 2)),
        )
        .await;
        originals.push(id);
    }
    let mut q = ListQuery {
        page_size: 3,
        ..query()
    };
    let mut seen = Vec::new();
    let mut totals = Vec::new();
    let mut created = 0;
    loop {
        let page = list(&store, T, &q).await;
        assert!(page.tasks.len() <= 3);
        totals.push(page.total_size);
        seen.extend(ids(&page.tasks));
        let Some(c) = page.next else { break };
        q.cursor = Some(via_token(&c));
        // Newer tasks, one of them with an id that sorts before every
        // original, as an offset-based pager would then repeat a task.
        for id in [format!("aaa-{created}"), format!("zzz-{created}")] {
            create(
                &store,
                T,
                &record(&id, "c", TaskState::Working, at(1_000 + created)),
            )
            .await;
        }
        created += 1;
    }
    let seen = counts(seen);
    assert_each_seen_once(&seen, originals.iter());
    assert_no_repeats(&seen);
    assert!(
        totals.windows(2).all(|w| w[0] < w[1]),
        "total_size counts the new tasks too: {totals:?}"
    );
}

/// A cursor names a position, not a live task: if the last task of a page
/// is updated (moved to the front, or out of the filter) before the next
/// page is read, the next page still starts right after where it was.
pub async fn cursor_survives_an_update_of_its_own_task(store: Store) {
    let mut rs = Vec::new();
    for i in 0..10 {
        let r = record(&format!("t{i}"), "c", TaskState::Working, at(100 - i));
        create(&store, T, &r).await;
        rs.push(r);
    }
    let q = ListQuery {
        state: Some(TaskState::Working),
        page_size: 3,
        ..query()
    };
    let first = list(&store, T, &q).await;
    assert_eq!(ids(&first.tasks), ["t0", "t1", "t2"]);
    let cursor = first.next.expect("more pages");

    // The cursor's task moves to the front.
    set_status(&mut rs[2], TaskState::Working, at(500));
    assert_eq!(store.update(T, &rs[2], 1).await, Ok(2));
    let second = list(
        &store,
        T,
        &ListQuery {
            cursor: Some(via_token(&cursor)),
            ..q.clone()
        },
    )
    .await;
    assert_eq!(ids(&second.tasks), ["t3", "t4", "t5"]);
    let cursor = second.next.expect("more pages");

    // The cursor's task leaves the filter.
    set_status(&mut rs[5], TaskState::Completed, at(95));
    assert_eq!(store.update(T, &rs[5], 1).await, Ok(2));
    let rest = walk_pages(
        &store,
        T,
        ListQuery {
            cursor: Some(via_token(&cursor)),
            ..q
        },
    )
    .await;
    assert_eq!(rest.concat(), ["t6", "t7", "t8", "t9"]);
}

/// Spec §3.1.4 with cursors under concurrency: while one task walks the
/// pages, several others create tasks (newer, interleaved with and tied to
/// the existing timestamps). Every task that existed before the walk began
/// is seen exactly once, and no task is seen twice.
pub async fn concurrent_inserts_during_walk_neither_skip_nor_repeat_originals(store: Store) {
    const ORIGINALS: i64 = 60;
    const WRITERS: usize = 4;
    const PER_WRITER: usize = 30;
    const PAGE: usize = 4;
    let mut originals = Vec::new();
    for i in 0..ORIGINALS {
        let id = format!("orig-{i:03}");
        create(&store, T, &record(&id, "c", TaskState::Working, at(i * 10))).await;
        originals.push(id);
    }

    let created = Arc::new(AtomicUsize::new(0));
    let (pages_tx, pages_rx) = tokio::sync::watch::channel(0usize);
    let mut writers = tokio::task::JoinSet::new();
    for w in 0..WRITERS {
        let store = store.clone();
        let created = created.clone();
        let mut pages_rx = pages_rx.clone();
        writers.spawn(async move {
            for k in 0..PER_WRITER {
                // Stay at most a couple of creations per page ahead of the
                // walker so the writes spread over the whole walk.
                let _ = pages_rx.wait_for(|p| *p >= k / 2).await;
                let n = (w * PER_WRITER + k) as i64;
                let when = match k % 3 {
                    0 => at(100_000 + n),              // newer than all
                    1 => at((n % ORIGINALS) * 10 + 5), // between originals
                    _ => at((n % ORIGINALS) * 10),     // tied with one
                };
                // "new-" < "orig-": ties sort before the original.
                let id = format!("new-{w}-{k:03}");
                store
                    .create(T, &record(&id, "c", TaskState::Working, when))
                    .await
                    .unwrap_or_else(|e| panic!("create {id}: {e}"));
                created.fetch_add(1, Ordering::SeqCst);
                tokio::task::yield_now().await;
            }
        });
    }

    let walker = {
        let store = store.clone();
        let created = created.clone();
        tokio::spawn(async move {
            let mut q = ListQuery {
                page_size: PAGE,
                ..query()
            };
            let mut seen = Vec::new();
            let mut totals = Vec::new();
            let mut pages = 0usize;
            loop {
                assert!(pages < 10_000, "pagination does not terminate");
                let page = list(&store, T, &q).await;
                assert!(page.tasks.len() <= PAGE);
                totals.push(page.total_size);
                seen.extend(ids(&page.tasks));
                pages += 1;
                let _ = pages_tx.send(pages);
                if pages == 1 {
                    // Make sure writes land between pages at least once.
                    let before = created.load(Ordering::SeqCst);
                    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
                    while created.load(Ordering::SeqCst)
                        < (before + WRITERS).min(WRITERS * PER_WRITER)
                        && tokio::time::Instant::now() < deadline
                    {
                        tokio::task::yield_now().await;
                    }
                }
                match page.next {
                    Some(c) => q.cursor = Some(via_token(&c)),
                    None => break,
                }
                tokio::task::yield_now().await;
            }
            let _ = pages_tx.send(usize::MAX);
            (seen, totals)
        })
    };

    let (seen, totals) = walker.await.expect("walker panicked");
    while let Some(r) = writers.join_next().await {
        r.expect("writer panicked");
    }
    let seen = counts(seen);
    assert_each_seen_once(&seen, originals.iter());
    assert_no_repeats(&seen);
    assert!(
        totals.first() < totals.last(),
        "writes should have overlapped the walk: totals {totals:?}"
    );
    assert_eq!(
        list(&store, T, &query()).await.total_size,
        ORIGINALS as usize + WRITERS * PER_WRITER
    );
}

/// Cursors work for ids containing the token's separators, spaces, unicode
/// and prefixes of each other.
pub async fn pagination_handles_ids_with_separators_and_unicode(store: Store) {
    let ids = [
        "a:b",
        "a",
        "a:",
        ":",
        "::x",
        "v1:5:x",
        "with space",
        "ünï",
        "日本",
        "🦀",
        "a/b",
        "a%2F",
        "=",
        "a\nb",
        "x\u{0}y",
    ];
    for (i, id) in ids.iter().enumerate() {
        // Half share one timestamp, half are spread out.
        let t = if i % 2 == 0 { at(50) } else { at(i as i64) };
        create(&store, T, &record(id, "c", TaskState::Working, t)).await;
    }
    let all = list_ids(&store, T, &query()).await;
    assert_eq!(all.len(), ids.len());
    for page_size in [1, 2, 4] {
        let pages = walk_pages(
            &store,
            T,
            ListQuery {
                page_size,
                ..query()
            },
        )
        .await;
        assert_eq!(pages.concat(), all, "page_size {page_size}");
    }
    for id in ids {
        assert_eq!(must_get(&store, T, id).await.record.task.id, id);
    }
}

// ---------------------------------------------------------------------------
// Round trips
// ---------------------------------------------------------------------------

/// Each part kind (text, raw bytes, url, structured data, no content) with
/// metadata, filename and media_type reads back exactly, in a message's
/// parts, in a status message and in an artifact.
pub async fn every_part_kind_round_trips_in_history_and_artifacts(store: Store) {
    for (i, (kind, part)) in every_part_kind().into_iter().enumerate() {
        let id = format!("part-{i}");
        let mut r = record(&id, "c", TaskState::Working, at(i as i64));
        r.task.history[0].parts = vec![part.clone()];
        r.task.status.as_mut().unwrap().message = Some(Message {
            message_id: format!("{id}/status"),
            role: Role::Agent as i32,
            parts: vec![part.clone(), text_part("after")],
            ..Default::default()
        });
        r.task.artifacts = vec![Artifact {
            artifact_id: format!("{id}/art"),
            parts: vec![text_part("before"), part.clone()],
            ..Default::default()
        }];
        create(&store, T, &r).await;
        assert_eq!(must_get(&store, T, &id).await.record, r, "part kind {kind}");
        let view = list(
            &store,
            T,
            &ListQuery {
                status_after: Some(at(i as i64)),
                ..query()
            },
        )
        .await;
        assert_eq!(view.tasks.last(), Some(&r.task), "list of part kind {kind}");
    }
}

/// A record using every field (all part kinds, message/artifact/task
/// metadata, extensions, reference_task_ids, artifact name/description,
/// sub-second timestamp, sealed_artifacts) reads back equal to what was
/// written, through create and through update.
pub async fn full_record_round_trips_through_create_and_update(store: Store) {
    let rich = rich_record("rich");
    create(&store, T, &rich).await;
    assert_eq!(
        must_get(&store, T, "rich").await,
        StoredTask {
            record: rich.clone(),
            version: 1
        }
    );

    // Through update: from a plain record to the rich one.
    let mut plain = record("plain", "ctx-rich", TaskState::Submitted, at(0));
    create(&store, T, &plain).await;
    let mut upgraded = rich_record("plain");
    upgraded.sealed_artifacts = vec!["art-1".into(), "art-2".into()];
    assert_eq!(store.update(T, &upgraded, 1).await, Ok(2));
    assert_eq!(
        must_get(&store, T, "plain").await,
        StoredTask {
            record: upgraded.clone(),
            version: 2
        }
    );

    // And back down: fields cleared by an update are cleared in the store.
    plain.sealed_artifacts.clear();
    assert_eq!(store.update(T, &plain, 2).await, Ok(3));
    assert_eq!(must_get(&store, T, "plain").await.record, plain);
    assert!(plain.task.metadata.is_none() && plain.task.artifacts.is_empty());
}

/// Strings, bytes and numbers that trip up text, JSON or SQL encodings read
/// back unchanged: NUL, non-BMP characters, escapes, a large text, every byte
/// value, extreme finite numbers, empty vs absent metadata.
pub async fn awkward_strings_bytes_and_numbers_round_trip(store: Store) {
    let awkward = "nul:\0 quote:\" backslash:\\ tab:\t cr:\r nl:\n bom:\u{feff} \
                   crab:🦀 rtl:\u{202e}abc ctrl:\u{1} sql:'; DROP TABLE tasks; -- \
                   json:{\"a\":[1]} surrogate-ish:\u{10ffff}";
    let big = "0123456789abcdef".repeat(64 * 1024); // 1 MiB
    let mut r = record("awk", awkward, TaskState::Working, ts(BASE, 1));
    r.task.history[0].message_id = awkward.into();
    r.task.history[0].parts = vec![
        text_part(awkward),
        text_part(""),
        text_part(&big),
        Part {
            content: Some(Content::Raw((0..=255u8).collect())),
            ..Default::default()
        },
        Part {
            content: Some(Content::Raw(Vec::new())),
            ..Default::default()
        },
        Part {
            content: Some(Content::Data(stv(vec![
                ("max", nv(f64::MAX)),
                ("min", nv(f64::MIN)),
                ("tiny", nv(f64::MIN_POSITIVE)),
                ("subnormal", nv(5e-324)),
                ("third", nv(1.0 / 3.0)),
                ("2^53+2", nv(9_007_199_254_740_994.0)),
                ("neg", nv(-1e-300)),
                (awkward, sv(awkward)),
                ("", sv("")),
            ]))),
            metadata: Some(st(vec![(awkward, sv(awkward))])),
            filename: awkward.into(),
            media_type: awkward.into(),
        },
    ];
    r.task.history[0].metadata = Some(Struct::default()); // empty, not absent
    r.task.history[0].extensions = vec![awkward.into(), String::new()];
    r.task.history[0].reference_task_ids = vec![awkward.into()];
    r.task.metadata = Some(Struct::default());
    r.task.artifacts = vec![Artifact {
        artifact_id: awkward.into(),
        name: awkward.into(),
        description: big.clone(),
        parts: vec![text_part(awkward)],
        metadata: Some(Struct::default()),
        extensions: vec![],
    }];
    r.sealed_artifacts = vec![awkward.into(), String::new()];
    create(&store, T, &r).await;
    assert_eq!(must_get(&store, T, "awk").await.record, r);
    let q = ListQuery {
        context_id: Some(awkward.into()),
        ..query()
    };
    let page = list(&store, T, &q).await;
    assert_eq!(
        page.tasks,
        [r.task.clone()],
        "context_id filter with awkward text"
    );
}

/// With `history = All` and `include_artifacts = true`, ListTasks returns each
/// task exactly as stored.
pub async fn list_returns_the_stored_task_unchanged_when_nothing_is_trimmed(store: Store) {
    let rich = rich_record("rich");
    let plain = record("plain", "c", TaskState::Working, at(-10));
    create(&store, T, &rich).await;
    create(&store, T, &plain).await;
    let page = list(&store, T, &query()).await;
    assert_eq!(page.tasks, [rich.task, plain.task]);
}

// ---------------------------------------------------------------------------
// History and artifacts in ListTasks (spec §3.1.4)
// ---------------------------------------------------------------------------

fn with_history(id: &str, n: usize, when: Timestamp) -> TaskRecord {
    let mut r = record(id, "c", TaskState::Working, when);
    for i in 1..n {
        let role = if i % 2 == 0 { Role::User } else { Role::Agent };
        r.task
            .history
            .push(message(&format!("{id}/m{i}"), role, &format!("msg {i}")));
    }
    r
}

fn history_ids(task: &Task) -> Vec<String> {
    task.history.iter().map(|m| m.message_id.clone()).collect()
}

/// Spec §3.1.4 `history_length`: `Last(n)` returns the n most recent messages
/// in their original order; 0 returns none; n at or above the length, and
/// `All`, return everything. The status message is not history and stays.
pub async fn list_history_last_n_keeps_the_n_most_recent(store: Store) {
    let mut r = with_history("t5", 5, at(2));
    r.task.status.as_mut().unwrap().message = Some(message("t5/status", Role::Agent, "now"));
    create(&store, T, &r).await;
    create(&store, T, &with_history("t1", 1, at(1))).await;
    let q = |h| ListQuery {
        history: h,
        ..query()
    };
    let cases: [(HistoryLength, &[&str], &[&str]); 6] = [
        (HistoryLength::Last(0), &[], &[]),
        (HistoryLength::Last(1), &["t5/m4"], &["t1/m0"]),
        (
            HistoryLength::Last(3),
            &["t5/m2", "t5/m3", "t5/m4"],
            &["t1/m0"],
        ),
        (
            HistoryLength::Last(5),
            &["t5/m0", "t5/m1", "t5/m2", "t5/m3", "t5/m4"],
            &["t1/m0"],
        ),
        (
            HistoryLength::Last(50),
            &["t5/m0", "t5/m1", "t5/m2", "t5/m3", "t5/m4"],
            &["t1/m0"],
        ),
        (
            HistoryLength::All,
            &["t5/m0", "t5/m1", "t5/m2", "t5/m3", "t5/m4"],
            &["t1/m0"],
        ),
    ];
    for (h, five, one) in cases {
        let page = list(&store, T, &q(h)).await;
        assert_eq!(ids(&page.tasks), ["t5", "t1"]);
        assert_eq!(history_ids(&page.tasks[0]), five, "{h:?}");
        assert_eq!(history_ids(&page.tasks[1]), one, "{h:?}");
        // The trimmed messages are the stored ones, not copies with changes.
        let tail = &r.task.history[r.task.history.len() - five.len()..];
        assert_eq!(page.tasks[0].history, tail, "{h:?}");
        assert_eq!(page.tasks[0].status, r.task.status, "{h:?}: status kept");
        assert_eq!(page.tasks[0].artifacts, r.task.artifacts);
        assert_eq!(page.tasks[0].metadata, r.task.metadata);
    }
}

/// Spec §3.1.4 `include_artifacts`: false omits artifacts from the listed
/// tasks; true includes them all, unchanged. Other fields are the same either
/// way.
pub async fn list_include_artifacts_controls_artifacts(store: Store) {
    let rich = rich_record("rich");
    create(&store, T, &rich).await;
    create(&store, T, &record("bare", "c", TaskState::Working, at(-50))).await;
    let q = |include| ListQuery {
        include_artifacts: include,
        ..query()
    };
    let without = list(&store, T, &q(false)).await;
    assert_eq!(ids(&without.tasks), ["rich", "bare"]);
    assert!(without.tasks.iter().all(|t| t.artifacts.is_empty()));
    let mut expected = rich.task.clone();
    expected.artifacts.clear();
    assert_eq!(without.tasks[0], expected, "only artifacts are omitted");

    let with = list(&store, T, &q(true)).await;
    assert_eq!(with.tasks[0].artifacts, rich.task.artifacts);
    assert_eq!(with.tasks[0], rich.task);
    assert!(with.tasks[1].artifacts.is_empty());

    // Both options together.
    let both = list(
        &store,
        T,
        &ListQuery {
            history: HistoryLength::Last(1),
            include_artifacts: false,
            ..query()
        },
    )
    .await;
    assert!(both.tasks[0].artifacts.is_empty());
    assert_eq!(
        both.tasks[0].history,
        rich.task.history[rich.task.history.len() - 1..]
    );
}

/// Trimming in ListTasks is a view: the stored task keeps its full history
/// and artifacts, its version is unchanged, and the next list with no
/// trimming returns it whole.
pub async fn list_trimming_does_not_change_the_stored_task(store: Store) {
    let mut r = with_history("t", 4, at(1));
    r.task.artifacts = vec![Artifact {
        artifact_id: "a".into(),
        parts: vec![text_part("x")],
        ..Default::default()
    }];
    create(&store, T, &r).await;
    let trimmed = list(
        &store,
        T,
        &ListQuery {
            history: HistoryLength::Last(0),
            include_artifacts: false,
            ..query()
        },
    )
    .await;
    assert!(trimmed.tasks[0].history.is_empty() && trimmed.tasks[0].artifacts.is_empty());
    assert_eq!(
        must_get(&store, T, "t").await,
        StoredTask {
            record: r.clone(),
            version: 1
        }
    );
    assert_eq!(list(&store, T, &query()).await.tasks, [r.task]);
}

// ---------------------------------------------------------------------------
// Idempotency (issue "idempotent sends"), recovery, retention
// ---------------------------------------------------------------------------

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
        .find_by_origin(T, &origin)
        .await
        .unwrap()
        .expect("found");
    assert_eq!(found.record, r);
    assert_eq!(found.version, 1);
    assert!(
        store
            .find_by_origin(T, "no-such-message")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        store
            .find_by_origin("tenant-b", &origin)
            .await
            .unwrap()
            .is_none()
    );
}

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
