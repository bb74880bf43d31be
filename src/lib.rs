//! cambium: an embedded, crash-safe, copy-on-write versioned storage engine.
//!
//! A store is a directory. It holds a catalog of named versions (one branch, `main`,
//! to begin with), each a copy-on-write B+tree of byte-string keys and values.
//! Writes go through atomic transactions logged to a write-ahead log; a checkpoint
//! writes dirty tree nodes bottom-up into append-only segments and then flips the
//! superblock.
//!
//! ```
//! # fn main() -> cambium::Result<()> {
//! let dir = tempfile::tempdir()?;
//! let store = cambium::Store::create(dir.path().join("db"))?;
//!
//! let mut txn = store.begin_write()?;
//! txn.put(b"apple", b"red")?;
//! txn.put(b"banana", b"yellow")?;
//! txn.commit()?; // durable when it returns
//!
//! let read = store.read()?;
//! assert_eq!(read.get(b"apple")?, Some(b"red".to_vec()));
//! let keys: Vec<Vec<u8>> = read.range(..)?.map(|kv| kv.map(|(k, _)| k)).collect::<Result<_, _>>()?;
//! assert_eq!(keys, vec![b"apple".to_vec(), b"banana".to_vec()]);
//! # Ok(()) }
//! ```

#![deny(unsafe_code)]
#![warn(missing_docs)]
// Lint policy (docs/design.md, "Errors and invariants"): bytes from disk, the network
// or the user come back as typed errors, never an unwrap; a broken internal invariant
// is an `expect` or `assert!` that names it. Decoders of untrusted bytes deny indexing
// and justify each remaining index where it is (`#[allow(.., reason = ..)]`).
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
#![deny(clippy::dbg_macro, clippy::todo, clippy::unimplemented)]
#![deny(clippy::allow_attributes_without_reason)]

// The layers, bottom up (docs/design.md draws them). A module names only modules of
// its own group or of groups listed before it; `tests/layers.rs` checks this.
// Groups are kept apart by blank lines so that rustfmt does not reorder them.

// Codec vocabulary, errors, limits, options, files.
mod error;
mod format;
#[cfg(test)]
mod format_tests;
pub mod io;
mod limits;
mod options;
mod sync;

// Durable structures: segments and space accounting, the superblock, the log.
mod space;

mod backref;

mod superblock;

mod wal;

// Trees: nodes, reference counts, the page cache of decoded nodes, the CoW B+tree.
mod btree;

// The catalog of versions and the metadata chain.
mod catalog;
mod meta;

// The engine's shared state and its write kernel.
mod engine;

// Checkpoint, recovery and the commit protocol.
mod checkpoint;

mod recovery;

mod commit;

// Transactions, versions, and the checks.
mod txn;

mod subtree_memo;

mod versions;

// Who references a block; the cleaner: relocation for clean, defrag and shrink.
mod refs;

mod clean;

mod stats;

mod verify;

// The public facade.
mod store;

// Above the facade: the NBD protocol server (it names nothing of the engine), and
// thin block volumes (trees of blocks, built on the public API) with their exports.
pub mod nbd;

pub mod volume;

pub use catalog::{check_version_name, VersionKind, MAIN_BRANCH, MAX_VERSION_NAME_LEN};
pub use clean::CleanReport;
pub use error::{Error, Result};
pub use format::FORMAT_VERSION;
pub use limits::{
    check_key, check_value, prefix_successor, INLINE_VALUE_MAX, MAX_KEY_LEN, MAX_VALUE_LEN,
};
pub use options::{default_cache_bytes, default_dirty_bytes, Durability, Options};
pub use refs::{BlockAddress, BlockKind, BlockRefs};
pub use stats::Stats;
pub use store::Store;
pub use txn::{Iter, Keys, ReadTxn, WriteTxn};
pub use verify::VerifyReport;
pub use versions::{Change, Diff, VersionInfo};
