//! Public store handle (in progress).
#![allow(missing_docs, unused_variables, dead_code)]
use crate::{io::Vfs, ReadTxn, Result, Stats, VerifyReport, WriteTxn};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone)]
pub struct Options {
    pub cache_bytes: usize,
    pub checkpoint_wal_bytes: u64,
    pub checkpoint_dirty_bytes: u64,
    pub checkpoint_interval: Option<Duration>,
    pub background_checkpoints: bool,
    pub read_only: bool,
    pub checkpoint_on_close: bool,
    pub vfs: Option<Arc<dyn Vfs>>,
}
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Durability { #[default] Immediate, Deferred }
#[derive(Clone)]
pub struct Store {}
impl Store {
    pub fn create(dir: impl AsRef<Path>) -> Result<Store> { unimplemented!() }
    pub fn open(dir: impl AsRef<Path>) -> Result<Store> { unimplemented!() }
    pub fn begin_write(&self) -> Result<WriteTxn<'_>> { unimplemented!() }
    pub fn read(&self) -> Result<ReadTxn> { unimplemented!() }
    pub fn stats(&self) -> Result<Stats> { unimplemented!() }
    pub fn verify(&self) -> Result<VerifyReport> { unimplemented!() }
}
