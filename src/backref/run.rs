//! Runs: the immutable sorted record files of the back-reference store.
//!
//! Every checkpoint writes its write store as one level-0 run; a compaction merges
//! all runs into one combined run. A run is written once, fsynced, and never
//! modified; it is read back whole at open and held decoded (a sorted `Vec`).
//!
//! File `backref-<seq as 16 hex digits>.run`, little-endian:
//!
//! ```text
//! magic        8 bytes  "cmbBRrun"
//! version      u32      RUN_VERSION
//! flags        u32      bit 0: combined (written by a compaction); others zero
//! seq          u64      this run's number (matches the file name and manifest)
//! gen          u64      the checkpoint generation that wrote it
//! record_count u64
//! records      record_count x 32 bytes, strictly increasing by (child, parent):
//!   child u64, parent u64, gen u64, len u32, kind u8 (1 From, 2 To, 3 Gone), 3 zero bytes
//! bloom        hashes u32, word_count u32 (a power of two), word_count x u64
//! crc          u32      CRC-32C of everything before it
//! ```

// Decodes untrusted bytes: no indexing.
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

use super::bloom::Bloom;
use super::manifest::RunMeta;
use super::record::{Kind, Record, GONE_CHILD};
use crate::error::{Error, Result};
use crate::format::{crc, put_u32, put_u64, put_u8, Addr, Decoder};
use std::ops::RangeInclusive;

const MAGIC: &[u8; 8] = b"cmbBRrun";
/// The run layout this build reads and writes.
pub(crate) const RUN_VERSION: u32 = 1;
pub(crate) const HEADER_SIZE: usize = 40;
pub(crate) const RECORD_SIZE: usize = 32;
const FLAG_COMBINED: u32 = 1;

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
        let mut out =
            Vec::with_capacity(HEADER_SIZE + records.len() * RECORD_SIZE + bloom.encoded_len() + 4);
        out.extend_from_slice(MAGIC);
        put_u32(&mut out, RUN_VERSION);
        put_u32(&mut out, if combined { FLAG_COMBINED } else { 0 });
        put_u64(&mut out, seq);
        put_u64(&mut out, gen);
        put_u64(&mut out, records.len() as u64);
        for r in &records {
            encode_record(r, &mut out);
        }
        bloom.encode(&mut out);
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

    /// The records whose child is `child`, skipping the search when the Bloom filter
    /// rules it out.
    /// Whether this run records that `parent` was freed.
    pub(crate) fn gone(&self, parent: Addr) -> bool {
        self.range(&(GONE_CHILD.0..=GONE_CHILD.0))
            .binary_search_by_key(&parent, |r| r.parent)
            .is_ok()
    }

    pub(crate) fn point(&self, child: Addr) -> &[Record] {
        if !self.bloom.may_contain(child.0) {
            return &[];
        }
        self.range(&(child.0..=child.0))
    }

    #[cfg(test)]
    pub(crate) fn bloom(&self) -> &Bloom {
        &self.bloom
    }
}

fn encode_record(r: &Record, out: &mut Vec<u8>) {
    put_u64(out, r.child.0);
    put_u64(out, r.parent.0);
    put_u64(out, r.gen);
    put_u32(out, r.len);
    put_u8(out, r.kind.code());
    out.extend_from_slice(&[0; 3]);
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
    let count = usize::try_from(count).unwrap_or(usize::MAX);
    if count == 0 || count.saturating_mul(RECORD_SIZE) > d.remaining() {
        return Err(d.error(format!("{count} records do not fit")));
    }
    let mut records: Vec<Record> = Vec::with_capacity(count);
    for _ in 0..count {
        let r = decode_record(&mut d)?;
        if records.last().is_some_and(|prev| prev.key() >= r.key()) {
            return Err(d.error(format!("record {:?} out of order", r.key())));
        }
        records.push(r);
    }
    let bloom = Bloom::decode(&mut d)?;
    if d.remaining() != 0 {
        return Err(d.error(format!("{} trailing bytes", d.remaining())));
    }
    Ok(Run {
        meta: *meta,
        gen,
        combined: flags & FLAG_COMBINED != 0,
        index: build_index(&records),
        records,
        bloom,
    })
}

fn decode_record(d: &mut Decoder<'_>) -> Result<Record> {
    let child = Addr(d.u64()?);
    let parent = Addr(d.u64()?);
    let gen = d.u64()?;
    let len = d.u32()?;
    let code = d.u8()?;
    let pad = d.bytes(3)?;
    let kind = Kind::from_code(code).ok_or_else(|| d.error(format!("record kind {code}")))?;
    let gone_ok = if kind == Kind::Gone {
        child == GONE_CHILD && len == 0
    } else {
        child != GONE_CHILD
    };
    if pad != [0; 3] || (kind == Kind::To && len != 0) || !gone_ok {
        return Err(d.error("malformed record"));
    }
    Ok(Record {
        child,
        parent,
        gen,
        len,
        kind,
    })
}
