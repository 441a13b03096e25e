//! The load generator behind `pubsub bench`: publishers with a bounded number of requests
//! in flight, over HTTP or one publishing WebSocket each ([`Transport`]), optionally paced to
//! a total rate; optional WebSocket subscribers measuring publish→deliver latency; and a
//! [`BenchReport`] with throughput and latency percentiles.
//!
//! The pacing schedule is `bench/pace.rs`, the payloads `bench/payload.rs`, the subscribers
//! `bench/subscribers.rs`.
//!
//! Publish latency is measured from just before a request is sent to its ack. Deliver
//! latency is measured from a timestamp the publisher embeds in each payload (`{"pad": "…",
//! "t_us": <µs since the epoch>}`) to its arrival at a subscriber, so it is only meaningful
//! when publisher and subscribers share a clock (one machine).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::stream::{self, FuturesUnordered};
use futures_util::{StreamExt, TryStreamExt};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use tokio::sync::watch;

use crate::client::Client;
use crate::error::Error;
use crate::limits;
use crate::publisher::Publisher;
use crate::types::{AckMode, BatchItem, NewMessage};
use pace::Pacer;
pub use payload::{payload, PayloadContent, Payloads};

/// Largest latency the histograms hold (µs); longer samples are clamped to it. A publish
/// cannot take longer than the client's operation timeout anyway.
const LATENCY_US_MAX: u64 = 600_000_000;

/// Significant digits of the histograms: 0.1 % resolution.
const LATENCY_SIGNIFICANT_DIGITS: u8 = 3;

/// How publishers send their messages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    /// One HTTP request per publish (or per batch), retried by the client.
    #[default]
    Http,
    /// One [`Publisher`] WebSocket per publisher, `inflight` publishes in flight on it
    /// (single messages only, acked after commit; API.md §8).
    Ws,
}

impl Transport {
    /// `http` or `ws`, as in the report.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Http => "http",
            Transport::Ws => "ws",
        }
    }
}

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
    /// What fills the payloads (see [`PayloadContent`]).
    pub payload_content: PayloadContent,
    /// Messages per request: 1 publishes one by one, more use the batch endpoint.
    pub batch: usize,
    /// WebSocket subscribers measuring deliver latency.
    pub subscribers: usize,
    /// Stop publishing after this long even if `messages` are not all sent.
    pub duration: Option<Duration>,
    /// Ack mode of single publishes over HTTP (a WebSocket publish is acked after commit).
    pub ack: AckMode,
    /// How publishers send.
    pub transport: Transport,
    /// Messages per second, all publishers together, evenly spaced; `None`: as fast as
    /// the requests in flight allow. Finite and above 0.
    pub rate: Option<f64>,
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
    /// `http` or `ws`.
    pub transport: Transport,
    /// The requested rate in messages per second; `null` when unpaced.
    pub rate: Option<f64>,
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
    /// What filled the payloads.
    pub payload_content: PayloadContent,
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

/// An empty latency histogram. It grows with the largest sample recorded rather than
/// starting at [`LATENCY_US_MAX`] (about 170 KiB), which matters with one per publisher task.
fn histogram() -> Histogram<u64> {
    // The digits are a constant within 0..=5, which is all this checks; no input or I/O can
    // make it fail.
    Histogram::new(LATENCY_SIGNIFICANT_DIGITS).expect("constant histogram precision is valid")
}

fn record(hist: &mut Histogram<u64>, elapsed: Duration) {
    let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX).clamp(1, LATENCY_US_MAX);
    // `record` grows the histogram; `saturating_record` would clamp to its current size.
    if hist.record(us).is_err() {
        hist.saturating_record(us);
    }
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
/// use pubsub_client::bench::{self, BenchConfig, PayloadContent, Transport};
/// use pubsub_client::{AckMode, Client};
/// use std::time::Duration;
///
/// # async fn run() -> Result<(), pubsub_client::Error> {
/// let client = Client::new(["127.0.0.1:8080"])?;
/// // One publisher at 1,000 msg/s over a WebSocket, fanned out to 100 subscribers.
/// let config = BenchConfig {
///     topic: "bench".into(), publishers: 1, inflight: 64, messages: 10_000,
///     payload_bytes: 256, payload_content: PayloadContent::Text, batch: 1,
///     subscribers: 100, duration: None,
///     ack: AckMode::Committed, transport: Transport::Ws, rate: Some(1000.0),
///     drain_timeout: Duration::from_secs(10), progress: false,
/// };
/// let report = bench::run(&client, &config).await?;
/// println!("{} msg/s, p99 {} ms", report.msgs_per_sec, report.p99_ms);
/// # Ok(())
/// # }
/// ```
pub async fn run(client: &Client, config: &BenchConfig) -> Result<BenchReport, Error> {
    check(config)?;
    let publishers = config.publishers.max(1);
    let inflight = config.inflight.max(1);
    let batch = config.batch.clamp(1, limits::BATCH_MESSAGES_MAX);
    client.create_topic(&config.topic, None).await?;

    // Subscribers first, so a Latest cursor is pinned before the first publish.
    let (target_tx, target_rx) = watch::channel::<Option<u64>>(None);
    let subscriptions = subscribers::open(client, &config.topic, config.subscribers).await?;
    let deliver_latency: subscribers::SharedLatency = Arc::new(std::sync::Mutex::new(histogram()));
    let subscriber_tasks: Vec<_> = subscriptions
        .into_iter()
        .map(|sub| {
            tokio::spawn(subscribers::receive(sub, deliver_latency.clone(), target_rx.clone(), config.drain_timeout))
        })
        .collect();
    // Connections are opened before the clock starts: the run measures publishing.
    let links = open_links(client, config, publishers).await?;

    let bar = progress_bar(config.messages, config.progress);
    let job = Arc::new(Job {
        topic: config.topic.clone(),
        payloads: Payloads::new(config.payload_content, config.payload_bytes),
        batch,
        inflight,
        ack: config.ack,
        work: Work {
            remaining: AtomicU64::new(config.messages),
            deadline: config.duration.map(|d| Instant::now() + d),
            abort: AtomicBool::new(false),
        },
        pacer: config.rate.map(|rate| Pacer::new(rate, tokio::time::Instant::now())),
        bar: bar.clone(),
    });
    let started = Instant::now();
    let tasks: Vec<_> = links.into_iter().map(|link| tokio::spawn(publisher(link, job.clone()))).collect();
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
    let (mut delivered, mut deliver_errors) = (0u64, 0u64);
    for task in subscriber_tasks {
        if let Ok(received) = task.await {
            delivered += received.count;
            deliver_errors += received.errors;
        }
    }

    let deliver = std::mem::replace(&mut *deliver_latency.lock().unwrap_or_else(|e| e.into_inner()), histogram());
    let secs = elapsed.as_secs_f64();
    let fanout = config.subscribers > 0;
    let some_if = |v: f64| fanout.then_some(v);
    Ok(BenchReport {
        workload: if fanout { "publish_fanout" } else { "publish" }.to_string(),
        topic: config.topic.clone(),
        transport: config.transport,
        rate: config.rate,
        publishers,
        inflight,
        batch,
        subscribers: config.subscribers,
        payload_bytes: config.payload_bytes,
        payload_content: config.payload_content,
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

/// Refuses settings that cannot be run, before anything is sent.
fn check(config: &BenchConfig) -> Result<(), Error> {
    if config.transport == Transport::Ws && config.batch > 1 {
        return Err(Error::InvalidArgument("the ws transport publishes one message per frame: batch must be 1".into()));
    }
    if config.transport == Transport::Ws && config.ack == AckMode::Appended {
        return Err(Error::InvalidArgument("the ws transport acks after commit only: ack must be committed".into()));
    }
    if let Some(rate) = config.rate {
        if !(rate.is_finite() && rate > 0.0) {
            return Err(Error::InvalidArgument(format!("the rate must be a number above 0, not {rate}")));
        }
    }
    Ok(())
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

/// How one publisher task reaches the cluster.
enum Link {
    /// HTTP requests through the shared client.
    Http(Client),
    /// Its own publishing WebSocket.
    Ws(Publisher),
}

/// One link per publisher task; the WebSockets are opened concurrently.
async fn open_links(client: &Client, config: &BenchConfig, publishers: usize) -> Result<Vec<Link>, Error> {
    match config.transport {
        Transport::Http => Ok((0..publishers).map(|_| Link::Http(client.clone())).collect()),
        Transport::Ws => {
            stream::iter(0..publishers)
                .map(|_| client.publisher(&config.topic))
                .buffer_unordered(limits::BENCH_CONNECTS_CONCURRENT)
                .map_ok(Link::Ws)
                .try_collect()
                .await
        }
    }
}

/// What every publisher task shares.
struct Job {
    topic: String,
    payloads: Payloads,
    /// Messages per HTTP request (1 with the ws transport).
    batch: usize,
    /// Requests each task keeps in flight.
    inflight: usize,
    ack: AckMode,
    work: Work,
    /// When each message is due, with `--rate`.
    pacer: Option<Pacer>,
    bar: ProgressBar,
}

/// One publisher: keeps `inflight` requests going until the work runs out.
async fn publisher(link: Link, job: Arc<Job>) -> PublisherResult {
    let mut result = PublisherResult { latency: histogram(), acked: 0, errors: 0, first_error: None };
    let mut pending = FuturesUnordered::new();
    loop {
        while pending.len() < job.inflight {
            let n = job.work.claim(job.batch as u64);
            if n == 0 {
                break;
            }
            // The slot is taken now and waited for inside the request's future, so requests
            // already in flight keep being polled meanwhile.
            let due = job.pacer.as_ref().map(|pacer| pacer.next_due(tokio::time::Instant::now()));
            pending.push(send(&link, &job, n, due));
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
                    job.work.abort.store(true, Ordering::Relaxed);
                }
                if result.first_error.is_none() {
                    result.first_error = Some(error.to_string());
                }
            }
        }
        job.bar.inc(n);
    }
    result
}

/// Publishes `n` messages in one request once it is `due`. Returns `n`, the latency (from
/// just before sending) and how many of the messages failed, or the request's error.
async fn send(
    link: &Link,
    job: &Job,
    n: u64,
    due: Option<tokio::time::Instant>,
) -> (u64, Duration, Result<u64, Error>) {
    if let Some(due) = due {
        tokio::time::sleep_until(due).await;
    }
    let message = || NewMessage::new(job.payloads.next(now_us()));
    let started = Instant::now();
    let outcome = match link {
        Link::Ws(publisher) => publisher.publish(message()).await.map(|_| 0),
        Link::Http(client) if job.batch == 1 => client.publish_message(&job.topic, message(), job.ack).await.map(|_| 0),
        Link::Http(client) => {
            let messages = (0..n).map(|_| message()).collect();
            client.publish_batch(&job.topic, messages).await.map(|ack| {
                // A duplicate without a sequence is still in flight and may fail: it is not
                // counted as acknowledged.
                let failed = ack
                    .results
                    .iter()
                    .filter(|item| {
                        matches!(item, BatchItem::Failed { .. } | BatchItem::Duplicate { existing_sequence: None, .. })
                    })
                    .count();
                failed as u64
            })
        }
    };
    (n, started.elapsed(), outcome)
}

mod pace;
mod payload;
mod subscribers;

#[cfg(test)]
mod tests;
