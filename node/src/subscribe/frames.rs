//! The JSON frames a subscriber receives (API.md §5). Message frames are assembled from the
//! stored payload bytes without parsing them again.

use raft_store::limits::CURSORS_PER_TOPIC_MAX;
use raft_store::StoredMessage;
use serde_json::json;

/// Appends `"key":<json string>` escaping as JSON requires.
fn push_str_field(out: &mut Vec<u8>, key: &str, value: &str) {
    out.extend_from_slice(b"\"");
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(b"\":");
    // Serializing a &str into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, value);
}

/// The message as JSON fields (`id`, `topic`, `sequence`, `payload`, `timestamp`), without
/// braces, shared by subscription frames and `GET /messages`.
pub fn message_fields(out: &mut Vec<u8>, topic: &str, sequence: u64, message: &StoredMessage) {
    push_str_field(out, "id", &message.id);
    out.push(b',');
    push_str_field(out, "topic", topic);
    out.extend_from_slice(format!(",\"sequence\":{sequence},\"payload\":").as_bytes());
    out.extend_from_slice(&message.payload);
    out.extend_from_slice(format!(",\"timestamp\":{}", message.timestamp).as_bytes());
}

/// `{"type":"message",...}`
pub fn message(topic: &str, sequence: u64, message: &StoredMessage) -> String {
    let mut out = Vec::with_capacity(message.payload.len() + message.id.len() + topic.len() + 96);
    out.extend_from_slice(b"{\"type\":\"message\",");
    message_fields(&mut out, topic, sequence, message);
    out.push(b'}');
    // Every piece is valid UTF-8: JSON escapes and the payload, which was parsed as JSON. A
    // stored payload that is not (a damaged disk RocksDB's checksums missed) still goes out,
    // marked, and logged: an empty frame would be a message lost without a word.
    String::from_utf8(out).unwrap_or_else(|e| {
        tracing::error!(topic, sequence, "a stored message is not valid UTF-8; sending it with replacement characters");
        String::from_utf8_lossy(e.as_bytes()).into_owned()
    })
}

pub fn subscribed(topic: &str, cursor: u64, subscriber_id: &str) -> String {
    json!({"type": "control", "subtype": "subscribed", "topic": topic, "cursor": cursor, "subscriber_id": subscriber_id})
        .to_string()
}

/// Sent right after `subscribed` when the topic has no room to record this subscriber's acks,
/// or once, later, when it filled before this subscriber's cursor was recorded.
pub fn acks_not_recorded(topic: &str, subscriber_id: &str) -> String {
    json!({"type": "control", "subtype": "acks_not_recorded", "topic": topic, "subscriber_id": subscriber_id,
           "recorded_cursors_max": CURSORS_PER_TOPIC_MAX})
    .to_string()
}

pub fn messages_expired(topic: &str, requested_cursor: u64, first_available_sequence: u64) -> String {
    json!({"type": "control", "subtype": "messages_expired", "topic": topic,
           "requested_cursor": requested_cursor, "first_available_sequence": first_available_sequence})
    .to_string()
}

pub fn topic_deleted(topic: &str) -> String {
    json!({"type": "control", "subtype": "topic_deleted", "topic": topic}).to_string()
}

pub fn leader_change(new_leader: &str, new_leader_id: u64) -> String {
    json!({"type": "control", "subtype": "leader_change", "new_leader": new_leader,
           "new_leader_id": format!("node-{new_leader_id}"),
           "reason": "A new leader was elected. Send publishes to the new leader; this subscription continues."})
    .to_string()
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    #[test]
    fn message_frame_is_valid_json_with_raw_payload_and_escaped_strings() {
        let m = StoredMessage {
            id: "a\"b".into(),
            timestamp: 5,
            stored_at: 6,
            payload: Bytes::from_static(br#"{"x":[1,2]}"#),
        };
        let frame: serde_json::Value = serde_json::from_str(&message("t", 3, &m)).unwrap();
        assert_eq!(
            frame,
            json!({"type":"message","id":"a\"b","topic":"t","sequence":3,"payload":{"x":[1,2]},"timestamp":5})
        );
    }
}
