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
            // Raft RPCs are small and latency-bound.
            stream.set_nodelay(true)?;
            Ok(Box::new(stream) as BoxedStream)
        })
    }
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
