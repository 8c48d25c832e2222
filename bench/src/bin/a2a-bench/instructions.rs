//! `a2a-bench instructions`: what one request costs a server in
//! instructions, counted by callgrind, the figure that holds where CPU
//! time moves by a fifth between runs of one binary on a shared machine.
//!
//! Each server (this one, and the echo server `a2a-bare` with tonic's
//! defaults and with this server's settings) runs under `valgrind
//! --tool=callgrind`, one fresh process per workload. The load is the
//! `run` workload's, with a fixed request count (`--requests`): a warm-up
//! runs until every request of it is answered and the server is idle,
//! callgrind's counters are zeroed (`callgrind_control -z`), exactly N
//! requests run, the server is left to go idle again (a non-blocking
//! send's run ends after its answer), and the counters are dumped
//! (`callgrind_control -d`). Start-up, the warm-up and the client are
//! never counted; the dump's total over N is the figure.
//!
//! The dumps are kept with `--keep DIR` for `callgrind_annotate`: where a
//! request's instructions go (docs/performance.md has the table).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};

use super::{
    AnyError, Binding, Load, RunArgs, Workload, cpu_seconds, parse_binding, run_workload, sibling,
    spawn_server,
};

/// Instruction ratios to the echo server the project holds itself to
/// (issue 32): a send within 1.35 times the echo's, a GetTask within 1.10.
const SEND_TARGET: f64 = 1.35;
const GET_TARGET: f64 = 1.10;

/// How long a server may take to go idle after its last answer.
const SETTLE_LIMIT: Duration = Duration::from_secs(60);
/// Idle: less CPU than this over `SETTLE_WINDOW`.
const IDLE_CPU: Duration = Duration::from_millis(5);
const SETTLE_WINDOW: Duration = Duration::from_millis(250);

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Target {
    /// `a2a-bare`: fixed answers, tokio's and tonic's defaults.
    Echo,
    /// `a2a-bare --tuned`: fixed answers, this server's runtime and
    /// connection settings.
    EchoTuned,
    /// `a2a-lifecycle serve --store memory --default-agent bench`.
    Lifecycle,
    /// `--peer`: another A2A server.
    #[value(skip)]
    Peer,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Echo => "echo",
            Target::EchoTuned => "echo-tuned",
            Target::Lifecycle => "a2a-lifecycle",
            Target::Peer => "peer",
        }
    }
}

#[derive(Args)]
pub struct InstructionsArgs {
    /// The workloads (send, send-blocking, get, stream).
    #[arg(long, value_enum, value_delimiter = ',',
          default_values_t = [Workload::Send, Workload::SendBlocking, Workload::Get, Workload::Stream])]
    workloads: Vec<Workload>,
    /// The servers, each a fresh process per workload.
    #[arg(long, value_enum, value_delimiter = ',',
          default_values_t = [Target::Echo, Target::EchoTuned, Target::Lifecycle])]
    servers: Vec<Target>,
    /// Requests counted per workload.
    #[arg(long, default_value_t = 4_000)]
    requests: u64,
    /// Requests in flight.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// HTTP/2 connections they share.
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// Load before the count starts (under valgrind a server runs about
    /// fifty times slower).
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// The binding of this server's requests (the echo servers speak
    /// gRPC only, so other bindings count this server alone).
    #[arg(long, default_value = "grpc", value_parser = parse_binding)]
    binding: Binding,
    /// Another A2A server to count beside them (an SDK's, say): a program
    /// that takes `--listen ADDR` and prints `addr=HOST:PORT` on stderr
    /// once listening, with an agent that completes each task at once.
    #[arg(long)]
    peer: Option<PathBuf>,
    /// Keep callgrind's dumps here (`NAME.out.1` is the counted window).
    #[arg(long)]
    keep: Option<PathBuf>,
    /// Also print where each server's instructions go, by part (request
    /// decode, validation, lifecycle apply, store, ...), per workload.
    #[arg(long)]
    parts: bool,
    /// Count nothing: print the parts of these kept dumps (`--keep`), a
    /// column each, per `--requests` requests.
    #[arg(long, num_args = 1..)]
    parts_of: Vec<PathBuf>,
    /// More arguments for `a2a-lifecycle serve` (after `--`); a `--store`
    /// among them replaces the default memory store.
    #[arg(last = true)]
    serve_args: Vec<String>,
}

/// One counted row: instructions per request of each server.
pub struct Counted {
    pub workload: Workload,
    pub per_request: Vec<(Target, f64)>,
    /// Each server's dump of the counted window.
    pub dumps: Vec<(Target, PathBuf)>,
}

impl Counted {
    fn of(&self, target: Target) -> Option<f64> {
        self.per_request
            .iter()
            .find(|(t, _)| *t == target)
            .map(|(_, v)| *v)
    }
}

pub async fn instructions(args: &InstructionsArgs) -> Result<(), AnyError> {
    if !args.parts_of.is_empty() {
        return print_dump_parts(args);
    }
    for tool in ["valgrind", "callgrind_control"] {
        if Command::new(tool).arg("--version").output().is_err() {
            return Err(format!("{tool} not found: install valgrind").into());
        }
    }
    let dir = match &args.keep {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("a2a-bench-callgrind-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir)?;
    let mut rows = Vec::new();
    for &workload in &args.workloads {
        if matches!(workload, Workload::Fanout | Workload::CreateMany) {
            return Err(format!("{workload:?}: count send, send-blocking, get or stream").into());
        }
        let mut row = Counted {
            workload,
            per_request: Vec::new(),
            dumps: Vec::new(),
        };
        let peer = args.peer.as_ref().map(|_| Target::Peer);
        for &target in args.servers.iter().chain(peer.iter()) {
            if target != Target::Lifecycle && args.binding != Binding::Grpc {
                continue;
            }
            let (per, dump) = count(args, &dir, workload, target).await?;
            row.dumps.push((target, dump));
            eprintln!(
                "{} {}: {per:.0} instructions per request",
                target.name(),
                workload_name(workload)
            );
            row.per_request.push((target, per));
        }
        rows.push(row);
    }
    print_rows(args, &rows);
    if args.parts {
        for row in &rows {
            print_parts(args, row)?;
        }
    }
    if args.keep.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

/// The workload's name on the command line (`send-blocking`).
fn workload_name(workload: Workload) -> String {
    workload
        .to_possible_value()
        .map(|v| v.get_name().to_owned())
        .unwrap_or_default()
}

fn print_rows(args: &InstructionsArgs, rows: &[Counted]) {
    let peer = args.peer.is_some();
    println!(
        "| workload | echo | echo, tuned | a2a-lifecycle | ratio to echo | to tuned | target | met |{}",
        if peer { " peer | to peer |" } else { "" }
    );
    println!(
        "| --- | --- | --- | --- | --- | --- | --- | --- |{}",
        if peer { " --- | --- |" } else { "" }
    );
    let mut json = Vec::new();
    for row in rows {
        let cell = |t| row.of(t).map(|v| format!("{v:.0}")).unwrap_or("-".into());
        let ours = row.of(Target::Lifecycle);
        let ratio = |t| ours.zip(row.of(t)).map(|(a, b)| a / b);
        let target = match row.workload {
            Workload::Send | Workload::SendBlocking => Some(SEND_TARGET),
            Workload::Get => Some(GET_TARGET),
            _ => None,
        };
        let met = match (ratio(Target::Echo), target) {
            (Some(r), Some(t)) => {
                if r <= t {
                    "yes"
                } else {
                    "no"
                }
            }
            _ => "-",
        };
        let fmt = |r: Option<f64>| r.map(|r| format!("{r:.2}")).unwrap_or("-".into());
        let peer_cells = if peer {
            format!(" {} | {} |", cell(Target::Peer), fmt(ratio(Target::Peer)))
        } else {
            String::new()
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {met} |{peer_cells}",
            workload_name(row.workload),
            cell(Target::Echo),
            cell(Target::EchoTuned),
            cell(Target::Lifecycle),
            fmt(ratio(Target::Echo)),
            fmt(ratio(Target::EchoTuned)),
            target.map(|t| format!("<= {t:.2}")).unwrap_or("-".into()),
        );
        let figures: Vec<String> = row
            .per_request
            .iter()
            .map(|(t, v)| format!("\"{}\":{v:.0}", t.name()))
            .collect();
        json.push(format!(
            "{{\"workload\":\"{}\",{}}}",
            workload_name(row.workload),
            figures.join(",")
        ));
    }
    println!(
        "{{\"instructions\":{{\"requests\":{},\"concurrency\":{},\"connections\":{},\"binding\":\"{}\",\"rows\":[{}]}}}}",
        args.requests,
        args.concurrency,
        args.connections,
        args.binding.name(),
        json.join(",")
    );
}

/// One server under callgrind, one workload: instructions per request.
async fn count(
    args: &InstructionsArgs,
    dir: &Path,
    workload: Workload,
    target: Target,
) -> Result<(f64, PathBuf), AnyError> {
    let name = format!("{}-{}", target.name(), workload_name(workload));
    let out = dir.join(format!("{name}.out"));
    for stale in std::fs::read_dir(dir)?.flatten() {
        if stale
            .file_name()
            .to_string_lossy()
            .starts_with(&format!("{name}.out"))
        {
            std::fs::remove_file(stale.path())?;
        }
    }
    let mut argv: Vec<String> = vec![
        "--tool=callgrind".into(),
        format!("--callgrind-out-file={}", out.display()),
        format!("--log-file={}", dir.join(format!("{name}.log")).display()),
        "--dump-instr=no".into(),
        // Every name in full in every dump: with compression, a name first
        // written in a window zeroed before the dump is referred to by a
        // number the dump never defines, and callgrind_annotate charges
        // its costs to the wrong function.
        "--compress-strings=no".into(),
    ];
    match target {
        Target::Lifecycle => {
            argv.push(sibling("a2a-lifecycle").display().to_string());
            argv.push("serve".into());
            // `-- --store sqlite:PATH` counts another store: the memory
            // store is only the default.
            if !args
                .serve_args
                .iter()
                .any(|a| a == "--store" || a.starts_with("--store="))
            {
                argv.extend(["--store", "memory"].map(String::from));
            }
            argv.extend(["--default-agent", "bench", "--listen", "127.0.0.1:0"].map(String::from));
            argv.extend(args.serve_args.iter().cloned());
        }
        Target::Peer => {
            let program = args.peer.as_ref().ok_or("no --peer")?;
            argv.push(program.display().to_string());
            argv.extend(["--listen", "127.0.0.1:0"].map(String::from));
        }
        Target::Echo | Target::EchoTuned => {
            argv.push(sibling("a2a-bare").display().to_string());
            argv.extend(["--listen", "127.0.0.1:0"].map(String::from));
            if target == Target::EchoTuned {
                argv.push("--tuned".into());
            }
        }
    }
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let server = spawn_server(Path::new("valgrind"), &argv, None)?;
    let pid = server.pid();
    let mut load = Load {
        concurrency: args.concurrency,
        connections: args.connections,
        duration: Duration::ZERO,
        warmup: args.warmup,
        tenant: String::new(),
        token: None,
        webhook: None,
        binding: if target == Target::Lifecycle {
            args.binding
        } else {
            Binding::Grpc
        },
        http1: false,
        v0_3: false,
        requests: Some(args.requests),
        mark: None,
    };
    load.mark = Some(Arc::new(move || {
        settle(pid)?;
        callgrind_control("-z", pid)
    }));
    let outcome = run_workload(&RunArgs::against(&server, workload, load)).await?;
    if outcome.requests != args.requests {
        return Err(format!(
            "{name}: {} requests answered of {}",
            outcome.requests, args.requests
        )
        .into());
    }
    settle(pid)?;
    callgrind_control("-d", pid)?;
    let dump = PathBuf::from(format!("{}.1", out.display()));
    let total = totals(&dump)?;
    drop(server);
    Ok((total as f64 / args.requests as f64, dump))
}

/// `--parts-of`: kept dumps' parts, a column each.
fn print_dump_parts(args: &InstructionsArgs) -> Result<(), AnyError> {
    let mut columns = Vec::new();
    for dump in &args.parts_of {
        columns.push((dump.display().to_string(), parts(dump, args.requests)?));
    }
    print_parts_table(&columns, false);
    Ok(())
}

/// One workload's parts, a column per server.
fn print_parts(args: &InstructionsArgs, row: &Counted) -> Result<(), AnyError> {
    let mut columns = Vec::new();
    for (target, dump) in &row.dumps {
        columns.push((target.name().to_owned(), parts(dump, args.requests)?));
    }
    println!();
    println!(
        "{}: instructions per request by part (of which memcpy / allocator)",
        workload_name(row.workload)
    );
    print_parts_table(&columns, true);
    Ok(())
}

/// Parts by row, a column per (head, parts); with `detail`, each cell's
/// `memcpy` and allocator shares beside it.
fn print_parts_table(columns: &[(String, Vec<Part>)], detail: bool) {
    let heads: Vec<&str> = columns.iter().map(|(head, _)| head.as_str()).collect();
    println!("| part | {} |", heads.join(" | "));
    println!("| --- |{}", " --- |".repeat(heads.len()));
    let Some((_, first)) = columns.first() else {
        return;
    };
    for (k, (name, ..)) in first.iter().enumerate() {
        let cells: Vec<String> = columns
            .iter()
            .map(|(_, parts)| {
                let (_, all, copy, alloc) = parts[k];
                match detail {
                    false => format!("{all:.0}"),
                    true if all < 0.5 => "0".to_owned(),
                    true => format!("{all:.0} ({copy:.0} / {alloc:.0})"),
                }
            })
            .collect();
        println!("| {name} | {} |", cells.join(" | "));
    }
    let totals: Vec<String> = columns
        .iter()
        .map(|(_, parts)| format!("{:.0}", parts.iter().map(|p| p.1).sum::<f64>()))
        .collect();
    println!("| total | {} |", totals.join(" | "));
}

/// Waits until the server uses next to no CPU: its last run ended and
/// its answers went out.
fn settle(pid: u32) -> Result<(), AnyError> {
    let start = Instant::now();
    let mut last = cpu_seconds(pid).ok_or("the server's CPU time is unreadable")?;
    while start.elapsed() < SETTLE_LIMIT {
        std::thread::sleep(SETTLE_WINDOW);
        let now = cpu_seconds(pid).ok_or("the server exited")?;
        if now - last < IDLE_CPU.as_secs_f64() {
            return Ok(());
        }
        last = now;
    }
    Err(format!("the server (pid {pid}) did not go idle in {SETTLE_LIMIT:?}").into())
}

fn callgrind_control(flag: &str, pid: u32) -> Result<(), AnyError> {
    let output = Command::new("callgrind_control")
        .args([flag, &pid.to_string()])
        .stdin(Stdio::null())
        .output()?;
    if !output.status.success() {
        return Err(format!(
            "callgrind_control {flag} {pid}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    Ok(())
}

/// The `totals:` (or `summary:`) line of a callgrind dump: instructions.
fn totals(dump: &Path) -> Result<u64, AnyError> {
    let text = std::fs::read_to_string(dump)
        .map_err(|e| format!("{}: {e} (did callgrind_control -d dump?)", dump.display()))?;
    text.lines()
        .find_map(|l| {
            l.strip_prefix("totals:")
                .or_else(|| l.strip_prefix("summary:"))
        })
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| format!("{}: no totals line", dump.display()).into())
}

/// The parts a request's instructions are told apart by (`--parts`): a
/// function whose name holds one of a part's patterns belongs to it (the
/// first part that matches), and a function of none (a `String` clone,
/// a hash, `memcpy`, the allocator) is shared among its callers' parts in
/// proportion to the instructions each call cost. So `memcpy` of a future
/// moved by a spawn counts to the part that spawned it.
const PARTS: &[(&str, &[&str])] = &[
    ("request decode", &["tonic::codec::decode"]),
    // The body's map_err wrapper too: where tonic's encoding of the
    // answer is inlined into it, the encoding shows under its name.
    (
        "response encode",
        &[
            "tonic::codec::encode",
            "http_body_util::combinators::map_err::MapErr",
        ],
    ),
    (
        "validation",
        &[
            "service::validate::",
            "A2aApi::check_send",
            "content::InputModes",
        ],
    ),
    (
        "auth: caller, owner",
        &[
            "a2a_lifecycle::auth::",
            "AuthFirst",
            "A2aApi::reader",
            "A2aApi::caller",
            "store::owner",
        ],
    ),
    ("lifecycle apply", &["a2a_lifecycle::lifecycle::"]),
    ("store: encode, write, read", &["a2a_lifecycle::store::"]),
    (
        "broadcast",
        &["LiveTask::publish", "runtime::broadcast", "watch::Sender"],
    ),
    (
        "metrics",
        &["a2a_lifecycle::metrics::", "prometheus_client"],
    ),
    (
        "spans, logs",
        &[
            "tracing::",
            "tracing_core",
            "tracing_subscriber",
            "a2a_lifecycle::telemetry::",
        ],
    ),
    ("run spawn", &["a2a_lifecycle::runtime::run::"]),
    (
        "commit: scheduling, flush",
        &[
            "LiveTask::submit_locked",
            "LiveTask>::flush",
            "LiveTask>::committed",
            "runtime::commit",
        ],
    ),
    (
        "agent and its sink",
        &[
            "AgentExecutor>::execute",
            "runtime::sink::",
            "agent::sink::",
        ],
    ),
    (
        "API, runtime: route, claim, answer",
        &[
            "a2a_lifecycle::service::A2aApi",
            "a2a_lifecycle::runtime::",
            "a2a_lifecycle::service::send",
            "a2a_lifecycle::service::tasks",
        ],
    ),
    (
        "gRPC adapter, connection layers",
        &[
            "a2a_lifecycle::service::",
            "a2a_lifecycle::connections::",
            "discovery::parameters",
            "a2a_lifecycle::proto::a2a_service_server",
        ],
    ),
    (
        "HTTP/2 and gRPC framing (h2, hyper, tonic)",
        &[
            "h2::",
            "hyper",
            "tonic::",
            "axum",
            "tower",
            "http::",
            "http_body",
        ],
    ),
    (
        "tokio: scheduler, reactor, timers",
        &[
            "tokio::runtime::scheduler",
            "tokio::runtime::task::harness",
            "tokio::runtime::task::raw",
            "tokio::runtime::io",
            "tokio::runtime::time",
            "start_thread",
            "mio::",
            "epoll",
        ],
    ),
];

/// One part's instructions per request: (part, all, of which `memcpy`, of
/// which the allocator).
type Part = (&'static str, f64, f64, f64);

/// A callgrind dump's instructions by part, per request.
pub fn parts(dump: &Path, requests: u64) -> Result<Vec<Part>, AnyError> {
    use std::collections::HashMap;
    let text = std::fs::read_to_string(dump)?;
    // Self cost per function, and the inclusive cost of each call edge.
    let mut own: HashMap<String, u64> = HashMap::new();
    let mut edges: HashMap<(String, String), u64> = HashMap::new();
    let (mut current, mut callee) = (String::new(), String::new());
    let mut after_calls = false;
    for line in text.lines() {
        if let Some(name) = line.strip_prefix("fn=") {
            current = name.to_owned();
        } else if let Some(name) = line.strip_prefix("cfn=") {
            callee = name.to_owned();
        } else if line.starts_with("calls=") {
            after_calls = true;
        } else if line.starts_with(|c: char| c.is_ascii_digit() || "+-*".contains(c)) {
            let Some(cost) = line
                .split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
            else {
                continue;
            };
            if std::mem::take(&mut after_calls) {
                if callee != current {
                    *edges.entry((current.clone(), callee.clone())).or_default() += cost;
                }
            } else {
                *own.entry(current.clone()).or_default() += cost;
            }
        }
    }
    let unassigned = PARTS.len();
    let part_of = |name: &str| {
        PARTS
            .iter()
            .position(|(_, patterns)| patterns.iter().any(|p| name.contains(p)))
    };
    let mut names: Vec<&String> = own.keys().collect();
    names.extend(edges.keys().flat_map(|(a, b)| [a, b]));
    names.sort();
    names.dedup();
    let index: HashMap<&String, usize> = names.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let anchor: Vec<Option<usize>> = names.iter().map(|n| part_of(n)).collect();
    let mut callers: Vec<Vec<(usize, f64)>> = vec![Vec::new(); names.len()];
    for ((a, b), cost) in &edges {
        callers[index[b]].push((index[a], *cost as f64));
    }
    // Each function's share of each part: its own part, or its callers'
    // shares weighted by what their calls cost (iterated: call chains of
    // unassigned functions, and recursion, settle within a few passes).
    let mut share: Vec<Vec<f64>> = anchor
        .iter()
        .map(|a| {
            let mut s = vec![0.0; unassigned + 1];
            s[a.unwrap_or(unassigned)] = 1.0;
            s
        })
        .collect();
    for _ in 0..30 {
        for f in 0..names.len() {
            if anchor[f].is_some() || callers[f].is_empty() {
                continue;
            }
            let total: f64 = callers[f].iter().map(|(_, c)| c).sum();
            let mut s = vec![0.0; unassigned + 1];
            for (caller, cost) in &callers[f] {
                for (k, v) in share[*caller].iter().enumerate() {
                    s[k] += v * cost / total;
                }
            }
            share[f] = s;
        }
    }
    let mut rows = vec![(0.0, 0.0, 0.0); unassigned + 1];
    for (name, cost) in &own {
        let is_copy = name.contains("memcpy");
        let is_alloc = name.starts_with("mi_")
            || name.starts_with("_mi_")
            || name.contains("__rust_alloc")
            || name.contains("__rust_dealloc")
            || name.contains("__rust_realloc");
        for (k, v) in share[index[name]].iter().enumerate() {
            let c = *cost as f64 * v / requests as f64;
            rows[k].0 += c;
            if is_copy {
                rows[k].1 += c;
            }
            if is_alloc {
                rows[k].2 += c;
            }
        }
    }
    Ok(rows
        .into_iter()
        .enumerate()
        .map(|(k, (all, copy, alloc))| {
            let name = PARTS.get(k).map_or("other", |(n, _)| *n);
            (name, all, copy, alloc)
        })
        .collect())
}
