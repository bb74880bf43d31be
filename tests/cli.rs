//! End-to-end tests of the `cambium` binary: exact stdout, stderr and exit codes.

mod cli_common;

use cli_common::{fails, fails_stdout_unchecked, ok, run, run_stdin, s, stderr, stdout};
use cli_common::{usage_error, TestStore, BIN};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A store holding a, ab, abc, b, ba, c (value = key upper-cased).
fn abc_store() -> TestStore {
    let t = TestStore::new();
    let input = "put\ta\tA\nput\tab\tAB\nput\tabc\tABC\nput\tb\tB\nput\tba\tBA\nput\tc\tC\n";
    assert_eq!(ok(t.batch(&[], input)), "committed 6\n");
    t
}

#[test]
fn help_and_version_exit_0() {
    let help = ok(run(&["--help"]));
    for cmd in [
        "init",
        "put",
        "get",
        "del",
        "scan",
        "batch",
        "checkpoint",
        "stats",
        "verify",
        "tour",
    ] {
        assert!(help.contains(cmd), "--help lacks {cmd}: {help}");
    }
    assert!(help.contains("Exit codes"), "{help}");
    let scan_help = ok(run(&["scan", "--help"]));
    assert!(scan_help.contains("inclusive"), "{scan_help}");
    assert!(scan_help.contains("exclusive"), "{scan_help}");
    let version = ok(run(&["--version"]));
    assert_eq!(version, format!("cambium {}\n", env!("CARGO_PKG_VERSION")));
}

#[test]
fn init_then_init_again_fails() {
    let t = TestStore::new();
    fails(t.run("init", &[]), 3, &["already"]);
}

#[test]
fn put_get_overwrite() {
    let t = TestStore::new();
    t.put("apple", "red");
    assert_eq!(ok(t.run("get", &["apple"])), "red\n");
    t.put("apple", "green");
    assert_eq!(ok(t.run("get", &["apple"])), "green\n");
    // Empty values are values.
    t.put("empty", "");
    assert_eq!(ok(t.run("get", &["empty"])), "\n");
    // Text values are printed raw, tabs and newlines included.
    t.put("multi", "x\ty\nz");
    assert_eq!(ok(t.run("get", &["multi"])), "x\ty\nz\n");
}

#[test]
fn get_json() {
    let t = TestStore::new();
    t.put("k", "v \"quoted\"\n");
    let out = ok(t.run("get", &["k", "--json"]));
    assert_eq!(out.lines().count(), 1);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"key": "k", "value": "v \"quoted\"\n"})
    );
    // --json is global: accepted before the subcommand too.
    let out2 = ok(run(&["--json", "get", t.d(), "k"]));
    assert_eq!(out, out2);
}

#[test]
fn get_missing_key_exits_1() {
    let t = TestStore::new();
    t.put("a", "1");
    fails(t.run("get", &["b"]), 1, &["key not found"]);
    fails(t.run("get", &["b", "--json"]), 1, &["key not found"]);
}

/// `get --stdin`: keys from stdin, one read transaction, the pairs found printed in
/// input order; exit 1 (with a count) if any was missing, 3 for a line that is not a
/// key, 2 for KEY and --stdin together or neither.
#[test]
fn get_stdin_looks_up_many_keys_in_input_order() {
    let t = TestStore::new();
    t.put("a", "1");
    t.put("b", "2");
    t.put("c", "3");
    let get = |rest: &[&str], input: &str| {
        let mut args = vec!["get", t.d(), "--stdin"];
        args.extend_from_slice(rest);
        run_stdin(&args, input.as_bytes())
    };
    // Input order, duplicates kept, blank lines skipped, CR LF endings taken.
    assert_eq!(ok(get(&[], "c\na\n\nc\r\nb")), "c\t3\na\t1\nc\t3\nb\t2\n");
    assert_eq!(ok(get(&[], "")), "");
    let o = get(&[], "b\nmissing\na\nnope\n");
    assert_eq!(stdout(&o), "b\t2\na\t1\n", "found keys still print");
    fails_stdout_unchecked(o, 1, &["2 of 4 keys not found"]);
    assert_eq!(
        ok(get(&["--json"], "a\nb\n")),
        "{\"key\":\"a\",\"value\":\"1\"}\n{\"key\":\"b\",\"value\":\"2\"}\n"
    );
    assert_eq!(ok(get(&["--hex"], "63\n61\n")), "63\t33\n61\t31\n");
    // --at reads a snapshot as it was.
    ok(t.run("snapshot", &["main", "s1"]));
    t.put("a", "changed");
    assert_eq!(ok(get(&["--at", "s1"], "a\n")), "a\t1\n");
    assert_eq!(ok(get(&[], "a\n")), "a\tchanged\n");
    fails(get(&["--at", "nope"], "a\n"), 1, &["nope"]);
    // A line that is no key stops it, naming the line (what was found before it is
    // printed: the output streams).
    let o = get(&["--hex"], "61\n6\n");
    assert_eq!(stdout(&o), "61\t6368616e676564\n");
    fails_stdout_unchecked(o, 3, &["line 2", "hex"]);
    let long = "k".repeat(cambium::MAX_KEY_LEN + 1);
    fails(get(&[], &format!("{long}\na\n")), 3, &["line 1"]);
    let huge = "k".repeat(1 << 20);
    fails(
        get(&[], &huge),
        3,
        &["line 1", "longer than the longest valid line"],
    );
    fails(
        run_stdin(&["get", t.d(), "--stdin"], b"\xff\na\n"),
        3,
        &["line 1", "UTF-8"],
    );
    // KEY and --stdin together, or neither.
    usage_error(run(&["get", t.d(), "a", "--stdin"]));
    usage_error(run(&["get", t.d()]));
}

#[test]
fn del_existing_and_missing() {
    let t = TestStore::new();
    t.put("a", "1");
    t.put("b", "2");
    assert_eq!(ok(t.run("del", &["a"])), "");
    fails(t.run("get", &["a"]), 1, &["key not found"]);
    fails(t.run("del", &["a"]), 1, &["key not found"]);
    fails(t.run("del", &["never"]), 1, &["key not found"]);
    assert_eq!(ok(t.run("get", &["b"])), "2\n");
    assert_eq!(t.scan(&[]), "b\t2\n");
}

#[test]
fn scan_all_prefix_from_to() {
    let t = abc_store();
    assert_eq!(t.scan(&[]), "a\tA\nab\tAB\nabc\tABC\nb\tB\nba\tBA\nc\tC\n");
    assert_eq!(t.scan(&["--prefix", "ab"]), "ab\tAB\nabc\tABC\n");
    assert_eq!(t.scan(&["--prefix", "b"]), "b\tB\nba\tBA\n");
    assert_eq!(t.scan(&["--prefix", "zz"]), "");
    // --from is inclusive, --to exclusive.
    assert_eq!(t.scan(&["--from", "ab", "--to", "b"]), "ab\tAB\nabc\tABC\n");
    assert_eq!(t.scan(&["--from", "abc"]), "abc\tABC\nb\tB\nba\tBA\nc\tC\n");
    assert_eq!(t.scan(&["--to", "ab"]), "a\tA\n");
    assert_eq!(
        t.scan(&["--from", "aa", "--to", "bb"]),
        "ab\tAB\nabc\tABC\nb\tB\nba\tBA\n"
    );
    // An empty or inverted range prints nothing.
    assert_eq!(t.scan(&["--from", "b", "--to", "b"]), "");
    assert_eq!(t.scan(&["--from", "c", "--to", "a"]), "");
    // --prefix combines with --to.
    assert_eq!(t.scan(&["--prefix", "a", "--to", "abc"]), "a\tA\nab\tAB\n");
}

#[test]
fn scan_reverse_limit_keys_only() {
    let t = abc_store();
    assert_eq!(
        t.scan(&["--reverse"]),
        "c\tC\nba\tBA\nb\tB\nabc\tABC\nab\tAB\na\tA\n"
    );
    assert_eq!(t.scan(&["--limit", "2"]), "a\tA\nab\tAB\n");
    assert_eq!(t.scan(&["--limit", "0"]), "");
    assert_eq!(t.scan(&["--reverse", "--limit", "2"]), "c\tC\nba\tBA\n");
    assert_eq!(
        t.scan(&["--prefix", "a", "--reverse", "--limit", "2"]),
        "abc\tABC\nab\tAB\n"
    );
    assert_eq!(t.scan(&["--keys-only"]), "a\nab\nabc\nb\nba\nc\n");
    assert_eq!(
        t.scan(&["--keys-only", "--reverse", "--from", "ab", "--to", "ba"]),
        "b\nabc\nab\n"
    );
}

#[test]
fn scan_json_and_hex() {
    let t = abc_store();
    let out = t.scan(&["--json", "--prefix", "ab"]);
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines,
        vec![
            serde_json::json!({"key": "ab", "value": "AB"}),
            serde_json::json!({"key": "abc", "value": "ABC"}),
        ]
    );
    assert_eq!(
        t.scan(&["--json", "--keys-only", "--limit", "1"]),
        "{\"key\":\"a\"}\n"
    );
    // --hex prints keys and values as hex and reads --prefix/--from/--to as hex.
    assert_eq!(
        t.scan(&["--hex", "--prefix", "6162"]),
        "6162\t4142\n616263\t414243\n"
    );
    assert_eq!(
        t.scan(&["--hex", "--from", "62", "--to", "63", "--keys-only"]),
        "62\n6261\n"
    );
    assert_eq!(
        t.scan(&["--hex", "--json", "--from", "63"]),
        "{\"key\":\"63\",\"value\":\"43\"}\n"
    );
}

#[test]
fn hex_put_get_binary() {
    let t = TestStore::new();
    assert_eq!(ok(run(&["--hex", "put", t.d(), "00ff", "DEADbeef"])), "");
    assert_eq!(ok(t.run("get", &["--hex", "00ff"])), "deadbeef\n");
    // Without --hex the bytes are printed raw.
    let o = t.run("scan", &[]);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(o.stdout, b"\x00\xff\t\xde\xad\xbe\xef\n");
    assert_eq!(ok(t.run("del", &["--hex", "00FF"])), "");
    fails(t.run("get", &["--hex", "00ff"]), 1, &["key not found"]);
    // Bad hex in an argument is a usage error.
    let o = t.run("put", &["--hex", "0g", "00"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = t.run("get", &["--hex", "abc"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

#[test]
fn batch_single_transaction() {
    let t = TestStore::new();
    let input = "put\tk1\tv1\nput\tk2\tv2\n\nput\tk3\tv3\r\ndel\tk1\n   \nput\tk4\t\n";
    assert_eq!(ok(t.batch(&[], input)), "committed 5\n");
    assert_eq!(t.scan(&[]), "k2\tv2\nk3\tv3\nk4\t\n");
    // Empty input commits nothing and says so.
    assert_eq!(ok(t.batch(&[], "")), "committed 0\n");
    assert_eq!(
        ok(t.batch(&["--commit-every", "10"], "\n\n")),
        "committed 0\n"
    );
    // A final line without a newline still counts.
    assert_eq!(ok(t.batch(&[], "put\tk5\tv5")), "committed 1\n");
    assert_eq!(ok(t.run("get", &["k5"])), "v5\n");
    // del of a missing key is fine in a batch.
    assert_eq!(ok(t.batch(&[], "del\tnope\n")), "committed 1\n");
}

fn puts(range: std::ops::Range<u32>) -> String {
    range.map(|i| format!("put\tkey{i:05}\tval{i}\n")).collect()
}

#[test]
fn batch_commit_every() {
    let t = TestStore::new();
    assert_eq!(
        ok(t.batch(&["--commit-every", "100"], &puts(0..250))),
        "committed 100\ncommitted 200\ncommitted 250\n"
    );
    // An exact multiple does not print the last line twice.
    assert_eq!(
        ok(t.batch(&["--commit-every", "100"], &puts(250..450))),
        "committed 100\ncommitted 200\n"
    );
    assert_eq!(
        ok(t.batch(&["--commit-every", "1"], &puts(450..453))),
        "committed 1\ncommitted 2\ncommitted 3\n"
    );
    let keys = t.scan(&["--keys-only"]);
    assert_eq!(keys.lines().count(), 453);
    assert_eq!(ok(t.run("get", &["key00449"])), "val449\n");
    let json = ok(t.batch(&["--json", "--commit-every", "2"], &puts(0..3)));
    assert_eq!(json, "{\"committed\":2}\n{\"committed\":3}\n");
}

#[test]
fn batch_hex() {
    let t = TestStore::new();
    assert_eq!(
        ok(t.batch(&["--hex"], "put\t00\t0a09\nput\t01\t\ndel\t02\n")),
        "committed 3\n"
    );
    assert_eq!(t.scan(&["--hex"]), "00\t0a09\n01\t\n");
}

#[test]
fn batch_malformed_lines_exit_3_and_commit_nothing_pending() {
    let cases: &[(&[&str], &str, &str)] = &[
        (&[], "put\tk\tv\nfrob\tk\n", "line 2"),
        (&[], "put\tk\tv\nput\tk2\n", "line 2"),
        (&[], "put\tk\tv\nput\tk2\tv\textra\n", "line 2"),
        (&[], "put\tk\tv\ndel\n", "line 2"),
        (&[], "put\tk\tv\ndel\tk\tv\n", "line 2"),
        (&[], "put\tk\tv\n\nput\t\tv\n", "line 3"),
        (&["--hex"], "put\t6b\t76\nput\t6x\t76\n", "line 2"),
        (&["--hex"], "put\t6b\t76\nput\t6b\t7\n", "line 2"),
        (&[], "put\tk\tv\nput k v\n", "line 2"),
    ];
    for (flags, input, needle) in cases {
        let t = TestStore::new();
        let o = t.batch(flags, input);
        assert_eq!(stdout(&o), "", "input {input:?}");
        fails(o, 3, &[needle]);
        // Nothing of the failed transaction was committed.
        assert_eq!(t.scan(&[]), "", "input {input:?}");
    }
}

#[test]
fn batch_malformed_line_keeps_earlier_commits() {
    let t = TestStore::new();
    let mut input = puts(0..7);
    input.push_str("put\tonly-two-fields\n");
    input.push_str(&puts(7..9));
    let o = t.batch(&["--commit-every", "3"], &input);
    assert_eq!(stdout(&o), "committed 3\ncommitted 6\n");
    fails_stdout_unchecked(o, 3, &["line 8"]);
    let keys = t.scan(&["--keys-only"]);
    assert_eq!(
        keys,
        "key00000\nkey00001\nkey00002\nkey00003\nkey00004\nkey00005\n"
    );
    assert_eq!(ok(t.run("get", &["key00005"])), "val5\n");
    fails(t.run("get", &["key00006"]), 1, &["key not found"]);
    assert_eq!(ok(t.run("verify", &[])).lines().last(), Some("clean"));
}

#[test]
fn oversized_and_empty_keys_exit_3() {
    let t = TestStore::new();
    let big = "k".repeat(2049);
    let err = fails(t.run("put", &[&big, "v"]), 3, &["2049"]);
    assert!(err.contains("2048"), "{err}");
    fails(t.run("put", &["", "v"]), 3, &["key"]);
    let o = t.batch(&[], &format!("put\t{big}\tv\n"));
    fails(o, 3, &["line 1"]);
    // The largest key is fine.
    let max = "m".repeat(2048);
    t.put(&max, "ok");
    assert_eq!(ok(t.run("get", &[&max])), "ok\n");
    fails(t.run("get", &[&big]), 3, &["2049"]);
}

#[test]
fn large_values_round_trip() {
    let t = TestStore::new();
    let v: String = (0..5000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    t.put("big", &v);
    assert_eq!(ok(t.run("get", &["big"])), format!("{v}\n"));
    assert_eq!(ok(t.run("checkpoint", &[])), "");
    assert_eq!(ok(t.run("get", &["big"])), format!("{v}\n"));
}

#[test]
fn missing_store_and_not_a_store_exit_3() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nope");
    for args in [
        vec!["get", s(&missing), "k"],
        vec!["put", s(&missing), "k", "v"],
        vec!["del", s(&missing), "k"],
        vec!["scan", s(&missing)],
        vec!["stats", s(&missing)],
        vec!["verify", s(&missing)],
        vec!["checkpoint", s(&missing)],
    ] {
        let err = fails(run(&args), 3, &["does not exist"]);
        assert!(err.contains("nope"), "{err}");
    }
    fails(
        run_stdin(&["batch", s(&missing)], b"put\tk\tv\n"),
        3,
        &["does not exist"],
    );
    // The failed commands did not create the directory.
    assert!(!missing.exists());

    let plain = tmp.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    std::fs::write(plain.join("notes.txt"), "hello").unwrap();
    for args in [
        vec!["get", s(&plain), "k"],
        vec!["put", s(&plain), "k", "v"],
        vec!["scan", s(&plain)],
        vec!["stats", s(&plain)],
        vec!["verify", s(&plain)],
    ] {
        fails(run(&args), 3, &["not a cambium store"]);
    }
    // A file named as the store: the same, for writing commands too (they look for a
    // server's control socket in it first).
    let file = plain.join("notes.txt");
    for args in [
        vec!["get", s(&file), "k"],
        vec!["put", s(&file), "k", "v"],
        vec!["volume", "create", s(&file), "v", "--size", "1M"],
    ] {
        fails(run(&args), 3, &["not a cambium store"]);
    }
}

#[test]
fn unknown_branch_and_version_exit_1() {
    let t = TestStore::new();
    t.put("a", "1");
    fails(t.run("put", &["a", "2", "--branch", "nope"]), 1, &["nope"]);
    fails(t.run("del", &["a", "--branch", "nope"]), 1, &["nope"]);
    fails(t.batch(&["--branch", "nope"], "put\ta\t3\n"), 1, &["nope"]);
    fails(t.run("get", &["a", "--at", "v9"]), 1, &["v9"]);
    fails(t.run("scan", &["--at", "v9"]), 1, &["v9"]);
    // main works explicitly, and nothing above changed it.
    assert_eq!(ok(t.run("get", &["a", "--at", "main"])), "1\n");
    assert_eq!(ok(t.run("put", &["b", "2", "--branch", "main"])), "");
    assert_eq!(t.scan(&["--at", "main"]), "a\t1\nb\t2\n");
}

#[test]
fn bad_flags_exit_2() {
    let t = TestStore::new();
    usage_error(run(&[]));
    usage_error(run(&["frobnicate"]));
    usage_error(t.run("get", &[]));
    usage_error(t.run("get", &["k", "--bogus"]));
    usage_error(t.run("put", &["k"]));
    usage_error(t.run("scan", &["--prefix", "a", "--from", "b"]));
    usage_error(t.run("scan", &["--limit", "-1"]));
    usage_error(t.run("scan", &["--limit", "many"]));
    usage_error(t.batch(&["--commit-every", "0"], ""));
    usage_error(t.batch(&["--commit-every", "x"], ""));
    usage_error(run(&["init"]));
}

#[test]
fn stats_text_and_json() {
    let t = TestStore::new();
    t.batch(&[], &puts(0..500));
    let text = ok(t.run("stats", &[]));
    assert!(text.contains("keys"), "{text}");
    assert!(text.contains("hit rate"), "{text}");
    assert!(text.contains(" B") || text.contains("iB"), "{text}");
    let json = ok(t.run("stats", &["--json"]));
    assert_eq!(json.lines().count(), 1);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    for field in [
        "format_version",
        "generation",
        "keys",
        "depth",
        "leaf_nodes",
        "branch_nodes",
        "segments",
        "segment_bytes",
        "live_bytes",
        "dead_bytes",
        "wal_bytes",
        "cache_hit_rate",
    ] {
        assert!(v.get(field).is_some(), "stats --json lacks {field}: {json}");
    }
    assert_eq!(v["keys"], 500);
    assert_eq!(v["format_version"], cambium::FORMAT_VERSION);
    // After a checkpoint the tree lives in segments.
    ok(t.run("checkpoint", &[]));
    let v: serde_json::Value = serde_json::from_str(&ok(t.run("stats", &["--json"]))).unwrap();
    assert_eq!(v["keys"], 500);
    assert!(v["segments"].as_u64().unwrap() >= 1, "{v}");
    assert!(v["depth"].as_u64().unwrap() >= 1, "{v}");
}

#[test]
fn verify_clean_store() {
    let t = TestStore::new();
    assert_eq!(ok(t.run("verify", &[])).lines().last(), Some("clean"));
    t.batch(&["--commit-every", "50"], &puts(0..200));
    assert_eq!(ok(t.run("verify", &[])).lines().last(), Some("clean"));
    ok(t.run("checkpoint", &[]));
    let json = ok(t.run("verify", &["--json"]));
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["clean"], true, "{json}");
    assert_eq!(v["problems"], serde_json::json!([]), "{json}");
}

#[test]
fn checkpoint_keeps_data() {
    let t = TestStore::new();
    t.batch(&[], &puts(0..300));
    assert_eq!(ok(t.run("checkpoint", &[])), "");
    assert_eq!(ok(t.run("checkpoint", &[])), "");
    t.put("after", "x");
    assert_eq!(t.scan(&["--keys-only"]).lines().count(), 301);
    assert_eq!(ok(t.run("get", &["key00123"])), "val123\n");
}

#[test]
fn broken_pipe_is_quiet() {
    let t = TestStore::new();
    t.batch(&[], &puts(0..5000));
    let mut child = Command::new(BIN)
        .args(["scan", t.d()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // the reader goes away at once
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stderr(&o), "");
}

#[test]
fn tour_runs() {
    let out = ok(run(&["tour", "--keys", "3000"]));
    assert!(out.contains("verified it: clean"), "{out}");
    let json = ok(run(&["tour", "--keys", "500", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["keys_loaded"], 500);
    assert_eq!(v["verify"]["problems"], serde_json::json!([]));
    assert!(!Path::new(v["dir"].as_str().unwrap()).exists());
}

#[test]
fn wrong_format_version_exits_3() {
    let t = TestStore::new();
    t.put("a", "1");
    ok(t.run("checkpoint", &[]));
    t.put("b", "2");
    ok(t.run("checkpoint", &[]));
    // The superblock file holds two 4 KiB slots; each starts with the magic
    // "CAMBIUM\0" and then the format version, a little-endian u32 at offset 8
    // (src/superblock.rs, docs/FORMAT.md).
    let path = t.dir.join("superblock");
    let mut sb = std::fs::read(&path).unwrap();
    assert!(sb.len() >= 8192, "superblock is {} bytes", sb.len());
    let mut patched = 0;
    for slot in [0, 4096] {
        if &sb[slot..slot + 8] == b"CAMBIUM\0" {
            let v = cambium::FORMAT_VERSION;
            assert_eq!(sb[slot + 8..slot + 12], v.to_le_bytes());
            sb[slot + 8..slot + 12].copy_from_slice(&(v + 1).to_le_bytes());
            patched += 1;
        }
    }
    assert_eq!(patched, 2, "both slots were written by the two checkpoints");
    std::fs::write(&path, &sb).unwrap();
    for args in [
        vec!["get", t.d(), "a"],
        vec!["put", t.d(), "c", "3"],
        vec!["scan", t.d()],
        vec!["stats", t.d()],
        vec!["verify", t.d()],
    ] {
        let err = fails(run(&args), 3, &["format version"]);
        let v = cambium::FORMAT_VERSION.to_string();
        assert!(err.contains(&v), "{err}");
    }
}

#[test]
fn corruption_is_exit_5_and_verify_reports_it_with_exit_4() {
    let t = TestStore::new();
    assert_eq!(ok(t.batch(&[], &puts(0..3000))), "committed 3000\n");
    // The batch closed the store, so everything is checkpointed into segments. One
    // more command checkpoints again, so the fallback superblock slot, too, needs the
    // (corrupted) segments: had the damage hit only the newest slot's metadata, the
    // fallback slot plus the WAL it keeps would otherwise rebuild every key.
    t.put("key00000", "val0");
    let mut segs: Vec<PathBuf> = std::fs::read_dir(&t.dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with("seg-"))
        .collect();
    segs.sort();
    assert!(!segs.is_empty(), "no segment files in {:?}", t.dir);
    for seg in &segs {
        let mut b = std::fs::read(seg).unwrap();
        for i in (256..b.len()).step_by(512) {
            b[i] ^= 0x5a;
        }
        std::fs::write(seg, &b).unwrap();
    }
    fails(t.run("scan", &[]), 5, &["corrupt"]);

    let o = t.run("verify", &[]);
    let out = stdout(&o);
    fails_stdout_unchecked(o, 4, &["verify found"]);
    assert!(out.contains("problem: "), "{out}");
    assert!(!out.contains("\nclean\n"), "{out}");
    let o = t.run("verify", &["--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["clean"], false);
    assert!(!v["problems"].as_array().unwrap().is_empty());
    fails_stdout_unchecked(o, 4, &["verify found"]);

    // A superblock with no valid slot: verify still reports (exit 4), others exit 5.
    std::fs::write(t.dir.join("superblock"), vec![0xa5; 8192]).unwrap();
    fails(t.run("get", &["key00001"]), 5, &["superblock"]);
    let o = t.run("verify", &[]);
    assert!(stdout(&o).contains("problem: "), "{}", stdout(&o));
    fails_stdout_unchecked(o, 4, &["verify found"]);
}

#[test]
fn a_second_writer_exits_3_and_readers_work_beside_the_first() {
    let t = TestStore::new();
    t.put("a", "1");
    // A batch waiting on stdin holds the store open for writing.
    let mut writer = Command::new(BIN)
        .args(["batch", t.d(), "--commit-every", "1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = writer.stdin.take().unwrap();
    stdin.write_all(b"put\tb\t2\n").unwrap();
    stdin.flush().unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(writer.stdout.as_mut().unwrap()),
        &mut first,
    )
    .unwrap();
    assert_eq!(first, "committed 1\n");
    // Reads work beside it (and see its acknowledged commit); a second writer does not.
    assert_eq!(ok(t.run("get", &["a"])), "1\n");
    assert_eq!(ok(t.run("get", &["b"])), "2\n");
    fails(t.run("put", &["c", "3"]), 3, &["in use"]);
    drop(stdin);
    let o = writer.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // Once the writer is gone the store opens again.
    assert_eq!(ok(t.run("get", &["b"])), "2\n");
}
