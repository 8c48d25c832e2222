//! Push notification configs in the runtime (issue "push notifications"):
//! set, read, listed and deleted by whoever may see the task, committed
//! with the task (so durable with it), bounded per task, and reachable in
//! any state of the task.

use crate::support;

use std::sync::Arc;

use a2a_lifecycle::agent::demo::demo_router;
use a2a_lifecycle::error::A2aError;
use a2a_lifecycle::lifecycle::{HistoryLength, MAX_PUSH_CONFIGS};
use a2a_lifecycle::proto::{TaskPushNotificationConfig, TaskState};
use a2a_lifecycle::runtime::{MessageRequest, RuntimeConfig, SendOutcome, TaskManager};
use a2a_lifecycle::store::{Caller, SqliteStore, TaskStore};

use support::{user_message, within};

const TENANT: &str = "code-reviewer";

fn user(name: &str) -> Caller {
    Caller {
        name: name.into(),
        own_tasks_only: true,
        ..Caller::ANONYMOUS
    }
}

fn config(task_id: &str, id: &str) -> TaskPushNotificationConfig {
    TaskPushNotificationConfig {
        tenant: TENANT.into(),
        task_id: task_id.into(),
        id: id.into(),
        url: format!("https://hooks.example.test/{id}"),
        token: format!("token-{id}"),
        ..Default::default()
    }
}

/// A task of `caller`'s, waiting for input.
async fn new_task(manager: &TaskManager, caller: &Caller) -> String {
    let request = MessageRequest::from(user_message("review my change"));
    let task = support::run_to_rest(manager, TENANT, caller, request).await;
    assert_eq!(
        support::state_of(&task),
        TaskState::InputRequired,
        "{task:?}"
    );
    task.id
}

fn scratch_db() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("push-configs")
        .join(format!("{}.db", uuid::Uuid::new_v4()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configs_are_set_read_listed_and_deleted_and_survive_a_restart() {
    let path = scratch_db();
    let store = SqliteStore::open(&path).await.unwrap();
    let manager = TaskManager::new(
        Arc::new(store.clone()) as Arc<dyn TaskStore>,
        demo_router(),
        RuntimeConfig::default(),
    );
    let alice = user("alice");
    let task = new_task(&manager, &alice).await;

    let set = within(
        "set",
        manager.set_push_config(TENANT, &alice, config(&task, "a")),
    )
    .await
    .unwrap();
    assert_eq!(
        (set.tenant.as_str(), set.task_id.as_str()),
        (TENANT, task.as_str())
    );
    let mut replaced = config(&task, "a");
    replaced.url = "https://hooks.example.test/replaced".into();
    within(
        "replace",
        manager.set_push_config(TENANT, &alice, replaced.clone()),
    )
    .await
    .unwrap();
    within(
        "second",
        manager.set_push_config(TENANT, &alice, config(&task, "b")),
    )
    .await
    .unwrap();
    let got = manager
        .get_push_config(TENANT, &alice, &task, "a")
        .await
        .unwrap();
    assert_eq!(got, replaced);
    let listed = manager
        .list_push_configs(TENANT, &alice, &task)
        .await
        .unwrap();
    assert_eq!(
        listed.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
        ["a", "b"]
    );

    // A missing config is TASK_NOT_FOUND naming it; delete is idempotent.
    match manager.get_push_config(TENANT, &alice, &task, "zzz").await {
        Err(A2aError::PushConfigNotFound { config_id, .. }) => assert_eq!(config_id, "zzz"),
        other => panic!("expected PushConfigNotFound, got {other:?}"),
    }
    manager
        .delete_push_config(TENANT, &alice, &task, "b")
        .await
        .unwrap();
    manager
        .delete_push_config(TENANT, &alice, &task, "b")
        .await
        .unwrap();
    manager
        .delete_push_config(TENANT, &alice, &task, "never")
        .await
        .unwrap();

    // Another user reaches neither the task's configs nor their existence.
    let bob = user("bob");
    for result in [
        manager
            .get_push_config(TENANT, &bob, &task, "a")
            .await
            .map(drop),
        manager
            .list_push_configs(TENANT, &bob, &task)
            .await
            .map(drop),
        manager.delete_push_config(TENANT, &bob, &task, "a").await,
        manager
            .set_push_config(TENANT, &bob, config(&task, "bobs"))
            .await
            .map(drop),
    ] {
        assert!(
            matches!(result, Err(A2aError::TaskNotFound { .. })),
            "{result:?}"
        );
    }
    // An admin (and a server without authentication) sees them.
    let admin = Caller {
        name: "root".into(),
        own_tasks_only: false,
        ..Caller::ANONYMOUS
    };
    assert_eq!(
        manager
            .list_push_configs(TENANT, &admin, &task)
            .await
            .unwrap()
            .len(),
        1
    );

    // Stored with the task: a new runtime on the same database reads them.
    drop(manager);
    let stopped = store.stopped();
    drop(store);
    within("store closed", stopped).await;
    let store = SqliteStore::open(&path).await.unwrap();
    let manager = TaskManager::new(
        Arc::new(store) as Arc<dyn TaskStore>,
        demo_router(),
        RuntimeConfig::default(),
    );
    let listed = manager
        .list_push_configs(TENANT, &alice, &task)
        .await
        .unwrap();
    assert_eq!(listed, vec![replaced]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configs_are_bounded_per_task_and_kept_after_the_task_ends() {
    let manager = TaskManager::new(
        Arc::new(a2a_lifecycle::store::MemoryStore::new()),
        demo_router(),
        RuntimeConfig::default(),
    );
    let anyone = Caller::ANONYMOUS;
    let task = new_task(&manager, &anyone).await;
    for i in 0..MAX_PUSH_CONFIGS {
        manager
            .set_push_config(TENANT, &anyone, config(&task, &i.to_string()))
            .await
            .unwrap();
    }
    match manager
        .set_push_config(TENANT, &anyone, config(&task, "one-too-many"))
        .await
    {
        Err(A2aError::InvalidArgument(violations)) => {
            assert_eq!(violations[0].field, "task_id")
        }
        other => panic!("expected INVALID_ARGUMENT, got {other:?}"),
    }
    // Replacing one at the limit is fine.
    manager
        .set_push_config(TENANT, &anyone, config(&task, "0"))
        .await
        .unwrap();

    // A canceled task's configs can still be read and deleted.
    manager
        .cancel_task(TENANT, &anyone, &task, None)
        .await
        .unwrap();
    assert_eq!(
        manager
            .list_push_configs(TENANT, &anyone, &task)
            .await
            .unwrap()
            .len(),
        MAX_PUSH_CONFIGS
    );
    manager
        .delete_push_config(TENANT, &anyone, &task, "3")
        .await
        .unwrap();
    assert_eq!(
        manager
            .list_push_configs(TENANT, &anyone, &task)
            .await
            .unwrap()
            .len(),
        MAX_PUSH_CONFIGS - 1
    );
    // Unknown task: TASK_NOT_FOUND.
    assert!(matches!(
        manager
            .list_push_configs(TENANT, &anyone, "no-such-task")
            .await,
        Err(A2aError::TaskNotFound { .. })
    ));
}

/// Every committed status and artifact update is written to the outbox
/// for each of the task's configs, in commit order, by the write that
/// commits it; a deleted config gets nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_events_enter_the_outbox_for_each_config() {
    use a2a_lifecycle::proto::{StreamResponse, stream_response::Payload};
    use prost::Message as _;
    let store = Arc::new(a2a_lifecycle::store::MemoryStore::new());
    let manager = TaskManager::new(
        store.clone() as Arc<dyn TaskStore>,
        demo_router(),
        RuntimeConfig::default(),
    );
    let anyone = Caller::ANONYMOUS;
    let task = new_task(&manager, &anyone).await;
    assert!(
        store.outbox().pending(0, 100).await.unwrap().is_empty(),
        "no config yet"
    );
    for id in ["one", "two"] {
        manager
            .set_push_config(TENANT, &anyone, config(&task, id))
            .await
            .unwrap();
    }
    // The diff: WORKING, the review artifact, COMPLETED.
    let mut diff = user_message("diff --git a/x b/x");
    diff.task_id = task.clone();
    let outcome = manager
        .send_message(
            TENANT,
            &anyone,
            MessageRequest::from(diff),
            HistoryLength::All,
            false,
        )
        .await
        .unwrap();
    let SendOutcome::Task(handle) = outcome else {
        panic!("a task")
    };
    let done = within("review", manager.wait(*handle)).await.unwrap();
    assert_eq!(support::state_of(&done), TaskState::Completed);

    let outbox = store.outbox().pending(0, 100).await.unwrap();
    let describe = |config: &str| -> Vec<String> {
        outbox
            .iter()
            .filter(|d| d.config_id == config)
            .map(|d| {
                assert_eq!(
                    (d.tenant.as_str(), d.task_id.as_str()),
                    (TENANT, task.as_str())
                );
                match StreamResponse::decode(&d.event[..]).unwrap().payload {
                    Some(Payload::StatusUpdate(u)) => TaskState::try_from(u.status.unwrap().state)
                        .unwrap()
                        .as_str_name()
                        .to_owned(),
                    Some(Payload::ArtifactUpdate(a)) => {
                        format!("artifact {}", a.artifact.unwrap().artifact_id)
                    }
                    other => panic!("not a status or artifact update: {other:?}"),
                }
            })
            .collect()
    };
    let expected = [
        "TASK_STATE_WORKING",
        "artifact review",
        "TASK_STATE_COMPLETED",
    ];
    assert_eq!(describe("one"), expected);
    assert_eq!(describe("two"), expected);
    assert!(outbox.windows(2).all(|w| w[0].seq < w[1].seq));
}
