//! The I/O layer: a store is a directory of files, reached only through [`Vfs`].
//!
//! Everything above this layer names files by a plain file name inside the store
//! directory and never touches `std::fs` directly, so tests can swap the real file
//! system ([`StdVfs`]) for the simulated one in [`sim`], which loses unsynced writes,
//! tears the last one and injects I/O errors on demand.
//!
//! Durability contract (what the engine assumes of every backend, and what `SimVfs`
//! enforces):
//! - data written to a file is durable only after `VFile::sync` returns;
//! - creating, renaming or removing a file is durable only after `Vfs::sync_dir`;
//! - a write that was not synced may be lost entirely or partially (torn at any
//!   512-byte boundary); writes that were synced are never lost or torn.

mod aligned;
mod lock_file;
mod overlap;
mod pages;
mod reserve;
pub mod sim;
mod slice;
mod std_vfs;
mod unix_socket;

pub(crate) use reserve::{
    allow as allow_reserve, allowed_here as reserve_allowed_here, without as without_reserve,
    Reserve, ReserveVfs,
};
pub use reserve::{reserve_for, RESERVE_BYTES, RESERVE_FILE, RESERVE_MIN_BYTES};

pub(crate) use aligned::{AlignedBuf, DIRECT_ALIGN};
pub use lock_file::LOCK_FILE;
pub(crate) use overlap::{Pending as PendingSync, SyncHelper};
pub(crate) use pages::Pages;
pub use slice::request_short_slice;
pub use std_vfs::{raise_open_file_limit, StdVfs};
pub use unix_socket::{bind_unix, connect_unix};

use std::io;
use std::sync::Arc;

/// One open file of the store directory. Positional I/O only, so one handle can be
/// shared by many threads without a seek position.
#[allow(
    clippy::len_without_is_empty,
    reason = "a file's length is a size, not a collection"
)]
pub trait VFile: Send + Sync {
    /// Reads exactly `buf.len()` bytes at `offset`; a short file is an
    /// `UnexpectedEof` error.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`, growing the file if needed.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset` like [`VFile::write_all_at`], but past the page
    /// cache where the backend can (`O_DIRECT`): for large appends of data that is not
    /// about to be read again, which then cost neither a copy nor fresh cache pages.
    /// The caller passes a buffer whose address, length and `offset` are multiples of
    /// `DIRECT_ALIGN` (`AlignedBuf` gives such buffers). Same durability as a
    /// buffered write: durable only after `sync`. The default writes through the
    /// page cache.
    fn write_direct_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_all_at(buf, offset)
    }
    /// Tells the OS its cached copy of `len` bytes at `offset` is not needed (the
    /// caller keeps its own): a hint, which does nothing where the backend has no
    /// such cache. Pages not yet written back are left alone.
    fn forget_cached(&self, _offset: u64, _len: u64) {}
    /// Tells the OS that reads of this file are random (B-tree nodes, each read
    /// whole), so that a read brings in only the bytes asked for: the OS's
    /// read-ahead would fill memory with neighbours nobody asked for, evicting nodes
    /// that are. A hint, which does nothing where the backend has no such cache.
    fn reads_are_random(&self) {}
    /// Tells the OS that `len` bytes at `offset` will be read soon, so that it reads
    /// them in the background (the read-ahead a scan asks for, in place of the OS's
    /// own that [`VFile::reads_are_random`] turned off). A hint.
    fn will_need(&self, _offset: u64, _len: u64) {}
    /// Makes every write issued so far durable (fdatasync).
    fn sync(&self) -> io::Result<()>;
    /// The current length of the file, as seen by this process.
    fn len(&self) -> io::Result<u64>;
    /// Truncates or extends the file.
    fn set_len(&self, len: u64) -> io::Result<()>;
}

/// A directory of files: the store.
pub trait Vfs: Send + Sync {
    /// Opens an existing file for reading and writing.
    fn open(&self, name: &str) -> io::Result<Arc<dyn VFile>>;
    /// Creates a new file; fails with `AlreadyExists` if it exists.
    fn create(&self, name: &str) -> io::Result<Arc<dyn VFile>>;
    /// Removes a file.
    fn remove(&self, name: &str) -> io::Result<()>;
    /// Renames a file, replacing `to` if it exists.
    fn rename(&self, from: &str, to: &str) -> io::Result<()>;
    /// Whether a file exists.
    fn exists(&self, name: &str) -> io::Result<bool>;
    /// The names of every file in the directory, in no particular order.
    fn list(&self) -> io::Result<Vec<String>>;
    /// Makes file creations, renames and removals durable.
    fn sync_dir(&self) -> io::Result<()>;
    /// Takes the store's inter-process lock of `kind`, held until the returned guard
    /// is dropped. Fails at once with `WouldBlock` if another process holds the
    /// writer lock and `kind` is [`LockKind::Writer`]; readers never wait.
    fn lock(&self, kind: LockKind) -> io::Result<Box<dyn StoreLock>>;
    /// The PID of the process that holds (or last held) the writer lock, if known.
    fn lock_holder(&self) -> Option<u32> {
        None
    }
    /// The last LSN whose log record the writer has published as durable
    /// ([`StoreLock::publish_synced`]); `None` when nothing is published (no writer
    /// has run since the file system was mounted, or the writer is still replaying):
    /// then every valid record counts.
    fn published_synced(&self) -> Option<u64> {
        None
    }
    /// Whether a reader in another process may hold the store open (its shared lock
    /// is there, or cannot be ruled out): such a reader reads files it opened long
    /// ago, so none may be rewritten in place meanwhile (a spare segment recycled,
    /// an emptied one cut back). A reader that opens after this answers no sees only
    /// files a durable superblock names. The default, yes, is the safe answer for a
    /// file system that cannot tell (a wrapper should ask what it wraps).
    fn readers_present(&self) -> bool {
        true
    }
    /// How long the work that frees space (a checkpoint, a drop, a clean: a thread
    /// holding a reserve allowance) waits, writing again, for a full disk to get
    /// room once the reserve is spent, before it fails (a failed checkpoint poisons
    /// the store). Another process filling the disk for a moment (a copy, a log
    /// burst) is then a pause, not a store stuck until restarted. The default, none,
    /// is the simulated file system's, whose capacity changes only when a test says.
    fn full_disk_patience(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
    /// Whether `VFile::sync`s of different files may run on several threads at once,
    /// so that their waits overlap (a real file system). The default, no, keeps one
    /// order of operations: the simulated file system's, which must replay the same
    /// way from the same seed.
    fn syncs_overlap(&self) -> bool {
        false
    }
    /// The bytes the file system holding the store can still give it, if known: how
    /// soon data must be checkpointed for the space it overwrote to come back
    /// (`Segments::data_checkpoint_bytes`).
    fn free_bytes(&self) -> Option<u64> {
        None
    }
}

/// The two kinds of store lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockKind {
    /// The one writing process of a store (a writable open).
    Writer,
    /// A read-only open; any number of them, beside the writer.
    Reader,
}

/// A held store lock.
pub trait StoreLock: Send + Sync {
    /// Writer only: tells readers in other processes that every log record up to
    /// `lsn` is durable (they replay no further). Called after each log sync, before
    /// the commits it covers are acknowledged.
    fn publish_synced(&self, lsn: u64) -> io::Result<()>;
}
