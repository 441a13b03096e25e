//! The node's seams implemented over turmoil: listener, dialer and clock, plus a minimal
//! HTTP and WebSocket client for simulated clients.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use pubsub_node::net::{BoxedStream, Clock, DialFuture, Dialer};
use serde_json::Value;

/// turmoil's listener as an axum listener.
pub struct SimListener(pub turmoil::net::TcpListener);

impl axum::serve::Listener for SimListener {
    type Io = turmoil::net::TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            if let Ok(pair) = self.0.accept().await {
                return pair;
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.0.local_addr()
    }
}

pub struct SimDialer;

impl Dialer for SimDialer {
    fn dial<'a>(&'a self, addr: &'a str) -> DialFuture<'a> {
        Box::pin(async move {
            let stream = turmoil::net::TcpStream::connect(addr).await?;
            Ok(Box::new(stream) as BoxedStream)
        })
    }
}

/// Simulated wall clock, with an offset the fault injector can jump.
pub struct SimClock {
    pub offset_ms: Arc<AtomicI64>,
}

impl Clock for SimClock {
    fn now_ms(&self) -> u64 {
        let base = turmoil::since_epoch().unwrap_or_default().as_millis() as i64;
        (base + self.offset_ms.load(Ordering::Relaxed)).max(0) as u64
    }
}

/// One HTTP/1.1 request to `host:8080` over a fresh simulated connection.
pub async fn request(host: &str, method: &str, path: &str, body: Option<&Value>) -> Result<(u16, Value), String> {
    let exchange = async {
        let stream = turmoil::net::TcpStream::connect((host, 8080)).await.map_err(|e| e.to_string())?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let bytes = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        let req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", host)
            .header("content-type", "application/json")
            .body(Full::new(bytes))
            .map_err(|e| e.to_string())?;
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok::<_, String>((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
    };
    tokio::time::timeout(Duration::from_secs(3), exchange).await.map_err(|_| "timeout".to_string())?
}

pub type SimWs = tokio_tungstenite::WebSocketStream<turmoil::net::TcpStream>;

pub async fn websocket(host: &str, path: &str) -> Result<SimWs, String> {
    let connect = async {
        let stream = turmoil::net::TcpStream::connect((host, 8080)).await.map_err(|e| e.to_string())?;
        let url = format!("ws://{host}:8080{path}");
        let (ws, _) = tokio_tungstenite::client_async(url, stream).await.map_err(|e| e.to_string())?;
        Ok::<_, String>(ws)
    };
    tokio::time::timeout(Duration::from_secs(3), connect).await.map_err(|_| "timeout".to_string())?
}

/// Counts what the simulated nodes log about leader hand-overs (raft/handover.rs), so that a
/// simulation can show its clean stops did hand over. Counted per thread: turmoil runs every
/// host on the thread that steps the simulation, so a thread's count is its own run's.
pub mod handovers {
    use std::cell::Cell;
    use std::fmt::Debug;
    use std::sync::Once;

    use tracing::field::{Field, Visit};
    use tracing_subscriber::filter::filter_fn;
    use tracing_subscriber::layer::{Context, SubscriberExt};
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;

    /// The hand-overs of one run.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct Counts {
        /// Stopping leaders whose successor took the hand-over.
        pub handed: usize,
        /// Successors that still followed the stopped leader and stood at once.
        pub stood: usize,
    }

    impl std::ops::AddAssign for Counts {
        fn add_assign(&mut self, other: Counts) {
            self.handed += other.handed;
            self.stood += other.stood;
        }
    }

    /// The events counted, as (target, message): the stopping leader's, and its successor's.
    const HANDED: (&str, &str) = ("pubsub_node::raft::handover", "handed leadership over");
    const STOOD: (&str, &str) = ("openraft::core::raft_core", "the leader stepped down and hands over");

    thread_local! {
        static COUNTS: Cell<Counts> = const { Cell::new(Counts { handed: 0, stood: 0 }) };
    }

    /// Counts from zero on this thread (installing the counter as the global subscriber the
    /// first time).
    pub fn reset() {
        static INSTALL: Once = Once::new();
        INSTALL.call_once(|| {
            let counted = filter_fn(|m| m.is_event() && (m.target() == HANDED.0 || m.target() == STOOD.0));
            // Another subscriber set by the test binary wins; the counts then stay at zero.
            let _ = tracing_subscriber::registry().with(Counter.with_filter(counted)).try_init();
        });
        COUNTS.set(Counts::default());
    }

    /// This thread's counts since [`reset`].
    pub fn counts() -> Counts {
        COUNTS.get()
    }

    struct Counter;

    impl<S: tracing::Subscriber> Layer<S> for Counter {
        fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
            let mut fields = Fields::default();
            event.record(&mut fields);
            let seen = (event.metadata().target(), fields.message.as_str());
            let mut counts = COUNTS.get();
            if seen == HANDED {
                counts.handed += 1;
            } else if seen == STOOD && fields.elect {
                counts.stood += 1;
            }
            COUNTS.set(counts);
        }
    }

    /// The fields of an event that [`Counter`] reads.
    #[derive(Default)]
    struct Fields {
        message: String,
        elect: bool,
    }

    impl Visit for Fields {
        fn record_bool(&mut self, field: &Field, value: bool) {
            if field.name() == "elect" {
                self.elect = value;
            }
        }

        fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
            if field.name() == "message" {
                self.message = format!("{value:?}");
            }
        }
    }
}
