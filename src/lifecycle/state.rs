//! Classification of [`TaskState`] values.
//!
//! The proto marks COMPLETED, FAILED, CANCELED and REJECTED as terminal and
//! INPUT_REQUIRED and AUTH_REQUIRED as interrupted (proto `TaskState`,
//! spec §4.1.3). SUBMITTED and WORKING are in neither group; this project
//! calls them active (seed 000). `TASK_STATE_UNSPECIFIED` is the proto3 zero
//! value for "unknown" and is never a state a task can be in: it is an error,
//! as is any number outside the enum.

use crate::proto::TaskState;

/// The three groups every real task state belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StateClass {
    /// SUBMITTED, WORKING: the agent owns the next step.
    Active,
    /// INPUT_REQUIRED, AUTH_REQUIRED: the task waits on something outside the
    /// agent. A blocking SendMessage returns here (spec §3.2.2).
    Interrupted,
    /// COMPLETED, FAILED, CANCELED, REJECTED: the task has ended for good.
    Terminal,
}

/// A value that is not one of the eight real task states.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    #[error("TASK_STATE_UNSPECIFIED is not a task state")]
    Unspecified,
    #[error("{0} is not a TaskState number")]
    UnknownNumber(i32),
}

/// Classifies a state; `UNSPECIFIED` is an error, never a class.
pub fn classify(state: TaskState) -> Result<StateClass, StateError> {
    use TaskState::*;
    Ok(match state {
        Unspecified => return Err(StateError::Unspecified),
        Submitted | Working => StateClass::Active,
        InputRequired | AuthRequired => StateClass::Interrupted,
        Completed | Failed | Canceled | Rejected => StateClass::Terminal,
    })
}

/// Converts a wire number into a real task state.
pub fn state_from_i32(value: i32) -> Result<TaskState, StateError> {
    let state = TaskState::try_from(value).map_err(|_| StateError::UnknownNumber(value))?;
    classify(state)?;
    Ok(state)
}

impl TaskState {
    /// COMPLETED, FAILED, CANCELED or REJECTED (proto `TaskState`).
    pub fn is_terminal(self) -> bool {
        classify(self) == Ok(StateClass::Terminal)
    }

    /// INPUT_REQUIRED or AUTH_REQUIRED (proto `TaskState`).
    pub fn is_interrupted(self) -> bool {
        classify(self) == Ok(StateClass::Interrupted)
    }

    /// SUBMITTED or WORKING.
    pub fn is_active(self) -> bool {
        classify(self) == Ok(StateClass::Active)
    }

    /// Where a blocking SendMessage returns: terminal or interrupted
    /// (spec §3.2.2).
    pub fn ends_blocking_wait(self) -> bool {
        self.is_terminal() || self.is_interrupted()
    }

    /// The eight states a task can be in, in number order.
    pub const REAL: [TaskState; 8] = [
        TaskState::Submitted,
        TaskState::Working,
        TaskState::Completed,
        TaskState::Failed,
        TaskState::Canceled,
        TaskState::InputRequired,
        TaskState::Rejected,
        TaskState::AuthRequired,
    ];

    /// Every value of the enum, in number order, `UNSPECIFIED` included.
    pub const ALL: [TaskState; 9] = [
        TaskState::Unspecified,
        TaskState::Submitted,
        TaskState::Working,
        TaskState::Completed,
        TaskState::Failed,
        TaskState::Canceled,
        TaskState::InputRequired,
        TaskState::Rejected,
        TaskState::AuthRequired,
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pins the generated enum to the proto: nine values, numbered 0..8,
    /// with the ProtoJSON names of spec §5.5.
    #[test]
    fn task_state_numbers_and_names_are_pinned() {
        let expected = [
            (0, "TASK_STATE_UNSPECIFIED"),
            (1, "TASK_STATE_SUBMITTED"),
            (2, "TASK_STATE_WORKING"),
            (3, "TASK_STATE_COMPLETED"),
            (4, "TASK_STATE_FAILED"),
            (5, "TASK_STATE_CANCELED"),
            (6, "TASK_STATE_INPUT_REQUIRED"),
            (7, "TASK_STATE_REJECTED"),
            (8, "TASK_STATE_AUTH_REQUIRED"),
        ];
        assert_eq!(TaskState::ALL.len(), expected.len());
        for (state, (number, name)) in TaskState::ALL.iter().zip(expected) {
            assert_eq!(*state as i32, number);
            assert_eq!(state.as_str_name(), name);
            assert_eq!(TaskState::try_from(number).unwrap(), *state);
        }
        assert!(TaskState::try_from(9).is_err());
    }

    #[test]
    fn every_state_has_exactly_one_class() {
        use TaskState::*;
        let cases = [
            (Submitted, StateClass::Active),
            (Working, StateClass::Active),
            (InputRequired, StateClass::Interrupted),
            (AuthRequired, StateClass::Interrupted),
            (Completed, StateClass::Terminal),
            (Failed, StateClass::Terminal),
            (Canceled, StateClass::Terminal),
            (Rejected, StateClass::Terminal),
        ];
        for (state, class) in cases {
            assert_eq!(classify(state), Ok(class), "{state:?}");
            let flags = [
                state.is_active(),
                state.is_interrupted(),
                state.is_terminal(),
            ];
            assert_eq!(flags.iter().filter(|f| **f).count(), 1, "{state:?}");
        }
    }

    /// Seed 000: UNSPECIFIED or an unknown value is an error, never a state.
    #[test]
    fn unspecified_and_unknown_numbers_are_errors() {
        assert_eq!(
            classify(TaskState::Unspecified),
            Err(StateError::Unspecified)
        );
        assert!(!TaskState::Unspecified.is_active());
        assert!(!TaskState::Unspecified.is_terminal());
        assert!(!TaskState::Unspecified.is_interrupted());
        assert_eq!(state_from_i32(0), Err(StateError::Unspecified));
        assert_eq!(state_from_i32(9), Err(StateError::UnknownNumber(9)));
        assert_eq!(state_from_i32(-1), Err(StateError::UnknownNumber(-1)));
        for n in 1..=8 {
            assert_eq!(state_from_i32(n).unwrap() as i32, n);
        }
    }

    #[test]
    fn blocking_wait_ends_at_terminal_or_interrupted() {
        for state in TaskState::ALL {
            let expected = matches!(
                classify(state),
                Ok(StateClass::Terminal | StateClass::Interrupted)
            );
            assert_eq!(state.ends_blocking_wait(), expected, "{state:?}");
        }
    }
}
