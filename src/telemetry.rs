//! Traces: the W3C trace context a call arrives with (`traceparent`,
//! W3C Trace Context §3.2), a span per RPC that it is the parent of, and
//! the trace a run carries on to its task's webhooks.
//!
//! Every call, whatever its binding, runs in an `rpc` span (fields:
//! `method`, `binding`, and as the
//! handler learns them `tenant`, `task_id`, `context_id`, `agent`; with a
//! `traceparent`, `trace_id` and `parent_id`); every agent run in a `run`
//! span, a child of the RPC span that started it (`tenant`, `task_id`,
//! `context_id`, `agent`, `trace_id`). Log lines inside them carry those
//! fields (`--log-format json` writes them as JSON).
//!
//! With the `otel` feature and an OpenTelemetry layer installed (the
//! binary's `--otlp-endpoint`; [`spans_exported`]), the spans are
//! OpenTelemetry spans too: the RPC span's parent is the caller's span,
//! and the trace id and span ids are OpenTelemetry's. Without one nothing
//! of OpenTelemetry runs.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};

use tracing::Span;
use tracing::instrument::{Instrument, Instrumented};

/// The gRPC metadata key and HTTP header of the W3C trace context.
pub const TRACEPARENT: &str = "traceparent";

/// Whether spans are exported ([`init`] installed an exporter): only then
/// is OpenTelemetry's context looked at.
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// A W3C `traceparent`: the trace, the caller's span in it, and the
/// trace flags (bit 0: sampled).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub parent_id: [u8; 8],
    pub flags: u8,
}

impl TraceParent {
    /// Parses a `traceparent` header value (W3C Trace Context §3.2.2):
    /// `00-<32 hex>-<16 hex>-<2 hex>`, lowercase, neither id all zeros. A
    /// later version is read by its first four fields, as §3.2.4 asks;
    /// version `ff` is invalid. Anything else is `None` (a new trace).
    pub fn parse(value: &str) -> Option<Self> {
        let bytes = value.as_bytes();
        if bytes.len() < 55 {
            return None;
        }
        let version = hex::<1>(&value[0..2])?[0];
        let exact = bytes.len() == 55;
        // Version 00 is exactly 55 characters; a later one may add fields
        // after a dash.
        if version == 0xff || (version == 0 && !exact) || (!exact && bytes[55] != b'-') {
            return None;
        }
        if bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
            return None;
        }
        let trace_id = hex::<16>(&value[3..35])?;
        let parent_id = hex::<8>(&value[36..52])?;
        let flags = hex::<1>(&value[53..55])?[0];
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        Some(TraceParent {
            trace_id,
            parent_id,
            flags,
        })
    }

    /// The same trace, with a new span of this process as the parent.
    pub fn child(&self) -> Self {
        let mut parent_id = [0; 8];
        while parent_id == [0; 8] {
            parent_id = fastrand::u64(..).to_be_bytes();
        }
        TraceParent { parent_id, ..*self }
    }

    /// The trace id, as 32 lowercase hex digits.
    pub fn trace(&self) -> Hex<'_> {
        Hex(&self.trace_id)
    }

    /// The parent span's id, as 16 lowercase hex digits.
    pub fn parent(&self) -> Hex<'_> {
        Hex(&self.parent_id)
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{}-{}-{:02x}",
            self.trace(),
            self.parent(),
            self.flags
        )
    }
}

/// Bytes shown as lowercase hex.
pub struct Hex<'a>(&'a [u8]);

impl fmt::Display for Hex<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// `N` bytes from `2N` lowercase hex digits.
fn hex<const N: usize>(digits: &str) -> Option<[u8; N]> {
    let digits = digits.as_bytes();
    if digits.len() != 2 * N {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = (nibble(digits[2 * i])? << 4) | nibble(digits[2 * i + 1])?;
    }
    Some(out)
}

/// Runs every gRPC call in its `rpc` span, the caller's `traceparent`
/// its parent; the parsed [`TraceParent`] goes into the request's
/// extensions for the handler. Other HTTP requests (cards, metrics,
/// probes) run without one.
#[derive(Clone)]
pub struct Traced<S> {
    inner: S,
}

impl<S> Traced<S> {
    pub fn new(inner: S) -> Self {
        Traced { inner }
    }
}

impl<S, B> tower::Service<http::Request<B>> for Traced<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Instrumented<S::Future>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        if !crate::metrics::is_grpc(request.headers()) {
            return self.inner.call(request).instrument(Span::none());
        }
        // A name made once: looking one up by text parses and checks it.
        const TRACEPARENT_HEADER: http::HeaderName = http::HeaderName::from_static(TRACEPARENT);
        let parent = request
            .headers()
            .get(TRACEPARENT_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(TraceParent::parse);
        let path = request.uri().path();
        // The method is looked up only when the span is enabled: with the
        // default text lines not at all.
        let span = rpc_span(
            || crate::metrics::method_label(path),
            "grpc",
            parent.as_ref(),
        );
        if let Some(parent) = parent {
            request.extensions_mut().insert(parent);
        }
        let answer = span.in_scope(|| self.inner.call(request));
        answer.instrument(span)
    }
}

/// The `rpc` span of one call of `method` over `binding`, the caller's
/// `traceparent` its parent. Field values are worked out only when the
/// span is enabled.
pub fn rpc_span(
    method: impl Fn() -> &'static str,
    binding: &'static str,
    parent: Option<&TraceParent>,
) -> Span {
    let span = tracing::info_span!(
        "rpc",
        method = method(),
        binding,
        tenant = tracing::field::Empty,
        task_id = tracing::field::Empty,
        context_id = tracing::field::Empty,
        agent = tracing::field::Empty,
        trace_id = parent.map(|p| tracing::field::display(p.trace())),
        parent_id = parent.map(|p| tracing::field::display(p.parent())),
        otel.name = tracing::field::Empty,
        otel.kind = tracing::field::Empty,
    );
    if EXPORTING.load(Ordering::Relaxed) {
        otel::adopt(&span, parent, method());
    }
    span
}

/// Records what the handler learned of the call in its `rpc` span (empty
/// values are left out).
pub fn record_call(tenant: &str, task_id: &str, context_id: &str) {
    let span = Span::current();
    if span.is_disabled() {
        return;
    }
    for (field, value) in [
        ("tenant", tenant),
        ("task_id", task_id),
        ("context_id", context_id),
    ] {
        // Recorded before the request is validated: a caller's
        // megabyte-long tenant would be every log line of the call.
        if !value.is_empty() {
            span.record(
                field,
                &*crate::error::cut(value, crate::error::MAX_ECHO_BYTES),
            );
        }
    }
}

/// Records the agent that serves the call in its `rpc` span.
pub fn record_agent(agent: &str) {
    Span::current().record("agent", agent);
}

/// The trace a run continues, taken where the run was asked for: the
/// span it is a child of, and the caller's trace context.
#[derive(Clone, Debug, Default)]
pub struct RunTrace {
    pub span: Option<Span>,
    pub parent: Option<TraceParent>,
}

impl RunTrace {
    /// The current span (a request's `rpc` span), with `parent`.
    pub fn here(parent: Option<TraceParent>) -> Self {
        let span = Span::current();
        RunTrace {
            span: (!span.is_disabled()).then_some(span),
            parent,
        }
    }

    /// The `run` span, the child of the one the run was asked in, and the
    /// `traceparent` that the run's webhooks carry: OpenTelemetry's span
    /// when exporting, else the caller's trace with a new span id; none
    /// without either.
    pub fn start(
        &self,
        tenant: &str,
        task_id: &str,
        context_id: &str,
        agent: &str,
    ) -> (Span, Option<TraceParent>) {
        let span = tracing::info_span!(
            parent: self.span.as_ref().and_then(Span::id),
            "run",
            tenant,
            task_id,
            context_id,
            agent,
            trace_id = self.parent.as_ref().map(|p| tracing::field::display(p.trace())),
        );
        let exported = if EXPORTING.load(Ordering::Relaxed) {
            otel::context_of(&span)
        } else {
            None
        };
        let carried = exported.or_else(|| self.parent.as_ref().map(TraceParent::child));
        (span, carried)
    }
}

#[cfg(feature = "otel")]
mod otel {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    use super::TraceParent;

    /// Names the RPC span as OpenTelemetry shows it, a server span, with
    /// the caller's span as its parent.
    pub fn adopt(span: &tracing::Span, parent: Option<&TraceParent>, method: &'static str) {
        span.record("otel.name", method);
        span.record("otel.kind", "server");
        if let Some(parent) = parent {
            let remote = SpanContext::new(
                TraceId::from_bytes(parent.trace_id),
                SpanId::from_bytes(parent.parent_id),
                TraceFlags::new(parent.flags),
                true,
                TraceState::default(),
            );
            let cx = opentelemetry::Context::new().with_remote_span_context(remote);
            let _ = span.set_parent(cx);
        }
    }

    /// The span's OpenTelemetry context, as a `traceparent`.
    pub fn context_of(span: &tracing::Span) -> Option<TraceParent> {
        let cx = span.context();
        let otel = cx.span();
        let sc = otel.span_context();
        sc.is_valid().then(|| TraceParent {
            trace_id: sc.trace_id().to_bytes(),
            parent_id: sc.span_id().to_bytes(),
            flags: sc.trace_flags().to_u8(),
        })
    }
}

#[cfg(not(feature = "otel"))]
mod otel {
    use super::TraceParent;

    pub fn adopt(_: &tracing::Span, _: Option<&TraceParent>, _: &'static str) {}

    pub fn context_of(_: &tracing::Span) -> Option<TraceParent> {
        None
    }
}

/// Says that an OpenTelemetry layer (`tracing-opentelemetry`) is
/// installed: from now on the RPC span's parent is the caller's span in
/// OpenTelemetry's terms, and a run's webhooks carry OpenTelemetry's ids.
/// The binary calls it for `--otlp-endpoint`; an application installing
/// its own layer calls it too. Until then nothing of OpenTelemetry runs.
pub fn spans_exported() {
    EXPORTING.store(true, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    /// W3C Trace Context §3.2.2's example round-trips.
    #[test]
    fn the_spec_example_parses_and_prints_back() {
        let parsed = TraceParent::parse(EXAMPLE).unwrap();
        assert_eq!(parsed.flags, 1);
        assert_eq!(
            parsed.trace().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(parsed.parent().to_string(), "00f067aa0ba902b7");
        assert_eq!(parsed.to_string(), EXAMPLE);
    }

    #[test]
    fn invalid_values_start_a_new_trace() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
    }

    /// §3.2.4: a later version is read by the fields version 00 has.
    #[test]
    fn a_later_version_is_read_by_its_first_fields() {
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes";
        let parsed = TraceParent::parse(later).unwrap();
        assert_eq!(parsed, TraceParent::parse(EXAMPLE).unwrap());
    }

    #[test]
    fn a_child_keeps_the_trace_and_flags_with_a_new_span() {
        let parent = TraceParent::parse(EXAMPLE).unwrap();
        let child = parent.child();
        assert_eq!(child.trace_id, parent.trace_id);
        assert_eq!(child.flags, parent.flags);
        assert_ne!(child.parent_id, parent.parent_id);
        assert_ne!(child.parent_id, [0; 8]);
    }
}
