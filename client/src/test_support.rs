//! Helpers for unit tests: an in-process axum server on a free port.

use std::net::SocketAddr;

/// Serves `app` on 127.0.0.1 with a free port; returns `host:port`.
pub(crate) async fn serve(app: axum::Router) -> String {
    serve_with(|_| app).await
}

/// Serves the router `make` builds from its own `host:port`; returns that address.
pub(crate) async fn serve_with(make: impl FnOnce(String) -> axum::Router) -> String {
    let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
        Ok(l) => l,
        Err(e) => panic!("bind: {e}"),
    };
    let addr: SocketAddr = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => panic!("local_addr: {e}"),
    };
    let app = make(addr.to_string());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr.to_string()
}

/// An address that refuses connections: a socket bound to it but never listening. The socket
/// is kept for the life of the test process, so no other test's server can take the port
/// (binding and releasing it let a concurrent test reuse the port, and the "dead" node
/// answered).
pub(crate) async fn dead_address() -> String {
    let socket = match tokio::net::TcpSocket::new_v4() {
        Ok(s) => s,
        Err(e) => panic!("socket: {e}"),
    };
    if let Err(e) = socket.bind("127.0.0.1:0".parse().expect("a literal address")) {
        panic!("bind: {e}");
    }
    let address = match socket.local_addr() {
        Ok(a) => a.to_string(),
        Err(e) => panic!("local_addr: {e}"),
    };
    std::mem::forget(socket);
    address
}

/// A JSON error response in the API.md shape.
pub(crate) fn error_response(status: u16, code: &str, extra: serde_json::Value) -> axum::response::Response {
    use axum::response::IntoResponse;
    let mut body = serde_json::json!({"error": code, "message": code, "details": {}});
    if let (Some(obj), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            obj.insert(k.clone(), v.clone());
        }
    }
    let status = axum::http::StatusCode::from_u16(status).unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
    (status, axum::Json(body)).into_response()
}

/// A client for tests: fast backoff, short timeouts.
pub(crate) fn fast_client(seeds: &[&str]) -> crate::Client {
    match crate::Client::builder(seeds.iter().map(|s| s.to_string()))
        .backoff(std::time::Duration::from_millis(1), std::time::Duration::from_millis(5))
        .connect_timeout(std::time::Duration::from_millis(500))
        .request_timeout(std::time::Duration::from_secs(2))
        .attempts_max(6)
        .reconnect_attempts_max(5)
        .build()
    {
        Ok(c) => c,
        Err(e) => panic!("client: {e}"),
    }
}

/// A client that gives up fast on `node`: 200 ms per attempt, `attempts` of them.
pub(crate) fn impatient_client(node: &str, attempts: u32) -> crate::Client {
    match crate::Client::builder([node.to_string()])
        .backoff(std::time::Duration::from_millis(1), std::time::Duration::from_millis(5))
        .request_timeout(std::time::Duration::from_millis(200))
        .attempts_max(attempts)
        .build()
    {
        Ok(c) => c,
        Err(e) => panic!("client: {e}"),
    }
}

/// A `/cluster` body naming `leader` (or no leader).
pub(crate) fn cluster_body(node: &str, leader: Option<&str>, peers: &[&str]) -> serde_json::Value {
    serde_json::json!({
        "node_id": node, "leader_id": leader.map(|_| "node-1"), "leader_address": leader,
        "peers": peers, "raft_term": 1, "commit_index": 1, "role": "follower", "last_applied": 1
    })
}

/// The `ack` a publishing WebSocket (API.md §8) answers `frame` with, as `sequence`.
pub(crate) fn publish_ack(frame: &serde_json::Value, sequence: u64) -> String {
    serde_json::json!({"type": "ack", "ref": frame["ref"], "id": frame["id"], "sequence": sequence,
                       "raft_index": sequence + 100})
    .to_string()
}

/// The next text frame of a server-side WebSocket, as JSON; `None` once the client is gone.
pub(crate) async fn next_json(socket: &mut axum::extract::ws::WebSocket) -> Option<serde_json::Value> {
    while let Some(Ok(message)) = socket.recv().await {
        if let axum::extract::ws::Message::Text(text) = message {
            return serde_json::from_str(&text).ok();
        }
    }
    None
}
