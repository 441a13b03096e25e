use clap::Parser;

use super::args::{parse_cursor, payload_from_text, Command, TopicsCommand};
use super::*;
use crate::endpoint::Cursor;
use crate::error::ApiError;
use serde_json::json;

fn parse(argv: &[&str]) -> Result<Args, clap::Error> {
    Args::try_parse_from(std::iter::once("pubsub").chain(argv.iter().copied()))
}

fn parsed(argv: &[&str]) -> Args {
    match parse(argv) {
        Ok(a) => a,
        Err(e) => panic!("{argv:?}: {e}"),
    }
}

#[test]
fn server_defaults_to_localhost_and_repeats() {
    // PUBSUB_SERVER could leak in from the environment of whoever runs the tests.
    if std::env::var_os("PUBSUB_SERVER").is_none() {
        assert_eq!(parsed(&["cluster"]).servers, vec!["http://127.0.0.1:8080"]);
    }
    let args = parsed(&["--server", "a:1", "-s", "b:2", "cluster"]);
    assert_eq!(args.servers, vec!["a:1", "b:2"]);
    let comma = parsed(&["cluster", "--server", "a:1,b:2", "--json"]);
    assert_eq!(comma.servers, vec!["a:1", "b:2"]);
    assert!(comma.json);
}

#[test]
fn attempts_flag_sets_the_retry_budget_and_refuses_zero() {
    let args = parsed(&["--attempts", "3", "topics", "list"]);
    assert_eq!(args.attempts, Some(3));
    match build_client(&args) {
        Ok(client) => assert_eq!(client.config().retry.attempts_max, 3),
        Err(e) => panic!("{e}"),
    }
    assert!(parse(&["--attempts", "0", "topics", "list"]).is_err());
}

#[test]
fn timeout_flag_is_not_capped_by_the_operation_timeout() {
    let long = parsed(&["--timeout-ms", "60000", "topics", "list"]);
    match build_client(&long) {
        Ok(client) => {
            assert_eq!(client.config().request_timeout, Duration::from_secs(60));
            assert!(client.config().retry.operation_timeout >= Duration::from_secs(60));
        }
        Err(e) => panic!("{e}"),
    }
    // A short one keeps the default budget for its retries.
    let short = parsed(&["--timeout-ms", "500", "topics", "list"]);
    match build_client(&short) {
        Ok(client) => assert_eq!(client.config().retry.operation_timeout, limits::OPERATION_TIMEOUT_DEFAULT),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn topics_subcommands_parse_with_metadata_checked_as_a_json_object() {
    let args = parsed(&["topics", "create", "orders", "--metadata", r#"{"retention_hours":24}"#]);
    match args.command {
        Command::Topics(TopicsCommand::Create { name, metadata }) => {
            assert_eq!(name, "orders");
            assert_eq!(metadata, Some(json!({"retention_hours": 24})));
        }
        other => panic!("{other:?}"),
    }
    assert!(parse(&["topics", "create", "x", "--metadata", "[1]"]).is_err());
    assert!(parse(&["topics", "create", "x", "--metadata", "{oops"]).is_err());
    assert!(matches!(parsed(&["topics", "list"]).command, Command::Topics(TopicsCommand::List)));
    assert!(matches!(parsed(&["topics", "delete", "x"]).command, Command::Topics(TopicsCommand::Delete { .. })));
}

#[test]
fn publish_needs_a_payload_or_a_batch_file_but_not_both() {
    let usage = |argv: &[&str]| parse(argv).map_err(|e| e.exit_code());
    assert!(matches!(usage(&["publish", "t"]), Err(2)));
    assert!(matches!(usage(&["publish", "t", "1", "--batch", "f"]), Err(2)));
    assert!(matches!(usage(&["publish", "t", "--batch", "f", "--id", "x"]), Err(2)));
    let args = parsed(&["publish", "t", r#"{"a":1}"#, "--id", "m1", "--ack", "appended"]);
    match args.command {
        Command::Publish(p) => {
            assert_eq!(p.payload.as_deref(), Some(r#"{"a":1}"#));
            assert_eq!(p.id.as_deref(), Some("m1"));
            assert_eq!(crate::AckMode::from(p.ack), crate::AckMode::Appended);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn cursor_accepts_numbers_latest_and_acked_only() {
    assert_eq!(parse_cursor("latest"), Ok(Cursor::Latest));
    assert_eq!(parse_cursor("acked"), Ok(Cursor::Acked));
    assert_eq!(parse_cursor("0"), Ok(Cursor::After(0)));
    assert_eq!(parse_cursor("150"), Ok(Cursor::After(150)));
    assert!(parse_cursor("-1").is_err());
    assert!(parse_cursor("first").is_err());
    match parsed(&["subscribe", "t", "--cursor", "7", "--subscriber-id", "s", "--ack", "--count", "3"]).command {
        Command::Subscribe(s) => {
            assert_eq!(s.cursor, Cursor::After(7));
            assert!(s.ack);
            assert_eq!(s.count, Some(3));
        }
        other => panic!("{other:?}"),
    }
    match parsed(&["subscribe", "t"]).command {
        Command::Subscribe(s) => assert_eq!(s.cursor, Cursor::Latest),
        other => panic!("{other:?}"),
    }
}

#[test]
fn bench_flags_parse_and_batch_is_bounded_by_the_endpoint_limit() {
    let args = parsed(&[
        "bench",
        "--publishers",
        "8",
        "--inflight",
        "32",
        "--messages",
        "100000",
        "--payload-bytes",
        "1024",
        "--batch",
        "100",
        "--subscribers",
        "2",
        "--duration-secs",
        "30",
    ]);
    match args.command {
        Command::Bench(b) => {
            assert_eq!((b.publishers, b.inflight, b.batch, b.subscribers), (8, 32, 100, 2));
            assert_eq!(b.messages, 100_000);
            assert_eq!(b.payload_bytes, 1024);
            assert_eq!(b.payload_content, crate::bench::PayloadContent::Text, "the default");
            assert_eq!(b.duration_secs, Some(30));
        }
        other => panic!("{other:?}"),
    }
    match parse(&["bench", "--payload-content", "repeat"]).map(|a| a.command) {
        Ok(Command::Bench(b)) => assert_eq!(b.payload_content, crate::bench::PayloadContent::Repeat),
        other => panic!("{other:?}"),
    }
    assert!(parse(&["bench", "--payload-content", "zeros"]).is_err());
    assert!(parse(&["bench", "--batch", "1001"]).is_err());
    assert!(parse(&["bench", "--publishers", "0"]).is_err());
}

fn bench_args(argv: &[&str]) -> args::BenchArgs {
    match parsed(&[&["bench"][..], argv].concat()).command {
        Command::Bench(b) => b,
        other => panic!("{other:?}"),
    }
}

#[test]
fn bench_transport_and_rate_parse_with_http_and_unpaced_as_defaults() {
    let defaults = bench_args(&[]);
    assert_eq!((defaults.transport, defaults.rate), (args::TransportArg::Http, None));
    let ws = bench_args(&["--transport", "ws", "--rate", "1000.5", "--inflight", "64"]);
    assert_eq!((ws.transport, ws.rate), (args::TransportArg::Ws, Some(1000.5)));
    assert!(bench::check(&ws).is_ok());
    for bad in [["--rate", "0"], ["--rate", "-5"], ["--rate", "NaN"], ["--rate", "inf"], ["--transport", "tcp"]] {
        assert!(parse(&[&["bench"][..], &bad[..]].concat()).is_err(), "{bad:?}");
    }
}

#[test]
fn bench_over_ws_refuses_batches_appended_acks_and_more_in_flight_than_the_server_allows() {
    for argv in [
        &["--transport", "ws", "--batch", "10"][..],
        &["--transport", "ws", "--ack", "appended"],
        &["--transport", "ws", "--inflight", "5000"],
    ] {
        match bench::check(&bench_args(argv)) {
            Err(e) => assert_eq!(e.exit_code(), EXIT_USAGE, "{argv:?}"),
            Ok(()) => panic!("{argv:?} accepted"),
        }
    }
    assert!(bench::check(&bench_args(&["--batch", "10", "--ack", "appended", "--inflight", "5000"])).is_ok());
}

#[test]
fn text_that_is_not_json_is_published_as_a_json_string() {
    assert_eq!(payload_from_text(r#"{"a":1}"#), Ok(json!({"a": 1})));
    assert_eq!(payload_from_text("42"), Ok(json!(42)));
    assert_eq!(payload_from_text("hello world"), Ok(json!("hello world")));
    assert_eq!(payload_from_text(r#""quoted""#), Ok(json!("quoted")));
    assert_eq!(payload_from_text("a {b} c"), Ok(json!("a {b} c")));
}

/// `pubsub publish t {"a":1}` unquoted reaches us as `{a:1}`: refused, not stored as the
/// string "{a:1}".
#[test]
fn text_that_starts_like_json_but_is_not_is_refused() {
    for text in ["{a:1}", "{\"a\": 1", "  {oops"] {
        let refused = payload_from_text(text);
        assert!(matches!(&refused, Err(e) if e.contains("starts like JSON")), "{text}: {refused:?}");
    }
    // Log lines that start with `[` or `"` are text.
    for text in ["[INFO] started", r#""x" said"#] {
        assert_eq!(payload_from_text(text), Ok(json!(text)));
    }
    let mut input = std::io::Cursor::new("1\n{a:1}\n3\n");
    let mut lines = publish::Lines { read: 0, id_prefix: None };
    let unusable = match publish::read_batch(&mut input, 10, &mut lines) {
        Err(e) => e,
        Ok(batch) => panic!("read {} messages past a line that is not JSON", batch.len()),
    };
    assert_eq!(unusable.line, 2);
    let text = output::error_text(&unusable.into_error(0, None));
    assert!(text.starts_with("input line 2 could not be used (it starts like JSON but is not JSON"), "{text}");
}

/// Large lines end a batch before 1,000 of them: a thousand lines of 17 KB, or thirty of
/// 600 KB, would make a body past the server's 16 MiB. Counted as sent: text of quotes
/// doubles as a JSON string.
#[test]
fn batch_input_of_large_lines_is_read_in_chunks_of_bytes() {
    use crate::limits::{BATCH_BODY_BYTES_MAX, CLI_BATCH_BYTES};
    let read_all = |input: String| {
        let mut reader = std::io::Cursor::new(input);
        let mut lines = publish::Lines { read: 0, id_prefix: None };
        let mut batches = Vec::new();
        loop {
            let batch = publish::read_batch(&mut reader, 1000, &mut lines).unwrap_or_default();
            if batch.is_empty() {
                return batches;
            }
            let body = serde_json::to_vec(&serde_json::json!({ "messages": batch })).unwrap_or_default();
            assert!(body.len() < BATCH_BODY_BYTES_MAX, "a body of {} bytes", body.len());
            batches.push(batch.len());
        }
    };
    let in_chunks_of = |taken: usize| -> Vec<usize> { [0; 20].chunks(taken).map(<[u8]>::len).collect() };
    let json_line = format!("\"{}\"\n", "x".repeat(599_998));
    assert_eq!(read_all(json_line.repeat(20)), in_chunks_of(CLI_BATCH_BYTES.div_ceil(600_000 + 64)));
    // Text of 600 KB of quotes: 1.2 MB each as a JSON string.
    let quotes = format!("x{}\n", "\"".repeat(599_999));
    assert_eq!(read_all(quotes.repeat(20)), in_chunks_of(CLI_BATCH_BYTES.div_ceil(1_200_000 + 3 + 64)));
}

#[test]
fn batch_input_is_read_in_chunks_skipping_blank_lines() {
    let input = "1\n\n{\"a\":2}\nplain text\n  \n4\n5\n";
    let mut reader = std::io::Cursor::new(input);
    let mut lines = publish::Lines { read: 0, id_prefix: None };
    let first = publish::read_batch(&mut reader, 3, &mut lines).unwrap_or_default();
    let payloads: Vec<_> = first.iter().map(|m| m.payload.clone()).collect();
    assert_eq!(payloads, vec![json!(1), json!({"a": 2}), json!("plain text")]);
    assert!(first.iter().all(|m| m.id.is_none()), "ids are generated at publish time");
    let second = publish::read_batch(&mut reader, 3, &mut lines).unwrap_or_default();
    assert_eq!(second.len(), 2);
    assert!(publish::read_batch(&mut reader, 3, &mut lines).unwrap_or_default().is_empty());
}

#[test]
fn an_id_prefix_names_each_line_by_its_number_the_same_on_every_run() {
    let input = "1\n\n2\n3\n";
    for _ in 0..2 {
        let mut reader = std::io::Cursor::new(input);
        let mut lines = publish::Lines { read: 0, id_prefix: Some("import-".into()) };
        let batch = publish::read_batch(&mut reader, 10, &mut lines).unwrap_or_default();
        let ids: Vec<_> = batch.iter().map(|m| m.id.clone().unwrap_or_default()).collect();
        assert_eq!(ids, vec!["import-1", "import-3", "import-4"], "blank lines count");
    }
    assert!(parse(&["publish", "t", "--batch", "f", "--id-prefix", "p-"]).is_ok());
    assert!(parse(&["publish", "t", "x", "--id", "a", "--id-prefix", "p-"]).is_err());
}

#[test]
fn exit_codes_tell_refusal_usage_and_unreachable_apart() {
    let api = CliError::Client(Error::Api(ApiError::from_body(404, br#"{"error":"topic_not_found","message":"no"}"#)));
    assert_eq!(api.exit_code(), EXIT_REFUSED);
    let unreachable = CliError::Client(Error::Unreachable { attempts: 3, source: "connection refused".into() });
    assert_eq!(unreachable.exit_code(), EXIT_UNREACHABLE);
    let no_leader = CliError::Client(Error::NoLeader { attempts: 3, elapsed: Duration::from_secs(1) });
    assert_eq!(no_leader.exit_code(), EXIT_UNREACHABLE);
    assert_eq!(CliError::Usage("x".into()).exit_code(), EXIT_USAGE);
    let bad_address = CliError::Client(Error::InvalidAddress { address: "https://x".into(), reason: "tls".into() });
    assert_eq!(bad_address.exit_code(), EXIT_USAGE);
    assert_eq!(CliError::OutputClosed.exit_code(), EXIT_OK);
}

#[test]
fn errors_print_their_code_and_message() {
    let api = CliError::Client(Error::Api(ApiError::from_body(
        409,
        br#"{"error":"duplicate_message_id","message":"already there","existing_sequence":3}"#,
    )));
    assert_eq!(output::error_text(&api), "duplicate_message_id (409): already there");
    let j = output::error_json(&api);
    assert_eq!(j["error"], "duplicate_message_id");
    assert_eq!(j["status"], 409);
    let unreachable = CliError::Client(Error::Unreachable { attempts: 2, source: "connection refused".into() });
    assert!(output::error_text(&unreachable).contains("connection refused"));
    assert_eq!(output::error_json(&unreachable)["error"], "unreachable");
}

#[test]
fn times_are_printed_as_utc() {
    assert_eq!(output::format_time_ms(0), "1970-01-01T00:00:00.000Z");
    assert_eq!(output::format_time_ms(1_714_000_000_123), "2024-04-24T23:06:40.123Z");
    assert_eq!(output::format_time_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
}

#[tokio::test]
async fn an_unreachable_server_exits_with_code_3() {
    let dead = crate::test_support::dead_address().await;
    let args = parsed(&["--server", &dead, "--timeout-ms", "300", "--attempts", "2", "topics", "list"]);
    // Refused connections fail fast and two attempts wait one short backoff.
    let outcome = tokio::time::timeout(Duration::from_secs(10), run(args, &Output::new(true))).await;
    match outcome {
        Ok(Err(e)) => assert_eq!(e.exit_code(), EXIT_UNREACHABLE, "{e}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn flags_that_would_be_ignored_together_are_refused() {
    // A batch is always answered after commit: `--ack appended` would be silently ignored.
    assert!(parse(&["publish", "t", "--batch", "f", "--ack", "appended"]).is_err());
    assert!(parse(&["publish", "t", "--batch", "f"]).is_ok());
    // A generated subscriber id has no acks: `--cursor acked` would replay the whole topic.
    assert!(parse(&["subscribe", "t", "--cursor", "acked"]).is_err());
    assert!(parse(&["subscribe", "t", "--cursor", "acked", "--subscriber-id", "s"]).is_ok());
    // Nor can acks under a generated id ever be resumed from.
    assert!(parse(&["subscribe", "t", "--ack"]).is_err());
    assert!(parse(&["subscribe", "t", "--ack", "--subscriber-id", "s"]).is_ok());
}

#[test]
fn a_write_that_may_have_taken_effect_says_so_with_its_id() {
    let lost = Error::NoLeader { attempts: 3, elapsed: Duration::from_secs(1) };
    let unknown =
        CliError::Client(Error::Indeterminate { id: Some("m-1".into()), ids: Vec::new(), source: Box::new(lost) });
    // Still "unreachable" for the exit code: what failed last is what the operator must fix.
    assert_eq!(unknown.exit_code(), EXIT_UNREACHABLE);
    assert!(output::error_text(&unknown).contains("m-1"), "{}", output::error_text(&unknown));
    let j = output::error_json(&unknown);
    assert_eq!(
        (j["error"].as_str(), j["maybe_stored"].as_bool(), j["id"].as_str()),
        (Some("unreachable"), Some(true), Some("m-1"))
    );
    let timeout = ApiError::from_body(504, br#"{"error":"raft_timeout","message":"slow"}"#);
    let unknown = CliError::Client(Error::Indeterminate {
        id: Some("m-2".into()),
        ids: Vec::new(),
        source: Box::new(Error::Api(timeout)),
    });
    assert_eq!(unknown.exit_code(), EXIT_REFUSED);
    let j = output::error_json(&unknown);
    assert_eq!(
        (j["error"].as_str(), j["status"].as_u64(), j["id"].as_str()),
        (Some("raft_timeout"), Some(504), Some("m-2"))
    );
}

#[test]
fn a_read_page_past_a_retention_gap_says_which_messages_expired() {
    let note = super::subscribe::expired_before(0, 4).expect("1 to 3 expired");
    assert!(note.contains("after #0 and before #4"), "{note}");
    assert_eq!(super::subscribe::expired_before(3, 4), None, "the page starts right after the cursor");
    assert_eq!(super::subscribe::expired_before(10, 4), None, "a cursor inside the retained range");
    assert_eq!(super::subscribe::expired_before(0, 0), None, "a server that does not say");
}

// ----- against an in-process node --------------------------------------------------

/// A node that leads and answers POSTs to `path` with `answer(body)`, counting them.
async fn leader_answering(
    path: &'static str,
    answer: fn(&serde_json::Value) -> axum::response::Response,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let posts = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = posts.clone();
    let node = crate::test_support::serve_with(move |me| {
        let cluster = crate::test_support::cluster_body("node-1", Some(&me), &[&me]);
        axum::Router::new().route("/cluster", axum::routing::get(move || async move { axum::Json(cluster) })).route(
            path,
            axum::routing::post(move |body: axum::body::Bytes| async move {
                counted.fetch_add(1, Ordering::SeqCst);
                answer(&serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null))
            }),
        )
    })
    .await;
    (node, posts)
}

/// Runs `argv` against `node` with one attempt per request, `--json`.
async fn run_against(node: &str, argv: &[&str]) -> Result<(), CliError> {
    let argv = [&["--server", node, "--attempts", "1", "--json"][..], argv].concat();
    match tokio::time::timeout(Duration::from_secs(20), run(parsed(&argv), &Output::new(true))).await {
        Ok(outcome) => outcome,
        Err(_) => panic!("{argv:?} did not finish"),
    }
}

/// A file of `text` in the temp directory, removed when dropped.
struct TempInput(std::path::PathBuf);

impl TempInput {
    fn new(text: &str) -> TempInput {
        let path = std::env::temp_dir().join(format!("pubsub-cli-test-{}.txt", uuid::Uuid::new_v4().simple()));
        if let Err(e) = std::fs::write(&path, text) {
            panic!("{}: {e}", path.display());
        }
        TempInput(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap_or_default()
    }
}

impl Drop for TempInput {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A batch answered `500 internal` may have been stored, as a single publish answered so is:
/// before, the batch path asked only `Indeterminate` and said "was not stored", and the error
/// carried neither `maybe_stored` nor the batch's ids.
#[tokio::test]
async fn a_batch_answered_500_internal_may_have_been_stored_and_names_its_ids() {
    let internal =
        Error::indeterminate(None, Error::Api(ApiError::from_body(500, br#"{"error":"internal","message":"boom"}"#)));
    let failed = publish::BatchFailed { number: 2, lines: (1001, 2000), id_prefix: "p-", rerun: "again" };
    let (text, value) = failed.notice(&internal);
    assert!(text.contains("batch 2 (lines 1001-2000) may have been stored"), "{text}");
    assert_eq!(value["maybe_stored"], true);
    let refused = Error::Api(ApiError::from_body(404, br#"{"error":"topic_not_found","message":"no"}"#));
    assert!(failed.notice(&refused).0.contains("was not stored"));

    let (node, posts) = leader_answering("/topics/{name}/messages/batch", |_| {
        crate::test_support::error_response(500, "internal", json!({}))
    })
    .await;
    let input = TempInput::new("1\n\n3\n");
    let error = match run_against(&node, &["publish", "t", "--batch", input.path()]).await {
        Err(e) => e,
        Ok(()) => panic!("a batch answered 500 succeeded"),
    };
    assert_eq!(posts.load(std::sync::atomic::Ordering::SeqCst), 1, "500 internal is not retried");
    assert_eq!(error.exit_code(), EXIT_REFUSED);
    let j = output::error_json(&error);
    assert_eq!(
        (j["error"].as_str(), j["status"].as_u64(), j["maybe_stored"].as_bool()),
        (Some("internal"), Some(500), Some(true)),
        "{j}"
    );
    let ids: Vec<&str> = j["ids"].as_array().map(|a| a.iter().filter_map(|v| v.as_str()).collect()).unwrap_or_default();
    assert_eq!(ids.len(), 2, "{j}");
    assert!(ids[0].ends_with("-1") && ids[1].ends_with("-3"), "ids are the prefix and the line number: {ids:?}");
}

/// `publish --id X` while an earlier publish of X (an earlier run's) is still in flight when
/// the retries run out: that one may yet commit, so the outcome is unknown and the error says
/// so with the id, instead of a bare `409`.
#[tokio::test]
async fn a_publish_whose_id_is_still_in_flight_may_have_been_stored() {
    let (node, posts) = leader_answering("/topics/{name}/messages", |body| {
        crate::test_support::error_response(
            409,
            "duplicate_message_id",
            json!({"id": body["id"], "existing_sequence": null}),
        )
    })
    .await;
    let error = match run_against(&node, &["publish", "t", "1", "--id", "order-7"]).await {
        Err(e) => e,
        Ok(()) => panic!("a publish still in flight succeeded"),
    };
    assert_eq!(posts.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(error.exit_code(), EXIT_REFUSED);
    let j = output::error_json(&error);
    assert_eq!((j["maybe_stored"].as_bool(), j["id"].as_str()), (Some(true), Some("order-7")), "{j}");
    assert_eq!(j["error"], "duplicate_message_id", "{j}");
}

/// With `--json` the note naming the generated prefix was dropped; without it a failed batch
/// cannot be published again under the same ids. It is a JSON warning on stderr now.
#[test]
fn a_failed_batch_names_its_id_prefix_in_json_too() {
    let failed = publish::BatchFailed {
        number: 1,
        lines: (1, 3),
        id_prefix: "01a2-",
        rerun: "the same command again with --id-prefix 01a2-",
    };
    let lost = Error::indeterminate(None, Error::NoLeader { attempts: 3, elapsed: Duration::from_secs(1) });
    let (text, value) = failed.notice(&lost);
    assert!(text.contains("running the same command again with --id-prefix 01a2- publishes each line once"), "{text}");
    assert_eq!(
        (value["type"].as_str(), value["error"].as_str(), value["id_prefix"].as_str()),
        (Some("warning"), Some("batch_failed"), Some("01a2-")),
        "{value}"
    );
    assert_eq!(
        (value["batch"].as_u64(), value["first_line"].as_u64(), value["last_line"].as_u64()),
        (Some(1), Some(1), Some(3))
    );
    assert_eq!(value["message"].as_str(), Some(text.as_str()));
}

/// `publish -` stopped at a line that is not UTF-8 with only `stream did not contain valid
/// UTF-8` (exit 1): now it names the line, says the lines before it were published and it and
/// the rest were not, and exits 2 (the input could not be used; the server said nothing).
#[tokio::test]
async fn an_unreadable_stdin_line_is_named_and_the_lines_before_it_were_published() {
    let (node, posts) = leader_answering("/topics/{name}/messages", |body| {
        use axum::response::IntoResponse;
        let ack = json!({"id": body["id"], "topic": "t", "sequence": 1, "raft_index": 1, "committed": true});
        (axum::http::StatusCode::CREATED, axum::Json(ack)).into_response()
    })
    .await;
    let client = crate::test_support::fast_client(&[&node]);
    let mut input = std::io::Cursor::new(b"{\"a\":1}\n\n3\n\xff\xfe\n5\n".to_vec());
    let mut lines = publish::Lines { read: 0, id_prefix: None };
    let outcome = publish::publish_lines(
        &client,
        &Output::new(true),
        "t",
        &mut input,
        &mut lines,
        crate::AckMode::Committed,
        "the same command again",
    )
    .await;
    let error = match outcome {
        Err(e) => e,
        Ok(()) => panic!("a line that is not UTF-8 was skipped"),
    };
    assert_eq!(posts.load(std::sync::atomic::Ordering::SeqCst), 2, "lines 1 and 3, and nothing after line 4");
    assert_eq!(error.exit_code(), EXIT_USAGE);
    let text = output::error_text(&error);
    assert!(text.starts_with("input line 4 could not be used ("), "{text}");
    assert!(text.contains("lines 1-3 were published; line 4 and the lines after it were not"), "{text}");
    assert_eq!(output::error_json(&error)["error"], "usage");

    // The same in a batch file: the line is named, and so are the lines read for the batch
    // that was never sent.
    let mut input = std::io::Cursor::new(b"1\n2\n3\n\xff\n".to_vec());
    let mut lines = publish::Lines { read: 0, id_prefix: Some("p-".into()) };
    let first = publish::read_batch(&mut input, 2, &mut lines).unwrap_or_default();
    assert_eq!(first.len(), 2);
    let unreadable = match publish::read_batch(&mut input, 2, &mut lines) {
        Err(e) => e,
        Ok(batch) => panic!("read {} messages past a line that is not UTF-8", batch.len()),
    };
    assert_eq!(unreadable.line, 4);
    let text = output::error_text(&unreadable.into_error(2, Some("the same command again")));
    assert!(
        text.contains("lines 1-2 were published; line 3, line 4 and the lines after it were not; once the input is fixed, running the same command again publishes each line once"),
        "{text}"
    );
}

/// A node whose subscription delivers message 1, then says the topic was deleted.
async fn node_deleting_its_topic_after_one_message() -> String {
    use axum::extract::ws::{Message as WsMessage, WebSocketUpgrade};
    let frames = [
        json!({"type": "control", "subtype": "subscribed", "topic": "t", "cursor": 0, "subscriber_id": "s"}),
        json!({"type": "message", "id": "m1", "topic": "t", "sequence": 1, "payload": {"n": 1}, "timestamp": 1}),
        json!({"type": "control", "subtype": "topic_deleted", "topic": "t"}),
    ];
    let app = axum::Router::new().route(
        "/topics/{name}/subscribe",
        axum::routing::get(move |ws: WebSocketUpgrade| {
            let frames = frames.clone();
            async move {
                ws.on_upgrade(|mut socket| async move {
                    for frame in frames {
                        let _ = socket.send(WsMessage::Text(frame.to_string().into())).await;
                    }
                    while let Some(Ok(_)) = socket.recv().await {}
                })
            }
        }),
    );
    crate::test_support::serve(app).await
}

/// `--count N` exited 0 when the topic was deleted after fewer than N messages; now it is a
/// failure (exit 1) saying how many came. Without `--count`, or with it reached, the deletion
/// ends the command as before: exit 0.
#[tokio::test]
async fn a_count_not_reached_before_the_topic_is_deleted_fails() {
    let node = node_deleting_its_topic_after_one_message().await;
    for argv in [&["subscribe", "t", "--cursor", "0", "--count", "3"][..], &["tail", "t", "--count", "3"]] {
        match run_against(&node, argv).await {
            Err(e) => {
                assert_eq!(e.exit_code(), EXIT_REFUSED, "{argv:?}");
                assert_eq!(output::error_text(&e), "topic t was deleted after 1 of 3 messages", "{argv:?}");
            }
            Ok(()) => panic!("{argv:?} succeeded with 1 of 3 messages"),
        }
    }
    for argv in [&["subscribe", "t", "--cursor", "0"][..], &["subscribe", "t", "--count", "1"], &["tail", "t"]] {
        if let Err(e) = run_against(&node, argv).await {
            panic!("{argv:?}: {e}");
        }
    }
    assert!(subscribe::ended_before_count(Some(2), 1, "the subscription to t ended").is_err());
    assert!(subscribe::ended_before_count(Some(2), 2, "the subscription to t ended").is_ok());
    assert!(subscribe::ended_before_count(None, 0, "the subscription to t ended").is_ok());
}

#[test]
fn members_show_how_far_behind_each_is_when_the_leader_says() {
    let member = |id: u64, reachable: Option<bool>, lag: Option<u64>| crate::types::Member {
        node_id: format!("node-{id}"),
        address: format!("10.0.0.{id}:8080"),
        client_address: format!("10.0.0.{id}:8080"),
        role: "voter".into(),
        reachable,
        matched_index: lag.map(|lag| 10 - lag),
        lag,
    };
    let from_leader =
        [member(1, Some(true), Some(0)), member(2, Some(true), Some(3)), member(3, Some(false), Some(10))];
    assert_eq!(
        cluster::members_line(&from_leader),
        "node-1 (voter) at 10.0.0.1:8080 lag 0, node-2 (voter) at 10.0.0.2:8080 lag 3, \
         node-3 (voter) at 10.0.0.3:8080 not answering, lag 10"
    );
    assert_eq!(cluster::members_line(&[member(2, None, None)]), "node-2 (voter) at 10.0.0.2:8080");
    let unknown = [member(2, Some(true), None), member(3, Some(false), None)];
    assert_eq!(
        cluster::members_line(&unknown),
        "node-2 (voter) at 10.0.0.2:8080 lag not known yet, node-3 (voter) at 10.0.0.3:8080 not answering"
    );
    // A follower's answer (null fields) reads as before, and so do older nodes' (no fields).
    let older: crate::types::Member = serde_json::from_value(
        json!({"node_id": "node-2", "address": "a:1", "client_address": "a:1", "role": "voter"}),
    )
    .unwrap();
    assert_eq!((older.reachable, older.lag), (None, None));
    let follower: crate::types::Member = serde_json::from_value(json!({"node_id": "node-2", "address": "a:1",
        "client_address": "a:1", "role": "voter", "reachable": null, "matched_index": null, "lag": null}))
    .unwrap();
    assert_eq!(follower, older);
}
