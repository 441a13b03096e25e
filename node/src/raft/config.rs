//! openraft's configuration, from the node's flags and limits.

use openraft::{Config, SnapshotPolicy};

use crate::limits::{APPEND_ENTRIES_MAX, LOGS_KEPT_AFTER_SNAPSHOT, SNAPSHOT_CHUNK_BYTES, SNAPSHOT_CHUNK_TIMEOUT_MS};

pub fn raft_config(heartbeat_ms: u64, election_timeout_ms: u64, snapshot_logs: u64) -> Result<Config, String> {
    let config = Config {
        cluster_name: "pubsub".into(),
        heartbeat_interval: heartbeat_ms,
        election_timeout_min: election_timeout_ms,
        election_timeout_max: election_timeout_ms * 2,
        install_snapshot_timeout: SNAPSHOT_CHUNK_TIMEOUT_MS,
        max_payload_entries: APPEND_ENTRIES_MAX,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(snapshot_logs),
        max_in_snapshot_log_to_keep: LOGS_KEPT_AFTER_SNAPSHOT.min(snapshot_logs),
        replication_lag_threshold: snapshot_logs + LOGS_KEPT_AFTER_SNAPSHOT,
        snapshot_max_chunk_size: SNAPSHOT_CHUNK_BYTES,
        purge_batch_size: snapshot_logs.min(256),
        ..Default::default()
    };
    // openraft's error type is large; the caller only reports it.
    config.validate().map_err(|e| e.to_string())
}
