//! Times 4 KiB random writes through `Volume::write_at` (no NBD): the engine's
//! share of a write's latency.
//! `cargo run --release --example volume_write_loop [SIZE-MiB]`.
// The `cambium` binary's allocator, so that these loops profile what it runs.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use cambium::volume::Volume;
use cambium::{Durability, Store};
use std::time::Instant;

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
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let block = vec![0xA5u8; 4096];
    for round in 0..3 {
        let n = 100_000;
        let started = Instant::now();
        for _ in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let offset = (x % blocks) * 4096;
            vol.write_at(offset, &block, Durability::Deferred)?;
        }
        let per = started.elapsed().as_secs_f64() / n as f64 * 1e6;
        println!("round {round}: {per:.2} µs per 4 KiB write");
    }
    Ok(())
}
