//! What the run did and saw, as the checker reads it: every call, every
//! logical message and how it was answered, every stream's items in
//! order, every webhook POST in arrival order, every fault. All times are
//! [`T`]s, microseconds since the run began, on one clock (the test's
//! monotonic clock; wall-clock times from the servers' logs and status
//! timestamps are mapped onto it through the wall time read at the start,
//! which is sound on one machine).

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use a2a_lifecycle::proto::part::Content;
use a2a_lifecycle::proto::{StreamResponse, Task, TaskState, stream_response::Payload};
use a2a_lifecycle::wkt::Timestamp;

/// A moment of the run: microseconds since it began.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct T(pub i64);

impl fmt::Display for T {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "+{:.3}s", self.0 as f64 / 1e6)
    }
}

impl T {
    pub fn plus_ms(self, ms: i64) -> T {
        T(self.0 + ms * 1000)
    }
}

/// The run's clock.
pub struct Clock {
    t0: Instant,
    t0_wall_us: i64,
}

impl Clock {
    pub fn new() -> Clock {
        let t0 = Instant::now();
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970");
        Clock {
            t0,
            t0_wall_us: i64::try_from(wall.as_micros()).expect("a sane wall clock"),
        }
    }

    pub fn now(&self) -> T {
        T(i64::try_from(self.t0.elapsed().as_micros()).expect("a run shorter than an age"))
    }

    /// A wall-clock time, in microseconds since 1970.
    pub fn of_wall_us(&self, us: i64) -> T {
        T(us - self.t0_wall_us)
    }

    /// The wall-clock time of `t`, in microseconds since 1970.
    pub fn wall_us(&self, t: T) -> i64 {
        t.0 + self.t0_wall_us
    }

    pub fn of_timestamp(&self, ts: &Timestamp) -> T {
        self.of_wall_us(ts.seconds * 1_000_000 + i64::from(ts.nanos) / 1000)
    }
}

/// Parses the leading RFC 3339 UTC timestamp of a text log line
/// (`2026-12-02T00:57:15.681372Z ...`) into microseconds since 1970;
/// `None` when the line does not start with one.
pub fn log_line_wall_us(line: &str) -> Option<i64> {
    let stamp = line.split_whitespace().next()?;
    let stamp = stamp.strip_suffix('Z')?;
    let (date, time) = stamp.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|p| p.parse::<i64>());
    let (h, min, s) = (t.next()?.ok()?, t.next()?.ok()?, t.next()?.ok()?);
    let digits = frac.len().min(6);
    let micros = frac[..digits].parse::<i64>().ok()? * 10i64.pow(6 - digits as u32);
    // Days since 1970-01-01 (Howard Hinnant's days_from_civil).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 86_400 + h * 3600 + min * 60 + s) * 1_000_000) + micros)
}

/// What identifies a committed event wherever it is seen (a stream, a
/// webhook): a status update by its state and the server's timestamp
/// (each commit stamps its own), with its message for the reader; an
/// artifact update by the artifact id, its append and last-chunk flags and
/// its content (the demo agents never send the same chunk twice).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventKey {
    Status {
        state: i32,
        at: (i64, i32),
        message_id: String,
        text: String,
    },
    Artifact {
        id: String,
        append: bool,
        last: bool,
        content: String,
    },
}

impl EventKey {
    /// The key of a status or artifact update; `None` for a Task or a
    /// Message, an error for an update missing what identifies it.
    pub fn of(event: &StreamResponse) -> Option<Result<EventKey, String>> {
        match event.payload.as_ref()? {
            Payload::Task(_) | Payload::Message(_) => None,
            Payload::StatusUpdate(u) => Some(match &u.status {
                None => Err(format!("a status update without a status: {u:?}")),
                Some(s) => match &s.timestamp {
                    None => Err(format!("a status update without a timestamp: {u:?}")),
                    Some(ts) => Ok(EventKey::Status {
                        state: s.state,
                        at: (ts.seconds, ts.nanos),
                        message_id: s
                            .message
                            .as_ref()
                            .map(|m| m.message_id.clone())
                            .unwrap_or_default(),
                        text: s
                            .message
                            .as_ref()
                            .map(a2a_lifecycle::agent::message_text)
                            .unwrap_or_default(),
                    }),
                },
            }),
            Payload::ArtifactUpdate(u) => Some(match &u.artifact {
                None => Err(format!("an artifact update without an artifact: {u:?}")),
                Some(a) => Ok(EventKey::Artifact {
                    id: a.artifact_id.clone(),
                    append: u.append,
                    last: u.last_chunk,
                    content: a
                        .parts
                        .iter()
                        .map(|p| match &p.content {
                            Some(Content::Text(text)) => text.clone(),
                            other => format!("{other:?}"),
                        })
                        .collect::<Vec<_>>()
                        .join("|"),
                }),
            }),
        }
    }

    /// The key of a task's current status.
    pub fn of_status(task: &Task) -> Option<EventKey> {
        let s = task.status.as_ref()?;
        let ts = s.timestamp.as_ref()?;
        Some(EventKey::Status {
            state: s.state,
            at: (ts.seconds, ts.nanos),
            message_id: s
                .message
                .as_ref()
                .map(|m| m.message_id.clone())
                .unwrap_or_default(),
            text: s
                .message
                .as_ref()
                .map(a2a_lifecycle::agent::message_text)
                .unwrap_or_default(),
        })
    }

    pub fn state(&self) -> Option<TaskState> {
        match self {
            EventKey::Status { state, .. } => TaskState::try_from(*state).ok(),
            EventKey::Artifact { .. } => None,
        }
    }

    pub fn terminal(&self) -> bool {
        self.state().is_some_and(terminal)
    }

    /// The sequence number a `fanout` update carries (status text or chunk
    /// text), if any.
    pub fn fanout_number(&self) -> Option<u32> {
        match self {
            EventKey::Status { text, .. } => text.parse().ok(),
            EventKey::Artifact { id, content, .. } if id == "fanout" => content.parse().ok(),
            EventKey::Artifact { .. } => None,
        }
    }
}

impl fmt::Display for EventKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EventKey::Status {
                state, at, text, ..
            } => {
                let name = TaskState::try_from(*state)
                    .map(|s| s.as_str_name().trim_start_matches("TASK_STATE_"))
                    .unwrap_or("?");
                let day = at.0.rem_euclid(86_400);
                write!(
                    f,
                    "status {name} {text:?} @{:02}:{:02}:{:02}.{:06}",
                    day / 3600,
                    day / 60 % 60,
                    day % 60,
                    at.1 / 1000
                )
            }
            EventKey::Artifact {
                id,
                append,
                last,
                content,
            } => write!(
                f,
                "artifact {id}{}{} {content:?}",
                if *append { "+append" } else { "" },
                if *last { "+last" } else { "" }
            ),
        }
    }
}

pub fn terminal(state: TaskState) -> bool {
    matches!(
        state,
        TaskState::Completed | TaskState::Failed | TaskState::Canceled | TaskState::Rejected
    )
}

pub fn active(state: TaskState) -> bool {
    matches!(state, TaskState::Submitted | TaskState::Working)
}

pub fn state_name(state: i32) -> &'static str {
    TaskState::try_from(state)
        .map(|s| s.as_str_name().trim_start_matches("TASK_STATE_"))
        .unwrap_or("?")
}

/// How a call ended.
#[derive(Clone, Debug)]
pub enum Outcome {
    /// Answered: what came back, in short.
    Ok(String),
    /// Answered with an error.
    Error(tonic::Code, String),
    /// No answer within the client's timeout: it may or may not have been
    /// applied.
    Timeout,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Ok(what) => write!(f, "ok {what}"),
            Outcome::Error(code, message) => {
                let message: String = message.chars().take(160).collect();
                write!(f, "error {code:?} {message:?}")
            }
            Outcome::Timeout => write!(f, "timeout (outcome unknown)"),
        }
    }
}

/// One call to one replica.
#[derive(Clone, Debug)]
pub struct Call {
    pub kind: &'static str,
    pub tenant: String,
    /// The process called (`r1.2`: replica 1's second process), or
    /// `r1 (down)` when none ran.
    pub replica: String,
    pub message_id: Option<String>,
    pub task_id: Option<String>,
    pub start: T,
    pub end: T,
    pub outcome: Outcome,
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}..{} {} on {}",
            self.kind, self.start, self.end, self.outcome, self.replica
        )?;
        if !self.tenant.is_empty() {
            write!(f, " tenant {}", self.tenant)?;
        }
        if let Some(m) = &self.message_id {
            write!(f, " message {m}")?;
        }
        if let Some(t) = &self.task_id {
            write!(f, " task {t}")?;
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessageKind {
    /// Creates a task.
    New,
    /// Continues a task.
    FollowUp,
}

/// One logical message: sent, and retried with the same id, until
/// answered or given up.
#[derive(Clone, Debug)]
pub struct Sent {
    pub message_id: String,
    pub tenant: String,
    pub kind: MessageKind,
    pub text: String,
    /// The task it continues (a follow-up) or that an answer named.
    pub task_id: Option<String>,
    /// An answer came (OK): the message was committed.
    pub acked: bool,
    /// The task the acknowledging answer named, and its status then.
    pub answered_task: Option<String>,
    pub answered: Option<EventKey>,
    /// The token of the push config it registered, if it did.
    pub push_token: Option<String>,
    pub first: T,
    pub last: T,
}

/// One item a stream carried.
#[derive(Clone, Debug)]
pub enum Item {
    /// A Task: the first item, or a resynchronisation; its status.
    Snapshot {
        task_id: String,
        status: EventKey,
    },
    Event(EventKey),
    /// A Message payload (none expected on these tasks).
    Message,
    /// An update that does not identify itself.
    Malformed(String),
}

/// How a stream ended.
#[derive(Clone, Debug)]
pub enum StreamEnd {
    /// The server ended it (`Ok(None)`).
    Clean,
    Error(tonic::Code, String),
    /// Nothing came for the idle limit; the client gave up on it.
    Stalled,
    /// The harness stopped reading at the end of the run.
    Stopped,
}

impl fmt::Display for StreamEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamEnd::Clean => write!(f, "cleanly"),
            StreamEnd::Error(code, message) => {
                let message: String = message.chars().take(160).collect();
                write!(f, "with {code:?} {message:?}")
            }
            StreamEnd::Stalled => write!(f, "stalled (given up)"),
            StreamEnd::Stopped => write!(f, "stopped by the harness"),
        }
    }
}

impl fmt::Display for StreamLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "stream #{} {} on {} from {}",
            self.id, self.kind, self.replica, self.start
        )?;
        if !self.tenant.is_empty() {
            write!(f, " tenant {}", self.tenant)?;
        }
        if let Some(m) = &self.message_id {
            write!(f, " message {m}")?;
        }
        write!(f, " ({} items, ", self.items.len())?;
        match &self.end {
            Some((at, end)) => write!(f, "ended {end} at {at})"),
            None => write!(f, "still open)"),
        }
    }
}

/// One stream: a SubscribeToTask or a SendStreamingMessage.
#[derive(Clone, Debug)]
pub struct StreamLog {
    pub id: usize,
    pub kind: &'static str,
    pub replica: String,
    pub tenant: String,
    pub task_id: Option<String>,
    pub message_id: Option<String>,
    pub start: T,
    pub items: Vec<(T, Item)>,
    pub end: Option<(T, StreamEnd)>,
}

/// One POST the webhook took.
#[derive(Clone, Debug)]
pub struct Post {
    pub at: T,
    pub task_id: String,
    /// `X-A2A-Notification-Token`: which config (one per creating message).
    pub token: String,
    pub event: Result<EventKey, String>,
}

/// A fault as the nemesis did it.
#[derive(Clone, Debug)]
pub struct Fault {
    pub kind: String,
    /// The replica slot, or none for PostgreSQL.
    pub slot: Option<usize>,
    /// The process it hit.
    pub process: Option<String>,
    pub start: T,
    /// When it was undone (resumed, healed, restarted, started again).
    pub end: Option<T>,
    /// For a pause or cut: the lease ran out while it lasted.
    pub past_lease: bool,
    pub note: String,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ", self.kind)?;
        if let Some(p) = &self.process {
            write!(f, "{p} ")?;
        } else if let Some(s) = self.slot {
            write!(f, "r{s} ")?;
        }
        match self.end {
            Some(end) => write!(f, "{}..{}", self.start, end)?,
            None => write!(f, "{}..(not undone)", self.start)?,
        }
        if !self.note.is_empty() {
            write!(f, " ({})", self.note)?;
        }
        if self.past_lease {
            write!(f, " past the lease")?;
        }
        Ok(())
    }
}

/// A status a client was answered with (a send's or cancel's task).
#[derive(Clone, Debug)]
pub struct Answered {
    pub task_id: String,
    pub status: EventKey,
    /// The call, described, and when it was answered.
    pub call: String,
    pub at: T,
}

#[derive(Default)]
pub struct Records {
    pub calls: Vec<Call>,
    pub answered: Vec<Answered>,
    pub malformed: Vec<String>,
    pub sent: Vec<Sent>,
    pub streams: Vec<Arc<Mutex<StreamLog>>>,
    pub posts: Vec<Post>,
    pub faults: Vec<Fault>,
}

/// The history, shared by every client, the nemesis and the webhook.
pub struct History {
    pub clock: Clock,
    records: Mutex<Records>,
}

impl History {
    pub fn new() -> History {
        History {
            clock: Clock::new(),
            records: Mutex::new(Records::default()),
        }
    }

    pub fn now(&self) -> T {
        self.clock.now()
    }

    pub fn lock(&self) -> MutexGuard<'_, Records> {
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn call(&self, call: Call) {
        self.lock().calls.push(call);
    }

    /// Records a call answered with `task` (its status).
    pub fn answered(&self, call: &Call, task: &Task) {
        let status = EventKey::of_status(task);
        let mut r = self.lock();
        match status {
            Some(status) => r.answered.push(Answered {
                task_id: task.id.clone(),
                status,
                call: call.to_string(),
                at: call.end,
            }),
            None => r.malformed.push(format!(
                "{call}: a task without a timestamped status: {task:?}"
            )),
        }
    }

    /// Records something a server sent that does not have the protocol's
    /// shape; the checker reports each.
    pub fn malformed(&self, what: String) {
        self.lock().malformed.push(what);
    }

    /// Records a new logical message; its index.
    pub fn sent(&self, sent: Sent) -> usize {
        let mut r = self.lock();
        r.sent.push(sent);
        r.sent.len() - 1
    }

    pub fn update_sent(&self, index: usize, f: impl FnOnce(&mut Sent)) {
        f(&mut self.lock().sent[index]);
    }

    pub fn stream(&self, log: StreamLog) -> Arc<Mutex<StreamLog>> {
        let mut r = self.lock();
        let mut log = log;
        log.id = r.streams.len();
        let log = Arc::new(Mutex::new(log));
        r.streams.push(log.clone());
        log
    }

    pub fn post(&self, post: Post) {
        self.lock().posts.push(post);
    }

    /// Records a fault begun; its index, for [`History::fault_done`].
    pub fn fault(&self, fault: Fault) -> usize {
        let mut r = self.lock();
        r.faults.push(fault);
        r.faults.len() - 1
    }

    pub fn fault_done(&self, index: usize, past_lease: bool, note: &str) {
        let end = self.now();
        let mut r = self.lock();
        let f = &mut r.faults[index];
        f.end = Some(end);
        f.past_lease = past_lease;
        if !note.is_empty() {
            if !f.note.is_empty() {
                f.note.push_str("; ");
            }
            f.note.push_str(note);
        }
    }
}

/// Locks a stream's log.
pub fn locked(log: &Mutex<StreamLog>) -> MutexGuard<'_, StreamLog> {
    log.lock().unwrap_or_else(|e| e.into_inner())
}
