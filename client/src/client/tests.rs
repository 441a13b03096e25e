use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::Query;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use futures_util::StreamExt;
use serde_json::{json, Value};

use super::*;
use crate::error::ApiError;
use crate::test_support::{
    cluster_body, dead_address, error_response, fast_client, impatient_client, serve, serve_with,
};

/// Bodies received by a mock endpoint, in order.
type Seen = Arc<Mutex<Vec<Value>>>;

fn seen() -> Seen {
    Arc::new(Mutex::new(Vec::new()))
}

fn record(seen: &Seen, body: &[u8]) -> usize {
    let value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let mut list = seen.lock().unwrap_or_else(|p| p.into_inner());
    list.push(value);
    list.len()
}

fn bodies(seen: &Seen) -> Vec<Value> {
    seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// A single node that leads and answers publishes with `answer(attempt, body)`.
async fn leader_node(seen: Seen, answer: impl Fn(usize, &Value) -> Response + Clone + Send + Sync + 'static) -> String {
    serve_with(move |me| {
        let cluster = cluster_body("node-1", Some(&me), &[&me]);
        Router::new().route("/cluster", get(move || async move { Json(cluster) })).route(
            "/topics/{name}/messages",
            post(move |body: Bytes| async move {
                let n = record(&seen, &body);
                let last = bodies(&seen).pop().unwrap_or(Value::Null);
                answer(n, &last)
            }),
        )
    })
    .await
}

/// A handler that never answers within a test's life.
async fn never_answers() -> &'static str {
    tokio::time::sleep(std::time::Duration::from_secs(30)).await;
    "never"
}

/// A node that leads and never answers a POST to `path`.
async fn silent_leader(path: &'static str) -> String {
    serve_with(move |me| {
        let cluster = cluster_body("node-1", Some(&me), &[&me]);
        Router::new().route("/cluster", get(move || async move { Json(cluster) })).route(path, post(never_answers))
    })
    .await
}

fn published(body: &Value, sequence: u64) -> Response {
    (
        axum::http::StatusCode::CREATED,
        Json(json!({"id": body["id"], "topic": "t", "sequence": sequence,
                    "raft_index": 10, "committed": true})),
    )
        .into_response()
}

#[tokio::test]
async fn follows_307_to_the_leader_and_caches_it() {
    let leader_hits = seen();
    let leader = leader_node(leader_hits.clone(), |_, body| published(body, 1)).await;
    let follower_hits = seen();
    let follower = {
        let leader = leader.clone();
        let hits = follower_hits.clone();
        serve_with(move |me| {
            // A stale view: this follower still believes it leads.
            let cluster = cluster_body("node-2", Some(&me), &[&me]);
            Router::new().route("/cluster", get(move || async move { Json(cluster) })).route(
                "/topics/{name}/messages",
                post(move |body: Bytes| async move {
                    record(&hits, &body);
                    let mut r =
                        error_response(307, "not_leader", json!({"leader_id": "node-1", "leader_address": leader}));
                    if let Ok(v) = format!("http://{leader}/topics/t/messages").parse() {
                        r.headers_mut().insert("location", v);
                    }
                    r
                }),
            )
        })
        .await
    };
    let client = fast_client(&[&follower]);
    let first = client.publish("t", json!(1)).await;
    assert!(matches!(first, Ok(PublishAck { sequence: Some(1), duplicate: false, .. })), "{first:?}");
    assert_eq!(client.cached_leader(), Some(format!("http://{leader}/")));
    let second = client.publish("t", json!(2)).await;
    assert!(second.is_ok(), "{second:?}");
    assert_eq!(bodies(&follower_hits).len(), 1, "second publish went to the cached leader");
    assert_eq!(bodies(&leader_hits).len(), 2);
    // The redirected attempt carried the same id as the refused one.
    assert_eq!(bodies(&follower_hits)[0]["id"], bodies(&leader_hits)[0]["id"]);
}

#[tokio::test]
async fn redirect_with_only_a_location_header_is_followed() {
    let leader = leader_node(seen(), |_, body| published(body, 3)).await;
    let follower = {
        let leader = leader.clone();
        serve_with(move |me| {
            let cluster = cluster_body("node-2", Some(&me), &[]);
            Router::new().route("/cluster", get(move || async move { Json(cluster) })).route(
                "/topics/{name}/messages",
                post(move || async move {
                    let location = format!("http://{leader}/topics/t/messages");
                    (axum::http::StatusCode::TEMPORARY_REDIRECT, [("location", location)]).into_response()
                }),
            )
        })
        .await
    };
    let client = fast_client(&[&follower]);
    let ack = client.publish("t", json!("x")).await;
    assert!(matches!(ack, Ok(PublishAck { sequence: Some(3), .. })), "{ack:?}");
}

#[tokio::test]
async fn retry_after_503_keeps_the_same_message_id() {
    let hits = seen();
    let node = leader_node(hits.clone(), |n, body| {
        if n <= 2 {
            error_response(503, "no_leader", json!({}))
        } else {
            published(body, 9)
        }
    })
    .await;
    let client = fast_client(&[&node]);
    let ack = client.publish("t", json!({"a": 1})).await;
    let ack = match ack {
        Ok(a) => a,
        Err(e) => panic!("{e}"),
    };
    let ids: Vec<Value> = bodies(&hits).iter().map(|b| b["id"].clone()).collect();
    assert_eq!(ids.len(), 3);
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    assert_eq!(ids[0], json!(ack.id));
    assert!(uuid::Uuid::parse_str(&ack.id).is_ok(), "generated id is a UUID");
}

#[tokio::test]
async fn duplicate_on_a_retry_is_success_with_the_existing_sequence() {
    let hits = seen();
    let node = leader_node(hits.clone(), |n, body| {
        if n == 1 {
            error_response(504, "raft_timeout", json!({}))
        } else {
            error_response(409, "duplicate_message_id", json!({"id": body["id"], "existing_sequence": 7}))
        }
    })
    .await;
    let client = fast_client(&[&node]);
    let msg = NewMessage::new(json!(1)).with_id("order-1");
    let ack = client.publish_message("t", msg, AckMode::Committed).await;
    assert!(
        matches!(&ack, Ok(PublishAck { sequence: Some(7), duplicate: true, committed: true, id, .. }) if id == "order-1"),
        "{ack:?}"
    );
    assert_eq!(bodies(&hits).len(), 2);
}

/// An attempt that may have been stored, then a refusal that ends the retries: the outcome is
/// unknown (the first attempt may commit), not the refusal's.
#[tokio::test]
async fn a_refusal_after_an_attempt_that_may_have_been_stored_is_indeterminate() {
    let node = leader_node(seen(), |n, _| match n {
        1 => error_response(504, "raft_timeout", json!({})),
        _ => error_response(500, "internal", json!({})),
    })
    .await;
    let client = fast_client(&[&node]);
    let msg = NewMessage::new(json!(1)).with_id("order-2");
    let publish = client.publish_message("t", msg, AckMode::Committed).await;
    match &publish {
        Err(e @ Error::Indeterminate { id: Some(id), .. }) => {
            assert_eq!(id, "order-2");
            assert_eq!(e.api().map(|api| api.code.clone()), Some(ErrorCode::Internal), "{publish:?}");
        }
        other => panic!("{other:?}"),
    }
}

/// `507 insufficient_storage` is checked before anything is proposed: a final refusal, not
/// retried and not an unknown outcome, though it is a 5xx.
#[tokio::test]
async fn a_refusal_for_want_of_disk_is_final_and_stored_nothing() {
    let hits = seen();
    let node = leader_node(hits.clone(), |_, _| {
        error_response(507, "insufficient_storage", json!({"available_bytes": 1, "min_free_bytes": 2}))
    })
    .await;
    let client = fast_client(&[&node]);
    let msg = NewMessage::new(json!(1)).with_id("order-3");
    let publish = client.publish_message("t", msg, AckMode::Committed).await;
    match &publish {
        Err(e @ Error::Api(api)) => {
            assert_eq!(api.code, ErrorCode::InsufficientStorage);
            assert_eq!(api.status, 507);
            assert!(!e.may_have_taken_effect());
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(bodies(&hits).len(), 1, "not retried");
}

#[tokio::test]
async fn duplicate_still_in_flight_is_retried_until_it_has_a_sequence() {
    let hits = seen();
    let node = leader_node(hits.clone(), |n, body| match n {
        1 => error_response(504, "raft_timeout", json!({})),
        2 | 3 => error_response(409, "duplicate_message_id", json!({"id": body["id"], "existing_sequence": null})),
        _ => error_response(409, "duplicate_message_id", json!({"id": body["id"], "existing_sequence": 12})),
    })
    .await;
    let client = fast_client(&[&node]);
    let msg = NewMessage::new(json!(1)).with_id("slow-1");
    let ack = client.publish_message("t", msg, AckMode::Committed).await;
    assert!(matches!(&ack, Ok(PublishAck { sequence: Some(12), duplicate: true, committed: true, .. })), "{ack:?}");
    let ids: Vec<Value> = bodies(&hits).iter().map(|b| b["id"].clone()).collect();
    assert_eq!(ids, vec![json!("slow-1"); 4], "same id on every attempt");
}

#[tokio::test]
async fn in_flight_first_publish_that_fails_lets_the_retry_publish() {
    // The first try's entry was lost with its leader: the retry is stored as new.
    let node = leader_node(seen(), |n, body| match n {
        1 => error_response(500, "not_committed", json!({})),
        2 => error_response(409, "duplicate_message_id", json!({"id": body["id"], "existing_sequence": null})),
        _ => published(body, 5),
    })
    .await;
    let client = fast_client(&[&node]);
    let ack = client.publish("t", json!(1)).await;
    assert!(matches!(&ack, Ok(PublishAck { sequence: Some(5), duplicate: false, .. })), "{ack:?}");
}

#[tokio::test]
async fn duplicate_in_flight_for_the_whole_budget_is_an_error_not_a_success() {
    let hits = seen();
    let node = leader_node(hits.clone(), |_, body| {
        error_response(409, "duplicate_message_id", json!({"id": body["id"], "existing_sequence": null}))
    })
    .await;
    let client = fast_client(&[&node]);
    let result = client.publish("t", json!(1)).await;
    match result {
        Err(Error::Api(api)) => {
            assert_eq!(api.code, ErrorCode::DuplicateMessageId);
            assert_eq!(api.existing_sequence(), None);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(bodies(&hits).len(), 6, "the whole budget of fast_client");
}

#[tokio::test]
async fn duplicate_after_a_redirect_only_is_an_error() {
    // A 307 is never applied, so the 409 after it is about someone else's message.
    let leader =
        leader_node(seen(), |_, _| error_response(409, "duplicate_message_id", json!({"existing_sequence": 2}))).await;
    let follower = {
        let leader = leader.clone();
        serve_with(move |me| {
            let cluster = cluster_body("node-2", Some(&me), &[&me]);
            Router::new().route("/cluster", get(move || async move { Json(cluster) })).route(
                "/topics/{name}/messages",
                post(move || async move {
                    error_response(307, "not_leader", json!({"leader_id": "node-1", "leader_address": leader}))
                }),
            )
        })
        .await
    };
    let client = fast_client(&[&follower]);
    let msg = NewMessage::new(json!(1)).with_id("reused");
    let result = client.publish_message("t", msg, AckMode::Committed).await;
    assert!(matches!(&result, Err(Error::Api(api)) if api.existing_sequence() == Some(2)), "{result:?}");
}

#[tokio::test]
async fn duplicate_on_the_first_attempt_is_an_error() {
    let node =
        leader_node(seen(), |_, _| error_response(409, "duplicate_message_id", json!({"existing_sequence": 4}))).await;
    let client = fast_client(&[&node]);
    let msg = NewMessage::new(json!(1)).with_id("reused");
    let err = client.publish_message("t", msg, AckMode::Committed).await;
    match err {
        Err(Error::Api(api)) => {
            assert_eq!(api.code, ErrorCode::DuplicateMessageId);
            assert_eq!(api.existing_sequence(), Some(4));
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn appended_ack_mode_is_sent_as_a_query_parameter() {
    let queries = seen();
    let node = {
        let queries = queries.clone();
        serve_with(move |me| {
            let cluster = cluster_body("node-1", Some(&me), &[]);
            Router::new().route("/cluster", get(move || async move { Json(cluster) })).route(
                "/topics/{name}/messages",
                post(move |Query(q): Query<std::collections::HashMap<String, String>>, body: Bytes| async move {
                    let q = serde_json::to_vec(&q).unwrap_or_default();
                    record(&queries, &q);
                    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    (
                        axum::http::StatusCode::ACCEPTED,
                        Json(json!({"id": body["id"], "topic": "t", "sequence": null,
                                            "raft_index": 3, "committed": false})),
                    )
                }),
            )
        })
        .await
    };
    let client = fast_client(&[&node]);
    let ack = client.publish_message("t", NewMessage::new(json!(1)), AckMode::Appended).await;
    assert!(matches!(ack, Ok(PublishAck { sequence: None, committed: false, .. })), "{ack:?}");
    assert_eq!(bodies(&queries), vec![json!({"ack": "appended"})]);
}

/// An answer whose connection breaks: before its head (the stream fails before hyper flushes
/// anything) or in its body, after the client has read the head and a first chunk.
fn broken_answer(head_first: bool) -> Response {
    let broken = futures_util::stream::iter([false, true]).then(move |cut| async move {
        if !cut {
            return Ok(Bytes::from_static(b"{\"id\""));
        }
        if head_first {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        Err(std::io::Error::other("cut"))
    });
    (axum::http::StatusCode::CREATED, axum::body::Body::from_stream(broken)).into_response()
}

#[tokio::test]
async fn an_answer_cut_off_after_the_request_counts_as_maybe_applied() {
    // The request was sent, so the publish may have been stored: a duplicate on the retry is
    // that publish, not an error.
    for head_first in [false, true] {
        let hits = seen();
        let node = leader_node(hits.clone(), move |n, body| {
            if n == 1 {
                broken_answer(head_first)
            } else {
                error_response(409, "duplicate_message_id", json!({"id": body["id"], "existing_sequence": 7}))
            }
        })
        .await;
        let client = fast_client(&[&node]);
        let ack = client.publish_message("t", NewMessage::new(json!(1)).with_id("cut-1"), AckMode::Committed).await;
        assert!(matches!(&ack, Ok(PublishAck { sequence: Some(7), duplicate: true, .. })), "{head_first}: {ack:?}");
        assert_eq!(bodies(&hits).len(), 2);
    }
}

#[tokio::test]
async fn a_node_that_never_answers_is_a_timeout() {
    let node = silent_leader("/topics/{name}/messages").await;
    let client = impatient_client(&node, 2);
    let started = std::time::Instant::now();
    let publish = client.publish("t", json!(1)).await;
    // Sent and never answered: it may be stored.
    assert!(
        matches!(&publish, Err(Error::Indeterminate { source, .. }) if matches!(**source, Error::Timeout { attempts: 2, .. })),
        "{publish:?}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "each attempt waited its own timeout only");
}

/// A batch sent and never answered may be stored: the error names every message's id, the
/// generated ones too, so that the caller can publish the batch again without a second copy.
#[tokio::test]
async fn a_batch_that_is_never_answered_names_its_ids() {
    let node = silent_leader("/topics/{name}/messages/batch").await;
    let client = impatient_client(&node, 2);
    let batch = vec![NewMessage::new(json!(1)).with_id("given"), NewMessage::new(json!(2))];
    let publish = client.publish_batch("t", batch).await;
    match &publish {
        Err(e @ Error::Indeterminate { id: None, ids, .. }) => {
            assert_eq!(ids.len(), 2, "{ids:?}");
            assert_eq!(ids[0], "given");
            assert!(!ids[1].is_empty() && ids[1] != "given", "{ids:?}");
            assert!(e.to_string().contains("batch of 2 messages (given … "), "{e}");
        }
        other => panic!("{other:?}"),
    }
}

/// The answer to a publish is lost, then the cluster has no leader until the retries run out:
/// the error says the message may be stored, with its (generated) id, rather than only that no
/// leader was found, which would read as "not stored" and invite a second copy.
#[tokio::test]
async fn a_publish_whose_answer_was_lost_stays_indeterminate_whatever_fails_after() {
    let leaderless = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let node = {
        let leaderless = leaderless.clone();
        serve_with(move |me| {
            let (with_leader, without) =
                (cluster_body("node-1", Some(&me), &[&me]), cluster_body("node-1", None, &[&me]));
            let flag = leaderless.clone();
            Router::new()
                .route(
                    "/cluster",
                    get(move || async move {
                        Json(if flag.load(std::sync::atomic::Ordering::SeqCst) { without } else { with_leader })
                    }),
                )
                .route(
                    "/topics/{name}/messages",
                    post(move || async move {
                        leaderless.store(true, std::sync::atomic::Ordering::SeqCst);
                        tokio::time::sleep(std::time::Duration::from_secs(30)).await;
                        "never"
                    }),
                )
        })
        .await
    };
    let client = impatient_client(&node, 4);
    let publish = client.publish("t", json!(1)).await;
    match &publish {
        Err(e @ Error::Indeterminate { id: Some(id), source, .. }) => {
            assert!(matches!(**source, Error::NoLeader { .. }), "{publish:?}");
            assert!(e.to_string().contains(id.as_str()), "{e}");
        }
        other => panic!("{other:?}"),
    }
}

/// The route `GET /topics/{name}/messages` answering `answer`, counting the reads in `hits`.
fn reads(hits: Seen, answer: fn() -> Response) -> Router {
    Router::new().route(
        "/topics/{name}/messages",
        get(move || async move {
            record(&hits, b"null");
            answer()
        }),
    )
}

/// A node serving [`reads`].
async fn reading_node(hits: Seen, answer: fn() -> Response) -> String {
    serve(reads(hits, answer)).await
}

/// A node serving [`reads`] whose `/cluster` names it the leader.
async fn leading_reader(hits: Seen, answer: fn() -> Response) -> String {
    serve_with(move |me| {
        let cluster = cluster_body("node-1", Some(&me), &[&me]);
        reads(hits, answer).route("/cluster", get(move || async move { Json(cluster) }))
    })
    .await
}

fn a_page() -> Response {
    Json(json!({"topic": "t", "messages": [], "next_cursor": 7, "current_sequence": 7, "first_available_sequence": 1}))
        .into_response()
}

fn cursor_beyond() -> Response {
    error_response(400, "invalid_cursor", json!({}))
}

/// Pages are read from one node while it answers: a cursor from one node's page may be past
/// another's end. Before, each read went to the next node in turn.
#[tokio::test]
async fn reads_stay_on_one_node_while_it_answers() {
    let (first_hits, second_hits) = (seen(), seen());
    let first = reading_node(first_hits.clone(), a_page).await;
    let second = reading_node(second_hits.clone(), a_page).await;
    let client = fast_client(&[&first, &second]);
    for _ in 0..4 {
        let page = client.read_messages("t", ReadOptions::after(0)).await;
        assert!(page.is_ok(), "{page:?}");
    }
    assert_eq!((bodies(&first_hits).len(), bodies(&second_hits).len()), (4, 0));
}

/// A node behind the others refuses a cursor past its end (`invalid_cursor`) or a topic it has
/// not applied yet (`topic_not_found`); the read then goes to the next node at once, and
/// the refusal is the answer only when every node gives it.
#[tokio::test]
async fn a_read_refused_by_a_node_behind_goes_to_the_next_node() {
    let (behind_hits, ahead_hits) = (seen(), seen());
    let behind = reading_node(behind_hits.clone(), cursor_beyond).await;
    let ahead = reading_node(ahead_hits.clone(), a_page).await;
    let client = fast_client(&[&behind, &ahead]);
    let page = client.read_messages("t", ReadOptions::after(7)).await;
    assert!(matches!(&page, Ok(p) if p.next_cursor == 7), "{page:?}");
    assert_eq!((bodies(&behind_hits).len(), bodies(&ahead_hits).len()), (1, 1));
    // The next read stays where the last one was answered.
    assert!(client.read_messages("t", ReadOptions::after(7)).await.is_ok());
    assert_eq!((bodies(&behind_hits).len(), bodies(&ahead_hits).len()), (1, 2));

    let (a_hits, b_hits) = (seen(), seen());
    let a = reading_node(a_hits.clone(), cursor_beyond).await;
    let b = reading_node(b_hits.clone(), cursor_beyond).await;
    let client = fast_client(&[&a, &b]);
    let started = std::time::Instant::now();
    let page = client.read_messages("t", ReadOptions::after(9)).await;
    assert!(matches!(&page, Err(Error::Api(ApiError { status: 400, .. }))), "{page:?}");
    assert_eq!((bodies(&a_hits).len(), bodies(&b_hits).len()), (1, 1), "each node asked once");
    assert!(started.elapsed() < std::time::Duration::from_secs(1), "no backoff: {:?}", started.elapsed());

    // A node that cannot be reached is passed too: the refusal of the others is the answer,
    // not "unreachable".
    let dead = dead_address().await;
    let c = reading_node(seen(), cursor_beyond).await;
    let page = fast_client(&[&dead, &c]).read_messages("t", ReadOptions::after(9)).await;
    assert!(matches!(&page, Err(Error::Api(ApiError { status: 400, .. }))), "{page:?}");
}

/// A client given only a node behind the others asks it for the cluster's members before its
/// `topic_not_found` is final, and reads from the node that has the topic.
#[tokio::test]
async fn a_read_refused_by_the_only_seed_asks_the_cluster_it_names() {
    let (behind_hits, ahead_hits) = (seen(), seen());
    let ahead = reading_node(ahead_hits.clone(), a_page).await;
    let behind = serve_with(|me| {
        let cluster = cluster_body("node-2", None, &[&me, &ahead]);
        reads(behind_hits.clone(), || error_response(404, "topic_not_found", json!({})))
            .route("/cluster", get(move || async move { Json(cluster) }))
    })
    .await;
    let page = fast_client(&[&behind]).read_messages("t", ReadOptions::after(0)).await;
    assert!(matches!(&page, Ok(p) if p.next_cursor == 7), "{page:?}");
    assert_eq!((bodies(&behind_hits).len(), bodies(&ahead_hits).len()), (1, 1));
}

/// Two refusals stay final at once: the cached leader's (it is the freshest: a follower might
/// still show a topic the leader deleted), and a long poll's `invalid_cursor` (that node
/// already waited the whole wait for the cursor; asking the others would wait again each).
#[tokio::test]
async fn a_refusal_of_the_leader_or_after_a_long_poll_is_final() {
    let (leader_hits, other_hits) = (seen(), seen());
    let leader = leading_reader(leader_hits.clone(), || error_response(404, "topic_not_found", json!({}))).await;
    let other = reading_node(other_hits.clone(), a_page).await;
    let client = fast_client(&[&leader, &other]);
    assert!(client.cluster().await.is_ok(), "the leader is cached");
    let page = client.read_messages("t", ReadOptions::after(0)).await;
    assert!(matches!(&page, Err(Error::Api(ApiError { status: 404, .. }))), "{page:?}");
    assert_eq!((bodies(&leader_hits).len(), bodies(&other_hits).len()), (1, 0));

    let (behind_hits, ahead_hits) = (seen(), seen());
    let behind = reading_node(behind_hits.clone(), cursor_beyond).await;
    let ahead = reading_node(ahead_hits.clone(), a_page).await;
    let long_poll = ReadOptions::after(9).wait(std::time::Duration::from_millis(50));
    let page = fast_client(&[&behind, &ahead]).read_messages("t", long_poll).await;
    assert!(matches!(&page, Err(Error::Api(ApiError { status: 400, .. }))), "{page:?}");
    assert_eq!((bodies(&behind_hits).len(), bodies(&ahead_hits).len()), (1, 0));
}

/// A read changes nothing: one whose answers never came is a timeout, not an outcome unknown.
#[tokio::test]
async fn a_read_that_times_out_is_a_plain_timeout() {
    let node = serve(Router::new().route("/topics/{name}/messages", get(never_answers))).await;
    let client = impatient_client(&node, 2);
    let page = client.read_messages("t", ReadOptions::after(0)).await;
    assert!(matches!(page, Err(Error::Timeout { attempts: 2, .. })), "{page:?}");
}

/// A long poll's wait is the server's to spend: a read waiting the longest the server allows
/// gets its (empty) page instead of timing out at the same moment.
#[tokio::test]
async fn a_long_poll_as_long_as_the_operation_budget_gets_its_answer() {
    let node = serve(Router::new().route(
        "/topics/{name}/messages",
        get(|| async {
            tokio::time::sleep(std::time::Duration::from_millis(2000)).await;
            Json(json!({"topic": "t", "messages": [], "next_cursor": 0, "has_more": false, "first_available_sequence": 1}))
        }),
    ))
    .await;
    let client = Client::builder([node])
        .request_timeout(std::time::Duration::from_millis(1000))
        .operation_timeout(std::time::Duration::from_millis(1500))
        .build()
        .unwrap();
    let options = ReadOptions { wait: Some(std::time::Duration::from_millis(2000)), ..ReadOptions::default() };
    let page = client.read_messages("t", options).await;
    assert!(page.is_ok(), "{page:?}");
}

#[tokio::test]
async fn finding_the_leader_among_silent_nodes_keeps_to_the_operation_timeout() {
    let mut nodes = Vec::new();
    for _ in 0..3 {
        nodes.push(serve(Router::new().route("/cluster", get(never_answers))).await);
    }
    let client = Client::builder(nodes)
        .request_timeout(std::time::Duration::from_secs(2))
        .operation_timeout(std::time::Duration::from_secs(1))
        .build()
        .unwrap();
    let started = std::time::Instant::now();
    let publish = client.publish("t", json!(1)).await;
    assert!(matches!(publish, Err(Error::Timeout { .. })), "{publish:?}");
    // Asking each node for its whole request timeout took 6 s.
    assert!(started.elapsed() < std::time::Duration::from_secs(4), "took {:?}", started.elapsed());
}

#[tokio::test]
async fn a_cluster_that_refuses_connections_is_unreachable() {
    let dead = dead_address().await;
    let client = fast_client(&[&dead]);
    let publish = client.publish("t", json!(1)).await;
    assert!(matches!(publish, Err(Error::Unreachable { attempts: 6, .. })), "{publish:?}");
    let cluster = client.cluster().await;
    assert!(matches!(&cluster, Err(e) if e.is_unreachable()), "{cluster:?}");
}

#[tokio::test]
async fn no_leader_for_the_whole_budget_is_a_no_leader_error() {
    let node = serve_with(|me| {
        let cluster = cluster_body("node-1", None, &[&me]);
        Router::new().route("/cluster", get(move || async move { Json(cluster) }))
    })
    .await;
    let client = fast_client(&[&node]);
    let publish = client.publish("t", json!(1)).await;
    assert!(matches!(publish, Err(Error::NoLeader { attempts: 6, .. })), "{publish:?}");
}

#[tokio::test]
async fn retried_delete_that_finds_the_topic_gone_reports_it_deleted() {
    let hits = seen();
    let node = {
        let hits = hits.clone();
        serve_with(move |me| {
            let cluster = cluster_body("node-1", Some(&me), &[]);
            Router::new().route("/cluster", get(move || async move { Json(cluster) })).route(
                "/topics/{name}",
                delete(move || async move {
                    if record(&hits, b"null") == 1 {
                        error_response(504, "raft_timeout", json!({}))
                    } else {
                        error_response(404, "topic_not_found", json!({}))
                    }
                }),
            )
        })
        .await
    };
    let client = fast_client(&[&node]);
    let ack = client.delete_topic("gone").await;
    assert!(
        matches!(&ack, Ok(DeleteTopicAck { deleted: true, raft_index: None, topic }) if topic == "gone"),
        "{ack:?}"
    );
    // Without an ambiguous attempt before it, a 404 is the truth.
    let again = client.delete_topic("gone").await;
    assert!(matches!(again, Err(Error::Api(ApiError { status: 404, .. }))), "{again:?}");
}

#[tokio::test]
async fn reads_fail_over_to_the_next_node_and_learn_its_peers() {
    let dead = dead_address().await;
    let live = serve_with(|me| {
        let cluster = cluster_body("node-2", None, &[&me, "10.9.9.9:8080"]);
        Router::new().route("/cluster", get(move || async move { Json(cluster) })).route(
            "/topics",
            get(|| async { Json(json!({"topics": [{"name": "a", "message_count": 2, "created_at": 5}]})) }),
        )
    })
    .await;
    let client = fast_client(&[&dead, &live]);
    let topics = client.list_topics().await;
    assert!(matches!(&topics, Ok(list) if list.len() == 1 && list[0].name == "a"), "{topics:?}");
    let info = client.cluster().await;
    assert!(matches!(&info, Ok(i) if i.leader_address.is_none()), "{info:?}");
    assert!(client.nodes().contains(&"http://10.9.9.9:8080/".to_string()));
}

/// The node list follows the cluster: each `/cluster` answer replaces the learned addresses
/// with its peers and leader, so a node that left the membership is no longer tried; the seeds
/// stay. The round robin goes on from the node it would have given next, and never indexes
/// past a list that shrank.
#[test]
fn learned_nodes_follow_the_latest_cluster_answer_and_the_seeds_stay() {
    let answer = |leader: &str, peers: &[&str]| -> ClusterInfo {
        match serde_json::from_value(cluster_body("node-2", Some(leader), peers)) {
            Ok(info) => info,
            Err(e) => panic!("{e}"),
        }
    };
    let url = |host: &str| format!("http://{host}:8080/");
    let client = fast_client(&["10.0.0.1:8080"]);
    client.learn(&answer("10.0.0.2:8080", &["10.0.0.2:8080", "10.0.0.3:8080", "10.0.0.4:8080"]));
    assert_eq!(client.nodes(), ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"].map(url));
    for host in ["10.0.0.1", "10.0.0.2", "10.0.0.3"] {
        assert_eq!(client.next_node().as_str(), url(host));
    }

    // 10.0.0.3 left; the leader is outside the peers the answer lists.
    client.learn(&answer("10.0.0.5:8080", &["10.0.0.2:8080", "10.0.0.4:8080"]));
    assert_eq!(client.nodes(), ["10.0.0.1", "10.0.0.2", "10.0.0.4", "10.0.0.5"].map(url));
    assert_eq!(client.cached_leader(), Some(url("10.0.0.5")));
    assert_eq!(client.next_node().as_str(), url("10.0.0.4"), "the round robin skipped or repeated a node");

    // A leader named by a `leader_change` frame is added until the next answer.
    client.learn_leader_address("10.0.0.9:8080");
    assert_eq!(client.nodes().last(), Some(&url("10.0.0.9")));

    // Shrunk below the round-robin position: no panic, and both nodes in turn.
    client.learn(&answer("10.0.0.6:8080", &["10.0.0.6:8080"]));
    assert_eq!(client.nodes(), ["10.0.0.1", "10.0.0.6"].map(url));
    let mut turns: Vec<String> = (0..2).map(|_| client.next_node().to_string()).collect();
    turns.sort();
    assert_eq!(turns, ["10.0.0.1", "10.0.0.6"].map(url));
}

#[tokio::test]
async fn batch_fills_missing_ids_and_keeps_them_across_retries() {
    let hits = seen();
    let node = {
        let hits = hits.clone();
        serve_with(move |me| {
            let cluster = cluster_body("node-1", Some(&me), &[]);
            Router::new().route("/cluster", get(move || async move { Json(cluster) })).route(
                "/topics/{name}/messages/batch",
                post(move |body: Bytes| async move {
                    if record(&hits, &body) == 1 {
                        // Maybe applied: the retry's duplicates are our own first try.
                        return error_response(504, "raft_timeout", json!({}));
                    }
                    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    let msgs = body["messages"].as_array().cloned().unwrap_or_default();
                    let results: Vec<Value> = msgs
                        .iter()
                        .enumerate()
                        .map(|(i, m)| {
                            if i == 0 {
                                json!({"id": m["id"], "error": "duplicate_message_id",
                                           "existing_sequence": 1})
                            } else {
                                json!({"id": m["id"], "sequence": i + 1})
                            }
                        })
                        .collect();
                    (
                        axum::http::StatusCode::CREATED,
                        Json(json!({"topic": "t", "results": results, "raft_index": 4,
                                        "committed": true})),
                    )
                        .into_response()
                }),
            )
        })
        .await
    };
    let client = fast_client(&[&node]);
    let batch = vec![NewMessage::new(json!(1)).with_id("mine"), NewMessage::new(json!(2)), NewMessage::new(json!(3))];
    let ack = match client.publish_batch("t", batch).await {
        Ok(a) => a,
        Err(e) => panic!("{e}"),
    };
    assert!(ack.retried);
    assert_eq!(ack.results.len(), 3);
    assert!(matches!(&ack.results[0], BatchItem::Duplicate { id, existing_sequence: Some(1) } if id == "mine"));
    assert!(matches!(ack.results[2], BatchItem::Published { sequence: 3, .. }));
    let sent = bodies(&hits);
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0], sent[1], "the retry sent the very same messages and ids");
    assert!(sent[0]["messages"][1]["id"].is_string());
}

#[tokio::test]
async fn an_empty_or_oversized_batch_is_refused_without_a_request() {
    let client = fast_client(&["127.0.0.1:9"]);
    let empty = client.publish_batch("t", Vec::new()).await;
    assert!(matches!(empty, Err(Error::InvalidArgument(_))));
    let big = vec![NewMessage::new(json!(1)); limits::BATCH_MESSAGES_MAX + 1];
    assert!(matches!(client.publish_batch("t", big).await, Err(Error::InvalidArgument(_))));
}

#[tokio::test]
async fn long_poll_read_sends_cursor_limit_and_wait() {
    let node = serve_with(|_| {
        Router::new().route(
            "/topics/{name}/messages",
            get(|Query(q): Query<std::collections::HashMap<String, String>>| async move {
                let after: u64 = q.get("after").and_then(|a| a.parse().ok()).unwrap_or(0);
                Json(json!({
                    "messages": [{"id": format!("{q:?}"), "topic": "t", "sequence": after + 1,
                                  "payload": {"limit": q.get("limit"), "wait": q.get("wait_ms")},
                                  "timestamp": 1}],
                    "next_cursor": after + 1, "current_sequence": after + 1
                }))
            }),
        )
    })
    .await;
    let client = fast_client(&[&node]);
    let page = client.read_messages("t", ReadOptions::after(41).limit(5).wait(Duration::from_millis(250))).await;
    let page = match page {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(page.next_cursor, 42);
    assert_eq!(page.messages[0].payload, json!({"limit": "5", "wait": "250"}));
}

#[test]
fn a_client_needs_at_least_one_usable_seed() {
    assert!(matches!(Client::new(Vec::<String>::new()), Err(Error::InvalidArgument(_))));
    assert!(matches!(Client::new(["https://secure:443"]), Err(Error::InvalidAddress { .. })));
    let dup = Client::new(["h:1", "http://h:1/"]).map(|c| c.nodes().len());
    assert!(matches!(dup, Ok(1)));
}

#[test]
fn too_long_message_ids_are_refused_locally() {
    let mut m = NewMessage::new(json!(1)).with_id("x".repeat(limits::MESSAGE_ID_CHARS_MAX + 1));
    assert!(ensure_id(&mut m).is_err());
    let mut ok = NewMessage::new(json!(1));
    assert!(ensure_id(&mut ok).is_ok());
    assert!(ok.id.is_some());
}

/// Generated ids are UUID v7, in the order they were made: every node inserts them into its
/// dedup index, where ids in order are several times cheaper than random ones.
#[test]
fn generated_message_ids_are_time_ordered_uuids() {
    let ids: Vec<String> = (0..1000)
        .map(|_| {
            let mut m = NewMessage::new(json!(1));
            ensure_id(&mut m).unwrap()
        })
        .collect();
    for id in &ids {
        assert_eq!(uuid::Uuid::parse_str(id).map(|u| u.get_version_num()), Ok(7), "{id}");
    }
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids out of order");
}

/// A removal whose leader lost leadership with the change in flight (`500 not_committed`)
/// may have committed: the `404` its retry gets is the removal done, not a failure.
#[tokio::test]
async fn a_removal_in_flight_through_a_leader_change_is_done_when_the_retry_finds_it_gone() {
    let attempts = seen();
    let hits = attempts.clone();
    let node = serve_with(move |me| {
        let cluster = cluster_body("node-1", Some(&me), &[&me]);
        Router::new().route("/cluster", get(move || async move { Json(cluster) })).route(
            "/cluster/members/{id}",
            delete(move || async move {
                match record(&hits, b"") {
                    1 => error_response(500, "not_committed", json!({})),
                    _ => error_response(404, "not_found", json!({})),
                }
            }),
        )
    })
    .await;
    let membership = fast_client(&[&node]).remove_member(4, None).await.expect("the removal is done");
    assert!(membership.changed);
    assert_eq!(bodies(&attempts).len(), 2);
}
