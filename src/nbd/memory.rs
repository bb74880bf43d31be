//! In-memory exports for tests and examples: each disk is a `Vec<u8>` behind
//! a mutex, with allocation tracked per 4 KiB block so block status reports
//! real holes (never-written, trimmed or hole-punched blocks).

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};

use super::{Export, ExportError, Exports, Extent, Flusher, ZeroFlags};

/// Allocation granularity.
pub const BLOCK: u64 = 4096;

/// A set of named in-memory disks; exports can be added while serving.
/// The default export "" is the alphabetically first one.
#[derive(Default)]
pub struct MemExports {
    disks: RwLock<BTreeMap<String, Arc<MemDisk>>>,
}

/// One in-memory disk, shared by all connections to it.
pub struct MemDisk {
    read_only: bool,
    size: u64,
    state: Mutex<State>,
    /// Flushes wait while this is set ([`MemDisk::hold_flushes`]); it counts those
    /// done too.
    flushes: Mutex<Flushes>,
    flushes_released: Condvar,
}

#[derive(Default)]
struct Flushes {
    held: bool,
    done: u64,
}

struct State {
    data: Vec<u8>,
    /// One flag per BLOCK; invariant: an unallocated block reads as zeroes.
    allocated: Vec<bool>,
    /// The largest single write since the last [`MemDisk::take_largest_write`]: how
    /// the server grouped what clients sent (tests).
    largest_write: usize,
}

impl MemExports {
    /// No exports.
    pub fn new() -> MemExports {
        MemExports::default()
    }

    /// Adds (or replaces) a zero-filled, fully unallocated disk.
    pub fn add(&self, name: &str, size: u64, read_only: bool) -> Arc<MemDisk> {
        let disk = Arc::new(MemDisk::new(size, read_only));
        let mut disks = self.disks.write().unwrap_or_else(|p| p.into_inner());
        disks.insert(name.to_owned(), Arc::clone(&disk));
        disk
    }

    /// The disk named `name`, if any.
    pub fn get(&self, name: &str) -> Option<Arc<MemDisk>> {
        let disks = self.disks.read().unwrap_or_else(|p| p.into_inner());
        if name.is_empty() {
            return disks.values().next().cloned();
        }
        disks.get(name).cloned()
    }
}

impl Exports for MemExports {
    fn list(&self) -> Result<Vec<String>, ExportError> {
        let disks = self.disks.read().unwrap_or_else(|p| p.into_inner());
        Ok(disks.keys().cloned().collect())
    }

    fn open(&self, name: &str) -> Result<Option<Box<dyn Export>>, ExportError> {
        Ok(self
            .get(name)
            .map(|disk| Box::new(MemHandle { disk }) as Box<dyn Export>))
    }
}

impl MemDisk {
    /// A zero-filled disk of `size` bytes.
    pub fn new(size: u64, read_only: bool) -> MemDisk {
        let blocks = size.div_ceil(BLOCK) as usize;
        MemDisk {
            read_only,
            size,
            state: Mutex::new(State {
                data: vec![0; size as usize],
                allocated: vec![false; blocks],
                largest_write: 0,
            }),
            flushes: Mutex::default(),
            flushes_released: Condvar::new(),
        }
    }

    /// Makes flushes wait (`true`) until released (`false`): a slow disk's sync, for
    /// tests of what a server does meanwhile.
    pub fn hold_flushes(&self, held: bool) {
        self.flushes().held = held;
        self.flushes_released.notify_all();
    }

    /// Flushes done so far.
    pub fn flushes_done(&self) -> u64 {
        self.flushes().done
    }

    fn flushes(&self) -> MutexGuard<'_, Flushes> {
        self.flushes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A flush: nothing to make durable, once flushes are not held.
    fn flush(&self) {
        let mut f = self.flushes();
        while f.held {
            f = (self.flushes_released.wait(f)).unwrap_or_else(|p| p.into_inner());
        }
        f.done += 1;
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The largest single write the export took since the last call (0: none).
    pub fn take_largest_write(&self) -> usize {
        std::mem::take(&mut self.state().largest_write)
    }

    /// A copy of the whole contents (for tests).
    pub fn contents(&self) -> Vec<u8> {
        self.state().data.clone()
    }

    /// Whether the block holding byte `offset` is allocated (for tests).
    pub fn is_allocated(&self, offset: u64) -> bool {
        let i = (offset / BLOCK) as usize;
        self.state().allocated.get(i).copied().unwrap_or(false)
    }
}

/// Byte range as slice indices; the server has already checked it is in range.
fn span(offset: u64, len: u64) -> std::ops::Range<usize> {
    offset as usize..(offset + len) as usize
}

/// Blocks touched by a range, and blocks wholly inside it.
fn blocks(offset: u64, len: u64) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
    let end = offset + len;
    let touched = (offset / BLOCK) as usize..end.div_ceil(BLOCK) as usize;
    let whole = offset.div_ceil(BLOCK) as usize..(end / BLOCK) as usize;
    (touched, whole)
}

impl State {
    fn zero(&mut self, offset: u64, len: u64, punch: bool, size: u64) {
        if let Some(d) = self.data.get_mut(span(offset, len)) {
            d.fill(0);
        }
        let (touched, mut whole) = blocks(offset, len);
        // The partial last block of the disk counts as whole if the range reaches the end.
        if offset + len == size && !size.is_multiple_of(BLOCK) {
            whole.end = touched.end;
        }
        if punch {
            if let Some(a) = self.allocated.get_mut(whole) {
                a.fill(false);
            }
        } else if let Some(a) = self.allocated.get_mut(touched) {
            a.fill(true);
        }
    }
}

struct MemHandle {
    disk: Arc<MemDisk>,
}

fn bad_range() -> ExportError {
    ExportError::inval("range outside disk")
}

/// A disk's flushes from the server's flush thread.
struct MemFlusher(Arc<MemDisk>);

impl Flusher for MemFlusher {
    fn flush(&mut self) -> Result<(), ExportError> {
        self.0.flush();
        Ok(())
    }
}

impl Export for MemHandle {
    fn size(&self) -> u64 {
        self.disk.size
    }
    fn read_only(&self) -> bool {
        self.disk.read_only
    }
    fn block_size(&self) -> u32 {
        BLOCK as u32
    }
    fn read(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        let st = self.disk.state();
        let src = st
            .data
            .get(span(offset, buf.len() as u64))
            .ok_or_else(bad_range)?;
        buf.copy_from_slice(src);
        Ok(())
    }
    fn write(&mut self, offset: u64, data: &[u8], _fua: bool) -> Result<(), ExportError> {
        let mut st = self.disk.state();
        let len = data.len() as u64;
        let dst = st.data.get_mut(span(offset, len)).ok_or_else(bad_range)?;
        dst.copy_from_slice(data);
        st.largest_write = st.largest_write.max(data.len());
        if let Some(a) = st.allocated.get_mut(blocks(offset, len).0) {
            a.fill(true);
        }
        Ok(())
    }
    fn flush(&mut self) -> Result<(), ExportError> {
        self.disk.flush();
        Ok(())
    }
    fn flusher(&self) -> Option<Box<dyn Flusher>> {
        Some(Box::new(MemFlusher(Arc::clone(&self.disk))))
    }
    fn trim(&mut self, offset: u64, len: u64, _fua: bool) -> Result<(), ExportError> {
        self.disk.state().zero(offset, len, true, self.disk.size);
        Ok(())
    }
    fn write_zeroes(&mut self, offset: u64, len: u64, f: ZeroFlags) -> Result<(), ExportError> {
        self.disk
            .state()
            .zero(offset, len, !f.no_hole, self.disk.size);
        Ok(())
    }
    fn block_status(
        &mut self,
        offset: u64,
        len: u64,
        max_extents: usize,
    ) -> Result<Vec<Extent>, ExportError> {
        let st = self.disk.state();
        let end = offset + len;
        let mut out: Vec<Extent> = Vec::new();
        let mut pos = offset;
        while pos < end {
            let allocated = st
                .allocated
                .get((pos / BLOCK) as usize)
                .copied()
                .unwrap_or(false);
            let next = ((pos / BLOCK + 1) * BLOCK).min(end);
            let full = out.len() >= max_extents;
            match out.last_mut() {
                Some(last) if last.hole != allocated => last.len += next - pos,
                _ if full => break,
                _ => out.push(Extent {
                    len: next - pos,
                    hole: !allocated,
                    zero: !allocated,
                }),
            }
            pos = next;
        }
        Ok(out)
    }
}
