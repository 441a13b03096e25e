//! openraft's own storage conformance suite, run against our RocksDB store.

use openraft::testing::{StoreBuilder, Suite};
use raft_store::typ::StorageError;
use raft_store::{LogStore, StateMachine, TypeConfig};
use tempfile::TempDir;

struct RocksBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, TempDir> for RocksBuilder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachine), StorageError> {
        let dir = TempDir::new().map_err(raft_store::error::write_err)?;
        let store = raft_store::open(dir.path()).map_err(raft_store::error::write_err)?;
        Ok((dir, store.log_store, store.state_machine))
    }
}

#[test]
fn openraft_storage_suite_passes() {
    Suite::test_all(RocksBuilder).expect("storage suite");
}
