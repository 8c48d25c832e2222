//! The server a client command calls (`--server`, `--binding`,
//! `--tenant`, credentials and TLS) and the connection to it; a
//! connection that fails says where it went and why
//! ([`unreachable`]).

use tonic::transport::Channel;

use a2a_lifecycle::bindings::Binding;

use super::args::parse_binding;
use super::client::{BearerValue, Client};

/// The server and agent a client command calls, and how.
#[derive(clap::Args)]
pub struct ServerConnection {
    #[command(flatten)]
    pub address: ServerAddress,
    /// The protocol binding to call the server over: grpc, jsonrpc
    /// (JSON-RPC 2.0, spec §9) or http-json (spec §11).
    #[arg(long, default_value = "grpc", value_parser = parse_binding)]
    pub binding: Binding,
    /// The agent (tenant) to call; a task is found only under the agent
    /// it was sent to: "" (the server's default agent), test-runner,
    /// code-reviewer, deployer, conformance, bench.
    #[arg(long, default_value = "")]
    pub tenant: String,
}

/// Where the server is and the credentials to show it: what every
/// command that calls a server needs (`top` needs no more).
#[derive(clap::Args)]
pub struct ServerAddress {
    /// The server's URL: `http://HOST:PORT`, `https://HOST:PORT` (TLS),
    /// or `HOST:PORT`, taken as `http://HOST:PORT`.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    pub server: String,
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

impl ServerAddress {
    /// `--server` as a URL: `HOST:PORT` (grpcurl's form) is
    /// `http://HOST:PORT`.
    pub fn url(&self) -> String {
        if self.server.contains("://") {
            self.server.clone()
        } else {
            format!("http://{}", self.server)
        }
    }

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
        let url = self.url();
        let mut endpoint = Channel::from_shared(url.clone()).map_err(|e| {
            format!(
                "--server {:?} is not a URL such as http://127.0.0.1:50051: {e}",
                self.server
            )
        })?;
        let read = |path: &std::path::Path| {
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
        };
        if url.starts_with("https://") || self.ca_cert.is_some() || self.client_cert.is_some() {
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
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| unreachable(&url, &e))?;
        Ok((channel, bearer))
    }
}

impl ServerConnection {
    /// [`ServerAddress::connect`].
    pub async fn connect(
        &self,
    ) -> Result<(Channel, Option<BearerValue>), Box<dyn std::error::Error>> {
        self.address.connect().await
    }

    /// A [`Client`] on a new connection to the server, over `--binding`.
    pub async fn connect_client(&self) -> Result<Client, Box<dyn std::error::Error>> {
        let (channel, bearer) = self.connect().await?;
        Client::new(self.binding, channel, bearer)
    }
}

/// An error's message and its causes', each once (libraries repeat their
/// cause's text in their own).
pub fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !said.is_empty() && !text.contains(&said) {
            text = format!("{text}: {said}");
        }
        source = cause.source();
    }
    text
}

/// What a failed connection to `url` says: the address, the cause, and
/// what to try.
pub fn unreachable(url: &str, error: &(dyn std::error::Error + 'static)) -> String {
    let text = chain(error);
    let refused = {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
        let mut found = false;
        while let Some(e) = source {
            if let Some(io) = e.downcast_ref::<std::io::Error>() {
                found |= io.kind() == std::io::ErrorKind::ConnectionRefused;
            }
            source = e.source();
        }
        found
    };
    let lower = text.to_ascii_lowercase();
    let plain = url.replacen("https://", "http://", 1);
    let why = if refused {
        "connection refused: is the server running there? `a2a-lifecycle serve` listens on \
         127.0.0.1:50051 unless --listen says otherwise; --server names another address"
            .to_owned()
    } else if lower.contains("unknownissuer") || lower.contains("unknown issuer") {
        "TLS handshake: the server's certificate is signed by an unknown CA; pass --ca-cert \
         with the certificate of the CA that issued it"
            .to_owned()
    } else if lower.contains("notvalidforname") || lower.contains("not valid for name") {
        "TLS handshake: the server's certificate is not valid for this host name; use a name \
         the certificate lists in --server"
            .to_owned()
    } else if lower.contains("invalidcontenttype")
        || lower.contains("corrupt message")
        || lower.contains("wrong version number")
    {
        format!(
            "TLS handshake: the server answers in plain HTTP, not TLS; call a plain server \
             with http:// ({plain})"
        )
    } else if url.starts_with("http://")
        && (lower.contains("frame")
            || lower.contains("connection closed")
            || lower.contains("reset"))
    {
        format!(
            "the connection closed during the HTTP/2 handshake ({text}); if the server runs \
             with --tls-cert, call it with https://"
        )
    } else if lower.contains("lookup") || lower.contains("resolve") || lower.contains("dns") {
        format!("the host name does not resolve ({text})")
    } else {
        text
    };
    format!("cannot connect to {url}: {why}")
}
