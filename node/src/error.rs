//! Every error the client API can answer, mapped to its HTTP status and the API.md error
//! body in exactly one place ([`IntoResponse`] for [`ApiError`]).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::limits::ERROR_MESSAGE_CHARS_MAX;

/// An error answered to a client.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A write reached a follower.
    #[error("this node is not the leader; send writes to node-{leader_id} at {leader_address}")]
    NotLeader { leader_id: u64, leader_address: String, path_and_query: String },
    #[error("no leader is known right now; retry shortly")]
    NoLeader,
    #[error("topic {0:?} does not exist")]
    TopicNotFound(String),
    #[error("message id {id:?} was already published to this topic")]
    DuplicateMessageId { id: String, existing_sequence: Option<u64> },
    #[error("{0}")]
    InvalidCursor(String),
    #[error("{0}")]
    InvalidRequest(String),
    #[error("topic name {0:?} must match [A-Za-z0-9._-]{{1,255}}")]
    InvalidTopicName(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("the request body did not arrive within {0} s")]
    RequestTimeout(u64),
    #[error("missing or wrong cluster secret")]
    Unauthorized,
    /// `presented` is `None` for a peer that knows no cluster id yet.
    #[error(
        "this node belongs to cluster {ours}, not {}: check the peer addresses",
        presented.as_deref().unwrap_or(
            "to one still forming (the peer presented no id; a node of ours started on an empty data dir \
             presents none until the leader's connection brings it the id)"
        )
    )]
    WrongCluster { ours: String, presented: Option<String> },
    #[error("the write was not committed within {0} ms; it may still commit")]
    RaftTimeout(u128),
    #[error("the write was appended but not committed: {0}")]
    NotCommitted(String),
    #[error("no route for {0}")]
    NotFound(String),
    #[error("no cursor is recorded for subscriber {subscriber_id:?} on topic {topic:?}")]
    CursorNotFound { topic: String, subscriber_id: String },
    #[error("method not allowed")]
    MethodNotAllowed,
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    NotReady(String),
    /// The leader's data dir has less room than it keeps free (`--min-free-bytes` plus its
    /// newest snapshot's size); nothing was proposed.
    #[error(
        "this node's data dir has {available} bytes available, less than the {needed} it keeps free \
         (--min-free-bytes {reserve}, plus the size of its newest snapshot, which the next one needs again): \
         nothing was stored; writes are taken again once the disk has room"
    )]
    InsufficientStorage { available: u64, needed: u64, reserve: u64 },
    /// Other nodes said their data dir is short of room; nothing was proposed.
    #[error(
        "the data dir of {} is short of room (its --min-free-bytes, plus the size of its newest snapshot): \
         nothing was stored; writes are taken again once it has room",
        node_list(nodes)
    )]
    NodesShortOfStorage { nodes: Vec<u64> },
    /// A membership change that contradicts the membership (an id at another address, an
    /// address another node has).
    #[error("{0}")]
    MemberConflict(String),
    #[error("node-{0} is not a member of this cluster")]
    MemberNotFound(u64),
    /// A learner added by `POST /cluster/members` that has not caught up yet: it stays a
    /// learner, and the same request again goes on waiting.
    #[error(
        "node-{node} was added as a learner but has not caught up with the leader's log within {secs} s; it stays \
         a learner: send the same request again to wait on and then make it a voter, or remove it"
    )]
    MemberCatchingUp { node: u64, secs: u64 },
    #[error("internal error: {0}")]
    Internal(String),
    /// `cause`, a failure after which a publish may still commit, naming the message's id
    /// (which the node may have generated): the client retries under it.
    #[error("{cause}")]
    Unconfirmed { id: String, cause: Box<ApiError> },
    /// The same for a batch, naming every message's id in order.
    #[error("{cause}")]
    UnconfirmedBatch { ids: Vec<String>, cause: Box<ApiError> },
}

impl ApiError {
    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            Self::Unconfirmed { cause, .. } | Self::UnconfirmedBatch { cause, .. } => cause.status_and_code(),
            Self::NotLeader { .. } => (StatusCode::TEMPORARY_REDIRECT, "not_leader"),
            Self::NoLeader => (StatusCode::SERVICE_UNAVAILABLE, "no_leader"),
            Self::TopicNotFound(_) => (StatusCode::NOT_FOUND, "topic_not_found"),
            Self::DuplicateMessageId { .. } => (StatusCode::CONFLICT, "duplicate_message_id"),
            Self::InvalidCursor(_) => (StatusCode::BAD_REQUEST, "invalid_cursor"),
            Self::InvalidRequest(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
            Self::InvalidTopicName(_) => (StatusCode::BAD_REQUEST, "invalid_topic_name"),
            Self::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            Self::RequestTimeout(_) => (StatusCode::REQUEST_TIMEOUT, "request_timeout"),
            Self::Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Self::WrongCluster { .. } => (StatusCode::FORBIDDEN, "wrong_cluster"),
            Self::RaftTimeout(_) | Self::MemberCatchingUp { .. } => (StatusCode::GATEWAY_TIMEOUT, "raft_timeout"),
            Self::NotCommitted(_) => (StatusCode::INTERNAL_SERVER_ERROR, "not_committed"),
            Self::NotFound(_) | Self::CursorNotFound { .. } | Self::MemberNotFound(_) => {
                (StatusCode::NOT_FOUND, "not_found")
            }
            Self::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            Self::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            Self::NotReady(_) => (StatusCode::SERVICE_UNAVAILABLE, "not_ready"),
            Self::InsufficientStorage { .. } | Self::NodesShortOfStorage { .. } => {
                (StatusCode::INSUFFICIENT_STORAGE, "insufficient_storage")
            }
            Self::MemberConflict(_) => (StatusCode::CONFLICT, "member_conflict"),
            Self::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }

    /// The API.md error body.
    pub fn body(&self) -> Value {
        match self {
            Self::Unconfirmed { id, cause } => return cause.body_naming("id", json!(id)),
            Self::UnconfirmedBatch { ids, cause } => return cause.body_naming("ids", json!(ids)),
            _ => {}
        }
        let (_, code) = self.status_and_code();
        let message = truncated(&self.to_string(), ERROR_MESSAGE_CHARS_MAX);
        let mut body = json!({"error": code, "message": message, "details": {}});
        match self {
            Self::NotLeader { leader_id, leader_address, .. } => {
                let leader_id = format!("node-{leader_id}");
                body["leader_id"] = json!(leader_id);
                body["leader_address"] = json!(leader_address);
                body["details"] = json!({"leader_id": leader_id, "leader_address": leader_address});
            }
            Self::DuplicateMessageId { id, existing_sequence } => {
                body["id"] = json!(id);
                body["existing_sequence"] = json!(existing_sequence);
                body["details"] = json!({"id": id, "existing_sequence": existing_sequence});
            }
            Self::TopicNotFound(topic) => body["details"] = json!({"topic": topic}),
            Self::WrongCluster { ours, presented } => {
                body["details"] = json!({"cluster_id": ours, "presented_cluster_id": presented})
            }
            Self::CursorNotFound { topic, subscriber_id } => {
                body["details"] = json!({"topic": topic, "subscriber_id": subscriber_id})
            }
            Self::InsufficientStorage { available, needed, reserve } => {
                body["details"] =
                    json!({"available_bytes": available, "needed_bytes": needed, "min_free_bytes": reserve})
            }
            Self::NodesShortOfStorage { nodes } => body["details"] = json!({"nodes": node_names(nodes)}),
            Self::MemberCatchingUp { node, .. } => body["details"] = json!({"node_id": format!("node-{node}")}),
            _ => {}
        }
        body
    }

    pub fn internal(e: impl std::fmt::Display) -> Self {
        Self::Internal(e.to_string())
    }

    /// A failure after which a write may still commit: its answer names the message id.
    pub fn may_still_commit(&self) -> bool {
        matches!(self, Self::RaftTimeout(_) | Self::NotCommitted(_))
    }

    /// The error body with `key: value` at the top level and in `details`.
    pub(crate) fn body_naming(&self, key: &str, value: Value) -> Value {
        let mut body = self.body();
        body["details"][key] = value.clone();
        body[key] = value;
        body
    }

    /// Names the message `id` in a `raft_timeout` or `not_committed` answer to a publish: the
    /// write may still commit, and only under the same id can it be retried safely.
    pub fn naming_id(self, id: &str) -> Self {
        if self.may_still_commit() {
            Self::Unconfirmed { id: id.to_string(), cause: Box::new(self) }
        } else {
            self
        }
    }

    /// [`ApiError::naming_id`] for a batch: names every message's id, in order.
    pub fn naming_ids(self, ids: Vec<String>) -> Self {
        if self.may_still_commit() {
            Self::UnconfirmedBatch { ids, cause: Box::new(self) }
        } else {
            self
        }
    }

    /// The error that decides the answer's headers: the cause of an `Unconfirmed`.
    fn headline(&self) -> &ApiError {
        match self {
            Self::Unconfirmed { cause, .. } | Self::UnconfirmedBatch { cause, .. } => cause.headline(),
            other => other,
        }
    }
}

/// Node ids as JSON names them: `["node-1", "node-2"]`.
pub(crate) fn node_names<'a>(ids: impl IntoIterator<Item = &'a u64>) -> Vec<String> {
    ids.into_iter().map(|id| format!("node-{id}")).collect()
}

/// `node-1, node-2` for messages.
pub(crate) fn node_list<'a>(ids: impl IntoIterator<Item = &'a u64>) -> String {
    node_names(ids).join(", ")
}

/// `text` cut to its first `chars` characters, marked `…` when cut.
pub fn truncated(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

impl From<raft_store::StoreError> for ApiError {
    fn from(e: raft_store::StoreError) -> Self {
        if matches!(e, raft_store::StoreError::Installing) {
            // Not a failure: the node is catching up. Another node, or this one shortly, answers.
            return Self::Unavailable(format!("{e}: retry shortly"));
        }
        tracing::error!(error = %e, "storage error while serving a request");
        Self::internal(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, _) = self.status_and_code();
        let mut response = (status, axum::Json(self.body())).into_response();
        if let Self::NotLeader { leader_address, path_and_query, .. } = self.headline() {
            let location = format!("http://{leader_address}{path_and_query}");
            if let Ok(value) = HeaderValue::from_str(&location) {
                response.headers_mut().insert(header::LOCATION, value);
            }
        }
        if matches!(self.headline(), Self::NoLeader | Self::Unavailable(_)) {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_body_has_id_and_sequence_at_top_level_and_in_details() {
        let body = ApiError::DuplicateMessageId { id: "m".into(), existing_sequence: Some(4) }.body();
        assert_eq!(body["error"], "duplicate_message_id");
        assert_eq!(body["existing_sequence"], 4);
        assert_eq!(body["details"]["existing_sequence"], 4);
        assert_eq!(body["id"], "m");
    }

    #[test]
    fn a_message_quoting_a_huge_value_is_cut() {
        let huge = "x".repeat(300_000);
        let message = ApiError::InvalidRequest(format!("ack must be committed or appended, not {huge:?}")).body()
            ["message"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(message.chars().count(), ERROR_MESSAGE_CHARS_MAX + 1);
        assert!(message.starts_with("ack must be") && message.ends_with('…'));
        assert_eq!(truncated("short", 10), "short");
    }

    #[test]
    fn a_publish_that_may_still_commit_names_its_id() {
        let timeout = ApiError::RaftTimeout(5000).naming_id("m-7");
        let body = timeout.body();
        assert_eq!(
            (&body["error"], &body["id"], &body["details"]["id"]),
            (&json!("raft_timeout"), &json!("m-7"), &json!("m-7"))
        );
        assert_eq!(timeout.into_response().status(), StatusCode::GATEWAY_TIMEOUT);
        let not_committed = ApiError::NotCommitted("leadership changed".into()).naming_id("m-8");
        assert_eq!(not_committed.body()["id"], "m-8");
        assert_eq!(not_committed.into_response().status(), StatusCode::INTERNAL_SERVER_ERROR);
        // Refusals that stored nothing stay as they were.
        assert!(matches!(ApiError::NoLeader.naming_id("m-9"), ApiError::NoLeader));
        // A batch names every id, in order.
        let ids = vec!["b-1".to_string(), "b-2".to_string()];
        let batch = ApiError::RaftTimeout(5000).naming_ids(ids.clone());
        let body = batch.body();
        assert_eq!(
            (&body["error"], &body["ids"], &body["details"]["ids"]),
            (&json!("raft_timeout"), &json!(ids), &json!(ids))
        );
        assert_eq!(batch.into_response().status(), StatusCode::GATEWAY_TIMEOUT);
        assert!(matches!(ApiError::NoLeader.naming_ids(vec!["b-3".into()]), ApiError::NoLeader));
    }

    #[test]
    fn not_leader_sets_location_with_original_path() {
        let e = ApiError::NotLeader {
            leader_id: 2,
            leader_address: "127.0.0.1:8082".into(),
            path_and_query: "/topics/a/messages?ack=appended".into(),
        };
        let response = e.into_response();
        assert_eq!(response.status(), StatusCode::TEMPORARY_REDIRECT);
        assert_eq!(response.headers()[header::LOCATION], "http://127.0.0.1:8082/topics/a/messages?ack=appended");
    }
}
