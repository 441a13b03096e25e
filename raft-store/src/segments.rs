//! The Raft log's bytes, in append-only segment files.
//!
//! Each entry is written once, as one record, to the newest segment and fsynced there; it is
//! never copied again (no memtable flush, no compaction). A segment is named by the index of
//! its first record (`00000000000000000001.log`) and holds the entries after it in order, so
//! the log is the segments in name order. Purging deletes whole segments once every entry in
//! them is purged; truncating cuts the segment holding the first removed entry and deletes
//! the ones after it.
//!
//! A segment starts with a header, `[magic 8 bytes][salt u32 LE][0u32]`, then its records:
//! `[payload length u32 LE][CRC-32 of the payload XOR the salt, u32 LE][payload]`. (Segments
//! of builds before the header have no header and a salt of 0.) After a crash the newest
//! segment may end in a torn record (written, never fsynced, so never reported durable):
//! opening cuts the segment there. A bad record anywhere else is corruption and refuses the
//! open.
//!
//! Preallocation. Appending past a file's end makes every `fdatasync` also commit the new
//! size to the file system's journal; overwriting bytes already on disk does not, and took
//! half the time here (docs/STORAGE.md). So, with preallocation on, a background thread keeps
//! one spare segment ready: a purged segment recycled, or else a new file of zeros, made
//! durable before it is used. A new segment is the spare renamed, and records overwrite what
//! is in it. Its fresh salt is what keeps the old records in a recycled file, or the zeros,
//! from ever reading as records. A segment is cut to its records' length before the next one
//! starts, so only the newest segment has bytes past its last record.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::limits::{LOG_RECORD_BYTES_MAX, LOG_SEGMENT_BYTES_MAX};
use crate::StoreError;

const HEADER_BYTES: u64 = 8;
const SUFFIX: &str = ".log";
/// First bytes of a segment with a header. Read as a record length it is far above
/// [`LOG_RECORD_BYTES_MAX`], so a segment of the older, headerless format never starts so.
const MAGIC: [u8; 8] = *b"PSRLOG\x00\x02";
const SEGMENT_HEADER_BYTES: u64 = 16;
/// Read buffer for scanning a segment when the log opens.
const SCAN_BUFFER_BYTES: usize = 1 << 20;
/// Suffix of spare segments (prepared, or purged and waiting to be): each has a name of its
/// own, so the one being prepared is never the one being taken.
const SPARE_SUFFIX: &str = ".spare";
/// Zeros written per call while preparing a spare: one page. The page cache keeps a write's
/// pages as one folio, and a later small write dirties the whole folio, so zeros written a
/// megabyte at a time made every `fdatasync` of a 300-byte record write 1 MiB (measured:
/// 2.1 GB written for 0.6 MB of records; 8.8 MB with pages of zeros, as when appending).
const ZERO_FILL_CHUNK_BYTES: usize = 4096;
/// Zero-fill writes between two looks at the stop flag, each followed by an `fdatasync` (1 MiB):
/// flushing 64 MiB at once held the log's own fsyncs behind it for tens of milliseconds.
const ZERO_FILL_CHUNKS_PER_FLUSH: u64 = 256;
/// A segment whose records average more than this does not ask for a spare to follow it.
/// Overwriting saves a fixed ~0.1 ms per `fdatasync` (docs/STORAGE.md), while writing the
/// spare's zeros costs a second write of every byte: worth it for per-message entries (some
/// 20 KB at 64 in flight), not for batches (1 MiB entries, each fsync long anyway; measured:
/// the same rate, 75 % more bytes written and a higher p99).
const SPARE_WORTH_RECORD_BYTES_MAX: u64 = 64 * 1024;
/// Free disk below which no spare is written or kept: a spare must never be what fills the
/// disk that the log, RocksDB and snapshots need.
const SPARE_FREE_BYTES_MIN: u64 = 4 * LOG_SEGMENT_BYTES_MAX;
/// How long the preparer waits before trying again after failing (a full disk, say).
const SPARE_RETRY_AFTER: Duration = Duration::from_secs(60);

/// One record, framed as it goes to disk: header and payload in one buffer, so appending
/// writes it as it is, with no copy.
pub struct Record {
    bytes: Vec<u8>,
    /// CRC-32 of the payload; the header gets it XOR the salt of the segment it goes to.
    crc: u32,
}

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
        let payload = &bytes[HEADER_BYTES as usize..];
        if payload.len() > LOG_RECORD_BYTES_MAX {
            return Err(StoreError::Corrupt(format!("a log entry of {} bytes", payload.len())));
        }
        let crc = crc32fast::hash(payload);
        let len = payload.len() as u32;
        bytes[..4].copy_from_slice(&len.to_le_bytes());
        Ok(Self { bytes, crc })
    }

    /// Bytes of the payload (the encoded entry).
    pub fn payload_len(&self) -> usize {
        self.bytes.len() - HEADER_BYTES as usize
    }

    /// The record's bytes for a segment with `salt`.
    fn salted(&mut self, salt: u32) -> &[u8] {
        self.bytes[4..8].copy_from_slice(&(self.crc ^ salt).to_le_bytes());
        &self.bytes
    }
}

/// One segment file and where each of its records starts.
struct Segment {
    /// Index of the first record.
    first: u64,
    path: PathBuf,
    file: Arc<File>,
    /// XORed into each record's checksum (0 for a headerless segment).
    salt: u32,
    /// Byte offset of each record, in index order.
    offsets: Vec<u64>,
    /// Bytes of the header and the valid records (where the next record goes).
    len: u64,
    /// Whether the file goes on past `len` with bytes already on disk (a spare), so appends
    /// overwrite rather than grow it.
    preallocated: bool,
}

impl Segment {
    /// One past the index of the last record.
    fn end(&self) -> u64 {
        self.first + self.offsets.len() as u64
    }

    fn record_end(&self, position: usize) -> u64 {
        self.offsets.get(position + 1).copied().unwrap_or(self.len)
    }

    /// Makes the records durable and cuts the file after them, before a newer segment starts:
    /// only the newest segment may have bytes past its last record.
    /// Also cuts bytes a failed write may have left past `len`.
    fn seal(&mut self) -> io::Result<()> {
        if self.preallocated || self.file.metadata()?.len() != self.len {
            self.file.set_len(self.len)?;
            self.file.sync_all()?;
            self.preallocated = false;
        } else {
            self.file.sync_data()?;
        }
        Ok(())
    }
}

/// The log's segment files. Every method takes `&self`; one lock orders them.
pub struct SegmentLog {
    dir: PathBuf,
    segments: Mutex<VecDeque<Segment>>,
    /// One past the last purged index: records below it may still be held (segments go
    /// whole) but are never read.
    unpurged_from: AtomicU64,
    /// The spare segment and the thread preparing it; `None` without preallocation.
    spares: Option<Spares>,
    /// The first failed fsync. Nothing is appended or reported durable after it: Linux may
    /// drop the pages a failed fsync covered and report success on the next one, which would
    /// acknowledge writes that are lost. The node stops on the error and must be restarted.
    sync_failed: OnceLock<String>,
    /// Held across every fsync of a segment file (see [`SegmentLog::fsync`]).
    syncing: Mutex<()>,
}

impl SegmentLog {
    /// Opens (or creates) the segments in `dir`, cutting a torn record off the newest one.
    /// With `preallocate`, a background thread keeps a spare segment ready (module docs).
    pub fn open(dir: &Path, preallocate: bool) -> Result<Self, StoreError> {
        create_dir_durably(dir)?;
        let mut names = Vec::new();
        for item in fs::read_dir(dir)? {
            let path = item?.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else { continue };
            if name.ends_with(SPARE_SUFFIX) {
                // Left by a crash, maybe half prepared: made again from scratch.
                fs::remove_file(&path)?;
            } else if let Some(first) = name.strip_suffix(SUFFIX).and_then(|n| n.parse::<u64>().ok()) {
                names.push((first, path));
            }
        }
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
        // A process killed between a rename or removal here and its directory fsync left a
        // change this open sees but the disk may not hold: made durable before any append
        // builds on it (a truncated segment coming back after a power cut would refuse the
        // next open; a renamed spare going back to a spare would lose its entries).
        sync_dir(dir)?;
        let spares = if preallocate { Some(Spares::start(dir)?) } else { None };
        Ok(Self {
            dir: dir.to_path_buf(),
            segments: Mutex::new(segments),
            unpurged_from: AtomicU64::new(0),
            spares,
            sync_failed: OnceLock::new(),
            syncing: Mutex::new(()),
        })
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

    /// Bytes of all segments' headers and records.
    pub fn bytes(&self) -> u64 {
        self.lock().iter().map(|s| s.len).sum()
    }

    /// Writes `records` (the entries `first`, `first + 1`, ...) after the last one, without
    /// fsync: [`SegmentLog::sync`] makes them durable. `first` must be past the last record.
    pub fn append(&self, first: u64, records: Vec<Record>) -> Result<(), StoreError> {
        self.refuse_after_failed_sync()?;
        let mut segments = self.lock();
        for (next, mut record) in (first..).zip(records) {
            let active = match segments.back() {
                Some(s) if next < s.end() => {
                    return Err(StoreError::Corrupt(format!("append at {next} before log end {}", s.end())));
                }
                Some(s) if next == s.end() && s.len < LOG_SEGMENT_BYTES_MAX && !self.should_move_to_spare(s) => {
                    segments.len() - 1
                }
                _ => {
                    // The segment before is sealed first, so only the newest segment ever
                    // holds records that are not durable. An append past the end (never from
                    // Raft, but openraft's storage suite does it) starts a segment at its
                    // index, leaving the gap a range read skips.
                    if segments.back().is_some_and(|s| s.end() == s.first) {
                        // Empty (a restart found only its header): the new one may take its name.
                        if let Some(empty) = segments.pop_back() {
                            fs::remove_file(&empty.path)?;
                        }
                    } else if let Some(full) = segments.back_mut() {
                        self.fsync(|| full.seal())?;
                    }
                    segments.push_back(self.create(next)?);
                    segments.len() - 1
                }
            };
            let segment = &mut segments[active];
            let bytes = record.salted(segment.salt);
            segment.file.write_all_at(bytes, segment.len)?;
            segment.offsets.push(segment.len);
            let half = LOG_SEGMENT_BYTES_MAX / 2;
            let crosses_half = segment.len < half && segment.len + bytes.len() as u64 >= half;
            segment.len += bytes.len() as u64;
            if crosses_half && segment.len / segment.offsets.len() as u64 <= SPARE_WORTH_RECORD_BYTES_MAX {
                if let Some(spares) = &self.spares {
                    spares.want();
                }
            }
        }
        Ok(())
    }

    /// A segment that grows its file (one started with no spare ready, or reopened) gives way
    /// to the spare as soon as one is ready: its fsyncs cost more.
    fn should_move_to_spare(&self, segment: &Segment) -> bool {
        !segment.preallocated && self.spares.as_ref().is_some_and(Spares::is_ready)
    }

    /// Starts the segment of `first`: the spare if one is ready, else a new, empty file.
    fn create(&self, first: u64) -> Result<Segment, StoreError> {
        let path = file_path(&self.dir, first, SUFFIX);
        let spare = match &self.spares {
            Some(spares) => spares.take_as(&path)?,
            None => None,
        };
        let opened = match spare {
            Some(spare) => Ok((spare.file, spare.salt, true)),
            None => new_segment_file(&path).map(|(file, salt)| (file, salt, false)),
        };
        // A file left under the name would start a segment the log does not know of.
        let (file, salt, preallocated) =
            opened.and_then(|opened| self.sync_dir().map(|()| opened)).inspect_err(|_| {
                let _ = fs::remove_file(&path);
            })?;
        Ok(Segment {
            first,
            path,
            file: Arc::new(file),
            salt,
            offsets: Vec::new(),
            len: SEGMENT_HEADER_BYTES,
            preallocated,
        })
    }

    /// Makes every record appended so far durable. The lock is held only to pick the file:
    /// appends go on while the disk works.
    pub fn sync(&self) -> Result<(), StoreError> {
        self.refuse_after_failed_sync()?;
        let newest = self.lock().back().map(|s| s.file.clone());
        match newest {
            Some(file) => self.fsync(|| file.sync_data()),
            None => Ok(()),
        }
    }

    /// Runs `sync`, an fsync of a segment file, one at a time and never after one failed.
    /// Linux reports a failed writeback to only one of the fsyncs of a file that check for
    /// it: a seal and the syncer's fsync running at once on the newest segment could each see
    /// success for records one of them lost. Taken with or without the segments lock held,
    /// never the other way round.
    fn fsync(&self, sync: impl FnOnce() -> io::Result<()>) -> Result<(), StoreError> {
        let _turn = self.syncing.lock().unwrap_or_else(|e| e.into_inner());
        self.refuse_after_failed_sync()?;
        sync().map_err(|e| self.sync_failed(e))
    }

    /// Makes the log directory's entries durable (a segment created, renamed or deleted), as
    /// [`SegmentLog::fsync`] does a segment's records: a failure is latched likewise, since a
    /// retried directory fsync can succeed with the entry it failed to write lost.
    fn sync_dir(&self) -> Result<(), StoreError> {
        let dir = File::open(&self.dir)?;
        self.fsync(|| dir.sync_all())
    }

    fn refuse_after_failed_sync(&self) -> Result<(), StoreError> {
        match self.sync_failed.get() {
            Some(error) => Err(StoreError::SyncFailed(error.clone())),
            None => Ok(()),
        }
    }

    /// Latches the first failed fsync (see `sync_failed`).
    fn sync_failed(&self, error: io::Error) -> StoreError {
        let message = self.sync_failed.get_or_init(|| error.to_string());
        tracing::error!(error = %message, "fsync of the Raft log failed: refusing every later write");
        StoreError::SyncFailed(message.clone())
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
        // Nothing on disk changes after a failed fsync: the next start reads what is there.
        self.refuse_after_failed_sync()?;
        let mut segments = self.lock();
        // Newest first, each deletion made durable before the next: a crash leaves the log
        // shorter, never with a hole. Forgotten only once deleted, so a failed deletion leaves
        // the segment known.
        while let Some(path) = segments.back().filter(|s| s.first >= index).map(|s| s.path.clone()) {
            fs::remove_file(&path)?;
            segments.pop_back();
            self.sync_dir()?;
        }
        if let Some(segment) = segments.back_mut().filter(|s| s.end() > index) {
            let position = (index - segment.first) as usize;
            // Cut, not just forgotten: the removed records carry this segment's salt, and one
            // right after a shorter new record would read as valid after a crash. On disk
            // first, so a failed cut leaves the records known.
            segment.file.set_len(segment.offsets[position])?;
            self.fsync(|| segment.file.sync_all())?;
            segment.len = segment.offsets[position];
            segment.offsets.truncate(position);
            segment.preallocated = false;
        }
        Ok(())
    }

    /// True when the caller must make a purge up to `index` durable before it runs, or a crash
    /// could leave the log starting after a gap: when the purge deletes a segment file, and
    /// when the log holds no record after `index` (an empty log, as after a snapshot install),
    /// since the next append then starts a segment at `index + 1`.
    pub fn purge_must_be_durable(&self, index: u64) -> bool {
        self.lock().front().is_none_or(|s| s.end() <= index.saturating_add(1))
    }

    /// Deletes the segments whose every record is at or below `index`, oldest first, each
    /// deletion made durable before the next: a crash leaves the log starting later, never
    /// with a hole. Once per segment (64 MiB), so the directory fsyncs cost nothing to speak of.
    /// A full segment may become the next spare instead of being deleted.
    pub fn purge(&self, index: u64) -> Result<(), StoreError> {
        self.refuse_after_failed_sync()?;
        let mut segments = self.lock();
        self.unpurged_from.fetch_max(index.saturating_add(1), Ordering::AcqRel);
        while segments.front().is_some_and(|s| s.end() <= index.saturating_add(1)) {
            if let Some(segment) = segments.pop_front() {
                // Kept only with room to spare: a full disk frees what purge deletes.
                let recycler = self.spares.as_ref().filter(|s| {
                    segment.len >= LOG_SEGMENT_BYTES_MAX && s.wants_recycled() && disk_has_room_for_spares(&self.dir)
                });
                match recycler {
                    Some(spares) => {
                        // The newest segment was never sealed: cut what lies past its records
                        // (older records, of another salt) before it is used again.
                        let mut segment = segment;
                        self.fsync(|| segment.seal())?;
                        let recycled = file_path(&self.dir, segment.first, SPARE_SUFFIX);
                        fs::rename(&segment.path, &recycled)?;
                        self.sync_dir()?;
                        spares.recycle(recycled);
                    }
                    None => {
                        fs::remove_file(&segment.path)?;
                        self.sync_dir()?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Waits until a spare segment is ready (tests: preparing one takes a moment).
    #[cfg(test)]
    pub fn wait_for_spare(&self) {
        if let Some(spares) = &self.spares {
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            let mut state = spares.shared.lock();
            while state.ready.is_none() {
                let left = deadline.checked_duration_since(std::time::Instant::now()).expect("no spare within 60 s");
                state = spares.shared.wake.wait_timeout(state, left).unwrap_or_else(|e| e.into_inner()).0;
            }
        }
    }
}

/// A segment file prepared for use: its header (with a fresh salt) is durable, and every
/// byte after it is already on disk.
struct Spare {
    path: PathBuf,
    file: File,
    salt: u32,
}

/// The spare segment, and the thread that prepares the next one when it is wanted.
struct Spares {
    shared: Arc<SpareShared>,
    thread: Option<JoinHandle<()>>,
}

struct SpareShared {
    state: Mutex<SpareState>,
    /// Signalled when a spare is wanted, a purged segment arrives, or the log closes (for the
    /// preparer), and when a spare becomes ready (for tests).
    wake: Condvar,
    /// Whether `state.ready` holds a spare, read without the lock on every append.
    ready: AtomicBool,
}

struct SpareState {
    ready: Option<Spare>,
    /// Whether a spare is wanted: at start, and once the newest segment is half full, if its
    /// records are small ([`SPARE_WORTH_RECORD_BYTES_MAX`]). Not sooner, so a log that stays
    /// small never has more than one spare written.
    wanted: bool,
    /// A purged segment to prepare instead of writing a new file of zeros.
    recycled: Option<PathBuf>,
    stop: bool,
}

impl SpareShared {
    fn lock(&self) -> MutexGuard<'_, SpareState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Spares {
    fn start(dir: &Path) -> Result<Self, StoreError> {
        let shared = Arc::new(SpareShared {
            state: Mutex::new(SpareState { ready: None, wanted: true, recycled: None, stop: false }),
            wake: Condvar::new(),
            ready: AtomicBool::new(false),
        });
        let (thread_shared, dir) = (shared.clone(), dir.to_path_buf());
        let thread =
            std::thread::Builder::new().name("log-spare".into()).spawn(move || run_preparer(&dir, &thread_shared))?;
        Ok(Self { shared, thread: Some(thread) })
    }

    fn is_ready(&self) -> bool {
        self.shared.ready.load(Ordering::Acquire)
    }

    /// The ready spare, if any, renamed to `path`; the preparer starts on the next one.
    fn take_as(&self, path: &Path) -> Result<Option<Spare>, StoreError> {
        let mut state = self.shared.lock();
        let Some(spare) = state.ready.take() else { return Ok(None) };
        if let Err(e) = fs::rename(&spare.path, path) {
            state.ready = Some(spare);
            return Err(e.into());
        }
        state.wanted = false;
        self.shared.ready.store(false, Ordering::Release);
        Ok(Some(spare))
    }

    /// Asks for the next spare.
    fn want(&self) {
        self.shared.lock().wanted = true;
        self.shared.wake.notify_all();
    }

    fn wants_recycled(&self) -> bool {
        self.shared.lock().recycled.is_none()
    }

    fn recycle(&self, path: PathBuf) {
        self.shared.lock().recycled = Some(path);
        self.shared.wake.notify_all();
    }
}

impl Drop for Spares {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.wake.notify_all();
        if let Some(thread) = self.thread.take() {
            // Quick: the preparer checks `stop` between chunks. It must be gone before the
            // directory is opened again, or it could write a spare a new log also writes.
            let _ = thread.join();
        }
    }
}

fn run_preparer(dir: &Path, shared: &SpareShared) {
    loop {
        let recycled = {
            let mut state = shared.lock();
            // A recycled segment costs no zeros: it is prepared whether wanted or not.
            while !state.stop && (state.ready.is_some() || (!state.wanted && state.recycled.is_none())) {
                state = shared.wake.wait(state).unwrap_or_else(|e| e.into_inner());
            }
            if state.stop {
                return;
            }
            state.recycled.take()
        };
        let kind = if recycled.is_some() { "recycled" } else { "zero-filled" };
        match prepare_spare(dir, recycled, shared) {
            Ok(Some(spare)) => {
                tracing::debug!(kind, "log spare segment ready");
                shared.lock().ready = Some(spare);
                shared.ready.store(true, Ordering::Release);
                shared.wake.notify_all();
            }
            Ok(None) => return,
            Err(e) => {
                // The log goes on without: new segments grow their files until a spare is ready.
                tracing::warn!(error = %e, kind, "could not prepare a spare log segment; retrying later");
                let state = shared.lock();
                if state.stop {
                    return;
                }
                let _ = shared.wake.wait_timeout(state, SPARE_RETRY_AFTER);
            }
        }
    }
}

/// Prepares the spare: a recycled segment gets a new salt, else a new file is filled with
/// zeros. Durable before it returns. `None` when the log closed meanwhile. A failed spare's
/// file is deleted.
fn prepare_spare(dir: &Path, recycled: Option<PathBuf>, shared: &SpareShared) -> Result<Option<Spare>, StoreError> {
    let (path, result) = match recycled {
        Some(path) => {
            let result = resalt(&path).map(Some);
            (path, result)
        }
        None => {
            let salt = new_salt(0);
            let path = dir.join(format!("new-{salt:08x}{SPARE_SUFFIX}"));
            let result = zero_fill(&path, salt, shared).map(|file| file.map(|file| (file, salt)));
            (path, result)
        }
    };
    if !matches!(result, Ok(Some(_))) {
        let _ = fs::remove_file(&path);
    }
    Ok(result?.map(|(file, salt)| Spare { path, file, salt }))
}

/// Gives a purged segment a new salt, so none of its records reads as valid again.
fn resalt(path: &Path) -> Result<(File, u32), StoreError> {
    let file = OpenOptions::new().read(true).write(true).open(path)?;
    let mut old = [0u8; SEGMENT_HEADER_BYTES as usize];
    file.read_exact_at(&mut old, 0)?;
    let salt = new_salt(salt_of(&old).unwrap_or(0));
    file.write_all_at(&segment_header(salt), 0)?;
    file.sync_data()?;
    drop_cached_pages(&file);
    Ok((file, salt))
}

/// Writes a new segment file of `salt`, zeros after its header. `None` when the log closed
/// meanwhile.
fn zero_fill(path: &Path, salt: u32, shared: &SpareShared) -> Result<Option<File>, StoreError> {
    if !disk_has_room_for_spares(path.parent().unwrap_or(path)) {
        return Err(StoreError::Io(std::io::Error::new(
            std::io::ErrorKind::StorageFull,
            "too little free disk for a spare log segment",
        )));
    }
    let file = OpenOptions::new().read(true).write(true).create_new(true).open(path)?;
    let zeros = vec![0u8; ZERO_FILL_CHUNK_BYTES];
    // Whole pages from byte 0, the header written over the first after.
    let mut at = 0;
    while at < LOG_SEGMENT_BYTES_MAX {
        if (at / ZERO_FILL_CHUNK_BYTES as u64).is_multiple_of(ZERO_FILL_CHUNKS_PER_FLUSH) {
            if shared.lock().stop {
                return Ok(None);
            }
            file.sync_data()?;
        }
        let chunk = (LOG_SEGMENT_BYTES_MAX - at).min(ZERO_FILL_CHUNK_BYTES as u64) as usize;
        file.write_all_at(&zeros[..chunk], at)?;
        at += chunk as u64;
    }
    file.write_all_at(&segment_header(salt), 0)?;
    file.sync_all()?;
    Ok(Some(file))
}

/// Drops a file's clean pages from the page cache. For a recycled segment: they were written
/// by whole entries (up to a megabyte at once), so they may be large folios that small records
/// would dirty whole (see [`ZERO_FILL_CHUNK_BYTES`]); records then read each page in once as
/// they overwrite it. For the newest segment at start: see [`scan`]. Only advice, which
/// Linux follows for clean pages that nothing maps.
fn drop_cached_pages(file: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: posix_fadvise reads no memory of ours; the descriptor is open for the call.
    let failed = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if failed != 0 {
        tracing::debug!(errno = failed, "posix_fadvise(DONTNEED) on a log segment failed");
    }
}

/// The salt of a segment header, or `None` for a headerless segment.
fn salt_of(header: &[u8; SEGMENT_HEADER_BYTES as usize]) -> Option<u32> {
    (header[..8] == MAGIC).then(|| u32::from_le_bytes([header[8], header[9], header[10], header[11]]))
}

/// A new, empty segment file with a header of a fresh salt, durable.
fn new_segment_file(path: &Path) -> Result<(File, u32), StoreError> {
    let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(path)?;
    let salt = new_salt(0);
    file.write_all_at(&segment_header(salt), 0)?;
    file.sync_all()?;
    Ok((file, salt))
}

/// Whether the file system holding `dir` has room for spares: [`SPARE_FREE_BYTES_MIN`] free
/// for the log's own growth and everything else on the disk. Unknown counts as no.
fn disk_has_room_for_spares(dir: &Path) -> bool {
    available_bytes(dir).is_some_and(|bytes| bytes >= SPARE_FREE_BYTES_MIN)
}

/// Bytes an unprivileged writer may still use on the file system holding `path` (`statvfs`:
/// free blocks not reserved for root); `None` when it cannot be asked.
pub fn available_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: `path` is a valid C string and `stats` a zeroed struct statvfs the call fills.
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    let asked = unsafe { libc::statvfs(path.as_ptr(), &mut stats) } == 0;
    asked.then(|| (stats.f_bavail as u64).saturating_mul(stats.f_frsize as u64))
}

/// The file in `dir` of the segment starting at `first`, with `suffix`: name order is log order.
fn file_path(dir: &Path, first: u64, suffix: &str) -> PathBuf {
    dir.join(format!("{first:020}{suffix}"))
}

/// A random salt, never 0 (the headerless format's) nor `old` (the recycled file's).
fn new_salt(old: u32) -> u32 {
    loop {
        let salt = rand::random::<u32>();
        if salt != 0 && salt != old {
            return salt;
        }
    }
}

fn segment_header(salt: u32) -> [u8; SEGMENT_HEADER_BYTES as usize] {
    let mut header = [0u8; SEGMENT_HEADER_BYTES as usize];
    header[..8].copy_from_slice(&MAGIC);
    header[8..12].copy_from_slice(&salt.to_le_bytes());
    header
}

/// Reads a segment's records, building its offsets. A bad or torn record ends the newest
/// segment (the file is cut there); in any other it is corruption.
fn scan(first: u64, path: PathBuf, newest: bool) -> Result<Segment, StoreError> {
    let file = OpenOptions::new().read(true).write(true).open(&path)?;
    if newest {
        // Records a killed process wrote but never fsynced survive in the page cache and would
        // be read back as the log: made durable before this node answers for them (a
        // follower's reply that it holds an entry counts towards its commit). And only the
        // newest segment can hold records whose fsync failed (a failed seal stops the log
        // before a newer one starts): their pages may still be cached, marked clean, holding
        // bytes the disk never got. Dropped after the write-back, so the scan reads the disk.
        file.sync_data()?;
        drop_cached_pages(&file);
    }
    let file_len = file.metadata()?.len();
    let mut start = [0u8; SEGMENT_HEADER_BYTES as usize];
    let salt = if file_len >= SEGMENT_HEADER_BYTES {
        file.read_exact_at(&mut start, 0)?;
        salt_of(&start)
    } else {
        None
    };
    // A headerless segment (earlier builds) has records from byte 0 and a salt of 0.
    let mut at = if salt.is_some() { SEGMENT_HEADER_BYTES } else { 0 };
    let salt = salt.unwrap_or(0);
    (&file).seek(SeekFrom::Start(at))?;
    // Sequential reads through one buffer: a restart scans every record of the log.
    let mut reader = BufReader::with_capacity(SCAN_BUFFER_BYTES, &file);
    let mut offsets = Vec::new();
    let mut header = [0u8; HEADER_BYTES as usize];
    let mut payload = Vec::new();
    let mut zeros_after = false;
    while at + HEADER_BYTES <= file_len {
        reader.read_exact(&mut header)?;
        let size = u32::from_le_bytes(header[..4].try_into().unwrap_or_default()) as u64;
        let crc = u32::from_le_bytes(header[4..].try_into().unwrap_or_default());
        let fits = size > 0 && size as usize <= LOG_RECORD_BYTES_MAX && at + HEADER_BYTES + size <= file_len;
        let intact = fits && {
            payload.resize(size as usize, 0);
            reader.read_exact(&mut payload)?;
            crc32fast::hash(&payload) ^ salt == crc
        };
        if !intact {
            zeros_after = header == [0u8; HEADER_BYTES as usize];
            break;
        }
        offsets.push(at);
        at += HEADER_BYTES + size;
    }
    if at < file_len {
        if !newest {
            return Err(StoreError::Corrupt(format!("log segment {} has a bad record at byte {at}", path.display())));
        }
        if zeros_after && salt != 0 {
            tracing::debug!(segment = %path.display(), at, "the log ends in a preallocated segment");
        } else {
            // A torn write, or (in a recycled segment) the records it held before.
            tracing::warn!(segment = %path.display(), at, dropped = file_len - at, "cut the bytes after the log's last intact record");
        }
        // Cut even when what follows is zeros: appends after a restart must not leave bytes
        // of a torn record behind them (see `truncate`).
        file.set_len(at)?;
        file.sync_all()?;
    }
    Ok(Segment { first, path, file: Arc::new(file), salt, offsets, len: at, preallocated: false })
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
    if crc32fast::hash(payload) ^ segment.salt != crc {
        return Err(corrupt());
    }
    Ok(payload)
}

/// Makes the directory's entries (files created, renamed or deleted) durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)?.sync_all()?;
    Ok(())
}

/// Creates `dir` if needed, with any missing parents, and makes its entry and theirs durable,
/// so files fsynced in it cannot vanish with them after a power cut on a node's first start.
pub(crate) fn create_dir_durably(dir: &Path) -> Result<(), StoreError> {
    let created: Vec<&Path> = dir.ancestors().take_while(|d| !d.as_os_str().is_empty() && !d.exists()).collect();
    fs::create_dir_all(dir)?;
    // The parent of each directory created, and of `dir` itself; a relative path's top
    // directory is an entry of the working directory.
    let mut parents: Vec<&Path> = std::iter::once(dir).chain(created).filter_map(Path::parent).collect();
    parents.dedup();
    for parent in parents {
        sync_dir(if parent.as_os_str().is_empty() { Path::new(".") } else { parent })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_dir_is_created_with_its_missing_parents() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a/b/c");
        create_dir_durably(&dir).unwrap();
        assert!(dir.is_dir());
        // Again, existing: nothing to create.
        create_dir_durably(&dir).unwrap();
    }

    fn records(range: std::ops::Range<u64>, size: usize) -> Vec<Vec<u8>> {
        range.map(|i| vec![(i % 251) as u8; size]).collect()
    }

    fn framed(payloads: Vec<Vec<u8>>) -> Vec<Record> {
        payloads.iter().map(|p| Record::of_payload(p).unwrap()).collect()
    }

    fn segment_path(dir: &Path, first: u64) -> PathBuf {
        file_path(dir, first, SUFFIX)
    }

    /// A log in a new directory, with preallocation, once its first spare is ready.
    fn log_with_a_spare() -> (tempfile::TempDir, SegmentLog) {
        let dir = tempfile::tempdir().unwrap();
        let log = SegmentLog::open(dir.path(), true).unwrap();
        log.wait_for_spare();
        (dir, log)
    }

    /// After a failed fsync the kernel may have dropped the dirty pages and cleared the error,
    /// so a later fsync that succeeds proves nothing: every later write, sync, truncation and
    /// purge is refused with the first error, and what was written before stays readable. The failure is
    /// injected where an fsync's error would arrive.
    #[test]
    fn a_failed_fsync_refuses_every_later_write_with_the_first_error() {
        let (_dir, log) = log_with_a_spare();
        log.append(1, framed(records(1..4, 10))).unwrap();
        log.sync().unwrap();
        let first = log.sync_failed(io::Error::other("injected: EIO"));
        assert!(matches!(&first, StoreError::SyncFailed(m) if m.contains("injected: EIO")), "{first:?}");
        log.sync_failed(io::Error::other("a later error"));
        let refused = [log.append(4, framed(records(4..5, 10))), log.sync(), log.truncate(2), log.purge(2)];
        for refused in refused {
            assert!(matches!(&refused, Err(StoreError::SyncFailed(m)) if m.contains("injected: EIO")), "{refused:?}");
        }
        assert_eq!(log.end_index(), Some(4), "nothing appended after the failure");
        assert_eq!(log.read(1, 4, usize::MAX).unwrap(), records(1..4, 10));
    }

    /// Fsyncs of the log's files run one at a time (Linux reports a failed writeback to only
    /// one of the fsyncs running), and none runs once one failed: the syncer's, a seal's or a
    /// truncation's alike go through [`SegmentLog::fsync`].
    #[test]
    fn fsyncs_never_overlap_and_none_runs_after_one_failed() {
        use std::sync::atomic::AtomicBool;
        let (_dir, log) = log_with_a_spare();
        let running = AtomicBool::new(false);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..5 {
                        log.fsync(|| {
                            assert!(!running.swap(true, Ordering::SeqCst), "two fsyncs at once");
                            // Room for another thread to come in, if it could.
                            std::thread::sleep(std::time::Duration::from_millis(2));
                            running.store(false, Ordering::SeqCst);
                            Ok(())
                        })
                        .unwrap();
                    }
                });
            }
        });
        let failed = log.fsync(|| Err(io::Error::other("injected: EIO")));
        assert!(matches!(&failed, Err(StoreError::SyncFailed(m)) if m.contains("injected")), "{failed:?}");
        let later = log.fsync(|| panic!("an fsync ran after one failed"));
        assert!(matches!(&later, Err(StoreError::SyncFailed(m)) if m.contains("injected")), "{later:?}");
        log.append(1, framed(records(1..3, 10))).unwrap_err();
    }

    #[test]
    fn a_preallocated_segment_is_overwritten_in_place_and_reopens_cut_to_its_records() {
        let (dir, log) = log_with_a_spare();
        log.append(1, framed(records(1..11, 100))).unwrap();
        log.sync().unwrap();
        let path = segment_path(dir.path(), 1);
        assert_eq!(fs::metadata(&path).unwrap().len(), LOG_SEGMENT_BYTES_MAX, "the spare, not grown");
        assert_eq!(log.read(1, 11, usize::MAX).unwrap(), records(1..11, 100));
        drop(log);
        let log = SegmentLog::open(dir.path(), false).unwrap();
        assert_eq!(log.end_index(), Some(11));
        assert_eq!(log.read(1, 11, usize::MAX).unwrap(), records(1..11, 100));
        assert_eq!(fs::metadata(&path).unwrap().len(), SEGMENT_HEADER_BYTES + 10 * (HEADER_BYTES + 100));
        assert!(!fs::read_dir(dir.path()).unwrap().any(|e| e
            .unwrap()
            .path()
            .to_string_lossy()
            .ends_with(SPARE_SUFFIX)));
    }

    #[test]
    fn a_recycled_segment_never_reads_back_its_old_records() {
        let (dir, log) = log_with_a_spare();
        // Records small enough for a segment to ask for a spare once half full.
        let size = (SPARE_WORTH_RECORD_BYTES_MAX / 2) as usize;
        let per_segment = (LOG_SEGMENT_BYTES_MAX - SEGMENT_HEADER_BYTES).div_ceil(HEADER_BYTES + size as u64);
        let (a, b, c) = (1, 1 + per_segment, 1 + 2 * per_segment);
        log.append(a, framed(records(a..b, size))).unwrap();
        log.wait_for_spare();
        // Segment a is full and wholly purged: it waits to become the spare after this one.
        log.purge(b - 1).unwrap();
        assert!(file_path(dir.path(), a, SPARE_SUFFIX).exists());
        log.append(b, framed(records(b..c, size))).unwrap();
        log.wait_for_spare();
        // Segment c is the recycled file: two short records over its old ones.
        log.append(c, framed(records(c..c + 2, 10))).unwrap();
        log.sync().unwrap();
        let path = segment_path(dir.path(), c);
        let recycled_len = SEGMENT_HEADER_BYTES + per_segment * (HEADER_BYTES + size as u64);
        assert_eq!(fs::metadata(&path).unwrap().len(), recycled_len, "segment c is the recycled file, not zeros");
        assert!(!file_path(dir.path(), a, SPARE_SUFFIX).exists());
        assert_eq!(log.read(c, c + 10, usize::MAX).unwrap(), records(c..c + 2, 10));
        // A crash now: the old records after the new ones must not come back.
        drop(log);
        let log = SegmentLog::open(dir.path(), false).unwrap();
        assert_eq!(log.end_index(), Some(c + 2));
        assert_eq!(log.read(b, c + 10, usize::MAX).unwrap(), [records(b..c, size), records(c..c + 2, 10)].concat());
    }

    #[test]
    fn segments_of_big_records_ask_for_no_spare() {
        let (dir, log) = log_with_a_spare();
        // Batch-sized records: the first spare is used, and no zeros are written for a next.
        let size = (SPARE_WORTH_RECORD_BYTES_MAX * 4) as usize;
        let count = LOG_SEGMENT_BYTES_MAX / (size as u64) + 2;
        log.append(1, framed(records(1..1 + count, size))).unwrap();
        let spares = log.spares.as_ref().unwrap();
        assert!(!spares.shared.lock().wanted && !spares.is_ready());
        assert!(fs::read_dir(dir.path()).unwrap().count() == 2, "two segments, no spare file");
    }

    #[test]
    fn a_record_lost_in_a_crash_ends_a_preallocated_segment_even_with_later_ones_on_disk() {
        let (dir, log) = log_with_a_spare();
        log.append(1, framed(records(1..7, 100))).unwrap();
        log.sync().unwrap();
        drop(log);
        // Power lost before record 4 reached the disk, though records 5 and 6 did (the page
        // cache writes back in any order): its bytes are still the spare's zeros.
        let path = segment_path(dir.path(), 1);
        let record = HEADER_BYTES + 100;
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all_at(&vec![0u8; record as usize], SEGMENT_HEADER_BYTES + 3 * record).unwrap();
        drop(file);
        let log = SegmentLog::open(dir.path(), true).unwrap();
        assert_eq!(log.end_index(), Some(4));
        assert_eq!(fs::metadata(&path).unwrap().len(), SEGMENT_HEADER_BYTES + 3 * record, "cut, 5 and 6 gone");
        log.append(4, framed(records(40..41, 100))).unwrap();
        drop(log);
        let log = SegmentLog::open(dir.path(), false).unwrap();
        assert_eq!(log.read(1, 10, usize::MAX).unwrap(), [records(1..4, 100), records(40..41, 100)].concat());
    }

    #[test]
    fn records_cut_from_a_preallocated_segment_stay_cut() {
        let (dir, log) = log_with_a_spare();
        log.append(1, framed(records(1..7, 100))).unwrap();
        log.truncate(3).unwrap();
        // The same size as the cut record 3: record 4 would sit right after it.
        log.append(3, framed(records(50..51, 100))).unwrap();
        log.sync().unwrap();
        drop(log);
        let log = SegmentLog::open(dir.path(), false).unwrap();
        assert_eq!(log.end_index(), Some(4));
        assert_eq!(log.read(1, 10, usize::MAX).unwrap(), [records(1..3, 100), records(50..51, 100)].concat());
    }

    #[test]
    fn a_headerless_segment_of_an_earlier_build_reads_and_takes_appends() {
        let dir = tempfile::tempdir().unwrap();
        let old: Vec<u8> = framed(records(5..8, 30)).iter_mut().flat_map(|r| r.salted(0).to_vec()).collect();
        fs::write(segment_path(dir.path(), 5), old).unwrap();
        let log = SegmentLog::open(dir.path(), false).unwrap();
        assert_eq!(log.read(5, 8, usize::MAX).unwrap(), records(5..8, 30));
        log.append(8, framed(records(8..10, 30))).unwrap();
        drop(log);
        let log = SegmentLog::open(dir.path(), false).unwrap();
        assert_eq!((log.first_index(), log.end_index()), (Some(5), Some(10)));
        assert_eq!(log.read(5, 10, usize::MAX).unwrap(), records(5..10, 30));
    }

    #[test]
    fn an_empty_newest_segment_gives_its_name_to_the_next() {
        let dir = tempfile::tempdir().unwrap();
        // A crash right after a segment was created: only its header is on disk.
        fs::write(segment_path(dir.path(), 4), segment_header(7)).unwrap();
        let log = SegmentLog::open(dir.path(), true).unwrap();
        log.wait_for_spare();
        log.append(4, framed(records(4..6, 10))).unwrap();
        assert_eq!(log.read(4, 6, usize::MAX).unwrap(), records(4..6, 10));
        assert_eq!(log.bytes(), SEGMENT_HEADER_BYTES + 2 * (HEADER_BYTES + 10), "one segment held");
        let path = segment_path(dir.path(), 4);
        assert_eq!(fs::metadata(&path).unwrap().len(), LOG_SEGMENT_BYTES_MAX, "the spare took the name");
        drop(log);
        let log = SegmentLog::open(dir.path(), false).unwrap();
        assert_eq!(log.read(0, 10, usize::MAX).unwrap(), records(4..6, 10));
    }

    #[test]
    fn appended_records_read_back_across_segments_and_after_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let log = SegmentLog::open(dir.path(), false).unwrap();
        // Records of a fifth of a segment: the log spans several files.
        let size = (LOG_SEGMENT_BYTES_MAX / 5) as usize;
        log.append(1, framed(records(1..13, size))).unwrap();
        log.sync().unwrap();
        assert!(fs::read_dir(dir.path()).unwrap().count() >= 2);
        assert_eq!(log.read(1, 13, usize::MAX).unwrap(), records(1..13, size));
        drop(log);
        let log = SegmentLog::open(dir.path(), false).unwrap();
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
        let log = SegmentLog::open(dir.path(), false).unwrap();
        log.append(5, framed(records(5..10, 100))).unwrap();
        drop(log);
        let path = segment_path(dir.path(), 5);
        let len = fs::metadata(&path).unwrap().len();
        // Half of the last record reached the disk; then garbage in a second try.
        OpenOptions::new().write(true).open(&path).unwrap().set_len(len - 50).unwrap();
        let log = SegmentLog::open(dir.path(), false).unwrap();
        assert_eq!(log.end_index(), Some(9));
        log.append(9, framed(records(9..11, 100))).unwrap();
        drop(log);
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all_at(&[0xAB; 20], fs::metadata(&path).unwrap().len() - 20).unwrap();
        let log = SegmentLog::open(dir.path(), false).unwrap();
        assert_eq!(log.end_index(), Some(10));
        assert_eq!(log.read(5, 10, usize::MAX).unwrap(), records(5..10, 100));
    }

    #[test]
    fn a_crash_at_any_byte_of_the_last_record_keeps_every_record_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = segment_path(dir.path(), 1);
        let log = SegmentLog::open(dir.path(), false).unwrap();
        log.append(1, framed(records(1..4, 40))).unwrap();
        drop(log);
        let whole = fs::read(&path).unwrap();
        let last_starts = whole.len() - (HEADER_BYTES as usize + 40);
        for cut in last_starts..whole.len() {
            fs::write(&path, &whole[..cut]).unwrap();
            let log = SegmentLog::open(dir.path(), false).unwrap();
            assert_eq!(log.end_index(), Some(3), "cut at byte {cut}");
            assert_eq!(fs::metadata(&path).unwrap().len(), last_starts as u64, "the torn bytes are gone");
            log.append(3, framed(records(3..4, 40))).unwrap();
            assert_eq!(log.read(1, 4, usize::MAX).unwrap(), records(1..4, 40));
        }
    }

    #[test]
    fn a_bad_record_in_an_older_segment_refuses_the_open() {
        let dir = tempfile::tempdir().unwrap();
        let log = SegmentLog::open(dir.path(), false).unwrap();
        let size = (LOG_SEGMENT_BYTES_MAX / 2) as usize;
        log.append(1, framed(records(1..5, size))).unwrap();
        drop(log);
        let oldest = segment_path(dir.path(), 1);
        OpenOptions::new().write(true).open(&oldest).unwrap().write_all_at(&[0u8; 16], 100).unwrap();
        assert!(matches!(SegmentLog::open(dir.path(), false), Err(StoreError::Corrupt(_))));
    }

    #[test]
    fn truncation_removes_the_tail_for_good_and_purge_drops_whole_segments() {
        let dir = tempfile::tempdir().unwrap();
        let log = SegmentLog::open(dir.path(), false).unwrap();
        let size = (LOG_SEGMENT_BYTES_MAX / 3) as usize;
        log.append(1, framed(records(1..11, size))).unwrap();
        let files = || fs::read_dir(dir.path()).unwrap().count();
        let before = files();
        log.truncate(6).unwrap();
        assert_eq!(log.end_index(), Some(6));
        assert!(files() < before);
        // Different records at the same indexes replace the cut ones.
        log.append(6, framed(records(100..103, 10))).unwrap();
        drop(log);
        let log = SegmentLog::open(dir.path(), false).unwrap();
        assert_eq!(log.read(6, 9, usize::MAX).unwrap(), records(100..103, 10));

        assert!(!log.purge_must_be_durable(1));
        log.purge(1).unwrap();
        assert_eq!(log.first_index(), Some(1), "a segment goes only when all of it is purged");
        assert_eq!(log.read(0, 3, usize::MAX).unwrap(), records(2..3, size), "but purged records are not read");
        assert!(log.purge_must_be_durable(4));
        log.purge(4).unwrap();
        assert!(log.first_index().unwrap() > 1);
        assert_eq!(log.read(8, 9, usize::MAX).unwrap(), records(102..103, 10));
        // Purging past the end empties the log; the next append starts a new segment anywhere.
        log.purge(20).unwrap();
        assert_eq!((log.first_index(), log.end_index()), (None, None));
        log.append(21, framed(records(21..22, 10))).unwrap();
        drop(log);
        let log = SegmentLog::open(dir.path(), false).unwrap();
        assert_eq!((log.first_index(), log.end_index()), (Some(21), Some(22)));
    }

    #[test]
    fn an_append_past_the_end_leaves_a_gap_that_reads_skip() {
        let dir = tempfile::tempdir().unwrap();
        let log = SegmentLog::open(dir.path(), false).unwrap();
        log.append(1, framed(records(1..3, 10))).unwrap();
        log.append(5, framed(records(5..7, 10))).unwrap();
        assert!(matches!(log.append(6, framed(records(6..7, 10))), Err(StoreError::Corrupt(_))));
        drop(log);
        let log = SegmentLog::open(dir.path(), false).unwrap();
        let mut expected = records(1..3, 10);
        expected.extend(records(5..7, 10));
        assert_eq!(log.read(0, 10, usize::MAX).unwrap(), expected);
        assert_eq!(log.read(3, 6, usize::MAX).unwrap(), records(5..6, 10));
    }

    #[test]
    fn truncating_at_a_segment_start_deletes_that_segment() {
        let dir = tempfile::tempdir().unwrap();
        let log = SegmentLog::open(dir.path(), false).unwrap();
        log.append(3, framed(records(3..6, 10))).unwrap();
        log.truncate(3).unwrap();
        assert_eq!(log.end_index(), None);
        log.append(3, framed(records(50..52, 10))).unwrap();
        assert_eq!(log.read(3, 5, usize::MAX).unwrap(), records(50..52, 10));
    }

    #[test]
    fn a_purge_that_a_new_segment_could_start_after_must_be_durable() {
        let dir = tempfile::tempdir().unwrap();
        let log = SegmentLog::open(dir.path(), false).unwrap();
        // Empty, as after a snapshot install: the next append starts a segment at 8, so a
        // crash losing the purge would leave the log starting after a gap.
        assert!(log.purge_must_be_durable(7));
        log.purge(7).unwrap();
        log.append(8, framed(records(8..10, 10))).unwrap();
        assert!(!log.purge_must_be_durable(7), "the segment starts right after the purge");
        assert!(!log.purge_must_be_durable(8), "a record after 8 stays: the segment does too");
        assert!(log.purge_must_be_durable(9), "nothing after 9: the segment goes");
    }
}
