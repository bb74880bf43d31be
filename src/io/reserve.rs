//! Space held back for deletes: a file of zeros (`reserve`) that a full disk gives
//! back to the work that frees space.
//!
//! On a full disk every write fails, including the ones that `drop`, the cleaner and
//! the checkpoints after them need (a WAL record, the metadata, moved blocks) in order
//! to free anything. So a store keeps up to [`RESERVE_BYTES`] allocated in a file of
//! its own, an eighth of its segment bytes between [`RESERVE_MIN_BYTES`] and
//! [`RESERVE_BYTES`] (so a small store is not dwarfed by it). [`ReserveVfs`] wraps the
//! store's file system: a write that fails with `StorageFull` on a thread that holds
//! an [`Allowance`] deletes the reserve file and is retried once. The work that frees
//! space takes one for as long as it runs: a drop and the reclamation of dropped
//! versions, a clean, defrag or shrink, a checkpoint asked for (`cambium
//! checkpoint`: it deletes the segments that emptied) or due for the data appended
//! since the last (the same), and a write of data that found the disk full making
//! room (`Store::make_room`). Checkpoints that free nothing (a close's, an
//! interval's) do not start on a disk short of room: on a disk some other process
//! filled, they would spend the reserve and leave none for the `drop` that makes
//! room. But every checkpoint, once begun, finishes on the reserve if the disk fills
//! under it: a failed checkpoint poisons the store. And since another process may
//! take the reserve's space once it is freed, such a write that still finds the disk
//! full waits for room, writing again, for up to [`Vfs::full_disk_patience`].
//!
//! The allowance belongs to a thread, not to the store: on a full disk a server's
//! clients go on writing while its checkpoint runs, and their data is what filled the
//! disk. If any write could take the reserve while some checkpoint ran, a client's
//! write would take it and the checkpoint that would have freed space would fail.
//! So ordinary writes never touch it: a full disk refuses a `put` or a block write,
//! but accepts the `drop` that makes room. [`Reserve::restore`] allocates the file
//! again if there is room: when the store is closed, after a clean, defrag or shrink,
//! and after a background checkpoint (else a later one tries again).

use super::{LockKind, StoreLock, VFile, Vfs};
use std::cell::Cell;
use std::io;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

/// The reserve file's name in the store directory.
pub const RESERVE_FILE: &str = "reserve";

/// The most bytes held back: room for a new WAL file, a checkpoint's metadata and
/// nodes, and a cleaning round's moves on a disk that is otherwise full.
pub const RESERVE_BYTES: u64 = 16 << 20;

/// The fewest bytes held back (a new store's reserve).
pub const RESERVE_MIN_BYTES: u64 = 1 << 20;

/// The reserve a store with `segment_bytes` of segments keeps: an eighth, rounded up
/// to whole MiB so that it changes only every 8 MiB of segment growth (every close
/// reallocates a reserve shorter than this, a write and an fsync of megabytes: with
/// an exact eighth, every `cambium put` paid ~10 ms for it).
pub fn reserve_for(segment_bytes: u64) -> u64 {
    (segment_bytes / 8)
        .next_multiple_of(1 << 20)
        .clamp(RESERVE_MIN_BYTES, RESERVE_BYTES)
}

/// The reserve's state, shared by the wrapper and the store.
pub struct Reserve {
    inner: Arc<dyn Vfs>,
}

thread_local! {
    /// The [`Allowance`]s this thread holds.
    static ALLOWANCES: Cell<usize> = const { Cell::new(0) };
}

/// Lets this thread's writes that hit a full disk use the reserve for as long as it
/// lives ([`allow`]). Not `Send`: it is the thread's.
pub struct Allowance(PhantomData<*const ()>);

/// Lets the calling thread's writes that hit a full disk use the reserve while the
/// returned [`Allowance`] lives: taken by the work that frees space, for as long as
/// it runs (module docs). Nests. Work handed to another thread takes its own there.
pub fn allow() -> Allowance {
    ALLOWANCES.with(|n| n.set(n.get() + 1));
    Allowance(PhantomData)
}

impl Drop for Allowance {
    fn drop(&mut self) {
        ALLOWANCES.with(|n| n.set(n.get() - 1));
    }
}

/// Runs `f` with the calling thread's [`Allowance`]s set aside: for writes made
/// ahead of need (zeros that keep a log from growing one record at a time, a new
/// file's preallocation), which a full disk should simply refuse. Spending the
/// reserve on them would leave the work that holds the allowance without it.
pub fn without<T>(f: impl FnOnce() -> T) -> T {
    struct Restore(usize);
    impl Drop for Restore {
        fn drop(&mut self) {
            ALLOWANCES.with(|n| n.set(self.0));
        }
    }
    let _restore = Restore(ALLOWANCES.with(|n| n.replace(0)));
    f()
}

/// Whether the calling thread holds an [`Allowance`].
pub fn allowed_here() -> bool {
    ALLOWANCES.with(Cell::get) > 0
}

impl Reserve {
    /// Gives the reserve back to a write that failed with `StorageFull`, if this
    /// thread may take it and it is still held. Returns whether the write should be
    /// retried.
    fn release(&self) -> bool {
        if !allowed_here() {
            return false;
        }
        match self.inner.remove(RESERVE_FILE) {
            // The removal need not be durable: a crash that brings the file back
            // brings back the space it held too.
            Ok(()) => true,
            Err(_) => false,
        }
    }

    /// [`Reserve::restore`] if the reserve file was taken (it is missing); a reserve
    /// still there is left as it is (growing it is for a close or a background
    /// checkpoint: an operation that frees space should not spend the space it freed).
    pub fn restore_if_taken(&self, bytes: u64) -> io::Result<bool> {
        if self.inner.exists(RESERVE_FILE)? {
            return Ok(true);
        }
        self.restore(bytes)
    }

    /// Allocates the reserve file again, `bytes` long, if it is missing or shorter and
    /// there is room. Returns whether the reserve is in place. A full disk is not an
    /// error: the partial file is removed (an older, shorter reserve is kept) and a
    /// later call retries.
    pub fn restore(&self, bytes: u64) -> io::Result<bool> {
        if self.inner.exists(RESERVE_FILE)? && self.inner.open(RESERVE_FILE)?.len()? >= bytes {
            return Ok(true);
        }
        let tmp = format!("{RESERVE_FILE}.tmp");
        if self.inner.exists(&tmp)? {
            self.inner.remove(&tmp)?;
        }
        // Through the file system beneath the wrapper: filling the reserve never
        // takes the reserve it replaces.
        let filled = (|| {
            let file = self.inner.create(&tmp)?;
            // Written, not just extended: a sparse file would hold nothing back.
            let chunk = vec![0u8; 1 << 20];
            let mut at = 0;
            while at < bytes {
                let n = chunk
                    .len()
                    .min(usize::try_from(bytes - at).unwrap_or(chunk.len()));
                file.write_all_at(&chunk[..n], at)?;
                at += n as u64;
            }
            file.sync()
        })();
        match filled {
            Ok(()) => {
                self.inner.rename(&tmp, RESERVE_FILE)?;
                self.inner.sync_dir()?;
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::StorageFull => {
                self.inner.remove(&tmp)?;
                Ok(false)
            }
            Err(e) => {
                let _ = self.inner.remove(&tmp);
                Err(e)
            }
        }
    }
}

/// A file system whose writes may use the reserve (see the module docs).
pub struct ReserveVfs {
    inner: Arc<dyn Vfs>,
    reserve: Arc<Reserve>,
}

impl ReserveVfs {
    /// Wraps `inner`; returns the wrapper and the reserve's handle.
    pub fn wrap(inner: Arc<dyn Vfs>) -> (Arc<dyn Vfs>, Arc<Reserve>) {
        let reserve = Arc::new(Reserve {
            inner: inner.clone(),
        });
        let vfs = Arc::new(ReserveVfs {
            inner,
            reserve: reserve.clone(),
        });
        (vfs, reserve)
    }

    fn file(&self, inner: Arc<dyn VFile>) -> Arc<dyn VFile> {
        Arc::new(ReserveFile {
            inner,
            reserve: self.reserve.clone(),
        })
    }
}

/// Runs `op`; on a full disk, on a thread that may use the reserve, releases it and
/// runs `op` again, then, while the disk stays full, again after pauses, for up to
/// [`Vfs::full_disk_patience`].
fn retry_full<T>(reserve: &Reserve, op: impl Fn() -> io::Result<T>) -> io::Result<T> {
    let mut waited = Duration::ZERO;
    let mut pause = Duration::from_millis(2);
    loop {
        match op() {
            Err(e) if e.kind() == io::ErrorKind::StorageFull && allowed_here() => {
                if reserve.release() {
                    continue;
                }
                if waited >= reserve.inner.full_disk_patience() {
                    return Err(e);
                }
                std::thread::sleep(pause);
                waited += pause;
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

/// [`retry_full`] for a sync: once after releasing the reserve, never after pauses. A
/// failed fsync may leave the pages it could not write marked clean, so a later one
/// can succeed without them: only a write issued again makes its bytes durable.
fn retry_sync_full(reserve: &Reserve, op: impl Fn() -> io::Result<()>) -> io::Result<()> {
    match op() {
        Err(e) if e.kind() == io::ErrorKind::StorageFull && reserve.release() => op(),
        other => other,
    }
}

struct ReserveFile {
    inner: Arc<dyn VFile>,
    reserve: Arc<Reserve>,
}

impl VFile for ReserveFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_exact_at(buf, offset)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        // Rewriting the same bytes at the same offset is idempotent, so a write that
        // failed part-way is simply issued again.
        retry_full(&self.reserve, || self.inner.write_all_at(buf, offset))
    }

    fn write_direct_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        retry_full(&self.reserve, || self.inner.write_direct_at(buf, offset))
    }

    fn forget_cached(&self, offset: u64, len: u64) {
        self.inner.forget_cached(offset, len);
    }

    fn reads_are_random(&self) {
        self.inner.reads_are_random();
    }

    fn will_need(&self, offset: u64, len: u64) {
        self.inner.will_need(offset, len);
    }

    fn sync(&self) -> io::Result<()> {
        retry_sync_full(&self.reserve, || self.inner.sync())
    }

    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        retry_full(&self.reserve, || self.inner.set_len(len))
    }
}

impl Vfs for ReserveVfs {
    fn open(&self, name: &str) -> io::Result<Arc<dyn VFile>> {
        Ok(self.file(self.inner.open(name)?))
    }

    fn create(&self, name: &str) -> io::Result<Arc<dyn VFile>> {
        let file = retry_full(&self.reserve, || self.inner.create(name))?;
        Ok(self.file(file))
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        self.inner.remove(name)
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        retry_full(&self.reserve, || self.inner.rename(from, to))
    }

    fn exists(&self, name: &str) -> io::Result<bool> {
        self.inner.exists(name)
    }

    fn list(&self) -> io::Result<Vec<String>> {
        self.inner.list()
    }

    fn sync_dir(&self) -> io::Result<()> {
        retry_sync_full(&self.reserve, || self.inner.sync_dir())
    }

    fn lock(&self, kind: LockKind) -> io::Result<Box<dyn StoreLock>> {
        self.inner.lock(kind)
    }

    fn lock_holder(&self) -> Option<u32> {
        self.inner.lock_holder()
    }

    fn published_synced(&self) -> Option<u64> {
        self.inner.published_synced()
    }

    fn readers_present(&self) -> bool {
        self.inner.readers_present()
    }

    fn full_disk_patience(&self) -> std::time::Duration {
        self.inner.full_disk_patience()
    }

    fn syncs_overlap(&self) -> bool {
        self.inner.syncs_overlap()
    }

    fn free_bytes(&self) -> Option<u64> {
        self.inner.free_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_size_moves_in_whole_mib_steps() {
        assert_eq!(reserve_for(0), RESERVE_MIN_BYTES);
        assert_eq!(reserve_for(24 << 20), 3 << 20);
        // A few KB of growth (one `put`) leaves the size, and so the file, alone.
        assert_eq!(reserve_for((24 << 20) + 5000), 4 << 20);
        assert_eq!(
            reserve_for((24 << 20) + 5000),
            reserve_for((24 << 20) + 90_000)
        );
        assert_eq!(reserve_for(1 << 40), RESERVE_BYTES);
    }
}
