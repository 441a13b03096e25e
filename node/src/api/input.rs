//! Request parsing and validation shared by the handlers: every malformed input becomes the
//! documented 4xx, never a panic or a 5xx.

use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;
use std::net::IpAddr;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery};
use axum::Extension;
use serde::de::value::MapAccessDeserializer;
use serde::de::{DeserializeOwned, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use crate::app::App;
use crate::budget::{ByteBudget, Room, RoomFull};
use crate::error::ApiError;
use crate::limits::{
    BODY_DRAIN_BYTES_MAX, BODY_READ_TIMEOUT, ID_CHARS_MAX, REQUEST_BODIES_BYTES_PER_CLIENT_MAX,
    REQUEST_BODY_ROOM_TIMEOUT, TOPIC_NAME_CHARS_MAX,
};
use crate::serve::ClientAddr;

/// The topic name from the path, checked against `[A-Za-z0-9._-]{1,255}`.
pub fn topic_name(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let Path(name) = path.map_err(|e| ApiError::InvalidTopicName(e.body_text()))?;
    // `.` and `..` match the pattern but no URL can carry them: clients resolve them as
    // directory steps (Kafka refuses them too).
    let valid = !name.is_empty()
        && name != "."
        && name != ".."
        && name.len() <= TOPIC_NAME_CHARS_MAX
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if valid {
        Ok(name)
    } else {
        Err(ApiError::InvalidTopicName(name))
    }
}

/// Query parameters as a map (repeated keys: the last wins). A percent-escape that does not
/// decode to UTF-8 is refused: decoded lossily, `subscriber_id=%FF` and `%FE` would both read
/// as U+FFFD, one subscriber.
pub fn query(RawQuery(raw): RawQuery) -> Result<HashMap<String, String>, ApiError> {
    let decode = |part: &str| {
        percent_decoded(&part.replace('+', " "))
            .ok_or_else(|| ApiError::InvalidRequest(format!("query parameter {part:?} does not decode to UTF-8")))
    };
    let mut map = HashMap::new();
    for pair in raw.as_deref().unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        map.insert(decode(key)?, decode(value)?);
    }
    Ok(map)
}

/// A path segment or query part with its `%`-escapes decoded; `None` when they do not decode
/// to UTF-8 (never replaced: two different escapes would read as one U+FFFD).
pub fn percent_decoded(text: &str) -> Option<String> {
    percent_encoding::percent_decode_str(text).decode_utf8().ok().map(|d| d.into_owned())
}

/// The client's address, when the server knows it (a test may serve the router without it).
pub fn client_ip(client: Option<Extension<ClientAddr>>) -> Option<IpAddr> {
    client.map(|Extension(ClientAddr(addr))| addr.ip())
}

/// Reads a body of at most `limit` bytes; a larger one is `413 payload_too_large`.
///
/// The rest of a too-large body is read and dropped (up to [`BODY_DRAIN_BYTES_MAX`]) before
/// answering: a client still sending when the server closes the connection would see a reset
/// instead of the 413.
///
/// A body that has not arrived within [`BODY_READ_TIMEOUT`] is `408 request_timeout`: a client
/// trickling bytes (or stalled) must not hold a connection and its buffer forever.
///
/// The body holds its size of the node's budget of request bodies, and of its client's share
/// of it, until the last of its bytes is dropped. Room is taken as the bytes arrive, so a
/// client that announces a large body and sends nothing holds nothing; a chunk that finds no
/// room within [`REQUEST_BODY_ROOM_TIMEOUT`] of the request's first wait for room is
/// answered `503 unavailable` (the connection then closes).
pub async fn body(app: &App, client: Option<IpAddr>, body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let own = client.map(|ip| app.client_request_bodies.of(ip));
    body_within(&app.request_bodies, own.as_ref(), body, limit, BODY_READ_TIMEOUT, REQUEST_BODY_ROOM_TIMEOUT).await
}

async fn body_within(
    node: &ByteBudget,
    own: Option<&ByteBudget>,
    body: Body,
    limit: usize,
    timeout: Duration,
    room_timeout: Duration,
) -> Result<Bytes, ApiError> {
    use futures_util::StreamExt;
    let too_large = || ApiError::PayloadTooLarge(format!("request body is larger than {limit} bytes"));
    // A declared length past what would be drained is refused before reading: a client that
    // sent `Expect: 100-continue` then sends nothing at all.
    let declared = axum::body::HttpBody::size_hint(&body).lower();
    if declared > limit.saturating_add(BODY_DRAIN_BYTES_MAX) as u64 {
        return Err(too_large());
    }
    let mut stream = body.into_data_stream();
    let mut buf = bytes::BytesMut::new();
    let mut total = 0usize;
    let mut room: Option<Room> = None;
    // One wait for room per request, however many of its chunks find none (API.md: at most
    // 3 s): set when the first one waits.
    let mut room_deadline: Option<tokio::time::Instant> = None;
    let read = async {
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| ApiError::InvalidRequest(format!("cannot read the request body: {e}")))?;
            total += chunk.len();
            if total <= limit {
                // Room is almost always free: only then skip arming a timer.
                let more = match Room::try_take(node, own, chunk.len()) {
                    Some(more) => more,
                    None => {
                        let deadline = *room_deadline.get_or_insert_with(|| tokio::time::Instant::now() + room_timeout);
                        Room::take(node, own, chunk.len(), Some(deadline)).await.map_err(no_room_for_body)?
                    }
                };
                match room.as_mut() {
                    Some(room) => room.merge(more),
                    None => room = Some(more),
                }
                buf.extend_from_slice(&chunk);
            } else if total > limit.saturating_add(BODY_DRAIN_BYTES_MAX) {
                break;
            }
        }
        Ok::<(), ApiError>(())
    };
    tokio::time::timeout(timeout, read).await.map_err(|_| ApiError::RequestTimeout(timeout.as_secs()))??;
    if total > limit {
        return Err(too_large());
    }
    Ok(ByteBudget::hold(Vec::from(buf), room))
}

fn no_room_for_body(full: RoomFull) -> ApiError {
    ApiError::Unavailable(match full {
        RoomFull::Client => format!(
            "this client already sends {} MiB of request bodies the node has not answered; retry shortly",
            REQUEST_BODIES_BYTES_PER_CLIENT_MAX >> 20
        ),
        RoomFull::Node => "the node holds too many request bodies; retry shortly".into(),
    })
}

/// Parses a JSON body; an empty body is `None`.
pub fn json<T: DeserializeOwned>(bytes: &[u8]) -> Result<Option<T>, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    serde_json::from_slice::<Object<T>>(bytes)
        .map(|Object(value)| Some(value))
        .map_err(|e| ApiError::InvalidRequest(format!("invalid JSON body: {e}")))
}

/// A JSON object read as `T`. serde's derived structs also take an array of their fields in
/// order (`[null, {"a":1}, null]` as a message), which no client means and API.md does not
/// allow: every body, batch item and frame that is an object is read through this.
pub struct Object<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ObjectOnly<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectOnly<T> {
            type Value = T;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                // The fields are still read by the format's own deserializer (`RawValue` needs
                // serde_json's).
                T::deserialize(MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_map(ObjectOnly(PhantomData)).map(Object)
    }
}

/// Checks a message id or subscriber id: 1–256 characters.
pub fn id_field(what: &str, value: &str) -> Result<(), ApiError> {
    let chars = value.chars().count();
    if chars == 0 || chars > ID_CHARS_MAX {
        return Err(ApiError::InvalidRequest(format!("{what} must be 1 to {ID_CHARS_MAX} characters")));
    }
    Ok(())
}

/// The path and query of a request, for a redirect's `Location`.
pub fn path_and_query(uri: &axum::http::Uri) -> String {
    uri.path_and_query().map(|p| p.to_string()).unwrap_or_else(|| uri.path().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    struct Fields {
        id: Option<String>,
        payload: Box<serde_json::value::RawValue>,
    }

    #[test]
    fn a_body_is_an_object_not_its_fields_in_order() {
        let read = |body: &str| json::<Fields>(body.as_bytes());
        let fields = read(r#"{"id": "a", "payload": [1, 2.50]}"#).unwrap().unwrap();
        assert_eq!((fields.id.as_deref(), fields.payload.get()), (Some("a"), "[1, 2.50]"));
        assert!(read(" ").unwrap().is_none());
        for refused in [r#"["a", [1]]"#, "[]", "5", r#""a""#, "null"] {
            assert!(matches!(read(refused), Err(ApiError::InvalidRequest(_))), "{refused}");
        }
    }

    #[test]
    fn topic_names_follow_the_documented_pattern() {
        let ok = |n: &str| topic_name(Ok(Path(n.to_string()))).is_ok();
        assert!(ok("orders.v1_EU-2"));
        assert!(ok(&"a".repeat(255)));
        assert!(!ok(&"a".repeat(256)));
        assert!(!ok(""));
        assert!(!ok("a b"));
        assert!(!ok("a/b"));
        assert!(!ok("é"));
        assert!(!ok(".") && !ok(".."));
        assert!(ok("...") && ok(".a"));
    }

    const SOON: Duration = Duration::from_millis(50);

    #[tokio::test]
    async fn a_body_that_does_not_arrive_in_time_is_a_request_timeout() {
        let budget = ByteBudget::new(1 << 20);
        let never = Body::from_stream(futures_util::stream::pending::<Result<Bytes, std::io::Error>>());
        let result = body_within(&budget, None, never, 1024, SOON, SOON).await;
        assert!(matches!(result, Err(ApiError::RequestTimeout(_))), "{result:?}");
        assert_eq!(budget.held(), 0, "a body that sent nothing holds nothing");
        let small = body_within(&budget, None, Body::from("{}"), 1024, SOON, SOON).await.unwrap();
        assert_eq!(&small[..], b"{}");
    }

    #[tokio::test]
    async fn bodies_hold_their_bytes_of_the_budget_until_dropped() {
        let budget = ByteBudget::new(1000);
        let first = body_within(&budget, None, Body::from(vec![b'x'; 600]), 1024, SOON, SOON).await.unwrap();
        assert_eq!(budget.held(), 600);
        // No room for another 600: it waits, then is told to come back.
        let refused = body_within(&budget, None, Body::from(vec![b'y'; 600]), 1024, SOON, SOON).await;
        assert!(matches!(refused, Err(ApiError::Unavailable(_))), "{refused:?}");
        assert_eq!(budget.held(), 600, "the refused body gave its room back");
        let chunks = [Bytes::from_static(b"ab"), Bytes::from_static(b"cd")].map(Ok::<_, std::io::Error>);
        let streamed =
            body_within(&budget, None, Body::from_stream(futures_util::stream::iter(chunks)), 300, SOON, SOON)
                .await
                .unwrap();
        assert_eq!((&streamed[..], budget.held()), (&b"abcd"[..], 604));
        let slice = first.slice(0..10);
        drop(first);
        assert_eq!(budget.held(), 604, "a slice of the body still holds it");
        drop((slice, streamed));
        assert_eq!(budget.held(), 0);
    }

    /// Three chunks, each of which finds room 0.8 of a wait after the one before: each alone
    /// would be in time, the three together wait longer than one wait (fails if the deadline
    /// is set again for each chunk).
    #[tokio::test(start_paused = true)]
    async fn a_request_waits_for_room_once_not_once_per_chunk() {
        let room_timeout = Duration::from_secs(3);
        let budget = ByteBudget::new(1000);
        let _rest = body_within(&budget, None, Body::from(vec![b'x'; 970]), 1024, SOON, SOON).await.unwrap();
        let mut holders = Vec::new();
        for _ in 0..3 {
            holders.push(body_within(&budget, None, Body::from(vec![b'h'; 10]), 1024, SOON, SOON).await.unwrap());
        }
        tokio::spawn(async move {
            for held in holders {
                tokio::time::sleep(room_timeout.mul_f32(0.8)).await;
                drop(held);
            }
        });
        let chunks = (0..3).map(|_| Ok::<_, std::io::Error>(Bytes::from(vec![b'y'; 10])));
        let body = Body::from_stream(futures_util::stream::iter(chunks));
        let started = tokio::time::Instant::now();
        let result = body_within(&budget, None, body, 1024, Duration::from_secs(30), room_timeout).await;
        assert!(matches!(result, Err(ApiError::Unavailable(_))), "{result:?}");
        assert_eq!(started.elapsed(), room_timeout, "refused at the first wait's deadline");
    }

    #[tokio::test]
    async fn a_clients_bodies_hold_its_share_and_leave_the_rest_to_others() {
        let node = ByteBudget::new(1000);
        let (a, b) = (ByteBudget::new(500), ByteBudget::new(500));
        let first = body_within(&node, Some(&a), Body::from(vec![b'x'; 400]), 1024, SOON, SOON).await.unwrap();
        assert_eq!((node.held(), a.held()), (400, 400));
        // The node has room; this client's share has not.
        let refused = body_within(&node, Some(&a), Body::from(vec![b'y'; 200]), 1024, SOON, SOON).await;
        match refused {
            Err(ApiError::Unavailable(message)) => assert!(message.contains("this client"), "{message}"),
            other => panic!("{other:?}"),
        }
        assert_eq!((node.held(), a.held()), (400, 400), "the refused body gave its room back");
        let other = body_within(&node, Some(&b), Body::from(vec![b'z'; 200]), 1024, SOON, SOON).await.unwrap();
        assert_eq!((node.held(), b.held()), (600, 200));
        drop((first, other));
        assert_eq!((node.held(), a.held(), b.held()), (0, 0, 0));
    }

    #[test]
    fn ids_are_counted_in_characters() {
        assert!(id_field("id", &"é".repeat(256)).is_ok());
        assert!(id_field("id", &"é".repeat(257)).is_err());
        assert!(id_field("id", "").is_err());
    }

    #[test]
    fn query_decodes_strictly_and_the_last_repeat_wins() {
        let parse = |q: Option<&str>| query(RawQuery(q.map(String::from)));
        let map = parse(Some("a=1&b=x+y%20z&a=2&flag&&c=")).unwrap();
        assert_eq!(
            (map["a"].as_str(), map["b"].as_str(), map["flag"].as_str(), map["c"].as_str()),
            ("2", "x y z", "", "")
        );
        assert_eq!(parse(Some("s=%C3%A9")).unwrap()["s"], "é");
        assert!(parse(None).unwrap().is_empty());
        for bad in ["subscriber_id=%FF", "%FE=1"] {
            assert!(matches!(parse(Some(bad)), Err(ApiError::InvalidRequest(_))), "{bad}");
        }
    }
}
