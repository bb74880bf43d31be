//! The server's payload memory: one budget for every connection's large buffers.
//!
//! A connection keeps small buffers of its own (its socket buffers, the payload of a
//! write or read under [`SMALL_PAYLOAD`], a batch of small writes): a few MiB at
//! most, times the connection limit. Every larger payload (a large write while it
//! is received and lands, a large read's data while it is sent) is a
//! [`PayloadBuf`] taken from the server's one [`PayloadBudget`] and given back when
//! the request is done, so that many clients sending or asking for large payloads
//! at once cannot take more memory than the budget, however many connections and
//! requests they have; an idle connection holds none.
//!
//! A request whose buffer does not fit waits for buffers to come back (they do as
//! requests finish), up to a deadline, then is answered `ENOMEM`. It never waits
//! holding a buffer of its own that another request waits for: a connection has at
//! most one request waiting, and the buffers it holds belong to requests that finish
//! without it (its landing write).
//!
//! Buffers given back are kept for reuse up to [`PayloadBudget::keep`] bytes:
//! allocating and zeroing 8 MiB for every landing of a sequential stream would cost
//! it a tenth of its speed.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::io::Pages;

/// Payloads up to this size use the connection's own buffer, not the budget's.
pub(super) const SMALL_PAYLOAD: usize = 256 << 10;

/// What a buffer is accounted as beyond the bytes asked for, at most: its mapping
/// is whole pages.
const PAGE: usize = 4096;

/// The server-wide budget of large payload buffers (module docs).
pub(super) struct PayloadBudget {
    /// Bytes of buffers, in use or kept, never above this.
    limit: usize,
    /// Bytes of buffers kept for reuse, at most.
    keep: usize,
    state: Mutex<State>,
    /// Signalled when a buffer comes back or is freed.
    returned: Condvar,
}

struct State {
    /// Bytes of every buffer allocated and not freed: in use plus kept.
    charged: usize,
    /// Buffers given back and kept for reuse, and their total size.
    kept: Vec<Pages>,
    kept_bytes: usize,
}

impl PayloadBudget {
    /// A budget of `limit` bytes (at least one largest payload, `max_payload`, must
    /// fit, or such requests could never be served: the limit is raised to it).
    pub(super) fn new(limit: usize, max_payload: usize) -> Arc<PayloadBudget> {
        let limit = limit.max(max_payload + PAGE);
        Arc::new(PayloadBudget {
            limit,
            keep: (limit / 4).min(128 << 20),
            state: Mutex::new(State {
                charged: 0,
                kept: Vec::new(),
                kept_bytes: 0,
            }),
            returned: Condvar::new(),
        })
    }

    /// The largest buffer [`take`](Self::take) can give.
    pub(super) fn largest(&self) -> usize {
        self.limit - PAGE
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every update of the state is a few assignments that cannot panic halfway.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A buffer with room for `capacity` bytes, its length 0; waits up to `wait`
    /// for the budget to have room. `None`: no room in time, or more than the whole
    /// budget asked.
    pub(super) fn take(self: &Arc<Self>, capacity: usize, wait: Duration) -> Option<PayloadBuf> {
        let size = capacity.checked_next_multiple_of(PAGE)?;
        if size > self.limit {
            return None;
        }
        let deadline = Instant::now() + wait;
        let mut st = self.state();
        loop {
            // The smallest kept buffer that is large enough.
            let fit = (st.kept.iter().enumerate())
                .filter(|(_, b)| b.capacity() >= size)
                .min_by_key(|(_, b)| b.capacity())
                .map(|(i, _)| i);
            if let Some(i) = fit {
                let buf = st.kept.swap_remove(i);
                st.kept_bytes -= buf.capacity();
                return Some(PayloadBuf::new(buf, capacity, Arc::clone(self)));
            }
            // Kept buffers too small for this one give their room to it.
            let mut freed = Vec::new();
            while st.charged + size > self.limit {
                let Some(b) = st.kept.pop() else { break };
                st.kept_bytes -= b.capacity();
                st.charged -= b.capacity();
                freed.push(b);
            }
            if st.charged + size <= self.limit {
                st.charged += size;
                drop(st);
                drop(freed);
                // Mapped outside the lock: the first touch of its pages (huge
                // pages, for a large one) happens as the payload arrives.
                let buf = Pages::zeroed(size);
                return Some(PayloadBuf::new(buf, capacity, Arc::clone(self)));
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            st = (self.returned.wait_timeout(st, deadline - now))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Takes back a buffer: kept for reuse if there is room, freed otherwise.
    fn give_back(&self, buf: Pages) {
        let mut st = self.state();
        let freed = if st.kept_bytes + buf.capacity() <= self.keep {
            st.kept_bytes += buf.capacity();
            st.kept.push(buf);
            None
        } else {
            st.charged -= buf.capacity();
            Some(buf)
        };
        drop(st);
        drop(freed);
        self.returned.notify_all();
    }

    /// Bytes of buffers allocated now (in use or kept).
    #[cfg(test)]
    pub(super) fn charged(&self) -> usize {
        self.state().charged
    }
}

/// A payload buffer from the [`PayloadBudget`], its bytes starting at a page
/// boundary (so an export can write a payload past the page cache straight from
/// here, which is what `O_DIRECT` asks of memory); given back when dropped.
pub(super) struct PayloadBuf {
    /// The bytes (its length is the payload's).
    buf: Pages,
    /// The capacity asked for (a kept buffer may be larger).
    cap: usize,
    budget: Arc<PayloadBudget>,
}

impl PayloadBuf {
    fn new(mut buf: Pages, cap: usize, budget: Arc<PayloadBudget>) -> PayloadBuf {
        buf.set_len(0);
        PayloadBuf { buf, cap, budget }
    }

    /// Bytes that can still be added after the ones there.
    pub(super) fn room(&self) -> usize {
        self.cap - self.buf.len()
    }

    /// Adds `more` bytes (contents unspecified) after the ones there and returns
    /// them; `None` if there is not [`room`](Self::room) for them.
    pub(super) fn extend(&mut self, more: usize) -> Option<&mut [u8]> {
        if more > self.room() {
            return None;
        }
        let at = self.buf.len();
        self.buf.set_len(at + more);
        Some(&mut self.buf[at..])
    }

    /// Drops the bytes after the first `len`.
    pub(super) fn truncate(&mut self, len: usize) {
        self.buf.set_len(self.buf.len().min(len));
    }

    pub(super) fn len(&self) -> usize {
        self.buf.len()
    }

    pub(super) fn bytes(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for PayloadBuf {
    fn drop(&mut self) {
        self.budget.give_back(std::mem::take(&mut self.buf));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn buffers_are_aligned_sized_and_reused() {
        let budget = PayloadBudget::new(64 * MIB, MIB);
        let mut a = budget.take(MIB, Duration::ZERO).unwrap();
        assert_eq!(a.len(), 0);
        assert_eq!(a.room(), MIB);
        assert_eq!(a.bytes().as_ptr() as usize % PAGE, 0);
        a.extend(1000).unwrap().fill(7);
        assert!(a.extend(MIB).is_none(), "past the capacity");
        assert_eq!(a.bytes(), &[7; 1000][..]);
        let charged = budget.charged();
        drop(a);
        // Kept, then handed out again for a smaller payload: nothing new allocated,
        // and room for what was asked only (a landing's room is the join rule's).
        let b = budget.take(4096, Duration::ZERO).unwrap();
        assert_eq!(budget.charged(), charged);
        assert_eq!(b.room(), 4096);
    }

    #[test]
    fn the_budget_bounds_what_is_out_and_waits_for_what_comes_back() {
        let budget = PayloadBudget::new(8 * MIB, MIB);
        // Eight whole-page buffers fill it exactly.
        let held: Vec<PayloadBuf> = (0..8)
            .map(|_| budget.take(MIB, Duration::ZERO).unwrap())
            .collect();
        assert_eq!(budget.charged(), 8 * MIB);
        assert!(
            budget.take(MIB, Duration::from_millis(20)).is_none(),
            "no room: times out"
        );
        assert!(
            budget.take(9 * MIB, Duration::ZERO).is_none(),
            "beyond the budget"
        );
        // A buffer given back on another thread wakes the waiter.
        let waiter = {
            let budget = Arc::clone(&budget);
            std::thread::spawn(move || budget.take(MIB, Duration::from_secs(30)).is_some())
        };
        std::thread::sleep(Duration::from_millis(20));
        drop(held);
        assert!(waiter.join().unwrap());
        assert!(budget.charged() <= 8 * MIB);
    }

    #[test]
    fn kept_buffers_make_room_for_a_larger_one() {
        let budget = PayloadBudget::new(8 * MIB, MIB);
        let small: Vec<PayloadBuf> = (0..7)
            .map(|_| budget.take(MIB, Duration::ZERO).unwrap())
            .collect();
        drop(small); // kept, up to a quarter of the budget; the rest freed
        let big = budget.take(6 * MIB, Duration::ZERO).unwrap();
        assert_eq!(big.room(), 6 * MIB);
        assert!(budget.charged() <= 8 * MIB);
    }

    #[test]
    fn a_budget_smaller_than_one_payload_grows_to_it() {
        let budget = PayloadBudget::new(0, 32 * MIB);
        assert!(budget.take(32 * MIB, Duration::ZERO).is_some());
    }
}
