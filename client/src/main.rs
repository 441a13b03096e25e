fn main() -> std::process::ExitCode {
    pubsub_client::cli::main()
}
