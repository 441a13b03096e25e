//! `pubsub bench`

use std::time::Duration;

use super::args::{AckArg, BenchArgs, TransportArg};
use super::{CliError, Output};
use crate::bench::{self, BenchConfig, BenchReport};
use crate::client::Client;
use crate::limits;

pub(super) async fn run(client: &Client, output: &Output, args: BenchArgs) -> Result<(), CliError> {
    check(&args)?;
    let config = BenchConfig {
        topic: args.topic.unwrap_or_else(|| format!("bench-{}", &uuid::Uuid::new_v4().simple().to_string()[..8])),
        publishers: args.publishers as usize,
        inflight: args.inflight as usize,
        messages: args.messages,
        payload_bytes: args.payload_bytes,
        payload_content: args.payload_content,
        batch: args.batch as usize,
        subscribers: args.subscribers as usize,
        duration: args.duration_secs.map(Duration::from_secs),
        ack: args.ack.into(),
        transport: args.transport.into(),
        rate: args.rate,
        drain_timeout: Duration::from_secs(args.drain_secs),
        progress: output.progress(),
    };
    let report = bench::run(client, &config).await?;
    if !output.json {
        for line in summary(&report) {
            output.line(&line)?;
        }
    }
    // The last line is always the JSON report, for scripts in either mode.
    output.json_line(&report)?;
    // The report is out either way; the exit status says whether the run was clean, so a
    // script (or CI) notices publishes that failed or deliveries that never came.
    if report.errors > 0 {
        return Err(CliError::Refused(format!(
            "{} of {} publishes failed; the first: {}",
            report.errors,
            report.messages + report.errors,
            report.first_error.as_deref().unwrap_or("unknown error")
        )));
    }
    if let Some(missing @ 1..) = report.deliver_missing {
        return Err(CliError::Refused(format!("{missing} deliveries never reached their subscribers")));
    }
    Ok(())
}

/// Refuses flag combinations the ws transport cannot run, as usage errors.
pub(super) fn check(args: &BenchArgs) -> Result<(), CliError> {
    if args.transport != TransportArg::Ws {
        return Ok(());
    }
    if args.batch != 1 {
        return Err(CliError::Usage("--transport ws publishes one message per frame: use --batch 1".into()));
    }
    if args.ack != AckArg::Committed {
        return Err(CliError::Usage("--transport ws acks after commit only: drop --ack appended".into()));
    }
    if args.inflight as usize > limits::PUBLISH_WS_INFLIGHT_MAX {
        return Err(CliError::Usage(format!(
            "--transport ws allows at most {} publishes in flight per publisher (the server's limit)",
            limits::PUBLISH_WS_INFLIGHT_MAX
        )));
    }
    Ok(())
}

/// The report for people.
fn summary(r: &BenchReport) -> Vec<String> {
    let mut lines = vec![
        format!(
            "{}: {} publishers x {} in flight over {}, batch {}, {} B payloads ({}), {}, topic {}",
            r.workload,
            r.publishers,
            r.inflight,
            r.transport.as_str(),
            r.batch,
            r.payload_bytes,
            r.payload_content.as_str(),
            r.rate.map_or_else(|| "unpaced".to_string(), |rate| format!("{rate} msg/s")),
            r.topic
        ),
        format!(
            "published {} messages in {:.2} s: {:.0} msg/s, {} errors",
            r.messages, r.duration_secs, r.msgs_per_sec, r.errors
        ),
        format!(
            "publish latency  p50 {:.2} ms  p99 {:.2} ms  p99.9 {:.2} ms  max {:.2} ms",
            r.p50_ms, r.p99_ms, r.p999_ms, r.max_ms
        ),
    ];
    if let Some(e) = &r.first_error {
        lines.push(format!("first error: {e}"));
    }
    if let (Some(p50), Some(p99), Some(p999), Some(max)) =
        (r.deliver_p50_ms, r.deliver_p99_ms, r.deliver_p999_ms, r.deliver_max_ms)
    {
        lines.push(format!("deliver latency  p50 {p50:.2} ms  p99 {p99:.2} ms  p99.9 {p999:.2} ms  max {max:.2} ms"));
        lines.push(format!(
            "delivered {} to {} subscribers, {} missing, {} stream errors",
            r.delivered.unwrap_or(0),
            r.subscribers,
            r.deliver_missing.unwrap_or(0),
            r.deliver_errors.unwrap_or(0)
        ));
    }
    lines
}
