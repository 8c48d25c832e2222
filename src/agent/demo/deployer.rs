//! `deployer`: in-task authorization (spec §7.6).
//!
//! - text naming `staging` or `prod` -> AUTH_REQUIRED with a status message
//!   saying approval is needed; after [`Deployer::approval_delay`] (200 ms)
//!   the approval arrives out of band and the task resumes by itself, with
//!   no client message (spec §7.6.1) -> WORKING -> COMPLETED;
//! - any other target -> REJECTED straight from SUBMITTED.

use std::time::Duration;

use async_trait::async_trait;

use crate::agent::{
    AgentError, AgentExecutor, EventSink, RequestContext, SinkError, basic_card, skill,
};
use crate::proto::{AgentCard, TaskState};

pub const DEPLOYMENT_ARTIFACT: &str = "deployment";

#[derive(Debug, Clone)]
pub struct Deployer {
    pub approval_delay: Duration,
}

impl Default for Deployer {
    fn default() -> Self {
        Deployer {
            approval_delay: Duration::from_millis(200),
        }
    }
}

fn target(text: &str) -> Option<&'static str> {
    if text.contains("staging") {
        Some("staging")
    } else if text.contains("prod") {
        Some("prod")
    } else {
        None
    }
}

#[async_trait]
impl AgentExecutor for Deployer {
    fn card(&self) -> AgentCard {
        let mut card = basic_card(
            "deployer",
            "Deploys to staging or prod after an out-of-band approval (AUTH_REQUIRED).",
            vec![skill(
                "deploy",
                "Deploy a build",
                "Deploys to `staging` or `prod` once approved; other targets are rejected.",
                &["deploy to staging", "deploy to prod"],
            )],
        );
        // It reads only the text of a message ([`RequestContext::text`]):
        // other media types are refused before it runs
        // (CONTENT_TYPE_NOT_SUPPORTED).
        card.default_input_modes = vec![crate::content::TEXT_MEDIA_TYPE.into()];
        card
    }

    async fn execute(&self, ctx: RequestContext, sink: EventSink) -> Result<(), AgentError> {
        let Some(target) = target(&ctx.text()) else {
            sink.status(
                TaskState::Rejected,
                Some("Rejected: the deployer only deploys to staging or prod."),
            )
            .await?;
            return Ok(());
        };
        sink.status(
            TaskState::AuthRequired,
            Some(&format!("Approval needed to deploy to {target}.")),
        )
        .await?;
        tokio::select! {
            _ = tokio::time::sleep(self.approval_delay) => {}
            _ = ctx.cancelled.cancelled() => return Ok(()),
        }
        let result: Result<(), SinkError> = async {
            sink.status(
                TaskState::Working,
                Some(&format!("Approved; deploying to {target}.")),
            )
            .await?;
            sink.artifact_text(
                DEPLOYMENT_ARTIFACT,
                "deployment",
                &format!("deployed build to {target}\n"),
                false,
                true,
            )
            .await?;
            sink.status(
                TaskState::Completed,
                Some(&format!("Deployed to {target}.")),
            )
            .await
        }
        .await;
        match result {
            Err(SinkError::TaskClosed { .. }) => Ok(()),
            other => Ok(other?),
        }
    }
}
