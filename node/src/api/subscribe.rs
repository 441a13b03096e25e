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
/// there), or a deletion since the subscription's start that ended the topic past it (the
/// messages up to there are owed; the session stops at that deletion); `404 topic_not_found`
/// when the topic is deleted by then and owes it nothing; otherwise `400 invalid_cursor`, naming
/// the topic's `current_sequence` as it then is. Waits on a clone: the session's own feed still
/// sees every change from its start. A node that starts shutting down meanwhile answers `503
/// unavailable` at once.
async fn reached(
    app: &SharedApp,
    topic: &str,
    feed: &watch::Receiver<TopicSignal>,
    cursor: u64,
    deletions_at_start: u64,
) -> Result<u64, ApiError> {
    let mut feed = feed.clone();
    let deleted = |s: &TopicSignal| s.deleted || s.deletions != deletions_at_start;
    let reached = |s: &TopicSignal| s.current_sequence >= cursor && !deleted(s);
    let settled = |s: &TopicSignal| reached(s) || deleted(s);
    tokio::select! {
        _ = tokio::time::timeout(SUBSCRIBE_CURSOR_AHEAD_WAIT, feed.wait_for(settled)) => {}
        () = app.shutdown.cancelled() => return Err(ApiError::Unavailable("the node is shutting down".into())),
    }
    let now = *feed.borrow();
    let owed_before_deletion = now.deletions != deletions_at_start && now.deleted_after(deletions_at_start) > cursor;
    if reached(&now) || owed_before_deletion {
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
            Ok(_) if record.deleted => return Err(ApiError::TopicNotFound(topic)),
            Ok(n) => reached(&app, &topic, &feed, n, deletions_at_start).await?,
            Err(_) => return Err(ApiError::InvalidCursor(format!("cursor {text:?} is not a number"))),
        },
    };
    // A deleted topic still serves a subscriber owed messages from before its deletion (one
    // resuming after its connection dropped, say): those, then `topic_deleted` (the session
    // sees it deleted), as it would have had them connected. Nothing is owed past the deletion.
    if record.deleted && cursor >= record.current_sequence {
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
