//! Demo agents from the planner scenario, one per tenant, and the
//! conformance agent for the official A2A TCK.
//!
//! | tenant | agent |
//! | --- | --- |
//! | `""` (none) | the default agent: test-runner, or the one `serve --default-agent` names |
//! | `test-runner` | [`TestRunner`] |
//! | `code-reviewer` | [`CodeReviewer`] |
//! | `deployer` | [`Deployer`] |
//! | `conformance` | [`Conformance`] |
//! | `bench` | [`Bench`], for the load generator |
//!
//! They are deterministic and fast so that every lifecycle flow (blocking,
//! polling, streaming, input-required, auth-required, rejected, failed,
//! canceled, direct reply) can be driven and tested against a real server.

mod bench;
mod code_reviewer;
mod conformance;
mod deployer;
mod test_runner;

use std::sync::Arc;

pub use bench::{Bench, Fanout};
pub use code_reviewer::CodeReviewer;
pub use conformance::Conformance;
pub use deployer::Deployer;
pub use test_runner::TestRunner;

use super::{AgentExecutor, AgentRouter};

/// Which demo agent serves requests without a tenant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DefaultAgent {
    #[default]
    TestRunner,
    /// For the A2A TCK, which never sets `tenant`.
    Conformance,
    /// For the load generator `a2a-bench`.
    Bench,
}

impl DefaultAgent {
    /// Every choice, by the name `serve --default-agent` takes.
    pub const NAMES: [&'static str; 3] = ["test-runner", "conformance", "bench"];

    pub fn name(self) -> &'static str {
        match self {
            DefaultAgent::TestRunner => "test-runner",
            DefaultAgent::Conformance => "conformance",
            DefaultAgent::Bench => "bench",
        }
    }
}

impl std::str::FromStr for DefaultAgent {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        [
            DefaultAgent::TestRunner,
            DefaultAgent::Conformance,
            DefaultAgent::Bench,
        ]
        .into_iter()
        .find(|agent| agent.name() == name)
        .ok_or_else(|| format!("{name:?} is none of {:?}", DefaultAgent::NAMES))
    }
}

/// The router `serve` uses by default: every demo agent, test-runner as
/// the default agent.
pub fn demo_router() -> AgentRouter {
    demo_router_with(Deployer::default(), DefaultAgent::TestRunner)
}

/// The demo router with a tuned deployer (its approval delay) and a chosen
/// default agent.
pub fn demo_router_with(deployer: Deployer, default: DefaultAgent) -> AgentRouter {
    let test_runner = Arc::new(TestRunner::default());
    let conformance = Arc::new(Conformance);
    let default_agent: Arc<dyn AgentExecutor> = match default {
        DefaultAgent::TestRunner => test_runner.clone(),
        DefaultAgent::Conformance => conformance.clone(),
        DefaultAgent::Bench => Arc::new(Bench),
    };
    AgentRouter::new()
        .with("", default_agent)
        .with("test-runner", test_runner)
        .with("code-reviewer", Arc::new(CodeReviewer))
        .with("deployer", Arc::new(deployer))
        .with("conformance", conformance)
        .with("bench", Arc::new(Bench))
}
