//! `verify`: the fsck. (Filled in below.)
use serde::Serialize;

/// What `verify` found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct VerifyReport {
    /// Versions walked.
    pub versions: u64,
    /// Tree nodes read and checked.
    pub nodes: u64,
    /// Out-of-line value extents read and checked.
    pub extents: u64,
    /// Keys seen (summed over versions).
    pub keys: u64,
    /// Bytes read and checksummed.
    pub bytes: u64,
    /// Valid WAL records past the checkpoint.
    pub wal_records: u64,
    /// Whether the WAL ended in a torn (ignored) record.
    pub wal_torn_tail: bool,
    /// Every problem found; empty means the store is clean.
    pub problems: Vec<String>,
}

impl VerifyReport {
    /// True when no problem was found.
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}
