//! Filling a volume from a stream of bytes (an image import), with the input's
//! reading, the data's writing and the blocks' mapping overlapped.
//!
//! One piece at a time, the three steps take turns: the disk waits while the input
//! is read and while a transaction maps the blocks in, and the input waits while
//! the disk writes. Here each runs on its own thread, a piece apart: the caller's
//! thread reads the next piece while a **writer** writes the blocks of one
//! ([`Volume::write_ahead`], out of sight) and a **committer** maps in the one
//! before ([`WrittenAhead::commit`]), in order, as an NBD server's lander does for
//! a stream of large writes. (The input stays on the caller's thread: stdin's lock
//! may not move to another.) Pieces are [`FILL_PIECE_BYTES`], read into page-aligned
//! buffers that go back to the reading side once written, so that a piece's blocks go
//! to disk from where they were read (one direct write, no copy).

use super::blocks::is_zero;
use super::{Volume, WrittenAhead};
use crate::error::Error;
use crate::io::AlignedBuf;
use crate::options::Durability;
use std::io::{self, Read};
use std::sync::mpsc;

/// The bytes read, written and mapped as one piece: one direct write, at the disk's
/// pace (a 2 GiB image filled in 0.85-0.90 s with pieces of 2 MiB or 4 MiB, 1.0-1.7
/// s with 8 MiB ones, on this kind of machine), and the three in flight hold little
/// memory.
const FILL_PIECE_BYTES: usize = 2 << 20;

/// Why [`Volume::fill_from`] stopped short.
#[derive(Debug, thiserror::Error)]
pub enum FillError {
    /// Reading the input failed.
    #[error("{0}")]
    Read(#[source] io::Error),
    /// The input goes on past the volume's end, at this many bytes.
    #[error("it goes on past the volume's end ({0} bytes)")]
    TooLong(u64),
    /// Writing to the volume failed.
    #[error(transparent)]
    Write(#[from] Error),
}

/// What the writing thread hands the committer, in the input's order.
enum Step<'v> {
    /// Whole blocks on disk, to be mapped in.
    Ahead(WrittenAhead<'v>),
    /// Pieces that are not whole blocks of data (the input's last, partial block;
    /// any block of a volume whose blocks are stored inline), written in one step.
    Whole(Vec<(u64, Vec<u8>)>),
}

impl Volume {
    /// Writes everything `input` holds, from its start to its end, into this volume
    /// from offset 0, and returns the number of bytes read; `progress` hears the
    /// bytes written so far after each piece. For a volume being filled
    /// ([`Volume::create_filling`]), whose blocks are all holes: a block of zeroes
    /// in the input is not written, so it stays as it is (a hole). Input past the
    /// volume's end is [`FillError::TooLong`], after what fitted was written.
    ///
    /// The writes are deferred commits ([`Durability::Deferred`]): durable at the
    /// next sync, [`Volume::complete`]'s for an import. Reading, writing and mapping
    /// overlap (module docs), so an image in the page cache fills a volume at about
    /// the disk's pace.
    pub fn fill_from(
        &self,
        input: &mut dyn Read,
        progress: &mut dyn FnMut(u64),
    ) -> Result<u64, FillError> {
        std::thread::scope(|scope| {
            let thread =
                |role: &str| std::thread::Builder::new().name(format!("cambium-fill-{role}"));
            let no_thread = |e: io::Error| FillError::Write(Error::Io(e));
            let (to_commit, steps) = mpsc::sync_channel::<Step<'_>>(1);
            let committer = thread("committer")
                .spawn_scoped(scope, move || self.commit_steps(steps))
                .map_err(no_thread)?;
            let (to_write, pieces) = mpsc::sync_channel::<(u64, AlignedBuf)>(1);
            let (to_reuse, reusable) = mpsc::channel::<AlignedBuf>();
            // (Without a writer the committer ends when `to_commit` is dropped on
            // the way out.)
            let writer = thread("writer")
                .spawn_scoped(scope, move || {
                    self.write_pieces(&pieces, &to_reuse, &to_commit)
                })
                .map_err(no_thread)?;
            let read = self.read_pieces(input, &to_write, &reusable, progress);
            // The writer ends once it has every piece, the committer once it has
            // every step.
            drop(to_write);
            let written = writer
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            let committed = committer
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            // A step that failed stopped the steps behind it, and those the pieces
            // behind them: its error is the one to report.
            committed.map_err(FillError::Write).and(written).and(read)
        })
    }

    /// The reading side of [`Volume::fill_from`], on the caller's thread: hands the
    /// writer the input's pieces, each a full [`FILL_PIECE_BYTES`] but the last, in
    /// buffers that come back through `reusable`, until the input ends, a read fails,
    /// a piece would go past the volume's end, or the writer stops. Returns the
    /// bytes read and handed over.
    fn read_pieces(
        &self,
        input: &mut dyn Read,
        to_write: &mpsc::SyncSender<(u64, AlignedBuf)>,
        reusable: &mpsc::Receiver<AlignedBuf>,
        progress: &mut dyn FnMut(u64),
    ) -> Result<u64, FillError> {
        let mut offset = 0u64;
        loop {
            let mut buf = reusable.try_recv().unwrap_or_default();
            let n = read_full(input, &mut buf).map_err(FillError::Read)?;
            if n == 0 {
                return Ok(offset);
            }
            if offset + n as u64 > self.size() {
                return Err(FillError::TooLong(self.size()));
            }
            if to_write.send((offset, buf)).is_err() {
                // The writer stopped on an error, which `fill_from` reports.
                return Ok(offset);
            }
            offset += n as u64;
            progress(offset);
            if n < FILL_PIECE_BYTES {
                return Ok(offset);
            }
        }
    }

    /// The writing thread of [`Volume::fill_from`]: each piece's runs of whole
    /// blocks of data go to disk, and to the committer; its buffer back to the
    /// reading side.
    fn write_pieces<'v>(
        &'v self,
        pieces: &mpsc::Receiver<(u64, AlignedBuf)>,
        to_reuse: &mpsc::Sender<AlignedBuf>,
        to_commit: &mpsc::SyncSender<Step<'v>>,
    ) -> Result<(), FillError> {
        let bs = self.header.block_size as usize;
        for (offset, piece) in pieces {
            let bytes = piece.as_slice();
            // The piece's runs of whole blocks of data as one append and one commit
            // (an image whose zero blocks are scattered has many short runs), and the
            // partial last block, if any, on its own.
            let (mut runs, mut tail) = (Vec::new(), None);
            for (at, len) in data_runs(bytes, bs) {
                let run = (offset + at as u64, &bytes[at..at + len]);
                if len % bs == 0 {
                    runs.push(run);
                } else {
                    tail = Some(run);
                }
            }
            let mut steps = Vec::new();
            if !runs.is_empty() {
                steps.push(match self.write_many_ahead(&runs)? {
                    Some(written) => Step::Ahead(written),
                    None => Step::Whole(runs.iter().map(|&(o, d)| (o, d.to_vec())).collect()),
                });
            }
            if let Some((o, d)) = tail {
                steps.push(Step::Whole(vec![(o, d.to_vec())]));
            }
            for step in steps {
                if to_commit.send(step).is_err() {
                    // The committer failed; `fill_from` reports its error.
                    return Ok(());
                }
            }
            // (The reader may have stopped: then the buffer is simply freed.)
            let _ = to_reuse.send(piece);
        }
        Ok(())
    }

    /// The committer of [`Volume::fill_from`]: maps each step in, in order, until
    /// the steps end or one fails.
    fn commit_steps(&self, steps: mpsc::Receiver<Step<'_>>) -> crate::error::Result<()> {
        for step in steps {
            match step {
                Step::Ahead(written) => written.commit(Durability::Deferred)?,
                Step::Whole(pieces) => {
                    let writes: Vec<(u64, &[u8])> =
                        pieces.iter().map(|(o, d)| (*o, &d[..])).collect();
                    self.write_many(&writes, Durability::Deferred)?;
                }
            }
        }
        Ok(())
    }
}

/// Reads into `buf` until it holds [`FILL_PIECE_BYTES`] or the input ends; the
/// bytes read (`buf`'s length then).
fn read_full(input: &mut dyn Read, buf: &mut AlignedBuf) -> io::Result<usize> {
    buf.resize(FILL_PIECE_BYTES);
    let mut filled = 0;
    let result = loop {
        if filled == FILL_PIECE_BYTES {
            break Ok(filled);
        }
        match input.read(&mut buf.as_mut_slice()[filled..]) {
            Ok(0) => break Ok(filled),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => break Err(e),
        }
    };
    buf.resize(filled);
    result
}

/// The runs of `bytes` to write, as (start, length): the blocks of `bs` bytes that
/// are not all zeroes, neighbours joined, and the last partial block (if any, and
/// not zeroes) as a run of its own, since it is not a whole block.
fn data_runs(bytes: &[u8], bs: usize) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let whole = bytes.len() / bs * bs;
    for at in (0..whole).step_by(bs) {
        if is_zero(&bytes[at..at + bs]) {
            continue;
        }
        match runs.last_mut() {
            Some((start, len)) if *start + *len == at => *len += bs,
            _ => runs.push((at, bs)),
        }
    }
    if whole < bytes.len() && !is_zero(&bytes[whole..]) {
        runs.push((whole, bytes.len() - whole));
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    /// An image of `len` bytes: pieces of data, whole zero blocks and zero pieces
    /// (several pieces long, so the three threads all have work), a deterministic
    /// pattern.
    fn image(len: usize) -> Vec<u8> {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        (0..len)
            .map(|i| {
                let block = i / 4096;
                // Every third block zeroes, and all of the third piece.
                if block % 3 == 1 || i / FILL_PIECE_BYTES == 2 {
                    return 0;
                }
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// Reads its bytes in odd-sized bits (a pipe's short reads), then fails if told.
    struct Trickle<'a> {
        bytes: &'a [u8],
        fail_at: Option<usize>,
        at: usize,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.fail_at.is_some_and(|f| self.at >= f) {
                return Err(io::Error::other("the disk under the image went away"));
            }
            let n = buf.len().min(100_003).min(self.bytes.len() - self.at);
            buf[..n].copy_from_slice(&self.bytes[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
    }

    type Filled = (tempfile::TempDir, Store, Result<u64, FillError>);

    fn filled(size: u64, bytes: &[u8], fail_at: Option<usize>) -> Filled {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::create(dir.path()).unwrap();
        let (vol, _filling) = Volume::create_filling(&store, "img", size, 4096).unwrap();
        let mut seen = Vec::new();
        let mut input = Trickle {
            bytes,
            fail_at,
            at: 0,
        };
        let result = vol.fill_from(&mut input, &mut |n| seen.push(n));
        if result.is_ok() {
            assert!(
                seen.windows(2).all(|w| w[0] < w[1]),
                "progress goes forward"
            );
            assert_eq!(seen.last().copied(), Some(bytes.len() as u64));
        }
        (dir, store, result)
    }

    #[test]
    fn a_volume_filled_from_a_stream_reads_back_with_its_zero_blocks_as_holes() {
        // Four pieces and a bit, ending in a partial block.
        let len = 4 * FILL_PIECE_BYTES + 5000;
        let bytes = image(len);
        let size = (len as u64).next_multiple_of(4096);
        let (_dir, store, result) = filled(size, &bytes, None);
        assert_eq!(result.unwrap(), len as u64);
        let vol = Volume::open(&store, "img").unwrap();
        let mut back = vec![0xAA; size as usize];
        vol.read_at(0, &mut back).unwrap();
        assert!(back[..len] == bytes[..], "the volume holds the image");
        assert!(back[len..].iter().all(|&b| b == 0));
        // Zero blocks were never written: what is allocated is the data blocks.
        let data_blocks = bytes.chunks(4096).filter(|b| !is_zero(b)).count() as u64;
        assert_eq!(vol.allocated_bytes().unwrap(), data_blocks * 4096);
    }

    #[test]
    fn a_fill_stops_at_a_read_error_or_past_the_volumes_end() {
        let bytes = image(3 * FILL_PIECE_BYTES);
        let (_dir, _store, result) = filled(bytes.len() as u64, &bytes, Some(FILL_PIECE_BYTES + 7));
        assert!(matches!(result, Err(FillError::Read(_))), "{result:?}");
        let size = FILL_PIECE_BYTES as u64 + 4096;
        let (_dir, store, result) = filled(size, &bytes, None);
        assert!(
            matches!(result, Err(FillError::TooLong(s)) if s == size),
            "{result:?}"
        );
        // What fitted before the piece that did not is there.
        let vol = Volume::open(&store, "img").unwrap();
        let mut back = vec![0u8; FILL_PIECE_BYTES];
        vol.read_at(0, &mut back).unwrap();
        assert!(back[..] == bytes[..FILL_PIECE_BYTES]);
    }

    /// A disk that fails partway through a fill, then a power loss at a random
    /// point: the fill reports the failure, and after recovery the volume is still
    /// marked incomplete, every block reads as the image's or as zeroes (never as
    /// anything else), and `verify` is clean.
    #[test]
    fn a_fill_cut_short_by_a_failing_disk_and_a_power_loss_leaves_image_or_holes() {
        let len = 3 * FILL_PIECE_BYTES;
        let bytes = image(len);
        let mut failed = 0;
        for (seed, fail_after) in [(1u64, 1u64), (2, 2), (3, 3), (4, 5), (5, 8), (6, 1000)] {
            let (sim, store) = super::super::tests::sim_store();
            let (vol, _filling) = Volume::create_filling(&store, "img", len as u64, 4096).unwrap();
            sim.set_fail_after(Some(fail_after));
            let mut input = Trickle {
                bytes: &bytes,
                fail_at: None,
                at: 0,
            };
            // (A fill of three pieces makes a few writes: the larger counts let it
            // end first, and the power loss then comes after it.)
            match vol.fill_from(&mut input, &mut |_| {}) {
                Err(FillError::Write(_)) => failed += 1,
                Ok(n) => assert_eq!(n, len as u64),
                Err(e) => panic!("after {fail_after} operations: {e}"),
            }
            let after = sim.crash(seed);
            drop(vol);
            drop(store);
            let store = Store::open_with(
                "/sim",
                crate::options::Options {
                    vfs: Some(std::sync::Arc::new(after)),
                    ..crate::options::Options::default()
                },
            )
            .unwrap();
            let vol = Volume::open(&store, "img").unwrap();
            assert!(vol.is_incomplete(), "seed {seed}");
            let mut back = vec![0xAA; len];
            vol.read_at(0, &mut back).unwrap();
            for (i, (got, want)) in back.chunks(4096).zip(bytes.chunks(4096)).enumerate() {
                assert!(
                    got == want || is_zero(got),
                    "seed {seed}: block {i} is neither the image's nor a hole"
                );
            }
            assert!(store.verify().unwrap().is_clean(), "seed {seed}");
        }
        assert!(failed >= 3, "the disk failed only {failed} fills");
    }

    #[test]
    fn data_runs_skip_zero_blocks_and_keep_a_partial_tail_apart() {
        let bs = 4;
        let mut bytes = vec![0u8; 4 * 6 + 2];
        bytes[0] = 1; // block 0
        bytes[5] = 1; // block 1
        bytes[15] = 1; // block 3
        bytes[25] = 1; // the partial tail
        assert_eq!(data_runs(&bytes, bs), vec![(0, 8), (12, 4), (24, 2)]);
        assert!(data_runs(&[0u8; 9], bs).is_empty());
        assert_eq!(data_runs(&[1u8; 8], bs), vec![(0, 8)]);
    }
}
