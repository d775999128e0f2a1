//! The admin listener: health, readiness, metrics, the configuration in
//! force, the fence API and the lease API.
//!
//! The CLI's client of the fence API lives here too ([`client`]), beside the
//! endpoints it calls.
//!
//! It runs on its own address (loopback by default) so that operators and
//! probes never share a port, a connection limit or a failure mode with traffic.

pub mod client;
mod config;
mod fences;
mod json;
pub mod leases;

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
    /// Set when shutdown begins; `/readyz` answers 503 from then on (and only then).
    pub draining: AtomicBool,
    /// Bearer token for fence changes; `None` disables them (403). A config
    /// reload may change it.
    pub auth_token: Arc<arc_swap::ArcSwapOption<String>>,
    /// Bearer tokens for the lease API on some keys; a reload may change them.
    pub lease_tokens: Arc<arc_swap::ArcSwap<Vec<crate::config::LeaseToken>>>,
    /// The configuration in force, for `GET /config`: a reload that is
    /// applied replaces it.
    pub in_force: Arc<arc_swap::ArcSwap<crate::config::Config>>,
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
        "/healthz" | "/readyz" | "/metrics" | "/config" => &[Method::GET, Method::HEAD],
        "/fences" => &[Method::GET, Method::HEAD, Method::PUT, Method::DELETE],
        "/fences/store/confirm" => &[Method::POST],
        "/leases" => &[Method::GET, Method::HEAD, Method::POST, Method::PUT, Method::DELETE],
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
        "/readyz" => readiness(&state, verbose(req.uri().query())),
        "/metrics" => metrics(&state),
        "/config" => config::handle(&state, peer, &req),
        "/fences/store/confirm" => fences::confirm_store(&state, peer, &req).await,
        "/leases" => leases::handle(&state, peer, req).await,
        _ => fences::handle(&state, peer, req).await,
    })
}

/// `/metrics`, with the gauges read now.
fn metrics(state: &AdminState) -> Response<Full<Bytes>> {
    if let (Some(stats), Some(bytes)) = (state.store.stats(), state.store.disk_bytes()) {
        stats.disk_bytes.set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }
    let snapshot = Snapshot {
        store_writable: state.store.unready().is_none(),
        tracked_keys: state.store.tracked_keys(),
        cached_keys: state.store.cached_keys(),
        active_keys: state.gate.active_keys(),
        waiting: state.gate.waiting(),
        buffered_bytes: state.buffers.used(),
    };
    text(StatusCode::OK, "application/openmetrics-text; version=1.0.0; charset=utf-8", state.metrics.encode(snapshot))
}

/// `/readyz`: whether this fencegate serves, which is what a load balancer
/// or a Kubernetes Service needs to know. Only draining makes it 503.
///
/// A fence store that refuses fenced writes (unreachable, distrusted, holding
/// writes after a confirmation, or failing its commits) does not: reads keep
/// flowing and each fenced write gets its own 503, where taking every replica
/// out of the Service would stop the reads too, since a shared store is down
/// for every replica at once. `?verbose` lists each check and its state, and
/// `fencegate_store_writable` says the same to a scraper, for alerts.
fn readiness(state: &AdminState, verbose: bool) -> Response<Full<Bytes>> {
    let draining = state.draining.load(Ordering::Acquire);
    if !verbose {
        return if draining {
            problem(StatusCode::SERVICE_UNAVAILABLE, "Draining", "fencegate is shutting down")
        } else {
            text(StatusCode::OK, "text/plain; charset=utf-8", "ready\n".into())
        };
    }
    let unwritable = state.store.unready();
    let mut body = String::new();
    match draining {
        false => body.push_str("[+]serving ok\n"),
        true => body.push_str("[-]serving failed: fencegate is shutting down\n"),
    }
    match &unwritable {
        None => body.push_str("[+]store-writable ok\n"),
        Some(why) => body.push_str(&format!("[-]store-writable failed: {why}\n")),
    }
    body.push_str(match (draining, unwritable.is_some()) {
        (true, _) => "not ready: draining\n",
        (false, false) => "ready\n",
        (false, true) => "ready: reads are served; fenced writes get 503 until the fence store takes writes again\n",
    });
    let status = if draining { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
    text(status, "text/plain; charset=utf-8", body)
}

/// Whether a `/readyz` query asks for the list of checks: `verbose` with no
/// value or any value but `0` and `false`. Other parameters are ignored, as
/// probes that add their own expect.
fn verbose(query: Option<&str>) -> bool {
    form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .any(|(name, value)| name == "verbose" && value != "0" && value != "false")
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

/// The answer to a request whose handler panicked (tower-http's
/// `CatchPanicLayer` calls it): 500 problem+json, and the panic logged,
/// rather than a reset connection.
pub(crate) fn panicked(panic: Box<dyn std::any::Any + Send + 'static>) -> Response<Full<Bytes>> {
    crate::telemetry::error_limited!(panic = %crate::http::problem::panic_message(&*panic), "an admin request panicked");
    Problem::new(ProblemType::INTERNAL, "the request could not be completed").into_response()
}

/// A problem with no type of its own: the status and title say it all.
fn problem(status: StatusCode, title: &'static str, detail: impl Into<String>) -> Response<Full<Bytes>> {
    Problem::new(ProblemType::blank(status, title), detail).into_response()
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;
    use crate::fence::store::FileStore;

    /// The admin state of a fencegate on a file store in `dir`.
    fn state(dir: &std::path::Path) -> AdminState {
        let store = AnyStore::File(FileStore::open(dir, false, 100).unwrap());
        let metrics = Metrics::new(["objects"], store.stats());
        AdminState {
            store: Arc::new(store),
            gate: Arc::new(KeyGate::default()),
            metrics: Arc::new(metrics),
            buffers: BufferBudget::new(1 << 20),
            draining: AtomicBool::new(false),
            auth_token: Arc::new(arc_swap::ArcSwapOption::empty()),
            lease_tokens: Arc::new(arc_swap::ArcSwap::from_pointee(Vec::new())),
            in_force: Arc::new(arc_swap::ArcSwap::from_pointee(
                crate::config::Config::from_toml_str(crate::config::tests::MINIMAL)
                    .unwrap()
                    .read_secrets_with(None)
                    .unwrap(),
            )),
            max_key_bytes: 1024,
        }
    }

    async fn body(r: Response<Full<Bytes>>) -> (u16, String) {
        let status = r.status().as_u16();
        let bytes = r.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(bytes.to_vec()).unwrap())
    }

    /// A file store whose commits fail (a full disk) refuses fenced writes,
    /// but the replica still serves reads: `/readyz` stays 200, and the
    /// verbose body and the gauge show the store refusing writes. Draining
    /// alone makes `/readyz` 503.
    #[tokio::test]
    async fn a_store_refusing_writes_shows_in_the_verbose_body_and_the_gauge_not_in_the_status() {
        let dir = tempfile::tempdir().unwrap();
        let state = state(dir.path());
        let (status, text) = body(readiness(&state, true)).await;
        assert_eq!((status, text.as_str()), (200, "[+]serving ok\n[+]store-writable ok\nready\n"));
        assert!(body(metrics(&state)).await.1.contains("\nfencegate_store_writable 1\n"));

        state.store.stats().unwrap().failing.store(true, Ordering::Relaxed);
        assert_eq!(body(readiness(&state, false)).await, (200, "ready\n".to_string()));
        let (status, text) = body(readiness(&state, true)).await;
        assert_eq!(status, 200, "{text}");
        assert!(text.contains("[+]serving ok\n"), "{text}");
        assert!(text.contains("[-]store-writable failed: the last fence store commit failed"), "{text}");
        assert!(text.ends_with("fenced writes get 503 until the fence store takes writes again\n"), "{text}");
        assert!(body(metrics(&state)).await.1.contains("\nfencegate_store_writable 0\n"));

        state.draining.store(true, Ordering::Release);
        let (status, text) = body(readiness(&state, false)).await;
        assert_eq!(status, 503, "{text}");
        assert!(text.contains("shutting down"), "{text}");
        let (status, text) = body(readiness(&state, true)).await;
        assert_eq!(status, 503, "{text}");
        assert!(text.starts_with("[-]serving failed: fencegate is shutting down\n"), "{text}");
        assert!(text.ends_with("not ready: draining\n"), "{text}");
        if let AnyStore::File(store) = &*state.store {
            store.close().await;
        }
    }

    #[test]
    fn verbose_is_any_value_but_0_and_false() {
        for query in [Some("verbose"), Some("verbose="), Some("verbose=1"), Some("x=y&verbose=true")] {
            assert!(verbose(query), "{query:?}");
        }
        for query in [None, Some(""), Some("verbose=0"), Some("verbose=false"), Some("verbosity=1")] {
            assert!(!verbose(query), "{query:?}");
        }
    }

    /// A handler that panics answers 500 problem+json through the layer the
    /// admin listener puts around it, instead of resetting the connection.
    #[tokio::test]
    async fn a_panicking_handler_answers_500_problem_json() {
        use tower::{Layer, ServiceExt};
        let panicking = tower::service_fn(|_: Request<()>| async {
            if true {
                panic!("out of cheese");
            }
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
        });
        let service = tower_http::catch_panic::CatchPanicLayer::custom(panicked).layer(panicking);
        let response = service.oneshot(Request::new(())).await.unwrap();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(response.headers()[CONTENT_TYPE], "application/problem+json");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["type"], "urn:fencegate:problem:internal");
    }
}
