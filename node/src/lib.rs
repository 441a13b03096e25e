//! `pubsub-node`: one node of the Raft-replicated pub/sub cluster.
//!
//! # Layout
//! - [`config`]: flags with environment twins, validated into a [`Config`].
//! - [`net`]: the seams to the outside world (dialer, clock), swapped by the simulation.
//! - [`budget`]: a budget of bytes that waiting work draws on (a semaphore of bytes).
//! - [`app`]: state shared by all handlers; leadership and write helpers.
//! - [`propose`]: the leader's proposer, batching concurrent writes into one Raft entry.
//! - [`api`]: the HTTP client API (axum routes), one module per resource.
//! - [`subscribe`]: WebSocket subscriptions and coalesced acks.
//! - [`ws_close`]: the close handshake that ends a client's WebSocket.
//! - [`serve`]: the HTTP server loop (accepting, header deadline, graceful stop).
//! - [`raft`]: Raft RPC over one multiplexed WebSocket per peer (client and server side).
//! - [`error`]: [`ApiError`](error::ApiError), the single mapping to HTTP statuses and bodies.
//! - [`metrics`]: Prometheus metrics.
//! - [`limits`]: every limit and timing as a named constant.
//!
//! [`run`] is the whole node: it takes the listener, the environment and the shutdown signal,
//! so tests bind port 0 and the simulation passes turmoil's sockets.

/// The crate version this node runs.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The git commit it was built from (`build.rs`; `unknown` without git).
pub const COMMIT: &str = env!("PUBSUB_COMMIT");

pub mod api;
pub mod app;
pub mod budget;
pub mod cluster_clock;
pub mod config;
pub mod disk_room;
pub mod error;
pub mod io_deadline;
pub mod limits;
pub mod metrics;
pub mod net;
pub mod propose;
pub mod raft;
pub mod serve;
pub mod subscribe;
pub mod ws_close;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use openraft::error::{InitializeError, RaftError};
use raft_store::typ::Raft;
use raft_store::{Node, Request};
use tokio_util::sync::CancellationToken;

use crate::app::App;
pub use crate::config::{Config, ConfigError, Flags};
use crate::metrics::Metrics;
pub use crate::net::Env;
use crate::raft::network::{Introduction, Network, PeerPool};

/// Why the node could not run.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("data dir {path}: {source}")]
    DataDir { path: String, source: raft_store::StoreError },
    #[error(
        "data dir {path} holds a cluster whose voters are {stored}, but --peers names {given}: --peers is read only \
         when a cluster is first started; give a new --data-dir to start another cluster"
    )]
    OtherVoters { path: String, stored: String, given: String },
    #[error(
        "data dir {path} was already made a cluster of its own by --force-new-cluster ({marker} says where): \
         start it without the flag (to force it again after another disaster, delete that file first)"
    )]
    ForcedAlready { path: String, marker: String },
    #[error("data dir {path} holds no log: --force-new-cluster recovers a node that has one")]
    NothingToForce { path: String },
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("raft: {0}")]
    Raft(String),
    #[error("serve: {0}")]
    Serve(#[from] std::io::Error),
}

impl NodeError {
    /// What to do about this failure, where there is more to say than the failure itself: the
    /// end of the node's last line.
    pub fn advice(&self) -> &'static str {
        // The type of an I/O error survives neither openraft's error chain (it keeps the text)
        // nor RocksDB's: strerror(ENOSPC) is what both keep, wherever the write failed (opening
        // the data dir, the log, the state machine).
        if self.to_string().contains("No space left on device") {
            "; the data dir's file system is full: give it room (or move the data dir to a larger one) and start \
             the node again; it reopens from what it had fsynced, and catches up from the others"
        } else {
            ""
        }
    }
}

/// The secret deploy/docker-compose.yml uses when none is set: public, so warned about.
const COMPOSE_DEFAULT_SECRET: &str = "pubsub-insecure-default-secret";

/// Runs the node until `shutdown` resolves, then stops accepting, closes subscriptions
/// (code 1001), stops Raft and flushes storage.
pub async fn run<L>(
    config: Config,
    listener: L,
    env: Env,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), NodeError>
where
    L: axum::serve::Listener<Addr = std::net::SocketAddr>,
{
    let mut store = raft_store::open_with(&config.data_dir, config.io_mode)
        .map_err(|source| NodeError::DataDir { path: config.data_dir.display().to_string(), source })?;
    store
        .log_store
        .set_node_id(config.id)
        .map_err(|source| NodeError::DataDir { path: config.data_dir.display().to_string(), source })?;
    if config.force_new_cluster {
        force_new_cluster(&config, &mut store).await?;
    }
    let metrics = Metrics::default();
    store.log_store.observe_fsyncs(metrics.fsync_observer());
    let committed_index = store.log_store.committed_index();
    let log_files = store.log_store.files();
    let store_closed = store.closed;
    let raft_config = raft::config::raft_config(config.heartbeat_ms, config.election_timeout_ms, config.snapshot_logs)
        .map_err(NodeError::Raft)?;
    let reader = store.reader.clone();
    let intro = Introduction {
        secret: config.cluster_secret.clone(),
        cluster_id: Arc::new(move || reader.cluster_id().map(str::to_string)),
    };
    let peers = PeerPool::new(env.clone(), intro);
    // What the data dir held, before a first start writes to it: an empty one (no log, no
    // cluster id) is a new node or a replaced disk. Read from the store: Raft's metrics say
    // nothing until its core has run.
    let last_log_index = {
        use openraft::storage::RaftLogStorage;
        let state = store.log_store.get_log_state().await.map_err(|e| NodeError::Raft(e.to_string()))?;
        state.last_log_id.map(|id| id.index)
    };
    let raft =
        Raft::new(config.id, Arc::new(raft_config), Network::new(peers.clone()), store.log_store, store.state_machine)
            .await
            .map_err(|e| NodeError::Raft(e.to_string()))?;
    if let Err(e) = bootstrap(&config, &raft).await {
        // Nothing was served: stop the core, which closes the stores it owns, and say why.
        let _ = raft.shutdown().await;
        return Err(e);
    }

    let disk_room = Arc::new(disk_room::DiskRoom::new(config.data_dir.clone(), config.min_free_bytes));
    let app = Arc::new(App {
        config: config.clone(),
        raft: raft.clone(),
        proposer: propose::Proposer::spawn(raft.clone()),
        reader: store.reader,
        committed_index,
        log_files,
        clock: cluster_clock::ClusterClock::new(env.clock.clone()),
        env,
        peers,
        metrics,
        acks: Default::default(),
        frames: Default::default(),
        inflight: Mutex::new(HashSet::new()),
        shutdown: CancellationToken::new(),
        leaderless_spells: tokio::sync::watch::Sender::new(None),
        leader_heard: Mutex::new(tokio::time::Instant::now()),
        subscriptions: AtomicUsize::new(0),
        publishing_connections: Arc::new(tokio::sync::Semaphore::new(limits::PUBLISH_WS_CONNECTIONS_MAX)),
        subscriptions_ended: tokio::sync::Notify::new(),
        closing: tokio_util::task::TaskTracker::new(),
        connected: Mutex::new(HashMap::new()),
        appended_bytes: budget::ByteBudget::new(limits::APPENDED_BYTES_MAX),
        request_bodies: budget::ByteBudget::new(limits::REQUEST_BODIES_BYTES_MAX),
        client_request_bodies: budget::PerClientBudgets::new(limits::REQUEST_BODIES_BYTES_PER_CLIENT_MAX),
        read_pages: budget::ByteBudget::new(limits::READ_PAGES_BYTES_MAX),
        client_read_pages: budget::PerClientBudgets::new(limits::READ_PAGES_BYTES_PER_CLIENT_MAX),
        metrics_bodies: budget::ByteBudget::new(limits::METRICS_BODIES_BYTES_MAX),
        client_metrics_bodies: budget::PerClientBudgets::new(limits::METRICS_BODIES_BYTES_PER_CLIENT_MAX),
        raft_inbound: budget::ByteBudget::new(limits::RAFT_INBOUND_BYTES_MAX),
        disk_room: disk_room.clone(),
        claims_seen: Default::default(),
        membership_changes: Default::default(),
    });
    tokio::spawn(subscribe::acks::run_flusher(Arc::downgrade(&app)));
    tokio::spawn(retention_ticks(Arc::downgrade(&app)));
    tokio::spawn(cluster_clock::run(Arc::downgrade(&app)));
    tokio::spawn(name_the_cluster(Arc::downgrade(&app)));
    tokio::spawn(disk_room::watch(disk_room, config.io_mode, app.shutdown.clone()));
    tokio::spawn(disk_room::report(Arc::downgrade(&app)));
    tokio::spawn(count_leader_changes(app.clone()));
    tokio::spawn(subscribe::leaderless::count_spells(Arc::downgrade(&app)));
    tokio::spawn(raft::joint::run(Arc::downgrade(&app)));

    let cluster_id = app.reader.cluster_id();
    tracing::info!(version = VERSION, commit = COMMIT, id = config.id, listen = %config.listen,
                   advertise = %config.advertise, data_dir = %absolute(&config.data_dir).display(),
                   min_free_bytes = config.min_free_bytes, peers = ?config.peers,
                   last_log_index = ?last_log_index, cluster_id = ?cluster_id, "pubsub-node started");
    // Peers dial the advertised address; one on another host cannot reach a loopback socket
    // (unless something on this host forwards to it, hence a warning, not a refusal).
    if config.listen.ip().is_loopback() && !config::is_loopback(&config.advertise) {
        tracing::warn!(
            listen = %config.listen, advertise = %config.advertise,
            "--listen is a loopback address but peers and clients are told to reach this node at another: from \
             another host they cannot, unless a proxy on this host forwards to it; listen on 0.0.0.0 or the \
             advertised address"
        );
    }
    // A single node reachable from elsewhere is as open: a stranger's vote or append would
    // change its log just the same.
    if config.peers.len() > 1 || !config.listen.ip().is_loopback() {
        match config.cluster_secret.as_deref() {
            None => tracing::warn!(
                "no --cluster-secret: anyone who reaches this port can act as a cluster peer (vote, replicate, \
                 write); set the same secret on every node"
            ),
            Some(COMPOSE_DEFAULT_SECRET) => tracing::warn!(
                "--cluster-secret is deploy/docker-compose.yml's public default: anyone who reaches this port \
                 can act as a cluster peer; set PUBSUB_CLUSTER_SECRET unless the port is published on loopback only"
            ),
            Some(_) => {}
        }
    }
    let token = app.shutdown.clone();
    let raft_stopped = Arc::new(std::sync::OnceLock::new());
    let signal = {
        let (raft, stopped) = (raft.clone(), raft_stopped.clone());
        async move {
            tokio::select! {
                () = shutdown => tracing::info!("shutting down: closing subscriptions"),
                cause = core_stopped(&raft) => {
                    // A storage failure stops the Raft core for good. Serving on would answer
                    // every peer with that failure: exit instead, so that a supervisor
                    // restarts the node or an operator sees it.
                    tracing::error!(%cause, "the Raft core stopped; shutting down");
                    let _ = stopped.set(cause);
                }
            }
            token.cancel();
        }
    };
    let connections_max = limits::connections_max(open_files_limit().map_or(u64::MAX, |l| l.rlim_cur));
    serve::serve(listener, api::router(app.clone()), signal, connections_max).await;
    // The server does not wait for upgraded connections: wait for the subscriptions to close,
    // so that no ack is recorded after the last flush below.
    let closed = async {
        loop {
            let ended = app.subscriptions_ended.notified();
            if app.subscription_count() == 0 {
                break;
            }
            ended.await;
        }
    };
    if tokio::time::timeout(limits::SHUTDOWN_SUBSCRIPTIONS_TIMEOUT, closed).await.is_err() {
        tracing::warn!(open = app.subscription_count(), "subscriptions still open at shutdown");
    }
    // Subscriptions are closed: record the acks they sent since the last flush (up to
    // ACK_FLUSH_INTERVAL of them) while Raft still runs, or a restarted subscriber with
    // `cursor=acked` would get them again.
    if tokio::time::timeout(limits::SHUTDOWN_ACK_FLUSH_TIMEOUT, subscribe::acks::flush(&app)).await.is_err() {
        tracing::warn!("the last acks were not recorded within {:?}", limits::SHUTDOWN_ACK_FLUSH_TIMEOUT);
    }

    // A leader hands over once its Raft has stopped (so no heartbeat of its own renews its
    // lease behind the hand-over), to a voter that held its whole log while it still ran.
    let handover = raft::handover::prepare(&raft, config.id).await;
    // What Raft applied reaches disk when its state machine is dropped, not through a replay
    // of the log at the next start.
    store_closed.stop_cleanly();
    match tokio::time::timeout(limits::SHUTDOWN_RAFT_TIMEOUT, raft.shutdown()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "raft did not stop cleanly"),
        Err(_) => tracing::warn!("raft still stopping after {:?}; exiting anyway", limits::SHUTDOWN_RAFT_TIMEOUT),
    }
    if let Some(handover) = handover {
        handover.run(&app.peers).await;
    }
    // Closed sockets answer their clients' close frames (begun as the subscriptions closed);
    // exiting first would reset the connections, losing the close frames still queued.
    app.closing.close();
    if tokio::time::timeout(limits::CLOSE_HANDSHAKE_TIMEOUT, app.closing.wait()).await.is_err() {
        tracing::debug!(closing = app.closing.len(), "close handshakes still unanswered at shutdown");
    }
    let subscriptions = app.subscriptions.load(Ordering::Relaxed);
    drop((app, raft));
    // Every task holding the store has been told to stop; RocksDB closes when the last one has.
    if !store_closed.wait(limits::SHUTDOWN_CLOSE_TIMEOUT).await {
        tracing::warn!("storage still in use after {:?}; exiting anyway", limits::SHUTDOWN_CLOSE_TIMEOUT);
    }
    tracing::info!(subscriptions, "stopped");
    if let Some(cause) = raft_stopped.get() {
        return Err(NodeError::Raft(format!("the Raft core stopped: {cause}")));
    }
    Ok(())
}

/// `path` from the root, for the log: a relative data dir names nothing without the working
/// directory, which a unit file or a `cd` changes (and with it, silently, the data).
fn absolute(path: &std::path::Path) -> std::path::PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Returns once the Raft core has stopped (its metrics channel closes with it), with the
/// failure it reported last.
async fn core_stopped(raft: &Raft) -> String {
    let mut metrics = raft.metrics();
    while metrics.changed().await.is_ok() {}
    let state = metrics.borrow().running_state.clone();
    state.err().map_or_else(|| "it ended without reporting a failure (a panic?)".to_string(), |fatal| fatal.to_string())
}

/// The membership a cluster runs with is the one in its log, set when it was first started
/// and changed only through `/cluster/members`; `--peers` only names it at that first start.
/// While the log still holds the first membership, other voters than `--peers` names refuse
/// the start: the node would run the old cluster (alone, or waiting for a quorum that never
/// comes) while the operator believes it formed the new one, typically a single node's
/// `./data/node-1` reused for a three-node cluster or the other way round. Once members were
/// added or removed, `--peers` of nodes started before is expected to be stale, and like moved
/// addresses of the same voters it is only warned about: Raft dials the stored addresses.
fn check_peers(config: &Config, raft: &Raft) -> Result<(), NodeError> {
    let metrics = raft.metrics();
    let metrics = metrics.borrow();
    let membership = metrics.membership_config.membership();
    let stored: BTreeMap<u64, String> = membership.nodes().map(|(id, node)| (*id, node.addr.clone())).collect();
    if !stored.is_empty() && !stored.contains_key(&config.id) {
        tracing::warn!(
            members = ?stored,
            "this node's log says it was removed from its cluster's membership: it gets no new entries and \
             serves nothing new; stop it, and start it on an empty data dir with --join to add it again"
        );
        return Ok(());
    }
    // No --peers: this node's address in `config.peers` is a guess, not a stale flag.
    let guessed_only = config.advertise_guessed && stored.keys().eq(config.peers.keys());
    if stored.is_empty() || stored == config.peers || guessed_only {
        return Ok(());
    }
    // `initialize` writes the first membership at log index 0; every change comes later.
    let changed_since_start = metrics.membership_config.log_id().is_some_and(|id| id.index > 0);
    if !changed_since_start && !stored.keys().eq(config.peers.keys()) {
        return Err(NodeError::OtherVoters {
            path: config.data_dir.display().to_string(),
            stored: error::node_list(stored.keys()),
            given: error::node_list(config.peers.keys()),
        });
    }
    tracing::warn!(
        stored = ?stored, given = ?config.peers,
        "--peers names other members than the membership in this node's log, which is what the cluster \
         runs with; --peers is read only when a cluster is first started (members are changed through \
         /cluster/members)"
    );
    Ok(())
}

/// The file `--force-new-cluster` leaves in the data dir: a later start with the flag still
/// set (left in a unit file, say) would cut the cluster grown again since back to this node.
const FORCED_MARKER: &str = "FORCED_NEW_CLUSTER";

/// `--force-new-cluster`: this node becomes the only voter of its cluster
/// (`LogStore::force_single_voter`), once per data dir.
async fn force_new_cluster(config: &Config, store: &mut raft_store::Store) -> Result<(), NodeError> {
    use openraft::storage::RaftStateMachine;
    let path = config.data_dir.display().to_string();
    let marker = config.data_dir.join(FORCED_MARKER);
    if marker.exists() {
        return Err(NodeError::ForcedAlready { path, marker: marker.display().to_string() });
    }
    let data_dir_error = |source| NodeError::DataDir { path: path.clone(), source };
    let (applied, _) = store.state_machine.applied_state().await.map_err(|e| NodeError::Raft(e.to_string()))?;
    // Started without --advertise or --peers (the others are lost), the address guessed is
    // loopback: recorded, it would refuse every node added on another host. The membership is
    // the log's latest, as Raft would read it (the state machine's may be behind the log).
    let membership = openraft::StorageHelper::new(&mut store.log_store, &mut store.state_machine)
        .get_membership()
        .await
        .map_err(|e| NodeError::Raft(e.to_string()))?;
    // The newest membership first; the committed one if a removal of this node is in flight.
    let recorded = [membership.effective(), membership.committed()]
        .into_iter()
        .find_map(|m| m.membership().get_node(&config.id).map(|n| n.addr.clone()));
    let addr = match recorded {
        Some(addr) if config.advertise_guessed => addr,
        _ => config.advertise.clone(),
    };
    let node = Node { addr: addr.clone() };
    let forced = store.log_store.force_single_voter(config.id, node, applied).map_err(data_dir_error)?;
    let Some(log_id) = forced else {
        return Err(NodeError::NothingToForce { path });
    };
    // The marker and its directory entry fsynced: lost in a power cut, a flag left set would
    // force again on the next start.
    let written = std::fs::write(&marker, format!("membership of node-{} alone at log {log_id}\n", config.id))
        .and_then(|()| std::fs::File::open(&marker)?.sync_all())
        .and_then(|()| std::fs::File::open(&config.data_dir)?.sync_all());
    written.map_err(|e| data_dir_error(raft_store::StoreError::Io(e)))?;
    tracing::warn!(
        %log_id, advertise = %addr,
        "--force-new-cluster: this node is now the only voter of its cluster, with the data it holds; add new \
         nodes with --join and POST /cluster/members, and never start the lost ones again on their old data"
    );
    Ok(())
}

/// First start of a fresh cluster: the node with the smallest id initializes it with every
/// voter of `--peers`. A node that already has a log or a vote is never re-initialized.
async fn bootstrap(config: &Config, raft: &Raft) -> Result<(), NodeError> {
    let initialized = raft.is_initialized().await.map_err(|e| NodeError::Raft(e.to_string()))?;
    if initialized {
        return check_peers(config, raft);
    }
    config::refuse_mixed_loopback(&config.peers)?;
    if !config.is_bootstrapper() {
        return Ok(());
    }
    let members: BTreeMap<u64, Node> =
        config.peers.iter().map(|(id, addr)| (*id, Node { addr: addr.clone() })).collect();
    match raft.initialize(members).await {
        Ok(()) => {
            tracing::info!(
                voters = ?config.peers,
                "initialized the cluster on an empty data dir: a new cluster, or, if it ran before (a \
                 replaced disk), this node catches up from its leader"
            );
            Ok(())
        }
        Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
        Err(e) => Err(NodeError::Raft(e.to_string())),
    }
}

/// A leader that finds no cluster id applied proposes one (random; the first applied wins), so
/// that every node presents it when it dials a peer (raft/server.rs refuses another
/// cluster's). Ends once an id is applied. Data directories of earlier builds get theirs so.
async fn name_the_cluster(app: std::sync::Weak<App>) {
    let Some(mut metrics) = app.upgrade().map(|app| app.raft.metrics()) else { return };
    loop {
        {
            let Some(app) = app.upgrade() else { return };
            if app.shutdown.is_cancelled() || app.reader.cluster_id().is_some() {
                return;
            }
            if app.leadership() == app::Leadership::Me {
                let id = uuid::Uuid::new_v4().to_string();
                if let Err(e) = app.propose_anywhere(Request::SetClusterId { id }).await {
                    tracing::debug!(error = %e, "cluster id not recorded yet; retrying");
                }
            }
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// This process's open-files limit, soft (`rlim_cur`, which `main` raises to the hard one
/// first) and hard; `None` when it cannot be read.
pub fn open_files_limit() -> Option<libc::rlimit> {
    // SAFETY: getrlimit writes only the struct passed.
    unsafe {
        let mut limit: libc::rlimit = std::mem::zeroed();
        (libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0).then_some(limit)
    }
}

/// The leader proposes a `Tick` now and then so `retention_hours` trims quiet topics too.
async fn retention_ticks(app: std::sync::Weak<App>) {
    let mut interval = tokio::time::interval(limits::RETENTION_TICK_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let Some(app) = app.upgrade() else { return };
        if app.shutdown.is_cancelled() {
            return;
        }
        // Deleted topics too: their messages stay for subscribers resuming from before the
        // deletion (API.md §3), and `retention_hours` trims them as it does live ones.
        let wants_tick = app.reader.any_topic(|t| t.retention.hours.is_some() && t.message_count() > 0);
        if wants_tick && app.leadership() == app::Leadership::Me {
            let _ = app.propose_anywhere(Request::Tick { now_ms: app.now_ms() }).await;
        }
    }
}

async fn count_leader_changes(app: Arc<App>) {
    let mut server = app.raft.server_metrics();
    let mut last = server.borrow_and_update().current_leader;
    while server.changed().await.is_ok() {
        let leader = server.borrow_and_update().current_leader;
        if leader != last {
            if leader.is_some() {
                app.metrics.leader_changes.inc();
                tracing::info!(leader = ?leader, "leader changed");
            }
            last = leader;
        }
        if app.shutdown.is_cancelled() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::NodeError;

    #[test]
    fn a_full_disk_is_told_what_to_do_wherever_the_write_failed() {
        let full = || std::io::Error::from_raw_os_error(28);
        let opening = NodeError::DataDir { path: "d".into(), source: raft_store::StoreError::Io(full()) };
        let running = NodeError::Raft(format!("the Raft core stopped: {}", full()));
        for e in [opening, running] {
            assert!(e.advice().contains("give it room"), "{e}");
        }
        let other = NodeError::DataDir { path: "d".into(), source: raft_store::StoreError::Corrupt("x".into()) };
        assert_eq!(other.advice(), "");
    }
}
