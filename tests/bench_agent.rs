//! The `bench` demo agent, which the load generator drives, over real
//! gRPC: a plain message completes at once; `fanout:K:WAIT_MS:INTERVAL_US`
//! reaches every subscriber with updates 1..=K in order, then COMPLETED.

use crate::support;

use a2a_lifecycle::proto::stream_response::Payload;
use a2a_lifecycle::proto::{SubscribeToTaskRequest, TaskState, part::Content};

use support::*;

#[tokio::test]
async fn a_plain_message_completes_at_once_with_one_artifact() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let task = send_text(&mut client, "bench", "go").await;
    assert_eq!(state_of(&task), TaskState::Completed);
    assert_eq!(task.artifacts.len(), 1);
    server.stop().await;
}

/// The numbered updates a subscriber saw, in order, and whether the
/// stream ended with COMPLETED.
fn numbers(events: &[a2a_lifecycle::proto::StreamResponse]) -> (Vec<u32>, bool) {
    let text = |content: &Option<Content>| match content {
        Some(Content::Text(t)) => t.parse().ok(),
        _ => None,
    };
    let mut seen = Vec::new();
    let mut completed = false;
    for event in events {
        match &event.payload {
            Some(Payload::StatusUpdate(u)) => {
                let status = u.status.as_ref().unwrap();
                if status.state == TaskState::Completed as i32 {
                    completed = true;
                }
                if let Some(n) = status
                    .message
                    .as_ref()
                    .and_then(|m| text(&m.parts[0].content))
                {
                    seen.push(n);
                }
            }
            Some(Payload::ArtifactUpdate(u)) => {
                let artifact = u.artifact.as_ref().unwrap();
                assert_eq!(artifact.artifact_id, "fanout");
                seen.extend(text(&artifact.parts[0].content));
            }
            _ => {}
        }
    }
    (seen, completed)
}

#[tokio::test]
async fn fanout_reaches_every_subscriber_with_every_update_in_order() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    // WAIT_MS is the agent's own delay before its first update, generous
    // for two local subscriptions; were it not enough, a late subscriber
    // would be caught up with a snapshot and this test would fail, not
    // pass wrongly.
    let task = send_task(
        &mut client,
        request("bench", user_message("fanout:50:1000:0"), true),
    )
    .await;
    let mut subscribers = Vec::new();
    for _ in 0..2 {
        let mut client = server.client().await;
        let stream = client
            .subscribe_to_task(SubscribeToTaskRequest {
                tenant: "bench".into(),
                id: task.id.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        subscribers.push(tokio::spawn(collect(stream)));
    }
    for subscriber in subscribers {
        let events = subscriber.await.unwrap().unwrap();
        let (seen, completed) = numbers(&events);
        assert_eq!(seen, (1..=50).collect::<Vec<u32>>());
        assert!(completed, "{:?}", describe_all(&events));
    }
    let task = get_task(&mut client, "bench", &task.id).await.unwrap();
    assert_eq!(state_of(&task), TaskState::Completed);
    // The even updates were appended to one artifact.
    assert_eq!(task.artifacts.len(), 1);
    assert_eq!(task.artifacts[0].parts.len(), 25);
    server.stop().await;
}

#[tokio::test]
async fn a_malformed_fanout_is_rejected_with_the_reason() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let task = send_text(&mut client, "bench", "fanout:many:0:0").await;
    assert_eq!(state_of(&task), TaskState::Rejected);
    assert!(status_text(&task).contains("K"), "{}", status_text(&task));
    server.stop().await;
}
