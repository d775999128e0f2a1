//! What a journal replay found where it stopped: the typed reasons a
//! journal file, a frame or a record can't be read (see `journal`).

/// Why a journal file could not be replayed: where, and what was found there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    /// The file's first block holds no header of its own.
    #[error("the journal file's header is damaged ({0})")]
    Header(HeaderDamage),
    /// An intact frame of the file's epoch whose records do not add up:
    /// the frame at byte `frame`, its record number `index` (from 0) at
    /// byte `at` of the file.
    #[error("journal frame at byte {frame}: record {index} at byte {at}: {why}")]
    Record { frame: u64, index: u64, at: u64, why: RecordError },
    /// A frame that does not check out (at byte `at`), with a good frame of
    /// the file's epoch after it (at byte `next`): damage, not a torn write.
    #[error("damaged journal frame at byte {at} ({why}), with a good frame after it at byte {next}")]
    Damaged { at: u64, why: FrameDamage, next: u64 },
}

/// What is wrong with a journal file's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeaderDamage {
    #[error("the file is {len} bytes long, shorter than its header")]
    Short { len: usize },
    #[error("it does not start with the journal's magic")]
    Magic,
    #[error("its checksum does not match")]
    Checksum,
}

/// Why the bytes at some offset are no whole, intact frame of the file's epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameDamage {
    /// Fewer bytes are left than a frame's header takes.
    #[error("{left} bytes left, fewer than a frame header")]
    Cut { left: usize },
    /// The frame's tag is not the frame magic.
    #[error("no frame magic")]
    Magic,
    /// The length field's checksum does not match (the length can't be trusted).
    #[error("the length's checksum does not match")]
    LengthChecksum,
    /// The payload the length claims runs past the end of the file.
    #[error("a payload of {len} bytes where {left} are left")]
    TornLength { len: u32, left: usize },
    /// The payload's checksum does not match.
    #[error("the payload's checksum does not match")]
    PayloadChecksum,
}

/// Why a record of an intact frame can't be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// Fewer bytes are left in the frame than a record's token and key length.
    #[error("a record is cut short ({left} bytes left)")]
    CutShort { left: usize },
    /// The key's length runs past the end of the frame.
    #[error("a key runs past its frame ({len} bytes long, {left} left)")]
    KeyPastFrame { len: u32, left: usize },
    /// The key's bytes are not UTF-8 (valid up to byte `valid_up_to` of the key).
    #[error("a key is not UTF-8 (from byte {valid_up_to} of the key)")]
    KeyNotUtf8 { valid_up_to: usize },
}

/// A record of a frame's payload that can't be read: its number (from 0),
/// its byte offset in the payload, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("record {index} at byte {at} of its frame: {why}")]
pub struct BadRecord {
    pub index: u64,
    pub at: usize,
    pub why: RecordError,
}
