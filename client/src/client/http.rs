//! One HTTP/1.1 exchange with one node, over a pool of keep-alive connections (hyper).
//!
//! The client follows redirects, picks nodes and retries itself (`call.rs`), so all it needs
//! from HTTP is a request and the status, `Location` and body of the answer. reqwest did the
//! same with more layers on top: a `Url` parsed again into a `Uri`, a redirect layer that
//! parsed it once more although it was turned off, and the answer's URL parsed a third time,
//! a quarter of the load generator's CPU per request outside hyper.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderValue, CONTENT_TYPE, LOCATION, USER_AGENT};
use hyper::{Method, Request, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use url::Url;

use crate::limits::HTTP_POOL_IDLE_TIMEOUT;

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
    /// The connection could not be opened, or broke before the answer's head arrived.
    #[error("request to {url} failed")]
    Send {
        url: String,
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    /// The connection broke while the body was read.
    #[error("reading the answer from {url} failed")]
    Body {
        url: String,
        #[source]
        source: hyper::Error,
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
            HttpError::Send { source, .. } => source.is_connect(),
            HttpError::Url { .. } => true,
            HttpError::Timeout { .. } | HttpError::Body { .. } => false,
        }
    }
}

/// A pool of keep-alive connections to every node.
#[derive(Clone, Debug)]
pub(crate) struct Http {
    pool: Client<HttpConnector, Full<Bytes>>,
}

impl Http {
    pub(crate) fn new(connect_timeout: Duration) -> Http {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(connect_timeout));
        // Requests and answers are small; Nagle would hold them behind delayed ACKs.
        connector.set_nodelay(true);
        let pool = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(HTTP_POOL_IDLE_TIMEOUT)
            .build(connector);
        Http { pool }
    }

    /// Sends one request and reads its whole answer, all within `timeout`. A body is sent as
    /// `application/json`.
    pub(crate) async fn send(
        &self,
        method: Method,
        url: &Url,
        body: Option<Bytes>,
        timeout: Duration,
    ) -> Result<Answer, HttpError> {
        let uri: Uri = url.as_str().parse().map_err(|_| HttpError::Url { url: url.to_string() })?;
        let mut request = Request::builder().method(method).uri(uri).header(USER_AGENT, CLIENT_USER_AGENT);
        if body.is_some() {
            request = request.header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        let request =
            request.body(Full::new(body.unwrap_or_default())).map_err(|_| HttpError::Url { url: url.to_string() })?;
        let exchange = async {
            let response =
                self.pool.request(request).await.map_err(|source| HttpError::Send { url: url.to_string(), source })?;
            let status = response.status().as_u16();
            let location = response.headers().get(LOCATION).and_then(|v| v.to_str().ok()).map(str::to_string);
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|source| HttpError::Body { url: url.to_string(), source })?
                .to_bytes();
            Ok(Answer { status, location, body })
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(answer) => answer,
            Err(_) => Err(HttpError::Timeout { url: url.to_string(), after: timeout }),
        }
    }
}
