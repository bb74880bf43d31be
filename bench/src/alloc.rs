//! The benchmark's global allocator: mimalloc (what the `cambium` binary uses) or the
//! system's (glibc's `malloc`), chosen once per process by the environment variable
//! [`ALLOC_ENV`] (`system` or `mimalloc`, the default). The parent passes
//! `--alloc` to every engine's child process through it, so all engines of a run
//! allocate alike, and a run with `--alloc system` measures them all on glibc.
//!
//! The choice is made at the process's first allocation, so no block is ever freed by
//! the other allocator: it reads the variable with `getenv`, which allocates nothing,
//! and every thread that races it reads the same value.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU8, Ordering};

/// The environment variable a child process reads its allocator from.
pub const ALLOC_ENV: &str = "CAMBIUM_BENCH_ALLOC";
const ALLOC_ENV_C: &std::ffi::CStr = c"CAMBIUM_BENCH_ALLOC";

const UNDECIDED: u8 = 0;
const MIMALLOC: u8 = 1;
const SYSTEM: u8 = 2;

static CHOICE: AtomicU8 = AtomicU8::new(UNDECIDED);

/// Whether this process allocates through the system allocator.
fn system() -> bool {
    let mut c = CHOICE.load(Ordering::Relaxed);
    if c == UNDECIDED {
        // SAFETY: `getenv` with a NUL-terminated name; the bench never sets
        // variables, so the returned string stays valid while it is read here.
        let v = unsafe { libc::getenv(ALLOC_ENV_C.as_ptr()) };
        let sys = !v.is_null() && unsafe { std::ffi::CStr::from_ptr(v) }.to_bytes() == b"system";
        c = if sys { SYSTEM } else { MIMALLOC };
        CHOICE.store(c, Ordering::Relaxed);
    }
    c == SYSTEM
}

pub struct Switch;

// SAFETY: every call goes to one allocator, the same for the process's whole life
// (decided before its first allocation), which upholds `GlobalAlloc`'s contract.
unsafe impl GlobalAlloc for Switch {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match system() {
            true => unsafe { System.alloc(layout) },
            false => unsafe { mimalloc::MiMalloc.alloc(layout) },
        }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match system() {
            true => unsafe { System.alloc_zeroed(layout) },
            false => unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) },
        }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        match system() {
            true => unsafe { System.dealloc(ptr, layout) },
            false => unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) },
        }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        match system() {
            true => unsafe { System.realloc(ptr, layout, new_size) },
            false => unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) },
        }
    }
}
