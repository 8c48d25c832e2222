//! Demo agents from the planner scenario, one per tenant.
//!
//! | tenant | agent |
//! | --- | --- |
//! | `""` (none) or `test-runner` | [`TestRunner`] |
//! | `code-reviewer` | [`CodeReviewer`] |
//! | `deployer` | [`Deployer`] |
//!
//! They are deterministic and fast so that every lifecycle flow (blocking,
//! polling, streaming, input-required, auth-required, rejected, failed,
//! canceled, direct reply) can be driven and tested against a real server.

mod code_reviewer;
mod deployer;
mod test_runner;

use std::sync::Arc;

pub use code_reviewer::CodeReviewer;
pub use deployer::Deployer;
pub use test_runner::TestRunner;

use super::AgentRouter;

/// The router `serve` uses: the three demo agents, test-runner as default.
pub fn demo_router() -> AgentRouter {
    demo_router_with(Deployer::default())
}

/// The demo router with a tuned deployer (its approval delay).
pub fn demo_router_with(deployer: Deployer) -> AgentRouter {
    let test_runner = Arc::new(TestRunner::default());
    AgentRouter::new()
        .with("", test_runner.clone())
        .with("test-runner", test_runner)
        .with("code-reviewer", Arc::new(CodeReviewer))
        .with("deployer", Arc::new(deployer))
}
