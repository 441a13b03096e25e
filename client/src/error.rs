//! Errors of the client: what the server said ([`ApiError`]) and what went wrong on the way
//! ([`Error`]).

use std::fmt;
use std::time::Duration;

use serde_json::Value;

/// Boxed source of a transport failure, kept so `Error::source()` chains reach it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An error code of API.md §1, spelled as the server spells it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// `307`: a write reached a follower (the client follows it; callers rarely see it).
    NotLeader,
    /// `503`: no leader is known; the client retries it.
    NoLeader,
    /// `404`: the topic does not exist or was deleted.
    TopicNotFound,
    /// `409`: reserved by the server (create is idempotent).
    TopicAlreadyExists,
    /// `409`: this message id was already published to this topic.
    DuplicateMessageId,
    /// `400`: cursor beyond the topic's `current_sequence`, or not a number.
    InvalidCursor,
    /// `400`: malformed body, missing or wrong-typed field.
    InvalidRequest,
    /// `400`: topic name outside `[A-Za-z0-9._-]{1,255}`.
    InvalidTopicName,
    /// `413`: message payload over 1 MiB.
    PayloadTooLarge,
    /// `408`: the request body did not arrive within the server's body timeout.
    RequestTimeout,
    /// `401`: the Raft endpoint or a membership change without the cluster secret, when the
    /// cluster has one (the rest of the client API has none).
    Unauthorized,
    /// `403`: the Raft endpoint reached by a node of another cluster.
    WrongCluster,
    /// `504`: not committed within the server's write timeout; the client retries it.
    RaftTimeout,
    /// `500`: appended but failed to commit; the client retries it with the same id.
    NotCommitted,
    /// `503`: the node cannot take this now (a budget full, a snapshot being installed, the
    /// node stopping); another node, or the same one shortly, may.
    Unavailable,
    /// `503`: `/ready` of a node not ready to serve.
    NotReady,
    /// `404`: no such route, or no cursor recorded for the subscriber.
    NotFound,
    /// `405`: a method the route does not take.
    MethodNotAllowed,
    /// `507`: the leader's data dir is below its free-space reserve (`--min-free-bytes`);
    /// nothing was stored. Not retried: it lasts until an operator makes room.
    InsufficientStorage,
    /// `409`: (ext) a membership change that contradicts the membership (an id at another
    /// address, an address another node has).
    MemberConflict,
    /// `500`: a storage or internal failure, logged on the node.
    Internal,
    /// A code this client does not know, or `http_<status>` when the body had none
    /// (for example a proxy's error page).
    Other(String),
}

impl ErrorCode {
    /// Parses the `error` field of an error body.
    pub fn parse(code: &str) -> ErrorCode {
        match code {
            "not_leader" => ErrorCode::NotLeader,
            "no_leader" => ErrorCode::NoLeader,
            "topic_not_found" => ErrorCode::TopicNotFound,
            "topic_already_exists" => ErrorCode::TopicAlreadyExists,
            "duplicate_message_id" => ErrorCode::DuplicateMessageId,
            "invalid_cursor" => ErrorCode::InvalidCursor,
            "invalid_request" => ErrorCode::InvalidRequest,
            "invalid_topic_name" => ErrorCode::InvalidTopicName,
            "payload_too_large" => ErrorCode::PayloadTooLarge,
            "request_timeout" => ErrorCode::RequestTimeout,
            "unauthorized" => ErrorCode::Unauthorized,
            "wrong_cluster" => ErrorCode::WrongCluster,
            "raft_timeout" => ErrorCode::RaftTimeout,
            "not_committed" => ErrorCode::NotCommitted,
            "unavailable" => ErrorCode::Unavailable,
            "not_ready" => ErrorCode::NotReady,
            "not_found" => ErrorCode::NotFound,
            "method_not_allowed" => ErrorCode::MethodNotAllowed,
            "insufficient_storage" => ErrorCode::InsufficientStorage,
            "member_conflict" => ErrorCode::MemberConflict,
            "internal" => ErrorCode::Internal,
            other => ErrorCode::Other(other.to_string()),
        }
    }

    /// The code as the server spells it.
    pub fn as_str(&self) -> &str {
        match self {
            ErrorCode::NotLeader => "not_leader",
            ErrorCode::NoLeader => "no_leader",
            ErrorCode::TopicNotFound => "topic_not_found",
            ErrorCode::TopicAlreadyExists => "topic_already_exists",
            ErrorCode::DuplicateMessageId => "duplicate_message_id",
            ErrorCode::InvalidCursor => "invalid_cursor",
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::InvalidTopicName => "invalid_topic_name",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::RequestTimeout => "request_timeout",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::WrongCluster => "wrong_cluster",
            ErrorCode::RaftTimeout => "raft_timeout",
            ErrorCode::NotCommitted => "not_committed",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::NotReady => "not_ready",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::InsufficientStorage => "insufficient_storage",
            ErrorCode::MemberConflict => "member_conflict",
            ErrorCode::Internal => "internal",
            ErrorCode::Other(other) => other,
        }
    }

    /// The HTTP status the API answers this code with (API.md §1). A WebSocket error frame
    /// carries a code but no status; this gives its [`ApiError`] the status the same refusal
    /// has over HTTP, so callers can treat both alike. Unknown codes count as `500`.
    pub fn http_status(&self) -> u16 {
        match self {
            ErrorCode::NotLeader => 307,
            ErrorCode::NoLeader => 503,
            ErrorCode::TopicNotFound => 404,
            ErrorCode::TopicAlreadyExists | ErrorCode::DuplicateMessageId | ErrorCode::MemberConflict => 409,
            ErrorCode::InvalidCursor | ErrorCode::InvalidRequest | ErrorCode::InvalidTopicName => 400,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::RequestTimeout => 408,
            ErrorCode::Unauthorized => 401,
            ErrorCode::WrongCluster => 403,
            ErrorCode::RaftTimeout => 504,
            ErrorCode::NotCommitted | ErrorCode::Internal | ErrorCode::Other(_) => 500,
            ErrorCode::Unavailable | ErrorCode::NotReady => 503,
            ErrorCode::NotFound => 404,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::InsufficientStorage => 507,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error answer of the server: its HTTP status and the API.md error body
/// `{"error": CODE, "message": TEXT, "details": {...}}`.
///
/// ```
/// use pubsub_client::{ApiError, ErrorCode};
///
/// let body = br#"{"error":"duplicate_message_id","message":"already published",
///                 "id":"m-1","existing_sequence":42,"details":{"existing_sequence":42}}"#;
/// let err = ApiError::from_body(409, body);
/// assert_eq!(err.code, ErrorCode::DuplicateMessageId);
/// assert_eq!(err.existing_sequence(), Some(42));
/// ```
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code} ({status}): {message}")]
pub struct ApiError {
    /// HTTP status of the answer.
    pub status: u16,
    /// The `error` field, typed.
    pub code: ErrorCode,
    /// The `message` field: a human-readable explanation.
    pub message: String,
    /// The `details` field (`{}` when the server sent none). Boxed, like `body`, to keep
    /// `Result<_, Error>` small.
    pub details: Box<Value>,
    /// The whole body, because some answers carry fields at the top level
    /// (`existing_sequence` of a duplicate, `leader_address` of a redirect).
    pub body: Box<Value>,
}

impl ApiError {
    /// Builds the error from a status and a response body. Tolerant by design: a body that is
    /// not the API.md error shape (a proxy's HTML page, an empty body) still gives an error,
    /// with code `http_<status>` and the text as message.
    pub fn from_body(status: u16, body: &[u8]) -> ApiError {
        let parsed: Option<Value> = serde_json::from_slice(body).ok();
        let code = parsed
            .as_ref()
            .and_then(|v| v.get("error"))
            .and_then(Value::as_str)
            .map(ErrorCode::parse)
            .unwrap_or_else(|| ErrorCode::Other(format!("http_{status}")));
        let message = match parsed.as_ref().and_then(|v| v.get("message")) {
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
            None if parsed.is_some() => String::new(),
            None => String::from_utf8_lossy(body).trim().chars().take(200).collect(),
        };
        let details = parsed
            .as_ref()
            .and_then(|v| v.get("details"))
            .cloned()
            .unwrap_or_else(|| Value::Object(Default::default()));
        ApiError { status, code, message, details: Box::new(details), body: Box::new(parsed.unwrap_or(Value::Null)) }
    }

    /// A field of the body, looked up at the top level first and then in `details`.
    pub fn field(&self, name: &str) -> Option<&Value> {
        self.body.get(name).filter(|v| !v.is_null()).or_else(|| self.details.get(name).filter(|v| !v.is_null()))
    }

    /// `existing_sequence` of a `duplicate_message_id` answer; `None` when absent or `null`
    /// (the first publish of that id is still in flight).
    pub fn existing_sequence(&self) -> Option<u64> {
        self.field("existing_sequence").and_then(Value::as_u64)
    }

    /// `leader_address` of a `not_leader` answer.
    pub fn leader_address(&self) -> Option<&str> {
        self.field("leader_address").and_then(Value::as_str)
    }
}

/// Everything a client call can fail with.
///
/// A CLI maps it to exit codes with [`Error::is_unreachable`]: `Api` means the server said
/// no; `NoLeader`, `Unreachable` and `Timeout` mean the cluster could not be reached.
///
/// ```no_run
/// use pubsub_client::{Client, Error, ErrorCode};
/// use serde_json::json;
///
/// # async fn run(client: Client) {
/// match client.publish("orders", json!({"n": 1})).await {
///     Ok(ack) => println!("#{:?}", ack.sequence),
///     Err(Error::Api(e)) if e.code == ErrorCode::TopicNotFound => eprintln!("create it first"),
///     Err(e) if e.is_unreachable() => eprintln!("cluster down, try later: {e}"),
///     Err(e) => eprintln!("refused: {e}"),
/// }
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The server answered with an error body (after any retries the error allows).
    #[error(transparent)]
    Api(#[from] ApiError),
    /// No node named a leader for the whole retry budget.
    #[error("no leader known after {attempts} attempts in {elapsed:?}")]
    NoLeader {
        /// Attempts made, the first included.
        attempts: u32,
        /// Time spent.
        elapsed: Duration,
    },
    /// Every attempt failed to connect or lost its connection.
    #[error("cluster unreachable after {attempts} attempts: {source}")]
    Unreachable {
        /// Attempts made, the first included.
        attempts: u32,
        /// The last transport error.
        #[source]
        source: BoxError,
    },
    /// Attempts timed out until the retry budget or the operation timeout ran out.
    #[error("timed out after {attempts} attempts in {elapsed:?}")]
    Timeout {
        /// Attempts made, the first included.
        attempts: u32,
        /// Time spent.
        elapsed: Duration,
    },
    /// A server address or URL could not be used.
    #[error("invalid server address {address:?}: {reason}")]
    InvalidAddress {
        /// The address as given.
        address: String,
        /// Why it was refused.
        reason: String,
    },
    /// The caller passed something the server would refuse anyway (checked locally).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The server's answer could not be understood.
    #[error("unexpected answer from {url}: {reason}")]
    Protocol {
        /// Where the answer came from.
        url: String,
        /// What was wrong with it.
        reason: String,
    },
    /// A subscription received a message whose sequence skips past the next expected one
    /// without a `messages_expired` frame announcing it. The server broke its no-gap promise;
    /// the stream reports it and then goes on with the message.
    #[error("sequence gap on topic {topic}: last delivered {last_delivered}, received {received}")]
    SequenceGap {
        /// The subscribed topic.
        topic: String,
        /// Last sequence the stream delivered.
        last_delivered: u64,
        /// The sequence that arrived instead of `last_delivered + 1`.
        received: u64,
    },
    /// A write ended after an attempt that may have taken effect on the server: its answer was
    /// lost, or the cluster could not confirm it (`504`, `500 not_committed`), and later
    /// attempts got no final answer, or a refusal that speaks for them alone; or the server
    /// failed it (a `5xx` it does not retry, such as `500 internal`; not `507
    /// insufficient_storage`, refused before anything was done), which may come after
    /// the write was done. A publish may be stored. Publishing again with
    /// the same `id` is safe: the server deduplicates it (a `409` with its `existing_sequence`
    /// says it was stored). `source` is the last attempt's failure.
    #[error("{}outcome unknown, it may have taken effect: {source}", which_write(id, ids))]
    Indeterminate {
        /// The message id, for a single publish (the generated one when the caller gave none).
        id: Option<String>,
        /// Every message's id in order, for a batch publish (the generated ones included);
        /// empty otherwise.
        ids: Vec<String>,
        /// Why the last attempt failed.
        #[source]
        source: Box<Error>,
    },
}

/// The start of an [`Error::Indeterminate`] message: which write it was.
fn which_write(id: &Option<String>, ids: &[String]) -> String {
    match (id, ids) {
        (Some(id), _) => format!("message {id}: "),
        (None, [only]) => format!("batch of 1 message ({only}): "),
        (None, [first, .., last]) => format!("batch of {} messages ({first} … {last}): ", ids.len()),
        (None, []) => String::new(),
    }
}

impl Error {
    /// [`Error::Indeterminate`] after `source`, for message `id` when there is one.
    pub(crate) fn indeterminate(id: Option<String>, source: Error) -> Error {
        Error::Indeterminate { id, ids: Vec::new(), source: Box::new(source) }
    }

    /// An [`Error::Indeterminate`] named after the publish of message `id` (perhaps generated
    /// by the caller of `execute`, which alone knows it); any other error as it is.
    pub(crate) fn naming_message(self, id: &str) -> Error {
        match self {
            Error::Indeterminate { source, .. } => {
                Error::Indeterminate { id: Some(id.to_string()), ids: Vec::new(), source }
            }
            other => other,
        }
    }

    /// [`Error::naming_message`] for a batch publish of messages `ids`, in order.
    pub(crate) fn naming_batch(self, ids: impl FnOnce() -> Vec<String>) -> Error {
        match self {
            Error::Indeterminate { source, .. } => Error::Indeterminate { id: None, ids: ids(), source },
            other => other,
        }
    }

    /// The server's error, when the server answered.
    pub fn api(&self) -> Option<&ApiError> {
        match self {
            Error::Api(api) => Some(api),
            Error::Indeterminate { source, .. } => source.api(),
            _ => None,
        }
    }

    /// True when the cluster could not be reached or had no leader (CLI exit code 3).
    pub fn is_unreachable(&self) -> bool {
        match self {
            Error::NoLeader { .. } | Error::Unreachable { .. } | Error::Timeout { .. } => true,
            Error::Indeterminate { source, .. } => source.is_unreachable(),
            _ => false,
        }
    }

    /// True when the operation may have taken effect although it failed: see
    /// [`Error::Indeterminate`].
    pub fn may_have_taken_effect(&self) -> bool {
        matches!(self, Error::Indeterminate { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_code_round_trips_through_its_spelling() {
        for code in [
            "not_leader",
            "no_leader",
            "topic_not_found",
            "topic_already_exists",
            "duplicate_message_id",
            "invalid_cursor",
            "invalid_request",
            "invalid_topic_name",
            "payload_too_large",
            "request_timeout",
            "unauthorized",
            "wrong_cluster",
            "raft_timeout",
            "not_committed",
            "unavailable",
            "not_ready",
            "not_found",
            "method_not_allowed",
            "insufficient_storage",
            "member_conflict",
            "internal",
        ] {
            let parsed = ErrorCode::parse(code);
            assert!(!matches!(parsed, ErrorCode::Other(_)), "{code} unknown");
            assert_eq!(parsed.as_str(), code);
        }
        assert_eq!(ErrorCode::parse("brand_new"), ErrorCode::Other("brand_new".into()));
    }

    #[test]
    fn each_code_has_the_status_of_the_contract_table() {
        for (code, status) in [
            ("not_leader", 307),
            ("no_leader", 503),
            ("topic_not_found", 404),
            ("duplicate_message_id", 409),
            ("invalid_request", 400),
            ("payload_too_large", 413),
            ("raft_timeout", 504),
            ("not_committed", 500),
            ("unavailable", 503),
            ("not_ready", 503),
            ("not_found", 404),
            ("method_not_allowed", 405),
            ("request_timeout", 408),
            ("wrong_cluster", 403),
            ("internal", 500),
            ("insufficient_storage", 507),
            ("member_conflict", 409),
            ("brand_new", 500),
        ] {
            assert_eq!(ErrorCode::parse(code).http_status(), status, "{code}");
        }
    }

    #[test]
    fn error_body_gives_code_message_and_details() {
        let err =
            ApiError::from_body(404, br#"{"error":"topic_not_found","message":"no topic x","details":{"topic":"x"}}"#);
        assert_eq!(err.status, 404);
        assert_eq!(err.code, ErrorCode::TopicNotFound);
        assert_eq!(err.message, "no topic x");
        assert_eq!(err.details["topic"], "x");
        assert_eq!(err.to_string(), "topic_not_found (404): no topic x");
    }

    #[test]
    fn duplicate_sequence_is_read_from_top_level_or_details_and_null_is_none() {
        let top = ApiError::from_body(409, br#"{"error":"duplicate_message_id","id":"a","existing_sequence":7}"#);
        assert_eq!(top.existing_sequence(), Some(7));
        let nested = ApiError::from_body(409, br#"{"error":"duplicate_message_id","details":{"existing_sequence":9}}"#);
        assert_eq!(nested.existing_sequence(), Some(9));
        let in_flight = ApiError::from_body(409, br#"{"error":"duplicate_message_id","existing_sequence":null}"#);
        assert_eq!(in_flight.existing_sequence(), None);
    }

    #[test]
    fn redirect_body_gives_the_leader_address() {
        let err = ApiError::from_body(
            307,
            br#"{"error":"not_leader","message":"m","leader_id":"node-2","leader_address":"127.0.0.1:8082"}"#,
        );
        assert_eq!(err.code, ErrorCode::NotLeader);
        assert_eq!(err.leader_address(), Some("127.0.0.1:8082"));
    }

    #[test]
    fn a_body_that_is_not_json_still_gives_an_error_named_by_status() {
        let err = ApiError::from_body(502, b"<html>Bad Gateway</html>");
        assert_eq!(err.code, ErrorCode::Other("http_502".into()));
        assert_eq!(err.message, "<html>Bad Gateway</html>");
        assert_eq!(*err.details, serde_json::json!({}));
    }

    #[test]
    fn only_reachability_errors_count_as_unreachable() {
        let no_leader = Error::NoLeader { attempts: 3, elapsed: Duration::from_secs(1) };
        assert!(no_leader.is_unreachable());
        let api = Error::Api(ApiError::from_body(404, b"{}"));
        assert!(!api.is_unreachable());
        assert!(api.api().is_some());
    }
}
