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
//!
//! | file | what it owns |
//! |---|---|
//! | `parse.rs` | reading a template, and refusing one that could render two requests as one key |
//! | `render.rs` | a request's key: each placeholder's value, and why a request has none |
//! | `escape.rs` | which separators each kind of value can hold, and the escapes of those it can |

mod escape;
mod parse;
mod render;

use http::HeaderName;

use super::PathPattern;
use crate::canonical::NonUtf8;

pub use parse::TemplateError;
pub use render::{KeyError, KeyInput};

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

impl KeyTemplate {
    /// Whether the key is made, in part, from header `name`.
    pub fn reads_header(&self, name: &HeaderName) -> bool {
        self.parts.iter().any(|part| matches!(part, KeyPart::Value { source: Source::Header(h), .. } if h == name))
    }

    /// The template, with the route's `non_utf8` choice for `{query.NAME}`
    /// values (refused by default, see [`crate::canonical::query_param_with`]).
    pub fn with_non_utf8(self, non_utf8: NonUtf8) -> KeyTemplate {
        KeyTemplate { non_utf8, ..self }
    }

    /// The route's pattern, as given to [`parse`](Self::parse).
    pub fn pattern(&self) -> Option<&PathPattern> {
        self.pattern.as_ref()
    }
}

/// Renders `template` (with `pattern`, if any) for `uri` and `headers`
/// given as name and value pairs: the unit tests' shorthand.
#[cfg(test)]
fn render_for_test(
    template: &str,
    pattern: Option<&str>,
    uri: &str,
    headers: &[(&str, &str)],
) -> Result<String, KeyError> {
    let pat = pattern.map(|p| PathPattern::parse(p).unwrap());
    let t = KeyTemplate::parse(template, pat.as_ref()).unwrap();
    let mut h = http::HeaderMap::new();
    for (k, v) in headers {
        h.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), http::HeaderValue::from_str(v).unwrap());
    }
    t.render(&uri.parse().unwrap(), &h)
}
