//! [`Client`]: leader discovery and caching, redirects, retries with the same message id,
//! and one method per HTTP endpoint of API.md.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::Method;
use serde_json::Value;
use url::Url;

use crate::endpoint;
use crate::error::{Error, ErrorCode};
use crate::limits;
use crate::retry::RetryPolicy;
use crate::types::{
    AckMode, BatchAck, BatchItem, ClusterInfo, CreateTopicAck, DeleteTopicAck, ForgottenCursor, Membership,
    MessagePage, NewMessage, PublishAck, RawBatchAck, SubscriberInfo, SubscriberList, TopicInfo, TopicList,
    TopicSummary,
};

/// Everything a [`Client`] can be tuned with. Build it with [`ClientBuilder`], or start from
/// [`ClientConfig::new`] and change fields.
///
/// ```
/// use pubsub_client::{Client, ClientConfig};
/// use std::time::Duration;
///
/// let mut config = ClientConfig::new(["127.0.0.1:8081"]);
/// config.retry.attempts_max = 3;
/// config.subscribe_idle_timeout = Duration::from_secs(60);
/// let client = Client::with_config(config)?;
/// assert_eq!(client.config().retry.attempts_max, 3);
/// # Ok::<(), pubsub_client::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Addresses to start from (`host:port` or `http://host:port`). The client also uses the
    /// `peers` of the latest `/cluster` answer it got; the seeds are always kept.
    pub seeds: Vec<String>,
    /// Time to open a TCP connection to one node.
    pub connect_timeout: Duration,
    /// Time one HTTP attempt may take (a long-poll read adds its `wait` to it).
    pub request_timeout: Duration,
    /// How HTTP operations retry.
    pub retry: RetryPolicy,
    /// Consecutive failed reconnects after which a subscription ends with an error.
    pub reconnect_attempts_max: u32,
    /// Interval of pings on an idle subscription.
    pub subscribe_ping_interval: Duration,
    /// Silence after which a subscription's connection is taken as dead and replaced.
    pub subscribe_idle_timeout: Duration,
}

impl ClientConfig {
    /// The defaults of [`crate::limits`] with these seeds.
    pub fn new<I, S>(seeds: I) -> ClientConfig
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ClientConfig {
            seeds: seeds.into_iter().map(Into::into).collect(),
            connect_timeout: limits::CONNECT_TIMEOUT_DEFAULT,
            request_timeout: limits::REQUEST_TIMEOUT_DEFAULT,
            retry: RetryPolicy::default(),
            reconnect_attempts_max: limits::RECONNECT_ATTEMPTS_MAX_DEFAULT,
            subscribe_ping_interval: limits::SUBSCRIBE_PING_INTERVAL_DEFAULT,
            subscribe_idle_timeout: limits::SUBSCRIBE_IDLE_TIMEOUT_DEFAULT,
        }
    }
}

/// Builds a [`Client`] with non-default timeouts or retry budget.
///
/// ```
/// use pubsub_client::Client;
/// use std::time::Duration;
///
/// let client = Client::builder(["127.0.0.1:8081", "127.0.0.1:8082"])
///     .request_timeout(Duration::from_secs(8))
///     .attempts_max(20)
///     .backoff(Duration::from_millis(20), Duration::from_secs(1))
///     .build()?;
/// assert_eq!(client.nodes().len(), 2);
/// # Ok::<(), pubsub_client::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    /// The configuration being built.
    config: ClientConfig,
}

impl ClientBuilder {
    /// Time to open a TCP connection to one node.
    pub fn connect_timeout(mut self, timeout: Duration) -> ClientBuilder {
        self.config.connect_timeout = timeout;
        self
    }

    /// Time one HTTP attempt may take.
    pub fn request_timeout(mut self, timeout: Duration) -> ClientBuilder {
        self.config.request_timeout = timeout;
        self
    }

    /// Attempts one operation may make, the first included.
    pub fn attempts_max(mut self, attempts: u32) -> ClientBuilder {
        self.config.retry.attempts_max = attempts.max(1);
        self
    }

    /// Wall-clock budget of one operation across all its attempts.
    pub fn operation_timeout(mut self, timeout: Duration) -> ClientBuilder {
        self.config.retry.operation_timeout = timeout;
        self
    }

    /// First and largest backoff step between attempts.
    pub fn backoff(mut self, initial: Duration, max: Duration) -> ClientBuilder {
        self.config.retry.backoff_initial = initial;
        self.config.retry.backoff_max = max.max(initial);
        self
    }

    /// Consecutive failed reconnects after which a subscription ends with an error.
    pub fn reconnect_attempts_max(mut self, attempts: u32) -> ClientBuilder {
        self.config.reconnect_attempts_max = attempts.max(1);
        self
    }

    /// Ping interval and idle timeout of subscriptions.
    pub fn subscribe_keepalive(mut self, ping: Duration, idle_timeout: Duration) -> ClientBuilder {
        self.config.subscribe_ping_interval = ping;
        self.config.subscribe_idle_timeout = idle_timeout;
        self
    }

    /// Builds the client. Fails when a seed is not a usable address or none was given.
    pub fn build(self) -> Result<Client, Error> {
        Client::with_config(self.config)
    }
}

/// A handle on a cluster. Cheap to clone; clones share the leader cache and the HTTP
/// connection pool.
///
/// Writes go to the leader: the client asks `GET /cluster` on any node which one it is,
/// caches it, follows `307` answers (updating the cache), and retries `503 no_leader`,
/// `504 raft_timeout`, `500 not_committed` and connection errors with exponential backoff
/// and jitter. A publish carries the same message id on every attempt, so a retry can never
/// publish twice. Reads go to the cached leader when there is one (freshest), else to one
/// node while it answers (another may be behind it: a cursor from its pages may be past that
/// one's end). A read refused as a node behind the others may refuse it (`404
/// topic_not_found`, `400 invalid_cursor`) goes to the next node at once; the refusal is the
/// answer only when every node gave it or could not be reached.
///
/// ```no_run
/// use pubsub_client::Client;
/// use serde_json::json;
///
/// # async fn run() -> Result<(), pubsub_client::Error> {
/// let client = Client::new(["127.0.0.1:8081", "127.0.0.1:8082", "127.0.0.1:8083"])?;
/// client.create_topic("orders", None).await?;
/// let ack = client.publish("orders", json!({"order_id": "ORD-456"})).await?;
/// println!("published as #{:?}", ack.sequence);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Client {
    /// Shared by all clones and by subscription tasks.
    inner: Arc<Inner>,
}

/// The body of a batch publish, serialized straight from the caller's messages: `json!`
/// would first copy every payload into a new tree, hashing its keys (about 40 % of the load
/// generator's CPU in a batch-1000 run: 0.79–0.91 s before, 0.46–0.51 s after).
#[derive(serde::Serialize)]
struct BatchBody<'a> {
    messages: &'a [NewMessage],
}

#[derive(Debug)]
struct Inner {
    /// One pool of keep-alive connections for every node.
    http: http::Http,
    /// Timeouts and retry budget.
    config: ClientConfig,
    /// Known nodes and the cached leader. A plain mutex: never held across an await.
    nodes: Mutex<Nodes>,
}

/// What the client knows about the cluster's nodes.
#[derive(Debug)]
struct Nodes {
    /// The seeds, as node base URLs, without duplicates; always at the start of `known`.
    seeds: Vec<Url>,
    /// The seeds, then the peers and leader of the latest `/cluster` answer and any leader
    /// named since, as node base URLs, without duplicates.
    known: Vec<Url>,
    /// The leader last named by the cluster; `None` until discovered or after it failed.
    leader: Option<Url>,
    /// Round-robin position in `known` for reads, discovery and reconnects.
    next: usize,
}

/// Options of [`Client::read_messages`].
///
/// ```
/// use pubsub_client::ReadOptions;
/// use std::time::Duration;
///
/// let opts = ReadOptions::after(41).limit(100).wait(Duration::from_secs(5));
/// assert_eq!(opts.after, 41);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadOptions {
    /// Return messages with `sequence > after`.
    pub after: u64,
    /// At most this many (the server's default when `None`).
    pub limit: Option<u32>,
    /// Long-poll: wait up to this long for a message when none is there yet.
    pub wait: Option<Duration>,
}

impl ReadOptions {
    /// Messages after this cursor.
    pub fn after(cursor: u64) -> ReadOptions {
        ReadOptions { after: cursor, ..ReadOptions::default() }
    }

    /// At most this many messages.
    pub fn limit(mut self, limit: u32) -> ReadOptions {
        self.limit = Some(limit);
        self
    }

    /// Long-poll for up to this long.
    pub fn wait(mut self, wait: Duration) -> ReadOptions {
        self.wait = Some(wait);
        self
    }
}

impl Client {
    /// A client with default timeouts and retry budget. Nothing is contacted until the
    /// first call.
    ///
    /// ```
    /// use pubsub_client::Client;
    ///
    /// let client = Client::new(["127.0.0.1:8080"])?;
    /// assert_eq!(client.nodes(), vec!["http://127.0.0.1:8080/".to_string()]);
    /// # Ok::<(), pubsub_client::Error>(())
    /// ```
    pub fn new<I, S>(seeds: I) -> Result<Client, Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Client::with_config(ClientConfig::new(seeds))
    }

    /// A [`ClientBuilder`] starting from these seeds and the default settings.
    pub fn builder<I, S>(seeds: I) -> ClientBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ClientBuilder { config: ClientConfig::new(seeds) }
    }

    /// A client with this configuration.
    pub fn with_config(config: ClientConfig) -> Result<Client, Error> {
        let mut seeds: Vec<Url> = Vec::new();
        for seed in &config.seeds {
            let url = endpoint::parse_base(seed)?;
            if !seeds.contains(&url) {
                seeds.push(url);
            }
        }
        if seeds.is_empty() {
            return Err(Error::InvalidArgument("no server address given".into()));
        }
        if config.subscribe_ping_interval.is_zero() {
            return Err(Error::InvalidArgument("the subscription ping interval must be above zero".into()));
        }
        let http = http::Http::new(config.connect_timeout);
        Ok(Client {
            inner: Arc::new(Inner {
                http,
                config,
                nodes: Mutex::new(Nodes { known: seeds.clone(), seeds, leader: None, next: 0 }),
            }),
        })
    }

    /// The configuration in force.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// Base URLs of every node the client knows (seeds and learned peers).
    pub fn nodes(&self) -> Vec<String> {
        self.lock_nodes().known.iter().map(|u| u.to_string()).collect()
    }

    /// Base URL of the cached leader, if any.
    pub fn cached_leader(&self) -> Option<String> {
        self.lock_nodes().leader.as_ref().map(|u| u.to_string())
    }

    // ----- the endpoints -------------------------------------------------------------

    /// `GET /cluster` on any node (the cached leader first). Updates the leader cache and
    /// learns the peers.
    ///
    /// ```no_run
    /// # async fn run(client: pubsub_client::Client) -> Result<(), pubsub_client::Error> {
    /// let info = client.cluster().await?;
    /// println!("leader: {:?}, term {}", info.leader_address, info.raft_term);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn cluster(&self) -> Result<ClusterInfo, Error> {
        self.get_cluster(false).await
    }

    /// (ext) [`Client::cluster`] asked of the leader, as far as this client knows it (from an
    /// earlier answer): only the leader's `members` carry each member's replication
    /// (`reachable`, `matched_index`, `lag`). Check `role`: with no leader known, or a leader
    /// that moved, another node answers.
    pub async fn cluster_from_leader(&self) -> Result<ClusterInfo, Error> {
        self.get_cluster(true).await
    }

    /// `GET /cluster` of any node, or of the leader this client knows; the answer teaches it
    /// the leader.
    async fn get_cluster(&self, to_leader: bool) -> Result<ClusterInfo, Error> {
        let reply = self.execute(&Call::new(Method::GET, &["cluster"], to_leader)).await?;
        let info: ClusterInfo = reply.parse()?;
        self.learn(&info);
        Ok(info)
    }

    /// (ext) Adds node `id`, reached by peers at `address` (its `--advertise`), to the
    /// cluster: as a learner until it holds the leader's log, then as a voter. Start the node
    /// first, with `--join`. Idempotent: a voter already at that address answers
    /// `changed: false`. `cluster_secret` is the cluster's `--cluster-secret`, when it has one.
    pub async fn add_member(&self, id: u64, address: &str, cluster_secret: Option<&str>) -> Result<Membership, Error> {
        let mut call = Call::new(Method::POST, &["cluster", "members"], true)
            .json_body(&serde_json::json!({"id": id, "address": address}))?;
        call.secret = cluster_secret.map(str::to_string);
        // The node waits for the learner to catch up before answering.
        call.extra_timeout = limits::MEMBER_CHANGE_WAIT;
        self.execute(&call).await?.parse()
    }

    /// (ext) Removes node `id` from the cluster (a voter or a learner). A leader removing
    /// itself steps down once the change has committed.
    pub async fn remove_member(&self, id: u64, cluster_secret: Option<&str>) -> Result<Membership, Error> {
        let mut call = Call::new(Method::DELETE, &["cluster", "members", &id.to_string()], true);
        call.secret = cluster_secret.map(str::to_string);
        call.extra_timeout = limits::MEMBER_CHANGE_WAIT;
        match self.execute(&call).await?.parse() {
            // An earlier attempt whose answer was lost (or that timed out) removed it.
            Err(Error::Indeterminate { source, .. }) if source.api().is_some_and(|e| e.code == ErrorCode::NotFound) => {
                let info = self.cluster().await?;
                let joint = info.membership_joint;
                Ok(Membership { members: info.members, joint, changed: true, raft_index: info.commit_index })
            }
            other => other,
        }
    }

    /// Creates a topic; idempotent (`created: false` when it existed). `metadata` is stored as
    /// given; `retention_hours`, `retention_messages` and `retention_bytes` in it set
    /// retention.
    ///
    /// ```no_run
    /// # async fn run(client: pubsub_client::Client) -> Result<(), pubsub_client::Error> {
    /// use serde_json::json;
    /// let ack = client.create_topic("orders", Some(json!({"retention_hours": 24}))).await?;
    /// assert_eq!(ack.topic, "orders");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn create_topic(&self, name: &str, metadata: Option<Value>) -> Result<CreateTopicAck, Error> {
        let body = match metadata {
            Some(m) => serde_json::json!({ "metadata": m }),
            None => serde_json::json!({}),
        };
        let call = Call::new(Method::POST, &["topics", name], true).json_body(&body)?;
        self.execute(&call).await?.parse()
    }

    /// Active topics.
    ///
    /// ```no_run
    /// # async fn run(client: pubsub_client::Client) -> Result<(), pubsub_client::Error> {
    /// for topic in client.list_topics().await? {
    ///     println!("{}: {} messages", topic.name, topic.message_count);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn list_topics(&self) -> Result<Vec<TopicSummary>, Error> {
        let list: TopicList = self.execute(&Call::new(Method::GET, &["topics"], false)).await?.parse()?;
        Ok(list.topics)
    }

    /// One topic's counters and metadata; `404 topic_not_found` when it does not exist.
    ///
    /// ```no_run
    /// # async fn run(client: pubsub_client::Client) -> Result<(), pubsub_client::Error> {
    /// use pubsub_client::{Error, ErrorCode};
    /// match client.get_topic("orders").await {
    ///     Ok(info) => println!("last sequence {}", info.current_sequence),
    ///     Err(Error::Api(e)) if e.code == ErrorCode::TopicNotFound => println!("no such topic"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn get_topic(&self, name: &str) -> Result<TopicInfo, Error> {
        self.execute(&Call::new(Method::GET, &["topics", name], false)).await?.parse()
    }

    /// Deletes a topic. When an earlier attempt of this same call may have deleted it and a
    /// retry then finds it missing, that is reported as success with `raft_index: None`.
    ///
    /// ```no_run
    /// # async fn run(client: pubsub_client::Client) -> Result<(), pubsub_client::Error> {
    /// let ack = client.delete_topic("orders").await?;
    /// assert!(ack.deleted);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn delete_topic(&self, name: &str) -> Result<DeleteTopicAck, Error> {
        let reply = self.execute(&Call::new(Method::DELETE, &["topics", name], true)).await?;
        if reply.status == 404 && reply.maybe_applied {
            let err = reply.api_error();
            if err.code == ErrorCode::TopicNotFound {
                return Ok(DeleteTopicAck { topic: name.to_string(), deleted: true, raft_index: None });
            }
        }
        reply.parse()
    }

    /// Publishes one payload with a generated id, waiting for commit.
    ///
    /// ```no_run
    /// # async fn run(client: pubsub_client::Client) -> Result<(), pubsub_client::Error> {
    /// use serde_json::json;
    /// let ack = client.publish("orders", json!({"status": "shipped"})).await?;
    /// println!("{} is #{:?}", ack.id, ack.sequence);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn publish(&self, topic: &str, payload: Value) -> Result<PublishAck, Error> {
        self.publish_message(topic, NewMessage::new(payload), AckMode::Committed).await
    }

    /// Publishes one message with the given id (generated when `None`) and ack mode.
    ///
    /// Every attempt carries the same id, so a retry never publishes twice. How a
    /// `409 duplicate_message_id` is read:
    ///
    /// - with `existing_sequence: null`, a publish of this id is still in flight on the leader
    ///   and may yet fail. That is not a success: the call keeps retrying (same id, backoff)
    ///   until it gets a `201`, or a `409` with a sequence, or its retry budget runs out (then
    ///   it returns that `409` as [`Error::Api`]);
    /// - with a sequence, after an earlier attempt of this call may have reached the server
    ///   (a lost connection, `504 raft_timeout`, `500 not_committed`): that attempt got
    ///   through, and the answer is success with `duplicate: true` and that sequence;
    /// - with a sequence when no earlier attempt can have taken effect: the id was used
    ///   before, by someone else or an earlier call, and it is an error.
    ///
    /// ```no_run
    /// # async fn run(client: pubsub_client::Client) -> Result<(), pubsub_client::Error> {
    /// use pubsub_client::{AckMode, NewMessage};
    /// use serde_json::json;
    /// let msg = NewMessage::new(json!({"n": 1})).with_id("order-1");
    /// let ack = client.publish_message("orders", msg, AckMode::Appended).await?;
    /// assert!(!ack.committed || ack.sequence.is_some());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn publish_message(
        &self,
        topic: &str,
        mut message: NewMessage,
        ack: AckMode,
    ) -> Result<PublishAck, Error> {
        let id = ensure_id(&mut message)?;
        let mut call = Call::new(Method::POST, &["topics", topic, "messages"], true).json_body(&message)?;
        if ack == AckMode::Appended {
            call.query.push(("ack", ack.as_str().to_string()));
        }
        // A `409` whose `existing_sequence` is null never comes back from `execute`: it is
        // retried until the first publish resolves (see `retry::classify`).
        // Name the id, generated here when the caller gave none: only with it can the caller
        // publish again without storing the message twice.
        let reply = self.execute(&call).await.map_err(|error| error.naming_message(&id))?;
        if reply.status == 409 && reply.maybe_applied {
            let err = reply.api_error();
            if let (ErrorCode::DuplicateMessageId, Some(sequence)) = (&err.code, err.existing_sequence()) {
                return Ok(PublishAck::already_stored(id, topic, sequence));
            }
        }
        reply.parse().map_err(|error| error.naming_message(&id))
    }

    /// Publishes 1–1000 messages as one Raft entry. Messages without an id get a generated
    /// one before the first attempt, so a retried batch is deduplicated message by message.
    /// When it fails with [`Error::Indeterminate`] (the batch may have been stored), the
    /// error's `ids` names every message's id in order, the generated ones included: publish
    /// the messages again under them to store each once.
    ///
    /// ```no_run
    /// # async fn run(client: pubsub_client::Client) -> Result<(), pubsub_client::Error> {
    /// use pubsub_client::NewMessage;
    /// use serde_json::json;
    /// let batch = (0..100).map(|n| NewMessage::new(json!({"n": n}))).collect();
    /// let ack = client.publish_batch("orders", batch).await?;
    /// assert_eq!(ack.results.len(), 100);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn publish_batch(&self, topic: &str, mut messages: Vec<NewMessage>) -> Result<BatchAck, Error> {
        if messages.is_empty() || messages.len() > limits::BATCH_MESSAGES_MAX {
            return Err(Error::InvalidArgument(format!(
                "a batch holds 1 to {} messages, not {}",
                limits::BATCH_MESSAGES_MAX,
                messages.len()
            )));
        }
        for message in &mut messages {
            ensure_id(message)?;
        }
        let body = BatchBody { messages: &messages };
        let call = Call::new(Method::POST, &["topics", topic, "messages", "batch"], true).json_body(&body)?;
        // Name the ids, generated here where the caller gave none: only with them can the
        // caller publish the batch again without storing a message twice.
        let ids = || messages.iter().filter_map(|m| m.id.clone()).collect();
        let reply = self.execute(&call).await.map_err(|error| error.naming_batch(ids))?;
        let raw: RawBatchAck = reply.parse().map_err(|error| error.naming_batch(ids))?;
        Ok(BatchAck {
            topic: raw.topic,
            results: raw.results.into_iter().map(BatchItem::from).collect(),
            raft_index: raw.raft_index,
            committed: raw.committed,
            retried: reply.maybe_applied,
        })
    }

    /// Reads messages after a cursor from any node, optionally long-polling.
    ///
    /// ```no_run
    /// # async fn run(client: pubsub_client::Client) -> Result<(), pubsub_client::Error> {
    /// use pubsub_client::ReadOptions;
    /// let mut cursor = 0;
    /// loop {
    ///     let page = client.read_messages("orders", ReadOptions::after(cursor).limit(500)).await?;
    ///     if page.messages.is_empty() { break; }
    ///     cursor = page.next_cursor;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn read_messages(&self, topic: &str, options: ReadOptions) -> Result<MessagePage, Error> {
        let mut call = Call::new(Method::GET, &["topics", topic, "messages"], false);
        call.query.push(("after", options.after.to_string()));
        if let Some(limit) = options.limit {
            call.query.push(("limit", limit.to_string()));
        }
        if let Some(wait) = options.wait {
            call.query.push(("wait_ms", wait.as_millis().to_string()));
            call.extra_timeout = wait;
        }
        self.execute(&call).await?.parse()
    }

    /// Subscribers of a topic with their acked sequence and lag.
    ///
    /// ```no_run
    /// # async fn run(client: pubsub_client::Client) -> Result<(), pubsub_client::Error> {
    /// for s in client.subscribers("orders").await? {
    ///     println!("{} acked #{}, {} behind", s.subscriber_id, s.acked_sequence, s.lag);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn subscribers(&self, topic: &str) -> Result<Vec<SubscriberInfo>, Error> {
        let list: SubscriberList =
            self.execute(&Call::new(Method::GET, &["topics", topic, "subscribers"], false)).await?.parse()?;
        Ok(list.subscribers)
    }

    /// Forgets a subscriber's recorded cursor (ext): `cursor=acked` starts it from 0 again,
    /// and it leaves [`Client::subscribers`]. A subscriber still connected records a new one
    /// with its next ack. None recorded: an [`Error::Api`] with code `not_found`.
    ///
    /// ```no_run
    /// # async fn run(client: pubsub_client::Client) -> Result<(), pubsub_client::Error> {
    /// let forgotten = client.forget_subscriber("orders", "billing").await?;
    /// println!("billing had acked #{:?}", forgotten.acked_sequence);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn forget_subscriber(&self, topic: &str, subscriber_id: &str) -> Result<ForgottenCursor, Error> {
        let call = Call::new(Method::DELETE, &["topics", topic, "subscribers", subscriber_id], true);
        let reply = self.execute(&call).await?;
        if reply.status == 404 && reply.maybe_applied && reply.api_error().code == ErrorCode::NotFound {
            return Ok(ForgottenCursor {
                topic: topic.to_string(),
                subscriber_id: subscriber_id.to_string(),
                acked_sequence: None,
                deleted: true,
                raft_index: None,
            });
        }
        reply.parse()
    }
}

/// Gives the message an id if it has none (a time-ordered UUID v7, see [`NewMessage::id`]),
/// checks its length and returns it.
pub(crate) fn ensure_id(message: &mut NewMessage) -> Result<String, Error> {
    let id = message.id.get_or_insert_with(|| uuid::Uuid::now_v7().to_string()).clone();
    if id.is_empty() || id.chars().count() > limits::MESSAGE_ID_CHARS_MAX {
        return Err(Error::InvalidArgument(format!(
            "a message id has 1 to {} characters",
            limits::MESSAGE_ID_CHARS_MAX
        )));
    }
    Ok(id)
}

mod call;
mod http;
mod nodes;
mod pool;

use call::Call;
pub(crate) use call::{retry_or_give_up, Failure};

#[cfg(test)]
mod tests;
