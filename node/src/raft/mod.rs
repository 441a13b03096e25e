//! Raft over WebSocket: one long-lived connection per peer, requests multiplexed by id.
//!
//! - [`codec`]: the RPC messages and their compact binary (bincode) encoding.
//! - [`network`]: the client side, openraft's `RaftNetworkFactory` over a pool of peer
//!   connections.
//! - [`server`]: the `GET /raft` handler that feeds incoming RPCs to the local Raft.
//! - [`config`]: openraft's configuration from the node's flags.
//! - [`handover`]: a stopping leader hands its leadership to an up-to-date voter.
//! - [`joint`]: a leader finishes a joint configuration left by a leader change.

/// The header in which a dialing node presents its cluster's id (when it knows one): a node
/// that knows another id refuses the connection, so a peer address that points into another
/// cluster cannot make its leader rewrite this cluster's log.
pub const CLUSTER_ID_HEADER: &str = "x-pubsub-cluster-id";

pub mod codec;
pub mod config;
pub mod handover;
pub mod joint;
pub mod network;
pub mod server;
