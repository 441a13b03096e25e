//! The load generator behind `pubsub bench`: publishers with a bounded number of requests
//! in flight, optional WebSocket subscribers measuring publish→deliver latency, and a
//! [`BenchReport`] with throughput and latency percentiles.
//!
//! Publish latency is measured from just before a request is sent to its ack. Deliver
//! latency is measured from a timestamp the publisher embeds in each payload
//! (`{"t_us": <µs since the epoch>, "pad": "xx…"}`) to its arrival at a subscriber, so it is
//! only meaningful when publisher and subscribers share a clock (one machine).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::client::Client;
use crate::endpoint::Cursor;
use crate::error::Error;
use crate::subscription::{Event, SubscribeOptions};
use crate::types::{AckMode, BatchItem, NewMessage};

/// Largest latency the histograms hold (µs); longer samples are clamped to it. A publish
/// cannot take longer than the client's operation timeout anyway.
const LATENCY_US_MAX: u64 = 600_000_000;

/// Significant digits of the histograms: 0.1 % resolution.
const LATENCY_SIGNIFICANT_DIGITS: u8 = 3;

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Topic to publish to (created when missing).
    pub topic: String,
    /// Concurrent publisher tasks.
    pub publishers: usize,
    /// Requests each publisher keeps in flight.
    pub inflight: usize,
    /// Messages to publish in total; the run stops after them.
    pub messages: u64,
    /// Size of each payload as compact JSON (at least the timestamp field's size).
    pub payload_bytes: usize,
    /// Messages per request: 1 publishes one by one, more use the batch endpoint.
    pub batch: usize,
    /// WebSocket subscribers measuring deliver latency.
    pub subscribers: usize,
    /// Stop publishing after this long even if `messages` are not all sent.
    pub duration: Option<Duration>,
    /// Ack mode of single publishes.
    pub ack: AckMode,
    /// How long subscribers may take after the last ack to receive everything.
    pub drain_timeout: Duration,
    /// Draw a progress bar on stderr.
    pub progress: bool,
}

/// The outcome; serialized as the final JSON line of `pubsub bench`.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// `publish` or `publish_fanout` (with subscribers).
    pub workload: String,
    /// The topic used.
    pub topic: String,
    /// Publisher tasks.
    pub publishers: usize,
    /// Requests in flight per publisher.
    pub inflight: usize,
    /// Messages per request.
    pub batch: usize,
    /// Subscribers.
    pub subscribers: usize,
    /// Payload size.
    pub payload_bytes: usize,
    /// Messages acknowledged by the cluster.
    pub messages: u64,
    /// Messages whose publish failed after the client's retries.
    pub errors: u64,
    /// The first publish error, to tell what went wrong.
    pub first_error: Option<String>,
    /// Wall time of the publish phase.
    pub duration_secs: f64,
    /// Acknowledged messages per second.
    pub msgs_per_sec: f64,
    /// Publish ack latency percentiles (per request).
    pub p50_ms: f64,
    /// 99th percentile of publish latency.
    pub p99_ms: f64,
    /// 99.9th percentile of publish latency.
    pub p999_ms: f64,
    /// Largest publish latency.
    pub max_ms: f64,
    /// Messages received by all subscribers together (with subscribers).
    pub delivered: Option<u64>,
    /// `messages * subscribers - delivered`: not received within the drain timeout.
    pub deliver_missing: Option<u64>,
    /// Subscription errors (gaps, disconnects beyond the budget).
    pub deliver_errors: Option<u64>,
    /// Publish→deliver latency percentiles.
    pub deliver_p50_ms: Option<f64>,
    /// 99th percentile of deliver latency.
    pub deliver_p99_ms: Option<f64>,
    /// 99.9th percentile of deliver latency.
    pub deliver_p999_ms: Option<f64>,
    /// Largest deliver latency.
    pub deliver_max_ms: Option<f64>,
}

/// Microseconds since the Unix epoch by this machine's clock.
pub fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX)).unwrap_or(0)
}

/// A payload `{"pad": "xx…", "t_us": t}` that is `size_bytes` long as compact JSON, or as
/// short as possible when `size_bytes` is smaller than the fields themselves.
///
/// ```
/// let p = pubsub_client::bench::payload(200, 1_714_000_000_000_000);
/// assert_eq!(p.to_string().len(), 200);
/// assert_eq!(p["t_us"], 1_714_000_000_000_000u64);
/// ```
pub fn payload(size_bytes: usize, t_us: u64) -> Value {
    let bare = json!({"pad": "", "t_us": t_us}).to_string().len();
    json!({"pad": "x".repeat(size_bytes.saturating_sub(bare)), "t_us": t_us})
}

fn histogram() -> Histogram<u64> {
    // The bounds are constants (low 1 ≤ high/2, 3 digits ≤ 5), which is all this checks;
    // no input or I/O can make it fail.
    Histogram::new_with_bounds(1, LATENCY_US_MAX, LATENCY_SIGNIFICANT_DIGITS)
        .expect("constant histogram bounds are valid")
}

fn record(hist: &mut Histogram<u64>, elapsed: Duration) {
    let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
    hist.saturating_record(us.clamp(1, LATENCY_US_MAX));
}

fn ms(hist: &Histogram<u64>, quantile: f64) -> f64 {
    if hist.is_empty() {
        return 0.0;
    }
    hist.value_at_quantile(quantile) as f64 / 1000.0
}

/// What one publisher task measured.
struct PublisherResult {
    latency: Histogram<u64>,
    acked: u64,
    errors: u64,
    first_error: Option<String>,
}

/// Shared by publishers: work to claim and when to stop.
struct Work {
    /// Messages not yet claimed by a publisher.
    remaining: AtomicU64,
    /// Publishing stops at this instant.
    deadline: Option<Instant>,
    /// Set when the cluster became unreachable beyond the retry budget.
    abort: AtomicBool,
}

impl Work {
    /// Claims up to `n` messages; 0 when nothing is left or the run must stop.
    fn claim(&self, n: u64) -> u64 {
        if self.abort.load(Ordering::Relaxed) || self.deadline.is_some_and(|d| Instant::now() >= d) {
            return 0;
        }
        let mut taken = 0;
        let _ = self.remaining.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
            taken = left.min(n);
            Some(left - taken)
        });
        taken
    }
}

/// Runs the benchmark against the cluster `client` talks to.
///
/// ```no_run
/// use pubsub_client::bench::{self, BenchConfig};
/// use pubsub_client::{AckMode, Client};
/// use std::time::Duration;
///
/// # async fn run() -> Result<(), pubsub_client::Error> {
/// let client = Client::new(["127.0.0.1:8080"])?;
/// let config = BenchConfig {
///     topic: "bench".into(), publishers: 4, inflight: 8, messages: 10_000,
///     payload_bytes: 256, batch: 1, subscribers: 2, duration: None,
///     ack: AckMode::Committed, drain_timeout: Duration::from_secs(10), progress: false,
/// };
/// let report = bench::run(&client, &config).await?;
/// println!("{} msg/s, p99 {} ms", report.msgs_per_sec, report.p99_ms);
/// # Ok(())
/// # }
/// ```
pub async fn run(client: &Client, config: &BenchConfig) -> Result<BenchReport, Error> {
    let publishers = config.publishers.max(1);
    let inflight = config.inflight.max(1);
    let batch = config.batch.clamp(1, crate::limits::BATCH_MESSAGES_MAX);
    client.create_topic(&config.topic, None).await?;

    // Subscribers first, so a Latest cursor is pinned before the first publish.
    let (target_tx, target_rx) = watch::channel::<Option<u64>>(None);
    let mut subscriber_tasks = Vec::new();
    for i in 0..config.subscribers {
        let id = format!("bench-{i}-{}", uuid::Uuid::new_v4().simple());
        let sub = client.subscribe(&config.topic, SubscribeOptions::new(id).cursor(Cursor::Latest)).await?;
        let drain = config.drain_timeout;
        subscriber_tasks.push(tokio::spawn(subscriber(sub, target_rx.clone(), drain)));
    }

    let bar = progress_bar(config.messages, config.progress);
    let work = Arc::new(Work {
        remaining: AtomicU64::new(config.messages),
        deadline: config.duration.map(|d| Instant::now() + d),
        abort: AtomicBool::new(false),
    });
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..publishers {
        tasks.push(tokio::spawn(publisher(client.clone(), config.clone(), batch, inflight, work.clone(), bar.clone())));
    }
    let mut latency = histogram();
    let (mut acked, mut errors, mut first_error) = (0u64, 0u64, None);
    for task in tasks {
        match task.await {
            Ok(result) => {
                let _ = latency.add(&result.latency);
                acked += result.acked;
                errors += result.errors;
                first_error = first_error.or(result.first_error);
            }
            Err(join) => {
                errors += 1;
                first_error = first_error.or(Some(format!("publisher task failed: {join}")));
            }
        }
    }
    let elapsed = started.elapsed();
    bar.finish_and_clear();

    let _ = target_tx.send(Some(acked));
    let mut deliver = histogram();
    let (mut delivered, mut deliver_errors) = (0u64, 0u64);
    for task in subscriber_tasks {
        if let Ok((hist, count, errs)) = task.await {
            let _ = deliver.add(&hist);
            delivered += count;
            deliver_errors += errs;
        }
    }

    let secs = elapsed.as_secs_f64();
    let fanout = config.subscribers > 0;
    let some_if = |v: f64| fanout.then_some(v);
    Ok(BenchReport {
        workload: if fanout { "publish_fanout" } else { "publish" }.to_string(),
        topic: config.topic.clone(),
        publishers,
        inflight,
        batch,
        subscribers: config.subscribers,
        payload_bytes: config.payload_bytes,
        messages: acked,
        errors,
        first_error,
        duration_secs: secs,
        msgs_per_sec: if secs > 0.0 { acked as f64 / secs } else { 0.0 },
        p50_ms: ms(&latency, 0.5),
        p99_ms: ms(&latency, 0.99),
        p999_ms: ms(&latency, 0.999),
        max_ms: latency.max() as f64 / 1000.0,
        delivered: fanout.then_some(delivered),
        deliver_missing: fanout.then(|| (acked * config.subscribers as u64).saturating_sub(delivered)),
        deliver_errors: fanout.then_some(deliver_errors),
        deliver_p50_ms: some_if(ms(&deliver, 0.5)),
        deliver_p99_ms: some_if(ms(&deliver, 0.99)),
        deliver_p999_ms: some_if(ms(&deliver, 0.999)),
        deliver_max_ms: some_if(deliver.max() as f64 / 1000.0),
    })
}

fn progress_bar(messages: u64, visible: bool) -> ProgressBar {
    let target = if visible { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() };
    let bar = ProgressBar::with_draw_target(Some(messages), target);
    if let Ok(style) =
        ProgressStyle::with_template("[{elapsed_precise}] {wide_bar} {pos}/{len} msgs  {per_sec}  eta {eta}")
    {
        bar.set_style(style);
    }
    bar
}

/// One publisher: keeps `inflight` requests going until the work runs out.
async fn publisher(
    client: Client,
    config: BenchConfig,
    batch: usize,
    inflight: usize,
    work: Arc<Work>,
    bar: ProgressBar,
) -> PublisherResult {
    let topic: Arc<str> = Arc::from(config.topic.as_str());
    let mut result = PublisherResult { latency: histogram(), acked: 0, errors: 0, first_error: None };
    let mut pending = FuturesUnordered::new();
    loop {
        while pending.len() < inflight {
            let n = work.claim(batch as u64);
            if n == 0 {
                break;
            }
            let client = client.clone();
            let topic = topic.clone();
            let (size, ack, single) = (config.payload_bytes, config.ack, batch == 1);
            pending.push(async move {
                let started = Instant::now();
                let outcome = if single {
                    let message = NewMessage::new(payload(size, now_us()));
                    client.publish_message(&topic, message, ack).await.map(|_| 0u64)
                } else {
                    let messages = (0..n).map(|_| NewMessage::new(payload(size, now_us()))).collect();
                    client.publish_batch(&topic, messages).await.map(|ack| {
                        // A duplicate without a sequence is still in flight and may fail:
                        // it is not counted as acknowledged.
                        let failed = ack
                            .results
                            .iter()
                            .filter(|item| {
                                matches!(
                                    item,
                                    BatchItem::Failed { .. } | BatchItem::Duplicate { existing_sequence: None, .. }
                                )
                            })
                            .count();
                        failed as u64
                    })
                };
                (n, started.elapsed(), outcome)
            });
        }
        let Some((n, elapsed, outcome)) = pending.next().await else {
            break;
        };
        match outcome {
            Ok(failed) => {
                record(&mut result.latency, elapsed);
                result.acked += n - failed;
                result.errors += failed;
            }
            Err(error) => {
                result.errors += n;
                if error.is_unreachable() {
                    work.abort.store(true, Ordering::Relaxed);
                }
                if result.first_error.is_none() {
                    result.first_error = Some(error.to_string());
                }
            }
        }
        bar.inc(n);
    }
    result
}

/// One subscriber: records deliver latency until it has seen `target` messages (known once
/// publishing ends) or the drain timeout passes after that.
async fn subscriber(
    mut sub: crate::Subscription,
    mut target: watch::Receiver<Option<u64>>,
    drain: Duration,
) -> (Histogram<u64>, u64, u64) {
    let mut hist = histogram();
    let (mut count, mut errors) = (0u64, 0u64);
    let mut drain_deadline: Option<tokio::time::Instant> = None;
    loop {
        let goal = *target.borrow();
        if let Some(goal) = goal {
            if count >= goal {
                break;
            }
            if drain_deadline.is_none() {
                drain_deadline = Some(tokio::time::Instant::now() + drain);
            }
        }
        let sleep_until = drain_deadline.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(86_400));
        tokio::select! {
            _ = tokio::time::sleep_until(sleep_until) => break,
            changed = target.changed() => {
                if changed.is_err() && goal.is_none() {
                    break;
                }
            }
            event = sub.next() => match event {
                Some(Ok(Event::Message(m))) => {
                    count += 1;
                    if let Some(t_us) = m.payload.get("t_us").and_then(Value::as_u64) {
                        record(&mut hist, Duration::from_micros(now_us().saturating_sub(t_us)));
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(_)) => errors += 1,
                None => break,
            }
        }
    }
    (hist, count, errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_has_the_requested_size_and_a_readable_timestamp() {
        for size in [64, 256, 1024, 65_536] {
            let p = payload(size, now_us());
            assert_eq!(p.to_string().len(), size);
            assert!(p["t_us"].as_u64().is_some());
        }
    }

    #[test]
    fn payload_smaller_than_its_fields_is_as_small_as_possible() {
        let p = payload(1, 12);
        assert_eq!(p.to_string(), r#"{"pad":"","t_us":12}"#);
    }

    #[test]
    fn work_is_claimed_in_batches_until_none_is_left() {
        let work = Work { remaining: AtomicU64::new(25), deadline: None, abort: AtomicBool::new(false) };
        assert_eq!(work.claim(10), 10);
        assert_eq!(work.claim(10), 10);
        assert_eq!(work.claim(10), 5);
        assert_eq!(work.claim(10), 0);
    }

    #[test]
    fn work_stops_at_the_deadline_or_on_abort() {
        let past =
            Work { remaining: AtomicU64::new(25), deadline: Some(Instant::now()), abort: AtomicBool::new(false) };
        assert_eq!(past.claim(1), 0);
        let aborted = Work { remaining: AtomicU64::new(25), deadline: None, abort: AtomicBool::new(true) };
        assert_eq!(aborted.claim(1), 0);
    }

    #[test]
    fn percentiles_are_reported_in_milliseconds() {
        let mut h = histogram();
        for ms_value in 1..=1000u64 {
            record(&mut h, Duration::from_millis(ms_value));
        }
        assert!((ms(&h, 0.5) - 500.0).abs() < 1.0, "{}", ms(&h, 0.5));
        assert!((ms(&h, 0.99) - 990.0).abs() < 1.5);
        assert_eq!(ms(&histogram(), 0.5), 0.0);
    }

    /// A leader that accepts every publish, numbering messages in arrival order, and
    /// forwards them to WebSocket subscribers.
    async fn accepting_leader() -> String {
        use axum::extract::ws::{Message as AxMessage, WebSocketUpgrade};
        use axum::routing::{get, post};
        use axum::{Json, Router};
        // One lock assigns a sequence and feeds it, so subscribers see sequence order.
        let next = Arc::new(std::sync::Mutex::new(0u64));
        let (feed, _) = tokio::sync::broadcast::channel::<String>(100_000);
        crate::test_support::serve_with(move |me| {
            let cluster = crate::test_support::cluster_body("node-1", Some(&me), &[]);
            let (single, batch) = (next.clone(), next.clone());
            let (single_feed, batch_feed, sub_feed) = (feed.clone(), feed.clone(), feed);
            let frame = |seq: u64, m: &Value| {
                json!({"type": "message", "id": m["id"], "topic": "t", "sequence": seq,
                       "payload": m["payload"], "timestamp": 1})
                .to_string()
            };
            Router::new()
                .route("/cluster", get(move || async move { Json(cluster) }))
                .route(
                    "/topics/{name}",
                    post(|| async { Json(json!({"topic": "t", "created": true, "raft_index": 1})) }),
                )
                .route(
                    "/topics/{name}/messages",
                    post(move |Json(body): Json<Value>| async move {
                        let seq = {
                            let mut last = single.lock().unwrap_or_else(|p| p.into_inner());
                            *last += 1;
                            let _ = single_feed.send(frame(*last, &body));
                            *last
                        };
                        (
                            axum::http::StatusCode::CREATED,
                            Json(json!({"id": body["id"], "topic": "t", "sequence": seq,
                                        "raft_index": seq, "committed": true})),
                        )
                    }),
                )
                .route(
                    "/topics/{name}/messages/batch",
                    post(move |Json(body): Json<Value>| async move {
                        let msgs = body["messages"].as_array().cloned().unwrap_or_default();
                        let mut last = batch.lock().unwrap_or_else(|p| p.into_inner());
                        let results: Vec<Value> = msgs
                            .iter()
                            .map(|m| {
                                *last += 1;
                                let _ = batch_feed.send(frame(*last, m));
                                json!({"id": m["id"], "sequence": *last})
                            })
                            .collect();
                        drop(last);
                        (
                            axum::http::StatusCode::CREATED,
                            Json(json!({"topic": "t", "results": results, "raft_index": 1,
                                        "committed": true})),
                        )
                    }),
                )
                .route(
                    "/topics/{name}/subscribe",
                    get(move |ws: WebSocketUpgrade| async move {
                        let mut rx = sub_feed.subscribe();
                        ws.on_upgrade(move |mut socket| async move {
                            let hello = json!({"type": "control", "subtype": "subscribed",
                                               "topic": "t", "cursor": 0, "subscriber_id": "s"});
                            let _ = socket.send(AxMessage::Text(hello.to_string().into())).await;
                            while let Ok(text) = rx.recv().await {
                                if socket.send(AxMessage::Text(text.into())).await.is_err() {
                                    break;
                                }
                            }
                        })
                    }),
                )
        })
        .await
    }

    fn config(messages: u64, batch: usize) -> BenchConfig {
        BenchConfig {
            topic: "t".into(),
            publishers: 3,
            inflight: 4,
            messages,
            payload_bytes: 100,
            batch,
            subscribers: 0,
            duration: None,
            ack: AckMode::Committed,
            drain_timeout: Duration::from_secs(1),
            progress: false,
        }
    }

    #[tokio::test]
    async fn bench_publishes_exactly_the_requested_messages_singly_and_in_batches() {
        let node = accepting_leader().await;
        let client = crate::test_support::fast_client(&[&node]);
        for (messages, batch) in [(101, 1), (2_345, 100)] {
            let report = match run(&client, &config(messages, batch)).await {
                Ok(r) => r,
                Err(e) => panic!("{e}"),
            };
            assert_eq!(report.messages, messages);
            assert_eq!(report.errors, 0);
            assert_eq!(report.workload, "publish");
            assert!(report.msgs_per_sec > 0.0);
            assert!(report.p50_ms <= report.p99_ms && report.p99_ms <= report.max_ms);
            assert!(report.deliver_p50_ms.is_none());
        }
    }

    #[tokio::test]
    async fn bench_subscribers_receive_every_message_and_measure_deliver_latency() {
        let node = accepting_leader().await;
        let client = crate::test_support::fast_client(&[&node]);
        let mut cfg = config(500, 1);
        cfg.subscribers = 2;
        let report = match run(&client, &cfg).await {
            Ok(r) => r,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(report.workload, "publish_fanout");
        assert_eq!(report.messages, 500);
        assert_eq!(report.delivered, Some(1000));
        assert_eq!(report.deliver_missing, Some(0));
        assert_eq!(report.deliver_errors, Some(0));
        assert!(report.deliver_p50_ms.is_some_and(|p| p >= 0.0));
    }

    #[tokio::test]
    async fn bench_against_a_dead_cluster_fails_before_publishing() {
        let dead = crate::test_support::dead_address().await;
        let client = crate::test_support::fast_client(&[&dead]);
        let outcome = run(&client, &config(10, 1)).await;
        assert!(matches!(outcome, Err(e) if e.is_unreachable()));
    }
}
