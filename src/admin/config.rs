//! `GET /config`: the configuration in force, as `fencegate --print` shows
//! it (every field, defaults filled in, secrets redacted), in JSON.
//!
//! It says how the proxy is set up, which is worth something to an attacker
//! even with the secrets taken out, so it needs the admin bearer token, as
//! fence changes do; a lease API token is not enough (403), and with no
//! `auth_token` configured it is not served at all (403). A reload that is
//! applied shows here at once; one that is refused leaves what it shows.

use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;

use super::fences::{needs_bearer, presented_bearer, same_secret};
use super::{json_response, problem, AdminState};

/// `GET /config` (and `HEAD`, without the body).
pub(super) fn handle<B>(state: &AdminState, peer: SocketAddr, req: &Request<B>) -> Response<Full<Bytes>> {
    let expected = state.auth_token.load();
    let Some(expected) = expected.as_deref() else {
        return problem(
            StatusCode::FORBIDDEN,
            "Config view disabled",
            "no [admin] auth_token is configured, so /config is not served",
        );
    };
    let presented = match presented_bearer(peer, req, "config view") {
        Ok(presented) => presented,
        Err(refused) => return *refused,
    };
    match presented {
        Some(p) if same_secret(p, expected) => {}
        Some(p) if state.lease_tokens.load().iter().any(|t| same_secret(p, &t.token)) => {
            crate::telemetry::warn_limited!(target: "fencegate::audit", caller = %peer, "config view refused: a lease API token");
            return problem(
                StatusCode::FORBIDDEN,
                "Forbidden",
                "a lease API token cannot read /config; use [admin] auth_token",
            );
        }
        _ => {
            crate::telemetry::warn_limited!(target: "fencegate::audit", caller = %peer, "config view refused: missing or wrong bearer token");
            return needs_bearer("/config needs 'Authorization: Bearer <[admin] auth_token>'");
        }
    }
    json_response(StatusCode::OK, &state.in_force.load().effective_json())
}
