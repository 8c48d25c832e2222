//! [`TaskStore`], [`Outbox`] and [`Coordination`] for [`PostgresStore`]:
//! each operation handed to the file that does it (reads, recovery,
//! claims, the feed between replicas, jobs, the outbox), writes to the
//! writers.

use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::broadcast;

use super::writer::WriteKind;
use super::{PostgresStore, claims, feed, jobs, outbox, reads, recovery};
use crate::proto::TaskState;
use crate::store::{
    CatchUp, Coordination, Delivery, EncodedTask, ListQuery, OriginState, Outbox, Owner,
    StoreError, StoredTask, TaskPage, TaskStore, Waiting, WriteNotice,
};
use crate::wkt::Timestamp;

#[async_trait]
impl TaskStore for PostgresStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    fn instrument(&self, writer: crate::metrics::WriterMetrics) {
        self.writers.instrument(writer);
    }

    async fn create_encoded(&self, tenant: &str, task: &EncodedTask) -> Result<u64, StoreError> {
        task.body.whole()?;
        self.writers
            .write(tenant, WriteKind::Create(task.clone()))
            .await
    }

    async fn update_encoded(
        &self,
        tenant: &str,
        task: &EncodedTask,
        expected_version: u64,
    ) -> Result<u64, StoreError> {
        self.writers
            .write(tenant, WriteKind::Update(task.clone(), expected_version))
            .await
    }

    fn keeps_changes(&self) -> bool {
        true
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

    async fn purge_terminal_before(&self, before: &Timestamp) -> Result<u64, StoreError> {
        jobs::purge_terminal_before(self, before).await
    }

    fn outbox(&self) -> &dyn Outbox {
        self
    }

    fn coordination(&self) -> Option<&dyn Coordination> {
        Some(self)
    }
}

#[async_trait]
impl Outbox for PostgresStore {
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

#[async_trait]
impl Coordination for PostgresStore {
    async fn orphaned_tasks(&self) -> Result<Vec<(String, StoredTask)>, StoreError> {
        recovery::orphaned_tasks(self).await
    }

    async fn claim_origin(
        &self,
        tenant: &str,
        owner: &str,
        message_id: &str,
    ) -> Result<OriginState, StoreError> {
        claims::claim_origin(self, tenant, owner, message_id).await
    }

    async fn release_origin(
        &self,
        tenant: &str,
        owner: &str,
        message_id: &str,
    ) -> Result<(), StoreError> {
        claims::release_origin(self, tenant, owner, message_id).await
    }

    async fn claim_run(&self, tenant: &str, task_id: &str) -> Result<Option<u64>, StoreError> {
        claims::claim_run(self, tenant, task_id).await
    }

    async fn take_runs(&self, tenant: &str, task_id: &str) -> Result<bool, StoreError> {
        claims::take_runs(self, tenant, task_id).await
    }

    async fn release_run(&self, tenant: &str, task_id: &str) -> Result<(), StoreError> {
        claims::release_run(self, tenant, task_id).await
    }

    fn lease(&self) -> Duration {
        self.standing.lease()
    }

    fn held_for(&self) -> Duration {
        self.standing.held_for()
    }

    fn lease_losses(&self) -> tokio::sync::watch::Receiver<u64> {
        self.standing.losses()
    }

    fn changes(&self) -> broadcast::Receiver<WriteNotice> {
        self.changes.subscribe()
    }

    async fn watch(&self, tenant: &str, task_id: &str, on: bool) -> Result<(), StoreError> {
        feed::watch(self, tenant, task_id, on).await
    }

    async fn catch_up(
        &self,
        tenant: &str,
        task_id: &str,
        after: u64,
    ) -> Result<Option<CatchUp>, StoreError> {
        feed::catch_up(self, tenant, task_id, after).await
    }

    async fn hold(&self, role: &str) -> Result<bool, StoreError> {
        jobs::hold(self, role).await
    }

    async fn take_turn(&self, job: &str, every: Duration) -> Result<bool, StoreError> {
        let client = self.client().await?;
        jobs::take_turn(&client, job, every).await
    }
}
