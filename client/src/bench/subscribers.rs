//! The fan-out side of `pubsub bench`: subscriptions opened concurrently, each counting what
//! it receives and recording deliver latency from the timestamp in the payload.

use std::time::Duration;

use futures_util::stream::{self, StreamExt, TryStreamExt};
use hdrhistogram::Histogram;
use serde_json::Value;
use tokio::sync::watch;

use super::{histogram, now_us, record};
use crate::client::Client;
use crate::endpoint::Cursor;
use crate::error::Error;
use crate::limits::BENCH_CONNECTS_CONCURRENT;
use crate::subscription::{Event, SubscribeOptions, Subscription};

/// What one subscriber received.
pub(super) struct Received {
    /// Publish→deliver latency of each message.
    pub(super) latency: Histogram<u64>,
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
    mut target: watch::Receiver<Option<u64>>,
    drain: Duration,
) -> Received {
    let mut received = Received { latency: histogram(), count: 0, errors: 0 };
    // One timer, armed when the target is known: not one per message per subscriber.
    let drain_end = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(drain_end);
    let mut draining = false;
    loop {
        let goal = *target.borrow();
        if let Some(goal) = goal {
            if received.count >= goal {
                break;
            }
            if !draining {
                drain_end.as_mut().reset(tokio::time::Instant::now() + drain);
                draining = true;
            }
        }
        tokio::select! {
            () = &mut drain_end, if draining => break,
            // Once the goal is known there is nothing more to learn from `target`.
            changed = target.changed(), if goal.is_none() => {
                if changed.is_err() {
                    break;
                }
            }
            event = sub.next() => match event {
                Some(Ok(Event::Message(m))) => {
                    received.count += 1;
                    if let Some(t_us) = m.payload.get("t_us").and_then(Value::as_u64) {
                        record(&mut received.latency, Duration::from_micros(now_us().saturating_sub(t_us)));
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
