//! Buffers for large direct writes, mapped on their own and backed by huge pages.
//!
//! A direct write goes to the device from the buffer's own pages, one segment per
//! physically contiguous run, and a virtio disk takes at most 254 segments a
//! request. From 4 KiB pages that caps a request under 1 MiB, and this machine's
//! disk then writes 1 MiB sequential streams at about half its rate (203 against 400
//! MB/s, BENCHMARKS.md, "Huge pages for buffers, not for the heap"). From 2 MiB
//! pages a request carries up to the device's 4 MiB.
//!
//! The heap is kept off huge pages instead (the binary's allocator is built without
//! them, and `serve` asks the kernel to give them only where advised): a heap page's
//! first touch, by a writer under the writer lock, zeroed (and, where advised,
//! compacted for) 2 MiB at once, 3 to 5 ms that a snapshot asked for meanwhile
//! waited. So huge pages go where they pay and are touched once: these buffers,
//! which their owners keep and reuse (the server's payload buffers, an import's
//! chunk, a stream's staging buffer).

use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// A huge page, the unit the kernel backs an advised mapping with.
const HUGE_PAGE: usize = 2 << 20;

/// The base page size (every mapping's alignment and length granularity).
const PAGE: usize = 4096;

/// Zero-filled, page-aligned anonymous memory of a fixed capacity, its own mapping
/// (none for an empty one, the default). Mappings of a huge page or more start on a
/// huge-page boundary and are advised (`MADV_HUGEPAGE`), so whole 2 MiB pieces of
/// them fault in as huge pages.
pub(crate) struct Pages {
    /// Start of the mapping, page-aligned (huge-page-aligned from `HUGE_PAGE` up);
    /// dangling when nothing is mapped.
    ptr: NonNull<u8>,
    /// Bytes mapped from `ptr`, a multiple of `PAGE` (0: no mapping).
    mapped: usize,
    /// Bytes the buffer shows (`<= mapped`).
    len: usize,
}

// SAFETY: `Pages` owns its mapping exclusively, like a `Box<[u8]>`: shared
// references give only `&[u8]`, and nothing else points into it.
#[allow(unsafe_code, reason = "an owned mapping is Send and Sync: see SAFETY")]
unsafe impl Send for Pages {}
// SAFETY: as for `Send`.
#[allow(unsafe_code, reason = "an owned mapping is Send and Sync: see SAFETY")]
unsafe impl Sync for Pages {}

impl Pages {
    /// `len` zero bytes, in whole pages. Out of address space is handled like any
    /// failed allocation ([`std::alloc::handle_alloc_error`]).
    pub(crate) fn zeroed(len: usize) -> Pages {
        if len == 0 {
            return Pages::default();
        }
        // (A length that cannot be rounded up to whole pages cannot be mapped either:
        // it fails like any other mapping, never maps less than `len`.)
        let mapped = len.checked_next_multiple_of(PAGE);
        let ptr = mapped.and_then(|mapped| match mapped >= HUGE_PAGE {
            true => map_huge(mapped),
            false => map(mapped),
        });
        let (Some(mapped), Some(ptr)) = (mapped, ptr) else {
            let layout = std::alloc::Layout::from_size_align(len, PAGE)
                .unwrap_or(std::alloc::Layout::new::<u8>());
            std::alloc::handle_alloc_error(layout)
        };
        Pages { ptr, mapped, len }
    }

    /// The bytes the buffer can show (its mapping, whole pages).
    pub(crate) fn capacity(&self) -> usize {
        self.mapped
    }

    /// Shows the first `len` bytes (at most [`capacity`](Self::capacity)); bytes
    /// shown again keep what was last written there.
    pub(crate) fn set_len(&mut self, len: usize) {
        assert!(len <= self.mapped, "Pages::set_len past the mapping");
        self.len = len;
    }
}

/// `len` bytes (a multiple of `PAGE`) of fresh anonymous memory.
fn map(len: usize) -> Option<NonNull<u8>> {
    // SAFETY: an anonymous private mapping at an address of the kernel's choosing
    // aliases nothing of ours; the result is checked before use.
    #[allow(unsafe_code, reason = "mmap of fresh anonymous memory: see SAFETY")]
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    NonNull::new(p.cast())
}

/// `len` bytes (a multiple of `PAGE`) of fresh anonymous memory starting on a
/// huge-page boundary, advised to be backed by huge pages: a mapping one huge page
/// longer, trimmed at both ends.
fn map_huge(len: usize) -> Option<NonNull<u8>> {
    let over = len.checked_add(HUGE_PAGE)?;
    let base = map(over)?.as_ptr();
    let head = base.align_offset(HUGE_PAGE).min(HUGE_PAGE);
    let start = base.wrapping_add(head);
    let tail = over - head - len;
    // SAFETY: both ranges lie inside the mapping just made, which nothing else
    // uses yet; what is left is `start..start + len`. The advice changes no
    // contents (best effort: a kernel without it leaves base pages).
    #[allow(
        unsafe_code,
        reason = "trimming and advising a fresh mapping: see SAFETY"
    )]
    unsafe {
        if head > 0 {
            libc::munmap(base.cast(), head);
        }
        if tail > 0 {
            libc::munmap(start.add(len).cast(), tail);
        }
        libc::madvise(start.cast(), len, libc::MADV_HUGEPAGE);
    }
    NonNull::new(start)
}

impl Default for Pages {
    /// An empty buffer, mapping nothing.
    fn default() -> Pages {
        Pages {
            ptr: NonNull::dangling(),
            mapped: 0,
            len: 0,
        }
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        if self.mapped == 0 {
            return;
        }
        // SAFETY: `ptr..ptr + mapped` is this buffer's own mapping, unmapped once,
        // here; no reference into it outlives `self`.
        #[allow(unsafe_code, reason = "unmapping our own mapping: see SAFETY")]
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.mapped);
        }
    }
}

impl Deref for Pages {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for reads of `mapped >= len` bytes for as long as
        // `self` lives (anonymous memory reads as zeros until written); when nothing
        // is mapped, `len` is 0 and `ptr` is dangling but aligned and non-null.
        #[allow(unsafe_code, reason = "a slice over our own mapping: see SAFETY")]
        unsafe {
            std::slice::from_raw_parts(self.ptr.as_ptr(), self.len)
        }
    }
}

impl DerefMut for Pages {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes this the only reference.
        #[allow(unsafe_code, reason = "a slice over our own mapping: see SAFETY")]
        unsafe {
            std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_zeroed_aligned_writable_and_sized() {
        for len in [
            0,
            1,
            4095,
            4096,
            70_000,
            HUGE_PAGE - 1,
            HUGE_PAGE,
            3 * HUGE_PAGE + 5,
        ] {
            let mut p = Pages::zeroed(len);
            assert_eq!(p.len(), len);
            assert!(p.capacity() >= len);
            assert_eq!(p.capacity() % PAGE, 0);
            if len > 0 {
                assert_eq!(p.as_ptr() as usize % PAGE, 0);
            }
            if len >= HUGE_PAGE {
                assert_eq!(p.as_ptr() as usize % HUGE_PAGE, 0, "len {len}");
            }
            assert!(p.iter().all(|&b| b == 0));
            for (i, b) in p.iter_mut().enumerate() {
                *b = i as u8;
            }
            let cap = p.capacity();
            p.set_len(cap);
            assert!(p[..len].iter().enumerate().all(|(i, &b)| b == i as u8));
            assert!(p[len..].iter().all(|&b| b == 0));
        }
    }

    /// The `VmFlags` line of the mapping holding `addr` (the kernel may have merged
    /// a buffer's mapping with a neighbour of the same kind), if the kernel shows
    /// `/proc/self/smaps`.
    fn vm_flags(addr: usize) -> Option<String> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let holds = |line: &str| {
            let range = line.split_whitespace().next().unwrap_or("");
            let Some((start, end)) = range.split_once('-') else {
                return false;
            };
            let hex = |h: &str| usize::from_str_radix(h, 16).ok();
            matches!((hex(start), hex(end)), (Some(s), Some(e)) if s <= addr && addr < e)
        };
        let entry = smaps.split('\n').skip_while(|l| !holds(l));
        let flags = entry.skip(1).find(|l| l.starts_with("VmFlags:"))?;
        Some(flags.to_owned())
    }

    #[test]
    fn large_buffers_are_mappings_advised_for_huge_pages() {
        let large = Pages::zeroed(2 * HUGE_PAGE + PAGE);
        let small = Pages::zeroed(16 * PAGE);
        if std::fs::metadata("/proc/self/smaps").is_err() {
            return; // no /proc here: a mapping's flags cannot be seen
        }
        let large_flags = vm_flags(large.as_ptr() as usize).expect("the large mapping");
        let small_flags = vm_flags(small.as_ptr() as usize).expect("the small mapping");
        // `hg`: MADV_HUGEPAGE. (Whether the kernel then finds free huge pages is its
        // business; what the buffer asks is ours.)
        assert!(
            large_flags.split_whitespace().any(|f| f == "hg"),
            "{large_flags}"
        );
        assert!(
            !small_flags.split_whitespace().any(|f| f == "hg"),
            "{small_flags}"
        );
    }

    #[test]
    fn buffers_move_between_threads() {
        let mut p = Pages::zeroed(HUGE_PAGE);
        p[7] = 7;
        let p = std::thread::spawn(move || {
            p[8] = 8;
            p
        })
        .join()
        .unwrap();
        assert_eq!((p[7], p[8]), (7, 8));
    }
}
