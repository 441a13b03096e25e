//! openraft's own storage conformance suite, run against our RocksDB store: as a store that
//! has not been told its node id (every append through the syncer thread), as node 1 (the
//! suite's entries of other leaders fsynced inline, its own through the syncer), and as a node
//! that leads none of them (every append fsynced inline).

use openraft::testing::{StoreBuilder, Suite};
use raft_store::typ::StorageError;
use raft_store::{LogStore, NodeId, StateMachine, TypeConfig};
use tempfile::TempDir;

struct RocksBuilder {
    node_id: Option<NodeId>,
}

impl StoreBuilder<TypeConfig, LogStore, StateMachine, TempDir> for RocksBuilder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachine), StorageError> {
        let dir = TempDir::new().map_err(raft_store::error::write_err)?;
        let store = raft_store::open(dir.path()).map_err(raft_store::error::write_err)?;
        if let Some(id) = self.node_id {
            store.log_store.set_node_id(id).unwrap();
        }
        Ok((dir, store.log_store, store.state_machine))
    }
}

#[test]
fn openraft_storage_suite_passes() {
    Suite::test_all(RocksBuilder { node_id: None }).expect("storage suite");
}

#[test]
fn openraft_storage_suite_passes_as_node_1() {
    Suite::test_all(RocksBuilder { node_id: Some(1) }).expect("storage suite as node 1");
}

#[test]
fn openraft_storage_suite_passes_following_every_leader() {
    Suite::test_all(RocksBuilder { node_id: Some(NodeId::MAX) }).expect("storage suite as a follower");
}
