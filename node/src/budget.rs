//! A budget of bytes that waiting work draws on: a semaphore whose permits are bytes.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// At most `max` bytes held at once; past it, [`ByteBudget::take`] waits for room. Clones
/// share the budget.
#[derive(Clone)]
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

    /// [`ByteBudget::take`] if the bytes are free now (and no earlier take is waiting).
    pub fn try_take(&self, bytes: usize) -> Option<OwnedSemaphorePermit> {
        let weight = bytes.clamp(1, self.max) as u32;
        self.permits.clone().try_acquire_many_owned(weight).ok()
    }

    /// Whether anything besides this handle refers to the budget: another clone, or a permit
    /// taken from it (which keeps the semaphore alive too).
    fn in_use(&self) -> bool {
        Arc::strong_count(&self.permits) > 1
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

    /// `data` as bytes that keep `permits` until the last of their clones is dropped: a
    /// response body holds its share of the budget until the server has sent it.
    pub fn hold<P: Send + 'static>(data: Vec<u8>, permits: P) -> Bytes {
        Bytes::from_owner(Held { data, _permits: permits })
    }
}

/// Room in a node-wide budget and, when the client is known, in its client's share of it:
/// taken from the client's share first, so that one client waits behind its own work, and
/// held with what it was taken for. Work that reserves its worst case shrinks the room once
/// it knows its size; work that grows (a body arriving in chunks) merges more into it.
pub struct Room {
    own: Option<OwnedSemaphorePermit>,
    node: OwnedSemaphorePermit,
}

impl Room {
    /// Waits for `bytes` in `own` (the client's share), then in `node`; each wait ends by
    /// `deadline` or fails with the `Err` of the budget that had no room.
    pub async fn take(
        node: &ByteBudget,
        own: Option<&ByteBudget>,
        bytes: usize,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Room, RoomFull> {
        async fn within<T>(deadline: Option<tokio::time::Instant>, wait: impl Future<Output = T>) -> Option<T> {
            match deadline {
                Some(deadline) => tokio::time::timeout_at(deadline, wait).await.ok(),
                None => Some(wait.await),
            }
        }
        let own = match own {
            Some(own) => Some(within(deadline, own.take(bytes)).await.ok_or(RoomFull::Client)?),
            None => None,
        };
        let node = within(deadline, node.take(bytes)).await.ok_or(RoomFull::Node)?;
        Ok(Room { own, node })
    }

    /// [`Room::take`] if both budgets have the bytes free now.
    pub fn try_take(node: &ByteBudget, own: Option<&ByteBudget>, bytes: usize) -> Option<Room> {
        let own = match own {
            Some(own) => Some(own.try_take(bytes)?),
            None => None,
        };
        Some(Room { own, node: node.try_take(bytes)? })
    }

    /// Bytes held of the node's budget.
    pub fn bytes(&self) -> usize {
        self.node.num_permits()
    }

    /// Holds `more` with this room. Both must have been taken from the same budgets.
    pub fn merge(&mut self, more: Room) {
        self.node.merge(more.node);
        match (self.own.as_mut(), more.own) {
            (Some(own), Some(more)) => own.merge(more),
            (None, None) => {}
            _ => unreachable!("rooms merged are taken from the same budgets"),
        }
    }

    /// Gives back what is held beyond `bytes`.
    pub fn shrink(&mut self, bytes: usize) {
        ByteBudget::shrink(&mut self.node, bytes);
        if let Some(own) = self.own.as_mut() {
            ByteBudget::shrink(own, bytes);
        }
    }

    /// `body`, holding its size of the room until the last of its bytes is dropped.
    pub fn hold(mut self, body: Vec<u8>) -> Bytes {
        self.shrink(body.len());
        ByteBudget::hold(body, self)
    }
}

/// Which budget of a [`Room`] had no room in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoomFull {
    Client,
    Node,
}

struct Held<P> {
    data: Vec<u8>,
    _permits: P,
}

impl<P> AsRef<[u8]> for Held<P> {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

/// A budget of `max` bytes for each client: what one client may hold of a budget all share,
/// so that one client cannot take all of it. A client is an IPv4 address, or an IPv6 /64
/// ([`client_of`]).
pub struct PerClientBudgets {
    max: usize,
    clients: Mutex<Clients>,
}

struct Clients {
    by_ip: HashMap<IpAddr, ByteBudget>,
    /// Clients tracked when those unused are next forgotten: twice as many as were left in
    /// use at the last pruning, so that with many clients each connected (every budget in
    /// use) a new one does not scan them all.
    prune_at: usize,
}

/// The leading bits of an IPv6 address that name one client: a host is usually given a whole
/// /64 (SLAAC, privacy addresses), so a budget per address would give one host billions.
const IPV6_CLIENT_PREFIX_BITS: u32 = 64;

/// The client an address belongs to: an IPv4 address (also when written as an IPv4-mapped
/// IPv6 one, as a dual-stack listener sees it) is its own; an IPv6 address counts as its /64.
fn client_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mask = u128::MAX << (128 - IPV6_CLIENT_PREFIX_BITS);
                IpAddr::V6((u128::from(v6) & mask).into())
            }
        },
    }
}

/// Clients tracked before those whose budget nothing refers to are forgotten.
const CLIENTS_TRACKED_BEFORE_PRUNING: usize = 1024;

impl PerClientBudgets {
    pub fn new(max: usize) -> Self {
        Self { max, clients: Mutex::new(Clients { by_ip: HashMap::new(), prune_at: CLIENTS_TRACKED_BEFORE_PRUNING }) }
    }

    /// The budget of the client at `ip` ([`client_of`]).
    pub fn of(&self, ip: IpAddr) -> ByteBudget {
        let ip = client_of(ip);
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(budget) = clients.by_ip.get(&ip) {
            return budget.clone();
        }
        if clients.by_ip.len() >= clients.prune_at {
            // A budget that nothing else refers to (no permit taken from it, no clone kept by a
            // connection) is as good as a new one.
            clients.by_ip.retain(|_, budget| budget.in_use());
            clients.prune_at = (2 * clients.by_ip.len()).max(CLIENTS_TRACKED_BEFORE_PRUNING);
        }
        clients.by_ip.entry(ip).or_insert_with(|| ByteBudget::new(self.max)).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_client_is_its_slash_64_and_a_mapped_ipv4_its_address() {
        let clients = PerClientBudgets::new(10);
        let budget = |ip: &str| clients.of(ip.parse().unwrap());
        let held = budget("2001:db8:1:2::1").try_take(6).expect("room");
        assert_eq!(budget("2001:db8:1:2:ffff:ffff:ffff:ffff").held(), 6, "same /64, same client");
        assert_eq!(budget("2001:db8:1:3::1").held(), 0, "another /64, another client");
        let v4 = budget("192.0.2.7").try_take(3).expect("room");
        assert_eq!(budget("::ffff:192.0.2.7").held(), 3, "an IPv4-mapped address is the IPv4 client");
        assert_eq!(budget("192.0.2.8").held(), 0);
        drop((held, v4));
    }

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
    async fn a_try_take_never_waits() {
        let budget = ByteBudget::new(10);
        let seven = budget.try_take(7).expect("room for it");
        assert!(budget.try_take(4).is_none());
        assert_eq!(budget.try_take(3).map(|p| p.num_permits()), Some(3));
        drop(seven);
        assert_eq!(budget.try_take(1_000).map(|p| p.num_permits()), Some(10));
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

    #[tokio::test]
    async fn each_client_has_its_own_budget_and_idle_ones_are_forgotten() {
        let clients = PerClientBudgets::new(10);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let held = clients.of(a).take(10).await;
        // The same client waits; another does not.
        assert!(tokio::time::timeout(std::time::Duration::from_millis(20), clients.of(a).take(1)).await.is_err());
        drop(clients.of(b).take(10).await);
        // Kept by a connection, holding nothing right now.
        let kept = clients.of("10.0.0.3".parse().unwrap());
        for i in 0..CLIENTS_TRACKED_BEFORE_PRUNING as u32 {
            drop(clients.of(IpAddr::from(i.to_be_bytes())).take(1).await);
        }
        let tracked = clients.clients.lock().unwrap().by_ip.len();
        assert!(tracked < CLIENTS_TRACKED_BEFORE_PRUNING, "{tracked} clients tracked");
        // Pruning kept the budget still held from, and the one still kept.
        assert_eq!(clients.of(a).held(), 10);
        assert!(Arc::ptr_eq(&clients.of("10.0.0.3".parse().unwrap()).permits, &kept.permits));
        drop(held);
        assert_eq!(clients.of(a).held(), 0);
    }

    /// Clients that all stay connected are not scanned again at each new one: the next pruning
    /// waits until twice as many as it left are tracked.
    #[test]
    fn clients_all_in_use_are_pruned_at_doubling_counts() {
        let clients = PerClientBudgets::new(10);
        let kept: Vec<ByteBudget> =
            (0..3 * CLIENTS_TRACKED_BEFORE_PRUNING as u32).map(|i| clients.of(IpAddr::from(i.to_be_bytes()))).collect();
        let prune_at = clients.clients.lock().unwrap().prune_at;
        assert_eq!(prune_at, 4 * CLIENTS_TRACKED_BEFORE_PRUNING, "pruned at 1024 and at 2048, none let go");
        drop(kept);
        // 3,072 tracked: the 1,025th new client reaches 4,096 and prunes every one let go.
        for i in 0..=CLIENTS_TRACKED_BEFORE_PRUNING as u32 {
            clients.of(IpAddr::from((1u32 << 31 | i).to_be_bytes()));
        }
        let tracked = clients.clients.lock().unwrap().by_ip.len();
        assert_eq!(tracked, 1, "those let go were pruned");
    }
}
