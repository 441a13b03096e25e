//! The seams between the node and the outside world: how it dials peers and reads the clock.
//!
//! Production passes [`TokioDialer`] and [`SystemClock`]; the simulation passes turmoil's
//! sockets and simulated time. The listener is any `axum::serve::Listener`. Nothing else in
//! the node knows which world it runs in.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncRead, AsyncWrite};

use crate::limits::{TCP_KEEPALIVE_IDLE, TCP_KEEPALIVE_INTERVAL, TCP_KEEPALIVE_PROBES};

/// A byte stream to a peer.
pub trait PeerStream: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> PeerStream for T {}

pub type BoxedStream = Box<dyn PeerStream>;
pub type DialFuture<'a> = Pin<Box<dyn Future<Output = io::Result<BoxedStream>> + Send + 'a>>;

/// Opens connections to peers by their advertise address (`HOST:PORT`).
pub trait Dialer: Send + Sync + 'static {
    fn dial<'a>(&'a self, addr: &'a str) -> DialFuture<'a>;
}

/// Dials with tokio's TCP.
pub struct TokioDialer;

impl Dialer for TokioDialer {
    fn dial<'a>(&'a self, addr: &'a str) -> DialFuture<'a> {
        Box::pin(async move {
            let stream = tokio::net::TcpStream::connect(addr).await?;
            tune_tcp(&stream)?;
            Ok(Box::new(stream) as BoxedStream)
        })
    }
}

/// Sets up every TCP connection the node accepts or dials.
///
/// - `TCP_NODELAY`: Nagle's algorithm would hold a small frame (a Raft RPC, a WebSocket
///   publish ack, a message to a subscriber) until the peer acknowledges the previous one, up
///   to a delayed-ACK timeout (40 ms) added to a latency otherwise under a millisecond.
/// - Keepalive probes after [`TCP_KEEPALIVE_IDLE`] of silence: a peer that vanished without a
///   FIN or RST (powered off, or cut off longer than its own retransmissions last) is noticed
///   and its connection closed, instead of holding a task and its buffers forever. A peer's
///   `/raft` connection has no idle timeout of its own: a follower sends nothing on it for as
///   long as it follows.
pub fn tune_tcp(stream: &tokio::net::TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(TCP_KEEPALIVE_IDLE)
        .with_interval(TCP_KEEPALIVE_INTERVAL)
        .with_retries(TCP_KEEPALIVE_PROBES);
    socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive)
}

/// Wall-clock time in milliseconds since the Unix epoch: the leader's timestamps.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> u64;
}

pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
    }
}

/// The outside world as the node sees it.
#[derive(Clone)]
pub struct Env {
    pub dialer: Arc<dyn Dialer>,
    pub clock: Arc<dyn Clock>,
    /// Where subscription sessions run; `None`: on the node's own runtime (the simulation,
    /// whose hosts each have one).
    pub delivery: Option<tokio::runtime::Handle>,
}

impl Env {
    /// Real sockets and the system clock; sessions on `delivery` (see `main.rs`).
    pub fn production(delivery: Option<tokio::runtime::Handle>) -> Self {
        Self { dialer: Arc::new(TokioDialer), clock: Arc::new(SystemClock), delivery }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tuned_connections_have_nodelay_and_keepalive() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dialed = tokio::net::TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        for stream in [&dialed, &accepted] {
            tune_tcp(stream).unwrap();
            assert!(stream.nodelay().unwrap());
            let socket = socket2::SockRef::from(stream);
            assert!(socket.keepalive().unwrap());
            assert_eq!(socket.tcp_keepalive_time().unwrap(), TCP_KEEPALIVE_IDLE);
            assert_eq!(socket.tcp_keepalive_interval().unwrap(), TCP_KEEPALIVE_INTERVAL);
            assert_eq!(socket.tcp_keepalive_retries().unwrap(), TCP_KEEPALIVE_PROBES);
        }
    }
}
