//! The body step: the route's `max_body` (413 past it), and fenced bodies
//! read whole, within the process's buffer budget and the connection's share
//! of it, before they may take their key's turn. The body types and the
//! budget are the bottom floor's (`http/body`); this step applies them to
//! the request path, and its refusals name the fence key and token.
//!
//! A declared `Content-Length` above the limit is refused before anything is
//! read. A fenced body is read in full, up to the limit and within the
//! route's `timeout` (counted from the read's first wait), before it may take
//! its key's turn (unless its route sets `stream_body`): a client that dies
//! or stalls mid-body, or a body that turns out too large, is refused with
//! nothing forwarded, so the upstream never sees part of a fenced write. The
//! bytes held that way count against one budget for the whole process
//! (`[server] max_buffered_bytes`) and against the share of it one client
//! connection may hold over all its HTTP/2 streams
//! (`[server] max_connection_buffered_bytes`): a request that would overrun
//! either gets 503 with `Retry-After`, and its bytes are handed back as soon
//! as its body is dropped. Other bodies stream, and one that overruns the
//! limit is cut off.

mod plan;

use crate::http::{BudgetFull, ReadError};
use crate::stack::error::ProxyError;

pub(crate) use plan::{plan, Budgets, Plan};

impl From<BudgetFull> for ProxyError {
    fn from(full: BudgetFull) -> Self {
        match full {
            BudgetFull::Process(limit) => ProxyError::BufferFull(limit),
            BudgetFull::Connection(limit) => ProxyError::ConnectionBufferFull(limit),
        }
    }
}

impl From<ReadError> for ProxyError {
    fn from(e: ReadError) -> Self {
        match e {
            // Read before the turn: nothing of the body went upstream.
            ReadError::TooLarge { limit } => ProxyError::BodyTooLarge { limit, partly_sent: false },
            ReadError::BufferFull(full) => full.into(),
            ReadError::Client(e) => ProxyError::ClientBody(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reader's and the budget's errors answer as the request path's
    /// own did: 413 with nothing sent, 503 for either budget.
    #[test]
    fn a_failed_read_is_refused_as_before() {
        let too_large = ProxyError::from(ReadError::TooLarge { limit: 5 });
        assert!(matches!(too_large, ProxyError::BodyTooLarge { limit: 5, partly_sent: false }));
        let full = ProxyError::from(ReadError::BufferFull(BudgetFull::Process(9)));
        assert!(matches!(full, ProxyError::BufferFull(9)));
        assert!(matches!(ProxyError::from(BudgetFull::Connection(7)), ProxyError::ConnectionBufferFull(7)));
    }
}
