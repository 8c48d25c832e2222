//! The task store `serve --store` names: opened from its spec
//! (`memory`, `sqlite:PATH`, `postgres://...`), shown without its password.

use std::sync::Arc;
use std::time::Duration;

use a2a_lifecycle::store::{MemoryStore, SqliteStore, TaskStore};

use super::AnyError;

/// The store `spec` names (with a PostgreSQL store, holding a replica
/// lease of `lease`); a SQLite file's folder is created.
pub async fn open_store(spec: &str, lease: Duration) -> Result<Arc<dyn TaskStore>, AnyError> {
    if spec == "memory" {
        return Ok(Arc::new(MemoryStore::new()));
    }
    if let Some(path) = spec.strip_prefix("sqlite:") {
        let path = path.strip_prefix("//").unwrap_or(path);
        if path.is_empty() {
            return Err("--store sqlite:PATH needs a file path".into());
        }
        let store = SqliteStore::open(path).await?;
        tracing::info!(path, "task store: sqlite");
        return Ok(Arc::new(store));
    }
    if spec.starts_with("postgres://") || spec.starts_with("postgresql://") {
        let store = a2a_lifecycle::store::PostgresStore::open_with_lease(spec, lease)
            .await
            .map_err(|e| postgres_error(spec, &e))?;
        tracing::info!(replica = %store.replica_id(), lease = %humantime::format_duration(lease), "task store: postgres");
        return Ok(Arc::new(store));
    }
    Err(format!(
        "unknown --store {:?}; supported: memory, sqlite:PATH, postgres://USER@HOST:PORT/DB",
        without_password(spec)
    )
    .into())
}

/// Why the PostgreSQL store at `spec` did not open: which server and
/// database, the cause, and what to try.
fn postgres_error(spec: &str, error: &a2a_lifecycle::store::StoreError) -> String {
    let config = spec.parse::<tokio_postgres::Config>().ok();
    let host = config
        .as_ref()
        .and_then(|c| c.get_hosts().first().cloned())
        .map_or("localhost".to_owned(), |h| match h {
            tokio_postgres::config::Host::Tcp(name) => name,
            #[cfg(unix)]
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        });
    let port = config
        .as_ref()
        .and_then(|c| c.get_ports().first().copied())
        .unwrap_or(5432);
    let user = config
        .as_ref()
        .and_then(|c| c.get_user().map(str::to_owned))
        .unwrap_or_default();
    let database = config
        .as_ref()
        .and_then(|c| c.get_dbname().map(str::to_owned))
        .unwrap_or_else(|| user.clone());
    let said = error.to_string();
    let lower = said.to_ascii_lowercase();
    let hint = if lower.contains("refused") {
        format!("; is PostgreSQL running and listening on {host}:{port}?")
    } else if lower.contains(&format!("database \"{}\"", database.to_ascii_lowercase())) {
        format!(
            "; create it first (createdb -h {host} -p {port} -U {user} {database}) or name another in --store"
        )
    } else if lower.contains("password") || lower.contains("authentication") {
        "; check the user and password in --store (or the server's pg_hba.conf)".to_owned()
    } else {
        String::new()
    };
    format!(
        "cannot open the PostgreSQL store at {host}:{port}, database {database:?} (user \
         {user:?}): {said}{hint}"
    )
}

/// A store URL as it may be shown: a password in its user information
/// (`USER:PASSWORD@`) or its query (`password=...`) replaced by `***`.
fn without_password(spec: &str) -> String {
    let mut shown = spec.to_owned();
    if let Some(scheme_end) = shown.find("://") {
        let start = scheme_end + 3;
        let authority_end = shown[start..]
            .find(['/', '?'])
            .map_or(shown.len(), |i| start + i);
        if let Some(at) = shown[start..authority_end].rfind('@')
            && let Some(colon) = shown[start..start + at].find(':')
        {
            shown.replace_range(start + colon + 1..start + at, "***");
        }
    }
    if let Some(query) = shown.find('?') {
        let (head, tail) = shown.split_at(query + 1);
        let tail: Vec<String> = tail
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((key, _)) if key.eq_ignore_ascii_case("password") => format!("{key}=***"),
                _ => pair.to_owned(),
            })
            .collect();
        shown = format!("{head}{}", tail.join("&"));
    }
    shown
}
