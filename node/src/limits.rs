//! Limits and timings of the node. Each is a named constant with the reason it exists;
//! `tests` at the bottom check how they relate.

use std::time::Duration;

pub use raft_store::limits::{
    BATCH_MESSAGES_MAX, ID_CHARS_MAX, PAYLOAD_BYTES_MAX, TOPICS_MAX, TOPICS_METADATA_BYTES_MAX, TOPIC_NAME_CHARS_MAX,
};

/// Body of a single publish: the 1 MiB payload plus room for `id`, `timestamp` and JSON
/// whitespace. A larger body cannot hold a payload we would accept.
pub const PUBLISH_BODY_BYTES_MAX: usize = PAYLOAD_BYTES_MAX + 64 * 1024;

/// Deepest nesting of arrays and objects in a payload: under serde_json's recursion limit
/// (128, the envelope of a frame or a page included), so that what is stored can be read back
/// by it and by readers with similar bounds.
pub const PAYLOAD_DEPTH_MAX: usize = 100;

/// Publishes in flight on one publishing WebSocket; past it the server stops reading
/// frames until answers go out.
pub const PUBLISH_WS_INFLIGHT_MAX: usize = 4096;
/// Bytes of publish frames in flight on one publishing WebSocket: 4,096 frames of a megabyte
/// would otherwise be 4 GiB held by one connection.
pub const PUBLISH_WS_INFLIGHT_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Bytes of a publish frame's `ref` (as written, JSON): every answer echoes it, and answers
/// waiting for a client that does not read are bounded by count, so a megabyte `ref` per
/// frame would hold gigabytes per connection.
pub const PUBLISH_WS_REF_BYTES_MAX: usize = 256;
/// Characters of an error body's `message`: messages quote what the client sent (a query
/// value, a topic name), which may be hundreds of kilobytes.
pub const ERROR_MESSAGE_CHARS_MAX: usize = 1024;
/// Characters of a parser's message in a publishing WebSocket's `invalid_request` answer: the
/// message quotes the offending value, which may be a megabyte.
pub const PUBLISH_WS_ERROR_TEXT_CHARS_MAX: usize = 200;
/// How often a publishing WebSocket pings its client, and how long it waits to read anything
/// (a frame, a pong) before it closes the connection: a half-open connection, or one that sent
/// part of a frame and stopped, would otherwise hold its buffers and tasks for good. The pings
/// also tell a client that the node is alive while its answers wait (up to the catch-up wait,
/// a full proposer queue's and the commit timeout, or room in the node's budget): the Rust
/// client closes a connection that sent nothing for 10 s, so they come more often than that.
pub const PUBLISH_WS_PING_INTERVAL: Duration = Duration::from_secs(5);
pub const PUBLISH_WS_IDLE_TIMEOUT: Duration = Duration::from_secs(45);
/// How long a publishing WebSocket waits for the client to take its answers before it gives
/// up on the connection (a client that stopped reading holds its publishes in flight).
pub const PUBLISH_WS_SEND_TIMEOUT: Duration = Duration::from_secs(45);

/// Frames of one publishing WebSocket that were already read when the first of them arrived
/// are proposed together, as one multi-message publish (`api/publish_ws.rs`): at most this
/// many frames and this many bytes of frames. A burst of frames then costs one proposal, one
/// batched dedup read and one task instead of one each.
pub const PUBLISH_WS_GROUP_FRAMES_MAX: usize = 256;
/// The largest single WebSocket frame a publishing connection reads whole. tungstenite reads
/// a frame before it checks the message's size, so a frame over [`PUBLISH_BODY_BYTES_MAX`] is
/// still read (and answered `payload_too_large`: a client cut off mid-write would lose the
/// answer to a reset) up to this size; past it the connection closes at its header, instead
/// of buffering tungstenite's default 16 MiB.
pub const PUBLISH_WS_FRAME_READ_BYTES_MAX: usize = 4 * PUBLISH_BODY_BYTES_MAX;
pub const PUBLISH_WS_GROUP_BYTES_MAX: usize = 1024 * 1024;
/// Publishing WebSockets a node serves at once; past it the upgrade is answered `503
/// unavailable`. Each may hold a frame of up to [`PUBLISH_WS_FRAME_READ_BYTES_MAX`] being read
/// and the answers of [`PUBLISH_WS_INFLIGHT_MAX`] publishes outside the request-body budget
/// (about 6 MiB at worst), so connections without a bound were memory without one.
pub const PUBLISH_WS_CONNECTIONS_MAX: usize = 1024;

/// Body of a batch publish. Bounds one Raft entry (and so one AppendEntries message).
pub const BATCH_BODY_BYTES_MAX: usize = 16 * 1024 * 1024;

/// Request bodies a node reads and holds at once, in bytes (taken as the bytes arrive, held
/// until the request is answered): sixteen 16 MiB batches, not one per connection the clients
/// can open. Publishing WebSockets' frames in flight count against it too.
pub const REQUEST_BODIES_BYTES_MAX: usize = 256 * 1024 * 1024;
/// What the request bodies (and publishing WebSockets' frames in flight) of one client
/// address may hold of [`REQUEST_BODIES_BYTES_MAX`]: four of the largest batches, so that a
/// client opening many connections makes only its own requests wait.
pub const REQUEST_BODIES_BYTES_PER_CLIENT_MAX: usize = REQUEST_BODIES_BYTES_MAX / 4;
/// How long a chunk of a request body waits for room in [`REQUEST_BODIES_BYTES_MAX`] before
/// the request is answered `503 unavailable`: well within a client's request timeout (the
/// Rust client's is 10 s), so the client learns that nothing was stored.
pub const REQUEST_BODY_ROOM_TIMEOUT: Duration = Duration::from_secs(3);

/// Bytes of a too-large body read and dropped before answering 413, so the client gets the
/// answer instead of a connection reset; beyond this the connection is simply closed.
pub const BODY_DRAIN_BYTES_MAX: usize = 32 * 1024 * 1024;

/// Body of topic creation (metadata).
pub const TOPIC_BODY_BYTES_MAX: usize = 64 * 1024;
/// The most one topic takes in a `GET /topics` body, or in the record read for it: its name
/// (letters, digits and `._-`, nothing escaped) and its fields.
pub const TOPIC_LIST_ITEM_BYTES_MAX: usize = TOPIC_NAME_CHARS_MAX + 128;
/// The most bytes of a `/metrics` body: the node's own series (histograms, counters, a few
/// per follower and per column family), then one line per active topic, whose name is at
/// most [`TOPIC_NAME_CHARS_MAX`] ASCII characters (checked by a test against a render).
pub const METRICS_FIXED_BYTES_MAX: usize = 64 * 1024;
pub const METRICS_TOPIC_LINE_BYTES_MAX: usize = TOPIC_NAME_CHARS_MAX + 96;
/// `/metrics` bodies built and not yet sent: two of the largest a full cluster renders. A
/// budget of their own, not the read-pages one, so that a node whose readers fill that
/// budget still answers the scrape that shows it (one render runs at a time anyway).
pub const METRICS_BODIES_BYTES_MAX: usize = 2 * METRICS_BODIES_BYTES_PER_CLIENT_MAX;
/// What one client address's `/metrics` bodies may hold of [`METRICS_BODIES_BYTES_MAX`]: the
/// largest body, so that one client that scrapes and does not read cannot hold all of it.
pub const METRICS_BODIES_BYTES_PER_CLIENT_MAX: usize = crate::metrics::Metrics::rendered_bytes_max(TOPICS_MAX);
/// How long a scrape waits for room in [`METRICS_BODIES_BYTES_MAX`] before `503 unavailable`.
pub const METRICS_BODIES_WAIT_TIMEOUT: Duration = Duration::from_secs(10);

/// Writes and bytes the leader puts into one batched Raft entry, entries in flight at once,
/// and writes waiting for the proposer (see `propose.rs`). One entry in flight measured best
/// (3 nodes on 2 cores, 256 B publishes, side by side): C=64 13.3–13.6k msgs/s with 1,
/// 12.2–14.9k with 2, 11.0–11.6k with 4; WebSocket 4×64: 29–35k, 29–31k, 24–28k. Each entry
/// costs every node an fsync and the followers a round trip, so fewer, larger entries win.
/// Measured again once the leader stopped waiting for its own fsync before replicating
/// (vendor/openraft): HTTP C=64 18.5–19.5k with 1 against 17.6–17.8k with 2, but WebSocket
/// 1×64 30k against 36–37k; and with ids in time order HTTP C=16 10.0–12.3k with 1 against
/// 9.8–10.7k with 2 (docs/benchmarks-history.md); one stays.
pub const PROPOSAL_REQUESTS_MAX: usize = 1024;
pub const PROPOSAL_BYTES_MAX: usize = 1024 * 1024;
pub const PROPOSALS_IN_FLIGHT_MAX: usize = 1;
pub const PROPOSAL_QUEUE_LEN: usize = 16 * 1024;
/// How long an entry's writes wait for their outcome once the leader that proposed them is
/// deposed (`propose.rs`, `outcome`): as long as a caller waits for any write.
pub const PROPOSAL_DEPOSED_ANSWER_WAIT: Duration = WRITE_TIMEOUT;
/// Bytes of writes waiting in the proposer's queue (payloads, ids); past it a write waits for
/// room, within its write timeout.
pub const PROPOSAL_QUEUE_BYTES_MAX: usize = 256 * 1024 * 1024;
/// Longest the proposer waits for the writers of the previous entry to write again (see
/// `propose.rs`), the entry size from which it does (below it, writers are not many enough
/// to be worth any wait), and the entries it proposes without waiting after a wait that did
/// not pay (the writers did not come back: an open-loop load, whose latency it only adds to).
/// tokio's timer rounds a deadline up to its next millisecond tick, so the longest wait is
/// 1–2 ms. Against 600 µs (0.6–1.6 ms) it gathered 58–62 writes per entry at HTTP 8 × 8
/// instead of 40–46, for 8.6 % more msgs/s in 6 of 6 pairs; C=16, batch and fan-out the same
/// (docs/benchmarks-history.md).
pub const PROPOSAL_LINGER: Duration = Duration::from_millis(1);
pub const PROPOSAL_LINGER_MIN_WRITES: usize = 4;
pub const PROPOSAL_LINGER_OFF_ENTRIES: usize = 16;
/// Messages one command may hold when the proposer merges publishes to the same topic into
/// it (`propose.rs`): no more than a batch publish holds.
pub const PROPOSAL_MERGED_MESSAGES_MAX: usize = BATCH_MESSAGES_MAX;

/// How long a write to a leader just elected waits for it to apply what the leaders before it
/// committed (it checks its state first: a topic that must exist) before `503 no_leader`.
pub const LEADER_CATCH_UP_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a write may wait to be committed before the client gets `504 raft_timeout`.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest a request body may take to arrive (`408 request_timeout` after).
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest a write to a client's connection may wait for room before the connection is
/// dropped (`io_deadline.rs`): a client that stops reading would otherwise hold a response,
/// and its share of the read budget, forever. Longer than the stall deadlines of the
/// WebSocket sessions, which close with a reason first.
pub const WRITE_STALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Longest a request's headers may take to arrive, counted from the end of the previous answer
/// on a keep-alive connection (so it is also how long such a connection may sit idle); then
/// the connection is closed. Clients should drop idle connections sooner (the Rust client
/// after 20 s).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Payload bytes of `ack=appended` publishes answered but not yet applied, per node; past it
/// the next one waits (at most [`WRITE_TIMEOUT`]) for earlier ones to be applied.
pub const APPENDED_BYTES_MAX: usize = 64 * 1024 * 1024;
/// What an `ack=appended` publish holds besides its payload, id and topic name until Raft
/// answers it (its task, its openraft entry and response channel, its in-flight id), counted
/// against [`APPENDED_BYTES_MAX`]: tiny payloads would otherwise queue millions of entries.
pub const APPENDED_ENTRY_OVERHEAD_BYTES: usize = 512;

/// How long a stopping node lets requests in progress finish before it closes their
/// connections: a publish is answered within [`WRITE_TIMEOUT`], and the whole stop (this, the
/// subscriptions, the last acks, the hand-over, the close handshakes, the store's close) fits
/// the 30 s grace period `deploy/docker-compose.yml` gives (about 28 s at worst) unless the
/// store is stuck.
pub const SHUTDOWN_REQUESTS_TIMEOUT: Duration = WRITE_TIMEOUT;
/// A signal this long after the first, while the node stops, ends it at once (main.rs);
/// sooner, it is taken for the same request sent twice.
pub const SECOND_SIGNAL_AFTER: Duration = Duration::from_secs(1);
/// How long a stopping node waits for its tasks to release the store before it exits.
pub const SHUTDOWN_CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest a stopping node waits for its Raft core to stop (it may be stuck in a stalled disk's
/// write): past it the node goes on to exit, unable to do better.
pub const SHUTDOWN_RAFT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the server waits, after its close frame, for the client's (ws_close.rs): a live
/// client answers within a round trip. A stopping node waits as long for all of them at once.
pub const CLOSE_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);

/// Default and maximum `limit` of `GET /topics/:name/messages`.
pub const READ_LIMIT_DEFAULT: usize = 100;
pub const READ_LIMIT_MAX: usize = raft_store::limits::READ_MESSAGES_MAX;

/// Longest long-poll (`wait_ms`) a reader may ask for.
pub const READ_WAIT_MS_MAX: u64 = 30_000;

/// Messages a subscription reads from storage per page: bounds its memory, and what it
/// reserves of [`READ_PAGES_BYTES_MAX`] while it reads.
pub const SUBSCRIBE_PAGE_MESSAGES: usize = 256;
/// Payload bytes after which a subscription's page stops (the message that crosses it
/// included), for the same reasons.
pub const SUBSCRIBE_PAGE_PAYLOAD_BYTES: usize = 1024 * 1024;

/// Bytes of message pages read from storage that subscriptions and `GET /messages` hold at
/// once on a node while they send them. A lagging subscriber holds its page until its reader
/// has taken it (a slow one may take minutes), so without a bound a thousand of them replaying
/// large messages would hold gigabytes; past it, the next read waits for room.
pub const READ_PAGES_BYTES_MAX: usize = 256 * 1024 * 1024;
/// What the `GET /messages` bodies and subscription pages read from storage of one client
/// address may hold of [`READ_PAGES_BYTES_MAX`]: a client that asks for pages and does not
/// read them makes only its own reads wait.
pub const READ_PAGES_BYTES_PER_CLIENT_MAX: usize = READ_PAGES_BYTES_MAX / 4;

/// How long `GET /messages` waits for room among the pages read before it answers
/// `503 unavailable`.
pub const READ_PAGES_WAIT_TIMEOUT: Duration = Duration::from_secs(10);

/// Bytes of a message's frame besides its payload, at most: an id of escaped characters (6
/// bytes each), the topic name (ASCII), two numbers and the field names.
pub const FRAME_FIELDS_BYTES_MAX: usize = 6 * ID_CHARS_MAX + TOPIC_NAME_CHARS_MAX + 128;

/// What one page read from storage may hold at most, reserved before the read: payloads up to
/// the read's byte bound plus the message that crosses it, with each message's fields; twice,
/// since the stored messages and the response built from them live together for a moment.
/// The reservation shrinks to the response's size once it is built. A `GET /messages` page
/// (up to 1,000 messages, 4 MiB of payloads) reserves about 14 MiB, a subscription's page
/// (256 messages, 1 MiB) about 5 MiB.
pub const fn read_page_bytes_reserved(payload_bytes_max: usize, messages_max: usize) -> usize {
    2 * (payload_bytes_max + PAYLOAD_BYTES_MAX + messages_max * FRAME_FIELDS_BYTES_MAX)
}
pub const READ_PAGE_BYTES_RESERVED: usize =
    read_page_bytes_reserved(raft_store::limits::READ_BYTES_MAX, READ_LIMIT_MAX);
pub const SUBSCRIBE_PAGE_BYTES_RESERVED: usize =
    read_page_bytes_reserved(SUBSCRIBE_PAGE_PAYLOAD_BYTES, SUBSCRIBE_PAGE_MESSAGES);

/// Serialized frames kept per topic for subscribers to share, by count and bytes, and topics
/// with such a ring at once.
pub const FRAME_CACHE_FRAMES_PER_TOPIC: usize = 4096;
pub const FRAME_CACHE_BYTES_PER_TOPIC: usize = 8 * 1024 * 1024;
pub const FRAME_CACHE_TOPICS_MAX: usize = 1024;
/// Bytes of cached frames over all topics: a few topics' rings at their fullest.
pub const FRAME_CACHE_BYTES_MAX: usize = 64 * 1024 * 1024;

/// How often a subscription pings an idle client, and how long it waits for any frame
/// (pong, ack) before it drops the connection as dead.
pub const SUBSCRIBE_PING_INTERVAL: Duration = Duration::from_secs(15);
pub const SUBSCRIBE_IDLE_TIMEOUT: Duration = Duration::from_secs(45);

/// A node without a leader this long (or this many election timeouts, if longer) closes its
/// subscriptions with 1013, once per leaderless spell, so they resume on a node that has one
/// (`subscribe/leaderless.rs`); checked this often.
pub const SUBSCRIBE_LEADERLESS_CLOSE_AFTER: Duration = Duration::from_secs(5);
pub const SUBSCRIBE_LEADERLESS_ELECTION_TIMEOUTS: u32 = 5;
pub const LEADERLESS_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// `/ready` is 503 on a follower that has not heard its leader for this many election
/// timeouts (the longest a follower waits before it stands): a node cut off from its cluster
/// keeps its leader and term (pre-vote), but serves only ever staler reads.
pub const READY_LEADER_UNHEARD_ELECTION_TIMEOUTS: u32 = 2;

/// How long a subscription whose cursor is past this node's end waits for the node to reach
/// it before `400 invalid_cursor`: the cursor may come from a node further along (a follower
/// lags its leader by a heartbeat or so), and a client failing over must not read that as a
/// bad cursor. A cursor that is simply wrong is refused this much later.
pub const SUBSCRIBE_CURSOR_AHEAD_WAIT: Duration = Duration::from_secs(2);

/// Largest frame a subscriber may send us (acks are tiny).
pub const SUBSCRIBER_FRAME_BYTES_MAX: usize = 64 * 1024;

/// Keepalive probes on every TCP connection ([`crate::net::tune_tcp`]): the first after this
/// much silence, then every interval; after this many unanswered the connection is closed
/// (a vanished peer is noticed within about a minute).
pub const TCP_KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
pub const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
pub const TCP_KEEPALIVE_PROBES: u32 = 3;

/// Read buffer of a Raft peer connection and of a WebSocket publisher. tungstenite zero-fills
/// the whole read buffer before every socket read (its default is 128 KiB), which made
/// `memset` the top entry of the profile for streams of small frames; a larger frame is still
/// read whole, over several reads.
pub const RAFT_READ_BUFFER_BYTES: usize = 64 * 1024;
pub const PUBLISHER_READ_BUFFER_BYTES: usize = 16 * 1024;

/// Read buffer of a subscriber's socket. Subscribers only send acks and pongs, and the
/// buffer is allocated up front for every connection (tungstenite's default is 128 KiB), so
/// it is most of what an idle subscriber costs.
pub const SUBSCRIBER_READ_BUFFER_BYTES: usize = 4 * 1024;
/// Frames queued before the socket is written (tungstenite's default is 128 KiB). The buffer
/// keeps the capacity it grew to, so this bounds an idle subscriber's memory after a burst;
/// the session flushes after every page anyway.
pub const SUBSCRIBER_WRITE_BUFFER_BYTES: usize = 16 * 1024;

/// Subscription sessions run on their own runtime (`main.rs`): one worker thread per this
/// many cores (at least one), at this `nice` (the node's other threads keep the process's,
/// normally 0). Fanning one message out to a thousand sockets is a burst of milliseconds of
/// work; on the node's runtime it queued ahead of the Raft messages and log writes of the
/// next commit (publish p50 16–18 ms with 1,000 subscribers at 100 msgs/s, 4–5 ms on a
/// runtime of its own).
pub const DELIVERY_CORES_PER_THREAD: usize = 2;
pub const DELIVERY_THREAD_NICE: i32 = 5;

/// Subscriptions one node serves at once; more are refused with 503.
pub const SUBSCRIPTIONS_MAX: usize = 100_000;

/// Open files a node may use: a file per subscription and per publishing WebSocket at their
/// bounds, and room for peers, HTTP clients, the log and RocksDB. Below it the node warns at
/// start (it raises its soft limit to the hard one first).
pub const OPEN_FILES_WANTED: usize = SUBSCRIPTIONS_MAX + PUBLISH_WS_CONNECTIONS_MAX + 16_384;
/// The soft open-files limit taken when the hard one is unlimited (Linux's default `nr_open`).
pub const OPEN_FILES_UNLIMITED_CAP: u64 = 1 << 20;
/// Open files kept from client connections, for what the node itself opens: RocksDB's table
/// and WAL files, the log's segments, snapshots, connections to peers. A connection past the
/// rest waits in the listen queue (`serve.rs`): at the limit a new log segment or table file
/// would fail, and the Raft core with it.
pub const OPEN_FILES_RESERVED: u64 = 2048;
/// Client connections a node keeps at least, however low its open-files limit.
pub const CONNECTIONS_MIN: usize = 64;
/// A node at its bound on connections says so at most this often.
pub const CONNECTIONS_FULL_WARNING_INTERVAL: Duration = Duration::from_secs(10);

/// Client connections (HTTP, subscriptions, publishing WebSockets) a node serves at once,
/// given its open-files limit. An unknown or infinite limit (`u64::MAX`) gives the most a
/// semaphore can count (a larger count panics), which no real limit reaches.
pub fn connections_max(open_files_limit: u64) -> usize {
    let room = open_files_limit.saturating_sub(OPEN_FILES_RESERVED).min(tokio::sync::Semaphore::MAX_PERMITS as u64);
    (room as usize).max(CONNECTIONS_MIN)
}

/// How often coalesced acks are written through Raft.
pub const ACK_FLUSH_INTERVAL: Duration = Duration::from_millis(100);
/// How long a stopping node waits for its subscriptions to stop reading acks (each does when
/// its delivery loop sees the shutdown; one blocked on a slow reader's socket may take
/// longer, and its last acks are then recorded by nobody) before its last flush of acks.
pub const SHUTDOWN_SUBSCRIPTIONS_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a stopping node tries to record the acks of its last flush interval.
pub const SHUTDOWN_ACK_FLUSH_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a stopping leader waits for a voter to hold its whole log before it hands its
/// leadership over (raft/handover.rs). Past it, it hands over to the voter furthest along.
pub const HANDOVER_CATCH_UP_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a stopping leader waits for each voter to take its hand-over.
pub const HANDOVER_RPC_TIMEOUT: Duration = Duration::from_secs(1);

/// A `POST /cluster/members` body (`{"id": …, "address": …}`).
pub const MEMBER_BODY_BYTES_MAX: usize = 4 * 1024;
/// How long `POST /cluster/members` waits for the new learner to hold the leader's log up to
/// its own addition before it makes it a voter; past it the node stays a learner and the
/// request answers 504 (the same request again waits on). A voter added before it has caught up
/// would count towards the quorum while unable to acknowledge anything.
pub const MEMBER_CATCH_UP_TIMEOUT: Duration = Duration::from_secs(60);
/// How far behind the leader's log (in entries) a learner may be to be made a voter: a few
/// appends' worth, so that it acknowledges new entries about as soon as the others.
pub const MEMBER_PROMOTE_LAG_MAX: u64 = 64;
/// How long a membership change (its joint and then its final configuration) may take to
/// commit before the request answers 504 `raft_timeout` (it may still commit).
pub const MEMBERSHIP_CHANGE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a node checks whether it leads with a joint configuration left by a leader change
/// (raft/joint.rs), and so how soon it finishes one, or tries again after a failed attempt.
pub const JOINT_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// (topic, subscriber) acks held between flushes: one per subscription the node may serve,
/// so an ack is dropped only when acks of ended subscriptions pile up behind a long outage.
/// A flush writes them in commands of [`ACKS_PER_COMMAND_MAX`].
pub const ACKS_PENDING_MAX: usize = SUBSCRIPTIONS_MAX;
pub use raft_store::limits::ACKS_PER_COMMAND_MAX;

/// How often the leader proposes a `Tick` so `retention_hours` trims quiet topics.
pub const RETENTION_TICK_INTERVAL: Duration = Duration::from_secs(60);

/// How often each node asks the other voters for their clocks (`cluster_clock.rs`).
pub const CLOCK_SAMPLE_INTERVAL: Duration = Duration::from_secs(2);
/// A clock reading whose round trip took longer is not used: its error is up to half of it.
pub const CLOCK_SAMPLE_RTT_MAX: Duration = Duration::from_millis(500);
/// An agreement on the cluster's time older than this (sampling stalled) is not used: the node
/// falls back to its own clock.
pub const CLOCK_AGREEMENT_MAX_AGE: Duration = Duration::from_secs(10);
/// A node whose clock is within this of the voters' median keeps its own reading: the
/// measurement's own noise is below it, and retention is counted in hours.
pub const CLOCK_OFFSET_TOLERATED_MS: u64 = 250;
/// A node whose clock is off the voters' says so in its log at most this often.
pub const CLOCK_OFFSET_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// Subscribers listed by `GET /topics/:name/subscribers`: every recorded cursor of a topic.
pub const SUBSCRIBERS_LIST_MAX: usize = raft_store::limits::CURSORS_PER_TOPIC_MAX as usize;
/// The most one subscriber takes in that body: its id (any characters, as many as 6 bytes
/// each escaped in JSON) and its fields.
pub const SUBSCRIBER_LIST_ITEM_BYTES_MAX: usize = 6 * ID_CHARS_MAX + 128;

/// Acks refused for a topic's bound on recorded cursors are logged at most this often.
pub const ACKS_REFUSED_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// Largest Raft RPC message the transport accepts; a single entry is at most
/// `BATCH_BODY_BYTES_MAX` plus overhead.
pub const RAFT_MESSAGE_BYTES_MAX: usize = 64 * 1024 * 1024;

/// AppendEntries with more than one entry are split (openraft's `PayloadTooLarge`) past this
/// size. An AppendEntries carrying entries has a snapshot chunk's deadline to complete,
/// follower fsync included (`vendor/openraft/PATCHED.md`): a follower catching up on a large
/// backlog over a slow link gets it in pieces that fit, and in halves after a timeout.
pub const APPEND_ENTRIES_BYTES_MAX: u64 = 4 * 1024 * 1024;

/// A peer connection with requests waiting and nothing received for this long (pongs
/// included), or a write to it that moved no byte for this long, is dropped and re-dialed: a
/// partition can stall a TCP connection forever without an error.
pub const PEER_STALL_TIMEOUT: Duration = Duration::from_secs(3);

/// Longest a dial to a peer may take.
pub const PEER_DIAL_TIMEOUT: Duration = Duration::from_secs(2);

/// How long openraft waits before trying a peer it could not reach again: the first wait,
/// doubled after each failure up to [`PEER_BACKOFF_MAX`]. Each failure is logged by openraft
/// (three lines); the cap bounds both that noise and how long a peer that came back waits for
/// its leader's next heartbeat (at most the default election timeout, which it would
/// otherwise spend in vain pre-votes).
pub const PEER_BACKOFF_FIRST: Duration = Duration::from_millis(250);
pub const PEER_BACKOFF_MAX: Duration = Duration::from_millis(ELECTION_TIMEOUT_MS_DEFAULT);

/// Added to openraft's deadline for an RPC, so that its own timer, not the transport's,
/// ends a call it bounds itself.
pub const PEER_CALL_TIMEOUT_MARGIN: Duration = Duration::from_millis(50);

/// RPCs a node works on at once for one peer connection (forwarded writes included); past
/// it, the connection is not read until one is answered, for at most [`RAFT_ROOM_WAIT_MAX`].
pub const RAFT_SERVER_INFLIGHT_MAX: usize = 256;

/// How long a peer connection's next request waits for room ([`RAFT_SERVER_INFLIGHT_MAX`],
/// [`RAFT_INBOUND_BYTES_MAX`]) before the connection is closed: longer than a request holds
/// room while the node works (a forwarded write waits up to [`WRITE_TIMEOUT`] for its commit,
/// a snapshot chunk up to [`SNAPSHOT_CHUNK_TIMEOUT_MS`], then [`PEER_STALL_TIMEOUT`] to write
/// its answer; only a snapshot's last chunk, answered once it is installed, holds its 4 MiB
/// longer, and it is one request), so only a stalled Raft core gets there. Its sender, which
/// reads no pong meanwhile, gave up on the connection and dialled again; left open, each such
/// connection would hold one more frame outside the budget.
pub const RAFT_ROOM_WAIT_MAX: Duration = Duration::from_secs(15);

/// Bytes of Raft requests received from peers that a node holds at once, all connections
/// together, until each is answered. The per-connection bound alone let a peer that redials
/// (each connection a new 256 requests) park gigabytes in openraft's unbounded queue while a
/// stalled disk held the Raft core; past it, no connection is read until requests end.
pub const RAFT_INBOUND_BYTES_MAX: usize = 256 * 1024 * 1024;

/// Requests queued to one peer connection.
pub const PEER_QUEUE_LEN: usize = 1024;

/// Default Raft timings (each can be set by a flag).
pub const HEARTBEAT_MS_DEFAULT: u64 = 250;
pub const ELECTION_TIMEOUT_MS_DEFAULT: u64 = 1000;
/// Largest `--election-timeout-ms`: ten minutes without a leader is already no cluster.
pub const ELECTION_TIMEOUT_MS_MAX: u64 = 600_000;
/// Build a snapshot (and let the log be purged) after this many entries.
pub const SNAPSHOT_LOGS_DEFAULT: u64 = 100_000;
/// Largest `--snapshot-logs`: a trillion entries is already never; the bound keeps openraft's
/// thresholds derived from it (plus [`LOGS_KEPT_AFTER_SNAPSHOT`]) from overflowing.
pub const SNAPSHOT_LOGS_MAX: u64 = 1_000_000_000_000;
/// Bytes the data dir keeps available (`--min-free-bytes`), besides its newest snapshot's
/// size: below it the leader refuses publishes and topic creations (507). What is still
/// written once they are refused fits in it: the writes already admitted (up to the
/// proposer's 256 MiB and `ack=appended`'s 64 MiB, each in the log and then in RocksDB),
/// a new log segment (64 MiB) and its spares, RocksDB's flushes and compactions, acks and
/// deletes.
pub const MIN_FREE_BYTES_DEFAULT: u64 = 1024 * 1024 * 1024;
/// Once writes are refused for want of room they resume only with this much more than the
/// line, so that a disk hovering at it does not flip at every reading.
pub const DISK_ROOM_RESUME_MARGIN_BYTES: u64 = 64 * 1024 * 1024;
/// How often the data dir's free space is read in the background, so how old the reading a
/// write is checked against is (unless a reading stalls with the disk): even at the fastest
/// rate measured here (some 150 MB/s written per node, batches) a tenth of a second is a small
/// part of the reserve.
pub const DISK_ROOM_RECHECK: Duration = Duration::from_millis(100);
/// How often a node compares its data dir's room with what the cluster was told of it.
pub const DISK_ROOM_REPORT_INTERVAL: Duration = Duration::from_secs(1);
/// A node short of room says so again this often.
pub const DISK_SHORT_CLAIM_RENEW: Duration = Duration::from_secs(10);
/// The leader counts a claim this long after it saw it (by its own monotonic clock), then
/// withdraws it: a node gone for good must not refuse the cluster's writes for ever.
pub const DISK_SHORT_CLAIM_LAPSE: Duration = Duration::from_secs(30);
/// Entries kept in the log behind a snapshot, so a briefly lagging follower catches up
/// from the log instead of a snapshot.
pub const LOGS_KEPT_AFTER_SNAPSHOT: u64 = 10_000;
/// Entries per AppendEntries.
pub const APPEND_ENTRIES_MAX: u64 = 1024;
/// Snapshot chunk size, and how long one chunk may take.
pub const SNAPSHOT_CHUNK_BYTES: u64 = 4 * 1024 * 1024;
pub const SNAPSHOT_CHUNK_TIMEOUT_MS: u64 = 10_000;

// How the limits must relate, checked when the crate compiles.
const _: () = {
    assert!(PUBLISH_BODY_BYTES_MAX > PAYLOAD_BYTES_MAX);
    assert!(BATCH_BODY_BYTES_MAX < RAFT_MESSAGE_BYTES_MAX);
    // A group of publishing frames is no larger a command than a batch publish (the last
    // frame may pass the byte bound by one frame).
    assert!(PUBLISH_WS_GROUP_FRAMES_MAX <= BATCH_MESSAGES_MAX);
    assert!(PUBLISH_WS_GROUP_FRAMES_MAX <= PUBLISH_WS_INFLIGHT_MAX);
    // A whole group always fits in the connection's bytes in flight.
    assert!(PUBLISH_WS_GROUP_BYTES_MAX + PUBLISH_BODY_BYTES_MAX <= PUBLISH_WS_INFLIGHT_BYTES_MAX);
    assert!(PUBLISH_WS_GROUP_BYTES_MAX + PUBLISH_BODY_BYTES_MAX <= BATCH_BODY_BYTES_MAX);
    assert!((PROPOSAL_BYTES_MAX as u64) < APPEND_ENTRIES_BYTES_MAX);
    // Replication reads stay under the AppendEntries bound, so splitting is the rare case.
    assert!((raft_store::limits::REPLICATION_READ_BYTES_MAX as u64) < APPEND_ENTRIES_BYTES_MAX);
    assert!(HEARTBEAT_MS_DEFAULT * 3 <= ELECTION_TIMEOUT_MS_DEFAULT);
    // Consecutive ticks start their trimming one topic apart (raft-store's tick).
    assert!(RETENTION_TICK_INTERVAL.as_millis() == raft_store::limits::TICK_ROTATION_MS as u128);
    // An agreement outlives a few failed samplings, and a sample fits in one interval.
    assert!(CLOCK_SAMPLE_INTERVAL.as_millis() * 3 <= CLOCK_AGREEMENT_MAX_AGE.as_millis());
    assert!(CLOCK_SAMPLE_RTT_MAX.as_millis() < CLOCK_SAMPLE_INTERVAL.as_millis());
    assert!(SUBSCRIBE_PING_INTERVAL.as_millis() * 2 < SUBSCRIBE_IDLE_TIMEOUT.as_millis());
    assert!(PUBLISH_WS_PING_INTERVAL.as_millis() * 2 < PUBLISH_WS_IDLE_TIMEOUT.as_millis());
    assert!(WRITE_STALL_TIMEOUT.as_millis() > SUBSCRIBE_IDLE_TIMEOUT.as_millis());
    assert!(WRITE_STALL_TIMEOUT.as_millis() > PUBLISH_WS_SEND_TIMEOUT.as_millis());
    assert!(WRITE_STALL_TIMEOUT.as_millis() > PEER_STALL_TIMEOUT.as_millis());
    assert!(LOGS_KEPT_AFTER_SNAPSHOT < SNAPSHOT_LOGS_DEFAULT);
    // The writes admitted before a refusal land twice (the log, then RocksDB) within the reserve.
    assert!(MIN_FREE_BYTES_DEFAULT as usize > 2 * (PROPOSAL_QUEUE_BYTES_MAX + APPENDED_BYTES_MAX));
    // A claim renewed in time never lapses, even with a few renewals lost.
    assert!(DISK_SHORT_CLAIM_RENEW.as_millis() * 2 < DISK_SHORT_CLAIM_LAPSE.as_millis());
    assert!(PEER_STALL_TIMEOUT.as_millis() > ELECTION_TIMEOUT_MS_DEFAULT as u128);
    // A request that holds room while the node works never outlasts the wait for it (but a
    // snapshot's last chunk, which waits for the install: one request, 4 MiB).
    assert!(RAFT_ROOM_WAIT_MAX.as_millis() > WRITE_TIMEOUT.as_millis() + PEER_STALL_TIMEOUT.as_millis());
    assert!(RAFT_ROOM_WAIT_MAX.as_millis() > SNAPSHOT_CHUNK_TIMEOUT_MS as u128 + PEER_STALL_TIMEOUT.as_millis());
    assert!(SNAPSHOT_CHUNK_BYTES as usize <= RAFT_MESSAGE_BYTES_MAX / 2);
    // The largest request still passes alongside others.
    assert!(RAFT_MESSAGE_BYTES_MAX * 2 <= RAFT_INBOUND_BYTES_MAX);
    // Reads of the largest pages still proceed many at a time.
    assert!(READ_PAGE_BYTES_RESERVED * 8 <= READ_PAGES_BYTES_MAX);
    assert!(READ_PAGE_BYTES_RESERVED * 2 <= READ_PAGES_BYTES_PER_CLIENT_MAX);
    // The longest subscriber list still fits a client's share, twice.
    assert!(SUBSCRIBERS_LIST_MAX * SUBSCRIBER_LIST_ITEM_BYTES_MAX * 2 <= READ_PAGES_BYTES_PER_CLIENT_MAX);
    // A client may send several of the largest bodies at once, and so much in flight on a
    // publishing WebSocket as one connection may hold.
    assert!(BATCH_BODY_BYTES_MAX * 4 <= REQUEST_BODIES_BYTES_PER_CLIENT_MAX);
    assert!(PUBLISH_WS_INFLIGHT_BYTES_MAX <= REQUEST_BODIES_BYTES_PER_CLIENT_MAX);
    assert!(SUBSCRIBE_PAGE_PAYLOAD_BYTES <= raft_store::limits::READ_BYTES_MAX);
    // An ack held for every subscription a node may serve.
    assert!(ACKS_PENDING_MAX >= SUBSCRIPTIONS_MAX);
    assert!(SUBSCRIBE_PAGE_MESSAGES <= READ_LIMIT_MAX);
};
