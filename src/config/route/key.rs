//! Fence key templates such as `{header.x-tenant}:{path}`: parsed once at config
//! time, so rendering a key on the hot path is a walk over a short slice with no
//! parsing.
//!
//! # One key, one request: rendering is injective
//!
//! Two requests that differ in any placeholder's value never render one key,
//! even when a value holds the template's own separators (a tenant `a:/x`
//! with path `/y`, and a tenant `a` with path `/x:/y`, would both render
//! `a:/x:/y` by plain concatenation). Each placeholder followed by something
//! has a *terminator*: the first character of the literal after it, or `/`
//! when `{path}` follows it directly (a canonical path starts with `/`).
//! - When the placeholder's kind can never hold its terminator (a `{host}`
//!   has no `/`, a `{name}` capture has no `/`), its value is written as it
//!   is, and a value that holds it anyway is refused (400 `bad-key`).
//! - Otherwise (a header or query value, a host before `:`), every `%` and
//!   every terminator in the value is percent-escaped (`%25`, `%3A`, hex
//!   upper-case, each byte of a non-ASCII terminator): the value then holds
//!   no terminator, and its escapes read back one way.
//! - The last placeholder takes the rest of the key and is written as it is.
//!
//! So a key is read back left to right: literals as they are, each value up
//! to its terminator, the last one to the end. Keys of templates that were
//! unambiguous keep their old form (`{path}`, `{host}{path}`,
//! `{bucket}/{object*}`, a `{header.x}:{path}` whose values hold no `:` or
//! `%`). Refused at config time, naming the fix: two placeholders with
//! nothing between them (unless the second is `{path}`); a `{path}`,
//! `{name}` or `{name*}` followed by a character a path can hold (escaping
//! the path would give the fence API, which reads keys that start with `/`
//! as paths, another key); an escaped value followed by a letter, a digit
//! or `%` (its own escapes are made of those); and a literal `%`.

use std::borrow::Cow;

use http::{HeaderMap, HeaderName, Uri};

use super::PathPattern;
use crate::canonical::{query_param_with, NonUtf8, QueryError};

/// A fence key template such as `{header.x-tenant}:{path}`, parsed once.
///
/// The template holds the route's [`PathPattern`], so a `{name}` part always
/// has the pattern it captures from: rendering needs nothing else from the route.
/// Rendering is injective (see the module docs): two requests that differ in
/// a placeholder's value get two keys.
#[derive(Debug, Clone)]
pub struct KeyTemplate {
    parts: Vec<KeyPart>,
    /// The route's pattern: every `{name}` part is one of its captures.
    pattern: Option<PathPattern>,
    /// How a `{query.NAME}` value that is not UTF-8 is read.
    non_utf8: NonUtf8,
}

#[derive(Debug, Clone)]
enum KeyPart {
    Literal(String),
    Value { source: Source, end: End },
}

/// Where a placeholder's value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    Path,
    Host,
    Header(HeaderName),
    Query(String),
    /// The capture at this index in the pattern's captures; `true` for a
    /// `{name*}` rest, which may hold `/`.
    Capture(usize, bool),
}

/// What separates a value from what follows it in the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Nothing follows: the value takes the rest of the key.
    Last,
    /// The value's kind never holds this terminator; a value that does is refused.
    Never(char),
    /// `%` and this terminator are percent-escaped in the value.
    Escaped(char),
}

/// Why a key template was refused at config time, saying how to fix it;
/// each variant keeps the template as written, and a placeholder with its braces.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("'{0}': a '{{' is never closed")]
    Unclosed(String),
    #[error("'{0}': a '}}' has no opening '{{'")]
    Unopened(String),
    #[error("'{0}': a literal '%' would read as the start of a percent escape in the key; use another separator")]
    LiteralPercent(String),
    #[error("'{0}' has no placeholder, so every request would share one key")]
    NoPlaceholder(String),
    /// A `{header.NAME}` whose name is no header name.
    #[error("'{template}': '{{header.{name}}}' does not name a valid header")]
    BadHeader { template: String, name: String },
    #[error("'{0}': '{{query.}}' needs a parameter name")]
    NoQueryName(String),
    /// A placeholder that is none of the kinds and no capture of the route's pattern.
    #[error(
        "'{template}': {placeholder} is not {{path}}, {{host}}, {{header.NAME}}, {{query.NAME}} or a capture of \
         pattern '{pattern}'"
    )]
    NotACapture { template: String, placeholder: String, pattern: String },
    /// A placeholder that is none of the kinds, on a route without a pattern.
    #[error(
        "'{template}': {placeholder} is not {{path}}, {{host}}, {{header.NAME}} or {{query.NAME}} (named segments \
         need a route `pattern`)"
    )]
    NoPattern { template: String, placeholder: String },
    /// Two placeholders with nothing between them (the second not `{path}`).
    #[error(
        "'{template}': {first} and {second} have nothing between them, so their values could run together; put a \
         separator between them, such as ':'"
    )]
    RunTogether { template: String, first: String, second: String },
    /// A path, which is never escaped, followed by a character a path can hold.
    #[error(
        "'{template}': {placeholder} is followed by '{separator}', which a path can hold, so the key could be read \
         two ways; put {placeholder} last, or follow it with a character a path never holds, such as '|' or a space"
    )]
    PathSeparator { template: String, placeholder: String, separator: char },
    /// An escaped value followed by `%`, a letter or a digit, which its escapes are made of.
    #[error(
        "'{separator}' after {placeholder} in '{template}' cannot separate it: the value's escapes are made of '%', \
         letters and digits; separate it with punctuation, such as ':'"
    )]
    EscapeSeparator { template: String, placeholder: String, separator: char },
}

/// What a key template reads from a request, as a refusal names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyInput {
    /// The `Host` header, for `{host}`.
    Host,
    /// The header a `{header.NAME}` reads.
    Header(HeaderName),
    /// The query parameter a `{query.NAME}` reads, by its decoded name.
    Query(String),
}

impl std::fmt::Display for KeyInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyInput::Host => f.write_str("Host header"),
            KeyInput::Header(name) => write!(f, "header '{name}'"),
            KeyInput::Query(name) => write!(f, "query parameter '{name}'"),
        }
    }
}

/// Why a key could not be made for a request (the request gets a 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("the request has no {0}, which the route's key template needs")]
    Missing(KeyInput),
    /// There, but not text: a header value with bytes outside visible ASCII.
    #[error("the request has no readable {0}, which the route's key template needs")]
    Unreadable(KeyInput),
    #[error("the request has more than one {0}; the route's key template needs exactly one")]
    Repeated(KeyInput),
    #[error("the query parameter '{name}' cannot be keyed: {error}")]
    Query { name: String, error: QueryError },
    #[error("the {part} holds '{separator}', which separates it from the rest of the fence key")]
    Separator { part: String, separator: char },
    #[error("the path does not match the route's pattern '{0}'")]
    PatternMismatch(String),
    #[error("the fence key is {len} bytes long; [fences] max_key_bytes allows {max}")]
    TooLong { len: usize, max: usize },
}

impl Source {
    /// Whether a value of this kind can hold `c`.
    fn can_hold(&self, c: char) -> bool {
        match self {
            // A canonical path: unreserved characters, sub-delims, ':', '@',
            // '/', and '%' starting an escape; everything else is escaped.
            Source::Path | Source::Capture(_, true) => is_path_char(c),
            Source::Capture(_, false) => c != '/' && is_path_char(c),
            // A canonical host's name: letters, digits, '-', '_', '.', or an
            // IPv6 literal in brackets.
            Source::Host => c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '[' | ']' | ':'),
            // A header value read as text: visible ASCII, space and tab.
            Source::Header(_) => c == '\t' || c == ' ' || c.is_ascii_graphic(),
            Source::Query(_) => true,
        }
    }

    /// A value read as a path: escaping it would change what it names.
    fn is_path(&self) -> bool {
        matches!(self, Source::Path | Source::Capture(..))
    }
}

fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "-._~!$&'()*+,;=:@/%".contains(c)
}

impl KeyTemplate {
    /// Whether the key is made, in part, from header `name`.
    pub fn reads_header(&self, name: &HeaderName) -> bool {
        self.parts.iter().any(|part| matches!(part, KeyPart::Value { source: Source::Header(h), .. } if h == name))
    }

    /// Parses a template; `{name}` parts must be captures of `pattern`, which
    /// the template keeps. A template that could render two requests as one
    /// key is refused, the message saying how to fix it (see the module docs).
    pub fn parse(text: &str, pattern: Option<&PathPattern>) -> Result<KeyTemplate, TemplateError> {
        // Each part, with the placeholder's text for messages.
        let mut parsed: Vec<(Option<Source>, &str)> = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            match rest.find('{') {
                Some(0) => {
                    let end = rest.find('}').ok_or_else(|| TemplateError::Unclosed(text.to_string()))?;
                    let inner = &rest[1..end];
                    parsed.push((Some(Self::placeholder(text, inner, pattern)?), &rest[..end + 1]));
                    rest = &rest[end + 1..];
                }
                found => {
                    let end = found.unwrap_or(rest.len());
                    let lit = &rest[..end];
                    if lit.contains('}') {
                        return Err(TemplateError::Unopened(text.to_string()));
                    }
                    if lit.contains('%') {
                        return Err(TemplateError::LiteralPercent(text.to_string()));
                    }
                    parsed.push((None, lit));
                    rest = &rest[end..];
                }
            }
        }
        if parsed.iter().all(|(source, _)| source.is_none()) {
            return Err(TemplateError::NoPlaceholder(text.to_string()));
        }
        let mut parts = Vec::with_capacity(parsed.len());
        for (i, (source, shown)) in parsed.iter().enumerate() {
            let Some(source) = source else {
                parts.push(KeyPart::Literal(shown.to_string()));
                continue;
            };
            let terminator = match parsed.get(i + 1) {
                None => None,
                Some((None, lit)) => lit.chars().next(),
                Some((Some(Source::Path), _)) => Some('/'),
                Some((Some(_), next)) => {
                    return Err(TemplateError::RunTogether {
                        template: text.to_string(),
                        first: shown.to_string(),
                        second: next.to_string(),
                    })
                }
            };
            let end = match terminator {
                None => End::Last,
                Some(t) if !source.can_hold(t) => End::Never(t),
                Some(t) if source.is_path() => {
                    return Err(TemplateError::PathSeparator {
                        template: text.to_string(),
                        placeholder: shown.to_string(),
                        separator: t,
                    })
                }
                Some(t) if t == '%' || t.is_ascii_alphanumeric() => {
                    return Err(TemplateError::EscapeSeparator {
                        template: text.to_string(),
                        placeholder: shown.to_string(),
                        separator: t,
                    })
                }
                Some(t) => End::Escaped(t),
            };
            parts.push(KeyPart::Value { source: source.clone(), end });
        }
        Ok(KeyTemplate { parts, pattern: pattern.cloned(), non_utf8: NonUtf8::Reject })
    }

    /// The template, with the route's `non_utf8` choice for `{query.NAME}`
    /// values (refused by default, see [`query_param_with`]).
    pub fn with_non_utf8(self, non_utf8: NonUtf8) -> KeyTemplate {
        KeyTemplate { non_utf8, ..self }
    }

    fn placeholder(text: &str, inner: &str, pattern: Option<&PathPattern>) -> Result<Source, TemplateError> {
        if inner == "path" {
            return Ok(Source::Path);
        }
        if inner == "host" {
            return Ok(Source::Host);
        }
        if let Some(name) = inner.strip_prefix("header.") {
            return HeaderName::from_bytes(name.as_bytes())
                .map(Source::Header)
                .map_err(|_| TemplateError::BadHeader { template: text.to_string(), name: name.to_string() });
        }
        if let Some(name) = inner.strip_prefix("query.") {
            if name.is_empty() {
                return Err(TemplateError::NoQueryName(text.to_string()));
            }
            return Ok(Source::Query(name.to_string()));
        }
        let placeholder = format!("{{{inner}}}");
        match pattern {
            Some(pat) => pat.capture_index(inner).map(|(i, rest)| Source::Capture(i, rest)).ok_or_else(|| {
                TemplateError::NotACapture {
                    template: text.to_string(),
                    placeholder,
                    pattern: pat.source().to_string(),
                }
            }),
            None => Err(TemplateError::NoPattern { template: text.to_string(), placeholder }),
        }
    }

    /// The route's pattern, as given to [`parse`](Self::parse).
    pub fn pattern(&self) -> Option<&PathPattern> {
        self.pattern.as_ref()
    }

    /// Renders the key for a request.
    pub fn render(&self, uri: &Uri, headers: &HeaderMap) -> Result<String, KeyError> {
        self.render_target(uri.path(), uri.query(), headers).map(Cow::into_owned)
    }

    /// Renders the key for a request target given as its path and query.
    /// Query parameters are decoded as web frameworks decode them
    /// ([`query_param_with`]); the `Host` header is used as it is (routing made it
    /// canonical).
    pub(super) fn render_target<'a>(
        &self,
        path: &'a str,
        query: Option<&str>,
        headers: &HeaderMap,
    ) -> Result<Cow<'a, str>, KeyError> {
        // The default `{path}` template is the hot case: no captures, the
        // path itself (the caller makes the one copy the key needs).
        if let [KeyPart::Value { source: Source::Path, end: End::Last }] = self.parts.as_slice() {
            return Ok(Cow::Borrowed(path));
        }
        let mismatch = || KeyError::PatternMismatch(self.pattern.as_ref().map_or("", |p| p.source()).to_string());
        let captures = match &self.pattern {
            Some(pat) if self.parts.iter().any(|p| matches!(p, KeyPart::Value { source: Source::Capture(..), .. })) => {
                pat.captures(path).ok_or_else(mismatch)?
            }
            _ => Vec::new(),
        };
        let mut key = String::new();
        for part in &self.parts {
            let (source, end) = match part {
                KeyPart::Literal(l) => {
                    key.push_str(l);
                    continue;
                }
                KeyPart::Value { source, end } => (source, *end),
            };
            let value: Cow<'_, str> = match source {
                Source::Path => Cow::Borrowed(path),
                Source::Host => match headers.get(http::header::HOST) {
                    Some(host) => {
                        let host = host.to_str().map_err(|_| KeyError::Unreadable(KeyInput::Host))?;
                        Cow::Owned(host_name(host).to_ascii_lowercase())
                    }
                    None => return Err(KeyError::Missing(KeyInput::Host)),
                },
                Source::Header(name) => {
                    let input = || KeyInput::Header(name.clone());
                    let mut values = headers.get_all(name).iter();
                    let value = values.next().ok_or_else(|| KeyError::Missing(input()))?;
                    if values.next().is_some() {
                        return Err(KeyError::Repeated(input()));
                    }
                    Cow::Borrowed(value.to_str().map_err(|_| KeyError::Unreadable(input()))?)
                }
                Source::Query(name) => match query_param_with(query.unwrap_or(""), name, self.non_utf8) {
                    Ok(Some(value)) => value,
                    Ok(None) => return Err(KeyError::Missing(KeyInput::Query(name.clone()))),
                    Err(QueryError::Repeated) => return Err(KeyError::Repeated(KeyInput::Query(name.clone()))),
                    Err(error) => return Err(KeyError::Query { name: name.clone(), error }),
                },
                // `parse` took the index from the pattern, which yields every capture on a match.
                Source::Capture(i, _) => Cow::Borrowed(*captures.get(*i).ok_or_else(mismatch)?),
            };
            push_value(&mut key, &value, end)
                .map_err(|separator| KeyError::Separator { part: source.describe(&self.pattern), separator })?;
        }
        Ok(Cow::Owned(key))
    }
}

impl Source {
    /// The value's name in a refusal: "path", "header 'x-tenant'".
    fn describe(&self, pattern: &Option<PathPattern>) -> String {
        match self {
            Source::Path => "path".into(),
            Source::Host => "host".into(),
            Source::Header(name) => format!("header '{name}'"),
            Source::Query(name) => format!("query parameter '{name}'"),
            Source::Capture(..) => format!("capture of pattern '{}'", pattern.as_ref().map_or("", |p| p.source())),
        }
    }
}

/// Writes one value into the key as its `end` says; `Err(terminator)` when a
/// value of a kind that never holds its terminator holds it.
fn push_value(key: &mut String, value: &str, end: End) -> Result<(), char> {
    match end {
        End::Last => key.push_str(value),
        End::Never(t) if value.contains(t) => return Err(t),
        End::Never(_) => key.push_str(value),
        End::Escaped(t) if !value.contains(['%', t]) => key.push_str(value),
        End::Escaped(t) => {
            for c in value.chars() {
                if c == '%' || c == t {
                    let mut utf8 = [0; 4];
                    for b in c.encode_utf8(&mut utf8).bytes() {
                        key.push('%');
                        key.push(char::from(HEX_UPPER[usize::from(b >> 4)]));
                        key.push(char::from(HEX_UPPER[usize::from(b & 0xF)]));
                    }
                } else {
                    key.push(c);
                }
            }
        }
    }
    Ok(())
}

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

/// The name part of a `Host` value, without its port: servers choose a
/// virtual host by name (nginx picks `a.example` for `a.example:8080` too), so
/// the port must not give one resource a second key.
fn host_name(host: &str) -> &str {
    match host.strip_prefix('[') {
        Some(literal) => literal.find(']').map_or(host, |end| &host[..end + 2]),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn render(template: &str, pattern: Option<&str>, uri: &str, headers: &[(&str, &str)]) -> Result<String, KeyError> {
        let pat = pattern.map(|p| PathPattern::parse(p).unwrap());
        let t = KeyTemplate::parse(template, pat.as_ref()).unwrap();
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        t.render(&uri.parse().unwrap(), &h)
    }

    #[test]
    fn key_templates_render_each_placeholder() {
        assert_eq!(render("{path}", None, "/objects/a?v=2", &[]).unwrap(), "/objects/a");
        // The host's name: a virtual host is chosen by name, whatever the port.
        assert_eq!(render("{host}{path}", None, "/a", &[("host", "store.example:8080")]).unwrap(), "store.example/a");
        assert_eq!(render("{host}", None, "/a", &[("host", "store.example")]).unwrap(), "store.example");
        assert_eq!(render("{host}", None, "/a", &[("host", "[2001:db8::1]:8080")]).unwrap(), "[2001:db8::1]");
        assert_eq!(render("t={header.x-tenant}:{path}", None, "/a", &[("x-tenant", "acme")]).unwrap(), "t=acme:/a");
        assert_eq!(render("{query.id}", None, "/a?x=1&id=42", &[]).unwrap(), "42");
        assert_eq!(render("{query.id}", None, "/a?id", &[]).unwrap(), "");
        // Decoded as frameworks decode them: names and values.
        assert_eq!(render("{query.id}", None, "/a?id=%37", &[]).unwrap(), "7");
        assert_eq!(render("{query.id}", None, "/a?x=1&%69d=a+b", &[]).unwrap(), "a b");
        assert_eq!(
            render(
                "{bucket}/{object}",
                Some("/buckets/{bucket}/objects/{object*}"),
                "/buckets/b1/objects/x/y.txt",
                &[]
            )
            .unwrap(),
            "b1/x/y.txt"
        );
    }

    #[test]
    fn key_templates_refuse_missing_or_repeated_parts() {
        let tenant = || KeyInput::Header(HeaderName::from_static("x-tenant"));
        let id = || KeyInput::Query("id".into());
        assert_eq!(render("{header.x-tenant}", None, "/a", &[]), Err(KeyError::Missing(tenant())));
        assert_eq!(
            render("{header.x-tenant}", None, "/a", &[("x-tenant", "a"), ("x-tenant", "b")]),
            Err(KeyError::Repeated(tenant()))
        );
        assert_eq!(render("{query.id}", None, "/a?id=1&id=2", &[]), Err(KeyError::Repeated(id())));
        assert_eq!(render("{query.id}", None, "/a?idx=1", &[]), Err(KeyError::Missing(id())));
        assert_eq!(render("{query.id}", None, "/a?i%64=7&id=fresh", &[]), Err(KeyError::Repeated(id())));
        assert_eq!(render("{host}", None, "/a", &[]), Err(KeyError::Missing(KeyInput::Host)));
        let mut latin1 = HeaderMap::new();
        latin1.insert("x-tenant", HeaderValue::from_bytes(b"caf\xe9").unwrap());
        let t = KeyTemplate::parse("{header.x-tenant}", None).unwrap();
        assert_eq!(t.render(&"/a".parse().unwrap(), &latin1), Err(KeyError::Unreadable(tenant())));
        // What a client reads in the problem's detail.
        assert_eq!(
            KeyError::Unreadable(KeyInput::Host).to_string(),
            "the request has no readable Host header, which the route's key template needs"
        );
        assert_eq!(
            KeyError::Repeated(id()).to_string(),
            "the request has more than one query parameter 'id'; the route's key template needs exactly one"
        );
        let p = "/buckets/{bucket}/objects/{object*}";
        assert!(matches!(render("{bucket}", Some(p), "/buckets/b1", &[]), Err(KeyError::PatternMismatch(_))));
        assert!(matches!(render("{bucket}", Some(p), "/buckets//objects/x", &[]), Err(KeyError::PatternMismatch(_))));
        assert!(matches!(render("{bucket}", Some(p), "/buckets/b/objects/", &[]), Err(KeyError::PatternMismatch(_))));
    }

    #[test]
    fn key_template_parse_errors() {
        let refused = |text: &str| KeyTemplate::parse(text, None).unwrap_err();
        assert_eq!(refused("{path"), TemplateError::Unclosed("{path".into()));
        assert_eq!(refused("path}"), TemplateError::Unopened("path}".into()));
        assert_eq!(refused("static"), TemplateError::NoPlaceholder("static".into()));
        assert_eq!(refused("{query.}"), TemplateError::NoQueryName("{query.}".into()));
        assert_eq!(
            refused("{header.a b}"),
            TemplateError::BadHeader { template: "{header.a b}".into(), name: "a b".into() }
        );
        assert_eq!(refused("{header.a b}").to_string(), "'{header.a b}': '{header.a b}' does not name a valid header");
        assert_eq!(
            refused("{bucket}").to_string(),
            "'{bucket}': {bucket} is not {path}, {host}, {header.NAME} or {query.NAME} (named segments need a route \
             `pattern`)"
        );
        let pattern = PathPattern::parse("/b/{b}").unwrap();
        assert_eq!(
            KeyTemplate::parse("{x}", Some(&pattern)).unwrap_err(),
            TemplateError::NotACapture { template: "{x}".into(), placeholder: "{x}".into(), pattern: "/b/{b}".into() }
        );
    }

    #[test]
    fn templates_that_cannot_render_injectively_are_refused() {
        let refused = |template: &str, pattern: Option<&str>, says: &str| {
            let pat = pattern.map(|p| PathPattern::parse(p).unwrap());
            let msg = KeyTemplate::parse(template, pat.as_ref()).unwrap_err().to_string();
            assert!(msg.contains(says), "{template}: {msg}");
        };
        // Nothing between two values.
        refused("{query.a}{query.b}", None, "nothing between");
        refused("{header.t}{host}", None, "nothing between");
        refused("{path}{query.a}", None, "nothing between");
        // A path is never escaped: the fence API reads keys that start with '/' as paths.
        refused("{path}:{query.v}", None, "a path can hold");
        refused("{path}{path}", None, "a path can hold");
        refused("{b}:{o}", Some("/b/{b}/{o*}"), "a path can hold");
        refused("{o}:{b}", Some("/b/{b}/{o*}"), "a path can hold");
        // Escapes are made of '%', letters and digits.
        refused("{header.t}x{path}", None, "punctuation");
        refused("{query.a}2{query.b}", None, "punctuation");
        refused("{header.t}%{path}", None, "literal '%'");
        refused("t%{path}", None, "literal '%'");
        // What can be read back one way only is accepted.
        for (template, pattern) in [
            ("{header.x-tenant}:{path}", None),
            ("{host}{path}", None),
            ("{host}:{path}", None),
            ("{header.t}{path}", None),
            ("{query.a}/{query.b}", None),
            ("{path}|{query.v}", None),
            ("{path} {header.t}", None),
            ("{query.a}→{query.b}", None),
            ("{bucket}/{object}", Some("/buckets/{bucket}/objects/{object*}")),
            ("{bucket}|{object}|{query.v}", Some("/buckets/{bucket}/objects/{object*}")),
        ] {
            let pat = pattern.map(|p| PathPattern::parse(p).unwrap());
            assert!(KeyTemplate::parse(template, pat.as_ref()).is_ok(), "{template}");
        }
    }

    #[test]
    fn keys_that_were_unambiguous_keep_their_form() {
        let p = Some("/buckets/{bucket}/objects/{object*}");
        assert_eq!(render("{path}", None, "/a:b%25c", &[]).unwrap(), "/a:b%25c");
        assert_eq!(render("{host}{path}", None, "/a:b", &[("host", "s.example:81")]).unwrap(), "s.example/a:b");
        assert_eq!(render("{bucket}/{object}", p, "/buckets/b%20:/objects/x/y:z", &[]).unwrap(), "b%20:/x/y:z");
        assert_eq!(render("{header.t}:{path}", None, "/a:b", &[("t", "ac/me")]).unwrap(), "ac/me:/a:b");
        assert_eq!(render("{query.a}/{query.b}", None, "/?a=x:y&b=z/w%25", &[]).unwrap(), "x:y/z/w%");
    }

    #[test]
    fn values_holding_their_separator_are_escaped() {
        // The reference config's example: a tenant holding ':' or '%'.
        assert_eq!(render("{header.t}:{path}", None, "/c", &[("t", "a:b")]).unwrap(), "a%3Ab:/c");
        assert_eq!(render("{header.t}:{path}", None, "/c", &[("t", "100%")]).unwrap(), "100%25:/c");
        assert_eq!(render("{header.t}:{path}", None, "/x:/y", &[("t", "a")]).unwrap(), "a:/x:/y");
        assert_eq!(render("{header.t}:{path}", None, "/y", &[("t", "a:/x")]).unwrap(), "a%3A/x:/y");
        assert_eq!(render("{query.a}/{query.b}", None, "/?a=x/y&b=z", &[]).unwrap(), "x%2Fy/z");
        assert_eq!(render("{query.a}/{query.b}", None, "/?a=x&b=y/z", &[]).unwrap(), "x/y/z");
        assert_eq!(render("{header.t}{path}", None, "/c", &[("t", "a/b")]).unwrap(), "a%2Fb/c");
        assert_eq!(render("{query.a}→{query.b}", None, "/?a=%E2%86%92&b=c", &[]).unwrap(), "%E2%86%92→c");
        assert_eq!(render("{host}:{path}", None, "/c", &[("host", "[::1]:80")]).unwrap(), "[%3A%3A1]:/c");
        // A value whose kind cannot hold its separator, holding it anyway
        // (a Host routing did not make canonical), is refused.
        assert_eq!(
            render("{host}{path}", None, "/c", &[("host", "a/b")]),
            Err(KeyError::Separator { part: "host".into(), separator: '/' })
        );
    }

    #[test]
    fn query_values_must_be_utf8_text_without_control_bytes() {
        let q = |e| Err(KeyError::Query { name: "id".into(), error: e });
        assert_eq!(render("{query.id}", None, "/a?id=%FF", &[]), q(QueryError::ValueNotUtf8));
        assert_eq!(render("{query.id}", None, "/a?id=%C3", &[]), q(QueryError::ValueNotUtf8));
        assert_eq!(render("{query.id}", None, "/a?id=%ED%A0%80", &[]), q(QueryError::ValueNotUtf8));
        assert_eq!(render("{query.id}", None, "/a?id=a%00b", &[]), q(QueryError::ControlByte));
        assert_eq!(render("{query.id}", None, "/a?id=%7F", &[]), q(QueryError::ControlByte));
        assert_eq!(render("{query.id}", None, "/a?id=%09", &[]), q(QueryError::ControlByte));
        assert_eq!(render("{query.id}", None, "/a?i%FFd=1&id=2", &[]), q(QueryError::NameNotUtf8));
        assert_eq!(render("{query.id}", None, "/a?id=%C3%A9", &[]).unwrap(), "é");
        // `non_utf8 = "raw"`: the bytes, one to one.
        let raw = KeyTemplate::parse("{query.id}", None).unwrap().with_non_utf8(NonUtf8::Raw);
        let key = |uri: &str| raw.render(&uri.parse().unwrap(), &HeaderMap::new());
        assert_eq!(key("/a?id=%FF").unwrap(), "%FF");
        assert_eq!(key("/a?id=%FE").unwrap(), "%FE");
        assert_eq!(key("/a?id=%25FF").unwrap(), "%25FF");
        assert_eq!(key("/a?id=%C3%A9%C3").unwrap(), "é%C3");
        assert_eq!(key("/a?id=a%00"), Err(KeyError::Query { name: "id".into(), error: QueryError::ControlByte }));
        // A name that reads as `id` once U+FFFD stands in for its bad byte is
        // refused; one that cannot read as `id` is another parameter.
        let raw = KeyTemplate::parse("{query.i\u{FFFD}}", None).unwrap().with_non_utf8(NonUtf8::Raw);
        assert!(matches!(
            raw.render(&"/a?i%FF=1".parse().unwrap(), &HeaderMap::new()),
            Err(KeyError::Query { error: QueryError::NameNotUtf8, .. })
        ));
        let raw = KeyTemplate::parse("{query.id}", None).unwrap().with_non_utf8(NonUtf8::Raw);
        assert_eq!(raw.render(&"/a?i%FF=1&id=2".parse().unwrap(), &HeaderMap::new()).unwrap(), "2");
    }

    /// Percent-encodes everything but letters and digits: a query value that
    /// decodes to exactly `value`.
    fn form_encode(value: &str) -> String {
        value
            .bytes()
            .map(|b| if b.is_ascii_alphanumeric() { char::from(b).to_string() } else { format!("%{b:02X}") })
            .collect()
    }

    /// Every combination of values that hold each separator, '%' and escapes
    /// (`%3A`, `%25`), for templates of every placeholder kind: two different
    /// combinations never render one key.
    #[test]
    fn rendering_is_injective_over_values_holding_every_separator() {
        let texts =
            ["", "a", ":", "/", "%", "|", " ", "→", "a:", ":a", "a/b", "/x", "%3A", "%25", "%2F", "a%", ":/", "x/y"];
        // Canonical paths, as routing hands them over.
        let paths = ["/", "/a", "/a:", "/a/b", "/x:/y", "/a%25", "/a%20b", "/:", "/y", "/a|b", "/%3F"];
        let hosts = ["a.example", "a.example:81", "b.example", "[::1]", "[::1]:80", "[::a]"];
        let pattern = "/buckets/{bucket}/objects/{object*}";
        let captures = [
            "/buckets/b/objects/o",
            "/buckets/b:/objects/o",
            "/buckets/b/objects/:o",
            "/buckets/b/objects/o/p",
            "/buckets/b%25/objects/o%7C",
        ];
        let templates: &[(&str, Option<&str>)] = &[
            ("{header.t}:{path}", None),
            ("t={header.t}:{path}", None),
            ("{query.a}/{query.b}", None),
            ("{query.a}:{query.b}", None),
            ("{query.a}::{query.b}:", None),
            ("{query.a}→{query.b}", None),
            ("{query.a} {header.t}", None),
            ("{header.t}{path}", None),
            ("{host}{path}", None),
            ("{host}:{path}", None),
            ("{path}|{query.a}", None),
            ("{query.a}|{header.t}:{path}", None),
            ("{bucket}/{object}", Some(pattern)),
            ("{bucket}|{object}|{query.a}", Some(pattern)),
            ("{header.t}:{bucket}/{object}", Some(pattern)),
        ];
        for &(template, pattern) in templates {
            let pat = pattern.map(|p| PathPattern::parse(p).unwrap());
            let t = KeyTemplate::parse(template, pat.as_ref()).unwrap_or_else(|e| panic!("{e}"));
            let uses = |p: &str| template.contains(p);
            let path_values: &[&str] = if uses("{path}") {
                &paths
            } else if pattern.is_some() {
                &captures
            } else {
                &["/"]
            };
            let host_values: &[&str] = if uses("{host}") { &hosts } else { &["h"] };
            let header_values: &[&str] = if uses("{header.t}") { &texts } else { &[""] };
            let a_values: &[&str] = if uses("{query.a}") { &texts } else { &[""] };
            let b_values: &[&str] = if uses("{query.b}") { &texts } else { &[""] };
            let mut seen: std::collections::HashMap<String, (String, &str, &str, &str, &str)> = Default::default();
            let mut rendered = 0;
            for &path in path_values {
                for &host in host_values {
                    for &header in header_values {
                        for &a in a_values {
                            for &b in b_values {
                                let uri: Uri =
                                    format!("{path}?a={}&b={}", form_encode(a), form_encode(b)).parse().unwrap();
                                let mut h = HeaderMap::new();
                                h.insert(http::header::HOST, HeaderValue::from_str(host).unwrap());
                                if let Ok(v) = HeaderValue::from_str(header) {
                                    h.insert("t", v);
                                }
                                let Ok(key) = t.render(&uri, &h) else { continue };
                                rendered += 1;
                                // Two hosts that differ only by port are one virtual host.
                                let host_name =
                                    host.rsplit_once(':').filter(|(n, _)| !n.ends_with(':')).map_or(host, |(n, _)| n);
                                let host_name =
                                    if host.starts_with('[') { &host[..=host.find(']').unwrap()] } else { host_name };
                                let inputs = (path.to_string(), host_name, header, a, b);
                                if let Some(before) = seen.insert(key.clone(), inputs.clone()) {
                                    assert_eq!(before, inputs, "{template}: two requests rendered {key:?}");
                                }
                            }
                        }
                    }
                }
            }
            assert!(rendered > 4, "{template}: only {rendered} keys rendered");
        }
    }
}
