//! WebSocket subscriptions.
//!
//! - [`session`]: one subscription: replay from storage, then live, one loop for both.
//! - [`frames`]: the JSON frames sent to subscribers.
//! - [`cache`]: serialized frames shared by all subscribers of a topic.
//! - [`acks`]: subscriber acks, coalesced and written through Raft periodically.

pub mod acks;
pub mod cache;
pub mod frames;
pub mod session;
