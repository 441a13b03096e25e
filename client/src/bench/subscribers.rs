//! The fan-out side of `pubsub bench`: subscriptions opened concurrently, each counting what
//! it receives and recording deliver latency from the timestamp in the payload.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::stream::{self, StreamExt, TryStreamExt};
use hdrhistogram::Histogram;
use serde_json::Value;
use tokio::sync::watch;

use super::{now_us, record};
use crate::client::Client;
use crate::endpoint::Cursor;
use crate::error::Error;
use crate::limits::BENCH_CONNECTS_CONCURRENT;
use crate::subscription::{Event, SubscribeOptions, Subscription};

/// Publish→deliver latency of every message to every subscriber. One histogram shared by all
/// subscribers rather than one each: a thousand histograms made every record a cache miss
/// (`record_n_inner` was the load generator's top symbol in a 1,000-subscriber run), while
/// the lock is taken by at most one task per worker thread at a time.
pub(super) type SharedLatency = Arc<Mutex<Histogram<u64>>>;

/// What one subscriber received.
pub(super) struct Received {
    /// Messages received.
    pub(super) count: u64,
    /// Stream errors (gaps, a reconnect budget spent).
    pub(super) errors: u64,
}

/// Opens `count` subscriptions from the latest sequence, [`BENCH_CONNECTS_CONCURRENT`] at a
/// time; the first refusal fails the whole run.
pub(super) async fn open(client: &Client, topic: &str, count: usize) -> Result<Vec<Subscription>, Error> {
    stream::iter(0..count)
        .map(|i| async move {
            let id = format!("bench-{i}-{}", uuid::Uuid::new_v4().simple());
            client.subscribe(topic, SubscribeOptions::new(id).cursor(Cursor::Latest)).await
        })
        .buffer_unordered(BENCH_CONNECTS_CONCURRENT)
        .try_collect()
        .await
}

/// Receives until it has seen `target` messages (known once publishing ends) or the drain
/// timeout passes after that.
pub(super) async fn receive(
    mut sub: Subscription,
    latency: SharedLatency,
    target: watch::Receiver<Option<u64>>,
    drain: Duration,
) -> Received {
    let mut received = Received { count: 0, errors: 0 };
    let mut last = 0u64;
    let mut goal = None;
    // One wait for the goal and one timer for the whole run, not one of each per message:
    // with a thousand subscribers they showed in the load generator's profile.
    let goal_known = wait_for_goal(target);
    tokio::pin!(goal_known);
    let drain_end = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(drain_end);
    loop {
        if goal.is_some_and(|goal| received.count >= goal) {
            break;
        }
        tokio::select! {
            () = &mut drain_end, if goal.is_some() => break,
            known = &mut goal_known, if goal.is_none() => match known {
                Some(known) => {
                    goal = Some(known);
                    drain_end.as_mut().reset(tokio::time::Instant::now() + drain);
                }
                None => break,
            },
            event = sub.next() => match event {
                // A message sent again after a reconnect counts once (and its latency is not
                // taken again): delivered counts distinct messages.
                Some(Ok(Event::Message(m))) if m.sequence > last => {
                    last = m.sequence;
                    received.count += 1;
                    if let Some(t_us) = m.payload.get("t_us").and_then(Value::as_u64) {
                        let elapsed = Duration::from_micros(now_us().saturating_sub(t_us));
                        record(&mut latency.lock().unwrap_or_else(|e| e.into_inner()), elapsed);
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(_)) => received.errors += 1,
                None => break,
            }
        }
    }
    received
}

/// The number of messages to expect, once publishing has ended; `None` if the run was
/// abandoned first.
async fn wait_for_goal(mut target: watch::Receiver<Option<u64>>) -> Option<u64> {
    loop {
        if let Some(goal) = *target.borrow_and_update() {
            return Some(goal);
        }
        if target.changed().await.is_err() {
            return None;
        }
    }
}
