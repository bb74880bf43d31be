//! Reader views: immutable sets of published roots, and the registry of the LSNs of
//! live ones.
//!
//! Invariant: a segment is deleted only when no registered view older than the
//! checkpoint that emptied it exists (`checkpoint::delete_unreachable_segments`), so a
//! view can always read every node its roots reach.

use crate::btree::node::Child;
use crate::catalog::{Catalog, VersionId, VersionKind};
use crate::format::Lsn;
use crate::sync::lock;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// One version as a view sees it.
#[derive(Clone)]
pub(crate) struct ViewVersion {
    pub id: VersionId,
    pub name: Arc<str>,
    pub kind: VersionKind,
    pub root: Option<Child>,
}

/// An immutable set of committed roots. Registered by LSN while alive, so that
/// segments it can reach are not deleted under it.
pub(crate) struct View {
    pub lsn: Lsn,
    pub versions: Vec<ViewVersion>,
    registry: Arc<ViewRegistry>,
}

impl View {
    pub(crate) fn new(lsn: Lsn, catalog: &Catalog, registry: Arc<ViewRegistry>) -> View {
        registry.register(lsn);
        let versions = catalog
            .versions
            .iter()
            .map(|v| ViewVersion {
                id: v.id,
                name: v.name.clone(),
                kind: v.kind,
                root: v.root.clone(),
            })
            .collect();
        View {
            lsn,
            versions,
            registry,
        }
    }

    /// A view of no version: it only keeps what the state at `lsn` reaches from
    /// being deleted while it lives (for a walk of roots the caller copied itself).
    pub(crate) fn holding(lsn: Lsn, registry: Arc<ViewRegistry>) -> View {
        registry.register(lsn);
        View {
            lsn,
            versions: Vec::new(),
            registry,
        }
    }

    /// The root of the version called `name`, if the view has one by that name.
    pub(crate) fn root(&self, name: &str) -> Option<&Option<Child>> {
        self.version(name).map(|v| &v.root)
    }

    /// The version called `name`, if the view has one by that name.
    pub(crate) fn version(&self, name: &str) -> Option<&ViewVersion> {
        self.versions.iter().find(|v| &*v.name == name)
    }
}

impl Drop for View {
    fn drop(&mut self) {
        self.registry.unregister(self.lsn);
    }
}

/// The LSNs of live reader views, so that space they can reach is not deleted.
#[derive(Default)]
pub(crate) struct ViewRegistry {
    active: Mutex<BTreeMap<Lsn, usize>>,
}

impl ViewRegistry {
    fn register(&self, lsn: Lsn) {
        *lock(&self.active).entry(lsn).or_default() += 1;
    }

    fn unregister(&self, lsn: Lsn) {
        let mut active = lock(&self.active);
        if let Some(n) = active.get_mut(&lsn) {
            *n -= 1;
            if *n == 0 {
                active.remove(&lsn);
            }
        }
    }

    /// The LSN of the oldest live view.
    pub(crate) fn oldest(&self) -> Option<Lsn> {
        lock(&self.active).keys().next().copied()
    }
}
