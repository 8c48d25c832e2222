//! Connection bounds over real sockets (issue "hardening", items 2, 3, 6):
//! the stream cap is advertised in SETTINGS, connections past the cap are
//! closed at accept while served ones go on, a client that does not finish
//! its handshake is cut at the deadline, and shutdown ends within its grace
//! period whatever clients hold open.

use crate::support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use a2a_lifecycle::agent::demo::demo_router;
use a2a_lifecycle::agent::{AgentError, AgentExecutor, AgentRouter, EventSink, RequestContext};
use a2a_lifecycle::connections::ConnectionLimits;
use a2a_lifecycle::proto::TaskState;
use a2a_lifecycle::runtime::{RuntimeConfig, TaskManager};
use a2a_lifecycle::server::Server;
use a2a_lifecycle::store::MemoryStore;
use a2a_lifecycle::store::TaskStore;
use support::within;

struct Limited {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    served: JoinHandle<()>,
}

async fn start(limits: ConnectionLimits) -> Limited {
    start_with(limits, demo_router(), Arc::new(MemoryStore::new())).await
}

async fn start_with(
    limits: ConnectionLimits,
    agents: AgentRouter,
    store: Arc<dyn TaskStore>,
) -> Limited {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let manager = TaskManager::new(store, agents, RuntimeConfig::default());
    let (stop, stopped) = oneshot::channel::<()>();
    let served = tokio::spawn(async move {
        Server::new(manager)
            .limits(limits)
            .serve(listener, async {
                let _ = stopped.await;
            })
            .await
            .expect("server failed");
    });
    Limited {
        addr,
        stop: Some(stop),
        served,
    }
}

const CARD_REQUEST: &[u8] =
    b"GET /.well-known/agent-card.json HTTP/1.1\r\nHost: test\r\nConnection: keep-alive\r\n\r\n";

/// Sends a card request on a kept-alive HTTP/1.1 connection and reads the
/// response's status line.
async fn card_over(stream: &mut TcpStream) -> String {
    stream.write_all(CARD_REQUEST).await.unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let n = within("card response", stream.read(&mut buf))
        .await
        .unwrap();
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// What the server sent on `stream` before it closed it (EOF or reset);
/// the test fails if it does not close it within `WAIT`.
async fn closed_by_server(stream: &mut TcpStream) -> Vec<u8> {
    let mut buf = [0u8; 1024];
    let mut got = Vec::new();
    loop {
        match within("server closes", stream.read(&mut buf)).await {
            Ok(0) | Err(_) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_cap_is_advertised_in_settings() {
    let server = start(ConnectionLimits {
        max_concurrent_streams: 8,
        ..Default::default()
    })
    .await;
    let tcp = TcpStream::connect(server.addr).await.unwrap();
    let (client, mut conn) = within("h2 handshake", h2::client::handshake(tcp))
        .await
        .unwrap();
    let mut client = within("ready", client.ready()).await.unwrap();
    let request = http::Request::get(format!(
        "http://{}/.well-known/agent-card.json",
        server.addr
    ))
    .body(())
    .unwrap();
    let (response, _) = client.send_request(request, true).unwrap();
    // Drive the connection until the answer: the server's SETTINGS come
    // first on the connection, so they have been read by then.
    let status = within("h2 response", async {
        tokio::select! {
            r = response => r.unwrap().status(),
            c = &mut conn => panic!("connection ended: {c:?}"),
        }
    })
    .await;
    assert_eq!(status, 200);
    assert_eq!(conn.max_concurrent_send_streams(), 8);
    drop((client, conn));
    stop(server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_are_closed_and_served_ones_go_on() {
    let server = start(ConnectionLimits {
        max_connections: 2,
        // No deadline closes a served connection while the test waits: a
        // connection past the cap is closed by the cap or not at all.
        handshake_timeout: Duration::from_secs(3600),
        idle_timeout: Duration::from_secs(3600),
        ..Default::default()
    })
    .await;
    let mut a = TcpStream::connect(server.addr).await.unwrap();
    let mut b = TcpStream::connect(server.addr).await.unwrap();
    assert!(card_over(&mut a).await.contains("200"));
    assert!(card_over(&mut b).await.contains("200"));
    let mut c = TcpStream::connect(server.addr).await.unwrap();
    // c is accepted and closed at once; its request gets nothing. (The
    // write may fail: the server may have closed it already.)
    c.write_all(CARD_REQUEST).await.ok();
    let answered = closed_by_server(&mut c).await;
    assert!(
        answered.is_empty(),
        "served past the cap: {}",
        String::from_utf8_lossy(&answered)
    );
    // The served connections are unaffected.
    assert!(card_over(&mut a).await.contains("200"));
    // A place frees up when one closes.
    drop(b);
    let mut d = within("reconnect", async {
        loop {
            let mut d = TcpStream::connect(server.addr).await.unwrap();
            d.write_all(CARD_REQUEST).await.unwrap();
            let mut buf = vec![0u8; 64 * 1024];
            match d.read(&mut buf).await {
                Ok(n) if n > 0 => return d,
                // Still counted until the server saw b close.
                _ => tokio::task::yield_now().await,
            }
        }
    })
    .await;
    assert!(card_over(&mut d).await.contains("200"));
    drop((a, c, d));
    stop(server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_does_not_finish_its_handshake_is_cut() {
    let server = start(ConnectionLimits {
        handshake_timeout: Duration::from_millis(300),
        ..Default::default()
    })
    .await;
    // Silent.
    let mut silent = TcpStream::connect(server.addr).await.unwrap();
    // Half an HTTP/1.1 request.
    let mut half = TcpStream::connect(server.addr).await.unwrap();
    half.write_all(b"GET /.well-known/agent-card.json HTTP/1.1\r\nHost: t")
        .await
        .unwrap();
    // Half the HTTP/2 preface.
    let mut preface = TcpStream::connect(server.addr).await.unwrap();
    preface.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    // A client that says what it is in time is served.
    let mut whole = TcpStream::connect(server.addr).await.unwrap();
    assert!(card_over(&mut whole).await.contains("200"));
    closed_by_server(&mut silent).await;
    closed_by_server(&mut half).await;
    closed_by_server(&mut preface).await;
    drop(whole);
    stop(server).await;
}

/// HTTP/1.1: every request on a kept-alive connection has the deadline to
/// send its headers, not only the first; a connection waiting for its next
/// request is closed at it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_http1_request_has_a_header_deadline() {
    let server = start(ConnectionLimits {
        handshake_timeout: Duration::from_millis(300),
        ..Default::default()
    })
    .await;
    // Two requests in time, then half of a third.
    let mut slow = TcpStream::connect(server.addr).await.unwrap();
    assert!(card_over(&mut slow).await.contains("200"));
    assert!(card_over(&mut slow).await.contains("200"));
    slow.write_all(b"GET /.well-known/agent-card.json HTTP/1.1\r\nHost: t")
        .await
        .unwrap();
    // One request, then nothing.
    let mut quiet = TcpStream::connect(server.addr).await.unwrap();
    assert!(card_over(&mut quiet).await.contains("200"));
    closed_by_server(&mut slow).await;
    closed_by_server(&mut quiet).await;
    stop(server).await;
}

/// An HTTP/2 connection to the server, driven in the background; `closed`
/// completes when the server ends it, with whether it sent GOAWAY first.
struct H2Client {
    send: h2::client::SendRequest<bytes::Bytes>,
    closed: JoinHandle<Result<(), h2::Error>>,
}

async fn h2_connect(addr: SocketAddr) -> H2Client {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (send, conn) = within("h2 handshake", h2::client::handshake(tcp))
        .await
        .unwrap();
    H2Client {
        send,
        closed: tokio::spawn(conn),
    }
}

/// Opens a gRPC GetTask call and leaves its request body open, so the
/// call stays in flight until the returned stream is ended.
async fn open_call(client: &mut H2Client, addr: SocketAddr) -> h2::SendStream<bytes::Bytes> {
    let send = within("h2 ready", client.send.clone().ready())
        .await
        .unwrap();
    let mut send = send;
    let request = http::Request::post(format!("http://{addr}/lf.a2a.v1.A2AService/GetTask"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (_response, body) = send.send_request(request, false).unwrap();
    body
}

/// HTTP/2: a connection with no open stream is closed after the idle
/// timeout, with GOAWAY (the h2 client sees a clean end, not a reset); a
/// connection with a call in flight is not, whatever its age.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_http2_connections_are_closed_and_busy_ones_are_not() {
    let server = start(ConnectionLimits {
        idle_timeout: Duration::from_millis(300),
        ..Default::default()
    })
    .await;
    // Opened first, with a call in flight.
    let mut busy = h2_connect(server.addr).await;
    let mut call = open_call(&mut busy, server.addr).await;
    // Opened after it, with nothing to do: its idle deadline comes later
    // than the busy one's would.
    let idle = h2_connect(server.addr).await;
    let ended = within("idle connection closed", idle.closed).await.unwrap();
    assert!(ended.is_ok(), "not a graceful close: {ended:?}");
    // The busy connection is still served: its call finishes, and another
    // one starts on it.
    assert!(!busy.closed.is_finished(), "a busy connection was closed");
    let mut second = open_call(&mut busy, server.addr).await;
    // Both calls end (an empty GetTask request is answered at once).
    call.send_data(bytes::Bytes::from_static(&[0, 0, 0, 0, 0]), true)
        .unwrap();
    second
        .send_data(bytes::Bytes::from_static(&[0, 0, 0, 0, 0]), true)
        .unwrap();
    // Now idle, it is closed too.
    let ended = within("busy connection closed once idle", busy.closed)
        .await
        .unwrap();
    assert!(ended.is_ok(), "not a graceful close: {ended:?}");
    stop(server).await;
}

/// The client's `grpc-timeout` bounds a call: past it the server answers
/// DEADLINE_EXCEEDED, with ErrorInfo. (tonic's client enforces the deadline
/// itself, so the call goes over raw HTTP/2 to see the server's answer.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_the_clients_deadline_is_deadline_exceeded() {
    let server = start_with(
        ConnectionLimits {
            shutdown_grace: Duration::from_millis(200),
            ..Default::default()
        },
        AgentRouter::new().with("", Arc::new(Stubborn)),
        Arc::new(MemoryStore::new()),
    )
    .await;
    let client = h2_connect(server.addr).await;
    let mut send = within("h2 ready", client.send.clone().ready())
        .await
        .unwrap();
    // Blocking: the agent never finishes, so only the deadline ends it.
    let message =
        prost::Message::encode_to_vec(&support::request("", support::user_message("deaf"), false));
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(&message);
    let request = http::Request::post(format!(
        "http://{}/lf.a2a.v1.A2AService/SendMessage",
        server.addr
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .header("grpc-timeout", "200m")
    .body(())
    .unwrap();
    let (response, mut body) = send.send_request(request, false).unwrap();
    body.send_data(bytes::Bytes::from(frame), true).unwrap();
    let response = within("answer at the deadline", response).await.unwrap();
    let status = tonic::Status::from_header_map(response.headers()).expect("trailers-only status");
    support::assert_a2a_error(&status, tonic::Code::DeadlineExceeded, "DEADLINE_EXCEEDED");
    client.closed.abort();
    stop(server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_within_its_grace_whatever_clients_hold_open() {
    let mut server = start(ConnectionLimits {
        handshake_timeout: Duration::from_secs(600),
        shutdown_grace: Duration::from_millis(300),
        ..Default::default()
    })
    .await;
    let _silent = TcpStream::connect(server.addr).await.unwrap();
    let mut half = TcpStream::connect(server.addr).await.unwrap();
    half.write_all(b"GET /.well-known/agent-card.json HTTP/1.1\r\nHost: t")
        .await
        .unwrap();
    // An HTTP/2 connection with no stream.
    let tcp = TcpStream::connect(server.addr).await.unwrap();
    let (_h2, h2_conn) = within("h2 handshake", h2::client::handshake(tcp))
        .await
        .unwrap();
    let driving = tokio::spawn(h2_conn);
    let _ = server.stop.take().unwrap().send(());
    within("shutdown", &mut server.served).await.unwrap();
    driving.abort();
}

async fn stop(mut server: Limited) {
    let _ = server.stop.take().unwrap().send(());
    within("shutdown", server.served).await.unwrap();
}

/// `deaf`: WORKING, then never returns and ignores cancellation. Anything
/// else: WORKING, then returns when cancelled (its task left WORKING, which
/// the runtime fails).
struct Stubborn;

#[async_trait::async_trait]
impl AgentExecutor for Stubborn {
    async fn execute(&self, ctx: RequestContext, sink: EventSink) -> Result<(), AgentError> {
        sink.status(TaskState::Working, None).await?;
        if ctx.text() == "deaf" {
            std::future::pending::<()>().await;
        }
        ctx.cancelled.cancelled().await;
        Ok(())
    }
}

/// Graceful shutdown leaves no task active in the store, every time: runs
/// that stop fail their tasks with the shutdown message, and the tasks of
/// runs that ignore the shutdown are failed once the grace is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_leaves_no_task_active_in_the_store() {
    let store = Arc::new(MemoryStore::new());
    let mut server = start_with(
        ConnectionLimits {
            shutdown_grace: Duration::from_millis(200),
            ..Default::default()
        },
        AgentRouter::new().with("", Arc::new(Stubborn)),
        store.clone(),
    )
    .await;
    let mut client = a2a_lifecycle::proto::a2a_service_client::A2aServiceClient::connect(format!(
        "http://{}",
        server.addr
    ))
    .await
    .unwrap();
    let mut ids = Vec::new();
    for i in 0..20 {
        let text = if i % 2 == 0 { "deaf" } else { "stops" };
        let task = within(
            "send",
            support::send_task(
                &mut client,
                support::request("", support::user_message(text), true),
            ),
        )
        .await;
        ids.push(task.id);
    }
    drop(client);
    let _ = server.stop.take().unwrap().send(());
    within("shutdown", &mut server.served).await.unwrap();
    for id in ids {
        let stored = store.get("", &id).await.unwrap().expect("stored");
        let task = stored.record.task;
        assert_eq!(
            support::state_of(&task),
            TaskState::Failed,
            "task {id} left {:?}",
            support::state_of(&task)
        );
        assert!(
            support::status_text(&task).contains("shut down"),
            "{}",
            support::status_text(&task)
        );
    }
}

/// A connection to `addr` from the loopback address `from`.
async fn connect_from(from: &str, addr: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    within("connect", socket.connect(addr)).await.unwrap()
}

/// One address cannot hold every connection: past its own cap its next
/// connection is closed unserved, while another address is served, and a
/// place frees when one of its connections closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_hold_every_connection() {
    let server = start(ConnectionLimits {
        max_connections: 100,
        max_connections_per_peer: 2,
        handshake_timeout: Duration::from_secs(3600),
        idle_timeout: Duration::from_secs(3600),
        ..Default::default()
    })
    .await;
    let mut a = connect_from("127.0.0.1", server.addr).await;
    let b = connect_from("127.0.0.1", server.addr).await;
    assert!(card_over(&mut a).await.contains("200"));
    let mut c = connect_from("127.0.0.1", server.addr).await;
    c.write_all(CARD_REQUEST).await.ok();
    let answered = closed_by_server(&mut c).await;
    assert!(
        answered.is_empty(),
        "a third connection from one address was served: {}",
        String::from_utf8_lossy(&answered)
    );
    // Another address is served meanwhile.
    let mut other = connect_from("127.0.0.2", server.addr).await;
    assert!(card_over(&mut other).await.contains("200"));
    // b closes: its address may connect again (once the server saw it).
    drop(b);
    within("a place frees", async {
        loop {
            let mut d = connect_from("127.0.0.1", server.addr).await;
            d.write_all(CARD_REQUEST).await.unwrap();
            let mut buf = vec![0u8; 64 * 1024];
            match d.read(&mut buf).await {
                Ok(n) if n > 0 => return,
                _ => tokio::task::yield_now().await,
            }
        }
    })
    .await;
    stop(server).await;
}

/// A client that connects again the moment its refused connection closes
/// (a loop past its cap) is held to one attempt per
/// [`REFUSED_HELD_FOR`]: the refused connection ends, unserved, only
/// after it, so the loop cannot make the server accept and close
/// thousands of connections a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reconnecting_past_its_cap_is_slowed_to_one_attempt_per_hold() {
    use a2a_lifecycle::connections::REFUSED_HELD_FOR;
    let server = start(ConnectionLimits {
        max_connections: 100,
        max_connections_per_peer: 1,
        handshake_timeout: Duration::from_secs(3600),
        idle_timeout: Duration::from_secs(3600),
        ..Default::default()
    })
    .await;
    let mut held = connect_from("127.0.0.1", server.addr).await;
    assert!(card_over(&mut held).await.contains("200"));
    let start = std::time::Instant::now();
    let mut attempts = 0;
    while start.elapsed() < REFUSED_HELD_FOR * 2 {
        let mut refused = connect_from("127.0.0.1", server.addr).await;
        refused.write_all(CARD_REQUEST).await.ok();
        let answered = closed_by_server(&mut refused).await;
        assert!(
            answered.is_empty(),
            "served past the cap: {}",
            String::from_utf8_lossy(&answered)
        );
        attempts += 1;
    }
    // Two holds' time: two or three attempts (unheld: thousands).
    assert!(
        attempts <= 3,
        "{attempts} refused connections in {:?}",
        start.elapsed()
    );
    // The held connection is served meanwhile.
    assert!(card_over(&mut held).await.contains("200"));
    stop(server).await;
}

/// A request whose body stalls once its headers arrived is ended at the
/// body deadline, over HTTP/1.1 and HTTP/2 alike; a whole request is
/// served as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_request_body_is_ended_at_its_deadline() {
    let server = start(ConnectionLimits {
        body_timeout: Duration::from_millis(300),
        handshake_timeout: Duration::from_secs(3600),
        idle_timeout: Duration::from_secs(3600),
        ..Default::default()
    })
    .await;
    // HTTP/1.1: a JSON-RPC call that promises 100 bytes and sends 10.
    let mut h1 = TcpStream::connect(server.addr).await.unwrap();
    h1.write_all(
        b"POST / HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"jsonrpc\"",
    )
    .await
    .unwrap();
    let answered = String::from_utf8(closed_by_server(&mut h1).await).unwrap();
    assert!(answered.starts_with("HTTP/1.1 4"), "{answered}");
    // HTTP/2: a gRPC call whose body never comes.
    let h2 = h2_connect(server.addr).await;
    let send = within("h2 ready", h2.send.clone().ready()).await.unwrap();
    let mut send = send;
    let request = http::Request::post(format!(
        "http://{}/lf.a2a.v1.A2AService/GetTask",
        server.addr
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(())
    .unwrap();
    let (response, _body) = send.send_request(request, false).unwrap();
    let response = within("the stalled call ends", response).await.unwrap();
    // The status: in the headers (trailers-only) or the trailers.
    let headers = response.headers().clone();
    let mut body = response.into_body();
    while let Some(chunk) = within("the answer", body.data()).await {
        chunk.unwrap();
    }
    let trailers = within("trailers", body.trailers()).await.unwrap();
    let status = trailers
        .as_ref()
        .unwrap_or(&headers)
        .get("grpc-status")
        .map(|v| v.to_str().unwrap().to_owned());
    assert!(
        status.as_deref().is_some_and(|s| s != "0"),
        "the stalled call was not ended with an error: {headers:?} {trailers:?}"
    );
    stop(server).await;
}
