//! The snapshot file: every state machine key and value, streamed.
//!
//! A snapshot is built by iterating a RocksDB point-in-time snapshot and writing each record
//! to a file, and installed by reading that file back in bounded `WriteBatch`es. Neither side
//! ever holds more than one batch in memory, so a snapshot may be as large as the disk allows;
//! openraft streams the file to followers in chunks (`snapshot_max_chunk_size`).
//!
//! Format: the magic line `PUBSUB-SNAPSHOT-1\n`, then records
//! `[cf: u8][key_len: u32 LE][key][value_len: u32 LE][value]`, then the byte `0xFF`.
//! `cf` indexes [`SM_CFS`]. Node-local keys (`snapshot_meta`, `install_pending`) are not carried.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::Path;

use rocksdb::{IteratorMode, ReadOptions, WriteBatch, DB};

use crate::db::{cf, synced, unsynced};
use crate::keys::{
    DISK_SHORT, INSTALL_PENDING, KEY_MAX, LAST_APPLIED, MEMBERSHIP, NEXT_TOPIC_ID, SM_CFS, SNAPSHOT_META,
};
use crate::limits::{SNAPSHOT_INSTALL_BATCH_BYTES_MAX, SNAPSHOT_INSTALL_BATCH_RECORDS};
use crate::typ::{LogId, SnapshotMeta, StoredMembership};
use crate::StoreError;

const MAGIC: &[u8] = b"PUBSUB-SNAPSHOT-1\n";
const END: u8 = 0xFF;
/// Largest key or value a snapshot record may hold: a message is at most 1 MiB of payload
/// plus its id; anything larger is corruption.
const RECORD_BYTES_MAX: u32 = 8 * 1024 * 1024;

/// Writes the state machine as of now to `path` (fsynced). Returns the applied log id and
/// membership the file describes, read from the same point-in-time view as the data.
pub fn write(db: &DB, path: &Path) -> Result<(Option<LogId>, StoredMembership), StoreError> {
    let snap = db.snapshot();
    let meta_cf = cf(db, SM_CFS[0])?;
    let last_applied: Option<LogId> = match snap.get_cf(meta_cf, LAST_APPLIED)? {
        Some(bytes) => bincode::deserialize(&bytes).map_err(StoreError::decode("last_applied"))?,
        None => None,
    };
    let membership: StoredMembership = match snap.get_cf(meta_cf, MEMBERSHIP)? {
        Some(bytes) => bincode::deserialize(&bytes).map_err(StoreError::decode("membership"))?,
        None => StoredMembership::default(),
    };

    let file = File::create(path)?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    out.write_all(MAGIC)?;
    for (index, name) in SM_CFS.iter().enumerate() {
        let mut opts = ReadOptions::default();
        opts.set_snapshot(&snap);
        // A full scan: do not evict the hot tails of topics from the block cache for it.
        opts.fill_cache(false);
        for item in db.iterator_cf_opt(cf(db, name)?, opts, IteratorMode::Start) {
            let (key, value) = item?;
            if index == 0 && (&*key == SNAPSHOT_META || &*key == INSTALL_PENDING) {
                continue;
            }
            out.write_all(&[index as u8])?;
            out.write_all(&(key.len() as u32).to_le_bytes())?;
            out.write_all(&key)?;
            out.write_all(&(value.len() as u32).to_le_bytes())?;
            out.write_all(&value)?;
        }
    }
    out.write_all(&[END])?;
    let file = out.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    Ok((last_applied, membership))
}

/// What is recorded before an install starts, so a crash mid-install is redone on restart.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct PendingInstall {
    pub file_name: String,
    pub meta: SnapshotMeta,
}

/// Copies received snapshot data to `target` and fsyncs it, reading it through on the way:
/// an error, and no `target` left, unless the data is exactly a magic line, whole records and
/// the end byte. So a malformed snapshot (cut short, a hole in it, bytes after the end) is
/// refused before the install changes anything, instead of failing half-way through it and
/// again at every restart, which redoes it from the same file.
pub fn copy_checked(source: &mut File, target: &Path) -> Result<(), StoreError> {
    let mut copy = || -> Result<(), StoreError> {
        source.seek(SeekFrom::Start(0))?;
        let mut out = BufWriter::with_capacity(1 << 20, File::create(target)?);
        read_records(Tee { from: &mut *source, to: &mut out }, target, |_, _, _| Ok(()))?;
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        Ok(())
    };
    let copied = copy();
    if copied.is_err() {
        let _ = std::fs::remove_file(target);
    }
    copied
}

/// Reads from `from` and writes everything it read to `to`.
struct Tee<R, W> {
    from: R,
    to: W,
}

impl<R: Read, W: Write> Read for Tee<R, W> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.from.read(buf)?;
        self.to.write_all(&buf[..n])?;
        Ok(n)
    }
}

/// Replaces the state machine with the snapshot in `path` (written by [`copy_checked`] or a
/// build).
///
/// # Correctness
/// The install is marked pending (fsynced) before anything is deleted, and the marker is
/// removed in the same fsynced batch that writes the new `last_applied`. A crash in between
/// leaves the marker, and [`crate::StateMachine::open`] runs the install again from the file.
pub fn install(db: &DB, path: &Path, meta: &SnapshotMeta) -> Result<(), StoreError> {
    let meta_cf = cf(db, SM_CFS[0])?;
    let pending = PendingInstall {
        file_name: path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        meta: meta.clone(),
    };
    let pending = bincode::serialize(&pending).map_err(StoreError::decode("pending install"))?;
    db.put_cf_opt(meta_cf, INSTALL_PENDING, pending, &synced())?;
    install_pending(db, path, meta)
}

/// Whether an install's batch of `records` in `bytes` is written now.
fn install_batch_is_full(records: usize, bytes: usize) -> bool {
    records >= SNAPSHOT_INSTALL_BATCH_RECORDS || bytes >= SNAPSHOT_INSTALL_BATCH_BYTES_MAX
}

/// The part of [`install`] that is redone after a crash.
pub fn install_pending(db: &DB, path: &Path, meta: &SnapshotMeta) -> Result<(), StoreError> {
    let meta_cf = cf(db, SM_CFS[0])?;
    let mut clear = WriteBatch::default();
    for key in [LAST_APPLIED, MEMBERSHIP, NEXT_TOPIC_ID, DISK_SHORT] {
        clear.delete_cf(meta_cf, key);
    }
    for name in &SM_CFS[1..] {
        clear.delete_range_cf(cf(db, name)?, [].as_slice(), KEY_MAX.as_slice());
    }
    db.write_opt(clear, &unsynced())?;

    let mut batch = WriteBatch::default();
    read_records(File::open(path)?, path, |name, key, value| {
        if name == SM_CFS[0] && (key == SNAPSHOT_META || key == INSTALL_PENDING) {
            return Ok(());
        }
        batch.put_cf(cf(db, name)?, key, value);
        if install_batch_is_full(batch.len(), batch.size_in_bytes()) {
            db.write_opt(std::mem::take(&mut batch), &unsynced())?;
        }
        Ok(())
    })?;
    batch.put_cf(meta_cf, LAST_APPLIED, encode(&meta.last_log_id)?);
    batch.put_cf(meta_cf, MEMBERSHIP, encode(&meta.last_membership)?);
    batch.put_cf(meta_cf, SNAPSHOT_META, encode(meta)?);
    batch.delete_cf(meta_cf, INSTALL_PENDING);
    db.write_opt(batch, &synced())?;
    Ok(())
}

/// Reads snapshot data (of the file at `path`, named in errors) to its end, handing each record
/// (column family, key, value) to `each`; an error when it is not exactly a magic line, whole
/// records and the end byte.
fn read_records(
    input: impl Read,
    path: &Path,
    mut each: impl FnMut(&str, Vec<u8>, Vec<u8>) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let corrupt = |what: String| StoreError::Corrupt(format!("snapshot file {}: {what}", path.display()));
    let mut input = BufReader::with_capacity(1 << 20, input);
    let mut magic = [0u8; MAGIC.len()];
    input.read_exact(&mut magic).map_err(|_| corrupt("shorter than its magic line".into()))?;
    if magic != MAGIC {
        return Err(corrupt("not a snapshot file".into()));
    }
    loop {
        let mut tag = [0u8; 1];
        input.read_exact(&mut tag).map_err(|_| corrupt("cut short before its end byte".into()))?;
        if tag[0] == END {
            break;
        }
        let name =
            SM_CFS.get(tag[0] as usize).ok_or_else(|| corrupt(format!("a record for column family {}", tag[0])))?;
        let key = read_field(&mut input).map_err(|e| corrupt(format!("a record's key: {e}")))?;
        let value = read_field(&mut input).map_err(|e| corrupt(format!("a record's value: {e}")))?;
        each(name, key, value)?;
    }
    if input.read(&mut [0u8; 1])? != 0 {
        return Err(corrupt("bytes after its end byte".into()));
    }
    Ok(())
}

fn read_field(input: &mut impl Read) -> Result<Vec<u8>, StoreError> {
    let mut len = [0u8; 4];
    input.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len);
    if len > RECORD_BYTES_MAX {
        return Err(StoreError::Corrupt(format!("snapshot record of {len} bytes")));
    }
    let mut buf = vec![0u8; len as usize];
    input.read_exact(&mut buf)?;
    Ok(buf)
}

/// bincode for the few meta values written here.
pub(crate) fn encode<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, StoreError> {
    bincode::serialize(value).map_err(StoreError::decode("meta"))
}

/// Snapshot data as openraft sees it: a file read and written with plain blocking calls.
///
/// openraft streams snapshot chunks through `AsyncRead`/`AsyncWrite`/`AsyncSeek`. Local file
/// I/O of one chunk takes microseconds to a few milliseconds, like a RocksDB call, so it is
/// done in place instead of on tokio's blocking pool (which `tokio::fs::File` uses): that keeps
/// every store operation on the calling task, which is also what lets the simulation replay a
/// seed exactly.
#[derive(Debug)]
pub struct SnapshotFile(pub File);

impl tokio::io::AsyncRead for SnapshotFile {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let n = self.0.read(buf.initialize_unfilled())?;
        buf.advance(n);
        std::task::Poll::Ready(Ok(()))
    }
}

impl tokio::io::AsyncWrite for SnapshotFile {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::task::Poll::Ready(self.0.write(buf))
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(self.0.flush())
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

impl tokio::io::AsyncSeek for SnapshotFile {
    fn start_seek(mut self: std::pin::Pin<&mut Self>, position: std::io::SeekFrom) -> std::io::Result<()> {
        std::io::Seek::seek(&mut self.0, position).map(|_| ())
    }

    fn poll_complete(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<u64>> {
        std::task::Poll::Ready(std::io::Seek::stream_position(&mut self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::install_batch_is_full;

    #[test]
    fn an_install_batch_of_large_messages_is_written_by_its_bytes_not_its_count() {
        let megabyte = 1024 * 1024;
        assert!(!install_batch_is_full(31, 31 * megabyte));
        assert!(install_batch_is_full(32, 32 * megabyte), "32 messages of 1 MiB, not 4096");
        assert!(!install_batch_is_full(4095, 4095 * 100));
        assert!(install_batch_is_full(4096, 4096 * 100));
    }
}
