//! TLS to PostgreSQL (issue 28): the store's own connections, the pool's
//! and the listening one, are encrypted or not as the URL's `sslmode`
//! says, and the verifying modes refuse a server whose certificate does
//! not check out. Whether a connection is encrypted is asked of the server
//! itself (`pg_stat_ssl`), by the store's `application_name`, from a
//! connection of the test's own.
//!
//! The server must have TLS on (`ssl = on`; Debian's PostgreSQL has it,
//! with a self-signed certificate). The `verify-*` tests need a server
//! certificate for 127.0.0.1 signed by a CA they know:
//! `.ci/postgres-tls` makes one, points PostgreSQL at it and prints the
//! CA's path for `A2A_TEST_POSTGRES_CA` (`.ci/run` does this). Without
//! PostgreSQL the tests are skipped as the other PostgreSQL tests are
//! ([`support::postgres`]); where PostgreSQL is required
//! (`A2A_TEST_POSTGRES`), a server without TLS or a missing CA fails them.

use crate::support;

use std::time::Duration;

use a2a_lifecycle::store::{PostgresStore, StoreError};
use support::within;
use tokio_postgres::NoTls;

/// Whether PostgreSQL is required here (CI): what would be a skip is a
/// failure then.
fn required() -> bool {
    std::env::var_os("A2A_TEST_POSTGRES").is_some()
}

/// Says on stderr, past the harness's capture, that a test is skipped.
fn skipped(why: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "PostgreSQL TLS test skipped: {why}");
}

/// A connection to this run's database for looking at the server's
/// sessions (plaintext: it is the test's, not the store's).
async fn admin() -> Option<tokio_postgres::Client> {
    let url = support::postgres::database().await?;
    let (client, connection) = within("connect to look", tokio_postgres::connect(&url, NoTls))
        .await
        .expect("connect to the run's database");
    tokio::spawn(connection);
    Some(client)
}

/// An admin connection, when PostgreSQL is there with TLS on; a server
/// without TLS is skipped, or fails where PostgreSQL is required.
async fn admin_with_tls_on() -> Option<tokio_postgres::Client> {
    let client = admin().await?;
    let ssl: String = client
        .query_one("SHOW ssl", &[])
        .await
        .expect("SHOW ssl")
        .get(0);
    if ssl != "on" {
        assert!(
            !required(),
            "PostgreSQL has ssl = {ssl}; these tests need TLS on: run .ci/postgres-tls"
        );
        skipped("the server has TLS off (ssl = off)");
        return None;
    }
    Some(client)
}

/// `A2A_TEST_POSTGRES_CA`: the CA that signed the server's certificate
/// for 127.0.0.1. Unset: a failure where PostgreSQL is required, a skip
/// otherwise.
fn server_ca() -> Option<String> {
    match std::env::var("A2A_TEST_POSTGRES_CA") {
        Ok(path) if !path.is_empty() => Some(path),
        _ => {
            assert!(
                !required(),
                "A2A_TEST_POSTGRES is set but A2A_TEST_POSTGRES_CA is not: run \
                 `export A2A_TEST_POSTGRES_CA=\"$(bash .ci/postgres-tls)\"` (as root) to give \
                 PostgreSQL a certificate signed by a test CA"
            );
            skipped(
                "A2A_TEST_POSTGRES_CA is unset (`bash .ci/postgres-tls` prints the CA to set it to)",
            );
            None
        }
    }
}

/// A fresh schema's URL with an `application_name` of its own (returned
/// too) and `extra` appended to its query.
async fn store_url(extra: &str) -> Option<(String, String)> {
    let url = support::postgres::fresh_schema().await?;
    let name = format!("a2a_tls_{}", uuid::Uuid::new_v4().simple());
    // fresh_schema's URL has a query already (its search_path).
    assert!(url.contains('?'), "{url}");
    Some((format!("{url}&application_name={name}{extra}"), name))
}

/// One of the server's sessions, as pg_stat_ssl sees it.
#[derive(Debug)]
struct Session {
    ssl: bool,
    version: Option<String>,
    query: String,
}

/// The server's sessions named `name`, once the store's listening
/// connection is among them with at least one other (the pool's).
async fn store_sessions(admin: &tokio_postgres::Client, name: &str) -> Vec<Session> {
    within("the store's connections appear", async {
        loop {
            let sessions: Vec<Session> = admin
                .query(
                    "SELECT s.ssl, s.version, a.query FROM pg_stat_activity a \
                     JOIN pg_stat_ssl s USING (pid) WHERE a.application_name = $1",
                    &[&name],
                )
                .await
                .expect("read pg_stat_ssl")
                .into_iter()
                .map(|r| Session {
                    ssl: r.get(0),
                    version: r.get(1),
                    query: r.get(2),
                })
                .collect();
            let listening = sessions.iter().any(|s| s.query.starts_with("LISTEN"));
            if listening && sessions.len() >= 2 {
                return sessions;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
}

/// Opens the store at `url`, expecting it to start.
async fn open(url: &str) -> PostgresStore {
    within("open the store", PostgresStore::open(url))
        .await
        .expect("open the store")
}

/// Opens the store at `url`, expecting it to be refused: the error's text.
async fn refused(url: &str) -> String {
    match within("open the store", PostgresStore::open(url)).await {
        Ok(_) => panic!("the store opened: the server was accepted"),
        Err(e) => e.to_string(),
    }
}

/// Asserts every session is encrypted, with TLS 1.2 or 1.3.
fn assert_encrypted(sessions: &[Session]) {
    for s in sessions {
        assert!(
            s.ssl,
            "a plaintext connection of the store: {s:?} (all: {sessions:?})"
        );
        let version = s.version.as_deref().unwrap_or_default();
        assert!(
            version == "TLSv1.3" || version == "TLSv1.2",
            "TLS version {version:?}: {s:?}"
        );
    }
}

/// A PEM file with a CA that signed nothing the server has; removed when
/// dropped.
struct StrangerCa(std::path::PathBuf);

impl StrangerCa {
    fn new() -> StrangerCa {
        let path = std::env::temp_dir().join(format!(
            "a2a-test-stranger-ca-{}.pem",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::write(&path, support::certs::Ca::new().pem()).expect("write the CA");
        StrangerCa(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().expect("a UTF-8 temporary path")
    }
}

impl Drop for StrangerCa {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `url` naming a host its certificate does not (`a2a-wrong-name.invalid`)
/// while still connecting to the same server (`hostaddr`).
async fn with_wrong_host_name(url: &str) -> String {
    // Host and port as the run's database has them (`url` itself has
    // settings tokio-postgres's parser does not know).
    let database = support::postgres::database()
        .await
        .expect("PostgreSQL is there");
    let config: tokio_postgres::Config = database.parse().expect("a PostgreSQL URL");
    let Some(tokio_postgres::config::Host::Tcp(host)) = config.get_hosts().first() else {
        panic!("the test database is not on a TCP host: {database}");
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let address = tokio::net::lookup_host((host.as_str(), port))
        .await
        .expect("resolve the test database's host")
        .next()
        .expect("an address for the test database's host");
    let renamed = url.replacen(
        &format!("@{host}:{port}/"),
        &format!("@a2a-wrong-name.invalid:{port}/"),
        1,
    );
    assert_ne!(
        renamed, url,
        "the host is where the URL was expected to have it"
    );
    format!("{renamed}&hostaddr={}", address.ip())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_sslmode_the_pool_and_the_listening_connection_are_encrypted() {
    let Some(admin) = admin_with_tls_on().await else {
        return;
    };
    let (url, name) = store_url("").await.expect("PostgreSQL is there");
    let store = open(&url).await;
    let sessions = store_sessions(&admin, &name).await;
    assert_encrypted(&sessions);
    drop(store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_require_starts_and_is_encrypted() {
    let Some(admin) = admin_with_tls_on().await else {
        return;
    };
    let (url, name) = store_url("&sslmode=require")
        .await
        .expect("PostgreSQL is there");
    let store = open(&url).await;
    assert_encrypted(&store_sessions(&admin, &name).await);
    drop(store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_disable_is_plaintext() {
    let Some(admin) = admin_with_tls_on().await else {
        return;
    };
    let (url, name) = store_url("&sslmode=disable")
        .await
        .expect("PostgreSQL is there");
    let store = open(&url).await;
    let sessions = store_sessions(&admin, &name).await;
    assert!(
        sessions.iter().all(|s| !s.ssl),
        "an encrypted connection with sslmode=disable: {sessions:?}"
    );
    drop(store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_with_the_servers_ca_starts_and_is_encrypted() {
    let Some(ca) = server_ca() else {
        return;
    };
    let Some(admin) = admin_with_tls_on().await else {
        return;
    };
    let (url, name) = store_url(&format!("&sslmode=verify-full&sslrootcert={ca}"))
        .await
        .expect("PostgreSQL is there");
    let store = open(&url).await;
    assert_encrypted(&store_sessions(&admin, &name).await);
    drop(store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_refuses_a_certificate_from_another_ca_without_showing_the_password() {
    let Some(_admin) = admin_with_tls_on().await else {
        return;
    };
    let stranger = StrangerCa::new();
    let (url, _) = store_url(&format!(
        "&sslmode=verify-full&sslrootcert={}",
        stranger.path()
    ))
    .await
    .expect("PostgreSQL is there");
    // Trust auth ignores the password; it is here to be kept out of the
    // error.
    let url = url.replacen('@', ":a2a-s3cret-pw@", 1);
    let error = refused(&url).await;
    assert!(
        error.contains("certificate failed verification")
            && error.contains("sslmode=verify-full")
            && error.contains("not signed by a CA in sslrootcert"),
        "{error}"
    );
    assert!(
        !error.contains("a2a-s3cret-pw"),
        "the password shown: {error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_with_a_root_file_checks_the_chain_as_libpq_does() {
    let Some(_admin) = admin_with_tls_on().await else {
        return;
    };
    let stranger = StrangerCa::new();
    let (url, _) = store_url(&format!("&sslmode=require&sslrootcert={}", stranger.path()))
        .await
        .expect("PostgreSQL is there");
    let error = refused(&url).await;
    assert!(
        error.contains("certificate failed verification") && error.contains("sslmode=require"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_refuses_a_certificate_for_another_name() {
    let Some(ca) = server_ca() else {
        return;
    };
    let Some(_admin) = admin_with_tls_on().await else {
        return;
    };
    let (url, _) = store_url(&format!("&sslmode=verify-full&sslrootcert={ca}"))
        .await
        .expect("PostgreSQL is there");
    let error = refused(&with_wrong_host_name(&url).await).await;
    assert!(
        error.contains("certificate failed verification")
            && error.contains("not valid for name \"a2a-wrong-name.invalid\""),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_ca_checks_the_chain_but_not_the_name() {
    let Some(ca) = server_ca() else {
        return;
    };
    let Some(admin) = admin_with_tls_on().await else {
        return;
    };
    let (url, name) = store_url(&format!("&sslmode=verify-ca&sslrootcert={ca}"))
        .await
        .expect("PostgreSQL is there");
    let store = open(&with_wrong_host_name(&url).await).await;
    assert_encrypted(&store_sessions(&admin, &name).await);
    drop(store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_sslmode_is_a_clear_error() {
    let Some((url, _)) = store_url("&sslmode=verify_full").await else {
        return;
    };
    let text = configuration_error(&url).await;
    assert!(
        text.contains("sslmode=\"verify_full\"") && text.contains("verify-full"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_without_a_root_file_or_with_an_unreadable_one_is_a_clear_error() {
    let Some((url, _)) = store_url("&sslmode=verify-full").await else {
        return;
    };
    let text = configuration_error(&url).await;
    assert!(text.contains("needs sslrootcert"), "{text}");
    let missing = format!("{url}&sslrootcert=/nonexistent/a2a-ca.pem");
    let text = configuration_error(&missing).await;
    assert!(
        text.contains("/nonexistent/a2a-ca.pem") && text.contains("cannot be read"),
        "{text}"
    );
}

/// The configuration error opening a store at `url` gives; opening it, or
/// failing otherwise, fails the test.
async fn configuration_error(url: &str) -> String {
    match within("open the store", PostgresStore::open(url)).await {
        Ok(_) => panic!("{url} accepted"),
        Err(StoreError::Internal(text)) => text,
        Err(other) => panic!("not a configuration error: {other}"),
    }
}
