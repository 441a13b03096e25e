//! The time a node stamps on what it proposes (a message's `timestamp`, the `now_ms` of a
//! publish, a topic creation or a retention `Tick`), agreed with the other voters.
//!
//! Retention compares the times recorded in the log, so one node's wrong clock is the
//! cluster's: a leader whose clock is ahead by `retention_hours` (an NTP step, a VM restored
//! from a snapshot) trims whole topics at its first tick, and one behind stamps messages old,
//! for the next leader to trim early. So every [`CLOCK_SAMPLE_INTERVAL`] each node asks the
//! other voters for their clocks, and a node more than [`CLOCK_OFFSET_TOLERATED_MS`] off the
//! voters' median (its own clock counted if it votes) stamps the median's time: one wrong
//! clock of three, or two of five, is outvoted. Between samplings the agreed time advances by
//! the monotonic clock, so a step of the node's own clock waits for the next sampling to be
//! judged. A sampling that reaches no majority of the voters leaves the last agreement in
//! force until it is [`CLOCK_AGREEMENT_MAX_AGE`] old; with none (a single voter, a node cut
//! off, peers of an older build), the node stamps by its own clock, as before.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::future::join_all;
use raft_store::NodeId;
use tokio::time::Instant;

use crate::app::App;
use crate::limits::{
    CLOCK_AGREEMENT_MAX_AGE, CLOCK_OFFSET_LOG_INTERVAL, CLOCK_OFFSET_TOLERATED_MS, CLOCK_SAMPLE_INTERVAL,
    CLOCK_SAMPLE_RTT_MAX,
};
use crate::net::Clock;
use crate::raft::codec::{RpcRequest, RpcResponse};

/// The node's clock, corrected by the voters' agreement when one is recent.
pub struct ClusterClock {
    local: Arc<dyn Clock>,
    agreed: Mutex<Option<Agreement>>,
}

/// The cluster's time at one monotonic instant.
#[derive(Debug, Clone, Copy)]
struct Agreement {
    /// This node's clock at `at`, and what the voters' median adds to it (0 within tolerance).
    local_ms: u64,
    offset_ms: i64,
    at: Instant,
}

impl ClusterClock {
    pub fn new(local: Arc<dyn Clock>) -> Self {
        Self { local, agreed: Mutex::new(None) }
    }

    /// Milliseconds since the Unix epoch, as the voters agree.
    pub fn now_ms(&self) -> u64 {
        match self.recent() {
            Some((a, age)) => Self::agreed_ms(a, age),
            None => self.local.now_ms(),
        }
    }

    /// The time `a` gives once it is `age` old.
    fn agreed_ms(a: Agreement, age: std::time::Duration) -> u64 {
        (a.local_ms as i64 + a.offset_ms).max(0) as u64 + age.as_millis() as u64
    }

    /// This node's own clock, uncorrected: what it tells the peers that sample it.
    pub fn local_ms(&self) -> u64 {
        self.local.now_ms()
    }

    /// What the voters' agreement adds to this node's clock: 0 when none is recent, or when
    /// this node is within tolerance of it.
    pub fn offset_ms(&self) -> i64 {
        self.recent().map_or(0, |(a, _)| a.offset_ms)
    }

    /// The agreement and its age, unless it is older than [`CLOCK_AGREEMENT_MAX_AGE`].
    fn recent(&self) -> Option<(Agreement, std::time::Duration)> {
        let agreed = *self.agreed.lock().unwrap_or_else(|e| e.into_inner());
        agreed.map(|a| (a, a.at.elapsed())).filter(|(_, age)| *age <= CLOCK_AGREEMENT_MAX_AGE)
    }

    /// The offset from this node's clock that the recent agreement predicts now (0 without
    /// one): it follows a step of this node's own clock since the agreement.
    fn expected_offset_ms(&self) -> i64 {
        match self.recent() {
            Some((a, age)) => Self::agreed_ms(a, age) as i64 - self.local.now_ms() as i64,
            None => 0,
        }
    }

    /// Records the voters' median offset from this node's clock. A sampling that found no
    /// agreement changes nothing: the last one serves until [`CLOCK_AGREEMENT_MAX_AGE`], so one
    /// slow round does not hand the stamps back to a wrong clock.
    fn agree(&self, median_ms: i64) {
        let agreement = Agreement {
            local_ms: self.local.now_ms(),
            offset_ms: if median_ms.unsigned_abs() <= CLOCK_OFFSET_TOLERATED_MS { 0 } else { median_ms },
            at: Instant::now(),
        };
        *self.agreed.lock().unwrap_or_else(|e| e.into_inner()) = Some(agreement);
    }
}

/// The offset the voters agree on, from the offsets of the voters sampled (this node's own,
/// 0, among them if it votes) of `voters` in all: the median, or with an even number sampled
/// the one of the two middle ones nearer `expected` (what the last agreement predicts: with
/// one voter of three unreachable, a wrong clock and a right one cannot tell which is which,
/// and the last agreement decides). `None` unless a majority of the voters was sampled: fewer
/// could all be wrong together.
fn median_offset(mut sampled: Vec<i64>, voters: usize, expected: i64) -> Option<i64> {
    if sampled.len() * 2 <= voters {
        return None;
    }
    sampled.sort_unstable();
    let n = sampled.len();
    if n % 2 == 1 {
        return Some(sampled[n / 2]);
    }
    let (low, high) = (sampled[n / 2 - 1], sampled[n / 2]);
    Some(if low.abs_diff(expected) <= high.abs_diff(expected) { low } else { high })
}

/// What a peer told of its clock.
enum Sample {
    /// Its offset from this node's clock, measured at the middle of the round trip.
    Offset(i64),
    /// An older build, which cannot read the request (and logs that it could not).
    OlderBuild,
    /// No answer within [`CLOCK_SAMPLE_RTT_MAX`].
    Unanswered,
}

async fn sample(app: &App, target: NodeId, addr: &str) -> Sample {
    let sent_ms = app.clock.local_ms();
    let sent = Instant::now();
    let answer = app.peers.conn(target, addr).call(RpcRequest::Clock { target }, CLOCK_SAMPLE_RTT_MAX).await;
    let rtt = sent.elapsed();
    match answer {
        Ok(RpcResponse::Clock { now_ms }) if rtt <= CLOCK_SAMPLE_RTT_MAX => {
            Sample::Offset(now_ms as i64 - (sent_ms as i64 + rtt.as_millis() as i64 / 2))
        }
        Ok(RpcResponse::Undecodable) => Sample::OlderBuild,
        _ => Sample::Unanswered,
    }
}

/// One sampling: the voters' agreement as this node sees it now. Peers of an older build
/// (during a rolling upgrade) are asked again only after [`CLOCK_OFFSET_LOG_INTERVAL`], so
/// that they do not log an unreadable request every sampling.
async fn sample_voters(app: &App, older_builds: &mut HashMap<NodeId, Instant>) -> Option<i64> {
    let voters: Vec<(NodeId, String)> = {
        let metrics = app.raft.metrics();
        let metrics = metrics.borrow();
        let membership = metrics.membership_config.membership();
        membership.voter_ids().filter_map(|id| membership.get_node(&id).map(|n| (id, n.addr.clone()))).collect()
    };
    older_builds.retain(|_, at| at.elapsed() < CLOCK_OFFSET_LOG_INTERVAL);
    let me = app.id();
    let asked: Vec<_> = voters.iter().filter(|(id, _)| *id != me && !older_builds.contains_key(id)).collect();
    if asked.is_empty() {
        return None;
    }
    let answers = join_all(asked.iter().map(|(id, addr)| sample(app, *id, addr))).await;
    let mut sampled = Vec::with_capacity(voters.len());
    for ((id, _), answer) in asked.iter().zip(answers) {
        match answer {
            Sample::Offset(offset) => sampled.push(offset),
            Sample::OlderBuild => {
                older_builds.insert(*id, Instant::now());
            }
            Sample::Unanswered => {}
        }
    }
    if voters.iter().any(|(id, _)| *id == me) {
        sampled.push(0);
    }
    median_offset(sampled, voters.len(), app.clock.expected_offset_ms())
}

/// Samples the voters' clocks every [`CLOCK_SAMPLE_INTERVAL`] for as long as the node runs.
pub async fn run(app: std::sync::Weak<App>) {
    let mut interval = tokio::time::interval(CLOCK_SAMPLE_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut logged: Option<Instant> = None;
    let mut older_builds = HashMap::new();
    loop {
        interval.tick().await;
        let Some(app) = app.upgrade() else { return };
        if app.shutdown.is_cancelled() {
            return;
        }
        if let Some(median) = sample_voters(&app, &mut older_builds).await {
            app.clock.agree(median);
        }
        let offset = app.clock.offset_ms();
        if offset != 0 && logged.is_none_or(|at| at.elapsed() >= CLOCK_OFFSET_LOG_INTERVAL) {
            tracing::warn!(
                offset_ms = offset,
                "this node's clock is off the median of the voters' clocks; it stamps messages and retention \
                 ticks with the voters' time (check its NTP)"
            );
            logged = Some(Instant::now());
        } else if offset == 0 && logged.take().is_some() {
            tracing::info!("this node's clock agrees with the voters' again");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_median_outvotes_one_wrong_clock_of_three() {
        const HOURS_2: i64 = 7_200_000;
        // This node ahead: both others are two hours behind it.
        assert_eq!(median_offset(vec![0, -HOURS_2, -HOURS_2 + 3], 3, 0), Some(-HOURS_2 + 3));
        // Another node ahead: this node's clock stands.
        assert_eq!(median_offset(vec![0, HOURS_2, 4], 3, 0), Some(4));
        // Five voters, two of them wrong.
        assert_eq!(median_offset(vec![0, 1, -2, HOURS_2, HOURS_2], 5, 0), Some(1));
    }

    #[test]
    fn without_a_majority_sampled_there_is_no_agreement() {
        assert_eq!(median_offset(vec![0], 3, 0), None);
        assert_eq!(median_offset(vec![0, 5], 4, 0), None);
        assert_eq!(median_offset(vec![], 1, 0), None);
    }

    #[test]
    fn between_two_middle_offsets_the_one_the_last_agreement_expects() {
        // Two of three sampled, one of them this node: the samples cannot tell which is wrong.
        assert_eq!(median_offset(vec![0, -9_000_000], 3, 0), Some(0));
        assert_eq!(median_offset(vec![0, -9_000_000], 3, -8_999_990), Some(-9_000_000));
        assert_eq!(median_offset(vec![-10, 0, 7, 50], 4, 0), Some(0));
        assert_eq!(median_offset(vec![-30, -20, 100, 500], 4, 0), Some(-20));
        assert_eq!(median_offset(vec![-30, -20, 100, 500], 4, 90), Some(100));
    }

    struct FixedClock(AtomicU64);

    impl Clock for FixedClock {
        fn now_ms(&self) -> u64 {
            self.0.load(Ordering::SeqCst)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_agreement_corrects_the_clock_until_it_is_stale() {
        let local = Arc::new(FixedClock(AtomicU64::new(10_000_000)));
        let clock = ClusterClock::new(local.clone());
        assert_eq!(clock.now_ms(), 10_000_000, "no agreement: the node's own clock");

        clock.agree(-3_600_000);
        assert_eq!(clock.now_ms(), 6_400_000);
        assert_eq!(clock.offset_ms(), -3_600_000);
        // Time passes by the monotonic clock; a step of the node's own clock is not taken,
        // and the offset the agreement now expects follows the step.
        tokio::time::advance(Duration::from_millis(1_500)).await;
        local.0.store(99_000_000, Ordering::SeqCst);
        assert_eq!(clock.now_ms(), 6_401_500);
        assert_eq!(clock.expected_offset_ms(), 6_401_500 - 99_000_000);

        tokio::time::advance(CLOCK_AGREEMENT_MAX_AGE).await;
        assert_eq!(clock.now_ms(), 99_000_000, "a stale agreement: the node's own clock");
        assert_eq!(clock.offset_ms(), 0);
        assert_eq!(clock.expected_offset_ms(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_offset_within_tolerance_keeps_the_nodes_own_time() {
        let local = Arc::new(FixedClock(AtomicU64::new(5_000)));
        let clock = ClusterClock::new(local);
        clock.agree(CLOCK_OFFSET_TOLERATED_MS as i64);
        assert_eq!(clock.offset_ms(), 0);
        assert_eq!(clock.now_ms(), 5_000);
        clock.agree(-(CLOCK_OFFSET_TOLERATED_MS as i64) - 1);
        assert_eq!(clock.now_ms(), 5_000 - CLOCK_OFFSET_TOLERATED_MS - 1);
    }
}
