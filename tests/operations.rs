//! Health and readiness over real sockets: the gRPC health service and
//! `/readyz` turn NOT_SERVING while the server drains at shutdown and while
//! its PostgreSQL store cannot be reached (the connection cut by a TCP
//! proxy in between), and SERVING again when it can; `/healthz` stays up;
//! `--metrics-listen`'s listener serves metrics without credentials.

use crate::support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use a2a_lifecycle::connections::ConnectionLimits;
use a2a_lifecycle::operations::Operations;
use a2a_lifecycle::runtime::{RuntimeConfig, TaskManager};
use a2a_lifecycle::server::{Security, Server};
use a2a_lifecycle::store::{MemoryStore, PostgresStore, TaskStore};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::Streaming;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use support::*;

/// A server with a second listener for operations; its address.
async fn serve_with_operations(
    store: Arc<dyn TaskStore>,
    limits: ConnectionLimits,
    auth: Option<Arc<a2a_lifecycle::auth::Authenticator>>,
) -> (TestServer, SocketAddr) {
    let operations = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = operations.local_addr().unwrap();
    let manager = TaskManager::new(
        store,
        a2a_lifecycle::agent::demo::demo_router(),
        RuntimeConfig::default(),
    );
    let security = Security {
        auth,
        ..Default::default()
    };
    let operations = Operations {
        listener: Some(operations),
        probe_every: Duration::from_millis(50),
    };
    let server = Server::new(manager)
        .limits(limits)
        .security(security)
        .operations(operations);
    let server = TestServer::serve(server).await;
    (server, addr)
}

/// The health service's statuses for `service`, as they change.
async fn watch_health(addr: SocketAddr, service: &str) -> Streaming<HealthCheckResponse> {
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let request = HealthCheckRequest {
        service: service.into(),
    };
    within("watch health", HealthClient::new(channel).watch(request))
        .await
        .unwrap()
        .into_inner()
}

/// The next status a health watch reports.
async fn next_status(watch: &mut Streaming<HealthCheckResponse>) -> ServingStatus {
    within("the next health status", watch.message())
        .await
        .expect("the watch goes on")
        .expect("a status")
        .status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_turns_not_serving_while_the_server_drains() {
    let limits = ConnectionLimits {
        // The drain lasts as long as this test's own watch stays open.
        shutdown_grace: Duration::from_secs(60),
        ..Default::default()
    };
    let (mut server, operations) =
        serve_with_operations(Arc::new(MemoryStore::new()), limits, None).await;
    let mut on_main = watch_health(server.addr, "lf.a2a.v1.A2AService").await;
    let mut on_operations = watch_health(operations, "").await;
    assert_eq!(next_status(&mut on_main).await, ServingStatus::Serving);
    assert_eq!(
        next_status(&mut on_operations).await,
        ServingStatus::Serving
    );
    let ready = http_get(operations, "/readyz", &[]).await;
    assert_eq!((ready.status, ready.body.as_str()), (200, "ready\n"));
    let on_port = http_get(server.addr, "/readyz", &[]).await;
    assert_eq!(on_port.status, 200, "also on the server's port");

    let stopped = server.begin_shutdown();
    // On connections already open, and on the listener that stays.
    assert_eq!(next_status(&mut on_main).await, ServingStatus::NotServing);
    assert_eq!(
        next_status(&mut on_operations).await,
        ServingStatus::NotServing
    );
    let ready = http_get(operations, "/readyz", &[]).await;
    assert_eq!((ready.status, ready.body.as_str()), (503, "draining\n"));
    let live = http_get(operations, "/healthz", &[]).await;
    assert_eq!(live.status, 200, "the process is up");

    // The last call in flight ends: the drain is over, and the server
    // with it.
    drop(on_main);
    within("the server stops", stopped).await.unwrap();
}

/// A TCP proxy to `target` that can cut every connection through it (and
/// refuse new ones) and let them through again: a database that cannot be
/// reached, without stopping the database.
struct Proxy {
    addr: SocketAddr,
    up: watch::Sender<bool>,
}

impl Proxy {
    async fn start(target: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (up, _) = watch::channel(true);
        let state = up.subscribe();
        tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    return;
                };
                let mut state = state.clone();
                if !*state.borrow_and_update() {
                    continue; // dropped: refused
                }
                let target = target.clone();
                tokio::spawn(async move {
                    let Ok(mut server) = tokio::net::TcpStream::connect(&target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = state.wait_for(|up| !up) => {}
                    }
                });
            }
        });
        Proxy { addr, up }
    }

    fn cut(&self) {
        self.up.send_replace(false);
    }

    fn restore(&self) {
        self.up.send_replace(true);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_turns_not_serving_while_the_store_cannot_be_reached() {
    let Some(url) = support::postgres::fresh_schema().await else {
        return;
    };
    // postgres://USER@HOST:PORT/DB?...: through the proxy instead.
    let (head, rest) = url.split_once('@').unwrap();
    let (authority, tail) = rest.split_once('/').unwrap();
    let proxy = Proxy::start(authority.to_owned()).await;
    let proxied = format!("{head}@{}/{tail}", proxy.addr);
    let store = within("open the store", PostgresStore::open(&proxied))
        .await
        .unwrap();
    let (server, operations) =
        serve_with_operations(Arc::new(store), ConnectionLimits::default(), None).await;
    let mut health = watch_health(server.addr, "").await;
    assert_eq!(next_status(&mut health).await, ServingStatus::Serving);

    proxy.cut();
    assert_eq!(next_status(&mut health).await, ServingStatus::NotServing);
    let ready = http_get(operations, "/readyz", &[]).await;
    assert_eq!(ready.status, 503);
    assert!(
        ready.body.starts_with("store unreachable: "),
        "{}",
        ready.body
    );
    // The server's own port is public: it says no more than that.
    let public = http_get(server.addr, "/readyz", &[]).await;
    assert_eq!((public.status, public.body.as_str()), (503, "not ready\n"));
    assert_eq!(http_get(operations, "/healthz", &[]).await.status, 200);

    proxy.restore();
    assert_eq!(next_status(&mut health).await, ServingStatus::Serving);
    let ready = http_get(operations, "/readyz", &[]).await;
    assert_eq!((ready.status, ready.body.as_str()), (200, "ready\n"));
    // And it serves again.
    let mut client = server.client().await;
    let task = within(
        "send after the outage",
        send_task(&mut client, request("bench", user_message("go"), false)),
    )
    .await;
    assert_eq!(state_of(&task), a2a_lifecycle::proto::TaskState::Completed);
    // A watch in flight would hold the drain for its grace.
    drop(health);
    within("stop", server.stop()).await;
}

/// The operations listener serves metrics without credentials while the
/// server's own port asks for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operations_listener_serves_metrics_without_credentials() {
    let file = format!(
        "[[principal]]\nname = \"ops\"\napi_key_sha256 = \"{}\"\ntenants = [\"*\"]\nrole = \"admin\"\n",
        support::jwt::key_digest("a-key"),
    );
    let auth = a2a_lifecycle::auth::Authenticator::parse(&file, std::path::Path::new(".")).unwrap();
    let (server, operations) = serve_with_operations(
        Arc::new(MemoryStore::new()),
        ConnectionLimits::default(),
        Some(Arc::new(auth)),
    )
    .await;
    assert_eq!(http_get(server.addr, "/metrics", &[]).await.status, 401);
    let scraped = http_get(operations, "/metrics", &[]).await;
    assert_eq!(scraped.status, 200);
    let metrics = parse_metrics(&scraped.body);
    assert!(
        metrics
            .samples
            .iter()
            .any(|s| s.metric == "a2a_runs_active"),
        "{}",
        scraped.body
    );
    // The probes stay public on the server's port too.
    assert_eq!(http_get(server.addr, "/readyz", &[]).await.status, 200);
    assert_eq!(
        http_get(operations, "/.well-known/agent-card.json", &[])
            .await
            .status,
        404,
        "only operations there"
    );
    within("stop", server.stop()).await;
}

/// A gRPC channel to `addr` from the loopback address `from`.
async fn channel_from(from: &'static str, addr: SocketAddr) -> tonic::transport::Channel {
    let connector = tower::service_fn(move |_: http::Uri| async move {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(format!("{from}:0").parse().unwrap())?;
        let tcp = socket.connect(addr).await?;
        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tcp))
    });
    within(
        "connect",
        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_with_connector(connector),
    )
    .await
    .unwrap()
}

/// The public health Watch is bounded per client address on the
/// server's port: past the bound a Watch is RESOURCE_EXHAUSTED, another
/// address still watches, and a closed Watch frees its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn public_health_watches_are_bounded_per_address() {
    use a2a_lifecycle::operations::MAX_WATCHES_PER_PEER;
    let server = TestServer::start().await;
    let mut client = HealthClient::new(channel_from("127.0.0.1", server.addr).await);
    let watch = |client: &mut HealthClient<tonic::transport::Channel>| {
        let mut client = client.clone();
        async move {
            within(
                "watch",
                client.watch(HealthCheckRequest {
                    service: String::new(),
                }),
            )
            .await
            .map(|w| w.into_inner())
        }
    };
    let mut held = Vec::new();
    for _ in 0..MAX_WATCHES_PER_PEER {
        let mut w = watch(&mut client).await.expect("within the bound");
        assert_eq!(next_status(&mut w).await, ServingStatus::Serving);
        held.push(w);
    }
    let refused = watch(&mut client).await.expect_err("past the bound");
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    // Another address watches.
    let mut other = HealthClient::new(channel_from("127.0.0.2", server.addr).await);
    let mut w = watch(&mut other).await.expect("another address");
    assert_eq!(next_status(&mut w).await, ServingStatus::Serving);
    // One closes: its place is taken again (once the server saw it go).
    drop(held.pop());
    within("a place frees", async {
        loop {
            if let Ok(mut w) = watch(&mut client).await {
                assert_eq!(next_status(&mut w).await, ServingStatus::Serving);
                return w;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    drop(held);
    drop(w);
    server.stop().await;
}
