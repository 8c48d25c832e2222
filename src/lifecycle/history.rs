//! How much of a task's history a reader sees (spec §3.2.4).
//!
//! `history_length` unset means no limit (this server returns all history),
//! 0 means none (the field is omitted, which in protobuf is an empty list),
//! n > 0 means the n most recent messages. A negative value is invalid.

use crate::proto::Task;

/// A validated `history_length`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HistoryLength {
    /// Unset: the whole history.
    #[default]
    All,
    /// The n most recent messages (0 = none).
    Last(usize),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("history_length must not be negative, got {0}")]
pub struct HistoryLengthError(pub i32);

impl HistoryLength {
    /// Validates the optional wire value.
    pub fn from_request(value: Option<i32>) -> Result<Self, HistoryLengthError> {
        match value {
            None => Ok(HistoryLength::All),
            Some(n) if n < 0 => Err(HistoryLengthError(n)),
            Some(n) => Ok(HistoryLength::Last(n as usize)),
        }
    }

    /// Trims `task.history` to the n most recent messages, keeping order.
    pub fn apply(self, task: &mut Task) {
        if let HistoryLength::Last(n) = self {
            let len = task.history.len();
            if len > n {
                task.history.drain(..len - n);
            }
        }
    }
}

/// A copy of `task` as a reader asked for it: history trimmed and, when
/// `include_artifacts` is false, artifacts omitted (spec §3.1.4). Copies
/// only what is returned.
pub fn task_view(task: &Task, history: HistoryLength, include_artifacts: bool) -> Task {
    let history = match history {
        HistoryLength::All => task.history.clone(),
        HistoryLength::Last(n) => task.history[task.history.len().saturating_sub(n)..].to_vec(),
    };
    Task {
        id: task.id.clone(),
        context_id: task.context_id.clone(),
        status: task.status.clone(),
        artifacts: if include_artifacts {
            task.artifacts.clone()
        } else {
            Vec::new()
        },
        history,
        metadata: task.metadata.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Artifact, Message};

    fn task_with_history(n: usize) -> Task {
        Task {
            id: "t".into(),
            history: (0..n)
                .map(|i| Message {
                    message_id: format!("m{i}"),
                    ..Default::default()
                })
                .collect(),
            artifacts: vec![Artifact {
                artifact_id: "a".into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn ids(task: &Task) -> Vec<String> {
        task.history.iter().map(|m| m.message_id.clone()).collect()
    }

    #[test]
    fn unset_returns_all_history() {
        let task = task_with_history(3);
        let hl = HistoryLength::from_request(None).unwrap();
        assert_eq!(ids(&task_view(&task, hl, true)), ["m0", "m1", "m2"]);
    }

    #[test]
    fn zero_returns_no_history() {
        let hl = HistoryLength::from_request(Some(0)).unwrap();
        assert!(
            task_view(&task_with_history(3), hl, true)
                .history
                .is_empty()
        );
    }

    #[test]
    fn n_returns_the_n_most_recent_in_order() {
        let task = task_with_history(5);
        let hl = HistoryLength::from_request(Some(2)).unwrap();
        assert_eq!(ids(&task_view(&task, hl, true)), ["m3", "m4"]);
        let mut trimmed = task.clone();
        hl.apply(&mut trimmed);
        assert_eq!(ids(&trimmed), ["m3", "m4"]);
        let hl = HistoryLength::from_request(Some(10)).unwrap();
        assert_eq!(task_view(&task, hl, true).history.len(), 5);
    }

    #[test]
    fn negative_is_invalid() {
        assert_eq!(
            HistoryLength::from_request(Some(-1)),
            Err(HistoryLengthError(-1))
        );
    }

    #[test]
    fn artifacts_are_omitted_unless_asked_for() {
        let task = task_with_history(1);
        assert!(
            task_view(&task, HistoryLength::All, false)
                .artifacts
                .is_empty()
        );
        assert_eq!(
            task_view(&task, HistoryLength::All, true).artifacts.len(),
            1
        );
    }
}
