//! Named limits and defaults of the client, each with the reason it has its value.
//!
//! Limits the server enforces (API.md §1, §4) are repeated here so the client can refuse
//! an input before spending a round trip on it; the server stays the authority.

use std::time::Duration;

/// Most messages in one `POST /topics/:name/messages/batch` (API.md §4); the CLI's
/// `--batch` and the bench split their input into chunks of this size.
pub const BATCH_MESSAGES_MAX: usize = 1000;

/// Largest batch body the server takes (API.md §4; `413 payload_too_large` past it).
pub const BATCH_BODY_BYTES_MAX: usize = 16 * 1024 * 1024;

/// The CLI's `--batch` ends a batch once its messages, as JSON in the body, hold this many
/// bytes, before [`BATCH_MESSAGES_MAX`] when they are large: half the body limit, so that the
/// message that crosses it (a payload is at most 1 MiB) still fits in the body.
pub const CLI_BATCH_BYTES: usize = BATCH_BODY_BYTES_MAX / 2;

/// Longest message id the server accepts (API.md §1); longer ids are refused locally.
pub const MESSAGE_ID_CHARS_MAX: usize = 256;

/// Longest subscriber id the server accepts (API.md §1).
pub const SUBSCRIBER_ID_CHARS_MAX: usize = 256;

/// Time to open a TCP connection to one node. Short, because a dead node is the common
/// reason a connect hangs, and trying the next node is cheaper than waiting.
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(2);

/// Time one HTTP attempt may take. Longer than the server's write timeout (5 s, API.md §1),
/// so a slow commit comes back as `504 raft_timeout` rather than as a client-side timeout.
pub const REQUEST_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

/// How long an unused keep-alive connection to a node stays in the pool: long enough to
/// outlive pauses between bursts, and shorter than the 30 s after which a node closes a
/// connection idle between requests (its `HEADER_READ_TIMEOUT`), so the client never sends a
/// request on a connection the node is closing at that moment.
pub const HTTP_POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(20);

/// Idle keep-alive connections kept per node. A client with more requests in flight than
/// this opens the extra connections for each burst and closes them after; the cap keeps a
/// burst of thousands from holding as many sockets (and server tasks) open for the idle
/// timeout.
pub const HTTP_POOL_IDLE_PER_NODE_MAX: usize = 256;

/// Longest HTTP answer the client reads into memory. A node's largest answers are a page of
/// messages (about 5 MiB) and the list of topics (100,000 topics with their metadata); past
/// this the answer is an error instead of memory growing as long as a broken or hostile
/// server keeps sending.
pub const HTTP_ANSWER_BYTES_MAX: usize = 256 * 1024 * 1024;

/// Attempts one operation may make (the first try included) before the client gives up.
/// With the backoff below this covers a few seconds of leader election.
pub const ATTEMPTS_MAX_DEFAULT: u32 = 10;

/// Wall-clock budget of one operation across all its attempts.
pub const OPERATION_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);

/// Added to a membership change's request timeout and budget: the node waits up to 60 s for a
/// new learner to catch up, then up to 10 s for each of the change's two configurations.
pub const MEMBER_CHANGE_WAIT: Duration = Duration::from_secs(80);

/// First backoff step; doubled on each retry up to [`BACKOFF_MAX_DEFAULT`].
pub const BACKOFF_INITIAL_DEFAULT: Duration = Duration::from_millis(50);

/// Largest backoff step, so a client keeps probing often enough to notice a new leader.
pub const BACKOFF_MAX_DEFAULT: Duration = Duration::from_secs(2);

/// Consecutive 307 answers followed without sleeping. Past it the client backs off, so two
/// nodes that disagree about the leader cannot make it spin.
pub const REDIRECT_HOPS_MAX: u32 = 3;

/// Consecutive failed reconnects after which a subscription gives up and ends with an error.
/// With the capped backoff this is about a minute of a cluster that refuses connections; of
/// nodes that answer nothing at all (cut off by a firewall that drops packets), each attempt
/// also waits out its connect and handshake timeouts, and it takes up to about eight. Each
/// failed attempt is an [`crate::Event::Reconnecting`] meanwhile.
pub const RECONNECT_ATTEMPTS_MAX_DEFAULT: u32 = 30;

/// Interval of WebSocket pings on an idle subscription; their pongs prove the node is alive.
pub const SUBSCRIBE_PING_INTERVAL_DEFAULT: Duration = Duration::from_secs(10);

/// A subscription that receives nothing (not even a pong) for this long is taken as dead and
/// reconnected. A half-open TCP connection (a partitioned node) would otherwise hang forever.
pub const SUBSCRIBE_IDLE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);

/// Events a subscription buffers ahead of the application. When it is full the reader stops
/// reading the socket, TCP pushes back, and the server serves the subscriber from storage.
pub const SUBSCRIPTION_EVENTS_BUFFERED: usize = 256;

/// Times a subscription reconnects to read again a frame that did not parse at the same resume
/// position. A frame garbled on the way (a proxy, a transient fault) parses when the node sends
/// it again; one that never parses (a server of another version) is then reported as
/// [`crate::Error::Protocol`] and read past, instead of reconnecting forever.
pub const SUBSCRIPTION_UNPARSED_REREADS_MAX: u32 = 3;

/// How long [`crate::Subscription::close`] waits for the last ack and the close handshake.
pub const SUBSCRIPTION_CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a publishing connection waits to send its close frame (the node may have stopped
/// reading) before it drops the socket without one.
pub const PUBLISH_WS_CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// The least time a [`crate::Publisher`] waits for a publish's answer, whatever the request
/// timeout: the server answers within its write timeout (5 s, API.md §1), and a shorter
/// request timeout would take an ordinary slow commit for a dead connection and close it.
pub const PUBLISH_WS_ANSWER_TIMEOUT_MIN: Duration = Duration::from_secs(10);

/// Publishes in flight on one [`crate::Publisher`] connection: the server's own limit
/// (API.md §8). Past it the server stops reading the socket, so more would only wait in
/// socket buffers where no timeout sees them; the publisher makes callers wait for a slot.
pub const PUBLISH_WS_INFLIGHT_MAX: usize = 4096;

/// Bytes of publish frames in flight on one [`crate::Publisher`] connection: the server's other
/// limit (API.md §8), for the same reason. A publish holds `max(its frame's bytes, this /
/// PUBLISH_WS_INFLIGHT_MAX)` of it, so one budget keeps to both limits.
pub const PUBLISH_WS_INFLIGHT_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Read buffer of the client's publishing WebSockets. tungstenite
/// zero-fills the whole read buffer before every socket read (its default is 128 KiB), which
/// made `memset` the top of a 1,000-subscriber profile; larger frames are read over several
/// reads.
pub const WS_READ_BUFFER_BYTES: usize = 16 * 1024;

/// Read buffer of a subscription's socket. Smaller than [`WS_READ_BUFFER_BYTES`] because the
/// zero-fill happens on every read attempt, and a subscriber that keeps up reads a few frames
/// at a time: with 100 subscribers at 1,000 msgs/s, 16 KiB made `memset` 4.5 % of the
/// receiving process.
pub const SUBSCRIPTION_READ_BUFFER_BYTES: usize = 8 * 1024;

/// The WebSocket settings of a publishing socket.
pub(crate) fn ws_config() -> tokio_tungstenite::tungstenite::protocol::WebSocketConfig {
    tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default().read_buffer_size(WS_READ_BUFFER_BYTES)
}

/// The WebSocket settings of a subscription's socket.
pub(crate) fn subscription_ws_config() -> tokio_tungstenite::tungstenite::protocol::WebSocketConfig {
    tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .read_buffer_size(SUBSCRIPTION_READ_BUFFER_BYTES)
}

/// Largest publish frame the server reads: its single-publish body limit, a 1 MiB payload
/// plus 64 KiB for the other fields (API.md §7). A larger frame makes the server drop the
/// connection, failing every publish in flight on it, so the publisher refuses it locally.
pub const PUBLISH_WS_FRAME_BYTES_MAX: usize = 1024 * 1024 + 64 * 1024;

// API.md §1: a payload of exactly 1 MiB is accepted, so its frame must be too.
const _: () = assert!(PUBLISH_WS_FRAME_BYTES_MAX > 1024 * 1024);
// The in-flight budget holds the largest frame (checked when compiling).
const _: () = assert!(PUBLISH_WS_FRAME_BYTES_MAX < PUBLISH_WS_INFLIGHT_BYTES_MAX);

/// WebSockets (subscriptions, `--transport ws` publishers) `pubsub bench` opens at once.
/// Each is an upgrade and, for a subscription, a first frame; opened one by one, 1,000
/// subscribers take a round trip each, and all at once they are a burst on the nodes.
pub const BENCH_CONNECTS_CONCURRENT: usize = 64;

/// Messages a paced bench (`--rate`) may send back to back to catch up after falling behind
/// its schedule. Beyond it the schedule slips instead, so a stall is not followed by a burst
/// that would distort the latency of a fixed-rate run.
pub const BENCH_PACE_CATCH_UP_MAX: u32 = 4;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_timeout_outlasts_the_servers_write_timeout() {
        // API.md §1: the server answers 504 raft_timeout after 5 s.
        assert!(REQUEST_TIMEOUT_DEFAULT > Duration::from_secs(5));
        assert!(PUBLISH_WS_ANSWER_TIMEOUT_MIN > Duration::from_secs(5));
    }

    #[test]
    fn backoff_grows_from_initial_to_max_and_fits_the_operation_budget() {
        assert!(BACKOFF_INITIAL_DEFAULT < BACKOFF_MAX_DEFAULT);
        assert!(BACKOFF_MAX_DEFAULT < OPERATION_TIMEOUT_DEFAULT);
    }

    #[test]
    fn the_publish_budget_holds_the_largest_frame_and_splits_evenly_into_slots() {
        assert_eq!(PUBLISH_WS_INFLIGHT_BYTES_MAX % PUBLISH_WS_INFLIGHT_MAX, 0);
        // A semaphore's permits are u32.
        assert!(u32::try_from(PUBLISH_WS_INFLIGHT_BYTES_MAX).is_ok());
    }

    #[test]
    fn idle_timeout_leaves_room_for_several_pings() {
        assert!(SUBSCRIBE_PING_INTERVAL_DEFAULT * 2 < SUBSCRIBE_IDLE_TIMEOUT_DEFAULT);
    }
}
