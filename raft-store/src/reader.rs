//! The read side of the state machine: what the HTTP API and subscriptions serve from.
//!
//! Every read is from applied (committed) state, so any node answers the same for the same
//! applied index. Topic records come from memory; messages, dedup and cursors from RocksDB
//! through bounded iterators (never a full scan).

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock, RwLock};

use bytes::Bytes;
use rocksdb::{Direction, IteratorMode, DB};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::command::TopicRecord;
use crate::db::cf;
use crate::feeds::{Feeds, TopicSignal, TopicWatch};
use crate::keys::{decode_u64, message_key, topic_scoped_key, CF_CURSORS, CF_DEDUP, CF_MESSAGES, SM_CFS};
use crate::limits::{READ_BYTES_MAX, READ_MESSAGES_MAX};
use crate::rules::{MessageMeta, Topics};
use crate::StoreError;

/// A message as stored (and as read back).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredMessage {
    pub id: String,
    /// The client's timestamp (or the leader's clock when the client gave none).
    pub timestamp: u64,
    /// The leader's clock when the message was proposed: what retention compares.
    pub stored_at: u64,
    /// Compact JSON text.
    pub payload: Bytes,
}

impl StoredMessage {
    pub fn encode(&self) -> Vec<u8> {
        // Serializing plain owned data into a Vec cannot fail.
        bincode::serialize(self).unwrap_or_default()
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, StoreError> {
        bincode::deserialize(bytes).map_err(StoreError::decode("message"))
    }

    /// What retention needs of an encoded message, without copying its payload (up to 1 MiB):
    /// the fields before the payload and the payload's length prefix, which bincode writes
    /// in this order.
    pub fn decode_meta(bytes: &[u8]) -> Result<MessageMeta, StoreError> {
        #[derive(Deserialize)]
        struct Head {
            id: String,
            _timestamp: u64,
            stored_at: u64,
            payload_len: u64,
        }
        let head: Head = bincode::deserialize(bytes).map_err(StoreError::decode("message"))?;
        Ok(MessageMeta { id: head.id, payload_bytes: head.payload_len, stored_at: head.stored_at })
    }
}

/// Cheap-to-clone read handle over the state machine.
#[derive(Clone)]
pub struct StoreReader {
    pub(crate) db: Arc<DB>,
    pub(crate) topics: Arc<RwLock<Topics>>,
    pub(crate) feeds: Arc<Feeds>,
    /// Odd while a snapshot install runs; raised at its start and end.
    pub(crate) installs: Arc<std::sync::atomic::AtomicU64>,
    /// Set by the state machine once the cluster's id is applied; never changes after.
    pub(crate) cluster_id: Arc<OnceLock<String>>,
    /// Set by the state machine after each apply: how many nodes claim to be short of disk.
    pub(crate) disk_short_count: Arc<std::sync::atomic::AtomicUsize>,
}

impl StoreReader {
    /// True while a snapshot install rewrites the state: a recorded cursor may be missing
    /// then, and topics and messages may be older or fewer than what this node had.
    pub fn installing(&self) -> bool {
        self.installs.load(std::sync::atomic::Ordering::SeqCst) % 2 == 1
    }

    /// Runs `read` of what an install clears and writes back, and refuses its result when an
    /// install ran at any moment of it ([`StoreError::Installing`]).
    fn outside_installs<T>(&self, read: impl FnOnce() -> Result<T, StoreError>) -> Result<T, StoreError> {
        let before = self.installs.load(std::sync::atomic::Ordering::SeqCst);
        if before % 2 == 1 {
            return Err(StoreError::Installing);
        }
        let value = read()?;
        if self.installs.load(std::sync::atomic::Ordering::SeqCst) != before {
            return Err(StoreError::Installing);
        }
        Ok(value)
    }

    /// The cluster's id, once one is applied (`Request::SetClusterId`). Takes no lock.
    pub fn cluster_id(&self) -> Option<&str> {
        self.cluster_id.get().map(String::as_str)
    }

    /// Whether any node claims to be short of disk room (`Request::SetDiskShort`). Takes no lock.
    pub fn any_disk_short(&self) -> bool {
        self.disk_short_count.load(std::sync::atomic::Ordering::Relaxed) > 0
    }

    /// The nodes that claim to be short of disk room, each with the stamp (its own clock, ms)
    /// of its latest claim.
    pub fn disk_short_claims(&self) -> BTreeMap<u64, u64> {
        self.topics.read().unwrap_or_else(|e| e.into_inner()).disk_short.clone()
    }

    /// When node `id` last said it is short of disk room, if it has not said since that it
    /// has room again.
    pub fn disk_short_claim(&self, id: u64) -> Option<u64> {
        self.topics.read().unwrap_or_else(|e| e.into_inner()).disk_short.get(&id).copied()
    }

    /// Recorded cursors of a topic (by its id), as the state machine counts them.
    pub fn cursor_count(&self, topic_id: u64) -> u64 {
        self.topics.read().unwrap_or_else(|e| e.into_inner()).cursor_counts.get(&topic_id).copied().unwrap_or(0)
    }

    /// A topic's record, including deleted ones (check `deleted`).
    pub fn topic(&self, name: &str) -> Option<TopicRecord> {
        self.topics.read().unwrap_or_else(|e| e.into_inner()).by_name.get(name).cloned()
    }

    /// Bytes of table files on disk per column family of the state machine, from RocksDB's
    /// own accounting (what memtables hold is not on disk yet).
    pub fn table_file_bytes(&self) -> Vec<(&'static str, u64)> {
        SM_CFS
            .iter()
            .filter_map(|name| {
                let family = cf(&self.db, name).ok()?;
                let bytes = self.db.property_int_value_cf(family, "rocksdb.total-sst-files-size").ok()??;
                Some((*name, bytes))
            })
            .collect()
    }

    /// Whether any topic record, deleted ones included, satisfies `pred` (nothing copied).
    pub fn any_topic(&self, pred: impl Fn(&TopicRecord) -> bool) -> bool {
        self.topics.read().unwrap_or_else(|e| e.into_inner()).by_name.values().any(pred)
    }

    /// Each active topic's name and current sequence, in no order: the least a metrics scrape
    /// needs, read without copying records or sorting under the lock every apply waits for.
    pub fn active_topic_sequences(&self) -> Vec<(String, u64)> {
        let topics = self.topics.read().unwrap_or_else(|e| e.into_inner());
        topics.by_name.values().filter(|r| !r.deleted).map(|r| (r.name.clone(), r.current_sequence)).collect()
    }

    /// At most `limit` active topic records named after `after` (from the first when `None`),
    /// sorted by name, and whether more follow. Only the records returned are copied.
    pub fn active_topics_page(&self, after: Option<&str>, limit: usize) -> (Vec<TopicRecord>, bool) {
        let topics = self.topics.read().unwrap_or_else(|e| e.into_inner());
        let mut list: Vec<&TopicRecord> =
            topics.by_name.values().filter(|r| !r.deleted && after.is_none_or(|a| r.name.as_str() > a)).collect();
        // Under the lock apply writes through: pick the page's names in linear time, and sort
        // only those, not every topic of the cluster (up to 100,000) for each page.
        let by_name = |a: &&TopicRecord, b: &&TopicRecord| a.name.cmp(&b.name);
        let more = list.len() > limit;
        if more {
            list.select_nth_unstable_by(limit, by_name);
            list.truncate(limit);
        }
        list.sort_unstable_by(by_name);
        (list.into_iter().cloned().collect(), more)
    }

    /// Number of topic records (active and deleted).
    pub fn topic_count(&self) -> usize {
        self.topics.read().unwrap_or_else(|e| e.into_inner()).by_name.len()
    }

    /// [`StoreReader::read_messages`] for a client's read: [`StoreError::Installing`] when a
    /// snapshot install ran at any moment of it, since the page may then lack messages the
    /// topic has (an install clears them before it writes them back), and a client would take
    /// an empty page for "nothing new".
    pub fn read_messages_settled(
        &self,
        topic_id: u64,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, StoredMessage)>, StoreError> {
        self.outside_installs(|| self.read_messages(topic_id, after, limit))
    }

    /// Messages of `topic_id` with `sequence > after`, in order, at most `limit` (and at
    /// most [`READ_MESSAGES_MAX`] / about [`READ_BYTES_MAX`] of payload).
    pub fn read_messages(
        &self,
        topic_id: u64,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, StoredMessage)>, StoreError> {
        self.read_messages_within(topic_id, after, limit, READ_BYTES_MAX)
    }

    /// [`StoreReader::read_messages`] stopping once `bytes_max` bytes of payload are read
    /// (at most [`READ_BYTES_MAX`]; the message that crosses it is included, so a page always
    /// makes progress).
    pub fn read_messages_within(
        &self,
        topic_id: u64,
        after: u64,
        limit: usize,
        bytes_max: usize,
    ) -> Result<Vec<(u64, StoredMessage)>, StoreError> {
        let limit = limit.min(READ_MESSAGES_MAX);
        let bytes_max = bytes_max.min(READ_BYTES_MAX);
        let mut out = Vec::with_capacity(limit.min(64));
        if limit == 0 || after == u64::MAX {
            return Ok(out);
        }
        let start = message_key(topic_id, after + 1);
        let iter = self.db.iterator_cf(cf(&self.db, CF_MESSAGES)?, IteratorMode::From(&start, Direction::Forward));
        let mut bytes = 0usize;
        for item in iter {
            let (key, value) = item?;
            if key.len() != 16 || decode_u64(&key[..8]) != Some(topic_id) {
                break;
            }
            let sequence = decode_u64(&key[8..]).ok_or_else(|| StoreError::Corrupt("message key".into()))?;
            let message = StoredMessage::decode(&value)?;
            bytes += message.payload.len();
            out.push((sequence, message));
            if out.len() >= limit || bytes >= bytes_max {
                break;
            }
        }
        Ok(out)
    }

    /// The sequence a message id was stored with, while it is retained.
    pub fn dedup(&self, topic_id: u64, id: &str) -> Result<Option<u64>, StoreError> {
        let value = self.db.get_cf(cf(&self.db, CF_DEDUP)?, topic_scoped_key(topic_id, id))?;
        Ok(value.as_deref().and_then(decode_u64))
    }

    /// A subscriber's acknowledged sequence on a topic.
    ///
    /// [`StoreError::Installing`] while a snapshot install rewrites the cursors: read then, a
    /// cursor could be missing, and a subscriber resuming from it get its whole topic again.
    pub fn cursor(&self, topic_id: u64, subscriber_id: &str) -> Result<Option<u64>, StoreError> {
        self.outside_installs(|| {
            let value = self.db.get_cf(cf(&self.db, CF_CURSORS)?, topic_scoped_key(topic_id, subscriber_id))?;
            Ok(value.as_deref().and_then(decode_u64))
        })
    }

    /// Recorded cursors of a topic, by subscriber id, at most `limit`.
    /// [`StoreError::Installing`] while a snapshot install rewrites them.
    pub fn cursors(&self, topic_id: u64, limit: usize) -> Result<Vec<(String, u64)>, StoreError> {
        self.outside_installs(|| {
            let prefix = topic_id.to_be_bytes();
            let iter = self.db.iterator_cf(cf(&self.db, CF_CURSORS)?, IteratorMode::From(&prefix, Direction::Forward));
            let mut out = Vec::new();
            for item in iter {
                let (key, value) = item?;
                if !key.starts_with(&prefix) || out.len() >= limit {
                    break;
                }
                let subscriber = String::from_utf8_lossy(&key[8..]).into_owned();
                out.push((subscriber, decode_u64(&value).unwrap_or(0)));
            }
            Ok(out)
        })
    }

    /// Watches a topic: wakes on every applied change to it (publish, trim, delete, revive).
    pub fn watch_topic(&self, topic: &str) -> watch::Receiver<TopicSignal> {
        self.feeds.watch_topic(&self.topics, topic)
    }

    /// [`StoreReader::watch_topic`], with the topic's record and signal as of the same moment.
    pub fn watch_topic_with_record(&self, topic: &str) -> TopicWatch {
        self.feeds.watch_topic_with_record(&self.topics, topic)
    }

    /// Watches the index of the last applied log entry.
    pub fn watch_applied(&self) -> watch::Receiver<u64> {
        self.feeds.watch_applied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_read_during_an_install_is_refused_not_answered_short() {
        use std::sync::atomic::Ordering::SeqCst;
        let dir = tempfile::tempdir().unwrap();
        let store = crate::open(dir.path()).unwrap();
        store.reader.installs.fetch_add(1, SeqCst);
        assert!(matches!(store.reader.read_messages_settled(1, 0, 10), Err(StoreError::Installing)));
        store.reader.installs.fetch_add(1, SeqCst);
        assert!(store.reader.read_messages_settled(1, 0, 10).unwrap().is_empty());
    }

    #[test]
    fn the_meta_of_an_encoded_message_is_read_without_its_payload() {
        let message =
            StoredMessage { id: "m-1".into(), timestamp: 7, stored_at: 9, payload: Bytes::from(vec![b'x'; 1000]) };
        let meta = StoredMessage::decode_meta(&message.encode()).unwrap();
        assert_eq!(meta, MessageMeta { id: "m-1".into(), payload_bytes: 1000, stored_at: 9 });
        assert!(StoredMessage::decode_meta(&message.encode()[..5]).is_err());
    }
}
