//! The `a2a-lifecycle` binary: `serve` on an ephemeral port, the client
//! subcommands against it, and a clean exit on SIGTERM.

mod support;

use std::process::Command;

use support::{BIN, spawn_serve};

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

    let out = client(&server, &["send", "ping"]);
    assert!(out.contains("\"pong\""), "{out}");

    let out = client(&server, &["send", "run the tests"]);
    assert!(out.contains("state: Completed"), "{out}");
    assert!(out.contains("test-report"), "{out}");

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
    for state in ["Submitted", "AuthRequired", "Working", "Completed"] {
        assert!(
            out.contains(&format!("state: {state}")),
            "{state} missing: {out}"
        );
    }

    // `list --state` accepts the 0.3 name as well as the ProtoJSON name.
    let out = client(&server, &["list", "--state", "completed"]);
    assert!(out.contains("total_size: 1"), "{out}");
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
    assert!(out.contains("total_size: 1"), "{out}");

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
