//! The store conformance suite ([`store_conformance`]) run against
//! [`MemoryStore`].

use crate::store_conformance;

use std::sync::Arc;

use a2a_lifecycle::store::{MemoryStore, TaskStore};

store_conformance::store_conformance_tests!(|| async {
    Arc::new(MemoryStore::new()) as Arc<dyn TaskStore>
},);
