//! Request-path errors, and the one place they become responses.
//!
//! Every response fencegate makes itself is `application/problem+json` (RFC 9457)
//! with `type`, `title`, `status`, `detail`, `request_id`, and `key`, `token`,
//! `current` where they apply. Errors never escape as connection resets: the rescue layer turns
//! each [`Rejection`] into a response with [`Rejection::into_response`].

use std::sync::Arc;
use std::time::Duration;

use http::header::HeaderValue;
#[cfg(test)]
use http::StatusCode;
use http::{HeaderName, Response};

use crate::canonical::PathError;
use crate::fence::signature::SignatureError;
use crate::fence::store::StoreError;
use crate::fence::token::TokenError;
use crate::http::problem::{Problem, ProblemType, CURRENT_TOKEN_HEADER};
use crate::http::{BoxError, ProxyBody};
use crate::http::{Decision, Outcome};
use crate::proxy::UpstreamError;

use crate::config::KeyError;
use crate::http::RouteTag;
use crate::stack::router::{DestinationError, FoldedHeaders, RequestHostError, TunnelError};

/// Why fencegate answered a request itself instead of the upstream.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// Below the mark; or equal to it, which only a `strict` route refuses.
    #[error("{}", if token < current {
        format!("token {token} is lower than the fence {current} for this key")
    } else {
        format!("token {token} equals the fence {current} for this key, and this route is strict: one write per token")
    })]
    StaleToken { token: u64, current: u64 },
    /// Below a token already waiting for the key's turn: stale by the time
    /// its own turn would come.
    #[error(
        "token {token} is lower than token {waiting}, which is waiting for this key's turn: by this request's turn \
         the fence would be at least {waiting}"
    )]
    Superseded { token: u64, waiting: u64 },
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
    /// `partly_sent`: a streamed body overran the limit on its way upstream,
    /// so the upstream has part of it and the write's outcome is unknown.
    #[error("the request body is larger than this route's limit of {limit} bytes")]
    BodyTooLarge { limit: u64, partly_sent: bool },
    #[error("the client's request body failed: {0}")]
    ClientBody(#[source] hyper::Error),
    #[error("the client did not send the whole request body within {}", humantime::format_duration(*.0))]
    BodyTimeout(Duration),
    #[error("no route matches path '{path}'")]
    NoRoute { path: String },
    #[error("the request path cannot be made canonical: {0}")]
    BadPath(#[from] PathError),
    #[error("the request's host is not one fencegate can route by: {0}")]
    BadHost(#[from] RequestHostError),
    #[error("header '{0}' has a value with leading or trailing whitespace, which HTTP/2 forbids")]
    BadHeader(HeaderName),
    #[error(transparent)]
    FoldedHeaders(#[from] FoldedHeaders),
    #[error(transparent)]
    Tunnel(#[from] TunnelError),
    #[error("the method-override headers name different methods ('{first}' and '{second}')")]
    MethodOverride { first: String, second: String },
    #[error("a {0} request carries a body, which this route does not allow for methods it does not fence")]
    BodyNotAllowed(http::Method),
    #[error("the Destination header cannot be fenced: {0}")]
    BadDestination(#[from] DestinationError),
    #[error("fencegate holds as many request bodies as it may ({0} bytes); try again shortly")]
    BufferFull(u64),
    #[error(
        "this connection holds as many request bodies as one connection may ({0} bytes); try again once its other \
         uploads are done"
    )]
    ConnectionBufferFull(u64),
    #[error("the request has {count} header fields; at most {max} are accepted")]
    TooManyHeaders { count: usize, max: usize },
    #[error(
        "this connection sends more request-head bytes than the {0} bytes a second one connection may send upstream"
    )]
    HeaderRate(u64),
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    #[error("the upstream did not answer within {}", humantime::format_duration(*.0))]
    UpstreamTimeout(Duration),
    #[error("waited {} for the key's turn; another write to it is in flight", humantime::format_duration(*.0))]
    QueueTimeout(Duration),
    #[error(transparent)]
    StoreUnavailable(#[from] StoreError),
    /// A failure of fencegate's own, with what it was doing and why.
    #[error("internal error: {context}{}", .source.as_ref().map(|e| format!(": {e}")).unwrap_or_default())]
    Internal { context: &'static str, source: Option<BoxError> },
}

impl ProxyError {
    /// How this refusal is counted and answered: its outcome and its problem
    /// type (which carries the status), one row per variant.
    fn answer(&self) -> (Outcome, ProblemType) {
        use Outcome as O;
        use ProblemType as P;
        use ProxyError as E;
        match self {
            E::StaleToken { .. } | E::Superseded { .. } => (O::Stale, P::STALE_TOKEN),
            E::MissingToken { .. } => (O::MissingToken, P::MISSING_TOKEN),
            E::MalformedToken { .. } => (O::MalformedToken, P::MALFORMED_TOKEN),
            E::BadKey(_) => (O::BadKey, P::BAD_KEY),
            E::BadSignature(_) => (O::BadSignature, P::BAD_SIGNATURE),
            E::TokenJump { .. } => (O::TokenJump, P::TOKEN_JUMP),
            E::BodyTooLarge { .. } => (O::BodyTooLarge, P::BODY_TOO_LARGE),
            E::ClientBody(_) => (O::ClientError, P::CLIENT_BODY),
            E::BodyTimeout(_) => (O::ClientError, P::BODY_TIMEOUT),
            E::NoRoute { .. } => (O::NoRoute, P::NO_ROUTE),
            E::BadPath(_) => (O::BadRequest, P::BAD_PATH),
            E::BadHost(_) => (O::BadRequest, P::BAD_HOST),
            E::BadHeader(_) => (O::BadRequest, P::BAD_HEADER),
            E::FoldedHeaders(_) => (O::BadRequest, P::BAD_HEADER),
            E::Tunnel(_) => (O::BadRequest, P::TUNNEL_REFUSED),
            E::MethodOverride { .. } => (O::BadRequest, P::METHOD_OVERRIDE),
            E::BodyNotAllowed(_) => (O::BadRequest, P::BODY_NOT_ALLOWED),
            E::BadDestination(_) => (O::BadRequest, P::BAD_DESTINATION),
            E::BufferFull(_) => (O::BufferFull, P::BUFFER_FULL),
            E::Upstream(e) if e.is_busy() => (O::UpstreamBusy, P::UPSTREAM_BUSY),
            E::ConnectionBufferFull(_) => (O::BufferFull, P::BUFFER_FULL),
            E::TooManyHeaders { .. } => (O::BadRequest, P::TOO_MANY_HEADERS),
            E::HeaderRate(_) => (O::RateLimited, P::HEADER_RATE),
            E::Upstream(e) if e.may_have_sent() => (O::UpstreamError, P::UPSTREAM_FAILED),
            E::Upstream(e) if e.is_refused() => (O::UpstreamError, P::UPSTREAM_REFUSED),
            E::Upstream(_) => (O::UpstreamError, P::UPSTREAM_UNREACHABLE),
            E::UpstreamTimeout(_) => (O::UpstreamTimeout, P::UPSTREAM_TIMEOUT),
            E::QueueTimeout(_) => (O::QueueTimeout, P::QUEUE_TIMEOUT),
            E::StoreUnavailable(_) => (O::StoreUnavailable, P::STORE_UNAVAILABLE),
            E::Internal { .. } => (O::Internal, P::INTERNAL),
        }
    }

    /// The status this refusal is answered with.
    #[cfg(test)]
    pub fn status(&self) -> StatusCode {
        self.answer().1.status
    }

    /// An internal error while doing `context`, caused by `source`.
    pub fn internal(context: &'static str, source: impl Into<BoxError>) -> Self {
        ProxyError::Internal { context, source: Some(source.into()) }
    }

    /// Whether the upstream may have received the request, and so may still
    /// apply it: the outcome of the write is unknown.
    pub fn is_ambiguous(&self) -> bool {
        match self {
            ProxyError::Upstream(e) => e.may_have_sent(),
            ProxyError::BodyTooLarge { partly_sent, .. } => *partly_sent,
            ProxyError::UpstreamTimeout(_) => true,
            _ => false,
        }
    }

    /// Refusals about load or a passing failure: the same request may succeed
    /// shortly, so the response says when to try again.
    fn retry_soon(&self) -> bool {
        match self {
            ProxyError::QueueTimeout(_)
            | ProxyError::StoreUnavailable(_)
            | ProxyError::BufferFull(_)
            | ProxyError::ConnectionBufferFull(_)
            | ProxyError::HeaderRate(_) => true,
            ProxyError::Upstream(e) => e.is_busy(),
            _ => false,
        }
    }
}

/// A [`ProxyError`] with the fence key and token it concerns, when known.
#[derive(Debug)]
pub struct Rejection {
    pub error: ProxyError,
    pub key: Option<Arc<str>>,
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
    pub fn new(error: ProxyError, key: Option<Arc<str>>, token: Option<u64>) -> Self {
        Rejection { error, key, token, settle: None, route: None }
    }

    /// The problem+json response for this rejection, with its [`Decision`].
    #[cfg(test)]
    pub fn into_response(self) -> Response<ProxyBody> {
        self.into_response_for(None)
    }

    /// [`Rejection::into_response`], the problem naming the request's ID
    /// (`request_id`) when it has one.
    pub fn into_response_for(self, request_id: Option<&HeaderValue>) -> Response<ProxyBody> {
        let (outcome, kind) = self.error.answer();
        let detail = match self.settle {
            None => self.error.to_string(),
            Some(settle) => format!(
                "{}. The upstream may still apply this write, so fencegate holds the key for {} before it forwards \
                 the next write to it",
                self.error,
                humantime::format_duration(settle)
            ),
        };
        let mut problem = Problem::new(kind, detail);
        if let Some(settle) = self.settle {
            problem = problem.member("settle_ms", settle.as_millis() as u64);
        }
        if let Some(id) = request_id.and_then(|id| id.to_str().ok()) {
            problem = problem.member("request_id", id);
        }
        if let Some(key) = &self.key {
            problem = problem.member("key", &**key);
        }
        if let Some(token) = self.token {
            problem = problem.member("token", token);
        }
        if let ProxyError::StaleToken { current, .. } | ProxyError::TokenJump { current, .. } = &self.error {
            problem = problem.member("current", *current);
        }
        if let ProxyError::StaleToken { current, .. } = &self.error {
            problem = problem.header(CURRENT_TOKEN_HEADER, HeaderValue::from(*current));
        }
        if let ProxyError::Superseded { waiting, .. } = &self.error {
            problem = problem.member("waiting", *waiting);
        }
        // A store that knows when it takes writes again says so.
        let retry_after = match &self.error {
            ProxyError::StoreUnavailable(e) => e.retry_after(),
            _ => None,
        };
        if let Some(after) = retry_after {
            let seconds = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            problem = problem.header(http::header::RETRY_AFTER, HeaderValue::from(seconds.max(1)));
        } else if self.error.retry_soon() {
            problem = problem.retry_soon();
        }
        let mut response = problem.into_response().map(ProxyBody::full);
        let settled = self.settle.is_some();
        let decision = Decision { outcome, key: self.key, token: self.token, settled, route: self.route };
        crate::http::decide(&mut response, decision);
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_overrun_streamed_body_leaves_the_outcome_unknown() {
        assert!(ProxyError::BodyTooLarge { limit: 1, partly_sent: true }.is_ambiguous());
        assert!(!ProxyError::BodyTooLarge { limit: 1, partly_sent: false }.is_ambiguous());
    }
}
