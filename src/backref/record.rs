//! The records of the back-reference store and the join that turns them into live
//! edges.

use crate::format::Addr;

/// What a record says about its edge.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub(crate) enum Kind {
    /// The edge was created: `parent` was written pointing at `child`.
    From = 1,
    /// The edge ended: `parent` was freed.
    To = 2,
    /// `parent` was freed: every edge from it ended. One record per freed node
    /// instead of a `To` per pointer; its child is [`GONE_CHILD`], so it sorts after
    /// every edge and a range query over real addresses never meets it.
    Gone = 3,
}

/// The child field of a [`Kind::Gone`] record (no block has this address).
pub(crate) const GONE_CHILD: Addr = Addr(u64::MAX);

impl Kind {
    pub(crate) fn code(self) -> u8 {
        self as u8
    }

    pub(crate) fn from_code(code: u8) -> Option<Kind> {
        match code {
            1 => Some(Kind::From),
            2 => Some(Kind::To),
            3 => Some(Kind::Gone),
            _ => None,
        }
    }
}

/// One `From` or `To` record. `len` is the child's length for a `From`, 0 for a `To`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Record {
    pub child: Addr,
    pub parent: Addr,
    pub gen: u64,
    pub len: u32,
    pub kind: Kind,
}

impl Record {
    /// The sort key of every run and write store.
    pub(crate) fn key(&self) -> (Addr, Addr) {
        (self.child, self.parent)
    }

    pub(crate) fn edge(&self) -> Edge {
        Edge {
            child: self.child,
            parent: self.parent,
            len: self.len,
        }
    }
}

/// A live back reference: the node at `parent` points at the `len`-byte block at
/// `child`. Ordered by `(child, parent)`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub(crate) struct Edge {
    pub child: Addr,
    pub parent: Addr,
    pub len: u32,
}

/// The outer join of `From` and `To` over several sorted sources: calls `live` with
/// each `From` record that has no `To` for the same key in any source, in key order.
/// `Gone` records are not joined here: the caller drops the edges of gone parents.
/// Each source must be sorted by key with unique keys (a run's records, or a write
/// store's). A `To` without a `From` (its `From` purged by the deletion vector)
/// yields nothing.
///
/// A k-way merge that gallops: while one source's keys stay below every other
/// source's head, they are passed through in one stretch, so merging a long combined
/// run with a few small level-0 runs costs little more than a copy.
pub(crate) fn merge_join(mut sources: Vec<&[Record]>, mut live: impl FnMut(&Record)) {
    sources.retain(|s| !s.is_empty());
    loop {
        let mut heads = sources
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.first().map(|r| (r.key(), i)));
        let Some(mut min) = heads.next() else {
            return;
        };
        let mut second: Option<(Addr, Addr)> = None;
        for (key, i) in heads {
            if key < min.0 {
                second = Some(min.0);
                min = (key, i);
            } else if second.is_none_or(|s| key < s) {
                second = Some(key);
            }
        }
        let (key, index) = min;
        if second == Some(key) {
            join_group(&mut sources, key, &mut live);
        } else if let Some(source) = sources.get_mut(index) {
            // Alone below `second`: every record up to there is its key's only one.
            let n = second.map_or(source.len(), |bound| gallop_lt(source, bound));
            let (stretch, rest) = source.split_at(n);
            stretch
                .iter()
                .filter(|r| r.kind == Kind::From)
                .for_each(&mut live);
            *source = rest;
        }
    }
}

/// Joins the records of `key` at the heads of `sources` and advances past them.
fn join_group(sources: &mut [&[Record]], key: (Addr, Addr), live: &mut impl FnMut(&Record)) {
    let (mut from, mut ended) = (None, false);
    for source in sources.iter_mut() {
        if let Some((head, rest)) = source.split_first() {
            if head.key() == key {
                match head.kind {
                    Kind::From => from = Some(*head),
                    Kind::To => ended = true,
                    // Applied by the caller, which knows every source's.
                    Kind::Gone => {}
                }
                *source = rest;
            }
        }
    }
    if let (Some(from), false) = (from, ended) {
        live(&from);
    }
}

/// The number of leading records of `records` with a key below `bound` (galloping
/// from the front; at least one record qualifies in the caller's use).
fn gallop_lt(records: &[Record], bound: (Addr, Addr)) -> usize {
    let mut hi = 1;
    while records.get(hi).is_some_and(|r| r.key() < bound) {
        hi *= 2;
    }
    let lo = hi / 2;
    lo + records
        .get(lo..hi.min(records.len()))
        .map_or(0, |s| s.partition_point(|r| r.key() < bound))
}
