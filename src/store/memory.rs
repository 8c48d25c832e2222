//! The in-memory [`TaskStore`]: for tests, benchmarks and throwaway runs.
//!
//! A `std::sync::RwLock` guards the map because no critical section awaits
//! and each is short (an encode, a decode or an index update); an async
//! lock would cost more for nothing. Each tenant keeps its tasks by id plus
//! an ordered index on (status timestamp descending, id) so ListTasks pages
//! walk the index from the cursor instead of sorting.
//!
//! A task is kept encoded (the SQL backends' protobuf form, [`codec`]), with
//! beside it only what lookups and filters read (state, context, status
//! time). The decoded proto types are several times larger than their
//! encoding, and a store of many finished tasks is mostly that encoding:
//! encoded, a small completed task costs a few hundred bytes instead of
//! about two kilobytes. Ids are shared (`Arc<str>`) between the maps.

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};
use std::ops::Bound;
use std::sync::RwLock;

use crate::wkt::Timestamp;
use async_trait::async_trait;

use std::sync::Arc;

use super::{
    Body, Cursor, Delivery, EncodedTask, ListQuery, Outbox, Owner, OwnerFilter, StoreError,
    StoredTask, TaskPage, TaskRead, TaskStore, TimeKey, codec, origin_key, origin_of, time_key,
};
use crate::lifecycle::TaskRecord;
use crate::lifecycle::history::task_view;
use crate::lifecycle::state_from_i32;

type OrderKey = (Reverse<TimeKey>, Arc<str>);

/// The map of task ids, which this server mints (UUIDv7): foldhash instead
/// of SipHash, which cost about 3% of the server's CPU per request (perf).
/// Maps keyed by what clients choose (message ids) keep SipHash, whose
/// resistance to crafted collisions foldhash does not promise.
type FoldMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// One stored task.
struct Entry {
    /// The record as of its last whole write, encoded by
    /// [`codec::encode`].
    record: Arc<[u8]>,
    /// The changes of each write since ([`Body::Changes`]), in order:
    /// appended, so a long task's update costs what it changed (none once
    /// a whole write replaced them).
    changes: Vec<Arc<[u8]>>,
    version: u64,
    state: i32,
    status: TimeKey,
    context_id: Box<str>,
    /// [`EncodedTask::owner`]: none (no allocation) for most stores.
    owner: Option<Owner>,
}

impl Entry {
    /// The entry of a created task: the write is whole.
    fn new(task: &EncodedTask, version: u64) -> Result<Self, StoreError> {
        let Body::Whole(record) = &task.body else {
            return Err(StoreError::Internal(
                "a task is created by a whole record, not changes".into(),
            ));
        };
        Ok(Entry {
            record: record.clone(),
            changes: Vec::new(),
            version,
            state: task.state as i32,
            status: task.status,
            context_id: task.context_id.as_str().into(),
            owner: Owner::new(&task.owner),
        })
    }

    /// What a read copies out under the lock: the record's parts.
    fn parts(&self) -> (Arc<[u8]>, Vec<Arc<[u8]>>) {
        (self.record.clone(), self.changes.clone())
    }

    fn stored(&self) -> Result<StoredTask, StoreError> {
        Ok(StoredTask {
            record: decode(&self.parts())?,
            version: self.version,
        })
    }

    /// The task alone ([`TaskStore::get_task`]).
    fn task(&self) -> Result<crate::proto::Task, StoreError> {
        codec::decode_task(&self.record, self.changes.iter().map(|c| &c[..]))
    }

    /// The task as kept ([`TaskStore::read_task`]): a task at rest (no
    /// changes after its whole record) is handed out as its encoding, a
    /// slice of the record shared, not copied.
    fn read(&self) -> Result<TaskRead, StoreError> {
        match codec::task_span(&self.record) {
            Some(span) if self.changes.is_empty() => Ok(TaskRead::Encoded(
                bytes::Bytes::from_owner(self.record.clone()).slice(span),
            )),
            _ => self.task().map(TaskRead::Decoded),
        }
    }

    /// The stored size: the whole record and the changes after it.
    fn size(&self) -> usize {
        self.record.len() + self.changes.iter().map(|c| c.len()).sum::<usize>()
    }
}

/// The record of an entry's parts ([`Entry::parts`]).
fn decode((record, changes): &(Arc<[u8]>, Vec<Arc<[u8]>>)) -> Result<TaskRecord, StoreError> {
    codec::decode_with_changes(record, changes.iter().map(|c| &c[..]))
}

#[derive(Default)]
struct TenantTasks {
    by_id: FoldMap<Arc<str>, Entry>,
    order: BTreeSet<OrderKey>,
    /// `order` per owner (owned tasks only): a user's ListTasks reads and
    /// counts its own tasks, not the tenant's (as SQLite's
    /// `tasks_by_owner`), so listing costs a principal with few tasks little
    /// however many the others have.
    by_owner: FoldMap<Owner, BTreeSet<OrderKey>>,
    /// Idempotency key ([`super::origin_key`]) -> task id.
    by_origin: HashMap<Box<[u8]>, Arc<str>>,
}

impl TenantTasks {
    /// Puts `key` in the orders (the tenant's, and its owner's).
    fn index(&mut self, key: OrderKey, owner: Option<&Owner>) {
        if let Some(owner) = owner {
            self.by_owner
                .entry(owner.clone())
                .or_default()
                .insert(key.clone());
        }
        self.order.insert(key);
    }

    /// Takes `key` out of the orders.
    fn unindex(&mut self, key: &OrderKey, owner: Option<&Owner>) {
        self.order.remove(key);
        if let Some(owner) = owner
            && let Some(owned) = self.by_owner.get_mut(owner)
        {
            owned.remove(key);
            if owned.is_empty() {
                self.by_owner.remove(owner);
            }
        }
    }
}

/// Tasks in process memory; lost on exit.
#[derive(Default)]
pub struct MemoryStore {
    tenants: RwLock<HashMap<String, TenantTasks>>,
    /// Push notifications due, by seq. Locked inside `tenants`' write lock
    /// when a task write adds to it, so an entry is never seen before the
    /// write that made it.
    outbox: std::sync::Mutex<OutboxQueue>,
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
            .and_then(|t| t.by_id.get(task_id))
            .filter(|e| owner.is_none_or(|owner| e.owner.as_ref() == Some(owner)))
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

    async fn create_encoded(&self, tenant: &str, task: &EncodedTask) -> Result<u64, StoreError> {
        let entry = Entry::new(task, 1)?;
        let origin = task.origin.as_slice();
        let mut tenants = self.tenants.write().map_err(poisoned)?;
        let tasks = tenants.entry(tenant.to_owned()).or_default();
        let id: &str = &task.id;
        if tasks.by_id.contains_key(id) {
            return Err(StoreError::AlreadyExists(id.to_owned()));
        }
        let id: Arc<str> = id.into();
        if !origin.is_empty() {
            if let Some(existing) = tasks.by_origin.get(origin) {
                return Err(StoreError::DuplicateMessage {
                    task_id: existing.to_string(),
                });
            }
            tasks.by_origin.insert(origin.into(), id.clone());
        }
        tasks.index((Reverse(entry.status), id.clone()), entry.owner.as_ref());
        tasks.by_id.insert(id, entry);
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
        match owner.map(Owner::new) {
            // The empty name owns nothing (`TaskStore::get_owned`).
            Some(None) => Ok(None),
            Some(Some(owner)) => self.read_entry(tenant, task_id, Some(&owner), Entry::task),
            None => self.read_entry(tenant, task_id, None, Entry::task),
        }
    }

    async fn read_task(
        &self,
        tenant: &str,
        task_id: &str,
        owner: Option<&str>,
    ) -> Result<Option<TaskRead>, StoreError> {
        match owner.map(Owner::new) {
            // The empty name owns nothing (`TaskStore::get_owned`).
            Some(None) => Ok(None),
            Some(Some(owner)) => self.read_entry(tenant, task_id, Some(&owner), Entry::read),
            None => self.read_entry(tenant, task_id, None, Entry::read),
        }
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
            .and_then(|t| t.by_id.get(task_id))
            .is_some_and(|e| e.owner.as_ref() == Some(owner)))
    }

    async fn find_by_origin(
        &self,
        tenant: &str,
        owner: &str,
        message_id: &str,
    ) -> Result<Option<StoredTask>, StoreError> {
        let key = origin_key(owner, message_id);
        let tenants = self.tenants.read().map_err(poisoned)?;
        tenants
            .get(tenant)
            .and_then(|t| t.by_id.get(t.by_origin.get(key.as_slice())?))
            .map(Entry::stored)
            .transpose()
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
        let key = match tasks.by_id.get_key_value(id.as_str()) {
            Some((key, _)) => key.clone(),
            None => return Err(StoreError::NotFound(id.clone())),
        };
        let stored = tasks.by_id.get_mut(&key).expect("key just found");
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
                stored.changes = Vec::new();
            }
            Body::Changes(changes) => stored.changes.push(changes.clone()),
        }
        stored.state = task.state as i32;
        let (old, new) = (stored.status, task.status);
        stored.status = new;
        if *stored.context_id != *task.context_id {
            stored.context_id = task.context_id.as_str().into();
        }
        let version = stored.version;
        if old != new {
            // A task's owner never changes.
            let owner = stored.owner.clone();
            tasks.unindex(&(Reverse(old), key.clone()), owner.as_ref());
            tasks.index((Reverse(new), key), owner.as_ref());
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
        let after = query.status_after.as_ref().map(time_key);
        let matches = |key: &OrderKey| -> Option<&Entry> {
            let entry = tasks.by_id.get(&key.1)?;
            let state_ok = query.state.is_none_or(|s| entry.state == s as i32);
            let context_ok = query
                .context_id
                .as_deref()
                .is_none_or(|c| &*entry.context_id == c);
            let owner_ok = query
                .owner
                .as_ref()
                .is_none_or(|o| o.owner().is_some_and(|o| entry.owner.as_ref() == Some(o)));
            (state_ok && context_ok && owner_ok).then_some(entry)
        };
        // The index is sorted newest first, so the timestamp filter is a
        // prefix of it.
        let in_window = |key: &&OrderKey| after.is_none_or(|a| key.0.0 >= a);
        // A user's list reads its own order.
        let empty = BTreeSet::new();
        let order = match query.owner.as_ref().map(OwnerFilter::owner) {
            Some(owner) => owner.and_then(|o| tasks.by_owner.get(o)).unwrap_or(&empty),
            None => &tasks.order,
        };

        let total_size = order
            .iter()
            .take_while(in_window)
            .filter(|k| matches(k).is_some())
            .count();

        let start = match &query.cursor {
            Some(c) => Bound::Excluded((Reverse(c.status), Arc::from(c.task_id.as_str()))),
            None => Bound::Unbounded,
        };
        let page_size = query.effective_page_size();
        let mut page: Vec<&OrderKey> = Vec::with_capacity(page_size.min(total_size));
        let mut next = None;
        // Stopped at the byte budget before any record is decoded.
        let mut bytes = 0usize;
        for key in order.range((start, Bound::Unbounded)).take_while(in_window) {
            let Some(entry) = matches(key) else {
                continue;
            };
            bytes = bytes.saturating_add(entry.size());
            if page.len() == page_size || (!page.is_empty() && bytes > super::MAX_PAGE_BYTES) {
                let last = page.last().expect("page_size >= 1");
                next = Some(Cursor {
                    status: last.0.0,
                    task_id: last.1.to_string(),
                });
                break;
            }
            page.push(key);
        }
        // The records are shared: taken out, and decoded once the lock is
        // given back, so writers do not wait while a page of big tasks is
        // decoded and copied.
        let records: Vec<_> = page
            .into_iter()
            .map(|key| tasks.by_id[&key.1].parts())
            .collect();
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
            for entry in tasks.by_id.values() {
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
            for entry in tasks.by_id.values() {
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
            .flat_map(|t| t.by_id.values())
            .filter(|e| {
                e.owner.as_ref() == Some(owner)
                    && state_from_i32(e.state).is_ok_and(|s| !s.is_terminal())
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
            .flat_map(|(tenant, t)| t.by_id.iter().map(move |(id, e)| (tenant, id, e)))
            .filter(|(_, _, e)| {
                e.status < before && state_from_i32(e.state).is_ok_and(|s| s.is_interrupted())
            })
            .map(|(tenant, id, e)| super::Waiting {
                tenant: tenant.clone(),
                task_id: id.to_string(),
                owner: e.owner.as_ref().map_or("", Owner::as_str).to_owned(),
                since: e.status,
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
            let expired: Vec<Arc<str>> = tasks
                .by_id
                .iter()
                .filter(|(_, e)| {
                    state_from_i32(e.state).is_ok_and(|s| s.is_terminal()) && e.status < before
                })
                .map(|(id, _)| id.clone())
                .collect();
            for id in expired {
                if let Some(entry) = tasks.by_id.remove(&id) {
                    tasks.unindex(&(Reverse(entry.status), id), entry.owner.as_ref());
                    // The creating message is read back from the record
                    // (purges are rare; an index field would cost every task).
                    let record = decode(&entry.parts())?;
                    let origin = origin_of(&record);
                    if !origin.is_empty() {
                        tasks.by_origin.remove(origin.as_slice());
                    }
                    purged += 1;
                }
            }
        }
        tenants.retain(|_, t| !t.by_id.is_empty());
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
