//! Versions as users see them: snapshots, branches (writable clones), drop, the
//! version list with its space accounting, and diff.
//!
//! A snapshot or a branch copies a root and nothing else (Rodeh §5: the new root
//! points at the source's root node, whose reference count goes up by one). The trees
//! then share every node until a writer shadows one; the sharing is tracked by lazy
//! reference counts (`crate::refcount`).

use crate::error::{Error, Result};
use serde::Serialize;

/// Whether a version can be written.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum VersionKind {
    /// Writable.
    Branch,
    /// Read-only.
    Snapshot,
}

impl std::fmt::Display for VersionKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            VersionKind::Branch => "branch",
            VersionKind::Snapshot => "snapshot",
        })
    }
}

/// One version of the store, as [`crate::Store::versions`] reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct VersionInfo {
    /// A number that identifies the version in this store; never reused.
    pub id: u32,
    /// Its name.
    pub name: String,
    /// Branch or snapshot.
    pub kind: VersionKind,
    /// The id of the version it was made from (`None` for `main`, or when that
    /// version and all its ancestors have been dropped).
    pub parent_id: Option<u32>,
    /// The name of that version.
    pub parent: Option<String>,
    /// When it was made, in milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// The LSN of the operation that made it (0 for `main`).
    pub created_lsn: u64,
    /// The generation of the durable checkpoint when it was made.
    pub created_checkpoint: u64,
    /// Bytes of nodes and values reachable from this version (ZFS's `referenced`).
    pub referenced_bytes: u64,
    /// Bytes reachable only from this version: what dropping it would free (ZFS's
    /// `used` by the dataset itself).
    pub exclusive_bytes: u64,
    /// Keys in the version.
    pub keys: u64,
}

/// One difference between two versions, as [`crate::Store::diff`] yields it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// The key is in the second version only.
    Added {
        /// The key.
        key: Vec<u8>,
        /// Its value in the second version.
        value: Vec<u8>,
    },
    /// The key is in the first version only.
    Removed {
        /// The key.
        key: Vec<u8>,
        /// Its value in the first version.
        old: Vec<u8>,
    },
    /// The key is in both, with different values.
    Changed {
        /// The key.
        key: Vec<u8>,
        /// Its value in the first version.
        old: Vec<u8>,
        /// Its value in the second version.
        new: Vec<u8>,
    },
}

impl Change {
    /// The key this change is about.
    pub fn key(&self) -> &[u8] {
        match self {
            Change::Added { key, .. }
            | Change::Removed { key, .. }
            | Change::Changed { key, .. } => key,
        }
    }
}

/// The longest version name, in bytes.
pub const MAX_VERSION_NAME_LEN: usize = 255;

/// Checks a new version's name: 1 to 255 bytes of ASCII letters, digits, `.`, `_`, `-`
/// and `/`, not starting with `-` or `.` (so it is never mistaken for a flag or a
/// path component like `..`).
pub fn check_version_name(name: &str) -> Result<()> {
    let bad = |why: &str| Err(Error::InvalidVersionName(format!("{name:?}: {why}")));
    if name.is_empty() {
        return bad("empty");
    }
    if name.len() > MAX_VERSION_NAME_LEN {
        return bad("longer than 255 bytes");
    }
    if name.starts_with(['-', '.']) {
        return bad("starts with '-' or '.'");
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/')))
    {
        return bad(&format!(
            "character {c:?} not allowed (use letters, digits, '.', '_', '-', '/')"
        ));
    }
    Ok(())
}

/// The changes between two versions, in key order; see [`crate::Store::diff`].
pub struct Diff {
    inner: std::vec::IntoIter<Change>,
}

impl Iterator for Diff {
    type Item = Result<Change>;
    fn next(&mut self) -> Option<Result<Change>> {
        self.inner.next().map(Ok)
    }
}

impl crate::Store {
    /// Makes a read-only version `name` of `source` (a branch or a snapshot), in
    /// constant time: it copies `source`'s root, never its data. Durable on return.
    pub fn snapshot(&self, source: &str, name: &str) -> Result<VersionInfo> {
        let _ = (source, name);
        Err(Error::InvalidArgument("snapshot: not yet".into()))
    }

    /// Makes a writable clone `name` of `source` (a branch or a snapshot), in constant
    /// time. The two then diverge independently. Durable on return.
    pub fn branch(&self, source: &str, name: &str) -> Result<VersionInfo> {
        let _ = (source, name);
        Err(Error::InvalidArgument("branch: not yet".into()))
    }

    /// Removes the version `name`. The version is gone at once (durable on return);
    /// the space only it referenced is reclaimed by a walk that proceeds in the
    /// background ([`crate::Store::finish_drops`] waits for it). Versions made from
    /// it keep all their data.
    pub fn drop_version(&self, name: &str) -> Result<()> {
        let _ = name;
        Err(Error::InvalidArgument("drop: not yet".into()))
    }

    /// Runs the background reclamation of dropped versions to completion.
    pub fn finish_drops(&self) -> Result<()> {
        Ok(())
    }

    /// Every version, in the order they were made, with its space accounting.
    pub fn versions(&self) -> Result<Vec<VersionInfo>> {
        Err(Error::InvalidArgument("versions: not yet".into()))
    }

    /// The keys added, removed and changed from version `a` to version `b`, in key
    /// order. It descends only where the two trees differ, so its cost follows the
    /// size of the change, not the size of the versions.
    pub fn diff(&self, a: &str, b: &str) -> Result<Diff> {
        let _ = (a, b);
        Ok(Diff {
            inner: Vec::new().into_iter(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["main", "snap-1", "v1.2", "ci/run_7", "A"] {
            assert!(check_version_name(ok).is_ok(), "{ok}");
        }
        let long = "x".repeat(256);
        for bad in [
            "",
            "-x",
            ".hidden",
            "..",
            "a b",
            "tab\t",
            "é",
            long.as_str(),
        ] {
            assert!(
                matches!(check_version_name(bad), Err(Error::InvalidVersionName(_))),
                "{bad:?}"
            );
        }
    }
}
