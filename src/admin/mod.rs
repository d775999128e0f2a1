//! The admin listener: health, readiness and metrics.
//!
//! It runs on its own address (loopback by default) so that operators and
//! probes never share a port, a connection limit or a failure mode with traffic.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use serde_json::json;

use crate::fence::store::FenceStore;
use crate::metrics::Snapshot;
use crate::stack::Shared;

/// State the admin endpoints read.
#[derive(Debug)]
pub struct AdminState {
    pub shared: Arc<Shared>,
    /// Set when shutdown begins; `/readyz` answers 503 from then on.
    pub draining: AtomicBool,
}

/// Answers one admin request.
pub async fn handle(state: Arc<AdminState>, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path();
    let known = matches!(path, "/healthz" | "/readyz" | "/metrics");
    if !known {
        return Ok(problem(StatusCode::NOT_FOUND, "Not found", &format!("no admin endpoint at '{path}'")));
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = problem(StatusCode::METHOD_NOT_ALLOWED, "Method not allowed", &format!("{path} answers GET only"));
        r.headers_mut().insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return Ok(r);
    }
    Ok(match path {
        "/healthz" => text(StatusCode::OK, "text/plain; charset=utf-8", "ok\n".into()),
        "/readyz" if state.draining.load(Ordering::Acquire) => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "Draining",
            "fencegate is shutting down and accepts no new connections",
        ),
        "/readyz" => text(StatusCode::OK, "text/plain; charset=utf-8", "ready\n".into()),
        _ => {
            let shared = &state.shared;
            let snapshot = Snapshot {
                tracked_keys: shared.store.tracked_keys(),
                active_keys: shared.gate.active_keys(),
                waiting: shared.gate.waiting(),
            };
            text(
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                shared.metrics.encode(snapshot),
            )
        }
    })
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn problem(status: StatusCode, title: &str, detail: &str) -> Response<Full<Bytes>> {
    let body = json!({
        "type": "about:blank",
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
    r
}
