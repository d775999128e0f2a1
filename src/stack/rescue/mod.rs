//! The rescue: a panic in the layers below (in their `call` or their
//! future) becomes a refusal, an internal error, so no panic ever reaches
//! hyper as a reset connection.
//!
//! It sits just inside the access log, which answers every refusal with its
//! problem+json response naming the request's ID (`request_id`), and logs
//! and counts it like any other response.

mod future;
mod layer;
mod service;
#[cfg(test)]
mod tests;

use std::any::Any;

pub use future::RescueFuture;
pub use layer::RescueLayer;
pub use service::Rescue;

use crate::stack::error::{ProxyError, Rejection};

/// The refusal for a panic below the rescue layer: a 500 problem.
fn panic_rejection(panic: Box<dyn Any + Send + 'static>) -> Rejection {
    crate::telemetry::error_limited!(panic = %crate::http::problem::panic_message(&*panic), "a request panicked");
    Rejection::from(ProxyError::Internal { context: "the request could not be completed", source: None })
}
