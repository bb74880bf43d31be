//! Deterministic key/value generation and the engine interface the workloads drive.

use std::path::Path;

/// Key size used by redb's comparative benchmark.
pub const KEY_SIZE: usize = 24;
/// Value size used by redb's comparative benchmark.
pub const VALUE_SIZE: usize = 150;

pub type Key = [u8; KEY_SIZE];
pub type Value = [u8; VALUE_SIZE];

/// Seed of the main key stream (bulk load, reads, range reads, removals).
pub const SEED_MAIN: u64 = 3;
/// Seed of the keys inserted by the individual-writes workload.
pub const SEED_INDIVIDUAL: u64 = 0x1d1d_0000_0000_0001;
/// Seed of the keys inserted by the batch-writes workload.
pub const SEED_BATCH: u64 = 0xba7c_0000_0000_0002;

pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;
pub type Res<T> = std::result::Result<T, BoxError>;

/// cambium's splitmix64 (the crash simulator's): tiny, fast, good enough for
/// benchmark keys.
#[derive(Clone)]
pub struct Rng(cambium::io::sim::SplitMix);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(cambium::io::sim::SplitMix(seed))
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    #[inline]
    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let v = self.next_u64().to_le_bytes();
            let n = rest.len();
            rest.copy_from_slice(&v[..n]);
        }
    }

    /// The next random (key, value) pair, like redb's `random_pair`.
    #[inline]
    pub fn pair(&mut self) -> (Key, Value) {
        let mut k = [0u8; KEY_SIZE];
        let mut v = [0u8; VALUE_SIZE];
        self.fill(&mut k);
        self.fill(&mut v);
        (k, v)
    }
}

/// `count` pairs from the stream seeded with `seed`. Generated lazily, inside the
/// timed loops (as redb's benchmark does).
pub fn pairs(seed: u64, count: u64) -> impl Iterator<Item = (Key, Value)> {
    let mut rng = Rng::new(seed);
    (0..count).map(move |_| rng.pair())
}

/// The memory budget every engine is given of the benchmark's two configurations.
pub const EQUAL_BUDGET: usize = 4 << 30;

/// Engine settings of one run.
#[derive(Clone, Debug, Default)]
pub struct Tuning {
    /// The "equal" configuration: every engine's cache or map is [`EQUAL_BUDGET`]. Otherwise
    /// each engine keeps its default options (LMDB and Sanakirja still get a map of
    /// [`EQUAL_BUDGET`]: a map size is a size limit, not a cache, and LMDB's default 10 MiB
    /// cannot hold the data).
    pub equal: bool,
    /// Overrides cambium's `Options::cache_bytes` in either configuration (a diagnosis knob).
    pub cambium_cache_bytes: Option<usize>,
    /// Overrides cambium's `checkpoint_dirty_bytes` and `txn_dirty_bytes` (a diagnosis knob).
    pub cambium_dirty_bytes: Option<u64>,
    /// LMDB's and Sanakirja's map size: [`EQUAL_BUDGET`], or 1 KiB per key when that is
    /// larger (a 4 GiB map cannot hold 10M keys and a large removal transaction's copies).
    pub map_bytes: usize,
    /// Opens LMDB with `MDB_NORDAHEAD` (a tuning knob: what an LMDB user whose data
    /// outgrows memory sets; not LMDB's default).
    pub lmdb_no_readahead: bool,
}

/// The map size for a run of `n` keys (see [`Tuning::map_bytes`]).
pub fn map_bytes(n: u64) -> usize {
    EQUAL_BUDGET.max(usize::try_from(n.saturating_mul(1024)).unwrap_or(usize::MAX))
}

/// One benchmarked engine. Every write method is one durable transaction.
pub trait Engine: Sized {
    const NAME: &'static str;

    /// Create a fresh database inside the (empty, existing) directory `dir`.
    fn create(dir: &Path, tuning: &Tuning) -> Res<Self>;

    /// Open the database `create` made in `dir` (after `close`), with the options
    /// `create` would choose now (`--reads-in-cgroup`).
    fn reopen(_dir: &Path, _tuning: &Tuning) -> Res<Self> {
        Err(format!("{}: reopening is not supported by this harness", Self::NAME).into())
    }

    /// One write transaction inserting every pair, committed durably.
    fn insert_txn(&mut self, pairs: impl Iterator<Item = (Key, Value)>) -> Res<()>;

    /// One write transaction removing every key, committed durably. Returns how many existed.
    fn remove_txn(&mut self, keys: impl Iterator<Item = Key>) -> Res<u64>;

    /// Point gets of existing keys, each checked against its expected value, in one
    /// read transaction. Returns the sum of value lengths.
    fn read_txn(&mut self, pairs: impl Iterator<Item = (Key, Value)>) -> Res<u64>;

    /// For each key, a range scan starting at it reading up to `len` entries, in one
    /// read transaction. Returns the sum of key+value lengths read.
    fn range_txn(&mut self, keys: impl Iterator<Item = Key>, len: usize) -> Res<u64>;

    /// Every entry of the table, in key order, in one read transaction, through the
    /// engine's cheapest iterator (borrowed keys and values where it has one, so the scan
    /// measures the tree walk, not copies). Returns (entries, sum of key+value lengths),
    /// which the harness checks against what it inserted.
    fn scan_txn(&mut self) -> Res<(u64, u64)>;

    /// Write out whatever the engine deferred from earlier commits (cambium: `checkpoint()`,
    /// which writes the B+tree; the peers write their trees in every commit: nothing to do).
    fn checkpoint(&mut self) -> Res<()> {
        Ok(())
    }

    /// Make everything durable and compact-free-state on disk, then close (cambium:
    /// checkpoint + close; redb: drop; LMDB: close the environment).
    fn close(self) -> Res<()>;

    /// A one-line engine state summary printed to stderr after each phase (untimed).
    fn progress(&self) -> Option<String> {
        None
    }

    /// Engine-specific notes printed to stderr before `close` (e.g. cambium's stats).
    fn describe(&self) -> Option<String> {
        None
    }
}
