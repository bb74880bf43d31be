//! cambium-space-bench: what back references, cleaning and checkpoint metadata cost.
//! Backlog's §6.2 write overhead, the back references' size after compaction, their
//! queries, metadata bytes per checkpoint against the number of versions, the
//! cleaner's rate and its effect on a concurrent writer, and the issue's CLI soak.
//!
//! ```text
//! cargo run --release -p cambium-bench --bin cambium-space-bench -- all
//! cargo run --release -p cambium-bench --bin cambium-space-bench -- --quick all
//! ```
//!
//! Run with `--help` for every flag. A markdown report goes to stdout, progress to
//! stderr.

/// The allocator of every engine's child process (bench/Cargo.toml).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "../report.rs"]
mod report;
#[path = "../versions/stat.rs"]
#[allow(dead_code)]
mod stat;
#[path = "../workload.rs"]
#[allow(dead_code)]
mod workload;

mod cleaning;
mod footprint;
mod meta;
mod overhead;
mod soak;

use cambium::{Durability, Options, Store};
use std::path::{Path, PathBuf};
use workload::Res;

const USAGE: &str = "\
cambium-space-bench: back references, cleaning and checkpoint metadata

USAGE: cargo run --release -p cambium-bench --bin cambium-space-bench -- [FLAGS] WORKLOAD...

WORKLOADS (any of; `all` is every one, in this order)
  overhead     Backlog §6.2: back-reference bytes and records per put, write-heavy
  footprint    back-reference bytes / live bytes after shrink; Store::backrefs query time
  meta         checkpoint metadata bytes per checkpoint at 10, 1k, 10k versions
  clean        clean(0.0) MB/s; durable-put latency with and without a concurrent cleaner
  soak         the issue's soak through the CLI (snapshot; batch rewrite; drop)

FLAGS
  --runs N                 repetitions (default 3)
  --quick                  smoke test: small sizes, 1 run
  --dir DIR                parent of the per-run directories (default $TMPDIR or /tmp)
  --keep                   keep the directories
  --json FILE              also write machine-readable results
overhead
  --checkpoints N          checkpoints with small values (default 100)
  --extent-checkpoints N   checkpoints with 4 KiB values (default 30)
  --working-set N          keys, small values (default 200k)
  --extent-working-set N   keys, 4 KiB values (default 32k)
footprint
  --small-keys N           keys of the small-value store (default 1M)
  --extent-keys N          4 KiB values of the extent store (default 64k)
meta
  --versions LIST          version counts (default 10,1k,10k)
  --meta-checkpoints N     put+checkpoint rounds averaged (default 200)
clean
  --clean-keys N           4 KiB values loaded (default 80k: 320 MiB)
soak
  --cli PATH               the cambium binary (default $CARGO_TARGET_DIR/release/cambium)
  --rounds N               rounds (default 26)
  --soak-keys N            keys rewritten per round (default 200k)
  --soak-runs N            repetitions of the soak (default: --runs)
  -h, --help               this text
";

/// What every workload needs from the command line.
pub struct Ctx {
    pub runs: usize,
    dir: PathBuf,
    keep: bool,
}

impl Ctx {
    /// A new empty directory for one run (the store goes in its `db`).
    pub fn fresh_dir(&self, label: &str) -> Res<PathBuf> {
        let d = self
            .dir
            .join(format!("cambium-sbench-{}-{label}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d)?;
        Ok(d)
    }

    pub fn remove_dir(&self, d: &Path) {
        if self.keep {
            eprintln!("  kept {}", d.display());
        } else {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// Options for a store whose checkpoints happen only when the workload asks, and
/// which never cleans on its own (so what is measured is what the workload did).
pub fn manual_options() -> Options {
    Options {
        cache_bytes: 2 << 30,
        checkpoint_wal_bytes: 1 << 50,
        checkpoint_dirty_bytes: 1 << 50,
        checkpoint_interval: None,
        background_checkpoints: false,
        auto_clean_dead_percent: None,
        ..Options::default()
    }
}

/// A fixed-width key of index `i` (24 bytes, as the soak's).
pub fn key(i: u64) -> Vec<u8> {
    format!("key{i:021}").into_bytes()
}

/// Loads keys `0..n` with values from `value`, in `Deferred` transactions of `batch`.
pub fn load(store: &Store, n: u64, batch: u64, value: &mut dyn FnMut(u64) -> Vec<u8>) -> Res<()> {
    let mut i = 0;
    while i < n {
        let mut t = store.begin_write()?;
        t.set_durability(Durability::Deferred);
        for j in i..(i + batch).min(n) {
            t.put(&key(j), &value(j))?;
        }
        t.commit()?;
        i += batch;
    }
    Ok(())
}

/// Files of `dir` whose names start with `prefix` and end with `suffix`, with sizes.
pub fn files(dir: &Path, prefix: &str, suffix: &str) -> Res<Vec<(String, u64)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(prefix) && name.ends_with(suffix) {
            out.push((name, e.metadata()?.len()));
        }
    }
    out.sort();
    Ok(out)
}

struct Config {
    ctx: Ctx,
    workloads: Vec<String>,
    json: Option<PathBuf>,
    overhead: overhead::Params,
    footprint: footprint::Params,
    meta: meta::Params,
    clean: cleaning::Params,
    soak: soak::Params,
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

fn default_cli() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target"));
    target.join("release").join("cambium")
}

fn defaults() -> Config {
    Config {
        ctx: Ctx {
            runs: 3,
            dir: std::env::temp_dir(),
            keep: false,
        },
        workloads: Vec::new(),
        json: None,
        overhead: overhead::Params {
            checkpoints: 100,
            extent_checkpoints: 30,
            working_set: 200_000,
            extent_working_set: 32_000,
            puts_per_checkpoint: 32_000,
        },
        footprint: footprint::Params {
            small_keys: 1_000_000,
            extent_keys: 65_536,
            more_checkpoints: 100,
        },
        meta: meta::Params {
            versions: vec![10, 1000, 10_000],
            checkpoints: 200,
        },
        clean: cleaning::Params { keys: 80_000 },
        soak: soak::Params {
            cli: default_cli(),
            rounds: 26,
            keys: 200_000,
            runs: None,
        },
    }
}

fn parse_args() -> Result<Config, String> {
    let mut c = defaults();
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
            "--quick" => quick = true,
            "--dir" => c.ctx.dir = args.next().ok_or("--dir needs a value")?.into(),
            "--keep" => c.ctx.keep = true,
            "--json" => c.json = Some(args.next().ok_or("--json needs a value")?.into()),
            "--checkpoints" => c.overhead.checkpoints = n(&mut args)?.max(1),
            "--extent-checkpoints" => c.overhead.extent_checkpoints = n(&mut args)?.max(1),
            "--working-set" => c.overhead.working_set = n(&mut args)?.max(1000),
            "--extent-working-set" => c.overhead.extent_working_set = n(&mut args)?.max(1000),
            "--small-keys" => c.footprint.small_keys = n(&mut args)?.max(1000),
            "--extent-keys" => c.footprint.extent_keys = n(&mut args)?.max(1000),
            "--versions" => {
                let v = args.next().ok_or("--versions needs a value")?;
                c.meta.versions = v
                    .split(',')
                    .map(|s| parse_count("--versions", Some(s.trim().to_string())))
                    .collect::<Result<_, _>>()?;
            }
            "--meta-checkpoints" => c.meta.checkpoints = n(&mut args)?.max(1),
            "--clean-keys" => c.clean.keys = n(&mut args)?.max(1000),
            "--cli" => c.soak.cli = args.next().ok_or("--cli needs a value")?.into(),
            "--rounds" => c.soak.rounds = n(&mut args)?.max(1) as u32,
            "--soak-keys" => c.soak.keys = n(&mut args)?.max(1),
            "--soak-runs" => c.soak.runs = Some((n(&mut args)? as usize).max(1)),
            "overhead" | "footprint" | "meta" | "clean" | "soak" => c.workloads.push(a.clone()),
            "all" => c
                .workloads
                .extend(["overhead", "footprint", "meta", "clean", "soak"].map(String::from)),
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    if c.workloads.is_empty() {
        return Err("name a workload: overhead, footprint, meta, clean, soak or all".into());
    }
    if quick {
        c.ctx.runs = 1;
        c.overhead.checkpoints = 6;
        c.overhead.extent_checkpoints = 3;
        c.overhead.working_set = 20_000;
        c.overhead.extent_working_set = 4000;
        c.overhead.puts_per_checkpoint = 4000;
        c.footprint.small_keys = 50_000;
        c.footprint.extent_keys = 4000;
        c.footprint.more_checkpoints = 10;
        c.meta.versions = vec![10, 100];
        c.meta.checkpoints = 20;
        c.clean.keys = 8000;
        c.soak.rounds = 3;
        c.soak.keys = 10_000;
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
            eprintln!("cambium-space-bench: {e}");
            std::process::exit(2);
        }
    };
    report::run_workloads(
        "cambium-space-bench",
        "cambium space benchmarks",
        &c.workloads,
        c.json.as_deref(),
        |w| match w {
            "overhead" => overhead::run(&c.ctx, &c.overhead),
            "footprint" => footprint::run(&c.ctx, &c.footprint),
            "meta" => meta::run(&c.ctx, &c.meta),
            "clean" => cleaning::run(&c.ctx, &c.clean),
            _ => soak::run(&c.ctx, &c.soak),
        },
    );
}
