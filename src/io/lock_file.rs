//! The store's inter-process locks on the real file system, and the `LOCK` file.
//!
//! - **Writer**: one writing process per store. It holds an exclusive `flock` on the
//!   store *directory* (a lock on a file named `LOCK` would be lost if someone deleted
//!   that file: a second writer would lock a new one and both would write), and also
//!   on `LOCK`, the name older builds lock.
//! - **Reader**: any number of read-only processes, beside the writer. A reader holds a
//!   shared `flock` on `superblock`, which it opens read-only: it needs no write
//!   permission and creates nothing. The engine itself never waits for readers (a
//!   reader keeps every file it reads open, and no file is rewritten in place while
//!   it could be read; see `recovery`). The writer only looks whether one is there
//!   ([`readers_present`]) before it rewrites a segment file in place (a spare
//!   recycled, an emptied segment cut back); outside tools can wait for them:
//!   `flock -x superblock`.
//!
//! `LOCK` also carries what readers in other processes need to know of the writer:
//! its PID (for "in use by pid N" messages) and the last LSN whose log record is
//! durable, published after every log sync and before the commits it covers return.
//! A reader replays the log no further, so it never sees a commit that a crash could
//! still take back; an open finding the log shorter than that knows it was damaged.
//! A new writer keeps the last one's LSN until it publishes its own. The record is one line of fixed width, rewritten in place:
//! ```text
//! pid <10 digits> synced <20 digits> crc <8 hex digits>\n
//! ```
//! The CRC-32C covers the bytes before ` crc`, so a reader that catches the line
//! half-rewritten reads again. `synced` is `u64::MAX` until a writer has published
//! (the first one of a store, still replaying its log): a reader then reads every
//! valid record.

use super::{LockKind, StoreLock};
use crate::error::file_error;
use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// The lock file's name in the store directory.
pub const LOCK_FILE: &str = "LOCK";

/// The superblock's name (the file readers lock shared).
const SUPERBLOCK_FILE: &str = "superblock";

const RECORD_LEN: usize = 56;

/// `synced` before the writer has published anything.
const UNPUBLISHED: u64 = u64::MAX;

fn encode(pid: u32, synced: u64) -> [u8; RECORD_LEN] {
    let body = format!("pid {pid:010} synced {synced:020}");
    let line = format!("{body} crc {:08x}\n", crc32c::crc32c(body.as_bytes()));
    let mut out = [0u8; RECORD_LEN];
    out.copy_from_slice(line.as_bytes());
    out
}

/// The writer's PID and published LSN, if `bytes` hold a whole, intact record.
fn decode(bytes: &[u8]) -> Option<(u32, u64)> {
    let line = std::str::from_utf8(bytes.get(..RECORD_LEN)?).ok()?;
    let (body, crc) = line.strip_suffix('\n')?.split_once(" crc ")?;
    if u32::from_str_radix(crc, 16).ok()? != crc32c::crc32c(body.as_bytes()) {
        return None;
    }
    let mut fields = body.split(' ');
    let (Some("pid"), Some(pid), Some("synced"), Some(synced), None) = (
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
    ) else {
        return None;
    };
    Some((pid.parse().ok()?, synced.parse().ok()?))
}

/// Reads `LOCK`'s record (a few tries, in case a rewrite is in progress). `None`:
/// no readable, valid record (no writer ever ran here, or an older build's).
pub(crate) fn read_record(dir: &Path) -> Option<(u32, u64)> {
    let file = File::open(dir.join(LOCK_FILE)).ok()?;
    let mut buf = [0u8; RECORD_LEN];
    for _ in 0..3 {
        if file.read_exact_at(&mut buf, 0).is_err() {
            return None;
        }
        if let Some(record) = decode(&buf) {
            return Some(record);
        }
        std::thread::yield_now();
    }
    None
}

/// The writer's lock: held as long as this lives.
struct WriterLock {
    _dir: File,
    lock_file: File,
    /// This process's id, taken once: publishing follows every group commit, and
    /// `std::process::id` is a system call each time.
    pid: u32,
}

impl StoreLock for WriterLock {
    fn publish_synced(&self, lsn: u64) -> io::Result<()> {
        self.lock_file
            .write_all_at(&encode(self.pid, lsn), 0)
            .map_err(|e| file_error("write", LOCK_FILE, e))
    }
}

/// A reader's shared lock.
struct ReaderLock(#[expect(dead_code, reason = "held for its lock")] File);

impl StoreLock for ReaderLock {
    fn publish_synced(&self, _lsn: u64) -> io::Result<()> {
        Ok(())
    }
}

fn in_use() -> io::Error {
    io::Error::new(
        io::ErrorKind::WouldBlock,
        "the store is in use by another process",
    )
}

fn try_exclusive(file: &File) -> io::Result<()> {
    match file.try_lock() {
        Ok(()) => Ok(()),
        Err(TryLockError::WouldBlock) => Err(in_use()),
        Err(TryLockError::Error(e)) => Err(e),
    }
}

/// Takes `kind` of lock on the store in `dir`.
pub(crate) fn lock(dir: &Path, kind: LockKind) -> io::Result<Box<dyn StoreLock>> {
    match kind {
        LockKind::Writer => {
            let dir_name = dir.display().to_string();
            let dir_file = File::open(dir).map_err(|e| file_error("open", &dir_name, e))?;
            try_exclusive(&dir_file).map_err(|e| file_error("lock", &dir_name, e))?;
            let lock_file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(dir.join(LOCK_FILE))
                .map_err(|e| file_error("open", LOCK_FILE, e))?;
            try_exclusive(&lock_file).map_err(|e| file_error("lock", LOCK_FILE, e))?;
            lock_file
                .set_len(RECORD_LEN as u64)
                .map_err(|e| file_error("resize", LOCK_FILE, e))?;
            let lock = WriterLock {
                _dir: dir_file,
                lock_file,
                pid: std::process::id(),
            };
            // The last writer's published LSN stays until this one publishes its own
            // (after its recovery): records up to it are durable, so readers may
            // replay that far meanwhile, and an open that fails (a log found cut
            // short of it) leaves the evidence for the next open to find.
            let previous = published_synced(dir).unwrap_or(UNPUBLISHED);
            lock.publish_synced(previous)?;
            Ok(Box::new(lock))
        }
        LockKind::Reader => {
            let file = File::open(dir.join(SUPERBLOCK_FILE))
                .map_err(|e| file_error("open", SUPERBLOCK_FILE, e))?;
            file.lock_shared()
                .map_err(|e| file_error("lock", SUPERBLOCK_FILE, e))?;
            Ok(Box::new(ReaderLock(file)))
        }
    }
}

/// Whether a reader holds its shared lock on `superblock` (or whether one does
/// cannot be told): an exclusive lock taken and dropped at once, never waited for.
/// A reader that takes its lock after this looked reads the superblock after it.
pub(crate) fn readers_present(dir: &Path) -> bool {
    let Ok(file) = File::open(dir.join(SUPERBLOCK_FILE)) else {
        return true;
    };
    // Dropping the file releases the lock.
    file.try_lock().is_err()
}

/// The last durable LSN the writer published, if one did (`None`: replay every valid
/// record).
pub(crate) fn published_synced(dir: &Path) -> Option<u64> {
    read_record(dir)
        .map(|(_, synced)| synced)
        .filter(|&s| s != UNPUBLISHED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trip_and_damage() {
        let rec = encode(4_000_000_000, 12345);
        assert_eq!(decode(&rec), Some((4_000_000_000, 12345)));
        assert_eq!(decode(&encode(1, UNPUBLISHED)), Some((1, UNPUBLISHED)));
        for i in 0..RECORD_LEN {
            let mut bad = rec;
            bad[i] ^= 0x01;
            assert_eq!(decode(&bad), None, "flipped byte {i}");
        }
        assert_eq!(decode(&rec[..RECORD_LEN - 1]), None);
        assert_eq!(decode(b""), None);
    }
}
