//! The Rust client library and the `pubsub` CLI against real 3-node clusters: redirects and
//! the leader cache, exactly-once publishing across a leader kill, a subscription that
//! survives a leader kill and a restart of its own node, `cursor=acked`, and the CLI end to
//! end with its exit codes, a WebSocket publisher reopened across a leader kill, and a
//! subscription cut off by a node kill and then a deletion.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use pubsub_client::{AckMode, Client, Cursor, Error, Event, NewMessage, Publisher, SubscribeOptions, Subscription};
use pubsub_tests::http::get_json;
use pubsub_tests::{assert_converged, node_binary, read_all, wait_applied, wait_until, Cluster, Options};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

const CONVERGE: Duration = Duration::from_secs(30);

/// A client for a cluster under faults: a retry budget that outlasts an election on a busy
/// 2-core machine, with short steps so a new leader is found quickly.
fn patient_client(seeds: Vec<String>) -> Client {
    Client::builder(seeds)
        .attempts_max(60)
        .operation_timeout(CONVERGE)
        .backoff(Duration::from_millis(20), Duration::from_millis(500))
        .request_timeout(Duration::from_secs(8))
        .connect_timeout(Duration::from_millis(500))
        .reconnect_attempts_max(100)
        .build()
        .expect("client")
}

/// The `pubsub` binary: `PUBSUB_CLI_BIN`, else next to `pubsub-node`.
fn cli_binary() -> PathBuf {
    if let Ok(path) = std::env::var("PUBSUB_CLI_BIN") {
        return PathBuf::from(path);
    }
    let bin = node_binary().with_file_name("pubsub");
    assert!(bin.exists(), "{} not built: run `cargo build --release --bins` first", bin.display());
    bin
}

/// Every running node serves the same log, each acknowledged id exactly once at the sequence
/// the client reported (the harness's history check).
async fn assert_exactly_once(c: &Cluster, topic: &str, acked: &HashMap<String, u64>) {
    assert_converged(c, topic, acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_seeded_with_a_follower_follows_redirects_and_caches_the_leader() {
    let c = Cluster::start(Options::default()).await;
    let leader = c.wait_leader(CONVERGE).await;
    let follower = (leader + 1) % 3;
    let client = Client::new([c.url(follower)]).expect("client");

    let created = client.create_topic("orders", None).await.expect("create");
    assert!(created.created, "{created:?}");
    assert_eq!(
        client.cached_leader(),
        Some(format!("{}/", c.url(leader))),
        "the redirect named the leader and the client cached it"
    );
    let first = client.publish("orders", json!({"order_id": "ORD-1"})).await.expect("publish");
    assert_eq!((first.sequence, first.committed, first.duplicate), (Some(1), true, false));
    let second = client
        .publish_message("orders", NewMessage::new(json!({"order_id": "ORD-2"})).with_id("ord-2"), AckMode::Committed)
        .await
        .expect("publish");
    assert_eq!((second.id.as_str(), second.sequence), ("ord-2", Some(2)));

    // Publishing the same id again is the caller's mistake, not a retry: an error.
    let again = client.publish_message("orders", NewMessage::new(json!({})).with_id("ord-2"), AckMode::Committed).await;
    match again {
        Err(Error::Api(api)) => assert_eq!(api.existing_sequence(), Some(2), "{api}"),
        other => panic!("a reused id must be refused, got {other:?}"),
    }

    // `/cluster` teaches the client every peer, not only its one seed.
    client.cluster().await.expect("cluster");
    assert_eq!(client.nodes().len(), 3, "{:?}", client.nodes());
    let log = wait_until("the follower applied both", CONVERGE, || async {
        read_all(&c.url(follower), "orders").await.filter(|l| l.len() == 2)
    })
    .await;
    assert_eq!(log[1], (2, "ord-2".to_string()));
}

/// Waits until at least `n` publishes are acknowledged (publishers record them in `acked`).
async fn acks_reach(acked: &Mutex<HashMap<String, u64>>, n: usize) {
    wait_until("publishes acknowledged", CONVERGE, || async { (acked.lock().unwrap().len() >= n).then_some(()) }).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_across_a_leader_kill_publish_each_acked_message_exactly_once() {
    let mut c = Cluster::start(Options::default()).await;
    let client = patient_client(c.urls());
    client.create_topic("t", None).await.expect("create");

    let acked: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let duplicates = Arc::new(Mutex::new(0usize));
    let failed: Arc<Mutex<Vec<String>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let publishers: Vec<_> = (0..8)
        .map(|p| {
            let (client, acked, duplicates, failed, stop) =
                (client.clone(), acked.clone(), duplicates.clone(), failed.clone(), stop.clone());
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let id = format!("p{p}-{n}");
                    let message = NewMessage::new(json!({"p": p, "n": n})).with_id(&id);
                    match client.publish_message("t", message, AckMode::Committed).await {
                        Ok(ack) => {
                            let seq = ack.sequence.expect("a committed ack has a sequence");
                            assert_eq!(ack.id, id);
                            if ack.duplicate {
                                *duplicates.lock().unwrap() += 1;
                            }
                            acked.lock().unwrap().insert(id, seq);
                        }
                        Err(e) => failed.lock().unwrap().push(format!("{id}: {e}")),
                    }
                    n += 1;
                }
            })
        })
        .collect();
    acks_reach(&acked, 50).await;

    let old = c.wait_leader(CONVERGE).await;
    c.kill(old);
    let before = acked.lock().unwrap().len();
    acks_reach(&acked, before + 50).await;
    c.restart(old);
    c.wait_leader(CONVERGE).await;
    let before = acked.lock().unwrap().len();
    acks_reach(&acked, before + 20).await;
    stop.store(true, Ordering::Relaxed);
    for p in publishers {
        p.await.expect("publisher");
    }

    let failed = failed.lock().unwrap().clone();
    assert!(failed.is_empty(), "publishes failed: {failed:?}");
    let acked = acked.lock().unwrap().clone();
    assert_exactly_once(&c, "t", &acked).await;
    eprintln!(
        "{} acked, {} of them reported as duplicates of an earlier attempt",
        acked.len(),
        duplicates.lock().unwrap()
    );
}

/// Reads `sub` until it has delivered `last`; every delivered (sequence, id), in order.
async fn collect_until(sub: &mut Subscription, last: u64) -> Vec<(u64, String)> {
    let mut got = Vec::new();
    while got.last().map(|(s, _)| *s) != Some(last) {
        let event = tokio::time::timeout(CONVERGE, sub.next())
            .await
            .unwrap_or_else(|_| panic!("no event for {CONVERGE:?}; delivered {got:?}"));
        match event {
            Some(Ok(Event::Message(m))) => got.push((m.sequence, m.id)),
            Some(Ok(_)) => {}
            Some(Err(e)) => panic!("subscription error after {got:?}: {e}"),
            None => panic!("subscription ended after {got:?}"),
        }
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_survives_a_leader_kill_and_a_restart_of_its_node_without_gap_or_duplicate() {
    let mut c = Cluster::start(Options::default()).await;
    let publisher = patient_client(c.urls());
    publisher.create_topic("t", None).await.expect("create");
    let leader = c.wait_leader(CONVERGE).await;
    let home = (leader + 1) % 3;
    let other = (leader + 2) % 3;
    wait_applied(&c.url(home), "t", 0).await;

    // The subscriber's first seed is where its first connection goes: a follower.
    let subscriber = patient_client(vec![c.url(home), c.url(leader), c.url(other)]);
    let mut sub =
        subscriber.subscribe("t", SubscribeOptions::new("s").cursor(Cursor::After(0))).await.expect("subscribe");
    assert_eq!(sub.subscribed_cursor(), Some(0));
    let connected_to_home = get_json(&format!("{}/topics/t/subscribers", c.url(home))).await.expect("subscribers").1;
    assert!(
        connected_to_home["subscribers"].as_array().is_some_and(|l| l.iter().any(|s| s["subscriber_id"] == "s")),
        "the subscription is connected to node {home}: {connected_to_home}"
    );

    let mut next = 0u64;
    let mut publish = |count: u64| {
        let publisher = publisher.clone();
        let from = next + 1;
        next += count;
        async move {
            for n in from..from + count {
                let ack = publisher
                    .publish_message("t", NewMessage::new(json!(n)).with_id(format!("m{n}")), AckMode::Committed)
                    .await
                    .expect("publish");
                assert_eq!(ack.sequence, Some(n), "published one at a time, in order");
            }
        }
    };

    publish(10).await;
    // Leader kill: publishes wait for the election; the subscription stays on its follower.
    c.kill(leader);
    publish(10).await;
    c.restart(leader);
    c.wait_leader(CONVERGE).await;
    publish(10).await;
    // The subscription's own node goes away (SIGTERM: close code 1001) and comes back.
    assert_eq!(c.terminate(home), Some(0), "SIGTERM exits 0 (API.md §0); None is a signal death");
    publish(10).await;
    c.restart(home);
    c.wait_leader(CONVERGE).await;
    publish(10).await;

    let delivered = collect_until(&mut sub, next).await;
    let sequences: Vec<u64> = delivered.iter().map(|(s, _)| *s).collect();
    assert_eq!(sequences, (1..=next).collect::<Vec<_>>(), "each once, in order");
    // Any node will do once it has applied the last publish.
    let stored = wait_until("a node applied every publish", CONVERGE, || async {
        read_all(&c.url(other), "t").await.filter(|l| l.len() as u64 == next)
    })
    .await;
    assert_eq!(delivered, stored, "the stream carries the stored messages");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acked_subscriber_resumes_after_its_ack_with_cursor_acked() {
    let mut c = Cluster::start(Options::default()).await;
    let client = patient_client(c.urls());
    client.create_topic("t", None).await.expect("create");
    for n in 1..=10 {
        client.publish("t", json!(n)).await.expect("publish");
    }

    // A subscriber that never acked starts at 0.
    let fresh = client.subscribe("t", SubscribeOptions::new("new").cursor(Cursor::Acked)).await.expect("subscribe");
    assert_eq!(fresh.subscribed_cursor(), Some(0));
    drop(fresh);

    let mut sub =
        client.subscribe("t", SubscribeOptions::new("billing").cursor(Cursor::After(0))).await.expect("subscribe");
    let first = collect_until(&mut sub, 10).await;
    assert_eq!(first.len(), 10);
    sub.ack(6);
    sub.close().await;

    // Acks are coalesced (flushed every 100 ms) and replicated: wait until every node has it,
    // since the next subscription may land on any of them.
    for i in 0..3 {
        wait_acked(&c.url(i), "billing", 6, "the ack is recorded on every node").await;
    }
    let listed = client.subscribers("t").await.expect("subscribers");
    let billing = listed.iter().find(|s| s.subscriber_id == "billing").expect("billing listed");
    assert_eq!((billing.acked_sequence, billing.lag), (6, 4));

    let mut resumed =
        client.subscribe("t", SubscribeOptions::new("billing").cursor(Cursor::Acked)).await.expect("resubscribe");
    assert_eq!(resumed.subscribed_cursor(), Some(6));
    client.publish("t", json!(11)).await.expect("publish");
    let rest: Vec<u64> = collect_until(&mut resumed, 11).await.into_iter().map(|(s, _)| s).collect();
    assert_eq!(rest, vec![7, 8, 9, 10, 11]);
    drop(resumed);

    // A forgotten cursor: what it was, then nothing to forget.
    let forgotten = client.forget_subscriber("t", "billing").await.expect("forget");
    assert_eq!((forgotten.acked_sequence, forgotten.deleted), (Some(6), true));
    match client.forget_subscriber("t", "billing").await {
        Err(pubsub_client::Error::Api(e)) => assert_eq!(e.code, pubsub_client::ErrorCode::NotFound),
        other => panic!("forgot a cursor twice: {other:?}"),
    }

    // An ack a node received just before it was stopped (SIGTERM) is recorded all the same,
    // not dropped with the coalescer's last 100 ms.
    let leader = c.wait_leader(CONVERGE).await;
    let follower = (leader + 1) % 3;
    let on_follower = patient_client(vec![c.url(follower)]);
    let mut sub =
        on_follower.subscribe("t", SubscribeOptions::new("late").cursor(Cursor::After(0))).await.expect("subscribe");
    collect_until(&mut sub, 11).await;
    sub.ack(9);
    sub.close().await;
    c.terminate(follower);
    wait_acked(&c.url(leader), "late", 9, "the last ack of a stopped node is recorded").await;
}

/// A subscription whose node dies, and whose topic is deleted before it reconnects, still gets
/// every message published before the deletion, then `TopicDeleted`: the deletion is no
/// silent gap for a subscriber that was not connected when it happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_cut_off_by_a_node_kill_then_a_delete_gets_every_message_before_it() {
    let mut c = Cluster::start(Options::default()).await;
    let publisher = patient_client(c.urls());
    publisher.create_topic("t", None).await.expect("create");
    let leader = c.wait_leader(CONVERGE).await;
    let home = (leader + 1) % 3;
    wait_applied(&c.url(home), "t", 0).await;
    let subscriber = patient_client(vec![c.url(home), c.url(leader), c.url((leader + 2) % 3)]);
    let mut sub =
        subscriber.subscribe("t", SubscribeOptions::new("s").cursor(Cursor::After(0))).await.expect("subscribe");
    for n in 1..=3 {
        publisher.publish("t", json!(n)).await.expect("publish");
    }
    assert_eq!(collect_until(&mut sub, 3).await.len(), 3);

    // Its node freezes (its connection stays open); two more messages and the deletion
    // commit, and every other node applies them, before the node dies and the subscription
    // reconnects elsewhere.
    c.pause(home);
    for n in 4..=5 {
        publisher.publish("t", json!(n)).await.expect("publish");
    }
    publisher.delete_topic("t").await.expect("delete");
    for i in [leader, (leader + 2) % 3] {
        wait_until("the node applies the deletion", CONVERGE, || async {
            let (status, _) = get_json(&format!("{}/topics/t", c.url(i))).await.ok()?;
            (status == 404).then_some(())
        })
        .await;
    }
    c.kill(home);

    let mut rest = Vec::new();
    loop {
        match tokio::time::timeout(CONVERGE, sub.next()).await.expect("an event in time") {
            Some(Ok(Event::Message(m))) => rest.push(m.sequence),
            Some(Ok(Event::TopicDeleted)) => break,
            Some(Ok(_)) => {}
            other => panic!("after {rest:?}: {other:?}"),
        }
    }
    assert_eq!(rest, vec![4, 5], "what came before the deletion, then the notice");
    assert!(tokio::time::timeout(CONVERGE, sub.next()).await.expect("the end in time").is_none());
}

/// Waits until the node at `node` lists `subscriber` of topic `t` as acked at `sequence`.
async fn wait_acked(node: &str, subscriber: &str, sequence: u64, what: &str) {
    let url = format!("{node}/topics/t/subscribers");
    wait_until(what, CONVERGE, || async {
        let (_, body) = get_json(&url).await.ok()?;
        body["subscribers"]
            .as_array()?
            .iter()
            .any(|s| s["subscriber_id"] == subscriber && s["acked_sequence"] == sequence)
            .then_some(())
    })
    .await;
}

/// The `pubsub` CLI with `args`, its output piped, free of the environment's settings.
fn pubsub_command(args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(cli_binary());
    cmd.args(args)
        .env_remove("PUBSUB_SERVER")
        .env_remove("PUBSUB_ATTEMPTS")
        .env_remove("PUBSUB_CLUSTER_SECRET")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// One run of the `pubsub` CLI: (exit code, stdout, stderr).
async fn pubsub(args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    let mut cmd = pubsub_command(args);
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    let mut child = cmd.spawn().expect("spawn pubsub");
    if let Some(text) = stdin {
        let mut pipe = child.stdin.take().expect("stdin");
        pipe.write_all(text.as_bytes()).await.expect("write stdin");
        drop(pipe);
    }
    let out = tokio::time::timeout(CONVERGE, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("pubsub {args:?} did not finish"))
        .expect("pubsub output");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `pubsub cluster add|remove`: refused without the cluster's secret (exit 1), then a node
/// started with `--join` is added (a voter, listed by `pubsub cluster`) and removed, and a second
/// removal is refused as no member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_adds_and_removes_a_member() {
    let mut c = Cluster::start(Options { nodes: 1, ..Default::default() }).await;
    let secret = c.secret().expect("a secret").to_string();
    let new = c.start_joining_node();
    let (url, addr) = (c.url(0), c.nodes[new].addr.clone());
    let (code, _, err) = pubsub(&["-s", &url, "cluster", "add", "2", &addr], None).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("unauthorized"), "{err}");
    let add = ["-s", &url, "cluster", "add", "node-2", &addr, "--cluster-secret", &secret];
    let (code, out, err) = pubsub(&add, None).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("node-2 is a voter"), "{out}");
    let (code, out, err) = pubsub(&["-s", &c.url(new), "--json", "cluster"], None).await;
    assert_eq!(code, 0, "{err}");
    let info: Value = serde_json::from_str(out.trim()).expect("JSON");
    let roles: Vec<(&str, &str)> = info["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| (m["node_id"].as_str().unwrap(), m["role"].as_str().unwrap()))
        .collect();
    assert_eq!(roles, [("node-1", "voter"), ("node-2", "voter")], "{info}");
    // Asked of the follower, the human output shows the leader's view of each member.
    let (code, out, err) = pubsub(&["-s", &c.url(new), "cluster"], None).await;
    assert_eq!(code, 0, "{err}");
    let members = out.lines().find(|l| l.starts_with("members")).unwrap_or_default();
    assert!(members.contains("node-1 (voter) at") && members.contains("lag 0,"), "{out}");
    assert!(members.contains("node-2 (voter) at") && members.matches(" lag ").count() == 2, "{out}");
    let remove = ["-s", &url, "cluster", "remove", "2", "--cluster-secret", &secret];
    let (code, out, err) = pubsub(&remove, None).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("node-2 was removed"), "{out}");
    let (code, _, err) = pubsub(&remove, None).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("not_found") && err.contains("node-2 is not a member"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_creates_publishes_lists_reads_and_exits_with_its_codes() {
    let c = Cluster::start(Options::default()).await;
    let servers = c.urls().join(",");
    let s = servers.as_str();

    let (code, out, err) = pubsub(&["-s", s, "topics", "create", "orders"], None).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("created topic orders"), "{out}");

    let (code, out, err) = pubsub(&["-s", s, "publish", "orders", r#"{"order_id":"ORD-1"}"#], None).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("published to orders as #1"), "{out}");

    let lines = "{\"order_id\":\"ORD-2\"}\n\n{\"order_id\":\"ORD-3\"}\nplain text\n";
    let (code, out, err) = pubsub(&["-s", s, "--json", "publish", "orders", "-"], Some(lines)).await;
    assert_eq!(code, 0, "{err}");
    let acks: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).expect("one JSON ack per line")).collect();
    let sequences: Vec<u64> = acks.iter().filter_map(|a| a["sequence"].as_u64()).collect();
    assert_eq!(sequences, vec![2, 3, 4], "blank lines are skipped: {out}");

    let (code, out, err) = pubsub(&["-s", s, "topics", "list", "--json"], None).await;
    assert_eq!(code, 0, "{err}");
    let topics: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).expect("one JSON topic per line")).collect();
    assert_eq!(topics.len(), 1, "{out}");
    assert_eq!((topics[0]["name"].as_str(), topics[0]["message_count"].as_u64()), (Some("orders"), Some(4)));

    let (code, out, err) = pubsub(&["-s", s, "read", "orders"], None).await;
    assert_eq!(code, 0, "{err}");
    let printed: Vec<&str> = out.lines().collect();
    assert_eq!(printed.len(), 4, "{out}");
    assert!(printed[0].starts_with("#1 ") && printed[0].ends_with(r#"{"order_id":"ORD-1"}"#), "{out}");
    assert!(printed[3].starts_with("#4 ") && printed[3].ends_with(r#""plain text""#), "{out}");
    let (code, out, _) = pubsub(&["-s", s, "--json", "read", "orders", "--after", "2"], None).await;
    assert_eq!(code, 0);
    let page: Value = serde_json::from_str(out.trim()).expect("a JSON page");
    assert_eq!(page["next_cursor"], 4);
    assert_eq!(page["messages"][0]["payload"], json!({"order_id": "ORD-3"}));

    // Publishing stdin into a closed stdout stops with an error, not exit 0 with input left.
    let mut child =
        pubsub_command(&["-s", s, "publish", "orders", "-"]).stdin(Stdio::piped()).spawn().expect("spawn pubsub");
    drop(child.stdout.take());
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(b"5\n6\n7\n").await.expect("write stdin");
    drop(stdin);
    let out = tokio::time::timeout(CONVERGE, child.wait_with_output()).await.expect("pubsub finished").expect("output");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("output closed: stopped publishing"), "{err}");
    let (_, out, _) = pubsub(&["-s", s, "--json", "read", "orders", "--after", "4"], None).await;
    let page: Value = serde_json::from_str(out.trim()).expect("a JSON page");
    assert_eq!(page["messages"].as_array().map(Vec::len), Some(1), "the first line is stored, then it stops: {out}");

    // The server refuses: exit 1 with its error code.
    let (code, _, err) = pubsub(&["-s", s, "publish", "missing", "{}"], None).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("topic_not_found"), "{err}");
    let (code, _, err) = pubsub(&["-s", s, "--json", "read", "missing"], None).await;
    assert_eq!(code, 1, "{err}");
    let error: Value = serde_json::from_str(err.trim()).expect("a JSON error");
    assert_eq!(error["error"], "topic_not_found");

    // Publishing again under an id already stored (how a failed publish is made sure of) is
    // a success that names the first copy's sequence, and stores nothing more.
    let again = ["-s", s, "--json", "publish", "orders", r#"{"order_id":"ORD-1"}"#, "--id", "ord-1"];
    let (code, out, err) = pubsub(&again, None).await;
    assert_eq!(code, 0, "{err}");
    let first: Value = serde_json::from_str(out.trim()).expect("a JSON ack");
    let (code, out, err) = pubsub(&again, None).await;
    assert_eq!(code, 0, "{err}");
    let second: Value = serde_json::from_str(out.trim()).expect("a JSON ack");
    assert_eq!((second["duplicate"].as_bool(), &second["sequence"]), (Some(true), &first["sequence"]), "{out}");
    assert!(first["sequence"].as_u64().is_some() && first["duplicate"] == false, "{first}");

    // A file published with --id-prefix twice (a rerun after a failure, say) is stored once.
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), "{\"n\":1}\n\n{\"n\":2}\n").expect("write input");
    let path = file.path().to_str().expect("utf-8 path");
    let import = ["-s", s, "publish", "imports", "--batch", path, "--id-prefix", "import-"];
    let (code, _, err) = pubsub(&["-s", s, "topics", "create", "imports"], None).await;
    assert_eq!(code, 0, "{err}");
    for (run, expected) in [(1, "2 published, 0 duplicates"), (2, "0 published, 2 duplicates")] {
        let (code, _, err) = pubsub(&import, None).await;
        assert_eq!(code, 0, "run {run}: {err}");
        assert!(err.contains(expected), "run {run}: {err}");
    }
    let (_, out, _) = pubsub(&["-s", s, "--json", "read", "imports"], None).await;
    let page: Value = serde_json::from_str(out.trim()).expect("a JSON page");
    let ids: Vec<&str> =
        page["messages"].as_array().expect("messages").iter().filter_map(|m| m["id"].as_str()).collect();
    assert_eq!(ids, vec!["import-1", "import-3"], "{out}");

    // Nothing listens: exit 3, quickly with a small retry budget.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").to_string();
    let started = std::time::Instant::now();
    let (code, _, err) = pubsub(&["-s", &dead, "--attempts", "2", "--timeout-ms", "500", "topics", "list"], None).await;
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("unreachable"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
}

/// `pubsub publish --batch` without `--id-prefix` against a node whose first batch answer is
/// `raft_timeout` (the batch may have been stored): the note names a prefix, and the command
/// run again with it sends every line under the id it had the first time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_may_have_been_stored_names_the_id_prefix_that_publishes_it_again_once() {
    use axum::http::StatusCode;
    use axum::routing::post;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let node = listener.local_addr().expect("local address").to_string();
    let cluster = json!({"node_id": "node-1", "leader_id": "node-1", "leader_address": node, "peers": [node],
                         "raft_term": 1, "commit_index": 1, "role": "leader", "last_applied": 1});
    let requests: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
    let seen = requests.clone();
    let app =
        axum::Router::new().route("/cluster", axum::routing::get(move || async move { axum::Json(cluster) })).route(
            "/topics/{name}/messages/batch",
            post(move |axum::Json(body): axum::Json<Value>| async move {
                let ids: Vec<String> = body["messages"]
                    .as_array()
                    .map(|messages| messages.iter().filter_map(|m| m["id"].as_str().map(str::to_string)).collect())
                    .unwrap_or_default();
                let first = {
                    let mut requests = seen.lock().expect("lock");
                    requests.push(ids.clone());
                    requests.len() == 1
                };
                if first {
                    let error = json!({"error": "raft_timeout", "message": "not committed in time", "details": {}});
                    return (StatusCode::GATEWAY_TIMEOUT, axum::Json(error));
                }
                let results: Vec<Value> =
                    ids.iter().enumerate().map(|(n, id)| json!({"id": id, "sequence": n + 1})).collect();
                let ack = json!({"topic": "imports", "results": results, "raft_index": 7, "committed": true});
                (StatusCode::CREATED, axum::Json(ack))
            }),
        );
    tokio::spawn(async move { axum::serve(listener, app).await });

    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), "{\"n\":1}\n\n{\"n\":2}\n").expect("write input");
    let path = file.path().to_str().expect("utf-8 path");
    let (code, _, err) = pubsub(&["-s", &node, "--attempts", "1", "publish", "imports", "--batch", path], None).await;
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("batch 1 (lines 1-3) may have been stored"), "{err}");
    let prefix = err
        .split("--id-prefix ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no prefix named: {err}"))
        .to_string();

    let (code, _, err) =
        pubsub(&["-s", &node, "publish", "imports", "--batch", path, "--id-prefix", &prefix], None).await;
    assert_eq!(code, 0, "{err}");
    let requests = requests.lock().expect("lock").clone();
    let expected = vec![format!("{prefix}1"), format!("{prefix}3")];
    assert_eq!(requests, vec![expected.clone(), expected], "the rerun sent the ids of the first run");
}

/// What one WebSocket publish came to, for the test below.
enum WsOutcome {
    Acked(u64),
    /// Refused as a duplicate of an earlier attempt that did commit.
    AlreadyStored(u64),
    /// Not known to be stored: retry with the same id.
    Retry,
}

async fn ws_publish(publisher: &Publisher, id: String) -> (String, WsOutcome) {
    let outcome = match publisher.publish(NewMessage::new(json!({"id": id})).with_id(&id)).await {
        Ok(ack) => WsOutcome::Acked(ack.sequence.expect("a WebSocket ack has a sequence")),
        Err(Error::Api(api)) if api.existing_sequence().is_some() => {
            WsOutcome::AlreadyStored(api.existing_sequence().unwrap_or_default())
        }
        Err(_) => WsOutcome::Retry,
    };
    (id, outcome)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_publisher_reopened_after_a_leader_kill_stores_every_message_exactly_once() {
    const IN_FLIGHT: usize = 32;
    let mut c = Cluster::start(Options::default()).await;
    let client = patient_client(c.urls());
    client.create_topic("ws", None).await.expect("create");

    let acked: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let publishing = {
        let (client, acked, stop) = (client.clone(), acked.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut next, mut retries, mut connections) = (0u64, Vec::<String>::new(), 0usize);
            loop {
                let done = stop.load(Ordering::Relaxed);
                if done && retries.is_empty() {
                    return connections;
                }
                // A publisher dies with its connection; the next one finds the new leader.
                let publisher = client.publisher("ws").await.expect("open a publisher");
                connections += 1;
                let mut pending = futures_util::stream::FuturesUnordered::new();
                loop {
                    while pending.len() < IN_FLIGHT && !publisher.is_closed() {
                        let id = match retries.pop() {
                            Some(id) => id,
                            None if !stop.load(Ordering::Relaxed) => {
                                next += 1;
                                format!("w-{next}")
                            }
                            None => break,
                        };
                        pending.push(ws_publish(&publisher, id));
                    }
                    let Some((id, outcome)) = pending.next().await else { break };
                    match outcome {
                        WsOutcome::Acked(seq) | WsOutcome::AlreadyStored(seq) => {
                            acked.lock().unwrap().insert(id, seq);
                        }
                        WsOutcome::Retry => retries.push(id),
                    }
                }
            }
        })
    };
    acks_reach(&acked, 200).await;
    let old = c.wait_leader(CONVERGE).await;
    c.kill(old);
    let before = acked.lock().unwrap().len();
    acks_reach(&acked, before + 200).await;
    stop.store(true, Ordering::Relaxed);
    let connections = publishing.await.expect("publishing task");
    c.restart(old);
    c.wait_leader(CONVERGE).await;

    assert!(connections >= 2, "the leader kill closed the first publisher ({connections} opened)");
    let acked = acked.lock().unwrap().clone();
    assert_exactly_once(&c, "ws", &acked).await;
    eprintln!("{} messages over {connections} publisher connections", acked.len());
}
