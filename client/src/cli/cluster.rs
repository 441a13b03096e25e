//! `pubsub cluster`

use super::{CliError, Output};
use crate::client::Client;

pub(super) async fn run(client: &Client, output: &Output) -> Result<(), CliError> {
    let info = client.cluster().await?;
    let leader = match (&info.leader_id, &info.leader_address) {
        (Some(id), Some(address)) => format!("{id} at {address}"),
        (None, Some(address)) => address.clone(),
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
    if !info.nodes_short_of_disk.is_empty() {
        let short = info.nodes_short_of_disk.join(", ");
        human.push_str(&format!("\nshort of disk room  {short} (publishes are refused: 507 insufficient_storage)"));
    }
    output.either(&human, &info)
}
