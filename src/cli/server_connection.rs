//! The server a client command calls (`--server`, `--binding`,
//! `--tenant`, credentials and TLS) and the connection to it.

use tonic::transport::Channel;

use a2a_lifecycle::bindings::Binding;

use super::args::parse_binding;
use super::client::{BearerValue, Client};

/// The server and agent a client command calls, and how.
#[derive(clap::Args)]
pub struct ServerConnection {
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    pub server: String,
    /// The protocol binding to call the server over: grpc, jsonrpc
    /// (JSON-RPC 2.0, spec §9) or http-json (spec §11).
    #[arg(long, default_value = "grpc", value_parser = parse_binding)]
    pub binding: Binding,
    /// The agent: "" (the default agent), test-runner, code-reviewer,
    /// deployer, conformance.
    #[arg(long, default_value = "")]
    pub tenant: String,
    /// API key or JWT for a server run with --auth, sent as
    /// `authorization: Bearer <token>`.
    #[arg(long, env = "A2A_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// CA certificate (PEM) to verify an `https://` server with, instead
    /// of the system's roots.
    #[arg(long)]
    pub ca_cert: Option<std::path::PathBuf>,
    /// Client certificate chain (PEM) for a server run with
    /// --tls-client-ca (mutual TLS).
    #[arg(long, requires = "client_key")]
    pub client_cert: Option<std::path::PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, requires = "client_cert")]
    pub client_key: Option<std::path::PathBuf>,
}

impl ServerConnection {
    /// A connection to the server (over TLS for `https://`), and the
    /// `authorization` value its calls carry.
    pub async fn connect(
        &self,
    ) -> Result<(Channel, Option<BearerValue>), Box<dyn std::error::Error>> {
        let bearer = self
            .token
            .as_deref()
            .map(|token| {
                format!("Bearer {token}")
                    .parse()
                    .map_err(|_| "--token must be visible ASCII")
            })
            .transpose()?;
        let mut endpoint = Channel::from_shared(self.server.clone())?;
        let read = |path: &std::path::Path| {
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
        };
        if self.ca_cert.is_some() || self.client_cert.is_some() {
            let mut tls = tonic::transport::ClientTlsConfig::new();
            if let Some(ca) = &self.ca_cert {
                tls = tls.ca_certificate(tonic::transport::Certificate::from_pem(read(ca)?));
            }
            if let (Some(cert), Some(key)) = (&self.client_cert, &self.client_key) {
                tls = tls.identity(tonic::transport::Identity::from_pem(
                    read(cert)?,
                    read(key)?,
                ));
            }
            endpoint = endpoint.tls_config(tls)?;
        }
        Ok((endpoint.connect().await?, bearer))
    }

    /// A [`Client`] on a new connection to the server, over `--binding`.
    pub async fn connect_client(&self) -> Result<Client, Box<dyn std::error::Error>> {
        let (channel, bearer) = self.connect().await?;
        Client::new(self.binding, channel, bearer)
    }
}
