//! Request-path errors, and the one place they become responses.
//!
//! Every response fencegate makes itself is `application/problem+json` (RFC 9457)
//! with `type`, `title`, `status`, `detail`, and `key`, `token`, `current` where
//! they apply. Errors never escape as connection resets: the rescue layer turns
//! each [`Rejection`] into a response with [`Rejection::into_response`].

use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderName, Response, StatusCode};
use http_body_util::{Either, Full};
use serde_json::json;

use crate::canonical::PathError;
use crate::fence::signature::SignatureError;
use crate::fence::store::StoreError;
use crate::fence::token::TokenError;
use crate::route::{KeyError, RouteTag};

/// The body of every response fencegate sends: streamed from the upstream, or
/// made here in one piece.
pub type ProxyBody = Either<hyper::body::Incoming, Full<Bytes>>;

/// Response header naming the current mark on a 409.
pub const CURRENT_TOKEN_HEADER: HeaderName = HeaderName::from_static("x-fencing-token-current");

/// Why fencegate answered a request itself instead of the upstream.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("token {token} is lower than the fence {current} for this key")]
    StaleToken { token: u64, current: u64 },
    #[error("this method is fenced on this route and the request has no {header} header")]
    MissingToken { header: HeaderName },
    #[error("the {header} header is malformed: {error}")]
    MalformedToken { header: HeaderName, error: TokenError },
    #[error("cannot make the fence key: {0}")]
    BadKey(#[from] KeyError),
    #[error("the token signature is {0}")]
    BadSignature(#[from] SignatureError),
    #[error("token {token} is more than {max_jump} above the fence {current} for this key")]
    TokenJump { token: u64, current: u64, max_jump: u64 },
    #[error("the request body is larger than this route's limit of {limit} bytes")]
    BodyTooLarge { limit: u64 },
    #[error("the client's request body failed: {0}")]
    ClientBody(String),
    #[error("the client did not send the whole request body within {}", humantime::format_duration(*.0))]
    BodyTimeout(Duration),
    #[error("no route matches path '{path}'")]
    NoRoute { path: String },
    #[error("the request path cannot be made canonical: {0}")]
    BadPath(#[from] PathError),
    #[error("the request's host is not one fencegate can route by: {0}")]
    BadHost(String),
    #[error("header '{0}' has a value with leading or trailing whitespace, which HTTP/2 forbids")]
    BadHeader(HeaderName),
    #[error("the method-override headers name different methods ('{0}' and '{1}')")]
    MethodOverride(String, String),
    #[error("a {0} request carries a body, which this route does not allow for methods it does not fence")]
    BodyNotAllowed(http::Method),
    #[error("the Destination header cannot be fenced: {0}")]
    BadDestination(String),
    #[error("fencegate holds as many request bodies as it may ({0} bytes); try again shortly")]
    BufferFull(u64),
    #[error("the upstream could not be reached, nothing was sent: {0}")]
    UpstreamConnect(String),
    #[error("the upstream connection failed after the request was sent: {0}")]
    UpstreamFailed(String),
    #[error("the upstream did not answer within {}", humantime::format_duration(*.0))]
    UpstreamTimeout(Duration),
    #[error("waited {} for the key's turn; another write to it is in flight", humantime::format_duration(*.0))]
    QueueTimeout(Duration),
    #[error(transparent)]
    StoreUnavailable(#[from] StoreError),
    #[error("internal error: {0}")]
    Internal(String),
}

/// What happened to a request: the `outcome` label of `fencegate_requests_total`
/// and the `decision` field of the access log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// A fenced request whose token was accepted, forwarded.
    Forwarded,
    /// Not subject to the fence (method not fenced, or missing token allowed), forwarded.
    Unfenced,
    Stale,
    MissingToken,
    MalformedToken,
    BadKey,
    BadSignature,
    TokenJump,
    BodyTooLarge,
    ClientError,
    /// A request refused from its head: path, host, header, method override,
    /// a body on an unfenced method, or its Destination.
    BadRequest,
    NoRoute,
    UpstreamError,
    UpstreamTimeout,
    QueueTimeout,
    StoreUnavailable,
    /// The global budget for buffered bodies was spent.
    BufferFull,
    Internal,
}

impl Outcome {
    pub const ALL: [Outcome; 18] = [
        Outcome::Forwarded,
        Outcome::Unfenced,
        Outcome::Stale,
        Outcome::MissingToken,
        Outcome::MalformedToken,
        Outcome::BadKey,
        Outcome::BadSignature,
        Outcome::TokenJump,
        Outcome::BodyTooLarge,
        Outcome::ClientError,
        Outcome::BadRequest,
        Outcome::NoRoute,
        Outcome::UpstreamError,
        Outcome::UpstreamTimeout,
        Outcome::QueueTimeout,
        Outcome::StoreUnavailable,
        Outcome::BufferFull,
        Outcome::Internal,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Forwarded => "forwarded",
            Outcome::Unfenced => "unfenced",
            Outcome::Stale => "stale",
            Outcome::MissingToken => "missing_token",
            Outcome::MalformedToken => "malformed_token",
            Outcome::BadKey => "bad_key",
            Outcome::BadSignature => "bad_signature",
            Outcome::TokenJump => "token_jump",
            Outcome::BodyTooLarge => "body_too_large",
            Outcome::ClientError => "client_error",
            Outcome::BadRequest => "bad_request",
            Outcome::NoRoute => "no_route",
            Outcome::UpstreamError => "upstream_error",
            Outcome::UpstreamTimeout => "upstream_timeout",
            Outcome::QueueTimeout => "queue_timeout",
            Outcome::StoreUnavailable => "store_unavailable",
            Outcome::BufferFull => "buffer_full",
            Outcome::Internal => "internal",
        }
    }
}

/// The fence decision for one request, carried in the response extensions for
/// the access log and metrics.
#[derive(Debug, Clone)]
pub struct Decision {
    pub outcome: Outcome,
    pub key: Option<String>,
    pub token: Option<u64>,
    /// The key was held for a settle period after an ambiguous outcome.
    pub settled: bool,
}

impl ProxyError {
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::StaleToken { .. } => StatusCode::CONFLICT,
            ProxyError::MissingToken { .. } => StatusCode::PRECONDITION_REQUIRED,
            ProxyError::MalformedToken { .. } | ProxyError::BadKey(_) => StatusCode::BAD_REQUEST,
            ProxyError::BadSignature(_) | ProxyError::TokenJump { .. } => StatusCode::FORBIDDEN,
            ProxyError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::ClientBody(_) => StatusCode::BAD_REQUEST,
            ProxyError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ProxyError::NoRoute { .. } => StatusCode::NOT_FOUND,
            ProxyError::BadPath(_)
            | ProxyError::BadHost(_)
            | ProxyError::BadHeader(_)
            | ProxyError::MethodOverride(..)
            | ProxyError::BodyNotAllowed(_)
            | ProxyError::BadDestination(_) => StatusCode::BAD_REQUEST,
            ProxyError::BufferFull(_) => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::UpstreamConnect(_) | ProxyError::UpstreamFailed(_) => StatusCode::BAD_GATEWAY,
            ProxyError::UpstreamTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ProxyError::QueueTimeout(_) | ProxyError::StoreUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn outcome(&self) -> Outcome {
        match self {
            ProxyError::StaleToken { .. } => Outcome::Stale,
            ProxyError::MissingToken { .. } => Outcome::MissingToken,
            ProxyError::MalformedToken { .. } => Outcome::MalformedToken,
            ProxyError::BadKey(_) => Outcome::BadKey,
            ProxyError::BadSignature(_) => Outcome::BadSignature,
            ProxyError::TokenJump { .. } => Outcome::TokenJump,
            ProxyError::BodyTooLarge { .. } => Outcome::BodyTooLarge,
            ProxyError::ClientBody(_) | ProxyError::BodyTimeout(_) => Outcome::ClientError,
            ProxyError::NoRoute { .. } => Outcome::NoRoute,
            ProxyError::BadPath(_)
            | ProxyError::BadHost(_)
            | ProxyError::BadHeader(_)
            | ProxyError::MethodOverride(..)
            | ProxyError::BodyNotAllowed(_)
            | ProxyError::BadDestination(_) => Outcome::BadRequest,
            ProxyError::BufferFull(_) => Outcome::BufferFull,
            ProxyError::UpstreamConnect(_) | ProxyError::UpstreamFailed(_) => Outcome::UpstreamError,
            ProxyError::UpstreamTimeout(_) => Outcome::UpstreamTimeout,
            ProxyError::QueueTimeout(_) => Outcome::QueueTimeout,
            ProxyError::StoreUnavailable(_) => Outcome::StoreUnavailable,
            ProxyError::Internal(_) => Outcome::Internal,
        }
    }

    /// Whether the upstream may have received the request, and so may still
    /// apply it: the outcome of the write is unknown.
    pub fn is_ambiguous(&self) -> bool {
        matches!(self, ProxyError::UpstreamFailed(_) | ProxyError::UpstreamTimeout(_))
    }

    /// `(type, title)` of the problem document. The `type` URNs are stable: clients
    /// may match on them.
    fn problem_type(&self) -> (&'static str, &'static str) {
        match self {
            ProxyError::StaleToken { .. } => ("urn:fencegate:problem:stale-token", "Stale fencing token"),
            ProxyError::MissingToken { .. } => ("urn:fencegate:problem:missing-token", "Fencing token required"),
            ProxyError::MalformedToken { .. } => ("urn:fencegate:problem:malformed-token", "Malformed fencing token"),
            ProxyError::BadKey(_) => ("urn:fencegate:problem:bad-key", "Cannot determine the fence key"),
            ProxyError::BadSignature(_) => ("urn:fencegate:problem:bad-signature", "Token signature missing or wrong"),
            ProxyError::TokenJump { .. } => ("urn:fencegate:problem:token-jump", "Token jumps too far ahead"),
            ProxyError::BodyTooLarge { .. } => ("urn:fencegate:problem:body-too-large", "Request body too large"),
            ProxyError::ClientBody(_) => ("urn:fencegate:problem:client-body", "Request body failed"),
            ProxyError::BodyTimeout(_) => ("urn:fencegate:problem:body-timeout", "Request body too slow"),
            ProxyError::NoRoute { .. } => ("urn:fencegate:problem:no-route", "No route"),
            ProxyError::BadPath(_) => ("urn:fencegate:problem:bad-path", "Ambiguous request path"),
            ProxyError::BadHost(_) => ("urn:fencegate:problem:bad-host", "Malformed host"),
            ProxyError::BadHeader(_) => ("urn:fencegate:problem:bad-header", "Malformed header value"),
            ProxyError::MethodOverride(..) => ("urn:fencegate:problem:method-override", "Conflicting method overrides"),
            ProxyError::BodyNotAllowed(_) => ("urn:fencegate:problem:body-not-allowed", "Body on an unfenced method"),
            ProxyError::BadDestination(_) => ("urn:fencegate:problem:bad-destination", "Destination cannot be fenced"),
            ProxyError::BufferFull(_) => ("urn:fencegate:problem:buffer-full", "Too many buffered bodies"),
            ProxyError::UpstreamConnect(_) => ("urn:fencegate:problem:upstream-error", "Upstream unreachable"),
            ProxyError::UpstreamFailed(_) => ("urn:fencegate:problem:upstream-error", "Upstream failed"),
            ProxyError::UpstreamTimeout(_) => ("urn:fencegate:problem:upstream-timeout", "Upstream timeout"),
            ProxyError::QueueTimeout(_) => ("urn:fencegate:problem:queue-timeout", "Key busy"),
            ProxyError::StoreUnavailable(_) => ("urn:fencegate:problem:store-unavailable", "Fence store unavailable"),
            ProxyError::Internal(_) => ("urn:fencegate:problem:internal", "Internal error"),
        }
    }
}

/// A [`ProxyError`] with the fence key and token it concerns, when known.
#[derive(Debug)]
pub struct Rejection {
    pub error: ProxyError,
    pub key: Option<String>,
    pub token: Option<u64>,
    /// How long the key stays closed after this ambiguous outcome, if it does.
    pub settle: Option<Duration>,
    /// The route the request matched, once routing found one.
    pub route: Option<RouteTag>,
}

impl From<ProxyError> for Rejection {
    fn from(error: ProxyError) -> Self {
        Rejection::new(error, None, None)
    }
}

impl Rejection {
    pub fn new(error: ProxyError, key: Option<String>, token: Option<u64>) -> Self {
        Rejection { error, key, token, settle: None, route: None }
    }

    /// The problem+json response for this rejection, with its [`Decision`].
    pub fn into_response(self) -> Response<ProxyBody> {
        let status = self.error.status();
        let (type_uri, title) = self.error.problem_type();
        let mut body = json!({
            "type": type_uri,
            "title": title,
            "status": status.as_u16(),
            "detail": self.error.to_string(),
        });
        if let Some(settle) = self.settle {
            body["detail"] = json!(format!(
                "{}. The upstream may still apply this write, so fencegate holds the key for {} before it forwards \
                 the next write to it",
                self.error,
                humantime::format_duration(settle)
            ));
            body["settle_ms"] = json!(settle.as_millis() as u64);
        }
        if let Some(key) = &self.key {
            body["key"] = json!(key);
        }
        if let Some(token) = self.token {
            body["token"] = json!(token);
        }
        if let ProxyError::StaleToken { current, .. } | ProxyError::TokenJump { current, .. } = &self.error {
            body["current"] = json!(current);
        }
        let mut response = Response::new(Either::Right(Full::new(Bytes::from(body.to_string()))));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        match &self.error {
            ProxyError::StaleToken { current, .. } => {
                headers.insert(CURRENT_TOKEN_HEADER, HeaderValue::from(*current));
            }
            ProxyError::QueueTimeout(_) | ProxyError::StoreUnavailable(_) | ProxyError::BufferFull(_) => {
                headers.insert(RETRY_AFTER, HeaderValue::from_static("1"));
            }
            _ => {}
        }
        let decision = Decision {
            outcome: self.error.outcome(),
            key: self.key,
            token: self.token,
            settled: self.settle.is_some(),
        };
        response.extensions_mut().insert(decision);
        if let Some(route) = self.route {
            response.extensions_mut().insert(route);
        }
        response
    }
}
