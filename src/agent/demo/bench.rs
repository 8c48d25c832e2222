//! `bench`: the agent the load generator (`a2a-bench`) drives.
//!
//! - text `fanout:K:WAIT_MS:INTERVAL_US` -> WORKING; waits WAIT_MS (time for
//!   subscribers to attach); then K updates, alternating a WORKING status
//!   update (odd) and an artifact chunk (even, appended to one `fanout`
//!   artifact), INTERVAL_US apart (0: unpaced); then COMPLETED.
//!   Every update carries its sequence number 1..=K (status message text,
//!   or the chunk's text), so a subscriber can check it saw every event in
//!   order.
//! - any other text -> COMPLETED at once with one small `result` artifact:
//!   the cheapest complete task, for request-rate workloads.

use std::time::Duration;

use async_trait::async_trait;

use crate::agent::{
    AgentError, AgentExecutor, EventSink, RequestContext, SinkError, basic_card, skill,
};
use crate::proto::{AgentCard, TaskState};

/// Largest K a `fanout` request may ask for.
pub const MAX_FANOUT_UPDATES: u32 = 100_000;
/// Longest WAIT_MS a `fanout` request may ask for.
pub const MAX_FANOUT_WAIT_MS: u64 = 60_000;

/// A parsed `fanout:K:WAIT_MS:INTERVAL_US` request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fanout {
    pub updates: u32,
    pub wait: Duration,
    pub interval: Duration,
}

impl Fanout {
    /// `None` for any other text; an error for a malformed `fanout:`.
    pub fn parse(text: &str) -> Option<Result<Fanout, String>> {
        let rest = text.trim().strip_prefix("fanout:")?;
        let fields: Vec<&str> = rest.split(':').collect();
        let [k, wait, interval] = fields[..] else {
            return Some(Err("expected fanout:K:WAIT_MS:INTERVAL_US".into()));
        };
        let parsed = (|| {
            let updates: u32 = k.parse().map_err(|_| format!("K {k:?} is not a count"))?;
            let wait: u64 = wait
                .parse()
                .map_err(|_| format!("WAIT_MS {wait:?} is not a number"))?;
            let interval: u64 = interval
                .parse()
                .map_err(|_| format!("INTERVAL_US {interval:?} is not a number"))?;
            if updates > MAX_FANOUT_UPDATES {
                return Err(format!("K is at most {MAX_FANOUT_UPDATES}"));
            }
            if wait > MAX_FANOUT_WAIT_MS {
                return Err(format!("WAIT_MS is at most {MAX_FANOUT_WAIT_MS}"));
            }
            Ok(Fanout {
                updates,
                wait: Duration::from_millis(wait),
                interval: Duration::from_micros(interval),
            })
        })();
        Some(parsed)
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Bench;

fn canceled(e: &SinkError) -> bool {
    matches!(e, SinkError::TaskClosed { .. })
}

impl Bench {
    async fn fanout(
        &self,
        ctx: &RequestContext,
        sink: &EventSink,
        f: Fanout,
    ) -> Result<(), SinkError> {
        sink.status(TaskState::Working, None).await?;
        tokio::select! {
            _ = tokio::time::sleep(f.wait) => {}
            _ = ctx.cancelled.cancelled() => return Ok(()),
        }
        for n in 1..=f.updates {
            if ctx.cancelled.is_cancelled() {
                return Ok(());
            }
            if n % 2 == 1 {
                sink.status(TaskState::Working, Some(&n.to_string()))
                    .await?;
            } else {
                sink.artifact_text("fanout", "fanout", &n.to_string(), n > 2, false)
                    .await?;
            }
            if !f.interval.is_zero() {
                tokio::time::sleep(f.interval).await;
            }
        }
        sink.status(TaskState::Completed, None).await
    }
}

#[async_trait]
impl AgentExecutor for Bench {
    async fn execute(&self, ctx: RequestContext, sink: EventSink) -> Result<(), AgentError> {
        let result = match Fanout::parse(&ctx.text()) {
            Some(Ok(f)) => self.fanout(&ctx, &sink, f).await,
            Some(Err(e)) => sink.status(TaskState::Rejected, Some(&e)).await,
            None => {
                async {
                    sink.artifact_text("result", "result", "ok", false, true)
                        .await?;
                    sink.status(TaskState::Completed, None).await
                }
                .await
            }
        };
        match result {
            Err(e) if canceled(&e) => Ok(()),
            other => Ok(other?),
        }
    }

    fn card(&self) -> AgentCard {
        let mut card = basic_card(
            "bench",
            "Load-generator target: completes at once, or fans out K updates.",
            vec![skill(
                "fanout",
                "Fan out updates",
                "`fanout:K:WAIT_MS:INTERVAL_US`: WORKING, wait, K numbered updates \
                 alternating status and artifact chunks, COMPLETED; any other text \
                 completes at once with one small artifact.",
                &["fanout:200:500:0", "go"],
            )],
        );
        // It reads only the text of a message ([`RequestContext::text`]):
        // other media types are refused before it runs
        // (CONTENT_TYPE_NOT_SUPPORTED).
        card.default_input_modes = vec![crate::content::TEXT_MEDIA_TYPE.into()];
        card
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fanout_requests() {
        assert_eq!(
            Fanout::parse("fanout:200:500:10"),
            Some(Ok(Fanout {
                updates: 200,
                wait: Duration::from_millis(500),
                interval: Duration::from_micros(10),
            }))
        );
        assert_eq!(Fanout::parse("go"), None);
        for bad in [
            "fanout:",
            "fanout:1:2",
            "fanout:x:1:1",
            "fanout:1:1:1:1",
            "fanout:200000:1:1",
        ] {
            assert!(matches!(Fanout::parse(bad), Some(Err(_))), "{bad}");
        }
    }
}
