//! `code-reviewer`: a multi-turn agent (spec §3.4.3).
//!
//! - a new task -> INPUT_REQUIRED, with an agent status message asking for
//!   the diff;
//! - a follow-up message on that task -> WORKING -> a `review` artifact ->
//!   COMPLETED.

use async_trait::async_trait;

use crate::agent::{AgentError, AgentExecutor, EventSink, RequestContext, basic_card, skill};
use crate::proto::{AgentCard, TaskState};

pub const REVIEW_ARTIFACT: &str = "review";
pub const ASK_FOR_DIFF: &str = "Please send the diff to review.";

#[derive(Debug, Clone, Copy, Default)]
pub struct CodeReviewer;

#[async_trait]
impl AgentExecutor for CodeReviewer {
    fn card(&self) -> AgentCard {
        let mut card = basic_card(
            "code-reviewer",
            "Reviews a diff: asks for it first (INPUT_REQUIRED), then returns a review.",
            vec![skill(
                "review",
                "Review a diff",
                "Asks for the diff, then answers with a `review` artifact.",
                &["review my change", "please review this diff"],
            )],
        );
        // It reads the text of a message ([`RequestContext::text`]): a
        // request in plain text, then the diff, which a client may label as
        // one (`git diff` is `text/x-diff`, `git format-patch` `text/x-patch`).
        card.default_input_modes = vec![crate::content::TEXT_MEDIA_TYPE.into()];
        card.skills[0].input_modes = ["text/plain", "text/x-diff", "text/x-patch"]
            .map(String::from)
            .into();
        card
    }

    async fn execute(&self, ctx: RequestContext, sink: EventSink) -> Result<(), AgentError> {
        if ctx.task.is_none() {
            sink.status(TaskState::InputRequired, Some(ASK_FOR_DIFF))
                .await?;
            return Ok(());
        }
        let diff = ctx.text();
        sink.status(TaskState::Working, Some("Reviewing the diff."))
            .await?;
        let review = format!(
            "Reviewed {} line(s): no blocking issues found.\n",
            diff.lines().count()
        );
        sink.artifact_text(REVIEW_ARTIFACT, "review", &review, false, true)
            .await?;
        sink.status(TaskState::Completed, Some("Review complete."))
            .await?;
        Ok(())
    }
}
