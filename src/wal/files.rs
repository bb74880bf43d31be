//! The log's files: their names, which generations exist, reading them back in order,
//! and removing the ones a durable checkpoint covers.
//!
//! Generation `g` lives in `wal-<g as 16 hex digits>.log`. One retired file is kept as
//! `wal-spare.log` for the next generation to reuse (see [`SPARE_FILE`]).

use super::payload::Record;
use super::record::read_log;
use super::PREALLOC_BYTES;
use crate::error::{Error, Result};
use crate::format::Lsn;
use crate::io::{VFile, Vfs};
use std::sync::Arc;

/// A log file kept after a checkpoint for the next generation to reuse: overwriting
/// blocks a file already owns lets `fdatasync` skip the metadata journal, which on
/// this class of machine is the difference between ~0.15 ms and several ms per commit.
/// Its old records carry another generation's salt, so they can never validate.
pub(crate) const SPARE_FILE: &str = "wal-spare.log";

pub(crate) fn file_name(gen: u64) -> String {
    format!("wal-{gen:016x}.log")
}

pub(crate) fn parse_file_name(name: &str) -> Option<u64> {
    let hex = name.strip_prefix("wal-")?.strip_suffix(".log")?;
    if hex.len() != 16 {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// The generations on disk at or above `first`, in order.
pub(crate) fn generations(vfs: &dyn Vfs, first: u64) -> Result<Vec<u64>> {
    let mut gens: Vec<u64> = vfs
        .list()?
        .iter()
        .filter_map(|n| parse_file_name(n))
        .filter(|&g| g >= first)
        .collect();
    gens.sort_unstable();
    Ok(gens)
}

/// Deletes generations older than `first_live`, keeping one as the spare the next
/// generation reuses, cut back to a new file's preallocated size (a big batch's log
/// must not hold its size for good). Called once the superblock that no longer
/// needs them is durable.
pub(crate) fn remove_below(vfs: &dyn Vfs, first_live: u64) -> Result<()> {
    let mut removed = false;
    let mut have_spare = vfs.exists(SPARE_FILE)?;
    for name in vfs.list()? {
        if parse_file_name(&name).is_some_and(|g| g < first_live) {
            if have_spare {
                vfs.remove(&name)?;
            } else {
                trim_spare(&*vfs.open(&name)?)?;
                vfs.rename(&name, SPARE_FILE)?;
                have_spare = true;
            }
            removed = true;
        }
    }
    if removed {
        vfs.sync_dir()?;
    }
    Ok(())
}

/// Cuts a retired log file back to a new file's preallocated size before it becomes
/// the spare (or as the log takes an older build's spare), while nothing writes it.
/// No sync: a crash that brings the old length back costs only disk space.
pub(crate) fn trim_spare(file: &dyn VFile) -> Result<()> {
    if file.len()? > PREALLOC_BYTES as u64 {
        file.set_len(PREALLOC_BYTES as u64)?;
    }
    Ok(())
}

/// The spare log file's size (0 without one).
pub(crate) fn spare_bytes(vfs: &dyn Vfs) -> Result<u64> {
    match vfs.open(SPARE_FILE) {
        Ok(file) => Ok(file.len()?),
        // None, or the log just took it for a new generation.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e.into()),
    }
}

/// One record read back from the log.
#[derive(Debug)]
pub(crate) struct LoggedRecord {
    pub lsn: Lsn,
    pub kind: u8,
    pub payload: Vec<u8>,
    /// Where the record starts in its generation's file.
    pub offset: u64,
}

impl LoggedRecord {
    /// Decodes the payload (validating all of it).
    pub(crate) fn record(&self) -> Result<Record<'_>> {
        Record::decode(self.kind, &self.payload).map_err(|e| match e {
            Error::Corrupted { what, detail } => Error::Corrupted {
                what,
                detail: format!("LSN {}: {detail}", self.lsn.0),
            },
            e => e,
        })
    }
}

/// What one generation's file held past the checkpoint.
pub(crate) struct Generation {
    pub gen: u64,
    pub file: Arc<dyn VFile>,
    /// Records after the checkpoint's LSN, contiguous, continuing the previous
    /// generation's.
    pub records: Vec<LoggedRecord>,
    /// Its values records (value bytes a group commit logged in place of syncing
    /// their segment; `wal::payload::encode_values`), every one in the file: one
    /// from before the checkpoint may hold extents later records name.
    pub values: Vec<LoggedRecord>,
    /// Bytes of valid records in the file.
    pub valid_bytes: u64,
    /// The newest `synced_lsn` any valid record of the file carries (those before
    /// the checkpoint included): every record up to it had been synced, and so had
    /// the value extents they name, when a record of this file was appended.
    pub synced_through: Lsn,
    /// Whether non-zero bytes followed the last valid record (a torn tail, or old
    /// records of a recycled file).
    pub torn_tail: bool,
}

/// Reads the log from generation `first` on, in order: recovery replays what it
/// yields and `verify` checks it. Each file's records are valid up to its torn tail;
/// LSNs must continue from `after` across files. A file that cannot be read, or a gap
/// between files, is an `Err` item; iteration goes on after it (verify reports every
/// problem; recovery stops at the first).
pub(crate) struct Generations<'v> {
    vfs: &'v dyn Vfs,
    gens: std::vec::IntoIter<u64>,
    /// The last LSN accounted for.
    last: Lsn,
}

impl<'v> Generations<'v> {
    pub(crate) fn read(vfs: &'v dyn Vfs, first: u64, after: Lsn) -> Result<Generations<'v>> {
        Ok(Generations {
            vfs,
            gens: generations(vfs, first)?.into_iter(),
            last: after,
        })
    }

    fn next_generation(&mut self, gen: u64) -> Result<Generation> {
        let name = file_name(gen);
        let file = self.vfs.open(&name)?;
        let log = read_log(&*file, gen, self.last.next()).map_err(|e| match e {
            Error::Corrupted { what, detail } => Error::Corrupted {
                what,
                detail: format!("{name}: {detail}"),
            },
            e => e,
        })?;
        let mut records = Vec::with_capacity(log.records.len());
        let mut gap = None;
        let synced_through = log
            .records
            .iter()
            .map(|r| r.header.synced_lsn)
            .max()
            .unwrap_or(Lsn(0));
        let mut values = Vec::new();
        for read in log.records {
            let lsn = read.header.lsn;
            if read.header.kind == super::payload::KIND_VALUES {
                values.push(LoggedRecord {
                    lsn,
                    kind: read.header.kind,
                    payload: read.payload,
                    offset: read.offset,
                });
                continue;
            }
            if lsn <= self.last {
                continue; // already in the checkpoint
            }
            // Within a file LSNs are contiguous (`read_log` stops otherwise), so a gap
            // can only open between files: records were lost.
            if lsn != self.last.next() && gap.is_none() {
                gap = Some(Error::corrupted(
                    "wal",
                    format!(
                        "{name} continues at LSN {} but LSN {} was expected (records lost)",
                        lsn.0,
                        self.last.next().0
                    ),
                ));
            }
            self.last = lsn;
            records.push(LoggedRecord {
                lsn,
                kind: read.header.kind,
                payload: read.payload,
                offset: read.offset,
            });
        }
        if let Some(e) = gap {
            return Err(e);
        }
        Ok(Generation {
            gen,
            file,
            records,
            values,
            valid_bytes: log.valid_bytes,
            synced_through,
            torn_tail: log.torn_tail,
        })
    }
}

impl Iterator for Generations<'_> {
    type Item = Result<Generation>;

    fn next(&mut self) -> Option<Result<Generation>> {
        let gen = self.gens.next()?;
        Some(self.next_generation(gen))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        assert_eq!(parse_file_name(&file_name(0x2a)), Some(0x2a));
        assert_eq!(parse_file_name(SPARE_FILE), None);
        assert_eq!(parse_file_name("wal-2a.log"), None);
    }
}
