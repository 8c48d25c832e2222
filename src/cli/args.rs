//! The command line: its global flags, the subcommands and their flags
//! (`serve`'s own in [`super::serve_args`]), and the parsers of their
//! values.

use std::time::Duration;

use clap::{Parser, Subcommand};

use a2a_lifecycle::bindings::Binding;
use a2a_lifecycle::proto::SendMessageRequest;

use super::serve_args::ServeArgs;
use super::server_connection::{ServerAddress, ServerConnection};

#[derive(Parser)]
#[command(
    version,
    about = "A2A protocol v1.0 gRPC server with a durable task lifecycle"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log lines as `text`, or as `json` (one object per line, with the
    /// fields of the RPC and run spans they are in; README, Operations).
    #[arg(long, global = true, value_enum, default_value = "text")]
    pub log_format: super::logging::LogFormat,
    /// Export the RPC and run spans over OTLP/gRPC to this collector
    /// (e.g. `http://127.0.0.1:4317`); off when not given.
    #[arg(long, global = true, env = "A2A_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,
}

// Parsed once at start: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
pub enum Command {
    /// Run the server with the demo agents.
    Serve(ServeArgs),
    #[command(flatten)]
    Client(ClientCommand),
}

/// The subcommands that call a server, and `jwks`, which prints what
/// `card --verify` reads.
#[derive(Subcommand)]
pub enum ClientCommand {
    /// Send a text message.
    Send {
        #[command(flatten)]
        target: ServerConnection,
        /// Continue this task.
        #[arg(long)]
        task_id: Option<String>,
        #[arg(long)]
        context_id: Option<String>,
        /// Stream events (SendStreamingMessage).
        #[arg(long)]
        stream: bool,
        /// Return as soon as the task exists (for a follow-up: as soon as
        /// the message is in the task's history).
        #[arg(long)]
        return_immediately: bool,
        /// The request's metadata, a JSON object (SendMessageRequest.metadata),
        /// handed to the agent.
        #[arg(long, value_parser = parse_metadata)]
        metadata: Option<a2a_lifecycle::wkt::Struct>,
        /// The message's own metadata, a JSON object (Message.metadata).
        #[arg(long, value_parser = parse_metadata)]
        message_metadata: Option<a2a_lifecycle::wkt::Struct>,
        /// A media type the client accepts in the answer
        /// (accepted_output_modes); repeat for several.
        #[arg(long = "accept")]
        accepted_output_modes: Vec<String>,
        /// A webhook for the task's notifications, registered with the
        /// message (SendMessageConfiguration.task_push_notification_config).
        #[arg(long)]
        push_url: Option<String>,
        /// The token the webhook's notifications carry
        /// (X-A2A-Notification-Token).
        #[arg(long, requires = "push_url")]
        notification_token: Option<String>,
        text: String,
    },
    /// Get a task.
    Get {
        #[command(flatten)]
        target: ServerConnection,
        #[arg(long)]
        history_length: Option<i32>,
        /// Include the task's transition log (state, time, status message,
        /// cause) in its metadata: the server's transition-log extension,
        /// activated for this call.
        #[arg(long)]
        transitions: bool,
        id: String,
    },
    /// List tasks.
    List {
        #[command(flatten)]
        target: ServerConnection,
        /// A state name: TASK_STATE_WORKING or the 0.3 name `working`.
        #[arg(long)]
        state: Option<String>,
        #[arg(long)]
        context_id: Option<String>,
        #[arg(long)]
        page_size: Option<i32>,
        #[arg(long)]
        page_token: Option<String>,
    },
    /// Cancel a task.
    Cancel {
        #[command(flatten)]
        target: ServerConnection,
        /// The request's metadata, a JSON object (CancelTaskRequest.metadata),
        /// handed to the agent's cancel hook.
        #[arg(long, value_parser = parse_metadata)]
        metadata: Option<a2a_lifecycle::wkt::Struct>,
        id: String,
    },
    /// Print the agent card: the public one (`GET
    /// /.well-known/agent-card.json`, or the tenant's), or with
    /// `--extended` the extended one (GetExtendedAgentCard, over
    /// `--binding`, authenticated).
    Card {
        #[command(flatten)]
        target: ServerConnection,
        #[arg(long)]
        extended: bool,
        /// Check the card's signatures (spec §8.4.3) against this JWK set
        /// (a JSON file `{"keys": [...]}`): exit 0 and name the one that
        /// verifies, or exit 1 with why none does.
        #[arg(long, value_name = "JWKS_FILE")]
        verify: Option<std::path::PathBuf>,
    },
    /// Print the public JWK set of a card signing key (`serve
    /// --card-signing-key`): what to publish for verifiers, and what
    /// `card --verify` reads.
    Jwks {
        /// The PEM private key.
        key: std::path::PathBuf,
        /// The key id, as given to `serve --card-signing-kid`; by default
        /// the key's thumbprint (the same default as `serve`).
        #[arg(long)]
        kid: Option<String>,
    },
    /// Stream a task's events.
    Subscribe {
        #[command(flatten)]
        target: ServerConnection,
        id: String,
    },
    /// A terminal view of the server's metrics, refreshed every second:
    /// RPC rates, errors and latency, tasks by state, runs, streams,
    /// store writes, push deliveries (`GET /metrics`; `--server` may be
    /// the server or its `--metrics-listen` address).
    Top {
        #[command(flatten)]
        target: ServerAddress,
        /// How often the view is refreshed (rates are over this interval).
        #[arg(long, default_value = "1s", value_parser = parse_positive_duration)]
        interval: Duration,
        /// Print one view, over one interval, and exit.
        #[arg(long)]
        once: bool,
    },
    /// A task's webhooks (push notification configs), and a local
    /// receiver that prints what a webhook gets.
    Push {
        #[command(subcommand)]
        command: PushCommand,
    },
}

#[derive(Subcommand)]
pub enum PushCommand {
    /// Register a webhook on a task (CreateTaskPushNotificationConfig).
    Set {
        #[command(flatten)]
        target: ServerConnection,
        /// The config's id; the server assigns one when not given.
        #[arg(long)]
        id: Option<String>,
        /// The token each notification carries (X-A2A-Notification-Token).
        #[arg(long, env = "A2A_NOTIFICATION_TOKEN", hide_env_values = true)]
        notification_token: Option<String>,
        /// The scheme of the webhook's Authorization header, e.g. `Bearer`.
        #[arg(long, requires = "credentials")]
        auth_scheme: Option<String>,
        /// The credentials of the webhook's Authorization header.
        #[arg(
            long,
            env = "A2A_PUSH_CREDENTIALS",
            hide_env_values = true,
            requires = "auth_scheme"
        )]
        credentials: Option<String>,
        task_id: String,
        url: String,
    },
    /// Show one of a task's webhooks.
    Get {
        #[command(flatten)]
        target: ServerConnection,
        task_id: String,
        id: String,
    },
    /// List a task's webhooks.
    List {
        #[command(flatten)]
        target: ServerConnection,
        #[arg(long)]
        page_size: Option<i32>,
        #[arg(long)]
        page_token: Option<String>,
        task_id: String,
    },
    /// Remove a webhook from a task (nothing more is sent to it).
    Delete {
        #[command(flatten)]
        target: ServerConnection,
        task_id: String,
        id: String,
    },
    /// Run a webhook receiver: each notification is printed as one line of
    /// ProtoJSON (a StreamResponse) until interrupted.
    Listen {
        /// The port; 0 picks a free one (the address is printed to stderr).
        #[arg(long, default_value_t = 9090)]
        port: u16,
        /// The address to listen on.
        #[arg(long, default_value = "127.0.0.1")]
        host: std::net::IpAddr,
        /// Refuse (401) notifications without this X-A2A-Notification-Token.
        #[arg(long, env = "A2A_NOTIFICATION_TOKEN", hide_env_values = true)]
        notification_token: Option<String>,
    },
}

/// `--binding`: a binding's name (`grpc`, `jsonrpc`, `http-json`).
pub fn parse_binding(name: &str) -> Result<Binding, String> {
    Binding::parse(name)
        .ok_or_else(|| format!("{name:?}: the bindings are grpc, jsonrpc, http-json"))
}

/// `--metadata '{"k": "v"}'`: a JSON object, read as ProtoJSON reads a
/// `google.protobuf.Struct` (through the request message that holds one,
/// so the same descriptor-driven decoder does it).
fn parse_metadata(text: &str) -> Result<a2a_lifecycle::wkt::Struct, String> {
    let wrapped = format!("{{\"metadata\": {text}}}");
    let request: SendMessageRequest = a2a_lifecycle::json::from_str(&wrapped)
        .map_err(|e| format!("metadata must be a JSON object: {e}"))?;
    request
        .metadata
        .ok_or_else(|| "metadata must be a JSON object".to_owned())
}

/// A duration longer than zero (`--body-timeout`, `--push-timeout`, ...).
pub fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(d) if d.is_zero() => Err("must be longer than zero".into()),
        Ok(d) => Ok(d),
        Err(e) => Err(e.to_string()),
    }
}
