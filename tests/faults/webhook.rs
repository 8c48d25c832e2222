//! The webhook: an HTTP/1.1 server on loopback recording every POST, in
//! arrival order, with the moment its body was read, then answering 200
//! after 0-80 ms (a receiver that takes its time keeps deliveries in
//! flight, as a real one does, when the nemesis strikes).

use std::sync::Arc;
use std::time::Duration;

use a2a_lifecycle::proto::{StreamResponse, stream_response::Payload};
use http_body_util::BodyExt;

use crate::history::{EventKey, History, Post};

/// Starts the webhook; its URL. It serves until the runtime ends.
pub async fn start(history: Arc<History>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the webhook");
    let url = format!(
        "http://{}/hook",
        listener.local_addr().expect("the webhook's address")
    );
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let history = history.clone();
            let service = hyper::service::service_fn(
                move |request: hyper::Request<hyper::body::Incoming>| {
                    let history = history.clone();
                    async move {
                        let (parts, body) = request.into_parts();
                        let bytes = body.collect().await?.to_bytes();
                        let token = parts
                            .headers
                            .get("x-a2a-notification-token")
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_owned);
                        record(&history, token, &bytes);
                        tokio::time::sleep(Duration::from_millis(fastrand::u64(..80))).await;
                        Ok::<_, hyper::Error>(hyper::Response::new(http_body_util::Empty::<
                            bytes::Bytes,
                        >::new(
                        )))
                    }
                },
            );
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), service),
            );
        }
    });
    url
}

/// Records one POST: its task, its config (token) and its event.
fn record(history: &History, token: Option<String>, body: &[u8]) {
    let at = history.now();
    let text = String::from_utf8_lossy(body);
    let (task_id, event) = match a2a_lifecycle::json::from_str::<StreamResponse>(&text) {
        Ok(event) => {
            let task_id = match &event.payload {
                Some(Payload::StatusUpdate(u)) => u.task_id.clone(),
                Some(Payload::ArtifactUpdate(u)) => u.task_id.clone(),
                _ => String::new(),
            };
            let key = EventKey::of(&event).unwrap_or_else(|| Err(format!("not an update: {text}")));
            (task_id, key)
        }
        Err(e) => (String::new(), Err(format!("{e}: {text}"))),
    };
    let event = match &token {
        Some(_) => event,
        None => Err(format!("no notification token: {text}")),
    };
    history.post(Post {
        at,
        task_id,
        token: token.unwrap_or_default(),
        event,
    });
}
