//! Bounded fuzzing that runs with the tests (issue "hardening": arbitrary
//! bytes and arbitrary well-formed requests never panic validation or the
//! lifecycle core). A seeded generator makes every run the same, so a
//! failure is reproduced by running the test again; `A2A_FUZZ_ITERATIONS`
//! runs it longer (`A2A_FUZZ_SEED` picks another sequence).

use a2a_lifecycle::wkt::Timestamp;
use prost::Message as _;

use a2a_lifecycle::lifecycle::{
    ArtifactUpdate, StatusUpdate, TaskEvent, TaskRecord, TransitionPolicy, parse_state_name,
};
use a2a_lifecycle::proto::{
    Artifact, ListTasksRequest, Message, Part, Role, SendMessageConfiguration, SendMessageRequest,
    TaskState, part::Content,
};
use a2a_lifecycle::service::validate;
use a2a_lifecycle::store::codec;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn bytes(&mut self, max: usize) -> Vec<u8> {
        let n = self.below(max as u64 + 1) as usize;
        (0..n).map(|_| self.next() as u8).collect()
    }

    /// Short strings from a small alphabet, so ids repeat and collide.
    fn id(&mut self) -> String {
        let n = self.below(4) as usize;
        (0..n)
            .map(|_| ['a', 'b', '-', 'é', '\0'][self.below(5) as usize])
            .collect()
    }

    fn text(&mut self) -> String {
        String::from_utf8_lossy(&self.bytes(24)).into_owned()
    }
}

fn iterations() -> u64 {
    std::env::var("A2A_FUZZ_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

fn seed() -> u64 {
    std::env::var("A2A_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5EED_A2A0_1234_5678)
}

fn part(rng: &mut Rng) -> Part {
    let content = match rng.below(5) {
        0 => None,
        1 => Some(Content::Text(rng.text())),
        2 => Some(Content::Raw(rng.bytes(16))),
        3 => Some(Content::Url(rng.id())),
        _ => Some(Content::Data(a2a_lifecycle::wkt::Value::default())),
    };
    Part {
        content,
        media_type: if rng.below(2) == 0 {
            String::new()
        } else {
            rng.text()
        },
        ..Default::default()
    }
}

fn message(rng: &mut Rng) -> Message {
    Message {
        message_id: rng.id(),
        task_id: rng.id(),
        context_id: rng.id(),
        role: rng.below(5) as i32 - 1,
        parts: (0..rng.below(4)).map(|_| part(rng)).collect(),
        ..Default::default()
    }
}

/// Arbitrary bytes decoded as requests, and arbitrary well-formed requests,
/// through validation: an answer (accepted or refused), never a panic.
#[test]
fn validation_never_panics() {
    let mut rng = Rng(seed());
    for _ in 0..iterations() {
        let raw = rng.bytes(64);
        if let Ok(req) = SendMessageRequest::decode(&raw[..]) {
            let _ = validate::send_request(req);
        }
        if let Ok(req) = ListTasksRequest::decode(&raw[..]) {
            let _ = validate::list_request(&req);
        }
        let _ = codec::decode(&raw);
        let _ = parse_state_name(&rng.text());
        let req = SendMessageRequest {
            tenant: rng.id(),
            message: (rng.below(8) != 0).then(|| message(&mut rng)),
            configuration: Some(SendMessageConfiguration {
                history_length: (rng.below(2) == 0).then(|| rng.next() as i32),
                accepted_output_modes: (0..rng.below(3)).map(|_| rng.text()).collect(),
                return_immediately: rng.below(2) == 0,
                ..Default::default()
            }),
            metadata: None,
        };
        let _ = validate::send_request(req);
        let list = ListTasksRequest {
            tenant: rng.id(),
            context_id: rng.id(),
            status: rng.next() as i32,
            page_size: (rng.below(2) == 0).then(|| rng.next() as i32),
            page_token: if rng.below(2) == 0 {
                rng.text()
            } else {
                String::new()
            },
            history_length: (rng.below(2) == 0).then(|| rng.next() as i32),
            ..Default::default()
        };
        let _ = validate::list_request(&list);
    }
}

fn state(rng: &mut Rng) -> TaskState {
    TaskState::try_from(rng.below(9) as i32).unwrap()
}

fn event(rng: &mut Rng) -> TaskEvent {
    match rng.below(4) {
        0 | 1 => TaskEvent::Status(StatusUpdate {
            state: state(rng),
            message: (rng.below(2) == 0).then(|| message(rng)),
            metadata: None,
        }),
        2 => TaskEvent::Artifact(ArtifactUpdate {
            artifact: Artifact {
                artifact_id: rng.id(),
                parts: (0..rng.below(3)).map(|_| part(rng)).collect(),
                ..Default::default()
            },
            append: rng.below(2) == 0,
            last_chunk: rng.below(3) == 0,
            metadata: None,
        }),
        _ => {
            let mut m = message(rng);
            m.role = Role::User as i32;
            TaskEvent::UserMessage(m)
        }
    }
}

/// Arbitrary event sequences on a task under both policies: every event is
/// applied or refused with the task unchanged, a terminal task never
/// changes again, and the stored form always round-trips.
#[test]
fn the_lifecycle_core_never_panics_and_keeps_its_rules() {
    let mut rng = Rng(seed() ^ 0xA5A5);
    let rounds = (iterations() / 20).max(1);
    for _ in 0..rounds {
        let policy = if rng.below(2) == 0 {
            TransitionPolicy::Permissive
        } else {
            TransitionPolicy::Strict
        };
        let mut first = message(&mut rng);
        first.message_id = "m0".into();
        let mut record = TaskRecord::submitted(
            "t".into(),
            "c".into(),
            first,
            Timestamp {
                seconds: 1,
                nanos: 0,
            },
        );
        for step in 0..20 {
            let before = record.clone();
            let now = Timestamp {
                seconds: 2 + step,
                nanos: 0,
            };
            match record.apply(event(&mut rng), now, policy) {
                Ok(_) => assert!(
                    !before.state().is_terminal(),
                    "a terminal task changed: {before:?}"
                ),
                Err(_) => assert_eq!(record, before, "a refused event changed the task"),
            }
            assert_ne!(record.state(), TaskState::Unspecified);
            let decoded = codec::decode(&codec::encode(&record)).expect("round trip");
            assert_eq!(decoded, record);
        }
    }
}

/// Percent-encodes every byte that is not unreserved (RFC 3986).
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A JSON value from a small grammar with the protocol's field names, so
/// that generated bodies reach past the JSON parser into the decoders.
fn json_value(rng: &mut Rng, depth: u32) -> String {
    const NAMES: [&str; 14] = [
        "message",
        "messageId",
        "role",
        "parts",
        "text",
        "id",
        "tenant",
        "historyLength",
        "configuration",
        "returnImmediately",
        "params",
        "metadata",
        "taskId",
        "raw",
    ];
    match rng.below(if depth > 3 { 5 } else { 8 }) {
        0 => "null".into(),
        1 => ["true", "false"][rng.below(2) as usize].into(),
        2 => format!("{}", rng.next() as i64 >> rng.below(63)),
        3 => serde_json::to_string(&rng.text()).unwrap(),
        4 => [
            "\"ROLE_USER\"",
            "\"TASK_STATE_WORKING\"",
            "\"2.0\"",
            "\"AAEC\"",
            "1e400",
            "-0",
        ][rng.below(6) as usize]
            .into(),
        5 => {
            let items: Vec<String> = (0..rng.below(3))
                .map(|_| json_value(rng, depth + 1))
                .collect();
            format!("[{}]", items.join(","))
        }
        _ => {
            let fields: Vec<String> = (0..rng.below(4))
                .map(|_| {
                    let name = NAMES[rng.below(NAMES.len() as u64) as usize];
                    format!("\"{name}\":{}", json_value(rng, depth + 1))
                })
                .collect();
            format!("{{{}}}", fields.join(","))
        }
    }
}

/// The JSON bindings' decoders, in process: arbitrary bodies, methods,
/// paths and queries never panic the server nor get a 5xx (spec §9.5,
/// §11.6: bad input is the client's error).
#[tokio::test(flavor = "multi_thread")]
async fn the_json_bindings_never_panic_or_answer_5xx() {
    use std::sync::Arc;
    use tower::ServiceExt;

    use a2a_lifecycle::bindings::Binding;
    use a2a_lifecycle::discovery::{Cards, DiscoveryConfig};
    use a2a_lifecycle::runtime::{RuntimeConfig, TaskManager};
    use a2a_lifecycle::service::A2aApi;
    use a2a_lifecycle::service::web::HttpBindings;

    let agents = a2a_lifecycle::agent::demo::demo_router();
    let cards = Arc::new(
        Cards::build(
            &agents,
            &DiscoveryConfig::default(),
            "127.0.0.1:1".parse().unwrap(),
        )
        .unwrap(),
    );
    let manager = TaskManager::new(
        Arc::new(a2a_lifecycle::store::MemoryStore::new()),
        agents,
        RuntimeConfig::default(),
    );
    let api = A2aApi::new(manager, cards);
    let router = Arc::new(HttpBindings::new(
        api,
        &[Binding::JsonRpc, Binding::HttpJson],
        std::time::Duration::from_secs(60),
    ))
    .router();
    const METHODS: [&str; 12] = [
        "SendMessage",
        "GetTask",
        "ListTasks",
        "CancelTask",
        "GetExtendedAgentCard",
        "Nope",
        // Protocol 0.3's, read by their own decoder.
        "message/send",
        "tasks/get",
        "tasks/cancel",
        "tasks/pushNotificationConfig/set",
        "tasks/pushNotificationConfig/get",
        "agent/getAuthenticatedExtendedCard",
    ];
    const PATHS: [&str; 9] = [
        "/",
        "/message:send",
        "/tasks",
        "/tasks/%ZZ",
        "/deployer/tasks/x:cancel",
        "/tasks/x/pushNotificationConfigs",
        "/extendedAgentCard",
        "/a/b/c/d/e/f",
        "/tasks/:subscribe",
    ];
    let mut rng = Rng(seed() ^ 0x9e37_79b9);
    let (mut served, mut refused) = (0u64, 0u64);
    for i in 0..iterations() / 20 {
        let (method, path, body) = match rng.below(4) {
            // A JSON-RPC call with generated params.
            0 => (
                "POST",
                "/".to_owned(),
                format!(
                    r#"{{"jsonrpc":"2.0","id":{i},"method":"{}","params":{}}}"#,
                    METHODS[rng.below(METHODS.len() as u64) as usize],
                    json_value(&mut rng, 0)
                )
                .into_bytes(),
            ),
            // Any JSON to any path.
            1 => (
                ["GET", "POST", "DELETE", "PUT"][rng.below(4) as usize],
                PATHS[rng.below(PATHS.len() as u64) as usize].to_owned(),
                json_value(&mut rng, 0).into_bytes(),
            ),
            // A query of generated names and values.
            2 => (
                "GET",
                format!(
                    "/tasks?{}={}&pageSize={}&status={}",
                    [
                        "contextId",
                        "historyLength",
                        "includeArtifacts",
                        "statusTimestampAfter",
                        "x"
                    ][rng.below(5) as usize],
                    encode(&rng.id()),
                    rng.below(300) as i64 - 100,
                    encode(&rng.id())
                ),
                Vec::new(),
            ),
            // Raw bytes.
            _ => ("POST", "/".to_owned(), rng.bytes(64)),
        };
        let request = http::Request::builder()
            .method(method)
            .uri(path.as_str())
            .header("content-type", "application/json")
            .body(axum::body::Body::from(body.clone()))
            .unwrap();
        let response = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            router.clone().oneshot(request),
        )
        .await
        .expect("an answer in time")
        .unwrap();
        assert!(
            !response.status().is_server_error(),
            "{method} {path} {:?}: {}",
            String::from_utf8_lossy(&body),
            response.status()
        );
        match response.status().as_u16() {
            200 => served += 1,
            400..=499 => refused += 1,
            _ => {}
        }
    }
    // The generator reaches the operations, not only the refusals (a
    // JSON-RPC error is a 200 too: some calls of each kind).
    assert!(
        served > 0 && refused > 0,
        "served {served}, refused {refused}"
    );
}
