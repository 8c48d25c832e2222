//! Hostile callers (issue "hostile clients"), over real connections: what
//! a caller without credentials, or one bent on taking capacity or
//! learning what it should not, can make the server do. Each test names
//! the attack it stands for.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use a2a_lifecycle::agent::demo::demo_router;
use a2a_lifecycle::auth::Authenticator;
use a2a_lifecycle::connections::ConnectionLimits;
use a2a_lifecycle::runtime::{RuntimeConfig, TaskManager};
use a2a_lifecycle::server::{Security, Server};
use a2a_lifecycle::store::MemoryStore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use support::{TestServer, within};

const KEY: &str = "a-key";

fn authenticator() -> Arc<Authenticator> {
    let file = format!(
        "[[principal]]\nname = \"alice\"\napi_key_sha256 = \"{}\"\ntenants = [\"*\"]\nrole = \"user\"\n",
        support::jwt::key_digest(KEY),
    );
    Arc::new(Authenticator::parse(&file, std::path::Path::new(".")).unwrap())
}

/// The demo agents behind `--auth`, with `limits`.
async fn serve(limits: ConnectionLimits) -> TestServer {
    let manager = TaskManager::new(
        Arc::new(MemoryStore::new()),
        demo_router(),
        RuntimeConfig::default(),
    );
    let security = Security {
        auth: Some(authenticator()),
        ..Default::default()
    };
    TestServer::serve(Server::new(manager).limits(limits).security(security)).await
}

/// The limits of a server that would wait as long as a caller likes for
/// a body: what the server does before the body is its own choice.
fn patient() -> ConnectionLimits {
    ConnectionLimits {
        body_timeout: Duration::from_secs(3600),
        handshake_timeout: Duration::from_secs(3600),
        idle_timeout: Duration::from_secs(3600),
        ..Default::default()
    }
}

/// The status line and headers of the answer to an HTTP/1.1 request
/// whose headers promise a body that never comes.
async fn http1_without_body(
    server: &TestServer,
    path: &str,
    authorization: Option<&str>,
) -> String {
    let mut tcp = TcpStream::connect(server.addr).await.unwrap();
    let auth = authorization
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n{auth}Content-Length: 1000000\r\n\r\n"
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = within("an answer before the body", tcp.read(&mut buf))
        .await
        .unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// The gRPC status of a call whose metadata arrives and whose message
/// never does.
async fn grpc_without_body(server: &TestServer, path: &str) -> Option<String> {
    let tcp = TcpStream::connect(server.addr).await.unwrap();
    let (send, conn) = within("h2 handshake", h2::client::handshake(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut send = within("h2 ready", send.ready()).await.unwrap();
    let request = http::Request::post(format!("http://{}{path}", server.addr))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (response, _body) = send.send_request(request, false).unwrap();
    let response = within("an answer before the message", response)
        .await
        .unwrap();
    response
        .headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap().to_owned())
}

/// Authentication comes from the headers alone: a call without
/// credentials is refused before its body is read, on every binding and
/// both protocol versions, so it makes the server read and hold nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_without_credentials_is_refused_before_its_body() {
    let server = serve(patient()).await;
    for path in [
        "/lf.a2a.v1.A2AService/SendMessage",
        "/a2a.v1.A2AService/SendMessage",
    ] {
        assert_eq!(
            grpc_without_body(&server, path).await.as_deref(),
            Some("16"),
            "{path}: not UNAUTHENTICATED before the message"
        );
    }
    for path in ["/", "/message:send", "/v1/message:send", "/code-reviewer"] {
        let answer = http1_without_body(&server, path, None).await;
        assert!(answer.starts_with("HTTP/1.1 401"), "{path}: {answer}");
        let wrong = http1_without_body(&server, path, Some("Bearer wrong-key")).await;
        assert!(wrong.starts_with("HTTP/1.1 401"), "{path}: {wrong}");
    }
    // With its key, a caller is waited for: its whole request is served.
    let http = support::web::Http::new(server.addr).with_header("authorization", "Bearer a-key");
    let answer = http
        .rpc(
            "SendMessage",
            serde_json::json!({"message": support::web::message("run the tests")}),
        )
        .await;
    assert_eq!(
        answer.result()["task"]["status"]["state"],
        "TASK_STATE_COMPLETED",
        "{:?}",
        answer.body
    );
    server.stop().await;
}

/// Nothing a caller sends reaches a log line, a span or an error
/// unbounded: a megabyte tenant or task id, or a JWT naming a key id of
/// kilobytes, come back and go to the log cut to a few hundred bytes.
#[test]
fn what_a_caller_sends_reaches_logs_and_errors_cut_short() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("hostile-echo");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("auth.toml");
    let jwks = support::jwt::fixtures().join("jwks.json");
    std::fs::write(
        &file,
        format!(
            "[[principal]]\nname = \"bob\"\napi_key_sha256 = \"{}\"\ntenants = [\"deployer\"]\nrole = \"user\"\n\
             [jwt]\nissuer = \"{}\"\naudience = \"{}\"\njwks_file = {:?}\ntenants_claim = \"tenants\"\nadmin_claim = \"a2a_admin\"\n",
            support::jwt::key_digest("bob-key"),
            support::jwt::ISSUER,
            support::jwt::AUDIENCE,
            jwks.to_str().unwrap(),
        ),
    )
    .unwrap();
    let (child, url, log) =
        support::spawn_serve_logged(&["--store", "memory", "--auth", file.to_str().unwrap()]);
    let _server = support::KillOnDrop(child);
    let addr: std::net::SocketAddr = url.trim_start_matches("http://").parse().unwrap();
    let long = "x".repeat(1 << 20);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let bodies = runtime.block_on(async {
        let bob = support::web::Http::new(addr).with_header("authorization", "Bearer bob-key");
        let mut bodies = Vec::new();
        // A tenant bob may not use, a megabyte long.
        let denied = bob
            .rpc("GetTask", serde_json::json!({"tenant": long, "id": "t"}))
            .await;
        bodies.push(denied.body.clone());
        // A task id a megabyte long.
        let invalid = bob
            .rpc_at("/deployer", "GetTask", serde_json::json!({"id": long}))
            .await;
        bodies.push(invalid.body.clone());
        // A token naming a key id of 3 KB (under the credential's limit).
        let claims = support::jwt::claims("mallory", |_| {});
        let token = support::jwt::sign(
            jsonwebtoken::Algorithm::RS256,
            &"k".repeat(3000),
            "rs256-test-key.pem",
            &claims,
        );
        let forged = support::web::Http::new(addr)
            .with_header("authorization", &format!("Bearer {token}"))
            .rpc("GetTask", serde_json::json!({"id": "t"}))
            .await;
        bodies.push(forged.body.clone());
        bodies
    });
    for body in &bodies {
        let text = body.to_string();
        assert!(
            text.len() < 4096,
            "an answer of {} bytes: {}",
            text.len(),
            &text[..300]
        );
    }
    // The log lines these calls made, each short.
    let mut seen = Vec::new();
    for wanted in ["tenant not permitted", "authentication failed"] {
        seen.push(support::wait_for_line(&log, wanted));
    }
    for line in &seen {
        assert!(line.len() < 4096, "a log line of {} bytes", line.len());
        assert!(!line.contains(&"k".repeat(1000)), "{}", &line[..300]);
    }
    // The lines are the ones these calls made: the tenant and the key id,
    // each cut.
    assert!(seen[0].contains(&"x".repeat(200)), "{}", seen[0]);
    assert!(
        seen[1].contains(&format!("unknown key \"{}", "k".repeat(200))),
        "{}",
        seen[1]
    );
}

/// The demo agents on a memory store behind `--auth` with the principals
/// of the auth `file`, and `limits`.
async fn server_with_principals(file: &str, limits: ConnectionLimits) -> TestServer {
    let auth = Arc::new(Authenticator::parse(file, std::path::Path::new(".")).unwrap());
    let manager = TaskManager::new(
        Arc::new(MemoryStore::new()),
        demo_router(),
        RuntimeConfig::default(),
    );
    let security = Security {
        auth: Some(auth),
        ..Default::default()
    };
    TestServer::serve(Server::new(manager).limits(limits).security(security)).await
}

/// A principal's `max_open_tasks` (its auth file entry): a message that
/// would open one more of its tasks is RESOURCE_EXHAUSTED (limit
/// `MAX_OPEN_TASKS`) on every binding, another principal is not held
/// back, and once one of its tasks ends it may start another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_principal_opens_at_most_its_quota_of_tasks() {
    let file = format!(
        "[[principal]]\nname = \"bob\"\napi_key_sha256 = \"{}\"\ntenants = [\"code-reviewer\"]\nrole = \"user\"\nmax_open_tasks = 2\n\
         [[principal]]\nname = \"alice\"\napi_key_sha256 = \"{}\"\ntenants = [\"code-reviewer\"]\nrole = \"user\"\n",
        support::jwt::key_digest("bob-key"),
        support::jwt::key_digest("alice-key"),
    );
    let server = server_with_principals(&file, Default::default()).await;
    let as_ = |key: &str| {
        support::web::Http::new(server.addr).with_header("authorization", &format!("Bearer {key}"))
    };
    let (bob, alice) = (as_("bob-key"), as_("alice-key"));
    // The code reviewer asks for input: each task stays open.
    let review = || serde_json::json!({"message": support::web::message("review my change")});
    let mut open = Vec::new();
    for _ in 0..2 {
        let answer = bob.rpc_at("/code-reviewer", "SendMessage", review()).await;
        let task = &answer.result()["task"];
        assert_eq!(
            task["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
            "{task}"
        );
        open.push(task["id"].as_str().unwrap().to_owned());
    }
    let refused = bob.rpc_at("/code-reviewer", "SendMessage", review()).await;
    assert_eq!(
        refused.error_info()["reason"],
        "RESOURCE_EXHAUSTED",
        "{:?}",
        refused.body
    );
    assert_eq!(refused.error_info()["metadata"]["limit"], "MAX_OPEN_TASKS");
    let over_rest = bob
        .rest("POST", "/code-reviewer/message:send", Some(review()))
        .await;
    assert_eq!(over_rest.status, 429, "{:?}", over_rest.body);
    // Alice is not held back by bob's quota.
    let hers = alice
        .rpc_at("/code-reviewer", "SendMessage", review())
        .await;
    assert_eq!(
        hers.result()["task"]["status"]["state"],
        "TASK_STATE_INPUT_REQUIRED"
    );
    // One of bob's ends: he may open another.
    let canceled = bob
        .rpc_at(
            "/code-reviewer",
            "CancelTask",
            serde_json::json!({"id": open[0]}),
        )
        .await;
    assert_eq!(canceled.result()["status"]["state"], "TASK_STATE_CANCELED");
    let again = bob.rpc_at("/code-reviewer", "SendMessage", review()).await;
    assert_eq!(
        again.result()["task"]["status"]["state"],
        "TASK_STATE_INPUT_REQUIRED"
    );
    server.stop().await;
}

/// A principal's `max_input_wait`: its tasks waiting for input longer
/// fail (with a message saying why) when the sweep runs; a task of a
/// principal without the limit, and one that has waited less, are left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_waiting_past_their_owners_limit_fail() {
    use a2a_lifecycle::proto::TaskState;
    use a2a_lifecycle::runtime::MessageRequest;
    use a2a_lifecycle::store::{Caller, Quota};
    let manager = TaskManager::new(
        Arc::new(MemoryStore::new()),
        demo_router(),
        RuntimeConfig::default(),
    );
    let hour = Duration::from_secs(3600);
    let bob = Caller {
        name: "bob".into(),
        own_tasks_only: true,
        quota: Quota {
            max_input_wait: Some(hour),
            ..Quota::NONE
        },
    };
    let alice = Caller {
        name: "alice".into(),
        own_tasks_only: true,
        ..Caller::ANONYMOUS
    };
    let review = || MessageRequest::from(support::user_message("review my change"));
    let bobs = support::run_to_rest(&manager, "code-reviewer", &bob, review()).await;
    let alices = support::run_to_rest(&manager, "code-reviewer", &alice, review()).await;
    assert_eq!(support::state_of(&bobs), TaskState::InputRequired);
    let wait_of = |owner: &str| (owner == "bob").then_some(hour);
    let now = std::time::SystemTime::now();
    // Not yet an hour.
    let early = within(
        "sweep",
        manager.expire_input_waits(now + hour / 2, hour, wait_of),
    )
    .await
    .unwrap();
    assert_eq!(early, 0);
    let late = within(
        "sweep",
        manager.expire_input_waits(now + 2 * hour, hour, wait_of),
    )
    .await
    .unwrap();
    assert_eq!(late, 1);
    let history = a2a_lifecycle::lifecycle::HistoryLength::default();
    let bobs = manager
        .get_task("code-reviewer", &bob, &bobs.id, history)
        .await
        .unwrap();
    assert_eq!(support::state_of(&bobs), TaskState::Failed);
    let said = format!("{:?}", bobs.status.unwrap().message);
    assert!(said.contains("max_input_wait"), "{said}");
    let alices = manager
        .get_task("code-reviewer", &alice, &alices.id, history)
        .await
        .unwrap();
    assert_eq!(support::state_of(&alices), TaskState::InputRequired);
}

/// The auth file's quotas are checked when it loads: a zero task limit or
/// a wait that is no duration is refused, with the principal named.
#[test]
fn quotas_that_make_no_sense_are_refused_at_load() {
    let entry = |extra: &str| {
        format!(
            "[[principal]]\nname = \"bob\"\napi_key_sha256 = \"{}\"\ntenants = [\"*\"]\nrole = \"user\"\n{extra}\n",
            support::jwt::key_digest("k")
        )
    };
    let load = |text: String| Authenticator::parse(&text, std::path::Path::new("."));
    let zero = load(entry("max_open_tasks = 0")).unwrap_err();
    assert!(
        zero.contains("bob") && zero.contains("max_open_tasks"),
        "{zero}"
    );
    let vague = load(entry("max_input_wait = \"a while\"")).unwrap_err();
    assert!(vague.contains("max_input_wait"), "{vague}");
    let fine = load(entry("max_open_tasks = 3\nmax_input_wait = \"90m\"")).unwrap();
    let quota = fine.quota_of("bob");
    assert_eq!(quota.max_open_tasks, Some(3));
    assert_eq!(quota.max_input_wait, Some(Duration::from_secs(5400)));
    assert_eq!(fine.shortest_input_wait(), Some(Duration::from_secs(5400)));
    assert_eq!(fine.quota_of("stranger"), Default::default());
}

/// A principal reading its huge tasks again and again is paced to its
/// budget of bytes a second (`--read-bytes-per-second`), on every binding,
/// while another principal's reads go on unpaced: without it, each read
/// of a task of megabytes is milliseconds of a core, and a loop of them
/// takes the core from everyone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_principal_reading_huge_tasks_is_paced_and_others_are_not() {
    let file = format!(
        "[[principal]]\nname = \"hog\"\napi_key_sha256 = \"{}\"\ntenants = [\"*\"]\nrole = \"user\"\n\
         [[principal]]\nname = \"alice\"\napi_key_sha256 = \"{}\"\ntenants = [\"*\"]\nrole = \"user\"\n",
        support::jwt::key_digest("hog-key"),
        support::jwt::key_digest("alice-key"),
    );
    // Half a MiB a second: a 1 MiB task is two seconds of budget, the
    // burst (`pacing::READ_BURST`) two seconds.
    let limits = ConnectionLimits {
        read_bytes_per_second: 512 << 10,
        ..Default::default()
    };
    let server = server_with_principals(&file, limits).await;
    let as_ = |key: &str| {
        support::web::Http::new(server.addr).with_header("authorization", &format!("Bearer {key}"))
    };
    let (hog, alice) = (as_("hog-key"), as_("alice-key"));
    let big = "x".repeat(1 << 20);
    let sent = hog
        .rpc(
            "SendMessage",
            serde_json::json!({"message": support::web::message(&big)}),
        )
        .await;
    let huge = sent.result()["task"]["id"].as_str().unwrap().to_owned();
    let sent = alice
        .rpc(
            "SendMessage",
            serde_json::json!({"message": support::web::message("run the tests")}),
        )
        .await;
    let small = sent.result()["task"]["id"].as_str().unwrap().to_owned();
    // The hog's reads go through until its burst is spent, then wait.
    let mut unpaced = 0;
    loop {
        let start = std::time::Instant::now();
        let got = hog.rpc("GetTask", serde_json::json!({"id": huge})).await;
        assert_eq!(got.result()["id"], huge.as_str());
        if start.elapsed() >= Duration::from_secs(1) {
            break;
        }
        unpaced += 1;
        assert!(unpaced < 20, "{unpaced} reads of a 1 MiB task, none paced");
    }
    // The hog's next read, over HTTP+JSON, waits for its budget; alice's
    // reads, over JSON-RPC and HTTP+JSON, are answered meanwhile.
    let path = format!("/tasks/{huge}");
    let waiting = tokio::spawn(async move { hog.rest("GET", &path, None).await });
    for _ in 0..3 {
        let got = alice.rpc("GetTask", serde_json::json!({"id": small})).await;
        assert_eq!(got.result()["id"], small.as_str());
        let got = alice.rest("GET", &format!("/tasks/{small}"), None).await;
        assert_eq!(got.body["id"], small.as_str(), "{:?}", got.body);
    }
    assert!(
        !waiting.is_finished(),
        "the hog's read was not paced behind its budget"
    );
    let got = within("the hog's paced read", waiting).await.unwrap();
    assert_eq!(got.body["id"], huge.as_str());
    server.stop().await;
}
