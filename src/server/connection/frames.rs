//! HTTP/2 frame boundaries, followed from the 9-byte frame headers alone
//! (payloads are skipped, not copied): where a frame, and a header block, ends.
//! The guards time what a client leaves incomplete between requests.

use super::activity::Unit;

/// What one read of an HTTP/2 connection did, by frame boundaries.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct FramesRead {
    /// A unit ended in this read: whatever is incomplete now began in it.
    pub(super) completed: bool,
    /// A head ended in this read.
    pub(super) head_completed: bool,
    /// What is incomplete at the end of the read.
    pub(super) incomplete: Option<Unit>,
}

/// HTTP/2 frame boundaries across reads (RFC 9113 §4.1): only the 9-byte
/// frame headers are looked at.
#[derive(Debug)]
pub(super) struct Frames {
    /// The current frame's header, as far as it has arrived.
    header: [u8; Frames::HEADER_LEN],
    header_len: usize,
    /// Payload bytes of the current frame still to come, once its header is in.
    payload_left: usize,
    /// The current frame is the first after the preface: the client's SETTINGS.
    first: bool,
    /// A header block is open: its frames so far lack END_HEADERS.
    in_block: bool,
    /// The current frame carries END_HEADERS: it closes a header block.
    ends_block: bool,
}

impl Frames {
    pub(super) const HEADER_LEN: usize = 9;
    pub(super) const HEADERS: u8 = 0x1;
    pub(super) const PUSH_PROMISE: u8 = 0x5;
    pub(super) const CONTINUATION: u8 = 0x9;
    pub(super) const END_HEADERS: u8 = 0x4;

    pub(super) fn after_preface() -> Frames {
        Frames {
            header: [0; Frames::HEADER_LEN],
            header_len: 0,
            payload_left: 0,
            first: true,
            in_block: false,
            ends_block: false,
        }
    }

    pub(super) fn read(&mut self, mut bytes: &[u8]) -> FramesRead {
        let mut read = FramesRead::default();
        while !bytes.is_empty() {
            if self.header_len < Frames::HEADER_LEN {
                let n = (Frames::HEADER_LEN - self.header_len).min(bytes.len());
                self.header[self.header_len..][..n].copy_from_slice(&bytes[..n]);
                self.header_len += n;
                bytes = &bytes[n..];
                if self.header_len < Frames::HEADER_LEN {
                    break;
                }
                let [l0, l1, l2, kind, flags, ..] = self.header;
                self.payload_left = u32::from_be_bytes([0, l0, l1, l2]) as usize;
                if matches!(kind, Frames::HEADERS | Frames::PUSH_PROMISE | Frames::CONTINUATION) {
                    self.ends_block = flags & Frames::END_HEADERS != 0;
                    self.in_block = !self.ends_block;
                }
            }
            let n = self.payload_left.min(bytes.len());
            self.payload_left -= n;
            bytes = &bytes[n..];
            if self.payload_left > 0 {
                break;
            }
            // The frame is complete.
            self.header_len = 0;
            let ends_head = self.first || self.ends_block;
            self.first = false;
            self.ends_block = false;
            if !self.in_block {
                read.completed = true;
                read.head_completed |= ends_head;
            }
        }
        read.incomplete = self.incomplete();
        read
    }

    fn incomplete(&self) -> Option<Unit> {
        if self.first || self.in_block || self.ends_block {
            Some(Unit::Head)
        } else if self.header_len > 0 {
            Some(Unit::Frame)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::connection::testing::{frame, DATA, PING, SETTINGS, WINDOW_UPDATE};

    /// Frames in one stream, each with what is incomplete while it arrives
    /// (before and after its 9-byte header is in) and whether its end ends a
    /// head; `None`: its end leaves a header block open.
    fn conversation() -> Vec<(Vec<u8>, Unit, Unit, Option<bool>)> {
        use Unit::{Frame as F, Head as H};
        vec![
            (frame(SETTINGS, 0, 6), H, H, Some(true)),
            (frame(SETTINGS, 1, 0), F, F, Some(false)),
            (frame(PING, 0, 8), F, F, Some(false)),
            (frame(Frames::HEADERS, 0, 20), F, H, None),
            (frame(Frames::CONTINUATION, 0, 7), H, H, None),
            (frame(Frames::CONTINUATION, Frames::END_HEADERS, 5), H, H, Some(true)),
            (frame(WINDOW_UPDATE, 0, 4), F, F, Some(false)),
            (frame(Frames::HEADERS, Frames::END_HEADERS | 0x1, 30), F, H, Some(true)),
            (frame(DATA, 0x1, 100), F, F, Some(false)),
            (frame(Frames::PUSH_PROMISE, 0, 8), F, H, None),
            (frame(Frames::CONTINUATION, Frames::END_HEADERS, 0), H, H, Some(true)),
        ]
    }

    #[test]
    fn frame_boundaries_are_followed_byte_by_byte() {
        let mut frames = Frames::after_preface();
        for (i, (bytes, before_header, after_header, ends)) in conversation().into_iter().enumerate() {
            for (k, byte) in bytes.iter().enumerate() {
                let read = frames.read(&[*byte]);
                let last = k + 1 == bytes.len();
                let expected = match (last, ends) {
                    (true, Some(head)) => FramesRead { completed: true, head_completed: head, incomplete: None },
                    (true, None) => {
                        FramesRead { completed: false, head_completed: false, incomplete: Some(Unit::Head) }
                    }
                    (false, _) => FramesRead {
                        completed: false,
                        head_completed: false,
                        incomplete: Some(if k + 1 < Frames::HEADER_LEN { before_header } else { after_header }),
                    },
                };
                assert_eq!(read, expected, "frame {i}, byte {k}");
            }
        }
    }

    #[test]
    fn frame_boundaries_are_followed_across_any_split() {
        let stream: Vec<u8> = conversation().into_iter().flat_map(|(bytes, ..)| bytes).collect();
        let heads = conversation().iter().filter(|(.., ends)| *ends == Some(true)).count();
        for a in 0..=stream.len() {
            for b in (a..=stream.len()).step_by(7) {
                let mut frames = Frames::after_preface();
                let reads = [&stream[..a], &stream[a..b], &stream[b..]].map(|part| frames.read(part));
                assert_eq!(reads[2].incomplete, None, "cut at {a} and {b}");
                assert!(reads.iter().any(|r| r.head_completed), "cut at {a} and {b}");
                assert!(reads.iter().filter(|r| r.head_completed).count() <= heads);
            }
        }
    }
}
