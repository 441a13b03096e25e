//! `pubsub publish TOPIC [JSON|-] [--id ID] [--batch FILE] [--ack appended]`

use std::io::BufRead;
use std::path::Path;

use super::args::{payload_from_text, PublishArgs};
use super::{CliError, Output};
use crate::client::{ensure_id, Client};
use crate::error::{Error, ErrorCode};
use crate::limits::{BATCH_MESSAGES_MAX, CLI_BATCH_BYTES};
use crate::types::{AckMode, BatchAck, BatchItem, NewMessage, PublishAck};

pub(super) async fn run(client: &Client, output: &Output, args: PublishArgs) -> Result<(), CliError> {
    if let Some(path) = &args.batch {
        let (lines, rerun) = numbered_lines(args.id_prefix);
        return batch(client, output, &args.topic, path, lines, &rerun).await;
    }
    let ack = AckMode::from(args.ack);
    match args.payload.as_deref() {
        Some("-") => {
            if args.id.is_some() {
                return Err(CliError::Usage("--id names one message; it cannot be used with `-`".into()));
            }
            let (mut lines, rerun) = numbered_lines(args.id_prefix);
            let stdin = &mut std::io::stdin().lock();
            publish_lines(client, output, &args.topic, stdin, &mut lines, ack, &rerun).await
        }
        Some(_) if args.id_prefix.is_some() => {
            Err(CliError::Usage("--id-prefix numbers input lines: use it with `-` or --batch (--id for one)".into()))
        }
        Some(text) => {
            let payload = payload_from_text(text).map_err(|e| CliError::Usage(format!("the payload: {e}")))?;
            let mut message = NewMessage::new(payload);
            message.id = args.id;
            publish_one(client, output, &args.topic, message, ack).await
        }
        None => Err(CliError::Usage("give a payload, `-` or --batch FILE".into())),
    }
}

/// Input lines numbered for their ids (`-` and `--batch`), and the command that publishes
/// each line once after a failure. Every line gets an id of a known prefix, chosen here when
/// none was given, so that lines that may have been stored can be published again under the
/// same ids (the note on failure names the prefix).
fn numbered_lines(id_prefix: Option<String>) -> (Lines, String) {
    let (id_prefix, rerun) = match id_prefix {
        Some(prefix) => (prefix, "the same command again".to_string()),
        None => {
            let prefix = generated_id_prefix();
            let rerun = format!("the same command again with --id-prefix {prefix}");
            (prefix, rerun)
        }
    };
    (Lines { read: 0, id_prefix: Some(id_prefix) }, rerun)
}

/// Publishes each line of `input` (`publish -`) as it is read: one publish per line as lines
/// arrive, so `producer | pubsub publish t -` streams instead of waiting for the end of input.
/// A line that cannot be read, or whose publish fails, stops it, saying which line and that
/// the ones before it were published; `rerun` is the command that publishes each line once.
pub(super) async fn publish_lines(
    client: &Client,
    output: &Output,
    topic: &str,
    input: &mut impl BufRead,
    lines: &mut Lines,
    ack: AckMode,
    rerun: &str,
) -> Result<(), CliError> {
    let mut line = String::new();
    while lines.read_line(input, &mut line).map_err(|unreadable| unreadable.into_error(lines.read, Some(rerun)))? {
        let next = lines.next(&line).map_err(|unusable| unusable.into_error(lines.read - 1, Some(rerun)))?;
        let Some(message) = next else {
            continue;
        };
        if let Err(error) = publish_one(client, output, topic, message, ack).await {
            let error = input_left_unpublished(error);
            if !matches!(error, CliError::Io(_)) {
                let (text, value) = stopped_at(lines.read, lines.id_prefix.as_deref(), rerun);
                output.notice(&text, &value);
            }
            return Err(error);
        }
    }
    Ok(())
}

/// Where `publish -` stopped when the publish of input line `line` failed, for people and
/// as a JSON warning (with `--json` too: without the prefix it chose, the lines cannot be
/// published again under the same ids).
fn stopped_at(line: u64, id_prefix: Option<&str>, rerun: &str) -> (String, serde_json::Value) {
    let before = match line {
        1 => "no line before it was published".to_string(),
        _ => format!("{} published", lines_were(1, line - 1)),
    };
    let text = format!(
        "stopped at input line {line}: {before}; the lines after it were not; running {rerun} publishes each line once"
    );
    let value = serde_json::json!({"type": "warning", "error": "publish_stopped", "message": text, "line": line,
        "id_prefix": id_prefix});
    (text, value)
}

/// Publishes one message and prints its ack. When the publish failed in a way that may still
/// have stored it, says which id it had, so that publishing again with `--id` cannot store it
/// twice (the id is generated here when none was given, and would be lost with the error).
async fn publish_one(
    client: &Client,
    output: &Output,
    topic: &str,
    mut message: NewMessage,
    ack: AckMode,
) -> Result<(), CliError> {
    let id_given = message.id.is_some();
    let id = ensure_id(&mut message)?;
    match client.publish_message(topic, message, ack).await {
        Ok(published) => print_ack(output, &published),
        // Publishing again with `--id` is how the note below says to make sure of a message:
        // finding it stored is that command's success, not a refusal.
        // Still in flight when the retries ran out: an earlier publish of this id (an earlier
        // run's, say) may yet commit, so the outcome is unknown, as below.
        Err(Error::Api(api)) if id_given && api.code == ErrorCode::DuplicateMessageId => {
            match api.existing_sequence() {
                Some(sequence) => print_ack(output, &PublishAck::already_stored(id, topic, sequence)),
                None => {
                    output.note(&format!(
                        "an earlier publish of message {id} is still in flight and may yet be stored: \
                     publish it again with --id {id} to be sure it is stored once"
                    ));
                    Err(Error::indeterminate(Some(id), Error::Api(api)).into())
                }
            }
        }
        // The error names the id too, so `--json` callers get it.
        Err(error) if error.may_have_taken_effect() => {
            output.note(&format!(
                "message {id} may have been stored: publish it again with --id {id} to be sure it is stored once"
            ));
            Err(error.into())
        }
        Err(error) => Err(error.into()),
    }
}

/// A closed stdout ends a reading command quietly (`pubsub read t | head`), but here it would
/// stop publishing with input left over and exit 0 as if all of it were stored: fail instead.
/// What was printed before is stored; the message whose ack could not be printed is too.
fn input_left_unpublished(error: CliError) -> CliError {
    match error {
        CliError::OutputClosed => CliError::Io(std::io::Error::new(
            std::io::ErrorKind::BrokenPipe,
            "output closed: stopped publishing; the rest of the input (after the last message \
             whose ack could not be printed, which is stored) was not published",
        )),
        other => other,
    }
}

/// A message from one input line; `None` for a blank line.
fn message_from_line(line: &str) -> Result<Option<NewMessage>, String> {
    let text = line.trim();
    if text.is_empty() {
        return Ok(None);
    }
    payload_from_text(text).map(|payload| Some(NewMessage::new(payload)))
}

/// The input's lines, counted, and the ids they give with `--id-prefix`: the prefix and the
/// line's number (from 1, blank lines counted), the same on every run over the same input,
/// so running a command again after a failure stores each line once.
pub(super) struct Lines {
    /// Lines read so far.
    pub(super) read: u64,
    pub(super) id_prefix: Option<String>,
}

impl Lines {
    /// Reads the next line of `input` into `line` (cleared first); false at the end of input.
    /// A line that is not UTF-8, or a failed read, is an [`UnreadableLine`] naming its number.
    pub(super) fn read_line(&self, input: &mut impl BufRead, line: &mut String) -> Result<bool, UnreadableLine> {
        line.clear();
        match input.read_line(line) {
            Ok(0) => Ok(false),
            Ok(_) => Ok(true),
            Err(error) => Err(UnreadableLine { line: self.read + 1, reason: error.to_string() }),
        }
    }

    /// The message of the next line, `text`; `None` for a blank line. A line that starts
    /// like JSON but is not is an [`UnreadableLine`].
    pub(super) fn next(&mut self, text: &str) -> Result<Option<NewMessage>, UnreadableLine> {
        self.read += 1;
        let message = message_from_line(text).map_err(|reason| UnreadableLine { line: self.read, reason })?;
        Ok(message.map(|mut message| {
            message.id = self.id_prefix.as_ref().map(|prefix| format!("{prefix}{}", self.read));
            message
        }))
    }
}

/// An input line that could not be used: not UTF-8, the read failed, or it starts like JSON
/// but is not.
#[derive(Debug)]
pub(super) struct UnreadableLine {
    /// Its number, from 1 (blank lines counted).
    pub(super) line: u64,
    /// Why, for people.
    pub(super) reason: String,
}

impl UnreadableLine {
    /// The error to stop with: which line, and that the lines through `published_through`
    /// were published and the others, this one and all after it, were not. `rerun` is the
    /// command that publishes each line once after the input is fixed, when there is one.
    /// Exit code 2 (usage): the input could not be used, and the server was not asked.
    pub(super) fn into_error(self, published_through: u64, rerun: Option<&str>) -> CliError {
        let line = self.line;
        let mut text = format!("input line {line} could not be used ({}): ", self.reason);
        if published_through == 0 {
            text.push_str("no line was published");
        } else {
            // Lines between were read for a batch that was never sent.
            let unsent = if published_through + 1 < line {
                format!("{}, ", lines_named(published_through + 1, line - 1))
            } else {
                String::new()
            };
            let published = lines_were(1, published_through);
            text.push_str(&format!("{published} published; {unsent}line {line} and the lines after it were not"));
        }
        if let (Some(rerun), 1..) = (rerun, published_through) {
            text.push_str(&format!("; once the input is fixed, running {rerun} publishes each line once"));
        }
        CliError::Usage(text)
    }
}

/// `line N` or `lines N-M`.
fn lines_named(from: u64, to: u64) -> String {
    if from == to {
        format!("line {from}")
    } else {
        format!("lines {from}-{to}")
    }
}

/// `line N was` or `lines N-M were`.
fn lines_were(from: u64, to: u64) -> String {
    let verb = if from == to { "was" } else { "were" };
    format!("{} {verb}", lines_named(from, to))
}

/// Reads up to `max` messages (blank lines skipped), ending early once they hold
/// [`CLI_BATCH_BYTES`] as sent; an empty result means end of input.
pub(super) fn read_batch(
    reader: &mut impl BufRead,
    max: usize,
    lines: &mut Lines,
) -> Result<Vec<NewMessage>, UnreadableLine> {
    let mut messages = Vec::new();
    let mut line = String::new();
    let mut bytes = 0;
    while messages.len() < max && bytes < CLI_BATCH_BYTES {
        if !lines.read_line(reader, &mut line)? {
            break;
        }
        if let Some(message) = lines.next(&line)? {
            // As JSON in the body: a string's escapes may double its text.
            bytes += serde_json::to_vec(&message).map_or(line.len(), |json| json.len()) + GENERATED_ID_BYTES;
            messages.push(message);
        }
    }
    Ok(messages)
}

/// Room for an id the client generates at publish time (a UUID) and the separators.
const GENERATED_ID_BYTES: usize = 64;

/// A prefix no other run chooses: a time-ordered UUID, so the ids of one run sit together
/// in each node's dedup index.
fn generated_id_prefix() -> String {
    format!("{}-", uuid::Uuid::now_v7())
}

async fn batch(
    client: &Client,
    output: &Output,
    topic: &str,
    path: &Path,
    mut lines: Lines,
    rerun: &str,
) -> Result<(), CliError> {
    let mut reader: Box<dyn BufRead> = if path == Path::new("-") {
        Box::new(std::io::stdin().lock())
    } else {
        let file =
            std::fs::File::open(path).map_err(|e| CliError::Usage(format!("cannot open {}: {e}", path.display())))?;
        Box::new(std::io::BufReader::new(file))
    };
    let (mut published, mut duplicates, mut failed) = (0usize, 0usize, 0usize);
    let mut number = 0;
    loop {
        let answered_through = lines.read;
        let messages = read_batch(&mut reader, BATCH_MESSAGES_MAX, &mut lines)
            .map_err(|unreadable| unreadable.into_error(answered_through, Some(rerun)))?;
        if messages.is_empty() {
            break;
        }
        number += 1;
        let ack = match client.publish_batch(topic, messages).await {
            Ok(ack) => ack,
            Err(error) => {
                let id_prefix = lines.id_prefix.as_deref().unwrap_or_default();
                let failed = BatchFailed { number, lines: (answered_through + 1, lines.read), id_prefix, rerun };
                failed.report(output, &error);
                return Err(error.into());
            }
        };
        let counts = count(&ack);
        published += counts.0;
        duplicates += counts.1;
        failed += counts.2;
        let printed = if output.json { output.json_line(&ack) } else { output.line(&batch_summary(number, &ack)) };
        printed.map_err(input_left_unpublished)?;
    }
    output.note(&format!(
        "{published} published, {duplicates} duplicates, {failed} failed, in {number} batches to {topic}"
    ));
    if failed > 0 {
        return Err(CliError::Refused(format!("{failed} messages were refused (see the batch results)")));
    }
    Ok(())
}

/// A batch whose publish failed: which one, its lines, and how to publish them again.
pub(super) struct BatchFailed<'a> {
    /// Its number, from 1.
    pub(super) number: usize,
    /// Its first and last input lines.
    pub(super) lines: (u64, u64),
    /// The prefix of its ids (the generated one when `--id-prefix` was not given).
    pub(super) id_prefix: &'a str,
    /// The command that publishes each line once.
    pub(super) rerun: &'a str,
}

impl BatchFailed<'_> {
    /// Says where to pick up, on stderr, with `--json` too: without the generated prefix the
    /// batch cannot be published again under the same ids. (When it may have been stored,
    /// `error` names the batch's ids too.)
    pub(super) fn report(&self, output: &Output, error: &Error) {
        let (text, value) = self.notice(error);
        output.notice(&text, &value);
    }

    /// The notice for people, and the same as a JSON object (a stderr warning, as `tail
    /// --json` gives).
    pub(super) fn notice(&self, error: &Error) -> (String, serde_json::Value) {
        let BatchFailed { number, lines: (from, to), id_prefix, rerun } = *self;
        let maybe_stored = error.may_have_taken_effect();
        let outcome = if maybe_stored { "may have been stored" } else { "was not stored" };
        let text = format!(
            "batch {number} (lines {from}-{to}) {outcome}; the batches before it were answered: \
             running {rerun} publishes each line once"
        );
        let value = serde_json::json!({"type": "warning", "error": "batch_failed", "message": text,
            "batch": number, "first_line": from, "last_line": to, "maybe_stored": maybe_stored,
            "id_prefix": id_prefix});
        (text, value)
    }
}

/// (published, duplicates, failed) of one batch.
fn count(ack: &BatchAck) -> (usize, usize, usize) {
    ack.results.iter().fold((0, 0, 0), |(p, d, f), item| match item {
        BatchItem::Published { .. } => (p + 1, d, f),
        BatchItem::Duplicate { .. } => (p, d + 1, f),
        BatchItem::Failed { .. } => (p, d, f + 1),
    })
}

fn batch_summary(number: usize, ack: &BatchAck) -> String {
    let sequences: Vec<u64> = ack
        .results
        .iter()
        .filter_map(|item| match item {
            BatchItem::Published { sequence, .. } => Some(*sequence),
            _ => None,
        })
        .collect();
    let range = match (sequences.iter().min(), sequences.iter().max()) {
        (Some(lo), Some(hi)) => format!("#{lo}..#{hi}"),
        _ => "no new sequences".to_string(),
    };
    let (p, d, f) = count(ack);
    format!("batch {number}: {p} published {range}, {d} duplicates, {f} failed")
}

fn print_ack(output: &Output, ack: &PublishAck) -> Result<(), CliError> {
    let sequence = ack.sequence.map(|s| format!("#{s}")).unwrap_or_else(|| "(sequence not yet assigned)".to_string());
    let human = if ack.duplicate {
        format!("published to {} as {sequence} (id {}; already stored by an earlier attempt)", ack.topic, ack.id)
    } else if !ack.committed {
        format!("accepted by the leader for {} as {sequence} (id {}; not yet committed)", ack.topic, ack.id)
    } else {
        format!("published to {} as {sequence} (id {})", ack.topic, ack.id)
    };
    output.either(&human, ack)
}

#[cfg(test)]
mod tests {
    use super::stopped_at;
    use serde_json::json;

    #[test]
    fn a_failed_line_names_where_publishing_stopped() {
        let (text, value) = stopped_at(4, Some("p-"), "the same command again with --id-prefix p-");
        assert_eq!(
            text,
            "stopped at input line 4: lines 1-3 were published; the lines after it were not; \
             running the same command again with --id-prefix p- publishes each line once"
        );
        assert_eq!(
            (&value["line"], &value["id_prefix"], &value["error"]),
            (&json!(4), &json!("p-"), &json!("publish_stopped"))
        );
        assert!(stopped_at(2, None, "again").0.starts_with("stopped at input line 2: line 1 was published;"));
        assert!(stopped_at(1, None, "again")
            .0
            .starts_with("stopped at input line 1: no line before it was published;"));
    }
}
