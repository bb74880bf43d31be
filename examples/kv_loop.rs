//! The key-value benchmark's phases as plain loops, for `perf` and A/B runs outside
//! the harness (BENCHMARKS.md cites it). On first use it builds a store of N random
//! pairs (24-byte keys, 150-byte values, the benchmark's stream) in one transaction
//! under `/tmp/cambium-kv-loop/storeN` (or `DIR`), then runs one mode on it:
//!
//! ```text
//! cargo run --release --example kv_loop                  # 3 passes of N random gets
//! MODE=range LEN=10 cargo run --release --example kv_loop  # N/2 range scans of LEN
//! MODE=batch ROUNDS=100 [CP_EACH=1] [WARM=1] ...   # transactions of 1,000 random inserts, then a checkpoint
//! MODE=remove [WARM=1] [COUNT=N/2] DIR=copy ...  # deletes in one transaction (destroys the store)
//! MODE=scan PASSES=30 ...                        # full scans with the borrowing iterator
//! ```
//!
//! `N` (default 1,000,000) and `CACHE_MIB` (the node cache, default 64: a quarter of
//! the 1M-key tree, the "store 4× the cache" case) apply to every mode.
// The `cambium` binary's allocator, so that these loops profile what it runs.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use cambium::io::sim::SplitMix;
use std::time::Instant;
fn pair(r: &mut SplitMix) -> ([u8; 24], [u8; 150]) {
    let mut k = [0u8; 24];
    let mut v = [0u8; 150];
    for b in [&mut k[..], &mut v[..]] {
        let mut ch = b.chunks_exact_mut(8);
        for c in &mut ch {
            c.copy_from_slice(&r.next_u64().to_le_bytes());
        }
        let rest = ch.into_remainder();
        if !rest.is_empty() {
            let n = rest.len();
            rest.copy_from_slice(&r.next_u64().to_le_bytes()[..n]);
        }
    }
    (k, v)
}
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: u64 = std::env::var("N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let dir = std::path::PathBuf::from(
        std::env::var("DIR").unwrap_or(format!("/tmp/cambium-kv-loop/store{n}")),
    );
    let dir = dir.as_path();
    let cache_mib: usize = std::env::var("CACHE_MIB")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64);
    let opts = cambium::Options {
        cache_bytes: cache_mib << 20,
        ..Default::default()
    };
    // FRESH=1: build the store in this process and keep it open, so the mode runs
    // on the nodes the load's checkpoint cached (the benchmark's case) rather than
    // on nodes read back from the files.
    let fresh = std::env::var("FRESH").is_ok();
    let mut built = None;
    if !dir.exists() {
        let s = cambium::Store::create_with(dir, opts.clone())?;
        let mut t = s.begin_write()?;
        let mut r = SplitMix(3);
        for _ in 0..n {
            let (k, v) = pair(&mut r);
            t.put(&k, &v)?;
        }
        t.commit()?;
        s.checkpoint()?;
        eprintln!("built {n} pairs");
        match fresh {
            true => built = Some(s),
            false => s.close()?,
        }
    }
    let s = match built {
        Some(s) => s,
        None => cambium::Store::open_with(dir, opts)?,
    };
    let mode = std::env::var("MODE").unwrap_or_default();
    let len: usize = std::env::var("LEN")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    if mode == "remove" {
        if std::env::var("WARM").is_ok() {
            let r = s.read()?;
            let mut rng = SplitMix(3);
            for _ in 0..n {
                let (k, _) = pair(&mut rng);
                r.get_with(&k, |v| v.len())?;
            }
        }
        let t = Instant::now();
        let mut w = s.begin_write()?;
        let mut rng = SplitMix(3);
        let count: u64 = std::env::var("COUNT")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(n / 2);
        for _ in 0..count {
            let (k, _) = pair(&mut rng);
            w.delete(&k)?;
        }
        w.commit()?;
        let c = t.elapsed();
        s.checkpoint()?;
        eprintln!(
            "remove: commit {:.1} ms, +checkpoint {:.1} ms",
            c.as_secs_f64() * 1e3,
            t.elapsed().as_secs_f64() * 1e3
        );
        return Ok(());
    }
    if mode == "batch" {
        let mut rng = SplitMix(0xba7c_0000_0000_0002);
        let rounds: usize = std::env::var("ROUNDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(10);
        let each = std::env::var("CP_EACH").is_ok();
        if std::env::var("WARM").is_ok() {
            // Every node into the cache, as the benchmark's batch phase finds it (right
            // after the load, in the same process).
            let t = Instant::now();
            let r = s.read()?;
            let mut it = r.range::<std::ops::RangeFull>(..)?;
            let mut entries = 0u64;
            while let Some(kv) = it.next_ref() {
                kv?;
                entries += 1;
            }
            eprintln!(
                "warm: {entries} entries in {:.1} s",
                t.elapsed().as_secs_f64()
            );
        }
        let all = Instant::now();
        let mut commits = std::time::Duration::ZERO;
        for round in 0..rounds {
            let t = Instant::now();
            let mut w = s.begin_write()?;
            for _ in 0..1000 {
                let (k, v) = pair(&mut rng);
                w.put(&k, &v)?;
            }
            w.commit()?;
            let c = t.elapsed();
            commits += c;
            if each || round + 1 == rounds {
                s.checkpoint()?;
            }
            eprintln!(
                "batch {round}: commit {:.1} ms, +checkpoint {:.1} ms",
                c.as_secs_f64() * 1e3,
                t.elapsed().as_secs_f64() * 1e3
            );
        }
        eprintln!(
            "all: {:.1} ms (transactions {:.1} ms)",
            all.elapsed().as_secs_f64() * 1e3,
            commits.as_secs_f64() * 1e3
        );
        return Ok(());
    }
    if mode == "scan" {
        let passes: usize = std::env::var("PASSES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(30);
        let mut times = Vec::with_capacity(passes);
        for pass in 0..passes {
            let t = Instant::now();
            let mut it = s.read()?.iter()?;
            let mut sum = 0;
            while let Some(kv) = it.next_ref() {
                let (k, v) = kv?;
                sum += k.len() + v.len();
            }
            times.push(t.elapsed().as_secs_f64() * 1e3);
            eprintln!("scan pass {pass}: {:.2} ms ({sum})", times[pass]);
        }
        times.sort_by(f64::total_cmp);
        eprintln!("scan median {:.2} ms", times[passes / 2]);
        return Ok(());
    }
    for pass in 0..3 {
        let r = s.read()?;
        if mode == "range" {
            let mut rng = SplitMix(3);
            let t = Instant::now();
            let mut sum = 0;
            for _ in 0..n / 2 {
                let (k, _) = pair(&mut rng);
                let mut it = r.range((
                    std::ops::Bound::Included(&k[..]),
                    std::ops::Bound::Unbounded,
                ))?;
                for _ in 0..len {
                    let Some(kv) = it.next_ref() else { break };
                    let (k, v) = kv?;
                    sum += k.len() + v.len();
                }
            }
            eprintln!(
                "range pass {pass}: {:.3} s ({sum})",
                t.elapsed().as_secs_f64()
            );
            continue;
        }
        let mut rng = SplitMix(3);
        let t = Instant::now();
        let mut sum = 0;
        for _ in 0..n {
            let (k, _) = pair(&mut rng);
            sum += r.get_with(&k, |v| v.len())?.ok_or("missing")?;
        }
        eprintln!("pass {pass}: {:.3} s ({sum})", t.elapsed().as_secs_f64());
    }
    Ok(())
}
