//! The `pubsub-node` binary: parse flags, set up logging, bind, run.

use axum::serve::ListenerExt;
use clap::Parser;
use pubsub_node::{Config, Env, Flags};

/// jemalloc rather than glibc's malloc: Raft batches and log reads allocate buffers of
/// megabytes on every worker thread, and glibc kept what a catch-up touched (resident memory
/// went from 160 to 387 MiB after a restart with 1,000,000 messages and never came back);
/// jemalloc's background threads return freed pages to the OS.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() {
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
    let listener = match tokio::net::TcpListener::bind(config.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: cannot listen on {}: {e}", config.listen);
            std::process::exit(2);
        }
    };
    // Nagle's algorithm would hold a small frame (a WebSocket publish ack, a message to a
    // subscriber, an AppendEntries answer) until the peer acknowledges the previous one: up to
    // a delayed-ACK timeout (40 ms) added to a latency that is otherwise under a millisecond.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::warn!(error = %e, "cannot set TCP_NODELAY on an accepted connection");
        }
    });
    if let Err(e) = pubsub_node::run(config, listener, Env::production(), shutdown_signal()).await {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
    // `run` returned only after RocksDB was closed and everything was flushed. Exit without
    // running C++ static destructors: RocksDB's process-wide thread pool can still be tearing
    // down, and destroying its mutexes under it aborts the process ("pthread lock: Invalid
    // argument") instead of exiting 0.
    use std::io::Write;
    let _ = std::io::stderr().flush();
    let _ = std::io::stdout().flush();
    // SAFETY: _exit ends the process at once; nothing runs after it, so no Rust invariant can
    // be observed broken.
    unsafe { libc::_exit(0) }
}

/// SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
