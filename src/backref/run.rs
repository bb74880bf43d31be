//! Runs: the immutable sorted record files of the back-reference store.
//!
//! Every checkpoint writes its write store as one level-0 run; a compaction merges
//! all runs into one combined run. A run is written once, fsynced, and never
//! modified; it is read back whole at open and held decoded (a sorted `Vec`).
//!
//! The encoding, appended to the segments as one or more blobs (`store.rs`),
//! little-endian:
//!
//! ```text
//! magic        8 bytes  "cmbBRrun"
//! version      u32      RUN_VERSION (2)
//! flags        u32      bit 0: combined (written by a compaction); others zero
//! seq          u64      this run's number (matches the file name and manifest)
//! gen          u64      the checkpoint generation that wrote it
//! record_count u64
//! records      record_count records, strictly increasing by (child, parent),
//!              each coded against the record before it (the first against
//!              child 0, parent 0, len 0):
//!   tag        u8       bits 0-1 kind (1 From, 2 To, 3 Gone);
//!                       bit 2 same child as the previous record (no child field);
//!                       bit 3 a From whose len equals the previous record's (no len);
//!                       bit 4 a gen field follows; bits 5-7 zero
//!   child      varint   child - previous child (> 0), unless bit 2
//!   parent     varint   parent - previous parent (> 0) under bit 2, else the
//!                       zigzag of the wrapping difference
//!   len        varint   a From's length, unless bit 3
//!   gen        varint   zigzag of (run gen - record gen) under bit 4; otherwise
//!                       the record's gen is the run's
//! crc          u32      CRC-32C of everything before it
//! ```
//!
//! Varints are LEB128 (7 bits a byte, low first, at most 10 bytes). Sorted records
//! make most differences small: a record takes 2 to 9 bytes where version 1 (format
//! version 3, no longer read) took 32. The Bloom filter is derived data, rebuilt from
//! the records at load.

// Decodes untrusted bytes: no indexing.
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

use super::bloom::Bloom;
use super::manifest::RunMeta;
use super::record::{Kind, Record, GONE_CHILD};
use crate::error::{Error, Result};
use crate::format::{crc, put_u32, put_u64, put_u8, Addr, Decoder};
use std::ops::RangeInclusive;

const MAGIC: &[u8; 8] = b"cmbBRrun";
/// The run layout this build writes.
pub(crate) const RUN_VERSION: u32 = 2;
pub(crate) const HEADER_SIZE: usize = 40;
const FLAG_COMBINED: u32 = 1;

/// Tag bits of a version-2 record (bits 0-1 are the kind).
const TAG_KIND: u8 = 0b11;
const TAG_SAME_CHILD: u8 = 1 << 2;
const TAG_SAME_LEN: u8 = 1 << 3;
const TAG_OWN_GEN: u8 = 1 << 4;

pub(crate) fn file_name(seq: u64) -> String {
    format!("backref-{seq:016x}.run")
}

pub(crate) fn parse_file_name(name: &str) -> Option<u64> {
    let hex = name.strip_prefix("backref-")?.strip_suffix(".run")?;
    if hex.len() != 16 {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// One run, decoded.
#[derive(Debug)]
pub(crate) struct Run {
    pub meta: RunMeta,
    #[expect(
        dead_code,
        reason = "decoded from the header, for inspection; queries do not need it"
    )]
    pub gen: u64,
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "decoded from the header; the tests read it")
    )]
    pub combined: bool,
    /// Strictly increasing by key; never empty.
    records: Vec<Record>,
    /// The child of every [`INDEX_STRIDE`]-th record: a small, cache-resident first
    /// level for the binary search, so that a lookup in a long run touches a few
    /// cache lines of `records` instead of one per halving.
    index: Vec<u64>,
    bloom: Bloom,
}

/// Records per entry of a run's in-memory index.
const INDEX_STRIDE: usize = 64;

fn build_index(records: &[Record]) -> Vec<u64> {
    records
        .iter()
        .step_by(INDEX_STRIDE)
        .map(|r| r.child.0)
        .collect()
}

/// The number of leading records of `records` whose child is at most `hi`, found by
/// galloping from the front: cheap when the answer is near the start, as it is for
/// the small ranges relocation asks about.
fn gallop_le(records: &[Record], hi: u64) -> usize {
    let mut bound = 1;
    while records.get(bound).is_some_and(|r| r.child.0 <= hi) {
        bound *= 2;
    }
    let from = bound / 2;
    let to = bound.min(records.len());
    from + records
        .get(from..to)
        .map_or(0, |s| s.partition_point(|r| r.child.0 <= hi))
}

impl Run {
    /// Builds run `seq` from `records` (sorted by key, unique, not empty) and encodes
    /// its file.
    pub(crate) fn build(
        seq: u64,
        gen: u64,
        combined: bool,
        records: Vec<Record>,
    ) -> (Run, Vec<u8>) {
        assert!(!records.is_empty(), "a run holds at least one record");
        debug_assert!(
            records
                .windows(2)
                .all(|w| matches!(w, [a, b] if a.key() < b.key())),
            "run records are sorted and unique"
        );
        let bloom = Bloom::build(records.len(), records.iter().map(|r| r.child.0));
        let mut out = Vec::with_capacity(HEADER_SIZE + records.len() * 8 + 4);
        out.extend_from_slice(MAGIC);
        put_u32(&mut out, RUN_VERSION);
        put_u32(&mut out, if combined { FLAG_COMBINED } else { 0 });
        put_u64(&mut out, seq);
        put_u64(&mut out, gen);
        put_u64(&mut out, records.len() as u64);
        let mut prev = START;
        for r in &records {
            encode_record(r, &prev, gen, &mut out);
            prev = *r;
        }
        let sum = crc(&out);
        put_u32(&mut out, sum);
        let meta = RunMeta {
            seq,
            record_count: records.len() as u64,
            file_len: out.len() as u64,
            crc: sum,
        };
        let run = Run {
            meta,
            gen,
            combined,
            index: build_index(&records),
            records,
            bloom,
        };
        (run, out)
    }

    /// Decodes the file `bytes` of the run the manifest describes as `meta`.
    pub(crate) fn decode(bytes: &[u8], meta: &RunMeta) -> Result<Run> {
        let what = "backref run";
        let name = file_name(meta.seq);
        let err = |detail: String| Error::corrupted(what, format!("{name}: {detail}"));
        if bytes.len() as u64 != meta.file_len {
            return Err(err(format!(
                "{} bytes, manifest says {}",
                bytes.len(),
                meta.file_len
            )));
        }
        let Some(body_len) = bytes.len().checked_sub(4) else {
            return Err(err("too short".into()));
        };
        let (body, trailer) = bytes.split_at(body_len);
        let stored = Decoder::new(trailer, what).u32()?;
        let sum = crc(body);
        if sum != stored || sum != meta.crc {
            return Err(err("checksum mismatch".into()));
        }
        decode_body(body, meta).map_err(|e| match e {
            Error::Corrupted { detail, .. } => err(detail),
            e => e,
        })
    }

    pub(crate) fn records(&self) -> &[Record] {
        &self.records
    }

    /// The records whose child is in `children` (empty when the fences exclude it).
    pub(crate) fn range(&self, children: &RangeInclusive<u64>) -> &[Record] {
        let (lo, hi) = (*children.start(), *children.end());
        let outside = match (self.records.first(), self.records.last()) {
            (Some(min), Some(max)) => hi < min.child.0 || lo > max.child.0,
            _ => true,
        };
        if outside {
            return &[];
        }
        let start = self.lower_bound(lo);
        let tail = self.records.get(start..).unwrap_or(&[]);
        tail.get(..gallop_le(tail, hi)).unwrap_or(&[])
    }

    /// The index of the first record whose child is at least `lo`.
    fn lower_bound(&self, lo: u64) -> usize {
        // Blocks `0..k` start below `lo`, so the answer lies after the first record of
        // block `k - 1` and at or before the first record of block `k`.
        let k = self.index.partition_point(|&c| c < lo);
        let Some(prev) = k.checked_sub(1) else {
            return 0;
        };
        let from = prev * INDEX_STRIDE + 1;
        let to = (k * INDEX_STRIDE).min(self.records.len());
        from + self
            .records
            .get(from..to)
            .map_or(0, |s| s.partition_point(|r| r.child.0 < lo))
    }

    /// The `Gone` records, in parent order.
    fn gone_records(&self) -> &[Record] {
        self.range(&(GONE_CHILD.0..=GONE_CHILD.0))
    }

    /// Whether this run records that `parent` was freed.
    pub(crate) fn gone(&self, parent: Addr) -> bool {
        self.gone_records()
            .binary_search_by_key(&parent, |r| r.parent)
            .is_ok()
    }

    /// Every parent this run records as freed.
    pub(crate) fn gone_parents(&self) -> impl Iterator<Item = Addr> + '_ {
        self.gone_records().iter().map(|r| r.parent)
    }

    /// The records whose child is `child`, skipping the search when the Bloom filter
    /// rules it out.
    pub(crate) fn point(&self, child: Addr) -> &[Record] {
        if !self.bloom.may_contain(child.0) {
            return &[];
        }
        self.range(&(child.0..=child.0))
    }
}

/// What the first record of a run is coded against.
const START: Record = Record {
    child: Addr(0),
    parent: Addr(0),
    gen: 0,
    len: 0,
    kind: Kind::From,
};

/// Appends `r`, coded against `prev` (the record before it, or [`START`]) in a run of
/// generation `run_gen`.
fn encode_record(r: &Record, prev: &Record, run_gen: u64, out: &mut Vec<u8>) {
    let same_child = r.child == prev.child;
    let same_len = r.kind == Kind::From && r.len == prev.len;
    let own_gen = r.gen != run_gen;
    let tag = r.kind.code()
        | if same_child { TAG_SAME_CHILD } else { 0 }
        | if same_len { TAG_SAME_LEN } else { 0 }
        | if own_gen { TAG_OWN_GEN } else { 0 };
    put_u8(out, tag);
    if same_child {
        put_varint(out, r.parent.0.wrapping_sub(prev.parent.0));
    } else {
        put_varint(out, r.child.0.wrapping_sub(prev.child.0));
        put_varint(out, zigzag(r.parent.0.wrapping_sub(prev.parent.0)));
    }
    if r.kind == Kind::From && !same_len {
        put_varint(out, u64::from(r.len));
    }
    if own_gen {
        put_varint(out, zigzag(run_gen.wrapping_sub(r.gen)));
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn varint(d: &mut Decoder<'_>) -> Result<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = d.u8()?;
        let bits = u64::from(byte & 0x7f);
        if shift == 63 && bits > 1 {
            return Err(d.error("varint overflows 64 bits"));
        }
        v |= bits << shift;
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(d.error("varint longer than 10 bytes"))
}

/// A wrapping difference as a small unsigned number: 0, -1, 1, -2, ... map to
/// 0, 1, 2, 3, ...
fn zigzag(diff: u64) -> u64 {
    let signed = diff as i64;
    ((signed << 1) ^ (signed >> 63)) as u64
}

fn unzigzag(v: u64) -> u64 {
    (v >> 1) ^ (v & 1).wrapping_neg()
}

fn decode_body(body: &[u8], meta: &RunMeta) -> Result<Run> {
    let mut d = Decoder::new(body, "backref run");
    if d.bytes(MAGIC.len())? != MAGIC {
        return Err(d.error("bad magic"));
    }
    let version = d.u32()?;
    if version != RUN_VERSION {
        return Err(Error::FormatVersion {
            found: version,
            supported: RUN_VERSION,
        });
    }
    let flags = d.u32()?;
    if flags & !FLAG_COMBINED != 0 {
        return Err(d.error(format!("unknown flags {flags:#x}")));
    }
    let seq = d.u64()?;
    let gen = d.u64()?;
    let count = d.u64()?;
    if seq != meta.seq || count != meta.record_count {
        return Err(d.error(format!("header says run {seq} of {count} records")));
    }
    // Every record takes at least two bytes (a tag and a parent): a count the bytes
    // cannot hold is refused before anything is allocated for it.
    let count = usize::try_from(count).unwrap_or(usize::MAX);
    if count == 0 || count.saturating_mul(2) > d.remaining() {
        return Err(d.error(format!("{count} records do not fit")));
    }
    let mut records: Vec<Record> = Vec::with_capacity(count);
    let mut prev = START;
    for _ in 0..count {
        let r = decode_record(&mut d, &prev, gen)?;
        if records.last().is_some_and(|prev| prev.key() >= r.key()) {
            return Err(d.error(format!("record {:?} out of order", r.key())));
        }
        check_record(&d, &r)?;
        records.push(r);
        prev = r;
    }
    if d.remaining() != 0 {
        return Err(d.error(format!("{} trailing bytes", d.remaining())));
    }
    Ok(Run {
        meta: *meta,
        gen,
        combined: flags & FLAG_COMBINED != 0,
        bloom: Bloom::build(records.len(), records.iter().map(|r| r.child.0)),
        index: build_index(&records),
        records,
    })
}

/// Decodes one record coded against `prev` in a run of generation
/// `run_gen`.
fn decode_record(d: &mut Decoder<'_>, prev: &Record, run_gen: u64) -> Result<Record> {
    let tag = d.u8()?;
    let kind =
        Kind::from_code(tag & TAG_KIND).ok_or_else(|| d.error(format!("record tag {tag:#04x}")))?;
    let unknown = tag & !(TAG_KIND | TAG_SAME_CHILD | TAG_SAME_LEN | TAG_OWN_GEN) != 0;
    if unknown || (tag & TAG_SAME_LEN != 0 && kind != Kind::From) {
        return Err(d.error(format!("record tag {tag:#04x}")));
    }
    let (child, parent) = if tag & TAG_SAME_CHILD != 0 {
        (prev.child, prev.parent.0.wrapping_add(varint(d)?))
    } else {
        let child = prev.child.0.wrapping_add(varint(d)?);
        (
            Addr(child),
            prev.parent.0.wrapping_add(unzigzag(varint(d)?)),
        )
    };
    let len = match kind {
        Kind::From if tag & TAG_SAME_LEN != 0 => prev.len,
        Kind::From => u32::try_from(varint(d)?).map_err(|_| d.error("record length"))?,
        Kind::To | Kind::Gone => 0,
    };
    let gen = if tag & TAG_OWN_GEN != 0 {
        run_gen.wrapping_sub(unzigzag(varint(d)?))
    } else {
        run_gen
    };
    Ok(Record {
        child,
        parent: Addr(parent),
        gen,
        len,
        kind,
    })
}

/// The rules every decoded record keeps, whatever its encoding: a `To` has no
/// length, and exactly the `Gone` records have the child `GONE_CHILD` (and no
/// length).
fn check_record(d: &Decoder<'_>, r: &Record) -> Result<()> {
    let gone_ok = if r.kind == Kind::Gone {
        r.child == GONE_CHILD && r.len == 0
    } else {
        r.child != GONE_CHILD
    };
    if (r.kind == Kind::To && r.len != 0) || !gone_ok {
        return Err(d.error("malformed record"));
    }
    Ok(())
}
