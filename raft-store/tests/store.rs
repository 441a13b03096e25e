//! The store across restarts and crashes: what a database engineer checks before trusting it.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftSnapshotBuilder, RaftStateMachine};
use openraft::{CommittedLeaderId, EntryPayload, LogId, RaftLogReader};
use raft_store::typ::Entry;
use raft_store::{NewMessage, Request, Response, Retention};

fn entry(index: u64, request: Request) -> Entry {
    Entry { log_id: LogId::new(CommittedLeaderId::new(1, 1), index), payload: EntryPayload::Normal(request) }
}

fn create(topic: &str) -> Request {
    Request::CreateTopic {
        topic: topic.into(),
        metadata: Some(r#"{"k":1}"#.into()),
        retention: Retention::default(),
        now_ms: 5,
    }
}

fn publish(topic: &str, id: &str) -> Request {
    let m = NewMessage { id: id.into(), timestamp: 9, payload: Bytes::from(format!("{{\"id\":\"{id}\"}}")) };
    Request::Publish { topic: topic.into(), messages: vec![m], now_ms: 10 }
}

/// What the state machine serves: every topic record and its messages.
fn dump(reader: &raft_store::StoreReader) -> Vec<(raft_store::TopicRecord, Vec<(u64, String)>)> {
    reader
        .active_topics_page(None, usize::MAX)
        .0
        .into_iter()
        .map(|t| {
            let messages = reader.read_messages(t.id, 0, 1000).unwrap().into_iter().map(|(s, m)| (s, m.id)).collect();
            (t, messages)
        })
        .collect()
}

#[tokio::test]
async fn restart_from_disk_gives_the_same_state() {
    let dir = tempfile::tempdir().unwrap();
    let (before, closed) = {
        let mut store = raft_store::open(dir.path()).unwrap();
        let mut entries = vec![entry(1, create("a")), entry(2, create("b"))];
        for i in 0..50 {
            entries.push(entry(3 + i, publish(if i % 2 == 0 { "a" } else { "b" }, &format!("m{i}"))));
        }
        store.log_store.blocking_append(entries.clone()).await.unwrap();
        store.state_machine.apply(entries).await.unwrap();
        // A clean stop: the state machine flushes itself when dropped.
        store.closed.stop_cleanly();
        ((dump(&store.reader), store.state_machine.applied_state().await.unwrap()), store.closed)
    };
    // RocksDB lets go of its lock file once the last handle to it drops.
    assert!(closed.wait(Duration::from_secs(5)).await);
    let mut store = raft_store::open(dir.path()).unwrap();
    assert_eq!(dump(&store.reader), before.0);
    assert_eq!(store.state_machine.applied_state().await.unwrap(), before.1);
    let logs = store.log_store.get_log_reader().await.try_get_log_entries(1..53).await.unwrap();
    assert_eq!(logs.len(), 52);
    // The next publish continues the sequence.
    let r = store.state_machine.apply([entry(53, publish("a", "next"))]).await.unwrap();
    assert_eq!(r, vec![Response::Published { results: vec![raft_store::PublishResult::Stored { sequence: 26 }] }]);
}

/// A crash loses the applies not yet flushed (they skip RocksDB's WAL, and RocksDB closing
/// flushes nothing, as a killed process could not): the state machine starts back at its
/// last flush, and openraft's start applies the committed entries after it again, to the
/// same state.
#[tokio::test]
async fn a_crash_loses_unflushed_applies_and_the_start_redoes_them_from_the_log() {
    use openraft::storage::StorageHelper;
    let dir = tempfile::tempdir().unwrap();
    let before = {
        let mut store = raft_store::open(dir.path()).unwrap();
        // From index 0, as a log openraft starts is (the start reads from the first index).
        let mut entries = vec![entry(0, create("a"))];
        for i in 0..20 {
            entries.push(entry(1 + i, publish("a", &format!("m{i}"))));
        }
        store.log_store.blocking_append(entries.clone()).await.unwrap();
        store.log_store.save_committed(Some(entries[20].log_id)).await.unwrap();
        store.state_machine.apply(entries[..10].to_vec()).await.unwrap();
        // A snapshot build flushes what was applied before it.
        store.state_machine.get_snapshot_builder().await.build_snapshot().await.unwrap();
        store.state_machine.apply(entries[10..].to_vec()).await.unwrap();
        let before = (dump(&store.reader), store.state_machine.applied_state().await.unwrap());
        // The crash: every handle dropped, nothing flushed.
        close(store).await;
        before
    };
    let mut store = raft_store::open(dir.path()).unwrap();
    let (applied, _) = store.state_machine.applied_state().await.unwrap();
    assert_eq!(applied.map(|l| l.index), Some(9), "back at the last flush");
    assert_eq!(store.reader.topic("a").unwrap().current_sequence, 9);
    StorageHelper::new(&mut store.log_store, &mut store.state_machine).get_initial_state().await.unwrap();
    assert_eq!((dump(&store.reader), store.state_machine.applied_state().await.unwrap()), before);
    // Each redone publish is stored once: the next continues the sequence.
    let r = store.state_machine.apply([entry(21, publish("a", "next"))]).await.unwrap();
    assert_eq!(r, vec![Response::Published { results: vec![raft_store::PublishResult::Stored { sequence: 21 }] }]);
}

/// Data directories of earlier builds kept the Raft log in RocksDB's `log` column family:
/// opening one moves the entries to segment files, and the log reads back whole, with the
/// purge point kept.
#[tokio::test]
async fn a_log_kept_in_rocksdb_by_an_earlier_build_moves_to_segment_files() {
    use raft_store::keys::{log_key, CF_LOG, CF_RAFT, LAST_PURGED};
    let dir = tempfile::tempdir().unwrap();
    let entries: Vec<Entry> = (5..=40).map(|i| entry(i, publish("a", &format!("m{i}")))).collect();
    {
        let db = raft_store::db::open(&dir.path().join("db")).unwrap();
        let log = raft_store::db::cf(&db, CF_LOG).unwrap();
        for e in &entries {
            db.put_cf(log, log_key(e.log_id.index), bincode::serialize(e).unwrap()).unwrap();
        }
        let purged: raft_store::typ::LogId = LogId::new(CommittedLeaderId::new(1, 1), 4);
        db.put_cf(raft_store::db::cf(&db, CF_RAFT).unwrap(), LAST_PURGED, bincode::serialize(&purged).unwrap())
            .unwrap();
    }
    for _ in 0..2 {
        let raft_store::Store { log_store: mut log, state_machine, reader, closed } =
            raft_store::open(dir.path()).unwrap();
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id.map(|l| l.index), Some(4));
        assert_eq!(state.last_log_id.map(|l| l.index), Some(40));
        let read = log.get_log_reader().await.try_get_log_entries(5..=40).await.unwrap();
        assert_eq!(read.iter().map(|e| e.log_id.index).collect::<Vec<_>>(), (5..=40).collect::<Vec<_>>());
        assert_eq!(format!("{read:?}"), format!("{entries:?}"));
        drop((log, state_machine, reader));
        assert!(closed.wait(Duration::from_secs(5)).await);
    }
    let db = raft_store::db::open(&dir.path().join("db")).unwrap();
    let log = raft_store::db::cf(&db, CF_LOG).unwrap();
    assert!(db.iterator_cf(log, rocksdb::IteratorMode::Start).next().is_none(), "RocksDB no longer holds the log");
}

/// A publish entry carrying `bytes` of payload.
fn big_publish(topic: &str, id: &str, bytes: usize) -> Request {
    let payload = Bytes::from(format!("\"{}\"", "x".repeat(bytes)));
    Request::Publish {
        topic: topic.into(),
        messages: vec![NewMessage { id: id.into(), timestamp: 9, payload }],
        now_ms: 10,
    }
}

#[tokio::test]
async fn replication_reads_are_bounded_in_bytes_but_always_make_progress() {
    use raft_store::limits::REPLICATION_READ_BYTES_MAX;
    let dir = tempfile::tempdir().unwrap();
    let mut store = raft_store::open(dir.path()).unwrap();
    let entry_bytes = REPLICATION_READ_BYTES_MAX / 4;
    let entries: Vec<Entry> = (1..=20).map(|i| entry(i, big_publish("a", &format!("m{i}"), entry_bytes))).collect();
    store.log_store.blocking_append(entries).await.unwrap();
    let mut reader = store.log_store.get_log_reader().await;

    // Twenty entries of a quarter of the budget: a read stops within the budget.
    let limited = reader.limited_get_log_entries(1, 21).await.unwrap();
    assert!((1..=4).contains(&limited.len()), "{} entries", limited.len());
    assert_eq!(limited.first().map(|e| e.log_id.index), Some(1));
    let indexes: Vec<u64> = limited.iter().map(|e| e.log_id.index).collect();
    assert_eq!(indexes, (1..=limited.len() as u64).collect::<Vec<_>>());
    // The range end still bounds it, and the unlimited read returns everything.
    assert_eq!(reader.limited_get_log_entries(5, 6).await.unwrap().len(), 1);
    assert_eq!(reader.try_get_log_entries(1..21).await.unwrap().len(), 20);

    // One entry larger than the whole budget is still returned on its own.
    let huge = entry(21, big_publish("a", "huge", REPLICATION_READ_BYTES_MAX * 2));
    store.log_store.blocking_append([huge]).await.unwrap();
    let alone = reader.limited_get_log_entries(21, 22).await.unwrap();
    assert_eq!(alone.len(), 1);
}

#[tokio::test]
async fn message_reads_stop_past_their_byte_bound_but_always_make_progress() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = raft_store::open(dir.path()).unwrap();
    let mut entries = vec![entry(1, create("a"))];
    entries.extend((2..=11).map(|i| entry(i, big_publish("a", &format!("m{i}"), 1000))));
    store.state_machine.apply(entries).await.unwrap();
    let id = store.reader.topic("a").unwrap().id;
    // 1,002 bytes a payload (the quotes): the third crosses 2,500 and ends the page.
    let page = store.reader.read_messages_within(id, 0, 100, 2500).unwrap();
    assert_eq!(page.iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![1, 2, 3]);
    assert_eq!(store.reader.read_messages_within(id, 3, 100, 1).unwrap().len(), 1, "one message at least");
    assert_eq!(store.reader.read_messages(id, 0, 100).unwrap().len(), 10);
}

/// A store in `dir` holding topic `a` with 300 messages (entries 1–301), and a snapshot of it.
async fn store_with_a_snapshot(dir: &std::path::Path) -> (raft_store::Store, raft_store::typ::Snapshot) {
    let mut store = raft_store::open(dir).unwrap();
    let mut entries = vec![entry(1, create("a"))];
    for i in 0..300 {
        entries.push(entry(2 + i, publish("a", &format!("m{i}"))));
    }
    store.state_machine.apply(entries).await.unwrap();
    let snapshot = store.state_machine.get_snapshot_builder().await.build_snapshot().await.unwrap();
    (store, snapshot)
}

#[tokio::test]
async fn a_snapshot_round_trip_reproduces_the_state_on_another_node() {
    let (leader_dir, follower_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (leader, snapshot) = store_with_a_snapshot(leader_dir.path()).await;
    assert_eq!(snapshot.meta.last_log_id.map(|l| l.index), Some(301));

    let mut follower = raft_store::open(follower_dir.path()).unwrap();
    follower.state_machine.apply([entry(1, create("stale"))]).await.unwrap();
    assert!(!follower.reader.installing());
    follower.state_machine.install_snapshot(&snapshot.meta, snapshot.snapshot).await.unwrap();
    assert!(!follower.reader.installing(), "readers are let back once the install is done");
    assert_eq!(dump(&follower.reader), dump(&leader.reader), "the follower now holds exactly the leader's state");
    assert!(follower.reader.topic("stale").is_none());
    let current = follower.state_machine.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(current.meta, snapshot.meta);
    // Dedup survived: publishing an old id is a duplicate on the follower too.
    let r = follower.state_machine.apply([entry(302, publish("a", "m7"))]).await.unwrap();
    assert_eq!(
        r,
        vec![Response::Published { results: vec![raft_store::PublishResult::Duplicate { existing_sequence: 8 }] }]
    );
    let closed = follower.closed;
    drop((follower.log_store, follower.state_machine, follower.reader));
    assert!(closed.wait(Duration::from_secs(5)).await);
    let reopened = raft_store::open(follower_dir.path()).unwrap();
    assert_eq!(dump(&reopened.reader), dump(&leader.reader));
}

/// A snapshot install skips the entries it covers: a topic deleted among them, created again
/// or not, is still signalled as deleted to those watching it on the follower (a subscriber
/// there gets `topic_deleted`), and a snapshot without a deletion signals none. Also when the
/// topic is created again in the millisecond it was first created in.
#[tokio::test]
async fn a_deletion_a_snapshot_install_skips_over_is_still_signalled() {
    for case in ["kept", "deleted", "revived", "revived in the same millisecond"] {
        let (leader_dir, follower_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut leader = raft_store::open(leader_dir.path()).unwrap();
        let mut follower = raft_store::open(follower_dir.path()).unwrap();
        let both = vec![entry(1, create("a")), entry(2, publish("a", "m1")), entry(3, publish("a", "m2"))];
        leader.state_machine.apply(both.clone()).await.unwrap();
        follower.state_machine.apply(both).await.unwrap();
        let mut watch = follower.reader.watch_topic("a");
        let before = *watch.borrow_and_update();

        let mut skipped = vec![entry(4, publish("a", "m3"))];
        if case != "kept" {
            skipped.push(entry(5, Request::DeleteTopic { topic: "a".into() }));
        }
        if case.starts_with("revived") {
            let now_ms = if case == "revived" { 50 } else { 5 };
            let revive = Request::CreateTopicLater {
                topic: "a".into(),
                metadata: None,
                retention: Retention::default(),
                now_ms,
            };
            skipped.extend([entry(6, revive), entry(7, publish("a", "m4"))]);
        }
        leader.state_machine.apply(skipped).await.unwrap();
        let snapshot = leader.state_machine.get_snapshot_builder().await.build_snapshot().await.unwrap();
        follower.state_machine.install_snapshot(&snapshot.meta, snapshot.snapshot).await.unwrap();

        assert!(watch.has_changed().unwrap(), "{case}");
        let after = *watch.borrow();
        let (deletions, deleted, deleted_after, current) = match case {
            "kept" => (0, false, 0, 3),
            // Exactly where the topic stopped taking publishes.
            "deleted" => (1, true, 3, 3),
            // Where is not in the snapshot: up to the current end, so that m3, published
            // before the deletion, is delivered before the notice (m4 with it).
            _ => (1, false, 4, 4),
        };
        assert_eq!(after.deletions - before.deletions, deletions, "{case}");
        assert_eq!(after.deleted, deleted, "{case}");
        assert_eq!(after.current_sequence, current, "{case}");
        if deletions > 0 {
            assert_eq!(after.deleted_after(before.deletions), deleted_after, "{case}");
        }
    }
}

/// A topic deleted, created again and deleted again while a subscriber lags: the watch says
/// where the first deletion ended the topic, so the subscriber gets the notice there and not
/// after messages published once the topic was created again. Before, the watch kept only
/// the latest deletion (and a single apply that deleted twice counted once).
#[tokio::test]
async fn a_topic_deleted_twice_signals_where_the_first_deletion_ended_it() {
    for one_apply in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let mut store = raft_store::open(dir.path()).unwrap();
        let start = vec![entry(1, create("a")), entry(2, publish("a", "m1")), entry(3, publish("a", "m2"))];
        store.state_machine.apply(start).await.unwrap();
        let watch = store.reader.watch_topic("a");
        let since = watch.borrow().deletions;

        let revive = |now_ms| Request::CreateTopic {
            topic: "a".into(),
            metadata: None,
            retention: Retention::default(),
            now_ms,
        };
        let mut rest = vec![entry(4, Request::DeleteTopic { topic: "a".into() }), entry(5, revive(50))];
        rest.extend([entry(6, publish("a", "m3")), entry(7, Request::DeleteTopic { topic: "a".into() })]);
        rest.extend([
            entry(8, revive(60)),
            entry(9, publish("a", "m4")),
            entry(10, Request::DeleteTopic { topic: "a".into() }),
        ]);
        if one_apply {
            store.state_machine.apply(rest).await.unwrap();
        } else {
            for e in rest {
                store.state_machine.apply([e]).await.unwrap();
            }
        }
        let signal = *watch.borrow();
        assert_eq!(signal.deletions - since, 3, "one apply: {one_apply}");
        assert_eq!(signal.deleted_after(since), 2, "one apply: {one_apply}");
        assert_eq!(signal.deleted_after(since + 1), 3, "one apply: {one_apply}");
        assert_eq!(signal.deleted_after(since + 2), 4, "one apply: {one_apply}");
    }
}

/// A subscription's baseline is the watch's signal at the moment its topic's record was
/// read, not whatever the watch says once the caller looks: a delete and a re-create applied
/// in between must count as a deletion after the baseline, or a subscriber of the old topic
/// is carried into the new one without `topic_deleted` (the node read the count afterwards).
#[tokio::test]
async fn a_watch_gives_the_signal_of_the_moment_its_record_was_read() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = raft_store::open(dir.path()).unwrap();
    let revive =
        |now_ms| Request::CreateTopic { topic: "a".into(), metadata: None, retention: Retention::default(), now_ms };
    store.state_machine.apply([entry(1, create("a")), entry(2, publish("a", "m1"))]).await.unwrap();
    // An earlier subscriber's watch has counted one deletion already.
    let _earlier = store.reader.watch_topic("a");
    let first_life = [entry(3, Request::DeleteTopic { topic: "a".into() }), entry(4, revive(40))];
    store.state_machine.apply(first_life).await.unwrap();
    store.state_machine.apply([entry(5, publish("a", "m2"))]).await.unwrap();

    let watch = store.reader.watch_topic_with_record("a");
    let record = watch.record.clone().unwrap();
    assert!(!record.deleted);
    assert_eq!(watch.signal.deletions, 1);

    let second_life = [entry(6, Request::DeleteTopic { topic: "a".into() }), entry(7, revive(50))];
    store.state_machine.apply(second_life).await.unwrap();

    assert_eq!(watch.signal.current_sequence, record.current_sequence);
    assert_eq!(watch.signal.created_at, record.created_at);
    let now = *watch.feed.borrow();
    assert!(!now.deleted, "created again");
    assert_eq!(now.deletions - watch.signal.deletions, 1, "the deletion counts after the baseline");
    assert_eq!(now.deleted_after(watch.signal.deletions), record.current_sequence);
}

/// A received snapshot with a hole in it (a stretch of zeros, as chunks written at the wrong
/// offset leave) or cut short is refused before the install touches anything: the follower
/// keeps its state and restarts cleanly, instead of failing the install again at every start.
/// The received data has no name on disk, so nothing is left behind either.
#[tokio::test]
async fn a_malformed_received_snapshot_is_refused_and_changes_nothing() {
    use std::io::{Read, Seek, SeekFrom, Write};
    let (leader_dir, follower_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_leader, mut snapshot) = store_with_a_snapshot(leader_dir.path()).await;
    let mut bytes = Vec::new();
    snapshot.snapshot.0.seek(SeekFrom::Start(0)).unwrap();
    snapshot.snapshot.0.read_to_end(&mut bytes).unwrap();

    let mut follower = raft_store::open(follower_dir.path()).unwrap();
    follower.state_machine.apply([entry(1, create("mine"))]).await.unwrap();
    let before = dump(&follower.reader);
    let mut holed = bytes.clone();
    holed[bytes.len() / 3..bytes.len() / 2].fill(0);
    for bad in [holed, bytes[..bytes.len() - 10].to_vec(), [bytes.as_slice(), b"x"].concat()] {
        let mut received = follower.state_machine.begin_receiving_snapshot().await.unwrap();
        received.0.write_all(&bad).unwrap();
        let names: Vec<_> = std::fs::read_dir(follower.state_machine.snapshot_dir()).unwrap().collect();
        assert!(names.is_empty(), "received data has no name: {names:?}");
        let refused = follower.state_machine.install_snapshot(&snapshot.meta, received).await;
        assert!(refused.is_err(), "a malformed snapshot was installed");
        assert!(!follower.reader.installing(), "readers are not refused after a refused snapshot");
        assert_eq!(dump(&follower.reader), before);
        let left: Vec<_> = std::fs::read_dir(follower.state_machine.snapshot_dir()).unwrap().collect();
        assert!(left.is_empty(), "a refused snapshot leaves no file: {left:?}");
    }
    // A clean stop.
    follower.closed.stop_cleanly();
    let closed = follower.closed;
    drop((follower.log_store, follower.state_machine, follower.reader));
    assert!(closed.wait(Duration::from_secs(5)).await);
    let reopened = raft_store::open(follower_dir.path()).unwrap();
    assert_eq!(dump(&reopened.reader), before, "no install is redone at start");
}

/// Entries the crash child builds a snapshot after.
const CRASH_CHILD_SNAPSHOT_AT: u64 = 150;

/// Run as a child process by `a_crash_mid_write_leaves_a_consistent_store`: appends and
/// applies one publish per entry forever, printing each index once its append is durable,
/// and builds one snapshot on the way (printing the index it covers). Ignored in normal runs,
/// where it would only pass without testing anything; the parent runs it with `--ignored`.
#[tokio::test]
#[ignore = "the child process of a_crash_mid_write_leaves_a_consistent_store"]
async fn crash_child_writer() {
    let Ok(dir) = std::env::var("STORE_CRASH_CHILD_DIR") else {
        return;
    };
    let mut store = raft_store::open(std::path::Path::new(&dir)).unwrap();
    let first = entry(1, create("t"));
    store.log_store.blocking_append([first.clone()]).await.unwrap();
    store.state_machine.apply([first]).await.unwrap();
    for index in 2.. {
        let e = entry(index, publish("t", &format!("m{index}")));
        store.log_store.blocking_append([e.clone()]).await.unwrap();
        println!("durable {index}");
        store.state_machine.apply([e]).await.unwrap();
        if index == CRASH_CHILD_SNAPSHOT_AT {
            let snapshot = store.state_machine.get_snapshot_builder().await.build_snapshot().await.unwrap();
            println!("snapshot {}", snapshot.meta.last_log_id.unwrap().index);
        }
    }
}

#[test]
fn a_crash_mid_write_leaves_a_consistent_store() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "crash_child_writer", "--ignored", "--nocapture", "--test-threads", "1"])
        .env("STORE_CRASH_CHILD_DIR", dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (mut durable, mut snapshot) = (0u64, None);
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    while durable < 300 {
        let Some(Ok(line)) = lines.next() else { break };
        if let Some(n) = line.strip_prefix("durable ") {
            durable = n.parse().unwrap();
        } else if let Some(n) = line.strip_prefix("snapshot ") {
            snapshot = Some(n.parse::<u64>().unwrap());
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(durable >= 300, "the child wrote too little before the kill");
    let snapshot = snapshot.expect("the child built its snapshot");

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut store = raft_store::open(dir.path()).unwrap();
        // Every append reported durable is in the log.
        let log = store.log_store.get_log_reader().await.try_get_log_entries(1..=durable).await.unwrap();
        assert_eq!(log.len() as u64, durable);
        // The state machine is a prefix of the log (applies skip the WAL, so a crash may take
        // the newest back), never older than the snapshot, which openraft may purge up to.
        let (applied, _) = store.state_machine.applied_state().await.unwrap();
        let applied = applied.map(|l| l.index).unwrap_or(0);
        assert!(applied >= snapshot, "applied {applied} is behind the snapshot at {snapshot}");
        let topic = store.reader.topic("t").expect("topic t");
        assert_eq!(topic.current_sequence, applied - 1, "one message per entry after the create");
        // What openraft does on start: apply the durable entries after last_applied again.
        let redo: Vec<Entry> = log.into_iter().filter(|e| e.log_id.index > applied).collect();
        store.state_machine.apply(redo).await.unwrap();
        let topic = store.reader.topic("t").expect("topic t");
        assert_eq!(topic.current_sequence, durable - 1, "every durable publish is stored once");
        let messages = store.reader.read_messages(topic.id, 0, 1000).unwrap();
        let expected: Vec<u64> = (1..=topic.current_sequence.min(1000)).collect();
        assert_eq!(messages.iter().map(|(s, _)| *s).collect::<Vec<_>>(), expected);
        for (seq, m) in &messages {
            assert_eq!(m.id, format!("m{}", seq + 1));
            assert_eq!(store.reader.dedup(topic.id, &m.id).unwrap(), Some(*seq));
        }
    });
}

/// A batch publish looks its ids up together (one batched RocksDB read): what it finds must
/// be what one lookup per message would find, in apply calls before it, in the same apply
/// call, and in the batch itself.
#[tokio::test]
async fn a_batch_publish_finds_every_kind_of_duplicate() {
    use raft_store::PublishResult::{Duplicate, Stored};
    let dir = tempfile::tempdir().unwrap();
    let mut store = raft_store::open(dir.path()).unwrap();
    let batch = |ids: &[&str]| {
        let messages =
            ids.iter().map(|id| NewMessage { id: (*id).into(), timestamp: 9, payload: Bytes::from("1") }).collect();
        Request::Publish { topic: "a".into(), messages, now_ms: 10 }
    };
    store.state_machine.apply([entry(1, create("a")), entry(2, batch(&["old-1", "old-2"]))]).await.unwrap();
    let r = store
        .state_machine
        .apply([entry(3, batch(&["same-call"])), entry(4, batch(&["new-1", "old-2", "same-call", "new-1", "new-2"]))])
        .await
        .unwrap();
    let results = |sequences: Vec<raft_store::PublishResult>| Response::Published { results: sequences };
    assert_eq!(r[0], results(vec![Stored { sequence: 3 }]));
    assert_eq!(
        r[1],
        results(vec![
            Stored { sequence: 4 },
            Duplicate { existing_sequence: 2 },
            Duplicate { existing_sequence: 3 },
            Duplicate { existing_sequence: 4 },
            Stored { sequence: 5 },
        ])
    );
    let generated = Request::publish(
        "a".into(),
        vec![NewMessage { id: "g".into(), timestamp: 9, payload: Bytes::from("1") }],
        10,
        true,
    );
    store.state_machine.apply([entry(5, generated)]).await.unwrap();
    let r = store.state_machine.apply([entry(6, batch(&["g", "new-3"]))]).await.unwrap();
    assert_eq!(r[0], results(vec![Duplicate { existing_sequence: 6 }, Stored { sequence: 7 }]));

    // Single-message publishes packed into one entry by the proposer are read ahead together.
    let packed = Request::Batch(vec![batch(&["new-3"]), batch(&["new-4"]), batch(&["old-1"]), batch(&["new-4"])]);
    let r = store.state_machine.apply([entry(7, packed)]).await.unwrap();
    let expected = [Duplicate { existing_sequence: 7 }, Stored { sequence: 8 }, Duplicate { existing_sequence: 1 }];
    let mut expected: Vec<Response> = expected.into_iter().map(|r| results(vec![r])).collect();
    expected.push(results(vec![Duplicate { existing_sequence: 8 }]));
    assert_eq!(r[0], Response::Batch(expected));
}

/// Counts what the log store reports about its fsyncs.
#[derive(Default)]
struct FsyncCount {
    fsyncs: std::sync::atomic::AtomicUsize,
    appends: std::sync::atomic::AtomicUsize,
}

impl raft_store::FsyncObserver for FsyncCount {
    fn log_fsynced(&self, appends: usize, _elapsed: Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        self.fsyncs.fetch_add(1, Relaxed);
        self.appends.fetch_add(appends, Relaxed);
    }
}

#[tokio::test]
async fn every_durable_append_is_reported_to_the_fsync_observer() {
    use std::sync::atomic::Ordering::Relaxed;
    let dir = tempfile::tempdir().unwrap();
    let mut store = raft_store::open(dir.path()).unwrap();
    let seen = std::sync::Arc::new(FsyncCount::default());
    store.log_store.observe_fsyncs(seen.clone());
    // The leader's own entries (leader 1 is this node): through the syncer thread.
    store.log_store.set_node_id(1).unwrap();
    store.log_store.blocking_append([entry(1, create("a"))]).await.unwrap();
    store.log_store.blocking_append([entry(2, publish("a", "x")), entry(3, publish("a", "y"))]).await.unwrap();
    assert_eq!(seen.appends.load(Relaxed), 2, "two appends made durable");
    assert!((1..=2).contains(&seen.fsyncs.load(Relaxed)));
    // Another leader's entries, as a follower: fsynced inline, one fsync each.
    let follower_dir = tempfile::tempdir().unwrap();
    let mut follower = raft_store::open(follower_dir.path()).unwrap();
    let inline = std::sync::Arc::new(FsyncCount::default());
    follower.log_store.observe_fsyncs(inline.clone());
    follower.log_store.set_node_id(2).unwrap();
    for i in 1..=3 {
        follower.log_store.blocking_append([entry(i, publish("a", &format!("m{i}")))]).await.unwrap();
    }
    assert_eq!((inline.fsyncs.load(Relaxed), inline.appends.load(Relaxed)), (3, 3));
}

/// A store (inline fsyncs) holding entries 0–2, appended and applied: from index 0, as a real
/// log (openraft reads the first entry's id on start).
async fn store_with_durable_entries(dir: &std::path::Path) -> raft_store::Store {
    let mut store = raft_store::open_with(dir, raft_store::IoMode::Inline).unwrap();
    let durable = vec![entry(0, create("a")), entry(1, publish("a", "x")), entry(2, publish("a", "y"))];
    store.log_store.blocking_append(durable.clone()).await.unwrap();
    store.state_machine.apply(durable).await.unwrap();
    store
}

/// Entries 3 and 4, which the power cuts below lose from the log.
fn lost_entries() -> Vec<Entry> {
    vec![entry(3, publish("a", "z")), entry(4, publish("a", "w"))]
}

/// Drops every handle of `store` and waits until RocksDB is closed.
async fn close(store: raft_store::Store) {
    let closed = store.closed;
    drop((store.log_store, store.state_machine, store.reader));
    assert!(closed.wait(Duration::from_secs(5)).await);
}

/// The log's only segment file and its length when marked: a power cut loses what was written
/// to it after, never fsynced.
struct LogCut {
    segment: std::path::PathBuf,
    len: u64,
}

impl LogCut {
    fn here(dir: &std::path::Path) -> Self {
        let segment = std::fs::read_dir(dir.join("log")).unwrap().next().unwrap().unwrap().path();
        let len = std::fs::metadata(&segment).unwrap().len();
        Self { segment, len }
    }

    fn power_cut(&self) {
        std::fs::OpenOptions::new().write(true).open(&self.segment).unwrap().set_len(self.len).unwrap();
    }
}

/// A leader saves a commit index its followers fsynced before its own flush of those entries
/// ends (`save_committed` is not fsynced), and a later synced write (a vote) can make the index
/// durable first. After a power cut that loses the unflushed entries, the node must still start:
/// openraft re-applies up to the commit index it reads, so it may never be past the log.
#[tokio::test]
async fn a_commit_index_ahead_of_the_durable_log_after_a_power_cut_still_starts() {
    use openraft::storage::StorageHelper;
    use openraft::Vote;
    let dir = tempfile::tempdir().unwrap();
    let cut = {
        let mut store = store_with_durable_entries(dir.path()).await;
        let cut = LogCut::here(dir.path());
        store.log_store.blocking_append(lost_entries()).await.unwrap();
        store.log_store.save_committed(Some(LogId::new(CommittedLeaderId::new(1, 1), 4))).await.unwrap();
        store.log_store.save_vote(&Vote::new(2, 2)).await.unwrap();
        close(store).await;
        cut
    };
    // The power cut: entries 3 and 4 never reached the disk.
    cut.power_cut();

    let mut store = raft_store::open_with(dir.path(), raft_store::IoMode::Inline).unwrap();
    let committed = store.log_store.read_committed().await.unwrap();
    assert_eq!(committed.map(|c| c.index), Some(2), "the commit index is cut to the log's end");
    let state = StorageHelper::new(&mut store.log_store, &mut store.state_machine).get_initial_state().await;
    state.expect("the node starts");
    let (applied, _) = store.state_machine.applied_state().await.unwrap();
    assert_eq!(applied.map(|a| a.index), Some(2));
}

/// A leader applies entries its followers fsynced before its own flush of them ends, and the
/// state machine may reach the disk first. After a power cut that loses those entries from the
/// log, openraft purges the log up to the state machine on start; the snapshot must then cover
/// the purge, or a follower behind it would be sent a snapshot that leaves it needing purged
/// entries, again and again.
#[tokio::test]
async fn a_state_machine_ahead_of_the_durable_log_after_a_power_cut_gets_a_snapshot_covering_it() {
    use openraft::storage::StorageHelper;
    let dir = tempfile::tempdir().unwrap();
    let cut = {
        let mut store = store_with_durable_entries(dir.path()).await;
        let built = store.state_machine.get_snapshot_builder().await.build_snapshot().await.unwrap();
        assert_eq!(built.meta.last_log_id.map(|l| l.index), Some(2));
        let cut = LogCut::here(dir.path());
        store.log_store.blocking_append(lost_entries()).await.unwrap();
        store.state_machine.apply(lost_entries()).await.unwrap();
        // The state machine reaches the disk, as a memtable flush may before a power cut.
        store.closed.stop_cleanly();
        close(store).await;
        cut
    };
    // The power cut: entries 3 and 4 never reached the log's disk.
    cut.power_cut();

    let mut store = raft_store::open_with(dir.path(), raft_store::IoMode::Inline).unwrap();
    StorageHelper::new(&mut store.log_store, &mut store.state_machine).get_initial_state().await.unwrap();
    let log = store.log_store.get_log_state().await.unwrap();
    assert_eq!(log.last_purged_log_id.map(|l| l.index), Some(4), "purged up to the state machine");
    let snapshot = store.state_machine.get_current_snapshot().await.unwrap().expect("a snapshot");
    assert_eq!(snapshot.meta.last_log_id.map(|l| l.index), Some(4), "the snapshot covers the purge");
}

#[tokio::test]
async fn a_data_dir_is_refused_to_a_node_it_does_not_belong_to() {
    let dir = tempfile::tempdir().unwrap();
    let closed = {
        let store = raft_store::open(dir.path()).unwrap();
        store.log_store.set_node_id(2).unwrap();
        store.closed
    };
    assert!(closed.wait(Duration::from_secs(5)).await);
    let store = raft_store::open(dir.path()).unwrap();
    let refused = store.log_store.set_node_id(3).unwrap_err();
    assert!(matches!(refused, raft_store::StoreError::OtherNode { stored: 2, given: 3 }), "{refused}");
    assert!(refused.to_string().contains("node 2's state, not node 3's"), "{refused}");
    // Its own id is still welcome.
    store.log_store.set_node_id(2).unwrap();
}

/// The bound on a topic's recorded cursors is counted in memory: the count must be the same
/// after a restart (counted from disk) and on a node that installed a snapshot, or replicas
/// would refuse different acks. Acks and forgets within one applied batch see each other.
#[tokio::test]
async fn the_recorded_cursor_bound_holds_after_a_restart_and_a_snapshot_install() {
    use raft_store::command::AckRecord;
    use raft_store::limits::CURSORS_PER_TOPIC_MAX;
    let ack = |id: &str| AckRecord { topic: "a".into(), subscriber_id: id.into(), sequence: 1 };
    let acked = |acks: Vec<AckRecord>| Request::AckBounded { acks };
    let forget = |id: &str| Request::ForgetCursor { topic: "a".into(), subscriber_id: id.into() };
    let refused = |id: &str| vec![Response::AcksRefused { refused: vec![ack(id)] }];
    let (dir, follower_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());

    let mut store = raft_store::open(dir.path()).unwrap();
    let fill: Vec<AckRecord> = (1..CURSORS_PER_TOPIC_MAX).map(|i| ack(&format!("s{i}"))).collect();
    // One batch: the last place taken twice over (an ack, its forget, another ack), then full.
    let entries = vec![
        entry(1, create("a")),
        entry(2, acked(fill)),
        entry(3, acked(vec![ack("x")])),
        entry(4, forget("x")),
        entry(5, acked(vec![ack("y"), ack("z")])),
    ];
    let responses = store.state_machine.apply(entries).await.unwrap();
    assert_eq!(responses[4], refused("z")[0]);
    assert_eq!(store.reader.cursors(1, usize::MAX).unwrap().len() as u64, CURSORS_PER_TOPIC_MAX);
    let snapshot = store.state_machine.get_snapshot_builder().await.build_snapshot().await.unwrap();
    let closed = store.closed;
    drop((store.log_store, store.state_machine, store.reader));
    assert!(closed.wait(Duration::from_secs(5)).await);

    let mut store = raft_store::open(dir.path()).unwrap();
    assert_eq!(store.state_machine.apply([entry(6, acked(vec![ack("new")]))]).await.unwrap(), refused("new"));
    assert_eq!(store.state_machine.apply([entry(7, acked(vec![ack("s1")]))]).await.unwrap(), vec![Response::Acked]);

    let mut follower = raft_store::open(follower_dir.path()).unwrap();
    follower.state_machine.install_snapshot(&snapshot.meta, snapshot.snapshot).await.unwrap();
    assert_eq!(follower.state_machine.apply([entry(6, acked(vec![ack("new")]))]).await.unwrap(), refused("new"));
    follower.state_machine.apply([entry(7, forget("s1"))]).await.unwrap();
    let r = follower.state_machine.apply([entry(8, acked(vec![ack("new")]))]).await.unwrap();
    assert_eq!(r, vec![Response::Acked], "a forgotten cursor makes room");
}

/// The cluster id is set once, kept across a restart and carried to a node by a snapshot.
#[tokio::test]
async fn the_cluster_id_is_set_once_and_survives_a_restart_and_a_snapshot_install() {
    let set = |id: &str| Request::SetClusterId { id: id.into() };
    let (dir, follower_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut store = raft_store::open(dir.path()).unwrap();
    assert_eq!(store.reader.cluster_id(), None);
    store.state_machine.apply([entry(1, set("ours")), entry(2, set("theirs"))]).await.unwrap();
    assert_eq!(store.reader.cluster_id(), Some("ours"));
    let snapshot = store.state_machine.get_snapshot_builder().await.build_snapshot().await.unwrap();
    let closed = store.closed;
    drop((store.log_store, store.state_machine, store.reader));
    assert!(closed.wait(Duration::from_secs(5)).await);

    let mut store = raft_store::open(dir.path()).unwrap();
    assert_eq!(store.reader.cluster_id(), Some("ours"));
    store.state_machine.apply([entry(3, set("later"))]).await.unwrap();
    assert_eq!(store.reader.cluster_id(), Some("ours"));

    let mut follower = raft_store::open(follower_dir.path()).unwrap();
    follower.state_machine.install_snapshot(&snapshot.meta, snapshot.snapshot).await.unwrap();
    assert_eq!(follower.reader.cluster_id(), Some("ours"));
}

/// Which nodes are short of disk room is kept across a restart and carried to a node by a
/// snapshot, and a node that has room again is no longer listed.
#[tokio::test]
async fn nodes_short_of_disk_survive_a_restart_and_a_snapshot_install() {
    let short = |node_id, short, now_ms| Request::SetDiskShort { node_id, short, now_ms };
    let (dir, follower_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut store = raft_store::open(dir.path()).unwrap();
    assert!(!store.reader.any_disk_short());
    store.state_machine.apply([entry(1, short(2, true, 100)), entry(2, short(3, true, 200))]).await.unwrap();
    assert!(store.reader.any_disk_short());
    assert_eq!(store.reader.disk_short_claims(), BTreeMap::from([(2, 100), (3, 200)]));
    let snapshot = store.state_machine.get_snapshot_builder().await.build_snapshot().await.unwrap();
    let closed = store.closed;
    drop((store.log_store, store.state_machine, store.reader));
    assert!(closed.wait(Duration::from_secs(5)).await);

    let mut store = raft_store::open(dir.path()).unwrap();
    assert_eq!(store.reader.disk_short_claim(2), Some(100));
    store.state_machine.apply([entry(3, short(2, false, 300)), entry(4, short(3, false, 300))]).await.unwrap();
    assert!(!store.reader.any_disk_short());

    let mut follower = raft_store::open(follower_dir.path()).unwrap();
    follower.state_machine.install_snapshot(&snapshot.meta, snapshot.snapshot).await.unwrap();
    assert_eq!(follower.reader.disk_short_claims(), BTreeMap::from([(2, 100), (3, 200)]));
    assert!(follower.reader.any_disk_short());
}

/// `--force-new-cluster`: the membership entry of the one voter follows the last entry, under
/// a term above both the vote's and the last entry's, with a committed vote of the node in
/// that term; both are durable (read back after a restart). A log that holds nothing writes
/// nothing.
#[tokio::test]
async fn forcing_a_single_voter_appends_its_membership_under_a_new_term() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = raft_store::open_with(dir.path(), raft_store::IoMode::Inline).unwrap();
    store.log_store.blocking_append(vec![entry(1, create("a")), entry(2, publish("a", "x"))]).await.unwrap();
    store.log_store.save_vote(&openraft::Vote::new_committed(3, 2)).await.unwrap();
    let node = raft_store::Node { addr: "h:1".into() };
    let forced = store.log_store.force_single_voter(2, node.clone(), None).unwrap().expect("a log to force");
    assert_eq!(forced, LogId::new(CommittedLeaderId::new(4, 2), 3));
    close(store).await;

    let mut store = raft_store::open(dir.path()).unwrap();
    assert_eq!(store.log_store.read_vote().await.unwrap(), Some(openraft::Vote::new_committed(4, 2)));
    let last = store.log_store.get_log_reader().await.try_get_log_entries(3..4).await.unwrap();
    let [Entry { log_id, payload: EntryPayload::Membership(membership) }] = &last[..] else {
        panic!("no membership entry at 3: {last:?}")
    };
    assert_eq!(*log_id, forced);
    assert_eq!(membership.voter_ids().collect::<Vec<_>>(), [2]);
    assert_eq!(membership.get_node(&2), Some(&node));
    close(store).await;

    let empty = tempfile::tempdir().unwrap();
    let mut store = raft_store::open(empty.path()).unwrap();
    assert_eq!(store.log_store.force_single_voter(1, node.clone(), None).unwrap(), None);
    assert_eq!(store.log_store.read_vote().await.unwrap(), None);
    close(store).await;

    // The state machine past the log's end (an install redone at open, its purge never run):
    // the log is purged up to it and the entry follows it.
    let behind = tempfile::tempdir().unwrap();
    let mut store = raft_store::open(behind.path()).unwrap();
    store.log_store.blocking_append(vec![entry(1, create("a"))]).await.unwrap();
    let applied = LogId::new(CommittedLeaderId::new(5, 1), 40);
    let forced = store.log_store.force_single_voter(3, node, Some(applied)).unwrap().expect("a state to force");
    assert_eq!(forced, LogId::new(CommittedLeaderId::new(6, 3), 41));
    let state = store.log_store.get_log_state().await.unwrap();
    assert_eq!((state.last_purged_log_id, state.last_log_id), (Some(applied), Some(forced)));
}
