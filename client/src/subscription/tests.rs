use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::ws::{Message as AxMessage, WebSocket, WebSocketUpgrade};
use axum::extract::Query;
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use futures_util::StreamExt;
use serde_json::{json, Value};

use super::*;
use crate::test_support::{cluster_body, dead_address, error_response, fast_client, serve, serve_with};

/// Subscribes `client` to topic `t` as `s` from the start.
async fn subscribe_from_start(client: &crate::Client) -> Subscription {
    match client.subscribe("t", SubscribeOptions::new("s").cursor(Cursor::After(0))).await {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    }
}

/// Subscribes `client` to topic `t` as `s` from the latest sequence.
async fn subscribe_latest(client: &crate::Client) -> Subscription {
    match client.subscribe("t", SubscribeOptions::new("s")).await {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    }
}

// ----- the pure rules ---------------------------------------------------------------

fn message(sequence: u64) -> ServerFrame {
    ServerFrame::Message(Message {
        id: format!("m{sequence}"),
        topic: "t".into(),
        sequence,
        payload: json!(sequence),
        timestamp: 0,
    })
}

fn subscribed(cursor: u64) -> ServerFrame {
    ServerFrame::Control(ControlFrame::Subscribed { cursor })
}

fn delivered(step: &Step) -> Option<u64> {
    match step {
        Step::Emit(Event::Message(m)) => Some(m.sequence),
        _ => None,
    }
}

#[test]
fn messages_at_or_below_the_last_delivered_sequence_are_dropped() {
    let mut t = Tracker::new("t", Cursor::After(0));
    assert_eq!(delivered(&t.on_frame(message(1))), Some(1));
    assert_eq!(delivered(&t.on_frame(message(2))), Some(2));
    assert!(matches!(t.on_frame(message(2)), Step::Skip));
    assert!(matches!(t.on_frame(message(1)), Step::Skip));
    assert_eq!(delivered(&t.on_frame(message(3))), Some(3));
}

#[test]
fn resume_cursor_is_the_initial_cursor_until_something_is_known() {
    let mut latest = Tracker::new("t", Cursor::Latest);
    assert_eq!(latest.resume_cursor(), Cursor::Latest);
    latest.on_frame(subscribed(10));
    assert_eq!(latest.resume_cursor(), Cursor::After(10));
    latest.on_frame(message(11));
    assert_eq!(latest.resume_cursor(), Cursor::After(11));

    let acked = Tracker::new("t", Cursor::Acked);
    assert_eq!(acked.resume_cursor(), Cursor::Acked);
    let after = Tracker::new("t", Cursor::After(5));
    assert_eq!(after.resume_cursor(), Cursor::After(5));
}

#[test]
fn a_reconnect_subscribed_frame_does_not_move_the_cursor_back() {
    let mut t = Tracker::new("t", Cursor::After(0));
    t.on_frame(message(1));
    t.on_frame(message(2));
    // A lagging node confirms an older cursor; its replay is deduplicated.
    t.on_frame(subscribed(1));
    assert_eq!(t.resume_cursor(), Cursor::After(2));
    assert!(matches!(t.on_frame(message(2)), Step::Skip));
    assert_eq!(delivered(&t.on_frame(message(3))), Some(3));
}

#[test]
fn an_unannounced_jump_is_reported_then_delivered() {
    let mut t = Tracker::new("orders", Cursor::After(0));
    t.on_frame(message(1));
    match t.on_frame(message(4)) {
        Step::Gap { error: Error::SequenceGap { topic, last_delivered: 1, received: 4 }, then: Event::Message(m) } => {
            assert_eq!(topic, "orders");
            assert_eq!(m.sequence, 4);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(delivered(&t.on_frame(message(5))), Some(5));
}

#[test]
fn announced_expiry_moves_the_floor_and_is_not_a_gap() {
    let mut t = Tracker::new("t", Cursor::After(0));
    let expired =
        ServerFrame::Control(ControlFrame::MessagesExpired { requested_cursor: 0, first_available_sequence: 5 });
    assert!(matches!(
        t.on_frame(expired),
        Step::Emit(Event::Expired { requested_cursor: 0, first_available_sequence: 5 })
    ));
    assert_eq!(t.resume_cursor(), Cursor::After(4));
    assert_eq!(delivered(&t.on_frame(message(5))), Some(5));
}

#[test]
fn expiry_of_messages_already_delivered_is_not_reported() {
    let mut t = Tracker::new("t", Cursor::After(7));
    let expired =
        ServerFrame::Control(ControlFrame::MessagesExpired { requested_cursor: 3, first_available_sequence: 6 });
    assert!(matches!(t.on_frame(expired), Step::Skip));
    assert_eq!(t.resume_cursor(), Cursor::After(7));
}

#[test]
fn topic_deleted_ends_and_unknown_frames_are_skipped() {
    let mut t = Tracker::new("t", Cursor::Latest);
    assert!(matches!(t.on_frame(ServerFrame::Control(ControlFrame::Unknown)), Step::Skip));
    assert!(matches!(t.on_frame(ServerFrame::Unknown), Step::Skip));
    assert!(matches!(t.on_frame(ServerFrame::Control(ControlFrame::TopicDeleted)), Step::End(Event::TopicDeleted)));
}

#[test]
fn acks_are_coalesced_to_the_highest_sequence() {
    let (tx, mut rx) = watch::channel(0u64);
    let acker = Acker { latest: Arc::new(tx) };
    acker.ack(5);
    acker.clone().ack(3);
    assert_eq!(acker.acked(), 5);
    assert_eq!(*rx.borrow_and_update(), 5);
    acker.ack(5);
    assert!(!rx.has_changed().unwrap_or(true), "equal ack sends nothing");
}

// ----- against an in-process WebSocket server ----------------------------------------

/// What the mock saw on each connection: the `cursor` query parameter, and the ack frames
/// the client sent.
#[derive(Default, Debug)]
struct Log {
    cursors: Vec<Option<String>>,
    acks: Vec<Vec<u64>>,
}

type Shared = Arc<Mutex<Log>>;

/// A mock node whose n-th subscription connection (0-based) is served by `script(n, socket)`.
async fn ws_node<F, Fut>(log: Shared, script: F) -> String
where
    F: Fn(usize, WebSocket, Shared) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let app = Router::new().route(
        "/topics/{name}/subscribe",
        get(move |ws: WebSocketUpgrade, Query(q): Query<HashMap<String, String>>| async move {
            let n = {
                let mut l = log.lock().unwrap_or_else(|p| p.into_inner());
                l.cursors.push(q.get("cursor").cloned());
                l.acks.push(Vec::new());
                l.cursors.len() - 1
            };
            let log = log.clone();
            let script = script.clone();
            ws.on_upgrade(move |socket| script(n, socket, log))
        }),
    );
    serve(app).await
}

async fn send(socket: &mut WebSocket, frame: Value) {
    let _ = socket.send(AxMessage::Text(frame.to_string().into())).await;
}

fn msg(sequence: u64) -> Value {
    json!({"type": "message", "id": format!("m{sequence}"), "topic": "t",
           "sequence": sequence, "payload": {"n": sequence}, "timestamp": 1})
}

fn sub_frame(cursor: u64) -> Value {
    json!({"type": "control", "subtype": "subscribed", "topic": "t", "cursor": cursor,
           "subscriber_id": "s"})
}

fn deleted() -> Value {
    json!({"type": "control", "subtype": "topic_deleted", "topic": "t"})
}

/// Reads ack frames until one with `until` arrives, logging each for connection `n`.
async fn read_acks(socket: &mut WebSocket, log: &Shared, n: usize, until: u64) {
    while let Some(Ok(frame)) = socket.recv().await {
        if let AxMessage::Text(text) = frame {
            let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            if let Some(seq) = v["sequence"].as_u64() {
                log.lock().unwrap_or_else(|p| p.into_inner()).acks[n].push(seq);
                if seq >= until {
                    return;
                }
            }
        }
    }
}

/// Collects the stream until it ends (bounded by a timeout so a bug cannot hang the test).
async fn collect(mut sub: Subscription, ack: bool) -> Vec<Result<Event, Error>> {
    let mut out = Vec::new();
    let collecting = async {
        while let Some(item) = sub.next().await {
            if let (true, Ok(Event::Message(m))) = (ack, &item) {
                sub.ack(m.sequence);
            }
            out.push(item);
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(10), collecting).await;
    out
}

/// The events as short strings, without `Reconnecting` (how many attempts fail depends on
/// timing; `reconnect_attempts_are_told_while_the_cluster_is_away` checks them).
fn sequences(events: &[Result<Event, Error>]) -> Vec<String> {
    events
        .iter()
        .filter(|e| !matches!(e, Ok(Event::Reconnecting { .. })))
        .map(|e| match e {
            Ok(Event::Message(m)) => m.sequence.to_string(),
            Ok(Event::TopicDeleted) => "deleted".into(),
            Ok(Event::Expired { first_available_sequence, .. }) => format!("expired->{first_available_sequence}"),
            Ok(Event::LeaderChange { .. }) => "leader".into(),
            Ok(Event::AcksNotRecorded { recorded_cursors_max }) => {
                format!("acks not recorded ({recorded_cursors_max})")
            }
            Ok(Event::Reconnecting { .. }) => unreachable!("filtered above"),
            Err(Error::SequenceGap { last_delivered, received, .. }) => format!("gap {last_delivered}->{received}"),
            Err(e) => format!("error {e}"),
        })
        .collect()
}

#[tokio::test]
async fn reconnect_resumes_after_the_last_delivered_sequence_without_duplicates() {
    let log = Shared::default();
    let node = ws_node(log.clone(), |n, mut socket, log| async move {
        if n == 0 {
            send(&mut socket, sub_frame(0)).await;
            for s in 1..=3 {
                send(&mut socket, msg(s)).await;
            }
            read_acks(&mut socket, &log, n, 3).await;
            // Then the node dies: the connection drops without a close handshake.
        } else {
            // The client re-sends its latest ack first on a new connection.
            read_acks(&mut socket, &log, n, 3).await;
            send(&mut socket, sub_frame(3)).await;
            for s in 2..=4 {
                send(&mut socket, msg(s)).await;
            }
            send(&mut socket, deleted()).await;
            let _ = socket.send(AxMessage::Close(None)).await;
        }
    })
    .await;
    let client = fast_client(&[&node]);
    let sub = client.subscribe("t", SubscribeOptions::new("s").cursor(Cursor::After(0))).await;
    let sub = match sub {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(sub.subscribed_cursor(), Some(0));
    let events = collect(sub, true).await;
    assert_eq!(sequences(&events), vec!["1", "2", "3", "4", "deleted"]);
    let log = log.lock().unwrap_or_else(|p| p.into_inner());
    assert_eq!(log.cursors, vec![Some("0".to_string()), Some("3".to_string())]);
    assert_eq!(log.acks[1], vec![3], "latest ack re-sent after the reconnect");
}

/// Serves a first connection whose first frame is `first`, then one that confirms cursor 10:
/// a first frame that is not `subscribed` must fail its connection, not start the stream.
async fn assert_first_frame_fails_its_connection(first: String) {
    let log = Shared::default();
    let node = ws_node(log.clone(), move |n, mut socket, _log| {
        let first = first.clone();
        async move {
            if n == 0 {
                let _ = socket.send(AxMessage::Text(first.into())).await;
                let _ = socket.send(AxMessage::Close(None)).await;
            } else {
                send(&mut socket, sub_frame(10)).await;
                send(&mut socket, msg(11)).await;
                send(&mut socket, deleted()).await;
            }
        }
    })
    .await;
    let sub = subscribe_latest(&fast_client(&[&node])).await;
    assert_eq!(sub.subscribed_cursor(), Some(10));
    let events = collect(sub, false).await;
    assert_eq!(sequences(&events), vec!["11", "deleted"]);
    assert_eq!(log.lock().unwrap_or_else(|p| p.into_inner()).cursors, vec![None, None]);
}

/// A first frame that does not parse confirms no start cursor: that connection is dropped and
/// the next one's `subscribed` frame fixes where a `latest` stream starts. Going on without
/// it, a reconnect before the first message asked for `latest` again and skipped what was
/// published in between.
#[tokio::test]
async fn an_unparseable_first_frame_is_a_failed_connection_not_a_start() {
    assert_first_frame_fails_its_connection("not a frame".into()).await;
}

/// A first frame that parses but is not `subscribed` confirms no start cursor either: that
/// connection fails the same way. Taken as the start, it left a `latest` subscription without a
/// confirmed cursor.
#[tokio::test]
async fn a_first_frame_other_than_subscribed_is_a_failed_connection_not_a_start() {
    assert_first_frame_fails_its_connection(msg(11).to_string()).await;
}

/// A message frame cut short, as a faulty proxy would pass it on.
const GARBLED: &str = r#"{"type":"message","id":"m2","topic":"t","sequ"#;

/// A frame that does not parse mid-stream is read again: the connection is replaced by one
/// resuming after the last delivered message, where it parses. Read past instead, it was lost:
/// a protocol error, then a gap before the next message.
#[tokio::test]
async fn a_frame_garbled_once_is_read_again_without_an_error_or_a_gap() {
    let log = Shared::default();
    let node = ws_node(log.clone(), |n, mut socket, _log| async move {
        if n == 0 {
            send(&mut socket, sub_frame(0)).await;
            send(&mut socket, msg(1)).await;
            let _ = socket.send(AxMessage::Text(GARBLED.into())).await;
            send(&mut socket, msg(3)).await;
        } else {
            send(&mut socket, sub_frame(1)).await;
            send(&mut socket, msg(2)).await;
            send(&mut socket, msg(3)).await;
            send(&mut socket, deleted()).await;
        }
    })
    .await;
    let sub = subscribe_from_start(&fast_client(&[&node])).await;
    let events = collect(sub, false).await;
    assert_eq!(sequences(&events), vec!["1", "2", "3", "deleted"]);
    let log = log.lock().unwrap_or_else(|p| p.into_inner());
    assert_eq!(log.cursors, vec![Some("0".to_string()), Some("1".to_string())]);
}

/// A frame that never parses (a server of another version) is read again a bounded number of
/// times, then reported as a protocol error and read past: the stream goes on, with the gap it
/// left, instead of reconnecting forever.
#[tokio::test]
async fn a_frame_that_never_parses_is_reported_after_the_bounded_rereads_and_the_stream_goes_on() {
    let log = Shared::default();
    let node = ws_node(log.clone(), |n, mut socket, _log| async move {
        send(&mut socket, sub_frame(if n == 0 { 0 } else { 1 })).await;
        send(&mut socket, msg(1)).await;
        let _ = socket.send(AxMessage::Text(GARBLED.into())).await;
        send(&mut socket, msg(3)).await;
        send(&mut socket, deleted()).await;
    })
    .await;
    let sub = subscribe_from_start(&fast_client(&[&node])).await;
    let events = collect(sub, false).await;
    let seen = sequences(&events);
    assert!(matches!(events.get(1), Some(Err(Error::Protocol { .. }))), "{seen:?}");
    assert_eq!(seen[..1], ["1"], "{seen:?}");
    assert_eq!(seen[2..], ["gap 1->3", "3", "deleted"], "{seen:?}");
    let rereads = limits::SUBSCRIPTION_UNPARSED_REREADS_MAX as usize;
    let mut cursors = vec![Some("0".to_string())];
    cursors.extend(std::iter::repeat_n(Some("1".to_string()), rereads));
    assert_eq!(log.lock().unwrap_or_else(|p| p.into_inner()).cursors, cursors);
}

#[tokio::test]
async fn latest_subscription_resumes_from_the_cursor_the_server_confirmed() {
    let log = Shared::default();
    let node = ws_node(log.clone(), |n, mut socket, _log| async move {
        if n == 0 {
            send(&mut socket, sub_frame(10)).await;
            send(&mut socket, msg(11)).await;
            let _ = socket.send(AxMessage::Close(None)).await;
        } else {
            send(&mut socket, sub_frame(11)).await;
            send(&mut socket, msg(12)).await;
            send(&mut socket, deleted()).await;
        }
    })
    .await;
    let sub = subscribe_latest(&fast_client(&[&node])).await;
    let events = collect(sub, false).await;
    assert_eq!(sequences(&events), vec!["11", "12", "deleted"]);
    let log = log.lock().unwrap_or_else(|p| p.into_inner());
    assert_eq!(log.cursors, vec![None, Some("11".to_string())]);
}

#[tokio::test]
async fn close_sends_the_latest_ack_even_while_the_application_queue_is_full() {
    let log = Shared::default();
    let (all_sent, acks_read) = (Arc::new(tokio::sync::Notify::new()), Arc::new(tokio::sync::Notify::new()));
    let (sent, read) = (all_sent.clone(), acks_read.clone());
    let node = ws_node(log.clone(), move |n, mut socket, log| {
        let (sent, read) = (sent.clone(), read.clone());
        async move {
            send(&mut socket, sub_frame(0)).await;
            // More than the application's queue holds: the subscription's task ends up
            // waiting for room instead of for the next frame or ack.
            for s in 1..=limits::SUBSCRIPTION_EVENTS_BUFFERED as u64 + 20 {
                send(&mut socket, msg(s)).await;
            }
            sent.notify_one();
            // Until ack 1, or until the connection ends without it.
            read_acks(&mut socket, &log, n, 1).await;
            read.notify_one();
        }
    })
    .await;
    let client = fast_client(&[&node]);
    let sub = subscribe_from_start(&client).await;
    all_sent.notified().await;
    // Every frame is in the socket's buffer; once the queue is full the task waits for room.
    while sub.events.len() < limits::SUBSCRIPTION_EVENTS_BUFFERED {
        tokio::task::yield_now().await;
    }
    sub.ack(1);
    sub.close().await;
    let _ = tokio::time::timeout(Duration::from_secs(10), acks_read.notified()).await;
    let log = log.lock().unwrap_or_else(|p| p.into_inner());
    assert_eq!(log.acks[0], vec![1], "the ack reached the node before the close");
}

#[tokio::test]
async fn an_unannounced_sequence_jump_is_reported_as_a_gap_error() {
    let node = ws_node(Shared::default(), |_, mut socket, _| async move {
        send(&mut socket, sub_frame(0)).await;
        send(&mut socket, msg(1)).await;
        send(&mut socket, msg(3)).await;
        send(&mut socket, deleted()).await;
    })
    .await;
    let client = fast_client(&[&node]);
    let sub = subscribe_from_start(&client).await;
    let events = collect(sub, false).await;
    assert_eq!(sequences(&events), vec!["1", "gap 1->3", "3", "deleted"]);
}

#[tokio::test]
async fn expiry_and_leader_change_are_events_and_update_the_leader_cache() {
    let node = ws_node(Shared::default(), |_, mut socket, _| async move {
        send(&mut socket, sub_frame(0)).await;
        send(
            &mut socket,
            json!({"type": "control", "subtype": "messages_expired", "topic": "t",
                   "requested_cursor": 0, "first_available_sequence": 5}),
        )
        .await;
        send(&mut socket, msg(5)).await;
        send(
            &mut socket,
            json!({"type": "control", "subtype": "leader_change", "new_leader": "10.1.1.1:8080",
                   "new_leader_id": "node-3", "reason": "election"}),
        )
        .await;
        send(&mut socket, msg(6)).await;
        send(&mut socket, deleted()).await;
    })
    .await;
    let client = fast_client(&[&node]);
    let sub = subscribe_from_start(&client).await;
    let events = collect(sub, false).await;
    assert_eq!(sequences(&events), vec!["expired->5", "5", "leader", "6", "deleted"]);
    assert_eq!(client.cached_leader(), Some("http://10.1.1.1:8080/".to_string()));
}

#[tokio::test]
async fn a_topic_with_no_room_for_our_cursor_is_an_event_and_the_stream_goes_on() {
    let node = ws_node(Shared::default(), |_, mut socket, _| async move {
        send(&mut socket, sub_frame(0)).await;
        send(
            &mut socket,
            json!({"type": "control", "subtype": "acks_not_recorded", "topic": "t", "subscriber_id": "s",
                   "recorded_cursors_max": 10000}),
        )
        .await;
        send(&mut socket, msg(1)).await;
        send(&mut socket, deleted()).await;
    })
    .await;
    let client = fast_client(&[&node]);
    let events = collect(subscribe_from_start(&client).await, false).await;
    assert_eq!(sequences(&events), vec!["acks not recorded (10000)", "1", "deleted"]);
}

/// A node that answers every subscription `404 topic_not_found` (one behind, or the topic gone).
async fn node_without_the_topic() -> String {
    serve(Router::new().route(
        "/topics/{name}/subscribe",
        get(|| async { error_response(404, "topic_not_found", json!({})) as Response }),
    ))
    .await
}

#[tokio::test]
async fn a_refused_subscription_returns_the_servers_error() {
    let node = node_without_the_topic().await;
    let client = fast_client(&[&node]);
    let sub = client.subscribe("nope", SubscribeOptions::new("s")).await;
    assert!(matches!(&sub, Err(Error::Api(api)) if api.code == ErrorCode::TopicNotFound), "{:?}", sub.err());
}

#[tokio::test]
async fn a_follower_that_has_not_applied_the_topic_yet_is_skipped_for_the_next_node() {
    let lagging = node_without_the_topic().await;
    let log = Shared::default();
    let current = ws_node(log.clone(), |_, mut socket, _| async move {
        send(&mut socket, sub_frame(0)).await;
        send(&mut socket, msg(1)).await;
        send(&mut socket, deleted()).await;
    })
    .await;
    let client = fast_client(&[&lagging, &current]);
    let sub = client.subscribe("t", SubscribeOptions::new("s").cursor(Cursor::After(0))).await;
    let sub = match sub {
        Ok(s) => s,
        Err(e) => panic!("the up-to-date node should have served it: {e}"),
    };
    assert_eq!(sequences(&collect(sub, false).await), vec!["1", "deleted"]);

    // When every known node denies the topic, it does not exist.
    let other = node_without_the_topic().await;
    let client = fast_client(&[&lagging, &other]);
    let sub = client.subscribe("t", SubscribeOptions::new("s")).await;
    assert!(matches!(&sub, Err(Error::Api(api)) if api.code == ErrorCode::TopicNotFound), "{:?}", sub.err());
}

/// A client given only a follower that has not applied the topic's creation yet asks it for
/// the cluster's members before taking its `404` as final, and subscribes on the leader.
#[tokio::test]
async fn a_lagging_seed_is_not_the_last_word_the_cluster_it_names_is_asked() {
    let current = ws_node(Shared::default(), |_, mut socket, _| async move {
        send(&mut socket, sub_frame(0)).await;
        send(&mut socket, msg(1)).await;
        send(&mut socket, deleted()).await;
    })
    .await;
    let lagging = serve_with(|me| {
        let cluster = cluster_body("node-2", Some(&current), &[&me, &current]);
        Router::new()
            .route("/cluster", get(move || async move { axum::Json(cluster) }))
            .route("/topics/{name}/subscribe", get(|| async { error_response(404, "topic_not_found", json!({})) }))
    })
    .await;
    let client = fast_client(&[&lagging]);
    let sub = match client.subscribe("t", SubscribeOptions::new("s").cursor(Cursor::After(0))).await {
        Ok(s) => s,
        Err(e) => panic!("the leader the seed names should have served it: {e}"),
    };
    assert_eq!(sequences(&collect(sub, false).await), vec!["1", "deleted"]);
}

/// A node still behind denies the topic; the only node that would serve it is down. Running
/// out of retries on that denial is not the cluster saying the topic is gone: neither at the
/// start, nor on a reconnect, where it would end the subscription with `TopicDeleted`.
#[tokio::test]
async fn a_topic_denied_only_by_a_lagging_node_while_the_others_are_down_is_not_deleted() {
    let lagging = node_without_the_topic().await;
    let dead = crate::test_support::dead_address().await;
    // Both orders of the nodes: in one of them the last attempt is the denial.
    for nodes in [[&lagging, &dead], [&dead, &lagging]] {
        let client = fast_client(&nodes.map(String::as_str));
        let sub = client.subscribe("t", SubscribeOptions::new("s").cursor(Cursor::After(0))).await;
        assert!(matches!(&sub, Err(e) if e.is_unreachable()), "{:?}", sub.err());
    }

    // Connected to the up-to-date node, which then goes away.
    for up_to_date_first in [true, false] {
        let up_to_date = ws_node(Shared::default(), |n, mut socket, _| async move {
            if n == 0 {
                send(&mut socket, sub_frame(0)).await;
                send(&mut socket, msg(1)).await;
            }
        })
        .await;
        let nodes = if up_to_date_first { [&up_to_date, &lagging] } else { [&lagging, &up_to_date] };
        let client = fast_client(&nodes.map(String::as_str));
        let sub = match client.subscribe("t", SubscribeOptions::new("s").cursor(Cursor::After(0))).await {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        };
        let events = collect(sub, false).await;
        assert_eq!(sequences(&events).first().map(String::as_str), Some("1"));
        assert!(matches!(events.last(), Some(Err(e)) if e.is_unreachable()), "{:?}", sequences(&events));
    }
}

/// A node whose first connection serves a message and drops; then it answers 404
/// topic_not_found, as a node does for a deleted topic.
async fn node_whose_topic_is_deleted_after_one_message() -> String {
    let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let app = Router::new().route(
        "/topics/{name}/subscribe",
        get(move |ws: WebSocketUpgrade| {
            let connections = connections.clone();
            async move {
                if connections.fetch_add(1, std::sync::atomic::Ordering::SeqCst) > 0 {
                    return error_response(404, "topic_not_found", json!({})) as Response;
                }
                ws.on_upgrade(|mut socket| async move {
                    send(&mut socket, sub_frame(0)).await;
                    send(&mut socket, msg(1)).await;
                })
            }
        }),
    );
    serve(app).await
}

#[tokio::test]
async fn a_topic_deleted_while_the_connection_was_down_ends_with_topic_deleted() {
    let node = node_whose_topic_is_deleted_after_one_message().await;
    let client = fast_client(&[&node]);
    let sub = subscribe_from_start(&client).await;
    assert_eq!(sequences(&collect(sub, false).await), vec!["1", "deleted"]);
}

/// The same with three nodes: every one of them is asked before the topic counts as deleted.
/// Before, a reconnect that refreshed the node list took a round-robin step of its own, so
/// with three nodes one of them was never asked and the subscription ended unreachable.
/// A node that closes the connection (as a stopping one does, with 1001) hears the client's
/// close frame at once: unanswered, it would wait for it until its handshake timeout.
#[tokio::test]
async fn the_nodes_close_frame_is_answered_before_the_reconnect() {
    // What the node heard after its close frame: Some(true) for the client's close frame.
    let (heard, mut answered) = tokio::sync::watch::channel(None::<bool>);
    let heard = Arc::new(heard);
    let node = ws_node(Shared::default(), move |n, mut socket, _| {
        let heard = heard.clone();
        async move {
            if n == 0 {
                send(&mut socket, sub_frame(0)).await;
                send(&mut socket, msg(1)).await;
                let close = AxMessage::Close(Some(axum::extract::ws::CloseFrame {
                    code: 1001,
                    reason: "server shutting down".into(),
                }));
                let _ = socket.send(close).await;
                let reply = tokio::time::timeout(Duration::from_secs(1), async {
                    while let Some(Ok(frame)) = socket.recv().await {
                        if let AxMessage::Close(_) = frame {
                            return true;
                        }
                    }
                    false
                });
                heard.send_replace(Some(matches!(reply.await, Ok(true))));
            } else {
                send(&mut socket, sub_frame(1)).await;
                send(&mut socket, deleted()).await;
                let _ = socket.send(AxMessage::Close(None)).await;
            }
        }
    })
    .await;
    let client = fast_client(&[&node]);
    let sub = subscribe_from_start(&client).await;
    assert_eq!(sequences(&collect(sub, false).await), vec!["1", "deleted"]);
    let waited = tokio::time::timeout(Duration::from_secs(5), answered.wait_for(Option::is_some)).await;
    let heard = waited.ok().and_then(|r| r.ok().and_then(|v| *v));
    assert_eq!(heard, Some(true), "what the node heard after its close frame");
}

#[tokio::test]
async fn a_reconnect_asks_every_one_of_three_nodes() {
    let first = node_whose_topic_is_deleted_after_one_message().await;
    let (second, third) = (node_without_the_topic().await, node_without_the_topic().await);
    let client = fast_client(&[&first, &second, &third]);
    let sub = subscribe_from_start(&client).await;
    assert_eq!(sequences(&collect(sub, false).await), vec!["1", "deleted"]);
}

#[tokio::test]
async fn a_subscription_whose_nodes_stop_serving_ends_with_an_unreachable_error() {
    let node = ws_node(Shared::default(), |n, mut socket, _| async move {
        if n == 0 {
            send(&mut socket, sub_frame(0)).await;
            send(&mut socket, msg(1)).await;
        }
        // Later connections are accepted and dropped at once: the node is broken.
    })
    .await;
    let client = fast_client(&[&node]);
    let sub = subscribe_from_start(&client).await;
    let events = collect(sub, false).await;
    assert_eq!(sequences(&events).first().map(String::as_str), Some("1"));
    assert_eq!(events.len(), 2, "{:?}", sequences(&events));
    assert!(matches!(events.last(), Some(Err(e)) if e.is_unreachable()), "{:?}", sequences(&events));
}

/// While reconnects fail, the application hears of each failure (a subscription silent for
/// the whole budget could spend minutes on nodes that answer nothing), then of the error that
/// ends the stream.
#[tokio::test]
async fn reconnect_attempts_are_told_while_the_cluster_is_away() {
    use axum::response::IntoResponse;
    let served = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let app = Router::new().route(
        "/topics/{name}/subscribe",
        get(move |ws: WebSocketUpgrade| async move {
            if served.fetch_add(1, std::sync::atomic::Ordering::SeqCst) > 0 {
                return error_response(503, "unavailable", json!({}));
            }
            ws.on_upgrade(|mut socket| async move {
                send(&mut socket, sub_frame(0)).await;
                send(&mut socket, msg(1)).await;
            })
            .into_response()
        }),
    );
    let client = fast_client(&[&serve(app).await]);
    let events = collect(subscribe_from_start(&client).await, false).await;
    let attempts: Vec<u32> = events
        .iter()
        .filter_map(|e| match e {
            Ok(Event::Reconnecting { attempts, error }) => {
                assert!(error.contains("unavailable"), "{error}");
                Some(*attempts)
            }
            _ => None,
        })
        .collect();
    // fast_client's budget is 5: the fifth failure ends the stream instead.
    assert_eq!(attempts, vec![1, 2, 3, 4]);
    assert_eq!(sequences(&events).first().map(String::as_str), Some("1"));
    assert!(matches!(events.last(), Some(Err(Error::Api(api))) if api.status == 503), "{:?}", sequences(&events));
}

#[tokio::test]
async fn an_empty_subscriber_id_is_refused_locally() {
    let client = fast_client(&["127.0.0.1:9"]);
    let sub = client.subscribe("t", SubscribeOptions::new("")).await;
    assert!(matches!(sub, Err(Error::InvalidArgument(_))));
}

/// Given one address, a subscription learns the cluster's other nodes while that one is up:
/// it has somewhere to fail over to when that node goes.
#[tokio::test]
async fn a_subscription_given_one_address_learns_the_other_nodes() {
    let other = dead_address().await;
    let node = serve_with(move |me| {
        let cluster = cluster_body("node-1", Some(&me), &[&me, &other]);
        Router::new().route("/cluster", get(move || async move { axum::Json(cluster) })).route(
            "/topics/{name}/subscribe",
            get(|ws: WebSocketUpgrade| async move {
                ws.on_upgrade(|mut socket| async move {
                    send(&mut socket, sub_frame(0)).await;
                    while socket.recv().await.is_some() {}
                })
            }),
        )
    })
    .await;
    let client = fast_client(&[&node]);
    assert_eq!(client.nodes().len(), 1);
    let sub = match client.subscribe("t", SubscribeOptions::new("s")).await {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(client.nodes().len(), 2, "{:?}", client.nodes());
    drop(sub);
}

/// A refusal whose body was lost on the way (tungstenite keeps only what came with the
/// headers) is still read as the topic's 404: the next node is tried.
#[tokio::test]
async fn a_bare_404_refusal_is_a_lagging_node_too() {
    let bare =
        serve(Router::new().route("/topics/{name}/subscribe", get(|| async { axum::http::StatusCode::NOT_FOUND })))
            .await;
    let log = Shared::default();
    let current = ws_node(log.clone(), |_, mut socket, _| async move {
        send(&mut socket, sub_frame(0)).await;
        send(&mut socket, msg(1)).await;
        send(&mut socket, deleted()).await;
    })
    .await;
    let client = fast_client(&[&bare, &current]);
    let sub = match client.subscribe("t", SubscribeOptions::new("s").cursor(Cursor::After(0))).await {
        Ok(s) => s,
        Err(e) => panic!("the node that serves it should have been tried: {e}"),
    };
    assert_eq!(sequences(&collect(sub, false).await), vec!["1", "deleted"]);
}

/// After `topic_deleted` the stream ends even when the node then neither closes the
/// connection nor reads the client's close (a connection gone half-open): `next()` gives
/// `None` within the close timeout instead of waiting for good.
#[tokio::test]
async fn the_stream_ends_after_topic_deleted_on_a_connection_that_went_silent() {
    let log = Shared::default();
    let node = ws_node(log.clone(), |_, mut socket, _| async move {
        send(&mut socket, sub_frame(0)).await;
        send(&mut socket, msg(1)).await;
        send(&mut socket, deleted()).await;
        // Holds the connection open and reads nothing, the close frame included.
        tokio::time::sleep(Duration::from_secs(60)).await;
        drop(socket);
    })
    .await;
    let client = fast_client(&[&node]);
    let mut sub = subscribe_from_start(&client).await;
    assert!(matches!(sub.next().await, Some(Ok(Event::Message(m))) if m.sequence == 1));
    assert!(matches!(sub.next().await, Some(Ok(Event::TopicDeleted))));
    let end = tokio::time::timeout(limits::SUBSCRIPTION_CLOSE_TIMEOUT * 3, sub.next()).await;
    assert!(matches!(end, Ok(None)), "the stream did not end: {end:?}");
}

/// A node that takes the subscription and never sends its first frame holds an attempt for
/// the client's whole request timeout; the first connection still ends with the operation's
/// timeout, not an attempt's (or several) past it.
#[tokio::test]
async fn the_first_connection_ends_with_the_operation_timeout() {
    let node = ws_node(Shared::default(), |_, socket, _| async move {
        tokio::time::sleep(Duration::from_secs(30)).await;
        drop(socket);
    })
    .await;
    let client = match crate::Client::builder([node])
        .request_timeout(Duration::from_secs(10))
        .operation_timeout(Duration::from_secs(1))
        .build()
    {
        Ok(c) => c,
        Err(e) => panic!("client: {e}"),
    };
    let started = std::time::Instant::now();
    let refused = client.subscribe("t", SubscribeOptions::new("s")).await;
    assert!(refused.is_err(), "no subscription without its first frame");
    // An attempt alone would take its 10 s; the margin is for a loaded machine.
    assert!(started.elapsed() < Duration::from_secs(6), "took {:?}", started.elapsed());
}
