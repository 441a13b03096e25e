//! Subscriber acks, coalesced: the latest ack per (topic, subscriber) is kept in memory and
//! all of them are written through Raft as `AckBounded` commands of at most
//! [`ACKS_PER_COMMAND_MAX`] acks every [`ACK_FLUSH_INTERVAL`], so a subscriber acking every
//! message costs one Raft entry per interval for the whole node, not one per ack.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Mutex, Weak};

use raft_store::command::AckRecord;
use raft_store::limits::CURSORS_PER_TOPIC_MAX;
use raft_store::{Request, Response};

use crate::app::App;
use crate::limits::{ACKS_PENDING_MAX, ACKS_PER_COMMAND_MAX, ACKS_REFUSED_LOG_INTERVAL, ACK_FLUSH_INTERVAL};

/// (topic, subscriber id).
type Key = (String, String);

#[derive(Default)]
pub struct AckCoalescer {
    pending: Mutex<Pending>,
    /// Held by a flush from its `take` until its acks are committed or put back: the last
    /// flush of a stopping node waits for one in progress instead of finding nothing pending
    /// while that one's acks are in flight, to be put back after Raft has stopped.
    flushing: tokio::sync::Mutex<()>,
    /// Whether dropped acks were reported since the last flush.
    full_reported: std::sync::atomic::AtomicBool,
    /// Acks dropped because [`ACKS_PENDING_MAX`] waited already (`pubsub_acks_dropped_total`).
    dropped: std::sync::atomic::AtomicU64,
    /// When acks refused by the cluster were last logged.
    refused_reported_at: Mutex<Option<std::time::Instant>>,
}

/// Under one lock, so that an ack costs one lock and one key.
#[derive(Default)]
struct Pending {
    /// The latest ack of each subscriber, not yet flushed.
    acks: HashMap<Key, u64>,
    /// Subscribers connected here whose acks the cluster refused, to be told at their next
    /// ack (`acks_not_recorded`); at most [`ACKS_PENDING_MAX`].
    refused_untold: HashSet<Key>,
}

impl AckCoalescer {
    /// Records an ack; the latest one for the pair wins. True when the cluster refused this
    /// subscriber's acks since its previous ack: its session then tells the client.
    pub fn record(&self, topic: &str, subscriber_id: &str, sequence: u64) -> bool {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let key = (topic.to_string(), subscriber_id.to_string());
        let refused = !pending.refused_untold.is_empty() && pending.refused_untold.remove(&key);
        if pending.acks.len() >= ACKS_PENDING_MAX && !pending.acks.contains_key(&key) {
            // Full (acks of ended subscriptions kept through a long outage): this one is lost;
            // the subscriber sends its latest ack again when it reconnects.
            self.dropped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            // Once per flush interval, not once per ack of every subscriber.
            if !self.full_reported.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!(
                    topic,
                    subscriber_id,
                    sequence,
                    "acks dropped: {ACKS_PENDING_MAX} acks wait to be recorded"
                );
            }
            return refused;
        }
        pending.acks.insert(key, sequence);
        refused
    }

    /// Acks dropped since the node started, the pending ones being too many.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn take(&self) -> HashMap<Key, u64> {
        self.full_reported.store(false, std::sync::atomic::Ordering::Relaxed);
        std::mem::take(&mut self.pending.lock().unwrap_or_else(|e| e.into_inner()).acks)
    }

    /// Puts back acks that failed to commit, unless newer ones arrived meanwhile.
    fn restore(&self, acks: impl IntoIterator<Item = (Key, u64)>) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        for (key, sequence) in acks {
            pending.acks.entry(key).or_insert(sequence);
        }
    }

    /// Marks subscribers whose acks were refused, to be told at their next ack.
    fn mark_refused(&self, keys: Vec<Key>) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        for key in keys {
            if pending.refused_untold.len() >= ACKS_PENDING_MAX {
                break;
            }
            pending.refused_untold.insert(key);
        }
    }

    /// Forgets that a subscriber's acks were refused: it is no longer connected here.
    pub fn forget_refused(&self, key: &Key) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if !pending.refused_untold.is_empty() {
            pending.refused_untold.remove(key);
        }
    }
}

/// The flush loop; stops when the app is dropped or shut down (the node then flushes once
/// more itself, [`flush`]).
pub async fn run_flusher(app: Weak<App>) {
    let mut interval = tokio::time::interval(ACK_FLUSH_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let Some(app) = app.upgrade() else { return };
        if app.shutdown.is_cancelled() {
            return;
        }
        flush(&app).await;
    }
}

/// Writes the acks recorded since the last flush through Raft, in commands of at most
/// [`ACKS_PER_COMMAND_MAX`]; puts back those that could not be committed.
pub async fn flush(app: &App) {
    let _flushing = app.acks.flushing.lock().await;
    let acks: Vec<_> = app.acks.take().into_iter().collect();
    for (i, chunk) in acks.chunks(ACKS_PER_COMMAND_MAX).enumerate() {
        let records = chunk
            .iter()
            .map(|((topic, subscriber_id), sequence)| AckRecord {
                topic: topic.clone(),
                subscriber_id: subscriber_id.clone(),
                sequence: *sequence,
            })
            .collect();
        match app.propose_anywhere(Request::AckBounded { acks: records }).await {
            Ok(Response::AcksRefused { refused }) => report_refused(app, &refused),
            Ok(_) => {}
            Err(e) => {
                let unrecorded = &acks[i * ACKS_PER_COMMAND_MAX..];
                tracing::debug!(error = %e, count = unrecorded.len(), "acks not recorded yet; retrying");
                app.acks.restore(unrecorded.iter().cloned());
                return;
            }
        }
    }
}

/// Acks the cluster did not record because their topic holds [`CURSORS_PER_TOPIC_MAX`]
/// cursors: counted, and logged at most once per [`ACKS_REFUSED_LOG_INTERVAL`] (a refused
/// subscriber acks again at every message). Not retried: its next ack is tried afresh, and
/// is recorded once cursors are forgotten.
fn report_refused(app: &App, refused: &[AckRecord]) {
    app.metrics.acks_refused.inc_by(refused.len() as u64);
    // The ones still connected here are told by their session (a topic may have filled since
    // they subscribed). Marked under the lock on connections (taken before the acks' lock,
    // here as where a session ends), so that one ending meanwhile cannot leave its mark.
    {
        let connected = app.connected.lock().unwrap_or_else(|e| e.into_inner());
        let keys: Vec<Key> = refused
            .iter()
            .map(|a| (a.topic.clone(), a.subscriber_id.clone()))
            .filter(|key| connected.contains_key(key))
            .collect();
        if !keys.is_empty() {
            app.acks.mark_refused(keys);
        }
    }
    let mut reported_at = app.acks.refused_reported_at.lock().unwrap_or_else(|e| e.into_inner());
    if reported_at.is_some_and(|at| at.elapsed() < ACKS_REFUSED_LOG_INTERVAL) {
        return;
    }
    *reported_at = Some(std::time::Instant::now());
    let topics: BTreeSet<&str> = refused.iter().map(|a| a.topic.as_str()).collect();
    tracing::warn!(
        ?topics,
        count = refused.len(),
        "acks of new subscribers not recorded: each topic holds {CURSORS_PER_TOPIC_MAX} recorded cursors; \
         forget unused ones with DELETE /topics/:name/subscribers/:id (pubsub_acks_refused counts them)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_ack_per_subscription_the_node_may_serve_is_held() {
        let c = AckCoalescer::default();
        for i in 0..ACKS_PENDING_MAX + 1 {
            c.record("t", &i.to_string(), 1);
        }
        c.record("t", "0", 2);
        assert_eq!(c.dropped(), 1, "the one past the bound is dropped and counted; a held one moves");
        let taken = c.take();
        assert_eq!(taken.len(), ACKS_PENDING_MAX);
        assert_eq!(taken[&("t".to_string(), "0".to_string())], 2, "a held pair still takes newer acks");
    }

    #[test]
    fn a_refusal_is_taken_once() {
        let c = AckCoalescer::default();
        c.mark_refused(vec![("t".to_string(), "s".to_string())]);
        assert!(!c.record("t", "other", 1));
        assert!(c.record("t", "s", 1));
        assert!(!c.record("t", "s", 2), "told once per refusal");
    }

    /// A subscriber gone before its next ack leaves no mark: marks of subscribers gone would
    /// fill the set, and no subscriber connected later would be told.
    #[test]
    fn a_refusal_of_a_subscriber_gone_is_forgotten() {
        let c = AckCoalescer::default();
        let gone: Vec<Key> = (0..ACKS_PENDING_MAX).map(|i| ("t".to_string(), i.to_string())).collect();
        c.mark_refused(gone.clone());
        for key in &gone {
            c.forget_refused(key);
        }
        c.mark_refused(vec![("t".to_string(), "new".to_string())]);
        assert!(c.record("t", "new", 1), "a subscriber connected later is told");
        assert!(!c.record("t", "0", 1));
    }

    #[test]
    fn latest_ack_wins_and_restore_does_not_overwrite_newer() {
        let c = AckCoalescer::default();
        c.record("t", "s", 5);
        c.record("t", "s", 3);
        let taken = c.take();
        assert_eq!(taken[&("t".to_string(), "s".to_string())], 3);
        c.record("t", "s", 9);
        c.restore(taken);
        assert_eq!(c.take()[&("t".to_string(), "s".to_string())], 9);
    }
}
