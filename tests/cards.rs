//! Discovery and protocol rules over real sockets: agent cards over HTTP on
//! the gRPC port (spec §8.2, §8.6), GetExtendedAgentCard (spec §3.1.11),
//! the `a2a-version` and `a2a-extensions` metadata (spec §3.6, §3.3.4) and
//! capability checks (spec §3.3.4).

use crate::support;

use std::sync::Arc;

use async_trait::async_trait;
use tonic::{Code, Request};

use a2a_lifecycle::agent::demo::demo_router;
use a2a_lifecycle::agent::{
    AgentError, AgentExecutor, AgentRouter, EventSink, RequestContext, basic_card,
};
use a2a_lifecycle::discovery::DiscoveryConfig;
use a2a_lifecycle::proto::{
    AgentCard, AgentExtension, GetExtendedAgentCardRequest, GetTaskRequest, SubscribeToTaskRequest,
    TaskState,
};
use a2a_lifecycle::runtime::RuntimeConfig;
use a2a_lifecycle::store::MemoryStore;

use support::*;

async fn start(agents: AgentRouter, discovery: DiscoveryConfig) -> TestServer {
    TestServer::start_discovery(
        Arc::new(MemoryStore::new()),
        agents,
        RuntimeConfig::default(),
        discovery,
    )
    .await
}

fn decode_card(body: &str) -> AgentCard {
    card_1_0(body)
}

/// An agent whose card is `card`; it completes every task at once.
struct WithCard(AgentCard);

#[async_trait]
impl AgentExecutor for WithCard {
    async fn execute(&self, _ctx: RequestContext, sink: EventSink) -> Result<(), AgentError> {
        sink.status(TaskState::Completed, Some("done")).await?;
        Ok(())
    }

    fn card(&self) -> AgentCard {
        self.0.clone()
    }
}

fn router_with(card: AgentCard) -> AgentRouter {
    AgentRouter::new().with("", Arc::new(WithCard(card)))
}

#[tokio::test]
async fn the_root_card_is_served_over_http_on_the_grpc_port() {
    let server = TestServer::start().await;
    let response = http_get(server.addr, "/.well-known/agent-card.json", &[]).await;
    assert_eq!(response.status, 200, "{}", response.body);
    assert_eq!(response.header("content-type"), Some("application/json"));
    assert_eq!(response.header("access-control-allow-origin"), Some("*"));
    // ProtoJSON: camelCase names (spec §5.5).
    assert!(response.body.contains("\"supportedInterfaces\""));
    assert!(response.body.contains("\"protocolBinding\": \"GRPC\""));
    let card = decode_card(&response.body);
    assert_eq!(card.name, "test-runner");
    assert!(!card.description.is_empty() && !card.version.is_empty());
    assert!(!card.skills.is_empty());
    assert_eq!(card.default_input_modes, ["text/plain"]);
    let interface = &card.supported_interfaces[0];
    assert_eq!(interface.url, server.addr.to_string());
    assert_eq!(interface.protocol_binding, "GRPC");
    assert_eq!(interface.protocol_version, "1.0");
    assert_eq!(interface.tenant, "");
    let capabilities = card.capabilities.unwrap();
    assert_eq!(capabilities.streaming, Some(true));
    assert_eq!(capabilities.push_notifications, Some(false));
    assert_eq!(capabilities.extended_agent_card, None);
    assert!(!card.provider.unwrap().url.is_empty());

    // The same port still speaks gRPC.
    let mut client = server.client().await;
    let task = send_text(&mut client, "", "run the tests").await;
    assert_eq!(state_of(&task), TaskState::Completed);
    server.stop().await;
}

#[tokio::test]
async fn every_tenant_has_its_own_card_naming_its_tenant() {
    let server = TestServer::start().await;
    for tenant in demo_router()
        .tenants()
        .into_iter()
        .filter(|t| !t.is_empty())
    {
        let path = format!("/{tenant}/.well-known/agent-card.json");
        let response = http_get(server.addr, &path, &[]).await;
        assert_eq!(response.status, 200, "{path}: {}", response.body);
        let card = decode_card(&response.body);
        assert_eq!(card.name, tenant);
        // One interface per binding served, each naming the tenant.
        let bindings: Vec<&str> = card
            .supported_interfaces
            .iter()
            .map(|i| i.protocol_binding.as_str())
            .collect();
        assert_eq!(bindings, ["GRPC", "JSONRPC", "HTTP+JSON"]);
        assert!(card.supported_interfaces.iter().all(|i| i.tenant == tenant));
        assert!(!card.skills.is_empty(), "{tenant}");
    }
    let missing = http_get(server.addr, "/nobody/.well-known/agent-card.json", &[]).await;
    assert_eq!(missing.status, 404);
    server.stop().await;
}

#[tokio::test]
async fn cards_carry_cache_validators_and_answer_304() {
    let server = TestServer::start().await;
    let path = "/deployer/.well-known/agent-card.json";
    let first = http_get(server.addr, path, &[]).await;
    assert_eq!(first.status, 200);
    let etag = first.header("etag").expect("ETag").to_owned();
    // Weak: the tag names the card's content (tests/card_signing.rs).
    assert!(etag.starts_with("W/\"") && etag.ends_with('"'), "{etag}");
    let last_modified = first
        .header("last-modified")
        .expect("Last-Modified")
        .to_owned();
    assert!(httpdate::parse_http_date(&last_modified).is_ok());
    let cache = first.header("cache-control").expect("Cache-Control");
    assert!(cache.contains("max-age=300"), "{cache}");

    let same = http_get(server.addr, path, &[("If-None-Match", &etag)]).await;
    assert_eq!(same.status, 304);
    assert!(same.body.is_empty());
    assert_eq!(same.header("etag"), Some(etag.as_str()));

    let strong = etag.trim_start_matches("W/");
    let listed = format!("\"other\", {strong}");
    let in_list = http_get(server.addr, path, &[("If-None-Match", &listed)]).await;
    assert_eq!(in_list.status, 304, "weak comparison, a tag of a list");

    let other = http_get(server.addr, path, &[("If-None-Match", "\"stale\"")]).await;
    assert_eq!(other.status, 200);
    assert_eq!(other.body, first.body);

    let since = http_get(server.addr, path, &[("If-Modified-Since", &last_modified)]).await;
    assert_eq!(since.status, 304);
    let old = "Mon, 01 Jan 2001 00:00:00 GMT";
    let before = http_get(server.addr, path, &[("If-Modified-Since", old)]).await;
    assert_eq!(before.status, 200);

    // Each card has its own ETag.
    let root = http_get(
        server.addr,
        "/code-reviewer/.well-known/agent-card.json",
        &[],
    )
    .await;
    assert_ne!(root.header("etag"), Some(etag.as_str()));
    server.stop().await;
}

#[tokio::test]
async fn the_public_url_is_what_the_cards_advertise() {
    let server = start(
        demo_router(),
        DiscoveryConfig {
            public_url: Some("agents.example.com:443".into()),
            ..Default::default()
        },
    )
    .await;
    let response = http_get(server.addr, "/deployer/.well-known/agent-card.json", &[]).await;
    let card = decode_card(&response.body);
    assert_eq!(card.supported_interfaces[0].url, "agents.example.com:443");
    // The JSON bindings' URLs are HTTP URLs; port 443 is HTTPS.
    assert_eq!(
        card.supported_interfaces[1].url,
        "https://agents.example.com:443"
    );
    assert_eq!(
        card.supported_interfaces[2].url,
        "https://agents.example.com:443"
    );
    server.stop().await;
}

#[tokio::test]
async fn no_extended_card_is_unsupported_operation() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let status = client
        .get_extended_agent_card(GetExtendedAgentCardRequest::default())
        .await
        .unwrap_err();
    assert_a2a_error(&status, Code::FailedPrecondition, "UNSUPPORTED_OPERATION");
    server.stop().await;
}

#[tokio::test]
async fn a_configured_extended_card_is_declared_and_served() {
    let extended = AgentCard {
        name: "test-runner (extended)".into(),
        description: "With the skills only authenticated clients see.".into(),
        ..Default::default()
    };
    let server = start(
        demo_router(),
        DiscoveryConfig {
            extended_card: Some(extended.clone()),
            ..Default::default()
        },
    )
    .await;
    let response = http_get(server.addr, "/.well-known/agent-card.json", &[]).await;
    let card = decode_card(&response.body);
    assert_eq!(card.capabilities.unwrap().extended_agent_card, Some(true));

    let mut client = server.client().await;
    let got = client
        .get_extended_agent_card(GetExtendedAgentCardRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.name, extended.name);
    // It is reached where the public card says.
    assert_eq!(got.supported_interfaces, card.supported_interfaces);

    // The file belongs to the default agent; other tenants have none.
    let status = client
        .get_extended_agent_card(GetExtendedAgentCardRequest {
            tenant: "deployer".into(),
        })
        .await
        .unwrap_err();
    assert_a2a_error(&status, Code::FailedPrecondition, "UNSUPPORTED_OPERATION");
    server.stop().await;
}

#[tokio::test]
async fn a_declared_but_missing_extended_card_is_not_configured() {
    let mut card = basic_card("declares", "Declares an extended card it lacks.", vec![]);
    card.capabilities.as_mut().unwrap().extended_agent_card = Some(true);
    let server = start(router_with(card), DiscoveryConfig::default()).await;
    let mut client = server.client().await;
    let status = client
        .get_extended_agent_card(GetExtendedAgentCardRequest::default())
        .await
        .unwrap_err();
    assert_a2a_error(
        &status,
        Code::FailedPrecondition,
        "EXTENDED_AGENT_CARD_NOT_CONFIGURED",
    );
    server.stop().await;
}

fn with_metadata<T>(message: T, pairs: &[(&'static str, &str)]) -> Request<T> {
    let mut request = Request::new(message);
    for (key, value) in pairs {
        request.metadata_mut().append(*key, value.parse().unwrap());
    }
    request
}

#[tokio::test]
async fn version_1_0_is_served_with_or_without_the_header() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    for version in [None, Some("1.0"), Some("1.0.2")] {
        let pairs: Vec<(&'static str, &str)> =
            version.map(|v| ("a2a-version", v)).into_iter().collect();
        let request = with_metadata(request("", user_message("run the tests"), false), &pairs);
        let response = client.send_message(request).await;
        assert!(response.is_ok(), "{version:?}: {response:?}");
    }
    server.stop().await;
}

#[tokio::test]
async fn other_versions_are_version_not_supported_on_every_rpc() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let task = send_text(&mut client, "", "run the tests").await;
    for version in ["0.3", "2.0", "1.1", "latest"] {
        let v = [("a2a-version", version)];
        let send = client
            .send_message(with_metadata(request("", user_message("hi"), false), &v))
            .await
            .unwrap_err();
        assert_a2a_error(&send, Code::FailedPrecondition, "VERSION_NOT_SUPPORTED");
        assert!(send.message().contains(version), "{}", send.message());
        let get = client
            .get_task(with_metadata(
                GetTaskRequest {
                    id: task.id.clone(),
                    ..Default::default()
                },
                &v,
            ))
            .await
            .unwrap_err();
        assert_a2a_error(&get, Code::FailedPrecondition, "VERSION_NOT_SUPPORTED");
        let stream = client
            .send_streaming_message(with_metadata(request("", user_message("hi"), false), &v))
            .await
            .unwrap_err();
        assert_a2a_error(&stream, Code::FailedPrecondition, "VERSION_NOT_SUPPORTED");
    }
    server.stop().await;
}

const REQUIRED: &str = "https://example.com/ext/required/v1";

fn requiring_extension() -> AgentRouter {
    let mut card = basic_card("strict", "Requires an extension.", vec![]);
    card.capabilities.as_mut().unwrap().extensions = vec![
        AgentExtension {
            uri: REQUIRED.into(),
            description: "must be declared".into(),
            required: true,
            params: None,
        },
        AgentExtension {
            uri: "https://example.com/ext/optional/v1".into(),
            description: "may be declared".into(),
            required: false,
            params: None,
        },
    ];
    router_with(card)
}

#[tokio::test]
async fn a_required_extension_must_be_declared() {
    let server = start(requiring_extension(), DiscoveryConfig::default()).await;
    let mut client = server.client().await;

    let status = client
        .send_message(request("", user_message("hi"), false))
        .await
        .unwrap_err();
    assert_a2a_error(
        &status,
        Code::FailedPrecondition,
        "EXTENSION_SUPPORT_REQUIRED",
    );
    let info = tonic_types::StatusExt::get_details_error_info(&status).unwrap();
    assert_eq!(
        info.metadata.get("extension").map(String::as_str),
        Some(REQUIRED)
    );

    // Declaring only the optional one is not enough.
    let optional = [("a2a-extensions", "https://example.com/ext/optional/v1")];
    let status = client
        .send_message(with_metadata(
            request("", user_message("hi"), false),
            &optional,
        ))
        .await
        .unwrap_err();
    assert_a2a_error(
        &status,
        Code::FailedPrecondition,
        "EXTENSION_SUPPORT_REQUIRED",
    );

    // In a comma-separated list, or in a repeated entry, it is accepted.
    let listed = format!("https://example.com/ext/optional/v1, {REQUIRED}");
    for pairs in [
        vec![("a2a-extensions", listed.as_str())],
        vec![
            ("a2a-extensions", "https://example.com/ext/optional/v1"),
            ("a2a-extensions", REQUIRED),
        ],
    ] {
        let response = client
            .send_message(with_metadata(
                request("", user_message("hi"), false),
                &pairs,
            ))
            .await;
        assert!(response.is_ok(), "{pairs:?}: {response:?}");
    }
    server.stop().await;
}

#[tokio::test]
async fn an_agent_without_streaming_refuses_the_streaming_rpcs() {
    let mut card = basic_card("no-streams", "Does not stream.", vec![]);
    card.capabilities.as_mut().unwrap().streaming = Some(false);
    let server = start(router_with(card), DiscoveryConfig::default()).await;
    let mut client = server.client().await;

    let task = send_text(&mut client, "", "hi").await;
    assert_eq!(state_of(&task), TaskState::Completed);

    let status = client
        .send_streaming_message(request("", user_message("hi"), false))
        .await
        .unwrap_err();
    assert_a2a_error(&status, Code::FailedPrecondition, "UNSUPPORTED_OPERATION");
    let status = client
        .subscribe_to_task(SubscribeToTaskRequest {
            tenant: String::new(),
            id: task.id.clone(),
        })
        .await
        .unwrap_err();
    assert_a2a_error(&status, Code::FailedPrecondition, "UNSUPPORTED_OPERATION");

    let response = http_get(server.addr, "/.well-known/agent-card.json", &[]).await;
    assert_eq!(
        decode_card(&response.body).capabilities.unwrap().streaming,
        Some(false)
    );
    server.stop().await;
}

/// Writes `json` to a fresh file and reads it as `serve --extended-card`
/// does.
fn extended_card_file(json: &str) -> (std::path::PathBuf, AgentCard) {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("extended-cards");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{}.json", uuid::Uuid::new_v4()));
    std::fs::write(&path, json).unwrap();
    let card = DiscoveryConfig::read_extended_card(&path).unwrap();
    (path, card)
}

fn with_extended(card: AgentCard) -> DiscoveryConfig {
    DiscoveryConfig {
        extended_card: Some(card),
        ..Default::default()
    }
}

async fn get_extended(client: &mut Client) -> AgentCard {
    tokio::time::timeout(
        WAIT,
        client.get_extended_agent_card(GetExtendedAgentCardRequest::default()),
    )
    .await
    .expect("GetExtendedAgentCard timed out")
    .unwrap()
    .into_inner()
}

/// Spec §3.1.11: a client replaces its cached public card with the
/// extended one, so the extended card says what the public card says about
/// where and how the agent is reached; a file that leaves it out gets it.
#[tokio::test]
async fn an_extended_card_file_without_capabilities_gets_the_servers_fields() {
    let (_, file) = extended_card_file(
        r#"{"name": "test-runner (extended)", "description": "More skills.", "version": "2"}"#,
    );
    assert_eq!(file.capabilities, None);
    assert!(file.supported_interfaces.is_empty());
    let server = start(demo_router(), with_extended(file)).await;
    let public = decode_card(
        &http_get(server.addr, "/.well-known/agent-card.json", &[])
            .await
            .body,
    );

    let mut client = server.client().await;
    let extended = get_extended(&mut client).await;
    assert_eq!(extended.name, "test-runner (extended)");
    assert_eq!(extended.supported_interfaces, public.supported_interfaces);
    let capabilities = extended.capabilities.expect("capabilities filled in");
    assert_eq!(capabilities.streaming, Some(true), "test-runner streams");
    assert_eq!(capabilities.push_notifications, Some(false));
    assert_eq!(capabilities.extended_agent_card, Some(true));
    assert_eq!(
        Some(capabilities),
        public.capabilities,
        "the same capabilities as the public card"
    );
    server.stop().await;
}

#[tokio::test]
async fn an_extended_card_agreeing_with_the_public_one_is_served_as_written() {
    let mut card = basic_card("no-streams", "Does not stream.", vec![]);
    card.capabilities.as_mut().unwrap().streaming = Some(false);
    // Partly filled in: what it says agrees, what it leaves out is added.
    let (_, file) = extended_card_file(
        r#"{"name": "no-streams (extended)",
            "capabilities": {"pushNotifications": false, "extendedAgentCard": true}}"#,
    );
    let server = start(router_with(card), with_extended(file)).await;
    let mut client = server.client().await;
    let capabilities = get_extended(&mut client).await.capabilities.unwrap();
    assert_eq!(capabilities.streaming, Some(false), "as the agent declares");
    assert_eq!(capabilities.push_notifications, Some(false));
    assert_eq!(capabilities.extended_agent_card, Some(true));
    server.stop().await;
}

/// What `Cards::build` refuses, each naming its field.
const CONTRADICTIONS: &[(&str, &str)] = &[
    (
        r#"{"name": "x", "capabilities": {"streaming": false}}"#,
        "capabilities.streaming",
    ),
    (
        r#"{"name": "x", "capabilities": {"pushNotifications": true}}"#,
        "capabilities.pushNotifications",
    ),
    (
        r#"{"name": "x", "capabilities": {"extendedAgentCard": false}}"#,
        "capabilities.extendedAgentCard",
    ),
    (
        r#"{"name": "x", "supportedInterfaces": [{"url": "elsewhere.example.com:443",
            "protocolBinding": "GRPC", "protocolVersion": "1.0"}]}"#,
        "supportedInterfaces",
    ),
];

#[tokio::test]
async fn an_extended_card_contradicting_the_public_one_is_refused_at_start() {
    for (json, field) in CONTRADICTIONS {
        let (_, file) = extended_card_file(json);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let manager = a2a_lifecycle::runtime::TaskManager::new(
            Arc::new(MemoryStore::new()),
            demo_router(),
            RuntimeConfig::default(),
        );
        let served = tokio::time::timeout(
            WAIT,
            a2a_lifecycle::server::Server::new(manager)
                .discovery(with_extended(file))
                .serve(listener, std::future::pending()),
        )
        .await
        .expect("the server started instead of refusing the card");
        let error = served.unwrap_err().to_string();
        assert!(error.contains("extended agent card"), "{error}");
        assert!(error.contains(field), "{field}: {error}");
    }
}

/// The binary reports the refusal and exits: `serve` delivers push
/// notifications unless `--no-push`, so a card saying it does not
/// contradicts it.
#[tokio::test]
async fn serve_refuses_a_contradicting_extended_card_file() {
    let (path, _) =
        extended_card_file(r#"{"name": "x", "capabilities": {"pushNotifications": false}}"#);
    let mut child = std::process::Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--store", "memory"])
        .arg("--extended-card")
        .arg(&path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("serve kept running with a contradicting extended card");
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert!(!status.success());
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(
        stderr.contains("capabilities.pushNotifications"),
        "{stderr}"
    );
}
