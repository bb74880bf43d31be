//! The chain of metadata blobs: loading it at open, and deciding what the next
//! checkpoint writes (a delta linked to the chain, or a new base).
//!
//! Loading follows `prev` links from the superblock's blob back to the base, then
//! applies the deltas forward. Every link is checked: each delta names the same base,
//! its `chain_len` is one more than its predecessor's, and the first delta's `prev` is
//! the base itself. `chain_len` strictly decreases along the walk and is at most
//! [`MAX_CHAIN_BLOBS`], so damaged bytes can neither loop nor run long.

use super::codec::{self, Blob, Link};
use super::Meta;
use crate::error::{Error, Result};
use crate::format::{BlockRef, SegmentId};
use crate::space::Segments;

/// The most deltas after a base; the next checkpoint writes a base instead. Together
/// with the byte rule (deltas add up to at most the base), it bounds what an open
/// reads: at most this many small blobs, about twice the base's bytes in all.
pub(crate) const MAX_CHAIN_BLOBS: u32 = 1024;

/// The blobs of one durable metadata chain.
#[derive(Clone, Debug, Default)]
pub(crate) struct Chain {
    /// The base first, then each delta, the newest last.
    pub blobs: Vec<BlockRef>,
}

impl Chain {
    /// A chain of one base blob.
    pub(crate) fn of_base(base: BlockRef) -> Chain {
        Chain { blobs: vec![base] }
    }

    /// The link a delta of `delta_len` bytes would carry, or `None` when the next
    /// blob should be a new base: the deltas since the base would outweigh it, or
    /// the chain is at its longest.
    pub(crate) fn next_link(&self, delta_len: usize) -> Option<Link> {
        let (base, tip) = (*self.blobs.first()?, *self.blobs.last()?);
        let chain_len = u32::try_from(self.blobs.len()).ok()?;
        let delta_bytes: u64 = self.blobs.iter().skip(1).map(|r| u64::from(r.len)).sum();
        let fits =
            chain_len <= MAX_CHAIN_BLOBS && delta_bytes + delta_len as u64 <= u64::from(base.len);
        fits.then_some(Link {
            chain_len,
            base,
            prev: tip,
        })
    }

    /// The segments holding any blob of the chain (never deleted while it is durable).
    pub(crate) fn segments(&self) -> impl Iterator<Item = SegmentId> + '_ {
        self.blobs.iter().map(|r| r.addr.segment())
    }

    /// The chain as it was when `tip` was its newest blob, if `tip` is in it.
    pub(crate) fn prefix_to(&self, tip: BlockRef) -> Option<Chain> {
        let end = self.blobs.iter().position(|r| *r == tip)?;
        Some(Chain {
            blobs: self.blobs.iter().take(end + 1).copied().collect(),
        })
    }
}

/// The back-reference manifest of the state whose chain is `chain` (its newest blob
/// last): that of the newest delta that set one, else the base's. Reads only the blobs
/// from the tip back to there, usually one (a checkpoint that wrote any node changed
/// the manifest).
pub(crate) fn backref_manifest(segments: &Segments, chain: &Chain) -> Result<Vec<u8>> {
    for &blob in chain.blobs.iter().rev() {
        match codec::decode(&segments.read(blob, "metadata")?)? {
            Blob::Base(meta) => return Ok(meta.backref_manifest),
            Blob::Delta(_, delta) => {
                if let Some(manifest) = delta.backref_manifest {
                    return Ok(manifest);
                }
            }
        }
    }
    Err(broken("a chain with no base".into()))
}

fn broken(detail: String) -> Error {
    Error::corrupted("metadata", detail)
}

/// Reads the chain whose newest blob is `tip` and rebuilds the metadata it describes.
pub(crate) fn load(segments: &Segments, tip: BlockRef) -> Result<(Meta, Chain)> {
    let mut deltas = Vec::new();
    let mut blobs = vec![tip];
    let mut at = tip;
    // What the blob at `at` must say: its chain length and base (unknown for the tip).
    let mut expect: Option<(u32, BlockRef)> = None;
    for _ in 0..=MAX_CHAIN_BLOBS {
        match codec::decode(&segments.read(at, "metadata")?)? {
            Blob::Base(mut meta) => {
                if let Some((n, base)) = expect {
                    if n != 0 || base != at {
                        return Err(broken(format!(
                            "blob {:?} is a base where the chain expects delta {n}",
                            at.addr
                        )));
                    }
                }
                for delta in deltas.into_iter().rev() {
                    meta.apply(delta)?;
                }
                blobs.reverse();
                return Ok((meta, Chain { blobs }));
            }
            Blob::Delta(link, delta) => {
                if link.chain_len > MAX_CHAIN_BLOBS {
                    return Err(broken(format!(
                        "chain length {} over the limit of {MAX_CHAIN_BLOBS}",
                        link.chain_len
                    )));
                }
                if let Some((n, base)) = expect {
                    if link.chain_len != n || link.base != base {
                        return Err(broken(format!(
                            "delta {:?} does not continue its chain (length {}, expected {n})",
                            at.addr, link.chain_len
                        )));
                    }
                }
                if link.chain_len == 1 && link.prev != link.base {
                    return Err(broken(format!(
                        "the first delta {:?} does not follow its base",
                        at.addr
                    )));
                }
                deltas.push(delta);
                expect = Some((link.chain_len - 1, link.base));
                at = link.prev;
                blobs.push(at);
            }
        }
    }
    Err(broken(format!(
        "no base within {MAX_CHAIN_BLOBS} blobs of {:?}",
        tip.addr
    )))
}
