//! What a WAL record carries: the [`Record`] enum and its payload codecs.
//!
//! The framing (length, checksum, LSN, kind byte) is `record.rs`'s; this file owns the
//! kind byte's meaning and every payload layout (little-endian; see docs/FORMAT.md):
//! ```text
//! kind 1, batch:             branch u32 | op_count u32 | ops
//!     op: tag u8 | key_len u16 | key | (put: value_len u32 | value)
//!                                     | (put-extent: extent BlockRef) | (delete: nothing)
//! kind 2, checkpoint commit: generation u64
//! kind 3, version:           id u32 | op u8 | 3 zero bytes
//!                            | (create: source u32 | snapshot u8 | created_unix_ms u64
//!                                       | created_checkpoint u64 | name_len u16 | name)
//! kind 4, relocation:        blocks u64
//! kind 5, values:            count u32 | 0 u32 | count × (addr u64 | len u32 | bytes[len])
//! ```
//! A values record is not a [`Record`]: it carries no LSN of its own (its header
//! repeats the LSN of the record before it) and changes no version; it holds value
//! bytes a group commit logged in place of syncing their data segment
//! ([`encode_values`]).
//! Decoding validates the whole payload up front, so a record that decodes can be
//! applied without meeting a malformed operation half-way.

// A decoder of untrusted bytes: every index is justified where it is.
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

use crate::error::Result;
use crate::format::{len_u16, len_u32, put_u16, put_u32, put_u64, put_u8, Addr, BlockRef, Decoder};
use crate::limits::MAX_KEY_LEN;
use std::borrow::Cow;

const KIND_BATCH: u8 = 1;
const KIND_CHECKPOINT_COMMIT: u8 = 2;
const KIND_VERSION: u8 = 3;
const KIND_RELOCATION: u8 = 4;
/// The kind byte of a values record ([`encode_values`]).
pub(crate) const KIND_VALUES: u8 = 5;

const OP_PUT_INLINE: u8 = 1;
const OP_PUT_EXTENT: u8 = 2;
const OP_DELETE: u8 = 3;

const VERSION_CREATE: u8 = 1;
const VERSION_DROP: u8 = 2;
/// A create record's source for a new empty branch.
const NO_SOURCE: u32 = u32::MAX;

/// Where a batch payload's op count sits: after the branch id.
const BATCH_COUNT_OFFSET: usize = 4;
/// The batch header: `branch u32 | op_count u32`.
pub(crate) const BATCH_HEADER_SIZE: usize = BATCH_COUNT_OFFSET + 4;

/// One logged record, as appended and as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Record<'a> {
    /// A write transaction's operations on one branch.
    Batch(Batch<'a>),
    /// Marks the LSN of a transaction that committed by a checkpoint of its own (it
    /// has no batch record): `generation` is the superblock that holds it. Recovery
    /// from an older superblock that reaches this record cannot rebuild the
    /// transaction, and says so instead of silently dropping it.
    CheckpointCommit {
        /// The superblock generation whose checkpoint committed the transaction.
        generation: u64,
    },
    /// A catalog change: a version made or dropped.
    Version(VersionOp),
    /// Marks the LSN of a relocation by the cleaner, which the next checkpoint makes
    /// durable. It changes no version's content, so replay skips it: recovered from
    /// a superblock older than that checkpoint, the blocks are simply where they were.
    Relocation {
        /// Blocks the relocation moved (for people reading a log; a payload is never
        /// empty).
        blocks: u64,
    },
}

impl<'a> Record<'a> {
    /// The framing's kind byte.
    pub(crate) fn kind(&self) -> u8 {
        match self {
            Record::Batch(_) => KIND_BATCH,
            Record::CheckpointCommit { .. } => KIND_CHECKPOINT_COMMIT,
            Record::Version(_) => KIND_VERSION,
            Record::Relocation { .. } => KIND_RELOCATION,
        }
    }

    /// The encoded payload (a batch's is borrowed: it is already encoded).
    pub(crate) fn payload(&self) -> Cow<'a, [u8]> {
        match self {
            Record::Batch(b) => Cow::Borrowed(b.payload),
            Record::CheckpointCommit { generation } => {
                Cow::Owned(generation.to_le_bytes().to_vec())
            }
            Record::Version(op) => {
                let mut out = Vec::new();
                op.encode(&mut out);
                Cow::Owned(out)
            }
            Record::Relocation { blocks } => Cow::Owned(blocks.to_le_bytes().to_vec()),
        }
    }

    /// Decodes and validates a record's payload.
    pub(crate) fn decode(kind: u8, payload: &'a [u8]) -> Result<Record<'a>> {
        match kind {
            KIND_BATCH => Batch::decode(payload).map(Record::Batch),
            KIND_CHECKPOINT_COMMIT => lone_u64(payload, "checkpoint-commit")
                .map(|generation| Record::CheckpointCommit { generation }),
            KIND_VERSION => VersionOp::decode(payload).map(Record::Version),
            KIND_RELOCATION => {
                lone_u64(payload, "relocation").map(|blocks| Record::Relocation { blocks })
            }
            k => Err(crate::error::Error::corrupted(
                "wal",
                format!("unknown record kind {k}"),
            )),
        }
    }
}

/// The payload of a values record of `entries` byte lengths.
pub(crate) fn values_payload_len(entries: impl Iterator<Item = usize>) -> usize {
    8 + entries.map(|len| 12 + len).sum::<usize>()
}

/// Encodes a values record's payload: each entry is bytes written at an address of
/// a data segment that no fsync has made durable yet (a group commit logs them so
/// that one fsync of the log covers them; recovery puts back those its records
/// need). Each entry's length fits a `u32` (it is one write of value extents).
pub(crate) fn encode_values(out: &mut Vec<u8>, entries: &[(Addr, Vec<u8>)]) {
    put_u32(out, len_u32(entries.len()));
    put_u32(out, 0);
    for (addr, bytes) in entries {
        put_u64(out, addr.0);
        put_u32(out, len_u32(bytes.len()));
        out.extend_from_slice(bytes);
    }
}

/// Decodes a values record's payload into its entries, validating all of it.
pub(crate) fn decode_values(payload: &[u8]) -> Result<Vec<(Addr, &[u8])>> {
    let mut d = Decoder::new(payload, "wal");
    let count = d.u32()?;
    if d.u32()? != 0 {
        return Err(d.error("values record: reserved field not zero"));
    }
    // Each entry takes at least 12 bytes: a count beyond that is damage, and must
    // not size an allocation.
    let mut entries = Vec::with_capacity((count as usize).min(d.remaining() / 12));
    for _ in 0..count {
        let addr = Addr(d.u64()?);
        let len = d.u32()?;
        entries.push((addr, d.bytes(len as usize)?));
    }
    if d.remaining() != 0 {
        return Err(d.error("trailing bytes in values record"));
    }
    Ok(entries)
}

/// A payload that is one `u64` and nothing else.
fn lone_u64(payload: &[u8], what: &str) -> Result<u64> {
    let mut d = Decoder::new(payload, "wal");
    let n = d.u64()?;
    if d.remaining() != 0 {
        return Err(d.error(format!("trailing bytes in {what} record")));
    }
    Ok(n)
}

/// One operation of a write transaction, borrowing its key and value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op<'a> {
    /// Insert or replace `key` with an inline value.
    Put { key: &'a [u8], value: &'a [u8] },
    /// Insert or replace `key` with a value already written to its own extent.
    PutExtent { key: &'a [u8], extent: BlockRef },
    /// Remove `key`.
    Delete { key: &'a [u8] },
}

impl<'a> Op<'a> {
    fn encode(&self, out: &mut Vec<u8>) {
        let (tag, key) = match *self {
            Op::Put { key, .. } => (OP_PUT_INLINE, key),
            Op::PutExtent { key, .. } => (OP_PUT_EXTENT, key),
            Op::Delete { key } => (OP_DELETE, key),
        };
        put_u8(out, tag);
        put_u16(out, len_u16(key.len()));
        out.extend_from_slice(key);
        match *self {
            Op::Put { value, .. } => {
                put_u32(out, len_u32(value.len()));
                out.extend_from_slice(value);
            }
            Op::PutExtent { extent, .. } => extent.encode(out),
            Op::Delete { .. } => {}
        }
    }

    fn decode(d: &mut Decoder<'a>) -> Result<Op<'a>> {
        let tag = d.u8()?;
        let key_len = usize::from(d.u16()?);
        if key_len == 0 || key_len > MAX_KEY_LEN {
            return Err(d.error(format!("key length {key_len} out of range")));
        }
        let key = d.bytes(key_len)?;
        Ok(match tag {
            OP_PUT_INLINE => {
                let len = d.u32()? as usize;
                Op::Put {
                    key,
                    value: d.bytes(len)?,
                }
            }
            OP_PUT_EXTENT => Op::PutExtent {
                key,
                extent: BlockRef::decode(d)?,
            },
            OP_DELETE => Op::Delete { key },
            _ => return Err(d.error(format!("unknown op tag {tag}"))),
        })
    }
}

/// A batch payload, validated: the branch it writes and its encoded operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Batch<'a> {
    branch: u32,
    count: u32,
    payload: &'a [u8],
}

impl<'a> Batch<'a> {
    fn decode(payload: &'a [u8]) -> Result<Batch<'a>> {
        let batch = Batch::parse_header(payload)?;
        // Validate every op now, so `ops` cannot fail later.
        let mut d = Decoder::new(payload, "wal");
        d.bytes(BATCH_HEADER_SIZE)?;
        for _ in 0..batch.count {
            Op::decode(&mut d)?;
        }
        if d.remaining() != 0 {
            return Err(d.error("trailing bytes after the last op"));
        }
        Ok(batch)
    }

    fn parse_header(payload: &'a [u8]) -> Result<Batch<'a>> {
        let mut d = Decoder::new(payload, "wal");
        let branch = d.u32()?;
        let count = d.u32()?;
        if count as usize > payload.len() {
            return Err(d.error("op count exceeds record size"));
        }
        Ok(Batch {
            branch,
            count,
            payload,
        })
    }

    /// The id of the branch the batch writes.
    pub(crate) fn branch(&self) -> u32 {
        self.branch
    }

    /// The operations, in order. The payload was validated when it was decoded (or
    /// built by a [`BatchWriter`]), so every item is `Ok`; the `Result` keeps a
    /// damaged payload from ever becoming a panic.
    pub(crate) fn ops(&self) -> impl Iterator<Item = Result<Op<'a>>> + 'a {
        let mut d = Decoder::new(self.payload, "wal");
        let header = d.bytes(BATCH_HEADER_SIZE).map(|_| ());
        let mut failed = header.err();
        let mut left = self.count;
        std::iter::from_fn(move || {
            if let Some(e) = failed.take() {
                left = 0;
                return Some(Err(e));
            }
            if left == 0 {
                return None;
            }
            left -= 1;
            Some(Op::decode(&mut d))
        })
    }
}

/// Builds a batch payload one operation at a time, keeping its header (branch and
/// op count) right at every step.
#[derive(Debug)]
pub(crate) struct BatchWriter {
    buf: Vec<u8>,
    branch: u32,
    count: u32,
}

impl BatchWriter {
    pub(crate) fn new(branch: u32) -> BatchWriter {
        let mut buf = Vec::with_capacity(256);
        put_u32(&mut buf, branch);
        put_u32(&mut buf, 0);
        BatchWriter {
            buf,
            branch,
            count: 0,
        }
    }

    pub(crate) fn push(&mut self, op: &Op<'_>) {
        op.encode(&mut self.buf);
        self.count += 1;
        #[allow(clippy::indexing_slicing, reason = "`new` wrote the header first")]
        let count = &mut self.buf[BATCH_COUNT_OFFSET..BATCH_HEADER_SIZE];
        count.copy_from_slice(&self.count.to_le_bytes());
    }

    /// Bytes of payload so far.
    pub(crate) fn payload_len(&self) -> usize {
        self.buf.len()
    }

    /// The batch as a record.
    pub(crate) fn record(&self) -> Record<'_> {
        Record::Batch(Batch {
            branch: self.branch,
            count: self.count,
            payload: &self.buf,
        })
    }
}

/// A logged catalog change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum VersionOp {
    /// A snapshot (read-only) or branch (writable) `id` named `name`, of `source`;
    /// without a source, a new empty branch (a volume's tree starts so).
    Create {
        id: u32,
        source: Option<u32>,
        snapshot: bool,
        created_unix_ms: u64,
        created_checkpoint: u64,
        name: String,
    },
    /// Version `id` removed.
    Drop { id: u32 },
}

impl VersionOp {
    fn encode(&self, b: &mut Vec<u8>) {
        match self {
            VersionOp::Create {
                id,
                source,
                snapshot,
                created_unix_ms,
                created_checkpoint,
                name,
            } => {
                put_u32(b, *id);
                b.extend_from_slice(&[VERSION_CREATE, 0, 0, 0]);
                put_u32(b, source.unwrap_or(NO_SOURCE));
                put_u8(b, u8::from(*snapshot));
                put_u64(b, *created_unix_ms);
                put_u64(b, *created_checkpoint);
                put_u16(b, len_u16(name.len()));
                b.extend_from_slice(name.as_bytes());
            }
            VersionOp::Drop { id } => {
                put_u32(b, *id);
                b.extend_from_slice(&[VERSION_DROP, 0, 0, 0]);
            }
        }
    }

    fn decode(payload: &[u8]) -> Result<VersionOp> {
        let mut d = Decoder::new(payload, "wal");
        let id = d.u32()?;
        let op = d.u8()?;
        if d.bytes(3)? != [0, 0, 0] {
            return Err(d.error("bad version record padding"));
        }
        let op = match op {
            VERSION_CREATE => {
                let source = match d.u32()? {
                    NO_SOURCE => None,
                    id => Some(id),
                };
                let snapshot = match d.u8()? {
                    0 => false,
                    1 => true,
                    k => return Err(d.error(format!("bad version kind {k}"))),
                };
                let created_unix_ms = d.u64()?;
                let created_checkpoint = d.u64()?;
                let len = usize::from(d.u16()?);
                let name = String::from_utf8(d.bytes(len)?.to_vec())
                    .map_err(|_| d.error("version name is not UTF-8"))?;
                VersionOp::Create {
                    id,
                    source,
                    snapshot,
                    created_unix_ms,
                    created_checkpoint,
                    name,
                }
            }
            VERSION_DROP => VersionOp::Drop { id },
            k => return Err(d.error(format!("unknown version op {k}"))),
        };
        if d.remaining() != 0 {
            return Err(d.error("trailing bytes in version record"));
        }
        Ok(op)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{Addr, SegmentId};

    fn encoded(r: &Record<'_>) -> (u8, Vec<u8>) {
        (r.kind(), r.payload().into_owned())
    }

    #[test]
    fn values_round_trip_and_every_truncation_is_an_error() {
        let entries = vec![
            (Addr::new(SegmentId(3), 4096), vec![7u8; 4096]),
            (Addr::new(SegmentId(4), 32), vec![1, 2, 3]),
        ];
        let mut payload = Vec::new();
        encode_values(&mut payload, &entries);
        assert_eq!(
            payload.len(),
            values_payload_len(entries.iter().map(|(_, b)| b.len()))
        );
        let decoded = decode_values(&payload).unwrap();
        let want: Vec<(Addr, &[u8])> = entries.iter().map(|(a, b)| (*a, &b[..])).collect();
        assert_eq!(decoded, want);
        for cut in 0..payload.len() {
            assert!(decode_values(&payload[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = payload.clone();
        longer.push(0);
        assert!(decode_values(&longer).is_err(), "trailing byte");
        // A count far past what the bytes hold is an error, not an allocation.
        let mut huge = payload.clone();
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_values(&huge).is_err());
        // And a record of this kind is not a `Record`.
        assert!(Record::decode(KIND_VALUES, &payload).is_err());
    }

    #[test]
    fn batch_round_trip_and_every_truncation_is_an_error() {
        let mut w = BatchWriter::new(7);
        let extent = BlockRef {
            addr: Addr::new(SegmentId(3), 64),
            len: 2000,
            crc: 9,
        };
        let ops = [
            Op::Put {
                key: b"k",
                value: b"v",
            },
            Op::PutExtent {
                key: b"big",
                extent,
            },
            Op::Delete { key: b"x" },
        ];
        for op in &ops {
            w.push(op);
        }
        let (kind, p) = encoded(&w.record());
        let Record::Batch(b) = Record::decode(kind, &p).unwrap() else {
            panic!("not a batch")
        };
        assert_eq!(b.branch(), 7);
        let back: Vec<Op<'_>> = b.ops().collect::<Result<_>>().unwrap();
        assert_eq!(back, ops);
        for cut in 0..p.len() {
            assert!(Record::decode(kind, &p[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn version_and_checkpoint_records_round_trip() {
        let records = [
            Record::Version(VersionOp::Create {
                id: 4,
                source: Some(0),
                snapshot: true,
                created_unix_ms: 12,
                created_checkpoint: 3,
                name: "snap".into(),
            }),
            Record::Version(VersionOp::Create {
                id: 5,
                source: None,
                snapshot: false,
                created_unix_ms: 13,
                created_checkpoint: 3,
                name: "disk".into(),
            }),
            Record::Version(VersionOp::Drop { id: 4 }),
            Record::CheckpointCommit { generation: 99 },
            Record::Relocation { blocks: 7 },
        ];
        for r in records {
            let (kind, p) = encoded(&r);
            // The framing takes a record under 8 bytes of payload for the zeros of a
            // preallocated file: it would never be read back.
            assert!(p.len() >= 8, "{r:?}: payload of {} bytes", p.len());
            assert_eq!(Record::decode(kind, &p).unwrap(), r);
            for cut in 0..p.len() {
                assert!(Record::decode(kind, &p[..cut]).is_err());
            }
        }
        assert!(Record::decode(9, &[0; 8]).unwrap_err().is_corruption());
        assert!(Record::decode(4, &[0; 9]).unwrap_err().is_corruption());
    }
}
