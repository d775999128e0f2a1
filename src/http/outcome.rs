//! What happened to a request, as the access log and the metrics tell it: the
//! `decision` field of each access-log event and the `outcome` label of
//! `fencegate_requests_total`.

use std::sync::Arc;

use prometheus_client::encoding::{EncodeLabelValue, LabelValueEncoder};

/// What happened to a request. The names ([`Outcome::as_str`]) are part of the
/// contract: dashboards and alerts match on them.
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
    /// Every upstream connection the route may open was busy; nothing was sent.
    UpstreamBusy,
    /// The global budget for buffered bodies, or the connection's share of
    /// it, was spent.
    BufferFull,
    Internal,
    /// The connection sent request heads faster than it may send them upstream.
    RateLimited,
}

impl Outcome {
    pub const ALL: [Outcome; 20] = [
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
        Outcome::UpstreamBusy,
        Outcome::BufferFull,
        Outcome::Internal,
        Outcome::RateLimited,
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
            Outcome::UpstreamBusy => "upstream_busy",
            Outcome::BufferFull => "buffer_full",
            Outcome::Internal => "internal",
            Outcome::RateLimited => "rate_limited",
        }
    }
}

#[cfg(test)]
#[test]
fn all_lists_every_outcome_in_declaration_order() {
    for (i, outcome) in Outcome::ALL.iter().enumerate() {
        assert_eq!(*outcome as usize, i, "{outcome:?}");
    }
}

/// The `outcome` label. Written by hand, not derived: prometheus-client's
/// derive writes the variant name as it is (`MissingToken`), and the
/// contract's label values are snake_case.
impl EncodeLabelValue for Outcome {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        std::fmt::Write::write_str(encoder, self.as_str())
    }
}

/// The fence decision for one request, carried in the response's body
/// ([`ProxyBody`](super::ProxyBody)) up to the access log and metrics.
#[derive(Debug, Clone)]
pub struct Decision {
    pub outcome: Outcome,
    pub key: Option<Arc<str>>,
    pub token: Option<u64>,
    /// The key was held for a settle period after an ambiguous outcome.
    pub settled: bool,
    /// The route, once routing has tagged the response.
    pub route: Option<RouteTag>,
}

/// The route a response was routed by, as the access log and the metrics
/// read it: the route itself is built floors above this one.
#[derive(Debug, Clone)]
pub struct RouteTag(pub Arc<dyn RouteLabel>);

/// What the access log needs of a route: its name, and its counters.
pub trait RouteLabel: std::fmt::Debug + Send + Sync {
    fn name(&self) -> &str;

    /// Counts one finished request of this route, answered with `status`;
    /// `settled`: its key was held for a settle period after it.
    fn record(&self, outcome: Outcome, status: u16, seconds: f64, settled: bool);
}
