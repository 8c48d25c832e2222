//! Calls over the JSON bindings (JSON-RPC, spec §9; HTTP+JSON, spec §11)
//! with a real HTTP client, and reading their event streams.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{Value, json};

use super::WAIT;

/// An HTTP client of one server.
#[derive(Clone)]
pub struct Http {
    pub client: reqwest::Client,
    pub base: String,
    pub token: Option<String>,
    /// Sent with every request (`A2A-Version`, ...).
    pub headers: Vec<(String, String)>,
}

/// A JSON answer: status, headers, body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

impl Answer {
    /// The JSON-RPC error's code, failing when the answer is no error.
    pub fn rpc_code(&self) -> i64 {
        self.body["error"]["code"]
            .as_i64()
            .unwrap_or_else(|| panic!("no JSON-RPC error in {:?}", self.body))
    }

    /// The ErrorInfo of a JSON-RPC error (`error.data`) or an HTTP+JSON
    /// one (`error.details`), failing when there is none.
    pub fn error_info(&self) -> &Value {
        let error = &self.body["error"];
        let details = error
            .get("data")
            .or_else(|| error.get("details"))
            .and_then(Value::as_array)
            .unwrap_or_else(|| panic!("no error details in {:?}", self.body));
        let info = details
            .iter()
            .find(|d| d["@type"] == "type.googleapis.com/google.rpc.ErrorInfo")
            .unwrap_or_else(|| panic!("no ErrorInfo in {:?}", self.body));
        assert_eq!(info["domain"], "a2a-protocol.org", "{info}");
        info
    }

    pub fn reason(&self) -> &str {
        self.error_info()["reason"].as_str().expect("a reason")
    }

    /// The field a BadRequest names first, failing when there is none.
    pub fn bad_field(&self) -> String {
        let error = &self.body["error"];
        let details = error
            .get("data")
            .or_else(|| error.get("details"))
            .and_then(Value::as_array)
            .expect("error details");
        let bad = details
            .iter()
            .find(|d| d["@type"] == "type.googleapis.com/google.rpc.BadRequest")
            .unwrap_or_else(|| panic!("no BadRequest in {:?}", self.body));
        bad["fieldViolations"][0]["field"]
            .as_str()
            .expect("a field")
            .to_owned()
    }

    pub fn result(&self) -> &Value {
        assert!(
            self.body.get("error").is_none(),
            "an error: {:?}",
            self.body
        );
        &self.body["result"]
    }
}

impl Http {
    pub fn new(addr: std::net::SocketAddr) -> Self {
        Http {
            client: reqwest::Client::builder()
                .timeout(WAIT)
                .build()
                .expect("an HTTP client"),
            base: format!("http://{addr}"),
            token: None,
            headers: Vec::new(),
        }
    }

    pub fn with_header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    pub fn with_token(mut self, token: &str) -> Self {
        self.token = Some(token.to_owned());
        self
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let mut builder = self.client.request(method, format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            builder = builder.bearer_auth(token);
        }
        for (name, value) in &self.headers {
            builder = builder.header(name, value);
        }
        builder
    }

    /// A JSON-RPC call of `method` at `path` (`/`, or `/{tenant}`).
    pub async fn rpc_at(&self, path: &str, method: &str, params: Value) -> Answer {
        let body = json!({"jsonrpc": "2.0", "id": "req-1", "method": method, "params": params});
        let answer = self
            .send(
                self.request(reqwest::Method::POST, path)
                    .header("content-type", "application/json")
                    .body(body.to_string()),
            )
            .await;
        // A call refused for its credentials is answered before its body
        // (and its id) is read: its id is null.
        if answer.body.get("jsonrpc").is_some() {
            let id = if answer.status == 401 {
                Value::Null
            } else {
                json!("req-1")
            };
            assert_eq!(answer.body["id"], id, "the id: {:?}", answer.body);
        }
        answer
    }

    pub async fn rpc(&self, method: &str, params: Value) -> Answer {
        self.rpc_at("/", method, params).await
    }

    /// A JSON-RPC POST of `body` as written, with `content_type`.
    pub async fn post_raw(&self, path: &str, content_type: Option<&str>, body: Vec<u8>) -> Answer {
        let mut builder = self.request(reqwest::Method::POST, path).body(body);
        if let Some(content_type) = content_type {
            builder = builder.header("content-type", content_type);
        }
        self.send(builder).await
    }

    /// An HTTP+JSON call: `method path`, with a JSON body when given.
    pub async fn rest(&self, method: &str, path: &str, body: Option<Value>) -> Answer {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut builder = self.request(method, path);
        if let Some(body) = body {
            builder = builder
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        self.send(builder).await
    }

    pub async fn send(&self, builder: reqwest::RequestBuilder) -> Answer {
        let response = tokio::time::timeout(WAIT, builder.send())
            .await
            .expect("the call answers in time")
            .expect("the call reaches the server");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let bytes = tokio::time::timeout(WAIT, response.bytes())
            .await
            .expect("the body arrives in time")
            .expect("a body");
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            // A body that is not JSON (the plain-text 404 of a server
            // without the JSON bindings) is kept as text.
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        Answer {
            status,
            headers,
            body,
        }
    }

    /// A streaming JSON-RPC call: the response, its body not yet read.
    pub async fn rpc_stream(&self, path: &str, method: &str, params: Value) -> reqwest::Response {
        let body = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params});
        let builder = self
            .request(reqwest::Method::POST, path)
            .header("content-type", "application/json")
            .header("accept", "text/event-stream")
            .body(body.to_string());
        tokio::time::timeout(WAIT, builder.send())
            .await
            .expect("the call answers in time")
            .expect("the call reaches the server")
    }

    /// A streaming HTTP+JSON call: the response, its body not yet read.
    pub async fn rest_stream(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> reqwest::Response {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut builder = self
            .request(method, path)
            .header("accept", "text/event-stream");
        if let Some(body) = body {
            builder = builder
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        tokio::time::timeout(WAIT, builder.send())
            .await
            .expect("the call answers in time")
            .expect("the call reaches the server")
    }
}

/// One event of an SSE stream.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// `data:` parsed as JSON, with the `event:` name if any.
    Data(Option<String>, Value),
    /// A comment line (`: keep-alive`).
    Comment,
}

/// Reads a whole event stream to its end (the server closes it), within
/// [`WAIT`]; checks it is `text/event-stream`.
pub async fn events(response: reqwest::Response) -> Vec<Event> {
    assert_eq!(response.status(), 200, "{response:?}");
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        content_type.starts_with("text/event-stream"),
        "{content_type}"
    );
    let bytes = tokio::time::timeout(WAIT, response.bytes())
        .await
        .expect("the stream ends in time")
        .expect("the stream reads to its end");
    parse(std::str::from_utf8(&bytes).expect("UTF-8"))
}

/// The data events only, failing on an `event: error`.
pub async fn data_events(response: reqwest::Response) -> Vec<Value> {
    events(response)
        .await
        .into_iter()
        .filter_map(|e| match e {
            Event::Data(None, v) => Some(v),
            Event::Data(Some(name), v) => panic!("an {name} event: {v}"),
            Event::Comment => None,
        })
        .collect()
}

/// Parses SSE text (events end with a blank line).
pub fn parse(text: &str) -> Vec<Event> {
    let mut out = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.is_empty()) {
        let mut name = None;
        let mut data = None;
        let mut comment = false;
        for line in block.lines() {
            if let Some(rest) = line.strip_prefix("data: ") {
                assert!(data.is_none(), "one data line per event: {block}");
                data = Some(serde_json::from_str::<Value>(rest).expect("JSON data"));
            } else if let Some(rest) = line.strip_prefix("event: ") {
                name = Some(rest.to_owned());
            } else if line.starts_with(':') {
                comment = true;
            } else {
                panic!("unexpected SSE line {line:?}");
            }
        }
        match data {
            Some(data) => out.push(Event::Data(name, data)),
            None if comment => out.push(Event::Comment),
            None => panic!("an event without data: {block:?}"),
        }
    }
    out
}

/// The next chunk of a live stream, within `limit`.
pub async fn next_chunk(
    stream: &mut (impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    limit: Duration,
) -> Option<String> {
    tokio::time::timeout(limit, stream.next())
        .await
        .expect("a chunk in time")
        .map(|chunk| String::from_utf8(chunk.expect("a chunk").to_vec()).unwrap())
}

/// The kind of a StreamResponse (`task`, `message`, `statusUpdate`,
/// `artifactUpdate`) and, for tasks and status updates, the state.
pub fn describe(event: &Value) -> String {
    let obj = event.as_object().expect("a StreamResponse object");
    assert_eq!(obj.len(), 1, "one payload: {event}");
    let (kind, payload) = obj.iter().next().unwrap();
    match kind.as_str() {
        "task" | "statusUpdate" => format!(
            "{kind}:{}",
            payload["status"]["state"].as_str().unwrap_or("?")
        ),
        other => other.to_owned(),
    }
}

/// A user message's ProtoJSON.
pub fn message(text: &str) -> Value {
    json!({
        "messageId": uuid::Uuid::new_v4().to_string(),
        "role": "ROLE_USER",
        "parts": [{"text": text}],
    })
}

/// A body one byte over the request limit, sent chunked (no declared
/// length), so the client has sent all of it when the server answers.
pub fn oversized_body() -> reqwest::Body {
    let chunks = (0..a2a_lifecycle::server::MAX_MESSAGE_BYTES / 65_536)
        .map(|_| vec![b' '; 65_536])
        .chain([vec![b' ']])
        .map(|chunk| Ok::<_, std::io::Error>(bytes::Bytes::from(chunk)));
    reqwest::Body::wrap_stream(futures_util::stream::iter(chunks))
}

/// The raw HTTP/1.1 answer to a POST of `path` that declares a body over
/// the limit and sends none of it.
pub async fn declared_too_large(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        a2a_lifecycle::server::MAX_MESSAGE_BYTES + 1
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(WAIT, tcp.read_to_end(&mut answer))
        .await
        .expect("an answer in time")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}
