//! A cursor over a tree: a stack of (node, index) from the root to a leaf entry.
//! There is no leaf chaining (Rodeh §2): moving past the end of a leaf climbs the
//! stack to the next subtree and descends its leftmost (or rightmost) path.

use super::node::{Child, Node, ValueRef, MAX_DEPTH};
use super::Loader;
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

/// How many entries of `node` lie before the seek position for `k`: those below `k`,
/// and the one at `k` too when `inclusive_of_k`.
fn count_before(node: &Node, k: &[u8], inclusive_of_k: bool) -> usize {
    match node.search(k) {
        Ok(i) if inclusive_of_k => i + 1,
        Ok(i) | Err(i) => i,
    }
}

/// How many entries ahead of the one it stands on a cursor has fetched (see
/// [`super::layout::prefetch`]): enough to overlap the misses of a short range scan.
const PREFETCH_AHEAD: usize = 4;

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
            if node.is_leaf() {
                // `pos` may be one past either end; normalising moves to a neighbour leaf.
                let (pos, forward) = match seek {
                    Seek::First => (0, true),
                    Seek::Last => (node.len().wrapping_sub(1), false),
                    Seek::AtOrAfter(k, excl) => (count_before(&node, k, excl), true),
                    Seek::AtOrBefore(k, excl) => {
                        (count_before(&node, k, !excl).wrapping_sub(1), false)
                    }
                };
                c.stack.push((node, pos));
                if forward {
                    c.normalize_forward(loader)?;
                } else {
                    c.normalize_backward(loader)?;
                }
                c.prefetch(forward, 1..=PREFETCH_AHEAD);
                return Ok(c);
            }
            if node.len() == 0 {
                return Err(Error::corrupted("node", "branch node without children"));
            }
            let idx = match seek {
                Seek::First => 0,
                Seek::Last => node.len() - 1,
                Seek::AtOrAfter(k, _) | Seek::AtOrBefore(k, _) => node.child_index(k),
            };
            let child = loader.child_at(&node, idx)?;
            c.stack.push((node, idx));
            node = child;
        }
    }

    /// The key and value under the cursor.
    pub(crate) fn current(&self) -> Option<(&[u8], ValueRef<'_>)> {
        let (node, pos) = self.stack.last()?;
        (node.is_leaf() && *pos < node.len()).then(|| (node.key(*pos), node.value(*pos)))
    }

    pub(crate) fn advance(&mut self, loader: Loader<'_>) -> Result<()> {
        self.step(loader, true)
    }

    pub(crate) fn retreat(&mut self, loader: Loader<'_>) -> Result<()> {
        self.step(loader, false)
    }

    fn step(&mut self, loader: Loader<'_>, forward: bool) -> Result<()> {
        let Some(top) = self.stack.last_mut() else {
            return Ok(());
        };
        let leaf = Arc::as_ptr(&top.0);
        top.1 = if forward {
            top.1.wrapping_add(1)
        } else {
            top.1.wrapping_sub(1)
        };
        if forward {
            self.normalize_forward(loader)?;
        } else {
            self.normalize_backward(loader)?;
        }
        // Within a leaf, the entries up to the one before are on their way already;
        // a leaf just entered needs its whole window.
        let same_leaf = self.stack.last().is_some_and(|t| Arc::as_ptr(&t.0) == leaf);
        match same_leaf {
            true => self.prefetch(forward, PREFETCH_AHEAD..=PREFETCH_AHEAD),
            false => self.prefetch(forward, 1..=PREFETCH_AHEAD),
        }
        Ok(())
    }

    /// Starts fetching the leaf entries `distances` away from the current one, in
    /// the direction of travel.
    fn prefetch(&self, forward: bool, distances: std::ops::RangeInclusive<usize>) {
        let Some((node, pos)) = self.stack.last() else {
            return;
        };
        if !node.is_leaf() {
            return;
        }
        for d in distances {
            let i = match forward {
                true => pos.wrapping_add(d),
                false => pos.wrapping_sub(d),
            };
            node.prefetch_entry(i);
        }
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
                let child = loader.child_at(node, *pos)?;
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
                let child = loader.child_at(node, *pos)?;
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
