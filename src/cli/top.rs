//! `a2a-lifecycle top`: the server's metrics (`GET /metrics`) as a
//! terminal view refreshed every interval, for someone on the machine
//! without a Prometheus: RPC rates, errors and latency by method, tasks by
//! state, runs and streams, store writes, push deliveries, authentication
//! failures. Rates and percentiles are over the last interval (the
//! difference between two scrapes), as Prometheus' `rate()` and
//! `histogram_quantile()` would give them.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use prometheus_parse::{Scrape, Value};
use tonic::transport::Channel;

/// One scrape, and when it was taken.
pub struct Sample {
    at: Instant,
    scrape: Scrape,
}

/// Where the metrics come from: a connection to the server (or to its
/// `--metrics-listen` address) and the credentials to send.
pub struct Source {
    pub channel: Channel,
    pub authorization: Option<http::HeaderValue>,
    pub server: String,
}

impl Source {
    /// Scrapes `/metrics` once.
    pub async fn sample(&mut self) -> Result<Sample, Box<dyn std::error::Error>> {
        use tower::ServiceExt;
        let mut request = http::Request::get("/metrics").body(tonic::body::Body::empty())?;
        if let Some(value) = &self.authorization {
            request
                .headers_mut()
                .insert(http::header::AUTHORIZATION, value.clone());
        }
        let response = self.channel.clone().oneshot(request).await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        let text = String::from_utf8_lossy(&body);
        if status == http::StatusCode::NOT_FOUND {
            return Err(format!(
                "{}/metrics is not served: the server runs with --no-metrics (restart it \
                 without that flag to count), or --server is not an a2a-lifecycle server",
                self.server
            )
            .into());
        }
        if status == http::StatusCode::UNAUTHORIZED {
            return Err(format!(
                "{}/metrics answered 401: this server runs with --auth; pass an admin's \
                 --token (or set A2A_TOKEN), or point --server at its --metrics-listen \
                 address, which needs none: {}",
                self.server,
                text.trim()
            )
            .into());
        }
        if !status.is_success() {
            return Err(
                format!("{}/metrics answered {status}: {}", self.server, text.trim()).into(),
            );
        }
        let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))?;
        Ok(Sample {
            at: Instant::now(),
            scrape,
        })
    }
}

/// Refreshes the view every `every` until interrupted; with `once`, prints
/// one view (over one interval) and returns.
pub async fn run(
    mut source: Source,
    every: Duration,
    once: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut last = source.sample().await?;
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
        let now = source.sample().await?;
        let view = render(&source.server, every, &last, &now);
        if once {
            print!("{view}");
            return Ok(());
        }
        // Home, clear, then the view: one write, so it does not flicker.
        print!("\x1b[H\x1b[2J{view}");
        last = now;
    }
}

/// The samples of `name` whose labels include `labels`.
fn samples<'a>(
    scrape: &'a Scrape,
    name: &'a str,
    labels: &'a [(&str, &str)],
) -> impl Iterator<Item = &'a prometheus_parse::Sample> + 'a {
    scrape
        .samples
        .iter()
        .filter(move |s| s.metric == name)
        .filter(move |s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
}

/// The sum of a counter's or gauge's matching samples.
fn total(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    samples(scrape, name, labels)
        .map(|s| match &s.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
            _ => 0.0,
        })
        .sum::<f64>()
        // An empty sum is -0.0, which would print as "-0".
        + 0.0
}

/// A histogram's cumulative buckets (upper bound, count), summed over the
/// matching label sets.
fn buckets(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> Vec<(f64, f64)> {
    let mut sum: Vec<(f64, f64)> = Vec::new();
    for sample in samples(scrape, name, labels) {
        if let Value::Histogram(counts) = &sample.value {
            for c in counts {
                match sum.iter_mut().find(|(le, _)| *le == c.less_than) {
                    Some((_, n)) => *n += c.count,
                    None => sum.push((c.less_than, c.count)),
                }
            }
        }
    }
    sum.sort_by(|a, b| a.0.total_cmp(&b.0));
    sum
}

/// The `q` quantile of what a histogram observed between two scrapes,
/// interpolated within its bucket as `histogram_quantile` does; `None`
/// when nothing was observed.
fn quantile(q: f64, before: &[(f64, f64)], after: &[(f64, f64)]) -> Option<f64> {
    let delta: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, n)| {
            let was = before
                .iter()
                .find(|(b, _)| b == le)
                .map_or(0.0, |(_, n)| *n);
            (*le, n - was)
        })
        .collect();
    let count = delta.last()?.1;
    if count <= 0.0 {
        return None;
    }
    let rank = q * count;
    let mut lower = (0.0, 0.0);
    for &(le, n) in &delta {
        if n >= rank {
            if le.is_infinite() {
                // Past the last bound: the last bound is all that is known.
                return Some(lower.0);
            }
            let within = n - lower.1;
            let share = if within > 0.0 {
                (rank - lower.1) / within
            } else {
                1.0
            };
            return Some(lower.0 + (le - lower.0) * share);
        }
        lower = (le, n);
    }
    Some(lower.0)
}

/// Seconds as milliseconds, or `-` for nothing observed.
fn ms(seconds: Option<f64>) -> String {
    seconds.map_or("-".to_owned(), |s| format!("{:.2}", s * 1000.0))
}

/// The label values a metric has in a scrape, in order of first sight.
fn label_values(scrape: &Scrape, name: &str, label: &str) -> Vec<String> {
    let mut values: Vec<String> = Vec::new();
    for sample in samples(scrape, name, &[]) {
        if let Some(v) = sample.labels.get(label)
            && !values.iter().any(|x| x == v)
        {
            values.push(v.to_owned());
        }
    }
    values
}

/// One view of the server over the interval between `before` and `after`.
pub fn render(server: &str, every: Duration, before: &Sample, after: &Sample) -> String {
    let secs = after.at.duration_since(before.at).as_secs_f64().max(1e-9);
    let (b, a) = (&before.scrape, &after.scrape);
    let rate = |name: &str, labels: &[(&str, &str)]| {
        (total(a, name, labels) - total(b, name, labels)) / secs
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "a2a-lifecycle top  {server}  every {}\n",
        humantime::format_duration(every)
    );

    let _ = writeln!(
        out,
        "{:<34} {:>9} {:>9} {:>9} {:>9}",
        "RPC", "calls/s", "errors/s", "p50 ms", "p99 ms"
    );
    let mut methods = label_values(a, "a2a_rpc_requests_total", "method");
    methods.sort();
    for method in &methods {
        let m = [("method", method.as_str())];
        let calls = rate("a2a_rpc_requests_total", &m);
        let ok = rate(
            "a2a_rpc_requests_total",
            &[("method", method.as_str()), ("code", "OK")],
        );
        let latency_before = buckets(b, "a2a_rpc_duration_seconds", &m);
        let latency_after = buckets(a, "a2a_rpc_duration_seconds", &m);
        let _ = writeln!(
            out,
            "{:<34} {:>9.1} {:>9.1} {:>9} {:>9}",
            method,
            calls,
            calls - ok,
            ms(quantile(0.5, &latency_before, &latency_after)),
            ms(quantile(0.99, &latency_before, &latency_after)),
        );
    }
    if methods.is_empty() {
        let _ = writeln!(out, "(no calls yet)");
    }

    let _ = write!(out, "\nTasks in the store    ");
    for state in ["SUBMITTED", "WORKING", "INPUT_REQUIRED", "AUTH_REQUIRED"] {
        let name = format!("TASK_STATE_{state}");
        let n = total(a, "a2a_tasks", &[("state", name.as_str())]);
        let _ = write!(out, "  {state} {n}");
    }
    let _ = write!(
        out,
        "\nTasks per second       created {:.1}",
        rate("a2a_tasks_created_total", &[])
    );
    for state in ["COMPLETED", "FAILED", "CANCELED", "REJECTED"] {
        let name = format!("TASK_STATE_{state}");
        let per_second = rate("a2a_task_states_total", &[("state", name.as_str())]);
        let _ = write!(out, "  {} {per_second:.1}", state.to_lowercase());
    }
    let _ = writeln!(
        out,
        "\nRuns active {}   streams open: send {}  subscribe {}   resyncs/s {:.1}",
        total(a, "a2a_runs_active", &[]),
        total(a, "a2a_streams_open", &[("kind", "send")]),
        total(a, "a2a_streams_open", &[("kind", "subscribe")]),
        rate("a2a_stream_resyncs_total", &[]),
    );

    for backend in label_values(a, "a2a_store_write_seconds", "backend") {
        let l = [("backend", backend.as_str())];
        let before_w = buckets(b, "a2a_store_write_seconds", &l);
        let after_w = buckets(a, "a2a_store_write_seconds", &l);
        let writes =
            (after_w.last().map_or(0.0, |x| x.1) - before_w.last().map_or(0.0, |x| x.1)) / secs;
        let _ = write!(
            out,
            "Store {backend:<8}  writes/s {writes:.1}  p50 {} ms  p99 {} ms  failures/s {:.1}",
            ms(quantile(0.5, &before_w, &after_w)),
            ms(quantile(0.99, &before_w, &after_w)),
            rate("a2a_store_write_failures_total", &l),
        );
        if samples(a, "a2a_store_queue_depth", &l).next().is_some() {
            let _ = write!(out, "  queue {}", total(a, "a2a_store_queue_depth", &l));
        }
        let _ = writeln!(out);
    }

    let _ = write!(out, "Push          ");
    for outcome in ["delivered", "refused", "given_up", "dropped"] {
        let per_second = rate("a2a_push_deliveries_total", &[("outcome", outcome)]);
        let _ = write!(out, " {outcome}/s {per_second:.1}");
    }
    let _ = writeln!(
        out,
        "  retries/s {:.1}  pending {}",
        rate("a2a_push_retries_total", &[]),
        total(a, "a2a_push_outbox_pending", &[]),
    );
    let _ = writeln!(
        out,
        "Auth failures/s {:.1}",
        rate("a2a_auth_failures_total", &[])
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at: Instant, text: &str) -> Sample {
        Sample {
            at,
            scrape: Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).unwrap(),
        }
    }

    /// Rates are the counters' increase over the interval between scrapes.
    #[test]
    fn rates_are_over_the_interval() {
        let at = Instant::now();
        let before = sample(
            at,
            "a2a_rpc_requests_total{method=\"GetTask\",code=\"OK\"} 10\n\
             a2a_rpc_requests_total{method=\"GetTask\",code=\"NOT_FOUND\"} 1\n\
             a2a_tasks{state=\"TASK_STATE_WORKING\"} 2\n",
        );
        let after = sample(
            at + Duration::from_secs(2),
            "a2a_rpc_requests_total{method=\"GetTask\",code=\"OK\"} 30\n\
             a2a_rpc_requests_total{method=\"GetTask\",code=\"NOT_FOUND\"} 5\n\
             a2a_tasks{state=\"TASK_STATE_WORKING\"} 7\n",
        );
        let view = render("http://s", Duration::from_secs(2), &before, &after);
        let row = view
            .lines()
            .find(|l| l.starts_with("GetTask"))
            .expect("a GetTask row");
        let columns: Vec<&str> = row.split_whitespace().collect();
        // (30 + 5 - 10 - 1) / 2 calls, (5 - 1) / 2 errors, no latency.
        assert_eq!(columns, ["GetTask", "12.0", "2.0", "-", "-"], "{view}");
        assert!(view.contains("WORKING 7"), "{view}");
        assert!(view.contains("send 0 "), "no -0: {view}");
    }

    #[test]
    fn quantiles_interpolate_within_the_interval_buckets() {
        // Before: 10 observations under 1. After: 100 more, 50 under 1,
        // 50 between 1 and 2.
        let before = [(1.0, 10.0), (2.0, 10.0), (f64::INFINITY, 10.0)];
        let after = [(1.0, 60.0), (2.0, 110.0), (f64::INFINITY, 110.0)];
        assert_eq!(quantile(0.5, &before, &after), Some(1.0));
        assert_eq!(quantile(0.25, &before, &after), Some(0.5));
        assert_eq!(quantile(0.99, &before, &after), Some(1.98));
        assert_eq!(quantile(0.5, &after, &after), None, "nothing observed");
        // Past the last finite bound: that bound.
        let past = [(1.0, 0.0), (f64::INFINITY, 4.0)];
        assert_eq!(quantile(0.5, &[], &past), Some(1.0));
    }
}
