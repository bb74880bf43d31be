//! NBD (Network Block Device) server: serves the engine's exports to NBD
//! clients (qemu, libnbd tools, the Linux kernel, fio) over Unix or TCP
//! sockets, speaking fixed-newstyle NBD with structured replies and the
//! `base:allocation` metadata context.
//!
//! # Contents
//! - this file: the public interface — [`Exports`] / [`Export`] / [`Flusher`] /
//!   [`Writer`] / [`PendingWrite`] (what the engine implements), [`ExportError`] /
//!   [`Errno`], [`Extent`],
//!   [`ZeroFlags`], [`ServerOptions`], [`Listen`], and re-exports of
//!   [`Server`] / [`ShutdownHandle`].
//! - [`proto`]: wire constants and pure encode/decode functions.
//! - `server`: listener, connection registry, shutdown.
//! - `stream`: one socket (Unix or TCP) with an optional read deadline, and the
//!   adaptive polling of an idle connection.
//! - `handshake`: option haggling up to transmission.
//! - `transmission`: the request/reply loop.
//! - [`memory`]: an in-memory [`Exports`] for tests and examples.
//!
//! Protocol reference: <https://github.com/NetworkBlockDevice/nbd/blob/master/doc/proto.md>.
#![deny(unsafe_code)]

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

mod activity;
mod budget;
mod handshake;
pub mod memory;
pub mod proto;
mod server;
mod stream;
mod transmission;

#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod server_tests;
#[cfg(test)]
pub(crate) mod test_client;

pub use self::server::{Server, ShutdownHandle};

/// Why a request failed, as NBD tells the client (NBD errno values: EPERM 1,
/// EIO 5, ENOMEM 12, EINVAL 22, ENOSPC 28, EOVERFLOW 75, ENOTSUP 95,
/// ESHUTDOWN 108).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Errno {
    /// Operation not permitted (e.g. a write to a read-only export).
    Perm,
    /// Input/output error.
    Io,
    /// Out of memory; NBD says servers should avoid it.
    NoMem,
    /// Invalid argument (bad range, unknown command or flag).
    Inval,
    /// No space left (writes past the end, quota).
    NoSpc,
    /// Value too large.
    Overflow,
    /// Not supported (e.g. a write-zeroes with FAST_ZERO that cannot be fast).
    NotSup,
    /// The server is shutting down.
    Shutdown,
}

impl Errno {
    /// The value sent on the wire.
    pub fn code(self) -> u32 {
        match self {
            Errno::Perm => 1,
            Errno::Io => 5,
            Errno::NoMem => 12,
            Errno::Inval => 22,
            Errno::NoSpc => 28,
            Errno::Overflow => 75,
            Errno::NotSup => 95,
            Errno::Shutdown => 108,
        }
    }

    /// The inverse of [`Errno::code`]; `None` for values NBD does not define.
    pub fn from_code(code: u32) -> Option<Errno> {
        Some(match code {
            1 => Errno::Perm,
            5 => Errno::Io,
            12 => Errno::NoMem,
            22 => Errno::Inval,
            28 => Errno::NoSpc,
            75 => Errno::Overflow,
            95 => Errno::NotSup,
            108 => Errno::Shutdown,
            _ => return None,
        })
    }
}

/// A failed export operation: the errno the client sees, and a message
/// (sent to clients that negotiated structured replies, truncated to a
/// protocol-safe length).
#[derive(Clone, Debug)]
pub struct ExportError {
    /// What the client is told.
    pub errno: Errno,
    /// Human-readable detail.
    pub message: String,
}

impl ExportError {
    /// An error with the given errno and message.
    pub fn new(errno: Errno, message: impl Into<String>) -> ExportError {
        ExportError {
            errno,
            message: message.into(),
        }
    }
    /// EIO with a message.
    pub fn io(message: impl Into<String>) -> ExportError {
        ExportError::new(Errno::Io, message)
    }
    /// EINVAL with a message.
    pub fn inval(message: impl Into<String>) -> ExportError {
        ExportError::new(Errno::Inval, message)
    }
    /// EPERM with a message.
    pub fn perm(message: impl Into<String>) -> ExportError {
        ExportError::new(Errno::Perm, message)
    }
    /// ENOSPC with a message.
    pub fn no_space(message: impl Into<String>) -> ExportError {
        ExportError::new(Errno::NoSpc, message)
    }
    /// ENOTSUP with a message.
    pub fn not_supported(message: impl Into<String>) -> ExportError {
        ExportError::new(Errno::NotSup, message)
    }
    /// ESHUTDOWN with a message.
    pub fn shutdown(message: impl Into<String>) -> ExportError {
        ExportError::new(Errno::Shutdown, message)
    }
}

impl fmt::Display for ExportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.errno, self.message)
    }
}

impl std::error::Error for ExportError {}

impl From<std::io::Error> for ExportError {
    /// Maps an I/O error to the closest NBD errno (EIO unless clearly otherwise).
    fn from(e: std::io::Error) -> ExportError {
        use std::io::ErrorKind as K;
        let errno = match e.kind() {
            K::PermissionDenied | K::ReadOnlyFilesystem => Errno::Perm,
            K::InvalidInput => Errno::Inval,
            K::OutOfMemory => Errno::NoMem,
            K::StorageFull | K::QuotaExceeded | K::FileTooLarge => Errno::NoSpc,
            K::Unsupported => Errno::NotSup,
            _ => Errno::Io,
        };
        ExportError::new(errno, e.to_string())
    }
}

/// One run of an export's address space, for NBD_CMD_BLOCK_STATUS under
/// `base:allocation`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// Length in bytes (> 0).
    pub len: u64,
    /// Unallocated (reads as zero unless `zero` is false, per NBD).
    pub hole: bool,
    /// Known to read as zeroes.
    pub zero: bool,
}

/// Flags of a write-zeroes request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ZeroFlags {
    /// Durable before the reply.
    pub fua: bool,
    /// The client wants the range allocated (do not punch a hole).
    pub no_hole: bool,
    /// Fail with [`Errno::NotSup`] at once unless zeroing is fast.
    pub fast_zero: bool,
}

/// What the server exports: looked up by name at every handshake (so exports
/// made while serving are seen at once).
pub trait Exports: Send + Sync {
    /// The names NBD_OPT_LIST reports.
    fn list(&self) -> Result<Vec<String>, ExportError>;
    /// Opens an export for one connection; Ok(None) if there is no such
    /// name. The empty name "" is the client's "default export": the
    /// implementor decides what it means.
    fn open(&self, name: &str) -> Result<Option<Box<dyn Export>>, ExportError>;
}

/// One connection's handle on an export. Offsets and lengths passed in are
/// already checked by the server against size() (out-of-range requests get
/// EINVAL (or ENOSPC for writes past the end, per the NBD spec) without
/// calling these).
pub trait Export: Send {
    /// Size in bytes; fixed for the life of the handle.
    fn size(&self) -> u64;
    /// Whether writes, trims and write-zeroes are refused (EPERM).
    fn read_only(&self) -> bool;
    /// Preferred block size (a power of two, 512..=1 MiB), reported in
    /// NBD_INFO_BLOCK_SIZE.
    fn block_size(&self) -> u32;
    /// Fills `buf` from `offset`.
    fn read(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError>;
    /// Writes `data` at `offset`; durable before returning if `fua`.
    fn write(&mut self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError>;
    /// Writes several pipelined requests' data, in order (a later one wins where
    /// they overlap); durable before returning if `fua`. The server calls it with the
    /// writes a client already has in flight, so that an export can apply them at
    /// the cost of one (one transaction); on an error every one of them is answered
    /// with it. The default writes them one at a time.
    fn write_batch(&mut self, writes: &[(u64, &[u8])], fua: bool) -> Result<(), ExportError> {
        for &(offset, data) in writes {
            self.write(offset, data, fua)?;
        }
        Ok(())
    }
    /// Makes every write this export (any connection) has answered durable.
    fn flush(&mut self) -> Result<(), ExportError>;
    /// A handle that flushes as [`Export::flush`] does, from a thread of the
    /// server's own, so that a connection reads and applies the requests behind a
    /// flush while its sync is in flight (NBD lets a reply come in any order, and a
    /// flush covers only the writes answered before it). `None`, the default: the
    /// connection runs each flush in line and waits for it.
    fn flusher(&self) -> Option<Box<dyn Flusher>> {
        None
    }
    /// A handle that lands large writes in two steps ([`Writer`]), from threads of
    /// the server's own: a connection streaming large writes then puts one write's
    /// data on disk while the write before it is committed. `None`, the default:
    /// each large write is one [`Export::write`].
    fn writer(&self) -> Option<Box<dyn Writer>> {
        None
    }
    /// Discards a range (contents afterwards are unspecified until rewritten).
    fn trim(&mut self, offset: u64, len: u64, fua: bool) -> Result<(), ExportError>;
    /// Makes a range read as zeroes.
    fn write_zeroes(&mut self, offset: u64, len: u64, flags: ZeroFlags) -> Result<(), ExportError>;
    /// Allocation status from `offset`: runs covering at least one byte and
    /// at most `len` bytes, at most `max_extents` of them, in order,
    /// contiguous from `offset`.
    fn block_status(
        &mut self,
        offset: u64,
        len: u64,
        max_extents: usize,
    ) -> Result<Vec<Extent>, ExportError>;
}

/// Flushes an export from another thread than the connection's ([`Export::flusher`]).
pub trait Flusher: Send {
    /// Makes every write the export has answered durable, as [`Export::flush`].
    fn flush(&mut self) -> Result<(), ExportError>;
}

/// Lands an export's large writes in two steps ([`Export::writer`]): the data, then
/// the commit that makes the write part of the export. The server keeps each
/// connection's writes in order: it commits them in the order they came, and
/// answers each once committed.
pub trait Writer: Send + Sync {
    /// Puts the bytes of a write of `data` at `offset` on disk, out of sight until
    /// [`PendingWrite::commit`]. `Ok(None)` if this write cannot be split so:
    /// [`Writer::write`] it then.
    fn write_ahead(
        &self,
        offset: u64,
        data: &[u8],
    ) -> Result<Option<Box<dyn PendingWrite + '_>>, ExportError>;
    /// Writes `data` at `offset` in one step, as [`Export::write`].
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError>;
}

/// A write whose bytes are on disk ([`Writer::write_ahead`]). Dropped uncommitted,
/// it never happened.
pub trait PendingWrite: Send {
    /// Makes the write part of the export; durable before returning if `fua`.
    fn commit(self: Box<Self>, fua: bool) -> Result<(), ExportError>;
}

/// Limits of a [`Server`].
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// Connections served at once. Beyond it a new connection takes the place of
    /// the one idle the longest, if one has been idle `evict_idle_after`: one still
    /// in its handshake (a socket that never says a word) before any session
    /// (waiting for a request with every one before answered); otherwise it is
    /// closed at once. Default: as many idle connections (~2.6 MiB
    /// each: a thread's allocator arena on a huge page, its buffers) as fit in a
    /// sixteenth of the memory this process may use, between 16 and 256: 256 from
    /// about 11 GiB up, 24 at 1 GiB; 256 where the memory is not known.
    pub max_connections: usize,
    /// See `max_connections`. Default 100 ms (a client between two requests of a
    /// busy stream is idle for microseconds).
    pub evict_idle_after: Duration,
    /// A client that does not finish option haggling within this is dropped.
    /// Default 10 s.
    pub handshake_timeout: Duration,
    /// Largest read/write payload; larger requests get EINVAL (and writes
    /// whose payload cannot be skipped close the connection). Also reported
    /// as the maximum block size. Default 32 MiB.
    pub max_payload_bytes: u32,
    /// How long a connection may poll its socket for the next request before
    /// sleeping on it (the most; the window adapts to the client, and an idle
    /// connection does not poll). Saves a sleep and a wake-up per request at queue
    /// depth 1 for some CPU. Zero: never poll. Default 64 µs.
    pub poll_max: Duration,
    /// Memory for large payloads (writes and reads over 256 KiB) in flight on all
    /// connections together; at least one `max_payload_bytes` payload. Default: a
    /// sixteenth of the memory this process may use, between 256 MiB and 1 GiB.
    pub payload_budget_bytes: usize,
    /// How long a large request waits for room in that budget before it is answered
    /// ENOMEM. Default 10 s.
    pub payload_wait: Duration,
    /// A client that sends nothing for this long in the middle of a request (its
    /// payload, the rest of its header) is disconnected, and the request dropped
    /// unanswered; waiting between requests is not limited. Zero: never. Default 60 s.
    pub stall_timeout: Duration,
}

impl Default for ServerOptions {
    fn default() -> ServerOptions {
        ServerOptions {
            max_connections: default_max_connections(),
            evict_idle_after: Duration::from_millis(100),
            handshake_timeout: Duration::from_secs(10),
            max_payload_bytes: 32 << 20,
            poll_max: Duration::from_micros(64),
            payload_budget_bytes: default_payload_budget(),
            payload_wait: Duration::from_secs(10),
            stall_timeout: Duration::from_secs(60),
        }
    }
}

/// [`ServerOptions::max_connections`]'s default (see there): idle connections may
/// take about a sixteenth of the memory this process may use.
fn default_max_connections() -> usize {
    /// An idle connection's memory, measured (docs/design.md, "The allocator").
    const PER_CONNECTION: u64 = 2_700 << 10;
    match crate::options::usable_memory() {
        0 => 256,
        memory => usize::try_from((memory / 16 / PER_CONNECTION).clamp(16, 256)).unwrap_or(256),
    }
}

/// [`ServerOptions::payload_budget_bytes`]'s default.
fn default_payload_budget() -> usize {
    let bytes = (crate::options::usable_memory() / 16).clamp(256 << 20, 1 << 30);
    usize::try_from(bytes).unwrap_or(usize::MAX)
}

/// Where a [`Server`] listens.
#[derive(Clone, Debug)]
pub enum Listen {
    /// A Unix socket at this path.
    Unix(PathBuf),
    /// A TCP address, "ADDR:PORT" (port 0 picks a free one).
    Tcp(String),
}
