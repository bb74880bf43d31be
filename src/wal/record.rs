//! WAL record framing (length, checksum, LSNs, kind byte; `payload.rs` gives the kind
//! and the payload their meaning) and reading one log file back up to its torn tail.

// A decoder of untrusted bytes: every index is justified where it is.
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

use crate::error::{Error, Result};
use crate::format::{crc_append, len_u32, Lsn};
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
#[allow(
    clippy::indexing_slicing,
    reason = "`header` is exactly RECORD_HEADER_SIZE bytes (taken with `get` below), and \
              every offset is a constant inside it (const assertions above)"
)]
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

/// One valid record of a log file.
#[derive(Debug)]
pub(crate) struct ReadRecord {
    pub header: RecordHeader,
    /// Where the record starts in its file.
    pub offset: u64,
    pub payload: Vec<u8>,
}

/// What reading one log file found.
#[derive(Debug)]
pub(crate) struct LogRead {
    /// Valid records in order.
    pub records: Vec<ReadRecord>,
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
    // The LSN of the last record read (a values record repeats the LSN of the
    // record before it, and does not advance the count: `payload::KIND_VALUES`).
    let mut last: Option<Lsn> = None;
    while let Some((header, payload)) = parse_at(&data, pos, gen) {
        let values = header.kind == super::payload::KIND_VALUES;
        let continues = match last {
            None => true,
            Some(l) if values => l == header.lsn,
            Some(l) => l.next() == header.lsn,
        };
        if !continues {
            break;
        }
        records.push(ReadRecord {
            header,
            offset: pos as u64,
            payload: payload.to_vec(),
        });
        last = Some(header.lsn);
        pos += RECORD_HEADER_SIZE + payload.len();
    }
    let expect = last.map(Lsn::next);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::sim::SimVfs;
    use crate::io::Vfs;

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

    /// A values record repeats the LSN of the record before it (or, first in a
    /// file, any) and does not advance the count; one that does not is where the
    /// log ends.
    #[test]
    fn values_records_repeat_the_lsn_before_them() {
        let values = crate::wal::payload::KIND_VALUES;
        let frame = |specs: &[(u64, u8)]| {
            let mut out = Vec::new();
            for &(lsn, kind) in specs {
                let h = RecordHeader {
                    lsn: Lsn(lsn),
                    synced_lsn: Lsn(0),
                    kind,
                };
                encode(&mut out, 7, h, &[0u8; 12]);
            }
            out
        };
        let lsns = |r: LogRead| -> Vec<(u64, u8)> {
            r.records
                .iter()
                .map(|r| (r.header.lsn.0, r.header.kind))
                .collect()
        };
        let good = [
            (0, values),
            (1, 1),
            (2, 1),
            (2, values),
            (2, values),
            (3, 1),
        ];
        assert_eq!(lsns(read(&frame(&good)).unwrap()), good.to_vec());
        // A values record that skips ahead, or one claiming the LSN after it: the end.
        let ahead = [(1, 1), (2, values), (3, 1)];
        assert_eq!(lsns(read(&frame(&ahead)).unwrap()), vec![(1, 1)]);
        let after = [(1, 1), (1, values), (3, 1)];
        assert_eq!(
            lsns(read(&frame(&after)).unwrap()),
            vec![(1, 1), (1, values)]
        );
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
