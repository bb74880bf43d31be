//! The subtree totals `versions()` remembers, kept across processes in the file
//! `subtree-totals`, so that a command-line listing (one process per command) reads
//! only what changed since the last one instead of the whole store.
//!
//! The file is a hint, never needed for correctness: it is written at a clean close
//! (to a temporary name, then renamed) without an fsync, and anything that fails its
//! checksum or decoding is ignored. A written node's bytes and keys never change, so
//! those hold forever. The "one parent below" flags hold only for the state they were
//! computed on: the file is stamped with the durable superblock generation, and if a
//! checkpoint happened since (another process wrote without saving the file), every
//! flag is dropped on load. Writes since that checkpoint that were not checkpointed
//! are replayed from the WAL at open, through the write path that records the copies
//! of shared nodes, so the next listing clears their flags as usual.
//!
//! Layout (little-endian): magic `CMBSUBT\0` | version u32 = 1 | generation u64 |
//! count u64 | count × (addr u64, bytes u64, keys u64, single u8) | crc u32 (CRC-32C of
//! everything before it).

// A decoder of untrusted bytes: every index is justified where it is.
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

use crate::engine::{Shared, SubtreeTotals, WriterState};
use crate::error::Result;
use crate::format::{crc, put_u32, put_u64, put_u8, Addr, AddrMap, Decoder};
use crate::sync::lock;
use std::sync::MutexGuard;

/// The file's name in the store directory.
pub(crate) const FILE_NAME: &str = "subtree-totals";
const TMP_NAME: &str = "subtree-totals.tmp";
const MAGIC: &[u8; 8] = b"CMBSUBT\0";
const VERSION: u32 = 1;
/// Bytes of one entry.
const ENTRY: usize = 8 + 8 + 8 + 1;

/// Loads the file into the memo, if it is there and sound.
pub(crate) fn load(shared: &Shared) {
    let Ok(file) = shared.vfs.open(FILE_NAME) else {
        return;
    };
    let Ok(len) = file.len() else { return };
    let Ok(len) = usize::try_from(len) else {
        return;
    };
    let mut buf = vec![0; len];
    if file.read_exact_at(&mut buf, 0).is_err() {
        return;
    }
    let generation = shared.durable_generation();
    if let Ok(entries) = decode(&buf, generation) {
        let mut known = lock(&shared.subtree_totals);
        known.extend(entries);
    }
}

/// The memo, its "one parent below" flags brought up to date with the write path:
/// cleared for the shared nodes copied since the last call (`WriterState::unshared`),
/// every one if the write path stopped recording them. `with_writer` runs under the
/// writer lock, where the copies are taken. The memo's lock is taken first and held
/// on, so no other caller can read a flag taken from the writer but not yet cleared
/// (lock order: the memo, then the writer; nothing holding the writer lock waits
/// for the memo).
pub(crate) fn current<'s, T>(
    shared: &'s Shared,
    with_writer: impl FnOnce(&mut WriterState) -> T,
) -> (MutexGuard<'s, AddrMap<Addr, SubtreeTotals>>, T) {
    let mut known = lock(&shared.subtree_totals);
    let (unshared, overflowed, out) = {
        let mut w = shared.lock_writer();
        let unshared = std::mem::take(&mut w.unshared);
        let overflowed = std::mem::take(&mut w.unshared_overflowed);
        (unshared, overflowed, with_writer(&mut w))
    };
    if overflowed {
        known.clear();
    }
    for addr in unshared {
        if let Some(t) = known.get_mut(&addr) {
            t.single = false;
        }
    }
    (known, out)
}

/// Writes the memo to the file (a clean close). Best effort: an error leaves the old
/// file or none, either of which is fine.
pub(crate) fn save(shared: &Shared) -> Result<()> {
    let bytes = {
        // Up to date with the write path, so the file holds the state as of the last
        // checkpoint.
        let (known, ()) = current(shared, |_| ());
        if known.is_empty() {
            return Ok(());
        }
        encode(&known, shared.durable_generation())
    };
    if shared.vfs.exists(TMP_NAME)? {
        shared.vfs.remove(TMP_NAME)?;
    }
    let file = shared.vfs.create(TMP_NAME)?;
    file.write_all_at(&bytes, 0)?;
    shared.vfs.rename(TMP_NAME, FILE_NAME)?;
    Ok(())
}

fn encode(known: &AddrMap<Addr, SubtreeTotals>, generation: u64) -> Vec<u8> {
    let mut b = Vec::with_capacity(28 + known.len() * ENTRY);
    b.extend_from_slice(MAGIC);
    put_u32(&mut b, VERSION);
    put_u64(&mut b, generation);
    put_u64(&mut b, known.len() as u64);
    for (addr, t) in known {
        put_u64(&mut b, addr.0);
        put_u64(&mut b, t.bytes);
        put_u64(&mut b, t.keys);
        put_u8(&mut b, u8::from(t.single));
    }
    let c = crc(&b);
    put_u32(&mut b, c);
    b
}

/// The entries of a file, their flags dropped unless it was written at `generation`.
fn decode(buf: &[u8], generation: u64) -> Result<Vec<(Addr, SubtreeTotals)>> {
    let mut d = Decoder::new(buf, "subtree totals");
    let body_len = buf
        .len()
        .checked_sub(4)
        .ok_or_else(|| d.error("too short"))?;
    let (body, stored) = buf.split_at(body_len);
    let mut crc_bytes = Decoder::new(stored, "subtree totals");
    if crc(body) != crc_bytes.u32()? {
        return Err(d.error("checksum mismatch"));
    }
    if d.bytes(MAGIC.len())? != MAGIC || d.u32()? != VERSION {
        return Err(d.error("not a subtree-totals file of this version"));
    }
    let current = d.u64()? == generation;
    let count = usize::try_from(d.u64()?).map_err(|_| d.error("count"))?;
    if count.checked_mul(ENTRY) != Some(d.remaining().saturating_sub(4)) {
        return Err(d.error("count does not match the length"));
    }
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let addr = Addr(d.u64()?);
        let bytes = d.u64()?;
        let keys = d.u64()?;
        let single = match d.u8()? {
            0 => false,
            1 => current,
            f => return Err(d.error(format!("flag {f}"))),
        };
        out.push((
            addr,
            SubtreeTotals {
                bytes,
                keys,
                single,
            },
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> AddrMap<Addr, SubtreeTotals> {
        let mut m = AddrMap::default();
        for i in 0..5u64 {
            m.insert(
                Addr(100 + i),
                SubtreeTotals {
                    bytes: i * 1000,
                    keys: i,
                    single: i % 2 == 0,
                },
            );
        }
        m
    }

    #[test]
    fn round_trip_and_stale_flags() {
        let m = sample();
        let bytes = encode(&m, 7);
        let same: AddrMap<_, _> = decode(&bytes, 7).unwrap().into_iter().collect();
        for (a, t) in &m {
            let u = same[a];
            assert_eq!((u.bytes, u.keys, u.single), (t.bytes, t.keys, t.single));
        }
        // Another generation: bytes and keys kept, every flag dropped.
        for (a, u) in decode(&bytes, 8).unwrap() {
            assert!(!u.single);
            assert_eq!(u.bytes, m[&a].bytes);
        }
    }

    /// Copies of shared nodes past what the write path records (`UNSHARED_MAX`):
    /// no remembered flag can be trusted, in this process or, through the file
    /// written at close, the next.
    #[test]
    fn flags_are_dropped_when_the_write_path_stopped_recording_copies() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::Store::create(dir.path()).unwrap();
        let shared = store.shared();
        // Recorded copies clear their own flags.
        let flagged = Addr(100);
        lock(&shared.subtree_totals).extend(sample());
        shared.lock_writer().unshared.push(flagged);
        let (known, ()) = current(shared, |_| ());
        assert!(!known[&flagged].single);
        assert!(known[&Addr(102)].single, "others kept");
        drop(known);
        // Too many to record: nothing is kept, and the close saves no flag.
        shared.lock_writer().unshared_overflowed = true;
        save(shared).unwrap();
        if let Ok(saved) = shared.vfs.open(FILE_NAME) {
            let mut bytes = vec![0; saved.len().unwrap() as usize];
            saved.read_exact_at(&mut bytes, 0).unwrap();
            let entries = decode(&bytes, shared.durable_generation()).unwrap();
            assert!(entries.iter().all(|(_, t)| !t.single), "a stale flag saved");
        }
        assert!(lock(&shared.subtree_totals).is_empty());
    }

    #[test]
    fn every_truncation_and_flip_is_refused() {
        let bytes = encode(&sample(), 3);
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut], 3).is_err(), "cut {cut}");
        }
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x10;
            assert!(decode(&b, 3).is_err(), "flip {i}");
        }
    }
}
