//! Column families and key encodings. Integers are big-endian so that RocksDB's
//! byte order is numeric order (log index, sequence).

/// Raft log entries: `index (u64 BE)` → bincode `Entry`.
pub const CF_LOG: &str = "log";
/// Raft's own durable state: `vote`, `committed`, `last_purged`.
pub const CF_RAFT: &str = "raft";
/// State machine bookkeeping: `last_applied`, `membership`, `next_topic_id`,
/// `snapshot_meta`, `install_pending`.
pub const CF_SM_META: &str = "sm_meta";
/// Topics: `name` → bincode `TopicRecord`.
pub const CF_TOPICS: &str = "topics";
/// Messages: `topic_id (u64 BE) ‖ sequence (u64 BE)` → bincode `StoredMessage`.
pub const CF_MESSAGES: &str = "messages";
/// Dedup index: `topic_id (u64 BE) ‖ message id` → `sequence (u64 BE)`.
pub const CF_DEDUP: &str = "dedup";
/// Acknowledged cursors: `topic_id (u64 BE) ‖ subscriber id` → `sequence (u64 BE)`.
pub const CF_CURSORS: &str = "cursors";

/// Every column family, in the order they are created.
pub const ALL_CFS: [&str; 7] = [CF_LOG, CF_RAFT, CF_SM_META, CF_TOPICS, CF_MESSAGES, CF_DEDUP, CF_CURSORS];
/// The column families that make up the state machine (what a snapshot carries).
pub const SM_CFS: [&str; 5] = [CF_SM_META, CF_TOPICS, CF_MESSAGES, CF_DEDUP, CF_CURSORS];

pub const VOTE: &[u8] = b"vote";
pub const COMMITTED: &[u8] = b"committed";
pub const LAST_PURGED: &[u8] = b"last_purged";
/// The id of the node that owns the data dir.
pub const NODE_ID: &[u8] = b"node_id";
pub const LAST_APPLIED: &[u8] = b"last_applied";
pub const MEMBERSHIP: &[u8] = b"membership";
pub const NEXT_TOPIC_ID: &[u8] = b"next_topic_id";
/// The cluster's id, set once by the first `SetClusterId` applied; carried in snapshots.
pub const CLUSTER_ID: &[u8] = b"cluster_id";
/// Nodes short of disk room and when each last said so (`SetDiskShort`); carried in snapshots.
pub const DISK_SHORT: &[u8] = b"disk_short";
pub const SNAPSHOT_META: &[u8] = b"snapshot_meta";
pub const INSTALL_PENDING: &[u8] = b"install_pending";

/// A key greater than every key we write in any column family: the end of a
/// `delete_range` that clears a whole column family.
pub const KEY_MAX: [u8; 300] = [0xFF; 300];

pub fn log_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

pub fn decode_u64(bytes: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(bytes.get(..8)?.try_into().ok()?))
}

pub fn message_key(topic_id: u64, sequence: u64) -> [u8; 16] {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&topic_id.to_be_bytes());
    key[8..].copy_from_slice(&sequence.to_be_bytes());
    key
}

/// `topic_id ‖ suffix`: dedup and cursor keys.
pub fn topic_scoped_key(topic_id: u64, suffix: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(8 + suffix.len());
    key.extend_from_slice(&topic_id.to_be_bytes());
    key.extend_from_slice(suffix.as_bytes());
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_keys_sort_by_topic_then_sequence() {
        assert!(message_key(1, 255) < message_key(1, 256));
        assert!(message_key(1, u64::MAX) < message_key(2, 0));
    }

    #[test]
    fn key_max_is_above_every_key_we_write() {
        let longest_scoped = topic_scoped_key(u64::MAX - 1, &"z".repeat(256));
        assert!(longest_scoped.as_slice() < KEY_MAX.as_slice());
        assert!("z".repeat(255).as_bytes() < KEY_MAX.as_slice());
    }
}
