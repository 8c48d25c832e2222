//! The binary's log lines (`--log-format text|json`) and span export over
//! OTLP (`--otlp-endpoint`): the subscriber behind the library's `tracing`
//! spans and events (`a2a_lifecycle::telemetry`).

use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};

/// How log lines are written (`--log-format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (colored on a terminal).
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `message`, the
    /// event's fields, `target`, and the spans it is in with their fields
    /// (`span`: the innermost, `spans`: all, outermost first).
    Json,
}

/// What [`init`] set up that must be flushed at exit.
#[must_use = "dropping it flushes and stops span export"]
pub struct Logging {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for Logging {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("spans not all exported: {e}");
        }
    }
}

/// What log lines show when `RUST_LOG` is not set, in text: `info`,
/// without the spans of calls and runs. Text lines would carry their
/// fields, and the text formatter writes a span's fields out as each is
/// recorded, for every call whether or not anything is logged in it:
/// measured with callgrind, 9% of the instructions of a GetTask and 15%
/// of a non-blocking SendMessage. `RUST_LOG=info` puts them back.
pub const DEFAULT_TEXT_FILTER: &str = "info,a2a_lifecycle::telemetry=warn";
/// The same in JSON: `info`, spans included (JSON lines are for log
/// pipelines, which want each line's task and trace).
pub const DEFAULT_JSON_FILTER: &str = "info";

/// Installs the process's log output (to stderr, filtered by `RUST_LOG`,
/// else [`DEFAULT_TEXT_FILTER`] or [`DEFAULT_JSON_FILTER`]) in `format`
/// and, given an OTLP endpoint
/// (`http://HOST:4317`, OTLP over gRPC), the export of the server's spans
/// to it, in batches, as service `a2a-lifecycle`. Call on the runtime the
/// server runs on: exports use it.
pub fn init(
    format: LogFormat,
    otlp_endpoint: Option<&str>,
) -> Result<Logging, Box<dyn std::error::Error>> {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let default = match format {
        LogFormat::Text => DEFAULT_TEXT_FILTER,
        LogFormat::Json => DEFAULT_JSON_FILTER,
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let lines = match format {
        LogFormat::Text => lines
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_filter(filter)
            .boxed(),
        LogFormat::Json => lines
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(true)
            .with_filter(filter)
            .boxed(),
    };
    let registry = tracing_subscriber::registry().with(lines);
    let Some(endpoint) = otlp_endpoint else {
        registry.try_init()?;
        return Ok(Logging { provider: None });
    };
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::WithExportConfig;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()?;
    let exporter = OnRuntime {
        inner: exporter,
        runtime: tokio::runtime::Handle::try_current()?,
    };
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name("a2a-lifecycle")
        .build();
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    // The server's own spans, whatever RUST_LOG says of log lines (the
    // text lines' filter leaves them out by default: exported, they are
    // not formatted).
    let spans = tracing_subscriber::filter::Targets::new()
        .with_target("a2a_lifecycle", tracing::Level::INFO);
    let layer = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("a2a-lifecycle"))
        .with_filter(spans);
    registry.with(layer).try_init()?;
    a2a_lifecycle::telemetry::spans_exported();
    Ok(Logging {
        provider: Some(provider),
    })
}

/// An exporter whose exports run with the server's tokio runtime: the
/// batch processor calls it from a thread of its own, where tonic's client
/// would find no runtime to do its I/O on (and would panic).
#[derive(Debug)]
struct OnRuntime<E> {
    inner: E,
    runtime: tokio::runtime::Handle,
}

impl<E: SpanExporter> SpanExporter for OnRuntime<E> {
    fn export(
        &self,
        batch: Vec<SpanData>,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        use futures_util::future::Either;
        // On a thread of a runtime already: awaited in place.
        if tokio::runtime::Handle::try_current().is_ok() {
            return Either::Left(self.inner.export(batch));
        }
        Either::Right(std::future::ready(
            self.runtime.block_on(self.inner.export(batch)),
        ))
    }

    fn shutdown_with_timeout(&self, timeout: std::time::Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}
