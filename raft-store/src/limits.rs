//! Limits of the storage layer. Each is a named constant with the reason it exists.

/// A message's payload, as compact JSON, may be at most this many bytes (API.md §1).
pub const PAYLOAD_BYTES_MAX: usize = 1024 * 1024;

/// Messages in one batch publish (API.md §4): bounds the size of one log entry.
pub const BATCH_MESSAGES_MAX: usize = 1000;

/// Batches a decoded command may nest (a batch of commands is a command). The leader's
/// batches hold client writes, never batches; the bound leaves room and stops a crafted
/// frame from nesting deep enough to overflow the decoder's stack (`command.rs`).
pub const BATCH_NESTING_MAX: usize = 8;

/// Longest message id and subscriber id (API.md §1).
pub const ID_CHARS_MAX: usize = 256;

/// Longest topic name (API.md §1).
pub const TOPIC_NAME_CHARS_MAX: usize = 255;

/// Topics that may exist at once (active or deleted): every topic record is kept in
/// memory, so this bounds that memory (about 200 bytes each, and their metadata).
pub const TOPICS_MAX: usize = 100_000;

/// The `metadata` of all topics together (active or deleted), in bytes of compact JSON: each
/// record keeps its metadata in memory on every node, and [`TOPICS_MAX`] topics of 64 KiB each
/// would hold 6.4 GiB. Deterministic on all replicas (checked at apply).
pub const TOPICS_METADATA_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Messages one command may trim for retention. Trimming happens inside `apply`, which
/// blocks the apply loop, so a topic that has to drop millions of messages drops them over
/// several commands instead of stalling every other topic. Deterministic on all replicas.
pub const TRIM_PER_COMMAND_MAX: u64 = 10_000;

/// A `Tick` starts trimming at the next topic every this many milliseconds of the leader's
/// clock: the interval at which the leader proposes ticks, so consecutive ticks start one
/// topic apart and no topic always comes last when the budget runs out.
pub const TICK_ROTATION_MS: u64 = 60_000;

/// Messages returned by one read of the message log.
pub const READ_MESSAGES_MAX: usize = 1000;

/// Bytes of payload returned by one read of the message log (a page stops early past it).
pub const READ_BYTES_MAX: usize = 4 * 1024 * 1024;

/// Deletions of a topic whose end a topic's watch remembers: a subscriber that lags behind
/// several deletions (each followed by a re-create) ends at the first one after its start, if
/// no more than this many came since.
pub const DELETIONS_REMEMBERED: usize = 4;

/// Bytes of log entries (as stored) one replication read returns (at least one entry, whatever
/// its size). openraft asks for up to `max_payload_entries` entries at a time and an entry
/// can be a batch of a megabyte, so without this a follower catching up made the leader read
/// hundreds of megabytes at once for one AppendEntries.
pub const REPLICATION_READ_BYTES_MAX: usize = 2 * 1024 * 1024;

/// Bytes of the newest log entries (as stored) kept decoded in memory for the reads that
/// follow an append: replication to each follower and apply. Those reads come within
/// milliseconds, so a few megabytes cover them even at the highest rates.
pub const RECENT_ENTRIES_BYTES_MAX: usize = 4 * 1024 * 1024;

/// Records written to RocksDB per `WriteBatch` while installing a snapshot, which bounds the
/// memory an install needs, whatever the snapshot's size...
pub const SNAPSHOT_INSTALL_BATCH_RECORDS: usize = 4096;
/// ... and at most this many bytes: 4096 records of megabyte messages would be a 4 GiB batch,
/// and a node killed for its memory would redo the install, and die again, at every start.
pub const SNAPSHOT_INSTALL_BATCH_BYTES_MAX: usize = 32 * 1024 * 1024;

/// Acknowledgements carried in one `Ack` command (one per topic and subscriber).
pub const ACKS_PER_COMMAND_MAX: usize = 10_000;

/// Recorded subscriber cursors one topic may hold (one per subscriber id that acked and was
/// not forgotten). Each costs a RocksDB record on every node and a line in every listing of
/// the topic's subscribers, so clients that make up a new id per run cannot grow them
/// without end; the same number as the listing's cap, so a listing is always whole.
pub const CURSORS_PER_TOPIC_MAX: u64 = 10_000;

/// Bytes after which the Raft log starts a new segment file. The log is purged a whole
/// segment at a time, so this is also how much purged log may stay on disk; and it is the
/// size of a preallocated spare segment (segments.rs), of which up to two may wait.
pub const LOG_SEGMENT_BYTES_MAX: u64 = 64 * 1024 * 1024;

/// Largest log record accepted: far above the biggest entry (a 16 MiB batch body with the
/// proposal it shares), so only a torn or corrupt length exceeds it.
pub const LOG_RECORD_BYTES_MAX: usize = 64 * 1024 * 1024;
