//! Non-blocking SendMessage throughput, SQLite store against the in-memory
//! store, measured alternately in one run (a ratio holds on a noisy
//! machine; an absolute figure does not).
//!
//! Each round starts a fresh server (new store) on an ephemeral port,
//! warms up, then runs a closed loop: `--concurrency` requests in flight
//! over `--connections` HTTP/2 connections for `--duration` seconds, each a
//! SendMessage with `return_immediately` to the demo test-runner, whose
//! task then completes in the background (5 store writes per task). The
//! server and the load generator run on separate tokio runtimes.
//!
//! `cargo bench --bench send_throughput -- --duration 5 --rounds 3`

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use a2a_lifecycle::agent::demo::demo_router;
use a2a_lifecycle::proto::a2a_service_client::A2aServiceClient;
use a2a_lifecycle::proto::{
    Message, Part, Role, SendMessageConfiguration, SendMessageRequest, part::Content,
};
use a2a_lifecycle::runtime::{RuntimeConfig, TaskManager};
use a2a_lifecycle::store::{MemoryStore, SqliteStore, TaskStore};
use tonic::transport::Channel;

struct Options {
    duration: Duration,
    warmup: Duration,
    concurrency: usize,
    connections: usize,
    rounds: usize,
    /// `--only memory|sqlite`: run one store (for profiling).
    only: Option<String>,
}

fn options() -> Options {
    let mut o = Options {
        duration: Duration::from_secs(5),
        warmup: Duration::from_secs(1),
        concurrency: 64,
        connections: 4,
        rounds: 3,
        only: None,
    };
    let args: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < args.len() {
        let value = || args.get(i + 1).and_then(|v| v.parse::<f64>().ok());
        match args[i].as_str() {
            "--duration" => o.duration = Duration::from_secs_f64(value().expect("--duration SECS")),
            "--warmup" => o.warmup = Duration::from_secs_f64(value().expect("--warmup SECS")),
            "--concurrency" => o.concurrency = value().expect("--concurrency N") as usize,
            "--connections" => o.connections = value().expect("--connections N") as usize,
            "--rounds" => o.rounds = value().expect("--rounds N") as usize,
            "--only" => o.only = args.get(i + 1).cloned(),
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    o
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Memory,
    Sqlite,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Memory => "memory",
            Kind::Sqlite => "sqlite",
        }
    }
}

struct Server {
    addr: String,
    manager: TaskManager,
    shutdown: tokio::sync::oneshot::Sender<()>,
    /// The SQLite database file, removed (with its WAL) after the round.
    db: Option<std::path::PathBuf>,
}

async fn start(kind: Kind) -> Server {
    let mut db = None;
    let store: Arc<dyn TaskStore> = match kind {
        Kind::Memory => Arc::new(MemoryStore::new()),
        Kind::Sqlite => {
            let path = std::env::temp_dir()
                .join("a2a-lifecycle-bench")
                .join(format!("{}.db", uuid::Uuid::new_v4()));
            db = Some(path.clone());
            Arc::new(SqliteStore::open(path).await.expect("open sqlite"))
        }
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let manager = TaskManager::new(store, demo_router(), RuntimeConfig::default());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let m = manager.clone();
    tokio::spawn(async move {
        a2a_lifecycle::server::Server::new(m)
            .serve(listener, async {
                let _ = rx.await;
            })
            .await
            .unwrap();
    });
    Server {
        addr,
        manager,
        shutdown: tx,
        db,
    }
}

fn request() -> SendMessageRequest {
    SendMessageRequest {
        tenant: String::new(),
        message: Some(Message {
            message_id: uuid::Uuid::new_v4().to_string(),
            role: Role::User as i32,
            parts: vec![Part {
                content: Some(Content::Text("run the unit tests".into())),
                ..Default::default()
            }],
            ..Default::default()
        }),
        configuration: Some(SendMessageConfiguration {
            return_immediately: true,
            ..Default::default()
        }),
        metadata: None,
    }
}

/// Closed loop for `warmup + duration`; returns requests/s in the window.
async fn load(addr: &str, o: &Options) -> f64 {
    let mut channels = Vec::new();
    for _ in 0..o.connections {
        channels.push(
            Channel::from_shared(addr.to_string())
                .unwrap()
                .connect()
                .await
                .unwrap(),
        );
    }
    let counting = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for i in 0..o.concurrency {
        let mut client = A2aServiceClient::new(channels[i % channels.len()].clone());
        let (counting, stop, done) = (counting.clone(), stop.clone(), done.clone());
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                client
                    .send_message(request())
                    .await
                    .expect("SendMessage failed");
                if counting.load(Ordering::Relaxed) {
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    tokio::time::sleep(o.warmup).await;
    counting.store(true, Ordering::Relaxed);
    let start = Instant::now();
    tokio::time::sleep(o.duration).await;
    let count = done.load(Ordering::Relaxed);
    let elapsed = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    count as f64 / elapsed.as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() {
    let o = options();
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let mut results: Vec<(Kind, Vec<f64>)> = vec![(Kind::Memory, vec![]), (Kind::Sqlite, vec![])];
    eprintln!(
        "non-blocking SendMessage, C={} over {} connections, {:?} per round after {:?} warm-up, {} rounds",
        o.concurrency, o.connections, o.duration, o.warmup, o.rounds
    );
    for round in 1..=o.rounds {
        for (kind, samples) in results.iter_mut() {
            if o.only.as_deref().is_some_and(|only| only != kind.name()) {
                continue;
            }
            let server = server_rt.block_on(start(*kind));
            let rps = client_rt.block_on(load(&server.addr, &o));
            // Let the background runs finish before the next round.
            server_rt.block_on(async {
                while server.manager.live_task_count() > 0 {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            });
            let _ = server.shutdown.send(());
            if let Some(db) = &server.db {
                for suffix in ["", "-wal", "-shm"] {
                    let mut file = db.clone().into_os_string();
                    file.push(suffix);
                    let _ = std::fs::remove_file(file);
                }
            }
            eprintln!("round {round}: {:>6} {:>9.0} req/s", kind.name(), rps);
            samples.push(rps);
        }
    }
    let memory = median(results[0].1.clone());
    let sqlite = median(results[1].1.clone());
    // Each round's SQLite run is paired with the memory run just before
    // it: a ratio taken within a round sees the same machine load.
    let paired = median(
        results[0]
            .1
            .iter()
            .zip(&results[1].1)
            .map(|(m, s)| s / m)
            .collect(),
    );
    println!("| store  | median req/s | ratio to memory (median of rounds) |");
    println!("| ------ | ------------ | ---------------------------------- |");
    println!("| memory | {memory:>12.0} | {:>34.2} |", 1.0);
    println!("| sqlite | {sqlite:>12.0} | {paired:>34.2} |");
    println!(
        "{{\"bench\":\"send_non_blocking\",\"concurrency\":{},\"connections\":{},\"duration_s\":{},\"rounds\":{},\"memory_rps\":{:.0},\"sqlite_rps\":{:.0},\"sqlite_over_memory\":{:.3}}}",
        o.concurrency,
        o.connections,
        o.duration.as_secs_f64(),
        o.rounds,
        memory,
        sqlite,
        paired
    );
}
