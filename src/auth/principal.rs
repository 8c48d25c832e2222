//! Who an authenticated caller is: its name, the tenants it may use, its
//! role and its quotas.

use serde::Deserialize;

/// What a principal may see of its tenants' tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Its own tasks only.
    User,
    /// Every task of its tenants.
    Admin,
}

/// The tenants a principal may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tenants {
    All,
    Only(Vec<String>),
}

impl Tenants {
    pub(super) fn from_names(names: Vec<String>) -> Self {
        if names.iter().any(|n| n == "*") {
            Tenants::All
        } else {
            Tenants::Only(names)
        }
    }

    pub fn allows(&self, tenant: &str) -> bool {
        match self {
            Tenants::All => true,
            Tenants::Only(names) => names.iter().any(|n| n == tenant),
        }
    }
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The principal's `name`, the JWT's `sub`, or the client
    /// certificate's name.
    pub name: String,
    pub tenants: Tenants,
    pub role: Role,
    /// What the operator allows it (none by default).
    pub quota: crate::store::Quota,
}

impl Principal {
    /// Whether this principal may address `tenant` at all.
    pub fn may_use(&self, tenant: &str) -> bool {
        self.tenants.allows(tenant)
    }
}
