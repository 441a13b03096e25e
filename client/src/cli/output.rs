//! Printing for people (default) and for machines (`--json`: one JSON object per line).

use std::io::{IsTerminal, Write};

use serde::Serialize;
use serde_json::{json, Value};

use super::CliError;
use crate::error::Error;

/// Writes one line to stderr. A closed stderr (`2>&1 | head`) is ignored, not a panic as with
/// `eprintln!`: there is nobody left to tell.
pub fn stderr_line(text: impl std::fmt::Display) {
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

/// Where results and errors go, and in which form.
#[derive(Debug, Clone, Copy)]
pub struct Output {
    /// One JSON object per line instead of text for people.
    pub json: bool,
}

impl Output {
    /// Output in the form `--json` asks for.
    pub fn new(json: bool) -> Output {
        Output { json }
    }

    /// True when a progress bar may be drawn: human output on a terminal.
    pub fn progress(&self) -> bool {
        !self.json && std::io::stderr().is_terminal()
    }

    /// Writes one line to stdout. A closed pipe becomes [`CliError::OutputClosed`].
    pub fn line(&self, text: &str) -> Result<(), CliError> {
        let mut out = std::io::stdout().lock();
        match writeln!(out, "{text}") {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(CliError::OutputClosed),
            Err(e) => Err(CliError::Io(e)),
        }
    }

    /// Writes a value as one compact JSON line.
    pub fn json_line(&self, value: &impl Serialize) -> Result<(), CliError> {
        let text =
            serde_json::to_string(value).map_err(|e| CliError::Usage(format!("output does not serialize: {e}")))?;
        self.line(&text)
    }

    /// Writes a human line, or the value as JSON with `--json`.
    pub fn either(&self, human: &str, value: &impl Serialize) -> Result<(), CliError> {
        if self.json {
            self.json_line(value)
        } else {
            self.line(human)
        }
    }

    /// A notice for people on stderr (nothing with `--json`).
    pub fn note(&self, text: &str) {
        if !self.json {
            stderr_line(text);
        }
    }

    /// A notice that must reach `--json` callers too: `text` for people, or `value` as one
    /// JSON line, both on stderr (stdout keeps the command's results alone). For what a
    /// caller needs in order to act, such as the ids to publish a failed batch again under.
    pub fn notice(&self, text: &str, value: &Value) {
        if self.json {
            stderr_line(value);
        } else {
            stderr_line(text);
        }
    }

    /// Reports an error on stderr: `error: CODE (STATUS): MESSAGE`, or a JSON object.
    pub fn error(&self, error: &CliError) {
        if self.json {
            stderr_line(error_json(error));
        } else {
            stderr_line(format!("error: {}", error_text(error)));
        }
    }
}

/// The error for people, with its source chain.
pub fn error_text(error: &CliError) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    // `Client(Error::Api)` is transparent, so the first source repeats it; skip repeats.
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

/// The error as one JSON object: `{"error": CODE, "message": TEXT, ...}`.
pub fn error_json(error: &CliError) -> Value {
    match error {
        CliError::Client(Error::Api(api)) => json!({
            "error": api.code.as_str(), "status": api.status, "message": api.message,
            "details": api.details,
        }),
        // The failure, plus that the write may have taken effect and, for a publish, the id
        // to publish it again with.
        CliError::Client(Error::Indeterminate { id, ids, source }) => {
            let mut value = match source.api() {
                Some(api) => json!({"error": api.code.as_str(), "status": api.status, "details": api.details}),
                None if source.is_unreachable() => json!({"error": "unreachable"}),
                None => json!({"error": "failed"}),
            };
            value["message"] = error_text(error).into();
            value["maybe_stored"] = true.into();
            value["id"] = json!(id);
            if !ids.is_empty() {
                value["ids"] = json!(ids);
            }
            value
        }
        CliError::Client(e) if e.is_unreachable() => {
            json!({"error": "unreachable", "message": error_text(error)})
        }
        CliError::Usage(_) => json!({"error": "usage", "message": error_text(error)}),
        CliError::Client(Error::InvalidArgument(_) | Error::InvalidAddress { .. }) => {
            json!({"error": "usage", "message": error_text(error)})
        }
        _ => json!({"error": "failed", "message": error_text(error)}),
    }
}

/// Ms since the Unix epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC).
pub fn format_time_ms(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, day_secs) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        day_secs / 3600,
        day_secs / 60 % 60,
        day_secs % 60,
        ms % 1000
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}
