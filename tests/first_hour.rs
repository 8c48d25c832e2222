//! What the binary says when a newcomer gets something wrong: each
//! message names what was tried, why it failed, and the flag or step that
//! fixes it. Every test runs the real `a2a-lifecycle` binary
//! (`std::process::Command`), as a user at a terminal would.

use crate::support;

use std::process::{Command, Output, Stdio};

use support::certs::{Ca, scratch_dir};
use support::{BIN, KillOnDrop, WAIT, spawn_serve, spawn_serve_logged, wait_for_line};

/// Runs the binary with `args`; its output, within [`WAIT`] (killed past
/// it, so a hang fails the test instead of CI).
fn run(args: &[&str]) -> Output {
    run_env(args, &[])
}

fn run_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let child = Command::new(BIN)
        .args(args)
        .env("RUST_LOG", "info")
        .env_remove("A2A_TOKEN")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the binary");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(WAIT) {
        Ok(output) => output.expect("the binary's output"),
        Err(_) => {
            // SAFETY: kill(2) on the child's pid, which is not reaped yet.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!("{args:?} did not finish within {WAIT:?}")
        }
    }
}

/// The command's stderr, asserting that it failed.
fn failure(args: &[&str]) -> String {
    failure_env(args, &[])
}

fn failure_env(args: &[&str], env: &[(&str, &str)]) -> String {
    let out = run_env(args, env);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "{args:?} succeeded; stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    stderr
}

/// The command's stdout, asserting that it succeeded.
fn success(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn assert_says(text: &str, parts: &[&str]) {
    for part in parts {
        assert!(text.contains(part), "expected {part:?} in:\n{text}");
    }
}

/// A port nothing listens on (bound, then let go).
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

fn memory_server() -> (KillOnDrop, String) {
    let (child, url) = spawn_serve(&["--store", "memory"]);
    (KillOnDrop(child), url)
}

#[test]
fn a_connection_failure_names_the_address_and_the_cause() {
    let port = closed_port();
    let url = format!("http://127.0.0.1:{port}");
    let said = failure(&["get", "t-1", "--server", &url]);
    assert_says(
        &said,
        &[
            &url,
            "connection refused",
            "is the server running",
            "--server",
        ],
    );
    assert!(!said.contains("error: transport error\n"), "{said}");
}

#[test]
fn host_and_port_without_a_scheme_is_taken_as_http() {
    let (_server, url) = memory_server();
    let bare = url.trim_start_matches("http://");
    let out = success(&["send", "ping", "--server", bare]);
    assert_says(&out, &["pong"]);
}

#[test]
fn https_against_a_plaintext_server_says_so() {
    let (_server, url) = memory_server();
    let https = url.replace("http://", "https://");
    let said = failure(&["get", "t-1", "--server", &https]);
    assert_says(&said, &[&https, "TLS", "plain", &url]);
}

#[test]
fn an_untrusted_certificate_names_the_ca_flag() {
    let ca = Ca::new();
    let pair = ca.server();
    let dir = scratch_dir("first-hour-tls");
    std::fs::write(dir.join("chain.pem"), &pair.chain).unwrap();
    std::fs::write(dir.join("key.pem"), &pair.key).unwrap();
    let path = |name: &str| dir.join(name).to_str().unwrap().to_owned();
    let (child, url) = spawn_serve(&[
        "--store",
        "memory",
        "--tls-cert",
        &path("chain.pem"),
        "--tls-key",
        &path("key.pem"),
    ]);
    let _server = KillOnDrop(child);
    let https = url.replace("http://127.0.0.1", "https://localhost");
    let said = failure(&["get", "t-1", "--server", &https]);
    assert_says(&said, &[&https, "certificate", "unknown", "--ca-cert"]);
}

#[test]
fn a_task_not_found_names_the_tenant_searched_and_never_another() {
    let (_server, url) = memory_server();
    let task: serde_json::Value = serde_json::from_str(&success(&[
        "send",
        "--tenant",
        "code-reviewer",
        "review this",
        "--server",
        &url,
    ]))
    .unwrap();
    let id = task["task"]["id"].as_str().expect("a task id").to_owned();
    let said = failure(&["get", &id, "--server", &url]);
    assert_says(&said, &["NOT_FOUND", &id, "the default agent", "--tenant"]);
    // Whether the task exists under another tenant is not said.
    assert!(!said.contains("code-reviewer"), "{said}");
    let said = failure(&["get", &id, "--tenant", "deployer", "--server", &url]);
    assert_says(&said, &[&id, "\"deployer\"", "--tenant"]);
    assert!(!said.contains("code-reviewer"), "{said}");
}

#[test]
fn a_server_with_auth_tells_the_cli_user_about_token_not_a_header() {
    let dir = scratch_dir("first-hour-auth");
    std::fs::write(
        dir.join("auth.toml"),
        format!(
            "[[principal]]\nname = \"alice\"\napi_key_sha256 = \"{}\"\ntenants = [\"*\"]\nrole = \"user\"\n",
            "0".repeat(64)
        ),
    )
    .unwrap();
    let (child, url) = spawn_serve(&[
        "--store",
        "memory",
        "--auth",
        dir.join("auth.toml").to_str().unwrap(),
    ]);
    let _server = KillOnDrop(child);
    let said = failure(&["send", "ping", "--server", &url]);
    assert_says(&said, &["UNAUTHENTICATED", "--token", "A2A_TOKEN"]);
    assert!(!said.contains("authorization:"), "{said}");
    let said = failure_env(
        &["send", "ping", "--server", &url],
        &[("A2A_TOKEN", "wrong")],
    );
    assert_says(&said, &["UNAUTHENTICATED", "--token", "A2A_TOKEN"]);
}

#[test]
fn a_mutual_tls_server_tells_a_client_without_a_certificate_to_present_one() {
    let ca = Ca::new();
    let pair = ca.server();
    let dir = scratch_dir("first-hour-mtls");
    for (name, pem) in [
        ("ca.pem", ca.pem()),
        ("chain.pem", pair.chain),
        ("key.pem", pair.key),
    ] {
        std::fs::write(dir.join(name), pem).unwrap();
    }
    let path = |name: &str| dir.join(name).to_str().unwrap().to_owned();
    let (child, url) = spawn_serve(&[
        "--store",
        "memory",
        "--tls-cert",
        &path("chain.pem"),
        "--tls-key",
        &path("key.pem"),
        "--tls-client-ca",
        &path("ca.pem"),
    ]);
    let _server = KillOnDrop(child);
    let https = url.replace("http://127.0.0.1", "https://localhost");
    let said = failure(&[
        "send",
        "ping",
        "--server",
        &https,
        "--ca-cert",
        &path("ca.pem"),
    ]);
    assert_says(
        &said,
        &[
            "UNAUTHENTICATED",
            "client certificate",
            "--client-cert",
            "--client-key",
        ],
    );
    assert!(!said.contains("authorization:"), "{said}");
}

#[test]
fn a_loopback_webhook_names_the_flag_that_allows_it() {
    let (_server, url) = memory_server();
    let said = failure(&[
        "send",
        "run the tests",
        "--push-url",
        "http://127.0.0.1:9090/",
        "--server",
        &url,
    ]);
    assert_says(&said, &["127.0.0.1", "--push-allow-cidr 127.0.0.0/8"]);
}

#[test]
fn top_against_a_server_without_metrics_says_so() {
    let (child, url) = spawn_serve(&["--store", "memory", "--no-metrics"]);
    let _server = KillOnDrop(child);
    let said = failure(&["top", "--once", "--server", &url]);
    assert_says(&said, &["--no-metrics", &url]);
}

#[test]
fn top_has_no_tenant_flag_and_the_tenant_help_lists_every_agent() {
    let said = failure(&["top", "--once", "--tenant", "deployer"]);
    assert_says(&said, &["--tenant"]);
    let help = success(&["send", "--help"]);
    for agent in [
        "test-runner",
        "code-reviewer",
        "deployer",
        "conformance",
        "bench",
    ] {
        assert_says(&help, &[agent]);
    }
}

/// Holds a port, so a listener asked to bind it fails.
fn taken() -> (std::net::TcpListener, String) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    (listener, addr)
}

#[test]
fn a_port_already_taken_names_the_address_and_the_listener() {
    let (_held, addr) = taken();
    let said = failure(&["serve", "--store", "memory", "--listen", &addr]);
    assert_says(&said, &[&addr, "--listen", "already in use"]);

    let said = failure(&[
        "serve",
        "--store",
        "memory",
        "--listen",
        "127.0.0.1:0",
        "--metrics-listen",
        &addr,
    ]);
    assert_says(&said, &[&addr, "--metrics-listen", "already in use"]);

    let port = addr.rsplit(':').next().unwrap();
    let said = failure(&["push", "listen", "--port", port]);
    assert_says(&said, &[&addr, "--port", "already in use"]);
}

#[test]
fn flag_values_are_checked_at_start_with_the_form_expected() {
    let said = failure(&["serve", "--store", "memory", "--retain", "never"]);
    assert_says(&said, &["--retain", "never", "off", "7d"]);

    let said = failure(&[
        "serve",
        "--store",
        "memory",
        "--push-allow-cidr",
        "127.0.0.1",
    ]);
    assert_says(&said, &["--push-allow-cidr", "127.0.0.1/32"]);

    let said = failure(&[
        "serve",
        "--store",
        "memory",
        "--listen",
        "127.0.0.1:0",
        "--max-connections",
        "0",
    ]);
    assert_says(&said, &["--max-connections", "0"]);

    for bad in [
        "not a url",
        "ftp://example.com:21",
        "https://",
        "example.com/a2a?x=1",
    ] {
        let said = failure(&[
            "serve",
            "--store",
            "memory",
            "--listen",
            "127.0.0.1:0",
            "--public-url",
            bad,
        ]);
        assert_says(&said, &["--public-url", "HOST:PORT", "https://"]);
    }
    // The forms the README gives are served.
    for good in [
        "a2a.example.com:443",
        "https://a2a.example.com",
        "127.0.0.1:8080",
    ] {
        let (child, _) = spawn_serve(&["--store", "memory", "--public-url", good]);
        drop(KillOnDrop(child));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_errors_name_the_host_and_database_once() {
    let Some(url) = support::postgres::database().await else {
        return;
    };
    let config: tokio_postgres::Config = url.parse().unwrap();
    let mut missing = config.clone();
    missing.dbname("a2a_no_such_database");
    let missing = support::postgres::url_of(&missing);
    let said = tokio::task::spawn_blocking(move || {
        failure(&["serve", "--listen", "127.0.0.1:0", "--store", &missing])
    })
    .await
    .unwrap();
    assert_says(
        &said,
        &["127.0.0.1:5432", "a2a_no_such_database", "does not exist"],
    );
    assert_eq!(said.matches("db error").count(), 0, "{said}");
    assert_eq!(said.matches("does not exist").count(), 1, "{said}");

    let refused = format!("postgres://postgres@127.0.0.1:{}/test", closed_port());
    let port = refused
        .rsplit(':')
        .next()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let said = tokio::task::spawn_blocking(move || {
        failure(&["serve", "--listen", "127.0.0.1:0", "--store", &refused])
    })
    .await
    .unwrap();
    assert_says(
        &said,
        &[&format!("127.0.0.1:{port}"), "\"test\"", "refused"],
    );
    assert!(
        said.matches("error connecting to server").count() <= 1,
        "{said}"
    );
}

/// `serve ARGS` until it says it serves the console: every log line up
/// to there, the start-up's.
fn start_up_log(args: &[&str]) -> Vec<String> {
    use std::io::BufRead;
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn serve");
    let stderr = child.stderr.take().unwrap();
    let _child = KillOnDrop(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let mut log = Vec::new();
    loop {
        let line = rx
            .recv_timeout(WAIT)
            .unwrap_or_else(|e| panic!("serve did not start ({e}):\n{}", log.join("\n")));
        let done = line.contains("serving the console");
        log.push(line);
        if done {
            return log;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_start_on_postgres_logs_no_notice_at_info() {
    let Some(store) = support::postgres::fresh_schema().await else {
        return;
    };
    for start in ["first", "second"] {
        let store = store.clone();
        let log = tokio::task::spawn_blocking(move || start_up_log(&["--store", &store]))
            .await
            .unwrap();
        assert!(
            log.iter().any(|l| l.contains("task store: postgres")),
            "{}",
            log.join("\n")
        );
        assert!(
            log.iter().all(|l| !l.contains("NOTICE")),
            "{start} start:\n{}",
            log.join("\n")
        );
    }
}

#[test]
fn log_lines_print_peers_as_addresses() {
    let dir = scratch_dir("first-hour-peer");
    std::fs::write(
        dir.join("auth.toml"),
        format!(
            "[[principal]]\nname = \"alice\"\napi_key_sha256 = \"{}\"\ntenants = [\"*\"]\nrole = \"user\"\n",
            "0".repeat(64)
        ),
    )
    .unwrap();
    let (child, url, lines) = spawn_serve_logged(&[
        "--store",
        "memory",
        "--auth",
        dir.join("auth.toml").to_str().unwrap(),
    ]);
    let _server = KillOnDrop(child);
    failure(&["send", "ping", "--server", &url]);
    let line = wait_for_line(&lines, "authentication failed");
    assert_says(&line, &["peer=127.0.0.1:"]);
    assert!(!line.contains("Some("), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_port_serves_reflection_of_its_health_service() {
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let ops = closed_port();
    let ops_addr = format!("127.0.0.1:{ops}");
    let (child, _) = spawn_serve(&["--store", "memory", "--metrics-listen", &ops_addr]);
    let _server = KillOnDrop(child);
    let channel = support::within(
        "connect to --metrics-listen",
        tonic::transport::Channel::from_shared(format!("http://{ops_addr}"))
            .unwrap()
            .connect(),
    )
    .await
    .unwrap();
    let mut client = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = support::within(
        "reflection",
        client.server_reflection_info(tokio_stream::iter([request])),
    )
    .await
    .expect("reflection served on --metrics-listen")
    .into_inner();
    let list = support::within("reflection answer", responses.message())
        .await
        .unwrap()
        .expect("an answer");
    let Some(MessageResponse::ListServicesResponse(services)) = list.message_response else {
        panic!("{list:?}")
    };
    let names: Vec<_> = services.service.iter().map(|s| s.name.as_str()).collect();
    assert!(names.contains(&"grpc.health.v1.Health"), "{names:?}");
    // Only what that port serves: no A2A service there.
    assert!(!names.contains(&"lf.a2a.v1.A2AService"), "{names:?}");
}

/// The value of the series `name{labels}` in a scrape; panics when the
/// series is absent (a rename must fail, not read as 0).
fn series(scrape: &str, name: &str, labels: &str) -> f64 {
    let wanted = format!("{name}{{{labels}}} ");
    let bare = format!("{name} ");
    scrape
        .lines()
        .find_map(|l| {
            l.strip_prefix(&wanted)
                .or_else(|| labels.is_empty().then(|| l.strip_prefix(&bare)).flatten())
        })
        .unwrap_or_else(|| panic!("no series {wanted:?} in:\n{scrape}"))
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_submitted_and_show_every_counter_from_the_start() {
    let ops = closed_port();
    let ops_addr: std::net::SocketAddr = format!("127.0.0.1:{ops}").parse().unwrap();
    let (child, url) = spawn_serve(&[
        "--store",
        "memory",
        "--metrics-listen",
        &ops_addr.to_string(),
    ]);
    let _server = KillOnDrop(child);
    let fresh = support::http_get(ops_addr, "/metrics", &[]).await.body;
    for reason in [
        "missing",
        "malformed",
        "unknown_key",
        "unknown_certificate",
        "invalid_token",
    ] {
        for route in ["grpc", "jsonrpc", "http-json", "metrics"] {
            assert_eq!(
                series(
                    &fresh,
                    "a2a_auth_failures_total",
                    &format!("reason=\"{reason}\",route=\"{route}\"")
                ),
                0.0
            );
        }
    }
    for outcome in ["delivered", "refused", "given_up", "dropped", "shed"] {
        assert_eq!(
            series(
                &fresh,
                "a2a_push_deliveries_total",
                &format!("outcome=\"{outcome}\"")
            ),
            0.0
        );
    }
    tokio::task::spawn_blocking(move || success(&["send", "run the tests", "--server", &url]))
        .await
        .unwrap();
    let after = support::http_get(ops_addr, "/metrics", &[]).await.body;
    for state in ["SUBMITTED", "WORKING", "COMPLETED"] {
        assert_eq!(
            series(
                &after,
                "a2a_task_states_total",
                &format!("agent=\"test-runner\",state=\"TASK_STATE_{state}\"")
            ),
            1.0,
            "{state}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_metrics_scrape_is_counted_as_an_auth_failure() {
    let dir = scratch_dir("first-hour-metrics-auth");
    std::fs::write(
        dir.join("auth.toml"),
        format!(
            "[[principal]]\nname = \"alice\"\napi_key_sha256 = \"{}\"\ntenants = [\"*\"]\nrole = \"user\"\n",
            "0".repeat(64)
        ),
    )
    .unwrap();
    let (child, url) = spawn_serve(&[
        "--store",
        "memory",
        "--auth",
        dir.join("auth.toml").to_str().unwrap(),
    ]);
    let _server = KillOnDrop(child);
    let addr: std::net::SocketAddr = url.trim_start_matches("http://").parse().unwrap();
    let refused = support::http_get(addr, "/metrics", &[]).await;
    assert_eq!(refused.status, 401, "{}", refused.body);
    // Read where it needs no credentials: the A2A port refuses it.
    let ops = closed_port();
    drop(_server);
    let ops_addr: std::net::SocketAddr = format!("127.0.0.1:{ops}").parse().unwrap();
    let (child, url) = spawn_serve(&[
        "--store",
        "memory",
        "--auth",
        dir.join("auth.toml").to_str().unwrap(),
        "--metrics-listen",
        &ops_addr.to_string(),
    ]);
    let _server = KillOnDrop(child);
    let addr: std::net::SocketAddr = url.trim_start_matches("http://").parse().unwrap();
    let refused = support::http_get(addr, "/metrics", &[]).await;
    assert_eq!(refused.status, 401, "{}", refused.body);
    let scrape = support::http_get(ops_addr, "/metrics", &[]).await.body;
    // Counted apart from refused A2A calls: a scraper left without its
    // token is not a caller guessing keys.
    assert_eq!(
        series(
            &scrape,
            "a2a_auth_failures_total",
            "reason=\"missing\",route=\"metrics\""
        ),
        1.0
    );
    assert_eq!(
        series(
            &scrape,
            "a2a_auth_failures_total",
            "reason=\"missing\",route=\"grpc\""
        ),
        0.0
    );
}

#[test]
fn an_empty_message_text_is_refused_before_sending() {
    let (_server, url) = memory_server();
    for empty in ["", "  \n"] {
        let said = failure(&["send", empty, "--server", &url]);
        assert_says(&said, &["empty", "text"]);
    }
    // Nothing was sent: the server holds no task.
    let list = success(&["list", "--server", &url]);
    assert!(!list.contains("\"id\""), "{list}");
}

/// docs/conformance.md says what the conformance agent does; its
/// chunked-artifact row agrees with the stream that
/// `conformance_agent::chunked_artifact_streams_two_chunks_of_one_artifact_then_assembles_them`
/// checks (the first chunk opens the artifact, the second appends).
#[test]
fn the_conformance_doc_describes_the_chunked_artifact_as_streamed() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/conformance.md"))
        .unwrap();
    let row = doc
        .lines()
        .find(|l| l.starts_with("| `tck-stream-artifact-chunked`"))
        .expect("a row for tck-stream-artifact-chunked");
    assert_says(
        row,
        &[
            "the first opens it (no `append`)",
            "the second has `append` and `last_chunk`",
        ],
    );
    assert!(!row.contains("two `append` chunks"), "{row}");
}
