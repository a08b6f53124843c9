//! The hosts a confined agent may reach: its preset's model API, the base URL the user
//! configured, and what the settings add. Everything else is refused by the egress proxy.
//!
//! An entry is `host`, `host:port`, `*.domain` or `*.domain:port`; an IPv6 address is
//! written in brackets (`[::1]:8080`). Without a port an entry allows 443 only: a plain
//! `http://` host names its port. Names compare without case and without a trailing dot.

use std::fmt;

/// One allowed host (or domain) and port.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct HostPort {
    /// Lowercase, without brackets or a trailing dot; `*.` leads a domain pattern.
    host: String,
    port: u16,
}

/// Why an allowlist entry was not understood.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("`{entry}` is not a host to allow ({why}); write host, host:port or *.domain")]
pub struct BadHost {
    entry: String,
    why: &'static str,
}

impl HostPort {
    /// Parses an allowlist entry.
    pub fn parse(entry: &str) -> Result<HostPort, BadHost> {
        let bad = |why| BadHost { entry: entry.to_string(), why };
        let text = entry.trim();
        let (host, port) = split_port(text).ok_or_else(|| bad("its port is not a number from 1 to 65535"))?;
        let host = normalise(host);
        let name = host.strip_prefix("*.").unwrap_or(&host);
        if name.is_empty() || name.contains('*') {
            return Err(bad("a wildcard may only lead a domain, as in *.example.com"));
        }
        if name.contains(['/', '@', ' ', '?', '#']) {
            return Err(bad("it looks like a URL or path; write only the host"));
        }
        Ok(HostPort { host, port: port.unwrap_or(443) })
    }

    /// The host and port of a base URL (`http://127.0.0.1:8080/v1`), its scheme's port when
    /// it names none. None for what is not an http(s) URL.
    pub fn of_url(url: &str) -> Option<HostPort> {
        let u = url::Url::parse(url.trim()).ok()?;
        if !matches!(u.scheme(), "http" | "https") {
            return None;
        }
        let host = match u.host()? {
            url::Host::Domain(d) => d.to_string(),
            url::Host::Ipv4(a) => a.to_string(),
            url::Host::Ipv6(a) => a.to_string(),
        };
        Some(HostPort { host: normalise(&host), port: u.port_or_known_default()? })
    }

    /// Whether this entry allows `host` (as a client named it) on `port`.
    pub fn allows(&self, host: &str, port: u16) -> bool {
        if port != self.port {
            return false;
        }
        let host = normalise(host);
        match self.host.strip_prefix("*.") {
            Some(domain) => {
                host.len() > domain.len() + 1 && host.ends_with(domain) && {
                    let dot = host.len() - domain.len() - 1;
                    host.as_bytes()[dot] == b'.'
                }
            }
            None => host == self.host,
        }
    }

    /// Whether this names this computer's own loopback (which a confined agent reaches only
    /// through a forward its sandbox sets up, since its network namespace has its own).
    pub fn is_loopback(&self) -> bool {
        self.host == "localhost" || self.host.parse::<std::net::IpAddr>().is_ok_and(|a| a.is_loopback())
    }

    pub fn host(&self) -> &str {
        &self.host
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// Splits `host[:port]` (IPv6 in brackets); None when a port is there but not a valid one.
fn split_port(text: &str) -> Option<(&str, Option<u16>)> {
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        match after.strip_prefix(':') {
            Some(p) => (h, Some(p)),
            None if after.is_empty() => (h, None),
            None => return None,
        }
    } else {
        match text.rsplit_once(':') {
            // A bare IPv6 address without brackets has no port.
            Some((h, _)) if h.contains(':') => (text, None),
            Some((h, p)) => (h, Some(p)),
            None => (text, None),
        }
    };
    match port {
        None => Some((host, None)),
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 => Some((host, Some(n))),
            _ => None,
        },
    }
}

fn normalise(host: &str) -> String {
    host.trim_start_matches('[').trim_end_matches(']').trim_end_matches('.').to_ascii_lowercase()
}

/// The hosts one agent may reach.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Allowlist {
    entries: Vec<HostPort>,
}

impl Allowlist {
    pub fn new(mut entries: Vec<HostPort>) -> Allowlist {
        entries.sort();
        entries.dedup();
        Allowlist { entries }
    }

    /// Whether `host:port` may be reached.
    pub fn allows(&self, host: &str, port: u16) -> bool {
        self.entries.iter().any(|e| e.allows(host, port))
    }

    /// The loopback entries, which the sandbox forwards into the agent's own loopback.
    pub fn loopback(&self) -> impl Iterator<Item = &HostPort> {
        self.entries.iter().filter(|e| e.is_loopback())
    }

    pub fn entries(&self) -> &[HostPort] {
        &self.entries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Entries parse with their default port, and what is not a host is refused with why.
    #[test]
    fn entries_parse() {
        assert_eq!(HostPort::parse("api.anthropic.com").unwrap().to_string(), "api.anthropic.com:443");
        assert_eq!(HostPort::parse("Registry.NPMjs.org.:8443").unwrap().to_string(), "registry.npmjs.org:8443");
        assert_eq!(HostPort::parse("[::1]:8080").unwrap().to_string(), "[::1]:8080");
        assert_eq!(HostPort::parse("127.0.0.1:9").unwrap().to_string(), "127.0.0.1:9");
        assert!(HostPort::parse("host:0").is_err());
        assert!(HostPort::parse("host:http").is_err());
        assert!(HostPort::parse("a.*.com").is_err());
        assert!(HostPort::parse("*").is_err());
        assert!(HostPort::parse("https://x.com/v1").is_err());
    }

    /// A domain pattern allows its subdomains only, on its port only.
    #[test]
    fn domains_match_whole_labels() {
        let e = HostPort::parse("*.googleapis.com").unwrap();
        assert!(e.allows("generativelanguage.googleapis.com", 443));
        assert!(e.allows("A.B.GoogleApis.com.", 443));
        assert!(!e.allows("googleapis.com", 443));
        assert!(!e.allows("evilgoogleapis.com", 443));
        assert!(!e.allows("x.googleapis.com", 80));
        let exact = HostPort::parse("api.openai.com").unwrap();
        assert!(exact.allows("API.openai.com", 443));
        assert!(!exact.allows("api.openai.com.evil.com", 443));
    }

    /// A base URL gives its host and its port (the scheme's when it names none).
    #[test]
    fn base_urls_give_host_and_port() {
        assert_eq!(HostPort::of_url("http://127.0.0.1:43123/v1").unwrap().to_string(), "127.0.0.1:43123");
        assert_eq!(HostPort::of_url("https://proxy.corp/anthropic").unwrap().to_string(), "proxy.corp:443");
        assert_eq!(HostPort::of_url("http://localhost").unwrap().to_string(), "localhost:80");
        assert!(HostPort::of_url("file:///etc/passwd").is_none());
        assert!(HostPort::of_url("not a url").is_none());
        assert!(HostPort::of_url("http://127.0.0.1:1").unwrap().is_loopback());
        assert!(!HostPort::of_url("https://api.openai.com").unwrap().is_loopback());
    }
}
