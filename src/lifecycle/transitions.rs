//! The transition log: every state a task has been in, when, with which
//! status message, and who moved it there (the audit trail of the seed's
//! planner scenario, and the timeline the console draws).
//!
//! Rules:
//! - A task's first entry is SUBMITTED, caused by the client message that
//!   created it ([`Cause::Client`], that message's id).
//! - A status update that changes the state adds one entry (a WORKING
//!   progress update of a WORKING task is not a transition, spec §4.1.3:
//!   the state is what is logged, not each status message). Refused
//!   updates add nothing, so every entry is a committed change of state,
//!   in the order they were applied.
//! - The cause is the writer's ([`Cause`]): the runtime knows whether the
//!   agent, a client's cancel, a timeout or a sweep wrote the status. In a
//!   run that a follow-up message started, the agent's status that takes
//!   the task out of INPUT_REQUIRED or AUTH_REQUIRED is
//!   [`Cause::FollowUp`] (the answer moved the task on, through the
//!   agent); its later ones are the agent's own.
//! - Bounded like every part of a task: at most [`MAX_TRANSITIONS`]
//!   entries; past it the oldest after the first is dropped, so the log
//!   always shows how the task began and how it went lately.
//!
//! Clients see the log through an A2A extension (spec §4.6,
//! [`TRANSITIONS_EXTENSION`]): a call that activates it gets the log in the
//! task's `metadata` under the extension's URI; other calls see the task
//! unchanged. The log is part of the stored record (every backend), not of
//! the A2A `Task`.

use crate::proto::{Task, TaskState};
use crate::wkt::{ListValue, Struct, Timestamp, Value, value::Kind};

/// The URI of the transition-log extension (spec §4.6): declared in every
/// card's `capabilities.extensions`, activated by naming it in the
/// `A2A-Extensions` service parameter. A URN: an identifier, not an
/// address (spec "Extensions": URIs are identifiers, HTTP access is not
/// expected).
pub const TRANSITIONS_EXTENSION: &str = "urn:a2a-lifecycle:ext:transitions:v1";

/// Entries one task's log keeps. A task changes state a few times in a
/// normal life; one that keeps flipping between WORKING and INPUT_REQUIRED
/// is bounded here, at a few tens of bytes an entry.
pub const MAX_TRANSITIONS: usize = 256;

/// Who moved a task into a state. Stored by number (never reuse one) and
/// named in JSON by [`Cause::name`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Cause {
    Unspecified = 0,
    /// The client message that created the task.
    Client = 1,
    /// The agent, in a run.
    Agent = 2,
    /// The agent, resuming the task after the client's follow-up message.
    FollowUp = 3,
    /// The client's CancelTask.
    Cancel = 4,
    /// A limit on time: `--task-timeout`, or an owner's `max_input_wait`.
    Timeout = 5,
    /// Start-up recovery: a task a previous process left active.
    OrphanSweep = 6,
    /// A replica taking over the tasks of one whose lease expired.
    Takeover = 7,
    /// The server itself: the agent stopped without ending its task, the
    /// server shut down, or the store lost the agent's last writes.
    Server = 8,
}

impl Cause {
    /// The name clients see.
    pub fn name(self) -> &'static str {
        match self {
            Cause::Unspecified => "unspecified",
            Cause::Client => "client",
            Cause::Agent => "agent",
            Cause::FollowUp => "follow-up",
            Cause::Cancel => "cancel",
            Cause::Timeout => "timeout",
            Cause::OrphanSweep => "orphan-sweep",
            Cause::Takeover => "takeover",
            Cause::Server => "server",
        }
    }
}

/// One entry of the log.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Transition {
    #[prost(enumeration = "TaskState", tag = "1")]
    pub state: i32,
    /// The status's timestamp (the server's clock when it applied it).
    #[prost(message, optional, tag = "2")]
    pub timestamp: Option<Timestamp>,
    /// The id of the status message that came with the state; for the
    /// first entry, the id of the message that created the task. "" when
    /// the status had none.
    #[prost(string, tag = "3")]
    pub message_id: String,
    #[prost(enumeration = "Cause", tag = "4")]
    pub cause: i32,
}

impl Transition {
    pub fn new(state: TaskState, timestamp: Timestamp, message_id: &str, cause: Cause) -> Self {
        Transition {
            state: state as i32,
            timestamp: Some(timestamp),
            message_id: message_id.to_owned(),
            cause: cause as i32,
        }
    }

    /// The entry as the extension shows it: `state` (the ProtoJSON name),
    /// `timestamp` (RFC 3339), `messageId` (when there is one), `cause`.
    pub fn to_value(&self) -> Value {
        let mut fields = std::collections::BTreeMap::new();
        let state = TaskState::try_from(self.state).unwrap_or(TaskState::Unspecified);
        fields.insert("state".to_owned(), string(state.as_str_name()));
        if let Some(at) = self.timestamp {
            fields.insert("timestamp".to_owned(), string(&at.to_string()));
        }
        if !self.message_id.is_empty() {
            fields.insert("messageId".to_owned(), string(&self.message_id));
        }
        let cause = Cause::try_from(self.cause).unwrap_or(Cause::Unspecified);
        fields.insert("cause".to_owned(), string(cause.name()));
        Value {
            kind: Some(Kind::StructValue(Struct { fields })),
        }
    }
}

fn string(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_owned())),
    }
}

/// Appends `entry` to `log`, keeping it within [`MAX_TRANSITIONS`] (the
/// first entry stays; the oldest after it goes).
pub fn push_transition(log: &mut Vec<Transition>, entry: Transition) {
    if log.len() >= MAX_TRANSITIONS {
        log.remove(1);
    }
    log.push(entry);
}

/// `task` as a call that activated [`TRANSITIONS_EXTENSION`] sees it: its
/// metadata gains the key [`TRANSITIONS_EXTENSION`], whose value is
/// `{"transitions": [entry, ...]}`, oldest first.
pub fn show_transitions(task: &mut Task, log: &[Transition]) {
    let list = Value {
        kind: Some(Kind::ListValue(ListValue {
            values: log.iter().map(Transition::to_value).collect(),
        })),
    };
    let mut fields = std::collections::BTreeMap::new();
    fields.insert("transitions".to_owned(), list);
    task.metadata
        .get_or_insert_with(Default::default)
        .fields
        .insert(
            TRANSITIONS_EXTENSION.to_owned(),
            Value {
                kind: Some(Kind::StructValue(Struct { fields })),
            },
        );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp { seconds, nanos: 0 }
    }

    #[test]
    fn the_log_keeps_its_first_entry_and_the_latest() {
        let mut log = Vec::new();
        push_transition(
            &mut log,
            Transition::new(TaskState::Submitted, at(0), "m0", Cause::Client),
        );
        for n in 1..=(MAX_TRANSITIONS as i64 + 10) {
            let state = if n % 2 == 1 {
                TaskState::Working
            } else {
                TaskState::InputRequired
            };
            push_transition(&mut log, Transition::new(state, at(n), "", Cause::Agent));
        }
        assert_eq!(log.len(), MAX_TRANSITIONS);
        assert_eq!(log[0].cause, Cause::Client as i32);
        assert_eq!(log[0].message_id, "m0");
        assert_eq!(
            log.last().unwrap().timestamp,
            Some(at(MAX_TRANSITIONS as i64 + 10))
        );
        // In order, none repeated.
        assert!(log.windows(2).all(|w| w[0].timestamp < w[1].timestamp));
    }

    #[test]
    fn shown_under_the_extension_uri_with_protojson_names() {
        let mut task = Task::default();
        show_transitions(
            &mut task,
            &[
                Transition::new(TaskState::Submitted, at(1), "m1", Cause::Client),
                Transition::new(TaskState::Canceled, at(2), "", Cause::Cancel),
            ],
        );
        let json = serde_json::to_value(&task).unwrap();
        let shown = &json["metadata"][TRANSITIONS_EXTENSION]["transitions"];
        assert_eq!(
            shown,
            &serde_json::json!([
                {"state": "TASK_STATE_SUBMITTED", "timestamp": "1970-01-01T00:00:01Z",
                 "messageId": "m1", "cause": "client"},
                {"state": "TASK_STATE_CANCELED", "timestamp": "1970-01-01T00:00:02Z",
                 "cause": "cancel"},
            ])
        );
    }

    fn status(state: TaskState) -> crate::lifecycle::TaskEvent {
        crate::lifecycle::TaskEvent::Status(crate::lifecycle::StatusUpdate {
            state,
            message: None,
            metadata: None,
        })
    }

    /// Only committed changes of state are logged, each with its cause; a
    /// follow-up's run is the cause only of leaving the interrupted state.
    #[test]
    fn each_change_of_state_is_logged_once_with_its_cause() {
        use crate::lifecycle::{TaskRecord, TransitionPolicy};
        let first = crate::proto::Message {
            message_id: "m0".into(),
            role: crate::proto::Role::User as i32,
            ..Default::default()
        };
        let mut record = TaskRecord::submitted("t".into(), "c".into(), first, at(0));
        let mut apply = |state, cause, secs| {
            record.apply_logged(
                status(state),
                at(secs),
                TransitionPolicy::Permissive,
                cause,
                &mut Vec::new(),
            )
        };
        apply(TaskState::Working, Cause::Agent, 1).unwrap();
        // Progress in the same state: no transition.
        apply(TaskState::Working, Cause::Agent, 2).unwrap();
        apply(TaskState::InputRequired, Cause::Agent, 3).unwrap();
        apply(TaskState::Working, Cause::FollowUp, 4).unwrap();
        apply(TaskState::Completed, Cause::FollowUp, 5).unwrap();
        // Refused (terminal): nothing logged.
        assert!(apply(TaskState::Working, Cause::Agent, 6).is_err());
        let log: Vec<_> = record
            .transitions
            .iter()
            .map(|t| {
                (
                    TaskState::try_from(t.state).unwrap(),
                    Cause::try_from(t.cause).unwrap(),
                    t.timestamp.unwrap().seconds,
                )
            })
            .collect();
        assert_eq!(
            log,
            [
                (TaskState::Submitted, Cause::Client, 0),
                (TaskState::Working, Cause::Agent, 1),
                (TaskState::InputRequired, Cause::Agent, 3),
                (TaskState::Working, Cause::FollowUp, 4),
                (TaskState::Completed, Cause::Agent, 5),
            ]
        );
    }
}
