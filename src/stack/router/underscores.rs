//! Header names spelled with `_`.
//!
//! CGI, WSGI (Werkzeug, wsgiref, gunicorn), PHP and Rack hand a handler its
//! headers as variables (`HTTP_X_HTTP_METHOD_OVERRIDE`), where `-` and `_`
//! both become `_`: `X_HTTP_METHOD_OVERRIDE: DELETE` reaches such a handler as
//! the method override fencegate never saw. So, as nginx does by default
//! (`underscores_in_headers off`), header names containing `_` are dropped
//! before anything reads the request. With `[server] underscores_in_headers =
//! true` they pass; then every name is compared as those servers fold it
//! (method overrides in any spelling count), and two fields whose names fold
//! into one are refused, since which one the upstream reads is its choice.

use http::header::{HeaderMap, HeaderName};

/// Two header names that servers folding `_` into `-` read as one field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("header fields '{0}' and '{1}' are one field to servers that read '_' as '-' (CGI, WSGI); send one of them")]
pub struct FoldedHeaders(pub String, pub String);

/// Drops header names containing `_`, or, when `pass` is set, refuses two
/// names that fold into one. Costs one scan of the names when none has `_`.
pub(super) fn apply(headers: &mut HeaderMap, pass: bool) -> Result<(), FoldedHeaders> {
    if !headers.keys().any(|name| name.as_str().contains('_')) {
        return Ok(());
    }
    if pass {
        return check_folded(headers);
    }
    let underscored: Vec<HeaderName> = headers.keys().filter(|name| name.as_str().contains('_')).cloned().collect();
    for name in underscored {
        headers.remove(&name);
    }
    Ok(())
}

/// `name` as servers that fold `_` and `-` read it (names are lower case already).
pub(super) fn folded(name: &HeaderName) -> std::borrow::Cow<'_, str> {
    let text = name.as_str();
    if text.contains('_') {
        std::borrow::Cow::Owned(text.replace('_', "-"))
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

fn check_folded(headers: &HeaderMap) -> Result<(), FoldedHeaders> {
    let names: Vec<&HeaderName> = headers.keys().collect();
    for (i, a) in names.iter().enumerate() {
        if !a.as_str().contains('_') {
            continue;
        }
        let folded_a = folded(a);
        if let Some(b) = names.iter().enumerate().find(|&(j, b)| j != i && folded(b) == folded_a).map(|(_, b)| b) {
            let (first, second) = if names.iter().position(|n| n == b) < Some(i) { (b, a) } else { (a, b) };
            return Err(FoldedHeaders(first.to_string(), second.to_string()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn map(names: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for name in names {
            h.append(HeaderName::from_bytes(name.as_bytes()).unwrap(), HeaderValue::from_static("v"));
        }
        h
    }

    #[test]
    fn underscored_names_are_dropped_by_default() {
        let mut h = map(&["x_http_method_override", "x-tenant", "X_Tenant_", "host"]);
        apply(&mut h, false).unwrap();
        let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["host", "x-tenant"]);
    }

    #[test]
    fn passed_names_must_not_fold_into_one() {
        let mut h = map(&["x_http_method_override", "x-tenant"]);
        apply(&mut h, true).unwrap();
        assert_eq!(h.len(), 2);
        let mut h = map(&["x-tenant", "host", "x_tenant"]);
        assert_eq!(apply(&mut h, true), Err(FoldedHeaders("x-tenant".into(), "x_tenant".into())));
        let mut h = map(&["x_a-b", "x-a_b"]);
        assert_eq!(apply(&mut h, true), Err(FoldedHeaders("x_a-b".into(), "x-a_b".into())));
    }
}
