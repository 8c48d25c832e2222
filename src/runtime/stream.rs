//! Task event streams for SendStreamingMessage and SubscribeToTask.
//!
//! A stream starts with the Task snapshot taken when the request was
//! accepted, then yields the task's events in the order they were applied
//! (spec §3.5.2) and closes right after the event that ends it.
//!
//! Every stream ends once nothing more can happen to the task without a
//! client: at a terminal state; at INPUT_REQUIRED reached by the request's
//! own run (SendStreamingMessage); and when the task is interrupted with no
//! run active or queued (an agent that returned at AUTH_REQUIRED). The
//! snapshot is checked by the same rules, so a stream opened on a task a
//! racing cancel already ended closes right after it.
//!
//! A subscriber that falls more than [`super::SUBSCRIBER_BUFFER`] events
//! behind loses its place in the broadcast ring; instead of closing its
//! stream, it is sent a fresh Task snapshot (which contains everything the
//! missed events changed in the task: status, artifacts, history,
//! metadata) and continues live from there. The `metadata` of the events it
//! missed is not part of the task and is lost to it. On server shutdown an
//! open stream ends with UNAVAILABLE so the client knows to resubscribe.

use std::sync::Arc;

use futures_util::Stream;
use tokio::sync::broadcast::error::RecvError;

use super::loaded::Signal;
use super::{TaskHandle, TaskManager};
use crate::error::A2aError;
use crate::proto::{StreamResponse, Task, TaskState, stream_response::Payload};

/// When a stream closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseAt {
    /// Terminal states only: SubscribeToTask (spec §3.1.6).
    Terminal,
    /// Terminal states and INPUT_REQUIRED: SendStreamingMessage, where the
    /// agent's turn ends when it asks this client for input
    /// (streaming-and-async "Stream Termination"). AUTH_REQUIRED keeps the
    /// stream open: the agent may resume by itself (spec §7.6.1).
    TerminalOrInputRequired,
}

impl CloseAt {
    /// Whether an event in `state` ends the stream; `own_run`: it comes
    /// from the request's own run or a later one.
    fn closes(self, state: TaskState, own_run: bool) -> bool {
        state.is_terminal()
            || (self == CloseAt::TerminalOrInputRequired
                && own_run
                && state == TaskState::InputRequired)
    }

    /// Whether a snapshot ends the stream: by the event rule, or because
    /// the task is interrupted and no run is active or queued.
    fn closes_at_snapshot(self, state: TaskState, own_run: bool, idle: bool) -> bool {
        self.closes(state, own_run) || (idle && state.is_interrupted())
    }
}

fn event_state(event: &StreamResponse) -> Option<TaskState> {
    match &event.payload {
        Some(Payload::StatusUpdate(u)) => u.status.as_ref(),
        Some(Payload::Task(t)) => t.status.as_ref(),
        _ => None,
    }
    .and_then(|s| TaskState::try_from(s.state).ok())
}

fn task_event(task: Task) -> StreamResponse {
    StreamResponse {
        payload: Some(Payload::Task(task)),
    }
}

impl TaskManager {
    /// The stream of a task handle taken with `subscribe = true`.
    pub fn event_stream(
        &self,
        handle: TaskHandle,
        close_at: CloseAt,
    ) -> impl Stream<Item = Result<StreamResponse, A2aError>> + Send + 'static {
        let shared = self.shared.clone();
        async_stream::stream! {
            let TaskHandle { live, snapshot, events, settled, run, idle, run_started, .. } = handle;
            if settled {
                // A repeated request for a task nothing is working on: its
                // current state is the whole answer.
                yield Ok(task_event(snapshot));
                return;
            }
            let Some(mut rx) = events else {
                yield Err(A2aError::Internal("stream without a subscription".into()));
                return;
            };
            // Counted open until the stream is dropped, however it ends.
            let _open = shared.config.metrics.as_ref().map(|m| {
                m.streams.open(match close_at {
                    CloseAt::Terminal => "subscribe",
                    CloseAt::TerminalOrInputRequired => "send",
                })
            });
            let snapshot = task_event(snapshot);
            let closes = event_state(&snapshot)
                .is_some_and(|s| close_at.closes_at_snapshot(s, run_started, idle));
            yield Ok(snapshot);
            if closes {
                return;
            }
            // Made once: a fresh `cancelled()` per event would register
            // with (and leave) the shutdown token's waiter list each time
            // the stream waits, under the token's lock, for every
            // subscriber of every event.
            let shutdown = shared.shutdown.clone().cancelled_owned();
            tokio::pin!(shutdown);
            loop {
                let received = tokio::select! {
                    biased;
                    r = rx.recv() => r,
                    _ = &mut shutdown => {
                        yield Err(A2aError::Unavailable("server is shutting down".into()));
                        break;
                    }
                };
                // A subscriber behind the ring, or events another replica
                // committed that the store no longer holds in full: a
                // fresh snapshot, and live again from it.
                let resync = match &received {
                    Err(RecvError::Lagged(missed)) => {
                        tracing::debug!(task_id = %live.key().id, missed, "subscriber lagged; resynchronising");
                        true
                    }
                    Ok(signal) => matches!(**signal, Signal::Resync),
                    Err(RecvError::Closed) => false,
                };
                let (event, closes) = if resync {
                    if let Some(m) = &shared.config.metrics {
                        m.streams.resynced();
                    }
                    match live.resubscribe(&shared, run).await {
                        Ok((task, fresh, idle, own_run)) => {
                            rx = fresh;
                            let snapshot = task_event(task);
                            let closes = event_state(&snapshot).is_some_and(|s| {
                                close_at.closes_at_snapshot(s, own_run, idle)
                            });
                            (snapshot, closes)
                        }
                        Err(e) => {
                            yield Err(e);
                            break;
                        }
                    }
                } else {
                    match received {
                        // Taken, not copied, when this stream holds the last
                        // reference: a task's only subscriber (the ring lets
                        // go of an event once every receiver has it).
                        Ok(signal) => match Arc::unwrap_or_clone(signal) {
                            Signal::Event { run: from, event } => {
                                let closes = event_state(&event)
                                    .is_some_and(|s| close_at.closes(s, from >= run));
                                (event, closes)
                            }
                            Signal::Idle | Signal::Resync => break,
                            Signal::Failed(e) => {
                                yield Err(e);
                                break;
                            }
                        },
                        Err(_) => break,
                    }
                };
                yield Ok(event);
                if closes {
                    break;
                }
            }
        }
    }
}
