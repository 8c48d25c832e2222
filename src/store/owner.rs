//! Who owns tasks (spec §13.1): the rule that the empty name owns nothing
//! is stated here, once, by the types lookups take.

/// The principal that created a task, which alone (as a `user`) may read
/// it: never the empty name. A task created without authentication is
/// stored with the empty name as its owner and belongs to no one, so no
/// lookup by an `Owner` can find it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Owner(Box<str>);

impl Owner {
    /// The owner named `name`; `None` for the empty name, which owns
    /// nothing (tasks created without authentication are no user's).
    pub fn new(name: &str) -> Option<Owner> {
        Self::can_own(name).then(|| Owner(name.into()))
    }

    /// Whether `name` can own tasks: every name but the empty one. What
    /// [`Owner::new`] asks, and what tells an owned task's idempotency key
    /// from an unowned one's ([`origin_key`](super::origin_key)).
    pub fn can_own(name: &str) -> bool {
        !name.is_empty()
    }

    /// The owner's name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name as stored (the SQL backends' `owner` column).
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

/// A ListTasks limit to one principal's tasks
/// ([`ListQuery::owner`](super::ListQuery::owner)), made from its name:
/// `"alice".into()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerFilter {
    /// The tasks this owner created.
    Owner(Owner),
    /// No task: the limit to the empty name, which owns nothing.
    Nobody,
}

impl OwnerFilter {
    /// The owner whose tasks pass; `None` when none does.
    pub fn owner(&self) -> Option<&Owner> {
        match self {
            OwnerFilter::Owner(owner) => Some(owner),
            OwnerFilter::Nobody => None,
        }
    }
}

impl From<Option<Owner>> for OwnerFilter {
    fn from(owner: Option<Owner>) -> Self {
        owner.map_or(OwnerFilter::Nobody, OwnerFilter::Owner)
    }
}

impl From<&str> for OwnerFilter {
    fn from(name: &str) -> Self {
        Owner::new(name).into()
    }
}

impl From<String> for OwnerFilter {
    fn from(name: String) -> Self {
        name.as_str().into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_empty_name_owns_nothing() {
        assert_eq!(Owner::new(""), None);
        assert_eq!(OwnerFilter::from(""), OwnerFilter::Nobody);
        let alice = Owner::new("alice").unwrap();
        assert_eq!(alice.as_str(), "alice");
        assert_eq!(OwnerFilter::from("alice").owner(), Some(&alice));
    }
}
