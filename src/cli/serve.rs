//! `cambium serve`: every volume over NBD, and a control socket through which the
//! other commands reach the store while the server holds it.
//!
//! The server opens the store for writing, with background checkpoints, for as long
//! as it runs. SIGTERM or SIGINT stops it cleanly: no new connections, each
//! connection finishes the request it is in and is closed, control requests in
//! progress finish, then the store is closed (durable, checkpointed).

use super::control::{self, Answer};
use super::error::{output_error, CliError, CliResult};
use super::open::{self, lock_wait};
use super::requests;
use super::Ctx;
use cambium::nbd::{Listen, Server, ServerOptions};
use cambium::volume::{export::VolumeExports, Volume};
use cambium::{Options, Store};
use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// The NBD socket's name in the store directory when neither --socket nor --listen
/// is given.
const DEFAULT_SOCKET_NAME: &str = "nbd.sock";

/// `serve`'s performance switches (see `cambium serve --help`).
pub struct Tuning {
    /// `--poll-max-us`.
    pub poll_max: Duration,
    /// `--zeros-ahead`.
    pub zeros_ahead: bool,
    /// `--log-small-writes`.
    pub log_small_writes: bool,
    /// `--no-huge-pages`.
    pub no_huge_pages: bool,
}

/// Keeps the server's heap off transparent huge pages, whatever the system's mode:
/// only regions that ask for them (`MADV_HUGEPAGE`) get them, which are the large
/// direct-write buffers (`io::pages`). A server's heap grows between checkpoints
/// (dirty nodes, the log of count changes), and the first touch of a fresh huge page
/// zeroes 2 MiB at once: 3 to 5 ms of one thread's time on a VM whose host backs guest
/// memory lazily, often a writer's holding the writer lock, with a snapshot waiting.
/// The binary's allocator is built not to ask for them (mimalloc's `no_thp`), which
/// is enough where the system's mode is `madvise`; this covers `always` too.
/// Best effort: kernels before 6.18 refuse the flag and change nothing.
fn huge_pages_only_where_advised() {
    /// `linux/prctl.h`'s flag (6.18), not in the `libc` crate yet.
    const PR_THP_DISABLE_EXCEPT_ADVISED: libc::c_ulong = 1 << 1;
    // SAFETY: prctl(PR_SET_THP_DISABLE) takes integers only and sets a flag of this
    // process's memory map; it touches no memory of ours.
    #[allow(unsafe_code, reason = "prctl(PR_SET_THP_DISABLE): see SAFETY")]
    let _ = unsafe {
        libc::prctl(
            libc::PR_SET_THP_DISABLE,
            1 as libc::c_ulong,
            PR_THP_DISABLE_EXCEPT_ADVISED,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
}

/// Turns transparent huge pages off for this process entirely (`serve
/// --no-huge-pages`), the direct-write buffers' too: then a direct write from 4 KiB
/// pages needs a segment per page, and a virtio disk takes at most 254 a request,
/// so large writes go out in requests under 1 MiB (1 MiB sequential writes ran at
/// about half the rate; BENCHMARKS.md, "Huge pages for buffers, not for the heap").
/// For a system where huge pages misbehave. Best effort, like the default's.
fn no_huge_pages() {
    // SAFETY: as in `huge_pages_only_where_advised`.
    #[allow(unsafe_code, reason = "prctl(PR_SET_THP_DISABLE): see SAFETY")]
    let _ = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
}

/// `cambium serve DIR [--socket PATH | --listen ADDR:PORT] [--poll-max-us N]
/// [--zeros-ahead] [--log-small-writes] [--no-huge-pages]`
pub fn serve(
    ctx: &Ctx,
    out: &mut impl Write,
    dir: &Path,
    socket: Option<&Path>,
    listen: Option<&str>,
    tuning: Tuning,
) -> CliResult {
    // First, so that a SIGTERM or SIGINT while the store opens (a long recovery) or
    // the server binds is held until the server runs, which then stops cleanly at
    // once, rather than ending the process as the default action would.
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ])
    .map_err(|e| CliError::failure(format!("installing signal handlers: {e}")))?;
    // Before the store opens and the server's memory grows.
    if tuning.no_huge_pages {
        no_huge_pages();
    } else {
        huge_pages_only_where_advised();
    }
    let opts = Options {
        lock_wait: lock_wait(),
        data_zeros_ahead: tuning.zeros_ahead,
        // Off unless asked: see `Options::log_small_values` (a volume's flushes of
        // small writes would write each data byte three times).
        log_small_values: tuning.log_small_writes,
        // A restarted server goes on writing over old blocks: see the option.
        keep_spares_at_close: true,
        ..Default::default()
    };
    let Some(store) = open_beside_commands(dir, opts, &mut signals)? else {
        // Stopped by a signal while it waited: nothing was opened.
        return Ok(());
    };
    // An absolute socket path, so that the URIs printed work from anywhere.
    let unix = |path: &Path| {
        std::path::absolute(path)
            .map(Listen::Unix)
            .map_err(|e| CliError::usage(format!("{}: {e}", path.display())))
    };
    let listen = match (socket, listen) {
        (Some(path), _) => unix(path)?,
        (None, Some(addr)) => Listen::Tcp(addr.to_owned()),
        (None, None) => unix(&dir.join(DEFAULT_SOCKET_NAME))?,
    };
    let server_opts = ServerOptions {
        poll_max: tuning.poll_max,
        ..ServerOptions::default()
    };
    let server = Server::bind(&listen, server_opts).map_err(|e| {
        let msg = format!("listen on {}: {e}", describe(&listen));
        match e.kind() {
            // Not an ADDR:PORT at all (a well-formed address that cannot be used,
            // a port taken, is exit 3).
            std::io::ErrorKind::InvalidInput => CliError::usage(msg),
            _ => CliError::failure(msg),
        }
    })?;
    let control = Control::start(dir, store.clone())?;
    let stop = server.shutdown_handle();
    let cutoff = control.cutoff.clone();
    let signal_handle = signals.handle();
    let watcher = std::thread::spawn(move || {
        let mut received = signals.forever();
        if received.next().is_some() {
            // Control requests' input ends now too: the connections' drain must not
            // wait for a command's producer.
            cutoff.cut_off();
            stop.shutdown();
            // A second signal while stopping (a long control request, the closing
            // checkpoint): the user insists, and the store is crash-safe, so the
            // process ends as the signal's default action would.
            if let Some(signal) = received.next() {
                let _ = signal_hook::low_level::emulate_default_handler(signal);
            }
        }
    });
    announce(ctx, out, &store, &server, &listen)?;
    let failures = FailureLog::default();
    let exports = VolumeExports::new(store.clone())
        .on_failure(Arc::new(move |volume, e| failures.report(volume, e)));
    let served = server.run(Arc::new(exports));
    control.stop();
    let served = served.map_err(|e| CliError::failure(format!("serving: {e}")));
    // Every connection and control request has ended: nothing else uses the store.
    let closed = served.and_then(|()| Ok(store.close()?));
    signal_handle.close();
    let _ = watcher.join();
    closed
}

/// Opens the store for the server. Without `--wait`, a command that holds the store
/// as the server starts (a script running both at once) is waited for, up to
/// [`open::SERVER_START_WAIT`], but not another server (looked at twice: the lock's
/// record may name the previous holder for a moment). `None`: a SIGTERM or SIGINT
/// came while it waited.
fn open_beside_commands(
    dir: &Path,
    opts: Options,
    signals: &mut signal_hook::iterator::Signals,
) -> CliResult<Option<Store>> {
    if opts.lock_wait.is_some() {
        return Ok(Some(Store::open_with(dir, opts)?));
    }
    let deadline = std::time::Instant::now() + open::SERVER_START_WAIT;
    let mut looked_at_server = false;
    loop {
        match Store::open_with(dir, opts.clone()) {
            Err(cambium::Error::Locked { pid: Some(pid) })
                if std::time::Instant::now() < deadline
                    && !(looked_at_server && open::is_serve(pid)) =>
            {
                looked_at_server |= open::is_serve(pid);
                std::thread::sleep(Duration::from_millis(50));
                if signals.pending().next().is_some() {
                    return Ok(None);
                }
            }
            opened => return Ok(Some(opened.map_err(open::in_use_hint)?)),
        }
    }
}

/// How often the same failure is printed again while it repeats (a store that
/// stopped taking writes fails every request; the first says why).
const FAILURE_REPEAT_EVERY: Duration = Duration::from_secs(10);

/// Prints to stderr the store's failures that clients were answered with: a client
/// sees only an errno. A failure the same as the last one printed is counted rather
/// than printed until [`FAILURE_REPEAT_EVERY`] has passed.
#[derive(Default)]
struct FailureLog {
    /// The last line printed, when, and how many like it were not printed since.
    last: Mutex<Option<(String, std::time::Instant, u64)>>,
}

impl FailureLog {
    fn report(&self, volume: &str, e: &cambium::Error) {
        self.report_to(
            &mut std::io::stderr().lock(),
            std::time::Instant::now(),
            volume,
            e,
        );
    }

    fn report_to(
        &self,
        err: &mut impl Write,
        now: std::time::Instant,
        volume: &str,
        e: &cambium::Error,
    ) {
        let line = format!("cambium serve: volume {volume}: {e}");
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((prev, at, repeats)) = last.as_mut() {
            if *prev == line && now.duration_since(*at) < FAILURE_REPEAT_EVERY {
                *repeats += 1;
                return;
            }
        }
        if let Some((prev, _, repeats)) = last.take().filter(|l| l.2 > 0) {
            let _ = writeln!(err, "{prev} (and {repeats} more times)");
        }
        let _ = writeln!(err, "{line}");
        *last = Some((line, now, 0));
    }
}

fn describe(listen: &Listen) -> String {
    match listen {
        Listen::Unix(path) => path.display().to_string(),
        Listen::Tcp(addr) => addr.clone(),
    }
}

/// Says where the volumes are, one URI per export, and flushes at once (scripts wait
/// for this line before connecting).
fn announce(
    ctx: &Ctx,
    out: &mut impl Write,
    store: &Store,
    server: &Server,
    listen: &Listen,
) -> CliResult {
    let names = Volume::names(store)?;
    let addr = server.local_addr();
    let uri = |name: &str| match listen {
        Listen::Unix(_) => format!("nbd+unix:///{name}?socket={addr}"),
        Listen::Tcp(_) => format!("nbd://{addr}/{name}"),
    };
    if ctx.json {
        let exports: Vec<_> = names
            .iter()
            .map(|(name, snapshot)| serde_json::json!({"name": name, "read_only": snapshot, "uri": uri(name)}))
            .collect();
        let line = serde_json::json!({"listening": addr, "exports": exports});
        writeln!(out, "{line}").map_err(output_error)?;
    } else {
        writeln!(out, "serving {} volume(s) on {addr}", names.len()).map_err(output_error)?;
        for (name, snapshot) in &names {
            let ro = if *snapshot { " (read-only)" } else { "" };
            writeln!(out, "  {}{ro}", uri(name)).map_err(output_error)?;
        }
    }
    out.flush().map_err(output_error)
}

/// How long a control client may take to send its request.
const CONTROL_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A control connection in progress: its thread, and its socket, so that a stop
/// can cut off a client that has not sent its request.
struct Pending {
    thread: JoinHandle<()>,
    conn: UnixStream,
    accepted: std::time::Instant,
    /// Set once its request is read: from then on it is a command at work.
    received: Arc<AtomicBool>,
}

/// A control connection that has sent no request this long after it was accepted
/// (a `cambium` command sends its request at once) is closed to make room when the
/// requests in progress are at [`MAX_CONTROL_REQUESTS`]: connections that say
/// nothing must not keep commands out.
const CONTROL_EVICT_SILENT_AFTER: Duration = Duration::from_millis(100);

/// Most control requests in progress at once; beyond them a request is refused.
const MAX_CONTROL_REQUESTS: usize = 64;

/// How long a stop waits for the control requests in progress to answer before it
/// cuts off the clients that do not read their answers.
const CONTROL_STOP_GRACE: Duration = Duration::from_secs(5);

/// The control socket's accept loop and the requests in progress.
struct Control {
    cutoff: ControlCutoff,
    accept: JoinHandle<()>,
}

/// Stops the control socket's requests, from any thread (the signal watcher's too).
#[derive(Clone)]
struct ControlCutoff {
    path: PathBuf,
    /// The listening socket, also held here so that a stop can wake its accept loop
    /// even when the socket file is gone (removed by hand).
    listener: Arc<UnixListener>,
    stopping: Arc<AtomicBool>,
    requests: Arc<Mutex<Vec<Pending>>>,
}

impl ControlCutoff {
    /// Stops accepting and ends the input of every request in progress: one still
    /// being read ends there, a batch's or an import's input ends short (what it had
    /// not committed is not), one already read runs on. Idempotent.
    fn cut_off(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        // Wake the accept loop: a connection, or, if the socket file is gone, a
        // shutdown of the listening socket, which fails its `accept` (Linux: EINVAL).
        if cambium::io::connect_unix(&self.path).is_err() {
            use std::os::fd::AsRawFd;
            let fd = self.listener.as_raw_fd();
            // SAFETY: `fd` is the listening socket `self.listener` owns, open for as
            // long as this `Arc` lives; shutdown takes no pointers.
            #[allow(unsafe_code, reason = "shutdown of a listening socket: see SAFETY")]
            unsafe {
                libc::shutdown(fd, libc::SHUT_RDWR);
            }
        }
        for p in self
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            let _ = p.conn.shutdown(std::net::Shutdown::Read);
        }
    }
}

impl Control {
    /// Binds `control.sock` in the store directory (replacing a stale one: the
    /// writer lock we hold says no other server runs on this store).
    fn start(dir: &Path, store: Store) -> CliResult<Control> {
        let path = control::socket_path(dir);
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if !std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()) => {
                return Err(CliError::failure(format!(
                    "{} exists and is not a socket (move it away)",
                    path.display()
                )));
            }
            Ok(_) => {
                let _ = std::fs::remove_file(&path);
            }
            Err(_) => {}
        }
        let listener = cambium::io::bind_unix(&path)
            .map_err(|e| CliError::failure(format!("bind {}: {e}", path.display())))?;
        let cutoff = ControlCutoff {
            path,
            listener: Arc::new(listener),
            stopping: Arc::new(AtomicBool::new(false)),
            requests: Arc::default(),
        };
        let accept = {
            let (listener, stopping, requests) = (
                cutoff.listener.clone(),
                cutoff.stopping.clone(),
                cutoff.requests.clone(),
            );
            std::thread::spawn(move || accept_loop(&listener, &store, &stopping, &requests))
        };
        Ok(Control { cutoff, accept })
    }

    /// Stops accepting, cuts off the requests' input, waits for the requests in
    /// progress (they finish and answer; a client that does not read its answer is
    /// cut off after a grace period), removes the socket.
    fn stop(self) {
        let Control { cutoff, accept } = self;
        cutoff.cut_off();
        let _ = accept.join();
        // Also a request accepted while the first cut-off ran.
        cutoff.cut_off();
        let pending =
            std::mem::take(&mut *cutoff.requests.lock().unwrap_or_else(|p| p.into_inner()));
        let deadline = std::time::Instant::now() + CONTROL_STOP_GRACE;
        while pending.iter().any(|p| !p.thread.is_finished())
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        for p in pending {
            if !p.thread.is_finished() {
                let _ = p.conn.shutdown(std::net::Shutdown::Both);
            }
            let _ = p.thread.join();
        }
        let _ = std::fs::remove_file(&cutoff.path);
    }
}

fn accept_loop(
    listener: &UnixListener,
    store: &Store,
    stopping: &AtomicBool,
    requests: &Mutex<Vec<Pending>>,
) {
    for conn in listener.incoming() {
        if stopping.load(Ordering::SeqCst) {
            return;
        }
        let Ok(conn) = conn else {
            // Out of descriptors, say: give the requests in progress time to end
            // rather than spin.
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        let mut live = requests.lock().unwrap_or_else(|p| p.into_inner());
        live.retain(|p| !p.thread.is_finished());
        if live.len() >= MAX_CONTROL_REQUESTS {
            // The connection silent the longest makes room, if one has been long
            // enough (its thread ends at the closed socket).
            let silent = live
                .iter()
                .enumerate()
                .filter(|(_, p)| {
                    !p.received.load(Ordering::SeqCst)
                        && p.accepted.elapsed() >= CONTROL_EVICT_SILENT_AFTER
                })
                .min_by_key(|(_, p)| p.accepted)
                .map(|(i, _)| i);
            if let Some(i) = silent {
                let _ = live.swap_remove(i).conn.shutdown(std::net::Shutdown::Both);
            }
        }
        if live.len() >= MAX_CONTROL_REQUESTS {
            let _ = conn.set_write_timeout(Some(Duration::from_secs(1)));
            let busy = Answer::Failed {
                code: super::error::EXIT_FAILURE,
                msg: format!(
                    "the server is running {MAX_CONTROL_REQUESTS} commands already; try again"
                ),
            };
            let _ = control::write_answer(&conn, &busy);
            continue;
        }
        let Ok(handle) = conn.try_clone() else {
            continue;
        };
        // A client that connects and says nothing does not hold a thread for long.
        let _ = conn.set_read_timeout(Some(CONTROL_READ_TIMEOUT));
        let store = store.clone();
        let received = Arc::new(AtomicBool::new(false));
        let flag = received.clone();
        let thread = std::thread::spawn(move || {
            answer(&conn, &store, &flag);
            // Closed for the client now, not when the accept loop lets go of its
            // handle (a copy of this socket).
            let _ = conn.shutdown(std::net::Shutdown::Both);
        });
        live.push(Pending {
            thread,
            conn: handle,
            accepted: std::time::Instant::now(),
            received,
        });
    }
}

/// Runs one control request and answers it: what it prints, as it prints it, then
/// how it ended.
fn answer(conn: &UnixStream, store: &Store, received: &AtomicBool) {
    let mut reader = std::io::BufReader::new(conn);
    let envelope = match control::read_request(&mut reader) {
        Ok(envelope) => envelope,
        Err(answer) => {
            let _ = control::write_answer(conn, &answer);
            return;
        }
    };
    received.store(true, Ordering::SeqCst);
    let request = &envelope.request;
    if request.wants_short_slice() {
        // A snapshot or clone waits for the writer lock behind a busy volume's
        // writes; handed the lock, it must also get a CPU, which on a loaded
        // machine took up to 4 ms with the default slice.
        cambium::io::request_short_slice();
    }
    if request.takes_input() {
        // The input comes as fast as the command's producer writes it.
        let _ = conn.set_read_timeout(None);
    }
    let notices = conn.try_clone();
    let progress = conn.try_clone();
    let ctx = Ctx::new(envelope.hex, envelope.json, false)
        .on_commit(move |what| {
            if let Ok(notices) = &notices {
                let _ = control::write_answer(notices, &Answer::Committed(what.map(str::to_owned)));
            }
        })
        .on_progress(move |what, done, total| {
            if let Ok(progress) = &progress {
                let what = what.to_owned();
                let _ = control::write_answer(progress, &Answer::Progress { what, done, total });
            }
        });
    // Messages name the store as the command was given it.
    let dir = envelope.dir.as_deref().map_or(store.path(), Path::new);
    let mut out = control::AnswerWriter::new(conn);
    let mut input = control::FramedInput::new(reader);
    let result = request
        .check()
        .and_then(|()| requests::execute(store, dir, &ctx, request, &mut input, &mut out))
        .and_then(|()| out.flush().map_err(output_error));
    let answer = match result {
        Ok(()) => Answer::Done,
        Err(e) => {
            let _ = out.flush();
            let e = ctx.after_commit(e);
            Answer::Failed {
                code: e.code,
                msg: e.msg,
            }
        }
    };
    let _ = control::write_answer(conn, &answer);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first failure is printed at once; the same one again is only counted
    /// until the repeat interval has passed, then printed with its count; another
    /// failure is printed at once.
    #[test]
    fn failures_are_printed_once_then_counted() {
        let log = FailureLog::default();
        let full = cambium::Error::Io(std::io::Error::new(
            std::io::ErrorKind::StorageFull,
            "no space left",
        ));
        let other = cambium::Error::Io(std::io::Error::other("read failed"));
        let t0 = std::time::Instant::now();
        let mut out = Vec::new();
        for i in 0..5 {
            log.report_to(&mut out, t0 + Duration::from_millis(i), "disk", &full);
        }
        let printed = String::from_utf8(out.clone()).unwrap();
        assert_eq!(printed.lines().count(), 1, "{printed}");
        assert!(
            printed.starts_with("cambium serve: volume disk: "),
            "{printed}"
        );
        assert!(printed.contains("no space left"), "{printed}");

        out.clear();
        log.report_to(&mut out, t0 + FAILURE_REPEAT_EVERY, "disk", &full);
        let printed = String::from_utf8(out.clone()).unwrap();
        let lines: Vec<_> = printed.lines().collect();
        assert_eq!(lines.len(), 2, "{printed}");
        assert!(lines[0].ends_with("(and 4 more times)"), "{printed}");

        out.clear();
        log.report_to(&mut out, t0 + FAILURE_REPEAT_EVERY, "disk", &other);
        let printed = String::from_utf8(out).unwrap();
        assert_eq!(printed.lines().count(), 1, "{printed}");
        assert!(printed.contains("read failed"), "{printed}");
    }
}
