//! Opening RocksDB with the column families and options the store relies on.

use std::path::Path;

use rocksdb::{BlockBasedOptions, Cache, ColumnFamilyDescriptor, DBCompressionType, Options, WriteOptions, DB};

use crate::keys::{ALL_CFS, CF_DEDUP, CF_LOG, SM_CFS};
use crate::StoreError;

/// Memory for all memtables together: bounds the node's write buffering whatever the number
/// of column families. With the block cache below, what a node holds stays under 200 MiB
/// resident with 1,000,000 messages (194 MiB on the leader right after a 72k msgs/s load;
/// 64 MiB each gave 236 MiB at the same throughput).
const MEMTABLES_BYTES_MAX: usize = 32 * 1024 * 1024;
/// Block cache shared by every column family (hot tails of topics are read from here).
const BLOCK_CACHE_BYTES: usize = 32 * 1024 * 1024;
/// WAL kept before RocksDB flushes the column families holding it back: bounds replay time
/// on restart.
const WAL_BYTES_MAX: u64 = 64 * 1024 * 1024;
/// Share of the dedup memtable spent on a whole-key bloom filter. Every publish looks its id
/// up in the dedup index and almost always misses; without the filter each miss walks the
/// memtable's skiplist (the top of the apply profile).
const DEDUP_MEMTABLE_BLOOM_RATIO: f64 = 0.1;

pub fn open(path: &Path) -> Result<DB, StoreError> {
    crate::segments::create_dir_durably(path)?;
    // Closing flushes nothing: a clean stop flushes the state machine itself (when it is
    // dropped after `Closed::stop_cleanly`), and a crash cannot. A closing
    // flush would make a crashed node in the simulation (whose store is dropped, not killed)
    // keep applies that a killed process loses, and never redo them from the log. The crate
    // has no setter for this option: it is given by name.
    let mut db_opts = Options::default().get_options_from_string("avoid_flush_during_shutdown=true")?;
    db_opts.create_if_missing(true);
    db_opts.create_missing_column_families(true);
    db_opts.set_db_write_buffer_size(MEMTABLES_BYTES_MAX);
    db_opts.set_max_total_wal_size(WAL_BYTES_MAX);
    db_opts.set_max_background_jobs(2);
    // Recovery after a crash stops at the first corrupt WAL record instead of refusing to
    // open: a torn tail write is expected after power loss, and anything after it was never
    // acknowledged (it was not fsynced).
    db_opts.set_wal_recovery_mode(rocksdb::DBRecoveryMode::PointInTime);
    // State machine writes skip the WAL (`unlogged`): flushing every column family at one
    // point keeps what survives a crash a consistent prefix of applies across them.
    db_opts.set_atomic_flush(true);

    let cache = Cache::new_lru_cache(BLOCK_CACHE_BYTES);
    let cfs = ALL_CFS.iter().map(|name| {
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&cache);
        table.set_bloom_filter(10.0, false);
        let mut opts = Options::default();
        opts.set_block_based_table_factory(&table);
        // Not the log (legacy: only data directories of earlier builds hold entries there,
        // moved out on open): LZ4 cost batches of text payloads 10 % and of random ones 6 %,
        // more CPU than the smaller flushes saved (docs/BENCHMARKS.md, "Tried and not kept").
        let compression = if *name == CF_LOG { DBCompressionType::None } else { DBCompressionType::Lz4 };
        opts.set_compression_type(compression);
        if *name == CF_DEDUP {
            opts.set_memtable_whole_key_filtering(true);
            opts.set_memtable_prefix_bloom_ratio(DEDUP_MEMTABLE_BLOOM_RATIO);
            opts.set_compaction_style(rocksdb::DBCompactionStyle::Universal);
            opts.set_compression_type(DBCompressionType::None);
        }
        ColumnFamilyDescriptor::new(*name, opts)
    });
    let db = DB::open_cf_descriptors(&db_opts, path, cfs)?;
    // Time-ordered ids (the Rust client's UUID v7) give runs of the dedup index that do not
    // overlap: universal compaction may then move them instead of rewriting them. The crate
    // does not expose this option, so it is set by name once open.
    db.set_options_cf(cf(&db, CF_DEDUP)?, &[("compaction_options_universal", "{allow_trivial_move=true}")])?;
    Ok(db)
}

/// A write that returns only once it is on disk (WAL fsynced).
pub fn synced() -> WriteOptions {
    let mut opts = WriteOptions::default();
    opts.set_sync(true);
    opts
}

/// A write that reaches RocksDB's WAL in the OS page cache but is not fsynced: used where
/// losing it is repaired on restart (a purge that deletes no file is redone, a snapshot
/// install is redone from its marker, a lost `committed` is learned again from the leader).
pub fn unsynced() -> WriteOptions {
    let mut opts = WriteOptions::default();
    opts.set_sync(false);
    opts
}

/// A write that skips the WAL: it reaches disk only when its memtable is flushed. Used for
/// state machine applies, which openraft redoes from the fsynced log after a crash; with
/// atomic flush the state that survives is the one after some earlier apply, whole. RocksDB
/// refuses such writes when it recycles WAL files (`recycle_log_file_num`), so it must not.
pub fn unlogged() -> WriteOptions {
    let mut opts = WriteOptions::default();
    opts.disable_wal(true);
    opts
}

/// Flushes the state machine's column families (atomically, see `open`) and waits: every
/// apply made before the call is then on disk, so log entries it covers may be purged.
pub fn flush_state_machine(db: &DB) -> Result<(), StoreError> {
    let cfs = SM_CFS.iter().map(|name| cf(db, name)).collect::<Result<Vec<_>, _>>()?;
    let mut opts = rocksdb::FlushOptions::default();
    opts.set_wait(true);
    db.flush_cfs_opt(&cfs, &opts)?;
    Ok(())
}

pub fn cf<'a>(db: &'a DB, name: &str) -> Result<&'a rocksdb::ColumnFamily, StoreError> {
    db.cf_handle(name).ok_or_else(|| StoreError::Corrupt(format!("missing column family {name}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Data directories written before the dedup index moved to universal compaction held
    /// it in leveled SST files (compacted to the last level): they must open and read back.
    #[test]
    fn a_dedup_index_written_with_leveled_compaction_opens_and_reads() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut db_opts = Options::default();
            db_opts.create_if_missing(true);
            db_opts.create_missing_column_families(true);
            let cfs = ALL_CFS.iter().map(|name| ColumnFamilyDescriptor::new(*name, Options::default()));
            let db = DB::open_cf_descriptors(&db_opts, dir.path(), cfs).unwrap();
            let dedup = cf(&db, CF_DEDUP).unwrap();
            for i in 0..1000u64 {
                db.put_cf(dedup, format!("id-{i}"), i.to_be_bytes()).unwrap();
            }
            db.flush_cf(dedup).unwrap();
            db.compact_range_cf(dedup, None::<&[u8]>, None::<&[u8]>);
        }
        let db = open(dir.path()).unwrap();
        let dedup = cf(&db, CF_DEDUP).unwrap();
        assert_eq!(db.get_cf(dedup, "id-7").unwrap().as_deref(), Some(&7u64.to_be_bytes()[..]));
        for i in 1000..2000u64 {
            db.put_cf(dedup, format!("id-{i}"), i.to_be_bytes()).unwrap();
        }
        db.flush_cf(dedup).unwrap();
        db.compact_range_cf(dedup, None::<&[u8]>, None::<&[u8]>);
        assert_eq!(db.get_cf(dedup, "id-1999").unwrap().as_deref(), Some(&1999u64.to_be_bytes()[..]));
        assert_eq!(db.get_cf(dedup, "id-0").unwrap().as_deref(), Some(&0u64.to_be_bytes()[..]));
    }

    /// RocksDB records the options in force in its newest OPTIONS file, one section per
    /// column family (the database's own section for `""`).
    fn options_section(dir: &Path, cf_name: &str) -> String {
        let newest = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("OPTIONS-"))
            .max_by_key(|p| {
                p.file_name().unwrap().to_string_lossy().trim_start_matches("OPTIONS-").parse::<u64>().unwrap()
            })
            .unwrap();
        let text = std::fs::read_to_string(newest).unwrap();
        let header = if cf_name.is_empty() { "[DBOptions]".to_string() } else { format!("[CFOptions \"{cf_name}\"]") };
        let section = &text[text.find(&header).unwrap() + header.len()..];
        section[..section.find("\n[").unwrap_or(section.len())].to_string()
    }

    #[test]
    fn closing_the_database_flushes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let _db = open(dir.path()).unwrap();
        let db_options = options_section(dir.path(), "");
        assert!(db_options.contains("avoid_flush_during_shutdown=true"), "{db_options}");
        assert!(db_options.contains("atomic_flush=true"), "the other options are kept: {db_options}");
    }

    #[test]
    fn only_the_dedup_index_moves_non_overlapping_runs_instead_of_rewriting_them() {
        let dir = tempfile::tempdir().unwrap();
        let _db = open(dir.path()).unwrap();
        let dedup = options_section(dir.path(), CF_DEDUP);
        assert!(dedup.contains("compaction_style=kCompactionStyleUniversal"), "{dedup}");
        assert!(dedup.contains("allow_trivial_move=true"), "{dedup}");
        assert!(!options_section(dir.path(), CF_LOG).contains("allow_trivial_move=true"));
    }
}
