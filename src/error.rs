//! Typed errors. Bytes from disk that fail validation are `Corrupted`; a broken
//! internal invariant is a bug and panics instead.

use std::io;

/// Everything that can go wrong in a cambium operation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An operating-system I/O error.
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
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
}
