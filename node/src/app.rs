//! The state every handler shares, and the two questions most of them ask: who leads, and
//! did my write commit.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use openraft::{RaftMetrics, ServerState};
use raft_store::typ::Raft;
use raft_store::{NodeId, Request, StoreReader};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::error::ApiError;
use crate::limits::{LEADER_CATCH_UP_TIMEOUT, WRITE_TIMEOUT};
use crate::metrics::Metrics;
use crate::net::Env;
use crate::propose::{Committed, ProposeFailure};
use crate::raft::network::PeerPool;
use crate::subscribe::acks::AckCoalescer;

pub type SharedApp = Arc<App>;

pub struct App {
    pub config: Config,
    pub raft: Raft,
    /// Batches this node's writes into Raft entries while it leads.
    pub proposer: crate::propose::Proposer,
    /// Applied state: what every read and subscription serves from.
    pub reader: StoreReader,
    /// Highest commit index this node knows (from the log store).
    pub committed_index: Arc<AtomicU64>,
    /// The Raft log's segment files, for their size in `/metrics`.
    pub log_files: raft_store::LogFiles,
    pub env: Env,
    /// The node's clock as the voters agree on it: see [`App::now_ms`].
    pub clock: crate::cluster_clock::ClusterClock,
    pub peers: Arc<PeerPool>,
    pub metrics: Metrics,
    pub acks: AckCoalescer,
    /// Serialized message frames shared by the subscribers of each topic.
    pub frames: crate::subscribe::cache::FrameCache,
    /// (topic, id) of single publishes proposed on this node and not yet answered: a second
    /// publish of the same id meanwhile is a duplicate even though it has no sequence yet.
    pub inflight: Mutex<HashSet<(String, String)>>,
    /// When the last leaderless spell long enough to move this node's subscriptions elsewhere
    /// began (`subscribe/leaderless.rs`): a session open then closes when it is marked.
    pub leaderless_spells: tokio::sync::watch::Sender<Option<tokio::time::Instant>>,
    /// When this node last took an AppendEntries or a snapshot from its leader: with pre-vote
    /// a follower cut off from the others keeps its leader (and term) until it hears another.
    pub leader_heard: Mutex<tokio::time::Instant>,
    /// Cancelled on shutdown: subscriptions close with 1001, background tasks stop.
    pub shutdown: CancellationToken,
    /// Open subscriptions on this node.
    pub subscriptions: AtomicUsize,
    /// Places for publishing WebSockets, one taken by each open connection (see
    /// [`crate::limits::PUBLISH_WS_CONNECTIONS_MAX`]).
    pub publishing_connections: Arc<tokio::sync::Semaphore>,
    /// Told when the last open subscription ends (a stopping node waits for it before its
    /// last flush of acks).
    pub subscriptions_ended: tokio::sync::Notify,
    /// WebSockets in their close handshake (ws_close.rs): a stopping node waits for them.
    pub closing: tokio_util::task::TaskTracker,
    /// Subscribers connected to this node: (topic, subscriber id) → connections.
    pub connected: Mutex<std::collections::HashMap<(String, String), usize>>,
    /// Payload bytes of `ack=appended` publishes answered and not yet applied: a 202 does not
    /// wait for the entry, so without this bound a client looping on it could queue more
    /// than the cluster writes, without limit.
    pub appended_bytes: crate::budget::ByteBudget,
    /// Bytes of request bodies being read or still held by their requests (see
    /// [`crate::limits::REQUEST_BODIES_BYTES_MAX`]).
    pub request_bodies: crate::budget::ByteBudget,
    /// What one client address's request bodies may hold of `request_bodies` (see
    /// [`crate::limits::REQUEST_BODIES_BYTES_PER_CLIENT_MAX`]).
    pub client_request_bodies: crate::budget::PerClientBudgets,
    /// Bytes of message pages read from storage and not yet sent (subscriptions and
    /// `GET /messages`): lagging readers of large messages cannot hold the node's memory.
    pub read_pages: crate::budget::ByteBudget,
    /// What each client address's pages (`GET /messages` and `GET /topics` bodies, its
    /// subscriptions' pages read from storage) may hold of `read_pages`, so that one client that asks for pages
    /// and does not read them cannot leave none for the others.
    pub client_read_pages: crate::budget::PerClientBudgets,
    /// `/metrics` bodies built and not yet sent (see
    /// [`crate::limits::METRICS_BODIES_BYTES_MAX`]).
    pub metrics_bodies: crate::budget::ByteBudget,
    /// What each client address's `/metrics` bodies may hold of `metrics_bodies`.
    pub client_metrics_bodies: crate::budget::PerClientBudgets,
    /// Raft requests received and not yet answered, in bytes (see
    /// [`crate::limits::RAFT_INBOUND_BYTES_MAX`]).
    pub raft_inbound: crate::budget::ByteBudget,
    /// The data dir's free space against its reserve (`--min-free-bytes`): checked by the
    /// writes that make the data grow.
    pub disk_room: Arc<crate::disk_room::DiskRoom>,
    /// When this node saw each node's latest claim to be short of disk room.
    pub claims_seen: crate::disk_room::ClaimsSeen,
    /// Held by the membership change running on this node, a request's
    /// (`api/members.rs`) or the finishing of a joint configuration (`raft/joint.rs`): one at
    /// a time, as openraft takes them.
    pub membership_changes: Arc<tokio::sync::Mutex<()>>,
}

/// A write in the proposer's queue ([`App::queue_write`]), to be awaited with
/// [`App::committed`].
pub struct QueuedWrite {
    answer: crate::propose::Answer,
    started: tokio::time::Instant,
}

/// Who leads, as this node sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leadership {
    Me,
    Other { id: NodeId, addr: String },
    Unknown,
}

impl App {
    pub fn id(&self) -> NodeId {
        self.config.id
    }

    /// Whether node `id` answered this node within an election timeout (this node always
    /// does): how a leader tells a live member from a lost one, for membership changes,
    /// `/cluster` and `/metrics`.
    pub fn answers(&self, id: NodeId) -> bool {
        id == self.id() || self.peers.answered_within(id, self.answer_window())
    }

    /// The window of [`App::answers`]: one election timeout.
    pub fn answer_window(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.config.election_timeout_ms)
    }

    /// The time this node stamps on what it proposes: its clock, corrected by the voters'
    /// agreement (`cluster_clock.rs`).
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    pub fn leadership(&self) -> Leadership {
        self.leadership_in(&self.raft.metrics().borrow())
    }

    /// [`App::leadership`] as `m` shows it, for answers that must agree with other fields of
    /// the same metrics (a term read apart from its leader could pair the old leader with the
    /// new term).
    pub fn leadership_in(&self, m: &RaftMetrics<NodeId, raft_store::Node>) -> Leadership {
        match m.current_leader {
            Some(id) if id == self.id() && m.state == ServerState::Leader => {
                // openraft 0.9 keeps a leader cut off from its quorum in office until it sees a
                // higher term; a write sent to it would only time out. Past an election timeout
                // without a quorum's acknowledgement, it does not count as a leader here.
                let voters = m.membership_config.membership().voter_ids().count();
                let stale_ms = self.config.election_timeout_ms * 2;
                if voters > 1 && m.millis_since_quorum_ack.is_none_or(|ms| ms > stale_ms) {
                    Leadership::Unknown
                } else {
                    Leadership::Me
                }
            }
            Some(id) if id != self.id() => match m.membership_config.membership().get_node(&id) {
                Some(node) => Leadership::Other { id, addr: node.addr.clone() },
                None => Leadership::Unknown,
            },
            _ => Leadership::Unknown,
        }
    }

    /// Called on every AppendEntries or snapshot taken from the leader.
    pub fn heard_leader(&self) {
        *self.leader_heard.lock().unwrap_or_else(|e| e.into_inner()) = tokio::time::Instant::now();
    }

    /// True when this node knows no leader it can reach: none (or a leader of its own without
    /// its quorum, [`Leadership::Unknown`]), or one it has not heard from for `unheard` (a
    /// follower cut off from it keeps it, as pre-vote never moves it to a term of its own).
    pub fn leaderless(&self, unheard: std::time::Duration) -> bool {
        self.leaderless_since(unheard).is_some()
    }

    /// Since when this node has been [`App::leaderless`], if it is: an `unheard` after it last
    /// heard the leader it follows, whenever it is asked; now, when it knows no leader.
    pub fn leaderless_since(&self, unheard: std::time::Duration) -> Option<tokio::time::Instant> {
        let now = tokio::time::Instant::now();
        match self.leadership() {
            Leadership::Me => None,
            Leadership::Unknown => Some(now),
            Leadership::Other { .. } => {
                let since = *self.leader_heard.lock().unwrap_or_else(|e| e.into_inner()) + unheard;
                (since < now).then_some(since)
            }
        }
    }

    /// Where clients reach node `id`, whose Raft address is `raft_addr`: its
    /// `--client-addresses` entry, else that address. Everything a client is told (redirects,
    /// `/cluster`, `leader_change`) goes through here; Raft keeps the Raft address.
    pub fn client_address(&self, id: u64, raft_addr: &str) -> String {
        self.config.client_addresses.get(&id).cloned().unwrap_or_else(|| raft_addr.to_string())
    }

    /// The commit index to report beside `last_applied`: the one the log store saved, or what
    /// is applied if more (a snapshot install moves the commit index without saving it, and
    /// what is applied is committed).
    pub fn commit_index(&self, last_applied: u64) -> u64 {
        self.committed_index.load(Ordering::Relaxed).max(last_applied)
    }

    /// Ok when this node leads; otherwise the redirect (or 503) a write must answer.
    pub fn require_leader(&self, path_and_query: &str) -> Result<(), ApiError> {
        self.require_leadership(self.leadership(), path_and_query)
    }

    fn require_leadership(&self, leadership: Leadership, path_and_query: &str) -> Result<(), ApiError> {
        match leadership {
            Leadership::Me => Ok(()),
            Leadership::Other { id, addr } => Err(ApiError::NotLeader {
                leader_id: id,
                leader_address: self.client_address(id, &addr),
                path_and_query: path_and_query.into(),
            }),
            Leadership::Unknown => Err(ApiError::NoLeader),
        }
    }

    /// [`App::require_leader`] for a write checked against this node's state first (a topic
    /// that must exist, say): a leader just elected has yet to apply what the leaders before
    /// it committed, and would refuse a publish `404` to a topic created a moment before. Its
    /// own first entry, once applied, marks the end of that; it is waited for, at most
    /// [`LEADER_CATCH_UP_TIMEOUT`], then `503 no_leader`.
    pub async fn require_leader_applied(&self, path_and_query: &str) -> Result<(), ApiError> {
        let caught_up = |m: &RaftMetrics<NodeId, raft_store::Node>| {
            m.state != ServerState::Leader || m.last_applied.is_some_and(|l| l.leader_id.term == m.current_term)
        };
        // One read of the metrics on every write. Not leading (or cut off from its quorum):
        // the redirect or `no_leader` at once.
        let metrics = self.raft.metrics();
        let ready = {
            let m = metrics.borrow();
            self.require_leadership(self.leadership_in(&m), path_and_query)?;
            caught_up(&m)
        };
        if ready {
            return Ok(());
        }
        match self.raft.wait(Some(LEADER_CATCH_UP_TIMEOUT)).metrics(caught_up, "applied its own first entry").await {
            Ok(_) => self.require_leader(path_and_query),
            Err(openraft::metrics::WaitError::Timeout(..)) => Err(ApiError::NoLeader),
            Err(openraft::metrics::WaitError::ShuttingDown) => {
                Err(ApiError::Unavailable("the node is stopping".into()))
            }
        }
    }

    /// Proposes `request` and waits until it is committed on a majority and applied here.
    pub async fn write(&self, request: Request) -> Result<Committed, ApiError> {
        let queued = self.queue_write(request).await?;
        self.committed(queued).await
    }

    /// The first half of [`App::write`]: puts `request` in the proposer's queue. Writes queued
    /// one after another are applied in that order; [`App::committed`] waits for each.
    pub async fn queue_write(&self, request: Request) -> Result<QueuedWrite, ApiError> {
        let started = tokio::time::Instant::now();
        match tokio::time::timeout(WRITE_TIMEOUT, self.proposer.submit(request)).await {
            Ok(Ok(answer)) => Ok(QueuedWrite { answer, started }),
            // Only a stopped proposer refuses a write: nothing was queued.
            Ok(Err(ProposeFailure::Fatal(e) | ProposeFailure::Other(e))) => Err(ApiError::Unavailable(e)),
            Ok(Err(ProposeFailure::ForwardToLeader { .. })) => Err(ApiError::NoLeader),
            // The wait for room in the queue, cut short: nothing was queued (`submit` queues
            // in one step), so not `504 raft_timeout`, which says the write may still commit.
            Err(_) => Err(ApiError::Unavailable(format!(
                "the node's queue of writes to propose stayed full for {} ms; nothing was stored",
                WRITE_TIMEOUT.as_millis()
            ))),
        }
    }

    /// Waits until a queued write is committed on a majority and applied here, within
    /// [`WRITE_TIMEOUT`] of its queueing.
    pub async fn committed(&self, queued: QueuedWrite) -> Result<Committed, ApiError> {
        let result = tokio::time::timeout_at(queued.started + WRITE_TIMEOUT, queued.answer).await;
        self.metrics.observe_commit(queued.started.elapsed());
        match result {
            Err(_) => Err(ApiError::RaftTimeout(WRITE_TIMEOUT.as_millis())),
            Ok(Ok(Ok(committed))) => Ok(committed),
            Ok(Ok(Err(failure))) => Err(not_committed(failure)),
            Ok(Err(_)) => Err(ApiError::NotCommitted("the proposer stopped before the entry committed".into())),
        }
    }

    pub fn subscription_count(&self) -> usize {
        self.subscriptions.load(Ordering::Relaxed)
    }
}

/// The answer to a write that was queued and then failed. Once queued, an entry may have been
/// appended and sent to the followers, and a next leader may commit it, whatever the failure:
/// leadership moving (a redirect would read as "not stored", and a caller might publish again
/// under a new id), Raft stopping. So each is `not_committed`, which a client retries under the
/// same id (API.md §4).
fn not_committed(failure: ProposeFailure) -> ApiError {
    ApiError::NotCommitted(match failure {
        ProposeFailure::ForwardToLeader { .. } => "leadership changed before the entry committed".into(),
        ProposeFailure::Fatal(e) => format!("raft stopped before the entry committed: {e}"),
        ProposeFailure::Other(e) => e,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_failure_after_queueing_is_not_committed() {
        for failure in [
            ProposeFailure::ForwardToLeader { leader_id: Some(2), leader_node: None },
            ProposeFailure::ForwardToLeader { leader_id: None, leader_node: None },
            ProposeFailure::Fatal("storage".into()),
            ProposeFailure::Other("applied as something else".into()),
        ] {
            let e = not_committed(failure.clone());
            assert!(matches!(e, ApiError::NotCommitted(_)), "{failure:?} gave {e:?}");
            assert!(e.may_still_commit());
        }
    }
}

/// Removes an in-flight (topic, id) when the publish that inserted it is answered.
pub struct InflightGuard {
    app: SharedApp,
    key: (String, String),
}

impl InflightGuard {
    /// Registers (topic, id) as in flight; `None` when it already is.
    pub fn try_new(app: SharedApp, topic: &str, id: &str) -> Option<Self> {
        let key = (topic.to_string(), id.to_string());
        let inserted = app.inflight.lock().unwrap_or_else(|e| e.into_inner()).insert(key.clone());
        inserted.then_some(Self { app, key })
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.app.inflight.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.key);
    }
}

/// Why a write proposed from any node did not commit.
#[derive(Debug, thiserror::Error)]
pub enum ProposeError {
    #[error("no leader known")]
    NoLeader,
    #[error("{0}")]
    Failed(String),
}

impl App {
    /// Commits `request` through whichever node leads: locally on the leader, over the peer
    /// connection from a follower. For the node's own writes (acks, retention ticks), not for
    /// client writes, which are redirected so the client knows the leader.
    pub async fn propose_anywhere(&self, request: Request) -> Result<raft_store::Response, ProposeError> {
        match self.leadership() {
            Leadership::Me => match tokio::time::timeout(WRITE_TIMEOUT, self.proposer.propose(request)).await {
                Ok(Ok(committed)) => Ok(committed.response),
                Ok(Err(e)) => Err(ProposeError::Failed(format!("{e:?}"))),
                Err(_) => Err(ProposeError::Failed("timed out".into())),
            },
            Leadership::Other { id, addr } => {
                let conn = self.peers.conn(id, &addr);
                match conn.call(crate::raft::codec::RpcRequest::Forward { req: request }, WRITE_TIMEOUT).await {
                    Ok(crate::raft::codec::RpcResponse::Forward(Ok(reply))) => Ok(reply.response),
                    Ok(crate::raft::codec::RpcResponse::Forward(Err(e))) => Err(ProposeError::Failed(e.to_string())),
                    Ok(_) => Err(ProposeError::Failed("unexpected response".into())),
                    Err(e) => Err(ProposeError::Failed(e.to_string())),
                }
            }
            Leadership::Unknown => Err(ProposeError::NoLeader),
        }
    }
}

impl App {
    /// Subscriber ids connected to this node on `topic`.
    pub fn connected_subscribers(&self, topic: &str) -> std::collections::HashMap<String, u64> {
        let connected = self.connected.lock().unwrap_or_else(|e| e.into_inner());
        connected.keys().filter(|(t, _)| t == topic).map(|(_, s)| (s.clone(), 0)).collect()
    }
}
