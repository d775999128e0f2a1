//! The rescue: every refusal from the layers below becomes its problem+json
//! response, and a panic becomes a 500 problem, so no error ever reaches
//! hyper as a reset connection.

use std::any::Any;
use std::convert::Infallible;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;
use tower::{Layer, Service};

use crate::http::ProxyBody;
use crate::stack::error::{ProxyError, Rejection};

/// Turns every [`Rejection`] into its problem+json response, and a panic
/// in the layers below (in their `call` or their future) into a 500 problem.
/// (Caught here rather than by tower-http's catch-panic layer, which boxes
/// every response body to give its own answer a type.)
#[derive(Debug, Clone, Copy)]
pub struct RescueLayer;

impl<S> Layer<S> for RescueLayer {
    type Service = Rescue<S>;

    fn layer(&self, inner: S) -> Rescue<S> {
        Rescue { inner }
    }
}

/// See [`RescueLayer`].
#[derive(Debug, Clone)]
pub struct Rescue<S> {
    inner: S,
}

impl<S, R> Service<R> for Rescue<S>
where
    S: Service<R, Response = Response<ProxyBody>, Error = Rejection>,
    S::Future: Send + 'static,
{
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = RescueFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The layers below are always ready; were one not, its refusal is
        // answered with the request's response, not by closing the connection.
        match self.inner.poll_ready(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(_) => Poll::Ready(Ok(())),
        }
    }

    fn call(&mut self, req: R) -> Self::Future {
        match catch_unwind(AssertUnwindSafe(|| self.inner.call(req))) {
            Ok(inner) => RescueFuture::Running { inner },
            Err(panic) => RescueFuture::Panicked { response: Some(panic_response(panic)) },
        }
    }
}

pin_project_lite::pin_project! {
    /// [`Rescue`]'s response future.
    #[project = RescueProj]
    pub enum RescueFuture<F> {
        Running { #[pin] inner: F },
        Panicked { response: Option<Response<ProxyBody>> },
    }
}

impl<F> Future for RescueFuture<F>
where
    F: Future<Output = Result<Response<ProxyBody>, Rejection>>,
{
    type Output = Result<Response<ProxyBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            // A future that panicked is not polled again: the 500 is its
            // answer, and dropping it runs what its drops run (a key's turn
            // passed on or held for its settle period).
            RescueProj::Running { inner } => match catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
                Ok(poll) => poll.map(|result| Ok(result.unwrap_or_else(Rejection::into_response))),
                Err(panic) => Poll::Ready(Ok(panic_response(panic))),
            },
            RescueProj::Panicked { response } => {
                Poll::Ready(Ok(response.take().expect("RescueFuture polled after it was done")))
            }
        }
    }
}

/// The 500 problem for a panic below the rescue layer.
fn panic_response(panic: Box<dyn Any + Send + 'static>) -> Response<ProxyBody> {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".to_string());
    crate::telemetry::error_limited!(panic = %what, "a request panicked");
    Rejection::from(ProxyError::Internal { context: "the request could not be completed", source: None })
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::Outcome;
    use http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    /// A 500 problem with its decision, as the rescue answers a panic.
    async fn assert_internal(response: Response<ProxyBody>) {
        assert_eq!(response.status(), 500);
        assert_eq!(response.headers()["content-type"], "application/problem+json");
        assert_eq!(response.body().decision().map(|d| d.outcome), Some(Outcome::Internal));
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(problem["type"], "urn:fencegate:problem:internal");
        assert_eq!(problem["status"], 500);
    }

    /// A panic in the future below the rescue becomes a 500 problem; it
    /// never unwinds into hyper.
    #[tokio::test]
    async fn a_panic_in_the_future_becomes_a_500_problem() {
        let panicking = tower::service_fn(|_: Request<()>| async move {
            if true {
                panic!("a bug");
            }
            Ok::<Response<ProxyBody>, Rejection>(Response::new(ProxyBody::default()))
        });
        assert_internal(RescueLayer.layer(panicking).oneshot(Request::new(())).await.unwrap()).await;
    }

    /// So does a panic in the service's `call`, before there is a future.
    #[tokio::test]
    async fn a_panic_in_call_becomes_a_500_problem() {
        #[derive(Clone)]
        struct PanicsInCall;
        impl Service<Request<()>> for PanicsInCall {
            type Response = Response<ProxyBody>;
            type Error = Rejection;
            type Future = std::future::Ready<Result<Response<ProxyBody>, Rejection>>;
            fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Rejection>> {
                Poll::Ready(Ok(()))
            }
            fn call(&mut self, _: Request<()>) -> Self::Future {
                panic!("a bug in call")
            }
        }
        assert_internal(RescueLayer.layer(PanicsInCall).oneshot(Request::new(())).await.unwrap()).await;
    }

    /// The rescue answers every refusal with its problem, never an error.
    #[tokio::test]
    async fn the_rescue_answers_refusals() {
        let refusing = tower::service_fn(|_: Request<()>| async move {
            Err::<Response<ProxyBody>, _>(Rejection::from(ProxyError::BufferFull(1)))
        });
        let response = RescueLayer.layer(refusing).oneshot(Request::new(())).await.unwrap();
        assert_eq!(response.status(), 503);
        assert_eq!(response.headers()["retry-after"], "1");
    }
}
