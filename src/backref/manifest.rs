//! The manifest: the durable description of the back-reference store, embedded by
//! the engine in its checkpoint metadata. Its bytes are untrusted on decode.
//!
//! Layout (little-endian):
//!
//! ```text
//! magic      8 bytes  "cmbBRman"
//! version    u32      MANIFEST_VERSION
//! next_seq   u64      the number the next run will take
//! run_count  u32      then per run, oldest first:
//!   seq          u64
//!   record_count u64
//!   file_len     u64  the run's encoded length in bytes (the sum of its blobs')
//!   crc          u32  the run's trailing CRC-32C
//!   blob_count   u32  at least 1, then the blobs holding the run's bytes, in order:
//!     addr u64, len u32, crc u32   (a BlockRef into a data segment)
//! deleted_count u32   then the deletion vector, strictly increasing:
//!   segment      u32
//! crc        u32      CRC-32C of everything before it
//! ```

// Decodes untrusted bytes: no indexing.
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

use crate::error::{Error, Result};
use crate::format::{crc, put_u32, put_u64, BlockRef, Decoder, SegmentId};

const MAGIC: &[u8; 8] = b"cmbBRman";
/// The manifest layout this build reads and writes.
/// Version 2: runs are blobs in the data segments (version 1 named run files).
pub(crate) const MANIFEST_VERSION: u32 = 2;
/// Encoded size of one run's entry without its blobs (but with its blob count).
const RUN_ENTRY_SIZE: usize = 32;

/// What the manifest says about one run's encoding (its `file_len` is the encoded
/// length, which its blobs hold; the name is from when a run was a file).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct RunMeta {
    pub seq: u64,
    pub record_count: u64,
    pub file_len: u64,
    pub crc: u32,
}

/// One run as the manifest names it: what it is, and where its bytes are.
#[derive(Clone, PartialEq, Eq, Debug)]
pub(crate) struct RunEntry {
    pub meta: RunMeta,
    /// The blobs holding the run's encoded bytes, in order: not empty, their lengths
    /// add up to `meta.file_len`.
    pub blobs: Vec<BlockRef>,
}

#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub(crate) struct Manifest {
    pub next_seq: u64,
    /// Oldest first, `seq` strictly increasing, each below `next_seq`.
    pub runs: Vec<RunEntry>,
    /// Strictly increasing.
    pub deleted: Vec<SegmentId>,
}

impl Manifest {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let blobs: usize = self.runs.iter().map(|r| r.blobs.len()).sum();
        let mut out = Vec::with_capacity(
            32 + self.runs.len() * RUN_ENTRY_SIZE + blobs * BlockRef::SIZE + self.deleted.len() * 4,
        );
        out.extend_from_slice(MAGIC);
        put_u32(&mut out, MANIFEST_VERSION);
        put_u64(&mut out, self.next_seq);
        put_u32(
            &mut out,
            u32::try_from(self.runs.len()).expect("run count bounded by compaction"),
        );
        for run in &self.runs {
            put_u64(&mut out, run.meta.seq);
            put_u64(&mut out, run.meta.record_count);
            put_u64(&mut out, run.meta.file_len);
            put_u32(&mut out, run.meta.crc);
            put_u32(
                &mut out,
                u32::try_from(run.blobs.len()).expect("blob count bounded by the run's length"),
            );
            for blob in &run.blobs {
                blob.encode(&mut out);
            }
        }
        put_u32(
            &mut out,
            u32::try_from(self.deleted.len()).expect("segment ids are 24 bits"),
        );
        for seg in &self.deleted {
            put_u32(&mut out, seg.0);
        }
        let sum = crc(&out);
        put_u32(&mut out, sum);
        out
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Manifest> {
        let what = "backref manifest";
        let Some(body_len) = bytes.len().checked_sub(4) else {
            return Err(Error::corrupted(
                what,
                format!("{} bytes is too short", bytes.len()),
            ));
        };
        let (body, trailer) = bytes.split_at(body_len);
        let stored = Decoder::new(trailer, what).u32()?;
        if crc(body) != stored {
            return Err(Error::corrupted(what, "checksum mismatch"));
        }
        let mut d = Decoder::new(body, what);
        if d.bytes(MAGIC.len())? != MAGIC {
            return Err(d.error("bad magic"));
        }
        let version = d.u32()?;
        if version != MANIFEST_VERSION {
            return Err(Error::FormatVersion {
                found: version,
                supported: MANIFEST_VERSION,
            });
        }
        let next_seq = d.u64()?;
        let runs = decode_runs(&mut d, next_seq)?;
        let deleted = decode_deleted(&mut d)?;
        if d.remaining() != 0 {
            return Err(d.error(format!("{} trailing bytes", d.remaining())));
        }
        Ok(Manifest {
            next_seq,
            runs,
            deleted,
        })
    }
}

fn decode_runs(d: &mut Decoder<'_>, next_seq: u64) -> Result<Vec<RunEntry>> {
    let count = d.u32()? as usize;
    if count.saturating_mul(RUN_ENTRY_SIZE) > d.remaining() {
        return Err(d.error(format!("{count} runs do not fit")));
    }
    let mut runs: Vec<RunEntry> = Vec::with_capacity(count);
    for _ in 0..count {
        let meta = RunMeta {
            seq: d.u64()?,
            record_count: d.u64()?,
            file_len: d.u64()?,
            crc: d.u32()?,
        };
        let after_previous = runs.last().is_none_or(|prev| prev.meta.seq < meta.seq);
        if !after_previous || meta.seq >= next_seq {
            return Err(d.error(format!("run {} out of order (next {next_seq})", meta.seq)));
        }
        let blob_count = d.u32()? as usize;
        if blob_count == 0 || blob_count.saturating_mul(BlockRef::SIZE) > d.remaining() {
            return Err(d.error(format!("run {}: {blob_count} blobs", meta.seq)));
        }
        let blobs = (0..blob_count)
            .map(|_| BlockRef::decode(d))
            .collect::<Result<Vec<BlockRef>>>()?;
        let total: u64 = blobs.iter().map(|b| u64::from(b.len)).sum();
        if total != meta.file_len {
            return Err(d.error(format!(
                "run {}: blobs of {total} bytes for a run of {}",
                meta.seq, meta.file_len
            )));
        }
        runs.push(RunEntry { meta, blobs });
    }
    Ok(runs)
}

fn decode_deleted(d: &mut Decoder<'_>) -> Result<Vec<SegmentId>> {
    let count = d.u32()? as usize;
    if count.saturating_mul(4) > d.remaining() {
        return Err(d.error(format!("{count} deleted segments do not fit")));
    }
    let mut deleted: Vec<SegmentId> = Vec::with_capacity(count);
    for _ in 0..count {
        let seg = SegmentId(d.u32()?);
        if deleted.last().is_some_and(|&prev| prev >= seg) {
            return Err(d.error(format!("deleted segment {} out of order", seg.0)));
        }
        deleted.push(seg);
    }
    Ok(deleted)
}
