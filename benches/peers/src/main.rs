//! `peers-bench`: the same workloads as `pubsub bench`, against NATS JetStream or etcd.
//!
//! ```text
//! peers-bench nats --servers 127.0.0.1:4222,... [--stream BENCH] --concurrency C --messages N
//! peers-bench etcd --servers http://127.0.0.1:2379,... --concurrency C --messages N
//! peers-bench nats-fanout --servers 127.0.0.1:4222,... [--stream FANOUT] --subscribers K
//!     --rate R --messages N [--inflight 64] [--connections K] [--consumer push|pull]
//!     [--drain-secs 10]
//!   common: [--payload-bytes 256] [--duration-secs S]
//! ```
//!
//! Publish (`nats`, `etcd`): C tasks each keep one request in flight (C requests in flight in
//! total) until N messages are acknowledged or the duration is over. Latency is measured per
//! request, from just before it is sent to its acknowledgement:
//! - nats: `jetstream.publish(subject, payload).await?.await?` (the PubAck of an R3,
//!   file-backed stream, which is recreated fresh at the start of every run);
//! - etcd: a put over gRPC (etcd's own client protocol, the `etcd-client` crate), distinct key
//!   per message, every task's puts sharing one connection to the leader (found by asking each
//!   member's status).
//!
//! Fan-out (`nats-fanout`), the counterpart of `pubsub bench --subscribers K --rate R`: a
//! fresh R3 file-backed stream, K JetStream *ordered consumers* (ephemeral, R1, no acks,
//! deliver policy New; push by default, `--consumer pull` for the pull flavour), each read by
//! its own task, then one publisher sending N messages paced at R msgs/s (`--rate 0`: as fast
//! as `--inflight` allows), each publish awaited until its PubAck, at most `--inflight` in
//! flight. Subscribers spread round-robin over `--connections` client connections; the
//! default is one connection per subscriber, like ours (one WebSocket per subscriber).
//! Payloads are `{"pad":"xx…","t_us":<µs since the epoch>}`, `--payload-bytes` long, like
//! ours; deliver latency runs from `t_us` to arrival at a subscriber (one machine, one clock).
//! Before the clock starts every consumer must have received one warm-up message (`t_us` 0,
//! not counted), so all K are delivering. After the last PubAck the subscribers get
//! `--drain-secs` to receive every acknowledged message.
//!
//! The last stdout line is a JSON object with `msgs_per_sec`, `p50_ms`, `p99_ms`, like ours;
//! fan-out adds `delivered`, `deliver_missing` (`messages × K − delivered`),
//! `deliver_errors` and `deliver_p50_ms`, `deliver_p99_ms`, `deliver_p999_ms`,
//! `deliver_max_ms`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use serde_json::json;

type Error = Box<dyn std::error::Error + Send + Sync>;

struct Args {
    system: String,
    servers: Vec<String>,
    stream: String,
    concurrency: usize,
    messages: u64,
    payload_bytes: usize,
    duration: Duration,
    // nats-fanout only:
    subscribers: usize,
    /// Publish rate, msgs/s; 0 is unpaced.
    rate: f64,
    inflight: usize,
    /// Client connections the subscribers share; 0 is one per subscriber.
    connections: usize,
    /// `push` or `pull` ordered consumers.
    consumer: String,
    drain: Duration,
}

/// Messages a paced publisher behind its schedule sends back to back before the schedule
/// slips to now: `BENCH_PACE_CATCH_UP_MAX` of `pubsub bench`, so both systems are paced alike.
const PACE_CATCH_UP_MAX: u32 = 4;

const USAGE: &str = "usage: peers-bench nats|etcd --servers A,B,C --concurrency C --messages N\n       \
                     peers-bench nats-fanout --servers A,B,C --subscribers K --rate R --messages N";

fn parse_args() -> Result<Args, Error> {
    let mut it = std::env::args().skip(1);
    let system = it.next().ok_or(USAGE)?;
    if !matches!(system.as_str(), "nats" | "etcd" | "nats-fanout") {
        return Err(format!("unknown mode {system:?} (nats, etcd or nats-fanout)\n{USAGE}").into());
    }
    let fanout = system == "nats-fanout";
    let mut a = Args {
        system,
        servers: Vec::new(),
        stream: if fanout { "FANOUT" } else { "BENCH" }.into(),
        concurrency: 1,
        messages: 1000,
        payload_bytes: 256,
        duration: Duration::from_secs(120),
        subscribers: 1,
        rate: 1000.0,
        inflight: 64,
        connections: 0,
        consumer: "push".into(),
        drain: Duration::from_secs(10),
    };
    while let Some(flag) = it.next() {
        let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--servers" => a.servers = v.split(',').filter(|s| !s.is_empty()).map(String::from).collect(),
            "--stream" => a.stream = v,
            "--concurrency" => a.concurrency = v.parse()?,
            "--messages" => a.messages = v.parse()?,
            "--payload-bytes" => a.payload_bytes = v.parse()?,
            "--duration-secs" => a.duration = Duration::from_secs_f64(v.parse()?),
            "--subscribers" if fanout => a.subscribers = v.parse()?,
            "--rate" if fanout => a.rate = v.parse()?,
            "--inflight" if fanout => a.inflight = v.parse()?,
            "--connections" if fanout => a.connections = v.parse()?,
            "--consumer" if fanout && (v == "push" || v == "pull") => a.consumer = v,
            "--drain-secs" if fanout => a.drain = Duration::from_secs_f64(v.parse()?),
            _ => return Err(format!("unknown flag {flag} (or bad value {v:?}) for {}", a.system).into()),
        }
    }
    if a.servers.is_empty() || a.concurrency == 0 {
        return Err("--servers and a concurrency ≥ 1 are required".into());
    }
    if fanout && (a.subscribers == 0 || a.inflight == 0 || a.rate.is_nan() || a.rate < 0.0) {
        return Err("nats-fanout needs --subscribers ≥ 1, --inflight ≥ 1 and --rate ≥ 0".into());
    }
    Ok(a)
}

/// What every worker shares: the next message number, the deadline and the results.
struct Shared {
    next: AtomicU64,
    messages: u64,
    /// Budget of the run, counted from `start`.
    duration: Duration,
    /// Set by `start()` right before the workers are spawned (after setup).
    started: std::sync::OnceLock<Instant>,
    hist: Mutex<Histogram<u64>>,
    errors: AtomicU64,
    first_error: Mutex<Option<String>>,
}

impl Shared {
    /// The next message number to send, or None when the run is over.
    fn take(&self) -> Option<u64> {
        if self.started.get().is_some_and(|t| t.elapsed() >= self.duration) {
            return None;
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        (n < self.messages).then_some(n)
    }

    /// Starts the clock: call once setup is done, right before spawning the workers.
    fn start(&self) {
        let _ = self.started.set(Instant::now());
    }

    fn error(&self, e: impl std::fmt::Display) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first_error.lock().unwrap();
        if first.is_none() {
            *first = Some(e.to_string());
        }
    }
}

fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("histogram bounds")
}

/// Runs one worker's loop: `send(n)` for every message number it takes, recording latency
/// into a local histogram merged at the end.
async fn worker<F, Fut>(shared: Arc<Shared>, send: F)
where
    F: Fn(u64) -> Fut,
    Fut: std::future::Future<Output = Result<(), Error>>,
{
    let mut hist = new_hist();
    while let Some(n) = shared.take() {
        let t0 = Instant::now();
        match send(n).await {
            Ok(()) => hist.saturating_record(t0.elapsed().as_micros().max(1) as u64),
            Err(e) => shared.error(e),
        }
    }
    shared.hist.lock().unwrap().add(&hist).expect("same bounds");
}

/// Retries `f` until it succeeds or `within` is over (cluster formation, leader election).
async fn retry<T, F, Fut>(what: &str, within: Duration, mut f: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let end = Instant::now() + within;
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() < end => {
                eprintln!("peers-bench: {what}: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(format!("{what}: {e}").into()),
        }
    }
}

async fn nats_connect(servers: &[String]) -> Result<async_nats::Client, Error> {
    let addrs: Vec<async_nats::ServerAddr> = servers.iter().map(|s| s.parse()).collect::<Result<_, _>>()?;
    Ok(async_nats::ConnectOptions::new().request_timeout(Some(Duration::from_secs(10))).connect(addrs).await?)
}

/// Recreates `stream` as an empty R3 file-backed stream whose leader has acknowledged one
/// publish, and returns its subject.
async fn nats_fresh_stream(
    js: &async_nats::jetstream::Context,
    stream: &str,
    payload: &Bytes,
) -> Result<String, Error> {
    use async_nats::jetstream::stream;
    let subject = format!("{}.msgs", stream.to_lowercase());
    let config = stream::Config {
        name: stream.to_string(),
        subjects: vec![subject.clone()],
        num_replicas: 3,
        storage: stream::StorageType::File,
        ..Default::default()
    };
    // A fresh stream per run: delete a leftover one, then create (retried while the
    // JetStream meta group elects its leader).
    retry("create the R3 stream", Duration::from_secs(30), || {
        let (js, config) = (js.clone(), config.clone());
        async move {
            let _ = js.delete_stream(&config.name).await;
            js.create_stream(config).await.map(|_| ()).map_err(Error::from)
        }
    })
    .await?;
    // One acknowledged publish so the stream leader is settled before the clock starts.
    retry("first publish", Duration::from_secs(30), || {
        let (js, subject, payload) = (js.clone(), subject.clone(), payload.clone());
        async move { js.publish(subject, payload).await?.await.map(|_| ()).map_err(Error::from) }
    })
    .await?;
    js.get_stream(stream).await?.purge().await?;
    Ok(subject)
}

async fn run_nats(a: &Args, shared: Arc<Shared>, payload: Bytes) -> Result<Vec<tokio::task::JoinHandle<()>>, Error> {
    let js = async_nats::jetstream::new(nats_connect(&a.servers).await?);
    let subject = nats_fresh_stream(&js, &a.stream, &payload).await?;
    shared.start();
    Ok((0..a.concurrency)
        .map(|_| {
            let (js, subject, payload, shared) = (js.clone(), subject.clone(), payload.clone(), shared.clone());
            tokio::spawn(worker(shared, move |_n| {
                let (js, subject, payload) = (js.clone(), subject.clone(), payload.clone());
                async move {
                    js.publish(subject, payload).await?.await?;
                    Ok(())
                }
            }))
        })
        .collect())
}

/// Microseconds since the Unix epoch by this machine's clock.
fn now_us() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// `{"pad":"xx…","t_us":t}`, `size` bytes long (or as short as the fields allow), the
/// payload `pubsub bench` publishes.
fn timed_payload(size: usize, t_us: u64) -> Bytes {
    let bare = format!(r#"{{"pad":"","t_us":{t_us}}}"#).len();
    Bytes::from(format!(r#"{{"pad":"{}","t_us":{t_us}}}"#, "x".repeat(size.saturating_sub(bare))))
}

/// The `t_us` field of a payload made by [`timed_payload`].
fn payload_t_us(payload: &[u8]) -> Option<u64> {
    const KEY: &[u8] = b"\"t_us\":";
    let at = payload.windows(KEY.len()).rposition(|w| w == KEY)? + KEY.len();
    let digits = payload[at..].iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&payload[at..at + digits]).ok()?.parse().ok()
}

/// What a fan-out subscriber reads: payloads, or the ordered consumer's errors (it
/// recreates itself after them and goes on).
type PayloadStream = std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<Bytes, String>> + Send>>;

/// Creates one ordered consumer (deliver policy New) on `js`'s connection and returns its
/// messages.
async fn nats_ordered(
    js: &async_nats::jetstream::Context,
    stream: &str,
    subject: &str,
    kind: &str,
) -> Result<PayloadStream, Error> {
    use async_nats::jetstream::consumer::{pull, push, DeliverPolicy};
    use futures_util::StreamExt;
    if kind == "pull" {
        let config = pull::OrderedConfig {
            filter_subject: subject.to_string(),
            deliver_policy: DeliverPolicy::New,
            ..Default::default()
        };
        let consumer = js.create_consumer_on_stream(config, stream).await?;
        let messages = consumer.messages().await?;
        Ok(Box::pin(messages.map(|m| m.map(|m| m.message.payload).map_err(|e| e.to_string()))))
    } else {
        let config = push::OrderedConfig {
            deliver_subject: js.client().new_inbox(),
            filter_subject: subject.to_string(),
            deliver_policy: DeliverPolicy::New,
            ..Default::default()
        };
        let consumer = js.create_consumer_on_stream(config, stream).await?;
        let messages = consumer.messages().await?;
        Ok(Box::pin(messages.map(|m| m.map(|m| m.message.payload).map_err(|e| e.to_string()))))
    }
}

/// What one fan-out subscriber saw.
struct SubscriberResult {
    hist: Histogram<u64>,
    delivered: u64,
    errors: u64,
    first_error: Option<String>,
}

/// One fan-out subscriber: counts itself in `ready` on the warm-up message (`t_us` 0), then
/// records deliver latency until it has seen `goal` messages (known once publishing ends)
/// or `drain` has passed since then.
async fn fanout_subscriber(
    mut messages: PayloadStream,
    ready: Arc<AtomicU64>,
    mut goal: tokio::sync::watch::Receiver<Option<u64>>,
    drain: Duration,
) -> SubscriberResult {
    use futures_util::StreamExt;
    let mut r = SubscriberResult { hist: new_hist(), delivered: 0, errors: 0, first_error: None };
    let mut drain_deadline: Option<tokio::time::Instant> = None;
    loop {
        let target = *goal.borrow_and_update();
        if let Some(target) = target {
            if r.delivered >= target {
                break;
            }
            drain_deadline.get_or_insert_with(|| tokio::time::Instant::now() + drain);
        }
        let wake = drain_deadline.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(86_400));
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => break,
            changed = goal.changed(), if target.is_none() => {
                if changed.is_err() {
                    break;
                }
            }
            next = messages.next() => match next {
                Some(Ok(payload)) => match payload_t_us(&payload) {
                    Some(0) => {
                        ready.fetch_add(1, Ordering::Relaxed);
                    }
                    Some(t_us) => {
                        r.delivered += 1;
                        r.hist.saturating_record(now_us().saturating_sub(t_us).max(1));
                    }
                    None => r.delivered += 1,
                },
                Some(Err(e)) => {
                    r.errors += 1;
                    r.first_error.get_or_insert(e);
                }
                None => break,
            }
        }
    }
    r
}

/// `nats-fanout`: K ordered consumers, one paced publisher; prints its own JSON line.
async fn run_nats_fanout(a: &Args) -> Result<(), Error> {
    use futures_util::stream::{FuturesUnordered, StreamExt, TryStreamExt};
    let client = nats_connect(&a.servers).await?;
    let js = async_nats::jetstream::new(client.clone());
    let subject = nats_fresh_stream(&js, &a.stream, &timed_payload(a.payload_bytes, 1)).await?;

    // Subscriber connections: one per subscriber by default (ours opens one WebSocket per
    // subscriber); `--connections C` shares C connections round-robin. The publisher has its
    // own connection.
    let conns = if a.connections == 0 { a.subscribers } else { a.connections.min(a.subscribers) };
    let sub_clients: Vec<async_nats::Client> =
        futures_util::stream::iter(0..conns).map(|_| nats_connect(&a.servers)).buffered(32).try_collect().await?;
    let ready = Arc::new(AtomicU64::new(0));
    let (goal_tx, goal_rx) = tokio::sync::watch::channel(None::<u64>);
    // Consumer creation goes through the JetStream meta group: 16 at a time.
    let subscriptions: Vec<PayloadStream> = futures_util::stream::iter(0..a.subscribers)
        .map(|i| {
            let js = async_nats::jetstream::new(sub_clients[i % conns].clone());
            let (stream, subject, kind) = (a.stream.clone(), subject.clone(), a.consumer.clone());
            async move {
                retry("create an ordered consumer", Duration::from_secs(30), || {
                    nats_ordered(&js, &stream, &subject, &kind)
                })
                .await
            }
        })
        .buffered(16)
        .try_collect()
        .await?;
    for c in &sub_clients {
        c.flush().await?;
    }
    let subscriber_tasks: Vec<_> = subscriptions
        .into_iter()
        .map(|m| tokio::spawn(fanout_subscriber(m, ready.clone(), goal_rx.clone(), a.drain)))
        .collect();
    drop(goal_rx);

    // Warm-up: every consumer must deliver one message before the clock starts.
    let setup = Instant::now();
    js.publish(subject.clone(), timed_payload(a.payload_bytes, 0)).await?.await?;
    while (ready.load(Ordering::Relaxed) as usize) < a.subscribers {
        if setup.elapsed() > Duration::from_secs(60) {
            eprintln!(
                "peers-bench: only {} of {} consumers got the warm-up message within 60 s; starting anyway",
                ready.load(Ordering::Relaxed),
                a.subscribers
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!("peers-bench: {} ordered {} consumers ready on {conns} connections", a.subscribers, a.consumer);

    // One publisher: message n is due at origin + n/R; up to `inflight` publishes await their
    // PubAck at once. The same schedule as `pubsub bench --rate` (client/src/bench/pace.rs): a
    // publisher behind it sends at most PACE_CATCH_UP_MAX messages back to back, then the
    // schedule slips to now, so a stall does not turn into a burst for one system only.
    let start = Instant::now();
    let (mut origin, mut scheduled) = (start, 0u64);
    let mut pending = FuturesUnordered::new();
    let mut hist = new_hist();
    let (mut sent, mut acked, mut errors, mut first_error) = (0u64, 0u64, 0u64, None::<String>);
    loop {
        let mut wait_until = None;
        while pending.len() < a.inflight && sent < a.messages && start.elapsed() < a.duration {
            if a.rate > 0.0 {
                let now = Instant::now();
                let mut due = origin + Duration::from_secs_f64(scheduled as f64 / a.rate);
                let catch_up = Duration::from_secs_f64(PACE_CATCH_UP_MAX as f64 / a.rate);
                let earliest = now.checked_sub(catch_up).unwrap_or(now);
                if due < earliest {
                    (origin, scheduled, due) = (earliest, 0, earliest);
                }
                if due > now {
                    wait_until = Some(tokio::time::Instant::from_std(due));
                    break;
                }
                scheduled += 1;
            }
            let (js, subject) = (js.clone(), subject.clone());
            let body = timed_payload(a.payload_bytes, now_us());
            pending.push(async move {
                let t0 = Instant::now();
                let outcome: Result<(), Error> =
                    async { Ok(js.publish(subject, body).await?.await.map(|_| ())?) }.await;
                (t0.elapsed(), outcome)
            });
            sent += 1;
        }
        if pending.is_empty() && wait_until.is_none() {
            break;
        }
        tokio::select! {
            Some((took, outcome)) = pending.next(), if !pending.is_empty() => match outcome {
                Ok(()) => {
                    acked += 1;
                    hist.saturating_record(took.as_micros().max(1) as u64);
                }
                Err(e) => {
                    errors += 1;
                    first_error.get_or_insert_with(|| e.to_string());
                }
            },
            _ = tokio::time::sleep_until(wait_until.unwrap_or_else(tokio::time::Instant::now)), if wait_until.is_some() => {}
        }
    }
    let secs = start.elapsed().as_secs_f64();

    let _ = goal_tx.send(Some(acked));
    let mut deliver = new_hist();
    let (mut delivered, mut deliver_errors, mut deliver_first_error) = (0u64, 0u64, None::<String>);
    for t in subscriber_tasks {
        let r = t.await?;
        deliver.add(&r.hist).expect("same bounds");
        delivered += r.delivered;
        deliver_errors += r.errors;
        deliver_first_error = deliver_first_error.or(r.first_error);
    }
    let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "{}",
        json!({
            "system": "nats",
            "workload": "publish_fanout",
            "consumer": format!("ordered {}", a.consumer),
            "subscribers": a.subscribers,
            "connections": conns,
            "rate": a.rate,
            "inflight": a.inflight,
            "payload_bytes": a.payload_bytes,
            "messages": acked,
            "errors": errors,
            "first_error": first_error,
            "duration_secs": secs,
            "msgs_per_sec": acked as f64 / secs,
            "p50_ms": ms(&hist, 0.50),
            "p99_ms": ms(&hist, 0.99),
            "p999_ms": ms(&hist, 0.999),
            "max_ms": hist.max() as f64 / 1000.0,
            "delivered": delivered,
            "deliver_missing": (acked * a.subscribers as u64).saturating_sub(delivered),
            "deliver_errors": deliver_errors,
            "deliver_first_error": deliver_first_error,
            "deliver_p50_ms": ms(&deliver, 0.50),
            "deliver_p99_ms": ms(&deliver, 0.99),
            "deliver_p999_ms": ms(&deliver, 0.999),
            "deliver_max_ms": deliver.max() as f64 / 1000.0,
        })
    );
    Ok(())
}

/// The endpoint of the member that leads, found by asking every member for its status.
async fn etcd_leader(servers: &[String]) -> Result<String, Error> {
    for s in servers {
        let Ok(mut client) = etcd_client::Client::connect([s.as_str()], None).await else { continue };
        let Ok(status) = client.status().await else { continue };
        let me = status.header().map(|h| h.member_id()).unwrap_or_default();
        if me != 0 && me == status.leader() {
            return Ok(s.clone());
        }
    }
    Err("no member reports itself leader yet".into())
}

async fn run_etcd(a: &Args, shared: Arc<Shared>, payload: Bytes) -> Result<Vec<tokio::task::JoinHandle<()>>, Error> {
    let leader = retry("find the etcd leader", Duration::from_secs(30), || etcd_leader(&a.servers)).await?;
    eprintln!("peers-bench: etcd leader {leader}");
    // etcd's own client protocol, gRPC: one HTTP/2 connection to the leader that every task's
    // puts share (etcd's `benchmark put` also multiplexes many clients over few connections).
    let client = etcd_client::Client::connect([leader.as_str()], None).await?;
    let run_id = std::process::id();
    // One put so the connection and the leader are warm before the clock starts.
    client.kv_client().put("bench/warmup", payload.to_vec(), None).await?;
    shared.start();
    Ok((0..a.concurrency)
        .map(|_| {
            let (kv, payload, shared) = (client.kv_client(), payload.clone(), shared.clone());
            tokio::spawn(worker(shared, move |n| {
                let mut kv = kv.clone();
                let (key, value) = (format!("bench/{run_id}/{n:08}"), payload.to_vec());
                async move {
                    kv.put(key, value, None).await?;
                    Ok(())
                }
            }))
        })
        .collect())
}

#[tokio::main]
async fn main() {
    if let Err(e) = real_main().await {
        eprintln!("peers-bench: {e}");
        std::process::exit(1);
    }
}

async fn real_main() -> Result<(), Error> {
    let a = parse_args()?;
    if a.system == "nats-fanout" {
        return run_nats_fanout(&a).await;
    }
    let payload = Bytes::from(vec![b'x'; a.payload_bytes]);
    let shared = Arc::new(Shared {
        next: AtomicU64::new(0),
        messages: a.messages,
        duration: a.duration,
        started: std::sync::OnceLock::new(),
        hist: Mutex::new(new_hist()),
        errors: AtomicU64::new(0),
        first_error: Mutex::new(None),
    });
    // Setup (stream creation, leader lookup, a warm-up request) happens before the clock
    // starts; each run_* calls `shared.start()` right before spawning its workers.
    let tasks = match a.system.as_str() {
        "nats" => run_nats(&a, shared.clone(), payload).await?,
        _ => run_etcd(&a, shared.clone(), payload).await?,
    };
    for t in tasks {
        t.await?;
    }
    let secs = shared.started.get().expect("started").elapsed().as_secs_f64();
    let hist = shared.hist.lock().unwrap();
    let ok = hist.len();
    let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "{}",
        json!({
            "system": a.system,
            "workload": "publish",
            "concurrency": a.concurrency,
            "payload_bytes": a.payload_bytes,
            "messages": ok,
            "errors": shared.errors.load(Ordering::Relaxed),
            "first_error": *shared.first_error.lock().unwrap(),
            "duration_secs": secs,
            "msgs_per_sec": ok as f64 / secs,
            "p50_ms": ms(0.50),
            "p99_ms": ms(0.99),
            "p999_ms": ms(0.999),
            "max_ms": hist.max() as f64 / 1000.0,
        })
    );
    Ok(())
}
