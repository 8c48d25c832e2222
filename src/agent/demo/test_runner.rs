//! `test-runner`: runs "tests" and streams a report.
//!
//! - `ping` (the whole text) -> a direct agent Message `pong`, no task.
//! - text containing `fail` -> WORKING -> FAILED with a status message.
//! - text containing `slow` -> WORKING, a progress status update every
//!   [`TestRunner::progress_every`] (100 ms), COMPLETED only after
//!   [`TestRunner::slow_duration`] (60 s) unless canceled.
//! - any other text -> WORKING -> a `test-report` artifact in two chunks
//!   (the second with `append` and `last_chunk`) -> COMPLETED.

use std::time::Duration;

use async_trait::async_trait;

use crate::agent::{
    AgentError, AgentExecutor, EventSink, RequestContext, SinkError, basic_card, skill,
};
use crate::proto::{AgentCard, TaskState};

pub const REPORT_ARTIFACT: &str = "test-report";

#[derive(Debug, Clone)]
pub struct TestRunner {
    pub progress_every: Duration,
    pub slow_duration: Duration,
}

impl Default for TestRunner {
    fn default() -> Self {
        TestRunner {
            progress_every: Duration::from_millis(100),
            slow_duration: Duration::from_secs(60),
        }
    }
}

/// A sink error because the task was canceled meanwhile: the run simply
/// stops.
fn canceled(e: &SinkError) -> bool {
    matches!(e, SinkError::TaskClosed { .. })
}

impl TestRunner {
    async fn run(&self, ctx: &RequestContext, sink: &EventSink) -> Result<(), SinkError> {
        let text = ctx.text();
        sink.status(TaskState::Working, Some("Running the test suite."))
            .await?;
        if text.contains("fail") {
            return sink
                .status(
                    TaskState::Failed,
                    Some("2 of 12 tests failed: test_login, test_logout."),
                )
                .await;
        }
        if text.contains("slow") {
            let steps =
                (self.slow_duration.as_millis() / self.progress_every.as_millis().max(1)) as u64;
            let mut ticks = tokio::time::interval(self.progress_every);
            ticks.tick().await; // the first tick is immediate
            for step in 1..=steps {
                tokio::select! {
                    _ = ticks.tick() => {}
                    _ = ctx.cancelled.cancelled() => return Ok(()),
                }
                sink.status(
                    TaskState::Working,
                    Some(&format!("Progress: step {step} of {steps}.")),
                )
                .await?;
            }
        }
        sink.artifact_text(
            REPORT_ARTIFACT,
            "test-report",
            "collected 12 tests\n",
            false,
            false,
        )
        .await?;
        sink.artifact_text(
            REPORT_ARTIFACT,
            "test-report",
            "12 passed, 0 failed\n",
            true,
            true,
        )
        .await?;
        sink.status(TaskState::Completed, Some("All 12 tests passed."))
            .await
    }
}

#[async_trait]
impl AgentExecutor for TestRunner {
    fn card(&self) -> AgentCard {
        let mut card = basic_card(
            "test-runner",
            "Runs the test suite and streams a report; `ping` answers `pong` directly.",
            vec![
                skill(
                    "run-tests",
                    "Run the tests",
                    "Runs the suite and returns a `test-report` artifact in two chunks; \
                     `fail` fails the run, `slow` runs for a minute with progress updates.",
                    &["run the unit tests", "run the slow tests", "make it fail"],
                ),
                skill(
                    "ping",
                    "Ping",
                    "Answers `ping` with a direct `pong` message, no task.",
                    &["ping"],
                ),
            ],
        );
        // It reads only the text of a message ([`RequestContext::text`]):
        // other media types are refused before it runs
        // (CONTENT_TYPE_NOT_SUPPORTED).
        card.default_input_modes = vec![crate::content::TEXT_MEDIA_TYPE.into()];
        card
    }

    async fn execute(&self, ctx: RequestContext, sink: EventSink) -> Result<(), AgentError> {
        if ctx.task.is_none() && ctx.text().trim() == "ping" {
            sink.reply_text("pong").await?;
            return Ok(());
        }
        match self.run(&ctx, &sink).await {
            Err(e) if canceled(&e) => Ok(()),
            other => Ok(other?),
        }
    }
}
