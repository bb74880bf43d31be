//! The difference between two trees, descending only where they differ.
//!
//! Two versions that share history share subtrees: the same written node (same
//! address) or the same in-memory node (same pointer). The diff walks both trees as
//! two key-ordered frontiers of subtrees and entries. When both frontiers start with
//! the same subtree, it holds the same keys on both sides and is skipped whole;
//! otherwise the taller subtree (or both, at equal height) is opened. A subtree facing
//! a single entry is opened only if the entry's key reaches its lower bound (its
//! separator in the parent). So the nodes read are those on the paths to the
//! changes: the cost follows the size of the change, not of the trees.

use super::node::{Child, Key, Value};
use super::Loader;
use crate::error::{Error, Result};
use std::cmp::Ordering;
use std::sync::Arc;

/// One side's frontier element.
enum Item {
    /// A subtree whose keys are all `>= lo` (`None`: unbounded).
    Tree {
        child: Child,
        lo: Option<Key>,
        level: Option<u8>,
    },
    Entry {
        key: Key,
        value: Value,
    },
}

/// A difference: the key, its value in the first tree and in the second.
pub(crate) struct Delta {
    pub key: Key,
    pub old: Option<Value>,
    pub new: Option<Value>,
}

/// A resumable diff: the two frontiers, each a stack with the smallest item on top.
pub(crate) struct TreeDiff {
    a: Vec<Item>,
    b: Vec<Item>,
}

fn same_subtree(x: &Child, y: &Child) -> bool {
    match (x.disk_ref(), y.disk_ref()) {
        (Some(p), Some(q)) => p.addr == q.addr,
        _ => matches!((x, y), (Child::Mem(p), Child::Mem(q)) if Arc::ptr_eq(p, q)),
    }
}

fn root_item(root: Option<&Child>) -> Vec<Item> {
    root.map(|c| Item::Tree {
        child: c.clone(),
        lo: None,
        level: None,
    })
    .into_iter()
    .collect()
}

/// Replaces the subtree on top of `side` by its children (or entries).
fn open(loader: Loader<'_>, side: &mut Vec<Item>) -> Result<()> {
    let Some(Item::Tree { child, level, .. }) = side.pop() else {
        unreachable!("open is called on a subtree")
    };
    let node = loader.resolve(&child)?;
    if level.is_some_and(|l| l != node.level) {
        return Err(Error::corrupted(
            "node",
            "child level does not match its parent",
        ));
    }
    if node.is_leaf() {
        side.extend((0..node.len()).rev().map(|i| Item::Entry {
            key: node.key(i).into(),
            value: node.value(i).to_owned(),
        }));
    } else {
        side.extend((0..node.len()).rev().map(|i| Item::Tree {
            child: node.child(i).to_owned(),
            lo: Some(node.key(i).into()),
            level: Some(node.level - 1),
        }));
    }
    Ok(())
}

fn height(loader: Loader<'_>, item: &Item) -> Result<u8> {
    match item {
        Item::Tree { child, .. } => Ok(loader.resolve(child)?.level),
        Item::Entry { .. } => Ok(0),
    }
}

/// Whether `key` is below every key of the subtree `item`.
fn below(key: &Key, item: &Item) -> bool {
    match item {
        Item::Tree { lo: Some(lo), .. } => **key < **lo,
        _ => false,
    }
}

impl TreeDiff {
    pub(crate) fn new(a: Option<&Child>, b: Option<&Child>) -> TreeDiff {
        TreeDiff {
            a: root_item(a),
            b: root_item(b),
        }
    }

    /// The next difference in key order, or `None` when the trees agree from here on.
    /// Values are compared by content (two extents holding equal bytes are equal).
    pub(crate) fn next(&mut self, loader: Loader<'_>) -> Result<Option<Delta>> {
        loop {
            match (self.a.last(), self.b.last()) {
                (None, None) => return Ok(None),
                (Some(Item::Tree { .. }), None) => open(loader, &mut self.a)?,
                (None, Some(Item::Tree { .. })) => open(loader, &mut self.b)?,
                (Some(Item::Entry { .. }), None) => {
                    let Some(Item::Entry { key, value }) = self.a.pop() else {
                        unreachable!()
                    };
                    return Ok(Some(Delta {
                        key,
                        old: Some(value),
                        new: None,
                    }));
                }
                (None, Some(Item::Entry { .. })) => {
                    let Some(Item::Entry { key, value }) = self.b.pop() else {
                        unreachable!()
                    };
                    return Ok(Some(Delta {
                        key,
                        old: None,
                        new: Some(value),
                    }));
                }
                (
                    Some(x @ Item::Tree { child: cx, .. }),
                    Some(y @ Item::Tree { child: cy, .. }),
                ) => {
                    if same_subtree(cx, cy) {
                        self.a.pop();
                        self.b.pop();
                        continue;
                    }
                    let (hx, hy) = (height(loader, x)?, height(loader, y)?);
                    if hx >= hy {
                        open(loader, &mut self.a)?;
                    }
                    if hy >= hx {
                        open(loader, &mut self.b)?;
                    }
                }
                (Some(Item::Entry { key, .. }), Some(y @ Item::Tree { .. })) => {
                    if below(key, y) {
                        let Some(Item::Entry { key, value }) = self.a.pop() else {
                            unreachable!()
                        };
                        return Ok(Some(Delta {
                            key,
                            old: Some(value),
                            new: None,
                        }));
                    }
                    open(loader, &mut self.b)?;
                }
                (Some(x @ Item::Tree { .. }), Some(Item::Entry { key, .. })) => {
                    if below(key, x) {
                        let Some(Item::Entry { key, value }) = self.b.pop() else {
                            unreachable!()
                        };
                        return Ok(Some(Delta {
                            key,
                            old: None,
                            new: Some(value),
                        }));
                    }
                    open(loader, &mut self.a)?;
                }
                (Some(Item::Entry { key: ka, .. }), Some(Item::Entry { key: kb, .. })) => {
                    match (**ka).cmp(&**kb) {
                        Ordering::Less => {
                            let Some(Item::Entry { key, value }) = self.a.pop() else {
                                unreachable!()
                            };
                            return Ok(Some(Delta {
                                key,
                                old: Some(value),
                                new: None,
                            }));
                        }
                        Ordering::Greater => {
                            let Some(Item::Entry { key, value }) = self.b.pop() else {
                                unreachable!()
                            };
                            return Ok(Some(Delta {
                                key,
                                old: None,
                                new: Some(value),
                            }));
                        }
                        Ordering::Equal => {
                            let (
                                Some(Item::Entry { key, value: va }),
                                Some(Item::Entry { value: vb, .. }),
                            ) = (self.a.pop(), self.b.pop())
                            else {
                                unreachable!()
                            };
                            if !same_value(loader, &va, &vb)? {
                                return Ok(Some(Delta {
                                    key,
                                    old: Some(va),
                                    new: Some(vb),
                                }));
                            }
                        }
                    }
                }
            }
        }
    }
}

fn same_value(loader: Loader<'_>, x: &Value, y: &Value) -> Result<bool> {
    match (x, y) {
        (Value::Inline(p), Value::Inline(q)) => Ok(p == q),
        (Value::Extent(p), Value::Extent(q)) if p.addr == q.addr => Ok(true),
        _ => Ok(loader.value(x.as_ref())? == loader.value(y.as_ref())?),
    }
}
