//! The `pubsub-node` binary: parse flags, set up logging, bind, run.

use axum::serve::ListenerExt;
use clap::Parser;
use pubsub_node::limits::{
    DELIVERY_CORES_PER_THREAD, DELIVERY_THREAD_NICE, OPEN_FILES_UNLIMITED_CAP, OPEN_FILES_WANTED,
};
use pubsub_node::{Config, Env, Flags};

/// jemalloc rather than glibc's malloc: Raft batches and log reads allocate buffers of
/// megabytes on every worker thread, and glibc kept what a catch-up touched (resident memory
/// went from 160 to 387 MiB after a restart with 1,000,000 messages and never came back);
/// jemalloc's background threads return freed pages to the OS.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    // Before any thread starts, so that every one sees the raised limit.
    let open_files = raise_open_files_limit();
    let delivery = delivery_runtime();
    let node =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("cannot start the tokio runtime");
    node.block_on(node_main(delivery.handle().clone(), open_files));
}

/// The open-files limit as found and as raised: the soft limit goes up to the hard one (as
/// Go's runtime does for NATS and etcd), since every subscription and client connection is a
/// file and a common soft limit of 1,024 would refuse connections long before
/// [`OPEN_FILES_WANTED`]. `None` when the limit cannot be read.
fn raise_open_files_limit() -> Option<(u64, u64)> {
    let limit = pubsub_node::open_files_limit()?;
    let found = limit.rlim_cur as u64;
    // An unlimited hard limit is not a value the soft one may take on Linux.
    let wanted = if limit.rlim_max == libc::RLIM_INFINITY { OPEN_FILES_UNLIMITED_CAP } else { limit.rlim_max as u64 };
    if wanted > found {
        let raised = libc::rlimit { rlim_cur: wanted as libc::rlim_t, rlim_max: limit.rlim_max };
        // SAFETY: setrlimit reads only the struct passed.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return Some((found, wanted));
        }
    }
    Some((found, found))
}

/// Logs the open-files limit, warning when it is below what the node may use.
fn report_open_files_limit(open_files: Option<(u64, u64)>) {
    let Some((found, now)) = open_files else {
        tracing::warn!("cannot read the open-files limit");
        return;
    };
    if now > found {
        tracing::info!(from = found, to = now, "raised the open-files limit");
    }
    if now < OPEN_FILES_WANTED as u64 {
        tracing::warn!(
            limit = now,
            wanted = OPEN_FILES_WANTED,
            "the open-files limit is below what this node may use (a file per connection and \
             subscription): past it, connections are refused; raise the hard limit (ulimit -Hn, \
             LimitNOFILE=, docker --ulimit nofile=)"
        );
    }
}

/// The runtime of subscription sessions: its own threads, at a lower priority than the
/// node's, so that fanning a message out to many subscribers does not queue ahead of the
/// next commit (Raft, the log and the publish answers run on the node's runtime).
fn delivery_runtime() -> tokio::runtime::Runtime {
    let cores = std::thread::available_parallelism().map(usize::from).unwrap_or(1);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores.div_ceil(DELIVERY_CORES_PER_THREAD))
        .thread_name("delivery")
        .enable_all()
        .on_thread_start(lower_this_threads_priority)
        .build()
        .expect("cannot start the delivery runtime")
}

/// Sets the calling thread's `nice` to [`DELIVERY_THREAD_NICE`]; the node's threads keep
/// the process's (normally 0). Linux only: there a thread id names one thread to
/// `setpriority`. Failure leaves the thread at the node's priority, which is slower under load
/// but still correct.
fn lower_this_threads_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: two syscalls about the calling thread; no memory is shared.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, DELIVERY_THREAD_NICE);
    }
}

async fn node_main(delivery: tokio::runtime::Handle, open_files: Option<(u64, u64)>) {
    // Before anything slow (opening the store, scanning the log): a signal during start-up is
    // then a clean stop once the node serves, not the default action (death, or nothing at
    // all for PID 1 in a container, which `docker stop` then kills after its grace period).
    let shutdown = shutdown_signal();
    tracing_subscriber::fmt()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,openraft=warn".into()),
        )
        .init();
    let config = match Config::from_flags(Flags::parse()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    report_open_files_limit(open_files);
    let listener = match tokio::net::TcpListener::bind(config.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: cannot listen on {}: {e}", config.listen);
            std::process::exit(2);
        }
    };
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = pubsub_node::net::tune_tcp(tcp) {
            tracing::warn!(error = %e, "cannot set TCP_NODELAY or keepalive on an accepted connection");
        }
    });
    let code = match pubsub_node::run(config, listener, Env::production(Some(delivery)), shutdown).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}{}", e.advice());
            1
        }
    };
    // `run` returned only after RocksDB was closed and everything was flushed. Exit without
    // running C++ static destructors: RocksDB's process-wide thread pool can still be tearing
    // down, and destroying its mutexes under it aborts the process ("pthread lock: Invalid
    // argument") instead of exiting with `code`.
    use std::io::Write;
    let _ = std::io::stderr().flush();
    let _ = std::io::stdout().flush();
    // SAFETY: _exit ends the process at once; nothing runs after it, so no Rust invariant can
    // be observed broken.
    unsafe { libc::_exit(code) }
}

/// SIGTERM or SIGINT (Ctrl-C), their handlers installed now, when this is called, not when the
/// future is first polled. A second one, at least [`pubsub_node::limits::SECOND_SIGNAL_AFTER`]
/// after the first while the node drains, ends the process at once: an
/// operator who asks twice does not want to wait (a write acknowledged is on a majority's disk
/// already; acks received since the last flush are delivered again, as after `kill -9`).
#[cfg(unix)]
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, Signal, SignalKind};
    async fn recv(signal: &mut Option<Signal>) {
        match signal {
            Some(s) => {
                s.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    }
    async fn next(term: &mut Option<Signal>, interrupt: &mut Option<Signal>) {
        tokio::select! {
            () = recv(term) => {},
            () = recv(interrupt) => {},
        }
    }
    let mut term = signal(SignalKind::terminate()).ok();
    let mut interrupt = signal(SignalKind::interrupt()).ok();
    async move {
        next(&mut term, &mut interrupt).await;
        let first = std::time::Instant::now();
        tokio::spawn(async move {
            // One stop often sends two signals (Ctrl-C to a process group, then a supervisor's
            // SIGTERM): only one a while after the first is an operator asking again.
            loop {
                next(&mut term, &mut interrupt).await;
                if first.elapsed() >= pubsub_node::limits::SECOND_SIGNAL_AFTER {
                    break;
                }
            }
            eprintln!("error: a second signal while stopping: exiting now");
            // SAFETY: as at the end of main, nothing runs after _exit.
            unsafe { libc::_exit(1) }
        });
    }
}

/// Ctrl-C.
#[cfg(not(unix))]
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}
