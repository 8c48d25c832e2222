//! Committing a live task's accepted events: one store write at a time per
//! task, each carrying every event accepted since the last; only after it
//! commits are its events broadcast, its waiters told and its follow-up
//! runs admitted. A failed write is rebased (another writer moved the
//! task) or dropped, and everyone waiting on it hears why.

use std::sync::Arc;

use super::live::{FLUSH_BATCH_EVENTS, LiveTask};
use super::loaded::{Loaded, MIN_CHANGES_BEFORE_WHOLE, Pending, Signal, policy};
use super::{Shared, now, store_error};
use crate::lifecycle::{Change, Changes, TaskEvent, TaskRecord};
use crate::proto::{StreamResponse, TaskState, stream_response::Payload};
use crate::store::{Body, EncodedTask, OutboxEntry, StoreError};

impl LiveTask {
    /// Commits accepted events in order, one store write per round, until
    /// none are left: take the next write under the lock, write it without
    /// the lock, then publish what it committed (or handle its failure)
    /// under the lock again.
    ///
    /// Boxed, for its task (tokio copies a future whole on its way into a
    /// task and as the task ends, and a flush's is large), and typed so,
    /// as a flush may start another.
    pub(super) fn flush(
        self: Arc<Self>,
        shared: Arc<Shared>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        Box::pin(self.flush_from(shared, false))
    }

    /// The flush an agent's run owes once the agent is done: its events
    /// are all in, so the first write is made at once, without the turn a
    /// background flush gives its emitter (a run's driver,
    /// `sink::Driven`). When the store answers at once, this commits them
    /// without a task of its own.
    pub(super) async fn flush_now(self: Arc<Self>, shared: Arc<Shared>) {
        self.flush_from(shared, true).await
    }

    async fn flush_from(self: Arc<Self>, shared: Arc<Shared>, now: bool) {
        // Pending events seen at the last look, while the emitter was still
        // adding to them; none more are coming when `now` (which makes one
        // write at most, see below).
        let mut seen = if now { usize::MAX } else { 0 };
        loop {
            // Let the emitter that started this flush go on first: events it
            // emits right away join this write instead of needing another.
            if !now {
                tokio::task::yield_now().await;
            }
            let (write, version, count, changes) = match self.next_write(&mut seen, &shared).await {
                NextWrite::Done => return,
                NextWrite::Gather => continue,
                NextWrite::Write {
                    write,
                    version,
                    count,
                    changes,
                } => (write, version, count, changes),
            };
            // Version 0: the task is new, and this write creates it.
            // Timed only when counted (a clock read per write otherwise).
            let started = shared.store_metrics.is_some().then(std::time::Instant::now);
            let result = if version == 0 {
                shared.store.create_encoded(&self.key.tenant, &write).await
            } else {
                shared
                    .store
                    .update_encoded(&self.key.tenant, &write, version)
                    .await
            };
            if let (Some(metrics), Some(started)) = (&shared.store_metrics, started) {
                metrics.written(started.elapsed(), result.is_ok());
            }
            let mut guard = self.state.lock().await;
            let Some(loaded) = guard.as_mut() else { return };
            let go_on = match result {
                Ok(version) => {
                    self.committed(&shared, loaded, &write, version, count, changes);
                    // Nothing came in during the write: the flush ends
                    // here, under the lock it holds, rather than after
                    // another turn and another look.
                    if loaded.pending.is_empty() {
                        loaded.flushing = false;
                        return;
                    }
                    true
                }
                Err(e) => self.write_failed(&shared, loaded, version, e).await,
            };
            if !go_on {
                *guard = None;
                return;
            }
            if now {
                // More to write (events from elsewhere, or a write to
                // retry): a flush of its own takes it, so that the run
                // that owed this one ends after its own events, however
                // many others keep coming.
                drop(guard);
                tokio::spawn(self.flush(shared));
                return;
            }
        }
    }

    /// What the flush writes next: nothing (and the flush ends), nothing
    /// yet (events are still arriving), or the task with its pending
    /// events, encoded under the lock (no copy of the task itself): what
    /// they changed, or the whole task (a create, a terminal write, or
    /// once the changes since the last whole write outweigh it, see
    /// [`MIN_CHANGES_BEFORE_WHOLE`]); with a store shared by replicas,
    /// their stream events too.
    async fn next_write(&self, seen: &mut usize, shared: &Shared) -> NextWrite {
        use prost::Message as _;
        let mut guard = self.state.lock().await;
        let Some(loaded) = guard.as_mut() else {
            return NextWrite::Done;
        };
        if loaded.pending.is_empty() {
            loaded.flushing = false;
            return NextWrite::Done;
        }
        // Events arrived since the last look: the emitter is producing as
        // fast as it runs, so wait one more turn (up to FLUSH_BATCH_EVENTS)
        // and commit them together. Committing each turn's one or two
        // events instead made every subscriber's stream wake, encode and
        // write per event (measured with 64 subscribers: 8 times the socket
        // writes of a plain broadcast, and 2.5 times its CPU per event). An
        // emitter that pauses is committed after one extra turn; a task
        // already terminal has nothing more coming.
        let n = loaded.pending.len();
        if n > *seen && n < FLUSH_BATCH_EVENTS && !loaded.record.state().is_terminal() {
            *seen = n;
            return NextWrite::Gather;
        }
        *seen = 0;
        // An event applied before the task was stored logged no changes:
        // the write carrying it is whole, and what it changed is read
        // back from that record (`committed`).
        let unlogged = loaded.pending.iter().any(|p| !p.logged);
        let mut changes: Vec<Change> = loaded
            .pending
            .iter_mut()
            .flat_map(|p| std::mem::take(&mut p.changes))
            .collect();
        // The trace is set on the working copy, not through an event.
        let committed = loaded.committed.as_ref().unwrap_or(&loaded.record);
        if committed.trace != loaded.record.trace {
            changes.push(Change::Trace(loaded.record.trace.clone()));
        }
        let changes = Changes::new(changes);
        let whole = loaded.version == 0
            || unlogged
            || !shared.keeps_changes
            || loaded.record.state().is_terminal()
            || loaded.changes_bytes + changes.encoded_len()
                >= loaded.whole_bytes.max(MIN_CHANGES_BEFORE_WHOLE);
        let body = if whole {
            Body::Whole(
                if shared.compact_records {
                    crate::store::codec::encode_compact(&loaded.record)
                } else {
                    crate::store::codec::encode(&loaded.record)
                }
                .into(),
            )
        } else {
            Body::Changes(changes.encode_to_vec().into())
        };
        // A whole write of a running task logs its changes too, for the
        // replicas following it ([`EncodedTask::logged`]); a terminal one
        // does not: a finished task is kept as one record.
        let replicated = shared.replicas().is_some();
        let logged = (whole
            && replicated
            && shared.keeps_changes
            && loaded.version > 0
            && !loaded.record.state().is_terminal())
        .then(|| changes.encode_to_vec().into());
        let mut write = EncodedTask::of(&loaded.record, body);
        write.logged = logged;
        write.outbox = outbox_entries(&loaded.record, &loaded.pending);
        write.by_run = loaded.pending.iter().any(|p| p.author.is_agent());
        // At most MAX_QUEUED_MESSAGES of them.
        let follow_ups = loaded.pending.iter().filter(|p| p.follow_up.is_some());
        write.owes_runs = u16::try_from(follow_ups.count()).unwrap_or(u16::MAX);
        if replicated {
            write.events = crate::store::codec::encode_events(
                loaded.pending.iter().filter_map(|p| p.out.as_ref()),
            );
        }
        NextWrite::Write {
            write: Box::new(write),
            version: loaded.version,
            count: loaded.pending.len(),
            changes: (!unlogged).then_some(changes),
        }
    }

    /// The first `count` pending events are committed at `version`:
    /// broadcast them, tell their waiters, answer a creating request, and
    /// admit the follow-up runs they carried.
    fn committed(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        loaded: &mut Loaded,
        write: &EncodedTask,
        version: u64,
        count: usize,
        changes: Option<Changes>,
    ) {
        let created = loaded.version == 0;
        loaded.version = version;
        match &write.body {
            Body::Whole(record) => {
                loaded.bytes = record.len();
                loaded.whole_bytes = record.len();
                loaded.changes_bytes = 0;
            }
            Body::Changes(changed) => loaded.changes_bytes += changed.len(),
        }
        if !write.outbox.is_empty() {
            shared.outbox.notify_one();
        }
        // The write created the task: the creating request is answered
        // with the task as created (SUBMITTED, spec §3.1.1), which the
        // committed copy held until now. When the write stored everything
        // accepted, the working copy is the committed one from now on, and
        // that copy becomes the answer as it is instead of being copied
        // for it and brought up to date (issue 32).
        let mut created_task = None;
        if created {
            created_task = match loaded.committed.take() {
                Some(copy) if count == loaded.pending.len() => Some(copy.task),
                Some(copy) => {
                    let task = copy.task.clone();
                    loaded.committed = Some(copy);
                    Some(task)
                }
                None => None,
            };
        }
        // The committed copy takes the write's changes (present while
        // events were pending), or without them (events applied before the
        // task was stored) becomes the whole record written.
        if let Some(committed) = &mut loaded.committed {
            let caught_up = match (changes, &write.body) {
                (Some(changes), _) => committed.replay_all(changes).map_err(|e| e.to_string()),
                (None, Body::Whole(record)) => crate::store::codec::decode(record)
                    .map(|record| *committed = record)
                    .map_err(|e| e.to_string()),
                (None, Body::Changes(_)) => Err("a write of changes none were logged for".into()),
            };
            if let Err(e) = caught_up {
                // Changes this process logged itself: not expected. The
                // working copy is the closest truth there is.
                tracing::error!(task_id = %self.key.id, error = %e, "the committed copy could not take a write's changes");
                loaded.committed = None;
            }
        }
        // Most writes take every pending event: the list itself, rather
        // than its items moved into a new one.
        let done: Vec<Pending> = if count == loaded.pending.len() {
            std::mem::take(&mut loaded.pending)
        } else {
            loaded.pending.drain(..count).collect()
        };
        if let Some(metrics) = &shared.config.metrics {
            count_committed(metrics, shared.agent(&self.key.tenant), version, &done);
        }
        let mut follow_ups = false;
        let mut handles = Vec::new();
        for p in done {
            self.publish(loaded, p.run, p.out);
            handles.extend(p.handle_to);
            for n in p.notify {
                let _ = n.send(Ok(()));
            }
            if let Some(answer) = p.answer {
                // Not expected: an answer travels with an event of the
                // creating write. The task as now committed then.
                let task = created_task
                    .take()
                    .unwrap_or_else(|| loaded.task().into_owned());
                answer.deliver(Ok(task), shared);
            }
            if let Some(seq) = p.follow_up {
                follow_ups = true;
                self.runs().mark_committed(seq);
            }
        }
        // The follow-ups' requests get their handles here, after every
        // event of the write is published and before their runs may start.
        for owed in handles {
            let handle = self.handle(loaded, owed.history, owed.subscribe, Some(owed.run));
            let _ = owed.tx.send(handle);
        }
        // A follow-up became ready, or a queue waits on a state just
        // committed (terminal: it is dropped).
        if follow_ups || (loaded.record.state().is_terminal() && !self.runs().queue.is_empty()) {
            self.dispatch_locked(shared, loaded);
        }
    }

    /// A write made from `version` failed with `e`: the pending events are
    /// rebased (another writer moved the task) or dropped, and their
    /// waiters told. False when the task is gone from memory (a create that
    /// failed, or a reload that did), which ends the flush.
    async fn write_failed(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        loaded: &mut Loaded,
        version: u64,
        e: StoreError,
    ) -> bool {
        match e {
            e if version == 0 => {
                // The create was refused (a repeat of the same message, or
                // the store failed): the task never existed.
                self.drop_pending(shared, loaded, e);
                false
            }
            StoreError::Conflict { .. } => {
                // Another writer moved the task: rebase what is pending on
                // the stored copy, or drop it all if it no longer applies.
                if let Err(e) = self.rebase(shared, loaded).await {
                    let restorable = loaded.committed.is_some();
                    self.drop_pending(shared, loaded, e);
                    // Nothing to restore the working copy from: forgotten,
                    // read again at its next use.
                    return restorable;
                }
                true
            }
            e => {
                tracing::error!(task_id = %self.key.id, error = %e, "task write failed");
                self.drop_pending(shared, loaded, e);
                // The working copy held the dropped events: reload.
                match shared.store.get(&self.key.tenant, &self.key.id).await {
                    Ok(Some(stored)) => {
                        loaded.reload(stored.record, stored.version);
                        true
                    }
                    _ => false,
                }
            }
        }
    }

    /// After a version conflict: catches up with the stored task (its
    /// writers' events reach this replica's subscribers first, as they
    /// were committed first) and re-applies the pending events to it.
    async fn rebase(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        loaded: &mut Loaded,
    ) -> Result<(), StoreError> {
        let up = self
            .stored_since(shared, loaded.version)
            .await?
            .ok_or_else(|| StoreError::NotFound(self.key.id.clone()))?;
        let (expected, actual) = (loaded.version, up.version);
        self.absorb_committed(shared, loaded, up).await?;
        // A copy to re-apply the pending events on: a whole task, but only
        // after a conflict (two writers of one task at once), not per write.
        let mut record = loaded.committed_record().clone();
        let mut outs = Vec::with_capacity(loaded.pending.len());
        for p in &mut loaded.pending {
            // Kept with a store shared by replicas, the only one where
            // another writer moves a task (`Pending::event`).
            let Some(event) = &p.event else {
                return Err(StoreError::Conflict {
                    id: format!(
                        "{} (moved by another writer of a store of one process)",
                        self.key.id
                    ),
                    expected,
                    actual,
                });
            };
            // A client message another replica took first (the same
            // message sent to both): it is not added twice, and the
            // request is answered as a repeat (`send_follow_up`).
            if let TaskEvent::UserMessage(m) = event
                && Self::holds_message_in(&record, &m.message_id)
            {
                return Err(StoreError::Conflict {
                    id: format!(
                        "{} (message {:?} is already in its history)",
                        self.key.id, m.message_id
                    ),
                    expected,
                    actual,
                });
            }
            p.changes.clear();
            p.logged = true;
            let out = record
                .apply_logged(
                    event.clone(),
                    now(),
                    policy(shared, p.author),
                    p.author.cause(),
                    &mut p.changes,
                )
                .map_err(|e| StoreError::Conflict {
                    id: format!("{} ({e})", self.key.id),
                    expected,
                    actual,
                })?;
            outs.push(out);
        }
        for (p, out) in loaded.pending.iter_mut().zip(outs) {
            p.out = out;
        }
        loaded.record = record;
        Ok(())
    }

    /// Drops every pending event after a failed commit: their waiters get
    /// the error, open streams end with it (they must not hang waiting for
    /// events that were never recorded), blocking waiters wake up, and the
    /// agent hears of it at its next event.
    fn drop_pending(self: &Arc<Self>, shared: &Arc<Shared>, loaded: &mut Loaded, e: StoreError) {
        // Only an agent that lost events must hear of it; a client whose
        // message was dropped is told by its own request.
        let agent_lost = loaded.pending.iter().any(|p| p.author.is_agent());
        for p in loaded.pending.drain(..) {
            for n in p.notify {
                let _ = n.send(Err(e.clone()));
            }
            if let Some(answer) = p.answer {
                answer.deliver(Err(&e), shared);
            }
            if let Some(seq) = p.follow_up {
                // Its message never reached history (or another replica
                // took it): no run for it here. With nothing before it
                // still to run, waiters may count it as over.
                let mut runs = self.runs();
                runs.queue.retain(|q| q.seq != seq);
                if !runs.active && runs.queue.iter().all(|q| q.seq > seq) {
                    drop(runs);
                    self.advance(|p| p.runs_finished = p.runs_finished.max(seq));
                }
            }
        }
        if let Some(tx) = &loaded.events {
            let _ = tx.send(Arc::new(Signal::Failed(store_error(e.clone()))));
        }
        // Back to the committed copy (always present while events were
        // pending).
        if let Some(record) = &loaded.committed {
            loaded.record = record.clone();
        }
        if agent_lost {
            loaded.failure = Some(e);
        }
        // The working copy held the dropped events: it is the committed
        // copy again (the task as stored at `version`), so that nothing
        // here answers from or builds on events never recorded (the fault
        // harness met a retried follow-up answered as already taken, from
        // a copy that held it after its write was dropped). Without a
        // committed copy (it could not be kept in step) the caller reads
        // the store again or forgets the task.
        if let Some(committed) = loaded.committed.take() {
            let version = loaded.version;
            loaded.reload(committed, version);
        }
        self.advance(|p| p.write_failures += 1);
        // The queue may now start (its head was dropped, or a terminal
        // state that held it back was).
        self.dispatch_locked(shared, loaded);
    }
}

/// The push notifications a write of these pending events makes due: each
/// status and artifact update (spec §4.3: what a stream would carry), to
/// each of the task's configs, in order, written by the same store write
/// (the outbox). Nothing to do, and no encoding, for a task without
/// configs. A protocol 0.3 client's config gets the task instead, once
/// per write ([`crate::lifecycle::Protocol`]).
fn outbox_entries(record: &TaskRecord, pending: &[Pending]) -> Vec<OutboxEntry> {
    use crate::lifecycle::Protocol;
    use prost::Message as _;
    let configs = &record.push_configs;
    let mut events = pending.iter().filter_map(|p| p.out.as_ref()).peekable();
    if configs.is_empty() || events.peek().is_none() {
        return Vec::new();
    }
    let of = |protocol| {
        configs
            .iter()
            .filter(move |c| record.push_protocol(&c.id) == protocol)
    };
    let mut entries = Vec::new();
    // A 0.3 webhook gets the task as this write leaves it, once per write:
    // 0.3 notifications carry the task, not the event.
    if !record.v0_3_push_configs.is_empty() {
        let event = StreamResponse {
            payload: Some(Payload::Task(record.task.clone())),
        }
        .encode_to_vec();
        entries.extend(of(Protocol::V0_3).map(|c| OutboxEntry {
            config_id: c.id.clone(),
            event: event.clone(),
        }));
    }
    if record.v0_3_push_configs.len() < configs.len() {
        for out in events {
            let event = out.encode_to_vec();
            entries.extend(of(Protocol::V1_0).map(|c| OutboxEntry {
                config_id: c.id.clone(),
                event: event.clone(),
            }));
        }
    }
    entries
}

/// Counts a commit at `version` of the events `done`: a task created
/// (version 1), and each state it reached (the created task's, and each
/// status update's).
fn count_committed(
    metrics: &crate::metrics::Metrics,
    agent: &crate::metrics::AgentCounters,
    version: u64,
    done: &[Pending],
) {
    // Every task is created SUBMITTED (`TaskRecord::submitted`); the
    // creating write carries a Task snapshot only when the task is
    // streamed, so its first state is counted here, not from that.
    if version == 1 {
        metrics.tasks.created(agent);
        metrics.tasks.reached(agent, TaskState::Submitted);
    }
    for p in done {
        let status = match p.out.as_ref().and_then(|o| o.payload.as_ref()) {
            Some(Payload::StatusUpdate(u)) => u.status.as_ref(),
            _ => None,
        };
        if let Some(state) = status.and_then(|s| TaskState::try_from(s.state).ok()) {
            metrics.tasks.reached(agent, state);
        }
    }
}

/// What a flush does next ([`LiveTask::next_write`]).
enum NextWrite {
    /// Nothing is pending: the flush ends.
    Done,
    /// Events are still arriving: look again after a turn.
    Gather,
    /// Write the task, made from `version`, committing `count` events,
    /// which made `changes` (none when one of them logged none: the write
    /// is whole).
    Write {
        write: Box<EncodedTask>,
        version: u64,
        count: usize,
        changes: Option<Changes>,
    },
}
