//! `GET /cluster`, `/health`, `/ready`, `/metrics` (API.md §2).

use std::time::Duration;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use openraft::ServerState;
use serde_json::{json, Value};

use super::input;
use crate::app::{Leadership, SharedApp};
use crate::budget::{Room, RoomFull};
use crate::error::ApiError;
use crate::limits::{METRICS_BODIES_WAIT_TIMEOUT, READY_LEADER_UNHEARD_ELECTION_TIMEOUTS};
use crate::metrics::Metrics;
use crate::serve::ClientAddr;

pub fn role(state: ServerState) -> &'static str {
    match state {
        ServerState::Leader => "leader",
        ServerState::Follower => "follower",
        ServerState::Candidate => "candidate",
        ServerState::Learner => "learner",
        ServerState::Shutdown => "shutdown",
    }
}

pub async fn cluster(State(app): State<SharedApp>) -> Json<Value> {
    // One snapshot of the metrics, so that the term, role and leader agree.
    let m = app.raft.metrics().borrow().clone();
    let membership = m.membership_config.membership();
    let (leader_id, leader_address) = match app.leadership_in(&m) {
        // The address the cluster recorded, which peers dial and followers redirect to (a node
        // that joined without --advertise guessed a loopback one for itself).
        Leadership::Me => {
            let own = membership.get_node(&app.id()).map_or(app.config.advertise.as_str(), |n| n.addr.as_str());
            (Some(app.id()), Some(app.client_address(app.id(), own)))
        }
        Leadership::Other { id, addr } => (Some(id), Some(app.client_address(id, &addr))),
        Leadership::Unknown => (None, None),
    };
    let mut peers: Vec<(u64, String)> =
        membership.voter_ids().filter_map(|id| membership.get_node(&id).map(|n| (id, n.addr.clone()))).collect();
    if peers.is_empty() {
        // Not initialized yet: the voters this node was started with.
        peers = app.config.peers.iter().map(|(id, addr)| (*id, addr.clone())).collect();
    }
    peers.sort();
    // As the leader's refusal counts them (its own claim included here).
    let short_of_disk = crate::disk_room::members_short_of_room(&app, None);
    Json(json!({
        "node_id": format!("node-{}", app.id()),
        "version": crate::VERSION,
        "commit": crate::COMMIT,
        "cluster_id": app.reader.cluster_id(),
        "leader_id": leader_id.map(|id| format!("node-{id}")),
        "leader_address": leader_address,
        "peers": peers.into_iter().map(|(id, addr)| app.client_address(id, &addr)).collect::<Vec<_>>(),
        "raft_term": m.current_term,
        // The vote as saved on disk (`raft_term` is the one in memory, which may be ahead of
        // it for a moment): in openraft's mode it only ever goes up, restarts included (a
        // data dir lost and started again empty starts over).
        "raft_vote": {
            "term": m.vote.leader_id.term,
            "node_id": format!("node-{}", m.vote.leader_id.node_id),
            "committed": m.vote.committed,
        },
        "commit_index": app.commit_index(m.last_applied.map_or(0, |l| l.index)),
        "role": role(m.state),
        "last_applied": m.last_applied.map(|l| l.index).unwrap_or(0),
        "nodes_short_of_disk": crate::error::node_names(&short_of_disk),
        "members": super::members::members_progress_json(&app, &m),
        "membership_joint": crate::raft::joint::is_joint(membership),
    }))
}

pub async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// Ready once this node knows a leader it hears from and has applied everything it knows is
/// committed.
pub async fn ready(State(app): State<SharedApp>) -> Result<Json<Value>, ApiError> {
    let applied = app.raft.metrics().borrow().last_applied.map(|l| l.index).unwrap_or(0);
    let committed = app.commit_index(applied);
    if app.leadership() == Leadership::Unknown {
        return Err(ApiError::NotReady("no leader is known".into()));
    }
    let unheard = Duration::from_millis(app.config.election_timeout_ms) * READY_LEADER_UNHEARD_ELECTION_TIMEOUTS;
    if app.leaderless(unheard) {
        return Err(ApiError::NotReady(format!("the leader has not been heard from for {} ms", unheard.as_millis())));
    }
    if applied < committed {
        return Err(ApiError::NotReady(format!("applied {applied} of {committed} committed entries")));
    }
    Ok(Json(json!({"status": "ready", "last_applied": applied, "commit_index": committed})))
}

/// The body (one series per topic: megabytes with many) counts against the metrics budget and
/// its client's share until sent, and is built off the async workers. That budget is not the
/// read-pages one, so a node whose readers fill theirs still shows it.
pub async fn metrics(
    State(app): State<SharedApp>,
    client: Option<Extension<ClientAddr>>,
) -> Result<Response, ApiError> {
    let own = input::client_ip(client).map(|ip| app.client_metrics_bodies.of(ip));
    let bytes = Metrics::rendered_bytes_max(app.reader.topic_count());
    let deadline = tokio::time::Instant::now() + METRICS_BODIES_WAIT_TIMEOUT;
    let room =
        Room::take(&app.metrics_bodies, own.as_ref(), bytes, Some(deadline)).await.map_err(|full| match full {
            RoomFull::Client => {
                ApiError::Unavailable("this client already holds a metrics body it has not read".into())
            }
            RoomFull::Node => ApiError::Unavailable("the node is busy sending metrics to other scrapers".into()),
        })?;
    let turn = app.metrics.render_turn().await;
    // The room and the turn go with the render: a client gone meanwhile does not give them
    // back while the body is still being built.
    let rendering = app.clone();
    let body = tokio::task::spawn_blocking(move || {
        let body = rendering.metrics.render(&rendering, &turn);
        drop(turn);
        room.hold(body.into_bytes())
    })
    .await
    .map_err(|e| ApiError::Internal(format!("rendering the metrics failed: {e}")))?;
    let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    Ok(([(header::CONTENT_TYPE, content_type)], body).into_response())
}
