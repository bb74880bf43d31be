//! How a store is opened and how commits are made durable: [`Options`] and
//! [`Durability`], with their defaults and why they are what they are.

use crate::io::Vfs;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// How to open a store.
#[derive(Clone)]
pub struct Options {
    /// Page cache budget in bytes: what the cached nodes occupy in memory, about 1.1
    /// times their size on disk (a node's bytes, 12 bytes per entry, ~150 bytes of
    /// bookkeeping). The default is [`default_cache_bytes`]: a quarter of the memory
    /// this process may use, at least 1 GiB (redb's default), which takes memory only
    /// as nodes are read. Give it 1.1 times the tree's size for reads that never wait
    /// on a `pread`: a miss costs a `pread`, a checksum, a parse and an eviction,
    /// several hits' worth even when the OS has the node in its page cache (see
    /// BENCHMARKS.md), so a cache smaller than the tree spends the machine's memory
    /// twice, once here and once in the OS's page cache, and reads at a few times
    /// the cost of a hit.
    pub cache_bytes: usize,
    /// Checkpoint when this much WAL has accumulated since the last one. The default,
    /// 512 MiB (RocksDB's and PostgreSQL's WAL budgets are of this order), lets the
    /// nodes many transactions dirty be written once: a leaf written by a checkpoint
    /// holds every insert it received since the last one. The price is recovery after
    /// a crash, which replays what the WAL holds: about 10 s for a full 512 MiB of
    /// 24/150-byte puts on the benchmark machine (a clean close checkpoints, so the
    /// next open replays nothing).
    pub checkpoint_wal_bytes: u64,
    /// Checkpoint when this many bytes of committed nodes are dirty: memory the
    /// writer holds beside the cache. The default is [`default_dirty_bytes`] (an
    /// eighth of the machine's memory, 512 MiB to 4 GiB): every leaf a checkpoint
    /// writes carries all the inserts it received since the last one, so the more
    /// dirty leaves are held, the fewer times a random load rewrites each (10M random
    /// keys in 200k-key transactions: 180 s at 512 MiB, 111 s at 3 GiB; see
    /// BENCHMARKS.md).
    pub checkpoint_dirty_bytes: u64,
    /// A write transaction whose own dirty nodes pass this many bytes writes them out
    /// to the segments before it commits (it then commits by checkpoint, as a large
    /// one does), so its memory stays bounded whatever its size. A spilled leaf the
    /// transaction touches again is written again, so a budget below what one
    /// transaction dirties costs rewrites. Default: [`default_dirty_bytes`].
    pub txn_dirty_bytes: u64,
    /// Checkpoint at least this often while there is anything to write.
    pub checkpoint_interval: Option<Duration>,
    /// Run checkpoints on a background thread (otherwise the committing thread runs
    /// them when a threshold is crossed, and the interval is not used).
    pub background_checkpoints: bool,
    /// Open without writing anything: files are opened read-only, nothing is created
    /// (a directory that is not a store is left as it was), the WAL is replayed in
    /// memory only, and a writer in another process neither blocks this open nor is
    /// blocked by it (the view is the durable state when it opened). See
    /// `Store::open_read_only`.
    pub read_only: bool,
    /// How long a writable open waits for another process's writer to let go of the
    /// store: `None` fails at once with `Error::Locked`, naming the holder's PID.
    pub lock_wait: Option<Duration>,
    /// Checkpoint when the store is closed or dropped, so the next open replays nothing.
    pub checkpoint_on_close: bool,
    /// Clean on its own (after background checkpoints, and when the store is closed)
    /// once dead bytes pass this percentage of the segment bytes (and at least
    /// 16 MiB), down to half of it, moving at most 128 MiB each time; `None` leaves
    /// cleaning to `Store::clean`.
    pub auto_clean_dead_percent: Option<f64>,
    /// The file system to use; `None` means real files in the store directory.
    pub vfs: Option<Arc<dyn Vfs>>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            cache_bytes: default_cache_bytes(),
            checkpoint_wal_bytes: 512 << 20,
            checkpoint_dirty_bytes: default_dirty_bytes(),
            txn_dirty_bytes: default_dirty_bytes(),
            checkpoint_interval: Some(Duration::from_secs(30)),
            background_checkpoints: true,
            read_only: false,
            lock_wait: None,
            checkpoint_on_close: true,
            auto_clean_dead_percent: Some(50.0),
            vfs: None,
        }
    }
}

/// The default page cache budget ([`Options::cache_bytes`]): a quarter of the memory
/// this process may use (the machine's, or its cgroup's limit if lower), at least
/// 1 GiB. A budget, not an allocation: nodes take it as they are read, so a small
/// store costs what its tree occupies. A quarter because, unlike a memory-mapped
/// engine, cambium reads through its own cache; a store that outgrows it but not
/// the machine's memory is read at `pread` speed, which WiredTiger's half of the
/// memory and the quarter usually given to PostgreSQL's buffers also avoid. With
/// the dirty budgets (an eighth each) a writer's worst case is half the memory.
pub fn default_cache_bytes() -> usize {
    static BYTES: OnceLock<usize> = OnceLock::new();
    *BYTES.get_or_init(|| {
        let quarter = usize::try_from(usable_memory() / 4).unwrap_or(usize::MAX);
        quarter.max(1 << 30)
    })
}

/// The default of both dirty-node budgets ([`Options::checkpoint_dirty_bytes`],
/// [`Options::txn_dirty_bytes`]): an eighth of the memory this process may use (the
/// machine's, or its cgroup's limit if lower), at least 512 MiB and at most 4 GiB.
/// Held only while that much is dirty (a bulk load); a writer may hold both at once,
/// plus the set a background checkpoint is writing.
pub fn default_dirty_bytes() -> u64 {
    static BYTES: OnceLock<u64> = OnceLock::new();
    *BYTES.get_or_init(|| (usable_memory() / 8).clamp(512 << 20, 4 << 30))
}

/// The memory this process may use: the machine's, or its cgroup's limit if lower
/// (0 if neither is known, which the defaults' floors then decide).
fn usable_memory() -> u64 {
    [physical_memory(), cgroup_memory_limit()]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(0)
}

/// `MemTotal` from /proc/meminfo (Linux), in bytes.
fn physical_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The cgroup v2 memory limit of this process's group, if it has one ("max" means
/// none).
fn cgroup_memory_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/sys/fs/cgroup/memory.max").ok()?;
    text.trim().parse().ok()
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("cache_bytes", &self.cache_bytes)
            .field("checkpoint_wal_bytes", &self.checkpoint_wal_bytes)
            .field("checkpoint_dirty_bytes", &self.checkpoint_dirty_bytes)
            .field("txn_dirty_bytes", &self.txn_dirty_bytes)
            .field("checkpoint_interval", &self.checkpoint_interval)
            .field("background_checkpoints", &self.background_checkpoints)
            .field("read_only", &self.read_only)
            .field("lock_wait", &self.lock_wait)
            .field("checkpoint_on_close", &self.checkpoint_on_close)
            .field("auto_clean_dead_percent", &self.auto_clean_dead_percent)
            .field("vfs", &self.vfs.as_ref().map(|_| "custom"))
            .finish()
    }
}

/// When a commit is durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Durability {
    /// `commit` returns after the WAL fsync that covers it (group commit: concurrent
    /// committers share one fsync).
    #[default]
    Immediate,
    /// `commit` returns at once; the transaction is atomic and visible, and becomes
    /// durable with the next checkpoint or the next `Immediate` commit. For bulk loads.
    Deferred,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dirty_budget_is_an_eighth_of_memory_within_bounds() {
        let b = default_dirty_bytes();
        assert!((512 << 20..=4 << 30).contains(&b), "{b}");
        if let Some(m) = physical_memory() {
            assert!(m > 0);
            let limit = cgroup_memory_limit().map_or(m, |c| c.min(m));
            assert_eq!(b, (limit / 8).clamp(512 << 20, 4 << 30));
        }
        let o = Options::default();
        assert_eq!((o.checkpoint_dirty_bytes, o.txn_dirty_bytes), (b, b));
    }

    #[test]
    fn the_cache_is_a_quarter_of_memory_and_at_least_a_gib() {
        let c = default_cache_bytes();
        assert!(c >= 1 << 30, "{c}");
        if let Some(m) = physical_memory() {
            let limit = cgroup_memory_limit().map_or(m, |l| l.min(m));
            assert_eq!(c as u64, (limit / 4).max(1 << 30));
        }
        assert_eq!(Options::default().cache_bytes, c);
    }
}
