//! The data dir's free space and the reserve kept in it (`--min-free-bytes`). While the
//! leader's data dir has less available than the reserve plus its newest snapshot's size (the
//! next snapshot needs as much again), writes that make the data grow (publishes, topic
//! creations) are refused with `507 insufficient_storage` before anything is proposed: a
//! filling disk stops publishers with an answer they understand, while deletes, acks and
//! retention still run, instead of stopping every node at its first failed write.
//!
//! Every node also tells the cluster, through the log, when its own data dir is short of room
//! and when it has room again ([`report`]); the leader refuses the same writes while any
//! node's claim is recent, so that a follower with a smaller or fuller disk is not the one
//! that fills and stops.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use raft_store::{IoMode, Request};
use tokio_util::sync::CancellationToken;

use crate::app::App;
use crate::error::ApiError;
use crate::limits::{
    DISK_ROOM_RECHECK, DISK_ROOM_REPORT_INTERVAL, DISK_ROOM_RESUME_MARGIN_BYTES, DISK_SHORT_CLAIM_LAPSE,
    DISK_SHORT_CLAIM_RENEW,
};

/// Free space of one data dir against its reserve. Writes go by the last reading, which
/// [`watch`] renews every [`DISK_ROOM_RECHECK`] on a blocking thread: `statvfs` and listing the
/// snapshots are file-system calls, which a stalled disk can hold for seconds, and a write path
/// on the async workers must not wait on them.
pub struct DiskRoom {
    data_dir: PathBuf,
    /// Bytes that must stay available besides a snapshot's; 0 turns the check off.
    reserve: u64,
    /// The last reading: bytes available (`u64::MAX` when the file system could not be asked:
    /// a failing `statvfs` says nothing about the room left, so nothing is refused)...
    available: AtomicU64,
    /// ...the bytes that must stay available (the reserve and the newest snapshot's size)...
    needed: AtomicU64,
    /// ...and whether writes are refused.
    short: AtomicBool,
}

impl DiskRoom {
    /// The data dir's room, read once now (at start, before any write is taken).
    pub fn new(data_dir: PathBuf, reserve: u64) -> Self {
        let room = Self {
            data_dir,
            reserve,
            available: AtomicU64::new(u64::MAX),
            needed: AtomicU64::new(reserve),
            short: AtomicBool::new(false),
        };
        if reserve > 0 {
            room.read();
        }
        room
    }

    pub fn reserve(&self) -> u64 {
        self.reserve
    }

    /// Ok while the data dir has room; otherwise the refusal, which names the room there is
    /// and the room needed.
    pub fn require_room(&self) -> Result<(), ApiError> {
        if !self.is_short() {
            return Ok(());
        }
        Err(ApiError::InsufficientStorage {
            available: self.available.load(Ordering::Relaxed),
            needed: self.needed.load(Ordering::Relaxed),
            reserve: self.reserve,
        })
    }

    /// Whether writes are refused for want of room here, by the last reading.
    pub fn is_short(&self) -> bool {
        self.short.load(Ordering::Relaxed)
    }

    /// Takes a new reading and decides whether writes are refused (blocking: file-system calls).
    fn read(&self) {
        let available = raft_store::available_bytes(&self.data_dir).unwrap_or(u64::MAX);
        let needed = self.reserve.saturating_add(raft_store::largest_snapshot_bytes(&self.data_dir));
        let was_short = self.short.load(Ordering::Relaxed);
        // Once refusing, writes resume only with a margin above the line, so that a disk
        // hovering at it does not flip (and log) with every reading.
        let line = if was_short { needed.saturating_add(DISK_ROOM_RESUME_MARGIN_BYTES) } else { needed };
        let short = available < line;
        self.available.store(available, Ordering::Relaxed);
        self.needed.store(needed, Ordering::Relaxed);
        self.short.store(short, Ordering::Relaxed);
        match (was_short, short) {
            (false, true) => tracing::warn!(
                available, needed, reserve = self.reserve, data_dir = %self.data_dir.display(),
                "the data dir is short of room (--min-free-bytes, plus the newest snapshot's size): publishes and \
                 topic creations are refused until it has room again"
            ),
            (true, false) => tracing::info!(available, needed, "the data dir has room again: writes are taken"),
            _ => {}
        }
    }
}

/// Renews `room`'s reading every [`DISK_ROOM_RECHECK`] until `shutdown`, each on a blocking
/// thread and one at a time: a reading held up by a stalled disk delays the next instead of
/// piling threads onto it (meanwhile writes go by the last reading). Under
/// [`IoMode::Inline`] (the simulation) the reading is taken on this task instead: a thread
/// waking it at a moment of the real clock would change the order its tasks run in, and a
/// seed would no longer replay exactly. Nothing to do when the check is off.
pub async fn watch(room: Arc<DiskRoom>, io_mode: IoMode, shutdown: CancellationToken) {
    if room.reserve == 0 {
        return;
    }
    let mut interval = tokio::time::interval(DISK_ROOM_RECHECK);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval.tick().await; // the first tick is at once: `new` has just read
    loop {
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return,
            _ = interval.tick() => {}
        }
        if io_mode == IoMode::Inline {
            room.read();
            continue;
        }
        let reading = room.clone();
        match tokio::task::spawn_blocking(move || reading.read()).await {
            Ok(()) => {}
            Err(e) if e.is_panic() => tracing::error!(error = %e, "reading the data dir's free space panicked"),
            Err(_) => return, // the runtime is shutting down
        }
    }
}

/// When this node first saw each node's latest claim to be short of disk room. A claim lapses
/// [`DISK_SHORT_CLAIM_LAPSE`] after it was seen here, by this node's monotonic clock: the
/// claim's own stamp, from another node's wall clock, only tells one claim from the next.
#[derive(Default)]
pub struct ClaimsSeen(Mutex<BTreeMap<u64, (u64, Instant)>>);

impl ClaimsSeen {
    /// The nodes of `claims` (node → stamp), but `except`, whose claim was seen at most
    /// [`DISK_SHORT_CLAIM_LAPSE`] before `now`; a claim not seen before counts from `now`.
    pub fn fresh(&self, claims: &BTreeMap<u64, u64>, now: Instant, except: Option<u64>) -> Vec<u64> {
        let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        seen.retain(|node, _| claims.contains_key(node));
        let mut fresh = Vec::new();
        for (&node, &stamp) in claims {
            let (seen_stamp, seen_at) = seen.entry(node).or_insert((stamp, now));
            if *seen_stamp != stamp {
                (*seen_stamp, *seen_at) = (stamp, now);
            }
            if Some(node) != except && now.saturating_duration_since(*seen_at) <= DISK_SHORT_CLAIM_LAPSE {
                fresh.push(node);
            }
        }
        fresh
    }
}

/// The leader's check before a write that makes the data grow: its own data dir, then the
/// claims of the other nodes (its own claim is older than its own check).
pub fn require_cluster_room(app: &App) -> Result<(), ApiError> {
    app.disk_room.require_room()?;
    let nodes = members_short_of_room(app, Some(app.id()));
    if nodes.is_empty() {
        return Ok(());
    }
    Err(ApiError::NodesShortOfStorage { nodes })
}

/// The members of the cluster (but `except`) whose claim to be short of disk room is fresh:
/// what the leader refuses writes for, and what `/cluster` lists.
pub fn members_short_of_room(app: &App, except: Option<u64>) -> Vec<u64> {
    if !app.reader.any_disk_short() {
        return Vec::new();
    }
    let claims = app.reader.disk_short_claims();
    let members = members(app);
    let mut nodes = app.claims_seen.fresh(&claims, tokio::time::Instant::now().into_std(), except);
    nodes.retain(|node| members.contains(node));
    nodes
}

/// The nodes of the cluster's membership now, voters and learners. A node removed while it
/// runs never learns of it (API.md §2) and goes on renewing its claim: only members' count.
pub fn members(app: &App) -> BTreeSet<u64> {
    app.raft.metrics().borrow().membership_config.membership().nodes().map(|(id, _)| *id).collect()
}

/// Tells the cluster when this node's data dir becomes short of room (renewing the claim every
/// [`DISK_SHORT_CLAIM_RENEW`] while it stays so) and when it has room again, checking every
/// [`DISK_ROOM_REPORT_INTERVAL`]; meanwhile notes when other nodes' claims are seen, so that
/// a node that comes to lead knows how old they are. The leader withdraws claims it saw lapse,
/// each only if not renewed since (a node gone for good never withdraws its own; a node still
/// short claims again at its next check), so that no stale claim refuses writes after the next
/// leader change.
pub async fn report(app: Weak<App>) {
    let mut interval = tokio::time::interval(DISK_ROOM_REPORT_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_claimed: Option<tokio::time::Instant> = None;
    loop {
        interval.tick().await;
        let Some(app) = app.upgrade() else { return };
        if app.shutdown.is_cancelled() {
            return;
        }
        let now = tokio::time::Instant::now();
        if app.reader.any_disk_short() {
            let claims = app.reader.disk_short_claims();
            let fresh = app.claims_seen.fresh(&claims, now.into_std(), Some(app.id()));
            if app.leadership() == crate::app::Leadership::Me {
                let members = members(&app);
                let withdrawn = |node: &u64| !fresh.contains(node) || !members.contains(node);
                for (&node, &stamp) in claims.iter().filter(|&(&node, _)| node != app.id() && withdrawn(&node)) {
                    let request = Request::WithdrawDiskClaim { node_id: node, stamp };
                    if let Err(e) = app.propose_anywhere(request).await {
                        tracing::debug!(error = %e, node, "a lapsed disk claim not withdrawn yet; retrying");
                    }
                }
            }
        }
        let short = app.disk_room.is_short();
        let claimed = app.reader.disk_short_claim(app.id()).is_some();
        let renewal_due = last_claimed.is_none_or(|at| now.duration_since(at) >= DISK_SHORT_CLAIM_RENEW);
        let due = if short { !claimed || renewal_due } else { claimed };
        if !due {
            continue;
        }
        let request = Request::SetDiskShort { node_id: app.id(), short, now_ms: app.now_ms() };
        match app.propose_anywhere(request).await {
            Ok(_) => last_claimed = short.then_some(now),
            Err(e) => tracing::debug!(error = %e, short, "the data dir's room not told to the cluster yet; retrying"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn refusal(room: &DiskRoom) -> (u64, u64, u64) {
        match room.require_room() {
            Err(ApiError::InsufficientStorage { available, needed, reserve }) => (available, needed, reserve),
            other => panic!("expected insufficient_storage, got {other:?}"),
        }
    }

    #[test]
    fn a_reserve_beyond_the_free_space_refuses_and_zero_turns_the_check_off() {
        let dir = tempfile::tempdir().unwrap();
        let available = raft_store::available_bytes(dir.path()).unwrap();
        assert!(DiskRoom::new(dir.path().into(), 1).require_room().is_ok());
        assert!(DiskRoom::new(dir.path().into(), 0).require_room().is_ok());
        let room = DiskRoom::new(dir.path().into(), available.saturating_mul(4).max(1 << 40));
        let (seen, needed, reserve) = refusal(&room);
        assert!(seen < needed);
        assert_eq!((needed, reserve), (room.reserve(), room.reserve()));
        // The refusal stays (from the last reading) and is the documented 507.
        let body = room.require_room().unwrap_err().body();
        assert_eq!(body["error"], "insufficient_storage");
        assert_eq!(body["details"]["min_free_bytes"], room.reserve());
    }

    #[test]
    fn the_newest_snapshot_counts_on_top_of_the_reserve() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("snapshots")).unwrap();
        let snapshot = std::fs::File::create(dir.path().join("snapshots").join("s")).unwrap();
        snapshot.set_len(1 << 40).unwrap(); // sparse: its length is what counts
        let (_, needed, reserve) = refusal(&DiskRoom::new(dir.path().into(), 1));
        assert_eq!((needed, reserve), ((1 << 40) + 1, 1));
    }

    #[test]
    fn room_comes_back_only_past_a_margin_above_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let available = raft_store::available_bytes(dir.path()).unwrap();
        // A reserve just under the free space, short of it once the margin counts.
        let reserve = available - DISK_ROOM_RESUME_MARGIN_BYTES / 2;
        let room = DiskRoom::new(dir.path().into(), reserve);
        assert!(room.require_room().is_ok(), "above the line");
        room.short.store(true, Ordering::Relaxed);
        room.read();
        assert!(room.require_room().is_err(), "above the line, but within the margin once refusing");
    }

    #[test]
    fn a_claim_lapses_after_it_was_last_seen_renewed_and_never_names_the_asking_node() {
        let seen = ClaimsSeen::default();
        let start = Instant::now();
        let at = |secs| start + Duration::from_secs(secs);
        let lapse = DISK_SHORT_CLAIM_LAPSE.as_secs();
        let claims = BTreeMap::from([(2, 100), (3, 5)]);
        assert_eq!(seen.fresh(&claims, at(0), Some(1)), vec![2, 3]);
        assert_eq!(seen.fresh(&claims, at(0), Some(3)), vec![2], "the asking node's own claim is left out");
        // Node 2 renews (a new stamp, whatever its clock says), node 3 does not.
        let renewed = BTreeMap::from([(2, 90), (3, 5)]);
        assert_eq!(seen.fresh(&renewed, at(lapse - 5), Some(1)), vec![2, 3]);
        assert_eq!(seen.fresh(&renewed, at(lapse + 1), Some(1)), vec![2], "node 3's claim lapsed");
        assert_eq!(seen.fresh(&renewed, at(2 * lapse), Some(1)), Vec::<u64>::new());
        // A claim withdrawn and made again counts from when it is seen again.
        assert_eq!(seen.fresh(&BTreeMap::new(), at(2 * lapse), Some(1)), Vec::<u64>::new());
        assert_eq!(seen.fresh(&claims, at(2 * lapse + 1), Some(1)), vec![2, 3]);
    }

    #[test]
    fn a_dir_that_cannot_be_asked_refuses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let room = DiskRoom::new(dir.path().join("missing"), u64::MAX);
        assert!(room.require_room().is_ok());
    }
}
