//! A budget of bytes that waiting work draws on: a semaphore whose permits are bytes.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// At most `max` bytes held at once; past it, [`ByteBudget::take`] waits for room.
pub struct ByteBudget {
    permits: Arc<Semaphore>,
    max: usize,
}

impl ByteBudget {
    /// A budget of `max` bytes (at most `u32::MAX`: a permit count is a `u32`).
    pub fn new(max: usize) -> ByteBudget {
        assert!(u32::try_from(max).is_ok(), "a byte budget is at most u32::MAX");
        ByteBudget { permits: Arc::new(Semaphore::new(max)), max }
    }

    /// Waits until `bytes` are free and holds them until the permit is dropped. Counted as at
    /// least 1 and at most the whole budget, so that anything can pass, alone if it must.
    pub async fn take(&self, bytes: usize) -> OwnedSemaphorePermit {
        let weight = bytes.clamp(1, self.max) as u32;
        // The semaphore is never closed.
        self.permits.clone().acquire_many_owned(weight).await.expect("a byte budget is never closed")
    }

    /// Bytes taken and not yet given back.
    pub fn held(&self) -> usize {
        self.max - self.permits.available_permits()
    }

    /// Gives back what `permit` holds beyond `bytes` (at least 1 is kept): for work that
    /// reserved its worst case before it knew its size.
    pub fn shrink(permit: &mut OwnedSemaphorePermit, bytes: usize) {
        let excess = permit.num_permits().saturating_sub(bytes.max(1));
        drop(permit.split(excess));
    }

    /// `data` as bytes that keep `permit` until the last of their clones is dropped: a
    /// response body holds its share of the budget until the server has sent it.
    pub fn hold(data: Vec<u8>, permit: OwnedSemaphorePermit) -> Bytes {
        Bytes::from_owner(Held { data, _permit: permit })
    }
}

struct Held {
    data: Vec<u8>,
    _permit: OwnedSemaphorePermit,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn takes_wait_for_room_and_oversized_ones_take_everything() {
        let budget = ByteBudget::new(10);
        let seven = budget.take(7).await;
        assert!(tokio::time::timeout(std::time::Duration::from_millis(20), budget.take(4)).await.is_err());
        drop(seven);
        let all = budget.take(1_000).await;
        assert_eq!(all.num_permits(), 10);
        drop(all);
        assert_eq!(budget.take(0).await.num_permits(), 1);
    }

    #[tokio::test]
    async fn a_shrunk_permit_gives_back_its_excess_at_once() {
        let budget = ByteBudget::new(10);
        let mut reserved = budget.take(8).await;
        ByteBudget::shrink(&mut reserved, 3);
        assert_eq!(reserved.num_permits(), 3);
        assert_eq!(budget.held(), 3);
        assert_eq!(budget.take(7).await.num_permits(), 7);
        ByteBudget::shrink(&mut reserved, 0);
        assert_eq!(reserved.num_permits(), 1);
        ByteBudget::shrink(&mut reserved, 50);
        assert_eq!(reserved.num_permits(), 1);
    }

    #[tokio::test]
    async fn held_bytes_keep_their_share_until_the_last_clone_is_dropped() {
        let budget = ByteBudget::new(10);
        let body = ByteBudget::hold(b"abc".to_vec(), budget.take(6).await);
        let clone = body.slice(1..);
        drop(body);
        assert_eq!(&clone[..], b"bc");
        assert!(tokio::time::timeout(std::time::Duration::from_millis(20), budget.take(5)).await.is_err());
        drop(clone);
        assert_eq!(budget.held(), 0);
        assert_eq!(budget.take(10).await.num_permits(), 10);
    }
}
