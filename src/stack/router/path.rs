//! A raw path made canonical and routed: the request's own target and a
//! WebDAV `Destination` alike.

use std::sync::Arc;

use crate::canonical::{canonical_path, check_path_utf8, is_plain_path, EscapedSlashes, NonUtf8, PathOptions};
use crate::route::{Route, RouteTable};
use crate::stack::error::ProxyError;

/// How paths are canonicalized for routing: escaped slashes, and escapes that
/// are not UTF-8, are kept until the route says what it does with them.
const ROUTING: PathOptions =
    PathOptions { merge_slashes: true, escaped_slashes: EscapedSlashes::Keep, non_utf8: NonUtf8::Raw };

/// Finds the route for a raw request path. Returns its canonical form too
/// when that differs from the raw one.
pub(super) fn find_route(routes: &RouteTable, raw: &str) -> Result<(Arc<Route>, Option<String>), ProxyError> {
    // Nearly every request: a path that is its own canonical form under every
    // route's options, with no escape for a route to refuse.
    if is_plain_path(raw) {
        return match routes.find(raw) {
            Some(route) => Ok((route.clone(), None)),
            None => Err(ProxyError::NoRoute { path: raw.to_string() }),
        };
    }
    let path = canonical_path(raw, ROUTING)?;
    let Some((index, route)) = routes.find_indexed(&path) else {
        return Err(ProxyError::NoRoute { path: path.into_owned() });
    };
    let route = route.clone();
    let own = route.path_options;
    if own.non_utf8 == NonUtf8::Reject {
        check_path_utf8(&path)?;
    }
    // The route's own rules, where they differ from routing's: it refuses
    // escaped slashes (the default), or keeps repeated ones.
    let refuses_escaped_slash = own.escaped_slashes == EscapedSlashes::Reject
        && path.contains('%')
        && (path.contains("%2F") || path.contains("%5C"));
    if !refuses_escaped_slash && own.merge_slashes {
        let changed = (path != raw).then(|| path.into_owned());
        return Ok((route, changed));
    }
    let path = canonical_path(raw, own)?;
    match routes.find_indexed(&path) {
        Some((i, _)) if i == index => {
            let changed = (path != raw).then(|| path.into_owned());
            Ok((route, changed))
        }
        _ => Err(ProxyError::NoRoute { path: path.into_owned() }),
    }
}
