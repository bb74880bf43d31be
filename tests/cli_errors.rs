//! Errors at the edges of the store directory, through the binary: a directory or a
//! dangling symbolic link where a segment or WAL file is expected, a stray file that
//! only looks like a segment, a damaged segment header, and a write that fails and
//! stops the command (the store "poisoned", in library terms).
//!
//! Method: each case builds a store holding known data (checkpointed into segment 1,
//! plus commits only in the WAL), puts the odd thing into its directory and runs
//! commands. Each asserts the exit status, that the message names the file and the
//! problem, and that the committed data is intact: a full `scan` equals what was put,
//! and `verify` is clean once the odd thing is gone (or reports exactly it, for a
//! stray the store ignores).

mod cli_common;

use cli_common::{fails, fails_stdout_unchecked, ok, run, s, stdout, TestStore};
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The keys the stores hold, in scan order.
const KEYS: u32 = 300;

/// A store holding `KEYS` keys: most checkpointed into segment 1 (the `checkpoint`
/// command), the rest only in the WAL. Returns it with its full `scan` output.
fn store_with_data() -> (TestStore, String) {
    let t = TestStore::new();
    let line = |i: u32| format!("put\tkey{i:04}\tvalue {i} {}\n", "x".repeat(40));
    let first: String = (0..KEYS - 10).map(line).collect();
    ok(t.batch(&[], &first));
    ok(t.run("checkpoint", &[]));
    for i in KEYS - 10..KEYS {
        ok(t.batch(&[], &line(i)));
    }
    let expected: String = (0..KEYS)
        .map(|i| format!("key{i:04}\tvalue {i} {}\n", "x".repeat(40)))
        .collect();
    assert_eq!(t.scan(&[]), expected);
    verify_clean(&t);
    (t, expected)
}

impl TestStore {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

#[track_caller]
fn verify_clean(t: &TestStore) {
    let out = ok(t.run("verify", &[]));
    assert!(out.ends_with("clean\n"), "{out}");
}

/// Runs `verify`, which must exit 4 with a report; returns its problem lines.
#[track_caller]
fn verify_problems(t: &TestStore) -> Vec<String> {
    let o = t.run("verify", &[]);
    let report = stdout(&o);
    fails_stdout_unchecked(o, 4, &["verify found", t.d()]);
    report
        .lines()
        .filter_map(|l| l.strip_prefix("problem: "))
        .map(str::to_owned)
        .collect()
}

/// The store refuses to open with a message naming `name` and saying `what` is
/// wrong: exit 5 (damage to the store), for reads and writes alike; `verify`
/// reports it as its one problem (exit 4). Nothing is changed: once `name` is
/// removed, the data is all there and `verify` is clean.
#[track_caller]
fn refused_naming(t: &TestStore, expected: &str, name: &str, what: &str) {
    for cmd in [&["scan"][..], &["get", "key0001"], &["put", "new", "value"]] {
        let mut args = vec![cmd[0], t.d()];
        args.extend_from_slice(&cmd[1..]);
        let msg = fails(run(&args), 5, &[name, what]);
        assert!(!msg.contains("os error"), "a bare OS error: {msg}");
    }
    let problems = verify_problems(t);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains(name) && problems[0].contains(what),
        "{problems:?}"
    );
    let path = t.path(name);
    if path.is_dir() && !path.is_symlink() {
        std::fs::remove_dir(&path).unwrap();
    } else {
        std::fs::remove_file(&path).unwrap();
    }
    assert_eq!(t.scan(&[]), expected);
    verify_clean(t);
}

#[test]
fn a_directory_named_like_a_segment_is_named() {
    let (t, expected) = store_with_data();
    std::fs::create_dir(t.path("seg-0000000a.dat")).unwrap();
    refused_naming(&t, &expected, "seg-0000000a.dat", "is a directory");
}

/// A writable open removes the spare files a crash left; a directory with a
/// spare's name is refused like any non-file named like a store file (exit 5,
/// named, no bare OS error), and once it is gone the store writes again.
#[test]
fn a_directory_named_like_a_spare_is_named() {
    let (t, expected) = store_with_data();
    std::fs::create_dir(t.path("spare-00000098.dat")).unwrap();
    let msg = fails(
        run(&["put", t.d(), "new", "value"]),
        5,
        &["spare-00000098.dat", "is a directory"],
    );
    assert!(!msg.contains("os error"), "a bare OS error: {msg}");
    std::fs::remove_dir(t.path("spare-00000098.dat")).unwrap();
    assert_eq!(t.scan(&[]), expected);
    ok(run(&["put", t.d(), "new", "value"]));
    verify_clean(&t);
}

#[test]
fn a_directory_named_like_a_wal_file_is_named() {
    let (t, expected) = store_with_data();
    // A generation past the live ones, so recovery reads it.
    std::fs::create_dir(t.path("wal-00000000000000ff.log")).unwrap();
    refused_naming(&t, &expected, "wal-00000000000000ff.log", "is a directory");
}

#[test]
fn a_dangling_segment_link_is_named() {
    let (t, expected) = store_with_data();
    let target = t.dir.parent().unwrap().join("gone-seg.dat");
    std::os::unix::fs::symlink(&target, t.path("seg-0000000b.dat")).unwrap();
    refused_naming(
        &t,
        &expected,
        "seg-0000000b.dat",
        &format!("is a symbolic link to {}, which does not exist", s(&target)),
    );
}

/// A stray file named like a segment, holding garbage: the store opens and works,
/// never touches the file and never gives its id to a new segment; `verify`
/// reports exactly it, as ignored.
#[test]
fn a_garbage_segment_is_ignored_and_reported() {
    let (t, mut expected) = store_with_data();
    let stray = t.path("seg-0000000c.dat");
    let garbage: Vec<u8> = (0..4096u32).map(|i| (i * 7919 % 251) as u8).collect();
    std::fs::write(&stray, &garbage).unwrap();

    assert_eq!(t.scan(&[]), expected);
    assert_eq!(
        ok(t.run("get", &["key0007"])),
        format!("value 7 {}\n", "x".repeat(40))
    );
    // Writes work, including new segments (a checkpoint, then the cleaner's and
    // shrink's moves into fresh segments).
    t.put("new", "value");
    ok(t.run("checkpoint", &[]));
    ok(t.run("shrink", &[]));
    expected.push_str("new\tvalue\n");
    assert_eq!(t.scan(&[]), expected);
    assert_eq!(
        std::fs::read(&stray).unwrap(),
        garbage,
        "the stray was written"
    );

    let problems = verify_problems(&t);
    assert_eq!(problems.len(), 1, "{problems:?}");
    for needle in ["seg-0000000c.dat", "not a segment", "ignored"] {
        assert!(
            problems[0].contains(needle),
            "{problems:?} lacks {needle:?}"
        );
    }
    // Segments made since have ids past the stray's.
    let segments: Vec<String> = std::fs::read_dir(&t.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("seg-") && n.as_str() != "seg-0000000c.dat")
        .collect();
    assert!(
        segments.iter().any(|n| n.as_str() > "seg-0000000c.dat"),
        "no segment was created after the stray: {segments:?}"
    );

    std::fs::remove_file(&stray).unwrap();
    assert_eq!(t.scan(&[]), expected);
    verify_clean(&t);
}

/// The store's own segment with a damaged header is set aside like a stray, so
/// what it holds fails to read: exit 5 naming the segment (never a panic, never
/// wrong data), and nothing is changed. Repaired, the store is whole again.
#[test]
fn a_damaged_header_of_a_used_segment_is_named() {
    let (t, expected) = store_with_data();
    let seg = t.path("seg-00000001.dat");
    let original = std::fs::read(&seg).unwrap();
    let mut damaged = original.clone();
    damaged[..8].copy_from_slice(b"garbage!");
    std::fs::write(&seg, &damaged).unwrap();

    for cmd in [&["scan"][..], &["get", "key0001"], &["put", "new", "value"]] {
        let mut args = vec![cmd[0], t.d()];
        args.extend_from_slice(&cmd[1..]);
        fails(run(&args), 5, &["seg-00000001.dat", "no segment header"]);
    }
    let problems = verify_problems(&t);
    assert!(
        problems.iter().any(|p| p.contains("seg-00000001.dat")),
        "{problems:?}"
    );
    assert_eq!(
        std::fs::read(&seg).unwrap(),
        damaged,
        "the segment was written"
    );

    std::fs::write(&seg, &original).unwrap();
    assert_eq!(t.scan(&[]), expected);
    verify_clean(&t);
}

/// A write that fails midway through a `batch` stops the command with a message in
/// user terms (what failed, where; that nothing acknowledged is lost; what to do),
/// not "poisoned ... reopen it". Provoked with a file size limit (`ulimit -f`, with
/// SIGXFSZ ignored, so writes past it fail with EFBIG), which needs no privileges.
#[test]
fn a_failed_write_is_explained() {
    let (t, mut expected) = store_with_data();
    let value = "v".repeat(200);
    let input: String = (0..40_000)
        .map(|i| format!("put\tbig{i:05}\t{value}\n"))
        .collect();
    // 6 MB: room for the WAL's 4 MiB preallocation and a few commits, not for all.
    let script = "trap '' XFSZ; ulimit -f 12000; exec \"$0\" batch \"$1\" --commit-every 5000";
    let mut child = Command::new("sh")
        .args(["-c", script, cli_common::BIN, t.d()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sh");
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        let _ = stdin.write_all(input.as_bytes());
    });
    let o = child.wait_with_output().unwrap();
    writer.join().unwrap();

    let committed = stdout(&o).lines().last().map_or(0, |l| {
        l.strip_prefix("committed ").unwrap().parse().unwrap()
    });
    assert!(committed < 40_000, "the limit did not stop the batch");
    let msg = fails_stdout_unchecked(
        o,
        3,
        &[
            "a write to the store failed",
            "File too large",
            "Nothing acknowledged is lost",
            "run again what was not acknowledged",
        ],
    );
    assert!(!msg.contains("poisoned"), "{msg}");
    assert!(
        msg.contains(".log") || msg.contains(".dat") || msg.contains("reserve"),
        "the message names no file: {msg}"
    );

    // Every acknowledged commit is there, nothing else; the store is sound.
    let mut lines: Vec<String> = expected.lines().map(str::to_owned).collect();
    lines.extend((0..committed).map(|i| format!("big{i:05}\t{value}")));
    lines.sort();
    expected = lines.iter().map(|l| format!("{l}\n")).collect();
    assert_eq!(t.scan(&[]), expected);
    verify_clean(&t);
    // And without the limit, the store takes writes again.
    t.put("after", "limit");
    assert_eq!(ok(t.run("get", &["after"])), "limit\n");
    verify_clean(&t);
}
