//! TLS to PostgreSQL: how the store's connections are made. This module
//! owns reading a store URL's TLS settings (libpq's `sslmode` and
//! `sslrootcert`), the rustls client configuration and certificate check
//! they call for, and [`Connector`], which every connection of the store
//! (the pool's, the listening one, any other) is made with.
//!
//! The modes mean what they mean to libpq:
//!
//! | `sslmode` | encrypted | certificate checked |
//! | --- | --- | --- |
//! | `disable` | no | - |
//! | `allow`, `prefer` (the default) | when the server offers TLS | no |
//! | `require` | yes, or no connection | no; as `verify-ca` when `sslrootcert` is given |
//! | `verify-ca` | yes | chain to a CA in `sslrootcert` |
//! | `verify-full` | yes | chain, and the host name (or IP address) in the certificate |
//!
//! `allow` is taken as `prefer` (libpq tries plaintext first; both end
//! encrypted or not as the server decides). `verify-ca` and `verify-full`
//! need `sslrootcert=PATH` (PEM CA certificates), read once at open:
//! libpq's fallback, `~/.postgresql/root.crt`, depends on the home of
//! whoever runs the server, so a missing `sslrootcert` is an error that
//! says so rather than a file looked for in a place nobody chose.
//!
//! tokio-postgres's own URL parser knows only `disable`, `prefer` and
//! `require` (and no `sslrootcert`), so both are taken out of the URL
//! before it parses the rest, and tokio-postgres is told `require` for
//! the verifying modes: it then insists on TLS, and the check itself is
//! this module's, in the rustls handshake.
//!
//! TLS is rustls with the `ring` provider, as everywhere else in this
//! crate (no OpenSSL, no C crypto library to build), through
//! `tokio-postgres-rustls` (it also gives SCRAM its channel binding),
//! wrapped ([`ExplainedTls`]) so that a refused certificate is reported with the
//! settings that refused it.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use deadpool_postgres::{Manager, ManagerConfig};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{verify_server_cert_signed_by_trust_anchor, verify_server_name};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_postgres::config::SslMode as WireMode;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::store::StoreError;

/// What a connection of the store is carried over once TLS is settled
/// (encrypted or not, as the mode and the server decided).
pub(super) type StoreStream = <ExplainedTls as MakeTlsConnect<tokio_postgres::Socket>>::Stream;

/// Makes the store's connections: the URL's settings and the TLS they
/// call for. Cheap to clone.
#[derive(Clone)]
pub(super) struct Connector {
    config: tokio_postgres::Config,
    tls: ExplainedTls,
}

impl Connector {
    /// The connector for a store URL (`postgres://USER@HOST:PORT/DB?...`).
    /// A bad `sslmode` or an unreadable `sslrootcert` is an error here, at
    /// open, never at a later connection; no error repeats the URL (it
    /// may hold a password).
    pub(super) fn from_url(url: &str) -> Result<Connector, StoreError> {
        let (rest, settings) = take_tls_settings(url)?;
        let mut config: tokio_postgres::Config = rest
            .parse()
            .map_err(|e| StoreError::Internal(format!("bad PostgreSQL URL: {e}")))?;
        // Not in the URL: whatever tokio-postgres read (a key=value
        // string's own `sslmode`, or its default, prefer).
        let mode = match settings.mode {
            Some(mode) => mode,
            None => match config.get_ssl_mode() {
                WireMode::Disable => SslMode::Disable,
                WireMode::Prefer => SslMode::Prefer,
                _ => SslMode::Require,
            },
        };
        config.ssl_mode(mode.wire());
        let root_cert = settings.root_cert.as_deref();
        let tls = ExplainedTls {
            inner: MakeRustlsConnect::new(client_config(mode, root_cert)?),
            described: match root_cert {
                Some(path) => format!("sslmode={}, sslrootcert {}", mode.name(), path.display()),
                None => format!("sslmode={}", mode.name()),
            }
            .into(),
        };
        Ok(Connector { config, tls })
    }

    /// One more connection with the store's settings. The connection half
    /// must be polled (spawned) for the client to work.
    pub(super) async fn connect(
        &self,
    ) -> Result<
        (
            tokio_postgres::Client,
            tokio_postgres::Connection<tokio_postgres::Socket, StoreStream>,
        ),
        tokio_postgres::Error,
    > {
        self.config.connect(self.tls.clone()).await
    }

    /// A deadpool manager making the pool's connections the same way.
    pub(super) fn manager(&self, manager: ManagerConfig) -> Manager {
        Manager::from_config(self.config.clone(), self.tls.clone(), manager)
    }
}

/// tokio-postgres-rustls's connector, its handshake errors explained:
/// rustls reports a refused certificate as, say, "invalid peer
/// certificate: UnknownIssuer", which says neither that the store's TLS
/// settings refused it nor which.
#[derive(Clone)]
pub(super) struct ExplainedTls {
    inner: MakeRustlsConnect,
    /// The mode and root file, as an error names them.
    described: Arc<str>,
}

impl<S> MakeTlsConnect<S> for ExplainedTls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = <MakeRustlsConnect as MakeTlsConnect<S>>::Stream;
    type TlsConnect = ExplainedHandshake<<MakeRustlsConnect as MakeTlsConnect<S>>::TlsConnect>;
    type Error = <MakeRustlsConnect as MakeTlsConnect<S>>::Error;

    fn make_tls_connect(&mut self, hostname: &str) -> Result<Self::TlsConnect, Self::Error> {
        Ok(ExplainedHandshake {
            inner: MakeTlsConnect::<S>::make_tls_connect(&mut self.inner, hostname)?,
            described: self.described.clone(),
        })
    }
}

/// One connection's TLS handshake ([`ExplainedTls`]).
pub(super) struct ExplainedHandshake<T> {
    inner: T,
    described: Arc<str>,
}

impl<S, T> TlsConnect<S> for ExplainedHandshake<T>
where
    T: TlsConnect<S, Error = io::Error>,
    T::Future: Send + 'static,
{
    type Stream = T::Stream;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<T::Stream>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        let handshake = self.inner.connect(stream);
        let described = self.described;
        Box::pin(async move { handshake.await.map_err(|e| explained(e, &described)) })
    }
}

/// A failed handshake's error, saying whether the server's certificate
/// was refused and under which settings. (tokio-rustls passes rustls's
/// error inside the `io::Error`.)
fn explained(e: io::Error, described: &str) -> io::Error {
    let refused = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .and_then(|tls| match tls {
            rustls::Error::InvalidCertificate(why) => Some(why.clone()),
            _ => None,
        });
    let failed = format!("the PostgreSQL server's certificate failed verification ({described})");
    let text = match refused {
        Some(CertificateError::UnknownIssuer) => {
            format!("{failed}: it is not signed by a CA in sslrootcert (UnknownIssuer)")
        }
        Some(why) => format!("{failed}: {why}"),
        None => format!("TLS with the PostgreSQL server failed ({described}): {e}"),
    };
    io::Error::new(e.kind(), text)
}

/// libpq's `sslmode` values (`allow` is read as `Prefer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Result<SslMode, StoreError> {
        Ok(match value {
            "disable" => SslMode::Disable,
            "allow" | "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(StoreError::Internal(format!(
                    "the PostgreSQL URL's sslmode={other:?} is not one of disable, allow, \
                     prefer, require, verify-ca, verify-full"
                )));
            }
        })
    }

    fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// What tokio-postgres is told: whether to ask for TLS and whether to
    /// give up without it.
    fn wire(self) -> WireMode {
        match self {
            SslMode::Disable => WireMode::Disable,
            SslMode::Prefer => WireMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => WireMode::Require,
        }
    }
}

/// The TLS settings taken out of a URL.
#[derive(Debug, Default, PartialEq)]
struct TlsSettings {
    mode: Option<SslMode>,
    root_cert: Option<PathBuf>,
}

/// Splits `sslmode` and `sslrootcert` off a `postgres://` URL's query:
/// the URL without them, and their values. Anything but a URL is handed
/// back as it is. The query is found where tokio-postgres finds it (the
/// first `?` after the user information, which ends at the first `@`), so
/// both read the same URL the same way.
fn take_tls_settings(url: &str) -> Result<(String, TlsSettings), StoreError> {
    let mut settings = TlsSettings::default();
    let Some(scheme) = ["postgres://", "postgresql://"]
        .into_iter()
        .find(|s| url.starts_with(s))
    else {
        return Ok((url.to_owned(), settings));
    };
    let after_user = url[scheme.len()..]
        .find('@')
        .map_or(scheme.len(), |at| scheme.len() + at + 1);
    let Some(query) = url[after_user..].find('?').map(|q| after_user + q) else {
        return Ok((url.to_owned(), settings));
    };
    let mut kept = Vec::new();
    for pair in url[query + 1..].split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match percent_decoded(key).as_deref() {
            Some("sslmode") => {
                let value = percent_decoded(value).ok_or_else(|| {
                    StoreError::Internal("the PostgreSQL URL's sslmode is not UTF-8".into())
                })?;
                settings.mode = Some(SslMode::parse(&value)?);
            }
            Some("sslrootcert") => {
                let value = percent_decoded(value).ok_or_else(|| {
                    StoreError::Internal("the PostgreSQL URL's sslrootcert is not UTF-8".into())
                })?;
                settings.root_cert = Some(PathBuf::from(value));
            }
            // Everything else (a bad pair included) is tokio-postgres's.
            _ => kept.push(pair),
        }
    }
    let mut rest = url[..query].to_owned();
    if !kept.is_empty() {
        rest.push('?');
        rest.push_str(&kept.join("&"));
    }
    Ok((rest, settings))
}

/// `%XX` escapes decoded (as tokio-postgres decodes its URL parts); `None`
/// when the result is not UTF-8. A `%` without two hex digits is kept.
fn percent_decoded(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h)? * 16 + hex(l)?) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// The rustls configuration for `mode`, checking the server's certificate
/// against the CA certificates in `root_cert` where the mode says to.
fn client_config(
    mode: SslMode,
    root_cert: Option<&Path>,
) -> Result<rustls::ClientConfig, StoreError> {
    let check = match (mode, root_cert) {
        (SslMode::VerifyFull, Some(_)) => Check::ChainAndName,
        // libpq: require with a root certificate file behaves as verify-ca.
        (SslMode::VerifyCa | SslMode::Require, Some(_)) => Check::Chain,
        (SslMode::VerifyCa | SslMode::VerifyFull, None) => {
            return Err(StoreError::Internal(format!(
                "the PostgreSQL URL's sslmode={} needs sslrootcert=PATH, a PEM file of the \
                 CA certificates the server's certificate is checked against",
                mode.name()
            )));
        }
        // disable and prefer check nothing (libpq's prefer does not
        // either); a root file given with them is still read, so a wrong
        // path is found now and not when the mode is raised.
        _ => Check::Nothing,
    };
    let roots = match root_cert {
        Some(path) => roots(path)?,
        None => RootCertStore::empty(),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = Verifier {
        check,
        roots,
        algorithms: provider.signature_verification_algorithms,
    };
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::Internal(format!("PostgreSQL TLS: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    // PostgreSQL 17's direct TLS (`sslnegotiation=direct`, which
    // tokio-postgres accepts in the URL) requires this ALPN protocol; a
    // server negotiating the usual way ignores it.
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    Ok(config)
}

/// The CA certificates in the PEM file at `path`.
fn roots(path: &Path) -> Result<RootCertStore, StoreError> {
    let shown = path.display();
    let pem = std::fs::read(path).map_err(|e| {
        StoreError::Internal(format!(
            "the PostgreSQL URL's sslrootcert {shown} cannot be read ({e}); \
             expected a PEM file of CA certificates"
        ))
    })?;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| {
            StoreError::Internal(format!(
                "the PostgreSQL URL's sslrootcert {shown} is not a PEM file of certificates ({e})"
            ))
        })?;
        roots.add(cert).map_err(|e| {
            StoreError::Internal(format!(
                "the PostgreSQL URL's sslrootcert {shown} holds a certificate that cannot be \
                 a CA ({e})"
            ))
        })?;
    }
    if roots.is_empty() {
        return Err(StoreError::Internal(format!(
            "the PostgreSQL URL's sslrootcert {shown} holds no certificate; expected a PEM \
             file of CA certificates"
        )));
    }
    Ok(roots)
}

/// How much of the server's certificate is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Check {
    /// Nothing (libpq's prefer and require): encrypted against a passive
    /// listener only.
    Nothing,
    /// Signed, through the chain the server sent, by a CA in the root
    /// file, and valid now (verify-ca).
    Chain,
    /// That, and issued for the host the URL names (verify-full).
    ChainAndName,
}

/// The server certificate check for the store's mode. The handshake's own
/// signatures are checked in every mode: only the certificate's standing
/// is what the weaker modes leave unchecked.
#[derive(Debug)]
struct Verifier {
    check: Check,
    roots: RootCertStore,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if self.check == Check::Nothing {
            return Ok(ServerCertVerified::assertion());
        }
        let cert = ParsedCertificate::try_from(end_entity)?;
        verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.algorithms.all,
        )?;
        if self.check == Check::ChainAndName {
            verify_server_name(&cert, server_name)?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(url: &str) -> (String, TlsSettings) {
        take_tls_settings(url).expect("a URL this module accepts")
    }

    #[test]
    fn tls_settings_leave_the_url_and_the_rest_of_its_query() {
        let (rest, settings) = split(
            "postgres://u:p%3Fw@h:5432/db?application_name=a&sslmode=verify-full\
             &sslrootcert=%2Ftmp%2Fmy%20ca.pem&options=-csearch_path%3Ds",
        );
        assert_eq!(
            rest,
            "postgres://u:p%3Fw@h:5432/db?application_name=a&options=-csearch_path%3Ds"
        );
        assert_eq!(settings.mode, Some(SslMode::VerifyFull));
        assert_eq!(settings.root_cert, Some(PathBuf::from("/tmp/my ca.pem")));
    }

    #[test]
    fn a_query_of_tls_settings_alone_leaves_no_query() {
        let (rest, settings) = split("postgresql://h/db?sslmode=disable");
        assert_eq!(rest, "postgresql://h/db");
        assert_eq!(settings.mode, Some(SslMode::Disable));
        assert_eq!(settings.root_cert, None);
    }

    #[test]
    fn a_question_mark_in_the_password_is_not_the_query() {
        // tokio-postgres reads the user information up to the first `@`.
        let (rest, settings) = split("postgres://u:a?sslmode=disable@h/db?sslmode=require");
        assert_eq!(rest, "postgres://u:a?sslmode=disable@h/db");
        assert_eq!(settings.mode, Some(SslMode::Require));
    }

    #[test]
    fn allow_is_prefer_and_no_sslmode_is_none() {
        assert_eq!(
            split("postgres://h/db?sslmode=allow").1.mode,
            Some(SslMode::Prefer)
        );
        assert_eq!(split("postgres://h/db").1, TlsSettings::default());
        assert_eq!(split("host=h sslmode=require").0, "host=h sslmode=require");
    }

    #[test]
    fn an_unknown_sslmode_is_an_error_naming_it_and_not_the_password() {
        let Err(StoreError::Internal(text)) =
            take_tls_settings("postgres://u:secret@h/db?sslmode=verify_full")
        else {
            panic!("verify_full accepted");
        };
        assert!(text.contains("\"verify_full\""), "{text}");
        assert!(text.contains("verify-full"), "{text}");
        assert!(!text.contains("secret"), "{text}");
    }

    #[test]
    fn verifying_modes_need_a_root_file() {
        for url in [
            "postgres://u:secret@h/db?sslmode=verify-ca",
            "postgres://u:secret@h/db?sslmode=verify-full",
        ] {
            let Err(StoreError::Internal(text)) = Connector::from_url(url) else {
                panic!("{url}: accepted without sslrootcert");
            };
            assert!(text.contains("needs sslrootcert"), "{text}");
            assert!(!text.contains("secret"), "{text}");
        }
    }

    #[test]
    fn an_unreadable_root_file_is_an_error_naming_it() {
        let Err(StoreError::Internal(text)) = Connector::from_url(
            "postgres://h/db?sslmode=require&sslrootcert=/nonexistent/a2a-ca.pem",
        ) else {
            panic!("a missing sslrootcert accepted");
        };
        assert!(text.contains("/nonexistent/a2a-ca.pem"), "{text}");
        assert!(text.contains("cannot be read"), "{text}");
    }

    #[test]
    fn modes_reach_tokio_postgres_as_it_knows_them() {
        let mode = |url: &str| Connector::from_url(url).unwrap().config.get_ssl_mode();
        assert_eq!(mode("postgres://h/db"), WireMode::Prefer);
        assert_eq!(mode("postgres://h/db?sslmode=disable"), WireMode::Disable);
        assert_eq!(mode("postgres://h/db?sslmode=require"), WireMode::Require);
        assert_eq!(mode("host=h sslmode=disable"), WireMode::Disable);
    }
}
