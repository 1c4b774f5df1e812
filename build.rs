//! Build script: records the git commit the binary is built from, for
//! `spillway --version` and the `spillway_build_info` metric.
//!
//! `SPILLWAY_GIT_COMMIT` is the 12-digit abbreviated commit of `HEAD` (uncommitted changes
//! are not flagged), or `unknown` when the sources are not a git checkout (no `.git`
//! beside Cargo.toml: a tarball, a vendored copy) or git is not installed. A packager may
//! set `SPILLWAY_GIT_COMMIT` in the environment to override it.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    println!("cargo:rerun-if-env-changed=SPILLWAY_GIT_COMMIT");
    let commit = std::env::var("SPILLWAY_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(commit_from_git)
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=SPILLWAY_GIT_COMMIT={commit}");
}

fn commit_from_git() -> Option<String> {
    let root = std::env::var("CARGO_MANIFEST_DIR").ok()?;
    let dot_git = Path::new(&root).join(".git");
    // Always watched (by absolute path): a missing `.git` makes cargo rerun this script
    // on every build, so that a target directory shared with a copy of the sources
    // elsewhere never keeps the other copy's answer.
    println!("cargo:rerun-if-changed={}", dot_git.display());
    // Only this checkout's own repository: a copy of the sources inside some other
    // repository must not report that repository's commit.
    if !dot_git.exists() {
        return None;
    }
    // Rebuild when HEAD moves: HEAD itself (branch switch, detached commit) and the
    // branch it points to (a new commit). In a worktree these live in different dirs.
    if let Some(head) = git(&["-C", &root, "rev-parse", "--git-path", "HEAD"]) {
        println!(
            "cargo:rerun-if-changed={}",
            Path::new(&root).join(head).display()
        );
    }
    if let Some(branch) = git(&["-C", &root, "symbolic-ref", "-q", "HEAD"])
        && let Some(reference) = git(&["-C", &root, "rev-parse", "--git-path", &branch])
    {
        println!(
            "cargo:rerun-if-changed={}",
            Path::new(&root).join(reference).display()
        );
    }
    git(&["-C", &root, "rev-parse", "--short=12", "HEAD"])
}
