//! openraft's log storage: entries in append-only segment files ([`crate::segments`]), the
//! vote and the purge point in RocksDB, with group commit.
//!
//! An `append` writes its entries to the newest segment without waiting for the disk (so they
//! are readable at once and replication to followers can start), then hands the flush
//! callback to the syncer thread. The syncer takes every callback queued so far, fsyncs the
//! segment once, and only then tells openraft the entries are durable. Many appends therefore
//! share one fsync, and no entry is reported durable before it is. A follower's appends are
//! fsynced before `append` returns instead (see [`LogStore::set_node_id`]).
//!
//! The log lives outside RocksDB so that each entry's bytes are written once: in RocksDB they
//! went to the WAL, then again into table files at every memtable flush (62 % of the bytes
//! flushed under batch load), then through compaction, until a snapshot let them be purged.

use std::fmt::Debug;
use std::ops::RangeBounds;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{LogState, OptionalSend, RaftLogReader};
use rocksdb::{Direction, IteratorMode, DB};

use crate::db::{cf, synced, unsynced};
use crate::error::{read_err, write_err};
use crate::keys::{decode_u64, log_key, CF_LOG, CF_RAFT, COMMITTED, LAST_PURGED, NODE_ID, VOTE};
use crate::limits::{RECENT_ENTRIES_BYTES_MAX, REPLICATION_READ_BYTES_MAX};
use crate::recent::RecentEntries;
use crate::segments::{Record, SegmentLog};
use crate::typ::{Entry, LogId, NodeId, StorageError, TypeConfig, Vote};
use crate::StoreError;

/// Where the store's slow I/O runs. Both modes fsync a log entry before openraft is told it
/// is durable; they differ only in which thread waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoMode {
    /// A syncer thread fsyncs once for every append queued meanwhile (group commit) while the
    /// append itself returns at once; snapshots are built and installed on tokio's blocking
    /// pool. The production mode.
    Background,
    /// Everything runs on the calling thread: each append is written with `sync = true`
    /// before it returns, snapshots are built and installed inline. No other thread touches
    /// the store, so a deterministic simulation replays exactly.
    Inline,
}

/// Told of every fsync that makes log appends durable, for metrics: a slow disk shows here
/// first, and appends per fsync is the measure of group commit.
pub trait FsyncObserver: Send + Sync {
    /// One fsync that took `elapsed` (the write before it included, for an inline append)
    /// made `appends` calls of `append` durable.
    fn log_fsynced(&self, appends: usize, elapsed: Duration);
}

/// The observer, once the node has given one ([`LogStore::observe_fsyncs`]).
type Observer = Arc<OnceLock<Arc<dyn FsyncObserver>>>;

fn report(observer: &Observer, appends: usize, started: Instant) {
    if let Some(observer) = observer.get() {
        observer.log_fsynced(appends, started.elapsed());
    }
}

/// The Raft log. Cloning is cheap and clones share everything (the clone is the log reader
/// replication tasks use).
#[derive(Clone)]
pub struct LogStore {
    /// The vote, `committed` and `last_purged` (the `raft` column family).
    db: Arc<DB>,
    /// The entries.
    segments: Arc<SegmentLog>,
    /// The syncer thread; `None` when appends fsync inline (see [`IoMode`]).
    syncer: Option<Arc<Syncer>>,
    /// Highest committed index this node has learned; for `/cluster` and `/ready`.
    committed_index: Arc<AtomicU64>,
    /// The newest entries, decoded: what replication and apply read right after an append.
    recent: Arc<Mutex<RecentEntries>>,
    /// This node's id, once the node has said it ([`LogStore::set_node_id`]): tells its own
    /// entries (it leads) from a leader's it follows.
    node_id: Arc<OnceLock<NodeId>>,
    observer: Observer,
}

impl LogStore {
    /// Opens the log whose entries are in `segments_dir` and whose metadata is in `db`. A log
    /// that an earlier build kept in RocksDB's `log` column family is moved to segments first.
    pub fn new(db: Arc<DB>, segments_dir: &Path, sync: IoMode) -> Result<Self, StoreError> {
        // Spare segments are prepared by a thread of their own: only with background I/O.
        let segments = Arc::new(SegmentLog::open(segments_dir, sync == IoMode::Background)?);
        move_log_out_of_rocksdb(&db, &segments)?;
        let observer = Observer::default();
        let syncer = match sync {
            IoMode::Inline => None,
            IoMode::Background => {
                let (queue, pending) = mpsc::channel();
                let sync_segments = segments.clone();
                let sync_observer = observer.clone();
                let thread = std::thread::Builder::new()
                    .name("log-syncer".into())
                    .spawn(move || run_syncer(&sync_segments, &pending, &sync_observer))?;
                Some(Arc::new(Syncer { queue: Some(queue), thread: Some(thread) }))
            }
        };
        let store = Self {
            db,
            segments,
            syncer,
            committed_index: Arc::new(AtomicU64::new(0)),
            recent: Arc::new(Mutex::new(RecentEntries::new(RECENT_ENTRIES_BYTES_MAX))),
            node_id: Arc::new(OnceLock::new()),
            observer,
        };
        if let Some(committed) = store.read_committed_sync()? {
            store.committed_index.store(committed.index, Ordering::Relaxed);
        }
        // A purge fsyncs `last_purged` before deleting files: a crash in between leaves
        // segments of purged entries, which go here.
        if let Some(purged) = store.get_meta::<LogId>(LAST_PURGED)? {
            store.segments.purge(purged.index)?;
        }
        Ok(store)
    }

    /// Names this node, for every clone. Until it is named, every append goes to the syncer
    /// thread; once it is, a follower's appends (entries of another node's leadership) are
    /// fsynced inline. A follower's Raft core waits for each append's flush before it answers
    /// the leader, so its appends never share an fsync, and the hand-off to the syncer thread
    /// and back cost two thread wake-ups on the commit path. The leader's own appends still
    /// go to the syncer: they group-commit while the entries are already replicating.
    ///
    /// The id is also recorded in the data dir on first start, and a later start under another
    /// id is refused: a node given another's data dir (swapped volumes, a wrong `--id`) would
    /// carry that node's votes and log under its own name, and two voters with one history can
    /// elect two leaders in one term.
    pub fn set_node_id(&self, id: NodeId) -> Result<(), StoreError> {
        match self.get_meta::<NodeId>(NODE_ID)? {
            Some(stored) if stored != id => return Err(StoreError::OtherNode { stored, given: id }),
            Some(_) => {}
            None => self.db.put_cf_opt(
                cf(&self.db, CF_RAFT)?,
                NODE_ID,
                bincode::serialize(&id).map_err(StoreError::decode("node id"))?,
                &synced(),
            )?,
        }
        let _ = self.node_id.set(id);
        Ok(())
    }

    /// Reports every fsync of appends to `observer` from now on, for every clone. The first
    /// observer given stays.
    pub fn observe_fsyncs(&self, observer: Arc<dyn FsyncObserver>) {
        let _ = self.observer.set(observer);
    }

    /// True when `entry` belongs to another node's leadership: this node follows it.
    fn follows(&self, entry: &Entry) -> bool {
        self.node_id.get().is_some_and(|me| entry.log_id.leader_id.node_id != *me)
    }

    /// Bytes of the log's segment files, for metrics.
    pub fn files(&self) -> LogFiles {
        LogFiles(self.segments.clone())
    }

    /// `--force-new-cluster`: makes node `id` (at `node`) the only voter of its cluster, outside
    /// Raft and before its core starts, when the other voters are lost for good. Appends, and
    /// fsyncs, a membership entry of `id` alone after the last entry, under a leader id one term
    /// above any this node saw or voted in, then saves a committed vote for `id` in that term:
    /// openraft restores a node alone in its membership as the leader of its committed vote
    /// (vendor/openraft, `Engine::startup`), which then commits this entry and every entry before
    /// it. Entries the lost nodes alone held are gone.
    ///
    /// `applied` is the state machine's last applied entry, which may be past the log's end (a
    /// snapshot install redone at open, whose purge of the log never ran; a power cut that kept
    /// an apply but not the entries). openraft reads membership entries only after it, so the
    /// new one must come after it too: the log is purged up to it first (durably), as openraft
    /// would at start. Returns the entry's log id; `None`, and nothing written, when neither the
    /// log nor the state machine holds anything (no cluster to recover).
    pub fn force_single_voter(
        &mut self,
        id: NodeId,
        node: crate::Node,
        applied: Option<LogId>,
    ) -> Result<Option<LogId>, StoreError> {
        let last_purged: Option<LogId> = self.get_meta(LAST_PURGED)?;
        let log_end = self.last_log_id()?.or(last_purged);
        let Some(last) = log_end.into_iter().chain(applied).max_by_key(|l| l.index) else {
            return Ok(None);
        };
        if log_end.is_none_or(|end| end.index < last.index) {
            self.purge_to(last, true)?;
        }
        let vote: Option<Vote> = self.get_meta(VOTE)?;
        let seen_terms = [vote.map(|v| v.leader_id.term), log_end.map(|l| l.leader_id.term), Some(last.leader_id.term)];
        let term = seen_terms.into_iter().flatten().max().unwrap_or(0) + 1;
        let log_id = LogId::new(openraft::CommittedLeaderId::new(term, id), last.index + 1);
        let membership = openraft::Membership::new(
            vec![std::collections::BTreeSet::from([id])],
            std::collections::BTreeMap::from([(id, node)]),
        );
        let entry = Entry { log_id, payload: openraft::EntryPayload::Membership(membership) };
        let record = Record::encode(&entry)?;
        let len = record.payload_len();
        self.segments.append(log_id.index, vec![record])?;
        self.recent().appended(vec![(entry, len)]);
        // Fsyncs the entry before the vote.
        self.write_vote(&Vote::new_committed(term, id))?;
        Ok(Some(log_id))
    }

    /// Records `log_id` as the last purged entry (fsynced when `durable`) and drops the log up
    /// to it.
    fn purge_to(&mut self, log_id: LogId, durable: bool) -> Result<(), StoreError> {
        let bytes = bincode::serialize(&log_id).map_err(StoreError::decode("purged"))?;
        let durability = if durable { synced() } else { unsynced() };
        self.db.put_cf_opt(cf(&self.db, CF_RAFT)?, LAST_PURGED, bytes, &durability)?;
        self.segments.purge(log_id.index)?;
        self.recent().purged(log_id.index);
        Ok(())
    }

    /// Fsyncs the log, then saves `vote`, fsynced (why in that order: `save_vote`).
    fn write_vote(&mut self, vote: &Vote) -> Result<(), StoreError> {
        self.segments.sync()?;
        let bytes = bincode::serialize(vote).map_err(StoreError::decode("vote"))?;
        self.db.put_cf_opt(cf(&self.db, CF_RAFT)?, VOTE, bytes, &synced())?;
        Ok(())
    }

    /// Highest committed log index known to this node.
    pub fn committed_index(&self) -> Arc<AtomicU64> {
        self.committed_index.clone()
    }

    fn recent(&self) -> MutexGuard<'_, RecentEntries> {
        self.recent.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get_meta<T: serde::de::DeserializeOwned>(&self, key: &[u8]) -> Result<Option<T>, StoreError> {
        match self.db.get_cf(cf(&self.db, CF_RAFT)?, key)? {
            Some(bytes) => Ok(Some(bincode::deserialize(&bytes).map_err(StoreError::decode("raft meta"))?)),
            None => Ok(None),
        }
    }

    /// The saved commit index, but never past the log's last entry. `save_committed` is not
    /// fsynced, and a leader saves an index its two followers fsynced before its own flush
    /// of those entries ends; a later synced write (a vote) can make the index durable first.
    /// After a power cut the log may then end below it, and openraft, which re-applies up to
    /// the commit index on start, would refuse to start. Every entry up to the log's end is
    /// committed (the log is a prefix of the one the index was counted on); the node learns
    /// the rest from the leader.
    fn read_committed_sync(&self) -> Result<Option<LogId>, StoreError> {
        let Some(committed) = self.get_meta::<LogId>(COMMITTED)? else { return Ok(None) };
        // The log's end as `get_log_state` reports it.
        let end = self.last_log_id()?.or(self.get_meta::<LogId>(LAST_PURGED)?);
        Ok(end.map(|end| if end.index < committed.index { end } else { committed }))
    }

    fn last_log_id(&self) -> Result<Option<LogId>, StoreError> {
        let Some(end) = self.segments.end_index() else {
            return Ok(None);
        };
        let last = self.segments.read(end - 1, end, usize::MAX)?;
        last.first().map(|bytes| decode_entry(bytes).map(|e| e.log_id)).transpose()
    }

    /// Entries in `[start, end_exclusive)`, stopping before the one that would take the stored
    /// bytes read past `bytes_max` (the first entry is always returned).
    fn read_range(&self, start: u64, end_exclusive: u64, bytes_max: usize) -> Result<Vec<Entry>, StoreError> {
        let mut out = Vec::new();
        if start >= end_exclusive {
            return Ok(out);
        }
        if let Some(recent) = self.recent().read(start, end_exclusive, bytes_max) {
            return Ok(recent);
        }
        // Older than the window: after a restart, or a follower catching up.
        for bytes in self.segments.read(start, end_exclusive, bytes_max)? {
            out.push(decode_entry(&bytes)?);
        }
        Ok(out)
    }
}

/// Reads the size of the log's segment files; cheap to clone.
#[derive(Clone)]
pub struct LogFiles(Arc<SegmentLog>);

impl LogFiles {
    pub fn bytes(&self) -> u64 {
        self.0.bytes()
    }
}

/// Entries an earlier build kept in RocksDB's `log` column family move to segment files:
/// appended after what the segments hold (a move interrupted by a crash goes on where it
/// stopped), fsynced, and only then deleted from RocksDB.
fn move_log_out_of_rocksdb(db: &DB, segments: &SegmentLog) -> Result<(), StoreError> {
    let log = cf(db, CF_LOG)?;
    let Some(first) = db.iterator_cf(log, IteratorMode::Start).next().transpose()? else {
        return Ok(());
    };
    let from = segments.end_index().unwrap_or_else(|| decode_u64(&first.0).unwrap_or(0));
    let mut moved = 0u64;
    for item in db.iterator_cf(log, IteratorMode::From(&log_key(from), Direction::Forward)) {
        let (key, value) = item?;
        let index = decode_u64(&key).ok_or_else(|| StoreError::Corrupt("log key".into()))?;
        segments.append(index, vec![Record::of_payload(&value)?])?;
        moved += 1;
    }
    segments.sync()?;
    let mut batch = rocksdb::WriteBatch::default();
    batch.delete_range_cf(log, log_key(0), log_key(u64::MAX));
    db.write_opt(batch, &synced())?;
    db.compact_range_cf(log, None::<&[u8]>, None::<&[u8]>);
    tracing::info!(moved, "moved the Raft log out of RocksDB into segment files");
    Ok(())
}

fn decode_entry(bytes: &[u8]) -> Result<Entry, StoreError> {
    bincode::deserialize(bytes).map_err(StoreError::decode("log entry"))
}

/// The syncer thread and its queue, shared by every clone of the log store. The last clone
/// to go closes the queue, which ends the thread, and joins it, so no fsync outlives the
/// store.
struct Syncer {
    queue: Option<mpsc::Sender<LogFlushed<TypeConfig>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Syncer {
    fn drop(&mut self) {
        drop(self.queue.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Answers an append's callback with the failure `e` too, as the storage contract asks (openraft
/// 0.9 waits on it only after an `Ok`), and returns `e` for the append itself.
fn failed(callback: LogFlushed<TypeConfig>, e: StoreError) -> StorageError {
    callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
    write_err(e)
}

/// Fsyncs the log for every batch of queued callbacks, then completes them.
fn run_syncer(segments: &SegmentLog, queue: &mpsc::Receiver<LogFlushed<TypeConfig>>, observer: &Observer) {
    while let Ok(first) = queue.recv() {
        let mut waiting = vec![first];
        waiting.extend(queue.try_iter());
        let started = Instant::now();
        let result = segments.sync();
        // Every fsync is timed (a stalling disk that then fails shows); only appends it made
        // durable are counted as such.
        report(observer, if result.is_ok() { waiting.len() } else { 0 }, started);
        for callback in waiting {
            let outcome = match &result {
                Ok(()) => Ok(()),
                Err(e) => Err(std::io::Error::other(e.to_string())),
            };
            callback.log_io_completed(outcome);
        }
    }
}

fn bounds(range: impl RangeBounds<u64>) -> (u64, u64) {
    use std::ops::Bound;
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => u64::MAX,
    };
    (start, end)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let (start, end) = bounds(range);
        self.read_range(start, end, usize::MAX).map_err(read_err)
    }

    /// What replication reads: a prefix of the range of at most
    /// [`REPLICATION_READ_BYTES_MAX`] bytes, so one AppendEntries stays small whatever
    /// `max_payload_entries` allows.
    async fn limited_get_log_entries(&mut self, start: u64, end: u64) -> Result<Vec<Entry>, StorageError> {
        self.read_range(start, end, REPLICATION_READ_BYTES_MAX).map_err(read_err)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged_log_id: Option<LogId> = self.get_meta(LAST_PURGED).map_err(read_err)?;
        let last_log_id = self.last_log_id().map_err(read_err)?.or(last_purged_log_id);
        Ok(LogState { last_purged_log_id, last_log_id })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    /// # Correctness
    /// The vote is fsynced before this returns: a node must never vote twice in a term.
    /// The log is fsynced first: a leader's own appends are fsynced in the background, and a
    /// leader that steps down may be asked by its successor about entries it appended but has
    /// not yet fsynced. openraft answers such a request from the log as it reads it, without
    /// waiting for their flush; after this, every entry appended under an older vote is durable
    /// before the node acts under the new one. Votes change rarely, so this costs little.
    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        self.write_vote(vote).map_err(write_err)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        self.get_meta(VOTE).map_err(read_err)
    }

    /// Not fsynced: if it is lost, the node learns the commit index again from the leader,
    /// and the state machine's own `last_applied` is durable with its data.
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        if let Some(c) = &committed {
            self.committed_index.fetch_max(c.index, Ordering::Relaxed);
        }
        let raft = cf(&self.db, CF_RAFT).map_err(write_err)?;
        match committed {
            Some(c) => {
                let bytes = bincode::serialize(&c).map_err(|e| write_err(StoreError::decode("committed")(e)))?;
                self.db.put_cf_opt(raft, COMMITTED, bytes, &unsynced()).map_err(write_err)
            }
            None => self.db.delete_cf_opt(raft, COMMITTED, &unsynced()).map_err(write_err),
        }
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        self.read_committed_sync().map_err(read_err)
    }

    /// # Correctness
    /// Entries are readable when this returns; `callback` fires only after the segment
    /// holding them is fsynced: by the syncer thread, shared with other appends, or before
    /// this returns (a follower's appends, and [`IoMode::Inline`]).
    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut records = Vec::new();
        let mut appended = Vec::new();
        for entry in entries {
            let record = match Record::encode(&entry) {
                Ok(record) => record,
                Err(e) => return Err(failed(callback, e)),
            };
            appended.push((entry, record.payload_len()));
            records.push(record);
        }
        let Some(first) = appended.first().map(|(entry, _)| entry.log_id.index) else {
            callback.log_io_completed(Ok(()));
            return Ok(());
        };
        // A leader appends only entries of its own term; a follower catching up may also get
        // entries of this node's earlier leadership, but its newest one is another leader's.
        // Either path fsyncs before the callback: the choice only decides which thread waits.
        let follower = appended.last().is_some_and(|(entry, _)| self.follows(entry));
        match self.syncer.as_ref().filter(|_| !follower) {
            Some(syncer) => {
                if let Err(e) = self.segments.append(first, records) {
                    return Err(failed(callback, e));
                }
                self.recent().appended(appended);
                let stopped = || StoreError::Corrupt("log syncer thread stopped".into());
                match syncer.queue.as_ref() {
                    Some(queue) => {
                        queue.send(callback).map_err(|mpsc::SendError(callback)| failed(callback, stopped()))
                    }
                    None => Err(failed(callback, stopped())),
                }
            }
            None => {
                let started = Instant::now();
                let result = self.segments.append(first, records).and_then(|()| self.segments.sync());
                report(&self.observer, usize::from(result.is_ok()), started);
                match result {
                    Ok(()) => {
                        self.recent().appended(appended);
                        callback.log_io_completed(Ok(()));
                        Ok(())
                    }
                    Err(e) => Err(failed(callback, e)),
                }
            }
        }
    }

    /// # Correctness
    /// Deletes `[log_id.index, ∞)` and fsyncs before returning, so a truncated entry can never
    /// reappear after a crash.
    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.segments.truncate(log_id.index).map_err(write_err)?;
        self.recent().truncated(log_id.index);
        Ok(())
    }

    /// # Correctness
    /// Purged entries are covered by the state machine on disk (a snapshot is built only
    /// after flushing it, and openraft purges only entries a snapshot covers). `last_purged`
    /// is fsynced before a segment file is deleted or a new one can start after it, so the log
    /// never starts after a gap; any other purge is not fsynced, and if a crash loses it, it is
    /// redone.
    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let must_be_durable = self.segments.purge_must_be_durable(log_id.index);
        self.purge_to(log_id, must_be_durable).map_err(write_err)?;
        // Once per snapshot: from here on a follower behind this index needs a snapshot.
        tracing::info!(upto = log_id.index, "purged log");
        Ok(())
    }
}
