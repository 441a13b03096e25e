//! Replicated storage for the pub/sub cluster: the openraft log store (entries in segment
//! files, the vote and the purge point in RocksDB) and the pub/sub state machine over RocksDB.
//!
//! # Layout
//! - [`typ`]: the openraft type configuration and aliases, so nobody spells the generics twice.
//! - [`command`]: the commands carried in log entries ([`Request`]) and their results ([`Response`]).
//! - [`rules`]: the pub/sub rules as a pure function over a [`rules::SmStore`]; no I/O.
//! - [`keys`]: column family names and key encodings (big-endian, so RocksDB order is numeric order).
//! - [`db`]: opening RocksDB with the column families and options we rely on.
//! - [`log_store`]: [`LogStore`], openraft's `RaftLogStorage` with group-committed fsync.
//! - `segments`: the log's entries in append-only segment files.
//! - [`state_machine`]: [`StateMachine`], openraft's `RaftStateMachine`, persisted in RocksDB.
//! - `recent`: the newest log entries kept decoded, for the reads right after an append.
//! - [`reader`]: [`StoreReader`], the read side the node serves from (topics, messages, cursors).
//! - [`feeds`]: wake-ups for subscribers when entries are applied.
//! - [`snapshot`]: the snapshot file format (streamed to and from disk, never held in memory).
//! - [`runtime`]: openraft's async runtime (tokio) with an election RNG a simulation can seed.
//! - [`limits`]: every limit of the crate as a named constant.
//! - [`error`]: the crate's error type.
//!
//! See `docs/STORAGE.md` for the on-disk layout.

pub mod command;
pub mod db;
pub mod error;
pub mod feeds;
pub mod keys;
pub mod limits;
pub mod log_store;
pub mod reader;
mod recent;
pub mod rules;
pub mod runtime;
mod segments;
pub mod snapshot;
pub mod state_machine;
pub mod typ;

pub use command::{NewMessage, PublishResult, Request, Response, Retention, TopicRecord};
pub use error::StoreError;
pub use feeds::{Feeds, TopicSignal, TopicWatch};
pub use log_store::{FsyncObserver, IoMode, LogFiles, LogStore};
pub use reader::{StoreReader, StoredMessage};
pub use segments::available_bytes;
pub use state_machine::StateMachine;
pub use typ::{Node, NodeId, TypeConfig};

use std::path::Path;
use std::sync::Arc;

/// Everything a node needs from its storage, opened from one data directory.
pub struct Store {
    /// openraft's log storage.
    pub log_store: LogStore,
    /// openraft's state machine.
    pub state_machine: StateMachine,
    /// The read side for the HTTP API and subscriptions; cheap to clone.
    pub reader: StoreReader,
    /// Tells when every handle to the database is gone (RocksDB is closed).
    pub closed: Closed,
}

/// Watches for RocksDB to be closed: it closes when the last handle (log store, state
/// machine, readers) is dropped. A process must not exit while it is open: RocksDB's
/// background threads would still run while static destructors do, and abort the process.
/// Also marks a stop as clean, which decides what the state machine writes as it is dropped.
pub struct Closed {
    db: std::sync::Weak<rocksdb::DB>,
    /// Shared with the state machine, which flushes itself when dropped once this is set.
    clean_stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Closed {
    /// Makes this a clean stop: the state machine, when openraft drops it after its last
    /// apply, writes its applies to disk, so that the next start redoes none of them from
    /// the log. Without it (a crash) they are lost, as in a killed process, and redone.
    pub fn stop_cleanly(&self) {
        self.clean_stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Waits until the database is closed, polling every 10 ms, at most `timeout`.
    /// Returns whether it closed.
    pub async fn wait(&self, timeout: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        while self.db.strong_count() > 0 {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        true
    }
}

/// Opens (or creates) the store in `data_dir`.
///
/// # Correctness
/// When this returns, an interrupted snapshot install has been redone, and the state
/// machine reflects exactly the entries up to its persisted `last_applied`.
pub fn open(data_dir: &Path) -> Result<Store, StoreError> {
    open_with(data_dir, IoMode::Background)
}

/// The folder of a data dir that holds its snapshot files.
const SNAPSHOTS_DIR: &str = "snapshots";

/// Bytes of the largest snapshot file in `data_dir` (one being written or received included),
/// 0 when there is none: about what the next snapshot needs on disk again.
pub fn largest_snapshot_bytes(data_dir: &Path) -> u64 {
    let Ok(files) = std::fs::read_dir(data_dir.join(SNAPSHOTS_DIR)) else { return 0 };
    files.flatten().filter_map(|file| file.metadata().ok()).map(|meta| meta.len()).max().unwrap_or(0)
}

/// [`open`] with an explicit log sync mode.
pub fn open_with(data_dir: &Path, mode: IoMode) -> Result<Store, StoreError> {
    let db = Arc::new(db::open(&data_dir.join("db"))?);
    let feeds = Arc::new(Feeds::default());
    let log_store = LogStore::new(db.clone(), &data_dir.join("log"), mode)?;
    let state_machine = StateMachine::open(db.clone(), data_dir.join(SNAPSHOTS_DIR), feeds.clone(), mode)?;
    let reader = state_machine.reader();
    let closed = Closed { db: Arc::downgrade(&db), clean_stop: state_machine.clean_stop_flag() };
    Ok(Store { log_store, state_machine, reader, closed })
}
