//! The cleaner beside volume writers: clean, shrink, defrag and checkpoint (as
//! `serve` runs them, since they reach it over the control socket) beside writers,
//! snapshots, clones, drops and readers on one `Store`, so the windows between a
//! pinned write and its commit, a seal and a round, a lent snapshot and a relocation
//! are hit many times per second. Every sector is tagged (number, version) and
//! checked against a model; the store must verify clean, and read back the same after
//! a close and reopen. `CAMBIUM_SEED` replays a run, `CAMBIUM_CLEAN_SECS` sets its
//! length (default 8 s).

use cambium::volume::Volume;
use cambium::{Durability, Options, Store};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

const SECTOR: u64 = 512;
const BLOCK: u64 = 4096;
const MIB: u64 = 1 << 20;
const VOL_BYTES: u64 = 16 * MIB;
const VOL_SECTORS: u64 = VOL_BYTES / SECTOR;
const WRITERS: u64 = 3;

struct Rng(u64);
impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn fill_sector(buf: &mut [u8], sector: u64, version: u64) {
    if version == 0 {
        buf.fill(0);
        return;
    }
    buf[..8].copy_from_slice(&(sector + 1).to_le_bytes());
    buf[8..16].copy_from_slice(&version.to_le_bytes());
    let mut r = Rng::new(sector ^ version.rotate_left(29));
    for chunk in buf[16..].chunks_mut(8) {
        chunk.copy_from_slice(&r.next().to_le_bytes()[..chunk.len()]);
    }
}

fn make_data(first: u64, count: u64, version: u64) -> Vec<u8> {
    let mut data = vec![0u8; (count * SECTOR) as usize];
    for (i, chunk) in data.chunks_mut(SECTOR as usize).enumerate() {
        fill_sector(chunk, first + i as u64, version);
    }
    data
}

fn check(what: &str, data: &[u8], first_sector: u64, want: &[u64]) -> Result<(), String> {
    let mut buf = vec![0u8; SECTOR as usize];
    for (i, chunk) in data.chunks(SECTOR as usize).enumerate() {
        let s = first_sector + i as u64;
        fill_sector(&mut buf, s, want[s as usize]);
        if chunk != &buf[..] {
            let tag = u64::from_le_bytes(chunk[..8].try_into().unwrap());
            let ver = u64::from_le_bytes(chunk[8..16].try_into().unwrap());
            return Err(format!(
                "{what}: sector {s}: want version {}, found tag {} version {ver}",
                want[s as usize],
                tag.wrapping_sub(1)
            ));
        }
    }
    Ok(())
}

struct Snap {
    name: String,
    versions: Vec<u64>,
    clone: Option<(String, Vec<u64>)>,
}

struct Shared {
    store: Store,
    model: Mutex<Vec<u64>>,
    pause: RwLock<()>,
    stop: AtomicBool,
    version: AtomicU64,
    snaps: Mutex<Vec<Arc<Snap>>>,
    failures: Mutex<Vec<String>>,
    stats: Mutex<HashMap<&'static str, u64>>,
}

impl Shared {
    fn fail(&self, msg: String) {
        eprintln!("FAILURE: {msg}");
        self.failures.lock().unwrap().push(msg);
        self.stop.store(true, Ordering::SeqCst);
    }
    fn count(&self, what: &'static str) {
        *self.stats.lock().unwrap().entry(what).or_default() += 1;
    }
}

fn writer(sh: Arc<Shared>, idx: u64, seed: u64) {
    let span = VOL_SECTORS / WRITERS / 8 * 8;
    let (lo, hi) = (idx * span, (idx + 1) * span);
    let (blo, bhi) = (lo * SECTOR / BLOCK, hi * SECTOR / BLOCK);
    let mut rng = Rng::new(seed ^ (idx + 7));
    let vol = match Volume::open(&sh.store, "disk") {
        Ok(v) => v,
        Err(e) => return sh.fail(format!("open: {e}")),
    };
    while !sh.stop.load(Ordering::SeqCst) {
        let _p = sh.pause.read().unwrap();
        let c = rng.below(100);
        let mut writes: Vec<(u64, u64, u64, Vec<u8>)> = Vec::new();
        if c < 55 {
            // Whole small blocks: written ahead of the transaction, pinned.
            for _ in 0..1 + rng.below(16) {
                let b = blo + rng.below(bhi - blo);
                let v = sh.version.fetch_add(1, Ordering::SeqCst);
                let f = b * BLOCK / SECTOR;
                writes.push((f, BLOCK / SECTOR, v, make_data(f, BLOCK / SECTOR, v)));
            }
        } else if c < 65 {
            // Large: a direct write beside the transaction.
            let blocks = 64 + rng.below(128);
            let b = blo + rng.below(bhi - blo - blocks);
            let v = sh.version.fetch_add(1, Ordering::SeqCst);
            let f = b * BLOCK / SECTOR;
            writes.push((
                f,
                blocks * BLOCK / SECTOR,
                v,
                make_data(f, blocks * BLOCK / SECTOR, v),
            ));
        } else if c < 72 {
            // Partial blocks.
            for _ in 0..1 + rng.below(3) {
                let f = lo + rng.below(hi - lo - 8);
                let n = 1 + rng.below(7);
                let v = sh.version.fetch_add(1, Ordering::SeqCst);
                writes.push((f, n, v, make_data(f, n, v)));
            }
        } else if c < 76 {
            let blocks = 1 + rng.below(8);
            let b = blo + rng.below(bhi - blo - blocks);
            if let Err(e) = vol.write_zeroes(b * BLOCK, blocks * BLOCK, Durability::Deferred) {
                return sh.fail(format!("writer {idx} zeroes: {e}"));
            }
            let mut m = sh.model.lock().unwrap();
            for s in b * BLOCK / SECTOR..(b + blocks) * BLOCK / SECTOR {
                m[s as usize] = 0;
            }
            sh.count("zeroes");
            continue;
        } else if c < 94 {
            let f = lo + rng.below(hi - lo - 256);
            let n = 1 + rng.below(256);
            let mut buf = vec![0u8; (n * SECTOR) as usize];
            if let Err(e) = vol.read_at(f * SECTOR, &mut buf) {
                return sh.fail(format!("writer {idx} read: {e}"));
            }
            let m = sh.model.lock().unwrap();
            if let Err(e) = check(&format!("writer {idx} read-back"), &buf, f, &m) {
                drop(m);
                return sh.fail(e);
            }
            sh.count("read");
            continue;
        } else {
            if let Err(e) = vol.sync() {
                return sh.fail(format!("writer {idx} sync: {e}"));
            }
            sh.count("sync");
            continue;
        }
        let pairs: Vec<(u64, &[u8])> = writes
            .iter()
            .map(|(f, _, _, d)| (f * SECTOR, &d[..]))
            .collect();
        if let Err(e) = vol.write_many(&pairs, Durability::Deferred) {
            return sh.fail(format!("writer {idx} write: {e}"));
        }
        let mut m = sh.model.lock().unwrap();
        for (f, n, v, _) in &writes {
            for s in *f..f + n {
                m[s as usize] = *v;
            }
        }
        sh.count("write");
    }
}

fn snapshotter(sh: Arc<Shared>, seed: u64) {
    let mut rng = Rng::new(seed ^ 0xABC);
    let mut n = 0;
    let mut worst = Duration::ZERO;
    while !sh.stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(20 + rng.below(80)));
        n += 1;
        let name = format!("snap{n}");
        let versions;
        {
            let _p = sh.pause.write().unwrap();
            let t = Instant::now();
            if let Err(e) = Volume::snapshot_with(&sh.store, "disk", &name, Durability::Deferred) {
                return sh.fail(format!("snapshot {name}: {e}"));
            }
            worst = worst.max(t.elapsed());
            versions = sh.model.lock().unwrap().clone();
        }
        sh.count("snapshot");
        let mut clone = None;
        if rng.below(3) == 0 {
            let cname = format!("clone{n}");
            let c = match Volume::clone_with(&sh.store, &name, &cname, Durability::Deferred) {
                Ok(c) => c,
                Err(e) => return sh.fail(format!("clone {cname}: {e}")),
            };
            let mut cv = versions.clone();
            for _ in 0..1 + rng.below(8) {
                let b = rng.below(VOL_BYTES / BLOCK);
                let v = sh.version.fetch_add(1, Ordering::SeqCst);
                let f = b * BLOCK / SECTOR;
                if let Err(e) = c.write_at(
                    b * BLOCK,
                    &make_data(f, BLOCK / SECTOR, v),
                    Durability::Deferred,
                ) {
                    return sh.fail(format!("clone {cname} write: {e}"));
                }
                for s in f..f + BLOCK / SECTOR {
                    cv[s as usize] = v;
                }
            }
            sh.count("clone");
            clone = Some((cname, cv));
        }
        let snap = Arc::new(Snap {
            name,
            versions,
            clone,
        });
        let victim = {
            let mut snaps = sh.snaps.lock().unwrap();
            snaps.push(snap);
            if snaps.len() > 6 {
                snaps
                    .iter()
                    .position(|s| Arc::strong_count(s) == 1)
                    .map(|i| snaps.remove(i))
            } else {
                None
            }
        };
        if let Some(v) = victim {
            for name in v.clone.iter().map(|c| c.0.clone()).chain([v.name.clone()]) {
                if let Err(e) = Volume::drop_volume(&sh.store, &name) {
                    return sh.fail(format!("drop {name}: {e}"));
                }
                sh.count("drop");
            }
        }
    }
    *sh.stats.lock().unwrap().entry("snap-worst-us").or_default() = worst.as_micros() as u64;
}

fn reader(sh: Arc<Shared>, seed: u64) {
    let mut rng = Rng::new(seed ^ 0xDEF);
    while !sh.stop.load(Ordering::SeqCst) {
        let snap = {
            let snaps = sh.snaps.lock().unwrap();
            (!snaps.is_empty()).then(|| snaps[rng.below(snaps.len() as u64) as usize].clone())
        };
        let Some(snap) = snap else {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        };
        let (name, model) = match (&snap.clone, rng.below(2)) {
            (Some((c, m)), 0) => (c.as_str(), &m[..]),
            _ => (snap.name.as_str(), &snap.versions[..]),
        };
        let vol = match Volume::open(&sh.store, name) {
            Ok(v) => v,
            Err(e) => return sh.fail(format!("reader open {name}: {e}")),
        };
        for _ in 0..10 {
            let n = 1 + rng.below(512);
            let f = rng.below(VOL_SECTORS - n);
            let mut buf = vec![0u8; (n * SECTOR) as usize];
            if let Err(e) = vol.read_at(f * SECTOR, &mut buf) {
                return sh.fail(format!("reader {name} read: {e}"));
            }
            if let Err(e) = check(&format!("reader {name}"), &buf, f, model) {
                return sh.fail(e);
            }
            sh.count("snap-read");
        }
    }
}

fn maintenance(sh: Arc<Shared>, seed: u64) {
    let mut rng = Rng::new(seed ^ 0x123);
    while !sh.stop.load(Ordering::SeqCst) {
        let snap = sh.snaps.lock().unwrap().last().map(|s| s.name.clone());
        let (what, r) = match rng.below(7) {
            0 => ("clean", sh.store.clean(10.0).map(drop)),
            1 => ("clean", sh.store.clean(0.0).map(drop)),
            2 => ("shrink", sh.store.shrink().map(drop)),
            3 => ("defrag", sh.store.defrag(None).map(drop)),
            4 => ("defrag", sh.store.defrag(Some("disk")).map(drop)),
            5 => match snap {
                Some(s) => match sh.store.defrag(Some(&s)) {
                    // Dropped meanwhile.
                    Err(cambium::Error::VersionNotFound(_)) => ("defrag", Ok(())),
                    r => ("defrag", r.map(drop)),
                },
                None => ("checkpoint", sh.store.checkpoint()),
            },
            _ => ("checkpoint", sh.store.checkpoint()),
        };
        if let Err(e) = r {
            return sh.fail(format!("{what}: {e}"));
        }
        sh.count(what);
        std::thread::sleep(Duration::from_millis(rng.below(20)));
    }
}

/// Every volume, snapshot and clone against its model, then `verify` (`when` names
/// the moment in a failure).
fn verify_all(store: &Store, model: &[u64], snaps: &[Arc<Snap>], when: &str) {
    let read = |name: &str, want: &[u64]| {
        let vol = Volume::open(store, name).unwrap_or_else(|e| panic!("open {name}: {e}"));
        let mut buf = vec![0u8; VOL_BYTES as usize];
        vol.read_at(0, &mut buf).unwrap();
        check(name, &buf, 0, want).unwrap_or_else(|e| panic!("{e}"));
    };
    read("disk", model);
    for s in snaps {
        read(&s.name, &s.versions);
        if let Some((c, cv)) = &s.clone {
            read(c, cv);
        }
    }
    let report = store.verify().unwrap();
    assert!(report.is_clean(), "{when}: verify: {:?}", report.problems);
}

#[test]
fn in_process_clean_shrink_defrag_beside_volume_writers() {
    let seed: u64 = std::env::var("CAMBIUM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    let secs: u64 = std::env::var("CAMBIUM_CLEAN_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    eprintln!("CAMBIUM_SEED={seed}");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let store = Store::create_with(&dir, Options::default()).unwrap();
    Volume::create(&store, "disk", VOL_BYTES, BLOCK as u32).unwrap();
    let sh = Arc::new(Shared {
        store: store.clone(),
        model: Mutex::new(vec![0; VOL_SECTORS as usize]),
        pause: RwLock::new(()),
        stop: AtomicBool::new(false),
        version: AtomicU64::new(1),
        snaps: Mutex::new(Vec::new()),
        failures: Mutex::new(Vec::new()),
        stats: Mutex::new(HashMap::new()),
    });
    let mut hs = Vec::new();
    for i in 0..WRITERS {
        let sh = sh.clone();
        hs.push(std::thread::spawn(move || writer(sh, i, seed)));
    }
    for f in [
        snapshotter as fn(Arc<Shared>, u64),
        reader,
        maintenance,
        maintenance,
    ] {
        let sh = sh.clone();
        hs.push(std::thread::spawn(move || f(sh, seed)));
    }
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline && !sh.stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(50));
    }
    sh.stop.store(true, Ordering::SeqCst);
    let stuck = Instant::now() + Duration::from_secs(60);
    while hs.iter().any(|h| !h.is_finished()) {
        assert!(
            Instant::now() < stuck,
            "seed {seed}: workers still running 60 s after the stop (deadlock?); stats {:?}",
            sh.stats.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for h in hs {
        if let Err(p) = h.join() {
            std::panic::resume_unwind(p);
        }
    }
    let mut stats: Vec<_> = sh
        .stats
        .lock()
        .unwrap()
        .iter()
        .map(|(k, v)| (*k, *v))
        .collect();
    stats.sort();
    eprintln!(
        "stats: {stats:?}; lent: {}",
        store.stats().map(|s| s.version_ops_lent).unwrap_or(0)
    );
    let failures = sh.failures.lock().unwrap().clone();
    assert!(failures.is_empty(), "seed {seed}: {failures:#?}");
    let model = sh.model.lock().unwrap().clone();
    let snaps = sh.snaps.lock().unwrap().clone();
    verify_all(&store, &model, &snaps, &format!("seed {seed}"));
    drop(sh);
    store.close().unwrap();
    let store = Store::open_with(&dir, Options::default()).unwrap();
    verify_all(
        &store,
        &model,
        &snaps,
        &format!("seed {seed}, after reopen"),
    );
    store.close().unwrap();
}
