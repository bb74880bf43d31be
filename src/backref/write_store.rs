//! The write store: the back-reference records of one interval between checkpoints,
//! in memory, sorted by `(child, parent)`.
//!
//! It is a plain value: the engine keeps one in its writer state, a transaction keeps
//! its own and [`WriteStore::merge`]s it in at commit (dropping it on abort), and the
//! checkpoint `std::mem::take`s the writer's at freeze, `add`s the edges of the nodes
//! it writes, and hands it to `BackrefStore::persist`.
//!
//! Same-interval pruning (Backlog §5.1): removing an edge added in this write store
//! cancels both records, so an edge that lived only between two checkpoints costs
//! nothing on disk. Symmetrically, adding an edge whose `To` is pending here cancels
//! that `To` (the edge's older `From` stays in force).

use super::record::{Kind, Record, GONE_CHILD};
use crate::format::{Addr, BlockRef};
use std::collections::btree_map::{BTreeMap, Entry};
use std::ops::RangeInclusive;

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
}

impl WriteStore {
    #[cfg(test)]
    pub(crate) fn new() -> WriteStore {
        WriteStore::default()
    }

    /// Records that `parent` (just written) points at `child`. Adding an edge that is
    /// already pending is a no-op; adding one whose `To` is pending cancels the `To`.
    pub(crate) fn add(&mut self, child: BlockRef, parent: Addr) {
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

    /// Records that `parent` was freed, ending its edge to `child`. If the edge was
    /// added in this write store, both records cancel (nothing reaches disk).
    pub(crate) fn remove(&mut self, child: Addr, parent: Addr) {
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
        self.entries.insert((GONE_CHILD, parent), Pending::Gone);
    }

    /// Whether `parent` was freed in this interval.
    pub(crate) fn gone(&self, parent: Addr) -> bool {
        self.entries.contains_key(&(GONE_CHILD, parent))
    }

    /// Applies `later`'s records after this store's, pruning as `add` and `remove` do.
    pub(crate) fn merge(&mut self, later: WriteStore) {
        if self.entries.is_empty() {
            self.entries = later.entries;
            return;
        }
        for ((child, parent), pending) in later.entries {
            match pending {
                Pending::From { len } => self.add(
                    BlockRef {
                        addr: child,
                        len,
                        crc: 0,
                    },
                    parent,
                ),
                Pending::To => self.remove(child, parent),
                Pending::Gone => self.remove_parent(parent),
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
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
        self.entries
            .range(lo..=hi)
            .map(|(&(child, parent), &p)| record(child, parent, p, 0))
    }

    /// Every record in key order, stamped with `gen`.
    pub(crate) fn records(&self, gen: u64) -> impl Iterator<Item = Record> + '_ {
        self.entries
            .iter()
            .map(move |(&(child, parent), &p)| record(child, parent, p, gen))
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
