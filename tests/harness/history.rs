//! A checker for what clients observed of the cluster: the same rules for the multi-process
//! tests (`assert_converged`) and the simulation.
//!
//! It is given the acknowledged publishes, each node's final (sequence → id) log, and the
//! sequences each subscriber connection received, and reports every violation of:
//! - every acknowledged publish is present exactly once, at the sequence it was acknowledged
//!   with, in every node's log (a node missing one is as wrong as all of them missing it);
//! - every node serves the same (sequence → id) order (no fork);
//! - sequences are contiguous from the first retained one;
//! - no subscriber connection saw a gap (without a `messages_expired` notice) or a duplicate,
//!   and what it saw matches the log;
//! - no node's saved vote went back (an older term, or within one term a candidate with a
//!   lower id), when the history holds what an observer saw of each node.
//!
//! Election safety is checked as openraft promises it. openraft runs in its default "adv" mode
//! (no `single-term-leader` feature): a leader is identified by (term, node id), totally
//! ordered, and one term may have several leaders in turn, each with a higher id than the
//! last (docs.rs/openraft, `docs::data::leader_id`). Two leaders in one term are therefore
//! legal; what is not is a node granting a lower (term, id) than one it already had, which
//! would let two leaders commit at once. That is what the vote check below catches, on the
//! vote as saved (`raft_vote` of `GET /cluster`: the term in memory may run ahead of it, and a
//! crash before the save takes it back), and the log checks catch any fork or lost write it
//! would cause.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// What happened, as seen from outside.
#[derive(Debug, Default, Clone)]
pub struct History {
    /// Acknowledged publishes: id → sequence in the ack.
    pub acked: BTreeMap<String, u64>,
    /// Each node's log after healing: node name → [(sequence, id)] in order.
    pub logs: BTreeMap<String, Vec<(u64, String)>>,
    /// Each subscriber connection's observations, in order of arrival.
    pub subscriptions: Vec<SubscriberRun>,
    /// Node name → what an observer saw of it, in order (empty when nobody watched).
    pub votes: BTreeMap<String, Vec<VoteSeen>>,
}

/// A node's saved vote, as one answer showed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VoteSeen {
    pub term: u64,
    /// The candidate voted for.
    pub node: u64,
    /// Granted by a quorum: `node` leads, or led, `term`.
    pub committed: bool,
}

impl VoteSeen {
    /// From a `GET /cluster` answer (`raft_vote`); None for term 0, a node that never voted or
    /// a restarted one whose Raft has not yet loaded its vote.
    pub fn from_cluster_info(info: &serde_json::Value) -> Option<VoteSeen> {
        let vote = &info["raft_vote"];
        let term = vote["term"].as_u64().filter(|t| *t > 0)?;
        let node = vote["node_id"].as_str()?.strip_prefix("node-")?.parse().ok()?;
        Some(VoteSeen { term, node, committed: vote["committed"].as_bool()? })
    }
}

/// One subscriber connection.
#[derive(Debug, Default, Clone)]
pub struct SubscriberRun {
    pub name: String,
    /// The effective cursor of the `subscribed` frame.
    pub cursor: u64,
    pub events: Vec<Observed>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    Message {
        sequence: u64,
        id: String,
    },
    /// `messages_expired`: delivery continues at `first_available`.
    Expired {
        first_available: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    LostWrite { node: String, id: String, acked_sequence: u64, found: Option<u64> },
    DuplicateId { id: String, sequences: Vec<u64> },
    Fork { node: String, other: String, sequence: u64 },
    NotContiguous { node: String, after: u64, next: u64 },
    SubscriberGap { subscription: String, after: u64, next: u64 },
    SubscriberDuplicate { subscription: String, sequence: u64 },
    SubscriberMismatch { subscription: String, sequence: u64, saw: String, log: String },
    TermWentBack { node: String, from: u64, to: u64 },
    VoteWentBack { node: String, term: u64, from: u64, to: u64 },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

impl History {
    /// Every violation found (empty when the history is correct).
    pub fn check(&self) -> Vec<Violation> {
        let mut out = Vec::new();
        out.extend(vote_violations(&self.votes));
        let reference = self.logs.iter().max_by_key(|(_, log)| log.len());
        for (node, log) in &self.logs {
            for pair in log.windows(2) {
                if pair[1].0 != pair[0].0 + 1 {
                    out.push(Violation::NotContiguous { node: node.clone(), after: pair[0].0, next: pair[1].0 });
                }
            }
            let mut seen: HashMap<&str, Vec<u64>> = HashMap::new();
            for (seq, id) in log {
                seen.entry(id).or_default().push(*seq);
            }
            for (id, acked) in &self.acked {
                let found = seen.get(id.as_str()).and_then(|s| s.first().copied());
                if found != Some(*acked) {
                    out.push(Violation::LostWrite {
                        node: node.clone(),
                        id: id.clone(),
                        acked_sequence: *acked,
                        found,
                    });
                }
            }
            for (id, seqs) in seen {
                if seqs.len() > 1 {
                    out.push(Violation::DuplicateId { id: id.to_string(), sequences: seqs });
                }
            }
            if let Some((other, longest)) = reference {
                let by_seq: HashMap<u64, &String> = longest.iter().map(|(s, id)| (*s, id)).collect();
                if let Some((seq, _)) = log.iter().find(|(s, id)| by_seq.get(s).is_some_and(|o| *o != id)) {
                    out.push(Violation::Fork { node: node.clone(), other: other.clone(), sequence: *seq });
                }
            }
        }
        if let Some((_, log)) = reference {
            let by_seq: HashMap<u64, &String> = log.iter().map(|(s, id)| (*s, id)).collect();
            for run in &self.subscriptions {
                let mut last = run.cursor;
                for event in &run.events {
                    match event {
                        Observed::Expired { first_available } => last = last.max(first_available.saturating_sub(1)),
                        Observed::Message { sequence, id } => {
                            if *sequence <= last {
                                out.push(Violation::SubscriberDuplicate {
                                    subscription: run.name.clone(),
                                    sequence: *sequence,
                                });
                            } else if *sequence != last + 1 {
                                out.push(Violation::SubscriberGap {
                                    subscription: run.name.clone(),
                                    after: last,
                                    next: *sequence,
                                });
                            }
                            if let Some(logged) = by_seq.get(sequence) {
                                if *logged != id {
                                    out.push(Violation::SubscriberMismatch {
                                        subscription: run.name.clone(),
                                        sequence: *sequence,
                                        saw: id.clone(),
                                        log: (*logged).clone(),
                                    });
                                }
                            }
                            last = last.max(*sequence);
                        }
                    }
                }
            }
        }
        out
    }
}

/// Every saved vote that went back. Each node's votes, seen in order, only go up: its term
/// never decreases (a restart reads the vote back), and within a term the candidate it voted
/// for never has a lower id than one it voted for before.
pub fn vote_violations(votes: &BTreeMap<String, Vec<VoteSeen>>) -> Vec<Violation> {
    let mut out = Vec::new();
    for (node, seen) in votes {
        let (mut term, mut voted) = (0, 0);
        for v in seen {
            if v.term < term {
                out.push(Violation::TermWentBack { node: node.clone(), from: term, to: v.term });
            } else if v.term == term && v.node < voted {
                out.push(Violation::VoteWentBack { node: node.clone(), term, from: voted, to: v.node });
            } else {
                (term, voted) = (v.term, v.node);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(ids: &[&str]) -> Vec<(u64, String)> {
        ids.iter().enumerate().map(|(i, id)| (i as u64 + 1, id.to_string())).collect()
    }

    fn good() -> History {
        let mut h = History::default();
        h.acked.insert("a".into(), 1);
        h.acked.insert("b".into(), 2);
        h.logs.insert("n1".into(), log(&["a", "b", "c"]));
        h.logs.insert("n2".into(), log(&["a", "b", "c"]));
        h.subscriptions.push(SubscriberRun {
            name: "s".into(),
            cursor: 0,
            events: vec![
                Observed::Message { sequence: 1, id: "a".into() },
                Observed::Message { sequence: 2, id: "b".into() },
            ],
        });
        h
    }

    #[test]
    fn a_correct_history_has_no_violation() {
        assert_eq!(good().check(), vec![]);
    }

    #[test]
    fn a_lost_write_is_reported() {
        let mut h = good();
        h.acked.insert("z".into(), 3);
        let lost =
            |node: &str| Violation::LostWrite { node: node.into(), id: "z".into(), acked_sequence: 3, found: None };
        assert!(h.check().contains(&lost("n1")) && h.check().contains(&lost("n2")), "{:?}", h.check());
    }

    /// A node whose log is a prefix of the others', short of an acknowledged write: no fork,
    /// but the write is lost there (only the longest log was checked before).
    #[test]
    fn a_write_missing_from_one_node_is_reported() {
        let mut h = good();
        h.logs.insert("n2".into(), log(&["a"]));
        let lost = Violation::LostWrite { node: "n2".into(), id: "b".into(), acked_sequence: 2, found: None };
        assert_eq!(h.check(), vec![lost]);
    }

    #[test]
    fn a_fork_is_reported() {
        let mut h = good();
        h.logs.insert("n2".into(), log(&["a", "x", "c"]));
        assert!(h.check().iter().any(|v| matches!(v, Violation::Fork { sequence: 2, .. })), "{:?}", h.check());
    }

    #[test]
    fn a_subscriber_gap_and_duplicate_are_reported_but_an_announced_expiry_is_not() {
        let mut h = good();
        h.subscriptions[0].events.push(Observed::Message { sequence: 2, id: "b".into() });
        h.subscriptions.push(SubscriberRun {
            name: "gap".into(),
            cursor: 0,
            events: vec![
                Observed::Message { sequence: 1, id: "a".into() },
                Observed::Message { sequence: 3, id: "c".into() },
            ],
        });
        h.subscriptions.push(SubscriberRun {
            name: "expired".into(),
            cursor: 0,
            events: vec![Observed::Expired { first_available: 3 }, Observed::Message { sequence: 3, id: "c".into() }],
        });
        let v = h.check();
        assert!(v.contains(&Violation::SubscriberDuplicate { subscription: "s".into(), sequence: 2 }));
        assert!(v.contains(&Violation::SubscriberGap { subscription: "gap".into(), after: 1, next: 3 }));
        assert_eq!(v.len(), 2, "{v:?}");
    }

    fn seen(term: u64, node: u64, committed: bool) -> VoteSeen {
        VoteSeen { term, node, committed }
    }

    #[test]
    fn votes_that_only_go_up_pass_even_with_two_leaders_in_one_term() {
        let mut h = good();
        // n1 led term 3, then n2 (a higher id) took over in the same term: legal in adv mode.
        h.votes.insert(
            "n1".into(),
            vec![seen(2, 3, false), seen(3, 1, false), seen(3, 1, true), seen(3, 2, true), seen(5, 1, true)],
        );
        h.votes.insert("n2".into(), vec![seen(3, 2, true), seen(3, 2, true), seen(4, 3, false)]);
        assert_eq!(h.check(), vec![]);
    }

    #[test]
    fn a_term_or_a_vote_that_goes_back_is_reported() {
        let mut h = good();
        h.votes.insert("n1".into(), vec![seen(4, 1, true), seen(3, 1, true)]);
        h.votes.insert("n2".into(), vec![seen(3, 3, false), seen(3, 2, true), seen(4, 1, false)]);
        assert_eq!(
            h.check(),
            vec![
                Violation::TermWentBack { node: "n1".into(), from: 4, to: 3 },
                Violation::VoteWentBack { node: "n2".into(), term: 3, from: 3, to: 2 },
            ]
        );
    }

    #[test]
    fn a_hole_in_a_log_and_a_duplicated_id_are_reported() {
        let mut h = good();
        h.logs.insert("n1".into(), vec![(1, "a".into()), (2, "b".into()), (4, "b".into())]);
        let v = h.check();
        assert!(v.iter().any(|v| matches!(v, Violation::NotContiguous { after: 2, next: 4, .. })));
        assert!(v.iter().any(|v| matches!(v, Violation::DuplicateId { .. })));
    }
}
