//! `GET /topics/:name/messages?after=N&limit=L&wait_ms=W` (API.md §5, ext): a page of
//! messages after a cursor, served by any node, optionally long-polling for the next one.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Extension;

use super::input;
use crate::app::SharedApp;
use crate::budget::{Room, RoomFull};
use crate::error::ApiError;
use crate::limits::{
    READ_LIMIT_DEFAULT, READ_LIMIT_MAX, READ_PAGES_BYTES_PER_CLIENT_MAX, READ_PAGES_WAIT_TIMEOUT,
    READ_PAGE_BYTES_RESERVED, READ_WAIT_MS_MAX,
};
use crate::serve::ClientAddr;
use crate::subscribe::frames::message_fields;

/// The number `key` holds; an empty value is no value (its default), as an empty `cursor=`
/// is on a subscription.
fn number(query: &HashMap<String, String>, key: &str) -> Option<Result<u64, ()>> {
    query.get(key).map(|v| v.trim()).filter(|v| !v.is_empty()).map(|v| v.parse::<u64>().map_err(|_| ()))
}

pub async fn read(
    State(app): State<SharedApp>,
    client: Option<Extension<ClientAddr>>,
    path: Result<Path<String>, PathRejection>,
    query: RawQuery,
) -> Result<Response, ApiError> {
    let client = input::client_ip(client);
    let topic = input::topic_name(path)?;
    let query = input::query(query)?;
    // 0 when absent; `None`, owed nothing by a deleted topic, when not a number.
    let given_after = number(&query, "after").unwrap_or(Ok(0)).ok();
    let record = readable(&app, &topic, given_after)?;
    let beyond = |n: u64, current: u64| {
        ApiError::InvalidCursor(format!("after={n} is beyond the topic's current_sequence {current}"))
    };
    let after = match number(&query, "after") {
        None => 0,
        Some(Ok(n)) => n,
        Some(Err(())) => return Err(ApiError::InvalidCursor("after must be a non-negative integer".into())),
    };
    // A cursor past this node's end may come from a node further along (this one may lag the
    // leader): a long poll waits for this node to reach it, and refuses it only then.
    let wait_ms = number(&query, "wait_ms");
    let long_poll = matches!(wait_ms, Some(Ok(n)) if n > 0 && n <= READ_WAIT_MS_MAX);
    if after > record.current_sequence && !long_poll {
        return Err(beyond(after, record.current_sequence));
    }
    let limit = match number(&query, "limit") {
        None => READ_LIMIT_DEFAULT,
        Some(Ok(n)) if (1..=READ_LIMIT_MAX as u64).contains(&n) => n as usize,
        _ => return Err(ApiError::InvalidRequest(format!("limit must be 1 to {READ_LIMIT_MAX}"))),
    };
    let wait_ms = match wait_ms {
        None => 0,
        Some(Ok(n)) if n <= READ_WAIT_MS_MAX => n,
        _ => return Err(ApiError::InvalidRequest(format!("wait_ms must be 0 to {READ_WAIT_MS_MAX}"))),
    };

    let mut watch = app.reader.watch_topic(&topic);
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms);
    loop {
        let record = readable(&app, &topic, given_after)?;
        // Something to return: a message after `after` that retention has not removed (a
        // topic trimmed to nothing would otherwise answer an empty page at once, every time).
        // A long poll waits out a snapshot install (it signals when done): storage may lack
        // the messages meanwhile, and the page would be refused. A deleted topic has nothing
        // more to wait for (one created again is live).
        let settled = !app.reader.installing();
        let ready = record.current_sequence > page_start(&record, after) || record.deleted;
        if (ready && settled) || wait_ms == 0 {
            return page(&app, client, &record, after, limit).await;
        }
        let end = tokio::select! {
            changed = watch.changed() => changed.is_err().then_some(WaitEnd::Stopping),
            _ = tokio::time::sleep_until(deadline) => Some(WaitEnd::Deadline),
            _ = app.shutdown.cancelled() => Some(WaitEnd::Stopping),
        };
        match end {
            None => {}
            // The cursor may still be good: this node stopped before the end of the wait that
            // API.md grants a cursor ahead of it.
            Some(WaitEnd::Stopping) if after > record.current_sequence => {
                return Err(ApiError::Unavailable("the node is stopping; try another node".into()));
            }
            Some(WaitEnd::Deadline) if after > record.current_sequence => {
                return Err(beyond(after, record.current_sequence));
            }
            Some(_) => return page(&app, client, &record, after, limit).await,
        }
    }
}

/// Why a long poll stopped waiting before anything arrived.
enum WaitEnd {
    Deadline,
    Stopping,
}

/// The topic to read: a live one, or a deleted one that still owes a reader resuming `after`
/// the messages before its deletion, as a subscription (API.md §3); `404` otherwise.
fn readable(app: &SharedApp, topic: &str, after: Option<u64>) -> Result<raft_store::TopicRecord, ApiError> {
    let owed = |r: &raft_store::TopicRecord| !r.deleted || after.is_some_and(|a| a < r.current_sequence);
    app.reader.topic(topic).filter(owed).ok_or_else(|| ApiError::TopicNotFound(topic.to_string()))
}

/// The sequence a page after `after` starts behind: below the retained range, the first
/// retained message.
fn page_start(record: &raft_store::TopicRecord, after: u64) -> u64 {
    after.max(record.first_sequence.saturating_sub(1))
}

/// The `next_cursor` and `first_available_sequence` of a page read after `start` (from the
/// cursor `after`) whose messages ran from `read`'s first to its last sequence.
///
/// The record was taken before the read: a retention trim applied in between makes the page
/// start above `start + 1`, and the record's lower first sequence would then hide that the
/// messages in between expired. An empty page of a deleted topic means retention removed all
/// it still owed this cursor: the page passes them (the next read, after its end, is `404`),
/// where a reader following `next_cursor` would otherwise ask for them forever.
fn page_bounds(record: &raft_store::TopicRecord, after: u64, start: u64, read: Option<(u64, u64)>) -> (u64, u64) {
    match read {
        Some((first, last)) if first > start.saturating_add(1) => (last, record.first_sequence.max(first)),
        Some((_, last)) => (last, record.first_sequence),
        None if record.deleted => {
            (after.max(record.current_sequence), record.first_sequence.max(record.current_sequence + 1))
        }
        None => (after, record.first_sequence),
    }
}

/// Builds the response body by hand so stored payload bytes are copied, not re-parsed.
/// The body counts against the node's budget of pages read, and its client's share of it,
/// until it has been sent.
async fn page(
    app: &SharedApp,
    client: Option<IpAddr>,
    record: &raft_store::TopicRecord,
    after: u64,
    limit: usize,
) -> Result<Response, ApiError> {
    let room = reserve(app, client, READ_PAGE_BYTES_RESERVED).await?;
    let start = page_start(record, after);
    let messages = app.reader.read_messages_settled(record.id, start, limit)?;
    let read = messages.first().zip(messages.last()).map(|((first, _), (last, _))| (*first, *last));
    let (next_cursor, first_available_sequence) = page_bounds(record, after, start, read);
    let mut out = Vec::with_capacity(256 + messages.iter().map(|(_, m)| m.payload.len() + 96).sum::<usize>());
    out.extend_from_slice(b"{\"messages\":[");
    for (i, (sequence, message)) in messages.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.push(b'{');
        message_fields(&mut out, &record.name, *sequence, message);
        out.push(b'}');
    }
    out.extend_from_slice(
        format!(
            "],\"next_cursor\":{next_cursor},\"current_sequence\":{},\"first_available_sequence\":{}}}",
            // The read may see messages applied after the record was taken: the body never
            // says the topic ends before a message it holds.
            record.current_sequence.max(next_cursor),
            first_available_sequence
        )
        .as_bytes(),
    );
    Ok(([(header::CONTENT_TYPE, "application/json")], room.hold(out)).into_response())
}

/// A response body's room in the node's budget of pages read and its client's share of it,
/// reserved for its worst case before it is built and held until it has been sent; `503
/// unavailable` when there is none within [`READ_PAGES_WAIT_TIMEOUT`].
pub(super) async fn reserve(app: &SharedApp, client: Option<IpAddr>, bytes: usize) -> Result<Room, ApiError> {
    let deadline = tokio::time::Instant::now() + READ_PAGES_WAIT_TIMEOUT;
    let own = client.map(|ip| app.client_read_pages.of(ip));
    Room::take(&app.read_pages, own.as_ref(), bytes, Some(deadline)).await.map_err(|full| match full {
        RoomFull::Client => ApiError::Unavailable(format!(
            "this client already holds {} MiB of pages it has not read yet",
            READ_PAGES_BYTES_PER_CLIENT_MAX >> 20
        )),
        RoomFull::Node => ApiError::Unavailable("the node is busy sending pages to other readers".into()),
    })
}

#[cfg(test)]
mod tests {
    use super::page_bounds;

    fn record(first_sequence: u64, current_sequence: u64, deleted: bool) -> raft_store::TopicRecord {
        raft_store::TopicRecord {
            deleted,
            current_sequence,
            first_sequence,
            ..raft_store::TopicRecord::new(1, "t", 0, None, Default::default())
        }
    }

    #[test]
    fn a_page_starting_at_its_start_keeps_the_records_first_sequence() {
        // Read after 4 (the cursor), messages 5 to 7: nothing expired in between.
        assert_eq!(page_bounds(&record(3, 9, false), 4, 4, Some((5, 7))), (7, 3));
        // Below the retained range the page starts at the record's first.
        assert_eq!(page_bounds(&record(10, 12, false), 2, 9, Some((10, 12))), (12, 10));
        // An empty page of a live topic has nothing to say about retention.
        assert_eq!(page_bounds(&record(3, 4, false), 4, 4, None), (4, 3));
    }

    #[test]
    fn a_page_starting_above_its_start_reports_its_first_message_at_least() {
        // Trimmed to 8 after the record (first 3) was taken: 5 to 7 expired.
        assert_eq!(page_bounds(&record(3, 9, false), 4, 4, Some((8, 9))), (9, 8));
        // A cursor below the range starts behind the record's first (5); trimmed to 9 since.
        assert_eq!(page_bounds(&record(5, 9, false), 2, 4, Some((9, 9))), (9, 9));
    }

    #[test]
    fn an_empty_page_of_a_deleted_topic_passes_what_expired() {
        // Deleted at 10, then trimmed to nothing: 6 to 10 are gone, and the cursor moves to 10,
        // where the next read is 404, instead of asking for 6 forever.
        assert_eq!(page_bounds(&record(11, 10, true), 5, 10, None), (10, 11));
        // Trimmed between the record (first 3) and the read.
        assert_eq!(page_bounds(&record(3, 10, true), 5, 5, None), (10, 11));
    }
}
