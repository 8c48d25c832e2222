//! Every caller scoped to what it may see (issue "security", spec §13.1),
//! over real gRPC: a matrix of principals (two users and an admin of one
//! tenant, a JWT user, mTLS clients, a user of another tenant, no
//! credentials, a wrong key, a forged and an expired JWT) times every RPC,
//! counting leaks. The server runs over TLS with client certificates
//! optional beside `--auth`, as an operator would run it.
//!
//! A leak is any answer that tells a caller more than it may know: a task
//! it may not see answered otherwise than a task that does not exist (code,
//! message and ErrorInfo, the id aside), a denial with the wrong code, a
//! listing or `total_size` that counts another's task, or a denied call
//! that changed the task.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use a2a_lifecycle::auth::Authenticator;
use a2a_lifecycle::proto::a2a_service_client::A2aServiceClient;
use a2a_lifecycle::proto::*;
use jsonwebtoken::Algorithm;
use tonic::Code;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic_types::StatusExt;

use a2a_lifecycle::connections::ClientCerts;
use support::certs::{Ca, Pair, channel, serve_tls, serve_tls_with};
use support::jwt::{claims, fixtures, key_digest, now, sign};
use support::{request, user_message, within};

/// The tenant the matrix runs in: its agent asks for input first, so every
/// task stays open to follow-ups, subscriptions and cancellation.
const TENANT: &str = "code-reviewer";

fn auth_file() -> String {
    let principal = |name: &str, tenants: &str, role: &str| {
        format!(
            "[[principal]]\nname = \"{name}\"\napi_key_sha256 = \"{}\"\ntenants = {tenants}\nrole = \"{role}\"\n\n",
            key_digest(&format!("{name}-key"))
        )
    };
    principal("alice", "[\"code-reviewer\"]", "user")
        + &principal("bob", "[\"code-reviewer\"]", "user")
        + &principal("root", "[\"code-reviewer\"]", "admin")
        + &principal("eve", "[\"deployer\"]", "user")
        + "[[principal]]\nname = \"mallory\"\ntenants = [\"code-reviewer\"]\nrole = \"user\"\n\n"
        + "[jwt]\nissuer = \"https://id.example.test\"\naudience = \"a2a-lifecycle\"\n\
           jwks_file = \"jwks.json\"\ntenants_claim = \"tenants\"\nadmin_claim = \"a2a_admin\"\n"
}

fn authenticator() -> Arc<Authenticator> {
    let auth = Authenticator::parse(&auth_file(), &fixtures()).unwrap();
    // The matrix fails on purpose, many times: no slowing.
    Arc::new(auth.with_free_failures(u32::MAX))
}

type Client = A2aServiceClient<
    InterceptedService<Channel, Box<dyn FnMut(tonic::Request<()>) -> TonicResult + Send>>,
>;
type TonicResult = Result<tonic::Request<()>, tonic::Status>;

fn client(channel: &Channel, token: Option<String>) -> Client {
    let token = token.map(|t| format!("Bearer {t}").parse::<tonic::metadata::MetadataValue<_>>());
    let token = token.map(|t| t.unwrap());
    A2aServiceClient::with_interceptor(
        channel.clone(),
        Box::new(move |mut r: tonic::Request<()>| {
            if let Some(token) = &token {
                r.metadata_mut().insert("authorization", token.clone());
            }
            Ok(r)
        }),
    )
}

/// What a caller must get for a task of alice's.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    /// It may see the task: the RPC works.
    Sees,
    /// It may not: the answer is the one for a task that does not exist.
    Hidden,
    /// It is refused before anything is looked at.
    Denied(Code),
}

struct Who {
    name: &'static str,
    token: Option<String>,
    /// A client certificate from the server's client CA.
    cert: Option<Pair>,
    tenant: &'static str,
    expect: Expect,
}

fn callers(ca: &Ca) -> Vec<Who> {
    let jwt = |sub: &str, edit: &dyn Fn(&mut serde_json::Value), key: &str| {
        let claims = claims(sub, |c| {
            c["tenants"] = serde_json::json!([TENANT]);
            edit(c);
        });
        Some(sign(Algorithm::RS256, "rs-1", key, &claims))
    };
    let key = |name: &str| Some(format!("{name}-key"));
    let none = |_: &mut serde_json::Value| {};
    vec![
        Who {
            name: "alice (owner)",
            token: key("alice"),
            tenant: TENANT,
            expect: Expect::Sees,
            cert: None,
        },
        Who {
            name: "alice by her client certificate",
            token: None,
            tenant: TENANT,
            expect: Expect::Sees,
            cert: Some(ca.client(Some("alice"), &[])),
        },
        Who {
            name: "mallory (an mTLS client of the tenant)",
            token: None,
            tenant: TENANT,
            expect: Expect::Hidden,
            cert: Some(ca.client(Some("mallory"), &[])),
        },
        Who {
            name: "an mTLS client no principal of the file",
            token: None,
            tenant: TENANT,
            expect: Expect::Denied(Code::Unauthenticated),
            cert: Some(ca.client(Some("stranger"), &["stranger.example.test"])),
        },
        Who {
            name: "root (admin of the tenant)",
            token: key("root"),
            tenant: TENANT,
            expect: Expect::Sees,
            cert: None,
        },
        Who {
            name: "bob (another user of the tenant)",
            token: key("bob"),
            tenant: TENANT,
            expect: Expect::Hidden,
            cert: None,
        },
        Who {
            name: "carol (a JWT user of the tenant)",
            token: jwt("carol", &none, "rs256-test-key.pem"),
            tenant: TENANT,
            expect: Expect::Hidden,
            cert: None,
        },
        Who {
            name: "eve (a user of another tenant), in hers",
            token: key("eve"),
            tenant: "deployer",
            expect: Expect::Hidden,
            cert: None,
        },
        Who {
            name: "eve, in alice's tenant",
            token: key("eve"),
            tenant: TENANT,
            expect: Expect::Denied(Code::PermissionDenied),
            cert: None,
        },
        Who {
            name: "no credentials",
            token: None,
            tenant: TENANT,
            expect: Expect::Denied(Code::Unauthenticated),
            cert: None,
        },
        Who {
            name: "a wrong key",
            token: Some("alice-key-guessed".into()),
            tenant: TENANT,
            expect: Expect::Denied(Code::Unauthenticated),
            cert: None,
        },
        Who {
            name: "a forged JWT naming alice",
            token: jwt("alice", &none, "forger-test-key.pem"),
            tenant: TENANT,
            expect: Expect::Denied(Code::Unauthenticated),
            cert: None,
        },
        Who {
            name: "an expired JWT naming alice",
            token: jwt(
                "alice",
                &|c| {
                    c["exp"] = serde_json::json!(now() - 3600);
                    c["iat"] = serde_json::json!(now() - 7200);
                },
                "rs256-test-key.pem",
            ),
            tenant: TENANT,
            expect: Expect::Denied(Code::Unauthenticated),
            cert: None,
        },
    ]
}

/// The RPCs that name a task.
const TASK_RPCS: [&str; 10] = [
    "GetTask",
    "CancelTask",
    "SubscribeToTask",
    "SendMessage (follow-up)",
    "SendStreamingMessage (follow-up)",
    "CreateTaskPushNotificationConfig",
    "CreateTaskPushNotificationConfig (internal URL)",
    "GetTaskPushNotificationConfig",
    "ListTaskPushNotificationConfigs",
    "DeleteTaskPushNotificationConfig",
];

/// Calls `rpc` on task `id` as `client` in `tenant`; Ok(()) when it
/// answered (a stream: with its first item).
async fn call(client: &mut Client, rpc: &str, tenant: &str, id: &str) -> Result<(), tonic::Status> {
    let t = tenant.to_owned();
    let follow_up = || {
        let mut message = user_message("diff --git a/x b/x");
        message.task_id = id.to_owned();
        request(&t, message, true)
    };
    let first = |s: tonic::Streaming<StreamResponse>| async move {
        let mut s = s;
        match within("first stream item", s.message()).await? {
            Some(_) => Ok(()),
            None => Err(tonic::Status::internal("stream ended without an item")),
        }
    };
    let id = id.to_owned();
    match rpc {
        "GetTask" => client
            .get_task(GetTaskRequest {
                tenant: t,
                id,
                history_length: None,
            })
            .await
            .map(drop),
        "CancelTask" => client
            .cancel_task(CancelTaskRequest {
                tenant: t,
                id,
                metadata: None,
            })
            .await
            .map(drop),
        "SubscribeToTask" => {
            let s = client
                .subscribe_to_task(SubscribeToTaskRequest { tenant: t, id })
                .await?;
            first(s.into_inner()).await
        }
        "SendMessage (follow-up)" => client.send_message(follow_up()).await.map(drop),
        "SendStreamingMessage (follow-up)" => {
            let s = client.send_streaming_message(follow_up()).await?;
            first(s.into_inner()).await
        }
        "CreateTaskPushNotificationConfig" => client
            .create_task_push_notification_config(TaskPushNotificationConfig {
                tenant: t,
                task_id: id,
                url: "https://hooks.example.test/a2a".into(),
                ..Default::default()
            })
            .await
            .map(drop),
        // Refused for its address: but only once the caller may see the
        // task, or it would learn what the name resolves to.
        "CreateTaskPushNotificationConfig (internal URL)" => client
            .create_task_push_notification_config(TaskPushNotificationConfig {
                tenant: t,
                task_id: id,
                url: "http://127.0.0.1:9/a2a".into(),
                ..Default::default()
            })
            .await
            .map(drop),
        "GetTaskPushNotificationConfig" => client
            .get_task_push_notification_config(GetTaskPushNotificationConfigRequest {
                tenant: t,
                task_id: id,
                id: "config-1".into(),
            })
            .await
            .map(drop),
        "ListTaskPushNotificationConfigs" => client
            .list_task_push_notification_configs(ListTaskPushNotificationConfigsRequest {
                tenant: t,
                task_id: id,
                ..Default::default()
            })
            .await
            .map(drop),
        "DeleteTaskPushNotificationConfig" => client
            .delete_task_push_notification_config(DeleteTaskPushNotificationConfigRequest {
                tenant: t,
                task_id: id,
                id: "config-1".into(),
            })
            .await
            .map(drop),
        other => panic!("no RPC {other}"),
    }
}

/// A call its own caller must see refused (for what it asks, not for
/// whose task it is).
fn refused_for_itself(rpc: &str) -> bool {
    rpc.ends_with("(internal URL)")
}

/// An error as a caller sees it, with `id` replaced: what must be the same
/// for a hidden task and a missing one.
fn seen(status: &tonic::Status, id: &str) -> String {
    let info = status
        .get_details_error_info()
        .map(|i| {
            let metadata: BTreeMap<_, _> = i
                .metadata
                .iter()
                .map(|(k, v)| (k.clone(), v.replace(id, "<id>")))
                .collect();
            format!("{} {} {metadata:?}", i.reason, i.domain)
        })
        .unwrap_or_default();
    format!(
        "{:?}: {} [{info}]",
        status.code(),
        status.message().replace(id, "<id>")
    )
}

/// A task of alice's, waiting for her input.
async fn alices_task(alice: &mut Client) -> Task {
    let task = within(
        "alice's new task",
        alice.send_message(request(TENANT, user_message("review my change"), false)),
    )
    .await
    .unwrap()
    .into_inner();
    let task = match task.payload {
        Some(send_message_response::Payload::Task(t)) => {
            assert_eq!(
                t.status.as_ref().unwrap().state,
                TaskState::InputRequired as i32
            );
            t
        }
        other => panic!("expected a task, got {other:?}"),
    };
    // With the config the config RPCs name.
    let config = TaskPushNotificationConfig {
        tenant: TENANT.into(),
        task_id: task.id.clone(),
        id: "config-1".into(),
        url: "https://hooks.example.test/a2a".into(),
        ..Default::default()
    };
    within(
        "alice's push config",
        alice.create_task_push_notification_config(config),
    )
    .await
    .expect("push is on");
    task
}

async fn read(alice: &mut Client, id: &str) -> Task {
    within(
        "alice reads her task",
        alice.get_task(GetTaskRequest {
            tenant: TENANT.into(),
            id: id.into(),
            history_length: None,
        }),
    )
    .await
    .unwrap()
    .into_inner()
}

/// Every task id `client` lists in `tenant`, and the `total_size` of the
/// first page.
async fn listed(
    client: &mut Client,
    tenant: &str,
) -> Result<(BTreeSet<String>, i32), tonic::Status> {
    let mut ids = BTreeSet::new();
    let mut token = String::new();
    let mut total = None;
    loop {
        let page = within(
            "list",
            client.list_tasks(ListTasksRequest {
                tenant: tenant.into(),
                page_size: Some(100),
                page_token: token,
                ..Default::default()
            }),
        )
        .await?
        .into_inner();
        total.get_or_insert(page.total_size);
        ids.extend(page.tasks.into_iter().map(|t| t.id));
        if page.next_page_token.is_empty() {
            return Ok((ids, total.unwrap_or(0)));
        }
        token = page.next_page_token;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_caller_reaches_a_task_it_may_not_see() {
    let ca = Ca::new();
    // Push on (webhooks to public addresses only): the config RPCs are
    // served, so their cells check what they answer.
    let server = serve_tls_with(
        &ca,
        &ca.server(),
        ClientCerts::Optional,
        Some(authenticator()),
        Some(Default::default()),
    )
    .await;
    let plain = channel(server.port, &ca.pem(), None).await.unwrap();
    let mut alice = client(&plain, Some("alice-key".into()));
    let mut leaks: Vec<String> = Vec::new();
    let mut calls = 0;
    // Who created which task, for the listings at the end.
    let mut owned: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();

    for who in callers(&ca) {
        let ch = channel(server.port, &ca.pem(), who.cert.as_ref())
            .await
            .unwrap();
        let mut c = client(&ch, who.token.clone());
        for rpc in TASK_RPCS {
            let task = alices_task(&mut alice).await;
            owned.entry("alice").or_default().insert(task.id.clone());
            let before = read(&mut alice, &task.id).await;
            let answer = call(&mut c, rpc, who.tenant, &task.id).await;
            calls += 1;
            let missing_id = uuid::Uuid::now_v7().to_string();
            let missing = call(&mut c, rpc, who.tenant, &missing_id).await;
            let case = format!("{} / {rpc}", who.name);
            match (who.expect, &answer) {
                (Expect::Sees, Ok(())) if refused_for_itself(rpc) => {
                    leaks.push(format!("{case}: served"))
                }
                (Expect::Sees, Ok(())) => {}
                (Expect::Sees, Err(e))
                    if refused_for_itself(rpc) && e.code() == Code::InvalidArgument => {}
                (Expect::Sees, Err(e)) => leaks.push(format!("{case}: refused its own: {e:?}")),
                (Expect::Hidden, Ok(())) => leaks.push(format!("{case}: answered")),
                (Expect::Hidden, Err(e)) => {
                    let hidden = seen(e, &task.id);
                    let absent = match &missing {
                        Ok(()) => "answered".to_owned(),
                        Err(m) => seen(m, &missing_id),
                    };
                    if hidden != absent {
                        leaks.push(format!(
                            "{case}: hidden task answered {hidden}, missing one {absent}"
                        ));
                    }
                    if e.code() != Code::NotFound {
                        leaks.push(format!("{case}: {:?}, not NOT_FOUND", e.code()));
                    }
                }
                (Expect::Denied(code), Ok(())) => {
                    leaks.push(format!("{case}: answered, not {code:?}"))
                }
                (Expect::Denied(code), Err(e)) => {
                    if e.code() != code {
                        leaks.push(format!("{case}: {:?}, not {code:?}", e.code()));
                    }
                    if missing.as_ref().map_err(|m| m.code()) != Err(code) {
                        leaks.push(format!("{case}: a missing task answered {missing:?}"));
                    }
                }
            }
            if who.expect != Expect::Sees && read(&mut alice, &task.id).await != before {
                leaks.push(format!("{case}: changed the task"));
            }
        }

        // ListTasks: only what the caller may see, counted the same way.
        let list = listed(&mut c, who.tenant).await;
        calls += 1;
        match (who.expect, list) {
            (Expect::Denied(code), Err(e)) if e.code() == code => {}
            (Expect::Denied(code), other) => {
                leaks.push(format!("{} / ListTasks: {other:?}, not {code:?}", who.name))
            }
            (_, Err(e)) => leaks.push(format!("{} / ListTasks refused: {e:?}", who.name)),
            (expect, Ok((ids, total))) => {
                let alices = &owned["alice"];
                let seen_alices = ids.intersection(alices).count();
                let ok = match expect {
                    Expect::Sees => seen_alices == alices.len(),
                    _ => seen_alices == 0 && total as usize == ids.len(),
                };
                if !ok {
                    leaks.push(format!(
                        "{} / ListTasks: {seen_alices} of alice's {} tasks, total_size {total}",
                        who.name,
                        alices.len()
                    ));
                }
            }
        }
    }

    // Idempotency keys are per principal: bob's and root's messages with
    // alice's message id make tasks of their own, and alice's repeat is
    // still answered with hers.
    let shared = user_message("review my change");
    let req = || request(TENANT, shared.clone(), true);
    let first = within("send", send_task_as(&mut alice, req())).await;
    for (name, key) in [("bob", "bob-key"), ("root", "root-key")] {
        let mut c = client(&plain, Some(key.into()));
        let theirs = within("send", send_task_as(&mut c, req())).await;
        calls += 1;
        if theirs.id == first.id {
            leaks.push(format!("{name} replayed alice's message id into her task"));
        }
        owned.entry(name).or_default().insert(theirs.id);
    }
    let again = within("send", send_task_as(&mut alice, req())).await;
    assert_eq!(
        again.id, first.id,
        "alice's repeat is answered with her task"
    );

    // Each user lists exactly its own tasks; the admin lists them all.
    for (name, key) in [("alice", "alice-key"), ("bob", "bob-key")] {
        let mut c = client(&plain, Some(key.into()));
        let (ids, total) = listed(&mut c, TENANT).await.unwrap();
        let mut expected = owned.get(name).cloned().unwrap_or_default();
        if name == "alice" {
            expected.insert(first.id.clone());
        }
        if ids != expected || total as usize != expected.len() {
            leaks.push(format!(
                "{name} lists {} tasks (total_size {total}), owns {}",
                ids.len(),
                expected.len()
            ));
        }
    }
    let mut root = client(&plain, Some("root-key".into()));
    let (all, _) = listed(&mut root, TENANT).await.unwrap();
    assert!(
        owned.values().all(|ids| ids.is_subset(&all)),
        "the admin sees every task of its tenant"
    );

    println!("{calls} calls, {} leaks", leaks.len());
    assert!(
        leaks.is_empty(),
        "{} leaks:\n{}",
        leaks.len(),
        leaks.join("\n")
    );
    server.stop().await;
}

async fn send_task_as(c: &mut Client, req: SendMessageRequest) -> Task {
    match c.send_message(req).await.unwrap().into_inner().payload {
        Some(send_message_response::Payload::Task(t)) => t,
        other => panic!("expected a task, got {other:?}"),
    }
}

/// GetExtendedAgentCard needs authentication (spec §13.3), and a tenant
/// the principal may use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_extended_card_needs_a_principal_of_the_tenant() {
    let ca = Ca::new();
    let server = serve_tls(
        &ca,
        &ca.server(),
        ClientCerts::Optional,
        Some(authenticator()),
    )
    .await;
    for who in callers(&ca) {
        let ch = channel(server.port, &ca.pem(), who.cert.as_ref())
            .await
            .unwrap();
        let mut c = client(&ch, who.token.clone());
        let answer = within(
            "extended card",
            c.get_extended_agent_card(GetExtendedAgentCardRequest {
                tenant: who.tenant.into(),
            }),
        )
        .await;
        match (who.expect, answer) {
            (Expect::Denied(code), Err(e)) => assert_eq!(e.code(), code, "{}", who.name),
            (Expect::Denied(code), Ok(_)) => panic!("{}: answered, not {code:?}", who.name),
            (_, answer) => {
                // The extended card may be unsupported; it is never a
                // refusal of an authenticated principal of the tenant.
                if let Err(e) = answer {
                    assert!(
                        !matches!(e.code(), Code::Unauthenticated | Code::PermissionDenied),
                        "{}: {e:?}",
                        who.name
                    );
                }
            }
        }
    }
    server.stop().await;
}
