use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{Message as AxMessage, WebSocket, WebSocketUpgrade};
use axum::routing::get;
use axum::{Json, Router};
use futures_util::future::join_all;
use serde_json::json;

use super::*;
use crate::test_support::{cluster_body, error_response, fast_client, next_json, publish_ack, serve_with};

/// A leader whose publishing WebSocket runs `session`.
async fn leader<F, Fut>(session: F) -> String
where
    F: Fn(WebSocket) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    serve_with(move |me| {
        let cluster = cluster_body("node-1", Some(&me), &[]);
        Router::new().route("/cluster", get(move || async move { Json(cluster) })).route(
            "/topics/{name}/publish",
            get(move |ws: WebSocketUpgrade| {
                let session = session.clone();
                async move { ws.on_upgrade(session) }
            }),
        )
    })
    .await
}

async fn send(socket: &mut WebSocket, text: String) {
    let _ = socket.send(AxMessage::Text(text.into())).await;
}

/// A leader that reads publish frames without answering any, counting them, and drops the
/// socket once it has read `until` of them.
async fn counting_leader(until: usize) -> (String, Arc<AtomicUsize>) {
    let received = Arc::new(AtomicUsize::new(0));
    let seen = received.clone();
    let node = leader(move |mut socket| {
        let seen = seen.clone();
        async move {
            while seen.load(Ordering::SeqCst) < until && next_json(&mut socket).await.is_some() {
                seen.fetch_add(1, Ordering::SeqCst);
            }
        }
    })
    .await;
    (node, received)
}

async fn open(client: &Client) -> Publisher {
    match client.publisher("t").await {
        Ok(p) => p,
        Err(e) => panic!("publisher: {e}"),
    }
}

/// Told by a fake node's session when it ends: the client closed the connection.
#[derive(Clone)]
struct SessionEnd(Arc<std::sync::Mutex<Option<tokio::sync::oneshot::Sender<()>>>>);

impl SessionEnd {
    fn new() -> (SessionEnd, tokio::sync::oneshot::Receiver<()>) {
        let (ended, ends) = tokio::sync::oneshot::channel();
        (SessionEnd(Arc::new(std::sync::Mutex::new(Some(ended)))), ends)
    }

    fn tell(&self) {
        if let Some(ended) = self.0.lock().unwrap().take() {
            let _ = ended.send(());
        }
    }
}

/// True when the session told of its end within 5 s.
async fn ended_in_time(ends: tokio::sync::oneshot::Receiver<()>) -> bool {
    matches!(tokio::time::timeout(Duration::from_secs(5), ends).await, Ok(Ok(())))
}

fn message(id: &str) -> NewMessage {
    NewMessage::new(json!({"n": id})).with_id(id)
}

#[tokio::test]
async fn acks_are_paired_by_ref_even_when_they_come_in_reverse_order() {
    let node = leader(|mut socket| async move {
        let mut frames = Vec::new();
        while frames.len() < 3 {
            match next_json(&mut socket).await {
                Some(frame) => frames.push(frame),
                None => return,
            }
        }
        // Sequence by arrival, answers last to first.
        let acks: Vec<String> = frames.iter().zip(1..).map(|(f, seq)| publish_ack(f, seq)).collect();
        for ack in acks.into_iter().rev() {
            send(&mut socket, ack).await;
        }
        while next_json(&mut socket).await.is_some() {}
    })
    .await;
    let client = fast_client(&[&node]);
    let publisher = open(&client).await;
    let clone = publisher.clone();
    let outcomes =
        join_all([publisher.publish(message("a")), clone.publish(message("b")), publisher.publish(message("c"))]).await;
    let mut sequences = Vec::new();
    for (outcome, id) in outcomes.into_iter().zip(["a", "b", "c"]) {
        match outcome {
            Ok(ack) => {
                assert_eq!(ack.id, id);
                assert_eq!(ack.topic, "t");
                assert!(ack.committed && !ack.duplicate);
                assert_eq!(ack.raft_index, ack.sequence.map(|s| s + 100));
                sequences.extend(ack.sequence);
            }
            Err(e) => panic!("{id}: {e}"),
        }
    }
    sequences.sort_unstable();
    assert_eq!(sequences, vec![1, 2, 3]);
    assert_eq!(publisher.in_flight(), 0);
    assert!(!publisher.is_closed());
}

#[tokio::test]
async fn error_frames_map_to_the_errors_the_http_publish_gives() {
    let node = leader(|mut socket| async move {
        while let Some(frame) = next_json(&mut socket).await {
            let id = frame["id"].as_str().unwrap_or_default().to_string();
            let mut answer = json!({"type": "error", "ref": frame["ref"], "error": id, "message": "no", "details": {}});
            match id.as_str() {
                "duplicate_message_id" => {
                    answer["id"] = json!(id);
                    answer["existing_sequence"] = json!(42);
                }
                "not_leader" => answer["leader_address"] = json!("127.0.0.1:9"),
                _ => {}
            }
            send(&mut socket, answer.to_string()).await;
        }
    })
    .await;
    let client = fast_client(&[&node]);
    let publisher = open(&client).await;

    match publisher.publish(message("duplicate_message_id")).await {
        Err(Error::Api(e)) => {
            assert_eq!((e.status, e.code.clone()), (409, ErrorCode::DuplicateMessageId));
            assert_eq!(e.existing_sequence(), Some(42));
        }
        other => panic!("{other:?}"),
    }
    match publisher.publish(message("topic_not_found")).await {
        Err(Error::Api(e)) => assert_eq!((e.status, e.code), (404, ErrorCode::TopicNotFound)),
        other => panic!("{other:?}"),
    }
    // Refused before anything was proposed: not an unknown outcome, though a 5xx.
    match publisher.publish(message("insufficient_storage")).await {
        Err(Error::Api(e)) => assert_eq!((e.status, e.code), (507, ErrorCode::InsufficientStorage)),
        other => panic!("{other:?}"),
    }
    // A refusal after which the message may still commit names its id (error frames carry
    // none), so that the caller can publish it again under the same id.
    let maybe_stored = |result: Result<PublishAck, Error>, expected_id: &str| match result {
        Err(Error::Indeterminate { id: Some(id), source, .. }) if id == expected_id => *source,
        other => panic!("{expected_id}: {other:?}"),
    };
    for (code, status) in [("raft_timeout", 504), ("not_committed", 500)] {
        match maybe_stored(publisher.publish(message(code)).await, code) {
            Error::Api(e) => assert_eq!((e.status, e.code.to_string()), (status, code.to_string())),
            other => panic!("{other:?}"),
        }
    }
    // Refusals of a message leave the connection usable.
    assert!(!publisher.is_closed());

    // Leadership refusals close the publisher: a new one must find the leader.
    let no_leader = maybe_stored(publisher.publish(message("no_leader")).await, "no_leader");
    assert!(matches!(no_leader, Error::NoLeader { attempts: 1, .. }), "{no_leader:?}");
    // `no_leader` forgets the cached leader; `not_leader` caches the one it names.
    assert_eq!(client.cached_leader(), None);
    assert!(publisher.is_closed());
    assert!(matches!(publisher.publish(message("m-after")).await, Err(Error::Unreachable { .. })));
    let publisher = open(&client).await;
    match maybe_stored(publisher.publish(message("not_leader")).await, "not_leader") {
        Error::Api(e) => assert_eq!((e.status, e.code), (307, ErrorCode::NotLeader)),
        other => panic!("{other:?}"),
    }
    assert_eq!(client.cached_leader().as_deref(), Some("http://127.0.0.1:9/"));
    assert!(publisher.is_closed());
}

/// A duplicate whose first publish is still in flight (`existing_sequence: null`) may yet
/// fail on the leader, so the message may or may not end up stored: not a final `409`.
#[tokio::test]
async fn a_duplicate_still_in_flight_is_indeterminate_and_names_the_id() {
    let node = leader(|mut socket| async move {
        while let Some(frame) = next_json(&mut socket).await {
            let answer = json!({"type": "error", "ref": frame["ref"], "error": "duplicate_message_id",
                                "message": "in flight", "id": frame["id"], "existing_sequence": null,
                                "details": {"existing_sequence": null}});
            send(&mut socket, answer.to_string()).await;
        }
    })
    .await;
    let client = fast_client(&[&node]);
    let publisher = open(&client).await;
    let outcome = publisher.publish(message("m-1")).await;
    let in_flight = match &outcome {
        Err(Error::Indeterminate { id: Some(id), source, .. }) if id == "m-1" => {
            matches!(&**source, Error::Api(e) if e.status == 409 && e.existing_sequence().is_none())
        }
        _ => false,
    };
    assert!(in_flight, "{outcome:?}");
    // Only leadership refusals close the publisher.
    assert!(!publisher.is_closed());
}

/// A node that stops leading still answers what it took, acks among them: the publisher
/// takes no new publish after `not_leader`, but the ones in flight get their own answers,
/// and the connection closes after the last.
#[tokio::test]
async fn after_not_leader_the_publishes_in_flight_still_get_their_answers() {
    let (ended, ends) = SessionEnd::new();
    let node = leader(move |mut socket| {
        let ended = ended.clone();
        async move {
            let mut frames = Vec::new();
            while frames.len() < 3 {
                match next_json(&mut socket).await {
                    Some(frame) => frames.push(frame),
                    None => return,
                }
            }
            let refused = json!({"type": "error", "ref": frames[0]["ref"], "error": "not_leader",
                                 "message": "moved", "leader_address": "127.0.0.1:9", "details": {}});
            send(&mut socket, refused.to_string()).await;
            // The answers still due come a little later, as commits do.
            tokio::time::sleep(Duration::from_millis(50)).await;
            send(&mut socket, publish_ack(&frames[1], 7)).await;
            send(&mut socket, publish_ack(&frames[2], 8)).await;
            while next_json(&mut socket).await.is_some() {}
            ended.tell();
        }
    })
    .await;
    let client = fast_client(&[&node]);
    let publisher = open(&client).await;
    let (refused, second, third) =
        tokio::join!(publisher.publish(message("a")), publisher.publish(message("b")), publisher.publish(message("c")));
    let refused_not_leader = match &refused {
        Err(Error::Indeterminate { id: Some(id), source, .. }) if id == "a" => {
            matches!(&**source, Error::Api(e) if e.code == ErrorCode::NotLeader)
        }
        _ => false,
    };
    assert!(refused_not_leader, "{refused:?}");
    assert_eq!(second.expect("acked after the refusal").sequence, Some(7));
    assert_eq!(third.expect("acked after the refusal").sequence, Some(8));
    assert!(publisher.is_closed());
    assert!(matches!(publisher.publish(message("d")).await, Err(Error::Unreachable { .. })));
    assert!(ended_in_time(ends).await, "the connection stayed open after its last answer");
}

#[tokio::test]
async fn a_dropped_connection_fails_pending_publishes_and_every_later_one() {
    // Drops the socket with both publishes unanswered.
    let (node, received) = counting_leader(2).await;
    let client = fast_client(&[&node]);
    let publisher = open(&client).await;
    let outcomes = join_all([publisher.publish(message("a")), publisher.publish(message("b"))]).await;
    for (outcome, id) in outcomes.into_iter().zip(["a", "b"]) {
        // Sent and unanswered: it may be stored, and the error names its id.
        assert!(
            matches!(&outcome, Err(e @ Error::Indeterminate { id: Some(i), .. }) if e.is_unreachable() && i == id),
            "{outcome:?}"
        );
        // The id to publish it again with, generated or not.
        assert!(outcome.unwrap_err().to_string().contains(&format!("message {id:?}")));
    }
    assert_eq!(received.load(Ordering::SeqCst), 2);
    assert!(publisher.is_closed());
    assert_eq!(publisher.in_flight(), 0);
    let later = tokio::time::timeout(Duration::from_secs(1), publisher.publish(message("c"))).await;
    assert!(matches!(later, Ok(Err(Error::Unreachable { .. }))), "{later:?}");
}

/// The wait is `PUBLISH_WS_ANSWER_TIMEOUT_MIN` (10 s), longer than the client's request timeout.
#[tokio::test]
async fn an_unanswered_publish_times_out_and_closes_the_connection() {
    let (ended, ends) = SessionEnd::new();
    let node = leader(move |mut socket| {
        let ended = ended.clone();
        async move {
            while next_json(&mut socket).await.is_some() {}
            ended.tell();
        }
    })
    .await;
    let client = fast_client(&[&node]);
    let publisher = open(&client).await;
    let unanswered = publisher.publish(message("a")).await;
    assert!(
        matches!(&unanswered, Err(Error::Indeterminate { source, .. }) if matches!(**source, Error::Timeout { attempts: 1, .. })),
        "{unanswered:?}"
    );
    assert!(publisher.is_closed());
    // The socket is closed now, while the publisher is still held, not when it is dropped.
    assert!(ended_in_time(ends).await, "the node still holds the connection");
    drop(publisher);
}

/// A node that answers the others' publishes but not this one (it may hold a frame while its
/// budgets are full) is slow, not gone: the publish alone ends `Indeterminate`, and the
/// connection goes on. Takes `PUBLISH_WS_ANSWER_TIMEOUT_MIN` (10 s).
#[tokio::test]
async fn a_publish_unanswered_by_a_node_that_answers_others_times_out_alone() {
    let node = leader(|mut socket| async move {
        let mut sequence = 0;
        while let Some(frame) = next_json(&mut socket).await {
            if frame["id"] != "held" {
                sequence += 1;
                send(&mut socket, publish_ack(&frame, sequence)).await;
            }
        }
    })
    .await;
    let client = fast_client(&[&node]);
    let publisher = open(&client).await;
    let others = {
        let publisher = publisher.clone();
        tokio::spawn(async move {
            for n in 0.. {
                if publisher.publish(message(&format!("m{n}"))).await.is_err() {
                    return n;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            unreachable!()
        })
    };
    let held = publisher.publish(message("held")).await;
    assert!(
        matches!(&held, Err(Error::Indeterminate { id: Some(id), source, .. }) if id == "held" && matches!(**source, Error::Timeout { .. })),
        "{held:?}"
    );
    assert!(!publisher.is_closed(), "the connection of a node that still answers stays open");
    let next = publisher.publish(message("after")).await;
    assert!(matches!(next, Ok(PublishAck { sequence: Some(_), .. })), "{next:?}");
    assert!(!others.is_finished(), "the other publishes went on being acked");
    others.abort();
}

#[tokio::test]
async fn publishes_in_flight_are_bounded_by_the_servers_limit() {
    let (node, received) = counting_leader(usize::MAX).await;
    let client = fast_client(&[&node]);
    let publisher = open(&client).await;
    let extra = 10;
    let tasks: Vec<_> = (0..limits::PUBLISH_WS_INFLIGHT_MAX + extra)
        .map(|n| {
            let publisher = publisher.clone();
            tokio::spawn(async move { publisher.publish(message(&format!("m{n}"))).await })
        })
        .collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while received.load(Ordering::SeqCst) < limits::PUBLISH_WS_INFLIGHT_MAX && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A moment more: any publish past the limit would have been sent by now.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(received.load(Ordering::SeqCst), limits::PUBLISH_WS_INFLIGHT_MAX);
    assert_eq!(publisher.in_flight(), limits::PUBLISH_WS_INFLIGHT_MAX);
    for task in tasks {
        task.abort();
    }
}

#[tokio::test]
async fn a_frame_larger_than_the_server_reads_is_refused_before_sending() {
    let node = leader(|mut socket| async move { while next_json(&mut socket).await.is_some() {} }).await;
    let client = fast_client(&[&node]);
    let publisher = open(&client).await;
    let huge = NewMessage::new(json!("x".repeat(limits::PUBLISH_WS_FRAME_BYTES_MAX)));
    assert!(matches!(publisher.publish(huge).await, Err(Error::InvalidArgument(_))));
    assert!(!publisher.is_closed());
    assert_eq!(publisher.in_flight(), 0);
}

#[tokio::test]
async fn opening_follows_a_followers_redirect_to_the_leader() {
    let leader_node = leader(|mut socket| async move {
        while let Some(frame) = next_json(&mut socket).await {
            send(&mut socket, publish_ack(&frame, 1)).await;
        }
    })
    .await;
    let to = leader_node.clone();
    // A follower that believes itself the leader in `/cluster` but redirects the upgrade.
    let follower = serve_with(move |me| {
        let cluster = cluster_body("node-2", Some(&me), &[]);
        Router::new().route("/cluster", get(move || async move { Json(cluster) })).route(
            "/topics/{name}/publish",
            get(move || {
                let to = to.clone();
                async move { error_response(307, "not_leader", json!({"leader_id": "node-1", "leader_address": to})) }
            }),
        )
    })
    .await;
    let client = fast_client(&[&follower]);
    let publisher = open(&client).await;
    assert_eq!(publisher.node(), format!("http://{leader_node}/"));
    assert_eq!(client.cached_leader(), Some(format!("http://{leader_node}/")));
    match publisher.publish(message("a")).await {
        Ok(ack) => assert_eq!(ack.sequence, Some(1)),
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test]
async fn an_unknown_topic_is_refused_at_the_upgrade() {
    let node = serve_with(|me| {
        let cluster = cluster_body("node-1", Some(&me), &[]);
        Router::new()
            .route("/cluster", get(move || async move { Json(cluster) }))
            .route("/topics/{name}/publish", get(|| async { error_response(404, "topic_not_found", json!({})) }))
    })
    .await;
    let client = fast_client(&[&node]);
    match client.publisher("t").await {
        Err(Error::Api(e)) => assert_eq!(e.code, ErrorCode::TopicNotFound),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn opening_against_a_dead_cluster_is_unreachable() {
    let dead = crate::test_support::dead_address().await;
    let client = fast_client(&[&dead]);
    assert!(matches!(client.publisher("t").await, Err(e) if e.is_unreachable()));
}

#[test]
fn a_publish_holds_its_bytes_of_the_budget_and_at_least_a_slots_share() {
    let share = (limits::PUBLISH_WS_INFLIGHT_BYTES_MAX / limits::PUBLISH_WS_INFLIGHT_MAX) as u32;
    assert_eq!(super::slot_weight(300), share);
    assert_eq!(super::slot_weight(1024 * 1024), 1024 * 1024);
    // 4096 small publishes fill it, as do 64 of a megabyte: the server's two limits.
    assert_eq!(share as usize * limits::PUBLISH_WS_INFLIGHT_MAX, limits::PUBLISH_WS_INFLIGHT_BYTES_MAX);
}
