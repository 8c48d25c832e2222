//! Round trips: every field, part kind and awkward value a store must keep
//! reads back unchanged through create, update, get and list.

use a2a_lifecycle::proto::{Artifact, Message, Part, Role, TaskState, part::Content};
use a2a_lifecycle::store::{ListQuery, StoredTask};
use a2a_lifecycle::wkt::Struct;

use super::Store;
use super::helpers::{
    BASE, T, at, create, every_part_kind, list, must_get, nv, query, record, rich_record, st, stv,
    sv, text_part, ts,
};

/// Each part kind (text, raw bytes, url, structured data, no content) with
/// metadata, filename and media_type reads back exactly, in a message's
/// parts, in a status message and in an artifact.
pub async fn every_part_kind_round_trips_in_history_and_artifacts(store: Store) {
    for (i, (kind, part)) in every_part_kind().into_iter().enumerate() {
        let id = format!("part-{i}");
        let mut r = record(&id, "c", TaskState::Working, at(i as i64));
        r.task.history[0].parts = vec![part.clone()];
        r.task.status.as_mut().unwrap().message = Some(Message {
            message_id: format!("{id}/status"),
            role: Role::Agent as i32,
            parts: vec![part.clone(), text_part("after")],
            ..Default::default()
        });
        r.task.artifacts = vec![Artifact {
            artifact_id: format!("{id}/art"),
            parts: vec![text_part("before"), part.clone()],
            ..Default::default()
        }];
        create(&store, T, &r).await;
        assert_eq!(must_get(&store, T, &id).await.record, r, "part kind {kind}");
        let view = list(
            &store,
            T,
            &ListQuery {
                status_after: Some(at(i as i64)),
                ..query()
            },
        )
        .await;
        assert_eq!(view.tasks.last(), Some(&r.task), "list of part kind {kind}");
    }
}

/// A record using every field (all part kinds, message/artifact/task
/// metadata, extensions, reference_task_ids, artifact name/description,
/// sub-second timestamp, sealed_artifacts) reads back equal to what was
/// written, through create and through update.
pub async fn full_record_round_trips_through_create_and_update(store: Store) {
    let rich = rich_record("rich");
    create(&store, T, &rich).await;
    assert_eq!(
        must_get(&store, T, "rich").await,
        StoredTask {
            record: rich.clone(),
            version: 1
        }
    );

    // Through update: from a plain record to the rich one.
    let mut plain = record("plain", "ctx-rich", TaskState::Submitted, at(0));
    create(&store, T, &plain).await;
    let mut upgraded = rich_record("plain");
    upgraded.sealed_artifacts = vec!["art-1".into(), "art-2".into()];
    assert_eq!(store.update(T, &upgraded, 1).await, Ok(2));
    assert_eq!(
        must_get(&store, T, "plain").await,
        StoredTask {
            record: upgraded.clone(),
            version: 2
        }
    );

    // And back down: fields cleared by an update are cleared in the store.
    plain.sealed_artifacts.clear();
    assert_eq!(store.update(T, &plain, 2).await, Ok(3));
    assert_eq!(must_get(&store, T, "plain").await.record, plain);
    assert!(plain.task.metadata.is_none() && plain.task.artifacts.is_empty());
}

/// Strings, bytes and numbers that trip up text, JSON or SQL encodings read
/// back unchanged: NUL, non-BMP characters, escapes, a large text, every byte
/// value, extreme finite numbers, empty vs absent metadata.
pub async fn awkward_strings_bytes_and_numbers_round_trip(store: Store) {
    let awkward = "nul:\0 quote:\" backslash:\\ tab:\t cr:\r nl:\n bom:\u{feff} \
                   crab:🦀 rtl:\u{202e}abc ctrl:\u{1} sql:'; DROP TABLE tasks; -- \
                   json:{\"a\":[1]} surrogate-ish:\u{10ffff}";
    let big = "0123456789abcdef".repeat(64 * 1024); // 1 MiB
    let mut r = record("awk", awkward, TaskState::Working, ts(BASE, 1));
    r.task.history[0].message_id = awkward.into();
    r.task.history[0].parts = vec![
        text_part(awkward),
        text_part(""),
        text_part(&big),
        Part {
            content: Some(Content::Raw((0..=255u8).collect())),
            ..Default::default()
        },
        Part {
            content: Some(Content::Raw(Vec::new())),
            ..Default::default()
        },
        Part {
            content: Some(Content::Data(stv(vec![
                ("max", nv(f64::MAX)),
                ("min", nv(f64::MIN)),
                ("tiny", nv(f64::MIN_POSITIVE)),
                ("subnormal", nv(5e-324)),
                ("third", nv(1.0 / 3.0)),
                ("2^53+2", nv(9_007_199_254_740_994.0)),
                ("neg", nv(-1e-300)),
                (awkward, sv(awkward)),
                ("", sv("")),
            ]))),
            metadata: Some(st(vec![(awkward, sv(awkward))])),
            filename: awkward.into(),
            media_type: awkward.into(),
        },
    ];
    r.task.history[0].metadata = Some(Struct::default()); // empty, not absent
    r.task.history[0].extensions = vec![awkward.into(), String::new()];
    r.task.history[0].reference_task_ids = vec![awkward.into()];
    r.task.metadata = Some(Struct::default());
    r.task.artifacts = vec![Artifact {
        artifact_id: awkward.into(),
        name: awkward.into(),
        description: big.clone(),
        parts: vec![text_part(awkward)],
        metadata: Some(Struct::default()),
        extensions: vec![],
    }];
    r.sealed_artifacts = vec![awkward.into(), String::new()];
    create(&store, T, &r).await;
    assert_eq!(must_get(&store, T, "awk").await.record, r);
    let q = ListQuery {
        context_id: Some(awkward.into()),
        ..query()
    };
    let page = list(&store, T, &q).await;
    assert_eq!(
        page.tasks,
        [r.task.clone()],
        "context_id filter with awkward text"
    );
}

/// With `history = All` and `include_artifacts = true`, ListTasks returns each
/// task exactly as stored.
pub async fn list_returns_the_stored_task_unchanged_when_nothing_is_trimmed(store: Store) {
    let rich = rich_record("rich");
    let plain = record("plain", "c", TaskState::Working, at(-10));
    create(&store, T, &rich).await;
    create(&store, T, &plain).await;
    let page = list(&store, T, &query()).await;
    assert_eq!(page.tasks, [rich.task, plain.task]);
}
