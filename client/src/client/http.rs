//! One HTTP/1.1 exchange with one node, over the keep-alive connections of `pool.rs`.
//!
//! The client follows redirects, picks nodes and retries itself (`call.rs`), so all it needs
//! from HTTP is a request and the status, `Location` and body of the answer. reqwest did the
//! same with more layers on top: a `Url` parsed again into a `Uri`, a redirect layer that
//! parsed it once more although it was turned off, and the answer's URL parsed a third time,
//! a quarter of the load generator's CPU per request outside hyper.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, HOST, LOCATION, USER_AGENT};
use hyper::{Method, Request, Uri};
use url::{Position, Url};

use super::pool::{Connection, Pool};
use crate::error::BoxError;
use crate::limits::HTTP_ANSWER_BYTES_MAX;

const CLIENT_USER_AGENT: HeaderValue = HeaderValue::from_static(concat!("pubsub-client/", env!("CARGO_PKG_VERSION")));

/// What the client reads of an answer.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    /// The `Location` header, on a redirect.
    pub(crate) location: Option<String>,
    pub(crate) body: Bytes,
}

/// A 2xx status.
pub(crate) fn is_success(status: u16) -> bool {
    (200..300).contains(&status)
}

/// Why an exchange got no answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HttpError {
    /// No answer in time (connecting, sending or reading the body).
    #[error("no answer from {url} within {after:?}")]
    Timeout { url: String, after: Duration },
    /// The connection could not be opened, or was closed before any of the request was
    /// written: the node cannot have seen it.
    #[error("cannot connect to {url}")]
    Connect {
        url: String,
        #[source]
        source: BoxError,
    },
    /// The connection broke after the request was handed to it, before the answer's head.
    #[error("request to {url} failed")]
    Send {
        url: String,
        #[source]
        source: hyper::Error,
    },
    /// The connection broke while the body was read, or the body passed
    /// [`HTTP_ANSWER_BYTES_MAX`].
    #[error("reading the answer from {url} failed")]
    Body {
        url: String,
        #[source]
        source: BoxError,
    },
    /// A URL http::Uri refuses (the client builds them, so this is a bug).
    #[error("invalid request URL {url}")]
    Url { url: String },
}

impl HttpError {
    pub(crate) fn is_timeout(&self) -> bool {
        matches!(self, HttpError::Timeout { .. })
    }

    /// True when the request cannot have reached the server: it was never sent.
    pub(crate) fn is_connect(&self) -> bool {
        match self {
            HttpError::Connect { .. } | HttpError::Url { .. } => true,
            HttpError::Timeout { .. } | HttpError::Send { .. } | HttpError::Body { .. } => false,
        }
    }
}

/// Where a request goes: the node's `host:port` and the request's origin-form target.
struct Target {
    authority: String,
    host: HeaderValue,
    path: Uri,
}

impl Target {
    fn of(url: &Url) -> Result<Target, HttpError> {
        let bad = || HttpError::Url { url: url.to_string() };
        let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
            return Err(bad());
        };
        Ok(Target {
            authority: format!("{host}:{port}"),
            host: HeaderValue::from_str(&url[Position::BeforeHost..Position::AfterPort]).map_err(|_| bad())?,
            path: url[Position::BeforePath..].parse().map_err(|_| bad())?,
        })
    }
}

/// Keep-alive connections to every node, shared by the clones of one client.
#[derive(Clone, Debug)]
pub(crate) struct Http {
    pool: Arc<Pool>,
    connect_timeout: Duration,
}

impl Http {
    pub(crate) fn new(connect_timeout: Duration) -> Http {
        Http { pool: Arc::new(Pool::new()), connect_timeout }
    }

    /// Sends one request and reads its whole answer, all within `timeout`. A body is sent as
    /// `application/json`.
    pub(crate) async fn send(
        &self,
        method: Method,
        url: &Url,
        body: Option<Bytes>,
        secret: Option<&str>,
        timeout: Duration,
    ) -> Result<Answer, HttpError> {
        let target = Target::of(url)?;
        let mut request = Request::builder()
            .method(method)
            .uri(target.path.clone())
            .header(HOST, target.host.clone())
            .header(USER_AGENT, CLIENT_USER_AGENT);
        if body.is_some() {
            request = request.header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        if let Some(secret) = secret {
            request = request.header(AUTHORIZATION, format!("Bearer {secret}"));
        }
        let request =
            request.body(Full::new(body.unwrap_or_default())).map_err(|_| HttpError::Url { url: url.to_string() })?;
        match tokio::time::timeout(timeout, self.exchange(&target, request, url)).await {
            Ok(answer) => answer,
            Err(_) => Err(HttpError::Timeout { url: url.to_string(), after: timeout }),
        }
    }

    /// Sends `request` on an idle connection to the node, or a new one. A pooled connection
    /// the node closed while it sat idle refuses the request before writing any of it and
    /// hands it back; then the next one is tried, and only a new connection's refusal is an
    /// error.
    async fn exchange(
        &self,
        target: &Target,
        mut request: Request<Full<Bytes>>,
        url: &Url,
    ) -> Result<Answer, HttpError> {
        let unsent = |source: BoxError| HttpError::Connect { url: url.to_string(), source };
        loop {
            let (mut connection, pooled) = match self.pool.checkout(&target.authority) {
                Some(connection) => (connection, true),
                None => (Connection::open(&target.authority, self.connect_timeout).await.map_err(unsent)?, false),
            };
            if !connection.ready().await {
                match pooled {
                    true => continue,
                    false => return Err(unsent("the connection closed before the request was sent".into())),
                }
            }
            let sent = connection.sender.try_send_request(request);
            let response = match connection.drive(sent).await {
                Ok(response) => response,
                // hyper hands the request back only when it wrote none of it.
                Err(mut refused) => match refused.take_message() {
                    Some(again) if pooled => {
                        request = again;
                        continue;
                    }
                    Some(_) => return Err(unsent(Box::new(refused.into_error()))),
                    None => return Err(HttpError::Send { url: url.to_string(), source: refused.into_error() }),
                },
            };
            let status = response.status().as_u16();
            let location = response.headers().get(LOCATION).and_then(|v| v.to_str().ok()).map(str::to_string);
            let body = connection
                .drive(Limited::new(response.into_body(), HTTP_ANSWER_BYTES_MAX).collect())
                .await
                .map_err(|source| HttpError::Body { url: url.to_string(), source })?
                .to_bytes();
            self.pool.checkin(&target.authority, connection);
            return Ok(Answer { status, location, body });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(5);

    /// What a test node saw.
    #[derive(Default)]
    struct Counts {
        connections: AtomicUsize,
        requests: AtomicUsize,
        closed: AtomicUsize,
    }

    /// A node that answers `200 ok` to `answers_per_connection` requests (without bodies) on
    /// each connection, then closes it.
    async fn node(answers_per_connection: usize) -> (Url, Arc<Counts>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = Url::parse(&format!("http://{}/topics", listener.local_addr().unwrap())).unwrap();
        let counts = Arc::new(Counts::default());
        let seen = counts.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                seen.connections.fetch_add(1, Ordering::SeqCst);
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    for _ in 0..answers_per_connection {
                        let mut head = Vec::new();
                        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                            match socket.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => head.extend_from_slice(&buf[..n]),
                            }
                        }
                        seen.requests.fetch_add(1, Ordering::SeqCst);
                        socket.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await.unwrap();
                    }
                    drop(socket);
                    seen.closed.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        (url, counts)
    }

    async fn get(http: &Http, url: &Url) -> Answer {
        http.send(Method::GET, url, None, None, TIMEOUT).await.unwrap()
    }

    #[tokio::test]
    async fn sequential_requests_share_one_connection() {
        let (url, counts) = node(usize::MAX).await;
        let http = Http::new(TIMEOUT);
        for _ in 0..5 {
            let answer = get(&http, &url).await;
            assert_eq!((answer.status, &answer.body[..]), (200, &b"ok"[..]));
        }
        assert_eq!(counts.requests.load(Ordering::SeqCst), 5);
        assert_eq!(counts.connections.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn concurrent_requests_open_a_connection_each_and_keep_them() {
        let (url, counts) = node(usize::MAX).await;
        let http = Http::new(TIMEOUT);
        for _ in 0..3 {
            let answers = futures_util::future::join_all((0..4).map(|_| get(&http, &url))).await;
            assert!(answers.iter().all(|a| a.status == 200));
        }
        assert_eq!(counts.requests.load(Ordering::SeqCst), 12);
        assert!(counts.connections.load(Ordering::SeqCst) <= 4 * 2, "connections are reused across rounds");
    }

    #[tokio::test]
    async fn a_connection_the_node_closed_while_idle_is_replaced_without_an_error() {
        let (url, counts) = node(1).await;
        let http = Http::new(TIMEOUT);
        assert_eq!(get(&http, &url).await.status, 200);
        // The node has closed the pooled connection (on loopback its FIN is already queued).
        while counts.closed.load(Ordering::SeqCst) < 1 {
            tokio::task::yield_now().await;
        }
        assert_eq!(get(&http, &url).await.status, 200);
        assert_eq!(counts.requests.load(Ordering::SeqCst), 2);
        assert_eq!(counts.connections.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn an_answer_longer_than_the_cap_is_an_error_not_a_growing_buffer() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = Url::parse(&format!("http://{}/", listener.local_addr().unwrap())).unwrap();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = socket.read(&mut buf).await;
            // Chunked, and never ending: only the cap stops the reader.
            let _ = socket.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n").await;
            let chunk = format!("{:x}\r\n{}\r\n", 1 << 20, "x".repeat(1 << 20));
            while socket.write_all(chunk.as_bytes()).await.is_ok() {}
        });
        let error = Http::new(TIMEOUT).send(Method::GET, &url, None, None, Duration::from_secs(60)).await.unwrap_err();
        assert!(matches!(error, HttpError::Body { .. }), "{error:?}");
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_connect_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = Url::parse(&format!("http://{}/", listener.local_addr().unwrap())).unwrap();
        drop(listener);
        let error = Http::new(TIMEOUT).send(Method::GET, &url, None, None, TIMEOUT).await.unwrap_err();
        assert!(error.is_connect() && !error.is_timeout(), "{error:?}");
    }

    #[test]
    fn targets_are_origin_form_with_the_url_authority_as_host() {
        let target = Target::of(&Url::parse("http://[::1]:7000/topics/a%20b/messages?ack=appended").unwrap()).unwrap();
        assert_eq!(target.authority, "[::1]:7000");
        assert_eq!(target.host, "[::1]:7000");
        assert_eq!(target.path, "/topics/a%20b/messages?ack=appended");
        let default_port = Target::of(&Url::parse("http://node-1/cluster").unwrap()).unwrap();
        assert_eq!((default_port.authority.as_str(), default_port.host.to_str().unwrap()), ("node-1:80", "node-1"));
    }
}
