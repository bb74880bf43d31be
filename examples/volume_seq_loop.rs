//! Times 1 MiB sequential writes through `Volume::write_at` (no NBD), first into an
//! empty volume, then overwriting it. `cargo run --release --example volume_seq_loop`.
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
    let vol = Volume::create(&store, "disk", 1 << 30, 4096)?;
    // Random chunks made before the clock starts (making them costs more than
    // writing them), each written at many offsets.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let chunks: Vec<Vec<u8>> = (0..16)
        .map(|_| {
            let mut chunk = vec![0u8; 1 << 20];
            for w in chunk.chunks_exact_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                w.copy_from_slice(&x.to_le_bytes());
            }
            chunk
        })
        .collect();
    for round in 0..4 {
        let started = Instant::now();
        for i in 0..1024u64 {
            let chunk = &chunks[(i as usize + round) % chunks.len()];
            vol.write_at(i << 20, chunk, Durability::Deferred)?;
        }
        let secs = started.elapsed().as_secs_f64();
        println!("round {round}: {:.0} MiB/s", 1024.0 / secs);
    }
    Ok(())
}
