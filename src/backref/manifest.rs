//! The manifest: the durable description of the back-reference store, embedded by
//! the engine in its checkpoint metadata. Its bytes are untrusted on decode.
//!
//! Layout (little-endian):
//!
//! ```text
//! magic      8 bytes  "cmbBRman"
//! version    u32      MANIFEST_VERSION
//! next_seq   u64      the number the next run file will take
//! run_count  u32      then per run, oldest first:
//!   seq          u64
//!   record_count u64
//!   file_len     u64  the run file's length in bytes
//!   crc          u32  the run file's trailing CRC-32C
//! deleted_count u32   then the deletion vector, strictly increasing:
//!   segment      u32
//! crc        u32      CRC-32C of everything before it
//! ```

// Decodes untrusted bytes: no indexing.
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

use crate::error::{Error, Result};
use crate::format::{crc, put_u32, put_u64, Decoder, SegmentId};

const MAGIC: &[u8; 8] = b"cmbBRman";
/// The manifest layout this build reads and writes.
pub(crate) const MANIFEST_VERSION: u32 = 1;
/// Encoded size of one run's entry.
const RUN_ENTRY_SIZE: usize = 28;

/// What the manifest says about one run file.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct RunMeta {
    pub seq: u64,
    pub record_count: u64,
    pub file_len: u64,
    pub crc: u32,
}

#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub(crate) struct Manifest {
    pub next_seq: u64,
    /// Oldest first, `seq` strictly increasing, each below `next_seq`.
    pub runs: Vec<RunMeta>,
    /// Strictly increasing.
    pub deleted: Vec<SegmentId>,
}

impl Manifest {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(32 + self.runs.len() * RUN_ENTRY_SIZE + self.deleted.len() * 4);
        out.extend_from_slice(MAGIC);
        put_u32(&mut out, MANIFEST_VERSION);
        put_u64(&mut out, self.next_seq);
        put_u32(
            &mut out,
            u32::try_from(self.runs.len()).expect("run count bounded by compaction"),
        );
        for run in &self.runs {
            put_u64(&mut out, run.seq);
            put_u64(&mut out, run.record_count);
            put_u64(&mut out, run.file_len);
            put_u32(&mut out, run.crc);
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

fn decode_runs(d: &mut Decoder<'_>, next_seq: u64) -> Result<Vec<RunMeta>> {
    let count = d.u32()? as usize;
    if count.saturating_mul(RUN_ENTRY_SIZE) > d.remaining() {
        return Err(d.error(format!("{count} runs do not fit")));
    }
    let mut runs: Vec<RunMeta> = Vec::with_capacity(count);
    for _ in 0..count {
        let run = RunMeta {
            seq: d.u64()?,
            record_count: d.u64()?,
            file_len: d.u64()?,
            crc: d.u32()?,
        };
        let after_previous = runs.last().is_none_or(|prev| prev.seq < run.seq);
        if !after_previous || run.seq >= next_seq {
            return Err(d.error(format!("run {} out of order (next {next_seq})", run.seq)));
        }
        runs.push(run);
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
