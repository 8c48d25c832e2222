//! The suite's shared builders and checks: timestamps, records (plain, with
//! every part kind, with every field set), store calls that panic with the
//! call that failed, list queries, page walks and the per-walk counts that
//! catch a skipped or repeated task.

use std::collections::{BTreeMap, HashMap};

use a2a_lifecycle::lifecycle::{HistoryLength, TaskRecord};
use a2a_lifecycle::proto::{Artifact, Message, Part, Role, Task, TaskState, part::Content};
use a2a_lifecycle::store::{Cursor, ListQuery, MAX_PAGE_SIZE, StoredTask, TaskPage};
use a2a_lifecycle::wkt::value::Kind;
use a2a_lifecycle::wkt::{ListValue, NullValue, Struct, Timestamp, Value};

use super::Store;

pub(super) const T: &str = "tenant-a";
pub(super) const BASE: i64 = 1_700_000_000;

pub(super) fn ts(seconds: i64, nanos: i32) -> Timestamp {
    Timestamp { seconds, nanos }
}

/// `BASE + secs` seconds, whole.
pub(super) fn at(secs: i64) -> Timestamp {
    ts(BASE + secs, 0)
}

pub(super) fn text_part(text: &str) -> Part {
    Part {
        content: Some(Content::Text(text.into())),
        ..Default::default()
    }
}

pub(super) fn message(id: &str, role: Role, text: &str) -> Message {
    Message {
        message_id: id.into(),
        role: role as i32,
        parts: vec![text_part(text)],
        ..Default::default()
    }
}

/// A task in `state` whose status timestamp is `when`, with one user message
/// in history.
pub(super) fn record(id: &str, ctx: &str, state: TaskState, when: Timestamp) -> TaskRecord {
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
pub(super) fn set_status(r: &mut TaskRecord, state: TaskState, when: Timestamp) {
    let st = r.task.status.as_mut().unwrap();
    st.state = state as i32;
    st.timestamp = Some(when);
}

pub(super) async fn create(store: &Store, tenant: &str, r: &TaskRecord) {
    let v = store
        .create(tenant, r)
        .await
        .unwrap_or_else(|e| panic!("create {tenant}/{}: {e}", r.task.id));
    assert_eq!(v, 1, "a new task starts at version 1");
}

pub(super) async fn get(store: &Store, tenant: &str, id: &str) -> Option<StoredTask> {
    store
        .get(tenant, id)
        .await
        .unwrap_or_else(|e| panic!("get {tenant}/{id}: {e}"))
}

pub(super) async fn must_get(store: &Store, tenant: &str, id: &str) -> StoredTask {
    get(store, tenant, id)
        .await
        .unwrap_or_else(|| panic!("task {tenant}/{id} should exist"))
}

/// A query with no filters, the largest page, all history and artifacts.
pub(super) fn query() -> ListQuery {
    ListQuery {
        page_size: MAX_PAGE_SIZE,
        history: HistoryLength::All,
        include_artifacts: true,
        ..Default::default()
    }
}

pub(super) async fn list(store: &Store, tenant: &str, q: &ListQuery) -> TaskPage {
    store
        .list(tenant, q)
        .await
        .unwrap_or_else(|e| panic!("list {tenant} {q:?}: {e}"))
}

pub(super) fn ids(tasks: &[Task]) -> Vec<String> {
    tasks.iter().map(|t| t.id.clone()).collect()
}

/// Ids of one page that must be the only one (fewer matches than a page).
pub(super) async fn list_ids(store: &Store, tenant: &str, q: &ListQuery) -> Vec<String> {
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
pub(super) fn via_token(c: &Cursor) -> Cursor {
    Cursor::decode(&c.encode()).expect("a cursor the store issued must decode")
}

/// Walks every page of `q`, returning the pages' ids. Checks that no page is
/// larger than `page_size` and that the cursor survives its token form.
pub(super) async fn walk_pages(store: &Store, tenant: &str, mut q: ListQuery) -> Vec<Vec<String>> {
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

pub(super) fn expect_ids(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

pub(super) fn counts(ids: impl IntoIterator<Item = String>) -> HashMap<String, usize> {
    let mut seen = HashMap::new();
    for id in ids {
        *seen.entry(id).or_insert(0) += 1;
    }
    seen
}

pub(super) fn assert_each_seen_once<'a>(
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

pub(super) fn assert_no_repeats(seen: &HashMap<String, usize>) {
    let repeated: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        repeated.is_empty(),
        "tasks seen on more than one page: {repeated:?}"
    );
}

pub(super) fn sv(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.into())),
    }
}

pub(super) fn nv(n: f64) -> Value {
    Value {
        kind: Some(Kind::NumberValue(n)),
    }
}

pub(super) fn bv(b: bool) -> Value {
    Value {
        kind: Some(Kind::BoolValue(b)),
    }
}

pub(super) fn null() -> Value {
    Value {
        kind: Some(Kind::NullValue(NullValue::NullValue as i32)),
    }
}

pub(super) fn lv(values: Vec<Value>) -> Value {
    Value {
        kind: Some(Kind::ListValue(ListValue { values })),
    }
}

pub(super) fn st(fields: Vec<(&str, Value)>) -> Struct {
    Struct {
        fields: fields
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect::<BTreeMap<_, _>>(),
    }
}

pub(super) fn stv(fields: Vec<(&str, Value)>) -> Value {
    Value {
        kind: Some(Kind::StructValue(st(fields))),
    }
}

/// A `google.protobuf.Value` using every kind, nested.
pub(super) fn nested_data() -> Value {
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
pub(super) fn every_part_kind() -> Vec<(&'static str, Part)> {
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
pub(super) fn rich_record(id: &str) -> TaskRecord {
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
    r.owner = "alice".into();
    // The trace its webhooks carry (issue "operability").
    r.trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into();
    // Push configs are stored with the task (issue "push notifications").
    r.push_configs = vec![
        a2a_lifecycle::proto::TaskPushNotificationConfig {
            id: "hook-1".into(),
            url: "https://hooks.example.test/a2a?x=1".into(),
            token: "opaque-token".into(),
            authentication: Some(a2a_lifecycle::proto::AuthenticationInfo {
                scheme: "Bearer".into(),
                credentials: "secret".into(),
            }),
            ..Default::default()
        },
        a2a_lifecycle::proto::TaskPushNotificationConfig {
            id: "hook-2".into(),
            url: "http://[2001:db8::1]:8080/".into(),
            ..Default::default()
        },
    ];
    r
}
