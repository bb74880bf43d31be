//! Transactions (in progress).
#![allow(missing_docs, unused_variables, dead_code)]
use crate::Result;
pub struct WriteTxn<'s> { _s: std::marker::PhantomData<&'s ()> }
#[derive(Clone)]
pub struct ReadTxn {}
pub struct Iter {}
impl WriteTxn<'_> {
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> { unimplemented!() }
    pub fn commit(self) -> Result<()> { unimplemented!() }
}
impl ReadTxn {
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> { unimplemented!() }
    pub fn range<'k, R: std::ops::RangeBounds<&'k [u8]>>(&self, range: R) -> Result<Iter> { unimplemented!() }
}
impl Iterator for Iter { type Item = Result<(Vec<u8>, Vec<u8>)>; fn next(&mut self) -> Option<Self::Item> { None } }
