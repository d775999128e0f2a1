//! The lease API: a lease on a fence key whose token comes from the key's
//! own mark (fence/lease.rs), so acquiring it fences the last holder before
//! the new one's first write.
//!
//! - `GET /leases?key=K` → `{"key", "lease": {...} | null, "mark": N | null}`
//! - `POST /leases?key=K` with `{"holder": H, "ttl": "10s", "wait": "2s",
//!   "strict": false}` (`wait`, `strict` optional) → 200 with the lease; a lease another holds → 423
//!   `lease-held` with who holds it and until when, and `Retry-After`.
//! - `PUT /leases?key=K` with `{"token": N, "ttl": "10s"}` → renews; not the
//!   holder's token, or a lease that ran out → 409 `lease-lost`.
//! - `DELETE /leases?key=K` with `{"token": N}` → releases; the mark stays.
//!
//! A lease answers as `{"key", "holder", "token", "expires_at_ms",
//! "expires_in_ms"}`. Changes need a bearer token: `[admin] auth_token` for
//! any key, or a `[[admin.lease_tokens]]` token for the keys under its
//! prefixes. Keys are made canonical as the fence API makes them. Every
//! change, and every refused attempt, is logged at target `fencegate::audit`.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, RETRY_AFTER};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use serde_json::{json, Value};

use super::fences::{checked_query, needs_bearer, presented_bearer, same_secret, unavailable};
use super::{json_response, problem, AdminState};
use crate::fence::lease::{self, is_held, now_ms, Acquired, Held, LeaseError};
use crate::fence::store::{FenceStore, LeaseRecord};
use crate::http::problem::{Problem, ProblemType};
use crate::http::ClientBody;

/// Shortest lease: shorter than a round trip to a shared store, it would
/// run out before its holder heard of it.
pub const MIN_TTL: Duration = Duration::from_millis(100);
/// Longest lease: a holder that dies keeps others waiting this long at most.
pub const MAX_TTL: Duration = Duration::from_secs(3600);
/// Longest wait of an acquisition for a held lease.
pub const MAX_WAIT: Duration = Duration::from_secs(60);
/// Longest holder name, in bytes.
pub const MAX_HOLDER_BYTES: usize = 256;
/// Largest body read.
const MAX_BODY: usize = 4096;

pub(super) async fn handle(state: &AdminState, peer: SocketAddr, req: Request<ClientBody>) -> Response<Full<Bytes>> {
    let key = match lease_key(state, &req) {
        Ok(key) => key,
        Err(refused) => return *refused,
    };
    if req.method() == Method::GET || req.method() == Method::HEAD {
        return show(state, key).await;
    }
    if let Some(refused) = unauthorized(state, peer, &req, &key) {
        return refused;
    }
    let method = req.method().clone();
    let body = match read_body(req).await {
        Ok(body) => body,
        Err(refused) => return *refused,
    };
    match method {
        Method::POST => acquire(state, peer, key, &body).await,
        Method::PUT => renew(state, peer, key, &body).await,
        _ => release(state, peer, key, &body).await,
    }
}

/// The one query parameter, `key`, canonical and within `max_key_bytes`.
fn lease_key<B>(state: &AdminState, req: &Request<B>) -> Result<String, Box<Response<Full<Bytes>>>> {
    let query = checked_query(state, req)?;
    match (query.key, query.prefix, query.after, query.limit, query.all) {
        (Some(key), None, None, None, None) => Ok(key),
        _ => Err(Box::new(problem(StatusCode::BAD_REQUEST, "Bad query", "/leases takes exactly one parameter: key"))),
    }
}

/// The refusal of a change without a bearer token that covers `key`.
fn unauthorized<B>(state: &AdminState, peer: SocketAddr, req: &Request<B>, key: &str) -> Option<Response<Full<Bytes>>> {
    let admin = state.auth_token.load();
    let scoped = state.lease_tokens.load();
    if admin.is_none() && scoped.is_empty() {
        return Some(problem(
            StatusCode::FORBIDDEN,
            "Lease changes disabled",
            "no [admin] auth_token or [[admin.lease_tokens]] is configured, so the lease API is read-only",
        ));
    }
    let presented = match presented_bearer(peer, req, "lease change") {
        Ok(presented) => presented,
        Err(refused) => return Some(*refused),
    };
    let Some(presented) = presented else {
        crate::telemetry::warn_limited!(target: "fencegate::audit", caller = %peer, key, "lease change refused: no bearer token");
        return Some(needs_bearer("lease changes need 'Authorization: Bearer <token>'"));
    };
    if admin.as_deref().is_some_and(|t| same_secret(presented, t)) {
        return None;
    }
    // Every scoped token is compared, whichever matches: the time taken does
    // not tell which one it was.
    let mut matched = None;
    for token in scoped.iter() {
        if same_secret(presented, &token.token) {
            matched = Some(token);
        }
    }
    match matched {
        Some(token) if token.covers(key) => None,
        Some(_) => {
            crate::telemetry::warn_limited!(target: "fencegate::audit", caller = %peer, key, "lease change refused: the token does not cover the key");
            Some(problem(
                StatusCode::FORBIDDEN,
                "Forbidden",
                format!("this bearer token takes leases only on keys under its prefixes, not on '{key}'"),
            ))
        }
        None => {
            crate::telemetry::warn_limited!(target: "fencegate::audit", caller = %peer, key, "lease change refused: wrong bearer token");
            Some(needs_bearer("lease changes need 'Authorization: Bearer <token>'"))
        }
    }
}

async fn read_body(req: Request<ClientBody>) -> Result<Bytes, Box<Response<Full<Bytes>>>> {
    match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(body) => Ok(body.to_bytes()),
        Err(e) => Err(Box::new(problem(
            StatusCode::BAD_REQUEST,
            "Bad body",
            format!("cannot read a body of at most {MAX_BODY} bytes: {e}"),
        ))),
    }
}

/// A lease as the API answers it.
fn lease_json(key: &str, record: &LeaseRecord) -> Value {
    json!({
        "key": key,
        "holder": record.holder,
        "token": record.token,
        "expires_at_ms": record.expires_ms,
        "expires_in_ms": record.expires_ms.saturating_sub(now_ms()),
    })
}

async fn show(state: &AdminState, key: String) -> Response<Full<Bytes>> {
    let store = &state.store;
    let (record, mark) = match (store.lease(&key).await, store.get(&key).await) {
        (Ok(record), Ok(mark)) => (record, mark),
        (Err(e), _) | (_, Err(e)) => return unavailable(e.to_string()),
    };
    let lease = record.filter(|r| is_held(r, now_ms())).map(|r| lease_json(&key, &r));
    json_response(StatusCode::OK, &json!({ "key": key, "lease": lease, "mark": mark }))
}

/// A duration field of a body: a humantime string (`"10s"`, `"250ms"`)
/// within `min` and `max`; otherwise the 400's detail.
fn duration(name: &str, text: &str, min: Duration, max: Duration) -> Result<Duration, String> {
    let d = humantime::parse_duration(text)
        .map_err(|e| format!("{name}: '{text}' is no duration such as \"10s\" ({e})"))?;
    if d < min || d > max {
        let show = humantime::format_duration;
        return Err(format!("{name}: {} is outside {} to {}", show(d), show(min), show(max)));
    }
    Ok(d)
}

fn bad_body(expected: &str, e: String) -> Response<Full<Bytes>> {
    problem(StatusCode::BAD_REQUEST, "Bad body", format!("expected {expected} ({e})"))
}

async fn acquire(state: &AdminState, peer: SocketAddr, key: String, body: &[u8]) -> Response<Full<Bytes>> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct AcquireBody {
        holder: String,
        ttl: String,
        wait: Option<String>,
        strict: Option<bool>,
    }
    let b = match super::json::object::<AcquireBody>(body) {
        Ok(b) => b,
        Err(e) => {
            let expected =
                "{\"holder\": \"name\", \"ttl\": \"10s\", \"wait\": \"2s\", \"strict\": false} (wait, strict optional)";
            return bad_body(expected, e);
        }
    };
    if b.holder.is_empty() || b.holder.len() > MAX_HOLDER_BYTES || b.holder.chars().any(char::is_control) {
        let detail = format!("holder must be 1 to {MAX_HOLDER_BYTES} bytes of text with no control characters");
        return problem(StatusCode::BAD_REQUEST, "Bad body", detail);
    }
    let ttl = match duration("ttl", &b.ttl, MIN_TTL, MAX_TTL) {
        Ok(d) => d,
        Err(detail) => return problem(StatusCode::BAD_REQUEST, "Bad body", detail),
    };
    let wait = match b.wait.as_deref().map(|w| duration("wait", w, Duration::ZERO, MAX_WAIT)).transpose() {
        Ok(d) => d.unwrap_or_default(),
        Err(detail) => return problem(StatusCode::BAD_REQUEST, "Bad body", detail),
    };
    let asked = lease::Asked { holder: b.holder, ttl, wait, strict: b.strict.unwrap_or(false) };
    match lease::acquire(&*state.store, &state.gate, &key, &asked).await {
        Ok(Acquired::Granted(record)) => {
            tracing::info!(target: "fencegate::audit", caller = %peer, key, holder = %record.holder, token = record.token, ttl_ms = ttl.as_millis() as u64, "lease acquired");
            json_response(StatusCode::OK, &lease_json(&key, &record))
        }
        Ok(Acquired::Held(record)) => {
            tracing::info!(target: "fencegate::audit", caller = %peer, key, holder = %asked.holder, held_by = %record.holder, "lease held by another");
            let left = record.expires_ms.saturating_sub(now_ms());
            let detail = format!("'{}' holds the lease of '{key}' for {left} ms more", record.holder);
            Problem::new(ProblemType::LEASE_HELD, detail)
                .member("key", key)
                .member("holder", record.holder)
                .member("token", record.token)
                .member("expires_at_ms", record.expires_ms)
                .member("expires_in_ms", left)
                .header(RETRY_AFTER, HeaderValue::from(left.div_ceil(1000).max(1)))
                .into_response()
        }
        Err(e) => failed(e),
    }
}

/// `{"token": N}` and, for a renewal, `"ttl"`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct HolderBody {
    token: u64,
    ttl: Option<String>,
}

async fn renew(state: &AdminState, peer: SocketAddr, key: String, body: &[u8]) -> Response<Full<Bytes>> {
    let b = match super::json::object::<HolderBody>(body) {
        Ok(b) => b,
        Err(e) => return bad_body("{\"token\": N, \"ttl\": \"10s\"}", e),
    };
    let Some(ttl) = b.ttl else {
        return bad_body("{\"token\": N, \"ttl\": \"10s\"}", "ttl is missing".into());
    };
    let ttl = match duration("ttl", &ttl, MIN_TTL, MAX_TTL) {
        Ok(d) => d,
        Err(detail) => return problem(StatusCode::BAD_REQUEST, "Bad body", detail),
    };
    match lease::renew(&*state.store, &key, b.token, ttl).await {
        Ok(Held::Yes(record)) => {
            tracing::info!(target: "fencegate::audit", caller = %peer, key, token = b.token, ttl_ms = ttl.as_millis() as u64, "lease renewed");
            json_response(StatusCode::OK, &lease_json(&key, &record))
        }
        Ok(Held::No(now)) => lost(peer, "renewal", key, b.token, now),
        Err(e) => failed(e),
    }
}

async fn release(state: &AdminState, peer: SocketAddr, key: String, body: &[u8]) -> Response<Full<Bytes>> {
    let b = match super::json::object::<HolderBody>(body) {
        Ok(HolderBody { ttl: None, token }) => token,
        Ok(_) => return bad_body("{\"token\": N}", "a release takes no ttl".into()),
        Err(e) => return bad_body("{\"token\": N}", e),
    };
    match lease::release(&*state.store, &key, b).await {
        Ok(Held::Yes(record)) => {
            tracing::info!(target: "fencegate::audit", caller = %peer, key, token = b, holder = %record.holder, "lease released");
            json_response(StatusCode::OK, &json!({ "key": key, "released": true, "token": b }))
        }
        Ok(Held::No(now)) => lost(peer, "release", key, b, now),
        Err(e) => failed(e),
    }
}

/// 409 `lease-lost`: the caller's token holds no lease of the key now.
fn lost(peer: SocketAddr, what: &str, key: String, token: u64, now: Option<LeaseRecord>) -> Response<Full<Bytes>> {
    tracing::info!(target: "fencegate::audit", caller = %peer, key, token, "lease {what} refused: not held with this token");
    let held = now.filter(|r| is_held(r, now_ms()));
    let detail = match &held {
        Some(r) => format!("the lease of '{key}' is held by '{}' with token {}, not {token}", r.holder, r.token),
        None => format!("no lease of '{key}' is held with token {token}: it ran out or was released"),
    };
    let mut p = Problem::new(ProblemType::LEASE_LOST, detail).member("key", key.clone()).member("token", token);
    if let Some(r) = held {
        p = p.member("lease", lease_json(&key, &r));
    }
    p.into_response()
}

fn failed(e: LeaseError) -> Response<Full<Bytes>> {
    match e {
        LeaseError::Exhausted => problem(StatusCode::CONFLICT, "No token left", e.to_string()),
        LeaseError::Store(_) | LeaseError::Contended | LeaseError::Busy => unavailable(e.to_string()),
    }
}
