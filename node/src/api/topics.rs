//! Topic management (API.md §3) and subscriber listing (§5).

use std::collections::{BTreeMap, HashMap};

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use raft_store::{Request, Response as SmResponse, Retention, TopicRecord};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use super::input;
use super::messages::reserve;
use super::publish::minify;
use crate::app::SharedApp;
use crate::budget::Room;
use crate::error::ApiError;
use crate::limits::{
    SUBSCRIBERS_LIST_MAX, SUBSCRIBER_LIST_ITEM_BYTES_MAX, TOPICS_MAX, TOPICS_METADATA_BYTES_MAX, TOPIC_BODY_BYTES_MAX,
    TOPIC_LIST_ITEM_BYTES_MAX,
};
use crate::serve::ClientAddr;

/// The stored metadata as JSON (an empty object when none was given).
fn metadata(record: &TopicRecord) -> Box<RawValue> {
    record
        .metadata
        .as_deref()
        .and_then(|m| RawValue::from_string(m.to_string()).ok())
        .unwrap_or_else(|| RawValue::from_string("{}".into()).unwrap_or_default())
}

/// The `metadata` of a creation body and the retention it sets; `None` when absent or null.
/// The body is parsed once, `metadata` kept as the client wrote it with the whitespace between
/// tokens dropped: key order and number spelling kept (API.md: "stored as given"), which a
/// parsed `Value` would not keep (`1e2` would come back as `100.0`).
fn creation_metadata(body: &[u8]) -> Result<(Option<String>, Retention), ApiError> {
    let fields: Option<HashMap<String, Box<RawValue>>> = input::json(body)?;
    let Some(given) = fields.as_ref().and_then(|f| f.get("metadata")) else {
        return Ok((None, Retention::default()));
    };
    // The rules payloads follow, so that every reader can read the topic back (`GET` wraps
    // metadata one level deeper still).
    super::publish::readable("metadata", given.get()).map_err(ApiError::InvalidRequest)?;
    match serde_json::from_str::<Value>(given.get()) {
        Ok(Value::Null) => Ok((None, Retention::default())),
        Ok(Value::Object(m)) => {
            // Lossless: minify only drops ASCII whitespace from valid UTF-8.
            let text = String::from_utf8_lossy(&minify(given.get())).into_owned();
            Ok((Some(text), retention(&m)?))
        }
        _ => Err(ApiError::InvalidRequest("metadata must be a JSON object".into())),
    }
}

pub fn active(app: &SharedApp, name: &str) -> Result<TopicRecord, ApiError> {
    app.reader.topic(name).filter(|r| !r.deleted).ok_or_else(|| ApiError::TopicNotFound(name.to_string()))
}

/// Reads `retention_*` from metadata: each, when present, a whole number ≥ 1.
fn retention(metadata: &Map<String, Value>) -> Result<Retention, ApiError> {
    let field = |key: &str| -> Result<Option<u64>, ApiError> {
        match metadata.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n >= 1 => Ok(Some(n)),
                _ => Err(ApiError::InvalidRequest(format!("metadata.{key} must be a whole number of at least 1"))),
            },
        }
    };
    Ok(Retention {
        hours: field("retention_hours")?,
        messages: field("retention_messages")?,
        bytes: field("retention_bytes")?,
    })
}

pub async fn create(
    State(app): State<SharedApp>,
    client: Option<Extension<ClientAddr>>,
    path: Result<Path<String>, PathRejection>,
    uri: Uri,
    body: Body,
) -> Result<Response, ApiError> {
    let name = input::topic_name(path)?;
    input::query(RawQuery(uri.query().map(String::from)))?;
    let bytes = input::body(&app, input::client_ip(client), body, TOPIC_BODY_BYTES_MAX).await?;
    let (metadata, retention) = creation_metadata(&bytes)?;
    app.require_leader_applied(&input::path_and_query(&uri)).await?;
    if active(&app, &name).is_ok() {
        return Ok((StatusCode::OK, Json(json!({"topic": name, "created": false, "raft_index": 0}))).into_response());
    }
    let limit_reached =
        || ApiError::InvalidRequest(format!("the cluster already holds {TOPICS_MAX} topics, deleted ones included"));
    if app.reader.topic(&name).is_none() && app.reader.topic_count() >= TOPICS_MAX {
        return Err(limit_reached());
    }
    crate::disk_room::require_cluster_room(&app)?;
    let request = Request::CreateTopicLater { topic: name.clone(), metadata, retention, now_ms: app.now_ms() };
    let written = app.write(request).await?;
    // Other creations can fill the last places between the check above and this apply.
    if written.response == SmResponse::TopicLimitReached {
        return Err(limit_reached());
    }
    if written.response == SmResponse::TopicMetadataLimitReached {
        return Err(ApiError::InvalidRequest(format!(
            "the cluster's topics already hold nearly {} MiB of metadata, deleted ones included: \
             this topic's does not fit",
            TOPICS_METADATA_BYTES_MAX >> 20
        )));
    }
    let created = matches!(written.response, SmResponse::TopicCreated { created: true });
    let (status, raft_index) = if created { (StatusCode::CREATED, written.log_index) } else { (StatusCode::OK, 0) };
    Ok((status, Json(json!({"topic": name, "created": created, "raft_index": raft_index}))).into_response())
}

/// One item of `GET /topics`.
#[derive(Serialize)]
struct TopicItem<'a> {
    name: &'a str,
    message_count: u64,
    current_sequence: u64,
    created_at: u64,
}

#[derive(Serialize)]
struct TopicList<'a> {
    topics: Vec<TopicItem<'a>>,
    next_after: Option<&'a str>,
}

/// `GET /topics[?after=NAME][&limit=N]`: active topics by name; a page of them with `limit`,
/// `next_after` naming where the next page starts (`null` after the last). With 100,000
/// topics the body is tens of megabytes: it counts against the node's budget of pages read
/// (and its client's share) until sent, reserved for its worst case before the list is read.
pub async fn list(
    State(app): State<SharedApp>,
    client: Option<Extension<ClientAddr>>,
    query: RawQuery,
) -> Result<Response, ApiError> {
    let query = input::query(query)?;
    let limit = match query.get("limit").map(|v| v.trim().parse::<usize>()) {
        None => TOPICS_MAX,
        Some(Ok(n)) if (1..=TOPICS_MAX).contains(&n) => n,
        Some(_) => return Err(ApiError::InvalidRequest(format!("limit must be 1 to {TOPICS_MAX}"))),
    };
    let client = input::client_ip(client);
    // For the body; the records it is built from are gone before it is sent.
    let worst = limit.min(app.reader.topic_count()) * TOPIC_LIST_ITEM_BYTES_MAX;
    let room = reserve(&app, client, worst).await?;
    let (records, more) = app.reader.active_topics_page(query.get("after").map(String::as_str), limit);
    let list = TopicList {
        topics: records
            .iter()
            .map(|r| TopicItem {
                name: &r.name,
                message_count: r.message_count(),
                current_sequence: r.current_sequence,
                created_at: r.created_at,
            })
            .collect(),
        next_after: if more { records.last().map(|r| r.name.as_str()) } else { None },
    };
    Ok(held_json(room, &list))
}

/// `value` (strings and integers only: serializing cannot fail) as a JSON body that holds
/// `room` until sent, shrunk to the body's length, as is its allocation.
fn held_json(room: Room, value: &impl Serialize) -> Response {
    let mut body = serde_json::to_vec(value).unwrap_or_default();
    body.shrink_to_fit();
    ([(header::CONTENT_TYPE, "application/json")], room.hold(body)).into_response()
}

pub async fn get(
    State(app): State<SharedApp>,
    path: Result<Path<String>, PathRejection>,
    query: RawQuery,
) -> Result<Json<TopicInfo>, ApiError> {
    let name = input::topic_name(path)?;
    input::query(query)?;
    let r = active(&app, &name)?;
    Ok(Json(TopicInfo {
        message_count: r.message_count(),
        current_sequence: r.current_sequence,
        first_available_sequence: r.first_sequence,
        created_at: r.created_at,
        metadata: metadata(&r),
        topic: r.name,
    }))
}

/// `GET /topics/:name`. A struct rather than `json!`, which would parse the metadata into a
/// `Value` and respell its numbers.
#[derive(Serialize)]
pub struct TopicInfo {
    topic: String,
    message_count: u64,
    current_sequence: u64,
    first_available_sequence: u64,
    created_at: u64,
    metadata: Box<RawValue>,
}

pub async fn delete(
    State(app): State<SharedApp>,
    path: Result<Path<String>, PathRejection>,
    uri: Uri,
) -> Result<Json<Value>, ApiError> {
    let name = input::topic_name(path)?;
    input::query(RawQuery(uri.query().map(String::from)))?;
    app.require_leader_applied(&input::path_and_query(&uri)).await?;
    active(&app, &name)?;
    let written = app.write(Request::DeleteTopic { topic: name.clone() }).await?;
    match written.response {
        SmResponse::TopicDeleted => Ok(Json(json!({"topic": name, "deleted": true, "raft_index": written.log_index}))),
        _ => Err(ApiError::TopicNotFound(name)),
    }
}

/// Forgets a subscriber's recorded cursor (on the leader), answering what it was; 404
/// `not_found` when none is recorded. A subscriber still connected records a new one with its
/// next ack.
pub async fn forget_subscriber(State(app): State<SharedApp>, uri: Uri) -> Result<Json<Value>, ApiError> {
    // The two segments decoded here rather than by `Path`, which fails on either one alike:
    // the name is checked first and the id last (API.md §7).
    let rest = uri.path().strip_prefix("/topics/").unwrap_or_default();
    let (name, subscriber_id) = rest.split_once("/subscribers/").unwrap_or((rest, ""));
    let name = input::percent_decoded(name).ok_or_else(|| ApiError::InvalidTopicName(name.to_string()))?;
    let name = input::topic_name(Ok(Path(name)))?;
    input::query(RawQuery(uri.query().map(String::from)))?;
    app.require_leader_applied(&input::path_and_query(&uri)).await?;
    let record = active(&app, &name)?;
    let subscriber_id = input::percent_decoded(subscriber_id)
        .ok_or_else(|| ApiError::InvalidRequest(format!("subscriber id {subscriber_id:?} does not decode to UTF-8")))?;
    input::id_field("subscriber_id", &subscriber_id)?;
    let Some(acked) = app.reader.cursor(record.id, &subscriber_id)? else {
        return Err(ApiError::CursorNotFound { topic: name, subscriber_id });
    };
    let request = Request::ForgetCursor { topic: name.clone(), subscriber_id: subscriber_id.clone() };
    let written = app.write(request).await?;
    match written.response {
        SmResponse::CursorForgotten => Ok(Json(json!({
            "topic": name,
            "subscriber_id": subscriber_id,
            "acked_sequence": acked,
            "deleted": true,
            "raft_index": written.log_index,
        }))),
        _ => Err(ApiError::TopicNotFound(name)),
    }
}

/// Recorded cursors (replicated, the same on every node) plus the subscribers connected to
/// this node that have not acked yet.
/// The body (up to 10,000 ids of 256 characters, each escaped to as many as 6 bytes: megabytes)
/// counts against the read-pages budget and its client's share until sent, as `GET /topics`'s.
pub async fn subscribers(
    State(app): State<SharedApp>,
    client: Option<Extension<ClientAddr>>,
    path: Result<Path<String>, PathRejection>,
    query: RawQuery,
) -> Result<Response, ApiError> {
    let name = input::topic_name(path)?;
    input::query(query)?;
    let r = active(&app, &name)?;
    let connected: HashMap<String, u64> = app.connected_subscribers(&name);
    let listed = (app.reader.cursor_count(r.id) as usize).saturating_add(connected.len()).min(SUBSCRIBERS_LIST_MAX);
    let room = reserve(&app, input::client_ip(client), listed * SUBSCRIBER_LIST_ITEM_BYTES_MAX).await?;
    let mut acked: BTreeMap<String, u64> = app.reader.cursors(r.id, SUBSCRIBERS_LIST_MAX)?.into_iter().collect();
    for (id, _) in connected {
        if acked.len() >= SUBSCRIBERS_LIST_MAX {
            break;
        }
        acked.entry(id).or_insert(0);
    }
    let list: Vec<Value> = acked
        .into_iter()
        .map(|(id, seq)| json!({"subscriber_id": id, "acked_sequence": seq, "lag": r.current_sequence.saturating_sub(seq)}))
        .collect();
    Ok(held_json(room, &json!({"topic": name, "subscribers": list})))
}
