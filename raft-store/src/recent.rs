//! The newest log entries, kept decoded in memory.
//!
//! Right after an entry is appended, openraft reads it back two or three times: once per
//! follower to replicate it, and once to apply it. Served from the segment files, each read decodes the
//! entry again (every message id allocated, every payload copied). This window holds the tail
//! of the log as it was appended, so those reads clone the entry instead. It always ends at
//! the last appended entry (appends extend it, a truncation cuts it), so a read that starts
//! inside the window is answered in full from it; older entries come from the segment files.

use std::collections::VecDeque;

use crate::typ::Entry;

/// A contiguous run of the log's newest entries, each with its stored size.
#[derive(Default)]
pub struct RecentEntries {
    /// Index of `entries[0]`.
    first: u64,
    entries: VecDeque<(Entry, usize)>,
    bytes: usize,
    bytes_max: usize,
}

impl RecentEntries {
    pub fn new(bytes_max: usize) -> Self {
        Self { bytes_max, ..Self::default() }
    }

    fn end(&self) -> u64 {
        self.first + self.entries.len() as u64
    }

    /// Records appended entries (with their stored sizes), in log order.
    pub fn appended(&mut self, appended: Vec<(Entry, usize)>) {
        let Some((head, _)) = appended.first() else {
            return;
        };
        if self.entries.is_empty() || head.log_id.index != self.end() {
            // Not contiguous with the window (a restart, or a gap): start it over here.
            self.entries.clear();
            self.bytes = 0;
            self.first = head.log_id.index;
        }
        for (entry, size) in appended {
            self.bytes += size;
            self.entries.push_back((entry, size));
        }
        while self.bytes > self.bytes_max && self.entries.len() > 1 {
            if let Some((_, size)) = self.entries.pop_front() {
                self.bytes -= size;
                self.first += 1;
            }
        }
    }

    /// Forgets the entries from `index` on (the log was truncated there).
    pub fn truncated(&mut self, index: u64) {
        while !self.entries.is_empty() && self.end() > index {
            if let Some((_, size)) = self.entries.pop_back() {
                self.bytes -= size;
            }
        }
    }

    /// Forgets the entries up to and including `index` (the log was purged up to there).
    pub fn purged(&mut self, index: u64) {
        while self.first <= index && !self.entries.is_empty() {
            if let Some((_, size)) = self.entries.pop_front() {
                self.bytes -= size;
                self.first += 1;
            }
        }
    }

    /// Entries in `[start, end)`, stopping before the one that would take the stored bytes
    /// past `bytes_max` (the first is always returned); `None` when `start` is not in the
    /// window, so the caller reads RocksDB.
    pub fn read(&self, start: u64, end: u64, bytes_max: usize) -> Option<Vec<Entry>> {
        if start < self.first || start >= self.end() {
            return None;
        }
        let mut out = Vec::new();
        let mut bytes = 0usize;
        for (entry, size) in self.entries.iter().skip((start - self.first) as usize) {
            bytes = bytes.saturating_add(*size);
            if entry.log_id.index >= end || (bytes > bytes_max && !out.is_empty()) {
                break;
            }
            out.push(entry.clone());
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::typ::LogId;
    use openraft::{CommittedLeaderId, EntryPayload};

    fn entry(index: u64) -> (Entry, usize) {
        (Entry { log_id: LogId::new(CommittedLeaderId::new(1, 1), index), payload: EntryPayload::Blank }, 10)
    }

    fn entries(range: std::ops::RangeInclusive<u64>) -> Vec<(Entry, usize)> {
        range.map(entry).collect()
    }

    fn indexes(read: Option<Vec<Entry>>) -> Option<Vec<u64>> {
        read.map(|es| es.iter().map(|e| e.log_id.index).collect())
    }

    #[test]
    fn reads_inside_the_window_and_defers_the_rest() {
        let mut r = RecentEntries::new(1000);
        assert_eq!(indexes(r.read(0, 5, usize::MAX)), None, "empty");
        r.appended(entries(5..=9));
        assert_eq!(indexes(r.read(6, 8, usize::MAX)), Some(vec![6, 7]));
        assert_eq!(indexes(r.read(8, u64::MAX, usize::MAX)), Some(vec![8, 9]));
        assert_eq!(indexes(r.read(4, 8, usize::MAX)), None, "older than the window: RocksDB");
        assert_eq!(indexes(r.read(10, 12, usize::MAX)), None, "past the log's end");
        assert_eq!(indexes(r.read(5, 10, 25)), Some(vec![5, 6]), "bytes bound");
        assert_eq!(indexes(r.read(5, 10, 1)), Some(vec![5]), "the first entry always");
    }

    #[test]
    fn truncation_and_purge_cut_the_window() {
        let mut r = RecentEntries::new(1000);
        r.appended(entries(1..=10));
        r.truncated(8);
        assert_eq!(indexes(r.read(7, u64::MAX, usize::MAX)), Some(vec![7]));
        assert_eq!(indexes(r.read(8, u64::MAX, usize::MAX)), None);
        r.appended(entries(8..=9));
        assert_eq!(indexes(r.read(7, u64::MAX, usize::MAX)), Some(vec![7, 8, 9]));
        r.purged(3);
        assert_eq!(indexes(r.read(3, 5, usize::MAX)), None);
        assert_eq!(indexes(r.read(4, 5, usize::MAX)), Some(vec![4]));
        r.truncated(2);
        assert_eq!(indexes(r.read(4, 5, usize::MAX)), None, "everything was truncated");
        r.purged(20);
        r.appended(entries(21..=22));
        assert_eq!(indexes(r.read(21, 23, usize::MAX)), Some(vec![21, 22]));
    }

    #[test]
    fn a_gap_restarts_the_window_and_its_size_is_bounded() {
        let mut r = RecentEntries::new(35);
        r.appended(entries(1..=3));
        r.appended(entries(7..=8));
        assert_eq!(indexes(r.read(2, 9, usize::MAX)), None);
        assert_eq!(indexes(r.read(7, 9, usize::MAX)), Some(vec![7, 8]));
        r.appended(entries(9..=12));
        assert_eq!(indexes(r.read(9, 13, usize::MAX)), None, "evicted: 35 bytes hold three entries");
        assert_eq!(indexes(r.read(10, 13, usize::MAX)), Some(vec![10, 11, 12]));
    }
}
