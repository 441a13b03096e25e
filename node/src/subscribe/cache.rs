//! Serialized message frames shared by every subscriber of a topic.
//!
//! The first subscription to reach a message reads it from storage and serializes it; the
//! frame goes into its topic's ring, and every other subscription of that topic sends the very
//! same bytes (a reference-counted clone). A message's frame never changes once committed
//! (sequence → message is fixed by Raft, and trimming only removes), so a cached frame is
//! always valid. Rings are bounded by count and bytes, and all of them together by
//! [`FRAME_CACHE_BYTES_MAX`] (1,024 topics of 8 MiB each would otherwise hold 8 GiB); older frames
//! come from storage.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use axum::extract::ws::Utf8Bytes;

use crate::limits::{
    FRAME_CACHE_BYTES_MAX, FRAME_CACHE_BYTES_PER_TOPIC, FRAME_CACHE_FRAMES_PER_TOPIC, FRAME_CACHE_TOPICS_MAX,
};

/// Contiguous frames of one topic: `frames[i]` is sequence `first + i`.
#[derive(Default)]
struct Ring {
    first: u64,
    frames: VecDeque<Utf8Bytes>,
    bytes: usize,
}

impl Ring {
    fn end(&self) -> u64 {
        self.first + self.frames.len() as u64
    }
}

#[derive(Default)]
pub struct FrameCache {
    rings: Mutex<Rings>,
}

#[derive(Default)]
struct Rings {
    by_topic: HashMap<u64, Ring>,
    /// Bytes of every ring's frames.
    bytes: usize,
}

impl FrameCache {
    /// Cached frames for sequences `after + 1 ..`, in order: at most `max`, and none after the
    /// one that reaches `max_bytes` (a page from storage stops there too).
    pub fn get(&self, topic_id: u64, after: u64, max: usize, max_bytes: usize) -> Vec<(u64, Utf8Bytes)> {
        let rings = self.lock();
        let Some(ring) = rings.by_topic.get(&topic_id) else {
            return Vec::new();
        };
        let next = after + 1;
        if next < ring.first || next >= ring.end() {
            return Vec::new();
        }
        let skip = (next - ring.first) as usize;
        let mut bytes = 0;
        let mut page = Vec::new();
        for (i, frame) in ring.frames.iter().skip(skip).take(max).enumerate() {
            if bytes >= max_bytes {
                break;
            }
            bytes += frame.len();
            page.push((next + i as u64, frame.clone()));
        }
        page
    }

    /// Adds frames read from storage (contiguous, in order).
    pub fn put(&self, topic_id: u64, frames: &[(u64, Utf8Bytes)]) {
        let Some((first_seq, _)) = frames.first() else {
            return;
        };
        let mut rings = self.lock();
        let Rings { by_topic, bytes: total } = &mut *rings;
        if !by_topic.contains_key(&topic_id) && by_topic.len() >= FRAME_CACHE_TOPICS_MAX {
            evict_another(by_topic, total, topic_id);
        }
        let ring = by_topic.entry(topic_id).or_default();
        if !ring.frames.is_empty() && *first_seq < ring.first {
            // Older than the ring: a subscriber replaying from far behind. Moving the ring back
            // to it would make every subscriber at the tail miss and read storage, page after
            // page, as the replay and the tail take turns; it reads storage alone instead.
            return;
        }
        if ring.frames.is_empty() || *first_seq > ring.end() {
            // Past the ring's end: start it over at these frames.
            *total -= ring.bytes;
            *ring = Ring { first: *first_seq, frames: VecDeque::new(), bytes: 0 };
        }
        for (seq, frame) in frames {
            if *seq < ring.end() {
                continue; // already cached
            }
            debug_assert_eq!(*seq, ring.end());
            ring.bytes += frame.len();
            *total += frame.len();
            ring.frames.push_back(frame.clone());
        }
        while ring.frames.len() > FRAME_CACHE_FRAMES_PER_TOPIC || ring.bytes > FRAME_CACHE_BYTES_PER_TOPIC {
            match ring.frames.pop_front() {
                Some(old) => {
                    ring.bytes -= old.len();
                    *total -= old.len();
                    ring.first += 1;
                }
                None => break,
            }
        }
        // Over the budget of all topics: drop other topics' rings (their subscribers read
        // from storage again), this one's last.
        while *total > FRAME_CACHE_BYTES_MAX && evict_another(by_topic, total, topic_id) {}
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Rings> {
        // Every operation leaves the rings whole; a panic elsewhere cannot corrupt them.
        self.rings.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes cached over all topics.
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.lock().bytes
    }
}

/// Drops the ring of some topic other than `keep`; false when there is none.
fn evict_another(by_topic: &mut HashMap<u64, Ring>, total: &mut usize, keep: u64) -> bool {
    let Some(victim) = by_topic.keys().copied().find(|&t| t != keep) else {
        return false;
    };
    if let Some(ring) = by_topic.remove(&victim) {
        *total -= ring.bytes;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(range: std::ops::RangeInclusive<u64>) -> Vec<(u64, Utf8Bytes)> {
        range.map(|s| (s, Utf8Bytes::from(format!("f{s}")))).collect()
    }

    #[test]
    fn serves_contiguous_frames_after_a_cursor() {
        let c = FrameCache::default();
        c.put(1, &frames(5..=9));
        let got: Vec<u64> = c.get(1, 6, 10, usize::MAX).into_iter().map(|(s, _)| s).collect();
        assert_eq!(got, vec![7, 8, 9]);
        assert!(c.get(1, 3, 10, usize::MAX).is_empty(), "before the ring: storage");
        assert!(c.get(1, 9, 10, usize::MAX).is_empty(), "past the ring: nothing yet");
        assert!(c.get(2, 0, 10, usize::MAX).is_empty());
        c.put(1, &frames(8..=11));
        assert_eq!(c.get(1, 9, 10, usize::MAX).len(), 2);
        assert_eq!(c.get(1, 9, 10, usize::MAX)[1].1.as_str(), "f11");
    }

    #[test]
    fn a_gap_restarts_the_ring_and_size_is_bounded() {
        let c = FrameCache::default();
        c.put(1, &frames(1..=3));
        c.put(1, &frames(10..=12));
        assert!(c.get(1, 1, 10, usize::MAX).is_empty());
        assert_eq!(c.get(1, 9, 10, usize::MAX).len(), 3);
        let many = FRAME_CACHE_FRAMES_PER_TOPIC as u64 + 10;
        c.put(1, &frames(13..=many + 12));
        assert!(c.get(1, 12, 1, usize::MAX).is_empty(), "oldest frames were evicted");
        assert_eq!(c.get(1, many + 11, 10, usize::MAX).len(), 1);
    }

    #[test]
    fn a_page_stops_at_the_frame_that_reaches_the_byte_bound() {
        let c = FrameCache::default();
        c.put(1, &frames(10..=19)); // "f10".."f19", 3 bytes each
        let sequences = |page: Vec<(u64, Utf8Bytes)>| page.into_iter().map(|(s, _)| s).collect::<Vec<_>>();
        assert_eq!(sequences(c.get(1, 9, 100, 7)), vec![10, 11, 12], "the frame that crosses is in");
        assert_eq!(sequences(c.get(1, 9, 100, 6)), vec![10, 11]);
        assert_eq!(sequences(c.get(1, 9, 100, 1)), vec![10], "one frame at least");
    }

    #[test]
    fn pages_older_than_the_ring_never_move_it_back() {
        let c = FrameCache::default();
        c.put(1, &frames(100..=110));
        c.put(1, &frames(1..=5));
        assert!(c.get(1, 0, 10, usize::MAX).is_empty(), "the replay's page was not cached");
        assert_eq!(c.get(1, 104, 10, usize::MAX).len(), 6, "the tail's frames stayed");
    }

    #[test]
    fn all_topics_together_stay_within_the_byte_budget() {
        let c = FrameCache::default();
        let frame = Utf8Bytes::from("x".repeat(64 * 1024));
        let per_topic = FRAME_CACHE_BYTES_PER_TOPIC / frame.len();
        let topics = (FRAME_CACHE_BYTES_MAX / FRAME_CACHE_BYTES_PER_TOPIC) as u64 * 2;
        for topic in 1..=topics {
            let ring: Vec<_> = (1..=per_topic as u64).map(|s| (s, frame.clone())).collect();
            c.put(topic, &ring);
            assert!(c.bytes() <= FRAME_CACHE_BYTES_MAX, "{} bytes cached", c.bytes());
            assert_eq!(c.get(topic, 0, usize::MAX, usize::MAX).len(), per_topic, "the topic just put is kept whole");
        }
        // Accounting matches the rings left.
        let rings = c.lock();
        assert_eq!(rings.bytes, rings.by_topic.values().map(|r| r.bytes).sum::<usize>());
    }
}
