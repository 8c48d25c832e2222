//! Long-lived tasks (issue "long-lived tasks"; spec §1: "potentially very
//! long-running tasks"): thousands of updates to one task, each a write of
//! its own, written as the runtime writes them, as what each update
//! changed ([`Body::Changes`]) on a store that keeps changes and as the
//! whole task from time to time, and read back whole, consistently, while
//! they are written.

use std::sync::Arc;

use a2a_lifecycle::lifecycle::{
    ArtifactUpdate, Cause, Changes, HistoryLength, MAX_TRANSITIONS, StatusUpdate, TaskEvent,
    TaskRecord, TransitionPolicy,
};
use a2a_lifecycle::proto::{Artifact, Role, Task, TaskState};
use a2a_lifecycle::store::{Body, CatchUp, EncodedTask};
use prost::Message as _;

use super::Store;
use super::helpers::{T, at, list, message, must_get, query, text_part};

/// Update `n` (from 1): odd, a WORKING status whose message the next odd
/// one moves into history; even, a chunk appended to the one artifact
/// (created by update 2), the agent's progress and its streamed output.
fn update(n: usize) -> TaskEvent {
    if n % 2 == 1 {
        TaskEvent::Status(StatusUpdate {
            state: TaskState::Working,
            message: Some(message(&format!("s{n}"), Role::Agent, &n.to_string())),
            metadata: None,
        })
    } else {
        TaskEvent::Artifact(ArtifactUpdate {
            artifact: Artifact {
                artifact_id: "log".into(),
                parts: vec![text_part(&n.to_string())],
                ..Default::default()
            },
            append: n > 2,
            last_chunk: false,
            metadata: None,
        })
    }
}

/// The task after `n` updates, as a reader checks it: `n / 2` chunks in
/// the artifact, the status message of the last odd update, and every
/// earlier status message in history after the creating message.
fn check(record: &TaskRecord, n: usize, what: &str) {
    let task = &record.task;
    let chunks = task.artifacts.first().map_or(0, |a| a.parts.len());
    assert_eq!(chunks, n / 2, "{what}: chunks after {n} updates");
    let statuses = n.div_ceil(2);
    assert_eq!(
        task.history.len(),
        1 + statuses.saturating_sub(1),
        "{what}: history after {n} updates"
    );
    if statuses > 0 {
        let status = task.status.as_ref().and_then(|s| s.message.as_ref());
        assert_eq!(
            status.map(|m| m.message_id.as_str()),
            Some(format!("s{}", 2 * statuses - 1).as_str()),
            "{what}: the status after {n} updates"
        );
    }
}

/// Task `id` as created, before its updates.
fn long_task(id: &str) -> TaskRecord {
    TaskRecord::submitted(
        id.into(),
        "ctx".into(),
        message(&format!("{id}/m0"), Role::User, "go"),
        at(0),
    )
}

/// Task `id` as each version left it ([`write_long_task`]): index
/// `version - 1`, from the create (version 1) to `updates` updates later.
fn long_task_versions(id: &str, updates: usize) -> Vec<TaskRecord> {
    let mut record = long_task(id);
    let mut versions = vec![record.clone()];
    for n in 1..=updates {
        record
            .apply(update(n), at(n as i64), TransitionPolicy::Permissive)
            .expect("apply");
        versions.push(record.clone());
    }
    versions
}

/// Writes `updates` updates to a new task `id`, one store write each: what
/// each changed, and every `whole_every` writes the whole task (0: never),
/// as the runtime does when changes outweigh the task. Returns the task
/// as applied.
async fn write_long_task(
    store: &Store,
    id: &str,
    updates: usize,
    whole_every: usize,
    after_each: impl Fn(usize),
) -> TaskRecord {
    write_long_task_of(store, id, updates, whole_every, update, after_each).await
}

/// [`write_long_task`] with update `n` made by `update`.
async fn write_long_task_of(
    store: &Store,
    id: &str,
    updates: usize,
    whole_every: usize,
    update: impl Fn(usize) -> TaskEvent,
    after_each: impl Fn(usize),
) -> TaskRecord {
    let mut record = long_task(id);
    store.create(T, &record).await.expect("create");
    for n in 1..=updates {
        let mut log = Vec::new();
        record
            .apply_logged(
                update(n),
                at(n as i64),
                TransitionPolicy::Permissive,
                a2a_lifecycle::lifecycle::Cause::Agent,
                &mut log,
            )
            .expect("apply");
        let changes: std::sync::Arc<[u8]> = Changes::new(log).encode_to_vec().into();
        let whole = !store.keeps_changes() || (whole_every > 0 && n % whole_every == 0);
        let body = if whole {
            Body::Whole(a2a_lifecycle::store::codec::encode(&record).into())
        } else {
            Body::Changes(changes.clone())
        };
        let mut write = EncodedTask::of(&record, body);
        // As the runtime logs a running task's whole write for replicas.
        if whole && store.coordination().is_some() {
            write.logged = Some(changes);
        }
        let version = store
            .update_encoded(T, &write, n as u64)
            .await
            .unwrap_or_else(|e| panic!("update {n}: {e}"));
        assert_eq!(version, n as u64 + 1);
        after_each(n);
    }
    record
}

/// Thousands of updates, each its own write, read back whole and equal to
/// the task as applied: with only changes after the create, and with a
/// whole write now and then.
pub async fn thousands_of_updates_read_back_whole(store: Store) {
    for (id, whole_every) in [("only-changes", 0), ("whole-now-and-then", 700)] {
        let written = write_long_task(&store, id, 3_000, whole_every, |_| {}).await;
        let stored = must_get(&store, T, id).await;
        assert_eq!(stored.version, 3_001);
        assert_eq!(stored.record, written, "{id}");
        check(&stored.record, 3_000, id);
        // The task alone (GetTask), with changes to replay after the
        // record, as `get` reads it.
        assert_eq!(
            store
                .get_task(T, id, None)
                .await
                .expect("get_task")
                .as_ref(),
            Some(&written.task),
            "{id}: get_task"
        );
        assert_eq!(
            read_task(&store, id, HistoryLength::All).await,
            written.task,
            "{id}: read_task"
        );
        // It ends with a whole write, as the runtime ends a task.
        let mut ended = written;
        ended
            .apply(
                TaskEvent::Status(StatusUpdate {
                    state: TaskState::Completed,
                    message: None,
                    metadata: None,
                }),
                at(3_001),
                TransitionPolicy::Permissive,
            )
            .expect("apply");
        let version = store
            .update_encoded(T, &EncodedTask::new(&ended), 3_001)
            .await
            .expect("the last write");
        assert_eq!(version, 3_002);
        assert_eq!(must_get(&store, T, id).await.record, ended, "{id}, ended");
        // Whole again: the task's field alone is read.
        assert_eq!(
            store.get_task(T, id, None).await.expect("get_task"),
            Some(ended.task.clone()),
            "{id}, ended: get_task"
        );
        // As kept (GetTask over gRPC answers with a store's encoding), and
        // with the history trimmed in it: what trimming the task gives.
        for history in [
            HistoryLength::All,
            HistoryLength::Last(0),
            HistoryLength::Last(1),
            HistoryLength::Last(2),
            HistoryLength::Last(2_999),
            HistoryLength::Last(100_000),
        ] {
            let mut expected = ended.task.clone();
            history.apply(&mut expected);
            assert_eq!(
                read_task(&store, id, history).await,
                expected,
                "{id}, ended: read_task, {history:?}"
            );
        }
    }
}

/// ListTasks of a long task: history windows and artifacts as asked, from
/// the task as last written.
pub async fn list_windows_a_long_tasks_history(store: Store) {
    write_long_task(&store, "long", 1_001, 0, |_| {}).await;
    let mut q = query();
    q.history = HistoryLength::Last(3);
    q.include_artifacts = true;
    let page = list(&store, T, &q).await;
    let task = &page.tasks[0];
    let ids: Vec<&str> = task.history.iter().map(|m| m.message_id.as_str()).collect();
    assert_eq!(ids, ["s995", "s997", "s999"]);
    assert_eq!(task.artifacts[0].parts.len(), 500);
    q.include_artifacts = false;
    q.history = HistoryLength::Last(0);
    let page = list(&store, T, &q).await;
    assert!(page.tasks[0].history.is_empty());
    assert!(page.tasks[0].artifacts.is_empty());
}

/// Readers during the appends each see one whole version: the task as it
/// was after some number of updates, never a mix, and never older than a
/// version read before.
pub async fn readers_during_appends_see_whole_versions(store: Store) {
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (store, done) = (store.clone(), done.clone());
            tokio::spawn(async move {
                let mut last = 0;
                let mut reads = 0;
                while !done.load(std::sync::atomic::Ordering::SeqCst) {
                    if let Some(stored) = store.get(T, "read-while-written").await.expect("get") {
                        let n = stored.version as usize - 1;
                        check(&stored.record, n, "a read during the appends");
                        assert!(stored.version >= last, "a read went back in time");
                        last = stored.version;
                        reads += 1;
                    }
                    tokio::task::yield_now().await;
                }
                reads
            })
        })
        .collect();
    write_long_task(&store, "read-while-written", 1_500, 400, |_| {}).await;
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    for reader in readers {
        let reads = tokio::time::timeout(std::time::Duration::from_secs(30), reader)
            .await
            .expect("a reader finished")
            .expect("a reader did not panic");
        assert!(reads > 0, "a reader read nothing");
    }
}

/// A stale writer of changes is refused like a stale whole writer, and
/// changes nothing: the task reads back as the current writer left it.
pub async fn a_stale_write_of_changes_is_refused(store: Store) {
    let written = write_long_task(&store, "stale", 10, 0, |_| {}).await;
    let mut stale = written.clone();
    let mut log = Vec::new();
    stale
        .apply_logged(
            update(11),
            at(11),
            TransitionPolicy::Permissive,
            a2a_lifecycle::lifecycle::Cause::Agent,
            &mut log,
        )
        .expect("apply");
    let body = if store.keeps_changes() {
        Body::Changes(Changes::new(log).encode_to_vec().into())
    } else {
        Body::Whole(a2a_lifecycle::store::codec::encode(&stale).into())
    };
    let refused = store
        .update_encoded(T, &EncodedTask::of(&stale, body), 5)
        .await;
    assert!(
        matches!(
            refused,
            Err(a2a_lifecycle::store::StoreError::Conflict { actual: 11, .. })
        ),
        "{refused:?}"
    );
    assert_eq!(must_get(&store, T, "stale").await.record, written);
}

/// What a replica following a task reads to catch up from the version it
/// holds ([`Coordination::catch_up`]): the task as it is now, whole or as the
/// changes of each write since, which replayed on the task at that version
/// give it as it is now, from any version. A store shared by replicas
/// gives the changes whenever it still keeps all of them (back to the last
/// whole write), so that following a long task costs each write what it
/// changed, not the task again (issue "long-lived tasks").
///
/// [`Coordination::catch_up`]: a2a_lifecycle::store::Coordination::catch_up
pub async fn catch_up_gives_the_task_from_any_version(store: Store) {
    use a2a_lifecycle::store::Caught;
    // Whole writes at updates 50 and 100: versions 51 and 101. A store
    // shared by replicas keeps the changes since the whole write before
    // the last (51): from any version from there on, it answers changes.
    let written = write_long_task(&store, "followed", 120, 50, |_| {}).await;
    let versions = long_task_versions("followed", 120);
    assert_eq!(versions[120], written);
    let shared = store.coordination().is_some();
    for after in [0u64, 1, 2, 50, 51, 52, 100, 101, 102, 110, 120, 121] {
        let up = caught_up(&store, "followed", after)
            .await
            .unwrap_or_else(|e| panic!("catch up from {after}: {e}"))
            .expect("the task is there");
        assert_eq!(up.version, 121, "from {after}");
        let now = match up.task {
            Caught::Whole(record) => {
                assert!(
                    !(shared && store.keeps_changes() && after >= 51),
                    "from {after}: the whole task, though the changes since are kept"
                );
                *record
            }
            Caught::Changes(writes) => {
                assert!(after >= 1, "changes from before the create");
                if shared {
                    assert!(after >= 51, "changes from {after}, before those kept");
                    assert_eq!(writes.len() as u64, 121 - after, "from {after}");
                }
                let mut record = versions[after as usize - 1].clone();
                for changes in writes {
                    record
                        .replay_all(changes)
                        .unwrap_or_else(|e| panic!("from {after}: {e}"));
                }
                record
            }
        };
        assert_eq!(now, written, "caught up from {after}");
    }
    assert!(
        caught_up(&store, "missing", 0)
            .await
            .expect("catch up")
            .is_none(),
        "a task that is not there"
    );
}

/// The task in `T` as caught up from version `after`: through the
/// store's coordination between replicas when it has one
/// (`Coordination::catch_up`), else as the runtime does for a store of one
/// process: the task whole, read with `get`.
async fn caught_up(
    store: &Store,
    id: &str,
    after: u64,
) -> Result<Option<CatchUp>, a2a_lifecycle::store::StoreError> {
    match store.coordination() {
        Some(replicas) => replicas.catch_up(T, id, after).await,
        None => Ok(store.get(T, id).await?.map(|task| CatchUp {
            complete: task.version <= after,
            version: task.version,
            task: a2a_lifecycle::store::Caught::Whole(Box::new(task.record)),
            events: Vec::new(),
        })),
    }
}

/// State `n` of a task that keeps changing state: odd WORKING, even
/// INPUT_REQUIRED.
fn flip_state(n: usize) -> TaskState {
    if n % 2 == 1 {
        TaskState::Working
    } else {
        TaskState::InputRequired
    }
}

/// Update `n` of such a task: its state, with a status message.
fn flip(n: usize) -> TaskEvent {
    TaskEvent::Status(StatusUpdate {
        state: flip_state(n),
        message: Some(message(&format!("s{n}"), Role::Agent, &n.to_string())),
        metadata: None,
    })
}

/// The transition log (issue "console") is part of the task as stored:
/// written with each write's changes and with the whole task, read back
/// equal, bounded to [`MAX_TRANSITIONS`] (the first entry and the latest
/// ones), in order.
pub async fn the_transition_log_is_kept_with_the_task(store: Store) {
    let flips = MAX_TRANSITIONS + 40;
    let written = write_long_task_of(&store, "flipping", flips, 97, flip, |_| {}).await;
    let stored = must_get(&store, T, "flipping").await;
    assert_eq!(stored.record, written);
    let log = &stored.record.transitions;
    assert_eq!(log.len(), MAX_TRANSITIONS, "bounded");
    assert_eq!(log[0].state, TaskState::Submitted as i32);
    assert_eq!(log[0].cause, Cause::Client as i32);
    assert_eq!(log[0].message_id, "flipping/m0", "the creating message");
    let first_kept = flips - (MAX_TRANSITIONS - 1) + 1;
    for (k, entry) in log[1..].iter().enumerate() {
        let n = first_kept + k;
        assert_eq!(entry.state, flip_state(n) as i32, "entry {k}");
        assert_eq!(entry.timestamp, Some(at(n as i64)), "entry {k}");
        assert_eq!(entry.message_id, format!("s{n}"), "entry {k}");
        assert_eq!(entry.cause, Cause::Agent as i32, "entry {k}");
    }
    // ListTasks shows the task as it is, the log not in it.
    let page = list(&store, T, &query()).await;
    assert_eq!(page.tasks.len(), 1);
    assert_eq!(page.tasks[0], stored.record.task);
}

/// [`TaskStore::read_task`] of a task that exists, its history trimmed to
/// `history`, decoded.
async fn read_task(store: &Store, id: &str, history: HistoryLength) -> Task {
    store
        .read_task(T, id, None)
        .await
        .expect("read_task")
        .unwrap_or_else(|| panic!("{id}: read_task found nothing"))
        .with_history(history)
        .expect("with_history")
        .into_task()
        .expect("into_task")
}
