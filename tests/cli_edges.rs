//! The store's edges, as a user meets them through the CLI: dropping the default
//! branch, names that look like paths, reading without write access, reading beside a
//! writer, waiting for a writer, failures after a commit, and interrupted `init`s.
//! Each test checks the exit status, that the message names the problem, and that
//! committed data is intact afterwards (a full scan and `verify`).

mod cli_common;

use cli_common::{fails, ok, run, s, stderr, stdout, usage_error, TestStore, BIN};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `verify` must find the store clean.
#[track_caller]
fn verify_clean(dir: &str) {
    let out = ok(run(&["verify", dir]));
    assert!(out.ends_with("clean\n"), "verify: {out}");
}

/// Every file in `dir` with its length and modification time: a directory a read
/// must leave exactly as it was.
fn listing(dir: &Path) -> BTreeMap<String, (u64, std::time::SystemTime)> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                (m.len(), m.modified().unwrap()),
            )
        })
        .collect()
}

/// A store holding `main` (a, b, c) and a snapshot `s` (a, b).
fn store_with_versions() -> TestStore {
    let t = TestStore::new();
    t.put("a", "1");
    t.put("b", "2");
    ok(t.run("snapshot", &["main", "s"]));
    t.put("c", "3");
    t
}

#[test]
fn main_cannot_be_dropped() {
    let t = store_with_versions();
    let err = fails(t.run("drop", &["main"]), 3, &["main", "default branch"]);
    assert!(err.contains("delete its keys"), "says what to do: {err}");
    assert_eq!(t.scan(&[]), "a\t1\nb\t2\nc\t3\n");
    let stats = ok(t.run("stats", &[]));
    assert!(stats.contains("keys (main)        3\n"), "{stats}");
    verify_clean(t.d());
}

#[test]
fn names_that_look_like_paths_are_usage_errors() {
    let t = store_with_versions();
    let before = ok(t.run("versions", &["--json"]));
    for bad in ["/", "/a", "a/", "a//b", "a/./b", "a/b/../c", "a/..", "a/.x"] {
        usage_error(t.run("snapshot", &["main", bad]));
        usage_error(t.run("branch", &["main", bad]));
        usage_error(t.run("get", &["a", "--at", bad]));
        usage_error(t.run("drop", &[bad]));
    }
    assert_eq!(
        ok(t.run("versions", &["--json"])),
        before,
        "nothing was made"
    );
    ok(t.run("branch", &["main", "team/feature-1.2"]));
    assert_eq!(ok(t.run("get", &["c", "--at", "team/feature-1.2"])), "3\n");
    verify_clean(t.d());
}

/// The read commands and what each must print on `store_with_versions`.
fn read_commands(dir: &str) -> Vec<(Vec<String>, Option<&'static str>)> {
    let cmd = |args: &[&str]| -> Vec<String> {
        let mut v = vec![args[0].to_string(), dir.to_string()];
        v.extend(args[1..].iter().map(|a| (*a).to_string()));
        v
    };
    vec![
        (cmd(&["get", "a"]), Some("1\n")),
        (cmd(&["get", "c", "--at", "main"]), Some("3\n")),
        (cmd(&["scan"]), Some("a\t1\nb\t2\nc\t3\n")),
        (cmd(&["scan", "--at", "s"]), Some("a\t1\nb\t2\n")),
        (cmd(&["diff", "s", "main"]), Some("+ c 3\n")),
        (cmd(&["stats"]), None),
        (cmd(&["versions"]), None),
        (cmd(&["verify"]), None),
        (cmd(&["backrefs", "--segment", "1"]), None),
    ]
}

/// Runs every read command through `wrap` (a program and its leading arguments that
/// run the binary some other way) and checks their output.
fn check_reads(dir: &str, bin: &str, wrap: &[&str]) {
    for (args, want) in read_commands(dir) {
        let mut all: Vec<&str> = wrap.to_vec();
        all.push(bin);
        all.extend(args.iter().map(String::as_str));
        let out = Command::new(all[0]).args(&all[1..]).output().unwrap();
        let printed = ok(out);
        if let Some(want) = want {
            assert_eq!(printed, want, "{args:?}");
        }
        if args[0] == "verify" {
            assert!(printed.ends_with("clean\n"), "{printed}");
        }
    }
}

/// Unmounts its mount point when dropped.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Runs `mount ARGS` (whose last argument is `mnt`); `None` where this machine does not
/// let the tests mount.
fn mount(args: &[&str], mnt: &Path) -> Option<Unmount> {
    Command::new("mount")
        .args(args)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|st| st.success())
        .then(|| Unmount(mnt.to_path_buf()))
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// The command prefix that runs a program as the unprivileged user `nobody`.
const AS_NOBODY: [&str; 4] = [
    "setpriv",
    "--reuid=65534",
    "--regid=65534",
    "--clear-groups",
];

/// Whether this machine lets the tests switch to `nobody` (root with `setpriv`).
fn can_run_as_nobody() -> bool {
    is_root()
        && Command::new(AS_NOBODY[0])
            .args(&AS_NOBODY[1..])
            .arg("true")
            .status()
            .is_ok_and(|st| st.success())
}

/// Reads work on a store whose files and directory have no write permission: as an
/// unprivileged user when the tests run as root (root ignores permissions), and as
/// the test's own user otherwise. Nothing in the directory changes.
#[test]
fn reads_need_no_write_permission() {
    let t = store_with_versions();
    let tmp = t.dir.parent().unwrap().to_path_buf();
    let before = listing(&t.dir);
    let chmod = |mode: &str| {
        let st = Command::new("chmod")
            .args(["-R", mode, s(&t.dir)])
            .status()
            .unwrap();
        assert!(st.success());
    };
    chmod("a-w");
    if can_run_as_nobody() {
        // An unprivileged user needs to reach the binary and the store.
        let bin = tmp.join("cambium");
        std::fs::copy(BIN, &bin).unwrap();
        for p in [&tmp, &bin] {
            let st = Command::new("chmod").args(["a+rx", s(p)]).status().unwrap();
            assert!(st.success());
        }
        chmod("a+rX");
        chmod("a-w");
        let nobody = AS_NOBODY;
        check_reads(t.d(), s(&bin), &nobody);
        // And a write, as that user, fails without changing anything.
        let out = Command::new(nobody[0])
            .args(&nobody[1..])
            .args([s(&bin), "put", t.d(), "z", "9"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("ermission denied"),
            "{}",
            stderr(&out)
        );
    } else {
        if is_root() {
            eprintln!("root without setpriv: permissions are not enforced for this run");
        }
        check_reads(t.d(), BIN, &[]);
    }
    chmod("u+w");
    assert_eq!(listing(&t.dir), before, "a read changed the directory");
    assert_eq!(t.scan(&[]), "a\t1\nb\t2\nc\t3\n");
}

/// Reads work on a read-only bind mount of the store (where this machine lets the
/// tests mount; otherwise the test says so and checks nothing more).
#[test]
fn reads_work_on_a_read_only_mount() {
    let t = store_with_versions();
    let mnt = t.dir.parent().unwrap().join("ro");
    std::fs::create_dir(&mnt).unwrap();
    let Some(_unmount) = mount(&["--bind", "-o", "ro", t.d(), s(&mnt)], &mnt) else {
        eprintln!("cannot bind-mount here; the read-only mount case is not run");
        return;
    };
    let before = listing(&t.dir);
    check_reads(s(&mnt), BIN, &[]);
    let out = run(&["put", s(&mnt), "z", "9"]);
    fails(out, 3, &["ead-only file system"]);
    assert_eq!(listing(&t.dir), before);
}

#[test]
fn a_directory_that_is_not_a_store_is_left_as_it_was() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("plain");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("notes.txt"), "mine").unwrap();
    let before = listing(&dir);
    for args in [
        vec!["get", s(&dir), "a"],
        vec!["scan", s(&dir)],
        vec!["stats", s(&dir)],
        vec!["verify", s(&dir)],
        vec!["versions", s(&dir)],
        vec!["put", s(&dir), "a", "1"],
        vec!["checkpoint", s(&dir)],
    ] {
        let out = run(&args);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("not a cambium store"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    assert_eq!(listing(&dir), before);
}

/// A `batch` that holds the store open, fed line by line, with its acknowledgements
/// read back: the writer the other process's commands run beside.
struct Writer {
    child: Child,
    stdin: Option<ChildStdin>,
    acks: BufReader<ChildStdout>,
}

impl Writer {
    fn start(dir: &str) -> Writer {
        let mut child = Command::new(BIN)
            .args(["batch", dir, "--commit-every", "100"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let acks = BufReader::new(child.stdout.take().unwrap());
        Writer { child, stdin, acks }
    }

    /// Feeds keys `from..from + 100` (one commit) and waits for its acknowledgement.
    fn commit(&mut self, from: u32) {
        let stdin = self.stdin.as_mut().unwrap();
        for i in from..from + 100 {
            writeln!(stdin, "put\tw{i:06}\tv{i}").unwrap();
        }
        stdin.flush().unwrap();
        let mut line = String::new();
        self.acks.read_line(&mut line).unwrap();
        assert_eq!(line, format!("committed {}\n", from + 100));
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Ends the input and waits for the batch to exit.
    fn finish(mut self) -> Output {
        drop(self.stdin.take());
        let mut rest = Vec::new();
        std::io::Read::read_to_end(&mut self.acks, &mut rest).unwrap();
        let mut out = self.child.wait_with_output().unwrap();
        out.stdout = rest;
        out
    }
}

#[test]
fn readers_work_beside_a_writer_and_see_every_acknowledged_commit() {
    let t = store_with_versions();
    let mut w = Writer::start(t.d());
    for round in 0..5 {
        w.commit(round * 100);
        // Every commit acknowledged so far is visible, in another process, at once.
        let last = round * 100 + 99;
        assert_eq!(
            ok(t.run("get", &[&format!("w{last:06}")])),
            format!("v{last}\n")
        );
        let keys = ok(t.run("scan", &["--keys-only"])).lines().count();
        assert_eq!(keys, 3 + (round as usize + 1) * 100);
        let stats = ok(t.run("stats", &["--json"]));
        assert!(stats.contains("\"versions\":2"), "{stats}");
        verify_clean(t.d());
        ok(t.run("versions", &[]));
        assert_eq!(
            ok(t.run("diff", &["s", "main", "--keys-only"]))
                .lines()
                .count(),
            keys - 2
        );
    }
    let out = w.finish();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "",
        "every commit was acknowledged as it was made"
    );
    assert_eq!(ok(t.run("scan", &["--keys-only"])).lines().count(), 503);
    verify_clean(t.d());
}

#[test]
fn a_second_writer_fails_naming_the_pid_or_waits() {
    let t = store_with_versions();
    let mut w = Writer::start(t.d());
    w.commit(0);
    let pid = w.pid().to_string();
    fails(t.run("put", &["x", "1"]), 3, &["in use", &pid, "--wait"]);
    fails(t.run("snapshot", &["main", "s2"]), 3, &["in use", &pid]);

    // The lock does not depend on the LOCK file: deleting it lets nobody in.
    std::fs::remove_file(t.dir.join("LOCK")).unwrap();
    fails(t.run("put", &["x", "1"]), 3, &["in use"]);

    let started = Instant::now();
    fails(
        t.run("put", &["x", "1", "--wait=0.5"]),
        3,
        &["in use", "after waiting 0.5 s"],
    );
    assert!(started.elapsed() >= Duration::from_millis(500));

    // `--wait` without a limit returns once the writer is done.
    let dir = t.d().to_owned();
    let waiter = std::thread::spawn(move || run(&["put", &dir, "x", "1", "--wait"]));
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !waiter.is_finished(),
        "put --wait returned while the writer held the store"
    );
    w.commit(100);
    let out = w.finish();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(ok(waiter.join().unwrap()), "");
    assert_eq!(ok(t.run("get", &["x"])), "1\n");
    assert_eq!(ok(t.run("get", &["w000199"])), "v199\n");
    assert!(!ok(t.run("versions", &[])).contains("s2"));
    verify_clean(t.d());
}

/// Runs `cambium <args>` with stdout going to /dev/full.
fn run_to_full_stdout(args: &[&str], input: Option<&str>) -> Output {
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(full)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(input) = input {
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(input.as_bytes()).unwrap();
    }
    child.wait_with_output().unwrap()
}

/// Asserts exit 6 and one warning line saying the change is durable.
#[track_caller]
fn committed_with_warning(out: &Output, needles: &[&str]) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(6), "{err}");
    assert!(
        err.starts_with("cambium: warning: ") && err.lines().count() == 1,
        "{err}"
    );
    for n in ["durable", "do not retry"].iter().chain(needles) {
        assert!(err.contains(n), "{err:?} lacks {n:?}");
    }
}

#[test]
fn a_failure_after_the_commit_is_a_warning_not_an_error() {
    let t = store_with_versions();
    let out = run_to_full_stdout(&["snapshot", t.d(), "main", "s2"], None);
    committed_with_warning(&out, &["snapshot \"s2\" was created", "No space left"]);
    // It exists; a retry would be refused as a duplicate.
    fails(t.run("snapshot", &["main", "s2"]), 3, &["already exists"]);
    assert_eq!(ok(t.run("scan", &["--at", "s2"])), "a\t1\nb\t2\nc\t3\n");

    let out = run_to_full_stdout(&["batch", t.d()], Some("put\td\t4\nput\te\t5\n"));
    committed_with_warning(&out, &["committed 2"]);
    assert_eq!(t.scan(&[]), "a\t1\nb\t2\nc\t3\nd\t4\ne\t5\n");

    let out = run_to_full_stdout(&["drop", t.d(), "s2"], None);
    committed_with_warning(&out, &["\"s2\" was dropped"]);
    assert!(!ok(t.run("versions", &[])).contains("s2"));

    // A command that fails before its commit is still a plain error.
    let out = run_to_full_stdout(&["batch", t.d()], Some("put\tf\t6\nbogus\n"));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).starts_with("cambium: error: "));
    assert_eq!(t.scan(&[]), "a\t1\nb\t2\nc\t3\nd\t4\ne\t5\n");
    verify_clean(t.d());
}

#[test]
fn init_recovers_from_an_interrupted_init_and_refuses_what_it_cannot_explain() {
    let tmp = tempfile::tempdir().unwrap();

    // An init cut short: its marker, a partial segment and superblock.
    let cut = tmp.path().join("cut");
    std::fs::create_dir(&cut).unwrap();
    std::fs::write(cut.join("init-in-progress"), "").unwrap();
    std::fs::write(cut.join("seg-00000001.dat"), b"CAMBSEG\0 partial").unwrap();
    std::fs::write(cut.join("superblock.tmp"), [0u8; 100]).unwrap();
    fails(run(&["get", s(&cut), "a"]), 3, &["not a cambium store"]);
    ok(run(&["init", s(&cut)]));
    ok(run(&["put", s(&cut), "a", "1"]));
    assert_eq!(ok(run(&["get", s(&cut), "a"])), "1\n");
    assert!(!cut.join("init-in-progress").exists());
    assert!(!cut.join("superblock.tmp").exists());
    verify_clean(s(&cut));
    fails(
        run(&["init", s(&cut)]),
        3,
        &["already holds a cambium store"],
    );

    // Store files without a superblock and without the marker: not ours to remove.
    let damaged = tmp.path().join("damaged");
    std::fs::create_dir(&damaged).unwrap();
    std::fs::write(damaged.join("seg-00000007.dat"), b"precious").unwrap();
    let before = listing(&damaged);
    fails(
        run(&["init", s(&damaged)]),
        3,
        &["seg-00000007.dat", "no superblock"],
    );
    assert_eq!(listing(&damaged), before);

    // A path that is a file.
    let file = tmp.path().join("file");
    std::fs::write(&file, "x").unwrap();
    fails(run(&["init", s(&file)]), 3, &["not a directory"]);
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
}

/// `init` on a disk too full to hold a store fails and leaves nothing behind (run
/// where this machine lets the tests mount a small tmpfs).
#[test]
fn init_on_a_full_disk_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("small");
    std::fs::create_dir(&mnt).unwrap();
    let Some(_unmount) = mount(&["-t", "tmpfs", "-o", "size=12k", "tmpfs", s(&mnt)], &mnt) else {
        eprintln!("cannot mount a tmpfs here; the full-disk init case is not run");
        return;
    };
    // Fill it so that not even the first segment fits.
    let _ = std::fs::write(mnt.join("filler"), vec![7u8; 12 << 10]);
    let store = mnt.join("db");
    let out = run(&["init", s(&store)]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(!store.exists(), "a failed init left {store:?} behind");
    // With room, the same init succeeds.
    std::fs::remove_file(mnt.join("filler")).unwrap();
    let _ = Command::new("mount")
        .args(["-o", "remount,size=64m", s(&mnt)])
        .status();
    ok(run(&["init", s(&store)]));
    ok(run(&["put", s(&store), "a", "1"]));
    assert_eq!(ok(run(&["get", s(&store), "a"])), "1\n");
}

#[test]
fn the_spare_log_is_cut_back_and_counted() {
    let t = TestStore::new();
    // About 8 MiB of log in one process, so the retired generation is that big.
    let mut input = String::new();
    for i in 0..40_000 {
        input.push_str(&format!("put\tk{i:06}\t{}\n", "v".repeat(200)));
    }
    let out = t.batch(&["--commit-every", "1000"], &input);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // The generation retires once no superblock slot needs it: one more checkpoint.
    ok(t.run("checkpoint", &[]));
    let spare = t.dir.join("wal-spare.log");
    let len = std::fs::metadata(&spare).expect("a spare log").len();
    assert!(len <= 4 << 20, "the spare log kept {len} bytes");
    let stats = ok(t.run("stats", &["--json"]));
    assert!(
        stats.contains(&format!("\"wal_spare_bytes\":{len}")),
        "{stats}"
    );
    assert!(ok(t.run("stats", &[])).contains(" spare\n"));
    assert_eq!(ok(t.run("scan", &["--keys-only"])).lines().count(), 40_000);
    verify_clean(t.d());
}

/// On a real full disk (a small tmpfs, where this machine lets the tests mount one):
/// a snapshot either succeeds or, if only its closing checkpoint fails, says it was
/// made (exit 6); a put is refused with a message that says what happened and that
/// nothing acknowledged is lost; drop still works; nothing committed is lost.
#[test]
fn a_full_disk_refuses_writes_honestly_and_loses_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("small");
    std::fs::create_dir(&mnt).unwrap();
    let Some(_unmount) = mount(&["-t", "tmpfs", "-o", "size=40m", "tmpfs", s(&mnt)], &mnt) else {
        eprintln!("cannot mount a tmpfs here; the full-disk case is not run");
        return;
    };
    let db = mnt.join("db");
    let d = s(&db);
    ok(run(&["init", d]));
    ok(run(&["put", d, "a", "1"]));
    ok(run(&["put", d, "b", "2"]));
    ok(run(&["checkpoint", d]));
    // Fill the disk.
    let mut filler = std::fs::File::create(mnt.join("filler")).unwrap();
    let chunk = vec![1u8; 1 << 20];
    while filler.write_all(&chunk).is_ok() {}
    let _ = filler.write_all(&chunk[..4096]);
    drop(filler);

    let out = run(&["snapshot", d, "main", "s"]);
    match out.status.code() {
        Some(0) => {}
        Some(6) => committed_with_warning(&out, &["snapshot \"s\" was created"]),
        other => panic!("snapshot on a full disk: {other:?}: {}", stderr(&out)),
    }
    assert!(
        ok(run(&["versions", d])).contains("s "),
        "the snapshot exists"
    );
    fails(
        run(&["put", d, "c", "3"]),
        3,
        &["No space left", "Nothing acknowledged is lost"],
    );
    assert_eq!(ok(run(&["scan", d])), "a\t1\nb\t2\n");
    let out = run(&["drop", d, "s"]);
    assert!(
        matches!(out.status.code(), Some(0 | 6)),
        "drop on a full disk: {}",
        stderr(&out)
    );
    assert!(!ok(run(&["versions", d])).contains("s "));
    verify_clean(d);
    std::fs::remove_file(mnt.join("filler")).unwrap();
    ok(run(&["put", d, "c", "3"]));
    assert_eq!(ok(run(&["scan", d])), "a\t1\nb\t2\nc\t3\n");
    verify_clean(d);
}

/// A store has more files open than a low soft limit on open files allows (each
/// segment stays open; a store of ~60 GiB has a thousand): the CLI raises the soft
/// limit to the hard one, so the store opens where the hard limit allows, for reads
/// and writes alike.
#[test]
fn a_low_soft_limit_on_open_files_is_raised() {
    let t = store_with_versions();
    let dir = t.d().to_owned();
    let files = std::fs::read_dir(&t.dir).unwrap().count();
    // stdin, stdout, stderr and one more: fewer than the store's files.
    let limit = 4;
    assert!(files > 1, "{files} files");
    let with_limit = |args: &str| {
        Command::new("sh")
            .arg("-c")
            .arg(format!("ulimit -S -n {limit} && exec {BIN} {args}"))
            .output()
            .unwrap()
    };
    let out = with_limit(&format!("get {dir} a"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = with_limit(&format!("put {dir} d 4"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(ok(run(&["get", &dir, "d"])), "4\n");
    verify_clean(&dir);
}
