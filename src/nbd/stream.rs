//! One accepted socket, Unix or TCP, with an optional absolute read deadline
//! (used to bound the whole handshake, not just each read), and adaptive polling
//! for the read that waits for a client's next request.
//!
//! # Adaptive polling
//! A client with one request in flight (queue depth 1) sends the next request a few
//! tens of microseconds after our reply. Sleeping in `recv` for that gap costs more
//! than the gap itself on a virtual machine: the thread is descheduled, the client's
//! `send` has to wake it (an inter-processor interrupt, a VM exit) and it is
//! scheduled back in; a profile of the server at queue depth 1 put ~45% of its CPU
//! time there. So the read that waits for the next request first polls the socket
//! (non-blocking reads in a loop) for up to a **window**, and sleeps only if nothing
//! came. The window adapts per connection, as QEMU's event loop polling does
//! (`poll-max-ns`): a wait the maximum window would have covered doubles it (from
//! [`POLL_START`] up to the maximum), a longer one (an idle client) resets it to zero,
//! so an idle connection costs no CPU after its first long wait. At most one thread
//! per CPU but one polls at a time (none on a single CPU), so polling never takes
//! every core from the clients and the engine's own threads.
//!
//! # Polling for a large payload
//! A large write's payload comes in pieces: a Unix socket holds about 200 KiB the
//! client has sent and we have not read, so a 1 MiB payload is ~30 reads, each
//! waiting for the client to refill the socket (which waits for us to empty it).
//! Sleeping in each of those waits costs two wake-ups of halted vCPUs per piece.
//! While the connection receives a landing ([`Stream::poll_payloads`]), a read
//! that finds nothing polls for up to [`PAYLOAD_POLL`] first (with a polling slot,
//! as above): the rest of a payload already on its way comes within it. Measured
//! with fio's 1 MiB writes at QD8 after random ones, alternated: 2,178–2,474 MB/s
//! (median 2,393, six runs) against 1,841–2,464 (median ~2,055, ten runs). Polling
//! every read in the middle of a request, 4 KiB ones too, cost QD32 and the flush
//! job ~5% of their IOPS in two pairs (their payloads come with their headers; the
//! polling only took CPU and the slot): so only a landing's reads poll.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The first window of a connection that starts polling.
const POLL_START: Duration = Duration::from_micros(4);

/// How long a read of a large payload polls before it sleeps (module docs,
/// "Polling for a large payload"): a few times what the client takes to put the next
/// piece in the socket.
const PAYLOAD_POLL: Duration = Duration::from_micros(30);

/// A connected socket of either family.
#[derive(Debug)]
pub(super) struct Stream {
    sock: Sock,
    /// While set, every read fails with `TimedOut` once this instant passes.
    deadline: Option<Instant>,
    /// Adaptive polling (module docs); the window is zero while not polling.
    poll_max: Duration,
    poll_window: Duration,
    /// Set by [`Stream::poll_next_read`]: the next read may poll before sleeping.
    poll_armed: bool,
    /// Set by [`Stream::poll_payloads`]: every read polls briefly before sleeping.
    payload_polling: bool,
    /// [`Stream::set_stall_timeout`]'s: the socket's read timeout, outside the wait
    /// for a new request.
    stall_timeout: Option<Duration>,
}

#[derive(Debug)]
enum Sock {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl From<UnixStream> for Stream {
    fn from(s: UnixStream) -> Stream {
        Stream {
            sock: Sock::Unix(s),
            deadline: None,
            poll_max: Duration::ZERO,
            poll_window: Duration::ZERO,
            poll_armed: false,
            payload_polling: false,
            stall_timeout: None,
        }
    }
}

impl From<TcpStream> for Stream {
    fn from(s: TcpStream) -> Stream {
        Stream {
            sock: Sock::Tcp(s),
            deadline: None,
            poll_max: Duration::ZERO,
            poll_window: Duration::ZERO,
            poll_armed: false,
            payload_polling: false,
            stall_timeout: None,
        }
    }
}

impl Stream {
    /// Another handle on the same socket (no deadline).
    pub(super) fn try_clone(&self) -> io::Result<Stream> {
        let sock = match &self.sock {
            Sock::Unix(s) => Sock::Unix(s.try_clone()?),
            Sock::Tcp(s) => Sock::Tcp(s.try_clone()?),
        };
        Ok(Stream {
            sock,
            deadline: None,
            poll_max: Duration::ZERO,
            poll_window: Duration::ZERO,
            poll_armed: false,
            payload_polling: false,
            stall_timeout: None,
        })
    }

    /// Sets the largest polling window (zero: never poll). See the module docs.
    pub(super) fn set_poll_max(&mut self, max: Duration) {
        self.poll_max = max;
        self.poll_window = self.poll_window.min(max);
    }

    /// Makes a read in the middle of a request (a payload, the rest of a header) fail
    /// with `TimedOut` once the client has sent nothing for `timeout`: a client that
    /// stalls mid-request would otherwise hold its connection (and its payload
    /// buffer) for good. The wait for a new request ([`Stream::poll_next_read`]) is
    /// not limited: an idle client may stay.
    pub(super) fn set_stall_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.stall_timeout = timeout.filter(|t| !t.is_zero());
        self.set_read_timeout(self.stall_timeout)
    }

    /// Marks the next read as the wait for a new request: it may poll before it
    /// sleeps, and its wait adapts the window.
    pub(super) fn poll_next_read(&mut self) {
        self.poll_armed = !self.poll_max.is_zero();
    }

    /// While `on`, every read that finds nothing polls for up to [`PAYLOAD_POLL`]
    /// before it sleeps (module docs, "Polling for a large payload"): for the reads
    /// of a large write's payload, whose rest is on its way.
    pub(super) fn poll_payloads(&mut self, on: bool) {
        self.payload_polling = on;
    }

    /// Polls the socket, yielding the CPU between tries, until something comes or
    /// `window` has passed since `start`, if a polling slot is free: `WouldBlock` if
    /// nothing came (or no slot).
    fn poll_socket(&self, buf: &mut [u8], start: Instant, window: Duration) -> io::Result<usize> {
        let Some(_slot) = PollSlot::take() else {
            return Err(io::ErrorKind::WouldBlock.into());
        };
        loop {
            match self.read_socket_now(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if start.elapsed() >= window {
                        return Err(e);
                    }
                    std::thread::yield_now();
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                done => return done,
            }
        }
    }

    /// A read that never sleeps (`MSG_DONTWAIT`): `WouldBlock` if nothing is there.
    /// A flag of this one call, not `O_NONBLOCK` on the open file: no two syscalls
    /// around every poll to set and clear it, and no window in which a reply written
    /// through the other handle could find the socket non-blocking.
    fn read_socket_now(&self, buf: &mut [u8]) -> io::Result<usize> {
        let fd = match &self.sock {
            Sock::Unix(s) => s.as_raw_fd(),
            Sock::Tcp(s) => s.as_raw_fd(),
        };
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes and `fd` is this
        // stream's open socket for the duration of the call.
        #[allow(unsafe_code, reason = "recv with MSG_DONTWAIT: see SAFETY")]
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        match usize::try_from(n) {
            Ok(n) => Ok(n),
            Err(_) => Err(io::Error::last_os_error()),
        }
    }

    fn read_socket(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &mut self.sock {
            Sock::Unix(s) => s.read(buf),
            Sock::Tcp(s) => s.read(buf),
        }
    }

    /// A read that polls for up to the window before sleeping, then adapts the
    /// window to how long the data took to come.
    fn read_polling(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let start = Instant::now();
        if !self.poll_window.is_zero() {
            match self.poll_socket(buf, start, self.poll_window) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                done => return done,
            }
        }
        // The stall timeout is not for this wait: a read that times out (which the
        // socket reports as "would block") is simply made again.
        let done = loop {
            match self.read_socket(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && self.stall_timeout.is_some() => {
                }
                done => break done,
            }
        };
        self.poll_window = next_window(self.poll_window, start.elapsed(), self.poll_max);
        done
    }

    /// Shuts down one or both directions (errors ignored: the peer may be gone).
    pub(super) fn shutdown(&self, how: Shutdown) {
        let _ = match &self.sock {
            Sock::Unix(s) => s.shutdown(how),
            Sock::Tcp(s) => s.shutdown(how),
        };
    }

    /// Sets (Some) or clears (None) the handshake deadline, and the socket's
    /// write timeout to match, so a client that stops reading cannot pin us.
    pub(super) fn set_deadline(&mut self, deadline: Option<Instant>) -> io::Result<()> {
        self.deadline = deadline;
        let write_timeout = deadline.map(|d| remaining(d).max(Duration::from_millis(1)));
        self.set_timeouts(None, write_timeout)
    }

    fn set_timeouts(&self, read: Option<Duration>, write: Option<Duration>) -> io::Result<()> {
        match &self.sock {
            Sock::Unix(s) => {
                s.set_read_timeout(read)?;
                s.set_write_timeout(write)
            }
            Sock::Tcp(s) => {
                s.set_read_timeout(read)?;
                s.set_write_timeout(write)
            }
        }
    }

    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match &self.sock {
            Sock::Unix(s) => s.set_read_timeout(t),
            Sock::Tcp(s) => s.set_read_timeout(t),
        }
    }
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(d) = self.deadline {
            let left = remaining(d);
            if left.is_zero() {
                return Err(io::ErrorKind::TimedOut.into());
            }
            self.set_read_timeout(Some(left))?;
        }
        if std::mem::take(&mut self.poll_armed) {
            return self.read_polling(buf);
        }
        if self.payload_polling {
            match self.poll_socket(buf, Instant::now(), PAYLOAD_POLL) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                done => return done,
            }
        }
        match self.read_socket(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && self.stall_timeout.is_some() => {
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the client sent nothing for too long in the middle of a request",
                ))
            }
            done => done,
        }
    }
}

/// The window after a wait of `waited` that polling for `window` did not cover:
/// doubled (from [`POLL_START`]) if the largest window would have covered it, zero if
/// not (the client was idle, not busy).
fn next_window(window: Duration, waited: Duration, max: Duration) -> Duration {
    if waited > max {
        Duration::ZERO
    } else {
        (window * 2).max(POLL_START).min(max)
    }
}

/// Leave to poll: one of the process's `CPUs - 1` polling slots, held while polling.
struct PollSlot;

static POLLING: AtomicUsize = AtomicUsize::new(0);

impl PollSlot {
    fn take() -> Option<PollSlot> {
        static SLOTS: OnceLock<usize> = OnceLock::new();
        let slots =
            *SLOTS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()) - 1);
        POLLING
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < slots).then_some(n + 1)
            })
            .ok()
            .map(|_| PollSlot)
    }
}

impl Drop for PollSlot {
    fn drop(&mut self) {
        POLLING.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.sock {
            Sock::Unix(s) => s.write(buf),
            Sock::Tcp(s) => s.write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match &mut self.sock {
            Sock::Unix(s) => s.write_vectored(bufs),
            Sock::Tcp(s) => s.write_vectored(bufs),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: Duration = Duration::from_micros(64);

    #[test]
    fn the_window_doubles_on_short_waits_and_resets_on_long_ones() {
        let us = Duration::from_micros;
        assert_eq!(next_window(Duration::ZERO, us(1), MAX), POLL_START);
        assert_eq!(next_window(us(4), us(10), MAX), us(8));
        assert_eq!(next_window(us(48), us(60), MAX), MAX);
        assert_eq!(next_window(MAX, MAX, MAX), MAX);
        assert_eq!(next_window(MAX, us(65), MAX), Duration::ZERO);
        assert_eq!(
            next_window(us(8), Duration::from_secs(1), MAX),
            Duration::ZERO
        );
    }

    /// A landing's payload reads poll, then sleep: every byte comes back in order
    /// whether it came while polling or after; the socket still blocks and times out
    /// (a stalled client), and EOF reads as 0.
    #[test]
    fn a_payload_read_polling_sees_every_byte_and_still_sleeps_and_times_out() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let mut s = Stream::from(ours);
        s.poll_payloads(true);
        // 1 MiB in 64 KiB pieces, some late (past the polling: the read sleeps) and
        // some at once (found while polling, or by the sleeping read).
        let sent: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 + i / 4093) as u8).collect();
        let to_send = sent.clone();
        let sender = std::thread::spawn(move || {
            for (k, piece) in to_send.chunks(64 << 10).enumerate() {
                if k % 4 == 3 {
                    std::thread::sleep(Duration::from_millis(2));
                }
                theirs.write_all(piece).unwrap();
            }
            theirs
        });
        let mut got = vec![0u8; sent.len()];
        s.read_exact(&mut got).unwrap();
        assert!(got == sent, "the payload read back differs");
        let mut theirs = sender.join().unwrap();

        // Still a blocking socket with its stall timeout: nothing to read times out
        // after the polling, never fails at once.
        s.set_stall_timeout(Some(Duration::from_millis(30)))
            .unwrap();
        let mut buf = [0u8; 8];
        let t = Instant::now();
        let err = s.read(&mut buf).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(
            t.elapsed() >= Duration::from_millis(25),
            "the socket is blocking"
        );

        // Off again, and EOF reads as 0 either way.
        s.poll_payloads(false);
        theirs.write_all(b"plain...").unwrap();
        s.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"plain...");
        drop(theirs);
        s.poll_payloads(true);
        assert_eq!(s.read(&mut buf).unwrap(), 0);
    }

    /// Reads through the polling path return what the peer sent, in order, whether
    /// it was there already, came while polling or came after the poll gave up; an
    /// idle peer turns polling off; and the socket is blocking again afterwards.
    #[test]
    fn polling_reads_see_every_byte_and_an_idle_peer_stops_the_polling() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let mut s = Stream::from(ours);
        s.set_poll_max(MAX);
        let mut buf = [0u8; 8];

        // Already there: no wait, so the window opens.
        theirs.write_all(b"ready!!!").unwrap();
        s.poll_next_read();
        assert_eq!(s.read(&mut buf).unwrap(), 8);
        assert_eq!(&buf, b"ready!!!");
        assert_eq!(s.poll_window, POLL_START);
        for _ in 0..8 {
            theirs.write_all(b"12345678").unwrap();
            s.poll_next_read();
            s.read_exact(&mut buf).unwrap();
            assert_eq!(&buf, b"12345678");
        }
        // (Data found while polling keeps the window; when another connection held
        // the polling slot, the read slept briefly and the window grew.)
        assert!(s.poll_window >= POLL_START && s.poll_window <= MAX);

        // Late: the poll gives up, the read sleeps, and the window closes.
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            theirs.write_all(b"late....").unwrap();
            theirs
        });
        s.poll_next_read();
        s.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"late....");
        assert_eq!(
            s.poll_window,
            Duration::ZERO,
            "an idle peer stops the polling"
        );
        let mut theirs = late.join().unwrap();

        // Blocking again: a read with nothing to read times out instead of
        // failing at once (WouldBlock would come back immediately).
        s.set_read_timeout(Some(Duration::from_millis(30))).unwrap();
        let t = Instant::now();
        assert!(s.read(&mut buf).is_err());
        assert!(
            t.elapsed() >= Duration::from_millis(25),
            "the socket is blocking"
        );
        s.set_read_timeout(None).unwrap();

        // An unarmed read neither polls nor adapts; EOF reads as 0 when polling.
        theirs.write_all(b"unarmed!").unwrap();
        s.read_exact(&mut buf).unwrap();
        assert_eq!(s.poll_window, Duration::ZERO);
        drop(theirs);
        s.poll_next_read();
        assert_eq!(s.read(&mut buf).unwrap(), 0);
    }

    #[test]
    fn a_zero_maximum_never_arms() {
        let (ours, _theirs) = UnixStream::pair().unwrap();
        let mut s = Stream::from(ours);
        s.set_poll_max(Duration::ZERO);
        s.poll_next_read();
        assert!(!s.poll_armed);
    }
}
