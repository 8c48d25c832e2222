//! Traces and logs of the `a2a-lifecycle` binary: a W3C `traceparent`
//! sent with a call reaches the JSON log lines of the agent run it starts
//! (`--log-format json`), and with `--otlp-endpoint` the RPC and run spans
//! reach an OTLP collector (a real gRPC one, in the test) as children of
//! the caller's span.

use crate::support;

use a2a_lifecycle::proto::a2a_service_client::A2aServiceClient;
use a2a_lifecycle::proto::{SendMessageRequest, TaskState, send_message_response};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::trace::v1::Span;
use tokio::sync::mpsc;

use support::*;

/// W3C Trace Context §3.2.2's example.
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";

/// A blocking send to the bench agent, with `traceparent` when given; the
/// task it completed.
async fn traced_send(url: &str, traceparent: Option<&str>) -> a2a_lifecycle::proto::Task {
    let mut client = within("connect", A2aServiceClient::connect(url.to_owned()))
        .await
        .unwrap();
    let mut call: tonic::Request<SendMessageRequest> =
        tonic::Request::new(request("bench", user_message("go"), false));
    if let Some(value) = traceparent {
        call.metadata_mut()
            .insert("traceparent", value.parse().unwrap());
    }
    let answer = within("send", client.send_message(call))
        .await
        .unwrap()
        .into_inner();
    let Some(send_message_response::Payload::Task(task)) = answer.payload else {
        panic!("not a task: {answer:?}")
    };
    assert_eq!(state_of(&task), TaskState::Completed);
    task
}

/// The span named `name` in a JSON log line: in its span list, or the
/// line's own span (an event given its span explicitly lists only the
/// spans above it).
fn span_named<'a>(line: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    line["spans"]
        .as_array()
        .expect("a span list")
        .iter()
        .chain(std::iter::once(&line["span"]))
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no {name} span in {line}"))
}

#[test]
fn a_traceparent_reaches_the_runs_json_log_lines() {
    let (server, url, lines) = spawn_serve_logging(
        "info,a2a_lifecycle::runtime=debug",
        &["--store", "memory", "--log-format", "json"],
    );
    let _server = KillOnDrop(server);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let task = runtime.block_on(traced_send(&url, Some(TRACEPARENT)));

    for message in ["agent run started", "agent run ended"] {
        // Lines of other runs (none here) would not have this task's id.
        let line = wait_for_line(&lines, &format!("\"message\":\"{message}\""));
        let line: serde_json::Value = serde_json::from_str(&line).expect("a JSON line");
        assert_eq!(line["level"], "DEBUG", "{line}");
        assert!(line["timestamp"].as_str().is_some_and(|t| t.contains('T')));
        let rpc = span_named(&line, "rpc");
        assert_eq!(rpc["method"], "SendMessage", "{line}");
        assert_eq!(rpc["trace_id"], TRACE_ID, "{line}");
        assert_eq!(rpc["parent_id"], PARENT_ID, "{line}");
        assert_eq!(rpc["tenant"], "bench", "{line}");
        assert_eq!(rpc["agent"], "bench", "{line}");
        assert_eq!(
            rpc["task_id"],
            task.id.as_str(),
            "learned from the run: {line}"
        );
        let run = span_named(&line, "run");
        assert_eq!(run["task_id"], task.id.as_str(), "{line}");
        assert_eq!(run["context_id"], task.context_id.as_str(), "{line}");
        assert_eq!(run["tenant"], "bench", "{line}");
        assert_eq!(run["agent"], "bench", "{line}");
        assert_eq!(run["trace_id"], TRACE_ID, "{line}");
        assert_eq!(line["span"]["name"], "run", "the innermost span: {line}");
    }
}

/// An OTLP/gRPC collector: every span exported to it goes to the channel.
struct Collector(mpsc::UnboundedSender<Span>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        for resource in request.into_inner().resource_spans {
            for scope in resource.scope_spans {
                for span in scope.spans {
                    let _ = self.0.send(span);
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_are_exported_over_otlp_as_children_of_the_callers_span() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let collector = listener.local_addr().unwrap();
    let (tx, mut spans) = mpsc::unbounded_channel();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(Collector(tx)))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let endpoint = format!("http://{collector}");
    // Exported every 50 ms instead of every 5 s (the SDK's setting).
    let (server, url, _lines) = spawn_serve_env(
        &[("OTEL_BSP_SCHEDULE_DELAY", "50")],
        &["--store", "memory", "--otlp-endpoint", &endpoint],
    );
    let _server = KillOnDrop(server);
    let task = traced_send(&url, Some(TRACEPARENT)).await;

    // The RPC span and the run span, in whatever order they arrive.
    let (mut rpc, mut run) = (None, None);
    while rpc.is_none() || run.is_none() {
        let span = within("an exported span", spans.recv()).await.unwrap();
        match span.name.as_str() {
            "SendMessage" => rpc = Some(span),
            "run" => run = Some(span),
            _ => {}
        }
    }
    let (rpc, run) = (rpc.unwrap(), run.unwrap());
    assert_eq!(hex(&rpc.trace_id), TRACE_ID);
    assert_eq!(hex(&rpc.parent_span_id), PARENT_ID, "the caller's span");
    assert_eq!(rpc.kind, 2, "SPAN_KIND_SERVER");
    assert_eq!(hex(&run.trace_id), TRACE_ID);
    assert_eq!(
        run.parent_span_id, rpc.span_id,
        "the run continues the call"
    );
    let task_id = run
        .attributes
        .iter()
        .find(|a| a.key == "task_id")
        .and_then(|a| a.value.as_ref())
        .map(|v| format!("{:?}", v.value));
    assert!(
        task_id.as_deref().is_some_and(|v| v.contains(&task.id)),
        "{task_id:?}"
    );

    // Without a traceparent the call starts a trace of its own.
    traced_send(&url, None).await;
    let root = loop {
        let span = within("an exported span", spans.recv()).await.unwrap();
        if span.name == "SendMessage" {
            break span;
        }
    };
    assert!(root.parent_span_id.is_empty(), "a root span");
    assert_ne!(hex(&root.trace_id), TRACE_ID);
}
