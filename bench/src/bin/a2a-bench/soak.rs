//! The mixed soak (issue "performance", its memory goal): the demo agents'
//! flows at random for minutes against one server, its memory sampled
//! each second from `/proc/PID/status` and split into what the process
//! allocated (`RssAnon`) and the files it maps (`RssFile`: with SQLite,
//! the database read through `mmap`).
//!
//! Each worker loops over, at random: a test-runner stream read to its
//! end; a code-reviewer task and its follow-up (the diff); a slow
//! test-runner task canceled while it works; a deployer stream through
//! AUTH_REQUIRED to COMPLETED. Every call must succeed: a failed one ends
//! the soak with its error, so memory is never measured on a server that
//! refuses work.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use a2a_lifecycle::proto::{CancelTaskRequest, TaskState, stream_response::Payload};

use super::{AnyError, Client, connect_one, send_request, spawn_server, status_bytes, task_id_of};

#[derive(clap::Args)]
pub struct SoakArgs {
    /// How long the load runs.
    #[arg(long, default_value = "4m", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// The store: `sqlite` (a fresh file) or `memory`.
    #[arg(long, default_value = "sqlite")]
    store: String,
    /// Flows in flight.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// How long the server is watched idle after the load, for what it
    /// gives back.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    idle: Duration,
    /// How long a slow task works before it is canceled: up to this, at
    /// random (its progress, ten updates a second, is its history).
    #[arg(long, default_value = "50ms", value_parser = humantime::parse_duration)]
    cancel_within: Duration,
    /// Leave the server and the generator on every core (by default each
    /// has its own half of them, as in the suite).
    #[arg(long)]
    pub unpinned: bool,
    /// Extra `serve` flags, as one argument each (e.g. `--sqlite-cache 8MiB`).
    #[arg(long = "serve-arg", allow_hyphen_values = true)]
    serve_args: Vec<String>,
}

/// One second's memory of the server, in bytes.
#[derive(Clone, Copy, Default)]
struct Sample {
    at: Duration,
    rss: u64,
    anon: u64,
    file: u64,
    flows: u64,
    db: u64,
}

fn sample(pid: u32, at: Duration, flows: u64, db: Option<&Path>) -> Option<Sample> {
    let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
    Some(Sample {
        at,
        rss: status_bytes(pid, "VmRSS:")?,
        anon: status_bytes(pid, "RssAnon:")?,
        file: status_bytes(pid, "RssFile:")?,
        flows,
        db: db.map_or(0, |db| {
            size(db) + size(&db.with_extension("db-wal")) + size(&db.with_extension("db-shm"))
        }),
    })
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1_048_576.0
}

pub async fn soak(main_bin: &Path, args: &SoakArgs, cpus: Option<&str>) -> Result<(), AnyError> {
    let dir = std::env::temp_dir().join(format!("a2a-bench-soak-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir)?;
    let db = dir.join("tasks.db");
    let store_arg = match args.store.as_str() {
        "sqlite" => format!("sqlite:{}", db.display()),
        other => other.to_string(),
    };
    let mut serve: Vec<&str> = vec!["serve", "--listen", "127.0.0.1:0", "--store", &store_arg];
    serve.extend(args.serve_args.iter().map(String::as_str));
    let server = spawn_server(main_bin, &serve, cpus)?;
    let pid = server.pid();
    let db = (args.store == "sqlite").then_some(db.as_path());
    let flows = Arc::new(AtomicU64::new(0));
    let stop_at = Instant::now() + args.duration;
    let mut workers = tokio::task::JoinSet::new();
    let cancel_within = args.cancel_within;
    for w in 0..args.concurrency {
        let client = connect_one(&server.url).await?;
        let flows = flows.clone();
        workers.spawn(async move {
            let mut rng = (w as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            while Instant::now() < stop_at {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                flow(client.clone(), rng, cancel_within).await?;
                flows.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), AnyError>(())
        });
    }
    let start = Instant::now();
    let mut samples = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    println!("| s | flows | RSS MiB | anon MiB | file MiB | database MiB |");
    println!("| --- | --- | --- | --- | --- | --- |");
    let print = |s: &Sample| {
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.0} | {:.0} |",
            s.at.as_secs(),
            s.flows,
            mib(s.rss),
            mib(s.anon),
            mib(s.file),
            mib(s.db)
        );
    };
    let end_at = stop_at + args.idle;
    while Instant::now() < end_at {
        tick.tick().await;
        if let Some(Err(e)) = workers.try_join_next() {
            return Err(format!("a worker ended: {e}").into());
        }
        let Some(s) = sample(pid, start.elapsed(), flows.load(Ordering::Relaxed), db) else {
            return Err("the server is gone".into());
        };
        if s.at.as_secs().is_multiple_of(15) {
            print(&s);
        }
        samples.push(s);
    }
    while let Some(done) = workers.join_next().await {
        done??;
    }
    let mappings = file_mappings(pid);
    let loaded: Vec<&Sample> = samples.iter().filter(|s| s.at <= args.duration).collect();
    let peak = |f: fn(&Sample) -> u64| loaded.iter().map(|s| f(s)).max().unwrap_or(0);
    let last = samples.last().copied().unwrap_or_default();
    let flows = flows.load(Ordering::Relaxed);
    println!(
        "peak RSS {:.0} MiB (allocated {:.0}, files mapped {:.0}); after {} s idle {:.0} MiB (allocated {:.0}, files {:.0}); {} flows; database {:.0} MiB",
        mib(peak(|s| s.rss)),
        mib(peak(|s| s.anon)),
        mib(peak(|s| s.file)),
        args.idle.as_secs(),
        mib(last.rss),
        mib(last.anon),
        mib(last.file),
        flows,
        mib(last.db),
    );
    for (path, m) in &mappings {
        println!(
            "mapped: {path}: {} mapping(s), {:.0} MiB resident, the largest {:.0} MiB",
            m.mappings,
            mib(m.rss),
            mib(m.largest)
        );
    }
    println!(
        "{{\"soak\":{{\"store\":\"{}\",\"seconds\":{},\"flows\":{flows},\"peak_rss\":{},\"peak_anon\":{},\"peak_file\":{},\"idle_rss\":{},\"idle_anon\":{},\"database\":{}}}}}",
        args.store,
        args.duration.as_secs(),
        peak(|s| s.rss),
        peak(|s| s.anon),
        peak(|s| s.file),
        last.rss,
        last.anon,
        last.db
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// A file the server maps: how many mappings, their resident bytes in
/// all, and the largest one's (the same page mapped twice counts twice).
#[derive(Default)]
struct Mapped {
    mappings: u64,
    rss: u64,
    largest: u64,
}

/// The files the server maps (`/proc/PID/smaps`), largest first.
fn file_mappings(pid: u32) -> Vec<(String, Mapped)> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut by_path = std::collections::BTreeMap::<String, Mapped>::new();
    let mut path = None;
    for line in smaps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields
            .first()
            .is_some_and(|f| f.contains('-') && !f.ends_with(':'))
        {
            // A mapping's header: address range, perms, offset, dev, inode, path.
            path = fields
                .get(5)
                .filter(|p| p.starts_with('/'))
                .map(|p| p.to_string());
            if let Some(p) = &path {
                by_path.entry(p.clone()).or_default().mappings += 1;
            }
        } else if fields.first() == Some(&"Rss:")
            && let Some(p) = &path
        {
            let kib: u64 = fields.get(1).and_then(|v| v.parse().ok()).unwrap_or(0);
            let file = by_path.entry(p.clone()).or_default();
            file.rss += kib * 1024;
            file.largest = file.largest.max(kib * 1024);
        }
    }
    let mut all: Vec<_> = by_path.into_iter().filter(|(_, m)| m.rss > 0).collect();
    all.sort_by_key(|(_, m)| std::cmp::Reverse(m.rss));
    all
}

/// One flow of the demo agents, picked by the random `rng`.
async fn flow(mut client: Client, rng: u64, cancel_within: Duration) -> Result<(), AnyError> {
    match rng % 100 {
        // A test-runner stream, read to its end.
        0..=39 => {
            let events = stream_to_end(&mut client, "test-runner", "run the unit tests").await?;
            expect(events, TaskState::Completed)
        }
        // A code-reviewer task, then its follow-up.
        40..=59 => {
            let id =
                task_id_of(&mut client, send_request("code-reviewer", "review", false)).await?;
            let mut follow = send_request("code-reviewer", "diff --git a/x b/x", false);
            if let Some(m) = follow.message.as_mut() {
                m.task_id = id;
            }
            client.send_message(follow).await?;
            Ok(())
        }
        // A slow test-runner task, canceled while it works.
        60..=79 => {
            let id = task_id_of(&mut client, send_request("test-runner", "slow", true)).await?;
            let within = cancel_within.as_micros().max(1) as u64;
            let wait = Duration::from_micros((rng >> 8) % within);
            tokio::time::sleep(wait).await;
            let task = client
                .cancel_task(CancelTaskRequest {
                    tenant: "test-runner".into(),
                    id,
                    ..Default::default()
                })
                .await?
                .into_inner();
            let state = task.status.map(|s| s.state);
            if state != Some(TaskState::Canceled as i32) {
                return Err(format!("a canceled task is {state:?}").into());
            }
            Ok(())
        }
        // A deployer stream through AUTH_REQUIRED.
        _ => {
            let events = stream_to_end(&mut client, "deployer", "deploy to staging").await?;
            expect(events, TaskState::Completed)
        }
    }
}

async fn stream_to_end(
    client: &mut Client,
    tenant: &str,
    text: &str,
) -> Result<Vec<Payload>, AnyError> {
    let mut stream = client
        .send_streaming_message(send_request(tenant, text, false))
        .await?
        .into_inner();
    let mut events = Vec::new();
    while let Some(event) = stream.message().await? {
        events.extend(event.payload);
    }
    Ok(events)
}

/// The stream's last status is `state`.
fn expect(events: Vec<Payload>, state: TaskState) -> Result<(), AnyError> {
    let last = events.iter().rev().find_map(|p| match p {
        Payload::StatusUpdate(u) => u.status.as_ref().map(|s| s.state),
        Payload::Task(t) => t.status.as_ref().map(|s| s.state),
        _ => None,
    });
    if last == Some(state as i32) {
        Ok(())
    } else {
        Err(format!("a stream ended in {last:?}, not {state:?}").into())
    }
}
