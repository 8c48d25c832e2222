//! Which executor serves a request: chosen by the request's `tenant`
//! (spec §4.4.6: an opaque routing identifier for one of several agents
//! behind one endpoint).

use std::collections::HashMap;
use std::sync::Arc;

use super::AgentExecutor;

/// Tenant name -> executor, with the empty tenant as the default agent.
#[derive(Clone, Default)]
pub struct AgentRouter {
    /// Looked up on every call, keyed by the operator's tenants: a fast
    /// hash (SipHash's DoS resistance guards maps a client fills).
    agents: HashMap<String, Arc<dyn AgentExecutor>, foldhash::fast::RandomState>,
}

impl AgentRouter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Serves `executor` for requests whose tenant is `tenant` (`""` for
    /// requests without a tenant).
    pub fn with(mut self, tenant: impl Into<String>, executor: Arc<dyn AgentExecutor>) -> Self {
        self.agents.insert(tenant.into(), executor);
        self
    }

    pub fn route(&self, tenant: &str) -> Option<Arc<dyn AgentExecutor>> {
        self.agents.get(tenant).cloned()
    }

    /// The tenants served, sorted.
    pub fn tenants(&self) -> Vec<String> {
        let mut names: Vec<_> = self.agents.keys().cloned().collect();
        names.sort();
        names
    }
}
