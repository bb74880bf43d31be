//! The cleaner: its rate, and what it does to a concurrent writer.
//!
//! A store of `keys` 4 KiB values (auto-clean off, otherwise default options) is
//! loaded and checkpointed; then twice a random half of the keys is rewritten and
//! checkpointed, leaving about half of the segment bytes dead, spread over most
//! segments. Then:
//!
//! 1. `clean(0.0)` alone, timed: bytes moved per second;
//! 2. the same two passes again (about half dead again), then a writer thread doing
//!    durable (`Durability::Immediate`) single-key puts of 100 B for as long as the
//!    clean took (at least 5 s), alone: each put's latency;
//! 3. the same writer again, with `clean(0.0)` running in another thread on the same
//!    `Store` handle: the latencies of the puts made while the cleaner ran.

use crate::stat::{fmt_bytes, fmt_us, median, quantile};
use crate::workload::{Res, Rng};
use crate::{key, load, Ctx};
use cambium::{Durability, Options, Store};
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub struct Params {
    pub keys: u64,
}

#[derive(Default)]
struct Outcome {
    moved: u64,
    clean_secs: f64,
    dead_before: u64,
    segment_before: u64,
    footprint_after: u64,
    alone: Vec<f64>,
    with_cleaner: Vec<f64>,
    concurrent_moved: u64,
    concurrent_secs: f64,
}

fn rewrite(store: &Store, keys: u64, rng: &mut Rng) -> Res<()> {
    let mut i = 0;
    while i < keys {
        let mut t = store.begin_write()?;
        t.set_durability(Durability::Deferred);
        for j in i..(i + 10_000).min(keys) {
            if rng.next_u64().is_multiple_of(2) {
                let mut v = vec![0u8; 4096];
                rng.fill(&mut v);
                t.put(&key(j), &v)?;
            }
        }
        t.commit()?;
        i += 10_000;
    }
    store.checkpoint()?;
    Ok(())
}

/// Two passes, each rewriting a random half of the keys: about half the segment
/// bytes dead (3/4 of the first segments, 1/2 of the next, none of the last).
fn make_dead(store: &Store, keys: u64, rng: &mut Rng) -> Res<()> {
    rewrite(store, keys, rng)?;
    rewrite(store, keys, rng)
}

/// Durable single-key puts until `stop`; each latency in µs.
fn writer(store: &Store, stop: &AtomicBool, until: Option<Instant>) -> Res<Vec<f64>> {
    let mut lat = Vec::new();
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) && until.is_none_or(|u| Instant::now() < u) {
        let k = format!("writer{:08}", i % 10_000).into_bytes();
        let t = Instant::now();
        store.put(&k, &[i as u8; 100])?;
        lat.push(t.elapsed().as_secs_f64() * 1e6);
        i += 1;
    }
    Ok(lat)
}

fn one(ctx: &Ctx, p: &Params, run: usize) -> Res<Outcome> {
    let dir = ctx.fresh_dir(&format!("clean-{run}"))?;
    let opts = Options {
        auto_clean_dead_percent: None,
        ..Options::default()
    };
    let store = Store::create_with(dir.join("db"), opts)?;
    let mut rng = Rng::new(0xc1ea + run as u64);
    load(&store, p.keys, 10_000, &mut |_| {
        let mut v = vec![0u8; 4096];
        rng.fill(&mut v);
        v
    })?;
    store.checkpoint()?;
    make_dead(&store, p.keys, &mut rng)?;
    let s = store.stats()?;
    let mut o = Outcome {
        dead_before: s.dead_bytes,
        segment_before: s.segment_bytes,
        ..Outcome::default()
    };
    let t = Instant::now();
    let r = store.clean(0.0)?;
    o.clean_secs = t.elapsed().as_secs_f64();
    o.moved = r.bytes_moved;
    o.footprint_after = r.footprint_after;
    eprintln!(
        "  clean run {run}: {} dead of {}; moved {} in {:.2} s",
        fmt_bytes(o.dead_before as f64),
        fmt_bytes(o.segment_before as f64),
        fmt_bytes(o.moved as f64),
        o.clean_secs
    );
    make_dead(&store, p.keys, &mut rng)?;
    let window = Duration::from_secs_f64(o.clean_secs.max(5.0));
    let stop = AtomicBool::new(false);
    o.alone = writer(&store, &stop, Some(Instant::now() + window))?;
    let (lat, report, secs) = std::thread::scope(|scope| -> Res<_> {
        let w = scope.spawn(|| writer(&store, &stop, None).map_err(|e| e.to_string()));
        std::thread::sleep(Duration::from_millis(200));
        let t = Instant::now();
        let cleaner = store.clone();
        let c = scope.spawn(move || cleaner.clean(0.0).map_err(|e| e.to_string()));
        let report = c.join().map_err(|_| "cleaner panicked")??;
        let secs = t.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        let lat = w.join().map_err(|_| "writer panicked")??;
        Ok((lat, report, secs))
    })?;
    // The puts made while the cleaner ran: drop the 200 ms lead-in by time.
    let mut elapsed = 0.0;
    o.with_cleaner = lat
        .into_iter()
        .filter(|l| {
            elapsed += l;
            elapsed > 200_000.0
        })
        .collect();
    o.concurrent_moved = report.bytes_moved;
    o.concurrent_secs = secs;
    eprintln!(
        "  clean run {run}: concurrent clean moved {} in {secs:.2} s; {} puts alone, {} with the cleaner",
        fmt_bytes(o.concurrent_moved as f64),
        o.alone.len(),
        o.with_cleaner.len()
    );
    store.close()?;
    ctx.remove_dir(&dir);
    Ok(o)
}

pub fn run(ctx: &Ctx, p: &Params) -> Res<(String, serde_json::Value)> {
    let mut outs = Vec::new();
    for r in 0..ctx.runs {
        outs.push(one(ctx, p, r)?);
    }
    let m = |f: &dyn Fn(&Outcome) -> f64| median(&outs.iter().map(f).collect::<Vec<_>>());
    let mbs = m(&|o| o.moved as f64 / o.clean_secs / (1 << 20) as f64);
    let cmbs = m(&|o| o.concurrent_moved as f64 / o.concurrent_secs / (1 << 20) as f64);
    let mut md = format!(
        "{} × 4 KiB values, twice a random half of them rewritten; {} run(s), medians.\n\n\
         | segment bytes before | dead before | moved by `clean(0.0)` | time | rate | footprint after | concurrent clean rate (with the writer) |\n\
         |---|---|---|---|---|---|---|\n\
         | {} | {} | {} | {:.2} s | **{mbs:.1} MiB/s** | {} | {cmbs:.1} MiB/s |\n\n",
        p.keys,
        ctx.runs,
        fmt_bytes(m(&|o| o.segment_before as f64)),
        fmt_bytes(m(&|o| o.dead_before as f64)),
        fmt_bytes(m(&|o| o.moved as f64)),
        m(&|o| o.clean_secs),
        fmt_bytes(m(&|o| o.footprint_after as f64)),
    );
    md.push_str(
        "Durable single-key puts (100 B, `Immediate`) from one thread; per run the median and p99 of its puts, medians over runs (max: the largest of all runs).\n\n\
         | writer | puts (median per run) | median | p99 | max |\n|---|---|---|---|---|\n",
    );
    let mut js = json!({"clean_mib_s": mbs, "concurrent_clean_mib_s": cmbs});
    for (label, pick) in [
        (
            "alone",
            (|o: &Outcome| &o.alone) as fn(&Outcome) -> &Vec<f64>,
        ),
        ("with `clean(0.0)` running", |o: &Outcome| &o.with_cleaner),
    ] {
        let p50 = m(&|o| quantile(pick(o), 0.5));
        let p99 = m(&|o| quantile(pick(o), 0.99));
        let max = outs
            .iter()
            .map(|o| crate::stat::max(pick(o)))
            .fold(0.0, f64::max);
        md.push_str(&format!(
            "| {label} | {:.0} | {} | {} | {} |\n",
            m(&|o| pick(o).len() as f64),
            fmt_us(p50),
            fmt_us(p99),
            fmt_us(max)
        ));
        js[label] = json!({"p50_us": p50, "p99_us": p99, "max_us": max});
    }
    Ok((md, js))
}
