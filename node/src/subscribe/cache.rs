//! Serialized message frames shared by every subscriber of a topic.
//!
//! The first subscription to reach a message reads it from storage and serializes it; the
//! frame goes into its topic's ring, and every other subscription of that topic sends the very
//! same bytes (a reference-counted clone). A message's frame never changes once committed
//! (sequence → message is fixed by Raft, and trimming only removes), so a cached frame is
//! always valid. Rings are bounded by count and bytes; older frames come from storage.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use axum::extract::ws::Utf8Bytes;

use crate::limits::{FRAME_CACHE_BYTES_PER_TOPIC, FRAME_CACHE_FRAMES_PER_TOPIC, FRAME_CACHE_TOPICS_MAX};

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
    topics: Mutex<HashMap<u64, Ring>>,
}

impl FrameCache {
    /// Cached frames for sequences `after + 1 ..`, at most `max`, in order.
    pub fn get(&self, topic_id: u64, after: u64, max: usize) -> Vec<(u64, Utf8Bytes)> {
        let topics = self.topics.lock().unwrap_or_else(|e| e.into_inner());
        let Some(ring) = topics.get(&topic_id) else {
            return Vec::new();
        };
        let next = after + 1;
        if next < ring.first || next >= ring.end() {
            return Vec::new();
        }
        let skip = (next - ring.first) as usize;
        ring.frames.iter().skip(skip).take(max).enumerate().map(|(i, f)| (next + i as u64, f.clone())).collect()
    }

    /// Adds frames read from storage (contiguous, in order).
    pub fn put(&self, topic_id: u64, frames: &[(u64, Utf8Bytes)]) {
        let Some((first_seq, _)) = frames.first() else {
            return;
        };
        let mut topics = self.topics.lock().unwrap_or_else(|e| e.into_inner());
        if !topics.contains_key(&topic_id) && topics.len() >= FRAME_CACHE_TOPICS_MAX {
            // Full: drop some other topic's ring; its subscribers read from storage again.
            if let Some(victim) = topics.keys().next().copied() {
                topics.remove(&victim);
            }
        }
        let ring = topics.entry(topic_id).or_default();
        if ring.frames.is_empty() || *first_seq > ring.end() || *first_seq < ring.first {
            // Not contiguous with what is cached: start the ring over at these frames.
            *ring = Ring { first: *first_seq, frames: VecDeque::new(), bytes: 0 };
        }
        for (seq, frame) in frames {
            if *seq < ring.end() {
                continue; // already cached
            }
            debug_assert_eq!(*seq, ring.end());
            ring.bytes += frame.len();
            ring.frames.push_back(frame.clone());
        }
        while ring.frames.len() > FRAME_CACHE_FRAMES_PER_TOPIC || ring.bytes > FRAME_CACHE_BYTES_PER_TOPIC {
            match ring.frames.pop_front() {
                Some(old) => {
                    ring.bytes -= old.len();
                    ring.first += 1;
                }
                None => break,
            }
        }
    }
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
        let got: Vec<u64> = c.get(1, 6, 10).into_iter().map(|(s, _)| s).collect();
        assert_eq!(got, vec![7, 8, 9]);
        assert!(c.get(1, 3, 10).is_empty(), "before the ring: storage");
        assert!(c.get(1, 9, 10).is_empty(), "past the ring: nothing yet");
        assert!(c.get(2, 0, 10).is_empty());
        c.put(1, &frames(8..=11));
        assert_eq!(c.get(1, 9, 10).len(), 2);
        assert_eq!(c.get(1, 9, 10)[1].1.as_str(), "f11");
    }

    #[test]
    fn a_gap_restarts_the_ring_and_size_is_bounded() {
        let c = FrameCache::default();
        c.put(1, &frames(1..=3));
        c.put(1, &frames(10..=12));
        assert!(c.get(1, 1, 10).is_empty());
        assert_eq!(c.get(1, 9, 10).len(), 3);
        let many = FRAME_CACHE_FRAMES_PER_TOPIC as u64 + 10;
        c.put(1, &frames(13..=many + 12));
        assert!(c.get(1, 12, 1).is_empty(), "oldest frames were evicted");
        assert_eq!(c.get(1, many + 11, 10).len(), 1);
    }
}
