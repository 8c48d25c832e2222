//! The `a2a-lifecycle` binary's modules, the parts that are not the
//! library: the command line ([`args`], `serve`'s flags in
//! [`serve_args`]); `serve` ([`serve`]) and the store it opens
//! ([`store`]); the client commands ([`client_commands`], [`push`]), the
//! server they call ([`server_connection`]), their connection over each
//! binding ([`client`]), how their failures print ([`call_error`]) and
//! their answers ([`output`]); `top` ([`top`]); the log output and span
//! export ([`logging`]).

pub mod args;
pub mod call_error;
pub mod client;
pub mod client_commands;
pub mod logging;
pub mod output;
pub mod push;
pub mod serve;
pub mod serve_args;
pub mod server_connection;
pub mod store;
pub mod top;

/// An error that may cross tasks (the store's, the server's).
pub type AnyError = Box<dyn std::error::Error + Send + Sync>;

/// Why a listener could not bind `addr`, naming the flag that chose it.
pub fn cannot_listen(addr: std::net::SocketAddr, flag: &str, error: &std::io::Error) -> String {
    let why = match error.kind() {
        std::io::ErrorKind::AddrInUse => format!(
            "address already in use: another process listens there; stop it, or choose \
             another port with {flag}"
        ),
        std::io::ErrorKind::AddrNotAvailable => format!(
            "no interface of this machine has that address; choose one it has with {flag} \
             (127.0.0.1 for this machine only, 0.0.0.0 for every interface)"
        ),
        std::io::ErrorKind::PermissionDenied => format!(
            "permission denied (ports below 1024 need privileges); choose a port above 1023 \
             with {flag}"
        ),
        _ => error.to_string(),
    };
    format!("cannot listen on {addr} ({flag}): {why}")
}
