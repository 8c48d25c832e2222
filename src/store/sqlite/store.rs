//! [`TaskStore`] and [`Outbox`] for [`SqliteStore`]: each operation handed to the file
//! that does it (reads, writes, recovery, the outbox).

use async_trait::async_trait;

use super::{SqliteStore, outbox, reads, recovery, writes};
use crate::proto::TaskState;
use crate::store::{
    Delivery, EncodedTask, ListQuery, Outbox, Owner, StoreError, StoredTask, TaskPage, TaskStore,
    Waiting,
};
use crate::wkt::Timestamp;

#[async_trait]
impl TaskStore for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    fn instrument(&self, writer: crate::metrics::WriterMetrics) {
        // Only the first server's: one store, one writer.
        let _ = self.writer.metrics.set(writer);
    }

    fn keeps_changes(&self) -> bool {
        true
    }

    async fn create_encoded(&self, tenant: &str, task: &EncodedTask) -> Result<u64, StoreError> {
        writes::create_encoded(self, tenant, task).await
    }

    async fn update_encoded(
        &self,
        tenant: &str,
        task: &EncodedTask,
        expected_version: u64,
    ) -> Result<u64, StoreError> {
        writes::update_encoded(self, tenant, task, expected_version).await
    }

    async fn purge_terminal_before(&self, before: &Timestamp) -> Result<u64, StoreError> {
        writes::purge_terminal_before(self, before).await
    }

    async fn get(&self, tenant: &str, task_id: &str) -> Result<Option<StoredTask>, StoreError> {
        reads::get(self, tenant, task_id).await
    }

    async fn get_owned_by(
        &self,
        tenant: &str,
        task_id: &str,
        owner: &Owner,
    ) -> Result<Option<StoredTask>, StoreError> {
        reads::get_owned_by(self, tenant, task_id, owner).await
    }

    async fn is_owned_by(
        &self,
        tenant: &str,
        task_id: &str,
        owner: &Owner,
    ) -> Result<bool, StoreError> {
        reads::is_owned_by(self, tenant, task_id, owner).await
    }

    async fn find_by_origin(
        &self,
        tenant: &str,
        owner: &str,
        message_id: &str,
    ) -> Result<Option<StoredTask>, StoreError> {
        reads::find_by_origin(self, tenant, owner, message_id).await
    }

    async fn list(&self, tenant: &str, query: &ListQuery) -> Result<TaskPage, StoreError> {
        reads::list(self, tenant, query).await
    }

    async fn count_unfinished(&self) -> Result<Vec<(TaskState, u64)>, StoreError> {
        reads::count_unfinished(self).await
    }

    async fn count_open_owned_by(
        &self,
        owner: &Owner,
        at_most: usize,
    ) -> Result<usize, StoreError> {
        reads::count_open_owned_by(self, owner, at_most).await
    }

    async fn waiting_before(
        &self,
        before: &Timestamp,
        limit: usize,
    ) -> Result<Vec<Waiting>, StoreError> {
        reads::waiting_before(self, before, limit).await
    }

    async fn active_tasks(&self) -> Result<Vec<(String, StoredTask)>, StoreError> {
        recovery::active_tasks(self).await
    }

    fn outbox(&self) -> &dyn Outbox {
        self
    }
}

#[async_trait]
impl Outbox for SqliteStore {
    async fn pending(&self, after_seq: u64, limit: usize) -> Result<Vec<Delivery>, StoreError> {
        outbox::pending(self, after_seq, limit).await
    }

    async fn finish_delivery(&self, seq: u64) -> Result<(), StoreError> {
        outbox::finish_delivery(self, seq).await
    }

    async fn defer_delivery(
        &self,
        seq: u64,
        attempts: u32,
        not_before_ms: i64,
    ) -> Result<(), StoreError> {
        outbox::defer_delivery(self, seq, attempts, not_before_ms).await
    }
}
