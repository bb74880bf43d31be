//! End-to-end tests of the version commands of the `cambium` binary (`snapshot`,
//! `branch`, `versions`, `drop`, `diff`, and `--at` / `--branch` on the data
//! commands): exact stdout, stderr and exit codes.

mod cli_common;

use cli_common::{fails, ok, run, s, usage_error, TestStore};
use serde_json::Value;

/// Helpers for the version commands.
impl TestStore {
    /// `put --branch`.
    fn put_on(&self, branch: &str, k: &str, v: &str) {
        assert_eq!(ok(self.run("put", &[k, v, "--branch", branch])), "");
    }

    /// `del --branch`.
    fn del_on(&self, branch: &str, k: &str) {
        assert_eq!(ok(self.run("del", &[k, "--branch", branch])), "");
    }

    /// `scan --at VERSION`.
    fn scan_at(&self, version: &str) -> String {
        self.scan(&["--at", version])
    }

    /// `get KEY --at VERSION`.
    fn get_at(&self, version: &str, key: &str) -> String {
        ok(self.run("get", &[key, "--at", version]))
    }

    fn snapshot(&self, source: &str, name: &str) {
        assert_eq!(
            ok(self.run("snapshot", &[source, name])),
            format!("created snapshot {name} from {source}\n")
        );
    }

    fn branch(&self, source: &str, name: &str) {
        assert_eq!(
            ok(self.run("branch", &[source, name])),
            format!("created branch {name} from {source}\n")
        );
    }

    fn drop_version(&self, name: &str) {
        assert_eq!(ok(self.run("drop", &[name])), format!("dropped {name}\n"));
    }

    fn diff(&self, a: &str, b: &str, rest: &[&str]) -> String {
        let mut args = vec![a, b];
        args.extend_from_slice(rest);
        ok(self.run("diff", &args))
    }

    /// `versions --json`, parsed.
    fn versions_json(&self) -> Vec<Value> {
        let out = ok(self.run("versions", &["--json"]));
        assert_eq!(out.lines().count(), 1, "one JSON document: {out}");
        match serde_json::from_str::<Value>(&out).expect("versions --json is JSON") {
            Value::Array(list) => list,
            other => panic!("versions --json is not an array: {other}"),
        }
    }

    /// The entry of `versions --json` for `name`.
    fn version(&self, name: &str) -> Value {
        self.versions_json()
            .into_iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no version {name} listed"))
    }

    fn names(&self) -> Vec<String> {
        self.versions_json()
            .iter()
            .map(|v| v["name"].as_str().unwrap().to_string())
            .collect()
    }

    fn stats(&self) -> Value {
        serde_json::from_str(&ok(self.run("stats", &["--json"]))).unwrap()
    }

    #[track_caller]
    fn verify_clean(&self) {
        let out = ok(self.run("verify", &[]));
        assert!(out.ends_with("clean\n"), "{out}");
    }
}

/// A store whose main holds a=1, b=2, c=3.
fn abc_store() -> TestStore {
    let t = TestStore::new();
    let out = t.batch(&[], "put\ta\t1\nput\tb\t2\nput\tc\t3\n");
    assert_eq!(ok(out), "committed 3\n");
    t
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The `versions` text output as (tree label, rest of the line) pairs, header
/// excluded; the label is everything before the KIND column.
fn tree_rows(text: &str) -> Vec<(String, String)> {
    let mut lines = text.lines();
    let header = lines.next().expect("a header line");
    assert!(header.starts_with("VERSION "), "header: {header:?}");
    for col in ["KIND", "CREATED", "REFERENCED", "EXCLUSIVE", "KEYS"] {
        assert!(header.contains(col), "header {header:?} lacks {col}");
    }
    let kind_col = header[..header.find("KIND").unwrap()].chars().count();
    lines
        .map(|l| {
            let label: String = l.chars().take(kind_col).collect();
            let rest: String = l.chars().skip(kind_col).collect();
            (label.trim_end().to_string(), rest)
        })
        .collect()
}

#[test]
fn help_lists_the_version_commands_and_exit_codes() {
    let help = ok(run(&["--help"]));
    for cmd in ["snapshot", "branch", "versions", "drop", "diff"] {
        assert!(
            help.lines()
                .any(|l| l.trim_start().starts_with(&format!("{cmd} "))),
            "--help lacks {cmd}: {help}"
        );
    }
    assert!(help.contains("malformed"), "{help}");
    assert!(help.contains("a write to a snapshot"), "{help}");
    assert!(help.contains("already taken"), "{help}");
    for cmd in ["snapshot", "branch", "versions", "drop", "diff"] {
        let h = ok(run(&[cmd, "--help"]));
        assert!(h.contains("Usage: cambium"), "{cmd} --help: {h}");
    }
    let h = ok(run(&["diff", "--help"]));
    assert!(h.contains("--keys-only"), "{h}");
}

#[test]
fn snapshot_is_read_only_and_keeps_the_old_state() {
    let t = abc_store();
    t.snapshot("main", "s1");
    t.put("b", "20");
    t.put("d", "4");
    assert_eq!(ok(t.run("del", &["a"])), "");
    // The snapshot still shows the state it was made of; main moved on.
    assert_eq!(t.scan_at("s1"), "a\t1\nb\t2\nc\t3\n");
    assert_eq!(t.scan_at("main"), "b\t20\nc\t3\nd\t4\n");
    assert_eq!(t.get_at("s1", "b"), "2\n");
    assert_eq!(t.get_at("s1", "a"), "1\n");
    fails(t.run("get", &["d", "--at", "s1"]), 1, &["key not found"]);
    // Every scan flag works at a version.
    assert_eq!(
        ok(t.run(
            "scan",
            &["--at", "s1", "--from", "b", "--reverse", "--keys-only"]
        )),
        "c\nb\n"
    );
    assert_eq!(
        ok(t.run("scan", &["--at", "s1", "--prefix", "a", "--json"])),
        "{\"key\":\"a\",\"value\":\"1\"}\n"
    );
    assert_eq!(
        ok(t.run("get", &["c", "--at", "s1", "--json"])),
        "{\"key\":\"c\",\"value\":\"3\"}\n"
    );
    assert_eq!(ok(t.run("get", &["63", "--at", "s1", "--hex"])), "33\n");
    t.verify_clean();
}

#[test]
fn writes_to_a_snapshot_exit_3_and_change_nothing() {
    let t = abc_store();
    t.snapshot("main", "s1");
    fails(
        t.run("put", &["a", "9", "--branch", "s1"]),
        3,
        &["s1", "snapshot", "cambium branch"],
    );
    fails(
        t.run("del", &["a", "--branch", "s1"]),
        3,
        &["s1", "snapshot"],
    );
    fails(
        t.batch(&["--branch", "s1"], "put\ta\t9\ndel\tb\n"),
        3,
        &["s1", "snapshot"],
    );
    fails(
        t.batch(&["--branch", "s1", "--commit-every", "1"], "put\ta\t9\n"),
        3,
        &["s1", "snapshot"],
    );
    // `--at`, the reads' flag, names the version to write to as well.
    fails(
        t.run("put", &["a", "9", "--at", "s1"]),
        3,
        &["s1", "snapshot", "cambium branch"],
    );
    fails(t.run("del", &["a", "--at", "s1"]), 3, &["s1", "snapshot"]);
    fails(
        t.batch(&["--at", "s1"], "put\ta\t9\n"),
        3,
        &["s1", "snapshot"],
    );
    assert_eq!(t.scan_at("s1"), "a\t1\nb\t2\nc\t3\n");
    assert_eq!(t.scan_at("main"), "a\t1\nb\t2\nc\t3\n");
    // A snapshot of a snapshot is read-only too; a branch of it is writable.
    t.snapshot("s1", "s2");
    fails(
        t.run("put", &["a", "9", "--branch", "s2"]),
        3,
        &["s2", "snapshot"],
    );
    t.branch("s2", "dev");
    t.put_on("dev", "a", "9");
    ok(t.run("put", &["c", "8", "--at", "dev"]));
    assert_eq!(t.scan_at("dev"), "a\t9\nb\t2\nc\t8\n");
    assert_eq!(t.scan_at("s2"), "a\t1\nb\t2\nc\t3\n");
    t.verify_clean();
}

#[test]
fn branch_and_source_diverge_independently() {
    let t = abc_store();
    t.branch("main", "dev");
    t.put_on("dev", "b", "dev-b");
    t.del_on("dev", "c");
    t.put("a", "main-a");
    t.put("z", "main-z");
    assert_eq!(
        ok(t.batch(&["--branch", "dev"], "put\tx\tdev-x\ndel\ta\n")),
        "committed 2\n"
    );
    assert_eq!(t.scan_at("dev"), "b\tdev-b\nx\tdev-x\n");
    assert_eq!(ok(t.run("scan", &[])), "a\tmain-a\nb\t2\nc\t3\nz\tmain-z\n");
    // A delete of a key the branch no longer has exits 1, as on main.
    fails(
        t.run("del", &["c", "--branch", "dev"]),
        1,
        &["key not found"],
    );
    // --branch main is the same as no --branch.
    t.put_on("main", "m", "1");
    assert_eq!(t.get_at("main", "m"), "1\n");
    fails(t.run("get", &["m", "--at", "dev"]), 1, &["key not found"]);
    t.verify_clean();
}

#[test]
fn snapshot_and_branch_json_print_the_version() {
    let t = abc_store();
    let before = now_ms();
    let out = ok(t.run("snapshot", &["main", "s1", "--json"]));
    let after = now_ms();
    assert_eq!(out.lines().count(), 1, "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["name"], "s1");
    assert_eq!(v["kind"], "snapshot");
    assert_eq!(v["parent"], "main");
    let main = t.version("main");
    assert_eq!(v["parent_id"], main["id"]);
    assert_eq!(v["keys"], 3);
    let created = v["created_unix_ms"].as_u64().unwrap();
    assert!(
        before <= created && created <= after,
        "{before} <= {created} <= {after}"
    );
    for field in [
        "id",
        "created_lsn",
        "created_checkpoint",
        "referenced_bytes",
        "exclusive_bytes",
    ] {
        assert!(v[field].is_u64(), "{field} in {v}");
    }

    let out = ok(t.run("branch", &["s1", "dev", "--json"]));
    let b: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(b["name"], "dev");
    assert_eq!(b["kind"], "branch");
    assert_eq!(b["parent"], "s1");
    assert_eq!(b["parent_id"], v["id"]);
    assert_ne!(b["id"], v["id"]);
    assert_eq!(b["keys"], 3);
}

#[test]
fn versions_text_is_a_tree() {
    let t = abc_store();
    t.snapshot("main", "s1");
    t.branch("s1", "dev");
    t.put_on("dev", "d", "4");
    t.snapshot("dev", "dev-snap");
    t.branch("main", "feature/x");
    let out = ok(t.run("versions", &[]));
    let rows = tree_rows(&out);
    let labels: Vec<&str> = rows.iter().map(|(l, _)| l.as_str()).collect();
    assert_eq!(
        labels,
        [
            "main",
            "├── s1",
            "│   └── dev",
            "│       └── dev-snap",
            "└── feature/x",
        ],
        "{out}"
    );
    let kinds: Vec<&str> = rows
        .iter()
        .map(|(_, rest)| rest.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["branch", "snapshot", "branch", "snapshot", "branch"],
        "{out}"
    );
    for (label, rest) in &rows {
        let f: Vec<&str> = rest.split_whitespace().collect();
        // kind, date, time, "UTC", referenced (n unit), exclusive (n unit), keys
        assert_eq!(f.len(), 9, "{label}: {rest:?}");
        assert_eq!(f[1].len(), 10, "a date: {rest:?}");
        assert!(
            f[1].as_bytes()[4] == b'-' && f[1].as_bytes()[7] == b'-',
            "{rest:?}"
        );
        assert!(f[1][..4].parse::<u64>().unwrap() >= 2025, "{rest:?}");
        assert_eq!(f[2].len(), 8, "a time: {rest:?}");
        assert_eq!(f[3], "UTC");
        assert!(f[4].parse::<f64>().is_ok(), "{rest:?}");
        assert!(["B", "KiB", "MiB", "GiB"].contains(&f[5]), "{rest:?}");
        assert!(f[6].parse::<f64>().is_ok(), "{rest:?}");
        assert!(["B", "KiB", "MiB", "GiB"].contains(&f[7]), "{rest:?}");
        let keys: u64 = f[8].parse().unwrap();
        let want = if label.contains("dev") { 4 } else { 3 };
        assert_eq!(keys, want, "{label}: {rest:?}");
    }
    // Every line has the same width: the columns line up.
    let widths: Vec<usize> = out.lines().map(|l| l.chars().count()).collect();
    assert!(widths.iter().all(|&w| w == widths[0]), "{out}");
}

#[test]
fn versions_json_lists_every_version_with_parent_links() {
    let t = abc_store();
    t.snapshot("main", "s1");
    t.branch("s1", "dev");
    let list = t.versions_json();
    let names: Vec<&str> = list.iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["main", "s1", "dev"]);
    let main = &list[0];
    assert_eq!(main["kind"], "branch");
    assert_eq!(main["parent"], Value::Null);
    assert_eq!(main["parent_id"], Value::Null);
    assert_eq!(list[1]["kind"], "snapshot");
    assert_eq!(list[1]["parent"], "main");
    assert_eq!(list[1]["parent_id"], main["id"]);
    assert_eq!(list[2]["kind"], "branch");
    assert_eq!(list[2]["parent"], "s1");
    assert_eq!(list[2]["parent_id"], list[1]["id"]);
    for v in &list {
        for field in [
            "id",
            "created_unix_ms",
            "created_lsn",
            "created_checkpoint",
            "referenced_bytes",
            "exclusive_bytes",
            "keys",
        ] {
            assert!(v[field].is_u64(), "{field} in {v}");
        }
        assert_eq!(v["keys"], 3, "{v}");
        assert!(
            v["exclusive_bytes"].as_u64() <= v["referenced_bytes"].as_u64(),
            "{v}"
        );
    }
    // Created in order.
    let times: Vec<u64> = list
        .iter()
        .map(|v| v["created_unix_ms"].as_u64().unwrap())
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
}

#[test]
fn space_accounting_follows_the_data() {
    let t = abc_store();
    assert_eq!(ok(t.run("checkpoint", &[])), "");
    t.branch("main", "dev");
    // 64 values of 4 KiB, out of line, only on dev.
    let input: String = (0..64)
        .map(|i| format!("put\tblob/{i:02}\t{}\n", "x".repeat(4096)))
        .collect();
    assert_eq!(ok(t.batch(&["--branch", "dev"], &input)), "committed 64\n");
    let dev = t.version("dev");
    let main = t.version("main");
    let (dev_ref, dev_excl) = (
        dev["referenced_bytes"].as_u64().unwrap(),
        dev["exclusive_bytes"].as_u64().unwrap(),
    );
    assert!(dev_excl >= 64 * 4096, "dev {dev}");
    assert!(dev_ref >= dev_excl, "dev {dev}");
    assert!(
        main["referenced_bytes"].as_u64().unwrap() < 64 * 4096,
        "main {main}"
    );
    assert_eq!(dev["keys"], 67);
    let rows = tree_rows(&ok(t.run("versions", &[])));
    assert_eq!(rows[1].0, "└── dev");
    assert!(rows[1].1.contains("KiB"), "{:?}", rows[1]);
}

#[test]
fn clones_of_clones_to_depth() {
    let t = abc_store();
    // main -> v1 (snap) -> b1 (branch) -> v2 (snap) -> b2 -> ... -> b6, each branch
    // changing one key and adding one.
    let mut source = "main".to_string();
    let mut expected = vec![("a", "1".to_string()), ("b", "2".into()), ("c", "3".into())];
    let mut states = Vec::new();
    for depth in 1..=6 {
        let snap = format!("v{depth}");
        let br = format!("b{depth}");
        t.snapshot(&source, &snap);
        t.branch(&snap, &br);
        t.put_on(&br, "b", &format!("b@{depth}"));
        let key = format!("k{depth}");
        t.put_on(&br, &key, &depth.to_string());
        expected.retain(|(k, _)| *k != "b");
        expected.push(("b", format!("b@{depth}")));
        let mut kv: Vec<(String, String)> = expected
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        for d in 1..=depth {
            kv.push((format!("k{d}"), d.to_string()));
        }
        kv.sort();
        states.push((br.clone(), kv));
        source = br;
    }
    for (br, kv) in &states {
        let want: String = kv.iter().map(|(k, v)| format!("{k}\t{v}\n")).collect();
        assert_eq!(t.scan_at(br), want, "{br}");
    }
    // Earlier levels did not see later writes, and main is untouched.
    assert_eq!(t.scan_at("main"), "a\t1\nb\t2\nc\t3\n");
    assert_eq!(t.scan_at("v1"), "a\t1\nb\t2\nc\t3\n");
    assert_eq!(t.get_at("v3", "b"), "b@2\n");
    // A deep tree: each level nests one deeper.
    let rows = tree_rows(&ok(t.run("versions", &[])));
    let labels: Vec<&str> = rows.iter().map(|(l, _)| l.as_str()).collect();
    assert_eq!(labels.len(), 13);
    assert_eq!(labels[0], "main");
    assert_eq!(labels[1], "└── v1");
    assert_eq!(labels[2], "    └── b1");
    assert_eq!(labels[12], format!("{}└── b6", "    ".repeat(11)));
    // Parent links in JSON follow the chain.
    let list = t.versions_json();
    for depth in 2..=6 {
        let v = list
            .iter()
            .find(|v| v["name"] == format!("v{depth}").as_str())
            .unwrap();
        assert_eq!(v["parent"], format!("b{}", depth - 1).as_str());
    }
    // Diff across the chain: b1 -> b6.
    assert_eq!(
        t.diff("b1", "b6", &[]),
        "~ b b@6\n+ k2 2\n+ k3 3\n+ k4 4\n+ k5 5\n+ k6 6\n"
    );
    t.verify_clean();
}

#[test]
fn diff_text_json_keys_only_and_hex() {
    let t = abc_store();
    t.snapshot("main", "before");
    t.put("b", "two words");
    assert_eq!(ok(t.run("del", &["c"])), "");
    t.put("d", "4");
    t.put("a", "1"); // rewritten with the same value: not a change
    assert_eq!(t.diff("before", "main", &[]), "~ b two words\n- c\n+ d 4\n");
    assert_eq!(t.diff("main", "before", &[]), "~ b 2\n+ c 3\n- d\n");
    assert_eq!(
        t.diff("before", "main", &["--keys-only"]),
        "~ b\n- c\n+ d\n"
    );
    assert_eq!(
        t.diff("before", "main", &["--json"]),
        "{\"op\":\"~\",\"key\":\"b\",\"value\":\"two words\"}\n\
         {\"op\":\"-\",\"key\":\"c\"}\n\
         {\"op\":\"+\",\"key\":\"d\",\"value\":\"4\"}\n"
    );
    assert_eq!(
        t.diff("before", "main", &["--json", "--keys-only"]),
        "{\"op\":\"~\",\"key\":\"b\"}\n{\"op\":\"-\",\"key\":\"c\"}\n{\"op\":\"+\",\"key\":\"d\"}\n"
    );
    assert_eq!(
        t.diff("before", "main", &["--hex"]),
        "~ 62 74776f20776f726473\n- 63\n+ 64 34\n"
    );
    assert_eq!(
        t.diff("before", "main", &["--hex", "--keys-only"]),
        "~ 62\n- 63\n+ 64\n"
    );
    assert_eq!(
        t.diff("before", "main", &["--hex", "--json"]),
        "{\"op\":\"~\",\"key\":\"62\",\"value\":\"74776f20776f726473\"}\n\
         {\"op\":\"-\",\"key\":\"63\"}\n\
         {\"op\":\"+\",\"key\":\"64\",\"value\":\"34\"}\n"
    );
    // The flag may come before the arguments too.
    assert_eq!(
        ok(run(&["diff", "--keys-only", t.d(), "before", "main"])),
        "~ b\n- c\n+ d\n"
    );
}

#[test]
fn diff_of_equal_versions_is_empty() {
    let t = abc_store();
    t.snapshot("main", "s1");
    t.branch("main", "dev");
    assert_eq!(t.diff("main", "s1", &[]), "");
    assert_eq!(t.diff("s1", "dev", &[]), "");
    assert_eq!(t.diff("main", "main", &[]), "");
    assert_eq!(t.diff("s1", "s1", &["--json"]), "");
    // A write and its undo leave no difference.
    t.put_on("dev", "q", "1");
    t.del_on("dev", "q");
    assert_eq!(t.diff("s1", "dev", &[]), "");
}

#[test]
fn diff_binary_keys_and_large_values() {
    let t = TestStore::new();
    assert_eq!(ok(t.run("put", &["00ff", "80", "--hex"])), "");
    t.snapshot("main", "s");
    let big = "ab".repeat(5000); // 5000 bytes: stored out of line
    assert_eq!(ok(t.run("put", &["00ff", &big, "--hex"])), "");
    assert_eq!(ok(t.run("put", &["ff", "", "--hex"])), "");
    assert_eq!(
        t.diff("s", "main", &["--hex"]),
        format!("~ 00ff {big}\n+ ff \n")
    );
    // Bytes that are not UTF-8 become U+FFFD in JSON without --hex.
    let out = t.diff("main", "s", &["--json"]);
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert_eq!(lines[0]["op"], "~");
    assert_eq!(lines[0]["key"], "\u{0}\u{fffd}");
    assert_eq!(lines[0]["value"], "\u{fffd}");
    assert_eq!(lines[1]["op"], "-");
    assert_eq!(lines[1]["key"], "\u{fffd}");
    assert_eq!(lines[1].get("value"), None);
    // Raw text mode prints the bytes as they are.
    let o = t.run("diff", &["s", "main", "--keys-only"]);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(o.stdout, b"~ \x00\xff\n+ \xff\n".to_vec());
}

#[test]
fn diff_after_many_edits_matches_a_model() {
    let t = TestStore::new();
    let mut model = std::collections::BTreeMap::new();
    let input: String = (0..2000)
        .map(|i| {
            model.insert(format!("k{i:05}"), format!("v{i}"));
            format!("put\tk{i:05}\tv{i}\n")
        })
        .collect();
    assert_eq!(ok(t.batch(&[], &input)), "committed 2000\n");
    t.snapshot("main", "base");
    let old = model.clone();
    let mut edits = String::new();
    for i in (0..2000).step_by(97) {
        let k = format!("k{i:05}");
        edits.push_str(&format!("put\t{k}\tchanged{i}\n"));
        model.insert(k, format!("changed{i}"));
    }
    for i in (5..2000).step_by(131) {
        let k = format!("k{i:05}");
        edits.push_str(&format!("del\t{k}\n"));
        model.remove(&k);
    }
    for i in 0..50 {
        let k = format!("new{i:03}");
        edits.push_str(&format!("put\t{k}\tn{i}\n"));
        model.insert(k, format!("n{i}"));
    }
    ok(t.batch(&[], &edits));
    assert_eq!(ok(t.run("checkpoint", &[])), "");
    let mut want = String::new();
    let keys: std::collections::BTreeSet<&String> = old.keys().chain(model.keys()).collect();
    for k in keys {
        match (old.get(k), model.get(k)) {
            (Some(a), Some(b)) if a != b => want.push_str(&format!("~ {k} {b}\n")),
            (Some(_), None) => want.push_str(&format!("- {k}\n")),
            (None, Some(b)) => want.push_str(&format!("+ {k} {b}\n")),
            _ => {}
        }
    }
    assert_eq!(t.diff("base", "main", &[]), want);
}

#[test]
fn drop_removes_a_version_and_its_name_can_be_reused() {
    let t = abc_store();
    t.branch("main", "dev");
    t.put_on("dev", "x", "1");
    t.snapshot("main", "s1");
    t.drop_version("dev");
    assert_eq!(t.names(), ["main", "s1"]);
    fails(t.run("get", &["x", "--at", "dev"]), 1, &["dev"]);
    fails(t.run("scan", &["--at", "dev"]), 1, &["dev"]);
    fails(t.run("drop", &["dev"]), 1, &["dev"]);
    // The name is free again: a new, unrelated version.
    t.branch("s1", "dev");
    assert_eq!(t.scan_at("dev"), "a\t1\nb\t2\nc\t3\n");
    assert_eq!(t.version("dev")["parent"], "s1");
    let out = ok(t.run("drop", &["s1", "--json"]));
    assert_eq!(out, "{\"dropped\":\"s1\"}\n");
    assert_eq!(t.names(), ["main", "dev"]);
    t.verify_clean();
}

#[test]
fn dropping_a_snapshot_keeps_its_clones_readable() {
    let t = abc_store();
    t.snapshot("main", "s1");
    t.branch("s1", "dev");
    t.snapshot("dev", "s2");
    t.branch("s2", "dev2");
    t.put_on("dev", "d", "4");
    // main changes, so nothing but the clones holds s1's state.
    t.put("a", "changed");
    assert_eq!(ok(t.run("del", &["b"])), "");
    assert_eq!(ok(t.run("checkpoint", &[])), "");
    t.drop_version("s1");
    t.drop_version("s2");
    assert_eq!(t.scan_at("dev"), "a\t1\nb\t2\nc\t3\nd\t4\n");
    assert_eq!(t.scan_at("dev2"), "a\t1\nb\t2\nc\t3\n");
    assert_eq!(t.scan_at("main"), "a\tchanged\nc\t3\n");
    // The clones stay writable and their parent links name versions that exist.
    t.put_on("dev2", "e", "5");
    assert_eq!(t.get_at("dev2", "e"), "5\n");
    let list = t.versions_json();
    let names: Vec<&str> = list.iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["main", "dev", "dev2"]);
    for v in &list {
        if let Some(p) = v["parent"].as_str() {
            assert!(names.contains(&p), "{v} links to a dropped version");
            let pid = &v["parent_id"];
            assert!(
                list.iter().any(|x| &x["id"] == pid && x["name"] == p),
                "{v}"
            );
        } else {
            assert_eq!(v["parent_id"], Value::Null, "{v}");
        }
    }
    // The tree view lists all three.
    let rows = tree_rows(&ok(t.run("versions", &[])));
    assert_eq!(rows.len(), 3);
    t.verify_clean();
    // And they survive a reopen (every command reopens) and a checkpoint.
    assert_eq!(ok(t.run("checkpoint", &[])), "");
    assert_eq!(t.scan_at("dev2"), "a\t1\nb\t2\nc\t3\ne\t5\n");
    t.verify_clean();
}

#[test]
fn drop_gives_the_space_back_before_it_exits() {
    let t = abc_store();
    assert_eq!(ok(t.run("checkpoint", &[])), "");
    let live_before = t.stats()["live_bytes"].as_u64().unwrap();
    t.snapshot("main", "s1");
    t.branch("s1", "dev");
    let input: String = (0..64)
        .map(|i| format!("put\tblob/{i:02}\t{}\n", "y".repeat(8192)))
        .collect();
    assert_eq!(ok(t.batch(&["--branch", "dev"], &input)), "committed 64\n");
    assert_eq!(ok(t.run("checkpoint", &[])), "");
    let live_with = t.stats()["live_bytes"].as_u64().unwrap();
    assert!(
        live_with >= live_before + 64 * 8192,
        "{live_before} -> {live_with}"
    );
    t.drop_version("dev");
    t.drop_version("s1");
    let live_after = t.stats()["live_bytes"].as_u64().unwrap();
    assert_eq!(
        live_after, live_before,
        "live bytes after dropping every clone"
    );
    t.verify_clean();
}

#[test]
fn unknown_versions_exit_1() {
    let t = abc_store();
    fails(t.run("snapshot", &["nope", "s1"]), 1, &["nope"]);
    fails(t.run("branch", &["nope", "b1"]), 1, &["nope"]);
    fails(t.run("drop", &["nope"]), 1, &["nope"]);
    fails(t.run("diff", &["nope", "main"]), 1, &["nope"]);
    fails(t.run("diff", &["main", "nope"]), 1, &["nope"]);
    fails(t.run("diff", &["main", "nope", "--json"]), 1, &["nope"]);
    fails(t.run("get", &["a", "--at", "nope"]), 1, &["nope"]);
    fails(t.run("scan", &["--at", "nope"]), 1, &["nope"]);
    fails(t.run("put", &["a", "1", "--branch", "nope"]), 1, &["nope"]);
    fails(t.run("del", &["a", "--branch", "nope"]), 1, &["nope"]);
    fails(t.batch(&["--branch", "nope"], "put\ta\t1\n"), 1, &["nope"]);
    // Nothing was made.
    assert_eq!(t.names(), ["main"]);
}

#[test]
fn taken_names_exit_3() {
    let t = abc_store();
    t.snapshot("main", "s1");
    t.branch("main", "dev");
    for (cmd, source, name) in [
        ("snapshot", "main", "s1"),
        ("snapshot", "main", "dev"),
        ("snapshot", "main", "main"),
        ("branch", "main", "s1"),
        ("branch", "s1", "dev"),
        ("branch", "dev", "main"),
    ] {
        fails(
            t.run(cmd, &[source, name]),
            3,
            &[&format!("{name:?}"), "already exists"],
        );
    }
    // The existing versions are unchanged.
    let list = t.versions_json();
    let kinds: Vec<(&str, &str)> = list
        .iter()
        .map(|v| (v["name"].as_str().unwrap(), v["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(
        kinds,
        [("main", "branch"), ("s1", "snapshot"), ("dev", "branch")]
    );
}

#[test]
fn malformed_names_are_usage_errors() {
    let t = abc_store();
    let long = "x".repeat(256);
    for bad in [
        "a b",
        ".hidden",
        "..",
        "tab\tname",
        "é",
        "a:b",
        long.as_str(),
    ] {
        fails(
            t.run("snapshot", &["main", bad]),
            2,
            &["invalid version name"],
        );
        fails(
            t.run("branch", &["main", bad]),
            2,
            &["invalid version name"],
        );
        fails(
            t.run("snapshot", &[bad, "ok"]),
            2,
            &["invalid version name"],
        );
        fails(t.run("drop", &[bad]), 2, &["invalid version name"]);
        fails(t.run("diff", &["main", bad]), 2, &["invalid version name"]);
        fails(t.run("diff", &[bad, "main"]), 2, &["invalid version name"]);
        fails(
            t.run("get", &["a", "--at", bad]),
            2,
            &["invalid version name"],
        );
        fails(t.run("scan", &["--at", bad]), 2, &["invalid version name"]);
        fails(
            t.run("put", &["a", "1", "--branch", bad]),
            2,
            &["invalid version name"],
        );
        fails(
            t.batch(&["--branch", bad], "put\ta\t1\n"),
            2,
            &["invalid version name"],
        );
    }
    // An empty name, and one that looks like a flag (after `--`).
    fails(
        t.run("snapshot", &["main", ""]),
        2,
        &["invalid version name"],
    );
    fails(
        t.run("branch", &["--", "main", "-x"]),
        2,
        &["invalid version name"],
    );
    // A name of 255 bytes with every allowed character class is fine.
    let ok_name = format!("A-z_0.9/{}", "n".repeat(247));
    assert_eq!(ok_name.len(), 255);
    t.snapshot("main", &ok_name);
    assert_eq!(t.get_at(&ok_name, "a"), "1\n");
    assert_eq!(t.names(), ["main", ok_name.as_str()]);
}

#[test]
fn version_commands_usage_errors() {
    let t = abc_store();
    usage_error(t.run("snapshot", &[]));
    usage_error(t.run("snapshot", &["main"]));
    usage_error(t.run("branch", &["main"]));
    usage_error(t.run("branch", &["main", "a", "b"]));
    usage_error(t.run("drop", &[]));
    usage_error(t.run("diff", &["main"]));
    usage_error(t.run("versions", &["extra"]));
    usage_error(t.run("diff", &["main", "main", "--bogus"]));
    usage_error(run(&["versions"]));
}

#[test]
fn version_commands_on_a_missing_store_exit_3() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nothing");
    let m = s(&missing);
    fails(run(&["snapshot", m, "main", "s"]), 3, &["does not exist"]);
    fails(run(&["branch", m, "main", "b"]), 3, &["does not exist"]);
    fails(run(&["drop", m, "s"]), 3, &["does not exist"]);
    fails(run(&["versions", m]), 3, &["does not exist"]);
    fails(run(&["diff", m, "main", "main"]), 3, &["does not exist"]);
    assert!(!missing.exists());
}

#[test]
fn versions_survive_reopen_and_verify_counts_them() {
    let t = abc_store();
    t.snapshot("main", "s1");
    t.branch("main", "dev");
    t.put_on("dev", "x", "1");
    // Nothing explicitly checkpointed: each command closes the store, and reopening
    // must find every version.
    assert_eq!(t.names(), ["main", "s1", "dev"]);
    let out = ok(t.run("verify", &[]));
    assert!(out.starts_with("checked 3 versions,"), "{out}");
    assert!(out.ends_with("clean\n"), "{out}");
    assert_eq!(t.stats()["versions"], 3);
}

#[test]
fn tour_shows_versions() {
    let out = ok(run(&["tour", "--keys", "2000"]));
    for word in ["snapshot", "branch", "diff", "drop"] {
        assert!(out.contains(word), "tour lacks {word}: {out}");
    }
    assert!(out.contains("verified it: clean"), "{out}");
    let json = ok(run(&["tour", "--keys", "500", "--json"]));
    let v: Value = serde_json::from_str(&json).unwrap();
    assert!(v["versions"].is_object(), "{v}");
    assert_eq!(v["verify"]["problems"], serde_json::json!([]));
}
