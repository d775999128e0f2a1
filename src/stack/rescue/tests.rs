//! Tests of the rescue as a whole: panics, in `call` or in the future,
//! become refusals, answered as every refusal is.

use std::task::{Context, Poll};

use http::{Request, Response};
use http_body_util::BodyExt;
use tower::{Layer, Service, ServiceExt};

use super::RescueLayer;
use crate::http::{Outcome, ProxyBody};
use crate::stack::error::{ProxyError, Rejection};

/// A 500 problem with its decision, as a panic is answered.
async fn assert_internal(refusal: Result<Response<ProxyBody>, Rejection>) {
    let response = refusal.expect_err("a panic is a refusal").into_response();
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
    assert_internal(RescueLayer.layer(panicking).oneshot(Request::new(())).await).await;
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
    assert_internal(RescueLayer.layer(PanicsInCall).oneshot(Request::new(())).await).await;
}

/// A refusal from below goes up as it is, for the access log to answer.
#[tokio::test]
async fn the_rescue_passes_refusals_on() {
    let refusing = tower::service_fn(|_: Request<()>| async move {
        Err::<Response<ProxyBody>, _>(Rejection::from(ProxyError::BufferFull(1)))
    });
    let refusal = RescueLayer.layer(refusing).oneshot(Request::new(())).await.expect_err("a refusal");
    let response = refusal.into_response();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "1");
}
