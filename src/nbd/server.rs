//! The listener: binds, accepts, runs one thread per connection (handshake
//! then transmission), and shuts down gracefully.
//!
//! Shutdown protocol (invariant: every live connection is either in the
//! registry when the sweep runs, or sees the stop flag when registering):
//! `ShutdownHandle::shutdown` sets `stopping`, then sweeps the registry with
//! `shutdown(Read)`; `register` checks `stopping` under the registry lock.

use std::collections::HashMap;
use std::io::{self, BufReader, BufWriter};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::activity::Activity;
use super::budget::PayloadBudget;
use super::stream::Stream;
use super::{handshake, transmission, Exports, Listen, ServerOptions};
use crate::io::{self as os_io, connect_unix};

/// Stack of a connection thread: payloads live on the heap, so little is needed.
const CONN_STACK: usize = 512 * 1024;
/// Socket buffers per connection.
const READ_BUF: usize = 256 * 1024;
const WRITE_BUF: usize = 256 * 1024;
/// How long shutdown waits for connections to finish before cutting them off
/// completely (a client that stopped reading would otherwise block us).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// A bound NBD server; [`Server::run`] serves it.
pub struct Server {
    listener: Listener,
    opts: ServerOptions,
    shared: Arc<Shared>,
}

enum Listener {
    Unix {
        listener: UnixListener,
        path: PathBuf,
        /// (device, inode) of the socket file we created, so we only remove our own.
        id: (u64, u64),
    },
    Tcp(TcpListener),
}

/// Where to connect to wake a blocked `accept`.
#[derive(Clone, Debug)]
enum WakeAddr {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

/// State shared by the accept loop, connection threads and shutdown handles.
struct Shared {
    stopping: AtomicBool,
    wake: WakeAddr,
    next_id: AtomicU64,
    /// Live connections (clones of their sockets, and whether each is idle), keyed
    /// by id.
    conns: Mutex<HashMap<u64, (Stream, Arc<Activity>)>>,
    /// What [`Activity`] measures time from.
    epoch: Instant,
    /// Every connection's large payload buffers come from here.
    budget: Arc<PayloadBudget>,
}

impl Shared {
    fn conns(&self) -> MutexGuard<'_, HashMap<u64, (Stream, Arc<Activity>)>> {
        // A panicking connection thread cannot leave the map inconsistent.
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a connection, idle until it is through the handshake; `None` if
    /// the server is stopping.
    fn register(&self, stream: &Stream) -> Option<(u64, Arc<Activity>)> {
        let clone = stream.try_clone().ok()?;
        let activity = Arc::new(Activity::new(self.epoch));
        let mut conns = self.conns();
        if self.stopping.load(Ordering::SeqCst) {
            return None;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        conns.insert(id, (clone, Arc::clone(&activity)));
        Some((id, activity))
    }

    fn shutdown_all(&self, how: Shutdown) {
        for (s, _) in self.conns().values() {
            s.shutdown(how);
        }
    }

    /// Ends the connection idle the longest, if one has been idle for `after` at
    /// least, sessions last: while any connection is in its handshake only those
    /// are candidates (a flood of sockets that never say a word makes way for
    /// itself, not for an idle client's disk); otherwise a session waiting for a
    /// request with every one before answered. Its reading side is shut, so it sees
    /// the client leave. Whether one was.
    fn evict_idlest(&self, after: Duration) -> bool {
        let now = self.epoch.elapsed().as_nanos();
        let conns = self.conns();
        let sessions_only = conns.values().all(|(_, a)| a.is_established());
        let idlest = (conns.values())
            .filter(|(_, a)| a.is_established() == sessions_only)
            .filter_map(|(s, a)| Some((s, a, a.idle_since()?)))
            .filter(|&(_, _, since)| now.saturating_sub(u128::from(since)) >= after.as_nanos())
            .min_by_key(|&(_, _, since)| since);
        match idlest {
            Some((stream, activity, _)) => {
                activity.busy(); // not chosen again while it ends
                stream.shutdown(Shutdown::Read);
                true
            }
            None => false,
        }
    }
}

/// Stops a running [`Server`] from another thread.
#[derive(Clone)]
pub struct ShutdownHandle {
    shared: Arc<Shared>,
}

impl ShutdownHandle {
    /// Stops accepting and lets every connection finish its current request;
    /// [`Server::run`] then returns. Idempotent.
    pub fn shutdown(&self) {
        let s = &self.shared;
        if s.stopping.swap(true, Ordering::SeqCst) {
            return;
        }
        // Wake the accept loop; it sees `stopping` and drops this connection.
        let _ = match &s.wake {
            WakeAddr::Unix(p) => connect_unix(p).map(drop),
            WakeAddr::Tcp(a) => TcpStream::connect_timeout(a, Duration::from_secs(1)).map(drop),
        };
        s.shutdown_all(Shutdown::Read);
    }
}

impl Server {
    /// Binds. A Unix socket path left by a killed server (nothing accepts on
    /// it: connect is refused) is removed and re-bound; one that a live
    /// server answers on is an error (AddrInUse).
    pub fn bind(listen: &Listen, opts: ServerOptions) -> io::Result<Server> {
        let (listener, wake) = match listen {
            Listen::Unix(path) => bind_unix(path)?,
            Listen::Tcp(addr) => {
                let l = TcpListener::bind(addr.as_str())?;
                let wake = WakeAddr::Tcp(wake_addr(l.local_addr()?));
                (Listener::Tcp(l), wake)
            }
        };
        let shared = Arc::new(Shared {
            stopping: AtomicBool::new(false),
            wake,
            next_id: AtomicU64::new(0),
            conns: Mutex::new(HashMap::new()),
            epoch: Instant::now(),
            budget: PayloadBudget::new(opts.payload_budget_bytes, opts.max_payload_bytes as usize),
        });
        Ok(Server {
            listener,
            opts,
            shared,
        })
    }

    /// For Tcp, the bound address (port 0 picks one); for Unix, the path.
    pub fn local_addr(&self) -> String {
        match &self.listener {
            Listener::Unix { path, .. } => path.display().to_string(),
            Listener::Tcp(l) => l
                .local_addr()
                .map_or_else(|e| format!("<{e}>"), |a| a.to_string()),
        }
    }

    /// A handle another thread (a signal watcher) can use to stop the server.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Serves until shut down: stops accepting, shuts down the read side of
    /// every connection so each finishes the request it is in, sends its
    /// replies and closes; returns when all connection threads have ended.
    /// Removes its Unix socket file on return.
    pub fn run(self, exports: Arc<dyn Exports>) -> io::Result<()> {
        let mut threads: Vec<JoinHandle<()>> = Vec::new();
        while !self.shared.stopping.load(Ordering::SeqCst) {
            let stream = match self.accept() {
                Ok(s) => s,
                Err(_) if self.shared.stopping.load(Ordering::SeqCst) => break,
                Err(e) => {
                    // EMFILE, ECONNABORTED, ...: transient; do not spin.
                    let _ = e;
                    thread::sleep(Duration::from_millis(20));
                    continue;
                }
            };
            if self.shared.stopping.load(Ordering::SeqCst) {
                break;
            }
            threads.retain(|t| !t.is_finished());
            // At the limit, a newcomer takes the place of the connection idle the
            // longest, sessions last (an evicted one may still be ending: the limit
            // is on the ones served, not on threads for a moment).
            if threads.len() >= self.opts.max_connections
                && !self.shared.evict_idlest(self.opts.evict_idle_after)
            {
                stream.shutdown(Shutdown::Both);
                continue;
            }
            if let Some(t) = self.spawn(stream, &exports) {
                threads.push(t);
            }
        }
        self.drain(threads);
        self.remove_socket_file();
        Ok(())
    }

    fn accept(&self) -> io::Result<Stream> {
        match &self.listener {
            Listener::Unix { listener, .. } => listener.accept().map(|(s, _)| s.into()),
            Listener::Tcp(l) => {
                let (s, _) = l.accept()?;
                s.set_nodelay(true)?;
                Ok(s.into())
            }
        }
    }

    /// Starts a connection thread; `None` (connection dropped) if stopping or
    /// the thread cannot be made.
    fn spawn(&self, stream: Stream, exports: &Arc<dyn Exports>) -> Option<JoinHandle<()>> {
        let (id, activity) = self.shared.register(&stream)?;
        let shared = Arc::clone(&self.shared);
        let exports = Arc::clone(exports);
        let opts = self.opts.clone();
        let spawned = thread::Builder::new()
            .name(format!("nbd-conn-{id}"))
            .stack_size(CONN_STACK)
            .spawn(move || {
                let budget = Arc::clone(&shared.budget);
                let _guard = Deregister { shared, id };
                // Errors only say why this connection ended; nothing to do.
                let _ = serve_connection(stream, exports.as_ref(), &opts, budget, activity);
            });
        match spawned {
            Ok(t) => Some(t),
            Err(_) => {
                self.shared.conns().remove(&id);
                None
            }
        }
    }

    /// Waits for connection threads: read sides are shut so they finish; any
    /// still running after the grace period are cut off completely.
    fn drain(&self, threads: Vec<JoinHandle<()>>) {
        self.shared.shutdown_all(Shutdown::Read);
        let deadline = Instant::now() + SHUTDOWN_GRACE;
        while threads.iter().any(|t| !t.is_finished()) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(10));
        }
        self.shared.shutdown_all(Shutdown::Both);
        for t in threads {
            let _ = t.join();
        }
    }

    fn remove_socket_file(&self) {
        if let Listener::Unix { path, id, .. } = &self.listener {
            let ours = std::fs::symlink_metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == *id);
            if ours {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

/// Removes a connection from the registry when its thread ends (even by panic).
struct Deregister {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Deregister {
    fn drop(&mut self) {
        self.shared.conns().remove(&self.id);
    }
}

/// One connection from accept to close.
fn serve_connection(
    stream: Stream,
    exports: &dyn Exports,
    opts: &ServerOptions,
    budget: Arc<PayloadBudget>,
    activity: Arc<Activity>,
) -> io::Result<()> {
    let mut w = BufWriter::with_capacity(WRITE_BUF, stream.try_clone()?);
    let mut r = BufReader::with_capacity(READ_BUF, stream);
    r.get_mut()
        .set_deadline(Some(Instant::now() + opts.handshake_timeout))?;
    let Some(session) = handshake::negotiate(&mut r, &mut w, exports, opts)? else {
        return Ok(());
    };
    activity.establish();
    r.get_mut().set_deadline(None)?;
    r.get_mut().set_stall_timeout(Some(opts.stall_timeout))?;
    r.get_mut().set_poll_max(opts.poll_max);
    transmission::serve(&mut r, w, session, opts, budget, activity)
}

fn bind_unix(path: &Path) -> io::Result<(Listener, WakeAddr)> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ));
        }
        match connect_unix(path) {
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("a server is listening on {}", path.display()),
                ))
            }
            // Stale socket of a dead server: nobody accepts, safe to replace.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                std::fs::remove_file(path)?;
            }
            Err(e) => return Err(e),
        }
    }
    let listener = os_io::bind_unix(path)?;
    let meta = std::fs::symlink_metadata(path)?;
    let l = Listener::Unix {
        listener,
        path: path.to_path_buf(),
        id: (meta.dev(), meta.ino()),
    };
    Ok((l, WakeAddr::Unix(path.to_path_buf())))
}

/// A wildcard bind address is not connectable; wake via loopback instead.
fn wake_addr(bound: SocketAddr) -> SocketAddr {
    let mut a = bound;
    if a.ip().is_unspecified() {
        let lo: std::net::IpAddr = match a {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        };
        a.set_ip(lo);
    }
    a
}
