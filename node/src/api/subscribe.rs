//! `GET /topics/:name/subscribe`: every check happens before the WebSocket upgrade, so a
//! refusal is an ordinary HTTP error body (API.md §5).

use axum::extract::rejection::PathRejection;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use raft_store::limits::CURSORS_PER_TOPIC_MAX;
use raft_store::{TopicRecord, TopicSignal};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::input;
use crate::app::SharedApp;
use crate::error::ApiError;
use crate::limits::{
    SUBSCRIBER_FRAME_BYTES_MAX, SUBSCRIBER_READ_BUFFER_BYTES, SUBSCRIBER_WRITE_BUFFER_BYTES,
    SUBSCRIBE_CURSOR_AHEAD_WAIT, SUBSCRIPTIONS_MAX,
};
use crate::serve::ClientAddr;
use crate::subscribe::session::{self, Registration, Session};

/// `cursor`, once this node's topic reaches it within [`SUBSCRIBE_CURSOR_AHEAD_WAIT`] (see
/// there), or a deletion since the subscription's start that ended the topic at or past it
/// (the messages up to there are owed, then the notice; the session stops at that deletion);
/// `404 topic_not_found` when the topic is deleted by then and owes it nothing; otherwise `400
/// invalid_cursor`, naming the topic's `current_sequence` as it then is. A deletion that ended
/// the topic below the cursor is passed, not owed: the cursor is in the topic created again
/// (read on a node further along), which this node is yet to reach. Waits on a clone: the
/// session's own feed still sees every change from its start. A node that starts shutting
/// down meanwhile answers `503 unavailable` at once.
async fn reached(
    shutdown: &CancellationToken,
    topic: &str,
    feed: &watch::Receiver<TopicSignal>,
    cursor: u64,
    deletions_at_start: u64,
) -> Result<u64, ApiError> {
    let mut feed = feed.clone();
    let owed_deletion = |s: &TopicSignal| s.deletions != s.deletions_passed(deletions_at_start, cursor);
    let settled = |s: &TopicSignal| owed_deletion(s) || (!s.deleted && s.current_sequence >= cursor);
    tokio::select! {
        _ = tokio::time::timeout(SUBSCRIBE_CURSOR_AHEAD_WAIT, feed.wait_for(settled)) => {}
        () = shutdown.cancelled() => return Err(ApiError::Unavailable("the node is shutting down".into())),
    }
    let now = *feed.borrow();
    if settled(&now) {
        Ok(cursor)
    } else if now.deleted {
        Err(ApiError::TopicNotFound(topic.to_string()))
    } else {
        Err(ApiError::InvalidCursor(format!(
            "cursor {cursor} is beyond the topic's current_sequence {}",
            now.current_sequence
        )))
    }
}

pub async fn subscribe(
    State(app): State<SharedApp>,
    path: Result<Path<String>, PathRejection>,
    query: RawQuery,
    client: Option<Extension<ClientAddr>>,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let topic = input::topic_name(path)?;
    let query = input::query(query)?;
    let cursor_text = query.get("cursor").map(|c| c.trim()).filter(|c| !c.is_empty() && *c != "latest");
    // A deleted topic may still owe a subscription with a cursor messages (below); one
    // without is owed nothing. Checked once before the watch is made, so that names never
    // created (or deleted, for a subscription owed nothing) leave no watch behind, then read
    // with the watch, so the cursor and the session's baseline agree.
    let found = |record: Option<TopicRecord>| {
        record.filter(|r| !r.deleted || cursor_text.is_some()).ok_or_else(|| ApiError::TopicNotFound(topic.clone()))
    };
    found(app.reader.topic(&topic))?;
    let watch = app.reader.watch_topic_with_record(&topic);
    let (feed, deletions_at_start) = (watch.feed, watch.signal.deletions);
    let record = found(watch.record)?;
    let subscriber_id = query
        .get("subscriber_id")
        .cloned()
        .ok_or_else(|| ApiError::InvalidRequest("subscriber_id is required".into()))?;
    input::id_field("subscriber_id", &subscriber_id)?;
    let cursor = match cursor_text {
        None => record.current_sequence,
        // 503 while a snapshot install rewrites the recorded cursors (`StoreError::Installing`).
        Some("acked") => app.reader.cursor(record.id, &subscriber_id)?.unwrap_or(0),
        Some(text) => match text.parse::<u64>() {
            Ok(n) if n <= record.current_sequence => n,
            // Also on a deleted topic: a node behind may be yet to apply its re-creation.
            Ok(n) => reached(&app.shutdown, &topic, &feed, n, deletions_at_start).await?,
            Err(_) => return Err(ApiError::InvalidCursor(format!("cursor {text:?} is not a number"))),
        },
    };
    // Deletions applied since the start that ended the topic below the cursor (a cursor
    // `acked` after a re-creation, one this node waited to reach) are not announced.
    let now = *feed.borrow();
    let deletions_at_start = now.deletions_passed(deletions_at_start, cursor);
    // A deleted topic still serves a subscriber owed messages from before its deletion (one
    // resuming after its connection dropped, say): those, then `topic_deleted` (the session
    // sees it deleted), as it would have had them connected. Nothing is owed past the deletion.
    if now.deleted && now.deletions == deletions_at_start && cursor >= now.current_sequence {
        return Err(ApiError::TopicNotFound(topic));
    }
    let upgrade = upgrade.map_err(|_| {
        ApiError::InvalidRequest("this endpoint is a WebSocket: send a WebSocket upgrade request".into())
    })?;
    // Told up front when its acks cannot be recorded (its topic holds the most recorded cursors
    // it may, none of them its own). A read failing during a snapshot install tells nothing.
    let acks_refused = app.reader.cursor_count(record.id) >= CURSORS_PER_TOPIC_MAX
        && matches!(app.reader.cursor(record.id, &subscriber_id), Ok(None));
    let client = super::input::client_ip(client);
    let session =
        Session { topic, topic_id: record.id, subscriber_id, cursor, feed, deletions_at_start, acks_refused, client };
    let Some(registration) = Registration::reserve(app.clone(), &session, SUBSCRIPTIONS_MAX) else {
        return Err(ApiError::Unavailable(format!("this node already serves {SUBSCRIPTIONS_MAX} subscriptions")));
    };
    Ok(upgrade
        .max_message_size(SUBSCRIBER_FRAME_BYTES_MAX)
        .max_frame_size(SUBSCRIBER_FRAME_BYTES_MAX)
        .read_buffer_size(SUBSCRIBER_READ_BUFFER_BYTES)
        .write_buffer_size(SUBSCRIBER_WRITE_BUFFER_BYTES)
        .on_upgrade(move |socket| async move {
            // On the delivery runtime when there is one (see `limits::DELIVERY_THREAD_NICE`),
            // detached: a session ends by itself when its client goes or the node shuts down.
            match app.env.delivery.clone() {
                Some(delivery) => drop(delivery.spawn(session::run(app, socket, session, registration))),
                None => session::run(app, socket, session, registration).await,
            }
        })
        .into_response())
}

#[cfg(test)]
mod tests {
    use raft_store::TopicRecord;

    use super::*;

    fn record(current_sequence: u64, deleted: bool) -> TopicRecord {
        TopicRecord { deleted, current_sequence, ..TopicRecord::new(1, "t", 0, None, Default::default()) }
    }

    /// A node at 9 in the topic's life, and what it applies after: the deletion at 10 alone,
    /// or with the re-creation and the messages up to `current`.
    fn applied(deletion_at: u64, current: Option<u64>) -> (TopicSignal, TopicSignal) {
        let start = TopicSignal::of(Some(&record(9, false)));
        let now = match current {
            Some(current) => start.after(Some(&record(current, false)), &[deletion_at]),
            None => start.after(Some(&record(deletion_at, true)), &[deletion_at]),
        };
        (start, now)
    }

    async fn reached_from(start: TopicSignal, now: TopicSignal, cursor: u64) -> Result<u64, ApiError> {
        let (signals, feed) = watch::channel(start);
        signals.send_replace(now);
        reached(&CancellationToken::new(), "t", &feed, cursor, start.deletions).await
    }

    /// Cursor 15 read on the leader after the topic was deleted at 10 and created again: this
    /// node, behind, applies all that and reaches 15. The deletion is below the cursor, so the
    /// subscription is the new topic's, not a `topic_deleted` or a cursor "beyond" 20.
    #[tokio::test(start_paused = true)]
    async fn a_deletion_below_the_cursor_is_passed_once_the_topic_reaches_it() {
        let (start, now) = applied(10, Some(20));
        assert!(matches!(reached_from(start, now, 15).await, Ok(15)));
        assert_eq!(now.deletions_passed(start.deletions, 15), now.deletions, "the session announces none");
    }

    /// The same node having applied only the deletion: it waits for the re-creation (none
    /// comes here), then refuses as a deleted topic.
    #[tokio::test(start_paused = true)]
    async fn a_deletion_below_the_cursor_does_not_end_the_wait() {
        let (start, now) = applied(10, None);
        let waited = tokio::time::Instant::now();
        assert!(matches!(reached_from(start, now, 15).await, Err(ApiError::TopicNotFound(_))));
        assert!(waited.elapsed() >= SUBSCRIBE_CURSOR_AHEAD_WAIT);
    }

    /// A deletion at or past the cursor is owed: the messages up to it, then its notice.
    #[tokio::test(start_paused = true)]
    async fn a_deletion_at_or_past_the_cursor_is_owed_at_once() {
        let (start, now) = applied(20, None);
        let waited = tokio::time::Instant::now();
        assert!(matches!(reached_from(start, now, 15).await, Ok(15)));
        assert!(matches!(reached_from(start, now, 20).await, Ok(20)));
        assert_eq!(waited.elapsed(), std::time::Duration::ZERO);
    }
}
