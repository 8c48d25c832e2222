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

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;
use std::ops::Bound;
use std::sync::RwLock;

use crate::wkt::Timestamp;
use async_trait::async_trait;
use hashbrown::HashTable;

use std::sync::Arc;

use super::{
    Body, Cursor, Delivery, EncodedTask, ListQuery, Outbox, Owner, OwnerFilter, StoreError,
    StoredTask, TaskPage, TaskStore, TimeKey, codec, origin_key, origin_of, time_key,
};
use crate::lifecycle::TaskRecord;
use crate::lifecycle::history::task_view;
use crate::lifecycle::state_from_i32;

/// Maps keyed by what this server chooses: foldhash instead of SipHash,
/// which cost about 3% of the server's CPU per request (perf). What
/// clients choose (message ids) is hashed with SipHash, keyed
/// ([`std::hash::RandomState`]), whose resistance to crafted collisions
/// foldhash does not promise.
type FoldMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// A task id or context id as an entry keeps it: a canonical lowercase
/// UUID, which this server mints for both, as its 16 bytes (24 with the
/// tag, against a 16-byte pointer and a 40-byte allocation as text); any
/// other string as it is. Which form a string takes depends on it alone,
/// so equal strings have equal `Id`s; an uppercase UUID stays text and
/// reads back uppercase.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Id {
    Uuid([u8; 16]),
    Text(Box<str>),
}

/// An [`Id`] borrowed, or read from a caller's string without allocating.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum IdRef<'a> {
    Uuid([u8; 16]),
    Text(&'a str),
}

/// The bytes of `s` if it is a UUID as this server writes it: 36
/// characters, 8-4-4-4-12 lowercase hex digits.
fn uuid_bytes(s: &str) -> Option<[u8; 16]> {
    fn hex(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        }
    }
    let s = s.as_bytes();
    if s.len() != 36 {
        return None;
    }
    let mut bytes = [0u8; 16];
    let mut at = 0;
    for byte in &mut bytes {
        if matches!(at, 8 | 13 | 18 | 23) {
            if s[at] != b'-' {
                return None;
            }
            at += 1;
        }
        *byte = hex(s[at])? << 4 | hex(s[at + 1])?;
        at += 2;
    }
    Some(bytes)
}

impl Id {
    fn new(s: &str) -> Id {
        match uuid_bytes(s) {
            Some(bytes) => Id::Uuid(bytes),
            None => Id::Text(s.into()),
        }
    }

    fn as_ref(&self) -> IdRef<'_> {
        match self {
            Id::Uuid(bytes) => IdRef::Uuid(*bytes),
            Id::Text(text) => IdRef::Text(text),
        }
    }
}

impl<'a> IdRef<'a> {
    fn of(s: &'a str) -> IdRef<'a> {
        match uuid_bytes(s) {
            Some(bytes) => IdRef::Uuid(bytes),
            None => IdRef::Text(s),
        }
    }

    /// The string, written into `buf` for a UUID.
    fn as_str<'b>(&self, buf: &'b mut [u8; 36]) -> &'b str
    where
        'a: 'b,
    {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        match *self {
            IdRef::Text(text) => text,
            IdRef::Uuid(bytes) => {
                let mut at = 0;
                for (i, byte) in bytes.iter().enumerate() {
                    if matches!(i, 4 | 6 | 8 | 10) {
                        buf[at] = b'-';
                        at += 1;
                    }
                    buf[at] = HEX[usize::from(byte >> 4)];
                    buf[at + 1] = HEX[usize::from(byte & 0xf)];
                    at += 2;
                }
                std::str::from_utf8(&buf[..]).expect("hex digits and hyphens")
            }
        }
    }

    /// The order of the strings' bytes (spec §3.1.4's ties). Two UUIDs
    /// compare as their bytes, which is the order of their lowercase hex.
    fn cmp_str(self, other: IdRef<'_>) -> Ordering {
        match (self, other) {
            (IdRef::Uuid(a), IdRef::Uuid(b)) => a.cmp(&b),
            (a, b) => a.as_str(&mut [0; 36]).cmp(b.as_str(&mut [0; 36])),
        }
    }
}

impl std::fmt::Display for IdRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str(&mut [0; 36]))
    }
}

/// A status time packed in 12 bytes whose byte order is the time's order
/// ([`TimeKey`], 16 bytes with its padding): the ListTasks index holds one
/// per task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Time([u8; 12]);

impl Time {
    fn new((seconds, nanos): TimeKey) -> Time {
        let mut bytes = [0u8; 12];
        // The sign bits flipped: negatives sort before positives.
        bytes[..8].copy_from_slice(&((seconds as u64) ^ (1 << 63)).to_be_bytes());
        bytes[8..].copy_from_slice(&((nanos as u32) ^ (1 << 31)).to_be_bytes());
        Time(bytes)
    }
}

/// One stored task.
struct Entry {
    /// The record as of its last whole write, encoded by
    /// [`codec::encode`].
    record: Arc<[u8]>,
    /// The changes of each write since ([`Body::Changes`]), in order:
    /// appended, so a long task's update costs what it changed (none once
    /// a whole write replaced them). Boxed: most tasks have none, and an
    /// empty `Vec` would cost them 24 bytes each.
    #[allow(clippy::box_collection)]
    changes: Option<Box<Vec<Arc<[u8]>>>>,
    version: u64,
    /// The status time ([`TimeKey`]) in two fields, so that `state` fills
    /// what would be the tuple's padding.
    seconds: i64,
    /// The keyed hash of the idempotency key ([`TenantTasks::origin_hash`],
    /// never 0), or [`NO_ORIGIN`] for a task without one: what `by_origin`
    /// rehashes by. Not an `Option`, which would cost 8 bytes more.
    origin: u64,
    id: Id,
    context_id: Id,
    /// [`EncodedTask::owner`]: none (no allocation) for most stores;
    /// boxed, as 8 bytes for them instead of 16.
    owner: Option<Box<Owner>>,
    nanos: i32,
    state: i32,
}

impl Entry {
    /// The entry of a created task: the write is whole.
    fn new(task: &EncodedTask, version: u64, origin: u64) -> Result<Self, StoreError> {
        let Body::Whole(record) = &task.body else {
            return Err(StoreError::Internal(
                "a task is created by a whole record, not changes".into(),
            ));
        };
        Ok(Entry {
            record: record.clone(),
            changes: None,
            version,
            seconds: task.status.0,
            nanos: task.status.1,
            origin,
            id: Id::new(&task.id),
            context_id: Id::new(&task.context_id),
            owner: Owner::new(&task.owner).map(Box::new),
            state: task.state as i32,
        })
    }

    fn status(&self) -> TimeKey {
        (self.seconds, self.nanos)
    }

    fn owner(&self) -> Option<&Owner> {
        self.owner.as_deref()
    }

    fn changes(&self) -> &[Arc<[u8]>] {
        self.changes.as_deref().map_or(&[], |c| &c[..])
    }

    /// What a read copies out under the lock: the record's parts.
    fn parts(&self) -> (Arc<[u8]>, Vec<Arc<[u8]>>) {
        (self.record.clone(), self.changes().to_vec())
    }

    fn stored(&self) -> Result<StoredTask, StoreError> {
        Ok(StoredTask {
            record: decode(&self.parts())?,
            version: self.version,
        })
    }

    /// The task alone ([`TaskStore::get_task`]).
    fn task(&self) -> Result<crate::proto::Task, StoreError> {
        codec::decode_task(&self.record, self.changes().iter().map(|c| &c[..]))
    }

    /// The stored size: the whole record and the changes after it.
    fn size(&self) -> usize {
        self.record.len() + self.changes().iter().map(|c| c.len()).sum::<usize>()
    }
}

/// [`Entry::origin`] of a task without an idempotency key.
const NO_ORIGIN: u64 = 0;

/// The record of an entry's parts ([`Entry::parts`]).
fn decode((record, changes): &(Arc<[u8]>, Vec<Arc<[u8]>>)) -> Result<TaskRecord, StoreError> {
    codec::decode_with_changes(record, changes.iter().map(|c| &c[..]))
}

/// The slab of a tenant's entries, by slot, in chunks of [`CHUNK`]: a
/// single vector would be copied to one twice its size as it grows, and
/// the blocks it leaves behind, megabytes each, stay resident a while
/// (with it, 42 more bytes of RSS per task at 100,000 tasks).
#[derive(Default)]
struct Slots {
    chunks: Vec<Box<[Option<Entry>]>>,
    len: u32,
}

/// Entries per chunk of [`Slots`] (32 KiB).
const CHUNK: usize = 256;

impl Slots {
    fn get(&self, slot: u32) -> Option<&Entry> {
        let slot = slot as usize;
        self.chunks.get(slot / CHUNK)?[slot % CHUNK].as_ref()
    }

    fn cell(&mut self, slot: u32) -> &mut Option<Entry> {
        let slot = slot as usize;
        &mut self.chunks[slot / CHUNK][slot % CHUNK]
    }

    /// A new slot holding `entry`.
    fn push(&mut self, entry: Entry) -> u32 {
        assert!(self.len < TIED, "a tenant's slots are u32");
        if self.len as usize == self.chunks.len() * CHUNK {
            self.chunks.push((0..CHUNK).map(|_| None).collect());
        }
        let slot = self.len;
        self.len += 1;
        *self.cell(slot) = Some(entry);
        slot
    }

    fn iter(&self) -> impl Iterator<Item = (u32, &Entry)> {
        self.chunks
            .iter()
            .flat_map(|c| c.iter())
            .enumerate()
            .filter_map(|(slot, e)| Some((slot as u32, e.as_ref()?)))
    }
}

fn entry(slots: &Slots, slot: u32) -> &Entry {
    slots.get(slot).expect("an indexed slot is filled")
}

/// A ListTasks order: slots newest status time first, ties broken by id
/// ascending (spec §3.1.4). Keyed by time alone (16 bytes a task, against
/// 32 for a (time, id) key), the tasks of one time are a slot, or
/// [`TIED`] and the time's slots in `ties`, sorted by id: ties are rare
/// (times are nanoseconds), and sorting them needs the entries' ids.
#[derive(Default)]
struct Order {
    by_time: BTreeMap<Reverse<Time>, u32>,
    ties: HashMap<Time, Vec<u32>, foldhash::fast::RandomState>,
}

/// [`Order::by_time`]'s value when a time has several tasks: never a
/// slot (a tenant's slots stay below it).
const TIED: u32 = u32::MAX;

impl Order {
    fn insert(&mut self, time: TimeKey, slot: u32, slots: &Slots) {
        let time = Time::new(time);
        let by_id = |a: &u32, b: &u32| {
            entry(slots, *a)
                .id
                .as_ref()
                .cmp_str(entry(slots, *b).id.as_ref())
        };
        match self.by_time.entry(Reverse(time)) {
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(slot);
            }
            std::collections::btree_map::Entry::Occupied(mut o) => {
                let tied = self.ties.entry(time).or_default();
                if *o.get() != TIED {
                    tied.push(*o.get());
                    o.insert(TIED);
                }
                let at = tied
                    .binary_search_by(|s| by_id(s, &slot))
                    .unwrap_or_else(|at| at);
                tied.insert(at, slot);
            }
        }
    }

    fn remove(&mut self, time: TimeKey, slot: u32) {
        let time = Time::new(time);
        let std::collections::btree_map::Entry::Occupied(mut o) = self.by_time.entry(Reverse(time))
        else {
            return;
        };
        if *o.get() == slot {
            o.remove();
        } else if *o.get() == TIED
            && let Some(tied) = self.ties.get_mut(&time)
        {
            tied.retain(|s| *s != slot);
            if tied.len() == 1 {
                o.insert(tied[0]);
                self.ties.remove(&time);
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.by_time.is_empty()
    }

    /// The slots in order, from the first after `after` (a ListTasks
    /// cursor's task: its time and id, which may no longer be stored).
    fn walk<'a>(
        &'a self,
        slots: &'a Slots,
        after: Option<(TimeKey, IdRef<'a>)>,
    ) -> impl Iterator<Item = u32> + 'a {
        let start = match after {
            Some((time, _)) => Bound::Included(Reverse(Time::new(time))),
            None => Bound::Unbounded,
        };
        let after = after.map(|(time, id)| (Time::new(time), id));
        self.by_time
            .range((start, Bound::Unbounded))
            .flat_map(move |(Reverse(time), slot)| {
                let group: &[u32] = if *slot == TIED {
                    self.ties.get(time).map_or(&[], |t| &t[..])
                } else {
                    std::slice::from_ref(slot)
                };
                let skip = match after {
                    Some((at, id)) if at == *time => group.partition_point(|s| {
                        entry(slots, *s).id.as_ref().cmp_str(id) != Ordering::Greater
                    }),
                    _ => 0,
                };
                group[skip..].iter().copied()
            })
    }
}

struct TenantTasks {
    slots: Slots,
    /// Slots emptied by a purge, filled again first.
    free: Vec<u32>,
    /// Slots by their entry's id (hashed by `ids`).
    by_id: HashTable<u32>,
    ids: foldhash::fast::RandomState,
    /// Slots of the tasks with an idempotency key ([`super::origin_key`]),
    /// by the key's hash ([`Entry::origin`]). A hash may be shared: a match
    /// is confirmed by the key of the task's record, so no message ever
    /// finds another message's task.
    by_origin: HashTable<u32>,
    origins: std::hash::RandomState,
    /// Every idempotency key hashes the same: tests' collisions.
    #[cfg(test)]
    colliding: bool,
    order: Order,
    /// `order` per owner (owned tasks only): a user's ListTasks reads and
    /// counts its own tasks, not the tenant's (as SQLite's
    /// `tasks_by_owner`), so listing costs a principal with few tasks little
    /// however many the others have.
    by_owner: FoldMap<Owner, Order>,
}

impl TenantTasks {
    fn new(#[cfg(test)] colliding: bool) -> Self {
        TenantTasks {
            slots: Slots::default(),
            free: Vec::new(),
            by_id: HashTable::new(),
            ids: Default::default(),
            by_origin: HashTable::new(),
            origins: Default::default(),
            #[cfg(test)]
            colliding,
            order: Order::default(),
            by_owner: FoldMap::default(),
        }
    }

    fn origin_hash(&self, key: &[u8]) -> u64 {
        #[cfg(test)]
        if self.colliding {
            return 7;
        }
        // 0 is [`NO_ORIGIN`]; 1 shares a hash, which matches confirm.
        self.origins.hash_one(key).max(1)
    }

    fn slot_of(&self, id: &str) -> Option<u32> {
        let id = IdRef::of(id);
        let slots = &self.slots;
        self.by_id
            .find(self.ids.hash_one(id), |s| {
                entry(slots, *s).id.as_ref() == id
            })
            .copied()
    }

    fn get(&self, id: &str) -> Option<&Entry> {
        self.slot_of(id).map(|s| entry(&self.slots, s))
    }

    /// The task created by the message of idempotency key `key`, decoded
    /// (what confirms a hash's match).
    fn find_origin(&self, key: &[u8]) -> Result<Option<(u32, StoredTask)>, StoreError> {
        let hash = self.origin_hash(key);
        for &slot in self.by_origin.iter_hash(hash) {
            let found = entry(&self.slots, slot);
            if found.origin != hash {
                continue;
            }
            let stored = found.stored()?;
            if origin_of(&stored.record) == key {
                return Ok(Some((slot, stored)));
            }
        }
        Ok(None)
    }

    /// Stores `entry` in a slot and indexes it.
    fn add(&mut self, entry_: Entry) -> u32 {
        let (status, origin, owner) = (entry_.status(), entry_.origin, entry_.owner().cloned());
        let slot = match self.free.pop() {
            Some(slot) => {
                *self.slots.cell(slot) = Some(entry_);
                slot
            }
            None => self.slots.push(entry_),
        };
        let TenantTasks {
            slots, ids, by_id, ..
        } = self;
        let hash = ids.hash_one(entry(slots, slot).id.as_ref());
        by_id.insert_unique(hash, slot, |s| ids.hash_one(entry(slots, *s).id.as_ref()));
        if origin != NO_ORIGIN {
            let hash = origin;
            self.by_origin
                .insert_unique(hash, slot, |s| entry(slots, *s).origin);
        }
        self.index(status, slot, owner.as_ref());
        slot
    }

    /// Takes the entry of `slot` out of the slab and every index.
    fn remove(&mut self, slot: u32) -> Option<Entry> {
        self.slots.get(slot)?;
        let removed = self.slots.cell(slot).take()?;
        let hash = self.ids.hash_one(removed.id.as_ref());
        if let Ok(found) = self.by_id.find_entry(hash, |s| *s == slot) {
            found.remove();
        }
        if removed.origin != NO_ORIGIN
            && let Ok(found) = self.by_origin.find_entry(removed.origin, |s| *s == slot)
        {
            found.remove();
        }
        self.unindex(removed.status(), slot, removed.owner());
        self.free.push(slot);
        Some(removed)
    }

    /// Puts `slot` in the orders (the tenant's, and its owner's).
    fn index(&mut self, time: TimeKey, slot: u32, owner: Option<&Owner>) {
        if let Some(owner) = owner {
            self.by_owner
                .entry(owner.clone())
                .or_default()
                .insert(time, slot, &self.slots);
        }
        self.order.insert(time, slot, &self.slots);
    }

    /// Takes `slot` out of the orders.
    fn unindex(&mut self, time: TimeKey, slot: u32, owner: Option<&Owner>) {
        self.order.remove(time, slot);
        if let Some(owner) = owner
            && let Some(owned) = self.by_owner.get_mut(owner)
        {
            owned.remove(time, slot);
            if owned.is_empty() {
                self.by_owner.remove(owner);
            }
        }
    }

    fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.slots.iter().map(|(_, e)| e)
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
        match owner.map(Owner::new) {
            // The empty name owns nothing (`TaskStore::get_owned`).
            Some(None) => Ok(None),
            Some(Some(owner)) => self.read_entry(tenant, task_id, Some(&owner), Entry::task),
            None => self.read_entry(tenant, task_id, None, Entry::task),
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
    use super::*;
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
