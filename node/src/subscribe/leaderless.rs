//! Subscriptions on a node cut off from its cluster move elsewhere.
//!
//! A node with no leader it hears from (a follower partitioned from the others, or a leader
//! that lost its quorum; see [`App::leaderless`]) applies nothing new, so its subscribers would wait, connected and pinged, until the
//! partition heals, while the rest of the cluster goes on. Once it has had no leader for
//! [`leaderless_close_after`], its subscriptions close with 1013 and their clients resume with
//! their cursor on another node. Once per leaderless spell: a subscription started during it
//! (the client had nowhere else to go) stays until the node loses its leader again.

use std::sync::Weak;
use std::time::Duration;

use crate::app::App;
use crate::limits::{
    LEADERLESS_CHECK_INTERVAL, SUBSCRIBE_LEADERLESS_CLOSE_AFTER, SUBSCRIBE_LEADERLESS_ELECTION_TIMEOUTS,
};

/// How long a node goes without a leader before its subscriptions close: long enough for an
/// election to end first, whatever the election timeout.
pub fn leaderless_close_after(election_timeout_ms: u64) -> Duration {
    SUBSCRIBE_LEADERLESS_CLOSE_AFTER
        .max(Duration::from_millis(election_timeout_ms) * SUBSCRIBE_LEADERLESS_ELECTION_TIMEOUTS)
}

/// Marks each of the node's leaderless spells that lasted [`leaderless_close_after`] with when
/// it began: a session open then closes.
pub async fn count_spells(app: Weak<App>) {
    let mut interval = tokio::time::interval(LEADERLESS_CHECK_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut since: Option<tokio::time::Instant> = None;
    let mut counted = false;
    loop {
        interval.tick().await;
        let Some(app) = app.upgrade() else { return };
        if app.shutdown.is_cancelled() {
            return;
        }
        // Unheard for an election timeout: the point where a follower would stand.
        let Some(leaderless_since) = app.leaderless_since(Duration::from_millis(app.config.election_timeout_ms)) else {
            (since, counted) = (None, false);
            continue;
        };
        let now = tokio::time::Instant::now();
        let after = leaderless_close_after(app.config.election_timeout_ms);
        // When the spell began, not when this check saw it (up to a check interval later): a
        // session opened in between was opened during the spell, and stays.
        let began = *since.get_or_insert(leaderless_since);
        if !counted && now.duration_since(began) >= after {
            counted = true;
            tracing::warn!(
                subscriptions = app.subscription_count(),
                "no leader for {after:?}: closing this node's subscriptions (1013) so they resume on another node"
            );
            app.leaderless_spells.send_replace(Some(began));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_outlasts_several_elections() {
        assert_eq!(leaderless_close_after(1000), SUBSCRIBE_LEADERLESS_CLOSE_AFTER);
        assert_eq!(leaderless_close_after(10_000), Duration::from_secs(50));
    }
}
