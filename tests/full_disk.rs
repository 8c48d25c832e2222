//! A real full filesystem under the SQLite store (issue "hardening", item
//! 1): the database lives on a small tmpfs that the test fills. While the
//! disk is full the task's stream ends with the store's error; once space
//! is freed the runtime fails the task, naming the error, instead of
//! leaving it WORKING. Needs permission to mount a tmpfs (root with
//! CAP_SYS_ADMIN, as on this project's machines); without it the test says
//! so and stops, and `tests/runtime_faults.rs` covers the same path with a
//! failing store.

use crate::support;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::Notify;

use a2a_lifecycle::agent::{AgentError, AgentExecutor, AgentRouter, EventSink, RequestContext};
use a2a_lifecycle::proto::TaskState;
use a2a_lifecycle::runtime::RuntimeConfig;
use a2a_lifecycle::store::SqliteStore;
use support::*;

/// A tmpfs mounted for the test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join("full-disk")
            .join(uuid::Uuid::new_v4().to_string());
        std::fs::create_dir_all(&dir).ok()?;
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .status()
            .ok()?
            .success();
        mounted.then_some(Tmpfs(dir))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Fills the filesystem at `dir` until a write fails for lack of space.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).unwrap();
    let chunk = vec![0u8; 64 * 1024];
    while file.write_all(&chunk).is_ok() {}
    // The last partial chunk may have taken what was left.
    let _ = file.write_all(&chunk[..512]);
    let _ = file.sync_all();
    path
}

struct Gated {
    gate: Notify,
    working: Notify,
}

#[async_trait]
impl AgentExecutor for Gated {
    async fn execute(&self, _ctx: RequestContext, sink: EventSink) -> Result<(), AgentError> {
        sink.status(TaskState::Working, None).await?;
        self.working.notify_one();
        self.gate.notified().await;
        let report = "r".repeat(256 * 1024);
        sink.artifact_text("report", "report", &report, false, true)
            .await?;
        sink.status(TaskState::Completed, None).await?;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_the_task_once_space_returns() {
    let Some(fs) = Tmpfs::mount("4m") else {
        eprintln!("SKIPPED: cannot mount a tmpfs here; tests/runtime_faults.rs covers this path");
        return;
    };
    let store = Arc::new(SqliteStore::open(fs.0.join("tasks.db")).await.unwrap());
    let agent = Arc::new(Gated {
        gate: Notify::new(),
        working: Notify::new(),
    });
    let server = TestServer::start_full(
        store,
        AgentRouter::new().with("", agent.clone()),
        RuntimeConfig::default(),
    )
    .await;
    let mut client = server.client().await;
    let (task, mut stream) = support::subscribed_while_working(&mut client, &agent.working).await;
    let filler = fill(&fs.0);
    agent.gate.notify_one();
    let err = support::stream_error(&mut stream).await;
    eprintln!("stream ended with: {err:?}");
    std::fs::remove_file(&filler).unwrap();
    let (events, failed) = settled(&mut client, "", &task.id).await;
    if let Some(last) = events.last() {
        assert_eq!(describe(last), "status:TASK_STATE_FAILED");
    }
    assert_eq!(state_of(&failed), TaskState::Failed);
    let text = status_text(&failed);
    assert!(
        text.contains("full"),
        "the status names the store's error: {text}"
    );
    server.stop().await;
    drop(fs);
}
