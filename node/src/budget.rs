//! A budget of bytes that waiting work draws on: a semaphore whose permits are bytes.

use std::sync::Arc;

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
}
