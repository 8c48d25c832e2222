//! The clients: concurrent users of the replicas, as real clients behave.
//!
//! Each client, until told to stop, starts a `fanout` task of the bench
//! agent (default tenant; numbered updates, long enough to span faults),
//! a `code-reviewer` task (INPUT_REQUIRED, then a follow-up runs it to
//! COMPLETED), or a burst of 4-10 quick fanout tasks at once (10-30
//! updates 10-50 ms apart, each with a webhook: many deliveries in
//! flight), each with a client-chosen message id, blocking,
//! non-blocking or streaming, most with a push config (a webhook of the
//! test, the config's token naming the creating message). A call that
//! fails or times out is sent again, with the same message id, to a
//! replica picked at random (another one than the last when it can): the
//! idempotent retry a real client makes. Around the tasks: subscribers
//! (SubscribeToTask) on random replicas at random moments, which
//! subscribe again elsewhere when their stream breaks; cancels; and, on a
//! waiting review task, one follow-up, two different follow-ups at once to
//! two replicas, or a cancel.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use a2a_lifecycle::proto::{
    CancelTaskRequest, GetTaskRequest, ListTasksRequest, Message, Part, Role,
    SendMessageConfiguration, SendMessageRequest, StreamResponse, SubscribeToTaskRequest, Task,
    TaskPushNotificationConfig, part::Content, send_message_response, stream_response::Payload,
};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::{Code, Status, Streaming};

use crate::cluster::Cluster;
use crate::history::{
    Call, EventKey, History, Item, MessageKind, Outcome, Sent, StreamEnd, StreamLog, locked,
};

/// Attempts of one logical call before the client gives up on it.
const ATTEMPTS: u32 = 8;
/// A unary call's (and a stream's first event's) timeout.
const UNARY_TIMEOUT: Duration = Duration::from_secs(4);
/// A blocking send's timeout: longer than any task of the workload runs.
const BLOCKING_TIMEOUT: Duration = Duration::from_secs(12);
/// A stream that carries nothing this long is given up (and subscribed
/// to again elsewhere).
const STREAM_IDLE: Duration = Duration::from_secs(15);
/// How many streams one subscriber opens, one after another, at most.
const RESUBSCRIBES: usize = 4;

pub const REVIEWER: &str = "code-reviewer";

/// What every client shares.
pub struct Ctx {
    pub cluster: Arc<Cluster>,
    pub history: Arc<History>,
    /// The test's webhook URL.
    pub webhook: String,
    /// Set when the faults end: no new work is started.
    pub stop: CancellationToken,
    /// Set when the system has settled: open streams stop being read.
    pub streams_stop: CancellationToken,
    /// Background work (subscribers, cancels, stream readers).
    pub tracker: TaskTracker,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Blocking,
    NonBlocking,
    Streaming,
}

impl Mode {
    fn pick(rng: &mut fastrand::Rng) -> Mode {
        match rng.u8(..10) {
            0..=2 => Mode::Blocking,
            3..=6 => Mode::NonBlocking,
            _ => Mode::Streaming,
        }
    }

    fn name(self, kind: MessageKind) -> &'static str {
        match (kind, self) {
            (MessageKind::New, Mode::Blocking) => "send/blocking",
            (MessageKind::New, Mode::NonBlocking) => "send/non-blocking",
            (MessageKind::New, Mode::Streaming) => "send/stream",
            (MessageKind::FollowUp, Mode::Blocking) => "follow-up/blocking",
            (MessageKind::FollowUp, Mode::NonBlocking) => "follow-up/non-blocking",
            (MessageKind::FollowUp, Mode::Streaming) => "follow-up/stream",
        }
    }
}

/// Codes after which the same request is not sent again: the server
/// decided (a terminal task, an unknown one) or the request is wrong.
fn retryable(code: Code) -> bool {
    !matches!(
        code,
        Code::FailedPrecondition
            | Code::NotFound
            | Code::InvalidArgument
            | Code::Unimplemented
            | Code::PermissionDenied
            | Code::Unauthenticated
    )
}

/// Sleeps `ms`, unless `token` is cancelled first: whether it slept.
async fn pause(token: &CancellationToken, ms: u64) -> bool {
    tokio::select! {
        _ = token.cancelled() => false,
        _ = tokio::time::sleep(Duration::from_millis(ms)) => true,
    }
}

/// A backoff between attempts: 100 ms doubling to 2 s, with jitter.
fn backoff(rng: &mut fastrand::Rng, attempt: u32) -> Duration {
    let base = (100u64 << attempt.min(5)).min(2000);
    Duration::from_millis(base / 2 + rng.u64(..=base / 2))
}

fn user_message(message_id: String, text: &str, task_id: Option<&str>) -> Message {
    Message {
        message_id,
        role: Role::User as i32,
        task_id: task_id.unwrap_or_default().to_owned(),
        parts: vec![Part {
            content: Some(Content::Text(text.into())),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// One client, until `ctx.stop`.
pub async fn client(ctx: Arc<Ctx>, n: usize, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut op = 0;
    while !ctx.stop.is_cancelled() {
        op += 1;
        let id = format!("c{n}-{op}");
        match rng.u8(..20) {
            0..=9 => fanout(&ctx, &mut rng, &id).await,
            10..=16 => review(&ctx, &mut rng, &id).await,
            _ => burst(&ctx, &mut rng, &id).await,
        }
        pause(&ctx.stop, rng.u64(50..400)).await;
    }
}

/// A bench task: WORKING, a wait, K numbered updates, COMPLETED; maybe
/// subscribers, maybe a cancel. One in ten is long: hundreds of updates a
/// few milliseconds apart, tens of KB of changes, so that the runner's
/// whole writes of a running task (issue "long-lived tasks") happen
/// mid-run, with subscribers on other replicas catching up across them.
async fn fanout(ctx: &Arc<Ctx>, rng: &mut fastrand::Rng, id: &str) {
    let text = if rng.u8(..10) == 0 {
        format!(
            "fanout:{}:{}:{}",
            rng.u32(200..=400),
            rng.u32(100..=1500),
            rng.u32(1..=4) * 1000
        )
    } else {
        format!(
            "fanout:{}:{}:{}",
            rng.u32(4..=24),
            rng.u32(100..=1500),
            rng.u32(30..=200) * 1000
        )
    };
    let push = rng.u8(..10) < 7;
    let message = user_message(format!("{id}-fanout"), &text, None);
    let mode = Mode::pick(rng);
    let Some(task) = send(ctx, rng, "", message, mode, push).await else {
        return;
    };
    if crate::history::terminal(task_state(&task)) {
        return;
    }
    for _ in 0..rng.usize(0..=2) {
        let (ctx, id, delay, seed) = (ctx.clone(), task.id.clone(), rng.u64(..1500), rng.u64(..));
        ctx.tracker
            .clone()
            .spawn(async move { subscriber(ctx, String::new(), id, delay, seed).await });
    }
    if rng.u8(..100) < 15 {
        let (ctx, id, delay, seed) = (
            ctx.clone(),
            task.id.clone(),
            rng.u64(100..3000),
            rng.u64(..),
        );
        ctx.tracker.clone().spawn(async move {
            if pause(&ctx.stop, delay).await {
                cancel(&ctx, &mut fastrand::Rng::with_seed(seed), "", &id).await;
            }
        });
    }
}

/// 4-10 quick fanout tasks at once, each with a webhook: many
/// deliveries in flight.
async fn burst(ctx: &Arc<Ctx>, rng: &mut fastrand::Rng, id: &str) {
    let sends = (0..rng.usize(4..=10)).map(|i| {
        let text = format!("fanout:{}:0:{}", rng.u32(10..=30), rng.u32(10..=50) * 1000);
        let message = user_message(format!("{id}-burst-{i}"), &text, None);
        let mut rng = rng.fork();
        async move { send(ctx, &mut rng, "", message, Mode::NonBlocking, true).await }
    });
    // What each was answered is in the history.
    futures_util::future::join_all(sends.collect::<Vec<_>>()).await;
}

/// A review task: INPUT_REQUIRED; then one follow-up, two different ones
/// at once on two replicas, or a cancel.
async fn review(ctx: &Arc<Ctx>, rng: &mut fastrand::Rng, id: &str) {
    let push = rng.u8(..10) < 7;
    let message = user_message(format!("{id}-review"), "review my change", None);
    let mode = Mode::pick(rng);
    let Some(task) = send(ctx, rng, REVIEWER, message, mode, push).await else {
        return;
    };
    if crate::history::terminal(task_state(&task)) || !pause(&ctx.stop, rng.u64(50..1000)).await {
        return;
    }
    let diff = "diff --git a/x b/x\n+a line";
    if rng.u8(..100) < 30 {
        let (ctx, task_id, delay, seed) =
            (ctx.clone(), task.id.clone(), rng.u64(..300), rng.u64(..));
        ctx.tracker
            .clone()
            .spawn(async move { subscriber(ctx, REVIEWER.into(), task_id, delay, seed).await });
    }
    match rng.u8(..20) {
        0..=1 => cancel(ctx, rng, REVIEWER, &task.id).await,
        2..=4 => {
            let one = user_message(format!("{id}-answer-1"), diff, Some(&task.id));
            let two = user_message(format!("{id}-answer-2"), diff, Some(&task.id));
            let (mut r1, mut r2) = (rng.fork(), rng.fork());
            let (m1, m2) = (Mode::pick(rng), Mode::pick(rng));
            // What they were answered is in the history.
            tokio::join!(
                send(ctx, &mut r1, REVIEWER, one, m1, false),
                send(ctx, &mut r2, REVIEWER, two, m2, false)
            );
        }
        _ => {
            let answer = user_message(format!("{id}-answer"), diff, Some(&task.id));
            let mode = Mode::pick(rng);
            send(ctx, rng, REVIEWER, answer, mode, false).await;
        }
    }
}

fn task_state(task: &Task) -> a2a_lifecycle::proto::TaskState {
    task.status
        .as_ref()
        .and_then(|s| a2a_lifecycle::proto::TaskState::try_from(s.state).ok())
        .unwrap_or(a2a_lifecycle::proto::TaskState::Unspecified)
}

/// Sends `message` until a replica answers (or it is given up): the task
/// of the acknowledging answer, if one came with a task. Every attempt is
/// a call of the history; the message is one `Sent`.
pub async fn send(
    ctx: &Arc<Ctx>,
    rng: &mut fastrand::Rng,
    tenant: &str,
    message: Message,
    mode: Mode,
    push: bool,
) -> Option<Task> {
    let kind = if message.task_id.is_empty() {
        MessageKind::New
    } else {
        MessageKind::FollowUp
    };
    let token = push.then(|| format!("hook-{}", message.message_id));
    let config = token.as_ref().map(|t| TaskPushNotificationConfig {
        id: t.clone(),
        url: ctx.webhook.clone(),
        token: t.clone(),
        ..Default::default()
    });
    let text = a2a_lifecycle::agent::message_text(&message);
    let now = ctx.history.now();
    let index = ctx.history.sent(Sent {
        message_id: message.message_id.clone(),
        tenant: tenant.to_owned(),
        kind,
        text,
        task_id: (!message.task_id.is_empty()).then(|| message.task_id.clone()),
        acked: false,
        answered_task: None,
        answered: None,
        push_token: token,
        first: now,
        last: now,
    });
    let mut avoid = None;
    for attempt in 0..ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(backoff(rng, attempt)).await;
        }
        let (slot, replica, client) = ctx.cluster.pick(rng, avoid);
        avoid = Some(slot);
        let start = ctx.history.now();
        let call = |outcome: Outcome| Call {
            kind: mode.name(kind),
            tenant: tenant.to_owned(),
            replica: replica.clone(),
            message_id: Some(message.message_id.clone()),
            task_id: (!message.task_id.is_empty()).then(|| message.task_id.clone()),
            start,
            end: ctx.history.now(),
            outcome,
        };
        ctx.history.update_sent(index, |s| s.last = start);
        let Some(mut client) = client else {
            ctx.history
                .call(call(Outcome::Error(Code::Unavailable, "no process".into())));
            continue;
        };
        let request = SendMessageRequest {
            tenant: tenant.to_owned(),
            message: Some(message.clone()),
            configuration: Some(SendMessageConfiguration {
                return_immediately: mode == Mode::NonBlocking,
                task_push_notification_config: config.clone(),
                ..Default::default()
            }),
            metadata: None,
        };
        let answer = if mode == Mode::Streaming {
            let opened = tokio::time::timeout(UNARY_TIMEOUT, async {
                let mut stream = client.send_streaming_message(request).await?.into_inner();
                let first = stream.message().await?;
                Ok::<_, Status>((stream, first))
            })
            .await;
            match opened {
                Err(_) => Err(Outcome::Timeout),
                Ok(Err(status)) => Err(Outcome::Error(status.code(), status.message().into())),
                Ok(Ok((_, None))) => Err(Outcome::Error(
                    Code::Internal,
                    "the stream ended before its first event".into(),
                )),
                Ok(Ok((stream, Some(first)))) => {
                    let task = match &first.payload {
                        Some(Payload::Task(t)) => Some(t.clone()),
                        _ => None,
                    };
                    let log = ctx.history.stream(StreamLog {
                        id: 0,
                        kind: mode.name(kind),
                        replica: replica.clone(),
                        tenant: tenant.to_owned(),
                        task_id: task.as_ref().map(|t| t.id.clone()),
                        message_id: Some(message.message_id.clone()),
                        start,
                        items: Vec::new(),
                        end: None,
                    });
                    record_item(ctx, &log, &first);
                    let (ctx2, tenant2) = (ctx.clone(), tenant.to_owned());
                    let seed = rng.u64(..);
                    ctx.tracker.clone().spawn(async move {
                        let end = follow(&ctx2, &log, stream).await;
                        let task_id = locked(&log).task_id.clone();
                        if let (Some(task_id), true) = (task_id, resubscribe_after(&end)) {
                            subscriber(ctx2, tenant2, task_id, 200, seed).await;
                        }
                    });
                    Ok(task)
                }
            }
        } else {
            let limit = if mode == Mode::Blocking {
                BLOCKING_TIMEOUT
            } else {
                UNARY_TIMEOUT
            };
            match tokio::time::timeout(limit, client.send_message(request)).await {
                Err(_) => Err(Outcome::Timeout),
                Ok(Err(status)) => Err(Outcome::Error(status.code(), status.message().into())),
                Ok(Ok(answer)) => match answer.into_inner().payload {
                    Some(send_message_response::Payload::Task(t)) => Ok(Some(t)),
                    Some(send_message_response::Payload::Message(_)) => Ok(None),
                    None => Err(Outcome::Error(Code::Internal, "an empty answer".into())),
                },
            }
        };
        match answer {
            Ok(task) => {
                let what = match &task {
                    Some(t) => format!(
                        "task {} {}",
                        t.id,
                        crate::history::state_name(task_state(t) as i32)
                    ),
                    None => "not a task".into(),
                };
                let done = call(Outcome::Ok(what));
                if let Some(t) = &task {
                    ctx.history.answered(&done, t);
                }
                ctx.history.call(done);
                ctx.history.update_sent(index, |s| {
                    s.acked = true;
                    s.answered_task = task.as_ref().map(|t| t.id.clone());
                    s.answered = task.as_ref().and_then(EventKey::of_status);
                    if s.task_id.is_none() {
                        s.task_id = s.answered_task.clone();
                    }
                });
                return task;
            }
            Err(outcome) => {
                let again = match &outcome {
                    Outcome::Error(code, _) => retryable(*code),
                    _ => true,
                };
                ctx.history.call(call(outcome));
                if !again {
                    return None;
                }
            }
        }
    }
    None
}

/// Whether a client subscribes again after its stream ended so: a broken
/// stream, yes; an ended one, or one refused for a terminal task, no.
fn resubscribe_after(end: &StreamEnd) -> bool {
    match end {
        StreamEnd::Clean | StreamEnd::Stopped => false,
        StreamEnd::Error(code, _) => retryable(*code),
        StreamEnd::Stalled => true,
    }
}

/// Records one stream item.
fn record_item(ctx: &Ctx, log: &Mutex<StreamLog>, event: &StreamResponse) {
    let at = ctx.history.now();
    let item = match &event.payload {
        Some(Payload::Task(t)) => match EventKey::of_status(t) {
            Some(status) => Item::Snapshot {
                task_id: t.id.clone(),
                status,
            },
            None => Item::Malformed(format!("a Task without a timestamped status: {t:?}")),
        },
        Some(Payload::Message(_)) => Item::Message,
        _ => match EventKey::of(event) {
            Some(Ok(key)) => Item::Event(key),
            Some(Err(why)) => Item::Malformed(why),
            None => Item::Malformed(format!("an empty event: {event:?}")),
        },
    };
    let mut log = locked(log);
    if let Item::Snapshot { task_id, .. } = &item
        && log.task_id.is_none()
    {
        log.task_id = Some(task_id.clone());
    }
    if let Item::Malformed(why) = &item {
        ctx.history
            .malformed(format!("stream {} on {}: {why}", log.id, log.replica));
    }
    log.items.push((at, item));
}

/// Reads `stream` to its end (or until it stalls, or the harness stops
/// reading), recording every item; how it ended.
async fn follow(
    ctx: &Ctx,
    log: &Mutex<StreamLog>,
    mut stream: Streaming<StreamResponse>,
) -> StreamEnd {
    loop {
        let next = tokio::select! {
            _ = ctx.streams_stop.cancelled() => None,
            next = tokio::time::timeout(STREAM_IDLE, stream.message()) => Some(next),
        };
        let end = match next {
            None => StreamEnd::Stopped,
            Some(Err(_)) => StreamEnd::Stalled,
            Some(Ok(Err(status))) => StreamEnd::Error(status.code(), status.message().into()),
            Some(Ok(Ok(None))) => StreamEnd::Clean,
            Some(Ok(Ok(Some(event)))) => {
                record_item(ctx, log, &event);
                continue;
            }
        };
        locked(log).end = Some((ctx.history.now(), end.clone()));
        return end;
    }
}

/// Subscribes to a task after `delay_ms` on a random replica and reads
/// the stream; subscribes again elsewhere when it breaks.
async fn subscriber(ctx: Arc<Ctx>, tenant: String, task_id: String, delay_ms: u64, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    if !pause(&ctx.streams_stop, delay_ms).await {
        return;
    }
    let mut avoid = None;
    for _ in 0..RESUBSCRIBES {
        if ctx.streams_stop.is_cancelled() {
            return;
        }
        let (slot, replica, client) = ctx.cluster.pick(&mut rng, avoid);
        avoid = Some(slot);
        let start = ctx.history.now();
        let call = |outcome: Outcome| Call {
            kind: "subscribe",
            tenant: tenant.clone(),
            replica: replica.clone(),
            message_id: None,
            task_id: Some(task_id.clone()),
            start,
            end: ctx.history.now(),
            outcome,
        };
        let Some(mut client) = client else {
            ctx.history
                .call(call(Outcome::Error(Code::Unavailable, "no process".into())));
            pause(&ctx.streams_stop, 300).await;
            continue;
        };
        let request = SubscribeToTaskRequest {
            tenant: tenant.clone(),
            id: task_id.clone(),
        };
        let stream =
            match tokio::time::timeout(UNARY_TIMEOUT, client.subscribe_to_task(request)).await {
                Err(_) => {
                    ctx.history.call(call(Outcome::Timeout));
                    continue;
                }
                Ok(Err(status)) => {
                    ctx.history
                        .call(call(Outcome::Error(status.code(), status.message().into())));
                    if !retryable(status.code()) {
                        return;
                    }
                    pause(&ctx.streams_stop, 300).await;
                    continue;
                }
                Ok(Ok(stream)) => stream.into_inner(),
            };
        ctx.history.call(call(Outcome::Ok("a stream".into())));
        let log = ctx.history.stream(StreamLog {
            id: 0,
            kind: "subscribe",
            replica: replica.clone(),
            tenant: tenant.clone(),
            task_id: Some(task_id.clone()),
            message_id: None,
            start,
            items: Vec::new(),
            end: None,
        });
        let end = follow(&ctx, &log, stream).await;
        if !resubscribe_after(&end) {
            return;
        }
        pause(&ctx.streams_stop, 200).await;
    }
}

/// Cancels a task, trying again elsewhere on errors and timeouts.
async fn cancel(ctx: &Ctx, rng: &mut fastrand::Rng, tenant: &str, task_id: &str) {
    let mut avoid = None;
    for attempt in 0..ATTEMPTS / 2 {
        if attempt > 0 {
            tokio::time::sleep(backoff(rng, attempt)).await;
        }
        let (slot, replica, client) = ctx.cluster.pick(rng, avoid);
        avoid = Some(slot);
        let start = ctx.history.now();
        let call = |outcome: Outcome| Call {
            kind: "cancel",
            tenant: tenant.to_owned(),
            replica: replica.clone(),
            message_id: None,
            task_id: Some(task_id.to_owned()),
            start,
            end: ctx.history.now(),
            outcome,
        };
        let Some(mut client) = client else {
            ctx.history
                .call(call(Outcome::Error(Code::Unavailable, "no process".into())));
            continue;
        };
        let request = CancelTaskRequest {
            tenant: tenant.to_owned(),
            id: task_id.to_owned(),
            metadata: None,
        };
        match tokio::time::timeout(UNARY_TIMEOUT, client.cancel_task(request)).await {
            Err(_) => ctx.history.call(call(Outcome::Timeout)),
            Ok(Err(status)) => {
                ctx.history
                    .call(call(Outcome::Error(status.code(), status.message().into())));
                if !retryable(status.code()) {
                    return;
                }
            }
            Ok(Ok(task)) => {
                let task = task.into_inner();
                let done = call(Outcome::Ok(format!(
                    "task {}",
                    crate::history::state_name(task_state(&task) as i32)
                )));
                ctx.history.answered(&done, &task);
                ctx.history.call(done);
                return;
            }
        }
    }
}

/// A blocking send of a task that completes at once to `slot`'s process,
/// again and again for up to `within`: whether the replica serves.
pub async fn probe(ctx: &Arc<Ctx>, slot: usize, within: Duration) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + within;
    let mut n = 0;
    loop {
        n += 1;
        let Some(process) = ctx.cluster.slots[slot].current() else {
            return Err(format!("r{slot} runs no process"));
        };
        let message = user_message(format!("probe-r{slot}-{n}"), "probe", None);
        let index = ctx.history.sent(Sent {
            message_id: message.message_id.clone(),
            tenant: String::new(),
            kind: MessageKind::New,
            text: "probe".into(),
            task_id: None,
            acked: false,
            answered_task: None,
            answered: None,
            push_token: None,
            first: ctx.history.now(),
            last: ctx.history.now(),
        });
        let start = ctx.history.now();
        let request = SendMessageRequest {
            tenant: String::new(),
            message: Some(message.clone()),
            configuration: None,
            metadata: None,
        };
        let answer =
            tokio::time::timeout(UNARY_TIMEOUT, process.client().send_message(request)).await;
        let mut call = Call {
            kind: "probe",
            tenant: String::new(),
            replica: process.name.clone(),
            message_id: Some(message.message_id.clone()),
            task_id: None,
            start,
            end: ctx.history.now(),
            outcome: Outcome::Timeout,
        };
        let why = match answer {
            Err(_) => "timed out".to_owned(),
            Ok(Err(status)) => {
                call.outcome = Outcome::Error(status.code(), status.message().into());
                format!("{status:?}")
            }
            Ok(Ok(answer)) => match answer.into_inner().payload {
                Some(send_message_response::Payload::Task(t)) => {
                    call.outcome = Outcome::Ok(format!("task {}", t.id));
                    ctx.history.answered(&call, &t);
                    ctx.history.call(call);
                    ctx.history.update_sent(index, |s| {
                        s.acked = true;
                        s.task_id = Some(t.id.clone());
                        s.answered_task = Some(t.id.clone());
                        s.answered = EventKey::of_status(&t);
                    });
                    return Ok(());
                }
                other => {
                    call.outcome = Outcome::Ok("not a task".into());
                    format!("not a task: {other:?}")
                }
            },
        };
        ctx.history.call(call);
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("{} does not serve: {why}", process.name));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Every task of `tenant` (in `state`, unless 0), page by page, from any
/// live replica.
pub async fn list(ctx: &Ctx, tenant: &str, state: i32) -> Result<Vec<Task>, String> {
    let mut tasks = Vec::new();
    let mut token = String::new();
    loop {
        let request = ListTasksRequest {
            tenant: tenant.to_owned(),
            status: state,
            page_size: Some(100),
            page_token: token.clone(),
            history_length: Some(0),
            ..Default::default()
        };
        let page = unary(ctx, |mut c| {
            let r = request.clone();
            async move { c.list_tasks(r).await }
        })
        .await?;
        tasks.extend(page.tasks);
        if page.next_page_token.is_empty() {
            return Ok(tasks);
        }
        token = page.next_page_token;
    }
}

/// A task with its whole history, from any live replica.
pub async fn get(ctx: &Ctx, tenant: &str, id: &str) -> Result<Task, String> {
    let request = GetTaskRequest {
        tenant: tenant.to_owned(),
        id: id.to_owned(),
        history_length: None,
    };
    unary(ctx, |mut c| {
        let r = request.clone();
        async move { c.get_task(r).await }
    })
    .await
}

/// A read on the replicas in turn until one answers (a few rounds).
async fn unary<R, F, Fut>(ctx: &Ctx, f: F) -> Result<R, String>
where
    F: Fn(
        a2a_lifecycle::proto::a2a_service_client::A2aServiceClient<tonic::transport::Channel>,
    ) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<R>, Status>>,
{
    let mut last = String::new();
    for round in 0..5 {
        for slot in &ctx.cluster.slots {
            let Some(process) = slot.current() else {
                continue;
            };
            match tokio::time::timeout(UNARY_TIMEOUT, f(process.client())).await {
                Ok(Ok(answer)) => return Ok(answer.into_inner()),
                Ok(Err(status)) if status.code() == Code::NotFound => {
                    return Err(format!("{}: {status:?}", process.name));
                }
                Ok(Err(status)) => last = format!("{}: {status:?}", process.name),
                Err(_) => last = format!("{}: timed out", process.name),
            }
        }
        tokio::time::sleep(Duration::from_millis(200 << round)).await;
    }
    Err(last)
}
