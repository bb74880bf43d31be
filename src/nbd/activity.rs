//! Whether a connection is idle: what the server's accept loop reads to choose the
//! connection that makes way for a newcomer at the connection cap, and what the
//! connection's own thread sets around its wait for a request.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// Whether a connection is idle, and since when: in its handshake, or waiting for a
/// request with every reply sent (but a large write's, still landing: ending the
/// connection lands and answers it first); and whether its handshake is over. The
/// one idle the longest, sessions last, makes way for a newcomer when the server is
/// full ([`super::ServerOptions::evict_idle_after`]).
pub(super) struct Activity {
    epoch: Instant,
    /// Nanoseconds from `epoch` (at least 1) since the connection is idle; 0: busy.
    idle_since: AtomicU64,
    /// Set once the client has chosen its export: a session (a kernel client's
    /// mounted file system, idle for hours), ended for a newcomer only when no
    /// connection in its handshake can be.
    established: AtomicBool,
}

impl Activity {
    /// A new connection's: idle (in its handshake) from now, times counted from
    /// `epoch`.
    pub(super) fn new(epoch: Instant) -> Activity {
        let activity = Activity {
            epoch,
            idle_since: AtomicU64::new(0),
            established: AtomicBool::new(false),
        };
        activity.idle();
        activity
    }

    pub(super) fn idle(&self) {
        let nanos = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.idle_since.store(nanos.max(1), Ordering::Relaxed);
    }

    pub(super) fn busy(&self) {
        self.idle_since.store(0, Ordering::Relaxed);
    }

    /// The handshake is over: from now on the connection is a session.
    pub(super) fn establish(&self) {
        self.established.store(true, Ordering::Relaxed);
    }

    pub(super) fn is_established(&self) -> bool {
        self.established.load(Ordering::Relaxed)
    }

    pub(super) fn idle_since(&self) -> Option<u64> {
        Some(self.idle_since.load(Ordering::Relaxed)).filter(|&t| t != 0)
    }
}
