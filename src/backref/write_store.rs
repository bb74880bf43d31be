//! The write store: the back-reference records of one interval between checkpoints,
//! in memory, sorted by `(child, parent)`.
//!
//! It is a plain value: the engine keeps one in its writer state, a transaction keeps
//! its own and [`WriteStore::merge`]s it in at commit (dropping it on abort), and the
//! checkpoint `std::mem::take`s the writer's at freeze, records the edges of the nodes
//! it writes, and hands it to `BackrefStore::persist`.
//!
//! Same-interval pruning (Backlog §5.1): removing an edge added in this write store
//! cancels both records, so an edge that lived only between two checkpoints costs
//! nothing on disk. Symmetrically, adding an edge whose `To` is pending here cancels
//! that `To` (the edge's older `From` stays in force).
//!
//! The edges of the nodes a checkpoint (or a spill) writes come in bulk, tens of
//! thousands at a time, from parents that did not exist before: they are kept apart
//! in one sorted `Vec` (`written`) instead of being inserted one by one into the map,
//! which costs a fraction as much. They mean exactly what as many `add`s after the
//! map's records would mean: iteration merges the two and applies the pruning rules
//! where a key is in both.

use super::record::{Kind, Record, GONE_CHILD};
use crate::format::{Addr, BlockRef};
use std::collections::btree_map::{BTreeMap, Entry};
use std::ops::RangeInclusive;
use std::time::{Duration, Instant};

/// A pending record: a `From` with the child's length, or a `To`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Pending {
    From {
        len: u32,
    },
    To,
    /// The key's parent was freed (the key's child is `GONE_CHILD`).
    Gone,
}

/// The in-memory records of one interval, keyed by `(child, parent)`.
#[derive(Clone, Debug, Default)]
pub(crate) struct WriteStore {
    entries: BTreeMap<(Addr, Addr), Pending>,
    /// `From` edges added in bulk by [`WriteStore::add_written`]: sorted by key,
    /// unique, and applied after `entries` (a key in both is resolved as `add` would).
    written: Vec<(Addr, Addr, u32)>,
    /// Time spent recording into this store (and the stores merged into it): what
    /// back references cost the writer, reported in `Stats::backref_nanos`.
    pub(crate) time_spent: Duration,
}

impl WriteStore {
    #[cfg(test)]
    pub(crate) fn new() -> WriteStore {
        WriteStore::default()
    }

    /// Records that `parent` (just written) points at `child`. Adding an edge that is
    /// already pending is a no-op; adding one whose `To` is pending cancels the `To`.
    #[cfg(test)]
    pub(crate) fn add(&mut self, child: BlockRef, parent: Addr) {
        let started = Instant::now();
        self.add_untimed(child, parent);
        self.time_spent += started.elapsed();
    }

    fn add_untimed(&mut self, child: BlockRef, parent: Addr) {
        match self.entries.entry((child.addr, parent)) {
            Entry::Vacant(v) => {
                v.insert(Pending::From { len: child.len });
            }
            Entry::Occupied(o) => {
                if *o.get() == Pending::To {
                    o.remove();
                }
            }
        }
    }

    /// Records that the nodes just written point at their children: `edges` holds
    /// `(child, parent)` pairs, in any order. The same as an `add` of each, at a
    /// fraction of the cost.
    pub(crate) fn add_written(&mut self, edges: Vec<(BlockRef, Addr)>) {
        let started = Instant::now();
        self.extend_written(
            edges
                .into_iter()
                .map(|(child, parent)| (child.addr, parent, child.len)),
        );
        self.time_spent += started.elapsed();
    }

    /// Adds bulk edges after everything recorded so far, keeping `written` sorted and
    /// unique.
    fn extend_written(&mut self, edges: impl IntoIterator<Item = (Addr, Addr, u32)>) {
        self.written.extend(edges);
        // Stable, so of two adds of one edge the first stays (as `add` keeps it).
        self.written
            .sort_by_key(|&(child, parent, _)| (child, parent));
        self.written
            .dedup_by_key(|&mut (child, parent, _)| (child, parent));
    }

    /// Records that `parent` was freed, ending its edge to `child`. If the edge was
    /// added in this write store, both records cancel (nothing reaches disk).
    #[cfg(test)]
    pub(crate) fn remove(&mut self, child: Addr, parent: Addr) {
        let started = Instant::now();
        self.remove_untimed(child, parent);
        self.time_spent += started.elapsed();
    }

    fn remove_untimed(&mut self, child: Addr, parent: Addr) {
        if let Ok(i) = self
            .written
            .binary_search_by_key(&(child, parent), |&(c, p, _)| (c, p))
        {
            // Added after every map record: the two cancel, and the map is untouched.
            self.written.remove(i);
            return;
        }
        match self.entries.entry((child, parent)) {
            Entry::Vacant(v) => {
                v.insert(Pending::To);
            }
            Entry::Occupied(o) => {
                if matches!(o.get(), Pending::From { .. }) {
                    o.remove();
                }
            }
        }
    }

    /// Records that the written node `parent` was freed: every edge from it ends. One
    /// record, whatever the node's fan-out.
    pub(crate) fn remove_parent(&mut self, parent: Addr) {
        let started = Instant::now();
        self.entries.insert((GONE_CHILD, parent), Pending::Gone);
        self.time_spent += started.elapsed();
    }

    /// Whether `parent` was freed in this interval.
    pub(crate) fn gone(&self, parent: Addr) -> bool {
        self.entries.contains_key(&(GONE_CHILD, parent))
    }

    /// Applies `later`'s records after this store's, pruning as `add` and `remove` do.
    pub(crate) fn merge(&mut self, later: WriteStore) {
        let started = Instant::now();
        let spent = self.time_spent + later.time_spent;
        if self.entries.is_empty() && self.written.is_empty() {
            *self = later;
        } else {
            self.merge_untimed(later);
        }
        self.time_spent = spent + started.elapsed();
    }

    fn merge_untimed(&mut self, later: WriteStore) {
        // `later`'s map records apply after this store's, then its bulk edges after
        // both.
        let later_written = later.written;
        for ((child, parent), pending) in later.entries {
            match pending {
                Pending::From { len } => self.add_untimed(
                    BlockRef {
                        addr: child,
                        len,
                        crc: 0,
                    },
                    parent,
                ),
                Pending::To => self.remove_untimed(child, parent),
                Pending::Gone => {
                    self.entries.insert((GONE_CHILD, parent), Pending::Gone);
                }
            }
        }
        // In bulk, not one `add` each: `written` already means "added after the map".
        self.extend_written(later_written);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.written.is_empty()
    }

    /// Whether any record's child is in `children`.
    pub(crate) fn any_in(&self, children: &RangeInclusive<u64>) -> bool {
        self.range(children).next().is_some()
    }

    /// The records whose child is in `children`, in key order (generation 0: a
    /// pending record has none yet).
    pub(crate) fn range(
        &self,
        children: &RangeInclusive<u64>,
    ) -> impl Iterator<Item = Record> + '_ {
        let lo = (Addr(*children.start()), Addr(0));
        let hi = (Addr(*children.end()), Addr(u64::MAX));
        let from = self.written.partition_point(|&(c, p, _)| (c, p) < lo);
        let to = self.written.partition_point(|&(c, p, _)| (c, p) <= hi);
        let written = self.written.get(from..to).unwrap_or(&[]);
        Merged::new(self.entries.range(lo..=hi), written, 0)
    }

    /// At least as many as [`WriteStore::records`] yields (a record in both the map
    /// and the bulk edges may merge into one, or cancel).
    pub(crate) fn records_bound(&self) -> usize {
        self.entries.len() + self.written.len()
    }

    /// Every record in key order, stamped with `gen`.
    pub(crate) fn records(&self, gen: u64) -> impl Iterator<Item = Record> + '_ {
        Merged::new(self.entries.iter(), &self.written, gen)
    }
}

/// The records of a stretch of the map and of the bulk edges, merged in key order.
/// Where a key is in both, the bulk edge is an `add` after the map's record: after a
/// `From` it changes nothing, after a `To` both cancel.
struct Merged<'a, M: Iterator<Item = (&'a (Addr, Addr), &'a Pending)>> {
    map: std::iter::Peekable<M>,
    written: std::iter::Peekable<std::slice::Iter<'a, (Addr, Addr, u32)>>,
    gen: u64,
}

impl<'a, M: Iterator<Item = (&'a (Addr, Addr), &'a Pending)>> Merged<'a, M> {
    fn new(map: M, written: &'a [(Addr, Addr, u32)], gen: u64) -> Self {
        Merged {
            map: map.peekable(),
            written: written.iter().peekable(),
            gen,
        }
    }
}

impl<'a, M: Iterator<Item = (&'a (Addr, Addr), &'a Pending)>> Iterator for Merged<'a, M> {
    type Item = Record;

    fn next(&mut self) -> Option<Record> {
        loop {
            let map_key = self.map.peek().map(|(&key, _)| key);
            let written_key = self.written.peek().map(|&&(c, p, _)| (c, p));
            match (map_key, written_key) {
                (None, None) => return None,
                (Some(m), w) if w.is_none_or(|w| m < w) => {
                    let (&(child, parent), &p) = self.map.next()?;
                    return Some(record(child, parent, p, self.gen));
                }
                (m, Some(w)) if m.is_none_or(|m| w < m) => {
                    let &(child, parent, len) = self.written.next()?;
                    return Some(record(child, parent, Pending::From { len }, self.gen));
                }
                _ => {
                    // The same key in both.
                    let (&(child, parent), &p) = self.map.next()?;
                    self.written.next();
                    match p {
                        Pending::To => continue,
                        _ => return Some(record(child, parent, p, self.gen)),
                    }
                }
            }
        }
    }
}
fn record(child: Addr, parent: Addr, pending: Pending, gen: u64) -> Record {
    let (kind, len) = match pending {
        Pending::From { len } => (Kind::From, len),
        Pending::To => (Kind::To, 0),
        Pending::Gone => (Kind::Gone, 0),
    };
    Record {
        child,
        parent,
        gen,
        len,
        kind,
    }
}
