//! Keep-alive HTTP/1.1 connections to the nodes, each driven by the task that uses it.
//!
//! hyper's pooled client runs every connection in a task of its own, so each request
//! crosses between tasks twice (the request to the connection's task, the answer back),
//! often between the runtime's two threads with a wake-up each way. Here a request's task
//! checks a connection out, polls its I/O itself while the exchange runs, and checks it
//! back in: one task, no hand-off. An idle connection is polled by nobody; a node that
//! closed it is noticed when it is next checked out ([`Connection::ready`]).

use std::collections::HashMap;
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::error::BoxError;
use crate::limits::{HTTP_POOL_IDLE_PER_NODE_MAX, HTTP_POOL_IDLE_TIMEOUT};

/// One open connection: the handle requests go through, and the future doing its I/O.
pub(super) struct Connection {
    pub(super) sender: http1::SendRequest<Full<Bytes>>,
    io: http1::Connection<TokioIo<TcpStream>, Full<Bytes>>,
    /// The I/O future has finished: the connection is closed.
    closed: bool,
}

impl Connection {
    /// Connects to `authority` (`host:port`) within `timeout`.
    pub(super) async fn open(authority: &str, timeout: Duration) -> Result<Connection, BoxError> {
        let stream = tokio::time::timeout(timeout, TcpStream::connect(authority))
            .await
            .map_err(|_| format!("connecting to {authority} took more than {timeout:?}"))??;
        // Requests and answers are small; Nagle would hold them behind delayed ACKs.
        stream.set_nodelay(true)?;
        let (sender, io) = http1::handshake(TokioIo::new(stream)).await?;
        Ok(Connection { sender, io, closed: false })
    }

    fn poll_io(&mut self, cx: &mut Context<'_>) {
        // An error here also fails the request or body in flight, which reports it.
        if !self.closed && pin!(&mut self.io).poll(cx).is_ready() {
            self.closed = true;
        }
    }

    /// Waits until the connection can take a request; false when it is closed.
    pub(super) async fn ready(&mut self) -> bool {
        poll_fn(|cx| {
            self.poll_io(cx);
            match self.sender.poll_ready(cx) {
                Poll::Ready(result) => Poll::Ready(result.is_ok()),
                Poll::Pending if self.closed => Poll::Ready(false),
                Poll::Pending => Poll::Pending,
            }
        })
        .await
    }

    /// Runs the connection's I/O until `exchange` (a request sent on it, or the body of its
    /// answer) completes.
    pub(super) async fn drive<F: Future>(&mut self, exchange: F) -> F::Output {
        let mut exchange = pin!(exchange);
        poll_fn(|cx| {
            if let Poll::Ready(out) = exchange.as_mut().poll(cx) {
                return Poll::Ready(out);
            }
            self.poll_io(cx);
            // The I/O may just have settled the exchange (its answer, or an error when the
            // connection closed): poll it again now rather than after a wake-up round trip
            // through the scheduler, which for a closed connection would never come.
            exchange.as_mut().poll(cx)
        })
        .await
    }

    fn reusable(&self) -> bool {
        !self.closed && !self.sender.is_closed()
    }
}

/// An idle connection and since when.
struct Idle {
    connection: Connection,
    since: Instant,
}

#[derive(Default)]
struct Idles {
    /// By `host:port`, oldest first.
    by_node: HashMap<String, Vec<Idle>>,
    /// When connections idle past [`HTTP_POOL_IDLE_TIMEOUT`] were last closed.
    swept: Option<Instant>,
}

/// The idle connections to every node.
pub(super) struct Pool {
    idle: Mutex<Idles>,
}

impl Pool {
    pub(super) fn new() -> Pool {
        Pool { idle: Mutex::new(Idles::default()) }
    }

    /// The most recently used idle connection to `authority`, if one is fresh enough.
    pub(super) fn checkout(&self, authority: &str) -> Option<Connection> {
        let mut idle = self.lock();
        let list = idle.by_node.get_mut(authority)?;
        let newest = list.pop()?;
        if newest.since.elapsed() < HTTP_POOL_IDLE_TIMEOUT {
            return Some(newest.connection);
        }
        // The rest are older still.
        list.clear();
        None
    }

    /// Keeps `connection` for the next request to `authority`, unless it is closed or the
    /// node already has its share of idle connections.
    pub(super) fn checkin(&self, authority: &str, connection: Connection) {
        if !connection.reusable() {
            return;
        }
        let now = Instant::now();
        let mut idle = self.lock();
        // Close connections nobody used for a while, to nodes this client may have stopped
        // talking to; at most once per timeout, so a busy client pays nothing per request.
        if idle.swept.is_none_or(|at| now.duration_since(at) >= HTTP_POOL_IDLE_TIMEOUT) {
            idle.swept = Some(now);
            idle.by_node.retain(|_, list| {
                list.retain(|i| now.duration_since(i.since) < HTTP_POOL_IDLE_TIMEOUT);
                !list.is_empty()
            });
        }
        // Looked up before `entry`, which would allocate the key on every request.
        let list = match idle.by_node.get_mut(authority) {
            Some(list) => list,
            None => idle.by_node.entry(authority.to_string()).or_default(),
        };
        if list.len() < HTTP_POOL_IDLE_PER_NODE_MAX {
            list.push(Idle { connection, since: now });
        }
    }

    fn idle_count(&self) -> usize {
        self.lock().by_node.values().map(Vec::len).sum()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Idles> {
        // The lock guards plain pushes and pops; a panic cannot leave the lists half-changed.
        self.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("idle", &self.idle_count()).finish()
    }
}
