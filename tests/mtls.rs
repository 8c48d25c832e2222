//! Mutual TLS and reloads (issue "security"): a client certificate from
//! the client CA names its principal (subject CN, else first DNS name);
//! with mutual TLS alone it is required; the cards declare the scheme; and
//! SIGHUP swaps the certificate and the auth file while an open stream
//! goes on.

use crate::support;

use std::sync::Arc;

use a2a_lifecycle::auth::Authenticator;
use a2a_lifecycle::connections::ClientCerts;
use a2a_lifecycle::proto::a2a_service_client::A2aServiceClient;
use a2a_lifecycle::proto::*;
use tonic::Code;

use support::certs::{Ca, Pair, channel, scratch_dir, serve_tls};
use support::jwt::key_digest;
use support::{request, user_message, within};

/// alice has an API key; mallory authenticates by certificate only.
fn auth() -> Arc<Authenticator> {
    let file = format!(
        "[[principal]]\nname = \"alice\"\napi_key_sha256 = \"{}\"\ntenants = [\"*\"]\nrole = \"user\"\n\n\
         [[principal]]\nname = \"mallory\"\ntenants = [\"code-reviewer\"]\nrole = \"user\"\n",
        key_digest("alice-key")
    );
    Arc::new(Authenticator::parse(&file, std::path::Path::new(".")).unwrap())
}

async fn new_task(
    client: &mut A2aServiceClient<tonic::transport::Channel>,
) -> Result<Task, tonic::Status> {
    let answer = within(
        "send",
        client.send_message(request(
            "code-reviewer",
            user_message("review my change"),
            false,
        )),
    )
    .await?;
    match answer.into_inner().payload {
        Some(send_message_response::Payload::Task(t)) => Ok(t),
        other => panic!("expected a task, got {other:?}"),
    }
}

async fn get(
    client: &mut A2aServiceClient<tonic::transport::Channel>,
    id: &str,
) -> Result<Task, tonic::Status> {
    within(
        "get",
        client.get_task(GetTaskRequest {
            tenant: "code-reviewer".into(),
            id: id.into(),
            history_length: None,
        }),
    )
    .await
    .map(|r| r.into_inner())
}

/// Beside `--auth`, a certificate is optional: it names a principal of
/// the file, whose tenants and role apply; a name the file lacks is
/// UNAUTHENTICATED; a certificate from another CA fails the handshake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_names_a_principal_of_the_auth_file() {
    let ca = Ca::new();
    let server = serve_tls(&ca, &ca.server(), ClientCerts::Optional, Some(auth())).await;
    let mallory_cert = ca.client(Some("mallory"), &[]);
    let channel_as = |pair: Option<Pair>| {
        let ca = ca.pem();
        async move { channel(server.port, &ca, pair.as_ref()).await }
    };

    let mut mallory = A2aServiceClient::new(channel_as(Some(mallory_cert.clone())).await.unwrap());
    let hers = new_task(&mut mallory)
        .await
        .expect("mallory by certificate");
    assert_eq!(get(&mut mallory, &hers.id).await.unwrap().id, hers.id);

    // alice, by API key over a connection without a certificate, does not
    // see mallory's task: a user sees its own.
    let plain = channel_as(None)
        .await
        .expect("no certificate is optional here");
    let mut alice =
        A2aServiceClient::with_interceptor(plain.clone(), |mut r: tonic::Request<()>| {
            r.metadata_mut()
                .insert("authorization", "Bearer alice-key".parse().unwrap());
            Ok(r)
        });
    let denied = within(
        "alice reads mallory's task",
        alice.get_task(GetTaskRequest {
            tenant: "code-reviewer".into(),
            id: hers.id.clone(),
            history_length: None,
        }),
    )
    .await
    .unwrap_err();
    assert_eq!(denied.code(), Code::NotFound);

    // mallory may use code-reviewer only.
    let other_tenant = within(
        "mallory in deployer",
        mallory.list_tasks(ListTasksRequest {
            tenant: "deployer".into(),
            ..Default::default()
        }),
    )
    .await
    .unwrap_err();
    assert_eq!(other_tenant.code(), Code::PermissionDenied);

    // No credential at all: UNAUTHENTICATED.
    let mut nobody = A2aServiceClient::new(plain);
    assert_eq!(
        new_task(&mut nobody).await.unwrap_err().code(),
        Code::Unauthenticated
    );

    // A verified certificate whose name is no principal of the file.
    let stranger = channel_as(Some(ca.client(Some("stranger"), &[])))
        .await
        .unwrap();
    let refused = new_task(&mut A2aServiceClient::new(stranger))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
    assert!(refused.message().contains("stranger"), "{refused:?}");

    // A certificate from another CA never gets through the handshake.
    let forged = Ca::new().client(Some("mallory"), &[]);
    let forged = match channel_as(Some(forged)).await {
        Err(_) => None,
        Ok(ch) => Some(new_task(&mut A2aServiceClient::new(ch)).await),
    };
    assert!(
        !matches!(forged, Some(Ok(_))),
        "a certificate from another CA was served: {forged:?}"
    );
    server.stop().await;
}

/// Mutual TLS alone (as `serve --tls-client-ca` runs it): A2A calls need
/// a certificate, whose subject CN, else first DNS name, is a user of
/// every tenant; the cards stay public and declare the mutual TLS scheme
/// only. An embedder may require the certificate in the handshake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_alone_requires_a_certificate() {
    let ca = Ca::new();
    let required = serve_tls(&ca, &ca.server(), ClientCerts::Required, None).await;
    if let Ok(ch) = channel(required.port, &ca.pem(), None).await {
        let answer = new_task(&mut A2aServiceClient::new(ch)).await;
        assert!(answer.is_err(), "served without a certificate: {answer:?}");
    }
    required.stop().await;

    let server = serve_tls(&ca, &ca.server(), ClientCerts::Optional, None).await;
    let without = channel(server.port, &ca.pem(), None).await.unwrap();
    let refused = new_task(&mut A2aServiceClient::new(without))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    let dns_only = ca.client(None, &["build-agent.example.test"]);
    let mut agent = A2aServiceClient::new(
        channel(server.port, &ca.pem(), Some(&dns_only))
            .await
            .unwrap(),
    );
    let task = new_task(&mut agent).await.expect("named by its DNS name");
    let mut dave = A2aServiceClient::new(
        channel(
            server.port,
            &ca.pem(),
            Some(&ca.client(Some("dave"), &["dave.example.test"])),
        )
        .await
        .unwrap(),
    );
    assert_eq!(
        get(&mut dave, &task.id).await.unwrap_err().code(),
        Code::NotFound,
        "another client's task"
    );
    assert_eq!(get(&mut agent, &task.id).await.unwrap().id, task.id);

    // The card (public: fetched without a certificate) declares mutual TLS
    // and no bearer.
    let card = card_over_tls(server.port, &ca.pem(), None).await;
    assert!(card.starts_with("HTTP/1.1 200"), "{card}");
    assert!(card.contains("\"mtls\""), "{card}");
    assert!(card.contains("mtlsSecurityScheme"), "{card}");
    assert!(!card.contains("httpAuthSecurityScheme"), "{card}");
    server.stop().await;
}

/// The agent card over HTTPS (HTTP/1.1), with a client certificate when
/// given.
async fn card_over_tls(port: u16, ca: &str, client: Option<&Pair>) -> String {
    let connector = {
        use rustls_pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_pki_types::CertificateDer::pem_slice_iter(ca.as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
        }
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
        let config = match client {
            None => builder.with_no_client_auth(),
            Some(client) => {
                let chain =
                    rustls_pki_types::CertificateDer::pem_slice_iter(client.chain.as_bytes())
                        .collect::<Result<Vec<_>, _>>()
                        .unwrap();
                let key =
                    rustls_pki_types::PrivateKeyDer::from_pem_slice(client.key.as_bytes()).unwrap();
                builder.with_client_auth_cert(chain, key).unwrap()
            }
        };
        tokio_rustls::TlsConnector::from(Arc::new(config))
    };
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = within("TLS", connector.connect(name, tcp)).await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    tls.write_all(
        b"GET /.well-known/agent-card.json HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let mut response = Vec::new();
    // The server closes after the response (Connection: close); a TLS
    // close without close_notify is still the end here.
    let _ = within("card", tls.read_to_end(&mut response)).await;
    String::from_utf8_lossy(&response).into_owned()
}

/// `serve --tls-client-ca` on the command line, and SIGHUP: the
/// certificate and the auth file are swapped while a stream opened before
/// stays open and keeps its events coming.
#[test]
fn sighup_swaps_the_certificate_and_keys_while_a_stream_stays_open() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = scratch_dir("sighup");
    let (old_ca, new_ca) = (Ca::new(), Ca::new());
    let write = |name: &str, text: &str| std::fs::write(dir.join(name), text).unwrap();
    let principal = |key: &str| {
        format!(
            "[[principal]]\nname = \"ci\"\napi_key_sha256 = \"{}\"\ntenants = [\"*\"]\nrole = \"user\"\n",
            key_digest(key)
        )
    };
    let first = old_ca.server();
    write("chain.pem", &first.chain);
    write("key.pem", &first.key);
    write("auth.toml", &principal("old-key"));
    let path = |name: &str| dir.join(name).to_str().unwrap().to_owned();
    let (mut child, url, lines) = support::spawn_serve_logged(&[
        "--store",
        "memory",
        "--tls-cert",
        &path("chain.pem"),
        "--tls-key",
        &path("key.pem"),
        "--auth",
        &path("auth.toml"),
    ]);
    let port: u16 = url.rsplit(':').next().unwrap().parse().unwrap();
    let pid = child.id().to_string();

    runtime.block_on(async {
        let authed = |ch: tonic::transport::Channel, key: &'static str| {
            A2aServiceClient::with_interceptor(ch, move |mut r: tonic::Request<()>| {
                r.metadata_mut()
                    .insert("authorization", format!("Bearer {key}").parse().unwrap());
                Ok(r)
            })
        };
        let old_channel = channel(port, &old_ca.pem(), None).await.unwrap();
        let mut client = authed(old_channel, "old-key");
        // A slow run: progress every 100 ms for a minute.
        let mut events = within(
            "stream",
            client.send_streaming_message(request("", user_message("slow please"), false)),
        )
        .await
        .unwrap()
        .into_inner();
        within("first event", events.message())
            .await
            .unwrap()
            .unwrap();

        let second = new_ca.server();
        write("chain.pem", &second.chain);
        write("key.pem", &second.key);
        write("auth.toml", &principal("new-key"));
        let status = std::process::Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap();
        assert!(status.success());
        support::wait_for_line(&lines, "reloaded the auth file");
        support::wait_for_line(&lines, "reloaded the TLS certificate");

        // The stream opened before the reload still brings events.
        for _ in 0..3 {
            let event = within("event after reload", events.message()).await;
            assert!(matches!(event, Ok(Some(_))), "{event:?}");
        }
        // New connections get the new certificate and the new keys.
        let new_channel = channel(port, &new_ca.pem(), None)
            .await
            .expect("new certificate");
        let mut fresh = authed(new_channel.clone(), "new-key");
        let task = within(
            "send with the new key",
            fresh.send_message(request("", user_message("run the tests"), false)),
        )
        .await;
        assert!(task.is_ok(), "{task:?}");
        let mut stale = authed(new_channel, "old-key");
        let refused = within(
            "send with the old key",
            stale.send_message(request("", user_message("run the tests"), false)),
        )
        .await
        .unwrap_err();
        assert_eq!(refused.code(), Code::Unauthenticated);
        let old = channel(port, &old_ca.pem(), None).await;
        let old_served = match old {
            Err(_) => false,
            Ok(ch) => authed(ch, "new-key")
                .list_tasks(ListTasksRequest::default())
                .await
                .is_ok(),
        };
        assert!(!old_served, "a client trusting only the old CA was served");

        // A broken file is refused and the one in force stays.
        write("auth.toml", "not toml [");
        std::process::Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap();
        support::wait_for_line(&lines, "auth file not reloaded");
        let still = within(
            "send after a bad reload",
            fresh.send_message(request("", user_message("run the tests"), true)),
        )
        .await;
        assert!(still.is_ok(), "{still:?}");
    });
    child.kill().unwrap();
    child.wait().unwrap();
}

/// `serve --tls-client-ca` alone and the built-in client's
/// `--client-cert`/`--client-key`: with the certificate it is served,
/// without one it is refused.
#[test]
fn the_command_line_serves_and_calls_with_client_certificates() {
    let dir = scratch_dir("mtls-cli");
    let ca = Ca::new();
    let server = ca.server();
    let client = ca.client(Some("cli-user"), &[]);
    for (name, pem) in [
        ("ca.pem", ca.pem()),
        ("chain.pem", server.chain),
        ("key.pem", server.key),
        ("client.pem", client.chain),
        ("client-key.pem", client.key),
    ] {
        std::fs::write(dir.join(name), pem).unwrap();
    }
    let path = |name: &str| dir.join(name).to_str().unwrap().to_owned();
    let (mut child, url) = support::spawn_serve(&[
        "--store",
        "memory",
        "--tls-cert",
        &path("chain.pem"),
        "--tls-key",
        &path("key.pem"),
        "--tls-client-ca",
        &path("ca.pem"),
    ]);
    let url = url.replace("http://127.0.0.1", "https://localhost");
    let send = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_a2a-lifecycle"))
            .args([
                "send",
                "run the tests",
                "--server",
                &url,
                "--ca-cert",
                &path("ca.pem"),
            ])
            .args(extra)
            .output()
            .unwrap()
    };
    let with = send(&[
        "--client-cert",
        &path("client.pem"),
        "--client-key",
        &path("client-key.pem"),
    ]);
    assert!(
        with.status.success(),
        "{}",
        String::from_utf8_lossy(&with.stderr)
    );
    assert!(String::from_utf8_lossy(&with.stdout).contains("TASK_STATE_COMPLETED"));
    let without = send(&[]);
    assert!(
        !without.status.success(),
        "served without a client certificate"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}
