//! `clean`, `defrag`, `shrink` and `backrefs` through the binary: output formats, exit
//! codes, and `kill -9` at random moments of each, after which the next open must
//! find every version intact and `verify` clean.

mod cli_common;
mod common;

use cli_common::{fails, ok, run, run_stdin, s, usage_error, TestStore};
use common::Rng;
use std::process::{Command, Stdio};
use std::time::Duration;

/// `n` puts of `key{i}` with a value naming `round`; every 13th value is large
/// enough to be stored out of line.
fn batch(round: u32, n: u32) -> Vec<u8> {
    let mut input = String::new();
    for i in 0..n {
        let pad = if i % 13 == 0 { 1500 } else { 80 };
        input.push_str(&format!("put\tkey{i:06}\tr{round}-{}\n", "x".repeat(pad)));
    }
    input.into_bytes()
}

fn scan(dir: &str, at: &str) -> String {
    ok(run(&["scan", dir, "--at", at]))
}

fn stats_json(dir: &str) -> serde_json::Value {
    serde_json::from_str(&ok(run(&["stats", "--json", dir]))).unwrap()
}

/// A store with dead space and shared data: three snapshots of main, each taken
/// before a rewrite of a part of it, the middle one dropped.
fn build(dir: &str) {
    ok(run_stdin(&["batch", dir], &batch(0, 6000)));
    for round in 1..4 {
        ok(run(&["snapshot", dir, "main", &format!("s{round}")]));
        ok(run_stdin(&["batch", dir], &batch(round, 2000 * round)));
    }
    ok(run(&["drop", dir, "s2"]));
}

/// A store whose values (inline and out of line) were overwritten at random keys:
/// one shrink moves its live data once and leaves it with next to no dead bytes, and
/// a second moves next to nothing. (Moved in rounds of a few MiB, the blocks of each
/// round sat under leaves all over the tree, so every round rewrote the leaves: a
/// shrink moved several times the live data and left a fifth of it dead.)
#[test]
fn a_shrink_settles_in_one_run() {
    let t = TestStore::new();
    let d = t.d();
    let mut rng = Rng::new(7);
    let mut input = String::new();
    for _ in 0..60_000 {
        let key = rng.below(20_000);
        let len = [10, 500, 1500, 4000][rng.below(4) as usize];
        input.push_str(&format!("put\tk{key:06}\t{}\n", "x".repeat(len)));
    }
    ok(run_stdin(
        &["batch", d, "--commit-every", "5000"],
        input.as_bytes(),
    ));
    let live = stats_json(d)["live_bytes"].as_u64().unwrap();
    assert!(
        live > 24 << 20,
        "more live data than one 16 MiB round: {live}"
    );
    let first: serde_json::Value =
        serde_json::from_str(&ok(run(&["shrink", d, "--json"]))).unwrap();
    let moved = first["bytes_moved"].as_u64().unwrap();
    assert!(
        moved <= live + live / 16,
        "moved {moved} for {live} live: {first}"
    );
    let stats = stats_json(d);
    let dead = stats["dead_bytes"].as_u64().unwrap();
    assert!(
        dead <= live / 32,
        "{dead} dead bytes left for {live} live: {stats}"
    );
    let second: serde_json::Value =
        serde_json::from_str(&ok(run(&["shrink", d, "--json"]))).unwrap();
    assert!(
        second["bytes_moved"].as_u64().unwrap() <= live / 32,
        "{second}"
    );
    assert!(ok(run(&["verify", d])).ends_with("clean\n"));
}

#[test]
fn clean_shrink_defrag_and_backrefs_report_and_keep_the_data() {
    let t = TestStore::new();
    let d = t.d();
    build(d);
    let versions = ["main", "s1", "s3"];
    let before: Vec<String> = versions.iter().map(|v| scan(d, v)).collect();
    let stats0 = stats_json(d);
    assert!(stats0["dead_bytes"].as_u64().unwrap() > 0, "{stats0}");
    assert!(stats0["footprint_bytes"].as_u64().unwrap() > 0, "{stats0}");

    let out = ok(run(&["clean", d]));
    assert!(
        out.contains("moved") && out.contains("freed") && out.contains("footprint"),
        "{out}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&ok(run(&["clean", d, "--until-dead-below", "0", "--json"]))).unwrap();
    for field in [
        "bytes_moved",
        "bytes_freed",
        "footprint_before",
        "footprint_after",
    ] {
        assert!(json[field].is_u64(), "{field} in {json}");
    }
    let out = ok(run(&["defrag", d, "s1"]));
    assert!(out.contains("moved"), "{out}");
    ok(run(&["defrag", d]));
    let shrunk: serde_json::Value =
        serde_json::from_str(&ok(run(&["shrink", d, "--json"]))).unwrap();
    let stats = stats_json(d);
    assert_eq!(stats["live_bytes"], stats0["live_bytes"]);
    let live = stats["live_bytes"].as_u64().unwrap() as f64;
    let footprint = stats["footprint_bytes"].as_u64().unwrap() as f64;
    let wal = footprint - stats["segment_bytes"].as_u64().unwrap() as f64;
    assert!(
        footprint <= live * 1.2 + wal,
        "footprint {footprint} for {live} live bytes and {wal} of WAL: {shrunk}"
    );
    // What it says it freed left the footprint, net of what it wrote: segments are
    // counted once (not again as the spare files they became).
    let field = |json: &serde_json::Value, name: &str| json[name].as_u64().unwrap();
    assert!(
        field(&shrunk, "bytes_freed")
            <= field(&shrunk, "footprint_before") - field(&shrunk, "footprint_after")
                + field(&shrunk, "bytes_moved")
                + (1 << 20),
        "{shrunk}"
    );
    // A second shrink has next to nothing to move.
    let again: serde_json::Value =
        serde_json::from_str(&ok(run(&["shrink", d, "--json"]))).unwrap();
    assert!(
        field(&again, "bytes_moved") as f64 <= live / 32.0,
        "{again} after {shrunk}"
    );
    let after: Vec<String> = versions.iter().map(|v| scan(d, v)).collect();
    assert!(before == after, "a version changed");
    assert!(ok(run(&["verify", d])).ends_with("clean\n"));

    // Who references the blocks of the segment main's root is in.
    let segments: Vec<u32> = std::fs::read_dir(d)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            let hex = name.strip_prefix("seg-")?.strip_suffix(".dat")?.to_string();
            u32::from_str_radix(&hex, 16).ok()
        })
        .collect();
    let mut blocks = 0;
    for seg in &segments {
        let json: serde_json::Value = serde_json::from_str(&ok(run(&[
            "backrefs",
            d,
            "--segment",
            &seg.to_string(),
            "--json",
        ])))
        .unwrap();
        assert_eq!(json["segment"], *seg);
        for b in json["blocks"].as_array().unwrap() {
            blocks += 1;
            let versions = b["versions"].as_array().unwrap();
            assert!(!versions.is_empty(), "a live block no version reaches: {b}");
            assert!(
                ["leaf", "branch", "value"].contains(&b["kind"].as_str().unwrap()),
                "{b}"
            );
        }
    }
    assert!(blocks > 0);
    let text = ok(run(&["backrefs", d, "--segment", &segments[0].to_string()]));
    assert!(
        text.starts_with(&format!("segment {}:", segments[0])),
        "{text}"
    );
    // --at keeps the blocks one version reaches: each line names it.
    for seg in &segments {
        let at = ok(run(&[
            "backrefs",
            d,
            "--segment",
            &seg.to_string(),
            "--at",
            "s1",
        ]));
        for line in at.lines().skip(1) {
            assert!(line.contains("versions") && line.contains("s1"), "{line}");
        }
    }
    fails(
        run(&["backrefs", d, "--segment", "1", "--at", "nope"]),
        1,
        &["nope"],
    );
}

#[test]
fn bad_arguments_exit_with_the_usual_codes() {
    let t = TestStore::new();
    let d = t.d();
    usage_error(run(&["clean", d, "--until-dead-below", "101"]));
    usage_error(run(&["clean", d, "--until-dead-below", "x"]));
    usage_error(run(&["backrefs", d]));
    usage_error(run(&["backrefs", d, "--segment", "-1"]));
    fails(run(&["defrag", d, "nope"]), 1, &["nope"]);
    let missing = t.dir.join("missing");
    fails(run(&["shrink", s(&missing)]), 3, &[]);
    // A segment that does not exist has no blocks.
    let out = ok(run(&["backrefs", d, "--segment", "999"]));
    assert!(out.starts_with("segment 999: 0 live blocks"), "{out}");
}

/// Starts `args`, kills it with SIGKILL after `delay`, and waits for it.
fn kill_after(args: &[&str], delay: Duration) {
    let mut child = Command::new(cli_common::BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn cambium");
    std::thread::sleep(delay);
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn kill9_during_clean_shrink_and_defrag_loses_nothing() {
    let t = TestStore::new();
    let d = t.d();
    let mut rng = Rng::new(0x5eed);
    let mut round = 10;
    for step in 0..18 {
        // Make dead space, then kill a space command somewhere in its run.
        ok(run(&["snapshot", d, "main", "tmp"]));
        round += 1;
        ok(run_stdin(&["batch", d], &batch(round, 4000)));
        ok(run(&["drop", d, "tmp"]));
        let versions = ["main", "s1"];
        if step == 0 {
            ok(run(&["snapshot", d, "main", "s1"]));
        }
        let before: Vec<String> = versions.iter().map(|v| scan(d, v)).collect();
        let command: &[&str] = match step % 3 {
            0 => &["shrink", d],
            1 => &["clean", d, "--until-dead-below", "0"],
            _ => &["defrag", d],
        };
        kill_after(command, Duration::from_millis(rng.range(0, 30)));
        let verify = ok(run(&["verify", d]));
        assert!(
            verify.ends_with("clean\n"),
            "after killing {command:?}: {verify}"
        );
        let after: Vec<String> = versions.iter().map(|v| scan(d, v)).collect();
        assert!(
            before == after,
            "after killing {command:?}: a version changed"
        );
    }
}

/// The issue's soak, through the CLI with default options: rounds of "snapshot,
/// rewrite the working set, drop the snapshot", each command its own process. Closes
/// clean automatically once dead space passes half the segment bytes, so the
/// footprint stays bounded instead of growing with the rounds.
#[test]
fn footprint_stays_bounded_through_the_cli_without_explicit_cleaning() {
    let t = TestStore::new();
    let d = t.d();
    let mut peak = 0;
    for round in 0..16 {
        ok(run(&["snapshot", d, "main", "snap"]));
        ok(run_stdin(&["batch", d], &batch(round, 12_000)));
        ok(run(&["drop", d, "snap"]));
        let stats = stats_json(d);
        peak = peak.max(stats["segment_bytes"].as_u64().unwrap());
    }
    let stats = stats_json(d);
    let live = stats["live_bytes"].as_u64().unwrap();
    // Each round writes about 3.5 MiB; without cleaning 16 rounds leave over 50 MiB.
    assert!(
        peak < 2 * live + (40 << 20),
        "segments peaked at {peak} bytes for {live} live bytes"
    );
    assert!(ok(run(&["verify", d])).ends_with("clean\n"));
}
