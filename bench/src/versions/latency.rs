//! Snapshot and branch latency against store size.
//!
//! For each size: a fresh store loaded with `n` random pairs (16-byte keys, 32-byte
//! values), made durable. Then, `clones` times: 10 random puts into the source
//! (untimed, so the source always has changes not yet checkpointed: the clone must
//! be taken of unwritten state too), a timed snapshot of the source, and a timed
//! branch of that snapshot. Each is durable on return (cambium: WAL fsync; Sanakirja:
//! `fork_db` + commit; redb: `persistent_savepoint` + commit). The claim under test:
//! the cost is flat in the store size.

use crate::kv::{Cambium, EngineCfg, Forkable, Op, Sanakirja};
use crate::stat::{fmt_count, fmt_us, max, median, quantile, us};
use crate::workload::{Res, Rng};
use crate::Ctx;
use serde_json::json;
use std::path::Path;
use std::time::Instant;

pub struct Params {
    pub sizes: Vec<u64>,
    pub clones: u32,
}

/// Samples of one (engine, size, run): snapshot and branch latencies in µs.
#[derive(Default, Clone)]
struct Samples {
    snapshot: Vec<f64>,
    branch: Vec<f64>,
    /// Snapshots that do not wait for their fsync: the operation's own cost.
    deferred: Vec<f64>,
    load_s: f64,
}

const KEY: usize = 16;
const VALUE: usize = 32;
const LOAD_TXN: u64 = 200_000;

fn random_pair(rng: &mut Rng) -> ([u8; KEY], [u8; VALUE]) {
    let (mut k, mut v) = ([0; KEY], [0; VALUE]);
    rng.fill(&mut k);
    rng.fill(&mut v);
    (k, v)
}

/// One transaction on version 0 inserting `n` random pairs.
fn insert_random<E: Forkable>(e: &mut E, n: u64, rng: &mut Rng) -> Res<()> {
    let pairs: Vec<_> = (0..n).map(|_| random_pair(rng)).collect();
    let ops: Vec<Op> = pairs.iter().map(|(k, v)| Op::Insert(k, v)).collect();
    e.write(0, &ops)
}

fn load<E: Forkable>(e: &mut E, n: u64, rng: &mut Rng) -> Res<()> {
    let mut done = 0;
    while done < n {
        let m = (n - done).min(LOAD_TXN);
        insert_random(e, m, rng)?;
        done += m;
    }
    Ok(())
}

fn run_forkable<E: Forkable>(ctx: &Ctx, dir: &Path, n: u64, p: &Params) -> Res<Samples> {
    let cfg = EngineCfg {
        cambium_cache_bytes: Some(ctx.cambium_cache_bytes),
        durable: true,
    };
    let mut e = E::create(dir, &cfg)?;
    let mut rng = Rng::new(0x5eed_0000 + n);
    let t = Instant::now();
    load(&mut e, n, &mut rng)?;
    e.settle()?;
    let mut s = Samples {
        load_s: t.elapsed().as_secs_f64(),
        ..Samples::default()
    };
    for i in 0..p.clones {
        insert_random(&mut e, 10, &mut rng)?;
        let (snap, br) = (2 * i + 1, 2 * i + 2);
        let t = Instant::now();
        e.snapshot(0, snap)?;
        s.snapshot.push(us(t.elapsed()));
        let t = Instant::now();
        e.fork(snap, br)?;
        s.branch.push(us(t.elapsed()));
    }
    for i in 0..p.clones {
        insert_random(&mut e, 10, &mut rng)?;
        let t = Instant::now();
        if !e.snapshot_deferred(0, 2 * p.clones + 1 + i)? {
            break;
        }
        s.deferred.push(us(t.elapsed()));
    }
    e.close()?;
    Ok(s)
}

const REDB_TABLE: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("bench");

/// redb has read-only savepoints (no writable clones): the "snapshot" column.
fn run_redb(dir: &Path, n: u64, p: &Params) -> Res<Samples> {
    let db = redb::Database::create(dir.join("redb.db"))?;
    let mut rng = Rng::new(0x5eed_0000 + n);
    let t = Instant::now();
    let mut done = 0;
    while done < n {
        let m = (n - done).min(LOAD_TXN);
        let txn = db.begin_write()?;
        {
            let mut table = txn.open_table(REDB_TABLE)?;
            for _ in 0..m {
                let (k, v) = random_pair(&mut rng);
                table.insert(&k[..], &v[..])?;
            }
        }
        txn.commit()?;
        done += m;
    }
    let mut s = Samples {
        load_s: t.elapsed().as_secs_f64(),
        ..Samples::default()
    };
    for _ in 0..p.clones {
        let txn = db.begin_write()?;
        {
            let mut table = txn.open_table(REDB_TABLE)?;
            for _ in 0..10 {
                let (k, v) = random_pair(&mut rng);
                table.insert(&k[..], &v[..])?;
            }
        }
        txn.commit()?;
        let t = Instant::now();
        let txn = db.begin_write()?;
        txn.persistent_savepoint()?;
        txn.commit()?;
        s.snapshot.push(us(t.elapsed()));
    }
    Ok(s)
}

pub fn run(ctx: &Ctx, p: &Params) -> Res<(String, serde_json::Value)> {
    let engines: Vec<&str> = ["cambium", "sanakirja", "redb"]
        .into_iter()
        .filter(|e| ctx.engines.iter().any(|x| x == e))
        .collect();
    // samples[engine][size] = one Samples per run, concatenated.
    let mut all: Vec<Vec<Vec<Samples>>> = vec![vec![Vec::new(); p.sizes.len()]; engines.len()];
    for run in 0..ctx.runs {
        for (si, &n) in p.sizes.iter().enumerate() {
            for (ei, &engine) in engines.iter().enumerate() {
                let dir = ctx.fresh_dir(&format!("latency-{engine}-{n}-{run}"))?;
                eprintln!(
                    "latency: run {}/{} {engine} {} keys",
                    run + 1,
                    ctx.runs,
                    fmt_count(n)
                );
                let s = match engine {
                    "cambium" => run_forkable::<Cambium>(ctx, &dir, n, p)?,
                    "sanakirja" => run_forkable::<Sanakirja>(ctx, &dir, n, p)?,
                    _ => run_redb(&dir, n, p)?,
                };
                eprintln!(
                    "  loaded in {:.1} s; snapshot median {}, branch median {}",
                    s.load_s,
                    fmt_us(median(&s.snapshot)),
                    fmt_us(median(&s.branch))
                );
                ctx.remove_dir(&dir);
                all[ei][si].push(s);
            }
        }
    }

    let mut md = String::new();
    md.push_str(&format!(
        "{} clones per size and run, {} run(s); each durable on return. Median / p99 / max, \
         all runs pooled.\n\n",
        p.clones, ctx.runs
    ));
    md.push_str("| engine | operation |");
    for &n in &p.sizes {
        md.push_str(&format!(" {} keys |", fmt_count(n)));
    }
    md.push_str("\n|---|---|");
    for _ in &p.sizes {
        md.push_str("---|");
    }
    md.push('\n');
    let mut js = Vec::new();
    for (ei, &engine) in engines.iter().enumerate() {
        type Pick = fn(&Samples) -> &Vec<f64>;
        let ops: &[(&str, Pick)] = match engine {
            "redb" => &[("persistent savepoint", |s| &s.snapshot)],
            "sanakirja" => &[("fork_db (writable)", |s| &s.snapshot)],
            _ => &[
                ("snapshot", |s| &s.snapshot),
                ("branch", |s| &s.branch),
                ("snapshot, `Deferred` (no fsync wait)", |s| &s.deferred),
            ],
        };
        for (label, pick) in ops {
            md.push_str(&format!("| {engine} | {label} |"));
            for (si, &n) in p.sizes.iter().enumerate() {
                let xs: Vec<f64> = all[ei][si].iter().flat_map(|s| pick(s).clone()).collect();
                md.push_str(&format!(
                    " {} / {} / {} |",
                    fmt_us(median(&xs)),
                    fmt_us(quantile(&xs, 0.99)),
                    fmt_us(max(&xs))
                ));
                js.push(json!({
                    "engine": engine, "operation": label, "keys": n,
                    "median_us": median(&xs), "p99_us": quantile(&xs, 0.99), "max_us": max(&xs),
                    "samples": xs.len(),
                    "load_s": all[ei][si].iter().map(|s| s.load_s).collect::<Vec<_>>(),
                }));
            }
            md.push('\n');
        }
    }
    Ok((md, json!(js)))
}
