//! Times batches of 4 KiB random writes through `Volume::write_many` (no NBD) right
//! after snapshots of the volume: the cost of the first writes to each shared leaf,
//! which gain a parent for each of their children and extents (Rodeh's lazy counts).
//! `cargo run --release --example volume_snapshot_loop [SIZE-MiB]`.
// The `cambium` binary's allocator, so that these loops profile what it runs.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use cambium::volume::Volume;
use cambium::{Durability, Store};
use std::time::{Duration, Instant};

/// Writes per batch, as a QD32 client's requests arrive together.
const BATCH: usize = 32;
/// Batches timed after each snapshot.
const BATCHES: usize = 2_000;

fn main() -> cambium::Result<()> {
    let dir = tempfile::tempdir()?;
    let store = Store::create(dir.path().join("s"))?;
    // The volume's size in MiB: the first argument, 1024 by default.
    let mib: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1024);
    let vol = Volume::create(&store, "disk", mib << 20, 4096)?;
    let blocks = (mib << 20) / 4096;
    let block = vec![0xA5u8; 4096];
    // Every block written once, in 1 MiB batches.
    let chunk = vec![0x5Au8; 1 << 20];
    for offset in (0..mib << 20).step_by(1 << 20) {
        vol.write_many(&[(offset, &chunk[..])], Durability::Deferred)?;
    }
    store.checkpoint()?;
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for round in 0..6 {
        // Round 0 writes without a snapshot before it: the baseline.
        let snap = if round > 0 {
            let t = Instant::now();
            Volume::snapshot_with(&store, "disk", &format!("s{round}"), Durability::Deferred)?;
            if std::env::var_os("CLONE").is_some() {
                Volume::clone_with(&store, "disk", &format!("c{round}"), Durability::Deferred)?;
            }
            t.elapsed()
        } else {
            Duration::ZERO
        };
        let mut times = Vec::with_capacity(BATCHES);
        let started = Instant::now();
        for _ in 0..BATCHES {
            let mut writes = Vec::with_capacity(BATCH);
            for _ in 0..BATCH {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                writes.push(((x % blocks) * 4096, &block[..]));
            }
            let t = Instant::now();
            vol.write_many(&writes, Durability::Deferred)?;
            times.push(t.elapsed());
        }
        let total = started.elapsed();
        times.sort();
        let at = |q: f64| times[((times.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
        println!(
            "round {round}: snapshot {:.0} µs; {BATCHES} batches of {BATCH} in {:.0} ms; \
             per batch median {:.0} µs, p99 {:.0} µs, max {:.0} µs",
            snap.as_secs_f64() * 1e6,
            total.as_secs_f64() * 1e3,
            at(0.5),
            at(0.99),
            at(1.0)
        );
    }
    Ok(())
}
