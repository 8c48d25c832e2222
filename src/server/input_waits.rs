//! Fails, in the background, the tasks that waited for input past their
//! owner's `max_input_wait` (the auth file's quota).

use std::sync::Arc;

use crate::runtime::TaskManager;

/// How often the input-wait quota is swept, at most.
const INPUT_WAIT_SWEEP: std::time::Duration = std::time::Duration::from_secs(60);

/// Until shutdown: fails the tasks that waited for input past their
/// owner's `max_input_wait` (the auth file in force each time, so a reload
/// applies), every quarter of the shortest limit set (at most each
/// [`INPUT_WAIT_SWEEP`]), by one of the replicas sharing the store.
pub(super) async fn sweep_input_waits(manager: TaskManager, auth: Arc<crate::auth::Authenticator>) {
    let shutdown = manager.shutdown_token();
    loop {
        let every = auth.shortest_input_wait().map_or(INPUT_WAIT_SWEEP, |w| {
            (w / 4).clamp(std::time::Duration::from_secs(1), INPUT_WAIT_SWEEP)
        });
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = shutdown.cancelled() => return,
        }
        let Some(shortest) = auth.shortest_input_wait() else {
            continue;
        };
        match manager.take_turn("input-waits", every.mul_f64(0.9)).await {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "input-wait sweep failed");
                continue;
            }
        }
        let expired = manager
            .expire_input_waits(std::time::SystemTime::now(), shortest, |owner| {
                auth.quota_of(owner).max_input_wait
            })
            .await;
        if let Err(e) = expired {
            tracing::warn!(error = %e, "input-wait sweep failed");
        }
    }
}
