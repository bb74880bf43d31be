//! A cursor over a tree: a stack of (node, index) from the root to a leaf entry.
//! There is no leaf chaining (Rodeh §2): moving past the end of a leaf climbs the
//! stack to the next subtree and descends its leftmost (or rightmost) path.

use super::node::{Body, Key, LeafEntry, Node, Probe, MAX_DEPTH};
use super::{child_index, Loader};
use crate::btree::node::Child;
use crate::error::{Error, Result};
use std::sync::Arc;

/// Where to position a cursor.
#[derive(Clone, Copy)]
pub(crate) enum Seek<'k> {
    First,
    Last,
    /// The first entry with key `>= k` (or `> k` when `exclusive`).
    AtOrAfter(&'k [u8], bool),
    /// The last entry with key `<= k` (or `< k` when `exclusive`).
    AtOrBefore(&'k [u8], bool),
}

/// Whether an entry with `key` lies before the seek position: below `k`, or at `k`
/// too when `inclusive_of_k`.
fn before(key: &Key, k: &[u8], inclusive_of_k: bool) -> bool {
    match key.cmp_probe(&Probe::new(k)) {
        std::cmp::Ordering::Less => true,
        std::cmp::Ordering::Equal => inclusive_of_k,
        std::cmp::Ordering::Greater => false,
    }
}

#[derive(Default)]
pub(crate) struct Cursor {
    /// Path from the root; the last element is a leaf and its entry index.
    stack: Vec<(Arc<Node>, usize)>,
}

impl Cursor {
    /// Positions a cursor; it is exhausted (`current` is `None`) if no entry matches.
    pub(crate) fn seek(loader: Loader<'_>, root: Option<&Child>, seek: Seek<'_>) -> Result<Cursor> {
        let mut c = Cursor::default();
        let Some(root) = root else { return Ok(c) };
        let mut node = loader.resolve(root)?;
        loop {
            if c.stack.len() > MAX_DEPTH {
                return Err(Error::corrupted("node", "tree deeper than MAX_DEPTH"));
            }
            match &node.body {
                Body::Branch(entries) => {
                    let idx = match seek {
                        Seek::First => 0,
                        Seek::Last => entries.len() - 1,
                        Seek::AtOrAfter(k, _) | Seek::AtOrBefore(k, _) => {
                            child_index(entries, &Probe::new(k))
                        }
                    };
                    let child = loader.child_of(node.level, &entries[idx].child)?;
                    c.stack.push((node, idx));
                    node = child;
                }
                Body::Leaf(entries) => {
                    // `pos` may be one past either end; normalising moves to a neighbour leaf.
                    let (pos, forward) = match seek {
                        Seek::First => (0, true),
                        Seek::Last => (entries.len().wrapping_sub(1), false),
                        Seek::AtOrAfter(k, excl) => {
                            (entries.partition_point(|e| before(&e.key, k, excl)), true)
                        }
                        Seek::AtOrBefore(k, excl) => (
                            entries
                                .partition_point(|e| before(&e.key, k, !excl))
                                .wrapping_sub(1),
                            false,
                        ),
                    };
                    c.stack.push((node, pos));
                    if forward {
                        c.normalize_forward(loader)?;
                    } else {
                        c.normalize_backward(loader)?;
                    }
                    return Ok(c);
                }
            }
        }
    }

    /// The entry under the cursor.
    pub(crate) fn current(&self) -> Option<&LeafEntry> {
        let (node, pos) = self.stack.last()?;
        match &node.body {
            Body::Leaf(entries) => entries.get(*pos),
            Body::Branch(_) => None,
        }
    }

    pub(crate) fn advance(&mut self, loader: Loader<'_>) -> Result<()> {
        if let Some(top) = self.stack.last_mut() {
            top.1 = top.1.wrapping_add(1);
        }
        self.normalize_forward(loader)
    }

    pub(crate) fn retreat(&mut self, loader: Loader<'_>) -> Result<()> {
        if let Some(top) = self.stack.last_mut() {
            top.1 = top.1.wrapping_sub(1);
        }
        self.normalize_backward(loader)
    }

    /// While the top position is past its node's end, climb and step right, then
    /// descend leftmost.
    fn normalize_forward(&mut self, loader: Loader<'_>) -> Result<()> {
        loop {
            let Some((node, pos)) = self.stack.last() else {
                return Ok(());
            };
            if *pos < node.len() {
                if node.level == 0 {
                    return Ok(());
                }
                let Body::Branch(entries) = &node.body else {
                    unreachable!("level > 0")
                };
                let child = loader.child_of(node.level, &entries[*pos].child)?;
                self.stack.push((child, 0));
                continue;
            }
            self.stack.pop();
            match self.stack.last_mut() {
                Some(parent) => parent.1 += 1,
                None => return Ok(()),
            }
        }
    }

    /// While the top position is before its node's start (wrapped to usize::MAX),
    /// climb and step left, then descend rightmost.
    fn normalize_backward(&mut self, loader: Loader<'_>) -> Result<()> {
        loop {
            let Some((node, pos)) = self.stack.last() else {
                return Ok(());
            };
            if *pos < node.len() {
                if node.level == 0 {
                    return Ok(());
                }
                let Body::Branch(entries) = &node.body else {
                    unreachable!("level > 0")
                };
                let child = loader.child_of(node.level, &entries[*pos].child)?;
                let last = child.len().wrapping_sub(1);
                self.stack.push((child, last));
                continue;
            }
            self.stack.pop();
            match self.stack.last_mut() {
                Some(parent) => parent.1 = parent.1.wrapping_sub(1),
                None => return Ok(()),
            }
        }
    }
}
