//! `http-edge ADDR`: our publish API's HTTP edge with nothing behind it, the ceiling of any
//! per-message HTTP publish on this machine with `pubsub bench` as the client.
//!
//! It serves `GET /cluster` (naming itself the leader), `POST /topics/{name}` and
//! `POST /topics/{name}/messages` on the stack the node uses (axum 0.8 over hyper's HTTP/1.1,
//! `TCP_NODELAY`, jemalloc, tokio's default of one worker per core), and does the edge work a
//! publish does there: reads the body, parses it into the same fields (the payload kept as raw
//! JSON text and copied out as bytes), assigns the next sequence and answers `201` with the
//! node's body. No Raft, no disk, no replication, one process instead of three: what
//! `benches/compare.sh` measures against it is how much of the machine the HTTP exchange and
//! the client alone take, next to ours and NATS in the same run.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

// The node's allocator, so allocation costs the same on both.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The node's limit on a single publish's body (`PUBLISH_BODY_BYTES_MAX`).
const BODY_BYTES_MAX: usize = 1024 * 1024 + 64 * 1024;

/// A message as a client sends it (the node's `MessageFields`).
#[derive(Deserialize)]
struct MessageFields {
    id: Option<String>,
    payload: Box<RawValue>,
    #[allow(dead_code)] // parsed like the node does, then unused: no store
    timestamp: Option<u64>,
}

/// The node's answer to a committed single publish (`node/src/api/publish.rs`), field for field.
#[derive(Serialize)]
struct PublishAnswer<'a> {
    id: &'a str,
    topic: &'a str,
    sequence: Option<u64>,
    raft_index: Option<u64>,
    committed: bool,
}

struct Edge {
    /// The address this process answers on, which it names as the leader's.
    addr: String,
    sequence: AtomicU64,
}

/// `GET /cluster`: this process is the leader (the client asks before its first write).
async fn cluster(State(edge): State<Arc<Edge>>) -> Response {
    let me = edge.addr.as_str();
    let body = serde_json::json!({"node_id": "node-1", "leader_id": "node-1", "leader_address": me, "peers": [me]});
    Json(body).into_response()
}

async fn create(Path(topic): Path<String>) -> Response {
    let body = serde_json::json!({"topic": topic, "created": true, "raft_index": 0});
    (StatusCode::CREATED, Json(body)).into_response()
}

async fn publish(State(edge): State<Arc<Edge>>, Path(topic): Path<String>, body: Bytes) -> Response {
    let fields: MessageFields = match serde_json::from_slice(&body) {
        Ok(fields) => fields,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    // The node keeps the payload as bytes; taking it out of the parse is that copy.
    let _payload = Bytes::from(String::from(Box::<str>::from(fields.payload)));
    let sequence = edge.sequence.fetch_add(1, Ordering::Relaxed) + 1;
    let id = fields.id.unwrap_or_else(|| format!("edge-{sequence}"));
    let answer =
        PublishAnswer { id: &id, topic: &topic, sequence: Some(sequence), raft_index: Some(sequence), committed: true };
    (StatusCode::CREATED, Json(answer)).into_response()
}

#[tokio::main]
async fn main() {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:8090".into());
    let listener = match tokio::net::TcpListener::bind(&addr).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("http-edge: cannot listen on {addr}: {e}");
            std::process::exit(1);
        }
    };
    let app = Router::new()
        .route("/cluster", get(cluster))
        .route("/topics/{name}", post(create))
        .route("/topics/{name}/messages", post(publish))
        .with_state(Arc::new(Edge { addr: addr.clone(), sequence: AtomicU64::new(0) }))
        // Enforced while the body is read, as the node reads it.
        .layer(DefaultBodyLimit::max(BODY_BYTES_MAX));
    eprintln!("http-edge: listening on {addr}");
    // As on the node: small answers must not wait for the client's delayed ACK.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    if let Err(e) = axum::serve(listener, app).await {
        eprintln!("http-edge: {e}");
        std::process::exit(1);
    }
}
