//! (ext) Membership changes (API.md §2): `POST /cluster/members` adds a node (as a learner
//! until it holds the log, then as a voter), `DELETE /cluster/members/{id}` removes one. Only
//! the leader takes them; with a cluster secret set they must present it, as peers do.
//!
//! openraft runs each change as a joint configuration and then the final one, so a majority of
//! the old voters and of the new ones agree at every step; it takes one change at a time.

use std::collections::BTreeSet;
use std::net::IpAddr;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Uri};
use axum::{Extension, Json};
use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::{ChangeMembers, Membership, ServerState};
use raft_store::typ::{LogId, NodeId, RaftMetrics};
use raft_store::Node;
use serde::Deserialize;
use serde_json::{json, Value};

use super::input;
use crate::app::{App, SharedApp};
use crate::config::{is_host_port, is_loopback, parse_node_id};
use crate::error::ApiError;
use crate::limits::{
    MEMBERSHIP_CHANGE_TIMEOUT, MEMBER_BODY_BYTES_MAX, MEMBER_CATCH_UP_TIMEOUT, MEMBER_PROMOTE_LAG_MAX,
};
use crate::raft::joint::{is_joint, membership_committed};
use crate::raft::server::require_secret;
use crate::serve::ClientAddr;

/// Every node of `membership`, voters and learners, ordered by id: for `/cluster` and the
/// answers here. `address` is the Raft address the membership records, `client_address` where
/// clients reach the node.
pub fn members_json(app: &App, membership: &Membership<NodeId, Node>) -> Vec<Value> {
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    membership
        .nodes()
        .map(|(id, node)| {
            json!({
                "node_id": format!("node-{id}"),
                "address": node.addr,
                "client_address": app.client_address(*id, &node.addr),
                "role": if voters.contains(id) { "voter" } else { "learner" },
            })
        })
        .collect()
}

/// `members_json` with what the leader knows of each member's replication (`/cluster`):
/// whether it answered the leader within an election timeout (the test a membership change
/// makes of the voters), the last log index the leader knows it holds, and how far that is
/// behind the leader's log (both `null` until the member first answers this leader's
/// replication: not known is not "holds nothing"). All `null` on a node whose role is not
/// leader: only the leader sends to every member. A leader cut off from its quorum keeps its
/// role until it sees a higher term, and shows its peers not reachable.
pub fn members_progress_json(app: &App, m: &RaftMetrics) -> Vec<Value> {
    let membership = m.membership_config.membership();
    let last_log_index = m.last_log_index.unwrap_or(0);
    let mut members = members_json(app, membership);
    for (member, (&id, _)) in members.iter_mut().zip(membership.nodes()) {
        let (reachable, matched) = if m.state != ServerState::Leader {
            (Value::Null, None)
        } else if id == app.id() {
            (Value::Bool(true), Some(last_log_index))
        } else {
            let matched = m.replication.as_ref().and_then(|r| r.get(&id).cloned().flatten());
            (Value::Bool(app.answers(id)), matched.map(|l| l.index))
        };
        member["reachable"] = reachable;
        member["matched_index"] = json!(matched);
        member["lag"] = json!(matched.map(|matched| last_log_index.saturating_sub(matched)));
    }
    members
}

/// The body of `POST /cluster/members`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewMember {
    /// `4` or `"node-4"`.
    id: IdField,
    /// The node's Raft address (its `--advertise`), `HOST:PORT`.
    address: String,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum IdField {
    Number(u64),
    Text(String),
}

impl IdField {
    fn node_id(&self) -> Result<NodeId, ApiError> {
        match self {
            Self::Number(0) => Err(ApiError::InvalidRequest("node ids start at 1".into())),
            Self::Number(id) => Ok(*id),
            Self::Text(text) => parse_node_id(text).map_err(ApiError::InvalidRequest),
        }
    }
}

/// `POST /cluster/members`: adds node `id` at `address`. Answers once it is a voter, or at once
/// when it already was one at that address.
pub async fn add(
    State(app): State<SharedApp>,
    client: Option<Extension<ClientAddr>>,
    headers: HeaderMap,
    uri: Uri,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    require_secret(&app, &headers)?;
    let client: Option<IpAddr> = input::client_ip(client);
    let bytes = input::body(&app, client, body, MEMBER_BODY_BYTES_MAX).await?;
    let wanted: NewMember = input::json(&bytes)?
        .ok_or_else(|| ApiError::InvalidRequest("the body must be {\"id\": N, \"address\": \"HOST:PORT\"}".into()))?;
    let id = wanted.id.node_id()?;
    let address = wanted.address.trim().to_string();
    if !is_host_port(&address) {
        return Err(ApiError::InvalidRequest(format!("address {address:?} is not HOST:PORT")));
    }
    let where_ = input::path_and_query(&uri);
    app.require_leader(&where_)?;

    let (membership, membership_log_id) = current_membership(&app);
    check_address(&membership, id, &address)?;
    // The membership entry a learner must hold before it votes; `None` when it votes already.
    let catch_up_to = match membership.get_node(&id) {
        // A voter of a final configuration: nothing to do. A voter of a joint one (a change
        // left unfinished, its final configuration perhaps without this node) holds the log
        // already: made a voter of the final one below, at once, before the finishing
        // (raft/joint.rs) drops it.
        Some(_) if membership.voter_ids().any(|v| v == id) => match is_joint(&membership) {
            false => return Ok(Json(answer(&app, &membership, membership_log_id, false))),
            true => None,
        },
        // A learner already (an earlier request that timed out): wait on.
        Some(_) => Some(membership_log_id),
        None => {
            tracing::info!(node = id, %address, "adding a learner");
            let add_learner = |m: &Membership<NodeId, Node>| {
                check_address(m, id, &address)?;
                Ok(ChangeMembers::AddNodes([(id, Node { addr: address.clone() })].into()))
            };
            let (added, _) = change(&app, &where_, add_learner).await?;
            Some(Some(added))
        }
    };
    if let Some(target) = catch_up_to {
        wait_caught_up(&app, &where_, id, target).await?;
    }
    tracing::info!(node = id, "the node holds the log; making it a voter");
    let make_voter = |m: &Membership<NodeId, Node>| match m.get_node(&id) {
        Some(_) => check_address(m, id, &address).map(|()| ChangeMembers::AddVoterIds([id].into())),
        None => Err(removed_meanwhile(id)),
    };
    let (log_id, membership) = change(&app, &where_, make_voter).await?;
    Ok(Json(answer(&app, &membership, Some(log_id), true)))
}

/// Refuses `id` at `address` when another member is at that address (dials to either would
/// reach the one node there: a member that is never there), or `id` is a member elsewhere, or
/// `address` is loopback and the other members are all elsewhere, or the reverse: a node on
/// another host cannot reach a member at 127.0.0.1 (a node started with no flags advertises
/// 127.0.0.1:8080), and once leadership moved, that member would get nothing more.
fn check_address(membership: &Membership<NodeId, Node>, id: NodeId, address: &str) -> Result<(), ApiError> {
    if let Some((other, _)) = membership.nodes().find(|(other, node)| **other != id && node.addr == address) {
        return Err(ApiError::MemberConflict(format!("node-{other} is already a member at {address}")));
    }
    // Only a new address, and only against members that agree among themselves: a membership
    // mixed already (grown before this check, or from the mixed `--peers` of a cluster formed
    // before they were checked) still takes the same request again and the promotion of its
    // learners.
    let loopback = is_loopback(address);
    let others: Vec<(NodeId, &Node)> =
        membership.nodes().filter(|(other, _)| **other != id).map(|(other, node)| (*other, node)).collect();
    let known_here = membership.get_node(&id).is_some_and(|node| node.addr == address);
    let kinds: BTreeSet<bool> = others.iter().map(|(_, node)| is_loopback(&node.addr)).collect();
    let refused = !known_here && kinds.len() == 1 && !kinds.contains(&loopback);
    if let (true, Some((other, node))) = (refused, others.first()) {
        let (near, far) = if loopback { (address, node.addr.as_str()) } else { (node.addr.as_str(), address) };
        return Err(ApiError::MemberConflict(format!(
            "node-{other} is a member at {}, and {near} is a loopback address while {far} is not: a node at {far} \
             could not reach {near}; every member of a cluster that spans hosts needs an address the others reach \
             (start each node with --advertise HOST:PORT)",
            node.addr
        )));
    }
    match membership.get_node(&id) {
        Some(node) if node.addr != address => Err(ApiError::MemberConflict(format!(
            "node-{id} is already a member at {}; remove it first to give it another address",
            node.addr
        ))),
        _ => Ok(()),
    }
}

fn removed_meanwhile(id: NodeId) -> ApiError {
    ApiError::MemberConflict(format!("node-{id} is no longer a member (removed meanwhile)"))
}

/// `DELETE /cluster/members/{id}`: removes a voter or learner. A leader that removes itself
/// steps down once the change has committed, and the others elect a new one.
pub async fn remove(
    State(app): State<SharedApp>,
    headers: HeaderMap,
    uri: Uri,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    require_secret(&app, &headers)?;
    let Path(text) = path.map_err(|e| ApiError::InvalidRequest(e.body_text()))?;
    let id = parse_node_id(&text).map_err(ApiError::InvalidRequest)?;
    let where_ = input::path_and_query(&uri);
    app.require_leader(&where_)?;
    // Refused at once when the membership already says no, and decided again under the lock.
    removal(&current_membership(&app).0, id)?;
    tracing::info!(node = id, "removing a member");
    let (log_id, membership) = change(&app, &where_, |m: &Membership<NodeId, Node>| removal(m, id)).await?;
    Ok(Json(answer(&app, &membership, Some(log_id), true)))
}

/// The change that removes `id` from `membership`: as a voter or as a learner, never the last voter.
fn removal(membership: &Membership<NodeId, Node>, id: NodeId) -> Result<ChangeMembers<NodeId, Node>, ApiError> {
    if membership.get_node(&id).is_none() {
        return Err(ApiError::MemberNotFound(id));
    }
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    match voters.contains(&id) {
        true if voters.len() == 1 => {
            Err(ApiError::InvalidRequest(format!("node-{id} is the only voter: a cluster keeps at least one")))
        }
        true => Ok(ChangeMembers::RemoveVoters([id].into())),
        false => Ok(ChangeMembers::RemoveNodes([id].into())),
    }
}

/// Refuses a change of voters that could not commit: joint consensus needs a majority of the
/// voters now and of the voters it leaves, each counting those that answered this leader
/// within an election timeout (itself counting if it stays). Removing a voter while another is
/// down would otherwise leave a joint configuration that never commits: no writes, and once
/// the old leader stops, no leader (etcd's strict reconfiguration check refuses the same). So
/// would removing a lost voter of two, which the two of them must agree to.
fn require_quorum_after(
    app: &App,
    membership: &Membership<NodeId, Node>,
    wanted: &ChangeMembers<NodeId, Node>,
) -> Result<(), ApiError> {
    let now: Vec<BTreeSet<NodeId>> = membership.get_joint_config().clone();
    let base = now.last().cloned().unwrap_or_default();
    let after: BTreeSet<NodeId> = match wanted {
        ChangeMembers::RemoveVoters(ids) => base.difference(ids).copied().collect(),
        ChangeMembers::AddVoterIds(ids) => base.union(ids).copied().collect(),
        _ => return Ok(()),
    };
    if after.is_empty() {
        return Err(ApiError::InvalidRequest("the change would leave the cluster without a voter".into()));
    }
    let Some((voters, silent)) = short_of_majority(&now, &after, |id| app.answers(id)) else {
        return Ok(());
    };
    let which = if voters == after { "after this change the voters would be" } else { "the voters now are" };
    Err(ApiError::Unavailable(format!(
        "{which} {}, and {} of them ({}) have not answered the leader within {} ms: they could not commit \
         this change, which needs a majority of the voters now and after it; bring them back first, or remove a \
         lost one before another",
        crate::error::node_names(&voters).join(", "),
        silent.len(),
        crate::error::node_names(&silent).join(", "),
        app.answer_window().as_millis()
    )))
}

/// The first of the voter sets `now` (one, or two while joint) and `after` in which fewer
/// than a majority are `live`, with the silent ones.
fn short_of_majority(
    now: &[BTreeSet<NodeId>],
    after: &BTreeSet<NodeId>,
    live: impl Fn(NodeId) -> bool,
) -> Option<(BTreeSet<NodeId>, Vec<NodeId>)> {
    now.iter().chain([after]).find_map(|voters| {
        let silent: Vec<NodeId> = voters.iter().copied().filter(|&id| !live(id)).collect();
        ((voters.len() - silent.len()) * 2 <= voters.len()).then(|| (voters.clone(), silent))
    })
}

/// The membership this node holds (the latest, committed or not) and where it was written.
fn current_membership(app: &App) -> (Membership<NodeId, Node>, Option<LogId>) {
    let metrics = app.raft.metrics();
    let metrics = metrics.borrow();
    (metrics.membership_config.membership().clone(), *metrics.membership_config.log_id())
}

fn answer(app: &App, membership: &Membership<NodeId, Node>, log_id: Option<LogId>, changed: bool) -> Value {
    json!({
        "members": members_json(app, membership),
        "joint": is_joint(membership),
        "changed": changed,
        "raft_index": log_id.map(|l| l.index).unwrap_or(0),
    })
}

/// Runs one membership change (removed nodes are dropped, not kept as learners) and returns
/// the membership it committed, with its log id. `plan` makes the change from the membership
/// as it stands once this request's turn has come (another request's change may have altered
/// it meanwhile), or refuses it. It runs in a task of its own, which holds
/// [`App::membership_changes`] and ends within [`MEMBERSHIP_CHANGE_TIMEOUT`] whether or not the
/// request still waits: a client gone does not cut the change short between its joint and its
/// final configuration, and a proposal openraft leaves unanswered (should one be: see
/// `propose::outcome`) does not hold the node's changes for ever. A change cut short
/// by that timeout is finished by the leader (raft/joint.rs).
async fn change(
    app: &App,
    where_: &str,
    plan: impl FnOnce(&Membership<NodeId, Node>) -> Result<ChangeMembers<NodeId, Node>, ApiError>,
) -> Result<(LogId, Membership<NodeId, Node>), ApiError> {
    // Another change on this node (a request's, or the finishing of a joint configuration) is
    // waited for, and so is the commit of the membership the leader holds, within the same
    // bound; openraft's own refusal below (a change still queued there) stays a 503.
    let deadline = tokio::time::Instant::now() + MEMBERSHIP_CHANGE_TIMEOUT;
    let lock = app.membership_changes.clone().lock_owned();
    let Ok(running) = tokio::time::timeout_at(deadline, lock).await else {
        return Err(in_progress());
    };
    wait_membership_committed(app, where_, deadline).await?;
    let current = current_membership(app).0;
    let wanted = plan(&current)?;
    require_quorum_after(app, &current, &wanted)?;
    let raft = app.raft.clone();
    let task = tokio::spawn(async move {
        let changed = tokio::time::timeout_at(deadline, raft.change_membership(wanted, false)).await;
        // openraft answers before its metrics show the new membership. The next change (and
        // this request's wait for its learner) reads them: on the old membership it would add
        // a second node at a learner's address, or take the learner for removed.
        if let Ok(Ok(response)) = &changed {
            let written = Some(response.log_id);
            let shown = move |m: &raft_store::typ::RaftMetrics| *m.membership_config.log_id() >= written;
            let within = deadline.saturating_duration_since(tokio::time::Instant::now());
            let _ = raft.wait(Some(within)).metrics(shown, "the metrics show the new membership").await;
        }
        drop(running);
        changed
    });
    match task.await.map(|changed| changed.ok()) {
        Ok(None) => Err(ApiError::RaftTimeout(MEMBERSHIP_CHANGE_TIMEOUT.as_millis())),
        Err(panicked) => Err(ApiError::internal(panicked)),
        Ok(Some(Ok(response))) => {
            let membership = response.membership.unwrap_or_else(|| current_membership(app).0);
            Ok((response.log_id, membership))
        }
        // Leadership moved with the change proposed (or about to be): it may still commit
        // under the next leader. Not the redirect a write gets before anything is proposed,
        // which says nothing was done (a client would take a removal's `404` that follows for
        // a failure); the same request again is safe.
        Ok(Some(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))))) => Err(ApiError::NotCommitted(
            "leadership moved while the change was in flight; it may still commit under the next leader".into(),
        )),
        Ok(Some(Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))))) => Err(match e {
            // Checked before leadership: a node deposed since the wait holds the new leader's
            // membership, not yet committed.
            ChangeMembershipError::InProgress(_) => app.require_leader(where_).err().unwrap_or_else(in_progress),
            ChangeMembershipError::EmptyMembership(_) => {
                ApiError::InvalidRequest("the change would leave the cluster without a voter".into())
            }
            ChangeMembershipError::LearnerNotFound(e) => removed_meanwhile(e.node_id),
        }),
        Ok(Some(Err(RaftError::Fatal(e)))) => Err(ApiError::Unavailable(format!("raft stopped: {e}"))),
    }
}

/// Waits, until `deadline`, for the membership this leader holds to commit: openraft refuses a
/// change until then. A leader just elected (or just initialized) has not yet committed the
/// membership it inherited, nor has one whose last change's final step is still on its way.
async fn wait_membership_committed(app: &App, where_: &str, deadline: tokio::time::Instant) -> Result<(), ApiError> {
    let committed = |m: &raft_store::typ::RaftMetrics| m.state != ServerState::Leader || membership_committed(m);
    let timeout = deadline.saturating_duration_since(tokio::time::Instant::now());
    match app.raft.wait(Some(timeout)).metrics(committed, "the membership has committed").await {
        Ok(m) if m.state != ServerState::Leader => Err(not_leading(app, where_)),
        Ok(_) => Ok(()),
        Err(openraft::metrics::WaitError::Timeout(..)) => Err(in_progress()),
        Err(openraft::metrics::WaitError::ShuttingDown) => Err(ApiError::Unavailable("the node is stopping".into())),
    }
}

/// The answer to a change this node can no longer take because it stopped leading: the
/// redirect a write gets, or `no_leader`.
fn not_leading(app: &App, where_: &str) -> ApiError {
    app.require_leader(where_).err().unwrap_or(ApiError::NoLeader)
}

fn in_progress() -> ApiError {
    ApiError::Unavailable("another membership change is in progress; retry once it has committed".into())
}

/// Waits until the leader has replicated to learner `id` its log up to `target` (the
/// membership that added it) and to within [`MEMBER_PROMOTE_LAG_MAX`] entries of its own end
/// (a catch-up that took long, a snapshot's install say, leaves all written meanwhile to send:
/// promoted then, the node would hold up every commit that needs it), at most
/// [`MEMBER_CATCH_UP_TIMEOUT`]. Ends early, with the redirect a write gets, when this node stops
/// leading, and with a conflict when the learner was removed meanwhile.
async fn wait_caught_up(app: &App, where_: &str, id: NodeId, target: Option<LogId>) -> Result<(), ApiError> {
    let done = move |m: &raft_store::typ::RaftMetrics| {
        let matched = m.replication.as_ref().and_then(|r| r.get(&id).cloned().flatten());
        let lag = m.last_log_index.unwrap_or(0).saturating_sub(matched.map(|l| l.index).unwrap_or(0));
        let caught_up = matched.is_some() && matched >= target && lag <= MEMBER_PROMOTE_LAG_MAX;
        m.state != ServerState::Leader || m.membership_config.membership().get_node(&id).is_none() || caught_up
    };
    match app.raft.wait(Some(MEMBER_CATCH_UP_TIMEOUT)).metrics(done, "a new learner holds the log").await {
        Ok(m) if m.state != ServerState::Leader => Err(not_leading(app, where_)),
        Ok(m) if m.membership_config.membership().get_node(&id).is_none() => {
            Err(ApiError::MemberConflict(format!("node-{id} was removed while it caught up")))
        }
        Ok(_) => Ok(()),
        Err(openraft::metrics::WaitError::Timeout(..)) => {
            Err(ApiError::MemberCatchingUp { node: id, secs: MEMBER_CATCH_UP_TIMEOUT.as_secs() })
        }
        Err(openraft::metrics::WaitError::ShuttingDown) => Err(ApiError::Unavailable("the node is stopping".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[NodeId]) -> BTreeSet<NodeId> {
        ids.iter().copied().collect()
    }

    fn membership(nodes: &[(NodeId, &str)]) -> Membership<NodeId, Node> {
        let voters = nodes.iter().map(|(id, _)| *id).collect();
        let nodes: std::collections::BTreeMap<NodeId, Node> =
            nodes.iter().map(|(id, addr)| (*id, Node { addr: addr.to_string() })).collect();
        Membership::new(vec![voters], nodes)
    }

    #[test]
    fn a_loopback_address_is_not_mixed_into_a_membership_elsewhere_nor_the_reverse() {
        let local = membership(&[(1, "127.0.0.1:8080")]);
        assert!(matches!(check_address(&local, 2, "10.0.0.2:8080"), Err(ApiError::MemberConflict(_))));
        assert!(check_address(&local, 2, "127.0.0.1:8081").is_ok());
        let spread = membership(&[(1, "node1:8080"), (2, "node2:8080")]);
        assert!(matches!(check_address(&spread, 3, "localhost:8083"), Err(ApiError::MemberConflict(_))));
        assert!(check_address(&spread, 3, "node3:8080").is_ok());
        // Mixed already (grown before the check): the same request again, and other additions,
        // are not refused for it.
        let mixed = membership(&[(1, "127.0.0.1:8080"), (2, "10.0.0.2:8080")]);
        assert!(check_address(&mixed, 2, "10.0.0.2:8080").is_ok());
        assert!(check_address(&mixed, 3, "10.0.0.3:8080").is_ok());
    }

    #[test]
    fn a_change_needs_a_live_majority_of_the_voters_after_it() {
        // Three voters, 3 down: removing 2 leaves {1, 3}, one of two live.
        let short = short_of_majority(&[set(&[1, 2, 3])], &set(&[1, 3]), |id| id != 3);
        assert_eq!(short, Some((set(&[1, 3]), vec![3])));
        // Removing 3, the lost one, is fine: two of three now, two of two after.
        assert_eq!(short_of_majority(&[set(&[1, 2, 3])], &set(&[1, 2]), |id| id != 3), None);
    }

    #[test]
    fn a_change_needs_a_live_majority_of_the_voters_now() {
        // Two voters, 2 down: removing it leaves {1}, all live, but the joint configuration
        // also needs 2, which never answers.
        let short = short_of_majority(&[set(&[1, 2])], &set(&[1]), |id| id == 1);
        assert_eq!(short, Some((set(&[1, 2]), vec![2])));
        // Four voters, 3 and 4 down: removing 4 leaves {1, 2, 3}, two of three live, but now
        // only two of four are.
        let short = short_of_majority(&[set(&[1, 2, 3, 4])], &set(&[1, 2, 3]), |id| id <= 2);
        assert_eq!(short, Some((set(&[1, 2, 3, 4]), vec![3, 4])));
        // Both sets of a joint configuration count.
        let short = short_of_majority(&[set(&[1, 2, 3]), set(&[3, 4, 5])], &set(&[3, 4]), |id| id <= 3);
        assert_eq!(short, Some((set(&[3, 4, 5]), vec![4, 5])));
    }
}
