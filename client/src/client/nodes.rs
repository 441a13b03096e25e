//! What the client knows about the cluster's nodes: the known addresses, the cached leader,
//! the round-robin position.

use std::collections::HashSet;
use std::sync::MutexGuard;

use url::Url;

use super::{Client, Nodes};
use crate::endpoint;
use crate::types::ClusterInfo;

impl Nodes {
    /// Where the round robin stands, within `known`. `known` is never empty: `with_config`
    /// refuses an empty seed list and the seeds always stay.
    fn position(&self) -> usize {
        self.next % self.known.len().max(1)
    }
}

impl Client {
    pub(super) fn lock_nodes(&self) -> MutexGuard<'_, Nodes> {
        // A panic while holding this lock cannot leave `Nodes` half-updated in a way that
        // matters (every field is a hint), so a poisoned lock is used as is.
        self.inner.nodes.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The next node in round-robin order.
    pub(crate) fn next_node(&self) -> Url {
        let mut nodes = self.lock_nodes();
        let index = nodes.position();
        nodes.next = index + 1;
        nodes.known[index].clone()
    }

    /// The node [`Client::next_node`] would give, without moving the round-robin position:
    /// where reads go while it answers.
    pub(crate) fn current_node(&self) -> Url {
        let nodes = self.lock_nodes();
        nodes.known[nodes.position()].clone()
    }

    /// Moves the round robin past `failed` if it stands there: the next read goes to the
    /// next node. (Another task may have moved it already.)
    pub(crate) fn move_past(&self, failed: &Url) {
        let mut nodes = self.lock_nodes();
        let index = nodes.position();
        if nodes.known[index] == *failed {
            nodes.next = index + 1;
        }
    }

    /// The next node in round-robin order that is not in `asked`; the next one at all when
    /// every node is (the round robin moves on).
    pub(crate) fn node_not_in(&self, asked: &HashSet<Url>) -> Url {
        let mut nodes = self.lock_nodes();
        let start = nodes.position();
        let count = nodes.known.len();
        let index =
            (0..count).map(|step| (start + step) % count).find(|i| !asked.contains(&nodes.known[*i])).unwrap_or(start);
        nodes.next = index;
        nodes.known[index].clone()
    }

    pub(crate) fn node_count(&self) -> usize {
        self.lock_nodes().known.len()
    }

    pub(crate) fn leader(&self) -> Option<Url> {
        self.lock_nodes().leader.clone()
    }

    pub(crate) fn set_leader(&self, leader: Url) {
        let mut nodes = self.lock_nodes();
        if !nodes.known.contains(&leader) {
            nodes.known.push(leader.clone());
        }
        nodes.leader = Some(leader);
    }

    /// Forgets the cached leader if it is still `failed` (another task may have found a new
    /// one meanwhile).
    pub(crate) fn forget_leader(&self, failed: &Url) {
        let mut nodes = self.lock_nodes();
        if nodes.leader.as_ref() == Some(failed) {
            nodes.leader = None;
        }
    }

    /// Makes the known nodes the seeds plus the peers and leader of a `/cluster` answer, and
    /// caches the leader it names. Learned addresses are replaced, not added to: a node that
    /// left the cluster's membership is forgotten, and reads and reconnects stop spending
    /// attempts on it. The seeds stay, so the client can always ask the cluster again.
    pub(super) fn learn(&self, info: &ClusterInfo) {
        let leader = info.leader_address.as_deref().and_then(|a| endpoint::parse_base(a).ok());
        let learned = info.peers.iter().filter_map(|peer| endpoint::parse_base(peer).ok());
        let mut nodes = self.lock_nodes();
        let upcoming = nodes.known[nodes.position()].clone();
        let mut known = nodes.seeds.clone();
        for url in learned.chain(leader.clone()) {
            if !known.contains(&url) {
                known.push(url);
            }
        }
        // The round robin goes on from the node it would have given next, wherever that now
        // stands; a forgotten one leaves the position as it is (`position` wraps it).
        if let Some(index) = known.iter().position(|url| *url == upcoming) {
            nodes.next = index;
        }
        nodes.known = known;
        if let Some(leader) = leader {
            nodes.leader = Some(leader);
        }
    }

    /// Whether every known node is in `nodes`: a refusal that a lagging node gives is the
    /// cluster's answer only then. Counting is not enough now that the list changes: a node
    /// that denied and then left the cluster would stand in for one never asked.
    pub(crate) fn every_node_in(&self, nodes: &HashSet<Url>) -> bool {
        self.lock_nodes().known.iter().all(|node| nodes.contains(node))
    }

    /// [`Self::every_node_in`], asking the cluster for its members the first time it would be
    /// true (`learned` remembers that it did): a client given one address knows no other node,
    /// and a refusal from a node behind the others (a follower that has not applied a topic's
    /// creation yet) must not be final while the leader would accept.
    pub(crate) async fn every_node_in_once_learned(&self, nodes: &HashSet<Url>, learned: &mut bool) -> bool {
        if !self.every_node_in(nodes) {
            return false;
        }
        if *learned {
            return true;
        }
        *learned = true;
        self.refresh_nodes().await;
        self.every_node_in(nodes)
    }

    /// Records a `leader_change` frame's leader address in the cache.
    pub(crate) fn learn_leader_address(&self, address: &str) {
        if let Ok(url) = endpoint::parse_base(address) {
            self.set_leader(url);
        }
    }

    /// Best effort: asks the next node for `/cluster` to learn peers and the leader, so a
    /// subscription can fail over to nodes that were not among the seeds. It does not move the
    /// round-robin position: a reconnect that refreshes then connects would otherwise take two
    /// steps for one attempt, and with three nodes never try one of them.
    pub(crate) async fn refresh_nodes(&self) {
        let node = self.current_node();
        if let Ok(Some(info)) = self.cluster_info(&node, self.config().connect_timeout).await {
            self.learn(&info);
        }
    }
}
