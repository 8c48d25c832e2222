//! The in-memory [`TaskStore`]: for tests, benchmarks and throwaway runs.
//!
//! A `std::sync::RwLock` guards the map because no critical section awaits
//! and each is short (an encode, a decode or an index update); an async
//! lock would cost more for nothing.
//!
//! A task is kept encoded (the SQL backends' protobuf form, [`codec`]), with
//! beside it only what lookups and filters read (state, context, status
//! time). The decoded proto types are several times larger than their
//! encoding, and a store of many finished tasks is mostly that encoding:
//! encoded, a small completed task costs a few hundred bytes instead of
//! about two kilobytes.
//!
//! What is kept beside the record is laid out for a store of many small
//! tasks, whose indexes would otherwise cost more than the tasks (a2a-bench
//! create-many: 818 bytes of store per task before, of which 384 the
//! record). Each tenant keeps its tasks in a slab ([`Entry`]s by slot), and
//! the indexes hold 4-byte slots instead of ids:
//! - by id and by idempotency key, hash tables of slots, each hashed by
//!   what the slot's entry holds (its id; a keyed hash of its creating
//!   message's key, the key itself read back from the record on a match);
//! - the ListTasks order ([`Order`]), newest status first, ties by id,
//!   keyed by a packed 12-byte time, so that the cursor's walk reads the
//!   index instead of sorting.
//!
//! Ids and context ids that are canonical lowercase UUIDs (what this server
//! mints) are kept as their 16 bytes, others as text ([`Id`]); both give
//! back the exact string.

use std::collections::HashMap;
use std::sync::RwLock;

use crate::wkt::Timestamp;
use async_trait::async_trait;

use super::{
    Body, Cursor, Delivery, EncodedTask, ListQuery, Outbox, Owner, OwnerFilter, StoreError,
    StoredTask, TaskPage, TaskRead, TaskStore, origin_key, time_key,
};
use crate::lifecycle::history::task_view;
use crate::lifecycle::state_from_i32;

mod ids;
mod tasks;

use ids::{Id, IdRef};
use tasks::{Entry, NO_ORIGIN, Order, TenantTasks, decode, entry};

/// Tasks in process memory; lost on exit.
#[derive(Default)]
pub struct MemoryStore {
    tenants: RwLock<HashMap<String, TenantTasks>>,
    /// Push notifications due, by seq. Locked inside `tenants`' write lock
    /// when a task write adds to it, so an entry is never seen before the
    /// write that made it.
    outbox: std::sync::Mutex<OutboxQueue>,
    /// Every idempotency key hashes the same ([`TenantTasks::colliding`]).
    #[cfg(test)]
    colliding: bool,
}

#[derive(Default)]
struct OutboxQueue {
    entries: std::collections::BTreeMap<u64, Delivery>,
    next_seq: u64,
}

impl OutboxQueue {
    fn add(&mut self, tenant: &str, task: &EncodedTask) {
        for entry in &task.outbox {
            self.next_seq += 1;
            self.entries.insert(
                self.next_seq,
                Delivery {
                    seq: self.next_seq,
                    tenant: tenant.to_owned(),
                    task_id: task.id.clone(),
                    owner: task.owner.clone(),
                    config_id: entry.config_id.clone(),
                    event: entry.event.clone(),
                    attempts: 0,
                    not_before_ms: 0,
                },
            );
        }
    }
}

fn poisoned<T>(_: T) -> StoreError {
    StoreError::Internal("memory store lock poisoned".into())
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// `read` of a task's entry, if it exists and, given an `owner`, that
    /// principal created it: the one lookup behind `get`, `get_owned_by`
    /// and `get_task`.
    /// [`MemoryStore::read_entry`] for an owner given by name; the empty
    /// name owns nothing (`TaskStore::get_owned`).
    fn read_named<T>(
        &self,
        tenant: &str,
        task_id: &str,
        owner: Option<&str>,
        read: impl FnOnce(&Entry) -> Result<T, StoreError>,
    ) -> Result<Option<T>, StoreError> {
        match owner.map(Owner::new) {
            Some(None) => Ok(None),
            Some(Some(owner)) => self.read_entry(tenant, task_id, Some(&owner), read),
            None => self.read_entry(tenant, task_id, None, read),
        }
    }

    fn read_entry<T>(
        &self,
        tenant: &str,
        task_id: &str,
        owner: Option<&Owner>,
        read: impl FnOnce(&Entry) -> Result<T, StoreError>,
    ) -> Result<Option<T>, StoreError> {
        let tenants = self.tenants.read().map_err(poisoned)?;
        tenants
            .get(tenant)
            .and_then(|t| t.get(task_id))
            .filter(|e| owner.is_none_or(|owner| e.owner() == Some(owner)))
            .map(read)
            .transpose()
    }
}

#[async_trait]
impl TaskStore for MemoryStore {
    fn backend(&self) -> &'static str {
        "memory"
    }

    fn keeps_changes(&self) -> bool {
        true
    }

    /// Nothing outside this process reads these records.
    fn compact_records(&self) -> bool {
        true
    }

    async fn create_encoded(&self, tenant: &str, task: &EncodedTask) -> Result<u64, StoreError> {
        let origin = task.origin.as_slice();
        let mut tenants = self.tenants.write().map_err(poisoned)?;
        let tasks = tenants.entry(tenant.to_owned()).or_insert_with(|| {
            TenantTasks::new(
                #[cfg(test)]
                self.colliding,
            )
        });
        let id: &str = &task.id;
        if tasks.slot_of(id).is_some() {
            return Err(StoreError::AlreadyExists(id.to_owned()));
        }
        let origin_hash = if origin.is_empty() {
            NO_ORIGIN
        } else {
            if let Some((_, existing)) = tasks.find_origin(origin)? {
                return Err(StoreError::DuplicateMessage {
                    task_id: existing.record.task.id,
                });
            }
            tasks.origin_hash(origin)
        };
        tasks.add(Entry::new(task, 1, origin_hash)?);
        if !task.outbox.is_empty() {
            self.outbox.lock().map_err(poisoned)?.add(tenant, task);
        }
        Ok(1)
    }

    async fn get(&self, tenant: &str, task_id: &str) -> Result<Option<StoredTask>, StoreError> {
        self.read_entry(tenant, task_id, None, Entry::stored)
    }

    async fn get_task(
        &self,
        tenant: &str,
        task_id: &str,
        owner: Option<&str>,
    ) -> Result<Option<crate::proto::Task>, StoreError> {
        self.read_named(tenant, task_id, owner, Entry::task)
    }

    async fn read_task(
        &self,
        tenant: &str,
        task_id: &str,
        owner: Option<&str>,
    ) -> Result<Option<TaskRead>, StoreError> {
        self.read_named(tenant, task_id, owner, Entry::read)
    }

    async fn get_owned_by(
        &self,
        tenant: &str,
        task_id: &str,
        owner: &Owner,
    ) -> Result<Option<StoredTask>, StoreError> {
        self.read_entry(tenant, task_id, Some(owner), Entry::stored)
    }

    async fn is_owned_by(
        &self,
        tenant: &str,
        task_id: &str,
        owner: &Owner,
    ) -> Result<bool, StoreError> {
        let tenants = self.tenants.read().map_err(poisoned)?;
        Ok(tenants
            .get(tenant)
            .and_then(|t| t.get(task_id))
            .is_some_and(|e| e.owner() == Some(owner)))
    }

    async fn find_by_origin(
        &self,
        tenant: &str,
        owner: &str,
        message_id: &str,
    ) -> Result<Option<StoredTask>, StoreError> {
        let key = origin_key(owner, message_id);
        let tenants = self.tenants.read().map_err(poisoned)?;
        let Some(tasks) = tenants.get(tenant) else {
            return Ok(None);
        };
        Ok(tasks.find_origin(&key)?.map(|(_, stored)| stored))
    }

    async fn update_encoded(
        &self,
        tenant: &str,
        task: &EncodedTask,
        expected_version: u64,
    ) -> Result<u64, StoreError> {
        let mut tenants = self.tenants.write().map_err(poisoned)?;
        let id = &task.id;
        let tasks = tenants
            .get_mut(tenant)
            .ok_or_else(|| StoreError::NotFound(id.clone()))?;
        let slot = tasks
            .slot_of(id)
            .ok_or_else(|| StoreError::NotFound(id.clone()))?;
        let stored = tasks
            .slots
            .cell(slot)
            .as_mut()
            .expect("an indexed slot is filled");
        if stored.version != expected_version {
            return Err(StoreError::Conflict {
                id: id.clone(),
                expected: expected_version,
                actual: stored.version,
            });
        }
        stored.version += 1;
        match &task.body {
            Body::Whole(record) => {
                stored.record = record.clone();
                stored.changes = None;
            }
            Body::Changes(changes) => stored.changes.get_or_insert_default().push(changes.clone()),
        }
        stored.state = task.state as i32;
        let (old, new) = (stored.status(), task.status);
        (stored.seconds, stored.nanos) = new;
        if stored.context_id.as_ref() != IdRef::of(&task.context_id) {
            stored.context_id = Id::new(&task.context_id);
        }
        let version = stored.version;
        if old != new {
            // A task's owner never changes.
            let owner = stored.owner().cloned();
            tasks.unindex(old, slot, owner.as_ref());
            tasks.index(new, slot, owner.as_ref());
        }
        if !task.outbox.is_empty() {
            self.outbox.lock().map_err(poisoned)?.add(tenant, task);
        }
        Ok(version)
    }

    async fn list(&self, tenant: &str, query: &ListQuery) -> Result<TaskPage, StoreError> {
        let tenants = self.tenants.read().map_err(poisoned)?;
        let Some(tasks) = tenants.get(tenant) else {
            return Ok(TaskPage::default());
        };
        let slots = &tasks.slots;
        let after = query.status_after.as_ref().map(time_key);
        let context = query.context_id.as_deref().map(IdRef::of);
        let matches = |slot: u32| -> Option<&Entry> {
            let entry = entry(slots, slot);
            let state_ok = query.state.is_none_or(|s| entry.state == s as i32);
            let context_ok = context.is_none_or(|c| entry.context_id.as_ref() == c);
            let owner_ok = query
                .owner
                .as_ref()
                .is_none_or(|o| o.owner().is_some_and(|o| entry.owner() == Some(o)));
            (state_ok && context_ok && owner_ok).then_some(entry)
        };
        // The index is sorted newest first, so the timestamp filter is a
        // prefix of it.
        let in_window = |slot: &u32| after.is_none_or(|a| entry(slots, *slot).status() >= a);
        // A user's list reads its own order.
        let empty = Order::default();
        let order = match query.owner.as_ref().map(OwnerFilter::owner) {
            Some(owner) => owner.and_then(|o| tasks.by_owner.get(o)).unwrap_or(&empty),
            None => &tasks.order,
        };

        let total_size = order
            .walk(slots, None)
            .take_while(in_window)
            .filter(|s| matches(*s).is_some())
            .count();

        let cursor = query
            .cursor
            .as_ref()
            .map(|c| (c.status, IdRef::of(&c.task_id)));
        let page_size = query.effective_page_size();
        let mut page: Vec<&Entry> = Vec::with_capacity(page_size.min(total_size));
        let mut next = None;
        // Stopped at the byte budget before any record is decoded.
        let mut bytes = 0usize;
        for slot in order.walk(slots, cursor).take_while(in_window) {
            let Some(entry) = matches(slot) else {
                continue;
            };
            bytes = bytes.saturating_add(entry.size());
            if page.len() == page_size || (!page.is_empty() && bytes > super::MAX_PAGE_BYTES) {
                let last = page.last().expect("page_size >= 1");
                next = Some(Cursor {
                    status: last.status(),
                    task_id: last.id.as_ref().to_string(),
                });
                break;
            }
            page.push(entry);
        }
        // The records are shared: taken out, and decoded once the lock is
        // given back, so writers do not wait while a page of big tasks is
        // decoded and copied.
        let records: Vec<_> = page.into_iter().map(Entry::parts).collect();
        drop(tenants);
        let mut views = Vec::with_capacity(records.len());
        for parts in records {
            let record = decode(&parts)?;
            views.push(task_view(
                &record.task,
                query.history,
                query.include_artifacts,
            ));
        }
        Ok(TaskPage {
            tasks: views,
            next,
            total_size,
        })
    }

    async fn active_tasks(&self) -> Result<Vec<(String, StoredTask)>, StoreError> {
        let tenants = self.tenants.read().map_err(poisoned)?;
        let mut active = Vec::new();
        for (tenant, tasks) in tenants.iter() {
            for entry in tasks.entries() {
                if state_from_i32(entry.state).is_ok_and(|s| s.is_active()) {
                    active.push((tenant.clone(), entry.stored()?));
                }
            }
        }
        Ok(active)
    }

    async fn count_unfinished(&self) -> Result<Vec<(crate::proto::TaskState, u64)>, StoreError> {
        let tenants = self.tenants.read().map_err(poisoned)?;
        let mut counts: HashMap<crate::proto::TaskState, u64> = HashMap::new();
        for tasks in tenants.values() {
            for entry in tasks.entries() {
                if let Ok(state) = state_from_i32(entry.state)
                    && !state.is_terminal()
                {
                    *counts.entry(state).or_default() += 1;
                }
            }
        }
        Ok(counts.into_iter().collect())
    }

    async fn count_open_owned_by(
        &self,
        owner: &Owner,
        at_most: usize,
    ) -> Result<usize, StoreError> {
        let tenants = self.tenants.read().map_err(poisoned)?;
        Ok(tenants
            .values()
            .flat_map(|t| t.entries())
            .filter(|e| {
                e.owner() == Some(owner) && state_from_i32(e.state).is_ok_and(|s| !s.is_terminal())
            })
            .take(at_most)
            .count())
    }

    async fn waiting_before(
        &self,
        before: &Timestamp,
        limit: usize,
    ) -> Result<Vec<super::Waiting>, StoreError> {
        let before = time_key(before);
        let tenants = self.tenants.read().map_err(poisoned)?;
        let mut waiting: Vec<super::Waiting> = tenants
            .iter()
            .flat_map(|(tenant, t)| t.entries().map(move |e| (tenant, e)))
            .filter(|(_, e)| {
                e.status() < before && state_from_i32(e.state).is_ok_and(|s| s.is_interrupted())
            })
            .map(|(tenant, e)| super::Waiting {
                tenant: tenant.clone(),
                task_id: e.id.as_ref().to_string(),
                owner: e.owner().map_or("", Owner::as_str).to_owned(),
                since: e.status(),
            })
            .collect();
        waiting.sort_by_key(|w| w.since);
        waiting.truncate(limit);
        Ok(waiting)
    }

    async fn purge_terminal_before(&self, before: &Timestamp) -> Result<u64, StoreError> {
        let before = time_key(before);
        let mut tenants = self.tenants.write().map_err(poisoned)?;
        let mut purged = 0;
        for tasks in tenants.values_mut() {
            let expired: Vec<u32> = tasks
                .slots
                .iter()
                .filter(|(_, e)| {
                    state_from_i32(e.state).is_ok_and(|s| s.is_terminal()) && e.status() < before
                })
                .map(|(slot, _)| slot)
                .collect();
            for slot in expired {
                // The idempotency key goes with the entry (its index is by
                // slot).
                if tasks.remove(slot).is_some() {
                    purged += 1;
                }
            }
        }
        tenants.retain(|_, t| t.entries().next().is_some());
        Ok(purged)
    }

    fn outbox(&self) -> &dyn Outbox {
        self
    }
}

#[async_trait]
impl Outbox for MemoryStore {
    async fn pending(&self, after_seq: u64, limit: usize) -> Result<Vec<Delivery>, StoreError> {
        let outbox = self.outbox.lock().map_err(poisoned)?;
        Ok(outbox
            .entries
            .range(after_seq.saturating_add(1)..)
            .take(limit)
            .map(|(_, d)| d.clone())
            .collect())
    }

    async fn finish_delivery(&self, seq: u64) -> Result<(), StoreError> {
        self.outbox.lock().map_err(poisoned)?.entries.remove(&seq);
        Ok(())
    }

    async fn defer_delivery(
        &self,
        seq: u64,
        attempts: u32,
        not_before_ms: i64,
    ) -> Result<(), StoreError> {
        if let Some(entry) = self.outbox.lock().map_err(poisoned)?.entries.get_mut(&seq) {
            entry.attempts = attempts;
            entry.not_before_ms = not_before_ms;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::ids::Time;
    use super::*;
    use crate::lifecycle::TaskRecord;
    use crate::proto::{Message, Role, TaskState};

    fn record(id: &str, context_id: &str, message_id: &str, seconds: i64) -> TaskRecord {
        let message = Message {
            message_id: message_id.into(),
            role: Role::User as i32,
            ..Default::default()
        };
        let at = Timestamp { seconds, nanos: 0 };
        let mut record = TaskRecord::submitted(id.into(), context_id.into(), message, at);
        record.task.status.as_mut().unwrap().state = TaskState::Completed as i32;
        record
    }

    /// Two messages whose idempotency keys hash the same each find their
    /// own task, a repeat of either is refused naming its task, and a
    /// purge forgets only the purged task's key.
    #[tokio::test]
    async fn colliding_idempotency_keys_find_each_its_own_task() {
        let store = MemoryStore {
            colliding: true,
            ..Default::default()
        };
        let first = record("t1", "c", "m1", 1);
        let second = record("t2", "c", "m2", 100);
        store.create("", &first).await.unwrap();
        store.create("", &second).await.unwrap();
        let found = |m: &'static str| {
            let store = &store;
            async move {
                store
                    .find_by_origin("", "", m)
                    .await
                    .unwrap()
                    .map(|s| s.record.task.id)
            }
        };
        assert_eq!(found("m1").await.as_deref(), Some("t1"));
        assert_eq!(found("m2").await.as_deref(), Some("t2"));
        assert_eq!(found("m3").await, None);
        match store.create("", &record("t3", "c", "m2", 2)).await {
            Err(StoreError::DuplicateMessage { task_id }) => assert_eq!(task_id, "t2"),
            other => panic!("expected DuplicateMessage, got {other:?}"),
        }
        store.create("", &record("t3", "c", "m3", 3)).await.unwrap();
        let purged = store
            .purge_terminal_before(&Timestamp {
                seconds: 50,
                nanos: 0,
            })
            .await
            .unwrap();
        assert_eq!(purged, 2, "t1 and t3");
        assert_eq!(found("m1").await, None);
        assert_eq!(found("m3").await, None);
        assert_eq!(found("m2").await.as_deref(), Some("t2"));
        store.create("", &record("t4", "c", "m1", 4)).await.unwrap();
        assert_eq!(found("m1").await.as_deref(), Some("t4"));
    }

    /// Ids and context ids read back as they were written, UUID or not,
    /// whatever their case; ties in time list by the ids' bytes, across
    /// both forms, and a walk by cursor visits each once.
    #[tokio::test]
    async fn ids_read_back_exactly_and_ties_list_by_their_bytes() {
        let store = MemoryStore::new();
        let ids = [
            "0190a5e8-7c3b-7def-8a12-3456789abcde",
            "0190A5E8-7C3B-7DEF-8A12-3456789ABCDE",
            "0190a5e8-7c3b-7def-8a12-3456789abcdf",
            "{0190a5e8-7c3b-7def-8a12-3456789abcde}",
            "0190a5e87c3b7def8a123456789abcde",
            "task-1",
            "ffffffff-ffff-ffff-ffff-ffffffffffff",
            "00000000-0000-0000-0000-000000000000",
            "0190a5e8-7c3b-7def-8a12-3456789abcd",
            "é-ünïcode",
            "",
        ];
        for (i, id) in ids.iter().enumerate() {
            // Each task's context id is another of the ids.
            let context = ids[(i + 1) % ids.len()];
            store
                .create("", &record(id, context, &format!("m{i}"), 9))
                .await
                .unwrap();
        }
        for (i, id) in ids.iter().enumerate() {
            let stored = store.get("", id).await.unwrap().expect("stored");
            assert_eq!(stored.record.task.id, *id);
            assert_eq!(stored.record.task.context_id, ids[(i + 1) % ids.len()]);
            assert_eq!(store.get_task("", id, None).await.unwrap().unwrap().id, *id);
            let query = ListQuery {
                context_id: Some(ids[(i + 1) % ids.len()].into()),
                ..Default::default()
            };
            let page = store.list("", &query).await.unwrap();
            assert_eq!(ids_of(&page), [*id], "context {:?}", query.context_id);
        }
        let mut sorted = ids.to_vec();
        sorted.sort();
        let page = store.list("", &ListQuery::default()).await.unwrap();
        assert_eq!(ids_of(&page), sorted);
        let mut walked = Vec::new();
        let mut cursor = None;
        loop {
            let query = ListQuery {
                page_size: 2,
                cursor: cursor.take(),
                ..Default::default()
            };
            let page = store.list("", &query).await.unwrap();
            walked.extend(ids_of(&page).into_iter().map(str::to_owned));
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        assert_eq!(walked, sorted);
        // Out of the tie and back: the order follows.
        let mut moved = store.get("", ids[5]).await.unwrap().unwrap();
        moved.record.task.status.as_mut().unwrap().timestamp = Some(Timestamp {
            seconds: 10,
            nanos: 0,
        });
        store.update("", &moved.record, 1).await.unwrap();
        let page = store.list("", &ListQuery::default()).await.unwrap();
        assert_eq!(ids_of(&page)[0], ids[5]);
        assert_eq!(page.tasks.len(), ids.len());
    }

    fn ids_of(page: &TaskPage) -> Vec<&str> {
        page.tasks.iter().map(|t| t.id.as_str()).collect()
    }

    #[test]
    fn only_canonical_lowercase_uuids_are_packed() {
        let uuid = "0190a5e8-7c3b-7def-8a12-3456789abcde";
        assert!(matches!(Id::new(uuid), Id::Uuid(_)));
        assert_eq!(Id::new(uuid).as_ref().to_string(), uuid);
        for text in [
            "0190A5E8-7C3B-7DEF-8A12-3456789ABCDE",
            "0190a5e8-7c3b-7def-8a12-3456789abcdg",
            "0190a5e8x7c3b-7def-8a12-3456789abcde",
            "0190a5e87c3b7def8a123456789abcde",
        ] {
            assert_eq!(Id::new(text), Id::Text(text.into()));
            assert_eq!(Id::new(text).as_ref().to_string(), text);
        }
        assert!(Time::new((-1, 999_999_999)) < Time::new((0, 0)));
        assert!(Time::new((0, -1)) < Time::new((0, 0)));
        assert!(Time::new((i64::MIN, i32::MIN)) < Time::new((i64::MAX, i32::MAX)));
    }
}
