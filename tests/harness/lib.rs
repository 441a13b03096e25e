//! Test harness: real `pubsub-node` processes on 127.0.0.1 with free ports and temp data dirs.
//!
//! # Layout
//! - [`Cluster`]: start N nodes, find the leader, kill / terminate / restart nodes.
//! - [`http`]: a small HTTP helper (no redirect following) for asserting on raw responses.
//! - [`wait_until`]: poll a condition with a deadline instead of sleeping.

pub mod history;
pub mod http;
pub mod sim;

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use serde_json::Value;
use tempfile::TempDir;

/// A WebSocket to a node's `/raft` ([`Cluster::raft_peer`]).
pub type RaftPeer = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Polls `check` every 20 ms until it returns `Some`, or panics with `what` after `timeout`.
pub async fn wait_until<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the node at `url` has applied `topic` up to `sequence`.
pub async fn wait_applied(url: &str, topic: &str, sequence: u64) {
    wait_applied_within(url, topic, sequence, Duration::from_secs(10)).await
}

/// [`wait_applied`], for as long as `timeout`.
pub async fn wait_applied_within(url: &str, topic: &str, sequence: u64, timeout: Duration) {
    wait_until("the node applies the topic's messages", timeout, || async {
        let (s, b) = http::get_json(&format!("{url}/topics/{topic}")).await.ok()?;
        (s == 200 && b["current_sequence"].as_u64()? >= sequence).then_some(())
    })
    .await
}

/// Allocates `bytes` of disk for a file at `path` (`fallocate`); false where the file system
/// cannot.
pub fn allocate(path: &Path, bytes: u64) -> bool {
    let made = Command::new("fallocate").args(["-l", &bytes.to_string()]).arg(path).status();
    made.is_ok_and(|status| status.success())
}

/// The `pubsub-node` binary: `PUBSUB_NODE_BIN`, else next to this test's `deps/` directory.
pub fn node_binary() -> PathBuf {
    if let Ok(path) = std::env::var("PUBSUB_NODE_BIN") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let bin = dir.join("pubsub-node");
    assert!(bin.exists(), "{} not built: run `cargo build --release --bins` first", bin.display());
    bin
}

/// Test ports lie below Linux's default ephemeral range (32768 and up), where `bind(0)` never
/// lands: a port chosen with `bind(0)` and released until the node binds it was once handed out
/// again in between (two nodes of one cluster got the same port in CI). Each test binary takes
/// its own window of the range (by pid); a counter keeps the clusters of its parallel tests apart.
const TEST_PORTS_FIRST: u16 = 20_000;
const TEST_PORTS_WINDOWS: u32 = 120;
const TEST_PORTS_PER_WINDOW: u16 = 100;

/// `n` distinct ports that could be bound just now, none handed out before by this process.
pub fn free_ports(n: usize) -> Vec<u16> {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let window = TEST_PORTS_FIRST + (std::process::id() % TEST_PORTS_WINDOWS) as u16 * TEST_PORTS_PER_WINDOW;
    let mut ports = Vec::with_capacity(n);
    for _ in 0..2 * TEST_PORTS_PER_WINDOW {
        let offset = NEXT.fetch_add(1, Ordering::Relaxed) % TEST_PORTS_PER_WINDOW;
        let port = window + offset;
        // Something else on the machine may hold it: skip those.
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            ports.push(port);
        }
        if ports.len() == n {
            return ports;
        }
    }
    panic!("no {n} free ports in 127.0.0.1:{window}..{}", window + TEST_PORTS_PER_WINDOW);
}

/// One node process.
pub struct NodeProc {
    pub id: u64,
    pub addr: String,
    pub data_dir: PathBuf,
    /// Flags of this node alone, after the cluster's: taken at its next start.
    pub args: Vec<String>,
    /// Started with `--join` (no `--peers`) by [`Cluster::start_joining_node`].
    joining: bool,
    log: PathBuf,
    child: Option<Child>,
}

/// Options for a test cluster.
#[derive(Clone)]
pub struct Options {
    pub nodes: usize,
    pub secret: Option<String>,
    /// `--snapshot-logs`: small values make followers catch up by snapshot.
    pub snapshot_logs: Option<u64>,
    pub heartbeat_ms: u64,
    pub election_timeout_ms: u64,
    /// `--client-addresses`, the same on every node.
    pub client_addresses: Option<String>,
    /// More flags, the same on every node.
    pub extra_args: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            nodes: 3,
            secret: Some("test-secret".into()),
            snapshot_logs: None,
            heartbeat_ms: 50,
            // The node's default. Most tests find the leader once and write to it: with 0.5 s,
            // a leader starved that long on a loaded 2-core machine (up to six node processes
            // of two tests at once) lost its place and the test's next write got a 307.
            election_timeout_ms: 1000,
            client_addresses: None,
            extra_args: Vec::new(),
        }
    }
}

/// A cluster of real processes; killed when dropped.
pub struct Cluster {
    pub nodes: Vec<NodeProc>,
    peers: String,
    options: Options,
    dir: TempDir,
}

impl Cluster {
    /// Starts a cluster and waits until a leader is elected and every node knows it.
    pub async fn start(options: Options) -> Cluster {
        let dir = tempfile::Builder::new().prefix("pubsub-test-").tempdir().expect("temp dir");
        let ports = free_ports(options.nodes);
        let peers =
            ports.iter().enumerate().map(|(i, p)| format!("{}=127.0.0.1:{p}", i + 1)).collect::<Vec<_>>().join(",");
        let nodes = ports
            .iter()
            .enumerate()
            .map(|(i, port)| NodeProc {
                id: i as u64 + 1,
                addr: format!("127.0.0.1:{port}"),
                data_dir: dir.path().join(format!("node-{}", i + 1)),
                args: Vec::new(),
                joining: false,
                log: dir.path().join(format!("node-{}.log", i + 1)),
                child: None,
            })
            .collect();
        let mut cluster = Cluster { nodes, peers, options, dir };
        for i in 0..cluster.nodes.len() {
            cluster.spawn(i);
        }
        cluster.wait_leader(Duration::from_secs(20)).await;
        cluster
    }

    fn spawn(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        let log = File::options().create(true).append(true).open(&node.log).expect("log file");
        let mut cmd = Command::new(node_binary());
        cmd.arg("--id").arg(node.id.to_string()).arg("--listen").arg(&node.addr);
        match node.joining {
            true => cmd.arg("--join").arg("--advertise").arg(&node.addr),
            false => cmd.arg("--peers").arg(&self.peers),
        };
        cmd.arg("--data-dir")
            .arg(&node.data_dir)
            .arg("--heartbeat-ms")
            .arg(self.options.heartbeat_ms.to_string())
            .arg("--election-timeout-ms")
            .arg(self.options.election_timeout_ms.to_string())
            .env("RUST_LOG", "info,openraft=warn")
            .stdout(Stdio::from(log.try_clone().expect("log")))
            .stderr(Stdio::from(log));
        if let Some(secret) = &self.options.secret {
            cmd.arg("--cluster-secret").arg(secret);
        }
        if let Some(n) = self.options.snapshot_logs {
            cmd.arg("--snapshot-logs").arg(n.to_string());
        }
        if let Some(addresses) = &self.options.client_addresses {
            cmd.arg("--client-addresses").arg(addresses);
        }
        cmd.args(&self.options.extra_args).args(&node.args);
        node.child = Some(cmd.spawn().expect("spawn pubsub-node"));
    }

    /// Starts one more node, the next id on a free port, with `--join` (it waits to be added
    /// through `POST /cluster/members`). Returns its index.
    pub fn start_joining_node(&mut self) -> usize {
        let id = self.nodes.iter().map(|n| n.id).max().unwrap_or(0) + 1;
        let port = free_ports(1)[0];
        self.nodes.push(NodeProc {
            id,
            addr: format!("127.0.0.1:{port}"),
            data_dir: self.dir.path().join(format!("node-{id}")),
            args: Vec::new(),
            joining: true,
            log: self.dir.path().join(format!("node-{id}.log")),
            child: None,
        });
        let i = self.nodes.len() - 1;
        self.spawn(i);
        i
    }

    /// The cluster's `--cluster-secret`, as a membership change presents it.
    pub fn secret(&self) -> Option<&str> {
        self.options.secret.as_deref()
    }

    pub fn url(&self, i: usize) -> String {
        format!("http://{}", self.nodes[i].addr)
    }

    /// A connection to node `i`'s `/raft`, as a peer holding the cluster's secret and
    /// presenting its id (a node that has one refuses peers presenting none).
    pub async fn raft_peer(&self, i: usize) -> RaftPeer {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let mut request = format!("ws://{}/raft", self.nodes[i].addr).into_client_request().unwrap();
        if let Some(secret) = &self.options.secret {
            request.headers_mut().insert("authorization", format!("Bearer {secret}").parse().unwrap());
        }
        let id = wait_until("the node's cluster id", Duration::from_secs(20), || async {
            Some(self.cluster_info(i).await?["cluster_id"].as_str()?.to_string())
        })
        .await;
        request.headers_mut().insert("x-pubsub-cluster-id", id.parse().unwrap());
        tokio_tungstenite::connect_async(request).await.expect("a peer connects").0
    }

    pub fn urls(&self) -> Vec<String> {
        (0..self.nodes.len()).map(|i| self.url(i)).collect()
    }

    pub fn running(&self, i: usize) -> bool {
        self.nodes[i].child.is_some()
    }

    /// `GET /cluster` on node `i`.
    pub async fn cluster_info(&self, i: usize) -> Option<Value> {
        http::get_json(&format!("{}/cluster", self.url(i))).await.ok().map(|(_, v)| v)
    }

    /// Index of the leader as every running node sees it (they must agree).
    pub async fn wait_leader(&self, timeout: Duration) -> usize {
        wait_until("a leader all running nodes agree on", timeout, || async {
            let mut leader = None;
            for i in (0..self.nodes.len()).filter(|&i| self.running(i)) {
                let info = self.cluster_info(i).await?;
                let id = info["leader_id"].as_str()?.to_string();
                if leader.get_or_insert(id.clone()) != &id {
                    return None;
                }
            }
            let id: u64 = leader?.trim_start_matches("node-").parse().ok()?;
            let i = self.nodes.iter().position(|n| n.id == id)?;
            self.running(i).then_some(i)
        })
        .await
    }

    /// SIGKILL: no chance to flush anything.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOP: the node stops answering without closing anything (its connections stay
    /// open, and new ones wait in its listen queue) until it is resumed or killed.
    pub fn pause(&self, i: usize) {
        self.signal(i, "-STOP");
    }

    /// SIGCONT: a paused node goes on where it stopped.
    pub fn resume(&self, i: usize) {
        self.signal(i, "-CONT");
    }

    fn signal(&self, i: usize, signal: &str) {
        if let Some(child) = &self.nodes[i].child {
            let _ = Command::new("kill").arg(signal).arg(child.id().to_string()).status();
        }
    }

    /// SIGTERM, and wait for a clean exit. Returns the exit code.
    pub fn terminate(&mut self, i: usize) -> Option<i32> {
        let mut child = self.nodes[i].child.take()?;
        let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
        // 30 s: a stop may spend 5 s draining requests, then close RocksDB, on a loaded machine.
        for _ in 0..1500 {
            if let Ok(Some(status)) = child.try_wait() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        child.wait().ok().and_then(|s| s.code())
    }

    /// SIGKILL to every node, one after the other.
    pub fn kill_all(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
    }

    /// Starts every node again (each must be stopped).
    pub fn restart_all(&mut self) {
        for i in 0..self.nodes.len() {
            self.restart(i);
        }
    }

    /// Starts node `i` again on the same address and data dir.
    pub fn restart(&mut self, i: usize) {
        assert!(self.nodes[i].child.is_none(), "node {i} is running");
        self.spawn(i);
    }

    /// Whether node `i` has exited on its own: once it has, its exit code (`None` if a signal
    /// ended it), and the node counts as stopped from then on.
    pub fn exited(&mut self, i: usize) -> Option<Option<i32>> {
        let status = self.nodes[i].child.as_mut()?.try_wait().ok()??;
        self.nodes[i].child = None;
        Some(status.code())
    }

    /// Everything node `i` has logged, over all its runs.
    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(&self.nodes[i].log).unwrap_or_default()
    }

    /// The last lines of every node's log, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for (i, node) in self.nodes.iter().enumerate() {
            let text = self.log(i);
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(40)..];
            out.push_str(&format!("--- node-{} ---\n{}\n", node.id, tail.join("\n")));
        }
        out
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
    }
}

/// Publishes `payload` with `id`, following redirects and retrying with the same id on
/// transient failures (503, 504, 500, connection errors), up to `timeout`. Returns the
/// sequence once acknowledged (a 409 on a retry is the acknowledgement of an earlier try).
pub async fn publish_retrying(
    urls: &[String],
    topic: &str,
    id: &str,
    payload: &Value,
    timeout: Duration,
) -> Option<u64> {
    let deadline = tokio::time::Instant::now() + timeout;
    let body = serde_json::json!({"id": id, "payload": payload});
    let mut target = urls[0].clone();
    let mut attempt = 0usize;
    while tokio::time::Instant::now() < deadline {
        attempt += 1;
        match http::post(&format!("{target}/topics/{topic}/messages"), &body).await {
            Ok(r) if r.status == 201 => return r.body["sequence"].as_u64(),
            Ok(r) if r.status == 409 => {
                if let Some(seq) = r.body["existing_sequence"].as_u64() {
                    return Some(seq);
                }
                // The first try is still in flight: ask again shortly.
            }
            Ok(r) if r.status == 307 => {
                if let Some(addr) = r.body["leader_address"].as_str() {
                    target = format!("http://{addr}");
                    continue;
                }
            }
            _ => target = urls[attempt % urls.len()].clone(),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Every message of `topic` as node `url` serves it: (sequence, id) in order.
pub async fn read_all(url: &str, topic: &str) -> Option<Vec<(u64, String)>> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let (status, body) =
            http::get_json(&format!("{url}/topics/{topic}/messages?after={after}&limit=1000")).await.ok()?;
        if status != 200 {
            return None;
        }
        let messages = body["messages"].as_array()?;
        if messages.is_empty() {
            return Some(out);
        }
        for m in messages {
            let seq = m["sequence"].as_u64()?;
            out.push((seq, m["id"].as_str()?.to_string()));
            after = seq;
        }
    }
}

/// Waits until every running node serves the same (sequence → id) log holding every
/// acknowledged sequence, then checks it with the history checker: sequences contiguous from
/// 1, no id stored twice, every acknowledged id at the sequence it was acknowledged with.
/// Returns the log.
pub async fn assert_converged(
    c: &Cluster,
    topic: &str,
    acked: &std::collections::HashMap<String, u64>,
) -> Vec<(u64, String)> {
    let running: Vec<usize> = (0..c.nodes.len()).filter(|&i| c.running(i)).collect();
    let top = acked.values().copied().max().unwrap_or(0);
    let logs = wait_until("all running nodes serve the same log", Duration::from_secs(30), || async {
        let mut logs = std::collections::BTreeMap::new();
        for &i in &running {
            logs.insert(format!("node-{}", c.nodes[i].id), read_all(&c.url(i), topic).await?);
        }
        let first = logs.values().next()?.clone();
        (first.len() as u64 >= top && logs.values().all(|l| *l == first)).then_some(logs)
    })
    .await;
    let log = logs.values().next().cloned().unwrap_or_default();
    assert_eq!(log.first().map(|(seq, _)| *seq).unwrap_or(1), 1, "sequences start at 1");
    let history =
        history::History { acked: acked.iter().map(|(k, v)| (k.clone(), *v)).collect(), logs, ..Default::default() };
    let violations = history.check();
    assert!(violations.is_empty(), "violations: {violations:?}");
    log
}
