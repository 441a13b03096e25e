//! Raft over WebSocket: one long-lived connection per peer, requests multiplexed by id.
//!
//! - [`codec`]: the RPC messages and their compact binary (bincode) encoding.
//! - [`network`]: the client side, openraft's `RaftNetworkFactory` over a pool of peer
//!   connections.
//! - [`server`]: the `GET /raft` handler that feeds incoming RPCs to the local Raft.
//! - [`config`]: openraft's configuration from the node's flags.
//! - [`handover`]: a stopping leader hands its leadership to an up-to-date voter.

pub mod codec;
pub mod config;
pub mod handover;
pub mod network;
pub mod server;
