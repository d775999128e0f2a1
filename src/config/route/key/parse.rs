//! Reading a key template: its placeholders, the pattern's captures they
//! name, and the terminator each value gets; a template that could render
//! two requests as one key is refused, the message saying how to fix it.

use http::HeaderName;

use super::{End, KeyPart, KeyTemplate, Source};
use crate::canonical::NonUtf8;
use crate::config::route::PathPattern;

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

impl KeyTemplate {
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
