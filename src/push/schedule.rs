//! The dispatcher's schedule of the outbox: one queue per config in commit
//! order, which heads are due, waiting for a time or a slot, or in flight,
//! and each principal's share of the backlog and of the slots.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::deliver::{
    MAX_IN_FLIGHT, MAX_IN_FLIGHT_PER_HOST, MAX_IN_FLIGHT_PER_PRINCIPAL, MAX_LOADED,
    MAX_LOADED_BYTES, MAX_LOADED_PER_PRINCIPAL, POLL_EVERY,
};
use super::hosts::{Hosts, lock};
use crate::store::Delivery;

pub(super) type QueueKey = (String, String, String);

/// Whose share a notification uses: the task's tenant and owner.
type PrincipalKey = (String, String);

pub(super) fn queue_of(delivery: &Delivery) -> QueueKey {
    (
        delivery.tenant.clone(),
        delivery.task_id.clone(),
        delivery.config_id.clone(),
    )
}

/// What an attempt came to for its outbox entry, for the schedule.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum DeliveryOutcome {
    /// The entry left the outbox: delivered, refused, given up, or its
    /// config is gone.
    Finished,
    /// It stays, with `attempts` made, until `not_before_ms`.
    Deferred { attempts: u32, not_before_ms: i64 },
    /// Its host had no slot free: nothing was tried.
    Parked(Arc<str>),
    /// The store failed; the entry is tried again after [`POLL_EVERY`].
    StoreFailed,
}

/// An attempt's end: its queue, what came of it, and the host whose slot
/// it gave back.
pub(super) struct Ended {
    pub(super) key: QueueKey,
    pub(super) done: DeliveryOutcome,
    pub(super) freed: Option<Arc<str>>,
}

/// The dispatcher's view of the outbox: what it has read (each queue's
/// entries in commit order), which queue heads are due, waiting for a time
/// or for a slot at their host, and in flight. The store is read once, in
/// `seq` order, from where the last read ended; the schedule keeps each
/// queue's order itself, so one queue's backlog costs the others nothing.
#[derive(Default)]
pub(super) struct Schedule {
    pub(super) read_up_to: u64,
    pub(super) loaded: usize,
    /// The events' bytes held in `queues`.
    loaded_bytes: usize,
    queues: HashMap<QueueKey, VecDeque<Delivery>>,
    /// Queues whose head is due, oldest first.
    ready: VecDeque<QueueKey>,
    /// Queues whose head waits for a time (ms since the epoch).
    timers: BinaryHeap<Reverse<(i64, QueueKey)>>,
    in_flight: HashSet<QueueKey>,
    /// Queues whose head waits for a slot at its host.
    parked: HashMap<Arc<str>, VecDeque<QueueKey>>,
    /// Each queue's principal.
    principal_of: HashMap<QueueKey, PrincipalKey>,
    /// Entries held per principal.
    held: HashMap<PrincipalKey, usize>,
    /// Attempts in flight per principal.
    principal_in_flight: HashMap<PrincipalKey, usize>,
    /// Queues whose head waits for a slot of its principal's.
    principal_parked: HashMap<PrincipalKey, VecDeque<QueueKey>>,
}

impl Schedule {
    /// Whether there is room to read more of the outbox.
    pub(super) fn can_read(&self) -> bool {
        self.loaded < MAX_LOADED && self.loaded_bytes < MAX_LOADED_BYTES
    }

    pub(super) fn add(&mut self, delivery: Delivery, now_ms: i64) {
        self.read_up_to = self.read_up_to.max(delivery.seq);
        self.loaded += 1;
        self.loaded_bytes += delivery.event.len();
        let key = queue_of(&delivery);
        let principal = (delivery.tenant.clone(), delivery.owner.clone());
        *self.held.entry(principal.clone()).or_default() += 1;
        self.principal_of.entry(key.clone()).or_insert(principal);
        let not_before = delivery.not_before_ms;
        let queue = self.queues.entry(key.clone()).or_default();
        queue.push_back(delivery);
        if queue.len() == 1 {
            self.queue_at(key, not_before, now_ms);
        }
    }

    /// Puts the queue in `ready`, or among the timers until its time.
    fn queue_at(&mut self, key: QueueKey, not_before_ms: i64, now_ms: i64) {
        if not_before_ms <= now_ms {
            self.ready.push_back(key);
        } else {
            self.timers.push(Reverse((not_before_ms, key)));
        }
    }

    /// Moves the queues whose time has come to `ready`; how long until the
    /// next one's does.
    pub(super) fn wake(&mut self, now_ms: i64) -> Option<Duration> {
        while let Some(Reverse((at, _))) = self.timers.peek() {
            if *at > now_ms {
                return Some(Duration::from_millis((*at - now_ms) as u64));
            }
            if let Some(Reverse((_, key))) = self.timers.pop() {
                self.ready.push_back(key);
            }
        }
        None
    }

    /// The next head to attempt, counted in flight from now on, while
    /// fewer than [`MAX_IN_FLIGHT`] are and its principal has fewer than
    /// [`MAX_IN_FLIGHT_PER_PRINCIPAL`] (else the queue waits for one of
    /// them to end).
    pub(super) fn start_next(&mut self) -> Option<Delivery> {
        while self.in_flight.len() < MAX_IN_FLIGHT {
            let key = self.ready.pop_front()?;
            let Some(head) = self.queues.get(&key).and_then(|q| q.front()) else {
                continue;
            };
            if self.in_flight.contains(&key) {
                continue;
            }
            let head = head.clone();
            let principal = self.principal_of.get(&key).cloned().unwrap_or_default();
            let busy = self
                .principal_in_flight
                .entry(principal.clone())
                .or_default();
            if *busy >= MAX_IN_FLIGHT_PER_PRINCIPAL {
                self.principal_parked
                    .entry(principal)
                    .or_default()
                    .push_back(key);
                continue;
            }
            *busy += 1;
            self.in_flight.insert(key);
            return Some(head);
        }
        None
    }

    /// A principal's attempt ended: one of its waiting queues may go.
    fn principal_freed(&mut self, key: &QueueKey) {
        let Some(principal) = self.principal_of.get(key) else {
            return;
        };
        if let Some(busy) = self.principal_in_flight.get_mut(principal) {
            *busy -= 1;
            if *busy == 0 {
                self.principal_in_flight.remove(principal);
            }
        }
        let principal = principal.clone();
        self.let_principal_go(&principal, 1);
    }

    /// Lets `n` of the queues waiting for a slot of `principal`'s go.
    fn let_principal_go(&mut self, principal: &PrincipalKey, n: usize) {
        if let Some(waiting) = self.principal_parked.get_mut(principal) {
            let_go(&self.queues, &self.in_flight, waiting, &mut self.ready, n);
            if waiting.is_empty() {
                self.principal_parked.remove(principal);
            }
        }
    }

    /// An entry leaves what is held.
    fn release(&mut self, key: &QueueKey, delivery: &Delivery) {
        self.loaded -= 1;
        self.loaded_bytes -= delivery.event.len();
        if let Some(principal) = self.principal_of.get(key)
            && let Some(n) = self.held.get_mut(principal)
        {
            *n -= 1;
            if *n == 0 {
                self.held.remove(principal);
            }
        }
    }

    /// While the backlog is full: gives up the newest entries of each
    /// principal holding more than [`MAX_LOADED_PER_PRINCIPAL`] (a queue's
    /// head only when it is not in flight), so that reading goes on for
    /// the others. Returns what was given up, for the store to drop.
    pub(super) fn shed(&mut self) -> Vec<Delivery> {
        if self.can_read() {
            return Vec::new();
        }
        let over: HashSet<PrincipalKey> = self
            .held
            .iter()
            .filter(|(_, n)| **n > MAX_LOADED_PER_PRINCIPAL)
            .map(|(p, _)| p.clone())
            .collect();
        let mut shed = Vec::new();
        if over.is_empty() {
            return shed;
        }
        let keys: Vec<QueueKey> = self
            .queues
            .keys()
            .filter(|k| self.principal_of.get(*k).is_some_and(|p| over.contains(p)))
            .cloned()
            .collect();
        for key in keys {
            let principal = self.principal_of[&key].clone();
            let keep = usize::from(self.in_flight.contains(&key));
            loop {
                let held = self.held.get(&principal).copied().unwrap_or(0);
                let Some(queue) = self.queues.get_mut(&key) else {
                    break;
                };
                if held <= MAX_LOADED_PER_PRINCIPAL || queue.len() <= keep {
                    break;
                }
                let Some(dropped) = queue.pop_back() else {
                    break;
                };
                let emptied = queue.is_empty();
                self.release(&key, &dropped);
                shed.push(dropped);
                if emptied {
                    // Its keys elsewhere (ready, timers, parked) find no
                    // queue and are passed over: a wake is not spent on
                    // one (`let_go`), and one already made ready is made
                    // good by `unpark_all`.
                    self.queues.remove(&key);
                    self.principal_of.remove(&key);
                    break;
                }
            }
        }
        shed
    }

    pub(super) fn ended(&mut self, ended: Ended, hosts: &Mutex<Hosts>, now_ms: i64) {
        let Ended { key, done, freed } = ended;
        if self.in_flight.remove(&key) {
            self.principal_freed(&key);
        }
        if let Some(host) = freed {
            self.unpark(&host, 1);
        }
        match done {
            DeliveryOutcome::Finished => {
                let Some(done) = self.queues.get_mut(&key).and_then(|q| q.pop_front()) else {
                    return;
                };
                self.release(&key, &done);
                match self.queues.get(&key).and_then(|q| q.front()) {
                    Some(next) => {
                        let not_before = next.not_before_ms;
                        self.queue_at(key, not_before, now_ms);
                    }
                    None => {
                        self.queues.remove(&key);
                        self.principal_of.remove(&key);
                    }
                }
            }
            DeliveryOutcome::Deferred {
                attempts,
                not_before_ms,
            } => {
                if let Some(head) = self.queues.get_mut(&key).and_then(|q| q.front_mut()) {
                    head.attempts = attempts;
                    head.not_before_ms = not_before_ms;
                }
                self.queue_at(key, not_before_ms, now_ms);
            }
            DeliveryOutcome::Parked(host) => {
                // Its slot may have come free before this was heard.
                let full = lock(hosts).is_full(&host);
                if full {
                    self.parked.entry(host).or_default().push_back(key);
                } else {
                    self.ready.push_back(key);
                }
            }
            DeliveryOutcome::StoreFailed => {
                self.queue_at(key, now_ms + POLL_EVERY.as_millis() as i64, now_ms);
            }
        }
    }

    /// Lets `n` of the queues waiting for `host` go.
    fn unpark(&mut self, host: &Arc<str>, n: usize) {
        if let Some(waiting) = self.parked.get_mut(host) {
            let_go(&self.queues, &self.in_flight, waiting, &mut self.ready, n);
            if waiting.is_empty() {
                self.parked.remove(host);
            }
        }
    }

    /// Lets as many queues go as their hosts and principals have slots
    /// free: for a slot that came free without an attempt there ending
    /// (checked when an attempt ends without having taken a slot, and each
    /// [`POLL_EVERY`]), or a wake spent on a queue shed after it was made
    /// ready. No more than that, or they would only be parked again.
    pub(super) fn unpark_all(&mut self, hosts: &Mutex<Hosts>) {
        let principals: Vec<(PrincipalKey, usize)> = self
            .principal_parked
            .keys()
            .map(|p| {
                let busy = self.principal_in_flight.get(p).copied().unwrap_or(0);
                (p.clone(), MAX_IN_FLIGHT_PER_PRINCIPAL.saturating_sub(busy))
            })
            .filter(|(_, n)| *n > 0)
            .collect();
        for (principal, n) in principals {
            self.let_principal_go(&principal, n);
        }
        if self.parked.is_empty() {
            return;
        }
        let free: Vec<(Arc<str>, usize)> = {
            let hosts = lock(hosts);
            self.parked
                .keys()
                .map(|h| {
                    (
                        h.clone(),
                        MAX_IN_FLIGHT_PER_HOST.saturating_sub(hosts.in_use(h)),
                    )
                })
                .filter(|(_, n)| *n > 0)
                .collect()
        };
        for (host, n) in free {
            self.unpark(&host, n);
        }
    }
}

/// Moves up to `n` of the `waiting` queues to `ready`, passing over (and
/// dropping) the keys of queues gone since they began to wait: shed while
/// the backlog was full, or started by another way. A wake spent on one of
/// them would leave a live queue waiting behind it for a slot that is free.
fn let_go(
    queues: &HashMap<QueueKey, VecDeque<Delivery>>,
    in_flight: &HashSet<QueueKey>,
    waiting: &mut VecDeque<QueueKey>,
    ready: &mut VecDeque<QueueKey>,
    n: usize,
) {
    let mut woken = 0;
    while woken < n {
        let Some(key) = waiting.pop_front() else {
            break;
        };
        if queues.contains_key(&key) && !in_flight.contains(&key) {
            ready.push_back(key);
            woken += 1;
        }
    }
}

/// Now, in milliseconds since the epoch: the schedule's clock.
pub(super) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::push::hosts::Gate;
    use crate::push::post::PostOutcome;
    use std::time::Instant;

    fn entry(seq: u64, task: &str) -> Delivery {
        owned_entry(seq, task, "u")
    }

    fn owned_entry(seq: u64, task: &str, owner: &str) -> Delivery {
        Delivery {
            seq,
            tenant: "t".into(),
            task_id: task.into(),
            owner: owner.into(),
            config_id: "hook".into(),
            event: Vec::new(),
            attempts: 0,
            not_before_ms: 0,
        }
    }

    /// One principal's tasks hold at most their share of the slots; the
    /// others' heads go past them, and its own go as its attempts end.
    #[test]
    fn a_principal_holds_at_most_its_share_of_the_slots() {
        let hosts = Mutex::new(Hosts::default());
        let mut schedule = Schedule::default();
        let mut seq = 0;
        for i in 0..MAX_IN_FLIGHT_PER_PRINCIPAL + 10 {
            seq += 1;
            schedule.add(owned_entry(seq, &format!("hog-{i}"), "hog"), 0);
        }
        seq += 1;
        schedule.add(owned_entry(seq, "other", "other"), 0);
        let mut started = Vec::new();
        while let Some(d) = schedule.start_next() {
            started.push(d);
        }
        let hog = started.iter().filter(|d| d.owner == "hog").count();
        assert_eq!(hog, MAX_IN_FLIGHT_PER_PRINCIPAL);
        assert!(started.iter().any(|d| d.owner == "other"), "the other went");
        // One of the hog's ends: one more of its own goes.
        let first = started.remove(0);
        schedule.ended(ended(&first, DeliveryOutcome::Finished), &hosts, 0);
        let next = schedule.start_next().expect("the hog's next");
        assert_eq!(next.owner, "hog");
        assert!(schedule.start_next().is_none());
    }

    /// With the backlog full, a principal over its share gives up its
    /// newest entries (never a head in flight) so reading can go on; one
    /// within its share loses nothing.
    #[test]
    fn a_full_backlog_sheds_the_principals_over_their_share() {
        let mut schedule = Schedule::default();
        let mut seq = 0;
        // The hog: one queue in flight and many of one entry each.
        for i in 0..MAX_LOADED - 100 {
            seq += 1;
            schedule.add(owned_entry(seq, &format!("hog-{}", i % 1000), "hog"), 0);
        }
        for i in 0..100 {
            seq += 1;
            schedule.add(owned_entry(seq, &format!("small-{i}"), "small"), 0);
        }
        assert!(!schedule.can_read());
        let in_flight: Vec<Delivery> = std::iter::from_fn(|| schedule.start_next()).collect();
        let shed = schedule.shed();
        assert!(shed.iter().all(|d| d.owner == "hog"), "only the hog's");
        assert_eq!(
            schedule.held[&("t".to_owned(), "hog".to_owned())],
            MAX_LOADED_PER_PRINCIPAL
        );
        assert_eq!(schedule.held[&("t".to_owned(), "small".to_owned())], 100);
        assert!(schedule.can_read(), "room to read again");
        // Every head in flight is still there.
        for d in &in_flight {
            let queue = &schedule.queues[&queue_of(d)];
            assert_eq!(queue.front().map(|h| h.seq), Some(d.seq));
        }
        assert_eq!(schedule.loaded, MAX_LOADED_PER_PRINCIPAL + 100);
    }

    /// Adds `hogs` one-entry queues of the hog's, made ready in order.
    fn full_of_hogs(schedule: &mut Schedule, hogs: usize) {
        for i in 0..hogs {
            schedule.add(owned_entry(i as u64 + 1, &format!("hog-{i}"), "hog"), 0);
        }
    }

    fn live(schedule: &Schedule, waiting: &VecDeque<QueueKey>) -> usize {
        waiting
            .iter()
            .filter(|k| schedule.queues.contains_key(*k))
            .count()
    }

    /// Queues parked for a full host and then shed leave their keys in the
    /// host's line; each slot the host gives back still lets a queue that
    /// is there go, not a wake spent on a queue that is gone (the stall
    /// the push suite saw: 5-10 deliveries a second with 36k pending).
    #[test]
    fn a_host_slot_lets_a_live_queue_go_past_shed_ones() {
        let hosts = Mutex::new(Hosts::default());
        let host: Arc<str> = "http://a:80".into();
        for _ in 0..MAX_IN_FLIGHT_PER_HOST {
            assert_eq!(lock(&hosts).enter(&host, Instant::now()), Gate::Go);
        }
        let mut schedule = Schedule::default();
        full_of_hogs(&mut schedule, MAX_LOADED);
        // Every queue is tried and parked for its host.
        while let Some(d) = schedule.start_next() {
            schedule.ended(ended(&d, DeliveryOutcome::Parked(host.clone())), &hosts, 0);
        }
        assert_eq!(schedule.parked[&host].len(), MAX_LOADED);
        let shed = schedule.shed();
        assert_eq!(shed.len(), MAX_LOADED - MAX_LOADED_PER_PRINCIPAL);
        let live_before = live(&schedule, &schedule.parked[&host]);
        assert_eq!(live_before, MAX_LOADED_PER_PRINCIPAL);
        // 200 slots come back, one attempt's end at a time: each lets one
        // live queue go, and it starts.
        let gone = ("t".to_owned(), "gone".to_owned(), "hook".to_owned());
        for n in 0..200 {
            schedule.ended(
                Ended {
                    key: gone.clone(),
                    done: DeliveryOutcome::Finished,
                    freed: Some(host.clone()),
                },
                &hosts,
                0,
            );
            let started = schedule.start_next();
            assert!(started.is_some(), "slot {n} woke a shed queue");
            assert!(schedule.start_next().is_none(), "one slot, one queue");
            let d = started.unwrap();
            schedule.ended(ended(&d, DeliveryOutcome::Finished), &hosts, 0);
        }
        assert_eq!(
            live(&schedule, &schedule.parked[&host]),
            MAX_LOADED_PER_PRINCIPAL - 200
        );
    }

    /// The same for a principal's line: queues waiting for a slot of their
    /// principal's and then shed do not take the wakes of its attempts'
    /// ends.
    #[test]
    fn a_principals_slot_lets_a_live_queue_go_past_shed_ones() {
        let hosts = Mutex::new(Hosts::default());
        let mut schedule = Schedule::default();
        full_of_hogs(&mut schedule, MAX_LOADED);
        let in_flight: Vec<Delivery> = std::iter::from_fn(|| schedule.start_next()).collect();
        assert_eq!(in_flight.len(), MAX_IN_FLIGHT_PER_PRINCIPAL);
        let principal = ("t".to_owned(), "hog".to_owned());
        assert_eq!(
            schedule.principal_parked[&principal].len(),
            MAX_LOADED - MAX_IN_FLIGHT_PER_PRINCIPAL
        );
        let shed = schedule.shed();
        assert_eq!(shed.len(), MAX_LOADED - MAX_LOADED_PER_PRINCIPAL);
        // Each of the hog's attempts that ends lets one more of its queues
        // start, for as long as it has any.
        let mut running = in_flight;
        for n in 0..500 {
            let d = running.remove(0);
            schedule.ended(ended(&d, DeliveryOutcome::Finished), &hosts, 0);
            let next = schedule.start_next();
            assert!(next.is_some(), "end {n} woke a shed queue");
            running.push(next.unwrap());
        }
        assert_eq!(running.len(), MAX_IN_FLIGHT_PER_PRINCIPAL);
    }

    /// A queue woken for its principal's slot and shed before it started
    /// spends that wake; the look each [`POLL_EVERY`] gives the principal's
    /// free slots to its waiting queues, so it does not run on fewer.
    #[test]
    fn a_wake_lost_to_shedding_is_made_good_by_the_look_at_every_line() {
        let hosts = Mutex::new(Hosts::default());
        let mut schedule = Schedule::default();
        full_of_hogs(&mut schedule, MAX_LOADED + MAX_IN_FLIGHT_PER_PRINCIPAL);
        let in_flight: Vec<Delivery> = std::iter::from_fn(|| schedule.start_next()).collect();
        // Every attempt ends: each makes one waiting queue ready...
        for d in &in_flight {
            schedule.ended(ended(d, DeliveryOutcome::Finished), &hosts, 0);
        }
        assert_eq!(schedule.ready.len(), MAX_IN_FLIGHT_PER_PRINCIPAL);
        // ...and the backlog sheds before they start: most of them go.
        let shed = schedule.shed();
        assert_eq!(shed.len(), MAX_LOADED - MAX_LOADED_PER_PRINCIPAL);
        let survivors = schedule
            .ready
            .iter()
            .filter(|k| schedule.queues.contains_key(*k))
            .count();
        assert!(
            survivors < MAX_IN_FLIGHT_PER_PRINCIPAL,
            "some woken queue was shed"
        );
        let started = std::iter::from_fn(|| schedule.start_next()).count();
        assert_eq!(started, survivors);
        schedule.unpark_all(&hosts);
        let more = std::iter::from_fn(|| schedule.start_next()).count();
        assert_eq!(
            started + more,
            MAX_IN_FLIGHT_PER_PRINCIPAL,
            "the principal's free slots are used"
        );
    }

    fn ended(delivery: &Delivery, done: DeliveryOutcome) -> Ended {
        Ended {
            key: queue_of(delivery),
            done,
            freed: None,
        }
    }

    #[test]
    fn a_queue_has_one_head_in_flight_and_keeps_its_order() {
        let hosts = Mutex::new(Hosts::default());
        let mut schedule = Schedule::default();
        for (seq, task) in [(1, "a"), (2, "a"), (3, "b"), (4, "a")] {
            schedule.add(entry(seq, task), 0);
        }
        assert_eq!(schedule.read_up_to, 4);
        let first = schedule.start_next().unwrap();
        let second = schedule.start_next().unwrap();
        assert_eq!((first.seq, second.seq), (1, 3), "one head per queue");
        assert!(
            schedule.start_next().is_none(),
            "a's next waits for its head"
        );
        schedule.ended(ended(&first, DeliveryOutcome::Finished), &hosts, 0);
        assert_eq!(schedule.start_next().unwrap().seq, 2);
        // A retry waits for its time and holds no slot meanwhile.
        schedule.ended(
            ended(
                &second,
                DeliveryOutcome::Deferred {
                    attempts: 1,
                    not_before_ms: 500,
                },
            ),
            &hosts,
            0,
        );
        assert!(schedule.start_next().is_none());
        assert_eq!(schedule.wake(100), Some(Duration::from_millis(400)));
        assert_eq!(schedule.wake(500), None);
        let retried = schedule.start_next().unwrap();
        assert_eq!((retried.seq, retried.attempts), (3, 1));
        assert_eq!(schedule.loaded, 3);
    }

    #[test]
    fn a_queue_parked_for_its_host_goes_when_a_slot_frees() {
        let hosts = Mutex::new(Hosts::default());
        let host: Arc<str> = "http://a:80".into();
        let mut schedule = Schedule::default();
        schedule.add(entry(1, "a"), 0);
        let head = schedule.start_next().unwrap();
        for _ in 0..MAX_IN_FLIGHT_PER_HOST {
            assert_eq!(lock(&hosts).enter(&host, Instant::now()), Gate::Go);
        }
        assert_eq!(lock(&hosts).enter(&host, Instant::now()), Gate::Full);
        schedule.ended(
            ended(&head, DeliveryOutcome::Parked(host.clone())),
            &hosts,
            0,
        );
        assert!(schedule.start_next().is_none(), "waits for its host");
        lock(&hosts).leave(&host, &PostOutcome::Delivered, Instant::now());
        schedule.unpark(&host, 1);
        assert_eq!(schedule.start_next().unwrap().seq, 1);
        // Parked after its host had room again: it goes at once.
        schedule.ended(
            ended(&head, DeliveryOutcome::Parked(host.clone())),
            &hosts,
            0,
        );
        assert_eq!(schedule.start_next().unwrap().seq, 1);
        // Parked while full; the slot comes free without the schedule
        // hearing of it (the attempt that had it went elsewhere): the
        // look at every parked host lets it go.
        assert_eq!(lock(&hosts).enter(&host, Instant::now()), Gate::Go);
        assert_eq!(lock(&hosts).enter(&host, Instant::now()), Gate::Full);
        schedule.ended(
            ended(&head, DeliveryOutcome::Parked(host.clone())),
            &hosts,
            0,
        );
        schedule.unpark_all(&hosts);
        assert!(schedule.start_next().is_none(), "still full");
        lock(&hosts).leave(&host, &PostOutcome::Delivered, Instant::now());
        schedule.unpark_all(&hosts);
        assert_eq!(schedule.start_next().unwrap().seq, 1);
    }

    #[test]
    fn a_store_failure_retries_after_a_poll_interval_and_bytes_bound_reading() {
        let hosts = Mutex::new(Hosts::default());
        let mut schedule = Schedule::default();
        let mut big = entry(1, "a");
        big.event = vec![0; MAX_LOADED_BYTES];
        schedule.add(big, 0);
        assert!(!schedule.can_read(), "a full byte budget stops reading");
        let head = schedule.start_next().unwrap();
        schedule.ended(ended(&head, DeliveryOutcome::StoreFailed), &hosts, 0);
        assert!(schedule.start_next().is_none());
        let poll = POLL_EVERY.as_millis() as i64;
        assert_eq!(schedule.wake(poll - 1), Some(Duration::from_millis(1)));
        assert_eq!(schedule.wake(poll), None);
        let head = schedule.start_next().unwrap();
        schedule.ended(ended(&head, DeliveryOutcome::Finished), &hosts, poll);
        assert!(schedule.can_read(), "room again");
        assert_eq!((schedule.loaded, schedule.loaded_bytes), (0, 0));
    }
}
