//! Canonical forms of what a request names: its path, its host, its query
//! parameters, and the fence keys typed into the admin API.
//!
//! fencegate keys a request by the resource the upstream will apply it to
//! (invariant 5: one resource, one key). Servers accept many spellings of one
//! resource (`/objects//a`, `/objects/./a`, `/objects/%61`, `A.Example.:80`),
//! so every spelling must reach one form before anything routes, keys, signs or
//! forwards the request, and what cannot be spelled unambiguously is refused.
//!
//! The rules live here and nowhere else, as pure functions (no I/O, no
//! configuration beyond their arguments) with their own fuzz target
//! (`fuzz/`, target `canonical`). Each function borrows its input when it is
//! already canonical, so a well-formed request costs one scan and no allocation.
//!
//! What stays the upstream's: aliases only it knows (symlinks, hard links,
//! case-insensitive file systems, virtual hosts it serves under several names).
//!
//! Escapes are decoded further than RFC 3986 §6.2.2.2 requires: not only
//! unreserved characters but every character a path may hold raw (sub-delims
//! `!$&'()*+,;=`, `:` and `@`), because the upstreams fencegate stands in front
//! of (nginx, Werkzeug, Python's `http.server`) decode the whole path, and read
//! `/a%2Bb` and `/a+b` as one file. Only escapes whose raw form would change
//! the path's structure or cannot stand raw stay encoded: `%2F`, `%5C`, `%25`,
//! `%3F`, `%23`, and bytes a path cannot hold.

use std::borrow::Cow;
use std::net::Ipv6Addr;

/// How a route treats `%2F` and `%5C` (an encoded `/` or `\`) in a path.
///
/// Servers disagree on them: nginx decodes `%2F` and then resolves the path with
/// it as a separator, others keep it inside one segment. A fence cannot key
/// both readings at once, so the safe default refuses such paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EscapedSlashes {
    /// A path with `%2F` or `%5C` (any case) is refused ([`PathError::EncodedSlash`]).
    #[default]
    Reject,
    /// `%2F` and `%5C` stay encoded (hex upper-cased) inside their segment: for
    /// upstreams that never decode them, such as object stores whose keys hold `/`.
    Keep,
}

/// The per-route switches of [`canonical_path`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathOptions {
    /// Runs of `/` become one `/` (before dot segments are removed), as nginx
    /// and most file-serving upstreams read them. `false` keeps empty segments,
    /// for upstreams where `/a//b` and `/a/b` are different resources.
    pub merge_slashes: bool,
    /// What `%2F` and `%5C` do.
    pub escaped_slashes: EscapedSlashes,
}

impl Default for PathOptions {
    /// `merge_slashes: true`, `escaped_slashes: Reject`: the safe choice for an
    /// upstream that resolves paths like nginx does.
    fn default() -> Self {
        PathOptions { merge_slashes: true, escaped_slashes: EscapedSlashes::Reject }
    }
}

/// Why a path has no canonical form (the request gets a 400 `bad-path`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("the path must start with '/'")]
    NotAbsolute,
    #[error(
        "the path has a malformed percent escape: '%' must be followed by two hex digits (send a literal '%' as %25)"
    )]
    BadEscape,
    #[error(
        "the path contains an encoded slash or backslash (%2F or %5C), which this route refuses because servers \
         disagree on whether it separates segments"
    )]
    EncodedSlash,
    #[error("the path contains a backslash, which some servers read as '/'; separate segments with '/'")]
    Backslash,
    #[error("the path contains a control character (a byte below 0x20 or 0x7F, raw or percent-encoded)")]
    ControlByte,
    #[error("the path climbs above the root with '..'")]
    AboveRoot,
    #[error(
        "the path has a '.' or '..' segment with a ';' parameter (such as '/..;/'), which some servers resolve as a \
         dot segment"
    )]
    DotSegmentParameter,
}

/// The canonical form of a request path (without its query string).
///
/// The result is the one spelling of the resource the upstream will see:
/// - escapes of characters a path may hold raw are decoded: unreserved
///   characters (`A-Z a-z 0-9 - . _ ~`), sub-delims (`!$&'()*+,;=`), `:` and
///   `@` (`%61` → `a`, `%2B` → `+`); every other escape stays, its hex
///   upper-cased (`%3f` → `%3F`); `%25` stays `%25`, so nothing is ever decoded
///   twice; escapes of bytes above 0x7F stay encoded;
/// - raw bytes that a path cannot hold (anything but unreserved characters,
///   sub-delims `!$&'()*+,;=`, `:`, `@` and `/`: a space, `"`, `<`, `?`,
///   non-ASCII text, ...) are percent-encoded, hex upper-case;
/// - runs of `/` become one `/` when `options.merge_slashes` is set, and then
///   `.` and `..` segments (encoded ones too: `%2E`) are removed as RFC 3986
///   §5.2.4 does; a trailing slash stays.
///
/// So the result starts with `/`, is ASCII, and has no `.` or `..` segment, no
/// lower-case escape hex, no escape of an unreserved character, and no control
/// byte, backslash, or (when merging) `//`. It is its own canonical form.
///
/// Refused, rather than guessed at: a path that does not start with `/`; a bad
/// escape (`%G1`, a trailing `%`); a control byte or NUL, raw or encoded; a raw
/// backslash; `%2F` or `%5C` unless `options.escaped_slashes` keeps them; a
/// `..` above the root; a `.` or `..` segment with a `;` parameter (Tomcat reads
/// `/..;/` as `/../`).
///
/// Borrowed when `path` is already canonical: one scan, no allocation.
///
/// ```
/// use std::borrow::Cow;
/// use fencegate::canonical::{canonical_path, PathError, PathOptions};
///
/// let options = PathOptions::default();
/// for spelling in ["/objects//a", "/objects/./a", "/objects/x/../a", "/objects/%61", "/objects/x/%2E%2E/a"] {
///     assert_eq!(canonical_path(spelling, options).unwrap(), "/objects/a");
/// }
/// assert!(matches!(canonical_path("/objects/a", options), Ok(Cow::Borrowed(_))));
/// assert_eq!(canonical_path("/objects/a%3f b", options).unwrap(), "/objects/a%3F%20b");
/// assert_eq!(canonical_path("/objects/../secure/doc", options).unwrap(), "/secure/doc");
/// assert_eq!(canonical_path("/../secure/doc", options), Err(PathError::AboveRoot));
/// assert_eq!(canonical_path("/objects/a%2Fb", options), Err(PathError::EncodedSlash));
/// ```
pub fn canonical_path(path: &str, options: PathOptions) -> Result<Cow<'_, str>, PathError> {
    let bytes = path.as_bytes();
    if bytes.first() != Some(&b'/') {
        return Err(PathError::NotAbsolute);
    }
    let mut out = Output::new(path);
    out.keep(1);
    loop {
        // The output ends with '/', and the next segment starts here in both.
        let segment = out.len();
        while let Some(&b) = bytes.get(out.pos) {
            match RAW[usize::from(b)] {
                Raw::Keep => out.keep(1),
                Raw::Slash => break,
                Raw::Percent => out.escape(options)?,
                Raw::Encode => out.replace_with_escape(1, b),
                Raw::Backslash => return Err(PathError::Backslash),
                Raw::Control => return Err(PathError::ControlByte),
            }
        }
        let last = out.pos == bytes.len();
        // Dot segments are judged after decoding, so `%2E%2E` counts as `..`.
        match dot_segment(&out.as_str()[segment..])? {
            Some(dots) => {
                // The dot segment and the '/' after it leave no trace; `..`
                // also takes the segment before it.
                out.truncate(segment);
                if dots == Dots::Two {
                    let parent = out.as_str()[..segment - 1].rfind('/').ok_or(PathError::AboveRoot)?;
                    out.truncate(parent + 1);
                }
                if last {
                    break;
                }
                out.skip(1);
            }
            None if last => break,
            // An empty segment followed by '/': the second slash of a run.
            // Merged here, before the segments after it are resolved, so the
            // stack of segments that `..` pops never holds an empty one.
            None if options.merge_slashes && out.len() == segment => out.skip(1),
            None => out.keep(1),
        }
    }
    Ok(out.finish())
}

/// A fence key typed into the admin API, already percent-decoded once (the
/// `?key=` value; `+` is not a space there).
///
/// A key that starts with `/` is read as a request path and given its
/// [`canonical_path`] under the default [`PathOptions`], so it is the key a
/// request for that resource gets: raw characters a path cannot hold are
/// encoded (`/objects/a b` → `/objects/a%20b`), escapes still in the decoded
/// text are read as escapes (`/objects/%61` → `/objects/a`; a literal `%` is
/// typed as `%2525` in the query), and refusals are the same as for requests.
/// Any other key (a `{header.x}` or `{query.x}` key, say) is returned unchanged.
///
/// ```
/// use fencegate::canonical::admin_key;
///
/// assert_eq!(admin_key("/objects/a b").unwrap(), "/objects/a%20b");
/// assert_eq!(admin_key("/objects/./a+b").unwrap(), "/objects/a+b");
/// assert_eq!(admin_key("tenant a").unwrap(), "tenant a");
/// ```
pub fn admin_key(decoded: &str) -> Result<Cow<'_, str>, PathError> {
    if decoded.starts_with('/') {
        canonical_path(decoded, PathOptions::default())
    } else {
        Ok(Cow::Borrowed(decoded))
    }
}

/// What a raw byte of a path becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Raw {
    /// An unreserved character, a sub-delim, `:` or `@`: kept as it is.
    Keep,
    Slash,
    /// The start of an escape.
    Percent,
    /// Not allowed raw in a path: percent-encoded.
    Encode,
    Backslash,
    Control,
}

const fn raw_class(b: u8) -> Raw {
    match b {
        b'/' => Raw::Slash,
        b'%' => Raw::Percent,
        b'\\' => Raw::Backslash,
        0x00..=0x1F | 0x7F => Raw::Control,
        b':' | b'@' => Raw::Keep,
        _ if is_unreserved(b) || is_sub_delim(b) => Raw::Keep,
        _ => Raw::Encode,
    }
}

/// [`raw_class`] of every byte, so the scan is one load per byte.
static RAW: [Raw; 256] = {
    let mut table = [Raw::Encode; 256];
    let mut i = 0;
    while i < 256 {
        table[i] = raw_class(i as u8);
        i += 1;
    }
    table
};

/// RFC 3986 unreserved: `ALPHA / DIGIT / "-" / "." / "_" / "~"`.
const fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// RFC 3986 sub-delims: `"!" / "$" / "&" / "'" / "(" / ")" / "*" / "+" / "," / ";" / "="`.
const fn is_sub_delim(b: u8) -> bool {
    matches!(b, b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'=')
}

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dots {
    One,
    Two,
}

/// Whether a decoded segment is `.` or `..`; a dot segment with a `;`
/// parameter (raw, or the `%3B` a server may decode before splitting) is an
/// error, because Tomcat and its kin strip the parameter and then resolve it.
fn dot_segment(segment: &str) -> Result<Option<Dots>, PathError> {
    let (dots, rest) = match segment.strip_prefix("..") {
        Some(rest) => (Dots::Two, rest),
        None => match segment.strip_prefix('.') {
            Some(rest) => (Dots::One, rest),
            None => return Ok(None),
        },
    };
    if rest.is_empty() {
        Ok(Some(dots))
    } else if rest.starts_with(';') || rest.starts_with("%3B") {
        Err(PathError::DotSegmentParameter)
    } else {
        Ok(None)
    }
}

/// The canonical path being written: borrowed from the input (its first `pos`
/// bytes) for as long as it equals the input read so far, owned from the first
/// difference on.
struct Output<'a> {
    input: &'a str,
    /// Input bytes read.
    pos: usize,
    owned: Option<String>,
}

impl<'a> Output<'a> {
    fn new(input: &'a str) -> Self {
        Output { input, pos: 0, owned: None }
    }

    fn as_str(&self) -> &str {
        match &self.owned {
            Some(s) => s,
            None => &self.input[..self.pos],
        }
    }

    fn len(&self) -> usize {
        self.as_str().len()
    }

    /// The output from here on differs from the input.
    fn owned(&mut self) -> &mut String {
        let (input, pos) = (self.input, self.pos);
        self.owned.get_or_insert_with(|| {
            let mut s = String::with_capacity(input.len() + 8);
            s.push_str(&input[..pos]);
            s
        })
    }

    /// The next `n` input bytes, unchanged.
    fn keep(&mut self, n: usize) {
        if let Some(s) = &mut self.owned {
            s.push_str(&self.input[self.pos..self.pos + n]);
        }
        self.pos += n;
    }

    /// The next `n` input bytes, dropped.
    fn skip(&mut self, n: usize) {
        self.owned();
        self.pos += n;
    }

    /// The next `n` input bytes, replaced by the ASCII byte `b`.
    fn replace_with_byte(&mut self, n: usize, b: u8) {
        self.owned().push(char::from(b));
        self.pos += n;
    }

    /// The next `n` input bytes, replaced by the escape of `b`.
    fn replace_with_escape(&mut self, n: usize, b: u8) {
        let s = self.owned();
        s.push('%');
        s.push(char::from(HEX_UPPER[usize::from(b >> 4)]));
        s.push(char::from(HEX_UPPER[usize::from(b & 0xF)]));
        self.pos += n;
    }

    fn truncate(&mut self, len: usize) {
        self.owned().truncate(len);
    }

    /// The escape at `pos`: decoded when it is of a character a path may hold
    /// raw, else kept with its hex upper-cased, or refused.
    fn escape(&mut self, options: PathOptions) -> Result<(), PathError> {
        let bytes = self.input.as_bytes();
        let (hi, lo) = match (bytes.get(self.pos + 1), bytes.get(self.pos + 2)) {
            (Some(&hi), Some(&lo)) if hi.is_ascii_hexdigit() && lo.is_ascii_hexdigit() => (hi, lo),
            _ => return Err(PathError::BadEscape),
        };
        let value = hex_value(hi) << 4 | hex_value(lo);
        match value {
            0x00..=0x1F | 0x7F => return Err(PathError::ControlByte),
            b'/' | b'\\' if options.escaped_slashes == EscapedSlashes::Reject => return Err(PathError::EncodedSlash),
            // Every character a path may hold raw is decoded: servers that
            // read files or routes (nginx, Werkzeug, Python's http.server)
            // decode the whole path, so `%2B` and `+` are one resource there.
            _ if is_unreserved(value) || is_sub_delim(value) || matches!(value, b':' | b'@') => {
                self.replace_with_byte(3, value)
            }
            _ if hi.is_ascii_lowercase() || lo.is_ascii_lowercase() => self.replace_with_escape(3, value),
            _ => self.keep(3),
        }
        Ok(())
    }

    fn finish(self) -> Cow<'a, str> {
        match self.owned {
            Some(s) => Cow::Owned(s),
            None => Cow::Borrowed(&self.input[..self.pos]),
        }
    }
}

/// The value of an ASCII hex digit (the caller checked it is one).
fn hex_value(digit: u8) -> u8 {
    match digit {
        b'0'..=b'9' => digit - b'0',
        _ => (digit | 0x20) - b'a' + 10,
    }
}

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

/// Why a query parameter cannot be read (the request gets a 400 `bad-key`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    #[error("the query parameter appears more than once (after decoding its name)")]
    Repeated,
}

/// The value of the query parameter `name`, decoded the way web frameworks
/// decode it (`application/x-www-form-urlencoded`: pairs separated by `&`,
/// name and value split at the first `=`, `+` is a space, `%XX` is a byte,
/// invalid UTF-8 becomes U+FFFD), so the key sees what the upstream's handler
/// sees.
///
/// `query` is the query string without its `?`. Names are decoded before they
/// are compared with `name` (which is taken as already decoded): `i%64=7`
/// is a parameter `id`. `Ok(None)` when no parameter has that name; a name
/// without `=` has the value `""`. `Err(Repeated)` when the decoded name occurs
/// more than once, whatever the values, because frameworks differ on which one
/// they use.
///
/// ```
/// use fencegate::canonical::{query_param, QueryError};
///
/// assert_eq!(query_param("id=%37&x=1", "id").unwrap().as_deref(), Some("7"));
/// assert_eq!(query_param("id=a+b", "id").unwrap().as_deref(), Some("a b"));
/// assert_eq!(query_param("i%64=7&id=fresh", "id"), Err(QueryError::Repeated));
/// assert_eq!(query_param("idx=1", "id"), Ok(None));
/// ```
pub fn query_param<'q>(query: &'q str, name: &str) -> Result<Option<Cow<'q, str>>, QueryError> {
    let mut found = None;
    for (n, value) in form_urlencoded::parse(query.as_bytes()) {
        if n == name && found.replace(value).is_some() {
            return Err(QueryError::Repeated);
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT: PathOptions = PathOptions { merge_slashes: true, escaped_slashes: EscapedSlashes::Reject };
    const KEEP: PathOptions = PathOptions { merge_slashes: true, escaped_slashes: EscapedSlashes::Keep };
    const NO_MERGE: PathOptions = PathOptions { merge_slashes: false, escaped_slashes: EscapedSlashes::Reject };

    fn path(input: &str, options: PathOptions) -> Result<String, PathError> {
        canonical_path(input, options).map(Cow::into_owned)
    }

    #[test]
    fn default_options_are_the_safe_ones() {
        assert_eq!(PathOptions::default(), DEFAULT);
        assert_eq!(EscapedSlashes::default(), EscapedSlashes::Reject);
    }

    #[test]
    fn the_spec_examples() {
        for input in
            ["/objects//a", "/objects/./a", "/objects/x/../a", "/objects/%61", "/objects/%2e/a", "/objects/x/%2E%2E/a"]
        {
            assert_eq!(path(input, DEFAULT).as_deref(), Ok("/objects/a"), "{input}");
        }
        assert_eq!(path("/objects/%7e", DEFAULT).as_deref(), Ok("/objects/~"));
        assert_eq!(path("/objects/a%3f", DEFAULT).as_deref(), Ok("/objects/a%3F"));
        assert_eq!(path("/objects/../secure/doc", DEFAULT).as_deref(), Ok("/secure/doc"));
    }

    #[test]
    fn canonical_paths_are_borrowed() {
        for input in [
            "/",
            "/objects/a",
            "/objects/a/",
            "/a-b_c.d~e/f",
            "/a%20b",
            "/%C3%A9",
            "/a%25b",
            "/a%3Fb",
            "/!$&'()*+,;=:@",
            "/...",
            "/.a/..b/a./a..",
            "/.../..../",
            "/a;b/c;x=1",
        ] {
            let got = canonical_path(input, DEFAULT);
            assert!(matches!(got, Ok(Cow::Borrowed(p)) if p == input), "{input}: {got:?}");
        }
        // Not canonical: owned, and different.
        for input in ["//", "/a//b", "/./", "/a/..", "/%61", "/%3f", "/a b", "/é"] {
            let got = canonical_path(input, DEFAULT);
            assert!(matches!(&got, Ok(Cow::Owned(p)) if p != input), "{input}: {got:?}");
        }
    }

    #[test]
    fn escapes() {
        for (input, want) in [
            // Unreserved characters are decoded, in either hex case.
            ("/%41%5a%61%7A%30%39", "/AZaz09"),
            ("/%2D%2e%5F%7e", "/-._~"),
            // So are sub-delims, ':' and '@': a path may hold them raw, and
            // servers that decode the whole path read both spellings as one.
            ("/%2b+%3a:%40@%3b;%3d=", "/++::@@;;=="),
            ("/%21%24%26%27%28%29%2A%2C", "/!$&'()*,"),
            // Everything else stays encoded, hex upper-cased.
            ("/%3f%3F%23%5b%5d", "/%3F%3F%23%5B%5D"),
            ("/%c3%a9", "/%C3%A9"),
            ("/%ff%80", "/%FF%80"),
            ("/%20", "/%20"),
            // Never decoded twice: %25 stays, and what follows it is text.
            ("/%25", "/%25"),
            ("/%2541", "/%2541"),
            ("/%252e%252e/a", "/%252e%252e/a"),
            ("/%25%32%65", "/%252e"),
        ] {
            assert_eq!(path(input, DEFAULT).as_deref(), Ok(want), "{input}");
        }
    }

    #[test]
    fn raw_bytes_a_path_cannot_hold_are_encoded() {
        for (input, want) in [
            ("/a b", "/a%20b"),
            ("/a\"b", "/a%22b"),
            ("/<>", "/%3C%3E"),
            ("/a?b#c", "/a%3Fb%23c"),
            ("/[::1]", "/%5B::1%5D"),
            ("/^`{|}", "/%5E%60%7B%7C%7D"),
            ("/é", "/%C3%A9"),
            ("/\u{1F600}", "/%F0%9F%98%80"),
            // Sub-delims, ':' and '@' are allowed raw and stay raw.
            ("/!$&'()*+,;=:@", "/!$&'()*+,;=:@"),
        ] {
            assert_eq!(path(input, DEFAULT).as_deref(), Ok(want), "{input}");
        }
    }

    #[test]
    fn slashes_merge_before_dot_segments() {
        for (input, merged, unmerged) in [
            ("//", "/", "//"),
            ("//a", "/a", "//a"),
            ("/a//b", "/a/b", "/a//b"),
            ("/a///b//", "/a/b/", "/a///b//"),
            // nginx and posixpath.normpath: the empty segment is gone before '..' pops.
            ("/a//../b", "/b", "/a/b"),
            ("/a/b//..", "/a/", "/a/b/"),
            ("/a/..//b", "/b", "//b"),
            ("/a/.//b", "/a/b", "/a//b"),
            ("/a//./b", "/a/b", "/a//b"),
        ] {
            assert_eq!(path(input, DEFAULT).as_deref(), Ok(merged), "{input} merged");
            assert_eq!(path(input, NO_MERGE).as_deref(), Ok(unmerged), "{input} unmerged");
        }
        // Not merging, an empty segment is a segment '..' can take; merging, it
        // is not there, so the same '..' climbs above the root.
        assert_eq!(path("//..", NO_MERGE).as_deref(), Ok("/"));
        assert_eq!(path("//..", DEFAULT), Err(PathError::AboveRoot));
    }

    #[test]
    fn dot_segments() {
        for (input, want) in [
            ("/.", "/"),
            ("/./", "/"),
            ("/a/.", "/a/"),
            ("/a/..", "/"),
            ("/a/../", "/"),
            ("/a/b/..", "/a/"),
            ("/a/b/../c", "/a/c"),
            ("/a/./b/./c/.", "/a/b/c/"),
            ("/a/b/c/../../d", "/a/d"),
            ("/a/%2e", "/a/"),
            ("/a/%2E%2e/b", "/b"),
            ("/a/.%2E/b", "/b"),
            ("/a/%2E./b", "/b"),
            // Not dot segments.
            ("/a/.../b", "/a/.../b"),
            ("/a/.b/c.", "/a/.b/c."),
            ("/a/..b/b..", "/a/..b/b.."),
            ("/a/.%20/b", "/a/.%20/b"),
            ("/a/%2E%2E%2E", "/a/..."),
        ] {
            assert_eq!(path(input, DEFAULT).as_deref(), Ok(want), "{input}");
        }
    }

    #[test]
    fn escaped_slashes_refused_or_kept() {
        for input in ["/a%2Fb", "/a%2fb", "/a%5Cb", "/a%5cb", "/%2F", "/..%2F..%2Fsecure"] {
            assert_eq!(path(input, DEFAULT), Err(PathError::EncodedSlash), "{input}");
        }
        for (input, want) in [
            ("/a%2Fb", "/a%2Fb"),
            ("/a%2fb", "/a%2Fb"),
            ("/a%5cb", "/a%5Cb"),
            // Kept inside its segment: not a separator, not a dot segment.
            ("/x/..%2F..%2Fsecure", "/x/..%2F..%2Fsecure"),
            ("/a/%2f/../b", "/a/b"),
        ] {
            assert_eq!(path(input, KEEP).as_deref(), Ok(want), "{input}");
        }
    }

    #[test]
    fn refusals() {
        use PathError::*;
        let both = [DEFAULT, KEEP, NO_MERGE];
        for (input, error) in [
            ("", NotAbsolute),
            ("a/b", NotAbsolute),
            ("*", NotAbsolute),
            ("http://h/a", NotAbsolute),
            ("%2Fa", NotAbsolute),
            ("/a%", BadEscape),
            ("/a%4", BadEscape),
            ("/a%G1", BadEscape),
            ("/a%1G", BadEscape),
            ("/a%%41", BadEscape),
            ("/a%-1", BadEscape),
            ("/a%\u{e9}", BadEscape),
            ("/a\\b", Backslash),
            ("/a\\..\\b", Backslash),
            ("/a\0", ControlByte),
            ("/a\tb", ControlByte),
            ("/a\r\nb", ControlByte),
            ("/a\x7f", ControlByte),
            ("/a%00", ControlByte),
            ("/a%0a", ControlByte),
            ("/a%0D", ControlByte),
            ("/a%1f", ControlByte),
            ("/a%7F", ControlByte),
            ("/..", AboveRoot),
            ("/../a", AboveRoot),
            ("/a/../../b", AboveRoot),
            ("/a/../..", AboveRoot),
            ("/%2e%2e/a", AboveRoot),
            ("/./../a", AboveRoot),
            ("/..;/a", DotSegmentParameter),
            ("/.;x/a", DotSegmentParameter),
            ("/a/..;jsessionid=1/b", DotSegmentParameter),
            ("/a/.;", DotSegmentParameter),
            ("/a/%2e%2e;/b", DotSegmentParameter),
            ("/a/..%3b/b", DotSegmentParameter),
            ("/a/.%3Bx", DotSegmentParameter),
        ] {
            for options in both {
                assert_eq!(path(input, options), Err(error.clone()), "{input:?} with {options:?}");
            }
        }
        // Not refused: a ';' on a name, or a dot segment's look-alikes.
        for input in ["/a;b/..", "/a/...;/b", "/a/x.;/b", "/a/;/b"] {
            assert!(path(input, DEFAULT).is_ok(), "{input}");
        }
    }

    #[test]
    fn errors_say_what_to_fix() {
        assert!(PathError::BadEscape.to_string().contains("%25"));
        assert!(PathError::EncodedSlash.to_string().contains("%2F"));
        assert!(PathError::DotSegmentParameter.to_string().contains("';'"));
        assert!(HostError::Userinfo.to_string().contains("host[:port]"));
        assert!(HostError::BadPort.to_string().contains("65535"));
    }

    #[test]
    fn canonical_paths_are_fixed_points() {
        let inputs = [
            "/objects//a/./b/../c%2e%7E%3f x",
            "/a/%2E%2E/%2e/b//",
            "/%25%32%65%2e/..",
            "//a//b//..//",
            "/a%2f%5c/x",
            "/é/ü/%c3%bc",
        ];
        for options in [DEFAULT, KEEP, NO_MERGE] {
            for input in inputs {
                let Ok(once) = canonical_path(input, options) else { continue };
                let twice = canonical_path(&once, options);
                assert!(matches!(&twice, Ok(Cow::Borrowed(p)) if *p == once), "{input} {options:?}: {twice:?}");
            }
        }
    }

    #[test]
    fn admin_keys() {
        for (input, want) in [
            ("/objects/a b", Ok("/objects/a%20b")),
            ("/objects/a+b", Ok("/objects/a+b")),
            ("/objects//./a", Ok("/objects/a")),
            ("/objects/%61", Ok("/objects/a")),
            ("/objects/é", Ok("/objects/%C3%A9")),
            ("/objects/100%", Err(PathError::BadEscape)),
            ("/objects/a%2Fb", Err(PathError::EncodedSlash)),
            ("/../a", Err(PathError::AboveRoot)),
            ("tenant:a b", Ok("tenant:a b")),
            ("", Ok("")),
            ("%2F", Ok("%2F")),
        ] {
            assert_eq!(admin_key(input).as_deref().map_err(Clone::clone), want, "{input}");
        }
        // The key a request gets: a request for `/objects/a%20b` is keyed `/objects/a%20b`.
        assert_eq!(admin_key("/objects/a b"), canonical_path("/objects/a%20b", DEFAULT));
        assert!(matches!(admin_key("/objects/a"), Ok(Cow::Borrowed(_))));
    }

    fn host(input: &str) -> Result<String, HostError> {
        canonical_host(input, 80).map(Cow::into_owned)
    }

    #[test]
    fn host_spellings() {
        for input in
            ["a.example", "A.Example", "a.example.", "A.EXAMPLE.:80", "a.example:0080", "a.example:", "a.example.:"]
        {
            assert_eq!(host(input).as_deref(), Ok("a.example"), "{input}");
        }
        for (input, want) in [
            ("a.example:8080", "a.example:8080"),
            ("a.example:08080", "a.example:8080"),
            ("a.example:00443", "a.example:443"),
            ("a.example:65535", "a.example:65535"),
            ("a.example:0000000000000000000000080", "a.example"),
            ("localhost", "localhost"),
            ("127.0.0.1:80", "127.0.0.1"),
            ("127.0.0.1:9000", "127.0.0.1:9000"),
            ("my_host-1.example", "my_host-1.example"),
            ("[::1]", "[::1]"),
            ("[::1]:80", "[::1]"),
            ("[::1]:", "[::1]"),
            ("[::1]:8080", "[::1]:8080"),
            ("[2001:DB8::A]", "[2001:db8::a]"),
            ("[0:0:0:0:0:0:0:1]:08080", "[::1]:8080"),
            ("[::FFFF:1.2.3.4]", "[::ffff:1.2.3.4]"),
        ] {
            assert_eq!(host(input).as_deref(), Ok(want), "{input}");
        }
        // The scheme's default port is the caller's.
        assert_eq!(canonical_host("a.example:443", 443).as_deref(), Ok("a.example"));
        assert_eq!(canonical_host("a.example:80", 443).as_deref(), Ok("a.example:80"));
    }

    #[test]
    fn canonical_hosts_are_borrowed() {
        for input in ["a.example", "a.example:8080", "127.0.0.1", "[::1]", "[2001:db8::a]:81", "x"] {
            assert!(matches!(canonical_host(input, 80), Ok(Cow::Borrowed(h)) if h == input), "{input}");
        }
        for input in ["A.example", "a.example.", "a.example:80", "a.example:", "a.example:0081", "[::0001]"] {
            assert!(matches!(canonical_host(input, 80), Ok(Cow::Owned(h)) if h != input), "{input}");
        }
    }

    #[test]
    fn malformed_hosts() {
        use HostError::*;
        for (input, error) in [
            ("", Empty),
            (":80", Empty),
            (".", Empty),
            (".:80", Empty),
            ("user@a.example", Userinfo),
            ("user:pw@a.example:80", Userinfo),
            ("a%2Eexample", PercentEscape),
            ("[fe80::1%25eth0]", PercentEscape),
            ("a example", BadCharacter),
            ("a.example ", BadCharacter),
            ("a/b", BadCharacter),
            ("a\\b", BadCharacter),
            ("a\0b", BadCharacter),
            ("é.example", BadCharacter),
            ("a,b", BadCharacter),
            ("::1", BadCharacter),
            ("a:80:80", BadCharacter),
            ("[::1]80", BadCharacter),
            ("[::1]]", BadCharacter),
            ("a.example..", EmptyLabel),
            ("a..example", EmptyLabel),
            (".a.example", EmptyLabel),
            ("..", EmptyLabel),
            ("[::1", BadIpv6),
            ("[]", BadIpv6),
            ("[a.example]", BadIpv6),
            ("[1.2.3.4]", BadIpv6),
            ("[v1.x]", BadIpv6),
            ("[::1:]", BadIpv6),
            ("a.example:0", BadPort),
            ("a.example:000", BadPort),
            ("a.example:65536", BadPort),
            ("a.example:99999999999999999999", BadPort),
            ("a.example:+80", BadPort),
            ("a.example:8o", BadPort),
            ("a.example: 80", BadPort),
            ("[::1]:0", BadPort),
        ] {
            assert_eq!(host(input), Err(error), "{input:?}");
        }
    }

    #[test]
    fn query_params_are_form_decoded() {
        for (query, name, want) in [
            ("id=7", "id", Ok(Some("7"))),
            ("id=%37", "id", Ok(Some("7"))),
            ("i%64=7", "id", Ok(Some("7"))),
            ("id=a+b%2Bc", "id", Ok(Some("a b+c"))),
            ("a+b=1", "a b", Ok(Some("1"))),
            ("id", "id", Ok(Some(""))),
            ("id=", "id", Ok(Some(""))),
            ("id=b=c", "id", Ok(Some("b=c"))),
            ("&&id=1&", "id", Ok(Some("1"))),
            ("id=%ZZ", "id", Ok(Some("%ZZ"))),
            ("id=%FF", "id", Ok(Some("\u{FFFD}"))),
            ("x=1", "id", Ok(None)),
            ("idx=1&xid=2", "id", Ok(None)),
            ("", "id", Ok(None)),
            ("ID=1", "id", Ok(None)),
            ("id=1&id=1", "id", Err(QueryError::Repeated)),
            ("i%64=7&id=fresh", "id", Err(QueryError::Repeated)),
            ("id&id=2", "id", Err(QueryError::Repeated)),
            ("%69%64=1&i%64=2", "id", Err(QueryError::Repeated)),
        ] {
            assert_eq!(query_param(query, name).map(|v| v.map(Cow::into_owned)), want.map(|v| v.map(String::from)));
        }
        // A value that needs no decoding is borrowed from the query.
        assert!(matches!(query_param("id=7", "id"), Ok(Some(Cow::Borrowed("7")))));
    }
}
