//! Checkpoint metadata bytes against the number of versions.
//!
//! A store of 10,000 keys (100 B values), checkpointed; then snapshots until the store
//! holds `n` versions (`main` included), each taken after one put so every snapshot
//! has its own root (`Deferred`); a checkpoint; then `checkpoints` rounds of one put
//! and `Store::checkpoint`, reading `Stats::meta_bytes_last_checkpoint` after each.

use crate::stat::{fmt_bytes, fmt_us, median};
use crate::workload::Res;
use crate::{key, load, manual_options, Ctx};
use cambium::{Durability, Store};
use serde_json::json;
use std::time::Instant;

pub struct Params {
    pub versions: Vec<u64>,
    pub checkpoints: u64,
}

struct Outcome {
    mean: f64,
    max: f64,
    checkpoint_secs: f64,
}

fn one(ctx: &Ctx, p: &Params, versions: u64, run: usize) -> Res<Outcome> {
    let dir = ctx.fresh_dir(&format!("meta-{versions}-{run}"))?;
    let store = Store::create_with(dir.join("db"), manual_options())?;
    load(&store, 10_000, 10_000, &mut |i| vec![(i % 251) as u8; 100])?;
    store.checkpoint()?;
    for s in 1..versions {
        let mut t = store.begin_write()?;
        t.set_durability(Durability::Deferred);
        t.put(&key(s % 10_000), &[s as u8; 100])?;
        t.commit()?;
        store.snapshot_with("main", &format!("s{s}"), Durability::Deferred)?;
    }
    store.checkpoint()?;
    let (mut bytes, mut secs) = (Vec::new(), Vec::new());
    for c in 0..p.checkpoints {
        let mut t = store.begin_write()?;
        t.set_durability(Durability::Deferred);
        t.put(&key((c * 7919) % 10_000), &[c as u8; 100])?;
        t.commit()?;
        let t = Instant::now();
        store.checkpoint()?;
        secs.push(t.elapsed().as_secs_f64());
        bytes.push(store.stats()?.meta_bytes_last_checkpoint as f64);
    }
    let o = Outcome {
        mean: bytes.iter().sum::<f64>() / bytes.len() as f64,
        max: bytes.iter().copied().fold(0.0, f64::max),
        checkpoint_secs: median(&secs),
    };
    eprintln!(
        "  meta {versions} versions run {run}: mean {} max {}",
        fmt_bytes(o.mean),
        fmt_bytes(o.max)
    );
    store.close()?;
    ctx.remove_dir(&dir);
    Ok(o)
}

pub fn run(ctx: &Ctx, p: &Params) -> Res<(String, serde_json::Value)> {
    let mut md = format!(
        "10,000 keys; N versions; then {} rounds of one put + `checkpoint`; mean and max of \
         `meta_bytes_last_checkpoint` over the rounds; {} run(s), medians of those.\n\n\
         | versions | metadata bytes / checkpoint (mean) | max | checkpoint time (median) |\n|---|---|---|---|\n",
        p.checkpoints, ctx.runs
    );
    let mut js = Vec::new();
    for &n in &p.versions {
        let mut outs = Vec::new();
        for r in 0..ctx.runs {
            outs.push(one(ctx, p, n, r)?);
        }
        let m = |f: &dyn Fn(&Outcome) -> f64| median(&outs.iter().map(f).collect::<Vec<_>>());
        let mean = m(&|o| o.mean);
        md.push_str(&format!(
            "| {n} | {} ({mean:.0} B) | {} | {} |\n",
            fmt_bytes(mean),
            fmt_bytes(m(&|o| o.max)),
            fmt_us(m(&|o| o.checkpoint_secs) * 1e6)
        ));
        js.push(
            json!({"versions": n, "mean_bytes": mean, "max_bytes": m(&|o| o.max),
            "checkpoint_secs": m(&|o| o.checkpoint_secs)}),
        );
    }
    Ok((md, json!(js)))
}
