//! A stopping leader hands its leadership over (Raft's leadership transfer, Ongaro's thesis
//! §3.10), so that a rolling restart costs writes a round trip instead of an election timeout.
//!
//! Without it the followers of a stopped leader wait out its lease and their election timeout
//! (1–2 s by default) before one stands. With it:
//! 1. [`prepare`], while Raft still runs: wait briefly for a voter to hold the leader's whole
//!    log, the successor.
//! 2. The caller stops Raft: from then on the leader sends nothing, so no heartbeat renews its
//!    lease behind the hand-over.
//! 3. [`Handover::run`]: tell the other voters that the leader stepped down (they stop waiting
//!    out its lease, which would make them refuse every vote), then, as soon as enough of them
//!    have taken it to elect the successor, the successor, which stands at once and gets their
//!    votes (when too few took it, the successor is told of the step-down but not to stand).
//!    A dead voter does not hold the successor back for its timeout.
//!
//! Safety does not rest on any of this: a vote is still granted only to a candidate whose log
//! is at least as up to date, once per term. If the hand-over fails (the successor died, or
//! another voter got ahead of it), the voters elect a leader as they would have anyway.

use std::collections::BTreeMap;

use futures_util::stream::{FuturesUnordered, StreamExt};
use raft_store::typ::{Raft, Vote};
use raft_store::NodeId;

use super::codec::{RpcRequest, RpcResponse};
use super::network::PeerPool;
use crate::limits::{HANDOVER_CATCH_UP_TIMEOUT, HANDOVER_RPC_TIMEOUT};

/// A leader's hand-over, ready to run once its Raft has stopped.
#[derive(Debug)]
pub struct Handover {
    /// The stopping leader's vote: a voter still following it takes the hand-over.
    vote: Vote,
    /// The voter that stands for election: `(id, Raft address)`.
    successor: (NodeId, String),
    /// Every voter but this node and the successor.
    others: Vec<(NodeId, String)>,
}

/// When this node leads a cluster with other voters: waits up to [`HANDOVER_CATCH_UP_TIMEOUT`]
/// for one of them to hold the whole log, and names the most up-to-date one the successor.
/// `None` when this node does not lead or leads alone.
pub async fn prepare(raft: &Raft, me: NodeId) -> Option<Handover> {
    let caught_up = |m: &openraft::RaftMetrics<NodeId, raft_store::Node>| {
        m.current_leader != Some(me) || successor(m, me).is_some_and(|(_, matched)| matched >= m.last_log_index)
    };
    // Timing out is fine: the most up-to-date voter is still the best choice.
    let _ = raft.wait(Some(HANDOVER_CATCH_UP_TIMEOUT)).metrics(caught_up, "a voter holds the whole log").await;
    let metrics = raft.metrics().borrow().clone();
    if metrics.current_leader != Some(me) {
        return None;
    }
    let (successor, _) = successor(&metrics, me)?;
    let membership = metrics.membership_config.membership();
    let address = |id: NodeId| membership.get_node(&id).map(|node| (id, node.addr.clone()));
    let others = membership.voter_ids().filter(|&id| id != me && id != successor).filter_map(address).collect();
    Some(Handover { vote: metrics.vote, successor: address(successor)?, others })
}

/// Of `voters` (the stopping leader and the successor included), how many others must stop
/// waiting out the leader's lease for the successor to win: a majority less its own vote (the
/// stopping leader votes for nobody).
fn others_needed(voters: usize) -> usize {
    voters / 2
}

/// The voter other than `me` whose replicated log reaches furthest, with that index (`None`
/// when this node is the only voter or does not lead). In a joint configuration, a voter of
/// the final one first: one being removed would finish the change by removing itself
/// (raft/joint.rs) and cost a second election.
fn successor(metrics: &openraft::RaftMetrics<NodeId, raft_store::Node>, me: NodeId) -> Option<(NodeId, Option<u64>)> {
    let replication: &BTreeMap<NodeId, _> = metrics.replication.as_ref()?;
    let membership = metrics.membership_config.membership();
    let staying = super::joint::final_voters(membership);
    membership
        .voter_ids()
        .filter(|&id| id != me)
        .map(|id| (id, replication.get(&id).cloned().flatten().map(|log_id| log_id.index)))
        .max_by_key(|&(id, matched)| (staying.contains(&id), matched, std::cmp::Reverse(id)))
}

impl Handover {
    /// Tells the voters that this leader stepped down: the others first, then the successor
    /// once enough of them took it (the rest are still told, alongside). Call once this node's
    /// Raft has stopped. Returns whether the successor took it; failures are logged, and the
    /// voters then elect as usual.
    pub async fn run(self, peers: &PeerPool) -> bool {
        let vote = self.vote;
        let step_down = |(id, addr): (NodeId, String), elect: bool| async move {
            let request = RpcRequest::StepDown { target: id, vote, elect };
            match peers.conn(id, &addr).call(request, HANDOVER_RPC_TIMEOUT).await {
                Ok(RpcResponse::SteppedDown) => true,
                // A voter that could not read the request (an older build), whose Raft has
                // stopped, or that is not `id` (a stale address) did not take it: counting it
                // would let the successor stand
                // before enough voters stopped waiting out the lease.
                Ok(other) => {
                    tracing::warn!(node = id, answer = ?other, "a voter did not take this leader's step-down");
                    false
                }
                Err(e) => {
                    tracing::warn!(node = id, error = %e, "could not tell a voter that this leader stepped down");
                    false
                }
            }
        };
        // The others first: had the successor's vote request reached them before, they would
        // have refused it on the lease.
        let needed = others_needed(self.others.len() + 2);
        let mut others: FuturesUnordered<_> = self.others.into_iter().map(|peer| step_down(peer, false)).collect();
        let mut told = 0;
        while told < needed {
            match others.next().await {
                Some(took) => told += usize::from(took),
                None => break,
            }
        }
        let successor = self.successor.0;
        // Told to stand only when enough others took it: otherwise those still holding the
        // lease would refuse its vote, and the term would go up for nothing.
        let elect = told >= needed;
        let (took, _) = futures_util::join!(step_down(self.successor, elect), others.collect::<Vec<_>>());
        if took {
            tracing::info!(successor, %vote, others_told = told, "handed leadership over");
        }
        took
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use openraft::{CommittedLeaderId, LogId, Membership, RaftMetrics, StoredMembership};
    use raft_store::Node;

    use super::*;

    fn metrics(me: NodeId, matched: &[(NodeId, Option<u64>)]) -> RaftMetrics<NodeId, Node> {
        let voters: BTreeSet<NodeId> = std::iter::once(me).chain(matched.iter().map(|&(id, _)| id)).collect();
        let nodes: BTreeMap<NodeId, Node> =
            voters.iter().map(|&id| (id, Node { addr: format!("127.0.0.1:{}", 9000 + id) })).collect();
        let mut m = RaftMetrics::new_initial(me);
        m.current_leader = Some(me);
        m.membership_config = std::sync::Arc::new(StoredMembership::new(None, Membership::new(vec![voters], nodes)));
        let log_id = |index| LogId::new(CommittedLeaderId::new(1, me), index);
        m.replication = Some(matched.iter().map(|&(id, index)| (id, index.map(log_id))).collect());
        m
    }

    #[test]
    fn the_successor_is_the_voter_furthest_along() {
        assert_eq!(successor(&metrics(1, &[(2, Some(5)), (3, Some(7))]), 1), Some((3, Some(7))));
        assert_eq!(successor(&metrics(1, &[(2, Some(7)), (3, None)]), 1), Some((2, Some(7))));
        // Equally far: the lower id, so the choice does not depend on map order.
        assert_eq!(successor(&metrics(2, &[(1, Some(4)), (3, Some(4))]), 2), Some((1, Some(4))));
    }

    #[test]
    fn in_a_joint_configuration_the_successor_is_a_voter_that_stays() {
        // Joint {1, 2, 3} → {1, 2}: node 3, furthest along, is being removed.
        let mut m = metrics(1, &[(2, Some(5)), (3, Some(7))]);
        let nodes: BTreeMap<NodeId, Node> =
            m.membership_config.membership().nodes().map(|(id, n)| (*id, n.clone())).collect();
        let joint = Membership::new(vec![BTreeSet::from([1, 2, 3]), BTreeSet::from([1, 2])], nodes);
        m.membership_config = std::sync::Arc::new(StoredMembership::new(None, joint));
        assert_eq!(successor(&m, 1), Some((2, Some(5))));
    }

    #[test]
    fn the_successor_waits_for_a_majority_with_its_own_vote() {
        // 3 voters: the successor and one other; 5: the successor and two others.
        assert_eq!(others_needed(3), 1);
        assert_eq!(others_needed(4), 2);
        assert_eq!(others_needed(5), 2);
    }

    /// A mock voter at the returned address: answers every request with `answer()` after
    /// `delay`, and sends the time each request arrived, with its `elect`, to `heard`.
    async fn voter(
        answer: fn() -> RpcResponse,
        delay: std::time::Duration,
        heard: tokio::sync::mpsc::UnboundedSender<(bool, tokio::time::Instant)>,
    ) -> String {
        use futures_util::SinkExt;
        use tokio_tungstenite::tungstenite::Message;

        use crate::raft::codec::{decode, encode, Frame};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address").to_string();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else { continue };
                let heard = heard.clone();
                tokio::spawn(async move {
                    while let Some(Ok(message)) = ws.next().await {
                        let Message::Binary(bytes) = message else { continue };
                        let Ok(frame) = decode::<RpcRequest>(&bytes) else { continue };
                        let elect = matches!(frame.body, RpcRequest::StepDown { elect: true, .. });
                        let _ = heard.send((elect, tokio::time::Instant::now()));
                        tokio::time::sleep(delay).await;
                        let answer = encode(&Frame { id: frame.id, body: answer() }).expect("encode");
                        let _ = ws.send(Message::Binary(answer.into())).await;
                    }
                });
            }
        });
        addr
    }

    /// Of five voters, the successor needs two others to have taken the step-down. A voter
    /// that could not read it (an older build) has not: the successor is told only once a
    /// second voter has, here the slow one.
    #[tokio::test]
    async fn a_voter_that_cannot_read_the_step_down_does_not_count() {
        successor_waits_for_the_slow_voter_beside(|| RpcResponse::Undecodable).await;
    }

    /// Nor does a voter whose Raft has stopped.
    #[tokio::test]
    async fn a_voter_whose_raft_stopped_does_not_count() {
        successor_waits_for_the_slow_voter_beside(|| RpcResponse::StepDownRefused).await;
    }

    /// Five voters: the successor, one that answers `not_taken()`, a quick one and a slow one.
    async fn successor_waits_for_the_slow_voter_beside(not_taken: fn() -> RpcResponse) {
        use std::time::Duration;
        const SLOW: Duration = Duration::from_millis(300);
        let (heard, mut told) = tokio::sync::mpsc::unbounded_channel();
        let none = tokio::sync::mpsc::unbounded_channel().0;
        let not_taking = voter(not_taken, Duration::ZERO, none.clone()).await;
        let quick = voter(|| RpcResponse::SteppedDown, Duration::ZERO, none.clone()).await;
        let slow = voter(|| RpcResponse::SteppedDown, SLOW, none).await;
        let successor = voter(|| RpcResponse::SteppedDown, Duration::ZERO, heard).await;
        let handover = Handover {
            vote: Vote::new_committed(3, 1),
            successor: (5, successor),
            others: vec![(2, not_taking), (3, quick), (4, slow)],
        };
        let intro = super::super::network::Introduction { secret: None, cluster_id: std::sync::Arc::new(|| None) };
        let peers = PeerPool::new(crate::net::Env::production(None), intro);
        let started = tokio::time::Instant::now();
        assert!(handover.run(&peers).await, "the successor took it");
        let (elect, at) = told.recv().await.expect("the successor was told");
        assert!(elect, "told to stand");
        assert!(at - started >= SLOW, "told {:?} after the start, before the slow voter took it", at - started);
    }

    /// Three voters whose other one does not take the step-down: the successor is told of it,
    /// but not to stand (it would be refused on the lease, in a term raised for nothing).
    #[tokio::test]
    async fn the_successor_is_not_told_to_stand_when_too_few_others_took_it() {
        let (heard, mut told) = tokio::sync::mpsc::unbounded_channel();
        let none = tokio::sync::mpsc::unbounded_channel().0;
        let not_taking = voter(|| RpcResponse::StepDownRefused, std::time::Duration::ZERO, none).await;
        let successor = voter(|| RpcResponse::SteppedDown, std::time::Duration::ZERO, heard).await;
        let handover =
            Handover { vote: Vote::new_committed(3, 1), successor: (3, successor), others: vec![(2, not_taking)] };
        let intro = super::super::network::Introduction { secret: None, cluster_id: std::sync::Arc::new(|| None) };
        let peers = PeerPool::new(crate::net::Env::production(None), intro);
        assert!(handover.run(&peers).await, "the successor took the step-down");
        let (elect, _) = told.recv().await.expect("the successor was told");
        assert!(!elect, "told to stand with too few others");
    }

    #[test]
    fn a_leader_alone_has_no_successor() {
        assert_eq!(successor(&metrics(1, &[]), 1), None);
    }
}
