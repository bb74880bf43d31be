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
}

impl Kind {
    pub(crate) fn code(self) -> u8 {
        self as u8
    }

    pub(crate) fn from_code(code: u8) -> Option<Kind> {
        match code {
            1 => Some(Kind::From),
            2 => Some(Kind::To),
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

/// The outer join of `From` and `To`: calls `live` with each `From` record that has
/// no `To` for the same key. `records` must be sorted by key; records of one key may
/// come in any order. A `To` without a `From` (its `From` purged by the deletion
/// vector) yields nothing.
pub(crate) fn join(records: &[Record], mut live: impl FnMut(&Record)) {
    let mut rest = records;
    while let Some((first, _)) = rest.split_first() {
        let key = first.key();
        let group_len = rest.iter().take_while(|r| r.key() == key).count();
        let (group, tail) = rest.split_at(group_len);
        if !group.iter().any(|r| r.kind == Kind::To) {
            if let Some(from) = group.iter().find(|r| r.kind == Kind::From) {
                live(from);
            }
        }
        rest = tail;
    }
}
