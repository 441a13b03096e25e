//! `pubsub cluster`, `pubsub cluster add|remove`

use super::args::ClusterCommand;
use super::{CliError, Output};
use crate::client::Client;
use crate::types::{Member, Membership};

pub(super) async fn run(client: &Client, output: &Output, command: Option<ClusterCommand>) -> Result<(), CliError> {
    match command {
        None => show(client, output).await,
        Some(ClusterCommand::Add { id, address, cluster_secret }) => {
            let id = node_id(&id)?;
            let membership = client.add_member(id, address.trim(), cluster_secret.as_deref()).await?;
            changed(output, &membership, &format!("node-{id} is a voter"))
        }
        Some(ClusterCommand::Remove { id, cluster_secret }) => {
            let id = node_id(&id)?;
            let membership = client.remove_member(id, cluster_secret.as_deref()).await?;
            changed(output, &membership, &format!("node-{id} was removed; stop it"))
        }
    }
}

fn node_id(text: &str) -> Result<u64, CliError> {
    match text.trim().trim_start_matches("node-").parse::<u64>() {
        Ok(id) if id > 0 => Ok(id),
        _ => Err(CliError::Usage(format!("{text:?} is not a node id (N or node-N, N >= 1)"))),
    }
}

/// Printed under the members of a joint configuration.
const JOINT_NOTE: &str = "joint    a membership change is between its two steps (the leader finishes it)";

fn changed(output: &Output, membership: &Membership, what: &str) -> Result<(), CliError> {
    let what = if membership.changed { what.to_string() } else { format!("{what} already") };
    let mut human = format!("{what}\nmembers  {}", members_line(&membership.members));
    if membership.joint {
        human.push_str(&format!("\n{JOINT_NOTE}"));
    }
    output.either(&human, membership)
}

/// `node-1 (voter) at 127.0.0.1:8081, …`; from the leader, with how far behind each member is
/// (`node-2 (voter) at 127.0.0.1:8082 lag 0, node-3 (voter) at 127.0.0.1:8083 not answering, lag 7`).
pub(super) fn members_line(members: &[Member]) -> String {
    let each = members.iter().map(|m| {
        let progress = match (m.reachable, m.lag) {
            (Some(false), Some(lag)) => format!(" not answering, lag {lag}"),
            (Some(false), None) => " not answering".to_string(),
            (_, Some(lag)) => format!(" lag {lag}"),
            (Some(true), None) => " lag not known yet".to_string(),
            (None, None) => String::new(),
        };
        format!("{} ({}) at {}{progress}", m.node_id, m.role, m.client_address)
    });
    each.collect::<Vec<_>>().join(", ")
}

async fn show(client: &Client, output: &Output) -> Result<(), CliError> {
    let info = client.cluster().await?;
    let leader = match (&info.leader_id, &info.leader_address) {
        (Some(id), Some(address)) => format!("{id} at {address}"),
        (None, Some(address)) => address.clone(),
        // No membership and no cluster id: a node started with --join that was not added yet.
        _ if info.members.is_empty() && info.cluster_id.is_none() && info.role.as_deref() == Some("learner") => {
            "none (not a member of a cluster yet: add it with `pubsub cluster add`)".to_string()
        }
        _ => "none (election in progress)".to_string(),
    };
    let role = info.role.as_deref().unwrap_or("?");
    let applied = info.last_applied.map(|a| format!("   applied {a}")).unwrap_or_default();
    let cluster = info.cluster_id.as_deref().unwrap_or("not known yet");
    let mut human = format!(
        "cluster  {cluster}\nnode     {} ({role})\nleader   {leader}\nterm     {}\ncommit   {}{applied}\npeers    {}",
        info.node_id,
        info.raft_term,
        info.commit_index,
        info.peers.join(", ")
    );
    if !info.members.is_empty() {
        // Only the leader knows how far behind each member is: a follower's answer shows the
        // leader's view of the members (the --json output stays the asked node's own answer).
        let from_leader = if role != "leader" && info.leader_address.is_some() {
            client.cluster_from_leader().await.ok().filter(|l| l.role.as_deref() == Some("leader"))
        } else {
            None
        };
        let members = from_leader.map(|l| l.members);
        human.push_str(&format!("\nmembers  {}", members_line(members.as_ref().unwrap_or(&info.members))));
    }
    if info.membership_joint {
        human.push_str(&format!("\n{JOINT_NOTE}"));
    }
    if !info.nodes_short_of_disk.is_empty() {
        let short = info.nodes_short_of_disk.join(", ");
        human.push_str(&format!("\nshort of disk room  {short} (publishes are refused: 507 insufficient_storage)"));
    }
    output.either(&human, &info)
}
