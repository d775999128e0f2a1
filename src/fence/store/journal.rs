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
//! A frame is the magic `FGJ1`, the payload's length (u32 LE) and its CRC-32
//! (u32 LE), then the payload: records of token (u64 LE), key length (u32 LE)
//! and key (UTF-8).

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
use std::sync::Arc;

/// The journal files inside `[fences] path`, beside the B-tree file.
pub const FILES: [&str; 2] = ["fences.journal-0", "fences.journal-1"];

const MAGIC: [u8; 4] = *b"FGJ1";
const HEADER: usize = 12;
const RECORD_HEADER: usize = 12;

/// Marks by key: what a journal holds once replayed, and what is not folded yet.
pub type Marks = BTreeMap<Box<str>, u64>;

/// Raises `key`'s mark in `marks` to at least `token`.
pub fn raise(marks: &mut Marks, key: Box<str>, token: u64) {
    let mark = marks.entry(key).or_insert(token);
    *mark = (*mark).max(token);
}

/// Appends one frame holding `raises` to `out`.
pub fn encode(raises: &[(Box<str>, u64)], out: &mut Vec<u8>) -> io::Result<()> {
    let start = out.len();
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&[0; 8]);
    for (key, token) in raises {
        let key_len = u32::try_from(key.len()).map_err(|_| too_large())?;
        out.extend_from_slice(&token.to_le_bytes());
        out.extend_from_slice(&key_len.to_le_bytes());
        out.extend_from_slice(key.as_bytes());
    }
    let payload = &out[start + HEADER..];
    let len = u32::try_from(payload.len()).map_err(|_| too_large())?;
    let crc = crc32fast::hash(payload);
    out[start + 4..start + 8].copy_from_slice(&len.to_le_bytes());
    out[start + 8..start + HEADER].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

fn too_large() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, "a journal frame holds at most 4 GiB")
}

/// What [`replay`] found in one journal file.
#[derive(Debug, PartialEq, Eq)]
pub struct Replayed {
    /// Records replayed.
    pub records: u64,
    /// Where the torn tail starts, if there is one: everything from there on
    /// was dropped.
    pub torn_at: Option<usize>,
}

/// Replays the frames in `bytes` into `marks`.
///
/// A bad frame at the end is the torn write of a batch whose fsync never
/// returned, so no request that waited for it was forwarded: it is dropped. A
/// bad frame with a good one after it is damage, and an error: dropping it could
/// forget marks that requests were forwarded on.
pub fn replay(bytes: &[u8], marks: &mut Marks) -> Result<Replayed, String> {
    let mut at = 0;
    let mut records = 0;
    while at < bytes.len() {
        let Some(payload) = frame_at(bytes, at) else {
            if let Some(next) = (at + 1..bytes.len()).find(|&i| frame_at(bytes, i).is_some()) {
                return Err(format!("damaged journal frame at byte {at}, with a good frame after it at byte {next}"));
            }
            return Ok(Replayed { records, torn_at: Some(at) });
        };
        records += decode(payload, marks).map_err(|e| format!("journal frame at byte {at}: {e}"))?;
        at += HEADER + payload.len();
    }
    Ok(Replayed { records, torn_at: None })
}

/// The payload of a whole, intact frame starting at `at`.
fn frame_at(bytes: &[u8], at: usize) -> Option<&[u8]> {
    let header = bytes.get(at..at + HEADER)?;
    if header[..4] != MAGIC {
        return None;
    }
    let len = u32::from_le_bytes(header[4..8].try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(header[8..12].try_into().ok()?);
    let payload = bytes.get(at + HEADER..at + HEADER + len)?;
    (crc32fast::hash(payload) == crc).then_some(payload)
}

fn decode(mut payload: &[u8], marks: &mut Marks) -> Result<u64, String> {
    let mut records = 0;
    while !payload.is_empty() {
        let header = payload.get(..RECORD_HEADER).ok_or("a record is cut short")?;
        let token = u64::from_le_bytes(header[..8].try_into().map_err(|_| "bad token")?);
        let key_len = u32::from_le_bytes(header[8..12].try_into().map_err(|_| "bad key length")?) as usize;
        let key = payload.get(RECORD_HEADER..RECORD_HEADER + key_len).ok_or("a key runs past its frame")?;
        let key = std::str::from_utf8(key).map_err(|_| "a key is not UTF-8")?;
        raise(marks, key.into(), token);
        payload = &payload[RECORD_HEADER + key_len..];
        records += 1;
    }
    Ok(records)
}

/// The commit thread's end of the journal: the two files and which one is taking
/// appends.
#[derive(Debug)]
pub struct Journal {
    files: [Arc<File>; 2],
    active: usize,
    /// Bytes of whole, durable frames in the active file.
    len: u64,
    /// A failed append may have left part of a frame behind `len`; cut it off
    /// before the next append.
    damaged: bool,
    buf: Vec<u8>,
}

impl Journal {
    /// Opens (creating) both files in `dir` for appending. They must be empty or
    /// hold only frames that are folded already: call after [`replay`] and a fold.
    pub fn open(dir: &Path) -> io::Result<Journal> {
        let open = |name: &str| OpenOptions::new().create(true).append(true).open(dir.join(name)).map(Arc::new);
        let files = [open(FILES[0])?, open(FILES[1])?];
        // The files' names must survive a crash as surely as what goes into them.
        File::open(dir)?.sync_all()?;
        let len = files[0].metadata()?.len();
        Ok(Journal { files, active: 0, len, damaged: false, buf: Vec::new() })
    }

    /// Bytes in the file taking appends.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Appends `raises` as one frame and fsyncs. When this fails, nothing of the
    /// frame counts: it is cut off again, now or before the next append.
    pub fn append(&mut self, raises: &[(Box<str>, u64)]) -> io::Result<()> {
        let file = &*self.files[self.active];
        if self.damaged {
            file.set_len(self.len)?;
            self.damaged = false;
        }
        self.buf.clear();
        encode(raises, &mut self.buf)?;
        match (&*file).write_all(&self.buf).and_then(|()| file.sync_data()) {
            Ok(()) => {
                self.len += self.buf.len() as u64;
                Ok(())
            }
            Err(e) => {
                self.damaged = file.set_len(self.len).is_err();
                Err(e)
            }
        }
    }

    /// Sends appends to the other file and returns the full one, to be folded
    /// and emptied. The other file must have been emptied since it was last full.
    pub fn rotate(&mut self) -> io::Result<Arc<File>> {
        let next = self.active ^ 1;
        let len = self.files[next].metadata()?.len();
        let full = std::mem::replace(&mut self.active, next);
        self.len = len;
        self.damaged = false;
        Ok(self.files[full].clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(batches: &[&[(&str, u64)]]) -> (Vec<u8>, Vec<usize>) {
        let mut out = Vec::new();
        let mut ends = Vec::new();
        for batch in batches {
            let raises: Vec<(Box<str>, u64)> = batch.iter().map(|(k, t)| ((*k).into(), *t)).collect();
            encode(&raises, &mut out).unwrap();
            ends.push(out.len());
        }
        (out, ends)
    }

    fn marks(pairs: &[(&str, u64)]) -> Marks {
        pairs.iter().map(|(k, t)| ((*k).into(), *t)).collect()
    }

    #[test]
    fn replay_takes_the_highest_token_of_each_key_in_any_order() {
        let (bytes, _) = frames(&[&[("a", 3), ("b", 9)], &[("a", 7), ("b", 2), ("ключ", 1)], &[("a", 5)]]);
        let mut found = Marks::new();
        assert_eq!(replay(&bytes, &mut found).unwrap(), Replayed { records: 6, torn_at: None });
        assert_eq!(found, marks(&[("a", 7), ("b", 9), ("ключ", 1)]));
    }

    #[test]
    fn a_torn_last_frame_is_dropped_wherever_it_was_cut_and_whatever_it_holds() {
        let (bytes, ends) = frames(&[&[("a", 3)], &[("a", 8), ("b", 4)]]);
        for cut in ends[0] + 1..bytes.len() {
            let mut found = Marks::new();
            let replayed = replay(&bytes[..cut], &mut found).unwrap();
            assert_eq!(replayed, Replayed { records: 1, torn_at: Some(ends[0]) }, "cut at {cut}");
            assert_eq!(found, marks(&[("a", 3)]), "cut at {cut}");
        }
        // Whole length, but a byte of the last frame never reached the disk.
        for at in ends[0]..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x5A;
            let mut found = Marks::new();
            assert_eq!(replay(&damaged, &mut found).unwrap().torn_at, Some(ends[0]), "byte {at}");
            assert_eq!(found, marks(&[("a", 3)]));
        }
        // A tail of zeros (the file grew, the data never came) is torn too.
        let mut zeros = bytes[..ends[0]].to_vec();
        zeros.extend_from_slice(&[0; 4096]);
        assert_eq!(replay(&zeros, &mut Marks::new()).unwrap().torn_at, Some(ends[0]));
    }

    #[test]
    fn a_damaged_frame_with_a_good_one_after_it_is_an_error() {
        let (bytes, ends) = frames(&[&[("a", 3)], &[("a", 8)], &[("b", 1)]]);
        for at in [0, 5, 9, ends[0] + 2, ends[1] - 1] {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x01;
            let err = replay(&damaged, &mut Marks::new()).unwrap_err();
            assert!(err.contains("damaged journal frame"), "{err}");
        }
    }

    #[test]
    fn a_frame_whose_records_do_not_add_up_is_an_error() {
        // A frame with an intact checksum over a record cut short.
        let mut bytes = Vec::new();
        let payload = [1u8, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, b'k'];
        bytes.extend_from_slice(&MAGIC);
        bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        bytes.extend_from_slice(&payload);
        let err = replay(&bytes, &mut Marks::new()).unwrap_err();
        assert!(err.contains("runs past its frame"), "{err}");
    }

    #[test]
    fn appends_go_to_one_file_until_rotated() {
        let dir = std::env::temp_dir().join(format!("fencegate-journal-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut journal = Journal::open(&dir).unwrap();
        journal.append(&[("a".into(), 1)]).unwrap();
        journal.append(&[("a".into(), 2), ("b".into(), 5)]).unwrap();
        let full = journal.rotate().unwrap();
        assert_eq!(journal.len(), 0);
        journal.append(&[("c".into(), 7)]).unwrap();
        let read = |name: &str| {
            let mut found = Marks::new();
            replay(&std::fs::read(dir.join(name)).unwrap(), &mut found).unwrap();
            found
        };
        assert_eq!(read(FILES[0]), marks(&[("a", 2), ("b", 5)]));
        assert_eq!(read(FILES[1]), marks(&[("c", 7)]));
        assert_eq!(full.metadata().unwrap().len(), std::fs::metadata(dir.join(FILES[0])).unwrap().len());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
