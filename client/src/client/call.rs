//! The retry loop: one [`Call`] replayed until it gets a final answer or the retry budget
//! runs out, with leader discovery and redirects.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::Method;
use serde::de::DeserializeOwned;
use url::Url;

use super::http::{is_success, HttpError};
use super::Client;
use crate::endpoint::http_url;
use crate::error::{ApiError, BoxError, Error, ErrorCode};
use crate::limits;
use crate::retry::{classify, may_lag_behind, RetryPolicy, Verdict};
use crate::types::ClusterInfo;

/// Why one attempt failed, kept to report the last one when the budget runs out. Shared with
/// the publisher's connect loop, so both report a spent budget alike.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Could not connect, or the connection broke or timed out.
    Transport {
        /// The transport error.
        error: BoxError,
        /// True when it was a timeout.
        timeout: bool,
    },
    /// No node named a leader.
    NoLeader,
    /// The server answered with a retryable error.
    Api(ApiError),
}

/// One HTTP operation, replayable on every attempt.
#[derive(Debug, Clone)]
pub(super) struct Call {
    /// HTTP method.
    pub(super) method: Method,
    /// Path segments, percent-encoded when the URL is built.
    pub(super) segments: Vec<String>,
    /// Query parameters.
    pub(super) query: Vec<(&'static str, String)>,
    /// Serialized once; every attempt sends the same bytes (the same message id).
    pub(super) body: Option<Bytes>,
    /// Writes must reach the leader; reads may go anywhere.
    pub(super) to_leader: bool,
    /// Added to the request timeout (a long poll's wait).
    pub(super) extra_timeout: Duration,
    /// Sent as `Authorization: Bearer …` (membership changes of a cluster with a secret).
    pub(super) secret: Option<String>,
}

impl Call {
    pub(super) fn new(method: Method, segments: &[&str], to_leader: bool) -> Call {
        Call {
            method,
            segments: segments.iter().map(|s| s.to_string()).collect(),
            query: Vec::new(),
            body: None,
            to_leader,
            extra_timeout: Duration::ZERO,
            secret: None,
        }
    }

    pub(super) fn json_body(mut self, body: &impl serde::Serialize) -> Result<Call, Error> {
        let bytes =
            serde_json::to_vec(body).map_err(|e| Error::InvalidArgument(format!("body does not serialize: {e}")))?;
        self.body = Some(Bytes::from(bytes));
        Ok(self)
    }
}

/// The final answer of an operation, with what the retries learned.
#[derive(Debug)]
pub(super) struct Reply {
    /// HTTP status of the final answer.
    pub(super) status: u16,
    /// Its body.
    pub(super) body: Bytes,
    /// Where it came from, for error reports.
    pub(super) url: Url,
    /// An earlier attempt of a write (not a GET) may have taken effect on the server.
    pub(super) maybe_applied: bool,
}

impl Reply {
    fn is_success(&self) -> bool {
        is_success(self.status)
    }

    pub(super) fn api_error(&self) -> ApiError {
        ApiError::from_body(self.status, &self.body)
    }

    pub(super) fn parse<T: DeserializeOwned>(&self) -> Result<T, Error> {
        if !self.is_success() {
            let error = Error::Api(self.api_error());
            // The last answer speaks for the last attempt only: an earlier one of this write
            // may have been stored all the same (its answer lost, say, then `500 internal`).
            return Err(if self.maybe_applied { Error::indeterminate(None, error) } else { error });
        }
        serde_json::from_slice(&self.body)
            .map_err(|e| Error::Protocol { url: self.url.to_string(), reason: format!("status {}: {e}", self.status) })
    }
}

impl Client {
    /// `GET /cluster` of `node`: `None` when it answers with an error status.
    pub(super) async fn cluster_info(&self, node: &Url, timeout: Duration) -> Result<Option<ClusterInfo>, Failure> {
        let url = http_url(node, &["cluster"], &[]);
        let answer = self.inner.http.send(Method::GET, &url, None, None, timeout).await.map_err(transport_failure)?;
        if !is_success(answer.status) {
            return Ok(None);
        }
        serde_json::from_slice(&answer.body)
            .map(Some)
            .map_err(|e| Failure::Transport { error: Box::new(e), timeout: false })
    }

    /// One pass of `GET /cluster` over the known nodes, starting at the round-robin position,
    /// until one names a leader; all of it within `timeout` (nodes not asked by then are not).
    pub(crate) async fn discover(&self, timeout: Duration) -> Result<Url, Failure> {
        let deadline = Instant::now() + timeout;
        let mut last = Failure::NoLeader;
        for _ in 0..self.node_count() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let node = self.next_node();
            // Each node within the connect timeout: a frozen node whose kernel still accepts
            // connections would otherwise spend the whole attempt on one `/cluster`.
            match self.cluster_info(&node, left.min(self.inner.config.connect_timeout)).await {
                Ok(Some(info)) => {
                    self.learn(&info);
                    if let Some(leader) = self.leader() {
                        if info.leader_address.is_some() {
                            return Ok(leader);
                        }
                    }
                    last = Failure::NoLeader;
                }
                Ok(None) => {}
                Err(failure) => last = failure,
            }
        }
        Err(last)
    }

    /// Runs a call until it gets a final answer or the retry budget runs out.
    pub(super) async fn execute(&self, call: &Call) -> Result<Reply, Error> {
        for segment in &call.segments {
            crate::endpoint::check_path_segment(segment)?;
        }
        // A long poll's wait is spent at the server, not on retries: it extends the budget.
        let policy = &RetryPolicy {
            operation_timeout: self.inner.config.retry.operation_timeout + call.extra_timeout,
            ..self.inner.config.retry.clone()
        };
        let started = Instant::now();
        let mut attempts: u32 = 0;
        let mut maybe_applied = false;
        let mut redirect_hops: u32 = 0;
        let mut redirect_to: Option<Url> = None;
        // Nodes that refused a read as a node behind the others may (`may_lag_behind`), or
        // could not be reached: such a refusal is final once every node is one of them.
        let mut passed: HashSet<Url> = HashSet::new();
        let mut learned = false;
        loop {
            attempts += 1;
            let remaining = policy.operation_timeout.saturating_sub(started.elapsed());
            let timeout = (self.inner.config.request_timeout + call.extra_timeout).min(remaining);
            let mut sleep_before_next = true;
            let failure = 'attempt: {
                let target = match redirect_to.take() {
                    Some(url) => url,
                    None if call.to_leader => match self.leader() {
                        Some(leader) => leader,
                        None => match self.discover(timeout).await {
                            Ok(leader) => leader,
                            Err(failure) => break 'attempt failure,
                        },
                    },
                    // Reads stay on one node while it answers: a cursor from one node's pages may
                    // be past another's end, which that node would refuse.
                    None => self.leader().unwrap_or_else(|| self.current_node()),
                };
                let url = http_url(&target, &segments(call), &call.query);
                // Discovery may have used part of the budget.
                let timeout = timeout.min(policy.operation_timeout.saturating_sub(started.elapsed()));
                let answer = match self
                    .inner
                    .http
                    .send(call.method.clone(), &url, call.body.clone(), call.secret.as_deref(), timeout)
                    .await
                {
                    Ok(answer) => answer,
                    Err(e) => {
                        // Past the connect stage the request may have been received.
                        maybe_applied |= !e.is_connect();
                        self.forget_leader(&target);
                        self.move_past(&target);
                        passed.insert(target.clone());
                        break 'attempt transport_failure(e);
                    }
                };
                let (status, location, body) = (answer.status, answer.location, answer.body);
                let error = (status >= 300).then(|| ApiError::from_body(status, &body));
                // Not the cached leader's: it is the freshest. Not a long poll's `invalid_cursor`
                // either: that node already waited the whole wait for the cursor.
                let lag_refusal = call.method == Method::GET
                    && self.leader().as_ref() != Some(&target)
                    && error.as_ref().is_some_and(|e| {
                        may_lag_behind(e) && (e.code != ErrorCode::InvalidCursor || call.extra_timeout.is_zero())
                    });
                if lag_refusal {
                    passed.insert(target.clone());
                }
                let others_left = lag_refusal && !self.every_node_in_once_learned(&passed, &mut learned).await;
                match classify(status, error.as_ref(), location.as_deref()) {
                    // Final only when every node says so: the next may be further along.
                    Verdict::Done if others_left => {
                        redirect_to = Some(self.node_not_in(&passed));
                        sleep_before_next = false;
                        Failure::Api(error.expect("a refusal has an error body"))
                    }
                    Verdict::Done => {
                        // A write the server failed (a `5xx` not retried, `internal` say) may
                        // have been done before it failed; a refusal for want of disk was
                        // checked before anything was proposed.
                        let refused_for_room = error.as_ref().is_some_and(|e| e.code == ErrorCode::InsufficientStorage);
                        let server_failed = status >= 500 && !refused_for_room;
                        let maybe_applied = (maybe_applied || server_failed) && call.method != Method::GET;
                        return Ok(Reply { status, body, url, maybe_applied });
                    }
                    Verdict::Redirect(Some(leader)) => {
                        redirect_hops += 1;
                        // Follow at once unless the cluster bounces us around or points back at
                        // the node that just refused.
                        sleep_before_next = redirect_hops > limits::REDIRECT_HOPS_MAX || (leader == target);
                        self.set_leader(leader.clone());
                        redirect_to = Some(leader);
                        match error {
                            Some(e) => Failure::Api(e),
                            None => Failure::NoLeader,
                        }
                    }
                    Verdict::Redirect(None) => {
                        self.forget_leader(&target);
                        self.move_past(&target);
                        Failure::NoLeader
                    }
                    Verdict::Retry { maybe_applied: applied, forget_leader } => {
                        maybe_applied |= applied;
                        if forget_leader {
                            self.forget_leader(&target);
                            self.move_past(&target);
                        }
                        match error {
                            Some(e) if e.code == ErrorCode::NoLeader => Failure::NoLeader,
                            Some(e) => Failure::Api(e),
                            None => Failure::NoLeader,
                        }
                    }
                }
            };
            retry_or_give_up(policy, failure, attempts, started, sleep_before_next, "retrying").await.map_err(
                |error| match maybe_applied && call.method != Method::GET {
                    // Named after the last failure alone, the error would hide that an earlier
                    // attempt of a write may have been stored (a lost answer, then no leader).
                    true => Error::indeterminate(None, error),
                    false => error,
                },
            )?;
        }
    }
}

fn segments(call: &Call) -> Vec<&str> {
    call.segments.iter().map(String::as_str).collect()
}

fn transport_failure(error: HttpError) -> Failure {
    Failure::Transport { timeout: error.is_timeout(), error: Box::new(error) }
}

/// After failed attempt number `attempts` of an operation begun at `started`: the error to
/// report (named after `failure`) when the attempts or the time budget are used up; else
/// waits the backoff, unless `sleep` is false (a redirect is followed at once), and returns.
/// Shared by HTTP calls and the publishing WebSocket's upgrade.
pub(crate) async fn retry_or_give_up(
    policy: &RetryPolicy,
    failure: Failure,
    attempts: u32,
    started: Instant,
    sleep: bool,
    what: &str,
) -> Result<(), Error> {
    let elapsed = started.elapsed();
    if attempts >= policy.attempts_max || elapsed >= policy.operation_timeout {
        return Err(exhausted(failure, attempts, elapsed));
    }
    if sleep {
        let wait = policy.backoff(attempts, &mut rand::thread_rng());
        // Sleeping to the deadline would leave the next attempt no time at all: it would
        // fail as a timeout and hide why this one failed.
        if wait >= policy.operation_timeout.saturating_sub(elapsed) {
            return Err(exhausted(failure, attempts, elapsed));
        }
        tracing::debug!(attempts, ?failure, "{what}");
        tokio::time::sleep(wait).await;
    } else {
        tracing::debug!(attempts, ?failure, "{what}");
    }
    Ok(())
}

/// The error to report when the budget ran out, named after the last failure.
fn exhausted(failure: Failure, attempts: u32, elapsed: Duration) -> Error {
    match failure {
        Failure::NoLeader => Error::NoLeader { attempts, elapsed },
        Failure::Transport { timeout: true, .. } => Error::Timeout { attempts, elapsed },
        Failure::Transport { error, .. } => Error::Unreachable { attempts, source: error },
        Failure::Api(api) => Error::Api(api),
    }
}
