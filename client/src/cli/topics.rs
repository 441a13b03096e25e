//! `pubsub topics create|list|get|delete|subscribers`

use super::args::TopicsCommand;
use super::output::format_time_ms;
use super::{CliError, Output};
use crate::client::Client;

pub(super) async fn run(client: &Client, output: &Output, command: TopicsCommand) -> Result<(), CliError> {
    match command {
        TopicsCommand::Create { name, metadata } => {
            let ack = client.create_topic(&name, metadata).await?;
            let human = if ack.created {
                format!("created topic {} (raft index {})", ack.topic, ack.raft_index)
            } else {
                format!("topic {} already exists", ack.topic)
            };
            output.either(&human, &ack)
        }
        TopicsCommand::List => {
            let topics = client.list_topics().await?;
            if output.json {
                for topic in &topics {
                    output.json_line(topic)?;
                }
                return Ok(());
            }
            if topics.is_empty() {
                output.note("no topics");
                return Ok(());
            }
            let width = topics.iter().map(|t| t.name.len()).max().unwrap_or(4).max(4);
            output.line(&format!("{:<width$}  {:>10}  CREATED", "NAME", "MESSAGES"))?;
            for t in &topics {
                output.line(&format!(
                    "{:<width$}  {:>10}  {}",
                    t.name,
                    t.message_count,
                    format_time_ms(t.created_at)
                ))?;
            }
            Ok(())
        }
        TopicsCommand::Get { name } => {
            let info = client.get_topic(&name).await?;
            let human = format!(
                "topic      {}\nmessages   {}\nsequence   {}\ncreated    {}\nmetadata   {}",
                info.topic,
                info.message_count,
                info.current_sequence,
                format_time_ms(info.created_at),
                info.metadata
            );
            output.either(&human, &info)
        }
        TopicsCommand::Delete { name } => {
            let ack = client.delete_topic(&name).await?;
            output.either(&format!("deleted topic {}", ack.topic), &ack)
        }
        TopicsCommand::ForgetSubscriber { name, subscriber_id } => {
            let forgotten = client.forget_subscriber(&name, &subscriber_id).await?;
            let had = forgotten.acked_sequence.map(|s| format!(" (it had acked #{s})")).unwrap_or_default();
            output.either(&format!("forgot the cursor of {subscriber_id} on {name}{had}"), &forgotten)
        }
        TopicsCommand::Subscribers { name } => {
            let subscribers = client.subscribers(&name).await?;
            if output.json {
                for s in &subscribers {
                    output.json_line(s)?;
                }
                return Ok(());
            }
            if subscribers.is_empty() {
                output.note("no subscribers");
                return Ok(());
            }
            let width = subscribers.iter().map(|s| s.subscriber_id.len()).max().unwrap_or(10).max(10);
            output.line(&format!("{:<width$}  {:>12}  {:>10}", "SUBSCRIBER", "ACKED", "LAG"))?;
            for s in &subscribers {
                output.line(&format!("{:<width$}  {:>12}  {:>10}", s.subscriber_id, s.acked_sequence, s.lag))?;
            }
            Ok(())
        }
    }
}
