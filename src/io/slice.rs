//! A thread's scheduling slice: short for threads whose work is brief and whose
//! latency someone is waiting on.
//!
//! Linux's fair scheduler (EEVDF, 6.6 and later) gives each task a virtual
//! deadline one *slice* past its eligible time, and since 6.12 a task may ask for a
//! slice of its own (`sched_setattr` with `sched_runtime`, from 0.1 to 100 ms, no
//! privilege needed). A task that asks for a short one gets an earlier deadline
//! when it wakes and runs before the tasks whose slice is the default's (~3 ms),
//! and a waking short-slice task preempts the running one. Its share of the CPU
//! does not change: that is its nice value's, untouched here.
//!
//! Why it matters: on a two-core machine a `volume snapshot` sent to a busy server
//! (fio's thread and the server's lander, committer and checkpoint threads all
//! runnable) spent up to 4 ms runnable but not running, after the writer lock it
//! waited for was handed to it: the whole of the 1 ms budget, four times.

/// Asks the scheduler to give the calling thread the shortest slice it allows, so it
/// runs soon after it wakes. Best effort: true only if the thread's slice reads back
/// as asked; false on kernels without custom slices (before 6.12 a fair thread's
/// `sched_runtime` is accepted and ignored), where refused, and on other systems.
pub fn request_short_slice() -> bool {
    #[cfg(target_os = "linux")]
    {
        linux::request_slice(linux::SHORTEST_SLICE_NS)
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

#[cfg(target_os = "linux")]
mod linux {
    /// The shortest slice the kernel accepts (it clamps requests to 0.1–100 ms).
    pub const SHORTEST_SLICE_NS: u64 = 100_000;

    /// `struct sched_attr` as the kernel's first version of it (48 bytes); the
    /// kernel takes the size from `size` and zero-fills what a newer one has.
    #[repr(C)]
    struct SchedAttr {
        size: u32,
        sched_policy: u32,
        sched_flags: u64,
        sched_nice: i32,
        sched_priority: u32,
        sched_runtime: u64,
        sched_deadline: u64,
        sched_period: u64,
    }

    /// `SCHED_OTHER`: the fair class, where `sched_runtime` is the slice asked for.
    const SCHED_OTHER: u32 = 0;

    #[allow(unsafe_code, reason = "getpriority and sched_setattr: see SAFETY")]
    pub fn request_slice(slice_ns: u64) -> bool {
        // The nice value is part of what sched_setattr sets: keep the thread's own.
        // (getpriority returns -1 both for nice -1 and for an error; errno tells.)
        // SAFETY: plain system calls on the calling thread (who = 0), with a
        // properly sized, initialised attribute struct that outlives the call.
        unsafe {
            *libc::__errno_location() = 0;
            let nice = libc::getpriority(libc::PRIO_PROCESS, 0);
            if nice == -1 && *libc::__errno_location() != 0 {
                return false;
            }
            let attr = SchedAttr {
                size: std::mem::size_of::<SchedAttr>() as u32,
                sched_policy: SCHED_OTHER,
                sched_flags: 0,
                sched_nice: nice,
                sched_priority: 0,
                sched_runtime: slice_ns,
                sched_deadline: 0,
                sched_period: 0,
            };
            if libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) != 0 {
                return false;
            }
            // Read back: a kernel with custom slices reports the thread's slice in
            // `sched_runtime`; one without reports 0.
            let mut back = SchedAttr {
                sched_runtime: 0,
                ..attr
            };
            let size = std::mem::size_of::<SchedAttr>() as libc::c_uint;
            libc::syscall(
                libc::SYS_sched_getattr,
                0,
                &mut back as *mut SchedAttr,
                size,
                0,
            ) == 0
                && back.sched_runtime == slice_ns
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The request either takes (and the scheduler's own report of the thread then
    /// shows the slice) or is refused cleanly; it never changes the nice value.
    #[test]
    #[allow(unsafe_code, reason = "getpriority: see SAFETY")]
    fn a_short_slice_keeps_the_nice_value() {
        std::thread::spawn(|| {
            // SAFETY: getpriority on the calling thread.
            let before = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
            let took = request_short_slice();
            let after = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
            assert_eq!(before, after);
            #[cfg(target_os = "linux")]
            if took {
                let line = std::fs::read_to_string("/proc/thread-self/sched").unwrap_or_default();
                // Kernels with custom slices print the thread's slice there.
                if let Some(slice) = line.lines().find(|l| l.starts_with("se.slice")) {
                    let ns: u64 = slice
                        .rsplit(':')
                        .next()
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    assert_eq!(ns, linux::SHORTEST_SLICE_NS, "{slice}");
                }
            }
        })
        .join()
        .unwrap();
    }
}
