//! The catalog of named versions and the metadata blob each checkpoint writes.
//!
//! A version is a named root: a branch (writable) or a snapshot (read-only), with a
//! link to the version it was made from. A store starts with one branch, `main`.
//!
//! Metadata blob layout (little-endian; see docs/FORMAT.md), referenced (with its
//! checksum) by the superblock:
//! ```text
//! magic u32 "CMET" | next_version_id u32
//! version_count u32, then per version:
//!     id u32 | kind u8 | parent u32 (u32::MAX = none) | created_unix_ms u64 | created_lsn u64
//!     | created_checkpoint u64 | name_len u16 | name | has_root u8
//!     | root BlockRef (when has_root = 1)
//! segment_count u32, then per segment: id u32 | live_bytes u64
//! refcount_count u32, then per shared block: addr u64 | count u32   (only counts > 1)
//! drop_queue_len u32, then per queued node: BlockRef
//! ```

// A decoder of untrusted bytes: every index is justified where it is.
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

use crate::btree::node::Child;
use crate::error::{Error, Result};
use crate::format::{
    len_u16, put_u16, put_u32, put_u64, put_u8, Addr, BlockRef, Decoder, Lsn, SegmentId,
};
use crate::space::Usage;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The name of the branch every store starts with.
pub const MAIN_BRANCH: &str = "main";

const META_MAGIC: u32 = u32::from_le_bytes(*b"CMET");
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

/// Everything a checkpoint records besides the tree nodes.
#[derive(Debug, Clone, Default)]
pub(crate) struct Meta {
    pub catalog: Catalog,
    pub usage: Usage,
    pub refcounts: BTreeMap<Addr, u32>,
    /// Unreferenced nodes of dropped versions not yet freed (see `refcount`).
    pub drop_queue: Vec<BlockRef>,
}

impl Meta {
    /// Serialises the metadata. Every version root must be written (clean).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        put_u32(&mut b, META_MAGIC);
        put_u32(&mut b, self.catalog.next_id);
        put_u32(&mut b, crate::format::len_u32(self.catalog.versions.len()));
        for v in &self.catalog.versions {
            put_u32(&mut b, v.id.0);
            put_u8(&mut b, kind_code(v.kind));
            put_u32(&mut b, v.parent.map_or(NO_PARENT, |p| p.0));
            put_u64(&mut b, v.created_unix_ms);
            put_u64(&mut b, v.created_lsn.0);
            put_u64(&mut b, v.created_checkpoint);
            put_u16(&mut b, len_u16(v.name.len()));
            b.extend_from_slice(v.name.as_bytes());
            match &v.root {
                None => put_u8(&mut b, 0),
                Some(child) => {
                    put_u8(&mut b, 1);
                    child
                        .disk_ref()
                        .expect("checkpoint writes every root before the catalog")
                        .encode(&mut b);
                }
            }
        }
        put_u32(&mut b, crate::format::len_u32(self.usage.len()));
        for (seg, live) in &self.usage {
            put_u32(&mut b, seg.0);
            put_u64(&mut b, *live);
        }
        put_u32(&mut b, crate::format::len_u32(self.refcounts.len()));
        for (addr, count) in &self.refcounts {
            put_u64(&mut b, addr.0);
            put_u32(&mut b, *count);
        }
        put_u32(&mut b, crate::format::len_u32(self.drop_queue.len()));
        for r in &self.drop_queue {
            r.encode(&mut b);
        }
        b
    }

    pub(crate) fn decode(buf: &[u8]) -> Result<Meta> {
        let mut d = Decoder::new(buf, "metadata");
        if d.u32()? != META_MAGIC {
            return Err(d.error("bad magic"));
        }
        let next_id = d.u32()?;
        let count = d.u32()? as usize;
        if count > buf.len() {
            return Err(d.error("version count exceeds blob size"));
        }
        let mut versions = Vec::with_capacity(count);
        for _ in 0..count {
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
                1 => Some(Child::Disk(BlockRef::decode(&mut d)?)),
                t => return Err(d.error(format!("bad root tag {t}"))),
            };
            versions.push(Version {
                id,
                name: name.into(),
                kind,
                parent,
                created_unix_ms,
                created_lsn,
                created_checkpoint,
                root,
            });
        }
        let segs = d.u32()? as usize;
        if segs > buf.len() {
            return Err(d.error("segment count exceeds blob size"));
        }
        let mut usage = Usage::new();
        for _ in 0..segs {
            usage.insert(SegmentId(d.u32()?), d.u64()?);
        }
        let refs = d.u32()? as usize;
        if refs > buf.len() {
            return Err(d.error("refcount count exceeds blob size"));
        }
        let mut refcounts = BTreeMap::new();
        for _ in 0..refs {
            refcounts.insert(Addr(d.u64()?), d.u32()?);
        }
        let queued = d.u32()? as usize;
        if queued > buf.len() {
            return Err(d.error("drop queue length exceeds blob size"));
        }
        let mut drop_queue = Vec::with_capacity(queued);
        for _ in 0..queued {
            drop_queue.push(BlockRef::decode(&mut d)?);
        }
        if d.remaining() != 0 {
            return Err(d.error("trailing bytes"));
        }
        Ok(Meta {
            catalog: Catalog { versions, next_id },
            usage,
            refcounts,
            drop_queue,
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

    #[test]
    fn round_trip() {
        let mut meta = Meta {
            catalog: Catalog::initial(),
            ..Meta::default()
        };
        meta.catalog.versions[0].root = Some(Child::Disk(BlockRef {
            addr: Addr::new(SegmentId(1), 32),
            len: 10,
            crc: 3,
        }));
        meta.usage.insert(SegmentId(1), 10);
        let buf = meta.encode();
        let back = Meta::decode(&buf).unwrap();
        assert_eq!(&*back.catalog.versions[0].name, "main");
        assert_eq!(back.usage, meta.usage);
        for cut in 0..buf.len() {
            assert!(Meta::decode(&buf[..cut]).is_err());
        }
    }
}
