//! Process-level crash test: `cambium batch --commit-every 100` is killed with SIGKILL
//! at arbitrary points while stdin is still streaming. Afterwards the store must hold
//! exactly the operations of a whole number of commits (a prefix of the input ending
//! on a commit boundary), at least every commit the process acknowledged on stdout,
//! with the right values, and `cambium verify` must pass. Each round continues on the
//! store the previous round crashed, so recovery of a recovered store is exercised too.

mod cli_common;
mod common;

use cli_common::{ok, run, s, BIN};
use common::Rng;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

const COMMIT_EVERY: u64 = 100;
const OPS_PER_ROUND: u64 = 200_000;

fn key(i: u64) -> String {
    format!("key{i:09}")
}

/// Values of varied sizes, about 400 bytes on average, so a round's 200k operations
/// write more WAL (about 80 MB) than the 64 MiB that triggers a checkpoint: late kill
/// points land after or during a checkpoint made by the committing thread. Every 97th
/// value is larger than 1 KiB and so stored out of line.
fn value(i: u64) -> String {
    let pad = if i.is_multiple_of(97) {
        1500
    } else {
        300 + (i % 200) as usize
    };
    let fill = char::from(b'a' + (i % 26) as u8);
    format!("v{i}-{}", fill.to_string().repeat(pad))
}

/// Reads the whole store with `cambium scan`, as (key, value) lines.
fn scan(dir: &Path) -> Vec<(String, String)> {
    ok(run(&["scan", s(dir)]))
        .lines()
        .map(|l| {
            let (k, v) = l.split_once('\t').expect("key<TAB>value");
            (k.to_string(), v.to_string())
        })
        .collect()
}

/// `cambium verify`, which must find the store clean.
#[track_caller]
fn verify(dir: &Path) {
    let out = ok(run(&["verify", s(dir)]));
    assert!(out.ends_with("clean\n"), "verify after a crash: {out}");
}

/// One round: feeds ops `start..start + OPS_PER_ROUND`, kills the writer after it has
/// acknowledged `kill_after` commits, and returns the number of acknowledged ops.
fn crash_round(dir: &Path, start: u64, kill_after: u64) -> u64 {
    let mut child = Command::new(BIN)
        .args(["batch", s(dir), "--commit-every", &COMMIT_EVERY.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn cambium batch");
    let stdin = child.stdin.take().unwrap();
    let feeder = std::thread::spawn(move || {
        let mut w = BufWriter::new(stdin);
        for i in start..start + OPS_PER_ROUND {
            // Fails with a broken pipe once the child is killed: stop then.
            if writeln!(w, "put\t{}\t{}", key(i), value(i)).is_err() {
                return;
            }
        }
        let _ = w.flush();
    });
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut acked = 0;
    let mut seen = 0;
    while seen < kill_after {
        let line = match lines.next() {
            Some(Ok(l)) => l,
            other => panic!(
                "batch ended before it was killed ({other:?}, after {seen} commits): {:?}",
                child.wait()
            ),
        };
        let n: u64 = line
            .strip_prefix("committed ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("unexpected batch output {line:?}"));
        seen += 1;
        assert_eq!(n, seen * COMMIT_EVERY, "acknowledgements count ops so far");
        acked = n;
    }
    child.kill().expect("SIGKILL the batch"); // SIGKILL on Unix
    let status = child.wait().unwrap();
    // Near the end of the input the batch may have finished before the kill landed;
    // then every operation must be there, which the caller's checks cover too.
    if status.success() {
        eprintln!("the batch finished before it was killed");
    }
    feeder.join().unwrap();
    acked
}

#[test]
fn kill9_during_batch_keeps_a_committed_prefix() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    assert_eq!(ok(run(&["init", s(&dir)])), "");

    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("kill9 seed {seed}");
    let mut rng = Rng::new(seed);

    let mut present = 0; // keys 0..present are in the store
    for round in 0..3 {
        // Kill very early, early, or a good way into the stream.
        let kill_after = match round {
            0 => 1 + rng.below(20),
            1 => 20 + rng.below(40),
            _ => 100 + rng.below(OPS_PER_ROUND / COMMIT_EVERY - 110),
        };
        let acked = crash_round(&dir, present, kill_after);

        let pairs = scan(&dir);
        let m = pairs.len() as u64;
        assert!(
            m >= present + acked,
            "round {round} (seed {seed}): {m} keys present, but {present} + {acked} were acknowledged"
        );
        assert_eq!(
            (m - present) % COMMIT_EVERY,
            0,
            "round {round} (seed {seed}): {m} keys is not on a commit boundary after {present}"
        );
        for (i, (k, v)) in pairs.iter().enumerate() {
            let i = i as u64;
            assert_eq!(k, &key(i), "round {round} (seed {seed}): keys are a prefix");
            assert_eq!(v, &value(i), "round {round} (seed {seed}): value of {k}");
        }
        verify(&dir);
        if round == 0 {
            // Later rounds crash on top of a checkpointed state (round 1) and on top of
            // a recovered, un-checkpointed WAL (round 2).
            assert_eq!(
                ok(run(&["checkpoint", s(&dir)])),
                "",
                "checkpoint after a crash"
            );
            verify(&dir);
        }
        present = m;
    }
    assert!(present >= 3 * COMMIT_EVERY);
}

/// The log files of `dir`, by name.
fn log_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut logs: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_str().unwrap();
            name.starts_with("wal-") && name.ends_with(".log")
        })
        .collect();
    logs.sort();
    logs
}

/// A log cut short or removed from outside after a crash, with acknowledged commits
/// only in it, is corruption (exit 5; `verify` exit 4), not an older state opened
/// quietly and then made permanent by the next checkpoint: the lock file says how far
/// the log was durable.
#[test]
fn a_log_cut_short_or_removed_is_corruption_not_an_older_state() {
    let tmp = tempfile::tempdir().unwrap();
    for damage in ["cut short", "removed"] {
        let dir = tmp.path().join(damage.replace(' ', "-"));
        ok(run(&["init", s(&dir)]));
        let acked = crash_round(&dir, 0, 30);
        assert!(
            scan(&dir).len() as u64 >= acked,
            "the crash itself loses nothing"
        );
        let logs = log_files(&dir);
        let newest = logs.last().expect("the crashed writer's log");
        match damage {
            "cut short" => {
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .open(newest)
                    .unwrap();
                file.set_len(8192).unwrap();
            }
            _ => std::fs::remove_file(newest).unwrap(),
        }
        let needles = ["corruption in wal", "a log file was cut short or removed"];
        cli_common::fails(run(&["scan", s(&dir)]), 5, &needles);
        cli_common::fails(run(&["put", s(&dir), "k", "v"]), 5, &needles);
        let out = run(&["verify", s(&dir)]);
        assert!(
            cli_common::stdout(&out).contains("cut short or removed"),
            "{damage}: {out:?}"
        );
        cli_common::fails_stdout_unchecked(out, 4, &["verify found 1 problem"]);
        // Nothing was written over what is left: the store still refuses.
        cli_common::fails(run(&["checkpoint", s(&dir)]), 5, &needles);
        // A new store in a directory holding that LOCK starts its own log.
        let fresh = tmp
            .path()
            .join(format!("fresh-{}", damage.replace(' ', "-")));
        std::fs::create_dir(&fresh).unwrap();
        std::fs::copy(dir.join("LOCK"), fresh.join("LOCK")).unwrap();
        ok(run(&["init", s(&fresh)]));
        ok(run(&["put", s(&fresh), "k", "v"]));
        assert_eq!(ok(run(&["get", s(&fresh), "k"])), "v\n");
        // Without the LOCK file, what is left opens (the way out the message gives).
        std::fs::remove_file(dir.join("LOCK")).unwrap();
        assert!(
            (scan(&dir).len() as u64) < acked,
            "{damage}: the damage lost commits"
        );
        verify(&dir);
    }
}
