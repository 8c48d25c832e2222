//! A PostgreSQL restart under load (issue "scale out"): while the database
//! is down requests are answered UNAVAILABLE, and the replica recovers by
//! itself once it is back, with nothing acknowledged lost.
//!
//! It stops and starts the machine's PostgreSQL (`pg_ctlcluster`), so it
//! runs only when asked: `A2A_TEST_POSTGRES_RESTART=1` (CI sets it), and
//! alone in its test binary (cargo runs test binaries one at a time).

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use a2a_lifecycle::proto::a2a_service_client::A2aServiceClient;
use a2a_lifecycle::proto::{StreamResponse, TaskState};
use tokio::sync::Mutex;
use tonic::Code;

/// Runs `pg_ctlcluster ACTION` on the machine's one cluster.
fn cluster(action: &str) {
    let version = std::fs::read_dir("/etc/postgresql")
        .expect("/etc/postgresql: a Debian PostgreSQL cluster")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .next()
        .expect("a PostgreSQL version");
    let mut args = vec!["--skip-systemctl-redirect", &version, "main", action];
    if action == "stop" {
        args.extend(["-m", "fast"]);
    }
    let status = std::process::Command::new("pg_ctlcluster")
        .args(&args)
        .status()
        .expect("run pg_ctlcluster");
    assert!(status.success(), "pg_ctlcluster {action}: {status}");
}

/// PostgreSQL stopped by the test: started again when dropped, so a test
/// that fails (panics) while it is down does not leave it down for every
/// test after it.
struct Stopped;

impl Stopped {
    fn cluster() -> Self {
        cluster("stop");
        Stopped
    }

    /// Starts it again (and checks that it started).
    fn start(self) {
        std::mem::forget(self);
        cluster("start");
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // Not `cluster`: a second panic while unwinding would abort.
        let version = std::fs::read_dir("/etc/postgresql")
            .ok()
            .and_then(|mut d| d.next())
            .and_then(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned());
        if let Some(version) = version {
            let started = std::process::Command::new("pg_ctlcluster")
                .args(["--skip-systemctl-redirect", &version, "main", "start"])
                .status();
            eprintln!("PostgreSQL started again after a failure while it was stopped: {started:?}");
        }
    }
}

/// What the load saw: acknowledged task ids and refusals' codes.
#[derive(Default)]
struct Seen {
    acknowledged: Vec<String>,
    refused: Vec<Code>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_postgresql_restart_under_load_is_unavailable_then_recovered() {
    if std::env::var("A2A_TEST_POSTGRES_RESTART").is_err() {
        eprintln!("PostgreSQL restart test skipped: set A2A_TEST_POSTGRES_RESTART=1 to run it");
        return;
    }
    let Some(store) = support::postgres::fresh_schema().await else {
        panic!("A2A_TEST_POSTGRES_RESTART needs PostgreSQL (A2A_TEST_POSTGRES)");
    };
    let (server, url) = support::postgres::spawn_bench_replica(&store);
    let grpc = support::within("connect", A2aServiceClient::connect(url))
        .await
        .unwrap();
    // A stream open across the restart: an update every 20 ms.
    let mut g = grpc.clone();
    let stream = support::within(
        "stream",
        g.send_streaming_message(support::request(
            "",
            support::user_message("fanout:100000:0:20000"),
            true,
        )),
    )
    .await
    .unwrap()
    .into_inner();
    let streamed = tokio::spawn(async move {
        let mut stream: tonic::Streaming<StreamResponse> = stream;
        loop {
            match stream.message().await {
                Ok(Some(_)) => {}
                Ok(None) => return None,
                Err(status) => return Some(status.code()),
            }
        }
    });
    // Eight senders until told to stop.
    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut senders = Vec::new();
    for _ in 0..8 {
        let (mut g, seen, stop) = (grpc.clone(), seen.clone(), stop.clone());
        senders.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let request = support::request("", support::user_message("go"), true);
                let answer = tokio::time::timeout(support::WAIT, g.send_message(request))
                    .await
                    .expect("a send is answered while the database is down");
                let mut seen = seen.lock().await;
                match answer {
                    Ok(r) => match r.into_inner().payload {
                        Some(a2a_lifecycle::proto::send_message_response::Payload::Task(t)) => {
                            seen.acknowledged.push(t.id)
                        }
                        other => panic!("expected a task, got {other:?}"),
                    },
                    Err(status) => seen.refused.push(status.code()),
                }
                drop(seen);
                tokio::task::yield_now().await;
            }
        }));
    }
    let until = |what: &'static str, done: fn(&Seen) -> bool| {
        let seen = seen.clone();
        support::within(what, async move {
            loop {
                if done(&*seen.lock().await) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    until("sends before the restart", |s| s.acknowledged.len() >= 50).await;
    let stopped = Stopped::cluster();
    until("a refusal while the database is down", |s| {
        !s.refused.is_empty()
    })
    .await;
    let before = seen.lock().await.acknowledged.len();
    stopped.start();
    let recovered = seen.clone();
    support::within("sends acknowledged again", async move {
        loop {
            if recovered.lock().await.acknowledged.len() >= before + 50 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for s in senders {
        support::within("a sender to stop", s).await.unwrap();
    }
    let seen = seen.lock().await;
    assert!(
        seen.refused.iter().all(|c| *c == Code::Unavailable),
        "refusals while down: {:?}",
        seen.refused
    );
    // Nothing acknowledged is lost.
    let mut g = grpc.clone();
    for id in &seen.acknowledged {
        let task = support::get_task(&mut g, "", id).await.unwrap();
        assert_eq!(support::state_of(&task), TaskState::Completed, "task {id}");
    }
    // The stream either goes on (its run's writes resumed) or ended with
    // UNAVAILABLE.
    if streamed.is_finished() {
        let ended = streamed.await.unwrap();
        assert!(
            matches!(ended, None | Some(Code::Unavailable)),
            "the open stream ended with {ended:?}"
        );
    }
    drop(server);
}
