//! `pubsub subscribe`, `pubsub tail` and `pubsub read`.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::json;

use super::args::{ReadArgs, SubscribeArgs, TailArgs};
use super::output::{format_time_ms, stderr_line};
use super::{CliError, Output};
use crate::client::{Client, ReadOptions};
use crate::endpoint::Cursor;
use crate::error::Error;
use crate::subscription::{Event, SubscribeOptions, Subscription};
use crate::types::Message;

/// How much of each message to print.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Show {
    /// Sequence, time, id and payload (`subscribe`).
    Full,
    /// The payload alone (`tail`).
    Payload,
}

pub(super) async fn subscribe(client: &Client, output: &Output, args: SubscribeArgs) -> Result<(), CliError> {
    let options = SubscribeOptions::new(args.subscriber_id.unwrap_or_else(generated_id)).cursor(args.cursor);
    follow(client, output, &args.topic, options, Show::Full, args.ack, args.count).await
}

pub(super) async fn tail(client: &Client, output: &Output, args: TailArgs) -> Result<(), CliError> {
    let options = SubscribeOptions::new(args.subscriber_id.unwrap_or_else(generated_id)).cursor(Cursor::Latest);
    follow(client, output, &args.topic, options, Show::Payload, false, args.count).await
}

pub(super) async fn read(client: &Client, output: &Output, args: ReadArgs) -> Result<(), CliError> {
    let mut options = ReadOptions::after(args.after);
    options.limit = args.limit;
    options.wait = args.wait_ms.map(Duration::from_millis);
    let page = client.read_messages(&args.topic, options).await?;
    if output.json {
        return output.json_line(&page);
    }
    if let Some(note) = expired_before(args.after, page.first_available_sequence) {
        output.note(&note);
    }
    for message in &page.messages {
        output.line(&format_message(message))?;
    }
    output.note(&format!(
        "{} messages; next cursor {}, current sequence {}",
        page.messages.len(),
        page.next_cursor,
        page.current_sequence
    ));
    Ok(())
}

/// The note for a page read after `after` whose topic now starts at `first_available`: the
/// messages in between expired under retention (`None` when none did).
pub(super) fn expired_before(after: u64, first_available: u64) -> Option<String> {
    (first_available > after.saturating_add(1)).then(|| {
        format!(
            "messages after #{after} and before #{first_available} expired (retention); the page starts at #{first_available}"
        )
    })
}

fn generated_id() -> String {
    format!("pubsub-cli-{}", uuid::Uuid::new_v4().simple())
}

/// Prints events until the count is reached, the topic is deleted, Ctrl-C, or a fatal error.
/// With a count, a stream that ends before it (the topic deleted) is a failure.
async fn follow(
    client: &Client,
    output: &Output,
    topic: &str,
    options: SubscribeOptions,
    show: Show,
    ack: bool,
    count: Option<u64>,
) -> Result<(), CliError> {
    let cursor = options.cursor;
    let mut sub = client.subscribe(topic, options).await?;
    let start = match (sub.subscribed_cursor(), cursor) {
        (Some(n), _) => format!("after #{n}"),
        (None, Cursor::After(n)) => format!("after #{n}"),
        (None, Cursor::Latest) => "latest".to_string(),
        (None, Cursor::Acked) => "the last ack".to_string(),
    };
    output.note(&format!("subscribed to {topic} as {} from {start} (Ctrl-C to stop)", sub.subscriber_id()));
    let result = print_events(output, &mut sub, show, ack, count).await;
    // Closing sends the last ack before the socket goes.
    sub.close().await;
    result
}

async fn print_events(
    output: &Output,
    sub: &mut Subscription,
    show: Show,
    ack: bool,
    count: Option<u64>,
) -> Result<(), CliError> {
    let mut printed = 0u64;
    if count == Some(0) {
        return Ok(());
    }
    // One listener for the whole run: made anew on each turn, a Ctrl-C arriving while a line
    // is printed found none and was lost.
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        let event = tokio::select! {
            _ = &mut ctrl_c => return Ok(()),
            event = sub.next() => event,
        };
        match event {
            None => return ended_before_count(count, printed, &format!("the subscription to {} ended", sub.topic())),
            Some(Ok(Event::Message(message))) => {
                match (show, output.json) {
                    (Show::Payload, _) => output.line(&message.payload.to_string())?,
                    (Show::Full, true) => output.json_line(&message_json(&message))?,
                    (Show::Full, false) => output.line(&format_message(&message))?,
                }
                if ack {
                    sub.ack(message.sequence);
                }
                printed += 1;
                if count.is_some_and(|c| printed >= c) {
                    return Ok(());
                }
            }
            Some(Ok(Event::Expired { requested_cursor, first_available_sequence })) => {
                let text = format!(
                    "messages after #{requested_cursor} and before #{first_available_sequence} expired (retention); continuing at #{first_available_sequence}"
                );
                output.note(&text);
                let notice = json!({"type": "messages_expired", "topic": sub.topic(),
                    "requested_cursor": requested_cursor, "first_available_sequence": first_available_sequence});
                match (output.json, show) {
                    (true, Show::Full) => output.json_line(&notice)?,
                    // `tail`'s stdout is payloads alone: the gap is told on stderr, as a
                    // stream warning is, never left silent.
                    (true, Show::Payload) => {
                        stderr_line(json!({"type": "warning", "error": "messages_expired", "message": text}))
                    }
                    (false, _) => {}
                }
            }
            Some(Ok(Event::LeaderChange { new_leader, new_leader_id })) => {
                output.note(&format!(
                    "leader is now {} at {}",
                    new_leader_id.as_deref().unwrap_or("?"),
                    new_leader.as_deref().unwrap_or("?")
                ));
                if output.json && show == Show::Full {
                    output.json_line(&json!({"type": "leader_change", "new_leader": new_leader,
                        "new_leader_id": new_leader_id}))?;
                }
            }
            Some(Ok(Event::AcksNotRecorded { recorded_cursors_max })) => {
                output.note(&format!(
                    "acks are not recorded: topic {} holds {recorded_cursors_max} recorded cursors (forget unused ones with `pubsub topics forget-subscriber {} ID`)",
                    sub.topic(),
                    sub.topic()
                ));
                if output.json && show == Show::Full {
                    output.json_line(&json!({"type": "acks_not_recorded", "topic": sub.topic(),
                        "recorded_cursors_max": recorded_cursors_max}))?;
                }
            }
            Some(Ok(Event::Reconnecting { attempts, error })) => {
                output.note(&format!("reconnecting: attempt {attempts} failed ({error})"));
                if output.json && show == Show::Full {
                    output.json_line(&json!({"type": "reconnecting", "topic": sub.topic(), "attempts": attempts,
                        "error": error}))?;
                }
            }
            Some(Ok(Event::TopicDeleted)) => {
                output.note(&format!("topic {} was deleted", sub.topic()));
                if output.json && show == Show::Full {
                    output.json_line(&json!({"type": "topic_deleted", "topic": sub.topic()}))?;
                }
                return ended_before_count(count, printed, &format!("topic {} was deleted", sub.topic()));
            }
            // The stream goes on after these; say so and keep printing.
            Some(Err(error @ (Error::SequenceGap { .. } | Error::Protocol { .. }))) => {
                if output.json {
                    stderr_line(json!({"type": "warning", "error": "stream", "message": error.to_string()}));
                } else {
                    stderr_line(format!("warning: {error}"));
                }
            }
            Some(Err(error)) => return Err(error.into()),
        }
    }
}

/// The outcome of a stream that ended (`why`) after `printed` messages: fine without a count
/// (following until the topic goes is all that was asked), a refusal (exit 1) with a count
/// not reached, since fewer messages came than the caller waits for.
pub(super) fn ended_before_count(count: Option<u64>, printed: u64, why: &str) -> Result<(), CliError> {
    match count {
        Some(count) if printed < count => Err(CliError::Refused(format!("{why} after {printed} of {count} messages"))),
        _ => Ok(()),
    }
}

fn message_json(message: &Message) -> serde_json::Value {
    json!({"type": "message", "id": message.id, "topic": message.topic,
           "sequence": message.sequence, "payload": message.payload,
           "timestamp": message.timestamp})
}

/// `#SEQ  TIME  ID  PAYLOAD`
pub(super) fn format_message(message: &Message) -> String {
    format!("#{}  {}  {}  {}", message.sequence, format_time_ms(message.timestamp), message.id, message.payload)
}
