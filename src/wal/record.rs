//! WAL record framing and the batch payload codec.

use crate::error::{Error, Result};
use crate::format::{
    crc_append, len_u16, len_u32, put_u16, put_u32, put_u64, put_u8, BlockRef, Decoder, Lsn,
};
use crate::io::VFile;

pub(crate) const RECORD_HEADER_SIZE: usize = 20;
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
pub(crate) fn encode(out: &mut Vec<u8>, gen: u64, lsn: Lsn, kind: u8, payload: &[u8]) {
    let start = out.len();
    put_u32(out, len_u32(payload.len()));
    put_u32(out, 0);
    put_u64(out, lsn.0);
    put_u8(out, kind);
    out.extend_from_slice(&[0; 3]);
    out.extend_from_slice(payload);
    let c = record_crc(gen, &out[start + 8..start + RECORD_HEADER_SIZE], payload);
    out[start + 4..start + 8].copy_from_slice(&c.to_le_bytes());
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
        if key_len == 0 || key_len > crate::MAX_KEY_LEN {
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
pub(crate) struct LogRead {
    /// Valid records in order: (lsn, kind, payload).
    pub records: Vec<(Lsn, u8, Vec<u8>)>,
    /// Bytes of valid records.
    pub valid_bytes: u64,
    /// Whether non-zero bytes followed the last valid record: a torn record, or old
    /// records of a recycled file.
    pub torn_tail: bool,
}

/// Reads the records of generation `gen` from `file`, expecting LSNs from
/// `first_lsn` on (any first LSN when `None`). Stops at the torn tail.
pub(crate) fn read_log(file: &dyn VFile, gen: u64, first_lsn: Option<Lsn>) -> Result<LogRead> {
    let len = file.len()?;
    let mut data =
        vec![0u8; usize::try_from(len).map_err(|_| Error::corrupted("wal", "file too large"))?];
    file.read_exact_at(&mut data, 0)?;
    let mut records = Vec::new();
    let mut pos = 0usize;
    let mut expect = first_lsn;
    loop {
        let Some(header) = data.get(pos..pos + RECORD_HEADER_SIZE) else {
            break;
        };
        let payload_len = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes"));
        let stored_crc = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
        let lsn = Lsn(u64::from_le_bytes(
            header[8..16].try_into().expect("8 bytes"),
        ));
        let kind = header[16];
        if payload_len > RECORD_MAX || (payload_len as usize) < MIN_PAYLOAD {
            break; // torn, or the zeros of a preallocated file
        }
        let body_start = pos + RECORD_HEADER_SIZE;
        let Some(payload) = data.get(body_start..body_start + payload_len as usize) else {
            break;
        };
        if record_crc(gen, &header[8..], payload) != stored_crc {
            break;
        }
        if expect.is_some_and(|e| e != lsn) {
            break;
        }
        records.push((lsn, kind, payload.to_vec()));
        expect = Some(lsn.next());
        pos = body_start + payload_len as usize;
    }
    Ok(LogRead {
        records,
        valid_bytes: pos as u64,
        torn_tail: (pos as u64) < len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
