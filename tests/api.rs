//! The client API contract (API.md) against a real 3-node cluster: every endpoint, field,
//! status and error body.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use pubsub_tests::http::{self, delete, get, post, post_raw};
use pubsub_tests::{allocate, wait_applied, wait_until, Cluster, Options};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

fn is_error_body(body: &Value, code: &str) -> bool {
    body["error"] == code && body["message"].is_string() && body["details"].is_object()
}

async fn leader_url(c: &Cluster) -> String {
    c.url(c.wait_leader(Duration::from_secs(10)).await)
}

async fn follower_url(c: &Cluster) -> String {
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    c.url((leader + 1) % c.nodes.len())
}

/// Waits until `url` lists `subscriber` of `topic` with `sequence` acked; returns the entry.
async fn wait_acked(url: &str, topic: &str, subscriber: &str, sequence: u64) -> Value {
    wait_until("ack listed", Duration::from_secs(10), || async {
        let (_, b) = http::get_json(&format!("{url}/topics/{topic}/subscribers")).await.ok()?;
        b["subscribers"]
            .as_array()?
            .iter()
            .find(|s| s["subscriber_id"] == subscriber && s["acked_sequence"] == sequence)
            .cloned()
    })
    .await
}

async fn ws_connect(url: &str, path: &str) -> Ws {
    let ws_url = format!("{}{path}", url.replacen("http://", "ws://", 1));
    tokio_tungstenite::connect_async(ws_url).await.expect("websocket connects").0
}

/// Creates `topic` on the leader `l` and opens a publishing WebSocket to it.
async fn publishing_socket(l: &str, topic: &str) -> Ws {
    post_raw(&format!("{l}/topics/{topic}"), "").await.unwrap();
    ws_connect(l, &format!("/topics/{topic}/publish")).await
}

/// The next text frame as JSON (pings are skipped), within 10 s.
async fn next_frame(ws: &mut Ws) -> Value {
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(10), ws.next()).await.expect("frame in time");
        match msg.expect("stream open").expect("frame ok") {
            Message::Text(t) => return serde_json::from_str(&t).expect("frame is JSON"),
            Message::Close(frame) => return json!({"closed": frame.map(|f| u16::from(f.code))}),
            _ => continue,
        }
    }
}

#[tokio::test]
async fn topics_lifecycle_follows_the_contract() {
    let c = Cluster::start(Options::default()).await;
    let l = leader_url(&c).await;

    let r = post(&format!("{l}/topics/orders"), &json!({"metadata": {"description": "Order events"}})).await.unwrap();
    assert_eq!(r.status, 201, "{r:?}");
    assert_eq!(r.body["topic"], "orders");
    assert_eq!(r.body["created"], true);
    assert!(r.body["raft_index"].as_u64().unwrap() > 0);

    let r = post_raw(&format!("{l}/topics/orders"), "").await.unwrap();
    assert_eq!((r.status, &r.body["created"], &r.body["raft_index"]), (200, &json!(false), &json!(0)));

    let r = get(&format!("{l}/topics/orders")).await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body["message_count"], 0);
    assert_eq!(r.body["current_sequence"], 0);
    assert!(r.body["created_at"].as_u64().unwrap() > 1_600_000_000_000);
    assert_eq!(r.body["metadata"], json!({"description": "Order events"}));

    // Metadata is stored as given: key order and number spelling survive, whitespace does not.
    let r = post_raw(
        &format!("{l}/topics/spelled"),
        r#"{"metadata": {"z": 1e2, "a": [2.50, -0.0], "retention_messages": 10}}"#,
    )
    .await
    .unwrap();
    assert_eq!(r.status, 201, "{r:?}");
    let text = reqwest::get(format!("{l}/topics/spelled")).await.unwrap().text().await.unwrap();
    assert!(text.contains(r#""metadata":{"z":1e2,"a":[2.50,-0.0],"retention_messages":10}"#), "{text}");
    assert_eq!(delete(&format!("{l}/topics/spelled")).await.unwrap().status, 200);

    let r = get(&format!("{l}/topics")).await.unwrap();
    assert_eq!(r.body["topics"][0]["name"], "orders");
    assert_eq!(r.body["topics"][0]["message_count"], 0);

    for bad in ["a%20b", "%C3%A9", &"x".repeat(256)] {
        let r = post_raw(&format!("{l}/topics/{bad}"), "").await.unwrap();
        assert_eq!(r.status, 400, "{bad}");
        assert!(is_error_body(&r.body, "invalid_topic_name"), "{:?}", r.body);
    }
    // The query string's escapes are decoded right after the name on every route, for a topic
    // that does not exist too (API.md §7).
    for (method, path) in [
        ("POST", "/topics/nope"),
        ("GET", "/topics/nope"),
        ("DELETE", "/topics/nope"),
        ("GET", "/topics/nope/subscribers"),
        ("DELETE", "/topics/nope/subscribers/a"),
        ("GET", "/topics/nope/publish"),
        ("GET", "/topics/nope/messages"),
    ] {
        let url = format!("{l}{path}?x=%FF");
        let r = match method {
            "POST" => post_raw(&url, "").await,
            "GET" => get(&url).await,
            _ => delete(&url).await,
        }
        .unwrap();
        assert!(r.status == 400 && is_error_body(&r.body, "invalid_request"), "{method} {path}: {r:?}");
    }
    let r = post_raw(&format!("{l}/topics/x"), "{not json").await.unwrap();
    assert!(r.status == 400 && is_error_body(&r.body, "invalid_request"));
    let r = post(&format!("{l}/topics/x"), &json!({"metadata": 5})).await.unwrap();
    assert!(r.status == 400 && is_error_body(&r.body, "invalid_request"));
    // Metadata follows the payload rules: nested 100 deep is kept and reads back (`GET` wraps
    // it one level deeper), 101 is refused; before, up to serde_json's own 127 was stored and
    // every read of the topic then failed in serde_json readers.
    let nested =
        |depth: usize| format!(r#"{{"metadata": {{"a": {}1{}}}}}"#, "[".repeat(depth - 1), "]".repeat(depth - 1));
    let r = post_raw(&format!("{l}/topics/deep"), nested(100)).await.unwrap();
    assert_eq!(r.status, 201, "{r:?}");
    let r = get(&format!("{l}/topics/deep")).await.unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.body["metadata"]["a"].is_array(), "{r:?}");
    let r = post_raw(&format!("{l}/topics/deeper"), nested(101)).await.unwrap();
    assert!(r.status == 400 && is_error_body(&r.body, "invalid_request"), "{r:?}");
    assert!(r.body["message"].as_str().unwrap().contains("metadata nests deeper"), "{r:?}");
    assert_eq!(delete(&format!("{l}/topics/deep")).await.unwrap().status, 200);

    // Publish two, delete, and the topic is gone everywhere.
    for id in ["m1", "m2"] {
        let r = post(&format!("{l}/topics/orders/messages"), &json!({"id": id, "payload": 1})).await.unwrap();
        assert_eq!(r.status, 201);
    }
    let r = delete(&format!("{l}/topics/orders")).await.unwrap();
    assert_eq!((r.status, &r.body["deleted"]), (200, &json!(true)));
    assert!(r.body["raft_index"].as_u64().unwrap() > 0);
    let r = delete(&format!("{l}/topics/orders")).await.unwrap();
    assert!(r.status == 404 && is_error_body(&r.body, "topic_not_found"));
    let r = get(&format!("{l}/topics/orders")).await.unwrap();
    assert!(r.status == 404 && is_error_body(&r.body, "topic_not_found"));
    let r = get(&format!("{l}/topics")).await.unwrap();
    assert_eq!(r.body["topics"], json!([]));
    let r = post(&format!("{l}/topics/orders/messages"), &json!({"payload": 1})).await.unwrap();
    assert!(r.status == 404 && is_error_body(&r.body, "topic_not_found"));

    // Revived: the sequence continues.
    let r = post_raw(&format!("{l}/topics/orders"), "").await.unwrap();
    assert_eq!((r.status, &r.body["created"]), (201, &json!(true)));
    let r = post(&format!("{l}/topics/orders/messages"), &json!({"payload": 1})).await.unwrap();
    assert_eq!(r.body["sequence"], 3);
}

#[tokio::test]
async fn publish_follows_the_contract() {
    let c = Cluster::start(Options::default()).await;
    let l = leader_url(&c).await;
    post_raw(&format!("{l}/topics/t"), "").await.unwrap();
    let url = format!("{l}/topics/t/messages");

    let r = post(&url, &json!({"id": "msg-1", "payload": {"order_id": "ORD-456"}, "timestamp": 1714000000000u64}))
        .await
        .unwrap();
    assert_eq!(r.status, 201, "{r:?}");
    assert_eq!(r.body["id"], "msg-1");
    assert_eq!(r.body["topic"], "t");
    assert_eq!(r.body["sequence"], 1);
    assert_eq!(r.body["committed"], true);
    assert!(r.body["raft_index"].as_u64().unwrap() > 0);

    // Generated ids are UUIDs.
    let r = post(&url, &json!({"payload": null})).await.unwrap();
    assert_eq!(r.status, 201);
    assert_eq!(r.body["id"].as_str().unwrap().len(), 36);
    assert_eq!(r.body["sequence"], 2);
    // A generated id that a client sends back is a duplicate like any other.
    let generated = r.body["id"].clone();
    let r = post(&url, &json!({"id": generated, "payload": 1})).await.unwrap();
    assert_eq!((r.status, &r.body["existing_sequence"]), (409, &json!(2)), "{r:?}");

    // Duplicate id.
    let r = post(&url, &json!({"id": "msg-1", "payload": 2})).await.unwrap();
    assert_eq!(r.status, 409);
    assert!(is_error_body(&r.body, "duplicate_message_id"));
    assert_eq!((&r.body["id"], &r.body["existing_sequence"]), (&json!("msg-1"), &json!(1)));
    assert_eq!(r.body["details"]["existing_sequence"], 1);

    // ack=appended.
    let r = post(&format!("{url}?ack=appended"), &json!({"id": "a1", "payload": 3})).await.unwrap();
    assert_eq!((r.status, &r.body["committed"]), (202, &json!(false)));
    // The 202 answer names sequence and raft_index as null: not yet known.
    assert_eq!(r.body, json!({"id": "a1", "topic": "t", "sequence": null, "raft_index": null, "committed": false}));
    // ack=appended never sees the apply result: a known duplicate is refused before proposing.
    let r = post(&format!("{url}?ack=appended"), &json!({"id": "msg-1", "payload": 3})).await.unwrap();
    assert_eq!((r.status, &r.body["existing_sequence"]), (409, &json!(1)));
    let r = post(&format!("{url}?ack=sometimes"), &json!({"payload": 3})).await.unwrap();
    assert!(r.status == 400 && is_error_body(&r.body, "invalid_request"));

    // Malformed bodies.
    for body in [
        "",
        "{",
        "[]",
        r#"{"id": 5, "payload": 1}"#,
        r#"{"id": "x"}"#,
        r#"{"payload": 1, "timestamp": "now"}"#,
        r#"{"id": "", "payload": 1}"#,
        // A message's fields in order, as an array: no object, no message.
        r#"[null, {"a": 1}, null]"#,
    ] {
        let r = post_raw(&url, body.to_string()).await.unwrap();
        assert!(r.status == 400 && is_error_body(&r.body, "invalid_request"), "{body}: {r:?}");
    }
    let long_id = "i".repeat(257);
    let r = post(&url, &json!({"id": long_id, "payload": 1})).await.unwrap();
    assert_eq!(r.status, 400);

    // Payload size: exactly 1 MiB as compact JSON is accepted, one byte more is not.
    let exact = "x".repeat(1024 * 1024 - 2);
    let r = post(&url, &json!({"payload": exact})).await.unwrap();
    assert_eq!(r.status, 201, "{:?}", r.body);
    let over = "x".repeat(1024 * 1024 - 1);
    let r = post(&url, &json!({"payload": over})).await.unwrap();
    assert!(r.status == 413 && is_error_body(&r.body, "payload_too_large"), "{:?}", r.status);
    // The server answers before reading a too-large body and closes that connection: send it
    // on a connection of its own so the shared pool does not reuse the closed one.
    let own = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let r = http::send(own.post(&url).body(vec![b' '; 3 * 1024 * 1024])).await.unwrap();
    assert_eq!(r.status, 413);
    // A declared length past what the node would drain, sent with `Expect: 100-continue`, is
    // answered 413 before any of it is sent (before, `100 Continue`, then a wait for 10 GB).
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(l.trim_start_matches("http://")).await.unwrap();
        let head = "POST /topics/t/messages HTTP/1.1\r\nhost: node\r\ncontent-type: application/json\r\n\
                    content-length: 10000000000\r\nexpect: 100-continue\r\n\r\n";
        stream.write_all(head.as_bytes()).await.unwrap();
        let mut answer = vec![0; 64];
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut answer)).await.unwrap().unwrap();
        let answer = String::from_utf8_lossy(&answer[..n]);
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    }

    // In a batch too, a malformed message is answered (400) before another's payload over the
    // limit (413), whichever comes first; either alone is answered as such.
    let with = |second: Value| json!({"messages": [{"payload": over}, second]});
    let r = post(&format!("{url}/batch"), &with(json!({"id": "", "payload": 1}))).await.unwrap();
    assert!(r.status == 400 && is_error_body(&r.body, "invalid_request"), "{:?}", r.body);
    let r = post(&format!("{url}/batch"), &with(json!({"id": "fine", "payload": 1}))).await.unwrap();
    assert!(r.status == 413 && is_error_body(&r.body, "payload_too_large"), "{:?}", r.body);

    // Missing topic.
    let r = post(&format!("{l}/topics/none/messages"), &json!({"payload": 1})).await.unwrap();
    assert!(r.status == 404 && is_error_body(&r.body, "topic_not_found"));

    // Batch.
    let batch = json!({"messages": [{"id": "b1", "payload": 1}, {"id": "msg-1", "payload": 2}, {"payload": 3}]});
    let r = post(&format!("{url}/batch"), &batch).await.unwrap();
    assert_eq!(r.status, 201, "{r:?}");
    let results = r.body["results"].as_array().unwrap();
    assert_eq!(results[0], json!({"id": "b1", "sequence": 5}));
    assert_eq!(results[1], json!({"id": "msg-1", "error": "duplicate_message_id", "existing_sequence": 1}));
    assert_eq!(results[2]["sequence"], 6);
    assert_eq!(r.body["committed"], true);
    let r = post(&format!("{url}/batch"), &json!({"messages": []})).await.unwrap();
    assert_eq!(r.status, 400);
    for arrays in [json!({"messages": [[null, 1, null]]}), json!([[{"payload": 1}]])] {
        let r = post(&format!("{url}/batch"), &arrays).await.unwrap();
        assert!(r.status == 400 && is_error_body(&r.body, "invalid_request"), "{arrays}: {r:?}");
    }
    let many: Vec<Value> = (0..1001).map(|i| json!({"payload": i})).collect();
    let r = post(&format!("{url}/batch"), &json!({"messages": many})).await.unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(r.body["error"], "invalid_request", "{r:?}");
    // Refused at the 1,001st item, before millions of empty ones are parsed.
    let empties = vec![json!({}); 4_000_000];
    let r = post(&format!("{url}/batch"), &json!({"messages": empties})).await.unwrap();
    assert_eq!(r.status, 400);
    assert!(r.body["message"].as_str().unwrap().contains("1 to 1000 messages"), "{r:?}");
    // A batch is answered after commit only; an ack it cannot honour is refused.
    for ack in ["appended", "bogus"] {
        let r = post(&format!("{url}/batch?ack={ack}"), &json!({"messages": [{"payload": 1}]})).await.unwrap();
        assert_eq!(r.status, 400, "{ack}: {r:?}");
    }
    let r = post(&format!("{url}/batch?ack=committed"), &json!({"messages": [{"payload": 0}]})).await.unwrap();
    assert_eq!(r.status, 201, "{r:?}");
    // A batch whose ids are all generated.
    let r = post(&format!("{url}/batch"), &json!({"messages": [{"payload": 1}, {"payload": 2}]})).await.unwrap();
    assert_eq!(r.status, 201, "{r:?}");
    let sequences: Vec<&Value> = r.body["results"].as_array().unwrap().iter().map(|r| &r["sequence"]).collect();
    assert_eq!(sequences, [&json!(8), &json!(9)]);

    // Nested 100 deep is accepted, 101 is refused (many readers could not parse it back), and
    // so is a number past a 64-bit float; what is accepted reads back through a page.
    let nested = |depth: usize| format!(r#"{{"payload": {}1{}}}"#, "[".repeat(depth), "]".repeat(depth));
    let r = post_raw(&url, nested(100)).await.unwrap();
    assert_eq!(r.status, 201, "{r:?}");
    let deepest = r.body["sequence"].as_u64().unwrap();
    let r = post_raw(&url, nested(101)).await.unwrap();
    assert!(r.status == 400 && is_error_body(&r.body, "invalid_request"), "{r:?}");
    let r = post_raw(&url, r#"{"payload": {"n": [1, 1e400]}}"#.to_string()).await.unwrap();
    assert!(r.status == 400 && is_error_body(&r.body, "invalid_request"), "{r:?}");
    // A lone UTF-16 surrogate is refused too (no strict reader could read its page back);
    // a pair is a character like any other.
    let r = post_raw(&url, r#"{"payload": "\ud800"}"#.to_string()).await.unwrap();
    assert!(r.status == 400 && is_error_body(&r.body, "invalid_request"), "{r:?}");
    let r = post_raw(&url, r#"{"payload": "\ud83d\ude00"}"#.to_string()).await.unwrap();
    assert_eq!(r.status, 201, "{r:?}");
    let page = get(&format!("{url}?after={}", deepest - 1)).await.unwrap();
    assert_eq!(page.status, 200, "{page:?}");
    assert_eq!(page.body["messages"][0]["sequence"], json!(deepest), "{page:?}");
}

/// `GET /topics` pages by name with `limit` and `after`; without them it lists every topic.
#[tokio::test]
async fn topics_are_listed_in_pages_by_name() {
    let c = Cluster::start(Options { nodes: 1, ..Default::default() }).await;
    let l = leader_url(&c).await;
    for name in ["c", "e", "a", "d", "b"] {
        assert_eq!(post_raw(&format!("{l}/topics/{name}"), "").await.unwrap().status, 201);
    }
    fn names(body: &Value) -> Vec<&str> {
        body["topics"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect()
    }
    let all = get(&format!("{l}/topics")).await.unwrap();
    assert_eq!((names(&all.body), &all.body["next_after"]), (vec!["a", "b", "c", "d", "e"], &Value::Null));
    let first = get(&format!("{l}/topics?limit=2")).await.unwrap();
    assert_eq!((names(&first.body), &first.body["next_after"]), (vec!["a", "b"], &json!("b")));
    let second = get(&format!("{l}/topics?limit=2&after=b")).await.unwrap();
    assert_eq!((names(&second.body), &second.body["next_after"]), (vec!["c", "d"], &json!("d")));
    let rest = get(&format!("{l}/topics?limit=2&after=d")).await.unwrap();
    assert_eq!((names(&rest.body), &rest.body["next_after"]), (vec!["e"], &Value::Null));
    for bad in ["limit=0", "limit=x", "limit=100001"] {
        let r = get(&format!("{l}/topics?{bad}")).await.unwrap();
        assert_eq!(r.status, 400, "{bad}");
        assert!(is_error_body(&r.body, "invalid_request"), "{bad}: {r:?}");
    }
}

/// Behind port mapping (docker compose) clients reach the nodes elsewhere than the peers do:
/// `--client-addresses` is what redirects and `/cluster` name, while Raft keeps `--peers`.
#[tokio::test]
async fn client_addresses_are_what_clients_are_told() {
    let mapped = "1=c1.test:1001,2=c2.test:1002,3=c3.test:1003";
    let c = Cluster::start(Options { client_addresses: Some(mapped.into()), ..Default::default() }).await;
    let l = leader_url(&c).await;
    let f = follower_url(&c).await;
    let leader = get(&format!("{l}/cluster")).await.unwrap();
    let id: u64 = leader.body["node_id"].as_str().and_then(|n| n.strip_prefix("node-")).unwrap().parse().unwrap();
    let expected = format!("c{id}.test:100{id}");

    let r = post(&format!("{f}/topics/t"), &json!({})).await.unwrap();
    assert_eq!(r.status, 307);
    assert_eq!(r.location, Some(format!("http://{expected}/topics/t")));
    assert_eq!(r.body["leader_address"], expected);
    for node in [&l, &f] {
        let cluster = get(&format!("{node}/cluster")).await.unwrap().body;
        assert_eq!(cluster["leader_address"], expected, "{cluster}");
        assert_eq!(cluster["peers"], json!(["c1.test:1001", "c2.test:1002", "c3.test:1003"]), "{cluster}");
    }
    // Raft runs on --peers still: a write to the leader commits on a majority.
    assert_eq!(post_raw(&format!("{l}/topics/t"), "").await.unwrap().status, 201);
}

#[tokio::test]
async fn followers_redirect_writes_and_serve_reads() {
    let c = Cluster::start(Options::default()).await;
    let l = leader_url(&c).await;
    let f = follower_url(&c).await;
    let leader_addr = l.trim_start_matches("http://").to_string();

    let r = post(&format!("{f}/topics/t?x=1"), &json!({})).await.unwrap();
    assert_eq!(r.status, 307);
    assert_eq!(r.location.as_deref(), Some(format!("http://{leader_addr}/topics/t?x=1").as_str()));
    assert!(is_error_body(&r.body, "not_leader"));
    assert_eq!(r.body["leader_address"], leader_addr);
    assert!(r.body["leader_id"].as_str().unwrap().starts_with("node-"));
    assert_eq!(r.body["details"]["leader_address"], leader_addr);
    let r = post(&format!("{f}/topics/t/messages"), &json!({"payload": 1})).await.unwrap();
    assert_eq!(r.status, 307);
    assert_eq!(delete(&format!("{f}/topics/t")).await.unwrap().status, 307);

    post_raw(&format!("{l}/topics/t"), "").await.unwrap();
    post(&format!("{l}/topics/t/messages"), &json!({"id": "x", "payload": {"a": 1}})).await.unwrap();
    wait_applied(&f, "t", 1).await;
    let r = get(&format!("{f}/topics/t/messages?after=0")).await.unwrap();
    assert_eq!(r.body["messages"][0]["payload"], json!({"a": 1}));

    // /cluster on a follower.
    let r = get(&format!("{f}/cluster")).await.unwrap();
    assert_eq!(r.body["role"], "follower");
    assert_eq!(r.body["leader_address"], leader_addr);
    assert_eq!(r.body["peers"].as_array().unwrap().len(), 3);
    assert_eq!(r.body["peers"][0], c.nodes[0].addr);
    assert!(r.body["raft_term"].as_u64().unwrap() >= 1);
    assert!(r.body["commit_index"].as_u64().unwrap() >= 1);
}

#[tokio::test]
async fn reads_page_and_long_poll() {
    let c = Cluster::start(Options::default()).await;
    let l = leader_url(&c).await;
    post_raw(&format!("{l}/topics/t"), "").await.unwrap();
    for i in 0..5 {
        post(&format!("{l}/topics/t/messages"), &json!({"id": format!("m{i}"), "payload": i})).await.unwrap();
    }
    let r = get(&format!("{l}/topics/t/messages?after=1&limit=2")).await.unwrap();
    assert_eq!(r.status, 200);
    let seqs: Vec<u64> =
        r.body["messages"].as_array().unwrap().iter().map(|m| m["sequence"].as_u64().unwrap()).collect();
    assert_eq!(seqs, vec![2, 3]);
    assert_eq!(r.body["next_cursor"], 3);
    assert_eq!(r.body["current_sequence"], 5);
    let m = &r.body["messages"][0];
    assert_eq!((&m["id"], &m["topic"], &m["payload"]), (&json!("m1"), &json!("t"), &json!(1)));
    assert!(m["timestamp"].is_u64());

    let r = get(&format!("{l}/topics/t/messages?after=5")).await.unwrap();
    assert_eq!((r.body["messages"].as_array().unwrap().len(), &r.body["next_cursor"]), (0, &json!(5)));
    for bad in ["after=6", "after=x", "after=-1"] {
        let r = get(&format!("{l}/topics/t/messages?{bad}")).await.unwrap();
        assert!(r.status == 400 && is_error_body(&r.body, "invalid_cursor"), "{bad}");
    }
    let r = get(&format!("{l}/topics/t/messages?limit=0")).await.unwrap();
    assert_eq!(r.status, 400);
    // Empty values are their defaults, as an empty `cursor=` is.
    let r = get(&format!("{l}/topics/t/messages?after=&limit=&wait_ms=")).await.unwrap();
    assert_eq!((r.status, r.body["messages"].as_array().unwrap().len()), (200, 5), "{r:?}");
    let r = get(&format!("{l}/topics/none/messages")).await.unwrap();
    assert_eq!(r.status, 404);

    // Long-poll on a follower returns as soon as a publish is applied there.
    let f = follower_url(&c).await;
    wait_applied(&f, "t", 5).await;
    let poll = tokio::spawn({
        let f = f.clone();
        async move { get(&format!("{f}/topics/t/messages?after=5&wait_ms=10000")).await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = std::time::Instant::now();
    post(&format!("{l}/topics/t/messages"), &json!({"payload": "late"})).await.unwrap();
    let r = poll.await.unwrap();
    assert_eq!(r.body["messages"][0]["payload"], "late");
    assert!(started.elapsed() < Duration::from_secs(5));

    // A cursor past this node's end (handed out by a node further along): a long poll waits
    // for this node to reach it; a wait that ends first is refused, as a plain read is.
    let poll = tokio::spawn({
        let f = f.clone();
        async move { get(&format!("{f}/topics/t/messages?after=7&wait_ms=10000")).await.unwrap() }
    });
    for payload in ["seventh", "eighth"] {
        post(&format!("{l}/topics/t/messages"), &json!({ "payload": payload })).await.unwrap();
    }
    let r = poll.await.unwrap();
    assert_eq!((r.status, &r.body["messages"][0]["sequence"]), (200, &json!(8)), "{r:?}");
    let r = get(&format!("{f}/topics/t/messages?after=20&wait_ms=300")).await.unwrap();
    assert!(r.status == 400 && is_error_body(&r.body, "invalid_cursor"), "{r:?}");

    // A topic retention trimmed to nothing has no message to return: the long-poll waits its
    // time instead of answering an empty page at once (a client following it would spin).
    post(&format!("{l}/topics/gone"), &json!({"metadata": {"retention_bytes": 1}})).await.unwrap();
    for _ in 0..2 {
        post(&format!("{l}/topics/gone/messages"), &json!({"payload": 12})).await.unwrap();
    }
    let started = std::time::Instant::now();
    let r = get(&format!("{l}/topics/gone/messages?after=1&wait_ms=1000")).await.unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!((&r.body["current_sequence"], &r.body["first_available_sequence"]), (&json!(2), &json!(3)));
    assert_eq!(r.body["messages"].as_array().unwrap().len(), 0);
    assert!(started.elapsed() >= Duration::from_millis(1000), "answered after {:?}", started.elapsed());
}

/// A cursor past the node's end may come from a node further along (a client failing over
/// from the leader to a follower a few entries behind): the subscription waits for this node
/// to reach it, and is refused `400 invalid_cursor` only when it has not within the grace.
/// Before, it was refused at once, and a failing-over client read that as a bad cursor.
#[tokio::test]
async fn a_cursor_past_the_nodes_end_is_served_once_the_node_reaches_it() {
    use pubsub_node::limits::SUBSCRIBE_CURSOR_AHEAD_WAIT;
    let c = Cluster::start(Options { nodes: 1, ..Options::default() }).await;
    let l = leader_url(&c).await;
    post_raw(&format!("{l}/topics/t"), "").await.unwrap();
    let publish = |i: u64| {
        let (url, body) = (format!("{l}/topics/t/messages"), json!({"id": format!("m{i}"), "payload": i}));
        async move { post(&url, &body).await }
    };
    publish(1).await.unwrap();
    let ahead = tokio::spawn({
        let l = l.clone();
        async move { ws_connect(&l, "/topics/t/subscribe?subscriber_id=s&cursor=2").await }
    });
    // Refused at once, it would be done by now (the panic of a refused connect).
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!ahead.is_finished(), "the subscription did not wait for the node to reach its cursor");
    for i in 2..=3 {
        publish(i).await.unwrap();
    }
    let mut ws = ahead.await.unwrap();
    assert_eq!(next_frame(&mut ws).await["cursor"], 2);
    assert_eq!(next_frame(&mut ws).await["sequence"], 3);

    let started = std::time::Instant::now();
    let r = get(&format!("{l}/topics/t/subscribe?subscriber_id=s&cursor=9")).await.unwrap();
    assert!(r.status == 400 && is_error_body(&r.body, "invalid_cursor"), "{r:?}");
    assert!(started.elapsed() >= SUBSCRIBE_CURSOR_AHEAD_WAIT, "refused after {:?}", started.elapsed());
}

/// A subscriber's frame over the limit ends its subscription with close code 1009, which
/// says why; before, the connection was dropped without a close frame.
#[tokio::test]
async fn a_subscriber_frame_over_the_limit_is_closed_with_1009() {
    use pubsub_node::limits::SUBSCRIBER_FRAME_BYTES_MAX;
    let c = Cluster::start(Options { nodes: 1, ..Options::default() }).await;
    let l = leader_url(&c).await;
    post_raw(&format!("{l}/topics/t"), "").await.unwrap();
    let mut ws = ws_connect(&l, "/topics/t/subscribe?subscriber_id=s").await;
    assert_eq!(next_frame(&mut ws).await["subtype"], "subscribed");
    let ack = format!(r#"{{"type":"ack","sequence":0,"pad":"{}"}}"#, "x".repeat(SUBSCRIBER_FRAME_BYTES_MAX));
    ws.send(Message::Text(ack.into())).await.unwrap();
    assert_eq!(next_frame(&mut ws).await, json!({"closed": 1009}));
}

/// The same during a long replay, which never waits for the topic's next message: the close
/// comes once the page being sent is, not after the whole backlog (or, on a topic it never
/// catches up with, never: acks and pongs went unread meanwhile). With messages still on
/// their way, the close may come as a reset (seen in CI under a slow disk).
#[tokio::test]
async fn a_subscriber_frame_over_the_limit_during_a_replay_is_closed_with_1009_at_once() {
    use pubsub_node::limits::SUBSCRIBER_FRAME_BYTES_MAX;
    const BATCHES: u64 = 8;
    const BATCH: u64 = 125;
    let c = Cluster::start(Options { nodes: 1, ..Options::default() }).await;
    let l = leader_url(&c).await;
    post_raw(&format!("{l}/topics/t"), "").await.unwrap();
    // 64 MiB: far more than the socket buffers between the node and this test hold.
    let pad = "x".repeat(64 << 10);
    for _ in 0..BATCHES {
        let messages: Vec<Value> = (0..BATCH).map(|_| json!({"payload": pad})).collect();
        let r = post(&format!("{l}/topics/t/messages/batch"), &json!({"messages": messages})).await.unwrap();
        assert_eq!(r.status, 201, "{:?}", r.body);
    }
    let mut ws = ws_connect(&l, "/topics/t/subscribe?subscriber_id=s&cursor=0").await;
    assert_eq!(next_frame(&mut ws).await["subtype"], "subscribed");
    let ack = format!(r#"{{"type":"ack","sequence":0,"pad":"{}"}}"#, "x".repeat(SUBSCRIBER_FRAME_BYTES_MAX));
    ws.send(Message::Text(ack.into())).await.unwrap();
    let mut delivered = 0;
    let end = loop {
        let next = tokio::time::timeout(Duration::from_secs(10), ws.next()).await.expect("frame in time");
        match next.expect("stream open") {
            Ok(Message::Text(text)) => match serde_json::from_str::<Value>(&text).unwrap()["type"].as_str() {
                Some("message") => delivered += 1,
                other => panic!("a {other:?} frame"),
            },
            Ok(Message::Close(frame)) => break json!(frame.map(|f| u16::from(f.code))),
            Ok(_) => {}
            // The rest of the frame over the limit is not read, so the node's close comes as a
            // reset while messages are still on their way (API.md §7).
            Err(tokio_tungstenite::tungstenite::Error::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                break json!("reset")
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert!(end == json!(1009) || end == json!("reset"), "the subscription ended with {end}");
    assert!(delivered < BATCHES * BATCH, "closed only after the whole backlog ({delivered} messages)");
}

#[tokio::test]
async fn subscriptions_replay_then_follow_and_record_acks() {
    let c = Cluster::start(Options::default()).await;
    let l = leader_url(&c).await;
    let f = follower_url(&c).await;
    post_raw(&format!("{l}/topics/t"), "").await.unwrap();
    for i in 1..=3 {
        post(&format!("{l}/topics/t/messages"), &json!({"id": format!("m{i}"), "payload": i})).await.unwrap();
    }
    wait_applied(&f, "t", 3).await;

    // Refusals are plain HTTP errors.
    let r = get(&format!("{f}/topics/none/subscribe?subscriber_id=s")).await.unwrap();
    assert!(r.status == 404 && is_error_body(&r.body, "topic_not_found"));
    let r = get(&format!("{f}/topics/t/subscribe?cursor=0")).await.unwrap();
    assert!(r.status == 400 && is_error_body(&r.body, "invalid_request"));
    for bad in ["4", "x"] {
        let r = get(&format!("{f}/topics/t/subscribe?subscriber_id=s&cursor={bad}")).await.unwrap();
        assert!(r.status == 400 && is_error_body(&r.body, "invalid_cursor"), "{bad}");
    }

    // Replay from cursor 1 on a follower, then live.
    let mut ws = ws_connect(&f, "/topics/t/subscribe?subscriber_id=sub-1&cursor=1").await;
    let hello = next_frame(&mut ws).await;
    assert_eq!(hello, json!({"type":"control","subtype":"subscribed","topic":"t","cursor":1,"subscriber_id":"sub-1"}));
    for seq in 2..=3u64 {
        let m = next_frame(&mut ws).await;
        assert_eq!((&m["type"], &m["sequence"], &m["id"]), (&json!("message"), &json!(seq), &json!(format!("m{seq}"))));
    }
    // No cursor: only what is committed after subscribing.
    let mut live = ws_connect(&l, "/topics/t/subscribe?subscriber_id=sub-2").await;
    assert_eq!(next_frame(&mut live).await["cursor"], 3);
    post(&format!("{l}/topics/t/messages"), &json!({"id": "m4", "payload": 4})).await.unwrap();
    let m = next_frame(&mut ws).await;
    assert_eq!((&m["sequence"], &m["payload"], &m["topic"]), (&json!(4), &json!(4), &json!("t")));
    assert!(m["timestamp"].is_u64());
    assert_eq!(next_frame(&mut live).await["sequence"], 4);

    // Acks are recorded cluster-wide and resume with cursor=acked.
    ws.send(Message::Text(r#"{"type":"ack","sequence":3}"#.into())).await.unwrap();
    let listed = wait_acked(&l, "t", "sub-1", 3).await;
    assert_eq!(listed["lag"], 1);
    // The follower applies the ack entry a little after the leader; `cursor=acked` resolves
    // against the applied state of the node it is given to.
    wait_acked(&f, "t", "sub-1", 3).await;
    let mut again = ws_connect(&f, "/topics/t/subscribe?subscriber_id=sub-1&cursor=acked").await;
    assert_eq!(next_frame(&mut again).await["cursor"], 3);
    assert_eq!(next_frame(&mut again).await["sequence"], 4);

    // Delete: every subscriber gets topic_deleted and a normal close.
    delete(&format!("{l}/topics/t")).await.unwrap();
    for socket in [&mut ws, &mut live, &mut again] {
        assert_eq!(next_frame(socket).await, json!({"type":"control","subtype":"topic_deleted","topic":"t"}));
        assert_eq!(next_frame(socket).await, json!({"closed": 1000}));
    }
}

/// A recorded cursor can be forgotten (ext): it leaves the listing, `cursor=acked` starts from
/// 0 again, and forgetting it twice, or on a topic that is not there, is a 404.
#[tokio::test]
async fn a_recorded_cursor_can_be_forgotten() {
    let c = Cluster::start(Options { nodes: 1, ..Options::default() }).await;
    let l = leader_url(&c).await;
    post_raw(&format!("{l}/topics/t"), "").await.unwrap();
    for i in 1..=2 {
        post(&format!("{l}/topics/t/messages"), &json!({"payload": i})).await.unwrap();
    }
    for subscriber in ["gone", "kept"] {
        let mut ws = ws_connect(&l, &format!("/topics/t/subscribe?subscriber_id={subscriber}&cursor=0")).await;
        assert_eq!(next_frame(&mut ws).await["subtype"], "subscribed");
        ws.send(Message::Text(r#"{"type":"ack","sequence":2}"#.into())).await.unwrap();
        wait_acked(&l, "t", subscriber, 2).await;
        ws.close(None).await.unwrap();
    }
    let r = delete(&format!("{l}/topics/t/subscribers/gone")).await.unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        (&r.body["subscriber_id"], &r.body["acked_sequence"], &r.body["deleted"]),
        (&json!("gone"), &json!(2), &json!(true))
    );
    // Connected subscribers are listed too: "gone" drops out once the node has seen its close.
    wait_until("only kept listed", Duration::from_secs(10), || async {
        let listed = get(&format!("{l}/topics/t/subscribers")).await.ok()?.body;
        let ids: Vec<String> = listed["subscribers"]
            .as_array()?
            .iter()
            .filter_map(|s| s["subscriber_id"].as_str().map(str::to_string))
            .collect();
        (ids == ["kept"]).then_some(())
    })
    .await;
    let mut again = ws_connect(&l, "/topics/t/subscribe?subscriber_id=gone&cursor=acked").await;
    assert_eq!(next_frame(&mut again).await["cursor"], 0);

    let r = delete(&format!("{l}/topics/t/subscribers/gone")).await.unwrap();
    assert!(r.status == 404 && is_error_body(&r.body, "not_found"), "{r:?}");
    assert_eq!(r.body["details"], json!({"topic": "t", "subscriber_id": "gone"}));
    let r = delete(&format!("{l}/topics/none/subscribers/kept")).await.unwrap();
    assert!(r.status == 404 && is_error_body(&r.body, "topic_not_found"), "{r:?}");
    let r = delete(&format!("{l}/topics/t/subscribers/{}", "x".repeat(300))).await.unwrap();
    assert!(r.status == 400 && is_error_body(&r.body, "invalid_request"), "{r:?}");
    let r = delete(&format!("{l}/topics/t/subscribers/%FF")).await.unwrap();
    assert!(r.status == 400 && is_error_body(&r.body, "invalid_request"), "{r:?}");
    // API.md §7's order: the name first, the topic's existence before the id.
    for bad_name in ["", "%FF"] {
        let r = delete(&format!("{l}/topics/{bad_name}/subscribers/a")).await.unwrap();
        assert!(r.status == 400 && is_error_body(&r.body, "invalid_topic_name"), "{bad_name}: {r:?}");
    }
    let r = delete(&format!("{l}/topics/none/subscribers/{}", "x".repeat(300))).await.unwrap();
    assert!(r.status == 404 && is_error_body(&r.body, "topic_not_found"), "{r:?}");
}

#[tokio::test]
async fn retention_trims_and_subscribers_are_told() {
    let c = Cluster::start(Options::default()).await;
    let l = leader_url(&c).await;
    post(&format!("{l}/topics/r"), &json!({"metadata": {"retention_messages": 2}})).await.unwrap();
    for i in 1..=5 {
        post(&format!("{l}/topics/r/messages"), &json!({"id": format!("m{i}"), "payload": i})).await.unwrap();
    }
    let r = get(&format!("{l}/topics/r")).await.unwrap();
    assert_eq!((&r.body["message_count"], &r.body["current_sequence"]), (&json!(2), &json!(5)));
    let mut ws = ws_connect(&l, "/topics/r/subscribe?subscriber_id=s&cursor=0").await;
    next_frame(&mut ws).await;
    let expired = next_frame(&mut ws).await;
    assert_eq!(
        expired,
        json!({"type":"control","subtype":"messages_expired","topic":"r","requested_cursor":0,"first_available_sequence":4})
    );
    assert_eq!(next_frame(&mut ws).await["sequence"], 4);
    // A trimmed id is no longer a duplicate.
    let r = post(&format!("{l}/topics/r/messages"), &json!({"id": "m1", "payload": 1})).await.unwrap();
    assert_eq!(r.status, 201);
    let r = post(&format!("{l}/topics/r"), &json!({"metadata": {"retention_hours": "soon"}})).await.unwrap();
    assert_eq!(r.status, 400, "bad metadata is refused even for an existing topic");
    let r = post(&format!("{l}/topics/r2"), &json!({"metadata": {"retention_hours": -1}})).await.unwrap();
    assert!(r.status == 400 && is_error_body(&r.body, "invalid_request"));
}

#[tokio::test]
async fn every_error_has_a_body_and_the_node_reports_health() {
    let c = Cluster::start(Options::default()).await;
    let l = leader_url(&c).await;
    let r = get(&format!("{l}/nope")).await.unwrap();
    assert!(r.status == 404 && is_error_body(&r.body, "not_found"));
    // An empty topic name is a bad name, not a missing route.
    let r = post(&format!("{l}/topics/"), &json!({})).await.unwrap();
    assert!(r.status == 400 && is_error_body(&r.body, "invalid_topic_name"), "{r:?}");
    let r = get(&format!("{l}/topics//messages")).await.unwrap();
    assert!(r.status == 400 && is_error_body(&r.body, "invalid_topic_name"), "{r:?}");
    let r = http::send(http::client().put(format!("{l}/topics"))).await.unwrap();
    assert!(r.status == 405 && is_error_body(&r.body, "method_not_allowed"), "{r:?}");
    let r = get(&format!("{l}/raft")).await.unwrap();
    assert!(r.status == 401 && is_error_body(&r.body, "unauthorized"));
    let r = get(&format!("{l}/topics/t/subscribe?subscriber_id=s")).await.unwrap();
    assert_eq!(r.status, 404);
    assert_eq!(get(&format!("{l}/health")).await.unwrap().status, 200);
    for i in 0..3 {
        wait_until("ready", Duration::from_secs(10), || async {
            (get(&format!("{}/ready", c.url(i))).await.ok()?.status == 200).then_some(())
        })
        .await;
    }
    post_raw(&format!("{l}/topics/m"), "").await.unwrap();
    post(&format!("{l}/topics/m/messages"), &json!({"payload": 1})).await.unwrap();
    let text = http::client().get(format!("{l}/metrics")).send().await.unwrap().text().await.unwrap();
    for metric in [
        "pubsub_publishes_total",
        "pubsub_commit_latency_seconds_bucket",
        "pubsub_raft_term",
        "pubsub_subscribers",
        "pubsub_topic_current_sequence{topic=\"m\"} 1",
        "pubsub_leader_changes_total",
        "pubsub_log_fsync_seconds_bucket",
        "pubsub_log_fsynced_appends_total",
        "pubsub_raft_last_log_index",
        "pubsub_raft_log_bytes",
        "pubsub_storage_table_file_bytes{column_family=\"messages\"}",
        "pubsub_raft_inbound_bytes",
        "pubsub_acks_dropped_total 0",
    ] {
        assert!(text.contains(metric), "missing {metric} in\n{text}");
    }
    let fsyncs = text.lines().find_map(|l| l.strip_prefix("pubsub_log_fsync_seconds_count ")).unwrap();
    assert!(fsyncs.parse::<f64>().unwrap() >= 1.0, "the leader fsynced its entries: {fsyncs}");
    let entries = text.lines().find_map(|l| l.strip_prefix("pubsub_raft_log_entries ")).unwrap();
    assert!(entries.parse::<u64>().unwrap() >= 2, "membership, topic and message entries: {entries}");
    let log_bytes = text.lines().find_map(|l| l.strip_prefix("pubsub_raft_log_bytes ")).unwrap();
    assert!(log_bytes.parse::<u64>().unwrap() > 0, "the entries are in the log's files: {log_bytes}");
    let followers = text.lines().filter(|l| l.starts_with("pubsub_raft_follower_lag_entries{follower=")).count();
    assert_eq!(followers, 2, "the leader reports each follower's lag:\n{text}");
    let reachable =
        text.lines().filter(|l| l.starts_with("pubsub_raft_follower_reachable{follower=")).collect::<Vec<_>>();
    assert!(reachable.len() == 2 && reachable.iter().all(|l| l.ends_with(" 1")), "both followers answer:\n{text}");
}

/// `pubsub_raft_is_leader` is 1 on the leader alone, the one `/cluster` names, and 0 on a
/// leader cut off from both followers once it has gone two election timeouts without their
/// acknowledgement (openraft's own view kept it the leader forever); every node says which
/// build it runs, in `/cluster` and as `pubsub_build_info`, how much room its data dir has
/// left, and that its clock agrees with the voters'.
#[tokio::test]
async fn the_leader_alone_reports_itself_and_every_node_its_build() {
    let mut c = Cluster::start(Options::default()).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    for i in 0..3 {
        let url = c.url(i);
        let is_leader = http::metric(&url, "pubsub_raft_is_leader").await.expect("metric listed");
        assert_eq!(is_leader, u64::from(i == leader), "node {i}");
        let room = http::metric(&url, "pubsub_data_dir_available_bytes").await.expect("metric listed");
        assert!(room > 0, "node {i}");
        // One machine's clock: no node is off the voters' median.
        let offset = http::metric(&url, "pubsub_clock_offset_milliseconds").await.expect("metric listed");
        assert_eq!(offset, 0, "node {i}");
        let (_, info) = http::get_json(&format!("{url}/cluster")).await.unwrap();
        let version = info["version"].as_str().expect("version in /cluster").to_string();
        let commit = info["commit"].as_str().expect("commit in /cluster").to_string();
        assert!(!commit.is_empty(), "node {i}");
        let text = reqwest::get(format!("{url}/metrics")).await.unwrap().text().await.unwrap();
        let line = format!("pubsub_build_info{{version=\"{version}\",commit=\"{commit}\"}} 1");
        assert!(text.lines().any(|l| l == line), "no {line} in /metrics of node {i}");
    }
    for follower in (0..3).filter(|&i| i != leader) {
        c.kill(follower);
    }
    let l = c.url(leader);
    wait_until("the cut-off leader no longer reports itself", Duration::from_secs(20), || async {
        (http::metric(&l, "pubsub_raft_is_leader").await? == 0).then_some(())
    })
    .await;
}

/// `/metrics` lists every topic in every scrape, also when scrapes run at once (each render
/// fills and empties the per-topic series: two at once used to encode each other's half-filled
/// ones), and its body stays within the room reserved for it in the metrics budget (one series
/// per topic, names at their longest), a budget of its own: none of it in the read budget.

#[tokio::test]
async fn metrics_list_every_topic_within_their_reserved_room() {
    use pubsub_node::metrics::Metrics;
    const TOPICS: usize = 40;
    const SCRAPES: usize = 8;
    let c = Cluster::start(Options { nodes: 1, ..Options::default() }).await;
    let l = leader_url(&c).await;
    let names: Vec<String> = (0..TOPICS).map(|i| format!("{i:03}{}", "t".repeat(252))).collect();
    for name in &names {
        assert_eq!(post_raw(&format!("{l}/topics/{name}"), "").await.unwrap().status, 201);
        assert_eq!(post(&format!("{l}/topics/{name}/messages"), &json!({"payload": 1})).await.unwrap().status, 201);
    }
    let scrapes = (0..SCRAPES)
        .map(|_| async { http::client().get(format!("{l}/metrics")).send().await.unwrap().text().await.unwrap() });
    for text in futures_util::future::join_all(scrapes).await {
        for name in &names {
            let series = format!("pubsub_topic_current_sequence{{topic=\"{name}\"}} 1");
            assert!(text.contains(&series), "missing {series} in\n{text}");
        }
        assert!(text.len() <= Metrics::rendered_bytes_max(TOPICS), "{} bytes", text.len());
    }
    assert_eq!(read_pages_bytes(&l).await, 0, "a scrape holds nothing of the read budget");
}

#[tokio::test]
async fn a_single_node_with_no_peers_is_a_working_cluster() {
    let c = Cluster::start(Options { nodes: 1, secret: None, ..Default::default() }).await;
    let l = c.url(0);
    let r = get(&format!("{l}/cluster")).await.unwrap();
    assert_eq!((&r.body["role"], &r.body["leader_id"]), (&json!("leader"), &json!("node-1")));
    post_raw(&format!("{l}/topics/t"), "").await.unwrap();
    let r = post(&format!("{l}/topics/t/messages"), &json!({"payload": 1})).await.unwrap();
    assert_eq!(r.status, 201);
}

#[tokio::test]
async fn publishing_over_a_websocket_acks_each_message_with_its_sequence() {
    let c = Cluster::start(Options::default()).await;
    let l = leader_url(&c).await;
    let f = follower_url(&c).await;
    post_raw(&format!("{l}/topics/w"), "").await.unwrap();
    let r = get(&format!("{f}/topics/w/publish")).await.unwrap();
    assert_eq!(r.status, 307, "only the leader takes publishes");
    let mut ws = ws_connect(&l, "/topics/w/publish").await;
    for i in 0..50 {
        let frame = json!({"type": "publish", "ref": i, "id": format!("m{i}"), "payload": {"i": i}});
        ws.send(Message::Text(frame.to_string().into())).await.unwrap();
    }
    ws.send(Message::Text(json!({"type": "publish", "ref": "dup", "id": "m0", "payload": 1}).to_string().into()))
        .await
        .unwrap();
    ws.send(Message::Text("not json".into())).await.unwrap();
    // An array is no frame, even one that lists a frame's fields in order; it has no `ref`.
    ws.send(Message::Text(r#"["publish","r-1","arr",{"a":1},null]"#.into())).await.unwrap();
    // JSON, but an id of the wrong type: its error still names its ref.
    ws.send(Message::Text(json!({"type": "publish", "ref": "typed", "id": 5, "payload": 1}).to_string().into()))
        .await
        .unwrap();
    // A binary frame is not read, but answered: a client waiting for its answer is not left
    // hanging.
    ws.send(Message::Binary(json!({"type": "publish", "ref": "bin", "payload": 1}).to_string().into_bytes().into()))
        .await
        .unwrap();
    let mut sequences = std::collections::BTreeMap::new();
    let mut errors = Vec::new();
    while sequences.len() + errors.len() < 55 {
        let frame = next_frame(&mut ws).await;
        match frame["type"].as_str() {
            Some("ack") => {
                sequences.insert(frame["ref"].as_u64().unwrap(), frame["sequence"].as_u64().unwrap());
            }
            Some("error") => errors.push(frame),
            other => panic!("unexpected frame {other:?}"),
        }
    }
    let mut seqs: Vec<u64> = sequences.values().copied().collect();
    seqs.sort();
    assert_eq!(seqs, (1..=50).collect::<Vec<u64>>());
    let dup = errors.iter().find(|e| e["ref"] == "dup").expect("duplicate answered");
    assert_eq!((&dup["error"], &dup["existing_sequence"]), (&json!("duplicate_message_id"), &json!(sequences[&0])));
    let unreferenced = errors.iter().filter(|e| e["ref"].is_null() && e["error"] == "invalid_request").count();
    assert_eq!(unreferenced, 3, "the frame that is not JSON, the array and the binary one: {errors:?}");
    let typed = errors.iter().find(|e| e["ref"] == "typed").expect("the wrong-typed frame answered with its ref");
    assert_eq!(typed["error"], "invalid_request");
    // An error echoes `ref` exactly as written, as an ack does, even a number no float holds.
    let big_ref = r#"{"type":"publish","ref":18446744073709551616,"payload":1e400}"#;
    ws.send(Message::Text(big_ref.into())).await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), ws.next()).await.unwrap().unwrap().unwrap();
    let answer = answer.into_text().unwrap();
    assert!(answer.starts_with(r#"{"type":"error","ref":18446744073709551616,"#), "{answer}");
    assert_eq!(serde_json::from_str::<Value>(&answer).unwrap()["error"], "invalid_request");
    // A `ref` over 256 bytes is not echoed (every answer would carry it) and not published.
    let long_ref = json!({"type": "publish", "ref": "r".repeat(300), "id": "long-ref", "payload": 1});
    ws.send(Message::Text(long_ref.to_string().into())).await.unwrap();
    let answer = next_frame(&mut ws).await;
    assert_eq!(
        (&answer["type"], &answer["ref"], &answer["error"]),
        (&json!("error"), &Value::Null, &json!("invalid_request"))
    );
    let at_limit = json!({"type": "publish", "ref": "r".repeat(254), "id": "ref-at-limit", "payload": {"i": 50}});
    ws.send(Message::Text(at_limit.to_string().into())).await.unwrap();
    let answer = next_frame(&mut ws).await;
    assert_eq!((&answer["type"], &answer["ref"]), (&json!("ack"), &json!("r".repeat(254))), "{answer}");
    sequences.insert(50, answer["sequence"].as_u64().unwrap());
    // The parser's message quotes the bad value: cut short, a megabyte of it is not echoed.
    let huge = json!({"type": "publish", "ref": "huge", "payload": 1, "timestamp": "t".repeat(500_000)});
    ws.send(Message::Text(huge.to_string().into())).await.unwrap();
    let answer = next_frame(&mut ws).await;
    assert_eq!((&answer["ref"], &answer["error"]), (&json!("huge"), &json!("invalid_request")));
    assert!(answer.to_string().len() < 1000, "{} bytes", answer.to_string().len());
    // Every acked message is readable with the sequence it was acked with.
    let (_, body) = http::get_json(&format!("{l}/topics/w/messages?after=0&limit=100")).await.unwrap();
    for m in body["messages"].as_array().unwrap() {
        let i = m["payload"]["i"].as_u64().unwrap();
        assert_eq!(m["sequence"].as_u64().unwrap(), sequences[&i]);
    }
}

/// Frames written in one burst reach the leader together and are proposed as one group
/// (`PUBLISH_WS_GROUP_FRAMES_MAX`): each still gets its own answer, a duplicate inside the
/// burst is found, and a bad frame fails alone.
#[tokio::test]
async fn a_burst_of_publish_frames_is_answered_frame_by_frame() {
    let c = Cluster::start(Options::default()).await;
    let l = leader_url(&c).await;
    let mut ws = publishing_socket(&l, "burst").await;
    let mut frames: Vec<Value> =
        (0..40).map(|i| json!({"type": "publish", "ref": i, "id": format!("b{i}"), "payload": {"i": i}})).collect();
    frames.push(json!({"type": "publish", "ref": "again", "id": "b3", "payload": {"i": 3}}));
    frames.push(json!({"type": "publish", "ref": "no-payload", "id": "x"}));
    frames.push(json!({"type": "subscribe", "ref": "wrong-type", "payload": 1}));
    frames.push(json!({"type": "publish", "ref": "no-id", "payload": {"i": 40}}));
    // One write for the whole burst: the server reads the frames together.
    for frame in &frames {
        ws.feed(Message::Text(frame.to_string().into())).await.unwrap();
    }
    ws.flush().await.unwrap();

    let mut answers = std::collections::HashMap::new();
    while answers.len() < frames.len() {
        let frame = next_frame(&mut ws).await;
        let key = frame["ref"].to_string();
        assert!(answers.insert(key, frame).is_none(), "one answer per frame");
    }
    let answer = |r: Value| answers[&r.to_string()].clone();
    assert_eq!(answer(json!("no-payload"))["error"], "invalid_request");
    assert_eq!(answer(json!("wrong-type"))["error"], "invalid_request");
    let generated = answer(json!("no-id"));
    assert_eq!(generated["type"], "ack");
    assert!(generated["id"].as_str().is_some_and(|id| !id.is_empty()), "the leader generated an id");

    // "b3" was sent twice: one frame stored it, the other is its duplicate.
    let (first, again) = (answer(json!(3)), answer(json!("again")));
    let (stored, duplicate) = if first["type"] == "ack" { (first, again) } else { (again, first) };
    assert_eq!(stored["type"], "ack");
    assert_eq!(
        (&duplicate["error"], &duplicate["existing_sequence"]),
        (&json!("duplicate_message_id"), &stored["sequence"])
    );

    // 41 messages stored (b0..b39 and the generated one), with sequences 1..=41, each readable
    // under the sequence its ack named.
    let acks: Vec<&Value> = answers.values().filter(|a| a["type"] == "ack").collect();
    let mut sequences: Vec<u64> = acks.iter().map(|a| a["sequence"].as_u64().unwrap()).collect();
    sequences.sort();
    assert_eq!(sequences, (1..=41).collect::<Vec<u64>>());
    let (_, body) = http::get_json(&format!("{l}/topics/burst/messages?after=0&limit=100")).await.unwrap();
    let stored: Vec<&Value> = body["messages"].as_array().unwrap().iter().collect();
    assert_eq!(stored.len(), 41);
    for ack in acks {
        let m = stored.iter().find(|m| m["sequence"] == ack["sequence"]).expect("acked message is stored");
        assert_eq!(m["id"], ack["id"]);
    }
}

/// A node serves at most `PUBLISH_WS_CONNECTIONS_MAX` publishing WebSockets: the next upgrade
/// is answered `503 unavailable` (each connection may hold megabytes outside the node's
/// budgets), and a place comes back when a connection ends.
#[tokio::test]
async fn publishing_connections_are_bounded_per_node() {
    use pubsub_node::limits::PUBLISH_WS_CONNECTIONS_MAX;
    use tokio_tungstenite::tungstenite::Error as WsError;
    let c = Cluster::start(Options { nodes: 1, ..Options::default() }).await;
    let l = leader_url(&c).await;
    let mut open = vec![publishing_socket(&l, "p").await];
    while open.len() < PUBLISH_WS_CONNECTIONS_MAX {
        open.push(ws_connect(&l, "/topics/p/publish").await);
    }
    assert_eq!(http::metric(&l, "pubsub_publishing_connections").await, Some(PUBLISH_WS_CONNECTIONS_MAX as u64));
    let url = format!("{}/topics/p/publish", l.replacen("http://", "ws://", 1));
    match tokio_tungstenite::connect_async(url.as_str()).await {
        Err(WsError::Http(response)) => {
            assert_eq!(response.status().as_u16(), 503);
            // tungstenite keeps only the body bytes that came with the headers.
            if let Some(body) = response.body().as_deref().and_then(|b| serde_json::from_slice::<Value>(b).ok()) {
                assert!(is_error_body(&body, "unavailable"), "{body}");
            }
        }
        other => panic!("the connection past the bound was not refused: {:?}", other.map(|_| ())),
    }
    // The connections still publish.
    let last = open.last_mut().unwrap();
    last.send(Message::text(json!({"type": "publish", "ref": 1, "payload": "x"}).to_string())).await.unwrap();
    assert_eq!(next_frame(last).await["type"], "ack");
    drop(open.pop());
    let mut again = wait_until("a place given back", Duration::from_secs(10), || async {
        tokio_tungstenite::connect_async(url.as_str()).await.ok().map(|(ws, _)| ws)
    })
    .await;
    again.send(Message::text(json!({"type": "publish", "ref": 2, "payload": "y"}).to_string())).await.unwrap();
    assert_eq!(next_frame(&mut again).await["sequence"], 2);
}

/// Publishes 16 MB (4,000 messages of 4 KB) to `topic` on the leader `l`: a subscriber that
/// does not read yet is still replaying them whatever happens meanwhile. Returns the last
/// sequence.
async fn publish_unread_backlog(l: &str, topic: &str) -> u64 {
    let big = "x".repeat(4000);
    let mut published = 0u64;
    for b in 0..4 {
        let messages: Vec<Value> = (0..1000).map(|i| json!({"id": format!("m{b}-{i}"), "payload": big})).collect();
        let r = post(&format!("{l}/topics/{topic}/messages/batch"), &json!({"messages": messages})).await.unwrap();
        assert_eq!(r.status, 201, "{:?}", r.body);
        published += 1000;
    }
    published
}

/// Reads messages `sequences` from `ws` in order, then `topic_deleted` for `topic` and a
/// normal close.
async fn expect_messages_then_deleted(ws: &mut Ws, sequences: std::ops::RangeInclusive<u64>, topic: &str) {
    for sequence in sequences {
        let frame = next_frame(ws).await;
        assert_eq!(frame["sequence"], sequence, "{frame}");
    }
    assert_eq!(next_frame(ws).await, json!({"type":"control","subtype":"topic_deleted","topic":topic}));
    assert_eq!(next_frame(ws).await, json!({"closed": 1000}));
}

/// A topic deleted and created again while a subscriber is still replaying it: the subscriber
/// gets what came before the deletion, then `topic_deleted` and a normal close, never the
/// new incarnation's messages on the same connection (API.md §3).
#[tokio::test]
async fn a_subscriber_behind_a_delete_and_recreate_is_told_of_the_delete() {
    let c = Cluster::start(Options::default()).await;
    let l = leader_url(&c).await;
    post(&format!("{l}/topics/d"), &json!({})).await.unwrap();
    // 16 MB the subscriber does not read yet: its session is still replaying when the topic
    // is deleted and created again, whatever the timing.
    let published = publish_unread_backlog(&l, "d").await;
    let mut ws = ws_connect(&l, "/topics/d/subscribe?subscriber_id=s&cursor=0").await;
    // Sent once the session watches the topic: the deletion below comes after.
    assert_eq!(next_frame(&mut ws).await["subtype"], "subscribed");
    assert_eq!(delete(&format!("{l}/topics/d")).await.unwrap().status, 200);
    assert_eq!(post(&format!("{l}/topics/d"), &json!({})).await.unwrap().status, 201);
    let r = post(&format!("{l}/topics/d/messages"), &json!({"id": "after", "payload": 1})).await.unwrap();
    assert_eq!(r.body["sequence"], published + 1);
    expect_messages_then_deleted(&mut ws, 1..=published, "d").await;
}

/// A subscriber whose connection dropped before its topic was deleted resumes with its cursor
/// and gets what it is owed, then `topic_deleted`, as it would have connected: a dropped
/// connection never turns a deletion into a silent gap; so does a reader paging with `after`. A
/// subscription or read the deleted topic owes nothing is `404` (API.md §3, §5).
#[tokio::test]
async fn a_subscriber_resuming_after_a_delete_gets_what_came_before_it() {
    let c = Cluster::start(Options::default()).await;
    let l = leader_url(&c).await;
    let f = follower_url(&c).await;
    post(&format!("{l}/topics/g"), &json!({})).await.unwrap();
    for i in 1..=3 {
        let r = post(&format!("{l}/topics/g/messages"), &json!({"id": format!("m{i}"), "payload": i})).await.unwrap();
        assert_eq!(r.body["sequence"], i);
    }
    let mut acked = ws_connect(&f, "/topics/g/subscribe?subscriber_id=a&cursor=0").await;
    assert_eq!(next_frame(&mut acked).await["subtype"], "subscribed");
    assert_eq!(next_frame(&mut acked).await["sequence"], 1);
    acked.send(Message::text(json!({"type": "ack", "sequence": 1}).to_string())).await.unwrap();
    wait_acked(&f, "g", "a", 1).await;
    drop(acked);
    let r = delete(&format!("{l}/topics/g")).await.unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    wait_until("the follower applies the deletion", Duration::from_secs(10), || async {
        (get(&format!("{f}/topics/g")).await.ok()?.status == 404).then_some(())
    })
    .await;

    for cursor in ["1", "acked"] {
        let mut ws = ws_connect(&f, &format!("/topics/g/subscribe?subscriber_id=a&cursor={cursor}")).await;
        assert_eq!(next_frame(&mut ws).await["cursor"], 1, "cursor={cursor}");
        expect_messages_then_deleted(&mut ws, 2..=3, "g").await;
    }
    for query in [
        "subscriber_id=a&cursor=3",
        "subscriber_id=a&cursor=9",
        "subscriber_id=a",
        "subscriber_id=a&cursor=latest",
        "cursor=",
    ] {
        let r = get(&format!("{f}/topics/g/subscribe?{query}")).await.unwrap();
        assert!(r.status == 404 && is_error_body(&r.body, "topic_not_found"), "{query}: {r:?}");
    }
    // Owed something only once the query is read (API.md §7's order).
    let r = get(&format!("{f}/topics/g/subscribe?cursor=0")).await.unwrap();
    assert!(r.status == 400 && is_error_body(&r.body, "invalid_request"), "{r:?}");
    // A reader paging with `after` likewise, then 404 once nothing is owed.
    let r = get(&format!("{f}/topics/g/messages?after=1&wait_ms=5000")).await.unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    let sequences: Vec<&Value> = r.body["messages"].as_array().unwrap().iter().map(|m| &m["sequence"]).collect();
    assert_eq!((sequences, &r.body["next_cursor"]), (vec![&json!(2), &json!(3)], &json!(3)));
    let r = get(&format!("{f}/topics/g/messages")).await.unwrap();
    assert_eq!(r.body["messages"].as_array().map(Vec::len), Some(3), "no after is after=0: {r:?}");
    for query in ["after=3", "after=3&wait_ms=100", "after=x"] {
        let r = get(&format!("{f}/topics/g/messages?{query}")).await.unwrap();
        assert!(r.status == 404 && is_error_body(&r.body, "topic_not_found"), "{query}: {r:?}");
    }

    // A cursor past the end, waited for, of a topic deleted meanwhile (or before) is owed
    // nothing either.
    post(&format!("{l}/topics/h"), &json!({})).await.unwrap();
    let ahead = tokio::spawn({
        let l = l.clone();
        async move { get(&format!("{l}/topics/h/subscribe?subscriber_id=s&cursor=5")).await.unwrap() }
    });
    assert_eq!(delete(&format!("{l}/topics/h")).await.unwrap().status, 200);
    let r = ahead.await.unwrap();
    assert!(r.status == 404 && is_error_body(&r.body, "topic_not_found"), "{r:?}");
}

/// A cursor ahead of a follower that then applies the messages up to it and the topic's
/// deletion together is owed what came before the deletion, whichever it sees first: the
/// request (the wait for the cursor ends in the deletion) or the catching up.
#[tokio::test]
async fn a_cursor_ahead_of_a_follower_that_then_applies_a_deletion_is_served_up_to_it() {
    let c = Cluster::start(Options::default()).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let (l, behind) = (c.url(leader), (leader + 1) % 3);
    let f = c.url(behind);
    post(&format!("{l}/topics/t"), &json!({})).await.unwrap();
    for i in 1..=5 {
        if i == 3 {
            wait_applied(&f, "t", 2).await;
            c.pause(behind);
        }
        let r = post(&format!("{l}/topics/t/messages"), &json!({"id": format!("m{i}"), "payload": i})).await.unwrap();
        assert_eq!(r.body["sequence"], i);
    }
    assert_eq!(delete(&format!("{l}/topics/t")).await.unwrap().status, 200);
    // Waits in the frozen follower's listen queue until it is resumed.
    let subscribing = tokio::spawn({
        let f = f.clone();
        async move { ws_connect(&f, "/topics/t/subscribe?subscriber_id=s&cursor=3").await }
    });
    c.resume(behind);
    let mut ws = subscribing.await.unwrap();
    assert_eq!(next_frame(&mut ws).await["cursor"], 3);
    expect_messages_then_deleted(&mut ws, 4..=5, "t").await;
}

/// A subscription started on a deleted topic that is created again while it replays goes on
/// into the new incarnation, with no gap and no notice, as one started after the re-creation
/// would (a node that lags the re-creation must not end a live topic's stream); the next
/// deletion ends it (API.md §3).
#[tokio::test]
async fn a_subscription_started_on_a_deleted_topic_goes_on_if_it_is_created_again() {
    let c = Cluster::start(Options::default()).await;
    let l = leader_url(&c).await;
    post(&format!("{l}/topics/d"), &json!({})).await.unwrap();
    // 16 MB the subscriber does not read yet: its session is still replaying when the topic
    // is created again, whatever the timing.
    let published = publish_unread_backlog(&l, "d").await;
    assert_eq!(delete(&format!("{l}/topics/d")).await.unwrap().status, 200);
    let mut ws = ws_connect(&l, "/topics/d/subscribe?subscriber_id=s&cursor=0").await;
    assert_eq!(next_frame(&mut ws).await["subtype"], "subscribed");
    assert_eq!(post(&format!("{l}/topics/d"), &json!({})).await.unwrap().status, 201);
    let r = post(&format!("{l}/topics/d/messages"), &json!({"id": "after", "payload": 1})).await.unwrap();
    assert_eq!(r.body["sequence"], published + 1);
    assert_eq!(delete(&format!("{l}/topics/d")).await.unwrap().status, 200);
    expect_messages_then_deleted(&mut ws, 1..=published + 1, "d").await;
}

/// A publish frame over the size limit is answered `payload_too_large` before the connection
/// closes, as the same body is answered 413 over HTTP (API.md §8); a text frame that is not
/// UTF-8 (so not JSON) is answered `invalid_request` before a 1007 close (RFC 6455 §8.1).
#[tokio::test]
async fn a_publish_frame_over_the_size_limit_or_not_utf8_is_answered_before_the_close() {
    let c = Cluster::start(Options::default()).await;
    let l = leader_url(&c).await;
    let mut ws = publishing_socket(&l, "big").await;
    let huge = "x".repeat(2 * 1024 * 1024);
    let frame = json!({"type": "publish", "ref": 1, "id": "huge", "payload": huge});
    ws.send(Message::Text(frame.to_string().into())).await.unwrap();
    let answer = next_frame(&mut ws).await;
    assert_eq!((&answer["type"], &answer["error"]), (&json!("error"), &json!("payload_too_large")), "{answer}");
    assert_eq!(next_frame(&mut ws).await, json!({"closed": 1009}), "then a close that says why");
    let r = get(&format!("{l}/topics/big")).await.unwrap();
    assert_eq!(r.body["current_sequence"], 0, "nothing was stored");

    use tokio_tungstenite::tungstenite::protocol::frame::{coding::OpCode, Frame};
    let mut ws = publishing_socket(&l, "big").await;
    let not_utf8 = Frame::message(
        b"{\"type\":\"publish\",\"ref\":1,\"payload\":\"\xff\"}".to_vec(),
        OpCode::Data(tokio_tungstenite::tungstenite::protocol::frame::coding::Data::Text),
        true,
    );
    ws.send(Message::Frame(not_utf8)).await.unwrap();
    let answer = next_frame(&mut ws).await;
    assert_eq!((&answer["error"], &answer["ref"]), (&json!("invalid_request"), &Value::Null), "{answer}");
    assert_eq!(next_frame(&mut ws).await, json!({"closed": 1007}), "then a close that says why");
    let r = get(&format!("{l}/topics/big")).await.unwrap();
    assert_eq!(r.body["current_sequence"], 0, "nothing was stored");
}

/// `pubsub_read_pages_bytes` from `url`'s metrics.
async fn read_pages_bytes(url: &str) -> u64 {
    http::metric(url, "pubsub_read_pages_bytes").await.expect("metric listed")
}

#[tokio::test]
async fn pages_read_for_a_subscriber_that_stopped_reading_count_until_sent() {
    let c = Cluster::start(Options { nodes: 1, ..Options::default() }).await;
    let l = leader_url(&c).await;
    post_raw(&format!("{l}/topics/big"), "").await.unwrap();
    // Far more than the sockets' buffers hold, so the session blocks with a page in hand.
    let payload = "x".repeat(900 * 1024);
    let count = 40u64;
    for i in 1..=count {
        let r = post(&format!("{l}/topics/big/messages"), &json!({"id": format!("m{i}"), "payload": payload}))
            .await
            .unwrap();
        assert_eq!(r.status, 201);
    }
    assert_eq!(read_pages_bytes(&l).await, 0);

    let mut ws = ws_connect(&l, "/topics/big/subscribe?subscriber_id=slow&cursor=0").await;
    // A page: two messages (1 MiB of payloads and the one that crosses it) and their frames,
    // not the worst case of about 5 MiB reserved for the read.
    wait_until("a page held for the reader", Duration::from_secs(10), || async {
        (1024 * 1024..3 * 1024 * 1024).contains(&read_pages_bytes(&l).await).then_some(())
    })
    .await;

    // Read everything: every message in order, then the budget is whole again.
    assert_eq!(next_frame(&mut ws).await["subtype"], "subscribed");
    for sequence in 1..=count {
        assert_eq!(next_frame(&mut ws).await["sequence"], sequence);
    }
    wait_until("pages given back", Duration::from_secs(10), || async {
        (read_pages_bytes(&l).await == 0).then_some(())
    })
    .await;

    // A read page is counted too, and given back once sent.
    let (status, body) = http::get_json(&format!("{l}/topics/big/messages?after=0&limit=1000")).await.unwrap();
    assert_eq!(status, 200);
    assert!(body["messages"].as_array().unwrap().len() >= 4);
    wait_until("read page given back", Duration::from_secs(10), || async {
        (read_pages_bytes(&l).await == 0).then_some(())
    })
    .await;
}

/// A connection from `ip` to the node at `url` with a small receive buffer, so that a client
/// that reads nothing soon leaves the node's writes waiting.
async fn small_buffered_connection(url: &str, ip: &str) -> tokio::net::TcpStream {
    let addr: std::net::SocketAddr = url.trim_start_matches("http://").parse().unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.bind(format!("{ip}:0").parse().unwrap()).unwrap();
    socket.connect(addr).await.unwrap()
}

/// `requests` connections from `ip` to the node at `url`, each asking for the 8 messages of
/// topic `big` (1 MB each, see below) and reading nothing, with small socket buffers.
async fn unread_page_requests(url: &str, ip: &str, requests: usize) -> Vec<tokio::net::TcpStream> {
    use tokio::io::AsyncWriteExt;
    let mut streams = Vec::new();
    for _ in 0..requests {
        let mut stream = small_buffered_connection(url, ip).await;
        stream.write_all(b"GET /topics/big/messages?limit=8 HTTP/1.1\r\nhost: node\r\n\r\n").await.unwrap();
        streams.push(stream);
    }
    streams
}

/// A single node holding topic `big` with 8 messages of 1 MB; its URL.
async fn node_with_big_messages() -> (Cluster, String) {
    let c = Cluster::start(Options { nodes: 1, ..Options::default() }).await;
    let l = leader_url(&c).await;
    post_raw(&format!("{l}/topics/big"), "").await.unwrap();
    let payload = "x".repeat(1_000_000);
    let messages: Vec<Value> = (0..8).map(|i| json!({"id": format!("m{i}"), "payload": payload})).collect();
    let r = post(&format!("{l}/topics/big/messages/batch"), &json!({ "messages": messages })).await.unwrap();
    assert_eq!(r.status, 201);
    (c, l)
}

/// Readers from six addresses that read nothing fill the node's whole read budget (each
/// address up to its share): `/metrics`, whose body has a budget of its own, still answers at
/// once and shows the budget full. Before, the scrape waited 10 s for room, then got a 503.
#[tokio::test]
async fn metrics_answer_while_readers_fill_the_read_budget() {
    use pubsub_node::limits::{READ_PAGES_BYTES_MAX, READ_PAGE_BYTES_RESERVED};
    let (_c, l) = node_with_big_messages().await;
    let mut hogs = Vec::new();
    for ip in ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6", "127.0.0.7"] {
        hogs.push(unread_page_requests(&l, ip, 100).await);
    }
    // No room left for one more page.
    let started = wait_until("the read budget full", Duration::from_secs(30), || async {
        let started = std::time::Instant::now();
        let held = read_pages_bytes(&l).await;
        (held > (READ_PAGES_BYTES_MAX - READ_PAGE_BYTES_RESERVED) as u64).then_some(started)
    })
    .await;
    // Waiting for room would take the full 10 s.
    assert!(started.elapsed() < Duration::from_secs(5), "scraped after {:?}", started.elapsed());
    drop(hogs);
    wait_until("the hogs' pages given back", Duration::from_secs(10), || async {
        (read_pages_bytes(&l).await == 0).then_some(())
    })
    .await;
}

/// A client that asks for pages of messages and never reads them holds at most its address's
/// share of the node's read budget (64 MiB of 256), so another client still reads at once;
/// and what it held comes back when its connections go. Before, enough such requests from
/// one client held the whole budget, and every other reader waited 10 s, then got a 503.
/// (A connection that stays open holds its pages only until its writes have waited 60 s:
/// `io_deadline.rs` tests that.)
#[tokio::test]
async fn a_client_that_does_not_read_its_pages_holds_only_its_share() {
    use pubsub_node::limits::READ_PAGES_BYTES_PER_CLIENT_MAX;
    /// Each asks for about 5 MB, of which the kernel's socket buffers take some 3 MB: together
    /// still far more than one client's share.
    const HOG_REQUESTS: usize = 100;
    let (_c, l) = node_with_big_messages().await;

    // The hog comes from another address, with small socket buffers, and reads nothing.
    let hog = unread_page_requests(&l, "127.0.0.2", HOG_REQUESTS).await;
    let held = wait_until("the hog's pages held", Duration::from_secs(10), || async {
        let held = read_pages_bytes(&l).await;
        (held > READ_PAGES_BYTES_PER_CLIENT_MAX as u64 / 2).then_some(held)
    })
    .await;
    assert!(held <= READ_PAGES_BYTES_PER_CLIENT_MAX as u64, "the hog holds {held} bytes, past its share");

    // Another client reads at once.
    let started = std::time::Instant::now();
    let (status, body) = http::get_json(&format!("{l}/topics/big/messages?limit=2")).await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["messages"].as_array().map(Vec::len), Some(2));
    // Waiting on the hog would take the full 10 s.
    assert!(started.elapsed() < Duration::from_secs(5), "read after {:?}", started.elapsed());
    // Still within its share, the hog's later requests having waited.
    assert!(read_pages_bytes(&l).await <= READ_PAGES_BYTES_PER_CLIENT_MAX as u64);

    drop(hog);
    wait_until("the hog's pages given back", Duration::from_secs(10), || async {
        (read_pages_bytes(&l).await == 0).then_some(())
    })
    .await;
}

/// `count` subscriptions to topic `big` from `ip`, from its start, each reading nothing past
/// the handshake, with small socket buffers.
async fn unread_subscriptions(url: &str, ip: &str, count: usize) -> Vec<Ws> {
    let mut sockets = Vec::new();
    for i in 0..count {
        let stream = small_buffered_connection(url, ip).await;
        let url = format!("{}/topics/big/subscribe?subscriber_id=hog-{i}&cursor=0", url.replace("http://", "ws://"));
        let (ws, _) =
            tokio_tungstenite::client_async(url, tokio_tungstenite::MaybeTlsStream::Plain(stream)).await.unwrap();
        sockets.push(ws);
    }
    sockets
}

/// A client whose many subscriptions read nothing holds at most its address's share of the
/// node's read budget, pages served from the shared frame cache included, so another client
/// still reads at once. Before, a page from the cache counted against the node's budget alone,
/// once per session: a hundred slow sessions of one client filled it with the same shared
/// frames, and every other client's reads from storage waited.
#[tokio::test]
async fn a_client_whose_subscriptions_read_nothing_holds_only_its_share() {
    use pubsub_node::limits::READ_PAGES_BYTES_PER_CLIENT_MAX;
    /// Each holds a page of about 2 MB once its socket's buffers are full: together far more
    /// than one client's share, and than the node's whole budget.
    const HOG_SUBSCRIPTIONS: usize = 150;
    let (_c, l) = node_with_big_messages().await;
    // A subscriber that reads puts every frame in the cache, where the hog's sessions find them.
    let mut reader = ws_connect(&l, "/topics/big/subscribe?subscriber_id=reader&cursor=0").await;
    assert_eq!(next_frame(&mut reader).await["subtype"], "subscribed");
    for sequence in 1..=8 {
        assert_eq!(next_frame(&mut reader).await["sequence"], sequence);
    }
    let hog = unread_subscriptions(&l, "127.0.0.2", HOG_SUBSCRIPTIONS).await;
    // Once every session is blocked on its socket with a page in hand, what it holds stops
    // changing: the same over five scrapes 100 ms apart.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut seen: Vec<u64> = Vec::new();
    let held = loop {
        assert!(std::time::Instant::now() < deadline, "the hog's pages never settled: {seen:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        seen.push(read_pages_bytes(&l).await);
        let last = &seen[seen.len().saturating_sub(5)..];
        if last.len() == 5 && last.iter().all(|&b| b == last[0]) && last[0] > READ_PAGES_BYTES_PER_CLIENT_MAX as u64 / 2
        {
            break last[0];
        }
    };
    assert!(held <= READ_PAGES_BYTES_PER_CLIENT_MAX as u64, "the hog holds {held} bytes, past its share");

    let started = std::time::Instant::now();
    let (status, body) = http::get_json(&format!("{l}/topics/big/messages?limit=2")).await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(started.elapsed() < Duration::from_secs(5), "read after {:?}", started.elapsed());
    let held = read_pages_bytes(&l).await;
    assert!(held <= READ_PAGES_BYTES_PER_CLIENT_MAX as u64, "the hog holds {held} bytes, past its share");

    drop(hog);
    wait_until("the hog's pages given back", Duration::from_secs(10), || async {
        (read_pages_bytes(&l).await == 0).then_some(())
    })
    .await;
}

/// `pubsub_request_bodies_bytes` from `url`'s metrics.
async fn request_bodies_bytes(url: &str) -> u64 {
    http::metric(url, "pubsub_request_bodies_bytes").await.expect("metric listed")
}

/// A client that starts more large batches than the node's whole budget for request bodies
/// (18 of 15 MiB against 256 MiB) and never finishes them holds at most its address's 64 MiB
/// share: its later bodies are refused `503` naming the client's share, and another client
/// still publishes at once. Before, such a client filled the node's budget, and every other
/// publisher waited 3 s, then got a 503.
#[tokio::test]
async fn a_client_that_does_not_finish_its_bodies_holds_only_its_share() {
    use pubsub_node::limits::{REQUEST_BODIES_BYTES_PER_CLIENT_MAX, REQUEST_BODY_ROOM_TIMEOUT};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const HOG_BODIES: usize = 18;
    const SENT_BYTES: usize = 15 << 20;
    let c = Cluster::start(Options { nodes: 1, ..Options::default() }).await;
    let l = leader_url(&c).await;
    post_raw(&format!("{l}/topics/t"), "").await.unwrap();

    // The hog comes from another address; each body announces 16 MiB and stops at 15.
    let addr: std::net::SocketAddr = l.trim_start_matches("http://").parse().unwrap();
    let sent = std::sync::Arc::new(vec![b'x'; SENT_BYTES]);
    let mut answers = Vec::new();
    let mut writers = Vec::new();
    for _ in 0..HOG_BODIES {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        let (mut read, mut write) = socket.connect(addr).await.unwrap().into_split();
        let sent = sent.clone();
        writers.push(tokio::spawn(async move {
            let head =
                format!("POST /topics/t/messages/batch HTTP/1.1\r\nhost: node\r\ncontent-length: {}\r\n\r\n", 16 << 20);
            write.write_all(head.as_bytes()).await?;
            write.write_all(&sent).await?;
            // Held open, the body unfinished, until the test ends.
            std::future::pending::<()>().await;
            Ok::<_, std::io::Error>(write)
        }));
        answers.push(tokio::spawn(async move {
            let mut answer = Vec::new();
            let _ = read.read_to_end(&mut answer).await;
            String::from_utf8_lossy(&answer).into_owned()
        }));
    }
    wait_until("the hog's bodies held", Duration::from_secs(20), || async {
        (request_bodies_bytes(&l).await > REQUEST_BODIES_BYTES_PER_CLIENT_MAX as u64 / 2).then_some(())
    })
    .await;

    // Another client publishes at once (waiting on the hog would take 3 s, then a 503).
    let started = std::time::Instant::now();
    let r = post(&format!("{l}/topics/t/messages"), &json!({"payload": "x".repeat(500_000)})).await.unwrap();
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert!(started.elapsed() < Duration::from_secs(2), "published after {:?}", started.elapsed());

    // The hog's bodies past its share are refused once they waited 3 s for room (the others,
    // read up to their missing last MiB, would time out at 30 s with a 408).
    wait_until("a hog body refused", Duration::from_secs(20), || async {
        answers.iter().any(|a| a.is_finished()).then_some(())
    })
    .await;
    // By now every hog body has taken what it could: without the share it would hold more.
    let held = request_bodies_bytes(&l).await;
    assert!(held <= REQUEST_BODIES_BYTES_PER_CLIENT_MAX as u64, "the hog holds {held} bytes, past its share");
    let mut told = 0;
    for answer in answers.iter_mut().filter(|a| a.is_finished()) {
        let answer = answer.await.unwrap();
        if answer.starts_with("HTTP/1.1 408") {
            continue;
        }
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        assert!(answer.contains("this client already sends 64 MiB"), "{answer}");
        told += 1;
    }
    assert!(told >= 1, "no hog body was refused for its share");

    for writer in writers {
        writer.abort();
    }
    for answer in answers {
        answer.abort();
    }
    // A body waiting for room when its client went does not see it go until its wait ends,
    // and may then read what the client had already sent and wait again, so each body may
    // hold room for a few of these waits after the hog is gone.
    let given_back_within = REQUEST_BODY_ROOM_TIMEOUT * HOG_BODIES as u32;
    wait_until("the hog's bodies given back", given_back_within, || async {
        (request_bodies_bytes(&l).await == 0).then_some(())
    })
    .await;
}

/// Messages published on one WebSocket are stored in the order sent, whatever their sizes:
/// a large frame's checks take longer than a small one's, yet the small one sent after it
/// gets the higher sequence (API.md §8).
#[tokio::test]
async fn publishes_on_one_websocket_are_stored_in_the_order_sent() {
    let c = Cluster::start(Options::default()).await;
    let l = leader_url(&c).await;
    let mut ws = publishing_socket(&l, "ordered").await;
    let large = json!({"text": "y".repeat(300 * 1024), "list": (0..2000).collect::<Vec<u32>>()});
    let count = 60u64;
    for i in 0..count {
        let payload = if i % 2 == 0 { large.clone() } else { json!(i) };
        let frame = json!({"type": "publish", "ref": i, "id": format!("o{i}"), "payload": payload});
        ws.send(Message::Text(frame.to_string().into())).await.unwrap();
    }
    let mut sequence_of = std::collections::BTreeMap::new();
    while (sequence_of.len() as u64) < count {
        let answer = next_frame(&mut ws).await;
        assert_eq!(answer["type"], "ack", "{answer}");
        sequence_of.insert(answer["ref"].as_u64().unwrap(), answer["sequence"].as_u64().unwrap());
    }
    let in_send_order: Vec<u64> = sequence_of.values().copied().collect();
    assert_eq!(in_send_order, (1..=count).collect::<Vec<u64>>());
}

/// The first leader names the cluster and every node learns the id (`GET /cluster`); a Raft
/// peer presenting another cluster's id is refused before the upgrade with 403
/// `wrong_cluster`, one presenting this one's goes on to it.
#[tokio::test]
async fn a_raft_peer_of_another_cluster_is_refused() {
    let c = Cluster::start(Options::default()).await;
    let id = wait_until("one cluster id on every node", Duration::from_secs(10), || async {
        let mut ids = std::collections::BTreeSet::new();
        for i in 0..3 {
            ids.insert(get(&format!("{}/cluster", c.url(i))).await.ok()?.body["cluster_id"].as_str()?.to_string());
        }
        (ids.len() == 1).then(|| ids.pop_first().unwrap())
    })
    .await;
    let raft = |presented: &str| {
        let request = http::client().get(format!("{}/raft", c.url(1))).bearer_auth("test-secret");
        http::send(request.header("x-pubsub-cluster-id", presented))
    };
    let r = raft("another").await.unwrap();
    assert!(r.status == 403 && is_error_body(&r.body, "wrong_cluster"), "{r:?}");
    assert_eq!(r.body["details"]["cluster_id"], json!(id));
    let r = raft(&id).await.unwrap();
    assert!(r.status == 400 && is_error_body(&r.body, "invalid_request"), "on to the upgrade: {r:?}");
}

/// A topic records at most 10,000 cursors. A subscriber with none of its own that subscribes
/// to a full topic is told so right after `subscribed`, and its acks are refused (counted in
/// `/metrics`); forgetting one cursor makes room for the next subscriber. One connected while
/// there was room is told once, at its ack after the topic filled.
#[tokio::test]
async fn a_full_topic_tells_its_subscribers_their_acks_are_not_recorded() {
    const FULL: usize = 10_000;
    const OPENERS: usize = 16;
    let c = Cluster::start(Options::default()).await;
    let l = leader_url(&c).await;
    post_raw(&format!("{l}/topics/full"), "").await.unwrap();
    post(&format!("{l}/topics/full/messages"), &json!({"payload": 1})).await.unwrap();
    let urls = c.urls();
    // Subscribers connect to every node: each must have applied the topic first.
    for url in &urls {
        wait_applied(url, "full", 1).await;
    }
    let openers: Vec<_> = (0..OPENERS)
        .map(|k| {
            let url = urls[k % urls.len()].clone();
            tokio::spawn(async move {
                for i in (k..FULL).step_by(OPENERS) {
                    let mut ws = ws_connect(&url, &format!("/topics/full/subscribe?subscriber_id=s{i}&cursor=0")).await;
                    assert_eq!(next_frame(&mut ws).await["subtype"], "subscribed");
                    ws.send(Message::Text(r#"{"type":"ack","sequence":1}"#.into())).await.unwrap();
                    ws.close(None).await.unwrap();
                }
            })
        })
        .collect();
    for opener in openers {
        opener.await.unwrap();
    }
    wait_until("every cursor recorded", Duration::from_secs(30), || async {
        let (_, b) = http::get_json(&format!("{l}/topics/full/subscribers")).await.ok()?;
        let list = b["subscribers"].as_array()?;
        (list.len() == FULL && list.iter().all(|s| s["acked_sequence"] == 1)).then_some(())
    })
    .await;

    let mut late = ws_connect(&l, "/topics/full/subscribe?subscriber_id=late&cursor=0").await;
    assert_eq!(next_frame(&mut late).await["subtype"], "subscribed");
    let notice = next_frame(&mut late).await;
    assert_eq!(
        (&notice["subtype"], &notice["subscriber_id"], &notice["recorded_cursors_max"]),
        (&json!("acks_not_recorded"), &json!("late"), &json!(FULL))
    );
    assert_eq!(next_frame(&mut late).await["sequence"], 1, "the subscription goes on");
    let ack = |sequence: u64| Message::Text(format!(r#"{{"type":"ack","sequence":{sequence}}}"#).into());
    late.send(ack(1)).await.unwrap();
    wait_refused(&l, 1).await;

    let r = delete(&format!("{l}/topics/full/subscribers/s0")).await.unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    let mut next = ws_connect(&l, "/topics/full/subscribe?subscriber_id=next&cursor=0").await;
    assert_eq!(next_frame(&mut next).await["subtype"], "subscribed");
    assert_eq!(next_frame(&mut next).await["sequence"], 1, "no notice once there is room");
    // Another one subscribes while there is room; the topic fills before it acks.
    let mut mid = ws_connect(&l, "/topics/full/subscribe?subscriber_id=mid&cursor=0").await;
    assert_eq!(next_frame(&mut mid).await["subtype"], "subscribed");
    assert_eq!(next_frame(&mut mid).await["sequence"], 1, "no notice while there is room");
    next.send(ack(1)).await.unwrap();
    wait_acked(&l, "full", "next", 1).await;

    mid.send(ack(1)).await.unwrap();
    wait_refused(&l, 2).await;
    // Told at its next ack, once.
    post(&format!("{l}/topics/full/messages"), &json!({"payload": 2})).await.unwrap();
    assert_eq!(next_frame(&mut mid).await["sequence"], 2);
    mid.send(ack(2)).await.unwrap();
    let notice = next_frame(&mut mid).await;
    assert_eq!((&notice["subtype"], &notice["subscriber_id"]), (&json!("acks_not_recorded"), &json!("mid")));
    wait_refused(&l, 3).await;
    mid.send(ack(2)).await.unwrap();
    wait_refused(&l, 4).await;
    post(&format!("{l}/topics/full/messages"), &json!({"payload": 3})).await.unwrap();
    assert_eq!(next_frame(&mut mid).await["sequence"], 3, "told once, the subscription goes on");
}

/// Waits until `node` counted `n` acks refused.
async fn wait_refused(node: &str, n: u64) {
    wait_until("the refused acks counted", Duration::from_secs(10), || async {
        (http::metric(node, "pubsub_acks_refused_total").await? == n).then_some(())
    })
    .await;
}

/// An ack past the topic's end records the end the node had when the ack arrived, not what the
/// topic holds when the coalesced acks are applied (up to a flush interval later): messages
/// committed in between were never delivered, and `cursor=acked` would skip them.
#[tokio::test]
async fn an_ack_past_the_end_records_the_end_as_it_arrived() {
    let c = Cluster::start(Options::default()).await;
    let l = leader_url(&c).await;
    post_raw(&format!("{l}/topics/capped"), "").await.unwrap();
    for n in 1..=2 {
        post(&format!("{l}/topics/capped/messages"), &json!({"payload": n})).await.unwrap();
    }
    let mut ws = ws_connect(&l, "/topics/capped/subscribe?subscriber_id=s&cursor=0").await;
    assert_eq!(next_frame(&mut ws).await["subtype"], "subscribed");
    for n in 1..=2 {
        assert_eq!(next_frame(&mut ws).await["sequence"], n);
    }
    ws.send(Message::Text(format!(r#"{{"type":"ack","sequence":{}}}"#, u64::MAX).into())).await.unwrap();
    // The pong comes back once the node has read every frame sent before the ping.
    ws.send(Message::Ping(b"after the ack".to_vec().into())).await.unwrap();
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(10), ws.next()).await.expect("pong in time");
        if let Message::Pong(_) = frame.expect("open").expect("a frame") {
            break;
        }
    }
    let batch = json!({"messages": [{"payload": 3}, {"payload": 4}, {"payload": 5}]});
    let r = post(&format!("{l}/topics/capped/messages/batch"), &batch).await.unwrap();
    assert_eq!(r.status, 201, "{r:?}");
    let listed = wait_acked(&l, "capped", "s", 2).await;
    assert_eq!(listed["lag"], 3);
}

/// Bytes a test leaves free on each side of a node's reserve when it fills the disk: other
/// tests writing meanwhile must not cross it either way.
const DISK_MARGIN_BYTES: u64 = 3 << 30;

/// A data dir short of its reserve (`--min-free-bytes`) refuses publishes (single, batch, on a
/// publishing WebSocket) and topic creations with `507 insufficient_storage`, storing nothing,
/// while reads, deletes and the node itself go on; once the disk has room again publishes are
/// taken, at the next sequence. The disk is filled for real, by a file allocated beside the
/// data dir (where it has less than four margins free, or cannot allocate a file, the reserve
/// is set past the free space instead and the refusal of a topic creation alone is checked).
#[tokio::test]
async fn a_node_short_of_disk_refuses_growing_writes_with_507_until_it_has_room() {
    let available = raft_store::available_bytes(&std::env::temp_dir()).expect("statvfs of the temp dir");
    let probe = std::env::temp_dir().join(format!("pubsub-fallocate-probe-{}", std::process::id()));
    let fill = available >= 4 * DISK_MARGIN_BYTES && allocate(&probe, 4096);
    let _ = std::fs::remove_file(&probe);
    let reserve = if fill { available - DISK_MARGIN_BYTES } else { u64::MAX / 2 };
    let args = vec!["--min-free-bytes".into(), reserve.to_string()];
    let c = Cluster::start(Options { nodes: 1, extra_args: args, ..Options::default() }).await;
    let l = leader_url(&c).await;
    assert_eq!(http::metric(&l, "pubsub_data_dir_min_free_bytes").await, Some(reserve));
    let refused_for_room = |reply: &http::Reply| {
        let details = &reply.body["details"];
        reply.status == 507
            && is_error_body(&reply.body, "insufficient_storage")
            && details["min_free_bytes"] == reserve
            && details["needed_bytes"].as_u64().is_some_and(|needed| needed >= reserve)
            && details["available_bytes"].as_u64() < details["needed_bytes"].as_u64()
    };
    if !fill {
        eprintln!("{available} bytes free, or no fallocate: the reserve is set past the free space instead");
        let create = post_raw(&format!("{l}/topics/disk"), "").await.unwrap();
        assert!(refused_for_room(&create), "{:?}", create.body);
        return;
    }
    assert_eq!(post_raw(&format!("{l}/topics/disk"), "").await.unwrap().status, 201);
    assert_eq!(post_raw(&format!("{l}/topics/doomed"), "").await.unwrap().status, 201);
    let (url, body) = (format!("{l}/topics/disk/messages"), json!({"payload": 1}));
    let publish = || post(&url, &body);
    assert_eq!(publish().await.unwrap().status, 201);
    let ballast = c.nodes[0].data_dir.parent().expect("the cluster's temp dir").join("ballast");
    assert!(allocate(&ballast, 2 * DISK_MARGIN_BYTES), "fallocate at {}", ballast.display());

    // The node reads its free space every 100 ms, in the background: publishes may be taken until then.
    let stored = std::cell::Cell::new(1);
    let refused = wait_until("a publish refused for want of disk", Duration::from_secs(10), || async {
        let reply = publish().await.unwrap();
        stored.set(stored.get() + u64::from(reply.status == 201));
        (reply.status != 201).then_some(reply)
    })
    .await;
    let stored = stored.get();
    assert!(refused_for_room(&refused), "{:?}", refused.body);
    let batch = post(&format!("{l}/topics/disk/messages/batch"), &json!({"messages": [{"payload": 2}]})).await.unwrap();
    assert!(refused_for_room(&batch), "{:?}", batch.body);
    let create = post_raw(&format!("{l}/topics/another"), "").await.unwrap();
    assert!(refused_for_room(&create), "{:?}", create.body);
    let mut ws = ws_connect(&l, "/topics/disk/publish").await;
    ws.send(Message::Text(json!({"type": "publish", "ref": 1, "payload": 3}).to_string().into())).await.unwrap();
    let answer = next_frame(&mut ws).await;
    assert_eq!((answer["type"].as_str(), answer["error"].as_str()), (Some("error"), Some("insufficient_storage")));
    // What shrinks the data still runs, and reads are served.
    assert_eq!(delete(&format!("{l}/topics/doomed")).await.unwrap().status, 200);
    let (status, topic) = http::get_json(&format!("{l}/topics/disk")).await.unwrap();
    assert_eq!((status, topic["current_sequence"].as_u64()), (200, Some(stored)), "{topic}");

    std::fs::remove_file(&ballast).expect("ballast removed");
    let taken = wait_until("a publish taken once the disk has room", Duration::from_secs(30), || async {
        let reply = publish().await.unwrap();
        (reply.status != 507).then_some(reply)
    })
    .await;
    // Nothing refused took a sequence.
    assert_eq!((taken.status, taken.body["sequence"].as_u64()), (201, Some(stored + 1)), "{:?}", taken.body);
}

/// `DELETE {members}/{id}`, sent again on `503` as the client does: one attempt may wait up to
/// 10 s on the node for the change running there before its 503, so the wait allows a few.
async fn remove_member(members: &str, id: &str) -> http::Reply {
    wait_until("the removal taken", Duration::from_secs(30), || async {
        let r = delete(&format!("{members}/{id}")).await.ok()?;
        (r.status != 503).then_some(r)
    })
    .await
}

/// `POST /cluster/members` and `DELETE /cluster/members/{id}` refuse what they cannot do with
/// the documented error bodies, and change nothing: bad bodies and ids, an address or id that
/// contradicts the membership, a node that is no member, the last voter; a voter re-added at
/// its address is no change. A follower redirects them to the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_changes_refuse_what_they_cannot_do() {
    let c = Cluster::start(Options { nodes: 1, secret: None, ..Default::default() }).await;
    let l = leader_url(&c).await;
    let members = format!("{l}/cluster/members");
    for (body, code) in [
        (json!({}), "invalid_request"),
        (json!({"id": 0, "address": "127.0.0.1:1"}), "invalid_request"),
        (json!({"id": "node-x", "address": "127.0.0.1:1"}), "invalid_request"),
        (json!({"id": 2, "address": "no-port"}), "invalid_request"),
        (json!({"id": 2, "address": "127.0.0.1:1", "extra": true}), "invalid_request"),
        (json!({"id": 2, "address": c.nodes[0].addr}), "member_conflict"),
        (json!({"id": 1, "address": "127.0.0.1:1"}), "member_conflict"),
        // The node is at 127.0.0.1: one on another host could not reach it.
        (json!({"id": 2, "address": "10.9.9.9:8080"}), "member_conflict"),
    ] {
        let r = post(&members, &body).await.unwrap();
        let status = if code == "member_conflict" { 409 } else { 400 };
        assert!(r.status == status && is_error_body(&r.body, code), "{body}: {r:?}");
    }
    let r = post(&members, &json!({"id": "node-1", "address": c.nodes[0].addr})).await.unwrap();
    assert_eq!((r.status, &r.body["changed"]), (200, &json!(false)), "{r:?}");
    assert_eq!(
        r.body["members"],
        json!([{"node_id": "node-1", "address": c.nodes[0].addr,
        "client_address": c.nodes[0].addr, "role": "voter"}])
    );
    let r = delete(&format!("{members}/7")).await.unwrap();
    assert!(r.status == 404 && is_error_body(&r.body, "not_found"), "{r:?}");
    let r = delete(&format!("{members}/abc")).await.unwrap();
    assert!(r.status == 400 && is_error_body(&r.body, "invalid_request"), "{r:?}");
    let r = delete(&format!("{members}/1")).await.unwrap();
    assert!(r.status == 400 && is_error_body(&r.body, "invalid_request"), "the last voter: {r:?}");
    let info = c.cluster_info(0).await.unwrap();
    assert_eq!(info["members"].as_array().map(Vec::len), Some(1), "{info}");
    assert_eq!((&info["leader_id"], &info["membership_joint"]), (&json!("node-1"), &json!(false)), "{info}");

    // A node nothing answers for stays a learner; removed meanwhile, its addition ends 409.
    let adding = tokio::spawn({
        let members = members.clone();
        async move { post(&members, &json!({"id": 5, "address": "127.0.0.1:9"})).await.unwrap() }
    });
    wait_until("node-5 listed as a learner", Duration::from_secs(10), || async {
        let info = c.cluster_info(0).await?;
        info["members"].as_array()?.iter().any(|m| m["node_id"] == "node-5" && m["role"] == "learner").then_some(())
    })
    .await;
    // Listed once appended: the removal waits on the node for the addition's change to commit.
    let r = remove_member(&members, "node-5").await;
    assert_eq!((r.status, &r.body["joint"]), (200, &json!(false)), "{r:?}");
    assert_eq!(r.body["members"].as_array().map(Vec::len), Some(1), "{r:?}");
    let r = adding.await.unwrap();
    assert!(r.status == 409 && is_error_body(&r.body, "member_conflict"), "{r:?}");

    // Two nodes added at one address at once: both pass the check on the membership they read
    // first, and the one whose change comes second is refused on the membership as it then is.
    let add = |id: u64| {
        let members = members.clone();
        tokio::spawn(async move { post(&members, &json!({"id": id, "address": "127.0.0.1:10"})).await.unwrap() })
    };
    let (mut six, mut seven) = (add(6), add(7));
    let (refused, winner, adding) = tokio::select! {
        r = &mut six => (r.unwrap(), "node-7", seven),
        r = &mut seven => (r.unwrap(), "node-6", six),
    };
    assert!(refused.status == 409 && is_error_body(&refused.body, "member_conflict"), "{refused:?}");
    let info = c.cluster_info(0).await.unwrap();
    let at_10: Vec<&Value> =
        info["members"].as_array().unwrap().iter().filter(|m| m["address"] == "127.0.0.1:10").collect();
    assert!(at_10.len() == 1 && at_10[0]["node_id"] == winner, "{info}");
    let r = remove_member(&members, winner).await;
    assert_eq!(r.status, 200, "{r:?}");
    let r = adding.await.unwrap();
    assert!(r.status == 409 && is_error_body(&r.body, "member_conflict"), "{r:?}");

    // A follower of a three-node cluster redirects a change; with a secret, one without it is refused.
    let c = Cluster::start(Options::default()).await;
    let f = follower_url(&c).await;
    let r = post(&format!("{f}/cluster/members"), &json!({"id": 4, "address": "127.0.0.1:1"})).await.unwrap();
    assert!(r.status == 401 && is_error_body(&r.body, "unauthorized"), "{r:?}");
    let request = http::client().delete(format!("{f}/cluster/members/4")).bearer_auth(c.secret().unwrap());
    let r = http::send(request).await.unwrap();
    assert!(r.status == 307 && is_error_body(&r.body, "not_leader"), "{r:?}");
}
