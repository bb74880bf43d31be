//! Whether a connection is idle: what the server's accept loop reads to choose the
//! connection that makes way for a newcomer at the connection cap, and what the
//! connection's own thread sets around its wait for a request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Whether a connection is idle, and since when: in its handshake, or waiting for a
/// request with every reply sent (but a large write's, still landing: ending the
/// connection lands and answers it first). The one idle the longest makes way for a
/// newcomer when the server is full ([`super::ServerOptions::evict_idle_after`]).
pub(super) struct Activity {
    epoch: Instant,
    /// Nanoseconds from `epoch` (at least 1) since the connection is idle; 0: busy.
    idle_since: AtomicU64,
}

impl Activity {
    /// A new connection's: idle (in its handshake) from now, times counted from
    /// `epoch`.
    pub(super) fn new(epoch: Instant) -> Activity {
        let activity = Activity {
            epoch,
            idle_since: AtomicU64::new(0),
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

    pub(super) fn idle_since(&self) -> Option<u64> {
        Some(self.idle_since.load(Ordering::Relaxed)).filter(|&t| t != 0)
    }
}
