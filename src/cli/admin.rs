//! The commands that look after a whole store: `init`, `stats` and `verify`
//! (`checkpoint` is a request: `requests.rs`).

use super::codec::human_bytes;
use super::error::{output_error, CliError, CliResult, EXIT_VERIFY_PROBLEMS};
use super::open::{create, open_read_only};
use super::output::{plural, print_json};
use super::Ctx;
use cambium::{Stats, Store, VerifyReport};
use serde::Serialize;
use std::io::{IsTerminal, Write};
use std::path::Path;

/// `cambium init DIR`
pub fn init(dir: &Path) -> CliResult {
    let store = create(dir)?;
    store.close()?;
    Ok(())
}

/// `cambium stats DIR`
pub fn stats(ctx: &Ctx, out: &mut impl Write, dir: &Path) -> CliResult {
    let store = open_read_only(dir)?;
    let s = store.stats()?;
    if ctx.json {
        return print_json(out, &s);
    }
    out.write_all(stats_text(dir, &s).as_bytes())
        .map_err(output_error)
}

/// The `stats` lines about `main`, if the store has it.
fn main_text(s: &Stats) -> String {
    if !s.main_exists {
        return String::new();
    }
    format!(
        "keys (main)        {keys}\n\
         tree (main)        depth {depth}, {leaves}, {branches}, {dirty} not yet checkpointed\n\
         extents (main)     {extents}, {extent_bytes}\n",
        keys = s.keys,
        depth = s.depth,
        leaves = plural(s.leaf_nodes, "leaf node", "leaf nodes"),
        branches = plural(s.branch_nodes, "branch node", "branch nodes"),
        dirty = plural(s.dirty_nodes, "node", "nodes"),
        extents = plural(s.extents, "extent", "extents"),
        extent_bytes = human_bytes(s.extent_bytes),
    )
}

/// The `stats` table for people.
fn stats_text(dir: &Path, s: &Stats) -> String {
    format!(
        "store              {dir}\n\
         format version     {fv}\n\
         generation         {gen} (checkpoints made durable)\n\
         lsn                last commit {last}, last checkpointed {ckpt}\n\
         versions           {versions}\n\
         {main}\
         segments           {segments}, {segment_bytes} (live {live}, dead {dead})\n\
         wal                {wal_files}, {wal_bytes} not yet checkpointed, {wal_spare} spare\n\
         footprint          {footprint} on disk (segments, WAL, reserve, {spare} of spare segments)\n\
         back references    {backref_records}, {backref_runs}, {backref_bytes} (in the segments' dead bytes)\n\
         cache              {cache_bytes} of {cache_cap}, hit rate {rate:.1}% ({hits}, {misses})\n",
        dir = dir.display(),
        fv = s.format_version,
        gen = s.generation,
        last = s.last_lsn,
        ckpt = s.checkpoint_lsn,
        versions = s.versions,
        main = main_text(s),
        segments = plural(s.segments, "file", "files"),
        segment_bytes = human_bytes(s.segment_bytes),
        live = human_bytes(s.live_bytes),
        dead = human_bytes(s.dead_bytes),
        wal_files = plural(s.wal_files, "file", "files"),
        wal_bytes = human_bytes(s.wal_bytes),
        wal_spare = human_bytes(s.wal_spare_bytes),
        footprint = human_bytes(s.footprint_bytes),
        spare = human_bytes(s.spare_bytes),
        backref_records = plural(s.backref_records, "record", "records"),
        backref_runs = plural(s.backref_runs, "run", "runs"),
        backref_bytes = human_bytes(s.backref_bytes),
        cache_bytes = human_bytes(s.cache_bytes),
        cache_cap = human_bytes(s.cache_capacity_bytes),
        rate = s.cache_hit_rate * 100.0,
        hits = plural(s.cache_hits, "hit", "hits"),
        misses = plural(s.cache_misses, "miss", "misses"),
    )
}

/// `verify --json` output: the report plus a `clean` flag.
#[derive(Serialize)]
struct JsonVerify<'a> {
    clean: bool,
    #[serde(flatten)]
    report: &'a VerifyReport,
}

/// `cambium verify DIR`: prints the report; problems exit 4.
pub fn verify(ctx: &Ctx, out: &mut impl Write, dir: &Path) -> CliResult {
    let report = verify_dir(dir)?;
    if ctx.json {
        let clean = report.is_clean();
        print_json(
            out,
            &JsonVerify {
                clean,
                report: &report,
            },
        )?;
    } else {
        out.write_all(verify_text(&report).as_bytes())
            .map_err(output_error)?;
    }
    if report.is_clean() {
        return Ok(());
    }
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

/// Verifies the store in `dir`. A store too damaged to open is a verify finding, not
/// a tool failure.
fn verify_dir(dir: &Path) -> CliResult<VerifyReport> {
    let checked = open_read_only(dir).and_then(|store| {
        let mut report = verify_store(&store)?;
        report.problems.extend(check_volumes(&store)?);
        Ok(report)
    });
    match checked {
        Ok(r) => Ok(r),
        Err(e) if e.is_corruption() => Ok(VerifyReport {
            problems: vec![e.to_string()],
            ..Default::default()
        }),
        Err(e) => Err(e.into()),
    }
}

/// Checks every volume's keys against its header (the store's verify has checked
/// their bytes); a volume whose header cannot be read is a problem, not a failure.
fn check_volumes(store: &Store) -> Result<Vec<String>, cambium::Error> {
    let mut problems = Vec::new();
    for (name, _) in cambium::volume::Volume::names(store)? {
        match cambium::volume::Volume::open(store, &name).and_then(|v| v.check()) {
            Ok(found) => problems.extend(found),
            Err(e) if e.is_corruption() => problems.push(format!("volume {name:?}: {e}")),
            Err(e) => return Err(e),
        }
    }
    Ok(problems)
}

/// Runs `verify`, with a progress bar (bytes checked) on stderr when it is a terminal.
fn verify_store(store: &Store) -> Result<VerifyReport, cambium::Error> {
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

/// The `verify` report for people: what was checked, then `clean` or one line a
/// problem.
fn verify_text(report: &VerifyReport) -> String {
    let mut text = format!(
        "checked {}, {}, {}, {}, {} read; {} past the checkpoint{}\n",
        plural(report.versions, "version", "versions"),
        plural(report.nodes, "node", "nodes"),
        plural(report.extents, "extent", "extents"),
        plural(report.keys, "key", "keys"),
        human_bytes(report.bytes),
        plural(report.wal_records, "WAL record", "WAL records"),
        if report.wal_torn_tail {
            // A crash's torn write, or the records of a recycled log file's
            // earlier use: neither was ever acknowledged from this file.
            " (bytes after the WAL's last record were ignored: a torn write or a reused file's old records)"
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
    text
}
