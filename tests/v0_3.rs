//! Protocol 0.3 clients beside 1.0 ones: the 0.3 JSON-RPC methods on the
//! same endpoint (`message/send`, `message/stream`, `tasks/get`, ...),
//! with 0.3 payloads (`kind`, kebab-case states, lowercase roles, `final`,
//! 0.3 error codes), translated at the edge to the 1.0 core; tasks shared
//! both ways; the card 0.3 clients read.

use crate::support;

use serde_json::{Value, json};

use support::web::{Event, Http, data_events, next_chunk, parse};
use support::{TestServer, WAIT};

fn message03(text: &str) -> Value {
    json!({
        "kind": "message",
        "messageId": uuid::Uuid::new_v4().to_string(),
        "role": "user",
        "parts": [{"kind": "text", "text": text}],
    })
}

async fn server() -> (TestServer, Http) {
    let server = TestServer::start().await;
    let http = Http::new(server.addr);
    (server, http)
}

fn assert_message03(m: &Value) {
    assert_eq!(m["kind"], "message", "{m}");
    assert!(m["role"] == "user" || m["role"] == "agent", "{m}");
    for part in m["parts"].as_array().expect("parts") {
        assert!(part["kind"].is_string(), "{m}");
    }
}

fn assert_task03(task: &Value) {
    assert_eq!(task["kind"], "task", "{task}");
    assert!(
        task["id"].is_string() && task["contextId"].is_string(),
        "{task}"
    );
    let state = task["status"]["state"].as_str().expect("a state");
    assert!(
        !state.starts_with("TASK_STATE"),
        "a 0.3 state is kebab-case: {task}"
    );
    for m in task["history"].as_array().into_iter().flatten() {
        assert_message03(m);
    }
    for a in task["artifacts"].as_array().into_iter().flatten() {
        for part in a["parts"].as_array().expect("artifact parts") {
            assert!(part["kind"].is_string(), "{task}");
        }
    }
}

/// `message/send` blocks by default (0.3: `blocking` absent is true) and
/// answers the 0.3 Task.
#[tokio::test(flavor = "multi_thread")]
async fn message_send_answers_a_0_3_task() {
    let (server, http) = server().await;
    let answer = http
        .rpc(
            "message/send",
            json!({"message": message03("run the tests")}),
        )
        .await;
    let task = answer.result();
    assert_task03(task);
    assert_eq!(task["status"]["state"], "completed", "{task}");
    assert_eq!(task["history"][0]["role"], "user", "{task}");
    assert_eq!(task["artifacts"][0]["parts"][0]["kind"], "text", "{task}");
    assert_eq!(task["status"]["message"]["role"], "agent", "{task}");
    assert!(
        task["status"]["timestamp"].as_str().unwrap().ends_with('Z'),
        "{task}"
    );

    // A direct reply is a 0.3 Message.
    let answer = http
        .rpc("message/send", json!({"message": message03("ping")}))
        .await;
    assert_message03(answer.result());
    assert_eq!(answer.result()["parts"][0]["text"], "pong");

    // blocking: false answers at once, before the run ends.
    let answer = http
        .rpc(
            "message/send",
            json!({"message": message03("run the slow tests"),
                   "configuration": {"blocking": false, "acceptedOutputModes": ["text/plain"]}}),
        )
        .await;
    let task = answer.result();
    assert_task03(task);
    assert!(
        ["submitted", "working"].contains(&task["status"]["state"].as_str().unwrap()),
        "{task}"
    );
    server.stop().await;
}

/// `message/stream`: one Task first, then status and artifact updates,
/// `final` on the last status update, all with the request's id.
#[tokio::test(flavor = "multi_thread")]
async fn message_stream_sends_0_3_events_with_final() {
    let (server, http) = server().await;
    let response = http
        .rpc_stream(
            "/",
            "message/stream",
            json!({"message": message03("run the tests")}),
        )
        .await;
    let events = data_events(response).await;
    let results: Vec<&Value> = events
        .iter()
        .map(|e| {
            assert_eq!(e["id"], 7, "{e}");
            &e["result"]
        })
        .collect();
    let kinds: Vec<&str> = results
        .iter()
        .map(|r| r["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds[0], "task", "{kinds:?}");
    assert_eq!(
        kinds.iter().filter(|k| **k == "task").count(),
        1,
        "one Task, first: {kinds:?}"
    );
    assert!(kinds.contains(&"artifact-update"), "{kinds:?}");
    let updates: Vec<&&Value> = results
        .iter()
        .filter(|r| r["kind"] == "status-update")
        .collect();
    let last = updates.last().expect("status updates");
    assert_eq!(last["final"], true, "{last}");
    assert_eq!(last["status"]["state"], "completed", "{last}");
    for u in &updates[..updates.len() - 1] {
        assert_eq!(u["final"], false, "{u}");
    }
    let artifact = results
        .iter()
        .find(|r| r["kind"] == "artifact-update")
        .unwrap();
    assert_eq!(artifact["artifact"]["parts"][0]["kind"], "text");
    assert!(artifact["taskId"].is_string() && artifact["contextId"].is_string());
    server.stop().await;
}

/// `tasks/get`, `tasks/cancel` and their errors in 0.3 codes.
#[tokio::test(flavor = "multi_thread")]
async fn tasks_get_cancel_and_errors() {
    let (server, http) = server().await;
    let task = http
        .rpc(
            "message/send",
            json!({"message": message03("run the tests")}),
        )
        .await
        .result()
        .clone();
    let id = task["id"].as_str().unwrap();
    let got = http
        .rpc("tasks/get", json!({"id": id, "historyLength": 1}))
        .await;
    assert_task03(got.result());
    assert_eq!(got.result()["history"].as_array().unwrap().len(), 1);

    // Canceling a completed task: TaskNotCancelableError.
    let refused = http.rpc("tasks/cancel", json!({"id": id})).await;
    assert_eq!(refused.rpc_code(), -32002, "{:?}", refused.body);

    // A running task cancels.
    let running = http
        .rpc(
            "message/send",
            json!({"message": message03("run the slow tests"), "configuration": {"blocking": false}}),
        )
        .await
        .result()
        .clone();
    let canceled = http.rpc("tasks/cancel", json!({"id": running["id"]})).await;
    assert_task03(canceled.result());
    assert_eq!(canceled.result()["status"]["state"], "canceled");

    let missing = http.rpc("tasks/get", json!({"id": "no-such-task"})).await;
    assert_eq!(missing.rpc_code(), -32001, "{:?}", missing.body);
    let bad = http.rpc("message/send", json!({})).await;
    assert_eq!(bad.rpc_code(), -32602, "{:?}", bad.body);
    let bad_state = http
        .rpc(
            "message/send",
            json!({"message": {"kind": "message", "messageId": "m", "role": "robot", "parts": []}}),
        )
        .await;
    assert_eq!(bad_state.rpc_code(), -32602, "{:?}", bad_state.body);
    let unknown = http.rpc("tasks/frobnicate", json!({})).await;
    assert_eq!(unknown.rpc_code(), -32601, "{:?}", unknown.body);
    // 0.3 has no code for an extension or version error: -32603 would
    // hide it; the version header contradicting the method is one.
    server.stop().await;
}

/// A task a 0.3 client started is read and continued by a 1.0 client,
/// and the other way round.
#[tokio::test(flavor = "multi_thread")]
async fn tasks_are_shared_between_0_3_and_1_0_clients() {
    let (server, http) = server().await;
    let old = http
        .rpc(
            "message/send",
            json!({"message": message03("run the tests")}),
        )
        .await
        .result()
        .clone();
    let read = http
        .rpc("GetTask", json!({"id": old["id"]}))
        .await
        .result()
        .clone();
    assert_eq!(read["status"]["state"], "TASK_STATE_COMPLETED", "{read}");
    assert_eq!(read["history"][0]["role"], "ROLE_USER", "{read}");

    // A 1.0 client starts a multi-turn review; the 0.3 client reads it
    // (input-required) and continues it in its own terms to the end.
    let new = http
        .rpc_at(
            "/code-reviewer",
            "SendMessage",
            json!({"message": support::web::message("review my change")}),
        )
        .await;
    let new = new.result()["task"].clone();
    assert_eq!(new["status"]["state"], "TASK_STATE_INPUT_REQUIRED", "{new}");
    let id = new["id"].as_str().unwrap();
    let seen = http
        .rpc_at("/code-reviewer", "tasks/get", json!({"id": id}))
        .await;
    assert_task03(seen.result());
    assert_eq!(seen.result()["status"]["state"], "input-required");
    let mut follow = message03("diff --git a/x b/x");
    follow["taskId"] = json!(id);
    follow["contextId"] = new["contextId"].clone();
    let continued = http
        .rpc_at("/code-reviewer", "message/send", json!({"message": follow}))
        .await;
    assert_task03(continued.result());
    assert_eq!(continued.result()["id"], id, "{:?}", continued.body);
    assert_eq!(continued.result()["status"]["state"], "completed");
    // ... and the 1.0 client reads the end the 0.3 client brought about.
    let done = http
        .rpc_at("/code-reviewer", "GetTask", json!({"id": id}))
        .await;
    assert_eq!(done.result()["status"]["state"], "TASK_STATE_COMPLETED");
    let history = done.result()["history"].as_array().unwrap();
    assert!(
        history
            .iter()
            .any(|m| m["role"] == "ROLE_USER" && m["parts"][0]["text"] == "diff --git a/x b/x"),
        "{history:?}"
    );
    server.stop().await;
}

/// `tasks/resubscribe` follows a running task in 0.3 events.
#[tokio::test(flavor = "multi_thread")]
async fn tasks_resubscribe_follows_a_running_task() {
    let (server, http) = server().await;
    let running = http
        .rpc(
            "message/send",
            json!({"message": message03("run the slow tests"), "configuration": {"blocking": false}}),
        )
        .await
        .result()
        .clone();
    let id = running["id"].as_str().unwrap().to_owned();
    let response = http
        .rpc_stream("/", "tasks/resubscribe", json!({"id": id}))
        .await;
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    // The first event says the subscription is live; then cancel ends it.
    let mut text = next_chunk(&mut body, WAIT).await.expect("a first event");
    let cancel = http.rpc("tasks/cancel", json!({"id": id})).await;
    assert_eq!(cancel.result()["status"]["state"], "canceled");
    while let Some(chunk) = next_chunk(&mut body, WAIT).await {
        text.push_str(&chunk);
    }
    let events: Vec<Value> = parse(&text)
        .into_iter()
        .filter_map(|e| match e {
            Event::Data(None, v) => Some(v),
            _ => None,
        })
        .collect();
    assert_eq!(events[0]["result"]["kind"], "task", "{events:?}");
    let last = &events.last().expect("events")["result"];
    assert_eq!(last["kind"], "status-update", "{last}");
    assert_eq!(last["final"], true, "{last}");
    assert_eq!(last["status"]["state"], "canceled", "{last}");
    server.stop().await;
}

/// The 0.3 push-config methods, in 0.3 shapes.
#[tokio::test(flavor = "multi_thread")]
async fn push_configs_in_0_3_shapes() {
    let server = support::start_with_push().await;
    let http = Http::new(server.addr);
    let task = http
        .rpc(
            "message/send",
            json!({"message": message03("run the slow tests"), "configuration": {"blocking": false}}),
        )
        .await
        .result()
        .clone();
    let id = task["id"].as_str().unwrap();
    let config = json!({
        "taskId": id,
        "pushNotificationConfig": {
            "id": "cfg-1",
            "url": "https://hooks.example.test/a2a",
            "token": "tok-123",
            "authentication": {"schemes": ["Bearer"], "credentials": "xyz"}
        }
    });
    let set = http
        .rpc("tasks/pushNotificationConfig/set", config.clone())
        .await;
    assert_eq!(set.result(), &config, "{:?}", set.body);
    let got = http
        .rpc(
            "tasks/pushNotificationConfig/get",
            json!({"id": id, "pushNotificationConfigId": "cfg-1"}),
        )
        .await;
    assert_eq!(got.result(), &config);
    let listed = http
        .rpc("tasks/pushNotificationConfig/list", json!({"id": id}))
        .await;
    assert_eq!(listed.result(), &json!([config]));
    let deleted = http
        .rpc(
            "tasks/pushNotificationConfig/delete",
            json!({"id": id, "pushNotificationConfigId": "cfg-1"}),
        )
        .await;
    assert_eq!(deleted.result(), &Value::Null, "{:?}", deleted.body);
    let gone = http
        .rpc(
            "tasks/pushNotificationConfig/get",
            json!({"id": id, "pushNotificationConfigId": "cfg-1"}),
        )
        .await;
    assert_eq!(gone.rpc_code(), -32001, "{:?}", gone.body);
    http.rpc("tasks/cancel", json!({"id": id})).await.result();
    server.stop().await;
}

/// A webhook a 0.3 client registers gets 0.3 payloads (the task, as 0.3
/// servers POST it, with `X-A2A-Notification-Token`), one a 1.0 client
/// registers on the same task gets 1.0 `StreamResponse`s: the payload
/// follows the client that set the config, not the one that moves the
/// task.
#[tokio::test(flavor = "multi_thread")]
async fn webhooks_get_the_payloads_of_the_client_that_set_them() {
    let server = support::start_with_push().await;
    let http = Http::new(server.addr);
    let (url03, mut hook03) = support::webhook().await;
    let (url10, mut hook10) = support::webhook().await;

    // A 0.3 send brings its config: the task's first write is notified.
    let started = http
        .rpc(
            "message/send",
            json!({
                "message": message03("run the slow tests"),
                "configuration": {
                    "blocking": false,
                    "pushNotificationConfig": {"url": url03, "token": "tok-03"}
                }
            }),
        )
        .await;
    let id = started.result()["id"].as_str().unwrap().to_owned();
    // A 1.0 client adds its own config to the task.
    let set = http
        .rpc(
            "CreateTaskPushNotificationConfig",
            json!({"taskId": id, "id": "hook-10", "url": url10, "token": "tok-10"}),
        )
        .await;
    assert_eq!(set.result()["id"], "hook-10", "{:?}", set.body);
    // ... and a 1.0 client ends it.
    let canceled = http.rpc("CancelTask", json!({"id": id})).await;
    assert_eq!(
        canceled.result()["status"]["state"],
        "TASK_STATE_CANCELED",
        "{:?}",
        canceled.body
    );

    let posts03 = support::posted_until(&mut hook03, |b| b["status"]["state"] == "canceled").await;
    for post in &posts03 {
        assert_task03(&post.body);
        assert_eq!(post.body["id"], id.as_str(), "{}", post.body);
        assert_eq!(post.headers["x-a2a-notification-token"], "tok-03");
        assert_eq!(post.headers["content-type"], "application/json");
    }
    let last = &posts03.last().unwrap().body;
    assert_eq!(
        last["history"][0]["parts"][0]["text"], "run the slow tests",
        "{last}"
    );

    let posts10 = support::posted_until(&mut hook10, |b| {
        b["statusUpdate"]["status"]["state"] == "TASK_STATE_CANCELED"
    })
    .await;
    for post in &posts10 {
        assert_eq!(post.headers["x-a2a-notification-token"], "tok-10");
        assert_eq!(post.headers["content-type"], "application/a2a+json");
        assert!(
            post.body.get("statusUpdate").is_some() || post.body.get("artifactUpdate").is_some(),
            "a 1.0 StreamResponse: {}",
            post.body
        );
    }

    // Set again by a 1.0 client, the 0.3 client's config gets 1.0
    // payloads: the latest setter's version holds.
    let again = http
        .rpc(
            "message/send",
            json!({
                "message": message03("run the slow tests"),
                "configuration": {
                    "blocking": false,
                    "pushNotificationConfig": {"id": "both", "url": url03}
                }
            }),
        )
        .await;
    let id = again.result()["id"].as_str().unwrap().to_owned();
    let reset = http
        .rpc(
            "CreateTaskPushNotificationConfig",
            json!({"taskId": id, "id": "both", "url": url03}),
        )
        .await;
    assert_eq!(reset.result()["id"], "both", "{:?}", reset.body);
    http.rpc("CancelTask", json!({"id": id})).await.result();
    let posts = support::posted_until(&mut hook03, |b| {
        b["statusUpdate"]["status"]["state"] == "TASK_STATE_CANCELED"
    })
    .await;
    assert!(posts.last().unwrap().headers["content-type"] == "application/a2a+json");
    server.stop().await;
}

/// The card a 0.3 client reads: the 1.0 card with the 0.3 fields (`url`,
/// `preferredTransport`, `additionalInterfaces`, `protocolVersion`).
#[tokio::test(flavor = "multi_thread")]
async fn the_card_carries_the_0_3_fields() {
    let server = TestServer::start().await;
    let card = support::http_get(server.addr, "/.well-known/agent-card.json", &[]).await;
    let card: Value = serde_json::from_str(&card.body).unwrap();
    let base = format!("http://{}", server.addr);
    assert_eq!(card["url"], format!("{base}/"), "{card}");
    assert_eq!(card["preferredTransport"], "JSONRPC", "{card}");
    assert_eq!(card["protocolVersion"], "0.3.0", "{card}");
    let additional = card["additionalInterfaces"].as_array().expect("interfaces");
    assert_eq!(
        additional,
        &[
            json!({"transport": "JSONRPC", "url": format!("{base}/")}),
            json!({"transport": "HTTP+JSON", "url": base}),
            json!({"transport": "GRPC", "url": server.addr.to_string()}),
        ],
        "{card}"
    );
    // The 1.0 fields are all still there.
    assert!(card["supportedInterfaces"].as_array().unwrap().len() >= 3);
    assert_eq!(card["capabilities"]["streaming"], true);
    server.stop().await;
}

/// The version header (spec §3.6.2): a 0.3 method takes none, an empty
/// one or 0.3; another version is VersionNotSupported (-32603 in 0.3's
/// codes, the reason saying which).
#[tokio::test(flavor = "multi_thread")]
async fn a_0_3_method_refuses_another_version() {
    let (server, http) = server().await;
    for version in ["0.3", "0.3.0", ""] {
        let answer = http
            .clone()
            .with_header("A2A-Version", version)
            .rpc("tasks/get", json!({"id": "missing"}))
            .await;
        assert_eq!(answer.rpc_code(), -32001, "{version:?}: {:?}", answer.body);
    }
    let answer = http
        .clone()
        .with_header("A2A-Version", "1.0")
        .rpc(
            "message/send",
            json!({"message": message03("run the tests")}),
        )
        .await;
    assert_eq!(answer.rpc_code(), -32603, "{:?}", answer.body);
    assert_eq!(answer.reason(), "VERSION_NOT_SUPPORTED");
    // The 0.3 client's extensions header is read too.
    server.stop().await;
}

/// `--no-v0-3`: no 0.3 methods or card fields, and a request without a
/// version, a 0.3 client's (spec §3.6.2), is VersionNotSupported on
/// every binding; with `A2A-Version: 1.0` everything is served.
#[tokio::test(flavor = "multi_thread")]
async fn without_0_3_a_missing_version_is_refused() {
    let server = TestServer::start_discovery(
        std::sync::Arc::new(a2a_lifecycle::store::MemoryStore::new()),
        a2a_lifecycle::agent::demo::demo_router(),
        Default::default(),
        a2a_lifecycle::discovery::DiscoveryConfig {
            no_v0_3: true,
            ..Default::default()
        },
    )
    .await;
    let http = Http::new(server.addr);
    let answer = http
        .rpc(
            "message/send",
            json!({"message": message03("run the tests")}),
        )
        .await;
    assert_eq!(answer.rpc_code(), -32009, "{:?}", answer.body);
    let answer = http
        .rpc(
            "SendMessage",
            json!({"message": support::web::message("run the tests")}),
        )
        .await;
    assert_eq!(answer.rpc_code(), -32009, "{:?}", answer.body);
    let rest = http.rest("GET", "/tasks/missing", None).await;
    assert_eq!(rest.status, 400, "{:?}", rest.body);
    assert_eq!(rest.reason(), "VERSION_NOT_SUPPORTED");
    let mut client = server.client().await;
    let status = tokio::time::timeout(
        WAIT,
        client.get_task(a2a_lifecycle::proto::GetTaskRequest {
            id: "missing".into(),
            ..Default::default()
        }),
    )
    .await
    .unwrap()
    .unwrap_err();
    support::assert_a2a_error(
        &status,
        tonic::Code::FailedPrecondition,
        "VERSION_NOT_SUPPORTED",
    );

    let v1 = http.clone().with_header("A2A-Version", "1.0");
    let answer = v1
        .rpc(
            "SendMessage",
            json!({"message": support::web::message("run the tests")}),
        )
        .await;
    assert_eq!(
        answer.result()["task"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
    // 0.3's gRPC service is not there at all.
    let mut old = a2a_lifecycle::proto::v0_3::a2a_service_client::A2aServiceClient::new(
        server.channel().await,
    );
    let status = tokio::time::timeout(
        WAIT,
        old.get_task(a2a_lifecycle::proto::v0_3::GetTaskRequest {
            name: "tasks/x".into(),
            history_length: 0,
        }),
    )
    .await
    .unwrap()
    .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unimplemented, "{status:?}");
    let card = support::http_get(server.addr, "/.well-known/agent-card.json", &[]).await;
    let card: Value = serde_json::from_str(&card.body).unwrap();
    assert!(card.get("url").is_none(), "{card}");
    assert!(card.get("preferredTransport").is_none(), "{card}");
    server.stop().await;
}

/// The official Python SDK's 0.3 client (a2a-sdk 0.3.26) connects
/// through the card with its defaults and sends, gets, streams and
/// cancels (`tests/interop/client_v0_3.py`). `A2A_TEST_PYTHON_V03` names
/// a Python with that SDK (CI makes one); without it the test says so
/// and checks nothing else.
#[tokio::test(flavor = "multi_thread")]
async fn the_official_0_3_python_client_is_served() {
    let Ok(python) = std::env::var("A2A_TEST_PYTHON_V03") else {
        eprintln!("skipped: set A2A_TEST_PYTHON_V03 to a Python with a2a-sdk==0.3.26");
        return;
    };
    let (server, _) = server().await;
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/client_v0_3.py");
    let run = tokio::process::Command::new(&python)
        .arg(&script)
        .arg(format!("http://{}", server.addr))
        .output();
    let out = tokio::time::timeout(WAIT, run).await.unwrap().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("ok ")).count(),
        7,
        "{stdout}"
    );
    server.stop().await;
}

fn message03_pb(text: &str) -> Value {
    json!({
        "messageId": uuid::Uuid::new_v4().to_string(),
        "role": "ROLE_USER",
        "content": [{"text": text}],
    })
}

/// The 0.3 HTTP+JSON routes: bodies and answers are the ProtoJSON of
/// 0.3's proto (`content`, `TASK_STATE_CANCELLED`, no `kind`).
#[tokio::test(flavor = "multi_thread")]
async fn the_0_3_rest_routes() {
    let server = support::start_with_push().await;
    let http = Http::new(server.addr);
    // blocking: true waits; absent is false over REST, as 0.3 reads it.
    let sent = http
        .rest(
            "POST",
            "/v1/message:send",
            Some(json!({"message": message03_pb("run the tests"), "configuration": {"blocking": true}})),
        )
        .await;
    assert_eq!(sent.status, 200, "{:?}", sent.body);
    let task = &sent.body["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
    assert_eq!(
        task["history"][0]["content"][0]["text"], "run the tests",
        "{task}"
    );
    assert!(task.get("kind").is_none() && task["history"][0].get("parts").is_none());
    let id = task["id"].as_str().unwrap().to_owned();

    let got = http
        .rest("GET", &format!("/v1/tasks/{id}?historyLength=1"), None)
        .await;
    assert_eq!(got.status, 200, "{:?}", got.body);
    assert_eq!(got.body["history"].as_array().unwrap().len(), 1);
    assert_eq!(
        got.body["artifacts"][0]["parts"][0]["text"],
        "collected 12 tests\n"
    );

    let slow = http
        .rest(
            "POST",
            "/v1/message:send",
            Some(json!({"message": message03_pb("run the slow tests")})),
        )
        .await;
    let slow_id = slow.body["task"]["id"].as_str().unwrap().to_owned();
    assert_ne!(slow.body["task"]["status"]["state"], "TASK_STATE_COMPLETED");

    // Push configs: the official client's whole request, or the config.
    let created = http
        .rest(
            "POST",
            &format!("/v1/tasks/{slow_id}/pushNotificationConfigs"),
            Some(json!({"parent": format!("tasks/{slow_id}"), "configId": "c1",
                         "config": {"pushNotificationConfig": {"url": "https://hooks.example.test/h",
                                    "authentication": {"schemes": ["Bearer"], "credentials": "x"}}}})),
        )
        .await;
    assert_eq!(created.status, 200, "{:?}", created.body);
    assert_eq!(
        created.body["name"],
        format!("tasks/{slow_id}/pushNotificationConfigs/c1")
    );
    assert_eq!(
        created.body["pushNotificationConfig"]["authentication"]["schemes"],
        json!(["Bearer"])
    );
    let listed = http
        .rest(
            "GET",
            &format!("/v1/tasks/{slow_id}/pushNotificationConfigs"),
            None,
        )
        .await;
    assert_eq!(
        listed.body["configs"].as_array().unwrap().len(),
        1,
        "{:?}",
        listed.body
    );
    let path = format!("/v1/tasks/{slow_id}/pushNotificationConfigs/c1");
    assert_eq!(http.rest("GET", &path, None).await.status, 200);
    assert_eq!(http.rest("DELETE", &path, None).await.status, 200);
    assert_eq!(http.rest("GET", &path, None).await.status, 404);

    let canceled = http
        .rest(
            "POST",
            &format!("/v1/tasks/{slow_id}:cancel"),
            Some(json!({"name": format!("tasks/{slow_id}")})),
        )
        .await;
    assert_eq!(canceled.status, 200, "{:?}", canceled.body);
    assert_eq!(canceled.body["status"]["state"], "TASK_STATE_CANCELLED");

    let missing = http.rest("GET", "/v1/tasks/no-such-task", None).await;
    assert_eq!(missing.status, 404);
    assert_eq!(missing.reason(), "TASK_NOT_FOUND");
    let wrong = http.rest("DELETE", "/v1/message:send", None).await;
    assert_eq!(wrong.status, 405);
    let card = http.rest("GET", "/v1/card", None).await;
    assert_eq!(card.status, 400, "no extended card: {:?}", card.body);
    server.stop().await;
}

/// A 0.3 stream over REST: 0.3 `StreamResponse`s, one task first,
/// `final` on the last status update; a tenant by path prefix.
#[tokio::test(flavor = "multi_thread")]
async fn the_0_3_rest_stream() {
    let (server, http) = server().await;
    let response = http
        .rest_stream(
            "POST",
            "/code-reviewer/v1/message:stream",
            Some(json!({"message": message03_pb("review my change")})),
        )
        .await;
    let events = data_events(response).await;
    assert!(events[0].get("task").is_some(), "{events:?}");
    let last = events.last().unwrap();
    assert_eq!(last["statusUpdate"]["final"], true, "{last}");
    assert_eq!(
        last["statusUpdate"]["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{last}"
    );
    assert_eq!(
        last["statusUpdate"]["status"]["message"]["content"][0]["text"],
        "Please send the diff to review."
    );
    server.stop().await;
}

/// The 0.3 gRPC service (`a2a.v1.A2AService`) beside 1.0's, with the
/// generated 0.3 client stubs.
#[tokio::test(flavor = "multi_thread")]
async fn the_0_3_grpc_service() {
    use a2a_lifecycle::proto::v0_3 as old;
    use old::a2a_service_client::A2aServiceClient;

    let (server, _) = server().await;
    let mut client = A2aServiceClient::new(server.channel().await);
    let message = |text: &str| old::Message {
        message_id: uuid::Uuid::new_v4().to_string(),
        role: old::Role::User as i32,
        content: vec![old::Part {
            metadata: None,
            part: Some(old::part::Part::Text(text.into())),
        }],
        ..Default::default()
    };
    let sent = tokio::time::timeout(
        WAIT,
        client.send_message(old::SendMessageRequest {
            request: Some(message("run the tests")),
            configuration: Some(old::SendMessageConfiguration {
                blocking: true,
                ..Default::default()
            }),
            metadata: None,
        }),
    )
    .await
    .unwrap()
    .unwrap()
    .into_inner();
    let Some(old::send_message_response::Payload::Task(task)) = sent.payload else {
        panic!("a task: {sent:?}");
    };
    assert_eq!(
        task.status.as_ref().unwrap().state,
        old::TaskState::Completed as i32
    );
    let got = tokio::time::timeout(
        WAIT,
        client.get_task(old::GetTaskRequest {
            name: format!("tasks/{}", task.id),
            history_length: 0,
        }),
    )
    .await
    .unwrap()
    .unwrap()
    .into_inner();
    assert_eq!(got.id, task.id);
    assert_eq!(got.artifacts[0].name, "test-report");

    let mut stream = tokio::time::timeout(
        WAIT,
        client.send_streaming_message(old::SendMessageRequest {
            request: Some(message("run the tests")),
            ..Default::default()
        }),
    )
    .await
    .unwrap()
    .unwrap()
    .into_inner();
    let mut events = Vec::new();
    while let Some(event) = tokio::time::timeout(WAIT, stream.message())
        .await
        .unwrap()
        .unwrap()
    {
        events.push(event.payload.expect("a payload"));
    }
    assert!(
        matches!(events[0], old::stream_response::Payload::Task(_)),
        "{events:?}"
    );
    let Some(old::stream_response::Payload::StatusUpdate(last)) = events.last() else {
        panic!("{events:?}");
    };
    assert!(last.r#final, "{last:?}");

    let slow = tokio::time::timeout(
        WAIT,
        client.send_message(old::SendMessageRequest {
            request: Some(message("run the slow tests")),
            ..Default::default()
        }),
    )
    .await
    .unwrap()
    .unwrap()
    .into_inner();
    let Some(old::send_message_response::Payload::Task(slow)) = slow.payload else {
        panic!("a task");
    };
    let canceled = tokio::time::timeout(
        WAIT,
        client.cancel_task(old::CancelTaskRequest {
            name: format!("tasks/{}", slow.id),
        }),
    )
    .await
    .unwrap()
    .unwrap()
    .into_inner();
    assert_eq!(
        canceled.status.unwrap().state,
        old::TaskState::Cancelled as i32
    );

    let missing = tokio::time::timeout(
        WAIT,
        client.get_task(old::GetTaskRequest {
            name: "tasks/no-such-task".into(),
            history_length: 0,
        }),
    )
    .await
    .unwrap()
    .unwrap_err();
    support::assert_a2a_error(&missing, tonic::Code::NotFound, "TASK_NOT_FOUND");
    let bad = tokio::time::timeout(
        WAIT,
        client.get_task(old::GetTaskRequest {
            name: "no-such-name".into(),
            history_length: 0,
        }),
    )
    .await
    .unwrap()
    .unwrap_err();
    support::assert_bad_field(&bad, "name");

    // The 1.0 client reads the task the 0.3 one started.
    let mut v1 = server.client().await;
    let read = support::get_task(&mut v1, "", &task.id).await.unwrap();
    assert_eq!(read.id, task.id);

    // Counted as the 1.0 operations, with the version they came in.
    let metrics = support::http_get(server.addr, "/metrics", &[]).await.body;
    let scrape = support::parse_metrics(&metrics);
    let count = |version: &str, method: &str, code: &str| {
        support::metric_value(
            &scrape,
            "a2a_rpc_requests_total",
            &[
                ("binding", "grpc"),
                ("protocol_version", version),
                ("method", method),
                ("code", code),
            ],
        )
    };
    assert_eq!(count("0.3", "SendMessage", "OK"), 2.0, "{metrics}");
    assert_eq!(count("0.3", "SubscribeToTask", "OK"), 0.0);
    assert_eq!(count("0.3", "SendStreamingMessage", "OK"), 1.0);
    assert_eq!(count("0.3", "GetTask", "NOT_FOUND"), 1.0);
    assert_eq!(count("1.0", "GetTask", "OK"), 1.0);

    // The card, in 0.3's proto: the 1.0 card's content, the 0.3
    // interfaces (gRPC among them) a 0.3 client picks from.
    let card = tokio::time::timeout(WAIT, client.get_agent_card(old::GetAgentCardRequest {}))
        .await
        .unwrap()
        .expect("GetAgentCard of 0.3")
        .into_inner();
    let served = support::http_get(server.addr, "/.well-known/agent-card.json", &[]).await;
    let v1_card = support::card_1_0(&served.body);
    assert_eq!(card.protocol_version, "0.3.0");
    assert_eq!(card.name, v1_card.name);
    assert_eq!(card.preferred_transport, "JSONRPC");
    assert_eq!(card.url, format!("http://{}/", server.addr));
    let transports: Vec<&str> = card
        .additional_interfaces
        .iter()
        .map(|i| i.transport.as_str())
        .collect();
    assert_eq!(transports, ["JSONRPC", "HTTP+JSON", "GRPC"], "{card:?}");
    let skills: Vec<&str> = card.skills.iter().map(|s| s.id.as_str()).collect();
    let v1_skills: Vec<&str> = v1_card.skills.iter().map(|s| s.id.as_str()).collect();
    assert!(!skills.is_empty());
    assert_eq!(skills, v1_skills);
    assert_eq!(
        card.capabilities.as_ref().map(|c| c.streaming),
        Some(true),
        "{card:?}"
    );
    server.stop().await;
}

/// The extended card, over 0.3's JSON-RPC method and REST route: the
/// 0.3 fields a 0.3 client validates, beside the 1.0 card.
#[tokio::test(flavor = "multi_thread")]
async fn the_extended_card_in_0_3_form() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("v0_3-extended");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{}.json", uuid::Uuid::new_v4()));
    std::fs::write(&path, r#"{"name": "Test runner (extended)"}"#).unwrap();
    let extended = a2a_lifecycle::discovery::DiscoveryConfig::read_extended_card(&path).unwrap();
    let server = TestServer::start_discovery(
        std::sync::Arc::new(a2a_lifecycle::store::MemoryStore::new()),
        a2a_lifecycle::agent::demo::demo_router(),
        Default::default(),
        a2a_lifecycle::discovery::DiscoveryConfig {
            extended_card: Some(extended),
            ..Default::default()
        },
    )
    .await;
    let http = Http::new(server.addr);
    let public = support::http_get(server.addr, "/.well-known/agent-card.json", &[]).await;
    let public: Value = serde_json::from_str(&public.body).unwrap();
    assert_eq!(
        public["supportsAuthenticatedExtendedCard"], true,
        "{public}"
    );
    let rpc = http
        .rpc("agent/getAuthenticatedExtendedCard", json!({}))
        .await;
    let rest = http.rest("GET", "/v1/card", None).await;
    assert_eq!(rest.status, 200, "{:?}", rest.body);
    for card in [rpc.result(), &rest.body] {
        assert_eq!(card["name"], "Test runner (extended)", "{card}");
        assert_eq!(card["url"], format!("http://{}/", server.addr), "{card}");
        assert_eq!(card["preferredTransport"], "JSONRPC", "{card}");
        assert_eq!(card["supportsAuthenticatedExtendedCard"], true, "{card}");
    }
    server.stop().await;
}
