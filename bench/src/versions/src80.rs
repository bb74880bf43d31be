//! Rodeh §7.5: many clones under a modified SRC-80.
//!
//! A base tree of `base` keys (the even numbers of `0..2*base`, as 8-byte big-endian
//! keys, so "consecutive" means what it says) with 64-byte values, made durable. Then
//! either nothing more (the single tree) or `clones` branches of it. The timed part:
//! `runs` times, pick an operation (80% lookup, 10% insert, 10% remove), a random start
//! `k`, and a version (the base for the single tree; a random clone otherwise), and
//! apply the operation to the 100 consecutive keys `k..k+100` in one transaction.
//! Throughput is key operations per second. Both variants start with a cold engine
//! cache (the store is reopened after the load: "no warm-up of the clones").
//!
//! The goal: clones at least 0.9× the single tree.

use crate::kv::{Cambium, EngineCfg, Forkable, Op, Sanakirja};
use crate::stat::{fmt_bytes, fmt_count, fmt_rate, median};
use crate::workload::{Res, Rng};
use crate::Ctx;
use serde_json::json;
use std::path::Path;
use std::time::Instant;

pub struct Params {
    pub base: u64,
    pub clones: u32,
    pub op_runs: u64,
    /// cambium's node cache as a percentage of the base tree's bytes (100 = the
    /// default cache, which holds it all).
    pub cache_pcts: Vec<u32>,
    /// Whether write transactions wait for their fsync.
    pub durable: bool,
}

const RUN: u64 = 100;
const VALUE: usize = 64;

fn key(i: u64) -> [u8; 8] {
    i.to_be_bytes()
}

fn value(i: u64, salt: u64) -> [u8; VALUE] {
    let mut v = [0u8; VALUE];
    Rng::new(i ^ salt.rotate_left(17)).fill(&mut v);
    v
}

struct Outcome {
    ops_per_s: f64,
    found: u64,
    cache_bytes: Option<usize>,
}

fn one<E: Forkable>(ctx: &Ctx, dir: &Path, p: &Params, clones: u32, pct: u32) -> Res<Outcome> {
    let cfg = EngineCfg {
        cambium_cache_bytes: Some(ctx.cambium_cache_bytes),
        durable: p.durable,
    };
    let mut e = E::create(dir, &cfg)?;
    let mut i = 0;
    while i < p.base {
        let m = (p.base - i).min(200_000);
        let kv: Vec<([u8; 8], [u8; VALUE])> =
            (i..i + m).map(|j| (key(2 * j), value(2 * j, 0))).collect();
        let ops: Vec<Op> = kv.iter().map(|(k, v)| Op::Insert(k, v)).collect();
        e.write(0, &ops)?;
        i += m;
    }
    for c in 1..=clones {
        e.fork(0, c)?;
    }
    e.settle()?;
    let mut cache_bytes = None;
    if pct < 100 {
        let live = e.live_bytes().unwrap_or(0);
        let b = ((live as u128 * pct as u128 / 100) as usize).max(1 << 20);
        e.set_cache_bytes(b);
        cache_bytes = Some(b);
    }
    let mut e = e.reopen()?;

    let mut rng = Rng::new(0x5c80);
    let span = 2 * p.base - RUN;
    let mut found = 0;
    let t = Instant::now();
    for _ in 0..p.op_runs {
        let op = rng.next_u64() % 10;
        let k = rng.next_u64() % span;
        let v = if clones == 0 {
            0
        } else {
            1 + (rng.next_u64() % clones as u64) as u32
        };
        let keys: Vec<[u8; 8]> = (k..k + RUN).map(key).collect();
        match op {
            0..=7 => {
                found += e.get_many(v, &mut keys.iter().map(|k| &k[..]))?.0;
            }
            8 => {
                let vals: Vec<[u8; VALUE]> = (k..k + RUN).map(|j| value(j, 1)).collect();
                let ops: Vec<Op> = keys.iter().zip(&vals).map(|(k, v)| Op::Put(k, v)).collect();
                e.write(v, &ops)?;
            }
            _ => {
                let ops: Vec<Op> = keys.iter().map(|k| Op::Del(k)).collect();
                e.write(v, &ops)?;
            }
        }
    }
    let secs = t.elapsed().as_secs_f64();
    e.close()?;
    Ok(Outcome {
        ops_per_s: (p.op_runs * RUN) as f64 / secs,
        found,
        cache_bytes,
    })
}

pub fn run(ctx: &Ctx, p: &Params) -> Res<(String, serde_json::Value)> {
    let engines: Vec<&str> = ["cambium", "sanakirja"]
        .into_iter()
        .filter(|e| ctx.engines.iter().any(|x| x == e))
        .collect();
    let mut md = format!(
        "Base tree {} keys; {} clones; {} runs of 100 key operations ({} key ops) per \
         measurement; write transactions {}; {} repetition(s), single tree and clones \
         interleaved; medians.\n\n\
         | engine | cache | single tree | {} clones | clones / single |\n|---|---|---|---|---|\n",
        fmt_count(p.base),
        p.clones,
        fmt_count(p.op_runs),
        fmt_count(p.op_runs * RUN),
        if p.durable {
            "durable (cambium: WAL fsync; Sanakirja: commit)"
        } else {
            "cambium `Deferred`, Sanakirja durable"
        },
        ctx.runs,
        p.clones,
    );
    let mut js = Vec::new();
    for &engine in &engines {
        // Sanakirja is a memory map: its cache is the OS's; one row.
        let pcts: Vec<u32> = if engine == "cambium" {
            p.cache_pcts.clone()
        } else {
            vec![100]
        };
        for &pct in &pcts {
            let (mut single, mut cloned) = (Vec::new(), Vec::new());
            let mut cache = None;
            for run in 0..ctx.runs {
                for (clones, out) in [(0, &mut single), (p.clones, &mut cloned)] {
                    let dir = ctx.fresh_dir(&format!("src80-{engine}-{pct}-{clones}-{run}"))?;
                    eprintln!(
                        "src80: run {}/{} {engine} cache {pct}% clones {clones}",
                        run + 1,
                        ctx.runs
                    );
                    let o = match engine {
                        "cambium" => one::<Cambium>(ctx, &dir, p, clones, pct)?,
                        _ => one::<Sanakirja>(ctx, &dir, p, clones, pct)?,
                    };
                    eprintln!(
                        "  {} key ops ({} lookups found)",
                        fmt_rate(o.ops_per_s),
                        o.found
                    );
                    ctx.remove_dir(&dir);
                    cache = o.cache_bytes;
                    out.push(o.ops_per_s);
                }
            }
            let (s, c) = (median(&single), median(&cloned));
            let cache_label = match cache {
                Some(b) => format!("{pct}% of the tree ({})", fmt_bytes(b as f64)),
                None if engine == "cambium" => {
                    format!(
                        "{} (holds it all)",
                        fmt_bytes(ctx.cambium_cache_bytes as f64)
                    )
                }
                None => "OS page cache".into(),
            };
            md.push_str(&format!(
                "| {engine} | {cache_label} | {} | {} | **{:.2}×** |\n",
                fmt_rate(s),
                fmt_rate(c),
                c / s
            ));
            js.push(json!({
                "engine": engine, "cache_pct": pct, "cache_bytes": cache,
                "single_ops_per_s": single, "clones_ops_per_s": cloned,
                "median_single": s, "median_clones": c, "ratio": c / s,
            }));
        }
    }
    Ok((md, json!(js)))
}
