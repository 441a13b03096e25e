//! Opening a publishing WebSocket on the leader: the HTTP retry rules (leader cache,
//! discovery, `307` redirects, backoff within the retry budget) applied to an upgrade.

use std::time::{Duration, Instant};

use tokio_tungstenite::tungstenite::{self, http::header::LOCATION};
use url::Url;

use super::Socket;
use crate::client::{retry_or_give_up, Client, Failure};
use crate::endpoint::publish_url;
use crate::error::{ApiError, Error, ErrorCode};
use crate::limits;
use crate::retry::{classify, Verdict};

/// How one upgrade attempt failed.
enum Refusal {
    /// The node answered with an HTTP error instead of upgrading.
    Http {
        /// The error body, with the answer's status.
        error: ApiError,
        /// The `Location` header of a redirect.
        location: Option<String>,
    },
    /// No connection, a broken one, or a timeout.
    Transport(Failure),
}

/// Connects to the leader's `/topics/:name/publish`; returns the socket and the node.
pub(super) async fn connect(client: &Client, topic: &str) -> Result<(Socket, Url), Error> {
    let config = client.config();
    let policy = &config.retry;
    let started = Instant::now();
    let mut attempts: u32 = 0;
    let mut redirect_hops: u32 = 0;
    let mut redirect_to: Option<Url> = None;
    loop {
        attempts += 1;
        let remaining = policy.operation_timeout.saturating_sub(started.elapsed());
        let timeout = (config.connect_timeout + config.request_timeout).min(remaining);
        let mut sleep_before_next = true;
        let failure = 'attempt: {
            let target = match redirect_to.take() {
                Some(url) => url,
                None => match client.leader() {
                    Some(leader) => leader,
                    None => match client.discover(timeout).await {
                        Ok(leader) => leader,
                        Err(failure) => break 'attempt failure,
                    },
                },
            };
            let (error, location) = match upgrade(&target, topic, timeout).await {
                Ok(socket) => return Ok((socket, target)),
                Err(Refusal::Transport(failure)) => {
                    client.forget_leader(&target);
                    break 'attempt failure;
                }
                Err(Refusal::Http { error, location }) => (error, location),
            };
            if error.status < 300 {
                let reason = format!("answered {} instead of upgrading to a WebSocket", error.status);
                return Err(Error::Protocol { url: publish_url(&target, topic).to_string(), reason });
            }
            match classify(error.status, Some(&error), location.as_deref()) {
                Verdict::Done => return Err(Error::Api(error)),
                Verdict::Redirect(Some(leader)) => {
                    redirect_hops += 1;
                    // As for HTTP: follow at once unless bounced around or sent back here.
                    sleep_before_next = redirect_hops > limits::REDIRECT_HOPS_MAX || leader == target;
                    client.set_leader(leader.clone());
                    redirect_to = Some(leader);
                    Failure::Api(error)
                }
                Verdict::Redirect(None) => {
                    client.forget_leader(&target);
                    Failure::NoLeader
                }
                Verdict::Retry { forget_leader, .. } => {
                    if forget_leader {
                        client.forget_leader(&target);
                    }
                    if error.code == ErrorCode::NoLeader {
                        Failure::NoLeader
                    } else {
                        Failure::Api(error)
                    }
                }
            }
        };
        retry_or_give_up(policy, failure, attempts, started, sleep_before_next, "retrying the publish connection")
            .await?;
    }
}

/// One upgrade attempt on one node. Nagle's algorithm is off: publishes are small frames
/// whose latency matters, and the writer already coalesces them under load.
async fn upgrade(node: &Url, topic: &str, timeout: Duration) -> Result<Socket, Refusal> {
    let url = publish_url(node, topic);
    let handshake = tokio_tungstenite::connect_async_with_config(url.as_str(), Some(crate::limits::ws_config()), true);
    match tokio::time::timeout(timeout, handshake).await {
        Err(elapsed) => Err(Refusal::Transport(Failure::Transport { error: Box::new(elapsed), timeout: true })),
        Ok(Ok((socket, _response))) => Ok(socket),
        Ok(Err(tungstenite::Error::Http(response))) => {
            let status = response.status().as_u16();
            let location = response.headers().get(LOCATION).and_then(|v| v.to_str().ok()).map(str::to_string);
            let body = response.body().as_deref().unwrap_or_default();
            Err(Refusal::Http { error: ApiError::from_body(status, body), location })
        }
        Ok(Err(error)) => Err(Refusal::Transport(Failure::Transport { error: Box::new(error), timeout: false })),
    }
}
