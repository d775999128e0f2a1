//! Where a buffered body's bytes go: blocks whose whole capacity is taken up
//! front, the large ones memory mapped so they go back to the system at once.

use std::collections::VecDeque;

use bytes::{BufMut, Bytes, BytesMut};
use memmap2::MmapMut;

/// The most of a buffered body hyper is handed at once. A body read whole
/// may be one block of megabytes; handed over in one frame, hyper would take
/// it all at once into its own write queue, and "the last frame was handed
/// over" would say nothing of what left. In frames of this size (HTTP/2's
/// default frame), what hyper holds unwritten stays small: its HTTP/1.1
/// write queue holds a few hundred KiB at most, and over HTTP/2 one frame
/// waits for the upstream's flow-control window while another is queued.
pub(super) const MAX_FRAME: usize = 16 * 1024;

/// A buffered body's blocks, in order. The first is held apart, so a body of
/// one block (most of them) needs no list.
#[derive(Debug, Default, Clone)]
pub struct Blocks {
    first: Option<Bytes>,
    rest: VecDeque<Bytes>,
}

impl Blocks {
    pub(super) fn push(&mut self, block: Bytes) {
        if self.is_empty() {
            self.first = Some(block);
        } else {
            self.rest.push_back(block);
        }
    }

    pub(super) fn pop(&mut self) -> Option<Bytes> {
        self.first.take().or_else(|| self.rest.pop_front())
    }

    /// The next frame to hand over: at most [`MAX_FRAME`] bytes of the next
    /// block (the rest of it stays first; no copy).
    pub(super) fn pop_frame(&mut self) -> Option<Bytes> {
        let mut block = self.pop()?;
        if block.len() > MAX_FRAME {
            let frame = block.split_to(MAX_FRAME);
            self.first = Some(block);
            return Some(frame);
        }
        Some(block)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.first.is_none() && self.rest.is_empty()
    }

    pub(super) fn len(&self) -> u64 {
        self.first.iter().chain(&self.rest).map(|b| b.len() as u64).sum()
    }
}

/// Blocks from this size on are anonymous mappings of their own, unmapped
/// (handed back to the system) as soon as the body is sent or refused. The
/// allocator would keep freed memory resident until it next works, so an
/// idle proxy would keep what an attack made it hold. Smaller blocks, the
/// first 16 KiB of any body, come from the allocator: a mapping costs two
/// system calls, which small bodies should not pay.
const MAP_FROM: usize = 16 * 1024;

/// Where a buffered body's bytes are written, `capacity` taken up front.
#[derive(Debug)]
pub(super) enum Block {
    Heap(BytesMut),
    Mapped { map: MmapMut, len: usize },
}

impl Block {
    pub(super) fn new(capacity: usize) -> Block {
        if capacity >= MAP_FROM {
            // Past the process's mappings (vm.max_map_count) or address
            // space, the allocator holds the block instead.
            if let Ok(map) = MmapMut::map_anon(capacity) {
                return Block::Mapped { map, len: 0 };
            }
        }
        Block::Heap(BytesMut::with_capacity(capacity))
    }

    pub(super) fn is_full(&self) -> bool {
        match self {
            Block::Heap(bytes) => bytes.len() == bytes.capacity(),
            Block::Mapped { map, len } => *len == map.len(),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        match self {
            Block::Heap(bytes) => bytes.is_empty(),
            Block::Mapped { len, .. } => *len == 0,
        }
    }

    /// Copies in as much of `data` as fits, and advances it past that.
    pub(super) fn fill(&mut self, data: &mut Bytes) {
        match self {
            Block::Heap(bytes) => {
                let n = data.len().min(bytes.capacity() - bytes.len());
                bytes.put_slice(&data.split_to(n));
            }
            Block::Mapped { map, len } => {
                let n = data.len().min(map.len() - *len);
                map[*len..*len + n].copy_from_slice(&data.split_to(n));
                *len += n;
            }
        }
    }

    pub(super) fn freeze(self) -> Bytes {
        match self {
            Block::Heap(bytes) => bytes.freeze(),
            Block::Mapped { map, len } => Bytes::from_owner(map).slice(..len),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_come_out_in_the_order_they_went_in() {
        let mut blocks = Blocks::default();
        assert!(blocks.is_empty());
        for text in ["a", "bb", "ccc"] {
            blocks.push(Bytes::from(text));
        }
        assert_eq!(blocks.len(), 6);
        assert_eq!(blocks.pop().as_deref(), Some(&b"a"[..]));
        blocks.push(Bytes::from("dddd"));
        let rest: Vec<_> = std::iter::from_fn(|| blocks.pop()).collect();
        assert_eq!(rest, ["bb", "ccc", "dddd"]);
        assert!(blocks.is_empty());
    }
}
