//! [`Subscription`]: a WebSocket subscription that survives node failures.
//!
//! One task per subscription owns the socket. It turns frames into [`Event`]s through a
//! `Tracker` (pure, tested without sockets), sends acks, pings an idle connection, and
//! when the connection drops reconnects to the next known node with
//! `cursor=<last delivered sequence>`. The tracker drops every message at or below the last
//! delivered sequence, so the stream has no duplicate; a jump that no `messages_expired`
//! announced is reported as [`Error::SequenceGap`], so it has no silent gap either.

use std::collections::HashSet;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, Stream, StreamExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio_tungstenite::tungstenite::{self, Message as WsMessage};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use url::Url;

use crate::client::Client;
use crate::endpoint::{subscribe_url, Cursor};
use crate::error::{ApiError, BoxError, Error, ErrorCode};
use crate::limits;
use crate::retry::may_lag_behind;
use crate::types::{ack_frame, ControlFrame, Message, ServerFrame};

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Who subscribes and from where.
///
/// ```
/// use pubsub_client::{Cursor, SubscribeOptions};
///
/// let opts = SubscribeOptions::new("billing").cursor(Cursor::Acked);
/// assert_eq!(opts.cursor, Cursor::Acked);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscribeOptions {
    /// Names the subscriber; acks are recorded per subscriber id (1–256 characters).
    pub subscriber_id: String,
    /// Where the stream starts.
    pub cursor: Cursor,
}

impl SubscribeOptions {
    /// A subscriber starting at [`Cursor::Latest`].
    pub fn new(subscriber_id: impl Into<String>) -> SubscribeOptions {
        SubscribeOptions { subscriber_id: subscriber_id.into(), cursor: Cursor::Latest }
    }

    /// Sets where the stream starts.
    pub fn cursor(mut self, cursor: Cursor) -> SubscribeOptions {
        self.cursor = cursor;
        self
    }
}

/// What a subscription delivers.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Event {
    /// The next message, in strictly increasing sequence order.
    Message(Message),
    /// Messages after `requested_cursor` and before `first_available_sequence` were
    /// removed by retention; the stream continues at `first_available_sequence`.
    Expired {
        /// The cursor the subscription asked for.
        requested_cursor: u64,
        /// The first sequence still retained.
        first_available_sequence: u64,
    },
    /// The topic was deleted; the stream ends after this event, which comes after every
    /// message published before the deletion, even when the connection dropped meanwhile (a
    /// node serves a resuming subscriber what it is owed from a deleted topic, then this).
    /// Also when the connection dropped and every node then denies the topic
    /// (`topic_not_found`): it was deleted meanwhile with nothing after the last message
    /// delivered.
    TopicDeleted,
    /// The node serving the subscription saw a new leader (the client's leader cache is
    /// updated too). The subscription itself goes on.
    LeaderChange {
        /// The new leader's address `host:port`.
        new_leader: Option<String>,
        /// The new leader's id `node-N`.
        new_leader_id: Option<String>,
    },
    /// Right after (re)subscribing, or once later when the topic fills before this
    /// subscriber's first ack is recorded: the topic holds `recorded_cursors_max` recorded
    /// cursors, none of them this subscriber's, so its acks are not recorded and resuming with
    /// [`crate::Cursor::Acked`] starts from the beginning. Forgetting unused subscribers'
    /// cursors (`DELETE /topics/:name/subscribers/:id`) makes room. The stream goes on.
    AcksNotRecorded {
        /// The most recorded cursors a topic may hold.
        recorded_cursors_max: u64,
    },
    /// The connection dropped and an attempt to open a new one failed; the subscription tries
    /// the next node after a backoff, until [`crate::ClientBuilder::reconnect_attempts_max`]
    /// attempts fail in a row (the last one ends the stream with its error instead). Against
    /// nodes that answer nothing that may take minutes: this says so while it goes on. A
    /// connection that opens and drops before the node confirms the subscription counts as a
    /// failed attempt too, without an event of its own. Skipped, not waited for, when the
    /// application is behind on the stream. The stream goes on.
    Reconnecting {
        /// Failed attempts so far, in a row.
        attempts: u32,
        /// Why the last one failed.
        error: String,
    },
}

/// Acknowledges messages of a [`Subscription`]; cheap to clone and usable from any task.
///
/// Acks are coalesced: only the highest sequence matters, it is sent on the current
/// connection and sent again after every reconnect.
///
/// ```no_run
/// use futures_util::StreamExt;
/// use pubsub_client::{Client, Cursor, Event, SubscribeOptions};
///
/// # async fn run(client: Client) -> Result<(), pubsub_client::Error> {
/// let opts = SubscribeOptions::new("worker").cursor(Cursor::Acked);
/// let mut sub = client.subscribe("jobs", opts).await?;
/// let acker = sub.acker();
/// let (jobs, mut queue) = tokio::sync::mpsc::channel::<pubsub_client::Message>(100);
/// // A worker handles jobs in order and acks each one when it is done.
/// tokio::spawn(async move {
///     while let Some(job) = queue.recv().await {
///         println!("done with #{}", job.sequence);
///         acker.ack(job.sequence);
///     }
/// });
/// // Not `while let Some(Ok(Event::Message(..)))`: that loop would stop at the first
/// // other event, a leader change say.
/// while let Some(event) = sub.next().await {
///     match event? {
///         Event::Message(job) => {
///             if jobs.send(job).await.is_err() {
///                 break;
///             }
///         }
///         Event::TopicDeleted => break,
///         _ => {}
///     }
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Acker {
    /// The highest sequence acked so far; the subscription task watches it.
    latest: Arc<watch::Sender<u64>>,
}

impl Acker {
    /// Records that every message up to `sequence` is processed. Lower or equal sequences
    /// than an earlier ack are ignored.
    pub fn ack(&self, sequence: u64) {
        self.latest.send_if_modified(|current| {
            if sequence > *current {
                *current = sequence;
                true
            } else {
                false
            }
        });
    }

    /// The highest sequence acked so far (0 when none).
    pub fn acked(&self) -> u64 {
        *self.latest.borrow()
    }
}

/// A live subscription: a [`Stream`] of `Result<Event, Error>`.
///
/// The stream ends after [`Event::TopicDeleted`], or after an `Err` the subscription cannot
/// recover from (the topic vanished, the cluster stayed unreachable for the reconnect
/// budget). [`Error::SequenceGap`] is reported and the stream goes on; so is
/// [`Error::Protocol`] for a frame that still does not parse when read again from
/// [`limits::SUBSCRIPTION_UNPARSED_REREADS_MAX`] new connections. Dropping the subscription
/// closes its connection.
///
/// ```no_run
/// use futures_util::StreamExt;
/// use pubsub_client::{Client, Cursor, Event, SubscribeOptions};
///
/// # async fn run() -> Result<(), pubsub_client::Error> {
/// let client = Client::new(["127.0.0.1:8081", "127.0.0.1:8082"])?;
/// let opts = SubscribeOptions::new("billing").cursor(Cursor::Acked);
/// let mut sub = client.subscribe("orders", opts).await?;
/// let acker = sub.acker();
/// while let Some(event) = sub.next().await {
///     match event? {
///         Event::Message(m) => {
///             println!("#{} {}", m.sequence, m.payload);
///             acker.ack(m.sequence);
///         }
///         Event::TopicDeleted => break,
///         other => eprintln!("{other:?}"),
///     }
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Subscription {
    /// Events produced by the connection task.
    events: mpsc::Receiver<Result<Event, Error>>,
    /// Shared with the task and handed out by [`Subscription::acker`].
    acker: Acker,
    /// The connection task; aborted when the subscription is dropped.
    task: tokio::task::JoinHandle<()>,
    /// The subscribed topic.
    topic: String,
    /// The subscriber id.
    subscriber_id: String,
    /// The effective cursor the first node confirmed in its `subscribed` frame.
    subscribed_cursor: Option<u64>,
}

impl Subscription {
    /// A handle to ack from anywhere while this subscription is polled.
    pub fn acker(&self) -> Acker {
        self.acker.clone()
    }

    /// Acks every message up to `sequence` (see [`Acker::ack`]).
    pub fn ack(&self, sequence: u64) {
        self.acker.ack(sequence);
    }

    /// The subscribed topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The subscriber id.
    pub fn subscriber_id(&self) -> &str {
        &self.subscriber_id
    }

    /// Ends the subscription gracefully: the latest ack still goes out, then the socket is
    /// closed. Dropping the subscription instead closes it at once.
    ///
    /// ```no_run
    /// # async fn run(sub: pubsub_client::Subscription) {
    /// sub.ack(42);
    /// sub.close().await; // ack 42 reached the node
    /// # }
    /// ```
    pub async fn close(mut self) {
        self.events.close();
        let _ = tokio::time::timeout(limits::SUBSCRIPTION_CLOSE_TIMEOUT, &mut self.task).await;
    }

    /// The effective start cursor the server confirmed (messages after it are delivered).
    /// Always `Some`: a subscription starts only on a connection whose first frame is
    /// `subscribed`.
    pub fn subscribed_cursor(&self) -> Option<u64> {
        self.subscribed_cursor
    }
}

impl Stream for Subscription {
    type Item = Result<Event, Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().events.poll_recv(cx)
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Client {
    /// Subscribes to a topic on any node. Returns once a node accepted the subscription and
    /// confirmed its start cursor, so with [`Cursor::Latest`] every message published after
    /// this returns is delivered.
    ///
    /// Refusals come back here as [`Error::Api`]: `topic_not_found`, `invalid_cursor`,
    /// `invalid_request`.
    ///
    /// ```no_run
    /// use futures_util::StreamExt;
    /// use pubsub_client::{Client, Cursor, Event, SubscribeOptions};
    ///
    /// # async fn run(client: Client) -> Result<(), pubsub_client::Error> {
    /// let mut sub = client
    ///     .subscribe("orders", SubscribeOptions::new("audit").cursor(Cursor::After(0)))
    ///     .await?;
    /// while let Some(event) = sub.next().await {
    ///     match event? {
    ///         Event::Message(m) => sub.ack(m.sequence),
    ///         Event::TopicDeleted => break,
    ///         other => eprintln!("{other:?}"),
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn subscribe(&self, topic: &str, options: SubscribeOptions) -> Result<Subscription, Error> {
        crate::endpoint::check_path_segment(topic)?;
        let id_chars = options.subscriber_id.chars().count();
        if id_chars == 0 || id_chars > limits::SUBSCRIBER_ID_CHARS_MAX {
            return Err(Error::InvalidArgument(format!(
                "a subscriber id has 1 to {} characters",
                limits::SUBSCRIBER_ID_CHARS_MAX
            )));
        }
        let mut tracker = Tracker::new(topic, options.cursor);
        let (socket, cursor) = self.connect_first(topic, &options.subscriber_id, options.cursor).await?;
        if self.node_count() == 1 {
            // Given one address, the client knows no other node to fail over to: learn the
            // cluster's peers now, from the node that just answered, while it is up.
            self.refresh_nodes().await;
        }
        // The tracker learns the effective cursor now, so a reconnect before the application
        // polls still resumes from the right place.
        tracker.on_subscribed(cursor);
        let (events_tx, events_rx) = mpsc::channel(limits::SUBSCRIPTION_EVENTS_BUFFERED);
        let (ack_tx, ack_rx) = watch::channel(0u64);
        let task = Worker {
            client: self.clone(),
            topic: topic.to_string(),
            subscriber_id: options.subscriber_id.clone(),
            tracker,
            events: events_tx,
            acks: ack_rx,
            acks_open: true,
            failures: 0,
            unparsed: None,
        };
        let task = tokio::spawn(task.run(socket));
        Ok(Subscription {
            events: events_rx,
            acker: Acker { latest: Arc::new(ack_tx) },
            task,
            topic: topic.to_string(),
            subscriber_id: options.subscriber_id,
            subscribed_cursor: Some(cursor),
        })
    }

    /// Connects to the first node that accepts, trying the known nodes in turn with backoff,
    /// and returns the start cursor its first frame, `subscribed`, confirms.
    ///
    /// A follower serves subscriptions from its own applied state, so right after a topic is
    /// created (or messages published) it may still answer `404 topic_not_found` or
    /// `400 invalid_cursor` while the leader would accept. Those refusals move on to the next
    /// node at once and are final only when every node the client knows gave them.
    /// Other refusals (`400 invalid_request`, ...) are final at once; `5xx` ones are retried.
    async fn connect_first(&self, topic: &str, subscriber_id: &str, cursor: Cursor) -> Result<(Socket, u64), Error> {
        let policy = self.config().retry.clone();
        let started = Instant::now();
        let mut attempts = 0;
        // Nodes, not answers: a lagging node asked again (the others unreachable) is one.
        let mut denied = HashSet::new();
        let mut learned = false;
        loop {
            attempts += 1;
            let node = self.next_node();
            let mut backoff = true;
            // Each attempt's handshake and first frame have their own timeouts, longer than
            // what may be left of the operation's: the attempt ends with the operation.
            let left = policy.operation_timeout.saturating_sub(started.elapsed());
            let attempt = async {
                let mut socket = connect(self, &node, topic, subscriber_id, cursor).await?;
                let cursor = first_frame(&mut socket, self.timeout()).await?;
                Ok((socket, cursor))
            };
            let failure = match tokio::time::timeout(left, attempt).await {
                Ok(Ok(started)) => return Ok(started),
                Err(elapsed) => Refusal::Transport { error: Box::new(elapsed), timeout: true },
                Ok(Err(Refusal::Api(api))) if may_lag_behind(&api) => {
                    denied.insert(node.clone());
                    if self.every_node_in_once_learned(&denied, &mut learned).await {
                        return Err(Error::Api(api));
                    }
                    tracing::debug!(%node, %api, "subscription refused; trying the next node");
                    backoff = false;
                    Refusal::Api(api)
                }
                Ok(Err(Refusal::Api(api))) if api.status >= 500 => Refusal::Api(api),
                Ok(Err(Refusal::Api(api))) => return Err(Error::Api(api)),
                Ok(Err(Refusal::Transport { error, timeout })) => Refusal::Transport { error, timeout },
            };
            let elapsed = started.elapsed();
            if attempts >= policy.attempts_max || elapsed >= policy.operation_timeout {
                return Err(failure.exhausted(attempts, elapsed));
            }
            if backoff {
                let wait = policy.backoff(attempts, &mut rand::thread_rng());
                // Sleeping to the deadline would leave the next attempt no time at all: it would
                // fail as a timeout and hide why this one failed.
                if wait >= policy.operation_timeout.saturating_sub(elapsed) {
                    return Err(failure.exhausted(attempts, elapsed));
                }
                tokio::time::sleep(wait).await;
            }
        }
    }

    /// Time allowed for one WebSocket handshake or first frame.
    fn timeout(&self) -> Duration {
        self.config().connect_timeout + self.config().request_timeout
    }
}

/// Why a connection attempt failed.
#[derive(Debug)]
enum Refusal {
    /// The server answered the upgrade with an HTTP error.
    Api(ApiError),
    /// No connection, a broken one, or a timeout.
    Transport { error: BoxError, timeout: bool },
}

impl Refusal {
    /// For people: the server's error, or the transport's.
    fn describe(&self) -> String {
        match self {
            Refusal::Api(api) => api.to_string(),
            Refusal::Transport { error, .. } => error.to_string(),
        }
    }

    fn into_error(self, attempts: u32, elapsed: Duration) -> Error {
        match self {
            Refusal::Api(api) => Error::Api(api),
            Refusal::Transport { timeout: true, .. } => Error::Timeout { attempts, elapsed },
            Refusal::Transport { error, .. } => Error::Unreachable { attempts, source: error },
        }
    }

    /// The error of the last attempt when the retries ran out. A refusal that a lagging node
    /// gives (`topic_not_found`, `invalid_cursor`) is the cluster's answer only when every node
    /// gave it, and that case returns before: from some nodes only, with the others
    /// unreachable, it would tell the application that a live topic is gone.
    fn exhausted(self, attempts: u32, elapsed: Duration) -> Error {
        match self {
            Refusal::Api(api) if may_lag_behind(&api) => Error::Unreachable {
                attempts,
                source: format!(
                    "no node served the subscription: the ones that answered may be behind ({}), \
                     the others were unreachable",
                    api.code
                )
                .into(),
            },
            other => other.into_error(attempts, elapsed),
        }
    }
}

/// One WebSocket handshake with one node.
async fn connect(
    client: &Client,
    node: &Url,
    topic: &str,
    subscriber_id: &str,
    cursor: Cursor,
) -> Result<Socket, Refusal> {
    let url = subscribe_url(node, topic, subscriber_id, cursor);
    // Nagle off: acks and pongs are small frames.
    let handshake =
        tokio_tungstenite::connect_async_with_config(url.as_str(), Some(crate::limits::subscription_ws_config()), true);
    match tokio::time::timeout(client.timeout(), handshake).await {
        Err(elapsed) => Err(Refusal::Transport { error: Box::new(elapsed), timeout: true }),
        Ok(Ok((socket, _response))) => Ok(socket),
        Ok(Err(tungstenite::Error::Http(response))) => {
            let status = response.status().as_u16();
            let body = response.body().as_deref().unwrap_or_default();
            let mut api = ApiError::from_body(status, body);
            // tungstenite keeps only the body bytes that arrived with the headers: a body sent
            // in a later TCP segment (behind a proxy, say) is lost, and with it the code. A
            // bare 404 here is the topic's (the route exists), which a lagging node gives too.
            if status == 404 && matches!(api.code, ErrorCode::NotFound | ErrorCode::Other(_)) {
                api.code = ErrorCode::TopicNotFound;
            }
            Err(Refusal::Api(api))
        }
        Ok(Err(error)) => Err(Refusal::Transport { error: Box::new(error), timeout: false }),
    }
}

/// Reads the first text frame, the contract's `subscribed` (API.md §5), and returns the start
/// cursor it confirms. Any other first frame, or one that does not parse, fails the connection
/// like a transport error: going on without a confirmed start cursor, a reconnect before the
/// first message would resume from the latest sequence and skip what was published meanwhile.
async fn first_frame(socket: &mut Socket, timeout: Duration) -> Result<u64, Refusal> {
    let read = async {
        loop {
            let frame = socket.next().await;
            answer_if_close(socket, &frame).await;
            match frame {
                Some(Ok(WsMessage::Text(text))) => {
                    let reason = match serde_json::from_str::<ServerFrame>(&text) {
                        Ok(ServerFrame::Control(ControlFrame::Subscribed { cursor })) => return Ok(cursor),
                        Ok(_) => "the first frame is not `subscribed`".to_string(),
                        Err(e) => format!("the first frame does not parse: {e}"),
                    };
                    return Err(Refusal::Transport { error: reason.into(), timeout: false });
                }
                Some(Ok(WsMessage::Close(_))) | None => {
                    return Err(Refusal::Transport {
                        error: "connection closed before the first frame".into(),
                        timeout: false,
                    })
                }
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err(Refusal::Transport { error: Box::new(e), timeout: false }),
            }
        }
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(result) => result,
        Err(elapsed) => Err(Refusal::Transport { error: Box::new(elapsed), timeout: true }),
    }
}

/// When `frame` is the node's close frame, sends the answer tungstenite queued to it. It goes
/// out only with the socket's next write or flush: dropped unsent, the node waits for it (up
/// to 2 s) before it lets the connection go, and a stopping node waits as long before it exits.
async fn answer_if_close(socket: &mut Socket, frame: &Option<Result<WsMessage, tungstenite::Error>>) {
    if let Some(Ok(WsMessage::Close(_))) = frame {
        let _ = tokio::time::timeout(limits::SUBSCRIPTION_CLOSE_TIMEOUT, socket.flush()).await;
    }
}

/// How one connection ended.
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    /// The stream is over (topic deleted, application gone, fatal error).
    Finished,
    /// The connection dropped; reconnect.
    Dropped,
}

/// The task behind a [`Subscription`].
struct Worker {
    /// Shares the node list and leader cache with the application's client.
    client: Client,
    /// The subscribed topic.
    topic: String,
    /// The subscriber id, sent on every (re)connect.
    subscriber_id: String,
    /// Dedup and resume state across connections.
    tracker: Tracker,
    /// To the application; closed when the [`Subscription`] is dropped.
    events: mpsc::Sender<Result<Event, Error>>,
    /// The highest acked sequence, set by [`Acker`]s.
    acks: watch::Receiver<u64>,
    /// False once every [`Acker`] is gone (then `changed()` would return at once forever).
    acks_open: bool,
    /// Consecutive failed reconnects; reset by a `subscribed` frame.
    failures: u32,
    /// The resume cursor at the last frame that did not parse, and how many did not parse
    /// while it stood there. Not reset by `subscribed`, which each re-read brings.
    unparsed: Option<(Cursor, u32)>,
}

impl Worker {
    async fn run(mut self, socket: Socket) {
        let mut socket = Some(socket);
        loop {
            let current = match socket.take() {
                Some(s) => s,
                None => match self.reconnect().await {
                    Ok(s) => s,
                    Err(Error::Api(api)) if api.code == ErrorCode::TopicNotFound => {
                        // The topic existed when this subscription started and every node
                        // now denies it: it was deleted while the connection was down, with
                        // nothing owed after the cursor (a node would have served that). Said
                        // the way a connected subscriber hears it.
                        let _ = self.events.send(Ok(Event::TopicDeleted)).await;
                        return;
                    }
                    Err(error) => {
                        let _ = self.events.send(Err(error)).await;
                        return;
                    }
                },
            };
            if self.drive(current).await == Ended::Finished {
                return;
            }
            tracing::debug!(topic = %self.topic, "subscription connection dropped; reconnecting");
        }
    }

    /// Reconnects to the next nodes in turn until one accepts.
    ///
    /// Gives up after `reconnect_attempts_max` consecutive failures; a connection that
    /// drops before its `subscribed` frame counts as a failure too.
    ///
    /// The new connection's first frame is left to `drive`, unlike the first connection's: the
    /// resume cursor is explicit by now (the first `subscribed` frame fixed it), so a first frame
    /// that is not `subscribed` cannot move the stream's start: messages are still deduplicated
    /// and gap-checked against the last delivered sequence. It only leaves `failures` counting
    /// until a `subscribed` frame comes.
    async fn reconnect(&mut self) -> Result<Socket, Error> {
        let config = self.client.config().clone();
        let started = Instant::now();
        // Nodes, not answers: a node still catching up, asked again while the others are
        // unreachable, must not make a live topic look deleted.
        let mut not_found = HashSet::new();
        let mut last: Option<Refusal> = None;
        loop {
            if self.events.is_closed() {
                return Err(Error::InvalidArgument("subscription dropped".into()));
            }
            if self.failures >= config.reconnect_attempts_max {
                let last = last.unwrap_or_else(|| Refusal::Transport {
                    error: "connections dropped before the subscription was confirmed".into(),
                    timeout: false,
                });
                return Err(last.exhausted(self.failures, started.elapsed()));
            }
            self.failures += 1;
            let wait = config.retry.backoff(self.failures, &mut rand::thread_rng());
            tokio::time::sleep(wait).await;
            if self.failures % 2 == 1 {
                // Learn the cluster's peers, so failover is not limited to the seeds.
                self.client.refresh_nodes().await;
            }
            let node = self.client.next_node();
            let cursor = self.tracker.resume_cursor();
            let refusal = match connect(&self.client, &node, &self.topic, &self.subscriber_id, cursor).await {
                Ok(socket) => return Ok(socket),
                Err(refusal) => refusal,
            };
            tracing::debug!(?refusal, %node, "subscription reconnect failed");
            if let Refusal::Api(api) = &refusal {
                match api.code {
                    // A node that has not applied the create (or the messages we already
                    // saw) yet answers these; another node, or the same one a bit later, will
                    // not. A topic every node denies is gone.
                    ErrorCode::TopicNotFound => {
                        not_found.insert(node.clone());
                        if self.client.every_node_in(&not_found) {
                            return Err(refusal.into_error(self.failures, started.elapsed()));
                        }
                    }
                    ErrorCode::InvalidCursor => {}
                    _ if api.status >= 500 => {}
                    _ => return Err(refusal.into_error(self.failures, started.elapsed())),
                }
            }
            if self.failures < config.reconnect_attempts_max {
                // Information only: a full buffer (the application behind) drops it.
                let error = format!("{node}: {}", refusal.describe());
                let _ = self.events.try_send(Ok(Event::Reconnecting { attempts: self.failures, error }));
            }
            last = Some(refusal);
        }
    }

    /// Serves one connection until it drops or the stream ends.
    async fn drive(&mut self, mut socket: Socket) -> Ended {
        let config = self.client.config().clone();
        // Re-send the latest ack: the previous connection may have died before it got out.
        let mut acked_sent = *self.acks.borrow_and_update();
        if acked_sent > 0 && socket.send(WsMessage::text(ack_frame(acked_sent))).await.is_err() {
            return Ended::Dropped;
        }
        let mut ping = tokio::time::interval(config.subscribe_ping_interval);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ping.tick().await;
        let mut last_heard = Instant::now();
        // Both waits live as long as the connection rather than one turn of the loop: built
        // per frame, registering and dropping their waiters was 5-6 % of a load generator
        // holding 1,000 subscriptions.
        let app_gone = {
            let events = self.events.clone();
            async move { events.closed().await }
        };
        tokio::pin!(app_gone);
        let acks = ack_changes(self.acks.clone());
        tokio::pin!(acks);
        loop {
            // The socket is not split: only the read borrows it while waiting, and
            // `select!` drops that future before a branch writes.
            tokio::select! {
                () = &mut app_gone => {
                    self.close_politely(&mut socket, acked_sent).await;
                    return Ended::Finished;
                }
                ack = acks.next(), if self.acks_open => {
                    let Some(sequence) = ack else {
                        self.acks_open = false;
                        continue;
                    };
                    if socket.send(WsMessage::text(ack_frame(sequence))).await.is_err() {
                        return Ended::Dropped;
                    }
                    acked_sent = sequence;
                }
                _ = ping.tick() => {
                    if last_heard.elapsed() >= config.subscribe_idle_timeout {
                        tracing::debug!(topic = %self.topic, "subscription idle; reconnecting");
                        return Ended::Dropped;
                    }
                    if socket.send(WsMessage::Ping(Default::default())).await.is_err() {
                        return Ended::Dropped;
                    }
                }
                frame = socket.next() => {
                    answer_if_close(&mut socket, &frame).await;
                    let next = match frame {
                        None | Some(Err(_)) | Some(Ok(WsMessage::Close(_))) => Next::Dropped,
                        Some(Ok(WsMessage::Text(text))) => self.on_text(&text).await,
                        // Pongs, pings (answered by tungstenite) and binary frames only prove
                        // the connection is alive.
                        Some(Ok(_)) => Next::Continue,
                    };
                    match next {
                        Next::Continue => {}
                        Next::Finished => {
                            // Also when the application closed the subscription while this
                            // frame waited for room in its queue.
                            self.close_politely(&mut socket, acked_sent).await;
                            return Ended::Finished;
                        }
                        Next::Dropped => return Ended::Dropped,
                    }
                    // Time spent waiting for the application to take events is not silence
                    // of the server.
                    last_heard = Instant::now();
                }
            }
        }
    }

    /// Ends the connection with the latest ack not sent yet, then a close frame, and waits
    /// for the node to end it too: it reads frames in order, so by then it has read the ack,
    /// and [`Subscription::close`] never loses one (a node stopped right after would otherwise
    /// drop it unread).
    async fn close_politely(&self, socket: &mut Socket, acked_sent: u64) {
        let latest = *self.acks.borrow();
        let close = async {
            if latest > acked_sent {
                let _ = socket.send(WsMessage::text(ack_frame(latest))).await;
            }
            if socket.send(WsMessage::Close(None)).await.is_err() {
                return;
            }
            while let Some(Ok(message)) = socket.next().await {
                if matches!(message, WsMessage::Close(_)) {
                    break;
                }
            }
        };
        // Bounded here too, not only by `Subscription::close`: after `topic_deleted` on a
        // connection that went half-open, a stream read to its end would never end.
        let _ = tokio::time::timeout(limits::SUBSCRIPTION_CLOSE_TIMEOUT, close).await;
    }

    /// Handles one text frame.
    async fn on_text(&mut self, text: &str) -> Next {
        let frame = match serde_json::from_str::<ServerFrame>(text) {
            Ok(frame) => frame,
            Err(e) => {
                // Read past, the frame would be lost, and the next message reported as a gap.
                // TCP does not corrupt, so a garbled frame came from a transient fault or a
                // proxy: resuming after the last delivered message has a node send it again.
                if self.may_reread_unparsed() {
                    tracing::debug!(topic = %self.topic, error = %e, "a frame does not parse; reading it again");
                    return Next::Dropped;
                }
                let error = Error::Protocol {
                    url: format!("subscription to {}", self.topic),
                    reason: format!("frame does not parse: {e}"),
                };
                return match self.events.send(Err(error)).await {
                    Ok(()) => Next::Continue,
                    Err(_) => Next::Finished,
                };
            }
        };
        if matches!(frame, ServerFrame::Control(ControlFrame::Subscribed { .. })) {
            self.failures = 0;
        }
        let step = self.tracker.on_frame(frame);
        self.deliver(step).await
    }

    /// Counts a frame that did not parse at the current resume cursor; true while it may be read
    /// again from a new connection, false once one at this cursor never parsed in
    /// [`limits::SUBSCRIPTION_UNPARSED_REREADS_MAX`] re-reads (a server of another version).
    fn may_reread_unparsed(&mut self) -> bool {
        let at = self.tracker.resume_cursor();
        let count = match self.unparsed {
            Some((cursor, count)) if cursor == at => count + 1,
            _ => 1,
        };
        self.unparsed = Some((at, count));
        count <= limits::SUBSCRIPTION_UNPARSED_REREADS_MAX
    }

    /// Hands a tracker step to the application. `Finished` when the stream is over.
    async fn deliver(&mut self, step: Step) -> Next {
        let sent = match step {
            Step::Skip => Ok(()),
            Step::Emit(event) => {
                if let Event::LeaderChange { new_leader: Some(address), .. } = &event {
                    self.client.learn_leader_address(address);
                }
                self.events.send(Ok(event)).await
            }
            Step::Gap { error, then } => match self.events.send(Err(error)).await {
                Ok(()) => self.events.send(Ok(then)).await,
                Err(e) => Err(e),
            },
            Step::End(event) => {
                let _ = self.events.send(Ok(event)).await;
                return Next::Finished;
            }
        };
        match sent {
            Ok(()) => Next::Continue,
            Err(_) => Next::Finished,
        }
    }
}

/// What to do after one frame.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    /// Keep reading this connection.
    Continue,
    /// The stream is over.
    Finished,
    /// The connection is gone; reconnect.
    Dropped,
}

/// Each new highest ack, for as long as an [`Acker`] lives. One waiter at a time, kept until
/// it fires.
fn ack_changes(acks: watch::Receiver<u64>) -> impl Stream<Item = u64> {
    futures_util::stream::unfold(acks, |mut acks| async move {
        acks.changed().await.ok()?;
        let sequence = *acks.borrow_and_update();
        Some((sequence, acks))
    })
}

mod tracker;

pub(crate) use tracker::{Step, Tracker};

#[cfg(test)]
mod tests;
