//! The openraft type configuration and the aliases used across the workspace.

use std::fmt;
use std::io::Cursor;

use serde::{Deserialize, Serialize};

use crate::command::{Request, Response};

/// A Raft node id (`--id N`, shown as `"node-N"` in JSON).
pub type NodeId = u64;

/// What the membership records about a node: where peers and clients reach it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    /// The `--advertise HOST:PORT` of the node: client API, subscriptions and Raft RPC.
    pub addr: String,
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.addr)
    }
}

openraft::declare_raft_types!(
    /// The cluster's Raft types: commands are [`Request`], results [`Response`], and a
    /// snapshot is a file on disk, streamed in chunks.
    pub TypeConfig:
        D = Request,
        R = Response,
        NodeId = NodeId,
        Node = Node,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = crate::snapshot::SnapshotFile,
        AsyncRuntime = crate::runtime::Runtime,
);

// `declare_raft_types!` names `Cursor` in its defaults even when they are overridden.
#[allow(dead_code)]
type _Unused = Cursor<Vec<u8>>;

pub type Entry = openraft::Entry<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type Vote = openraft::Vote<NodeId>;
pub type StorageError = openraft::StorageError<NodeId>;
pub type StoredMembership = openraft::StoredMembership<NodeId, Node>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, Node>;
pub type Snapshot = openraft::Snapshot<TypeConfig>;
pub type Raft = openraft::Raft<TypeConfig>;
pub type RaftMetrics = openraft::RaftMetrics<NodeId, Node>;
pub type RaftError<E = openraft::error::Infallible> = openraft::error::RaftError<NodeId, E>;
pub type RPCError<E = openraft::error::Infallible> = openraft::error::RPCError<NodeId, Node, RaftError<E>>;
pub type ClientWriteError = openraft::error::ClientWriteError<NodeId, Node>;
pub type ForwardToLeader = openraft::error::ForwardToLeader<NodeId, Node>;
pub type InitializeError = openraft::error::InitializeError<NodeId, Node>;
pub type InstallSnapshotError = openraft::error::InstallSnapshotError;
pub type AppendEntriesRequest = openraft::raft::AppendEntriesRequest<TypeConfig>;
pub type AppendEntriesResponse = openraft::raft::AppendEntriesResponse<NodeId>;
pub type VoteRequest = openraft::raft::VoteRequest<NodeId>;
pub type VoteResponse = openraft::raft::VoteResponse<NodeId>;
pub type InstallSnapshotRequest = openraft::raft::InstallSnapshotRequest<TypeConfig>;
pub type InstallSnapshotResponse = openraft::raft::InstallSnapshotResponse<NodeId>;
pub type ClientWriteResponse = openraft::raft::ClientWriteResponse<TypeConfig>;
