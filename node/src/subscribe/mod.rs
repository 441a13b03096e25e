//! WebSocket subscriptions.
//!
//! - [`session`]: one subscription: replay from storage, then live, one loop for both.
//! - [`frames`]: the JSON frames sent to subscribers.
//! - [`cache`]: serialized frames shared by all subscribers of a topic.
//! - [`acks`]: subscriber acks, coalesced and written through Raft periodically.
//! - [`leaderless`]: a node without a leader for long closes its subscriptions (1013).

pub mod acks;
pub mod cache;
pub mod frames;
pub mod leaderless;
pub mod session;
