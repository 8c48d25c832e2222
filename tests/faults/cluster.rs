//! The replicas as real `serve` processes, each behind its own PostgreSQL
//! proxy, and the machine's PostgreSQL itself: what the nemesis acts on
//! and the clients call.
//!
//! A replica slot (`r0`, `r1`, ...) keeps its store URL (its proxy) for
//! the whole run; each process started in it is an incarnation (`r1.0`,
//! `r1.1`, ...), with its own gRPC port and its own log: every stderr line
//! with the moment it was read, up to the process's death (a SIGKILLed
//! process's last lines are in its pipe and are read too).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use a2a_lifecycle::proto::a2a_service_client::A2aServiceClient;
use tonic::transport::{Channel, Endpoint};

use crate::history::{History, T};
use crate::proxy::Proxy;
use crate::support;

/// The log filter of every replica: the runtime's debug lines carry the
/// runs (`agent run started` / `agent run ended`).
pub const LOG_FILTER: &str = "info,a2a_lifecycle::runtime=debug";

/// One line a process wrote, with the moment it was read.
#[derive(Clone, Debug)]
pub struct LogLine {
    pub at: T,
    pub text: String,
}

/// One process of a replica slot.
pub struct Process {
    pub name: String,
    pub slot: usize,
    pub pid: i32,
    child: Mutex<Child>,
    pub channel: Channel,
    pub log: Arc<Mutex<Vec<LogLine>>>,
    reader: Mutex<Option<std::thread::JoinHandle<()>>>,
    pub started: T,
    /// When it was SIGKILLed (by the nemesis or at the end of the run).
    pub died: Mutex<Option<T>>,
    /// SIGSTOPped now.
    pub stopped: AtomicBool,
}

impl Process {
    pub fn client(&self) -> A2aServiceClient<Channel> {
        A2aServiceClient::new(self.channel.clone())
    }

    pub fn lines(&self) -> Vec<LogLine> {
        lock(&self.log).clone()
    }

    pub fn died_at(&self) -> Option<T> {
        *lock(&self.died)
    }

    /// SIGKILL (a stopped process too) and reap; the moment it died, or
    /// why it could not be reaped.
    fn kill(&self, history: &History) -> Result<T, String> {
        let mut child = lock(&self.child);
        // An error is a process already reaped: it died before.
        child.kill().ok();
        let status = child.wait();
        let at = history.now();
        let mut died = lock(&self.died);
        if died.is_none() {
            *died = Some(at);
        }
        match status {
            Ok(_) => Ok(at),
            Err(e) => Err(format!("{}: wait: {e}", self.name)),
        }
    }

    fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on a child this test spawned and has not reaped
        // (a reaped one is never signalled: the slot forgets it first).
        let rc = unsafe { libc::kill(self.pid, signal) };
        assert_eq!(
            rc,
            0,
            "{}: kill({signal}): {}",
            self.name,
            std::io::Error::last_os_error()
        );
    }

    /// Waits (bounded) for the log reader to reach the end of the pipe.
    async fn join_reader(&self) {
        let reader = lock(&self.reader).take();
        if let Some(reader) = reader {
            let joined = tokio::time::timeout(
                support::WAIT,
                tokio::task::spawn_blocking(move || reader.join()),
            )
            .await;
            assert!(
                matches!(joined, Ok(Ok(Ok(())))),
                "{}: its log reader did not finish: {joined:?}",
                self.name
            );
        }
    }
}

pub fn lock<X>(m: &Mutex<X>) -> MutexGuard<'_, X> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One replica slot.
pub struct Slot {
    pub index: usize,
    pub proxy: Proxy,
    pub store: String,
    current: Mutex<Option<Arc<Process>>>,
    pub all: Mutex<Vec<Arc<Process>>>,
}

impl Slot {
    pub fn current(&self) -> Option<Arc<Process>> {
        lock(&self.current).clone()
    }
}

pub struct Cluster {
    pub history: Arc<History>,
    pub slots: Vec<Slot>,
    pub lease: Duration,
}

impl Cluster {
    /// `replicas` slots on `store` (a `postgres://` URL), each behind a
    /// proxy of its own, not started yet.
    pub async fn new(
        history: Arc<History>,
        store: &str,
        replicas: usize,
        lease: Duration,
    ) -> Cluster {
        let (before, after) = store.split_once('@').expect("a postgres://user@host URL");
        let (upstream, rest) = after.split_once('/').expect("a URL with a database");
        let mut slots = Vec::new();
        for index in 0..replicas {
            let proxy = Proxy::start(upstream.to_owned()).await;
            let store = format!("{before}@127.0.0.1:{}/{rest}", proxy.port);
            slots.push(Slot {
                index,
                proxy,
                store,
                current: Mutex::new(None),
                all: Mutex::new(Vec::new()),
            });
        }
        Cluster {
            history,
            slots,
            lease,
        }
    }

    /// Starts a process in `slot` (which has none running): its name, or
    /// why it did not start (its last log lines).
    pub async fn start(&self, slot: usize) -> Result<String, String> {
        let s = &self.slots[slot];
        assert!(s.current().is_none(), "r{slot} already runs");
        // Counted among the processes that started: a failed attempt's
        // name is the next one's.
        let name = format!("r{slot}.{}", lock(&s.all).len());
        let lease = format!("{}ms", self.lease.as_millis());
        let mut child = Command::new(support::BIN)
            .args(["serve", "--listen", "127.0.0.1:0", "--store", &s.store])
            .args(["--lease", &lease, "--default-agent", "bench"])
            .args(["--push-allow-cidr", "127.0.0.0/8"])
            .env("RUST_LOG", LOG_FILTER)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn serve");
        let started = self.history.now();
        let stderr = child.stderr.take().expect("stderr piped");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (addr_tx, addr_rx) = tokio::sync::oneshot::channel::<String>();
        let reader = {
            let log = log.clone();
            let history = self.history.clone();
            std::thread::spawn(move || {
                let mut addr_tx = Some(addr_tx);
                for text in BufReader::new(stderr).lines().map_while(Result::ok) {
                    let at = history.now();
                    if let Some(rest) = text.split("addr=").nth(1)
                        && let Some(tx) = addr_tx.take()
                    {
                        let addr = rest.split_whitespace().next().unwrap_or("").to_owned();
                        // The starter may have given up on it.
                        tx.send(addr).ok();
                    }
                    lock(&log).push(LogLine { at, text });
                }
            })
        };
        let pid = i32::try_from(child.id()).expect("a pid");
        let addr = tokio::time::timeout(support::WAIT, addr_rx).await;
        let addr = match addr {
            Ok(Ok(addr)) => addr,
            _ => {
                // Exited (its store unreachable, say) or hung: gone.
                child.kill().ok();
                let status = child.wait();
                let joined = tokio::time::timeout(
                    support::WAIT,
                    tokio::task::spawn_blocking(move || reader.join()),
                )
                .await;
                assert!(
                    matches!(joined, Ok(Ok(Ok(())))),
                    "{name}: log reader: {joined:?}"
                );
                let lines = lock(&log);
                let last: Vec<&str> = lines
                    .iter()
                    .rev()
                    .take(3)
                    .map(|l| l.text.as_str())
                    .collect();
                return Err(format!(
                    "{name} did not start ({status:?}); last lines: {last:?}"
                ));
            }
        };
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .expect("a URL")
            .connect_timeout(Duration::from_secs(2))
            .connect_lazy();
        let process = Arc::new(Process {
            name: name.clone(),
            slot,
            pid,
            child: Mutex::new(child),
            channel,
            log,
            reader: Mutex::new(Some(reader)),
            started,
            died: Mutex::new(None),
            stopped: AtomicBool::new(false),
        });
        lock(&s.all).push(process.clone());
        *lock(&s.current) = Some(process);
        Ok(name)
    }

    /// Starts a process in `slot`, trying again each second (PostgreSQL
    /// may be down or the proxy cut) until `within` has passed.
    pub async fn start_retrying(&self, slot: usize, within: Duration) -> Result<String, String> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match self.start(slot).await {
                Ok(name) => return Ok(name),
                Err(why) if tokio::time::Instant::now() >= deadline => return Err(why),
                Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
            }
        }
    }

    /// SIGKILLs `slot`'s process: its name and the moment it died.
    pub fn kill(&self, slot: usize) -> Option<(String, T)> {
        let process = lock(&self.slots[slot].current).take()?;
        let at = process
            .kill(&self.history)
            .expect("a killed replica is reaped");
        Some((process.name.clone(), at))
    }

    /// SIGSTOPs `slot`'s process; its name.
    pub fn pause(&self, slot: usize) -> Option<String> {
        let process = self.slots[slot].current()?;
        process.signal(libc::SIGSTOP);
        process.stopped.store(true, Ordering::SeqCst);
        Some(process.name.clone())
    }

    /// SIGCONTs `slot`'s process if it is stopped.
    pub fn resume(&self, slot: usize) {
        if let Some(process) = self.slots[slot].current()
            && process.stopped.swap(false, Ordering::SeqCst)
        {
            process.signal(libc::SIGCONT);
        }
    }

    /// A process of a random slot, preferring one other than `avoid`: its
    /// slot, its name (`rN (down)` when the slot runs none) and client.
    pub fn pick(
        &self,
        rng: &mut fastrand::Rng,
        avoid: Option<usize>,
    ) -> (usize, String, Option<A2aServiceClient<Channel>>) {
        let n = self.slots.len();
        let mut slot = rng.usize(..n);
        if Some(slot) == avoid && n > 1 {
            slot = (slot + 1 + rng.usize(..n - 1)) % n;
        }
        match self.slots[slot].current() {
            Some(p) => (slot, p.name.clone(), Some(p.client())),
            None => (slot, format!("r{slot} (down)"), None),
        }
    }

    /// Every process ever started, in start order per slot.
    pub fn processes(&self) -> Vec<Arc<Process>> {
        self.slots
            .iter()
            .flat_map(|s| lock(&s.all).clone())
            .collect()
    }

    /// Heals every proxy, resumes every stopped process and starts a
    /// process in every slot without one: what is still broken, if
    /// anything.
    pub async fn heal_all(&self) -> Vec<String> {
        let mut broken = Vec::new();
        for s in &self.slots {
            s.proxy.heal();
            self.resume(s.index);
            if s.current().is_none()
                && let Err(why) = self.start_retrying(s.index, Duration::from_secs(30)).await
            {
                broken.push(why);
            }
        }
        broken
    }

    /// Ends the run: every process SIGKILLed (resumed first) and its log
    /// read to the end of its pipe.
    pub async fn shut_down(&self) {
        for s in &self.slots {
            self.resume(s.index);
            if let Some(p) = lock(&s.current).take() {
                p.kill(&self.history)
                    .expect("a replica is reaped at the end");
            }
        }
        for p in self.processes() {
            p.join_reader().await;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // A panicking test leaves no server behind (holding PostgreSQL
        // connections the next tests need).
        for s in &self.slots {
            if let Some(p) = lock(&s.current).take()
                && let Err(e) = p.kill(&self.history)
            {
                eprintln!("{e}");
            }
        }
    }
}

/// The machine's PostgreSQL cluster, stopped and started by the nemesis
/// (`A2A_TEST_POSTGRES_RESTART=1` only); started again when dropped if it
/// was left stopped, so a panicking test never leaves it down.
pub struct Postgres {
    stopped: AtomicBool,
    /// One restart at a time (stopping and starting take seconds each).
    restarting: tokio::sync::Mutex<()>,
}

impl Postgres {
    pub fn new() -> Postgres {
        Postgres {
            stopped: AtomicBool::new(false),
            restarting: tokio::sync::Mutex::new(()),
        }
    }

    /// Stops it, keeps it down for `down`, starts it: the moments it
    /// began stopping and was started again.
    pub async fn restart(&self, history: &History, down: Duration) -> (T, T) {
        let _one = tokio::time::timeout(Duration::from_secs(120), self.restarting.lock())
            .await
            .expect("the previous PostgreSQL restart ends");
        let began = history.now();
        self.stopped.store(true, Ordering::SeqCst);
        blocking(|| cluster("stop")).await;
        tokio::time::sleep(down).await;
        blocking(|| cluster("start")).await;
        self.stopped.store(false, Ordering::SeqCst);
        (began, history.now())
    }

    /// Starts it if it is stopped.
    pub async fn ensure_started(&self) {
        let _one = tokio::time::timeout(Duration::from_secs(120), self.restarting.lock())
            .await
            .expect("the last PostgreSQL restart ends");
        if self.stopped.load(Ordering::SeqCst) {
            blocking(|| cluster("start")).await;
            self.stopped.store(false, Ordering::SeqCst);
        }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if self.stopped.load(Ordering::SeqCst)
            && let Err(e) = pg_ctlcluster("start")
        {
            // Dropped while unwinding, maybe: say it, do not panic again.
            eprintln!("PostgreSQL NOT started again: {e}");
        }
    }
}

async fn blocking(f: impl FnOnce() + Send + 'static) {
    let done = tokio::time::timeout(Duration::from_secs(60), tokio::task::spawn_blocking(f)).await;
    assert!(matches!(done, Ok(Ok(()))), "pg_ctlcluster: {done:?}");
}

/// Runs `pg_ctlcluster ACTION` on the machine's one cluster (as
/// tests/postgres_restart.rs does).
fn cluster(action: &str) {
    if let Err(e) = pg_ctlcluster(action) {
        panic!("{e}");
    }
}

fn pg_ctlcluster(action: &str) -> Result<(), String> {
    let version = std::fs::read_dir("/etc/postgresql")
        .map_err(|e| format!("/etc/postgresql: a Debian PostgreSQL cluster: {e}"))?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .next()
        .ok_or("no PostgreSQL version in /etc/postgresql")?;
    let mut args = vec!["--skip-systemctl-redirect", &version, "main", action];
    if action == "stop" {
        args.extend(["-m", "fast"]);
    }
    let status = Command::new("pg_ctlcluster")
        .args(&args)
        .status()
        .map_err(|e| format!("run pg_ctlcluster: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("pg_ctlcluster {action}: {status}"))
    }
}
