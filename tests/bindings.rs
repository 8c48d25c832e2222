//! The three bindings on one port and one core: a task read and followed
//! through each, the cards listing exactly the bindings served, one set
//! of rules for all (authentication, ownership), CORS for browsers, and
//! the event streams' keep-alive, disconnect and shutdown.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{Value, json};

use a2a_lifecycle::auth::Authenticator;
use a2a_lifecycle::connections::ConnectionLimits;
use a2a_lifecycle::discovery::DiscoveryConfig;
use a2a_lifecycle::proto::{GetTaskRequest, SubscribeToTaskRequest, TaskState};
use a2a_lifecycle::runtime::{RuntimeConfig, TaskManager};
use a2a_lifecycle::server::Server;
use a2a_lifecycle::service::{Binding, BindingSet};
use a2a_lifecycle::store::MemoryStore;

use support::web::{Event, Http, data_events, describe, events, message, next_chunk};
use support::{TestServer, WAIT, within};

fn manager() -> TaskManager {
    TaskManager::new(
        Arc::new(MemoryStore::new()),
        a2a_lifecycle::agent::demo::demo_router(),
        RuntimeConfig {
            metrics: Some(Arc::new(a2a_lifecycle::metrics::Metrics::new())),
            ..Default::default()
        },
    )
}

async fn serve(discovery: DiscoveryConfig, limits: ConnectionLimits) -> TestServer {
    TestServer::serve(Server::new(manager()).discovery(discovery).limits(limits)).await
}

/// A task made over gRPC is read over JSON-RPC and HTTP+JSON, followed
/// over both, and canceled over HTTP+JSON: one task space, one set of
/// events for every subscriber.
#[tokio::test(flavor = "multi_thread")]
async fn one_task_through_all_three_bindings() {
    let server = serve(DiscoveryConfig::default(), Default::default()).await;
    let mut grpc = server.client().await;
    let http = Http::new(server.addr);
    let task = within(
        "send over gRPC",
        support::send_task(
            &mut grpc,
            support::request("", support::user_message("slow"), true),
        ),
    )
    .await;
    let over_rpc = http.rpc("GetTask", json!({"id": task.id})).await;
    let over_rest = http.rest("GET", &format!("/tasks/{}", task.id), None).await;
    assert_eq!(over_rpc.result()["id"], task.id.as_str());
    assert_eq!(
        over_rpc.result(),
        &over_rest.body,
        "the same ProtoJSON over both"
    );
    let rpc_stream = http
        .rpc_stream("/", "SubscribeToTask", json!({"id": task.id}))
        .await;
    let rest_stream = http
        .rest_stream("GET", &format!("/tasks/{}:subscribe", task.id), None)
        .await;
    let mut grpc_stream = within(
        "subscribe over gRPC",
        grpc.subscribe_to_task(SubscribeToTaskRequest {
            tenant: String::new(),
            id: task.id.clone(),
        }),
    )
    .await
    .unwrap()
    .into_inner();
    let first = within("the snapshot", grpc_stream.next())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(
        first.payload,
        Some(a2a_lifecycle::proto::stream_response::Payload::Task(_))
    ));
    let canceled = http
        .rest("POST", &format!("/tasks/{}:cancel", task.id), None)
        .await;
    assert_eq!(canceled.body["status"]["state"], "TASK_STATE_CANCELED");
    let rpc_events: Vec<Value> = data_events(rpc_stream)
        .await
        .into_iter()
        .map(|e| e["result"].clone())
        .collect();
    let rest_events = data_events(rest_stream).await;
    let last_rpc = describe(rpc_events.last().unwrap());
    assert_eq!(last_rpc, "statusUpdate:TASK_STATE_CANCELED");
    assert_eq!(
        rest_events.iter().map(describe).collect::<Vec<_>>(),
        rpc_events.iter().map(describe).collect::<Vec<_>>(),
    );
    let grpc_events = support::collect(grpc_stream).await.unwrap();
    assert!(
        support::describe_all(&grpc_events)
            .last()
            .is_some_and(|d| d.contains("CANCELED")),
        "{:?}",
        support::describe_all(&grpc_events)
    );
    let after = within("get over gRPC", support::get_task(&mut grpc, "", &task.id))
        .await
        .unwrap();
    assert_eq!(support::state_of(&after), TaskState::Canceled);
    server.stop().await;
}

/// The cards list one interface per binding served, each with its URL;
/// a binding turned off is not served.
#[tokio::test(flavor = "multi_thread")]
async fn cards_list_exactly_the_bindings_served() {
    let server = serve(DiscoveryConfig::default(), Default::default()).await;
    let http = Http::new(server.addr);
    let card = http
        .rest("GET", "/deployer/.well-known/agent-card.json", None)
        .await;
    let interfaces = card.body["supportedInterfaces"].as_array().unwrap();
    let described: Vec<(String, String, String)> = interfaces
        .iter()
        .map(|i| {
            (
                i["protocolBinding"].as_str().unwrap().to_owned(),
                i["url"].as_str().unwrap().to_owned(),
                i["tenant"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let addr = server.addr;
    assert_eq!(
        described,
        [
            ("GRPC".to_owned(), addr.to_string(), "deployer".to_owned()),
            (
                "JSONRPC".to_owned(),
                format!("http://{addr}"),
                "deployer".to_owned()
            ),
            (
                "HTTP+JSON".to_owned(),
                format!("http://{addr}"),
                "deployer".to_owned()
            ),
        ]
    );
    assert!(interfaces.iter().all(|i| i["protocolVersion"] == "1.0"));
    server.stop().await;

    // gRPC alone: the JSON routes are not served, the card says so.
    let grpc_only = DiscoveryConfig {
        bindings: BindingSet::parse("grpc").unwrap(),
        ..Default::default()
    };
    let server = serve(grpc_only, Default::default()).await;
    let http = Http::new(server.addr);
    let card = http.rest("GET", "/.well-known/agent-card.json", None).await;
    assert_eq!(
        card.body["supportedInterfaces"].as_array().unwrap().len(),
        1
    );
    let refused = http
        .post_raw(
            "/",
            Some("application/json"),
            br#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"x"}}"#.to_vec(),
        )
        .await;
    assert_eq!(refused.status, 404, "{:?}", refused.body);
    let refused = http
        .send(http.client.get(format!("{}/tasks/x", http.base)))
        .await;
    assert_eq!(refused.status, 404);
    let mut grpc = server.client().await;
    let missing = within("gRPC still served", support::get_task(&mut grpc, "", "x")).await;
    assert_eq!(missing.unwrap_err().code(), tonic::Code::NotFound);
    server.stop().await;

    // JSON-RPC alone: gRPC is UNIMPLEMENTED, HTTP+JSON routes are not.
    let rpc_only = DiscoveryConfig {
        bindings: BindingSet::NONE.with(Binding::JsonRpc),
        ..Default::default()
    };
    let server = serve(rpc_only, Default::default()).await;
    let http = Http::new(server.addr);
    let card = http.rest("GET", "/.well-known/agent-card.json", None).await;
    let bindings: Vec<&str> = card.body["supportedInterfaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["protocolBinding"].as_str().unwrap())
        .collect();
    assert_eq!(bindings, ["JSONRPC"]);
    assert_eq!(
        http.rpc("GetTask", json!({"id": "x"})).await.rpc_code(),
        -32001
    );
    let mut grpc = server.client().await;
    let refused = within("gRPC refused", support::get_task(&mut grpc, "", "x")).await;
    assert_eq!(refused.unwrap_err().code(), tonic::Code::Unimplemented);
    assert_eq!(
        http.send(http.client.get(format!("{}/tasks/x", http.base)))
            .await
            .status,
        404
    );
    server.stop().await;
    assert!(BindingSet::parse("grpc,soap").is_err());
    assert!(BindingSet::parse("").is_err());
}

const BOT_KEY: &str = "bot-key-bindings";
const ALICE_KEY: &str = "alice-key-bindings";

fn authenticator() -> Arc<Authenticator> {
    let file = format!(
        "[[principal]]\nname = \"bot\"\napi_key_sha256 = \"{}\"\ntenants = [\"\"]\nrole = \"user\"\n\n\
         [[principal]]\nname = \"alice\"\napi_key_sha256 = \"{}\"\ntenants = [\"\"]\nrole = \"user\"\n",
        support::jwt::key_digest(BOT_KEY),
        support::jwt::key_digest(ALICE_KEY),
    );
    Arc::new(
        Authenticator::parse(&file, std::path::Path::new("."))
            .unwrap()
            .with_free_failures(u32::MAX),
    )
}

/// Authentication and ownership are the same on every binding: no or a
/// bad credential is 401 with a challenge; a user's task is another
/// user's TASK_NOT_FOUND; a tenant not permitted is PERMISSION_DENIED.
#[tokio::test(flavor = "multi_thread")]
async fn authentication_and_ownership_on_the_json_bindings() {
    let server = TestServer::start_auth(authenticator()).await;
    let anonymous = Http::new(server.addr);
    let bot = Http::new(server.addr).with_token(BOT_KEY);
    let alice = Http::new(server.addr).with_token(ALICE_KEY);
    let wrong = Http::new(server.addr).with_token("not-a-key");
    for http in [&anonymous, &wrong] {
        let answer = http.rpc("GetTask", json!({"id": "x"})).await;
        assert_eq!(answer.status, 401);
        assert_eq!(answer.headers["www-authenticate"], "Bearer realm=\"a2a\"");
        assert_eq!(answer.reason(), "UNAUTHENTICATED");
        assert_eq!(answer.rpc_code(), -32000);
        let answer = http.rest("GET", "/tasks/x", None).await;
        assert_eq!(answer.status, 401);
        assert_eq!(answer.headers["www-authenticate"], "Bearer realm=\"a2a\"");
        assert_eq!(answer.reason(), "UNAUTHENTICATED");
    }
    // Cards stay public.
    let card = anonymous
        .rest("GET", "/.well-known/agent-card.json", None)
        .await;
    assert_eq!(card.status, 200);
    let task = bot
        .rpc("SendMessage", json!({"message": message("run the tests")}))
        .await;
    let id = task.result()["task"]["id"].as_str().unwrap().to_owned();
    assert_eq!(
        bot.rest("GET", &format!("/tasks/{id}"), None).await.status,
        200
    );
    let theirs = alice.rest("GET", &format!("/tasks/{id}"), None).await;
    assert_eq!(theirs.status, 404);
    assert_eq!(theirs.reason(), "TASK_NOT_FOUND");
    assert_eq!(
        alice.rpc("GetTask", json!({"id": id})).await.rpc_code(),
        -32001
    );
    let listed = alice.rest("GET", "/tasks", None).await;
    assert_eq!(listed.body["totalSize"], Value::Null, "{:?}", listed.body);
    let denied = bot.rest("GET", "/deployer/tasks", None).await;
    assert_eq!(denied.status, 403);
    assert_eq!(denied.reason(), "PERMISSION_DENIED");
    let denied = bot.rpc_at("/deployer", "ListTasks", json!({})).await;
    assert_eq!(denied.status, 200);
    assert_eq!(denied.reason(), "PERMISSION_DENIED");
    server.stop().await;
}

/// `--cors-origin`: preflight from a listed origin is answered, others
/// are refused, and answers carry the origin only for listed ones.
#[tokio::test(flavor = "multi_thread")]
async fn cors_for_listed_origins_only() {
    let discovery = DiscoveryConfig {
        cors_origins: vec!["https://console.example".into()],
        ..Default::default()
    };
    let server = serve(discovery, Default::default()).await;
    let http = Http::new(server.addr);
    let preflight = |origin: &str| {
        http.client
            .request(
                reqwest::Method::OPTIONS,
                format!("{}/message:send", http.base),
            )
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "content-type, authorization, a2a-version",
            )
            .send()
    };
    let allowed = tokio::time::timeout(WAIT, preflight("https://console.example"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(allowed.status(), 204);
    let headers = allowed.headers();
    assert_eq!(
        headers["access-control-allow-origin"],
        "https://console.example"
    );
    let methods = headers["access-control-allow-methods"].to_str().unwrap();
    assert!(
        methods.contains("POST") && methods.contains("GET"),
        "{methods}"
    );
    let allowed_headers = headers["access-control-allow-headers"].to_str().unwrap();
    for h in ["authorization", "content-type", "a2a-version"] {
        assert!(allowed_headers.contains(h), "{allowed_headers}");
    }
    let refused = tokio::time::timeout(WAIT, preflight("https://evil.example"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(refused.status(), 403);
    assert!(
        !refused
            .headers()
            .contains_key("access-control-allow-origin")
    );
    let call = |origin: &'static str| {
        http.send(
            http.client
                .get(format!("{}/tasks/x", http.base))
                .header("origin", origin),
        )
    };
    let answer = call("https://console.example").await;
    assert_eq!(
        answer.headers["access-control-allow-origin"],
        "https://console.example"
    );
    assert_eq!(answer.status, 404);
    let answer = call("https://evil.example").await;
    assert!(!answer.headers.contains_key("access-control-allow-origin"));
    server.stop().await;

    // Off by default: no preflight is answered.
    let server = serve(DiscoveryConfig::default(), Default::default()).await;
    let http = Http::new(server.addr);
    let answer = http
        .send(
            http.client
                .request(
                    reqwest::Method::OPTIONS,
                    format!("{}/message:send", http.base),
                )
                .header("origin", "https://console.example")
                .header("access-control-request-method", "POST"),
        )
        .await;
    assert_ne!(answer.status, 204);
    assert!(!answer.headers.contains_key("access-control-allow-origin"));
    server.stop().await;
}

/// The strict value of one sample: fails when the metric is absent.
fn sample(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    let found: Vec<f64> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match &s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => *v,
            other => panic!("{name}: {other:?}"),
        })
        .collect();
    assert!(!found.is_empty(), "no {name} {labels:?}");
    found.iter().sum()
}

async fn scrape(addr: std::net::SocketAddr) -> prometheus_parse::Scrape {
    let response = support::http_get(addr, "/metrics", &[]).await;
    assert_eq!(response.status, 200);
    support::parse_metrics(&response.body)
}

/// An idle stream gets keep-alive comments; a client that goes away
/// frees its subscriber at once; calls are counted by binding.
#[tokio::test(flavor = "multi_thread")]
async fn keep_alive_disconnect_and_metrics_by_binding() {
    let limits = ConnectionLimits {
        sse_keepalive: Duration::from_millis(50),
        ..Default::default()
    };
    let server = serve(DiscoveryConfig::default(), limits).await;
    let http = Http::new(server.addr);
    let slow = http
        .rest(
            "POST",
            "/message:send",
            Some(json!({"message": message("slow"), "configuration": {"returnImmediately": true}})),
        )
        .await;
    let id = slow.body["task"]["id"].as_str().unwrap().to_owned();
    let before = scrape(server.addr).await;
    let subscription = http
        .rest_stream("GET", &format!("/tasks/{id}:subscribe"), None)
        .await;
    let mut body = subscription.bytes_stream();
    let mut text = String::new();
    while !text.contains(": keep-alive") {
        match next_chunk(&mut body, WAIT).await {
            Some(chunk) => text.push_str(&chunk),
            None => panic!("the stream ended: {text}"),
        }
        // The slow task's progress events come every 100 ms; keep-alives
        // every 50 ms of silence between them.
    }
    let open = sample(
        &scrape(server.addr).await,
        "a2a_streams_open",
        &[("kind", "subscribe")],
    );
    assert_eq!(open, 1.0);
    drop(body);
    // Freed without waiting for the next event to fail a write: the
    // connection's end drops the body, and with it the subscription.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let open = sample(
            &scrape(server.addr).await,
            "a2a_streams_open",
            &[("kind", "subscribe")],
        );
        if open == 0.0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the subscriber is still open"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let after = scrape(server.addr).await;
    let counted = |binding: &str, method: &str, code: &str| {
        sample(
            &after,
            "a2a_rpc_requests_total",
            &[("binding", binding), ("method", method), ("code", code)],
        ) - before
            .samples
            .iter()
            .filter(|s| {
                s.metric == "a2a_rpc_requests_total"
                    && s.labels.get("binding") == Some(binding)
                    && s.labels.get("method") == Some(method)
                    && s.labels.get("code") == Some(code)
            })
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v) => v,
                _ => 0.0,
            })
            .sum::<f64>()
    };
    assert_eq!(counted("http-json", "SubscribeToTask", "CANCELLED"), 1.0);
    http.rpc("GetTask", json!({"id": "nope"})).await;
    let after = scrape(server.addr).await;
    assert_eq!(
        sample(
            &after,
            "a2a_rpc_requests_total",
            &[
                ("binding", "jsonrpc"),
                ("method", "GetTask"),
                ("code", "NOT_FOUND")
            ]
        ),
        1.0
    );
    assert!(
        sample(
            &after,
            "a2a_rpc_requests_total",
            &[
                ("binding", "http-json"),
                ("method", "SendMessage"),
                ("code", "OK")
            ]
        ) >= 1.0
    );
    http.rest("POST", &format!("/tasks/{id}:cancel"), None)
        .await;
    server.stop().await;
}

/// Shutdown ends open event streams, whatever their binding.
#[tokio::test(flavor = "multi_thread")]
async fn shutdown_ends_streams_with_an_error_event() {
    let mut server = serve(DiscoveryConfig::default(), Default::default()).await;
    let http = Http::new(server.addr);
    let slow = http
        .rest(
            "POST",
            "/message:send",
            Some(json!({"message": message("slow"), "configuration": {"returnImmediately": true}})),
        )
        .await;
    let id = slow.body["task"]["id"].as_str().unwrap().to_owned();
    let rest = http
        .rest_stream("GET", &format!("/tasks/{id}:subscribe"), None)
        .await;
    let rpc = http
        .rpc_stream("/", "SubscribeToTask", json!({"id": id}))
        .await;
    let stopped = server.begin_shutdown();
    // Shutdown fails the running task and ends every stream: a stream
    // ends with the task's FAILED status when that commit reaches it
    // first, else with UNAVAILABLE in the binding's error form (the
    // forms themselves: the bindings' unit tests).
    let rest_events = events(rest).await;
    match rest_events.last() {
        Some(Event::Data(Some(name), error)) => {
            assert_eq!(name, "error");
            assert_eq!(error["error"]["status"], "UNAVAILABLE");
            assert_eq!(error["error"]["code"], 503);
        }
        Some(Event::Data(None, event)) => {
            assert_eq!(
                describe(event),
                "statusUpdate:TASK_STATE_FAILED",
                "{rest_events:?}"
            )
        }
        other => panic!("no last event: {other:?}"),
    }
    let rpc_events = events(rpc).await;
    match rpc_events.last() {
        Some(Event::Data(None, last)) if last.get("error").is_some() => {
            assert_eq!(last["id"], 7);
            assert_eq!(last["error"]["data"][0]["reason"], "UNAVAILABLE");
        }
        Some(Event::Data(None, last)) => {
            assert_eq!(describe(&last["result"]), "statusUpdate:TASK_STATE_FAILED");
        }
        other => panic!("no last event: {other:?}"),
    }
    tokio::time::timeout(WAIT, stopped).await.unwrap().unwrap();
}

/// GetTask over gRPC and HTTP+JSON agree field for field (ProtoJSON of
/// the same Task).
#[tokio::test(flavor = "multi_thread")]
async fn json_is_the_protojson_of_the_grpc_answer() {
    let server = serve(DiscoveryConfig::default(), Default::default()).await;
    let http = Http::new(server.addr);
    let created = http
        .rest(
            "POST",
            "/message:send",
            Some(json!({"message": message("run the tests")})),
        )
        .await;
    let id = created.body["task"]["id"].as_str().unwrap().to_owned();
    let mut grpc = server.client().await;
    let task = within(
        "get",
        grpc.get_task(GetTaskRequest {
            tenant: String::new(),
            id: id.clone(),
            history_length: None,
        }),
    )
    .await
    .unwrap()
    .into_inner();
    let expected = a2a_lifecycle::json::to_value(&task).unwrap();
    let got = http.rest("GET", &format!("/tasks/{id}"), None).await;
    assert_eq!(got.body, expected);
    server.stop().await;
}
