//! Idle broadcast rings, kept for the next task that is streamed.
//!
//! A task's events reach its subscribers through a tokio broadcast ring of
//! [`RuntimeConfig::subscriber_buffer`](super::RuntimeConfig) slots, made
//! when the task is first subscribed to. tokio builds every slot when it
//! makes a ring and visits every slot when it drops one: with the default
//! 512 slots that was about 9,400 instructions of a 137,000-instruction
//! SendStreamingMessage (issue 32), work that grows with the ring, not with
//! what the stream carries. A ring let go of with no receiver is kept here
//! instead and handed to the next task subscribed to.
//!
//! A kept ring carries nothing of its last task: a broadcast send with no
//! receiver stores nothing, a value is dropped from its slot once every
//! receiver alive when it was sent has read it, and a dropped receiver
//! releases what it had not read. A new receiver starts at the ring's
//! tail, so it sees only what is sent after it subscribed. Only a ring
//! with no receiver left is kept: receivers come from the ring's one
//! sender (never cloned) or from other receivers, so a kept ring has no
//! way back to the task that let it go.

use std::sync::Mutex;

use tokio::sync::broadcast;

use super::loaded::Broadcast;

/// How many idle rings are kept: enough for the streams a busy server
/// opens between two that end; each holds its slots' memory (about 40
/// bytes a slot, 20 KiB at the default 512) while idle.
pub const IDLE_RINGS: usize = 64;

/// Rings of one capacity (the runtime's subscriber buffer), idle.
pub(crate) struct IdleRings {
    capacity: usize,
    idle: Mutex<Vec<broadcast::Sender<Broadcast>>>,
}

impl IdleRings {
    pub(crate) fn new(capacity: usize) -> Self {
        IdleRings {
            capacity,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// A ring with no receiver: a kept one, or a new one.
    pub(crate) fn take(&self) -> broadcast::Sender<Broadcast> {
        self.lock()
            .pop()
            .unwrap_or_else(|| broadcast::channel(self.capacity).0)
    }

    /// Keeps `ring` for a later task when nothing can read from it any
    /// more and fewer than [`IDLE_RINGS`] are kept; drops it otherwise.
    pub(crate) fn give(&self, ring: broadcast::Sender<Broadcast>) {
        if ring.receiver_count() > 0 {
            return;
        }
        let mut idle = self.lock();
        if idle.len() < IDLE_RINGS {
            idle.push(ring);
        }
    }

    /// How many rings are kept now.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<broadcast::Sender<Broadcast>>> {
        // Nothing panics while it is held; a poisoned list is still a list
        // of rings with no receiver.
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::runtime::loaded::Signal;

    fn signal(n: u64) -> Broadcast {
        Arc::new(Signal::Event {
            run: n,
            event: Default::default(),
        })
    }

    fn run_of(b: &Broadcast) -> u64 {
        match &**b {
            Signal::Event { run, .. } => *run,
            _ => panic!("not an event"),
        }
    }

    #[test]
    fn a_ring_let_go_with_no_receiver_is_the_next_one_taken() {
        let rings = IdleRings::new(8);
        let ring = rings.take();
        let rx = ring.subscribe();
        drop(rx);
        let same = ring.clone();
        rings.give(ring);
        assert_eq!(rings.len(), 1);
        let taken = rings.take();
        assert!(
            taken.same_channel(&same),
            "the kept ring is handed out again"
        );
        assert_eq!(rings.len(), 0);
    }

    #[test]
    fn a_ring_something_can_still_read_from_is_not_kept() {
        let rings = IdleRings::new(8);
        let ring = rings.take();
        let _rx = ring.subscribe();
        rings.give(ring);
        assert_eq!(
            rings.len(),
            0,
            "a receiver of the old task would read the next task's events"
        );
    }

    #[test]
    fn no_more_than_the_limit_are_kept() {
        let rings = IdleRings::new(2);
        for _ in 0..IDLE_RINGS + 5 {
            let (ring, rx) = broadcast::channel(2);
            drop(rx);
            rings.give(ring);
        }
        assert_eq!(rings.len(), IDLE_RINGS);
    }

    #[test]
    fn a_kept_ring_carries_nothing_of_its_last_task() {
        let rings = IdleRings::new(4);
        let ring = rings.take();
        let mut sent = Vec::new();
        let mut send = |n| {
            let s = signal(n);
            sent.push(Arc::downgrade(&s));
            assert!(ring.send(s).is_ok(), "a receiver is subscribed");
        };
        // When they are all gone: one receiver has read part of what was
        // sent, one nothing, one fell behind the ring.
        let mut read_some = ring.subscribe();
        let mut lagged = ring.subscribe();
        (0..4).for_each(&mut send);
        for n in 0..4 {
            assert_eq!(run_of(&read_some.try_recv().expect("sent")), n);
        }
        let unread = ring.subscribe();
        (4..6).for_each(&mut send);
        assert_eq!(run_of(&read_some.try_recv().expect("sent")), 4);
        assert!(matches!(
            lagged.try_recv(),
            Err(broadcast::error::TryRecvError::Lagged(2))
        ));
        drop((read_some, unread, lagged));
        // With no receiver, a send stores nothing.
        assert!(ring.send(signal(99)).is_err());
        assert_eq!(ring.len(), 0, "nothing left in the ring's slots");
        assert!(
            sent.iter().all(|s| s.upgrade().is_none()),
            "every event of the last task dropped"
        );
        rings.give(ring);

        let ring = rings.take();
        let mut next = ring.subscribe();
        assert!(matches!(
            next.try_recv(),
            Err(broadcast::error::TryRecvError::Empty)
        ));
        assert!(ring.send(signal(7)).is_ok(), "a receiver is subscribed");
        assert_eq!(run_of(&next.try_recv().expect("sent")), 7);
        assert!(matches!(
            next.try_recv(),
            Err(broadcast::error::TryRecvError::Empty)
        ));
    }
}
