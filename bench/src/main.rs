//! cambium-bench: cambium vs redb, LMDB (heed) and Sanakirja on the workloads of redb's
//! own comparative benchmark (`benches/lmdb_benchmark.rs`), each engine's run in its own
//! child process, the engines' order rotated between rounds, medians of N rounds, in two
//! configurations (every engine's default options, and an equal 4 GiB memory budget).
//!
//! ```text
//! cargo run --release -p cambium-bench -- --runs 3
//! cargo run --release -p cambium-bench -- --quick
//! ```
//!
//! Run with `--help` for every flag.

/// Every engine's child process allocates through it: mimalloc, or glibc's `malloc`
/// under `--alloc system` (src/alloc.rs).
#[global_allocator]
static ALLOCATOR: alloc::Switch = alloc::Switch;

mod alloc;
mod engines;
mod workload;

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use workload::{pairs, Engine, Res, Rng, Tuning, SEED_BATCH, SEED_INDIVIDUAL, SEED_MAIN};

const USAGE: &str = "\
cambium-bench: cambium vs redb vs LMDB (heed) vs Sanakirja, redb's comparative workloads

USAGE: cargo run --release -p cambium-bench -- [FLAGS]

  --runs N              rounds; every engine runs once per round and configuration, round
                        r starting with engine r mod (engines) (default 3)
  --n N                 keys in the bulk load (default 1000000)
  --bulk-txn N          pairs per durable txn in the bulk load: the same n pairs committed
                        every N (default n: one txn), then one checkpoint
  --engines LIST        comma list of cambium,redb,lmdb,sanakirja (default all four)
  --config C            defaults (each engine's default options), equal (a 4 GiB cache or
                        map for every engine) or both (default both)
  --individual-writes N single-insert durable txns (default 1000)
  --batch-txns N        durable txns in the batch-writes workload (default 100)
  --batch-size N        inserts per batch txn (default 1000)
  --reads N             random point reads per pass, the first N keys loaded, in load
                        order (default n)
  --range-scans N       range scans (default n/2)
  --range-len N         entries read per range scan (default 10)
  --removals N          keys removed in one txn (default n/2)
  --cambium-cache-mib N override cambium's node cache in every configuration (diagnosis)
  --cambium-dirty-mib N override cambium's dirty-node budgets (checkpoint_dirty_bytes and
                        txn_dirty_bytes) in every configuration (diagnosis)
  --alloc A             the allocator of every engine's process: mimalloc (the cambium
                        binary's; default) or system (glibc's malloc)
  --reads-in-cgroup DIR after the write phases each engine closes its database, moves
                        into the cgroup DIR (v1 or v2: its cgroup.procs), drops the OS
                        page cache (root only) and reopens it with the options it
                        would choose there: the read phases, removals and close then
                        run under that cgroup's memory limit, each engine sized by its
                        defaults to it (the store-larger-than-the-default-cache case,
                        without building the store under the limit)
  --lmdb-no-readahead   open LMDB with MDB_NORDAHEAD (tuning, not its default: what a
                        user whose data outgrows memory sets)
  --dir DIR             parent of the per-run temp directories (default $TMPDIR or /tmp)
  --json FILE           also write machine-readable results to FILE
  --keep                keep the database directories (default: deleted after each run)
  --quick               smoke test: n=100000, 1 run, 100 individual writes, 10 batches
  -h, --help            this text
";

/// The flag a child process gets: `ENGINE:CONFIG:ROUND`.
const CHILD_FLAG: &str = "--child";
/// Prefixes the child's one line of JSON results on its stdout.
const CHILD_RESULT: &str = "CAMBIUM-BENCH-RESULT ";

const ALL_ENGINES: [&str; 4] = ["cambium", "redb", "lmdb", "sanakirja"];

#[derive(Clone, Debug)]
struct Config {
    runs: usize,
    n: u64,
    /// `--bulk-txn`: pairs per bulk-load transaction (None: all n in one).
    bulk_txn: Option<u64>,
    engines: Vec<String>,
    /// The configurations to run, as `Tuning::equal`: false = defaults, true = equal.
    configs: Vec<bool>,
    individual_writes: u64,
    batch_txns: u64,
    batch_size: u64,
    reads: Option<u64>,
    range_scans: Option<u64>,
    range_len: usize,
    removals: Option<u64>,
    dir: PathBuf,
    reads_in_cgroup: Option<PathBuf>,
    lmdb_no_readahead: bool,
    json: Option<PathBuf>,
    keep: bool,
    /// `--alloc`: "mimalloc" or "system", passed to the children in `alloc::ALLOC_ENV`.
    alloc: String,
    cambium_cache_bytes: Option<usize>,
    cambium_dirty_bytes: Option<u64>,
    /// Set in a child process: the one (engine, configuration, round) it runs.
    child: Option<(String, bool, usize)>,
}

impl Config {
    /// Pairs per bulk-load transaction, at most n.
    fn bulk_txn(&self) -> u64 {
        self.bulk_txn.unwrap_or(self.n).clamp(1, self.n.max(1))
    }
    /// Transactions the bulk load commits (the last one may be short).
    fn bulk_txns(&self) -> u64 {
        self.n.div_ceil(self.bulk_txn())
    }
    /// Entries in the store when the full scans run: every insert so far (the keys of the
    /// three write phases come from different seeds, so none repeats), nothing removed yet.
    fn scan_entries(&self) -> u64 {
        self.n + self.individual_writes + self.batch_txns * self.batch_size
    }
    fn reads(&self) -> u64 {
        self.reads.unwrap_or(self.n).min(self.n)
    }
    fn range_scans(&self) -> u64 {
        self.range_scans.unwrap_or(self.n / 2)
    }
    fn removals(&self) -> u64 {
        self.removals.unwrap_or(self.n / 2).min(self.n)
    }
    fn tuning(&self, equal: bool) -> Tuning {
        Tuning {
            equal,
            cambium_cache_bytes: self.cambium_cache_bytes,
            cambium_dirty_bytes: self.cambium_dirty_bytes,
            map_bytes: workload::map_bytes(self.n),
            lmdb_no_readahead: self.lmdb_no_readahead,
        }
    }
}

fn config_name(equal: bool) -> &'static str {
    if equal {
        "equal"
    } else {
        "defaults"
    }
}

fn parse_config(v: &str) -> Result<Vec<bool>, String> {
    match v {
        "defaults" | "default" => Ok(vec![false]),
        "equal" => Ok(vec![true]),
        "both" => Ok(vec![false, true]),
        other => Err(format!(
            "--config: {other:?} is not defaults, equal or both"
        )),
    }
}

fn parse_args() -> Result<Config, String> {
    let mut c = Config {
        runs: 3,
        n: 1_000_000,
        bulk_txn: None,
        engines: ALL_ENGINES.iter().map(|s| s.to_string()).collect(),
        configs: vec![false, true],
        individual_writes: 1000,
        batch_txns: 100,
        batch_size: 1000,
        reads: None,
        range_scans: None,
        range_len: 10,
        removals: None,
        dir: std::env::temp_dir(),
        reads_in_cgroup: None,
        lmdb_no_readahead: false,
        json: None,
        keep: false,
        alloc: "mimalloc".into(),
        cambium_cache_bytes: None,
        cambium_dirty_bytes: None,
        child: None,
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
            "--bulk-txn" => c.bulk_txn = Some(num::<u64>(&a, args.next())?.max(1)),
            "--engines" => {
                let v = args.next().ok_or("--engines needs a value")?;
                c.engines = v
                    .split(',')
                    .map(|s| s.trim().to_ascii_lowercase())
                    .filter(|s| !s.is_empty())
                    .collect();
                for e in &c.engines {
                    if !ALL_ENGINES.contains(&e.as_str()) {
                        return Err(format!("unknown engine {e:?} ({})", ALL_ENGINES.join(", ")));
                    }
                }
            }
            "--config" => c.configs = parse_config(&args.next().ok_or("--config needs a value")?)?,
            "--individual-writes" => iw = Some(num(&a, args.next())?),
            "--batch-txns" => bt = Some(num(&a, args.next())?),
            "--batch-size" => c.batch_size = num(&a, args.next())?,
            "--reads" => c.reads = Some(num(&a, args.next())?),
            "--lmdb-no-readahead" => c.lmdb_no_readahead = true,
            "--reads-in-cgroup" => {
                c.reads_in_cgroup =
                    Some(args.next().ok_or("--reads-in-cgroup needs a value")?.into())
            }
            "--range-scans" => c.range_scans = Some(num(&a, args.next())?),
            "--range-len" => c.range_len = num(&a, args.next())?,
            "--removals" => c.removals = Some(num(&a, args.next())?),
            "--cambium-cache-mib" => {
                c.cambium_cache_bytes = Some(num::<usize>(&a, args.next())? << 20)
            }
            "--cambium-dirty-mib" => {
                c.cambium_dirty_bytes = Some(num::<u64>(&a, args.next())? << 20)
            }
            "--dir" => c.dir = args.next().ok_or("--dir needs a value")?.into(),
            "--json" => c.json = Some(args.next().ok_or("--json needs a value")?.into()),
            "--keep" => c.keep = true,
            "--alloc" => {
                c.alloc = args.next().ok_or("--alloc needs a value")?;
                if !matches!(c.alloc.as_str(), "mimalloc" | "system") {
                    return Err(format!("--alloc: {:?} is not mimalloc or system", c.alloc));
                }
            }
            "--quick" => quick = true,
            CHILD_FLAG => {
                let v = args.next().ok_or("--child needs a value")?;
                let mut it = v.splitn(3, ':');
                let (e, cfg, r) = (it.next(), it.next(), it.next());
                let (Some(e), Some(cfg), Some(r)) = (e, cfg, r) else {
                    return Err(format!("--child: bad value {v:?}"));
                };
                let equal = parse_config(cfg)?;
                let r = r.parse().map_err(|_| format!("--child: bad round {r:?}"))?;
                c.child = Some((e.to_string(), equal[0], r));
            }
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
    RandomReads1,
    RandomReads,
    RangeReads1,
    RangeReads,
    FullScan1,
    FullScan,
    Removals,
    Close,
    Total,
}

const WORKLOADS: [W; 12] = [
    W::BulkLoad,
    W::IndividualWrites,
    W::BatchWrites,
    W::RandomReads1,
    W::RandomReads,
    W::RangeReads1,
    W::RangeReads,
    W::FullScan1,
    W::FullScan,
    W::Removals,
    W::Close,
    W::Total,
];

impl W {
    fn key(self) -> &'static str {
        match self {
            W::BulkLoad => "bulk_load",
            W::IndividualWrites => "individual_writes",
            W::BatchWrites => "batch_writes",
            W::RandomReads1 => "random_reads_pass1",
            W::RandomReads => "random_reads",
            W::RangeReads1 => "range_reads_pass1",
            W::RangeReads => "range_reads",
            W::FullScan1 => "full_scan_pass1",
            W::FullScan => "full_scan",
            W::Removals => "removals",
            W::Close => "close",
            W::Total => "total",
        }
    }
    fn from_key(k: &str) -> Option<W> {
        WORKLOADS.into_iter().find(|w| w.key() == k)
    }
    fn label(self, c: &Config) -> String {
        match self {
            W::BulkLoad => {
                let t = c.bulk_txns();
                format!(
                    "bulk load ({} inserts, {} {}) + checkpoint",
                    sep(c.n),
                    sep(t),
                    if t == 1 { "txn" } else { "txns" }
                )
            }
            W::IndividualWrites => {
                format!(
                    "individual writes ({} txns × 1 insert) + checkpoint",
                    sep(c.individual_writes)
                )
            }
            W::BatchWrites => format!(
                "batch writes ({} txns × {} inserts) + checkpoint",
                sep(c.batch_txns),
                sep(c.batch_size)
            ),
            W::RandomReads1 => "random reads, first pass (info)".into(),
            W::RandomReads => format!("random reads ({} gets, second pass)", sep(c.reads())),
            W::RangeReads1 => "range reads, first pass (info)".into(),
            W::RangeReads => format!(
                "range reads ({} scans × {} entries, second pass)",
                sep(c.range_scans()),
                c.range_len
            ),
            W::FullScan1 => "full scan, first pass (info)".into(),
            W::FullScan => format!("full scan ({} entries, second pass)", sep(c.scan_entries())),
            W::Removals => format!(
                "removals ({} deletes, 1 txn) + checkpoint",
                sep(c.removals())
            ),
            W::Close => "close".into(),
            W::Total => "**total: the 7 phases (second read passes) + close**".into(),
        }
    }
    /// Operations counted for ops/s (0: a duration only).
    fn ops(self, c: &Config) -> u64 {
        match self {
            W::BulkLoad => c.n,
            W::RandomReads | W::RandomReads1 => c.reads(),
            W::IndividualWrites => c.individual_writes,
            W::BatchWrites => c.batch_txns * c.batch_size,
            W::RangeReads | W::RangeReads1 => c.range_scans(),
            W::FullScan | W::FullScan1 => c.scan_entries(),
            W::Removals => c.removals(),
            W::Close | W::Total => 0,
        }
    }
    /// Counted in the total (the first read passes are not).
    fn in_total(self) -> bool {
        !matches!(
            self,
            W::RandomReads1 | W::RangeReads1 | W::FullScan1 | W::Total
        )
    }
}

#[derive(Clone, Debug, Default)]
struct RunResult {
    times: BTreeMap<W, Duration>,
    size_apparent: u64,
    size_allocated: u64,
    /// The child process's VmHWM (peak resident set, anonymous + file-backed + shared).
    peak_rss_kib: u64,
    /// The largest RssAnon / RssFile seen at the end of a phase (samples, not peaks).
    anon_kib: u64,
    file_kib: u64,
    /// Correctness problems that did not stop the run (reported, not hidden).
    warnings: Vec<String>,
}

impl RunResult {
    fn to_json(&self) -> serde_json::Value {
        let times: serde_json::Map<String, serde_json::Value> = self
            .times
            .iter()
            .map(|(w, d)| (w.key().to_string(), d.as_secs_f64().into()))
            .collect();
        serde_json::json!({
            "times_s": times,
            "size_apparent": self.size_apparent,
            "size_allocated": self.size_allocated,
            "peak_rss_kib": self.peak_rss_kib,
            "max_phase_end_rss_anon_kib": self.anon_kib,
            "max_phase_end_rss_file_kib": self.file_kib,
            "warnings": self.warnings,
        })
    }
    fn from_json(v: &serde_json::Value) -> Option<RunResult> {
        let mut r = RunResult::default();
        for (k, t) in v["times_s"].as_object()? {
            r.times
                .insert(W::from_key(k)?, Duration::from_secs_f64(t.as_f64()?));
        }
        r.size_apparent = v["size_apparent"].as_u64()?;
        r.size_allocated = v["size_allocated"].as_u64()?;
        r.peak_rss_kib = v["peak_rss_kib"].as_u64()?;
        r.anon_kib = v["max_phase_end_rss_anon_kib"].as_u64()?;
        r.file_kib = v["max_phase_end_rss_file_kib"].as_u64()?;
        r.warnings = v["warnings"]
            .as_array()?
            .iter()
            .filter_map(|w| w.as_str().map(String::from))
            .collect();
        Some(r)
    }
}

/// A `kB` field of /proc/self/status, in KiB.
fn status_kib(field: &str) -> u64 {
    read_first("/proc/self/status", field)
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn timed<T>(w: W, out: &mut RunResult, f: impl FnOnce() -> Res<T>) -> Res<T> {
    let t = Instant::now();
    let r = f()?;
    let d = t.elapsed();
    let (anon, file, hwm) = (
        status_kib("RssAnon:"),
        status_kib("RssFile:"),
        status_kib("VmHWM:"),
    );
    eprint!(
        "    {:<18} {:>10.3} ms  rss anon {} MiB file {} MiB, peak {} MiB",
        w.key(),
        d.as_secs_f64() * 1e3,
        anon >> 10,
        file >> 10,
        hwm >> 10
    );
    out.times.insert(w, d);
    out.anon_kib = out.anon_kib.max(anon);
    out.file_kib = out.file_kib.max(file);
    Ok(r)
}

/// Moves this process into the cgroup at `dir` and empties the OS page cache, so that
/// what the reads find in memory is what they bring in under that cgroup's limit.
fn enter_cgroup(dir: &Path) -> Res<()> {
    let procs = dir.join("cgroup.procs");
    std::fs::write(&procs, std::process::id().to_string())
        .map_err(|e| format!("joining {}: {e}", procs.display()))?;
    let synced = std::process::Command::new("sync").status()?;
    if !synced.success() {
        return Err("sync failed".into());
    }
    std::fs::write("/proc/sys/vm/drop_caches", "3")
        .map_err(|e| format!("dropping the page cache (needs root): {e}"))?;
    Ok(())
}

/// Ends the progress line `timed` started, with the engine's state if it reports one.
fn progress<E: Engine>(e: &E) {
    match e.progress() {
        Some(p) => eprintln!("   [{p}]"),
        None => eprintln!(),
    }
}

fn run_engine<E: Engine>(c: &Config, equal: bool, rep: usize) -> Res<RunResult> {
    let dir = c.dir.join(format!(
        "cambium-bench-{}-run{}-{}-{}",
        std::process::id(),
        rep,
        config_name(equal),
        E::NAME
    ));
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    eprintln!(
        "  {} ({}) in {}",
        E::NAME,
        config_name(equal),
        dir.display()
    );
    let result = (|| -> Res<RunResult> {
        let mut out = RunResult::default();
        let mut e = E::create(&dir, &c.tuning(equal))?;
        let n = c.n;

        // Every write phase ends with a checkpoint inside its timer, so that tree writes
        // cambium defers from its (WAL-durable) commits are charged to the phase that
        // caused them; the peers write their trees in each commit (a no-op for them).
        // The bulk load is one stream of n pairs, committed every `--bulk-txn` of them.
        let chunk = c.bulk_txn();
        timed(W::BulkLoad, &mut out, || {
            let mut stream = pairs(SEED_MAIN, n);
            let mut left = n;
            while left > 0 {
                let k = left.min(chunk);
                e.insert_txn(stream.by_ref().take(k as usize))?;
                left -= k;
            }
            e.checkpoint()
        })?;
        progress(&e);

        let mut rng = Rng::new(SEED_INDIVIDUAL);
        timed(W::IndividualWrites, &mut out, || {
            for _ in 0..c.individual_writes {
                e.insert_txn(std::iter::once(rng.pair()))?;
            }
            e.checkpoint()
        })?;
        progress(&e);

        let mut rng = Rng::new(SEED_BATCH);
        timed(W::BatchWrites, &mut out, || {
            for _ in 0..c.batch_txns {
                e.insert_txn((0..c.batch_size).map(|_| rng.pair()))?;
            }
            e.checkpoint()
        })?;
        progress(&e);

        if let Some(cgroup) = &c.reads_in_cgroup {
            e.close()?;
            enter_cgroup(cgroup)?;
            e = E::reopen(&dir, &c.tuning(equal))?;
            eprintln!("    (reopened in cgroup {})", cgroup.display());
        }

        // Two passes of each read workload; the second is the one reported and compared.
        let reads = c.reads();
        let read_bytes = reads * workload::VALUE_SIZE as u64;
        for w in [W::RandomReads1, W::RandomReads] {
            let sum = timed(w, &mut out, || e.read_txn(pairs(SEED_MAIN, reads)))?;
            progress(&e);
            if sum != read_bytes {
                return Err(
                    format!("random reads: value bytes {sum}, expected {read_bytes}").into(),
                );
            }
        }

        let scans = c.range_scans();
        for w in [W::RangeReads1, W::RangeReads] {
            let sum = timed(w, &mut out, || {
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
        }

        // Every entry inserted so far, in key order: the engines' leaf walk.
        let entries = c.scan_entries();
        let entry_bytes = (workload::KEY_SIZE + workload::VALUE_SIZE) as u64;
        for w in [W::FullScan1, W::FullScan] {
            let (got, sum) = timed(w, &mut out, || e.scan_txn())?;
            progress(&e);
            if got != entries || sum != entries * entry_bytes {
                return Err(format!(
                    "full scan: {} entries, {} bytes; expected {} entries, {} bytes",
                    sep(got),
                    sep(sum),
                    sep(entries),
                    sep(entries * entry_bytes)
                )
                .into());
            }
        }

        let removals = c.removals();
        let removed = timed(W::Removals, &mut out, || {
            let removed = e.remove_txn(pairs(SEED_MAIN, removals).map(|(k, _)| k))?;
            e.checkpoint()?;
            Ok(removed)
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
        let total = out
            .times
            .iter()
            .filter(|(w, _)| w.in_total())
            .map(|(_, d)| *d)
            .sum();
        out.times.insert(W::Total, total);
        out.peak_rss_kib = status_kib("VmHWM:");

        let (a, b) = dir_size(&dir)?;
        out.size_apparent = a;
        out.size_allocated = b;
        eprintln!(
            "    total {:.3} s; on-disk size {} apparent, {} allocated; peak RSS {}",
            total.as_secs_f64(),
            bytes(a),
            bytes(b),
            bytes(out.peak_rss_kib << 10)
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

/// Runs one engine in this process (the child's job).
fn run_named(name: &str, c: &Config, equal: bool, rep: usize) -> Res<RunResult> {
    let r = catch_unwind(AssertUnwindSafe(|| match name {
        #[cfg(feature = "engine-cambium")]
        "cambium" => run_engine::<engines::Cambium>(c, equal, rep),
        #[cfg(not(feature = "engine-cambium"))]
        "cambium" => Err("built without the engine-cambium feature".into()),
        "redb" => run_engine::<engines::Redb>(c, equal, rep),
        "lmdb" => run_engine::<engines::Lmdb>(c, equal, rep),
        "sanakirja" => run_engine::<engines::Sanakirja>(c, equal, rep),
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

/// Runs one engine in a child process of this binary (same flags plus `--child`), so
/// that its peak RSS is its own and no engine inherits another's heap or mappings.
fn run_child(name: &str, equal: bool, rep: usize, alloc: &str) -> Res<RunResult> {
    let exe = std::env::current_exe()?;
    let out = std::process::Command::new(exe)
        .args(std::env::args().skip(1))
        .arg(CHILD_FLAG)
        .arg(format!("{name}:{}:{rep}", config_name(equal)))
        .env(alloc::ALLOC_ENV, alloc)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().find_map(|l| l.strip_prefix(CHILD_RESULT));
    match line {
        Some(l) if out.status.success() => {
            let v: serde_json::Value = serde_json::from_str(l)?;
            RunResult::from_json(&v).ok_or_else(|| "child: malformed result".into())
        }
        _ => Err(format!("child process {}", out.status).into()),
    }
}

fn child_main(c: &Config, name: &str, equal: bool, rep: usize) -> ! {
    match run_named(name, c, equal, rep) {
        Ok(r) => {
            println!("{CHILD_RESULT}{}", r.to_json());
            std::process::exit(0);
        }
        Err(e) => {
            eprintln!("  {name} ({}) FAILED: {e}", config_name(equal));
            std::process::exit(1);
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

/// Results of one configuration: engine -> one result per round.
type Results = BTreeMap<String, Vec<RunResult>>;

struct Summary {
    /// engine -> workload -> median seconds
    med: BTreeMap<String, BTreeMap<W, f64>>,
    /// engine -> workload -> fastest run's seconds
    best: BTreeMap<String, BTreeMap<W, f64>>,
    /// engine -> (median apparent, median allocated)
    size: BTreeMap<String, (f64, f64)>,
    /// engine -> (median peak RSS, median max RssAnon, median max RssFile), bytes
    rss: BTreeMap<String, (f64, f64, f64)>,
}

fn summarize(results: &Results) -> Summary {
    let mut s = Summary {
        med: BTreeMap::new(),
        best: BTreeMap::new(),
        size: BTreeMap::new(),
        rss: BTreeMap::new(),
    };
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
        s.med.insert(e.clone(), m);
        s.best.insert(e.clone(), b);
        let med_of = |f: &dyn Fn(&RunResult) -> u64| {
            let mut v: Vec<f64> = runs.iter().map(|r| f(r) as f64).collect();
            median(&mut v)
        };
        let size = (med_of(&|r| r.size_apparent), med_of(&|r| r.size_allocated));
        let rss = (
            med_of(&|r| r.peak_rss_kib << 10),
            med_of(&|r| r.anon_kib << 10),
            med_of(&|r| r.file_kib << 10),
        );
        s.size.insert(e.clone(), size);
        s.rss.insert(e.clone(), rss);
    }
    s
}

fn machine_header(c: &Config, mach: &BTreeMap<&'static str, String>) -> String {
    use std::fmt::Write;
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
        "- {}, cambium at `{}`; every engine allocates through {} (`--alloc {}`)",
        mach["rustc"],
        mach["cambium_commit"],
        match c.alloc.as_str() {
            "system" => "glibc's malloc",
            _ => "mimalloc, as the `cambium` binary does",
        },
        c.alloc
    );
    let _ = writeln!(
        o,
        "- load average at start: {}; median 4 KiB write + fdatasync: {} before, {} after the runs",
        mach["loadavg_at_start"], mach["fsync_median_before"], mach["fsync_median_after"]
    );
    if let Some(b) = c.cambium_cache_bytes {
        let _ = writeln!(
            o,
            "- **non-default**: cambium cache_bytes = {} MiB in every configuration",
            b >> 20
        );
    }
    if let Some(b) = c.cambium_dirty_bytes {
        let _ = writeln!(
            o,
            "- **non-default**: cambium checkpoint_dirty_bytes = txn_dirty_bytes = {} MiB",
            b >> 20
        );
    }
    let _ = writeln!(
        o,
        "- {} round(s), each engine in its own child process, the order rotated per round; \
         {} keys of 24 B with 150 B values; medians shown",
        c.runs,
        sep(c.n)
    );
    o
}

fn config_text(equal: bool) -> &'static str {
    if equal {
        "equal budget: cambium's node cache 4 GiB, redb's cache 4 GiB, LMDB's map 4 GiB, \
         Sanakirja's initial map 4 GiB"
    } else {
        "each engine's defaults: cambium `Options::default()` (node cache a quarter of \
         memory, at least 1 GiB), redb \
         `Builder::new()` (1 GiB cache); LMDB and Sanakirja have no cache of their own and \
         keep their 4 GiB map (LMDB's default 10 MiB map cannot hold the data)"
    }
}

fn report(
    c: &Config,
    equal: bool,
    results: &Results,
    failures: &BTreeMap<String, String>,
) -> String {
    use std::fmt::Write;
    let s = summarize(results);
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

    let _ = writeln!(
        o,
        "### Configuration `{}` (median of {} round(s))\n\n{}.\n",
        config_name(equal),
        c.runs,
        config_text(equal)
    );
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
            if w.ops(c) == 0 {
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
    type Get<'a> = &'a dyn Fn(&Summary, &str) -> f64;
    let rows: [(&str, Get); 5] = [
        ("peak RSS (child's VmHWM)", &|s, e| s.rss[e].0),
        ("largest RssAnon at a phase end", &|s, e| s.rss[e].1),
        ("largest RssFile at a phase end", &|s, e| s.rss[e].2),
        ("on-disk size, file lengths", &|s, e| s.size[e].0),
        ("on-disk size, allocated blocks", &|s, e| s.size[e].1),
    ];
    for (label, get) in rows {
        let mut row = format!("| {label} |");
        for e in &engines {
            let _ = write!(row, " {} |", bytes(get(&s, e) as u64));
        }
        if has_cambium {
            for p in &peers {
                let _ = write!(row, " {:.2}× |", get(&s, p) / get(&s, "cambium"));
            }
        }
        let _ = writeln!(o, "{row}");
    }
    let _ = writeln!(
        o,
        "\nRatios are peer time / cambium time (= cambium throughput / peer throughput), and for \
         memory and sizes peer bytes / cambium bytes: **> 1.0 means cambium is faster (or \
         smaller)**. Range-read ops are scans; full-scan ops are the entries read. Write \
         phases end with cambium's `checkpoint()` inside the timer (the peers write their \
         trees in every commit). The total is the median over rounds of each round's sum of \
         the seven phases (second read passes) and close. RSS is per child process (one engine); RssFile counts mapped file pages \
         (LMDB's and Sanakirja's reads), which the pread-based engines keep in the OS page \
         cache outside their RSS."
    );

    if has_cambium {
        let _ = writeln!(o, "\n#### Targets ({})\n", config_name(equal));
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
        // The issue's goals: reads against LMDB (the fastest reader), writes against redb
        // (the closest design), the bulk load against both.
        let goals: [(&str, &str, W, f64); 9] = [
            ("random reads vs LMDB", "lmdb", W::RandomReads, 1.0),
            ("range reads vs LMDB", "lmdb", W::RangeReads, 1.0),
            ("full scan vs LMDB", "lmdb", W::FullScan, 1.0),
            ("bulk load (+ checkpoint) vs redb", "redb", W::BulkLoad, 1.5),
            ("bulk load (+ checkpoint) vs LMDB", "lmdb", W::BulkLoad, 1.0),
            (
                "batch writes (+ checkpoint) vs redb",
                "redb",
                W::BatchWrites,
                1.5,
            ),
            ("removals (+ checkpoint) vs redb", "redb", W::Removals, 1.5),
            (
                "individual durable writes (+ checkpoint) vs redb",
                "redb",
                W::IndividualWrites,
                1.0,
            ),
            ("total vs LMDB", "lmdb", W::Total, 1.2),
        ];
        for (name, peer, w, need) in goals {
            target(name.into(), ratio(peer, w), need);
        }
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

    let _ = writeln!(
        o,
        "\n<details><summary>Every run, {} (seconds; round order)</summary>\n",
        config_name(equal)
    );
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
        let v: Vec<String> = results[*e]
            .iter()
            .map(|r| format!("{:.0}", r.peak_rss_kib as f64 / 1024.0))
            .collect();
        let _ = writeln!(o, "| {e} | peak RSS (MiB) | {} |", v.join(", "));
    }
    let _ = writeln!(o, "\n</details>");

    let mut warned = false;
    for e in &engines {
        for (i, r) in results[*e].iter().enumerate() {
            for w in &r.warnings {
                if !warned {
                    let _ = writeln!(o, "\n#### Correctness warnings ({})\n", config_name(equal));
                    warned = true;
                }
                let _ = writeln!(o, "- **{e}**, run {}: {w}", i + 1);
            }
        }
    }

    if !failures.is_empty() {
        let _ = writeln!(o, "\n#### Failures ({})\n", config_name(equal));
        for (e, msg) in failures {
            let _ = writeln!(o, "- **{e}**: {msg}");
        }
    }
    o
}

fn to_json(
    c: &Config,
    results: &Results,
    failures: &BTreeMap<String, String>,
) -> serde_json::Value {
    use serde_json::{json, Map, Value};
    let s = summarize(results);
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
            });
            if w.ops(c) > 0 {
                o["ops_per_s"] = json!(w.ops(c) as f64 / m);
            }
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
            "memory".into(),
            json!({
                "peak_rss_kib": runs.iter().map(|r| r.peak_rss_kib).collect::<Vec<_>>(),
                "max_phase_end_rss_anon_kib": runs.iter().map(|r| r.anon_kib).collect::<Vec<_>>(),
                "max_phase_end_rss_file_kib": runs.iter().map(|r| r.file_kib).collect::<Vec<_>>(),
            }),
        );
        ws.insert(
            "warnings".into(),
            json!(runs.iter().map(|r| r.warnings.clone()).collect::<Vec<_>>()),
        );
        engines.insert(e.clone(), Value::Object(ws));
    }
    json!({ "engines": engines, "failures": failures })
}

fn main() {
    let c = match parse_args() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    if let Some((name, equal, rep)) = &c.child {
        child_main(&c, name, *equal, *rep);
    }
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
    // configuration -> (results, failures)
    let mut all: BTreeMap<bool, (Results, BTreeMap<String, String>)> = BTreeMap::new();
    let ne = c.engines.len();
    for rep in 0..c.runs {
        eprintln!("round {}/{}", rep + 1, c.runs);
        for &equal in &c.configs {
            let (results, failures) = all.entry(equal).or_default();
            // Round r starts with engine r mod n.
            for i in 0..ne {
                let e = &c.engines[(rep + i) % ne];
                if failures.contains_key(e) {
                    continue;
                }
                match run_child(e, equal, rep, &c.alloc) {
                    Ok(r) => results.entry(e.clone()).or_default().push(r),
                    Err(err) => {
                        eprintln!("  {e} ({}) FAILED: {err}", config_name(equal));
                        failures.insert(e.clone(), format!("round {}: {err}", rep + 1));
                        results.remove(e);
                    }
                }
            }
        }
    }
    probe(&mut mach, "fsync_median_after");
    let mut md = machine_header(&c, &mach);
    let mut json = serde_json::Map::new();
    let mut failed = false;
    for (&equal, (results, failures)) in &all {
        md.push('\n');
        md.push_str(&report(&c, equal, results, failures));
        json.insert(config_name(equal).into(), to_json(&c, results, failures));
        failed |= !failures.is_empty();
    }
    println!("{md}");
    if let Some(path) = &c.json {
        let j = serde_json::json!({
            "machine": mach,
            "config": {
                "runs": c.runs, "n": c.n, "bulk_txn": c.bulk_txn(),
                "bulk_txns": c.bulk_txns(), "key_size": workload::KEY_SIZE,
                "value_size": workload::VALUE_SIZE, "individual_writes": c.individual_writes,
                "batch_txns": c.batch_txns, "batch_size": c.batch_size,
                "range_scans": c.range_scans(), "range_len": c.range_len, "alloc": c.alloc,
                "full_scan_entries": c.scan_entries(),
                "removals": c.removals(), "engines": c.engines, "dir": c.dir,
                "cambium_cache_bytes_override": c.cambium_cache_bytes,
                "cambium_dirty_bytes_override": c.cambium_dirty_bytes,
            },
            "configs": json,
        });
        let text = serde_json::to_string_pretty(&j).expect("json");
        if let Err(e) = std::fs::write(path, text + "\n") {
            eprintln!("error: cannot write {}: {e}", path.display());
            std::process::exit(1);
        }
    }
    if failed {
        std::process::exit(1);
    }
}
