//! Benchmarks of the pub/sub cluster.
//!
//! # Layout
//! - `storage.rs` (criterion): Raft log append with fsync at several batch sizes and with
//!   concurrent appenders (group commit), and state machine apply of 256-byte messages.
//! - The load benchmark against a running cluster is `pubsub bench` (client crate), driven
//!   side by side with NATS JetStream and etcd by `compare.sh`.
