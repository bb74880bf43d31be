//! cambium-versions-bench: the version benchmarks. Snapshot/branch latency against
//! store size, Rodeh's 256-clone SRC-80, the Stratified B-tree paper's 1000-version
//! experiment beside Sanakirja, and BetrFS's nimble-clone rounds.
//!
//! ```text
//! cargo run --release -p cambium-bench --bin cambium-versions-bench -- all
//! cargo run --release -p cambium-bench --bin cambium-versions-bench -- --quick all
//! ```
//!
//! Run with `--help` for every flag. A markdown report goes to stdout, progress to
//! stderr.

/// The allocator of every engine's child process (bench/Cargo.toml).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "../report.rs"]
mod report;
#[path = "../workload.rs"]
#[allow(dead_code)]
mod workload;

mod kv;
mod latency;
mod nimble;
mod src80;
mod stat;
mod stratified;

use std::path::PathBuf;
use workload::Res;

const USAGE: &str = "\
cambium-versions-bench: snapshots, clones and versions, cambium beside its peers

USAGE: cargo run --release -p cambium-bench --bin cambium-versions-bench -- [FLAGS] WORKLOAD...

WORKLOADS (any of; `all` is every one, in this order)
  latency      snapshot and branch latency against store size (cambium, Sanakirja, redb)
  src80        Rodeh §7.5: 256 clones under modified SRC-80 vs a single tree (cambium, Sanakirja)
  stratified   Stratified B-tree §7: 1000 versions, inserts into leaves, range queries (cambium, Sanakirja)
  nimble       BetrFS §5.1 Dookubench on key ranges (cambium)

FLAGS
  --runs N                 repetitions, engines/variants interleaved within each (default 3)
  --engines LIST           comma list of cambium,sanakirja,redb (default all)
  --quick                  smoke test: small sizes, 1 run
  --dir DIR                parent of the per-run directories (default $TMPDIR or /tmp)
  --keep                   keep the directories
  --json FILE              also write machine-readable results
  --cambium-cache-mib N    cambium's node cache (default 4096, the budget the main benchmark gives every engine)
latency
  --sizes LIST             store sizes in keys (default 10k,100k,1M,10M)
  --clones N               snapshot+branch pairs timed per size (default 100)
src80
  --base N                 keys in the base tree (default 1M)
  --clone-count N          clones (default 256)
  --op-runs N              runs of 100 key ops timed (default 20k)
  --cache-pcts LIST        cambium node cache as % of the tree (default 100,5)
  --deferred               cambium commits do not wait for fsync (tree cost only)
stratified
  --versions N             versions in the end (default 1000)
  --inserts-per-version N  pairs inserted between clones (default 2000; the paper: 100000)
  --batch N                pairs per transaction (default 500)
  --queries N              range queries after each interval (default 2)
nimble
  --objects N              objects (default 64)
  --object-mib N           MiB per object (default 4)
  --rounds N               rounds (default 16)
  -h, --help               this text
";

/// What every workload needs from the command line.
pub struct Ctx {
    pub runs: usize,
    pub engines: Vec<String>,
    /// cambium's node cache (the default budget of every workload but src80's small-cache row).
    pub cambium_cache_bytes: usize,
    dir: PathBuf,
    keep: bool,
}

impl Ctx {
    /// A new empty directory for one engine run.
    pub fn fresh_dir(&self, label: &str) -> Res<PathBuf> {
        let d = self
            .dir
            .join(format!("cambium-vbench-{}-{label}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d)?;
        Ok(d)
    }

    pub fn remove_dir(&self, d: &std::path::Path) {
        if self.keep {
            eprintln!("  kept {}", d.display());
        } else {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

struct Config {
    ctx: Ctx,
    workloads: Vec<String>,
    json: Option<PathBuf>,
    latency: latency::Params,
    src80: src80::Params,
    stratified: stratified::Params,
    nimble: nimble::Params,
}

fn parse_count(flag: &str, v: Option<String>) -> Result<u64, String> {
    let v = v.ok_or_else(|| format!("{flag} needs a value"))?;
    let s = v.replace(['_', ','], "").to_ascii_lowercase();
    let (digits, mult) = match s.strip_suffix('k') {
        Some(d) => (d, 1_000),
        None => match s.strip_suffix('m') {
            Some(d) => (d, 1_000_000),
            None => (s.as_str(), 1),
        },
    };
    digits
        .parse::<u64>()
        .map(|n| n * mult)
        .map_err(|_| format!("{flag}: not a number: {v}"))
}

fn parse_list(flag: &str, v: Option<String>) -> Result<Vec<u64>, String> {
    let v = v.ok_or_else(|| format!("{flag} needs a value"))?;
    v.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| parse_count(flag, Some(s.trim().to_string())))
        .collect()
}

fn parse_args() -> Result<Config, String> {
    let mut c = Config {
        ctx: Ctx {
            runs: 3,
            engines: vec!["cambium".into(), "sanakirja".into(), "redb".into()],
            // As in the main benchmark: the 4 GiB redb's cache and LMDB's map get.
            // Sanakirja maps its file and uses whatever the OS page cache holds.
            cambium_cache_bytes: 4 << 30,
            dir: std::env::temp_dir(),
            keep: false,
        },
        workloads: Vec::new(),
        json: None,
        latency: latency::Params {
            sizes: vec![10_000, 100_000, 1_000_000, 10_000_000],
            clones: 100,
        },
        src80: src80::Params {
            base: 1_000_000,
            clones: 256,
            op_runs: 20_000,
            cache_pcts: vec![100, 5],
            durable: true,
        },
        stratified: stratified::Params {
            versions: 1000,
            inserts_per_version: 2000,
            batch: 500,
            queries: 2,
            query_len: 1000,
        },
        nimble: nimble::Params {
            objects: 64,
            object_mib: 4,
            rounds: 16,
        },
    };
    let mut quick = false;
    let mut runs = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let n = |args: &mut dyn Iterator<Item = String>| parse_count(&a, args.next());
        match a.as_str() {
            "-h" | "--help" => {
                print!("{USAGE}");
                std::process::exit(0);
            }
            "--runs" => runs = Some((n(&mut args)? as usize).max(1)),
            "--engines" => {
                let v = args.next().ok_or("--engines needs a value")?;
                c.ctx.engines = v
                    .split(',')
                    .map(|s| s.trim().to_ascii_lowercase())
                    .collect();
                for e in &c.ctx.engines {
                    if !["cambium", "sanakirja", "redb"].contains(&e.as_str()) {
                        return Err(format!("unknown engine {e:?} (cambium, sanakirja, redb)"));
                    }
                }
            }
            "--quick" => quick = true,
            "--cambium-cache-mib" => c.ctx.cambium_cache_bytes = (n(&mut args)? as usize) << 20,
            "--dir" => c.ctx.dir = args.next().ok_or("--dir needs a value")?.into(),
            "--keep" => c.ctx.keep = true,
            "--json" => c.json = Some(args.next().ok_or("--json needs a value")?.into()),
            "--sizes" => c.latency.sizes = parse_list(&a, args.next())?,
            "--clones" => c.latency.clones = n(&mut args)?.max(1) as u32,
            "--base" => c.src80.base = n(&mut args)?.max(100),
            "--clone-count" => c.src80.clones = n(&mut args)?.max(1) as u32,
            "--op-runs" => c.src80.op_runs = n(&mut args)?.max(1),
            "--cache-pcts" => {
                c.src80.cache_pcts = parse_list(&a, args.next())?
                    .into_iter()
                    .map(|p| p.clamp(1, 100) as u32)
                    .collect()
            }
            "--deferred" => c.src80.durable = false,
            "--versions" => c.stratified.versions = n(&mut args)?.max(1) as u32,
            "--inserts-per-version" => c.stratified.inserts_per_version = n(&mut args)?.max(1),
            "--batch" => c.stratified.batch = n(&mut args)?.max(1),
            "--queries" => c.stratified.queries = n(&mut args)? as u32,
            "--objects" => c.nimble.objects = n(&mut args)?.max(1) as u32,
            "--object-mib" => c.nimble.object_mib = n(&mut args)?.max(1) as u32,
            "--rounds" => c.nimble.rounds = n(&mut args)?.max(1) as u32,
            "latency" | "src80" | "stratified" | "nimble" => c.workloads.push(a.clone()),
            "all" => c
                .workloads
                .extend(["latency", "src80", "stratified", "nimble"].map(String::from)),
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    if c.workloads.is_empty() {
        return Err(
            "name a workload: latency, src80, stratified, nimble or all (try --help)".into(),
        );
    }
    if quick {
        c.ctx.runs = 1;
        c.latency.sizes = vec![10_000, 100_000];
        c.latency.clones = 20;
        c.src80.base = 100_000;
        c.src80.clones = 64;
        c.src80.op_runs = 2_000;
        c.stratified.versions = 50;
        c.stratified.inserts_per_version = 1000;
        c.nimble.objects = 8;
        c.nimble.rounds = 4;
    }
    if let Some(r) = runs {
        c.ctx.runs = r;
    }
    Ok(c)
}

fn main() {
    let c = match parse_args() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cambium-versions-bench: {e}");
            std::process::exit(2);
        }
    };
    report::run_workloads(
        "cambium-versions-bench",
        "cambium version benchmarks",
        &c.workloads,
        c.json.as_deref(),
        |w| match w {
            "latency" => latency::run(&c.ctx, &c.latency),
            "src80" => src80::run(&c.ctx, &c.src80),
            "stratified" => stratified::run(&c.ctx, &c.stratified),
            _ => nimble::run(&c.ctx, &c.nimble),
        },
    );
}
