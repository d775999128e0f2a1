//! Canonical hosts: what `Host`, an absolute-form target or HTTP/2
//! `:authority` names, in one spelling.

use std::borrow::Cow;
use std::net::Ipv6Addr;

/// Why an authority has no canonical form (the request gets a 400 `bad-host`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("the host is empty")]
    Empty,
    #[error("the host carries userinfo ('user@'); send only host[:port]")]
    Userinfo,
    #[error("the host contains a percent escape; send the host name itself")]
    PercentEscape,
    #[error(
        "the host contains a character a host name cannot hold (letters, digits, '-', '_' and '.' only; an IPv6 \
         address goes in brackets)"
    )]
    BadCharacter,
    #[error("the host has an empty label (a leading dot, '..', or more than one trailing dot)")]
    EmptyLabel,
    #[error("the host's IPv6 address in brackets is malformed")]
    BadIpv6,
    #[error("the port is not a number from 1 to 65535")]
    BadPort,
}

/// The canonical form of an authority (`host[:port]`), the way a server reads
/// it to pick a virtual host.
///
/// The name is lower-cased and one trailing dot (the DNS root) is removed; an
/// IPv6 literal keeps its brackets and takes its RFC 5952 text (lower-case,
/// zeros compressed: `[0:0::1]` → `[::1]`). The port loses its leading zeros
/// (`:08080` → `:8080`) and is removed when it is empty (`a.example:`) or
/// `default_port` (`:80`, `:0080` for http).
///
/// Refused: an empty host; userinfo (`user@`); a percent escape; a character
/// other than ASCII letters, digits, `-`, `_` and `.` in a name (so non-ASCII
/// names must come as punycode); an empty label (`.a`, `a..b`, `a..`); a
/// malformed or zoned IPv6 literal; a port that is not digits, is 0, or is
/// above 65535.
///
/// Borrowed when `authority` is already canonical (an IPv6 literal is
/// formatted to compare it).
///
/// ```
/// use fencegate::canonical::canonical_host;
///
/// for spelling in ["a.example", "A.Example.", "a.example:80", "a.example:0080", "a.example:"] {
///     assert_eq!(canonical_host(spelling, 80).unwrap(), "a.example");
/// }
/// assert_eq!(canonical_host("a.example:08080", 80).unwrap(), "a.example:8080");
/// assert!(canonical_host("a.example..", 80).is_err());
/// ```
pub fn canonical_host(authority: &str, default_port: u16) -> Result<Cow<'_, str>, HostError> {
    // Every request's host goes through here, and nearly all are canonical
    // already: one pass over the bytes tells, before the full rules.
    if already_canonical(authority, default_port) {
        return Ok(Cow::Borrowed(authority));
    }
    canonical_host_by_the_rules(authority, default_port)
}

/// Whether `authority` is canonical as it is, decided in one pass: a name of
/// lower-case letters, digits, `-` and `_` in non-empty labels, and no port or
/// one written without leading zeros that is not the default. `false` leaves
/// it to the full rules, which canonicalize or refuse it (an IPv6 literal
/// always goes there); a test holds the two to agreeing.
pub(super) fn already_canonical(authority: &str, default_port: u16) -> bool {
    is_canonical_host(authority.as_bytes(), default_port)
}

/// [`canonical_host`]'s quick check on raw bytes, such as a `Host` field's
/// value before it is read as text: `true` when `authority` is its own
/// canonical form (so it is ASCII too); `false` says nothing, the full rules
/// decide. One pass, no allocation.
///
/// ```
/// use fencegate::canonical::is_canonical_host;
///
/// assert!(is_canonical_host(b"a.example:8080", 80));
/// assert!(!is_canonical_host(b"a.example:80", 80));
/// assert!(!is_canonical_host(b"A.example", 80));
/// ```
pub fn is_canonical_host(authority: &[u8], default_port: u16) -> bool {
    // At the start, a dot would open an empty label.
    let mut after_dot = true;
    let mut port = None;
    let mut bytes = authority.iter();
    while let Some(&b) = bytes.next() {
        match NAME[usize::from(b)] {
            Name::Char => after_dot = false,
            Name::Dot if !after_dot => after_dot = true,
            Name::Colon => {
                port = Some(bytes.as_slice());
                break;
            }
            _ => return false,
        }
    }
    // An empty name, or a trailing dot.
    if after_dot {
        return false;
    }
    let Some(port) = port else { return true };
    match port {
        [b'1'..=b'9', ..] if port.len() <= 5 => {
            let mut number = 0u32;
            for &d in port {
                if !d.is_ascii_digit() {
                    return false;
                }
                number = number * 10 + u32::from(d - b'0');
            }
            number <= u32::from(u16::MAX) && number != u32::from(default_port)
        }
        _ => false,
    }
}

/// What a byte is to [`is_canonical_host`]'s name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Name {
    /// A lower-case letter, a digit, `-` or `_`.
    Char,
    Dot,
    Colon,
    /// Anything else: the full rules decide.
    Other,
}

/// The [`Name`] of every byte, so the scan is one load per byte.
static NAME: [Name; 256] = {
    let mut table = [Name::Other; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = match b as u8 {
            b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' => Name::Char,
            b'.' => Name::Dot,
            b':' => Name::Colon,
            _ => Name::Other,
        };
        b += 1;
    }
    table
};

/// [`canonical_host`] by its full rules, for hosts not canonical already.
pub(super) fn canonical_host_by_the_rules(authority: &str, default_port: u16) -> Result<Cow<'_, str>, HostError> {
    if authority.is_empty() {
        return Err(HostError::Empty);
    }
    if authority.contains('@') {
        return Err(HostError::Userinfo);
    }
    if authority.contains('%') {
        return Err(HostError::PercentEscape);
    }
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let close = rest.find(']').ok_or(HostError::BadIpv6)?;
        let port = match &rest[close + 1..] {
            "" => None,
            after => Some(after.strip_prefix(':').ok_or(HostError::BadCharacter)?),
        };
        (Host::Ipv6(&rest[..close]), port)
    } else {
        let (name, port) = match authority.split_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (authority, None),
        };
        if port.is_some_and(|p| p.contains(':')) {
            return Err(HostError::BadCharacter);
        }
        (Host::Name(name), port)
    };
    let port = canonical_port(port, default_port)?;

    let (host, host_changed) = match host {
        Host::Name(name) => {
            if name.is_empty() {
                return Err(HostError::Empty);
            }
            if !name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')) {
                return Err(HostError::BadCharacter);
            }
            let bare = name.strip_suffix('.').unwrap_or(name);
            if bare.is_empty() {
                return Err(HostError::Empty);
            }
            if bare.split('.').any(str::is_empty) {
                return Err(HostError::EmptyLabel);
            }
            let changed = bare.len() != name.len() || bare.bytes().any(|b| b.is_ascii_uppercase());
            (Cow::Borrowed(bare), changed)
        }
        Host::Ipv6(inside) => {
            let address: Ipv6Addr = inside.parse().map_err(|_| HostError::BadIpv6)?;
            let text = address.to_string();
            let changed = text != inside;
            (Cow::Owned(text), changed)
        }
    };
    if !host_changed && port.unchanged {
        return Ok(Cow::Borrowed(authority));
    }
    let mut out = String::with_capacity(authority.len() + 2);
    match &host {
        Cow::Borrowed(name) => out.extend(name.chars().map(|c| c.to_ascii_lowercase())),
        Cow::Owned(address) => {
            out.push('[');
            out.push_str(address);
            out.push(']');
        }
    }
    if let Some(digits) = port.digits {
        out.push(':');
        out.push_str(digits);
    }
    Ok(Cow::Owned(out))
}

enum Host<'a> {
    Name(&'a str),
    /// Between the brackets.
    Ipv6(&'a str),
}

struct Port<'a> {
    /// The digits to write after ':', if any.
    digits: Option<&'a str>,
    /// Whether the authority's port part is already that.
    unchanged: bool,
}

fn canonical_port(port: Option<&str>, default_port: u16) -> Result<Port<'_>, HostError> {
    let Some(text) = port else {
        return Ok(Port { digits: None, unchanged: true });
    };
    if text.is_empty() {
        return Ok(Port { digits: None, unchanged: false });
    }
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(HostError::BadPort);
    }
    let digits = text.trim_start_matches('0');
    // Five digits at most, so the parse cannot overflow before the range check.
    let number: u32 = match digits.len() {
        1..=5 => digits.parse().map_err(|_| HostError::BadPort)?,
        _ => return Err(HostError::BadPort),
    };
    let number = u16::try_from(number).map_err(|_| HostError::BadPort)?;
    if number == default_port {
        Ok(Port { digits: None, unchanged: false })
    } else {
        Ok(Port { digits: Some(digits), unchanged: digits.len() == text.len() })
    }
}
