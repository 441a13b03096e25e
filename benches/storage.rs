//! Criterion benches of the storage layer: `cargo bench -p pubsub-benches --bench storage`.

use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use openraft::storage::{RaftLogStorageExt, RaftStateMachine};
use openraft::{CommittedLeaderId, EntryPayload, LogId};
use raft_store::typ::Entry;
use raft_store::{NewMessage, Request, Retention};

const PAYLOAD_BYTES: usize = 256;

fn payload() -> Bytes {
    Bytes::from(format!("\"{}\"", "x".repeat(PAYLOAD_BYTES - 2)))
}

fn entry(index: u64, request: Request) -> Entry {
    Entry { log_id: LogId::new(CommittedLeaderId::new(1, 1), index), payload: EntryPayload::Normal(request) }
}

/// `n` messages with UUIDs for ids: time-ordered v7 as the Rust client gives every message
/// (so that retries are safe), or random v4 as the leader generates when `ids_generated`.
fn publish(n: usize, ids_generated: bool) -> Request {
    let id = || if ids_generated { uuid::Uuid::new_v4() } else { uuid::Uuid::now_v7() }.to_string();
    let messages = (0..n).map(|_| NewMessage { id: id(), timestamp: 1, payload: payload() }).collect();
    Request::publish("bench".into(), messages, 1, ids_generated)
}

fn log_append(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let mut group = c.benchmark_group("log_append_fsync");
    group.measurement_time(Duration::from_secs(5)).sample_size(20);
    for batch in [1usize, 64, 1024] {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = raft_store::open(dir.path()).expect("open");
        let mut log = store.log_store;
        let mut index = 0u64;
        group.throughput(Throughput::Elements(batch as u64));
        group.bench_with_input(BenchmarkId::new("batch", batch), &batch, |b, &batch| {
            b.iter(|| {
                let entries: Vec<Entry> = (0..batch)
                    .map(|_| {
                        index += 1;
                        entry(index, publish(1, false))
                    })
                    .collect();
                rt.block_on(log.blocking_append(entries)).expect("append");
            })
        });
    }
    // Eight appenders at once, one entry each: group commit shares one fsync among them.
    let dir = tempfile::tempdir().expect("tempdir");
    let store = raft_store::open(dir.path()).expect("open");
    let log = store.log_store;
    let mut round = 0u64;
    group.throughput(Throughput::Elements(8));
    group.bench_function("concurrent_8x1", |b| {
        b.iter(|| {
            round += 1;
            rt.block_on(async {
                let tasks: Vec<_> = (0..8u64)
                    .map(|i| {
                        let mut log = log.clone();
                        let e = entry(round * 8 + i, publish(1, false));
                        tokio::spawn(async move { log.blocking_append([e]).await })
                    })
                    .collect();
                for t in tasks {
                    t.await.expect("join").expect("append");
                }
            })
        })
    });
    group.finish();
}

/// Makes the requests of one iteration.
type Requests = fn() -> Vec<Request>;

fn sm_apply(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let mut group = c.benchmark_group("state_machine_apply_256B");
    group.measurement_time(Duration::from_secs(5)).sample_size(20);
    // 256 messages per iteration, shaped as: 256 entries of one message; one entry of 256 (a
    // batch publish), with client or generated ids; one entry packing 256 single-message
    // publishes (what the proposer makes of concurrent publishes).
    let cases: [(&str, Requests); 4] = [
        ("single", || (0..256).map(|_| publish(1, false)).collect()),
        ("batch_256", || vec![publish(256, false)]),
        ("batch_256_generated_ids", || vec![publish(256, true)]),
        ("packed_256_single", || vec![Request::Batch((0..256).map(|_| publish(1, false)).collect())]),
    ];
    for (name, requests) in cases {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = raft_store::open(dir.path()).expect("open");
        let mut sm = store.state_machine;
        let mut index = 1u64;
        let create =
            Request::CreateTopic { topic: "bench".into(), metadata: None, retention: Retention::default(), now_ms: 1 };
        rt.block_on(sm.apply([entry(index, create)])).expect("create");
        group.throughput(Throughput::Elements(256));
        group.bench_function(name, |b| {
            b.iter(|| {
                let batch: Vec<Entry> = requests()
                    .into_iter()
                    .map(|request| {
                        index += 1;
                        entry(index, request)
                    })
                    .collect();
                rt.block_on(sm.apply(batch)).expect("apply");
            })
        });
    }
    group.finish();
}

criterion_group!(benches, log_append, sm_apply);
criterion_main!(benches);
