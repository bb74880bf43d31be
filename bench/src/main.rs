//! cambium-bench: cambium vs redb vs LMDB (heed) on the workloads of redb's own
//! comparative benchmark (`benches/lmdb_benchmark.rs`), interleaved, medians of N runs.
//!
//! ```text
//! cargo run --release -p cambium-bench -- --runs 3
//! cargo run --release -p cambium-bench -- --quick
//! ```
//!
//! Run with `--help` for every flag.

mod engines;
mod workload;

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use workload::{pairs, Engine, Res, Rng, Tuning, SEED_BATCH, SEED_INDIVIDUAL, SEED_MAIN};

const USAGE: &str = "\
cambium-bench: cambium vs redb vs LMDB (heed), redb's comparative workloads

USAGE: cargo run --release -p cambium-bench -- [FLAGS]

  --runs N              repetitions, engines interleaved within each (default 3)
  --n N                 keys in the bulk load (default 1000000)
  --engines LIST        comma list of cambium,redb,lmdb (default all three)
  --individual-writes N single-insert durable txns (default 1000)
  --batch-txns N        durable txns in the batch-writes workload (default 100)
  --batch-size N        inserts per batch txn (default 1000)
  --range-scans N       range scans (default n/2)
  --range-len N         entries read per range scan (default 10)
  --removals N          keys removed in one txn (default n/2)
  --cambium-cache-mib N cambium's node cache size (default 4096, the budget redb and LMDB get)
  --dir DIR             parent of the per-run temp directories (default $TMPDIR or /tmp)
  --json FILE           also write machine-readable results to FILE
  --keep                keep the database directories (default: deleted after each run)
  --quick               smoke test: n=100000, 1 run, 100 individual writes, 10 batches
  -h, --help            this text
";

#[derive(Clone, Debug)]
struct Config {
    runs: usize,
    n: u64,
    engines: Vec<String>,
    individual_writes: u64,
    batch_txns: u64,
    batch_size: u64,
    range_scans: Option<u64>,
    range_len: usize,
    removals: Option<u64>,
    dir: PathBuf,
    json: Option<PathBuf>,
    keep: bool,
    tuning: Tuning,
}

impl Config {
    fn range_scans(&self) -> u64 {
        self.range_scans.unwrap_or(self.n / 2)
    }
    fn removals(&self) -> u64 {
        self.removals.unwrap_or(self.n / 2).min(self.n)
    }
}

fn parse_args() -> Result<Config, String> {
    let mut c = Config {
        runs: 3,
        n: 1_000_000,
        engines: vec!["cambium".into(), "redb".into(), "lmdb".into()],
        individual_writes: 1000,
        batch_txns: 100,
        batch_size: 1000,
        range_scans: None,
        range_len: 10,
        removals: None,
        dir: std::env::temp_dir(),
        json: None,
        keep: false,
        // The same memory budget for every engine: redb gets a 4 GiB cache and LMDB a
        // 4 GiB map, so cambium gets a 4 GiB node cache.
        tuning: Tuning {
            cambium_cache_bytes: Some(4 << 30),
        },
    };
    let mut quick = false;
    let (mut runs, mut n, mut iw, mut bt) = (None, None, None, None);
    let mut args = std::env::args().skip(1);
    fn num<T: std::str::FromStr>(flag: &str, v: Option<String>) -> Result<T, String> {
        let v = v.ok_or_else(|| format!("{flag} needs a value"))?;
        v.replace(['_', ','], "")
            .parse()
            .map_err(|_| format!("{flag}: not a number: {v}"))
    }
    while let Some(a) = args.next() {
        match a.as_str() {
            "--runs" => runs = Some(num::<usize>(&a, args.next())?.max(1)),
            "--n" => n = Some(num::<u64>(&a, args.next())?.max(1)),
            "--engines" => {
                let v = args.next().ok_or("--engines needs a value")?;
                c.engines = v
                    .split(',')
                    .map(|s| s.trim().to_ascii_lowercase())
                    .filter(|s| !s.is_empty())
                    .collect();
                for e in &c.engines {
                    if !["cambium", "redb", "lmdb"].contains(&e.as_str()) {
                        return Err(format!("unknown engine {e:?} (cambium, redb, lmdb)"));
                    }
                }
            }
            "--individual-writes" => iw = Some(num(&a, args.next())?),
            "--batch-txns" => bt = Some(num(&a, args.next())?),
            "--batch-size" => c.batch_size = num(&a, args.next())?,
            "--range-scans" => c.range_scans = Some(num(&a, args.next())?),
            "--range-len" => c.range_len = num(&a, args.next())?,
            "--removals" => c.removals = Some(num(&a, args.next())?),
            "--cambium-cache-mib" => {
                c.tuning.cambium_cache_bytes = Some(num::<usize>(&a, args.next())? << 20)
            }
            "--dir" => c.dir = args.next().ok_or("--dir needs a value")?.into(),
            "--json" => c.json = Some(args.next().ok_or("--json needs a value")?.into()),
            "--keep" => c.keep = true,
            "--quick" => quick = true,
            "-h" | "--help" => {
                print!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}\n\n{USAGE}")),
        }
    }
    if quick {
        c.runs = 1;
        c.n = 100_000;
        c.individual_writes = 100;
        c.batch_txns = 10;
    }
    c.runs = runs.unwrap_or(c.runs);
    c.n = n.unwrap_or(c.n);
    c.individual_writes = iw.unwrap_or(c.individual_writes);
    c.batch_txns = bt.unwrap_or(c.batch_txns);
    Ok(c)
}

// ------------------------------------------------------------------ workloads

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum W {
    BulkLoad,
    IndividualWrites,
    BatchWrites,
    RandomReads,
    RangeReads,
    Removals,
    Close,
}

const WORKLOADS: [W; 7] = [
    W::BulkLoad,
    W::IndividualWrites,
    W::BatchWrites,
    W::RandomReads,
    W::RangeReads,
    W::Removals,
    W::Close,
];

impl W {
    fn key(self) -> &'static str {
        match self {
            W::BulkLoad => "bulk_load",
            W::IndividualWrites => "individual_writes",
            W::BatchWrites => "batch_writes",
            W::RandomReads => "random_reads",
            W::RangeReads => "range_reads",
            W::Removals => "removals",
            W::Close => "checkpoint_close",
        }
    }
    fn label(self, c: &Config) -> String {
        match self {
            W::BulkLoad => format!("bulk load ({} inserts, 1 txn)", sep(c.n)),
            W::IndividualWrites => {
                format!(
                    "individual writes ({} txns × 1 insert)",
                    sep(c.individual_writes)
                )
            }
            W::BatchWrites => format!(
                "batch writes ({} txns × {} inserts)",
                sep(c.batch_txns),
                sep(c.batch_size)
            ),
            W::RandomReads => format!("random reads ({} gets)", sep(c.n)),
            W::RangeReads => format!(
                "range reads ({} scans × {} entries)",
                sep(c.range_scans()),
                c.range_len
            ),
            W::Removals => format!("removals ({} deletes, 1 txn)", sep(c.removals())),
            W::Close => "final checkpoint + close (info)".into(),
        }
    }
    /// Operations counted for ops/s.
    fn ops(self, c: &Config) -> u64 {
        match self {
            W::BulkLoad | W::RandomReads => c.n,
            W::IndividualWrites => c.individual_writes,
            W::BatchWrites => c.batch_txns * c.batch_size,
            W::RangeReads => c.range_scans(),
            W::Removals => c.removals(),
            W::Close => 1,
        }
    }
}

#[derive(Clone, Debug, Default)]
struct RunResult {
    times: BTreeMap<W, Duration>,
    size_apparent: u64,
    size_allocated: u64,
    /// Correctness problems that did not stop the run (reported, not hidden).
    warnings: Vec<String>,
}

fn timed<T>(w: W, out: &mut RunResult, f: impl FnOnce() -> Res<T>) -> Res<T> {
    let t = Instant::now();
    let r = f()?;
    let d = t.elapsed();
    eprint!("    {:<18} {:>10.3} ms", w.key(), d.as_secs_f64() * 1e3);
    out.times.insert(w, d);
    Ok(r)
}

/// Ends the progress line `timed` started, with the engine's state if it reports one.
fn progress<E: Engine>(e: &E) {
    match e.progress() {
        Some(p) => eprintln!("   [{p}]"),
        None => eprintln!(),
    }
}

fn run_engine<E: Engine>(c: &Config, rep: usize) -> Res<RunResult> {
    let dir = c.dir.join(format!(
        "cambium-bench-{}-run{}-{}",
        std::process::id(),
        rep,
        E::NAME
    ));
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    eprintln!("  {} in {}", E::NAME, dir.display());
    let result = (|| -> Res<RunResult> {
        let mut out = RunResult::default();
        let mut e = E::create(&dir, &c.tuning)?;
        let n = c.n;

        timed(W::BulkLoad, &mut out, || e.insert_txn(pairs(SEED_MAIN, n)))?;
        progress(&e);

        let mut rng = Rng::new(SEED_INDIVIDUAL);
        timed(W::IndividualWrites, &mut out, || {
            for _ in 0..c.individual_writes {
                e.insert_txn(std::iter::once(rng.pair()))?;
            }
            Ok(())
        })?;
        progress(&e);

        let mut rng = Rng::new(SEED_BATCH);
        timed(W::BatchWrites, &mut out, || {
            for _ in 0..c.batch_txns {
                e.insert_txn((0..c.batch_size).map(|_| rng.pair()))?;
            }
            Ok(())
        })?;
        progress(&e);

        let sum = timed(W::RandomReads, &mut out, || e.read_txn(pairs(SEED_MAIN, n)))?;
        progress(&e);
        if sum != n * workload::VALUE_SIZE as u64 {
            return Err(format!("random reads: value bytes {sum}, expected {}", n * 150).into());
        }

        let scans = c.range_scans();
        let sum = timed(W::RangeReads, &mut out, || {
            // Start keys: existing keys in random order (the main stream cycles if
            // more scans than keys are asked for).
            let keys = (0..scans).map({
                let mut rng = Rng::new(SEED_MAIN);
                let mut i = 0u64;
                move |_| {
                    if i == n {
                        rng = Rng::new(SEED_MAIN);
                        i = 0;
                    }
                    i += 1;
                    rng.pair().0
                }
            });
            e.range_txn(keys, c.range_len)
        })?;
        progress(&e);
        if scans > 0 && sum == 0 {
            return Err("range reads returned nothing".into());
        }

        let removals = c.removals();
        let removed = timed(W::Removals, &mut out, || {
            e.remove_txn(pairs(SEED_MAIN, removals).map(|(k, _)| k))
        })?;
        progress(&e);
        if removed != removals {
            let w = format!(
                "removals: delete reported {} of {} existing keys as present",
                sep(removed),
                sep(removals)
            );
            eprintln!("    WARNING {w}");
            out.warnings.push(w);
        }

        if let Some(d) = e.describe() {
            eprintln!("    {d}");
        }
        timed(W::Close, &mut out, || e.close())?;
        eprintln!();

        let (a, b) = dir_size(&dir)?;
        out.size_apparent = a;
        out.size_allocated = b;
        eprintln!(
            "    on-disk size       {} apparent, {} allocated",
            bytes(a),
            bytes(b)
        );
        Ok(out)
    })();
    if !c.keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

/// Median latency, in µs, of a 4 KiB overwrite + `fdatasync` of a scratch file in `dir`
/// (100 rounds): the floor under every durable commit, printed to show how busy the disk
/// was when the benchmark ran.
fn fsync_probe(dir: &Path) -> Option<f64> {
    use std::os::unix::fs::FileExt;
    let path = dir.join(format!("cambium-bench-fsync-probe-{}", std::process::id()));
    let f = std::fs::File::create(&path).ok()?;
    let buf = [0x5au8; 4096];
    let mut v = Vec::with_capacity(100);
    for i in 0..100u64 {
        let t = Instant::now();
        f.write_all_at(&buf, (i % 4) * 4096).ok()?;
        f.sync_data().ok()?;
        v.push(t.elapsed().as_secs_f64() * 1e6);
    }
    drop(f);
    let _ = std::fs::remove_file(&path);
    Some(median(&mut v))
}

/// (sum of file lengths, sum of allocated blocks × 512) under `dir`, recursively.
fn dir_size(dir: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let (mut a, mut b) = (0, 0);
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let md = entry.metadata()?;
        if md.is_dir() {
            let (x, y) = dir_size(&entry.path())?;
            a += x;
            b += y;
        } else {
            a += md.len();
            b += md.blocks() * 512;
        }
    }
    Ok((a, b))
}

fn run_named(name: &str, c: &Config, rep: usize) -> Res<RunResult> {
    let r = catch_unwind(AssertUnwindSafe(|| match name {
        #[cfg(feature = "engine-cambium")]
        "cambium" => run_engine::<engines::Cambium>(c, rep),
        #[cfg(not(feature = "engine-cambium"))]
        "cambium" => Err("built without the engine-cambium feature".into()),
        "redb" => run_engine::<engines::Redb>(c, rep),
        "lmdb" => run_engine::<engines::Lmdb>(c, rep),
        other => Err(format!("unknown engine {other}").into()),
    }));
    match r {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panic".into());
            Err(format!("panicked: {msg}").into())
        }
    }
}

// ------------------------------------------------------------------ reporting

fn sep(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

fn bytes(b: u64) -> String {
    let b = b as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else if b >= (1u64 << 20) as f64 {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    } else {
        format!("{:.1} KiB", b / 1024.0)
    }
}

fn dur(d: f64) -> String {
    if d >= 1.0 {
        format!("{d:.2} s")
    } else if d >= 1e-3 {
        format!("{:.1} ms", d * 1e3)
    } else {
        format!("{:.0} µs", d * 1e6)
    }
}

fn rate(r: f64) -> String {
    if r >= 1e6 {
        format!("{:.2} M/s", r / 1e6)
    } else if r >= 1e3 {
        format!("{:.1} k/s", r / 1e3)
    } else {
        format!("{r:.0} /s")
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

fn read_first(path: &str, key: &str) -> Option<String> {
    let s = std::fs::read_to_string(path).ok()?;
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

fn cmd(program: &str, args: &[&str]) -> Option<String> {
    let o = std::process::Command::new(program)
        .args(args)
        .output()
        .ok()?;
    if !o.status.success() {
        return None;
    }
    Some(String::from_utf8_lossy(&o.stdout).trim().to_string())
}

fn machine(c: &Config) -> BTreeMap<&'static str, String> {
    let mut m = BTreeMap::new();
    m.insert(
        "cpu",
        read_first("/proc/cpuinfo", "model name").unwrap_or_else(|| "?".into()),
    );
    m.insert(
        "nproc",
        std::thread::available_parallelism()
            .map(|n| n.get().to_string())
            .unwrap_or_else(|_| "?".into()),
    );
    m.insert(
        "memory",
        read_first("/proc/meminfo", "MemTotal").unwrap_or_else(|| "?".into()),
    );
    m.insert(
        "kernel",
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "?".into()),
    );
    m.insert(
        "filesystem",
        cmd(
            "findmnt",
            &["-n", "-o", "FSTYPE", "-T", &c.dir.to_string_lossy()],
        )
        .or_else(|| cmd("stat", &["-f", "-c", "%T", &c.dir.to_string_lossy()]))
        .unwrap_or_else(|| "?".into()),
    );
    m.insert(
        "loadavg_at_start",
        std::fs::read_to_string("/proc/loadavg")
            .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|_| "?".into()),
    );
    m.insert(
        "rustc",
        cmd("rustc", &["--version"]).unwrap_or_else(|| "?".into()),
    );
    m.insert(
        "cambium_commit",
        cmd(
            "git",
            &[
                "-C",
                env!("CARGO_MANIFEST_DIR"),
                "log",
                "-1",
                "--format=%h %s",
            ],
        )
        .unwrap_or_else(|| "?".into()),
    );
    m
}

struct Summary {
    /// engine -> workload -> median seconds
    med: BTreeMap<String, BTreeMap<W, f64>>,
    /// engine -> workload -> fastest run's seconds
    best: BTreeMap<String, BTreeMap<W, f64>>,
    /// engine -> (median apparent, median allocated)
    size: BTreeMap<String, (f64, f64)>,
}

fn summarize(c: &Config, results: &BTreeMap<String, Vec<RunResult>>) -> Summary {
    let mut med = BTreeMap::new();
    let mut best = BTreeMap::new();
    let mut size = BTreeMap::new();
    for (e, runs) in results {
        if runs.is_empty() {
            continue;
        }
        let mut m = BTreeMap::new();
        let mut b = BTreeMap::new();
        for w in WORKLOADS {
            let mut v: Vec<f64> = runs.iter().map(|r| r.times[&w].as_secs_f64()).collect();
            m.insert(w, median(&mut v));
            b.insert(w, v[0]); // sorted by median()
        }
        med.insert(e.clone(), m);
        best.insert(e.clone(), b);
        let mut a: Vec<f64> = runs.iter().map(|r| r.size_apparent as f64).collect();
        let mut b: Vec<f64> = runs.iter().map(|r| r.size_allocated as f64).collect();
        size.insert(e.clone(), (median(&mut a), median(&mut b)));
    }
    let _ = c;
    Summary { med, best, size }
}

fn report(
    c: &Config,
    mach: &BTreeMap<&'static str, String>,
    results: &BTreeMap<String, Vec<RunResult>>,
    failures: &BTreeMap<String, String>,
) -> String {
    use std::fmt::Write;
    let s = summarize(c, results);
    let engines: Vec<&String> = c
        .engines
        .iter()
        .filter(|e| s.med.contains_key(*e))
        .collect();
    let peers: Vec<&String> = engines
        .iter()
        .copied()
        .filter(|e| *e != "cambium")
        .collect();
    let has_cambium = s.med.contains_key("cambium");
    let mut o = String::new();

    let _ = writeln!(o, "### Machine\n");
    let _ = writeln!(
        o,
        "- CPU: {} ({} logical CPUs), memory {}",
        mach["cpu"], mach["nproc"], mach["memory"]
    );
    let _ = writeln!(
        o,
        "- kernel {}, database directory on {} ({})",
        mach["kernel"],
        mach["filesystem"],
        c.dir.display()
    );
    let _ = writeln!(
        o,
        "- {}, cambium at `{}`",
        mach["rustc"], mach["cambium_commit"]
    );
    let _ = writeln!(
        o,
        "- load average at start: {}; median 4 KiB write + fdatasync: {} before, {} after the runs",
        mach["loadavg_at_start"], mach["fsync_median_before"], mach["fsync_median_after"]
    );
    if let Some(b) = c.tuning.cambium_cache_bytes {
        let _ = writeln!(
            o,
            "- **non-default**: cambium cache_bytes = {} MiB",
            b >> 20
        );
    }
    let _ = writeln!(
        o,
        "- {} run(s), engines interleaved per run; {} keys of 24 B with 150 B values; medians shown\n",
        c.runs,
        sep(c.n)
    );

    let _ = writeln!(o, "### Results (median of {} run(s))\n", c.runs);
    let mut hdr = String::from("| workload |");
    let mut line = String::from("|---|");
    for e in &engines {
        let _ = write!(hdr, " {e} |");
        line.push_str("---:|");
    }
    if has_cambium {
        for p in &peers {
            let _ = write!(hdr, " cambium vs {p} |");
            line.push_str("---:|");
        }
    }
    let _ = writeln!(o, "{hdr}\n{line}");
    for w in WORKLOADS {
        let mut row = format!("| {} |", w.label(c));
        for e in &engines {
            let t = s.med[*e][&w];
            if w == W::Close {
                let _ = write!(row, " {} |", dur(t));
            } else {
                let _ = write!(row, " {} ({}) |", dur(t), rate(w.ops(c) as f64 / t));
            }
        }
        if has_cambium {
            let ct = s.med["cambium"][&w];
            for p in &peers {
                let _ = write!(row, " {:.2}× |", s.med[*p][&w] / ct);
            }
        }
        let _ = writeln!(o, "{row}");
    }
    for (label, pick) in [
        ("on-disk size, file lengths", 0usize),
        ("on-disk size, allocated blocks", 1),
    ] {
        let mut row = format!("| {label} |");
        let get = |e: &str| {
            let (a, b) = s.size[e];
            if pick == 0 {
                a
            } else {
                b
            }
        };
        for e in &engines {
            let _ = write!(row, " {} |", bytes(get(e) as u64));
        }
        if has_cambium {
            for p in &peers {
                let _ = write!(row, " {:.2}× |", get(p) / get("cambium"));
            }
        }
        let _ = writeln!(o, "{row}");
    }
    let _ = writeln!(
        o,
        "\nRatios are peer time / cambium time (= cambium throughput / peer throughput), and for \
         sizes peer bytes / cambium bytes: **> 1.0 means cambium is faster (or smaller)**. \
         Range-read ops are scans. The last timed row is informational: cambium's commits are \
         durable in its WAL, and the tree is written at checkpoints; redb and LMDB write the \
         tree in every commit, so their close does no work."
    );

    if has_cambium {
        let _ = writeln!(o, "\n### Targets\n");
        let _ = writeln!(
            o,
            "Judged on the medians; the best-of-{} ratio (fastest run of each engine) is \
             shown too, as a check against interference from other work on the machine.\n",
            c.runs
        );
        let mut target = |name: String, ratio: Option<(f64, Option<f64>)>, need: f64| {
            let (v, verdict) = match ratio {
                Some((r, _)) => (
                    format!("{r:.2}×"),
                    if r >= need { "**met**" } else { "**MISSED**" },
                ),
                None => ("n/a".into(), "not measured"),
            };
            let b = match ratio {
                Some((_, Some(b))) => format!(" (best-of-{}: {b:.2}×)", c.runs),
                _ => String::new(),
            };
            let _ = writeln!(o, "- {name} (need ≥ {need:.1}×): {v}{b} — {verdict}");
        };
        let ratio = |p: &str, w: W| {
            s.med.get(p).map(|m| {
                (
                    m[&w] / s.med["cambium"][&w],
                    Some(s.best[p][&w] / s.best["cambium"][&w]),
                )
            })
        };
        target(
            "random reads vs LMDB".into(),
            ratio("lmdb", W::RandomReads),
            1.0,
        );
        target(
            "batch writes vs redb".into(),
            ratio("redb", W::BatchWrites),
            1.5,
        );
        target(
            "individual durable writes vs redb".into(),
            ratio("redb", W::IndividualWrites),
            1.0,
        );
        let size_ratio = |i: usize| {
            s.size.get("redb").map(|r| {
                let c = s.size["cambium"];
                let v = if i == 0 { r.0 / c.0 } else { r.1 / c.1 };
                (v, None)
            })
        };
        target(
            "on-disk size ≤ redb's, file lengths (redb/cambium)".into(),
            size_ratio(0),
            1.0,
        );
        target(
            "on-disk size ≤ redb's, allocated (redb/cambium)".into(),
            size_ratio(1),
            1.0,
        );
    }

    let _ = writeln!(o, "\n<details><summary>Every run (seconds)</summary>\n");
    let _ = writeln!(o, "| engine | workload | runs |");
    let _ = writeln!(o, "|---|---|---|");
    for e in &engines {
        for w in WORKLOADS {
            let v: Vec<String> = results[*e]
                .iter()
                .map(|r| format!("{:.3}", r.times[&w].as_secs_f64()))
                .collect();
            let _ = writeln!(o, "| {e} | {} | {} |", w.key(), v.join(", "));
        }
    }
    let _ = writeln!(o, "\n</details>");

    let mut warned = false;
    for e in &engines {
        for (i, r) in results[*e].iter().enumerate() {
            for w in &r.warnings {
                if !warned {
                    let _ = writeln!(o, "\n### Correctness warnings\n");
                    warned = true;
                }
                let _ = writeln!(o, "- **{e}**, run {}: {w}", i + 1);
            }
        }
    }

    if !failures.is_empty() {
        let _ = writeln!(o, "\n### Failures\n");
        for (e, msg) in failures {
            let _ = writeln!(o, "- **{e}**: {msg}");
        }
    }
    o
}

fn to_json(
    c: &Config,
    mach: &BTreeMap<&'static str, String>,
    results: &BTreeMap<String, Vec<RunResult>>,
    failures: &BTreeMap<String, String>,
) -> serde_json::Value {
    use serde_json::{json, Map, Value};
    let s = summarize(c, results);
    let mut engines = Map::new();
    for (e, runs) in results {
        if runs.is_empty() {
            continue;
        }
        let mut ws = Map::new();
        for w in WORKLOADS {
            let times: Vec<f64> = runs.iter().map(|r| r.times[&w].as_secs_f64()).collect();
            let m = s.med[e][&w];
            let mut o = json!({
                "ops": w.ops(c),
                "times_s": times,
                "median_s": m,
                "ops_per_s": w.ops(c) as f64 / m,
            });
            if e != "cambium" {
                if let Some(cm) = s.med.get("cambium") {
                    o["cambium_speedup"] = json!(m / cm[&w]);
                }
            }
            ws.insert(w.key().into(), o);
        }
        let (a, b) = s.size[e];
        ws.insert(
            "size".into(),
            json!({
                "apparent_bytes": runs.iter().map(|r| r.size_apparent).collect::<Vec<_>>(),
                "allocated_bytes": runs.iter().map(|r| r.size_allocated).collect::<Vec<_>>(),
                "median_apparent_bytes": a,
                "median_allocated_bytes": b,
            }),
        );
        ws.insert(
            "warnings".into(),
            json!(runs.iter().map(|r| r.warnings.clone()).collect::<Vec<_>>()),
        );
        engines.insert(e.clone(), Value::Object(ws));
    }
    json!({
        "machine": mach,
        "config": {
            "runs": c.runs, "n": c.n, "key_size": workload::KEY_SIZE,
            "value_size": workload::VALUE_SIZE, "individual_writes": c.individual_writes,
            "batch_txns": c.batch_txns, "batch_size": c.batch_size,
            "range_scans": c.range_scans(), "range_len": c.range_len,
            "removals": c.removals(), "engines": c.engines, "dir": c.dir,
            "cambium_cache_bytes": c.tuning.cambium_cache_bytes,
        },
        "engines": engines,
        "failures": failures,
    })
}

fn main() {
    let c = match parse_args() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = std::fs::create_dir_all(&c.dir) {
        eprintln!("error: cannot create {}: {e}", c.dir.display());
        std::process::exit(2);
    }
    let mut mach = machine(&c);
    eprintln!("config: {c:?}");
    let probe = |m: &mut BTreeMap<&'static str, String>, k: &'static str| {
        let v = fsync_probe(&c.dir).map_or("?".into(), |us| format!("{us:.0} µs"));
        eprintln!("fsync probe ({k}): {v}");
        m.insert(k, v);
    };
    probe(&mut mach, "fsync_median_before");
    let mut results: BTreeMap<String, Vec<RunResult>> = BTreeMap::new();
    let mut failures: BTreeMap<String, String> = BTreeMap::new();
    for rep in 0..c.runs {
        eprintln!("run {}/{}", rep + 1, c.runs);
        for e in &c.engines {
            if failures.contains_key(e) {
                continue;
            }
            match run_named(e, &c, rep) {
                Ok(r) => results.entry(e.clone()).or_default().push(r),
                Err(err) => {
                    eprintln!("  {e} FAILED: {err}");
                    failures.insert(e.clone(), format!("run {}: {err}", rep + 1));
                    results.remove(e);
                }
            }
        }
    }
    probe(&mut mach, "fsync_median_after");
    let md = report(&c, &mach, &results, &failures);
    println!("{md}");
    if let Some(path) = &c.json {
        let j = to_json(&c, &mach, &results, &failures);
        let text = serde_json::to_string_pretty(&j).expect("json");
        if let Err(e) = std::fs::write(path, text + "\n") {
            eprintln!("error: cannot write {}: {e}", path.display());
            std::process::exit(1);
        }
    }
    if !failures.is_empty() {
        std::process::exit(1);
    }
}
