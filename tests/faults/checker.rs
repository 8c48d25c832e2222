//! The checker: reads the history, the replicas' logs and the final state
//! of every task, and reports each violation of the promises below with
//! its evidence. See the test's module documentation for the checks and
//! the rules they follow (what a timeout means, what a paused run's end
//! is, what identifies an event).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::fmt;
use std::time::Duration;

use a2a_lifecycle::proto::{Role, Task, TaskState};

use crate::cluster::LogLine;
use crate::history::{
    Call, Clock, EventKey, Fault, Item, MessageKind, Outcome, Records, Sent, StreamEnd, StreamLog,
    T, active, log_line_wall_us, state_name, terminal,
};

/// One process's log, as the checker reads it.
pub struct ProcessLog {
    pub name: String,
    pub slot: usize,
    pub started: T,
    pub died: Option<T>,
    pub lines: Vec<LogLine>,
}

/// What the checker reads.
pub struct Input<'a> {
    pub records: &'a Records,
    pub streams: &'a [StreamLog],
    /// Every task at the end, by id: its tenant and the task (whole
    /// history).
    pub tasks: &'a BTreeMap<String, (String, Task)>,
    /// Tasks a client was answered with that GetTask did not return: why.
    pub unreadable: &'a BTreeMap<String, String>,
    pub processes: &'a [ProcessLog],
    pub clock: &'a Clock,
    pub lease: Duration,
    /// When the faults ended (everything healed after).
    pub faults_ended: T,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Check {
    Shape,
    Acknowledged,
    Runs,
    Streams,
    Webhooks,
    Settled,
    Healthy,
}

impl Check {
    pub fn title(self) -> &'static str {
        match self {
            Check::Shape => "0. answers have the protocol's shape",
            Check::Acknowledged => {
                "1. an acknowledged message is in its task's history exactly once; \
                 an acknowledged state holds"
            }
            Check::Runs => {
                "2. one run per message; a task's runs never overlap; a committed \
                 follow-up runs"
            }
            Check::Streams => "3. every subscriber sees a window of one order of events",
            Check::Webhooks => {
                "4. each webhook gets every event in commit order, the terminal one last"
            }
            Check::Settled => "5. no task is left active after the faults stop",
            Check::Healthy => {
                "6. a replica untouched by faults keeps its lease and its tasks never fail"
            }
        }
    }
}

pub struct Violation {
    pub check: Check,
    pub what: String,
    pub evidence: Vec<String>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "- {}", self.what)?;
        for e in &self.evidence {
            writeln!(f, "    {e}")?;
        }
        Ok(())
    }
}

pub struct Report {
    pub violations: Vec<Violation>,
    pub stats: Vec<String>,
}

/// One agent run, from its process's log.
#[derive(Clone, Debug)]
pub struct Run {
    pub process: String,
    pub task_id: String,
    pub message_id: String,
    pub start: T,
    /// Its `agent run ended` line.
    pub ended: Option<T>,
    /// Its process's death, if it died.
    pub died: Option<T>,
}

impl fmt::Display for Run {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "run of message {} on {} {}..",
            self.message_id, self.process, self.start
        )?;
        match (self.ended, self.died) {
            (Some(e), _) => write!(f, "{e}"),
            (None, Some(d)) => write!(f, "(killed {d})"),
            (None, None) => write!(f, "(never ended)"),
        }
    }
}

/// Every run in the logs; what could not be read in them.
pub fn runs(processes: &[ProcessLog], clock: &Clock) -> (Vec<Run>, Vec<String>) {
    let mut runs = Vec::new();
    let mut problems = Vec::new();
    for p in processes {
        let mut open: HashMap<String, VecDeque<usize>> = HashMap::new();
        for line in &p.lines {
            let started = line.text.split("agent run started").nth(1);
            let ended = line.text.split("agent run ended").nth(1);
            if started.is_none() && ended.is_none() {
                continue;
            }
            let Some(at) = log_line_wall_us(&line.text).map(|us| clock.of_wall_us(us)) else {
                problems.push(format!(
                    "{}: a run line without a timestamp: {}",
                    p.name, line.text
                ));
                continue;
            };
            let fields = started.or(ended).unwrap_or_default();
            let task_id = field(fields, "task_id");
            if let Some(fields) = started {
                let (Some(task_id), Some(message_id)) = (task_id, field(fields, "message_id"))
                else {
                    problems.push(format!(
                        "{}: a run start without ids: {}",
                        p.name, line.text
                    ));
                    continue;
                };
                open.entry(task_id.clone())
                    .or_default()
                    .push_back(runs.len());
                runs.push(Run {
                    process: p.name.clone(),
                    task_id,
                    message_id,
                    start: at,
                    ended: None,
                    died: p.died,
                });
            } else {
                let Some(task_id) = task_id else {
                    problems.push(format!(
                        "{}: a run end without a task: {}",
                        p.name, line.text
                    ));
                    continue;
                };
                match open.get_mut(&task_id).and_then(VecDeque::pop_front) {
                    Some(i) => runs[i].ended = Some(at),
                    None => problems.push(format!(
                        "{}: a run of task {task_id} ended that never started: {}",
                        p.name, line.text
                    )),
                }
            }
        }
    }
    (runs, problems)
}

/// The value of `name=` among a log line's fields.
fn field(fields: &str, name: &str) -> Option<String> {
    fields
        .split_whitespace()
        .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
        .map(|v| v.trim_matches('"').to_owned())
}

/// The grace a stale run has, after its replica resumes or is healed, to
/// end: a lease (its renewal then finds the lease lost and stops it).
fn grace(lease: Duration) -> i64 {
    i64::try_from(lease.as_micros()).expect("a short lease")
}

/// The earliest its lease can have run out after a fault began: the
/// lease is renewed every third of it, so as early as two thirds of a
/// lease after the last renewal before the fault.
fn lease_out_after(fault: &Fault, lease: Duration) -> T {
    T(fault.start.0 + grace(lease) * 2 / 3)
}

/// The end of a run for the overlap check (see the module doc of the
/// test): its `agent run ended` line, or its process's death; but a run
/// whose process was paused or cut off from PostgreSQL long enough for its
/// lease to run out, and which ended within a lease of the fault being
/// undone, counts as ended when its lease could first have run out: from
/// then on it held nothing, and it must have written nothing.
fn effective_end(run: &Run, faults: &[&Fault], lease: Duration) -> (Option<T>, Option<String>) {
    let raw = run.ended.or(run.died);
    for f in faults {
        let stale_kind = f.kind == "pause" || f.kind == "cut";
        if !stale_kind || f.process.as_deref() != Some(&run.process) {
            continue;
        }
        let Some(undone) = f.end else { continue };
        let during = f.start >= run.start && raw.is_none_or(|e| f.start < e);
        let long = undone.0 - f.start.0 >= grace(lease) * 2 / 3;
        if during && long && raw.is_some_and(|e| e.0 <= undone.0 + grace(lease)) {
            let out = lease_out_after(f, lease).max(run.start);
            return (
                Some(out),
                Some(format!(
                    "stale from {out} ({f}); it ended {}",
                    raw.unwrap_or(out)
                )),
            );
        }
    }
    (raw, None)
}

/// A precedence graph of one task's events.
#[derive(Default)]
struct Order {
    after: HashMap<EventKey, BTreeSet<EventKey>>,
}

impl Order {
    fn add(&mut self, a: &EventKey, b: &EventKey) {
        if a != b {
            self.after.entry(a.clone()).or_default().insert(b.clone());
        }
        self.after.entry(b.clone()).or_default();
    }

    fn node(&mut self, a: &EventKey) {
        self.after.entry(a.clone()).or_default();
    }

    fn reaches(&self, from: &EventKey, to: &EventKey) -> bool {
        let mut seen = HashSet::new();
        let mut next = vec![from];
        while let Some(k) = next.pop() {
            for b in self.after.get(k).into_iter().flatten() {
                if b == to {
                    return true;
                }
                if seen.insert(b) {
                    next.push(b);
                }
            }
        }
        false
    }
}

/// A stream's run of events after one snapshot.
struct Segment<'a> {
    stream: &'a StreamLog,
    snapshot: Option<&'a EventKey>,
    events: Vec<(T, &'a EventKey)>,
}

fn segments(stream: &StreamLog) -> Vec<Segment<'_>> {
    let mut out: Vec<Segment<'_>> = Vec::new();
    for (at, item) in &stream.items {
        match item {
            Item::Snapshot { status, .. } => out.push(Segment {
                stream,
                snapshot: Some(status),
                events: Vec::new(),
            }),
            Item::Event(key) => {
                if out.is_empty() {
                    out.push(Segment {
                        stream,
                        snapshot: None,
                        events: Vec::new(),
                    });
                }
                if let Some(last) = out.last_mut() {
                    last.events.push((*at, key));
                }
            }
            Item::Message | Item::Malformed(_) => {}
        }
    }
    out
}

fn describe_stream(s: &StreamLog) -> String {
    s.to_string()
}

fn is_fanout(task: Option<&Task>) -> bool {
    task.and_then(|t| t.history.first())
        .is_some_and(|m| a2a_lifecycle::agent::message_text(m).starts_with("fanout:"))
}

fn task_status(task: &Task) -> Option<EventKey> {
    EventKey::of_status(task)
}

fn task_state(task: &Task) -> TaskState {
    task.status
        .as_ref()
        .and_then(|s| TaskState::try_from(s.state).ok())
        .unwrap_or(TaskState::Unspecified)
}

pub fn check(input: &Input<'_>) -> Report {
    let mut v: Vec<Violation> = Vec::new();
    let mut stats = Vec::new();
    let r = input.records;
    let lease = input.lease;
    let push = |v: &mut Vec<Violation>, check, what: String, evidence: Vec<String>| {
        v.push(Violation {
            check,
            what,
            evidence,
        })
    };

    // 0. Shape.
    for m in &r.malformed {
        push(&mut v, Check::Shape, m.clone(), Vec::new());
    }
    for c in &r.calls {
        if let Outcome::Error(code, _) = &c.outcome
            && matches!(
                code,
                tonic::Code::InvalidArgument
                    | tonic::Code::Unimplemented
                    | tonic::Code::PermissionDenied
                    | tonic::Code::Unauthenticated
            )
        {
            push(
                &mut v,
                Check::Shape,
                format!("a call refused as malformed (a harness bug?): {c}"),
                Vec::new(),
            );
        }
    }
    let (runs, problems) = runs(input.processes, input.clock);
    for p in problems {
        push(&mut v, Check::Shape, p, Vec::new());
    }

    // Indexes.
    let calls_of = |id: &str| -> Vec<String> {
        r.calls
            .iter()
            .filter(|c| c.message_id.as_deref() == Some(id))
            .map(|c| c.to_string())
            .collect()
    };
    let mut held: HashMap<&str, Vec<(&str, usize)>> = HashMap::new();
    for (id, (_, task)) in input.tasks {
        for (i, m) in task.history.iter().enumerate() {
            if m.role == Role::User as i32 {
                held.entry(m.message_id.as_str()).or_default().push((id, i));
            }
        }
    }
    let mut runs_of_message: HashMap<&str, Vec<&Run>> = HashMap::new();
    let mut runs_of_task: HashMap<&str, Vec<&Run>> = HashMap::new();
    for run in &runs {
        runs_of_message
            .entry(&run.message_id)
            .or_default()
            .push(run);
        runs_of_task.entry(&run.task_id).or_default().push(run);
    }
    let ours: HashSet<&str> = r.sent.iter().map(|s| s.message_id.as_str()).collect();
    let faults_of = |process: &str| -> Vec<&Fault> {
        r.faults
            .iter()
            .filter(|f| f.process.as_deref() == Some(process))
            .collect()
    };
    // The faults on the processes that ran or answered a message, from
    // two leases before its first call or run to two leases after its
    // last.
    let faults_of_message = |id: &str, runs: &[&Run]| {
        let calls: Vec<_> = r
            .calls
            .iter()
            .filter(|c| c.message_id.as_deref() == Some(id))
            .collect();
        let mut processes: BTreeSet<&str> = runs.iter().map(|r| r.process.as_str()).collect();
        processes.extend(calls.iter().map(|c| c.replica.as_str()));
        let starts = calls
            .iter()
            .map(|c| c.start)
            .chain(runs.iter().map(|r| r.start));
        let ends = calls
            .iter()
            .map(|c| c.end)
            .chain(runs.iter().map(|r| r.ended.or(r.died).unwrap_or(r.start)));
        let (Some(from), Some(to)) = (starts.min(), ends.max()) else {
            return Vec::new();
        };
        let margin = 2 * grace(lease);
        faults_on(&r.faults, &processes, T(from.0 - margin), T(to.0 + margin))
    };
    let describe_runs = |task_id: &str| -> Vec<String> {
        runs_of_task
            .get(task_id)
            .into_iter()
            .flatten()
            .map(|run| format!("{run}"))
            .collect()
    };

    // 1. Acknowledged messages, once; acknowledged states hold.
    for s in &r.sent {
        let places = held.get(s.message_id.as_str()).cloned().unwrap_or_default();
        let mut evidence: Vec<String> = places
            .iter()
            .map(|(task, i)| format!("in task {task} at history[{i}]"))
            .collect();
        evidence.extend(calls_of(&s.message_id));
        if s.acked && places.len() != 1 {
            push(
                &mut v,
                Check::Acknowledged,
                format!(
                    "acknowledged message {} ({:?}, tenant {:?}) is in final histories {} times",
                    s.message_id,
                    s.kind,
                    s.tenant,
                    places.len()
                ),
                evidence,
            );
        } else if !s.acked && places.len() > 1 {
            push(
                &mut v,
                Check::Acknowledged,
                format!(
                    "unacknowledged message {} is in final histories {} times",
                    s.message_id,
                    places.len()
                ),
                evidence,
            );
        } else if s.acked
            && let (Some(answered), Some((task, _))) = (&s.answered_task, places.first())
            && answered != task
        {
            push(
                &mut v,
                Check::Acknowledged,
                format!(
                    "message {} was answered with task {answered} but is held by task {task}",
                    s.message_id
                ),
                evidence,
            );
        }
    }
    for (id, why) in input.unreadable {
        push(
            &mut v,
            Check::Acknowledged,
            format!("task {id}, acknowledged to a client, cannot be read at the end: {why}"),
            describe_runs(id),
        );
    }
    for (id, (tenant, task)) in input.tasks {
        let first = task.history.first().map(|m| m.message_id.as_str());
        if !first.is_some_and(|m| ours.contains(m)) {
            push(
                &mut v,
                Check::Acknowledged,
                format!("task {id} (tenant {tenant:?}) was made by no message of ours: {first:?}"),
                describe_runs(id),
            );
        }
    }
    let finals: HashMap<&str, Option<EventKey>> = input
        .tasks
        .iter()
        .map(|(id, (_, t))| (id.as_str(), task_status(t)))
        .collect();
    let final_of = |id: &str| finals.get(id).cloned().flatten();
    for a in &r.answered {
        if a.status.terminal() && final_of(&a.task_id).as_ref() != Some(&a.status) {
            push(
                &mut v,
                Check::Acknowledged,
                format!(
                    "task {} was answered as {} but ended {}",
                    a.task_id,
                    a.status,
                    final_of(&a.task_id).map_or("unread".into(), |k| k.to_string())
                ),
                vec![a.call.clone()],
            );
        }
    }
    let mut answered_at: HashMap<&str, T> = HashMap::new();
    for a in &r.answered {
        let at = answered_at.entry(a.task_id.as_str()).or_insert(a.at);
        *at = (*at).min(a.at);
    }
    for c in &r.calls {
        if let (Outcome::Error(tonic::Code::NotFound, message), Some(task)) =
            (&c.outcome, &c.task_id)
            && answered_at
                .get(task.as_str())
                .is_some_and(|at| *at < c.start)
        {
            push(
                &mut v,
                Check::Acknowledged,
                format!("task {task}, acknowledged before, was not found: {message}"),
                vec![c.to_string()],
            );
        }
    }

    // 2. Runs.
    for s in &r.sent {
        let of = runs_of_message
            .get(s.message_id.as_str())
            .cloned()
            .unwrap_or_default();
        let evidence = || -> Vec<String> {
            let mut e = Vec::new();
            for run in &of {
                let task = match input.tasks.get(&run.task_id) {
                    Some((_, t)) => format!(
                        "its task {} ends {}",
                        run.task_id,
                        task_status(t).map_or("without a status".into(), |k| k.to_string())
                    ),
                    None => format!("its task {} was never committed", run.task_id),
                };
                e.push(format!("{run}: {task}"));
                e.extend(task_lines(input.processes, &run.process, &run.task_id));
            }
            e.extend(calls_of(&s.message_id));
            e.extend(faults_of_message(&s.message_id, &of));
            e
        };
        if of.len() > 1 {
            let committed: BTreeSet<&str> = of
                .iter()
                .filter(|run| input.tasks.contains_key(&run.task_id))
                .map(|run| run.task_id.as_str())
                .collect();
            push(
                &mut v,
                Check::Runs,
                format!(
                    "message {} ran {} times ({} of the runs' tasks committed)",
                    s.message_id,
                    of.len(),
                    committed.len()
                ),
                evidence(),
            );
        }
        // A task recorded as lost (an earlier run ended before the task
        // was stored; at most one run per message) has no run by design.
        let recorded_lost = s
            .answered_task
            .as_ref()
            .and_then(|id| input.tasks.get(id.as_str()))
            .is_some_and(|(_, t)| {
                task_state(t) == TaskState::Failed
                    && t.status
                        .as_ref()
                        .and_then(|st| st.message.as_ref())
                        .is_some_and(|m| {
                            a2a_lifecycle::agent::message_text(m)
                                == a2a_lifecycle::runtime::LOST_MESSAGE_FAILURE
                        })
            });
        if s.acked
            && s.kind == MessageKind::New
            && s.answered_task.is_some()
            && of.is_empty()
            && !recorded_lost
        {
            push(
                &mut v,
                Check::Runs,
                format!(
                    "acknowledged message {} made a task without a run",
                    s.message_id
                ),
                evidence(),
            );
        }
        if s.kind == MessageKind::FollowUp
            && of.is_empty()
            && let Some(task_id) = &s.task_id
            && let Some((_, task)) = input.tasks.get(task_id)
            && !terminal(task_state(task))
            && held
                .get(s.message_id.as_str())
                .is_some_and(|p| p.iter().any(|(t, _)| t == task_id))
        {
            let mut e = evidence();
            e.push(format!(
                "task {task_id} ends {}",
                task_status(task).map_or("without a status".into(), |k| k.to_string())
            ));
            e.extend(describe_runs(task_id));
            push(
                &mut v,
                Check::Runs,
                format!(
                    "follow-up {} ({}) is in task {task_id}'s history but never ran",
                    s.message_id,
                    if s.acked {
                        "acknowledged"
                    } else {
                        "not acknowledged"
                    }
                ),
                e,
            );
        }
    }
    for (task_id, of) in &runs_of_task {
        let mut of = of.clone();
        of.sort_by_key(|run| run.start);
        for (i, a) in of.iter().enumerate() {
            let faults = faults_of(&a.process);
            let (end, stale) = effective_end(a, &faults, lease);
            for b in &of[i + 1..] {
                if end.is_none_or(|e| e > b.start) {
                    let mut e = vec![format!("{a}"), format!("{b}")];
                    if let Some(stale) = &stale {
                        e.push(format!("the first counted as {stale}"));
                    }
                    e.extend(
                        faults
                            .iter()
                            .map(|f| format!("fault on {}: {f}", a.process)),
                    );
                    e.extend(
                        faults_of(&b.process)
                            .iter()
                            .map(|f| format!("fault on {}: {f}", b.process)),
                    );
                    push(
                        &mut v,
                        Check::Runs,
                        format!(
                            "two runs of task {task_id} overlap: on {} and {}",
                            a.process, b.process
                        ),
                        e,
                    );
                }
            }
        }
    }

    // 3. Streams, and the order of each task's events.
    let mut by_task: BTreeMap<&str, Vec<&StreamLog>> = BTreeMap::new();
    for s in input.streams {
        if let Some(t) = &s.task_id {
            by_task.entry(t).or_default().push(s);
        }
    }
    let mut orders: HashMap<&str, Order> = HashMap::new();
    for (task_id, streams) in &by_task {
        let task = input.tasks.get(*task_id).map(|(_, t)| t);
        let final_status = final_of(task_id);
        let order = orders.entry(task_id).or_default();
        let segs: Vec<Segment<'_>> = streams.iter().flat_map(|s| segments(s)).collect();
        for seg in &segs {
            let mut seen: HashMap<&EventKey, T> = HashMap::new();
            for (at, key) in &seg.events {
                if let Some(first) = seen.insert(key, *at) {
                    push(
                        &mut v,
                        Check::Streams,
                        format!("task {task_id}: a stream carried {key} twice"),
                        vec![describe_stream(seg.stream), format!("at {first} and {at}")],
                    );
                }
                if seg.snapshot == Some(*key) {
                    push(
                        &mut v,
                        Check::Streams,
                        format!("task {task_id}: a stream repeated its snapshot's status {key}"),
                        vec![describe_stream(seg.stream), format!("at {at}")],
                    );
                }
            }
            for w in seg.events.windows(2) {
                order.add(w[0].1, w[1].1);
            }
            for (_, key) in &seg.events {
                order.node(key);
            }
            if is_fanout(task) {
                let numbered: Vec<(u32, &EventKey, T)> = seg
                    .events
                    .iter()
                    .filter_map(|(at, k)| Some((k.fanout_number()?, *k, *at)))
                    .collect();
                for w in numbered.windows(2) {
                    if w[1].0 <= w[0].0 {
                        push(
                            &mut v,
                            Check::Streams,
                            format!(
                                "task {task_id}: a stream carried update {} after update {}",
                                w[1].0, w[0].0
                            ),
                            vec![
                                describe_stream(seg.stream),
                                format!("{} at {}", w[0].1, w[0].2),
                                format!("{} at {}", w[1].1, w[1].2),
                            ],
                        );
                    }
                }
            }
            // Nothing after a terminal event; the terminal one is final.
            if let Some(i) = seg.events.iter().position(|(_, k)| k.terminal()) {
                let (at, key) = seg.events[i];
                if let Some((later_at, later)) = seg.events.get(i + 1) {
                    push(
                        &mut v,
                        Check::Streams,
                        format!(
                            "task {task_id}: a stream carried {later} after the terminal {key}"
                        ),
                        vec![
                            describe_stream(seg.stream),
                            format!("terminal at {at}, then at {later_at}"),
                        ],
                    );
                }
                if final_status.as_ref() != Some(key) {
                    push(
                        &mut v,
                        Check::Streams,
                        format!(
                            "task {task_id}: a stream saw the terminal {key}, but the task ends {}",
                            final_status
                                .as_ref()
                                .map_or("unread".into(), |k| k.to_string())
                        ),
                        vec![describe_stream(seg.stream), format!("at {at}")],
                    );
                }
            }
        }
        // Pairwise: the events two streams both saw, in one order, and
        // none missing between them.
        for (i, a) in segs.iter().enumerate() {
            for b in &segs[i + 1..] {
                if std::ptr::eq(a.stream, b.stream) {
                    continue;
                }
                compare(task_id, a, b, &mut v);
            }
        }
        // A clean end comes after a terminal or interrupted state.
        for s in streams {
            if !matches!(s.end, Some((_, StreamEnd::Clean))) {
                continue;
            }
            let last = s.items.iter().rev().find_map(|(_, item)| match item {
                Item::Snapshot { status, .. } => Some(status),
                Item::Event(k) if k.state().is_some() => Some(k),
                _ => None,
            });
            let Some(last) = last else {
                push(
                    &mut v,
                    Check::Streams,
                    format!("task {task_id}: a stream ended cleanly without any status"),
                    vec![describe_stream(s)],
                );
                continue;
            };
            let state = last.state().unwrap_or(TaskState::Unspecified);
            if terminal(state) {
                if final_status.as_ref() != Some(last) {
                    push(
                        &mut v,
                        Check::Streams,
                        format!(
                            "task {task_id}: a stream ended cleanly at {last}, but the task ends {}",
                            final_status
                                .as_ref()
                                .map_or("unread".into(), |k| k.to_string())
                        ),
                        vec![describe_stream(s)],
                    );
                }
            } else if !matches!(state, TaskState::InputRequired | TaskState::AuthRequired) {
                push(
                    &mut v,
                    Check::Streams,
                    format!("task {task_id}: a stream ended cleanly while the task was {last}"),
                    vec![describe_stream(s)],
                );
            }
        }
    }
    // The agent's own order of a fanout's numbered updates.
    for (id, (_, task)) in input.tasks {
        if !is_fanout(Some(task)) {
            continue;
        }
        let order = orders.entry(id).or_default();
        let mut numbered: Vec<(u32, EventKey)> = order
            .after
            .keys()
            .filter_map(|k| Some((k.fanout_number()?, k.clone())))
            .collect();
        numbered.sort();
        for w in numbered.windows(2) {
            order.add(&w[0].1, &w[1].1);
        }
    }

    // 4. Webhooks.
    let mut posts: BTreeMap<(&str, &str), Vec<(T, &EventKey)>> = BTreeMap::new();
    for p in &r.posts {
        match &p.event {
            Ok(key) => posts
                .entry((p.task_id.as_str(), p.token.as_str()))
                .or_default()
                .push((p.at, key)),
            Err(why) => push(
                &mut v,
                Check::Shape,
                format!("task {}: a webhook POST that is no event: {why}", p.task_id),
                Vec::new(),
            ),
        }
    }
    // Configs registered: each push sender's task, whether or not it got
    // anything.
    let mut expected: BTreeSet<(&str, &str)> = BTreeSet::new();
    for s in r.sent.iter().filter(|s| s.kind == MessageKind::New) {
        let Some(token) = &s.push_token else { continue };
        for (task, _) in held.get(s.message_id.as_str()).into_iter().flatten() {
            expected.insert((task, token));
        }
    }
    let mut duplicates = 0;
    let empty = Vec::new();
    for key in expected.iter().chain(posts.keys()).collect::<BTreeSet<_>>() {
        let (task_id, token) = *key;
        let got = posts.get(key).unwrap_or(&empty);
        let where_ = format!("task {task_id}, webhook config {token}");
        let order = orders.get(task_id);
        let final_status = final_of(task_id);
        // Nothing new after the terminal event.
        let mut delivered: HashSet<&EventKey> = HashSet::new();
        let mut terminal_at: Option<(T, &EventKey)> = None;
        for (at, k) in got {
            let known = !delivered.insert(*k);
            duplicates += usize::from(known);
            match terminal_at {
                None if k.terminal() => terminal_at = Some((*at, k)),
                Some((t_at, t)) if *k != t => push(
                    &mut v,
                    Check::Webhooks,
                    if known {
                        format!(
                            "{where_}: a stale duplicate of {k} arrived after the terminal {t} \
                             (the receiver sees the task go on after its end)"
                        )
                    } else {
                        format!("{where_}: {k} arrived after the terminal {t}")
                    },
                    {
                        let mut e = vec![
                            format!("the terminal arrived at {t_at}, this at {at}"),
                            format!(
                                "push delivery around the terminal: {}",
                                role_holders(input.processes, t_at, lease)
                            ),
                            format!(
                                "push delivery around this: {}",
                                role_holders(input.processes, *at, lease)
                            ),
                        ];
                        e.extend(describe_runs(task_id));
                        e
                    },
                ),
                _ => {}
            }
        }
        // In commit order (duplicates aside).
        let mut firsts: Vec<(T, &EventKey)> = Vec::new();
        let mut seen: HashSet<&EventKey> = HashSet::new();
        for (at, k) in got {
            if seen.insert(*k) {
                firsts.push((*at, k));
            }
        }
        if let Some(order) = order {
            let mut reported = 0;
            'pairs: for (i, (a_at, a)) in firsts.iter().enumerate() {
                for (b_at, b) in &firsts[i + 1..] {
                    // Only an order the streams agree on (a cycle is
                    // their disagreement, check 3's).
                    if order.reaches(b, a) && !order.reaches(a, b) {
                        push(
                            &mut v,
                            Check::Webhooks,
                            format!(
                                "{where_}: {b} was committed before {a} but delivered after it"
                            ),
                            vec![format!("{a} arrived at {a_at}, {b} at {b_at}")],
                        );
                        reported += 1;
                        if reported >= 3 {
                            break 'pairs;
                        }
                    }
                }
            }
        }
        // Every event: what any stream saw, and the final status.
        let mut missing: Vec<String> = Vec::new();
        if let Some(order) = order {
            missing.extend(
                order
                    .after
                    .keys()
                    .filter(|k| !delivered.contains(k))
                    .map(|k| k.to_string()),
            );
        }
        if let Some(f) = &final_status
            && f.terminal()
            && !delivered.contains(f)
            && !order.is_some_and(|o| o.after.contains_key(f))
        {
            missing.push(f.to_string());
        }
        if !missing.is_empty() {
            missing.sort();
            let n = missing.len();
            missing.truncate(6);
            push(
                &mut v,
                Check::Webhooks,
                format!(
                    "{where_}: {n} committed events never delivered ({} POSTs got)",
                    got.len()
                ),
                missing,
            );
        }
        if let (Some((at, t)), Some(f)) = (terminal_at, &final_status)
            && t != f
        {
            push(
                &mut v,
                Check::Webhooks,
                format!("{where_}: the terminal event delivered is {t}, but the task ends {f}"),
                vec![format!("delivered at {at}")],
            );
        }
    }

    // 5. Nothing left active.
    for (id, (tenant, task)) in input.tasks {
        if active(task_state(task)) {
            let mut e = vec![format!(
                "status {}",
                task_status(task).map_or("none".into(), |k| k.to_string())
            )];
            e.extend(describe_runs(id));
            e.push(format!(
                "history: {:?}",
                task.history
                    .iter()
                    .map(|m| &m.message_id)
                    .collect::<Vec<_>>()
            ));
            push(
                &mut v,
                Check::Settled,
                format!(
                    "task {id} (tenant {tenant:?}) is still {:?} after the faults ended at {} and the system settled",
                    task_state(task),
                    input.faults_ended
                ),
                e,
            );
        }
    }

    // 6. A healthy replica's task is never failed as orphaned; a healthy
    // replica never loses its lease.
    let touched = |process: &str, from: T, to: T| -> Vec<String> {
        r.faults
            .iter()
            .filter(|f| f.process.as_deref() == Some(process) || f.slot.is_none())
            .filter(|f| {
                let end = f.end.unwrap_or(T(i64::MAX));
                f.start <= to && end.0 + 2 * grace(lease) >= from.0
            })
            .map(|f| f.to_string())
            .collect()
    };
    // The demo agents never fail a task themselves: a FAILED task was
    // failed by the system (as orphaned, after a lease loss, after a write
    // that did not commit), which a fault on the process that ran it must
    // explain.
    for (id, (_, task)) in input.tasks {
        let Some(status) = &task.status else { continue };
        if status.state != TaskState::Failed as i32 {
            continue;
        }
        let text = status
            .message
            .as_ref()
            .map(a2a_lifecycle::agent::message_text)
            .unwrap_or_default();
        let Some(ts) = &status.timestamp else {
            continue;
        };
        let failed_at = input.clock.of_timestamp(ts);
        if text == a2a_lifecycle::runtime::LOST_FOLLOW_UP_FAILURE {
            // Failed as owing a follow-up's run: a follow-up of this task,
            // in its history, never ran, and a fault touched a process
            // that took it between the call and the failure. (Not the last
            // run's process: the replica that took the follow-up may be
            // another.)
            let unrun: Vec<&str> = r
                .sent
                .iter()
                .filter(|s| s.kind == MessageKind::FollowUp)
                .filter(|s| s.task_id.as_deref() == Some(id.as_str()))
                .filter(|s| {
                    held.get(s.message_id.as_str())
                        .is_some_and(|p| p.iter().any(|(t, _)| t == id))
                })
                .filter(|s| !runs_of_message.contains_key(s.message_id.as_str()))
                .map(|s| s.message_id.as_str())
                .collect();
            let takers: Vec<&Call> = r
                .calls
                .iter()
                .filter(|c| c.message_id.as_deref().is_some_and(|m| unrun.contains(&m)))
                .collect();
            let explained = takers.iter().any(|c| {
                c.start <= failed_at && !touched(&c.replica, c.start, failed_at).is_empty()
            });
            if !explained {
                let mut e = vec![format!("failed at {failed_at}")];
                e.extend(takers.iter().map(|c| c.to_string()));
                e.extend(describe_runs(id));
                push(
                    &mut v,
                    Check::Healthy,
                    if unrun.is_empty() {
                        format!(
                            "task {id} was FAILED as owing a follow-up's run, but every follow-up in its history ran"
                        )
                    } else {
                        format!(
                            "task {id} was FAILED as owing the run of {unrun:?}, but no fault touched a replica that took it"
                        )
                    },
                    e,
                );
            }
            continue;
        }
        let last_run = runs_of_task.get(id.as_str()).and_then(|of| {
            of.iter()
                .filter(|run| run.start <= failed_at)
                .max_by_key(|run| run.start)
        });
        let Some(run) = last_run else { continue };
        if run.died.is_some_and(|d| d <= failed_at) {
            continue;
        }
        if touched(&run.process, run.start, failed_at).is_empty() {
            let mut e = vec![format!("failed at {failed_at}; {run}")];
            e.extend(lease_lines(
                input.processes,
                &run.process,
                T(run.start.0 - grace(lease)),
                failed_at,
            ));
            push(
                &mut v,
                Check::Healthy,
                format!(
                    "task {id} was FAILED ({text:?}) while {}, which ran it, was untouched by any fault",
                    run.process
                ),
                e,
            );
        }
    }
    for p in input.processes {
        let mut last_reported: Option<T> = None;
        for line in &p.lines {
            if !(line.text.contains("this replica lost its lease")
                || line.text.contains("this replica's lease ran out"))
            {
                continue;
            }
            // One loss, however many lines say it.
            if last_reported.is_some_and(|at| line.at.0 - at.0 < grace(lease)) {
                continue;
            }
            last_reported = Some(line.at);
            let from = T(line.at.0 - 3 * grace(lease));
            if touched(&p.name, from, line.at).is_empty() {
                push(
                    &mut v,
                    Check::Healthy,
                    format!(
                        "{} lost its lease at {} untouched by any fault",
                        p.name, line.at
                    ),
                    lease_lines(
                        input.processes,
                        &p.name,
                        T(line.at.0 - 2 * grace(lease)),
                        line.at,
                    ),
                );
            }
        }
    }

    // Figures.
    let mut calls: BTreeMap<String, usize> = BTreeMap::new();
    for c in &r.calls {
        let outcome = match &c.outcome {
            Outcome::Ok(_) => "ok".to_owned(),
            Outcome::Error(code, _) => format!("{code:?}"),
            Outcome::Timeout => "timeout".to_owned(),
        };
        *calls.entry(format!("{} {outcome}", c.kind)).or_default() += 1;
    }
    stats.push(format!("calls: {calls:?}"));
    let acked = r.sent.iter().filter(|s| s.acked).count();
    stats.push(format!(
        "messages: {} sent, {acked} acknowledged, {} not (may or may not be applied)",
        r.sent.len(),
        r.sent.len() - acked
    ));
    let mut states: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, t) in input.tasks.values() {
        *states.entry(state_name(task_state(t) as i32)).or_default() += 1;
    }
    stats.push(format!("tasks at the end: {states:?}"));
    let mut ends: BTreeMap<String, usize> = BTreeMap::new();
    for s in input.streams {
        let end = match &s.end {
            Some((_, StreamEnd::Error(code, _))) => format!("error {code:?}"),
            Some((_, e)) => format!("{e:?}"),
            None => "open".into(),
        };
        *ends.entry(end).or_default() += 1;
    }
    stats.push(format!("streams: {} ({ends:?})", input.streams.len()));
    stats.push(format!(
        "webhook POSTs: {} ({duplicates} duplicates) to {} configs",
        r.posts.len(),
        posts.len()
    ));
    stats.push(format!(
        "agent runs: {} ({} never logged an end)",
        runs.len(),
        runs.iter().filter(|run| run.ended.is_none()).count()
    ));
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for f in &r.faults {
        *kinds.entry(f.kind.as_str()).or_default() += 1;
    }
    stats.push(format!("faults: {kinds:?}"));
    Report {
        violations: v,
        stats,
    }
}

/// Two segments of different streams of one task: on the events both
/// saw, one order, and nothing one saw between two of them missing from
/// the other.
fn compare(task_id: &str, a: &Segment<'_>, b: &Segment<'_>, v: &mut Vec<Violation>) {
    let in_b: HashMap<&EventKey, usize> = b
        .events
        .iter()
        .enumerate()
        .map(|(i, (_, k))| (*k, i))
        .collect();
    let in_a: HashMap<&EventKey, usize> = a
        .events
        .iter()
        .enumerate()
        .map(|(i, (_, k))| (*k, i))
        .collect();
    let common: Vec<(usize, usize)> = a
        .events
        .iter()
        .enumerate()
        .filter_map(|(i, (_, k))| Some((i, *in_b.get(k)?)))
        .collect();
    if common.is_empty() {
        return;
    }
    let evidence = || vec![describe_stream(a.stream), describe_stream(b.stream)];
    for w in common.windows(2) {
        if w[1].1 <= w[0].1 {
            let (x, y) = (a.events[w[0].0].1, a.events[w[1].0].1);
            let mut e = evidence();
            e.push(format!("first: {x} then {y}; second: the other way"));
            v.push(Violation {
                check: Check::Streams,
                what: format!("task {task_id}: two streams saw events in different orders"),
                evidence: e,
            });
            return;
        }
    }
    let (a_from, a_to) = (common[0].0, common[common.len() - 1].0);
    let (b_from, b_to) = (common[0].1, common[common.len() - 1].1);
    let lost_in_b = a.events[a_from..=a_to]
        .iter()
        .find(|(_, k)| !in_b.contains_key(k));
    let lost_in_a = b.events[b_from..=b_to]
        .iter()
        .find(|(_, k)| !in_a.contains_key(k));
    for (lost, (first, second)) in [(lost_in_b, (a, b)), (lost_in_a, (b, a))] {
        if let Some((at, k)) = lost {
            let mut e = evidence();
            e.push(format!(
                "{k} at {at} on the first, missing between the same events on the second"
            ));
            v.push(Violation {
                check: Check::Streams,
                what: format!(
                    "task {task_id}: stream #{} lost an event stream #{} saw",
                    second.stream.id, first.stream.id
                ),
                evidence: e,
            });
        }
    }
}

/// Which processes said they took or gave up the push delivery role, or
/// failed to remove delivered outbox entries, within two leases of `at`.
fn role_holders(processes: &[ProcessLog], at: T, lease: Duration) -> String {
    let window = 2 * grace(lease);
    let mut said = Vec::new();
    for p in processes {
        let mut not_removed = 0;
        for line in &p.lines {
            if (line.at.0 - at.0).abs() > window {
                continue;
            }
            if line.text.contains("delivering push notifications") {
                said.push(format!("{} took the role at {}", p.name, line.at));
            } else if line.text.contains("delivers push notifications now")
                || line.text.contains("push delivery role")
            {
                said.push(format!("{} gave the role up at {}", p.name, line.at));
            } else if line.text.contains("push outbox entry not removed") {
                not_removed += 1;
            }
        }
        if not_removed > 0 {
            said.push(format!(
                "{} could not remove {not_removed} delivered outbox entries",
                p.name
            ));
        }
    }
    if said.is_empty() {
        "nothing logged".into()
    } else {
        said.join(", ")
    }
}

/// The faults on `processes` (and PostgreSQL's) from `from` to `to`.
fn faults_on(faults: &[Fault], processes: &BTreeSet<&str>, from: T, to: T) -> Vec<String> {
    faults
        .iter()
        .filter(|f| f.process.as_deref().is_some_and(|p| processes.contains(p)) || f.slot.is_none())
        .filter(|f| f.start <= to && f.end.is_none_or(|end| end >= from))
        .map(|f| format!("fault: {f}"))
        .collect()
}

/// The warnings and errors `process` logged about `task_id` (a few).
fn task_lines(processes: &[ProcessLog], process: &str, task_id: &str) -> Vec<String> {
    processes
        .iter()
        .filter(|p| p.name == process)
        .flat_map(|p| &p.lines)
        .filter(|l| {
            l.text.contains(task_id) && (l.text.contains(" WARN ") || l.text.contains(" ERROR "))
        })
        .take(3)
        .map(|l| format!("  {process} at {}: {}", l.at, message_of(&l.text)))
        .collect()
}

/// A log line without its timestamp and spans: the level, the target, the
/// message and its fields.
fn message_of(line: &str) -> &str {
    let line = line
        .split_once(' ')
        .map_or(line, |(_, rest)| rest.trim_start());
    match line.rfind("}: ") {
        Some(i) => &line[i + 3..],
        None => line,
    }
}

/// The lease lines of `process` between `from` and `to`.
fn lease_lines(processes: &[ProcessLog], process: &str, from: T, to: T) -> Vec<String> {
    processes
        .iter()
        .filter(|p| p.name == process)
        .flat_map(|p| &p.lines)
        .filter(|l| l.at >= from && l.at <= to.plus_ms(100) && l.text.contains("lease"))
        .map(|l| format!("{} {}", l.at, message_of(&l.text)))
        .collect()
}

/// Every message, for the history file.
pub fn describe_sent(s: &Sent) -> String {
    format!(
        "{:?} {} tenant {:?} {:?} acked={} task={:?} answered={} push={:?} {}..{}",
        s.kind,
        s.message_id,
        s.tenant,
        s.text,
        s.acked,
        s.task_id,
        s.answered.as_ref().map_or("-".into(), |k| k.to_string()),
        s.push_token,
        s.first,
        s.last
    )
}
