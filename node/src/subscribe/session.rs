//! One subscription: a single loop that replays from storage and then follows live.
//!
//! The loop reads a bounded page of messages after its cursor from RocksDB, sends them, and
//! when caught up waits on the topic's watch. A subscriber that falls behind simply reads
//! from storage again: it never makes the apply loop, publishers or other subscribers wait,
//! and its memory is one page, counted against the node's budget of pages read. A cursor below the retained range is announced with
//! `messages_expired` before the subscription continues: loss is never silent.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::ws::{Message, Utf8Bytes, WebSocket};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{FutureExt, SinkExt, Stream, StreamExt};
use openraft::metrics::RaftServerMetrics;
use raft_store::{Node, NodeId};
use serde::Deserialize;
use tokio::sync::futures::Notified;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use super::frames;
use crate::app::SharedApp;
use crate::budget::{ByteBudget, Room};
use crate::limits::{
    SUBSCRIBE_IDLE_TIMEOUT, SUBSCRIBE_PAGE_BYTES_RESERVED, SUBSCRIBE_PAGE_MESSAGES, SUBSCRIBE_PAGE_PAYLOAD_BYTES,
    SUBSCRIBE_PING_INTERVAL,
};
use crate::ws_close;

/// What was agreed before the upgrade.
pub struct Session {
    pub topic: String,
    pub topic_id: u64,
    pub subscriber_id: String,
    /// The effective cursor: messages with a greater sequence are delivered.
    pub cursor: u64,
    /// The topic's watch, made before the request was checked, so that a deletion applied
    /// between the check and the session's start still counts against `deletions_at_start`
    /// (a delete and a re-create there would otherwise go unannounced).
    pub feed: watch::Receiver<raft_store::TopicSignal>,
    pub deletions_at_start: u64,
    /// Its topic had no room to record this subscriber's cursor when it subscribed.
    pub acks_refused: bool,
    /// The client's address: its pages read from storage count against its share of the
    /// node's budget too, so that one client's slow subscriptions make only its own reads wait.
    pub client: Option<IpAddr>,
}

/// Frames a subscriber may send.
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ClientFrame {
    Ack { sequence: u64 },
}

/// Why a session ended.
enum End {
    /// The client went away or the connection failed.
    Gone,
    /// Close with this code and reason.
    Close(u16, &'static str),
}

type Sink = SplitSink<WebSocket, Message>;

/// Counts the session in the node's totals for as long as it lives, from before its upgrade
/// (dropped with the upgrade when that fails).
pub struct Registration {
    app: SharedApp,
    key: (String, String),
}

impl Registration {
    /// Takes one of the node's `max` subscription places; `None` when all are taken. Taken
    /// before the upgrade, in one step, so that concurrent upgrades cannot overshoot.
    pub fn reserve(app: SharedApp, session: &Session, max: usize) -> Option<Self> {
        if app.subscriptions.fetch_add(1, Ordering::Relaxed) >= max {
            app.subscriptions.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        let key = (session.topic.clone(), session.subscriber_id.clone());
        *app.connected.lock().unwrap_or_else(|e| e.into_inner()).entry(key.clone()).or_insert(0) += 1;
        Some(Self { app, key })
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if self.app.subscriptions.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.app.subscriptions_ended.notify_waiters();
        }
        let mut connected = self.app.connected.lock().unwrap_or_else(|e| e.into_inner());
        match connected.get_mut(&self.key) {
            Some(n) if *n > 1 => *n -= 1,
            Some(_) => {
                connected.remove(&self.key);
                // Its refusal was to be told at its next ack here, which will not come: kept,
                // such marks of subscribers gone would fill the set and no one more would be
                // told. Under the lock on connections, as they are marked (`acks.rs`).
                self.app.acks.forget_refused(&self.key);
            }
            None => {}
        }
    }
}

pub async fn run(app: SharedApp, socket: WebSocket, session: Session, registration: Registration) {
    let (sink, stream) = socket.split();
    let mut out = Outbox::new(sink);
    let client_gone = Arc::new(Notify::new());
    let acks_refused = Arc::new(Notify::new());
    let too_large = Arc::new(AtomicBool::new(false));
    let gone = Arc::new(AtomicBool::new(false));
    let stop_listening = CancellationToken::new();
    let listener = tokio::spawn(listen(
        app.clone(),
        stream,
        Listening {
            topic: session.topic.clone(),
            subscriber_id: session.subscriber_id.clone(),
            heard: out.heard.clone(),
            feed: session.feed.clone(),
            stop: stop_listening.clone(),
        },
        Signals {
            client_gone: client_gone.clone(),
            gone: gone.clone(),
            acks_refused: acks_refused.clone(),
            too_large: too_large.clone(),
        },
    ));

    let end = serve(&app, &mut out, &session, &Signals { client_gone, gone, acks_refused, too_large }).await;
    let closing = app.closing.token();
    stop_listening.cancel();
    // No ack is recorded past this point: a stopping node, which waits for every session to
    // get here, can then record the last of them (lib.rs).
    let stream = listener.await;
    drop(registration);
    if let Ok(stream) = stream {
        let frame = match end {
            End::Close(code, reason) => Some((code, reason)),
            End::Gone => None,
        };
        ws_close::close(closing, out.sink, stream, frame).await;
    }
}

/// What the listener needs besides the socket.
struct Listening {
    topic: String,
    subscriber_id: String,
    /// The client's last sign of life, shared with the [`Outbox`].
    heard: Arc<std::sync::Mutex<Instant>>,
    feed: watch::Receiver<raft_store::TopicSignal>,
    /// Cancelled when the session ends: the listener hands the socket's reading half back,
    /// for the close handshake, and records no more acks.
    stop: CancellationToken,
}

/// What the listener tells the session's loop.
struct Signals {
    /// The client closed or its connection failed.
    client_gone: Arc<Notify>,
    /// Set before `client_gone`: for a loop that never waits, which a load sees without the
    /// waiter lock a poll of `client_gone` takes (once per page delivered). Stored with
    /// Release after `too_large`, loaded with Acquire.
    gone: Arc<AtomicBool>,
    /// The cluster refused an ack of this subscriber (its topic filled while it was connected).
    acks_refused: Arc<Notify>,
    /// Set before `client_gone` when the client sent a frame over
    /// [`crate::limits::SUBSCRIBER_FRAME_BYTES_MAX`]: it is told so with close code 1009.
    too_large: Arc<AtomicBool>,
}

impl Signals {
    /// How the session ends once `client_gone` fired.
    fn gone(&self) -> End {
        if self.too_large.load(Ordering::Relaxed) {
            End::Close(1009, "a frame from the subscriber was over the size limit")
        } else {
            End::Gone
        }
    }
}

/// Reads the client's frames until told to stop, or the client is gone: acks go to the
/// coalescer; anything counts as a sign of life. Returns the socket's reading half.
async fn listen(
    app: SharedApp,
    mut stream: SplitStream<WebSocket>,
    l: Listening,
    signals: Signals,
) -> SplitStream<WebSocket> {
    let Listening { topic, subscriber_id, heard, feed, stop } = l;
    let stopped = stop.cancelled();
    tokio::pin!(stopped);
    loop {
        // A frame half read when told to stop stays buffered in the socket (a stream's `next`
        // is cancel-safe): the close handshake reads it.
        let received = tokio::select! {
            biased;
            () = &mut stopped => return stream,
            received = stream.next() => received,
        };
        let Some(received) = received else { break };
        let message = match received {
            Ok(message) => message,
            Err(e) => {
                if crate::api::publish_ws::is_over_size_limit(&e) {
                    signals.too_large.store(true, Ordering::Relaxed);
                }
                break;
            }
        };
        *heard.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        match message {
            Message::Text(text) => match serde_json::from_str::<ClientFrame>(&text) {
                Ok(ClientFrame::Ack { sequence }) => {
                    // An ack past the topic's end means "all of it": the end as of now. Capped
                    // only when the coalesced acks are applied (up to a flush interval later),
                    // it would also cover messages committed meanwhile, never delivered.
                    let sequence = sequence.min(feed.borrow().current_sequence);
                    if app.acks.record(&topic, &subscriber_id, sequence) {
                        signals.acks_refused.notify_one();
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "ignoring an unknown frame from a subscriber")
                }
            },
            Message::Close(_) => break,
            _ => {}
        }
    }
    // Release: a loop that sees it sees `too_large` too (Signals::gone reads it).
    signals.gone.store(true, Ordering::Release);
    signals.client_gone.notify_one();
    stream
}

/// The session's side of the socket, and what it knows of the client's liveness.
///
/// A client is judged gone only when a ping it was sent went unanswered for
/// [`SUBSCRIBE_IDLE_TIMEOUT`] with no other sign of life since. Judging from the last sign of
/// life alone cut off slow readers: one working through a long page answers no ping meanwhile
/// (none was sent) and was closed as silent the moment the page was done.
struct Outbox {
    sink: Sink,
    /// The last sign of life: any frame from the client (its listener sets this), or a write
    /// of ours that waited for room in the socket and got it (the client is taking our bytes).
    heard: Arc<std::sync::Mutex<Instant>>,
    /// When the oldest ping not answered since was sent.
    unanswered_ping: Option<Instant>,
}

impl Outbox {
    fn new(sink: Sink) -> Self {
        Self { sink, heard: Arc::new(std::sync::Mutex::new(Instant::now())), unanswered_ping: None }
    }

    fn heard(&self) -> Instant {
        *self.heard.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends `text` frames, giving up on a client that reads nothing for the idle timeout. The
    /// deadline is per frame (a frame waits only while the socket's buffer is full), so a slow
    /// reader that keeps reading is served, however long a page takes it.
    async fn send_all<T: Into<Utf8Bytes>>(&mut self, texts: impl IntoIterator<Item = T>) -> Result<(), End> {
        for text in texts {
            within_idle_timeout(&self.heard, self.sink.feed(Message::Text(text.into()))).await?;
        }
        within_idle_timeout(&self.heard, self.sink.flush()).await
    }

    /// The liveness check, each [`SUBSCRIBE_PING_INTERVAL`]: ends the session when a ping went
    /// unanswered for [`SUBSCRIBE_IDLE_TIMEOUT`] with no sign of life since, else pings.
    async fn keep_alive(&mut self) -> Result<(), End> {
        if let Some(sent) = self.unanswered_ping {
            if self.heard() > sent {
                self.unanswered_ping = None;
            } else if sent.elapsed() > SUBSCRIBE_IDLE_TIMEOUT {
                return Err(End::Close(1001, "no pong from subscriber"));
            }
        }
        within_idle_timeout(&self.heard, self.sink.send(Message::Ping(Default::default()))).await?;
        self.unanswered_ping.get_or_insert_with(Instant::now);
        Ok(())
    }
}

/// Runs one write to the socket, for at most [`SUBSCRIBE_IDLE_TIMEOUT`]. The deadline's timer
/// is armed only when the write has to wait for room in the socket's buffer: on a fan-out
/// every frame to every subscriber passes here, and nearly all go out at once. A write that
/// waited and got room is a sign of life.
async fn within_idle_timeout<F>(heard: &std::sync::Mutex<Instant>, mut write: F) -> Result<(), End>
where
    F: Future<Output = Result<(), axum::Error>> + Unpin,
{
    let written = match (&mut write).now_or_never() {
        Some(written) => written,
        None => {
            let written = tokio::time::timeout(SUBSCRIBE_IDLE_TIMEOUT, write)
                .await
                .map_err(|_| End::Close(1008, "subscriber stopped reading"))?;
            *heard.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
            written
        }
    };
    written.map_err(|_| End::Gone)
}

async fn serve(app: &SharedApp, out: &mut Outbox, s: &Session, signals: &Signals) -> End {
    match serve_inner(app, out, s, signals).await {
        Ok(end) | Err(end) => end,
    }
}

async fn serve_inner(app: &SharedApp, out: &mut Outbox, s: &Session, signals: &Signals) -> Result<End, End> {
    let mut watch = s.feed.clone();
    let deletions_at_start = s.deletions_at_start;
    let server = app.raft.server_metrics();
    let mut last_leader = server.borrow().current_leader;
    let mut ping = tokio::time::interval(SUBSCRIBE_PING_INTERVAL);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ping.reset();
    let mut cursor = s.cursor;
    // This client's share of the pages-read budget, looked up once (pages come from the
    // cache once per message on a fan-out).
    let own_pages = s.client.map(|ip| app.client_read_pages.of(ip));
    // Created once, not on every turn of the loop: each turn woken by a message would
    // otherwise register and unregister two more waiters (a node's profile showed them).
    let client_gone = signals.client_gone.notified();
    tokio::pin!(client_gone);
    let acks_refused = signals.acks_refused.notified();
    tokio::pin!(acks_refused);
    // Told once per session: at the start, or when its topic fills while it is connected.
    let mut told_acks_refused = s.acks_refused;
    let shutdown = app.shutdown.cancelled();
    tokio::pin!(shutdown);
    let leaders = leader_changes(server);
    tokio::pin!(leaders);
    // A leaderless spell that began before this session does not close it (its client may
    // have had nowhere else to go); one that lasts long enough during it does. One future for
    // the session, like the others: not a waiter registered again on every turn.
    let opened = tokio::time::Instant::now();
    let mut spells = app.leaderless_spells.subscribe();
    let leaderless = async move {
        loop {
            if spells.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
            if spells.borrow_and_update().is_some_and(|began| began >= opened) {
                return;
            }
        }
    };
    tokio::pin!(leaderless);
    out.send_all([frames::subscribed(&s.topic, cursor, &s.subscriber_id)]).await?;
    if s.acks_refused {
        out.send_all([frames::acks_not_recorded(&s.topic, &s.subscriber_id)]).await?;
    }

    loop {
        let signal = *watch.borrow_and_update();
        // Deleted since the session started, perhaps created again since: what came before
        // the deletion is delivered, then the notice, even if the topic is live again.
        // Deleted now and not since the start: the session started on the deleted topic, owed
        // what came before the deletion (a client resuming); created again meanwhile, the
        // topic goes on from there with no gap, as for a client resuming after the re-creation.
        let deleted_since_start = signal.deletions != deletions_at_start;
        let last = if deleted_since_start { signal.deleted_after(deletions_at_start) } else { signal.current_sequence };
        let ends_at_deletion = deleted_since_start || signal.deleted;
        if let Some((requested, first)) = skip_expired(&mut cursor, signal.first_sequence, last, ends_at_deletion) {
            out.send_all([frames::messages_expired(&s.topic, requested, first)]).await?;
        }
        if cursor < last {
            let mut page = app.frames.get(s.topic_id, cursor, SUBSCRIBE_PAGE_MESSAGES, SUBSCRIBE_PAGE_PAYLOAD_BYTES);
            // A page counts against the node's budget of pages read until it is sent.
            let _reserved = if page.is_empty() {
                // One from storage reserves its worst case before the read. Others' pages may
                // take long to send to slow readers: keep pinging meanwhile, and keep this
                // place in the queue.
                let take = Room::take(&app.read_pages, own_pages.as_ref(), SUBSCRIBE_PAGE_BYTES_RESERVED, None);
                let waiting =
                    Waiting { ping: &mut ping, client_gone: client_gone.as_mut(), shutdown: shutdown.as_mut() };
                let mut room =
                    waiting.wait(take, out, signals).await?.expect("a wait without a deadline ends with room");
                page = read_page(app, s, cursor)?;
                room.shrink(frame_bytes(&page));
                PageHold { _room: Some(room), ..Default::default() }
            } else if let Some(room) = Room::try_take(&app.read_pages, own_pages.as_ref(), frame_bytes(&page)) {
                // One from the cache counts when there is room: its frames are shared with the
                // cache, which has a bound of its own. It counts against its client's share
                // too: one client's many slow sessions, each counting the same shared frames,
                // would otherwise fill the node's budget and hold up every other client's
                // reads from storage.
                PageHold { _room: Some(room), ..Default::default() }
            } else if let Some(own) = own_pages.as_ref() {
                // Without room, a page from the cache still never waits for the node's budget:
                // a live subscriber must not wait behind other clients' slow readers. But it
                // holds, beyond the cache, a page of frames the cache may drop while it is sent
                // (at most 1 MiB and a message), and one client's many slow sessions, each at a
                // different point of a busy topic, would each hold one uncounted. So it waits
                // for its client's own share: behind that client's own slow readers only. It
                // waits holding nothing (a page held while waiting is what the share bounds),
                // then takes the page again; gone from the cache meanwhile, it is read from
                // storage the usual way, on the next turn.
                let bytes = frame_bytes(&page);
                drop(page);
                let waiting =
                    Waiting { ping: &mut ping, client_gone: client_gone.as_mut(), shutdown: shutdown.as_mut() };
                let mut permit = waiting.wait(own.take(bytes), out, signals).await?;
                page = app.frames.get(s.topic_id, cursor, SUBSCRIBE_PAGE_MESSAGES, SUBSCRIBE_PAGE_PAYLOAD_BYTES);
                if page.is_empty() {
                    continue;
                }
                // More may have come since: the page is never larger than the permit.
                page.truncate(fitting(&page, bytes));
                ByteBudget::shrink(&mut permit, frame_bytes(&page));
                PageHold { _own_share: Some(permit), ..Default::default() }
            } else {
                PageHold::default()
            };
            if deliver_page(app, out, s, &mut cursor, last, ends_at_deletion, page).await? {
                // A long replay or a busy topic never waits in the select below: keep pinging
                // on this path too, or a client that only answers pings (a browser) is never
                // pinged, and cut off as silent once the delivery lets up.
                if ping.tick().now_or_never().is_some() {
                    out.keep_alive().await?;
                }
                // Nor does it see a shutdown there, or its client gone (the listener ended: a
                // frame over the limit is then closed 1009 at once, not after a long replay).
                if app.shutdown.is_cancelled() {
                    return Ok(End::Close(1001, "server shutting down"));
                }
                if signals.gone.load(Ordering::Acquire) {
                    return Ok(signals.gone());
                }
                continue;
            }
            // Storage holds nothing after the cursor yet the signal says there is more: a
            // snapshot install is rewriting it. The install signals when done; spinning here
            // would hold every session of this delivery thread until then.
        } else if ends_at_deletion {
            out.send_all([frames::topic_deleted(&s.topic)]).await?;
            return Ok(End::Close(1000, "topic deleted"));
        }
        tokio::select! {
            changed = watch.changed() => if changed.is_err() { return Ok(End::Close(1011, "topic feed closed")) },
            leader = leaders.next() => {
                let Some(leader) = leader else {
                    return Ok(End::Close(1001, "node shutting down"));
                };
                if let Some(id) = leader.filter(|_| leader != last_leader) {
                    last_leader = leader;
                    out.send_all([frames::leader_change(&addr_of(app, id), id)]).await?;
                }
            }
            _ = ping.tick() => out.keep_alive().await?,
            () = &mut leaderless => return Ok(End::Close(1013, "this node has no leader: resume on another node")),
            () = &mut acks_refused, if !told_acks_refused => {
                told_acks_refused = true;
                out.send_all([frames::acks_not_recorded(&s.topic, &s.subscriber_id)]).await?;
            }
            () = &mut client_gone => return Ok(signals.gone()),
            () = &mut shutdown => return Ok(End::Close(1001, "server shutting down")),
        }
    }
}

/// What a session waits with for room in the budget of pages read: others' pages may take
/// long to send to slow readers, so it keeps pinging meanwhile, and ends when its client goes
/// or the node stops.
struct Waiting<'a, 'f> {
    ping: &'a mut tokio::time::Interval,
    client_gone: Pin<&'a mut Notified<'f>>,
    shutdown: Pin<&'a mut WaitForCancellationFuture<'f>>,
}

impl Waiting<'_, '_> {
    /// `room` once it comes, keeping its place in the queue; `Err` with how the session ends
    /// when the client goes or the node stops first.
    async fn wait<T>(mut self, room: impl Future<Output = T>, out: &mut Outbox, signals: &Signals) -> Result<T, End> {
        tokio::pin!(room);
        loop {
            tokio::select! {
                biased;
                room = &mut room => return Ok(room),
                _ = self.ping.tick() => out.keep_alive().await?,
                () = &mut self.client_gone => return Err(signals.gone()),
                () = &mut self.shutdown => return Err(End::Close(1001, "server shutting down")),
            }
        }
    }
}

/// What a page holds of the budget of pages read until it is sent (see the session loop):
/// room in the node's budget and its client's share, or, for a page from the cache the node's
/// budget had no room for, its client's share alone.
#[derive(Default)]
struct PageHold {
    _room: Option<Room>,
    _own_share: Option<tokio::sync::OwnedSemaphorePermit>,
}

fn frame_bytes(page: &[(u64, Utf8Bytes)]) -> usize {
    page.iter().map(|(_, frame)| frame.len()).sum()
}

/// How many of `page`'s first frames fit in `bytes`, taken for a page that started with the same
/// frame: at least that one (a safeguard; it always fits).
fn fitting(page: &[(u64, Utf8Bytes)], bytes: usize) -> usize {
    let mut total = 0;
    let fit = page.iter().take_while(|(_, frame)| {
        total += frame.len();
        total <= bytes
    });
    fit.count().max(1)
}

/// Reads the page after `cursor` from storage, as frames, and shares them through the cache.
fn read_page(app: &SharedApp, s: &Session, cursor: u64) -> Result<Vec<(u64, Utf8Bytes)>, End> {
    let stored =
        app.reader.read_messages_within(s.topic_id, cursor, SUBSCRIBE_PAGE_MESSAGES, SUBSCRIBE_PAGE_PAYLOAD_BYTES);
    let stored = stored.map_err(|e| {
        tracing::error!(error = %e, "subscription cannot read storage");
        End::Close(1011, "storage error")
    })?;
    let page: Vec<_> = stored
        .iter()
        .map(|(sequence, message)| (*sequence, Utf8Bytes::from(frames::message(&s.topic, *sequence, message))))
        .collect();
    app.frames.put(s.topic_id, &page);
    Ok(page)
}

/// Sends `page`, the messages after `cursor`, up to `last` (a deletion's sequence when
/// `ends_at_deletion`), and moves the cursor past them. Messages trimmed meanwhile are
/// announced with `messages_expired`. False when the page is empty (storage had nothing after
/// the cursor; the cursor did not move).
async fn deliver_page(
    app: &SharedApp,
    out: &mut Outbox,
    s: &Session,
    cursor: &mut u64,
    last: u64,
    ends_at_deletion: bool,
    page: Vec<(u64, Utf8Bytes)>,
) -> Result<bool, End> {
    let Some(&(first, _)) = page.first() else { return Ok(false) };
    let mut frames_out = Vec::with_capacity(page.len() + 1);
    let mut delivered = 0;
    for (sequence, frame) in page {
        debug_assert!(sequence > *cursor);
        if sequence > last {
            break;
        }
        if sequence != *cursor + 1 {
            // Trimmed between the signal and the read: say so, then go on.
            frames_out.push(Utf8Bytes::from(frames::messages_expired(&s.topic, *cursor, sequence)));
        }
        frames_out.push(frame);
        *cursor = sequence;
        delivered += 1;
    }
    if first > last {
        // Everything after the cursor up to `last` was trimmed meanwhile (storage is ahead of
        // the signal read): announced once, here, not again when the signal catches up.
        if let Some((requested, first)) = skip_expired(cursor, first, last, ends_at_deletion) {
            frames_out.push(Utf8Bytes::from(frames::messages_expired(&s.topic, requested, first)));
        }
    }
    out.send_all(frames_out).await?;
    app.metrics.delivered.inc_by(delivered);
    Ok(true)
}

/// When the first message kept is `first_kept` and the subscriber is owed everything after
/// `cursor` up to `last`: the `messages_expired` notice to send, as (requested cursor, first
/// available), with the cursor moved past what is gone. Up to a deletion (`ends_at_deletion`),
/// what is owed ends at `last`: messages kept after it belong to the topic created again, so
/// the notice says `last + 1` and `topic_deleted` follows, with no second notice.
fn skip_expired(cursor: &mut u64, first_kept: u64, last: u64, ends_at_deletion: bool) -> Option<(u64, u64)> {
    let first_owed = if ends_at_deletion { first_kept.min(last + 1) } else { first_kept };
    if first_owed <= *cursor + 1 {
        return None;
    }
    let requested = *cursor;
    *cursor = first_owed - 1;
    Some((requested, first_owed))
}

/// The leader each time the server's metrics change; ends when Raft shuts down. A stream, so
/// one waiter lives across the loop's turns instead of one registered and dropped on every
/// delivery (the watch is shared by every subscription on the node).
fn leader_changes(server: watch::Receiver<RaftServerMetrics<NodeId, Node>>) -> impl Stream<Item = Option<NodeId>> {
    futures_util::stream::unfold(server, |mut server| async move {
        server.changed().await.ok()?;
        let leader = server.borrow_and_update().current_leader;
        Some((leader, server))
    })
}

/// Where clients reach node `id` (`App::client_address`; "" when not in the membership).
fn addr_of(app: &SharedApp, id: u64) -> String {
    let metrics = app.raft.metrics();
    let m = metrics.borrow();
    m.membership_config.membership().get_node(&id).map(|n| app.client_address(id, &n.addr)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::skip_expired;

    /// Storage ahead of the signal: trimmed to 16 while the signal still ended at 10. One
    /// notice, and none when the signal catches up.
    #[test]
    fn a_trim_seen_in_storage_first_is_announced_once() {
        let mut cursor = 4;
        assert_eq!(skip_expired(&mut cursor, 16, 10, false), Some((4, 16)));
        assert_eq!(cursor, 15);
        assert_eq!(skip_expired(&mut cursor, 16, 20, false), None, "the signal caught up");
        assert_eq!(cursor, 15);
    }

    /// Deleted at 10, created again and trimmed to 16: what was owed ended at 10, so the
    /// notice says 11 (not the new topic's 16) and the check that follows says nothing more.
    #[test]
    fn a_trim_past_a_deletion_is_announced_up_to_the_deletion_once() {
        let mut cursor = 4;
        assert_eq!(skip_expired(&mut cursor, 16, 10, true), Some((4, 11)));
        assert_eq!(cursor, 10);
        assert_eq!(skip_expired(&mut cursor, 16, 10, true), None);
        // A trim within what was owed is announced as it is.
        let mut cursor = 4;
        assert_eq!(skip_expired(&mut cursor, 8, 10, true), Some((4, 8)));
        assert_eq!(cursor, 7);
    }

    #[test]
    fn no_gap_no_notice() {
        let mut cursor = 4;
        assert_eq!(skip_expired(&mut cursor, 5, 10, false), None);
        assert_eq!(skip_expired(&mut cursor, 1, 10, true), None);
        assert_eq!(cursor, 4);
    }
}
