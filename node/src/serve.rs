//! The HTTP server loop: accepts connections and serves the API on each, with a deadline on
//! request headers.
//!
//! `axum::serve` runs hyper with no timer, so a client that opens connections and sends
//! headers a byte at a time (or nothing at all) holds each one, and its memory, forever.
//! Here hyper's header read timeout is on: a request's headers must arrive within
//! [`HEADER_READ_TIMEOUT`], and a keep-alive connection idle that long between requests is
//! closed too. Bodies have their own deadline ([`BODY_READ_TIMEOUT`]); an upgraded WebSocket
//! leaves hyper and has its own pings.
//!
//! [`BODY_READ_TIMEOUT`]: crate::limits::BODY_READ_TIMEOUT

use std::future::Future;
use std::pin::pin;

use axum::serve::Listener;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;

use crate::limits::HEADER_READ_TIMEOUT;

/// Serves `router` on every connection `listener` accepts until `shutdown` resolves; then
/// stops accepting, lets requests in progress finish and returns once their connections have
/// closed (upgraded WebSockets are not waited for: the node closes them itself).
pub async fn serve<L>(mut listener: L, router: Router, shutdown: impl Future<Output = ()>)
where
    L: Listener,
    L::Addr: std::fmt::Debug,
{
    let mut builder = Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT);
    let connections = GracefulShutdown::new();
    let mut shutdown = pin!(shutdown);
    loop {
        let (io, remote) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.as_mut() => break,
        };
        let service = TowerToHyperService::new(router.clone());
        let connection = builder.serve_connection_with_upgrades(TokioIo::new(io), service).into_owned();
        let connection = connections.watch(connection);
        tokio::spawn(async move {
            // A client that went away or sent garbage; hyper has answered what it could.
            if let Err(error) = connection.await {
                tracing::debug!(?remote, %error, "connection ended with an error");
            }
        });
    }
    drop(listener);
    connections.shutdown().await;
}
