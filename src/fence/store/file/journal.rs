//! The file store's journal: where a raise becomes durable.
//!
//! The commit thread appends everything queued as one frame and fsyncs once; a
//! raise is durable when its frame is. The B-tree file is brought up to date in
//! the background ("folding"), many raises per transaction, so a busy key costs
//! one page write per fold rather than one per raise.
//!
//! Two journal files take turns: the commit thread appends to one while the
//! other, once it has grown past a threshold, is folded and then emptied. Every
//! record says "this key's mark is at least this token", so replaying is taking
//! maxima: the order of records and of files does not matter, and replaying a
//! record twice is harmless.
//!
//! Each file starts with a header block holding the file's epoch, a random
//! number drawn anew each time the file is emptied. A frame is the magic `FGJ1`,
//! the payload's length (u32 LE), a CRC-32 of the epoch and that length (u32 LE),
//! a CRC-32 of the epoch and the payload (u32 LE), then the payload: records of
//! token (u64 LE), key length (u32 LE) and key (UTF-8). The header's own checksum
//! lets a search for frames past the end reject stray bytes without reading the
//! payload they claim: such a search costs one pass, whatever the bytes are.
//! Emptying a file is writing a new epoch: frames from before no longer check
//! out, so the file keeps its blocks and an append overwrites them
//! in place, and an fsync has no file size to record.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub use super::damage::{BadRecord, FrameDamage, HeaderDamage, RecordError, ReplayError};

/// The journal files inside `[fences] path`, beside the B-tree file.
pub const FILES: [&str; 2] = ["fences.journal-0", "fences.journal-1"];

const FILE_MAGIC: [u8; 4] = *b"FGJH";
/// Frames start after this, in a block of their own.
pub const HEADER_BYTES: u64 = 4096;
const MAGIC: [u8; 4] = *b"FGJ1";
const HEADER: usize = 16;
const RECORD_HEADER: usize = 12;

/// Marks by key, in key order: what a journal holds once replayed, and what is
/// not folded yet. In order, so a fold writes the B-tree's pages in turn and a
/// listing reads a range instead of every mark.
pub type Marks = BTreeMap<Box<str>, u64>;

/// Raises `key`'s mark in `marks` to at least `token`; allocates only for a new key.
pub(crate) fn raise(marks: &mut Marks, key: &str, token: u64) {
    match marks.get_mut(key) {
        Some(mark) => *mark = (*mark).max(token),
        None => {
            marks.insert(key.into(), token);
        }
    }
}

/// A frame being filled: writers push records under the queue's lock, the
/// commit thread seals and writes it. Its buffer is reused, so a raise costs no
/// allocation on its way to disk.
#[derive(Debug)]
pub(crate) struct Frame {
    bytes: Vec<u8>,
    records: u64,
}

impl Default for Frame {
    fn default() -> Self {
        Frame { bytes: vec![0; HEADER], records: 0 }
    }
}

impl Frame {
    /// Adds the record "`key`'s mark is at least `token`".
    pub fn push(&mut self, key: &str, token: u64) -> io::Result<()> {
        let key_len = u32::try_from(key.len()).map_err(|_| too_large())?;
        if self.bytes.len() - HEADER + RECORD_HEADER + key.len() > u32::MAX as usize {
            return Err(too_large());
        }
        self.bytes.extend_from_slice(&token.to_le_bytes());
        self.bytes.extend_from_slice(&key_len.to_le_bytes());
        self.bytes.extend_from_slice(key.as_bytes());
        self.records += 1;
        Ok(())
    }

    pub fn records(&self) -> u64 {
        self.records
    }

    pub fn is_empty(&self) -> bool {
        self.records == 0
    }

    pub fn clear(&mut self) {
        self.bytes.truncate(HEADER);
        self.records = 0;
    }

    /// The frame's records, in the order pushed.
    pub fn marks(&self) -> Records<'_> {
        Records::new(&self.bytes[HEADER..])
    }

    /// Fills in the header for a file of `epoch`; returns the bytes to write.
    fn seal(&mut self, epoch: u64) -> &[u8] {
        // `push` keeps the payload under 4 GiB.
        let len = ((self.bytes.len() - HEADER) as u32).to_le_bytes();
        let crc = checksum(epoch, &self.bytes[HEADER..]);
        self.bytes[..4].copy_from_slice(&MAGIC);
        self.bytes[4..8].copy_from_slice(&len);
        self.bytes[8..12].copy_from_slice(&checksum(epoch, &len).to_le_bytes());
        self.bytes[12..HEADER].copy_from_slice(&crc.to_le_bytes());
        &self.bytes
    }
}

fn too_large() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, "a journal frame holds at most 4 GiB")
}

fn checksum(epoch: u64, payload: &[u8]) -> u32 {
    let mut crc = crc32fast::Hasher::new();
    crc.update(&epoch.to_le_bytes());
    crc.update(payload);
    crc.finalize()
}

fn header(epoch: u64) -> [u8; 16] {
    let mut block = [0; 16];
    block[..4].copy_from_slice(&FILE_MAGIC);
    block[4..12].copy_from_slice(&epoch.to_le_bytes());
    let crc = crc32fast::hash(&block[..12]);
    block[12..].copy_from_slice(&crc.to_le_bytes());
    block
}

/// The epoch in a file's header, or what is wrong with the header.
fn epoch_of(bytes: &[u8]) -> Result<u64, HeaderDamage> {
    let block = bytes.get(..16).ok_or(HeaderDamage::Short { len: bytes.len() })?;
    if block[..4] != FILE_MAGIC {
        return Err(HeaderDamage::Magic);
    }
    let mut epoch = [0; 8];
    epoch.copy_from_slice(&block[4..12]);
    let epoch = u64::from_le_bytes(epoch);
    if block != header(epoch) {
        return Err(HeaderDamage::Checksum);
    }
    Ok(epoch)
}

/// What [`replay`] found in one journal file.
#[derive(Debug, PartialEq, Eq)]
pub struct Replayed {
    /// Records replayed.
    pub records: u64,
    /// Where the frames of the file's epoch end; what follows is a torn write,
    /// frames from before the file was last emptied, or never written.
    pub end: u64,
}

/// Replays the frames of a journal file (`bytes`) into `marks`.
///
/// A bad frame at the end is the torn write of a batch whose fsync never
/// returned, so no request that waited for it was forwarded: it is dropped. A
/// bad frame with a good one after it is damage, and an error: dropping it could
/// forget marks that requests were forwarded on.
pub fn replay(bytes: &[u8], marks: &mut Marks) -> Result<Replayed, ReplayError> {
    if bytes.is_empty() {
        return Ok(Replayed { records: 0, end: 0 });
    }
    let epoch = epoch_of(bytes).map_err(ReplayError::Header)?;
    let mut at = HEADER_BYTES as usize;
    let mut records = 0;
    let why = loop {
        match frame_at(bytes, at, epoch) {
            Ok(payload) => {
                records += decode(payload, marks).map_err(|bad| ReplayError::Record {
                    frame: at as u64,
                    index: bad.index,
                    at: (at + HEADER + bad.at) as u64,
                    why: bad.why,
                })?;
                at += HEADER + payload.len();
            }
            Err(why) => break why,
        }
    };
    if let Some(next) = (at + 1..bytes.len()).find(|&i| frame_at(bytes, i, epoch).is_ok()) {
        return Err(ReplayError::Damaged { at: at as u64, why, next: next as u64 });
    }
    Ok(Replayed { records, end: at as u64 })
}

/// The payload of a whole, intact frame of `epoch` starting at `at`.
fn frame_at(bytes: &[u8], at: usize, epoch: u64) -> Result<&[u8], FrameDamage> {
    let left = bytes.len().saturating_sub(at);
    let header = at.checked_add(HEADER).and_then(|end| bytes.get(at..end)).ok_or(FrameDamage::Cut { left })?;
    let field = |at: usize| u32::from_le_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]]);
    if header[..4] != MAGIC {
        return Err(FrameDamage::Magic);
    }
    if checksum(epoch, &header[4..8]) != field(8) {
        return Err(FrameDamage::LengthChecksum);
    }
    let (start, len) = (at + HEADER, field(4));
    let payload = start
        .checked_add(len as usize)
        .and_then(|end| bytes.get(start..end))
        .ok_or(FrameDamage::TornLength { len, left: left - HEADER })?;
    #[cfg(test)]
    tests::PAYLOAD_BYTES_CHECKED.with(|n| n.set(n.get() + payload.len()));
    if checksum(epoch, payload) != field(12) {
        return Err(FrameDamage::PayloadChecksum);
    }
    Ok(payload)
}

fn decode(payload: &[u8], marks: &mut Marks) -> Result<u64, BadRecord> {
    let mut records = 0;
    for record in Records::new(payload) {
        let (key, token) = record?;
        raise(marks, key, token);
        records += 1;
    }
    Ok(records)
}

/// The records of a frame's payload, each as key and token.
pub(crate) struct Records<'a> {
    rest: &'a [u8],
    /// Where `rest` starts in the payload, and how many records came before.
    at: usize,
    index: u64,
}

impl<'a> Records<'a> {
    fn new(payload: &'a [u8]) -> Records<'a> {
        Records { rest: payload, at: 0, index: 0 }
    }

    /// The record at the start of `rest`, and its length.
    fn read(rest: &'a [u8]) -> Result<(&'a str, u64, usize), RecordError> {
        let Some((header, after)) = rest.split_first_chunk::<RECORD_HEADER>() else {
            return Err(RecordError::CutShort { left: rest.len() });
        };
        let [t0, t1, t2, t3, t4, t5, t6, t7, l0, l1, l2, l3] = *header;
        let token = u64::from_le_bytes([t0, t1, t2, t3, t4, t5, t6, t7]);
        let len = u32::from_le_bytes([l0, l1, l2, l3]);
        let key = after.get(..len as usize).ok_or(RecordError::KeyPastFrame { len, left: after.len() })?;
        let key = std::str::from_utf8(key).map_err(|e| RecordError::KeyNotUtf8 { valid_up_to: e.valid_up_to() })?;
        Ok((key, token, RECORD_HEADER + key.len()))
    }
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<(&'a str, u64), BadRecord>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let (index, at) = (self.index, self.at);
        match Records::read(self.rest) {
            Ok((key, token, len)) => {
                self.rest = &self.rest[len..];
                self.at += len;
                self.index += 1;
                Some(Ok((key, token)))
            }
            Err(why) => {
                self.rest = &[];
                Some(Err(BadRecord { index, at, why }))
            }
        }
    }
}

/// One journal file and its epoch.
#[derive(Debug)]
pub(crate) struct JournalFile {
    file: File,
    epoch: AtomicU64,
}

impl JournalFile {
    /// Opens the file at `path`, creating it if it is missing or empty, with at
    /// least `size` bytes written (so appends up to there change no file size),
    /// and empties it: call only once what it holds is folded.
    fn open(dir: &Path, name: &str, size: u64) -> io::Result<JournalFile> {
        let path = dir.join(name);
        let existing = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        if existing < HEADER_BYTES + size {
            // Written in full under another name, then renamed: a crash leaves the
            // old file or the new one, never a file without a header.
            let fresh = dir.join(format!("{name}.new"));
            let file = OpenOptions::new().write(true).create(true).truncate(true).open(&fresh)?;
            let mut block = vec![0; (HEADER_BYTES + size) as usize];
            block[..16].copy_from_slice(&header(new_epoch()?));
            file.write_all_at(&block, 0)?;
            file.sync_all()?;
            std::fs::rename(&fresh, &path)?;
            File::open(dir)?.sync_all()?;
        }
        let file = OpenOptions::new().read(true).write(true).open(&path)?;
        let journal_file = JournalFile { file, epoch: AtomicU64::new(0) };
        journal_file.empty()?;
        Ok(journal_file)
    }

    /// Forgets every frame: writes a new epoch to the header, durably.
    pub fn empty(&self) -> io::Result<()> {
        let epoch = new_epoch()?;
        self.file.write_all_at(&header(epoch), 0)?;
        self.file.sync_data()?;
        self.epoch.store(epoch, Ordering::SeqCst);
        Ok(())
    }

    fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }
}

/// A random epoch from the OS, so nobody outside can predict it and write a key
/// that reads as a frame of it.
fn new_epoch() -> io::Result<u64> {
    Ok(getrandom::u64()?)
}

/// The commit thread's end of the journal: the two files and which one is taking
/// appends.
#[derive(Debug)]
pub(crate) struct Journal {
    files: [Arc<JournalFile>; 2],
    active: usize,
    /// Bytes of whole, durable frames in the active file.
    len: u64,
}

impl Journal {
    /// Opens both files in `dir`, creating them `size` bytes long, and empties
    /// them: call after [`replay`] and a fold of what they held. An error names
    /// the file it happened to.
    pub fn open(dir: &Path, size: u64) -> Result<Journal, (PathBuf, io::Error)> {
        let open = |name: &str| JournalFile::open(dir, name, size).map(Arc::new).map_err(|e| (dir.join(name), e));
        Ok(Journal { files: [open(FILES[0])?, open(FILES[1])?], active: 0, len: 0 })
    }

    /// Bytes of frames in the file taking appends.
    pub fn frame_bytes(&self) -> u64 {
        self.len
    }

    /// Appends `frame` and fsyncs. When this fails, nothing of the frame counts:
    /// the next append is written over it.
    pub fn append(&mut self, frame: &mut Frame) -> io::Result<()> {
        let file = &self.files[self.active];
        let bytes = frame.seal(file.epoch());
        file.file.write_all_at(bytes, HEADER_BYTES + self.len)?;
        file.file.sync_data()?;
        self.len += bytes.len() as u64;
        Ok(())
    }

    /// Sends appends to the other file and returns the full one, to be folded
    /// and emptied. The other file must have been emptied since it was last full.
    pub fn rotate(&mut self) -> Arc<JournalFile> {
        let full = self.active;
        self.active ^= 1;
        self.len = 0;
        self.files[full].clone()
    }
}

/// The bytes of a journal file of `epoch` holding one frame per batch, and
/// where each frame ends: what the commit thread would have written. For tests
/// and the fuzz targets.
pub fn image(epoch: u64, batches: &[&[(&str, u64)]]) -> io::Result<(Vec<u8>, Vec<usize>)> {
    let mut out = vec![0; HEADER_BYTES as usize];
    out[..16].copy_from_slice(&header(epoch));
    let mut ends = Vec::new();
    let mut frame = Frame::default();
    for batch in batches {
        frame.clear();
        for (key, token) in *batch {
            frame.push(key, *token)?;
        }
        out.extend_from_slice(frame.seal(epoch));
        ends.push(out.len());
    }
    Ok((out, ends))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    thread_local! {
        /// How many payload bytes `frame_at` has checksummed on this thread.
        pub static PAYLOAD_BYTES_CHECKED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    pub fn file_bytes(epoch: u64, batches: &[&[(&str, u64)]]) -> (Vec<u8>, Vec<usize>) {
        image(epoch, batches).unwrap()
    }

    fn frame(records: &[(&str, u64)]) -> Frame {
        let mut frame = Frame::default();
        for (key, token) in records {
            frame.push(key, *token).unwrap();
        }
        frame
    }

    fn marks(pairs: &[(&str, u64)]) -> Marks {
        pairs.iter().map(|(k, t)| ((*k).into(), *t)).collect()
    }

    #[test]
    fn replay_takes_the_highest_token_of_each_key_in_any_order() {
        let (bytes, ends) = file_bytes(7, &[&[("a", 3), ("b", 9)], &[("a", 7), ("b", 2), ("ключ", 1)], &[("a", 5)]]);
        let mut found = Marks::default();
        assert_eq!(replay(&bytes, &mut found).unwrap(), Replayed { records: 6, end: ends[2] as u64 });
        assert_eq!(found, marks(&[("a", 7), ("b", 9), ("ключ", 1)]));
        // An empty file (never written) holds nothing.
        assert_eq!(replay(&[], &mut found).unwrap(), Replayed { records: 0, end: 0 });
    }

    #[test]
    fn a_torn_last_frame_is_dropped_wherever_it_was_cut_and_whatever_it_holds() {
        let (bytes, ends) = file_bytes(7, &[&[("a", 3)], &[("a", 8), ("b", 4)]]);
        let kept = Replayed { records: 1, end: ends[0] as u64 };
        for cut in ends[0] + 1..bytes.len() {
            let mut found = Marks::default();
            assert_eq!(replay(&bytes[..cut], &mut found).unwrap(), kept, "cut at {cut}");
            assert_eq!(found, marks(&[("a", 3)]), "cut at {cut}");
        }
        // Whole length, but a byte of the last frame never reached the disk.
        for at in ends[0]..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x5A;
            let mut found = Marks::default();
            assert_eq!(replay(&damaged, &mut found).unwrap(), kept, "byte {at}");
            assert_eq!(found, marks(&[("a", 3)]));
        }
        // Zeros after the last frame (blocks written ahead) are no frames.
        let mut zeros = bytes[..ends[0]].to_vec();
        zeros.extend_from_slice(&[0; 4096]);
        assert_eq!(replay(&zeros, &mut Marks::default()).unwrap(), kept);
    }

    #[test]
    fn frames_from_before_the_file_was_emptied_are_not_replayed() {
        let (old, _) = file_bytes(1, &[&[("a", 3)], &[("b", 4)], &[("c", 5)]]);
        let (new, ends) = file_bytes(2, &[&[("a", 1)]]);
        let mut bytes = old;
        bytes[..ends[0]].copy_from_slice(&new);
        let mut found = Marks::default();
        assert_eq!(replay(&bytes, &mut found).unwrap(), Replayed { records: 1, end: ends[0] as u64 });
        assert_eq!(found, marks(&[("a", 1)]));
    }

    #[test]
    fn a_damaged_frame_with_a_good_one_after_it_is_an_error_naming_both_and_the_damage() {
        let (bytes, ends) = file_bytes(7, &[&[("a", 3)], &[("a", 8)], &[("b", 1)]]);
        let (first, err) = (HEADER_BYTES as usize, |bytes: &[u8]| replay(bytes, &mut Marks::default()).unwrap_err());
        let damaged = |at: usize, why, next: usize| ReplayError::Damaged { at: at as u64, why, next: next as u64 };
        let cases = [
            (first, damaged(first, FrameDamage::Magic, ends[0])),
            (first + 5, damaged(first, FrameDamage::LengthChecksum, ends[0])),
            (first + 9, damaged(first, FrameDamage::LengthChecksum, ends[0])),
            (first + HEADER, damaged(first, FrameDamage::PayloadChecksum, ends[0])),
            (ends[0] + 2, damaged(ends[0], FrameDamage::Magic, ends[1])),
            (ends[1] - 1, damaged(ends[0], FrameDamage::PayloadChecksum, ends[1])),
        ];
        for (byte, expected) in cases {
            let mut bad = bytes.clone();
            bad[byte] ^= 0x01;
            assert_eq!(err(&bad), expected, "byte {byte}");
            assert!(err(&bad).to_string().starts_with("damaged journal frame"), "byte {byte}");
        }
        // A length that claims more than the file holds, its checksum made to agree.
        let (mut torn, len) = (bytes.clone(), 1u32 << 30);
        torn[first + 4..first + 8].copy_from_slice(&len.to_le_bytes());
        torn[first + 8..first + 12].copy_from_slice(&checksum(7, &len.to_le_bytes()).to_le_bytes());
        let left = bytes.len() - first - HEADER;
        assert_eq!(err(&torn), damaged(first, FrameDamage::TornLength { len, left }, ends[0]));
        let mut bad = bytes.clone();
        bad[6] ^= 0x01;
        assert_eq!(err(&bad), ReplayError::Header(HeaderDamage::Checksum));
        assert!(err(&bad).to_string().contains("header is damaged"));
        bad[0] = b'X';
        assert_eq!(err(&bad), ReplayError::Header(HeaderDamage::Magic));
        assert_eq!(err(&bytes[..9]), ReplayError::Header(HeaderDamage::Short { len: 9 }));
    }

    #[test]
    fn stray_frame_lookalikes_past_the_end_cost_one_pass() {
        // Bytes left from an earlier epoch, every 14 of them a magic and a length
        // claiming half the file: without the header's checksum, each would have
        // its payload checksummed (quadratic). Counted, not timed.
        let size = 1 << 20;
        let (mut bytes, _) = file_bytes(7, &[]);
        let mut record = Vec::new();
        record.extend_from_slice(&MAGIC);
        record.extend_from_slice(&((size / 2) as u32).to_le_bytes());
        record.extend_from_slice(&2u32.to_le_bytes());
        record.extend_from_slice(b"/a");
        while bytes.len() < HEADER_BYTES as usize + size {
            bytes.extend_from_slice(&record);
        }
        let lookalikes = (HEADER_BYTES as usize..bytes.len()).filter(|&at| bytes[at..].starts_with(&MAGIC)).count();
        assert!(lookalikes > 70_000);
        PAYLOAD_BYTES_CHECKED.with(|n| n.set(0));
        assert_eq!(replay(&bytes, &mut Marks::default()).unwrap().records, 0);
        let checked = PAYLOAD_BYTES_CHECKED.with(|n| n.get());
        assert!(checked <= bytes.len(), "{checked} payload bytes checksummed for a {} byte file", bytes.len());
    }

    /// A journal file of epoch 7 holding one intact frame of `payload`
    /// after a good frame, and where that frame starts.
    fn with_frame(payload: &[u8]) -> (Vec<u8>, usize) {
        let (mut bytes, ends) = file_bytes(7, &[&[("good", 1)]]);
        let len = (payload.len() as u32).to_le_bytes();
        bytes.extend_from_slice(&MAGIC);
        bytes.extend_from_slice(&len);
        bytes.extend_from_slice(&checksum(7, &len).to_le_bytes());
        bytes.extend_from_slice(&checksum(7, payload).to_le_bytes());
        bytes.extend_from_slice(payload);
        (bytes, ends[0])
    }

    #[test]
    fn a_frame_whose_records_do_not_add_up_is_an_error_naming_the_record_and_its_byte() {
        // Intact checksums over records that can't be read: the second record is bad.
        let mut record = Vec::new();
        record.extend_from_slice(&5u64.to_le_bytes());
        record.extend_from_slice(&1u32.to_le_bytes());
        record.push(b'a');
        let second = |tail: &[u8]| [record.as_slice(), tail].concat();
        let cases: [(Vec<u8>, RecordError, &str); 3] = [
            (
                second(&[1, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, b'k']),
                RecordError::KeyPastFrame { len: 9, left: 1 },
                "runs past its frame",
            ),
            (second(&[1, 0, 0]), RecordError::CutShort { left: 3 }, "cut short"),
            (
                second(&[1, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, b'o', 0xff, b'k']),
                RecordError::KeyNotUtf8 { valid_up_to: 1 },
                "not UTF-8",
            ),
        ];
        for (payload, why, said) in cases {
            let (bytes, frame) = with_frame(&payload);
            let err = replay(&bytes, &mut Marks::default()).unwrap_err();
            let at = (frame + HEADER + record.len()) as u64;
            assert_eq!(err, ReplayError::Record { frame: frame as u64, index: 1, at, why });
            let text = err.to_string();
            assert!(text.starts_with(&format!("journal frame at byte {frame}: record 1 at byte {at}: ")), "{text}");
            assert!(text.contains(said), "{text}");
        }
    }

    #[test]
    fn appends_go_to_one_file_until_rotated_and_emptying_forgets_them() {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path();
        let mut journal = Journal::open(dir, 1 << 16).map_err(|(_, e)| e).unwrap();
        journal.append(&mut frame(&[("a", 1)])).unwrap();
        journal.append(&mut frame(&[("a", 2), ("b", 5)])).unwrap();
        let full = journal.rotate();
        assert_eq!(journal.frame_bytes(), 0);
        journal.append(&mut frame(&[("c", 7)])).unwrap();
        let read = |name: &str| {
            let mut found = Marks::default();
            replay(&std::fs::read(dir.join(name)).unwrap(), &mut found).unwrap();
            found
        };
        assert_eq!(read(FILES[0]), marks(&[("a", 2), ("b", 5)]));
        assert_eq!(read(FILES[1]), marks(&[("c", 7)]));
        // Written ahead: appends within the first allocation change no file size.
        let size = std::fs::metadata(dir.join(FILES[0])).unwrap().len();
        assert_eq!(size, HEADER_BYTES + (1 << 16));
        full.empty().unwrap();
        assert_eq!(read(FILES[0]), Marks::default());
        // Reopening empties both, keeping their blocks.
        drop(journal);
        let journal = Journal::open(dir, 1 << 16).map_err(|(_, e)| e).unwrap();
        assert_eq!(read(FILES[1]), Marks::default());
        assert_eq!(std::fs::metadata(dir.join(FILES[1])).unwrap().len(), size);
        drop(journal);
    }
}
