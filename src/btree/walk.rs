//! The one tree walk: every traversal of a whole tree (the checkpoint's dirty-node
//! collection, space accounting, `stats`, `verify`) goes through [`walk`], so the
//! guards a walk over untrusted bytes needs are written once.
//!
//! Guards: each child must sit exactly one level below its parent, and the depth is
//! capped at `MAX_DEPTH`. Together they make the walk finite on any input: a damaged
//! pointer that names a node at its own level or above (which the page cache would
//! resolve without reading, and so without checking the parent's checksum) is refused
//! instead of looping.
//!
//! A [`Visitor`] sees each pointer before it is resolved ([`Visitor::enter`], where a
//! shared subtree can be skipped without reading it), each node before its children
//! ([`Visitor::visit`], pre-order) and after them ([`Visitor::leave`], post-order, for
//! folds), with the key range the parent's separators allow.

use super::node::{Child, Node, MAX_DEPTH};
use super::Loader;
use crate::error::{Error, Result};
use std::sync::Arc;

/// Where the walk is: the pointer it followed and what the parent says about it.
pub(crate) struct At<'k> {
    /// The pointer to the node.
    pub child: &'k Child,
    /// Steps from the walk's root (0 for the root).
    pub depth: usize,
    /// The node's keys must be `>= lo` (the parent's separator; none at the left edge).
    pub lo: Option<&'k [u8]>,
    /// The node's keys must be `< hi` (the next separator; none at the right edge).
    pub hi: Option<&'k [u8]>,
}

/// How a walk turns pointers into nodes.
pub(crate) trait Source {
    fn node(&mut self, child: &Child) -> Result<Arc<Node>>;

    /// Before the walk goes through the children of `branch`: a source that will read
    /// them all from disk asks for them ahead (the OS reads node segments only as
    /// asked). The default does nothing: a walk that skips most subtrees would read
    /// what it never visits.
    fn children_ahead(&mut self, _branch: &Node) {}
}

impl Source for Loader<'_> {
    fn node(&mut self, child: &Child) -> Result<Arc<Node>> {
        self.resolve(child)
    }
}

/// A [`Loader`] for a walk that visits every node: it asks the OS for each branch's
/// children that are not cached before the walk goes through them.
pub(crate) struct ReadAhead<'a>(pub(crate) Loader<'a>);

impl Source for ReadAhead<'_> {
    fn node(&mut self, child: &Child) -> Result<Arc<Node>> {
        self.0.resolve(child)
    }

    fn children_ahead(&mut self, branch: &Node) {
        self.0.ask_for_children(branch, 0..branch.len());
    }
}

/// What a walk does at each step. Only `visit` is required.
pub(crate) trait Visitor {
    /// Before the node at `at` is resolved: `false` skips it and its subtree.
    fn enter(&mut self, _at: &At<'_>) -> Result<bool> {
        Ok(true)
    }

    /// The node, before its children: `false` skips them (and `leave`).
    fn visit(&mut self, at: &At<'_>, node: &Arc<Node>) -> Result<bool>;

    /// The node, after its children.
    fn leave(&mut self, _at: &At<'_>, _node: &Arc<Node>) -> Result<()> {
        Ok(())
    }

    /// A node that could not be read, or that breaks the level or depth guard. The
    /// default ends the walk with the error; a checker may record it and return `Ok`
    /// to go on with the siblings (the damaged subtree is skipped).
    fn damaged(&mut self, _at: &At<'_>, err: Error) -> Result<()> {
        Err(err)
    }
}

/// Walks the tree at `root` depth-first, children in key order.
pub(crate) fn walk(
    source: &mut impl Source,
    root: &Child,
    visitor: &mut impl Visitor,
) -> Result<()> {
    let at = At {
        child: root,
        depth: 0,
        lo: None,
        hi: None,
    };
    step(source, &at, None, visitor)
}

fn step(
    source: &mut impl Source,
    at: &At<'_>,
    parent_level: Option<u8>,
    visitor: &mut impl Visitor,
) -> Result<()> {
    if at.depth > MAX_DEPTH {
        let err = Error::corrupted("node", "tree deeper than MAX_DEPTH");
        return visitor.damaged(at, err);
    }
    if !visitor.enter(at)? {
        return Ok(());
    }
    let node = match source
        .node(at.child)
        .and_then(|n| check_level(n, parent_level, at.child))
    {
        Ok(n) => n,
        Err(e) => return visitor.damaged(at, e),
    };
    if !visitor.visit(at, &node)? {
        return Ok(());
    }
    if !node.is_leaf() {
        source.children_ahead(&node);
        let n = node.len();
        for i in 0..n {
            let pointer = node.child(i).to_owned();
            let child = At {
                child: &pointer,
                depth: at.depth + 1,
                lo: if i == 0 { at.lo } else { Some(node.key(i)) },
                hi: (i + 1 < n).then(|| node.key(i + 1)).or(at.hi),
            };
            step(source, &child, Some(node.level), visitor)?;
        }
    }
    visitor.leave(at, &node)
}

/// The level guard: a child sits one level below its parent.
fn check_level(node: Arc<Node>, parent_level: Option<u8>, child: &Child) -> Result<Arc<Node>> {
    match parent_level {
        Some(p) if node.level + 1 != p => Err(Error::corrupted(
            "node",
            format!(
                "child at level {} under a parent at level {p} ({:?})",
                node.level,
                child.disk_ref()
            ),
        )),
        _ => Ok(node),
    }
}

/// Test support: a two-level tree whose branch names itself as its second child, by
/// a damaged address that the page cache resolves without reading (so without the
/// parent's checksum). Returns the segments and cache to load it through, and its root.
#[cfg(test)]
pub(crate) fn self_naming_tree() -> (crate::space::Segments, super::cache::PageCache, Child) {
    use super::leaf::LeafBuf;
    use super::node::{BranchEntry, Key, ValueRef};
    use crate::format::{Addr, BlockRef, SegmentId};
    let at = |n: u64| BlockRef {
        addr: Addr::new(SegmentId(1), 64 * n),
        len: 100,
        crc: 0,
    };
    let vfs = Arc::new(crate::io::sim::SimVfs::new());
    let segments = crate::space::Segments::open(vfs, false).expect("segments on a fresh SimVfs");
    let cache = super::cache::PageCache::new(1 << 20);
    let leaf = Node::new_leaf(
        LeafBuf::from_entries([(&b"a"[..], ValueRef::Inline(b"x"))]),
        1,
    );
    cache.insert(at(1).addr, Arc::new(leaf.packed(at(1))));
    let entry = |key: &[u8], n| BranchEntry {
        key: Key::from(key),
        child: Child::Disk(at(n)),
    };
    let branch = Node::new_branch(1, vec![entry(b"a", 1), entry(b"m", 2)], 1);
    cache.insert(at(2).addr, Arc::new(branch.packed(at(2))));
    (segments, cache, Child::Disk(at(2)))
}

#[cfg(test)]
mod tests {
    //! Regression: a damaged branch entry naming a node that is already in the page
    //! cache is resolved from the cache without the parent's checksum being checked.
    //! If that node is the branch itself (or any node at its level or above), a walk
    //! without the level guard loops (the exclusive-bytes walk once did; here the
    //! depth guard would still end it, after 30-odd needless visits).
    use super::*;

    struct Count(usize);

    impl Visitor for Count {
        fn visit(&mut self, _at: &At<'_>, _node: &Arc<Node>) -> Result<bool> {
            self.0 += 1;
            assert!(self.0 < 1000, "the walk is looping");
            Ok(true)
        }
    }

    #[test]
    fn a_child_that_names_its_own_parent_is_refused_not_looped() {
        let (segments, cache, root) = self_naming_tree();
        let mut loader = Loader {
            cache: &cache,
            segments: &segments,
        };
        let mut count = Count(0);
        let err = walk(&mut loader, &root, &mut count).unwrap_err();
        assert!(err.is_corruption(), "{err}");
        assert_eq!(
            count.0, 2,
            "the branch and its leaf are visited, nothing more"
        );
    }
}
