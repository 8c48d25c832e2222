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
//! The PostgreSQL follower row runs the same tasks on one replica and
//! measures a second replica of the same database following each task
//! (a SubscribeToTask stream on it from the task's start, so it catches up
//! on every write the first makes): the bytes PostgreSQL sends it (it
//! connects through a counting proxy of the bench's) and its CPU, per
//! write of the task. Each task waits [`FOLLOWER_JOINS_WITHIN`] before its
//! updates for the stream to join.
//!
//! Flat means the largest K's figure is within [`FLAT`] of the smallest's.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use a2a_lifecycle::proto::{StreamResponse, stream_response::Payload};

use super::{AnyError, Server, connect_one, cpu_seconds, send_request, spawn_server};

/// The bound: the largest task's cost per write at most this many
/// times the smallest's.
pub const FLAT: f64 = 1.5;
/// Updates of all the tasks of one length together, at least: short tasks
/// run many times, so that their figures are not one task's noise.
const MIN_UPDATES_PER_LENGTH: u64 = 2_000;

/// How long a task of the follower row waits before its updates, for the
/// follower's stream to join it.
const FOLLOWER_JOINS_WITHIN: Duration = Duration::from_millis(100);

/// The stores the rows compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Store {
    Memory,
    Sqlite,
    Postgres,
    /// A second replica of a PostgreSQL store, following the tasks the
    /// first runs.
    PostgresFollower,
}

impl Store {
    pub fn name(self) -> &'static str {
        match self {
            Store::Memory => "memory",
            Store::Sqlite => "SQLite",
            Store::Postgres => "PostgreSQL",
            Store::PostgresFollower => "PostgreSQL follower",
        }
    }

    /// The name in the JSON figures.
    pub fn key(self) -> &'static str {
        match self {
            Store::Memory => "memory",
            Store::Sqlite => "sqlite",
            Store::Postgres => "postgresql",
            Store::PostgresFollower => "postgresql_follower",
        }
    }

    /// The unit of its bytes figure.
    pub fn bytes_unit(self) -> &'static str {
        match self {
            Store::PostgresFollower => "bytes read/write",
            _ => "bytes/write",
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
    /// Bytes written per write (read, for the follower); `None` for the
    /// memory store.
    pub bytes_per_write: Option<f64>,
    pub cpu_us_per_write: f64,
    pub elapsed: Duration,
}

/// How bytes written are read for a store.
enum Bytes {
    None,
    /// `/proc/PID/io` `write_bytes` of the server.
    Process(u32),
    /// What a [`counting_proxy`] passed from PostgreSQL to the server.
    Proxied(Arc<AtomicU64>),
    /// The WAL position of this PostgreSQL server.
    Wal(tokio_postgres::Client),
}

impl Bytes {
    async fn now(&self) -> Result<Option<u64>, AnyError> {
        Ok(match self {
            Bytes::None => None,
            Bytes::Process(pid) => Some(proc_io(*pid, "write_bytes")?),
            Bytes::Proxied(count) => Some(count.load(Ordering::Relaxed)),
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

/// A proxy to the PostgreSQL server of `url`, counting the bytes it sends
/// back: the URL to connect through it, and the count.
async fn counting_proxy(url: &str) -> Result<(String, Arc<AtomicU64>), AnyError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // postgres://USER@HOST:PORT/DB?...: the authority after '@', to '/'.
    let start = url.find('@').ok_or("a PostgreSQL URL with a user@")? + 1;
    let end = start
        + url[start..]
            .find('/')
            .ok_or("a PostgreSQL URL with a /DB")?;
    let upstream = url[start..end].to_string();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let proxied = format!("{}{}{}", &url[..start], listener.local_addr()?, &url[end..]);
    let count = Arc::new(AtomicU64::new(0));
    let counted = count.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let (upstream, count) = (upstream.clone(), counted.clone());
            tokio::spawn(async move {
                let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                    return;
                };
                // Each write passed on at once, as without the proxy.
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                let up = tokio::io::copy(&mut client_read, &mut server_write);
                let down = async {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = server_read.read(&mut buf).await?;
                        if n == 0 {
                            return Ok::<_, std::io::Error>(());
                        }
                        count.fetch_add(n as u64, Ordering::Relaxed);
                        client_write.write_all(&buf[..n]).await?;
                    }
                };
                let _ = tokio::try_join!(up, down);
            });
        }
    });
    Ok((proxied, count))
}

/// A field of `/proc/PID/io`.
fn proc_io(pid: u32, field: &str) -> Result<u64, AnyError> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io"))?;
    let value = io
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .ok_or_else(|| format!("no {field} in /proc/PID/io"))?;
    Ok(value.trim().parse()?)
}

/// Reads a task's stream to its end: it must end COMPLETED having streamed
/// every one of its `updates`. The task's id is sent on `id` when the
/// first event names it.
async fn read_to_end(
    mut stream: tonic::Streaming<StreamResponse>,
    updates: u32,
    mut id: Option<tokio::sync::oneshot::Sender<String>>,
) -> Result<(), AnyError> {
    let mut seen = 0u32;
    let mut completed = false;
    while let Some(event) = stream.message().await? {
        match event {
            StreamResponse {
                payload: Some(Payload::Task(task)),
            } => {
                if let Some(id) = id.take() {
                    let _ = id.send(task.id);
                }
            }
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
    Ok(())
}

/// Runs `tasks` tasks of `updates` updates each, one after another, on
/// `server`; each is read to its end over SendStreamingMessage, and must
/// end COMPLETED having streamed every update. With a `follower`, each
/// task is also read to its end there, over SubscribeToTask from its
/// start.
async fn run_tasks(
    server: &Server,
    follower: Option<&Server>,
    updates: u32,
    tasks: u64,
    interval: Duration,
) -> Result<(), AnyError> {
    let mut client = connect_one(&server.url).await?;
    let mut follower = match follower {
        Some(f) => Some(connect_one(&f.url).await?),
        None => None,
    };
    let wait = if follower.is_some() {
        FOLLOWER_JOINS_WITHIN
    } else {
        Duration::ZERO
    };
    let text = format!(
        "fanout:{updates}:{}:{}",
        wait.as_millis(),
        interval.as_micros()
    );
    for _ in 0..tasks {
        let stream = client
            .send_streaming_message(send_request("", &text, false))
            .await?
            .into_inner();
        let (id_tx, id_rx) = tokio::sync::oneshot::channel();
        let run = tokio::spawn(read_to_end(stream, updates, Some(id_tx)));
        if let Some(follower) = &mut follower {
            let id = id_rx.await.map_err(|_| "the task's stream named no task")?;
            let followed = follower
                .subscribe_to_task(a2a_lifecycle::proto::SubscribeToTaskRequest {
                    tenant: String::new(),
                    id,
                })
                .await?
                .into_inner();
            read_to_end(followed, updates, None)
                .await
                .map_err(|e| format!("on the follower: {e}"))?;
        }
        run.await??;
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
        Store::Postgres | Store::PostgresFollower => {
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
    let (follower, proxied) = match store {
        Store::PostgresFollower => {
            let (url, count) = counting_proxy(&store_arg).await?;
            let mut args = args;
            args[4] = &url;
            (
                Some(spawn_server(main_bin, &args, server_cpus)?),
                Some(count),
            )
        }
        _ => (None, None),
    };
    let measured = follower.as_ref().unwrap_or(&server);
    let bytes = match (&store, &admin) {
        (Store::Memory, _) => Bytes::None,
        (Store::Sqlite, _) => Bytes::Process(server.pid()),
        (Store::PostgresFollower, _) => Bytes::Proxied(proxied.ok_or("no proxy")?),
        (Store::Postgres, Some(_)) => {
            let (db, connection) = tokio_postgres::connect(postgres, tokio_postgres::NoTls).await?;
            tokio::spawn(connection);
            Bytes::Wal(db)
        }
        (Store::Postgres, None) => unreachable!("connected above"),
    };
    // Warm up: the first task pays for connections, caches and the
    // tables' first pages.
    run_tasks(&server, follower.as_ref(), 10, 5, interval).await?;
    let mut out = Vec::new();
    for &updates in lengths {
        let tasks = MIN_UPDATES_PER_LENGTH.div_ceil(u64::from(updates.max(1)));
        let (b0, c0, t0) = (
            bytes.now().await?,
            cpu_seconds(measured.pid()).ok_or("no CPU figure")?,
            Instant::now(),
        );
        run_tasks(&server, follower.as_ref(), updates, tasks, interval).await?;
        let (b1, c1, elapsed) = (
            bytes.now().await?,
            cpu_seconds(measured.pid()).ok_or("no CPU figure")?,
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
            "long tasks, {}: K={updates} x{tasks}: {} {}, {:.1} µs CPU/write ({:.1?})",
            store.name(),
            length
                .bytes_per_write
                .map_or("-".to_string(), |b| format!("{b:.0}")),
            store.bytes_unit(),
            length.cpu_us_per_write,
            length.elapsed
        );
        out.push(length);
    }
    drop(follower);
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
