//! The store conformance suite ([`store_conformance`]) run against
//! [`PostgresStore`], each test in a schema of its own of this run's
//! database (see [`support::postgres`] for when the tests are skipped).

mod store_conformance;
mod support;

use std::sync::Arc;

use a2a_lifecycle::store::{PostgresStore, TaskStore};

/// A store on a fresh schema of this run's database.
async fn fresh_store() -> Option<Arc<dyn TaskStore>> {
    let url = support::postgres::fresh_schema().await?;
    let store = PostgresStore::open(&url).await.expect("open the store");
    Some(Arc::new(store) as Arc<dyn TaskStore>)
}

store_conformance::store_conformance_tests!(fresh_store);

/// `serve --store postgres://...`: tasks are kept across a SIGKILL and a
/// restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_keeps_tasks_in_postgres_across_a_sigkill() {
    use a2a_lifecycle::proto::a2a_service_client::A2aServiceClient;

    let Some(store) = support::postgres::fresh_schema().await else {
        return;
    };
    let (first, server) = support::spawn_serve(&["--store", &store]);
    let mut first = support::KillOnDrop(first);
    let mut grpc = support::within("connect", A2aServiceClient::connect(server))
        .await
        .unwrap();
    let task = support::send_text(&mut grpc, "", "run the tests").await;
    assert_eq!(
        support::state_of(&task),
        a2a_lifecycle::proto::TaskState::Completed
    );
    first.0.kill().unwrap(); // SIGKILL
    first.0.wait().unwrap();
    let (again, server) = support::spawn_serve(&["--store", &store]);
    let _again = support::KillOnDrop(again);
    let mut grpc = support::within("connect", A2aServiceClient::connect(server))
        .await
        .unwrap();
    let kept = support::get_task(&mut grpc, "", &task.id).await.unwrap();
    assert_eq!(kept, task, "the task survived the kill");
}
