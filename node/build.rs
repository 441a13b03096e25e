//! Records the git commit the node is built from (`PUBSUB_COMMIT`), which `/cluster` and
//! `pubsub_build_info` report: the crate version alone does not tell two builds apart.

use std::process::Command;

fn main() {
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|commit| !commit.is_empty())
        // A source tree without git (a tarball).
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=PUBSUB_COMMIT={commit}");
    // A new commit, checked out or made, moves HEAD or the branch it names.
    for path in ["../.git/HEAD", "../.git/refs/heads", "../.git/packed-refs"] {
        if std::path::Path::new(path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
