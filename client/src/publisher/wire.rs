//! The frames of API.md §8, built and read without a socket (so tested alone).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{ApiError, Error, ErrorCode};
use crate::types::NewMessage;

/// `{"type":"publish","ref":R,"id":ID,"payload":P,"timestamp":T?}`.
#[derive(Serialize)]
struct PublishFrame<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(rename = "ref")]
    reference: u64,
    id: &'a str,
    payload: &'a Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    timestamp: Option<u64>,
}

/// The frame publishing `message` under `id`, answered under `reference`.
pub(super) fn publish_frame(reference: u64, id: &str, message: &NewMessage) -> Result<String, Error> {
    let frame =
        PublishFrame { kind: "publish", reference, id, payload: &message.payload, timestamp: message.timestamp };
    serde_json::to_string(&frame).map_err(|e| Error::InvalidArgument(format!("message does not serialize: {e}")))
}

/// The fields of a server frame this client reads; the rest of an error frame is read again
/// into its [`ApiError`] body.
#[derive(Deserialize)]
struct AnswerFrame {
    #[serde(rename = "type")]
    kind: String,
    /// Any JSON value: `null` answers a frame the server could not read.
    #[serde(rename = "ref", default)]
    reference: Value,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    sequence: Option<u64>,
    #[serde(default)]
    raft_index: Option<u64>,
    #[serde(default)]
    error: Option<String>,
}

/// What the server answered to one publish.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Answer {
    /// `ack`: committed on a majority and applied.
    Acked {
        /// The message id.
        id: String,
        /// Its sequence in the topic.
        sequence: u64,
        /// The Raft index of its entry.
        raft_index: u64,
    },
    /// `error`: refused, with the status the HTTP API gives the same code.
    Refused(ApiError),
    /// An answer to this publish that does not follow the contract.
    Malformed(String),
}

/// Reads one server frame: the `ref` it answers (`None` when it is not one of ours) and the
/// answer. `Err` when the frame is not JSON or has no `type`.
pub(super) fn parse_answer(text: &str) -> Result<(Option<u64>, Answer), String> {
    let frame: AnswerFrame = serde_json::from_str(text).map_err(|e| format!("frame does not parse: {e}"))?;
    let reference = frame.reference.as_u64();
    let answer = match frame.kind.as_str() {
        "ack" => match (frame.id, frame.sequence, frame.raft_index) {
            (Some(id), Some(sequence), Some(raft_index)) => Answer::Acked { id, sequence, raft_index },
            _ => Answer::Malformed(format!("ack without id, sequence or raft_index: {text}")),
        },
        "error" => {
            let status = frame.error.as_deref().map(ErrorCode::parse).map_or(500, |code| code.http_status());
            Answer::Refused(ApiError::from_body(status, text.as_bytes()))
        }
        other => Answer::Malformed(format!("unexpected frame type {other:?}")),
    };
    Ok((reference, answer))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parsed(v: Value) -> (Option<u64>, Answer) {
        match parse_answer(&v.to_string()) {
            Ok(a) => a,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn publish_frame_has_the_contract_fields_and_omits_an_absent_timestamp() {
        let frame = publish_frame(7, "m-1", &NewMessage::new(json!({"a": 1}))).unwrap_or_default();
        let v: Value = serde_json::from_str(&frame).unwrap_or_default();
        assert_eq!(v, json!({"type": "publish", "ref": 7, "id": "m-1", "payload": {"a": 1}}));
        let timed = publish_frame(8, "m-2", &NewMessage::new(json!(null)).with_timestamp(5)).unwrap_or_default();
        let v: Value = serde_json::from_str(&timed).unwrap_or_default();
        assert_eq!(v["timestamp"], 5);
        assert_eq!(v["payload"], Value::Null);
    }

    #[test]
    fn an_ack_gives_id_sequence_and_raft_index() {
        let (reference, answer) =
            parsed(json!({"type": "ack", "ref": 3, "id": "m", "sequence": 151, "raft_index": 1043}));
        assert_eq!(reference, Some(3));
        assert_eq!(answer, Answer::Acked { id: "m".into(), sequence: 151, raft_index: 1043 });
    }

    #[test]
    fn an_error_frame_gives_the_http_status_of_its_code_and_its_fields() {
        let (reference, answer) = parsed(json!({"type": "error", "ref": 4, "error": "duplicate_message_id",
            "message": "dup", "id": "m-1", "existing_sequence": 42, "details": {"existing_sequence": 42}}));
        assert_eq!(reference, Some(4));
        match answer {
            Answer::Refused(e) => {
                assert_eq!((e.status, e.code.clone()), (409, ErrorCode::DuplicateMessageId));
                assert_eq!(e.existing_sequence(), Some(42));
                assert_eq!(e.message, "dup");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn answers_that_are_not_ours_or_break_the_contract_are_told_apart() {
        let (reference, answer) = parsed(json!({"type": "error", "ref": null, "error": "invalid_request"}));
        assert_eq!(reference, None);
        assert!(matches!(answer, Answer::Refused(e) if e.status == 400));
        let (_, ack) = parsed(json!({"type": "ack", "ref": 1, "id": "m"}));
        assert!(matches!(ack, Answer::Malformed(_)));
        let (_, odd) = parsed(json!({"type": "stats", "ref": 1}));
        assert!(matches!(odd, Answer::Malformed(_)));
        assert!(parse_answer("not json").is_err());
    }
}
