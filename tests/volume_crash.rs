//! Volumes under simulated power loss, on the crash simulator (`SimVfs`).
//!
//! A seeded workload of NBD-like operations (batches of writes with partial blocks
//! and zero blocks, large page-aligned writes that go to disk from the caller's buffer, write-zeroes, trims, flushes, FUA writes, snapshots, checkpoints)
//! runs on a volume; the disk freezes at a random I/O operation (a persistent I/O
//! fault, so the operation in flight fails part way), and `SimVfs::crash` makes the
//! post-power-loss image (unsynced writes kept, dropped or torn per the seed).
//!
//! After recovery:
//! - the volume reads back as the model after exactly `k` of the attempted
//!   operations, with `k` at least the last one a flush (or a FUA write) covered:
//!   nothing flushed is lost, and unflushed writes survive as a prefix, whole;
//! - every snapshot that survived reads as the volume did when it was made;
//! - `verify` is clean and every volume passes `Volume::check`.
//!
//! `CAMBIUM_SEED=N` replays one seed; `CAMBIUM_VOLUME_CRASH_CASES=N` scales the run.

mod common;

use cambium::io::sim::SimVfs;
use cambium::volume::Volume;
use cambium::{Durability, Store};
use common::*;

const BS: u64 = 4096;
const BLOCKS: u64 = 96;
/// Whole blocks in a large write: past the size that goes to disk with `O_DIRECT`
/// (256 KiB), from the caller's buffer when it is page-aligned.
const LARGE_BLOCKS: u64 = 72;

/// What the volume must read as after each attempted operation.
struct History {
    states: Vec<Vec<u8>>,
    /// Index of the newest state a flush covered.
    durable: usize,
    /// Snapshots: name and the state index they were made at.
    snapshots: Vec<(String, usize)>,
}

impl History {
    fn push(&mut self, state: Vec<u8>) {
        self.states.push(state);
    }
    fn flushed(&mut self) {
        self.durable = self.states.len() - 1;
    }
}

/// A random write: block-aligned or not, sometimes zeroes (holes).
fn random_write(rng: &mut Rng) -> (u64, Vec<u8>) {
    let size = BLOCKS * BS;
    let offset = if rng.chance(1, 2) {
        rng.below(BLOCKS) * BS
    } else {
        rng.below(size)
    };
    let len = (rng.range(1, 3 * BS)).min(size - offset) as usize;
    let data = if rng.chance(1, 5) {
        vec![0; len]
    } else {
        rng.bytes(len)
    };
    (offset, data)
}

/// A large write of whole blocks, its bytes at a page-aligned address inside the
/// returned buffer (as the NBD server receives one): the segment write then goes out
/// from the buffer itself. Returns the offset, the buffer and where in it the bytes are.
fn large_write(rng: &mut Rng) -> (u64, Vec<u8>, std::ops::Range<usize>) {
    let offset = rng.below(BLOCKS - LARGE_BLOCKS + 1) * BS;
    let len = (LARGE_BLOCKS * BS) as usize;
    let mut buf = vec![0u8; len + 4096];
    let start = buf.as_ptr().align_offset(4096).min(4096);
    buf[start..start + len].copy_from_slice(&rng.bytes(len));
    (offset, buf, start..start + len)
}

/// Runs the workload until it ends or an operation fails (the disk froze).
fn run(store: &Store, vol: &Volume, rng: &mut Rng, steps: usize, hist: &mut History) {
    let mut model = hist.states.last().cloned().unwrap_or_default();
    for step in 0..steps {
        let result = match rng.below(10) {
            0..=4 => {
                let writes: Vec<(u64, Vec<u8>, std::ops::Range<usize>)> = if rng.chance(1, 8) {
                    vec![large_write(rng)]
                } else {
                    (0..rng.range(1, 4))
                        .map(|_| {
                            let (offset, data) = random_write(rng);
                            let all = 0..data.len();
                            (offset, data, all)
                        })
                        .collect()
                };
                let fua = rng.chance(1, 6);
                let refs: Vec<(u64, &[u8])> = writes
                    .iter()
                    .map(|(o, d, range)| (*o, &d[range.clone()]))
                    .collect();
                for (offset, data) in &refs {
                    model[*offset as usize..*offset as usize + data.len()].copy_from_slice(data);
                }
                hist.push(model.clone());
                let durability = if fua {
                    Durability::Immediate
                } else {
                    Durability::Deferred
                };
                let r = vol.write_many(&refs, durability);
                if r.is_ok() && fua {
                    hist.flushed();
                }
                r
            }
            5 => {
                let offset = rng.below(BLOCKS * BS);
                let len = rng.below(BLOCKS * BS - offset + 1);
                model[offset as usize..(offset + len) as usize].fill(0);
                hist.push(model.clone());
                vol.write_zeroes(offset, len, Durability::Deferred)
            }
            6 => {
                let offset = rng.below(BLOCKS * BS);
                let len = rng.below(BLOCKS * BS - offset + 1);
                let (a, b) = (offset.div_ceil(BS) * BS, (offset + len) / BS * BS);
                if a < b {
                    model[a as usize..b as usize].fill(0);
                }
                hist.push(model.clone());
                vol.trim(offset, len, Durability::Deferred)
            }
            7 => {
                let r = vol.sync();
                if r.is_ok() {
                    hist.flushed();
                }
                r
            }
            8 => {
                let name = format!("snap{step}");
                let r = Volume::snapshot_with(store, "disk", &name, Durability::Deferred);
                if r.is_ok() {
                    hist.snapshots.push((name, hist.states.len() - 1));
                }
                r.map(|_| ())
            }
            _ => {
                let r = store.checkpoint();
                if r.is_ok() {
                    // A checkpoint makes every commit before it durable.
                    hist.flushed();
                }
                r
            }
        };
        if result.is_err() {
            return;
        }
    }
}

/// Builds a store with a durable empty volume, then runs the workload with the disk
/// set to freeze after `fail_at` more operations. Returns the file system, the
/// store (still open: the crash decides what survives), the history and the
/// operations the workload made.
fn run_once(
    seed: u64,
    steps: usize,
    fail_at: Option<u64>,
) -> Result<(SimVfs, Store, History, u64), String> {
    let vfs = SimVfs::new();
    let store = create_sim(&vfs);
    let vol = ctx(
        Volume::create(&store, "disk", BLOCKS * BS, BS as u32),
        "create volume",
    )?;
    let mut hist = History {
        states: vec![vec![0; (BLOCKS * BS) as usize]],
        durable: 0,
        snapshots: Vec::new(),
    };
    let start = vfs.op_count();
    vfs.set_fail_after(fail_at);
    let mut rng = Rng::new(seed);
    run(&store, &vol, &mut rng, steps, &mut hist);
    let ops = vfs.op_count() - start;
    drop(vol);
    Ok((vfs, store, hist, ops))
}

fn read_all(vol: &Volume) -> Result<Vec<u8>, String> {
    let mut buf = vec![0xEEu8; vol.size() as usize];
    ctx(vol.read_at(0, &mut buf), "read the volume")?;
    Ok(buf)
}

fn check_recovered(image: &SimVfs, hist: &History) -> Result<(), String> {
    let store = ctx(open_sim(image), "reopen after the crash")?;
    let vol = ctx(Volume::open(&store, "disk"), "open the volume")?;
    let got = read_all(&vol)?;
    let k = (hist.durable..hist.states.len())
        .rev()
        .find(|&k| hist.states[k] == got)
        .ok_or_else(|| {
            let older = (0..hist.durable).rev().find(|&k| hist.states[k] == got);
            format!(
                "the volume matches no allowed state (allowed {}..={}; matches older state {older:?})",
                hist.durable,
                hist.states.len() - 1
            )
        })?;
    for (name, at) in &hist.snapshots {
        match Volume::open(&store, name) {
            Ok(snap) => {
                if read_all(&snap)? != hist.states[*at] {
                    return Err(format!("snapshot {name} does not read as the volume did"));
                }
                if *at > k {
                    return Err(format!(
                        "snapshot {name} survived but writes before it did not"
                    ));
                }
            }
            Err(cambium::Error::VolumeNotFound(_)) => {}
            Err(e) => return Err(format!("open snapshot {name}: {e}")),
        }
    }
    let report = ctx(store.verify(), "verify")?;
    if !report.is_clean() {
        return Err(format!("verify: {:?}", report.problems));
    }
    for (name, _) in ctx(Volume::names(&store), "list volumes")? {
        let problems = ctx(ctx(Volume::open(&store, &name), "open")?.check(), "check")?;
        if !problems.is_empty() {
            return Err(format!("{name}: {problems:?}"));
        }
    }
    // The recovered volume takes writes again.
    ctx(
        vol.write_at(0, &[9u8; 4096], Durability::Immediate),
        "write after recovery",
    )?;
    ctx(store.close(), "close after recovery")
}

#[test]
fn volumes_survive_power_loss_at_random_points() {
    run_seeds(
        "volumes_survive_power_loss_at_random_points",
        "volume_crash",
        120,
        |seed| {
            let mut rng = Rng::new(seed ^ 0x5EED_B10C);
            let steps = rng.usize(5, 40);
            let (_, store, _, total) = run_once(seed, steps, None)?;
            drop(store);
            // One seed in four loses power after the workload (unflushed writes
            // pending); the others freeze the disk part way through an operation.
            let fail_at = if rng.chance(1, 4) {
                None
            } else {
                Some(rng.below(total.max(1)))
            };
            let (vfs, store, hist, _) = run_once(seed, steps, fail_at)?;
            let image = vfs.crash(seed.wrapping_mul(31).wrapping_add(7));
            drop(store); // errors from the dead file system are ignored
            check_recovered(&image, &hist)
                .map_err(|e| format!("fault at {fail_at:?} of {total}: {e}"))
        },
    );
}

/// A flush of a few small writes logs their blocks in the WAL instead of syncing
/// their data segment (one write and one fsync per flush): after a power loss that
/// drops every unsynced write, the blocks come back from the log, for a read-only
/// open (which must not write: it reads them from memory) as for the writable open
/// that puts them back in their segment, and after that open has checkpointed.
#[test]
fn flushed_small_writes_come_back_from_the_log_after_power_loss() {
    let vfs = SimVfs::new();
    let store = create_sim(&vfs);
    let vol = Volume::create(&store, "disk", BLOCKS * BS, BS as u32).expect("create volume");
    vol.sync().expect("sync the creation");
    let mut want = vec![0u8; (BLOCKS * BS) as usize];
    for (i, block) in [3u64, 17, 18, 40, 95].into_iter().enumerate() {
        let data = vec![0x40 + i as u8; BS as usize];
        vol.write_at(block * BS, &data, Durability::Deferred)
            .expect("write");
        want[(block * BS) as usize..((block + 1) * BS) as usize].copy_from_slice(&data);
    }
    vol.sync().expect("flush");
    let image = vfs.crash_drop_all();
    drop(vol);
    drop(store);

    // The blocks are in no segment file of the image: only the log holds them.
    let block = vec![0x40u8; BS as usize];
    for name in image.names().iter().filter(|n| n.starts_with("seg-")) {
        let bytes = image.read_file(name).unwrap_or_default();
        assert!(
            !bytes.windows(block.len()).any(|w| w == block),
            "{name} holds a flushed block: the flush synced its segment instead of logging it"
        );
    }

    let reader = Store::open_with(
        SIM_PATH,
        cambium::Options {
            read_only: true,
            ..sim_options(&image)
        },
    )
    .expect("read-only open after the power loss");
    let got = read_all(&Volume::open(&reader, "disk").expect("open read-only")).expect("read");
    assert!(got == want, "a read-only open reads the flushed blocks");
    assert!(reader.verify().expect("verify").is_clean());
    drop(reader);

    let store = open_sim(&image).expect("reopen");
    let vol = Volume::open(&store, "disk").expect("open");
    assert!(
        read_all(&vol).expect("read") == want,
        "the writable open reads them"
    );
    store.checkpoint().expect("checkpoint");
    assert!(store.verify().expect("verify").is_clean());
    drop(vol);
    let after = image.crash_drop_all();
    drop(store);
    let store = open_sim(&after).expect("reopen after a second power loss");
    let vol = Volume::open(&store, "disk").expect("open");
    assert!(read_all(&vol).expect("read") == want, "put back durably");
}
