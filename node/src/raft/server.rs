//! `GET /raft`: a peer's WebSocket, feeding its RPCs to the local Raft.

use std::sync::Arc;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::header::AUTHORIZATION;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use openraft::raft::AppendEntriesResponse;
use subtle::ConstantTimeEq;
use tokio::sync::{Mutex, Semaphore};

use super::codec::{decode, encode, frame_id, ForwardError, ForwardReply, Frame, RpcRequest, RpcResponse};
use super::CLUSTER_ID_HEADER;
use crate::app::{App, SharedApp};
use crate::error::ApiError;
use crate::limits::{
    PEER_STALL_TIMEOUT, RAFT_MESSAGE_BYTES_MAX, RAFT_READ_BUFFER_BYTES, RAFT_ROOM_WAIT_MAX, RAFT_SERVER_INFLIGHT_MAX,
    WRITE_TIMEOUT,
};

pub async fn handle(
    State(app): State<SharedApp>,
    headers: HeaderMap,
    upgrade: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Response {
    if let Err(refused) = require_secret(&app, &headers) {
        return refused.into_response();
    }
    let presented = headers.get(CLUSTER_ID_HEADER).and_then(|v| v.to_str().ok()).map(str::to_string);
    if let Err(refused) = same_cluster(&app, presented.as_deref()) {
        return refused.into_response();
    }
    let Ok(upgrade) = upgrade else {
        return ApiError::InvalidRequest("GET /raft is a WebSocket endpoint for cluster peers".into()).into_response();
    };
    upgrade
        .read_buffer_size(RAFT_READ_BUFFER_BYTES)
        .max_message_size(RAFT_MESSAGE_BYTES_MAX)
        .max_frame_size(RAFT_MESSAGE_BYTES_MAX)
        .on_upgrade(move |socket| serve_peer(app, socket, presented))
}

/// With a cluster secret set, a request must present it (`Authorization: Bearer S`): peers'
/// Raft connections and membership changes (api/members.rs).
pub fn require_secret(app: &App, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(secret) = &app.config.cluster_secret else { return Ok(()) };
    let presented = headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    // Compared in constant time: how long a refusal takes says nothing of the secret.
    match presented.is_some_and(|p| bool::from(p.as_bytes().ct_eq(secret.as_bytes()))) {
        true => Ok(()),
        false => Err(ApiError::Unauthorized),
    }
}

/// Refuses a peer that presents another cluster's id than the one this node applied, or none
/// at all once this node has one: a peer that knows no id yet is a node of a cluster still
/// forming (or one whose data was wiped), and if it is not of ours its vote requests and
/// appends would take this node over (a new cluster whose peer list named a node of another
/// one elected its leader with that node's vote, and the node's Raft core then failed). A
/// node of ours that knows no id yet loses nothing: our nodes that know it dial it, and it
/// learns the id from them. A node with none yet (a new node) takes any peer.
fn same_cluster(app: &SharedApp, presented: Option<&str>) -> Result<(), ApiError> {
    let refused = match (app.reader.cluster_id(), presented) {
        (Some(ours), Some(presented)) if ours != presented => {
            ApiError::WrongCluster { ours: ours.to_string(), presented: Some(presented.to_string()) }
        }
        (Some(ours), None) => ApiError::WrongCluster { ours: ours.to_string(), presented: None },
        _ => return Ok(()),
    };
    tracing::warn!("refused a raft peer: {refused}");
    Err(refused)
}

/// Serves one peer's connection. `presented` is the cluster id it presented when it dialed:
/// checked again at every request, since this node may have had none then (a new node that
/// has applied its own since must not go on taking another cluster's appends).
async fn serve_peer(app: SharedApp, socket: WebSocket, presented: Option<String>) {
    let (sink, mut stream) = socket.split();
    // Each RPC's task writes its own answer. A writer task fed by a queue cost every RPC one
    // more hand-off between tasks (two RPCs per entry on a follower): with it, a follower
    // spent 12 % more CPU per entry at 1,000 publishes a second.
    let sink = Arc::new(Mutex::new(sink));
    // Past this many RPCs at work, reading waits: a peer retrying against a stalled node
    // then meets TCP backpressure (and its stall timeout) instead of piling up tasks here.
    let permits = Arc::new(Semaphore::new(RAFT_SERVER_INFLIGHT_MAX));
    loop {
        let message = tokio::select! {
            m = stream.next() => m,
            _ = app.shutdown.cancelled() => break,
        };
        let bytes = match message {
            Some(Ok(Message::Binary(bytes))) => bytes,
            Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
            Some(Ok(_)) => continue,
        };
        if same_cluster(&app, presented.as_deref()).is_err() {
            break;
        }
        // A slot of this connection and the request's bytes of the node's budget, taken before
        // the frame is decoded and held until it is answered, even if this connection ends
        // first. Waiting past RAFT_ROOM_WAIT_MAX, only a stalled Raft core holds the room: the
        // connection is closed rather than left holding a frame outside the budget.
        let room = async { (permits.clone().acquire_owned().await, app.raft_inbound.take(bytes.len()).await) };
        let held = tokio::select! {
            held = tokio::time::timeout(RAFT_ROOM_WAIT_MAX, room) => match held {
                Ok((Ok(permit), bytes)) => (permit, bytes),
                Ok((Err(_), _)) => break,
                Err(_) => {
                    tracing::warn!("raft requests waited {RAFT_ROOM_WAIT_MAX:?} for room; closing their connection");
                    break;
                }
            },
            _ = app.shutdown.cancelled() => break,
        };
        let frame = match decode::<RpcRequest>(&bytes) {
            Ok(frame) => frame,
            Err(e) => match frame_id(&bytes) {
                // A request of a newer build: only it fails, so the connection keeps carrying
                // the ones this node knows (and the sender does not re-dial in a loop).
                Some(id) => {
                    tracing::warn!(error = %e, id, "undecodable raft rpc; answering that it cannot be read");
                    if answer(&sink, Frame { id, body: RpcResponse::Undecodable }).await {
                        continue;
                    }
                    break;
                }
                None => {
                    tracing::warn!(error = %e, "unreadable raft frame; closing the peer connection");
                    break;
                }
            },
        };
        // The raw bytes are not needed once decoded: only the request is held meanwhile.
        drop(bytes);
        // Each RPC runs on its own task so a slow one (a snapshot chunk) does not hold up
        // votes and heartbeats on the same connection.
        let (app, sink) = (app.clone(), sink.clone());
        tokio::spawn(async move {
            let _held = held;
            let body = dispatch(&app, frame.body).await;
            answer(&sink, Frame { id: frame.id, body }).await;
        });
    }
}

/// Writes one answer, within [`PEER_STALL_TIMEOUT`]; false when it could not be written. A
/// failed or stalled write means the connection is gone or the peer stopped reading; the
/// peer retries on a new connection.
async fn answer(sink: &Mutex<SplitSink<WebSocket, Message>>, frame: Frame<RpcResponse>) -> bool {
    let bytes = match encode(&frame) {
        Ok(bytes) => bytes,
        Err(e) => {
            tracing::error!(error = %e, "cannot encode raft response");
            return true;
        }
    };
    let write = async { sink.lock().await.send(Message::Binary(bytes.into())).await };
    matches!(tokio::time::timeout(PEER_STALL_TIMEOUT, write).await, Ok(Ok(())))
}

async fn dispatch(app: &SharedApp, request: RpcRequest) -> RpcResponse {
    let me = app.id();
    match request {
        RpcRequest::Vote { target, .. }
        | RpcRequest::PreVote { target, .. }
        | RpcRequest::AppendEntries { target, .. }
        | RpcRequest::InstallSnapshot { target, .. }
        | RpcRequest::StepDown { target, .. }
        | RpcRequest::Clock { target }
            if target != me =>
        {
            RpcResponse::WrongNode { actual: me }
        }
        RpcRequest::Vote { req, .. } => RpcResponse::Vote(app.raft.vote(req).await),
        RpcRequest::PreVote { req, .. } => RpcResponse::PreVote(app.raft.pre_vote(req).await),
        RpcRequest::AppendEntries { req, .. } => {
            let answer = app.raft.append_entries(req).await;
            // Taken from the leader of this node's term (a stale one is told of a higher vote).
            if matches!(&answer, Ok(a) if !matches!(a, AppendEntriesResponse::HigherVote(_))) {
                app.heard_leader();
            }
            RpcResponse::AppendEntries(answer)
        }
        RpcRequest::InstallSnapshot { req, .. } => {
            let answer = app.raft.install_snapshot(req).await;
            if answer.is_ok() {
                app.heard_leader();
            }
            RpcResponse::InstallSnapshot(answer)
        }
        RpcRequest::Forward { req } => RpcResponse::Forward(forward(app, req).await),
        // Uncorrected: a node's agreement must not feed the others' (nor its own, echoed).
        RpcRequest::Clock { .. } => RpcResponse::Clock { now_ms: app.clock.local_ms() },
        RpcRequest::StepDown { vote, elect, .. } => {
            // A Raft that has stopped has nothing to hand over to: saying so keeps the leader
            // from counting this voter as one that stopped waiting out its lease.
            match app.raft.trigger().leader_stepped_down(vote, elect).await {
                Ok(()) => RpcResponse::SteppedDown,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot take over from a stopping leader");
                    RpcResponse::StepDownRefused
                }
            }
        }
    }
}

async fn forward(app: &SharedApp, req: raft_store::Request) -> Result<ForwardReply, ForwardError> {
    // A node forwards single writes; the proposer alone makes batches. One forwarded already
    // nested as deep as decoding allows would be wrapped once more into an entry no node
    // could decode.
    if matches!(req, raft_store::Request::Batch(_)) {
        return Err(ForwardError::Failed("a batch is not forwarded: the leader's proposer makes batches".into()));
    }
    // A node removed while it runs never learns of it and goes on claiming disk room.
    if let raft_store::Request::SetDiskShort { node_id, short: true, .. } = &req {
        if !crate::disk_room::members(app).contains(node_id) {
            return Err(ForwardError::Failed(format!("node-{node_id} is not a member of this cluster")));
        }
    }
    match tokio::time::timeout(WRITE_TIMEOUT, app.proposer.propose(req)).await {
        Err(_) => Err(ForwardError::Timeout),
        Ok(Ok(c)) => Ok(ForwardReply { log_index: c.log_index, response: c.response }),
        Ok(Err(crate::propose::ProposeFailure::ForwardToLeader { .. })) => Err(ForwardError::NotLeader),
        Ok(Err(e)) => Err(ForwardError::Failed(format!("{e:?}"))),
    }
}
