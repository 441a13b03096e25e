//! [`Publisher`]: many publishes in flight on one WebSocket to the leader (API.md §8).
//!
//! One HTTP request per publish costs a request's parsing and a response each; a publishing
//! WebSocket carries frames both ways on one connection instead. Each publish gets a `ref`
//! (a counter) and waits on a oneshot channel kept in a map under that ref; a writer task
//! sends the frames and a reader task hands each answer to the waiter its `ref` names, so
//! answers may come in any order (the server answers in commit order). When the connection
//! drops, every waiter is told at once.
//!
//! A publisher does not reconnect. Once its connection is gone every `publish` fails fast,
//! and the caller opens a new one with [`Client::publisher`], which finds the (possibly new)
//! leader the way HTTP calls do.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::task::AbortHandle;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use url::Url;

use crate::client::{ensure_id, Client};
use crate::error::{ApiError, Error, ErrorCode};
use crate::limits;
use crate::retry::{classify, Verdict};
use crate::types::{NewMessage, PublishAck};

use connection::{Pending, Waiter};
use wire::Answer;

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A publishing connection to the leader for one topic. Cheap to clone; clones share the
/// connection, and any number of [`Publisher::publish`] calls may be in flight at once, from
/// clones or from concurrent futures of one handle.
///
/// An answer means what the HTTP publish's `201` means: committed on a majority and applied.
/// Unlike [`Client::publish_message`], a publisher does not retry: a `no_leader`,
/// `raft_timeout` or `not_committed` answer, or a lost connection, comes back as an error.
/// To retry safely, give messages their own ids ([`NewMessage::with_id`]) and publish again
/// with the same id (on a new publisher if the connection is gone): the server deduplicates.
/// A message that was stored after all then comes back as [`Error::Api`]
/// `duplicate_message_id` with its [`ApiError::existing_sequence`]: stored once, and done.
///
/// The connection is dropped when the last clone is.
///
/// ```no_run
/// use futures_util::future::try_join_all;
/// use pubsub_client::{Client, NewMessage};
/// use serde_json::json;
///
/// # async fn run() -> Result<(), pubsub_client::Error> {
/// let client = Client::new(["127.0.0.1:8081", "127.0.0.1:8082"])?;
/// let publisher = client.publisher("orders").await?;
/// // 100 publishes in flight on one connection.
/// let acks = try_join_all((0..100).map(|n| {
///     publisher.publish(NewMessage::new(json!({"n": n})).with_id(format!("order-{n}")))
/// }))
/// .await?;
/// println!("last sequence {:?}", acks.iter().filter_map(|a| a.sequence).max());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Publisher {
    /// Shared by clones; the connection closes when the last one goes.
    shared: Arc<Shared>,
}

/// What clones of a [`Publisher`] share.
struct Shared {
    /// For the leader cache (an answer may name a new leader) and the timeouts.
    client: Client,
    /// The topic every publish goes to.
    topic: String,
    /// The node the connection is open to (the leader when it was opened).
    node: Url,
    /// Frames to the writer task. When the last sender goes, the writer closes the socket.
    frames: mpsc::Sender<String>,
    /// Publishes waiting for their answer; shared with the connection tasks.
    pending: Arc<Pending>,
    /// Permits for publishes in flight, by bytes ([`slot_weight`]): at most
    /// [`limits::PUBLISH_WS_INFLIGHT_MAX`] publishes and [`limits::PUBLISH_WS_INFLIGHT_BYTES_MAX`]
    /// bytes of frames, the server's limits.
    slots: Arc<Semaphore>,
    /// The next `ref`.
    next_ref: AtomicU64,
    /// The reader task, which holds no handle on `Shared` and so is stopped by its drop.
    reader: AbortHandle,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl fmt::Debug for Publisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Publisher")
            .field("topic", &self.shared.topic)
            .field("node", &self.shared.node.as_str())
            .field("in_flight", &self.in_flight())
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl Client {
    /// Opens a publishing WebSocket for `topic` on the leader, found and followed like the
    /// HTTP writes find it (the cached leader, else `GET /cluster`; a follower's `307` names
    /// the leader; `503 no_leader` and connection errors are retried with backoff within the
    /// retry budget). `404 topic_not_found` and other refusals of the upgrade come back as
    /// [`Error::Api`].
    ///
    /// ```no_run
    /// # async fn run(client: pubsub_client::Client) -> Result<(), pubsub_client::Error> {
    /// use pubsub_client::NewMessage;
    /// use serde_json::json;
    /// let publisher = client.publisher("orders").await?;
    /// let ack = publisher.publish(NewMessage::new(json!({"status": "shipped"}))).await?;
    /// println!("{} is #{:?}", ack.id, ack.sequence);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn publisher(&self, topic: &str) -> Result<Publisher, Error> {
        crate::endpoint::check_path_segment(topic)?;
        let (socket, node) = connect::connect(self, topic).await?;
        Ok(Publisher::start(self.clone(), topic, node, socket))
    }
}

impl Publisher {
    fn start(client: Client, topic: &str, node: Url, socket: Socket) -> Publisher {
        let slots = Arc::new(Semaphore::new(limits::PUBLISH_WS_INFLIGHT_BYTES_MAX));
        let pending = Arc::new(Pending::new(slots.clone()));
        // Never full: a frame is queued only by a publish holding one of the slots.
        let (frames, queued) = mpsc::channel(limits::PUBLISH_WS_INFLIGHT_MAX);
        let reader = connection::spawn(socket, queued, pending.clone());
        Publisher {
            shared: Arc::new(Shared {
                client,
                topic: topic.to_string(),
                node,
                frames,
                pending,
                slots,
                next_ref: AtomicU64::new(0),
                reader,
            }),
        }
    }

    /// Publishes one message and waits until it is committed, or refused.
    ///
    /// The message gets a generated id when it has none. At most
    /// [`limits::PUBLISH_WS_INFLIGHT_MAX`] publishes, and
    /// [`limits::PUBLISH_WS_INFLIGHT_BYTES_MAX`] bytes of them, are in flight on one
    /// connection (the server's limits); past that, a call waits for answers to free room
    /// before it sends.
    ///
    /// A call takes at most the client's request timeout (at least
    /// [`limits::PUBLISH_WS_ANSWER_TIMEOUT_MIN`], longer than the server's write timeout),
    /// its wait for a slot included.
    ///
    /// Errors, mapped as the HTTP publish maps the same answers:
    /// - [`Error::Api`] for a refusal that leaves nothing stored: `topic_not_found`,
    ///   `invalid_request`, `payload_too_large`, `insufficient_storage`, `unauthorized`, and a
    ///   `duplicate_message_id` naming the stored message's `existing_sequence`, with the status
    ///   the HTTP API gives that code;
    /// - [`Error::Unreachable`] when the connection was gone before the message was sent, and
    ///   [`Error::Timeout`] when no slot freed within the timeout: nothing was sent. The
    ///   publisher is then done if the node sent nothing (no answer, no ping) for the whole
    ///   timeout, else it goes on;
    /// - [`Error::Indeterminate`], naming the message id, when the message may or may not
    ///   have been committed: publish it again with the same id (on a new publisher once this
    ///   one [`is_closed`](Self::is_closed)). That is when the connection went while the
    ///   publish waited for its answer; when no answer came within the timeout (the connection
    ///   is then closed if the node sent nothing for the whole timeout, a node cut off or
    ///   stuck); and every other refusal, wrapped: `not_leader`, `no_leader` (its source
    ///   [`Error::NoLeader`]), `raft_timeout`, `not_committed`, `unavailable`, `internal`,
    ///   codes this client does not know, and a `duplicate_message_id` whose
    ///   `existing_sequence` is null (the first publish of that id is still in flight and may
    ///   yet fail). A `not_leader` or `no_leader` answer also updates the client's leader
    ///   cache, so the next [`Client::publisher`] goes to the new leader, and closes this
    ///   publisher to new publishes (those still in flight on it get their own answers, then
    ///   the connection closes);
    /// - [`Error::InvalidArgument`] for an id or a frame the server would refuse (checked
    ///   locally; a frame over [`limits::PUBLISH_WS_FRAME_BYTES_MAX`] would make the server
    ///   drop the connection).
    pub async fn publish(&self, mut message: NewMessage) -> Result<PublishAck, Error> {
        let shared = &*self.shared;
        let id = ensure_id(&mut message)?;
        let reference = shared.next_ref.fetch_add(1, Ordering::Relaxed);
        let frame = wire::publish_frame(reference, &id, &message)?;
        if frame.len() > limits::PUBLISH_WS_FRAME_BYTES_MAX {
            return Err(Error::InvalidArgument(format!(
                "a publish frame is at most {} bytes, this one is {} (the payload is at most 1 MiB)",
                limits::PUBLISH_WS_FRAME_BYTES_MAX,
                frame.len()
            )));
        }
        let started = Instant::now();
        let timeout = shared.client.config().request_timeout.max(limits::PUBLISH_WS_ANSWER_TIMEOUT_MIN);
        // One deadline for the wait for a slot and the wait for the answer.
        let deadline = tokio::time::Instant::from_std(started) + timeout;
        // The pending map closes the semaphore when the connection goes, waking this. Bounded
        // too: when callers give up on their publishes (dropping them), nothing else would
        // notice a connection that stopped answering, and every slot would stay taken.
        let slot =
            match tokio::time::timeout_at(deadline, shared.slots.clone().acquire_many_owned(slot_weight(frame.len())))
                .await
            {
                Ok(Ok(slot)) => slot,
                Ok(Err(_)) => return Err(self.lost(&id)),
                Err(_) => {
                    // Slots free as answers come: with many publishes queued for them, the last
                    // may wait long on a healthy connection. Only a silent node is presumed gone.
                    self.close_if_silent(timeout, "no publish slot freed");
                    return Err(Error::Timeout { attempts: 1, elapsed: started.elapsed() });
                }
            };
        let (reply, answer) = oneshot::channel();
        if shared.pending.insert(reference, Waiter { reply, _slot: slot }).is_err() {
            return Err(self.lost(&id));
        }
        // No await between registering and queueing, so a caller giving up cannot leave a
        // waiter whose frame was never sent. The queue has room: every frame in it holds a slot.
        if shared.frames.try_send(frame).is_err() {
            shared.pending.close("the connection's writer stopped");
            return Err(self.lost(&id));
        }
        // From here the frame may have reached the server: without an answer, the message
        // may be stored.
        let unknown = |source| Error::indeterminate(Some(id.clone()), source);
        let answer = match tokio::time::timeout_at(deadline, answer).await {
            Ok(Ok(Ok(answer))) => answer,
            Ok(Ok(Err(_))) | Ok(Err(_)) => return Err(unknown(self.lost(&id))),
            Err(_) => {
                // A node that sent nothing for this long (no answer, no ping) is cut off or
                // stuck: fail everything waiting on it. One that still speaks may only be
                // slow to take this frame (its budgets full): this publish alone gives up, and
                // its answer, when it comes, frees its slot.
                self.close_if_silent(timeout, "no answer to a publish");
                return Err(unknown(Error::Timeout { attempts: 1, elapsed: started.elapsed() }));
            }
        };
        match answer {
            Answer::Acked { id, sequence, raft_index } => Ok(PublishAck {
                id,
                topic: shared.topic.clone(),
                sequence: Some(sequence),
                raft_index: Some(raft_index),
                committed: true,
                duplicate: false,
            }),
            Answer::Refused(error) => {
                let maybe_stored = may_have_been_stored(&error);
                let refused = self.refused(error, started.elapsed());
                Err(if maybe_stored { unknown(refused) } else { refused })
            }
            // An answer the server sent, whatever it said: the message may be stored.
            Answer::Malformed(reason) => Err(unknown(Error::Protocol { url: self.url(), reason })),
        }
    }

    /// Closes the connection when the node sent nothing (answers, pings) for `timeout`: it is
    /// cut off or stuck, and every publish waiting on it fails now rather than at its own
    /// deadline.
    fn close_if_silent(&self, timeout: Duration, what: &str) {
        let silent = self.shared.pending.silent_for();
        if silent >= timeout {
            self.shared
                .pending
                .close(&format!("{what} within {timeout:?}, and nothing heard from the node for {silent:?}"));
        }
    }

    /// The topic this publisher publishes to.
    pub fn topic(&self) -> &str {
        &self.shared.topic
    }

    /// Base URL of the node the connection is open to.
    pub fn node(&self) -> &str {
        self.shared.node.as_str()
    }

    /// Publishes sent and not answered yet.
    pub fn in_flight(&self) -> usize {
        self.shared.pending.len()
    }

    /// True once the connection is gone; every later [`Publisher::publish`] fails, and a new
    /// publisher is needed.
    pub fn is_closed(&self) -> bool {
        self.shared.pending.closed_reason().is_some()
    }

    fn url(&self) -> String {
        crate::endpoint::publish_url(&self.shared.node, &self.shared.topic).to_string()
    }

    /// The error of a publish that cannot be answered because the connection is gone.
    /// Names the message's id, which may have been generated: publishing it again under the
    /// same id is what makes the retry safe.
    fn lost(&self, id: &str) -> Error {
        let reason = self.shared.pending.closed_reason().unwrap_or_else(|| "connection closed".into());
        Error::Unreachable {
            attempts: 1,
            source: format!(
                "publish connection {} lost ({reason}), message {id:?} unanswered: publish it again \
                 with this id",
                self.url()
            )
            .into(),
        }
    }

    /// Maps an error frame as the HTTP path maps the same answer, and keeps what it says
    /// about the leader.
    fn refused(&self, error: ApiError, elapsed: Duration) -> Error {
        let client = &self.shared.client;
        match classify(error.status, Some(&error), None) {
            Verdict::Redirect(Some(leader)) => client.set_leader(leader),
            Verdict::Redirect(None) | Verdict::Retry { forget_leader: true, .. } => {
                client.forget_leader(&self.shared.node)
            }
            Verdict::Retry { .. } | Verdict::Done => {}
        }
        // A publisher is bound to the leader. Once its node says it is not (a deposed leader
        // keeps the socket open), every later publish would be refused the same way: take no
        // more, so `is_closed` tells the caller to open a new one, which finds the new leader.
        // The publishes still in flight get their own answers (some are acks) before it closes.
        if matches!(error.code, ErrorCode::NotLeader | ErrorCode::NoLeader) {
            self.shared.pending.drain(&format!("{} is no longer the leader ({})", self.shared.node, error.code));
        }
        if error.code == ErrorCode::NoLeader {
            return Error::NoLeader { attempts: 1, elapsed };
        }
        Error::Api(error)
    }
}

/// Refusals of a publish that may have been appended all the same: leadership moved while it
/// was in flight (a new leader may still commit it), or it did not commit in time. Error
/// frames carry no id, so these become [`Error::Indeterminate`] naming it, for the caller to
/// publish again under the same id. The refusals before an append (a bad message, a missing
/// topic, a duplicate already stored) leave nothing behind.
fn may_have_been_stored(error: &ApiError) -> bool {
    match &error.code {
        ErrorCode::TopicNotFound
        | ErrorCode::TopicAlreadyExists
        | ErrorCode::InvalidCursor
        | ErrorCode::InvalidRequest
        | ErrorCode::InvalidTopicName
        | ErrorCode::PayloadTooLarge
        | ErrorCode::InsufficientStorage
        | ErrorCode::Unauthorized => false,
        // A null `existing_sequence`: the first publish of this id is still in flight on the
        // leader and may yet fail (API.md §7), so the message may or may not end up stored.
        ErrorCode::DuplicateMessageId => error.existing_sequence().is_none(),
        // `not_leader`, `no_leader`, `not_committed`, `raft_timeout`; `unavailable` (nothing
        // queued, but kept on the safe side); codes this client does not know yet.
        _ => true,
    }
}

/// The permits a publish of a `frame_bytes` frame holds while in flight: its bytes, and at
/// least a 4096th of the budget, so that no more than 4096 publishes fit at once either.
fn slot_weight(frame_bytes: usize) -> u32 {
    let least = limits::PUBLISH_WS_INFLIGHT_BYTES_MAX / limits::PUBLISH_WS_INFLIGHT_MAX;
    // A frame is at most PUBLISH_WS_FRAME_BYTES_MAX (checked before), far below the budget.
    frame_bytes.clamp(least, limits::PUBLISH_WS_INFLIGHT_BYTES_MAX) as u32
}

mod connect;
mod connection;
mod wire;

#[cfg(test)]
mod tests;
