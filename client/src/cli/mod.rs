//! The `pubsub` command-line tool. `src/main.rs` calls [`main`]; each subcommand lives in
//! its own file and gets a [`Client`] and an [`Output`].
//!
//! Exit codes: 0 ok, 1 the server said no (its error code and message are printed),
//! 2 usage (clap's own code; also input that cannot be used, such as a line that is not
//! UTF-8), 3 the cluster was unreachable or had no leader after retries.

pub mod args;
mod bench;
mod cluster;
mod output;
mod publish;
mod subscribe;
mod topics;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use crate::client::Client;
use crate::error::Error;
use crate::limits;
pub use args::Args;
use args::Command;
pub use output::Output;

/// Exit code: the command did what was asked.
pub const EXIT_OK: u8 = 0;
/// Exit code: the server refused (or answered something unusable).
pub const EXIT_REFUSED: u8 = 1;
/// Exit code: the command line was wrong (clap uses 2 too), or its input could not be used.
pub const EXIT_USAGE: u8 = 2;
/// Exit code: no node could be reached, or no leader emerged, within the retry budget.
pub const EXIT_UNREACHABLE: u8 = 3;

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A client call failed.
    #[error(transparent)]
    Client(#[from] Error),
    /// The arguments make no sense together, or input could not be used.
    #[error("{0}")]
    Usage(String),
    /// Writing output failed (or another local I/O error; an input line that cannot be read
    /// is [`CliError::Usage`], naming the line).
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The server accepted the request but refused part of it.
    #[error("{0}")]
    Refused(String),
    /// Whoever read our output went away (a closed pipe): stop quietly.
    #[error("output closed")]
    OutputClosed,
}

impl CliError {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Client(e) if e.is_unreachable() => EXIT_UNREACHABLE,
            CliError::Client(Error::InvalidArgument(_) | Error::InvalidAddress { .. }) => EXIT_USAGE,
            CliError::Client(_) | CliError::Io(_) | CliError::Refused(_) => EXIT_REFUSED,
            CliError::Usage(_) => EXIT_USAGE,
            CliError::OutputClosed => EXIT_OK,
        }
    }
}

/// Entry point of the `pubsub` binary: parses the command line (exiting 2 on a usage
/// error), runs the command on a tokio runtime and maps the outcome to an exit code.
pub fn main() -> ExitCode {
    let args = Args::parse();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let output = Output::new(args.json);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            output.error(&CliError::Io(e));
            return ExitCode::from(EXIT_REFUSED);
        }
    };
    match runtime.block_on(run(args, &output)) {
        Ok(()) => ExitCode::from(EXIT_OK),
        Err(CliError::OutputClosed) => ExitCode::from(EXIT_OK),
        Err(e) => {
            output.error(&e);
            ExitCode::from(e.exit_code())
        }
    }
}

/// Runs one parsed command line.
pub async fn run(args: Args, output: &Output) -> Result<(), CliError> {
    let client = build_client(&args)?;
    match args.command {
        Command::Cluster(cluster) => cluster::run(&client, output, cluster.command).await,
        Command::Topics(command) => topics::run(&client, output, command).await,
        Command::Publish(publish) => publish::run(&client, output, publish).await,
        Command::Subscribe(subscribe) => subscribe::subscribe(&client, output, subscribe).await,
        Command::Tail(tail) => subscribe::tail(&client, output, tail).await,
        Command::Read(read) => subscribe::read(&client, output, read).await,
        Command::Bench(bench) => bench::run(&client, output, bench).await,
    }
}

fn build_client(args: &Args) -> Result<Client, CliError> {
    let servers: Vec<String> = args.servers.iter().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
    let mut builder = Client::builder(servers);
    if let Some(ms) = args.timeout_ms {
        let request = Duration::from_millis(ms.max(1));
        // An attempt gets at most what is left of the operation's budget: a budget shorter
        // than the attempt asked for would cut it short.
        builder = builder.request_timeout(request).operation_timeout(request.max(limits::OPERATION_TIMEOUT_DEFAULT));
    }
    if let Some(attempts) = args.attempts {
        builder = builder.attempts_max(attempts);
    }
    Ok(builder.build()?)
}

#[cfg(test)]
mod tests;
