//! One accepted socket, Unix or TCP, with an optional absolute read deadline
//! (used to bound the whole handshake, not just each read).

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// A connected socket of either family.
#[derive(Debug)]
pub(super) struct Stream {
    sock: Sock,
    /// While set, every read fails with `TimedOut` once this instant passes.
    deadline: Option<Instant>,
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
        }
    }
}

impl From<TcpStream> for Stream {
    fn from(s: TcpStream) -> Stream {
        Stream {
            sock: Sock::Tcp(s),
            deadline: None,
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
        })
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
        match &mut self.sock {
            Sock::Unix(s) => s.read(buf),
            Sock::Tcp(s) => s.read(buf),
        }
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
