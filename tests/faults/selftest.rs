//! The checker on made-up histories (no servers, no PostgreSQL): a
//! consistent one has no violation, and each planted violation is found by
//! its check and no other, so a check that could never fail, or one that
//! fires on a sound history, fails here.

use std::collections::BTreeMap;
use std::time::Duration;

use a2a_lifecycle::proto::{Message, Part, Role, Task, TaskState, TaskStatus, part::Content};
use a2a_lifecycle::wkt::Timestamp;

use crate::checker::{self, Check, ProcessLog};
use crate::cluster::LogLine;
use crate::history::{
    Call, Clock, EventKey, Fault, Item, MessageKind, Post, Records, Sent, StreamEnd, StreamLog, T,
};

/// A made-up run: its records, streams, tasks and logs.
struct World {
    clock: Clock,
    records: Records,
    streams: Vec<StreamLog>,
    tasks: BTreeMap<String, (String, Task)>,
    processes: Vec<ProcessLog>,
}

fn ms(n: i64) -> T {
    T(n * 1000)
}

impl World {
    fn timestamp(&self, t: T) -> Timestamp {
        let us = self.clock.wall_us(t);
        Timestamp {
            seconds: us.div_euclid(1_000_000),
            nanos: i32::try_from(us.rem_euclid(1_000_000) * 1000).expect("nanos"),
        }
    }

    fn status(&self, state: TaskState, at: T, text: &str) -> EventKey {
        let ts = self.timestamp(at);
        EventKey::Status {
            state: state as i32,
            at: (ts.seconds, ts.nanos),
            message_id: String::new(),
            text: text.into(),
        }
    }

    fn chunk(&self, n: u32) -> EventKey {
        EventKey::Artifact {
            id: "fanout".into(),
            append: n > 2,
            last: false,
            content: n.to_string(),
        }
    }

    fn task(&self, id: &str, state: TaskState, at: T, text: &str, messages: &[&str]) -> Task {
        Task {
            id: id.into(),
            status: Some(TaskStatus {
                state: state as i32,
                timestamp: Some(self.timestamp(at)),
                message: (!text.is_empty()).then(|| Message {
                    role: Role::Agent as i32,
                    parts: vec![Part {
                        content: Some(Content::Text(text.into())),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
            }),
            history: messages
                .iter()
                .map(|m| Message {
                    message_id: (*m).into(),
                    role: Role::User as i32,
                    parts: vec![Part {
                        content: Some(Content::Text("fanout:2:0:0".into())),
                        ..Default::default()
                    }],
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    /// A log line of `process` at `at`.
    fn line(&mut self, process: usize, at: T, text: &str) {
        let stamp = chrono::DateTime::from_timestamp_micros(self.clock.wall_us(at))
            .expect("a time")
            .to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        self.processes[process].lines.push(LogLine {
            at,
            text: format!("{stamp} DEBUG a2a_lifecycle::runtime::run: {text}"),
        });
    }

    fn run(&mut self, process: usize, task: &str, message: &str, from: T, to: T) {
        self.line(
            process,
            from,
            &format!("agent run started task_id={task} message_id={message}"),
        );
        self.line(process, to, &format!("agent run ended task_id={task}"));
    }

    fn sent(&mut self, id: &str, task: &str, status: Option<EventKey>) {
        self.records.sent.push(Sent {
            message_id: id.into(),
            tenant: String::new(),
            kind: MessageKind::New,
            text: "fanout:2:0:0".into(),
            task_id: Some(task.into()),
            acked: true,
            answered_task: Some(task.into()),
            answered: status,
            push_token: Some(format!("hook-{id}")),
            first: ms(900),
            last: ms(900),
        });
    }

    fn stream(&mut self, task: &str, snapshot: EventKey, events: &[EventKey], end: StreamEnd) {
        let mut items = vec![(
            ms(1000),
            Item::Snapshot {
                task_id: task.into(),
                status: snapshot,
            },
        )];
        items.extend(
            events
                .iter()
                .enumerate()
                .map(|(i, k)| (ms(1100 + 100 * i as i64), Item::Event(k.clone()))),
        );
        self.streams.push(StreamLog {
            id: self.streams.len(),
            kind: "subscribe",
            replica: "r1.0".into(),
            tenant: String::new(),
            task_id: Some(task.into()),
            message_id: None,
            start: ms(1000),
            items,
            end: Some((ms(3000), end)),
        });
    }

    fn post(&mut self, task: &str, token: &str, at: T, event: EventKey) {
        self.records.posts.push(Post {
            at,
            task_id: task.into(),
            token: token.into(),
            event: Ok(event),
        });
    }

    /// A fanout task `t1` made by `m1`, run on r0.0 from 1 s to 2 s:
    /// WORKING, update 1, chunk 2, COMPLETED; two subscribers, a
    /// webhook; all consistent.
    fn sound() -> World {
        let process = |name: &str, slot| ProcessLog {
            name: name.into(),
            slot,
            started: T(0),
            died: None,
            lines: Vec::new(),
        };
        let mut w = World {
            clock: Clock::new(),
            records: Records::default(),
            streams: Vec::new(),
            tasks: BTreeMap::new(),
            processes: vec![process("r0.0", 0), process("r1.0", 1)],
        };
        let working = w.status(TaskState::Working, ms(1050), "");
        let one = w.status(TaskState::Working, ms(1200), "1");
        let two = w.chunk(2);
        let done = w.status(TaskState::Completed, ms(1900), "");
        let task = w.task("t1", TaskState::Completed, ms(1900), "", &["m1"]);
        w.tasks.insert("t1".into(), (String::new(), task));
        w.sent("m1", "t1", Some(working.clone()));
        w.run(0, "t1", "m1", ms(1000), ms(2000));
        w.stream(
            "t1",
            working.clone(),
            &[one.clone(), two.clone(), done.clone()],
            StreamEnd::Clean,
        );
        w.stream(
            "t1",
            one.clone(),
            &[two.clone(), done.clone()],
            StreamEnd::Clean,
        );
        for (i, k) in [working, one, two, done].into_iter().enumerate() {
            w.post("t1", "hook-m1", ms(1500 + 100 * i as i64), k);
        }
        w
    }

    fn violations(&self) -> Vec<checker::Violation> {
        let unreadable = BTreeMap::new();
        checker::check(&checker::Input {
            records: &self.records,
            streams: &self.streams,
            tasks: &self.tasks,
            unreadable: &unreadable,
            processes: &self.processes,
            clock: &self.clock,
            lease: Duration::from_secs(2),
            faults_ended: ms(10_000),
        })
        .violations
    }
}

/// Asserts that the planted violation is found by `check` alone.
fn found_by(w: &World, check: Check, what: &str) {
    let found = w.violations();
    let text: Vec<String> = found
        .iter()
        .map(|v| format!("{:?}: {v}", v.check))
        .collect();
    assert!(
        found.iter().any(|v| v.check == check),
        "{what}: not found by check {check:?}; found {text:?}"
    );
    assert!(
        found.iter().all(|v| v.check == check),
        "{what}: found by other checks than {check:?}: {text:?}"
    );
}

#[test]
fn the_checker_finds_planted_violations_and_only_those() {
    let sound = World::sound();
    let found: Vec<String> = sound.violations().iter().map(|v| v.to_string()).collect();
    assert!(found.is_empty(), "a sound history: {found:?}");

    let mut w = World::sound();
    w.records.sent.push(Sent {
        kind: MessageKind::FollowUp,
        message_id: "m9".into(),
        push_token: None,
        ..w.records.sent[0].clone()
    });
    found_by(
        &w,
        Check::Acknowledged,
        "an acknowledged follow-up in no history",
    );

    let mut w = World::sound();
    w.run(1, "t9", "m1", ms(3000), ms(3100));
    found_by(&w, Check::Runs, "a message run twice");

    let mut w = World::sound();
    w.run(1, "t1", "m8", ms(1500), ms(2500));
    found_by(&w, Check::Runs, "two runs of a task at once");

    // A run whose replica was paused past its lease, taken over meanwhile:
    // counted as ended when its lease ran out if it ends within a lease
    // of the resume, not if it runs on.
    for (stale_end, overlap) in [(4500, false), (7000, true)] {
        let mut w = World::sound();
        w.records.faults.push(Fault {
            kind: "pause".into(),
            slot: Some(0),
            process: Some("r0.0".into()),
            start: ms(1200),
            end: Some(ms(4000)),
            past_lease: true,
            note: String::new(),
        });
        w.run(0, "t4", "m4", ms(1000), ms(stale_end));
        w.run(1, "t4", "m5", ms(3000), ms(3500));
        if overlap {
            found_by(&w, Check::Runs, "a paused run that runs on past its resume");
        } else {
            let found: Vec<String> = w.violations().iter().map(|v| v.to_string()).collect();
            assert!(
                found.is_empty(),
                "a paused run that stops at its resume: {found:?}"
            );
        }
    }

    let mut w = World::sound();
    let one = w.status(TaskState::Working, ms(1200), "1");
    let working = w.status(TaskState::Working, ms(1050), "");
    w.stream("t1", working, &[w.chunk(2), one], StreamEnd::Stalled);
    found_by(&w, Check::Streams, "a stream in another order");

    let mut w = World::sound();
    let working = w.status(TaskState::Working, ms(1050), "");
    let one = w.status(TaskState::Working, ms(1200), "1");
    let done = w.status(TaskState::Completed, ms(1900), "");
    w.stream("t1", working, &[one, done], StreamEnd::Stalled);
    found_by(&w, Check::Streams, "a stream that lost an event");

    let mut w = World::sound();
    let chunk = w.chunk(2);
    w.post("t1", "hook-m1", ms(2500), chunk);
    found_by(
        &w,
        Check::Webhooks,
        "a stale duplicate after the terminal event",
    );

    let mut w = World::sound();
    w.records.posts.remove(1);
    found_by(&w, Check::Webhooks, "an event never delivered");

    let mut w = World::sound();
    w.records.posts.swap(1, 2);
    found_by(&w, Check::Webhooks, "two events delivered out of order");

    let mut w = World::sound();
    let task = w.task("t2", TaskState::Working, ms(1300), "", &["m2"]);
    w.tasks.insert("t2".into(), (String::new(), task));
    w.sent("m2", "t2", None);
    w.records.sent[1].push_token = None;
    w.run(1, "t2", "m2", ms(1200), ms(1400));
    found_by(&w, Check::Settled, "a task left WORKING");

    let mut w = World::sound();
    let task = w.task(
        "t3",
        TaskState::Failed,
        ms(4000),
        a2a_lifecycle::runtime::RESTART_FAILURE,
        &["m3"],
    );
    w.line(
        1,
        ms(3900),
        "WARN a2a_lifecycle::runtime: this replica lost its lease: its runs were stopped",
    );
    w.tasks.insert("t3".into(), (String::new(), task));
    w.sent("m3", "t3", None);
    w.records.sent[1].push_token = None;
    w.run(1, "t3", "m3", ms(1200), ms(1400));
    found_by(
        &w,
        Check::Healthy,
        "a healthy replica's lease lost, its task failed",
    );
    assert_eq!(
        w.violations().len(),
        2,
        "the lease loss and the failed task, each once"
    );

    // Excused by a fault on the process that ran it.
    w.records.faults.push(Fault {
        kind: "cut".into(),
        slot: Some(1),
        process: Some("r1.0".into()),
        start: ms(3000),
        end: Some(ms(5000)),
        past_lease: true,
        note: String::new(),
    });
    let found: Vec<String> = w.violations().iter().map(|v| v.to_string()).collect();
    assert!(
        found.is_empty(),
        "a cut-off replica's task failed: {found:?}"
    );

    // A task failed as owing a follow-up's run: excused by a fault on the
    // replica that took the follow-up, not on the one that ran the task
    // before; wrong when the follow-up ran after all.
    for (follow_up_ran, taker_paused) in [(false, true), (false, false), (true, true)] {
        let mut w = World::sound();
        let task = w.task(
            "t5",
            TaskState::Failed,
            ms(6000),
            a2a_lifecycle::runtime::LOST_FOLLOW_UP_FAILURE,
            &["m5", "m6"],
        );
        w.tasks.insert("t5".into(), (String::new(), task));
        w.sent("m5", "t5", None);
        w.records.sent[1].push_token = None;
        w.run(1, "t5", "m5", ms(1200), ms(1400));
        w.records.sent.push(Sent {
            kind: MessageKind::FollowUp,
            message_id: "m6".into(),
            push_token: None,
            ..w.records.sent[1].clone()
        });
        w.records.calls.push(Call {
            kind: "send",
            tenant: String::new(),
            replica: "r0.0".into(),
            message_id: Some("m6".into()),
            task_id: Some("t5".into()),
            start: ms(2000),
            end: ms(2100),
            outcome: crate::history::Outcome::Ok("task t5".into()),
        });
        if follow_up_ran {
            w.run(0, "t5", "m6", ms(2200), ms(2300));
        }
        if taker_paused {
            w.records.faults.push(Fault {
                kind: "pause".into(),
                slot: Some(0),
                process: Some("r0.0".into()),
                start: ms(2150),
                end: Some(ms(5000)),
                past_lease: true,
                note: String::new(),
            });
        }
        let what = format!("a lost follow-up (ran: {follow_up_ran}, taker paused: {taker_paused})");
        if taker_paused && !follow_up_ran {
            let found: Vec<String> = w.violations().iter().map(|v| v.to_string()).collect();
            assert!(found.is_empty(), "{what}: {found:?}");
        } else {
            found_by(&w, Check::Healthy, &what);
        }
    }
}
