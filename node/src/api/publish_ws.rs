//! `GET /topics/:name/publish` (ext): publishing over one WebSocket, many messages in flight.
//!
//! Client frames: `{"type":"publish","ref":R,"id":ID?,"payload":P,"timestamp":T?}` (`ref` is
//! any JSON value, echoed when at most 256 bytes as written, that the client uses to pair
//! answers; answers may arrive out of order).
//! Server frames: `{"type":"ack","ref":R,"id":ID,"sequence":N,"raft_index":I}` once the message
//! is committed on a majority and applied, or `{"type":"error","ref":R,"error":CODE,"message":M,...}`
//! with the same codes and fields as the HTTP API. Same guarantees as `POST /messages`
//! with `ack=committed`; only the leader accepts the upgrade (a follower answers 307 first).
//! A connection's messages are stored in the order sent: one task per connection queues its
//! groups of frames in turn, and only their commits are awaited together.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::PathRejection;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, RawQuery, State};
use axum::http::Uri;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use futures_util::stream::SplitSink;
use futures_util::{FutureExt, SinkExt, StreamExt};
use raft_store::{NewMessage, PublishResult};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_tungstenite::tungstenite;
use tokio_util::sync::CancellationToken;

use super::input;
use super::publish::{new_message_from, present, publish_outcome, queue_publish, Incoming, MessageFields};
use super::topics::active;
use crate::app::SharedApp;
use crate::budget::{ByteBudget, Room};
use crate::error::{truncated, ApiError};
use crate::limits::{
    PUBLISHER_READ_BUFFER_BYTES, PUBLISH_BODY_BYTES_MAX, PUBLISH_WS_CONNECTIONS_MAX, PUBLISH_WS_ERROR_TEXT_CHARS_MAX,
    PUBLISH_WS_FRAME_READ_BYTES_MAX, PUBLISH_WS_GROUP_BYTES_MAX, PUBLISH_WS_GROUP_FRAMES_MAX, PUBLISH_WS_IDLE_TIMEOUT,
    PUBLISH_WS_INFLIGHT_BYTES_MAX, PUBLISH_WS_INFLIGHT_MAX, PUBLISH_WS_PING_INTERVAL, PUBLISH_WS_REF_BYTES_MAX,
    PUBLISH_WS_SEND_TIMEOUT,
};
use crate::serve::ClientAddr;
use crate::ws_close;

#[derive(Deserialize)]
struct PublishFrame {
    #[serde(rename = "type")]
    kind: String,
    #[serde(rename = "ref", default)]
    reference: Option<Box<RawValue>>,
    id: Option<String>,
    #[serde(default, deserialize_with = "present")]
    payload: Option<Box<RawValue>>,
    timestamp: Option<u64>,
}

/// The `ref` of a frame that is JSON but not a valid publish frame (a field missing or of the
/// wrong type), so its error can still be matched to it; read only on that error path.
#[derive(Deserialize)]
struct FrameRef {
    #[serde(rename = "ref", default)]
    reference: Option<Box<RawValue>>,
}

pub async fn upgrade(
    State(app): State<SharedApp>,
    client: Option<Extension<ClientAddr>>,
    path: Result<Path<String>, PathRejection>,
    uri: Uri,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let topic = input::topic_name(path)?;
    input::query(RawQuery(uri.query().map(String::from)))?;
    let client = input::client_ip(client);
    app.require_leader_applied(&input::path_and_query(&uri)).await?;
    active(&app, &topic)?;
    let upgrade = upgrade.map_err(|_| ApiError::InvalidRequest("this endpoint is a WebSocket".into()))?;
    // Taken before the upgrade, so that concurrent upgrades cannot overshoot.
    let place = app.publishing_connections.clone().try_acquire_owned().map_err(|_| {
        ApiError::Unavailable(format!("this node already serves {PUBLISH_WS_CONNECTIONS_MAX} publishing connections"))
    })?;
    Ok(upgrade
        .max_message_size(PUBLISH_BODY_BYTES_MAX)
        .max_frame_size(PUBLISH_WS_FRAME_READ_BYTES_MAX)
        .read_buffer_size(PUBLISHER_READ_BUFFER_BYTES)
        .on_upgrade(move |socket| async move {
            serve(app, client, socket, topic).await;
            drop(place);
        })
        .into_response())
}

/// An ack, serialized straight from its fields; `ref` is echoed as the client wrote it.
#[derive(Serialize)]
struct AckFrame<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(rename = "ref")]
    reference: Option<&'a RawValue>,
    id: &'a str,
    sequence: u64,
    raft_index: u64,
}

/// An error answer: the error body with `type` and `ref`, the `ref` echoed byte for byte as
/// the client wrote it (parsed into a number, a large one would come back changed).
fn error_frame(reference: Option<&RawValue>, e: &ApiError) -> String {
    frame_with_body(reference, &e.body().to_string())
}

/// An error frame of `body`, an error body serialized.
fn frame_with_body(reference: Option<&RawValue>, body: &str) -> String {
    let reference = reference.map_or("null", |r| r.get());
    // The body is an object with fields (error, message, details): splice ours in front.
    match body.strip_prefix('{').filter(|fields| *fields != "}") {
        Some(fields) => format!("{{\"type\":\"error\",\"ref\":{reference},{fields}"),
        None => format!("{{\"type\":\"error\",\"ref\":{reference}}}"),
    }
}

/// `reference` when it is short enough to echo ([`PUBLISH_WS_REF_BYTES_MAX`]), else `None`.
fn echoable(reference: Option<&RawValue>) -> Option<&RawValue> {
    reference.filter(|r| r.get().len() <= PUBLISH_WS_REF_BYTES_MAX)
}

/// Frames read together, with their share of the connection's room in flight (count, bytes),
/// held until they are answered, and of the node's room for request bodies (and its client's
/// share of it), held until they are in the proposer's queue (which counts them from there).
struct Group {
    frames: Vec<Utf8Bytes>,
    room: (OwnedSemaphorePermit, OwnedSemaphorePermit),
    node_room: Room,
}

/// How a publishing connection ends: the close frame the server sends.
type CloseWith = (u16, &'static str);

async fn serve(app: SharedApp, client: Option<IpAddr>, socket: WebSocket, topic: String) {
    let (mut sink, mut stream) = socket.split();
    let (tx, mut rx) = mpsc::channel::<String>(PUBLISH_WS_INFLIGHT_MAX);
    // Cancelled when the writer stops (the client stopped reading, or the socket failed):
    // reading more publishes whose answers cannot be sent would be pointless.
    let writer_stopped = CancellationToken::new();
    let stopped = writer_stopped.clone();
    // When the writer last got answers through, in ms from `opened`: a client taking a long
    // burst of answers slowly is alive even while it sends nothing.
    let opened = tokio::time::Instant::now();
    let written_at = Arc::new(AtomicU64::new(0));
    let written = written_at.clone();
    let progress = move || written.store(opened.elapsed().as_millis() as u64, Ordering::Relaxed);
    // Answers of one committed batch arrive together: they go out in one write, not one
    // write (and syscall) per ack. Once every answer is out, or the socket failed, the writer
    // hands the socket's writing half back for the close handshake.
    let writer = tokio::spawn(async move {
        let _stopped = stopped.drop_guard();
        // Pings make a live client answer (its WebSocket library sends the pong as it reads),
        // so the reader below can tell a silent connection from an idle one.
        let mut ping = tokio::time::interval(PUBLISH_WS_PING_INTERVAL);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ping.reset();
        loop {
            let text = tokio::select! {
                biased;
                text = rx.recv() => match text {
                    Some(text) => text,
                    None => break,
                },
                _ = ping.tick() => {
                    let pinged = tokio::time::timeout(PUBLISH_WS_SEND_TIMEOUT, sink.send(Message::Ping(Default::default())));
                    if !matches!(pinged.await, Ok(Ok(()))) {
                        return sink;
                    }
                    // Not progress: a ping fits in the socket's buffer whether or not the
                    // client reads; its pong is what counts.
                    continue;
                }
            };
            // The batch's other publish tasks were woken with the one that sent this answer:
            // yielding once lets them queue their answers for this same write (measured: about
            // 2 acks per send without it).
            tokio::task::yield_now().await;
            if !send_answers(&mut sink, text, &mut rx).await {
                return sink;
            }
            progress();
        }
        sink
    });
    // Bounds the publishes in flight on this connection, by count and by bytes: past either,
    // reading waits.
    let permits = Arc::new(Semaphore::new(PUBLISH_WS_INFLIGHT_MAX));
    let inflight_bytes = ByteBudget::new(PUBLISH_WS_INFLIGHT_BYTES_MAX);
    // Kept for the connection's life: a share still referred to is never forgotten.
    let client_bodies = client.map(|ip| app.client_request_bodies.of(ip));
    let (groups, to_propose) = mpsc::channel::<Group>(PUBLISH_WS_INFLIGHT_MAX);
    tokio::spawn(propose_in_order(app.clone(), topic.clone(), to_propose, tx.clone()));
    let mut open = true;
    let mut close_with: CloseWith = (1000, "");
    // Nothing read for this long (no frame, no pong to the writer's pings) while the server
    // waited to read, and nothing written either: the client is gone, or sent part of a frame
    // and stopped.
    let idle = tokio::time::sleep(PUBLISH_WS_IDLE_TIMEOUT);
    tokio::pin!(idle);
    while open {
        let first = tokio::select! {
            m = stream.next() => m,
            _ = app.shutdown.cancelled() => {
                close_with = (1001, "server shutting down");
                break;
            }
            _ = writer_stopped.cancelled() => break,
            () = &mut idle => {
                let written = opened + Duration::from_millis(written_at.load(Ordering::Relaxed));
                if written + PUBLISH_WS_IDLE_TIMEOUT > tokio::time::Instant::now() {
                    idle.as_mut().reset(written + PUBLISH_WS_IDLE_TIMEOUT);
                    continue;
                }
                close_with = (1001, "nothing read from the client, not even a pong");
                break;
            }
        };
        idle.as_mut().reset(tokio::time::Instant::now() + PUBLISH_WS_IDLE_TIMEOUT);
        let mut group = match read_frame(first) {
            Read::Text(text) => vec![text],
            Read::Other => continue,
            Read::Binary => {
                let _ = tx.send(binary_frame()).await;
                continue;
            }
            Read::Closed => break,
            Read::Ends { answer, close } => {
                let _ = tx.send(answer).await;
                close_with = close;
                break;
            }
        };
        // A frame read with the group that ends the connection: answered after the group.
        let mut ends = None;
        // Frames that were read with the first one (a client with many in flight sends them
        // in bursts) need no wait: they join its proposal.
        let mut bytes = group[0].len();
        while group.len() < PUBLISH_WS_GROUP_FRAMES_MAX && bytes < PUBLISH_WS_GROUP_BYTES_MAX {
            let Some(next) = stream.next().now_or_never() else { break };
            match read_frame(next) {
                Read::Text(text) => {
                    bytes += text.len();
                    group.push(text);
                }
                Read::Other => {}
                Read::Binary => {
                    let _ = tx.send(binary_frame()).await;
                }
                Read::Closed => {
                    open = false;
                    break;
                }
                Read::Ends { answer, close } => {
                    (ends, open) = (Some((answer, close)), false);
                    break;
                }
            }
        }
        // The group's size is at most PUBLISH_WS_GROUP_FRAMES_MAX, which fits in a u32.
        let frames = group.len() as u32;
        // The node's budget for request bodies too, and the client's share of it: without
        // them, many connections could each hold their own budget's worth while the
        // proposer's queue is full.
        let room = async {
            let count = permits.clone().acquire_many_owned(frames).await;
            let connection_bytes = inflight_bytes.take(bytes).await;
            let node_bytes = Room::take(&app.request_bodies, client_bodies.as_ref(), bytes, None).await;
            (count, connection_bytes, node_bytes.expect("a wait without a deadline ends with room"))
        };
        let (Ok(count), own_bytes, node_bytes) = (tokio::select! {
            room = room => room,
            _ = app.shutdown.cancelled() => {
                // Read but never proposed: the client learns these are not stored (and may
                // publish them elsewhere) instead of seeing the close with no answer.
                let e = ApiError::Unavailable("the server is shutting down; this message was not published".into());
                send_all(&tx, refused(&group, &e)).await;
                close_with = (1001, "server shutting down");
                break;
            }
            _ = writer_stopped.cancelled() => break,
        }) else {
            break;
        };
        // Counted from here: the wait for room above was the server's, not the client's.
        idle.as_mut().reset(tokio::time::Instant::now() + PUBLISH_WS_IDLE_TIMEOUT);
        if let Some((answer, close)) = ends {
            let _ = tx.send(answer).await;
            close_with = close;
        }
        // Never waits: groups in flight are bounded by the permits above.
        if groups.send(Group { frames: group, room: (count, own_bytes), node_room: node_bytes }).await.is_err() {
            break;
        }
    }
    // Counted from here: a stopping node waits for the answers still in flight (Raft's, then
    // the writer's) and the close handshake.
    let closing = app.closing.token();
    drop(groups);
    drop(tx);
    // Answers still in flight are delivered before the socket closes; then it says why.
    if let Ok(sink) = writer.await {
        ws_close::close(closing, sink, stream, Some(close_with)).await;
    }
}

/// Sends `first` and the answers queued behind it when it came in one write; false when the
/// socket failed or the client did not take them within [`PUBLISH_WS_SEND_TIMEOUT`] (a client
/// that stopped reading would hold every publish of the connection, and their frames,
/// forever). Answers that come during the write wait for the next one: a client reading
/// steadily, a little slower than its answers come, would otherwise keep one write going
/// until the timeout ended the connection.
async fn send_answers(
    sink: &mut SplitSink<WebSocket, Message>,
    first: String,
    rx: &mut mpsc::Receiver<String>,
) -> bool {
    let queued = rx.len();
    let send = async {
        sink.feed(Message::Text(first.into())).await?;
        for _ in 0..queued {
            let Ok(more) = rx.try_recv() else { break };
            sink.feed(Message::Text(more.into())).await?;
        }
        sink.flush().await
    };
    matches!(tokio::time::timeout(PUBLISH_WS_SEND_TIMEOUT, send).await, Ok(Ok(())))
}

/// One read from the client's side of the socket.
enum Read {
    Text(Utf8Bytes),
    /// Pings and pongs: nothing to answer.
    Other,
    /// A binary frame: publishes are JSON text, so it is answered with an error.
    Binary,
    /// The client closed, or the connection broke.
    Closed,
    /// A frame the connection cannot go on after (over the size limit, or a text frame that
    /// is not UTF-8, RFC 6455 §8.1): the client is told why, in an answer and the close code.
    Ends {
        answer: String,
        close: CloseWith,
    },
}

fn read_frame(message: Option<Result<Message, axum::Error>>) -> Read {
    match message {
        Some(Ok(Message::Text(text))) => Read::Text(text),
        Some(Err(e)) if is_over_size_limit(&e) => {
            Read::Ends { answer: too_large_frame(), close: (1009, "publish frame too large") }
        }
        Some(Err(e)) if matches!(tungstenite_error(&e), Some(tungstenite::Error::Utf8(_))) => {
            Read::Ends { answer: not_utf8_frame(), close: (1007, "text frame not UTF-8") }
        }
        Some(Ok(Message::Close(_))) | None | Some(Err(_)) => Read::Closed,
        Some(Ok(Message::Binary(_))) => Read::Binary,
        Some(Ok(_)) => Read::Other,
    }
}

pub(crate) fn is_over_size_limit(e: &axum::Error) -> bool {
    matches!(tungstenite_error(e), Some(tungstenite::Error::Capacity(_)))
}

/// The WebSocket library's own error under axum's.
fn tungstenite_error(e: &axum::Error) -> Option<&tungstenite::Error> {
    std::error::Error::source(e).and_then(|inner| inner.downcast_ref::<tungstenite::Error>())
}

/// The answer to a text frame that is not UTF-8, so not JSON either.
fn not_utf8_frame() -> String {
    error_frame(None, &ApiError::InvalidRequest("a text frame that is not UTF-8; the connection closes".into()))
}

/// The answer to a frame over [`PUBLISH_BODY_BYTES_MAX`]; its `ref` was never read.
fn too_large_frame() -> String {
    let e = ApiError::PayloadTooLarge(format!(
        "a publish frame is limited to {PUBLISH_BODY_BYTES_MAX} bytes; the connection closes"
    ));
    error_frame(None, &e)
}

/// The answer to a binary frame, whose `ref` is not read: publishes are text frames.
fn binary_frame() -> String {
    error_frame(None, &ApiError::InvalidRequest("publish frames are JSON text; a binary frame is not read".into()))
}

/// The `ref` of a frame that is not a valid publish frame, if it is JSON with one.
fn frame_ref(text: &Utf8Bytes) -> Option<Box<RawValue>> {
    serde_json::from_str::<input::Object<FrameRef>>(text.as_str()).ok().and_then(|input::Object(f)| f.reference)
}

/// The answers to a group's frames, read but not proposed: `e` for each, under its `ref`.
fn refused(frames: &[Utf8Bytes], e: &ApiError) -> Vec<String> {
    frames.iter().map(|text| error_frame(echoable(frame_ref(text).as_deref()), e)).collect()
}

/// A frame that passed the checks at the edge, waiting for its group's commit.
struct Accepted {
    /// Position of the frame in its group, which is the position of its answer.
    at: usize,
    reference: Option<Box<RawValue>>,
    id: String,
}

/// A group of frames after the checks at the edge.
struct Checked {
    /// One per frame, in frame order; filled in for the frames that failed the checks.
    answers: Vec<String>,
    /// The frames that passed, with their messages.
    accepted: Vec<Accepted>,
    messages: Vec<NewMessage>,
    ids_generated: bool,
}

/// Checks each frame of a group as `POST /messages` checks its body.
fn check_group(app: &SharedApp, frames: &[Utf8Bytes]) -> Checked {
    let mut answers = vec![String::new(); frames.len()];
    let mut accepted = Vec::with_capacity(frames.len());
    let mut messages = Vec::with_capacity(frames.len());
    let mut ids_generated = true;
    for (at, text) in frames.iter().enumerate() {
        let frame = match serde_json::from_str::<input::Object<PublishFrame>>(text.as_str()) {
            Ok(input::Object(frame)) => frame,
            Err(e) => {
                let reference = frame_ref(text);
                // Cut: serde's messages quote the offending value, and every frame's answer
                // waits in a queue bounded by count.
                let message = truncated(&e.to_string(), PUBLISH_WS_ERROR_TEXT_CHARS_MAX);
                let error = ApiError::InvalidRequest(format!("invalid frame: {message}"));
                answers[at] = error_frame(echoable(reference.as_deref()), &error);
                continue;
            }
        };
        if frame.reference.as_deref().is_some_and(|r| echoable(Some(r)).is_none()) {
            let e = ApiError::InvalidRequest(format!("`ref` is limited to {PUBLISH_WS_REF_BYTES_MAX} bytes of JSON"));
            answers[at] = error_frame(None, &e);
            continue;
        }
        if frame.kind != "publish" {
            let e = ApiError::InvalidRequest("frames must have type \"publish\"".into());
            answers[at] = error_frame(frame.reference.as_deref(), &e);
            continue;
        }
        let fields = MessageFields { id: frame.id, payload: frame.payload, timestamp: frame.timestamp };
        match new_message_from(app, fields) {
            Ok(Incoming { message, id_generated }) => {
                ids_generated &= id_generated;
                accepted.push(Accepted { at, reference: frame.reference, id: message.id.clone() });
                messages.push(message);
            }
            Err(e) => answers[at] = error_frame(frame.reference.as_deref(), &e),
        }
    }
    Checked { answers, accepted, messages, ids_generated }
}

/// Proposes the groups of one connection in the order their frames were read, each group's
/// valid frames as one multi-message publish (applied in frame order exactly as if each had
/// been proposed alone: each gets its own sequence, or its own `duplicate_message_id`), and
/// answers each frame once its group commits. Only the queueing is in turn: the commits of
/// many groups are awaited at once. So a connection's messages are stored in the order sent.
async fn propose_in_order(
    app: SharedApp,
    topic: String,
    mut groups: mpsc::Receiver<Group>,
    answers: mpsc::Sender<String>,
) {
    // Shared by every group's task of the connection.
    let where_: Arc<str> = Arc::from(format!("/topics/{topic}/publish"));
    let topic: Arc<str> = Arc::from(topic);
    while let Some(Group { frames, room, node_room }) = groups.recv().await {
        let Checked { answers: mut out, accepted, messages, ids_generated } = check_group(&app, &frames);
        drop(frames);
        if messages.is_empty() {
            send_all(&answers, out).await;
            continue;
        }
        let count = messages.len();
        // Leadership is checked per group (`queue_publish`), as every HTTP write is: a leader
        // cut off from its quorum stays in office until it hears of a newer term, and its
        // publishes would only time out, while `no_leader` sends the client on at once.
        let queued = queue_publish(&app, &topic, messages, ids_generated, &where_).await;
        drop(node_room);
        let queued = match queued {
            Ok(queued) => queued,
            Err(e) => {
                answer_group(&mut out, &accepted, Err(e));
                send_all(&answers, out).await;
                continue;
            }
        };
        let (app, topic, answers) = (app.clone(), topic.clone(), answers.clone());
        tokio::spawn(async move {
            let _room = room;
            let outcome = publish_outcome(&app, &topic, count, app.committed(queued).await);
            answer_group(&mut out, &accepted, outcome);
            send_all(&answers, out).await;
        });
    }
}

async fn send_all(answers: &mpsc::Sender<String>, out: Vec<String>) {
    for answer in out {
        let _ = answers.send(answer).await;
    }
}

/// Fills in the answers of a group's accepted frames from the outcome of their publish.
fn answer_group(out: &mut [String], accepted: &[Accepted], outcome: Result<(Vec<PublishResult>, u64), ApiError>) {
    match outcome {
        Ok((results, raft_index)) => {
            for (a, result) in accepted.iter().zip(results) {
                let reference = a.reference.as_deref();
                out[a.at] = match result {
                    PublishResult::Stored { sequence } => {
                        let ack = AckFrame { kind: "ack", reference, id: &a.id, sequence, raft_index };
                        // Strings and integers only: serializing cannot fail.
                        serde_json::to_string(&ack).unwrap_or_default()
                    }
                    PublishResult::Duplicate { existing_sequence } => {
                        let e = ApiError::DuplicateMessageId {
                            id: a.id.clone(),
                            existing_sequence: Some(existing_sequence),
                        };
                        error_frame(reference, &e)
                    }
                };
            }
        }
        // After these the message may still commit: each answer names its id (which the node
        // may have generated), as an HTTP publish's does.
        Err(e) if e.may_still_commit() => {
            for a in accepted {
                out[a.at] =
                    frame_with_body(a.reference.as_deref(), &e.body_naming("id", serde_json::json!(a.id)).to_string());
            }
        }
        Err(e) => {
            for a in accepted {
                out[a.at] = error_frame(a.reference.as_deref(), &e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_group_answers_each_frame_under_its_ref() {
        let frames: Vec<Utf8Bytes> = [
            r#"{"type":"publish","ref":"r-1","payload":1}"#,
            r#"{"type":"publish","ref":12345678901234567890123,"payload":2}"#,
            "not json",
        ]
        .into_iter()
        .map(Utf8Bytes::from_static)
        .collect();
        let answers = refused(&frames, &ApiError::Unavailable("stopping".into()));
        let refs: Vec<String> = answers
            .iter()
            .map(|a| {
                assert!(a.contains(r#""type":"error""#) && a.contains(r#""error":"unavailable""#), "{a}");
                a.split(r#""ref":"#).nth(1).unwrap().split(',').next().unwrap().to_string()
            })
            .collect();
        assert_eq!(refs, [r#""r-1""#, "12345678901234567890123", "null"]);
    }
}
