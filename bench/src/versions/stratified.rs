//! The Stratified B-tree paper's experiment (Twigg et al. §7), beside Sanakirja.
//!
//! One root version to begin with; random 100-byte pairs (24-byte key, 76-byte value)
//! are inserted into random *leaf* versions of the version tree, in transactions of
//! `batch` pairs (one leaf per transaction). Every `inserts_per_version` inserts a new
//! version is made: with probability 1/3 a clone of a random leaf version (which then
//! stops being a leaf), else a clone of a random internal version. After each such
//! interval, `queries` range queries of 1000 pairs run at random versions (any
//! version, leaf or internal). Both engines see the same version tree, the same
//! pairs and the same queries (one seeded generator), and the digest of every query
//! result must match between them.
//!
//! The paper inserts 100,000 pairs between clones (10^8 in all); the default here is
//! scaled down to fit a 2-core machine's benchmark budget (see `--inserts-per-version`).

use crate::kv::{Cambium, EngineCfg, Forkable, Op, Sanakirja};
use crate::stat::{fmt_bytes, fmt_rate, fmt_us, median, us, Digest};
use crate::workload::{Res, Rng};
use crate::Ctx;
use serde_json::json;
use std::path::Path;
use std::time::{Duration, Instant};

pub struct Params {
    pub versions: u32,
    pub inserts_per_version: u64,
    pub batch: u64,
    pub queries: u32,
    pub query_len: usize,
}

const KEY: usize = 24;
const VALUE: usize = 76;

struct Outcome {
    insert_rate: f64,
    query_rate: f64,
    clone_median_us: f64,
    disk: u64,
    digest: Digest,
    inserted: u64,
    queried: u64,
}

fn one<E: Forkable>(ctx: &Ctx, dir: &Path, p: &Params) -> Res<Outcome> {
    let cfg = EngineCfg {
        cambium_cache_bytes: Some(ctx.cambium_cache_bytes),
        durable: true,
    };
    let mut e = E::create(dir, &cfg)?;
    let mut rng = Rng::new(0x57a7);
    // The version tree: which versions are leaves (receive inserts) and which are
    // internal (have been cloned).
    let mut leaves: Vec<u32> = vec![0];
    let mut internal: Vec<u32> = Vec::new();
    let mut next = 1u32;
    let (mut insert_time, mut query_time) = (Duration::ZERO, Duration::ZERO);
    let (mut inserted, mut queried) = (0u64, 0u64);
    let mut clone_us = Vec::new();
    let mut digest = Digest::default();
    let mut buf: Vec<([u8; KEY], [u8; VALUE])> = Vec::with_capacity(p.batch as usize);
    loop {
        // An interval of inserts into random leaves.
        let mut left = p.inserts_per_version;
        while left > 0 {
            let n = left.min(p.batch);
            let leaf = leaves[(rng.next_u64() % leaves.len() as u64) as usize];
            buf.clear();
            for _ in 0..n {
                let (mut k, mut v) = ([0u8; KEY], [0u8; VALUE]);
                rng.fill(&mut k);
                rng.fill(&mut v);
                buf.push((k, v));
            }
            let ops: Vec<Op> = buf.iter().map(|(k, v)| Op::Insert(k, v)).collect();
            let t = Instant::now();
            e.write(leaf, &ops)?;
            insert_time += t.elapsed();
            inserted += n;
            left -= n;
        }
        // Range queries at random versions.
        for _ in 0..p.queries {
            let v = (rng.next_u64() % next as u64) as u32;
            let mut from = [0u8; KEY];
            rng.fill(&mut from);
            let t = Instant::now();
            queried += e.range(v, &from, p.query_len, &mut |k, val| {
                digest.add(k);
                digest.add(val);
            })?;
            query_time += t.elapsed();
        }
        if next >= p.versions {
            break;
        }
        // A new version.
        let from_leaf = internal.is_empty() || rng.next_u64().is_multiple_of(3);
        let src = if from_leaf {
            let i = (rng.next_u64() % leaves.len() as u64) as usize;
            let src = leaves.swap_remove(i);
            internal.push(src);
            src
        } else {
            internal[(rng.next_u64() % internal.len() as u64) as usize]
        };
        let t = Instant::now();
        e.fork(src, next)?;
        clone_us.push(us(t.elapsed()));
        leaves.push(next);
        next += 1;
    }
    e.settle()?;
    let disk = e.disk().1;
    e.close()?;
    Ok(Outcome {
        insert_rate: inserted as f64 / insert_time.as_secs_f64(),
        query_rate: queried as f64 / query_time.as_secs_f64(),
        clone_median_us: median(&clone_us),
        disk,
        digest,
        inserted,
        queried,
    })
}

pub fn run(ctx: &Ctx, p: &Params) -> Res<(String, serde_json::Value)> {
    let engines: Vec<&str> = ["cambium", "sanakirja"]
        .into_iter()
        .filter(|e| ctx.engines.iter().any(|x| x == e))
        .collect();
    let mut results: Vec<Vec<Outcome>> = engines.iter().map(|_| Vec::new()).collect();
    for run in 0..ctx.runs {
        for (ei, &engine) in engines.iter().enumerate() {
            let dir = ctx.fresh_dir(&format!("stratified-{engine}-{run}"))?;
            eprintln!("stratified: run {}/{} {engine}", run + 1, ctx.runs);
            let o = match engine {
                "cambium" => one::<Cambium>(ctx, &dir, p)?,
                _ => one::<Sanakirja>(ctx, &dir, p)?,
            };
            eprintln!(
                "  inserts {}, range queries {} pairs, clone {}, disk {}, digest {:016x}",
                fmt_rate(o.insert_rate),
                fmt_rate(o.query_rate),
                fmt_us(o.clone_median_us),
                fmt_bytes(o.disk as f64),
                o.digest.0
            );
            ctx.remove_dir(&dir);
            results[ei].push(o);
        }
    }
    // Same workload, same answers: a mismatch is a bug in an engine or an adapter.
    let digests: Vec<Digest> = results.iter().flatten().map(|o| o.digest).collect();
    if digests.windows(2).any(|w| w[0] != w[1]) {
        return Err(format!("stratified: range query results differ: {digests:x?}").into());
    }

    let first = &results[0][0];
    let mut md = format!(
        "{} versions; {} pairs of 100 bytes inserted ({} between clones, {} per durable \
         transaction into one random leaf version); {} range queries of {} at random \
         versions after each interval ({} pairs read). {} repetition(s), engines \
         interleaved; medians. Query results are identical between engines (digest \
         `{:016x}`).\n\n\
         | engine | inserts | range query (pairs) | clone (median) | disk after |\n\
         |---|---|---|---|---|\n",
        p.versions,
        first.inserted,
        p.inserts_per_version,
        p.batch,
        p.queries,
        p.query_len,
        first.queried,
        ctx.runs,
        first.digest.0,
    );
    let mut js = Vec::new();
    let med =
        |rs: &[Outcome], f: fn(&Outcome) -> f64| median(&rs.iter().map(f).collect::<Vec<_>>());
    for (ei, &engine) in engines.iter().enumerate() {
        let rs = &results[ei];
        let (ins, q, c, d) = (
            med(rs, |o| o.insert_rate),
            med(rs, |o| o.query_rate),
            med(rs, |o| o.clone_median_us),
            med(rs, |o| o.disk as f64),
        );
        md.push_str(&format!(
            "| {engine} | {} | {} | {} | {} |\n",
            fmt_rate(ins),
            fmt_rate(q),
            fmt_us(c),
            fmt_bytes(d)
        ));
        js.push(json!({
            "engine": engine,
            "insert_per_s": rs.iter().map(|o| o.insert_rate).collect::<Vec<_>>(),
            "range_pairs_per_s": rs.iter().map(|o| o.query_rate).collect::<Vec<_>>(),
            "clone_median_us": rs.iter().map(|o| o.clone_median_us).collect::<Vec<_>>(),
            "disk_bytes": rs.iter().map(|o| o.disk).collect::<Vec<_>>(),
        }));
    }
    if engines.len() == 2 {
        let r = |f: fn(&Outcome) -> f64| med(&results[0], f) / med(&results[1], f);
        md.push_str(&format!(
            "\ncambium / Sanakirja: inserts **{:.2}×**, range queries **{:.2}×**, disk {:.2}× \
             (below 1 is smaller).\n",
            r(|o| o.insert_rate),
            r(|o| o.query_rate),
            r(|o| o.disk as f64),
        ));
    }
    Ok((md, json!(js)))
}
