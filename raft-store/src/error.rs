//! The storage crate's error type.

use std::io;

use crate::typ::StorageError;

/// Errors of the storage layer. All of them are operating conditions (disk, corruption, a
/// data dir given to the wrong node, a snapshot install in progress), never the client's fault.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("rocksdb: {0}")]
    Rocks(#[from] rocksdb::Error),
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    #[error("decode {what}: {source}")]
    Decode { what: &'static str, source: bincode::Error },
    #[error("corrupt store: {0}")]
    Corrupt(String),
    #[error("an fsync of the Raft log failed ({0}); nothing is written after it until the node restarts")]
    SyncFailed(String),
    #[error("a snapshot install is rewriting this node's state")]
    Installing,
    #[error("it holds node {stored}'s state, not node {given}'s: each node needs a data dir of its own, started with the --id it was first started with")]
    OtherNode { stored: u64, given: u64 },
}

impl StoreError {
    pub fn decode(what: &'static str) -> impl FnOnce(bincode::Error) -> StoreError {
        move |source| StoreError::Decode { what, source }
    }
}

/// openraft wants its own error type; storage failures stop the Raft node, which is what we
/// want when the disk fails.
pub fn read_err(e: impl Into<StoreError>) -> StorageError {
    openraft::StorageIOError::read(&e.into()).into()
}

pub fn write_err(e: impl Into<StoreError>) -> StorageError {
    openraft::StorageIOError::write(&e.into()).into()
}

pub fn sm_write_err(e: impl Into<StoreError>) -> StorageError {
    openraft::StorageIOError::write_state_machine(&e.into()).into()
}
