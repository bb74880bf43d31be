//! How a store is opened and how commits are made durable: [`Options`] and
//! [`Durability`], with their defaults and why they are what they are.

use crate::io::Vfs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How to open a store.
#[derive(Clone)]
pub struct Options {
    /// Page cache budget in bytes: what the cached nodes occupy in memory, about 1.1
    /// times their size on disk (a node's bytes, 12 bytes per entry, ~150 bytes of
    /// bookkeeping). The default is [`default_cache_bytes`]: a quarter of the memory
    /// this process may use (1 GiB, redb's default, where that is not known), which
    /// takes memory only as nodes are read. Give it 1.1 times the tree's size for reads that never wait
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
    /// Checkpoint when this much data (values over 1 KiB, a volume's blocks) has been
    /// appended since the last one. Default 1 GiB. Space comes back only at
    /// checkpoints: a volume overwritten at 2 GB/s would otherwise take 60 GB more
    /// disk in a 30 s interval, holding the blocks it overwrote. The segments a
    /// checkpoint empties (one checkpoint later) are kept as spare files, up to twice
    /// this many bytes of them, and the data written next goes into them: the disk writes
    /// over its own written blocks faster than into new ones (docs/design.md).
    pub checkpoint_data_bytes: u64,
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
    /// Fill the data stream's next segment with zeros ahead of small appends that are
    /// synced often (a volume whose client flushes every few writes), so that each
    /// flush's `fdatasync` overwrites written blocks and commits no file-system
    /// metadata: measured +13% IOPS for fio's 4 KiB random writes with an fsync
    /// every 16 (ext4). The price: while such appends last, every data segment is
    /// written twice (its zeros, then its blocks). Off by default.
    pub data_zeros_ahead: bool,
    /// Let a durable commit make the value extents written since the last sync
    /// durable by copying them into its log record when they are few (at most
    /// 256 KiB, still in the page cache), rather than by an `fdatasync` of their data
    /// segments: one file synced per commit instead of two, at the price of writing
    /// those bytes twice (log, then segment). On by default; `cambium serve` turns
    /// it off unless `--log-small-writes` is given, because a block volume's
    /// flush-heavy clients would otherwise write every data byte three times (the
    /// log's zeros ahead included).
    pub log_small_values: bool,
    /// Keep the spare data segment files (emptied segments kept for the data stream
    /// to write over: written blocks, which the disk takes faster and whose
    /// `fdatasync` commits no file-system metadata) when the store is closed, for
    /// the next process to reuse: at most the data checkpoint threshold's worth
    /// (`checkpoint_data_bytes`, none on a disk short of space) and no more than the
    /// store's segment bytes. An open always adopts those it finds. Off by default:
    /// a close gives their space back. `cambium serve` turns it on, so that a server
    /// restarted over its store (an upgrade, a new configuration) writes over old
    /// blocks from its first flush, not over new ones until its first checkpoints
    /// empty segments again: fio's 4 KiB random writes with a flush every 16
    /// went from 24.8k to 31.2k IOPS in a server's first 10 s.
    pub keep_spares_at_close: bool,
    /// The file system to use; `None` means real files in the store directory.
    pub vfs: Option<Arc<dyn Vfs>>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            cache_bytes: default_cache_bytes(),
            checkpoint_wal_bytes: 512 << 20,
            checkpoint_dirty_bytes: default_dirty_bytes(),
            checkpoint_data_bytes: 1 << 30,
            txn_dirty_bytes: default_dirty_bytes(),
            checkpoint_interval: Some(Duration::from_secs(30)),
            background_checkpoints: true,
            read_only: false,
            lock_wait: None,
            checkpoint_on_close: true,
            auto_clean_dead_percent: Some(50.0),
            data_zeros_ahead: false,
            log_small_values: true,
            keep_spares_at_close: false,
            vfs: None,
        }
    }
}

/// The default page cache budget ([`Options::cache_bytes`]): a quarter of the memory
/// this process may use (the machine's, or its cgroup's limit if lower; 1 GiB if
/// neither is known). A budget, not an allocation: nodes take it as they are read,
/// so a small store costs what its tree occupies. A quarter because, unlike a memory-mapped
/// engine, cambium reads through its own cache; a store that outgrows it but not
/// the machine's memory is read at `pread` speed, which WiredTiger's half of the
/// memory and the quarter usually given to PostgreSQL's buffers also avoid. With
/// the dirty budgets (an eighth each) a writer's worst case is half the memory.
///
/// Computed at each call (a few small reads of /proc and /sys, at open): a process
/// moved into another cgroup, or whose limit changed, is sized to where it is.
pub fn default_cache_bytes() -> usize {
    usize::try_from(cache_bytes_for(usable_memory())).unwrap_or(usize::MAX)
}

/// The cache budget for `usable` bytes of memory (0: not known). A quarter also on
/// small machines: with half of a 1 GiB container (the floor this had), a 12M-key
/// load into it was killed for memory (BENCHMARKS.md, "Bulk loads in a small
/// container").
fn cache_bytes_for(usable: u64) -> u64 {
    match usable {
        0 => 1 << 30,
        m => m / 4,
    }
}

/// The default of both dirty-node budgets ([`Options::checkpoint_dirty_bytes`],
/// [`Options::txn_dirty_bytes`]): an eighth of the memory this process may use (the
/// machine's, or its cgroup's limit if lower), at least 512 MiB (where that memory
/// is 4 GiB or more) and at most 4 GiB.
/// Held only while that much is dirty (a bulk load); a writer may hold both at once,
/// plus the set a background checkpoint is writing.
/// Computed at each call, as [`default_cache_bytes`].
pub fn default_dirty_bytes() -> u64 {
    dirty_bytes_for(usable_memory())
}

/// A dirty budget for `usable` bytes of memory (0: not known): the floor, like the
/// cache's, never takes more than its eighth of a small machine's memory.
fn dirty_bytes_for(usable: u64) -> u64 {
    let floor = match usable {
        0 => 512 << 20,
        m => (512 << 20).min(m / 8),
    };
    (usable / 8).clamp(floor, 4 << 30)
}

/// The memory this process may use: the machine's, or its cgroup's limit if lower
/// (0 if neither is known, which the defaults' floors then decide).
pub(crate) fn usable_memory() -> u64 {
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

/// The lowest memory limit set on this process's cgroup or any of its ancestors
/// (cgroup v2's `memory.max`, v1's `memory.limit_in_bytes`), if one is set. A
/// container's limit may sit on a parent of the group the process is in, and under
/// v1 (still common in container hosts) it is in another file in another tree.
fn cgroup_memory_limit() -> Option<u64> {
    let groups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let v2_root = if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        "/sys/fs/cgroup"
    } else {
        "/sys/fs/cgroup/unified"
    };
    cgroup_limit_files(
        &groups,
        Path::new(v2_root),
        Path::new("/sys/fs/cgroup/memory"),
    )
    .iter()
    // "max" (v2) parses as no limit; v1's "no limit" is a huge number, which
    // the minimum with the machine's memory discards.
    .filter_map(|file| std::fs::read_to_string(file).ok()?.trim().parse().ok())
    .min()
}

/// The files that may hold a memory limit for the groups named in
/// `/proc/self/cgroup` (`proc_self_cgroup`): each group's and every ancestor's, up to
/// and including the hierarchy's root as mounted (inside a cgroup namespace the
/// group is "/" and the mount's root is the container's own group).
fn cgroup_limit_files(
    proc_self_cgroup: &str,
    v2_root: &Path,
    v1_memory_root: &Path,
) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for line in proc_self_cgroup.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(group)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let (root, file) = if id == "0" && controllers.is_empty() {
            (v2_root, "memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            (v1_memory_root, "memory.limit_in_bytes")
        } else {
            continue;
        };
        let mut dir = Some(Path::new(group.trim_start_matches('/')));
        while let Some(d) = dir {
            files.push(root.join(d).join(file));
            dir = d.parent();
        }
    }
    files
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

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    #[test]
    fn the_dirty_budget_is_an_eighth_of_memory_within_bounds() {
        let b = default_dirty_bytes();
        assert!(b <= 4 * GIB, "{b}");
        if let Some(m) = physical_memory() {
            assert!(m > 0);
            let limit = cgroup_memory_limit().map_or(m, |c| c.min(m));
            assert_eq!(b, dirty_bytes_for(limit));
        }
        let o = Options::default();
        assert_eq!((o.checkpoint_dirty_bytes, o.txn_dirty_bytes), (b, b));
        // An eighth from 4 GiB to 32 GiB of memory; 512 MiB below (an eighth below
        // 4 GiB, never more), 4 GiB above; 512 MiB when the memory is not known.
        for (memory, budget) in [
            (0, 512 * MIB),
            (GIB, 128 * MIB),
            (2 * GIB, 256 * MIB),
            (4 * GIB, 512 * MIB),
            (24 * GIB, 3 * GIB),
            (32 * GIB, 4 * GIB),
            (256 * GIB, 4 * GIB),
        ] {
            assert_eq!(dirty_bytes_for(memory), budget, "{memory} bytes of memory");
        }
    }

    #[test]
    fn the_cache_is_a_quarter_of_memory() {
        let c = default_cache_bytes();
        if let Some(m) = physical_memory() {
            let limit = cgroup_memory_limit().map_or(m, |l| l.min(m));
            assert_eq!(c as u64, cache_bytes_for(limit));
        }
        assert_eq!(Options::default().cache_bytes, c);
        // A quarter at every size; 1 GiB when the memory is not known.
        for (memory, budget) in [
            (0, GIB),
            (512 * MIB, 128 * MIB),
            (GIB, 256 * MIB),
            (2 * GIB, 512 * MIB),
            (3 * GIB, 768 * MIB),
            (8 * GIB, 2 * GIB),
            (24 * GIB, 6 * GIB),
        ] {
            assert_eq!(cache_bytes_for(memory), budget, "{memory} bytes of memory");
        }
    }

    #[test]
    fn cgroup_limits_are_looked_for_in_the_group_and_its_ancestors_under_v1_and_v2() {
        let v2 = Path::new("/v2");
        let v1 = Path::new("/v1mem");
        let files = |text| {
            cgroup_limit_files(text, v2, v1)
                .into_iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
        };
        // Pure v2, a nested group.
        assert_eq!(
            files("0::/user.slice/app.scope\n"),
            [
                "/v2/user.slice/app.scope/memory.max",
                "/v2/user.slice/memory.max",
                "/v2/memory.max"
            ]
        );
        // v1 (a hybrid host): only the memory controller's line counts, even when it
        // shares its hierarchy with another controller.
        assert_eq!(
            files("9:name=systemd:/\n4:memory:/process_api/abc\n2:cpu,cpuacct:/x\n0::/\n"),
            [
                "/v1mem/process_api/abc/memory.limit_in_bytes",
                "/v1mem/process_api/memory.limit_in_bytes",
                "/v1mem/memory.limit_in_bytes",
                "/v2/memory.max",
            ]
        );
        assert_eq!(
            files("5:cpuset,memory:/\n"),
            ["/v1mem/memory.limit_in_bytes"]
        );
        // Malformed lines are skipped, never a panic.
        assert!(files("garbage\n::\n7:pids:/a\n").is_empty());
    }
}
