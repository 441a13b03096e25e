//! Client library and command-line tool for the Raft-replicated pub/sub cluster.
//!
//! The library speaks the HTTP/WebSocket contract of `API.md`: a [`Client`] finds the
//! leader, follows redirects and retries writes with the same message id (so a retry never
//! publishes twice); a [`Subscription`] is a [`futures_util::Stream`] of [`Event`]s that
//! reconnects to any node and resumes from the last delivered sequence with no gap and no
//! duplicate.
//!
//! ```no_run
//! use futures_util::StreamExt;
//! use pubsub_client::{Client, Event, SubscribeOptions};
//! use serde_json::json;
//!
//! # async fn run() -> Result<(), pubsub_client::Error> {
//! let client = Client::new(["127.0.0.1:8081", "127.0.0.1:8082", "127.0.0.1:8083"])?;
//! client.create_topic("orders", None).await?;
//! let mut sub = client.subscribe("orders", SubscribeOptions::new("audit")).await?;
//! client.publish("orders", json!({"order_id": "ORD-456"})).await?;
//! if let Some(Ok(Event::Message(m))) = sub.next().await {
//!     sub.ack(m.sequence);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Layout
//!
//! - [`client`]: [`Client`], [`ClientBuilder`], [`ClientConfig`]: one method per HTTP
//!   endpoint; its retry loop (leader discovery, redirects, backoff) is `client/call.rs`, the
//!   node list and leader cache `client/nodes.rs`.
//! - [`subscription`]: [`Subscription`], [`Acker`], [`Event`], [`SubscribeOptions`]: the
//!   WebSocket stream and its reconnect task; the pure resume and dedup rules are
//!   `subscription/tracker.rs`.
//! - [`publisher`]: [`Publisher`], many publishes in flight on one WebSocket to the leader
//!   (API.md §8); opening it is `publisher/connect.rs`, its two tasks and the map of waiting
//!   publishes `publisher/connection.rs`, the frames `publisher/wire.rs`.
//! - [`endpoint`]: node addresses, URLs of the contract, [`Cursor`].
//! - [`retry`]: [`RetryPolicy`], backoff with jitter, what each answer means for a retry.
//! - [`types`]: wire types (request and response bodies, frames).
//! - [`error`]: [`Error`], [`ApiError`], [`ErrorCode`].
//! - [`limits`]: named limits and defaults with their reasons.
//! - [`bench`](mod@bench): the load generator behind `pubsub bench`.
//! - [`cli`]: the `pubsub` command-line tool (`src/main.rs` only calls [`cli::main`]).

pub mod bench;
pub mod cli;
pub mod client;
pub mod endpoint;
pub mod error;
pub mod limits;
pub mod publisher;
pub mod retry;
pub mod subscription;
pub mod types;

#[cfg(test)]
mod test_support;

pub use client::{Client, ClientBuilder, ClientConfig, ReadOptions};
pub use endpoint::Cursor;
pub use error::{ApiError, Error, ErrorCode};
pub use publisher::Publisher;
pub use retry::RetryPolicy;
pub use subscription::{Acker, Event, SubscribeOptions, Subscription};
pub use types::{
    AckMode, BatchAck, BatchItem, ClusterInfo, CreateTopicAck, DeleteTopicAck, ForgottenCursor, Member, Membership,
    Message, MessagePage, NewMessage, PublishAck, SubscriberInfo, TopicInfo, TopicSummary,
};
