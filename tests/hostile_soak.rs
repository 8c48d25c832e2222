//! A bounded soak of well-behaved clients beside hostile ones (issue
//! "hostile clients"): the same well-behaved workload runs twice, alone and
//! then beside silent connections from one address up to its cap, stalled
//! request bodies, a principal listing huge tasks, dead webhooks and bad
//! credentials in a loop, each from an address of its own. The
//! well-behaved clients must see no error in either run, and their p99
//! beside the hostile clients must stay within 3x of their p99 alone.
//!
//! Each run lasts `A2A_HOSTILE_SOAK_SECS` seconds (default 8).

mod support;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use a2a_lifecycle::agent::demo::demo_router;
use a2a_lifecycle::auth::Authenticator;
use a2a_lifecycle::connections::ConnectionLimits;
use a2a_lifecycle::runtime::{RuntimeConfig, TaskManager};
use a2a_lifecycle::store::MemoryStore;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use support::{TestServer, within};

fn seconds() -> Duration {
    let secs = std::env::var("A2A_HOSTILE_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    Duration::from_secs(secs)
}

/// A JSON-RPC client from `from`, with a bearer `key`.
fn client(from: &str, key: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("authorization", format!("Bearer {key}").parse().unwrap());
    reqwest::Client::builder()
        .local_address(from.parse::<IpAddr>().unwrap())
        .default_headers(headers)
        .timeout(support::WAIT)
        .build()
        .unwrap()
}

/// A JSON-RPC call; its answer (`None`: no JSON-RPC answer at all).
async fn rpc(
    http: &reqwest::Client,
    addr: SocketAddr,
    method: &str,
    params: Value,
) -> Option<Value> {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let response = http
        .post(format!("http://{addr}/"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await;
    let response = match response {
        Ok(r) => r,
        Err(e) => {
            if std::env::var("A2A_HOSTILE_DEBUG").is_ok() {
                eprintln!("{method}: {e:?}");
            }
            return None;
        }
    };
    response.json().await.ok()
}

/// A hostile client's call: the answer is read and dropped, unparsed (an
/// attacker need not parse what it asked for, and this process's CPU is
/// the server's too).
async fn call(http: &reqwest::Client, addr: SocketAddr, method: &str, params: Value) {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    if let Ok(response) = http
        .post(format!("http://{addr}/"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
    {
        response.bytes().await.ok();
    }
}

fn message(text: &str) -> Value {
    json!({"messageId": uuid::Uuid::new_v4().to_string(), "role": "ROLE_USER", "parts": [{"text": text}]})
}

/// The well-behaved workload for `length`: four clients each sending a
/// task and reading it back in a loop. Latencies of every call, and the
/// calls that failed.
async fn well_behaved(addr: SocketAddr, length: Duration) -> (Vec<Duration>, Vec<String>) {
    let end = Instant::now() + length;
    let workers = (0..4).map(|_| async move {
        let http = client("127.0.0.1", "alice-key");
        let (mut latencies, mut errors) = (Vec::new(), Vec::new());
        while Instant::now() < end {
            let start = Instant::now();
            let sent = rpc(
                &http,
                addr,
                "SendMessage",
                json!({"message": message("run the tests")}),
            )
            .await;
            latencies.push(start.elapsed());
            let Some(id) = sent
                .as_ref()
                .and_then(|a| a["result"]["task"]["id"].as_str())
                .map(str::to_owned)
            else {
                errors.push(format!("send: {sent:?}"));
                continue;
            };
            let start = Instant::now();
            let got = rpc(&http, addr, "GetTask", json!({"id": id})).await;
            latencies.push(start.elapsed());
            if got.as_ref().and_then(|a| a["result"]["id"].as_str()) != Some(id.as_str()) {
                errors.push(format!("get: {got:?}"));
            }
        }
        (latencies, errors)
    });
    let mut all = (Vec::new(), Vec::new());
    for (l, e) in futures_util::future::join_all(workers).await {
        all.0.extend(l);
        all.1.extend(e);
    }
    all
}

fn p99(latencies: &mut [Duration]) -> Duration {
    assert!(!latencies.is_empty(), "no call was made");
    latencies.sort();
    latencies[(latencies.len() * 99 / 100).min(latencies.len() - 1)]
}

/// Runs until `stop`: every hostile client of the issue, each from its own
/// address. `dead` are webhook hosts that accept and never answer.
async fn hostile(addr: SocketAddr, dead: Vec<SocketAddr>, per_peer: usize, stop: Arc<AtomicBool>) {
    // `A2A_HOSTILE_ONLY=silent,stalled,lister,webhooks,credentials` runs
    // some of them (to tell which costs what); all by default.
    let only = std::env::var("A2A_HOSTILE_ONLY").unwrap_or_default();
    let runs = |name: &str| only.is_empty() || only.split(',').any(|n| n == name);
    let mut tasks = tokio::task::JoinSet::new();
    // Silent connections from one address, up to (and past) its cap,
    // opened again as the server closes them.
    for _ in 0..if runs("silent") { per_peer + 4 } else { 0 } {
        let stop = stop.clone();
        tasks.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let socket = tokio::net::TcpSocket::new_v4().unwrap();
                socket.bind("127.0.0.3:0".parse().unwrap()).unwrap();
                if let Ok(mut tcp) = socket.connect(addr).await {
                    let mut buf = [0u8; 64];
                    let _ = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf)).await;
                } else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        });
    }
    // Stalled bodies, with a credential (so the server waits for them).
    for _ in 0..if runs("stalled") { 8 } else { 0 } {
        let stop = stop.clone();
        tasks.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let socket = tokio::net::TcpSocket::new_v4().unwrap();
                socket.bind("127.0.0.4:0".parse().unwrap()).unwrap();
                let Ok(mut tcp) = socket.connect(addr).await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let head = "POST / HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer hog-key\r\n\
                            Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{";
                let _ = tcp.write_all(head.as_bytes()).await;
                let mut buf = [0u8; 1024];
                while let Ok(Ok(n)) =
                    tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf)).await
                {
                    if n == 0 {
                        break;
                    }
                }
            }
        });
    }
    // A principal listing its huge tasks, four loops.
    for _ in 0..if runs("lister") { 4 } else { 0 } {
        let stop = stop.clone();
        tasks.spawn(async move {
            let http = client("127.0.0.6", "hog-key");
            while !stop.load(Ordering::Relaxed) {
                call(
                    &http,
                    addr,
                    "ListTasks",
                    json!({"pageSize": 100, "historyLength": 100}),
                )
                .await;
            }
        });
    }
    // Dead webhooks: the same principal's tasks notify hosts that never
    // answer.
    if runs("webhooks") {
        let stop = stop.clone();
        tasks.spawn(async move {
            let http = client("127.0.0.7", "hog-key");
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let hook = json!({"url": format!("http://{}/hook", dead[i % dead.len()])});
                let params = json!({
                    "message": message("run the tests"),
                    "configuration": {"returnImmediately": true, "taskPushNotificationConfig": hook}
                });
                call(&http, addr, "SendMessage", params).await;
            }
        });
    }
    // Bad credentials, in a loop.
    for _ in 0..if runs("credentials") { 2 } else { 0 } {
        let stop = stop.clone();
        tasks.spawn(async move {
            let http = client("127.0.0.5", "not-a-key");
            while !stop.load(Ordering::Relaxed) {
                call(&http, addr, "GetTask", json!({"id": "x"})).await;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
}

// Measured on this project's 2-core machine, 8 s runs. Release build:
// p99 1.1-1.8 ms alone, 1.7-2.5 ms beside every hostile client (1.3-1.9x).
// Debug build, dependencies at opt-level 2: 3.4-5.0 ms alone, 6.6-10.4 ms
// beside (1.3-2.5x); at opt-level 1 (Cargo.toml, since 2026-12-03):
// 3.7-6.0 ms alone, 3.7-4.1 ms beside (0.7-1.0x). Before the answers' byte
// budget (`service::pacing`), the refused connections' hold and the memory
// store's order per owner: release 1 ms alone, 23-38 ms beside (the huge
// listings 14-28 ms, silent connections reconnecting in a loop 5 ms, a
// principal listing among its thousands of small tasks 21 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn well_behaved_clients_keep_their_service_beside_hostile_ones() {
    let file = format!(
        "[[principal]]\nname = \"alice\"\napi_key_sha256 = \"{}\"\ntenants = [\"*\"]\nrole = \"user\"\n\
         [[principal]]\nname = \"hog\"\napi_key_sha256 = \"{}\"\ntenants = [\"*\"]\nrole = \"user\"\n",
        support::jwt::key_digest("alice-key"),
        support::jwt::key_digest("hog-key"),
    );
    let auth = Arc::new(Authenticator::parse(&file, std::path::Path::new(".")).unwrap());
    let manager = TaskManager::new(
        Arc::new(MemoryStore::new()),
        demo_router(),
        RuntimeConfig::default(),
    );
    let per_peer = 32;
    let limits = ConnectionLimits {
        max_connections_per_peer: per_peer,
        body_timeout: Duration::from_secs(1),
        handshake_timeout: Duration::from_secs(1),
        ..Default::default()
    };
    let security = a2a_lifecycle::server::Security {
        auth: Some(auth),
        ..Default::default()
    };
    let push = a2a_lifecycle::push::deliver::Settings {
        egress: a2a_lifecycle::push::egress::Egress::new(vec!["127.0.0.0/8".parse().unwrap()]),
        timeout: Duration::from_secs(3600),
        ..Default::default()
    };
    let server = a2a_lifecycle::server::Server::new(manager)
        .limits(limits)
        .security(security)
        .push(push);
    let server = TestServer::serve(server).await;
    let addr = server.addr;
    // The hog's huge tasks (2.5 MiB each), for its listings.
    let hog = client("127.0.0.6", "hog-key");
    let big = "x".repeat(5 << 19);
    for _ in 0..12 {
        let sent = within(
            "a huge task",
            rpc(&hog, addr, "SendMessage", json!({"message": message(&big)})),
        )
        .await;
        assert!(
            sent.is_some_and(|a| a.get("result").is_some()),
            "a huge task was not made"
        );
    }
    // Webhook hosts that accept and never answer.
    let mut dead = Vec::new();
    for _ in 0..40 {
        let black_hole = tokio::net::TcpListener::bind("127.0.0.8:0").await.unwrap();
        dead.push(black_hole.local_addr().unwrap());
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((tcp, _)) = black_hole.accept().await {
                held.push(tcp);
            }
        });
    }

    let length = seconds();
    let (mut alone, errors) = within("alone", well_behaved(addr, length)).await;
    assert!(errors.is_empty(), "errors alone: {errors:?}");
    let stop = Arc::new(AtomicBool::new(false));
    let hostiles = tokio::spawn(hostile(addr, dead, per_peer, stop.clone()));
    // The hostile clients take hold first.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (mut beside, errors) = within("beside", well_behaved(addr, length)).await;
    stop.store(true, Ordering::Relaxed);
    assert!(
        errors.is_empty(),
        "errors beside hostile clients: {errors:?}"
    );
    let calls = (alone.len(), beside.len());
    let (alone, beside) = (p99(&mut alone), p99(&mut beside));
    eprintln!("calls: alone {}, beside {}", calls.0, calls.1);
    eprintln!("well-behaved p99: alone {alone:?}, beside hostile clients {beside:?}");
    assert!(
        beside <= alone * 3,
        "p99 beside hostile clients {beside:?} > 3 x {alone:?} alone"
    );
    within("the hostile clients stop", hostiles).await.unwrap();
    server.stop().await;
}
