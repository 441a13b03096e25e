//! `peers-bench`: the same publish workload as `pubsub bench`, against NATS JetStream or etcd.
//!
//! ```text
//! peers-bench nats --servers 127.0.0.1:4222,... [--stream BENCH] --concurrency C --messages N
//! peers-bench etcd --servers http://127.0.0.1:2379,... --concurrency C --messages N
//!   common: [--payload-bytes 256] [--duration-secs S]
//! ```
//!
//! C tasks each keep one request in flight (C requests in flight in total) until N messages
//! are acknowledged or the duration is over. Latency is measured per request, from just
//! before it is sent to its acknowledgement:
//! - nats: `jetstream.publish(subject, payload).await?.await?` (the PubAck of an R3,
//!   file-backed stream, which is recreated fresh at the start of every run);
//! - etcd: `POST /v3/kv/put` on the v3 JSON gateway, distinct key per message, sent to the
//!   leader's client URL (found with `/v3/maintenance/status`).
//!
//! The last stdout line is a JSON object with `msgs_per_sec`, `p50_ms`, `p99_ms`, like ours.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use bytes::Bytes;
use hdrhistogram::Histogram;
use serde_json::{json, Value};

type Error = Box<dyn std::error::Error + Send + Sync>;

struct Args {
    system: String,
    servers: Vec<String>,
    stream: String,
    concurrency: usize,
    messages: u64,
    payload_bytes: usize,
    duration: Duration,
}

fn parse_args() -> Result<Args, Error> {
    let mut it = std::env::args().skip(1);
    let system = it.next().ok_or("usage: peers-bench nats|etcd --servers A,B,C --concurrency C --messages N")?;
    if system != "nats" && system != "etcd" {
        return Err(format!("unknown system {system:?} (nats or etcd)").into());
    }
    let mut a = Args {
        system,
        servers: Vec::new(),
        stream: "BENCH".into(),
        concurrency: 1,
        messages: 1000,
        payload_bytes: 256,
        duration: Duration::from_secs(120),
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
            _ => return Err(format!("unknown flag {flag}").into()),
        }
    }
    if a.servers.is_empty() || a.concurrency == 0 {
        return Err("--servers and a concurrency ≥ 1 are required".into());
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

async fn run_nats(a: &Args, shared: Arc<Shared>, payload: Bytes) -> Result<Vec<tokio::task::JoinHandle<()>>, Error> {
    use async_nats::jetstream::{self, stream};
    let addrs: Vec<async_nats::ServerAddr> = a.servers.iter().map(|s| s.parse()).collect::<Result<_, _>>()?;
    let client =
        async_nats::ConnectOptions::new().request_timeout(Some(Duration::from_secs(10))).connect(addrs).await?;
    let js = jetstream::new(client);
    let subject = format!("{}.msgs", a.stream.to_lowercase());
    let config = stream::Config {
        name: a.stream.clone(),
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
    js.get_stream(&a.stream).await?.purge().await?;
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

/// POSTs a JSON body to etcd's v3 gateway and returns the JSON answer.
async fn etcd_post(http: &reqwest::Client, url: &str, body: String) -> Result<Value, Error> {
    let resp = http.post(url).header("content-type", "application/json").body(body).send().await?;
    let status = resp.status();
    let bytes = resp.bytes().await?;
    if !status.is_success() {
        return Err(format!("{url}: HTTP {status}: {}", String::from_utf8_lossy(&bytes)).into());
    }
    Ok(serde_json::from_slice(&bytes)?)
}

/// The client URL of the member that leads, found by asking every member for its status.
async fn etcd_leader(http: &reqwest::Client, servers: &[String]) -> Result<String, Error> {
    for s in servers {
        let Ok(st) = etcd_post(http, &format!("{s}/v3/maintenance/status"), "{}".into()).await else { continue };
        let me = st["header"]["member_id"].as_str().unwrap_or_default();
        let leader = st["leader"].as_str().unwrap_or_default();
        if !me.is_empty() && me == leader {
            return Ok(s.clone());
        }
    }
    Err("no member reports itself leader yet".into())
}

async fn run_etcd(a: &Args, shared: Arc<Shared>, payload: Bytes) -> Result<Vec<tokio::task::JoinHandle<()>>, Error> {
    let http =
        reqwest::Client::builder().pool_max_idle_per_host(a.concurrency).timeout(Duration::from_secs(10)).build()?;
    let leader = retry("find the etcd leader", Duration::from_secs(30), || etcd_leader(&http, &a.servers)).await?;
    eprintln!("peers-bench: etcd leader {leader}");
    let url: Arc<str> = format!("{leader}/v3/kv/put").into();
    let value_b64: Arc<str> = B64.encode(&payload).into();
    let run_id = std::process::id();
    // One put so the connection and the leader are warm before the clock starts.
    etcd_post(&http, &url, json!({"key": B64.encode(b"bench/warmup"), "value": &*value_b64}).to_string()).await?;
    shared.start();
    Ok((0..a.concurrency)
        .map(|_| {
            let (http, url, value_b64, shared) = (http.clone(), url.clone(), value_b64.clone(), shared.clone());
            tokio::spawn(worker(shared, move |n| {
                let (http, url) = (http.clone(), url.clone());
                let key = B64.encode(format!("bench/{run_id}/{n:08}"));
                let body = json!({"key": key, "value": &*value_b64}).to_string();
                async move {
                    etcd_post(&http, &url, body).await?;
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
