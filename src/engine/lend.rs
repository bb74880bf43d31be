//! Lending the writer lock to version operations while a long holder has it.
//!
//! A snapshot or clone must not wait behind the cleaner: a round holds the writer lock
//! for tens to hundreds of milliseconds (finishing the drop queue, two checkpoints,
//! planning the copies), and a snapshot of a busy volume is promised in under a
//! millisecond. The cleaner therefore holds the lock through a [`LendingGuard`], and a
//! version operation that finds the lock so held does not queue behind it: it hands
//! the holder a closure, which the holder runs on its own thread with the writer state
//! at its next *lending point* and whose result it sends back.
//!
//! A lending point is a place where the holder's work stays valid whatever a lent
//! operation does, so only operations that dirty no node may be lent (making a
//! version: it copies a root pointer and bumps one count). The holder lends:
//! - between steps that each leave the writer state whole (drop-queue steps);
//! - all through a checkpoint's write, which runs on a scoped thread while the holder
//!   serves (after the freeze, the writer state is the next interval's, exactly as
//!   when a background checkpoint writes beside commits);
//! - during a relocation's planning, by abandoning the plan (it changes nothing until
//!   it is applied) and planning again after serving.
//!
//! Commits are never lent the lock: they dirty nodes, and a round needs every node
//! written from its settle to its commit.
//!
//! Protocol: `state.active` is set while a lending holder has the lock, and only
//! changed under `state`'s mutex, so a request is either queued while the holder will
//! still serve it (its guard drains the queue before the lock goes) or finds the lock
//! not lent and sleeps on it like any writer, counted in `state.asleep`. A lending
//! holder that finds a request asleep when it takes the lock lets the lock go again
//! until that request has had it, so none sleeps through a whole round.

use super::{Shared, WriterState};
use crate::error::{Error, Result};
use crate::sync::lock;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// An operation handed to the lock's holder: it runs with the writer state and sends
/// its own result back.
type LentOp = Box<dyn FnOnce(&Shared, &mut WriterState) + Send>;

/// How long a holder waiting for its checkpoint's writer thread sleeps between looks
/// at the queue when nothing wakes it (a request notifies it at once).
const SERVE_POLL: Duration = Duration::from_micros(500);

/// The longest [`Shared::let_version_ops_in`] waits.
const LET_IN_MAX: Duration = Duration::from_millis(2);

/// The lending side of the writer lock (one per store).
#[derive(Default)]
pub(crate) struct Lender {
    state: Mutex<LendState>,
    /// Wakes a holder waiting in [`LendingGuard::serve_while`].
    wake: Condvar,
    /// Set when `state.queue` is non-empty: what a holder polls between steps.
    requested: AtomicBool,
    /// Operations run by a holder since open (`Stats::version_ops_lent`).
    lent: AtomicU64,
    /// `state.asleep`, readable without the mutex: what a commit that can split
    /// looks at between its edits ([`Shared::version_op_waiting`]).
    asleep: AtomicUsize,
}

impl Lender {
    /// Operations run by a holder since open.
    pub(crate) fn lent(&self) -> u64 {
        self.lent.load(Ordering::Relaxed)
    }

    fn run(&self, shared: &Shared, w: &mut WriterState, queue: Vec<LentOp>) {
        self.lent.fetch_add(queue.len() as u64, Ordering::Relaxed);
        for op in queue {
            op(shared, w);
        }
    }
}

#[derive(Default)]
struct LendState {
    /// A lending holder has the writer lock.
    active: bool,
    /// Version operations waiting to be run by the holder.
    queue: Vec<LentOp>,
    /// Version operations asleep on the writer lock itself (it was not lent when
    /// they asked).
    asleep: usize,
}

impl Shared {
    /// Runs `op` with the writer state: under the writer lock, or, while a lending
    /// holder (the cleaner) has it, on the holder's thread at its next lending point.
    /// `op` must dirty no node (see the module comment).
    pub(crate) fn with_writer_lent<T: Send + 'static>(
        &self,
        op: impl FnOnce(&Shared, &mut WriterState) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        self.check_writable()?;
        {
            let mut state = lock(&self.lender.state);
            if state.active {
                let (tx, rx) = mpsc::sync_channel(1);
                state.queue.push(Box::new(move |shared, w| {
                    let out = shared.check_writable().and_then(|()| op(shared, w));
                    // The requester waits below until this is sent.
                    let _ = tx.send(out);
                }));
                self.lender.requested.store(true, Ordering::Release);
                drop(state);
                self.lender.wake.notify_all();
                return rx_result(rx.recv());
            }
            // About to sleep on the lock: a lending holder that takes it before we
            // do lets it go again until we have had it.
            state.asleep += 1;
            self.lender.asleep.store(state.asleep, Ordering::Release);
        }
        let w = self.lock_writer_checked();
        {
            let mut state = lock(&self.lender.state);
            state.asleep -= 1;
            self.lender.asleep.store(state.asleep, Ordering::Release);
        }
        self.lender.wake.notify_all();
        let mut w = w?;
        op(self, &mut w)
    }

    /// Whether a version operation is asleep on the writer lock: a transaction that
    /// can commit in parts (a volume's batch of writes) commits what it has and lets
    /// it in ([`Shared::let_version_ops_in`]), so a snapshot of a busy volume waits
    /// for one edit rather than for a whole batch.
    pub(crate) fn version_op_waiting(&self) -> bool {
        self.lender.asleep.load(Ordering::Acquire) > 0
    }

    /// Waits, not holding the writer lock, until the version operations asleep on it
    /// have had it (at most [`LET_IN_MAX`]: one may be waiting behind another
    /// holder, which this caller need not wait for). The lock is not fair: a thread
    /// that lets it go and takes it again at once would keep them asleep.
    pub(crate) fn let_version_ops_in(&self) {
        let deadline = std::time::Instant::now() + LET_IN_MAX;
        let mut state = lock(&self.lender.state);
        while state.asleep > 0 {
            let now = std::time::Instant::now();
            if now >= deadline {
                return;
            }
            state = self
                .lender
                .wake
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// The writer lock, held by a long task that lends it to version operations at
    /// the points it chooses ([`LendingGuard::serve`]).
    pub(crate) fn lock_writer_lending(&self) -> Result<LendingGuard<'_>> {
        loop {
            let w = self.lock_writer_checked()?;
            let mut state = lock(&self.lender.state);
            if state.asleep == 0 {
                state.active = true;
                return Ok(LendingGuard {
                    shared: self,
                    w: Some(w),
                });
            }
            // A version operation went to sleep on the lock before we took it, so it
            // cannot be lent to: let it have the lock first.
            drop(w);
            while state.asleep > 0 {
                state = self
                    .lender
                    .wake
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
            }
        }
    }
}

fn rx_result<T>(r: std::result::Result<Result<T>, mpsc::RecvError>) -> Result<T> {
    r.unwrap_or_else(|_| {
        Err(Error::InvalidArgument(
            "the writer stopped before making the change; retry".into(),
        ))
    })
}

/// The writer lock, lent to version operations at lending points; serves every
/// request still queued before it lets the lock go.
pub(crate) struct LendingGuard<'a> {
    shared: &'a Shared,
    w: Option<MutexGuard<'a, WriterState>>,
}

impl LendingGuard<'_> {
    /// Whether a version operation is waiting to be served.
    pub(crate) fn requested(&self) -> bool {
        self.shared.lender.requested.load(Ordering::Acquire)
    }

    /// A lending point: runs every waiting request.
    pub(crate) fn serve(&mut self) {
        if !self.requested() {
            return;
        }
        let queue = {
            let mut state = lock(&self.shared.lender.state);
            self.shared.lender.requested.store(false, Ordering::Release);
            std::mem::take(&mut state.queue)
        };
        let shared = self.shared;
        let w = self.w.as_mut().expect("held until dropped");
        shared.lender.run(shared, w, queue);
    }

    /// Runs `work` on a scoped thread, serving requests until it is done: for work
    /// that needs no writer state (a checkpoint's write after its freeze).
    pub(crate) fn serve_while<T: Send>(&mut self, work: impl FnOnce() -> T + Send) -> T {
        std::thread::scope(|s| {
            let handle = s.spawn(work);
            while !handle.is_finished() {
                {
                    let state = lock(&self.shared.lender.state);
                    if state.queue.is_empty() {
                        let _ = self.shared.lender.wake.wait_timeout(state, SERVE_POLL);
                    }
                }
                self.serve();
            }
            match handle.join() {
                Ok(out) => out,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }
}

impl Deref for LendingGuard<'_> {
    type Target = WriterState;
    fn deref(&self) -> &WriterState {
        self.w.as_ref().expect("held until dropped")
    }
}

impl DerefMut for LendingGuard<'_> {
    fn deref_mut(&mut self) -> &mut WriterState {
        self.w.as_mut().expect("held until dropped")
    }
}

impl Drop for LendingGuard<'_> {
    fn drop(&mut self) {
        let queue = {
            let mut state = lock(&self.shared.lender.state);
            state.active = false;
            self.shared.lender.requested.store(false, Ordering::Release);
            std::mem::take(&mut state.queue)
        };
        // Queued before `active` went: still ours to run, with the lock still held.
        if let Some(w) = self.w.as_mut() {
            self.shared.lender.run(self.shared, w, queue);
        }
        self.w = None;
    }
}
