//! The checks behind the fuzz targets, shared with `tests/it/fuzz_regressions.rs`.
//!
//! Every `check_*` function takes one raw fuzzer input, decodes it, calls
//! fencegate and panics when an oracle does not hold. The fuzz targets in
//! `fuzz_targets/` are one-line wrappers, and the regression tests call the same
//! functions on saved inputs, so `cargo test` exercises the harness logic too.
//!
//! Structured inputs are fields separated by [`SEP`] (0xFF, a byte that never
//! occurs in UTF-8 text). Missing fields take a default; extra fields are used
//! or ignored as each check documents.
//!
//! The oracles are written independently of the code under test (a second
//! parser, a brute-force matcher, a reference renderer), so they catch wrong
//! answers as well as panics.

use std::borrow::Cow;
use std::cmp::Reverse;
use std::sync::OnceLock;

use fencegate::canonical::{
    admin_key, canonical_host, canonical_path, query_param, query_param_with, EscapedSlashes, NonUtf8, PathError,
    PathOptions, QueryError,
};
use fencegate::config::{
    parse_size, Config, FileConfig, KeyTemplate, PathPattern, RouteConfig, StoreKind, UpstreamUrl,
};
use fencegate::fence::token::{parse_token, token_from_headers, TokenError};
use fencegate::route::{Route, RouteTable};
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderName, HeaderValue, Uri};

/// Field separator in structured inputs.
pub const SEP: u8 = 0xFF;

/// The token header the `token` check reads.
pub const TOKEN_HEADER: &str = "x-fencing-token";

fn fields(data: &[u8]) -> Vec<&[u8]> {
    data.split(|&b| b == SEP).collect()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

// ---------------------------------------------------------------------------
// token
// ---------------------------------------------------------------------------

/// What `parse_token` must answer, computed without it: the value of the
/// leading run of ASCII digits (in `u128`, saturated just past `u64::MAX`)
/// decides between `Overflow` and the rest. A digit run that overflows is
/// reported before a later non-digit, because the parser reads left to right.
pub fn expected_token(value: &[u8]) -> Result<u64, TokenError> {
    if value.is_empty() {
        return Err(TokenError::Empty);
    }
    let run = value.iter().take_while(|b| b.is_ascii_digit()).count();
    let limit = u128::from(u64::MAX) + 1;
    let mut n: u128 = 0;
    for &b in &value[..run] {
        n = (n * 10 + u128::from(b - b'0')).min(limit);
    }
    if n == limit {
        return Err(TokenError::Overflow);
    }
    if run < value.len() {
        return Err(TokenError::NotDigits);
    }
    Ok(n as u64)
}

/// `token` target. The whole input goes to `parse_token`; the fields after the
/// first SEP-separated one (at most 3) become values of the token header for
/// `token_from_headers`, beside decoy headers that must be ignored.
pub fn check_token(data: &[u8]) {
    check_one_token(data);
    let parts = fields(data);
    for part in &parts {
        check_one_token(part);
    }

    let name = HeaderName::from_static(TOKEN_HEADER);
    let mut headers = HeaderMap::new();
    headers.append(HeaderName::from_static("x-fencing-token-current"), HeaderValue::from_static("1"));
    headers.append(HeaderName::from_static("x-fencing-tokens"), HeaderValue::from_static("2"));
    let mut values: Vec<&[u8]> = Vec::new();
    for part in parts.iter().skip(1).take(3) {
        if let Ok(v) = HeaderValue::from_bytes(part) {
            headers.append(&name, v);
            values.push(*part);
        }
    }
    let want = match values.as_slice() {
        [] => Ok(None),
        [one] => expected_token(one).map(Some),
        _ => Err(TokenError::Repeated),
    };
    assert_eq!(token_from_headers(&headers, &name), want, "token_from_headers with values {values:?}");
}

fn check_one_token(value: &[u8]) {
    let got = parse_token(value);
    assert_eq!(got, expected_token(value), "parse_token({:?})", String::from_utf8_lossy(value));
    // A second, unrelated oracle for the accepting side: the standard library.
    let std_value = if !value.is_empty() && value.iter().all(u8::is_ascii_digit) {
        std::str::from_utf8(value).ok().and_then(|s| s.parse::<u64>().ok())
    } else {
        None
    };
    assert_eq!(got.ok(), std_value, "parse_token({:?}) against str::parse", String::from_utf8_lossy(value));
}

// ---------------------------------------------------------------------------
// key_template
// ---------------------------------------------------------------------------

/// A path pattern segment as the reference parser sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum RefSegment {
    Literal(String),
    Capture(String),
    Rest(String),
}

/// Reference parse of a path pattern: `Some(segments)` exactly when
/// `PathPattern::parse` must accept the text.
fn ref_pattern(text: &str) -> Option<Vec<RefSegment>> {
    let body = text.strip_prefix('/')?;
    let parts: Vec<&str> = body.split('/').collect();
    let mut out = Vec::new();
    let mut names: Vec<String> = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        let whole = part.len() >= 2 && part.starts_with('{') && part.ends_with('}');
        if whole {
            let inner = &part[1..part.len() - 1];
            let (name, rest) = match inner.strip_suffix('*') {
                Some(n) => (n, true),
                None => (inner, false),
            };
            let ident = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !ident || names.iter().any(|n| n == name) || (rest && i + 1 != parts.len()) {
                return None;
            }
            names.push(name.to_string());
            out.push(if rest { RefSegment::Rest(name.to_string()) } else { RefSegment::Capture(name.to_string()) });
        } else if part.contains(['{', '}']) {
            return None;
        } else {
            out.push(RefSegment::Literal(part.to_string()));
        }
    }
    Some(out)
}

/// Brute-force matcher: the captures of `path` against reference segments.
fn ref_captures(segs: &[RefSegment], path: &str) -> Option<Vec<String>> {
    let body = path.strip_prefix('/')?;
    let parts: Vec<&str> = body.split('/').collect();
    let has_rest = matches!(segs.last(), Some(RefSegment::Rest(_)));
    if has_rest && parts.len() < segs.len() || !has_rest && parts.len() != segs.len() {
        return None;
    }
    let mut out = Vec::new();
    for (i, seg) in segs.iter().enumerate() {
        match seg {
            RefSegment::Literal(l) if l == parts[i] => {}
            RefSegment::Literal(_) => return None,
            RefSegment::Capture(_) if parts[i].is_empty() => return None,
            RefSegment::Capture(_) => out.push(parts[i].to_string()),
            RefSegment::Rest(_) => {
                let rest = parts[i..].join("/");
                if rest.is_empty() {
                    return None;
                }
                out.push(rest);
            }
        }
    }
    Some(out)
}

/// A path the pattern must match, with the captures it must yield.
fn ref_example(segs: &[RefSegment]) -> (String, Vec<String>) {
    let mut path = String::new();
    let mut caps = Vec::new();
    for (i, seg) in segs.iter().enumerate() {
        path.push('/');
        match seg {
            RefSegment::Literal(l) => path.push_str(l),
            RefSegment::Capture(_) => {
                let v = format!("v{i}");
                path.push_str(&v);
                caps.push(v);
            }
            RefSegment::Rest(_) => {
                path.push_str("r/s/");
                caps.push("r/s/".to_string());
            }
        }
    }
    (path, caps)
}

fn check_pattern(pat: &PathPattern, segs: &[RefSegment], path: &str) {
    let got = pat.captures(path).map(|v| v.into_iter().map(str::to_string).collect::<Vec<_>>());
    assert_eq!(got, ref_captures(segs, path), "captures of {path:?} by pattern {:?}", pat.source());
    if got.is_some() {
        assert!(
            path.starts_with(pat.literal_prefix()),
            "{path:?} matches {:?} but lacks its literal prefix {:?}",
            pat.source(),
            pat.literal_prefix()
        );
    }
}

/// A key template part as the reference parser sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum RefPart {
    Literal(String),
    Path,
    Host,
    Header(HeaderName),
    Query(String),
    /// The capture's index, and whether it is the `{name*}` rest.
    Capture(usize, bool),
}

/// Reference parse of a key template: `Some(parts)` exactly when
/// `KeyTemplate::parse` must accept it: balanced braces, known placeholders,
/// at least one, and read back one way only (see [`ref_terminators`]).
fn ref_template(text: &str, pattern: Option<&[RefSegment]>) -> Option<Vec<RefPart>> {
    let parts = ref_template_parts(text, pattern)?;
    ref_terminators(&parts)?;
    Some(parts)
}

/// What a placeholder's value ends at in the key, by the rules the key
/// module documents: `None` last; `Some((t, true))` escaped for `%` and `t`;
/// `Some((t, false))` written as it is, refused if it holds `t`.
type RefEnd = Option<(char, bool)>;

/// Whether a value of `part`'s kind can hold `c`, and whether it is a path
/// (which is never escaped).
fn ref_can_hold(part: &RefPart, c: char) -> (bool, bool) {
    let path_char = c.is_ascii_alphanumeric() || "-._~!$&'()*+,;=:@/%".contains(c);
    match part {
        RefPart::Path | RefPart::Capture(_, true) => (path_char, true),
        RefPart::Capture(_, false) => (path_char && c != '/', true),
        RefPart::Host => (c.is_ascii_alphanumeric() || "-_.[]:".contains(c), false),
        RefPart::Header(_) => (c == '\t' || (' '..='~').contains(&c), false),
        _ => (true, false),
    }
}

/// Each part's end, or `None` when the template could render two requests
/// as one key: two placeholders with nothing between them (unless the second
/// is `{path}`), a path followed by a character it can hold, an escaped value
/// followed by '%' or a letter or digit.
fn ref_terminators(parts: &[RefPart]) -> Option<Vec<RefEnd>> {
    let mut ends = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        if let RefPart::Literal(l) = part {
            if l.contains('%') {
                return None;
            }
            ends.push(None);
            continue;
        }
        let t = match parts.get(i + 1) {
            None => {
                ends.push(None);
                continue;
            }
            Some(RefPart::Literal(l)) => l.chars().next()?,
            Some(RefPart::Path) => '/',
            Some(_) => return None,
        };
        let (holds, path) = ref_can_hold(part, t);
        if holds && (path || t == '%' || t.is_ascii_alphanumeric()) {
            return None;
        }
        ends.push(Some((t, holds)));
    }
    Some(ends)
}

fn ref_template_parts(text: &str, pattern: Option<&[RefSegment]>) -> Option<Vec<RefPart>> {
    let mut parts = Vec::new();
    let mut chars = text.chars();
    let mut literal = String::new();
    while let Some(c) = chars.next() {
        match c {
            '{' => {
                let mut inner = String::new();
                loop {
                    match chars.next()? {
                        '}' => break,
                        c => inner.push(c),
                    }
                }
                if !literal.is_empty() {
                    parts.push(RefPart::Literal(std::mem::take(&mut literal)));
                }
                parts.push(ref_placeholder(&inner, pattern)?);
            }
            '}' => return None,
            c => literal.push(c),
        }
    }
    if !literal.is_empty() {
        parts.push(RefPart::Literal(literal));
    }
    parts.iter().any(|p| !matches!(p, RefPart::Literal(_))).then_some(parts)
}

fn ref_placeholder(inner: &str, pattern: Option<&[RefSegment]>) -> Option<RefPart> {
    match inner {
        "path" => return Some(RefPart::Path),
        "host" => return Some(RefPart::Host),
        _ => {}
    }
    if let Some(name) = inner.strip_prefix("header.") {
        return HeaderName::from_bytes(name.as_bytes()).ok().map(RefPart::Header);
    }
    if let Some(name) = inner.strip_prefix("query.") {
        return (!name.is_empty()).then(|| RefPart::Query(name.to_string()));
    }
    pattern?.iter().filter(|s| !matches!(s, RefSegment::Literal(_))).enumerate().find_map(|(i, s)| match s {
        RefSegment::Capture(n) if n == inner => Some(RefPart::Capture(i, false)),
        RefSegment::Rest(n) if n == inner => Some(RefPart::Capture(i, true)),
        _ => None,
    })
}

/// Reference render: `Some(key)` exactly when `KeyTemplate::render` must succeed.
fn ref_render(parts: &[RefPart], segs: Option<&[RefSegment]>, uri: &Uri, headers: &HeaderMap) -> Option<String> {
    let captures = match segs {
        Some(segs) if parts.iter().any(|p| matches!(p, RefPart::Capture(..))) => Some(ref_captures(segs, uri.path())?),
        _ => None,
    };
    let ends = ref_terminators(parts)?;
    let mut key = String::new();
    for (part, end) in parts.iter().zip(ends) {
        let mut value = String::new();
        match part {
            RefPart::Literal(l) => value.push_str(l),
            RefPart::Path => value.push_str(uri.path()),
            RefPart::Host => {
                // The first Host header (a repeated Host is not refused): routing
                // has made the host canonical and put it there, whatever the
                // request spelled (an absolute-form target, HTTP/2 :authority).
                let host = headers.get_all(http::header::HOST).iter().next()?.to_str().ok()?.to_string();
                // Its name only: a virtual host is chosen by name, not by port.
                let name = match host.find(']') {
                    Some(end) if host.starts_with('[') => &host[..=end],
                    _ => host.rsplit_once(':').map_or(host.as_str(), |(name, _)| name),
                };
                value.push_str(&name.to_ascii_lowercase());
            }
            RefPart::Header(name) => {
                let values: Vec<&HeaderValue> = headers.get_all(name).iter().collect();
                let [one] = values.as_slice() else { return None };
                value.push_str(one.to_str().ok()?);
            }
            RefPart::Query(name) => {
                // Names and values decoded as web frameworks decode them.
                let query = uri.query().unwrap_or("");
                value.push_str(&ref_query_param(query, name).ok()??);
            }
            RefPart::Capture(i, _) => value.push_str(&captures.as_ref()?[*i]),
        }
        match end {
            None => key.push_str(&value),
            Some((t, false)) if value.contains(t) => return None,
            Some((_, false)) => key.push_str(&value),
            Some((t, true)) => {
                for c in value.chars() {
                    if c == '%' || c == t {
                        let mut buf = [0; 4];
                        key.extend(c.encode_utf8(&mut buf).bytes().map(|b| format!("%{b:02X}")));
                    } else {
                        key.push(c);
                    }
                }
            }
        }
    }
    Some(key)
}

/// `key_template` target. Fields: template, pattern (empty: none), request URI
/// (unparsable: `/`), then headers as `name:value` (invalid ones are skipped).
///
/// Oracles: `PathPattern::parse`, `KeyTemplate::parse` and `render` never
/// panic; both parses accept exactly what the reference parsers accept; the
/// rendered key equals the reference render; captures equal the brute-force
/// matcher's on the request path and on a path built from the pattern; the
/// default `{path}` template renders the URI path.
pub fn check_key_template(data: &[u8]) {
    let f = fields(data);
    let template = text(f[0]);
    let pattern_text = f.get(1).map(|b| text(b)).unwrap_or_default();
    let uri = f.get(2).and_then(|b| Uri::try_from(*b).ok()).unwrap_or_else(|| Uri::from_static("/"));
    let mut headers = HeaderMap::new();
    for field in f.iter().skip(3).take(8) {
        let Some(colon) = field.iter().position(|&b| b == b':') else { continue };
        let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(&field[..colon]), HeaderValue::from_bytes(&field[colon + 1..]))
        else {
            continue;
        };
        headers.append(name, value);
    }

    let (pattern, segs) = if pattern_text.is_empty() {
        (None, None)
    } else {
        let parsed = PathPattern::parse(&pattern_text);
        let segs = ref_pattern(&pattern_text);
        assert_eq!(parsed.is_ok(), segs.is_some(), "PathPattern::parse({pattern_text:?}) = {parsed:?}");
        match (parsed, segs) {
            (Ok(p), Some(s)) => (Some(p), Some(s)),
            _ => (None, None),
        }
    };
    if let (Some(pat), Some(segs)) = (&pattern, &segs) {
        assert_eq!(pat.source(), pattern_text);
        check_pattern(pat, segs, uri.path());
        let (example, caps) = ref_example(segs);
        assert_eq!(ref_captures(segs, &example).as_ref(), Some(&caps), "reference matcher on {example:?}");
        check_pattern(pat, segs, &example);
    }

    let parsed = KeyTemplate::parse(&template, pattern.as_ref());
    let reference = ref_template(&template, segs.as_deref());
    assert_eq!(
        parsed.is_ok(),
        reference.is_some(),
        "KeyTemplate::parse({template:?}, {pattern_text:?}) = {parsed:?}, reference {reference:?}"
    );
    if let (Ok(t), Some(parts)) = (&parsed, &reference) {
        let got = t.render(&uri, &headers);
        let want = ref_render(parts, segs.as_deref(), &uri, &headers);
        assert_eq!(got.as_ref().ok(), want.as_ref(), "render of {template:?} for {uri} with {headers:?}: {got:?}");
        if template == "{path}" {
            assert_eq!(got.as_deref(), Ok(uri.path()));
        }
    }

    let default = KeyTemplate::parse("{path}", pattern.as_ref()).expect("the default template parses");
    assert_eq!(default.render(&uri, &headers).as_deref(), Ok(uri.path()));
}

// ---------------------------------------------------------------------------
// route_match
// ---------------------------------------------------------------------------

/// A route with the config defaults, built once through the config loader so
/// that a new `Route` field does not break the harness.
fn base_route() -> &'static RouteConfig {
    static BASE: OnceLock<RouteConfig> = OnceLock::new();
    BASE.get_or_init(|| {
        let text = "[fences]\nstore = \"memory\"\n[[route]]\nname = \"base\"\nprefix = \"/\"\nupstream = \"http://127.0.0.1:1\"\n";
        Config::from_toml_str(text).expect("the base config is valid").routes[0].clone()
    })
}

fn route(name: String, prefix: String) -> Route {
    let mut r = base_route().clone();
    r.name = name.into();
    r.prefix = prefix;
    Route::detached(r)
}

/// Brute force: the config index of the route `find` must return for `path`,
/// the longest matching prefix, the first in config order among equal ones.
fn ref_find(prefixes: &[String], path: &str) -> Option<usize> {
    prefixes
        .iter()
        .enumerate()
        .filter(|(_, p)| path.starts_with(p.as_str()))
        .max_by_key(|(i, p)| (p.len(), Reverse(*i)))
        .map(|(i, _)| i)
}

fn check_upstream(text: &str) {
    let Ok(u) = UpstreamUrl::parse(text) else { return };
    assert!(!u.authority.host().is_empty(), "{text:?} parsed with an empty host");
    assert!(
        u.base_path.is_empty() || u.base_path.starts_with('/') && !u.base_path.ends_with('/'),
        "{text:?} gave base path {:?}",
        u.base_path
    );
    let root = u.uri_for("/").unwrap_or_else(|e| panic!("{text:?}: uri_for(\"/\") failed: {e}"));
    assert_eq!(root.authority(), Some(&u.authority));
    assert_eq!(root.path(), format!("{}/", u.base_path));
    if u.is_tls() {
        u.server_name().unwrap_or_else(|e| panic!("{text:?} parsed as https with no name to verify: {e}"));
    }
    let again = format!("{}://{}{}", u.scheme, u.authority, u.base_path);
    assert_eq!(UpstreamUrl::parse(&again).as_ref(), Ok(&u), "{text:?} does not round-trip through {again:?}");
}

/// `route_match` target. Fields: up to 16 route prefixes, then a request path
/// (the last field). Oracles: `find`/`find_indexed` agree with a brute-force
/// longest-prefix search for the path and for every prefix; `names` keeps the
/// config order; `UpstreamUrl::parse` on every field never panics and what it
/// accepts is usable (`uri_for` works, and the result round-trips).
pub fn check_route_match(data: &[u8]) {
    let f: Vec<String> = fields(data).into_iter().map(text).collect();
    for t in &f {
        check_upstream(t);
    }
    let (path, prefixes) = f.split_last().expect("split yields at least one field");
    let prefixes = &prefixes[..prefixes.len().min(16)];
    let routes = prefixes.iter().enumerate().map(|(i, p)| route(format!("r{i}"), p.clone()));
    let table = RouteTable::new(routes);

    let names: Vec<String> = table.names().iter().map(|n| n.to_string()).collect();
    let want: Vec<String> = (0..prefixes.len()).map(|i| format!("r{i}")).collect();
    assert_eq!(names, want, "names() must keep config order");

    for probe in prefixes.iter().chain(std::iter::once(path)) {
        let got = table.find_indexed(probe).map(|(i, r)| (i, r.prefix.clone(), r.name.to_string()));
        let want = ref_find(prefixes, probe).map(|i| (i, prefixes[i].clone(), format!("r{i}")));
        assert_eq!(got, want, "find_indexed({probe:?}) with prefixes {prefixes:?}");
        let found = table.find(probe).map(|r| r.name.to_string());
        assert_eq!(found, want.map(|(_, _, n)| n), "find({probe:?}) with prefixes {prefixes:?}");
    }

    // A request path that is a valid path-and-query always makes an upstream URI
    // (the http crate drops a '#fragment' from both alike).
    if let (true, Ok(pq)) = (path.starts_with('/'), PathAndQuery::try_from(path.as_str())) {
        let u = UpstreamUrl::parse("http://127.0.0.1:1/base/").expect("a valid upstream");
        let uri = u.uri_for(path).unwrap_or_else(|e| panic!("uri_for({path:?}) failed: {e}"));
        assert_eq!(uri.path_and_query().map(|pq| pq.as_str()), Some(format!("/base{pq}").as_str()), "{path:?}");
    }
}

// ---------------------------------------------------------------------------
// config
// ---------------------------------------------------------------------------

/// Reference `parse_size`: strip a known unit from the end, then the rest must
/// be ASCII digits whose value times the unit fits in a `u64`.
pub fn expected_size(text: &str) -> Option<u64> {
    const UNITS: [(&str, u128); 7] = [
        ("KiB", 1 << 10),
        ("MiB", 1 << 20),
        ("GiB", 1 << 30),
        ("KB", 1000),
        ("MB", 1_000_000),
        ("GB", 1_000_000_000),
        ("B", 1),
    ];
    let t = text.trim();
    let (number, scale) =
        UNITS.iter().find_map(|(unit, scale)| t.strip_suffix(unit).map(|n| (n.trim_end(), *scale))).unwrap_or((t, 1));
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut n: u128 = 0;
    for b in number.bytes() {
        n = n * 10 + u128::from(b - b'0');
        if n > u128::from(u64::MAX) {
            return None;
        }
    }
    u64::try_from(n * scale).ok()
}

fn check_size(text: &str) {
    assert_eq!(parse_size(text), expected_size(text), "parse_size({text:?})");
}

/// A file the config names that a fuzzer should not read: a device, FIFO or
/// directory-like thing, or something big (`/dev/zero`, `/dev/stdin`,
/// `/proc/kcore`). Reading those would hang or exhaust memory in the fuzzer, not
/// find a bug: the config is trusted operator input.
fn unsafe_to_read(path: &str) -> bool {
    match std::fs::metadata(path) {
        Ok(m) => !m.is_file() || m.len() > 1 << 20,
        Err(_) => false,
    }
}

/// `config` target: the input as UTF-8 text (other inputs are skipped).
///
/// Oracles: `parse_size` agrees with [`expected_size`] on the whole text and on
/// every line; `Config::from_toml_str` never panics; an error lists at least
/// one problem and displays; an accepted config has routes whose prefixes start
/// with '/', whose names and prefixes are unique, whose limits are positive,
/// and a route table that finds each route by its own prefix.
pub fn check_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    check_size(text);
    for line in text.lines() {
        check_size(line);
        if let Some((_, value)) = line.split_once('=') {
            check_size(value.trim().trim_matches('"'));
        }
    }

    if let Ok(file) = toml::from_str::<FileConfig>(text) {
        let mut named =
            file.admin.auth_token_file.iter().chain(file.routes.iter().filter_map(|r| r.signing_key_file.as_ref()));
        if named.any(|p| unsafe_to_read(p)) {
            return;
        }
    }

    let refused = |e: fencegate::config::ConfigError| {
        assert!(!e.problems.is_empty(), "an error without problems for {text:?}");
        let _ = e.to_string();
    };
    let validated = match Config::from_toml_str(text) {
        Ok(v) => v,
        Err(e) => return refused(e),
    };
    // Validation reads no file: a key the config names is still unread.
    for r in &validated.routes {
        assert!(r.signing_key.as_ref().is_none_or(|k| k.bytes().is_none()), "a key read by validation: {text:?}");
    }
    let config = match validated.read_secrets_with(None) {
        Ok(c) => c,
        Err(e) => return refused(e),
    };
    check_valid_config(&config, text);
}

fn check_valid_config(c: &Config, text: &str) {
    assert!(!c.routes.is_empty(), "accepted without routes: {text:?}");
    assert!(c.server.max_header_bytes >= 8192);
    assert!(c.server.max_connections >= 1);
    for d in [c.server.shutdown_grace, c.server.header_read_timeout, c.server.idle_timeout] {
        assert!(!d.is_zero(), "a zero server duration was accepted: {text:?}");
    }
    if let StoreKind::File { path, cache_keys, .. } = &c.fences.store {
        assert!(!path.as_os_str().is_empty());
        assert!(*cache_keys >= 1);
    }
    for (i, r) in c.routes.iter().enumerate() {
        assert!(r.prefix.starts_with('/'), "route prefix {:?} accepted: {text:?}", r.prefix);
        assert!(!r.name.trim().is_empty(), "a blank route name was accepted: {text:?}");
        for other in &c.routes[..i] {
            assert_ne!(r.name, other.name, "duplicate route names accepted: {text:?}");
            assert_ne!(r.prefix, other.prefix, "duplicate prefixes accepted: {text:?}");
        }
        assert!(r.max_body > 0);
        assert!(!r.timeout.is_zero() && !r.queue_timeout.is_zero());
        for (j, m) in r.safe_methods.iter().enumerate() {
            assert!(!r.safe_methods[..j].contains(m), "safe method {m} listed twice: {text:?}");
        }
        if let Some(k) = &r.signing_key {
            assert!(k.bytes().is_some_and(|b| b.len() >= 16), "a signing key unread or short: {text:?}");
        }
        if let Some(p) = r.key.pattern() {
            let lp = p.literal_prefix();
            assert!(lp.starts_with(r.prefix.as_str()) || r.prefix.starts_with(lp));
        }
        // Rendering a key for a request to the prefix itself must not panic.
        if let Ok(uri) = Uri::try_from(r.prefix.as_str()) {
            let _ = r.key.render(&uri, &HeaderMap::new());
        }
    }
    let table = RouteTable::new(c.routes.iter().cloned().map(Route::detached));
    for r in &c.routes {
        let found = table.find(&r.prefix).map(|f| f.name.clone());
        assert_eq!(found.as_ref(), Some(&r.name), "the route with prefix {:?} is not found by it", r.prefix);
    }
}

// ---------------------------------------------------------------------------
// journal
// ---------------------------------------------------------------------------

/// The fence store's journal replay, on raw bytes and on journal files built
/// from the input.
///
/// Input: the first byte picks a mode. Mode `0..=127` hands the rest to
/// `replay` as a file as it is: whatever the bytes, no panic. Otherwise the rest
/// is fields: the first field's first four bytes (u16 LE each, zero when short)
/// pick a cut point and a byte to damage; every further field is one batch,
/// its records separated by 0x00, each record's first byte its token and the
/// rest its key (lossy UTF-8). The oracle is computed from the batches, not by
/// the journal code:
/// - the whole file replays to the maximum token of each key;
/// - a file cut anywhere replays to the batches wholly before the cut, without
///   error (a torn tail is dropped);
/// - a byte of the last frame damaged: the other frames replay, without error;
///   a byte of an earlier frame damaged: an error (a good frame follows damage).
pub fn check_journal(data: &[u8]) {
    use fencegate::fence::store::journal::{image, replay, Marks, HEADER_BYTES};
    use std::collections::BTreeMap;

    let Some((&mode, rest)) = data.split_first() else { return };
    if mode < 128 {
        let _ = replay(rest, &mut Marks::default());
        return;
    }
    let fields = fields(rest);
    let picks = fields[0];
    let pick = |i: usize| u16::from_le_bytes([*picks.get(i).unwrap_or(&0), *picks.get(i + 1).unwrap_or(&0)]) as usize;
    let batches: Vec<Vec<(String, u64)>> = fields[1..]
        .iter()
        .map(|field| {
            field
                .split(|&b| b == 0)
                .filter_map(|record| record.split_first())
                .map(|(&token, key)| (text(key), u64::from(token) * 1_000_003))
                .collect()
        })
        .collect();
    let borrowed: Vec<Vec<(&str, u64)>> =
        batches.iter().map(|b| b.iter().map(|(k, t)| (k.as_str(), *t)).collect()).collect();
    let slices: Vec<&[(&str, u64)]> = borrowed.iter().map(|b| b.as_slice()).collect();
    let (bytes, ends) = image(0x5eed, &slices).expect("small batches encode");

    let expected = |frames: usize| -> BTreeMap<String, u64> {
        let mut marks = BTreeMap::new();
        for (key, token) in batches[..frames].iter().flatten() {
            let mark = marks.entry(key.clone()).or_insert(*token);
            *mark = (*mark).max(*token);
        }
        marks
    };
    let replayed = |bytes: &[u8]| -> Result<BTreeMap<String, u64>, String> {
        let mut marks = Marks::default();
        replay(bytes, &mut marks).map_err(|e| e.to_string())?;
        Ok(marks.into_iter().map(|(k, t)| (k.into_string(), t)).collect())
    };

    assert_eq!(replayed(&bytes), Ok(expected(batches.len())), "the whole file");

    let header = HEADER_BYTES as usize;
    let cut = header + pick(0) % (bytes.len() - header + 1);
    let whole = ends.iter().filter(|&&end| end <= cut).count();
    assert_eq!(replayed(&bytes[..cut]), Ok(expected(whole)), "cut at {cut} of {}", bytes.len());

    if bytes.len() > header {
        let at = header + pick(2) % (bytes.len() - header);
        let mut damaged = bytes.clone();
        damaged[at] ^= 0x41;
        let frame = ends.iter().filter(|&&end| end <= at).count();
        let outcome = replayed(&damaged);
        if frame + 1 == batches.len() {
            assert_eq!(outcome, Ok(expected(frame)), "damage at {at} in the last frame");
        } else {
            assert!(outcome.is_err(), "damage at {at} in frame {frame} of {} went unnoticed", batches.len());
        }
    }
}

// ---------------------------------------------------------------------------
// canonical
// ---------------------------------------------------------------------------

/// Every combination of the path switches; each input is checked under all
/// four. Escapes that are not UTF-8 are kept (`NonUtf8::Raw`), so the
/// reference resolves bytes; [`check_utf8_refusal`] checks the default,
/// which refuses them.
pub const PATH_OPTIONS: [PathOptions; 4] = [
    PathOptions { merge_slashes: true, escaped_slashes: EscapedSlashes::Reject, non_utf8: NonUtf8::Raw },
    PathOptions { merge_slashes: true, escaped_slashes: EscapedSlashes::Keep, non_utf8: NonUtf8::Raw },
    PathOptions { merge_slashes: false, escaped_slashes: EscapedSlashes::Reject, non_utf8: NonUtf8::Raw },
    PathOptions { merge_slashes: false, escaped_slashes: EscapedSlashes::Keep, non_utf8: NonUtf8::Raw },
];

/// With `non_utf8: Reject`, a path is refused exactly when its raw-mode
/// canonical form, fully percent-decoded, is not UTF-8 (ASCII bytes end every
/// run of high bytes, so the whole string is UTF-8 exactly when every run is);
/// otherwise both modes agree.
fn check_utf8_refusal(p: &str, options: PathOptions) {
    let strict = PathOptions { non_utf8: NonUtf8::Reject, ..options };
    let want = match canonical_path(p, options) {
        Ok(c) => {
            let decoded = ref_percent_decode(c.as_bytes());
            if std::str::from_utf8(&decoded).is_ok() {
                Ok(c)
            } else {
                Err(PathError::NotUtf8)
            }
        }
        Err(e) => Err(e),
    };
    assert_eq!(canonical_path(p, strict), want, "{p:?} with {strict:?}");
}

/// Every `%XX` with two hex digits as its byte, everything else as it is.
fn ref_percent_decode(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes.get(i + 1..i + 3).filter(|h| bytes[i] == b'%' && h.iter().all(u8::is_ascii_hexdigit)) {
            Some(h) => {
                out.push(u8::from_str_radix(std::str::from_utf8(h).unwrap(), 16).unwrap());
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    out
}

/// One unit of a path after the reference decoding: a byte, or an escape the
/// reference keeps apart from the raw character.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Byte(u8),
    Escaped(u8),
}

/// Characters whose escape the canonical form keeps apart from the raw
/// character on purpose: '/' and '\' when the route keeps escaped slashes (its
/// upstream does not decode them either). Every other escape names the byte
/// it encodes, as for a server that decodes the whole path (nginx does).
fn kept_escaped(b: u8, options: PathOptions) -> bool {
    matches!(b, b'/' | b'\\') && options.escaped_slashes == EscapedSlashes::Keep
}

/// The resource a server that resolves paths like nginx maps `path` to,
/// written without the code under test: decode every escape (but the
/// [`kept_escaped`] ones) to its byte, merge runs of '/' when the options
/// merge, then remove dot segments by the letter of RFC 3986 §5.2.4, refusing
/// (`None`) a `..` with nothing left to remove, as nginx does. Also `None`: a
/// path not starting with '/', and a '%' without two hex digits.
pub fn ref_resolve(path: &[u8], options: PathOptions) -> Option<Vec<Unit>> {
    let mut units = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < path.len() {
        if path[i] == b'%' {
            let hex = path.get(i + 1..i + 3).filter(|h| h.iter().all(u8::is_ascii_hexdigit))?;
            let value = u8::from_str_radix(std::str::from_utf8(hex).unwrap(), 16).unwrap();
            units.push(if kept_escaped(value, options) { Unit::Escaped(value) } else { Unit::Byte(value) });
            i += 3;
        } else {
            units.push(Unit::Byte(path[i]));
            i += 1;
        }
    }
    if units.first() != Some(&Unit::Byte(b'/')) {
        return None;
    }
    if options.merge_slashes {
        units.dedup_by(|b, a| *a == Unit::Byte(b'/') && *b == Unit::Byte(b'/'));
    }
    remove_dot_segments(&units)
}

/// RFC 3986 §5.2.4, rule by rule on units, with `None` for a `..` above the
/// root. The input buffer is `path[i..]`; a rule that leaves the input "/"
/// appends it to the output at once (rule E would).
fn remove_dot_segments(path: &[Unit]) -> Option<Vec<Unit>> {
    let slash = Unit::Byte(b'/');
    let dot = Unit::Byte(b'.');
    let mut output: Vec<Unit> = Vec::new();
    let mut i = 0;
    while i < path.len() {
        let input = &path[i..];
        if input.starts_with(&[dot, dot, slash]) {
            i += 3; // A
        } else if input.starts_with(&[dot, slash]) {
            i += 2; // A
        } else if input.starts_with(&[slash, dot, slash]) {
            i += 2; // B: "/./" -> "/"
        } else if input == [slash, dot] {
            output.push(slash); // B: "/." -> "/"
            break;
        } else if input.starts_with(&[slash, dot, dot, slash]) || input == [slash, dot, dot] {
            // C: "/../" -> "/", or a final "/.." -> "/"; the last output segment goes.
            let at = output.iter().rposition(|u| *u == slash)?;
            output.truncate(at);
            if input.len() == 3 {
                output.push(slash);
                break;
            }
            i += 3;
        } else if input == [dot] || input == [dot, dot] {
            break; // D
        } else {
            // E: the first segment, with its leading '/', moves to the output.
            let end = input.iter().skip(1).position(|u| *u == slash).map_or(input.len(), |p| p + 1);
            output.extend_from_slice(&input[..end]);
            i += end;
        }
    }
    Some(output)
}

/// The units written back as a path: escapes where a raw byte would not do.
fn render_units(units: &[Unit]) -> String {
    let mut out = String::new();
    for unit in units {
        match *unit {
            Unit::Byte(b) if b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/".contains(&b) => out.push(char::from(b)),
            Unit::Byte(b) | Unit::Escaped(b) => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// What every canonical path is, checked without the code under test.
fn check_canonical_form(c: &str, options: PathOptions) {
    let bytes = c.as_bytes();
    assert!(c.starts_with('/'), "canonical form {c:?} does not start with '/'");
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let hex = bytes.get(i + 1..i + 3).unwrap_or_else(|| panic!("{c:?}: a cut escape at {i}"));
            assert!(
                hex.iter().all(|h| h.is_ascii_digit() || (b'A'..=b'F').contains(h)),
                "{c:?}: escape at {i} is not upper-case hex"
            );
            let value = u8::from_str_radix(std::str::from_utf8(hex).unwrap(), 16).unwrap();
            assert!(
                !(value.is_ascii_alphanumeric() || b"-._~".contains(&value)),
                "{c:?}: an escaped unreserved character at {i}"
            );
            assert!(value >= 0x20 && value != 0x7F, "{c:?}: an escaped control byte at {i}");
            if options.escaped_slashes == EscapedSlashes::Reject {
                assert!(value != b'/' && value != b'\\', "{c:?}: an escaped slash kept under Reject");
            }
            i += 3;
        } else {
            assert!(
                b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/".contains(&b),
                "{c:?}: raw byte {b:#04x} at {i} a path cannot hold"
            );
            i += 1;
        }
    }
    let segments: Vec<&str> = c[1..].split('/').collect();
    for (n, segment) in segments.iter().enumerate() {
        assert!(*segment != "." && *segment != "..", "{c:?} has a dot segment");
        for dots in [".", ".."] {
            for parameter in [";", "%3B"] {
                assert!(!segment.starts_with(&format!("{dots}{parameter}")), "{c:?}: a dot segment with a parameter");
            }
        }
        if options.merge_slashes && n + 1 < segments.len() {
            assert!(!segment.is_empty(), "{c:?} has '//' although slashes merge");
        }
    }
}

/// A piece of a path being respelled: a raw byte, or an escape in either hex case.
#[derive(Debug, Clone, Copy)]
enum Piece {
    Raw(u8),
    Escape { value: u8, lower: bool },
}

fn pieces(path: &str) -> Vec<Piece> {
    let bytes = path.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes.get(i + 1..i + 3).filter(|h| h.iter().all(u8::is_ascii_hexdigit)) {
            Some(hex) if bytes[i] == b'%' => {
                let value = u8::from_str_radix(std::str::from_utf8(hex).unwrap(), 16).unwrap();
                out.push(Piece::Escape { value, lower: false });
                i += 3;
            }
            _ => {
                out.push(Piece::Raw(bytes[i]));
                i += 1;
            }
        }
    }
    out
}

fn render_pieces(pieces: &[Piece]) -> String {
    let mut out = String::new();
    for piece in pieces {
        match *piece {
            Piece::Raw(b) => out.push(char::from(b)),
            Piece::Escape { value, lower: false } => out.push_str(&format!("%{value:02X}")),
            Piece::Escape { value, lower: true } => out.push_str(&format!("%{value:02x}")),
        }
    }
    out
}

/// Another spelling of the canonical (ASCII) path `c` for the same resource,
/// made by the (op, pick) byte pairs of `script`: escape an unreserved
/// character, flip an escape's hex case, double a slash (only when slashes
/// merge), insert `./` or `x/../` after a slash, or write an escaped character a
/// path cannot hold raw (`%20` as a space: it is encoded back).
fn respell(c: &str, script: &[u8], options: PathOptions) -> String {
    let mut p = pieces(c);
    for step in script.chunks(2).take(16) {
        let (op, pick) = (step[0], usize::from(*step.get(1).unwrap_or(&0)));
        let candidates: Vec<usize> = (0..p.len())
            .filter(|&i| match (op % 6, p[i]) {
                (0, Piece::Raw(b)) => b.is_ascii_alphanumeric() || b"-._~".contains(&b),
                (1, Piece::Escape { .. }) => true,
                (2, Piece::Raw(b'/')) => options.merge_slashes,
                (3 | 4, Piece::Raw(b'/')) => true,
                (5, Piece::Escape { value, .. }) => b" \"#<>?[]^`{|}".contains(&value),
                _ => false,
            })
            .collect();
        if candidates.is_empty() {
            continue;
        }
        let at = candidates[pick % candidates.len()];
        match (op % 6, p[at]) {
            (0, Piece::Raw(b)) => p[at] = Piece::Escape { value: b, lower: pick & 1 == 1 },
            (1, Piece::Escape { value, lower }) => p[at] = Piece::Escape { value, lower: !lower },
            (2, _) => p.insert(at + 1, Piece::Raw(b'/')),
            (3, _) => p.splice(at + 1..at + 1, [Piece::Raw(b'.'), Piece::Raw(b'/')]).for_each(drop),
            (4, _) => p.splice(at + 1..at + 1, b"x/../".iter().map(|&b| Piece::Raw(b))).for_each(drop),
            (5, Piece::Escape { value, .. }) => p[at] = Piece::Raw(value),
            _ => unreachable!("candidates match their op"),
        }
    }
    render_pieces(&p)
}

/// The path oracles for one input path under one set of options.
fn check_path(p: &str, options: PathOptions) -> Option<String> {
    let got = canonical_path(p, options);
    let reference = ref_resolve(p.as_bytes(), options);
    let Ok(c) = &got else {
        return None;
    };
    check_canonical_form(c, options);
    match c {
        Cow::Borrowed(b) => assert_eq!(*b, p, "borrowed, yet not the input"),
        Cow::Owned(o) => assert_ne!(o, p, "{p:?} is canonical, yet it was copied"),
    }
    let again = canonical_path(c, options);
    assert!(matches!(&again, Ok(Cow::Borrowed(a)) if a == c), "not idempotent: {p:?} -> {c:?} -> {again:?}");
    let reference = reference.unwrap_or_else(|| panic!("{p:?} -> {c:?} accepted, but the reference refuses it"));
    assert_eq!(
        ref_resolve(c.as_bytes(), options).as_ref(),
        Some(&reference),
        "{p:?} -> {c:?} ({options:?}) names another resource"
    );
    Some(c.to_string())
}

/// `canonical` target. Fields: a request path, an authority, a respelling
/// script, a query string and a parameter name, a second request path.
///
/// Paths, under every combination of [`PATH_OPTIONS`]:
/// - an accepted path's canonical form is its own (idempotent, and borrowed:
///   the fast path recognises it), has no `//` (when merging), no dot segment,
///   no lower-case or unreserved or control escape, no raw byte a path cannot
///   hold; it is borrowed exactly when it equals the input;
/// - [`ref_resolve`], an independent nginx-like resolver, maps the input and
///   its canonical form to the same resource, and refuses nothing that
///   `canonical_path` accepts;
/// - inputs the reference maps to one resource (the two paths, the reference's
///   own rendering of each, and [`respell`]ings of the canonical form) get one
///   canonical form or a refusal; respellings are never refused.
///
/// Hosts: `canonical_host` equals an independent reference, is idempotent,
/// and gives the same answer for every spelling of the result (case, one
/// trailing dot, an empty, default or zero-padded port).
///
/// Queries: `query_param` equals a reference form decoder, and finds a name
/// spelled with escapes. `admin_key` is `canonical_path` with the default
/// options for keys starting with '/', and the key itself otherwise.
pub fn check_canonical(data: &[u8]) {
    let f = fields(data);
    let field = |i: usize| f.get(i).map(|b| text(b)).unwrap_or_default();
    let (path, authority, script, query, name, second) =
        (field(0), field(1), f.get(2).copied().unwrap_or_default(), field(3), field(4), field(5));

    for options in PATH_OPTIONS {
        check_utf8_refusal(&path, options);
        check_utf8_refusal(&second, options);
        let canonical = check_path(&path, options);
        let second_canonical = check_path(&second, options);

        // Same resource by the reference: same canonical form, or a refusal.
        let mut spellings = vec![(path.clone(), canonical.clone()), (second.clone(), second_canonical)];
        for p in [&path, &second] {
            if let Some(units) = ref_resolve(p.as_bytes(), options) {
                let rendered = render_units(&units);
                let c = check_path(&rendered, options);
                spellings.push((rendered, c));
            }
        }
        for (i, (p, c)) in spellings.iter().enumerate() {
            for (q, d) in &spellings[..i] {
                if let (Some(c), Some(d)) = (c, d) {
                    if ref_resolve(p.as_bytes(), options) == ref_resolve(q.as_bytes(), options) {
                        assert_eq!(c, d, "{p:?} and {q:?} name one resource ({options:?})");
                    }
                }
            }
        }

        // Respellings of a canonical path: the input's, or a plain one made from it.
        let base = canonical.unwrap_or_else(|| {
            let plain: String =
                path.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '/').take(64).collect::<String>();
            let plain = format!("/{plain}");
            canonical_path(&plain, options)
                .unwrap_or_else(|e| panic!("{plain:?} is only letters, digits and '/', yet refused: {e}"))
                .into_owned()
        });
        let respelled = respell(&base, script, options);
        assert_eq!(
            ref_resolve(respelled.as_bytes(), options),
            ref_resolve(base.as_bytes(), options),
            "harness: {respelled:?} is not a respelling of {base:?}"
        );
        let got = canonical_path(&respelled, options);
        assert_eq!(got.as_deref(), Ok(base.as_str()), "{respelled:?} respells {base:?} ({options:?})");
    }

    for p in [&path, &second] {
        // Escapes that are not UTF-8 stay as typed: the keys of a raw route can be named.
        let options = PathOptions { non_utf8: NonUtf8::Raw, ..PathOptions::default() };
        let want = if p.starts_with('/') { canonical_path(p, options) } else { Ok(Cow::Borrowed(&**p)) };
        assert_eq!(admin_key(p), want, "admin_key({p:?})");
    }

    for default_port in [80, 443] {
        check_host(&authority, default_port);
    }
    check_query(&query, &name);
}

/// Reference host canonicalization: `Some(form)` exactly when `canonical_host`
/// must accept `authority`.
pub fn ref_host(authority: &str, default_port: u16) -> Option<String> {
    let (host, port) = if authority.starts_with('[') {
        let end = authority.find(']')?;
        authority.split_at(end + 1)
    } else {
        authority.split_at(authority.find(':').unwrap_or(authority.len()))
    };
    let port = match port {
        "" | ":" => None,
        _ => {
            let digits = port.strip_prefix(':')?;
            if !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let n = digits.bytes().fold(0u64, |n, b| (n * 10 + u64::from(b - b'0')).min(1 << 20));
            if n == 0 || n > 65535 {
                return None;
            }
            (n != u64::from(default_port)).then_some(n)
        }
    };
    let host = if let Some(inside) = host.strip_prefix('[') {
        let address: std::net::Ipv6Addr = inside.strip_suffix(']')?.parse().ok()?;
        format!("[{address}]")
    } else {
        let lower = host.to_ascii_lowercase();
        let name = lower.strip_suffix('.').unwrap_or(&lower);
        let labels_ok = name
            .split('.')
            .all(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
        if !labels_ok {
            return None;
        }
        name.to_string()
    };
    Some(match port {
        Some(n) => format!("{host}:{n}"),
        None => host,
    })
}

fn check_host(authority: &str, default_port: u16) {
    let got = canonical_host(authority, default_port);
    assert_eq!(
        got.as_deref().ok(),
        ref_host(authority, default_port).as_deref(),
        "canonical_host({authority:?}, {default_port}) = {got:?}"
    );
    let Ok(c) = got else { return };
    match &c {
        Cow::Borrowed(b) => assert_eq!(*b, authority),
        Cow::Owned(o) => assert_ne!(o, authority, "{authority:?} is canonical, yet it was copied"),
    }
    let again = canonical_host(&c, default_port);
    assert!(matches!(&again, Ok(Cow::Borrowed(a)) if *a == c), "not idempotent: {authority:?} -> {c:?} -> {again:?}");

    // Every spelling of the result names the same virtual host.
    let (host, port) = match c.rfind(':') {
        Some(at) if !c[at..].contains(']') => (&c[..at], Some(&c[at + 1..])),
        _ => (&*c, None),
    };
    assert!(port.is_none_or(|p| !p.starts_with('0') && p != default_port.to_string()), "{c:?}: port not canonical");
    assert!(!host.ends_with('.') && !host.bytes().any(|b| b.is_ascii_uppercase()), "{c:?}: host not canonical");
    let ports: Vec<String> = match port {
        Some(p) => vec![format!(":{p}"), format!(":0{p}"), format!(":000{p}")],
        None => vec![String::new(), ":".into(), format!(":{default_port}"), format!(":00{default_port}")],
    };
    for name in [host.to_string(), host.to_ascii_uppercase()] {
        let dotted = format!("{name}.");
        let names: &[&str] = if host.starts_with('[') { &[&name] } else { &[&name, &dotted] };
        for name in names {
            for port in &ports {
                let spelling = format!("{name}{port}");
                assert_eq!(canonical_host(&spelling, default_port).as_deref(), Ok(&*c), "{spelling:?} spells {c:?}");
            }
        }
    }
}

/// Reference form decoding of one name or value: '+' is a space, `%XX` a byte
/// (a '%' without two hex digits is itself).
fn ref_query_decode(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).filter(|h| h.iter().all(u8::is_ascii_hexdigit));
        match (bytes[i], hex) {
            (b'%', Some(h)) => {
                out.push(u8::from_str_radix(std::str::from_utf8(h).unwrap(), 16).unwrap());
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

/// Reference `query_param_with`: pairs read left to right, the first problem
/// found is the answer (a name that is not UTF-8 and, in raw mode, reads as
/// `name` with U+FFFD; a second `name`); then the value's control bytes, and
/// its bytes as text (refused, or written one to one in raw mode).
fn ref_query_param_with(query: &str, name: &str, non_utf8: NonUtf8) -> Result<Option<String>, QueryError> {
    let mut found = None;
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (n, v) = pair.split_once('=').unwrap_or((pair, ""));
        let n = ref_query_decode(n);
        let is_name = match String::from_utf8(n.clone()) {
            Ok(text) => text == name,
            Err(_) if non_utf8 == NonUtf8::Reject || String::from_utf8_lossy(&n) == name => {
                return Err(QueryError::NameNotUtf8)
            }
            Err(_) => false,
        };
        if is_name && found.replace(v).is_some() {
            return Err(QueryError::Repeated);
        }
    }
    let Some(v) = found else { return Ok(None) };
    let bytes = ref_query_decode(v);
    if bytes.iter().any(|b| b.is_ascii_control()) {
        return Err(QueryError::ControlByte);
    }
    if non_utf8 == NonUtf8::Reject {
        return String::from_utf8(bytes).map(Some).map_err(|_| QueryError::ValueNotUtf8);
    }
    // Raw: text as it is but '%' escaped, every other byte as %XX.
    let mut out = String::new();
    let mut rest = &bytes[..];
    while !rest.is_empty() {
        let (text, bad) = match std::str::from_utf8(rest) {
            Ok(text) => (text, 0),
            Err(e) => (
                std::str::from_utf8(&rest[..e.valid_up_to()]).unwrap(),
                e.error_len().unwrap_or(rest.len() - e.valid_up_to()),
            ),
        };
        out.push_str(&text.replace('%', "%25"));
        for b in &rest[text.len()..text.len() + bad] {
            out.push_str(&format!("%{b:02X}"));
        }
        rest = &rest[text.len() + bad..];
    }
    Ok(Some(out))
}

fn ref_query_param(query: &str, name: &str) -> Result<Option<String>, QueryError> {
    ref_query_param_with(query, name, NonUtf8::Reject)
}

fn check_query(query: &str, name: &str) {
    let got = query_param(query, name).map(|v| v.map(Cow::into_owned));
    assert_eq!(got, ref_query_param(query, name), "query_param({query:?}, {name:?})");
    let got = query_param_with(query, name, NonUtf8::Raw).map(|v| v.map(Cow::into_owned));
    assert_eq!(got, ref_query_param_with(query, name, NonUtf8::Raw), "raw query_param({query:?}, {name:?})");
    // The name spelled with escapes, in both hex cases, is the same name.
    let escaped: String = name.bytes().map(|b| format!("%{b:02X}")).collect();
    let lower: String = name.bytes().map(|b| format!("%{b:02x}")).collect();
    assert_eq!(query_param(&format!("{escaped}=v"), name), Ok(Some(Cow::Borrowed("v"))), "{escaped:?}");
    assert_eq!(query_param(&format!("{escaped}=v&{lower}=w"), name), Err(QueryError::Repeated), "{lower:?}");
}
