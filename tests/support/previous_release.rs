//! The databases the release before the long-task layout wrote
//! (`tests/fixtures/sqlite-schema-8.sql`, `tests/fixtures/postgres-schema-10.sql`:
//! `serve` at ea82b54 with the demo agents, four messages), read by a
//! store of this release: what each backend's migration test checks.

use a2a_lifecycle::lifecycle::{
    Changes, HistoryLength, StatusUpdate, TaskEvent, TaskRecord, TransitionPolicy,
};
use a2a_lifecycle::proto::TaskState;
use a2a_lifecycle::store::{Body, EncodedTask, ListQuery, TaskStore};
use prost::Message as _;

/// Checks that `store` reads every task the fixture holds as it was (a
/// completed test run, a code review waiting for input, a bench fan-out
/// of 20 updates, a rejected deploy), then writes the waiting task's
/// follow-up and its WORKING status as changes. Returns the waiting task's
/// id, its record as written and its version, for the caller to read back.
pub async fn check_and_continue(store: &dyn TaskStore) -> (String, TaskRecord, u64) {
    let all = ListQuery {
        history: HistoryLength::All,
        include_artifacts: true,
        ..Default::default()
    };
    let mut states = Vec::new();
    for tenant in ["", "code-reviewer", "bench", "deployer"] {
        let page = store.list(tenant, &all).await.unwrap();
        assert_eq!(page.tasks.len(), 1, "tenant {tenant:?}");
        states.push(super::state_of(&page.tasks[0]));
    }
    assert_eq!(
        states,
        [
            TaskState::Completed,
            TaskState::InputRequired,
            TaskState::Completed,
            TaskState::Rejected
        ]
    );
    let fanout = &store.list("bench", &all).await.unwrap().tasks[0];
    assert_eq!(fanout.artifacts[0].parts.len(), 10, "the fan-out's chunks");
    let waiting_id = store.list("code-reviewer", &all).await.unwrap().tasks[0]
        .id
        .clone();
    let stored = store
        .get("code-reviewer", &waiting_id)
        .await
        .unwrap()
        .unwrap();
    let (mut record, mut version) = (stored.record, stored.version);
    for event in [
        TaskEvent::UserMessage(super::user_message("here is the diff")),
        TaskEvent::Status(StatusUpdate {
            state: TaskState::Working,
            message: None,
            metadata: None,
        }),
    ] {
        let mut log = Vec::new();
        record
            .apply_logged(
                event,
                a2a_lifecycle::runtime::now(),
                TransitionPolicy::Permissive,
                a2a_lifecycle::lifecycle::Cause::Agent,
                &mut log,
            )
            .unwrap();
        let write = EncodedTask::of(
            &record,
            Body::Changes(Changes::new(log).encode_to_vec().into()),
        );
        version = store
            .update_encoded("code-reviewer", &write, version)
            .await
            .unwrap();
    }
    (waiting_id, record, version)
}
