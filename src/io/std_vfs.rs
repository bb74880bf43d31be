//! The real file system backend: one directory, positional I/O, fdatasync.

use super::{lock_file, LockKind, StoreLock, VFile, Vfs};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The store directory on the real file system.
#[derive(Debug, Clone)]
pub struct StdVfs {
    dir: PathBuf,
    /// Files are opened read-only and nothing is created, renamed or removed: a
    /// read-only open works without write permission and changes nothing.
    read_only: bool,
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
}

struct StdFile(File);

impl VFile for StdFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.0.read_exact_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(buf, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
}

impl Vfs for StdVfs {
    fn open(&self, name: &str) -> io::Result<Arc<dyn VFile>> {
        let file = OpenOptions::new()
            .read(true)
            .write(!self.read_only)
            .open(self.path(name))?;
        Ok(Arc::new(StdFile(file)))
    }
    fn create(&self, name: &str) -> io::Result<Arc<dyn VFile>> {
        self.check_writable("create", name)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(self.path(name))?;
        Ok(Arc::new(StdFile(file)))
    }
    fn remove(&self, name: &str) -> io::Result<()> {
        self.check_writable("remove", name)?;
        std::fs::remove_file(self.path(name))
    }
    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        self.check_writable("rename", from)?;
        std::fs::rename(self.path(from), self.path(to))
    }
    fn exists(&self, name: &str) -> io::Result<bool> {
        self.path(name).try_exists()
    }
    fn list(&self) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            if let Some(name) = entry?.file_name().to_str() {
                names.push(name.to_owned());
            }
        }
        Ok(names)
    }
    fn sync_dir(&self) -> io::Result<()> {
        self.check_writable("sync", ".")?;
        File::open(&self.dir)?.sync_all()
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
}
