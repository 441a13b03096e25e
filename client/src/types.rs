//! Wire types of API.md: request and response bodies, and the WebSocket frames.
//!
//! Fields the server may add later are ignored when reading (no `deny_unknown_fields`), and
//! extension fields (marked "(ext)" in API.md) default when absent, so this client also
//! talks to a server that implements only the seed contract.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `GET /cluster` (API.md §2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterInfo {
    /// The answering node, as `"node-N"`.
    pub node_id: String,
    /// The leader this node knows, `None` during an election.
    pub leader_id: Option<String>,
    /// The leader's advertise address `host:port`, `None` during an election.
    pub leader_address: Option<String>,
    /// Advertise addresses of all voters, ordered by node id.
    #[serde(default)]
    pub peers: Vec<String>,
    /// The node's current Raft term.
    #[serde(default)]
    pub raft_term: u64,
    /// The highest log index the node knows to be committed.
    #[serde(default)]
    pub commit_index: u64,
    /// (ext) `leader` | `follower` | `candidate` | `learner`.
    #[serde(default)]
    pub role: Option<String>,
    /// (ext) The highest log index the node has applied.
    #[serde(default)]
    pub last_applied: Option<u64>,
    /// (ext) The cluster's id, `None` until the node has applied it.
    #[serde(default)]
    pub cluster_id: Option<String>,
    /// (ext) Nodes whose data dir is short of room (as `"node-N"`): while the leader lists
    /// any, publishes and topic creations are refused with `507 insufficient_storage`.
    #[serde(default)]
    pub nodes_short_of_disk: Vec<String>,
    /// (ext) Every member, voters and learners, ordered by id.
    #[serde(default)]
    pub members: Vec<Member>,
    /// (ext) The membership is a joint configuration: a change is between its two steps (or
    /// was cut short by a leader change, and the next leader finishes it).
    #[serde(default)]
    pub membership_joint: bool,
}

/// (ext) A member of the cluster, in `/cluster` and the answers of membership changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// `"node-N"`.
    pub node_id: String,
    /// Its Raft address, as the membership records it.
    pub address: String,
    /// Where clients reach it (its `--client-addresses` entry, else `address`).
    pub client_address: String,
    /// `voter` | `learner`.
    pub role: String,
    /// In `/cluster` from the leader (else `None`): whether the member answered the leader
    /// within an election timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reachable: Option<bool>,
    /// In `/cluster` from the leader: the last log index the leader knows the member holds
    /// (`None` until it first answers this leader's replication).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched_index: Option<u64>,
    /// In `/cluster` from the leader: how many entries the member is behind the leader's log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag: Option<u64>,
}

/// (ext) The answer to `POST /cluster/members` and `DELETE /cluster/members/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Membership {
    /// Every member after the change.
    pub members: Vec<Member>,
    /// A joint configuration (see [`ClusterInfo::membership_joint`]).
    #[serde(default)]
    pub joint: bool,
    /// False when nothing had to change (the node was a voter at that address already).
    pub changed: bool,
    /// The log index of the membership.
    pub raft_index: u64,
}

/// `POST /topics/:name` (API.md §3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateTopicAck {
    /// The topic name.
    pub topic: String,
    /// False when the topic already existed (create is idempotent).
    pub created: bool,
    /// Raft index of the create entry (0 when nothing was written).
    #[serde(default)]
    pub raft_index: u64,
}

/// One entry of `GET /topics` (API.md §3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopicSummary {
    /// The topic name.
    pub name: String,
    /// Messages currently retained.
    #[serde(default)]
    pub message_count: u64,
    /// Creation time, ms since the Unix epoch.
    #[serde(default)]
    pub created_at: u64,
}

/// Body of `GET /topics`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct TopicList {
    pub(crate) topics: Vec<TopicSummary>,
}

/// `GET /topics/:name` (API.md §3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopicInfo {
    /// The topic name.
    pub topic: String,
    /// Messages currently retained.
    #[serde(default)]
    pub message_count: u64,
    /// Last sequence assigned (0 when none).
    #[serde(default)]
    pub current_sequence: u64,
    /// Creation time, ms since the Unix epoch.
    #[serde(default)]
    pub created_at: u64,
    /// The metadata given at creation, as given (`null` when none).
    #[serde(default)]
    pub metadata: Value,
}

/// `DELETE /topics/:name/subscribers/:id` (ext): a subscriber's recorded cursor, forgotten.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForgottenCursor {
    pub topic: String,
    pub subscriber_id: String,
    /// The sequence it had acked; `None` when a retry found it already forgotten by an
    /// earlier attempt of the same call.
    #[serde(default)]
    pub acked_sequence: Option<u64>,
    /// True: the cursor is gone.
    pub deleted: bool,
    /// Raft index of the entry; `None` as for `acked_sequence`.
    #[serde(default)]
    pub raft_index: Option<u64>,
}

/// `DELETE /topics/:name` (API.md §3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeleteTopicAck {
    /// The topic name.
    pub topic: String,
    /// True: the topic is gone.
    pub deleted: bool,
    /// Raft index of the delete entry; `None` when a retry found the topic already deleted
    /// by an earlier attempt of the same call.
    #[serde(default)]
    pub raft_index: Option<u64>,
}

/// How long a publish waits before it is answered (API.md §4).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AckMode {
    /// Answer after a majority has fsynced the entry and the leader applied it (201).
    #[default]
    Committed,
    /// Answer once the leader accepted the entry (202); a leader crash may lose it.
    Appended,
}

impl AckMode {
    /// The `ack=` query value.
    pub fn as_str(self) -> &'static str {
        match self {
            AckMode::Committed => "committed",
            AckMode::Appended => "appended",
        }
    }
}

/// A message to publish.
///
/// ```
/// use pubsub_client::NewMessage;
/// use serde_json::json;
///
/// let m = NewMessage::new(json!({"order": 1})).with_id("order-1");
/// assert_eq!(m.id.as_deref(), Some("order-1"));
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewMessage {
    /// Dedup id. When `None` the client generates a UUID v7 before the first attempt, so
    /// every retry carries the same id and a retry can never publish twice. Time-ordered
    /// rather than random (v4): every node inserts each id into its dedup index, and ids that
    /// arrive in order land next to the previous insert instead of anywhere in RocksDB's
    /// memtable (batch publish +30–60 % and a third less node CPU, docs/benchmarks-history.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Any JSON value, at most 1 MiB as compact JSON.
    pub payload: Value,
    /// Ms since the Unix epoch; `None` lets the leader's clock fill it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<u64>,
}

impl NewMessage {
    /// A message with this payload, no id (one is generated) and no timestamp.
    pub fn new(payload: Value) -> NewMessage {
        NewMessage { id: None, payload, timestamp: None }
    }

    /// Sets the dedup id.
    pub fn with_id(mut self, id: impl Into<String>) -> NewMessage {
        self.id = Some(id.into());
        self
    }

    /// Sets the timestamp (ms since the Unix epoch).
    pub fn with_timestamp(mut self, timestamp_ms: u64) -> NewMessage {
        self.timestamp = Some(timestamp_ms);
        self
    }
}

/// Answer to a publish (API.md §4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PublishAck {
    /// The message id (the generated one when the caller gave none).
    pub id: String,
    /// The topic.
    pub topic: String,
    /// The sequence the message got; `None` only with `ack=appended` (not yet assigned).
    /// Never `None` for a duplicate: one whose first publish is still in flight is retried
    /// until it has a sequence.
    #[serde(default)]
    pub sequence: Option<u64>,
    /// Raft index of the entry; `None` when reported from a duplicate answer.
    #[serde(default)]
    pub raft_index: Option<u64>,
    /// True when the answer came after commit.
    #[serde(default)]
    pub committed: bool,
    /// True when a retry of this call found the id already published: an earlier attempt of
    /// the same call got through, and `sequence` is the `existing_sequence`.
    #[serde(default)]
    pub duplicate: bool,
}

impl PublishAck {
    /// The ack of a publish whose id the topic already held at `sequence` (a `409` carrying
    /// its `existing_sequence`): the message is stored, committed, once.
    pub(crate) fn already_stored(id: String, topic: &str, sequence: u64) -> PublishAck {
        PublishAck {
            id,
            topic: topic.to_string(),
            sequence: Some(sequence),
            raft_index: None,
            committed: true,
            duplicate: true,
        }
    }
}

/// One message's outcome in a batch publish.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum BatchItem {
    /// Published with this sequence.
    Published {
        /// The message id.
        id: String,
        /// The sequence it got.
        sequence: u64,
    },
    /// The id was already in the topic (from an earlier attempt when the batch was retried,
    /// see [`BatchAck::retried`]).
    Duplicate {
        /// The message id.
        id: String,
        /// The first publish's sequence, `None` while it is in flight.
        existing_sequence: Option<u64>,
    },
    /// Refused for another reason.
    Failed {
        /// The message id.
        id: String,
        /// The server's error code.
        error: String,
    },
}

impl BatchItem {
    /// The message id.
    pub fn id(&self) -> &str {
        match self {
            BatchItem::Published { id, .. } | BatchItem::Duplicate { id, .. } | BatchItem::Failed { id, .. } => id,
        }
    }
}

/// One raw entry of a batch answer: `{"id","sequence"}` or `{"id","error","existing_sequence"}`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct RawBatchItem {
    id: String,
    #[serde(default)]
    sequence: Option<u64>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    existing_sequence: Option<u64>,
}

impl From<RawBatchItem> for BatchItem {
    fn from(raw: RawBatchItem) -> BatchItem {
        match (raw.error, raw.sequence) {
            (Some(error), _) if error == "duplicate_message_id" => {
                BatchItem::Duplicate { id: raw.id, existing_sequence: raw.existing_sequence }
            }
            (Some(error), _) => BatchItem::Failed { id: raw.id, error },
            (None, Some(sequence)) => BatchItem::Published { id: raw.id, sequence },
            (None, None) => BatchItem::Failed { id: raw.id, error: "missing_sequence".to_string() },
        }
    }
}

/// Body of a batch answer as sent by the server.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct RawBatchAck {
    pub(crate) topic: String,
    pub(crate) results: Vec<RawBatchItem>,
    #[serde(default)]
    pub(crate) raft_index: Option<u64>,
    #[serde(default)]
    pub(crate) committed: bool,
}

/// Answer to `POST /topics/:name/messages/batch` (API.md §4, ext).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BatchAck {
    /// The topic.
    pub topic: String,
    /// One outcome per message, in request order.
    pub results: Vec<BatchItem>,
    /// Raft index of the batch entry.
    pub raft_index: Option<u64>,
    /// True when answered after commit.
    pub committed: bool,
    /// True when an earlier attempt of this call may have reached the server (a lost
    /// connection, `504`, `500 not_committed`); then `Duplicate` items are most likely this
    /// batch's own earlier attempt, not someone else's message.
    pub retried: bool,
}

/// A message as stored and delivered (API.md §5).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// The dedup id.
    pub id: String,
    /// The topic.
    pub topic: String,
    /// Position in the topic: starts at 1, contiguous, gap-free.
    pub sequence: u64,
    /// The payload as published.
    pub payload: Value,
    /// Ms since the Unix epoch.
    #[serde(default)]
    pub timestamp: u64,
}

/// `GET /topics/:name/messages` (API.md §5, ext).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessagePage {
    /// Messages after the requested cursor, in sequence order.
    pub messages: Vec<Message>,
    /// The last returned sequence, or the requested cursor when none: pass it as the next
    /// `after`.
    pub next_cursor: u64,
    /// The topic's last assigned sequence on the answering node.
    #[serde(default)]
    pub current_sequence: u64,
    /// The first sequence the answering node still retains (0 from a server that does not
    /// say). When it is above the requested cursor + 1, the messages in between expired
    /// under retention and this page starts after the gap.
    #[serde(default)]
    pub first_available_sequence: u64,
}

/// One subscriber of `GET /topics/:name/subscribers` (API.md §5, ext).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubscriberInfo {
    /// The subscriber id.
    pub subscriber_id: String,
    /// Its last recorded ack.
    #[serde(default)]
    pub acked_sequence: u64,
    /// `current_sequence - acked_sequence`.
    #[serde(default)]
    pub lag: u64,
}

/// Body of `GET /topics/:name/subscribers`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct SubscriberList {
    pub(crate) subscribers: Vec<SubscriberInfo>,
}

/// A frame the server sends on a subscription (API.md §5).
///
/// Parsed in one pass through [`WireFrame`]: serde's internally tagged enums buffer every
/// frame, payload included, into an intermediate tree before parsing it again, which was the
/// largest share of a subscriber's CPU after the socket itself.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "WireFrame")]
pub(crate) enum ServerFrame {
    Message(Message),
    Control(ControlFrame),
    /// A frame type this client does not know; skipped.
    Unknown,
}

/// The `control` frames of API.md §5.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ControlFrame {
    Subscribed {
        cursor: u64,
    },
    MessagesExpired {
        requested_cursor: u64,
        first_available_sequence: u64,
    },
    TopicDeleted,
    LeaderChange {
        new_leader: Option<String>,
        new_leader_id: Option<String>,
    },
    /// The topic holds the most recorded cursors it may, none of them this subscriber's: its
    /// acks are not recorded (API.md §7, `GET /topics/:name/subscribers`).
    AcksNotRecorded {
        recorded_cursors_max: u64,
    },
    /// A control subtype this client does not know; skipped.
    Unknown,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum FrameType {
    Message,
    Control,
    #[serde(other)]
    Unknown,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum ControlSubtype {
    Subscribed,
    MessagesExpired,
    TopicDeleted,
    LeaderChange,
    AcksNotRecorded,
    #[serde(other)]
    Unknown,
}

/// Every field any server frame carries, flat: what [`ServerFrame`] is parsed from.
#[derive(Deserialize)]
struct WireFrame {
    #[serde(rename = "type")]
    kind: FrameType,
    subtype: Option<ControlSubtype>,
    id: Option<String>,
    topic: Option<String>,
    sequence: Option<u64>,
    /// `Some` whenever the field is present, `null` included (a JSON null is a payload).
    #[serde(default, deserialize_with = "present")]
    payload: Option<Value>,
    #[serde(default)]
    timestamp: u64,
    cursor: Option<u64>,
    requested_cursor: Option<u64>,
    first_available_sequence: Option<u64>,
    new_leader: Option<String>,
    new_leader_id: Option<String>,
    recorded_cursors_max: Option<u64>,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

impl TryFrom<WireFrame> for ServerFrame {
    type Error = String;

    fn try_from(w: WireFrame) -> Result<Self, String> {
        let missing = |field: &str| format!("{field} missing from the frame");
        Ok(match w.kind {
            FrameType::Unknown => ServerFrame::Unknown,
            FrameType::Message => ServerFrame::Message(Message {
                id: w.id.ok_or_else(|| missing("id"))?,
                topic: w.topic.ok_or_else(|| missing("topic"))?,
                sequence: w.sequence.ok_or_else(|| missing("sequence"))?,
                payload: w.payload.ok_or_else(|| missing("payload"))?,
                timestamp: w.timestamp,
            }),
            FrameType::Control => ServerFrame::Control(match w.subtype.ok_or_else(|| missing("subtype"))? {
                ControlSubtype::Subscribed => {
                    ControlFrame::Subscribed { cursor: w.cursor.ok_or_else(|| missing("cursor"))? }
                }
                ControlSubtype::MessagesExpired => ControlFrame::MessagesExpired {
                    requested_cursor: w.requested_cursor.ok_or_else(|| missing("requested_cursor"))?,
                    first_available_sequence: w
                        .first_available_sequence
                        .ok_or_else(|| missing("first_available_sequence"))?,
                },
                ControlSubtype::TopicDeleted => ControlFrame::TopicDeleted,
                ControlSubtype::LeaderChange => {
                    ControlFrame::LeaderChange { new_leader: w.new_leader, new_leader_id: w.new_leader_id }
                }
                ControlSubtype::AcksNotRecorded => ControlFrame::AcksNotRecorded {
                    recorded_cursors_max: w.recorded_cursors_max.ok_or_else(|| missing("recorded_cursors_max"))?,
                },
                ControlSubtype::Unknown => ControlFrame::Unknown,
            }),
        })
    }
}

/// The ack frame a subscriber sends: `{"type":"ack","sequence":N}`.
pub(crate) fn ack_frame(sequence: u64) -> String {
    serde_json::json!({"type": "ack", "sequence": sequence}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn frame(v: Value) -> ServerFrame {
        match serde_json::from_value(v) {
            Ok(f) => f,
            Err(e) => panic!("frame did not parse: {e}"),
        }
    }

    #[test]
    fn message_frame_parses_into_a_message() {
        let f = frame(json!({"type":"message","id":"m","topic":"t","sequence":3,
                             "payload":{"a":1},"timestamp":17}));
        assert_eq!(
            f,
            ServerFrame::Message(Message {
                id: "m".into(),
                topic: "t".into(),
                sequence: 3,
                payload: json!({"a":1}),
                timestamp: 17
            })
        );
    }

    #[test]
    fn every_control_subtype_of_the_contract_parses() {
        assert_eq!(
            frame(json!({"type":"control","subtype":"subscribed","topic":"t","cursor":150,
                         "subscriber_id":"s"})),
            ServerFrame::Control(ControlFrame::Subscribed { cursor: 150 })
        );
        assert_eq!(
            frame(json!({"type":"control","subtype":"messages_expired","topic":"t",
                         "requested_cursor":4,"first_available_sequence":10})),
            ServerFrame::Control(ControlFrame::MessagesExpired { requested_cursor: 4, first_available_sequence: 10 })
        );
        assert_eq!(
            frame(json!({"type":"control","subtype":"topic_deleted","topic":"t"})),
            ServerFrame::Control(ControlFrame::TopicDeleted)
        );
        assert_eq!(
            frame(json!({"type":"control","subtype":"leader_change","new_leader":"h:1",
                         "new_leader_id":"node-2","reason":"r"})),
            ServerFrame::Control(ControlFrame::LeaderChange {
                new_leader: Some("h:1".into()),
                new_leader_id: Some("node-2".into())
            })
        );
    }

    #[test]
    fn seed_leader_change_without_id_and_unknown_frames_still_parse() {
        assert_eq!(
            frame(json!({"type":"control","subtype":"leader_change","new_leader":"h:1"})),
            ServerFrame::Control(ControlFrame::LeaderChange { new_leader: Some("h:1".into()), new_leader_id: None })
        );
        assert_eq!(frame(json!({"type":"control","subtype":"heartbeat"})), ServerFrame::Control(ControlFrame::Unknown));
        assert_eq!(
            frame(json!({"type":"control","subtype":"acks_not_recorded","topic":"t","subscriber_id":"s",
                         "recorded_cursors_max":10000})),
            ServerFrame::Control(ControlFrame::AcksNotRecorded { recorded_cursors_max: 10000 })
        );
        assert_eq!(frame(json!({"type":"stats","x":1})), ServerFrame::Unknown);
    }

    #[test]
    fn a_null_payload_is_a_payload_and_a_missing_field_is_an_error() {
        let f = frame(json!({"type":"message","id":"m","topic":"t","sequence":1,"payload":null}));
        assert!(matches!(f, ServerFrame::Message(Message { payload: Value::Null, timestamp: 0, .. })));
        for broken in [
            json!({"type":"message","id":"m","topic":"t","sequence":1}),
            json!({"type":"message","id":"m","topic":"t","payload":1}),
            json!({"type":"control","subtype":"subscribed"}),
            json!({"type":"control"}),
        ] {
            assert!(serde_json::from_value::<ServerFrame>(broken.clone()).is_err(), "{broken} parsed");
        }
    }

    #[test]
    fn batch_results_map_to_published_duplicate_and_failed() {
        let raw: RawBatchAck = match serde_json::from_value(json!({
            "topic":"t","raft_index":9,"committed":true,
            "results":[{"id":"a","sequence":1},
                       {"id":"b","error":"duplicate_message_id","existing_sequence":null},
                       {"id":"c","error":"payload_too_large"}]}))
        {
            Ok(r) => r,
            Err(e) => panic!("{e}"),
        };
        let items: Vec<BatchItem> = raw.results.into_iter().map(BatchItem::from).collect();
        assert_eq!(
            items,
            vec![
                BatchItem::Published { id: "a".into(), sequence: 1 },
                BatchItem::Duplicate { id: "b".into(), existing_sequence: None },
                BatchItem::Failed { id: "c".into(), error: "payload_too_large".into() },
            ]
        );
    }

    #[test]
    fn cluster_info_from_a_seed_server_without_extensions_parses() {
        let info: ClusterInfo = match serde_json::from_value(json!({
            "node_id":"node-1","leader_id":null,"leader_address":null,
            "peers":["a:1"],"raft_term":5,"commit_index":1}))
        {
            Ok(i) => i,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(info.leader_address, None);
        assert_eq!(info.role, None);
        assert_eq!(info.cluster_id, None);
    }

    #[test]
    fn a_message_page_keeps_first_available_sequence_and_defaults_it_to_zero() {
        let page = |v: Value| match serde_json::from_value::<MessagePage>(v) {
            Ok(p) => p,
            Err(e) => panic!("{e}"),
        };
        let trimmed = page(json!({"messages":[{"id":"m","topic":"t","sequence":8,"payload":1}],
                                  "next_cursor":8,"current_sequence":9,"first_available_sequence":8}));
        assert_eq!(trimmed.first_available_sequence, 8);
        assert_eq!(trimmed.messages[0].sequence, 8);
        let older = page(json!({"messages":[],"next_cursor":0,"current_sequence":0}));
        assert_eq!(older.first_available_sequence, 0);
    }

    #[test]
    fn new_message_leaves_out_absent_id_and_timestamp() {
        let body = serde_json::to_value(NewMessage::new(json!(1))).ok();
        assert_eq!(body, Some(json!({"payload":1})));
    }

    #[test]
    fn ack_frame_matches_the_contract() {
        let v: Value = serde_json::from_str(&ack_frame(151)).unwrap_or(Value::Null);
        assert_eq!(v, json!({"type":"ack","sequence":151}));
    }
}
