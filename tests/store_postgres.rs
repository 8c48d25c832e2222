//! The store conformance suite ([`store_conformance`]) run against
//! [`PostgresStore`]: one fresh database per run (`a2a_test_<id>`; those
//! of earlier runs are dropped when a run starts), each test in a schema
//! of its own.
//!
//! `A2A_TEST_POSTGRES=URL` says PostgreSQL is required (CI sets it): a
//! server that does not answer fails every test. Without it the tests try
//! `postgres://postgres@127.0.0.1:5432/test` and, when nothing answers
//! there, say they are skipped and why.

mod store_conformance;
mod support;

use std::sync::Arc;

use a2a_lifecycle::store::{PostgresStore, TaskStore};
use tokio::sync::OnceCell;
use tokio_postgres::NoTls;

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// This run's database, as a URL; `None` when PostgreSQL is not there and
/// not required.
static DATABASE: OnceCell<Option<String>> = OnceCell::const_new();

async fn database() -> Option<String> {
    DATABASE
        .get_or_init(|| async {
            let required = std::env::var("A2A_TEST_POSTGRES").ok();
            let base = required.clone().unwrap_or_else(|| DEFAULT_URL.to_owned());
            let admin = tokio::time::timeout(
                std::time::Duration::from_secs(5),
                tokio_postgres::connect(&base, NoTls),
            )
            .await;
            let (client, connection) = match (admin, &required) {
                (Ok(Ok(pair)), _) => pair,
                (answer, Some(_)) => {
                    let why = match answer {
                        Ok(Err(e)) => e.to_string(),
                        _ => "no answer within 5 s".to_owned(),
                    };
                    panic!("A2A_TEST_POSTGRES={base} is required and does not answer: {why}")
                }
                (_, None) => {
                    // Written to stderr itself, past the test harness's
                    // capture: the skip shows in `cargo test`'s output.
                    use std::io::Write as _;
                    let _ = writeln!(
                        std::io::stderr(),
                        "PostgreSQL store tests skipped: nothing answers at {base} \
                         (set A2A_TEST_POSTGRES=URL to require it)"
                    );
                    return None;
                }
            };
            tokio::spawn(connection);
            // Earlier runs' databases (a run cannot drop its own when it
            // ends: the harness has no hook there).
            let old = client
                .query(
                    "SELECT datname FROM pg_database WHERE datname LIKE 'a2a\\_test\\_%'",
                    &[],
                )
                .await
                .expect("list databases");
            for row in old {
                let name: String = row.get(0);
                let _ = client
                    .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                    .await;
            }
            let name = format!("a2a_test_{}", uuid::Uuid::new_v4().simple());
            client
                .batch_execute(&format!("CREATE DATABASE \"{name}\""))
                .await
                .expect("create the run's database");
            let mut config: tokio_postgres::Config = base.parse().expect("a PostgreSQL URL");
            config.dbname(&name);
            Some(url_of(&config))
        })
        .await
        .clone()
}

/// The URL of `config` (host, port, user, database).
fn url_of(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "127.0.0.1".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("postgres");
    let db = config.get_dbname().unwrap_or("test");
    format!("postgres://{user}@{host}:{port}/{db}")
}

/// A store on a fresh schema of this run's database.
async fn fresh_store() -> Option<Arc<dyn TaskStore>> {
    let url = database().await?;
    let (client, connection) = tokio_postgres::connect(&url, NoTls)
        .await
        .expect("connect to the run's database");
    tokio::spawn(connection);
    let schema = format!("s_{}", uuid::Uuid::new_v4().simple());
    client
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .expect("create a schema");
    let store = PostgresStore::open(&format!("{url}?options=-csearch_path%3D{schema}"))
        .await
        .expect("open the store");
    Some(Arc::new(store) as Arc<dyn TaskStore>)
}

store_conformance::store_conformance_tests!(fresh_store);

/// `serve --store postgres://...`: tasks are kept across a SIGKILL and a
/// restart, and a second server on the same database is refused (one
/// server per database until replicas share one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_keeps_tasks_in_postgres_and_refuses_a_second_server() {
    use a2a_lifecycle::proto::a2a_service_client::A2aServiceClient;

    let Some(url) = database().await else {
        return;
    };
    let (client, connection) = tokio_postgres::connect(&url, NoTls).await.unwrap();
    tokio::spawn(connection);
    let schema = format!("s_{}", uuid::Uuid::new_v4().simple());
    client
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .unwrap();
    let store = format!("{url}?options=-csearch_path%3D{schema}");

    let (mut first, server) = support::spawn_serve(&["--store", &store]);
    let mut grpc = support::within("connect", A2aServiceClient::connect(server))
        .await
        .unwrap();
    let task = support::send_text(&mut grpc, "", "run the tests").await;
    assert_eq!(
        support::state_of(&task),
        a2a_lifecycle::proto::TaskState::Completed
    );

    // A second server on the same database stops with a clear message.
    let second = tokio::process::Command::new(support::BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--store", &store])
        .kill_on_drop(true)
        .output();
    let second = support::within("the second server to stop", second)
        .await
        .unwrap();
    assert!(!second.status.success());
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(stderr.contains("in use by another server"), "{stderr}");

    first.kill().unwrap(); // SIGKILL
    first.wait().unwrap();
    let (mut again, server) = support::spawn_serve(&["--store", &store]);
    let mut grpc = support::within("connect", A2aServiceClient::connect(server))
        .await
        .unwrap();
    let kept = support::get_task(&mut grpc, "", &task.id).await.unwrap();
    assert_eq!(kept, task, "the task survived the kill");
    again.kill().unwrap();
    again.wait().unwrap();
}
