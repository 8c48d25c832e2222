//! History and artifacts in ListTasks (spec §3.1.4): `history_length` and
//! `include_artifacts` trim the listed tasks, never the stored ones.

use a2a_lifecycle::lifecycle::{HistoryLength, TaskRecord};
use a2a_lifecycle::proto::{Artifact, Role, Task, TaskState};
use a2a_lifecycle::store::{ListQuery, StoredTask};
use a2a_lifecycle::wkt::Timestamp;

use super::Store;
use super::helpers::{
    T, at, create, ids, list, message, must_get, query, record, rich_record, text_part,
};

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
