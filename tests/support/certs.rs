//! Test certificates made on the fly (rcgen): a CA, server certificates
//! for localhost, client certificates naming a principal; and writing
//! them where the command line reads files.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use std::sync::Arc;

use a2a_lifecycle::agent::demo::demo_router;
use a2a_lifecycle::auth::Authenticator;
use a2a_lifecycle::connections::{ClientCerts, Tls, TlsFiles};
use a2a_lifecycle::runtime::{RuntimeConfig, TaskManager};
use a2a_lifecycle::server::{Security, Server};
use a2a_lifecycle::store::MemoryStore;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

/// A certificate chain and its key, PEM.
#[derive(Clone)]
pub struct Pair {
    pub chain: String,
    pub key: String,
}

pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    pub fn new() -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "a2a-lifecycle test CA");
        Ca {
            issuer: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap(),
        }
    }

    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A server certificate for localhost and 127.0.0.1.
    pub fn server(&self) -> Pair {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .unwrap()
            .signed_by(&key, &self.issuer)
            .unwrap();
        Pair {
            chain: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    /// A client certificate with subject common name `cn` (if any) and
    /// these DNS names.
    pub fn client(&self, cn: Option<&str>, dns: &[&str]) -> Pair {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(dns.iter().map(|d| d.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        if let Some(cn) = cn {
            params.distinguished_name.push(DnType::CommonName, cn);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Pair {
            chain: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

/// A channel to `https://localhost:port` trusting `ca`, presenting
/// `client` when given. Err when the handshake fails.
pub async fn channel(
    port: u16,
    ca: &str,
    client: Option<&Pair>,
) -> Result<Channel, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
    if let Some(pair) = client {
        tls = tls.identity(Identity::from_pem(&pair.chain, &pair.key));
    }
    super::within(
        "TLS connect",
        Channel::from_shared(format!("https://localhost:{port}"))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect(),
    )
    .await
}

/// A fresh directory under the test target dir.
pub fn scratch_dir(what: &str) -> std::path::PathBuf {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(what)
        .join(uuid::Uuid::new_v4().to_string());
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A server over TLS on an ephemeral port, with the demo agents.
pub struct TlsServer {
    pub port: u16,
    stop: oneshot::Sender<()>,
    served: tokio::task::JoinHandle<()>,
}

impl TlsServer {
    pub async fn stop(self) {
        let _ = self.stop.send(());
        super::within("shutdown", self.served).await.unwrap();
    }
}

/// Writes `server`'s certificate and key and `ca` (as the client CA, when
/// clients are asked for certificates) to files and serves over TLS from
/// them, asking clients for certificates as `clients` says.
pub async fn serve_tls(
    ca: &Ca,
    server: &Pair,
    clients: ClientCerts,
    auth: Option<Arc<Authenticator>>,
) -> TlsServer {
    serve_tls_with(ca, server, clients, auth, None).await
}

/// [`serve_tls`], with push notifications on when `push` is given.
pub async fn serve_tls_with(
    ca: &Ca,
    server: &Pair,
    clients: ClientCerts,
    auth: Option<Arc<Authenticator>>,
    push: Option<a2a_lifecycle::push::deliver::Settings>,
) -> TlsServer {
    let dir = scratch_dir("tls-server");
    std::fs::write(dir.join("chain.pem"), &server.chain).unwrap();
    std::fs::write(dir.join("key.pem"), &server.key).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    let files = TlsFiles {
        cert: dir.join("chain.pem"),
        key: dir.join("key.pem"),
        client_ca: (clients != ClientCerts::None).then(|| dir.join("ca.pem")),
    };
    let tls = Arc::new(Tls::from_files(files, clients).unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let manager = TaskManager::new(
        Arc::new(MemoryStore::new()),
        demo_router(),
        RuntimeConfig::default(),
    );
    let (stop, stopped) = oneshot::channel::<()>();
    let served = tokio::spawn(async move {
        let security = Security {
            auth,
            tls: Some(tls),
        };
        Server::new(manager)
            .security(security)
            .push(push)
            .serve(listener, async {
                let _ = stopped.await;
            })
            .await
            .expect("server failed");
    });
    TlsServer { port, stop, served }
}
