//! The leader's proposer: concurrent writes become one Raft entry.
//!
//! Every Raft entry costs each node a log write, an fsync, a round trip and an apply, so
//! proposing every publish as its own entry would pay all of that per publish. The proposer
//! queues writes; one task takes everything queued (up to
//! [`PROPOSAL_REQUESTS_MAX`] writes or [`PROPOSAL_BYTES_MAX`] bytes) and proposes it as a single
//! [`Request::Batch`] entry, applied exactly as if each write were its own entry, in queue order.
//! Publishes to one topic that follow each other in the queue are merged into one
//! multi-message publish first (see [`pack`]). A write that arrives alone is proposed alone, so
//! a lone client pays no extra latency. At most [`PROPOSALS_IN_FLIGHT_MAX`] entries are in
//! flight; the next batch fills while they commit. After an entry of concurrent writers the
//! next one waits briefly for them to write again ([`linger_target`], [`PROPOSAL_LINGER`]).

use std::future::Future;
use std::sync::Arc;

use openraft::error::{ClientWriteError, RaftError};
use openraft::{RaftMetrics, ServerState};
use raft_store::typ::Raft;
use raft_store::{NewMessage, Node, NodeId, Request, Response};
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};

use crate::budget::ByteBudget;
use crate::limits::{
    PROPOSALS_IN_FLIGHT_MAX, PROPOSAL_BYTES_MAX, PROPOSAL_DEPOSED_ANSWER_WAIT, PROPOSAL_LINGER,
    PROPOSAL_LINGER_MIN_WRITES, PROPOSAL_LINGER_OFF_ENTRIES, PROPOSAL_MERGED_MESSAGES_MAX, PROPOSAL_QUEUE_BYTES_MAX,
    PROPOSAL_QUEUE_LEN, PROPOSAL_REQUESTS_MAX,
};

/// A committed and applied write.
#[derive(Debug, Clone)]
pub struct Committed {
    /// Index of the log entry that carried the write.
    pub log_index: u64,
    pub response: Response,
}

/// Why a proposed write did not commit.
#[derive(Debug, Clone)]
pub enum ProposeFailure {
    /// This node is not (or no longer) the leader; the entry, if appended, may still commit
    /// under the next leader.
    ForwardToLeader {
        leader_id: Option<NodeId>,
        leader_node: Option<Node>,
    },
    /// Raft stopped.
    Fatal(String),
    Other(String),
}

struct Pending {
    request: Request,
    reply: oneshot::Sender<Result<Committed, ProposeFailure>>,
    /// The request's bytes counted against [`PROPOSAL_QUEUE_BYTES_MAX`] until it leaves the
    /// queue for an entry.
    _queued: OwnedSemaphorePermit,
}

/// Handle to the proposer task.
pub struct Proposer {
    queue: mpsc::Sender<Pending>,
    /// Bytes the queue may hold: the count bound alone let 1 MiB publishes queue gigabytes.
    queue_bytes: ByteBudget,
}

impl Proposer {
    pub fn spawn(raft: Raft) -> Self {
        let (queue, rx) = mpsc::channel(PROPOSAL_QUEUE_LEN);
        tokio::spawn(run(raft, rx));
        Self { queue, queue_bytes: ByteBudget::new(PROPOSAL_QUEUE_BYTES_MAX) }
    }

    /// Proposes `request` and waits until it is committed and applied on this node.
    pub async fn propose(&self, request: Request) -> Result<Committed, ProposeFailure> {
        self.submit(request).await?.await.map_err(|_| dropped())?
    }

    /// Puts `request` in the queue, waiting for room, and returns where its answer will come.
    /// Writes submitted one after another (each awaited before the next) are proposed, and
    /// so applied, in that order.
    pub async fn submit(&self, request: Request) -> Result<Answer, ProposeFailure> {
        let (reply, answer) = oneshot::channel();
        let queued = self.queue_bytes.take(request.approx_bytes()).await;
        self.queue
            .send(Pending { request, reply, _queued: queued })
            .await
            .map_err(|_| ProposeFailure::Fatal("the proposer stopped".into()))?;
        Ok(answer)
    }
}

/// Where a submitted write's outcome arrives.
pub type Answer = oneshot::Receiver<Result<Committed, ProposeFailure>>;

/// What a write whose answer never came failed with.
pub fn dropped() -> ProposeFailure {
    ProposeFailure::Fatal("the proposer dropped the write".into())
}

async fn run(raft: Raft, mut rx: mpsc::Receiver<Pending>) {
    let permits = Arc::new(Semaphore::new(PROPOSALS_IN_FLIGHT_MAX));
    // Writes the previous entry carried.
    let mut previous = 0;
    // Entries left to propose without waiting, after a wait that did not pay.
    let mut no_wait = 0;
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else { return };
        // What waited while the previous entry was in flight; its own writers are answered
        // now and, under a closed-loop load, write again within a round trip.
        let waiting = rx.len();
        let Some(first) = rx.recv().await else { return };
        let mut batch = Batch::new(first);
        batch.take_queued(&mut rx);
        batch.drop_abandoned();
        if batch.writes.is_empty() {
            continue;
        }
        // Without a wait the next entry would hold only what waited, and the previous entry's
        // writers the one after: two groups alternating, each paying every node a whole
        // round. Waiting a little makes them one entry.
        match linger_target(previous, waiting) {
            Some(target) if no_wait == 0 => {
                if !batch.linger(&mut rx, target).await {
                    no_wait = PROPOSAL_LINGER_OFF_ENTRIES;
                }
            }
            _ => no_wait = no_wait.saturating_sub(1),
        }
        previous = batch.writes.len();
        let raft = raft.clone();
        tokio::spawn(async move { propose(&raft, batch.writes, permit).await });
    }
}

/// How many writes the next entry waits for (up to [`PROPOSAL_LINGER`]): those that waited
/// for the previous entry plus as many as it carried. `None` when the previous entry was too
/// small to show concurrent writers, so a lone or occasional writer never waits.
fn linger_target(previous: usize, waiting: usize) -> Option<usize> {
    (previous >= PROPOSAL_LINGER_MIN_WRITES).then(|| (previous + waiting).min(PROPOSAL_REQUESTS_MAX))
}

/// Whether a wait for `awaited` more writes paid: it filled the entry, or at least half of
/// them came. When they do not, the writers are not answering entries with new writes (an
/// open-loop load, a paced publisher): waiting only adds latency, so it stops for a while.
fn lingering_paid(awaited: usize, gathered: usize, full: bool) -> bool {
    full || gathered * 2 >= awaited
}

/// The writes of the next entry, bounded by [`PROPOSAL_REQUESTS_MAX`] and
/// [`PROPOSAL_BYTES_MAX`].
struct Batch {
    writes: Vec<Pending>,
    bytes: usize,
}

impl Batch {
    fn new(first: Pending) -> Batch {
        Batch { bytes: first.request.approx_bytes(), writes: vec![first] }
    }

    fn is_full(&self) -> bool {
        self.writes.len() >= PROPOSAL_REQUESTS_MAX || self.bytes >= PROPOSAL_BYTES_MAX
    }

    fn push(&mut self, next: Pending) {
        self.bytes += next.request.approx_bytes();
        self.writes.push(next);
    }

    /// Drops the writes whose callers gave up (they answered `raft_timeout`: may or may not
    /// commit). Behind a stalled entry they would otherwise commit long after, a surprise to
    /// a client that has moved on.
    fn drop_abandoned(&mut self) {
        let bytes = &mut self.bytes;
        self.writes.retain(|w| {
            let abandoned = w.reply.is_closed();
            if abandoned {
                *bytes -= w.request.approx_bytes();
            }
            !abandoned
        });
    }

    /// Adds what is queued already, without waiting.
    fn take_queued(&mut self, rx: &mut mpsc::Receiver<Pending>) {
        while !self.is_full() {
            match rx.try_recv() {
                Ok(next) => self.push(next),
                Err(_) => break,
            }
        }
    }

    /// Waits up to [`PROPOSAL_LINGER`] until the batch holds `target` writes or is full;
    /// returns whether the wait paid ([`lingering_paid`]).
    async fn linger(&mut self, rx: &mut mpsc::Receiver<Pending>, target: usize) -> bool {
        let before = self.writes.len();
        // One timer for the whole wait, not one registered and dropped per write received.
        let deadline = tokio::time::sleep(PROPOSAL_LINGER);
        tokio::pin!(deadline);
        while !self.is_full() && self.writes.len() < target {
            tokio::select! {
                biased;
                next = rx.recv() => match next {
                    Some(next) => {
                        self.push(next);
                        self.take_queued(rx);
                    }
                    None => break,
                },
                () = &mut deadline => break,
            }
        }
        lingering_paid(target.saturating_sub(before), self.writes.len() - before, self.is_full())
    }
}

fn failure(e: RaftError<NodeId, ClientWriteError<NodeId, Node>>) -> ProposeFailure {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
            ProposeFailure::ForwardToLeader { leader_id: f.leader_id, leader_node: f.leader_node }
        }
        RaftError::APIError(e) => ProposeFailure::Other(e.to_string()),
        RaftError::Fatal(e) => ProposeFailure::Fatal(e.to_string()),
    }
}

/// Resolves once this node no longer leads in the term `metrics` shows now (or Raft stopped):
/// the one case where openraft could leave an entry this node proposed unanswered (see
/// [`outcome`]).
pub fn deposed(mut metrics: watch::Receiver<RaftMetrics<NodeId, Node>>) -> impl Future<Output = ()> {
    let (term, leading) = {
        let m = metrics.borrow_and_update();
        (m.current_term, m.state == ServerState::Leader)
    };
    async move {
        let _ = metrics.wait_for(|m| m.current_term != term || (leading && m.state != ServerState::Leader)).await;
    }
}

/// What Raft answers about an entry, given `permit` back once that answer may never come.
///
/// openraft answers a proposal when its entry is applied, or when the entry is cut from the
/// log, and, as patched, when a snapshot from the next leader covers it (the node, deposed
/// while the entry was in flight, installs the snapshot and purges the entry unapplied:
/// unpatched, that answer never came). Were any path to leave an answer out, the one permit
/// held for it would stop this node proposing for good, should it lead again. So, as a
/// backstop, once the node stops leading the permit is released and the answer waited for
/// [`PROPOSAL_DEPOSED_ANSWER_WAIT`] more; past that the writes are `not_committed`, which
/// clients retry under the same ids.
async fn outcome<T>(
    metrics: watch::Receiver<RaftMetrics<NodeId, Node>>,
    written: impl Future<Output = Result<T, RaftError<NodeId, ClientWriteError<NodeId, Node>>>>,
    permit: OwnedSemaphorePermit,
) -> Result<T, ProposeFailure> {
    let deposed = deposed(metrics);
    tokio::pin!(written);
    tokio::select! {
        written = &mut written => return written.map_err(failure),
        () = deposed => {}
    }
    drop(permit);
    match tokio::time::timeout(PROPOSAL_DEPOSED_ANSWER_WAIT, written).await {
        Ok(written) => written.map_err(failure),
        Err(_) => Err(ProposeFailure::Other("leadership moved and the entry's outcome is unknown".into())),
    }
}

async fn propose(raft: &Raft, mut batch: Vec<Pending>, permit: OwnedSemaphorePermit) {
    if batch.len() == 1 {
        let Some(one) = batch.pop() else { return };
        let result = outcome(raft.metrics(), raft.client_write(one.request), permit).await;
        let _ = one.reply.send(result.map(|r| Committed { log_index: r.log_id.index, response: r.data }));
        return;
    }
    let (requests, answers): (Vec<Request>, Vec<Answers>) = pack(batch).into_iter().unzip();
    let count = requests.len();
    // Concurrent publishes to one topic often pack into a single command: no Batch around it.
    let request = match <[Request; 1]>::try_from(requests) {
        Ok([only]) => only,
        Err(requests) => Request::Batch(requests),
    };
    match outcome(raft.metrics(), raft.client_write(request), permit).await {
        Ok(written) => {
            let log_index = written.log_id.index;
            let responses = match written.data {
                Response::Batch(responses) if count > 1 && responses.len() == count => responses,
                single if count == 1 => vec![single],
                other => {
                    let e = ProposeFailure::Other(format!("an entry of {count} commands was applied as {other:?}"));
                    answers.into_iter().for_each(|a| a.fail(&e));
                    return;
                }
            };
            for (answer, response) in answers.into_iter().zip(responses) {
                answer.send(log_index, response);
            }
        }
        Err(e) => answers.into_iter().for_each(|a| a.fail(&e)),
    }
}

/// The writes one command of an entry answers: one, or several publishes to the same topic
/// merged into it, each owning the next `results` of its publish results.
struct Answers(Vec<(oneshot::Sender<Result<Committed, ProposeFailure>>, usize)>);

impl Answers {
    fn send(self, log_index: u64, response: Response) {
        let mut parts = self.0;
        if parts.len() == 1 {
            let (reply, _) = parts.remove(0);
            let _ = reply.send(Ok(Committed { log_index, response }));
            return;
        }
        let wanted: usize = parts.iter().map(|(_, n)| n).sum();
        match response {
            Response::Published { results } if results.len() == wanted => {
                let mut results = results.into_iter();
                for (reply, n) in parts {
                    let response = Response::Published { results: results.by_ref().take(n).collect() };
                    let _ = reply.send(Ok(Committed { log_index, response }));
                }
            }
            // Topic not found, or anything else that concerns the command as a whole.
            other => {
                for (reply, _) in parts {
                    let _ = reply.send(Ok(Committed { log_index, response: other.clone() }));
                }
            }
        }
    }

    fn fail(self, e: &ProposeFailure) {
        for (reply, _) in self.0 {
            let _ = reply.send(Err(e.clone()));
        }
    }
}

/// The commands of one entry, in queue order. A publish that follows a publish to the same
/// topic joins it as one multi-message publish (up to [`PROPOSAL_MERGED_MESSAGES_MAX`]
/// messages): applied in the same order with the same results, it costs every replica one
/// command and one batched dedup read instead of one per write. Other writes stay as they are.
fn pack(batch: Vec<Pending>) -> Vec<(Request, Answers)> {
    let mut commands: Vec<(Command, Answers)> = Vec::with_capacity(batch.len());
    for Pending { request, reply, .. } in batch {
        let next = match publish_parts(request) {
            Ok(next) => next,
            Err(other) => {
                commands.push((Command::Other(other), Answers(vec![(reply, 0)])));
                continue;
            }
        };
        let results = next.messages.len();
        if let Some((Command::Publish(last), answers)) = commands.last_mut() {
            if last.topic == next.topic && last.messages.len() + results <= PROPOSAL_MERGED_MESSAGES_MAX {
                last.absorb(next);
                answers.0.push((reply, results));
                continue;
            }
        }
        commands.push((Command::Publish(next), Answers(vec![(reply, results)])));
    }
    commands.into_iter().map(|(command, answers)| (command.into_request(), answers)).collect()
}

/// A command of an entry being packed: publishes stay taken apart until nothing more can join.
enum Command {
    Publish(PublishParts),
    Other(Request),
}

impl Command {
    fn into_request(self) -> Request {
        match self {
            Command::Publish(p) => Request::publish(p.topic, p.messages, p.now_ms, p.ids_generated),
            Command::Other(request) => request,
        }
    }
}

/// A publish command taken apart.
struct PublishParts {
    topic: String,
    messages: Vec<NewMessage>,
    now_ms: u64,
    ids_generated: bool,
}

impl PublishParts {
    /// Appends `next`'s messages. The merged command keeps the later clock reading, and looks
    /// ids up unless the leader generated all of them.
    fn absorb(&mut self, next: PublishParts) {
        self.messages.extend(next.messages);
        self.now_ms = self.now_ms.max(next.now_ms);
        self.ids_generated &= next.ids_generated;
    }
}

fn publish_parts(request: Request) -> Result<PublishParts, Request> {
    match request {
        Request::Publish { topic, messages, now_ms } => {
            Ok(PublishParts { topic, messages, now_ms, ids_generated: false })
        }
        Request::PublishGeneratedIds { topic, messages, now_ms } => {
            Ok(PublishParts { topic, messages, now_ms, ids_generated: true })
        }
        other => Err(other),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use raft_store::{PublishResult, Retention};

    fn publish(topic: &str, ids: &[&str], now_ms: u64, generated: bool) -> Request {
        let messages = ids
            .iter()
            .map(|id| NewMessage { id: id.to_string(), timestamp: 1, payload: bytes::Bytes::from_static(b"{}") })
            .collect();
        Request::publish(topic.into(), messages, now_ms, generated)
    }

    type Reply = oneshot::Receiver<Result<Committed, ProposeFailure>>;

    fn pending(requests: Vec<Request>) -> (Vec<Pending>, Vec<Reply>) {
        requests
            .into_iter()
            .map(|request| {
                let (reply, rx) = oneshot::channel();
                let queued = Arc::new(Semaphore::new(1)).try_acquire_owned().expect("a fresh permit");
                (Pending { request, reply, _queued: queued }, rx)
            })
            .unzip()
    }

    fn ids(request: &Request) -> Vec<&str> {
        match request {
            Request::Publish { messages, .. } | Request::PublishGeneratedIds { messages, .. } => {
                messages.iter().map(|m| m.id.as_str()).collect()
            }
            _ => vec![],
        }
    }

    /// An entry whose answer never comes (a snapshot from the next leader covered it) holds
    /// the proposer's one permit while this node leads, gives it back once it stops leading,
    /// and fails as not committed once the wait for its answer is over.
    #[tokio::test(start_paused = true)]
    async fn a_deposed_leaders_unanswered_entry_gives_the_proposer_back() {
        let mut leading = RaftMetrics::new_initial(1);
        (leading.current_term, leading.state) = (3, ServerState::Leader);
        let (metrics, watched) = watch::channel(leading);
        let permits = Arc::new(Semaphore::new(1));
        let permit = permits.clone().try_acquire_owned().expect("a fresh permit");
        let never = std::future::pending::<Result<(), RaftError<NodeId, ClientWriteError<NodeId, Node>>>>();
        let waiting = tokio::spawn(outcome(watched, never, permit));

        tokio::time::sleep(PROPOSAL_DEPOSED_ANSWER_WAIT * 4).await;
        assert_eq!(permits.available_permits(), 0, "given back while still leading");
        metrics.send_modify(|m| (m.current_term, m.state) = (4, ServerState::Follower));
        let again = tokio::time::timeout(Duration::from_millis(1), permits.clone().acquire_owned()).await;
        assert!(again.is_ok(), "the permit is not given back once deposed");
        assert!(!waiting.is_finished(), "the answer is waited for a while longer");
        let answer = waiting.await.expect("the wait ends");
        assert!(matches!(answer, Err(ProposeFailure::Other(_))), "{answer:?}");
    }

    /// An answer that does come is passed on, and the permit given back with it.
    #[tokio::test]
    async fn an_answered_entry_passes_its_answer_on() {
        let (_metrics, watched) = watch::channel(RaftMetrics::new_initial(1));
        let permits = Arc::new(Semaphore::new(1));
        let permit = permits.clone().try_acquire_owned().expect("a fresh permit");
        let answered = std::future::ready(Ok::<u64, RaftError<NodeId, ClientWriteError<NodeId, Node>>>(7));
        assert_eq!(outcome(watched, answered, permit).await.ok(), Some(7));
        assert_eq!(permits.available_permits(), 1);
    }

    #[test]
    fn writes_whose_callers_gave_up_are_not_proposed() {
        let (writes, mut replies) = pending(vec![publish("t", &["a"], 1, false), publish("t", &["b"], 1, false)]);
        let mut batch = Batch { writes, bytes: 0 };
        drop(replies.remove(0));
        batch.drop_abandoned();
        assert_eq!(batch.writes.iter().map(|w| ids(&w.request)).collect::<Vec<_>>(), vec![vec!["b"]]);
    }

    #[test]
    fn only_an_entry_of_concurrent_writers_makes_the_next_one_wait_for_them() {
        use crate::limits::{PROPOSAL_LINGER_MIN_WRITES as MIN, PROPOSAL_REQUESTS_MAX as MAX};
        assert_eq!(linger_target(0, 0), None, "the first write is proposed at once");
        assert_eq!(linger_target(1, 0), None, "a lone writer never waits");
        assert_eq!(linger_target(MIN - 1, 50), None);
        assert_eq!(linger_target(MIN, 0), Some(MIN));
        assert_eq!(linger_target(16, 8), Some(24), "what waited and the previous entry's writers");
        assert_eq!(linger_target(MAX, MAX), Some(MAX));
    }

    #[test]
    fn a_wait_pays_when_it_fills_the_entry_or_half_of_the_awaited_writes_come() {
        assert!(lingering_paid(16, 16, false));
        assert!(lingering_paid(16, 8, false));
        assert!(!lingering_paid(16, 7, false), "an open-loop load: the writers did not come");
        assert!(!lingering_paid(4, 0, false));
        assert!(lingering_paid(16, 1, true), "the entry is full: nothing more to wait for");
        assert!(lingering_paid(0, 0, false));
    }

    #[test]
    fn publishes_to_one_topic_in_a_row_become_one_command_in_queue_order() {
        let create =
            Request::CreateTopic { topic: "b".into(), metadata: None, retention: Retention::default(), now_ms: 1 };
        let (batch, _replies) = pending(vec![
            publish("a", &["1"], 10, false),
            publish("a", &["2", "3"], 12, false),
            publish("b", &["4"], 11, false),
            create.clone(),
            publish("b", &["5"], 13, false),
            publish("b", &["6"], 14, false),
        ]);
        let packed = pack(batch);
        let commands: Vec<&Request> = packed.iter().map(|(r, _)| r).collect();
        assert_eq!(commands.len(), 4);
        assert_eq!(ids(commands[0]), ["1", "2", "3"]);
        assert!(matches!(commands[0], Request::Publish { now_ms: 12, .. }), "the later clock reading is kept");
        assert_eq!(ids(commands[1]), ["4"]);
        assert_eq!(commands[2], &create);
        assert_eq!(ids(commands[3]), ["5", "6"]);
        let parts: Vec<Vec<usize>> = packed.iter().map(|(_, a)| a.0.iter().map(|(_, n)| *n).collect()).collect();
        assert_eq!(parts, vec![vec![1, 2], vec![1], vec![0], vec![1, 1]]);
    }

    #[test]
    fn generated_ids_skip_the_lookup_only_when_every_merged_id_was_generated() {
        let (batch, _r) = pending(vec![publish("a", &["g1"], 1, true), publish("a", &["g2"], 1, true)]);
        assert!(matches!(pack(batch)[0].0, Request::PublishGeneratedIds { .. }));
        let (batch, _r) = pending(vec![publish("a", &["g1"], 1, true), publish("a", &["c1"], 1, false)]);
        assert!(matches!(pack(batch)[0].0, Request::Publish { .. }));
        let (batch, _r) = pending(vec![publish("a", &["c1"], 1, false), publish("a", &["g1"], 1, true)]);
        assert!(matches!(pack(batch)[0].0, Request::Publish { .. }));
    }

    #[test]
    fn a_merged_command_holds_at_most_a_batch_of_messages() {
        let big: Vec<String> = (0..PROPOSAL_MERGED_MESSAGES_MAX - 1).map(|i| i.to_string()).collect();
        let big: Vec<&str> = big.iter().map(String::as_str).collect();
        let (batch, _r) =
            pending(vec![publish("a", &big, 1, false), publish("a", &["x"], 1, false), publish("a", &["y"], 1, false)]);
        let packed = pack(batch);
        assert_eq!(packed.len(), 2);
        assert_eq!(ids(&packed[0].0).len(), PROPOSAL_MERGED_MESSAGES_MAX);
        assert_eq!(ids(&packed[1].0), ["y"]);
    }

    #[tokio::test]
    async fn each_merged_write_gets_its_own_results() {
        let (batch, replies) = pending(vec![publish("a", &["1"], 1, false), publish("a", &["2", "3"], 1, false)]);
        let (_, answers) = pack(batch).pop().unwrap();
        let results = vec![
            PublishResult::Stored { sequence: 7 },
            PublishResult::Duplicate { existing_sequence: 2 },
            PublishResult::Stored { sequence: 8 },
        ];
        answers.send(40, Response::Published { results: results.clone() });
        let mut got = Vec::new();
        for reply in replies {
            let committed = reply.await.unwrap().unwrap();
            assert_eq!(committed.log_index, 40);
            got.push(committed.response);
        }
        assert_eq!(
            got,
            vec![
                Response::Published { results: results[..1].to_vec() },
                Response::Published { results: results[1..].to_vec() }
            ]
        );

        let (batch, replies) = pending(vec![publish("gone", &["1"], 1, false), publish("gone", &["2"], 1, false)]);
        let (_, answers) = pack(batch).pop().unwrap();
        answers.send(41, Response::TopicNotFound);
        for reply in replies {
            assert_eq!(reply.await.unwrap().unwrap().response, Response::TopicNotFound);
        }
    }
}
