//! The store conformance suite ([`store_conformance`]) run against
//! [`SqliteStore`], each test on its own database file.

mod store_conformance;

use std::sync::Arc;

use a2a_lifecycle::store::{SqliteStore, TaskStore};

store_conformance::store_conformance_tests!(|| async {
    // Under cargo's per-target scratch folder, one file per test.
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("store-sqlite")
        .join(format!("{}.db", uuid::Uuid::new_v4()));
    let store = SqliteStore::open(path).await.unwrap();
    Arc::new(store) as Arc<dyn TaskStore>
});
