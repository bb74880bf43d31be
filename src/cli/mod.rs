//! The `cambium` command-line tool: argument parsing, dispatch, output and exit codes.
//!
//! Exit codes (also in `--help` and the README): 0 success, 1 key or version not
//! found, 2 usage error (including a malformed version name), 3 other errors (bad
//! input data, a version name already taken, a write to a snapshot, missing store,
//! not a store, unsupported format version, I/O), 4 `verify` found problems, 5
//! corruption.

mod admin; // init, stats, verify
mod args; // the command line, as clap parses it
mod batch; // batch: operations from stdin, applied to an open store
mod codec; // key and value text <-> bytes; sizes and times for people
mod control; // the control socket: commands run by a serving process
mod data; // get, scan; put and del on an open store
mod error; // CliError and the exit codes
mod open; // opening a store, a branch to write, a version to read
mod output; // printing pairs, JSON, counts, the spinner
mod requests; // every writing command, run here or in a serving process
mod serve; // serve: volumes over NBD
mod space; // backrefs; clean, defrag and shrink on an open store
mod tour; // tour: the guided walk
mod versions; // snapshot, branch, versions, drop, diff
mod volume; // volume create, list, snapshot, clone, drop, resize, import, export

use args::{Cli, Command};
use clap::Parser;
use codec::Encoding;
use error::{output_error, CliError, CliResult, EXIT_COMMITTED_WITH_WARNING, EXIT_OK};
use std::io::Write;
use std::time::Duration;

/// Settings shared by every command, and what it has made durable so far.
pub struct Ctx {
    /// How keys and values are read and printed.
    pub enc: Encoding,
    /// Print JSON.
    pub json: bool,
    /// The command runs in its own process (`false`: in `serve`, for a command that
    /// reached it over the control socket). Only a local command draws progress bars
    /// on stderr; one in the server reads its input ahead of holding the writer lock.
    pub local: bool,
    /// Set once the command's whole change is committed and durable (what it is, for
    /// people): a failure after that point is reported as a warning with exit 6, not
    /// as an error that invites a retry of something already done.
    committed: std::cell::RefCell<Option<String>>,
    /// Told of every change to `committed` (in `serve`: the command's process is
    /// told, so that it reports a failure of its own afterwards, writing the output,
    /// as a warning too).
    on_commit: Option<CommitNotice>,
    /// Told how far a long command (a volume import or export) has got, in a server:
    /// the command's process draws the progress bar (`control::Answer::Progress`).
    on_progress: Option<ProgressNotice>,
}

/// What [`Ctx::on_commit`] calls.
type CommitNotice = Box<dyn Fn(Option<&str>)>;

/// What [`Ctx::on_progress`] calls: what is under way ("importing"), bytes done,
/// and the total if known.
pub type ProgressNotice = Box<dyn Fn(&str, u64, Option<u64>)>;

impl Ctx {
    /// The settings of a command: keys and values in hex or as text, JSON or not.
    pub fn new(hex: bool, json: bool, local: bool) -> Self {
        Ctx {
            enc: if hex { Encoding::Hex } else { Encoding::Text },
            json,
            local,
            committed: std::cell::RefCell::new(None),
            on_commit: None,
            on_progress: None,
        }
    }

    /// Calls `notify` as a long command gets on (see [`Ctx::on_progress`]'s field).
    pub fn on_progress(mut self, notify: impl Fn(&str, u64, Option<u64>) + 'static) -> Self {
        self.on_progress = Some(Box::new(notify));
        self
    }

    /// Where a long command reports its progress (see `volume::Progress`).
    pub fn progress_notice(&self) -> Option<&ProgressNotice> {
        self.on_progress.as_ref()
    }

    /// Calls `notify` on every change to what the command has made durable.
    pub fn on_commit(mut self, notify: impl Fn(Option<&str>) + 'static) -> Self {
        self.on_commit = Some(Box::new(notify));
        self
    }

    /// Records that the command's change is durable: `what` completes "... and is
    /// durable", e.g. `snapshot "s" was created`.
    pub fn committed(&self, what: impl Into<String>) {
        let what = what.into();
        if let Some(notify) = &self.on_commit {
            notify(Some(&what));
        }
        *self.committed.borrow_mut() = Some(what);
    }

    /// Whether the command has made a change durable.
    pub fn has_committed(&self) -> bool {
        self.committed.borrow().is_some()
    }

    /// Takes back [`Ctx::committed`]: the commit changed nothing (a delete of a
    /// missing key), so what follows is the command's answer, not a late failure.
    pub fn changed_nothing(&self) {
        if let Some(notify) = &self.on_commit {
            notify(None);
        }
        self.committed.borrow_mut().take();
    }

    /// A failure after the commit point becomes a warning that says the data is safe.
    pub fn after_commit(&self, e: CliError) -> CliError {
        let Some(what) = self.committed.borrow_mut().take() else {
            return e;
        };
        let afterwards = if e.msg.is_empty() {
            "the reader of the output went away".to_owned()
        } else {
            e.msg
        };
        CliError::new(
            EXIT_COMMITTED_WITH_WARNING,
            format!(
                "{what} and is durable (do not retry it); afterwards this failed: {afterwards}"
            ),
        )
    }
}

/// Runs the tool on the process's arguments and returns the exit code.
pub fn run() -> i32 {
    // A large store keeps more segment files open than a shell's usual soft limit.
    cambium::io::raise_open_file_limit();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Usage errors exit 2; --help and --version print to stdout and exit 0.
            let _ = e.print();
            return e.exit_code();
        }
    };
    match dispatch(cli) {
        Ok(()) => EXIT_OK,
        Err(e) => {
            let label = if e.code == EXIT_COMMITTED_WITH_WARNING {
                "warning"
            } else {
                "error"
            };
            if !e.msg.is_empty() {
                // A closed or full stderr leaves only the exit code to tell.
                let _ = writeln!(std::io::stderr(), "cambium: {label}: {}", e.msg);
            }
            e.code
        }
    }
}

fn dispatch(cli: Cli) -> CliResult {
    let ctx = Ctx::new(cli.hex, cli.json, true);
    open::set_lock_wait(cli.wait);
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let result = match &cli.command {
        Command::Init { dir } => admin::init(dir),
        Command::Put {
            dir,
            key,
            value,
            branch,
        } => requests::put(&ctx, &mut out, dir, key, value, branch),
        Command::Get {
            dir,
            key: Some(key),
            at,
            stdin: false,
        } => data::get(&ctx, &mut out, dir, key, at.as_deref()),
        Command::Get { dir, at, .. } => data::get_stdin(
            &ctx,
            &mut out,
            &mut std::io::stdin().lock(),
            dir,
            at.as_deref(),
        ),
        Command::Del { dir, key, branch } => requests::del(&ctx, &mut out, dir, key, branch),
        Command::Scan(a) => data::scan(&ctx, &mut out, a),
        Command::Batch {
            dir,
            branch,
            commit_every,
        } => requests::batch(&ctx, &mut out, dir, branch, *commit_every),
        Command::Checkpoint { dir } => requests::checkpoint(&ctx, &mut out, dir),
        Command::Stats { dir } => admin::stats(&ctx, &mut out, dir),
        Command::Verify { dir } => admin::verify(&ctx, &mut out, dir),
        Command::Snapshot { dir, source, name } => {
            requests::snapshot(&ctx, &mut out, dir, source, name)
        }
        Command::Branch { dir, source, name } => {
            requests::branch(&ctx, &mut out, dir, source, name)
        }
        Command::Versions { dir } => versions::versions(&ctx, &mut out, dir),
        Command::Drop { dir, name } => requests::drop(&ctx, &mut out, dir, name),
        Command::Diff {
            dir,
            a,
            b,
            keys_only,
        } => versions::diff(&ctx, &mut out, dir, a, b, *keys_only),
        Command::Clean {
            dir,
            until_dead_below,
        } => requests::clean(&ctx, &mut out, dir, *until_dead_below),
        Command::Defrag { dir, version } => {
            requests::defrag(&ctx, &mut out, dir, version.as_deref())
        }
        Command::Shrink { dir } => requests::shrink(&ctx, &mut out, dir),
        Command::Backrefs { dir, segment, at } => {
            space::backrefs(&ctx, &mut out, dir, *segment, at.as_deref())
        }
        Command::Tour { keys, keep } => tour::tour(&ctx, &mut out, *keys, *keep),
        Command::Volume(cmd) => requests::volume(&ctx, &mut out, cmd),
        Command::Serve {
            dir,
            socket,
            listen,
            poll_max_us,
            zeros_ahead,
            log_small_writes,
            no_huge_pages,
        } => serve::serve(
            &ctx,
            &mut out,
            dir,
            socket.as_deref(),
            listen.as_deref(),
            serve::Tuning {
                poll_max: Duration::from_micros(*poll_max_us),
                zeros_ahead: *zeros_ahead,
                log_small_writes: *log_small_writes,
                no_huge_pages: *no_huge_pages,
            },
        ),
    };
    // Whatever was printed before a failure still goes out.
    let flushed = out.flush().map_err(output_error);
    result.and(flushed).map_err(|e| ctx.after_commit(e))
}
