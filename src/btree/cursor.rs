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

/// A cursor that has stepped from one leaf into the next this many times is taken for
/// a scan, and reads ahead (a range read of a few entries crosses one boundary at
/// most, and must not pull in leaves it will not read).
const SCAN_AFTER_LEAVES: usize = 2;

/// How many nodes ahead of the one it enters a scan asks the OS for, at each of the
/// two levels it reads ahead ([`Cursor`]'s read-ahead): leaves, in a window that
/// doubles with every leaf crossed from 8 (64 KiB) to 128 (a whole leaf-level branch
/// and more; 1 MiB), asked for half a window at a time; and the next leaf-level
/// branches, so that the one entered next is in memory when its leaves are asked
/// for.
fn read_ahead_window(level: u8, leaves_crossed: usize) -> usize {
    match level {
        1 => 8 << leaves_crossed.saturating_sub(SCAN_AFTER_LEAVES).min(4),
        _ => 2,
    }
}

#[derive(Default)]
pub(crate) struct Cursor {
    /// Path from the root; the last element is a leaf and its entry index.
    stack: Vec<(Arc<Node>, usize)>,
    /// How many times the cursor stepped past a leaf's end into the next.
    leaves_crossed: usize,
    /// For levels 1 and 2, the branch whose children the read-ahead asked for last
    /// (by address, only compared), and how far (see [`ask_ahead`]).
    asked: [(usize, usize); 2],
    /// The leaf-level branch after the current one that the read-ahead loaded and
    /// asked the first leaves of: its parent (by address, only compared) and index.
    primed: (usize, usize),
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
        if !same_leaf {
            self.leaves_crossed += 1;
        }
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

    /// A scan about to descend from the branch on top of the stack (of level 1 or 2)
    /// asks the OS for the nodes ahead: the children after the one it enters, and,
    /// once that reaches the end of a leaf-level branch, the first leaves of the next
    /// one (loaded for that), so the disk never waits for the scan to arrive.
    fn read_ahead(&mut self, loader: Loader<'_>, forward: bool) {
        let Cursor {
            stack,
            leaves_crossed,
            asked,
            primed,
        } = self;
        let Some((node, pos)) = stack.last() else {
            return;
        };
        let Some(asked) = usize::from(node.level)
            .checked_sub(1)
            .and_then(|l| asked.get_mut(l))
        else {
            return;
        };
        let window = read_ahead_window(node.level, *leaves_crossed);
        let at_end = ask_ahead(loader, node, *pos, forward, window, asked);
        if node.level != 1 || !at_end {
            return;
        }
        let Some((up, i)) = stack.len().checked_sub(2).and_then(|at| stack.get(at)) else {
            return;
        };
        let next = match forward {
            true => i.checked_add(1).filter(|&n| n < up.len()),
            false => i.checked_sub(1),
        };
        let Some(n) = next else {
            return;
        };
        let at = (Arc::as_ptr(up) as usize, n);
        if *primed == at {
            return;
        }
        *primed = at;
        // A read-ahead: a node that fails to load is the descent's to report.
        let Ok(next) = loader.child_at(up, n) else {
            return;
        };
        let first = match forward {
            true => 0..window.min(next.len()),
            false => next.len().saturating_sub(window)..next.len(),
        };
        loader.ask_for_children(&next, first);
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
                if self.leaves_crossed >= SCAN_AFTER_LEAVES {
                    self.read_ahead(loader, true);
                }
                let Some((node, pos)) = self.stack.last() else {
                    return Ok(());
                };
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
                if self.leaves_crossed >= SCAN_AFTER_LEAVES {
                    self.read_ahead(loader, false);
                }
                let Some((node, pos)) = self.stack.last() else {
                    return Ok(());
                };
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

/// Asks the OS to read the written children of `parent` (a branch of level 1 or 2)
/// after child `pos`, which a scan is about to enter, in the direction of travel, up
/// to `window` ahead, each once, half a window at a time. The OS reads node segments
/// only as asked ([`crate::io::VFile::reads_are_random`]): a scan that did not ask
/// would wait for the disk at every leaf. `asked` is the cursor's record for this
/// level: the branch and, forward, the first index not asked for yet, backward, the
/// last one asked for. Returns whether the window reaches the branch's last child in
/// the direction of travel.
fn ask_ahead(
    loader: Loader<'_>,
    parent: &Node,
    pos: usize,
    forward: bool,
    window: usize,
    asked: &mut (usize, usize),
) -> bool {
    let at_end = match forward {
        true => pos + window + 1 >= parent.len(),
        false => pos <= window,
    };
    let id = std::ptr::from_ref(parent) as usize;
    // Children asked for so far, counted from `pos` in the direction of travel.
    let done = match (asked.0 == id, forward) {
        (false, _) => 0,
        (true, true) => asked.1.saturating_sub(pos),
        (true, false) => (pos + 1).saturating_sub(asked.1),
    };
    if done > window / 2 {
        return at_end;
    }
    let steps = children_ahead(parent.len(), pos, forward, done.max(1), window);
    if let Some(last) = loader.ask_for_children(parent, steps) {
        *asked = (id, if forward { last + 1 } else { last });
    }
    at_end
}

/// The indices of the children `first` to `window` steps from `pos` in the direction
/// of travel, among `len`. Bounded by the branch's ends up front: near the end (the
/// last half-window of every branch) there are none, and a scan comes here at every
/// leaf, so the range must be empty then, not walked and filtered (that walk was 5%
/// of an in-memory full scan).
fn children_ahead(
    len: usize,
    pos: usize,
    forward: bool,
    first: usize,
    window: usize,
) -> impl Iterator<Item = usize> {
    let last = match forward {
        true => window.min(len.saturating_sub(pos + 1)),
        false => window.min(pos),
    };
    (first..=last).map(move |d| if forward { pos + d } else { pos - d })
}

#[cfg(test)]
mod tests {
    use super::children_ahead;

    /// The children asked for are exactly those `first..=window` steps away that
    /// exist, in the direction of travel, in order.
    #[test]
    fn children_ahead_stay_inside_the_branch() {
        for len in 0..24usize {
            for pos in 0..len {
                for window in [2, 8, 16] {
                    for first in 1..=window + 1 {
                        for forward in [true, false] {
                            let want: Vec<usize> = (first..=window)
                                .filter_map(|d| match forward {
                                    true => Some(pos + d).filter(|&i| i < len),
                                    false => pos.checked_sub(d),
                                })
                                .collect();
                            let got: Vec<usize> =
                                children_ahead(len, pos, forward, first, window).collect();
                            assert_eq!(
                                got, want,
                                "len {len} pos {pos} {forward} {first}..={window}"
                            );
                        }
                    }
                }
            }
        }
    }
}
