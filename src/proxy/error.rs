//! How an exchange with the upstream failed: at which stage, and so whether
//! the upstream may have the request, and why.

use std::error::Error;
use std::time::Duration;

pub use crate::http::BoxError;

/// Where an upstream exchange stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamStage {
    /// Opening a connection, retries included: not a byte of the request left.
    Connect,
    /// Sending the request or awaiting its response head: the upstream may
    /// have received it, and may still act on it.
    Exchange,
    /// Waiting for one of the route's upstream connections: every one was
    /// busy. Not a byte of the request left.
    Busy,
    /// The upstream refused the request before processing it (HTTP/2's
    /// `REFUSED_STREAM`, or a `GOAWAY` below its stream): sent, but not
    /// acted on.
    Refused,
}

/// An upstream exchange that ended without a response head.
#[derive(Debug)]
pub struct UpstreamError {
    pub stage: UpstreamStage,
    pub source: BoxError,
}

/// The stage, then every cause: this text is the problem's `detail`.
impl std::fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.stage_text(), chain(&*self.source))
    }
}

impl Error for UpstreamError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&*self.source)
    }
}

impl UpstreamError {
    pub fn connect(source: impl Into<BoxError>) -> Self {
        UpstreamError { stage: UpstreamStage::Connect, source: source.into() }
    }

    pub fn exchange(source: impl Into<BoxError>) -> Self {
        UpstreamError { stage: UpstreamStage::Exchange, source: source.into() }
    }

    /// The upstream said it did not process the request (RFC 9113 §8.7).
    pub fn refused(source: impl Into<BoxError>) -> Self {
        UpstreamError { stage: UpstreamStage::Refused, source: source.into() }
    }

    /// Whether the upstream said it did not process the request.
    pub fn is_refused(&self) -> bool {
        self.stage == UpstreamStage::Refused
    }

    /// The route's `cap` upstream connections stayed busy for `waited`.
    pub fn busy(cap: usize, waited: Duration) -> Self {
        let what = format!("all {cap} connections of this route were busy for {}", humantime::format_duration(waited));
        UpstreamError { stage: UpstreamStage::Busy, source: what.into() }
    }

    /// The `share` upstream connections one client connection may hold on
    /// this route stayed busy for `waited`.
    pub fn busy_share(share: usize, waited: Duration) -> Self {
        let what = format!(
            "the {share} connections of this route that one client connection may hold were busy for {}",
            humantime::format_duration(waited)
        );
        UpstreamError { stage: UpstreamStage::Busy, source: what.into() }
    }

    /// Whether the route's connection cap refused the request.
    pub fn is_busy(&self) -> bool {
        self.stage == UpstreamStage::Busy
    }

    /// Whether the upstream may have received the request: if so, its outcome
    /// is unknown and it must never be sent again.
    pub fn may_have_sent(&self) -> bool {
        self.stage == UpstreamStage::Exchange
    }

    fn stage_text(&self) -> &'static str {
        match self.stage {
            UpstreamStage::Connect => "the upstream could not be reached, nothing was sent",
            UpstreamStage::Exchange => "the upstream connection failed after the request was sent",
            UpstreamStage::Busy => "no upstream connection was free, nothing was sent",
            UpstreamStage::Refused => "the upstream refused the request without processing it",
        }
    }
}

/// `a: b: c` from an error and its sources: hyper's top-level messages alone
/// ("client error (Connect)") do not say what went wrong, and the problem's
/// `detail` is all a client sees.
pub(super) fn chain(e: &(dyn Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_detail_names_the_stage_and_every_cause() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let e = UpstreamError::connect(refused);
        assert!(!e.may_have_sent());
        assert_eq!(e.to_string(), "the upstream could not be reached, nothing was sent: connection refused");
        let e = UpstreamError::exchange("connection reset");
        assert!(e.may_have_sent());
        assert!(e.to_string().starts_with("the upstream connection failed after the request was sent"));
    }
}
