//! The pub/sub rules: how a command changes the state, as a function with no I/O.
//!
//! [`apply`] reads and writes through [`SmStore`]; the state machine implements it over a
//! RocksDB `WriteBatch` (with an overlay so later commands of the same batch see earlier
//! ones), and the tests implement it over `BTreeMap`s. Every replica runs exactly this code
//! on exactly the same commands, so every replica computes the same state.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::command::{AckRecord, NewMessage, PublishResult, Request, Response, Retention, TopicRecord};
use crate::limits::{
    CURSORS_PER_TOPIC_MAX, TICK_ROTATION_MS, TOPICS_MAX, TOPICS_METADATA_BYTES_MAX, TRIM_PER_COMMAND_MAX,
};
use crate::reader::StoredMessage;
use crate::StoreError;

/// What the rules need to know about a stored message to trim it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageMeta {
    pub id: String,
    pub payload_bytes: u64,
    pub stored_at: u64,
}

/// The storage the rules read and write. Writes must be visible to later reads.
pub trait SmStore {
    fn dedup_get(&self, topic_id: u64, id: &str) -> Result<Option<u64>, StoreError>;
    /// Says that `ids` are about to be looked up with [`SmStore::dedup_get`], so a store can
    /// read them all at once. Reads only: the answers are the same with or without it.
    fn dedup_prefetch<'i>(&mut self, _topic_id: u64, _ids: impl Iterator<Item = &'i str>) -> Result<(), StoreError> {
        Ok(())
    }
    fn dedup_put(&mut self, topic_id: u64, id: &str, sequence: u64);
    fn dedup_delete(&mut self, topic_id: u64, id: &str);
    fn message_put(&mut self, topic_id: u64, sequence: u64, message: StoredMessage);
    fn message_meta(&self, topic_id: u64, sequence: u64) -> Result<Option<MessageMeta>, StoreError>;
    /// Deletes messages `[from, to)`.
    fn messages_delete(&mut self, topic_id: u64, from: u64, to: u64);
    fn cursor_get(&self, topic_id: u64, subscriber_id: &str) -> Result<Option<u64>, StoreError>;
    fn cursor_put(&mut self, topic_id: u64, subscriber_id: &str, sequence: u64);
    fn cursor_delete(&mut self, topic_id: u64, subscriber_id: &str);
}

/// The in-memory part of the state: every topic record, by name, and the next topic id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topics {
    pub by_name: HashMap<String, TopicRecord>,
    pub next_topic_id: u64,
    /// Topics deleted by the commands applied since the state machine last took this list,
    /// each with its `current_sequence` at the deletion (in memory only): a deletion and a
    /// revival applied together would otherwise leave no trace for live subscribers.
    pub deletions: Vec<(String, u64)>,
    /// Recorded cursors per topic id (in memory only: counted from the cursors when the state
    /// is loaded, then kept by the rules), for [`CURSORS_PER_TOPIC_MAX`].
    pub cursor_counts: HashMap<u64, u64>,
    /// The cluster's id, once a `SetClusterId` was applied (persisted in `sm_meta`).
    pub cluster_id: Option<String>,
    /// Nodes whose data dir is short of room, each with the stamp of its latest claim (its
    /// own clock, ms; it tells one claim from the next) (persisted in `sm_meta`).
    pub disk_short: BTreeMap<u64, u64>,
    /// The bytes of every record's metadata (in memory only: summed when the state is loaded,
    /// then kept by the rules), for [`TOPICS_METADATA_BYTES_MAX`].
    pub metadata_bytes: usize,
}

/// The bytes `metadata` counts against [`TOPICS_METADATA_BYTES_MAX`].
pub fn metadata_len(metadata: Option<&str>) -> usize {
    metadata.map_or(0, str::len)
}

/// Applies one command. Returns the response and the names of the topics it changed (their
/// records must be persisted and their subscribers woken).
pub fn apply(
    topics: &mut Topics,
    store: &mut impl SmStore,
    request: &Request,
) -> Result<(Response, Vec<String>), StoreError> {
    prefetch_client_ids(topics, store, request)?;
    // One trimming budget for the whole command, whatever it packs: a tick after a long
    // outage, or a batch of publishes to many topics, must not make one apply delete millions.
    let mut trim_budget = TRIM_PER_COMMAND_MAX;
    apply_command(topics, store, request, &mut trim_budget)
}

fn apply_command(
    topics: &mut Topics,
    store: &mut impl SmStore,
    request: &Request,
    trim_budget: &mut u64,
) -> Result<(Response, Vec<String>), StoreError> {
    match request {
        Request::CreateTopic { topic, metadata, retention, now_ms } => {
            Ok(create_topic(topics, topic, metadata, *retention, *now_ms, Revival::AtNow))
        }
        Request::CreateTopicLater { topic, metadata, retention, now_ms } => {
            Ok(create_topic(topics, topic, metadata, *retention, *now_ms, Revival::Later))
        }
        Request::DeleteTopic { topic } => Ok(delete_topic(topics, topic)),
        Request::Publish { topic, messages, now_ms } => {
            publish(topics, store, topic, messages, *now_ms, Ids::MayRepeat, trim_budget)
        }
        Request::PublishGeneratedIds { topic, messages, now_ms } => {
            publish(topics, store, topic, messages, *now_ms, Ids::Generated, trim_budget)
        }
        Request::Ack { acks } => ack(topics, store, acks, CursorBound::None),
        Request::AckBounded { acks } => ack(topics, store, acks, CursorBound::PerTopic),
        Request::ForgetCursor { topic, subscriber_id } => forget_cursor(topics, store, topic, subscriber_id),
        Request::Tick { now_ms } => tick(topics, store, *now_ms, trim_budget),
        Request::SetClusterId { id } => {
            topics.cluster_id.get_or_insert_with(|| id.clone());
            Ok((Response::None, vec![]))
        }
        Request::SetDiskShort { node_id, short, now_ms } => {
            if *short {
                topics.disk_short.insert(*node_id, *now_ms);
            } else {
                topics.disk_short.remove(node_id);
            }
            Ok((Response::None, vec![]))
        }
        Request::WithdrawDiskClaim { node_id, stamp } => {
            if topics.disk_short.get(node_id) == Some(stamp) {
                topics.disk_short.remove(node_id);
            }
            Ok((Response::None, vec![]))
        }
        Request::Batch(requests) => {
            let mut responses = Vec::with_capacity(requests.len());
            let mut changed = Vec::new();
            for request in requests {
                let (response, touched) = apply_command(topics, store, request, trim_budget)?;
                responses.push(response);
                changed.extend(touched);
            }
            Ok((Response::Batch(responses), changed))
        }
    }
}

/// Reads ahead the client ids that `request` will look up, in one batched read per topic: a
/// batch publish holds many, and so does a `Batch` into which the proposer packed many
/// single-message publishes.
fn prefetch_client_ids(topics: &Topics, store: &mut impl SmStore, request: &Request) -> Result<(), StoreError> {
    let requests = match request {
        Request::Batch(requests) => requests.as_slice(),
        one => std::slice::from_ref(one),
    };
    let mut ids_by_topic: BTreeMap<u64, Vec<&str>> = BTreeMap::new();
    for request in requests {
        if let Request::Publish { topic, messages, .. } = request {
            if let Some(record) = topics.by_name.get(topic).filter(|r| !r.deleted) {
                ids_by_topic.entry(record.id).or_default().extend(messages.iter().map(|m| m.id.as_str()));
            }
        }
    }
    for (topic_id, ids) in ids_by_topic {
        if ids.len() > 1 {
            store.dedup_prefetch(topic_id, ids.into_iter())?;
        }
    }
    Ok(())
}

/// When a revived topic counts as created: the rule of the command that revives it.
#[derive(Clone, Copy)]
enum Revival {
    /// `CreateTopic`: at the leader's clock, which may equal (or precede) the life before.
    AtNow,
    /// `CreateTopicLater`: strictly after the life before (see there).
    Later,
}

fn create_topic(
    topics: &mut Topics,
    name: &str,
    metadata: &Option<String>,
    retention: Retention,
    now_ms: u64,
    revival: Revival,
) -> (Response, Vec<String>) {
    let new_len = metadata_len(metadata.as_deref());
    if let Some(record) = topics.by_name.get_mut(name) {
        if !record.deleted {
            return (Response::TopicCreated { created: false }, vec![]);
        }
        let (old_len, metadata_bytes) = (metadata_len(record.metadata.as_deref()), topics.metadata_bytes);
        let metadata_bytes = metadata_bytes - old_len + new_len;
        // Only growth is refused: state loaded over the bound (from before it) still takes
        // topics without metadata.
        if new_len > old_len && metadata_bytes > TOPICS_METADATA_BYTES_MAX {
            return (Response::TopicMetadataLimitReached, vec![]);
        }
        topics.metadata_bytes = metadata_bytes;
        // Revive: same id and sequence, so old cursors stay valid.
        record.deleted = false;
        record.created_at = match revival {
            Revival::AtNow => now_ms,
            Revival::Later => now_ms.max(record.created_at + 1),
        };
        record.metadata = metadata.as_deref().map(Arc::from);
        record.retention = retention;
        return (Response::TopicCreated { created: true }, vec![name.to_string()]);
    }
    if topics.by_name.len() >= TOPICS_MAX {
        // The edge refuses this before proposing; a replica that still sees it must agree.
        return (Response::TopicLimitReached, vec![]);
    }
    if new_len > 0 && topics.metadata_bytes + new_len > TOPICS_METADATA_BYTES_MAX {
        return (Response::TopicMetadataLimitReached, vec![]);
    }
    topics.metadata_bytes += new_len;
    topics.next_topic_id += 1;
    let record = TopicRecord::new(topics.next_topic_id, name, now_ms, metadata.as_deref().map(Arc::from), retention);
    topics.by_name.insert(name.to_string(), record);
    (Response::TopicCreated { created: true }, vec![name.to_string()])
}

fn delete_topic(topics: &mut Topics, name: &str) -> (Response, Vec<String>) {
    match topics.by_name.get_mut(name) {
        Some(record) if !record.deleted => {
            record.deleted = true;
            // Nothing reads a deleted topic's metadata (a revival brings its own): it stops
            // counting against the cluster's bound.
            topics.metadata_bytes -= metadata_len(record.metadata.as_deref());
            record.metadata = None;
            topics.deletions.push((name.to_string(), record.current_sequence));
            (Response::TopicDeleted, vec![name.to_string()])
        }
        _ => (Response::TopicNotFound, vec![]),
    }
}

/// Where a publish's message ids come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ids {
    /// From the client: any of them may already be in the topic.
    MayRepeat,
    /// Generated by the leader: none can be in the topic yet.
    Generated,
}

fn publish(
    topics: &mut Topics,
    store: &mut impl SmStore,
    name: &str,
    messages: &[NewMessage],
    now_ms: u64,
    ids: Ids,
    trim_budget: &mut u64,
) -> Result<(Response, Vec<String>), StoreError> {
    let Some(record) = topics.by_name.get_mut(name).filter(|r| !r.deleted) else {
        return Ok((Response::TopicNotFound, vec![]));
    };
    let mut results = Vec::with_capacity(messages.len());
    for message in messages {
        if ids == Ids::MayRepeat {
            if let Some(existing_sequence) = store.dedup_get(record.id, &message.id)? {
                results.push(PublishResult::Duplicate { existing_sequence });
                continue;
            }
        }
        let sequence = record.current_sequence + 1;
        store.dedup_put(record.id, &message.id, sequence);
        store.message_put(
            record.id,
            sequence,
            StoredMessage {
                id: message.id.clone(),
                timestamp: message.timestamp,
                stored_at: now_ms,
                payload: message.payload.clone(),
            },
        );
        record.current_sequence = sequence;
        record.bytes += message.payload.len() as u64;
        results.push(PublishResult::Stored { sequence });
    }
    debug_assert!(record.first_sequence <= record.current_sequence + 1);
    trim(record, store, now_ms, trim_budget)?;
    Ok((Response::Published { results }, vec![name.to_string()]))
}

/// Whether an ack command bounds the cursors a topic may hold (see [`Request::AckBounded`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum CursorBound {
    None,
    PerTopic,
}

fn ack(
    topics: &mut Topics,
    store: &mut impl SmStore,
    acks: &[AckRecord],
    bound: CursorBound,
) -> Result<(Response, Vec<String>), StoreError> {
    let mut refused = Vec::new();
    for a in acks {
        // An ack for a deleted or unknown topic, or past the end, is ignored: acks are
        // advisory and must never fail a coalesced batch of others.
        let Some(record) = topics.by_name.get(&a.topic).filter(|r| !r.deleted) else {
            continue;
        };
        if store.cursor_get(record.id, &a.subscriber_id)?.is_none() {
            let count = topics.cursor_counts.entry(record.id).or_insert(0);
            if bound == CursorBound::PerTopic && *count >= CURSORS_PER_TOPIC_MAX {
                refused.push(a.clone());
                continue;
            }
            *count += 1;
        }
        store.cursor_put(record.id, &a.subscriber_id, a.sequence.min(record.current_sequence));
    }
    let response = if refused.is_empty() { Response::Acked } else { Response::AcksRefused { refused } };
    Ok((response, vec![]))
}

fn forget_cursor(
    topics: &mut Topics,
    store: &mut impl SmStore,
    name: &str,
    subscriber_id: &str,
) -> Result<(Response, Vec<String>), StoreError> {
    let Some(record) = topics.by_name.get(name).filter(|r| !r.deleted) else {
        return Ok((Response::TopicNotFound, vec![]));
    };
    if store.cursor_get(record.id, subscriber_id)?.is_some() {
        store.cursor_delete(record.id, subscriber_id);
        if let Some(count) = topics.cursor_counts.get_mut(&record.id) {
            *count = count.saturating_sub(1);
        }
    }
    Ok((Response::CursorForgotten, vec![]))
}

fn tick(
    topics: &mut Topics,
    store: &mut impl SmStore,
    now_ms: u64,
    trim_budget: &mut u64,
) -> Result<(Response, Vec<String>), StoreError> {
    let mut names: Vec<&String> = topics
        .by_name
        .iter()
        .filter(|(_, r)| r.retention.hours.is_some() && r.message_count() > 0)
        .map(|(name, _)| name)
        .collect();
    // HashMap order differs between processes; the trim budget must not.
    names.sort();
    // Each tick starts one topic further (by the leader's clock in the command, the same on
    // every replica), so that when the budget runs out it is not always the same topics
    // that wait.
    if !names.is_empty() {
        let start = (now_ms / TICK_ROTATION_MS) as usize % names.len();
        names.rotate_left(start);
    }
    let names: Vec<String> = names.into_iter().cloned().collect();
    let mut changed = Vec::new();
    for name in names {
        if *trim_budget == 0 {
            break;
        }
        let Some(record) = topics.by_name.get_mut(&name) else {
            continue;
        };
        if trim(record, store, now_ms, trim_budget)? > 0 {
            changed.push(name);
        }
    }
    Ok((Response::None, changed))
}

/// Drops the oldest messages while the topic is over any of its retention limits, at most
/// `budget` of them (what is left of the command's [`TRIM_PER_COMMAND_MAX`], reduced by what
/// this drops). Returns how many were dropped.
fn trim(record: &mut TopicRecord, store: &mut impl SmStore, now_ms: u64, budget: &mut u64) -> Result<u64, StoreError> {
    let retention = record.retention;
    if retention.is_unlimited() {
        return Ok(0);
    }
    let cutoff_ms = retention.hours.map(|h| now_ms.saturating_sub(h.saturating_mul(3_600_000)));
    let start = record.first_sequence;
    let mut first = start;
    while first <= record.current_sequence && first - start < *budget {
        let count = record.current_sequence + 1 - first;
        let over_count = retention.messages.is_some_and(|max| count > max);
        let over_bytes = retention.bytes.is_some_and(|max| record.bytes > max);
        if !over_count && !over_bytes && cutoff_ms.is_none() {
            break;
        }
        let Some(meta) = store.message_meta(record.id, first)? else {
            return Err(StoreError::Corrupt(format!("topic {} is missing retained message {first}", record.name)));
        };
        let too_old = cutoff_ms.is_some_and(|cutoff| meta.stored_at < cutoff);
        if !over_count && !over_bytes && !too_old {
            break;
        }
        store.dedup_delete(record.id, &meta.id);
        record.bytes -= meta.payload_bytes.min(record.bytes);
        first += 1;
    }
    if first > start {
        store.messages_delete(record.id, start, first);
        record.first_sequence = first;
    }
    *budget -= first - start;
    Ok(first - start)
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use bytes::Bytes;

    use super::*;

    /// The rules' storage over plain maps.
    #[derive(Default)]
    pub struct MemStore {
        pub dedup: BTreeMap<(u64, String), u64>,
        pub messages: BTreeMap<(u64, u64), StoredMessage>,
        pub cursors: BTreeMap<(u64, String), u64>,
        /// How many dedup lookups the rules made.
        pub lookups: std::cell::Cell<u64>,
    }

    impl SmStore for MemStore {
        fn dedup_get(&self, topic_id: u64, id: &str) -> Result<Option<u64>, StoreError> {
            self.lookups.set(self.lookups.get() + 1);
            Ok(self.dedup.get(&(topic_id, id.to_string())).copied())
        }
        fn dedup_put(&mut self, topic_id: u64, id: &str, sequence: u64) {
            self.dedup.insert((topic_id, id.to_string()), sequence);
        }
        fn dedup_delete(&mut self, topic_id: u64, id: &str) {
            self.dedup.remove(&(topic_id, id.to_string()));
        }
        fn message_put(&mut self, topic_id: u64, sequence: u64, message: StoredMessage) {
            self.messages.insert((topic_id, sequence), message);
        }
        fn message_meta(&self, topic_id: u64, sequence: u64) -> Result<Option<MessageMeta>, StoreError> {
            Ok(self.messages.get(&(topic_id, sequence)).map(|m| MessageMeta {
                id: m.id.clone(),
                payload_bytes: m.payload.len() as u64,
                stored_at: m.stored_at,
            }))
        }
        fn messages_delete(&mut self, topic_id: u64, from: u64, to: u64) {
            for seq in from..to {
                self.messages.remove(&(topic_id, seq));
            }
        }
        fn cursor_get(&self, topic_id: u64, subscriber_id: &str) -> Result<Option<u64>, StoreError> {
            Ok(self.cursors.get(&(topic_id, subscriber_id.to_string())).copied())
        }
        fn cursor_put(&mut self, topic_id: u64, subscriber_id: &str, sequence: u64) {
            self.cursors.insert((topic_id, subscriber_id.to_string()), sequence);
        }
        fn cursor_delete(&mut self, topic_id: u64, subscriber_id: &str) {
            self.cursors.remove(&(topic_id, subscriber_id.to_string()));
        }
    }

    pub fn create(topic: &str, retention: Retention) -> Request {
        Request::CreateTopic { topic: topic.into(), metadata: None, retention, now_ms: 1 }
    }

    pub fn msg(id: &str) -> NewMessage {
        NewMessage { id: id.into(), timestamp: 7, payload: Bytes::from_static(b"{\"k\":1}") }
    }

    pub fn publish_at(topic: &str, ids: &[&str], now_ms: u64) -> Request {
        Request::Publish { topic: topic.into(), messages: ids.iter().map(|id| msg(id)).collect(), now_ms }
    }

    fn run(topics: &mut Topics, store: &mut MemStore, request: Request) -> Response {
        apply(topics, store, &request).expect("in-memory store does not fail").0
    }

    fn stored(seqs: &[u64]) -> Response {
        Response::Published { results: seqs.iter().map(|&sequence| PublishResult::Stored { sequence }).collect() }
    }

    #[test]
    fn sequences_are_contiguous_from_one_across_single_and_batch_publishes() {
        let (mut t, mut s) = (Topics::default(), MemStore::default());
        run(&mut t, &mut s, create("a", Retention::default()));
        assert_eq!(run(&mut t, &mut s, publish_at("a", &["1"], 5)), stored(&[1]));
        assert_eq!(run(&mut t, &mut s, publish_at("a", &["2", "3", "4"], 5)), stored(&[2, 3, 4]));
        assert_eq!(run(&mut t, &mut s, publish_at("a", &["5"], 5)), stored(&[5]));
        let keys: Vec<u64> = s.messages.keys().map(|(_, seq)| *seq).collect();
        assert_eq!(keys, vec![1, 2, 3, 4, 5]);
        assert_eq!(t.by_name["a"].current_sequence, 5);
        assert_eq!(t.by_name["a"].message_count(), 5);
    }

    #[test]
    fn sequences_are_per_topic() {
        let (mut t, mut s) = (Topics::default(), MemStore::default());
        run(&mut t, &mut s, create("a", Retention::default()));
        run(&mut t, &mut s, create("b", Retention::default()));
        run(&mut t, &mut s, publish_at("a", &["x"], 5));
        assert_eq!(run(&mut t, &mut s, publish_at("b", &["x"], 5)), stored(&[1]));
    }

    #[test]
    fn duplicate_id_reports_the_existing_sequence_and_takes_no_sequence() {
        let (mut t, mut s) = (Topics::default(), MemStore::default());
        run(&mut t, &mut s, create("a", Retention::default()));
        run(&mut t, &mut s, publish_at("a", &["m1", "m2"], 5));
        let r = run(&mut t, &mut s, publish_at("a", &["m1"], 5));
        assert_eq!(r, Response::Published { results: vec![PublishResult::Duplicate { existing_sequence: 1 }] });
        assert_eq!(run(&mut t, &mut s, publish_at("a", &["m3"], 5)), stored(&[3]));
    }

    #[test]
    fn duplicate_inside_one_batch_is_detected() {
        let (mut t, mut s) = (Topics::default(), MemStore::default());
        run(&mut t, &mut s, create("a", Retention::default()));
        let r = run(&mut t, &mut s, publish_at("a", &["x", "y", "x"], 5));
        assert_eq!(
            r,
            Response::Published {
                results: vec![
                    PublishResult::Stored { sequence: 1 },
                    PublishResult::Stored { sequence: 2 },
                    PublishResult::Duplicate { existing_sequence: 1 },
                ]
            }
        );
    }

    #[test]
    fn generated_ids_are_recorded_for_dedup_without_being_looked_up() {
        let (mut t, mut s) = (Topics::default(), MemStore::default());
        run(&mut t, &mut s, create("a", Retention::default()));
        let generated = Request::publish("a".into(), vec![msg("g1"), msg("g2")], 5, true);
        assert!(matches!(generated, Request::PublishGeneratedIds { .. }));
        assert_eq!(run(&mut t, &mut s, generated), stored(&[1, 2]));
        assert_eq!(s.lookups.get(), 0);
        // A client that later sends one of those ids back is told it is a duplicate.
        let r = run(&mut t, &mut s, Request::publish("a".into(), vec![msg("g2")], 5, false));
        assert_eq!(r, Response::Published { results: vec![PublishResult::Duplicate { existing_sequence: 2 }] });
        assert_eq!(s.lookups.get(), 1);
    }

    #[test]
    fn create_is_idempotent_and_publish_to_missing_topic_is_not_found() {
        let (mut t, mut s) = (Topics::default(), MemStore::default());
        assert_eq!(run(&mut t, &mut s, create("a", Retention::default())), Response::TopicCreated { created: true });
        assert_eq!(run(&mut t, &mut s, create("a", Retention::default())), Response::TopicCreated { created: false });
        assert_eq!(run(&mut t, &mut s, publish_at("nope", &["1"], 5)), Response::TopicNotFound);
    }

    #[test]
    fn deleted_topic_refuses_publishes_and_revives_with_its_sequence() {
        let (mut t, mut s) = (Topics::default(), MemStore::default());
        run(&mut t, &mut s, create("a", Retention::default()));
        run(&mut t, &mut s, publish_at("a", &["1", "2"], 5));
        let id = t.by_name["a"].id;
        assert_eq!(run(&mut t, &mut s, Request::DeleteTopic { topic: "a".into() }), Response::TopicDeleted);
        assert_eq!(run(&mut t, &mut s, Request::DeleteTopic { topic: "a".into() }), Response::TopicNotFound);
        assert_eq!(run(&mut t, &mut s, publish_at("a", &["3"], 5)), Response::TopicNotFound);
        assert_eq!(run(&mut t, &mut s, create("a", Retention::default())), Response::TopicCreated { created: true });
        assert_eq!(t.by_name["a"].id, id);
        assert_eq!(run(&mut t, &mut s, publish_at("a", &["3"], 5)), stored(&[3]));
    }

    #[test]
    fn a_revival_is_always_created_later_than_the_life_before() {
        let (mut t, mut s) = (Topics::default(), MemStore::default());
        let create_at = |now_ms| Request::CreateTopicLater {
            topic: "a".into(),
            metadata: None,
            retention: Retention::default(),
            now_ms,
        };
        run(&mut t, &mut s, create_at(100));
        // Deleted and created again in the same millisecond, then under a clock that went back.
        for now_ms in [100, 50] {
            let before = t.by_name["a"].created_at;
            run(&mut t, &mut s, Request::DeleteTopic { topic: "a".into() });
            assert_eq!(run(&mut t, &mut s, create_at(now_ms)), Response::TopicCreated { created: true });
            assert_eq!(t.by_name["a"].created_at, before + 1);
        }
        // A clock ahead is taken as it is.
        run(&mut t, &mut s, Request::DeleteTopic { topic: "a".into() });
        run(&mut t, &mut s, create_at(500));
        assert_eq!(t.by_name["a"].created_at, 500);
        // `CreateTopic` entries, already in logs, keep the rule they were first applied with.
        run(&mut t, &mut s, Request::DeleteTopic { topic: "a".into() });
        run(
            &mut t,
            &mut s,
            Request::CreateTopic { topic: "a".into(), metadata: None, retention: Retention::default(), now_ms: 500 },
        );
        assert_eq!(t.by_name["a"].created_at, 500);
    }

    #[test]
    fn a_new_topic_past_the_limit_is_refused_and_deleted_names_count() {
        let (mut t, mut s) = (Topics::default(), MemStore::default());
        for i in 0..TOPICS_MAX {
            run(&mut t, &mut s, create(&format!("t{i}"), Retention::default()));
        }
        run(&mut t, &mut s, Request::DeleteTopic { topic: "t0".into() });
        assert_eq!(run(&mut t, &mut s, create("one-more", Retention::default())), Response::TopicLimitReached);
        assert!(!t.by_name.contains_key("one-more"));
        // A deleted name keeps its place, so it can still be created again.
        assert_eq!(run(&mut t, &mut s, create("t0", Retention::default())), Response::TopicCreated { created: true });
    }

    #[test]
    fn metadata_past_the_clusters_bound_is_refused_and_a_revival_counts_its_new_metadata() {
        let with = |topic: &str, metadata: &str| Request::CreateTopic {
            topic: topic.into(),
            metadata: Some(metadata.into()),
            retention: Retention::default(),
            now_ms: 1,
        };
        let (mut t, mut s) = (Topics::default(), MemStore::default());
        assert_eq!(run(&mut t, &mut s, with("a", "{\"k\":1}")), Response::TopicCreated { created: true });
        assert_eq!(t.metadata_bytes, 7);
        // As if other topics held the rest: 3 bytes of room left.
        t.metadata_bytes = TOPICS_METADATA_BYTES_MAX - 3;
        assert_eq!(run(&mut t, &mut s, with("b", "{\"k\":1}")), Response::TopicMetadataLimitReached);
        assert!(!t.by_name.contains_key("b"));
        assert_eq!(run(&mut t, &mut s, with("b", "{}")), Response::TopicCreated { created: true });
        assert_eq!(t.metadata_bytes, TOPICS_METADATA_BYTES_MAX - 1);
        // A deletion frees its topic's 7 bytes; the revival counts its new metadata: 9 bytes are
        // one too many, 8 fit.
        run(&mut t, &mut s, Request::DeleteTopic { topic: "a".into() });
        assert_eq!(t.metadata_bytes, TOPICS_METADATA_BYTES_MAX - 8);
        assert_eq!(run(&mut t, &mut s, with("a", "{\"k\":123}")), Response::TopicMetadataLimitReached);
        assert!(t.by_name["a"].deleted);
        assert_eq!(run(&mut t, &mut s, with("a", "{\"k\":12}")), Response::TopicCreated { created: true });
        assert_eq!(t.metadata_bytes, TOPICS_METADATA_BYTES_MAX);
        // Over the bound (state from before it): a topic without metadata is still created.
        t.metadata_bytes = TOPICS_METADATA_BYTES_MAX + 5;
        assert_eq!(run(&mut t, &mut s, create("c", Retention::default())), Response::TopicCreated { created: true });
    }

    #[test]
    fn retention_messages_keeps_the_newest_and_frees_their_ids() {
        let (mut t, mut s) = (Topics::default(), MemStore::default());
        let keep_two = Retention { messages: Some(2), ..Default::default() };
        run(&mut t, &mut s, create("a", keep_two));
        run(&mut t, &mut s, publish_at("a", &["1", "2", "3", "4"], 5));
        let record = &t.by_name["a"];
        assert_eq!((record.first_sequence, record.current_sequence, record.message_count()), (3, 4, 2));
        assert_eq!(s.messages.len(), 2);
        // Id "1" is no longer retained, so it is no longer a duplicate.
        assert_eq!(run(&mut t, &mut s, publish_at("a", &["1"], 5)), stored(&[5]));
        assert_eq!(t.by_name["a"].first_sequence, 4);
    }

    #[test]
    fn retention_bytes_boundary_is_inclusive() {
        let (mut t, mut s) = (Topics::default(), MemStore::default());
        // Each test payload is 7 bytes; 14 bytes keeps exactly two.
        run(&mut t, &mut s, create("a", Retention { bytes: Some(14), ..Default::default() }));
        run(&mut t, &mut s, publish_at("a", &["1", "2"], 5));
        assert_eq!(t.by_name["a"].message_count(), 2);
        run(&mut t, &mut s, publish_at("a", &["3"], 5));
        assert_eq!(t.by_name["a"].message_count(), 2);
        assert_eq!(t.by_name["a"].first_sequence, 2);
        assert_eq!(t.by_name["a"].bytes, 14);
    }

    #[test]
    fn retention_hours_uses_the_time_in_the_command_not_a_clock() {
        let (mut t, mut s) = (Topics::default(), MemStore::default());
        let hour = 3_600_000;
        run(&mut t, &mut s, create("a", Retention { hours: Some(1), ..Default::default() }));
        run(&mut t, &mut s, publish_at("a", &["old"], 1_000));
        run(&mut t, &mut s, publish_at("a", &["new"], 1_000 + hour));
        // Exactly one hour old is kept.
        assert_eq!(t.by_name["a"].message_count(), 2);
        run(&mut t, &mut s, Request::Tick { now_ms: 1_001 + hour });
        assert_eq!(t.by_name["a"].first_sequence, 2);
        run(&mut t, &mut s, Request::Tick { now_ms: 1_001 + 2 * hour });
        let record = &t.by_name["a"];
        assert_eq!((record.first_sequence, record.current_sequence, record.message_count()), (3, 2, 0));
        assert!(s.messages.is_empty() && s.dedup.is_empty());
    }

    #[test]
    fn trimming_is_bounded_per_command() {
        let (mut t, mut s) = (Topics::default(), MemStore::default());
        run(&mut t, &mut s, create("a", Retention::default()));
        let ids: Vec<String> = (0..TRIM_PER_COMMAND_MAX + 5).map(|i| i.to_string()).collect();
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        run(&mut t, &mut s, publish_at("a", &refs, 5));
        t.by_name.get_mut("a").unwrap().retention = Retention { messages: Some(1), ..Default::default() };
        run(&mut t, &mut s, Request::Tick { now_ms: 6 });
        // Tick only trims topics with retention_hours; a publish trims the rest.
        run(&mut t, &mut s, publish_at("a", &["last"], 6));
        assert_eq!(t.by_name["a"].first_sequence, 1 + TRIM_PER_COMMAND_MAX);
        run(&mut t, &mut s, publish_at("a", &["last2"], 6));
        assert_eq!(t.by_name["a"].message_count(), 1);
    }

    #[test]
    fn one_tick_trims_at_most_the_budget_over_all_topics_and_starts_further_each_time() {
        let hour = 3_600_000;
        let per_topic = TRIM_PER_COMMAND_MAX / 2 + 1;
        // Three topics whose messages are all over an hour old by `now`.
        let setup = || {
            let (mut t, mut s) = (Topics::default(), MemStore::default());
            for name in ["a", "b", "c"] {
                run(&mut t, &mut s, create(name, Retention { hours: Some(1), ..Default::default() }));
                let ids: Vec<String> = (0..per_topic).map(|i| format!("{name}{i}")).collect();
                let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
                run(&mut t, &mut s, publish_at(name, &refs, 1_000));
            }
            (t, s)
        };
        let trimmed =
            |t: &Topics| -> Vec<u64> { ["a", "b", "c"].iter().map(|n| t.by_name[*n].first_sequence - 1).collect() };
        let now = 10 * hour;
        let (mut t, mut s) = setup();
        run(&mut t, &mut s, Request::Tick { now_ms: now });
        let first_tick = trimmed(&t);
        assert_eq!(first_tick.iter().sum::<u64>(), TRIM_PER_COMMAND_MAX, "{first_tick:?}");
        run(&mut t, &mut s, Request::Tick { now_ms: now + TICK_ROTATION_MS });
        assert_eq!(trimmed(&t), vec![per_topic; 3]);
        // A tick a minute later, on the same state, starts one topic further: another topic waits.
        let (mut t, mut s) = setup();
        run(&mut t, &mut s, Request::Tick { now_ms: now + TICK_ROTATION_MS });
        let waited = |trimmed: &[u64]| trimmed.iter().position(|&n| n == 0);
        assert_ne!(waited(&first_tick), waited(&trimmed(&t)));
        assert!(waited(&first_tick).is_some());
    }

    #[test]
    fn a_batch_applies_like_its_commands_one_by_one() {
        let commands =
            vec![create("a", Retention::default()), publish_at("a", &["x", "y"], 5), publish_at("a", &["x"], 5)];
        let (mut t1, mut s1) = (Topics::default(), MemStore::default());
        let one_by_one: Vec<Response> = commands.iter().map(|c| run(&mut t1, &mut s1, c.clone())).collect();
        let (mut t2, mut s2) = (Topics::default(), MemStore::default());
        assert_eq!(run(&mut t2, &mut s2, Request::Batch(commands)), Response::Batch(one_by_one));
        assert_eq!(t1, t2);
        assert_eq!(s1.messages, s2.messages);
    }

    #[test]
    fn acks_record_the_latest_cursor_clamped_to_the_topic() {
        let (mut t, mut s) = (Topics::default(), MemStore::default());
        run(&mut t, &mut s, create("a", Retention::default()));
        run(&mut t, &mut s, publish_at("a", &["1", "2", "3"], 5));
        let ack = |sequence| AckRecord { topic: "a".into(), subscriber_id: "s".into(), sequence };
        run(&mut t, &mut s, Request::Ack { acks: vec![ack(2)] });
        assert_eq!(s.cursors[&(1, "s".to_string())], 2);
        run(&mut t, &mut s, Request::Ack { acks: vec![ack(99)] });
        assert_eq!(s.cursors[&(1, "s".to_string())], 3);
        run(&mut t, &mut s, Request::Ack { acks: vec![ack(1)] });
        assert_eq!(s.cursors[&(1, "s".to_string())], 1);
    }

    #[test]
    fn a_forgotten_cursor_is_gone_and_others_stay() {
        let (mut t, mut s) = (Topics::default(), MemStore::default());
        run(&mut t, &mut s, create("a", Retention::default()));
        run(&mut t, &mut s, publish_at("a", &["1", "2"], 5));
        let ack =
            |subscriber_id: &str| AckRecord { topic: "a".into(), subscriber_id: subscriber_id.into(), sequence: 2 };
        run(&mut t, &mut s, Request::Ack { acks: vec![ack("s"), ack("keep")] });
        let forget = |topic: &str| Request::ForgetCursor { topic: topic.into(), subscriber_id: "s".into() };
        assert_eq!(run(&mut t, &mut s, forget("a")), Response::CursorForgotten);
        assert_eq!(s.cursors.keys().map(|(_, id)| id.as_str()).collect::<Vec<_>>(), vec!["keep"]);
        // Idempotent, and refused for a topic that is not there.
        assert_eq!(run(&mut t, &mut s, forget("a")), Response::CursorForgotten);
        assert_eq!(run(&mut t, &mut s, forget("none")), Response::TopicNotFound);
    }

    #[test]
    fn a_topic_records_cursors_for_at_most_the_bound_of_new_subscribers() {
        let (mut t, mut s) = (Topics::default(), MemStore::default());
        run(&mut t, &mut s, create("a", Retention::default()));
        run(&mut t, &mut s, create("b", Retention::default()));
        run(&mut t, &mut s, publish_at("a", &["1", "2"], 5));
        let ack =
            |topic: &str, id: &str, sequence| AckRecord { topic: topic.into(), subscriber_id: id.into(), sequence };
        let fill: Vec<AckRecord> = (0..CURSORS_PER_TOPIC_MAX).map(|i| ack("a", &format!("s{i}"), 1)).collect();
        assert_eq!(run(&mut t, &mut s, Request::AckBounded { acks: fill }), Response::Acked);
        assert_eq!(t.cursor_counts[&1], CURSORS_PER_TOPIC_MAX);

        // Full: a new subscriber is refused, a recorded one still moves, another topic is free.
        let acks = vec![ack("a", "new", 2), ack("a", "s0", 2), ack("b", "new", 0)];
        let refused = vec![ack("a", "new", 2)];
        assert_eq!(run(&mut t, &mut s, Request::AckBounded { acks }), Response::AcksRefused { refused });
        assert_eq!(s.cursors.get(&(1, "new".to_string())), None);
        assert_eq!(s.cursors[&(1, "s0".to_string())], 2);
        assert_eq!(s.cursors[&(2, "new".to_string())], 0);

        // Forgetting one makes room for one; forgetting it again frees nothing more.
        let forget = || Request::ForgetCursor { topic: "a".into(), subscriber_id: "s1".into() };
        run(&mut t, &mut s, forget());
        run(&mut t, &mut s, forget());
        assert_eq!(t.cursor_counts[&1], CURSORS_PER_TOPIC_MAX - 1);
        let acks = vec![ack("a", "new", 2), ack("a", "newer", 2)];
        let refused = vec![ack("a", "newer", 2)];
        assert_eq!(run(&mut t, &mut s, Request::AckBounded { acks }), Response::AcksRefused { refused });
        assert_eq!(s.cursors[&(1, "new".to_string())], 2);

        // `Ack` entries written before the bound existed apply as they did then, and are counted.
        assert_eq!(run(&mut t, &mut s, Request::Ack { acks: vec![ack("a", "old", 2)] }), Response::Acked);
        assert_eq!(t.cursor_counts[&1], CURSORS_PER_TOPIC_MAX + 1);
        assert_eq!(s.cursors.keys().filter(|(topic, _)| *topic == 1).count() as u64, t.cursor_counts[&1]);
    }

    #[test]
    fn a_node_short_of_disk_is_recorded_with_its_latest_claim_until_it_has_room() {
        let (mut t, mut s) = (Topics::default(), MemStore::default());
        let short = |node_id, short, now_ms| Request::SetDiskShort { node_id, short, now_ms };
        run(&mut t, &mut s, short(2, true, 10));
        run(&mut t, &mut s, short(3, true, 11));
        run(&mut t, &mut s, short(2, true, 20));
        assert_eq!(t.disk_short, BTreeMap::from([(2, 20), (3, 11)]));
        run(&mut t, &mut s, short(2, false, 30));
        run(&mut t, &mut s, short(4, false, 30));
        assert_eq!(t.disk_short, BTreeMap::from([(3, 11)]));
    }

    #[test]
    fn a_lapsed_claim_is_withdrawn_only_if_it_was_not_renewed_meanwhile() {
        let (mut t, mut s) = (Topics::default(), MemStore::default());
        let short = |node_id, now_ms| Request::SetDiskShort { node_id, short: true, now_ms };
        let withdraw = |node_id, stamp| Request::WithdrawDiskClaim { node_id, stamp };
        run(&mut t, &mut s, short(2, 10));
        run(&mut t, &mut s, short(3, 11));
        // Node 2 renewed its claim after the leader saw the one stamped 10 lapse.
        run(&mut t, &mut s, short(2, 20));
        run(&mut t, &mut s, withdraw(2, 10));
        run(&mut t, &mut s, withdraw(3, 11));
        run(&mut t, &mut s, withdraw(4, 11));
        assert_eq!(t.disk_short, BTreeMap::from([(2, 20)]));
        run(&mut t, &mut s, withdraw(2, 20));
        assert!(t.disk_short.is_empty());
    }

    #[test]
    fn the_first_cluster_id_applied_stays() {
        let (mut t, mut s) = (Topics::default(), MemStore::default());
        run(&mut t, &mut s, Request::SetClusterId { id: "first".into() });
        run(&mut t, &mut s, Request::SetClusterId { id: "second".into() });
        assert_eq!(t.cluster_id.as_deref(), Some("first"));
    }
}
