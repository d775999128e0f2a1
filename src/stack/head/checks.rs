//! The head checks: everything the fence can decide before a body byte is read.

use std::sync::Arc;

use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName};
use hyper::body::Body;

use super::{Checked, Fence};
use crate::fence::signature::{verify_header, SIGNATURE_HEADER};
use crate::fence::store::{AtHand, FenceStore};
use crate::fence::token::token_from_headers;
use crate::route::Route;
use crate::stack::error::{ProxyError, Rejection};
use crate::stack::router::Routed;

/// The header that signs a WebDAV destination's key, on a request whose
/// `Destination` falls under a route with a `signing_key_file`.
pub const DESTINATION_SIGNATURE_HEADER: HeaderName = HeaderName::from_static("x-fencing-destination-signature");

/// Step 2 of the guarantee in `docs/behaviour.md` ("The guarantee, step by step"),
/// and the body rule for unfenced requests.
#[cfg(test)]
pub(crate) async fn check<St: FenceStore, B: Body>(store: &St, routed: Routed<B>) -> Result<Checked<B>, Rejection> {
    let checked = check_head(routed)?;
    check_marks(store, checked.fence.as_ref(), &checked.routed.route).await?;
    Ok(checked)
}

/// Every check of step 2 but the marks: what the head alone decides.
// A refusal is moved once, into the response future; boxing it would cost
// every refused request an allocation.
#[allow(clippy::result_large_err)]
pub(crate) fn check_head<B: Body>(routed: Routed<B>) -> Result<Checked<B>, Rejection> {
    let route = &routed.route;
    if !routed.fenced {
        // An upstream that expects no body may read this one as the next
        // request on the connection: a request smuggled past the fence.
        if !route.allow_safe_body && carries_body(&routed.request) {
            return Err(ProxyError::BodyNotAllowed(routed.request.method().clone()).into());
        }
        return Ok(Checked { routed, fence: None });
    }
    let headers = routed.request.headers();
    let header = &route.token_header;
    // Read by routing's pass over the fields, unless a step changed them since.
    let token = match routed.token.unwrap_or_else(|| token_from_headers(headers, header)) {
        Ok(Some(token)) => Ok(token),
        // Only when the destination's route allows it too: it is written as well.
        Ok(None)
            if route.allow_missing_token && routed.destination.as_ref().is_none_or(|d| d.route.allow_missing_token) =>
        {
            return Ok(Checked { routed, fence: None })
        }
        Ok(None) => Err(ProxyError::MissingToken { header: header.clone() }),
        Err(error) => Err(ProxyError::MalformedToken { header: header.clone(), error }),
    };
    let uri = routed.request.uri();
    let key = route.key_for(uri.path(), uri.query(), headers);
    // Token problems come first (428 / 400 malformed), with the key when it can be made.
    let (key, token) = match (key, token) {
        (Ok(key), Ok(token)) => (key, token),
        (key, Err(e)) => return Err(Rejection::new(e, key.ok(), None)),
        (Err(e), Ok(token)) => return Err(Rejection::new(e.into(), None, Some(token))),
    };
    let reject = |e: ProxyError, key: &Arc<str>| Rejection::new(e, Some(key.clone()), Some(token));
    let destination = match &routed.destination {
        Some(d) => {
            let key = d.route.key_for(&d.path, d.query.as_deref(), headers).map_err(|e| reject(e.into(), &key))?;
            Some((key, d.route.clone()))
        }
        None => None,
    };

    // Before anything else: a token nobody with the key signed must not read the
    // mark, queue, or (above all) raise the mark, or any client could fence a key
    // forever with u64::MAX.
    check_signature(route, &key, token, headers, &SIGNATURE_HEADER).map_err(|e| reject(e, &key))?;
    if let Some((dest_key, dest_route)) = &destination {
        check_signature(dest_route, dest_key, token, headers, &DESTINATION_SIGNATURE_HEADER)
            .map_err(|e| reject(e, &key))?;
    }
    Ok(Checked { routed, fence: Some(Fence { token, key, destination, at_mark: false }) })
}

/// The keys a fenced request writes, each with the route whose policy
/// applies: its own (`route`'s) and its destination's.
fn written_keys<'a>(fence: &'a Fence, route: &'a Route) -> impl Iterator<Item = (&'a Arc<str>, &'a Route)> {
    let destination = fence.destination.as_ref().map(|(key, route)| (key, &**route));
    std::iter::once((&fence.key, route)).chain(destination)
}

/// A token already below a mark can never win, and one too far above it
/// never will: refuse both without queueing, and without reading the body.
pub(crate) async fn check_marks<St: FenceStore>(
    store: &St,
    fence: Option<&Fence>,
    route: &Route,
) -> Result<(), Rejection> {
    let Some(fence) = fence else { return Ok(()) };
    for (key, route) in written_keys(fence, route) {
        check_mark(store, route, key, fence.token).await.map_err(|e| fence.rejection(e, key))?;
    }
    Ok(())
}

/// [`check_marks`] from the marks the store has at hand; `None` when it must
/// read one first. A request that writes one key, whose mark the store had
/// at hand and equal to its token, is marked [`Fence::at_mark`].
pub(crate) fn marks_at_hand<St: FenceStore>(
    store: &St,
    fence: Option<&mut Fence>,
    route: &Route,
) -> Option<Result<(), Rejection>> {
    let Some(fence) = fence else { return Some(Ok(())) };
    let mut at_mark = fence.destination.is_none();
    for (key, route) in written_keys(fence, route) {
        let checked = match store.at_hand(key) {
            AtHand::Mark(mark) => {
                at_mark &= mark == Some(fence.token);
                compare_mark(route, fence.token, mark)
            }
            // A store replicas share: a token below a mark this replica saw
            // is refused without a round trip; the rest is decided under the
            // turn, in the store's one atomic step.
            AtHand::Floor(Some(current)) if fence.token < current || (route.strict && fence.token == current) => {
                Err(ProxyError::StaleToken { token: fence.token, current })
            }
            AtHand::Floor(_) => {
                at_mark = false;
                Ok(())
            }
            AtHand::Read => return None,
        };
        if let Err(e) = checked {
            return Some(Err(fence.rejection(e, key)));
        }
    }
    fence.at_mark = at_mark;
    Some(Ok(()))
}

fn check_signature(
    route: &Route,
    key: &str,
    token: u64,
    headers: &HeaderMap,
    name: &HeaderName,
) -> Result<(), ProxyError> {
    match &route.signing_key {
        Some(signing_key) => Ok(verify_header(signing_key, key, token, headers, name)?),
        None => Ok(()),
    }
}

/// Refuses `token` when it is below `key`'s mark (on a `strict` route, also
/// when it equals it) or jumps too far above it: early from the head, and
/// again with the turn held.
pub(crate) async fn check_mark<St: FenceStore>(
    store: &St,
    route: &Route,
    key: &str,
    token: u64,
) -> Result<(), ProxyError> {
    compare_mark(route, token, store.get(key).await?)
}

/// [`check_mark`] against the mark `mark`.
fn compare_mark(route: &Route, token: u64, mark: Option<u64>) -> Result<(), ProxyError> {
    match mark {
        Some(current) if token < current || (route.strict && token == current) => {
            Err(ProxyError::StaleToken { token, current })
        }
        Some(current) => check_jump(route.max_token_jump, token, current),
        None => Ok(()),
    }
}

/// Refuses a token more than `max_jump` above the mark `current`. Without a
/// limit, or when `current + max_jump` passes `u64::MAX`, every token is near enough.
pub(crate) fn check_jump(max_jump: Option<u64>, token: u64, current: u64) -> Result<(), ProxyError> {
    match max_jump {
        Some(max_jump) if token > current.saturating_add(max_jump) => {
            Err(ProxyError::TokenJump { token, current, max_jump })
        }
        _ => Ok(()),
    }
}

/// Whether a request has a body: a declared length above zero, a chunked
/// one, or (HTTP/2) a stream its head did not end.
fn carries_body<B: Body>(request: &http::Request<B>) -> bool {
    let headers = request.headers();
    match headers.get(CONTENT_LENGTH) {
        // What the body step reads as the length; one it cannot read is a body.
        Some(_) => crate::http::declared_length(headers) != Some(0),
        None => headers.contains_key(TRANSFER_ENCODING) || !request.body().is_end_stream(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use http_body_util::Empty;

    use super::*;
    use crate::fence::store::MemoryStore;
    use crate::route::test_route;
    use crate::stack::router::Destination;

    /// A tokenless COPY from a route that allows missing tokens into one that
    /// does not is refused: the destination is written too.
    #[tokio::test]
    async fn a_missing_token_passes_only_when_the_destination_allows_it_too() {
        let mut lenient = crate::config::test_route_config("lenient", "/lenient/");
        lenient.allow_missing_token = true;
        let lenient = Arc::new(Route::detached(lenient));
        let copy = |to: Arc<Route>| Routed {
            route: lenient.clone(),
            request: http::Request::builder()
                .method("COPY")
                .uri("/lenient/a")
                .body(Empty::<bytes::Bytes>::new())
                .unwrap(),
            fenced: true,
            destination: Some(Destination { route: to, path: "/x/b".into(), query: None }),
            slot_taken: None,
            token: None,
        };
        let store = MemoryStore::default();
        let strict = Arc::new(test_route("strict", "/strict/"));
        match check(&store, copy(strict)).await {
            Err(rejection) => assert_eq!(rejection.error.status(), 428),
            Ok(_) => panic!("a tokenless write into a route that needs a token passed"),
        }
        let checked = check(&store, copy(lenient.clone())).await.unwrap();
        assert!(checked.fence.is_none());
    }

    /// Only a request that writes one key whose mark the store has at hand,
    /// equal to its token, is marked to share an idle key at once.
    #[tokio::test]
    async fn a_fence_is_at_the_mark_only_when_the_store_has_it_at_hand_and_equal() {
        let route = Arc::new(test_route("objects", "/objects/"));
        let store = MemoryStore::default();
        store.advance_now("/objects/a", 5);
        let fence = |token, key: &str, destination: Option<(Arc<str>, Arc<Route>)>| Fence {
            token,
            key: key.into(),
            destination,
            at_mark: false,
        };
        let at_mark = |mut fence: Fence| {
            assert!(matches!(marks_at_hand(&store, Some(&mut fence), &route), Some(Ok(()))));
            fence.at_mark
        };
        assert!(at_mark(fence(5, "/objects/a", None)));
        assert!(!at_mark(fence(6, "/objects/a", None)), "a raise");
        assert!(!at_mark(fence(5, "/objects/fresh", None)), "a key without a mark");
        let to = Some(("/objects/a".into(), route.clone()));
        assert!(!at_mark(fence(5, "/objects/a", to)), "a request that writes two keys holds them alone");
        // A stale token is refused, not marked.
        let mut stale = fence(4, "/objects/a", None);
        assert!(matches!(marks_at_hand(&store, Some(&mut stale), &route), Some(Err(_))));
        assert!(!stale.at_mark);
    }

    #[test]
    fn jump_limit_is_inclusive_and_cannot_overflow() {
        assert!(check_jump(None, u64::MAX, 0).is_ok());
        assert!(check_jump(Some(5), 15, 10).is_ok());
        assert!(matches!(
            check_jump(Some(5), 16, 10),
            Err(ProxyError::TokenJump { token: 16, current: 10, max_jump: 5 })
        ));
        assert!(check_jump(Some(0), 10, 10).is_ok());
        assert!(check_jump(Some(0), 11, 10).is_err());
        assert!(check_jump(Some(u64::MAX), u64::MAX, 1).is_ok());
        assert!(check_jump(Some(10), u64::MAX, u64::MAX - 3).is_ok());
    }
}
