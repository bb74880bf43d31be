//! The real file system backend: one directory, positional I/O, fdatasync.
//!
//! Every error names the operation and the file it failed on (`crate::error::FileError`),
//! and a name that is not a regular file is refused before it is opened.

use super::{lock_file, LockKind, StoreLock, VFile, Vfs, DIRECT_ALIGN};
use crate::error::{file_error, not_a_file};
use std::fs::{File, FileType, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// The store directory on the real file system.
#[derive(Debug, Clone)]
pub struct StdVfs {
    dir: PathBuf,
    /// Files are opened read-only and nothing is created, renamed or removed: a
    /// read-only open works without write permission and changes nothing.
    read_only: bool,
}

/// Raises this process's soft limit on open files to its hard limit, once. A store
/// keeps every segment file open (64 MiB each), and the soft limit many systems
/// start a shell with, 1024, would refuse to open a store past ~60 GiB (`Too many
/// open files`) while the hard limit (often 512Ki or more) allows it. The `cambium`
/// tool calls it at start; a program embedding the library decides for itself (the
/// limit is process-wide, inherited by children, and a program using `select` must
/// stay under 1024 descriptors). Best effort: where it fails, opens fail as before,
/// naming the file.
pub fn raise_open_file_limit() {
    static RAISED: std::sync::Once = std::sync::Once::new();
    RAISED.call_once(|| {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        #[allow(unsafe_code, reason = "getrlimit/setrlimit: see SAFETY")]
        // SAFETY: `lim` is a valid, writable rlimit for the duration of both calls,
        // which read or write nothing else.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
                lim.rlim_cur = lim.rlim_max;
                libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            }
        }
    });
}

impl StdVfs {
    /// A backend rooted at `dir`, which must exist.
    pub fn new(dir: impl AsRef<Path>) -> Self {
        StdVfs {
            dir: dir.as_ref().to_path_buf(),
            read_only: false,
        }
    }

    /// A backend that only reads the directory `dir`.
    pub fn read_only(dir: impl AsRef<Path>) -> Self {
        StdVfs {
            dir: dir.as_ref().to_path_buf(),
            read_only: true,
        }
    }

    /// Refuses a change to the directory on a read-only backend.
    fn check_writable(&self, op: &str, name: &str) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{op} {name}: the store is open read-only"),
            ));
        }
        Ok(())
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The directory, as named in errors about it.
    fn dir_name(&self) -> String {
        self.dir.display().to_string()
    }

    /// Opens `name` with `options` if it is a regular file (after following symbolic
    /// links). Anything else is refused with an error saying what it is: opened as it
    /// is, a directory fails with a bare "Is a directory", a dangling link with a bare
    /// "No such file or directory", and a FIFO can block.
    fn open_regular(&self, name: &str, options: &OpenOptions) -> io::Result<Arc<dyn VFile>> {
        let path = self.path(name);
        match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() => {}
            Ok(meta) => return Err(not_regular(name, &path, meta.file_type())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // The name may be there as a link whose target is not.
                return Err(match std::fs::read_link(&path) {
                    Ok(target) => not_a_file(
                        "open",
                        name,
                        io::ErrorKind::NotFound,
                        format!(
                            "is a symbolic link to {}, which does not exist",
                            target.display()
                        ),
                    ),
                    Err(_) => file_error("open", name, e),
                });
            }
            Err(e) => return Err(file_error("open", name, e)),
        }
        let file = options
            .open(&path)
            .map_err(|e| file_error("open", name, e))?;
        Ok(Arc::new(StdFile::new(file, name, path)))
    }
}

/// Opens `path` for direct writes, if this platform and file system allow it.
#[cfg(target_os = "linux")]
fn open_direct(path: &Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .ok()
}

#[cfg(not(target_os = "linux"))]
fn open_direct(_path: &Path) -> Option<File> {
    None
}

#[cfg(target_os = "linux")]
const EINVAL: i32 = libc::EINVAL;
#[cfg(not(target_os = "linux"))]
const EINVAL: i32 = 22;

/// The error for `name` (at `path`), found to be of type `ty`, not a regular file.
fn not_regular(name: &str, path: &Path, ty: FileType) -> io::Error {
    let what = if ty.is_dir() {
        "a directory"
    } else if ty.is_fifo() {
        "a FIFO"
    } else if ty.is_socket() {
        "a socket"
    } else if ty.is_block_device() {
        "a block device"
    } else if ty.is_char_device() {
        "a character device"
    } else {
        "something else"
    };
    let is = match std::fs::read_link(path) {
        Ok(target) => format!(
            "is a symbolic link to {}, which is {what}, not a regular file",
            target.display()
        ),
        Err(_) => format!("is {what}, not a regular file"),
    };
    let kind = if ty.is_dir() {
        io::ErrorKind::IsADirectory
    } else {
        io::ErrorKind::InvalidInput
    };
    not_a_file("open", name, kind, is)
}

/// A direct write of at least two of these goes out in pieces of about this size,
/// at most [`DIRECT_PIECES_MAX`] of them, each on its own thread: the disk takes
/// several writes in flight faster than one (on this kind of machine, 1.3–1.7 GB/s
/// for 8 MiB writes one at a time, 1.6–2.4 GB/s for 2–4 MiB ones two to four at a
/// time, `fio --direct=1 --ioengine=libaio`). An NBD stream of 1 MiB writes at QD8
/// went from 1.19–1.39 to 1.49–1.73 GB/s; pieces of 1 MiB or 512 KiB did worse
/// (BENCHMARKS.md, "Two landings' worth in flight").
const DIRECT_PIECE: usize = 2 << 20;
const DIRECT_PIECES_MAX: usize = 4;

struct StdFile {
    file: File,
    /// The file's name in the store directory, for errors.
    name: String,
    path: PathBuf,
    /// The same file opened for direct writes (`O_DIRECT`), at the first one; `None`
    /// inside when the file system refuses it (tmpfs, some FUSE mounts): direct
    /// writes then go through the page cache. Two descriptors of one file stay
    /// coherent: a direct write drops cached pages of its range, and `sync` on
    /// either descriptor flushes the file.
    direct: OnceLock<Option<File>>,
}

impl StdFile {
    fn new(file: File, name: &str, path: PathBuf) -> StdFile {
        StdFile {
            file,
            name: name.to_owned(),
            path,
            direct: OnceLock::new(),
        }
    }

    fn direct(&self) -> Option<&File> {
        self.direct.get_or_init(|| open_direct(&self.path)).as_ref()
    }

    /// `posix_fadvise`: a hint, whose failure changes nothing but what the OS
    /// caches, so it is ignored.
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
    fn advise(&self, offset: libc::off_t, len: libc::off_t, advice: libc::c_int) {
        #[allow(unsafe_code, reason = "a cache hint: see SAFETY")]
        // SAFETY: a system call on a descriptor this file owns, passing no pointers.
        let _ = unsafe { libc::posix_fadvise(self.file.as_raw_fd(), offset, len, advice) };
    }

    /// No such hints here.
    #[cfg(not(any(target_os = "linux", target_os = "android", target_os = "freebsd")))]
    fn advise(&self, _offset: libc::off_t, _len: libc::off_t, _advice: libc::c_int) {}

    /// One direct write (`write_direct_at`'s, or a piece of it).
    fn write_direct_piece(&self, direct: &File, buf: &[u8], offset: u64) -> io::Result<()> {
        match direct.write_all_at(buf, offset) {
            // Refused for alignment after all (a device with larger sectors, or a
            // short write that left the rest unaligned): the same bytes again, through
            // the page cache (rewriting what did land is harmless).
            Err(e) if e.raw_os_error() == Some(EINVAL) => self.write_all_at(buf, offset),
            other => other.map_err(|e| file_error("write", self.at(offset), e)),
        }
    }

    /// The name and the position, for an error at `offset`.
    fn at(&self, offset: u64) -> String {
        format!("{} at byte {offset}", self.name)
    }
}

impl VFile for StdFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| file_error("read", self.at(offset), e))
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file
            .write_all_at(buf, offset)
            .map_err(|e| file_error("write", self.at(offset), e))
    }
    fn write_direct_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        debug_assert!(
            (buf.as_ptr() as usize | buf.len()).is_multiple_of(DIRECT_ALIGN)
                && offset.is_multiple_of(DIRECT_ALIGN as u64),
            "unaligned direct write"
        );
        let Some(direct) = self.direct() else {
            return self.write_all_at(buf, offset);
        };
        if buf.len() >= 2 * DIRECT_PIECE {
            // A large write goes out in pieces at once (module docs of the constant).
            let pieces = buf.len().div_ceil(DIRECT_PIECE).min(DIRECT_PIECES_MAX);
            let piece = buf.len().div_ceil(pieces).next_multiple_of(DIRECT_ALIGN);
            return std::thread::scope(|scope| {
                let mut done = Ok(());
                let mut rest = Vec::new();
                for (i, part) in buf.chunks(piece).enumerate().skip(1) {
                    let at = offset + (i * piece) as u64;
                    let write = move || self.write_direct_piece(direct, part, at);
                    // No thread to be had (a limit reached): this piece in line.
                    match std::thread::Builder::new().spawn_scoped(scope, write) {
                        Ok(t) => rest.push(t),
                        Err(_) => done = done.and(self.write_direct_piece(direct, part, at)),
                    }
                }
                let first = self.write_direct_piece(direct, &buf[..piece], offset);
                rest.into_iter().fold(done.and(first), |done, t| {
                    let piece = t
                        .join()
                        .unwrap_or_else(|_| Err(io::Error::other("writer thread panicked")));
                    done.and(piece)
                })
            });
        }
        self.write_direct_piece(direct, buf, offset)
    }
    fn forget_cached(&self, offset: u64, len: u64) {
        if let (Ok(offset), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) {
            self.advise(offset, len, libc::POSIX_FADV_DONTNEED);
        }
    }
    fn reads_are_random(&self) {
        self.advise(0, 0, libc::POSIX_FADV_RANDOM);
    }
    fn will_need(&self, offset: u64, len: u64) {
        if let (Ok(offset), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) {
            self.advise(offset, len, libc::POSIX_FADV_WILLNEED);
        }
    }
    fn sync(&self) -> io::Result<()> {
        self.file
            .sync_data()
            .map_err(|e| file_error("sync", self.name.as_str(), e))
    }
    fn len(&self) -> io::Result<u64> {
        let meta = self
            .file
            .metadata()
            .map_err(|e| file_error("stat", self.name.as_str(), e))?;
        Ok(meta.len())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file
            .set_len(len)
            .map_err(|e| file_error("resize", format!("{} to {len} bytes", self.name), e))
    }
}

/// [`Vfs::full_disk_patience`] on a real file system: long enough for another
/// process's burst (a copy, a build) to end or be cleaned up, short of an NBD
/// client's request timeout (30 s for the kernel's).
const FULL_DISK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

impl Vfs for StdVfs {
    fn open(&self, name: &str) -> io::Result<Arc<dyn VFile>> {
        self.open_regular(name, OpenOptions::new().read(true).write(!self.read_only))
    }
    fn create(&self, name: &str) -> io::Result<Arc<dyn VFile>> {
        self.check_writable("create", name)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(self.path(name))
            .map_err(|e| file_error("create", name, e))?;
        Ok(Arc::new(StdFile::new(file, name, self.path(name))))
    }
    fn remove(&self, name: &str) -> io::Result<()> {
        self.check_writable("remove", name)?;
        let path = self.path(name);
        std::fs::remove_file(&path).map_err(|e| match std::fs::symlink_metadata(&path) {
            // A directory named like a store file (a spare's name, say): said so, as
            // an open says it, not as a bare "Is a directory".
            Ok(meta) if meta.is_dir() => not_regular(name, &path, meta.file_type()),
            _ => file_error("remove", name, e),
        })
    }
    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        self.check_writable("rename", from)?;
        std::fs::rename(self.path(from), self.path(to))
            .map_err(|e| file_error("rename", format!("{from} to {to}"), e))
    }
    fn exists(&self, name: &str) -> io::Result<bool> {
        self.path(name)
            .try_exists()
            .map_err(|e| file_error("stat", name, e))
    }
    fn list(&self) -> io::Result<Vec<String>> {
        let listing = |e| file_error("list", self.dir_name(), e);
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(listing)? {
            if let Some(name) = entry.map_err(listing)?.file_name().to_str() {
                names.push(name.to_owned());
            }
        }
        Ok(names)
    }
    fn sync_dir(&self) -> io::Result<()> {
        self.check_writable("sync", ".")?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| file_error("sync", self.dir_name(), e))
    }
    fn lock(&self, kind: LockKind) -> io::Result<Box<dyn StoreLock>> {
        lock_file::lock(&self.dir, kind)
    }
    fn lock_holder(&self) -> Option<u32> {
        lock_file::read_record(&self.dir).map(|(pid, _)| pid)
    }
    fn published_synced(&self) -> Option<u64> {
        lock_file::published_synced(&self.dir)
    }
    fn readers_present(&self) -> bool {
        lock_file::readers_present(&self.dir)
    }
    fn full_disk_patience(&self) -> std::time::Duration {
        FULL_DISK_PATIENCE
    }
    fn syncs_overlap(&self) -> bool {
        true
    }
    fn free_bytes(&self) -> Option<u64> {
        free_bytes_under(&self.dir)
    }
}

/// The bytes an unprivileged process can still allocate on the file system holding
/// `dir` (`statvfs`'s `f_bavail` blocks of `f_frsize` bytes).
#[cfg(unix)]
fn free_bytes_under(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: `statvfs` is a plain C struct, for which all zeroes is a valid value;
    // `path` is a valid NUL-terminated string and `stat` a live struct that
    // `statvfs` fills in; nothing is read from it unless the call succeeds.
    #[allow(unsafe_code, reason = "statvfs: see SAFETY")]
    let filled = unsafe {
        let mut stat: libc::statvfs = std::mem::zeroed();
        (libc::statvfs(path.as_ptr(), &mut stat) == 0).then_some(stat)
    };
    let stat = filled?;
    #[allow(
        clippy::useless_conversion,
        reason = "the fields' widths differ between targets"
    )]
    Some(u64::from(stat.f_bavail).saturating_mul(u64::from(stat.f_frsize)))
}

#[cfg(not(unix))]
fn free_bytes_under(_dir: &Path) -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::AlignedBuf;

    /// A direct write lands (or falls back to the page cache where the file system
    /// refuses `O_DIRECT`), and buffered reads see it even over pages they cached
    /// before it.
    #[test]
    fn direct_writes_are_read_back_through_the_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let vfs = StdVfs::new(dir.path());
        let file = vfs.create("f").unwrap();
        file.write_all_at(&[1; 3 * DIRECT_ALIGN], 0).unwrap();
        let mut cached = vec![0; 3 * DIRECT_ALIGN];
        file.read_exact_at(&mut cached, 0).unwrap();
        let mut buf = AlignedBuf::default();
        buf.extend_from_slice(&[2; DIRECT_ALIGN + 10]);
        buf.pad_to_alignment();
        file.write_direct_at(buf.as_slice(), DIRECT_ALIGN as u64)
            .unwrap();
        file.write_direct_at(buf.as_slice(), 8 * DIRECT_ALIGN as u64)
            .unwrap();
        file.sync().unwrap();
        assert_eq!(file.len().unwrap(), 10 * DIRECT_ALIGN as u64);
        let mut back = vec![0; 10 * DIRECT_ALIGN];
        file.read_exact_at(&mut back, 0).unwrap();
        let mut want = vec![1; DIRECT_ALIGN];
        want.extend_from_slice(&[2; DIRECT_ALIGN + 10]);
        want.resize(3 * DIRECT_ALIGN, 0);
        want.resize(8 * DIRECT_ALIGN, 0);
        want.extend_from_slice(&[2; DIRECT_ALIGN + 10]);
        want.resize(10 * DIRECT_ALIGN, 0);
        assert_eq!(back, want);
    }

    /// A large direct write goes out in pieces on several threads; every byte lands
    /// where it belongs, whatever the length (not a multiple of the piece).
    #[test]
    fn a_large_direct_write_in_pieces_lands_whole() {
        let dir = tempfile::tempdir().unwrap();
        let vfs = StdVfs::new(dir.path());
        let file = vfs.create("f").unwrap();
        let len = 3 * DIRECT_PIECE + 5 * DIRECT_ALIGN;
        let mut buf = AlignedBuf::default();
        let data: Vec<u8> = (0..len)
            .map(|i| (i / DIRECT_ALIGN) as u8 ^ (i as u8))
            .collect();
        buf.extend_from_slice(&data);
        let at = 2 * DIRECT_ALIGN as u64;
        file.write_direct_at(buf.as_slice(), at).unwrap();
        file.sync().unwrap();
        assert_eq!(file.len().unwrap(), at + len as u64);
        let mut back = vec![0; len];
        file.read_exact_at(&mut back, at).unwrap();
        assert!(back == data);
    }
}
