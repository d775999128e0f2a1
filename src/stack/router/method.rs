//! Whether a request may write: its method, and the method-override headers
//! common frameworks honour, against the route's safe methods.

use http::header::HeaderValue;
use http::{HeaderMap, HeaderName};

use crate::route::Route;
use crate::stack::error::ProxyError;

/// Headers that common middleware (Rails, Express, Werkzeug, Symfony) honour
/// as the method a request is to be run as.
const METHOD_OVERRIDE_HEADERS: [&str; 3] = ["x-http-method-override", "x-http-method", "x-method-override"];

/// Whether a name `len` bytes long may be a method override: folding keeps
/// the length, so most fields are told apart by it alone.
pub(super) fn may_be_override(len: usize) -> bool {
    METHOD_OVERRIDE_HEADERS.iter().any(|header| header.len() == len)
}

/// Whether `name` is a method override in any spelling a server folds into
/// one (`x_http_method_override` reaches a WSGI handler as the override).
fn is_override(name: &HeaderName) -> bool {
    if !may_be_override(name.as_str().len()) {
        return false;
    }
    let name = super::underscores::folded(name);
    METHOD_OVERRIDE_HEADERS.contains(&&*name)
}

/// Whether the request may write: its method or a method override is not one
/// of the route's safe methods. `overrides` is whether `headers` may hold an
/// override (a name of such a length, see [`may_be_override`]); without one,
/// the method alone decides.
pub(super) fn is_fenced(
    route: &Route,
    method: &http::Method,
    headers: &HeaderMap,
    overrides: bool,
) -> Result<bool, ProxyError> {
    // `route.is_safe` by the method itself: two `Method`s are equal exactly
    // when their texts are (a standard one is only ever parsed from its
    // text), and a standard one compares as an integer, not as bytes.
    let mut fenced = !route.safe_methods.contains(method);
    if !overrides {
        return Ok(fenced);
    }
    let mut first: Option<&HeaderValue> = None;
    // The names the request has, in the order it sent them, rather than a
    // lookup (a hash of each name) for every override most requests lack.
    for header in headers.keys().filter(|name| is_override(name)) {
        for value in headers.get_all(header) {
            match first {
                Some(first) if !first.as_bytes().eq_ignore_ascii_case(value.as_bytes()) => {
                    let text = |v: &HeaderValue| String::from_utf8_lossy(v.as_bytes()).into_owned();
                    return Err(ProxyError::MethodOverride { first: text(first), second: text(value) });
                }
                Some(_) => {}
                None => first = Some(value),
            }
            // Each value exactly as sent, like the method itself.
            fenced |= !route.is_safe(value.as_bytes());
        }
    }
    Ok(fenced)
}

#[cfg(test)]
mod tests {
    use super::super::tests::route;
    use super::*;

    #[test]
    fn methods_and_overrides_decide_what_is_fenced() {
        let fenced = |method: &str, headers: &[(&str, &str)]| route(method, "/objects/a", headers).map(|r| r.fenced);
        assert!(!fenced("GET", &[]).unwrap());
        for method in ["PUT", "put", "Put", "MKCOL", "FROB", "get"] {
            assert!(fenced(method, &[]).unwrap(), "{method}");
        }
        assert!(fenced("GET", &[("x-http-method-override", "PUT")]).unwrap());
        assert!(fenced("POST", &[("x-method-override", "GET")]).unwrap());
        // Each of the three names alone turns a safe method into a fenced one.
        for name in METHOD_OVERRIDE_HEADERS {
            assert!(fenced("GET", &[(name, "PUT")]).unwrap(), "{name}");
        }
        assert!(!fenced("GET", &[("x-http-method", "GET")]).unwrap());
        assert!(fenced("GET", &[("x-http-method-override", "put"), ("x-http-method", "PUT")]).unwrap());
        // Spelled with `_`, as CGI and WSGI servers fold it (routes that pass
        // such names; by default they are dropped before this check).
        assert!(is_override(&HeaderName::from_static("x_http_method_override")));
        assert!(is_override(&HeaderName::from_static("x-http_method")));
        assert!(!is_override(&HeaderName::from_static("x-http-methods")));
        // Every value counts, exactly as sent: `get` is not a safe method.
        assert!(fenced("GET", &[("x-http-method-override", "GET"), ("x-http-method", "get")]).unwrap());
        assert!(matches!(
            fenced("POST", &[("x-http-method-override", "GET"), ("x-method-override", "DELETE")]),
            Err(ProxyError::MethodOverride { .. })
        ));
    }

    /// The problem's `detail` names both methods, as sent, in header order.
    #[test]
    fn disagreeing_overrides_keep_their_wording() {
        let headers = [("x-http-method-override", "GET"), ("x-method-override", "delete")];
        let error = route("POST", "/objects/a", &headers).err().map(|e| e.to_string());
        assert_eq!(error.as_deref(), Some("the method-override headers name different methods ('GET' and 'delete')"));
    }
}
