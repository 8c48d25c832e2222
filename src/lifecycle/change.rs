//! How a task record changed: the steps one write makes, to store and to
//! replay instead of the whole task.
//!
//! Applying an event ([`TaskRecord::apply_logged`]) changes a record in a
//! few ways only: the status is replaced, a message joins history, an
//! artifact is added, replaced or extended by a chunk, an artifact is
//! sealed, metadata keys are set, the push configs change, the trace
//! changes, the transition log gains an entry. Each is a [`Change`]. Replayed in order on the record as it
//! was ([`TaskRecord::replay`]), a write's changes give the record as it
//! is, in time and space proportional to the changes, however long the
//! task has grown: what lets a store keep a long task's updates at a
//! constant cost each (issue "long-lived tasks"; spec §1 "potentially very
//! long-running tasks").
//!
//! A change says what happened, not how to decide it: the checks (the
//! transition rules, a sealed artifact, a repeated history message) were
//! made when the event was applied, and replay only repeats the outcome.
//! The type is a protobuf oneof, so the stores keep it as the protobuf
//! message [`Changes`] (field numbers are part of the on-disk format:
//! never reuse one).

use std::collections::HashSet;
use std::hash::BuildHasher;

use crate::proto::{Artifact, Message, TaskPushNotificationConfig, TaskStatus};
use crate::wkt::Struct;

use super::apply::{TaskRecord, extend_artifact, merge_metadata};

/// One step of how a record changed.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Change {
    /// The status was replaced by this one.
    #[prost(message, tag = "1")]
    Status(TaskStatus),
    /// This message joined the end of history.
    #[prost(message, tag = "2")]
    History(Message),
    /// This artifact was added after the others.
    #[prost(message, tag = "3")]
    AddArtifact(Artifact),
    /// The artifact with this one's id was replaced by it.
    #[prost(message, tag = "4")]
    ReplaceArtifact(Artifact),
    /// This chunk was appended to the artifact with its id.
    #[prost(message, tag = "5")]
    ExtendArtifact(Artifact),
    /// The artifact with this id was sealed (its last chunk).
    #[prost(string, tag = "6")]
    Seal(String),
    /// These metadata keys were set; a null value removed its key.
    #[prost(message, tag = "7")]
    Metadata(Struct),
    /// The push configs are now these (at most
    /// [`super::MAX_PUSH_CONFIGS`]).
    #[prost(message, tag = "8")]
    PushConfigs(PushConfigList),
    /// The trace of the run that last wrote the task is now this.
    #[prost(string, tag = "9")]
    Trace(String),
    /// This entry joined the transition log.
    #[prost(message, tag = "10")]
    Transition(super::transitions::Transition),
}

/// A task's push configs and which of them a 0.3 client set, whole.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PushConfigList {
    #[prost(message, repeated, tag = "1")]
    pub configs: Vec<TaskPushNotificationConfig>,
    #[prost(string, repeated, tag = "2")]
    pub v0_3: Vec<String>,
}

/// One change, as a message of its own (a oneof needs one).
#[derive(Clone, PartialEq, prost::Message)]
pub struct StoredChange {
    #[prost(oneof = "Change", tags = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10")]
    pub change: Option<Change>,
}

/// The changes of one write, in order: what the stores keep.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Changes {
    #[prost(message, repeated, tag = "1")]
    pub changes: Vec<StoredChange>,
}

impl Changes {
    pub fn new(changes: impl IntoIterator<Item = Change>) -> Self {
        Changes {
            changes: changes
                .into_iter()
                .map(|change| StoredChange {
                    change: Some(change),
                })
                .collect(),
        }
    }
}

/// Why changes could not be replayed: they do not follow from the record
/// they were replayed on (a log read out of order, or damaged). The
/// record may be partly changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    #[error("a change replaces or extends artifact {0:?}, which the task does not have")]
    UnknownArtifact(String),
    #[error("a stored change is empty")]
    Empty,
}

impl TaskRecord {
    /// Repeats one change on the record (see the module docs).
    pub fn replay(&mut self, change: Change) -> Result<(), ReplayError> {
        match change {
            Change::Status(status) => self.task.status = Some(status),
            Change::History(message) => self.append_history(message),
            Change::AddArtifact(artifact) => self.task.artifacts.push(artifact),
            Change::ReplaceArtifact(artifact) => {
                let target = self.artifact_mut(&artifact.artifact_id)?;
                *target = artifact;
            }
            Change::ExtendArtifact(chunk) => {
                extend_artifact(self.artifact_mut(&chunk.artifact_id)?, &chunk);
            }
            Change::Seal(id) => self.sealed_artifacts.push(id),
            Change::Metadata(update) => merge_metadata(&mut self.task.metadata, update),
            Change::PushConfigs(list) => {
                self.push_configs = list.configs;
                self.v0_3_push_configs = list.v0_3;
            }
            Change::Trace(trace) => self.trace = trace,
            Change::Transition(entry) => {
                super::transitions::push_transition(&mut self.transitions, entry)
            }
        }
        Ok(())
    }

    /// Repeats the changes of one write, in order.
    pub fn replay_all(&mut self, changes: Changes) -> Result<(), ReplayError> {
        for stored in changes.changes {
            self.replay(stored.change.ok_or(ReplayError::Empty)?)?;
        }
        Ok(())
    }

    fn artifact_mut(&mut self, id: &str) -> Result<&mut Artifact, ReplayError> {
        self.task
            .artifacts
            .iter_mut()
            .find(|a| a.artifact_id == id)
            .ok_or_else(|| ReplayError::UnknownArtifact(id.to_owned()))
    }
}

/// The ids of a record's history messages, as hashes: what lets a status
/// update check for a repeated message without reading the whole history
/// (a long task's history grows with every status message). Built on
/// first use, kept up to date by the record's own appends, and built
/// again when the history it was built for changed otherwise (its length
/// or last message differs). A hash found is confirmed against history
/// (two ids may share one), so the answer is exact.
///
/// A cache, not part of the record's value: it compares equal to any
/// other, and a clone starts empty.
#[derive(Default)]
pub struct HistoryIds {
    built: Option<Built>,
}

struct Built {
    hashes: HashSet<u64, foldhash::fast::FixedState>,
    /// The history's length and last id when last brought up to date.
    len: usize,
    last: String,
}

fn hash_of(id: &str) -> u64 {
    foldhash::fast::FixedState::default().hash_one(id)
}

impl HistoryIds {
    /// Whether `history` holds a message with id `id`.
    pub fn contains(&mut self, history: &[Message], id: &str) -> bool {
        let built = self.up_to_date(history);
        built.hashes.contains(&hash_of(id)) && history.iter().any(|m| m.message_id == id)
    }

    /// `history` just had a message appended (through the record).
    pub fn appended(&mut self, history: &[Message]) {
        let Some(built) = &mut self.built else {
            return;
        };
        match history.split_last() {
            Some((last, before)) if built.len_matches(before) => {
                built.hashes.insert(hash_of(&last.message_id));
                built.len = history.len();
                built.last.clone_from(&last.message_id);
            }
            // Not the history it was built for: built again when needed.
            _ => self.built = None,
        }
    }

    fn up_to_date(&mut self, history: &[Message]) -> &Built {
        let stale = match &self.built {
            Some(built) => !built.len_matches(history),
            None => true,
        };
        if stale {
            self.built = Some(Built {
                hashes: history.iter().map(|m| hash_of(&m.message_id)).collect(),
                len: history.len(),
                last: history
                    .last()
                    .map(|m| m.message_id.clone())
                    .unwrap_or_default(),
            });
        }
        self.built.as_ref().expect("built above")
    }
}

impl Built {
    fn len_matches(&self, history: &[Message]) -> bool {
        history.len() == self.len
            && history
                .last()
                .map_or(self.last.is_empty(), |m| m.message_id == self.last)
    }
}

impl Clone for HistoryIds {
    fn clone(&self) -> Self {
        HistoryIds::default()
    }
}

impl PartialEq for HistoryIds {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for HistoryIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HistoryIds")
    }
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;
    use crate::lifecycle::{
        ArtifactUpdate, Protocol, PushConfigChange, StatusUpdate, TaskEvent, TransitionPolicy,
    };
    use crate::proto::{Part, Role, TaskState, part::Content};
    use crate::wkt::Timestamp;

    fn text(t: &str) -> Vec<Part> {
        vec![Part {
            content: Some(Content::Text(t.into())),
            ..Default::default()
        }]
    }

    fn message(id: &str, role: Role) -> Message {
        Message {
            message_id: id.into(),
            role: role as i32,
            parts: text(id),
            ..Default::default()
        }
    }

    /// An event drawn from a small space, so that ids repeat: repeated
    /// status messages, appends to artifacts that exist or not, chunks
    /// after a seal, replaced artifacts, metadata set and removed, push
    /// configs set and deleted, and some events the record refuses.
    fn event(rng: &mut fastrand::Rng, n: usize) -> TaskEvent {
        use crate::wkt::{Value, value::Kind};
        let id = |rng: &mut fastrand::Rng, prefix: &str| format!("{prefix}{}", rng.usize(0..4));
        match rng.usize(0..10) {
            0..=2 => TaskEvent::Status(StatusUpdate {
                state: [
                    TaskState::Working,
                    TaskState::InputRequired,
                    TaskState::AuthRequired,
                ][rng.usize(0..3)],
                message: rng.bool().then(|| message(&id(rng, "s"), Role::Agent)),
                metadata: None,
            }),
            3..=5 => TaskEvent::Artifact(ArtifactUpdate {
                artifact: crate::proto::Artifact {
                    artifact_id: id(rng, "a"),
                    name: if rng.bool() {
                        format!("n{n}")
                    } else {
                        String::new()
                    },
                    parts: text(&n.to_string()),
                    ..Default::default()
                },
                append: rng.usize(0..3) > 0,
                last_chunk: rng.usize(0..8) == 0,
                metadata: None,
            }),
            6 => TaskEvent::UserMessage(message(&format!("u{n}"), Role::User)),
            7 => {
                let mut update = Struct::default();
                let kind = if rng.bool() {
                    Kind::StringValue(n.to_string())
                } else {
                    Kind::NullValue(0)
                };
                update
                    .fields
                    .insert(id(rng, "k"), Value { kind: Some(kind) });
                TaskEvent::Metadata(update)
            }
            8 => TaskEvent::PushConfig(if rng.bool() {
                PushConfigChange::Set(
                    TaskPushNotificationConfig {
                        id: id(rng, "c"),
                        url: format!("https://hooks.example.test/{n}"),
                        ..Default::default()
                    },
                    if rng.bool() {
                        Protocol::V1_0
                    } else {
                        Protocol::V0_3
                    },
                )
            } else {
                PushConfigChange::Delete(id(rng, "c"))
            }),
            _ => TaskEvent::Status(StatusUpdate {
                state: TaskState::Unspecified,
                message: None,
                metadata: None,
            }),
        }
    }

    fn start() -> TaskRecord {
        TaskRecord::submitted(
            "t".into(),
            "c".into(),
            message("first", Role::User),
            Timestamp {
                seconds: 1,
                nanos: 0,
            },
        )
    }

    /// Whatever the events, replaying what applying them logged, on the
    /// record as it was, gives the record as it is: directly and through
    /// the stored encoding, write by write.
    #[test]
    fn replaying_the_log_gives_the_record_applying_made() {
        for seed in 0..200 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut applied = start();
            let mut replayed = applied.clone();
            let mut decoded = applied.clone();
            let mut refused = 0;
            for write in 0..20 {
                let mut log = Vec::new();
                for n in 0..rng.usize(1..6) {
                    let now = Timestamp {
                        seconds: 2 + write as i64,
                        nanos: n as i32,
                    };
                    let before = log.len();
                    let ev = event(&mut rng, write * 10 + n);
                    match applied.apply_logged(
                        ev,
                        now,
                        TransitionPolicy::Permissive,
                        crate::lifecycle::Cause::Agent,
                        &mut log,
                    ) {
                        Ok(_) => {}
                        Err(_) => {
                            refused += 1;
                            assert_eq!(log.len(), before, "seed {seed}: a refused event logged");
                        }
                    }
                }
                let bytes = Changes::new(log.clone()).encode_to_vec();
                for change in log {
                    replayed.replay(change).unwrap();
                }
                decoded
                    .replay_all(Changes::decode(bytes.as_slice()).unwrap())
                    .unwrap();
                assert_eq!(replayed, applied, "seed {seed}, write {write}");
                assert_eq!(decoded, applied, "seed {seed}, write {write} (decoded)");
                if applied.state().is_terminal() {
                    break;
                }
            }
            assert!(refused < 20 * 6, "seed {seed}: every event refused");
        }
    }

    /// An agent that repeats its status message keeps one copy of it in
    /// history, however long the history, and a history changed behind
    /// the cache's back is read again.
    #[test]
    fn a_repeated_status_message_joins_history_once() {
        let mut record = start();
        let status = |id: &str| {
            TaskEvent::Status(StatusUpdate {
                state: TaskState::Working,
                message: Some(message(id, Role::Agent)),
                metadata: None,
            })
        };
        let now = Timestamp::default();
        for n in 0..1_000 {
            record
                .apply(status(&format!("m{n}")), now, TransitionPolicy::Permissive)
                .unwrap();
        }
        for _ in 0..3 {
            record
                .apply(status("m5"), now, TransitionPolicy::Permissive)
                .unwrap();
        }
        let ids: Vec<&str> = record
            .task
            .history
            .iter()
            .map(|m| m.message_id.as_str())
            .collect();
        assert_eq!(
            ids.len(),
            1_001,
            "the first message, then m0..m999 once each"
        );
        assert_eq!(ids.iter().filter(|id| **id == "m5").count(), 1);
        assert_eq!(ids.iter().filter(|id| **id == "m999").count(), 1);
        // History changed without the record's methods: the cache notices,
        // and a message already there is still not added twice.
        record.task.history.push(message("x1", Role::Agent));
        for id in ["x1", "x2"] {
            record
                .apply(status(id), now, TransitionPolicy::Permissive)
                .unwrap();
        }
        let x1 = record
            .task
            .history
            .iter()
            .filter(|m| m.message_id == "x1")
            .count();
        assert_eq!(x1, 1);
        assert_eq!(record.task.history.len(), 1_002);
    }

    /// A log that does not follow from the record is refused, not
    /// guessed at.
    #[test]
    fn a_change_to_an_artifact_the_task_lacks_is_refused() {
        let mut record = start();
        let chunk = crate::proto::Artifact {
            artifact_id: "nope".into(),
            parts: text("x"),
            ..Default::default()
        };
        assert_eq!(
            record.replay(Change::ExtendArtifact(chunk.clone())),
            Err(ReplayError::UnknownArtifact("nope".into()))
        );
        assert_eq!(
            record.replay(Change::ReplaceArtifact(chunk)),
            Err(ReplayError::UnknownArtifact("nope".into()))
        );
        assert_eq!(
            record.replay_all(Changes {
                changes: vec![StoredChange { change: None }]
            }),
            Err(ReplayError::Empty)
        );
    }
}
