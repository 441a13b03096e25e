//! The HTTP server loop: accepts connections and serves the API on each, with a deadline on
//! request headers.
//!
//! `axum::serve` runs hyper with no timer, so a client that opens connections and sends
//! headers a byte at a time (or nothing at all) holds each one, and its memory, forever.
//! Here a connection's first byte is due within [`HEADER_READ_TIMEOUT`] (`io_deadline.rs`),
//! and hyper's header read timeout is on: a request's headers must arrive within
//! [`HEADER_READ_TIMEOUT`], and a keep-alive connection idle that long between requests is
//! closed too. Bodies have their own deadline ([`BODY_READ_TIMEOUT`]); an upgraded WebSocket
//! leaves hyper and has its own pings. Writes that stop making progress fail after
//! [`WRITE_STALL_TIMEOUT`] (`io_deadline.rs`). Each request carries the address of the
//! client it came from ([`ClientAddr`]), so that per-client limits can find it.
//!
//! HTTP/1.1 only: hyper's HTTP/2 has no idle or header deadline (a client that sent its
//! preface and then nothing held the connection for good), and HTTP/2 measured no faster
//! here (docs/BENCHMARKS.md). A connection that opens with an HTTP/2 preface is closed without
//! an answer.
//!
//! [`BODY_READ_TIMEOUT`]: crate::limits::BODY_READ_TIMEOUT
//! [`WRITE_STALL_TIMEOUT`]: crate::limits::WRITE_STALL_TIMEOUT

use std::future::Future;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::time::Instant;

use axum::serve::Listener;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::Request;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::io_deadline::IoDeadline;
use crate::limits::{CONNECTIONS_FULL_WARNING_INTERVAL, HEADER_READ_TIMEOUT, SHUTDOWN_REQUESTS_TIMEOUT};

/// The address of the client a request came from, in the request's extensions.
#[derive(Clone, Copy, Debug)]
pub struct ClientAddr(pub SocketAddr);

/// Serves `router` on every connection `listener` accepts until `shutdown` resolves; then
/// stops accepting, lets requests in progress finish (for at most
/// [`SHUTDOWN_REQUESTS_TIMEOUT`]) and returns once their connections have closed (upgraded
/// WebSockets are not waited for: the node closes them itself).
///
/// At most `connections_max` connections are served at once (their file descriptors would
/// otherwise take those the storage needs): past it the next is accepted only when one ends,
/// and waits in the listen queue meanwhile.
pub async fn serve<L>(mut listener: L, router: Router, shutdown: impl Future<Output = ()>, connections_max: usize)
where
    L: Listener<Addr = SocketAddr>,
{
    let places = Arc::new(Semaphore::new(connections_max));
    let mut last_full_warning: Option<Instant> = None;
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT);
    // Cancelled when the node stops: each connection finishes the request in progress and
    // takes no other.
    let stopping = CancellationToken::new();
    // Every connection's task, to end those still running when the drain times out.
    let mut tasks = JoinSet::new();
    let mut shutdown = pin!(shutdown);
    loop {
        let place = match places.clone().try_acquire_owned() {
            Ok(place) => place,
            Err(_) => {
                if last_full_warning.is_none_or(|at| at.elapsed() >= CONNECTIONS_FULL_WARNING_INTERVAL) {
                    tracing::warn!(connections_max, "as many client connections as this node serves: the next waits");
                    last_full_warning = Some(Instant::now());
                }
                tokio::select! {
                    place = places.clone().acquire_owned() => place.expect("the semaphore is never closed"),
                    () = shutdown.as_mut() => break,
                }
            }
        };
        let (io, remote) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.as_mut() => break,
        };
        let service = router.clone().map_request(move |mut request: Request<Incoming>| {
            request.extensions_mut().insert(ClientAddr(remote));
            request
        });
        let service = TowerToHyperService::new(service);
        let io = IoDeadline::new(io).holding(place);
        let connection = http.serve_connection(TokioIo::new(io), service).with_upgrades();
        let stopping = stopping.clone();
        tasks.spawn(async move {
            let mut connection = pin!(connection);
            let ended = tokio::select! {
                ended = connection.as_mut() => ended,
                () = stopping.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            // A client that went away or sent garbage; hyper has answered what it could.
            if let Err(error) = ended {
                tracing::debug!(?remote, %error, "connection ended with an error");
            }
        });
        while tasks.try_join_next().is_some() {}
    }
    drop(listener);
    stopping.cancel();
    // A request may take long to end (a body trickling in has 30 s): the node's stop must fit
    // a supervisor's grace period, so what has not ended in time is dropped.
    let drained =
        tokio::time::timeout(SHUTDOWN_REQUESTS_TIMEOUT, async { while tasks.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!(
            connections = tasks.len(),
            "requests still in progress after {SHUTDOWN_REQUESTS_TIMEOUT:?}; closing their connections"
        );
    }
    tasks.shutdown().await;
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    async fn ask(stream: &mut TcpStream) {
        stream.write_all(b"GET /x HTTP/1.1\r\nhost: node\r\n\r\n").await.unwrap();
    }

    async fn answered(stream: &mut TcpStream, within: Duration) -> bool {
        let mut buf = [0u8; 64];
        matches!(tokio::time::timeout(within, stream.read(&mut buf)).await, Ok(Ok(n)) if n > 0)
    }

    /// Past its bound on connections the server accepts the next only when one ends: the
    /// extra one waits in the listen queue, then is served.
    #[tokio::test]
    async fn past_the_bound_a_connection_waits_for_another_to_end() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = Router::new().route("/x", axum::routing::get(|| async { "x" }));
        tokio::spawn(serve(listener, router, std::future::pending(), 2));
        let mut first = TcpStream::connect(addr).await.unwrap();
        let mut second = TcpStream::connect(addr).await.unwrap();
        ask(&mut second).await;
        assert!(answered(&mut second, Duration::from_secs(5)).await, "within the bound");

        let mut third = TcpStream::connect(addr).await.unwrap();
        ask(&mut third).await;
        assert!(!answered(&mut third, Duration::from_millis(500)).await, "served past the bound");
        ask(&mut first).await;
        assert!(answered(&mut first, Duration::from_secs(5)).await);
        drop(first);
        assert!(answered(&mut third, Duration::from_secs(5)).await, "not served once a place was free");
    }

    #[test]
    fn the_bound_leaves_the_storage_its_files() {
        use crate::limits::{connections_max, CONNECTIONS_MIN, OPEN_FILES_RESERVED};
        assert_eq!(connections_max(20_000), 20_000 - OPEN_FILES_RESERVED as usize);
        assert_eq!(connections_max(1_024), CONNECTIONS_MIN);
        assert!(connections_max(u64::MAX) > 1 << 30);
        // What `serve` makes of it must not panic.
        let _ = Semaphore::new(connections_max(u64::MAX));
    }
}
