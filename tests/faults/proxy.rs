//! A TCP proxy between one replica and PostgreSQL that the test can cut
//! and heal: the replica's `--store` URL names the proxy's port, so every
//! connection of that replica (its pool, its lease renewal, its
//! listening connection) goes through it, and no other replica's does.
//!
//! Cut, [`CutMode::Reset`]: every open connection is closed at once (what
//! was in flight is lost, a COMMIT included, its answer never comes) and
//! each new one is closed as soon as it is accepted. Cut,
//! [`CutMode::Blackhole`]: open connections stop carrying bytes either
//! way, and new ones are accepted but never forwarded, as across a network
//! partition: a caller waits on them until its own timeouts fire; at heal
//! they are all closed. Healed: new connections are forwarded again (a
//! connection that lived through a cut never carries bytes again).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CutMode {
    Reset,
    Blackhole,
}

/// The link's state: how many cuts so far, and whether it is cut now.
#[derive(Clone, Copy, Debug)]
struct Link {
    cuts: u64,
    cut: Option<CutMode>,
}

/// What went through a proxy, for the report.
#[derive(Default)]
pub struct ProxyStats {
    pub forwarded: AtomicU64,
    pub refused: AtomicU64,
    pub severed: AtomicU64,
}

impl std::fmt::Display for ProxyStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} connections forwarded, {} refused while cut, {} severed by a cut",
            self.forwarded.load(Ordering::Relaxed),
            self.refused.load(Ordering::Relaxed),
            self.severed.load(Ordering::Relaxed)
        )
    }
}

pub struct Proxy {
    pub port: u16,
    link: watch::Sender<Link>,
    pub stats: Arc<ProxyStats>,
    accept: JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl Proxy {
    /// A proxy on an ephemeral loopback port forwarding to `upstream`.
    pub async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("the proxy's address").port();
        let (link, _) = watch::channel(Link { cuts: 0, cut: None });
        let stats = Arc::new(ProxyStats::default());
        let accept = tokio::spawn(accept_loop(
            listener,
            upstream,
            link.subscribe(),
            stats.clone(),
        ));
        Proxy {
            port,
            link,
            stats,
            accept,
        }
    }

    pub fn cut(&self, mode: CutMode) {
        self.link.send_modify(|l| {
            l.cuts += 1;
            l.cut = Some(mode);
        });
    }

    pub fn heal(&self) {
        self.link.send_modify(|l| l.cut = None);
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: String,
    link: watch::Receiver<Link>,
    stats: Arc<ProxyStats>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            // Out of descriptors, say: the replica sees a refused
            // connection, as it would.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let link = link.clone();
        let stats = stats.clone();
        let upstream = upstream.clone();
        tokio::spawn(async move { connection(client, upstream, link, stats).await });
    }
}

/// One replica connection: forwarded while the link holds, ended as the
/// cut's mode says.
async fn connection(
    client: TcpStream,
    upstream: String,
    mut link: watch::Receiver<Link>,
    stats: Arc<ProxyStats>,
) {
    let born = *link.borrow_and_update();
    if let Some(mode) = born.cut {
        stats.refused.fetch_add(1, Ordering::Relaxed);
        if mode == CutMode::Blackhole {
            held_until_healed(&mut link).await;
        }
        drop(client);
        return;
    }
    let connected =
        tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(&upstream)).await;
    let Ok(Ok(server)) = connected else {
        // PostgreSQL is down (restarting): the replica sees the
        // connection closed.
        return;
    };
    stats.forwarded.fetch_add(1, Ordering::Relaxed);
    let (mut client, mut server) = (client, server);
    let cut_since_birth = |l: &Link| l.cuts > born.cuts;
    let mode = tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => return,
        // An error is the proxy gone: close.
        cut = link.wait_for(cut_since_birth) => cut.map(|l| l.cut).unwrap_or(None),
    };
    stats.severed.fetch_add(1, Ordering::Relaxed);
    if mode == Some(CutMode::Blackhole) {
        held_until_healed(&mut link).await;
    }
}

/// Waits until the link is healed (or the proxy is gone).
async fn held_until_healed(link: &mut watch::Receiver<Link>) {
    // An error is the proxy dropped: the connection is closed all the
    // same.
    link.wait_for(|l| l.cut.is_none()).await.ok();
}
