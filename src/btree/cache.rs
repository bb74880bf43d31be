//! The page cache: clean, decoded nodes by physical address, under a memory budget.
//!
//! Replacement is CLOCK with credits: a hit refills an entry's credit, the hand takes
//! one credit per pass and evicts at zero. Leaves are inserted without credit. Branch nodes get more credit than leaves
//! (level + 1, capped), so the top levels of every tree stay hot while leaves of a
//! large scan cycle through. The cache is sharded by address to keep lock hold times
//! short; hits take only a shard's read lock.
//!
//! Invariant: only clean nodes (written, `disk` set, children by address) are cached,
//! so an entry never pins other nodes and its address names exactly its content.

use crate::btree::node::Node;
use crate::format::Addr;
use crate::format::AddrMap;

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, RwLock};

const SHARDS: usize = 16;
const MAX_CREDIT: u8 = 4;

struct Slot {
    addr: Addr,
    node: Arc<Node>,
    credit: AtomicU8,
}

#[derive(Default)]
struct Shard {
    index: AddrMap<Addr, usize>,
    slots: Vec<Slot>,
    hand: usize,
    bytes: usize,
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
        match shard.index.get(&addr) {
            Some(&i) => {
                let slot = &shard.slots[i];
                slot.credit.store(credit_for(&slot.node), Ordering::Relaxed);
                self.hits.fetch_add(1, Ordering::Relaxed);
                Some(slot.node.clone())
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Whether `addr` is cached, without counting a hit or a miss or crediting the
    /// node (a look, not a use).
    pub(crate) fn contains(&self, addr: Addr) -> bool {
        self.shard(addr)
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .index
            .contains_key(&addr)
    }

    pub(crate) fn insert(&self, addr: Addr, node: Arc<Node>) {
        debug_assert!(!node.is_dirty(), "only clean nodes are cached");
        let mut shard = self
            .shard(addr)
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if shard.index.contains_key(&addr) {
            return;
        }
        let size = node.mem_size();
        while shard.bytes + size > self.shard_budget && !shard.slots.is_empty() {
            Self::evict_one(&mut shard);
        }
        // Leaves enter cold (no credit until their first hit), so a long scan cannot
        // flush out what is hot; branches enter with their level's credit.
        let credit = AtomicU8::new(if node.level == 0 {
            0
        } else {
            credit_for(&node)
        });
        let i = shard.slots.len();
        shard.slots.push(Slot { addr, node, credit });
        shard.index.insert(addr, i);
        shard.bytes += size;
    }

    /// Runs the clock hand until one entry runs out of credit, and evicts it.
    fn evict_one(shard: &mut Shard) {
        loop {
            if shard.hand >= shard.slots.len() {
                shard.hand = 0;
            }
            let slot = &shard.slots[shard.hand];
            let credit = slot.credit.load(Ordering::Relaxed);
            if credit == 0 {
                let victim = shard.slots.swap_remove(shard.hand);
                shard.index.remove(&victim.addr);
                if let Some(moved) = shard.slots.get(shard.hand) {
                    let moved_addr = moved.addr;
                    shard.index.insert(moved_addr, shard.hand);
                }
                shard.bytes -= victim.node.mem_size();
                return;
            }
            slot.credit.store(credit - 1, Ordering::Relaxed);
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
    use crate::btree::node::{LeafEntry, Value};
    use crate::format::{BlockRef, SegmentId};

    fn leaf(addr: Addr) -> Arc<Node> {
        let n = Node::new_leaf(
            vec![LeafEntry {
                key: (&b"k"[..]).into(),
                value: Value::Inline(vec![0; 1000].into()),
            }],
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
}
