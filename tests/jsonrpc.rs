//! The JSON-RPC 2.0 binding (spec §9) over real HTTP: every method, its
//! streams, every error code with its ErrorInfo, tenants by path and by
//! field, limits and malformed bodies.

use crate::support;

use serde_json::{Value, json};

use support::TestServer;
use support::web::{Http, data_events, describe, message};

async fn server() -> (TestServer, Http) {
    let server = TestServer::start().await;
    let http = Http::new(server.addr);
    (server, http)
}

/// spec §9.4.1: a blocking send answers with the finished task; the id
/// comes back as sent, string or number.
#[tokio::test(flavor = "multi_thread")]
async fn send_message_answers_the_task_and_echoes_the_id() {
    let (server, http) = server().await;
    let answer = http
        .rpc("SendMessage", json!({"message": message("run the tests")}))
        .await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.headers["content-type"], "application/json");
    let task = &answer.result()["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED");
    assert_eq!(task["artifacts"][0]["name"], "test-report");
    for id in [json!(42), json!("abc"), json!(-1.5), Value::Null] {
        let body =
            json!({"jsonrpc": "2.0", "id": id, "method": "GetTask", "params": {"id": task["id"]}});
        let answer = http
            .post_raw("/", Some("application/json"), body.to_string().into_bytes())
            .await;
        assert_eq!(answer.body["id"], id, "{:?}", answer.body);
        assert_eq!(answer.body["jsonrpc"], "2.0");
        assert_eq!(answer.result()["id"], task["id"]);
    }
    // A direct reply is a message, not a task.
    let answer = http
        .rpc("SendMessage", json!({"message": message("ping")}))
        .await;
    assert_eq!(answer.result()["message"]["parts"][0]["text"], "pong");
    server.stop().await;
}

/// spec §9.4.2: an event stream of JSON-RPC responses with the request's
/// id, the task first, in order, ending where the gRPC stream ends.
#[tokio::test(flavor = "multi_thread")]
async fn send_streaming_message_streams_json_rpc_responses() {
    let (server, http) = server().await;
    let response = http
        .rpc_stream(
            "/",
            "SendStreamingMessage",
            json!({"message": message("run the tests")}),
        )
        .await;
    let events = data_events(response).await;
    for event in &events {
        assert_eq!(event["jsonrpc"], "2.0");
        assert_eq!(event["id"], 7);
        assert!(event.get("error").is_none(), "{event}");
    }
    let kinds: Vec<String> = events.iter().map(|e| describe(&e["result"])).collect();
    assert_eq!(
        kinds.first().map(String::as_str),
        Some("task:TASK_STATE_SUBMITTED"),
        "{kinds:?}"
    );
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("statusUpdate:TASK_STATE_COMPLETED"),
        "{kinds:?}"
    );
    assert!(kinds.contains(&"artifactUpdate".to_owned()), "{kinds:?}");
    // The code reviewer's stream ends at INPUT_REQUIRED.
    let response = http
        .rpc_stream(
            "/",
            "SendStreamingMessage",
            json!({"tenant": "code-reviewer", "message": message("review this")}),
        )
        .await;
    let events = data_events(response).await;
    let last = describe(&events.last().unwrap()["result"]);
    assert_eq!(last, "statusUpdate:TASK_STATE_INPUT_REQUIRED");
    server.stop().await;
}

/// GetTask, ListTasks, CancelTask and SubscribeToTask (spec §9.4.3-6).
#[tokio::test(flavor = "multi_thread")]
async fn get_list_cancel_and_subscribe() {
    let (server, http) = server().await;
    let slow = http
        .rpc(
            "SendMessage",
            json!({"message": message("slow tests"), "configuration": {"returnImmediately": true}}),
        )
        .await;
    let id = slow.result()["task"]["id"].as_str().unwrap().to_owned();
    let got = http
        .rpc("GetTask", json!({"id": id, "historyLength": 0}))
        .await;
    assert_eq!(got.result()["id"], id.as_str());
    assert!(got.result().get("history").is_none(), "{:?}", got.body);
    let listed = http
        .rpc(
            "ListTasks",
            json!({"status": "TASK_STATE_WORKING", "pageSize": 10}),
        )
        .await;
    let tasks = listed.result()["tasks"].as_array().unwrap();
    assert!(
        tasks.iter().any(|t| t["id"] == id.as_str()),
        "{:?}",
        listed.body
    );
    assert_eq!(listed.result()["pageSize"], 10);
    // A subscriber sees the cancel end its stream.
    let subscription = http
        .rpc_stream("/", "SubscribeToTask", json!({"id": id}))
        .await;
    assert_eq!(subscription.status(), 200);
    let canceled = http.rpc("CancelTask", json!({"id": id})).await;
    assert_eq!(canceled.result()["status"]["state"], "TASK_STATE_CANCELED");
    let events = data_events(subscription).await;
    let kinds: Vec<String> = events.iter().map(|e| describe(&e["result"])).collect();
    assert_eq!(
        kinds.first().map(String::as_str),
        Some("task:TASK_STATE_WORKING"),
        "{kinds:?}"
    );
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("statusUpdate:TASK_STATE_CANCELED"),
        "{kinds:?}"
    );
    server.stop().await;
}

/// The four push config methods (spec §9.4.7), on a server that delivers
/// push notifications to loopback.
#[tokio::test(flavor = "multi_thread")]
async fn push_config_methods() {
    let server = support::start_with_push().await;
    let http = Http::new(server.addr);
    let task = http
        .rpc(
            "SendMessage",
            json!({"message": message("slow"), "configuration": {"returnImmediately": true}}),
        )
        .await;
    let id = task.result()["task"]["id"].as_str().unwrap().to_owned();
    let created = http
        .rpc(
            "CreateTaskPushNotificationConfig",
            json!({"taskId": id, "id": "hook-1", "url": "http://127.0.0.1:9/hook", "token": "t"}),
        )
        .await;
    assert_eq!(created.result()["id"], "hook-1");
    assert_eq!(created.result()["url"], "http://127.0.0.1:9/hook");
    let got = http
        .rpc(
            "GetTaskPushNotificationConfig",
            json!({"taskId": id, "id": "hook-1"}),
        )
        .await;
    assert_eq!(got.result()["token"], "t");
    let listed = http
        .rpc("ListTaskPushNotificationConfigs", json!({"taskId": id}))
        .await;
    assert_eq!(listed.result()["configs"].as_array().unwrap().len(), 1);
    let deleted = http
        .rpc(
            "DeleteTaskPushNotificationConfig",
            json!({"taskId": id, "id": "hook-1"}),
        )
        .await;
    assert_eq!(deleted.result(), &json!({}));
    let gone = http
        .rpc(
            "GetTaskPushNotificationConfig",
            json!({"taskId": id, "id": "hook-1"}),
        )
        .await;
    assert_eq!(gone.rpc_code(), -32001);
    assert_eq!(gone.error_info()["metadata"]["config_id"], "hook-1");
    http.rpc("CancelTask", json!({"id": id})).await.result();
    server.stop().await;
}

/// spec §9.5, §5.4: each error with its code, message and ErrorInfo.
#[tokio::test(flavor = "multi_thread")]
async fn every_error_code_with_its_error_info() {
    let (server, http) = server().await;
    // -32700: not JSON; the id is null.
    let answer = http
        .post_raw(
            "/",
            Some("application/json"),
            b"{\"jsonrpc\": \"2.0\", \"id\": 1,".to_vec(),
        )
        .await;
    assert_eq!(answer.status, 400);
    assert_eq!(answer.rpc_code(), -32700);
    assert_eq!(answer.body["id"], Value::Null);
    assert!(!answer.body["error"]["message"].as_str().unwrap().is_empty());
    // -32600: JSON, but no request.
    for (body, why) in [
        (json!({"id": 1, "method": "GetTask"}), "no jsonrpc"),
        (
            json!({"jsonrpc": "1.0", "id": 1, "method": "GetTask"}),
            "wrong version",
        ),
        (
            json!({"jsonrpc": "2.0", "id": 1, "method": 5}),
            "method not a string",
        ),
        (
            json!({"jsonrpc": "2.0", "id": {"x": 1}, "method": "GetTask"}),
            "object id",
        ),
        (json!({"jsonrpc": "2.0", "method": "GetTask"}), "no id"),
        (json!(["not", "requests"]), "batch of non-requests"),
        (json!("a string"), "not an object"),
    ] {
        let answer = http
            .post_raw("/", Some("application/json"), body.to_string().into_bytes())
            .await;
        let code = if answer.body.is_array() {
            answer.body[0]["error"]["code"].as_i64().unwrap()
        } else {
            assert_eq!(answer.status, 400, "{why}");
            answer.rpc_code()
        };
        assert_eq!(code, -32600, "{why}: {:?}", answer.body);
    }
    // -32601: no such method; the id is echoed.
    let answer = http.rpc("message/frobnicate", json!({})).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.rpc_code(), -32601);
    assert_eq!(answer.reason(), "METHOD_NOT_FOUND");
    // -32602: params that do not decode, or do not validate.
    let answer = http.rpc("GetTask", json!({"historyLength": "many"})).await;
    assert_eq!(answer.rpc_code(), -32602);
    assert_eq!(answer.reason(), "INVALID_PARAMS");
    let answer = http.rpc("GetTask", json!([1, 2])).await;
    assert_eq!(answer.rpc_code(), -32602);
    let answer = http
        .rpc(
            "SendMessage",
            json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": []}}),
        )
        .await;
    assert_eq!(answer.rpc_code(), -32602);
    assert_eq!(answer.bad_field(), "message.parts");
    // -32001: no such task, the task named.
    let answer = http.rpc("GetTask", json!({"id": "nope"})).await;
    assert_eq!(answer.rpc_code(), -32001);
    assert_eq!(answer.reason(), "TASK_NOT_FOUND");
    assert_eq!(answer.error_info()["metadata"]["task_id"], "nope");
    // -32002: cancel a finished task.
    let done = http
        .rpc("SendMessage", json!({"message": message("run the tests")}))
        .await;
    let done_id = done.result()["task"]["id"].clone();
    let answer = http.rpc("CancelTask", json!({"id": done_id})).await;
    assert_eq!(answer.rpc_code(), -32002);
    assert_eq!(answer.reason(), "TASK_NOT_CANCELABLE");
    // -32004: subscribe to a finished task; a message to it.
    let answer = http.rpc("SubscribeToTask", json!({"id": done_id})).await;
    assert_eq!(answer.rpc_code(), -32004);
    let mut follow_up = message("more");
    follow_up["taskId"] = done_id.clone();
    let answer = http.rpc("SendMessage", json!({"message": follow_up})).await;
    assert_eq!(answer.rpc_code(), -32004);
    assert_eq!(answer.reason(), "UNSUPPORTED_OPERATION");
    // The same before a stream: a JSON answer, not an event stream.
    let response = http
        .rpc_stream("/", "SubscribeToTask", json!({"id": done_id}))
        .await;
    assert_eq!(response.headers()["content-type"], "application/json");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], -32004);
    assert_eq!(body["id"], 7);
    // -32003: push config methods with push off.
    let answer = http
        .rpc(
            "ListTaskPushNotificationConfigs",
            json!({"taskId": done_id}),
        )
        .await;
    assert_eq!(answer.rpc_code(), -32003);
    assert_eq!(answer.reason(), "PUSH_NOTIFICATION_NOT_SUPPORTED");
    // -32005: a part of a media type the card does not accept.
    let answer = http
        .rpc(
            "SendMessage",
            json!({"message": {"messageId": "m-img", "role": "ROLE_USER",
                "parts": [{"raw": "AAEC", "mediaType": "image/png"}]}}),
        )
        .await;
    assert_eq!(answer.rpc_code(), -32005);
    assert_eq!(answer.reason(), "CONTENT_TYPE_NOT_SUPPORTED");
    assert_eq!(answer.error_info()["metadata"]["media_type"], "image/png");
    // -32004 again: no extended card on this agent.
    let answer = http.rpc("GetExtendedAgentCard", json!({})).await;
    assert_eq!(answer.rpc_code(), -32004);
    // -32009: a version this server does not serve.
    let answer = http
        .send(
            http.client
                .post(format!("{}/", http.base))
                .header("content-type", "application/json")
                .header("A2A-Version", "9.9")
                .body(
                    json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}})
                        .to_string(),
                ),
        )
        .await;
    assert_eq!(answer.rpc_code(), -32009);
    assert_eq!(answer.error_info()["metadata"]["requested_version"], "9.9");
    server.stop().await;
}

/// -32007 and -32008 need a card that declares them.
#[tokio::test(flavor = "multi_thread")]
async fn extended_card_and_required_extension_errors() {
    use a2a_lifecycle::discovery::DiscoveryConfig;
    use a2a_lifecycle::proto::{AgentCapabilities, AgentCard};
    let declared = DiscoveryConfig {
        extended_card: Some(AgentCard {
            name: "extended".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let server = TestServer::start_discovery(
        std::sync::Arc::new(a2a_lifecycle::store::MemoryStore::new()),
        a2a_lifecycle::agent::demo::demo_router(),
        Default::default(),
        declared,
    )
    .await;
    let http = Http::new(server.addr);
    let answer = http.rpc("GetExtendedAgentCard", json!({})).await;
    assert_eq!(answer.result()["name"], "extended");
    server.stop().await;

    let agents = support::agent_with_card(AgentCard {
        name: "needs-ext".into(),
        capabilities: Some(AgentCapabilities {
            streaming: Some(true),
            extended_agent_card: Some(true),
            extensions: vec![a2a_lifecycle::proto::AgentExtension {
                uri: "urn:ext:required".into(),
                required: true,
                ..Default::default()
            }],
            ..Default::default()
        }),
        default_input_modes: vec!["text/plain".into()],
        ..Default::default()
    });
    let server = TestServer::start_with(agents, Default::default()).await;
    let http = Http::new(server.addr);
    let answer = http.rpc("GetTask", json!({"id": "x"})).await;
    assert_eq!(answer.rpc_code(), -32008);
    assert_eq!(
        answer.error_info()["metadata"]["extension"],
        "urn:ext:required"
    );
    let answer = http
        .send(
            http.client
                .post(format!("{}/", http.base))
                .header("content-type", "application/json")
                .header("A2A-Extensions", "urn:ext:other, urn:ext:required")
                .body(
                    json!({"jsonrpc": "2.0", "id": 1, "method": "GetExtendedAgentCard"})
                        .to_string(),
                ),
        )
        .await;
    assert_eq!(answer.rpc_code(), -32007);
    assert_eq!(answer.reason(), "EXTENDED_AGENT_CARD_NOT_CONFIGURED");
    server.stop().await;
}

/// Tenants by the endpoint path and by the field; contradicting ones are
/// refused.
#[tokio::test(flavor = "multi_thread")]
async fn tenants_by_path_and_by_field() {
    let (server, http) = server().await;
    let by_field = http
        .rpc(
            "SendMessage",
            json!({"tenant": "code-reviewer", "message": message("review")}),
        )
        .await;
    assert_eq!(
        by_field.result()["task"]["status"]["state"],
        "TASK_STATE_INPUT_REQUIRED"
    );
    let id = by_field.result()["task"]["id"].clone();
    let by_path = http
        .rpc_at("/code-reviewer", "GetTask", json!({"id": id}))
        .await;
    assert_eq!(by_path.result()["id"], id);
    // Another tenant does not see it.
    let answer = http.rpc_at("/deployer", "GetTask", json!({"id": id})).await;
    assert_eq!(answer.rpc_code(), -32001);
    let answer = http.rpc("GetTask", json!({"id": id})).await;
    assert_eq!(answer.rpc_code(), -32001);
    let answer = http
        .rpc_at(
            "/code-reviewer",
            "GetTask",
            json!({"id": id, "tenant": "deployer"}),
        )
        .await;
    assert_eq!(answer.rpc_code(), -32602);
    assert_eq!(answer.bad_field(), "tenant");
    let answer = http.rpc_at("/nobody", "GetTask", json!({"id": id})).await;
    assert_eq!(answer.rpc_code(), -32602);
    server.stop().await;
}

/// Bodies over the limit are 413, bodies that are not JSON 415; neither
/// is read as a call.
#[tokio::test(flavor = "multi_thread")]
async fn oversized_and_non_json_bodies() {
    let (server, http) = server().await;
    let answer = support::web::declared_too_large(server.addr, "/").await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("\"OUT_OF_RANGE\""), "{answer}");
    let answer = http
        .send(
            http.client
                .post(format!("{}/", http.base))
                .header("content-type", "application/json")
                .body(support::web::oversized_body()),
        )
        .await;
    assert_eq!(answer.status, 413);
    assert_eq!(answer.rpc_code(), -32600);
    assert_eq!(answer.reason(), "OUT_OF_RANGE");
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}});
    let answer = http
        .post_raw("/", Some("text/plain"), call.to_string().into_bytes())
        .await;
    assert_eq!(answer.status, 415);
    let answer = http
        .post_raw("/", None, call.to_string().into_bytes())
        .await;
    assert_eq!(answer.status, 415);
    // `application/json; charset=utf-8` is JSON.
    let answer = http
        .post_raw(
            "/",
            Some("application/json; charset=utf-8"),
            call.to_string().into_bytes(),
        )
        .await;
    assert_eq!(answer.rpc_code(), -32001);
    server.stop().await;
}

/// Batches answer each call in order; streaming methods are refused in
/// them, and one batch holds at most 32 calls.
#[tokio::test(flavor = "multi_thread")]
async fn batches() {
    let (server, http) = server().await;
    let batch = json!([
        {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message("ping")}},
        {"jsonrpc": "2.0", "id": "two", "method": "GetTask", "params": {"id": "nope"}},
        {"jsonrpc": "2.0", "id": 3, "method": "SubscribeToTask", "params": {"id": "nope"}},
    ]);
    let answer = http
        .post_raw(
            "/",
            Some("application/json"),
            batch.to_string().into_bytes(),
        )
        .await;
    let answers = answer.body.as_array().expect("an array");
    assert_eq!(answers.len(), 3);
    assert_eq!(answers[0]["id"], 1);
    assert_eq!(answers[0]["result"]["message"]["parts"][0]["text"], "pong");
    assert_eq!(answers[1]["id"], "two");
    assert_eq!(answers[1]["error"]["code"], -32001);
    assert_eq!(answers[2]["error"]["code"], -32600);
    let too_many: Vec<Value> = (0..33)
        .map(|i| json!({"jsonrpc": "2.0", "id": i, "method": "GetTask", "params": {"id": "x"}}))
        .collect();
    let answer = http
        .post_raw(
            "/",
            Some("application/json"),
            Value::Array(too_many).to_string().into_bytes(),
        )
        .await;
    assert_eq!(answer.status, 400);
    assert_eq!(answer.rpc_code(), -32600);
    server.stop().await;
}
