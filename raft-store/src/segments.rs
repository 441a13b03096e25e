//! The Raft log's bytes, in append-only segment files.
//!
//! Each entry is written once, as one record, to the newest segment and fsynced there; it is
//! never copied again (no memtable flush, no compaction). A segment is named by the index of
//! its first record (`00000000000000000001.log`) and holds the entries after it in order, so
//! the log is the segments in name order. Purging deletes whole segments once every entry in
//! them is purged; truncating cuts the segment holding the first removed entry and deletes
//! the ones after it.
//!
//! Record: `[payload length u32 LE][CRC-32 of the payload u32 LE][payload]`. After a crash
//! the newest segment may end in a torn record (written, never fsynced, so never reported
//! durable): opening cuts the segment there. A bad record anywhere else is corruption and
//! refuses the open.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::limits::{LOG_RECORD_BYTES_MAX, LOG_SEGMENT_BYTES_MAX};
use crate::StoreError;

const HEADER_BYTES: u64 = 8;
const SUFFIX: &str = ".log";
/// Read buffer for scanning a segment when the log opens.
const SCAN_BUFFER_BYTES: usize = 1 << 20;

/// One record, framed as it goes to disk: header and payload in one buffer, so appending
/// writes it as it is, with no copy.
pub struct Record(Vec<u8>);

impl Record {
    /// Serializes `value` straight after the room left for the header, then fills it in.
    pub fn encode<T: serde::Serialize>(value: &T) -> Result<Self, StoreError> {
        let mut bytes = vec![0u8; HEADER_BYTES as usize];
        bincode::serialize_into(&mut bytes, value).map_err(StoreError::decode("log entry"))?;
        Self::framed(bytes)
    }

    /// A record of `payload` as it is (bytes already encoded elsewhere).
    pub fn of_payload(payload: &[u8]) -> Result<Self, StoreError> {
        let mut bytes = Vec::with_capacity(HEADER_BYTES as usize + payload.len());
        bytes.extend_from_slice(&[0u8; HEADER_BYTES as usize]);
        bytes.extend_from_slice(payload);
        Self::framed(bytes)
    }

    fn framed(mut bytes: Vec<u8>) -> Result<Self, StoreError> {
        let (header, payload) = bytes.split_at_mut(HEADER_BYTES as usize);
        if payload.len() > LOG_RECORD_BYTES_MAX {
            return Err(StoreError::Corrupt(format!("a log entry of {} bytes", payload.len())));
        }
        header[..4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        header[4..].copy_from_slice(&crc32fast::hash(payload).to_le_bytes());
        Ok(Self(bytes))
    }

    /// Bytes of the payload (the encoded entry).
    pub fn payload_len(&self) -> usize {
        self.0.len() - HEADER_BYTES as usize
    }
}

/// One segment file and where each of its records starts.
struct Segment {
    /// Index of the first record.
    first: u64,
    path: PathBuf,
    file: Arc<File>,
    /// Byte offset of each record, in index order.
    offsets: Vec<u64>,
    /// Bytes of valid records (where the next one goes).
    len: u64,
}

impl Segment {
    /// One past the index of the last record.
    fn end(&self) -> u64 {
        self.first + self.offsets.len() as u64
    }

    fn record_end(&self, position: usize) -> u64 {
        self.offsets.get(position + 1).copied().unwrap_or(self.len)
    }
}

/// The log's segment files. Every method takes `&self`; one lock orders them.
pub struct SegmentLog {
    dir: PathBuf,
    segments: Mutex<VecDeque<Segment>>,
    /// One past the last purged index: records below it may still be held (segments go
    /// whole) but are never read.
    unpurged_from: AtomicU64,
}

impl SegmentLog {
    /// Opens (or creates) the segments in `dir`, cutting a torn record off the newest one.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        fs::create_dir_all(dir)?;
        let mut names: Vec<(u64, PathBuf)> = fs::read_dir(dir)?
            .filter_map(|item| {
                let path = item.ok()?.path();
                let first = path.file_name()?.to_str()?.strip_suffix(SUFFIX)?.parse().ok()?;
                Some((first, path))
            })
            .collect();
        names.sort();
        let mut segments = VecDeque::new();
        let newest = names.len().saturating_sub(1);
        for (position, (first, path)) in names.into_iter().enumerate() {
            let segment = scan(first, path, position == newest)?;
            if let Some(previous) = segments.back().map(Segment::end) {
                if previous > segment.first {
                    return Err(StoreError::Corrupt(format!(
                        "log segment {} starts at {} but the one before ends at {previous}",
                        segment.path.display(),
                        segment.first
                    )));
                }
            }
            segments.push_back(segment);
        }
        Ok(Self { dir: dir.to_path_buf(), segments: Mutex::new(segments), unpurged_from: AtomicU64::new(0) })
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<Segment>> {
        self.segments.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Index of the first record held, if any (records at or below the last purged index may
    /// still be held: segments go whole).
    #[cfg(test)]
    pub fn first_index(&self) -> Option<u64> {
        self.lock().front().filter(|s| s.end() > s.first).map(|s| s.first)
    }

    /// One past the last record's index, if any record is held.
    pub fn end_index(&self) -> Option<u64> {
        let segments = self.lock();
        segments.back().filter(|_| segments.iter().any(|s| s.end() > s.first)).map(Segment::end)
    }

    /// Bytes of all segment files.
    pub fn bytes(&self) -> u64 {
        self.lock().iter().map(|s| s.len).sum()
    }

    /// Writes `records` (the entries `first`, `first + 1`, ...) after the last one, without
    /// fsync: [`SegmentLog::sync`] makes them durable. `first` must be past the last record.
    pub fn append(&self, first: u64, records: &[Record]) -> Result<(), StoreError> {
        let mut segments = self.lock();
        let mut next = first;
        for record in records {
            let active = match segments.back() {
                Some(s) if next < s.end() => {
                    return Err(StoreError::Corrupt(format!("append at {next} before log end {}", s.end())));
                }
                Some(s) if next == s.end() && s.len < LOG_SEGMENT_BYTES_MAX => segments.len() - 1,
                _ => {
                    // A full segment is fsynced before the next one starts, so only the newest
                    // segment ever holds records that are not durable. An append past the end
                    // (never from Raft, but openraft's storage suite does it) starts a segment
                    // at its index, leaving the gap a range read skips.
                    if let Some(full) = segments.back() {
                        full.file.sync_data()?;
                    }
                    segments.push_back(self.create(next)?);
                    segments.len() - 1
                }
            };
            let segment = &mut segments[active];
            segment.file.write_all_at(&record.0, segment.len)?;
            segment.offsets.push(segment.len);
            segment.len += record.0.len() as u64;
            next += 1;
        }
        Ok(())
    }

    fn create(&self, first: u64) -> Result<Segment, StoreError> {
        let path = self.dir.join(format!("{first:020}{SUFFIX}"));
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path)?;
        sync_dir(&self.dir)?;
        Ok(Segment { first, path, file: Arc::new(file), offsets: Vec::new(), len: 0 })
    }

    /// Makes every record appended so far durable. The lock is held only to pick the file:
    /// appends go on while the disk works.
    pub fn sync(&self) -> Result<(), StoreError> {
        let newest = self.lock().back().map(|s| s.file.clone());
        if let Some(file) = newest {
            file.sync_data()?;
        }
        Ok(())
    }

    /// The records of `[start, end)` held and not purged, stopping before the one that would
    /// take the bytes read past `bytes_max` (the first is always returned). One read per run
    /// of records in a segment; each record's checksum is verified.
    pub fn read(&self, start: u64, end: u64, bytes_max: usize) -> Result<Vec<Vec<u8>>, StoreError> {
        let start = start.max(self.unpurged_from.load(Ordering::Acquire));
        let segments = self.lock();
        let mut out = Vec::new();
        let mut total = 0usize;
        for segment in segments.iter().skip_while(|s| s.end() <= start) {
            if segment.first >= end {
                break;
            }
            let from = (start.max(segment.first) - segment.first) as usize;
            let until = (end.min(segment.end()) - segment.first) as usize;
            let (mut to, mut run, mut full) = (from, 0usize, false);
            while to < until {
                let size = (segment.record_end(to) - segment.offsets[to]) as usize;
                if total + run + size > bytes_max && !(out.is_empty() && to == from) {
                    full = true;
                    break;
                }
                run += size;
                to += 1;
            }
            if to > from {
                let mut bytes = vec![0u8; run];
                segment.file.read_exact_at(&mut bytes, segment.offsets[from])?;
                let mut at = 0usize;
                for position in from..to {
                    let size = (segment.record_end(position) - segment.offsets[position]) as usize;
                    out.push(checked_payload(&bytes[at..at + size], segment, position)?.to_vec());
                    at += size;
                }
                total += run;
            }
            if full {
                break;
            }
        }
        Ok(out)
    }

    /// Removes the records from `index` on and fsyncs, so none comes back after a crash.
    pub fn truncate(&self, index: u64) -> Result<(), StoreError> {
        let mut segments = self.lock();
        // Newest first, each deletion made durable before the next: a crash leaves the log
        // shorter, never with a hole.
        while segments.back().is_some_and(|s| s.first >= index) {
            if let Some(segment) = segments.pop_back() {
                fs::remove_file(&segment.path)?;
                sync_dir(&self.dir)?;
            }
        }
        if let Some(segment) = segments.back_mut().filter(|s| s.end() > index) {
            let position = (index - segment.first) as usize;
            segment.len = segment.offsets[position];
            segment.offsets.truncate(position);
            segment.file.set_len(segment.len)?;
            segment.file.sync_all()?;
        }
        Ok(())
    }

    /// True when purging up to `index` would delete a segment file: the caller must make the
    /// purge durable first, or a crash could leave the log starting after a gap.
    pub fn purge_deletes_files(&self, index: u64) -> bool {
        self.lock().front().is_some_and(|s| s.end() <= index.saturating_add(1))
    }

    /// Deletes the segments whose every record is at or below `index`, oldest first, each
    /// deletion made durable before the next: a crash leaves the log starting later, never
    /// with a hole. Once per segment (64 MiB), so the directory fsyncs cost nothing to speak of.
    pub fn purge(&self, index: u64) -> Result<(), StoreError> {
        let mut segments = self.lock();
        self.unpurged_from.fetch_max(index.saturating_add(1), Ordering::AcqRel);
        while segments.front().is_some_and(|s| s.end() <= index.saturating_add(1)) {
            if let Some(segment) = segments.pop_front() {
                fs::remove_file(&segment.path)?;
                sync_dir(&self.dir)?;
            }
        }
        Ok(())
    }
}

/// Reads a segment's records, building its offsets. A bad or torn record ends the newest
/// segment (the file is cut there); in any other it is corruption.
fn scan(first: u64, path: PathBuf, newest: bool) -> Result<Segment, StoreError> {
    let file = OpenOptions::new().read(true).write(true).open(&path)?;
    let file_len = file.metadata()?.len();
    // Sequential reads through one buffer: a restart scans every record of the log.
    let mut reader = BufReader::with_capacity(SCAN_BUFFER_BYTES, &file);
    let mut offsets = Vec::new();
    let mut at = 0u64;
    let mut header = [0u8; HEADER_BYTES as usize];
    let mut payload = Vec::new();
    while at + HEADER_BYTES <= file_len {
        reader.read_exact(&mut header)?;
        let size = u32::from_le_bytes(header[..4].try_into().unwrap_or_default()) as u64;
        let crc = u32::from_le_bytes(header[4..].try_into().unwrap_or_default());
        let fits = size > 0 && size as usize <= LOG_RECORD_BYTES_MAX && at + HEADER_BYTES + size <= file_len;
        let intact = fits && {
            payload.resize(size as usize, 0);
            reader.read_exact(&mut payload)?;
            crc32fast::hash(&payload) == crc
        };
        if !intact {
            break;
        }
        offsets.push(at);
        at += HEADER_BYTES + size;
    }
    if at < file_len {
        if !newest {
            return Err(StoreError::Corrupt(format!("log segment {} has a bad record at byte {at}", path.display())));
        }
        tracing::warn!(segment = %path.display(), at, dropped = file_len - at, "cut a torn record off the log");
        file.set_len(at)?;
        file.sync_all()?;
    }
    Ok(Segment { first, path, file: Arc::new(file), offsets, len: at })
}

fn checked_payload<'a>(record: &'a [u8], segment: &Segment, position: usize) -> Result<&'a [u8], StoreError> {
    let corrupt = || {
        StoreError::Corrupt(format!(
            "log entry {} in {} fails its checksum",
            segment.first + position as u64,
            segment.path.display()
        ))
    };
    let (header, payload) = record.split_at_checked(HEADER_BYTES as usize).ok_or_else(corrupt)?;
    let crc = u32::from_le_bytes(header[4..].try_into().map_err(|_| corrupt())?);
    if crc32fast::hash(payload) != crc {
        return Err(corrupt());
    }
    Ok(payload)
}

/// Makes the directory's entries (files created or deleted) durable.
fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)?.sync_all()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(range: std::ops::Range<u64>, size: usize) -> Vec<Vec<u8>> {
        range.map(|i| vec![(i % 251) as u8; size]).collect()
    }

    fn framed(payloads: Vec<Vec<u8>>) -> Vec<Record> {
        payloads.iter().map(|p| Record::of_payload(p).unwrap()).collect()
    }

    #[test]
    fn appended_records_read_back_across_segments_and_after_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let log = SegmentLog::open(dir.path()).unwrap();
        // Records of a fifth of a segment: the log spans several files.
        let size = (LOG_SEGMENT_BYTES_MAX / 5) as usize;
        log.append(1, &framed(records(1..13, size))).unwrap();
        log.sync().unwrap();
        assert!(fs::read_dir(dir.path()).unwrap().count() >= 2);
        assert_eq!(log.read(1, 13, usize::MAX).unwrap(), records(1..13, size));
        drop(log);
        let log = SegmentLog::open(dir.path()).unwrap();
        assert_eq!((log.first_index(), log.end_index()), (Some(1), Some(13)));
        assert_eq!(log.read(4, 9, usize::MAX).unwrap(), records(4..9, size));
        // Bounded reads stop before the record that would pass the bound, but always return one.
        assert_eq!(log.read(4, 9, size + 100).unwrap().len(), 1);
        assert_eq!(log.read(4, 9, 1).unwrap().len(), 1);
        assert_eq!(log.read(13, 20, usize::MAX).unwrap().len(), 0);
        // A range starting before the first record reads from the first record.
        assert_eq!(log.read(0, 3, usize::MAX).unwrap(), records(1..3, size));
    }

    #[test]
    fn a_torn_tail_is_cut_and_appends_go_on_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let log = SegmentLog::open(dir.path()).unwrap();
        log.append(5, &framed(records(5..10, 100))).unwrap();
        drop(log);
        let path = dir.path().join(format!("{:020}{SUFFIX}", 5));
        let len = fs::metadata(&path).unwrap().len();
        // Half of the last record reached the disk; then garbage in a second try.
        OpenOptions::new().write(true).open(&path).unwrap().set_len(len - 50).unwrap();
        let log = SegmentLog::open(dir.path()).unwrap();
        assert_eq!(log.end_index(), Some(9));
        log.append(9, &framed(records(9..11, 100))).unwrap();
        drop(log);
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all_at(&[0xAB; 20], fs::metadata(&path).unwrap().len() - 20).unwrap();
        let log = SegmentLog::open(dir.path()).unwrap();
        assert_eq!(log.end_index(), Some(10));
        assert_eq!(log.read(5, 10, usize::MAX).unwrap(), records(5..10, 100));
    }

    #[test]
    fn a_crash_at_any_byte_of_the_last_record_keeps_every_record_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(format!("{:020}{SUFFIX}", 1));
        let log = SegmentLog::open(dir.path()).unwrap();
        log.append(1, &framed(records(1..4, 40))).unwrap();
        drop(log);
        let whole = fs::read(&path).unwrap();
        let last_starts = whole.len() - (HEADER_BYTES as usize + 40);
        for cut in last_starts..whole.len() {
            fs::write(&path, &whole[..cut]).unwrap();
            let log = SegmentLog::open(dir.path()).unwrap();
            assert_eq!(log.end_index(), Some(3), "cut at byte {cut}");
            assert_eq!(fs::metadata(&path).unwrap().len(), last_starts as u64, "the torn bytes are gone");
            log.append(3, &framed(records(3..4, 40))).unwrap();
            assert_eq!(log.read(1, 4, usize::MAX).unwrap(), records(1..4, 40));
        }
    }

    #[test]
    fn a_bad_record_in_an_older_segment_refuses_the_open() {
        let dir = tempfile::tempdir().unwrap();
        let log = SegmentLog::open(dir.path()).unwrap();
        let size = (LOG_SEGMENT_BYTES_MAX / 2) as usize;
        log.append(1, &framed(records(1..5, size))).unwrap();
        drop(log);
        let oldest = dir.path().join(format!("{:020}{SUFFIX}", 1));
        OpenOptions::new().write(true).open(&oldest).unwrap().write_all_at(&[0u8; 16], 100).unwrap();
        assert!(matches!(SegmentLog::open(dir.path()), Err(StoreError::Corrupt(_))));
    }

    #[test]
    fn truncation_removes_the_tail_for_good_and_purge_drops_whole_segments() {
        let dir = tempfile::tempdir().unwrap();
        let log = SegmentLog::open(dir.path()).unwrap();
        let size = (LOG_SEGMENT_BYTES_MAX / 3) as usize;
        log.append(1, &framed(records(1..11, size))).unwrap();
        let files = || fs::read_dir(dir.path()).unwrap().count();
        let before = files();
        log.truncate(6).unwrap();
        assert_eq!(log.end_index(), Some(6));
        assert!(files() < before);
        // Different records at the same indexes replace the cut ones.
        log.append(6, &framed(records(100..103, 10))).unwrap();
        drop(log);
        let log = SegmentLog::open(dir.path()).unwrap();
        assert_eq!(log.read(6, 9, usize::MAX).unwrap(), records(100..103, 10));

        assert!(!log.purge_deletes_files(1));
        log.purge(1).unwrap();
        assert_eq!(log.first_index(), Some(1), "a segment goes only when all of it is purged");
        assert_eq!(log.read(0, 3, usize::MAX).unwrap(), records(2..3, size), "but purged records are not read");
        assert!(log.purge_deletes_files(4));
        log.purge(4).unwrap();
        assert!(log.first_index().unwrap() > 1);
        assert_eq!(log.read(8, 9, usize::MAX).unwrap(), records(102..103, 10));
        // Purging past the end empties the log; the next append starts a new segment anywhere.
        log.purge(20).unwrap();
        assert_eq!((log.first_index(), log.end_index()), (None, None));
        log.append(21, &framed(records(21..22, 10))).unwrap();
        drop(log);
        let log = SegmentLog::open(dir.path()).unwrap();
        assert_eq!((log.first_index(), log.end_index()), (Some(21), Some(22)));
    }

    #[test]
    fn an_append_past_the_end_leaves_a_gap_that_reads_skip() {
        let dir = tempfile::tempdir().unwrap();
        let log = SegmentLog::open(dir.path()).unwrap();
        log.append(1, &framed(records(1..3, 10))).unwrap();
        log.append(5, &framed(records(5..7, 10))).unwrap();
        assert!(matches!(log.append(6, &framed(records(6..7, 10))), Err(StoreError::Corrupt(_))));
        drop(log);
        let log = SegmentLog::open(dir.path()).unwrap();
        let mut expected = records(1..3, 10);
        expected.extend(records(5..7, 10));
        assert_eq!(log.read(0, 10, usize::MAX).unwrap(), expected);
        assert_eq!(log.read(3, 6, usize::MAX).unwrap(), records(5..6, 10));
    }

    #[test]
    fn truncating_at_a_segment_start_deletes_that_segment() {
        let dir = tempfile::tempdir().unwrap();
        let log = SegmentLog::open(dir.path()).unwrap();
        log.append(3, &framed(records(3..6, 10))).unwrap();
        log.truncate(3).unwrap();
        assert_eq!(log.end_index(), None);
        log.append(3, &framed(records(50..52, 10))).unwrap();
        assert_eq!(log.read(3, 5, usize::MAX).unwrap(), records(50..52, 10));
    }
}
