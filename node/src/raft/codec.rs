//! The inter-node RPC messages: the seed's `request_vote`, `append_entries` and
//! `install_snapshot` (as openraft's own types), plus `forward` for writes a follower hands
//! to the leader, `pre_vote`, a vote request that changes nothing, and `step_down`, a
//! stopping leader's hand-over. Each travels as one binary WebSocket message: a bincode
//! [`Frame`].

use raft_store::typ::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotError, InstallSnapshotRequest, InstallSnapshotResponse,
    RaftError, Vote, VoteRequest, VoteResponse,
};
use raft_store::{NodeId, Request, Response};
use serde::{Deserialize, Serialize};

/// A request or response with the id that pairs them on a multiplexed connection.
#[derive(Debug, Serialize, Deserialize)]
pub struct Frame<T> {
    pub id: u64,
    pub body: T,
}

/// What a node asks a peer. `target` is the node id the sender believes it is talking to:
/// a node that is not `target` refuses, so a wrong address can never make a node replicate
/// to itself or to a stranger.
#[derive(Debug, Serialize, Deserialize)]
pub enum RpcRequest {
    Vote {
        target: NodeId,
        req: VoteRequest,
    },
    AppendEntries {
        target: NodeId,
        req: AppendEntriesRequest,
    },
    InstallSnapshot {
        target: NodeId,
        req: InstallSnapshotRequest,
    },
    /// A write proposed by a follower (coalesced acks, retention ticks).
    Forward {
        req: Request,
    },
    /// Would the target grant this vote now? Changes nothing on it (openraft as patched,
    /// `vendor/openraft/PATCHED.md`). Added last, so the other messages keep their encoding.
    PreVote {
        target: NodeId,
        req: VoteRequest,
    },
    /// The leader whose vote is `vote` is stopping and hands over (`handover.rs`): the target
    /// stops waiting out its lease, and with `elect` stands for election at once. Added last.
    StepDown {
        target: NodeId,
        vote: Vote,
        elect: bool,
    },
    /// The target's own clock, for the voters' agreement on the time (`cluster_clock.rs`).
    /// Added last.
    Clock {
        target: NodeId,
    },
}

#[derive(Debug, Serialize, Deserialize)]
pub enum RpcResponse {
    Vote(Result<VoteResponse, RaftError>),
    AppendEntries(Result<AppendEntriesResponse, RaftError>),
    InstallSnapshot(Result<InstallSnapshotResponse, RaftError<InstallSnapshotError>>),
    Forward(Result<ForwardReply, ForwardError>),
    /// The receiver is not the node the request was addressed to.
    WrongNode {
        actual: NodeId,
    },
    PreVote(Result<VoteResponse, RaftError>),
    /// The receiver could not read the request (a message of a newer build, during a rolling
    /// upgrade): only that request fails, not the connection. Added last.
    Undecodable,
    /// A `StepDown` was passed to the target's Raft (which ignores it if it follows another
    /// leader by now). Added last.
    SteppedDown,
    /// The target's Raft has stopped: it did not take the `StepDown`. Added last.
    StepDownRefused,
    /// The answer to `Clock`: the target's own clock, ms since the Unix epoch. Added last.
    Clock {
        now_ms: u64,
    },
}

#[derive(Debug, Serialize, Deserialize)]
pub struct ForwardReply {
    pub log_index: u64,
    pub response: Response,
}

#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error)]
pub enum ForwardError {
    #[error("not the leader")]
    NotLeader,
    #[error("not committed in time")]
    Timeout,
    #[error("{0}")]
    Failed(String),
}

pub fn encode<T: Serialize>(frame: &Frame<T>) -> Result<Vec<u8>, bincode::Error> {
    bincode::serialize(frame)
}

pub fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<Frame<T>, bincode::Error> {
    bincode::deserialize(bytes)
}

/// The id of a frame whose body does not decode: bincode writes it first, as 8 bytes
/// little-endian. `None` when the frame is too short to hold one.
pub fn frame_id(bytes: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body this build does not know (a variant added by a later one) still yields its id.
    #[test]
    fn the_id_of_an_undecodable_frame_is_read() {
        let mut bytes = encode(&Frame { id: 4242, body: RpcResponse::WrongNode { actual: 1 } }).unwrap();
        bytes[8..12].copy_from_slice(&999u32.to_le_bytes());
        assert!(decode::<RpcResponse>(&bytes).is_err());
        assert_eq!(frame_id(&bytes), Some(4242));
        assert_eq!(frame_id(&bytes[..7]), None);
    }
}
