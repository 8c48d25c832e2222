//! Where a webhook may go: the guard against server-side request forgery.
//!
//! A client chooses a webhook's URL, and the server then POSTs to it from
//! inside the operator's network. By default a webhook may not reach
//! loopback, private (10/8, 172.16/12, 192.168/16, fc00::/7), link-local
//! (169.254/16, fe80::/10, which hold cloud metadata services), shared
//! (100.64/10), multicast, broadcast, unspecified or otherwise reserved
//! addresses, however it names them: an IPv4 address mapped into IPv6 is
//! judged as the IPv4 address. `--push-allow-cidr` opens listed ranges, and
//! only those.
//!
//! The URL is checked when a config is created ([`Egress::check_url`],
//! which resolves a host name and refuses it if any of its addresses is
//! refused; a name that does not resolve then is taken), and every
//! delivery connects only to addresses that pass at connection time
//! ([`Egress::resolve`]), so a name that later resolves elsewhere (DNS
//! rebinding) reaches nothing it should not.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ipnet::IpNet;

/// The longest webhook URL accepted, in bytes.
pub const MAX_URL_BYTES: usize = 2048;
/// How long a host name may take to resolve.
pub const RESOLVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// Host name lookups at once.
pub const MAX_LOOKUPS: usize = 32;

/// Why a webhook URL is refused; the text names what is wrong, for the
/// client's INVALID_ARGUMENT on the `url` field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("the URL is longer than {MAX_URL_BYTES} bytes")]
    TooLong,
    #[error("not an absolute URL: {0}")]
    Malformed(String),
    #[error("only http and https URLs are accepted, not {0:?}")]
    Scheme(String),
    #[error("a URL with user information (user@host) is not accepted")]
    UserInfo,
    #[error("the URL has no host")]
    NoHost,
    #[error("the host {host:?} resolves to {addr}, which webhooks may not reach ({why})")]
    Refused {
        host: String,
        addr: IpAddr,
        why: &'static str,
    },
    #[error("the host {host:?} does not resolve: {reason}")]
    Unresolved { host: String, reason: String },
}

/// A checked webhook target: what a delivery connects to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub https: bool,
    /// The host as written (a name, or an address without brackets).
    pub host: String,
    pub port: u16,
}

/// The webhook address policy: what is refused by default, and the ranges
/// an operator opened (`--push-allow-cidr`).
#[derive(Debug, Clone, Default)]
pub struct Egress {
    allowed: Vec<IpNet>,
}

impl Egress {
    /// The default policy with `allowed` ranges opened.
    pub fn new(allowed: Vec<IpNet>) -> Self {
        Egress { allowed }
    }

    /// Whether a webhook may connect to `addr`; when not, why.
    pub fn permits(&self, addr: IpAddr) -> Result<(), &'static str> {
        let addr = addr.to_canonical();
        if self.allowed.iter().any(|net| net.contains(&addr)) {
            return Ok(());
        }
        match refused(addr) {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }

    /// Parses and checks a webhook URL: `http` or `https`, no user
    /// information, a host, at most [`MAX_URL_BYTES`]. A host name is
    /// resolved and refused if any of its addresses is. A name that does
    /// not resolve now (a DNS failure, a name only the webhook's network
    /// knows) is taken: every delivery resolves it again and connects only
    /// to what [`Egress::resolve`] permits then.
    pub async fn check_url(&self, url: &str) -> Result<Target, UrlError> {
        let target = parse(url)?;
        let addrs = match lookup(&target).await {
            Ok(addrs) => addrs,
            Err(UrlError::Unresolved { .. }) => return Ok(target),
            Err(e) => return Err(e),
        };
        for addr in addrs {
            if let Err(why) = self.permits(addr.ip()) {
                return Err(UrlError::Refused {
                    host: target.host.clone(),
                    addr: addr.ip(),
                    why,
                });
            }
        }
        Ok(target)
    }

    /// The addresses a delivery to `target` may connect to, resolved now:
    /// those the policy permits. An error when none is left.
    pub async fn resolve(&self, target: &Target) -> Result<Vec<SocketAddr>, UrlError> {
        let addrs = lookup(target).await?;
        let mut first_refused = None;
        let permitted: Vec<SocketAddr> = addrs
            .into_iter()
            .filter(|addr| match self.permits(addr.ip()) {
                Ok(()) => true,
                Err(why) => {
                    first_refused.get_or_insert((addr.ip(), why));
                    false
                }
            })
            .collect();
        match (permitted.is_empty(), first_refused) {
            (true, Some((addr, why))) => Err(UrlError::Refused {
                host: target.host.clone(),
                addr,
                why,
            }),
            (true, None) => Err(UrlError::Unresolved {
                host: target.host.clone(),
                reason: "no address".into(),
            }),
            (false, _) => Ok(permitted),
        }
    }
}

/// Parses a webhook URL (no resolution).
pub fn parse(url: &str) -> Result<Target, UrlError> {
    if url.len() > MAX_URL_BYTES {
        return Err(UrlError::TooLong);
    }
    let uri: http::Uri = url
        .parse()
        .map_err(|e: http::uri::InvalidUri| UrlError::Malformed(e.to_string()))?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        Some(other) => return Err(UrlError::Scheme(other.to_owned())),
        None => return Err(UrlError::Malformed("no scheme".into())),
    };
    let authority = uri.authority().ok_or(UrlError::NoHost)?;
    if authority.as_str().contains('@') {
        return Err(UrlError::UserInfo);
    }
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    if host.is_empty() {
        return Err(UrlError::NoHost);
    }
    let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
    Ok(Target { https, host, port })
}

/// The target's addresses: the address itself, or the name resolved.
async fn lookup(target: &Target) -> Result<Vec<SocketAddr>, UrlError> {
    if let Ok(ip) = target.host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, target.port)]);
    }
    let unresolved = |reason: String| UrlError::Unresolved {
        host: target.host.clone(),
        reason,
    };
    // The system resolver blocks a thread of the runtime's blocking pool
    // (which the SQLite store reads on too) per lookup, and a timed-out
    // lookup keeps it: at most MAX_LOOKUPS at once.
    static LOOKUPS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(MAX_LOOKUPS);
    let lookup = async {
        let _permit = LOOKUPS.acquire().await;
        tokio::net::lookup_host((target.host.as_str(), target.port)).await
    };
    let addrs: Vec<SocketAddr> = tokio::time::timeout(RESOLVE_TIMEOUT, lookup)
        .await
        .map_err(|_| unresolved(format!("no answer within {RESOLVE_TIMEOUT:?}")))?
        .map_err(|e| unresolved(e.to_string()))?
        .collect();
    if addrs.is_empty() {
        return Err(unresolved("no address".into()));
    }
    Ok(addrs)
}

/// Why a webhook may not reach `addr` by default, if it may not.
fn refused(addr: IpAddr) -> Option<&'static str> {
    match addr {
        IpAddr::V4(v4) => refused_v4(v4),
        IpAddr::V6(v6) => refused_v6(v6),
    }
}

fn refused_v4(a: Ipv4Addr) -> Option<&'static str> {
    let [first, second, ..] = a.octets();
    Some(if a.is_loopback() {
        "loopback"
    } else if a.is_private() {
        "private"
    } else if a.is_link_local() {
        "link-local"
    } else if a.is_multicast() {
        "multicast"
    } else if a.is_broadcast() {
        "broadcast"
    } else if first == 0 {
        // 0.0.0.0/8: "this network"; 0.0.0.0 reaches the host itself.
        "unspecified"
    } else if first == 100 && (64..128).contains(&second) {
        "shared address space"
    } else if first >= 240 {
        "reserved"
    } else {
        return None;
    })
}

fn refused_v6(a: Ipv6Addr) -> Option<&'static str> {
    let first = a.segments()[0];
    Some(if a.is_loopback() {
        "loopback"
    } else if a.is_unspecified() {
        "unspecified"
    } else if a.is_multicast() {
        "multicast"
    } else if (first & 0xfe00) == 0xfc00 {
        "private"
    } else if (first & 0xffc0) == 0xfe80 {
        "link-local"
    } else if (first & 0xffc0) == 0xfec0 {
        // Deprecated site-local: private in effect.
        "private"
    } else if a.segments()[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        // NAT64: judged as the IPv4 address it carries.
        let [.., a, b] = a.segments();
        return refused_v4(Ipv4Addr::new(
            (a >> 8) as u8,
            a as u8,
            (b >> 8) as u8,
            b as u8,
        ));
    } else {
        return None;
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn internal_addresses_are_refused_by_default() {
        let egress = Egress::default();
        for addr in [
            "127.0.0.1",
            "127.8.9.10",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "0.1.2.3",
            "224.0.0.1",
            "255.255.255.255",
            "240.0.0.1",
            "::1",
            "::",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
        ] {
            assert!(egress.permits(ip(addr)).is_err(), "{addr} permitted");
        }
        for addr in [
            "93.184.215.14",
            "8.8.8.8",
            "172.32.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            assert_eq!(egress.permits(ip(addr)), Ok(()), "{addr} refused");
        }
    }

    #[test]
    fn only_the_allowed_ranges_open() {
        let egress = Egress::new(vec![
            "127.0.0.0/8".parse().unwrap(),
            "fd00::/8".parse().unwrap(),
        ]);
        assert_eq!(egress.permits(ip("127.0.0.1")), Ok(()));
        assert_eq!(egress.permits(ip("::ffff:127.0.0.1")), Ok(()));
        assert_eq!(egress.permits(ip("fd00::5")), Ok(()));
        assert!(egress.permits(ip("::1")).is_err());
        assert!(egress.permits(ip("10.0.0.1")).is_err());
        assert!(egress.permits(ip("169.254.169.254")).is_err());
    }

    #[test]
    fn urls_are_http_or_https_with_a_host_and_no_user_information() {
        assert_eq!(
            parse("https://hooks.example.test/a2a").unwrap(),
            Target {
                https: true,
                host: "hooks.example.test".into(),
                port: 443
            }
        );
        assert_eq!(parse("http://[::1]:8080/x").unwrap().host, "::1");
        assert_eq!(parse("http://h:81").unwrap().port, 81);
        assert!(matches!(parse("ftp://h/x"), Err(UrlError::Scheme(_))));
        assert!(parse("file:///etc/passwd").is_err());
        assert!(matches!(
            parse("https://user:pw@h/x"),
            Err(UrlError::UserInfo)
        ));
        assert!(matches!(parse("https://user@h/x"), Err(UrlError::UserInfo)));
        assert!(matches!(parse("/relative"), Err(UrlError::Malformed(_))));
        assert!(matches!(parse("not a url"), Err(UrlError::Malformed(_))));
        let long = format!("https://h/{}", "a".repeat(MAX_URL_BYTES));
        assert_eq!(parse(&long), Err(UrlError::TooLong));
    }

    #[tokio::test]
    async fn names_are_judged_by_what_they_resolve_to() {
        let egress = Egress::default();
        for url in [
            "http://localhost:9/x",
            "http://127.0.0.1/x",
            "http://[::1]/x",
            "http://169.254.169.254/latest",
        ] {
            assert!(
                matches!(egress.check_url(url).await, Err(UrlError::Refused { .. })),
                "{url} accepted"
            );
        }
        let open = Egress::new(vec![
            "127.0.0.0/8".parse().unwrap(),
            "::1/128".parse().unwrap(),
        ]);
        assert!(open.check_url("http://localhost:9/x").await.is_ok());
        let target = parse("http://localhost:9/x").unwrap();
        assert!(egress.resolve(&target).await.is_err());
        let addrs = open.resolve(&target).await.unwrap();
        assert!(addrs.iter().all(|a| a.ip().is_loopback()), "{addrs:?}");
        // Taken when created, and judged at each connection.
        let unknown = egress
            .check_url("http://no-such-host.invalid/x")
            .await
            .unwrap();
        assert!(matches!(
            egress.resolve(&unknown).await,
            Err(UrlError::Unresolved { .. })
        ));
    }
}
