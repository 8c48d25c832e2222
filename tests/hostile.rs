//! Hostile callers (issue "hostile clients"), over real connections: what
//! a caller without credentials, or one bent on taking capacity or
//! learning what it should not, can make the server do. Each test names
//! the attack it stands for.

mod support;

use std::sync::Arc;
use std::time::Duration;

use a2a_lifecycle::agent::demo::demo_router;
use a2a_lifecycle::auth::Authenticator;
use a2a_lifecycle::connections::ConnectionLimits;
use a2a_lifecycle::runtime::{RuntimeConfig, TaskManager};
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
    let security = a2a_lifecycle::server::Security {
        auth: Some(authenticator()),
        ..Default::default()
    };
    TestServer::serve(manager, Default::default(), limits, security).await
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
