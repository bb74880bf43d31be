//! Volumes against a model: a plain byte vector per volume, with snapshots frozen
//! copies, through random writes, zeroes, trims, resizes and reopens.

use super::*;
use crate::store::Store;

/// Where a store on the simulated file system lives.
const SIM_DIR: &str = "/sim";

/// Options that put a store on `sim`.
fn sim_options(sim: &crate::io::sim::SimVfs) -> crate::options::Options {
    crate::options::Options {
        vfs: Some(std::sync::Arc::new(sim.clone())),
        ..crate::options::Options::default()
    }
}

/// A new store on a new simulated file system (for a test that injects faults,
/// fills the disk or simulates a crash).
pub(super) fn sim_store() -> (crate::io::sim::SimVfs, Store) {
    let sim = crate::io::sim::SimVfs::new();
    let store = Store::create_with(SIM_DIR, sim_options(&sim)).unwrap();
    (sim, store)
}

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const BS: u64 = 4096;

fn random_data(rng: &mut Rng, len: usize) -> Vec<u8> {
    match rng.below(4) {
        // Zeroes, which become holes.
        0 => vec![0; len],
        _ => (0..len).map(|_| rng.next() as u8).collect(),
    }
}

fn check(vol: &Volume, model: &[u8]) {
    assert_eq!(vol.size(), model.len() as u64);
    let mut buf = vec![0xAA; model.len()];
    vol.read_at(0, &mut buf).unwrap();
    assert!(buf == model, "{} differs from the model", vol.name());
    // Allocation runs cover the volume, and every hole reads as zeroes.
    let mut pos = 0;
    for run in vol.allocation(0, model.len() as u64, usize::MAX).unwrap() {
        if !run.allocated {
            let hole = &model[pos as usize..(pos + run.len) as usize];
            assert!(hole.iter().all(|&b| b == 0), "a hole at {pos} holds data");
        }
        pos += run.len;
    }
    assert_eq!(pos, model.len() as u64);
}

#[test]
fn random_operations_match_a_byte_model_across_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let mut store = Store::create(&path).unwrap();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut model = vec![0u8; (64 * BS) as usize];
    let mut vol = Volume::create(&store, "disk", model.len() as u64, BS as u32).unwrap();
    let mut snapshots: Vec<(String, Vec<u8>)> = Vec::new();
    for step in 0..600 {
        let size = model.len() as u64;
        match rng.below(21) {
            0..=9 => {
                let offset = rng.below(size);
                let len = rng.below((size - offset).min(5 * BS)) as usize + 1;
                let len = len.min((size - offset) as usize);
                let data = random_data(&mut rng, len);
                vol.write_at(offset, &data, Durability::Deferred).unwrap();
                model[offset as usize..offset as usize + len].copy_from_slice(&data);
            }
            10..=11 => {
                let offset = rng.below(size);
                let len = rng.below(size - offset + 1);
                vol.write_zeroes(offset, len, Durability::Deferred).unwrap();
                model[offset as usize..(offset + len) as usize].fill(0);
            }
            12..=13 => {
                let offset = rng.below(size);
                let len = rng.below(size - offset + 1);
                vol.trim(offset, len, Durability::Deferred).unwrap();
                // Only whole blocks are discarded.
                let (a, b) = (offset.div_ceil(BS) * BS, (offset + len) / BS * BS);
                if a < b {
                    model[a as usize..b as usize].fill(0);
                }
            }
            14 => {
                let name = format!("snap{step}");
                Volume::snapshot(&store, "disk", &name).unwrap();
                snapshots.push((name, model.clone()));
            }
            15 => {
                let blocks = rng.below(96) + 1;
                vol.resize(blocks * BS).unwrap();
                model.resize((blocks * BS) as usize, 0);
            }
            17 => {
                // A batch of overlapping writes, partial blocks among them.
                let mut batch: Vec<(u64, Vec<u8>)> = Vec::new();
                for _ in 0..rng.below(6) + 1 {
                    let offset = rng.below(size.min(8 * BS));
                    let len = (rng.below(3 * BS) as usize + 1).min((size - offset) as usize);
                    batch.push((offset, random_data(&mut rng, len)));
                }
                let writes: Vec<(u64, &[u8])> = batch.iter().map(|(o, d)| (*o, &d[..])).collect();
                vol.write_many(&writes, Durability::Deferred).unwrap();
                for (offset, data) in &batch {
                    model[*offset as usize..*offset as usize + data.len()].copy_from_slice(data);
                }
            }
            16 => {
                drop(vol);
                store.close().unwrap();
                store = Store::open(&path).unwrap();
                vol = Volume::open(&store, "disk").unwrap();
            }
            _ => {
                let mut one = [0u8; 1];
                let at = rng.below(size);
                vol.read_at(at, &mut one).unwrap();
                assert_eq!(one[0], model[at as usize]);
            }
        }
        if step % 50 == 0 {
            check(&vol, &model);
        }
    }
    check(&vol, &model);
    for (name, frozen) in &snapshots {
        let snap = Volume::open(&store, name).unwrap();
        assert!(snap.is_read_only());
        check(&snap, frozen);
    }
    let allocated = model
        .chunks(BS as usize)
        .filter(|b| b.iter().any(|&x| x != 0))
        .count();
    assert_eq!(vol.allocated_bytes().unwrap(), allocated as u64 * BS);
    assert!(store.verify().unwrap().is_clean());
}

#[test]
fn snapshots_are_read_only_and_clones_diverge() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::create(dir.path()).unwrap();
    let base = Volume::create(&store, "base", 16 * BS, BS as u32).unwrap();
    base.write_at(0, &[7u8; 8192], Durability::Immediate)
        .unwrap();
    let snap = Volume::snapshot(&store, "base", "base.1").unwrap();
    assert!(matches!(
        snap.write_at(0, b"x", Durability::Immediate),
        Err(Error::ReadOnly(_))
    ));
    let clone = Volume::clone_volume(&store, "base.1", "work").unwrap();
    clone
        .write_at(4096, &[9u8; 4096], Durability::Immediate)
        .unwrap();
    let mut b = [0u8; 2];
    base.read_at(4095, &mut b).unwrap();
    assert_eq!(b, [7, 7]);
    clone.read_at(4095, &mut b).unwrap();
    assert_eq!(b, [7, 9]);
    let names: Vec<String> = Volume::list(&store)
        .unwrap()
        .into_iter()
        .map(|v| v.name)
        .collect();
    assert_eq!(names, ["base", "base.1", "work"]);
    // main is a branch but not a volume.
    assert!(matches!(
        Volume::open(&store, "main"),
        Err(Error::VolumeNotFound(_))
    ));
    assert!(matches!(
        Volume::open(&store, "nope"),
        Err(Error::VolumeNotFound(_))
    ));
    Volume::drop_volume(&store, "work").unwrap();
    assert_eq!(Volume::names(&store).unwrap().len(), 2);
}

#[test]
fn bad_geometry_and_ranges_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::create(dir.path()).unwrap();
    assert!(Volume::create(&store, "a", 1000, 4096).is_err());
    assert!(Volume::create(&store, "a", 4096, 1000).is_err());
    let v = Volume::create(&store, "a", 8192, 4096).unwrap();
    assert!(matches!(
        Volume::create(&store, "a", 8192, 4096),
        Err(Error::VersionExists(_))
    ));
    let mut buf = [0u8; 10];
    assert!(v.read_at(8190, &mut buf).is_err());
    assert!(v.read_at(u64::MAX - 2, &mut buf).is_err());
    assert!(v.write_at(8192, b"x", Durability::Immediate).is_err());
    assert!(v.write_zeroes(1, u64::MAX, Durability::Immediate).is_err());
    // A handle opened before a shrink refuses to write past the new end.
    let mut other = Volume::open(&store, "a").unwrap();
    other.resize(4096).unwrap();
    assert!(v.write_at(0, b"x", Durability::Immediate).is_err());
    other.resize(8192).unwrap();
}

#[test]
fn check_finds_blocks_the_header_does_not_allow() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::create(dir.path()).unwrap();
    let vol = Volume::create(&store, "disk", 8 * BS, BS as u32).unwrap();
    vol.write_at(0, &[1u8; 8192], Durability::Immediate)
        .unwrap();
    assert_eq!(vol.check().unwrap(), Vec::<String>::new());
    // Written around the volume layer: a short block, one past the end, a stray key.
    let mut txn = store.begin_write_on("disk").unwrap();
    txn.put(&block_key(3), &[7u8; 100]).unwrap();
    txn.put(&block_key(8), &[7u8; BS as usize]).unwrap();
    txn.put(b"\x01short", b"x").unwrap();
    txn.commit().unwrap();
    let problems = vol.check().unwrap();
    assert_eq!(problems.len(), 3, "{problems:?}");
    assert!(
        problems[0].contains("block 3 holds 100 bytes"),
        "{problems:?}"
    );
    assert!(problems
        .iter()
        .any(|p| p.contains("block 8 lies past the end")));
    assert!(problems.iter().any(|p| p.contains("names no block")));
}

#[test]
fn allocation_merges_a_long_run_even_when_asked_for_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::create(dir.path()).unwrap();
    let vol = Volume::create(&store, "disk", 1024 * BS, BS as u32).unwrap();
    vol.write_at(
        10 * BS,
        &vec![1u8; (100 * BS) as usize],
        Durability::Immediate,
    )
    .unwrap();
    let size = vol.size();
    let one = |offset| vol.allocation(offset, size - offset, 1).unwrap();
    // REQ_ONE-style questions get whole runs, not a block at a time.
    assert_eq!(
        one(0),
        [Run {
            len: 10 * BS,
            allocated: false
        }]
    );
    assert_eq!(
        one(10 * BS),
        [Run {
            len: 100 * BS,
            allocated: true
        }]
    );
    assert_eq!(
        one(50 * BS + 7),
        [Run {
            len: 60 * BS - 7,
            allocated: true
        }]
    );
    assert_eq!(
        one(110 * BS),
        [Run {
            len: size - 110 * BS,
            allocated: false
        }]
    );
    let all = vol.allocation(0, size, 16).unwrap();
    assert_eq!(
        all,
        [
            Run {
                len: 10 * BS,
                allocated: false
            },
            Run {
                len: 100 * BS,
                allocated: true
            },
            Run {
                len: size - 110 * BS,
                allocated: false
            },
        ]
    );
}

/// Short keys (block numbers) fill a branch with at most 160 children whatever their
/// size (`BRANCH_ENTRIES_MAX`): every small commit copies the branches on its path.
#[test]
fn branches_of_short_keys_are_capped_in_entries() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::create(dir.path().join("s")).unwrap();
    let mut txn = store.begin_write().unwrap();
    // ~70 entries a leaf: ~1,700 leaves, which 8 KiB branches would hold 300 apiece.
    for block in 0..120_000u64 {
        txn.put(&block_key(block), &[block as u8; 100]).unwrap();
    }
    txn.commit().unwrap();
    store.checkpoint().unwrap();
    let stats = store.stats().unwrap();
    // Every node but the root is one branch's child.
    let children = stats.leaf_nodes + stats.branch_nodes - 1;
    assert!(
        children <= 160 * stats.branch_nodes,
        "{} children under {} branches",
        children,
        stats.branch_nodes
    );
    assert!(stats.depth <= 3, "depth {}", stats.depth);
}

/// A large write's blocks go to disk before its transaction takes the writer lock:
/// a snapshot taken while that write is in flight completes without waiting for it
/// (the lock held through an 8 MiB direct write paused snapshots for milliseconds),
/// and does not see the write, which the volume reads back whole after it.
#[test]
fn a_snapshot_does_not_wait_for_a_large_writes_data() {
    let (sim, store) = sim_store();
    let vol = Volume::create(&store, "disk", 4 << 20, BS as u32).unwrap();
    // The data segment exists once a block is written.
    vol.write_at(0, &[1u8; BS as usize], Durability::Immediate)
        .unwrap();
    let data_segment = sim
        .names()
        .into_iter()
        .filter(|n| n.starts_with("seg-"))
        .max()
        .unwrap();
    let (done, snapshotted) = std::sync::mpsc::channel();
    let snapshotter = store.clone();
    sim.before_next_write_to(&data_segment, move || {
        // On the writing thread, the blocks not yet written: a snapshot from another.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(Volume::snapshot(&snapshotter, "disk", "during").map(|_| ()));
        });
        let result = rx.recv_timeout(std::time::Duration::from_secs(10));
        let _ = done.send(result.map_err(|_| "the snapshot waited for the write"));
    });
    let mut big = crate::io::AlignedBuf::default();
    big.extend_from_slice(&vec![9u8; 2 << 20]);
    vol.write_at(0, big.as_slice(), Durability::Deferred)
        .unwrap();
    let result = snapshotted.recv().expect("the hook ran");
    result.expect("no timeout").expect("snapshot");
    let during = Volume::open(&store, "during").unwrap();
    let mut b = vec![0u8; BS as usize];
    during.read_at(0, &mut b).unwrap();
    assert_eq!(
        b,
        vec![1u8; BS as usize],
        "the snapshot does not see the write"
    );
    let mut all = vec![0u8; 2 << 20];
    vol.read_at(0, &mut all).unwrap();
    assert!(all.iter().all(|&x| x == 9));
}

/// A handle drops only the volume it was opened on: after that volume was dropped and
/// another made under its name, `drop_this` leaves the newcomer alone (an import cut
/// short once dropped a volume made meanwhile, flushed data and all).
#[test]
fn drop_this_leaves_a_newcomer_of_the_same_name_alone() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::create(dir.path()).unwrap();
    let (filling, _guard) = Volume::create_filling(&store, "imp", 16 * BS, BS as u32).unwrap();
    Volume::drop_volume(&store, "imp").unwrap();
    let newcomer = Volume::create(&store, "imp", 8 * BS, BS as u32).unwrap();
    newcomer
        .write_at(0, &[5u8; BS as usize], Durability::Immediate)
        .unwrap();
    assert!(matches!(filling.drop_this(), Err(Error::VolumeNotFound(_))));
    let mut b = vec![0u8; BS as usize];
    Volume::open(&store, "imp")
        .unwrap()
        .read_at(0, &mut b)
        .unwrap();
    assert_eq!(
        b,
        vec![5u8; BS as usize],
        "the newcomer and its data are there"
    );
    // Its own handle drops it.
    newcomer.drop_this().unwrap();
    assert!(matches!(
        Volume::open(&store, "imp"),
        Err(Error::VolumeNotFound(_))
    ));
}

/// A write in two steps: the blocks written ahead are out of sight until committed,
/// and never in the volume if the commit does not come (a crash, or the write
/// dropped); a write that is not all whole blocks of data is left to `write_at`.
#[test]
fn blocks_written_ahead_are_seen_only_once_committed() {
    let (sim, store) = sim_store();
    let vol = Volume::create(&store, "disk", 1 << 20, BS as u32).unwrap();
    vol.write_at(0, &[1u8; 4 * BS as usize], Durability::Deferred)
        .unwrap();
    let read = |vol: &Volume| {
        let mut b = vec![0u8; 4 * BS as usize];
        vol.read_at(0, &mut b).unwrap();
        b
    };

    let ahead = vol
        .write_ahead(BS, &[2u8; 2 * BS as usize])
        .unwrap()
        .expect("whole blocks of data");
    assert!(read(&vol).iter().all(|&x| x == 1), "seen before its commit");
    ahead.commit(Durability::Deferred).unwrap();
    let mut want = vec![1u8; 4 * BS as usize];
    want[BS as usize..3 * BS as usize].fill(2);
    assert_eq!(read(&vol), want);

    let dropped = vol.write_ahead(0, &[3u8; BS as usize]).unwrap();
    drop(dropped);
    assert_eq!(
        read(&vol),
        want,
        "a write never committed is not in the volume"
    );

    // Written ahead, then the process killed before the commit (every write kept):
    // not there after recovery.
    let lost = vol.write_ahead(0, &[4u8; BS as usize]).unwrap();
    vol.sync().unwrap();
    let after = sim.crash_keep_all();
    drop(lost);
    drop(vol);
    drop(store);
    let store = Store::open_with(SIM_DIR, sim_options(&after)).unwrap();
    let vol = Volume::open(&store, "disk").unwrap();
    assert_eq!(read(&vol), want);

    let mut partial = vec![5u8; 2 * BS as usize];
    partial[..BS as usize].fill(0);
    assert!(
        vol.write_ahead(0, &partial).unwrap().is_none(),
        "a block of zeroes is a hole, not data"
    );
    assert!(vol.write_ahead(1, &[6u8; BS as usize]).unwrap().is_none());
    assert!(matches!(
        vol.write_ahead(1 << 20, &[7u8; BS as usize]),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(read(&vol), want, "nothing written by refusals");
}

/// A block's bytes for the model of `long_runs_map_as_blocks_one_at_a_time_would`:
/// its index and the write that last set it, so every block of every write differs.
fn stamped(block: u64, write: u32) -> Vec<u8> {
    let mut b = vec![0u8; BS as usize];
    for (i, word) in b.chunks_mut(8).enumerate() {
        word.copy_from_slice(&(block << 32 | u64::from(write) << 8 | i as u64).to_le_bytes());
    }
    b
}

/// Long runs of consecutive blocks, each mapped in by one pass down the tree per
/// leaf (`btree::insert_run`): over holes (leaves fill and split under the run),
/// over blocks written before (values replaced in place), across leaf boundaries,
/// into leaves a snapshot shares, and after trims; every block reads back as the
/// model says, snapshots keep theirs, a reopen changes nothing and `verify` finds
/// the tree well formed (sizes, key order, separators, counts).
#[test]
fn long_runs_map_as_blocks_one_at_a_time_would() {
    const BLOCKS: u64 = 6000;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let mut store = Store::create(&path).unwrap();
    let mut vol = Volume::create(&store, "disk", BLOCKS * BS, BS as u32).unwrap();
    let mut rng = Rng(0x5EED_0F20_2611);
    // The write that last set each block (0: a hole).
    let mut model = vec![0u32; BLOCKS as usize];
    let mut snapshots: Vec<(String, Vec<u32>)> = Vec::new();
    let check_all = |vol: &Volume, model: &[u32]| {
        let mut buf = vec![0u8; (BLOCKS * BS) as usize];
        vol.read_at(0, &mut buf).unwrap();
        for (block, (&write, got)) in model.iter().zip(buf.chunks(BS as usize)).enumerate() {
            let want = match write {
                0 => vec![0u8; BS as usize],
                w => stamped(block as u64, w),
            };
            assert!(
                got == want,
                "{}: block {block} is not write {write}'s",
                vol.name()
            );
        }
    };
    for write in 1..=60u32 {
        match rng.below(10) {
            0 => {
                let name = format!("snap{write}");
                Volume::snapshot(&store, "disk", &name).unwrap();
                snapshots.push((name, model.clone()));
            }
            1 => {
                let start = rng.below(BLOCKS);
                let len = rng.below(BLOCKS - start).min(700) + 1;
                vol.trim(start * BS, len * BS, Durability::Deferred)
                    .unwrap();
                model[start as usize..(start + len) as usize].fill(0);
            }
            2 => {
                drop(vol);
                store.close().unwrap();
                store = Store::open(&path).unwrap();
                vol = Volume::open(&store, "disk").unwrap();
            }
            _ => {
                let start = rng.below(BLOCKS);
                let len = rng.below(BLOCKS - start).min(2500) + 1;
                let data: Vec<u8> = (start..start + len)
                    .flat_map(|b| stamped(b, write))
                    .collect();
                vol.write_ahead(start * BS, &data)
                    .unwrap()
                    .expect("whole blocks of data")
                    .commit(Durability::Deferred)
                    .unwrap();
                model[start as usize..(start + len) as usize].fill(write);
            }
        }
        if write % 10 == 0 {
            check_all(&vol, &model);
        }
    }
    check_all(&vol, &model);
    for (name, frozen) in &snapshots {
        check_all(&Volume::open(&store, name).unwrap(), frozen);
    }
    let allocated = model.iter().filter(|&&w| w != 0).count() as u64;
    assert_eq!(vol.allocated_bytes().unwrap(), allocated * BS);
    store.checkpoint().unwrap();
    assert!(store.verify().unwrap().is_clean());
    drop(vol);
    store.close().unwrap();
    let store = Store::open(&path).unwrap();
    check_all(&Volume::open(&store, "disk").unwrap(), &model);

    // One run of thousands of blocks into an empty volume: the leaves it fills split
    // as it goes.
    let wide = Volume::create(&store, "wide", BLOCKS * BS, BS as u32).unwrap();
    let data: Vec<u8> = (0..BLOCKS).flat_map(|b| stamped(b, 7)).collect();
    let ahead = wide.write_ahead(0, &data).unwrap().expect("whole blocks");
    let pairs: Vec<(&[u8], BlockRef)> = ahead
        .keys
        .iter()
        .zip(&ahead.extents)
        .map(|(k, r)| (&k[..], *r))
        .collect();
    let mut txn = wide.begin(Durability::Deferred).unwrap();
    txn.put_written(&pairs).unwrap();
    txn.commit().unwrap();
    drop(ahead);
    check_all(&wide, &vec![7; BLOCKS as usize]);
    store.checkpoint().unwrap();
    assert!(store.verify().unwrap().is_clean());
}
