//! Backlog §6.2: the write overhead of back references under a write-heavy workload.
//!
//! A working set of keys is loaded and checkpointed (untimed, not counted). Then
//! `checkpoints` intervals of `puts_per_checkpoint` random puts each (1,000 per
//! `Deferred` transaction), 10% of them rewriting one of the last 1,000 keys written
//! (Backlog's duplicates), each interval ended by `Store::checkpoint`. Every 14th
//! checkpoint a snapshot of `main` is taken and, when two exist, the oldest is dropped
//! (about 7 clones per 100 checkpoints). The engine counts what its back references
//! wrote (`Stats::backref_written_bytes` and `_records`: level-0 runs and compactions
//! alike) and the time it spent on them (`Stats::backref_nanos`: recording edges as
//! nodes are written and freed, writing runs with their fsyncs, compacting); the
//! differences over the measured checkpoints are reported per put. A compacting
//! checkpoint's merged run is the store's whole record count after it.

use crate::stat::{fmt_bytes, fmt_us, median};
use crate::workload::{Res, Rng};
use crate::{key, load, manual_options, Ctx};
use cambium::{Durability, Store};
use serde_json::json;
use std::collections::VecDeque;
use std::time::Instant;

pub struct Params {
    pub checkpoints: u64,
    pub extent_checkpoints: u64,
    pub working_set: u64,
    pub extent_working_set: u64,
    pub puts_per_checkpoint: u64,
}

#[derive(Clone, Copy)]
struct Variant {
    label: &'static str,
    value_bytes: usize,
    working_set: u64,
    checkpoints: u64,
}

#[derive(Default)]
struct Outcome {
    ops: u64,
    run_bytes: u64,
    level0_records: u64,
    compact_records: u64,
    compactions: u64,
    put_secs: f64,
    checkpoint_secs: Vec<f64>,
    final_runs: u64,
    final_backref_bytes: u64,
    live_bytes: u64,
    /// `Stats::backref_nanos` over the measured checkpoints.
    backref_nanos: u64,
}

const BATCH: u64 = 1000;
const RECENT: usize = 1000;
const SNAPSHOT_EVERY: u64 = 14;

fn value(rng: &mut Rng, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rng.fill(&mut v);
    v
}

/// One interval of puts; returns the seconds spent.
fn interval(
    store: &Store,
    v: Variant,
    n: u64,
    rng: &mut Rng,
    recent: &mut VecDeque<u64>,
) -> Res<f64> {
    let t = Instant::now();
    let mut done = 0;
    while done < n {
        let mut txn = store.begin_write()?;
        txn.set_durability(Durability::Deferred);
        for _ in 0..BATCH.min(n - done) {
            let dup = rng.next_u64().is_multiple_of(10) && !recent.is_empty();
            let i = if dup {
                recent[(rng.next_u64() % recent.len() as u64) as usize]
            } else {
                rng.next_u64() % v.working_set
            };
            txn.put(&key(i), &value(rng, v.value_bytes))?;
            if recent.len() == RECENT {
                recent.pop_front();
            }
            recent.push_back(i);
        }
        txn.commit()?;
        done += BATCH.min(n - done);
    }
    Ok(t.elapsed().as_secs_f64())
}

fn one(ctx: &Ctx, p: &Params, v: Variant, run: usize) -> Res<Outcome> {
    let dir = ctx.fresh_dir(&format!("overhead-{}-{run}", v.label))?;
    let db = dir.join("db");
    let store = Store::create_with(&db, manual_options())?;
    let mut rng = Rng::new(0x0bac_1e90 + run as u64);
    load(&store, v.working_set, 10_000, &mut |_| {
        value(&mut rng, v.value_bytes)
    })?;
    store.checkpoint()?;
    let mut o = Outcome::default();
    let mut recent = VecDeque::with_capacity(RECENT);
    let mut snaps: VecDeque<String> = VecDeque::new();
    let start = store.stats()?;
    let mut before = start.clone();
    for c in 0..v.checkpoints {
        o.put_secs += interval(&store, v, p.puts_per_checkpoint, &mut rng, &mut recent)?;
        o.ops += p.puts_per_checkpoint;
        let t = Instant::now();
        store.checkpoint()?;
        o.checkpoint_secs.push(t.elapsed().as_secs_f64());
        let after = store.stats()?;
        if after.backref_compactions > before.backref_compactions {
            // The merged run is all the store holds now; the rest was level 0.
            o.compactions += 1;
            o.compact_records += after.backref_records;
        }
        before = after;
        if c % SNAPSHOT_EVERY == SNAPSHOT_EVERY - 1 {
            let name = format!("s{c}");
            store.snapshot("main", &name)?;
            snaps.push_back(name);
            if snaps.len() > 2 {
                store.drop_version(&snaps.pop_front().expect("three snapshots"))?;
            }
        }
    }
    o.run_bytes = before.backref_written_bytes - start.backref_written_bytes;
    o.level0_records =
        (before.backref_written_records - start.backref_written_records) - o.compact_records;
    o.backref_nanos = before.backref_nanos - start.backref_nanos;
    let s = store.stats()?;
    o.final_runs = s.backref_runs;
    o.final_backref_bytes = s.backref_bytes;
    o.live_bytes = s.live_bytes;
    eprintln!(
        "  overhead {} run {run}: {} ops, {} of runs written, {} level-0 + {} compacted records, {} compactions",
        v.label,
        o.ops,
        fmt_bytes(o.run_bytes as f64),
        o.level0_records,
        o.compact_records,
        o.compactions
    );
    store.close()?;
    ctx.remove_dir(&dir);
    Ok(o)
}

pub fn run(ctx: &Ctx, p: &Params) -> Res<(String, serde_json::Value)> {
    let variants = [
        Variant {
            label: "100 B values (nodes)",
            value_bytes: 100,
            working_set: p.working_set,
            checkpoints: p.checkpoints,
        },
        Variant {
            label: "4 KiB values (extents)",
            value_bytes: 4096,
            working_set: p.extent_working_set,
            checkpoints: p.extent_checkpoints,
        },
    ];
    let mut md = format!(
        "{} random puts per checkpoint (1,000 per `Deferred` transaction, 10% rewriting one of the last 1,000 keys), \
         a snapshot every {SNAPSHOT_EVERY} checkpoints with the oldest dropped when two exist; auto-clean off; \
         {} run(s), medians.\n\n\
         | workload | working set | checkpoints | run bytes / op | extra 4 KiB pages / op | level-0 records / op | compacted records / op | compactions | back-reference time / op | put + checkpoint / op | checkpoint (median) | runs at end | backref bytes / live at end |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        p.puts_per_checkpoint, ctx.runs
    );
    let mut js = Vec::new();
    for v in variants {
        let mut outs = Vec::new();
        for r in 0..ctx.runs {
            outs.push(one(ctx, p, v, r)?);
        }
        let m = |f: &dyn Fn(&Outcome) -> f64| median(&outs.iter().map(f).collect::<Vec<_>>());
        let bytes_op = m(&|o| o.run_bytes as f64 / o.ops as f64);
        let l0_op = m(&|o| o.level0_records as f64 / o.ops as f64);
        let comp_op = m(&|o| o.compact_records as f64 / o.ops as f64);
        let op_us =
            m(&|o| (o.put_secs + o.checkpoint_secs.iter().sum::<f64>()) * 1e6 / o.ops as f64);
        let cp_us = m(&|o| median(&o.checkpoint_secs) * 1e6);
        let ratio = m(&|o| o.final_backref_bytes as f64 / o.live_bytes.max(1) as f64);
        let cpu_us = m(&|o| o.backref_nanos as f64 / 1e3 / o.ops as f64);
        md.push_str(&format!(
            "| {} | {} keys | {} | {:.1} B | {:.4} | {:.3} | {:.3} | {} | {:.3} µs | {:.2} µs | {} | {} | {:.2}% |\n",
            v.label,
            v.working_set,
            v.checkpoints,
            bytes_op,
            bytes_op / 4096.0,
            l0_op,
            comp_op,
            m(&|o| o.compactions as f64),
            cpu_us,
            op_us,
            fmt_us(cp_us),
            m(&|o| o.final_runs as f64),
            ratio * 100.0
        ));
        js.push(json!({
            "variant": v.label, "working_set": v.working_set, "checkpoints": v.checkpoints,
            "run_bytes_per_op": bytes_op, "pages_per_op": bytes_op / 4096.0,
            "level0_records_per_op": l0_op, "compacted_records_per_op": comp_op,
            "op_us": op_us, "checkpoint_us": cp_us, "backref_over_live": ratio,
            "backref_us_per_op": cpu_us,
            "runs": outs.iter().map(|o| json!({
                "ops": o.ops, "run_bytes": o.run_bytes, "level0_records": o.level0_records,
                "compact_records": o.compact_records, "compactions": o.compactions,
                "put_secs": o.put_secs, "checkpoint_secs": o.checkpoint_secs,
                "backref_nanos": o.backref_nanos,
            })).collect::<Vec<_>>(),
        }));
    }
    Ok((md, json!(js)))
}
