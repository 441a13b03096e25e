//! How the server ends a WebSocket: its close frame, then the client's, before the socket is
//! dropped.
//!
//! A socket dropped with input left unread is reset by the kernel, not closed, and the reset
//! throws away what was still queued to send: the close frame itself, and on a busy
//! subscription the last messages before it. A client acking or publishing while the server
//! closes always has input in flight. So the server reads on after its close frame, dropping
//! what it reads (acks and publishes that came too late), until the client's close frame
//! answers, for at most [`CLOSE_HANDSHAKE_TIMEOUT`]. A stopping node waits for these
//! handshakes, within the same bound, before it exits (lib.rs).
//!
//! One case is beyond it: after a frame over the size limit, the WebSocket library reads
//! nothing more, so the rest of that frame stays unread and the connection may still be reset.

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use tokio_util::task::task_tracker::TaskTrackerToken;

use crate::limits::CLOSE_HANDSHAKE_TIMEOUT;

/// Sends the close frame `code`/`reason`, when given, and reads until the client's close frame
/// (or the connection's end), within [`CLOSE_HANDSHAKE_TIMEOUT`]. `counted` (a token of
/// [`crate::app::App::closing`]) is held until then. Without a frame of its own to send (the
/// client closed first), the read still sends the answer the WebSocket library queued.
pub async fn close(
    counted: TaskTrackerToken,
    mut sink: SplitSink<WebSocket, Message>,
    mut stream: SplitStream<WebSocket>,
    frame: Option<(u16, &'static str)>,
) {
    let handshake = async {
        if let Some((code, reason)) = frame {
            // Refused when the client closed first: the library answers its close frame
            // instead, on the read below.
            let frame = CloseFrame { code, reason: Utf8Bytes::from_static(reason) };
            let _ = sink.send(Message::Close(Some(frame))).await;
        }
        while let Some(Ok(message)) = stream.next().await {
            if let Message::Close(_) = message {
                break;
            }
        }
    };
    if tokio::time::timeout(CLOSE_HANDSHAKE_TIMEOUT, handshake).await.is_err() {
        tracing::debug!(?frame, "a client did not answer the close frame in time; dropping its connection");
    }
    drop(counted);
}
