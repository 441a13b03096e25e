//! Prometheus metrics (`GET /metrics`). Counters and the commit histogram are updated where
//! things happen; gauges that mirror Raft or topic state are refreshed when scraped.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use raft_store::FsyncObserver;

use crate::app::App;
use crate::limits::{METRICS_FIXED_BYTES_MAX, METRICS_TOPIC_LINE_BYTES_MAX, PUBLISH_WS_CONNECTIONS_MAX};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TopicLabel {
    pub topic: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ColumnFamilyLabel {
    pub column_family: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FollowerLabel {
    pub follower: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: String,
}

/// What became of a published message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Stored,
    Duplicate,
    Error,
    Appended,
}

impl Outcome {
    const ALL: [Outcome; 4] = [Outcome::Stored, Outcome::Duplicate, Outcome::Error, Outcome::Appended];

    fn label(self) -> &'static str {
        match self {
            Outcome::Stored => "stored",
            Outcome::Duplicate => "duplicate",
            Outcome::Error => "error",
            Outcome::Appended => "appended",
        }
    }
}

pub struct Metrics {
    registry: Registry,
    /// Published messages by outcome, one counter per [`Outcome`] made up front so counting a
    /// publish is one atomic add, not a label allocation and a map lookup.
    publishes: [Counter; 4],
    /// Time from proposing a write to having it committed and applied here.
    pub commit_latency: Histogram,
    pub leader_changes: Counter,
    pub subscribers: Gauge,
    publishing_connections: Gauge,
    pub delivered: Counter,
    /// Subscriber acks not recorded because their topic holds its most recorded cursors.
    pub acks_refused: Counter,
    /// Mirrors [`crate::subscribe::acks::AckCoalescer::dropped`] at each render.
    acks_dropped: Counter,
    raft_term: Gauge<u64, AtomicU64>,
    commit_index: Gauge<u64, AtomicU64>,
    last_applied: Gauge<u64, AtomicU64>,
    is_leader: Gauge,
    clock_offset: Gauge,
    topic_sequence: Family<TopicLabel, Gauge<u64, AtomicU64>>,
    log_io: LogIoMetrics,
    last_log_index: Gauge<u64, AtomicU64>,
    log_entries: Gauge<u64, AtomicU64>,
    snapshot_index: Gauge<u64, AtomicU64>,
    log_bytes: Gauge<u64, AtomicU64>,
    data_dir_available_bytes: Gauge<u64, AtomicU64>,
    data_dir_min_free_bytes: Gauge<u64, AtomicU64>,
    follower_lag: Family<FollowerLabel, Gauge<u64, AtomicU64>>,
    follower_reachable: Family<FollowerLabel, Gauge>,
    table_file_bytes: Family<ColumnFamilyLabel, Gauge<u64, AtomicU64>>,
    read_pages_bytes: Gauge<u64, AtomicU64>,
    request_bodies_bytes: Gauge<u64, AtomicU64>,
    raft_inbound_bytes: Gauge<u64, AtomicU64>,
    /// One render at a time: each fills the per-topic and per-follower families, encodes them
    /// and empties them again, and two at once would encode each other's half-filled ones.
    /// Awaited by the handler ([`Metrics::render_turn`]), so scrapes waiting their turn hold
    /// no blocking thread; [`Metrics::render`] takes the turn as its proof.
    turns: Arc<tokio::sync::Semaphore>,
}

/// What the log store reports of its fsyncs ([`FsyncObserver`]).
#[derive(Clone)]
struct LogIoMetrics {
    fsync_seconds: Histogram,
    fsynced_appends: Counter,
}

impl FsyncObserver for LogIoMetrics {
    fn log_fsynced(&self, appends: usize, elapsed: Duration) {
        self.fsync_seconds.observe(elapsed.as_secs_f64());
        self.fsynced_appends.inc_by(appends as u64);
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("pubsub");
        let by_outcome = Family::<OutcomeLabel, Counter>::default();
        registry.register("publishes", "Published messages by outcome", by_outcome.clone());
        let publishes =
            Outcome::ALL.map(|o| by_outcome.get_or_create(&OutcomeLabel { outcome: o.label().into() }).clone());
        // 0.1 ms .. ~6.6 s: past the write timeout (5 s), so writes that time out are told
        // from slow ones.
        let commit_latency = Histogram::new(exponential_buckets(0.0001, 2.0, 17));
        registry.register("commit_latency_seconds", "Time from proposal to commit and apply", commit_latency.clone());
        let leader_changes = Counter::default();
        registry.register("leader_changes", "Leader changes seen by this node", leader_changes.clone());
        let subscribers = Gauge::default();
        registry.register("subscribers", "Open WebSocket subscriptions on this node", subscribers.clone());
        let publishing_connections = Gauge::default();
        registry.register(
            "publishing_connections",
            "Open publishing WebSockets on this node, bounded per node",
            publishing_connections.clone(),
        );
        let delivered = Counter::default();
        registry.register("delivered_messages", "Message frames sent to subscribers", delivered.clone());
        let acks_refused = Counter::default();
        registry.register(
            "acks_refused",
            "Subscriber acks not recorded: their topic holds the most recorded cursors it may",
            acks_refused.clone(),
        );
        let acks_dropped = Counter::default();
        registry.register(
            "acks_dropped",
            "Subscriber acks dropped before being recorded: too many waited for the next flush (a long outage)",
            acks_dropped.clone(),
        );
        let raft_term = Gauge::<u64, AtomicU64>::default();
        registry.register("raft_term", "Current Raft term", raft_term.clone());
        let commit_index = Gauge::<u64, AtomicU64>::default();
        registry.register("raft_commit_index", "Highest committed log index known", commit_index.clone());
        let last_applied = Gauge::<u64, AtomicU64>::default();
        registry.register("raft_last_applied", "Last applied log index", last_applied.clone());
        let is_leader = Gauge::default();
        registry.register(
            "raft_is_leader",
            "1 when this node leads and a quorum acknowledged it within two election timeouts (a leader cut off from its followers reports 0)",
            is_leader.clone(),
        );
        let clock_offset = Gauge::default();
        registry.register(
            "clock_offset_milliseconds",
            format!(
                "What this node adds to its own clock to stamp the voters' median time: 0 while it is within {} ms of it or no majority of voters answered (a value other than 0 is a clock to fix)",
                crate::limits::CLOCK_OFFSET_TOLERATED_MS
            ),
            clock_offset.clone(),
        );
        registry.register(
            "build",
            "The pubsub-node version and the git commit it was built from",
            prometheus_client::metrics::info::Info::new(vec![("version", crate::VERSION), ("commit", crate::COMMIT)]),
        );
        let topic_sequence = Family::<TopicLabel, Gauge<u64, AtomicU64>>::default();
        registry.register("topic_current_sequence", "Last sequence assigned, per topic", topic_sequence.clone());
        // 50 µs .. ~1.6 s: a healthy disk sits in the first few buckets.
        let log_io = LogIoMetrics {
            fsync_seconds: Histogram::new(exponential_buckets(0.00005, 2.0, 16)),
            fsynced_appends: Counter::default(),
        };
        registry.register(
            "log_fsync_seconds",
            "Time of each fsync that made Raft log appends durable",
            log_io.fsync_seconds.clone(),
        );
        registry.register(
            "log_fsynced_appends",
            "Raft log appends made durable; per fsync (divided by log_fsync_seconds_count) it measures group commit",
            log_io.fsynced_appends.clone(),
        );
        let last_log_index = Gauge::<u64, AtomicU64>::default();
        registry.register("raft_last_log_index", "Last index in this node's Raft log", last_log_index.clone());
        let log_entries = Gauge::<u64, AtomicU64>::default();
        registry.register(
            "raft_log_entries",
            "Entries in this node's Raft log (purged only behind a snapshot)",
            log_entries.clone(),
        );
        let snapshot_index = Gauge::<u64, AtomicU64>::default();
        registry.register(
            "raft_snapshot_index",
            "Last log index in this node's newest snapshot (built here or installed from the leader); 0 when it has none",
            snapshot_index.clone(),
        );
        let data_dir_available_bytes = Gauge::<u64, AtomicU64>::default();
        registry.register(
            "data_dir_available_bytes",
            "Bytes still free for the node on its data dir's file system; a node whose log write fails for want of room stops",
            data_dir_available_bytes.clone(),
        );
        let data_dir_min_free_bytes = Gauge::<u64, AtomicU64>::default();
        registry.register(
            "data_dir_min_free_bytes",
            "The reserve of --min-free-bytes: while the leader's data dir has less available than it plus the newest snapshot's size, publishes and topic creations are refused (507)",
            data_dir_min_free_bytes.clone(),
        );
        let log_bytes = Gauge::<u64, AtomicU64>::default();
        registry.register(
            "raft_log_bytes",
            "Bytes of the records (and segment headers) of this node's Raft log",
            log_bytes.clone(),
        );
        let table_file_bytes = Family::<ColumnFamilyLabel, Gauge<u64, AtomicU64>>::default();
        registry.register(
            "storage_table_file_bytes",
            "Bytes of RocksDB table files on disk, per column family of the state machine",
            table_file_bytes.clone(),
        );
        let follower_lag = Family::<FollowerLabel, Gauge<u64, AtomicU64>>::default();
        registry.register(
            "raft_follower_lag_entries",
            "On the leader: log entries each follower has yet to confirm",
            follower_lag.clone(),
        );
        let follower_reachable = Family::<FollowerLabel, Gauge>::default();
        registry.register(
            "raft_follower_reachable",
            "On the leader: 1 for each follower that answered it within an election timeout, else 0 (a membership \
             change needs a majority of the voters answering)",
            follower_reachable.clone(),
        );
        let read_pages_bytes = Gauge::<u64, AtomicU64>::default();
        registry.register(
            "read_pages_bytes",
            "Bytes of message pages read from storage and not yet sent (subscriptions, GET messages), bounded per node",
            read_pages_bytes.clone(),
        );
        let request_bodies_bytes = Gauge::<u64, AtomicU64>::default();
        registry.register(
            "request_bodies_bytes",
            "Bytes of request bodies and publishing WebSocket frames held until answered, bounded per node and per client",
            request_bodies_bytes.clone(),
        );
        let raft_inbound_bytes = Gauge::<u64, AtomicU64>::default();
        registry.register(
            "raft_inbound_bytes",
            "Bytes of Raft requests received from peers and not yet answered, bounded per node",
            raft_inbound_bytes.clone(),
        );
        Self {
            registry,
            publishes,
            commit_latency,
            leader_changes,
            subscribers,
            publishing_connections,
            delivered,
            acks_refused,
            acks_dropped,
            raft_term,
            commit_index,
            last_applied,
            is_leader,
            clock_offset,
            topic_sequence,
            log_io,
            last_log_index,
            log_entries,
            snapshot_index,
            log_bytes,
            data_dir_available_bytes,
            data_dir_min_free_bytes,
            follower_lag,
            follower_reachable,
            table_file_bytes,
            read_pages_bytes,
            request_bodies_bytes,
            raft_inbound_bytes,
            turns: Arc::new(tokio::sync::Semaphore::new(1)),
        }
    }
}

impl Metrics {
    pub fn observe_commit(&self, elapsed: Duration) {
        self.commit_latency.observe(elapsed.as_secs_f64());
    }

    /// What the log store calls after each fsync of its appends.
    pub fn fsync_observer(&self) -> Arc<dyn FsyncObserver> {
        Arc::new(self.log_io.clone())
    }

    pub fn count_publish(&self, outcome: Outcome, n: u64) {
        self.publishes[outcome as usize].inc_by(n);
    }

    /// Waits for this scrape's turn to render; the turn lasts until the permit is dropped.
    pub async fn render_turn(&self) -> tokio::sync::OwnedSemaphorePermit {
        // Never closed.
        self.turns.clone().acquire_owned().await.expect("the render turns are never closed")
    }

    /// The most bytes [`Metrics::render`] can produce with `topics` active topics: the body is
    /// reserved in the metrics budget before it is built.
    pub const fn rendered_bytes_max(topics: usize) -> usize {
        METRICS_FIXED_BYTES_MAX + topics * METRICS_TOPIC_LINE_BYTES_MAX
    }

    /// The text exposition, with state gauges refreshed from `app`.
    /// Blocking: with many topics it takes milliseconds. `_turn`, from [`Metrics::render_turn`],
    /// makes it one render at a time.
    pub fn render(&self, app: &App, _turn: &tokio::sync::OwnedSemaphorePermit) -> String {
        {
            let m = app.raft.metrics();
            let m = m.borrow();
            self.raft_term.set(m.current_term);
            self.last_applied.set(m.last_applied.map(|l| l.index).unwrap_or(0));
            self.is_leader.set(i64::from(app.leadership_in(&m) == crate::app::Leadership::Me));
            self.clock_offset.set(app.clock.offset_ms());
            let last = m.last_log_index.unwrap_or(0);
            self.last_log_index.set(last);
            // Entries after the last purged one; with none purged, from index 0.
            let first = m.purged.map_or(0, |purged| purged.index + 1);
            self.log_entries.set(m.last_log_index.map_or(0, |last| (last + 1).saturating_sub(first)));
            self.snapshot_index.set(m.snapshot.map_or(0, |snapshot| snapshot.index));
            for (id, matched) in m.replication.iter().flatten().filter(|(id, _)| **id != app.id()) {
                let lag = last.saturating_sub(matched.map_or(0, |l| l.index));
                let follower = FollowerLabel { follower: id.to_string() };
                self.follower_lag.get_or_create(&follower).set(lag);
                self.follower_reachable.get_or_create(&follower).set(i64::from(app.answers(*id)));
            }
        }
        self.commit_index.set(app.commit_index(self.last_applied.get()));
        self.log_bytes.set(app.log_files.bytes());
        if let Some(bytes) = raft_store::available_bytes(&app.config.data_dir) {
            self.data_dir_available_bytes.set(bytes);
        }
        self.data_dir_min_free_bytes.set(app.disk_room.reserve());
        // Renders take turns, so nothing else moves the counter between its read and this.
        self.acks_dropped.inc_by(app.acks.dropped().saturating_sub(self.acks_dropped.get()));
        self.subscribers.set(app.subscription_count() as i64);
        let places_free = app.publishing_connections.available_permits();
        self.publishing_connections.set(PUBLISH_WS_CONNECTIONS_MAX.saturating_sub(places_free) as i64);
        self.read_pages_bytes.set(app.read_pages.held() as u64);
        self.request_bodies_bytes.set(app.request_bodies.held() as u64);
        self.raft_inbound_bytes.set(app.raft_inbound.held() as u64);
        for (topic, sequence) in app.reader.active_topic_sequences() {
            self.topic_sequence.get_or_create(&TopicLabel { topic }).set(sequence);
        }
        for (column_family, bytes) in app.reader.table_file_bytes() {
            self.table_file_bytes.get_or_create(&ColumnFamilyLabel { column_family: column_family.into() }).set(bytes);
        }
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        // Filled afresh by the next render (deleted topics and gone followers drop out), and
        // not held in between: with 100,000 topics that is megabytes.
        self.topic_sequence.clear();
        self.follower_lag.clear();
        self.follower_reachable.clear();
        out
    }
}

#[cfg(test)]
mod tests {
    use raft_store::available_bytes;

    #[test]
    fn the_data_dirs_file_system_says_how_much_room_is_left() {
        let dir = tempfile::tempdir().unwrap();
        assert!(available_bytes(dir.path()).is_some_and(|bytes| bytes > 0));
        assert_eq!(available_bytes(&dir.path().join("missing")), None);
    }
}
