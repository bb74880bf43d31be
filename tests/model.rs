//! Model-based property tests: the store against a `BTreeMap<Vec<u8>, Vec<u8>>`.
//!
//! Method: for each seed, a random sequence of operations runs against a store on
//! the in-memory [`SimVfs`] and against the model side by side. Operations: write
//! transactions of several puts/deletes (keys from a small, collision-rich space and
//! from a large one; lengths 1..=64, rarely up to `MAX_KEY_LEN`; values mostly
//! 0..=200 bytes, sometimes around the inline limit and up to ~100 KiB so extents
//! are exercised) that are committed (Immediate or Deferred), aborted or dropped;
//! one-shot `Store::put`/`Store::delete`; point reads; range scans forward, reverse
//! and from both ends at once with random inclusive/exclusive/unbounded bounds;
//! prefix scans; `first`/`last`; `count`; key-only iteration; read snapshots held
//! across later commits; checkpoints; close + reopen (and drop + reopen); invalid
//! keys.
//!
//! Invariants: every read equals the model (the committed state for `ReadTxn`s, the
//! transaction's own pending state for `WriteTxn::get`); an aborted or dropped
//! transaction changes nothing; a snapshot keeps seeing the state it was taken at;
//! `verify()` is clean after checkpoints, after reopening and at the end; scans
//! return exactly the model's entries in order, with no duplicates or gaps when
//! consumed from both ends.
//!
//! Replay one seed with `CAMBIUM_SEED=N`; scale with `CAMBIUM_MODEL_CASES=N`
//! (`CAMBIUM_MODEL_LONG_CASES`, `CAMBIUM_DEEP_CASES` for the other two tests).

mod common;

use cambium::io::sim::SimVfs;
use cambium::{Durability, Error, Options, ReadTxn, Store};
use common::*;
use std::ops::Bound;

const OPS_PER_SEED: usize = 300;

struct Harness {
    opts: Options,
    store: Option<Store>,
    model: Model,
    rng: Rng,
    snapshots: Vec<(ReadTxn, Model)>,
    step: usize,
}

impl Harness {
    fn store(&self) -> &Store {
        self.store.as_ref().expect("store is open")
    }

    fn at(&self, what: &str) -> String {
        format!("step {}: {what}", self.step)
    }

    fn check_read(&self, read: &ReadTxn, model: &Model, what: &str) -> Result<(), String> {
        let got = ctx(dump(read), self.at(what))?;
        if let Some(d) = diff(&got, model) {
            return Err(self.at(&format!("{what}: {d}")));
        }
        Ok(())
    }

    fn write_txn(&mut self) -> Result<(), String> {
        let n = self.rng.usize(1, 8);
        let durability = if self.rng.chance(1, 3) {
            Durability::Deferred
        } else {
            Durability::Immediate
        };
        let outcome = self.rng.below(100);
        let mut pending = self.model.clone();
        let store = self.store.as_ref().unwrap();
        let mut txn = ctx(store.begin_write(), self.at("begin_write"))?;
        txn.set_durability(durability);
        for _ in 0..n {
            let key = gen_key(&mut self.rng, &pending);
            if self.rng.chance(7, 10) {
                let value = gen_value(&mut self.rng);
                ctx(txn.put(&key, &value), self.at("txn.put"))?;
                pending.insert(key.clone(), value);
            } else {
                let existed = ctx(txn.delete(&key), self.at("txn.delete"))?;
                let was = pending.remove(&key).is_some();
                if existed != was {
                    return Err(self.at(&format!(
                        "txn.delete({}) returned {existed}, model says {was}",
                        show(&key)
                    )));
                }
            }
            if self.rng.chance(1, 3) {
                // Read-your-writes inside the transaction.
                let probe = gen_key(&mut self.rng, &pending);
                let got = if self.rng.chance(1, 2) {
                    ctx(txn.get(&probe), self.at("txn.get"))?
                } else {
                    ctx(
                        txn.get_with(&probe, <[u8]>::to_vec),
                        self.at("txn.get_with"),
                    )?
                };
                if got.as_ref() != pending.get(&probe) {
                    return Err(self.at(&format!(
                        "txn.get({}) disagrees with the pending state",
                        show(&probe)
                    )));
                }
                // The committed view is unaffected by the open transaction.
                let got = ctx(store.get(&probe), self.at("store.get during txn"))?;
                if got.as_ref() != self.model.get(&probe) {
                    return Err(self.at(&format!(
                        "store.get({}) during an open txn shows uncommitted state",
                        show(&probe)
                    )));
                }
            }
        }
        if outcome < 88 {
            ctx(txn.commit(), self.at("commit"))?;
            self.model = pending;
        } else if outcome < 94 {
            txn.abort();
        } else {
            drop(txn);
        }
        Ok(())
    }

    fn scan(&mut self) -> Result<(), String> {
        let lo = gen_bound(&mut self.rng, &self.model);
        let hi = gen_bound(&mut self.rng, &self.model);
        let want = model_range(&self.model, &lo, &hi);
        let read = ctx(self.store().read(), self.at("read"))?;
        let desc = format!("range({lo:?}, {hi:?})")
            .chars()
            .take(300)
            .collect::<String>();
        let iter = match read.range((as_ref_bound(&lo), as_ref_bound(&hi))) {
            Ok(it) => it,
            Err(Error::InvalidArgument(_)) if degenerate(&lo, &hi) => return Ok(()),
            Err(e) => return Err(self.at(&format!("{desc}: {e}"))),
        };
        let mode = self.rng.below(10);
        let got: Vec<(Vec<u8>, Vec<u8>)> = if mode < 4 {
            ctx(iter.collect(), self.at(&desc))?
        } else if mode < 7 {
            let mut v: Vec<_> = ctx(
                iter.rev().collect::<cambium::Result<Vec<_>>>(),
                self.at(&desc),
            )?;
            v.reverse();
            v
        } else if mode < 8 {
            // Keys only.
            let keys: Vec<Vec<u8>> = ctx(iter.keys().collect(), self.at(&desc))?;
            let want_keys: Vec<Vec<u8>> = want.iter().map(|(k, _)| k.clone()).collect();
            if keys != want_keys {
                return Err(self.at(&format!(
                    "{desc}.keys(): {} keys, model {}",
                    keys.len(),
                    want_keys.len()
                )));
            }
            return Ok(());
        } else {
            // From both ends at once, in a random interleaving, each step owned or
            // borrowed at random.
            let mut iter = iter;
            let mut front = Vec::new();
            let mut back = Vec::new();
            loop {
                let from_front = self.rng.chance(1, 2);
                let borrowed = self.rng.chance(1, 2);
                let owned =
                    |r: cambium::Result<(&[u8], &[u8])>| r.map(|(k, v)| (k.to_vec(), v.to_vec()));
                let item = match (from_front, borrowed) {
                    (true, false) => iter.next(),
                    (false, false) => iter.next_back(),
                    (true, true) => iter.next_ref().map(owned),
                    (false, true) => iter.next_back_ref().map(owned),
                };
                match item {
                    None => break,
                    Some(Err(e)) => return Err(self.at(&format!("{desc} double-ended: {e}"))),
                    Some(Ok(kv)) if from_front => front.push(kv),
                    Some(Ok(kv)) => back.push(kv),
                }
            }
            back.reverse();
            front.extend(back);
            front
        };
        if got != want {
            let got_keys: Vec<String> = got.iter().take(5).map(|(k, _)| show(k)).collect();
            let want_keys: Vec<String> = want.iter().take(5).map(|(k, _)| show(k)).collect();
            return Err(self.at(&format!(
                "{desc} mode {mode}: got {} entries {:?}.., model {} entries {:?}..",
                got.len(),
                got_keys,
                want.len(),
                want_keys
            )));
        }
        Ok(())
    }

    fn step_once(&mut self) -> Result<(), String> {
        let roll = self.rng.below(100);
        match roll {
            0..=34 => self.write_txn()?,
            35..=39 => {
                let key = gen_key(&mut self.rng, &self.model);
                if self.rng.chance(2, 3) {
                    let value = gen_value(&mut self.rng);
                    ctx(self.store().put(&key, &value), self.at("store.put"))?;
                    self.model.insert(key, value);
                } else {
                    let existed = ctx(self.store().delete(&key), self.at("store.delete"))?;
                    if existed != self.model.remove(&key).is_some() {
                        return Err(
                            self.at(&format!("store.delete({}) returned {existed}", show(&key)))
                        );
                    }
                }
            }
            40..=49 => {
                let key = gen_key(&mut self.rng, &self.model);
                let want = self.model.get(&key);
                let got = ctx(self.store().get(&key), self.at("store.get"))?;
                if got.as_ref() != want {
                    return Err(self.at(&format!(
                        "store.get({}) = {:?} bytes, model {:?}",
                        show(&key),
                        got.map(|v| v.len()),
                        want.map(|v| v.len())
                    )));
                }
                let read = ctx(self.store().read(), self.at("read"))?;
                let lent = ctx(read.get_with(&key, <[u8]>::to_vec), self.at("get_with"))?;
                if lent.as_ref() != want {
                    return Err(self.at(&format!("get_with({}) disagrees", show(&key))));
                }
                let has = ctx(read.contains_key(&key), self.at("contains_key"))?;
                if has != want.is_some() {
                    return Err(self.at(&format!("contains_key({}) = {has}", show(&key))));
                }
            }
            50..=59 => self.scan()?,
            60..=64 => {
                let mut prefix = gen_key(&mut self.rng, &self.model);
                prefix.truncate(self.rng.usize(0, 3));
                let read = ctx(self.store().read(), self.at("read"))?;
                let got: Vec<(Vec<u8>, Vec<u8>)> = ctx(
                    ctx(read.prefix(&prefix), self.at("prefix"))?.collect(),
                    self.at("prefix scan"),
                )?;
                let want: Vec<(Vec<u8>, Vec<u8>)> = self
                    .model
                    .iter()
                    .filter(|(k, _)| k.starts_with(&prefix))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                if got != want {
                    return Err(self.at(&format!(
                        "prefix({}): {} entries, model {}",
                        show(&prefix),
                        got.len(),
                        want.len()
                    )));
                }
                let rev: Vec<(Vec<u8>, Vec<u8>)> = ctx(
                    ctx(read.prefix(&prefix), self.at("prefix"))?
                        .rev()
                        .collect(),
                    self.at("prefix scan reverse"),
                )?;
                if rev.iter().rev().ne(want.iter()) {
                    return Err(self.at(&format!(
                        "prefix({}).rev() differs from the model",
                        show(&prefix)
                    )));
                }
            }
            65..=67 => {
                let read = ctx(self.store().read(), self.at("read"))?;
                let first = ctx(read.first(), self.at("first"))?;
                let last = ctx(read.last(), self.at("last"))?;
                let mf = self
                    .model
                    .iter()
                    .next()
                    .map(|(k, v)| (k.clone(), v.clone()));
                let ml = self
                    .model
                    .iter()
                    .next_back()
                    .map(|(k, v)| (k.clone(), v.clone()));
                if first != mf || last != ml {
                    return Err(self.at("first/last differ from the model"));
                }
            }
            68..=71 => {
                let lo = gen_bound(&mut self.rng, &self.model);
                let hi = gen_bound(&mut self.rng, &self.model);
                let want = model_range(&self.model, &lo, &hi).len() as u64;
                let read = ctx(self.store().read(), self.at("read"))?;
                match read.count((as_ref_bound(&lo), as_ref_bound(&hi))) {
                    Ok(n) if n == want => {}
                    Ok(n) => {
                        return Err(self.at(&format!("count({lo:?}, {hi:?}) = {n}, model {want}")))
                    }
                    Err(Error::InvalidArgument(_)) if degenerate(&lo, &hi) => {}
                    Err(e) => return Err(self.at(&format!("count: {e}"))),
                }
                let all = ctx(read.count::<std::ops::RangeFull>(..), self.at("count(..)"))?;
                if all != self.model.len() as u64 {
                    return Err(self.at(&format!("count(..) = {all}, model {}", self.model.len())));
                }
            }
            72..=74 => {
                let read = ctx(self.store().read(), self.at("read"))?;
                self.snapshots.push((read, self.model.clone()));
                if self.snapshots.len() > 3 {
                    self.snapshots.remove(0);
                }
            }
            75..=77 => {
                if !self.snapshots.is_empty() {
                    let i = self.rng.below(self.snapshots.len() as u64) as usize;
                    let (read, model) = &self.snapshots[i];
                    self.check_read(read, model, "held snapshot")?;
                }
            }
            78..=81 => {
                ctx(self.store().checkpoint(), self.at("checkpoint"))?;
                if self.rng.chance(1, 2) {
                    verify_clean(self.store(), &self.at("after checkpoint"))?;
                }
            }
            82..=84 => self.reopen()?,
            85..=86 => {
                // Invalid keys are refused with KeyTooLarge and change nothing.
                let bad = if self.rng.chance(1, 2) {
                    Vec::new()
                } else {
                    vec![b'x'; cambium::MAX_KEY_LEN + 1]
                };
                let store = self.store.as_ref().unwrap();
                let mut txn = ctx(store.begin_write(), self.at("begin_write"))?;
                match txn.put(&bad, b"v") {
                    Err(Error::KeyTooLarge { len, .. }) if len == bad.len() => {}
                    other => {
                        return Err(
                            self.at(&format!("put with a {}-byte key: {other:?}", bad.len()))
                        )
                    }
                }
                txn.abort();
                match store.put(&bad, b"v") {
                    Err(Error::KeyTooLarge { .. }) => {}
                    other => {
                        return Err(self.at(&format!(
                            "store.put with a {}-byte key: {other:?}",
                            bad.len()
                        )))
                    }
                }
            }
            _ => {
                let read = ctx(self.store().read(), self.at("read"))?;
                self.check_read(&read, &self.model.clone(), "full comparison")?;
            }
        }
        Ok(())
    }

    fn reopen(&mut self) -> Result<(), String> {
        self.snapshots.clear();
        let store = self.store.take().unwrap();
        if self.rng.chance(2, 3) {
            ctx(store.close(), self.at("close"))?;
        } else {
            drop(store);
        }
        let store = ctx(
            Store::open_with(SIM_PATH, self.opts.clone()),
            self.at("reopen"),
        )?;
        self.store = Some(store);
        let read = ctx(self.store().read(), self.at("read after reopen"))?;
        self.check_read(&read, &self.model.clone(), "after reopen")?;
        if self.rng.chance(1, 2) {
            verify_clean(self.store(), &self.at("after reopen"))?;
        }
        Ok(())
    }
}

fn run_model(seed: u64, ops: usize) -> Result<(), String> {
    let vfs = SimVfs::new();
    // Half the seeds close without a final checkpoint, so reopening replays the WAL.
    let opts = Options {
        checkpoint_on_close: seed.is_multiple_of(2),
        ..sim_options(&vfs)
    };
    let store = Store::create_with(SIM_PATH, opts.clone()).map_err(|e| format!("create: {e}"))?;
    let mut h = Harness {
        opts,
        store: Some(store),
        model: Model::new(),
        rng: Rng::new(seed),
        snapshots: Vec::new(),
        step: 0,
    };
    for step in 0..ops {
        h.step = step;
        h.step_once()?;
    }
    h.step = ops;
    let read = ctx(h.store().read(), "final read")?;
    h.check_read(&read, &h.model.clone(), "final state")?;
    verify_clean(h.store(), "end, before checkpoint")?;
    ctx(h.store().checkpoint(), "final checkpoint")?;
    verify_clean(h.store(), "end, after checkpoint")?;
    h.reopen()?;
    verify_clean(h.store(), "end, after reopen")?;
    // Delete every key, half of them one transaction each (each delete's path copied
    // from the written tree), the rest in one: nothing is left, not even empty nodes.
    let keys: Vec<Vec<u8>> = h.model.keys().cloned().collect();
    let (singles, rest) = keys.split_at(keys.len() / 2);
    for k in singles {
        let mut txn = ctx(h.store().begin_write(), "begin")?;
        ctx(txn.delete(k), "delete")?;
        ctx(txn.commit(), "commit")?;
    }
    let mut txn = ctx(h.store().begin_write(), "begin")?;
    for k in rest {
        ctx(txn.delete(k), "delete")?;
    }
    ctx(txn.commit(), "commit")?;
    ctx(h.store().checkpoint(), "checkpoint")?;
    let live = ctx(h.store().stats(), "stats")?.live_bytes;
    if live != 0 {
        return Err(format!("{live} live bytes left with every key deleted"));
    }
    verify_clean(h.store(), "end, every key deleted")
}

/// Random operation sequences, many seeds, against the model.
#[test]
fn model_random_ops() {
    run_seeds("model_random_ops", "model", 128, |seed| {
        run_model(seed, OPS_PER_SEED)
    });
}

/// A few long sequences (more state, more checkpoints and reopens per run).
#[test]
fn model_long_sequences() {
    run_seeds("model_long_sequences", "model_long", 4, |seed| {
        run_model(seed + 1_000_000, 2_000)
    });
}

/// Grows a tree to depth >= 3 (keys ~40..120 bytes, small values, some extents),
/// checking stats, scans and verify; then deletes most keys in random order in
/// batches (exercising merges and root collapse), checkpointing and comparing
/// along the way, and finally reopens.
#[test]
fn deep_tree_grow_and_shrink() {
    run_seeds("deep_tree_grow_and_shrink", "deep", 1, |seed| {
        let mut rng = Rng::new(seed ^ 0xDEE9);
        let vfs = SimVfs::new();
        let mut store = create_sim(&vfs);
        let mut model = Model::new();
        let mut depth = 0;
        let mut i = 0u64;
        while depth < 3 || model.len() < 20_000 {
            if model.len() >= 200_000 {
                return Err(format!("depth still {depth} with {} keys", model.len()));
            }
            let mut txn = ctx(store.begin_write(), "begin")?;
            for _ in 0..1000 {
                i += 1;
                let mut key =
                    format!("{:016x}", i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).into_bytes();
                key.extend(rng.letters(24, 100));
                let value = if rng.chance(1, 200) {
                    rng.bytes_in(1025, 5000)
                } else {
                    rng.bytes_in(0, 60)
                };
                ctx(txn.put(&key, &value), "put")?;
                model.insert(key, value);
            }
            ctx(txn.commit(), "commit")?;
            ctx(store.checkpoint(), "checkpoint")?;
            let stats = ctx(store.stats(), "stats")?;
            depth = stats.depth;
            if stats.keys != model.len() as u64 {
                return Err(format!(
                    "stats.keys = {}, model {}",
                    stats.keys,
                    model.len()
                ));
            }
        }
        eprintln!("deep tree: {} keys, depth {depth}", model.len());
        verify_clean(&store, "grown")?;
        let read = ctx(store.read(), "read")?;
        if let Some(d) = diff(&ctx(dump(&read), "dump")?, &model) {
            return Err(format!("grown: {d}"));
        }
        drop(read);
        // Delete ~97% in random order.
        let mut keys: Vec<Vec<u8>> = model.keys().cloned().collect();
        for j in (1..keys.len()).rev() {
            keys.swap(j, rng.below(j as u64 + 1) as usize);
        }
        let keep = keys.len() / 33;
        for (b, chunk) in keys[keep..].chunks(1500).enumerate() {
            let mut txn = ctx(store.begin_write(), "begin")?;
            for k in chunk {
                if !ctx(txn.delete(k), "delete")? {
                    let in_txn = txn.get(k).map(|v| v.map(|v| v.len()));
                    let committed = store.get(k).map(|v| v.map(|v| v.len()));
                    return Err(format!(
                        "batch {b}: delete of a present key {} returned false (then txn.get: {in_txn:?}, store.get: {committed:?}, model value {} bytes)",
                        show(k),
                        model[k].len()
                    ));
                }
                model.remove(k);
            }
            ctx(txn.commit(), "commit")?;
            if b % 3 == 0 {
                ctx(store.checkpoint(), "checkpoint")?;
                verify_clean(&store, &format!("shrinking batch {b}"))?;
                // Spot checks: scans around random keys.
                let read = ctx(store.read(), "read")?;
                for _ in 0..20 {
                    let lo = Bound::Included(keys[rng.below(keys.len() as u64) as usize].clone());
                    let want: Vec<_> = model_range(&model, &lo, &Bound::Unbounded)
                        .into_iter()
                        .take(50)
                        .collect();
                    let got: Vec<_> = ctx(
                        ctx(read.range((as_ref_bound(&lo), Bound::Unbounded)), "range")?
                            .take(50)
                            .collect(),
                        "scan",
                    )?;
                    if got != want {
                        return Err(format!("batch {b}: scan from {lo:?} differs"));
                    }
                }
            }
        }
        ctx(store.checkpoint(), "checkpoint")?;
        verify_clean(&store, "shrunk")?;
        let stats = ctx(store.stats(), "stats")?;
        eprintln!("shrunk: {} keys, depth {}", stats.keys, stats.depth);
        let read = ctx(store.read(), "read")?;
        if let Some(d) = diff(&ctx(dump(&read), "dump")?, &model) {
            return Err(format!("shrunk: {d}"));
        }
        let rev: Vec<_> = ctx(
            ctx(read.iter(), "iter")?
                .rev()
                .collect::<cambium::Result<Vec<_>>>(),
            "rev",
        )?;
        if rev.len() != model.len() || rev.iter().rev().map(|(k, _)| k).ne(model.keys()) {
            return Err("reverse scan after shrinking differs".into());
        }
        drop(read);
        ctx(store.close(), "close")?;
        store = ctx(open_sim(&vfs), "reopen")?;
        let read = ctx(store.read(), "read")?;
        if let Some(d) = diff(&ctx(dump(&read), "dump")?, &model) {
            return Err(format!("after reopen: {d}"));
        }
        verify_clean(&store, "after reopen")?;
        // Delete everything: the empty tree must work.
        let mut txn = ctx(store.begin_write(), "begin")?;
        for k in model.keys() {
            ctx(txn.delete(k), "delete")?;
        }
        ctx(txn.commit(), "commit")?;
        ctx(store.checkpoint(), "checkpoint")?;
        verify_clean(&store, "emptied")?;
        let read = ctx(store.read(), "read")?;
        if ctx(read.first(), "first")?.is_some()
            || ctx(read.count::<std::ops::RangeFull>(..), "count")? != 0
        {
            return Err("store not empty after deleting every key".into());
        }
        Ok(())
    });
}
