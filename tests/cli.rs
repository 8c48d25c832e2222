//! The `a2a-lifecycle` binary: `serve` on an ephemeral port, the client
//! subcommands against it, and a clean exit on SIGTERM.

use crate::support;

use std::process::Command;

use serde_json::Value;

use support::{BIN, KillOnDrop, spawn_serve, spawn_serve_logged, wait_for_line};

fn start_server() -> (std::process::Child, String) {
    spawn_serve(&["--store", "memory"])
}

fn client(server: &str, args: &[&str]) -> String {
    let out = Command::new(BIN)
        .args(args)
        .args(["--server", server])
        .output()
        .expect("run client");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn serve_answers_the_client_subcommands_and_exits_cleanly_on_sigterm() {
    let (mut child, server) = start_server();

    // Responses print as ProtoJSON (spec §5.5).
    let out: Value = serde_json::from_str(&client(&server, &["send", "ping"])).unwrap();
    assert_eq!(out["message"]["parts"][0]["text"], "pong", "{out}");
    assert_eq!(out["message"]["role"], "ROLE_AGENT", "{out}");

    let out: Value = serde_json::from_str(&client(&server, &["send", "run the tests"])).unwrap();
    assert_eq!(
        out["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{out}"
    );
    assert_eq!(out["task"]["artifacts"][0]["name"], "test-report", "{out}");

    let out = client(
        &server,
        &[
            "send",
            "--stream",
            "--tenant",
            "deployer",
            "deploy to staging",
        ],
    );
    // A stream prints one JSON object per event.
    let states: Vec<String> = out
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .filter_map(|event| {
            let status = event
                .get("task")
                .and_then(|t| t.get("status"))
                .or_else(|| event.get("statusUpdate").and_then(|u| u.get("status")))?;
            Some(status["state"].as_str()?.to_owned())
        })
        .collect();
    assert_eq!(
        states,
        [
            "TASK_STATE_SUBMITTED",
            "TASK_STATE_AUTH_REQUIRED",
            "TASK_STATE_WORKING",
            "TASK_STATE_COMPLETED"
        ],
        "{out}"
    );

    // `list --state` accepts the 0.3 name as well as the ProtoJSON name.
    let out: Value =
        serde_json::from_str(&client(&server, &["list", "--state", "completed"])).unwrap();
    assert_eq!(out["totalSize"], 1, "{out}");
    let out = client(
        &server,
        &[
            "list",
            "--tenant",
            "deployer",
            "--state",
            "TASK_STATE_COMPLETED",
        ],
    );
    let out: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(out["totalSize"], 1, "{out}");

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = child.wait().unwrap();
    assert!(exit.success(), "serve exited with {exit:?} on SIGTERM");
}

#[test]
fn unknown_store_is_a_clear_startup_error() {
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--store", "redis://x"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown --store"));
}

/// A store URL's password is shown nowhere: not by `--help` (which shows
/// the environment's values), not in the error naming a bad URL.
#[test]
fn a_store_password_is_never_shown() {
    let help = Command::new(BIN)
        .args(["serve", "--help"])
        .env(
            "A2A_STORE",
            "postgres://a2a:hunter2-secret@db.internal/tasks",
        )
        .output()
        .unwrap();
    assert!(help.status.success());
    let shown = String::from_utf8_lossy(&help.stdout);
    assert!(shown.contains("A2A_STORE"), "{shown}");
    assert!(!shown.contains("hunter2"), "{shown}");
    let bad = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--store"])
        .arg("postgre://a2a:hunter2-secret@db.internal/tasks?sslmode=require&password=also-secret")
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let said = String::from_utf8_lossy(&bad.stderr);
    assert!(said.contains("unknown --store"), "{said}");
    assert!(said.contains("a2a:***@db.internal"), "{said}");
    assert!(!said.contains("secret"), "{said}");
}

#[tokio::test]
async fn serve_discovery_flags_shape_the_cards() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cli-cards");
    std::fs::create_dir_all(&dir).unwrap();
    let card_file = dir.join(format!("{}.json", uuid::Uuid::new_v4()));
    std::fs::write(
        &card_file,
        r#"{"name": "conformance (extended)", "description": "More skills.", "version": "1"}"#,
    )
    .unwrap();
    let (mut child, server) = spawn_serve(&[
        "--store",
        "memory",
        "--default-agent",
        "conformance",
        "--public-url",
        "a2a.example.com:443",
        "--extended-card",
        card_file.to_str().unwrap(),
    ]);
    let addr = server.trim_start_matches("http://").parse().unwrap();
    let response = support::http_get(addr, "/.well-known/agent-card.json", &[]).await;
    assert_eq!(response.status, 200, "{}", response.body);
    let card: Value = serde_json::from_str(&response.body).unwrap();
    assert_eq!(card["name"], "conformance", "{card}");
    assert_eq!(card["supportedInterfaces"][0]["url"], "a2a.example.com:443");
    assert_eq!(card["capabilities"]["extendedAgentCard"], true, "{card}");
    // Push notifications are on by default.
    assert_eq!(card["capabilities"]["pushNotifications"], true, "{card}");

    let mut grpc = a2a_lifecycle::proto::a2a_service_client::A2aServiceClient::connect(server)
        .await
        .unwrap();
    let extended = grpc
        .get_extended_agent_card(a2a_lifecycle::proto::GetExtendedAgentCardRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(extended.name, "conformance (extended)");
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn a_bad_extended_card_file_is_a_clear_startup_error() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cli-cards");
    std::fs::create_dir_all(&dir).unwrap();
    let card_file = dir.join(format!("{}.json", uuid::Uuid::new_v4()));
    std::fs::write(&card_file, r#"{"nmae": "typo"}"#).unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--store", "memory"])
        .args(["--extended-card", card_file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not an AgentCard"), "{stderr}");
}

/// The client reaches what the issue "lifecycle under concurrency" added:
/// a non-blocking follow-up during a 60 s run answers with the message in
/// history; request and message metadata and output modes go along; cancel
/// takes metadata too.
#[test]
fn follow_ups_metadata_and_cancel_from_the_command_line() {
    let (mut child, server) = start_server();
    let out: Value = serde_json::from_str(&client(
        &server,
        &["send", "--return-immediately", "slow tests"],
    ))
    .unwrap();
    let id = out["task"]["id"].as_str().expect("task id").to_owned();
    let out: Value = serde_json::from_str(&client(
        &server,
        &[
            "send",
            "--return-immediately",
            "--task-id",
            &id,
            "--metadata",
            r#"{"trace": "t-1"}"#,
            "--message-metadata",
            r#"{"lang": "en"}"#,
            "--accept",
            "text/plain",
            "also the slow ones",
        ],
    ))
    .unwrap();
    assert_eq!(
        out["task"]["status"]["state"], "TASK_STATE_WORKING",
        "{out}"
    );
    let last = out["task"]["history"]
        .as_array()
        .and_then(|h| h.last())
        .cloned()
        .expect("history");
    assert_eq!(last["parts"][0]["text"], "also the slow ones", "{out}");
    assert_eq!(last["metadata"]["lang"], "en", "{out}");
    let out: Value = serde_json::from_str(&client(
        &server,
        &["cancel", "--metadata", r#"{"why": "done"}"#, &id],
    ))
    .unwrap();
    assert_eq!(out["status"]["state"], "TASK_STATE_CANCELED", "{out}");
    child.kill().unwrap();
    child.wait().unwrap();
}

/// The push commands (issue "push notifications"): `push listen` prints
/// each notification a webhook gets as one JSON line and refuses one
/// without its token; `send --push-url` registers a webhook with the task;
/// `push set|get|list|delete` manage a task's webhooks.
#[test]
fn push_commands_and_a_listening_receiver() {
    let (mut serve, server, serve_log) =
        support::spawn_serve_logged(&["--store", "memory", "--push-allow-cidr", "127.0.0.0/8"]);
    let (mut listen, url, printed) = support::spawn_push_listen(&["--notification-token", "tok"]);
    let next_state = || {
        let line = printed.recv_timeout(support::WAIT).expect("a notification");
        let event: Value = serde_json::from_str(&line).unwrap();
        match &event["statusUpdate"]["status"]["state"] {
            Value::String(state) => state.clone(),
            _ => format!(
                "artifact {}",
                event["artifactUpdate"]["artifact"]["artifactId"]
            ),
        }
    };

    let tenant = ["--tenant", "code-reviewer"];
    let out: Value = serde_json::from_str(&client(
        &server,
        &[
            &["send", "--push-url", &url, "--notification-token", "tok"],
            &tenant[..],
            &["review my change"],
        ]
        .concat(),
    ))
    .unwrap();
    let id = out["task"]["id"].as_str().expect("task id").to_owned();
    assert_eq!(next_state(), "TASK_STATE_INPUT_REQUIRED");

    // A second webhook without the token: the receiver refuses what it
    // gets (401, final), so nothing of it is printed.
    let set: Value = serde_json::from_str(&client(
        &server,
        &[
            &[
                "push",
                "set",
                "--id",
                "second",
                "--auth-scheme",
                "Bearer",
                "--credentials",
                "sek",
            ],
            &tenant[..],
            &[&id, &url],
        ]
        .concat(),
    ))
    .unwrap();
    assert_eq!(set["id"], "second", "{set}");
    let got: Value = serde_json::from_str(&client(
        &server,
        &[&["push", "get"], &tenant[..], &[&id, "second"]].concat(),
    ))
    .unwrap();
    assert_eq!(got["authentication"]["credentials"], "sek", "{got}");
    let listed: Value = serde_json::from_str(&client(
        &server,
        &[&["push", "list"], &tenant[..], &[&id]].concat(),
    ))
    .unwrap();
    assert_eq!(
        listed["configs"].as_array().map(Vec::len),
        Some(2),
        "{listed}"
    );

    // Refused by the policy: 10/8 is not in --push-allow-cidr.
    let refused = Command::new(BIN)
        .args([
            "push",
            "set",
            "--server",
            &server,
            "--tenant",
            "code-reviewer",
            &id,
            "http://10.0.0.1/hook",
        ])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("10.0.0.1"), "{stderr}");

    client(
        &server,
        &[
            &["send", "--task-id", &id],
            &tenant[..],
            &["diff --git a/x b/x"],
        ]
        .concat(),
    );
    assert_eq!(next_state(), "TASK_STATE_WORKING");
    assert_eq!(next_state(), "artifact \"review\"");
    assert_eq!(next_state(), "TASK_STATE_COMPLETED");
    // The second webhook's three were refused, and none was printed.
    for _ in 0..3 {
        support::wait_for_line(&serve_log, "push notification refused");
    }
    assert!(
        printed.try_recv().is_err(),
        "only the webhook with the token printed"
    );

    client(
        &server,
        &[&["push", "delete"], &tenant[..], &[&id, "second"]].concat(),
    );
    let gone = Command::new(BIN)
        .args([
            "push",
            "get",
            "--server",
            &server,
            "--tenant",
            "code-reviewer",
            &id,
            "second",
        ])
        .output()
        .unwrap();
    assert!(!gone.status.success(), "deleted, so not found");
    let stderr = String::from_utf8_lossy(&gone.stderr);
    assert!(stderr.contains("no push notification config"), "{stderr}");
    for child in [&mut serve, &mut listen] {
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

/// `--no-push`: the cards say so, and a webhook is refused with
/// PUSH_NOTIFICATION_NOT_SUPPORTED (spec §3.3.4).
#[tokio::test]
async fn no_push_turns_push_notifications_off() {
    let (mut child, server) = spawn_serve(&["--store", "memory", "--no-push"]);
    let addr = server.trim_start_matches("http://").parse().unwrap();
    let response = support::http_get(addr, "/.well-known/agent-card.json", &[]).await;
    let card: Value = serde_json::from_str(&response.body).unwrap();
    assert_eq!(card["capabilities"]["pushNotifications"], false, "{card}");
    let mut grpc = support::within(
        "connect",
        a2a_lifecycle::proto::a2a_service_client::A2aServiceClient::connect(server),
    )
    .await
    .unwrap();
    let refused = support::within(
        "create a config",
        grpc.create_task_push_notification_config(
            a2a_lifecycle::proto::TaskPushNotificationConfig {
                task_id: "any".into(),
                url: "https://8.8.8.8/hook".into(),
                ..Default::default()
            },
        ),
    )
    .await
    .unwrap_err();
    support::assert_a2a_error(
        &refused,
        tonic::Code::FailedPrecondition,
        "PUSH_NOTIFICATION_NOT_SUPPORTED",
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

/// `top --once` prints a view of the server's metrics, from the server's
/// port and from its `--metrics-listen` address.
#[test]
fn top_shows_the_servers_metrics() {
    let (child, server, lines) =
        spawn_serve_logged(&["--store", "memory", "--metrics-listen", "127.0.0.1:0"]);
    let _server = KillOnDrop(child);
    let line = wait_for_line(&lines, "serving metrics and health probes");
    let operations = line
        .split("listen=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the metrics address");
    let out: Value = serde_json::from_str(&client(&server, &["send", "run the tests"])).unwrap();
    assert_eq!(out["task"]["status"]["state"], "TASK_STATE_COMPLETED");
    for from in [server.clone(), format!("http://{operations}")] {
        let view = client(&from, &["top", "--once", "--interval", "100ms"]);
        for expected in ["SendMessage", "Tasks in the store", "Store memory", "Push"] {
            assert!(view.contains(expected), "{expected:?} from {from}: {view}");
        }
    }
}

/// `--binding`: every client command works over each binding, and prints
/// the same ProtoJSON.
#[test]
fn client_commands_over_every_binding() {
    let (child, server) = start_server();
    let _child = KillOnDrop(child);
    for binding in ["grpc", "jsonrpc", "http-json"] {
        let with = |args: &[&str]| {
            let mut all = args.to_vec();
            all.extend(["--binding", binding]);
            client(&server, &all)
        };
        let out: Value = serde_json::from_str(&with(&["send", "run the tests"])).unwrap();
        assert_eq!(
            out["task"]["status"]["state"], "TASK_STATE_COMPLETED",
            "{binding}: {out}"
        );
        let id = out["task"]["id"].as_str().unwrap().to_owned();
        let got: Value = serde_json::from_str(&with(&["get", &id])).unwrap();
        assert_eq!(got, out["task"], "{binding}");
        let listed: Value = serde_json::from_str(&with(&[
            "list",
            "--state",
            "completed",
            "--page-size",
            "100",
        ]))
        .unwrap();
        assert!(
            listed["tasks"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| t["id"] == id.as_str()),
            "{binding}: {listed}"
        );
        let streamed = with(&["send", "--stream", "--tenant", "code-reviewer", "review"]);
        let last: Value = serde_json::from_str(streamed.lines().last().unwrap()).unwrap();
        assert_eq!(
            last["statusUpdate"]["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
            "{binding}"
        );
        let slow: Value =
            serde_json::from_str(&with(&["send", "--return-immediately", "slow"])).unwrap();
        let slow_id = slow["task"]["id"].as_str().unwrap().to_owned();
        let canceled: Value = serde_json::from_str(&with(&["cancel", &slow_id])).unwrap();
        assert_eq!(
            canceled["status"]["state"], "TASK_STATE_CANCELED",
            "{binding}"
        );
        let card: Value = serde_json::from_str(&with(&["card", "--tenant", "deployer"])).unwrap();
        assert_eq!(card["name"], "deployer", "{binding}");
    }
}

/// A failed call prints the code's name, the ErrorInfo reason and the
/// message, the same over every binding, and exits non-zero.
#[test]
fn errors_print_the_code_reason_and_message_on_every_binding() {
    let (child, server) = start_server();
    let _child = KillOnDrop(child);
    for binding in ["grpc", "jsonrpc", "http-json"] {
        let out = Command::new(BIN)
            .args([
                "get",
                "no-such-task",
                "--binding",
                binding,
                "--server",
                &server,
            ])
            .output()
            .expect("run client");
        assert!(!out.status.success(), "{binding}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        // The same line on every binding, with the tenant searched and
        // the flag that names another (first_hour.rs checks the words).
        assert_eq!(
            stderr.trim(),
            "error: NOT_FOUND TASK_NOT_FOUND: task \"no-such-task\" not found in the \
             default agent's tasks (no --tenant given); a task is found only under the \
             agent it was sent to: pass that agent's name as --tenant",
            "{binding}"
        );
    }
    let out = Command::new(BIN)
        .args(["get", "x", "--binding", "soap", "--server", &server])
        .output()
        .expect("run client");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("grpc, jsonrpc, http-json"));
}

/// `send ... | head`: a reader that goes away ends the command quietly,
/// without a panic.
#[test]
fn a_closed_pipe_ends_the_command_quietly() {
    use std::io::Read;
    use std::process::Stdio;
    let (child, server) = start_server();
    let _child = KillOnDrop(child);
    let mut command = Command::new(BIN)
        .args(["send", "--stream", "run the tests", "--server", &server])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run client");
    // Read nothing: close the pipe at once, as `head -0` would.
    drop(command.stdout.take());
    let status = command.wait().expect("the client ends");
    let mut stderr = String::new();
    command
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.trim().is_empty(), "{stderr}");
    assert!(status.success(), "{status:?}: {stderr}");
}

/// `get --transitions`: the task's transition log (issue "console"),
/// through the server's extension, on each binding; plain `get` shows the
/// task without it.
#[test]
fn get_transitions_shows_the_log_on_every_binding() {
    let (child, server) = start_server();
    let _child = KillOnDrop(child);
    let sent: Value = serde_json::from_str(&client(
        &server,
        &["send", "--tenant", "deployer", "deploy to staging"],
    ))
    .unwrap();
    let id = sent["task"]["id"].as_str().expect("a task").to_owned();
    let uri = a2a_lifecycle::lifecycle::TRANSITIONS_EXTENSION;
    for binding in ["grpc", "jsonrpc", "http-json"] {
        let plain: Value = serde_json::from_str(&client(
            &server,
            &["get", "--binding", binding, "--tenant", "deployer", &id],
        ))
        .unwrap();
        assert!(plain["metadata"][uri].is_null(), "{binding}: {plain}");
        let task: Value = serde_json::from_str(&client(
            &server,
            &[
                "get",
                "--transitions",
                "--binding",
                binding,
                "--tenant",
                "deployer",
                &id,
            ],
        ))
        .unwrap();
        let log = support::transition_log(&task);
        assert_eq!(
            log[..2],
            ["SUBMITTED client", "AUTH_REQUIRED agent"],
            "{binding}"
        );
    }
}
