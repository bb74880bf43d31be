//! Opening a store for a command: creating one, opening one read-only or writable,
//! and the version to read or write in it (a write transaction on a branch, a read
//! view of a version).

use super::error::{exit_code_for, CliError, CliResult};
use super::Ctx;
use cambium::{Options, ReadTxn, Store, WriteTxn};
use std::path::Path;
use std::time::Duration;

/// How long a writing command waits for another writer (`--wait`); set once, at
/// the start.
static LOCK_WAIT: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();

/// Sets how long writing commands wait for another process's writer.
pub fn set_lock_wait(wait: Option<Duration>) {
    let _ = LOCK_WAIT.set(wait);
}

/// The `--wait` given, if any.
pub fn lock_wait() -> Option<Duration> {
    LOCK_WAIT.get().copied().flatten()
}

/// Opens a store for reading only: nothing is created or written, and a writer in
/// another process neither blocks it nor is blocked by it.
pub fn open_read_only(dir: &Path) -> Result<Store, cambium::Error> {
    Store::open_with(
        dir,
        Options {
            read_only: true,
            background_checkpoints: false,
            ..Default::default()
        },
    )
}

/// Opens a store for writing, without a background checkpoint thread (the command
/// checkpoints when it closes the store), waiting at most `wait` for another process's
/// writer; its error as the engine gives it.
pub fn open_writable_waiting(dir: &Path, wait: Option<Duration>) -> Result<Store, cambium::Error> {
    Store::open_with(
        dir,
        Options {
            lock_wait: wait,
            ..writable()
        },
    )
}

/// How long, without `--wait`, a command waits for a `serve` starting on the store
/// to answer on its control socket (counted from the server's start), and `serve` for
/// a command that holds the store as it starts to finish: two processes started
/// together by a script must not fail by a race.
pub const SERVER_START_WAIT: Duration = Duration::from_secs(30);

/// Whether process `pid` is a `cambium serve`: its program is `cambium…` and its
/// first argument that is not an option is `serve` (from `/proc/PID/cmdline`).
pub fn is_serve(pid: u32) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let mut args = cmdline.split(|&b| b == 0);
    let program = args.next().unwrap_or_default();
    Path::new(std::ffi::OsStr::from_bytes(program))
        .file_name()
        .is_some_and(|name| name.to_string_lossy().starts_with("cambium"))
        && args.find(|a| !a.starts_with(b"-")) == Some(b"serve".as_slice())
}

/// How much longer to wait for process `pid`, if it is a `cambium serve` started less
/// than [`SERVER_START_WAIT`] ago (a server running for longer is not starting: a
/// command does not wait for a control socket it has lost).
pub fn serve_starting(pid: u32) -> Option<Duration> {
    if !is_serve(pid) {
        return None;
    }
    SERVER_START_WAIT.checked_sub(process_age(pid)?)
}

/// How long ago process `pid` started (`/proc/PID/stat`'s start time, in clock ticks
/// of 1/100 s, the `USER_HZ` Linux shows every program, against `/proc/uptime`).
fn process_age(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) in parentheses; the
    // start time is field 22, the 20th after it.
    let after_name = &stat[stat.rfind(')')? + 1..];
    let ticks: u64 = after_name.split_whitespace().nth(19)?.parse().ok()?;
    let uptime = std::fs::read_to_string("/proc/uptime").ok()?;
    let uptime: f64 = uptime.split_whitespace().next()?.parse().ok()?;
    #[expect(clippy::cast_precision_loss, reason = "seconds since boot, to 10 ms")]
    let started = ticks as f64 / 100.0;
    Some(Duration::from_secs_f64((uptime - started).max(0.0)))
}

/// A store in use by another writer: say what works meanwhile, or how long we waited.
pub fn in_use_hint(e: cambium::Error) -> CliError {
    if !matches!(e, cambium::Error::Locked { .. }) {
        return e.into();
    }
    let hint = match lock_wait() {
        None => "; reading commands work beside it, and --wait[=SECONDS] waits for it".to_owned(),
        Some(w) => format!(" after waiting {:.1} s (--wait)", w.as_secs_f64()),
    };
    CliError::new(exit_code_for(&e), format!("{e}{hint}"))
}

/// Creates a new, empty store, open for writing like [`open_writable_waiting`].
pub fn create(dir: &Path) -> Result<Store, cambium::Error> {
    Store::create_with(dir, writable())
}

/// The options a command writes with: no background checkpoint thread, and the
/// `--wait` given.
fn writable() -> Options {
    Options {
        background_checkpoints: false,
        lock_wait: lock_wait(),
        ..Default::default()
    }
}

/// Where a writing command writes.
#[derive(Clone, Copy)]
pub struct Target<'a> {
    /// The store directory (for messages).
    pub dir: &'a Path,
    /// The branch.
    pub branch: &'a str,
}

/// Starts a write transaction on the target branch. A write to a snapshot fails
/// (exit 3) with a hint on how to get a writable copy.
pub fn begin<'s>(store: &'s Store, target: Target<'_>) -> CliResult<WriteTxn<'s>> {
    let Target { dir, branch } = target;
    // A volume's keys are block addresses and its values blocks of its size: a pair
    // written there by hand would make a block that does not read back.
    if cambium::volume::Volume::is_volume(store, branch)? {
        return Err(CliError::failure(format!(
            "{branch} is a block volume: write it over NBD (cambium serve {}) or with cambium volume import",
            dir.display()
        )));
    }
    let txn = if branch == cambium::MAIN_BRANCH {
        store.begin_write()
    } else {
        store.begin_write_on(branch)
    };
    txn.map_err(|e| match e {
        cambium::Error::ReadOnly(_) => CliError::new(
            exit_code_for(&e),
            format!(
                "{e} (to write, make a branch of it: cambium branch {} {branch} NEW-NAME)",
                dir.display()
            ),
        ),
        e => e.into(),
    })
}

/// Runs `f` in one transaction on the target branch and commits it. `what` names
/// the change for the warning a failure after the commit gets ("the put of "k" on
/// main").
pub fn write_one<T>(
    ctx: &Ctx,
    store: &Store,
    target: Target<'_>,
    what: &str,
    f: impl FnOnce(&mut WriteTxn) -> cambium::Result<T>,
) -> CliResult<T> {
    let mut txn = begin(store, target)?;
    let v = f(&mut txn)?;
    txn.commit()?;
    ctx.committed(format!("{what} was committed"));
    Ok(v)
}

/// Checks a version name given on the command line: a malformed one is a usage error
/// (exit 2), whether it names a new version or an existing one.
pub fn check_name(name: &str) -> CliResult {
    cambium::check_version_name(name).map_err(CliError::from)
}

/// Checks the version named by `--at`, if one is.
pub fn check_at(at: Option<&str>) -> CliResult {
    at.map_or(Ok(()), check_name)
}

/// A consistent view of `at` (a branch or a snapshot), or of `main`.
pub fn read_view(store: &Store, at: Option<&str>) -> CliResult<ReadTxn> {
    Ok(match at {
        Some(v) => store.read_at(v)?,
        None => store.read()?,
    })
}
