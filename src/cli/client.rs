//! The client commands' connection to a server, over the binding they are
//! told to use (`--binding grpc|jsonrpc|http-json`), so an operator can
//! check each door from the shell. How a failed call is printed:
//! [`super::call_error`].
//!
//! Every binding rides the same connection (tonic's `Channel`: HTTP/2,
//! with the command's TLS settings); the JSON bindings send their HTTP
//! requests on it as the server's own port accepts them (HTTP/2 or
//! HTTP/1.1 alike). The HTTP+JSON paths are the routes of the proto's
//! `google.api.http` annotations (spec §11.3).

use std::collections::VecDeque;
use std::pin::Pin;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use http::{Method, header};
use http_body_util::BodyExt;
use serde_json::Value;
use tonic::transport::Channel;
use tower::ServiceExt;

use a2a_lifecycle::bindings::Binding;

pub use super::call_error::CallError;
use a2a_lifecycle::json;
use a2a_lifecycle::proto::a2a_service_client::A2aServiceClient;
use a2a_lifecycle::proto::{
    AgentCard, CancelTaskRequest, DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest, GetTaskPushNotificationConfigRequest, GetTaskRequest,
    ListTaskPushNotificationConfigsRequest, ListTaskPushNotificationConfigsResponse,
    ListTasksRequest, ListTasksResponse, SendMessageRequest, SendMessageResponse, StreamResponse,
    SubscribeToTaskRequest, Task, TaskPushNotificationConfig,
};

/// A stream of events, ending at the first error.
pub type Events = Pin<Box<dyn Stream<Item = Result<StreamResponse, CallError>> + Send>>;

type Grpc = A2aServiceClient<tonic::service::interceptor::InterceptedService<Channel, Bearer>>;

pub type BearerValue = tonic::metadata::MetadataValue<tonic::metadata::Ascii>;

/// Adds the client's bearer token to every call.
#[derive(Clone)]
struct Bearer(Option<BearerValue>);

impl tonic::service::Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// One server, over one binding.
pub struct Client {
    binding: Binding,
    grpc: Grpc,
    channel: Channel,
    authorization: Option<http::HeaderValue>,
    /// `A2A-Extensions` for every call (spec §4.6), when set.
    extensions: Option<&'static str>,
    next_id: u64,
}

impl Client {
    pub fn new(
        binding: Binding,
        channel: Channel,
        bearer: Option<BearerValue>,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let authorization = bearer
            .as_ref()
            .map(|v| http::HeaderValue::from_bytes(v.as_bytes()))
            .transpose()?;
        Ok(Client {
            binding,
            grpc: A2aServiceClient::with_interceptor(channel.clone(), Bearer(bearer)),
            channel,
            authorization,
            extensions: None,
            next_id: 1,
        })
    }

    /// Activates the extension `uri` on every call from now on (the
    /// `A2A-Extensions` service parameter, spec §4.6).
    pub fn with_extension(mut self, uri: &'static str) -> Self {
        self.extensions = Some(uri);
        self
    }

    /// `message` as a gRPC request carrying the client's extensions.
    fn grpc_request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(uri) = self.extensions {
            request.metadata_mut().insert(
                a2a_lifecycle::discovery::EXTENSIONS_METADATA,
                tonic::metadata::MetadataValue::from_static(uri),
            );
        }
        request
    }

    pub async fn send_message(
        &mut self,
        req: SendMessageRequest,
    ) -> Result<SendMessageResponse, CallError> {
        match self.binding {
            Binding::Grpc => Ok(self.grpc.send_message(req).await?.into_inner()),
            Binding::JsonRpc => self.rpc("SendMessage", &req).await,
            Binding::HttpJson => {
                let path = tenanted(&req.tenant, "/message:send");
                self.rest(Method::POST, path, Some(&req)).await
            }
        }
    }

    pub async fn send_streaming_message(
        &mut self,
        req: SendMessageRequest,
    ) -> Result<Events, CallError> {
        match self.binding {
            Binding::Grpc => Ok(grpc_events(
                self.grpc.send_streaming_message(req).await?.into_inner(),
            )),
            Binding::JsonRpc => self.rpc_stream("SendStreamingMessage", &req).await,
            Binding::HttpJson => {
                let path = tenanted(&req.tenant, "/message:stream");
                self.rest_stream(Method::POST, path, Some(&req)).await
            }
        }
    }

    pub async fn get_task(&mut self, req: GetTaskRequest) -> Result<Task, CallError> {
        match self.binding {
            Binding::Grpc => {
                let request = self.grpc_request(req);
                Ok(self.grpc.get_task(request).await?.into_inner())
            }
            Binding::JsonRpc => self.rpc("GetTask", &req).await,
            Binding::HttpJson => {
                let mut query = Query::default();
                query.add_opt("historyLength", req.history_length);
                let path = tenanted(&req.tenant, &format!("/tasks/{}", segment(&req.id)));
                self.rest(Method::GET, query.on(path), None::<&Task>).await
            }
        }
    }

    pub async fn list_tasks(
        &mut self,
        req: ListTasksRequest,
    ) -> Result<ListTasksResponse, CallError> {
        match self.binding {
            Binding::Grpc => Ok(self.grpc.list_tasks(req).await?.into_inner()),
            Binding::JsonRpc => self.rpc("ListTasks", &req).await,
            Binding::HttpJson => {
                let mut query = Query::default();
                query.add_str("contextId", &req.context_id);
                if req.status != 0 {
                    let state = a2a_lifecycle::proto::TaskState::try_from(req.status)
                        .map(|s| s.as_str_name().to_owned())
                        .unwrap_or_else(|_| req.status.to_string());
                    query.add_str("status", &state);
                }
                query.add_opt("pageSize", req.page_size);
                query.add_str("pageToken", &req.page_token);
                query.add_opt("historyLength", req.history_length);
                query.add_opt("includeArtifacts", req.include_artifacts);
                let path = tenanted(&req.tenant, "/tasks");
                self.rest(Method::GET, query.on(path), None::<&Task>).await
            }
        }
    }

    pub async fn cancel_task(&mut self, req: CancelTaskRequest) -> Result<Task, CallError> {
        match self.binding {
            Binding::Grpc => Ok(self.grpc.cancel_task(req).await?.into_inner()),
            Binding::JsonRpc => self.rpc("CancelTask", &req).await,
            Binding::HttpJson => {
                let path = tenanted(&req.tenant, &format!("/tasks/{}:cancel", segment(&req.id)));
                self.rest(Method::POST, path, Some(&req)).await
            }
        }
    }

    pub async fn subscribe_to_task(
        &mut self,
        req: SubscribeToTaskRequest,
    ) -> Result<Events, CallError> {
        match self.binding {
            Binding::Grpc => Ok(grpc_events(
                self.grpc.subscribe_to_task(req).await?.into_inner(),
            )),
            Binding::JsonRpc => self.rpc_stream("SubscribeToTask", &req).await,
            Binding::HttpJson => {
                let path = tenanted(
                    &req.tenant,
                    &format!("/tasks/{}:subscribe", segment(&req.id)),
                );
                self.rest_stream(Method::POST, path, None::<&Task>).await
            }
        }
    }

    pub async fn create_push_config(
        &mut self,
        req: TaskPushNotificationConfig,
    ) -> Result<TaskPushNotificationConfig, CallError> {
        match self.binding {
            Binding::Grpc => Ok(self
                .grpc
                .create_task_push_notification_config(req)
                .await?
                .into_inner()),
            Binding::JsonRpc => self.rpc("CreateTaskPushNotificationConfig", &req).await,
            Binding::HttpJson => {
                let path = push_path(&req.tenant, &req.task_id, None);
                self.rest(Method::POST, path, Some(&req)).await
            }
        }
    }

    pub async fn get_push_config(
        &mut self,
        req: GetTaskPushNotificationConfigRequest,
    ) -> Result<TaskPushNotificationConfig, CallError> {
        match self.binding {
            Binding::Grpc => Ok(self
                .grpc
                .get_task_push_notification_config(req)
                .await?
                .into_inner()),
            Binding::JsonRpc => self.rpc("GetTaskPushNotificationConfig", &req).await,
            Binding::HttpJson => {
                let path = push_path(&req.tenant, &req.task_id, Some(&req.id));
                self.rest(Method::GET, path, None::<&Task>).await
            }
        }
    }

    pub async fn list_push_configs(
        &mut self,
        req: ListTaskPushNotificationConfigsRequest,
    ) -> Result<ListTaskPushNotificationConfigsResponse, CallError> {
        match self.binding {
            Binding::Grpc => Ok(self
                .grpc
                .list_task_push_notification_configs(req)
                .await?
                .into_inner()),
            Binding::JsonRpc => self.rpc("ListTaskPushNotificationConfigs", &req).await,
            Binding::HttpJson => {
                let mut query = Query::default();
                if req.page_size != 0 {
                    query.add_opt("pageSize", Some(req.page_size));
                }
                query.add_str("pageToken", &req.page_token);
                let path = push_path(&req.tenant, &req.task_id, None);
                self.rest(Method::GET, query.on(path), None::<&Task>).await
            }
        }
    }

    pub async fn delete_push_config(
        &mut self,
        req: DeleteTaskPushNotificationConfigRequest,
    ) -> Result<(), CallError> {
        match self.binding {
            Binding::Grpc => {
                self.grpc.delete_task_push_notification_config(req).await?;
                Ok(())
            }
            Binding::JsonRpc => self
                .rpc_value("DeleteTaskPushNotificationConfig", &req)
                .await
                .map(drop),
            Binding::HttpJson => {
                let path = push_path(&req.tenant, &req.task_id, Some(&req.id));
                self.exchange(Method::DELETE, path, None).await.map(drop)
            }
        }
    }

    pub async fn get_extended_agent_card(
        &mut self,
        req: GetExtendedAgentCardRequest,
    ) -> Result<AgentCard, CallError> {
        match self.binding {
            Binding::Grpc => Ok(self.grpc.get_extended_agent_card(req).await?.into_inner()),
            Binding::JsonRpc => self.rpc("GetExtendedAgentCard", &req).await,
            Binding::HttpJson => {
                let path = tenanted(&req.tenant, "/extendedAgentCard");
                self.rest(Method::GET, path, None::<&Task>).await
            }
        }
    }

    /// One HTTP request on the connection; the response's status,
    /// content type and body stream.
    async fn request(
        &mut self,
        method: Method,
        path: String,
        body: Option<Vec<u8>>,
        accept_events: bool,
    ) -> Result<http::Response<tonic::body::Body>, CallError> {
        let mut builder = http::Request::builder().method(method).uri(path);
        if let Some(value) = &self.authorization {
            builder = builder.header(header::AUTHORIZATION, value.clone());
        }
        builder = builder.header(a2a_lifecycle::discovery::VERSION_METADATA, "1.0");
        if let Some(uri) = self.extensions {
            builder = builder.header(a2a_lifecycle::discovery::EXTENSIONS_METADATA, uri);
        }
        if accept_events {
            builder = builder.header(header::ACCEPT, "text/event-stream");
        }
        let body = match body {
            Some(bytes) => {
                builder = builder.header(header::CONTENT_TYPE, "application/json");
                tonic::body::Body::new(http_body_util::Full::new(Bytes::from(bytes)))
            }
            None => tonic::body::Body::empty(),
        };
        let request = builder.body(body).map_err(CallError::transport)?;
        self.channel
            .clone()
            .oneshot(request)
            .await
            .map_err(CallError::transport)
    }

    /// A whole answer: its status and body.
    async fn exchange(
        &mut self,
        method: Method,
        path: String,
        body: Option<Vec<u8>>,
    ) -> Result<Bytes, CallError> {
        let response = self.request(method, path, body, false).await?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(CallError::transport)?
            .to_bytes();
        if !status.is_success() {
            return Err(CallError::from_rest(status, &bytes));
        }
        Ok(bytes)
    }

    async fn rest<
        Req: serde::Serialize,
        Resp: serde::de::DeserializeOwned + prost::Message + prost::Name + Default,
    >(
        &mut self,
        method: Method,
        path: String,
        body: Option<&Req>,
    ) -> Result<Resp, CallError> {
        let body = body
            .map(|b| json::to_string(b).map(String::into_bytes))
            .transpose()
            .map_err(CallError::protocol)?;
        let bytes = self.exchange(method, path, body).await?;
        json::from_request_slice(&bytes).map_err(CallError::protocol)
    }

    async fn rest_stream<Req: serde::Serialize>(
        &mut self,
        method: Method,
        path: String,
        body: Option<&Req>,
    ) -> Result<Events, CallError> {
        let body = body
            .map(|b| json::to_string(b).map(String::into_bytes))
            .transpose()
            .map_err(CallError::protocol)?;
        let response = self.request(method, path, body, true).await?;
        let status = response.status();
        if !status.is_success() {
            let bytes = response
                .into_body()
                .collect()
                .await
                .map_err(CallError::transport)?
                .to_bytes();
            return Err(CallError::from_rest(status, &bytes));
        }
        Ok(sse_events(response.into_body(), |event, data| {
            let value: Value = serde_json::from_slice(data).map_err(CallError::protocol)?;
            if event == Some("error") || value.get("error").is_some() {
                return Err(CallError::from_rest(http::StatusCode::OK, data));
            }
            json::from_request_slice(data).map_err(CallError::protocol)
        }))
    }

    fn envelope<Req: serde::Serialize>(
        &mut self,
        method: &str,
        req: &Req,
    ) -> Result<Vec<u8>, CallError> {
        let id = self.next_id;
        self.next_id += 1;
        let params = json::to_string(req).map_err(CallError::protocol)?;
        Ok(
            format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{params}}}"#)
                .into_bytes(),
        )
    }

    /// A JSON-RPC call's `result`, as JSON.
    async fn rpc_value<Req: serde::Serialize>(
        &mut self,
        method: &str,
        req: &Req,
    ) -> Result<Value, CallError> {
        let body = self.envelope(method, req)?;
        let response = self
            .request(Method::POST, "/".into(), Some(body), false)
            .await?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(CallError::transport)?
            .to_bytes();
        let value: Value =
            serde_json::from_slice(&bytes).map_err(|_| CallError::from_rest(status, &bytes))?;
        if let Some(error) = value.get("error") {
            return Err(CallError::from_jsonrpc(error));
        }
        value
            .get("result")
            .cloned()
            .ok_or_else(|| CallError::protocol("a JSON-RPC response without result or error"))
    }

    async fn rpc<
        Req: serde::Serialize,
        Resp: serde::de::DeserializeOwned + prost::Message + prost::Name + Default,
    >(
        &mut self,
        method: &str,
        req: &Req,
    ) -> Result<Resp, CallError> {
        let result = self.rpc_value(method, req).await?;
        json::from_request_slice(result.to_string().as_bytes()).map_err(CallError::protocol)
    }

    async fn rpc_stream<Req: serde::Serialize>(
        &mut self,
        method: &str,
        req: &Req,
    ) -> Result<Events, CallError> {
        let body = self.envelope(method, req)?;
        let response = self
            .request(Method::POST, "/".into(), Some(body), true)
            .await?;
        let status = response.status();
        let is_events = response
            .headers()
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        if !is_events {
            // Refused before the stream: one JSON-RPC response.
            let bytes = response
                .into_body()
                .collect()
                .await
                .map_err(CallError::transport)?
                .to_bytes();
            let value: Value =
                serde_json::from_slice(&bytes).map_err(|_| CallError::from_rest(status, &bytes))?;
            return Err(match value.get("error") {
                Some(error) => CallError::from_jsonrpc(error),
                None => CallError::protocol("a streaming call answered without a stream"),
            });
        }
        Ok(sse_events(response.into_body(), |_, data| {
            let value: Value = serde_json::from_slice(data).map_err(CallError::protocol)?;
            if let Some(error) = value.get("error") {
                return Err(CallError::from_jsonrpc(error));
            }
            let result = value
                .get("result")
                .ok_or_else(|| CallError::protocol("an event without result or error"))?;
            json::from_request_slice(result.to_string().as_bytes()).map_err(CallError::protocol)
        }))
    }
}

/// The public agent card of `tenant` (spec §8.2), as served.
pub async fn public_card(channel: Channel, tenant: &str) -> Result<AgentCard, CallError> {
    let path = tenanted(tenant, "/.well-known/agent-card.json");
    let request = http::Request::get(path)
        .body(tonic::body::Body::empty())
        .map_err(CallError::transport)?;
    let response = channel
        .oneshot(request)
        .await
        .map_err(CallError::transport)?;
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(CallError::transport)?
        .to_bytes();
    if !status.is_success() {
        return Err(CallError::from_rest(status, &bytes));
    }
    json::from_request_slice(&bytes).map_err(CallError::protocol)
}

fn grpc_events(stream: tonic::Streaming<StreamResponse>) -> Events {
    Box::pin(stream.map(|item| item.map_err(CallError::from)))
}

/// Reads an SSE body, one event at a time, into `decode(event name,
/// data)`; comment lines (keep-alives) are skipped; an error ends it.
fn sse_events(
    body: tonic::body::Body,
    decode: impl Fn(Option<&str>, &[u8]) -> Result<StreamResponse, CallError> + Send + 'static,
) -> Events {
    Box::pin(async_stream::stream! {
        let mut body = body;
        let mut buffer: Vec<u8> = Vec::new();
        let mut ready: VecDeque<(Option<String>, Vec<u8>)> = VecDeque::new();
        loop {
            while let Some((event, data)) = ready.pop_front() {
                let decoded = decode(event.as_deref(), &data);
                let failed = decoded.is_err();
                yield decoded;
                if failed {
                    return;
                }
            }
            match body.frame().await {
                None => return,
                Some(Err(e)) => {
                    yield Err(CallError::transport(e));
                    return;
                }
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        buffer.extend_from_slice(&data);
                        ready.extend(take_events(&mut buffer));
                    }
                }
            }
        }
    })
}

/// The complete events at the front of `buffer` (each ends with a blank
/// line), removed from it.
fn take_events(buffer: &mut Vec<u8>) -> Vec<(Option<String>, Vec<u8>)> {
    let mut events = Vec::new();
    while let Some(end) = buffer.windows(2).position(|w| w == b"\n\n") {
        let block: Vec<u8> = buffer.drain(..end + 2).collect();
        let mut name = None;
        let mut data: Option<Vec<u8>> = None;
        for line in block.split(|b| *b == b'\n') {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if let Some(rest) = line.strip_prefix(b"data:") {
                let rest = rest.strip_prefix(b" ").unwrap_or(rest);
                match &mut data {
                    Some(d) => {
                        d.push(b'\n');
                        d.extend_from_slice(rest);
                    }
                    None => data = Some(rest.to_vec()),
                }
            } else if let Some(rest) = line.strip_prefix(b"event:") {
                name = Some(String::from_utf8_lossy(rest).trim().to_owned());
            }
        }
        if let Some(data) = data {
            events.push((name, data));
        }
    }
    events
}

/// `path` under `/{tenant}` when a tenant is named (the annotations'
/// additional bindings).
fn tenanted(tenant: &str, path: &str) -> String {
    if tenant.is_empty() {
        path.to_owned()
    } else {
        format!("/{}{path}", segment(tenant))
    }
}

/// A task's push configs, or one of them (spec §11.3.3).
fn push_path(tenant: &str, task_id: &str, id: Option<&str>) -> String {
    let configs = format!("/tasks/{}/pushNotificationConfigs", segment(task_id));
    match id {
        Some(id) => tenanted(tenant, &format!("{configs}/{}", segment(id))),
        None => tenanted(tenant, &configs),
    }
}

/// Percent-encodes one path segment or query value (RFC 3986: all but
/// the unreserved characters).
fn segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Query parameters by their camelCase names (spec §11.5).
#[derive(Default)]
struct Query(Vec<String>);

impl Query {
    fn add_str(&mut self, name: &str, value: &str) {
        if !value.is_empty() {
            self.0.push(format!("{name}={}", segment(value)));
        }
    }

    fn add_opt(&mut self, name: &str, value: Option<impl std::fmt::Display>) {
        if let Some(value) = value {
            self.add_str(name, &value.to_string());
        }
    }

    fn on(self, path: String) -> String {
        if self.0.is_empty() {
            path
        } else {
            format!("{path}?{}", self.0.join("&"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_cut_at_blank_lines() {
        let mut buffer = b": keep-alive\n\ndata: {\"a\":1}\n\nevent: error\ndata: {\"b\"".to_vec();
        let events = take_events(&mut buffer);
        assert_eq!(events, [(None, b"{\"a\":1}".to_vec())]);
        buffer.extend_from_slice(b":2}\n\n");
        let events = take_events(&mut buffer);
        assert_eq!(events, [(Some("error".into()), b"{\"b\":2}".to_vec())]);
        assert!(buffer.is_empty());
    }

    #[test]
    fn segments_are_percent_encoded() {
        assert_eq!(segment("a b/c:d"), "a%20b%2Fc%3Ad");
        assert_eq!(tenanted("", "/tasks"), "/tasks");
        assert_eq!(tenanted("t 1", "/tasks"), "/t%201/tasks");
    }
}
