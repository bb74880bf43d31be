//! The harness the CLI test files share: running the `cambium` binary (with or
//! without stdin), reading what it printed, asserting exit codes and error lines,
//! and a fresh store in a temporary directory to run commands on.
//!
//! A test file declares `mod cli_common;` and adds its own `impl TestStore` blocks
//! for helpers only it needs.

#![allow(dead_code)] // each test file uses a different part

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_cambium");

/// Runs the binary with `args` and no stdin.
pub fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("spawn cambium")
}

/// Runs the binary with `args`, feeding `input` on stdin.
pub fn run_stdin(args: &[&str], input: &[u8]) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn cambium");
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output().expect("wait for cambium");
    writer.join().unwrap();
    out
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A path as a command-line argument.
pub fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

/// Asserts success and returns stdout.
#[track_caller]
pub fn ok(o: Output) -> String {
    assert_eq!(
        o.status.code(),
        Some(0),
        "expected success; stdout: {:?}; stderr: {:?}",
        stdout(&o),
        stderr(&o)
    );
    assert_eq!(stderr(&o), "", "no stderr on success");
    stdout(&o)
}

/// Asserts exit `code`, nothing on stdout, and a one-line `cambium: error: ...`
/// message on stderr containing every needle; returns the message.
#[track_caller]
pub fn fails(o: Output, code: i32, needles: &[&str]) -> String {
    assert_eq!(
        stdout(&o),
        "",
        "no stdout on failure (exit {:?}; stderr: {:?})",
        o.status.code(),
        stderr(&o)
    );
    fails_stdout_unchecked(o, code, needles)
}

/// Like [`fails`], for a command that prints before it fails (a batch that
/// committed, a verify report): stdout is not checked.
#[track_caller]
pub fn fails_stdout_unchecked(o: Output, code: i32, needles: &[&str]) -> String {
    let err = stderr(&o);
    assert_eq!(
        o.status.code(),
        Some(code),
        "expected exit {code}; stdout: {:?}; stderr: {err:?}",
        stdout(&o)
    );
    assert!(
        err.starts_with("cambium: error: ") && err.ends_with('\n') && err.lines().count() == 1,
        "expected one `cambium: error:` line, got {err:?}"
    );
    for needle in needles {
        assert!(err.contains(needle), "stderr {err:?} lacks {needle:?}");
    }
    err
}

/// Asserts a clap usage error (exit 2, message on stderr, nothing on stdout).
#[track_caller]
pub fn usage_error(o: Output) {
    assert_eq!(
        o.status.code(),
        Some(2),
        "expected usage error; stdout: {:?}; stderr: {:?}",
        stdout(&o),
        stderr(&o)
    );
    assert_eq!(stdout(&o), "");
    assert!(stderr(&o).contains("error"), "stderr: {:?}", stderr(&o));
}

/// A store made with `cambium init` in a temporary directory, removed when dropped.
pub struct TestStore {
    _tmp: tempfile::TempDir,
    pub dir: PathBuf,
}

impl TestStore {
    pub fn new() -> TestStore {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("store");
        assert_eq!(ok(run(&["init", s(&dir)])), "");
        TestStore { _tmp: tmp, dir }
    }

    /// The store directory as an argument.
    pub fn d(&self) -> &str {
        s(&self.dir)
    }

    /// Runs `cambium <cmd> DIR <rest...>`.
    pub fn run(&self, cmd: &str, rest: &[&str]) -> Output {
        let mut args = vec![cmd, self.d()];
        args.extend_from_slice(rest);
        run(&args)
    }

    /// `put` on `main`.
    pub fn put(&self, k: &str, v: &str) {
        assert_eq!(ok(self.run("put", &[k, v])), "");
    }

    /// Runs `cambium batch DIR <rest...>` with `input` on stdin.
    pub fn batch(&self, rest: &[&str], input: &str) -> Output {
        let mut args = vec!["batch", self.d()];
        args.extend_from_slice(rest);
        run_stdin(&args, input.as_bytes())
    }

    /// `scan` that must succeed; its stdout.
    pub fn scan(&self, rest: &[&str]) -> String {
        ok(self.run("scan", rest))
    }
}
