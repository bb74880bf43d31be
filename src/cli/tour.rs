//! `cambium tour`: the guided walk through an embedded store that the README points
//! new users at. It uses only the public library API, with default options.

use super::codec::human_bytes;
use super::error::{output_error, CliError, CliResult};
use super::output::{plural, print_json};
use super::Ctx;
use cambium::{Change, Durability, Store, VersionInfo};
use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Keys loaded per transaction in the bulk load.
const TXN_KEYS: u64 = 10_000;
/// Large values, stored out of line.
const BLOBS: u64 = 16;
const BLOB_LEN: usize = 64 * 1024;
/// Single-key durable commits timed in step 3.
const SMALL_COMMITS: u64 = 100;

fn user_key(i: u64) -> Vec<u8> {
    format!("user/{i:08}").into_bytes()
}

fn user_value(i: u64) -> Vec<u8> {
    format!(
        "{{\"id\":{i},\"name\":\"user {i}\",\"score\":{}}}",
        i.wrapping_mul(7919) % 1000
    )
    .into_bytes()
}

fn blob_key(i: u64) -> Vec<u8> {
    format!("blob/{i:04}").into_bytes()
}

fn blob_value(i: u64) -> Vec<u8> {
    (0..BLOB_LEN)
        .map(|j| (j as u64).wrapping_mul(31).wrapping_add(i) as u8)
        .collect()
}

/// Removes the tour's directory when the tour ends, unless asked to keep it.
struct TempDir {
    path: PathBuf,
    keep: bool,
}

impl TempDir {
    fn new(keep: bool) -> CliResult<TempDir> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path =
            std::env::temp_dir().join(format!("cambium-tour-{}-{nanos:09}", std::process::id()));
        std::fs::create_dir(&path)
            .map_err(|e| CliError::failure(format!("creating {}: {e}", path.display())))?;
        Ok(TempDir { path, keep })
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// What the tour did, for `--json`.
#[derive(Serialize)]
struct Summary {
    dir: String,
    kept: bool,
    keys_loaded: u64,
    blobs_loaded: u64,
    load_seconds: f64,
    durable_commits: u64,
    durable_commit_avg_ms: f64,
    keys_read_back: u64,
    read_seconds: f64,
    prefix_scan_keys: u64,
    keys_deleted: u64,
    keys_after_delete: u64,
    snapshot_saw_deleted_key: bool,
    versions: VersionsSummary,
    stats: cambium::Stats,
    verify: cambium::VerifyReport,
}

/// What the versions step did, for `--json`.
#[derive(Serialize)]
struct VersionsSummary {
    snapshot_ms: f64,
    branch_ms: f64,
    diff_ms: f64,
    diff_added: u64,
    diff_removed: u64,
    diff_changed: u64,
    drop_ms: f64,
    listed: Vec<VersionInfo>,
}

/// The snapshot and the branch the tour makes.
const TOUR_SNAPSHOT: &str = "before-cleanup";
const TOUR_BRANCH: &str = "experiment";
/// Counters changed, counters deleted and notes added on main after the snapshot.
const TOUR_CHANGED: u64 = 10;
const TOUR_REMOVED: u64 = 10;
const TOUR_ADDED: u64 = 5;

fn counter_key(c: u64) -> Vec<u8> {
    format!("counter/{c:03}").into_bytes()
}

fn mismatch(what: String) -> CliError {
    CliError::failure(format!("tour: read-back mismatch: {what}"))
}

/// `cambium tour [--keys N] [--keep]`
pub fn tour(ctx: &Ctx, out: &mut impl Write, keys: u64, keep: bool) -> CliResult {
    let tmp = TempDir::new(keep)?;
    let dir = tmp.path.join("store");
    let mut say = |line: String| -> CliResult {
        if !ctx.json {
            writeln!(out, "{line}").map_err(output_error)?;
            out.flush().map_err(output_error)?;
        }
        Ok(())
    };
    let summary = run_tour(&dir, keys, &mut say)?;
    say(if keep {
        format!(
            "The store is kept in {}: try `cambium scan {} --prefix user/0000001 --limit 5`, \
            `cambium versions {}`, `cambium diff {} {TOUR_SNAPSHOT} main` or `cambium stats {}`.",
            dir.display(),
            dir.display(),
            dir.display(),
            dir.display(),
            dir.display()
        )
    } else {
        format!(
            "Removed {} (run `cambium tour --keep` to keep it).",
            tmp.path.display()
        )
    })?;
    if ctx.json {
        print_json(
            out,
            &Summary {
                kept: keep,
                ..summary
            },
        )?;
    }
    Ok(())
}

fn secs(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

fn rate(n: u64, s: f64) -> String {
    if s <= 0.0 {
        return "?".to_string();
    }
    let r = n as f64 / s;
    if r >= 1e6 {
        format!("{:.1}M", r / 1e6)
    } else if r >= 1e3 {
        format!("{:.0}k", r / 1e3)
    } else {
        format!("{r:.0}")
    }
}

fn run_tour(
    dir: &Path,
    keys: u64,
    say: &mut impl FnMut(String) -> CliResult,
) -> CliResult<Summary> {
    say(
        "cambium tour: an embedded, crash-safe, copy-on-write key-value store, step by step.\n"
            .into(),
    )?;

    // 1. Create.
    let store = Store::create(dir)?;
    say(format!(
        "1. Created a store in {} with default options (a directory: superblock, segment files, WAL).",
        dir.display()
    ))?;

    // 2. Bulk load with deferred durability, then a checkpoint.
    let t = Instant::now();
    let mut i = 0;
    let mut txns = 0;
    while i < keys {
        let end = (i + TXN_KEYS).min(keys);
        let mut txn = store.begin_write()?;
        txn.set_durability(Durability::Deferred);
        for k in i..end {
            txn.put(&user_key(k), &user_value(k))?;
        }
        txn.commit()?;
        txns += 1;
        i = end;
    }
    let mut txn = store.begin_write()?;
    txn.set_durability(Durability::Deferred);
    for b in 0..BLOBS {
        txn.put(&blob_key(b), &blob_value(b))?;
    }
    txn.commit()?;
    store.checkpoint()?;
    let load_seconds = secs(t);
    say(format!(
        "2. Bulk-loaded {keys} keys ({} .. {}) in {txns} transaction{}, plus {BLOBS} values of {} \
         (values over {} B live out of line, in extents of their own).\n   \
         The transactions used Durability::Deferred (atomic and visible at once, durable at the next \
         checkpoint); one checkpoint then made everything durable: {load_seconds:.2} s ({} keys/s).",
        String::from_utf8_lossy(&user_key(0)),
        String::from_utf8_lossy(&user_key(keys - 1)),
        if txns == 1 { "" } else { "s" },
        human_bytes(BLOB_LEN as u64),
        cambium::INLINE_VALUE_MAX,
        rate(keys, load_seconds),
    ))?;

    // 3. Durable single-key commits.
    let t = Instant::now();
    for c in 0..SMALL_COMMITS {
        store.put(&counter_key(c), c.to_string().as_bytes())?;
    }
    let commit_secs = secs(t);
    let avg_ms = commit_secs * 1000.0 / SMALL_COMMITS as f64;
    say(format!(
        "3. Made {SMALL_COMMITS} single-key commits with the default Durability::Immediate: each is \
         durable (its WAL record fsynced) when commit returns: {avg_ms:.2} ms per commit on this machine."
    ))?;

    // 4. Read everything back.
    let t = Instant::now();
    let read = store.read()?;
    for k in 0..keys {
        let got = read.get(&user_key(k))?;
        if got.as_deref() != Some(user_value(k).as_slice()) {
            return Err(mismatch(format!(
                "key {}",
                String::from_utf8_lossy(&user_key(k))
            )));
        }
    }
    for b in 0..BLOBS {
        if read.get(&blob_key(b))?.as_deref() != Some(blob_value(b).as_slice()) {
            return Err(mismatch(format!(
                "blob {}",
                String::from_utf8_lossy(&blob_key(b))
            )));
        }
    }
    let read_seconds = secs(t);
    let scanned = read.range(..)?.count() as u64;
    let expected = keys + BLOBS + SMALL_COMMITS;
    if scanned != expected {
        return Err(mismatch(format!(
            "a full scan saw {scanned} keys, expected {expected}"
        )));
    }
    let prefix_key = user_key(keys / 2);
    let prefix = &prefix_key[..prefix_key.len() - 2];
    let mut prefix_scan_keys = 0;
    let mut first_last = (Vec::new(), Vec::new());
    for kv in read.prefix(prefix)? {
        let (k, _) = kv?;
        if prefix_scan_keys == 0 {
            first_last.0 = k.clone();
        }
        first_last.1 = k;
        prefix_scan_keys += 1;
    }
    let last3: Vec<String> = read
        .range(..)?
        .keys()
        .rev()
        .take(3)
        .map(|k| k.map(|k| String::from_utf8_lossy(&k).into_owned()))
        .collect::<Result<_, _>>()?;
    say(format!(
        "4. Read every value back with point lookups and compared it: all {} match ({read_seconds:.2} s, {} lookups/s).\n   \
         A full scan returns {scanned} keys in order; the prefix {:?} holds {prefix_scan_keys} keys ({:?} .. {:?});\n   \
         scanning backwards, the last three keys are {}.",
        keys + BLOBS,
        rate(keys + BLOBS, read_seconds),
        String::from_utf8_lossy(prefix),
        String::from_utf8_lossy(&first_last.0),
        String::from_utf8_lossy(&first_last.1),
        last3.join(", "),
    ))?;

    // 5. Delete a range while an older snapshot stays readable.
    let snapshot = store.read()?;
    let del_from = keys / 2;
    let del_to = (del_from + 1000).min(keys);
    let mut txn = store.begin_write()?;
    for k in del_from..del_to {
        txn.delete(&user_key(k))?;
    }
    txn.commit()?;
    let keys_deleted = del_to - del_from;
    let now = store.read()?;
    let keys_after_delete = now.range(..)?.keys().count() as u64;
    let snapshot_saw_deleted_key = snapshot.get(&user_key(del_from))?.is_some();
    if now.get(&user_key(del_from))?.is_some() || !snapshot_saw_deleted_key {
        return Err(mismatch("snapshot isolation across a delete".into()));
    }
    drop((snapshot, now, read));
    say(format!(
        "5. Deleted {keys_deleted} keys in one transaction; main now holds {keys_after_delete} keys, \
         while a read transaction opened before the delete still sees them (copy-on-write snapshots)."
    ))?;

    // 6. Checkpoint, stats.
    store.checkpoint()?;
    let stats = store.stats()?;
    say(format!(
        "6. Checkpointed (dirty tree nodes written bottom-up into segments, then the superblock flipped). Stats:\n   \
         {} keys, tree depth {}, {} leaf + {} branch nodes, {} extents ({});\n   \
         {} segment file{}, {} ({} live, {} dead); WAL {}; cache hit rate {:.1}%.",
        stats.keys,
        stats.depth,
        stats.leaf_nodes,
        stats.branch_nodes,
        stats.extents,
        human_bytes(stats.extent_bytes),
        stats.segments,
        if stats.segments == 1 { "" } else { "s" },
        human_bytes(stats.segment_bytes),
        human_bytes(stats.live_bytes),
        human_bytes(stats.dead_bytes),
        human_bytes(stats.wal_bytes),
        stats.cache_hit_rate * 100.0,
    ))?;

    // 7. Versions.
    let versions = tour_versions(&store, keys_after_delete, say)?;
    let keys_final = store.read()?.range(..)?.keys().count() as u64;

    // 8. Close, reopen, verify.
    store.close()?;
    let store = Store::open(dir)?;
    let reopened_keys = store.read()?.range(..)?.keys().count() as u64;
    if reopened_keys != keys_final {
        return Err(mismatch(format!(
            "after reopening, {reopened_keys} keys instead of {keys_final}"
        )));
    }
    let t = Instant::now();
    let verify = store.verify()?;
    let verify_secs = secs(t);
    store.close()?;
    if !verify.is_clean() {
        return Err(CliError::new(
            super::error::EXIT_VERIFY_PROBLEMS,
            format!(
                "tour: verify found problems: {}",
                verify.problems.join("; ")
            ),
        ));
    }
    say(format!(
        "8. Closed the store, reopened it ({reopened_keys} keys, as before) and verified it: clean \
         ({}, {} nodes, {} extents, {} checked in {verify_secs:.2} s).\n",
        plural(verify.versions, "version", "versions"),
        verify.nodes,
        verify.extents,
        human_bytes(verify.bytes),
    ))?;

    Ok(Summary {
        dir: dir.display().to_string(),
        kept: false,
        keys_loaded: keys,
        blobs_loaded: BLOBS,
        load_seconds,
        durable_commits: SMALL_COMMITS,
        durable_commit_avg_ms: avg_ms,
        keys_read_back: keys + BLOBS,
        read_seconds,
        prefix_scan_keys,
        keys_deleted,
        keys_after_delete,
        snapshot_saw_deleted_key,
        versions,
        stats,
        verify,
    })
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

/// Step 7: a snapshot, writes to main, a diff, a branch of the snapshot, the version
/// list, and a drop.
fn tour_versions(
    store: &Store,
    keys_main: u64,
    say: &mut impl FnMut(String) -> CliResult,
) -> CliResult<VersionsSummary> {
    let main = cambium::MAIN_BRANCH;

    // A snapshot, then changes to main.
    let t = Instant::now();
    store.snapshot(main, TOUR_SNAPSHOT)?;
    let snapshot_ms = ms(t);
    let mut txn = store.begin_write()?;
    for c in 0..TOUR_CHANGED {
        txn.put(&counter_key(c), format!("{}", c + 1000).as_bytes())?;
    }
    for c in SMALL_COMMITS - TOUR_REMOVED..SMALL_COMMITS {
        txn.delete(&counter_key(c))?;
    }
    for n in 0..TOUR_ADDED {
        txn.put(
            format!("note/{n}").as_bytes(),
            b"written after the snapshot",
        )?;
    }
    txn.commit()?;
    if store
        .read_at(TOUR_SNAPSHOT)?
        .get(&counter_key(0))?
        .as_deref()
        != Some(b"0".as_slice())
    {
        return Err(mismatch("the snapshot changed with main".into()));
    }
    say(format!(
        "7. Versions. Took a read-only snapshot {TOUR_SNAPSHOT:?} of main in {snapshot_ms:.2} ms \
         (`cambium snapshot DIR main {TOUR_SNAPSHOT}`):\n   \
         it copies main's root, not its {} keys, so its cost does not grow with the store.\n   \
         Then changed {TOUR_CHANGED} keys on main, deleted {TOUR_REMOVED} and added {TOUR_ADDED}; \
         the snapshot still reads the old values.",
        keys_main,
    ))?;

    // Diff.
    let t = Instant::now();
    let (mut added, mut removed, mut changed) = (0u64, 0u64, 0u64);
    let mut first = None;
    for change in store.diff(TOUR_SNAPSHOT, main)? {
        let change = change?;
        match &change {
            Change::Added { .. } => added += 1,
            Change::Removed { .. } => removed += 1,
            Change::Changed { .. } => changed += 1,
        }
        if first.is_none() {
            first = Some(change);
        }
    }
    let diff_ms = ms(t);
    if (added, removed, changed) != (TOUR_ADDED, TOUR_REMOVED, TOUR_CHANGED) {
        return Err(mismatch(format!(
            "diff found {added} added, {removed} removed, {changed} changed"
        )));
    }
    let example = match &first {
        Some(Change::Changed { key, new, .. }) => format!(
            "`~ {} {}`",
            String::from_utf8_lossy(key),
            String::from_utf8_lossy(new)
        ),
        Some(Change::Added { key, value }) => format!(
            "`+ {} {}`",
            String::from_utf8_lossy(key),
            String::from_utf8_lossy(value)
        ),
        Some(Change::Removed { key, .. }) => format!("`- {}`", String::from_utf8_lossy(key)),
        None => String::new(),
    };
    say(format!(
        "   `cambium diff DIR {TOUR_SNAPSHOT} main` lists {changed} changed (~), {removed} removed (-) \
         and {added} added (+) keys, the first being {example},\n   \
         in {diff_ms:.2} ms: it descends only where the two trees' nodes differ."
    ))?;

    // A writable branch of the snapshot.
    let t = Instant::now();
    store.branch(TOUR_SNAPSHOT, TOUR_BRANCH)?;
    let branch_ms = ms(t);
    let mut txn = store.begin_write_on(TOUR_BRANCH)?;
    txn.put(b"experiment/result", b"42")?;
    txn.commit()?;
    let on_branch = store.read_at(TOUR_BRANCH)?;
    if on_branch.get(b"experiment/result")?.is_none()
        || on_branch.get(&counter_key(0))?.as_deref() != Some(b"0".as_slice())
        || store.read()?.get(b"experiment/result")?.is_some()
    {
        return Err(mismatch("a write to a branch leaked or was lost".into()));
    }
    drop(on_branch);
    let listed = store.versions()?;
    let tree: String = super::versions::render_tree(&listed)
        .lines()
        .map(|l| format!("\n     {l}"))
        .collect();
    say(format!(
        "   Made a writable branch {TOUR_BRANCH:?} of the snapshot in {branch_ms:.2} ms \
         (`cambium branch DIR {TOUR_SNAPSHOT} {TOUR_BRANCH}`)\n   \
         and wrote a key to it (`cambium put DIR KEY VALUE --branch {TOUR_BRANCH}`): main does not see it.\n   \
         `cambium versions DIR` shows each version under the one it was made from \
         (EXCLUSIVE: what dropping it would free):{tree}"
    ))?;

    // Drop the branch.
    let t = Instant::now();
    store.drop_version(TOUR_BRANCH)?;
    store.finish_drops()?;
    let drop_ms = ms(t);
    if store.read_at(TOUR_BRANCH).is_ok() {
        return Err(mismatch("a dropped branch is still readable".into()));
    }
    say(format!(
        "   Dropped {TOUR_BRANCH:?} (`cambium drop DIR {TOUR_BRANCH}`) in {drop_ms:.2} ms: the nodes only \
         it used are freed;\n   those it shared with {TOUR_SNAPSHOT:?} stay. The snapshot is kept."
    ))?;

    // Space back: the overwrites and the drop left dead bytes in the segments.
    let t = Instant::now();
    let shrunk = store.shrink()?;
    say(format!(
        "   `cambium shrink DIR` moved {} of live blocks out of the segments holding dead \
         ones (rewriting\n   every parent, in every version, found through the back \
         references) and deleted them in {:.2} ms:\n   the store's files went from {} to {}. \
         `clean` does the same for the worst segments only,\n   and runs on its own once \
         half the segment bytes are dead.\n",
        human_bytes(shrunk.bytes_moved),
        ms(t),
        human_bytes(shrunk.footprint_before),
        human_bytes(shrunk.footprint_after),
    ))?;

    Ok(VersionsSummary {
        snapshot_ms,
        branch_ms,
        diff_ms,
        diff_added: added,
        diff_removed: removed,
        diff_changed: changed,
        drop_ms,
        listed,
    })
}
