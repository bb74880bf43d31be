//! The page cache: clean nodes in their packed form by physical address, under a
//! memory budget (what the nodes occupy, `Node::mem_size`).
//!
//! Replacement is CLOCK with credits: a hit refills an entry's credit, the hand takes
//! one credit per pass and evicts at zero. Leaves are inserted without credit. Branch
//! nodes get more credit than leaves (level + 1, capped), so the top levels of every
//! tree stay hot while leaves of a large scan cycle through. The cache is sharded by
//! address to keep lock hold times short; hits take only a shard's read lock.
//!
//! A hit touches one hash bucket, which holds the node pointer inline, and then the
//! node, which holds its credit: the clock's ring of addresses is only walked on
//! eviction. A lookup's misses in the CPU's caches are what a read of a large tree
//! pays for, level by level, which is why readers mostly skip this lookup: a cached
//! branch links to the children loaded through it (`Node::linked_child`), and a reader
//! following a live link only refreshes the child's credit ([`PageCache::touch`]).
//!
//! **Admission.** While there is room, every node read is cached. Once the budget is
//! full, a leaf read from disk for a lookup is cached only on its second read within a
//! while (its address is remembered in a bounded "ghost" list on the first; 2Q's
//! `A1out`, TinyLFU's doorkeeper): a leaf read once and never again would otherwise
//! evict one that is hit, and — what matters when the store outgrows memory — it is in
//! the OS's page cache already, since the read went through it. Caching every leaf
//! read duplicated the OS's copy: in a 1 GiB container the two caches held mostly the
//! same recent leaves, ~0.7 GiB of unique nodes for 1 GiB of memory. Refused leaves
//! live on only in the page cache, so the two hold different nodes. A leaf admitted
//! on its second read is one the page cache holds too, now hot there as well; the
//! caller is told so that it can drop the OS's copy ([`Admission::SecondRead`]).
//! Branches, written nodes and the cleaner's read-ahead are always cached.
//!
//! Invariant: only clean nodes (written, `disk` set, children by address) are cached,
//! so an entry never pins other nodes and its address names exactly its content.

use crate::btree::node::Node;
use crate::format::Addr;
use crate::format::AddrMap;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

const SHARDS: usize = 16;
const MAX_CREDIT: u8 = 4;
/// The fewest refusals a shard remembers, however few nodes it holds.
const MIN_GHOSTS: usize = 64;

/// What [`PageCache::insert_read`] did with a node read from disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Cached: there was room, or it is a branch.
    Cached,
    /// Cached on its second read while the cache was full: the OS's page cache holds a
    /// copy too (the first read put it there, the second found it), which the caller
    /// may drop.
    SecondRead,
    /// Not cached: a leaf read for the first time lately while the cache was full.
    Refused,
}

struct Entry {
    node: Arc<Node>,
    /// Where the address sits in the clock ring.
    ring_pos: usize,
}

#[derive(Default)]
struct Shard {
    entries: AddrMap<Addr, Entry>,
    /// The clock: every cached address once, in no particular order.
    ring: Vec<Addr>,
    hand: usize,
    bytes: usize,
    /// Leaves refused admission lately, oldest first, each with the number of its
    /// refusal: at most as many as the shard caches nodes (a leaf read again within
    /// that many refusals is admitted).
    ghosts: VecDeque<(Addr, u64)>,
    /// The addresses in `ghosts` not taken since, with the number of their latest
    /// refusal (a queue entry with another number is stale).
    ghost_set: AddrMap<Addr, u64>,
    refusals: u64,
}

impl Shard {
    /// Takes `addr` out of the ring (its entry is already out of the map).
    fn unring(&mut self, pos: usize) {
        self.ring.swap_remove(pos);
        if let Some(&moved) = self.ring.get(pos) {
            if let Some(e) = self.entries.get_mut(&moved) {
                e.ring_pos = pos;
            }
        }
    }

    /// Whether `addr` was refused lately; forgets it if so.
    fn take_ghost(&mut self, addr: Addr) -> bool {
        // Its place in the queue stays until it ages out, stale (see `ghost_set`).
        self.ghost_set.remove(&addr).is_some()
    }

    /// Remembers `addr` as refused, forgetting the oldest refusals beyond the bound.
    fn add_ghost(&mut self, addr: Addr) {
        let bound = self.ring.len().max(MIN_GHOSTS);
        while self.ghosts.len() >= bound {
            if let Some((old, n)) = self.ghosts.pop_front() {
                if self.ghost_set.get(&old) == Some(&n) {
                    self.ghost_set.remove(&old);
                }
            }
        }
        self.refusals += 1;
        self.ghost_set.insert(addr, self.refusals);
        self.ghosts.push_back((addr, self.refusals));
    }

    fn remove(&mut self, addr: Addr) {
        if let Some(victim) = self.entries.remove(&addr) {
            self.unring(victim.ring_pos);
            self.bytes -= victim.node.mem_size();
        }
    }
}

pub(crate) struct PageCache {
    shards: Vec<RwLock<Shard>>,
    shard_budget: usize,
    hits: AtomicU64,
    misses: AtomicU64,
}

fn credit_for(node: &Node) -> u8 {
    (node.level + 1).min(MAX_CREDIT)
}

impl PageCache {
    pub(crate) fn new(budget_bytes: usize) -> Self {
        PageCache {
            shards: (0..SHARDS).map(|_| RwLock::default()).collect(),
            shard_budget: (budget_bytes / SHARDS).max(64 * 1024),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    fn shard(&self, addr: Addr) -> &RwLock<Shard> {
        // Fibonacci hashing spreads consecutive addresses over shards.
        let h = addr.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 60;
        &self.shards[usize::try_from(h).expect("4 bits") % SHARDS]
    }

    pub(crate) fn get(&self, addr: Addr) -> Option<Arc<Node>> {
        let shard = self
            .shard(addr)
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match shard.entries.get(&addr) {
            Some(e) => {
                self.touch(&e.node);
                Some(e.node.clone())
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// A hit on `node` found without a lookup (through a link from its parent):
    /// refreshes its credit and counts the hit.
    pub(crate) fn touch(&self, node: &Node) {
        let full = credit_for(node);
        // Written only when it changes: a hot node's cache line stays shared
        // between the cores reading it.
        if node.credit.load(Ordering::Relaxed) != full {
            node.credit.store(full, Ordering::Relaxed);
        }
        self.hits.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether `addr` is cached, without counting a hit or a miss or crediting the
    /// node (a look, not a use).
    pub(crate) fn contains(&self, addr: Addr) -> bool {
        self.shard(addr)
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entries
            .contains_key(&addr)
    }

    /// Caches a node just read from disk for a lookup, unless the cache is full and
    /// it is a leaf not read lately (see the module docs on admission).
    pub(crate) fn insert_read(&self, addr: Addr, node: Arc<Node>) -> Admission {
        let mut shard = self.write_shard(addr);
        if node.level > 0 || shard.bytes + node.mem_size() <= self.shard_budget {
            Self::insert_into(&mut shard, self.shard_budget, addr, node);
            return Admission::Cached;
        }
        if shard.take_ghost(addr) {
            Self::insert_into(&mut shard, self.shard_budget, addr, node);
            return Admission::SecondRead;
        }
        shard.add_ghost(addr);
        Admission::Refused
    }

    /// Caches a clean node (one just written, or read ahead for a use to come),
    /// evicting others to make room.
    pub(crate) fn insert(&self, addr: Addr, node: Arc<Node>) {
        let mut shard = self.write_shard(addr);
        Self::insert_into(&mut shard, self.shard_budget, addr, node);
    }

    fn write_shard(&self, addr: Addr) -> std::sync::RwLockWriteGuard<'_, Shard> {
        self.shard(addr)
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn insert_into(shard: &mut Shard, budget: usize, addr: Addr, node: Arc<Node>) {
        debug_assert!(!node.is_dirty(), "only clean nodes are cached");
        if shard.entries.contains_key(&addr) {
            return;
        }
        let size = node.mem_size();
        while shard.bytes + size > budget && !shard.ring.is_empty() {
            Self::evict_one(shard);
        }
        // Leaves enter cold (no credit until their first hit), so a long scan cannot
        // flush out what is hot; branches enter with their level's credit.
        let credit = if node.level == 0 {
            0
        } else {
            credit_for(&node)
        };
        node.credit.store(credit, Ordering::Relaxed);
        let ring_pos = shard.ring.len();
        shard.ring.push(addr);
        shard.entries.insert(addr, Entry { node, ring_pos });
        shard.bytes += size;
    }

    /// Drops the node at `addr`, if cached: its address was freed, so no new reader
    /// will ask for it (a reader of an older view that still does reads it again), and
    /// the budget it holds is better spent on live nodes.
    pub(crate) fn remove(&self, addr: Addr) {
        let mut shard = self.write_shard(addr);
        shard.remove(addr);
        shard.take_ghost(addr);
    }

    /// Runs the clock hand until one entry runs out of credit, and evicts it.
    fn evict_one(shard: &mut Shard) {
        loop {
            if shard.hand >= shard.ring.len() {
                shard.hand = 0;
            }
            let addr = shard.ring[shard.hand];
            let credit = match shard.entries.get(&addr) {
                Some(e) => e.node.credit.load(Ordering::Relaxed),
                None => 0, // unreachable by the ring's invariant; evicting is safe
            };
            if credit == 0 {
                match shard.entries.contains_key(&addr) {
                    true => shard.remove(addr),
                    false => shard.unring(shard.hand),
                }
                // The ring's last entry, the newest (inserted without credit), now
                // sits under the hand: step past it, or the next eviction takes it
                // before it had a chance to be hit, and every one after it takes the
                // next newcomer, while the hand never reaches the cold entries.
                shard.hand += 1;
                return;
            }
            if let Some(e) = shard.entries.get(&addr) {
                e.node.credit.store(credit - 1, Ordering::Relaxed);
            }
            shard.hand += 1;
        }
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| {
                s.read()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .bytes as u64
            })
            .sum()
    }

    pub(crate) fn capacity(&self) -> u64 {
        (self.shard_budget * SHARDS) as u64
    }

    pub(crate) fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    pub(crate) fn misses(&self) -> u64 {
        self.misses.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::btree::leaf::LeafBuf;
    use crate::btree::node::ValueRef;
    use crate::format::{BlockRef, SegmentId};

    fn leaf(addr: Addr) -> Arc<Node> {
        let n = Node::new_leaf(
            LeafBuf::from_entries([(&b"k"[..], ValueRef::Inline(&[0; 1000]))]),
            0,
        );
        let _ = n.disk.set(BlockRef {
            addr,
            len: 1,
            crc: 0,
        });
        Arc::new(n)
    }

    #[test]
    fn stays_within_budget_and_keeps_hot_entries() {
        let cache = PageCache::new(SHARDS * 64 * 1024);
        let hot = Addr::new(SegmentId(1), 0);
        cache.insert(hot, leaf(hot));
        for i in 1..2000 {
            let a = Addr::new(SegmentId(1), i * 4096);
            cache.insert(a, leaf(a));
            assert!(cache.get(hot).is_some() || i < 10 || cache.bytes() <= cache.capacity());
            let _ = cache.get(hot);
        }
        assert!(cache.bytes() <= cache.capacity());
        assert!(
            cache.get(hot).is_some(),
            "a constantly hit entry was evicted"
        );
    }

    /// A cache full of entries hit once and never again (a reader of an old view
    /// left them) must give way to a working set that fits: the clock has to reach
    /// the stale entries rather than keep evicting each newcomer before its first
    /// hit (which the hand did when the ring's swap-remove put the newest entry
    /// under it).
    #[test]
    fn a_working_set_that_fits_displaces_stale_entries() {
        let cache = PageCache::new(SHARDS * 64 * 1024);
        let per_node = leaf(Addr::new(SegmentId(9), 0)).mem_size();
        let fits = usize::try_from(cache.capacity()).expect("small") / per_node;
        let addr = |seg: u32, i: usize| Addr::new(SegmentId(seg), (i * 4096) as u64);
        for i in 0..fits {
            cache.insert(addr(1, i), leaf(addr(1, i)));
            let _ = cache.get(addr(1, i));
        }
        // A working set of half the capacity, read over and over.
        let working = fits / 2;
        let mut last_round_misses = 0;
        for _ in 0..20 {
            let misses = cache.misses();
            for i in 0..working {
                if cache.get(addr(2, i)).is_none() {
                    cache.insert(addr(2, i), leaf(addr(2, i)));
                }
            }
            last_round_misses = cache.misses() - misses;
        }
        // Shards fill unevenly, so a few entries of the working set may not fit.
        assert!(
            last_round_misses * 10 < working as u64,
            "{last_round_misses} misses of {working} reads: the working set never settled"
        );
    }

    /// Once full, a leaf read once is refused (it is in the OS's cache already), one
    /// read again soon after is admitted and reported as such, and a branch is
    /// always admitted; a scan of leaves read once leaves what was cached in place.
    #[test]
    fn a_full_cache_admits_leaves_on_their_second_read() {
        let cache = PageCache::new(SHARDS * 64 * 1024);
        let per_node = leaf(Addr::new(SegmentId(9), 0)).mem_size();
        let addr = |seg: u32, i: usize| Addr::new(SegmentId(seg), (i * 4096) as u64);
        // Fill every shard (they fill unevenly): while a shard has room, every read
        // is cached; then first reads are refused.
        let offered = 4 * usize::try_from(cache.capacity()).expect("small") / per_node;
        let mut outcomes = Vec::new();
        for i in 0..offered {
            outcomes.push(cache.insert_read(addr(1, i), leaf(addr(1, i))));
        }
        assert!(outcomes.iter().all(|o| *o != Admission::SecondRead));
        assert!(outcomes.contains(&Admission::Cached) && outcomes.contains(&Admission::Refused));
        let cached: Vec<usize> = (0..offered)
            .filter(|&i| cache.contains(addr(1, i)))
            .collect();
        let before = cache.bytes();
        assert!(before <= cache.capacity());
        // A scan of as many new leaves, each read once: all refused, nothing evicted.
        let scanned = offered;
        for i in 0..scanned {
            assert_eq!(
                cache.insert_read(addr(2, i), leaf(addr(2, i))),
                Admission::Refused
            );
        }
        assert_eq!(
            cache.bytes(),
            before,
            "a one-time scan displaced cached leaves"
        );
        assert!(cached.iter().all(|&i| cache.contains(addr(1, i))));
        // Read again soon after: admitted, evicting older leaves to make room.
        let again = addr(2, scanned - 1);
        assert_eq!(cache.insert_read(again, leaf(again)), Admission::SecondRead);
        assert!(cache.contains(again));
        assert!(cache.bytes() <= cache.capacity());
        // A leaf refused long ago (beyond the remembered refusals) is refused again.
        assert_eq!(
            cache.insert_read(addr(2, 0), leaf(addr(2, 0))),
            Admission::Refused
        );
        // A branch is admitted on its first read.
        let b = addr(3, 0);
        let branch = Arc::new(Node::new_branch(1, Vec::new(), 0));
        let _ = branch.disk.set(BlockRef {
            addr: b,
            len: 1,
            crc: 0,
        });
        assert_eq!(cache.insert_read(b, branch), Admission::Cached);
        assert!(cache.contains(b));
    }
}
