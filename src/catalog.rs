//! The catalog of named versions, and the encoding of one catalog entry.
//!
//! A version is a named root: a branch (writable) or a snapshot (read-only), with a
//! link to the version it was made from. A store starts with one branch, `main`.
//!
//! The metadata that a checkpoint writes around the catalog (usage, reference counts,
//! drop queue) is in `meta`; this module owns the catalog entry's encoding, which the
//! metadata blobs embed (see docs/FORMAT.md, "Metadata").

// A decoder of untrusted bytes: every index is justified where it is.
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

use crate::btree::node::Child;
use crate::error::{Error, Result};
use crate::format::{len_u16, put_u16, put_u32, put_u64, put_u8, BlockRef, Decoder, Lsn};
use serde::Serialize;
use std::sync::Arc;

/// The name of the branch every store starts with.
pub const MAIN_BRANCH: &str = "main";

const NO_PARENT: u32 = u32::MAX;

/// Identifies a version inside one store; never reused.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub(crate) struct VersionId(pub u32);

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

/// The longest version name, in bytes.
pub const MAX_VERSION_NAME_LEN: usize = 255;

/// Checks a new version's name: 1 to 255 bytes of ASCII letters, digits, `.`, `_`, `-`
/// and `/`, not starting with `-` (never mistaken for a flag), in `/`-separated
/// components that are neither empty nor start with `.` (never read as a path like
/// `a/../b`; Git's ref-name rules).
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
    // Like Git's ref names: '/' separates components, so a name never reads as a
    // path that leaves its place (`a/../b`), names the same thing twice (`a//b`,
    // `a/./b`) or has an empty part (`/a`, `a/`).
    for component in name.split('/') {
        if component.is_empty() {
            return bad("has an empty component (a leading, trailing or doubled '/')");
        }
        if component.starts_with('.') {
            return bad("has a component starting with '.' (such as '.' or '..')");
        }
    }
    Ok(())
}

fn kind_code(kind: VersionKind) -> u8 {
    match kind {
        VersionKind::Branch => 1,
        VersionKind::Snapshot => 2,
    }
}

/// One version: a name and the root of its tree (`None` for an empty tree).
#[derive(Clone, Debug)]
pub(crate) struct Version {
    pub id: VersionId,
    /// Shared, so that publishing a view of a thousand versions copies no strings.
    pub name: Arc<str>,
    pub kind: VersionKind,
    pub parent: Option<VersionId>,
    pub created_unix_ms: u64,
    pub created_lsn: Lsn,
    /// The durable checkpoint generation when the version was made.
    pub created_checkpoint: u64,
    pub root: Option<Child>,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Catalog {
    pub versions: Vec<Version>,
    pub next_id: u32,
}

impl Catalog {
    /// A new store's catalog: an empty `main`.
    pub(crate) fn initial() -> Catalog {
        let main = Version {
            id: VersionId(0),
            name: MAIN_BRANCH.into(),
            kind: VersionKind::Branch,
            parent: None,
            created_unix_ms: crate::format::now_unix_ms(),
            created_lsn: Lsn(0),
            created_checkpoint: 0,
            root: None,
        };
        Catalog {
            versions: vec![main],
            next_id: 1,
        }
    }

    pub(crate) fn by_name(&self, name: &str) -> Option<&Version> {
        self.versions.iter().find(|v| &*v.name == name)
    }

    pub(crate) fn by_name_mut(&mut self, name: &str) -> Option<&mut Version> {
        self.versions.iter_mut().find(|v| &*v.name == name)
    }

    pub(crate) fn by_id_mut(&mut self, id: VersionId) -> Option<&mut Version> {
        self.versions.iter_mut().find(|v| v.id == id)
    }
}

/// Appends one catalog entry (docs/FORMAT.md, "Metadata"). The root must be written.
pub(crate) fn encode_version(v: &Version, b: &mut Vec<u8>) {
    put_u32(b, v.id.0);
    put_u8(b, kind_code(v.kind));
    put_u32(b, v.parent.map_or(NO_PARENT, |p| p.0));
    put_u64(b, v.created_unix_ms);
    put_u64(b, v.created_lsn.0);
    put_u64(b, v.created_checkpoint);
    put_u16(b, len_u16(v.name.len()));
    b.extend_from_slice(v.name.as_bytes());
    match &v.root {
        None => put_u8(b, 0),
        Some(child) => {
            put_u8(b, 1);
            child
                .disk_ref()
                .expect("checkpoint writes every root before the catalog")
                .encode(b);
        }
    }
}

/// Reads one catalog entry written by [`encode_version`]; the root comes back by address.
pub(crate) fn decode_version(d: &mut Decoder<'_>) -> Result<Version> {
    let id = VersionId(d.u32()?);
    let kind = match d.u8()? {
        1 => VersionKind::Branch,
        2 => VersionKind::Snapshot,
        k => return Err(d.error(format!("unknown version kind {k}"))),
    };
    let parent = match d.u32()? {
        NO_PARENT => None,
        p => Some(VersionId(p)),
    };
    let created_unix_ms = d.u64()?;
    let created_lsn = Lsn(d.u64()?);
    let created_checkpoint = d.u64()?;
    let name_len = usize::from(d.u16()?);
    let name = String::from_utf8(d.bytes(name_len)?.to_vec())
        .map_err(|_| d.error("version name is not UTF-8"))?;
    let root = match d.u8()? {
        0 => None,
        1 => Some(Child::Disk(BlockRef::decode(d)?)),
        t => return Err(d.error(format!("bad root tag {t}"))),
    };
    Ok(Version {
        id,
        name: name.into(),
        kind,
        parent,
        created_unix_ms,
        created_lsn,
        created_checkpoint,
        root,
    })
}

impl PartialEq for Version {
    fn eq(&self, other: &Version) -> bool {
        same_entry(self, other)
    }
}

/// Whether two catalog entries would encode the same (roots compared by address).
pub(crate) fn same_entry(a: &Version, b: &Version) -> bool {
    a.id == b.id
        && a.name == b.name
        && a.kind == b.kind
        && a.parent == b.parent
        && a.created_unix_ms == b.created_unix_ms
        && a.created_lsn == b.created_lsn
        && a.created_checkpoint == b.created_checkpoint
        && a.root.as_ref().map(Child::disk_ref) == b.root.as_ref().map(Child::disk_ref)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn names() {
        for ok in [
            "main", "snap-1", "v1.2", "ci/run_7", "A", "a/b/c", "a-/b.", "x..y",
        ] {
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
            "/",
            "/a",
            "a/",
            "a//b",
            "a/./b",
            "a/../c",
            "a/.hidden",
            "a/..",
            long.as_str(),
        ] {
            assert!(
                matches!(check_version_name(bad), Err(Error::InvalidVersionName(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn entry_round_trip() {
        let mut v = Catalog::initial().versions.remove(0);
        v.root = Some(Child::Disk(BlockRef {
            addr: crate::format::Addr::new(crate::format::SegmentId(1), 32),
            len: 10,
            crc: 3,
        }));
        let mut buf = Vec::new();
        encode_version(&v, &mut buf);
        let back = decode_version(&mut Decoder::new(&buf, "test")).unwrap();
        assert!(same_entry(&v, &back));
        for cut in 0..buf.len() {
            assert!(decode_version(&mut Decoder::new(&buf[..cut], "test")).is_err());
        }
    }
}
