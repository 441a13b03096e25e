//! When to retry, how long to wait, and what an answer means for the leader cache.
//!
//! Pure functions, so the policy is tested without a network: [`RetryPolicy::backoff`]
//! gives the wait before a retry and `classify` turns one HTTP answer into a `Verdict`.

use std::time::Duration;

use rand::Rng;

use crate::error::{ApiError, ErrorCode};
use crate::limits;

/// How often and how patiently one operation retries.
///
/// ```
/// use pubsub_client::RetryPolicy;
/// use std::time::Duration;
///
/// let policy = RetryPolicy {
///     attempts_max: 5,
///     ..RetryPolicy::default()
/// };
/// // The wait before the first retry lies between half and all of the first step.
/// let wait = policy.backoff(1, &mut rand::thread_rng());
/// assert!(wait >= policy.backoff_initial / 2 && wait <= policy.backoff_initial);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts one operation may make, the first included (at least 1).
    pub attempts_max: u32,
    /// Wall-clock budget of one operation across all attempts.
    pub operation_timeout: Duration,
    /// The first backoff step; each retry doubles it.
    pub backoff_initial: Duration,
    /// The largest backoff step.
    pub backoff_max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy {
            attempts_max: limits::ATTEMPTS_MAX_DEFAULT,
            operation_timeout: limits::OPERATION_TIMEOUT_DEFAULT,
            backoff_initial: limits::BACKOFF_INITIAL_DEFAULT,
            backoff_max: limits::BACKOFF_MAX_DEFAULT,
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (1 = the first retry): exponential, capped, with
    /// "equal jitter" (a uniform draw in the upper half of the step). The jitter spreads
    /// clients that failed together; the fixed half keeps a retry from coming right back.
    pub fn backoff(&self, retry: u32, rng: &mut impl Rng) -> Duration {
        let step = self.step(retry);
        let half = step / 2;
        let spread_us = u64::try_from((step - half).as_micros()).unwrap_or(u64::MAX);
        half + Duration::from_micros(rng.gen_range(0..=spread_us))
    }

    /// The un-jittered step of retry number `retry`: `initial * 2^(retry-1)`, at most `max`.
    fn step(&self, retry: u32) -> Duration {
        let doublings = retry.saturating_sub(1).min(31);
        self.backoff_initial.checked_mul(1u32 << doublings).unwrap_or(self.backoff_max).min(self.backoff_max)
    }
}

/// What to do with one HTTP answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Verdict {
    /// Final: hand the answer (success or error) to the caller.
    Done,
    /// `307`: ask this node next (the leader cache is updated to it). `None` when the
    /// redirect named no leader: then it is handled like `no_leader`.
    Redirect(Option<url::Url>),
    /// Retry after a backoff. `maybe_applied`: the request may have taken effect (the server
    /// accepted it but could not confirm), so a later `409`/`404` can be our own doing.
    /// `forget_leader`: the cached leader is wrong or gone.
    Retry { maybe_applied: bool, forget_leader: bool },
}

/// A refusal that a node behind the others may give where the leader would not: a topic it
/// has not applied yet, a cursor past its end. Final only when every node gives it.
pub(crate) fn may_lag_behind(api: &ApiError) -> bool {
    matches!(api.code, ErrorCode::TopicNotFound | ErrorCode::InvalidCursor)
}

/// Classifies an answer by status and error body. `location` is the `Location` header.
pub(crate) fn classify(status: u16, error: Option<&ApiError>, location: Option<&str>) -> Verdict {
    match status {
        307 | 308 => {
            let from_body = error.and_then(ApiError::leader_address).and_then(|a| crate::endpoint::parse_base(a).ok());
            let from_header = location.and_then(crate::endpoint::base_of_location);
            Verdict::Redirect(from_body.or(from_header))
        }
        503 => Verdict::Retry { maybe_applied: false, forget_leader: true },
        // The node did not get the whole body in time (`request_timeout`): nothing was done.
        408 => Verdict::Retry { maybe_applied: false, forget_leader: false },
        // The leader could not commit in time: it may have lost its majority (a leader cut off
        // from the others still answers, and would time out every write while the majority
        // elects another), so ask again who leads.
        504 => Verdict::Retry { maybe_applied: true, forget_leader: true },
        // The id is known to the leader but its first publish is still in flight (API.md §7:
        // `existing_sequence` is null). That publish may yet fail, so this is no success;
        // ask again until it resolves into a sequence, or fails and our retry gets a 201.
        409 if error.is_some_and(|e| e.code == ErrorCode::DuplicateMessageId && e.existing_sequence().is_none()) => {
            Verdict::Retry { maybe_applied: false, forget_leader: false }
        }
        500 if error.is_some_and(|e| e.code == ErrorCode::NotCommitted) => Verdict::Retry {
            // The entry was appended but could not commit: usually the leader lost its
            // leadership, so ask again who leads.
            maybe_applied: true,
            forget_leader: true,
        },
        _ => Verdict::Done,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            attempts_max: 10,
            operation_timeout: Duration::from_secs(30),
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_millis(1000),
        }
    }

    #[test]
    fn backoff_doubles_then_stays_at_max() {
        let p = policy();
        let steps: Vec<u128> = (1..=6).map(|r| p.step(r).as_millis()).collect();
        assert_eq!(steps, vec![100, 200, 400, 800, 1000, 1000]);
        assert_eq!(p.step(u32::MAX), Duration::from_millis(1000));
    }

    #[test]
    fn jittered_backoff_stays_within_the_upper_half_of_its_step() {
        let p = policy();
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for retry in 1..=8 {
            let step = p.step(retry);
            for _ in 0..200 {
                let wait = p.backoff(retry, &mut rng);
                assert!(wait >= step / 2 && wait <= step, "{wait:?} for {step:?}");
            }
        }
    }

    #[test]
    fn jitter_spreads_clients_that_failed_together() {
        let p = policy();
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let waits: std::collections::HashSet<Duration> = (0..50).map(|_| p.backoff(3, &mut rng)).collect();
        assert!(waits.len() > 10);
    }

    #[test]
    fn redirect_prefers_the_body_leader_address_over_location() {
        let err = ApiError::from_body(307, br#"{"error":"not_leader","leader_address":"10.0.0.2:8080"}"#);
        let v = classify(307, Some(&err), Some("http://10.0.0.3:8080/topics/t"));
        assert_eq!(v, Verdict::Redirect(crate::endpoint::parse_base("10.0.0.2:8080").ok()));
    }

    #[test]
    fn redirect_without_body_uses_location_and_without_either_names_no_leader() {
        let v = classify(307, None, Some("http://10.0.0.3:8080/topics/t"));
        assert_eq!(v, Verdict::Redirect(crate::endpoint::parse_base("10.0.0.3:8080").ok()));
        let nothing = ApiError::from_body(307, br#"{"error":"not_leader","leader_address":null}"#);
        assert_eq!(classify(307, Some(&nothing), None), Verdict::Redirect(None));
    }

    #[test]
    fn no_leader_and_raft_timeout_are_retried_and_only_timeouts_may_have_applied() {
        let no_leader = ApiError::from_body(503, br#"{"error":"no_leader"}"#);
        assert_eq!(classify(503, Some(&no_leader), None), Verdict::Retry { maybe_applied: false, forget_leader: true });
        let timeout = ApiError::from_body(504, br#"{"error":"raft_timeout"}"#);
        assert_eq!(classify(504, Some(&timeout), None), Verdict::Retry { maybe_applied: true, forget_leader: true });
        let slow_body = ApiError::from_body(408, br#"{"error":"request_timeout"}"#);
        assert_eq!(
            classify(408, Some(&slow_body), None),
            Verdict::Retry { maybe_applied: false, forget_leader: false }
        );
        let not_committed = ApiError::from_body(500, br#"{"error":"not_committed"}"#);
        assert!(matches!(classify(500, Some(&not_committed), None), Verdict::Retry { maybe_applied: true, .. }));
    }

    #[test]
    fn duplicate_still_in_flight_is_retried_without_forgetting_the_leader() {
        // API.md §7: `existing_sequence: null` means the first publish may yet fail.
        for body in [
            r#"{"error":"duplicate_message_id","id":"a","existing_sequence":null}"#,
            r#"{"error":"duplicate_message_id","details":{"existing_sequence":null}}"#,
        ] {
            let err = ApiError::from_body(409, body.as_bytes());
            assert_eq!(
                classify(409, Some(&err), None),
                Verdict::Retry { maybe_applied: false, forget_leader: false },
                "{body}"
            );
        }
    }

    #[test]
    fn client_errors_and_other_server_errors_are_final() {
        for (status, body) in [
            (404, r#"{"error":"topic_not_found"}"#),
            (409, r#"{"error":"duplicate_message_id","existing_sequence":3}"#),
            (400, r#"{"error":"invalid_request"}"#),
            (500, r#"{"error":"internal"}"#),
        ] {
            let err = ApiError::from_body(status, body.as_bytes());
            assert_eq!(classify(status, Some(&err), None), Verdict::Done, "{status}");
        }
        assert_eq!(classify(201, None, None), Verdict::Done);
    }
}
