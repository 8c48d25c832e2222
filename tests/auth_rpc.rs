//! Authentication on every RPC over real gRPC (issue "security"): no or
//! bad credentials are UNAUTHENTICATED, a tenant the principal may not use
//! is PERMISSION_DENIED whether or not it exists, and both are decided
//! before anything about the request is looked at. Cards and health stay
//! public; a server others can reach refuses to start without `--auth`.

use crate::support;

use std::sync::Arc;

use a2a_lifecycle::auth::Authenticator;
use a2a_lifecycle::proto::a2a_service_client::A2aServiceClient;
use a2a_lifecycle::proto::*;
use tonic::Code;
use tonic::transport::Channel;

use support::jwt::key_digest;
use support::{TestServer, assert_a2a_error, within};

const BOT_KEY: &str = "bot-key-for-rpc-tests";
const OPS_KEY: &str = "ops-key-for-rpc-tests";

/// With no slowing of failures: the matrix fails on purpose, many times.
fn authenticator() -> Arc<Authenticator> {
    Arc::new(auth_file().with_free_failures(u32::MAX))
}

fn auth_file() -> Authenticator {
    let file = format!(
        "[[principal]]\nname = \"bot\"\napi_key_sha256 = \"{}\"\ntenants = [\"\", \"code-reviewer\"]\nrole = \"user\"\n\n\
         [[principal]]\nname = \"ops\"\napi_key_sha256 = \"{}\"\ntenants = [\"*\"]\nrole = \"admin\"\n",
        key_digest(BOT_KEY),
        key_digest(OPS_KEY),
    );
    Authenticator::parse(&file, std::path::Path::new(".")).unwrap()
}

/// Calls every A2A RPC on `tenant` with `key` (none when `None`) and
/// returns each one's status code, by RPC name.
async fn every_rpc(
    channel: Channel,
    tenant: &str,
    key: Option<&str>,
) -> Vec<(&'static str, Result<(), tonic::Status>)> {
    let token = key.map(|k| {
        format!("Bearer {k}")
            .parse::<tonic::metadata::MetadataValue<_>>()
            .unwrap()
    });
    let mut client =
        A2aServiceClient::with_interceptor(channel, move |mut r: tonic::Request<()>| {
            if let Some(token) = &token {
                r.metadata_mut().insert("authorization", token.clone());
            }
            Ok(r)
        });
    let t = tenant.to_owned();
    let send = || support::request(&t, support::user_message("run the tests"), true);
    let ok = |r: Result<(), tonic::Status>| r;
    vec![
        (
            "SendMessage",
            ok(client.send_message(send()).await.map(|_| ())),
        ),
        (
            "SendStreamingMessage",
            ok(client.send_streaming_message(send()).await.map(|_| ())),
        ),
        (
            "GetTask",
            ok(client
                .get_task(GetTaskRequest {
                    tenant: t.clone(),
                    id: "no-such-task".into(),
                    ..Default::default()
                })
                .await
                .map(|_| ())),
        ),
        (
            "ListTasks",
            ok(client
                .list_tasks(ListTasksRequest {
                    tenant: t.clone(),
                    ..Default::default()
                })
                .await
                .map(|_| ())),
        ),
        (
            "CancelTask",
            ok(client
                .cancel_task(CancelTaskRequest {
                    tenant: t.clone(),
                    id: "no-such-task".into(),
                    ..Default::default()
                })
                .await
                .map(|_| ())),
        ),
        (
            "SubscribeToTask",
            ok(client
                .subscribe_to_task(SubscribeToTaskRequest {
                    tenant: t.clone(),
                    id: "no-such-task".into(),
                })
                .await
                .map(|_| ())),
        ),
        (
            "CreateTaskPushNotificationConfig",
            ok(client
                .create_task_push_notification_config(TaskPushNotificationConfig {
                    tenant: t.clone(),
                    ..Default::default()
                })
                .await
                .map(|_| ())),
        ),
        (
            "GetTaskPushNotificationConfig",
            ok(client
                .get_task_push_notification_config(GetTaskPushNotificationConfigRequest {
                    tenant: t.clone(),
                    ..Default::default()
                })
                .await
                .map(|_| ())),
        ),
        (
            "ListTaskPushNotificationConfigs",
            ok(client
                .list_task_push_notification_configs(ListTaskPushNotificationConfigsRequest {
                    tenant: t.clone(),
                    ..Default::default()
                })
                .await
                .map(|_| ())),
        ),
        (
            "DeleteTaskPushNotificationConfig",
            ok(client
                .delete_task_push_notification_config(DeleteTaskPushNotificationConfigRequest {
                    tenant: t.clone(),
                    ..Default::default()
                })
                .await
                .map(|_| ())),
        ),
        (
            "GetExtendedAgentCard",
            ok(client
                .get_extended_agent_card(GetExtendedAgentCardRequest { tenant: t.clone() })
                .await
                .map(|_| ())),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_valid_credentials_every_rpc_is_unauthenticated() {
    let server = TestServer::start_auth(authenticator()).await;
    for key in [None, Some("wrong-key"), Some("a.b.c")] {
        for tenant in ["", "deployer", "no-such-tenant"] {
            let results = within("calls", every_rpc(server.channel().await, tenant, key)).await;
            assert_eq!(results.len(), 11);
            for (rpc, result) in results {
                let status = result.expect_err(rpc);
                assert_a2a_error(&status, Code::Unauthenticated, "UNAUTHENTICATED");
                // Nothing about the server leaks: no tenant names.
                assert!(
                    !status.message().contains("code-reviewer"),
                    "{rpc}: {status:?}"
                );
            }
        }
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_outside_the_principals_is_permission_denied_on_every_rpc() {
    let server = TestServer::start_auth(authenticator()).await;
    // Served or not, a tenant the bot may not use gets the same answer.
    for tenant in ["deployer", "no-such-tenant"] {
        let results = within(
            "calls",
            every_rpc(server.channel().await, tenant, Some(BOT_KEY)),
        )
        .await;
        for (rpc, result) in results {
            let status = result.expect_err(rpc);
            assert_a2a_error(&status, Code::PermissionDenied, "PERMISSION_DENIED");
            let info = tonic_types::StatusExt::get_details_error_info(&status).unwrap();
            assert_eq!(
                info.metadata.get("tenant").map(String::as_str),
                Some(tenant)
            );
        }
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authenticated_principal_is_served_in_its_tenants() {
    let server = TestServer::start_auth(authenticator()).await;
    let results = within(
        "calls",
        every_rpc(server.channel().await, "", Some(BOT_KEY)),
    )
    .await;
    let codes: Vec<(&str, Code)> = results
        .iter()
        .map(|(rpc, r)| {
            (
                *rpc,
                r.as_ref().map(|_| Code::Ok).unwrap_or_else(|s| s.code()),
            )
        })
        .collect();
    // Past authentication, each RPC answers as without --auth.
    assert_eq!(
        codes,
        [
            ("SendMessage", Code::Ok),
            ("SendStreamingMessage", Code::Ok),
            ("GetTask", Code::NotFound),
            ("ListTasks", Code::Ok),
            ("CancelTask", Code::NotFound),
            ("SubscribeToTask", Code::NotFound),
            ("CreateTaskPushNotificationConfig", Code::FailedPrecondition),
            ("GetTaskPushNotificationConfig", Code::FailedPrecondition),
            ("ListTaskPushNotificationConfigs", Code::FailedPrecondition),
            ("DeleteTaskPushNotificationConfig", Code::FailedPrecondition),
            ("GetExtendedAgentCard", Code::FailedPrecondition),
        ]
    );
    // An admin of every tenant is told an unknown tenant is unknown.
    let results = within(
        "calls",
        every_rpc(server.channel().await, "no-such-tenant", Some(OPS_KEY)),
    )
    .await;
    for (rpc, result) in results {
        assert_eq!(
            result.expect_err(rpc).code(),
            Code::InvalidArgument,
            "{rpc}"
        );
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cards_and_health_stay_public() {
    let server = TestServer::start_auth(authenticator()).await;
    let mut health = tonic_health::pb::health_client::HealthClient::new(server.channel().await);
    let serving = within(
        "health",
        health.check(tonic_health::pb::HealthCheckRequest::default()),
    )
    .await
    .unwrap();
    assert_eq!(serving.into_inner().status, 1);
    let mut tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    tcp.write_all(
        b"GET /.well-known/agent-card.json HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let mut response = String::new();
    within("card", tcp.read_to_string(&mut response))
        .await
        .unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    server.stop().await;
}

/// `serve` on an address others can reach refuses to start without
/// `--auth`, and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_server_needs_auth_or_an_explicit_choice() {
    let output = within(
        "serve refuses",
        tokio::process::Command::new(env!("CARGO_BIN_EXE_a2a-lifecycle"))
            .args(["serve", "--listen", "0.0.0.0:0", "--store", "memory"])
            .output(),
    )
    .await
    .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--auth") && stderr.contains("--insecure-open"),
        "{stderr}"
    );
}

/// `serve --auth FILE`, and the built-in client's `--token` (or
/// `A2A_TOKEN`): without it the client is refused, with it served.
#[test]
fn the_command_line_serves_and_calls_with_auth() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("auth-cli");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("{}.toml", uuid::Uuid::new_v4()));
    std::fs::write(
        &file,
        format!(
            "[[principal]]\nname = \"bot\"\napi_key_sha256 = \"{}\"\ntenants = [\"\"]\nrole = \"user\"\n",
            key_digest(BOT_KEY)
        ),
    )
    .unwrap();
    let (mut child, server) =
        support::spawn_serve(&["--store", "memory", "--auth", file.to_str().unwrap()]);
    let run = |token: Option<(&str, &str)>| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_a2a-lifecycle"));
        command.args(["send", "ping", "--server", &server]);
        command.env_remove("A2A_TOKEN");
        match token {
            Some(("flag", token)) => {
                command.args(["--token", token]);
            }
            Some((_, token)) => {
                command.env("A2A_TOKEN", token);
            }
            None => {}
        }
        command.output().unwrap()
    };
    let refused = run(None);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("no credentials"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(!run(Some(("flag", "wrong"))).status.success());
    for how in ["flag", "env"] {
        let out = run(Some((how, BOT_KEY)));
        assert!(
            out.status.success(),
            "{how}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("pong"));
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

/// Repeated failures from one address are answered more and more slowly
/// (so keys cannot be guessed at line rate), while a valid key from the
/// same address is still served. The delay is a lower bound the server
/// sleeps, not a speed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_failures_are_slowed_and_valid_keys_still_get_in() {
    use a2a_lifecycle::auth::{FIRST_DELAY, FREE_FAILURES};
    let server = TestServer::start_auth(Arc::new(auth_file())).await;
    let list = |key: &'static str| {
        let channel = server.channel();
        async move {
            let mut client = A2aServiceClient::with_interceptor(
                channel.await,
                move |mut r: tonic::Request<()>| {
                    r.metadata_mut()
                        .insert("authorization", format!("Bearer {key}").parse().unwrap());
                    Ok(r)
                },
            );
            client.list_tasks(ListTasksRequest::default()).await
        }
    };
    for _ in 0..FREE_FAILURES {
        assert_eq!(
            within("free failure", list("guess"))
                .await
                .unwrap_err()
                .code(),
            Code::Unauthenticated
        );
    }
    let started = std::time::Instant::now();
    let slowed = within("slowed failure", list("guess")).await.unwrap_err();
    assert_eq!(slowed.code(), Code::Unauthenticated);
    assert!(
        started.elapsed() >= FIRST_DELAY,
        "answered after {:?}",
        started.elapsed()
    );
    assert!(within("valid key", list(BOT_KEY)).await.is_ok());
    server.stop().await;
}

/// Under `--auth` every card declares the bearer scheme and requires it
/// (spec §4.5); without `--auth`, none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cards_declare_the_bearer_scheme_under_auth() {
    let card_of = |server: &TestServer, path: &'static str| {
        let addr = server.addr;
        async move {
            let response = within("card", support::http_get(addr, path, &[])).await;
            assert_eq!(response.status, 200);
            let value: serde_json::Value = serde_json::from_str(&response.body).unwrap();
            value
        }
    };
    let open = TestServer::start().await;
    let card = card_of(&open, "/.well-known/agent-card.json").await;
    assert!(card.get("securitySchemes").is_none(), "{card}");
    assert!(card.get("securityRequirements").is_none(), "{card}");
    open.stop().await;

    let secured = TestServer::start_auth(authenticator()).await;
    for path in [
        "/.well-known/agent-card.json",
        "/deployer/.well-known/agent-card.json",
    ] {
        let card = card_of(&secured, path).await;
        let scheme = &card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"];
        assert_eq!(scheme["scheme"], "Bearer", "{card}");
        // Keys only in this file: no JWT format.
        assert!(scheme.get("bearerFormat").is_none(), "{card}");
        assert_eq!(
            card["securityRequirements"][0]["schemes"]["bearer"],
            serde_json::json!({}),
            "{card}"
        );
    }
    secured.stop().await;
}

/// Random `authorization` values over real gRPC (seeded, so a failure
/// repeats): none gets past authentication, on any RPC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_authorization_values_never_get_in() {
    let server = TestServer::start_auth(authenticator()).await;
    let channel = server.channel().await;
    let mut state: u64 = 0x0a07_5eed;
    let mut next = move || {
        // xorshift64*
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    for round in 0..300 {
        let len = (next() % 120) as usize + 1;
        let noise: String = (0..len)
            .map(|_| (b'!' + (next() % 94) as u8) as char)
            .collect();
        let value = match round % 4 {
            0 => noise,
            1 => format!("Bearer {noise}"),
            2 => format!("bearer {}", noise.replace(['.', ' '], "x") + ".e30.sig"),
            _ => format!("Bearer {}{}", &BOT_KEY[..BOT_KEY.len() - 1], noise),
        };
        let Ok(value) = value.parse::<tonic::metadata::MetadataValue<_>>() else {
            continue;
        };
        let mut client =
            A2aServiceClient::with_interceptor(channel.clone(), move |mut r: tonic::Request<()>| {
                r.metadata_mut().insert("authorization", value.clone());
                Ok(r)
            });
        let answer = within(
            "random credential",
            client.list_tasks(ListTasksRequest::default()),
        )
        .await;
        match answer {
            Err(e) => assert_eq!(e.code(), Code::Unauthenticated, "round {round}: {e:?}"),
            Ok(_) => panic!("round {round}: a random credential got in"),
        }
    }
    server.stop().await;
}
