//! Signed agent cards (spec §8.4) over real sockets: every card the server
//! serves (public, per tenant, extended over each binding) carries a
//! signature its key verifies; the ETag names the card, not the
//! signature; `serve` refuses a key it cannot sign with; the CLI's
//! `jwks` and `card --verify`; and the official Python SDK's verifier,
//! when `A2A_TEST_PYTHON` names a Python with `a2a-sdk[signing]`.

use crate::support;

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use serde_json::{Value, json};

use a2a_lifecycle::agent::demo::demo_router;
use a2a_lifecycle::discovery::signing::{self, CardSigner, Form};
use a2a_lifecycle::discovery::{CardSecurity, DiscoveryConfig};
use a2a_lifecycle::json;
use a2a_lifecycle::proto::{AgentCard, GetExtendedAgentCardRequest};
use a2a_lifecycle::runtime::RuntimeConfig;
use a2a_lifecycle::store::MemoryStore;

use support::web::Http;
use support::{BIN, KillOnDrop, TestServer, WAIT, http_get, spawn_serve, within};

fn key_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/card-signing")
        .join(name)
}

fn signer(name: &str) -> Arc<CardSigner> {
    Arc::new(CardSigner::from_file(&key_path(name), None, None).unwrap())
}

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("card-signing")
        .join(uuid::Uuid::new_v4().to_string());
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

const TENANTS: [&str; 4] = ["", "test-runner", "code-reviewer", "deployer"];

fn card_path(tenant: &str) -> String {
    if tenant.is_empty() {
        "/.well-known/agent-card.json".into()
    } else {
        format!("/{tenant}/.well-known/agent-card.json")
    }
}

fn extended_file() -> AgentCard {
    let path = scratch("extended.json");
    std::fs::write(
        &path,
        r#"{"name": "Test runner (extended)", "description": "More for callers who signed in",
            "version": "1.0.0", "defaultInputModes": ["text/plain"],
            "defaultOutputModes": ["text/plain"], "skills": []}"#,
    )
    .unwrap();
    DiscoveryConfig::read_extended_card(&path).unwrap()
}

/// The demo agents with signing on, an extended card, and the security
/// declarations `--auth` adds (empty scope lists: the card whose two
/// canonical forms differ).
async fn signed_server(signer: Arc<CardSigner>) -> TestServer {
    TestServer::start_discovery(
        Arc::new(MemoryStore::new()),
        demo_router(),
        RuntimeConfig::default(),
        DiscoveryConfig {
            signer: Some(signer),
            extended_card: Some(extended_file()),
            security: Some(CardSecurity {
                bearer: true,
                jwt: false,
                mtls: true,
            }),
            ..Default::default()
        },
    )
    .await
}

/// Each tenant's public card: as 1.0 reads it, and the body as served
/// (with the 0.3 fields beside the 1.0 ones).
async fn served_cards(server: &TestServer) -> Vec<(String, AgentCard, String)> {
    let mut cards = Vec::new();
    for tenant in TENANTS {
        let response = http_get(server.addr, &card_path(tenant), &[]).await;
        assert_eq!(response.status, 200, "{tenant:?}");
        let card = support::card_1_0(&response.body);
        cards.push((format!("public card {tenant:?}"), card, response.body));
    }
    cards
}

async fn public_cards(server: &TestServer) -> Vec<(String, AgentCard)> {
    served_cards(server)
        .await
        .into_iter()
        .map(|(what, card, _)| (what, card))
        .collect()
}

async fn extended_cards(server: &TestServer) -> Vec<(String, AgentCard)> {
    let mut client = server.client().await;
    let grpc = within(
        "GetExtendedAgentCard",
        client.get_extended_agent_card(GetExtendedAgentCardRequest::default()),
    )
    .await
    .unwrap()
    .into_inner();
    let http = Http::new(server.addr);
    let rpc = http.rpc("GetExtendedAgentCard", json!({})).await;
    let rpc: AgentCard = support::card_1_0(&rpc.result().to_string());
    let rest = http.rest("GET", "/extendedAgentCard", None).await;
    assert_eq!(rest.status, 200, "{:?}", rest.body);
    let rest: AgentCard = support::card_1_0(&rest.body.to_string());
    vec![
        ("extended card over gRPC".into(), grpc),
        ("extended card over JSON-RPC".into(), rpc),
        ("extended card over HTTP+JSON".into(), rest),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn every_card_served_is_signed_and_verifies() {
    for key in ["es256.pem", "rs256.pem", "ed25519.pem"] {
        let signer = signer(key);
        let server = signed_server(signer.clone()).await;
        let mut cards = public_cards(&server).await;
        cards.extend(extended_cards(&server).await);
        for (what, card) in &cards {
            // The §8.4.1 signature first, then the empties-dropped one:
            // the security requirements' scope lists are empty.
            assert_eq!(card.signatures.len(), 2, "{key}: {what}");
            let verified = signing::verify(card, &signer.jwks())
                .unwrap_or_else(|e| panic!("{key}: {what} does not verify: {e}"));
            assert_eq!(verified.index, 0, "{key}: {what}");
            assert_eq!(verified.form, Form::Spec, "{key}: {what}");
            assert_eq!(verified.kid, signer.kid(), "{key}: {what}");
            // The second signature alone verifies the other form.
            let mut second = card.clone();
            second.signatures.remove(0);
            let verified = signing::verify(&second, &signer.jwks()).unwrap();
            assert_eq!(verified.form, Form::EmptiesDropped, "{key}: {what}");
        }
        // The extended card is its own card, signed as such.
        assert_eq!(cards[4].1.name, "Test runner (extended)");
        // A card changed in transit fails.
        let mut forged = cards[0].1.clone();
        forged.supported_interfaces[0].url = "evil.example:443".into();
        assert!(signing::verify(&forged, &signer.jwks()).is_err());
        server.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn unsigned_cards_carry_no_signatures() {
    let server = TestServer::start().await;
    for (what, card) in public_cards(&server).await {
        assert!(card.signatures.is_empty(), "{what}");
    }
    server.stop().await;
}

/// The ETag is a weak tag over the unsigned card: the same with any key or
/// none, so a client's cached copy stays valid when the key changes, and
/// 304s keep working on a signed card.
#[tokio::test(flavor = "multi_thread")]
async fn the_etag_names_the_card_not_its_signature() {
    // One advertised URL: the cards differ only in their signatures.
    let discovery = |signer: Option<Arc<CardSigner>>| DiscoveryConfig {
        signer,
        public_url: Some("agent.example:443".into()),
        ..Default::default()
    };
    let start = |signer| {
        TestServer::start_discovery(
            Arc::new(MemoryStore::new()),
            demo_router(),
            RuntimeConfig::default(),
            discovery(signer),
        )
    };
    let plain = start(None).await;
    let es = start(Some(signer("es256.pem"))).await;
    let ed = start(Some(signer("ed25519.pem"))).await;
    let path = card_path("deployer");
    let plain_card = http_get(plain.addr, &path, &[]).await;
    let es_card = http_get(es.addr, &path, &[]).await;
    let ed_card = http_get(ed.addr, &path, &[]).await;
    let tag = plain_card.header("etag").expect("ETag").to_owned();
    assert!(tag.starts_with("W/\""), "{tag}");
    assert_eq!(es_card.header("etag"), Some(tag.as_str()));
    assert_eq!(ed_card.header("etag"), Some(tag.as_str()));
    assert_ne!(es_card.body, ed_card.body, "another key, another signature");
    let again = http_get(es.addr, &path, &[("If-None-Match", &tag)]).await;
    assert_eq!(again.status, 304);
    for server in [plain, es, ed] {
        server.stop().await;
    }
}

/// Runs the binary to its end (at most [`WAIT`]).
fn run(args: &[&str]) -> std::process::Output {
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run a2a-lifecycle");
    let deadline = std::time::Instant::now() + WAIT;
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("{args:?} did not finish");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn serve_refuses_a_key_it_cannot_sign_with() {
    for (key, expected) in [
        ("rsa1024.pem", "at least 2048"),
        ("p521.pem", "P-256 or P-384"),
        ("es256.pub.pem", "cannot sign"),
        ("missing.pem", "missing.pem"),
    ] {
        let path = key_path(key);
        let out = run(&[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--store",
            "memory",
            "--card-signing-key",
            path.to_str().unwrap(),
        ]);
        assert!(!out.status.success(), "{key}: served");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expected), "{key}: {stderr}");
    }
}

/// `jwks` prints the public key set; `card --verify` checks the served
/// card with it, prints the card only when it verifies, and fails
/// otherwise.
#[test]
fn the_cli_prints_the_key_set_and_verifies_cards() {
    let key = key_path("es256.pem");
    let key = key.to_str().unwrap();
    let out = run(&["jwks", key, "--kid", "card-key-1"]);
    assert!(out.status.success(), "{out:?}");
    let jwks: Value = serde_json::from_slice(&out.stdout).unwrap();
    let jwk = &jwks["keys"][0];
    assert_eq!(jwk["kid"], "card-key-1", "{jwks}");
    assert_eq!(jwk["alg"], "ES256", "{jwks}");
    assert_eq!(jwk["kty"], "EC", "{jwks}");
    assert!(jwk.get("d").is_none(), "the private part leaked: {jwks}");
    let jwks_file = scratch("jwks.json");
    std::fs::write(&jwks_file, &out.stdout).unwrap();

    let (child, url) = spawn_serve(&[
        "--store",
        "memory",
        "--card-signing-key",
        key,
        "--card-signing-kid",
        "card-key-1",
    ]);
    let _server = KillOnDrop(child);
    let jwks_arg = jwks_file.to_str().unwrap();
    for tenant in ["", "deployer"] {
        let out = run(&[
            "card", "--server", &url, "--tenant", tenant, "--verify", jwks_arg,
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{tenant:?}: {stderr}");
        assert!(
            stderr.contains(r#"verified: signature 0 (kid "card-key-1", ES256)"#),
            "{stderr}"
        );
        let card: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(card["signatures"].as_array().map(Vec::len), Some(1));
    }

    // Another key set: refused, and nothing on stdout.
    let other = run(&["jwks", key_path("ed25519.pem").to_str().unwrap()]);
    let other_file = scratch("other.json");
    std::fs::write(&other_file, &other.stdout).unwrap();
    let out = run(&[
        "card",
        "--server",
        &url,
        "--verify",
        other_file.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "verified with the wrong key: {stderr}"
    );
    assert!(out.stdout.is_empty(), "an unverified card was printed");
    assert!(stderr.contains("do not verify"), "{stderr}");
    assert!(
        stderr.contains(r#"no key with kid "card-key-1""#),
        "{stderr}"
    );
}

/// The official Python SDK's verifier (`a2a.utils.signing`, spec §8.4.3)
/// accepts every card. `A2A_TEST_PYTHON` names a Python with
/// `a2a-sdk[signing]` (CI makes one); without it the test says so and
/// checks nothing else.
#[tokio::test(flavor = "multi_thread")]
async fn the_python_sdk_verifier_accepts_every_card() {
    let Ok(python) = std::env::var("A2A_TEST_PYTHON") else {
        eprintln!(
            "skipped: set A2A_TEST_PYTHON to a Python with a2a-sdk[signing] to run the official \
             Python SDK's verifier"
        );
        return;
    };
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop/verify_cards.py");
    for key in ["es256.pem", "es384.pem", "rs256.pem", "ed25519.pem"] {
        let signer = signer(key);
        let jwks = scratch("jwks.json");
        std::fs::write(&jwks, serde_json::to_vec(&signer.jwks()).unwrap()).unwrap();
        let server = signed_server(signer.clone()).await;
        // The public cards as served (0.3 fields and all), the extended
        // ones as each binding answers them.
        let mut bodies: Vec<String> = served_cards(&server)
            .await
            .into_iter()
            .map(|(_, _, body)| body)
            .collect();
        for (_, card) in extended_cards(&server).await {
            bodies.push(json::to_string(&card).unwrap());
        }
        // The plain demo cards too: one signature, no empty values.
        let plain = TestServer::start_discovery(
            Arc::new(MemoryStore::new()),
            demo_router(),
            RuntimeConfig::default(),
            DiscoveryConfig {
                signer: Some(signer.clone()),
                ..Default::default()
            },
        )
        .await;
        bodies.extend(served_cards(&plain).await.into_iter().map(|(_, _, b)| b));
        let mut args = vec![script.clone(), jwks];
        for (i, body) in bodies.iter().enumerate() {
            let path = scratch(&format!("card-{i}.json"));
            std::fs::write(&path, body).unwrap();
            args.push(path);
        }
        let cards = bodies;
        let out = Command::new(&python).args(&args).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{key}: {stdout}\n{stderr}");
        assert_eq!(
            stdout
                .lines()
                .filter(|l| l.starts_with("verified "))
                .count(),
            cards.len(),
            "{key}: {stdout}"
        );
        server.stop().await;
        plain.stop().await;
    }
}
