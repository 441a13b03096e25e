//! The client side of the Raft transport.
//!
//! [`PeerPool`] keeps one [`PeerConn`] per peer for the life of the process; openraft's
//! `new_client` (called for every replication stream and every election) only hands out a
//! cheap [`PeerClient`] over it. A `PeerConn` is a task owning one WebSocket: it dials when
//! there is something to send, writes requests tagged with ids, and routes each response to
//! its caller by id, so a vote never queues behind a large AppendEntries.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::http::header::AUTHORIZATION;
use axum::http::HeaderValue;
use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use openraft::error::{NetworkError, PayloadTooLarge, RaftError, RemoteError, Unreachable};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use raft_store::typ::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotError, InstallSnapshotRequest, InstallSnapshotResponse,
    RPCError, VoteRequest, VoteResponse,
};
use raft_store::{Node, NodeId, TypeConfig};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;

use super::codec::{decode, encode, frame_id, Frame, RpcRequest, RpcResponse};
use super::CLUSTER_ID_HEADER;
use crate::limits::{
    APPEND_ENTRIES_BYTES_MAX, PEER_BACKOFF_FIRST, PEER_BACKOFF_MAX, PEER_CALL_TIMEOUT_MARGIN, PEER_DIAL_TIMEOUT,
    PEER_QUEUE_LEN, PEER_STALL_TIMEOUT, RAFT_MESSAGE_BYTES_MAX, RAFT_READ_BUFFER_BYTES,
};
use crate::net::{BoxedStream, Env};

/// Why an RPC did not get an answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TransportError {
    /// Could not reach the peer at all: openraft backs off before trying again.
    #[error("unreachable: {0}")]
    Unreachable(String),
    /// The connection broke or the answer could not be read: openraft may retry at once.
    #[error("network: {0}")]
    Network(String),
    #[error("timed out after {0:?}")]
    Timeout(Duration),
}

/// WebSocket limits of the Raft connection, both sides.
pub fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(RAFT_READ_BUFFER_BYTES)
        .max_message_size(Some(RAFT_MESSAGE_BYTES_MAX))
        .max_frame_size(Some(RAFT_MESSAGE_BYTES_MAX))
}

/// What this node presents when it dials a peer: the cluster secret, and its cluster's id
/// once one is applied.
#[derive(Clone)]
pub struct Introduction {
    pub secret: Option<String>,
    /// Asked at each dial: the id is applied some time after the node starts.
    pub cluster_id: Arc<dyn Fn() -> Option<String> + Send + Sync>,
}

/// Connections to every peer, shared by all Raft clients of this node.
pub struct PeerPool {
    env: Env,
    intro: Introduction,
    conns: Mutex<HashMap<(NodeId, String), Arc<PeerConn>>>,
    /// When each peer last answered one of this node's RPCs (a leader's heartbeats go out
    /// every heartbeat interval, so a live follower answers that often).
    answered: Mutex<HashMap<NodeId, Instant>>,
}

impl PeerPool {
    pub fn new(env: Env, intro: Introduction) -> Arc<Self> {
        Arc::new(Self { env, intro, conns: Mutex::new(HashMap::new()), answered: Mutex::new(HashMap::new()) })
    }

    /// Whether peer `id` answered an RPC of this node within `within`.
    pub fn answered_within(&self, id: NodeId, within: Duration) -> bool {
        let answered = self.answered.lock().unwrap_or_else(|e| e.into_inner());
        answered.get(&id).is_some_and(|at| at.elapsed() <= within)
    }

    fn note_answered(&self, id: NodeId) {
        self.answered.lock().unwrap_or_else(|e| e.into_inner()).insert(id, Instant::now());
    }

    /// The connection to `target` at `addr`, created (not yet dialed) on first use.
    pub fn conn(&self, target: NodeId, addr: &str) -> Arc<PeerConn> {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns
            .entry((target, addr.to_string()))
            .or_insert_with(|| PeerConn::spawn(self.env.clone(), target, addr.to_string(), self.intro.clone()))
            .clone()
    }
}

/// Where a request's answer goes.
type Reply = oneshot::Sender<Result<RpcResponse, TransportError>>;

struct Outgoing {
    id: u64,
    frame: Vec<u8>,
    reply: Reply,
}

/// One multiplexed WebSocket to one peer.
pub struct PeerConn {
    queue: mpsc::Sender<Outgoing>,
    next_id: AtomicU64,
    /// While the connection task dials again after a dial that failed: why that one failed.
    redialing: Arc<Mutex<Option<String>>>,
}

impl PeerConn {
    fn spawn(env: Env, target: NodeId, addr: String, intro: Introduction) -> Arc<Self> {
        let (queue, rx) = mpsc::channel(PEER_QUEUE_LEN);
        let redialing = Arc::new(Mutex::new(None));
        tokio::spawn(run_conn(env, Peer { id: target, addr }, intro, rx, redialing.clone()));
        Arc::new(Self { queue, next_id: AtomicU64::new(1), redialing })
    }

    /// Sends `request` and waits at most `timeout` for its response.
    ///
    /// Fails at once, unreachable, while the peer is being dialed again after a failed dial:
    /// against a blackholed address a dial lasts up to [`PEER_DIAL_TIMEOUT`], longer than a
    /// heartbeat's deadline, so each heartbeat would time out instead, which openraft retries
    /// at once (logging each) rather than backing off as it does from an unreachable peer.
    pub async fn call(&self, request: RpcRequest, timeout: Duration) -> Result<RpcResponse, TransportError> {
        if let Some(reason) = self.redialing.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            return Err(TransportError::Unreachable(format!("{reason} (dialing again)")));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = encode(&Frame { id, body: request }).map_err(|e| TransportError::Network(e.to_string()))?;
        let (reply, response) = oneshot::channel();
        let exchange = async {
            self.queue
                .send(Outgoing { id, frame, reply })
                .await
                .map_err(|_| TransportError::Unreachable("connection task stopped".into()))?;
            response.await.map_err(|_| TransportError::Network("connection dropped the request".into()))?
        };
        tokio::time::timeout(timeout, exchange).await.map_err(|_| TransportError::Timeout(timeout))?
    }
}

/// The peer a connection goes to.
struct Peer {
    id: NodeId,
    addr: String,
}

/// Whether a peer could be reached, as the operator should hear of it: once when it cannot
/// be, once when it can again, not at every retry (openraft logs those).
#[derive(Default)]
struct Reachability {
    /// A dial ever succeeded.
    reached: bool,
    /// Since when dials fail, and the last one's error.
    failing: Option<(Instant, String)>,
}

impl Reachability {
    fn dial_failed(&mut self, peer: &Peer, error: &TransportError) {
        let reason = match error {
            TransportError::Unreachable(reason) | TransportError::Network(reason) => reason.clone(),
            TransportError::Timeout(_) => error.to_string(),
        };
        if self.failing.is_none() {
            if self.reached {
                tracing::warn!(peer = peer.id, addr = %peer.addr, %reason, "lost the connection to a peer; dialing it again");
            } else {
                tracing::info!(peer = peer.id, addr = %peer.addr, %reason, "cannot reach a peer yet; dialing it again");
            }
        }
        let since = self.failing.take().map_or_else(Instant::now, |(since, _)| since);
        self.failing = Some((since, reason));
    }

    fn dialed(&mut self, peer: &Peer) {
        if let Some((since, _)) = self.failing.take() {
            let after = format!("{:.1?}", since.elapsed());
            tracing::info!(peer = peer.id, addr = %peer.addr, %after, "reached the peer");
        }
        self.reached = true;
    }

    fn last_error(&self) -> Option<&str> {
        self.failing.as_ref().map(|(_, reason)| reason.as_str())
    }
}

type Ws = tokio_tungstenite::WebSocketStream<crate::net::BoxedStream>;

/// Dials `addr` presenting the secret and, when one is known, the cluster id; returns the
/// connection and whether it presented an id.
async fn dial(
    env: &Env,
    addr: &str,
    intro: &Introduction,
    progress: &Arc<WriteProgress>,
) -> Result<(Ws, bool), TransportError> {
    let unreachable = |e: &dyn std::fmt::Display| TransportError::Unreachable(format!("{addr}: {e}"));
    let inner = env.dialer.dial(addr).await.map_err(|e| unreachable(&e))?;
    let stream: BoxedStream = Box::new(Metered { inner, progress: progress.clone() });
    let mut request = format!("ws://{addr}/raft").into_client_request().map_err(|e| unreachable(&e))?;
    if let Some(secret) = &intro.secret {
        let value = HeaderValue::from_str(&format!("Bearer {secret}")).map_err(|e| unreachable(&e))?;
        request.headers_mut().insert(AUTHORIZATION, value);
    }
    let cluster_id = (intro.cluster_id)();
    if let Some(id) = &cluster_id {
        let value = HeaderValue::from_str(id).map_err(|e| unreachable(&e))?;
        request.headers_mut().insert(CLUSTER_ID_HEADER, value);
    }
    let (ws, _) =
        tokio_tungstenite::client_async_with_config(request, stream, Some(ws_config())).await.map_err(|e| match e {
            // A refusal (401, 403 wrong_cluster) says why in its error body: log that, not just
            // the status.
            tokio_tungstenite::tungstenite::Error::Http(response) => {
                let body = response.body().as_deref().map(String::from_utf8_lossy).unwrap_or_default();
                unreachable(&format!("refused with {}: {body}", response.status()))
            }
            e => unreachable(&e),
        })?;
    Ok((ws, cluster_id.is_some()))
}

/// The connection task: dial on demand, pump requests out and responses back.
async fn run_conn(
    env: Env,
    peer: Peer,
    intro: Introduction,
    mut rx: mpsc::Receiver<Outgoing>,
    redialing: Arc<Mutex<Option<String>>>,
) {
    let addr = &peer.addr;
    let mut reachability = Reachability::default();
    // A request held back from a connection being closed, to go first on the next one.
    let mut carried: Option<Outgoing> = None;
    loop {
        let first = match carried.take() {
            Some(out) => out,
            None => match rx.recv().await {
                Some(out) => out,
                None => return,
            },
        };
        let progress = WriteProgress::new();
        let set_redialing = |reason: Option<&str>| {
            *redialing.lock().unwrap_or_else(|e| e.into_inner()) = reason.map(str::to_string);
        };
        set_redialing(reachability.last_error());
        let dialed = tokio::time::timeout(PEER_DIAL_TIMEOUT, dial(&env, addr, &intro, &progress))
            .await
            .unwrap_or_else(|_| Err(TransportError::Unreachable(format!("{addr}: dial timed out"))));
        set_redialing(None);
        let (ws, presented_id) = match dialed {
            Ok(dialed) => {
                reachability.dialed(&peer);
                dialed
            }
            Err(e) => {
                reachability.dial_failed(&peer, &e);
                fail_queued(first, &mut rx, e);
                continue;
            }
        };
        tracing::debug!(peer = %addr, "raft connection open");
        let (mut sink, mut stream) = ws.split();
        let mut pending: HashMap<u64, Reply> = HashMap::new();
        let mut next = Some(first);
        let mut quiet_since = Instant::now();
        // A request went out and nothing came back since. Not the same as `pending`, whose
        // callers may have given up: votes and pre-votes give up within an election timeout,
        // before the stall check sees them, and on a connection stuck in TCP's retransmission
        // backoff (a partition that lasted) each would start the silence over, so the
        // connection would never be dropped and dialed again once the partition heals.
        let mut unanswered = false;
        let mut check = tokio::time::interval(PEER_STALL_TIMEOUT / 3);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let reason: String = loop {
            if let Some(out) = next.take() {
                if out.reply.is_closed() {
                    continue;
                }
                if must_present_id(presented_id, &mut pending, &intro) {
                    carried = Some(out);
                    break "dialing again to present the cluster id, known now".into();
                }
                let was_idle = pending.is_empty() && !unanswered;
                pending.insert(out.id, out.reply);
                unanswered = true;
                if let Err(e) = write_moving(&mut sink, Message::Binary(out.frame.into()), &progress).await {
                    break e;
                }
                // Silence is counted from when the request was out, not from before a long
                // write (a snapshot chunk on a slow link).
                if was_idle {
                    quiet_since = Instant::now();
                }
                continue;
            }
            // Answers first: after a long write, those already in the socket must count
            // before the stall check does.
            tokio::select! {
                biased;
                msg = stream.next() => match msg {
                    Some(Ok(Message::Binary(bytes))) => {
                        quiet_since = Instant::now();
                        unanswered = false;
                        match decode::<RpcResponse>(&bytes) {
                            Ok(frame) => {
                                if let Some(reply) = pending.remove(&frame.id) {
                                    let _ = reply.send(Ok(frame.body));
                                }
                            }
                            // An answer of a newer build: only its request fails.
                            Err(e) => match frame_id(&bytes) {
                                Some(id) => {
                                    if let Some(reply) = pending.remove(&id) {
                                        let e = TransportError::Unreachable(format!("{addr}: unreadable answer: {e}"));
                                        let _ = reply.send(Err(e));
                                    }
                                }
                                None => break format!("unreadable frame: {e}"),
                            },
                        }
                    }
                    Some(Ok(Message::Close(_))) | None => break "closed by peer".into(),
                    // Pongs among them: the peer is there, however slow its answers.
                    Some(Ok(_)) => {
                        quiet_since = Instant::now();
                        unanswered = false;
                    }
                    Some(Err(e)) => break e.to_string(),
                },
                out = rx.recv() => match out {
                    Some(out) => next = Some(out),
                    None => return,
                },
                _ = check.tick() => {
                    // As before a request, for a connection that has none to send.
                    if must_present_id(presented_id, &mut pending, &intro) {
                        break "dialing again to present the cluster id, known now".into();
                    }
                    pending.retain(|_, reply| !reply.is_closed());
                    if pending.is_empty() && !unanswered {
                        continue;
                    }
                    let quiet = quiet_since.elapsed();
                    if quiet > PEER_STALL_TIMEOUT {
                        break "stalled: no response".into();
                    }
                    // An answer may take seconds (the last chunk of a snapshot is answered
                    // once it is installed): a ping asks the peer's socket, which answers at
                    // once, whether the peer is still there. Dropped, the connection would
                    // fail every request on it and the snapshot would be sent again.
                    if quiet >= PEER_STALL_TIMEOUT / 3 {
                        if let Err(e) = write_moving(&mut sink, Message::Ping(Default::default()), &progress).await {
                            break e;
                        }
                    }
                }
            }
        };
        tracing::debug!(peer = %addr, %reason, "raft connection closed");
        for (_, reply) in pending.drain() {
            let _ = reply.send(Err(TransportError::Network(reason.clone())));
        }
    }
}

/// Whether a connection dialed before this node knew its cluster's id (a new cluster's first
/// election) is to be dialed again now, with it: the peer could not check the id, and a node of
/// another cluster at that address would take our entries for as long as the connection
/// lasts, while a peer of ours that knows the id by now closes it at its next request. Only
/// between requests (none waits for an answer), so that no caller sees the connection end.
/// Nothing to do, and nothing asked, once the id went with the dial.
fn must_present_id(presented_id: bool, pending: &mut HashMap<u64, Reply>, intro: &Introduction) -> bool {
    if presented_id {
        return false;
    }
    pending.retain(|_, reply| !reply.is_closed());
    pending.is_empty() && (intro.cluster_id)().is_some()
}

/// When a peer stream last wrote a byte: a write on a slow link moves, a stalled one does not.
struct WriteProgress {
    base: Instant,
    /// Nanoseconds from `base` to the last write that moved bytes.
    last: AtomicU64,
}

impl WriteProgress {
    fn new() -> Arc<Self> {
        Arc::new(Self { base: Instant::now(), last: AtomicU64::new(0) })
    }

    fn note(&self) {
        self.last.store(self.base.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    fn stalled_for(&self) -> Duration {
        self.base.elapsed().saturating_sub(Duration::from_nanos(self.last.load(Ordering::Relaxed)))
    }
}

/// A peer stream that notes its write progress.
struct Metered {
    inner: BoxedStream,
    progress: Arc<WriteProgress>,
}

impl AsyncRead for Metered {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Metered {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            self.progress.note();
        }
        written
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            self.progress.note();
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Writes `message`, however long a slow link takes, unless it moves no byte for
/// [`PEER_STALL_TIMEOUT`]: a peer that stopped reading (blackholed, hung) fills the sockets'
/// buffers and the write would never end, holding every later request, heartbeats included.
async fn write_moving(
    sink: &mut SplitSink<Ws, Message>,
    message: Message,
    progress: &WriteProgress,
) -> Result<(), String> {
    progress.note();
    let send = sink.send(message);
    tokio::pin!(send);
    // One timer per write, as long as the write keeps moving (nearly always done at once).
    loop {
        let left = PEER_STALL_TIMEOUT.saturating_sub(progress.stalled_for());
        if left.is_zero() {
            return Err("stalled: a write moved nothing".into());
        }
        if let Ok(sent) = tokio::time::timeout(left, &mut send).await {
            return sent.map_err(|e| e.to_string());
        }
    }
}

fn fail_queued(first: Outgoing, rx: &mut mpsc::Receiver<Outgoing>, error: TransportError) {
    let _ = first.reply.send(Err(error.clone()));
    while let Ok(out) = rx.try_recv() {
        let _ = out.reply.send(Err(error.clone()));
    }
}

/// openraft's network factory.
#[derive(Clone)]
pub struct Network {
    pool: Arc<PeerPool>,
}

impl Network {
    pub fn new(pool: Arc<PeerPool>) -> Self {
        Self { pool }
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &Node) -> PeerClient {
        PeerClient { target, conn: self.pool.conn(target, &node.addr), pool: self.pool.clone(), entries_cap: None }
    }
}

/// openraft's handle for RPCs to one peer.
pub struct PeerClient {
    target: NodeId,
    conn: Arc<PeerConn>,
    pool: Arc<PeerPool>,
    /// Set when an AppendEntries of several entries timed out: the next one carries at most
    /// this many. openraft never shrinks a batch after a timeout by itself, so on a link too
    /// slow for a full batch within its deadline a lagging follower would never catch up.
    entries_cap: Option<u64>,
}

/// A peer's own error, as openraft should take it. A `Fatal` one means the peer's Raft has
/// stopped (its storage failed): reported as unreachable so that openraft backs off instead
/// of sending the same entries again at once, in a loop, until the peer is restarted.
fn remote_error<E: std::error::Error>(target: NodeId, e: RaftError<NodeId, E>) -> RPCError<E> {
    match e {
        RaftError::Fatal(fatal) => {
            tracing::warn!(peer = target, error = %fatal, "the peer's Raft has stopped");
            RPCError::Unreachable(Unreachable::new(&fatal))
        }
        RaftError::APIError(api) => RPCError::RemoteError(RemoteError::new(target, RaftError::APIError(api))),
    }
}

fn transport_error<E: std::error::Error>(e: TransportError) -> RPCError<E> {
    match e {
        TransportError::Unreachable(_) => RPCError::Unreachable(Unreachable::new(&e)),
        TransportError::Network(_) | TransportError::Timeout(_) => RPCError::Network(NetworkError::new(&e)),
    }
}

impl PeerClient {
    async fn call<E: std::error::Error>(
        &self,
        request: RpcRequest,
        option: &RPCOption,
    ) -> Result<RpcResponse, RPCError<E>> {
        self.call_raw(request, option).await.map_err(transport_error)
    }

    async fn call_raw(&self, request: RpcRequest, option: &RPCOption) -> Result<RpcResponse, TransportError> {
        // openraft bounds some calls by the same deadline and treats its own expiry
        // differently (a snapshot chunk is then not retried): the margin lets its timer win.
        self.call_within(request, option.hard_ttl() + PEER_CALL_TIMEOUT_MARGIN).await
    }

    async fn call_within(&self, request: RpcRequest, timeout: Duration) -> Result<RpcResponse, TransportError> {
        let response = self.conn.call(request, timeout).await?;
        // Unreachable, so openraft backs off; logged here, as openraft logs an unreachable
        // peer at debug only (the dial failures that `Reachability` reports).
        if let RpcResponse::WrongNode { actual } = response {
            let e = format!("expected node-{} but reached node-{actual}", self.target);
            tracing::warn!(peer = self.target, "{e}: check the peer addresses");
            return Err(TransportError::Unreachable(e));
        }
        if let RpcResponse::Undecodable = response {
            // An older build that does not know this request: backing off is all there is to do.
            let e = format!("node-{} cannot read this request (an older build)", self.target);
            tracing::warn!(peer = self.target, "{e}");
            return Err(TransportError::Unreachable(e));
        }
        self.pool.note_answered(self.target);
        Ok(response)
    }
}

fn backoff_waits() -> impl Iterator<Item = Duration> + Send + 'static {
    std::iter::successors(Some(PEER_BACKOFF_FIRST), |wait| Some((*wait * 2).min(PEER_BACKOFF_MAX)))
}

fn unexpected<E: std::error::Error>() -> RPCError<E> {
    transport_error(TransportError::Network("mismatched response type".into()))
}

impl RaftNetwork<TypeConfig> for PeerClient {
    /// Doubling waits, from the first to the longest (openraft's default waits 500 ms each
    /// time, so a peer that is down logs four errors a second for as long as it is down).
    fn backoff(&self) -> Backoff {
        Backoff::new(backoff_waits())
    }

    async fn append_entries(
        &mut self,
        req: AppendEntriesRequest,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse, RPCError> {
        let entries = req.entries.len() as u64;
        // Only a send of several entries answers the cap: the heartbeats carrying a commit
        // index that openraft sends after the timeout would otherwise spend it.
        if entries > 1 {
            if let Some(cap) = self.entries_cap.take() {
                if entries > cap {
                    // openraft keeps the hint for the next few AppendEntries.
                    return Err(RPCError::PayloadTooLarge(PayloadTooLarge::new_entries_hint(cap)));
                }
            }
        }
        if entries > 1 && bincode::serialized_size(&req).unwrap_or(0) > APPEND_ENTRIES_BYTES_MAX {
            return Err(RPCError::PayloadTooLarge(PayloadTooLarge::new_entries_hint(entries / 2)));
        }
        // Several entries end before openraft's own deadline would: seeing the timeout here
        // is what lets the next try carry half as many.
        let request = RpcRequest::AppendEntries { target: self.target, req };
        let sent = if entries > 1 {
            self.call_within(request, option.soft_ttl()).await
        } else {
            self.call_raw(request, &option).await
        };
        match sent {
            Ok(RpcResponse::AppendEntries(r)) => r.map_err(|e| remote_error(self.target, e)),
            Ok(_) => Err(unexpected()),
            Err(e) => {
                if matches!(e, TransportError::Timeout(_)) && entries > 1 {
                    self.entries_cap = Some(entries / 2);
                }
                Err(transport_error(e))
            }
        }
    }

    async fn install_snapshot(
        &mut self,
        req: InstallSnapshotRequest,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse, RPCError<InstallSnapshotError>> {
        match self.call(RpcRequest::InstallSnapshot { target: self.target, req }, &option).await? {
            RpcResponse::InstallSnapshot(r) => r.map_err(|e| remote_error(self.target, e)),
            _ => Err(unexpected()),
        }
    }

    async fn vote(&mut self, req: VoteRequest, option: RPCOption) -> Result<VoteResponse, RPCError> {
        match self.call(RpcRequest::Vote { target: self.target, req }, &option).await? {
            RpcResponse::Vote(r) => r.map_err(|e| remote_error(self.target, e)),
            _ => Err(unexpected()),
        }
    }

    async fn pre_vote(&mut self, req: VoteRequest, option: RPCOption) -> Result<VoteResponse, RPCError> {
        match self.call(RpcRequest::PreVote { target: self.target, req }, &option).await? {
            RpcResponse::PreVote(r) => r.map_err(|e| remote_error(self.target, e)),
            _ => Err(unexpected()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use bytes::Bytes;
    use raft_store::{NewMessage, Request};
    use tokio::net::TcpListener;

    use super::*;

    /// A peer that completes the WebSocket handshake and then never reads again (hung, or
    /// blackholed after the connection was made); returns its address and a count of accepts.
    async fn peer_that_stops_reading() -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                if let Ok(ws) = tokio_tungstenite::accept_async(stream).await {
                    held.push(ws);
                }
            }
        });
        (addr, accepted)
    }

    /// A peer that answers each request `delay` after it came, reading (and so answering
    /// pings) meanwhile, as a node installing a snapshot does.
    async fn peer_that_answers_after(delay: Duration) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(answer_after(listener, delay));
        addr
    }

    /// Serves `listener` as [`peer_that_answers_after`] does.
    async fn answer_after(listener: TcpListener, delay: Duration) {
        while let Ok((stream, _)) = listener.accept().await {
            let Ok(ws) = tokio_tungstenite::accept_async(stream).await else { continue };
            let (sink, mut stream) = ws.split();
            let sink = Arc::new(tokio::sync::Mutex::new(sink));
            tokio::spawn(async move {
                while let Some(Ok(message)) = stream.next().await {
                    let Message::Binary(bytes) = message else { continue };
                    let id = decode::<RpcRequest>(&bytes).unwrap().id;
                    let sink = sink.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(delay).await;
                        let body = RpcResponse::Forward(Err(super::super::codec::ForwardError::NotLeader));
                        let answer = encode(&Frame { id, body }).unwrap();
                        let _ = sink.lock().await.send(Message::Binary(answer.into())).await;
                    });
                }
            });
        }
    }

    fn anonymous() -> Introduction {
        Introduction { secret: None, cluster_id: Arc::new(|| None) }
    }

    /// A dialing node presents its secret and, once it has one, its cluster's id.
    #[tokio::test]
    async fn a_dial_presents_the_secret_and_the_cluster_id() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (seen, mut heard) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let seen = seen.clone();
                // The callback's signature (and its large error type) is tungstenite's.
                #[allow(clippy::result_large_err)]
                let record = move |request: &tokio_tungstenite::tungstenite::handshake::server::Request, response| {
                    let header =
                        |name| request.headers().get(name).map(|v: &HeaderValue| v.to_str().unwrap().to_string());
                    let _ = seen.send((header(AUTHORIZATION.as_str()), header(CLUSTER_ID_HEADER)));
                    Ok(response)
                };
                let _ = tokio_tungstenite::accept_hdr_async(stream, record).await;
            }
        });
        let id = Arc::new(Mutex::new(None));
        let current = id.clone();
        let cluster_id = Arc::new(move || current.lock().unwrap().clone());
        let pool = PeerPool::new(Env::production(None), Introduction { secret: Some("s3".into()), cluster_id });
        let _ = pool.conn(2, &addr).call(forward_of(1), Duration::from_millis(200)).await;
        assert_eq!(heard.recv().await.unwrap(), (Some("Bearer s3".into()), None), "no id applied yet");
        *id.lock().unwrap() = Some("c1".to_string());
        let _ = pool.conn(3, &addr).call(forward_of(1), Duration::from_millis(200)).await;
        assert_eq!(heard.recv().await.unwrap(), (Some("Bearer s3".into()), Some("c1".into())));
    }

    fn forward_of(payload_bytes: usize) -> RpcRequest {
        let message = NewMessage { id: "m".into(), timestamp: 0, payload: Bytes::from(vec![b'1'; payload_bytes]) };
        RpcRequest::Forward { req: Request::publish("t".into(), vec![message], 0, false) }
    }

    /// After an AppendEntries of several entries timed out, the next one is asked to carry half
    /// as many: on a link too slow for a full batch, replication still makes progress.
    #[tokio::test]
    async fn a_timed_out_append_entries_halves_the_next_one() {
        use openraft::{Entry, EntryPayload, LeaderId, LogId, Vote};
        let (addr, _accepted) = peer_that_stops_reading().await;
        let pool = PeerPool::new(Env::production(None), anonymous());
        let mut client = PeerClient { target: 2, conn: pool.conn(2, &addr), pool: pool.clone(), entries_cap: None };
        let request = |n: u64| AppendEntriesRequest {
            vote: Vote::new_committed(1, 1),
            prev_log_id: None,
            entries: (1..=n)
                .map(|i| Entry { log_id: LogId::new(LeaderId::new(1, 1), i), payload: EntryPayload::Blank })
                .collect(),
            leader_commit: None,
        };
        let option = RPCOption::new(Duration::from_millis(100));
        let first = client.append_entries(request(8), option.clone()).await;
        assert!(matches!(first, Err(RPCError::Network(_))), "{first:?}");
        // A heartbeat in between (openraft sends one for a commit index) keeps the cap.
        let _ = client.append_entries(request(0), option.clone()).await;
        let next = client.append_entries(request(8), option.clone()).await;
        match next {
            Err(RPCError::PayloadTooLarge(hint)) => assert_eq!(hint.entries_hint(), 4),
            other => panic!("expected a hint of 4 entries, got {other:?}"),
        }
        // One entry that times out sets no cap.
        let _ = client.append_entries(request(1), option.clone()).await;
        assert_eq!(client.entries_cap, None);
    }

    /// An answer slower than the stall timeout, from a peer whose socket answers pings, comes
    /// through on the same connection: dropped, the connection would fail every request on it
    /// (a snapshot's last chunk, answered once installed, would be sent again from the start).
    #[tokio::test]
    async fn a_slow_answer_from_a_peer_that_answers_pings_keeps_the_connection() {
        let addr = peer_that_answers_after(PEER_STALL_TIMEOUT + Duration::from_secs(1)).await;
        let pool = PeerPool::new(Env::production(None), anonymous());
        let answer = pool.conn(2, &addr).call(forward_of(1), PEER_STALL_TIMEOUT * 3).await;
        assert!(matches!(answer, Ok(RpcResponse::Forward(Err(_)))), "{answer:?}");
    }

    /// Requests whose callers give up before the stall check sees them (votes, pre-votes),
    /// sent now and then to a peer that answers nothing, not even pings (a partition that
    /// holds the connection in TCP's retransmission backoff): the connection is dropped and
    /// dialed again all the same, or the partition healed would go unnoticed for minutes.
    #[tokio::test]
    async fn a_silent_peer_is_dialed_again_though_every_caller_gave_up() {
        let (addr, accepted) = peer_that_stops_reading().await;
        let pool = PeerPool::new(Env::production(None), anonymous());
        let conn = pool.conn(2, &addr);
        let deadline = Instant::now() + PEER_STALL_TIMEOUT * 4;
        while accepted.load(Ordering::SeqCst) < 2 {
            assert!(Instant::now() < deadline, "never dialed again: each new request restarted the silence");
            let answer = conn.call(forward_of(1), Duration::from_millis(100)).await;
            assert!(matches!(answer, Err(TransportError::Timeout(_) | TransportError::Network(_))), "{answer:?}");
            // Longer than the stall check's period, so that no caller is waiting at its ticks.
            tokio::time::sleep(PEER_STALL_TIMEOUT / 2).await;
        }
    }

    /// A peer whose dial failed is, while it is dialed again, unreachable at once for other
    /// requests: against an address that never answers (blackholed) a dial outlasts a
    /// heartbeat's deadline, and a timeout would make openraft retry at once instead of backing
    /// off. Once the peer answers, requests go through again.
    #[tokio::test]
    async fn requests_while_a_failed_peer_is_dialed_again_are_unreachable_at_once() {
        // Connections complete in the listen queue, but no WebSocket handshake is answered
        // until the peer starts serving.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let pool = PeerPool::new(Env::production(None), anonymous());
        let conn = pool.conn(2, &addr);
        let first = conn.call(forward_of(1), PEER_DIAL_TIMEOUT * 2).await;
        assert!(matches!(&first, Err(TransportError::Unreachable(e)) if e.contains("dial timed out")), "{first:?}");

        // The next request dials again and waits for it, as a request to a peer not known to
        // be down should; the one after does not wait.
        let second = conn.call(forward_of(1), Duration::from_millis(200)).await;
        assert!(matches!(second, Err(TransportError::Timeout(_))), "{second:?}");
        let started = Instant::now();
        let third = conn.call(forward_of(1), PEER_DIAL_TIMEOUT * 2).await;
        assert!(matches!(&third, Err(TransportError::Unreachable(e)) if e.contains("dialing again")), "{third:?}");
        assert!(started.elapsed() < Duration::from_millis(100), "waited {:?}", started.elapsed());

        tokio::spawn(answer_after(listener, Duration::ZERO));
        let deadline = Instant::now() + PEER_DIAL_TIMEOUT * 3;
        loop {
            match conn.call(forward_of(1), Duration::from_millis(500)).await {
                Ok(answer) => break assert!(matches!(answer, RpcResponse::Forward(Err(_))), "{answer:?}"),
                Err(e) => assert!(Instant::now() < deadline, "the peer serves but requests still fail: {e:?}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// openraft backs off from an unreachable peer by doubling waits, up to a cap.
    #[test]
    fn the_backoff_doubles_up_to_its_cap() {
        let waits: Vec<u64> = backoff_waits().take(6).map(|d| d.as_millis() as u64).collect();
        let (first, max) = (PEER_BACKOFF_FIRST.as_millis() as u64, PEER_BACKOFF_MAX.as_millis() as u64);
        assert_eq!(waits[..4], [first, first * 2, first * 4, first * 8].map(|w| w.min(max)));
        assert_eq!(waits[4..], [max, max]);
    }

    /// A peer whose Raft stopped answers `Fatal` at once: openraft must back off, not resend.
    #[test]
    fn a_remote_fatal_error_is_unreachable_and_an_api_error_stays_remote() {
        let fatal: RaftError<NodeId, InstallSnapshotError> = RaftError::Fatal(openraft::error::Fatal::Stopped);
        assert!(matches!(remote_error(2, fatal), RPCError::Unreachable(_)));
        let mismatch = InstallSnapshotError::SnapshotMismatch(openraft::error::SnapshotMismatch {
            expect: openraft::SnapshotSegmentId { id: "a".into(), offset: 0 },
            got: openraft::SnapshotSegmentId { id: "b".into(), offset: 0 },
        });
        assert!(matches!(remote_error(2, RaftError::APIError(mismatch)), RPCError::RemoteError(_)));
    }

    /// A write that cannot complete (far more than the sockets buffer, to a peer that does not
    /// read) must not hold the connection forever: it is dropped and the next request dials
    /// again, instead of queueing behind the stuck write.
    #[tokio::test]
    async fn a_peer_that_stops_reading_is_dialed_again_after_a_stalled_write() {
        let (addr, accepted) = peer_that_stops_reading().await;
        let pool = PeerPool::new(Env::production(None), anonymous());
        let conn = pool.conn(2, &addr);
        let stuck = conn.call(forward_of(32 * 1024 * 1024), Duration::from_millis(500)).await;
        assert!(matches!(stuck, Err(TransportError::Timeout(_))), "{stuck:?}");
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        // The connection gives the write up after PEER_STALL_TIMEOUT; a request then dials again.
        let deadline = Instant::now() + PEER_STALL_TIMEOUT * 3;
        while accepted.load(Ordering::SeqCst) < 2 {
            assert!(Instant::now() < deadline, "no new connection: the stalled write still holds the old one");
            let _ = conn.call(forward_of(1), Duration::from_millis(200)).await;
        }
    }
}
