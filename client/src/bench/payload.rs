//! What the load generator publishes: `{"pad": "…", "t_us": <µs since the epoch>}` of an exact
//! size, the pad drawn from a pool built once per run, so making a payload costs a clone, not
//! a random draw per byte.
//!
//! The pad's content matters because the nodes compress stored messages (LZ4): a pad of one
//! repeated byte compresses to almost nothing and flatters every storage cost, random bytes do
//! not compress at all, and text lies between, as most JSON events do.

use std::sync::atomic::{AtomicUsize, Ordering};

use clap::ValueEnum;
use rand::distributions::Alphanumeric;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::{json, Value};

/// Distinct pads per run: more than a 4 KiB storage block holds, and enough that LZ4's 64 KiB
/// window rarely sees one twice.
const PADS_PER_RUN: usize = 1024;

/// The words of [`PayloadContent::Text`] pads, typical of business events.
const WORDS: [&str; 16] = [
    "order",
    "customer",
    "amount",
    "currency",
    "EUR",
    "shipped",
    "item",
    "sku",
    "warehouse",
    "created",
    "status",
    "pending",
    "paid",
    "address",
    "berlin",
    "quantity",
];

/// What fills a bench payload's pad.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum PayloadContent {
    /// Words and numbers separated by spaces, like the text of JSON events: LZ4 about halves it.
    #[default]
    Text,
    /// Random letters and digits: LZ4 cannot shrink it.
    Random,
    /// One byte repeated (`xx…`): compresses to nearly nothing. Every run before 2026-12-03
    /// used it.
    Repeat,
}

impl PayloadContent {
    /// `text`, `random` or `repeat`, as on the command line and in the report.
    pub fn as_str(self) -> &'static str {
        match self {
            PayloadContent::Text => "text",
            PayloadContent::Random => "random",
            PayloadContent::Repeat => "repeat",
        }
    }
}

/// The pads of one run, handed out in turn.
pub struct Payloads {
    pads: Vec<String>,
    next: AtomicUsize,
}

impl Payloads {
    /// Pads that make payloads of `size_bytes` as compact JSON (or as small as the fields allow).
    pub fn new(content: PayloadContent, size_bytes: usize) -> Payloads {
        let len = size_bytes.saturating_sub(bare_len(crate::bench::now_us()));
        // Seeded: the same run publishes the same bytes every time.
        let mut rng = StdRng::seed_from_u64(0x7075_6273_7562);
        let pads = match content {
            PayloadContent::Repeat => vec!["x".repeat(len)],
            PayloadContent::Random => (0..PADS_PER_RUN)
                .map(|_| (&mut rng).sample_iter(Alphanumeric).take(len).map(char::from).collect())
                .collect(),
            PayloadContent::Text => (0..PADS_PER_RUN).map(|_| text(&mut rng, len)).collect(),
        };
        Payloads { pads, next: AtomicUsize::new(0) }
    }

    /// The next payload, stamped with `t_us`.
    pub fn next(&self, t_us: u64) -> Value {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.pads.len();
        stamped(&self.pads[i], t_us)
    }
}

/// Words and numbers up to exactly `len` bytes.
fn text(rng: &mut StdRng, len: usize) -> String {
    let mut pad = String::with_capacity(len + 16);
    while pad.len() < len {
        if rng.gen_bool(0.3) {
            pad.push_str(&rng.gen_range(0..100_000u32).to_string());
        } else {
            pad.push_str(WORDS[rng.gen_range(0..WORDS.len())]);
        }
        pad.push(' ');
    }
    // ASCII only, so any length is a character boundary.
    pad.truncate(len);
    pad
}

/// Length of `{"pad":"","t_us":<t_us>}`: 18 bytes and the digits of `t_us`.
fn bare_len(t_us: u64) -> usize {
    18 + t_us.checked_ilog10().unwrap_or(0) as usize + 1
}

/// A payload `{"pad": "xx…", "t_us": t}` that is `size_bytes` long as compact JSON, or as
/// short as possible when `size_bytes` is smaller than the fields themselves.
///
/// ```
/// let p = pubsub_client::bench::payload(200, 1_714_000_000_000_000);
/// assert_eq!(p.to_string().len(), 200);
/// assert_eq!(p["t_us"], 1_714_000_000_000_000u64);
/// ```
pub fn payload(size_bytes: usize, t_us: u64) -> Value {
    stamped(&"x".repeat(size_bytes.saturating_sub(bare_len(t_us))), t_us)
}

/// `{"pad": pad, "t_us": t_us}`; [`bare_len`] counts everything but the pad.
fn stamped(pad: &str, t_us: u64) -> Value {
    json!({"pad": pad, "t_us": t_us})
}
