//! The head-checks service: what the head alone decides in `call`; a mark
//! the store must read first, on a future of its own.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::Response;
use hyper::body::Body;
use tower::{Service, ServiceExt};

use super::checks::{check_head, check_marks, marks_at_hand};
use super::Checked;
use crate::fence::store::FenceStore;
use crate::http::ProxyBody;
use crate::stack::error::RefusedOr;
use crate::stack::error::Rejection;
use crate::stack::router::Routed;

/// Refuses, from the head alone, a fenced request that can never pass, and an
/// unfenced one that carries a body it must not; hands the rest on as
/// [`Checked`]. Step 2 of the guarantee in `docs/behaviour.md` ("The guarantee, step by step").
#[derive(Debug)]
pub(crate) struct HeadChecks<S, St> {
    inner: S,
    /// The store behind a count of this connection's own: cloned for every
    /// request, it touches no count the other worker threads write.
    store: Arc<ConnectionStore<St>>,
}

/// One connection's handle on the store every connection shares.
#[derive(Debug)]
struct ConnectionStore<St>(Arc<St>);

impl<S, St> HeadChecks<S, St> {
    pub(super) fn new(inner: S, store: Arc<St>) -> Self {
        HeadChecks { inner, store: Arc::new(ConnectionStore(store)) }
    }
}

impl<S: Clone, St> Clone for HeadChecks<S, St> {
    fn clone(&self) -> Self {
        HeadChecks { inner: self.inner.clone(), store: self.store.clone() }
    }
}

impl<S, St, B> Service<Routed<B>> for HeadChecks<S, St>
where
    S: Service<Checked<B>, Response = Response<ProxyBody>, Error = Rejection> + Clone + Send + 'static,
    S::Future: Send,
    St: FenceStore,
    B: Body + Send + 'static,
{
    type Response = Response<ProxyBody>;
    type Error = Rejection;
    type Future = RefusedOr<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Rejection>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, routed: Routed<B>) -> Self::Future {
        let checked = match check_head(routed) {
            Ok(checked) => checked,
            Err(rejection) => return RefusedOr::refused(rejection),
        };
        match marks_at_hand(&*self.store.0, checked.fence.as_ref(), &checked.routed.route) {
            Some(Ok(())) => RefusedOr::Passed { inner: self.inner.call(checked) },
            Some(Err(rejection)) => RefusedOr::refused(rejection),
            // A mark the store must read first (the file store's cache did
            // not hold it): the rest waits for it, on a future of its own.
            None => {
                let (inner, store) = (self.inner.clone(), self.store.clone());
                RefusedOr::Boxed {
                    inner: Box::pin(async move {
                        check_marks(&*store.0, checked.fence.as_ref(), &checked.routed.route).await?;
                        inner.oneshot(checked).await
                    }),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use http_body_util::Empty;
    use tower::Layer;

    use super::*;
    use crate::fence::store::{Advance, Deleted, MemoryStore, Selection};
    use crate::route::test_route;
    use crate::stack::head::HeadChecksLayer;
    use tower::ServiceExt;

    /// The memory store, as a store that never has a mark at hand: every
    /// head check then reads the mark the slow way (a file store's cold key).
    #[derive(Default)]
    struct Cold(MemoryStore);

    impl FenceStore for Cold {
        async fn get(&self, key: &str) -> Result<Option<u64>, crate::fence::store::StoreError> {
            self.0.get(key).await
        }
        async fn advance(&self, key: &str, token: u64) -> Result<Advance, crate::fence::store::StoreError> {
            self.0.advance(key, token).await
        }
        async fn list(
            &self,
            prefix: &str,
            after: Option<&str>,
            limit: usize,
        ) -> Result<Vec<(String, u64)>, crate::fence::store::StoreError> {
            self.0.list(prefix, after, limit).await
        }
        async fn delete(&self, which: &Selection) -> Result<Deleted, crate::fence::store::StoreError> {
            self.0.delete(which).await
        }
        fn tracked_keys(&self) -> usize {
            self.0.tracked_keys()
        }
        fn cached_keys(&self) -> usize {
            self.0.cached_keys()
        }
    }

    /// One `PUT /objects/a` with `token` through the head checks over `store`:
    /// its status (200 passed on) and whether it reached the layer below.
    async fn put_through<St: FenceStore>(store: Arc<St>, token: u64) -> (u16, bool) {
        let reached = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let below = {
            let reached = reached.clone();
            tower::service_fn(move |_: Checked<Empty<bytes::Bytes>>| {
                reached.store(true, std::sync::atomic::Ordering::SeqCst);
                async { Ok::<_, Rejection>(Response::new(ProxyBody::default())) }
            })
        };
        let request = http::Request::put("/objects/a")
            .header("x-fencing-token", token.to_string())
            .body(Empty::<bytes::Bytes>::new())
            .unwrap();
        let route = Arc::new(test_route("objects", "/objects/"));
        let routed = Routed { route, request, fenced: true, destination: None, slot_taken: None };
        let status = match HeadChecksLayer::new(store).layer(below).oneshot(routed).await {
            Ok(response) => response.status().as_u16(),
            Err(rejection) => rejection.into_response().status().as_u16(),
        };
        (status, reached.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// A stale token is refused by the head checks (409, nothing below sees
    /// it) and a current one passed on, whether the store has the mark at
    /// hand (decided in `call`) or must read it (a boxed future).
    #[tokio::test]
    async fn a_stale_token_is_refused_from_the_head_whether_the_mark_is_at_hand_or_read() {
        let hot = Arc::new(MemoryStore::default());
        let cold = Arc::new(Cold::default());
        hot.advance("/objects/a", 7).await.unwrap();
        cold.advance("/objects/a", 7).await.unwrap();
        assert_eq!(hot.peek("/objects/a"), Some(Some(7)));
        assert_eq!(cold.peek("/objects/a"), None);
        assert_eq!(put_through(hot.clone(), 6).await, (409, false));
        assert_eq!(put_through(cold.clone(), 6).await, (409, false));
        assert_eq!(put_through(hot, 7).await, (200, true));
        assert_eq!(put_through(cold, 8).await, (200, true));
    }
}
