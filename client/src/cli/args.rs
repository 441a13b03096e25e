//! The command line, as clap derive types.

use std::path::PathBuf;

use clap::{ArgGroup, Args as ClapArgs, Parser, Subcommand, ValueEnum};
use serde_json::Value;

use crate::bench::{PayloadContent, Transport};
use crate::endpoint::Cursor;
use crate::types::AckMode;

/// Talk to a pub/sub cluster: topics, publish, subscribe, benchmark.
///
/// Exit codes: 0 ok, 1 the server refused (its error code is printed), 2 usage (or an input
/// line that cannot be read), 3 cluster unreachable or without a leader after retries.
#[derive(Debug, Parser)]
#[command(name = "pubsub", version, max_term_width = 100)]
pub struct Args {
    /// A node of the cluster; repeat it for several (or PUBSUB_SERVER=a,b,c).
    #[arg(
        long = "server",
        short = 's',
        global = true,
        env = "PUBSUB_SERVER",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:8080",
        value_name = "URL"
    )]
    pub servers: Vec<String>,

    /// Machine output: one JSON object per line.
    #[arg(long, global = true)]
    pub json: bool,

    /// Timeout of one HTTP attempt, in milliseconds. The budget of a whole request across its
    /// attempts (30 s by default) grows to at least this.
    #[arg(long, global = true, value_name = "MS")]
    pub timeout_ms: Option<u64>,

    /// Attempts one request may make before giving up (first included; default 10, which
    /// rides out a few seconds of leader election). 1 fails at the first error.
    #[arg(
        long,
        global = true,
        env = "PUBSUB_ATTEMPTS",
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..=1000)
    )]
    pub attempts: Option<u32>,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show the cluster (nodes, leader, term, commit index), or add and remove members.
    Cluster(ClusterArgs),
    /// Create, list, inspect and delete topics.
    #[command(subcommand)]
    Topics(TopicsCommand),
    /// Publish one message, one per stdin line (`-`), or a file in batches (`--batch`).
    Publish(PublishArgs),
    /// Print a topic's messages as they arrive (full messages).
    Subscribe(SubscribeArgs),
    /// Follow a topic from now on, printing payloads only.
    Tail(TailArgs),
    /// Read stored messages after a cursor (one request; no subscription).
    Read(ReadArgs),
    /// Run a publish (and optional fan-out) load and report throughput and latency.
    Bench(BenchArgs),
}

/// `pubsub cluster [add|remove]`
#[derive(Debug, ClapArgs)]
pub struct ClusterArgs {
    /// Without one, show the cluster.
    #[command(subcommand)]
    pub command: Option<ClusterCommand>,
}

/// `pubsub cluster add|remove …`
#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Add a node, started with --join: a learner until it holds the log, then a voter.
    Add {
        /// The new node's id (N or node-N).
        id: String,
        /// Where the other nodes reach it: its --advertise HOST:PORT.
        address: String,
        /// The cluster's --cluster-secret, when it has one.
        #[arg(long, env = "PUBSUB_CLUSTER_SECRET", hide_env_values = true)]
        cluster_secret: Option<String>,
    },
    /// Remove a node (voter or learner); stop it afterwards.
    Remove {
        /// The node's id (N or node-N).
        id: String,
        /// The cluster's --cluster-secret, when it has one.
        #[arg(long, env = "PUBSUB_CLUSTER_SECRET", hide_env_values = true)]
        cluster_secret: Option<String>,
    },
}

/// `pubsub topics …`
#[derive(Debug, Subcommand)]
pub enum TopicsCommand {
    /// Create a topic (succeeds when it already exists).
    Create {
        /// Topic name: [A-Za-z0-9._-], 1-255 characters.
        name: String,
        /// Metadata JSON stored with the topic, e.g. '{"retention_hours":24}'.
        #[arg(long, value_parser = parse_json_object)]
        metadata: Option<Value>,
    },
    /// List active topics.
    List,
    /// Show a topic's counters and metadata.
    Get {
        /// Topic name.
        name: String,
    },
    /// Delete a topic.
    Delete {
        /// Topic name.
        name: String,
    },
    /// List a topic's subscribers with their acked sequence and lag.
    Subscribers {
        /// Topic name.
        name: String,
    },
    /// Forget a subscriber's recorded cursor: `--cursor acked` starts it from 0 again.
    ForgetSubscriber {
        /// Topic name.
        name: String,
        /// The subscriber id whose cursor to forget.
        subscriber_id: String,
    },
}

/// `pubsub publish …`
#[derive(Debug, ClapArgs)]
#[command(
    group(ArgGroup::new("input").required(true).args(["payload", "batch"])),
    override_usage = "pubsub publish [OPTIONS] <TOPIC> <JSON | - | --batch FILE>"
)]
pub struct PublishArgs {
    /// Topic name.
    pub topic: String,
    /// The payload as JSON (text that is not JSON is sent as a JSON string, unless it starts
    /// with `{`: then it is refused), or `-` to publish each stdin line as one message.
    pub payload: Option<String>,
    /// Message id for deduplication (default: a generated UUID).
    #[arg(long, conflicts_with = "batch")]
    pub id: Option<String>,
    /// Publish every line of FILE (`-` for stdin) as a message, in batches of up to 1000 lines
    /// (fewer when the lines are large: at most 8 MiB of them).
    #[arg(long, value_name = "FILE")]
    pub batch: Option<PathBuf>,
    /// With `-` or --batch: give each line the id PREFIX<line number> (from 1), so that running
    /// the same command again (after a failure, say) stores each line once. Without it they
    /// choose a prefix (a UUID) and name it when a publish fails.
    #[arg(long, value_name = "PREFIX", conflicts_with = "id")]
    pub id_prefix: Option<String>,
    /// When the server answers: after commit, or once the leader appended (single
    /// publishes only: a batch is always answered after commit).
    #[arg(long, value_enum, default_value_t = AckArg::Committed, conflicts_with = "batch")]
    pub ack: AckArg,
}

/// `--ack` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AckArg {
    /// After a majority stored it (the default).
    Committed,
    /// Once the leader accepted it; faster, may be lost if the leader crashes.
    Appended,
}

impl From<AckArg> for AckMode {
    fn from(ack: AckArg) -> AckMode {
        match ack {
            AckArg::Committed => AckMode::Committed,
            AckArg::Appended => AckMode::Appended,
        }
    }
}

/// `pubsub subscribe …`
#[derive(Debug, ClapArgs)]
pub struct SubscribeArgs {
    /// Topic name.
    pub topic: String,
    /// Where to start: a sequence N (deliver after N; 0 = all), `latest` or `acked`.
    #[arg(long, default_value = "latest", value_parser = parse_cursor)]
    pub cursor: Cursor,
    /// Subscriber id (default: a generated one). Acks are recorded under it; required with
    /// `--cursor acked` (a generated id has no acks, so it would start from the beginning).
    #[arg(long, required_if_eq("cursor", "acked"))]
    pub subscriber_id: Option<String>,
    /// Ack each message after printing it. Needs `--subscriber-id`: acks under a generated
    /// id could never be resumed from, and each run would keep one more of the topic's
    /// recorded cursors (10,000 at most) for good.
    #[arg(long, requires = "subscriber_id")]
    pub ack: bool,
    /// Exit after this many messages (exit 1 when the topic is deleted before they came).
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
}

/// `pubsub tail …`
#[derive(Debug, ClapArgs)]
pub struct TailArgs {
    /// Topic name.
    pub topic: String,
    /// Subscriber id (default: a generated one).
    #[arg(long)]
    pub subscriber_id: Option<String>,
    /// Exit after this many messages (exit 1 when the topic is deleted before they came).
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
}

/// `pubsub read …`
#[derive(Debug, ClapArgs)]
pub struct ReadArgs {
    /// Topic name.
    pub topic: String,
    /// Return messages with a sequence above this.
    #[arg(long, default_value_t = 0)]
    pub after: u64,
    /// At most this many.
    #[arg(long)]
    pub limit: Option<u32>,
    /// Wait up to this long for a message when none is there yet.
    #[arg(long, value_name = "MS")]
    pub wait_ms: Option<u64>,
}

/// `pubsub bench …`
#[derive(Debug, ClapArgs)]
pub struct BenchArgs {
    /// Concurrent publishers.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub publishers: u32,
    /// Requests (ws: publishes) in flight per publisher.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub inflight: u32,
    /// Messages to publish in total.
    #[arg(long, default_value_t = 10_000)]
    pub messages: u64,
    /// Payload size in bytes (compact JSON).
    #[arg(long, default_value_t = 256)]
    pub payload_bytes: usize,
    /// What fills the payloads: text compresses about as JSON events do; random does not;
    /// repeat (one byte over and over) to nothing.
    #[arg(long, value_enum, default_value_t = PayloadContent::Text)]
    pub payload_content: PayloadContent,
    /// Messages per request (1 = single publishes; up to 1000 via the batch endpoint).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub batch: u32,
    /// WebSocket subscribers measuring publish→deliver latency.
    #[arg(long, default_value_t = 0)]
    pub subscribers: u32,
    /// Topic (default: a new `bench-…` topic).
    #[arg(long)]
    pub topic: Option<String>,
    /// Stop publishing after this many seconds.
    #[arg(long)]
    pub duration_secs: Option<u64>,
    /// Ack mode of single HTTP publishes.
    #[arg(long, value_enum, default_value_t = AckArg::Committed)]
    pub ack: AckArg,
    /// How publishers send.
    #[arg(long, value_enum, default_value_t = TransportArg::Http)]
    pub transport: TransportArg,
    /// Total messages per second of all publishers, evenly spaced (default: unpaced).
    #[arg(long, value_name = "MSGS_PER_SEC", value_parser = parse_rate)]
    pub rate: Option<f64>,
    /// Seconds subscribers may take after the last ack to receive everything.
    #[arg(long, default_value_t = 10)]
    pub drain_secs: u64,
}

/// `--transport` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TransportArg {
    /// One HTTP request per publish (or per batch).
    Http,
    /// One WebSocket per publisher with --inflight publishes on it (--batch 1 only).
    Ws,
}

impl From<TransportArg> for Transport {
    fn from(transport: TransportArg) -> Transport {
        match transport {
            TransportArg::Http => Transport::Http,
            TransportArg::Ws => Transport::Ws,
        }
    }
}

/// `latest` | `acked` | a sequence number.
pub fn parse_cursor(s: &str) -> Result<Cursor, String> {
    match s {
        "latest" => Ok(Cursor::Latest),
        "acked" => Ok(Cursor::Acked),
        n => n
            .parse::<u64>()
            .map(Cursor::After)
            .map_err(|_| format!("expected a sequence number, `latest` or `acked`, not {n:?}")),
    }
}

/// A rate in messages per second: a finite number above 0.
pub fn parse_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate > 0.0 => Ok(rate),
        _ => Err(format!("expected messages per second above 0, not {s:?}")),
    }
}

fn parse_json_object(s: &str) -> Result<Value, String> {
    let value: Value = serde_json::from_str(s).map_err(|e| format!("not JSON: {e}"))?;
    if value.is_object() {
        Ok(value)
    } else {
        Err("metadata must be a JSON object".to_string())
    }
}

/// A payload from the command line or a line of input: JSON when it parses, else the text
/// as a JSON string. Text that starts like a JSON object (`{`) but does not parse is refused:
/// it is almost always JSON the shell took the quotes out of (`{"a":1}` unquoted arrives as
/// `{a:1}`), and stored as a string it would fail its consumers later. (`[` and `"` start
/// too many log lines, `[INFO] ...`, to be refused.)
pub fn payload_from_text(text: &str) -> Result<Value, String> {
    match serde_json::from_str(text) {
        Ok(value) => Ok(value),
        Err(e) if text.trim_start().starts_with('{') => Err(format!(
            "it starts like JSON but is not JSON ({e}); quote it for the shell, as in '{{\"a\":1}}', \
             or give text as a JSON string"
        )),
        Err(_) => Ok(Value::String(text.to_string())),
    }
}
