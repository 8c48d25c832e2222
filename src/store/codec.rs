//! How a [`TaskRecord`] is stored by the SQL backends: one protobuf
//! message, so every Part kind, metadata and extension round-trips exactly
//! as the client sent it, and a later field is an additive change.

use prost::Message;

use super::StoreError;
use crate::lifecycle::TaskRecord;
use crate::proto::Task;

/// The stored form of a task record. Field numbers are part of the on-disk
/// format: never reuse one.
#[derive(Clone, PartialEq, Message)]
struct StoredRecord {
    #[prost(message, optional, tag = "1")]
    task: Option<Task>,
    #[prost(string, repeated, tag = "2")]
    sealed_artifacts: Vec<String>,
    /// Absent (empty) in records written before owners were recorded, which
    /// reads as a task created without authentication.
    #[prost(string, tag = "3")]
    owner: String,
    #[prost(message, repeated, tag = "4")]
    push_configs: Vec<crate::proto::TaskPushNotificationConfig>,
    /// Absent (empty) in records written before traces were kept.
    #[prost(string, tag = "5")]
    trace: String,
    /// Absent (empty) in records written before 0.3 clients were served.
    #[prost(string, repeated, tag = "6")]
    v0_3_push_configs: Vec<String>,
    /// Absent (empty) in records written before transitions were logged.
    #[prost(message, repeated, tag = "7")]
    transitions: Vec<crate::lifecycle::Transition>,
    /// What [`encode`] left out because it repeats another field
    /// ([`ELIDED_HISTORY_IDS`], [`ELIDED_FIRST_MESSAGE_ID`]), restored by
    /// [`decode`]. Absent (0) in records written before: nothing to
    /// restore, they read as they always did.
    #[prost(uint32, tag = "8")]
    elided: u32,
}

/// [`StoredRecord::elided`]: every history message's `task_id` and
/// `context_id` are the task's, and are not written. The runtime tags each
/// message it adds to history with them, so a small task's record held
/// them three times (76 bytes of a 342-byte record of a one-message task).
const ELIDED_HISTORY_IDS: u32 = 1;
/// [`StoredRecord::elided`]: the first transition's `message_id` is the
/// first history message's (the creating message), and is not written.
const ELIDED_FIRST_MESSAGE_ID: u32 = 2;

/// What [`encode`] may leave out of `record` ([`StoredRecord::elided`]):
/// only what is exactly restored from what it keeps.
fn elidable(record: &TaskRecord) -> u32 {
    let task = &record.task;
    let mut elided = 0;
    if !task.history.is_empty()
        && task
            .history
            .iter()
            .all(|m| m.task_id == task.id && m.context_id == task.context_id)
    {
        elided |= ELIDED_HISTORY_IDS;
    }
    if let (Some(first), Some(creating)) = (record.transitions.first(), task.history.first())
        && !first.message_id.is_empty()
        && first.message_id == creating.message_id
    {
        elided |= ELIDED_FIRST_MESSAGE_ID;
    }
    elided
}

/// Puts back into a decoded task what [`encode`] left out of it.
fn restore_history(task: &mut Task, elided: u32) {
    if elided & ELIDED_HISTORY_IDS != 0 {
        for message in &mut task.history {
            message.task_id.clone_from(&task.id);
            message.context_id.clone_from(&task.context_id);
        }
    }
}

/// [`restore_history`], then the first transition's message id.
fn restore(task: &mut Task, transitions: &mut [crate::lifecycle::Transition], elided: u32) {
    restore_history(task, elided);
    if elided & ELIDED_FIRST_MESSAGE_ID != 0
        && let (Some(first), Some(creating)) = (transitions.first_mut(), task.history.first())
    {
        first.message_id.clone_from(&creating.message_id);
    }
}

/// The fields of a history message but its `task_id` and `context_id`, as
/// prost writes them (proto3: defaults are not written).
fn bare_message_len(m: &crate::proto::Message) -> usize {
    use prost::encoding::{int32, message, string};
    (if m.message_id.is_empty() {
        0
    } else {
        string::encoded_len(1, &m.message_id)
    }) + if m.role == 0 {
        0
    } else {
        int32::encoded_len(4, &m.role)
    } + message::encoded_len_repeated(5, &m.parts)
        + m.metadata
            .as_ref()
            .map_or(0, |md| message::encoded_len(6, md))
        + string::encoded_len_repeated(7, &m.extensions)
        + string::encoded_len_repeated(8, &m.reference_task_ids)
}

fn encode_bare_message(m: &crate::proto::Message, buf: &mut Vec<u8>) {
    use prost::encoding::{int32, message, string};
    if !m.message_id.is_empty() {
        string::encode(1, &m.message_id, buf);
    }
    if m.role != 0 {
        int32::encode(4, &m.role, buf);
    }
    for part in &m.parts {
        message::encode(5, part, buf);
    }
    if let Some(md) = &m.metadata {
        message::encode(6, md, buf);
    }
    string::encode_repeated(7, &m.extensions, buf);
    string::encode_repeated(8, &m.reference_task_ids, buf);
}

/// The task's fields as prost writes them, but its history's messages
/// written bare ([`bare_message_len`]) when `bare`.
fn task_body_len(task: &Task, bare: bool) -> usize {
    use prost::encoding::{encoded_len_varint, key_len, message, string};
    if !bare {
        return task.encoded_len();
    }
    let history: usize = task
        .history
        .iter()
        .map(|m| {
            let len = bare_message_len(m);
            key_len(5) + encoded_len_varint(len as u64) + len
        })
        .sum();
    (if task.id.is_empty() {
        0
    } else {
        string::encoded_len(1, &task.id)
    }) + if task.context_id.is_empty() {
        0
    } else {
        string::encoded_len(2, &task.context_id)
    } + task
        .status
        .as_ref()
        .map_or(0, |s| message::encoded_len(3, s))
        + message::encoded_len_repeated(4, &task.artifacts)
        + history
        + task
            .metadata
            .as_ref()
            .map_or(0, |md| message::encoded_len(6, md))
}

/// `message::encode(1, task)`, with the history's messages bare when
/// `bare`.
fn encode_task(task: &Task, bare: bool, buf: &mut Vec<u8>) {
    use prost::encoding::{WireType, encode_key, encode_varint, message, string};
    if !bare {
        message::encode(1, task, buf);
        return;
    }
    encode_key(1, WireType::LengthDelimited, buf);
    encode_varint(task_body_len(task, true) as u64, buf);
    if !task.id.is_empty() {
        string::encode(1, &task.id, buf);
    }
    if !task.context_id.is_empty() {
        string::encode(2, &task.context_id, buf);
    }
    if let Some(status) = &task.status {
        message::encode(3, status, buf);
    }
    for artifact in &task.artifacts {
        message::encode(4, artifact, buf);
    }
    for m in &task.history {
        encode_key(5, WireType::LengthDelimited, buf);
        encode_varint(bare_message_len(m) as u64, buf);
        encode_bare_message(m, buf);
    }
    if let Some(md) = &task.metadata {
        message::encode(6, md, buf);
    }
}

/// The task alone of a [`StoredRecord`] (same field number): prost skips
/// the other fields without decoding them, for a read that answers with
/// the task (GetTask).
#[derive(Clone, PartialEq, Message)]
struct StoredTaskOnly {
    #[prost(message, optional, tag = "1")]
    task: Option<Task>,
    #[prost(uint32, tag = "8")]
    elided: u32,
}

/// `record` in the stored form, everything written: what a durable store
/// keeps. A binary from before [`StoredRecord::elided`] reads it as it
/// always did, and writes it back whole; that is what a rolling upgrade of
/// replicas sharing a database, or going back a version, needs.
pub fn encode(record: &TaskRecord) -> Vec<u8> {
    encode_as(record, false)
}

/// `record` in the stored form without what repeats another field
/// ([`StoredRecord::elided`]): for a store no other binary reads, the
/// memory store ([`super::TaskStore::compact_records`]). A bench task's
/// record: 327 -> 215 bytes.
pub fn encode_compact(record: &TaskRecord) -> Vec<u8> {
    encode_as(record, true)
}

fn encode_as(record: &TaskRecord, compact: bool) -> Vec<u8> {
    // Written field by field with prost's encoders, in the layout of
    // `StoredRecord`, so the task is not cloned into an owned message
    // first (that deep copy cost more than the encoding).
    use prost::encoding::{encoded_len_varint, key_len, message, string, uint32};
    // proto3: an empty owner is not written, as prost would not.
    let owner = !record.owner.is_empty();
    let trace = !record.trace.is_empty();
    let elided = if compact { elidable(record) } else { 0 };
    let bare = elided & ELIDED_HISTORY_IDS != 0;
    let task_len = task_body_len(&record.task, bare);
    // The first transition without its message id, when elided: a copy
    // that allocates nothing (its id is the empty string).
    let transitions = record.transitions.split_first().map(|(first, rest)| {
        let first = if elided & ELIDED_FIRST_MESSAGE_ID != 0 {
            std::borrow::Cow::Owned(crate::lifecycle::Transition {
                state: first.state,
                timestamp: first.timestamp,
                message_id: String::new(),
                cause: first.cause,
            })
        } else {
            std::borrow::Cow::Borrowed(first)
        };
        (first, rest)
    });
    let transitions_len = transitions.as_ref().map_or(0, |(first, rest)| {
        message::encoded_len(7, first.as_ref()) + message::encoded_len_repeated(7, rest)
    });
    let len = key_len(1)
        + encoded_len_varint(task_len as u64)
        + task_len
        + string::encoded_len_repeated(2, &record.sealed_artifacts)
        + if owner {
            string::encoded_len(3, &record.owner)
        } else {
            0
        }
        + message::encoded_len_repeated(4, &record.push_configs)
        + if trace {
            string::encoded_len(5, &record.trace)
        } else {
            0
        }
        + string::encoded_len_repeated(6, &record.v0_3_push_configs)
        + transitions_len
        + if elided == 0 {
            0
        } else {
            uint32::encoded_len(8, &elided)
        };
    let mut buf = Vec::with_capacity(len);
    // First, where GetTask finds it with the task right after
    // ([`task_bytes`]) instead of past the transition log. A compact record
    // is read only by this binary's decoder, which takes fields in any
    // order, as protobuf's do.
    if elided != 0 {
        uint32::encode(8, &elided, &mut buf);
    }
    encode_task(&record.task, bare, &mut buf);
    string::encode_repeated(2, &record.sealed_artifacts, &mut buf);
    if owner {
        string::encode(3, &record.owner, &mut buf);
    }
    for config in &record.push_configs {
        message::encode(4, config, &mut buf);
    }
    if trace {
        string::encode(5, &record.trace, &mut buf);
    }
    string::encode_repeated(6, &record.v0_3_push_configs, &mut buf);
    if let Some((first, rest)) = &transitions {
        message::encode(7, first.as_ref(), &mut buf);
        for entry in *rest {
            message::encode(7, entry, &mut buf);
        }
    }
    debug_assert_eq!(buf.len(), len);
    buf
}

pub fn decode(bytes: &[u8]) -> Result<TaskRecord, StoreError> {
    let mut stored = StoredRecord::decode(bytes)
        .map_err(|e| StoreError::Internal(format!("stored task does not decode: {e}")))?;
    let mut task = stored.task.unwrap_or_default();
    restore(&mut task, &mut stored.transitions, stored.elided);
    Ok(TaskRecord {
        task,
        sealed_artifacts: stored.sealed_artifacts,
        owner: stored.owner,
        push_configs: stored.push_configs,
        v0_3_push_configs: stored.v0_3_push_configs,
        trace: stored.trace,
        transitions: stored.transitions,
        history_ids: Default::default(),
    })
}

/// A task as a store keeps it: its last whole record ([`encode`]), then
/// the changes of each write after it ([`crate::lifecycle::Changes`]), in
/// write order. Changes that do not decode or do not follow from the
/// record are an error, as a record that does not decode is.
pub fn decode_with_changes<'a>(
    whole: &[u8],
    changes: impl IntoIterator<Item = &'a [u8]>,
) -> Result<TaskRecord, StoreError> {
    let mut record = decode(whole)?;
    for bytes in changes {
        let changes = decode_changes(bytes)?;
        record
            .replay_all(changes)
            .map_err(|e| StoreError::Internal(format!("stored task changes do not replay: {e}")))?;
    }
    Ok(record)
}

/// The task of [`decode_with_changes`], reading no more than it needs: with
/// no changes after the whole record (a task at rest: its terminal write
/// is whole), the task's field alone, not the transition log, owner and
/// push configs beside it (callgrind: about 2,000 of a GetTask's 9,000
/// instructions of decoding).
pub fn decode_task<'a>(
    whole: &[u8],
    changes: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Task, StoreError> {
    let mut changes = changes.into_iter().peekable();
    if changes.peek().is_some() {
        return Ok(decode_with_changes(whole, changes)?.task);
    }
    let stored = StoredTaskOnly::decode(whole)
        .map_err(|e| StoreError::Internal(format!("stored task does not decode: {e}")))?;
    let mut task = stored.task.unwrap_or_default();
    restore_history(&mut task, stored.elided);
    Ok(task)
}

/// The task's own encoding in a whole record ([`encode`] writes it first,
/// as field 1): the bytes GetTask answers with, as they are, when no
/// changes follow the record (a task at rest). A compact record's history
/// messages get their task and context ids back ([`ELIDED_HISTORY_IDS`]),
/// written where prost writes them, so the bytes are those of the decoded
/// task encoded again. `None` when the record is not [`encode`]'s (the
/// caller decodes).
pub fn task_bytes(whole: &bytes::Bytes) -> Option<bytes::Bytes> {
    // Read in place, nothing collected, and no further than the task: a
    // compact record says what it left out first ([`encode_compact`]).
    // Collecting every field and checking the ids as text cost about
    // 4,500 instructions per GetTask (callgrind); this, about 1,000.
    let mut elided = 0;
    let mut task = None;
    for field in fields(whole) {
        let field = field?;
        match field.number {
            8 => elided = prost::encoding::decode_varint(&mut &whole[field.value]).ok()?,
            1 => {
                task = Some(field.value);
                break;
            }
            _ => return None,
        }
    }
    let task = whole.slice(task?);
    if elided as u32 & ELIDED_HISTORY_IDS == 0 {
        return Some(task);
    }
    with_history_ids(&task).map(Into::into)
}

/// An encoded task whose history messages were written without their
/// `task_id` (3) and `context_id` (2), with them put back: the task's own
/// (its fields 1 and 2), after each message's id (field 1), as prost
/// orders fields. The ids' bytes are copied as they are.
fn with_history_ids(task: &[u8]) -> Option<Vec<u8>> {
    use prost::encoding::{WireType, encode_key, encode_varint};
    const HISTORY: u32 = 5;
    // The ids lead (prost writes fields in order).
    let (mut id, mut context_id): (&[u8], &[u8]) = (&[], &[]);
    for field in fields(task) {
        let field = field?;
        match field.number {
            1 => id = &task[field.value],
            2 => context_id = &task[field.value],
            _ => break,
        }
    }
    // What each message gains, as prost writes it (proto3: an empty
    // string is not written).
    let mut ids = Vec::with_capacity(context_id.len() + id.len() + 12);
    for (number, value) in [(2, context_id), (3, id)] {
        if !value.is_empty() {
            encode_key(number, WireType::LengthDelimited, &mut ids);
            encode_varint(value.len() as u64, &mut ids);
            ids.extend_from_slice(value);
        }
    }
    // Room for a few messages' ids; a long history grows it.
    let mut out = Vec::with_capacity(task.len() + 4 * (ids.len() + 2));
    for field in fields(task) {
        let field = field?;
        if field.number != HISTORY {
            out.extend_from_slice(&task[field.whole]);
            continue;
        }
        let message = &task[field.value];
        // After the leading message id, if any.
        let mut at = 0;
        for inner in fields(message) {
            let inner = inner?;
            if inner.number >= 2 {
                break;
            }
            at = inner.whole.end;
        }
        encode_key(HISTORY, WireType::LengthDelimited, &mut out);
        encode_varint((message.len() + ids.len()) as u64, &mut out);
        out.extend_from_slice(&message[..at]);
        out.extend_from_slice(&ids);
        out.extend_from_slice(&message[at..]);
    }
    Some(out)
}

/// An encoded [`Task`] with only its `n` most recent history messages
/// ([`crate::lifecycle::HistoryLength::Last`]), the other fields as they
/// were, in order: the bytes of the trimmed task's encoding, made without
/// decoding the task. The same bytes when there is nothing to trim. `None`
/// when `task` is not a well-formed encoding (the caller decodes).
pub fn trim_history(task: bytes::Bytes, n: usize) -> Option<bytes::Bytes> {
    // Task.history (spec §4.1.1, a2a.proto).
    const HISTORY: u32 = 5;
    let mut history = 0;
    for field in fields(&task) {
        history += usize::from(field?.number == HISTORY);
    }
    if history <= n {
        return Some(task);
    }
    let mut skip = history - n;
    let mut out = Vec::with_capacity(task.len());
    for field in fields(&task) {
        let field = field?;
        if field.number == HISTORY && skip > 0 {
            skip -= 1;
            continue;
        }
        out.extend_from_slice(&task[field.whole]);
    }
    Some(out.into())
}

/// One top-level field of an encoded message.
struct Field {
    number: u32,
    /// Its key and value.
    whole: std::ops::Range<usize>,
    /// Its value: a varint's bytes, or a length-delimited field's content.
    value: std::ops::Range<usize>,
}

/// The top-level fields of an encoded message, in order, read in place;
/// `None` for a malformed encoding or a group (and nothing after it).
fn fields(message: &[u8]) -> impl Iterator<Item = Option<Field>> + '_ {
    use prost::encoding::{WireType, decode_key, decode_varint};
    let mut rest = message;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let at = |rest: &[u8]| message.len() - rest.len();
        let field = (|| {
            let start = at(rest);
            let (number, wire) = decode_key(&mut rest).ok()?;
            let value_start = at(rest);
            let len = match wire {
                WireType::Varint => {
                    decode_varint(&mut rest).ok()?;
                    0
                }
                WireType::SixtyFourBit => 8,
                WireType::ThirtyTwoBit => 4,
                WireType::LengthDelimited => {
                    usize::try_from(decode_varint(&mut rest).ok()?).ok()?
                }
                WireType::StartGroup | WireType::EndGroup => return None,
            };
            if len > rest.len() {
                return None;
            }
            let value = if wire == WireType::LengthDelimited {
                at(rest)..at(rest) + len
            } else {
                value_start..at(rest) + len
            };
            rest = &rest[len..];
            Some(Field {
                number,
                whole: start..at(rest),
                value,
            })
        })();
        if field.is_none() {
            // Malformed: say so once, then stop.
            rest = &[];
        }
        Some(field)
    })
}

/// One write's changes ([`crate::lifecycle::Changes`]) as a store keeps
/// them.
pub fn decode_changes(bytes: &[u8]) -> Result<crate::lifecycle::Changes, StoreError> {
    crate::lifecycle::Changes::decode(bytes)
        .map_err(|e| StoreError::Internal(format!("stored task changes do not decode: {e}")))
}

/// Stream events as a store shared by replicas keeps a write's
/// ([`super::EncodedTask::events`]): each length-delimited, one after
/// another.
pub fn encode_events<'a>(
    events: impl Iterator<Item = &'a crate::proto::StreamResponse>,
) -> Vec<u8> {
    let mut bytes = Vec::new();
    for event in events {
        event
            .encode_length_delimited(&mut bytes)
            .expect("a Vec grows as needed");
    }
    bytes
}

/// The events [`encode_events`] wrote.
pub fn split_events(mut bytes: &[u8]) -> Result<Vec<crate::proto::StreamResponse>, StoreError> {
    let mut events = Vec::new();
    while !bytes.is_empty() {
        let event = crate::proto::StreamResponse::decode_length_delimited(&mut bytes)
            .map_err(|e| StoreError::Internal(format!("stored events do not decode: {e}")))?;
        events.push(event);
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Message as A2aMessage, Role};

    #[test]
    fn round_trips_and_refuses_garbage() {
        let record = TaskRecord::submitted(
            "t".into(),
            "c".into(),
            A2aMessage {
                message_id: "m".into(),
                role: Role::User as i32,
                ..Default::default()
            },
            crate::wkt::Timestamp {
                seconds: 5,
                nanos: 6,
            },
        );
        let mut record = record;
        record.sealed_artifacts.push("a".into());
        assert_eq!(decode(&encode(&record)).unwrap(), record);
        // Byte for byte the `StoredRecord` message, with and without an
        // owner and a trace: stored data stays readable.
        for (owner, trace) in [
            ("", ""),
            (
                "ci-bot",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
        ] {
            record.owner = owner.into();
            record.trace = trace.into();
            record.push_configs = vec![crate::proto::TaskPushNotificationConfig {
                id: format!("hook-{owner}"),
                url: "https://hooks.example.test/a2a".into(),
                token: "t".into(),
                ..Default::default()
            }];
            record.v0_3_push_configs = if owner.is_empty() {
                Vec::new()
            } else {
                vec![format!("hook-{owner}")]
            };
            // As records were written before `elided`: read back the same.
            let old = StoredRecord {
                task: Some(record.task.clone()),
                sealed_artifacts: record.sealed_artifacts.clone(),
                owner: owner.into(),
                push_configs: record.push_configs.clone(),
                trace: trace.into(),
                v0_3_push_configs: record.v0_3_push_configs.clone(),
                transitions: record.transitions.clone(),
                elided: 0,
            };
            assert_eq!(decode(&old.encode_to_vec()).unwrap(), record);
            // Now without the history message's task and context ids and
            // the first transition's message id, which repeat others.
            let mut message = old.clone();
            let task = message.task.as_mut().unwrap();
            task.history[0].task_id.clear();
            task.history[0].context_id.clear();
            message.transitions[0].message_id.clear();
            message.elided = ELIDED_HISTORY_IDS | ELIDED_FIRST_MESSAGE_ID;
            // A durable store's records are still the old form, byte for
            // byte (an older binary reads and rewrites them intact); the
            // memory store's leave out what repeats.
            assert_eq!(encode(&record), old.encode_to_vec());
            // `elided` first, then the rest as prost writes it.
            let mut compact = Vec::new();
            prost::encoding::uint32::encode(8, &message.elided, &mut compact);
            compact.extend(
                StoredRecord {
                    elided: 0,
                    ..message.clone()
                }
                .encode_to_vec(),
            );
            assert_eq!(encode_compact(&record), compact);
            assert_eq!(decode(&encode_compact(&record)).unwrap(), record);
            assert_eq!(
                decode_task(&encode_compact(&record), []).unwrap(),
                record.task,
                "the task alone is restored too"
            );
        }
        assert!(decode(&[0xff, 0xff, 0xff]).is_err());
        // Bytes not written by `encode` are not handed out as a task (the
        // reader decodes, and fails).
        for garbage in [&[0xff, 0xff, 0xff][..], &[0x0a, 0x05, 0x01], &[0x0b, 0x00]] {
            let garbage = bytes::Bytes::copy_from_slice(garbage);
            assert_eq!(task_bytes(&garbage), None, "{garbage:?}");
            assert_eq!(trim_history(garbage.clone(), 0), None, "{garbage:?}");
        }
    }

    /// Only what is restored exactly is left out: a history message
    /// tagged with other ids (or none), or a first transition naming
    /// another message, is written whole, and every form reads back as
    /// it was.
    #[test]
    fn leaves_out_only_what_is_restored_exactly() {
        let message = |id: &str| A2aMessage {
            message_id: id.into(),
            role: Role::User as i32,
            ..Default::default()
        };
        let base = TaskRecord::submitted(
            "task-1".into(),
            "ctx-1".into(),
            message("m1"),
            crate::wkt::Timestamp::default(),
        );
        let mut cases = vec![base.clone()];
        let mut other_task = base.clone();
        let mut second = message("m2");
        second.task_id = "another".into();
        second.context_id = "ctx-1".into();
        other_task.task.history.push(second);
        cases.push(other_task);
        let mut untagged = base.clone();
        untagged.task.history.push(message("m3"));
        cases.push(untagged);
        let mut other_first = base.clone();
        other_first.transitions[0].message_id = "not-m1".into();
        cases.push(other_first);
        let mut no_first = base.clone();
        no_first.transitions[0].message_id.clear();
        cases.push(no_first);
        let mut no_history = base.clone();
        no_history.task.history.clear();
        cases.push(no_history);
        let mut empty_ids = base.clone();
        empty_ids.task.id.clear();
        empty_ids.task.context_id.clear();
        cases.push(empty_ids);
        // A message without an id: the ids go first.
        let mut anonymous = base.clone();
        anonymous.task.history.push(A2aMessage {
            task_id: "task-1".into(),
            context_id: "ctx-1".into(),
            ..message("")
        });
        cases.push(anonymous);
        for record in cases {
            for bytes in [encode(&record), encode_compact(&record)] {
                assert_eq!(decode(&bytes).unwrap(), record);
                assert_eq!(decode_task(&bytes, []).unwrap(), record.task);
                // What GetTask answers with: the task's bytes as prost
                // writes the decoded task.
                assert_eq!(
                    task_bytes(&bytes.into()).expect("task_bytes").as_ref(),
                    record.task.encode_to_vec(),
                    "{:?}",
                    record.task
                );
            }
        }
        let elided = StoredRecord::decode(&encode_compact(&base)[..]).unwrap();
        assert_eq!(elided.elided, ELIDED_HISTORY_IDS | ELIDED_FIRST_MESSAGE_ID);
        assert!(elided.task.unwrap().history[0].task_id.is_empty());
        let whole = StoredRecord::decode(&encode(&base)[..]).unwrap();
        assert_eq!(whole.elided, 0);
        assert_eq!(whole.task.unwrap().history[0].task_id, "task-1");
    }
}
