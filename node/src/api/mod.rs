//! The client API (API.md §2–§5) as axum routes.
//!
//! - [`cluster`]: `/cluster`, `/health`, `/ready`, `/metrics`.
//! - [`members`]: (ext) adding and removing cluster members.
//! - [`topics`]: topic create, list, get, delete, subscriber listing and forgetting.
//! - [`publish`]: single and batch publish.
//! - [`publish_ws`]: publishing over one WebSocket with many messages in flight (ext).
//! - [`messages`]: `GET /topics/:name/messages` with long-poll.
//! - [`subscribe`]: the checks before a WebSocket subscription is upgraded.
//! - [`input`]: request parsing and validation shared by the handlers.

pub mod cluster;
pub mod input;
pub mod members;
pub mod messages;
pub mod publish;
pub mod publish_ws;
pub mod subscribe;
pub mod topics;

use axum::extract::DefaultBodyLimit;
use axum::http::Uri;
use axum::routing::{delete, get, post};
use axum::Router;

use crate::app::SharedApp;
use crate::error::ApiError;

/// The routes under `/topics/{name}`, for [`unrouted`].
const TOPIC_ROUTES: [&str; 6] = ["", "/messages", "/messages/batch", "/publish", "/subscribe", "/subscribers"];

/// A path no route serves: 404, but for one with an empty topic name (`/topics/`,
/// `/topics//messages`), which the router cannot match and API.md calls an invalid name.
async fn unrouted(uri: Uri) -> ApiError {
    let path = uri.path();
    match path.strip_prefix("/topics/") {
        Some(rest) if TOPIC_ROUTES.contains(&rest) => ApiError::InvalidTopicName(String::new()),
        _ => ApiError::NotFound(path.to_string()),
    }
}

pub fn router(app: SharedApp) -> Router {
    Router::new()
        .route("/cluster", get(cluster::cluster))
        .route("/cluster/members", post(members::add))
        .route("/cluster/members/{id}", delete(members::remove))
        .route("/health", get(cluster::health))
        .route("/ready", get(cluster::ready))
        .route("/metrics", get(cluster::metrics))
        .route("/topics", get(topics::list))
        .route("/topics/{name}", post(topics::create).get(topics::get).delete(topics::delete))
        .route("/topics/{name}/messages", post(publish::publish).get(messages::read))
        .route("/topics/{name}/messages/batch", post(publish::batch))
        .route("/topics/{name}/publish", get(publish_ws::upgrade))
        .route("/topics/{name}/subscribe", get(subscribe::subscribe))
        .route("/topics/{name}/subscribers", get(topics::subscribers))
        .route("/topics/{name}/subscribers/{subscriber_id}", delete(topics::forget_subscriber))
        .route("/raft", get(crate::raft::server::handle))
        .fallback(unrouted)
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        // Bodies are read with per-route limits that answer API.md's 413 body (see `input`).
        .layer(DefaultBodyLimit::disable())
        .with_state(app)
}
