//! Shared helpers for the integration tests: a seeded PRNG, key/value generators,
//! store construction on [`SimVfs`], a `BTreeMap` model and comparison helpers,
//! and seed selection from the environment.
//!
//! Environment variables understood by every test file:
//! - `CAMBIUM_SEED=N`: run only seed N (to replay a failure printed in a panic);
//! - `CAMBIUM_<NAME>_CASES=N`: number of seeds for the test family `<NAME>`
//!   (e.g. `CAMBIUM_MODEL_CASES`, `CAMBIUM_CRASH_CASES`, `CAMBIUM_FAULT_CASES`,
//!   `CAMBIUM_CORRUPTION_CASES`), to scale a run up or down.

#![allow(dead_code)]

use cambium::io::sim::SimVfs;
use cambium::{Options, ReadTxn, Store};
use std::collections::BTreeMap;
use std::ops::Bound;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// The label a simulated store is opened under (with `vfs: Some`, only a label).
pub const SIM_PATH: &str = "/sim/store";

/// The model of one version: what the store must hold.
pub type Model = BTreeMap<Vec<u8>, Vec<u8>>;

/// The simulator's splitmix64, seeded, with the helpers tests use.
#[derive(Clone, Debug)]
pub struct Rng(cambium::io::sim::SplitMix);

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut r = Rng(cambium::io::sim::SplitMix(seed ^ 0xA076_1D64_78BD_642F));
        r.next();
        r
    }
    pub fn next(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// Uniform in `0..n` (0 when n == 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0.below(n)
    }
    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
    pub fn usize(&mut self, lo: usize, hi: usize) -> usize {
        self.range(lo as u64, hi as u64) as usize
    }
    /// True with probability `num/den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.0.chance(num, den)
    }
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
    /// `len` random bytes.
    /// Random bytes of a random length in `lo..=hi`.
    pub fn bytes_in(&mut self, lo: usize, hi: usize) -> Vec<u8> {
        let len = self.usize(lo, hi);
        self.bytes(len)
    }
    /// Random lowercase letters, a random length in `lo..=hi`.
    pub fn letters(&mut self, lo: usize, hi: usize) -> Vec<u8> {
        self.bytes_in(lo, hi)
            .iter()
            .map(|b| b'a' + b % 26)
            .collect()
    }
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len + 8);
        while out.len() < len {
            out.extend_from_slice(&self.next().to_le_bytes());
        }
        out.truncate(len);
        out
    }
}

/// A random key: from a small space (many collisions, prefix-rich), a large one,
/// an existing key of `model`, or (rarely) a long one up to `MAX_KEY_LEN`.
pub fn gen_key(rng: &mut Rng, model: &Model) -> Vec<u8> {
    let roll = rng.below(100);
    if roll < 25 && !model.is_empty() {
        // An existing key (nth by a random index; cheap enough for test sizes).
        let n = rng.below(model.len() as u64) as usize;
        return model.keys().nth(n).unwrap().clone();
    }
    if roll < 60 {
        // Small space: 1..=3 bytes from a 4-letter alphabet (84 keys).
        let len = rng.usize(1, 3);
        return (0..len).map(|_| b'a' + rng.below(4) as u8).collect();
    }
    let len = if roll < 97 {
        rng.usize(1, 64)
    } else {
        rng.usize(65, cambium::MAX_KEY_LEN)
    };
    // Large space over a small alphabet so that shared prefixes are common.
    const ALPHABET: &[u8] = &[0x00, 0x01, b'a', b'b', b'c', b'z', 0x7f, 0xff];
    (0..len).map(|_| *rng.pick(ALPHABET)).collect()
}

/// A random value: mostly small, sometimes near the inline limit, sometimes a large
/// out-of-line value (an extent).
pub fn gen_value(rng: &mut Rng) -> Vec<u8> {
    let roll = rng.below(100);
    let len = if roll < 80 {
        rng.usize(0, 200)
    } else if roll < 92 {
        let mid = rng.usize(201, 1024);
        *rng.pick(&[
            cambium::INLINE_VALUE_MAX - 1,
            cambium::INLINE_VALUE_MAX,
            cambium::INLINE_VALUE_MAX + 1,
            mid,
        ])
    } else if roll < 98 {
        rng.usize(1025, 16 * 1024)
    } else {
        rng.usize(16 * 1024, 100 * 1024)
    };
    rng.bytes(len)
}

/// Options for a store on `vfs`, without background checkpoints.
pub fn sim_options(vfs: &SimVfs) -> Options {
    Options {
        vfs: Some(Arc::new(vfs.clone())),
        background_checkpoints: false,
        ..Default::default()
    }
}

/// Creates a fresh store on `vfs`.
pub fn create_sim(vfs: &SimVfs) -> Store {
    Store::create_with(SIM_PATH, sim_options(vfs)).expect("create store on SimVfs")
}

/// Opens the store on `vfs`.
pub fn open_sim(vfs: &SimVfs) -> cambium::Result<Store> {
    Store::open_with(SIM_PATH, sim_options(vfs))
}

/// Reads the whole of `read` into a map, or the first error.
pub fn dump(read: &ReadTxn) -> cambium::Result<Model> {
    let mut out = Model::new();
    for kv in read.iter()? {
        let (k, v) = kv?;
        out.insert(k, v);
    }
    Ok(out)
}

/// Compares two maps; returns a short description of the first difference.
pub fn diff(got: &Model, want: &Model) -> Option<String> {
    if got == want {
        return None;
    }
    for (k, v) in want {
        match got.get(k) {
            None => {
                return Some(format!(
                    "missing key {} (model has {} keys, store {})",
                    show(k),
                    want.len(),
                    got.len()
                ))
            }
            Some(g) if g != v => {
                return Some(format!(
                    "key {}: value {} bytes differs from model's {} bytes",
                    show(k),
                    g.len(),
                    v.len()
                ))
            }
            _ => {}
        }
    }
    for k in got.keys() {
        if !want.contains_key(k) {
            return Some(format!(
                "extra key {} (model has {} keys, store {})",
                show(k),
                want.len(),
                got.len()
            ));
        }
    }
    Some("maps differ".into())
}

/// A short printable form of a key.
pub fn show(key: &[u8]) -> String {
    let mut s = String::new();
    for &b in key.iter().take(24) {
        if b.is_ascii_alphanumeric() {
            s.push(b as char);
        } else {
            s.push_str(&format!("\\x{b:02x}"));
        }
    }
    if key.len() > 24 {
        s.push_str(&format!("..({} bytes)", key.len()));
    }
    format!("\"{s}\"")
}

/// Whether `key` lies within the bounds.
pub fn in_bounds(key: &[u8], lo: &Bound<Vec<u8>>, hi: &Bound<Vec<u8>>) -> bool {
    let above = match lo {
        Bound::Included(b) => key >= b.as_slice(),
        Bound::Excluded(b) => key > b.as_slice(),
        Bound::Unbounded => true,
    };
    let below = match hi {
        Bound::Included(b) => key <= b.as_slice(),
        Bound::Excluded(b) => key < b.as_slice(),
        Bound::Unbounded => true,
    };
    above && below
}

/// Whether the bounds describe an empty range whatever the keys (start > end, or
/// start == end with one side excluded). `BTreeMap::range` panics on some of these.
pub fn degenerate(lo: &Bound<Vec<u8>>, hi: &Bound<Vec<u8>>) -> bool {
    let (l, l_inc) = match lo {
        Bound::Included(b) => (b, true),
        Bound::Excluded(b) => (b, false),
        Bound::Unbounded => return false,
    };
    let (h, h_inc) = match hi {
        Bound::Included(b) => (b, true),
        Bound::Excluded(b) => (b, false),
        Bound::Unbounded => return false,
    };
    l > h || (l == h && !(l_inc && h_inc))
}

/// The model's entries within the bounds, in order.
pub fn model_range(
    model: &Model,
    lo: &Bound<Vec<u8>>,
    hi: &Bound<Vec<u8>>,
) -> Vec<(Vec<u8>, Vec<u8>)> {
    if degenerate(lo, hi) {
        return Vec::new();
    }
    model
        .range((lo.clone(), hi.clone()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// `Bound<Vec<u8>>` as `Bound<&[u8]>`.
pub fn as_ref_bound(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(k) => Bound::Included(k.as_slice()),
        Bound::Excluded(k) => Bound::Excluded(k.as_slice()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

/// A random bound around keys of `model` or random keys.
pub fn gen_bound(rng: &mut Rng, model: &Model) -> Bound<Vec<u8>> {
    match rng.below(5) {
        0 => Bound::Unbounded,
        1 | 2 => Bound::Included(gen_key(rng, model)),
        _ => Bound::Excluded(gen_key(rng, model)),
    }
}

/// Seeds to run: `CAMBIUM_SEED` alone if set, else `0..CAMBIUM_<family>_CASES`
/// (default `default_cases`), offset by a per-family constant.
pub fn seeds(family: &str, default_cases: u64) -> Vec<u64> {
    if let Ok(s) = std::env::var("CAMBIUM_SEED") {
        return vec![s.trim().parse().expect("CAMBIUM_SEED must be an integer")];
    }
    let var = format!("CAMBIUM_{}_CASES", family.to_uppercase());
    let n = std::env::var(&var)
        .ok()
        .map(|s| s.trim().parse().expect("cases must be an integer"))
        .unwrap_or(default_cases);
    (0..n).collect()
}

/// Runs `f(seed)` for every seed; a panic or an `Err` is reported with the seed and
/// the command line to replay it. All seeds run; the test fails at the end if any
/// failed (listing them all).
pub fn run_seeds(
    test: &str,
    family: &str,
    default_cases: u64,
    mut f: impl FnMut(u64) -> Result<(), String>,
) {
    let mut failures = Vec::new();
    for seed in seeds(family, default_cases) {
        let outcome = catch_unwind(AssertUnwindSafe(|| f(seed)));
        let msg = match outcome {
            Ok(Ok(())) => continue,
            Ok(Err(msg)) => msg,
            Err(panic) => {
                let text = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "non-string panic".into());
                format!("PANIC: {text}")
            }
        };
        eprintln!(
            "FAILED {test} seed {seed}: {msg}\n  replay: CAMBIUM_SEED={seed} cargo test --release --test {family_file} {test}",
            family_file = test_file_of(family)
        );
        failures.push((seed, msg));
        if failures.len() >= 8 {
            break;
        }
    }
    if !failures.is_empty() {
        let list: Vec<String> = failures
            .iter()
            .map(|(s, m)| format!("seed {s}: {m}"))
            .collect();
        panic!(
            "{test}: {} seed(s) failed:\n{}",
            failures.len(),
            list.join("\n")
        );
    }
}

fn test_file_of(family: &str) -> &'static str {
    if family.starts_with("volume_crash") {
        "volume_crash"
    } else if family.starts_with("crash") {
        "crash"
    } else if family.starts_with("fault") {
        "faults"
    } else if family.starts_with("corruption") {
        "corruption"
    } else {
        "model"
    }
}

/// Turns a cambium error into a message with context.
pub fn ctx<T>(r: cambium::Result<T>, what: impl std::fmt::Display) -> Result<T, String> {
    r.map_err(|e| format!("{what}: {e} ({e:?})"))
}

/// Checks that `verify()` is clean.
pub fn verify_clean(store: &Store, when: &str) -> Result<(), String> {
    let report = ctx(store.verify(), format!("verify ({when})"))?;
    if !report.is_clean() {
        return Err(format!(
            "verify ({when}) found problems: {:?}",
            report.problems
        ));
    }
    Ok(())
}

/// The file of `vfs` with the greatest name starting with `prefix` (the newest
/// segment for `seg-`, the newest log file for `wal-`).
pub fn newest_file(vfs: &SimVfs, prefix: &str) -> String {
    vfs.names()
        .into_iter()
        .filter(|n| n.starts_with(prefix))
        .max()
        .unwrap_or_else(|| panic!("no file named {prefix}*"))
}
