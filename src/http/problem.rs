//! `application/problem+json` (RFC 9457): the one builder behind every
//! response fencegate writes itself, from the proxy and from the admin API,
//! and the catalogue of problem types clients may match on.

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};
use http_body_util::Full;
use serde_json::{Map, Value};

/// Response header naming the current mark on a 409.
pub const CURRENT_TOKEN_HEADER: HeaderName = HeaderName::from_static("x-fencing-token-current");

/// A problem's status, `type` and `title`: the one table of them. The
/// `urn:fencegate:problem:*` types are stable: clients and scripts match on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProblemType {
    pub status: StatusCode,
    pub uri: &'static str,
    pub title: &'static str,
}

impl ProblemType {
    pub const STALE_TOKEN: Self =
        Self::urn(StatusCode::CONFLICT, "urn:fencegate:problem:stale-token", "Stale fencing token");
    pub const MISSING_TOKEN: Self =
        Self::urn(StatusCode::PRECONDITION_REQUIRED, "urn:fencegate:problem:missing-token", "Fencing token required");
    pub const MALFORMED_TOKEN: Self =
        Self::urn(StatusCode::BAD_REQUEST, "urn:fencegate:problem:malformed-token", "Malformed fencing token");
    pub const BAD_KEY: Self =
        Self::urn(StatusCode::BAD_REQUEST, "urn:fencegate:problem:bad-key", "Cannot determine the fence key");
    pub const BAD_SIGNATURE: Self =
        Self::urn(StatusCode::FORBIDDEN, "urn:fencegate:problem:bad-signature", "Token signature missing or wrong");
    pub const TOKEN_JUMP: Self =
        Self::urn(StatusCode::FORBIDDEN, "urn:fencegate:problem:token-jump", "Token jumps too far ahead");
    pub const BODY_TOO_LARGE: Self =
        Self::urn(StatusCode::PAYLOAD_TOO_LARGE, "urn:fencegate:problem:body-too-large", "Request body too large");
    pub const CLIENT_BODY: Self =
        Self::urn(StatusCode::BAD_REQUEST, "urn:fencegate:problem:client-body", "Request body failed");
    pub const BODY_TIMEOUT: Self =
        Self::urn(StatusCode::REQUEST_TIMEOUT, "urn:fencegate:problem:body-timeout", "Request body too slow");
    pub const NO_ROUTE: Self = Self::urn(StatusCode::NOT_FOUND, "urn:fencegate:problem:no-route", "No route");
    pub const BAD_PATH: Self =
        Self::urn(StatusCode::BAD_REQUEST, "urn:fencegate:problem:bad-path", "Ambiguous request path");
    pub const BAD_HOST: Self = Self::urn(StatusCode::BAD_REQUEST, "urn:fencegate:problem:bad-host", "Malformed host");
    pub const BAD_HEADER: Self =
        Self::urn(StatusCode::BAD_REQUEST, "urn:fencegate:problem:bad-header", "Malformed header value");
    pub const METHOD_OVERRIDE: Self =
        Self::urn(StatusCode::BAD_REQUEST, "urn:fencegate:problem:method-override", "Conflicting method overrides");
    pub const TUNNEL_REFUSED: Self =
        Self::urn(StatusCode::BAD_REQUEST, "urn:fencegate:problem:tunnel-refused", "Protocol switch refused");
    pub const BODY_NOT_ALLOWED: Self =
        Self::urn(StatusCode::BAD_REQUEST, "urn:fencegate:problem:body-not-allowed", "Body on an unfenced method");
    pub const BAD_DESTINATION: Self =
        Self::urn(StatusCode::BAD_REQUEST, "urn:fencegate:problem:bad-destination", "Destination cannot be fenced");
    pub const BUFFER_FULL: Self =
        Self::urn(StatusCode::SERVICE_UNAVAILABLE, "urn:fencegate:problem:buffer-full", "Too many buffered bodies");
    pub const TOO_MANY_HEADERS: Self = Self::urn(
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        "urn:fencegate:problem:too-many-headers",
        "Too many header fields",
    );
    pub const HEADER_RATE: Self =
        Self::urn(StatusCode::TOO_MANY_REQUESTS, "urn:fencegate:problem:header-rate", "Too many request-head bytes");
    pub const UPSTREAM_UNREACHABLE: Self =
        Self::urn(StatusCode::BAD_GATEWAY, "urn:fencegate:problem:upstream-error", "Upstream unreachable");
    pub const UPSTREAM_FAILED: Self =
        Self::urn(StatusCode::BAD_GATEWAY, "urn:fencegate:problem:upstream-error", "Upstream failed");
    pub const UPSTREAM_REFUSED: Self = Self::urn(
        StatusCode::BAD_GATEWAY,
        "urn:fencegate:problem:upstream-error",
        "Upstream refused the request unprocessed",
    );
    pub const UPSTREAM_BUSY: Self =
        Self::urn(StatusCode::SERVICE_UNAVAILABLE, "urn:fencegate:problem:upstream-busy", "Upstream connections busy");
    /// Written by the listener itself, outside the stack: the process is out
    /// of file descriptors and answers a new connection, then closes it.
    pub const DESCRIPTORS_EXHAUSTED: Self = Self::urn(
        StatusCode::SERVICE_UNAVAILABLE,
        "urn:fencegate:problem:descriptors-exhausted",
        "Out of file descriptors",
    );
    pub const UPSTREAM_TIMEOUT: Self =
        Self::urn(StatusCode::GATEWAY_TIMEOUT, "urn:fencegate:problem:upstream-timeout", "Upstream timeout");
    pub const QUEUE_TIMEOUT: Self =
        Self::urn(StatusCode::SERVICE_UNAVAILABLE, "urn:fencegate:problem:queue-timeout", "Key busy");
    pub const STORE_UNAVAILABLE: Self = Self::urn(
        StatusCode::SERVICE_UNAVAILABLE,
        "urn:fencegate:problem:store-unavailable",
        "Fence store unavailable",
    );
    pub const LEASE_HELD: Self = Self::urn(StatusCode::LOCKED, "urn:fencegate:problem:lease-held", "Lease held");
    pub const LEASE_LOST: Self =
        Self::urn(StatusCode::CONFLICT, "urn:fencegate:problem:lease-lost", "Lease not held with this token");
    pub const INTERNAL: Self =
        Self::urn(StatusCode::INTERNAL_SERVER_ERROR, "urn:fencegate:problem:internal", "Internal error");

    const fn urn(status: StatusCode, uri: &'static str, title: &'static str) -> Self {
        ProblemType { status, uri, title }
    }

    /// A problem with no type of its own (`about:blank`): the status and
    /// title say all a client needs, as for the admin API's 404 or 401.
    pub const fn blank(status: StatusCode, title: &'static str) -> Self {
        ProblemType { status, uri: "about:blank", title }
    }
}

/// One problem document, and the headers that go with it.
#[derive(Debug)]
pub struct Problem {
    status: StatusCode,
    body: Map<String, Value>,
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl Problem {
    pub fn new(kind: ProblemType, detail: impl Into<String>) -> Self {
        let status = kind.status;
        let mut body = Map::new();
        body.insert("type".into(), kind.uri.into());
        body.insert("title".into(), kind.title.into());
        body.insert("status".into(), status.as_u16().into());
        body.insert("detail".into(), detail.into().into());
        Problem { status, body, headers: Vec::new() }
    }

    /// Adds an extension member, such as `key`, `token` or `current`.
    pub fn member(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.body.insert(name.to_string(), value.into());
        self
    }

    /// Adds a response header.
    pub fn header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.push((name, value));
        self
    }

    /// `Retry-After: 1`: the refusal is about load or a passing failure, and
    /// the same request may succeed shortly.
    pub fn retry_soon(self) -> Self {
        self.header(RETRY_AFTER, HeaderValue::from_static("1"))
    }

    /// The whole HTTP/1.1 response, `Connection: close`, for a listener that
    /// answers a connection it cannot serve (no stack, no hyper).
    pub fn into_http1_bytes(self) -> Vec<u8> {
        let body = Value::Object(self.body).to_string();
        let mut text = format!(
            "HTTP/1.1 {} {}\r\ncontent-type: application/problem+json\r\ncontent-length: {}\r\nconnection: close\r\n",
            self.status.as_u16(),
            self.status.canonical_reason().unwrap_or_default(),
            body.len()
        );
        for (name, value) in &self.headers {
            text.push_str(&format!("{name}: {}\r\n", value.to_str().unwrap_or_default()));
        }
        text.push_str("\r\n");
        text.push_str(&body);
        text.into_bytes()
    }

    pub fn into_response(self) -> Response<Full<Bytes>> {
        let mut response = Response::new(Full::new(Bytes::from(Value::Object(self.body).to_string())));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        for (name, value) in self.headers {
            headers.insert(name, value);
        }
        response
    }
}

/// What a caught panic says, for the log line about it.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use serde_json::json;

    #[tokio::test]
    async fn a_problem_carries_its_type_title_status_detail_and_members() {
        let response = Problem::new(ProblemType::STALE_TOKEN, "too low")
            .member("current", 7)
            .header(CURRENT_TOKEN_HEADER, HeaderValue::from(7u64))
            .into_response();
        assert_eq!(response.status(), 409);
        assert_eq!(response.headers()[CURRENT_TOKEN_HEADER], "7");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let problem: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            problem,
            json!({"type": "urn:fencegate:problem:stale-token", "title": "Stale fencing token", "status": 409,
                   "detail": "too low", "current": 7})
        );
    }
}
