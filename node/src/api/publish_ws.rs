//! `GET /topics/:name/publish` (ext): publishing over one WebSocket, many messages in flight.
//!
//! Client frames: `{"type":"publish","ref":R,"id":ID?,"payload":P,"timestamp":T?}` (`ref` is
//! any string or number the client uses to pair answers; answers may arrive out of order).
//! Server frames: `{"type":"ack","ref":R,"id":ID,"sequence":N,"raft_index":I}` once the message
//! is committed on a majority and applied, or `{"type":"error","ref":R,"error":CODE,"message":M,...}`
//! with the same codes and fields as the HTTP API. Same guarantees as `POST /messages`
//! with `ack=committed`; only the leader accepts the upgrade (a follower answers 307 first).

use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::Uri;
use axum::response::{IntoResponse, Response};
use futures_util::{SinkExt, StreamExt};
use raft_store::Request;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{json, Value};
use tokio::sync::{mpsc, Semaphore};

use super::input;
use super::publish::{new_message_from, present, stored_sequence, Incoming, MessageFields};
use super::topics::active;
use crate::app::SharedApp;
use crate::error::ApiError;
use crate::limits::{PUBLISHER_READ_BUFFER_BYTES, PUBLISH_BODY_BYTES_MAX, PUBLISH_WS_INFLIGHT_MAX};
use crate::metrics::Outcome;

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

pub async fn upgrade(
    State(app): State<SharedApp>,
    path: Result<Path<String>, PathRejection>,
    uri: Uri,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let topic = input::topic_name(path)?;
    app.require_leader(&input::path_and_query(&uri))?;
    active(&app, &topic)?;
    let upgrade = upgrade.map_err(|_| ApiError::InvalidRequest("this endpoint is a WebSocket".into()))?;
    Ok(upgrade
        .max_message_size(PUBLISH_BODY_BYTES_MAX)
        .read_buffer_size(PUBLISHER_READ_BUFFER_BYTES)
        .on_upgrade(move |socket| serve(app, socket, topic))
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

fn error_frame(reference: Option<&RawValue>, e: &ApiError) -> String {
    let mut body = e.body();
    body["type"] = json!("error");
    body["ref"] = reference.and_then(|r| serde_json::from_str(r.get()).ok()).unwrap_or(Value::Null);
    body.to_string()
}

async fn serve(app: SharedApp, socket: WebSocket, topic: String) {
    let (mut sink, mut stream) = socket.split();
    let (tx, mut rx) = mpsc::channel::<String>(PUBLISH_WS_INFLIGHT_MAX);
    // Answers of one committed batch arrive together: they go out in one write, not one
    // write (and syscall) per ack.
    let writer = tokio::spawn(async move {
        while let Some(text) = rx.recv().await {
            // The batch's other publish tasks were woken with the one that sent this answer:
            // yielding once lets them queue their answers for this same write (measured: about
            // 2 acks per send without it).
            tokio::task::yield_now().await;
            if sink.feed(Message::Text(text.into())).await.is_err() {
                break;
            }
            let mut failed = false;
            while let Ok(more) = rx.try_recv() {
                if sink.feed(Message::Text(more.into())).await.is_err() {
                    failed = true;
                    break;
                }
            }
            if failed || sink.flush().await.is_err() {
                break;
            }
        }
    });
    // Bounds the publishes in flight on this connection: past it, reading waits.
    let permits = Arc::new(Semaphore::new(PUBLISH_WS_INFLIGHT_MAX));
    loop {
        let message = tokio::select! {
            m = stream.next() => m,
            _ = app.shutdown.cancelled() => break,
        };
        let text = match message {
            Some(Ok(Message::Text(text))) => text,
            Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
            Some(Ok(_)) => continue,
        };
        let Ok(permit) = permits.clone().acquire_owned().await else {
            break;
        };
        let (app, tx, topic) = (app.clone(), tx.clone(), topic.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let answer = match serde_json::from_str::<PublishFrame>(&text) {
                Err(e) => error_frame(None, &ApiError::InvalidRequest(format!("invalid frame: {e}"))),
                Ok(frame) => {
                    let reference = frame.reference.as_deref();
                    if frame.kind != "publish" {
                        error_frame(reference, &ApiError::InvalidRequest("frames must have type \"publish\"".into()))
                    } else {
                        let fields = MessageFields { id: frame.id, payload: frame.payload, timestamp: frame.timestamp };
                        match publish_one(&app, &topic, fields).await {
                            Ok((id, sequence, raft_index)) => {
                                let ack = AckFrame { kind: "ack", reference, id: &id, sequence, raft_index };
                                // Strings and integers only: serializing cannot fail.
                                serde_json::to_string(&ack).unwrap_or_default()
                            }
                            Err(e) => error_frame(reference, &e),
                        }
                    }
                }
            };
            let _ = tx.send(answer).await;
        });
    }
    drop(tx);
    // Answers still in flight are delivered before the socket closes.
    let _ = writer.await;
}

/// Publishes one message; answers its id, sequence and log index.
async fn publish_one(app: &SharedApp, topic: &str, fields: MessageFields) -> Result<(String, u64, u64), ApiError> {
    let Incoming { message, id_generated } = new_message_from(app, fields)?;
    active(app, topic)?;
    // No duplicate lookup before proposing: apply finds a duplicate and answers with its
    // sequence, as it would for one proposed concurrently.
    let id = message.id.clone();
    let request = Request::publish(topic.to_string(), vec![message], app.now_ms(), id_generated);
    let written = app
        .write(request, &format!("/topics/{topic}/publish"))
        .await
        .inspect_err(|_| app.metrics.count_publish(Outcome::Error, 1))?;
    let sequence = stored_sequence(app, topic, &id, written.response)?;
    Ok((id, sequence, written.log_index))
}
