//! The console's task list with many tasks stored (issue "a console in
//! the browser"): with [`TASKS`] tasks in the store, how long the server
//! takes to answer the calls that show the list's first page.
//!
//! Per store: a server with the bench agent as its default, [`TASKS`]
//! tasks made by blocking sends (each COMPLETED at once), then, over
//! HTTP+JSON as the page makes them, [`SAMPLES`] rounds of
//! - the first page: `GET /tasks?pageSize=20&historyLength=0`;
//! - the counts by state: one `pageSize=1` ListTasks per state, after it.
//!
//! Timed at the client on loopback, one call at a time, so a call's time
//! is the server's (plus a loopback round trip). The server runs with
//! `--read-bytes-per-second 0`: each such ListTasks is charged for the
//! tasks it counts (about 1.3 MB at 10,000), and the bench's back-to-back
//! calls would otherwise measure the pacing; the page itself, reading
//! every 2 s, stays within a caller's default budget.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{AnyError, Server, connect_one, send_request, spawn_server};

/// Tasks in the store when the list is read.
pub const TASKS: u64 = 10_000;
/// The bound on the first page, at the server.
pub const FIRST_PAGE_WITHIN: Duration = Duration::from_millis(200);
/// Rounds timed (after [`WARM_UP`]).
const SAMPLES: usize = 50;
const WARM_UP: usize = 5;
/// The page's size, as the console asks for it.
const PAGE_SIZE: u32 = 20;
const STATES: [&str; 8] = [
    "SUBMITTED",
    "WORKING",
    "INPUT_REQUIRED",
    "AUTH_REQUIRED",
    "COMPLETED",
    "FAILED",
    "CANCELED",
    "REJECTED",
];

/// What one store measured.
pub struct Figures {
    pub store: &'static str,
    pub first_page_p50: Duration,
    pub first_page_p99: Duration,
    pub counts_p99: Duration,
    /// The first page's `totalSize`: every task was counted.
    pub total_size: u64,
}

/// `store` (a `--store` value; `None`: the memory store) measured.
pub async fn measure(
    main_bin: &Path,
    name: &'static str,
    store: Option<&str>,
    server_cpus: Option<&str>,
) -> Result<Figures, AnyError> {
    let mut args = vec![
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--default-agent",
        "bench",
        "--read-bytes-per-second",
        "0",
        "--store",
    ];
    args.push(store.unwrap_or("memory"));
    let server = spawn_server(main_bin, &args, server_cpus)?;
    fill(&server, TASKS).await?;
    let http = reqwest::Client::builder()
        .tcp_nodelay(true)
        .http1_only()
        .build()?;
    let list = |query: String| {
        let http = http.clone();
        let url = format!("{}/tasks?{query}", server.url);
        async move {
            let start = Instant::now();
            let body = http
                .get(url)
                .header("A2A-Version", "1.0")
                .send()
                .await?
                .error_for_status()?
                .bytes()
                .await?;
            Ok::<_, AnyError>((start.elapsed(), body))
        }
    };
    let (mut pages, mut counts) = (Vec::new(), Vec::new());
    let mut total_size = 0;
    for round in 0..WARM_UP + SAMPLES {
        let (took, body) = list(format!("pageSize={PAGE_SIZE}&historyLength=0")).await?;
        let page: serde_json::Value = serde_json::from_slice(&body)?;
        total_size = page["totalSize"].as_u64().ok_or("no totalSize")?;
        let shown = page["tasks"].as_array().map_or(0, Vec::len);
        if shown != PAGE_SIZE as usize {
            return Err(format!("the first page holds {shown} tasks").into());
        }
        let start = Instant::now();
        for state in STATES {
            list(format!(
                "pageSize=1&historyLength=0&status=TASK_STATE_{state}"
            ))
            .await?;
        }
        if round >= WARM_UP {
            pages.push(took);
            counts.push(start.elapsed());
        }
    }
    pages.sort();
    counts.sort();
    let at =
        |v: &[Duration], q: f64| v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1];
    Ok(Figures {
        store: name,
        first_page_p50: at(&pages, 0.5),
        first_page_p99: at(&pages, 0.99),
        counts_p99: at(&counts, 0.99),
        total_size,
    })
}

/// `tasks` blocking sends to the bench agent (each task COMPLETED at once).
async fn fill(server: &Server, tasks: u64) -> Result<(), AnyError> {
    let client = connect_one(&server.url).await?;
    let next = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for _ in 0..32 {
        let mut client = client.clone();
        let next = next.clone();
        workers.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < tasks {
                client.send_message(send_request("", "go", false)).await?;
            }
            Ok::<(), tonic::Status>(())
        }));
    }
    for w in workers {
        tokio::time::timeout(Duration::from_secs(600), w)
            .await
            .map_err(|_| "filling the store took over 10 minutes")???;
    }
    Ok(())
}
