//! Volumes as NBD exports: every volume and volume snapshot of a store, under its
//! name, looked up at each handshake (so one made while serving is exported at once).
//! Snapshots are read-only exports.
//!
//! Durability follows NBD's rules: a write is answered once it is committed and
//! visible to every connection (a `Deferred` commit); a flush, or a write with FUA,
//! is answered once everything answered before it is durable (one WAL fsync after
//! the segments holding the blocks).
//!
//! Serving a store's volumes from a program of one's own, as `cambium serve` does:
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use cambium::nbd::{Listen, Server, ServerOptions};
//! use cambium::volume::{export::VolumeExports, Volume};
//! use std::sync::Arc;
//! let dir = tempfile::tempdir()?;
//! let store = cambium::Store::create(dir.path().join("store"))?;
//! Volume::create(&store, "disk", 64 << 20, 4096)?;
//! let server = Server::bind(
//!     &Listen::Unix(dir.path().join("nbd.sock")),
//!     ServerOptions::default(),
//! )?;
//! // Clients connect to nbd+unix:///disk?socket=<dir>/nbd.sock until stopped.
//! let stop = server.shutdown_handle();
//! let serving = std::thread::spawn(move || server.run(Arc::new(VolumeExports::new(store))));
//! stop.shutdown(); // from a signal handler, say
//! serving.join().expect("server thread")?;
//! # Ok(()) }
//! ```

use super::{Run, Volume, WrittenAhead};
use crate::error::Error;
use crate::nbd::{
    Errno, Export, ExportError, Exports, Extent, Flusher, PendingWrite, Writer, ZeroFlags,
};
use crate::options::Durability;
use crate::store::Store;
use std::sync::Arc;

/// What [`VolumeExports::on_failure`] calls: the volume's name and the error.
pub type FailureHook = Arc<dyn Fn(&str, &Error) + Send + Sync>;

/// The volumes of one store, as NBD exports.
pub struct VolumeExports {
    store: Store,
    on_failure: Option<FailureHook>,
}

impl VolumeExports {
    /// Exports the volumes of `store`.
    pub fn new(store: Store) -> VolumeExports {
        VolumeExports {
            store,
            on_failure: None,
        }
    }

    /// Calls `hook` with every failure of the store a client is answered with (an
    /// I/O error, a disk full, a store that stopped taking writes after one), but
    /// not with a client's own mistakes (a write to a snapshot, a bad argument): a
    /// client sees only an errno, so this is how whoever runs the server learns
    /// why. `cambium serve` prints them, a repeated one at most every few seconds.
    pub fn on_failure(mut self, hook: FailureHook) -> VolumeExports {
        self.on_failure = Some(hook);
        self
    }
}

impl Exports for VolumeExports {
    fn list(&self) -> Result<Vec<String>, ExportError> {
        let names = Volume::names(&self.store).map_err(|e| to_nbd(e).0)?;
        Ok(names
            .into_iter()
            .map(|(name, _)| name)
            .filter(|name| !Volume::is_filling(&self.store, name))
            .collect())
    }

    /// The empty name (a client's default export) names the only volume, when
    /// there is exactly one.
    fn open(&self, name: &str) -> Result<Option<Box<dyn Export>>, ExportError> {
        let name = if name.is_empty() {
            match self.list()?.as_slice() {
                [only] => only.clone(),
                _ => return Ok(None),
            }
        } else {
            name.to_owned()
        };
        match Volume::open(&self.store, &name) {
            // An import is copying it in (or was, and was cut short): exported once
            // it is whole. Checked on the handle opened, so no import can start in
            // between. (An import marks its volume in the header it creates it with.)
            Ok(volume) if volume.is_incomplete() => Ok(None),
            Ok(volume) => Ok(Some(Box::new(VolumeExport {
                volume,
                on_failure: self.on_failure.clone(),
            }))),
            Err(Error::VolumeNotFound(_) | Error::InvalidVersionName(_)) => Ok(None),
            Err(e) => {
                let (error, failure) = to_nbd(e);
                if let (Some(hook), Some(e)) = (&self.on_failure, &failure) {
                    hook(&name, e);
                }
                Err(error)
            }
        }
    }
}

/// One connection's handle on a volume.
struct VolumeExport {
    volume: Volume,
    on_failure: Option<FailureHook>,
}

impl VolumeExport {
    /// The NBD error for `e`, reported to the failure hook if it is the store's.
    fn fail(&self, e: Error) -> ExportError {
        fail(&self.on_failure, self.volume.name(), e)
    }
}

/// The NBD error for `e`, reported to `hook` (as volume `name`'s) if it is the
/// store's.
fn fail(hook: &Option<FailureHook>, name: &str, e: Error) -> ExportError {
    let error = to_nbd(e);
    if let (Some(hook), Some(e)) = (hook, &error.1) {
        hook(name, e);
    }
    error.0
}

/// A volume's flushes, from the server's flush thread: a sync of the store, which
/// needs nothing of the connection's handle (it makes every commit so far durable,
/// whatever the volume).
struct VolumeFlusher {
    store: Store,
    name: String,
    on_failure: Option<FailureHook>,
}

impl Flusher for VolumeFlusher {
    fn flush(&mut self) -> Result<(), ExportError> {
        self.store
            .sync()
            .map_err(|e| fail(&self.on_failure, &self.name, e))
    }
}

/// A volume's large writes in two steps, from the server's lander threads: a
/// handle of its own on the volume (they are cheap).
struct VolumeWriter {
    volume: Volume,
    on_failure: Option<FailureHook>,
}

impl Writer for VolumeWriter {
    fn write_ahead(
        &self,
        offset: u64,
        data: &[u8],
    ) -> Result<Option<Box<dyn PendingWrite + '_>>, ExportError> {
        match self.volume.write_ahead(offset, data) {
            Ok(Some(written)) => Ok(Some(Box::new(VolumePendingWrite {
                written,
                writer: self,
            }))),
            Ok(None) => Ok(None),
            Err(e) => Err(fail(&self.on_failure, self.volume.name(), e)),
        }
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError> {
        self.volume
            .write_at(offset, data, durability(fua))
            .map_err(|e| fail(&self.on_failure, self.volume.name(), e))
    }
}

/// Blocks a [`VolumeWriter`] wrote ahead.
struct VolumePendingWrite<'w> {
    written: WrittenAhead<'w>,
    writer: &'w VolumeWriter,
}

impl PendingWrite for VolumePendingWrite<'_> {
    fn commit(self: Box<Self>, fua: bool) -> Result<(), ExportError> {
        let writer = self.writer;
        self.written
            .commit(durability(fua))
            .map_err(|e| fail(&writer.on_failure, writer.volume.name(), e))
    }
}

fn durability(fua: bool) -> Durability {
    if fua {
        Durability::Immediate
    } else {
        Durability::Deferred
    }
}

impl Export for VolumeExport {
    fn size(&self) -> u64 {
        self.volume.size()
    }

    fn read_only(&self) -> bool {
        self.volume.is_read_only()
    }

    fn block_size(&self) -> u32 {
        self.volume.block_size()
    }

    fn read(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        self.volume.read_at(offset, buf).map_err(|e| self.fail(e))
    }

    fn write(&mut self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError> {
        self.volume
            .write_at(offset, data, durability(fua))
            .map_err(|e| self.fail(e))
    }

    fn write_batch(&mut self, writes: &[(u64, &[u8])], fua: bool) -> Result<(), ExportError> {
        self.volume
            .write_many(writes, durability(fua))
            .map_err(|e| self.fail(e))
    }

    fn flush(&mut self) -> Result<(), ExportError> {
        self.volume.sync().map_err(|e| self.fail(e))
    }

    fn flusher(&self) -> Option<Box<dyn Flusher>> {
        Some(Box::new(VolumeFlusher {
            store: self.volume.store.clone(),
            name: self.volume.name().to_owned(),
            on_failure: self.on_failure.clone(),
        }))
    }

    fn writer(&self) -> Option<Box<dyn Writer>> {
        // (A snapshot's writes are refused before they could land.)
        if self.volume.is_read_only() {
            return None;
        }
        Some(Box::new(VolumeWriter {
            volume: self.volume.clone(),
            on_failure: self.on_failure.clone(),
        }))
    }

    fn trim(&mut self, offset: u64, len: u64, fua: bool) -> Result<(), ExportError> {
        self.volume
            .trim(offset, len, durability(fua))
            .map_err(|e| self.fail(e))
    }

    /// Zeroes are holes here, so a fast zero is always fast and NO_HOLE changes
    /// nothing a client can see.
    fn write_zeroes(&mut self, offset: u64, len: u64, flags: ZeroFlags) -> Result<(), ExportError> {
        self.volume
            .write_zeroes(offset, len, durability(flags.fua))
            .map_err(|e| self.fail(e))
    }

    fn block_status(
        &mut self,
        offset: u64,
        len: u64,
        max_extents: usize,
    ) -> Result<Vec<Extent>, ExportError> {
        let runs = self
            .volume
            .allocation(offset, len, max_extents)
            .map_err(|e| self.fail(e))?;
        Ok(runs
            .into_iter()
            .map(|Run { len, allocated }| Extent {
                len,
                hole: !allocated,
                zero: !allocated,
            })
            .collect())
    }
}

/// The NBD error for an engine error, and the error itself if it is the store's
/// failure rather than the client's (EIO and ENOSPC).
fn to_nbd(e: Error) -> (ExportError, Option<Error>) {
    let errno = match &e {
        Error::ReadOnly(_) => Errno::Perm,
        Error::InvalidArgument(_) => Errno::Inval,
        Error::Io(io) if io.kind() == std::io::ErrorKind::StorageFull => Errno::NoSpc,
        Error::VolumeNotFound(_) | Error::VersionNotFound(_) => Errno::Shutdown,
        _ => Errno::Io,
    };
    let error = ExportError::new(errno, e.to_string());
    match errno {
        Errno::Io | Errno::NoSpc => (error, Some(e)),
        _ => (error, None),
    }
}
