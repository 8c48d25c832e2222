//! PostgreSQL for the tests: one fresh database per test binary's run
//! (`a2a_test_<unix seconds>_<id>`; those of runs an hour old or more are
//! dropped when a run starts), a fresh schema per test.
//!
//! `A2A_TEST_POSTGRES=URL` says PostgreSQL is required (CI sets it): a
//! server that does not answer fails every test. Without it the tests try
//! `postgres://postgres@127.0.0.1:5432/test` and, when nothing answers
//! there, say they are skipped and why.

use tokio::sync::OnceCell;
use tokio_postgres::NoTls;

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// This run's database, as a URL; `None` when PostgreSQL is not there and
/// not required.
static DATABASE: OnceCell<Option<String>> = OnceCell::const_new();

pub async fn database() -> Option<String> {
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
            // Earlier runs' databases, an hour old or more (a run cannot
            // drop its own when it ends: the harness has no hook there;
            // younger ones may be another test binary's, running now).
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("after 1970")
                .as_secs();
            let old = client
                .query(
                    "SELECT datname FROM pg_database WHERE datname LIKE 'a2a\\_test\\_%'",
                    &[],
                )
                .await
                .expect("list databases");
            for row in old {
                let name: String = row.get(0);
                let born = name
                    .split('_')
                    .nth(2)
                    .and_then(|s| s.parse::<u64>().ok())
                    .unwrap_or(0);
                if born + 3600 <= now {
                    let _ = client
                        .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                        .await;
                }
            }
            let name = format!("a2a_test_{now}_{}", uuid::Uuid::new_v4().simple());
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
pub fn url_of(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "127.0.0.1".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("postgres");
    let db = config.get_dbname().unwrap_or("test");
    format!("postgres://{user}@{host}:{port}/{db}")
}

/// The URL of a fresh, empty schema of this run's database; `None` when
/// PostgreSQL is not there and not required.
pub async fn fresh_schema() -> Option<String> {
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
    Some(format!("{url}?options=-csearch_path%3D{schema}"))
}

/// `serve` on the PostgreSQL `store` as one replica of several, with a
/// short lease and the bench agent (the restart and soak tests' replica);
/// killed when dropped. Its gRPC URL.
pub fn spawn_bench_replica(store: &str) -> (super::KillOnDrop, String) {
    let (process, url) = super::spawn_serve(&[
        "--store",
        store,
        "--lease",
        "2s",
        "--default-agent",
        "bench",
    ]);
    (super::KillOnDrop(process), url)
}
