//! The fence API: read marks, page through them, and raise one ahead of the
//! first write (pre-fencing: a new lock owner fences older owners at
//! acquisition).
//!
//! - `GET /fences?key=K` → `{"key": K, "token": N | null}`
//! - `GET /fences?prefix=P&limit=L&after=K` → `{"fences": [{"key", "token"}...], "next": K | null}`
//! - `PUT /fences?key=K` with `{"token": N}` → raises the mark; a lower `N` → 409
//!   with the current mark, and nothing changes.
//! - `DELETE /fences?key=K` → `{"key": K, "deleted": 0|1, "token": N | null}`;
//!   `DELETE /fences?prefix=P` → `{"prefix": P, "deleted": N}`. A prefix that
//!   would match every key (`""` or `/`) also needs `all=true`; one with a dot
//!   segment or a doubled slash is refused (made canonical, it would match more
//!   than typed). Deleting a mark readmits every holder of the key, stale ones
//!   included: for keys known dead.
//!
//! Changes need `Authorization: Bearer` matching `[admin] auth_token` (401
//! otherwise; more than one `Authorization` header, whatever they hold, is
//! 400); with no token configured, they are refused with 403. A JSON body
//! is one object whose names each appear once (400 otherwise). Every
//! change, and every refused attempt, is logged at target `fencegate::audit`.
//! Keys longer than `[fences] max_key_bytes` are refused (400 `bad-key`), as
//! the proxy refuses them.

use std::net::SocketAddr;

use crate::http::ClientBody;
use bytes::Bytes;
use http::header::{HeaderValue, AUTHORIZATION, WWW_AUTHENTICATE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use serde_json::json;
use subtle::ConstantTimeEq;

use super::{json_response, problem, AdminState};
use crate::canonical::{self, admin_key, check_query_utf8, PathError};
use crate::fence::store::{Advance, FenceStore, Selection, MAX_LIST_LIMIT};
use crate::http::problem::{Problem, ProblemType, CURRENT_TOKEN_HEADER};

/// Default page size of a listing.
const DEFAULT_LIMIT: usize = 100;
/// Largest `PUT /fences` body read.
const MAX_BODY: usize = 4096;

/// The query parameters of `/fences`, each at most once.
#[derive(Debug, Default)]
pub(super) struct Query {
    pub(super) key: Option<String>,
    pub(super) prefix: Option<String>,
    pub(super) after: Option<String>,
    pub(super) limit: Option<String>,
    pub(super) all: Option<String>,
}

/// Why a query string was refused (400 either way); the Display is the
/// problem's `detail`.
#[derive(Debug, thiserror::Error)]
enum FenceQueryError {
    /// A name or value whose escapes are not UTF-8 text.
    #[error(transparent)]
    NotUtf8(#[from] canonical::QueryError),
    #[error("unknown query parameter '{0}' (use key, prefix, after, limit, all)")]
    Unknown(String),
    #[error("query parameter '{0}' appears more than once")]
    Repeated(String),
    /// A key or prefix that is no canonical path (the `bad-path` problem).
    #[error("{name} '{text}' cannot be made canonical: {source}")]
    NotCanonical { name: &'static str, text: String, source: PathError },
}

impl FenceQueryError {
    fn into_response(self) -> Response<Full<Bytes>> {
        match self {
            FenceQueryError::NotCanonical { .. } => {
                Problem::new(ProblemType::BAD_PATH, self.to_string()).into_response()
            }
            _ => problem(StatusCode::BAD_REQUEST, "Bad query", self.to_string()),
        }
    }
}

/// Reads the query string. Values are percent-decoded once, as a path is:
/// `+` stays a plus sign (form decoding would make it a space, and a key typed
/// by hand would silently miss the fence a request has). Keys and prefixes
/// are then made canonical like request paths ([`admin_key`]), so
/// `/objects/%61` and `/objects/./a` name the fence `/objects/a` has.
fn parse_query(query: &str) -> Result<Query, FenceQueryError> {
    let mut q = Query::default();
    // Decoded lossily below: `key=/a/%FF` would name the key of U+FFFD.
    check_query_utf8(query)?;
    let query = query.replace('+', "%2B");
    for (name, value) in form_urlencoded::parse(query.as_bytes()) {
        let slot = match &*name {
            "key" => &mut q.key,
            "prefix" => &mut q.prefix,
            "after" => &mut q.after,
            "limit" => &mut q.limit,
            "all" => &mut q.all,
            other => return Err(FenceQueryError::Unknown(other.to_string())),
        };
        if slot.replace(value.into_owned()).is_some() {
            return Err(FenceQueryError::Repeated(name.into_owned()));
        }
    }
    for (name, slot) in [("key", &mut q.key), ("prefix", &mut q.prefix)] {
        if let Some(text) = slot.as_deref() {
            match admin_key(text) {
                Ok(canonical) => *slot = Some(canonical.into_owned()),
                Err(source) => return Err(FenceQueryError::NotCanonical { name, text: text.to_string(), source }),
            }
        }
    }
    Ok(q)
}

/// The `prefix` parameter as typed: percent-decoded once, not yet canonical.
fn typed_prefix<B>(req: &Request<B>) -> Option<String> {
    let query = req.uri().query()?.replace('+', "%2B");
    form_urlencoded::parse(query.as_bytes()).find(|(name, _)| name == "prefix").map(|(_, v)| v.into_owned())
}

/// The refusal of a key or prefix longer than any key the proxy makes: such a
/// key has no mark to read, and must get none.
fn too_long(query: &Query, max_key_bytes: usize) -> Option<Response<Full<Bytes>>> {
    for (name, text) in [("key", &query.key), ("prefix", &query.prefix), ("after", &query.after)] {
        if let Some(text) = text.as_deref().filter(|t| t.len() > max_key_bytes) {
            let detail = format!("{name} is {} bytes long; [fences] max_key_bytes allows {max_key_bytes}", text.len());
            return Some(Problem::new(ProblemType::BAD_KEY, detail).into_response());
        }
    }
    None
}

pub(super) async fn handle(state: &AdminState, peer: SocketAddr, req: Request<ClientBody>) -> Response<Full<Bytes>> {
    if req.method() == Method::PUT {
        return raise(state, peer, req).await;
    }
    if req.method() == Method::DELETE {
        return delete(state, peer, req).await;
    }
    let query = match checked_query(state, &req) {
        Ok(query) => query,
        Err(refused) => return *refused,
    };
    let store = &state.store;
    if query.all.is_some() {
        return problem(StatusCode::BAD_REQUEST, "Bad query", "all applies to DELETE only");
    }
    if let Some(key) = query.key {
        if query.prefix.is_some() || query.after.is_some() || query.limit.is_some() {
            return problem(StatusCode::BAD_REQUEST, "Bad query", "key reads one fence; prefix, after and limit page");
        }
        return match store.get(&key).await {
            Ok(token) => json_response(StatusCode::OK, &json!({ "key": key, "token": token })),
            Err(e) => unavailable(e.to_string()),
        };
    }
    let limit = match query.limit.as_deref().map(str::parse::<usize>) {
        None => DEFAULT_LIMIT,
        Some(Ok(n)) if (1..=MAX_LIST_LIMIT).contains(&n) => n,
        Some(_) => {
            return problem(
                StatusCode::BAD_REQUEST,
                "Bad query",
                format!("limit must be a whole number from 1 to {MAX_LIST_LIMIT}"),
            )
        }
    };
    let prefix = query.prefix.unwrap_or_default();
    // One more than asked tells whether another page follows.
    match store.list(&prefix, query.after.as_deref(), limit + 1).await {
        Ok(mut fences) => {
            let more = fences.len() > limit;
            fences.truncate(limit);
            let next = if more { fences.last().map(|(k, _)| k.clone()) } else { None };
            let fences: Vec<_> = fences.into_iter().map(|(key, token)| json!({ "key": key, "token": token })).collect();
            json_response(StatusCode::OK, &json!({ "fences": fences, "next": next }))
        }
        Err(e) => unavailable(e.to_string()),
    }
}

/// The refusal of a change without the configured bearer token, if it has not.
fn unauthorized<B>(state: &AdminState, peer: SocketAddr, req: &Request<B>) -> Option<Response<Full<Bytes>>> {
    let expected = state.auth_token.load();
    let Some(expected) = expected.as_deref() else {
        return Some(problem(
            StatusCode::FORBIDDEN,
            "Fence changes disabled",
            "no [admin] auth_token is configured, so the fence API is read-only",
        ));
    };
    let presented = match presented_bearer(peer, req, "fence change") {
        Ok(presented) => presented,
        Err(refused) => return Some(*refused),
    };
    if !presented.is_some_and(|p| same_secret(p, expected)) {
        crate::telemetry::warn_limited!(target: "fencegate::audit", caller = %peer, "fence change refused: missing or wrong bearer token");
        return Some(needs_bearer("fence changes need 'Authorization: Bearer <[admin] auth_token>'"));
    }
    None
}

/// The bearer token `req` presents, if any; a request with more than one
/// `Authorization` header is refused (400) whatever they hold: answering as
/// if only one counted lets whatever sits in front (a proxy that checks or
/// adds one of them) and fencegate disagree on who is asking. `what` names
/// the call in the audit line.
pub(super) fn presented_bearer<'r, B>(
    peer: SocketAddr,
    req: &'r Request<B>,
    what: &str,
) -> Result<Option<&'r str>, Box<Response<Full<Bytes>>>> {
    if req.headers().get_all(AUTHORIZATION).iter().nth(1).is_some() {
        crate::telemetry::warn_limited!(target: "fencegate::audit", caller = %peer, "{what} refused: more than one Authorization header");
        return Err(Box::new(problem(
            StatusCode::BAD_REQUEST,
            "Bad request",
            "more than one Authorization header; send one: 'Authorization: Bearer <token>'",
        )));
    }
    // The scheme name is case-insensitive (RFC 9110 §11.1); the token is not.
    Ok(req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim()))
}

/// Whether a presented token is `expected`, compared in constant time over
/// the bytes: a mismatch does not tell how much matched.
pub(super) fn same_secret(presented: &str, expected: &str) -> bool {
    bool::from(presented.as_bytes().ct_eq(expected.as_bytes()))
}

/// 401 with `WWW-Authenticate: Bearer`.
pub(super) fn needs_bearer(detail: &str) -> Response<Full<Bytes>> {
    let mut r = problem(StatusCode::UNAUTHORIZED, "Unauthorized", detail.to_owned());
    r.headers_mut().insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

/// The request's query, parsed, with its key, prefix and cursor within
/// `max_key_bytes`; or the refusal to answer with.
pub(super) fn checked_query<B>(state: &AdminState, req: &Request<B>) -> Result<Query, Box<Response<Full<Bytes>>>> {
    let query = parse_query(req.uri().query().unwrap_or("")).map_err(|e| Box::new(e.into_response()))?;
    match too_long(&query, state.max_key_bytes) {
        Some(refused) => Err(Box::new(refused)),
        None => Ok(query),
    }
}

/// `POST /fences/store/confirm`: an operator's word that a shared store
/// fencegate stopped trusting (it lost its identity, or answered a mark
/// below one seen) may be used as it is now, once this replica's remembered
/// marks are raised back into it.
pub(super) async fn confirm_store<B>(state: &AdminState, peer: SocketAddr, req: &Request<B>) -> Response<Full<Bytes>> {
    if let Some(refused) = unauthorized(state, peer, req) {
        return refused;
    }
    match state.store.confirm().await {
        Ok(None) => problem(
            StatusCode::CONFLICT,
            "Not a shared store",
            "only store = \"redis\" is confirmed; this fencegate keeps its fences itself",
        ),
        Ok(Some(done)) => {
            tracing::warn!(
                target: "fencegate::audit",
                caller = %peer,
                identity = %done.identity,
                previous = %done.previous,
                restored = done.restored,
                held_ms = done.held.as_millis() as u64,
                "fence store confirmed"
            );
            let body = json!({
                "identity": done.identity,
                "previous": done.previous,
                "restored": done.restored,
                "held_ms": done.held.as_millis() as u64,
            });
            json_response(StatusCode::OK, &body)
        }
        Err(e) => unavailable(e.to_string()),
    }
}

async fn raise(state: &AdminState, peer: SocketAddr, req: Request<ClientBody>) -> Response<Full<Bytes>> {
    if let Some(refused) = unauthorized(state, peer, &req) {
        return refused;
    }
    let query = match checked_query(state, &req) {
        Ok(query) => query,
        Err(refused) => return *refused,
    };
    let (Some(key), None, None, None, None) = (query.key, query.prefix, query.after, query.limit, query.all) else {
        return problem(StatusCode::BAD_REQUEST, "Bad query", "PUT /fences takes exactly one parameter: key");
    };
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(body) => body.to_bytes(),
        Err(e) => {
            return problem(
                StatusCode::BAD_REQUEST,
                "Bad body",
                format!("cannot read a body of at most {MAX_BODY} bytes: {e}"),
            )
        }
    };
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct RaiseBody {
        token: u64,
    }
    let token = match super::json::object::<RaiseBody>(&body) {
        Ok(b) => b.token,
        Err(e) => {
            return problem(
                StatusCode::BAD_REQUEST,
                "Bad body",
                format!("expected {{\"token\": N}} with N a whole number from 0 to 18446744073709551615 ({e})"),
            )
        }
    };
    match state.store.advance(&key, token).await {
        Ok(Advance::Accepted { previous }) => {
            tracing::info!(target: "fencegate::audit", caller = %peer, key, token, previous, "fence raised");
            json_response(StatusCode::OK, &json!({ "key": key, "token": token, "previous": previous }))
        }
        Ok(Advance::Stale { current }) => {
            tracing::info!(target: "fencegate::audit", caller = %peer, key, token, current, "fence lowering refused");
            let detail = format!("token {token} is lower than the fence {current}; a fence never goes back");
            Problem::new(ProblemType::STALE_TOKEN, detail)
                .member("key", key)
                .member("token", token)
                .member("current", current)
                .header(CURRENT_TOKEN_HEADER, HeaderValue::from(current))
                .into_response()
        }
        Err(e) => unavailable(e.to_string()),
    }
}

/// Why a delete's prefix, as typed (percent-decoded once), is refused: made
/// canonical, a dot segment or a doubled slash would name a shorter prefix
/// than the one typed (`/objects/tenant/..` is `/objects/`), and the delete
/// would take marks nobody asked for.
fn widening(typed: &str) -> Option<&'static str> {
    if !typed.starts_with('/') {
        return None;
    }
    let segments: Vec<&str> = typed.split('/').skip(1).collect();
    let last = segments.len().saturating_sub(1);
    for (i, segment) in segments.iter().enumerate() {
        let dots = segment.replace("%2e", ".").replace("%2E", ".");
        if dots == "." || dots == ".." {
            return Some("a '.' or '..' segment");
        }
        if segment.is_empty() && i != last {
            return Some("an empty segment ('//')");
        }
    }
    None
}

/// Whether deleting by `prefix` would drop every mark of a `{path}` key, or
/// every mark at all: that takes `all=true` too.
fn matches_everything(prefix: &str) -> bool {
    prefix.is_empty() || prefix == "/"
}

async fn delete(state: &AdminState, peer: SocketAddr, req: Request<ClientBody>) -> Response<Full<Bytes>> {
    if let Some(refused) = unauthorized(state, peer, &req) {
        return refused;
    }
    let query = match checked_query(state, &req) {
        Ok(query) => query,
        Err(refused) => return *refused,
    };
    if let Some(why) = typed_prefix(&req).as_deref().and_then(widening) {
        let detail = format!(
            "prefix has {why}: made canonical it would name a shorter prefix and delete more than typed; \
             type the canonical prefix"
        );
        return problem(StatusCode::BAD_REQUEST, "Bad query", detail);
    }
    let usage = "DELETE /fences takes key=K, or prefix=P (and all=true when P is empty or '/')";
    let all = match query.all.as_deref() {
        None => false,
        Some("true") => true,
        Some(_) => return problem(StatusCode::BAD_REQUEST, "Bad query", "all takes one value: true"),
    };
    let which = match (query.key, query.prefix, query.after, query.limit) {
        (Some(key), None, None, None) if !all => Selection::Key(key),
        (None, Some(prefix), None, None) if matches_everything(&prefix) == all => Selection::Prefix(prefix),
        (None, Some(prefix), None, None) if !all => {
            let detail = format!(
                "prefix '{prefix}' matches every key: deleting every fence readmits every stale lock holder; \
                 add all=true if that is really meant"
            );
            return problem(StatusCode::BAD_REQUEST, "Bad query", detail);
        }
        _ => return problem(StatusCode::BAD_REQUEST, "Bad query", usage),
    };
    // The delete and its audit line run on a task of their own: a client
    // that goes away (or the admin drain at shutdown) then cannot leave a
    // delete done and unlogged.
    let store = state.store.clone();
    match tokio::spawn(async move { delete_and_log(&*store, peer, &which).await }).await {
        Ok(response) => response,
        Err(e) => unavailable(format!("fence store unavailable: delete task failed: {e}")),
    }
}

/// Deletes the marks `which` selects, logs it at target `fencegate::audit`,
/// and says what was deleted.
async fn delete_and_log(store: &impl FenceStore, peer: SocketAddr, which: &Selection) -> Response<Full<Bytes>> {
    match store.delete(which).await {
        Ok(deleted) => {
            // A deleted mark readmits every holder of its key: always worth a line.
            let body = match which {
                Selection::Key(key) => {
                    tracing::warn!(target: "fencegate::audit", caller = %peer, key, deleted = deleted.count,
                        token = deleted.token, "fence deleted");
                    json!({ "key": key, "deleted": deleted.count, "token": deleted.token })
                }
                Selection::Prefix(prefix) => {
                    tracing::warn!(target: "fencegate::audit", caller = %peer, prefix, deleted = deleted.count,
                        "fences deleted by prefix");
                    json!({ "prefix": prefix, "deleted": deleted.count })
                }
            };
            json_response(StatusCode::OK, &body)
        }
        Err(e) => {
            tracing::warn!(target: "fencegate::audit", caller = %peer, what = ?which, error = %e, "fence delete failed");
            unavailable(e.to_string())
        }
    }
}

pub(super) fn unavailable(detail: String) -> Response<Full<Bytes>> {
    Problem::new(ProblemType::STORE_UNAVAILABLE, detail).retry_soon().into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(query: &str) -> Option<String> {
        parse_query(query).unwrap().key
    }

    #[test]
    fn query_parameters_are_decoded_and_checked() {
        let q = parse_query("key=%2Fobjects%2Fa%20b&limit=5").unwrap();
        assert_eq!(q.key.as_deref(), Some("/objects/a%20b"));
        assert_eq!(q.limit.as_deref(), Some("5"));
        assert!(matches!(parse_query("key=a&key=b"), Err(FenceQueryError::Repeated(name)) if name == "key"));
        assert!(matches!(parse_query("keys=a"), Err(FenceQueryError::Unknown(name)) if name == "keys"));
        let detail = parse_query("key=a&key=b").unwrap_err().to_string();
        assert_eq!(detail, "query parameter 'key' appears more than once");
    }

    #[test]
    fn a_delete_prefix_that_canonical_form_would_widen_is_refused() {
        for typed in ["/objects/tenant/..", "/objects/.", "/objects/%2e%2E", "/objects//", "/objects/./a", "//"] {
            assert!(widening(typed).is_some(), "{typed}");
        }
        for typed in ["/objects/", "/objects/te", "/objects/.hidden", "/objects/a..", "/", "", "tenant:./.."] {
            assert_eq!(widening(typed), None, "{typed}");
        }
    }

    #[test]
    fn keys_are_decoded_and_canonical_like_request_paths() {
        // `+` is a plus sign, as in a path; a space is what %20 says.
        assert_eq!(key("key=/objects/a+b").as_deref(), Some("/objects/a+b"));
        assert_eq!(key("key=/objects/a%20b").as_deref(), Some("/objects/a%20b"));
        for spelling in
            ["/objects/a", "/objects/%61", "/objects/./a", "/objects//a", "/objects/x/../a", "%2Fobjects%2F%2561"]
        {
            assert_eq!(key(&format!("key={spelling}")).as_deref(), Some("/objects/a"), "{spelling}");
        }
        // Keys of other templates are taken as they are.
        assert_eq!(key("key=tenant:acme+1").as_deref(), Some("tenant:acme+1"));
        assert!(matches!(parse_query("key=/../a"), Err(FenceQueryError::NotCanonical { name: "key", .. })));
        // Not UTF-8 once decoded: refused, not read as U+FFFD's key.
        let e = parse_query("key=/objects/%FF").unwrap_err();
        assert!(matches!(e, FenceQueryError::NotUtf8(canonical::QueryError::ValueNotUtf8)), "{e:?}");
        assert!(e.to_string().contains("UTF-8"), "{e}");
        // The keys of a `non_utf8 = "raw"` route are named by escaping their '%'.
        assert_eq!(parse_query("key=/objects/%25FF").unwrap().key.as_deref(), Some("/objects/%FF"));
    }
}
