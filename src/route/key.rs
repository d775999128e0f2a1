//! Fence key templates such as `{header.x-tenant}:{path}`: parsed once at config
//! time, so rendering a key on the hot path is a walk over a short slice with no
//! parsing.

use std::borrow::Cow;

use http::{HeaderMap, HeaderName, Uri};

use super::PathPattern;
use crate::canonical::{query_param, QueryError};

/// A fence key template such as `{header.x-tenant}:{path}`, parsed once.
///
/// The template holds the route's [`PathPattern`], so a `{name}` part always
/// has the pattern it captures from: rendering needs nothing else from the route.
#[derive(Debug, Clone)]
pub struct KeyTemplate {
    parts: Vec<KeyPart>,
    /// The route's pattern: every `{name}` part is one of its captures.
    pattern: Option<PathPattern>,
}

#[derive(Debug, Clone)]
enum KeyPart {
    Literal(String),
    Path,
    Host,
    Header(HeaderName),
    Query(String),
    /// The capture at this index in the pattern's captures.
    Capture(usize),
}

/// Why a key could not be made for a request (the request gets a 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("the request has no {0}, which the route's key template needs")]
    Missing(String),
    #[error("the request has more than one {0}; the route's key template needs exactly one")]
    Repeated(String),
    #[error("the path does not match the route's pattern '{0}'")]
    PatternMismatch(String),
    #[error("the fence key is {len} bytes long; [fences] max_key_bytes allows {max}")]
    TooLong { len: usize, max: usize },
}

impl KeyTemplate {
    /// Whether the key is made, in part, from header `name`.
    pub fn reads_header(&self, name: &HeaderName) -> bool {
        self.parts.iter().any(|part| matches!(part, KeyPart::Header(h) if h == name))
    }

    /// Parses a template; `{name}` parts must be captures of `pattern`, which
    /// the template keeps.
    pub fn parse(text: &str, pattern: Option<&PathPattern>) -> Result<KeyTemplate, String> {
        let mut parts = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            match rest.find('{') {
                Some(0) => {
                    let end = rest.find('}').ok_or_else(|| format!("'{text}': a '{{' is never closed"))?;
                    let inner = &rest[1..end];
                    parts.push(Self::placeholder(text, inner, pattern)?);
                    rest = &rest[end + 1..];
                }
                found => {
                    let end = found.unwrap_or(rest.len());
                    let lit = &rest[..end];
                    if lit.contains('}') {
                        return Err(format!("'{text}': a '}}' has no opening '{{'"));
                    }
                    parts.push(KeyPart::Literal(lit.to_string()));
                    rest = &rest[end..];
                }
            }
        }
        if !parts.iter().any(|p| !matches!(p, KeyPart::Literal(_))) {
            return Err(format!("'{text}' has no placeholder, so every request would share one key"));
        }
        Ok(KeyTemplate { parts, pattern: pattern.cloned() })
    }

    fn placeholder(text: &str, inner: &str, pattern: Option<&PathPattern>) -> Result<KeyPart, String> {
        if inner == "path" {
            return Ok(KeyPart::Path);
        }
        if inner == "host" {
            return Ok(KeyPart::Host);
        }
        if let Some(name) = inner.strip_prefix("header.") {
            return HeaderName::from_bytes(name.as_bytes())
                .map(KeyPart::Header)
                .map_err(|_| format!("'{text}': '{{{inner}}}' does not name a valid header"));
        }
        if let Some(name) = inner.strip_prefix("query.") {
            if name.is_empty() {
                return Err(format!("'{text}': '{{{inner}}}' needs a parameter name"));
            }
            return Ok(KeyPart::Query(name.to_string()));
        }
        match pattern {
            Some(pat) => pat.capture_index(inner).map(KeyPart::Capture).ok_or_else(|| {
                format!(
                "'{text}': {{{inner}}} is not {{path}}, {{host}}, {{header.NAME}}, {{query.NAME}} or a capture of pattern '{}'",
                    pat.source()
                )
            }),
            None => Err(format!(
                "'{text}': {{{inner}}} is not {{path}}, {{host}}, {{header.NAME}} or {{query.NAME}} (named segments need a route `pattern`)"
            )),
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
    /// ([`query_param`]); the `Host` header is used as it is (routing made it
    /// canonical).
    pub(super) fn render_target<'a>(
        &self,
        path: &'a str,
        query: Option<&str>,
        headers: &HeaderMap,
    ) -> Result<Cow<'a, str>, KeyError> {
        // The default `{path}` template is the hot case: no captures, the
        // path itself (the caller makes the one copy the key needs).
        if let [KeyPart::Path] = self.parts.as_slice() {
            return Ok(Cow::Borrowed(path));
        }
        let mismatch = || KeyError::PatternMismatch(self.pattern.as_ref().map_or("", |p| p.source()).to_string());
        let captures = match &self.pattern {
            Some(pat) if self.parts.iter().any(|p| matches!(p, KeyPart::Capture(_))) => {
                pat.captures(path).ok_or_else(mismatch)?
            }
            _ => Vec::new(),
        };
        let mut key = String::new();
        for part in &self.parts {
            match part {
                KeyPart::Literal(l) => key.push_str(l),
                KeyPart::Path => key.push_str(path),
                KeyPart::Host => match headers.get(http::header::HOST) {
                    Some(host) => {
                        let host = host.to_str().map_err(|_| KeyError::Missing("readable Host header".into()))?;
                        key.push_str(&host_name(host).to_ascii_lowercase());
                    }
                    None => return Err(KeyError::Missing("Host header".into())),
                },
                KeyPart::Header(name) => {
                    let mut values = headers.get_all(name).iter();
                    let value = values.next().ok_or_else(|| KeyError::Missing(format!("header '{name}'")))?;
                    if values.next().is_some() {
                        return Err(KeyError::Repeated(format!("header '{name}'")));
                    }
                    let text = value.to_str().map_err(|_| KeyError::Missing(format!("readable header '{name}'")))?;
                    key.push_str(text);
                }
                KeyPart::Query(name) => match query_param(query.unwrap_or(""), name) {
                    Ok(Some(value)) => key.push_str(&value),
                    Ok(None) => return Err(KeyError::Missing(format!("query parameter '{name}'"))),
                    Err(QueryError::Repeated) => return Err(KeyError::Repeated(format!("query parameter '{name}'"))),
                },
                // `parse` took the index from the pattern, which yields every capture on a match.
                KeyPart::Capture(i) => key.push_str(captures.get(*i).ok_or_else(mismatch)?),
            }
        }
        Ok(Cow::Owned(key))
    }
}

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
        assert_eq!(render("{header.x-tenant}", None, "/a", &[]), Err(KeyError::Missing("header 'x-tenant'".into())));
        assert_eq!(
            render("{header.x-tenant}", None, "/a", &[("x-tenant", "a"), ("x-tenant", "b")]),
            Err(KeyError::Repeated("header 'x-tenant'".into()))
        );
        assert_eq!(
            render("{query.id}", None, "/a?id=1&id=2", &[]),
            Err(KeyError::Repeated("query parameter 'id'".into()))
        );
        assert_eq!(render("{query.id}", None, "/a?idx=1", &[]), Err(KeyError::Missing("query parameter 'id'".into())));
        assert_eq!(
            render("{query.id}", None, "/a?i%64=7&id=fresh", &[]),
            Err(KeyError::Repeated("query parameter 'id'".into()))
        );
        let p = "/buckets/{bucket}/objects/{object*}";
        assert!(matches!(render("{bucket}", Some(p), "/buckets/b1", &[]), Err(KeyError::PatternMismatch(_))));
        assert!(matches!(render("{bucket}", Some(p), "/buckets//objects/x", &[]), Err(KeyError::PatternMismatch(_))));
        assert!(matches!(render("{bucket}", Some(p), "/buckets/b/objects/", &[]), Err(KeyError::PatternMismatch(_))));
    }

    #[test]
    fn key_template_parse_errors() {
        assert!(KeyTemplate::parse("{path", None).unwrap_err().contains("never closed"));
        assert!(KeyTemplate::parse("path}", None).unwrap_err().contains("no opening"));
        assert!(KeyTemplate::parse("static", None).unwrap_err().contains("no placeholder"));
        assert!(KeyTemplate::parse("{bucket}", None).unwrap_err().contains("pattern"));
        assert!(KeyTemplate::parse("{header.a b}", None).unwrap_err().contains("valid header"));
    }
}
