//! A tenant's tasks in the memory store: the slab of entries, and the
//! indexes of slots by id, by idempotency key and in ListTasks order.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;
use std::ops::Bound;
use std::sync::Arc;

use hashbrown::HashTable;

use super::ids::{Id, IdRef, Time};
use crate::lifecycle::TaskRecord;
use crate::store::{
    Body, EncodedTask, Owner, StoreError, StoredTask, TaskRead, TimeKey, codec, origin_of,
};

/// Maps keyed by what this server chooses: foldhash instead of SipHash,
/// which cost about 3% of the server's CPU per request (perf). What
/// clients choose (message ids) is hashed with SipHash, keyed
/// ([`std::hash::RandomState`]), whose resistance to crafted collisions
/// foldhash does not promise.
pub(super) type FoldMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// One stored task.
pub(super) struct Entry {
    /// The record as of its last whole write, encoded by
    /// [`codec::encode_compact`] (the runtime's writes to this store,
    /// [`crate::store::TaskStore::compact_records`]) or [`codec::encode`].
    pub(super) record: Arc<[u8]>,
    /// The changes of each write since ([`Body::Changes`]), in order:
    /// appended, so a long task's update costs what it changed (none once
    /// a whole write replaced them). Boxed: most tasks have none, and an
    /// empty `Vec` would cost them 24 bytes each.
    #[allow(clippy::box_collection)]
    pub(super) changes: Option<Box<Vec<Arc<[u8]>>>>,
    pub(super) version: u64,
    /// The status time ([`TimeKey`]) in two fields, so that `state` fills
    /// what would be the tuple's padding.
    pub(super) seconds: i64,
    /// The keyed hash of the idempotency key ([`TenantTasks::origin_hash`],
    /// never 0), or [`NO_ORIGIN`] for a task without one: what `by_origin`
    /// rehashes by. Not an `Option`, which would cost 8 bytes more.
    pub(super) origin: u64,
    pub(super) id: Id,
    pub(super) context_id: Id,
    /// [`EncodedTask::owner`]: none (no allocation) for most stores;
    /// boxed, as 8 bytes for them instead of 16.
    pub(super) owner: Option<Box<Owner>>,
    pub(super) nanos: i32,
    pub(super) state: i32,
}

impl Entry {
    /// The entry of a created task: the write is whole.
    pub(super) fn new(task: &EncodedTask, version: u64, origin: u64) -> Result<Self, StoreError> {
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

    pub(super) fn status(&self) -> TimeKey {
        (self.seconds, self.nanos)
    }

    pub(super) fn owner(&self) -> Option<&Owner> {
        self.owner.as_deref()
    }

    pub(super) fn changes(&self) -> &[Arc<[u8]>] {
        self.changes.as_deref().map_or(&[], |c| &c[..])
    }

    /// What a read copies out under the lock: the record's parts.
    pub(super) fn parts(&self) -> (Arc<[u8]>, Vec<Arc<[u8]>>) {
        (self.record.clone(), self.changes().to_vec())
    }

    pub(super) fn stored(&self) -> Result<StoredTask, StoreError> {
        Ok(StoredTask {
            record: decode(&self.parts())?,
            version: self.version,
        })
    }

    /// The task alone ([`TaskStore::get_task`]).
    pub(super) fn task(&self) -> Result<crate::proto::Task, StoreError> {
        codec::decode_task(&self.record, self.changes().iter().map(|c| &c[..]))
    }

    /// The task as kept ([`TaskStore::read_task`](crate::store::TaskStore::read_task)):
    /// a task at rest (no changes after its whole record) is handed out as
    /// its encoding, a slice of the record shared, not copied.
    pub(super) fn read(&self) -> Result<TaskRead, StoreError> {
        if self.changes().is_empty()
            && let Some(task) = codec::task_bytes(&bytes::Bytes::from_owner(self.record.clone()))
        {
            return Ok(TaskRead::Encoded(task));
        }
        self.task().map(TaskRead::Decoded)
    }

    /// The stored size: the whole record and the changes after it.
    pub(super) fn size(&self) -> usize {
        self.record.len() + self.changes().iter().map(|c| c.len()).sum::<usize>()
    }
}

/// [`Entry::origin`] of a task without an idempotency key.
pub(super) const NO_ORIGIN: u64 = 0;

/// The record of an entry's parts ([`Entry::parts`]).
pub(super) fn decode(
    (record, changes): &(Arc<[u8]>, Vec<Arc<[u8]>>),
) -> Result<TaskRecord, StoreError> {
    codec::decode_with_changes(record, changes.iter().map(|c| &c[..]))
}

/// The slab of a tenant's entries, by slot, in chunks of [`CHUNK`]: a
/// single vector would be copied to one twice its size as it grows, and
/// the blocks it leaves behind, megabytes each, stay resident a while
/// (with it, 42 more bytes of RSS per task at 100,000 tasks).
#[derive(Default)]
pub(super) struct Slots {
    pub(super) chunks: Vec<Box<[Option<Entry>]>>,
    pub(super) len: u32,
}

/// Entries per chunk of [`Slots`] (32 KiB).
pub(super) const CHUNK: usize = 256;

impl Slots {
    pub(super) fn get(&self, slot: u32) -> Option<&Entry> {
        let slot = slot as usize;
        self.chunks.get(slot / CHUNK)?[slot % CHUNK].as_ref()
    }

    pub(super) fn cell(&mut self, slot: u32) -> &mut Option<Entry> {
        let slot = slot as usize;
        &mut self.chunks[slot / CHUNK][slot % CHUNK]
    }

    /// A new slot holding `entry`.
    pub(super) fn push(&mut self, entry: Entry) -> u32 {
        assert!(self.len < TIED, "a tenant's slots are u32");
        if self.len as usize == self.chunks.len() * CHUNK {
            self.chunks.push((0..CHUNK).map(|_| None).collect());
        }
        let slot = self.len;
        self.len += 1;
        *self.cell(slot) = Some(entry);
        slot
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (u32, &Entry)> {
        self.chunks
            .iter()
            .flat_map(|c| c.iter())
            .enumerate()
            .filter_map(|(slot, e)| Some((slot as u32, e.as_ref()?)))
    }
}

pub(super) fn entry(slots: &Slots, slot: u32) -> &Entry {
    slots.get(slot).expect("an indexed slot is filled")
}

/// A ListTasks order: slots newest status time first, ties broken by id
/// ascending (spec §3.1.4). Keyed by time alone (16 bytes a task, against
/// 32 for a (time, id) key), the tasks of one time are a slot, or
/// [`TIED`] and the time's slots in `ties`, sorted by id: ties are rare
/// (times are nanoseconds), and sorting them needs the entries' ids.
#[derive(Default)]
pub(super) struct Order {
    pub(super) by_time: BTreeMap<Reverse<Time>, u32>,
    pub(super) ties: HashMap<Time, Vec<u32>, foldhash::fast::RandomState>,
}

/// [`Order::by_time`]'s value when a time has several tasks: never a
/// slot (a tenant's slots stay below it).
pub(super) const TIED: u32 = u32::MAX;

impl Order {
    pub(super) fn insert(&mut self, time: TimeKey, slot: u32, slots: &Slots) {
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

    pub(super) fn remove(&mut self, time: TimeKey, slot: u32) {
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

    pub(super) fn is_empty(&self) -> bool {
        self.by_time.is_empty()
    }

    /// The slots in order, from the first after `after` (a ListTasks
    /// cursor's task: its time and id, which may no longer be stored).
    pub(super) fn walk<'a>(
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

pub(super) struct TenantTasks {
    pub(super) slots: Slots,
    /// Slots emptied by a purge, filled again first.
    pub(super) free: Vec<u32>,
    /// Slots by their entry's id (hashed by `ids`).
    pub(super) by_id: HashTable<u32>,
    pub(super) ids: foldhash::fast::RandomState,
    /// Slots of the tasks with an idempotency key ([`super::origin_key`]),
    /// by the key's hash ([`Entry::origin`]). A hash may be shared: a match
    /// is confirmed by the key of the task's record, so no message ever
    /// finds another message's task.
    pub(super) by_origin: HashTable<u32>,
    pub(super) origins: std::hash::RandomState,
    /// Every idempotency key hashes the same: tests' collisions.
    #[cfg(test)]
    pub(super) colliding: bool,
    pub(super) order: Order,
    /// `order` per owner (owned tasks only): a user's ListTasks reads and
    /// counts its own tasks, not the tenant's (as SQLite's
    /// `tasks_by_owner`), so listing costs a principal with few tasks little
    /// however many the others have.
    pub(super) by_owner: FoldMap<Owner, Order>,
}

impl TenantTasks {
    pub(super) fn new(#[cfg(test)] colliding: bool) -> Self {
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

    pub(super) fn origin_hash(&self, key: &[u8]) -> u64 {
        #[cfg(test)]
        if self.colliding {
            return 7;
        }
        // 0 is [`NO_ORIGIN`]; 1 shares a hash, which matches confirm.
        self.origins.hash_one(key).max(1)
    }

    pub(super) fn slot_of(&self, id: &str) -> Option<u32> {
        let id = IdRef::of(id);
        let slots = &self.slots;
        self.by_id
            .find(self.ids.hash_one(id), |s| {
                entry(slots, *s).id.as_ref() == id
            })
            .copied()
    }

    pub(super) fn get(&self, id: &str) -> Option<&Entry> {
        self.slot_of(id).map(|s| entry(&self.slots, s))
    }

    /// The task created by the message of idempotency key `key`, decoded
    /// (what confirms a hash's match).
    pub(super) fn find_origin(&self, key: &[u8]) -> Result<Option<(u32, StoredTask)>, StoreError> {
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
    pub(super) fn add(&mut self, entry_: Entry) -> u32 {
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
    pub(super) fn remove(&mut self, slot: u32) -> Option<Entry> {
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
    pub(super) fn index(&mut self, time: TimeKey, slot: u32, owner: Option<&Owner>) {
        if let Some(owner) = owner {
            self.by_owner
                .entry(owner.clone())
                .or_default()
                .insert(time, slot, &self.slots);
        }
        self.order.insert(time, slot, &self.slots);
    }

    /// Takes `slot` out of the orders.
    pub(super) fn unindex(&mut self, time: TimeKey, slot: u32, owner: Option<&Owner>) {
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

    pub(super) fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.slots.iter().map(|(_, e)| e)
    }
}
