//! The commands carried in Raft log entries and their results.
//!
//! Everything a replica needs to compute the same result is inside the command: the
//! leader's clock (`now_ms`) is recorded when the command is proposed, so no replica ever
//! reads its own clock while applying.

use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// A state machine command: the application data of one log entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Create a topic, or revive a deleted one (its sequence continues). Idempotent.
    CreateTopic {
        topic: String,
        /// The `metadata` object as the client sent it (compact JSON text).
        metadata: Option<String>,
        /// Retention limits parsed from `metadata` at the edge.
        retention: Retention,
        now_ms: u64,
    },
    /// Delete a topic: it disappears from listings and refuses publishes; its messages
    /// stay on disk so a revived topic keeps its sequence and old cursors.
    DeleteTopic { topic: String },
    /// Publish one or more messages (a batch publish is one entry).
    Publish { topic: String, messages: Vec<NewMessage>, now_ms: u64 },
    /// Record subscribers' acknowledged cursors (coalesced on the node that received them).
    Ack { acks: Vec<AckRecord> },
    /// Let time pass for retention (`retention_hours`) on topics nobody publishes to.
    Tick { now_ms: u64 },
    /// Several commands proposed as one log entry, applied in order exactly as if each were
    /// its own entry. The leader batches concurrent client writes this way: openraft 0.9
    /// fsyncs each entry it appends on its own, so fewer, larger entries mean fewer fsyncs.
    /// Decoded at most [`crate::limits::BATCH_NESTING_MAX`] deep (see [`nesting`]).
    Batch(#[serde(deserialize_with = "nesting::bounded")] Vec<Request>),
    /// `Publish` of messages whose ids the leader generated (random UUIDs, the client gave
    /// none): no earlier message can hold such an id, so apply records each in the dedup index
    /// without looking it up first (a RocksDB read per message on every node). Declared
    /// last: bincode numbers variants by position, so logs written before it still decode.
    PublishGeneratedIds { topic: String, messages: Vec<NewMessage>, now_ms: u64 },
    /// Forget a subscriber's recorded cursor on a topic (`DELETE
    /// /topics/:name/subscribers/:id`): cursors are otherwise kept for good, one per
    /// subscriber id that ever acked. Declared last, for the same reason.
    ForgetCursor { topic: String, subscriber_id: String },
    /// `Ack` that records a cursor for a new subscriber only while its topic holds fewer than
    /// [`crate::limits::CURSORS_PER_TOPIC_MAX`]. A new variant rather than a new rule for
    /// `Ack`: every replica must apply an entry as it was first applied, and `Ack` entries
    /// already in logs were applied without the bound. Declared last, for the same reason.
    AckBounded { acks: Vec<AckRecord> },
    /// Names the cluster, once: the first one applied wins and later ones change nothing. A
    /// leader proposes it while none is applied; every node then presents the id when it
    /// dials a peer, and refuses peers of another cluster. Declared last, for the same reason.
    SetClusterId { id: String },
    /// `CreateTopic` whose revival of a deleted topic is always created later than its life
    /// before (`created_at` past the last one, even within one millisecond or under a leader
    /// whose clock is behind): `created_at` is how a snapshot install tells a subscriber that
    /// the topic was deleted and revived in the entries it skipped. A new variant rather than
    /// a new rule for `CreateTopic`, and declared last, for the same reasons as `AckBounded`.
    CreateTopicLater { topic: String, metadata: Option<String>, retention: Retention, now_ms: u64 },
    /// Node `node_id` says its data dir is short of room (`short`), or has room again. While
    /// a node's claim is recent the leader refuses writes that make the data grow, so that a
    /// follower with a smaller or fuller disk does not fill and stop. `now_ms`, the claiming
    /// node's clock, only tells one claim from the next: each node times a claim's lapse by its
    /// own clock from when it saw it, so that a node gone for good does not refuse the
    /// cluster's writes for ever. Declared last, for the same reason as `AckBounded`.
    SetDiskShort { node_id: u64, short: bool, now_ms: u64 },
    /// The leader withdraws node `node_id`'s claim to be short of disk room, which it saw
    /// lapse, if the claim recorded still has the `stamp` it saw: a renewal committed in
    /// between stays (an unconditional withdrawal would erase it, and the leader would take
    /// growing writes until the node's next check). Declared last, for the same reason as
    /// `AckBounded`.
    WithdrawDiskClaim { node_id: u64, stamp: u64 },
}

/// Batches nest (a batch is a command), and bincode decodes nesting by recursion with no
/// bound of its own: a frame of a few thousand nested empty batches, 12 bytes each, would
/// overflow the decoding thread's stack and abort the process. Peers' frames and log entries
/// are decoded through this, which refuses what nests deeper than the leader ever proposes.
mod nesting {
    use std::cell::Cell;

    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer};

    use crate::limits::BATCH_NESTING_MAX;

    thread_local! {
        /// Batches being decoded on this thread, the current one included. A decode runs
        /// on one thread from start to end (bincode is synchronous).
        static DEPTH: Cell<usize> = const { Cell::new(0) };
    }

    /// Leaves one level, also when its decoding fails or unwinds.
    struct Level;

    impl Drop for Level {
        fn drop(&mut self) {
            DEPTH.with(|depth| depth.set(depth.get() - 1));
        }
    }

    pub(super) fn bounded<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
    where
        D: Deserializer<'de>,
        T: Deserialize<'de>,
    {
        let depth = DEPTH.with(|depth| {
            depth.set(depth.get() + 1);
            depth.get()
        });
        let _level = Level;
        if depth > BATCH_NESTING_MAX {
            return Err(D::Error::custom(format!("batches nested more than {BATCH_NESTING_MAX} deep")));
        }
        Vec::<T>::deserialize(deserializer)
    }
}

impl Request {
    /// A publish command; `ids_generated` says the leader generated every message's id.
    pub fn publish(topic: String, messages: Vec<NewMessage>, now_ms: u64, ids_generated: bool) -> Self {
        if ids_generated {
            Request::PublishGeneratedIds { topic, messages, now_ms }
        } else {
            Request::Publish { topic, messages, now_ms }
        }
    }

    /// Rough size in bytes, to bound how much goes into one batched entry.
    pub fn approx_bytes(&self) -> usize {
        match self {
            Request::Publish { topic, messages, .. } | Request::PublishGeneratedIds { topic, messages, .. } => {
                topic.len() + messages.iter().map(|m| m.payload.len() + m.id.len() + 16).sum::<usize>()
            }
            Request::CreateTopic { topic, metadata, .. } | Request::CreateTopicLater { topic, metadata, .. } => {
                topic.len() + metadata.as_ref().map_or(0, String::len)
            }
            Request::Ack { acks } | Request::AckBounded { acks } => {
                acks.iter().map(|a| a.topic.len() + a.subscriber_id.len() + 8).sum()
            }
            Request::Batch(requests) => requests.iter().map(Request::approx_bytes).sum(),
            Request::DeleteTopic { topic } => topic.len(),
            Request::ForgetCursor { topic, subscriber_id } => topic.len() + subscriber_id.len(),
            Request::Tick { .. } => 8,
            Request::SetClusterId { id } => id.len(),
            Request::SetDiskShort { .. } => 24,
            Request::WithdrawDiskClaim { .. } => 16,
        }
    }
}

/// One message inside a publish command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewMessage {
    /// The client's id (or one the leader generated): dedup key within the topic.
    pub id: String,
    /// The client's timestamp, or the leader's clock when the client gave none.
    pub timestamp: u64,
    /// The payload as compact JSON text, carried as bytes and never re-parsed.
    pub payload: Bytes,
}

/// A subscriber's acknowledged sequence on a topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckRecord {
    pub topic: String,
    pub subscriber_id: String,
    pub sequence: u64,
}

/// Retention limits of a topic (from its metadata). `None` means unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retention {
    pub hours: Option<u64>,
    pub messages: Option<u64>,
    pub bytes: Option<u64>,
}

impl Retention {
    pub fn is_unlimited(&self) -> bool {
        self.hours.is_none() && self.messages.is_none() && self.bytes.is_none()
    }
}

/// The result of applying one entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// Blank and membership entries, and commands with nothing to say (`Tick`).
    None,
    TopicCreated {
        created: bool,
    },
    TopicDeleted,
    TopicNotFound,
    /// One result per message, in the command's order.
    Published {
        results: Vec<PublishResult>,
    },
    Acked,
    /// One response per command of a [`Request::Batch`], in order.
    Batch(#[serde(deserialize_with = "nesting::bounded")] Vec<Response>),
    /// A new topic was refused: the cluster holds [`crate::limits::TOPICS_MAX`] topics,
    /// deleted ones included. (Added last: the forward RPC carries responses by variant index.)
    TopicLimitReached,
    /// A subscriber's cursor was forgotten (or none was recorded). Added last, as above.
    CursorForgotten,
    /// An `AckBounded` recorded every ack but these: each is a new subscriber of a topic that
    /// already holds [`crate::limits::CURSORS_PER_TOPIC_MAX`] recorded cursors. Added last.
    AcksRefused {
        refused: Vec<AckRecord>,
    },
    /// A topic was not created: its metadata would take the cluster's topics past
    /// [`crate::limits::TOPICS_METADATA_BYTES_MAX`]. Added last, as above.
    TopicMetadataLimitReached,
}

/// What happened to one published message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PublishResult {
    /// Stored with this sequence.
    Stored { sequence: u64 },
    /// The id was already published to this topic (and is still retained).
    Duplicate { existing_sequence: u64 },
}

/// A topic as the state machine keeps it (persisted in the `topics` column family and
/// cached in memory).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicRecord {
    /// Internal id, the prefix of the topic's message, dedup and cursor keys. Kept across
    /// delete and revive.
    pub id: u64,
    pub name: String,
    pub created_at: u64,
    /// Shared, not copied, by the clones readers take of a record on every publish and read
    /// (it may be 64 KiB). Serialized as a plain string.
    pub metadata: Option<Arc<str>>,
    pub retention: Retention,
    pub deleted: bool,
    /// Last sequence assigned (0 when none).
    pub current_sequence: u64,
    /// First retained sequence; `current_sequence + 1` when nothing is retained.
    pub first_sequence: u64,
    /// Bytes of payload retained (for `retention_bytes`).
    pub bytes: u64,
}

impl TopicRecord {
    /// A topic just created: no message yet.
    pub fn new(id: u64, name: &str, created_at: u64, metadata: Option<Arc<str>>, retention: Retention) -> Self {
        Self {
            id,
            name: name.to_string(),
            created_at,
            metadata,
            retention,
            deleted: false,
            current_sequence: 0,
            first_sequence: 1,
            bytes: 0,
        }
    }

    /// Messages currently retained.
    pub fn message_count(&self) -> u64 {
        self.current_sequence + 1 - self.first_sequence
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::BATCH_NESTING_MAX;

    /// bincode writes an enum variant as its position (u32, little-endian): entries already
    /// in logs and snapshots decode only while every variant keeps its place.
    #[test]
    fn request_variants_keep_their_positions_in_the_encoding() {
        let position = |request: &Request| {
            let bytes = bincode::serialize(request).unwrap();
            u32::from_le_bytes(bytes[..4].try_into().unwrap())
        };
        let publish = |ids_generated| Request::publish("t".into(), vec![], 1, ids_generated);
        assert_eq!(position(&Request::DeleteTopic { topic: "t".into() }), 1);
        assert_eq!(position(&publish(false)), 2);
        assert_eq!(position(&Request::Ack { acks: vec![] }), 3);
        assert_eq!(position(&Request::Tick { now_ms: 1 }), 4);
        assert_eq!(position(&Request::Batch(vec![])), 5);
        assert_eq!(position(&publish(true)), 6);
        let forget = Request::ForgetCursor { topic: "t".into(), subscriber_id: "s".into() };
        assert_eq!(position(&forget), 7);
        assert_eq!(position(&Request::AckBounded { acks: vec![] }), 8);
        assert_eq!(position(&Request::SetClusterId { id: "c".into() }), 9);
        let create =
            Request::CreateTopicLater { topic: "t".into(), metadata: None, retention: Retention::default(), now_ms: 1 };
        assert_eq!(position(&create), 10);
        assert_eq!(position(&Request::SetDiskShort { node_id: 1, short: true, now_ms: 1 }), 11);
        assert_eq!(position(&Request::WithdrawDiskClaim { node_id: 1, stamp: 1 }), 12);
    }

    /// `levels` batches, each holding the next, the innermost empty: as bincode writes them
    /// (variant position, then the length as a u64), without building the value, whose own
    /// encoding and drop would recurse as deep.
    fn nested_batches(empty_batch: &[u8], levels: usize) -> Vec<u8> {
        let (variant, empty_len) = empty_batch.split_at(4);
        assert_eq!(empty_len, [0; 8]);
        let mut bytes = Vec::with_capacity(levels * 12);
        for _ in 1..levels {
            bytes.extend_from_slice(variant);
            bytes.extend_from_slice(&1u64.to_le_bytes());
        }
        bytes.extend_from_slice(empty_batch);
        bytes
    }

    /// A peer's frame of nested batches is refused, not decoded until the stack overflows
    /// (which aborted the process: 100,000 levels take 1.2 MB, under the frame limit).
    #[test]
    fn batches_nested_past_the_bound_are_refused_not_a_stack_overflow() {
        let request = bincode::serialize(&Request::Batch(vec![])).unwrap();
        let response = bincode::serialize(&Response::Batch(vec![])).unwrap();
        let fits = bincode::deserialize::<Request>(&nested_batches(&request, BATCH_NESTING_MAX)).unwrap();
        assert!(matches!(fits, Request::Batch(ref inner) if inner.len() == 1));
        assert!(bincode::deserialize::<Response>(&nested_batches(&response, BATCH_NESTING_MAX)).is_ok());
        for levels in [BATCH_NESTING_MAX + 1, 100_000] {
            let refused = bincode::deserialize::<Request>(&nested_batches(&request, levels)).unwrap_err();
            assert!(refused.to_string().contains("nested"), "{refused}");
            assert!(bincode::deserialize::<Response>(&nested_batches(&response, levels)).is_err());
        }
        // The depth is given back after a refusal: the next decode starts from the top.
        assert!(bincode::deserialize::<Request>(&nested_batches(&request, BATCH_NESTING_MAX)).is_ok());
    }
}
