//! The leader's proposer: concurrent writes become one Raft entry.
//!
//! openraft 0.9 appends each proposed entry on its own and waits for that append's fsync
//! before it takes the next one, so proposing every publish as its own entry caps a leader at
//! one fsync per publish. The proposer queues writes; one task takes everything queued (up to
//! [`PROPOSAL_REQUESTS_MAX`] writes or [`PROPOSAL_BYTES_MAX`] bytes) and proposes it as a single
//! [`Request::Batch`] entry, applied exactly as if each write were its own entry, in queue order.
//! A write that arrives alone is proposed alone, so a lone client pays no extra latency. At most
//! [`PROPOSALS_IN_FLIGHT_MAX`] entries are in flight; the next batch fills while they commit.

use std::sync::Arc;

use openraft::error::{ClientWriteError, RaftError};
use raft_store::typ::Raft;
use raft_store::{Node, NodeId, Request, Response};
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::limits::{PROPOSALS_IN_FLIGHT_MAX, PROPOSAL_BYTES_MAX, PROPOSAL_QUEUE_LEN, PROPOSAL_REQUESTS_MAX};

/// A committed and applied write.
#[derive(Debug, Clone)]
pub struct Committed {
    /// Index of the log entry that carried the write.
    pub log_index: u64,
    pub response: Response,
}

/// Why a proposed write did not commit.
#[derive(Debug, Clone)]
pub enum ProposeFailure {
    /// This node is not (or no longer) the leader; the entry, if appended, may still commit
    /// under the next leader.
    ForwardToLeader {
        leader_id: Option<NodeId>,
        leader_node: Option<Node>,
    },
    /// Raft stopped.
    Fatal(String),
    Other(String),
}

struct Pending {
    request: Request,
    reply: oneshot::Sender<Result<Committed, ProposeFailure>>,
}

/// Handle to the proposer task.
pub struct Proposer {
    queue: mpsc::Sender<Pending>,
}

impl Proposer {
    pub fn spawn(raft: Raft) -> Self {
        let (queue, rx) = mpsc::channel(PROPOSAL_QUEUE_LEN);
        tokio::spawn(run(raft, rx));
        Self { queue }
    }

    /// Proposes `request` and waits until it is committed and applied on this node.
    pub async fn propose(&self, request: Request) -> Result<Committed, ProposeFailure> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Pending { request, reply })
            .await
            .map_err(|_| ProposeFailure::Fatal("the proposer stopped".into()))?;
        answer.await.map_err(|_| ProposeFailure::Fatal("the proposer dropped the write".into()))?
    }
}

async fn run(raft: Raft, mut rx: mpsc::Receiver<Pending>) {
    let permits = Arc::new(Semaphore::new(PROPOSALS_IN_FLIGHT_MAX));
    while let Some(first) = rx.recv().await {
        let Ok(permit) = permits.clone().acquire_owned().await else { return };
        // Everything that queued while the previous entries were in flight goes in this one.
        let mut bytes = first.request.approx_bytes();
        let mut batch = vec![first];
        while batch.len() < PROPOSAL_REQUESTS_MAX && bytes < PROPOSAL_BYTES_MAX {
            match rx.try_recv() {
                Ok(next) => {
                    bytes += next.request.approx_bytes();
                    batch.push(next);
                }
                Err(_) => break,
            }
        }
        let raft = raft.clone();
        tokio::spawn(async move {
            let _permit = permit;
            propose(&raft, batch).await;
        });
    }
}

fn failure(e: RaftError<NodeId, ClientWriteError<NodeId, Node>>) -> ProposeFailure {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
            ProposeFailure::ForwardToLeader { leader_id: f.leader_id, leader_node: f.leader_node }
        }
        RaftError::APIError(e) => ProposeFailure::Other(e.to_string()),
        RaftError::Fatal(e) => ProposeFailure::Fatal(e.to_string()),
    }
}

async fn propose(raft: &Raft, mut batch: Vec<Pending>) {
    if batch.len() == 1 {
        let Some(one) = batch.pop() else { return };
        let result = raft.client_write(one.request).await;
        let _ =
            one.reply.send(result.map(|r| Committed { log_index: r.log_id.index, response: r.data }).map_err(failure));
        return;
    }
    let (requests, replies): (Vec<Request>, Vec<_>) = batch.into_iter().map(|p| (p.request, p.reply)).unzip();
    let count = requests.len();
    match raft.client_write(Request::Batch(requests)).await {
        Ok(written) => {
            let log_index = written.log_id.index;
            let responses = match written.data {
                Response::Batch(responses) if responses.len() == count => responses,
                other => {
                    let e = ProposeFailure::Other(format!("a batch of {count} was applied as {other:?}"));
                    for reply in replies {
                        let _ = reply.send(Err(e.clone()));
                    }
                    return;
                }
            };
            for (reply, response) in replies.into_iter().zip(responses) {
                let _ = reply.send(Ok(Committed { log_index, response }));
            }
        }
        Err(e) => {
            let e = failure(e);
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}
