//! Reads a fenced body whole, within its limit and the budgets, before it
//! may take its key's turn.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use hyper::body::Body;

use super::blocks::{Block, Blocks};
use super::budget::{BudgetFull, Held};
use super::client::ClientBody;
use super::request::RequestBody;

/// The first block of a body without a declared length, and the least any
/// block is: small bodies take little of the budget.
const MIN_BLOCK: u64 = 1024;
/// The largest block: a body's last block wastes at most this much of the
/// budget, and a block never needs a reallocation to grow.
const MAX_BLOCK: u64 = 64 * 1024;

/// Why a fenced body could not be read whole. The reader's own, so it needs
/// nothing of the request path; the layer maps each to the refusal it
/// answers with.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadError {
    /// More than the route's `max_body` came (nothing of it went upstream).
    #[error("the request body is larger than the limit of {limit} bytes")]
    TooLarge { limit: u64 },
    /// A budget had no room for the next block.
    #[error(transparent)]
    BufferFull(#[from] BudgetFull),
    /// The client's body failed: its connection broke, or sent garbage.
    #[error("the client's request body failed: {0}")]
    Client(#[source] hyper::Error),
}

/// Reads a body whole, up to `limit` bytes, into blocks whose capacity
/// `held` has taken from the budgets first: one of exactly the declared
/// length, if there is one (already taken), else blocks that grow with the
/// body, from [`MIN_BLOCK`] to [`MAX_BLOCK`].
#[derive(Debug)]
pub(crate) struct Reader {
    body: ClientBody,
    limit: u64,
    held: Held,
    blocks: Blocks,
    block: Block,
    seen: u64,
}

impl Reader {
    pub(crate) fn new(body: ClientBody, limit: u64, declared: Option<u64>, held: Held) -> Reader {
        let block = Block::new(usize::try_from(declared.unwrap_or(0)).unwrap_or(0));
        Reader { body, limit, held, blocks: Blocks::default(), block, seen: 0 }
    }

    /// Reads on until the body ends (`Ok`) or fails its limits.
    pub(crate) fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ReadError>> {
        while let Some(frame) = ready!(Pin::new(&mut self.body).poll_frame(cx)) {
            let frame = frame.map_err(ReadError::Client)?;
            let Ok(data) = frame.into_data() else { continue };
            self.push(data)?;
        }
        let last = std::mem::replace(&mut self.block, Block::Heap(BytesMut::new()));
        if !last.is_empty() {
            self.blocks.push(last.freeze());
        }
        Poll::Ready(Ok(()))
    }

    fn push(&mut self, mut data: Bytes) -> Result<(), ReadError> {
        let limit = self.limit;
        self.seen += data.len() as u64;
        if self.seen > limit {
            return Err(ReadError::TooLarge { limit });
        }
        while !data.is_empty() {
            if self.block.is_full() {
                // A new block, its whole capacity taken first, sized like
                // what came so far but never past the limit.
                let so_far = self.seen - data.len() as u64;
                let size = so_far.clamp(MIN_BLOCK, MAX_BLOCK).min(limit - so_far).max(1);
                self.held.take(size)?;
                let full = std::mem::replace(&mut self.block, Block::new(size as usize));
                if !full.is_empty() {
                    self.blocks.push(full.freeze());
                }
            }
            self.block.fill(&mut data);
        }
        Ok(())
    }

    /// The body read whole, holding its share of the budgets.
    pub(crate) fn into_body(self) -> RequestBody {
        RequestBody::buffered(self.blocks, self.held)
    }
}
