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
