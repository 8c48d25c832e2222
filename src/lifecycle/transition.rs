//! Which state changes are allowed.
//!
//! Neither the specification nor the proto has a transition table (seed 000,
//! "The transitions the specification allows"). What it does say: an agent
//! may ask for input (spec §3.4.3), must move to AUTH_REQUIRED to ask for
//! authorization and may resume without a client message (spec §7.6.1), may
//! reject at creation or later (proto `TaskState`), and a terminal task is
//! final (spec §3.1.1, §3.1.5, §3.1.6). So the default policy,
//! [`TransitionPolicy::Permissive`], accepts any change out of a non-terminal
//! state, including SUBMITTED -> REJECTED and AUTH_REQUIRED -> WORKING, and
//! none out of a terminal one. Nothing enters UNSPECIFIED.
//!
//! Seed 001 proposes a stricter table. It is offered as the opt-in
//! [`TransitionPolicy::Strict`]; README documents the difference: it forbids,
//! among others, SUBMITTED -> COMPLETED, SUBMITTED -> INPUT_REQUIRED,
//! WORKING -> REJECTED and every edge *into* AUTH_REQUIRED, so the demo
//! deployer cannot run under it.

use super::state::classify;
use crate::proto::TaskState;

/// The transition rules a server enforces.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TransitionPolicy {
    /// Any transition out of a non-terminal state (seed 000, the spec).
    #[default]
    Permissive,
    /// Seed 001's table, plus same-state updates (progress messages) in
    /// non-terminal states.
    Strict,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    #[error("task is in terminal state {} and cannot change", .0.as_str_name())]
    FromTerminal(TaskState),
    #[error("{} is not a state a task can be in", .0.as_str_name())]
    InvalidState(TaskState),
    #[error("transition {} -> {} is not allowed by the strict policy", .0.as_str_name(), .1.as_str_name())]
    NotInTable(TaskState, TaskState),
}

/// Seed 001's table, in its 0.3 names: submitted -> working | rejected |
/// canceled; working -> completed | failed | canceled | input-required;
/// input-required -> working | canceled; auth-required -> working | canceled.
fn in_strict_table(from: TaskState, to: TaskState) -> bool {
    use TaskState::*;
    matches!(
        (from, to),
        (Submitted, Working | Rejected | Canceled)
            | (Working, Completed | Failed | Canceled | InputRequired)
            | (InputRequired, Working | Canceled)
            | (AuthRequired, Working | Canceled)
    )
}

impl TransitionPolicy {
    /// Checks a status change of a task from `from` to `to`.
    pub fn check(self, from: TaskState, to: TaskState) -> Result<(), TransitionError> {
        classify(from).map_err(|_| TransitionError::InvalidState(from))?;
        classify(to).map_err(|_| TransitionError::InvalidState(to))?;
        if from.is_terminal() {
            return Err(TransitionError::FromTerminal(from));
        }
        match self {
            TransitionPolicy::Permissive => Ok(()),
            TransitionPolicy::Strict if from == to || in_strict_table(from, to) => Ok(()),
            TransitionPolicy::Strict => Err(TransitionError::NotInTable(from, to)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TaskState::*;

    const REAL: [TaskState; 8] = TaskState::REAL;

    /// Exhaustive: every (from, to) pair under the permissive policy.
    #[test]
    fn permissive_accepts_everything_out_of_non_terminal_and_nothing_out_of_terminal() {
        for from in REAL {
            for to in REAL {
                let result = TransitionPolicy::Permissive.check(from, to);
                if from.is_terminal() {
                    assert_eq!(result, Err(TransitionError::FromTerminal(from)));
                } else {
                    assert_eq!(result, Ok(()), "{from:?} -> {to:?}");
                }
            }
        }
    }

    /// The transitions seed 000 names explicitly (spec §7.6.1, proto TaskState).
    #[test]
    fn permissive_allows_the_spec_examples() {
        let p = TransitionPolicy::Permissive;
        assert_eq!(p.check(Submitted, Rejected), Ok(()));
        assert_eq!(p.check(AuthRequired, Working), Ok(()));
        assert_eq!(p.check(Submitted, AuthRequired), Ok(()));
        assert_eq!(p.check(InputRequired, Completed), Ok(()));
    }

    #[test]
    fn nothing_enters_or_leaves_unspecified() {
        for policy in [TransitionPolicy::Permissive, TransitionPolicy::Strict] {
            for state in REAL {
                assert_eq!(
                    policy.check(state, Unspecified),
                    Err(TransitionError::InvalidState(Unspecified))
                );
                assert_eq!(
                    policy.check(Unspecified, state),
                    Err(TransitionError::InvalidState(Unspecified))
                );
            }
        }
    }

    /// Exhaustive: every pair under the strict policy against seed 001's table.
    #[test]
    fn strict_follows_seed_001_table() {
        let allowed = [
            (Submitted, Working),
            (Submitted, Rejected),
            (Submitted, Canceled),
            (Working, Completed),
            (Working, Failed),
            (Working, Canceled),
            (Working, InputRequired),
            (InputRequired, Working),
            (InputRequired, Canceled),
            (AuthRequired, Working),
            (AuthRequired, Canceled),
        ];
        for from in REAL {
            for to in REAL {
                let result = TransitionPolicy::Strict.check(from, to);
                if from.is_terminal() {
                    assert_eq!(result, Err(TransitionError::FromTerminal(from)));
                } else if from == to || allowed.contains(&(from, to)) {
                    assert_eq!(result, Ok(()), "{from:?} -> {to:?}");
                } else {
                    assert_eq!(result, Err(TransitionError::NotInTable(from, to)));
                }
            }
        }
        // The differences README documents.
        assert!(
            TransitionPolicy::Strict
                .check(Submitted, AuthRequired)
                .is_err()
        );
        assert!(
            TransitionPolicy::Strict
                .check(Submitted, Completed)
                .is_err()
        );
    }
}
