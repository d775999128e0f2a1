//! The rescue: every refusal from the layers below becomes its problem+json
//! response, and a panic becomes a 500 problem, so no error ever reaches
//! hyper as a reset connection.
//!
//! It sits just inside the access log: outside every layer that refuses, so
//! it answers them all, and inside the log, so each answer is logged and
//! counted like any other response. Each problem names the request's ID
//! (`request_id`), which the access log gave the request's head.

mod future;
mod layer;
mod service;
#[cfg(test)]
mod tests;

use std::any::Any;

use http::header::HeaderValue;
use http::Response;

pub use future::RescueFuture;
pub use layer::RescueLayer;
pub use service::Rescue;

use crate::http::ProxyBody;
use crate::stack::error::{ProxyError, Rejection};

/// The 500 problem for a panic below the rescue layer, for the request
/// `request_id`.
fn panic_response(panic: Box<dyn Any + Send + 'static>, request_id: Option<&HeaderValue>) -> Response<ProxyBody> {
    crate::telemetry::error_limited!(panic = %crate::http::problem::panic_message(&*panic), "a request panicked");
    Rejection::from(ProxyError::Internal { context: "the request could not be completed", source: None })
        .into_response_for(request_id)
}
