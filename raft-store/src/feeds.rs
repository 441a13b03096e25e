//! Wake-ups for subscribers and long-polls when entries are applied.
//!
//! One `watch` per topic that has someone waiting: the apply loop only replaces a small
//! value, it never waits for or copies to a subscriber, so a slow subscriber cannot slow it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use tokio::sync::watch;

use crate::command::TopicRecord;
use crate::limits::DELETIONS_REMEMBERED;
use crate::rules::Topics;

/// What a subscriber needs to know about its topic after a change.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TopicSignal {
    pub current_sequence: u64,
    pub first_sequence: u64,
    pub deleted: bool,
    /// False when the topic has never existed.
    pub exists: bool,
    /// Deletions of the topic this node applied since the watch was made (a subscriber
    /// compares it with the count it started with). A topic deleted and created again in one
    /// apply shows `deleted: false`; this says it was deleted all the same.
    pub deletions: u64,
    /// `current_sequence` at the latest deletions: deletion `n` at `n % DELETIONS_REMEMBERED`
    /// (see [`TopicSignal::deleted_after`]).
    ends: [u64; DELETIONS_REMEMBERED],
    /// When the topic was last created (a revive sets it again): how a snapshot install,
    /// which skips the entries in between, tells that the topic was deleted and revived.
    pub created_at: u64,
}

impl TopicSignal {
    /// The signal after `self` once the topic became `record` through `deletions` (each at
    /// its `current_sequence`, in order): the deletion count carries over, plus those.
    pub fn after(&self, record: Option<&TopicRecord>, deletions: &[u64]) -> Self {
        let mut next = Self { deletions: self.deletions, ends: self.ends, ..Self::of(record) };
        for &end in deletions {
            next.deletions += 1;
            next.ends[(next.deletions % DELETIONS_REMEMBERED as u64) as usize] = end;
        }
        next
    }

    /// Where the first deletion after the `since`-th ended the topic: a subscriber that
    /// started when `deletions` was `since` is owed messages up to there, then the notice,
    /// even if the topic was created again and deleted again since. Past what is remembered,
    /// the oldest deletion remembered (later than the first, never earlier).
    pub fn deleted_after(&self, since: u64) -> u64 {
        let oldest_remembered = self.deletions.saturating_sub(DELETIONS_REMEMBERED as u64 - 1);
        let first = (since + 1).max(oldest_remembered);
        self.ends[(first % DELETIONS_REMEMBERED as u64) as usize]
    }

    /// The deletion count a subscriber at `cursor`, started when the count was `since`, is to
    /// compare with: deletions since then that ended the topic below its cursor are passed,
    /// not owed. Sequences go on across a re-creation, so such a cursor is in a later
    /// incarnation (read on a node further along), and nothing before those deletions is owed.
    /// Past what is remembered, [`TopicSignal::deleted_after`] answers a later end, so an older
    /// deletion is passed only if that one is too. Counts the deletions since `since`, at
    /// most those applied while one request waited.
    pub fn deletions_passed(&self, since: u64, cursor: u64) -> u64 {
        let mut base = since;
        while base < self.deletions && self.deleted_after(base) < cursor {
            base += 1;
        }
        base
    }

    pub fn of(record: Option<&TopicRecord>) -> Self {
        match record {
            Some(r) => Self {
                current_sequence: r.current_sequence,
                first_sequence: r.first_sequence,
                deleted: r.deleted,
                exists: true,
                created_at: r.created_at,
                ..Self::default()
            },
            None => Self::default(),
        }
    }
}

/// A topic's watch, and the topic as it was when the watch was made.
pub struct TopicWatch {
    pub feed: watch::Receiver<TopicSignal>,
    /// The topic's record; `None` when it has never existed.
    pub record: Option<TopicRecord>,
    /// The watch's value at the same moment as `record`.
    pub signal: TopicSignal,
}

/// The registry of topic watches, shared by the state machine (sender side) and the node.
pub struct Feeds {
    watchers: Mutex<HashMap<String, watch::Sender<TopicSignal>>>,
    /// Index of the last applied log entry.
    applied: watch::Sender<u64>,
}

impl Default for Feeds {
    fn default() -> Self {
        Self { watchers: Mutex::new(HashMap::new()), applied: watch::channel(0).0 }
    }
}

impl Feeds {
    /// Watches `topic`. The receiver sees every change applied after this call.
    pub fn watch_topic(&self, topics: &RwLock<Topics>, topic: &str) -> watch::Receiver<TopicSignal> {
        self.watch_topic_with_record(topics, topic).feed
    }

    /// Watches `topic`, with its record and the watch's signal as of the same moment: both
    /// read under the watchers lock, which `apply` and snapshot installs hold while they
    /// change topics and signal, so no change can fall between the read and the subscription.
    pub fn watch_topic_with_record(&self, topics: &RwLock<Topics>, topic: &str) -> TopicWatch {
        let mut watchers = self.lock();
        let record = topics.read().unwrap_or_else(|e| e.into_inner()).by_name.get(topic).cloned();
        let feed = match watchers.get(topic) {
            Some(sender) => sender.subscribe(),
            None => {
                let (sender, receiver) = watch::channel(TopicSignal::of(record.as_ref()));
                watchers.insert(topic.to_string(), sender);
                receiver
            }
        };
        // Read here, not by the caller later: a deletion applied in between would count in
        // the baseline, and a subscriber of the old topic would never hear of it.
        let signal = *feed.borrow();
        TopicWatch { feed, record, signal }
    }

    /// Watches the applied log index.
    pub fn watch_applied(&self) -> watch::Receiver<u64> {
        self.applied.subscribe()
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, HashMap<String, watch::Sender<TopicSignal>>> {
        self.watchers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Called by `apply` with the watchers lock held and the topics already updated;
    /// `deletions` are `current_sequence` at each deletion that apply made, in order.
    pub(crate) fn notify(
        watchers: &mut HashMap<String, watch::Sender<TopicSignal>>,
        record: &TopicRecord,
        deletions: &[u64],
    ) {
        if let Some(sender) = watchers.get(&record.name) {
            if sender.receiver_count() == 0 {
                watchers.remove(&record.name);
            } else {
                sender.send_modify(|signal| *signal = signal.after(Some(record), deletions));
            }
        }
    }

    pub(crate) fn notify_applied(&self, index: u64) {
        self.applied.send_replace(index);
    }

    /// After a snapshot install every topic may have changed, and may have been deleted in
    /// the entries the install skipped (see [`skipped_deletion`]).
    /// Called with the watchers lock held (`watchers`), the topics already replaced.
    pub(crate) fn notify_all(watchers: &mut HashMap<String, watch::Sender<TopicSignal>>, topics: &Topics) {
        watchers.retain(|name, sender| {
            sender.send_modify(|signal| {
                let record = topics.by_name.get(name);
                *signal = signal.after(record, skipped_deletion(signal, record).as_slice());
            });
            sender.receiver_count() > 0
        });
    }
}

/// The deletion a snapshot install skipped over, if the topic went from `before` to `after`
/// through one, and the sequence to deliver up to before announcing it: the topic's current
/// end. Deleted now, that is where it stopped taking publishes. Live before and created again
/// since, where it was deleted is not in the snapshot (a re-created topic goes on from the
/// sequences it had); any end below the current one could skip messages published before the
/// deletion, which a subscriber that stops at `topic_deleted` would never see and never be
/// told of. So it is delivered up to the current end: at least once, never a silent gap,
/// at the price of the messages published since the re-creation arriving before the notice.
fn skipped_deletion(before: &TopicSignal, after: Option<&TopicRecord>) -> Option<u64> {
    let after = after?;
    if !before.exists {
        return None;
    }
    let recreated = after.created_at != before.created_at;
    match (before.deleted, after.deleted, recreated) {
        (false, true, _) | (true, true, true) | (false, false, true) => Some(after.current_sequence),
        _ => None,
    }
}

/// Shared handle to the feeds.
pub type SharedFeeds = Arc<Feeds>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deletions_past_those_remembered_end_at_the_oldest_remembered() {
        let ends: Vec<u64> = (1..=DELETIONS_REMEMBERED as u64 + 2).map(|n| n * 10).collect();
        let signal = TopicSignal::default().after(None, &ends);
        assert_eq!(signal.deletions, ends.len() as u64);
        // The last DELETIONS_REMEMBERED are exact.
        for since in 2..ends.len() as u64 {
            assert_eq!(signal.deleted_after(since), (since + 1) * 10);
        }
        // Older ones fall back to the oldest remembered: later, never earlier.
        assert_eq!(signal.deleted_after(0), 30);
        assert_eq!(signal.deleted_after(1), 30);
    }

    /// Deleted at 10, 20 and 30: a cursor of 25 is in the incarnation the third deletion
    /// ended, so the first two are passed; one at a deletion's end is owed its notice.
    #[test]
    fn deletions_below_the_cursor_are_passed() {
        let signal = TopicSignal::default().after(None, &[10, 20, 30]);
        assert_eq!(signal.deletions_passed(0, 25), 2);
        assert_eq!(signal.deletions_passed(0, 20), 1, "the deletion at 20 is owed to a cursor at 20");
        assert_eq!(signal.deletions_passed(0, 5), 0);
        assert_eq!(signal.deletions_passed(0, 31), 3, "every deletion passed");
        assert_eq!(signal.deletions_passed(2, 25), 2, "counted from where the subscriber started");
        assert_eq!(signal.deletions_passed(3, 99), 3);
        // Past those remembered: every deletion before the oldest remembered one is passed too.
        let ends: Vec<u64> = (1..=DELETIONS_REMEMBERED as u64 + 2).map(|n| n * 10).collect();
        let many = TopicSignal::default().after(None, &ends);
        assert_eq!(many.deletions_passed(0, 35), 3);
        assert_eq!(many.deletions_passed(0, 1000), ends.len() as u64);
    }
}
