//! WAL record framing and the batch payload codec.

use crate::error::{Error, Result};
use crate::format::{
    crc_append, len_u16, len_u32, put_u16, put_u32, put_u64, put_u8, BlockRef, Decoder, Lsn,
};
use crate::io::VFile;

// Record header layout: the byte offset of each field. docs/FORMAT.md has the same
// table, and `crate::format_tests` checks the two against each other.
pub(crate) const OFF_LEN: usize = 0;
pub(crate) const OFF_CRC: usize = 4;
pub(crate) const OFF_LSN: usize = 8;
pub(crate) const OFF_SYNCED_LSN: usize = 16;
pub(crate) const OFF_KIND: usize = 24;
pub(crate) const OFF_RESERVED: usize = 25;
/// The payload follows the header.
pub(crate) const RECORD_HEADER_SIZE: usize = 28;
/// The checksum covers the salt, the header from here on, and the payload.
pub(crate) const CRC_FROM: usize = OFF_LSN;

// The fields are contiguous, each as wide as its type, and fill exactly
// `RECORD_HEADER_SIZE`.
const _: () = assert!(OFF_LEN == 0);
const _: () = assert!(OFF_LEN + size_of::<u32>() == OFF_CRC);
const _: () = assert!(OFF_CRC + size_of::<u32>() == OFF_LSN);
const _: () = assert!(OFF_LSN + size_of::<u64>() == OFF_SYNCED_LSN);
const _: () = assert!(OFF_SYNCED_LSN + size_of::<u64>() == OFF_KIND);
const _: () = assert!(OFF_KIND + size_of::<u8>() == OFF_RESERVED);
const _: () = assert!(OFF_RESERVED + 3 == RECORD_HEADER_SIZE);
const _: () = assert!(CRC_FROM == OFF_CRC + size_of::<u32>());

/// A record larger than this is not one we wrote: treat it as the torn tail.
const RECORD_MAX: u32 = 1 << 30;
/// Every payload starts with `branch u32 | count u32`.
const MIN_PAYLOAD: usize = 8;

const OP_PUT_INLINE: u8 = 1;
const OP_PUT_EXTENT: u8 = 2;
const OP_DELETE: u8 = 3;

/// One operation of a logged batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BatchOp {
    Put { key: Vec<u8>, value: Vec<u8> },
    PutExtent { key: Vec<u8>, extent: BlockRef },
    Delete { key: Vec<u8> },
}

fn record_crc(gen: u64, header_tail: &[u8], payload: &[u8]) -> u32 {
    let c = crc_append(0, &gen.to_le_bytes());
    let c = crc_append(c, header_tail);
    crc_append(c, payload)
}

/// Frames `payload` as a record of generation `gen` onto `out`.
pub(crate) fn encode(out: &mut Vec<u8>, gen: u64, header: RecordHeader, payload: &[u8]) {
    let mut h = [0u8; RECORD_HEADER_SIZE];
    h[OFF_LEN..OFF_CRC].copy_from_slice(&len_u32(payload.len()).to_le_bytes());
    h[OFF_LSN..OFF_SYNCED_LSN].copy_from_slice(&header.lsn.0.to_le_bytes());
    h[OFF_SYNCED_LSN..OFF_KIND].copy_from_slice(&header.synced_lsn.0.to_le_bytes());
    h[OFF_KIND] = header.kind;
    // The reserved bytes stay zero.
    let c = record_crc(gen, &h[CRC_FROM..], payload);
    h[OFF_CRC..OFF_LSN].copy_from_slice(&c.to_le_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(payload);
}

/// The header fields of a record besides its length and checksum.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RecordHeader {
    pub lsn: Lsn,
    /// The newest LSN known durable when this record was appended. A record can only
    /// be part of a write issued after every LSN up to this one was fsynced, which is
    /// what tells a damaged *durable* record from a torn tail (see `read_log`).
    pub synced_lsn: Lsn,
    pub kind: u8,
}

/// Parses the record at `pos`, if a valid one of generation `gen` starts there.
fn parse_at(data: &[u8], pos: usize, gen: u64) -> Option<(RecordHeader, &[u8])> {
    let header = data.get(pos..pos + RECORD_HEADER_SIZE)?;
    let u32_at = |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().expect("4 bytes"));
    let u64_at = |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().expect("8 bytes"));
    let payload_len = u32_at(OFF_LEN);
    let stored_crc = u32_at(OFF_CRC);
    if payload_len > RECORD_MAX
        || (payload_len as usize) < MIN_PAYLOAD
        || header[OFF_RESERVED..RECORD_HEADER_SIZE] != [0, 0, 0]
    {
        return None; // torn, or the zeros of a preallocated file
    }
    let body = pos + RECORD_HEADER_SIZE;
    let payload = data.get(body..body + payload_len as usize)?;
    if record_crc(gen, &header[CRC_FROM..], payload) != stored_crc {
        return None;
    }
    Some((
        RecordHeader {
            lsn: Lsn(u64_at(OFF_LSN)),
            synced_lsn: Lsn(u64_at(OFF_SYNCED_LSN)),
            kind: header[OFF_KIND],
        },
        payload,
    ))
}

/// docs/FORMAT.md's record header table, checked against the constants above.
#[cfg(test)]
#[test]
fn header_layout_matches_format_md() {
    crate::format_tests::check_layout(
        "wal-record-header",
        &[
            ("len", OFF_LEN),
            ("crc", OFF_CRC),
            ("lsn", OFF_LSN),
            ("synced_lsn", OFF_SYNCED_LSN),
            ("kind", OFF_KIND),
            ("reserved", OFF_RESERVED),
        ],
        RECORD_HEADER_SIZE,
    );
}

/// Appends one operation to a batch payload under construction. The payload starts
/// with `branch u32 | count u32`; the caller patches the count.
pub(crate) fn encode_op(out: &mut Vec<u8>, op: &BatchOpRef<'_>) {
    match *op {
        BatchOpRef::Put { key, value } => {
            put_u8(out, OP_PUT_INLINE);
            put_u16(out, len_u16(key.len()));
            out.extend_from_slice(key);
            put_u32(out, len_u32(value.len()));
            out.extend_from_slice(value);
        }
        BatchOpRef::PutExtent { key, extent } => {
            put_u8(out, OP_PUT_EXTENT);
            put_u16(out, len_u16(key.len()));
            out.extend_from_slice(key);
            extent.encode(out);
        }
        BatchOpRef::Delete { key } => {
            put_u8(out, OP_DELETE);
            put_u16(out, len_u16(key.len()));
            out.extend_from_slice(key);
        }
    }
}

/// A borrowed [`BatchOp`], for encoding without copies.
pub(crate) enum BatchOpRef<'a> {
    Put { key: &'a [u8], value: &'a [u8] },
    PutExtent { key: &'a [u8], extent: BlockRef },
    Delete { key: &'a [u8] },
}

/// Decodes a batch payload: the branch id and its operations.
pub(crate) fn decode_batch(payload: &[u8]) -> Result<(u32, Vec<BatchOp>)> {
    let mut d = Decoder::new(payload, "wal");
    let branch = d.u32()?;
    let count = d.u32()? as usize;
    if count > payload.len() {
        return Err(d.error("op count exceeds record size"));
    }
    let mut ops = Vec::with_capacity(count);
    for _ in 0..count {
        let tag = d.u8()?;
        let key_len = usize::from(d.u16()?);
        if key_len == 0 || key_len > crate::limits::MAX_KEY_LEN {
            return Err(d.error(format!("key length {key_len} out of range")));
        }
        let key = d.bytes(key_len)?.to_vec();
        ops.push(match tag {
            OP_PUT_INLINE => {
                let len = d.u32()? as usize;
                BatchOp::Put {
                    key,
                    value: d.bytes(len)?.to_vec(),
                }
            }
            OP_PUT_EXTENT => BatchOp::PutExtent {
                key,
                extent: BlockRef::decode(&mut d)?,
            },
            OP_DELETE => BatchOp::Delete { key },
            _ => return Err(d.error(format!("unknown op tag {tag}"))),
        });
    }
    if d.remaining() != 0 {
        return Err(d.error("trailing bytes after the last op"));
    }
    Ok((branch, ops))
}

/// What reading one log file found.
#[derive(Debug)]
pub(crate) struct LogRead {
    /// Valid records in order: (lsn, kind, payload).
    pub records: Vec<(Lsn, u8, Vec<u8>)>,
    /// Bytes of valid records.
    pub valid_bytes: u64,
    /// Whether non-zero bytes followed the last valid record: a torn record, or old
    /// records of a recycled file.
    pub torn_tail: bool,
}

/// Reads the records of generation `gen` from `file`. `next_lsn` is the LSN the
/// first record is expected to carry when the file holds none that validate.
///
/// Records are read up to the first one that is short, fails its checksum or breaks
/// LSN continuity. That is normally the torn tail of a crash, and is ignored. But if a
/// later record validates and says (by its `synced_lsn`) that the broken one had
/// already been fsynced when it was written, the broken record was acknowledged and
/// has been damaged since: that is corruption, reported as an error rather than
/// silently dropping acknowledged commits.
pub(crate) fn read_log(file: &dyn VFile, gen: u64, next_lsn: Lsn) -> Result<LogRead> {
    let len = file.len()?;
    let mut data =
        vec![0u8; usize::try_from(len).map_err(|_| Error::corrupted("wal", "file too large"))?];
    file.read_exact_at(&mut data, 0)?;
    let mut records = Vec::new();
    let mut pos = 0usize;
    let mut expect: Option<Lsn> = None;
    while let Some((header, payload)) = parse_at(&data, pos, gen) {
        if expect.is_some_and(|e| e != header.lsn) {
            break;
        }
        records.push((header.lsn, header.kind, payload.to_vec()));
        expect = Some(header.lsn.next());
        pos += RECORD_HEADER_SIZE + payload.len();
    }
    let broken = expect.unwrap_or(next_lsn);
    // Only the written part can hold records (files are preallocated with zeros).
    let end = data.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    for later in pos + 1..end.saturating_sub(RECORD_HEADER_SIZE - 1) {
        if let Some((h, _)) = parse_at(&data, later, gen) {
            if h.lsn > broken && h.synced_lsn >= broken {
                return Err(Error::corrupted(
                    "wal",
                    format!(
                        "record LSN {} at offset {pos} is damaged, but it was durable: \
                         record LSN {} at offset {later} was written after it was synced",
                        broken.0, h.lsn.0
                    ),
                ));
            }
        }
    }
    let torn_tail = end > pos;
    Ok(LogRead {
        records,
        valid_bytes: pos as u64,
        torn_tail,
    })
}

const VERSION_CREATE: u8 = 1;
const VERSION_DROP: u8 = 2;

/// A logged catalog change. Payload: `id u32 | op u8 | 3 zero bytes`, then for a
/// create: `source u32 | kind u8 | created_unix_ms u64 | created_checkpoint u64 |
/// name_len u16 | name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum VersionOp {
    Create {
        id: u32,
        source: u32,
        snapshot: bool,
        created_unix_ms: u64,
        created_checkpoint: u64,
        name: String,
    },
    Drop {
        id: u32,
    },
}

impl VersionOp {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        match self {
            VersionOp::Create {
                id,
                source,
                snapshot,
                created_unix_ms,
                created_checkpoint,
                name,
            } => {
                put_u32(&mut b, *id);
                b.extend_from_slice(&[VERSION_CREATE, 0, 0, 0]);
                put_u32(&mut b, *source);
                put_u8(&mut b, u8::from(*snapshot));
                put_u64(&mut b, *created_unix_ms);
                put_u64(&mut b, *created_checkpoint);
                put_u16(&mut b, len_u16(name.len()));
                b.extend_from_slice(name.as_bytes());
            }
            VersionOp::Drop { id } => {
                put_u32(&mut b, *id);
                b.extend_from_slice(&[VERSION_DROP, 0, 0, 0]);
            }
        }
        b
    }

    pub(crate) fn decode(payload: &[u8]) -> Result<VersionOp> {
        let mut d = Decoder::new(payload, "wal");
        let id = d.u32()?;
        let op = d.u8()?;
        if d.bytes(3)? != [0, 0, 0] {
            return Err(d.error("bad version record padding"));
        }
        let op = match op {
            VERSION_CREATE => {
                let source = d.u32()?;
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
    use crate::io::sim::SimVfs;
    use crate::io::Vfs;

    #[test]
    fn batch_round_trip() {
        let mut p = Vec::new();
        put_u32(&mut p, 0);
        put_u32(&mut p, 2);
        encode_op(
            &mut p,
            &BatchOpRef::Put {
                key: b"k",
                value: b"v",
            },
        );
        encode_op(&mut p, &BatchOpRef::Delete { key: b"x" });
        let (branch, ops) = decode_batch(&p).unwrap();
        assert_eq!(branch, 0);
        assert_eq!(ops[1], BatchOp::Delete { key: b"x".to_vec() });
        for cut in 0..p.len() {
            assert!(decode_batch(&p[..cut]).is_err());
        }
    }

    /// Three records; the second written after the first was synced, the third in the
    /// same write as the second.
    fn log() -> (Vec<u8>, [usize; 3]) {
        let payload = [0u8; 12];
        let mut out = Vec::new();
        let mut starts = [0; 3];
        for (i, synced) in [(0, 0), (1, 1), (2, 1)] {
            starts[i] = out.len();
            let h = RecordHeader {
                lsn: Lsn(i as u64 + 1),
                synced_lsn: Lsn(synced),
                kind: 1,
            };
            encode(&mut out, 7, h, &payload);
        }
        (out, starts)
    }

    fn read(bytes: &[u8]) -> Result<LogRead> {
        let vfs = SimVfs::new();
        let f = vfs.create("w").unwrap();
        f.write_all_at(bytes, 0).unwrap();
        read_log(&*f, 7, Lsn(1))
    }

    #[test]
    fn torn_tail_is_ignored_but_damage_to_a_durable_record_is_reported() {
        let (bytes, starts) = log();
        assert_eq!(read(&bytes).unwrap().records.len(), 3);
        // Damage in record 3 (same write as record 2): a torn tail, two records survive.
        let mut torn = bytes.clone();
        torn[starts[2] + 30] ^= 1;
        let r = read(&torn).unwrap();
        assert_eq!(r.records.len(), 2);
        assert!(r.torn_tail);
        // Damage in record 2, and record 3 is of the same write: still a torn tail.
        let mut torn = bytes.clone();
        torn[starts[1] + 30] ^= 1;
        assert_eq!(read(&torn).unwrap().records.len(), 1);
        // Damage in record 1, which record 2 says was durable: corruption.
        let mut damaged = bytes.clone();
        damaged[starts[0] + 30] ^= 1;
        assert!(read(&damaged).unwrap_err().is_corruption());
        // Another generation's records never validate.
        let vfs = SimVfs::new();
        let f = vfs.create("w").unwrap();
        f.write_all_at(&bytes, 0).unwrap();
        assert!(read_log(&*f, 8, Lsn(1)).unwrap().records.is_empty());
    }
}
