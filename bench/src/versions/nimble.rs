//! Nimble clones on keys: BetrFS 0.5's "Dookubench" (§5.1), with objects as key
//! ranges.
//!
//! `objects` objects of `object_mib` MiB each, stored as key ranges of 4 KiB values
//! (`obj007/00000412`). Then `rounds` rounds, each: branch the newest version (a clone
//! of a clone of ...: the chain grows one per round), edit 16 bytes at a 4 KiB-aligned
//! offset of every object in the new branch (read the value, patch it, put it: one
//! durable transaction for the round, as BetrFS syncs once per round), checkpoint, and
//! record the bytes the store grew by. Then reopen the store (a cold node cache; the OS
//! page cache is dropped too when this process may write `/proc/sys/vm/drop_caches`)
//! and time a full scan of the new branch.
//!
//! The goals: the scan in the last round within 5% of the first; bytes added per
//! round as close as possible to BetrFS's 16 KiB.

use crate::kv::{dir_bytes, version_name, Cambium, EngineCfg, Forkable};
use crate::stat::{fmt_bytes, fmt_us, median, us};
use crate::workload::{Res, Rng};
use crate::Ctx;
use serde_json::json;
use std::path::Path;
use std::time::Instant;

pub struct Params {
    pub objects: u32,
    pub object_mib: u32,
    pub rounds: u32,
}

const BLOCK: usize = 4096;
const EDIT: usize = 16;

fn key(object: u32, block: u32) -> Vec<u8> {
    format!("obj{object:03}/{block:08}").into_bytes()
}

/// Writes back dirty pages and asks the kernel to drop its page cache; false when it
/// may not (not root, or a container that forbids it).
fn drop_os_caches() -> bool {
    // SAFETY-free: libc's sync is reached through the `sync` command.
    let _ = std::process::Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

#[derive(Default, Clone)]
struct Round {
    clone_us: f64,
    edit_us: f64,
    scan_us: f64,
    scanned_bytes: u64,
    live_added: i64,
    disk_added: i64,
}

struct Outcome {
    rounds: Vec<Round>,
    dropped_os_cache: bool,
}

fn scan(e: &Cambium, v: u32) -> Res<(f64, u64)> {
    let t = Instant::now();
    let r = e.store().read_at(&version_name(v))?;
    let mut bytes = 0u64;
    for kv in r.iter()? {
        let (k, val) = kv?;
        bytes += (k.len() + val.len()) as u64;
    }
    Ok((us(t.elapsed()), bytes))
}

fn one(ctx: &Ctx, dir: &Path, p: &Params) -> Res<Outcome> {
    let cfg = EngineCfg {
        cambium_cache_bytes: Some(ctx.cambium_cache_bytes),
        durable: true,
    };
    let mut e = Cambium::create(dir, &cfg)?;
    let blocks = p.object_mib * (1 << 20) / BLOCK as u32;
    let mut rng = Rng::new(0xd00c);
    // Load: one transaction per object.
    for o in 0..p.objects {
        let mut txn = e.store().begin_write()?;
        let mut v = vec![0u8; BLOCK];
        for b in 0..blocks {
            rng.fill(&mut v);
            txn.put(&key(o, b), &v)?;
        }
        txn.commit()?;
    }
    e.settle()?;
    let mut dropped = true;
    let mut rounds = Vec::new();
    let store_dir = dir.join("store");
    for round in 1..=p.rounds {
        let src = round - 1;
        let t = Instant::now();
        e.fork(src, round)?;
        let clone_us = us(t.elapsed());

        let before_live = e.live_bytes().unwrap_or(0) as i64;
        let before_disk = dir_bytes(&store_dir).1 as i64;
        let t = Instant::now();
        let mut txn = e.store().begin_write_on(&version_name(round))?;
        for o in 0..p.objects {
            let k = key(o, (rng.next_u64() % blocks as u64) as u32);
            let mut v = txn.get(&k)?.ok_or("nimble: missing block")?;
            let at = (rng.next_u64() % (BLOCK / EDIT) as u64) as usize * EDIT;
            rng.fill(&mut v[at..at + EDIT]);
            txn.put(&k, &v)?;
        }
        txn.commit()?;
        let edit_us = us(t.elapsed());
        e.settle()?;
        let live_added = e.live_bytes().unwrap_or(0) as i64 - before_live;
        let disk_added = dir_bytes(&store_dir).1 as i64 - before_disk;

        e = e.reopen()?;
        dropped &= drop_os_caches();
        let (scan_us, scanned_bytes) = scan(&e, round)?;
        rounds.push(Round {
            clone_us,
            edit_us,
            scan_us,
            scanned_bytes,
            live_added,
            disk_added,
        });
    }
    e.close()?;
    Ok(Outcome {
        rounds,
        dropped_os_cache: dropped,
    })
}

pub fn run(ctx: &Ctx, p: &Params) -> Res<(String, serde_json::Value)> {
    let mut outs = Vec::new();
    for run in 0..ctx.runs {
        let dir = ctx.fresh_dir(&format!("nimble-{run}"))?;
        eprintln!("nimble: run {}/{}", run + 1, ctx.runs);
        let o = one(ctx, &dir, p)?;
        for (i, r) in o.rounds.iter().enumerate() {
            eprintln!(
                "  round {:2}: clone {}, edit {}, scan {} ({}), live +{}, disk +{}",
                i + 1,
                fmt_us(r.clone_us),
                fmt_us(r.edit_us),
                fmt_us(r.scan_us),
                fmt_bytes(r.scanned_bytes as f64),
                fmt_bytes(r.live_added as f64),
                fmt_bytes(r.disk_added as f64)
            );
        }
        ctx.remove_dir(&dir);
        outs.push(o);
    }
    let cold = outs.iter().all(|o| o.dropped_os_cache);
    let per_round = |i: usize, f: fn(&Round) -> f64| {
        median(&outs.iter().map(|o| f(&o.rounds[i])).collect::<Vec<_>>())
    };
    let mut md = format!(
        "{} objects × {} MiB as 4 KiB values ({} in all); {} rounds of branch-the-newest + \
         one 16-byte edit per object (one durable transaction per round); scans after a \
         reopen, {}. {} repetition(s); medians per round.\n\n\
         | round | clone | edit (all {} objects) | full scan | live bytes added | disk bytes added |\n\
         |---|---|---|---|---|---|\n",
        p.objects,
        p.object_mib,
        fmt_bytes((p.objects as u64 * p.object_mib as u64 * (1 << 20)) as f64),
        p.rounds,
        if cold {
            "with the OS page cache dropped (cold)"
        } else {
            "OS page cache not droppable here (node cache cold, OS cache warm)"
        },
        ctx.runs,
        p.objects,
    );
    let n = p.rounds as usize;
    for i in 0..n {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            i + 1,
            fmt_us(per_round(i, |r| r.clone_us)),
            fmt_us(per_round(i, |r| r.edit_us)),
            fmt_us(per_round(i, |r| r.scan_us)),
            fmt_bytes(per_round(i, |r| r.live_added as f64)),
            fmt_bytes(per_round(i, |r| r.disk_added as f64)),
        ));
    }
    let all = |f: fn(&Round) -> f64| -> Vec<f64> {
        outs.iter().flat_map(|o| o.rounds.iter().map(f)).collect()
    };
    let scan_ratio = per_round(n - 1, |r| r.scan_us) / per_round(0, |r| r.scan_us);
    let live_avg = median(&all(|r| r.live_added as f64));
    md.push_str(&format!(
        "\nScan in round {n} / round 1: **{scan_ratio:.3}×** (goal ≤ 1.05). Live bytes added \
         per round, median: **{}** (BetrFS 0.5: 16 KiB). Clone latency, median: {}.\n",
        fmt_bytes(live_avg),
        fmt_us(median(&all(|r| r.clone_us))),
    ));
    let js = json!({
        "os_cache_dropped": cold,
        "scan_ratio_last_first": scan_ratio,
        "live_added_median": live_avg,
        "runs": outs.iter().map(|o| o.rounds.iter().map(|r| json!({
            "clone_us": r.clone_us, "edit_us": r.edit_us, "scan_us": r.scan_us,
            "scanned_bytes": r.scanned_bytes, "live_added": r.live_added,
            "disk_added": r.disk_added,
        })).collect::<Vec<_>>()).collect::<Vec<_>>(),
    });
    Ok((md, js))
}
