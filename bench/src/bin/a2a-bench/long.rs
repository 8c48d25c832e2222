//! Long-lived tasks: what one update of a task costs the server as the task
//! grows (issue "long-lived tasks at constant cost per update").
//!
//! For each store and each task length K, the bench agent's
//! `fanout:K:0:INTERVAL_US` runs K updates (alternately a WORKING status
//! whose message the next one moves into history, and a chunk appended to
//! one artifact), INTERVAL_US apart so that each is a commit of its own.
//! The tasks of one length run one after another (each commit carries one
//! update of one task, nothing to batch with), and the figures are per
//! write of the task: its create, its first WORKING, K updates and its
//! COMPLETED, so K + 3 writes. Measured on the server:
//! - bytes written: for SQLite the server process's `write_bytes`
//!   (`/proc/PID/io`: the database, its WAL and checkpoints); for
//!   PostgreSQL the WAL the run made (`pg_current_wal_lsn`); none for the
//!   memory store;
//! - CPU: the server process's user and system time.
//!
//! Flat means the largest K's figure is within [`FLAT`] of the smallest's.

use std::path::Path;
use std::time::{Duration, Instant};

use a2a_lifecycle::proto::{StreamResponse, stream_response::Payload};

use super::{AnyError, Server, connect_one, cpu_seconds, send_request, spawn_server};

/// The bound: the largest task's cost per write at most this many
/// times the smallest's.
pub const FLAT: f64 = 1.5;
/// Updates of all the tasks of one length together, at least: short tasks
/// run many times, so that their figures are not one task's noise.
const MIN_UPDATES_PER_LENGTH: u64 = 2_000;

/// The stores the rows compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Store {
    Memory,
    Sqlite,
    Postgres,
}

impl Store {
    pub fn name(self) -> &'static str {
        match self {
            Store::Memory => "memory",
            Store::Sqlite => "SQLite",
            Store::Postgres => "PostgreSQL",
        }
    }
}

/// One task length's figures.
#[derive(Clone, Debug)]
pub struct Length {
    pub updates: u32,
    /// Writes measured: `K + 3` per task, for as many tasks as
    /// [`MIN_UPDATES_PER_LENGTH`] asks.
    pub writes: u64,
    /// Bytes written per write; `None` for the memory store.
    pub bytes_per_write: Option<f64>,
    pub cpu_us_per_write: f64,
    pub elapsed: Duration,
}

/// How bytes written are read for a store.
enum Bytes {
    None,
    /// `/proc/PID/io` `write_bytes` of the server.
    Process(u32),
    /// The WAL position of this PostgreSQL server.
    Wal(tokio_postgres::Client),
}

impl Bytes {
    async fn now(&self) -> Result<Option<u64>, AnyError> {
        Ok(match self {
            Bytes::None => None,
            Bytes::Process(pid) => {
                let io = std::fs::read_to_string(format!("/proc/{pid}/io"))?;
                let line = io
                    .lines()
                    .find_map(|l| l.strip_prefix("write_bytes:"))
                    .ok_or("no write_bytes in /proc/PID/io")?;
                Some(line.trim().parse()?)
            }
            Bytes::Wal(db) => {
                let row = db
                    .query_one(
                        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::int8",
                        &[],
                    )
                    .await?;
                Some(row.get::<_, i64>(0) as u64)
            }
        })
    }
}

/// Runs `tasks` tasks of `updates` updates each, one after another, on
/// `server`; each is read to its end over SendStreamingMessage, and must
/// end COMPLETED having streamed every update.
async fn run_tasks(
    server: &Server,
    updates: u32,
    tasks: u64,
    interval: Duration,
) -> Result<(), AnyError> {
    let mut client = connect_one(&server.url).await?;
    let text = format!("fanout:{updates}:0:{}", interval.as_micros());
    for _ in 0..tasks {
        let mut stream = client
            .send_streaming_message(send_request("", &text, false))
            .await?
            .into_inner();
        let mut seen = 0u32;
        let mut completed = false;
        while let Some(event) = stream.message().await? {
            match event {
                StreamResponse {
                    payload: Some(Payload::StatusUpdate(s)),
                } => {
                    let state = s.status.as_ref().map_or(0, |s| s.state);
                    if state == a2a_lifecycle::proto::TaskState::Completed as i32 {
                        completed = true;
                    } else if s.status.as_ref().and_then(|s| s.message.as_ref()).is_some() {
                        seen += 1;
                    }
                }
                StreamResponse {
                    payload: Some(Payload::ArtifactUpdate(_)),
                } => seen += 1,
                _ => {}
            }
        }
        if !completed || seen != updates {
            return Err(format!(
                "a task of {updates} updates streamed {seen} and ended {}",
                if completed { "COMPLETED" } else { "otherwise" }
            )
            .into());
        }
    }
    Ok(())
}

/// The figures of each length in `lengths` on a fresh server of `store`.
pub async fn measure(
    main_bin: &Path,
    store: Store,
    postgres: &str,
    lengths: &[u32],
    interval: Duration,
    server_cpus: Option<&str>,
) -> Result<Vec<Length>, AnyError> {
    let dir = std::env::temp_dir().join(format!("a2a-bench-long-{}", uuid::Uuid::new_v4()));
    let mut admin = None;
    let store_arg = match store {
        Store::Memory => "memory".to_string(),
        Store::Sqlite => {
            std::fs::create_dir_all(&dir)?;
            format!("sqlite:{}", dir.join("tasks.db").display())
        }
        Store::Postgres => {
            let (db, connection) = tokio_postgres::connect(postgres, tokio_postgres::NoTls)
                .await
                .map_err(|e| format!("PostgreSQL at {postgres}: {e}"))?;
            tokio::spawn(connection);
            let schema = format!("a2a_bench_{}", uuid::Uuid::new_v4().simple());
            db.batch_execute(&format!("CREATE SCHEMA {schema}")).await?;
            let separator = if postgres.contains('?') { '&' } else { '?' };
            admin = Some((db, schema.clone()));
            format!("{postgres}{separator}options=-csearch_path%3D{schema}")
        }
    };
    let args = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--store",
        &store_arg,
        "--default-agent",
        "bench",
    ];
    let server = spawn_server(main_bin, &args, server_cpus)?;
    let bytes = match (&store, &admin) {
        (Store::Memory, _) => Bytes::None,
        (Store::Sqlite, _) => Bytes::Process(server.pid()),
        (Store::Postgres, Some(_)) => {
            let (db, connection) = tokio_postgres::connect(postgres, tokio_postgres::NoTls).await?;
            tokio::spawn(connection);
            Bytes::Wal(db)
        }
        (Store::Postgres, None) => unreachable!("connected above"),
    };
    // Warm up: the first task pays for connections, caches and the
    // tables' first pages.
    run_tasks(&server, 10, 5, interval).await?;
    let mut out = Vec::new();
    for &updates in lengths {
        let tasks = MIN_UPDATES_PER_LENGTH.div_ceil(u64::from(updates.max(1)));
        let (b0, c0, t0) = (
            bytes.now().await?,
            cpu_seconds(server.pid()).ok_or("no CPU figure")?,
            Instant::now(),
        );
        run_tasks(&server, updates, tasks, interval).await?;
        let (b1, c1, elapsed) = (
            bytes.now().await?,
            cpu_seconds(server.pid()).ok_or("no CPU figure")?,
            t0.elapsed(),
        );
        let writes = tasks * (u64::from(updates) + 3);
        let length = Length {
            updates,
            writes,
            bytes_per_write: b0
                .zip(b1)
                .map(|(b0, b1)| b1.saturating_sub(b0) as f64 / writes as f64),
            cpu_us_per_write: (c1 - c0) * 1e6 / writes as f64,
            elapsed,
        };
        eprintln!(
            "long tasks, {}: K={updates} x{tasks}: {} bytes/write, {:.1} µs CPU/write ({:.1?})",
            store.name(),
            length
                .bytes_per_write
                .map_or("-".to_string(), |b| format!("{b:.0}")),
            length.cpu_us_per_write,
            length.elapsed
        );
        out.push(length);
    }
    drop(server);
    if let Some((db, schema)) = admin {
        db.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .await?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(out)
}

/// The largest length's figure over the smallest's.
pub fn growth(lengths: &[Length], figure: impl Fn(&Length) -> Option<f64>) -> Option<f64> {
    let first = figure(lengths.first()?)?;
    let last = figure(lengths.last()?)?;
    Some(last / first)
}
