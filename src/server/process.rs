//! The process a server runs in: its tokio runtime, and the signal that
//! shuts it down.

/// The runtime the server binary runs on: tokio's multi-thread runtime
/// without its LIFO slot (when built with `--cfg tokio_unstable`, as
/// `.cargo/config.toml` sets).
///
/// With the slot, a task woken by the running one (an HTTP/2 connection
/// woken by a response) runs next; without, it waits its turn in the run
/// queue, and by then the responses of many requests are ready for one
/// write. Measured on the benchmark suite's workloads: 10 to 18% more
/// requests per second (for a bare tonic server about as much).
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    #[cfg(tokio_unstable)]
    runtime.disable_lifo_slot();
    runtime.build()
}

/// Completes on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
