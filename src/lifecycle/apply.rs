//! How events change a task: status, history and artifacts.
//!
//! Rules (issue "task lifecycle", spec §3.7, §4.2):
//! - A status update replaces the status; the server stamps the timestamp.
//!   The superseded status message, if any, moves into history, so nothing
//!   the agent said is lost when it says the next thing.
//! - A user message on the task joins history. If the current status has a
//!   message (typically the agent's question in INPUT_REQUIRED), that
//!   message moves into history first and leaves the status, so history
//!   stays in the order things were said (as the reference Python SDK does).
//! - An artifact update without `append` creates the artifact, or replaces the
//!   one with the same `artifact_id`; with `append` it extends that artifact's
//!   parts. After `last_chunk` the artifact is sealed: a further update of it
//!   is an agent error ([`ApplyError::SealedArtifact`]), not silent
//!   corruption. So is an append to an artifact that does not exist.
//! - Nothing changes a terminal task (spec §3.1.1, §3.1.5, §3.1.6).
//!
//! Each successful [`TaskRecord::apply`] returns the stream event that
//! describes the change, so what subscribers see is exactly what was applied.

use crate::wkt::{Struct, Timestamp};

use super::change::{Change, HistoryIds, PushConfigList};
use super::transition::{TransitionError, TransitionPolicy};
use super::transitions::{Cause, Transition, push_transition};
use crate::proto::{
    Artifact, Message, Role, StreamResponse, Task, TaskArtifactUpdateEvent,
    TaskPushNotificationConfig, TaskState, TaskStatus, TaskStatusUpdateEvent,
    stream_response::Payload,
};

/// Where applying an event records what it changed: a list of
/// [`Change`]s, or nowhere ([`TaskRecord::apply_unlogged`]).
struct ChangeLog<'a>(Option<&'a mut Vec<Change>>);

impl ChangeLog<'_> {
    /// Records a change, built only when there is a list to take it.
    fn push(&mut self, change: impl FnOnce() -> Change) {
        if let Some(log) = self.0.as_deref_mut() {
            log.push(change());
        }
    }
}

/// A new status from the agent (or the server, for cancel and failure).
#[derive(Debug, Clone, PartialEq)]
pub struct StatusUpdate {
    pub state: TaskState,
    /// An agent message explaining the status (spec §7.6.1 requires one for
    /// AUTH_REQUIRED).
    pub message: Option<Message>,
    pub metadata: Option<Struct>,
}

/// An artifact chunk from the agent (spec §4.2.2).
#[derive(Debug, Clone, PartialEq)]
pub struct ArtifactUpdate {
    pub artifact: Artifact,
    pub append: bool,
    pub last_chunk: bool,
    pub metadata: Option<Struct>,
}

/// Everything that can happen to a task.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskEvent {
    Status(StatusUpdate),
    Artifact(ArtifactUpdate),
    /// A client message continuing the task (spec §3.4.3).
    UserMessage(Message),
    /// Keys of `Task.metadata` set by the agent (spec §4.1.1): each replaces
    /// the task's value for that key, and a null value removes the key. Not
    /// a stream event: readers and snapshots show it.
    Metadata(Struct),
    /// A change to the task's push notification configs (spec §4.3). Not a
    /// lifecycle step and not a stream event, so it is accepted in any
    /// state: a finished task's configs can still be read and deleted.
    PushConfig(PushConfigChange),
}

/// The A2A protocol version a client spoke. What it leaves behind for
/// later follows it: a push config set by a 0.3 client gets 0.3 payloads
/// (the task, as 0.3's push notifications carry it), since its receiver
/// is a 0.3 program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    #[default]
    V1_0,
    V0_3,
}

/// How a task's push notification configs change.
#[derive(Debug, Clone, PartialEq)]
pub enum PushConfigChange {
    /// Adds the config, or replaces the one with its id; its webhook gets
    /// payloads of this protocol version.
    Set(TaskPushNotificationConfig, Protocol),
    /// Removes the config with this id, if there is one.
    Delete(String),
}

/// Push notification configs one task may hold (spec §4.3 leaves it open;
/// each costs a delivery per event).
pub const MAX_PUSH_CONFIGS: usize = 10;

/// Why an event could not be applied. The task is left unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    #[error(transparent)]
    Transition(#[from] TransitionError),
    #[error("task is in terminal state {} and accepts no more events", .0.as_str_name())]
    Terminal(TaskState),
    #[error("artifact_id must not be empty")]
    EmptyArtifactId,
    #[error("artifact {0:?} must contain at least one part")]
    EmptyArtifact(String),
    #[error("artifact {0:?} was sealed by last_chunk and cannot change")]
    SealedArtifact(String),
    #[error("append to artifact {0:?}, which does not exist")]
    UnknownArtifact(String),
    #[error("message_id must not be empty")]
    EmptyMessageId,
    #[error("message {0:?} belongs to task {1:?}")]
    ForeignMessage(String, String),
    #[error("the task already has {MAX_PUSH_CONFIGS} push notification configs")]
    TooManyPushConfigs,
    #[error("a push notification config needs an id")]
    EmptyPushConfigId,
}

/// A task together with the lifecycle facts that are not part of the A2A
/// `Task` message but must survive with it (which artifacts are sealed).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TaskRecord {
    pub task: Task,
    /// `artifact_id`s whose final chunk has been applied.
    pub sealed_artifacts: Vec<String>,
    /// The principal that created the task (spec §13.1: results scoped to
    /// the caller); "" for a task created without authentication. Set once,
    /// never changed.
    pub owner: String,
    /// The task's push notification configs (spec §4.3), by id, in the
    /// order they were first set; stored without their `tenant` and
    /// `task_id`, which are the task's.
    pub push_configs: Vec<TaskPushNotificationConfig>,
    /// The ids of the push configs a protocol 0.3 client set
    /// ([`Protocol::V0_3`]); the others get 1.0 payloads.
    pub v0_3_push_configs: Vec<String>,
    /// The W3C `traceparent` of the run that last wrote the task, if its
    /// caller sent one or spans are exported; its webhooks carry it, so a
    /// notification joins the trace of the run behind it. "" for none.
    pub trace: String,
    /// The task's transition log, oldest first ([`super::transitions`]).
    pub transitions: Vec<Transition>,
    /// The history's message ids, for the repeated-message check (a
    /// cache, see [`HistoryIds`]).
    pub(crate) history_ids: HistoryIds,
}

impl TaskRecord {
    /// A new task in SUBMITTED, created by `first_message` (spec §3.4.2: the
    /// server chooses the id). The message joins history, tagged with the
    /// task and context ids.
    pub fn submitted(
        task_id: String,
        context_id: String,
        first_message: Message,
        now: Timestamp,
    ) -> Self {
        let mut message = first_message;
        message.task_id = task_id.clone();
        message.context_id = context_id.clone();
        let created = Transition::new(
            TaskState::Submitted,
            now,
            &message.message_id,
            Cause::Client,
        );
        TaskRecord {
            task: Task {
                id: task_id,
                context_id,
                status: Some(TaskStatus {
                    state: TaskState::Submitted as i32,
                    message: None,
                    timestamp: Some(now),
                }),
                artifacts: Vec::new(),
                history: vec![message],
                metadata: None,
            },
            sealed_artifacts: Vec::new(),
            owner: String::new(),
            push_configs: Vec::new(),
            v0_3_push_configs: Vec::new(),
            trace: String::new(),
            transitions: vec![created],
            history_ids: HistoryIds::default(),
        }
    }

    /// Adds `config`, or replaces the one with its id, for a client of
    /// `protocol`; stored without its `tenant` and `task_id`.
    pub fn set_push_config(
        &mut self,
        mut config: TaskPushNotificationConfig,
        protocol: Protocol,
    ) -> Result<(), ApplyError> {
        if config.id.is_empty() {
            return Err(ApplyError::EmptyPushConfigId);
        }
        config.tenant.clear();
        config.task_id.clear();
        let at = self.push_configs.iter().position(|c| c.id == config.id);
        if at.is_none() && self.push_configs.len() >= MAX_PUSH_CONFIGS {
            return Err(ApplyError::TooManyPushConfigs);
        }
        self.v0_3_push_configs.retain(|id| *id != config.id);
        if protocol == Protocol::V0_3 {
            self.v0_3_push_configs.push(config.id.clone());
        }
        match at {
            Some(at) => self.push_configs[at] = config,
            None => self.push_configs.push(config),
        }
        Ok(())
    }

    /// The protocol version of the client that set the push config `id`.
    pub fn push_protocol(&self, id: &str) -> Protocol {
        if self.v0_3_push_configs.iter().any(|c| c == id) {
            Protocol::V0_3
        } else {
            Protocol::V1_0
        }
    }

    /// The record with `owner` as the principal that created it.
    pub fn owned_by(mut self, owner: impl Into<String>) -> Self {
        self.owner = owner.into();
        self
    }

    /// The current state. A stored task always has a real state; a record
    /// built by hand without a status reads as UNSPECIFIED, which every rule
    /// refuses.
    pub fn state(&self) -> TaskState {
        self.task
            .status
            .as_ref()
            .and_then(|s| TaskState::try_from(s.state).ok())
            .unwrap_or(TaskState::Unspecified)
    }

    /// Applies one event from the agent at time `now`. On success returns
    /// the stream event to broadcast (none for a user message, which is not
    /// a stream event in spec §3.1.2's patterns); on error the record is
    /// unchanged.
    pub fn apply(
        &mut self,
        event: TaskEvent,
        now: Timestamp,
        policy: TransitionPolicy,
    ) -> Result<Option<StreamResponse>, ApplyError> {
        self.apply_unlogged(event, now, policy, Cause::Agent)
    }

    /// [`TaskRecord::apply`] for an event `cause` wrote (what the
    /// transition log records of a change of state; [`Cause::FollowUp`],
    /// the agent in a run a follow-up started, is recorded for the change
    /// that leaves INPUT_REQUIRED or AUTH_REQUIRED and as
    /// [`Cause::Agent`] otherwise), appending to `log`
    /// what it changed in the record ([`Change`]): replayed in order on the
    /// record as it was ([`TaskRecord::replay`]), they make it what it is
    /// now. Nothing is logged for a refused event.
    pub fn apply_logged(
        &mut self,
        event: TaskEvent,
        now: Timestamp,
        policy: TransitionPolicy,
        cause: Cause,
        log: &mut Vec<Change>,
    ) -> Result<Option<StreamResponse>, ApplyError> {
        self.apply_to(event, now, policy, cause, &mut ChangeLog(Some(log)))
    }

    /// [`TaskRecord::apply_logged`] without the log: for a record whose
    /// next write stores it whole (a task not yet stored), where what an
    /// event changed would be built (an artifact copied, a status) only to
    /// be dropped.
    pub fn apply_unlogged(
        &mut self,
        event: TaskEvent,
        now: Timestamp,
        policy: TransitionPolicy,
        cause: Cause,
    ) -> Result<Option<StreamResponse>, ApplyError> {
        self.apply_to(event, now, policy, cause, &mut ChangeLog(None))
    }

    fn apply_to(
        &mut self,
        event: TaskEvent,
        now: Timestamp,
        policy: TransitionPolicy,
        cause: Cause,
        log: &mut ChangeLog<'_>,
    ) -> Result<Option<StreamResponse>, ApplyError> {
        if let TaskEvent::PushConfig(change) = event {
            self.change_push_config(change)?;
            log.push(|| {
                Change::PushConfigs(PushConfigList {
                    configs: self.push_configs.clone(),
                    v0_3: self.v0_3_push_configs.clone(),
                })
            });
            return Ok(None);
        }
        let state = self.state();
        if state.is_terminal() {
            return Err(ApplyError::Terminal(state));
        }
        match event {
            TaskEvent::PushConfig(_) => unreachable!("applied above"),
            TaskEvent::Status(update) => {
                self.apply_status(update, now, policy, cause, log).map(Some)
            }
            TaskEvent::Artifact(update) => self.apply_artifact(update, log).map(Some),
            TaskEvent::UserMessage(message) => {
                let message = self.own_message(message)?;
                if let Some(status) = &mut self.task.status
                    && let Some(question) = status.message.take()
                {
                    log.push(|| Change::Status(status.clone()));
                    self.push_history(question, log);
                }
                log.push(|| Change::History(message.clone()));
                self.append_history(message);
                Ok(None)
            }
            TaskEvent::Metadata(update) => {
                log.push(|| Change::Metadata(update.clone()));
                merge_metadata(&mut self.task.metadata, update);
                Ok(None)
            }
        }
    }

    /// Appends `message` to history, keeping [`HistoryIds`] up to date.
    pub(crate) fn append_history(&mut self, message: Message) {
        self.task.history.push(message);
        self.history_ids.appended(&self.task.history);
    }

    fn change_push_config(&mut self, change: PushConfigChange) -> Result<(), ApplyError> {
        match change {
            PushConfigChange::Set(config, protocol) => self.set_push_config(config, protocol),
            PushConfigChange::Delete(id) => {
                self.push_configs.retain(|c| c.id != id);
                self.v0_3_push_configs.retain(|c| *c != id);
                Ok(())
            }
        }
    }

    /// Tags a message with this task's ids, refusing one that names another
    /// task.
    fn own_message(&self, mut message: Message) -> Result<Message, ApplyError> {
        if message.message_id.is_empty() {
            return Err(ApplyError::EmptyMessageId);
        }
        if !message.task_id.is_empty() && message.task_id != self.task.id {
            return Err(ApplyError::ForeignMessage(
                message.message_id,
                message.task_id,
            ));
        }
        message.task_id = self.task.id.clone();
        message.context_id = self.task.context_id.clone();
        Ok(message)
    }

    fn apply_status(
        &mut self,
        update: StatusUpdate,
        now: Timestamp,
        policy: TransitionPolicy,
        cause: Cause,
        log: &mut ChangeLog<'_>,
    ) -> Result<StreamResponse, ApplyError> {
        let before = self.state();
        policy.check(before, update.state)?;
        let message = match update.message {
            Some(mut m) => {
                if m.role == Role::Unspecified as i32 {
                    m.role = Role::Agent as i32;
                }
                Some(self.own_message(m)?)
            }
            None => None,
        };
        let status = TaskStatus {
            state: update.state as i32,
            message,
            timestamp: Some(now),
        };
        if update.state != before {
            // A follow-up's run moves the task on from where it waited;
            // its later changes are the agent's own.
            let cause = match cause {
                Cause::FollowUp if !before.is_interrupted() => Cause::Agent,
                cause => cause,
            };
            let message_id = status.message.as_ref().map_or("", |m| &m.message_id);
            let entry = Transition::new(update.state, now, message_id, cause);
            log.push(|| Change::Transition(entry.clone()));
            push_transition(&mut self.transitions, entry);
            if update.state.is_terminal() {
                // The log is complete: a stored task keeps no spare room
                // (a Vec grows to 4 entries at its second).
                self.transitions.shrink_to_fit();
            }
        }
        log.push(|| Change::Status(status.clone()));
        let superseded = self.task.status.replace(status.clone());
        if let Some(old) = superseded.and_then(|s| s.message) {
            self.push_history(old, log);
        }
        Ok(StreamResponse {
            payload: Some(Payload::StatusUpdate(TaskStatusUpdateEvent {
                task_id: self.task.id.clone(),
                context_id: self.task.context_id.clone(),
                status: Some(status),
                metadata: update.metadata,
            })),
        })
    }

    /// Appends to history unless a message with the same id is already
    /// there (an agent that repeats its status message): one copy each.
    fn push_history(&mut self, message: Message, log: &mut ChangeLog<'_>) {
        if !self
            .history_ids
            .contains(&self.task.history, &message.message_id)
        {
            log.push(|| Change::History(message.clone()));
            self.append_history(message);
        }
    }

    fn apply_artifact(
        &mut self,
        update: ArtifactUpdate,
        log: &mut ChangeLog<'_>,
    ) -> Result<StreamResponse, ApplyError> {
        let ArtifactUpdate {
            artifact,
            append,
            last_chunk,
            metadata,
        } = update;
        let id = &artifact.artifact_id;
        if id.is_empty() {
            return Err(ApplyError::EmptyArtifactId);
        }
        if artifact.parts.is_empty() {
            return Err(ApplyError::EmptyArtifact(id.clone()));
        }
        if self.sealed_artifacts.contains(id) {
            return Err(ApplyError::SealedArtifact(id.clone()));
        }
        let existing = self
            .task
            .artifacts
            .iter_mut()
            .find(|a| a.artifact_id == *id);
        match (append, existing) {
            (true, None) => return Err(ApplyError::UnknownArtifact(id.clone())),
            (true, Some(target)) => {
                extend_artifact(target, &artifact);
                log.push(|| Change::ExtendArtifact(artifact.clone()));
            }
            (false, Some(target)) => {
                *target = artifact.clone();
                log.push(|| Change::ReplaceArtifact(artifact.clone()));
            }
            (false, None) => {
                self.task.artifacts.push(artifact.clone());
                log.push(|| Change::AddArtifact(artifact.clone()));
            }
        }
        if last_chunk {
            self.sealed_artifacts.push(id.clone());
            log.push(|| Change::Seal(id.clone()));
        }
        Ok(StreamResponse {
            payload: Some(Payload::ArtifactUpdate(TaskArtifactUpdateEvent {
                task_id: self.task.id.clone(),
                context_id: self.task.context_id.clone(),
                artifact: Some(artifact),
                append,
                last_chunk,
                metadata,
            })),
        })
    }
}

/// Sets the metadata keys of `update` (spec §4.1.1): each replaces the
/// value of its key, and a null value removes the key; metadata left
/// empty is none.
pub(crate) fn merge_metadata(metadata: &mut Option<Struct>, update: Struct) {
    use crate::wkt::value::Kind;
    let fields = &mut metadata.get_or_insert_with(Default::default).fields;
    for (key, value) in update.fields {
        if matches!(value.kind, None | Some(Kind::NullValue(_))) {
            fields.remove(&key);
        } else {
            fields.insert(key, value);
        }
    }
    if fields.is_empty() {
        *metadata = None;
    }
}

/// Appends a chunk to an artifact: parts are added in order; a chunk's name,
/// description, metadata keys and extensions fill in or override.
pub(crate) fn extend_artifact(target: &mut Artifact, chunk: &Artifact) {
    target.parts.extend(chunk.parts.iter().cloned());
    if !chunk.name.is_empty() {
        target.name = chunk.name.clone();
    }
    if !chunk.description.is_empty() {
        target.description = chunk.description.clone();
    }
    if let Some(extra) = &chunk.metadata {
        let fields = &mut target.metadata.get_or_insert_with(Default::default).fields;
        fields.extend(extra.fields.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    for ext in &chunk.extensions {
        if !target.extensions.contains(ext) {
            target.extensions.push(ext.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Part, part::Content};

    const REAL: [TaskState; 8] = TaskState::REAL;

    fn ts(seconds: i64) -> Timestamp {
        Timestamp { seconds, nanos: 0 }
    }

    fn text_part(text: &str) -> Part {
        Part {
            content: Some(Content::Text(text.into())),
            ..Default::default()
        }
    }

    fn message(id: &str, role: Role, text: &str) -> Message {
        Message {
            message_id: id.into(),
            role: role as i32,
            parts: vec![text_part(text)],
            ..Default::default()
        }
    }

    fn record() -> TaskRecord {
        TaskRecord::submitted(
            "t1".into(),
            "c1".into(),
            message("u1", Role::User, "hi"),
            ts(1),
        )
    }

    fn record_in(state: TaskState) -> TaskRecord {
        let mut r = record();
        r.task.status.as_mut().unwrap().state = state as i32;
        r
    }

    fn status(state: TaskState, msg: Option<Message>) -> TaskEvent {
        TaskEvent::Status(StatusUpdate {
            state,
            message: msg,
            metadata: None,
        })
    }

    fn artifact(id: &str, text: &str, append: bool, last_chunk: bool) -> TaskEvent {
        TaskEvent::Artifact(ArtifactUpdate {
            artifact: Artifact {
                artifact_id: id.into(),
                parts: vec![text_part(text)],
                ..Default::default()
            },
            append,
            last_chunk,
            metadata: None,
        })
    }

    fn texts(a: &Artifact) -> Vec<&str> {
        a.parts
            .iter()
            .map(|p| match &p.content {
                Some(Content::Text(t)) => t.as_str(),
                _ => "",
            })
            .collect()
    }

    #[test]
    fn submitted_task_starts_with_the_message_in_history() {
        let r = record();
        assert_eq!(r.state(), TaskState::Submitted);
        assert_eq!(r.task.history.len(), 1);
        assert_eq!(r.task.history[0].task_id, "t1");
        assert_eq!(r.task.history[0].context_id, "c1");
        assert_eq!(r.task.status.as_ref().unwrap().timestamp, Some(ts(1)));
    }

    /// Every state x every event kind: terminal states refuse all, others
    /// accept all (permissive policy), and a refused event changes nothing.
    #[test]
    fn every_state_times_every_event() {
        for from in REAL {
            let events = REAL
                .iter()
                .map(|s| status(*s, None))
                .chain([
                    artifact("a", "x", false, false),
                    TaskEvent::UserMessage(message("u2", Role::User, "more")),
                    TaskEvent::Metadata(meta(&[("k", Some("v"))])),
                ])
                .collect::<Vec<_>>();
            for event in events {
                let mut r = record_in(from);
                let before = r.clone();
                let result = r.apply(event.clone(), ts(5), TransitionPolicy::Permissive);
                if from.is_terminal() {
                    assert_eq!(
                        result,
                        Err(ApplyError::Terminal(from)),
                        "{from:?} {event:?}"
                    );
                    assert_eq!(r, before, "refused event must not change the task");
                } else {
                    let out = result.unwrap_or_else(|e| panic!("{from:?} {event:?}: {e}"));
                    match event {
                        TaskEvent::Status(u) => {
                            assert_eq!(r.state(), u.state);
                            assert!(matches!(
                                out.and_then(|o| o.payload),
                                Some(Payload::StatusUpdate(_))
                            ));
                        }
                        TaskEvent::Artifact(_) => {
                            assert_eq!(r.task.artifacts.len(), 1);
                            assert!(matches!(
                                out.and_then(|o| o.payload),
                                Some(Payload::ArtifactUpdate(_))
                            ));
                        }
                        TaskEvent::UserMessage(_) => {
                            assert_eq!(r.task.history.len(), 2);
                            assert_eq!(out, None);
                        }
                        TaskEvent::Metadata(_) => {
                            assert!(r.task.metadata.as_ref().unwrap().fields.contains_key("k"));
                            assert_eq!(out, None);
                        }
                        TaskEvent::PushConfig(_) => unreachable!("not in this list"),
                    }
                }
            }
        }
    }

    /// Push configs change in any state, are set by id (replacing one with
    /// the same id), bounded, and never a stream event.
    #[test]
    fn push_configs_are_set_replaced_bounded_and_deleted_in_any_state() {
        use super::{MAX_PUSH_CONFIGS, Protocol, PushConfigChange};
        let config = |id: &str, url: &str| TaskPushNotificationConfig {
            tenant: "t".into(),
            task_id: "t1".into(),
            id: id.into(),
            url: url.into(),
            ..Default::default()
        };
        let set = |c| TaskEvent::PushConfig(PushConfigChange::Set(c, Protocol::V1_0));
        for state in [TaskState::Working, TaskState::Completed] {
            let mut r = record_in(state);
            assert_eq!(
                r.apply(
                    set(config("a", "https://x/1")),
                    ts(2),
                    TransitionPolicy::Strict
                ),
                Ok(None)
            );
            assert_eq!(r.push_configs.len(), 1);
            assert_eq!(r.push_configs[0].tenant, "", "stored without tenant");
            assert_eq!(r.push_configs[0].task_id, "", "stored without task id");
            r.apply(
                set(config("a", "https://x/2")),
                ts(3),
                TransitionPolicy::Strict,
            )
            .unwrap();
            assert_eq!(r.push_configs.len(), 1);
            assert_eq!(r.push_configs[0].url, "https://x/2");
            for i in 1..MAX_PUSH_CONFIGS {
                r.apply(
                    set(config(&i.to_string(), "https://x")),
                    ts(4),
                    TransitionPolicy::Strict,
                )
                .unwrap();
            }
            let before = r.clone();
            assert_eq!(
                r.apply(
                    set(config("one-too-many", "https://x")),
                    ts(5),
                    TransitionPolicy::Strict
                ),
                Err(ApplyError::TooManyPushConfigs)
            );
            assert_eq!(r, before);
            assert_eq!(
                r.apply(
                    set(config("", "https://x")),
                    ts(5),
                    TransitionPolicy::Strict
                ),
                Err(ApplyError::EmptyPushConfigId)
            );
            let delete = |id: &str| TaskEvent::PushConfig(PushConfigChange::Delete(id.into()));
            r.apply(delete("a"), ts(6), TransitionPolicy::Strict)
                .unwrap();
            r.apply(delete("a"), ts(6), TransitionPolicy::Strict)
                .unwrap();
            assert_eq!(r.push_configs.len(), MAX_PUSH_CONFIGS - 1);
            assert_eq!(r.state(), state, "the state is untouched");
        }
    }

    /// A config's protocol is its latest setter's; deleting it forgets it.
    #[test]
    fn a_push_configs_protocol_follows_its_latest_setter() {
        use super::{Protocol, PushConfigChange};
        let config = |id: &str| TaskPushNotificationConfig {
            id: id.into(),
            url: "https://x".into(),
            ..Default::default()
        };
        let set = |id, p| TaskEvent::PushConfig(PushConfigChange::Set(config(id), p));
        let mut r = record_in(TaskState::Working);
        r.apply(set("old", Protocol::V0_3), ts(2), TransitionPolicy::Strict)
            .unwrap();
        r.apply(set("new", Protocol::V1_0), ts(2), TransitionPolicy::Strict)
            .unwrap();
        assert_eq!(r.push_protocol("old"), Protocol::V0_3);
        assert_eq!(r.push_protocol("new"), Protocol::V1_0);
        r.apply(set("old", Protocol::V1_0), ts(3), TransitionPolicy::Strict)
            .unwrap();
        r.apply(set("new", Protocol::V0_3), ts(3), TransitionPolicy::Strict)
            .unwrap();
        assert_eq!(r.push_protocol("old"), Protocol::V1_0);
        assert_eq!(r.v0_3_push_configs, ["new"]);
        let delete = TaskEvent::PushConfig(PushConfigChange::Delete("new".into()));
        r.apply(delete, ts(4), TransitionPolicy::Strict).unwrap();
        assert!(r.v0_3_push_configs.is_empty());
        assert_eq!(r.push_configs.len(), 1);
    }

    /// A metadata struct: `None` values are JSON null.
    fn meta(pairs: &[(&str, Option<&str>)]) -> Struct {
        use crate::wkt::{Value, value::Kind};
        Struct {
            fields: pairs
                .iter()
                .map(|(k, v)| {
                    let kind = match v {
                        Some(s) => Kind::StringValue((*s).into()),
                        None => Kind::NullValue(0),
                    };
                    ((*k).to_owned(), Value { kind: Some(kind) })
                })
                .collect(),
        }
    }

    /// Task metadata: keys replace, null removes, empty leaves none.
    #[test]
    fn metadata_sets_replaces_and_removes_keys() {
        let mut r = record();
        r.apply(
            TaskEvent::Metadata(meta(&[("a", Some("1")), ("b", Some("2"))])),
            ts(2),
            TransitionPolicy::Permissive,
        )
        .unwrap();
        r.apply(
            TaskEvent::Metadata(meta(&[("a", Some("3")), ("b", None)])),
            ts(3),
            TransitionPolicy::Permissive,
        )
        .unwrap();
        assert_eq!(r.task.metadata, Some(meta(&[("a", Some("3"))])));
        r.apply(
            TaskEvent::Metadata(meta(&[("a", None)])),
            ts(4),
            TransitionPolicy::Permissive,
        )
        .unwrap();
        assert_eq!(r.task.metadata, None);
    }

    #[test]
    fn status_update_replaces_status_and_stamps_server_time() {
        let mut r = record();
        let out = r
            .apply(
                status(TaskState::Working, None),
                ts(7),
                TransitionPolicy::Permissive,
            )
            .unwrap()
            .unwrap();
        let st = r.task.status.as_ref().unwrap();
        assert_eq!(st.state, TaskState::Working as i32);
        assert_eq!(st.timestamp, Some(ts(7)));
        let Some(Payload::StatusUpdate(ev)) = out.payload else {
            panic!()
        };
        assert_eq!(ev.task_id, "t1");
        assert_eq!(ev.context_id, "c1");
        assert_eq!(ev.status.as_ref(), Some(st));
    }

    #[test]
    fn superseded_status_message_moves_into_history() {
        let mut r = record();
        let p = TransitionPolicy::Permissive;
        r.apply(
            status(
                TaskState::Working,
                Some(message("s1", Role::Agent, "working")),
            ),
            ts(2),
            p,
        )
        .unwrap();
        assert_eq!(
            r.task.history.len(),
            1,
            "current status message stays in status"
        );
        r.apply(
            status(
                TaskState::InputRequired,
                Some(message("s2", Role::Agent, "need diff")),
            ),
            ts(3),
            p,
        )
        .unwrap();
        let ids: Vec<_> = r
            .task
            .history
            .iter()
            .map(|m| m.message_id.as_str())
            .collect();
        assert_eq!(ids, ["u1", "s1"]);
        assert_eq!(r.task.history[1].task_id, "t1");
        assert_eq!(r.task.history[1].context_id, "c1");
        assert_eq!(
            r.task
                .status
                .as_ref()
                .unwrap()
                .message
                .as_ref()
                .unwrap()
                .message_id,
            "s2"
        );
        // A repeated status message is not duplicated in history.
        r.apply(
            status(
                TaskState::InputRequired,
                Some(message("s2", Role::Agent, "again")),
            ),
            ts(4),
            p,
        )
        .unwrap();
        r.apply(status(TaskState::Working, None), ts(5), p).unwrap();
        let ids: Vec<_> = r
            .task
            .history
            .iter()
            .map(|m| m.message_id.as_str())
            .collect();
        assert_eq!(ids, ["u1", "s1", "s2"]);
    }

    #[test]
    fn status_message_without_role_becomes_agent() {
        let mut r = record();
        let mut m = message("s1", Role::Agent, "x");
        m.role = Role::Unspecified as i32;
        r.apply(
            status(TaskState::Working, Some(m)),
            ts(2),
            TransitionPolicy::Permissive,
        )
        .unwrap();
        let st = r.task.status.unwrap();
        assert_eq!(st.message.unwrap().role, Role::Agent as i32);
    }

    /// History stays chronological: the agent's question (status message)
    /// precedes the user's answer.
    #[test]
    fn user_message_after_a_status_question_keeps_history_in_order() {
        let mut r = record();
        let p = TransitionPolicy::Permissive;
        r.apply(
            status(
                TaskState::InputRequired,
                Some(message("q", Role::Agent, "diff?")),
            ),
            ts(2),
            p,
        )
        .unwrap();
        r.apply(
            TaskEvent::UserMessage(message("u2", Role::User, "diff")),
            ts(3),
            p,
        )
        .unwrap();
        let ids: Vec<_> = r
            .task
            .history
            .iter()
            .map(|m| m.message_id.as_str())
            .collect();
        assert_eq!(ids, ["u1", "q", "u2"]);
        assert_eq!(r.task.status.as_ref().unwrap().message, None);
        assert_eq!(r.state(), TaskState::InputRequired);
        r.apply(status(TaskState::Working, None), ts(4), p).unwrap();
        assert_eq!(r.task.history.len(), 3, "the question is not added twice");
    }

    #[test]
    fn user_message_joins_history_tagged_with_task() {
        let mut r = record_in(TaskState::InputRequired);
        r.apply(
            TaskEvent::UserMessage(message("u2", Role::User, "diff")),
            ts(2),
            TransitionPolicy::Permissive,
        )
        .unwrap();
        assert_eq!(r.task.history[1].message_id, "u2");
        assert_eq!(r.task.history[1].task_id, "t1");
        assert_eq!(r.task.history[1].context_id, "c1");
        assert_eq!(
            r.state(),
            TaskState::InputRequired,
            "a message does not change state"
        );
    }

    #[test]
    fn message_for_another_task_or_without_id_is_refused() {
        let mut r = record();
        let mut m = message("u2", Role::User, "x");
        m.task_id = "other".into();
        let p = TransitionPolicy::Permissive;
        assert!(matches!(
            r.apply(TaskEvent::UserMessage(m), ts(2), p),
            Err(ApplyError::ForeignMessage(..))
        ));
        assert_eq!(
            r.apply(
                TaskEvent::UserMessage(message("", Role::User, "x")),
                ts(2),
                p
            ),
            Err(ApplyError::EmptyMessageId)
        );
    }

    #[test]
    fn artifact_chunks_append_then_seal() {
        let mut r = record_in(TaskState::Working);
        let p = TransitionPolicy::Permissive;
        r.apply(artifact("rep", "a", false, false), ts(2), p)
            .unwrap();
        r.apply(artifact("rep", "b", true, false), ts(2), p)
            .unwrap();
        let out = r
            .apply(artifact("rep", "c", true, true), ts(2), p)
            .unwrap()
            .unwrap();
        assert_eq!(r.task.artifacts.len(), 1);
        assert_eq!(texts(&r.task.artifacts[0]), ["a", "b", "c"]);
        // The broadcast event carries the chunk, not the merged artifact.
        let Some(Payload::ArtifactUpdate(ev)) = out.payload else {
            panic!()
        };
        assert!(ev.append && ev.last_chunk);
        assert_eq!(texts(ev.artifact.as_ref().unwrap()), ["c"]);
        // Sealed: neither append nor replace may change it.
        let before = r.clone();
        assert_eq!(
            r.apply(artifact("rep", "d", true, false), ts(2), p),
            Err(ApplyError::SealedArtifact("rep".into()))
        );
        assert_eq!(
            r.apply(artifact("rep", "d", false, true), ts(2), p),
            Err(ApplyError::SealedArtifact("rep".into()))
        );
        assert_eq!(r, before);
    }

    #[test]
    fn artifact_without_append_replaces_same_id_and_adds_new_ids() {
        let mut r = record_in(TaskState::Working);
        let p = TransitionPolicy::Permissive;
        r.apply(artifact("a", "1", false, false), ts(2), p).unwrap();
        r.apply(artifact("b", "2", false, false), ts(2), p).unwrap();
        r.apply(artifact("a", "3", false, false), ts(2), p).unwrap();
        assert_eq!(r.task.artifacts.len(), 2);
        assert_eq!(texts(&r.task.artifacts[0]), ["3"]);
        assert_eq!(texts(&r.task.artifacts[1]), ["2"]);
    }

    #[test]
    fn append_merges_metadata_name_and_extensions() {
        let mut r = record_in(TaskState::Working);
        let p = TransitionPolicy::Permissive;
        r.apply(artifact("a", "1", false, false), ts(2), p).unwrap();
        let mut chunk = Artifact {
            artifact_id: "a".into(),
            name: "report".into(),
            parts: vec![text_part("2")],
            extensions: vec!["urn:x".into()],
            ..Default::default()
        };
        chunk.metadata = Some(Struct {
            fields: [("k".to_string(), crate::wkt::Value::from(1.0))].into(),
        });
        let ev = TaskEvent::Artifact(ArtifactUpdate {
            artifact: chunk,
            append: true,
            last_chunk: false,
            metadata: None,
        });
        r.apply(ev.clone(), ts(2), p).unwrap();
        r.apply(ev, ts(2), p).unwrap();
        let a = &r.task.artifacts[0];
        assert_eq!(texts(a), ["1", "2", "2"]);
        assert_eq!(a.name, "report");
        assert_eq!(a.extensions, ["urn:x"]);
        assert!(a.metadata.as_ref().unwrap().fields.contains_key("k"));
    }

    #[test]
    fn malformed_artifacts_are_agent_errors() {
        let mut r = record_in(TaskState::Working);
        let p = TransitionPolicy::Permissive;
        assert_eq!(
            r.apply(artifact("", "x", false, false), ts(2), p),
            Err(ApplyError::EmptyArtifactId)
        );
        assert_eq!(
            r.apply(artifact("nope", "x", true, false), ts(2), p),
            Err(ApplyError::UnknownArtifact("nope".into()))
        );
        let empty = TaskEvent::Artifact(ArtifactUpdate {
            artifact: Artifact {
                artifact_id: "e".into(),
                ..Default::default()
            },
            append: false,
            last_chunk: false,
            metadata: None,
        });
        assert_eq!(
            r.apply(empty, ts(2), p),
            Err(ApplyError::EmptyArtifact("e".into()))
        );
        assert!(r.task.artifacts.is_empty());
    }

    #[test]
    fn strict_policy_refuses_transitions_outside_its_table() {
        let mut r = record();
        let err = r
            .apply(
                status(TaskState::Completed, None),
                ts(2),
                TransitionPolicy::Strict,
            )
            .unwrap_err();
        assert!(matches!(
            err,
            ApplyError::Transition(TransitionError::NotInTable(..))
        ));
        assert_eq!(r.state(), TaskState::Submitted);
    }

    #[test]
    fn unspecified_status_is_refused() {
        let mut r = record();
        let err = r
            .apply(
                status(TaskState::Unspecified, None),
                ts(2),
                TransitionPolicy::Permissive,
            )
            .unwrap_err();
        assert!(matches!(
            err,
            ApplyError::Transition(TransitionError::InvalidState(_))
        ));
    }
}
