//! Bounded fuzzing that runs with the tests (issue "hardening": arbitrary
//! bytes and arbitrary well-formed requests never panic validation or the
//! lifecycle core). A seeded generator makes every run the same, so a
//! failure is reproduced by running the test again; `A2A_FUZZ_ITERATIONS`
//! runs it longer (`A2A_FUZZ_SEED` picks another sequence).

use prost::Message as _;
use prost_types::Timestamp;

use a2a_lifecycle::lifecycle::{
    ArtifactUpdate, StatusUpdate, TaskEvent, TaskRecord, TransitionPolicy, parse_state_name,
};
use a2a_lifecycle::proto::{
    Artifact, ListTasksRequest, Message, Part, Role, SendMessageConfiguration, SendMessageRequest,
    TaskState, part::Content,
};
use a2a_lifecycle::service::validate;
use a2a_lifecycle::store::codec;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn bytes(&mut self, max: usize) -> Vec<u8> {
        let n = self.below(max as u64 + 1) as usize;
        (0..n).map(|_| self.next() as u8).collect()
    }

    /// Short strings from a small alphabet, so ids repeat and collide.
    fn id(&mut self) -> String {
        let n = self.below(4) as usize;
        (0..n)
            .map(|_| ['a', 'b', '-', 'é', '\0'][self.below(5) as usize])
            .collect()
    }

    fn text(&mut self) -> String {
        String::from_utf8_lossy(&self.bytes(24)).into_owned()
    }
}

fn iterations() -> u64 {
    std::env::var("A2A_FUZZ_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

fn seed() -> u64 {
    std::env::var("A2A_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5EED_A2A0_1234_5678)
}

fn part(rng: &mut Rng) -> Part {
    let content = match rng.below(5) {
        0 => None,
        1 => Some(Content::Text(rng.text())),
        2 => Some(Content::Raw(rng.bytes(16))),
        3 => Some(Content::Url(rng.id())),
        _ => Some(Content::Data(prost_types::Value::default())),
    };
    Part {
        content,
        media_type: if rng.below(2) == 0 {
            String::new()
        } else {
            rng.text()
        },
        ..Default::default()
    }
}

fn message(rng: &mut Rng) -> Message {
    Message {
        message_id: rng.id(),
        task_id: rng.id(),
        context_id: rng.id(),
        role: rng.below(5) as i32 - 1,
        parts: (0..rng.below(4)).map(|_| part(rng)).collect(),
        ..Default::default()
    }
}

/// Arbitrary bytes decoded as requests, and arbitrary well-formed requests,
/// through validation: an answer (accepted or refused), never a panic.
#[test]
fn validation_never_panics() {
    let mut rng = Rng(seed());
    for _ in 0..iterations() {
        let raw = rng.bytes(64);
        if let Ok(req) = SendMessageRequest::decode(&raw[..]) {
            let _ = validate::send_request(req);
        }
        if let Ok(req) = ListTasksRequest::decode(&raw[..]) {
            let _ = validate::list_request(&req);
        }
        let _ = codec::decode(&raw);
        let _ = parse_state_name(&rng.text());
        let req = SendMessageRequest {
            tenant: rng.id(),
            message: (rng.below(8) != 0).then(|| message(&mut rng)),
            configuration: Some(SendMessageConfiguration {
                history_length: (rng.below(2) == 0).then(|| rng.next() as i32),
                accepted_output_modes: (0..rng.below(3)).map(|_| rng.text()).collect(),
                return_immediately: rng.below(2) == 0,
                ..Default::default()
            }),
            metadata: None,
        };
        let _ = validate::send_request(req);
        let list = ListTasksRequest {
            tenant: rng.id(),
            context_id: rng.id(),
            status: rng.next() as i32,
            page_size: (rng.below(2) == 0).then(|| rng.next() as i32),
            page_token: if rng.below(2) == 0 {
                rng.text()
            } else {
                String::new()
            },
            history_length: (rng.below(2) == 0).then(|| rng.next() as i32),
            ..Default::default()
        };
        let _ = validate::list_request(&list);
    }
}

fn state(rng: &mut Rng) -> TaskState {
    TaskState::try_from(rng.below(9) as i32).unwrap()
}

fn event(rng: &mut Rng) -> TaskEvent {
    match rng.below(4) {
        0 | 1 => TaskEvent::Status(StatusUpdate {
            state: state(rng),
            message: (rng.below(2) == 0).then(|| message(rng)),
            metadata: None,
        }),
        2 => TaskEvent::Artifact(ArtifactUpdate {
            artifact: Artifact {
                artifact_id: rng.id(),
                parts: (0..rng.below(3)).map(|_| part(rng)).collect(),
                ..Default::default()
            },
            append: rng.below(2) == 0,
            last_chunk: rng.below(3) == 0,
            metadata: None,
        }),
        _ => {
            let mut m = message(rng);
            m.role = Role::User as i32;
            TaskEvent::UserMessage(m)
        }
    }
}

/// Arbitrary event sequences on a task under both policies: every event is
/// applied or refused with the task unchanged, a terminal task never
/// changes again, and the stored form always round-trips.
#[test]
fn the_lifecycle_core_never_panics_and_keeps_its_rules() {
    let mut rng = Rng(seed() ^ 0xA5A5);
    let rounds = (iterations() / 20).max(1);
    for _ in 0..rounds {
        let policy = if rng.below(2) == 0 {
            TransitionPolicy::Permissive
        } else {
            TransitionPolicy::Strict
        };
        let mut first = message(&mut rng);
        first.message_id = "m0".into();
        let mut record = TaskRecord::submitted(
            "t".into(),
            "c".into(),
            first,
            Timestamp {
                seconds: 1,
                nanos: 0,
            },
        );
        for step in 0..20 {
            let before = record.clone();
            let now = Timestamp {
                seconds: 2 + step,
                nanos: 0,
            };
            match record.apply(event(&mut rng), now, policy) {
                Ok(_) => assert!(
                    !before.state().is_terminal(),
                    "a terminal task changed: {before:?}"
                ),
                Err(_) => assert_eq!(record, before, "a refused event changed the task"),
            }
            assert_ne!(record.state(), TaskState::Unspecified);
            let decoded = codec::decode(&codec::encode(&record)).expect("round trip");
            assert_eq!(decoded, record);
        }
    }
}
