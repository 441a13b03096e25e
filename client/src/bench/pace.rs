//! `--rate`: one schedule shared by all publishers, message `k` due at `start + k / rate`.
//!
//! A fixed-rate run measures latency at a load the cluster can sustain (for example one
//! publisher at 1,000 msg/s to 100 subscribers), so the schedule must not turn a stall into
//! a burst: a publisher that fell behind may send [`BENCH_PACE_CATCH_UP_MAX`] messages back to
//! back, and past that the schedule slips to now.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::limits::BENCH_PACE_CATCH_UP_MAX;

/// Offsets beyond this (about 31 years) are clamped, so that a tiny rate cannot overflow
/// the `Duration` and `Instant` arithmetic.
const OFFSET_SECS_MAX: f64 = 1e9;

/// When each message is due.
#[derive(Debug)]
pub(super) struct Pacer {
    /// Messages per second, all publishers together.
    rate: f64,
    /// How far behind the schedule may fall before it slips.
    catch_up: Duration,
    /// A plain mutex: one short computation per message, never held across an await.
    schedule: Mutex<Schedule>,
}

#[derive(Debug)]
struct Schedule {
    /// When message 0 of this schedule was due.
    origin: Instant,
    /// Messages scheduled since `origin`.
    scheduled: u64,
}

impl Pacer {
    /// A schedule of `rate` messages per second (finite, above 0) starting at `start`.
    pub(super) fn new(rate: f64, start: Instant) -> Pacer {
        let interval = offset(1, rate);
        Pacer {
            rate,
            catch_up: interval.saturating_mul(BENCH_PACE_CATCH_UP_MAX),
            schedule: Mutex::new(Schedule { origin: start, scheduled: 0 }),
        }
    }

    /// When the next message is due, asked at `now`: `origin + k / rate`, or no earlier than
    /// the catch-up allowance before `now` when the publishers fell behind.
    pub(super) fn next_due(&self, now: Instant) -> Instant {
        let mut schedule = self.schedule.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut due = schedule.origin + offset(schedule.scheduled, self.rate);
        let earliest = now.checked_sub(self.catch_up).unwrap_or(now);
        if due < earliest {
            schedule.origin = earliest;
            schedule.scheduled = 0;
            due = earliest;
        }
        schedule.scheduled += 1;
        due
    }
}

/// `k / rate` seconds.
fn offset(k: u64, rate: f64) -> Duration {
    Duration::from_secs_f64((k as f64 / rate).clamp(0.0, OFFSET_SECS_MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(d: Duration) -> u128 {
        d.as_millis()
    }

    #[test]
    fn messages_are_spread_evenly_from_the_start() {
        let start = Instant::now();
        let pacer = Pacer::new(500.0, start);
        let due: Vec<u128> = (0..5).map(|_| ms(pacer.next_due(start) - start)).collect();
        assert_eq!(due, vec![0, 2, 4, 6, 8]);
    }

    #[test]
    fn a_publisher_behind_schedule_catches_up_by_a_few_messages_only() {
        let start = Instant::now();
        let pacer = Pacer::new(1000.0, start);
        // Asked 1 s late: what is due before `now` minus the allowance is skipped, so at most
        // the allowance is sent back to back.
        let now = start + Duration::from_secs(1);
        let first = pacer.next_due(now);
        assert_eq!(now - first, Duration::from_millis(u64::from(BENCH_PACE_CATCH_UP_MAX)));
        let overdue = (1..100).map(|_| pacer.next_due(now)).take_while(|due| *due < now).count();
        assert_eq!(overdue + 1, BENCH_PACE_CATCH_UP_MAX as usize);
    }

    #[test]
    fn a_tiny_rate_does_not_overflow() {
        let start = Instant::now();
        let pacer = Pacer::new(1e-300, start);
        assert_eq!(pacer.next_due(start), start);
        assert!(pacer.next_due(start) > start + Duration::from_secs(86_400));
    }
}
