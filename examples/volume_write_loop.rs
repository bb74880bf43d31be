//! Times 4 KiB random writes through `Volume::write_at` (no NBD): the engine's
//! share of a write's latency. `cargo run --release --example volume_write_loop`.
use cambium::volume::Volume;
use cambium::{Durability, Store};
use std::sync::Arc;
use std::time::Instant;

fn main() -> cambium::Result<()> {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(Store::create(dir.path().join("s"))?);
    let vol = Volume::create(&store, "disk", 1 << 30, 4096)?;
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let block = vec![0xA5u8; 4096];
    for round in 0..3 {
        let n = 100_000;
        let started = Instant::now();
        for _ in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let offset = (x % (1 << 18)) * 4096;
            vol.write_at(offset, &block, Durability::Deferred)?;
        }
        let per = started.elapsed().as_secs_f64() / n as f64 * 1e6;
        println!("round {round}: {per:.2} µs per 4 KiB write");
    }
    Ok(())
}
