//! TLS on the port: the server's certificate, reloaded on SIGHUP, and
//! the verified client certificate's name (mutual TLS).

use std::sync::Arc;

use super::conn::Conn;

/// TLS on the port (`--tls-cert`, `--tls-key`): rustls, so TLS 1.2 and 1.3
/// only (older versions are not implemented at all), with ALPN offering
/// HTTP/2 and HTTP/1.1 so gRPC and the cards share the port as in plain
/// text. With `--tls-client-ca`, client certificates are verified against
/// that CA (mutual TLS) and name their principal ([`ClientCertificate`]).
///
/// [`Tls::reload`] reads the files again (SIGHUP: certificate rotation):
/// each new connection takes the configuration current when it arrives,
/// and connections already open keep theirs.
pub struct Tls {
    config: std::sync::RwLock<Arc<rustls::ServerConfig>>,
    files: Option<TlsFiles>,
    clients: ClientCerts,
}

/// Where [`Tls`] reads its certificate, key and client CA from.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    /// `--tls-client-ca`: mutual TLS.
    pub client_ca: Option<std::path::PathBuf>,
}

/// Whether clients present certificates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientCerts {
    /// No client certificates are asked for.
    None,
    /// Asked for and verified when sent; a client may authenticate by a
    /// bearer credential instead (mutual TLS beside `--auth`).
    Optional,
    /// A connection without a verified client certificate fails its
    /// handshake (mutual TLS as the only authentication).
    Required,
}

/// The principal name of the verified client certificate a request came
/// with: the certificate's subject common name, else its first DNS
/// subject alternative name. Put in the request's extensions; absent when
/// the client sent no certificate or one naming nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCertificate {
    pub name: String,
}

impl Tls {
    /// A certificate chain and its private key, both PEM files, and a
    /// client CA for mutual TLS (`clients` is then Optional or Required).
    pub fn from_files(files: TlsFiles, clients: ClientCerts) -> Result<Self, String> {
        let config = Self::load(&files, clients)?;
        Ok(Tls {
            config: std::sync::RwLock::new(config),
            files: Some(files),
            clients,
        })
    }

    /// A certificate chain and its private key, PEM; no client
    /// certificates.
    pub fn from_pem(cert: &[u8], key: &[u8]) -> Result<Self, String> {
        Ok(Tls {
            config: std::sync::RwLock::new(server_config(cert, key, None, ClientCerts::None)?),
            files: None,
            clients: ClientCerts::None,
        })
    }

    /// Reads the files again and makes them the configuration of new
    /// connections; on an error the one in force stays. `Ok(false)` when
    /// there are no files to read.
    pub fn reload(&self) -> Result<bool, String> {
        let Some(files) = &self.files else {
            return Ok(false);
        };
        let config = Self::load(files, self.clients)?;
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = config;
        Ok(true)
    }

    /// Whether client certificates are asked for (the cards then declare
    /// the mutual TLS scheme).
    pub fn client_certs(&self) -> ClientCerts {
        self.clients
    }

    fn load(files: &TlsFiles, clients: ClientCerts) -> Result<Arc<rustls::ServerConfig>, String> {
        let read = |path: &std::path::Path| {
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
        };
        let ca = files.client_ca.as_deref().map(read).transpose()?;
        server_config(
            &read(&files.cert)?,
            &read(&files.key)?,
            ca.as_deref(),
            clients,
        )
        .map_err(|e| format!("{} / {}: {e}", files.cert.display(), files.key.display()))
    }

    pub(super) fn accept(&self, conn: Conn) -> tokio_rustls::Accept<Conn> {
        let config = self
            .config
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        tokio_rustls::TlsAcceptor::from(config).accept(conn)
    }
}

/// The rustls configuration of [`Tls`].
fn server_config(
    cert: &[u8],
    key: &[u8],
    client_ca: Option<&[u8]>,
    clients: ClientCerts,
) -> Result<Arc<rustls::ServerConfig>, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("certificate: {e}"))?;
    if chain.is_empty() {
        return Err("no certificate in the certificate file".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("private key: {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| e.to_string())?;
    let builder = match (clients, client_ca) {
        (ClientCerts::None, _) => builder.with_no_client_auth(),
        (_, None) => return Err("mutual TLS needs a client CA (--tls-client-ca)".into()),
        (clients, Some(ca)) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca) {
                let cert = cert.map_err(|e| format!("client CA: {e}"))?;
                roots.add(cert).map_err(|e| format!("client CA: {e}"))?;
            }
            if roots.is_empty() {
                return Err("no certificate in the client CA file".into());
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            );
            let verifier = match clients {
                ClientCerts::Optional => verifier.allow_unauthenticated(),
                _ => verifier,
            };
            builder
                .with_client_cert_verifier(verifier.build().map_err(|e| format!("client CA: {e}"))?)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("certificate and key: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The principal name a verified client certificate carries: its subject
/// common name, else its first DNS subject alternative name. Only the
/// first common name counts, and one that is not text (or is empty) names
/// nothing rather than letting a later field speak for the certificate.
pub(super) fn certificate_name(der: &[u8]) -> Option<String> {
    use x509_parser::extensions::GeneralName;
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    if let Some(cn) = cert.subject().iter_common_name().next() {
        return cn
            .as_str()
            .ok()
            .filter(|cn| !cn.is_empty())
            .map(str::to_owned);
    }
    let san = cert.subject_alternative_name().ok()??;
    san.value.general_names.iter().find_map(|name| match name {
        GeneralName::DNSName(dns) if !dns.is_empty() => Some((*dns).to_owned()),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The subject's first common name, else the first DNS name; a
    /// certificate naming neither names nothing.
    #[test]
    fn a_certificate_is_named_by_its_first_common_name_or_dns_name() {
        use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair};
        let name = |cns: &[&str], dns: &[&str]| {
            let mut params =
                CertificateParams::new(dns.iter().map(|d| d.to_string()).collect::<Vec<_>>())
                    .unwrap();
            params.distinguished_name = DistinguishedName::new();
            for cn in cns {
                params.distinguished_name.push(DnType::CommonName, *cn);
            }
            let cert = params.self_signed(&KeyPair::generate().unwrap()).unwrap();
            certificate_name(cert.der())
        };
        assert_eq!(
            name(&["alice"], &["bob.example.test"]).as_deref(),
            Some("alice")
        );
        assert_eq!(
            name(&[], &["bob.example.test", "c.example.test"]).as_deref(),
            Some("bob.example.test")
        );
        assert_eq!(name(&[], &[]), None);
        assert_eq!(certificate_name(b"not a certificate"), None);
    }
}
