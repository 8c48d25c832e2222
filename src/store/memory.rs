//! The in-memory [`TaskStore`]: for tests, benchmarks and throwaway runs.
//!
//! A `std::sync::RwLock` guards the map because no critical section awaits
//! and each is short (a clone or an index update); an async lock would cost
//! more for nothing. Each tenant keeps its tasks by id plus an ordered index
//! on (status timestamp descending, id) so ListTasks pages walk the index
//! from the cursor instead of sorting.

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};
use std::ops::Bound;
use std::sync::RwLock;

use async_trait::async_trait;
use prost_types::Timestamp;

use super::{
    Cursor, ListQuery, StoreError, StoredTask, TaskPage, TaskStore, TimeKey, origin_message_id,
    status_key, time_key,
};
use crate::lifecycle::TaskRecord;
use crate::lifecycle::history::task_view;

type OrderKey = (Reverse<TimeKey>, String);

#[derive(Default)]
struct TenantTasks {
    by_id: HashMap<String, StoredTask>,
    order: BTreeSet<OrderKey>,
    /// Creating message id -> task id (idempotent sends).
    by_origin: HashMap<String, String>,
}

/// Tasks in process memory; lost on exit.
#[derive(Default)]
pub struct MemoryStore {
    tenants: RwLock<HashMap<String, TenantTasks>>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }
}

fn order_key(record: &TaskRecord) -> OrderKey {
    (Reverse(status_key(&record.task)), record.task.id.clone())
}

fn poisoned<T>(_: T) -> StoreError {
    StoreError::Internal("memory store lock poisoned".into())
}

#[async_trait]
impl TaskStore for MemoryStore {
    async fn create(&self, tenant: &str, record: &TaskRecord) -> Result<u64, StoreError> {
        let mut tenants = self.tenants.write().map_err(poisoned)?;
        let tasks = tenants.entry(tenant.to_owned()).or_default();
        let id = &record.task.id;
        if tasks.by_id.contains_key(id) {
            return Err(StoreError::AlreadyExists(id.clone()));
        }
        let origin = origin_message_id(record);
        if !origin.is_empty() {
            if let Some(existing) = tasks.by_origin.get(origin) {
                return Err(StoreError::DuplicateMessage {
                    task_id: existing.clone(),
                });
            }
            tasks.by_origin.insert(origin.to_owned(), id.clone());
        }
        tasks.order.insert(order_key(record));
        tasks.by_id.insert(
            id.clone(),
            StoredTask {
                record: record.clone(),
                version: 1,
            },
        );
        Ok(1)
    }

    async fn get(&self, tenant: &str, task_id: &str) -> Result<Option<StoredTask>, StoreError> {
        let tenants = self.tenants.read().map_err(poisoned)?;
        Ok(tenants
            .get(tenant)
            .and_then(|t| t.by_id.get(task_id))
            .cloned())
    }

    async fn find_by_origin(
        &self,
        tenant: &str,
        message_id: &str,
    ) -> Result<Option<StoredTask>, StoreError> {
        let tenants = self.tenants.read().map_err(poisoned)?;
        Ok(tenants.get(tenant).and_then(|t| {
            let id = t.by_origin.get(message_id)?;
            t.by_id.get(id).cloned()
        }))
    }

    async fn update(
        &self,
        tenant: &str,
        record: &TaskRecord,
        expected_version: u64,
    ) -> Result<u64, StoreError> {
        let mut tenants = self.tenants.write().map_err(poisoned)?;
        let id = &record.task.id;
        let tasks = tenants
            .get_mut(tenant)
            .ok_or_else(|| StoreError::NotFound(id.clone()))?;
        let stored = tasks
            .by_id
            .get_mut(id)
            .ok_or_else(|| StoreError::NotFound(id.clone()))?;
        if stored.version != expected_version {
            return Err(StoreError::Conflict {
                id: id.clone(),
                expected: expected_version,
                actual: stored.version,
            });
        }
        let old_key = order_key(&stored.record);
        let new_key = order_key(record);
        stored.record = record.clone();
        stored.version += 1;
        let version = stored.version;
        if old_key != new_key {
            tasks.order.remove(&old_key);
            tasks.order.insert(new_key);
        }
        Ok(version)
    }

    async fn list(&self, tenant: &str, query: &ListQuery) -> Result<TaskPage, StoreError> {
        let tenants = self.tenants.read().map_err(poisoned)?;
        let Some(tasks) = tenants.get(tenant) else {
            return Ok(TaskPage::default());
        };
        let after = query.status_after.as_ref().map(time_key);
        let matches = |key: &OrderKey| -> Option<&StoredTask> {
            let stored = tasks.by_id.get(&key.1)?;
            let task = &stored.record.task;
            let state_ok = query
                .state
                .is_none_or(|s| task.status.as_ref().is_some_and(|st| st.state == s as i32));
            let context_ok = query
                .context_id
                .as_deref()
                .is_none_or(|c| task.context_id == c);
            (state_ok && context_ok).then_some(stored)
        };
        // The index is sorted newest first, so the timestamp filter is a
        // prefix of it.
        let in_window = |key: &&OrderKey| after.is_none_or(|a| key.0.0 >= a);

        let total_size = tasks
            .order
            .iter()
            .take_while(in_window)
            .filter(|k| matches(k).is_some())
            .count();

        let start = match &query.cursor {
            Some(c) => Bound::Excluded((Reverse(c.status), c.task_id.clone())),
            None => Bound::Unbounded,
        };
        let page_size = query.effective_page_size();
        let mut page: Vec<&StoredTask> = Vec::with_capacity(page_size.min(total_size));
        let mut next = None;
        for key in tasks
            .order
            .range((start, Bound::Unbounded))
            .take_while(in_window)
        {
            let Some(stored) = matches(key) else { continue };
            if page.len() == page_size {
                let last = page.last().expect("page_size >= 1");
                next = Some(Cursor {
                    status: status_key(&last.record.task),
                    task_id: last.record.task.id.clone(),
                });
                break;
            }
            page.push(stored);
        }
        Ok(TaskPage {
            tasks: page
                .into_iter()
                .map(|s| task_view(&s.record.task, query.history, query.include_artifacts))
                .collect(),
            next,
            total_size,
        })
    }

    async fn active_tasks(&self) -> Result<Vec<(String, StoredTask)>, StoreError> {
        let tenants = self.tenants.read().map_err(poisoned)?;
        Ok(tenants
            .iter()
            .flat_map(|(tenant, tasks)| {
                tasks
                    .by_id
                    .values()
                    .filter(|s| s.record.state().is_active())
                    .map(move |s| (tenant.clone(), s.clone()))
            })
            .collect())
    }

    async fn purge_terminal_before(&self, before: &Timestamp) -> Result<u64, StoreError> {
        let before = time_key(before);
        let mut tenants = self.tenants.write().map_err(poisoned)?;
        let mut purged = 0;
        for tasks in tenants.values_mut() {
            let expired: Vec<String> = tasks
                .by_id
                .values()
                .filter(|s| s.record.state().is_terminal() && status_key(&s.record.task) < before)
                .map(|s| s.record.task.id.clone())
                .collect();
            for id in expired {
                if let Some(stored) = tasks.by_id.remove(&id) {
                    tasks.order.remove(&order_key(&stored.record));
                    tasks.by_origin.remove(origin_message_id(&stored.record));
                    purged += 1;
                }
            }
        }
        tenants.retain(|_, t| !t.by_id.is_empty());
        Ok(purged)
    }
}
