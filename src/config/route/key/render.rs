//! Rendering a request's key: each placeholder's value taken from the
//! request and written as [`super::escape`] says; a request without a value
//! the template needs is refused (400 `bad-key`).

use std::borrow::Cow;

use http::{HeaderMap, HeaderName, Uri};

use super::escape::push_value;
use super::{End, KeyPart, KeyTemplate, Source};
use crate::canonical::{query_param_with, QueryError};
use crate::config::route::PathPattern;

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

impl KeyTemplate {
    /// Renders the key for a request.
    pub fn render(&self, uri: &Uri, headers: &HeaderMap) -> Result<String, KeyError> {
        self.render_target(uri.path(), uri.query(), headers).map(Cow::into_owned)
    }

    /// Renders the key for a request target given as its path and query.
    /// Query parameters are decoded as web frameworks decode them
    /// ([`query_param_with`]); the `Host` header is used as it is (routing made it
    /// canonical).
    pub(in crate::config::route) fn render_target<'a>(
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
    use http::HeaderValue;

    use super::super::render_for_test as render;
    use super::*;
    use crate::canonical::NonUtf8;

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
}
