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
/// The longest host accepted, in bytes (a DNS name has at most 253).
pub const MAX_HOST_BYTES: usize = 253;
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
    #[error("the host is longer than {MAX_HOST_BYTES} bytes")]
    HostTooLong,
    /// Says neither the address a host name resolved to nor which range
    /// holds it: a caller would map internal names with it. `why` is for
    /// the server's log. `range` is given only for an address written in
    /// the URL: the caller knows it already, and the flag that opens it
    /// is what a newcomer trying a local receiver needs.
    #[error(
        "the host {host:?} is refused: not a public address (webhooks reach only public \
         addresses unless the server runs with `serve --push-allow-cidr {}`)",
        range.map_or("RANGE".to_owned(), |r| r.to_string())
    )]
    Refused {
        host: String,
        why: &'static str,
        range: Option<IpNet>,
    },
    #[error("the host {host:?} does not resolve: {reason}")]
    Unresolved { host: String, reason: String },
}

/// A checked webhook target: what a delivery connects to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookTarget {
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
    pub async fn check_url(&self, url: &str) -> Result<WebhookTarget, UrlError> {
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
                    why,
                    range: written_range(&target.host),
                });
            }
        }
        Ok(target)
    }

    /// The addresses a delivery to `target` may connect to, resolved now:
    /// those the policy permits. An error when none is left.
    pub async fn resolve(&self, target: &WebhookTarget) -> Result<Vec<SocketAddr>, UrlError> {
        let addrs = lookup(target).await?;
        let mut first_refused = None;
        let permitted: Vec<SocketAddr> = addrs
            .into_iter()
            .filter(|addr| match self.permits(addr.ip()) {
                Ok(()) => true,
                Err(why) => {
                    first_refused.get_or_insert(why);
                    false
                }
            })
            .collect();
        match (permitted.is_empty(), first_refused) {
            (true, Some(why)) => Err(UrlError::Refused {
                host: target.host.clone(),
                why,
                range: written_range(&target.host),
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
pub fn parse(url: &str) -> Result<WebhookTarget, UrlError> {
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
    if host.len() > MAX_HOST_BYTES {
        return Err(UrlError::HostTooLong);
    }
    let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
    Ok(WebhookTarget { https, host, port })
}

/// The target's addresses: the address itself, or the name resolved.
async fn lookup(target: &WebhookTarget) -> Result<Vec<SocketAddr>, UrlError> {
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

/// What the default policy does with a range of addresses.
#[derive(Clone, Copy, Debug)]
enum Rule {
    /// Refused, for this reason.
    Refuse(&'static str),
    /// Judged as the IPv4 address(es) the IPv6 address carries: NAT64,
    /// 6to4 and Teredo reach an IPv4 host, so they may reach only one a
    /// webhook may reach.
    Embedded(fn(Ipv6Addr) -> Vec<Ipv4Addr>),
}

/// The ranges refused by default (IANA's special-purpose address
/// registries, RFC 6890 and its updates): the one list, as data, each
/// range with a test (`every_listed_range_is_refused`). The most specific
/// range that holds an address decides.
const RANGES: &[(&str, Rule)] = &[
    // IPv4
    ("0.0.0.0/8", Rule::Refuse("unspecified")),
    ("10.0.0.0/8", Rule::Refuse("private")),
    ("100.64.0.0/10", Rule::Refuse("shared address space")),
    ("127.0.0.0/8", Rule::Refuse("loopback")),
    ("169.254.0.0/16", Rule::Refuse("link-local")),
    ("172.16.0.0/12", Rule::Refuse("private")),
    ("192.0.0.0/24", Rule::Refuse("IETF protocol assignments")),
    ("192.0.2.0/24", Rule::Refuse("documentation")),
    ("192.88.99.0/24", Rule::Refuse("6to4 relay")),
    ("192.168.0.0/16", Rule::Refuse("private")),
    ("198.18.0.0/15", Rule::Refuse("benchmarking")),
    ("198.51.100.0/24", Rule::Refuse("documentation")),
    ("203.0.113.0/24", Rule::Refuse("documentation")),
    ("224.0.0.0/4", Rule::Refuse("multicast")),
    ("240.0.0.0/4", Rule::Refuse("reserved")),
    // IPv6 (an IPv4-mapped address, ::ffff:0:0/96, is judged as its IPv4
    // address before this list is read: `IpAddr::to_canonical`).
    ("::/96", Rule::Refuse("IPv4-compatible")),
    ("::/128", Rule::Refuse("unspecified")),
    ("::1/128", Rule::Refuse("loopback")),
    ("64:ff9b::/96", Rule::Embedded(nat64)),
    ("64:ff9b:1::/48", Rule::Refuse("local-use NAT64")),
    ("100::/64", Rule::Refuse("discard-only")),
    ("2001::/32", Rule::Embedded(teredo)),
    ("2001:db8::/32", Rule::Refuse("documentation")),
    ("2002::/16", Rule::Embedded(six_to_four)),
    ("fc00::/7", Rule::Refuse("private")),
    ("fe80::/10", Rule::Refuse("link-local")),
    // Deprecated site-local: private in effect.
    ("fec0::/10", Rule::Refuse("private")),
    ("ff00::/8", Rule::Refuse("multicast")),
];

/// [`RANGES`], parsed, most specific first.
fn ranges() -> &'static [(IpNet, Rule)] {
    static PARSED: std::sync::LazyLock<Vec<(IpNet, Rule)>> = std::sync::LazyLock::new(|| {
        let mut parsed: Vec<(IpNet, Rule)> = RANGES
            .iter()
            // Constant text, parsed by a test of its own.
            .filter_map(|(net, rule)| net.parse().ok().map(|net| (net, *rule)))
            .collect();
        parsed.sort_by_key(|(net, _)| std::cmp::Reverse(net.prefix_len()));
        parsed
    });
    &PARSED
}

fn v4(hi: u16, lo: u16) -> Ipv4Addr {
    Ipv4Addr::from(((hi as u32) << 16) | lo as u32)
}

/// NAT64 (RFC 6052): the IPv4 address in the last 32 bits.
fn nat64(a: Ipv6Addr) -> Vec<Ipv4Addr> {
    let s = a.segments();
    vec![v4(s[6], s[7])]
}

/// 6to4 (RFC 3056): the IPv4 address in bits 16..48.
fn six_to_four(a: Ipv6Addr) -> Vec<Ipv4Addr> {
    let s = a.segments();
    vec![v4(s[1], s[2])]
}

/// Teredo (RFC 4380): the server's IPv4 address in bits 32..64, and the
/// client's, inverted, in the last 32 bits.
fn teredo(a: Ipv6Addr) -> Vec<Ipv4Addr> {
    let s = a.segments();
    vec![v4(s[2], s[3]), v4(!s[6], !s[7])]
}

/// The refused range holding `host`, when `host` is an address (not a
/// name): what `--push-allow-cidr` would have to open.
fn written_range(host: &str) -> Option<IpNet> {
    let addr = host.parse::<IpAddr>().ok()?.to_canonical();
    ranges()
        .iter()
        .find(|(net, _)| net.contains(&addr))
        .map(|(net, _)| *net)
}

/// Why a webhook may not reach `addr` by default, if it may not.
fn refused(addr: IpAddr) -> Option<&'static str> {
    let addr = addr.to_canonical();
    let (_, rule) = ranges().iter().find(|(net, _)| net.contains(&addr))?;
    match *rule {
        Rule::Refuse(why) => Some(why),
        Rule::Embedded(carried) => match addr {
            IpAddr::V6(v6) => carried(v6)
                .into_iter()
                .find_map(|v4| refused(IpAddr::V4(v4))),
            IpAddr::V4(_) => None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// One address inside each listed range, with the reason it is
    /// refused; a range dropped from [`RANGES`] fails here.
    const REFUSED: &[(&str, &str)] = &[
        ("0.1.2.3", "unspecified"),
        ("0.0.0.0", "unspecified"),
        ("10.1.2.3", "private"),
        ("100.64.0.1", "shared address space"),
        ("127.8.9.10", "loopback"),
        ("169.254.169.254", "link-local"),
        ("172.31.255.255", "private"),
        ("192.0.0.8", "IETF protocol assignments"),
        ("192.0.2.1", "documentation"),
        ("192.88.99.1", "6to4 relay"),
        ("192.168.1.1", "private"),
        ("198.19.255.1", "benchmarking"),
        ("198.51.100.7", "documentation"),
        ("203.0.113.9", "documentation"),
        ("224.0.0.1", "multicast"),
        ("240.0.0.1", "reserved"),
        ("255.255.255.255", "reserved"),
        ("::7f00:1", "IPv4-compatible"),
        ("::a9fe:a9fe", "IPv4-compatible"),
        ("::", "unspecified"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:169.254.169.254", "link-local"),
        ("64:ff9b::a9fe:a9fe", "link-local"),
        ("64:ff9b::7f00:1", "loopback"),
        ("64:ff9b:1::808:808", "local-use NAT64"),
        ("100::1", "discard-only"),
        // Teredo: server 10.0.0.1; then client 127.0.0.1 (inverted).
        ("2001:0:a00:1::1", "private"),
        ("2001:0:808:808::80ff:fffe", "loopback"),
        ("2001:db8::1", "documentation"),
        ("2002:a9fe:a9fe::1", "link-local"),
        ("2002:7f00:1::", "loopback"),
        ("fc00::1", "private"),
        ("fd12:3456::1", "private"),
        ("fe80::1", "link-local"),
        ("fec0::1", "private"),
        ("ff02::1", "multicast"),
    ];

    #[test]
    fn every_listed_range_is_refused() {
        assert_eq!(ranges().len(), RANGES.len(), "every range parses");
        let egress = Egress::default();
        for (addr, why) in REFUSED {
            assert_eq!(egress.permits(ip(addr)), Err(*why), "{addr}");
        }
        for (net, _) in RANGES {
            let net: IpNet = net.parse().unwrap();
            assert!(
                REFUSED.iter().any(|(a, _)| net.contains(&ip(a))),
                "{net} has no case in REFUSED"
            );
        }
        for addr in [
            "93.184.215.14",
            "8.8.8.8",
            "172.32.0.1",
            "198.20.0.1",
            "192.0.1.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
            // Teredo with a public server and client (8.8.8.8 inverted).
            "2001:0:808:808::f7f7:f7f7",
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
            WebhookTarget {
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
        let host = format!("https://{}.test/x", "a".repeat(MAX_HOST_BYTES));
        assert_eq!(parse(&host), Err(UrlError::HostTooLong));
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
            let refused = egress.check_url(url).await.unwrap_err();
            assert!(
                matches!(refused, UrlError::Refused { .. }),
                "{url} accepted"
            );
            // For a name the client learns neither the address nor its
            // range; for an address it wrote, the range that opens it.
            let said = refused.to_string();
            assert!(said.contains("is refused: not a public address"), "{said}");
            assert!(said.contains("--push-allow-cidr"), "{said}");
            for hint in ["127.", "::1", "169.254", "loopback", "link-local"] {
                assert!(!said.contains(hint) || url.contains(hint), "{said}");
            }
            let range = match url {
                "http://127.0.0.1/x" => "127.0.0.0/8",
                "http://[::1]/x" => "::1/128",
                "http://169.254.169.254/latest" => "169.254.0.0/16",
                _ => "RANGE",
            };
            assert!(
                said.contains(&format!("--push-allow-cidr {range}`")),
                "{said}"
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
