//! The two tasks of a publishing connection and the map of publishes waiting for answers.
//!
//! The writer sends queued frames, as many as are waiting in one flush. The reader pairs
//! each answer with its waiter by `ref`. Whichever of them sees the connection fail closes
//! the [`Pending`] map, which tells every waiter and refuses new ones, so no publish waits
//! on a connection that is gone. A publisher that closes the map itself (a publish timed
//! out, the node is no longer the leader) ends both tasks too, so the socket is closed then
//! and not only when the last clone of the publisher is dropped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::AbortHandle;
use tokio_tungstenite::tungstenite::Message as WsMessage;

use super::wire::{self, Answer};
use super::Socket;
use crate::limits::PUBLISH_WS_CLOSE_TIMEOUT;

/// Why a waiter got no answer: the connection is gone, for this reason.
pub(super) type Lost = Arc<str>;

/// A publish waiting for its answer.
#[derive(Debug)]
pub(super) struct Waiter {
    /// Where its answer goes.
    pub(super) reply: oneshot::Sender<Result<Answer, Lost>>,
    /// Its in-flight slot, freed with the waiter: when the answer came, or the connection went.
    pub(super) _slot: OwnedSemaphorePermit,
}

/// Publishes waiting for answers, by `ref`, and whether the connection is gone.
#[derive(Debug)]
pub(super) struct Pending {
    /// A plain mutex: held for a map operation, never across an await.
    state: Mutex<State>,
    /// The publishers' in-flight slots, closed with the map to wake publishes waiting for one.
    slots: Arc<Semaphore>,
    /// Turns true when the map is closed: tells the connection's tasks to stop.
    gone: watch::Sender<bool>,
    /// When the node was last heard from (any frame: answers, its pings), in ms from
    /// `opened`: set by the reader on every frame, without the map's lock.
    heard_ms: AtomicU64,
    opened: Instant,
}

#[derive(Debug, Default)]
struct State {
    waiting: HashMap<u64, Waiter>,
    /// Set once, when the connection is gone.
    closed: Option<Lost>,
    /// Set once no new publish is taken, the connection staying open for the answers still
    /// due ([`Pending::drain`]).
    draining: Option<Lost>,
}

impl Pending {
    pub(super) fn new(slots: Arc<Semaphore>) -> Pending {
        Pending {
            state: Mutex::new(State::default()),
            slots,
            gone: watch::Sender::new(false),
            heard_ms: AtomicU64::new(0),
            opened: Instant::now(),
        }
    }

    /// Notes a frame from the node: the connection is alive.
    fn heard(&self) {
        self.heard_ms.store(self.opened.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// How long the node has sent nothing (since the connection opened, if ever). A publish
    /// that timed out presumes the connection dead only past its timeout of this: a node busy
    /// with others' publishes, or holding frames while its budgets are full, still answers or
    /// pings.
    pub(super) fn silent_for(&self) -> Duration {
        self.opened.elapsed().saturating_sub(Duration::from_millis(self.heard_ms.load(Ordering::Relaxed)))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every operation leaves the map whole, so a panic elsewhere cannot corrupt it.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers a waiter; hands it back when the connection is already gone (checked under
    /// the same lock `close` drains with, so no waiter is ever left behind).
    pub(super) fn insert(&self, reference: u64, waiter: Waiter) -> Result<(), Waiter> {
        let mut state = self.lock();
        if state.closed.is_some() || state.draining.is_some() {
            return Err(waiter);
        }
        state.waiting.insert(reference, waiter);
        Ok(())
    }

    /// Hands `answer` to the waiter of `reference`; false when there is none.
    pub(super) fn resolve(&self, reference: u64, answer: Answer) -> bool {
        let (waiter, drained) = {
            let mut state = self.lock();
            let waiter = state.waiting.remove(&reference);
            let drained = state.waiting.is_empty().then(|| state.draining.clone()).flatten();
            (waiter, drained)
        };
        if let Some(reason) = drained {
            self.close(&reason);
        }
        match waiter {
            Some(waiter) => {
                // The publish may have been given up (its future dropped); nothing to do then.
                let _ = waiter.reply.send(Ok(answer));
                true
            }
            None => false,
        }
    }

    /// Marks the connection gone and fails every waiter with `reason`. Only the first
    /// reason is kept.
    pub(super) fn close(&self, reason: &str) {
        let (waiting, reason) = {
            let mut state = self.lock();
            let reason: Lost = state.closed.get_or_insert_with(|| Arc::from(reason)).clone();
            (std::mem::take(&mut state.waiting), reason)
        };
        self.slots.close();
        self.gone.send_replace(true);
        for waiter in waiting.into_values() {
            let _ = waiter.reply.send(Err(reason.clone()));
        }
    }

    /// Takes no new publish, but keeps the connection open until the answers still due have
    /// come (or a publish's timeout closes it): a node that is no longer the leader still
    /// answers what it took, and some of those answers are acks. Then closes with `reason`.
    pub(super) fn drain(&self, reason: &str) {
        let empty = {
            let mut state = self.lock();
            state.draining.get_or_insert_with(|| Arc::from(reason));
            state.waiting.is_empty()
        };
        // Publishes waiting for a slot fail now, as new ones do.
        self.slots.close();
        if empty {
            self.close(reason);
        }
    }

    /// Resolves once the map is closed.
    async fn closed(&self) {
        let mut gone = self.gone.subscribe();
        // The sender lives in `self`, so this cannot fail while it is borrowed.
        let _ = gone.wait_for(|gone| *gone).await;
    }

    /// Why the connection takes no new publish, once it does not (closed, or draining).
    pub(super) fn closed_reason(&self) -> Option<Lost> {
        let state = self.lock();
        state.closed.clone().or_else(|| state.draining.clone())
    }

    /// Publishes waiting for an answer.
    pub(super) fn len(&self) -> usize {
        self.lock().waiting.len()
    }
}

/// Starts the writer and the reader of `socket`; returns the reader's handle (the writer
/// stops by itself when the frame senders are gone).
pub(super) fn spawn(socket: Socket, frames: mpsc::Receiver<String>, pending: Arc<Pending>) -> AbortHandle {
    let (sink, stream) = socket.split();
    let writer = tokio::spawn(write(sink, frames, pending.clone())).abort_handle();
    tokio::spawn(read(stream, pending, writer)).abort_handle()
}

/// Sends frames until every sender is gone or the map is closed, then closes the socket.
async fn write(mut sink: SplitSink<Socket, WsMessage>, mut frames: mpsc::Receiver<String>, pending: Arc<Pending>) {
    let socket_usable = tokio::select! {
        // First: frames still queued belong to publishes already told the connection is gone.
        biased;
        () = pending.closed() => true,
        sent_all = pump(&mut sink, &mut frames, &pending) => sent_all,
    };
    if socket_usable {
        // Bounded: the node may have stopped reading (that is why a publish timed out).
        let _ = tokio::time::timeout(PUBLISH_WS_CLOSE_TIMEOUT, sink.send(WsMessage::Close(None))).await;
    }
}

/// Sends frames until every sender is gone (true) or sending fails (false, the map closed).
async fn pump(sink: &mut SplitSink<Socket, WsMessage>, frames: &mut mpsc::Receiver<String>, pending: &Pending) -> bool {
    while let Some(first) = frames.recv().await {
        let mut sent = sink.feed(WsMessage::text(first)).await;
        // Frames queued meanwhile go out with this one: one flush, fewer syscalls under load.
        while sent.is_ok() {
            match frames.try_recv() {
                Ok(frame) => sent = sink.feed(WsMessage::text(frame)).await,
                Err(_) => break,
            }
        }
        if sent.is_ok() {
            sent = sink.flush().await;
        }
        if let Err(e) = sent {
            pending.close(&format!("sending failed: {e}"));
            return false;
        }
    }
    true
}

/// Hands answers to their waiters until the connection ends, then closes the map and stops
/// the writer; or until the map is closed, when the writer sends the close frame.
async fn read(mut stream: SplitStream<Socket>, pending: Arc<Pending>, writer: AbortHandle) {
    let reason = loop {
        let next = tokio::select! {
            () = pending.closed() => return,
            next = stream.next() => next,
        };
        if let Some(Ok(_)) = next {
            pending.heard();
        }
        match next {
            Some(Ok(WsMessage::Text(text))) => on_text(&pending, &text),
            Some(Ok(WsMessage::Close(frame))) => {
                break match frame {
                    Some(f) => format!("the node closed the connection: {} {}", f.code, f.reason),
                    None => "the node closed the connection".to_string(),
                }
            }
            // Pings are answered by tungstenite; nothing else is expected.
            Some(Ok(_)) => {}
            Some(Err(e)) => break format!("receiving failed: {e}"),
            None => break "the connection ended".to_string(),
        }
    };
    tracing::debug!(%reason, "publish connection closed");
    pending.close(&reason);
    writer.abort();
    // After the node's close frame, a read sends the answer tungstenite queued (without it the
    // node waits for the answer, up to 2 s, before it lets the connection go) and sees the end.
    let _ = tokio::time::timeout(PUBLISH_WS_CLOSE_TIMEOUT, stream.next()).await;
}

fn on_text(pending: &Pending, text: &str) {
    match wire::parse_answer(text) {
        Ok((Some(reference), answer)) => {
            if !pending.resolve(reference, answer) {
                tracing::debug!(reference, "answer to a publish no longer waiting");
            }
        }
        // Not ours to pair (a `ref: null` answer to a frame the server could not read): the
        // publish it concerns, if any, ends with its timeout.
        Ok((None, answer)) => tracing::warn!(?answer, "publish answer without a ref of this client"),
        Err(reason) => tracing::warn!(%reason, "unreadable frame on a publish connection"),
    }
}
