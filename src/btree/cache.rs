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
//! Invariant: only clean nodes (written, `disk` set, children by address) are cached,
//! so an entry never pins other nodes and its address names exactly its content.

use crate::btree::node::Node;
use crate::format::Addr;
use crate::format::AddrMap;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

const SHARDS: usize = 16;
const MAX_CREDIT: u8 = 4;

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

    pub(crate) fn insert(&self, addr: Addr, node: Arc<Node>) {
        debug_assert!(!node.is_dirty(), "only clean nodes are cached");
        let mut shard = self
            .shard(addr)
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if shard.entries.contains_key(&addr) {
            return;
        }
        let size = node.mem_size();
        while shard.bytes + size > self.shard_budget && !shard.ring.is_empty() {
            Self::evict_one(&mut shard);
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
        self.shard(addr)
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(addr);
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
}
