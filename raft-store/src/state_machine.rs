//! openraft's state machine: the pub/sub state, persisted in RocksDB.
//!
//! Each `apply` call runs the pure [`rules`] over every entry it is given and
//! writes the result — messages, dedup entries, topic records, `last_applied` and membership —
//! in ONE `WriteBatch`, so the state on disk always matches its `last_applied` exactly. The
//! batch is not fsynced: after a crash RocksDB recovers a prefix of batches, and openraft
//! re-applies the committed entries after `last_applied` from the (fsynced) log.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use rocksdb::{IteratorMode, WriteBatch, DB};

use crate::command::{Response, TopicRecord};
use crate::db::{cf, flush_state_machine, unlogged};
use crate::error::{read_err, sm_write_err};
use crate::feeds::Feeds;
use crate::keys::{
    decode_u64, message_key, topic_scoped_key, CF_CURSORS, CF_DEDUP, CF_MESSAGES, CF_SM_META, CF_TOPICS, CLUSTER_ID,
    DISK_SHORT, INSTALL_PENDING, LAST_APPLIED, MEMBERSHIP, NEXT_TOPIC_ID, SNAPSHOT_META,
};
use crate::log_store::IoMode;
use crate::reader::{StoreReader, StoredMessage};
use crate::rules::{self, metadata_len, MessageMeta, SmStore, Topics};
use crate::segments::{create_dir_durably, sync_dir};
use crate::snapshot::{self, encode, PendingInstall, SnapshotFile};
use crate::typ::{Entry, LogId, Snapshot, SnapshotMeta, StorageError, StoredMembership, TypeConfig};
use crate::StoreError;

/// The pub/sub state machine.
pub struct StateMachine {
    db: Arc<DB>,
    /// All topic records; shared with readers, changed only by `apply` and installs.
    topics: Arc<RwLock<Topics>>,
    feeds: Arc<Feeds>,
    /// Odd while a snapshot install rewrites the tables readers read, raised at its start and
    /// its end (shared with readers: see [`StoreReader::installing`]).
    installs: Arc<AtomicU64>,
    /// The cluster's id once applied (shared with readers: see [`StoreReader::cluster_id`]).
    cluster_id: Arc<OnceLock<String>>,
    /// How many nodes claim to be short of disk room (shared with readers: see
    /// [`StoreReader::any_disk_short`]).
    disk_short_count: Arc<AtomicUsize>,
    last_applied: Option<LogId>,
    membership: StoredMembership,
    snapshots: SnapshotFiles,
    /// Set when the node stops cleanly ([`crate::Closed::stop_cleanly`]): then dropping the
    /// state machine writes its applies to disk.
    clean_stop: Arc<AtomicBool>,
}

/// Where snapshot files live, and the lock that keeps building and installing from
/// overwriting each other's bookkeeping.
#[derive(Clone)]
struct SnapshotFiles {
    dir: PathBuf,
    db: Arc<DB>,
    lock: Arc<Mutex<()>>,
    mode: IoMode,
}

impl SnapshotFiles {
    /// Runs blocking snapshot work on tokio's blocking pool, or inline (see [`IoMode`]).
    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        match self.mode {
            IoMode::Inline => work(),
            IoMode::Background => tokio::task::spawn_blocking(work)
                .await
                .map_err(|e| StoreError::Corrupt(format!("snapshot task: {e}")))?,
        }
    }
}

impl StateMachine {
    /// Opens the state machine persisted in `db`; snapshot files live in `snapshot_dir`.
    pub fn open(db: Arc<DB>, snapshot_dir: PathBuf, feeds: Arc<Feeds>, mode: IoMode) -> Result<Self, StoreError> {
        create_dir_durably(&snapshot_dir)?;
        let snapshots = SnapshotFiles { dir: snapshot_dir, db: db.clone(), lock: Arc::new(Mutex::new(())), mode };
        snapshots.redo_pending_install()?;
        snapshots.remove_partial_files()?;
        snapshots.remove_files_not_current()?;
        let mut sm = Self {
            db,
            topics: Arc::new(RwLock::new(Topics::default())),
            feeds,
            installs: Arc::new(AtomicU64::new(0)),
            cluster_id: Arc::new(OnceLock::new()),
            disk_short_count: Arc::new(AtomicUsize::new(0)),
            last_applied: None,
            membership: StoredMembership::default(),
            snapshots,
            clean_stop: Arc::new(AtomicBool::new(false)),
        };
        sm.load()?;
        Ok(sm)
    }

    /// The flag that makes dropping this state machine flush it (see [`crate::Closed`]).
    pub(crate) fn clean_stop_flag(&self) -> Arc<AtomicBool> {
        self.clean_stop.clone()
    }

    /// The read side, sharing this state machine's topics and feeds.
    pub fn reader(&self) -> StoreReader {
        StoreReader {
            db: self.db.clone(),
            topics: self.topics.clone(),
            feeds: self.feeds.clone(),
            installs: self.installs.clone(),
            cluster_id: self.cluster_id.clone(),
            disk_short_count: self.disk_short_count.clone(),
        }
    }

    /// (Re)loads the in-memory part of the state from RocksDB.
    fn load(&mut self) -> Result<(), StoreError> {
        let meta = cf(&self.db, CF_SM_META)?;
        self.last_applied = match self.db.get_cf(meta, LAST_APPLIED)? {
            Some(b) => bincode::deserialize(&b).map_err(StoreError::decode("last_applied"))?,
            None => None,
        };
        self.membership = match self.db.get_cf(meta, MEMBERSHIP)? {
            Some(b) => bincode::deserialize(&b).map_err(StoreError::decode("membership"))?,
            None => StoredMembership::default(),
        };
        let mut topics = Topics {
            by_name: HashMap::new(),
            next_topic_id: self.db.get_cf(meta, NEXT_TOPIC_ID)?.as_deref().and_then(decode_u64).unwrap_or(0),
            deletions: Vec::new(),
            cursor_counts: self.count_cursors()?,
            cluster_id: match self.db.get_cf(meta, CLUSTER_ID)? {
                Some(b) => {
                    Some(String::from_utf8(b).map_err(|_| StoreError::Corrupt("the cluster id is not UTF-8".into()))?)
                }
                None => None,
            },
            disk_short: match self.db.get_cf(meta, DISK_SHORT)? {
                Some(b) => bincode::deserialize(&b).map_err(StoreError::decode("disk_short"))?,
                None => BTreeMap::new(),
            },
            metadata_bytes: 0,
        };
        for item in self.db.iterator_cf(cf(&self.db, CF_TOPICS)?, IteratorMode::Start) {
            let (_, value) = item?;
            let record: TopicRecord = bincode::deserialize(&value).map_err(StoreError::decode("topic"))?;
            topics.metadata_bytes += metadata_len(record.metadata.as_deref());
            topics.by_name.insert(record.name.clone(), record);
        }
        self.publish_to_readers(&topics);
        *self.topics.write().unwrap_or_else(|e| e.into_inner()) = topics;
        if let Some(applied) = &self.last_applied {
            self.feeds.notify_applied(applied.index);
        }
        Ok(())
    }

    /// Hands readers what they ask without the topic map's lock, which an apply holds: the
    /// cluster id, checked on every Raft RPC (set once, as the rules do), and whether any node
    /// claims to be short of disk room, checked on every publish.
    fn publish_to_readers(&self, topics: &Topics) {
        if let Some(id) = &topics.cluster_id {
            let _ = self.cluster_id.set(id.clone());
        }
        self.disk_short_count.store(topics.disk_short.len(), Ordering::Relaxed);
    }

    /// Recorded cursors per topic id, counted from the `cursors` column family (keys start
    /// with the topic id): at most [`crate::limits::CURSORS_PER_TOPIC_MAX`] per topic, so a
    /// start-up reads them in well under a second.
    fn count_cursors(&self) -> Result<HashMap<u64, u64>, StoreError> {
        let mut counts = HashMap::new();
        for item in self.db.iterator_cf(cf(&self.db, CF_CURSORS)?, IteratorMode::Start) {
            let (key, _) = item?;
            let topic_id =
                decode_u64(&key).ok_or_else(|| StoreError::Corrupt("a cursor key shorter than a topic id".into()))?;
            *counts.entry(topic_id).or_insert(0) += 1;
        }
        Ok(counts)
    }

    fn apply_entries(&mut self, entries: impl IntoIterator<Item = Entry>) -> Result<Vec<Response>, StoreError> {
        let mut watchers = self.feeds.lock();
        let mut topics = self.topics.write().unwrap_or_else(|e| e.into_inner());
        let mut batch = ApplyBatch::new(&self.db)?;
        let mut responses = Vec::new();
        let mut changed = BTreeSet::new();
        let mut membership_changed = false;
        let next_topic_id = topics.next_topic_id;
        let had_cluster_id = topics.cluster_id.is_some();
        // Almost always empty: the clone allocates nothing.
        let disk_short = topics.disk_short.clone();
        for entry in entries {
            debug_assert!(self.last_applied.as_ref().is_none_or(|a| a.index < entry.log_id.index));
            self.last_applied = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Blank => responses.push(Response::None),
                EntryPayload::Normal(request) => {
                    let (response, touched) = rules::apply(&mut topics, &mut batch, &request)?;
                    changed.extend(touched);
                    responses.push(response);
                }
                EntryPayload::Membership(membership) => {
                    self.membership = StoredMembership::new(Some(entry.log_id), membership);
                    membership_changed = true;
                    responses.push(Response::None);
                }
            }
        }
        let meta = cf(&self.db, CF_SM_META)?;
        let topics_cf = cf(&self.db, CF_TOPICS)?;
        for name in &changed {
            if let Some(record) = topics.by_name.get(name) {
                batch.batch.put_cf(topics_cf, name.as_bytes(), encode(record)?);
            }
        }
        if topics.next_topic_id != next_topic_id {
            batch.batch.put_cf(meta, NEXT_TOPIC_ID, topics.next_topic_id.to_be_bytes());
        }
        if let Some(id) = topics.cluster_id.as_ref().filter(|_| !had_cluster_id) {
            batch.batch.put_cf(meta, CLUSTER_ID, id.as_bytes());
        }
        if topics.disk_short != disk_short {
            batch.batch.put_cf(meta, DISK_SHORT, encode(&topics.disk_short)?);
        }
        if membership_changed {
            batch.batch.put_cf(meta, MEMBERSHIP, encode(&self.membership)?);
        }
        batch.batch.put_cf(meta, LAST_APPLIED, encode(&self.last_applied)?);
        self.db.write_opt(batch.batch, &unlogged())?;

        for name in &changed {
            if let Some(record) = topics.by_name.get(name) {
                // Deletions are rare: the list is almost always empty (collecting from it then
                // allocates nothing), so no map is built.
                let deletions: Vec<u64> =
                    topics.deletions.iter().filter(|(n, _)| n == name).map(|&(_, at)| at).collect();
                Feeds::notify(&mut watchers, record, &deletions);
            }
        }
        topics.deletions.clear();
        self.publish_to_readers(&topics);
        drop(topics);
        drop(watchers);
        if let Some(applied) = &self.last_applied {
            self.feeds.notify_applied(applied.index);
        }
        Ok(responses)
    }
}

/// The rules' storage during one `apply`: writes go into a `WriteBatch`, and an overlay
/// makes them visible to later reads of the same batch.
struct ApplyBatch<'a> {
    db: &'a DB,
    batch: WriteBatch,
    /// Dedup entries as this batch sees them, by their RocksDB key: written or deleted by the
    /// batch, or read ahead from RocksDB by `dedup_prefetch`.
    dedup: HashMap<Vec<u8>, Option<u64>>,
    messages: HashMap<(u64, u64), MessageMeta>,
    /// Cursors written or deleted by this batch, by their RocksDB key.
    cursors: HashMap<Vec<u8>, Option<u64>>,
    cf_dedup: &'a rocksdb::ColumnFamily,
    cf_messages: &'a rocksdb::ColumnFamily,
    cf_cursors: &'a rocksdb::ColumnFamily,
}

impl<'a> ApplyBatch<'a> {
    fn new(db: &'a DB) -> Result<Self, StoreError> {
        Ok(Self {
            db,
            batch: WriteBatch::default(),
            dedup: HashMap::new(),
            messages: HashMap::new(),
            cursors: HashMap::new(),
            cf_dedup: cf(db, CF_DEDUP)?,
            cf_messages: cf(db, CF_MESSAGES)?,
            cf_cursors: cf(db, CF_CURSORS)?,
        })
    }
}

impl SmStore for ApplyBatch<'_> {
    fn dedup_get(&self, topic_id: u64, id: &str) -> Result<Option<u64>, StoreError> {
        let key = topic_scoped_key(topic_id, id);
        if let Some(pending) = self.dedup.get(&key) {
            return Ok(*pending);
        }
        Ok(self.db.get_pinned_cf(self.cf_dedup, &key)?.as_deref().and_then(decode_u64))
    }

    /// One batched RocksDB read for the ids of a multi-message publish: it probes the memtables
    /// and each file's bloom filter for all keys together, in key order, instead of one full
    /// lookup per message.
    fn dedup_prefetch<'i>(&mut self, topic_id: u64, ids: impl Iterator<Item = &'i str>) -> Result<(), StoreError> {
        let mut keys: Vec<Vec<u8>> =
            ids.map(|id| topic_scoped_key(topic_id, id)).filter(|key| !self.dedup.contains_key(key)).collect();
        if keys.is_empty() {
            return Ok(());
        }
        keys.sort_unstable();
        keys.dedup();
        let values = self.db.batched_multi_get_cf(self.cf_dedup, &keys, true);
        for (key, value) in keys.into_iter().zip(values) {
            let sequence = value?.as_deref().and_then(decode_u64);
            self.dedup.insert(key, sequence);
        }
        Ok(())
    }

    fn dedup_put(&mut self, topic_id: u64, id: &str, sequence: u64) {
        let key = topic_scoped_key(topic_id, id);
        self.batch.put_cf(self.cf_dedup, &key, sequence.to_be_bytes());
        self.dedup.insert(key, Some(sequence));
    }

    fn dedup_delete(&mut self, topic_id: u64, id: &str) {
        let key = topic_scoped_key(topic_id, id);
        self.batch.delete_cf(self.cf_dedup, &key);
        self.dedup.insert(key, None);
    }

    fn message_put(&mut self, topic_id: u64, sequence: u64, message: StoredMessage) {
        self.batch.put_cf(self.cf_messages, message_key(topic_id, sequence), message.encode());
        let meta =
            MessageMeta { id: message.id, payload_bytes: message.payload.len() as u64, stored_at: message.stored_at };
        self.messages.insert((topic_id, sequence), meta);
    }

    fn message_meta(&self, topic_id: u64, sequence: u64) -> Result<Option<MessageMeta>, StoreError> {
        if let Some(meta) = self.messages.get(&(topic_id, sequence)) {
            return Ok(Some(meta.clone()));
        }
        match self.db.get_pinned_cf(self.cf_messages, message_key(topic_id, sequence))? {
            Some(bytes) => Ok(Some(StoredMessage::decode_meta(&bytes)?)),
            None => Ok(None),
        }
    }

    fn messages_delete(&mut self, topic_id: u64, from: u64, to: u64) {
        self.batch.delete_range_cf(self.cf_messages, message_key(topic_id, from), message_key(topic_id, to));
        for sequence in from..to {
            self.messages.remove(&(topic_id, sequence));
        }
    }

    fn cursor_get(&self, topic_id: u64, subscriber_id: &str) -> Result<Option<u64>, StoreError> {
        let key = topic_scoped_key(topic_id, subscriber_id);
        if let Some(pending) = self.cursors.get(&key) {
            return Ok(*pending);
        }
        Ok(self.db.get_pinned_cf(self.cf_cursors, &key)?.as_deref().and_then(decode_u64))
    }

    fn cursor_put(&mut self, topic_id: u64, subscriber_id: &str, sequence: u64) {
        let key = topic_scoped_key(topic_id, subscriber_id);
        self.batch.put_cf(self.cf_cursors, &key, sequence.to_be_bytes());
        self.cursors.insert(key, Some(sequence));
    }

    fn cursor_delete(&mut self, topic_id: u64, subscriber_id: &str) {
        let key = topic_scoped_key(topic_id, subscriber_id);
        self.batch.delete_cf(self.cf_cursors, &key);
        self.cursors.insert(key, None);
    }
}

/// The file a snapshot is kept in. A received snapshot's id comes from the leader: only
/// `[A-Za-z0-9_-]` and inner dots are kept as they are, so no id names a file outside the
/// snapshot directory (`../x`, `/x`). The ids this code makes are kept whole.
fn snapshot_file_name(snapshot_id: &str) -> String {
    let safe: String = snapshot_id
        .chars()
        .enumerate()
        .map(|(i, c)| match c {
            'A'..='Z' | 'a'..='z' | '0'..='9' | '_' | '-' => c,
            '.' if i > 0 => c,
            _ => '_',
        })
        .collect();
    format!("{safe}.snap")
}

impl SnapshotFiles {
    fn path(&self, snapshot_id: &str) -> PathBuf {
        self.dir.join(snapshot_file_name(snapshot_id))
    }

    fn current_meta(&self) -> Result<Option<SnapshotMeta>, StoreError> {
        match self.db.get_cf(cf(&self.db, CF_SM_META)?, SNAPSHOT_META)? {
            Some(b) => Ok(Some(bincode::deserialize(&b).map_err(StoreError::decode("snapshot meta"))?)),
            None => Ok(None),
        }
    }

    /// Records `meta` as the current snapshot if it is newer, and removes older files.
    ///
    /// One of the same or an older log id is refused: a build that read the state machine
    /// while an install was writing it holds part of the installed data only, and must not
    /// replace the installed file (an install of many batches clears `last_applied` in its
    /// first and writes it in its last, so such a build names no newer log id).
    fn set_current(&self, meta: &SnapshotMeta) -> Result<bool, StoreError> {
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(current) = self.current_meta()? {
            if current.last_log_id >= meta.last_log_id {
                return Ok(false);
            }
        }
        self.db.put_cf_opt(cf(&self.db, CF_SM_META)?, SNAPSHOT_META, encode(meta)?, &crate::db::synced())?;
        self.remove_other_files(Some(&meta.snapshot_id))?;
        Ok(true)
    }

    /// Removes every snapshot file but `keep_id`'s (all of them for `None`).
    fn remove_other_files(&self, keep_id: Option<&str>) -> Result<(), StoreError> {
        let keep = keep_id.map(snapshot_file_name);
        for item in std::fs::read_dir(&self.dir)? {
            let item = item?;
            let name = item.file_name().to_string_lossy().into_owned();
            if name.ends_with(".snap") && keep.as_deref() != Some(name.as_str()) {
                let _ = std::fs::remove_file(item.path());
            }
        }
        Ok(())
    }

    /// Snapshot files other than the current one, which a crash or a lost race left (their
    /// removal follows the new one's record, and is not fsynced).
    fn remove_files_not_current(&self) -> Result<(), StoreError> {
        let current = self.current_meta()?.map(|meta| meta.snapshot_id);
        self.remove_other_files(current.as_deref())
    }

    /// Partial files are what a crash left of a snapshot being built or received.
    fn remove_partial_files(&self) -> Result<(), StoreError> {
        for item in std::fs::read_dir(&self.dir)? {
            let item = item?;
            if item.file_name().to_string_lossy().ends_with(".part") {
                let _ = std::fs::remove_file(item.path());
            }
        }
        Ok(())
    }

    fn redo_pending_install(&self) -> Result<(), StoreError> {
        let Some(bytes) = self.db.get_cf(cf(&self.db, CF_SM_META)?, INSTALL_PENDING)? else {
            return Ok(());
        };
        let pending: PendingInstall = bincode::deserialize(&bytes).map_err(StoreError::decode("pending install"))?;
        tracing::warn!(snapshot = %pending.meta.snapshot_id, "redoing a snapshot install interrupted by a crash");
        snapshot::install_pending(&self.db, &self.dir.join(&pending.file_name), &pending.meta)
    }

    /// Writes a snapshot of the current state and makes it current unless a newer one is.
    /// Returns the file opened: an install finishing meanwhile may remove its name.
    fn build(&self) -> Result<(SnapshotMeta, std::fs::File), StoreError> {
        let part = self.dir.join(format!("build-{}.part", unique_suffix()));
        let (last_log_id, last_membership) = snapshot::write(&self.db, &part)?;
        // Applies skip the WAL: once this snapshot exists openraft purges the log entries it
        // covers, so the state they built must be on disk first. The flush covers every apply
        // made before it, which includes everything the snapshot read.
        flush_state_machine(&self.db)?;
        let snapshot_id = match &last_log_id {
            Some(id) => format!("{}-{}-{}", id.leader_id.term, id.index, unique_suffix()),
            None => format!("empty-{}", unique_suffix()),
        };
        // Opened before the rename: an install finishing meanwhile removes every other
        // snapshot file, this one included once renamed, and the handle outlives the name.
        let file = std::fs::File::open(&part)?;
        std::fs::rename(&part, self.path(&snapshot_id))?;
        // Durable under its name before it is recorded as current and the log behind it purged.
        sync_dir(&self.dir)?;
        let meta = SnapshotMeta { last_log_id, last_membership, snapshot_id };
        if !self.set_current(&meta)? {
            // An install of a newer snapshot finished first, perhaps removing the other files
            // before this one had its name: nothing would remove it until the next start.
            // The open handle still reads it for whoever asked for this build.
            // Failing that costs disk until the next start, which removes it: not worth
            // stopping Raft for.
            if let Err(e) = std::fs::remove_file(self.path(&meta.snapshot_id)) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(snapshot = %meta.snapshot_id, error = %e, "cannot remove a superseded snapshot file");
                }
            }
        }
        Ok((meta, file))
    }
}

fn unique_suffix() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}

/// Builds snapshots from a RocksDB point-in-time view, concurrently with `apply`.
pub struct SnapshotBuilder {
    files: SnapshotFiles,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    /// # Correctness
    /// Data, `last_log_id` and membership all come from one RocksDB snapshot, so the snapshot
    /// describes exactly the state at its `last_log_id`, whatever `apply` does meanwhile.
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let files = self.files.clone();
        let (meta, file) = self.files.blocking(move || files.build()).await.map_err(sm_write_err)?;
        tracing::info!(snapshot = %meta.snapshot_id, "built snapshot");
        Ok(Snapshot { meta, snapshot: Box::new(SnapshotFile(file)) })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        Ok((self.last_applied, self.membership.clone()))
    }

    /// # Correctness
    /// When this returns, every entry's effects and the new `last_applied` are written in one
    /// atomic batch, and subscribers of the touched topics have been woken.
    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        self.apply_entries(entries).map_err(sm_write_err)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder { files: self.snapshots.clone() }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<SnapshotFile>, StorageError> {
        let path = self.snapshots.dir.join(format!("receive-{}.part", unique_suffix()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| sm_write_err(StoreError::Io(e)))?;
        // Nameless from now on: the handle is all a transfer needs, and its space goes back
        // when the transfer is installed or abandoned (a new snapshot id, the sender gave up),
        // not when the node next starts.
        std::fs::remove_file(&path).map_err(|e| sm_write_err(StoreError::Io(e)))?;
        Ok(Box::new(SnapshotFile(file)))
    }

    /// # Correctness
    /// The received data is copied to this node's own snapshot file and fsynced, then
    /// installed crash-safely (see [`snapshot::install`]).
    async fn install_snapshot(&mut self, meta: &SnapshotMeta, snapshot: Box<SnapshotFile>) -> Result<(), StorageError> {
        let mut source = snapshot.0;
        let part = self.snapshots.dir.join(format!("install-{}.part", unique_suffix()));
        let path = self.snapshots.path(&meta.snapshot_id);
        let (db, meta_owned) = (self.db.clone(), meta.clone());
        let guard_files = self.snapshots.clone();
        let files = self.snapshots.clone();
        let installs = self.installs.clone();
        // All of it off the runtime's threads: copying and checking a snapshot of gigabytes
        // takes seconds.
        let installed = files
            .blocking(move || {
                snapshot::copy_checked(&mut source, &part)?;
                // From here until the tables and the topic map are whole again (below), readers
                // of what an install clears are refused; not while the received data is copied
                // and checked, which changes nothing and may take seconds.
                installs.fetch_add(1, Ordering::SeqCst);
                // From the file's name to its install and the removal of older files, one
                // critical section: a snapshot build finishing meanwhile (`set_current`) would
                // otherwise see the received file as older than itself and remove it.
                let _guard = guard_files.lock.lock().unwrap_or_else(|e| e.into_inner());
                std::fs::rename(&part, &path)?;
                // The pending-install marker names the file: its name must be durable first.
                sync_dir(&guard_files.dir)?;
                snapshot::install(&db, &path, &meta_owned)?;
                guard_files.remove_other_files(Some(&meta_owned.snapshot_id))
            })
            .await
            .map_err(sm_write_err);
        let feeds = self.feeds.clone();
        // Readers must not see a half-loaded topic map, and a watch made meanwhile must not
        // pair the new map with a signal from before it: load, let readers back and notify
        // under the feeds lock, as apply does.
        let mut watchers = feeds.lock();
        let loaded = match installed {
            Ok(()) => self.load().map_err(read_err),
            Err(e) => Err(e),
        };
        // Raised above unless the copy failed; installs never overlap (`&mut self`). A failed
        // install stops the node (openraft takes a storage error as fatal).
        if self.installs.load(Ordering::SeqCst) % 2 == 1 {
            self.installs.fetch_add(1, Ordering::SeqCst);
        }
        loaded?;
        Feeds::notify_all(&mut watchers, &self.topics.read().unwrap_or_else(|e| e.into_inner()));
        drop(watchers);
        tracing::info!(snapshot = %meta.snapshot_id, "installed snapshot");
        Ok(())
    }

    /// # Correctness
    /// Under the lock a build's `set_current` and an install take: either records a newer
    /// snapshot and removes the current one's file, and between reading the meta and opening
    /// the file that would make the open fail (openraft stops the node when a snapshot it is
    /// about to send is missing).
    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        let files = &self.snapshots;
        let _guard = files.lock.lock().unwrap_or_else(|e| e.into_inner());
        let Some(meta) = files.current_meta().map_err(read_err)? else {
            return Ok(None);
        };
        let file = std::fs::File::open(files.path(&meta.snapshot_id)).map_err(|e| read_err(StoreError::Io(e)))?;
        Ok(Some(Snapshot { meta, snapshot: Box::new(SnapshotFile(file)) }))
    }
}

impl StateMachine {
    /// Path of the directory holding snapshot files.
    pub fn snapshot_dir(&self) -> &Path {
        &self.snapshots.dir
    }
}

/// A clean stop writes the applies still in memory to disk, and fsyncs RocksDB's WAL (the
/// commit index and purge point, written without an fsync), so that the next start has
/// nothing to redo or learn again. openraft drops the state machine after its last apply,
/// which may come after its core has stopped. A crash cannot flush, and RocksDB closing
/// flushes nothing (`db::open`): a simulated crash, which drops the state machine without
/// the flag, then loses the unflushed applies as a killed process does.
impl Drop for StateMachine {
    fn drop(&mut self) {
        if !self.clean_stop.load(Ordering::SeqCst) {
            return;
        }
        let flushed = flush_state_machine(&self.db).and_then(|()| Ok(self.db.flush_wal(true)?));
        if let Err(e) = flushed {
            tracing::warn!(error = %e, "the state machine was not flushed at the stop; the next start redoes its last applies from the log");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::snapshot_file_name;

    /// A build of the log id the current snapshot already covers (one that may have read an
    /// install half done) does not replace it; a build further along does.
    #[tokio::test]
    async fn only_a_snapshot_further_along_replaces_the_current_one() {
        use openraft::storage::RaftStateMachine;
        use openraft::{CommittedLeaderId, EntryPayload, LogId, RaftSnapshotBuilder};

        use crate::typ::Entry;
        use crate::Request;
        let dir = tempfile::tempdir().unwrap();
        let mut store = crate::open(dir.path()).unwrap();
        let entry = |index: u64| Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(Request::SetClusterId { id: "c".into() }),
        };
        store.state_machine.apply(vec![entry(1)]).await.unwrap();
        let first = store.state_machine.get_snapshot_builder().await.build_snapshot().await.unwrap().meta;
        let files = store.state_machine.snapshots.clone();
        let mut same = first.clone();
        same.snapshot_id = "1-1-other".into();
        assert!(!files.set_current(&same).unwrap(), "the same log id");
        assert_eq!(files.current_meta().unwrap().unwrap().snapshot_id, first.snapshot_id);
        assert!(files.path(&first.snapshot_id).exists(), "the current file is kept");
        store.state_machine.apply(vec![entry(2)]).await.unwrap();
        let second = store.state_machine.get_snapshot_builder().await.build_snapshot().await.unwrap().meta;
        assert_eq!(files.current_meta().unwrap().unwrap().snapshot_id, second.snapshot_id);
        assert!(!files.path(&first.snapshot_id).exists(), "the older file is removed");
    }

    /// A crash during a snapshot install, after its marker and its first batch (which clears
    /// the tables) were written, is redone from the snapshot file when the store opens: the
    /// follower then holds exactly the leader's state, and the marker is gone.
    #[tokio::test]
    async fn an_install_interrupted_by_a_crash_is_redone_at_open() {
        use openraft::storage::RaftStateMachine;
        use openraft::{CommittedLeaderId, EntryPayload, LogId, RaftSnapshotBuilder};

        use crate::db::{cf, synced};
        use crate::keys::{CF_SM_META, INSTALL_PENDING, LAST_APPLIED};
        use crate::rules::tests::{create, publish_at};
        use crate::snapshot::PendingInstall;
        use crate::typ::Entry;
        use crate::{Request, Retention};
        let entry = |index: u64, request: Request| Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(request),
        };
        let state = |reader: &crate::StoreReader| {
            let record = reader.topic("a").expect("topic a");
            let messages = reader.read_messages(record.id, 0, 1000).unwrap();
            (record, messages.into_iter().map(|(sequence, m)| (sequence, m.id)).collect::<Vec<_>>())
        };

        let (leader_dir, follower_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut leader = crate::open(leader_dir.path()).unwrap();
        let mut entries = vec![entry(1, create("a", Retention::default()))];
        entries.extend((2..=50).map(|i| entry(i, publish_at("a", &[&format!("m{i}")], 2))));
        leader.state_machine.apply(entries).await.unwrap();
        let snapshot = leader.state_machine.get_snapshot_builder().await.build_snapshot().await.unwrap();
        let leader_file = leader.state_machine.snapshots.path(&snapshot.meta.snapshot_id);

        let mut follower = crate::open(follower_dir.path()).unwrap();
        follower.state_machine.apply(vec![entry(1, create("stale", Retention::default()))]).await.unwrap();
        // On disk, so that only the redone install can clear it (closing flushes nothing).
        crate::db::flush_state_machine(&follower.state_machine.db).unwrap();
        // What a crash leaves: the received file in place, the marker naming it, and the first
        // batch of the install (`snapshot::install_pending`) written; nothing after.
        let files = follower.state_machine.snapshots.clone();
        let path = files.path(&snapshot.meta.snapshot_id);
        std::fs::copy(&leader_file, &path).unwrap();
        let pending = PendingInstall {
            file_name: path.file_name().unwrap().to_string_lossy().into_owned(),
            meta: snapshot.meta.clone(),
        };
        let db = &follower.state_machine.db;
        let meta_cf = cf(db, CF_SM_META).unwrap();
        db.put_cf_opt(meta_cf, INSTALL_PENDING, bincode::serialize(&pending).unwrap(), &synced()).unwrap();
        db.delete_cf_opt(meta_cf, LAST_APPLIED, &synced()).unwrap();
        let closed = follower.closed;
        drop((follower.log_store, follower.state_machine, follower.reader, files));
        assert!(closed.wait(std::time::Duration::from_secs(5)).await);

        let mut reopened = crate::open(follower_dir.path()).unwrap();
        assert_eq!(state(&reopened.reader), state(&leader.reader));
        assert!(reopened.reader.topic("stale").is_none());
        let meta_cf = cf(&reopened.state_machine.db, CF_SM_META).unwrap();
        assert!(reopened.state_machine.db.get_cf(meta_cf, INSTALL_PENDING).unwrap().is_none());
        let current = reopened.state_machine.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(current.meta, snapshot.meta);
    }

    #[test]
    fn a_snapshot_id_never_names_a_file_outside_the_snapshot_directory() {
        // What this code makes, kept whole.
        assert_eq!(snapshot_file_name("3-1042-1764950400123456789"), "3-1042-1764950400123456789.snap");
        assert_eq!(snapshot_file_name("empty-17649504001"), "empty-17649504001.snap");
        for hostile in ["../../etc/passwd", "/tmp/x", "..", ".hidden", "a/../../b", "a\\b", "x\0y"] {
            let name = snapshot_file_name(hostile);
            assert!(!name.contains(['/', '\\', '\0']) && !name.starts_with('.'), "{hostile}: {name}");
            assert_eq!(std::path::Path::new(&name).components().count(), 1, "{hostile}: {name}");
        }
    }
}
