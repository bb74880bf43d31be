//! Metadata blobs on disk: a fixed 48-byte header, then a base's whole metadata or a
//! delta's changes (little-endian; docs/FORMAT.md, "Metadata", has the same tables).
//!
//! ```text
//! header    magic u32 "CMET" | kind u8 (1 = base, 2 = delta) | reserved [u8; 3]
//!           | chain_len u32 (deltas since the base, this one included; 0 for a base)
//!           | reserved u32 | base BlockRef | prev BlockRef   (both zero in a base)
//! base      next_version_id u32
//!           | version_count u32, entries   | segment_count u32, (id u32, live u64)...
//!           | refcount_count u32, (addr u64, count u32)...
//!           | drop_queue_len u32, BlockRef... | pending_count u32, (segment u32, generation u64)...
//!           | backref_manifest_len u32, bytes
//! delta     next_version_id u32
//!           | changed_count u32, entries  | removed_count u32, id u32...
//!           | usage_count u32, (id u32, live u64; 0 = gone)...
//!           | refcount_count u32, (addr u64, count u32; <= 1 = gone)...
//!           | present u8 (bit 0 drop queue, bit 1 pending, bit 2 backref manifest),
//!             then each present part as in a base
//! ```

// A decoder of untrusted bytes: every index is justified where it is.
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

use super::{Meta, MetaDelta, PendingSegment};
use crate::catalog::{decode_version, encode_version, Catalog, Version, VersionId};
use crate::error::Result;
use crate::format::{len_u32, put_u32, put_u64, put_u8, Addr, BlockRef, Decoder, SegmentId};
use crate::space::Usage;
use std::collections::BTreeMap;

const MAGIC: u32 = u32::from_le_bytes(*b"CMET");
const KIND_BASE: u8 = 1;
const KIND_DELTA: u8 = 2;

pub(crate) const OFF_MAGIC: usize = 0;
pub(crate) const OFF_KIND: usize = 4;
pub(crate) const OFF_RESERVED: usize = 5;
pub(crate) const OFF_CHAIN_LEN: usize = 8;
pub(crate) const OFF_RESERVED2: usize = 12;
pub(crate) const OFF_BASE: usize = 16;
pub(crate) const OFF_PREV: usize = 32;
/// Bytes of the fixed header.
pub(crate) const HEADER_LEN: usize = 48;
const _: () = assert!(OFF_KIND == OFF_MAGIC + 4 && OFF_RESERVED == OFF_KIND + 1);
const _: () = assert!(OFF_CHAIN_LEN == OFF_RESERVED + 3 && OFF_RESERVED2 == OFF_CHAIN_LEN + 4);
const _: () = assert!(OFF_BASE == OFF_RESERVED2 + 4 && OFF_PREV == OFF_BASE + BlockRef::SIZE);
const _: () = assert!(HEADER_LEN == OFF_PREV + BlockRef::SIZE);

const HAS_DROP_QUEUE: u8 = 1;
const HAS_PENDING: u8 = 2;
const HAS_BACKREF: u8 = 4;

/// Where a delta sits in its chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Link {
    /// Deltas since the base, this one included (1 for the first delta).
    pub chain_len: u32,
    pub base: BlockRef,
    /// The blob written by the previous checkpoint (the base when `chain_len` is 1).
    pub prev: BlockRef,
}

/// A decoded blob.
#[derive(Debug)]
pub(crate) enum Blob {
    Base(Meta),
    Delta(Link, MetaDelta),
}

const ZERO_REF: BlockRef = BlockRef {
    addr: Addr(0),
    len: 0,
    crc: 0,
};

fn header(b: &mut Vec<u8>, kind: u8, chain_len: u32, base: BlockRef, prev: BlockRef) {
    put_u32(b, MAGIC);
    put_u8(b, kind);
    b.extend_from_slice(&[0; 3]);
    put_u32(b, chain_len);
    put_u32(b, 0);
    base.encode(b);
    prev.encode(b);
}

/// A base blob: the whole metadata. Every version root must be written.
pub(crate) fn encode_base(meta: &Meta) -> Vec<u8> {
    let mut b = Vec::new();
    header(&mut b, KIND_BASE, 0, ZERO_REF, ZERO_REF);
    put_u32(&mut b, meta.catalog.next_id);
    put_u32(&mut b, len_u32(meta.catalog.versions.len()));
    for v in &meta.catalog.versions {
        encode_version(v, &mut b);
    }
    put_usage(
        &mut b,
        meta.usage.iter().map(|(s, l)| (*s, *l)),
        meta.usage.len(),
    );
    put_refcounts(
        &mut b,
        meta.refcounts.iter().map(|(a, c)| (*a, *c)),
        meta.refcounts.len(),
    );
    put_drop_queue(&mut b, &meta.drop_queue);
    put_pending(&mut b, &meta.pending_deletes);
    put_manifest(&mut b, &meta.backref_manifest);
    b
}

/// Sets the link of a delta blob made by [`encode_delta`] (the header has a fixed size,
/// so the blob's length is known before its place in the chain is decided).
pub(crate) fn link_delta(blob: &mut Vec<u8>, link: &Link) {
    let mut h = Vec::with_capacity(HEADER_LEN);
    header(&mut h, KIND_DELTA, link.chain_len, link.base, link.prev);
    blob.splice(0..HEADER_LEN, h);
}

/// A delta blob: what one checkpoint changed. Its link is set by [`link_delta`].
pub(crate) fn encode_delta(d: &MetaDelta) -> Vec<u8> {
    let mut b = Vec::new();
    header(&mut b, KIND_DELTA, 0, ZERO_REF, ZERO_REF);
    put_u32(&mut b, d.next_id);
    put_u32(&mut b, len_u32(d.versions.len()));
    for v in &d.versions {
        encode_version(v, &mut b);
    }
    put_u32(&mut b, len_u32(d.removed.len()));
    for id in &d.removed {
        put_u32(&mut b, id.0);
    }
    put_usage(&mut b, d.usage.iter().copied(), d.usage.len());
    put_refcounts(&mut b, d.refcounts.iter().copied(), d.refcounts.len());
    let present = if d.drop_queue.is_some() {
        HAS_DROP_QUEUE
    } else {
        0
    } | if d.pending_deletes.is_some() {
        HAS_PENDING
    } else {
        0
    } | if d.backref_manifest.is_some() {
        HAS_BACKREF
    } else {
        0
    };
    put_u8(&mut b, present);
    if let Some(q) = &d.drop_queue {
        put_drop_queue(&mut b, q);
    }
    if let Some(p) = &d.pending_deletes {
        put_pending(&mut b, p);
    }
    if let Some(m) = &d.backref_manifest {
        put_manifest(&mut b, m);
    }
    b
}

fn put_usage(b: &mut Vec<u8>, it: impl Iterator<Item = (SegmentId, u64)>, n: usize) {
    put_u32(b, len_u32(n));
    for (seg, live) in it {
        put_u32(b, seg.0);
        put_u64(b, live);
    }
}

fn put_refcounts(b: &mut Vec<u8>, it: impl Iterator<Item = (Addr, u32)>, n: usize) {
    put_u32(b, len_u32(n));
    for (addr, count) in it {
        put_u64(b, addr.0);
        put_u32(b, count);
    }
}

fn put_drop_queue(b: &mut Vec<u8>, q: &[BlockRef]) {
    put_u32(b, len_u32(q.len()));
    for r in q {
        r.encode(b);
    }
}

fn put_pending(b: &mut Vec<u8>, p: &[PendingSegment]) {
    put_u32(b, len_u32(p.len()));
    for s in p {
        put_u32(b, s.segment.0);
        put_u64(b, s.generation);
    }
}

fn put_manifest(b: &mut Vec<u8>, m: &[u8]) {
    put_u32(b, len_u32(m.len()));
    b.extend_from_slice(m);
}

/// Decodes a blob of either kind.
pub(crate) fn decode(buf: &[u8]) -> Result<Blob> {
    let mut d = Decoder::new(buf, "metadata");
    if d.u32()? != MAGIC {
        return Err(d.error("bad magic"));
    }
    let kind = d.u8()?;
    let reserved = d.bytes(3)? != [0; 3];
    let chain_len = d.u32()?;
    if reserved || d.u32()? != 0 {
        return Err(d.error("reserved header bytes are not zero"));
    }
    let base = BlockRef::decode(&mut d)?;
    let prev = BlockRef::decode(&mut d)?;
    let blob = match kind {
        KIND_BASE if chain_len == 0 => Blob::Base(decode_base(&mut d, buf.len())?),
        KIND_DELTA if chain_len > 0 => Blob::Delta(
            Link {
                chain_len,
                base,
                prev,
            },
            decode_delta(&mut d, buf.len())?,
        ),
        _ => return Err(d.error(format!("blob kind {kind} with chain length {chain_len}"))),
    };
    if d.remaining() != 0 {
        return Err(d.error("trailing bytes"));
    }
    Ok(blob)
}

/// A count read from the blob, refused when it could not fit in the blob.
fn count(d: &mut Decoder<'_>, blob_len: usize, what: &str) -> Result<usize> {
    let n = d.u32()? as usize;
    if n > blob_len {
        return Err(d.error(format!("{what} count exceeds blob size")));
    }
    Ok(n)
}

fn versions(d: &mut Decoder<'_>, blob_len: usize) -> Result<Vec<Version>> {
    let n = count(d, blob_len, "version")?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(decode_version(d)?);
    }
    Ok(out)
}

fn usage(d: &mut Decoder<'_>, blob_len: usize) -> Result<Vec<(SegmentId, u64)>> {
    let n = count(d, blob_len, "segment")?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push((SegmentId(d.u32()?), d.u64()?));
    }
    Ok(out)
}

fn refcounts(d: &mut Decoder<'_>, blob_len: usize) -> Result<Vec<(Addr, u32)>> {
    let n = count(d, blob_len, "refcount")?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push((Addr(d.u64()?), d.u32()?));
    }
    Ok(out)
}

fn drop_queue(d: &mut Decoder<'_>, blob_len: usize) -> Result<Vec<BlockRef>> {
    let n = count(d, blob_len, "drop queue")?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(BlockRef::decode(d)?);
    }
    Ok(out)
}

fn pending(d: &mut Decoder<'_>, blob_len: usize) -> Result<Vec<PendingSegment>> {
    let n = count(d, blob_len, "pending segment")?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(PendingSegment {
            segment: SegmentId(d.u32()?),
            generation: d.u64()?,
        });
    }
    Ok(out)
}

fn manifest(d: &mut Decoder<'_>, blob_len: usize) -> Result<Vec<u8>> {
    let n = count(d, blob_len, "manifest byte")?;
    Ok(d.bytes(n)?.to_vec())
}

fn decode_base(d: &mut Decoder<'_>, blob_len: usize) -> Result<Meta> {
    let next_id = d.u32()?;
    let versions = versions(d, blob_len)?;
    let mut seen = std::collections::BTreeSet::new();
    if !versions.iter().all(|v| seen.insert(v.id)) {
        return Err(d.error("duplicate version id"));
    }
    let usage: Usage = usage(d, blob_len)?.into_iter().collect();
    let refcounts: BTreeMap<Addr, u32> = refcounts(d, blob_len)?.into_iter().collect();
    Ok(Meta {
        catalog: Catalog { versions, next_id },
        usage,
        refcounts,
        drop_queue: drop_queue(d, blob_len)?,
        pending_deletes: pending(d, blob_len)?,
        backref_manifest: manifest(d, blob_len)?,
    })
}

fn decode_delta(d: &mut Decoder<'_>, blob_len: usize) -> Result<MetaDelta> {
    let next_id = d.u32()?;
    let versions = versions(d, blob_len)?;
    let n = count(d, blob_len, "removed version")?;
    let mut removed = Vec::with_capacity(n);
    for _ in 0..n {
        removed.push(VersionId(d.u32()?));
    }
    let usage = usage(d, blob_len)?;
    let refcounts = refcounts(d, blob_len)?;
    let present = d.u8()?;
    if present & !(HAS_DROP_QUEUE | HAS_PENDING | HAS_BACKREF) != 0 {
        return Err(d.error(format!("unknown parts {present:#x} in a delta")));
    }
    let drop_queue = if present & HAS_DROP_QUEUE != 0 {
        Some(drop_queue(d, blob_len)?)
    } else {
        None
    };
    let pending_deletes = if present & HAS_PENDING != 0 {
        Some(pending(d, blob_len)?)
    } else {
        None
    };
    let backref_manifest = if present & HAS_BACKREF != 0 {
        Some(manifest(d, blob_len)?)
    } else {
        None
    };
    Ok(MetaDelta {
        next_id,
        versions,
        removed,
        usage,
        refcounts,
        drop_queue,
        pending_deletes,
        backref_manifest,
    })
}
