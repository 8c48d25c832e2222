//! `a2a-bare`: the baseline the benchmark (`a2a-bench`) compares the real
//! server against. It serves the same `lf.a2a.v1.A2AService` proto over the
//! same tonic transport, but does no real work: no store, no lifecycle
//! rules, no validation, no executor, no tracing.
//!
//! Why it exists: the CPU a request costs the real server includes what
//! tonic, hyper and prost cost anyway (HTTP/2 framing, encoding, the task
//! wake-ups of a call). Measured in the same run, on the same machine, this
//! server gives that floor, so the real server's overhead can be reported
//! relative to tonic's own limit instead of as an absolute number that
//! depends on the machine.
//!
//! Why the answers are fixed: any work done per request here would raise
//! the floor and hide the real server's overhead. So the Task a plain
//! SendMessage or GetTask returns is built once at startup and cloned (it
//! has the shape the real `bench` agent produces: COMPLETED, the user
//! message in history, one small `result` artifact, so the encoded sizes
//! are comparable), and the request is not looked at beyond its first text
//! part.
//!
//! The one live behaviour is `fanout:K:WAIT_MS:INTERVAL_US`, with the same
//! meaning as the real `bench` agent (`src/agent/demo/bench.rs`), so the
//! benchmark's fan-out workload (one producer, many SubscribeToTask
//! streams) runs against both servers unchanged: the floor there is a
//! tokio broadcast channel feeding tonic streams.
//!
//! `--tuned` serves with the real server's runtime and connection settings
//! (see `a2a_lifecycle::server`); by default tokio's and tonic's defaults
//! apply, which is tonic's limit as most servers meet it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use a2a_lifecycle::wkt::Timestamp;
use clap::Parser;
use futures_util::Stream;
use futures_util::stream::{self, StreamExt};
use tokio::net::TcpListener;
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

use a2a_lifecycle::proto::a2a_service_server::{A2aService, A2aServiceServer};
use a2a_lifecycle::proto::{
    AgentCard, Artifact, CancelTaskRequest, DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest, GetTaskPushNotificationConfigRequest, GetTaskRequest,
    ListTaskPushNotificationConfigsRequest, ListTaskPushNotificationConfigsResponse,
    ListTasksRequest, ListTasksResponse, Message, Part, Role, SendMessageRequest,
    SendMessageResponse, StreamResponse, SubscribeToTaskRequest, Task, TaskArtifactUpdateEvent,
    TaskPushNotificationConfig, TaskState, TaskStatus, TaskStatusUpdateEvent, part::Content,
    send_message_response, stream_response::Payload,
};
use a2a_lifecycle::server::{MAX_MESSAGE_BYTES, shutdown_signal};

#[path = "a2a-bare/unvectored.rs"]
mod unvectored;
use unvectored::UnvectoredTcp;

/// The same allocator as the `a2a-lifecycle` binary (mimalloc), so the
/// benchmark's ratios compare code, not allocators.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Events a fan-out broadcast holds for a subscriber that is behind. Large
/// enough for the benchmark's K=200 plus the closing event with room to
/// spare, so a subscriber only lags (and is cut off) when it really cannot
/// keep up, not because of the ring size.
const FANOUT_BUFFER: usize = 1024;

#[derive(Parser)]
#[command(
    version,
    about = "Bare tonic A2A server: fixed answers, the benchmark's lower bound"
)]
struct Cli {
    /// Address to listen on (`127.0.0.1:0` picks a free port; the bound
    /// address is logged to stderr as `addr=...`).
    #[arg(long, default_value = "127.0.0.1:50052")]
    listen: SocketAddr,
    /// Run on the real server's runtime and connection settings (no LIFO
    /// slot, no vectored writes: `a2a_lifecycle::server`) instead of
    /// tokio's and tonic's defaults, so the real server's own overhead can
    /// be told apart from what those settings gain any tonic server.
    #[arg(long)]
    tuned: bool,
}

/// A fan-out task in progress: what a new subscriber is sent first, and
/// the channel of everything after.
struct Live {
    /// The Task as SendMessage returned it (WORKING), sent first as a
    /// StreamResponse, as the real server's SubscribeToTask does (spec:
    /// the stream starts with the Task), so both servers send subscribers
    /// the same number of messages.
    snapshot: StreamResponse,
    events: broadcast::Sender<StreamResponse>,
}

/// Fan-out tasks by id. A std Mutex: it is held only for an insert, a
/// remove or a `subscribe`, never across an await.
type LiveMap = Arc<Mutex<HashMap<String, Live>>>;

type EventStream = Pin<Box<dyn Stream<Item = Result<StreamResponse, Status>> + Send>>;

/// The answers, built once.
struct Bare {
    /// A plain SendMessage's answer (the fixed COMPLETED task), already
    /// wrapped so a request costs one clone.
    sent: SendMessageResponse,
    /// GetTask's answer, whatever the id.
    task: Task,
    /// SendStreamingMessage's two events: the task WORKING, then COMPLETED.
    streamed: [StreamResponse; 2],
    live: LiveMap,
}

fn text_part(text: impl Into<String>) -> Part {
    Part {
        content: Some(Content::Text(text.into())),
        media_type: "text/plain".into(),
        ..Default::default()
    }
}

fn uuid() -> String {
    uuid::Uuid::new_v4().to_string()
}

fn status(state: TaskState, message: Option<Message>) -> TaskStatus {
    TaskStatus {
        state: state as i32,
        message,
        // Stamped like the real server's status updates, so the events
        // encode to comparable sizes.
        timestamp: Some(Timestamp::from(SystemTime::now())),
    }
}

fn status_event(task_id: &str, context_id: &str, status: TaskStatus) -> StreamResponse {
    StreamResponse {
        payload: Some(Payload::StatusUpdate(TaskStatusUpdateEvent {
            task_id: task_id.to_owned(),
            context_id: context_id.to_owned(),
            status: Some(status),
            metadata: None,
        })),
    }
}

impl Bare {
    fn new() -> Self {
        let (id, context_id) = (uuid(), uuid());
        let user = Message {
            message_id: uuid(),
            context_id: context_id.clone(),
            task_id: id.clone(),
            role: Role::User as i32,
            parts: vec![text_part("go")],
            ..Default::default()
        };
        let task = Task {
            id: id.clone(),
            context_id: context_id.clone(),
            status: Some(status(TaskState::Completed, None)),
            artifacts: vec![Artifact {
                artifact_id: "result".into(),
                name: "result".into(),
                parts: vec![text_part("ok")],
                ..Default::default()
            }],
            history: vec![user.clone()],
            metadata: None,
        };
        let working = Task {
            status: Some(status(TaskState::Working, None)),
            artifacts: Vec::new(),
            ..task.clone()
        };
        Bare {
            sent: SendMessageResponse {
                payload: Some(send_message_response::Payload::Task(task.clone())),
            },
            streamed: [
                StreamResponse {
                    payload: Some(Payload::Task(working)),
                },
                status_event(&id, &context_id, status(TaskState::Completed, None)),
            ],
            task,
            live: LiveMap::default(),
        }
    }
}

/// A parsed `fanout:K:WAIT_MS:INTERVAL_US` (the `bench` agent's format,
/// without its limits: this server validates nothing).
struct Fanout {
    updates: u32,
    wait: Duration,
    interval: Duration,
}

impl Fanout {
    fn parse(rest: &str) -> Option<Fanout> {
        let mut fields = rest.trim().split(':');
        let updates = fields.next()?.parse().ok()?;
        let wait = fields.next()?.parse().ok()?;
        let interval = fields.next()?.parse().ok()?;
        if fields.next().is_some() {
            return None;
        }
        Some(Fanout {
            updates,
            wait: Duration::from_millis(wait),
            interval: Duration::from_micros(interval),
        })
    }
}

/// The text after `fanout:` in the message's first text part, if any.
fn fanout_text(request: &SendMessageRequest) -> Option<&str> {
    let parts = &request.message.as_ref()?.parts;
    let text = parts.iter().find_map(|p| match &p.content {
        Some(Content::Text(t)) => Some(t),
        _ => None,
    })?;
    text.trim_start().strip_prefix("fanout:")
}

/// Runs one fan-out: the bench agent's event sequence, sent to whoever
/// subscribed. A send with no subscriber fails; that is not an error here.
async fn fanout(
    live: LiveMap,
    events: broadcast::Sender<StreamResponse>,
    id: String,
    context_id: String,
    f: Fanout,
) {
    tokio::time::sleep(f.wait).await;
    for n in 1..=f.updates {
        let event = if n % 2 == 1 {
            let message = Message {
                message_id: uuid(),
                role: Role::Agent as i32,
                // No media type, like the real server's status messages.
                parts: vec![Part {
                    content: Some(Content::Text(n.to_string())),
                    ..Default::default()
                }],
                ..Default::default()
            };
            status_event(&id, &context_id, status(TaskState::Working, Some(message)))
        } else {
            StreamResponse {
                payload: Some(Payload::ArtifactUpdate(TaskArtifactUpdateEvent {
                    task_id: id.clone(),
                    context_id: context_id.clone(),
                    artifact: Some(Artifact {
                        artifact_id: "fanout".into(),
                        name: "fanout".into(),
                        parts: vec![text_part(n.to_string())],
                        ..Default::default()
                    }),
                    append: n > 2,
                    last_chunk: false,
                    metadata: None,
                })),
            }
        };
        let _ = events.send(event);
        if !f.interval.is_zero() {
            tokio::time::sleep(f.interval).await;
        }
    }
    // Unregister before the last event: subscribing happens under the same
    // lock, so everyone who found the task is subscribed already and gets
    // COMPLETED; anyone later gets NOT_FOUND instead of a stream that
    // closes without it.
    live.lock().expect("live map").remove(&id);
    let _ = events.send(status_event(
        &id,
        &context_id,
        status(TaskState::Completed, None),
    ));
}

fn completes(event: &StreamResponse) -> bool {
    matches!(
        &event.payload,
        Some(Payload::StatusUpdate(TaskStatusUpdateEvent { status: Some(s), .. }))
            if s.state == TaskState::Completed as i32
    )
}

/// The snapshot, then the broadcast until COMPLETED. The state is the
/// receiver, `None` once the stream has ended.
fn subscriber_stream(
    snapshot: StreamResponse,
    events: broadcast::Receiver<StreamResponse>,
) -> EventStream {
    let live = stream::unfold(Some(events), |rx| async move {
        let mut rx = rx?;
        match rx.recv().await {
            Ok(event) => {
                let next = (!completes(&event)).then_some(rx);
                Some((Ok(event), next))
            }
            // Unlike the real server, no catch-up snapshot: a subscriber
            // that missed events is told so and cut off.
            Err(RecvError::Lagged(missed)) => Some((
                Err(Status::data_loss(format!(
                    "subscriber fell {missed} events behind"
                ))),
                None,
            )),
            Err(RecvError::Closed) => None,
        }
    });
    Box::pin(stream::once(async { Ok(snapshot) }).chain(live))
}

#[tonic::async_trait]
impl A2aService for Bare {
    async fn send_message(
        &self,
        request: Request<SendMessageRequest>,
    ) -> Result<Response<SendMessageResponse>, Status> {
        let request = request.into_inner();
        let Some(rest) = fanout_text(&request) else {
            return Ok(Response::new(self.sent.clone()));
        };
        let f = Fanout::parse(rest)
            .ok_or_else(|| Status::invalid_argument("expected fanout:K:WAIT_MS:INTERVAL_US"))?;
        let mut message = request.message.unwrap_or_default();
        let id = uuid();
        let context_id = if message.context_id.is_empty() {
            uuid()
        } else {
            message.context_id.clone()
        };
        message.task_id = id.clone();
        message.context_id = context_id.clone();
        let task = Task {
            id: id.clone(),
            context_id: context_id.clone(),
            status: Some(status(TaskState::Working, None)),
            artifacts: Vec::new(),
            history: vec![message],
            metadata: None,
        };
        let (events, _) = broadcast::channel(FANOUT_BUFFER);
        self.live.lock().expect("live map").insert(
            id.clone(),
            Live {
                snapshot: StreamResponse {
                    payload: Some(Payload::Task(task.clone())),
                },
                events: events.clone(),
            },
        );
        tokio::spawn(fanout(self.live.clone(), events, id, context_id, f));
        Ok(Response::new(SendMessageResponse {
            payload: Some(send_message_response::Payload::Task(task)),
        }))
    }

    // A concrete two-item stream: no boxing, no channel, no task.
    type SendStreamingMessageStream =
        stream::Iter<std::array::IntoIter<Result<StreamResponse, Status>, 2>>;

    async fn send_streaming_message(
        &self,
        _request: Request<SendMessageRequest>,
    ) -> Result<Response<Self::SendStreamingMessageStream>, Status> {
        let [task, completed] = self.streamed.clone();
        Ok(Response::new(stream::iter([Ok(task), Ok(completed)])))
    }

    async fn get_task(&self, _request: Request<GetTaskRequest>) -> Result<Response<Task>, Status> {
        Ok(Response::new(self.task.clone()))
    }

    async fn list_tasks(
        &self,
        _request: Request<ListTasksRequest>,
    ) -> Result<Response<ListTasksResponse>, Status> {
        Err(Status::unimplemented("not in the bare server"))
    }

    async fn cancel_task(
        &self,
        _request: Request<CancelTaskRequest>,
    ) -> Result<Response<Task>, Status> {
        Err(Status::unimplemented("not in the bare server"))
    }

    type SubscribeToTaskStream = EventStream;

    async fn subscribe_to_task(
        &self,
        request: Request<SubscribeToTaskRequest>,
    ) -> Result<Response<EventStream>, Status> {
        let id = &request.get_ref().id;
        let (snapshot, events) = match self.live.lock().expect("live map").get(id) {
            Some(l) => (l.snapshot.clone(), l.events.subscribe()),
            None => return Err(Status::not_found(format!("no live task {id}"))),
        };
        Ok(Response::new(subscriber_stream(snapshot, events)))
    }

    async fn create_task_push_notification_config(
        &self,
        _request: Request<TaskPushNotificationConfig>,
    ) -> Result<Response<TaskPushNotificationConfig>, Status> {
        Err(Status::unimplemented("not in the bare server"))
    }

    async fn get_task_push_notification_config(
        &self,
        _request: Request<GetTaskPushNotificationConfigRequest>,
    ) -> Result<Response<TaskPushNotificationConfig>, Status> {
        Err(Status::unimplemented("not in the bare server"))
    }

    async fn list_task_push_notification_configs(
        &self,
        _request: Request<ListTaskPushNotificationConfigsRequest>,
    ) -> Result<Response<ListTaskPushNotificationConfigsResponse>, Status> {
        Err(Status::unimplemented("not in the bare server"))
    }

    async fn get_extended_agent_card(
        &self,
        _request: Request<GetExtendedAgentCardRequest>,
    ) -> Result<Response<AgentCard>, Status> {
        Err(Status::unimplemented("not in the bare server"))
    }

    async fn delete_task_push_notification_config(
        &self,
        _request: Request<DeleteTaskPushNotificationConfigRequest>,
    ) -> Result<Response<()>, Status> {
        Err(Status::unimplemented("not in the bare server"))
    }
}

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let cli = Cli::parse();
    let runtime = if cli.tuned {
        a2a_lifecycle::server::runtime()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
    };
    runtime.block_on(serve(cli))
}

async fn serve(cli: Cli) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let listener = TcpListener::bind(cli.listen).await?;
    let addr = listener.local_addr()?;
    // The benchmark reads the port from this line (`--listen 127.0.0.1:0`).
    eprintln!("a2a-bare listening addr={addr}");
    // The same message limits and the same kind of listener as the real
    // server (src/server.rs), so the transport is configured alike.
    let a2a = A2aServiceServer::new(Bare::new())
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let server = Server::builder().add_service(a2a);
    if cli.tuned {
        let incoming = incoming.map(|accepted| accepted.map(UnvectoredTcp));
        server
            .serve_with_incoming_shutdown(incoming, shutdown_signal())
            .await?;
    } else {
        server
            .serve_with_incoming_shutdown(incoming, shutdown_signal())
            .await?;
    }
    Ok(())
}
