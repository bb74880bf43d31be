//! Typed errors. Bytes from disk that fail validation are `Corrupted`; a broken
//! internal invariant is a bug and panics instead.
//!
//! I/O errors that say where: a bare `io::Error` ("Is a directory (os error 21)")
//! does not say which of a store's files is at fault, so the file system layer
//! (`io::StdVfs`) wraps every error it returns in a [`FileError`] naming the
//! operation and the file, inside an `io::Error` of the *same kind*: the layers
//! above branch on the kind (`StorageFull` gives the reserve back, `UnexpectedEof`
//! is a block past a segment's end, `NotFound` a missing run), so the kind must
//! survive the wrapping. (`raw_os_error` does not survive; nothing reads it.)
//!
//! A name that exists but is not a regular file (a directory, a dangling symbolic
//! link, a FIFO...) is its own cause ([`not_a_file`]): `Error::from` reports it as
//! damage to the store directory, not as an I/O failure.

use std::fmt;
use std::io;

/// Everything that can go wrong in a cambium operation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An operating-system I/O error. The store's own files report errors naming the
    /// operation and the file ("open seg-0000000a.dat: ...").
    #[error("I/O error: {0}")]
    Io(#[source] io::Error),
    /// Stored bytes failed a checksum or a structural check.
    #[error("corruption in {what}: {detail}")]
    Corrupted {
        /// Which structure: "node", "superblock", "wal", "extent", "metadata", ...
        what: &'static str,
        /// Where and how.
        detail: String,
    },
    /// The directory does not hold a cambium store.
    #[error("{0} is not a cambium store (no superblock)")]
    NotAStore(String),
    /// The directory does not exist.
    #[error("store directory {0} does not exist")]
    MissingStore(String),
    /// `create` on a directory that already holds a store.
    #[error("{0} already holds a cambium store")]
    AlreadyExists(String),
    /// The store was written by an incompatible format version.
    #[error("unsupported format version {found} (this build reads version {supported})")]
    FormatVersion {
        /// The version found on disk.
        found: u32,
        /// The version this build understands.
        supported: u32,
    },
    /// A key longer than `MAX_KEY_LEN` or empty.
    #[error("key of {len} bytes is invalid (keys are 1..={max} bytes)")]
    KeyTooLarge {
        /// The key's length.
        len: usize,
        /// The largest allowed key.
        max: usize,
    },
    /// A value longer than `MAX_VALUE_LEN`.
    #[error("value of {len} bytes is too large (max {max})")]
    ValueTooLarge {
        /// The value's length.
        len: usize,
        /// The largest allowed value.
        max: usize,
    },
    /// No version (branch or snapshot) of that name.
    #[error("no version named {0:?}")]
    VersionNotFound(String),
    /// No volume of that name: no version, or a version that is not a volume.
    #[error("no volume named {0:?}")]
    VolumeNotFound(String),
    /// A version of that name exists already.
    #[error("a version named {0:?} already exists")]
    VersionExists(String),
    /// A name that cannot name a version (see `check_version_name`).
    #[error("invalid version name {0}")]
    InvalidVersionName(String),
    /// A write to a read-only store handle or version.
    #[error("read-only: {0}")]
    ReadOnly(String),
    /// A bad argument to an API call.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// An earlier I/O error left memory and disk possibly disagreeing; the store
    /// refuses further writes until it is reopened (committed data is safe on disk).
    #[error("store is poisoned by an earlier I/O error ({0}); reopen it")]
    Poisoned(String),
    /// `drop` of the default branch, which commands and `Store::read`/`begin_write`
    /// use when no version is named.
    #[error(
        "cannot drop {0:?}: it is the default branch (used whenever no version is named); \
         to empty it, delete its keys, after a snapshot if you want to keep them"
    )]
    DefaultBranch(String),
    /// Another process writes to the store (it holds the writer lock); read-only
    /// opens work beside it.
    #[error("the store is in use by another process ({})", holder(*.pid))]
    Locked {
        /// The holder's process id, when the lock file names it.
        pid: Option<u32>,
    },
}

fn holder(pid: Option<u32>) -> String {
    pid.map_or_else(|| "its pid is unknown".to_owned(), |p| format!("pid {p}"))
}

/// `Result` with cambium's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An I/O error becomes `Io`, except one saying that a name in the store directory
/// is not a regular file (a directory named like a segment, a dangling link in
/// place of a WAL file): that is damage to the store's structure, reported like
/// other damage (`Corrupted`, which `verify` lists as a problem) rather than as an
/// I/O failure that a retry might cure.
impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        match not_a_file_description(&e) {
            Some(detail) => Error::corrupted("store directory", detail),
            None => Error::Io(e),
        }
    }
}

impl Error {
    pub(crate) fn corrupted(what: &'static str, detail: impl Into<String>) -> Self {
        Error::Corrupted {
            what,
            detail: detail.into(),
        }
    }

    /// Whether this error means stored bytes failed validation.
    pub fn is_corruption(&self) -> bool {
        matches!(self, Error::Corrupted { .. })
    }

    /// Whether this error is a full disk (or quota): freeing space (a drop, then a
    /// clean or a checkpoint) may make the operation succeed.
    pub fn is_storage_full(&self) -> bool {
        use std::io::ErrorKind as K;
        matches!(self, Error::Io(e) if matches!(e.kind(), K::StorageFull | K::QuotaExceeded))
    }
}

/// An I/O error on one file (or on the directory) of a store.
#[derive(Debug)]
pub(crate) struct FileError {
    /// What was being done: "open", "read", "write", "sync", "resize", ...
    op: &'static str,
    /// The file's name in the store directory (the directory's path for directory
    /// operations), and where in the file when that helps ("at byte 4096").
    name: String,
    cause: Cause,
}

#[derive(Debug)]
enum Cause {
    Os(io::Error),
    /// The name exists but is not a regular file: what it is, as a predicate of
    /// the name ("is a directory, not a regular file").
    NotAFile(String),
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.cause {
            Cause::Os(e) => write!(f, "{} {}: {e}", self.op, self.name),
            Cause::NotAFile(is) => write!(f, "{} {}: it {is}", self.op, self.name),
        }
    }
}

// The cause is part of the message, so it is not also returned as `source` (a
// reporter walking the chain would print it twice).
impl std::error::Error for FileError {}

/// `e`, from `op` on `name`, as an `io::Error` of the same kind that names both. An
/// error that already names its file is returned as it is.
pub(crate) fn file_error(op: &'static str, name: impl Into<String>, e: io::Error) -> io::Error {
    if e.get_ref().is_some_and(|inner| inner.is::<FileError>()) {
        return e;
    }
    io::Error::new(
        e.kind(),
        FileError {
            op,
            name: name.into(),
            cause: Cause::Os(e),
        },
    )
}

/// `op` on `name` refused because `name` is not a regular file; `is` says what it
/// is ("is a directory, not a regular file"). The kind is the closest the OS would
/// give: `NotFound` for a dangling link, `IsADirectory` for a directory,
/// `InvalidInput` for anything else.
pub(crate) fn not_a_file(
    op: &'static str,
    name: impl Into<String>,
    kind: io::ErrorKind,
    is: String,
) -> io::Error {
    io::Error::new(
        kind,
        FileError {
            op,
            name: name.into(),
            cause: Cause::NotAFile(is),
        },
    )
}

/// If `e` says that a store file is not a regular file: "NAME is ...".
pub(crate) fn not_a_file_description(e: &io::Error) -> Option<String> {
    let err = e.get_ref()?.downcast_ref::<FileError>()?;
    match &err.cause {
        Cause::NotAFile(is) => Some(format!("{} {is}", err.name)),
        Cause::Os(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_kind_and_names_the_file() {
        let e = file_error(
            "write",
            "wal-0000000000000002.log at byte 512",
            io::Error::from(io::ErrorKind::StorageFull),
        );
        assert_eq!(e.kind(), io::ErrorKind::StorageFull);
        let text = e.to_string();
        assert!(
            text.starts_with("write wal-0000000000000002.log at byte 512: "),
            "{text}"
        );
        assert_eq!(not_a_file_description(&e), None);
        // Wrapping twice names the file once.
        let again = file_error("sync", "other", e);
        assert_eq!(again.to_string(), text);
    }

    #[test]
    fn not_a_file_is_recognised() {
        let e = not_a_file(
            "open",
            "seg-0000000a.dat",
            io::ErrorKind::IsADirectory,
            "is a directory, not a regular file".into(),
        );
        assert_eq!(e.kind(), io::ErrorKind::IsADirectory);
        assert_eq!(
            e.to_string(),
            "open seg-0000000a.dat: it is a directory, not a regular file"
        );
        assert_eq!(
            not_a_file_description(&e).as_deref(),
            Some("seg-0000000a.dat is a directory, not a regular file")
        );
        assert_eq!(not_a_file_description(&io::Error::other("x")), None);
    }
}
