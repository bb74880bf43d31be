//! Corruption detection tests.
//!
//! Method: a store is built with a known history: a first checkpoint, more commits
//! and a second checkpoint (so both superblock slots are valid), then a few
//! Immediate commits that are only in the WAL; it holds small values, values near
//! the inline limit and large values (extents), and enough keys for branch nodes.
//! It is closed without a final checkpoint. Then, on a fresh copy of that image for
//! every case, one byte is XORed at an offset chosen across the file (one random
//! offset per 512-byte stretch of the file, plus targeted offsets: every byte of
//! the used part of each superblock slot, WAL record headers), in each kind of file:
//! segments (leaf and branch nodes, extents, the metadata blob), the WAL and the
//! superblock. The store is then opened, every key of the model is read, the whole
//! store is scanned forwards and backwards, and `verify()` runs.
//!
//! Invariants (the "never wrong data, never panic" rule):
//! - nothing panics;
//! - open either fails with a corruption error (`is_corruption()`, or
//!   `FormatVersion` when the version field itself was hit), or succeeds;
//! - after a successful open, every read returns either the model's value or an
//!   error whose `is_corruption()` is true — never a wrong value, never a missing or
//!   extra key; a scan yields exactly the model's entries in order up to the first
//!   error;
//! - the recovered state is the full model — except that a corrupted WAL record may
//!   be dropped when it is the last one (the state is then the model minus the last
//!   commit): losing any other acknowledged commit silently is a failure;
//! - `verify()` returns `Ok(report)`, and the report lists problems whenever any
//!   read failed;
//! - a corrupted newest superblock slot makes open fall back to the older slot (with
//!   the full state recovered) or fail with a corruption error; a corrupted older
//!   slot is harmless; both slots corrupted is a corruption error; the zero padding
//!   of a slot is not used.
//!
//! The same checks also run on a real directory (`StdVfs`) for a sample of offsets.
//! Replay one seed with `CAMBIUM_SEED=N`; scale with `CAMBIUM_CORRUPTION_CASES=N`.

mod common;

use cambium::io::sim::SimVfs;
use cambium::{Error, Options, Store};
use common::*;
use std::collections::BTreeMap;

type Entry = (Vec<u8>, Vec<u8>);

/// The image and the history that produced it.
struct Base {
    image: SimVfs,
    /// `states[i]`: the model after `i` commits; the last one is the full state.
    states: Vec<Model>,
    /// Number of commits covered by the last checkpoint.
    checkpointed: usize,
}

fn options(vfs: &SimVfs) -> Options {
    Options {
        checkpoint_on_close: false,
        cache_bytes: 64 * 1024,
        ..sim_options(vfs)
    }
}

fn commit(
    store: &Store,
    states: &mut Vec<Model>,
    writes: &[(Vec<u8>, Option<Vec<u8>>)],
) -> Result<(), String> {
    let mut next = states.last().unwrap().clone();
    let mut txn = ctx(store.begin_write(), "begin")?;
    for (k, v) in writes {
        match v {
            Some(v) => {
                ctx(txn.put(k, v), "put")?;
                next.insert(k.clone(), v.clone());
            }
            None => {
                ctx(txn.delete(k), "delete")?;
                next.remove(k);
            }
        }
    }
    ctx(txn.commit(), "commit")?;
    states.push(next);
    Ok(())
}

fn build_base(seed: u64) -> Result<Base, String> {
    build_base_with(seed, false)
}

/// `checkpoint_on_close`: close with a final checkpoint (then no WAL tail remains).
fn build_base_with(seed: u64, checkpoint_on_close: bool) -> Result<Base, String> {
    let mut rng = Rng::new(seed ^ 0xC0AA);
    let vfs = SimVfs::new();
    let store = ctx(Store::create_with(SIM_PATH, options(&vfs)), "create")?;
    let mut states = vec![Model::new()];
    // Phase A: ~600 keys of 8..40 bytes (several leaves and a branch level), some
    // large values.
    for _ in 0..12 {
        let mut writes = Vec::new();
        for _ in 0..50 {
            let mut key = format!("key-{:08}", rng.below(100_000)).into_bytes();
            key.extend(rng.letters(0, 28));
            let value = if rng.chance(1, 25) {
                rng.bytes_in(1025, 20_000)
            } else {
                rng.bytes_in(0, 120)
            };
            writes.push((key, Some(value)));
        }
        commit(&store, &mut states, &writes)?;
    }
    ctx(store.checkpoint(), "checkpoint A")?;
    // Phase B: updates, deletes, more extents; second checkpoint.
    for _ in 0..6 {
        let model = states.last().unwrap().clone();
        let mut writes = Vec::new();
        for _ in 0..20 {
            let key = gen_key(&mut rng, &model);
            if rng.chance(1, 4) {
                writes.push((key, None));
            } else {
                writes.push((key, Some(gen_value(&mut rng))));
            }
        }
        commit(&store, &mut states, &writes)?;
    }
    ctx(store.checkpoint(), "checkpoint B")?;
    let checkpointed = states.len() - 1;
    // Phase C: WAL-only commits (each Immediate, acknowledged).
    for i in 0..5 {
        let model = states.last().unwrap().clone();
        let mut writes = vec![(
            format!("wal-only-{i}").into_bytes(),
            Some(rng.bytes_in(10, 300)),
        )];
        let key = gen_key(&mut rng, &model);
        writes.push((key, Some(gen_value(&mut rng))));
        commit(&store, &mut states, &writes)?;
    }
    let checkpointed = if checkpoint_on_close {
        ctx(store.checkpoint(), "final checkpoint")?;
        states.len() - 1
    } else {
        checkpointed
    };
    ctx(store.close(), "close")?;
    // The image is taken before anything else opens it. Sanity: a copy of the
    // uncorrupted image opens with the full state and verifies clean.
    let image = vfs.fork();
    let check = image.fork();
    let s = ctx(
        Store::open_with(SIM_PATH, options(&check)),
        "open clean image",
    )?;
    let got = ctx(s.read().and_then(|r| dump(&r)), "read clean image")?;
    if let Some(d) = diff(&got, states.last().unwrap()) {
        return Err(format!("clean image: {d}"));
    }
    verify_clean(&s, "clean image")?;
    drop(s);
    Ok(Base {
        image,
        states,
        checkpointed,
    })
}

/// What one corruption case did.
#[derive(Default, Debug, Clone, Copy)]
struct Tally {
    cases: u64,
    open_refused: u64,
    reads_failed: u64,
    verify_only: u64,
    undetected: u64,
    last_record_dropped: u64,
}

impl Tally {
    fn add(&mut self, o: &Tally) {
        self.cases += o.cases;
        self.open_refused += o.open_refused;
        self.reads_failed += o.reads_failed;
        self.verify_only += o.verify_only;
        self.undetected += o.undetected;
        self.last_record_dropped += o.last_record_dropped;
    }
}

/// Checks one store image (already corrupted). `may_drop_last`: the corruption is
/// in the WAL, so the last commit may be missing.
fn check_image(
    open: impl Fn() -> cambium::Result<Store>,
    states: &[Model],
    may_drop_last: bool,
    label: &str,
) -> Result<Tally, String> {
    let mut tally = Tally {
        cases: 1,
        ..Tally::default()
    };
    let full = states.last().unwrap();
    let store = match open() {
        Ok(s) => s,
        Err(e) if e.is_corruption() || matches!(e, Error::FormatVersion { .. }) => {
            tally.open_refused = 1;
            return Ok(tally);
        }
        Err(e) => {
            return Err(format!(
                "{label}: open failed with a non-corruption error: {e} ({e:?})"
            ))
        }
    };
    let failed_reads = std::cell::Cell::new(0u64);
    let check_err = |e: Error, what: &str| -> Result<(), String> {
        if e.is_corruption() {
            failed_reads.set(failed_reads.get() + 1);
            Ok(())
        } else {
            Err(format!(
                "{label}: {what} failed with a non-corruption error: {e} ({e:?})"
            ))
        }
    };
    // Which state are we in? The full one, or (WAL corruption) minus the last commit.
    let mut model = full;
    if may_drop_last && states.len() >= 2 {
        let prev = &states[states.len() - 2];
        // Decide by the keys the two states disagree on.
        let read = store.read();
        if let Ok(read) = read {
            let differing: Vec<&Vec<u8>> = full
                .keys()
                .chain(prev.keys())
                .filter(|k| full.get(*k) != prev.get(*k))
                .collect();
            let mut votes_prev = 0;
            let mut votes_full = 0;
            for k in &differing {
                if let Ok(v) = read.get(k) {
                    if v.as_ref() == prev.get(*k) {
                        votes_prev += 1;
                    }
                    if v.as_ref() == full.get(*k) {
                        votes_full += 1;
                    }
                }
            }
            if votes_prev > 0 && votes_full == 0 {
                model = prev;
                tally.last_record_dropped = 1;
            }
        }
    }
    let read = match store.read() {
        Ok(r) => Some(r),
        Err(e) => {
            check_err(e, "read()")?;
            None
        }
    };
    if let Some(read) = &read {
        // Point reads of every key ever written (present or deleted).
        let mut all_keys: BTreeMap<&Vec<u8>, ()> = BTreeMap::new();
        for s in [full, &states[states.len() / 2]] {
            for k in s.keys() {
                all_keys.insert(k, ());
            }
        }
        for k in all_keys.keys() {
            match read.get(k) {
                Ok(v) if v.as_ref() == model.get(*k) => {}
                Ok(v) => {
                    // Which older state is it from, if any?
                    let lost = (0..states.len())
                        .rev()
                        .find(|&i| states[i].get(*k) == v.as_ref());
                    return Err(format!(
                        "{label}: WRONG DATA: get({}) returned {:?} bytes, model {:?} bytes{}",
                        show(k),
                        v.map(|v| v.len()),
                        model.get(*k).map(|v| v.len()),
                        match lost {
                            Some(i) => format!(
                                " (the value after commit {i} of {}): acknowledged commits silently lost",
                                states.len() - 1
                            ),
                            None => String::new(),
                        }
                    ));
                }
                Err(e) => check_err(e, "get")?,
            }
        }
        // Scans forwards and backwards: exact prefix of the model up to an error.
        for reverse in [false, true] {
            let iter = match read.iter() {
                Ok(it) => it,
                Err(e) => {
                    check_err(e, "iter()")?;
                    continue;
                }
            };
            let expect: Box<dyn Iterator<Item = (&Vec<u8>, &Vec<u8>)>> = if reverse {
                Box::new(model.iter().rev())
            } else {
                Box::new(model.iter())
            };
            let got: Box<dyn Iterator<Item = cambium::Result<Entry>>> = if reverse {
                Box::new(iter.rev())
            } else {
                Box::new(iter)
            };
            let mut expect = expect;
            let mut n = 0usize;
            for item in got {
                match item {
                    Ok((k, v)) => {
                        match expect.next() {
                            Some((mk, mv)) if *mk == k && *mv == v => {}
                            Some((mk, _)) => {
                                return Err(format!(
                                    "{label}: WRONG DATA: scan (reverse {reverse}) entry {n} is {} but the model has {}",
                                    show(&k),
                                    show(mk)
                                ))
                            }
                            None => return Err(format!("{label}: WRONG DATA: scan yielded extra key {}", show(&k))),
                        }
                        n += 1;
                    }
                    Err(e) => {
                        check_err(e, "scan")?;
                        break;
                    }
                }
                if n > model.len() + 1 {
                    break;
                }
            }
            if failed_reads.get() == 0 && n != model.len() {
                return Err(format!("{label}: WRONG DATA: scan (reverse {reverse}) ended after {n} of {} entries without an error", model.len()));
            }
        }
    }
    let report = store
        .verify()
        .map_err(|e| format!("{label}: verify returned Err instead of a report: {e} ({e:?})"))?;
    if failed_reads.get() > 0 {
        tally.reads_failed = 1;
        if report.is_clean() {
            return Err(format!(
                "{label}: {} reads failed with corruption errors but verify() reported no problem",
                failed_reads.get()
            ));
        }
    } else if !report.is_clean() {
        tally.verify_only = 1;
    } else if tally.last_record_dropped == 0 {
        tally.undetected = 1;
    }
    Ok(tally)
}

/// Offsets to corrupt in a file of `len` bytes: one random offset in each 512-byte
/// stretch (capped at `cap`, evenly spread), plus `extra` random ones.
fn offsets(rng: &mut Rng, len: u64, cap: u64, extra: u64) -> Vec<u64> {
    let mut out = Vec::new();
    if len == 0 {
        return out;
    }
    let stretches = len.div_ceil(512);
    let step = stretches.div_ceil(cap).max(1);
    let mut s = 0;
    while s < stretches {
        let lo = s * 512;
        let hi = (lo + 512).min(len);
        out.push(lo + rng.below(hi - lo));
        s += step;
    }
    for _ in 0..extra {
        out.push(rng.below(len));
    }
    out
}

/// The length of `data` up to its last non-zero byte, plus a little slack (so the
/// first zero bytes after the last record are hit too).
fn used_len(data: &[u8]) -> u64 {
    let end = data.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    (end + 64).min(data.len()) as u64
}

fn xor_byte(rng: &mut Rng) -> u8 {
    // Single-bit flips mostly, sometimes a whole byte.
    if rng.chance(3, 4) {
        1 << rng.below(8)
    } else {
        (rng.below(255) + 1) as u8
    }
}

fn corrupt_and_check(
    base: &Base,
    name: &str,
    offset: u64,
    xor: u8,
    may_drop_last: bool,
) -> Result<Tally, String> {
    let v = base.image.fork();
    assert!(
        v.corrupt(name, offset, xor),
        "offset {offset} outside {name}"
    );
    let label = format!("{name} byte {offset} ^ {xor:#04x}");
    check_image(
        || Store::open_with(SIM_PATH, options(&v)),
        &base.states,
        may_drop_last,
        &label,
    )
}

fn run_kind(kind: &str, clean_close: bool, cap: u64, extra: u64, want_detection: bool) {
    let mut total = Tally::default();
    let test = format!(
        "corruption_{kind}{}",
        if clean_close { "_clean_close" } else { "" }
    );
    run_seeds(&test, "corruption", 2, |seed| {
        let base = build_base_with(seed, clean_close)?;
        let mut rng = Rng::new(seed ^ 0x0FF5E7);
        let names: Vec<String> = base
            .image
            .names()
            .into_iter()
            .filter(|n| n.starts_with(kind))
            .collect();
        if names.is_empty() {
            return Err(format!(
                "no {kind}* file in the image: {:?}",
                base.image.names()
            ));
        }
        let mut tally = Tally::default();
        for name in &names {
            let len = base.image.file_len(name).unwrap();
            // Files may be preallocated with zeros: sample the written part densely
            // and the zero tail only a little.
            let used = used_len(&base.image.read_file(name).unwrap());
            let mut offs = offsets(&mut rng, used, cap, extra);
            if len > used {
                offs.extend((0..4).map(|_| used + rng.below(len - used)));
            }
            for off in offs {
                let t = corrupt_and_check(
                    &base,
                    name,
                    off,
                    xor_byte(&mut rng),
                    kind.starts_with("wal"),
                )?;
                tally.add(&t);
            }
        }
        eprintln!("corruption {kind} seed {seed} (files {names:?}): {tally:?}");
        if want_detection && tally.open_refused + tally.reads_failed + tally.verify_only == 0 {
            return Err(format!("no {kind} corruption was ever detected: {tally:?}"));
        }
        total.add(&tally);
        Ok(())
    });
    eprintln!("corruption {kind} total: {total:?}");
}

/// Segment files: leaf and branch nodes, extents, the metadata blob.
#[test]
fn corrupt_segments() {
    run_kind("seg-", false, 300, 60, true);
}

/// Segment files of a cleanly closed store (final checkpoint, no WAL tail): a
/// corrupted metadata blob or node must not make open silently fall back to an
/// older checkpoint's state.
#[test]
fn corrupt_segments_after_clean_close() {
    run_kind("seg-", true, 160, 40, true);
}

/// WAL files: records committed after the last checkpoint.
#[test]
fn corrupt_wal() {
    run_kind("wal-", false, 100, 30, false);
}

/// Dense WAL corruption, independent of the record framing: one random byte in
/// each stretch of the written part of every WAL file (8-byte stretches, or wider
/// to stay within 400 cases per file), so every record — the first and the middle
/// ones included, which must never be silently dropped — is hit several times.
#[test]
fn corrupt_each_wal_record() {
    run_seeds("corrupt_each_wal_record", "corruption", 1, |seed| {
        let base = build_base(seed)?;
        let mut rng = Rng::new(seed ^ 0x3A1);
        for name in base
            .image
            .names()
            .into_iter()
            .filter(|n| n.starts_with("wal-"))
        {
            // The written part (WAL files are preallocated with zeros), in strides of
            // 8 bytes, at most 400 cases per file.
            let used = used_len(&base.image.read_file(&name).unwrap());
            let stride = used.div_ceil(400).max(8);
            let mut tally = Tally::default();
            let mut at = 0;
            while at < used {
                let off = at + rng.below(stride.min(used - at));
                let t = corrupt_and_check(&base, &name, off, xor_byte(&mut rng), true)?;
                tally.add(&t);
                at += stride;
            }
            eprintln!("{name} ({used} bytes written): {tally:?}");
        }
        Ok(())
    });
}

/// Superblock: each byte of the used part of each slot, and some padding.
#[test]
fn corrupt_superblock() {
    run_seeds("corrupt_superblock", "corruption", 1, |seed| {
        let base = build_base(seed)?;
        let sb = base
            .image
            .read_file("superblock")
            .ok_or("no superblock file")?;
        if sb.len() < 8192 {
            return Err(format!(
                "superblock file is {} bytes, expected two 4 KiB slots",
                sb.len()
            ));
        }
        let generation = |slot: usize| {
            u64::from_le_bytes(sb[slot * 4096 + 16..slot * 4096 + 24].try_into().unwrap())
        };
        let newest = if generation(0) > generation(1) { 0 } else { 1 };
        let mut rng = Rng::new(seed ^ 0x5B);
        let mut tally = [Tally::default(), Tally::default()];
        for (slot, slot_tally) in tally.iter_mut().enumerate() {
            let padding: Vec<u64> = (0..8).map(|_| 80 + rng.below(4096 - 80)).collect();
            for i in (0..80).chain(padding) {
                let off = (slot * 4096) as u64 + i;
                let t = corrupt_and_check(&base, "superblock", off, xor_byte(&mut rng), false)?;
                if slot != newest && t.open_refused == 1 {
                    return Err(format!(
                        "corrupting byte {i} of the OLDER slot made open fail"
                    ));
                }
                if i >= 80 && t.open_refused == 1 {
                    return Err(format!(
                        "corrupting padding byte {i} of slot {slot} made open fail"
                    ));
                }
                slot_tally.add(&t);
            }
        }
        eprintln!(
            "superblock ({} commits, {} checkpointed): newest slot {newest}: {:?}; older: {:?}",
            base.states.len() - 1,
            base.checkpointed,
            tally[newest],
            tally[1 - newest]
        );
        // Both slots corrupted: a corruption error.
        let v = base.image.fork();
        v.corrupt("superblock", 20, 0x40);
        v.corrupt("superblock", 4096 + 20, 0x40);
        match Store::open_with(SIM_PATH, options(&v)) {
            Err(e) if e.is_corruption() => {}
            Err(e) => return Err(format!("both slots corrupted: non-corruption error {e:?}")),
            Ok(_) => return Err("both slots corrupted: open succeeded".into()),
        }
        Ok(())
    });
}

/// A flipped byte in each of a sample of offsets of every file, on a real directory.
#[test]
fn corrupt_real_files() {
    run_seeds("corrupt_real_files", "corruption", 1, |seed| {
        let base = build_base(seed)?;
        let mut rng = Rng::new(seed ^ 0x4EA1);
        let names = base.image.names();
        let mut tally = Tally::default();
        for name in names.iter().filter(|n| *n != "LOCK") {
            let len = base.image.file_len(name).unwrap();
            for off in offsets(
                &mut rng,
                used_len(&base.image.read_file(name).unwrap()).min(len),
                12,
                3,
            ) {
                let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
                let path = dir.path().join("store");
                std::fs::create_dir(&path).map_err(|e| e.to_string())?;
                for n in &names {
                    let mut data = base.image.read_file(n).unwrap();
                    if n == name {
                        data[off as usize] ^= xor_byte(&mut rng);
                    }
                    std::fs::write(path.join(n), data).map_err(|e| e.to_string())?;
                }
                let opts = Options {
                    checkpoint_on_close: false,
                    cache_bytes: 64 * 1024,
                    background_checkpoints: false,
                    ..Default::default()
                };
                let label = format!("real file {name} byte {off}");
                let t = check_image(
                    || Store::open_with(&path, opts.clone()),
                    &base.states,
                    name.starts_with("wal-"),
                    &label,
                )?;
                tally.add(&t);
            }
        }
        eprintln!("real files: {tally:?}");
        Ok(())
    });
}

/// Corruption found while the store is open (nodes not in the small cache): reads
/// of the corrupted node fail with a corruption error, other reads stay correct.
#[test]
fn corrupt_while_open() {
    run_seeds("corrupt_while_open", "corruption", 1, |seed| {
        let base = build_base(seed)?;
        let mut rng = Rng::new(seed ^ 0x0BE7);
        let mut tally = Tally::default();
        for name in base
            .image
            .names()
            .into_iter()
            .filter(|n| n.starts_with("seg-"))
        {
            let len = base.image.file_len(&name).unwrap();
            for off in offsets(&mut rng, len, 60, 0) {
                let v = base.image.fork();
                let store = ctx(Store::open_with(SIM_PATH, options(&v)), "open")?;
                v.corrupt(&name, off, xor_byte(&mut rng));
                let label = format!("{name} byte {off} corrupted while open");
                let t = check_image(|| Ok(store.clone()), &base.states, false, &label)?;
                tally.add(&t);
            }
        }
        eprintln!("corrupted while open: {tally:?}");
        Ok(())
    });
}

/// A cleanly closed store (final checkpoint, so no WAL records after it) whose
/// newest superblock slot is corrupted: open must not silently fall back to the
/// older checkpoint's state (that would lose acknowledged commits); it must recover
/// the full state or fail with a corruption error.
#[test]
fn corrupt_newest_slot_after_clean_close() {
    run_seeds(
        "corrupt_newest_slot_after_clean_close",
        "corruption",
        1,
        |seed| {
            let base = build_base_with(seed, true)?;
            let sb = base
                .image
                .read_file("superblock")
                .ok_or("no superblock file")?;
            let generation = |slot: usize| {
                u64::from_le_bytes(sb[slot * 4096 + 16..slot * 4096 + 24].try_into().unwrap())
            };
            let newest = if generation(0) > generation(1) { 0 } else { 1 };
            for i in [16u64, 30, 45, 77] {
                let off = newest as u64 * 4096 + i;
                corrupt_and_check(&base, "superblock", off, 0x01, false).map_err(|e| {
                    format!(
                        "newest slot {newest} (generation {}) byte {i}: {e}",
                        generation(newest)
                    )
                })?;
            }
            Ok(())
        },
    );
}
