//! Task state names on the wire.
//!
//! Output always uses the ProtoJSON name (`TASK_STATE_INPUT_REQUIRED`,
//! spec §5.5), which prost generates as `as_str_name`. Input accepts the
//! ProtoJSON name and, for clients still on protocol 0.3, the old kebab-case
//! names (`input-required`, ...). The 0.3 name `unknown` and
//! `TASK_STATE_UNSPECIFIED` name no real state and are errors (seed 000 wins
//! over seed 001, which lists `unknown` as a tenth state).

use super::state::classify;
use crate::proto::TaskState;

/// The 0.3 names of the eight real states (seed 001, spec §4.1.3 migration).
const V03_NAMES: [(&str, TaskState); 8] = [
    ("submitted", TaskState::Submitted),
    ("working", TaskState::Working),
    ("input-required", TaskState::InputRequired),
    ("auth-required", TaskState::AuthRequired),
    ("completed", TaskState::Completed),
    ("failed", TaskState::Failed),
    ("canceled", TaskState::Canceled),
    ("rejected", TaskState::Rejected),
];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateNameError {
    #[error("{0:?} does not name a real task state")]
    NotAState(String),
    #[error("{0:?} is not a task state name")]
    Unknown(String),
}

/// The ProtoJSON name of a state, e.g. `TASK_STATE_WORKING`.
pub fn state_name(state: TaskState) -> &'static str {
    state.as_str_name()
}

/// The 0.3 name of a state (`input-required`), for 0.3 clients; `unknown`
/// for UNSPECIFIED, as 0.3 calls a state it cannot name.
pub fn v03_state_name(state: TaskState) -> &'static str {
    V03_NAMES
        .iter()
        .find(|(_, s)| *s == state)
        .map(|(n, _)| *n)
        .unwrap_or("unknown")
}

/// Parses a state name: the ProtoJSON name or a 0.3 kebab-case name.
pub fn parse_state_name(name: &str) -> Result<TaskState, StateNameError> {
    let state = TaskState::from_str_name(name)
        .or_else(|| V03_NAMES.iter().find(|(n, _)| *n == name).map(|(_, s)| *s));
    match state {
        Some(state) if classify(state).is_ok() => Ok(state),
        Some(_) => Err(StateNameError::NotAState(name.to_owned())),
        None if name == "unknown" => Err(StateNameError::NotAState(name.to_owned())),
        None => Err(StateNameError::Unknown(name.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protojson_names_round_trip_for_every_real_state() {
        for state in TaskState::ALL.into_iter().skip(1) {
            let name = state_name(state);
            assert!(name.starts_with("TASK_STATE_"));
            assert_eq!(parse_state_name(name), Ok(state));
        }
    }

    #[test]
    fn v03_names_are_accepted_on_input() {
        for (name, state) in V03_NAMES {
            assert_eq!(parse_state_name(name), Ok(state));
            assert_eq!(v03_state_name(state), name);
            // The 0.3 name maps to the state whose ProtoJSON name ends in it.
            let suffix = name.replace('-', "_").to_uppercase();
            assert!(state_name(state).ends_with(&suffix), "{name}");
        }
        assert_eq!(V03_NAMES.len(), 8);
    }

    #[test]
    fn unspecified_unknown_and_garbage_are_errors() {
        for name in ["TASK_STATE_UNSPECIFIED", "unknown"] {
            assert_eq!(
                parse_state_name(name),
                Err(StateNameError::NotAState(name.into()))
            );
        }
        for name in [
            "",
            "WORKING",
            "task_state_working",
            "Working",
            "input_required",
            "done",
        ] {
            assert_eq!(
                parse_state_name(name),
                Err(StateNameError::Unknown(name.into()))
            );
        }
    }
}
