//! The admin listener: health, readiness, metrics and the fence API.
//!
//! The CLI's client of the fence API lives here too ([`client`]), beside the
//! endpoints it calls.
//!
//! It runs on its own address (loopback by default) so that operators and
//! probes never share a port, a connection limit or a failure mode with traffic.

pub mod client;
mod fences;
mod json;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::http::ClientBody;
use bytes::Bytes;
use http::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;

use crate::fence::store::{AnyStore, FenceStore};
use crate::fence::KeyGate;
use crate::http::problem::{Problem, ProblemType};
use crate::http::BufferBudget;
use crate::metrics::{Metrics, Snapshot};

/// State the admin endpoints read.
#[derive(Debug)]
pub(crate) struct AdminState {
    /// What the proxy shares, as far as the admin endpoints read it.
    pub store: Arc<AnyStore>,
    pub gate: Arc<KeyGate>,
    pub metrics: Arc<Metrics>,
    pub buffers: Arc<BufferBudget>,
    /// Set when shutdown begins; `/readyz` answers 503 from then on.
    pub draining: AtomicBool,
    /// Bearer token for fence changes; `None` disables them (403). A config
    /// reload may change it.
    pub auth_token: Arc<arc_swap::ArcSwapOption<String>>,
    /// Longest key the fence API takes (`[fences] max_key_bytes`), as the proxy.
    pub max_key_bytes: usize,
}

/// Answers one admin request from `peer`.
pub(crate) async fn handle(
    state: Arc<AdminState>,
    peer: SocketAddr,
    req: Request<ClientBody>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path();
    let allowed: &[Method] = match path {
        "/healthz" | "/readyz" | "/metrics" => &[Method::GET, Method::HEAD],
        "/fences" => &[Method::GET, Method::HEAD, Method::PUT, Method::DELETE],
        "/fences/store/confirm" => &[Method::POST],
        _ => return Ok(problem(StatusCode::NOT_FOUND, "Not found", format!("no admin endpoint at '{path}'"))),
    };
    if !allowed.contains(req.method()) {
        let names: Vec<&str> = allowed.iter().map(Method::as_str).collect();
        let mut r = problem(
            StatusCode::METHOD_NOT_ALLOWED,
            "Method not allowed",
            format!("{path} answers {} only", names.join(", ")),
        );
        r.headers_mut().insert(ALLOW, HeaderValue::from_str(&names.join(", ")).expect("method names are ASCII"));
        return Ok(r);
    }
    Ok(match path {
        "/healthz" => text(StatusCode::OK, "text/plain; charset=utf-8", "ok\n".into()),
        "/readyz" => readiness(&state),
        "/metrics" => {
            if let (Some(stats), Some(bytes)) = (state.store.stats(), state.store.disk_bytes()) {
                stats.disk_bytes.set(i64::try_from(bytes).unwrap_or(i64::MAX));
            }
            let snapshot = Snapshot {
                tracked_keys: state.store.tracked_keys(),
                cached_keys: state.store.cached_keys(),
                active_keys: state.gate.active_keys(),
                waiting: state.gate.waiting(),
                buffered_bytes: state.buffers.used(),
            };
            text(
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                state.metrics.encode(snapshot),
            )
        }
        "/fences/store/confirm" => fences::confirm_store(&state, peer, &req).await,
        _ => fences::handle(&state, peer, req).await,
    })
}

fn readiness(state: &AdminState) -> Response<Full<Bytes>> {
    if state.draining.load(Ordering::Acquire) {
        return problem(StatusCode::SERVICE_UNAVAILABLE, "Draining", "fencegate is shutting down");
    }
    if let Some(why) = state.store.unready() {
        return problem(StatusCode::SERVICE_UNAVAILABLE, "Fence store unavailable", why);
    }
    text(StatusCode::OK, "text/plain; charset=utf-8", "ready\n".into())
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn json_response(status: StatusCode, body: &serde_json::Value) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// A problem with no type of its own: the status and title say it all.
fn problem(status: StatusCode, title: &'static str, detail: impl Into<String>) -> Response<Full<Bytes>> {
    Problem::new(ProblemType::blank(status, title), detail).into_response()
}
