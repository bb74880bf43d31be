//! The `cambium` command-line tool; see `cambium --help` and the README.

mod cli;

/// See the `mimalloc` feature in Cargo.toml: the engine's node buffers are 4-8 KiB
/// allocations made and freed at a high rate, which glibc's malloc serves slowly from
/// a heap a large load has fragmented.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    #[cfg(feature = "mimalloc")]
    allocator::keep_freed_memory();
    std::process::exit(cli::run());
}

/// How the binary's allocator gives memory back.
#[cfg(feature = "mimalloc")]
mod allocator {
    use std::ffi::{c_int, c_long};

    /// `mi_option_purge_delay` in mimalloc's `mi_option_e` (mimalloc.h; the same
    /// index in its v2 and v3): milliseconds before freed memory is returned to the
    /// system, -1 for never.
    const MI_OPTION_PURGE_DELAY: c_int = 15;

    #[allow(unsafe_code, reason = "mimalloc's option API: see SAFETY")]
    extern "C" {
        fn mi_option_set(option: c_int, value: c_long);
        #[cfg(test)]
        fn mi_option_get(option: c_int) -> c_long;
    }

    /// Keeps the memory the process frees for its own reuse instead of returning
    /// it to the system (the engine's memory is bounded by its caches and budgets,
    /// so the footprint is the peak of those). mimalloc returns it in bulk, pages
    /// unmapped by whichever thread allocates next: under a busy volume's writes
    /// that was the committer, holding the writer lock, for 6-20 ms at a time (a
    /// `perf` of `cambium serve`: `LeafBuf::clone` into `unmap_page_range`), and a
    /// snapshot asked for meanwhile waited as long. Stalls of a write over 5 ms in
    /// 80 snapshots under 4 KiB writes at QD32: 9-14 a run with purging, 2-4
    /// without.
    pub fn keep_freed_memory() {
        // SAFETY: sets one of mimalloc's options, a plain store it reads on its
        // next purge decision; any value is valid.
        #[allow(unsafe_code, reason = "see SAFETY")]
        unsafe {
            mi_option_set(MI_OPTION_PURGE_DELAY, -1);
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// The index names the purge delay: mimalloc's documented default is a
        /// positive delay, and setting it through the index reads back as -1.
        #[test]
        fn the_purge_delay_option_is_the_one_set() {
            // SAFETY: reads and sets mimalloc options.
            #[allow(unsafe_code, reason = "see SAFETY")]
            let (before, after) = unsafe {
                let before = mi_option_get(MI_OPTION_PURGE_DELAY);
                keep_freed_memory();
                (before, mi_option_get(MI_OPTION_PURGE_DELAY))
            };
            assert!(before > 0, "mimalloc's purge delay defaults to {before}");
            assert_eq!(after, -1);
        }
    }
}
