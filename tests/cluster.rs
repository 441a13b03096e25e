//! Faults against real 3-node clusters: leader kill -9 under load, restarts of one node and
//! of the whole cluster (also right after every node purged its log), catch-up by snapshot,
//! subscriptions across a leader change and on a follower without a leader, a clean SIGTERM, a stopping leader's hand-over, and a
//! node of another cluster at a peer address.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use pubsub_tests::http::{get, post, post_raw};
use pubsub_tests::{assert_converged, publish_retrying, wait_applied, wait_until, Cluster, Options};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::error::ProtocolError;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

const CONVERGE: Duration = Duration::from_secs(30);
/// How long the cluster may take to elect a new leader after its leader is killed (see
/// `leader_kill_loses_no_acked_publish`).
const ELECTION_AFTER_LEADER_KILL_MAX: Duration = Duration::from_secs(12);

/// How long a node may take to stop with a request body still trickling in: its drain of
/// requests (5 s) and room on two loaded cores, under the body's 30 s read timeout, which a
/// stop that waited for the body would take.
const STOP_PAST_A_TRICKLING_BODY_MAX: Duration = Duration::from_secs(20);

async fn create_topic(c: &Cluster, topic: &str) {
    let l = c.url(c.wait_leader(CONVERGE).await);
    let r = post_raw(&format!("{l}/topics/{topic}"), "").await.unwrap();
    assert!(r.status == 201 || r.status == 200, "{r:?}");
}

/// Publishes `{prefix}{i}` (payload `i`) to topic `t` for each `i` in `range`, each until
/// acknowledged, and records its sequence in `acked`.
async fn publish_each(c: &Cluster, prefix: &str, range: std::ops::Range<u64>, acked: &mut HashMap<String, u64>) {
    for i in range {
        let id = format!("{prefix}{i}");
        let sequence = publish_retrying(&c.urls(), "t", &id, &json!(i), CONVERGE).await.expect("acked");
        acked.insert(id, sequence);
    }
}

/// A running publish load.
struct Load {
    /// Every acknowledged publish: id → sequence.
    acked: Arc<Mutex<HashMap<String, u64>>>,
    /// When the last publish was acknowledged, and the longest time without one since
    /// [`Load::longest_pause_from_now`] last started it over.
    pauses: Arc<Mutex<(std::time::Instant, Duration)>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    /// Publishes acknowledged so far.
    fn acked_count(&self) -> usize {
        self.acked.lock().unwrap().len()
    }

    /// Starts measuring the longest time without an acknowledged publish over.
    fn longest_pause_from_now(&self) {
        *self.pauses.lock().unwrap() = (std::time::Instant::now(), Duration::ZERO);
    }

    /// The longest time without an acknowledged publish since it was last started over.
    fn longest_pause(&self) -> Duration {
        self.pauses.lock().unwrap().1
    }

    /// Stops publishing and returns every acknowledged publish.
    async fn finish(self) -> HashMap<String, u64> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.tasks {
            t.await.unwrap();
        }
        let acked = self.acked.lock().unwrap().clone();
        acked
    }
}

/// Runs `publishers` tasks publishing unique ids until the load is finished.
fn spawn_load(c: &Cluster, topic: &str, publishers: usize) -> Load {
    spawn_load_padded(c, topic, publishers, 0)
}

/// [`spawn_load`] with `pad` bytes more in each payload.
fn spawn_load_padded(c: &Cluster, topic: &str, publishers: usize, pad: usize) -> Load {
    let acked = Arc::new(Mutex::new(HashMap::new()));
    let pauses = Arc::new(Mutex::new((std::time::Instant::now(), Duration::ZERO)));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tasks = (0..publishers)
        .map(|p| {
            let (urls, topic, acked, stop) = (c.urls(), topic.to_string(), acked.clone(), stop.clone());
            let pauses = pauses.clone();
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let id = format!("p{p}-{n}");
                    let mut payload = json!({"p": p, "n": n});
                    if pad > 0 {
                        payload["pad"] = json!("x".repeat(pad));
                    }
                    if let Some(seq) = publish_retrying(&urls, &topic, &id, &payload, CONVERGE).await {
                        acked.lock().unwrap().insert(id, seq);
                        let mut pauses = pauses.lock().unwrap();
                        let pause = pauses.0.elapsed();
                        *pauses = (std::time::Instant::now(), pauses.1.max(pause));
                    }
                    n += 1;
                }
            })
        })
        .collect();
    Load { acked, pauses, stop, tasks }
}

/// The Raft term node `i` reports.
async fn raft_term(c: &Cluster, i: usize) -> u64 {
    c.cluster_info(i).await.expect("cluster info")["raft_term"].as_u64().expect("raft_term")
}

async fn wait_acks(acked: &Arc<Mutex<HashMap<String, u64>>>, at_least: usize) {
    wait_until("publishes acknowledged", CONVERGE, || async {
        (acked.lock().unwrap().len() >= at_least).then_some(())
    })
    .await;
}

/// A 3-node cluster with topic `t` under a load of 4 publishers, 50 of whose publishes are
/// acknowledged already.
async fn cluster_under_load() -> (Cluster, Load) {
    let c = Cluster::start(Options::default()).await;
    create_topic(&c, "t").await;
    let load = spawn_load(&c, "t", 4);
    wait_acks(&load.acked, 50).await;
    (c, load)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kill_loses_no_acked_publish() {
    let (mut c, load) = cluster_under_load().await;

    let old = c.wait_leader(CONVERGE).await;
    c.kill(old);
    let killed_at = std::time::Instant::now();
    // `wait_leader` names only a running node: another than the one killed.
    c.wait_leader(CONVERGE).await;
    // A follower stands once its own election timeout (1–2 s here, drawn again for every
    // election) has passed since it last heard the leader; the other follower grants its vote
    // since the leader's lease (the minimum timeout, vendor/openraft/PATCHED.md) has run out
    // for it too. Two candidates that stand together split the vote and each such round adds
    // another 1–2 s; a candidate with the shorter log waits longer, so the longer one wins.
    // The bound allows for several rounds on two loaded cores; a cluster that cannot elect at
    // all fails it.
    let election = killed_at.elapsed();
    eprintln!("new leader {election:?} after the kill");
    assert!(election < ELECTION_AFTER_LEADER_KILL_MAX, "new leader took {election:?}");
    let before = load.acked_count();
    wait_acks(&load.acked, before + 50).await;

    c.restart(old);
    wait_acks(&load.acked, before + 100).await;
    let acked = load.finish().await;
    assert_converged(&c, "t", &acked).await;
}

/// A leader sends its entries before its own flush ends, so after a power cut its followers
/// may hold entries its own log lost. Restored as leader in the same term, it would number
/// new entries from its shorter log with log ids the followers hold for other entries, and the
/// replicas would diverge. So a killed leader restarted at once, before its followers' election
/// timeout, must not lead again in its old term: the next leader is elected in a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_restarted_at_once_does_not_lead_again_in_its_old_term() {
    // Followers wait 4-8 s without a heartbeat before standing: the restart comes well before.
    let options = Options { election_timeout_ms: 4_000, ..Options::default() };
    let mut c = Cluster::start(options).await;
    create_topic(&c, "t").await;
    let old = c.wait_leader(CONVERGE).await;
    let old_term = raft_term(&c, old).await;
    c.kill(old);
    c.restart(old);
    let new = c.wait_leader(CONVERGE).await;
    let new_term = raft_term(&c, new).await;
    assert!(new_term > old_term, "node {} leads in term {new_term}, the term it led before the kill", new + 1);
    let seq = publish_retrying(&c.urls(), "t", "after", &json!(1), CONVERGE).await.expect("acked");
    assert_eq!(seq, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_of_a_node_and_of_the_whole_cluster_keep_everything() {
    let mut c = Cluster::start(Options::default()).await;
    create_topic(&c, "t").await;
    let mut acked = HashMap::new();
    publish_each(&c, "m", 0..30, &mut acked).await;
    // One follower restarts (SIGTERM: clean exit code 0).
    let follower = (c.wait_leader(CONVERGE).await + 1) % 3;
    assert_eq!(c.terminate(follower), Some(0));
    c.restart(follower);
    publish_each(&c, "m", 30..40, &mut acked).await;
    assert_converged(&c, "t", &acked).await;

    // The whole cluster, killed without warning.
    kill_and_restart_everything(&mut c, "t", &acked).await;
}

/// Every node killed at once with publishes in flight: nothing acknowledged is lost and the
/// restarted cluster takes the load again. Each node starts from its fsynced log and from its
/// state machine as of its last flush (applies skip RocksDB's WAL), redoing the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_cluster_killed_under_load_loses_no_acked_publish() {
    let (mut c, load) = cluster_under_load().await;
    c.kill_all();
    let before = load.acked_count();
    c.restart_all();
    wait_acks(&load.acked, before + 50).await;
    let acked = load.finish().await;
    assert_converged(&c, "t", &acked).await;
}

/// Kills every node without warning and restarts them all; then the topic holds exactly the
/// acknowledged messages and the next publish takes the next sequence.
async fn kill_and_restart_everything(c: &mut Cluster, topic: &str, acked: &HashMap<String, u64>) {
    c.kill_all();
    c.restart_all();
    c.wait_leader(CONVERGE).await;
    let log = assert_converged(c, topic, acked).await;
    assert_eq!(log.len(), acked.len());
    let seq = publish_retrying(&c.urls(), topic, "after-restart", &json!(1), CONVERGE).await.expect("acked");
    assert_eq!(seq, acked.len() as u64 + 1);
}

/// After a crash a node rebuilds what its state machine lost from its log, so the entries it
/// purged must be covered by state that survived: killed without warning right after every
/// node purged its log, the cluster still serves every acknowledged message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_cluster_killed_after_purging_its_logs_keeps_everything() {
    let mut c = Cluster::start(Options { snapshot_logs: Some(100), ..Default::default() }).await;
    create_topic(&c, "t").await;
    let mut acked = HashMap::new();
    let mut n = 0;
    let logs: Vec<_> = (1..=3).map(|i| c.dir().join(format!("node-{i}.log"))).collect();
    // Publish until every node has purged entries (snapshots are built in the background);
    // the logs are read once every 50 publishes.
    while !logs.iter().all(|log| std::fs::read_to_string(log).is_ok_and(|text| text.contains("purged log"))) {
        assert!(n < 5_000, "no purge on every node after {n} publishes");
        publish_each(&c, "m", n..n + 50, &mut acked).await;
        n += 50;
    }
    kill_and_restart_everything(&mut c, "t", &acked).await;
}

/// A node whose data dir was lost (a disk replaced) started again, empty, under its `--id` and
/// `--peers` while the other two keep a leader: it catches up, serves every message and takes
/// the cluster's id, and the cluster goes on. Node 1 is the case that could go wrong: it
/// initialized the cluster, and on an empty dir it initializes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_started_again_on_an_empty_data_dir_catches_up() {
    let mut c = Cluster::start(Options::default()).await;
    create_topic(&c, "t").await;
    let mut acked = HashMap::new();
    publish_each(&c, "m", 0..20, &mut acked).await;
    let cluster_id = wait_until("a cluster id", CONVERGE, || async {
        c.cluster_info(1).await?["cluster_id"].as_str().map(String::from)
    })
    .await;
    c.kill(0);
    std::fs::remove_dir_all(&c.nodes[0].data_dir).expect("remove node-1's data dir");
    // As the README says to: once the other two have had a leader for an election timeout,
    // no vote request of a term node 1 voted in can still be on its way.
    c.wait_leader(CONVERGE).await;
    tokio::time::sleep(Duration::from_millis(Options::default().election_timeout_ms)).await;
    c.restart(0);
    publish_each(&c, "m", 20..30, &mut acked).await;
    assert_converged(&c, "t", &acked).await;
    wait_until("node-1 holds the cluster's id", CONVERGE, || async {
        (c.cluster_info(0).await?["cluster_id"].as_str()? == cluster_id).then_some(())
    })
    .await;
    let seq = publish_retrying(&c.urls(), "t", "after", &json!(1), CONVERGE).await.expect("acked");
    assert_eq!(seq, 31);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_that_missed_many_entries_catches_up_by_snapshot() {
    let mut c = Cluster::start(Options { snapshot_logs: Some(100), ..Default::default() }).await;
    create_topic(&c, "t").await;
    let follower = (c.wait_leader(CONVERGE).await + 1) % 3;
    c.kill(follower);
    let mut acked = HashMap::new();
    let l = c.url(c.wait_leader(CONVERGE).await);
    for b in 0..30 {
        // 30 batches plus 300 single publishes: far more entries than the log keeps.
        let batch: Vec<Value> = (0..10).map(|i| json!({"id": format!("b{b}-{i}"), "payload": i})).collect();
        let r = post(&format!("{l}/topics/t/messages/batch"), &json!({"messages": batch})).await.unwrap();
        for res in r.body["results"].as_array().unwrap() {
            acked.insert(res["id"].as_str().unwrap().to_string(), res["sequence"].as_u64().unwrap());
        }
        publish_each(&c, &format!("s{b}-"), 0..10, &mut acked).await;
    }
    // Snapshots are built (and the log purged) in the background: only once the leader has
    // purged entries the follower lacks must it catch up by snapshot.
    let leader_log = c.dir().join(format!("node-{}.log", c.wait_leader(CONVERGE).await + 1));
    wait_until("the leader purged its log", CONVERGE, || async {
        std::fs::read_to_string(&leader_log).ok().filter(|log| log.contains("purged log")).map(|_| ())
    })
    .await;
    c.restart(follower);
    assert_converged(&c, "t", &acked).await;
    let log = std::fs::read_to_string(c.dir().join(format!("node-{}.log", follower + 1))).unwrap();
    assert!(log.contains("installed snapshot"), "the follower caught up without a snapshot:\n{log}");
    let snapshot_index = pubsub_tests::http::metric(&c.url(follower), "pubsub_raft_snapshot_index").await;
    assert!(snapshot_index.is_some_and(|index| index > 0), "{snapshot_index:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_on_a_follower_keeps_receiving_through_a_leader_change() {
    let mut c = Cluster::start(Options::default()).await;
    create_topic(&c, "t").await;
    let leader = c.wait_leader(CONVERGE).await;
    let follower = (leader + 1) % 3;
    wait_applied(&c.url(follower), "t", 0).await;
    let ws_url = format!("ws://{}/topics/t/subscribe?subscriber_id=s&cursor=0", c.nodes[follower].addr);
    let (mut ws, _) = tokio_tungstenite::connect_async(ws_url).await.unwrap();

    let mut acked = HashMap::new();
    publish_each(&c, "a", 0..10, &mut acked).await;
    c.kill(leader);
    publish_each(&c, "b", 0..10, &mut acked).await;
    let mut sequences = Vec::new();
    let mut saw_leader_change = false;
    while sequences.len() < 20 {
        let msg = tokio::time::timeout(CONVERGE, ws.next()).await.expect("frame").unwrap().unwrap();
        let Message::Text(text) = msg else { continue };
        let frame: Value = serde_json::from_str(&text).unwrap();
        match frame["type"].as_str() {
            Some("message") => sequences.push(frame["sequence"].as_u64().unwrap()),
            _ if frame["subtype"] == "leader_change" => {
                saw_leader_change = true;
                assert!(frame["new_leader"].as_str().unwrap().starts_with("127.0.0.1:"));
                assert!(frame["new_leader_id"].as_str().unwrap().starts_with("node-"));
            }
            _ => {}
        }
    }
    assert_eq!(sequences, (1..=20).collect::<Vec<u64>>(), "no gap, no duplicate, in order");
    assert!(saw_leader_change, "a leader_change frame was sent");
}

/// The next frame of `ws` that is not a ping (within [`CONVERGE`], pings or not): a text frame
/// as JSON, or `{"closed": code}`.
async fn next_frame(
    ws: &mut tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
) -> Value {
    let deadline = tokio::time::Instant::now() + CONVERGE;
    loop {
        match tokio::time::timeout_at(deadline, ws.next()).await.expect("a frame in time") {
            Some(Ok(Message::Text(text))) => return serde_json::from_str(&text).unwrap(),
            Some(Ok(Message::Close(frame))) => return json!({"closed": frame.map(|f| u16::from(f.code))}),
            Some(Ok(_)) => continue,
            other => panic!("expected a frame, got {other:?}"),
        }
    }
}

/// A follower cut off from the others (here: they are frozen) closes its subscriptions with
/// 1013 once it has had no leader for a while, so their clients resume on another node (API.md
/// §7), and its `/ready` answers 503 (§2); a subscription opened during that spell, before the
/// others closed as after, stays, and receives once the cluster is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_without_a_leader_closes_its_subscriptions_once_per_spell() {
    let c = Cluster::start(Options::default()).await;
    create_topic(&c, "t").await;
    let leader = c.wait_leader(CONVERGE).await;
    let (follower, other) = ((leader + 1) % 3, (leader + 2) % 3);
    wait_applied(&c.url(follower), "t", 0).await;
    let ws_url = format!("ws://{}/topics/t/subscribe?subscriber_id=s&cursor=0", c.nodes[follower].addr);
    let (mut first, _) = tokio_tungstenite::connect_async(&ws_url).await.unwrap();
    assert_eq!(next_frame(&mut first).await["subtype"], "subscribed");

    let ready = format!("{}/ready", c.url(follower));
    let is_ready = || async { (get(&ready).await.ok()?.status == 200).then_some(()) };
    wait_until("the follower ready", CONVERGE, is_ready).await;
    c.pause(leader);
    c.pause(other);
    // Two election timeouts unheard: not ready, before the 5 s after which subscriptions
    // close. One opened now, during the spell, stays.
    let not_ready = || async {
        let r = get(&ready).await.ok()?;
        (r.status == 503 && r.body["error"] == "not_ready").then_some(())
    };
    wait_until("the follower not ready", CONVERGE, not_ready).await;
    let (mut second, _) = tokio_tungstenite::connect_async(&ws_url).await.unwrap();
    assert_eq!(next_frame(&mut second).await["subtype"], "subscribed");
    assert_eq!(next_frame(&mut first).await, json!({"closed": 1013}));
    let (mut after, _) = tokio_tungstenite::connect_async(&ws_url).await.unwrap();
    assert_eq!(next_frame(&mut after).await["subtype"], "subscribed");
    c.resume(leader);
    c.resume(other);
    wait_until("the follower ready again", CONVERGE, is_ready).await;
    publish_retrying(&c.urls(), "t", "after", &json!(1), CONVERGE).await.expect("acked");
    for ws in [&mut second, &mut after] {
        let frame = loop {
            let frame = next_frame(ws).await;
            if frame["subtype"] != "leader_change" {
                break frame;
            }
        };
        assert_eq!((&frame["type"], &frame["sequence"]), (&json!("message"), &json!(1)), "{frame}");
    }
}

/// A leader stopped with SIGTERM hands its leadership to an up-to-date follower
/// (node/src/raft/handover.rs). The followers here would wait at least 5 s without a heartbeat
/// before standing (their lease and election timeout), so a leader elected sooner was handed
/// over to; publishing goes on and no acknowledged publish is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_stopped_with_sigterm_hands_over_before_any_election_timeout() {
    // Long enough that the whole SIGTERM stop (requests drained, storage closed) fits well
    // before it on a loaded machine: only a hand-over elects a leader sooner.
    const ELECTION_TIMEOUT: Duration = Duration::from_secs(10);
    let options = Options { election_timeout_ms: ELECTION_TIMEOUT.as_millis() as u64, ..Options::default() };
    let mut c = Cluster::start(options).await;
    create_topic(&c, "t").await;
    let load = spawn_load(&c, "t", 2);
    wait_acks(&load.acked, 50).await;

    let old = c.wait_leader(CONVERGE).await;
    let old_term = raft_term(&c, old).await;
    load.longest_pause_from_now();
    let stopped_at = std::time::Instant::now();
    let (c, code) = tokio::task::spawn_blocking(move || {
        let code = c.terminate(old);
        (c, code)
    })
    .await
    .unwrap();
    assert_eq!(code, Some(0));
    let new = c.wait_leader(CONVERGE).await;
    let handed_over = stopped_at.elapsed();
    eprintln!("new leader {handed_over:?} after the SIGTERM");
    assert!(raft_term(&c, new).await > old_term);
    assert!(handed_over < ELECTION_TIMEOUT, "a new leader only after {handed_over:?}: no hand-over");

    let before = load.acked_count();
    wait_acks(&load.acked, before + 50).await;
    // What a rolling restart costs writers: the stop's drain, the hand-over, and the retries'
    // 50 ms sleeps (a figure to read, not a bound: the machine is shared).
    eprintln!("longest time without an acknowledged publish: {:?}", load.longest_pause());
    let acked = load.finish().await;
    assert_converged(&c, "t", &acked).await;
}

/// A `step_down` acts only for the vote it names, so an old one (late, replayed or forged)
/// cannot make a follower stand against the leader of a later term: a follower sent the hand-over
/// of a leader two terms back stays a follower, and the cluster its leader and term. Sent the
/// current leader's vote, the same follower stands at once (the message reaches its Raft).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_step_down_changes_no_leader_and_no_term() {
    use futures_util::SinkExt;
    use pubsub_node::raft::codec::{decode, encode, Frame, RpcRequest, RpcResponse};
    use raft_store::typ::Vote;

    let mut c = Cluster::start(Options::default()).await;
    create_topic(&c, "t").await;
    let first = c.wait_leader(CONVERGE).await;
    let first_term = raft_term(&c, first).await;
    let stale = Vote::new_committed(first_term, c.nodes[first].id);
    c.kill(first);
    let leader = c.wait_leader(CONVERGE).await;
    c.restart(first);
    assert_eq!(c.wait_leader(CONVERGE).await, leader, "the restarted node follows");
    let term = raft_term(&c, leader).await;
    assert!(term > first_term);
    let follower = (0..3).find(|&i| i != leader).unwrap();

    let mut peer = c.raft_peer(follower).await;
    let target = c.nodes[follower].id;
    let step_down = |id: u64, vote: Vote| {
        let frame = encode(&Frame { id, body: RpcRequest::StepDown { target, vote, elect: true } }).unwrap();
        Message::Binary(frame.into())
    };
    peer.send(step_down(1, stale)).await.unwrap();
    let reply = loop {
        match peer.next().await.expect("an answer").unwrap() {
            Message::Binary(bytes) => break decode::<RpcResponse>(&bytes).unwrap(),
            _ => continue,
        }
    };
    assert!(matches!(reply.body, RpcResponse::SteppedDown), "{reply:?}");

    // The step-down went to the follower's Raft before this publish's entries did: once it has
    // applied the publish, it has handled the step-down.
    let l = c.url(leader);
    let r = post(&format!("{l}/topics/t/messages"), &json!({"id": "after-stale", "payload": 1})).await.unwrap();
    assert_eq!(r.status, 201, "{r:?}");
    pubsub_tests::wait_applied(&c.url(follower), "t", 1).await;
    for i in 0..3 {
        let info = c.cluster_info(i).await.expect("cluster info");
        assert_eq!(info["raft_term"].as_u64(), Some(term), "node {i} moved to another term: {info}");
        assert_eq!(info["leader_id"], format!("node-{}", c.nodes[leader].id), "node {i}: {info}");
    }

    // The control: the current leader's own vote makes the same follower stand.
    let current = Vote::new_committed(term, c.nodes[leader].id);
    peer.send(step_down(2, current)).await.unwrap();
    wait_until("the follower stands for election", CONVERGE, || async {
        (c.cluster_info(follower).await?["raft_term"].as_u64()? > term).then_some(())
    })
    .await;
}

/// A subscription to topic `t`, as subscriber `s`, on node 0, its `subscribed` frame read.
async fn subscribed(c: &Cluster) -> WebSocketStream<MaybeTlsStream<tokio::net::TcpStream>> {
    let url = format!("ws://{}/topics/t/subscribe?subscriber_id=s", c.nodes[0].addr);
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    let _subscribed = ws.next().await;
    ws
}

/// Stops node 0 with SIGTERM, in the background: the cluster comes back with its exit code.
fn terminate_in_background(mut c: Cluster) -> tokio::task::JoinHandle<(Cluster, Option<i32>)> {
    tokio::task::spawn_blocking(move || {
        let code = c.terminate(0);
        (c, code)
    })
}

/// The code of the close frame that comes next on `frames` (other frames skipped), within
/// `CONVERGE`; anything else ending the stream fails the test.
async fn close_code(frames: &mut (impl futures_util::Stream<Item = Result<Message, WsError>> + Unpin)) -> Option<u16> {
    loop {
        match tokio::time::timeout(CONVERGE, frames.next()).await.expect("close in time") {
            Some(Ok(Message::Close(frame))) => return frame.map(|f| u16::from(f.code)),
            Some(Ok(_)) => continue,
            other => panic!("expected a close frame, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_closes_subscriptions_with_1001_and_exits_zero() {
    let c = Cluster::start(Options { nodes: 1, ..Default::default() }).await;
    create_topic(&c, "t").await;
    let mut ws = subscribed(&c).await;
    // A request whose body trickles in (it would have 30 s) does not hold the stop: the node
    // exits 0 once its drain of requests (5 s) is over, well before the body's read timeout.
    let mut trickling = tokio::net::TcpStream::connect(&c.nodes[0].addr).await.unwrap();
    let head = "POST /topics/t/messages HTTP/1.1\r\nhost: n\r\ncontent-length: 1000\r\n\r\n{\"payload\":";
    tokio::io::AsyncWriteExt::write_all(&mut trickling, head.as_bytes()).await.unwrap();
    let stopping = std::time::Instant::now();
    let exit = terminate_in_background(c);
    assert_eq!(close_code(&mut ws).await, Some(1001));
    let (_c, code) = exit.await.unwrap();
    assert_eq!(code, Some(0));
    let stopped = stopping.elapsed();
    assert!(stopped < STOP_PAST_A_TRICKLING_BODY_MAX, "the stop took {stopped:?}: it waited for the trickling body");
    drop(trickling);
}

/// A subscriber acking as fast as it can while its node stops: the node reads on after its
/// close frame until the client's answers, so the connection ends with the handshake, not a
/// reset. Dropped with those acks unread, the socket was reset by the kernel, and the client's
/// next read failed with "connection reset" (a reset also throws away whatever was still
/// queued to send, the close frame among it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_acking_through_a_stop_gets_a_clean_close_handshake() {
    let c = Cluster::start(Options { nodes: 1, ..Default::default() }).await;
    create_topic(&c, "t").await;
    let (mut acks, mut frames) = subscribed(&c).await.split();
    let acking = tokio::spawn(async move {
        let mut sent = 0u64;
        loop {
            match futures_util::SinkExt::send(&mut acks, Message::text(r#"{"type":"ack","sequence":0}"#)).await {
                Ok(()) => sent += 1,
                Err(e) => return (sent, e),
            }
        }
    });
    let exit = terminate_in_background(c);
    assert_eq!(close_code(&mut frames).await, Some(1001));
    // Reading on sends the client's answer; the server then closes the connection cleanly.
    let end = tokio::time::timeout(CONVERGE, frames.next()).await.expect("the end in time");
    assert!(end.is_none(), "expected the connection to end cleanly after the handshake, got {end:?}");
    // The client stopped sending because it had the close frame, not because the socket failed.
    let (sent, stopped) = acking.await.unwrap();
    assert!(sent > 0, "the client acked while the node stopped");
    assert!(
        matches!(stopped, WsError::Protocol(ProtocolError::SendAfterClosing) | WsError::AlreadyClosed),
        "the acks stopped with {stopped:?}"
    );
    let (_c, code) = exit.await.unwrap();
    assert_eq!(code, Some(0));
}

/// A follower that missed tens of MiB of log catches up from the log: AppendEntries are split
/// small enough to complete within openraft's deadline (one heartbeat interval).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_catches_up_on_a_large_backlog() {
    let mut c = Cluster::start(Options::default()).await;
    create_topic(&c, "big").await;
    let follower = (c.wait_leader(CONVERGE).await + 1) % 3;
    c.kill(follower);
    let l = c.url(c.wait_leader(CONVERGE).await);
    let mut acked = HashMap::new();
    let pad = "x".repeat(4000);
    for b in 0..80 {
        let batch: Vec<Value> = (0..100).map(|i| json!({"id": format!("b{b}-{i}"), "payload": {"pad": pad}})).collect();
        let r = post(&format!("{l}/topics/big/messages/batch"), &json!({"messages": batch})).await.unwrap();
        assert_eq!(r.status, 201, "{:?}", r.body);
        for res in r.body["results"].as_array().unwrap() {
            acked.insert(res["id"].as_str().unwrap().to_string(), res["sequence"].as_u64().unwrap());
        }
    }
    c.restart(follower);
    assert_converged(&c, "big", &acked).await;
}

/// One entry that takes longer than a heartbeat interval to reach a follower and be fsynced
/// there (a batch of 15 MB, heartbeats every 5 ms) commits, and so does what follows it.
/// openraft gave every AppendEntries one heartbeat interval: such an entry was sent again and
/// again, and no write after it ever committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_slower_to_replicate_than_a_heartbeat_commits() {
    // The election timeout well above the entry's round (15 MB fsynced on three nodes), so the
    // leader the test writes to keeps its place.
    let c = Cluster::start(Options { heartbeat_ms: 5, election_timeout_ms: 3000, ..Options::default() }).await;
    create_topic(&c, "large").await;
    let l = c.url(c.wait_leader(CONVERGE).await);
    let pad = "x".repeat(1_000_000);
    let batch: Vec<Value> = (0..15).map(|i| json!({"id": format!("l{i}"), "payload": pad})).collect();
    let r = post(&format!("{l}/topics/large/messages/batch"), &json!({"messages": batch})).await.unwrap();
    assert_eq!(r.status, 201, "{:?}", r.body);
    let mut acked: HashMap<String, u64> = r.body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|res| (res["id"].as_str().unwrap().to_string(), res["sequence"].as_u64().unwrap()))
        .collect();
    let r = post(&format!("{l}/topics/large/messages"), &json!({"id": "after", "payload": 1})).await.unwrap();
    assert_eq!(r.status, 201, "{:?}", r.body);
    acked.insert("after".into(), r.body["sequence"].as_u64().unwrap());
    assert_converged(&c, "large", &acked).await;
}

/// A batch without ids whose entry may still commit (its leader lost both followers after
/// taking it) is answered `raft_timeout` naming the ids the node generated, in order; once
/// the followers are back, retrying under those ids stores each message once. Before, the
/// answer named none, and a retry stored the batch a second time under new ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_may_still_commit_names_the_ids_the_node_generated() {
    const MESSAGES: usize = 5;
    // The leader keeps its place while the followers are gone (it counts itself cut off only
    // after two election timeouts): the batch is taken, then times out.
    let mut c = Cluster::start(Options { election_timeout_ms: 5000, ..Options::default() }).await;
    create_topic(&c, "b").await;
    let leader = c.wait_leader(CONVERGE).await;
    let l = c.url(leader);
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    for &i in &followers {
        c.kill(i);
    }
    let batch: Vec<Value> = (0..MESSAGES).map(|i| json!({"payload": i})).collect();
    let r = post(&format!("{l}/topics/b/messages/batch"), &json!({"messages": batch})).await.unwrap();
    assert!(r.status == 504 || r.status == 500, "{r:?}");
    let ids: Vec<String> = serde_json::from_value(r.body["ids"].clone()).expect("the batch's ids named");
    assert_eq!(r.body["details"]["ids"], r.body["ids"]);
    assert_eq!(ids.iter().collect::<std::collections::BTreeSet<_>>().len(), MESSAGES, "{ids:?}");

    for &i in &followers {
        c.restart(i);
    }
    let l = c.url(c.wait_leader(CONVERGE).await);
    let retry: Vec<Value> = ids.iter().enumerate().map(|(i, id)| json!({"id": id, "payload": i})).collect();
    let r = wait_until("the retried batch acknowledged", CONVERGE, || async {
        let r = post(&format!("{l}/topics/b/messages/batch"), &json!({"messages": retry})).await.ok()?;
        (r.status == 201).then_some(r)
    })
    .await;
    let acked: HashMap<String, u64> = r.body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|res| {
            let sequence = res.get("sequence").or(res.get("existing_sequence")).and_then(Value::as_u64).unwrap();
            (res["id"].as_str().unwrap().to_string(), sequence)
        })
        .collect();
    assert_eq!(acked.len(), MESSAGES);
    let log = assert_converged(&c, "b", &acked).await;
    assert_eq!(log.len(), MESSAGES, "each message stored once: {log:?}");
}

/// A one-node cluster that created a topic and was stopped with SIGTERM, and its data dir.
async fn stopped_single_node() -> (Cluster, std::path::PathBuf) {
    let mut c = Cluster::start(Options { nodes: 1, ..Default::default() }).await;
    create_topic(&c, "t").await;
    let data_dir = c.nodes[0].data_dir.clone();
    let c = tokio::task::spawn_blocking(move || {
        assert_eq!(c.terminate(0), Some(0));
        c
    })
    .await
    .unwrap();
    (c, data_dir)
}

/// Runs the node with `args` on `data_dir`, expecting it to refuse the start with exit code 1:
/// its stderr, or a failure if it is still running after 30 s (killed, so the test ends).
async fn refused_start(args: &[&str], data_dir: &std::path::Path) -> String {
    use std::process::{Command, Stdio};
    let child = Command::new(pubsub_tests::node_binary())
        .args(args)
        .arg("--data-dir")
        .arg(data_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the node runs");
    let pid = child.id();
    let waited = tokio::task::spawn_blocking(move || child.wait_with_output());
    let out = match tokio::time::timeout(Duration::from_secs(30), waited).await {
        Ok(out) => out.unwrap().expect("the node's output"),
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            panic!("the node started on a data dir it should have refused (killed after 30 s)");
        }
    };
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    stderr
}

/// A data dir is its node's: started under another `--id` (a swapped volume, a typo), the
/// node refuses it with one line that says whose it is, and exits 1 without touching it.
#[tokio::test]
async fn a_data_dir_given_to_another_node_id_is_refused() {
    let (c, data_dir) = stopped_single_node().await;
    let stderr = refused_start(&["--id", "2", "--listen", "127.0.0.1:0", "--peers", "2=127.0.0.1:1"], &data_dir).await;
    assert!(stderr.contains("it holds node 1's state, not node 2's"), "{stderr}");
    drop(c);
}

/// `--peers` names a cluster only when it is first started: a data dir that holds a cluster of
/// other voters (a single node's `./data/node-1` reused for a three-node cluster, say) refuses
/// the start with one line naming both, instead of running the old cluster while the operator
/// believes the new one formed; the same voters start again.
#[tokio::test]
async fn a_data_dir_of_a_cluster_with_other_voters_is_refused() {
    let (mut c, data_dir) = stopped_single_node().await;
    let ports = pubsub_tests::free_ports(3);
    let peers = format!("1=127.0.0.1:{},2=127.0.0.1:{},3=127.0.0.1:{}", ports[0], ports[1], ports[2]);
    let listen = format!("127.0.0.1:{}", ports[0]);
    let stderr = refused_start(&["--id", "1", "--listen", &listen, "--peers", &peers], &data_dir).await;
    assert!(
        stderr.contains("holds a cluster whose voters are node-1, but --peers names node-1, node-2, node-3"),
        "{stderr}"
    );
    // Untouched: the node it belongs to starts on it again.
    c.restart(0);
    create_topic(&c, "u").await;
    drop(c);
}

/// A node process a test started itself (by default a single-node cluster of its own); killed
/// when dropped.
struct Stranger(std::process::Child);

impl Stranger {
    fn start(id: u64, addr: &str, data_dir: &std::path::Path, log: &std::path::Path) -> Stranger {
        Self::start_in(id, addr, &format!("{id}={addr}"), data_dir, log)
    }

    /// Node `id` at `addr` of the cluster of `peers`.
    fn start_in(id: u64, addr: &str, peers: &str, data_dir: &std::path::Path, log: &std::path::Path) -> Stranger {
        let log = std::fs::File::options().create(true).append(true).open(log).unwrap();
        let child = std::process::Command::new(pubsub_tests::node_binary())
            .args(["--id", &id.to_string(), "--listen", addr, "--peers", peers])
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--cluster-secret", "test-secret"])
            .env("RUST_LOG", "info,openraft=warn")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn pubsub-node");
        Stranger(child)
    }

    /// Its cluster id, once it leads and has applied one.
    async fn cluster_id(addr: &str) -> String {
        wait_until("the stranger leads and has a cluster id", CONVERGE, || async {
            let info = get(&format!("http://{addr}/cluster")).await.ok()?.body;
            (info["role"] == "leader").then_some(())?;
            Some(info["cluster_id"].as_str()?.to_string())
        })
        .await
    }
}

impl Drop for Stranger {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A peer address that comes to point at a node of another cluster (an address reused after
/// our node went away; node ids 1–3 are everyone's) must not let our leader rewrite that
/// node's log, nor that node disturb ours: it refuses our leader's connection (403
/// `wrong_cluster`) and keeps leading its own cluster with its own messages, and ours goes on
/// with two of three. (Without the check the stranger stopped serving here.)
#[tokio::test]
async fn a_node_of_another_cluster_at_a_peer_address_refuses_our_leader() {
    let mut c = Cluster::start(Options::default()).await;
    let ours = wait_until("one cluster id on every node", CONVERGE, || async {
        let mut ids = std::collections::BTreeSet::new();
        for i in 0..3 {
            ids.insert(c.cluster_info(i).await?["cluster_id"].as_str()?.to_string());
        }
        (ids.len() == 1).then(|| ids.pop_first().unwrap())
    })
    .await;
    let leader = c.wait_leader(CONVERGE).await;
    let victim = (0..3).find(|&i| i != leader).unwrap();
    let (id, addr) = (c.nodes[victim].id, c.nodes[victim].addr.clone());
    let (data_dir, log) = (c.dir().join("stranger"), c.dir().join("stranger.log"));

    // The stranger gets its cluster id and a message of its own elsewhere first...
    let elsewhere = format!("127.0.0.1:{}", pubsub_tests::free_ports(1)[0]);
    let stranger = Stranger::start(id, &elsewhere, &data_dir, &log);
    let theirs = Stranger::cluster_id(&elsewhere).await;
    assert_ne!(theirs, ours);
    post_raw(&format!("http://{elsewhere}/topics/theirs"), "").await.unwrap();
    let r = post(&format!("http://{elsewhere}/topics/theirs/messages"), &json!({"payload": 1})).await.unwrap();
    assert_eq!(r.status, 201, "{r:?}");
    drop(stranger);
    // ...then takes the address of our node that went away.
    c.kill(victim);
    let _stranger = Stranger::start(id, &addr, &data_dir, &log);
    assert_eq!(Stranger::cluster_id(&addr).await, theirs);
    wait_until("the stranger refusing our leader", CONVERGE, || async {
        std::fs::read_to_string(&log).ok()?.contains(&format!("belongs to cluster {theirs}, not {ours}")).then_some(())
    })
    .await;

    create_topic(&c, "ours").await;
    let l = c.url(c.wait_leader(CONVERGE).await);
    let r = post(&format!("{l}/topics/ours/messages"), &json!({"payload": 2})).await.unwrap();
    assert_eq!(r.status, 201, "ours goes on with two of three: {r:?}\n{}", c.logs());
    let info = get(&format!("http://{addr}/cluster")).await.unwrap().body;
    assert_eq!((&info["role"], &info["cluster_id"]), (&json!("leader"), &json!(theirs)));
    let topics = get(&format!("http://{addr}/topics")).await.unwrap().body;
    assert_eq!(topics["topics"].as_array().unwrap().len(), 1, "{topics}");
    assert_eq!((&topics["topics"][0]["name"], &topics["topics"][0]["message_count"]), (&json!("theirs"), &json!(1)));
}

/// A new cluster whose peer list names a node of another cluster (node 3's address taken by a
/// stranger): its nodes dial the stranger before they know their own cluster's id. The
/// stranger, which knows its own, refuses a peer that presents none, and once our id is known
/// our nodes dial again presenting it, refused as another cluster's; the stranger keeps its
/// own log and leadership. Before, it took the anonymous connection: it voted for our node 1,
/// took it as its leader, and its Raft core failed (an index out of bounds in openraft).
#[tokio::test]
async fn a_connection_dialed_before_the_cluster_id_was_known_presents_it_once_known() {
    let dir = tempfile::tempdir().unwrap();
    let ports = pubsub_tests::free_ports(3);
    let addr = |i: usize| format!("127.0.0.1:{}", ports[i]);
    let stranger_log = dir.path().join("stranger.log");
    let _stranger = Stranger::start(3, &addr(2), &dir.path().join("stranger"), &stranger_log);
    let theirs = Stranger::cluster_id(&addr(2)).await;
    post_raw(&format!("http://{}/topics/theirs", addr(2)), "").await.unwrap();

    let peers = format!("1={},2={},3={}", addr(0), addr(1), addr(2));
    let _ours: Vec<Stranger> = (0..2)
        .map(|i| {
            let (data_dir, log) =
                (dir.path().join(format!("node-{}", i + 1)), dir.path().join(format!("node-{}.log", i + 1)));
            Stranger::start_in(i as u64 + 1, &addr(i), &peers, &data_dir, &log)
        })
        .collect();
    let ours = wait_until("our cluster's id", CONVERGE, || async {
        let info = get(&format!("http://{}/cluster", addr(0))).await.ok()?.body;
        info["cluster_id"].as_str().filter(|id| *id != theirs).map(String::from)
    })
    .await;
    wait_until("the stranger refusing our nodes", CONVERGE, || async {
        let log = std::fs::read_to_string(&stranger_log).ok()?;
        log.contains(&format!("belongs to cluster {theirs}, not {ours}")).then_some(())
    })
    .await;
    let info = get(&format!("http://{}/cluster", addr(2))).await.unwrap().body;
    assert_eq!((&info["role"], &info["cluster_id"]), (&json!("leader"), &json!(theirs)));
    let topics = get(&format!("http://{}/topics", addr(2))).await.unwrap().body;
    assert_eq!(topics["topics"][0]["name"], json!("theirs"), "{topics}");
    let log = std::fs::read_to_string(&stranger_log).unwrap();
    assert!(!log.contains("leader=Some(1)"), "the stranger took our node as its leader:\n{log}");
}

/// A peer cannot make a node hold more than `RAFT_INBOUND_BYTES_MAX` of requests at once:
/// past it the node stops reading (the peer meets TCP backpressure) until some are answered,
/// and then reads on. Forwarded writes to a leader whose followers are gone wait for a quorum
/// until their deadline, holding their bytes all that time.
#[tokio::test]
async fn a_node_holds_at_most_its_raft_inbound_budget_of_requests() {
    use futures_util::SinkExt;
    use pubsub_node::limits::RAFT_INBOUND_BYTES_MAX;
    use pubsub_node::raft::codec::{encode, Frame, RpcRequest};
    use raft_store::command::NewMessage;

    const PAYLOAD_BYTES: usize = 1 << 20;
    const CONNECTIONS: usize = 2;
    // Half again the budget, over two connections (each also caps its requests at work).
    const FRAMES_EACH: usize = RAFT_INBOUND_BYTES_MAX * 3 / 2 / PAYLOAD_BYTES / CONNECTIONS;

    let mut c = Cluster::start(Options::default()).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    for i in (0..3).filter(|&i| i != leader) {
        c.kill(i);
    }
    let url = c.url(leader);
    let payload = bytes::Bytes::from(format!("\"{}\"", "x".repeat(PAYLOAD_BYTES)));
    let mut senders = Vec::new();
    for connection in 0..CONNECTIONS {
        let ws = c.raft_peer(leader).await;
        let payload = payload.clone();
        senders.push(tokio::spawn(async move {
            let (mut tx, rx) = ws.split();
            // Answers are read and dropped, so the node's writes never stall on us.
            let drain = tokio::spawn(rx.for_each(|_| async {}));
            for n in 0..FRAMES_EACH {
                let id = (connection * FRAMES_EACH + n) as u64;
                let message = NewMessage { id: id.to_string(), timestamp: 0, payload: payload.clone() };
                let req = raft_store::Request::Publish { topic: "t".into(), messages: vec![message], now_ms: 0 };
                let frame = encode(&Frame { id, body: RpcRequest::Forward { req } }).unwrap();
                tx.send(Message::Binary(frame.into())).await.expect("the node reads on");
            }
            drain.abort();
        }));
    }

    let held = || pubsub_tests::http::metric(&url, "pubsub_raft_inbound_bytes");
    let most = std::sync::atomic::AtomicUsize::new(0);
    let (most_ref, senders_ref, held) = (&most, &senders, &held);
    wait_until("every request read", Duration::from_secs(60), move || async move {
        if let Some(bytes) = held().await.map(|bytes| bytes as usize) {
            assert!(bytes <= RAFT_INBOUND_BYTES_MAX, "{bytes} bytes of requests held");
            most_ref.fetch_max(bytes, std::sync::atomic::Ordering::Relaxed);
        }
        senders_ref.iter().all(|s| s.is_finished()).then_some(())
    })
    .await;
    for sender in senders {
        sender.await.unwrap();
    }
    let most = most.into_inner();
    assert!(most >= RAFT_INBOUND_BYTES_MAX - 4 * PAYLOAD_BYTES, "the budget filled: at most {most} bytes were held");
}

/// A node started under a low soft open-files limit raises it to the hard limit, as Go's
/// runtime does for NATS and etcd: each subscription and connection is a file, and a soft
/// limit of 1,024 (a common default) would refuse connections from the 1,000th on.
#[tokio::test]
async fn a_node_raises_its_open_files_limit_to_the_hard_one() {
    use std::process::{Command, Stdio};
    let port = pubsub_tests::free_ports(1)[0];
    let dir = tempfile::tempdir().unwrap();
    let node = Stranger(
        Command::new("sh")
            .arg("-c")
            .arg(format!("ulimit -Sn 256 && exec \"$0\" --listen 127.0.0.1:{port} --data-dir \"$1\""))
            .arg(pubsub_tests::node_binary())
            .arg(dir.path().join("node-1"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the node runs"),
    );
    let url = format!("http://127.0.0.1:{port}");
    wait_until("the node answers", CONVERGE, || async {
        get(&format!("{url}/health")).await.ok().filter(|r| r.status == 200)
    })
    .await;
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", node.0.id())).unwrap();
    drop(node);
    let line = limits.lines().find(|l| l.starts_with("Max open files")).expect("an open-files line");
    let values: Vec<&str> = line.split_whitespace().skip(3).take(2).collect();
    let (soft, hard) = (values[0], values[1]);
    let expected =
        if hard == "unlimited" { pubsub_node::limits::OPEN_FILES_UNLIMITED_CAP.to_string() } else { hard.to_string() };
    assert_eq!(soft, expected, "{line}");
    assert_ne!(soft, "256", "{line}");
}

/// How long a follower that has room again may take to withdraw its claim: a report interval
/// and a commit, well under the 30 s after which a claim lapses of its own.
const CLAIM_WITHDRAWN_MAX: Duration = Duration::from_secs(10);

/// A follower whose data dir is short of room (here: a reserve past any disk) tells the
/// cluster through the log, and the leader then refuses publishes `507 insufficient_storage`
/// naming it, storing nothing, while reads go on; started again with room, it withdraws its
/// claim and publishes are taken at the next sequence.
/// One message published to topic `t` through the node leading now ([`send_to_leader`]), so
/// that a leader change while a node restarts does not fail a test about something else.
async fn publish_one(c: &Cluster) -> pubsub_tests::http::Reply {
    let leader = c.url(c.wait_leader(CONVERGE).await);
    let body = json!({"payload": 1});
    send_to_leader(leader, |url| pubsub_tests::http::client().post(format!("{url}/topics/t/messages")).json(&body))
        .await
}

/// Restarts node `i` with a free-space reserve no disk has: it claims to be short of room.
fn restart_short_of_disk(c: &mut Cluster, i: usize) {
    c.kill(i);
    c.nodes[i].args = vec!["--min-free-bytes".into(), (u64::MAX / 2).to_string()];
    c.restart(i);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_short_of_disk_stops_the_leader_taking_publishes_until_it_has_room() {
    let mut c = Cluster::start(Options::default()).await;
    create_topic(&c, "t").await;
    let leader = c.wait_leader(CONVERGE).await;
    let follower = (leader + 1) % 3;
    assert_eq!(publish_one(&c).await.status, 201);
    restart_short_of_disk(&mut c, follower);

    let refused = wait_until("a publish refused for the follower's disk", CONVERGE, || async {
        let reply = publish_one(&c).await;
        (reply.status != 201).then_some(reply)
    })
    .await;
    assert_eq!((refused.status, &refused.body["error"]), (507, &json!("insufficient_storage")), "{:?}", refused.body);
    let short_node = json!([format!("node-{}", follower + 1)]);
    assert_eq!(refused.body["details"]["nodes"], short_node, "{:?}", refused.body);
    let l = c.url(c.wait_leader(CONVERGE).await);
    let (_, info) = pubsub_tests::http::get_json(&format!("{l}/cluster")).await.unwrap();
    assert_eq!(info["nodes_short_of_disk"], short_node, "{info}");
    // Publishes taken before the follower's claim was applied count; the refused ones do not.
    let sequence = || async {
        let l = c.url(c.wait_leader(CONVERGE).await);
        let (_, topic) = pubsub_tests::http::get_json(&format!("{l}/topics/t")).await.unwrap();
        topic["current_sequence"].as_u64().expect("current_sequence")
    };
    let stored = sequence().await;
    let batch = send_to_leader(c.url(c.wait_leader(CONVERGE).await), |url| {
        pubsub_tests::http::client()
            .post(format!("{url}/topics/t/messages/batch"))
            .json(&json!({"messages": [{"payload": 2}]}))
    })
    .await;
    assert_eq!(batch.status, 507, "{:?}", batch.body);
    assert_eq!(sequence().await, stored);

    c.kill(follower);
    c.nodes[follower].args.clear();
    c.restart(follower);
    let taken = wait_until("a publish taken once the follower has room", CLAIM_WITHDRAWN_MAX, || async {
        let reply = publish_one(&c).await;
        (reply.status != 507).then_some(reply)
    })
    .await;
    assert_eq!((taken.status, taken.body["sequence"].as_u64()), (201, Some(stored + 1)), "{:?}", taken.body);
}

/// A follower short of disk room, removed from the cluster while it goes on running (it never
/// learns of its removal and goes on renewing its claim), no longer stops the leader taking
/// publishes: only members' claims count, and the leader takes no claim from a non-member.
/// Before, its renewals kept the claim fresh and every publish was refused until it stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_node_left_running_short_of_disk_no_longer_refuses_publishes() {
    use pubsub_node::limits::{DISK_ROOM_REPORT_INTERVAL, DISK_SHORT_CLAIM_RENEW};
    let mut c = Cluster::start(Options::default()).await;
    create_topic(&c, "t").await;
    let leader = c.wait_leader(CONVERGE).await;
    let follower = (leader + 1) % 3;
    restart_short_of_disk(&mut c, follower);
    wait_until("a publish refused for the follower's disk", CONVERGE, || async {
        (publish_one(&c).await.status == 507).then_some(())
    })
    .await;

    let removed = change_members(&c, |url| {
        pubsub_tests::http::client().delete(format!("{url}/cluster/members/{}", c.nodes[follower].id))
    })
    .await;
    assert_eq!(removed.status, 200, "{removed:?}");
    assert!(c.running(follower));
    let taken = wait_until("a publish taken once the follower is removed", CLAIM_WITHDRAWN_MAX, || async {
        let reply = publish_one(&c).await;
        (reply.status != 507).then_some(reply)
    })
    .await;
    assert_eq!(taken.status, 201, "{taken:?}");
    // Past its next renewals, publishes are still taken.
    let past_renewals = tokio::time::Instant::now() + DISK_SHORT_CLAIM_RENEW + DISK_ROOM_REPORT_INTERVAL * 3;
    while tokio::time::Instant::now() < past_renewals {
        let reply = publish_one(&c).await;
        assert_eq!(reply.status, 201, "{reply:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A small file system of a node's own (a tmpfs), so that a test can fill a disk for real
/// without filling the machine's; unmounted when dropped (a test process killed outright
/// leaves it mounted, in memory, until `umount`).
struct SmallDisk {
    mount: std::path::PathBuf,
}

/// The size of each node's small disk (room for everything the test publishes), and the room
/// left on it when a test fills it.
const SMALL_DISK_BYTES: u64 = 512 << 20;
const SMALL_DISK_ROOM: u64 = 32 << 20;
/// Each message's padding under that load: large, so that the room fills within seconds (and
/// records this large ask for no further preallocated spare segment, 64 MiB, once the log has
/// moved onto the one made at start).
const FILLING_PAD_BYTES: usize = 96 << 10;
/// How long the load may take to fill the room.
const DISK_FILLED_MAX: Duration = Duration::from_secs(120);

impl SmallDisk {
    /// Mounts a small disk beside node `i`'s data dir and moves the (stopped) node's data onto
    /// it. `None`, with a note, where this process may not mount (it lacks CAP_SYS_ADMIN: not
    /// root, or root in a container); a process that may and cannot is a failure.
    fn move_node_onto(c: &mut Cluster, i: usize) -> Option<SmallDisk> {
        let mount = c.dir().join(format!("disk-{}", c.nodes[i].id));
        std::fs::create_dir(&mount).unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={SMALL_DISK_BYTES}"), "tmpfs"])
            .arg(&mount)
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            assert!(!may_mount(), "could not mount a tmpfs at {}", mount.display());
            eprintln!("note: no right to mount (CAP_SYS_ADMIN), so no small disk: the full-disk test is skipped");
            return None;
        }
        let disk = SmallDisk { mount };
        let data_dir = disk.mount.join("data");
        let moved = std::process::Command::new("cp").arg("-a").arg(&c.nodes[i].data_dir).arg(&data_dir).status();
        assert!(moved.unwrap().success(), "copying node {i}'s data onto its small disk");
        std::fs::remove_dir_all(&c.nodes[i].data_dir).unwrap();
        c.nodes[i].data_dir = data_dir;
        Some(disk)
    }

    fn ballast(&self) -> std::path::PathBuf {
        self.mount.join("ballast")
    }

    /// Fills the disk with a file beside the data dir until [`SMALL_DISK_ROOM`] is left.
    fn fill(&self) {
        let available = raft_store::available_bytes(&self.mount).expect("statvfs of the small disk");
        let ballast = available.checked_sub(SMALL_DISK_ROOM).expect("the small disk has its room to fill");
        assert!(
            pubsub_tests::allocate(&self.ballast(), ballast),
            "fallocate of {ballast} bytes on the small disk ({available} available)"
        );
    }

    /// Gives the disk its room back.
    fn empty(&self) {
        std::fs::remove_file(self.ballast()).unwrap();
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        // Lazily: a node still running on it lets go when it is killed.
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.mount).status();
    }
}

/// Whether this process may mount file systems: CAP_SYS_ADMIN in its effective set.
fn may_mount() -> bool {
    const CAP_SYS_ADMIN: u32 = 21;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let effective = status.lines().find_map(|line| line.strip_prefix("CapEff:"));
    effective
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps >> CAP_SYS_ADMIN & 1 == 1)
}

/// Waits until node `i`, whose disk is full, stops on its own; checks that it exits 1 and
/// names the cause in what it logged past byte `log_from` of its log.
async fn wait_stopped_on_full_disk(c: &mut Cluster, i: usize, log_from: usize) {
    let deadline = tokio::time::Instant::now() + DISK_FILLED_MAX;
    let code = loop {
        if let Some(code) = c.exited(i) {
            break code;
        }
        assert!(tokio::time::Instant::now() < deadline, "node {i} did not stop on its full disk\n{}", c.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(code, Some(1), "node {i}'s exit code\n{}", c.logs());
    // Its last words, where a supervisor's log shows them: the cause and what to do.
    let log = c.log(i);
    let last = log
        .get(log_from..)
        .unwrap_or_default()
        .lines()
        .rev()
        .find(|line| line.starts_with("error: "))
        .unwrap_or_default();
    assert!(last.contains("No space left on device"), "node {i} names the full disk: {last}\n{}", c.logs());
    assert!(last.contains("give it room"), "node {i} says what to do: {last}");
}

/// Starts node `i` again on its still full disk (as a supervisor would), which it leaves again
/// at once the same way; then gives it its room back, starts it again on the same data and
/// waits until it has caught up with the leader.
async fn restart_full_then_with_room(c: &mut Cluster, disk: &SmallDisk, i: usize) {
    let log_from = c.log(i).len();
    c.restart(i);
    wait_stopped_on_full_disk(c, i, log_from).await;
    disk.empty();
    c.restart(i);
    let leader = c.url(c.wait_leader(CONVERGE).await);
    let (_, topic) = pubsub_tests::http::get_json(&format!("{leader}/topics/t")).await.unwrap();
    let sequence = topic["current_sequence"].as_u64().unwrap();
    pubsub_tests::wait_applied_within(&c.url(i), "t", sequence, CONVERGE).await;
}

/// Fills node `i`'s disk under the running load and waits until it stops; checks that the
/// others take 100 more publishes meanwhile, then starts it again, on the full disk and with
/// room ([`restart_full_then_with_room`]).
async fn fill_and_recover(c: &mut Cluster, disk: &SmallDisk, load: &Load, i: usize) {
    let log_from = c.log(i).len();
    disk.fill();
    wait_stopped_on_full_disk(c, i, log_from).await;
    wait_acks(&load.acked, load.acked_count() + 100).await;
    restart_full_then_with_room(c, disk, i).await;
}

/// Disks that fill for real (no reserve, so the log and RocksDB meet ENOSPC themselves): the
/// leader whose disk fills stops with exit code 1, naming the cause, and the other two elect a
/// leader and go on taking publishes; started again on the full disk, it stops again the same
/// way; given room and started again on the same data, it reopens from what it had fsynced and
/// catches up. Then the same of a follower. No acknowledged publish is lost (README, "A full
/// disk").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_and_then_a_follower_whose_disks_fill_stop_and_given_room_catch_up_losing_nothing() {
    let mut c =
        Cluster::start(Options { extra_args: vec!["--min-free-bytes".into(), "0".into()], ..Options::default() }).await;
    create_topic(&c, "t").await;
    c.kill_all();
    let mut disks = Vec::new();
    for i in 0..3 {
        match SmallDisk::move_node_onto(&mut c, i) {
            Some(disk) => disks.push(disk),
            None => return,
        }
    }
    c.restart_all();
    let load = spawn_load_padded(&c, "t", 4, FILLING_PAD_BYTES);
    wait_acks(&load.acked, 20).await;

    let leader = c.wait_leader(CONVERGE).await;
    fill_and_recover(&mut c, &disks[leader], &load, leader).await;
    let now_leading = c.wait_leader(CONVERGE).await;
    let follower = (0..3).find(|&i| i != now_leading && i != leader).unwrap();
    fill_and_recover(&mut c, &disks[follower], &load, follower).await;

    let acked = load.finish().await;
    assert_converged(&c, "t", &acked).await;
}

/// Sends a membership change with the cluster's secret through [`send_to_leader`] (a `503`
/// there also means another change is in progress).
async fn change_members(c: &Cluster, request: impl Fn(&str) -> reqwest::RequestBuilder) -> pubsub_tests::http::Reply {
    let first = c.url((0..c.nodes.len()).find(|&i| c.running(i)).expect("a running node"));
    send_to_leader(first, |url| {
        let builder = request(url).timeout(Duration::from_secs(90));
        match c.secret() {
            Some(secret) => builder.bearer_auth(secret),
            None => builder,
        }
    })
    .await
}

/// Sends `request(node url)` to node `first`, following redirects to the leader and sending it
/// again while a node answers `503` (no leader known), up to [`CONVERGE`]: the leader's own
/// answer.
async fn send_to_leader(first: String, request: impl Fn(&str) -> reqwest::RequestBuilder) -> pubsub_tests::http::Reply {
    let mut target = first;
    let deadline = tokio::time::Instant::now() + CONVERGE;
    loop {
        let r = pubsub_tests::http::send(request(&target)).await.expect("the node answers");
        match r.status {
            307 => target = format!("http://{}", r.body["leader_address"].as_str().expect("a leader named")),
            503 if tokio::time::Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
            _ => return r,
        }
    }
}

/// A voter is not removed while another is down: the two left could not commit the change (a
/// majority of each configuration must agree), and the cluster would take no writes, then have
/// no leader once the removed node stopped. The lost node itself is removed, and writes go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voter_is_not_removed_while_another_is_down_but_the_lost_one_is() {
    let mut c = Cluster::start(Options::default()).await;
    create_topic(&c, "t").await;
    let leader = c.wait_leader(CONVERGE).await;
    let (kept, lost) = ((leader + 1) % 3, (leader + 2) % 3);
    // The leader's `/cluster` shows how each member answers it and how far behind it is; a
    // follower's shows nothing of it.
    let ids: Vec<u64> = c.nodes.iter().map(|n| n.id).collect();
    let member = |info: &Value, i: usize| {
        let name = format!("node-{}", ids[i]);
        let members = info["members"].as_array().expect("members listed");
        members.iter().find(|m| m["node_id"] == name.as_str()).expect("a member").clone()
    };
    let caught_up = wait_until("every member caught up with the leader", CONVERGE, || async {
        let info = c.cluster_info(leader).await?;
        (0..3).all(|i| member(&info, i)["lag"] == 0).then_some(info)
    })
    .await;
    let last_log_index = member(&caught_up, leader)["matched_index"].as_u64().expect("the leader's own index");
    for i in 0..3 {
        let m = member(&caught_up, i);
        assert_eq!((&m["reachable"], m["matched_index"].as_u64()), (&json!(true), Some(last_log_index)), "{m}");
    }
    let on_follower = member(&c.cluster_info(kept).await.expect("the follower answers"), kept);
    assert_eq!((&on_follower["reachable"], &on_follower["lag"]), (&Value::Null, &Value::Null), "{on_follower}");

    c.kill(lost);
    // The leader counts a voter as down once it has not answered for an election timeout.
    wait_until("the leader sees the lost node not answering", CONVERGE, || async {
        (member(&c.cluster_info(leader).await?, lost)["reachable"] == false).then_some(())
    })
    .await;
    let remove = |i: usize| {
        let mut builder = pubsub_tests::http::client()
            .delete(format!("{}/cluster/members/{}", c.url(leader), c.nodes[i].id))
            .timeout(Duration::from_secs(30));
        if let Some(secret) = c.secret() {
            builder = builder.bearer_auth(secret);
        }
        pubsub_tests::http::send(builder)
    };
    let refused = remove(kept).await.expect("the leader answers");
    assert_eq!((refused.status, &refused.body["error"]), (503, &json!("unavailable")), "{refused:?}");
    let message = refused.body["message"].as_str().unwrap_or_default();
    assert!(message.contains(&format!("node-{}", c.nodes[lost].id)), "{message}");
    let removed = remove(lost).await.expect("the leader answers");
    assert_eq!(removed.status, 200, "{removed:?}");
    assert_eq!(roles(&removed.body).len(), 2, "{removed:?}");
    publish_retrying(&c.urls(), "t", "after", &json!(1), CONVERGE).await.expect("acked by the two left");
}

/// `node-N` → role, from a membership answer or `/cluster`.
fn roles(body: &Value) -> HashMap<String, String> {
    let members = body["members"].as_array().expect("members listed");
    members.iter().map(|m| (m["node_id"].as_str().unwrap().into(), m["role"].as_str().unwrap().into())).collect()
}

/// Membership changes through `/cluster/members` while publishes go on: a node started with
/// `--join` does not start a cluster of its own, is added (it catches up, then votes), then the
/// leader removes itself and the others elect a new leader among them. No acknowledged publish
/// is lost, every member serves the same log, and a node of the first membership starts again
/// with its now stale `--peers` (warned about, not refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_is_added_and_the_leader_removed_under_load_without_losing_a_publish() {
    let mut c = Cluster::start(Options::default()).await;
    create_topic(&c, "t").await;
    let load = spawn_load(&c, "t", 2);
    wait_acks(&load.acked, 50).await;

    let new = c.start_joining_node();
    let (new_id, new_addr) = (c.nodes[new].id, c.nodes[new].addr.clone());
    let info = wait_until("the joining node answers", CONVERGE, || c.cluster_info(new)).await;
    assert!(info["cluster_id"].is_null() && info["leader_id"].is_null(), "it formed a cluster of its own: {info}");

    let add = |id: u64, address: &str| {
        let body = json!({"id": id, "address": address});
        move |url: &str| pubsub_tests::http::client().post(format!("{url}/cluster/members")).json(&body)
    };
    let unauthorized = pubsub_tests::http::send(add(new_id, &new_addr)(&c.url(0))).await.unwrap();
    assert_eq!(unauthorized.status, 401, "{unauthorized:?}");
    let added = change_members(&c, add(new_id, &new_addr)).await;
    assert_eq!(added.status, 200, "{added:?}");
    assert_eq!(added.body["changed"], true);
    let expected: HashMap<String, String> =
        (1..=new_id).map(|id| (format!("node-{id}"), "voter".to_string())).collect();
    assert_eq!(roles(&added.body), expected);
    let again = change_members(&c, add(new_id, &new_addr)).await;
    assert_eq!((again.status, &again.body["changed"]), (200, &json!(false)), "{again:?}");
    let taken = change_members(&c, add(new_id + 1, &new_addr)).await;
    assert_eq!((taken.status, &taken.body["error"]), (409, &json!("member_conflict")), "{taken:?}");
    let moved = change_members(&c, add(new_id, "127.0.0.1:9")).await;
    assert_eq!((moved.status, &moved.body["error"]), (409, &json!("member_conflict")), "{moved:?}");

    // The new node follows the leader and serves what was published before it joined.
    let before = load.acked_count();
    wait_acks(&load.acked, before + 50).await;
    let leader = c.wait_leader(CONVERGE).await;
    let leader_name = format!("node-{}", c.nodes[leader].id);
    // Three of four acknowledge each entry: the new node may still be receiving the final
    // configuration.
    wait_until("the new node holds the final membership", CONVERGE, || async {
        (roles(&c.cluster_info(new).await?) == expected).then_some(())
    })
    .await;
    // The leader removes itself below (the new node too, should an election under load have
    // made it the leader); another member watches for the next leader.
    let witness = (0..c.nodes.len()).find(|&i| i != leader).expect("another member");

    let removed = change_members(&c, |url| {
        pubsub_tests::http::client().delete(format!("{url}/cluster/members/{}", c.nodes[leader].id))
    })
    .await;
    assert_eq!(removed.status, 200, "{removed:?}");
    let remaining: HashMap<String, String> = expected.into_iter().filter(|(name, _)| *name != leader_name).collect();
    assert_eq!(roles(&removed.body), remaining, "{removed:?}");
    wait_until("a leader among the remaining members", CONVERGE, || async {
        let leader = c.cluster_info(witness).await?["leader_id"].as_str()?.to_string();
        (leader != leader_name).then_some(())
    })
    .await;
    c.terminate(leader);
    let before = load.acked_count();
    wait_acks(&load.acked, before + 50).await;
    let acked = load.finish().await;
    assert_converged(&c, "t", &acked).await;

    // A node of the first membership, started again with the --peers it had.
    let stale = (0..3).find(|&i| i != leader).expect("a first member left");
    c.terminate(stale);
    c.restart(stale);
    wait_until("the node with stale --peers is ready", CONVERGE, || async {
        (get(&format!("{}/ready", c.url(stale))).await.ok()?.status == 200).then_some(())
    })
    .await;
    let mut acked = acked;
    publish_each(&c, "after-", 0..5, &mut acked).await;
    assert_converged(&c, "t", &acked).await;
}

/// Two of three disks lost for good: the survivor, started once with `--force-new-cluster`,
/// becomes the only voter of its cluster and leader, with every publish it held (all of them:
/// it had caught up), and takes new publishes at the next sequence. Started again with the flag
/// still set, it refuses to start (exit 1) rather than cut a cluster grown again back to itself;
/// without it, it starts, and a node added with `--join` catches up with everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_survivor_of_two_lost_disks_is_forced_into_a_new_cluster_and_grown_again() {
    let mut c = Cluster::start(Options::default()).await;
    create_topic(&c, "t").await;
    let mut acked = HashMap::new();
    publish_each(&c, "m", 0..20, &mut acked).await;
    assert_converged(&c, "t", &acked).await;
    let survivor = (c.wait_leader(CONVERGE).await + 1) % 3;
    for lost in (0..3).filter(|&i| i != survivor) {
        c.kill(lost);
        std::fs::remove_dir_all(&c.nodes[lost].data_dir).expect("remove a lost node's data dir");
    }
    c.kill(survivor);
    c.nodes[survivor].args = vec!["--force-new-cluster".into()];
    c.restart(survivor);
    assert_eq!(c.wait_leader(CONVERGE).await, survivor);
    let info = c.cluster_info(survivor).await.unwrap();
    let name = format!("node-{}", c.nodes[survivor].id);
    assert_eq!(roles(&info), HashMap::from([(name.clone(), "voter".to_string())]), "{info}");
    publish_each(&c, "after-", 0..5, &mut acked).await;
    assert_eq!(acked["after-0"], 21, "{acked:?}");
    assert_converged(&c, "t", &acked).await;

    // The flag left on: refused, exit 1, nothing changed.
    c.kill(survivor);
    c.restart(survivor);
    let log = c.dir().join(format!("{name}.log"));
    wait_until("the second forced start is refused", CONVERGE, || async {
        std::fs::read_to_string(&log).ok().filter(|l| l.contains("was already made a cluster of its own")).map(|_| ())
    })
    .await;
    assert_eq!(c.terminate(survivor), Some(1));
    c.nodes[survivor].args.clear();
    c.restart(survivor);
    assert_eq!(c.wait_leader(CONVERGE).await, survivor);

    let new = c.start_joining_node();
    let address = c.nodes[new].addr.clone();
    let added = change_members(&c, |url| {
        pubsub_tests::http::client()
            .post(format!("{url}/cluster/members"))
            .json(&json!({"id": c.nodes[new].id, "address": address}))
    })
    .await;
    assert_eq!(added.status, 200, "{added:?}");
    publish_each(&c, "grown-", 0..5, &mut acked).await;
    assert_converged(&c, "t", &acked).await;
}
