//! A leader finishes a joint configuration left by a leader change.
//!
//! openraft runs a membership change as a joint configuration (the old voters and the new
//! ones, a majority of each needed) and then the final one (the new voters alone), both
//! proposed by the leader that took the change. A leader that loses its leadership after the
//! joint configuration was appended, and before it proposed the final one, leaves the cluster
//! in the joint configuration, and openraft's next leader does not go on by itself: every
//! commit would still need a majority of the old voters, a removed node among them. Raft's
//! joint consensus (Ongaro's thesis §4.3) and etcd's `ConfChangeV2` with auto-leave finish it
//! in the leader instead, and so does [`run`]: once this node leads with a committed joint
//! configuration, it proposes the final one, the joint configuration's new voters.
//!
//! One membership change runs at a time on a node ([`crate::app::App::membership_changes`]):
//! while a request's change holds it, that change proposes the final configuration itself.

use std::collections::BTreeSet;
use std::sync::Weak;

use openraft::{ChangeMembers, Membership, ServerState};
use raft_store::typ::RaftMetrics;
use raft_store::{Node, NodeId};

use crate::app::App;
use crate::limits::{JOINT_CHECK_INTERVAL, MEMBERSHIP_CHANGE_TIMEOUT};

/// Checks every [`JOINT_CHECK_INTERVAL`] until the node stops, and finishes a committed joint
/// configuration this node leads with. A timer, not a watch on the Raft metrics: they change
/// several times per entry, and a joint configuration left for a second more costs nothing.
pub async fn run(app: Weak<App>) {
    let Some(shutdown) = app.upgrade().map(|a| a.shutdown.clone()) else {
        return;
    };
    let mut ticks = tokio::time::interval(JOINT_CHECK_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            () = shutdown.cancelled() => return,
        }
        let Some(app) = app.upgrade() else {
            return;
        };
        let unfinished = unfinished_joint(&app.raft.metrics().borrow());
        if let Some(voters) = unfinished {
            tokio::select! {
                () = finish(&app, voters) => {}
                () = shutdown.cancelled() => return,
            }
        }
    }
}

/// A joint configuration: a change between its two steps, or one whose leader lost its
/// leadership in between, until the next leader finishes it ([`run`]).
pub fn is_joint(membership: &Membership<NodeId, Node>) -> bool {
    membership.get_joint_config().len() > 1
}

/// The voters a membership ends with: all of them in a final configuration, the new set in a
/// joint one.
pub fn final_voters(membership: &Membership<NodeId, Node>) -> BTreeSet<NodeId> {
    membership.get_joint_config().last().cloned().unwrap_or_default()
}

/// The membership this node holds has committed (applied, here): openraft takes a membership
/// change only then, and refuses it as in progress before.
pub fn membership_committed(m: &RaftMetrics) -> bool {
    m.membership_config.log_id() <= &m.last_applied
}

/// The voters of the final configuration when this node leads with a joint configuration that
/// has committed.
fn unfinished_joint(m: &RaftMetrics) -> Option<BTreeSet<NodeId>> {
    let membership = m.membership_config.membership();
    (m.state == ServerState::Leader && is_joint(membership) && membership_committed(m))
        .then(|| final_voters(membership))
}

/// Proposes the final configuration `voters`, unless a membership change already runs on this
/// node. A failure is logged, and the next check tries again.
async fn finish(app: &App, voters: BTreeSet<NodeId>) {
    let Ok(_running) = app.membership_changes.clone().try_lock_owned() else {
        tracing::debug!(
            "the membership is joint while a change runs on this node: that change goes on to the final one"
        );
        return;
    };
    // Read again under the lock: a request's change may have ended between the check and it.
    if unfinished_joint(&app.raft.metrics().borrow()).as_ref() != Some(&voters) {
        return;
    }
    tracing::warn!(
        ?voters,
        "the membership is a joint configuration left unfinished (by a leader change, or a change that timed \
         out): proposing its final one"
    );
    let change = app.raft.change_membership(ChangeMembers::ReplaceAllVoters(voters.clone()), false);
    match tokio::time::timeout(MEMBERSHIP_CHANGE_TIMEOUT, change).await {
        Ok(Ok(response)) => tracing::info!(?voters, log_id = %response.log_id, "the joint configuration is finished"),
        Ok(Err(e)) => tracing::warn!(error = %e, "finishing the joint configuration failed; trying again"),
        Err(_) => tracing::warn!(?voters, "finishing the joint configuration did not commit in time"),
    }
}
