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
}

/// The task alone of a [`StoredRecord`] (same field number): prost skips
/// the other fields without decoding them, for a read that answers with
/// the task (GetTask).
#[derive(Clone, PartialEq, Message)]
struct StoredTaskOnly {
    #[prost(message, optional, tag = "1")]
    task: Option<Task>,
}

pub fn encode(record: &TaskRecord) -> Vec<u8> {
    // Written field by field with prost's encoders, in the layout of
    // `StoredRecord`, so the task is not cloned into an owned message
    // first (that deep copy cost more than the encoding).
    use prost::encoding::{message, string};
    // proto3: an empty owner is not written, as prost would not.
    let owner = !record.owner.is_empty();
    let trace = !record.trace.is_empty();
    let len = message::encoded_len(1, &record.task)
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
        + message::encoded_len_repeated(7, &record.transitions);
    let mut buf = Vec::with_capacity(len);
    message::encode(1, &record.task, &mut buf);
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
    for entry in &record.transitions {
        message::encode(7, entry, &mut buf);
    }
    buf
}

pub fn decode(bytes: &[u8]) -> Result<TaskRecord, StoreError> {
    let stored = StoredRecord::decode(bytes)
        .map_err(|e| StoreError::Internal(format!("stored task does not decode: {e}")))?;
    Ok(TaskRecord {
        task: stored.task.unwrap_or_default(),
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
    Ok(stored.task.unwrap_or_default())
}

/// Where the task's own encoding lies in a whole record ([`encode`] writes
/// it first, as field 1): the bytes GetTask answers with, as they are, when
/// no changes follow the record (a task at rest). `None` when the record
/// does not start that way (not written by [`encode`]); the caller decodes.
pub fn task_span(whole: &[u8]) -> Option<std::ops::Range<usize>> {
    use prost::encoding::{WireType, decode_key, decode_varint};
    let mut rest = whole;
    let (field, wire) = decode_key(&mut rest).ok()?;
    if field != 1 || wire != WireType::LengthDelimited {
        return None;
    }
    let len = usize::try_from(decode_varint(&mut rest).ok()?).ok()?;
    let start = whole.len() - rest.len();
    let end = start.checked_add(len)?;
    (end <= whole.len()).then_some(start..end)
}

/// An encoded [`Task`] with only its `n` most recent history messages
/// ([`crate::lifecycle::HistoryLength::Last`]), the other fields as they
/// were, in order: the bytes of the trimmed task's encoding, made without
/// decoding the task. The same bytes when there is nothing to trim. `None`
/// when `task` is not a well-formed encoding (the caller decodes).
pub fn trim_history(task: bytes::Bytes, n: usize) -> Option<bytes::Bytes> {
    // Task.history (spec §4.1.1, a2a.proto).
    const HISTORY: u32 = 5;
    let fields = fields(&task)?;
    let history = fields.iter().filter(|f| f.0 == HISTORY).count();
    if history <= n {
        return Some(task);
    }
    let mut skip = history - n;
    let mut out = Vec::with_capacity(task.len());
    for (field, range) in fields {
        if field == HISTORY && skip > 0 {
            skip -= 1;
            continue;
        }
        out.extend_from_slice(&task[range]);
    }
    Some(out.into())
}

/// Each top-level field of an encoded message: its number and the bytes
/// of its key and value. `None` for a malformed encoding or a group.
fn fields(message: &[u8]) -> Option<Vec<(u32, std::ops::Range<usize>)>> {
    use prost::encoding::{WireType, decode_key, decode_varint};
    let mut fields = Vec::new();
    let mut rest = message;
    while !rest.is_empty() {
        let start = message.len() - rest.len();
        let (field, wire) = decode_key(&mut rest).ok()?;
        let len = match wire {
            WireType::Varint => {
                decode_varint(&mut rest).ok()?;
                0
            }
            WireType::SixtyFourBit => 8,
            WireType::ThirtyTwoBit => 4,
            WireType::LengthDelimited => usize::try_from(decode_varint(&mut rest).ok()?).ok()?,
            WireType::StartGroup | WireType::EndGroup => return None,
        };
        if len > rest.len() {
            return None;
        }
        rest = &rest[len..];
        fields.push((field, start..message.len() - rest.len()));
    }
    Some(fields)
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
            let message = StoredRecord {
                task: Some(record.task.clone()),
                sealed_artifacts: record.sealed_artifacts.clone(),
                owner: owner.into(),
                push_configs: record.push_configs.clone(),
                trace: trace.into(),
                v0_3_push_configs: record.v0_3_push_configs.clone(),
                transitions: record.transitions.clone(),
            };
            assert_eq!(encode(&record), message.encode_to_vec());
            assert_eq!(decode(&encode(&record)).unwrap(), record);
        }
        assert!(decode(&[0xff, 0xff, 0xff]).is_err());
    }
}
