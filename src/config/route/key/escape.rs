//! How a value is written into a key so the key reads back one way: which
//! separators each kind of value can hold, and the escapes of those it can
//! (the rules are in [`super`]'s docs).

use super::{End, Source};

impl Source {
    /// Whether a value of this kind can hold `c`.
    pub(super) fn can_hold(&self, c: char) -> bool {
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
    pub(super) fn is_path(&self) -> bool {
        matches!(self, Source::Path | Source::Capture(..))
    }
}

fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "-._~!$&'()*+,;=:@/%".contains(c)
}

/// Writes one value into the key as its `end` says; `Err(terminator)` when a
/// value of a kind that never holds its terminator holds it.
pub(super) fn push_value(key: &mut String, value: &str, end: End) -> Result<(), char> {
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

#[cfg(test)]
mod tests {
    use http::{HeaderMap, HeaderValue, Uri};

    use super::super::render_for_test as render;
    use crate::config::route::{KeyError, KeyTemplate, PathPattern};

    /// Percent-encodes everything but letters and digits: a query value that
    /// decodes to exactly `value`.
    fn form_encode(value: &str) -> String {
        value
            .bytes()
            .map(|b| if b.is_ascii_alphanumeric() { char::from(b).to_string() } else { format!("%{b:02X}") })
            .collect()
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
