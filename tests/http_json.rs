//! The HTTP+JSON binding (spec §11) over real HTTP: every route of the
//! proto's annotations (and their tenant forms), query parameters, SSE
//! streams, every error with its status and ErrorInfo, limits and
//! malformed bodies.

use crate::support;

use serde_json::{Value, json};

use support::TestServer;
use support::web::{Event, Http, data_events, describe, events, message};

async fn server() -> (TestServer, Http) {
    let server = TestServer::start().await;
    let http = Http::new(server.addr);
    (server, http)
}

/// spec §11.3.1, §11.4: `POST /message:send` answers the
/// SendMessageResponse as `application/json`, or `application/a2a+json`
/// for a client that accepts it.
#[tokio::test(flavor = "multi_thread")]
async fn send_message_and_get_task() {
    let (server, http) = server().await;
    let answer = http
        .rest(
            "POST",
            "/message:send",
            Some(json!({"message": message("run the tests")})),
        )
        .await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    assert_eq!(answer.headers["content-type"], "application/json");
    let task = &answer.body["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED");
    let id = task["id"].as_str().unwrap();
    let got = http
        .rest("GET", &format!("/tasks/{id}?historyLength=1"), None)
        .await;
    assert_eq!(got.status, 200);
    assert_eq!(got.body["id"], id);
    assert_eq!(got.body["history"].as_array().unwrap().len(), 1);
    // `application/a2a+json` requests too, and answers to a client that
    // accepts them.
    let answer = http
        .send(
            http.client
                .post(format!("{}/message:send", http.base))
                .header("content-type", "application/a2a+json")
                .header("accept", "application/a2a+json")
                .body(json!({"message": message("ping")}).to_string()),
        )
        .await;
    assert_eq!(answer.body["message"]["parts"][0]["text"], "pong");
    assert_eq!(answer.headers["content-type"], "application/a2a+json");
    server.stop().await;
}

/// spec §11.7: an event stream whose `data` is a bare StreamResponse,
/// the task first, in order, ending where the gRPC stream ends.
#[tokio::test(flavor = "multi_thread")]
async fn message_stream_is_sse_of_bare_stream_responses() {
    let (server, http) = server().await;
    let response = http
        .rest_stream(
            "POST",
            "/message:stream",
            Some(json!({"message": message("run the tests")})),
        )
        .await;
    let events = data_events(response).await;
    let kinds: Vec<String> = events.iter().map(describe).collect();
    assert_eq!(
        kinds.first().map(String::as_str),
        Some("task:TASK_STATE_SUBMITTED"),
        "{kinds:?}"
    );
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("statusUpdate:TASK_STATE_COMPLETED")
    );
    assert_eq!(
        kinds.iter().filter(|k| *k == "artifactUpdate").count(),
        2,
        "{kinds:?}"
    );
    server.stop().await;
}

/// ListTasks' query parameters (spec §11.5): enums by name, numbers,
/// booleans, timestamps with `Z` or an offset; bad values are 400.
#[tokio::test(flavor = "multi_thread")]
async fn list_tasks_by_query_parameters() {
    let (server, http) = server().await;
    let slow = http
        .rest(
            "POST",
            "/message:send",
            Some(json!({"message": message("slow"), "configuration": {"returnImmediately": true}})),
        )
        .await;
    let id = slow.body["task"]["id"].as_str().unwrap().to_owned();
    let context = slow.body["task"]["contextId"].as_str().unwrap().to_owned();
    for query in [
        format!("status=TASK_STATE_WORKING&pageSize=5&contextId={context}"),
        format!("contextId={context}&statusTimestampAfter=2020-01-02T03%3A04%3A05%2B00%3A00"),
        format!(
            "contextId={context}&statusTimestampAfter=2020-01-02T03:04:05Z&includeArtifacts=false"
        ),
    ] {
        let listed = http.rest("GET", &format!("/tasks?{query}"), None).await;
        assert_eq!(listed.status, 200, "{query}: {:?}", listed.body);
        let tasks = listed.body["tasks"].as_array().unwrap();
        assert_eq!(tasks.len(), 1, "{query}");
        assert_eq!(tasks[0]["id"], id.as_str());
    }
    let listed = http
        .rest(
            "GET",
            &format!("/tasks?contextId={context}&status=TASK_STATE_COMPLETED"),
            None,
        )
        .await;
    assert_eq!(listed.body["tasks"], Value::Null, "{:?}", listed.body);
    for bad in [
        "pageSize=lots",
        "status=WORKING_HARD",
        "includeArtifacts=yes",
        "pageSize=500",
    ] {
        let answer = http.rest("GET", &format!("/tasks?{bad}"), None).await;
        assert_eq!(answer.status, 400, "{bad}: {:?}", answer.body);
        assert_eq!(answer.reason(), "INVALID_PARAMS", "{bad}");
        assert_eq!(answer.body["error"]["status"], "INVALID_ARGUMENT");
        assert_eq!(answer.body["error"]["code"], 400);
    }
    http.rest("POST", &format!("/tasks/{id}:cancel"), None)
        .await;
    server.stop().await;
}

/// Cancel, and subscribe by GET (the annotation) and POST (spec §11.3.2).
#[tokio::test(flavor = "multi_thread")]
async fn cancel_and_subscribe_by_get_and_post() {
    let (server, http) = server().await;
    let slow = http
        .rest(
            "POST",
            "/message:send",
            Some(json!({"message": message("slow"), "configuration": {"returnImmediately": true}})),
        )
        .await;
    let id = slow.body["task"]["id"].as_str().unwrap().to_owned();
    let by_get = http
        .rest_stream("GET", &format!("/tasks/{id}:subscribe"), None)
        .await;
    let by_post = http
        .rest_stream("POST", &format!("/tasks/{id}:subscribe"), None)
        .await;
    // Cancel with an empty body and no content type (curl -X POST).
    let canceled = http
        .send(http.client.post(format!("{}/tasks/{id}:cancel", http.base)))
        .await;
    assert_eq!(canceled.status, 200, "{:?}", canceled.body);
    assert_eq!(canceled.body["status"]["state"], "TASK_STATE_CANCELED");
    for stream in [by_get, by_post] {
        let kinds: Vec<String> = data_events(stream).await.iter().map(describe).collect();
        assert_eq!(
            kinds.first().map(String::as_str),
            Some("task:TASK_STATE_WORKING")
        );
        assert_eq!(
            kinds.last().map(String::as_str),
            Some("statusUpdate:TASK_STATE_CANCELED")
        );
    }
    // A cancel's metadata reaches the agent; the body is the request.
    let again = http
        .rest(
            "POST",
            &format!("/tasks/{id}:cancel"),
            Some(json!({"metadata": {"why": "twice"}})),
        )
        .await;
    assert_eq!(again.status, 409);
    assert_eq!(again.reason(), "TASK_NOT_CANCELABLE");
    assert_eq!(again.body["error"]["status"], "FAILED_PRECONDITION");
    // Subscribing to a finished task is refused before any stream.
    let refused = http
        .rest("POST", &format!("/tasks/{id}:subscribe"), None)
        .await;
    assert_eq!(refused.status, 400);
    assert_eq!(refused.reason(), "UNSUPPORTED_OPERATION");
    server.stop().await;
}

/// The push config routes (spec §11.3.3).
#[tokio::test(flavor = "multi_thread")]
async fn push_config_routes() {
    let server = support::start_with_push().await;
    let http = Http::new(server.addr);
    let slow = http
        .rest(
            "POST",
            "/message:send",
            Some(json!({"message": message("slow"), "configuration": {"returnImmediately": true}})),
        )
        .await;
    let id = slow.body["task"]["id"].as_str().unwrap().to_owned();
    let path = format!("/tasks/{id}/pushNotificationConfigs");
    let created = http
        .rest(
            "POST",
            &path,
            Some(json!({"url": "http://127.0.0.1:9/a", "id": "a"})),
        )
        .await;
    assert_eq!(created.status, 200, "{:?}", created.body);
    assert_eq!(created.body["taskId"], id.as_str());
    http.rest(
        "POST",
        &path,
        Some(json!({"url": "http://127.0.0.1:9/b", "id": "b"})),
    )
    .await;
    let page = http.rest("GET", &format!("{path}?pageSize=1"), None).await;
    assert_eq!(page.body["configs"][0]["id"], "a");
    assert_eq!(page.body["nextPageToken"], "a");
    let rest = http
        .rest("GET", &format!("{path}?pageSize=1&pageToken=a"), None)
        .await;
    assert_eq!(rest.body["configs"][0]["id"], "b");
    let got = http.rest("GET", &format!("{path}/b"), None).await;
    assert_eq!(got.body["url"], "http://127.0.0.1:9/b");
    let deleted = http.rest("DELETE", &format!("{path}/b"), None).await;
    assert_eq!(deleted.status, 200);
    assert_eq!(deleted.body, json!({}));
    let gone = http.rest("GET", &format!("{path}/b"), None).await;
    assert_eq!(gone.status, 404);
    assert_eq!(gone.reason(), "TASK_NOT_FOUND");
    // A webhook this server may not call is a bad argument on `url`.
    let refused = http
        .rest("POST", &path, Some(json!({"url": "http://10.0.0.1/hook"})))
        .await;
    assert_eq!(refused.status, 400);
    assert_eq!(refused.bad_field(), "url");
    http.rest("POST", &format!("/tasks/{id}:cancel"), None)
        .await;
    server.stop().await;
}

/// Each A2A error's HTTP status (spec §5.4) in the AIP-193 form of
/// §11.6, with its ErrorInfo.
#[tokio::test(flavor = "multi_thread")]
async fn every_error_with_its_status() {
    let (server, http) = server().await;
    let answer = http.rest("GET", "/tasks/nope", None).await;
    assert_eq!(answer.status, 404);
    assert_eq!(answer.headers["content-type"], "application/json");
    assert_eq!(answer.body["error"]["code"], 404);
    assert_eq!(answer.body["error"]["status"], "NOT_FOUND");
    assert!(!answer.body["error"]["message"].as_str().unwrap().is_empty());
    assert_eq!(answer.reason(), "TASK_NOT_FOUND");
    assert_eq!(answer.error_info()["metadata"]["task_id"], "nope");
    let answer = http
        .rest("GET", "/tasks/x/pushNotificationConfigs", None)
        .await;
    assert_eq!(answer.status, 400);
    assert_eq!(answer.reason(), "PUSH_NOTIFICATION_NOT_SUPPORTED");
    let answer = http
        .rest(
            "POST",
            "/message:send",
            Some(json!({"message": {"messageId": "i", "role": "ROLE_USER", "parts": [{"raw": "AA==", "mediaType": "image/png"}]}})),
        )
        .await;
    assert_eq!(answer.status, 415);
    assert_eq!(answer.reason(), "CONTENT_TYPE_NOT_SUPPORTED");
    let answer = http.rest("GET", "/extendedAgentCard", None).await;
    assert_eq!(answer.status, 400);
    assert_eq!(answer.reason(), "UNSUPPORTED_OPERATION");
    let answer = http
        .send(
            http.client
                .get(format!("{}/tasks/x", http.base))
                .header("a2a-version", "0.9"),
        )
        .await;
    assert_eq!(answer.status, 400);
    assert_eq!(answer.reason(), "VERSION_NOT_SUPPORTED");
    // The query parameter of spec §3.2.6, when no header says otherwise.
    let answer = http.rest("GET", "/tasks/x?A2A-Version=2.0", None).await;
    assert_eq!(answer.reason(), "VERSION_NOT_SUPPORTED");
    let answer = http.rest("GET", "/tasks/x?A2A-Version=1.0", None).await;
    assert_eq!(answer.reason(), "TASK_NOT_FOUND");
    let answer = http
        .rest(
            "POST",
            "/message:send",
            Some(json!({"message": {"role": "ROLE_USER", "parts": [{"text": "x"}]}})),
        )
        .await;
    assert_eq!(answer.status, 400);
    assert_eq!(answer.bad_field(), "message.message_id");
    // No such route: 404; a route's path with another method: 405.
    let answer = http.rest("GET", "/no/such/route", None).await;
    assert_eq!(answer.status, 404);
    assert_eq!(answer.reason(), "METHOD_NOT_FOUND");
    let answer = http.rest("PUT", "/tasks/x", None).await;
    assert_eq!(answer.status, 405);
    assert_eq!(answer.headers["allow"], "GET");
    server.stop().await;
}

/// Tenants by path (`/{tenant}/...`), by field, and by query parameter;
/// a contradiction is refused.
#[tokio::test(flavor = "multi_thread")]
async fn tenants_by_path_field_and_query() {
    let (server, http) = server().await;
    let created = http
        .rest(
            "POST",
            "/code-reviewer/message:send",
            Some(json!({"message": message("review")})),
        )
        .await;
    assert_eq!(
        created.body["task"]["status"]["state"],
        "TASK_STATE_INPUT_REQUIRED"
    );
    let id = created.body["task"]["id"].as_str().unwrap().to_owned();
    let by_path = http
        .rest("GET", &format!("/code-reviewer/tasks/{id}"), None)
        .await;
    assert_eq!(by_path.status, 200);
    let by_query = http
        .rest("GET", &format!("/tasks/{id}?tenant=code-reviewer"), None)
        .await;
    assert_eq!(by_query.status, 200);
    let elsewhere = http.rest("GET", &format!("/tasks/{id}"), None).await;
    assert_eq!(elsewhere.status, 404);
    let listed = http.rest("GET", "/code-reviewer/tasks", None).await;
    assert_eq!(listed.body["tasks"][0]["id"], id.as_str());
    let mut follow_up = message("the diff");
    follow_up["taskId"] = json!(id);
    let contradicting = http
        .rest(
            "POST",
            "/code-reviewer/message:send",
            Some(json!({"tenant": "deployer", "message": follow_up})),
        )
        .await;
    assert_eq!(contradicting.status, 400);
    assert_eq!(contradicting.bad_field(), "tenant");
    let finished = http
        .rest(
            "POST",
            "/code-reviewer/message:send",
            Some(json!({"tenant": "code-reviewer", "message": follow_up})),
        )
        .await;
    assert_eq!(
        finished.body["task"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
    let unknown = http.rest("GET", "/nobody/tasks", None).await;
    assert_eq!(unknown.status, 400);
    assert_eq!(unknown.bad_field(), "tenant");
    server.stop().await;
}

/// Oversized bodies are 413, non-JSON ones 415, malformed JSON 400: each
/// in the AIP-193 form, none a 5xx.
#[tokio::test(flavor = "multi_thread")]
async fn oversized_malformed_and_non_json_bodies() {
    let (server, http) = server().await;
    // Declared too large: refused from the header, the body unread.
    let answer = support::web::declared_too_large(server.addr, "/message:send").await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("\"OUT_OF_RANGE\""), "{answer}");
    // Too large without a declared length: refused once past the limit.
    let answer = http
        .send(
            http.client
                .post(format!("{}/message:send", http.base))
                .header("content-type", "application/json")
                .body(support::web::oversized_body()),
        )
        .await;
    assert_eq!(answer.status, 413);
    assert_eq!(answer.reason(), "OUT_OF_RANGE");
    // Not JSON by its content type: 415.
    for content_type in [Some("text/plain"), Some("application/xml"), None] {
        let answer = http
            .post_raw("/message:send", content_type, br#"{"message":{}}"#.to_vec())
            .await;
        assert_eq!(answer.status, 415, "{content_type:?}: {:?}", answer.body);
        assert_eq!(answer.body["error"]["status"], "INVALID_ARGUMENT");
        assert_eq!(answer.reason(), "CONTENT_TYPE_NOT_SUPPORTED");
        assert_eq!(answer.error_info()["metadata"]["field"], "Content-Type");
    }
    for body in [&b"{"[..], b"[]", b"{\"message\": 5}", b"\xff\xfe"] {
        let answer = http
            .post_raw("/message:send", Some("application/json"), body.to_vec())
            .await;
        assert_eq!(
            answer.status,
            400,
            "{:?}: {:?}",
            String::from_utf8_lossy(body),
            answer.body
        );
        assert_eq!(answer.reason(), "INVALID_PARAMS");
        assert_eq!(answer.bad_field(), "body");
    }
    // An enum name the proto does not have reads as unset, as ProtoJSON
    // parsers that ignore unknown fields do; validation then refuses it.
    let answer = http
        .post_raw(
            "/message:send",
            Some("application/json"),
            br#"{"message":{"messageId":"m","role":"ROLE_NOPE","parts":[{"text":"x"}]}}"#.to_vec(),
        )
        .await;
    assert_eq!(answer.status, 400, "{:?}", answer.body);
    assert_eq!(answer.bad_field(), "message.role");
    // Unknown fields are ignored (spec §5.7).
    let mut extra = json!({"message": message("ping"), "somethingNew": {"x": 1}});
    extra["message"]["alsoNew"] = json!(true);
    let answer = http.rest("POST", "/message:send", Some(extra)).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    // ProtoJSON: `null` is a field at its default, for scalars, messages,
    // lists and enums alike; inside a Struct it is a null value, kept.
    let mut nulls = json!({"message": message("run the tests"), "configuration": null});
    nulls["message"]["taskId"] = json!(null);
    nulls["message"]["referenceTaskIds"] = json!(null);
    nulls["message"]["extensions"] = json!(null);
    nulls["message"]["metadata"] = json!({"kept": null, "n": 42});
    let answer = http.rest("POST", "/message:send", Some(nulls)).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    let task_id = answer.body["task"]["id"]
        .as_str()
        .expect("a task")
        .to_owned();
    let task = http.rest("GET", &format!("/tasks/{task_id}"), None).await;
    assert_eq!(
        task.body["history"][0]["metadata"],
        json!({"kept": null, "n": 42}),
        "{:?}",
        task.body
    );
    server.stop().await;
}

/// A stream whose task fails mid-way ends with the failure as an event;
/// an error after the stream started is an `event: error`.
#[tokio::test(flavor = "multi_thread")]
async fn a_failing_task_streams_its_failure() {
    let (server, http) = server().await;
    let response = http
        .rest_stream(
            "POST",
            "/message:stream",
            Some(json!({"message": message("make it fail")})),
        )
        .await;
    let all = events(response).await;
    let last = all.last().unwrap();
    let Event::Data(None, last) = last else {
        panic!("{last:?}")
    };
    assert_eq!(describe(last), "statusUpdate:TASK_STATE_FAILED");
    server.stop().await;
}
