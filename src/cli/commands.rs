//! The subcommands other than `tour`.

use super::args::ScanArgs;
use super::codec::{human_bytes, Encoding};
use super::error::{exit_code_for, output_error, CliError, EXIT_VERIFY_PROBLEMS};
use super::Ctx;
use cambium::{check_key, prefix_successor, Durability, Options, Store, WriteTxn};
use serde::Serialize;
use std::io::{BufRead, IsTerminal, Write};
use std::ops::Bound;
use std::path::Path;
use std::time::Duration;

type CliResult<T = ()> = Result<T, CliError>;

/// Opens a store for reading only (a shared lock; no background work).
pub fn open_read_only(dir: &Path) -> Result<Store, cambium::Error> {
    Store::open_with(
        dir,
        Options {
            read_only: true,
            background_checkpoints: false,
            ..Default::default()
        },
    )
}

/// Opens a store for writing, without a background checkpoint thread (the command
/// checkpoints when it closes the store).
pub fn open_writable(dir: &Path) -> Result<Store, cambium::Error> {
    Store::open_with(
        dir,
        Options {
            background_checkpoints: false,
            ..Default::default()
        },
    )
}

/// Where a writing command writes.
#[derive(Clone, Copy)]
struct Target<'a> {
    /// The store directory (for messages).
    dir: &'a Path,
    /// The branch.
    branch: &'a str,
}

/// Starts a write transaction on the target branch. A write to a snapshot fails
/// (exit 3) with a hint on how to get a writable copy.
fn begin<'s>(store: &'s Store, target: Target<'_>) -> CliResult<WriteTxn<'s>> {
    let Target { dir, branch } = target;
    let txn = if branch == cambium::MAIN_BRANCH {
        store.begin_write()
    } else {
        store.begin_write_on(branch)
    };
    txn.map_err(|e| match e {
        cambium::Error::ReadOnly(_) => CliError::new(
            exit_code_for(&e),
            format!(
                "{e} (to write, make a branch of it: cambium branch {} {branch} NEW-NAME)",
                dir.display()
            ),
        ),
        e => e.into(),
    })
}

/// Checks a version name given on the command line: a malformed one is a usage error
/// (exit 2), whether it names a new version or an existing one.
pub fn check_name(name: &str) -> CliResult {
    cambium::check_version_name(name).map_err(CliError::from)
}

/// A consistent view of `at` (a branch or a snapshot), or of `main`.
fn read_view(store: &Store, at: Option<&str>) -> CliResult<cambium::ReadTxn> {
    Ok(match at {
        Some(v) => store.read_at(v)?,
        None => store.read()?,
    })
}

/// A key/value pair printed as JSON.
#[derive(Serialize)]
struct JsonPair {
    key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<String>,
}

/// Prints one pair (or just a key) as a line in the chosen format.
fn print_pair(ctx: &Ctx, out: &mut impl Write, key: &[u8], value: Option<&[u8]>) -> CliResult {
    if ctx.json {
        let pair = JsonPair {
            key: ctx.enc.json_string(key),
            value: value.map(|v| ctx.enc.json_string(v)),
        };
        let line = serde_json::to_string(&pair).map_err(|e| CliError::failure(e.to_string()))?;
        writeln!(out, "{line}").map_err(output_error)
    } else {
        out.write_all(&ctx.enc.encode(key)).map_err(output_error)?;
        if let Some(v) = value {
            out.write_all(b"\t").map_err(output_error)?;
            out.write_all(&ctx.enc.encode(v)).map_err(output_error)?;
        }
        out.write_all(b"\n").map_err(output_error)
    }
}

/// Prints a serialisable value as one line of JSON.
pub fn print_json(out: &mut impl Write, v: &impl Serialize) -> CliResult {
    let line = serde_json::to_string(v).map_err(|e| CliError::failure(e.to_string()))?;
    writeln!(out, "{line}").map_err(output_error)
}

/// `cambium init DIR`
pub fn init(dir: &Path) -> CliResult {
    let store = Store::create_with(
        dir,
        Options {
            background_checkpoints: false,
            ..Default::default()
        },
    )?;
    store.close()?;
    Ok(())
}

/// `cambium put DIR KEY VALUE [--branch B]`
pub fn put(ctx: &Ctx, dir: &Path, key: &str, value: &str, branch: &str) -> CliResult {
    let key = ctx.enc.decode_arg("key", key)?;
    let value = ctx.enc.decode_arg("value", value)?;
    check_key(&key)?;
    check_name(branch)?;
    let store = open_writable(dir)?;
    let mut txn = begin(&store, Target { dir, branch })?;
    txn.put(&key, &value)?;
    txn.commit()?;
    store.close()?;
    Ok(())
}

/// `cambium get DIR KEY [--at VERSION]`
pub fn get(ctx: &Ctx, out: &mut impl Write, dir: &Path, key: &str, at: Option<&str>) -> CliResult {
    let key = ctx.enc.decode_arg("key", key)?;
    check_key(&key)?;
    if let Some(v) = at {
        check_name(v)?;
    }
    let store = open_read_only(dir)?;
    let read = read_view(&store, at)?;
    match read.get(&key)? {
        Some(value) => print_pair_or_value(ctx, out, &key, &value),
        None => Err(CliError::not_found(format!(
            "key not found: {}",
            ctx.enc.show(&key)
        ))),
    }
}

fn print_pair_or_value(ctx: &Ctx, out: &mut impl Write, key: &[u8], value: &[u8]) -> CliResult {
    if ctx.json {
        print_pair(ctx, out, key, Some(value))
    } else {
        out.write_all(&ctx.enc.encode(value))
            .map_err(output_error)?;
        out.write_all(b"\n").map_err(output_error)
    }
}

/// `cambium del DIR KEY [--branch B]`
pub fn del(ctx: &Ctx, dir: &Path, key: &str, branch: &str) -> CliResult {
    let key = ctx.enc.decode_arg("key", key)?;
    check_key(&key)?;
    check_name(branch)?;
    let store = open_writable(dir)?;
    let mut txn = begin(&store, Target { dir, branch })?;
    let existed = txn.delete(&key)?;
    txn.commit()?;
    store.close()?;
    if existed {
        Ok(())
    } else {
        Err(CliError::not_found(format!(
            "key not found: {}",
            ctx.enc.show(&key)
        )))
    }
}

/// `cambium scan DIR ...`
pub fn scan(ctx: &Ctx, out: &mut impl Write, a: &ScanArgs) -> CliResult {
    let decode = |what: &str, s: &Option<String>| -> CliResult<Option<Vec<u8>>> {
        s.as_deref()
            .map(|s| ctx.enc.decode_arg(what, s))
            .transpose()
    };
    let prefix = decode("prefix", &a.prefix)?;
    let from = decode("--from key", &a.from)?;
    let to = decode("--to key", &a.to)?;

    let (lower, mut upper) = match (prefix, from) {
        (Some(p), _) => {
            let upper = prefix_successor(&p).map_or(Bound::Unbounded, Bound::Excluded);
            (Bound::Included(p), upper)
        }
        (None, Some(f)) => (Bound::Included(f), Bound::Unbounded),
        (None, None) => (Bound::Unbounded, Bound::Unbounded),
    };
    if let Some(t) = to {
        upper = match upper {
            Bound::Excluded(u) if u <= t => Bound::Excluded(u),
            _ => Bound::Excluded(t),
        };
    }

    if let Some(v) = &a.at {
        check_name(v)?;
    }
    let store = open_read_only(&a.dir)?;
    let read = read_view(&store, a.at.as_deref())?;
    if let (Bound::Included(l), Bound::Excluded(u)) = (&lower, &upper) {
        if l >= u {
            return Ok(()); // an empty range
        }
    }
    let limit = usize::try_from(a.limit.unwrap_or(u64::MAX)).unwrap_or(usize::MAX);
    let range = (
        lower.as_ref().map(Vec::as_slice),
        upper.as_ref().map(Vec::as_slice),
    );
    let iter = read.range(range)?;
    if a.keys_only {
        let keys = iter.keys();
        let keys: Box<dyn Iterator<Item = cambium::Result<Vec<u8>>>> = if a.reverse {
            Box::new(keys.rev())
        } else {
            Box::new(keys)
        };
        for key in keys.take(limit) {
            print_pair(ctx, out, &key?, None)?;
        }
    } else {
        type Pairs = Box<dyn Iterator<Item = cambium::Result<(Vec<u8>, Vec<u8>)>>>;
        let pairs: Pairs = if a.reverse {
            Box::new(iter.rev())
        } else {
            Box::new(iter)
        };
        for pair in pairs.take(limit) {
            let (k, v) = pair?;
            print_pair(ctx, out, &k, Some(&v))?;
        }
    }
    Ok(())
}

/// One parsed batch line.
enum Op {
    Put(Vec<u8>, Vec<u8>),
    Del(Vec<u8>),
}

/// Parses one non-blank batch line (without its line ending).
fn parse_batch_line(enc: Encoding, line: &[u8]) -> Result<Op, String> {
    let text = std::str::from_utf8(line).map_err(|e| format!("not valid UTF-8 ({e})"))?;
    let fields: Vec<&str> = text.split('\t').collect();
    let key_of = |f: &str| -> Result<Vec<u8>, String> {
        let key = enc
            .decode(f.as_bytes())
            .map_err(|e| format!("bad key: {e}"))?;
        if key.is_empty() {
            return Err("empty key".to_string());
        }
        check_key(&key).map_err(|e| e.to_string())?;
        Ok(key)
    };
    match fields[0] {
        "put" => {
            if fields.len() != 3 {
                return Err(format!(
                    "`put` takes 3 tab-separated fields (put, key, value), found {}",
                    fields.len()
                ));
            }
            let key = key_of(fields[1])?;
            let value = enc
                .decode(fields[2].as_bytes())
                .map_err(|e| format!("bad value: {e}"))?;
            Ok(Op::Put(key, value))
        }
        "del" => {
            if fields.len() != 2 {
                return Err(format!(
                    "`del` takes 2 tab-separated fields (del, key), found {}",
                    fields.len()
                ));
            }
            Ok(Op::Del(key_of(fields[1])?))
        }
        other => Err(format!(
            "unknown operation {other:?} (expected `put` or `del`)"
        )),
    }
}

/// A spinner on stderr, only when stderr is a terminal.
pub fn spinner(msg: &str) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new_spinner();
    if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} {msg} {pos} [{elapsed}]")
    {
        pb.set_style(style);
    }
    pb.set_message(msg.to_string());
    pb.enable_steady_tick(Duration::from_millis(120));
    pb
}

/// Prints `committed N` (or `{"committed":N}`) and flushes, so a reader sees each
/// acknowledgement as soon as the commit has returned.
fn print_committed(ctx: &Ctx, out: &mut impl Write, ops: u64) -> CliResult {
    if ctx.json {
        writeln!(out, "{{\"committed\":{ops}}}").map_err(output_error)?;
    } else {
        writeln!(out, "committed {ops}").map_err(output_error)?;
    }
    out.flush().map_err(output_error)
}

/// `cambium batch DIR [--branch B] [--commit-every N]`
pub fn batch(
    ctx: &Ctx,
    out: &mut impl Write,
    input: impl BufRead,
    dir: &Path,
    branch: &str,
    commit_every: Option<u64>,
) -> CliResult {
    check_name(branch)?;
    let store = open_writable(dir)?;
    let pb = spinner("batch: operations applied");
    let result = run_batch(
        ctx,
        out,
        input,
        &store,
        Target { dir, branch },
        commit_every,
        &pb,
    );
    pb.finish_and_clear();
    if let Err(e) = result {
        // The failed transaction was aborted when it was dropped; closing checkpoints
        // only what was committed. The batch's error is the one to report.
        let _ = store.close();
        return Err(e);
    }
    store.close()?;
    Ok(())
}

fn run_batch(
    ctx: &Ctx,
    out: &mut impl Write,
    mut input: impl BufRead,
    store: &Store,
    target: Target<'_>,
    commit_every: Option<u64>,
    pb: &indicatif::ProgressBar,
) -> CliResult {
    let mut txn = begin(store, target)?;
    txn.set_durability(Durability::Immediate);
    let mut total: u64 = 0;
    let mut pending: u64 = 0;
    let mut printed = false;
    let mut line_no: u64 = 0;
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let n = input
            .read_until(b'\n', &mut buf)
            .map_err(|e| CliError::failure(format!("reading stdin: {e}")))?;
        if n == 0 {
            break;
        }
        line_no += 1;
        let mut line = buf.as_slice();
        if let Some(l) = line.strip_suffix(b"\n") {
            line = l;
        }
        if let Some(l) = line.strip_suffix(b"\r") {
            line = l;
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let op = parse_batch_line(ctx.enc, line)
            .map_err(|e| CliError::failure(format!("line {line_no}: {e}")))?;
        let applied = match op {
            Op::Put(k, v) => txn.put(&k, &v),
            Op::Del(k) => txn.delete(&k).map(|_| ()),
        };
        applied.map_err(|e| CliError::new(exit_code_for(&e), format!("line {line_no}: {e}")))?;
        total += 1;
        pending += 1;
        pb.inc(1);
        if commit_every.is_some_and(|n| pending >= n) {
            txn.commit()?;
            pending = 0;
            print_committed(ctx, out, total)?;
            printed = true;
            txn = begin(store, target)?;
            txn.set_durability(Durability::Immediate);
        }
    }
    if pending > 0 || !printed {
        txn.commit()?;
        print_committed(ctx, out, total)?;
    }
    Ok(())
}

/// `cambium checkpoint DIR`
pub fn checkpoint(dir: &Path) -> CliResult {
    let store = open_writable(dir)?;
    store.checkpoint()?;
    store.close()?;
    Ok(())
}

/// "1 file", "2 files".
fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// `cambium stats DIR`
pub fn stats(ctx: &Ctx, out: &mut impl Write, dir: &Path) -> CliResult {
    let store = open_read_only(dir)?;
    let s = store.stats()?;
    if ctx.json {
        return print_json(out, &s);
    }
    let text = format!(
        "store              {dir}\n\
         format version     {fv}\n\
         generation         {gen} (checkpoints made durable)\n\
         lsn                last commit {last}, last checkpointed {ckpt}\n\
         versions           {versions}\n\
         keys (main)        {keys}\n\
         tree (main)        depth {depth}, {leaves}, {branches}, {dirty} not yet checkpointed\n\
         extents (main)     {extents}, {extent_bytes}\n\
         segments           {segments}, {segment_bytes} (live {live}, dead {dead})\n\
         wal                {wal_files}, {wal_bytes} not yet checkpointed\n\
         cache              {cache_bytes} of {cache_cap}, hit rate {rate:.1}% ({hits}, {misses})\n",
        dir = dir.display(),
        fv = s.format_version,
        gen = s.generation,
        last = s.last_lsn,
        ckpt = s.checkpoint_lsn,
        versions = s.versions,
        keys = s.keys,
        depth = s.depth,
        leaves = plural(s.leaf_nodes, "leaf node", "leaf nodes"),
        branches = plural(s.branch_nodes, "branch node", "branch nodes"),
        dirty = plural(s.dirty_nodes, "node", "nodes"),
        extents = plural(s.extents, "extent", "extents"),
        extent_bytes = human_bytes(s.extent_bytes),
        segments = plural(s.segments, "file", "files"),
        segment_bytes = human_bytes(s.segment_bytes),
        live = human_bytes(s.live_bytes),
        dead = human_bytes(s.dead_bytes),
        wal_files = plural(s.wal_files, "file", "files"),
        wal_bytes = human_bytes(s.wal_bytes),
        cache_bytes = human_bytes(s.cache_bytes),
        cache_cap = human_bytes(s.cache_capacity_bytes),
        rate = s.cache_hit_rate * 100.0,
        hits = plural(s.cache_hits, "hit", "hits"),
        misses = plural(s.cache_misses, "miss", "misses"),
    );
    out.write_all(text.as_bytes()).map_err(output_error)
}

/// Runs `verify`, with a progress bar (bytes checked) on stderr when it is a terminal.
fn verify_store(store: &Store) -> Result<cambium::VerifyReport, cambium::Error> {
    if !std::io::stderr().is_terminal() {
        return store.verify();
    }
    // The bytes to check: roughly the live tree and extents plus the WAL.
    let total = store
        .stats()
        .map(|s| s.live_bytes + s.wal_bytes)
        .unwrap_or(0);
    let pb = indicatif::ProgressBar::new(total.max(1));
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "verifying {bar:30} {bytes}/{total_bytes} [{elapsed}]",
    ) {
        pb.set_style(style);
    }
    let report = store.verify_with_progress(&mut |bytes| {
        if bytes > pb.length().unwrap_or(0) {
            pb.set_length(bytes);
        }
        pb.set_position(bytes);
    });
    pb.finish_and_clear();
    report
}

/// `verify --json` output: the report plus a `clean` flag.
#[derive(Serialize)]
struct JsonVerify<'a> {
    clean: bool,
    #[serde(flatten)]
    report: &'a cambium::VerifyReport,
}

/// `cambium verify DIR`
pub fn verify(ctx: &Ctx, out: &mut impl Write, dir: &Path) -> CliResult {
    let report = open_read_only(dir).and_then(|store| verify_store(&store));
    let report = match report {
        Ok(r) => r,
        // A store too damaged to open is a verify finding, not a tool failure.
        Err(e) if e.is_corruption() => cambium::VerifyReport {
            problems: vec![e.to_string()],
            ..Default::default()
        },
        Err(e) => return Err(e.into()),
    };
    if ctx.json {
        print_json(
            out,
            &JsonVerify {
                clean: report.is_clean(),
                report: &report,
            },
        )?;
    } else {
        let mut text = format!(
            "checked {}, {}, {}, {}, {} read; {} past the checkpoint{}\n",
            plural(report.versions, "version", "versions"),
            plural(report.nodes, "node", "nodes"),
            plural(report.extents, "extent", "extents"),
            plural(report.keys, "key", "keys"),
            human_bytes(report.bytes),
            plural(report.wal_records, "WAL record", "WAL records"),
            if report.wal_torn_tail {
                " (a torn record at the WAL's end was ignored)"
            } else {
                ""
            }
        );
        if report.is_clean() {
            text.push_str("clean\n");
        } else {
            for p in &report.problems {
                text.push_str(&format!("problem: {p}\n"));
            }
        }
        out.write_all(text.as_bytes()).map_err(output_error)?;
    }
    if report.is_clean() {
        Ok(())
    } else {
        out.flush().map_err(output_error)?;
        let n = report.problems.len();
        Err(CliError::new(
            EXIT_VERIFY_PROBLEMS,
            format!(
                "verify found {n} problem{} in {}",
                if n == 1 { "" } else { "s" },
                dir.display()
            ),
        ))
    }
}
