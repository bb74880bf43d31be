//! Back references at rest and their queries.
//!
//! Two stores: `small_keys` keys with 100 B values (inline, in leaves) and
//! `extent_keys` keys with 4 KiB values (out of line, in extents). Each is loaded in
//! `Deferred` transactions of 10,000, checkpointed, then `shrink`ed (which compacts
//! the back references into one run); then `backref_bytes / live_bytes`.
//!
//! Queries: `Store::backrefs(segment)` on the largest segment (a full one), timed
//! three times (median), right after the shrink and again after `more_checkpoints`
//! checkpoints of 1,000 random puts each (4 KiB store: 100).

use crate::stat::{fmt_bytes, fmt_rate, fmt_us, median};
use crate::workload::{Res, Rng};
use crate::{files, key, load, manual_options, Ctx};
use cambium::{Durability, Store};
use serde_json::json;
use std::time::Instant;

pub struct Params {
    pub small_keys: u64,
    pub extent_keys: u64,
    pub more_checkpoints: u64,
}

#[derive(Default, Clone)]
struct Query {
    segment: u32,
    segment_bytes: u64,
    blocks: u64,
    secs: f64,
    runs: u64,
}

#[derive(Default)]
struct Outcome {
    live: u64,
    backref: u64,
    records: u64,
    after_shrink: Query,
    after_more: Query,
    backref_more: u64,
}

fn value(rng: &mut Rng, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rng.fill(&mut v);
    v
}

fn query(store: &Store, db: &std::path::Path, segment: Option<u32>) -> Res<Query> {
    let segs = files(db, "seg-", ".dat")?;
    let (name, bytes) = match segment {
        Some(s) => segs
            .into_iter()
            .find(|(n, _)| *n == format!("seg-{s:08x}.dat"))
            .ok_or("segment gone")?,
        None => segs
            .into_iter()
            .max_by_key(|(_, len)| *len)
            .ok_or("no segments")?,
    };
    let id = u32::from_str_radix(&name["seg-".len()..name.len() - ".dat".len()], 16)?;
    let mut secs = Vec::new();
    let mut blocks = 0;
    for _ in 0..3 {
        let t = Instant::now();
        blocks = store.backrefs(id)?.len() as u64;
        secs.push(t.elapsed().as_secs_f64());
    }
    Ok(Query {
        segment: id,
        segment_bytes: bytes,
        blocks,
        secs: median(&secs),
        runs: store.stats()?.backref_runs,
    })
}

fn one(ctx: &Ctx, p: &Params, keys: u64, value_bytes: usize, run: usize) -> Res<Outcome> {
    let dir = ctx.fresh_dir(&format!("footprint-{value_bytes}-{run}"))?;
    let db = dir.join("db");
    let store = Store::create_with(&db, manual_options())?;
    let mut rng = Rng::new(0xf007 + run as u64);
    load(&store, keys, 10_000, &mut |_| value(&mut rng, value_bytes))?;
    store.checkpoint()?;
    store.shrink()?;
    let s = store.stats()?;
    let mut o = Outcome {
        live: s.live_bytes,
        backref: s.backref_bytes,
        records: s.backref_records,
        ..Outcome::default()
    };
    o.after_shrink = query(&store, &db, None)?;
    let puts = if value_bytes > 1024 { 100 } else { 1000 };
    for _ in 0..p.more_checkpoints {
        let mut txn = store.begin_write()?;
        txn.set_durability(Durability::Deferred);
        for _ in 0..puts {
            txn.put(&key(rng.next_u64() % keys), &value(&mut rng, value_bytes))?;
        }
        txn.commit()?;
        store.checkpoint()?;
    }
    o.after_more = query(&store, &db, Some(o.after_shrink.segment))?;
    o.backref_more = store.stats()?.backref_bytes;
    eprintln!(
        "  footprint {value_bytes} B run {run}: live {}, backrefs {} ({} records); backrefs(seg {}) {} blocks in {}",
        fmt_bytes(o.live as f64),
        fmt_bytes(o.backref as f64),
        o.records,
        o.after_shrink.segment,
        o.after_shrink.blocks,
        fmt_us(o.after_shrink.secs * 1e6)
    );
    store.close()?;
    ctx.remove_dir(&dir);
    Ok(o)
}

pub fn run(ctx: &Ctx, p: &Params) -> Res<(String, serde_json::Value)> {
    let mut md = format!(
        "Loaded, checkpointed, `shrink`; {} run(s), medians. `Store::backrefs(segment)` on the largest segment, median of 3 calls, \
         after the shrink and after {} more checkpoints of random puts.\n\n\
         | store | live bytes | back-reference bytes | records | backref / live | backrefs(): segment | blocks | time | blocks/s | after {} checkpoints: runs | blocks | time | blocks/s |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        ctx.runs, p.more_checkpoints, p.more_checkpoints
    );
    let mut js = Vec::new();
    for (label, keys, vb) in [
        ("100 B values", p.small_keys, 100usize),
        ("4 KiB extents", p.extent_keys, 4096),
    ] {
        let mut outs = Vec::new();
        for r in 0..ctx.runs {
            outs.push(one(ctx, p, keys, vb, r)?);
        }
        let m = |f: &dyn Fn(&Outcome) -> f64| median(&outs.iter().map(f).collect::<Vec<_>>());
        let ratio = m(&|o| o.backref as f64 / o.live as f64);
        let q1 = m(&|o| o.after_shrink.secs);
        let q2 = m(&|o| o.after_more.secs);
        let b1 = m(&|o| o.after_shrink.blocks as f64);
        let b2 = m(&|o| o.after_more.blocks as f64);
        md.push_str(&format!(
            "| {keys} × {label} | {} | {} | {:.0} | **{:.2}%** | {} | {:.0} | {} | {} | {:.0} | {b2:.0} | {} | {} |\n",
            fmt_bytes(m(&|o| o.live as f64)),
            fmt_bytes(m(&|o| o.backref as f64)),
            m(&|o| o.records as f64),
            ratio * 100.0,
            fmt_bytes(m(&|o| o.after_shrink.segment_bytes as f64)),
            b1,
            fmt_us(q1 * 1e6),
            fmt_rate(m(&|o| o.after_shrink.blocks as f64 / o.after_shrink.secs)),
            m(&|o| o.after_more.runs as f64),
            fmt_us(q2 * 1e6),
            fmt_rate(m(&|o| o.after_more.blocks as f64 / o.after_more.secs)),
        ));
        js.push(json!({
            "store": label, "keys": keys, "backref_over_live": ratio,
            "live": m(&|o| o.live as f64), "backref_bytes": m(&|o| o.backref as f64),
            "query_secs_after_shrink": q1, "blocks_after_shrink": b1,
            "query_secs_after_more": q2, "blocks_after_more": b2,
        }));
    }
    Ok((md, json!(js)))
}
