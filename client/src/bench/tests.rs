use std::sync::atomic::AtomicUsize;

use serde_json::{json, Value};

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
fn every_payload_content_has_the_requested_size_and_a_readable_timestamp() {
    for content in [PayloadContent::Text, PayloadContent::Random, PayloadContent::Repeat] {
        for size in [64, 256, 1024] {
            let payloads = Payloads::new(content, size);
            let first = payloads.next(now_us());
            assert_eq!(first.to_string().len(), size, "{content:?} {size}");
            assert!(first["t_us"].as_u64().is_some());
            let second = payloads.next(now_us());
            assert_eq!(
                first["pad"] == second["pad"],
                content == PayloadContent::Repeat,
                "{content:?}: pads taken in turn"
            );
        }
    }
}

#[test]
fn text_payloads_are_words_and_numbers() {
    let pad = Payloads::new(PayloadContent::Text, 256).next(1)["pad"].as_str().unwrap_or_default().to_string();
    assert!(pad.split(' ').filter(|w| !w.is_empty()).count() > 10, "{pad}");
    assert!(pad.bytes().all(|b| b.is_ascii_alphanumeric() || b == b' '), "{pad}");
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
    let past = Work { remaining: AtomicU64::new(25), deadline: Some(Instant::now()), abort: AtomicBool::new(false) };
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
    accepting_leader_counting().await.0
}

/// [`accepting_leader`], also counting the publishing WebSockets (API.md §8) opened on it.
async fn accepting_leader_counting() -> (String, Arc<AtomicUsize>) {
    use axum::extract::ws::{Message as AxMessage, WebSocketUpgrade};
    use axum::routing::{get, post};
    use axum::{Json, Router};
    // One lock assigns a sequence and feeds it, so subscribers see sequence order.
    let next = Arc::new(std::sync::Mutex::new(0u64));
    let (feed, _) = tokio::sync::broadcast::channel::<String>(100_000);
    let connections = Arc::new(AtomicUsize::new(0));
    let opened = connections.clone();
    let address = crate::test_support::serve_with(move |me| {
        let cluster = crate::test_support::cluster_body("node-1", Some(&me), &[]);
        let (single, batch, socket_next) = (next.clone(), next.clone(), next.clone());
        let (single_feed, batch_feed, socket_feed, sub_feed) = (feed.clone(), feed.clone(), feed.clone(), feed);
        let frame = |seq: u64, m: &Value| {
            json!({"type": "message", "id": m["id"], "topic": "t", "sequence": seq,
                   "payload": m["payload"], "timestamp": 1})
            .to_string()
        };
        Router::new()
            .route("/cluster", get(move || async move { Json(cluster) }))
            .route("/topics/{name}", post(|| async { Json(json!({"topic": "t", "created": true, "raft_index": 1})) }))
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
                "/topics/{name}/publish",
                get(move |ws: WebSocketUpgrade| async move {
                    opened.fetch_add(1, Ordering::SeqCst);
                    ws.on_upgrade(move |mut socket| async move {
                        while let Some(message) = crate::test_support::next_json(&mut socket).await {
                            let seq = {
                                let mut last = socket_next.lock().unwrap_or_else(|p| p.into_inner());
                                *last += 1;
                                let _ = socket_feed.send(frame(*last, &message));
                                *last
                            };
                            let ack = crate::test_support::publish_ack(&message, seq);
                            if socket.send(AxMessage::Text(ack.into())).await.is_err() {
                                break;
                            }
                        }
                    })
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
    .await;
    (address, connections)
}

fn config(messages: u64, batch: usize) -> BenchConfig {
    BenchConfig {
        topic: "t".into(),
        publishers: 3,
        inflight: 4,
        messages,
        payload_bytes: 100,
        payload_content: PayloadContent::Text,
        batch,
        subscribers: 0,
        duration: None,
        ack: AckMode::Committed,
        transport: Transport::Http,
        rate: None,
        drain_timeout: Duration::from_secs(1),
        progress: false,
    }
}

#[tokio::test]
async fn bench_publishes_exactly_the_requested_messages_singly_and_in_batches() {
    let node = accepting_leader().await;
    let client = crate::test_support::fast_client(&[&node]);
    for (messages, batch) in [(101, 1), (2_345, 100)] {
        let report = report(run(&client, &config(messages, batch)).await);
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
    let report = report(run(&client, &cfg).await);
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

fn report(outcome: Result<BenchReport, Error>) -> BenchReport {
    match outcome {
        Ok(r) => r,
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test]
async fn bench_over_ws_opens_one_publisher_per_task_and_publishes_every_message() {
    let (node, connections) = accepting_leader_counting().await;
    let client = crate::test_support::fast_client(&[&node]);
    let mut cfg = config(1_001, 1);
    cfg.transport = Transport::Ws;
    cfg.inflight = 16;
    cfg.subscribers = 2;
    let r = report(run(&client, &cfg).await);
    assert_eq!((r.messages, r.errors), (1_001, 0), "{:?}", r.first_error);
    assert_eq!(r.transport, Transport::Ws);
    assert_eq!(connections.load(Ordering::SeqCst), 3);
    assert_eq!(r.delivered, Some(2_002));
    assert!(r.p50_ms <= r.p99_ms && r.p99_ms <= r.max_ms);
    let json = serde_json::to_value(&r).unwrap_or_default();
    assert_eq!((json["transport"].as_str(), json["rate"].is_null()), (Some("ws"), true));
}

#[tokio::test]
async fn bench_over_ws_refuses_batches_and_appended_acks() {
    let node = accepting_leader().await;
    let client = crate::test_support::fast_client(&[&node]);
    let mut batched = config(10, 10);
    batched.transport = Transport::Ws;
    assert!(matches!(run(&client, &batched).await, Err(Error::InvalidArgument(_))));
    let mut appended = config(10, 1);
    appended.transport = Transport::Ws;
    appended.ack = AckMode::Appended;
    assert!(matches!(run(&client, &appended).await, Err(Error::InvalidArgument(_))));
}

#[tokio::test]
async fn a_rate_paces_publishing_over_both_transports() {
    let node = accepting_leader().await;
    let client = crate::test_support::fast_client(&[&node]);
    for transport in [Transport::Http, Transport::Ws] {
        let mut cfg = config(50, 1);
        cfg.transport = transport;
        cfg.rate = Some(500.0);
        let started = Instant::now();
        let r = report(run(&client, &cfg).await);
        // 50 messages due 2 ms apart: the last is due 98 ms after the first.
        assert!(started.elapsed() >= Duration::from_millis(90), "{transport:?}: {:?}", started.elapsed());
        assert!(r.duration_secs >= 0.09, "{transport:?}: {}", r.duration_secs);
        assert_eq!(r.messages, 50);
        assert_eq!(r.rate, Some(500.0));
        assert!(r.msgs_per_sec <= 550.0, "{transport:?}: {}", r.msgs_per_sec);
    }
}

#[tokio::test]
async fn a_rate_that_is_not_a_positive_number_is_refused() {
    let node = accepting_leader().await;
    let client = crate::test_support::fast_client(&[&node]);
    for rate in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let mut cfg = config(10, 1);
        cfg.rate = Some(rate);
        assert!(matches!(run(&client, &cfg).await, Err(Error::InvalidArgument(_))), "{rate}");
    }
}

#[tokio::test]
async fn hundreds_of_subscribers_are_opened_concurrently() {
    let node = accepting_leader().await;
    let client = crate::test_support::fast_client(&[&node]);
    let mut cfg = config(20, 1);
    // Two sockets each in this one process (client and fake server); kept well under a
    // default limit of 1024 open files.
    cfg.subscribers = 200;
    let started = Instant::now();
    let r = report(run(&client, &cfg).await);
    assert_eq!(r.delivered, Some(20 * 200));
    assert_eq!(r.deliver_errors, Some(0));
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
}
