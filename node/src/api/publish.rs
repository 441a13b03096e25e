//! Publishing (API.md §4): one message, or a batch as one Raft entry.

use axum::body::{Body, Bytes};
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use raft_store::{NewMessage, PublishResult, Request, Response as SmResponse};
use serde::de::{Error as _, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::fmt;

use super::input;
use super::topics::active;
use crate::app::{InflightGuard, QueuedWrite, SharedApp};
use crate::error::ApiError;
use crate::limits::{
    APPENDED_BYTES_MAX, APPENDED_ENTRY_OVERHEAD_BYTES, BATCH_BODY_BYTES_MAX, BATCH_MESSAGES_MAX, PAYLOAD_BYTES_MAX,
    PAYLOAD_DEPTH_MAX, PUBLISH_BODY_BYTES_MAX, WRITE_TIMEOUT,
};
use crate::metrics::Outcome;
use crate::propose::Committed;
use crate::serve::ClientAddr;

/// A message as a client sends it.
#[derive(Deserialize)]
pub struct MessageFields {
    pub id: Option<String>,
    /// `Some` whenever the field is present, `null` included: a JSON null is a payload.
    #[serde(default, deserialize_with = "present")]
    pub payload: Option<Box<RawValue>>,
    pub timestamp: Option<u64>,
}

pub fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(d).map(Some)
}

#[derive(Deserialize)]
struct BatchIn {
    #[serde(deserialize_with = "at_most_batch_messages")]
    messages: Vec<MessageFields>,
}

/// Reads a batch's messages and refuses the one past [`BATCH_MESSAGES_MAX`] as soon as the
/// parser reaches it: counted afterwards, a 16 MiB body of `{}` items became millions of
/// parsed messages (hundreds of MiB) before it was refused.
fn at_most_batch_messages<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<MessageFields>, D::Error> {
    struct AtMost;
    impl<'de> Visitor<'de> for AtMost {
        type Value = Vec<MessageFields>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "an array of 1 to {BATCH_MESSAGES_MAX} messages")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut messages = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(BATCH_MESSAGES_MAX));
            while let Some(input::Object(message)) = seq.next_element()? {
                if messages.len() == BATCH_MESSAGES_MAX {
                    return Err(A::Error::custom(format!("messages must hold 1 to {BATCH_MESSAGES_MAX} messages")));
                }
                messages.push(message);
            }
            Ok(messages)
        }
    }
    d.deserialize_seq(AtMost)
}

/// When the publish is answered.
#[derive(Clone, Copy, PartialEq, Eq)]
enum AckMode {
    /// After commit on a majority and apply on the leader (201).
    Committed,
    /// Once the leader has accepted the entry (202); it may still be lost.
    Appended,
}

fn ack_mode(query: &HashMap<String, String>) -> Result<AckMode, ApiError> {
    match query.get("ack").map(String::as_str) {
        None | Some("committed") => Ok(AckMode::Committed),
        Some("appended") => Ok(AckMode::Appended),
        Some(other) => Err(ApiError::InvalidRequest(format!("ack must be committed or appended, not {other:?}"))),
    }
}

/// Payload bytes as stored: compact JSON, at most 1 MiB. Payloads that clients serialize
/// compactly (no whitespace between tokens) are taken as they are, without a copy.
fn payload_bytes(raw: Box<RawValue>) -> Result<Bytes, ApiError> {
    let text: Box<str> = raw.into();
    let compact = if readable("payload", &text).map_err(ApiError::InvalidRequest)?.spaced {
        Bytes::from(minify(&text))
    } else {
        Bytes::from(String::from(text))
    };
    if compact.len() > PAYLOAD_BYTES_MAX {
        return Err(ApiError::PayloadTooLarge(format!(
            "payload is {} bytes as compact JSON; the limit is {PAYLOAD_BYTES_MAX}",
            compact.len()
        )));
    }
    Ok(compact)
}

/// Calls `each` with every byte of already-validated JSON and whether it lies inside a
/// string (its closing quote included, its opening quote not): the one place that knows
/// where strings and their escapes end.
fn for_each_byte(text: &str, mut each: impl FnMut(u8, bool)) {
    let (mut in_string, mut escaped) = (false, false);
    for &b in text.as_bytes() {
        each(b, in_string);
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else {
            in_string = b == b'"';
        }
    }
}

/// What [`readable`] found out about a payload on its way.
#[derive(Debug)]
pub(crate) struct Readable {
    /// Whitespace lies between tokens: [`minify`] has something to drop.
    spaced: bool,
}

/// Refuses already-validated JSON (a payload, or a topic's metadata: `what`) that common
/// readers could not read back once stored:
/// arrays and objects nested deeper than [`PAYLOAD_DEPTH_MAX`], or a number beyond what an
/// f64 holds (`1e400` is valid JSON, but serde_json, this project's client among its users,
/// refuses it, and JavaScript reads it as `Infinity`), or a lone UTF-16 surrogate escape.
/// One walk over the bytes, the only one a compact payload without `\uD` escapes gets on the
/// publish path.
pub(crate) fn readable(what: &str, text: &str) -> Result<Readable, String> {
    let (mut depth, mut deepest, mut spaced) = (0usize, 0usize, false);
    let (mut at, mut number_start, mut too_large) = (0usize, None::<usize>, None::<usize>);
    // The two bytes before this one, to spot a `\uD` escape (see below) in the same walk.
    let (mut before_last, mut last, mut surrogate_escape) = (0u8, 0u8, false);
    let mut end_number = |start: usize, end: usize| {
        let number = &text[start..end];
        // Only an exponent or some 300 digits reach past f64's range.
        let may_overflow = number.len() > 300 || number.bytes().any(|b| b == b'e' || b == b'E');
        if may_overflow && !number.parse::<f64>().is_ok_and(f64::is_finite) && too_large.is_none() {
            too_large = Some(start);
        }
    };
    for_each_byte(text, |b, in_string| {
        let in_number = !in_string && matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E');
        match number_start {
            Some(start) if !in_number => {
                end_number(start, at);
                number_start = None;
            }
            None if in_number && (b == b'-' || b.is_ascii_digit()) => number_start = Some(at),
            _ => {}
        }
        if in_string && before_last == b'\\' && last == b'u' && (b | 0x20) == b'd' {
            surrogate_escape = true;
        }
        (before_last, last) = (last, b);
        match b {
            _ if in_string => {}
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ if b.is_ascii_whitespace() => spaced = true,
            _ => {}
        }
        at += 1;
    });
    if let Some(start) = number_start {
        end_number(start, text.len());
    }
    if deepest > PAYLOAD_DEPTH_MAX {
        return Err(format!("{what} nests deeper than {PAYLOAD_DEPTH_MAX} levels"));
    }
    if let Some(start) = too_large {
        let number: String = text[start..].chars().take_while(|c| !matches!(c, ',' | ']' | '}')).take(40).collect();
        return Err(format!("{what} number {} is beyond the range of a 64-bit float", number.trim()));
    }
    // The parse at the edge checks a `\u` escape's hex digits, not its pairing: a lone
    // surrogate (`"\ud800"`) would be stored, and a strict reader (this project's client among
    // them) would then refuse every page holding it. Only payloads with an escape in the
    // surrogate range (`\uD800`-`\uDFFF`, emoji as Python writes them) are decoded to check.
    if surrogate_escape {
        if let Err(e) = serde_json::from_str::<serde_json::Value>(text) {
            // Valid JSON but for the pairing, so this is the only error left.
            return Err(format!("{what} has a \\u escape of a lone UTF-16 surrogate, which is not Unicode ({e})"));
        }
    }
    Ok(Readable { spaced })
}

/// Drops the whitespace between JSON tokens of already-validated JSON, keeping everything
/// else (key order, number spelling) exactly as the client wrote it.
pub fn minify(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for_each_byte(text, |b, in_string| {
        if in_string || !b.is_ascii_whitespace() {
            out.push(b);
        }
    });
    out
}

/// A message checked at the edge, ready to propose.
pub struct Incoming {
    pub message: NewMessage,
    /// The client sent no id, so this node generated a fresh UUID (see
    /// [`Request::PublishGeneratedIds`]).
    pub id_generated: bool,
}

pub fn new_message_from(app: &SharedApp, m: MessageFields) -> Result<Incoming, ApiError> {
    let payload = m.payload.ok_or_else(|| ApiError::InvalidRequest("payload is required".into()))?;
    let (id, id_generated) = match m.id {
        Some(id) => {
            input::id_field("id", &id)?;
            (id, false)
        }
        None => (uuid::Uuid::new_v4().to_string(), true),
    };
    let timestamp = m.timestamp.unwrap_or_else(|| app.now_ms());
    Ok(Incoming { message: NewMessage { id, timestamp, payload: payload_bytes(payload)? }, id_generated })
}

fn parse<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, ApiError> {
    input::json(bytes)?.ok_or_else(|| ApiError::InvalidRequest("a JSON body is required".into()))
}

pub async fn publish(
    State(app): State<SharedApp>,
    client: Option<Extension<ClientAddr>>,
    path: Result<Path<String>, PathRejection>,
    query: RawQuery,
    uri: Uri,
    body: Body,
) -> Result<Response, ApiError> {
    let topic = input::topic_name(path)?;
    let mode = ack_mode(&input::query(query)?)?;
    let bytes = input::body(&app, input::client_ip(client), body, PUBLISH_BODY_BYTES_MAX).await?;
    let Incoming { message, id_generated } = new_message_from(&app, parse::<MessageFields>(&bytes)?)?;
    let where_ = input::path_and_query(&uri);
    app.require_leader_applied(&where_).await?;
    let record = active(&app, &topic)?;
    require_room(&app, &topic, record.id, std::slice::from_ref(&message), id_generated)?;
    let id = message.id.clone();
    if mode == AckMode::Appended && !id_generated {
        // A 202 never learns the apply result, so a known duplicate is refused here. A
        // committed publish needs no lookup of its own: apply finds the duplicate (one
        // RocksDB read per message fewer on the leader's hot path).
        refuse_applied_duplicate(&app, record.id, &id)?;
    }
    let Some(guard) = InflightGuard::try_new(app.clone(), &topic, &id) else {
        app.metrics.count_publish(Outcome::Duplicate, 1);
        return Err(ApiError::DuplicateMessageId { id, existing_sequence: None });
    };
    // Ids, the topic and the entry itself count too: with a payload of `0` they are most of it.
    let appended_bytes = message.payload.len() + id.len() + topic.len() + APPENDED_ENTRY_OVERHEAD_BYTES;
    let request = Request::publish(topic.clone(), vec![message], app.now_ms(), id_generated);

    if mode == AckMode::Appended {
        let Ok(room) = tokio::time::timeout(WRITE_TIMEOUT, app.appended_bytes.take(appended_bytes)).await else {
            // Nothing was proposed: a definite refusal, not an outcome unknown.
            return Err(ApiError::Unavailable(format!(
                "appended writes not yet resolved hold this node's {APPENDED_BYTES_MAX} bytes for them; \
                 nothing was stored: retry, or publish with ack=committed"
            )));
        };
        let deposed = crate::propose::deposed(app.raft.metrics());
        let mut receiver = app.raft.client_write_ff(request).await.map_err(|e| ApiError::Unavailable(e.to_string()))?;
        // Keep the id in flight for a while, so a quick retry is a duplicate, and the bytes
        // counted until the entry resolves (committed, or cut from the log: Raft answers
        // those), so appended writes cannot outrun the cluster. Letting the bytes go at a
        // timeout let a slow cluster take another budget's worth every few seconds. Should Raft
        // leave an entry unanswered (unpatched openraft did, for one a snapshot from the next
        // leader covered: `propose::outcome`), the bytes also go once this node stops leading.
        tokio::spawn(async move {
            let resolved = tokio::time::timeout(WRITE_TIMEOUT, &mut receiver).await;
            drop(guard);
            if resolved.is_err() {
                tokio::select! {
                    _ = receiver => {}
                    () = deposed => {}
                }
            }
            drop(room);
        });
        app.metrics.count_publish(Outcome::Appended, 1);
        let body = PublishAnswer { id: &id, topic: &topic, sequence: None, raft_index: None, committed: false };
        return Ok((StatusCode::ACCEPTED, Json(body)).into_response());
    }

    let written = match app.queue_write(request).await {
        Ok(queued) => {
            let (topic, id) = (topic.clone(), id.clone());
            // The id stays in flight until the write resolves, also when the client hangs up
            // first: a retry meanwhile is a duplicate, not a second proposal.
            committed_and_counted(&app, queued, move |app, written| {
                drop(guard);
                let written = written.inspect_err(|_| app.metrics.count_publish(Outcome::Error, 1))?;
                Ok((written.log_index, stored_sequence(app, &topic, &id, written.response)))
            })
            .await
        }
        Err(e) => {
            app.metrics.count_publish(Outcome::Error, 1);
            Err(e)
        }
    };
    let (log_index, sequence) = written.map_err(|e| e.naming_id(&id))?;
    let body = PublishAnswer {
        id: &id,
        topic: &topic,
        sequence: Some(sequence?),
        raft_index: Some(log_index),
        committed: true,
    };
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// The answer to a single publish, serialized straight from these fields rather than built
/// as a `Value` map (an `IndexMap` with hashed keys) per request. `None` is written as `null`.
#[derive(Serialize)]
struct PublishAnswer<'a> {
    id: &'a str,
    topic: &'a str,
    sequence: Option<u64>,
    raft_index: Option<u64>,
    committed: bool,
}

/// The data dir's reserve, for a publish. One whose every message is already stored, or in
/// flight on this node (a retry after an answer that could not confirm it), would store
/// nothing new: it goes on, to be answered as the duplicate it is, so that its publisher
/// learns the sequence instead of "nothing was stored".
fn require_room(
    app: &SharedApp,
    topic: &str,
    topic_id: u64,
    messages: &[NewMessage],
    ids_generated: bool,
) -> Result<(), ApiError> {
    let Err(short) = crate::disk_room::require_cluster_room(app) else { return Ok(()) };
    if ids_generated {
        return Err(short);
    }
    for message in messages {
        let in_flight = || {
            app.inflight.lock().unwrap_or_else(|e| e.into_inner()).contains(&(topic.to_string(), message.id.clone()))
        };
        if app.reader.dedup(topic_id, &message.id)?.is_none() && !in_flight() {
            return Err(short);
        }
    }
    Ok(())
}

/// Answers a publish of an id the topic already holds without a Raft write.
fn refuse_applied_duplicate(app: &SharedApp, topic_id: u64, id: &str) -> Result<(), ApiError> {
    match app.reader.dedup(topic_id, id)? {
        Some(existing) => {
            app.metrics.count_publish(Outcome::Duplicate, 1);
            Err(ApiError::DuplicateMessageId { id: id.to_string(), existing_sequence: Some(existing) })
        }
        None => Ok(()),
    }
}

/// The sequence a single-message publish was stored with, from its apply result.
fn stored_sequence(app: &SharedApp, topic: &str, id: &str, response: SmResponse) -> Result<u64, ApiError> {
    match response {
        SmResponse::Published { results } => match results.first() {
            Some(PublishResult::Stored { sequence }) => {
                app.metrics.count_publish(Outcome::Stored, 1);
                Ok(*sequence)
            }
            Some(PublishResult::Duplicate { existing_sequence }) => {
                app.metrics.count_publish(Outcome::Duplicate, 1);
                Err(ApiError::DuplicateMessageId { id: id.to_string(), existing_sequence: Some(*existing_sequence) })
            }
            None => Err(ApiError::internal("publish applied without a result")),
        },
        SmResponse::TopicNotFound => Err(ApiError::TopicNotFound(topic.to_string())),
        other => Err(ApiError::internal(format!("unexpected apply result {other:?}"))),
    }
}

pub async fn batch(
    State(app): State<SharedApp>,
    client: Option<Extension<ClientAddr>>,
    path: Result<Path<String>, PathRejection>,
    query: RawQuery,
    uri: Uri,
    body: Body,
) -> Result<Response, ApiError> {
    let topic = input::topic_name(path)?;
    if ack_mode(&input::query(query)?)? == AckMode::Appended {
        // Refused rather than silently answered after commit: the caller asked for
        // something else.
        return Err(ApiError::InvalidRequest(
            "a batch is answered after commit only: ack=appended is not offered".into(),
        ));
    }
    let bytes = input::body(&app, input::client_ip(client), body, BATCH_BODY_BYTES_MAX).await?;
    let batch: BatchIn = parse(&bytes)?;
    // More than the maximum is refused while parsing (`at_most_batch_messages`).
    if batch.messages.is_empty() {
        return Err(ApiError::InvalidRequest(format!("messages must hold 1 to {BATCH_MESSAGES_MAX} messages")));
    }
    // API.md §7: a malformed message (400) is answered before a payload over the limit (413),
    // whichever message of the batch holds each.
    let (mut incoming, mut too_large) = (Vec::with_capacity(batch.messages.len()), None);
    for checked in batch.messages.into_iter().map(|m| new_message_from(&app, m)) {
        match checked {
            Ok(message) => incoming.push(message),
            Err(e @ ApiError::PayloadTooLarge(_)) => drop(too_large.get_or_insert(e)),
            Err(e) => return Err(e),
        }
    }
    if let Some(e) = too_large {
        return Err(e);
    }
    let ids_generated = incoming.iter().all(|m| m.id_generated);
    let messages: Vec<NewMessage> = incoming.into_iter().map(|m| m.message).collect();
    let where_ = input::path_and_query(&uri);
    let ids: Vec<String> = messages.iter().map(|m| m.id.clone()).collect();
    // Ids the node generated are known only from the answer: a batch that may still commit
    // names them all, so that a retry under the same ids is deduplicated.
    let (results, raft_index) = match publish_messages(&app, &topic, messages, ids_generated, &where_).await {
        Ok(published) => published,
        Err(e) => return Err(e.naming_ids(ids)),
    };
    let results: Vec<BatchItemOut> = ids
        .iter()
        .zip(results)
        .map(|(id, r)| match r {
            PublishResult::Stored { sequence } => BatchItemOut::Stored { id, sequence },
            PublishResult::Duplicate { existing_sequence } => {
                BatchItemOut::Duplicate { id, error: "duplicate_message_id", existing_sequence }
            }
        })
        .collect();
    let body = BatchAnswer { topic: &topic, results, raft_index, committed: true };
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// Proposes `messages` as one publish to an active `topic` and waits for its commit; answers
/// one result per message, in order, and the index of the log entry that carried them, and
/// counts the outcomes in the metrics. `where_` is the path a redirect to the leader names.
pub(super) async fn publish_messages(
    app: &SharedApp,
    topic: &str,
    messages: Vec<NewMessage>,
    ids_generated: bool,
    where_: &str,
) -> Result<(Vec<PublishResult>, u64), ApiError> {
    let count = messages.len();
    let queued = queue_publish(app, topic, messages, ids_generated, where_).await?;
    let topic = topic.to_string();
    committed_and_counted(app, queued, move |app, written| publish_outcome(app, &topic, count, written)).await
}

/// Waits for a queued publish to commit and counts its outcome (`count`) in a task of its
/// own: a client that hangs up drops its handler, which would take the count with it, and the
/// commit latency's slowest samples, those an operator looks for.
async fn committed_and_counted<T: Send + 'static>(
    app: &SharedApp,
    queued: QueuedWrite,
    count: impl FnOnce(&SharedApp, Result<Committed, ApiError>) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let app = app.clone();
    let counted = tokio::spawn(async move {
        let written = app.committed(queued).await;
        count(&app, written)
    });
    // Only a panic ends the task early; the write may still commit, which `not_committed` says.
    counted.await.unwrap_or_else(|e| Err(ApiError::NotCommitted(format!("the wait for the commit failed: {e}"))))
}

/// The first half of [`publish_messages`]: checks that this node leads and the topic is
/// active, and puts the publish in the proposer's queue (see [`crate::app::App::queue_write`]). Shared with the publishing WebSocket, which queues its
/// groups in the order their frames were read.
pub(super) async fn queue_publish(
    app: &SharedApp,
    topic: &str,
    messages: Vec<NewMessage>,
    ids_generated: bool,
    where_: &str,
) -> Result<QueuedWrite, ApiError> {
    app.require_leader_applied(where_).await?;
    let record = active(app, topic)?;
    require_room(app, topic, record.id, &messages, ids_generated)?;
    let count = messages.len() as u64;
    let request = Request::publish(topic.to_string(), messages, app.now_ms(), ids_generated);
    app.queue_write(request).await.inspect_err(|_| app.metrics.count_publish(Outcome::Error, count))
}

/// The second half of [`publish_messages`]: one result per message of a publish of `count`,
/// counted in the metrics.
pub(super) fn publish_outcome(
    app: &SharedApp,
    topic: &str,
    count: usize,
    written: Result<Committed, ApiError>,
) -> Result<(Vec<PublishResult>, u64), ApiError> {
    let written = written.inspect_err(|_| app.metrics.count_publish(Outcome::Error, count as u64))?;
    match written.response {
        SmResponse::Published { results } if results.len() == count => {
            let stored = results.iter().filter(|r| matches!(r, PublishResult::Stored { .. })).count() as u64;
            app.metrics.count_publish(Outcome::Stored, stored);
            app.metrics.count_publish(Outcome::Duplicate, count as u64 - stored);
            Ok((results, written.log_index))
        }
        SmResponse::TopicNotFound => Err(ApiError::TopicNotFound(topic.to_string())),
        other => Err(ApiError::internal(format!("a publish of {count} messages was applied as {other:?}"))),
    }
}

/// The answer to a batch publish, serialized straight from these fields: a thousand small
/// `Value` maps per request were a measurable share of the leader's CPU.
#[derive(Serialize)]
struct BatchAnswer<'a> {
    topic: &'a str,
    results: Vec<BatchItemOut<'a>>,
    raft_index: u64,
    committed: bool,
}

#[derive(Serialize)]
#[serde(untagged)]
enum BatchItemOut<'a> {
    Stored { id: &'a str, sequence: u64 },
    Duplicate { id: &'a str, error: &'static str, existing_sequence: u64 },
}

#[cfg(test)]
mod tests {
    use super::{minify, readable};
    use crate::limits::PAYLOAD_DEPTH_MAX;

    #[test]
    fn readable_counts_depth_outside_strings_only() {
        let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(readable("payload", &nested(PAYLOAD_DEPTH_MAX)).is_ok());
        assert!(readable("payload", &nested(PAYLOAD_DEPTH_MAX + 1)).is_err());
        let in_string = format!("[\"{}\", \"\\\"{}\"]", "[".repeat(300), "{".repeat(300));
        assert!(readable("payload", &in_string).is_ok(), "{in_string}");
    }

    #[test]
    fn readable_sees_whitespace_between_tokens_only() {
        assert!(!readable("payload", r#"{"a":"x y","b":[1,2]}"#).unwrap().spaced);
        assert!(readable("payload", "{\"a\": 1}").unwrap().spaced);
        assert!(readable("payload", "[1,\n2]").unwrap().spaced);
    }

    #[test]
    fn readable_refuses_numbers_past_f64_only() {
        for fine in ["1", "-0.5e10", "1e308", "1e-400", "{\"true\":false,\"e\":[1E3,2]}", "\"1e400\""] {
            assert!(readable("payload", fine).is_ok(), "{fine}");
        }
        for too_large in ["1e400", "[1,-2E999]", "{\"a\":{\"b\":1e309}}"] {
            let refused = readable("payload", too_large).unwrap_err();
            assert!(refused.contains("beyond the range"), "{too_large}: {refused}");
        }
        assert!(readable("payload", &"9".repeat(400)).is_err());
        assert!(readable("payload", &"9".repeat(300)).is_ok());
    }

    #[test]
    fn readable_refuses_lone_surrogates_only() {
        for fine in [r#""\ud83d\ude00""#, r#""\uD83D\uDE00 \u4e2d""#, r#"{"\\ud800":"\\udc00"}"#, r#""\u00e9d""#] {
            assert!(readable("payload", fine).is_ok(), "{fine}");
        }
        for lone in [r#""\ud800""#, r#"["x\uDC00"]"#, r#"{"\ud83d":1}"#, r#""\ud83d\u0041""#] {
            let refused = readable("payload", lone).unwrap_err();
            assert!(refused.contains("surrogate"), "{lone}: {refused}");
        }
    }

    #[test]
    fn whatever_readable_accepts_the_client_reads_back_inside_a_page() {
        // The deepest envelope around a payload: a read page's `messages[i].payload`.
        let payload = format!("{}1e308{}", "[".repeat(PAYLOAD_DEPTH_MAX), "]".repeat(PAYLOAD_DEPTH_MAX));
        assert!(readable("payload", &payload).is_ok());
        let page = format!(r#"{{"messages":[{{"sequence":1,"payload":{payload}}}]}}"#);
        assert!(serde_json::from_str::<serde_json::Value>(&page).is_ok());
    }

    #[test]
    fn minify_keeps_strings_and_key_order() {
        let text = "{ \"b\" : [1, 2],\n \"a\": \"x y \\\" z\" }";
        assert_eq!(String::from_utf8(minify(text)).unwrap(), "{\"b\":[1,2],\"a\":\"x y \\\" z\"}");
    }
}
