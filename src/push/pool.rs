//! Idle HTTP/1.1 connections to webhooks, kept alive per host for the
//! next POST.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::deliver::{IDLE_CONNECTION, MAX_IN_FLIGHT_PER_HOST};
use super::fenced::WriteUntil;

/// Hosts with idle connections kept.
const MAX_POOLED_HOSTS: usize = 1024;

pub(super) type Sender =
    hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>;
/// A kept connection, since when it is idle, and the end of the time its
/// socket may write in ([`WriteUntil`]), which the next attempt moves.
type Idle = (Instant, Sender, Arc<WriteUntil>);

/// Idle HTTP/1.1 connections kept alive per webhook host, at most
/// [`MAX_IN_FLIGHT_PER_HOST`] each, for [`IDLE_CONNECTION`].
#[derive(Default)]
pub(super) struct Pool {
    idle: Mutex<HashMap<Arc<str>, Vec<Idle>>>,
}

impl Pool {
    pub(super) fn take(&self, host: &Arc<str>) -> Option<(Sender, Arc<WriteUntil>)> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let senders = idle.get_mut(host)?;
        let found = std::iter::from_fn(|| senders.pop())
            .find(|(since, sender, _)| since.elapsed() < IDLE_CONNECTION && !sender.is_closed())
            .map(|(_, sender, until)| (sender, until));
        if senders.is_empty() {
            idle.remove(host);
        }
        found
    }

    pub(super) fn keep(&self, host: &Arc<str>, sender: Option<Sender>, until: Arc<WriteUntil>) {
        let Some(sender) = sender.filter(|s| !s.is_closed()) else {
            return;
        };
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() >= MAX_POOLED_HOSTS && !idle.contains_key(host) {
            sweep(&mut idle);
            if idle.len() >= MAX_POOLED_HOSTS {
                return;
            }
        }
        let senders = idle.entry(host.clone()).or_default();
        if senders.len() < MAX_IN_FLIGHT_PER_HOST {
            senders.push((Instant::now(), sender, until));
        }
    }

    /// Closes the connections idle longer than [`IDLE_CONNECTION`].
    pub(super) fn sweep(&self) {
        sweep(&mut self.idle.lock().unwrap_or_else(|e| e.into_inner()));
    }
}

fn sweep(idle: &mut HashMap<Arc<str>, Vec<Idle>>) {
    idle.retain(|_, senders| {
        senders
            .retain(|(since, sender, _)| since.elapsed() < IDLE_CONNECTION && !sender.is_closed());
        !senders.is_empty()
    });
}
