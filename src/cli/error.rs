//! The CLI's error type and its exit codes.

use std::fmt;

/// Success.
pub const EXIT_OK: i32 = 0;
/// A key, or a version (branch/snapshot), was not found.
pub const EXIT_NOT_FOUND: i32 = 1;
/// A usage error: bad flags or arguments, a malformed version name (clap uses this
/// code too).
pub const EXIT_USAGE: i32 = 2;
/// Any other failure: bad input data (malformed batch lines, invalid keys), a version
/// name already taken, a write to a snapshot, a missing or unreadable store, an
/// unsupported format version, I/O errors.
pub const EXIT_FAILURE: i32 = 3;
/// `verify` found problems (it prints a report).
pub const EXIT_VERIFY_PROBLEMS: i32 = 4;
/// The store failed a checksum or structural check while it was being used.
pub const EXIT_CORRUPTED: i32 = 5;
/// The command's change was committed and is durable, but a later step failed (the
/// closing checkpoint, writing the output): a warning says which. Retrying the
/// command would do the change twice (or fail with "already exists").
pub const EXIT_COMMITTED_WITH_WARNING: i32 = 6;

/// The text appended to `--help`, documenting the exit codes.
pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  success
  1  key or version (branch or snapshot) not found
  2  usage error (bad flags or arguments, bad hex in an argument, a malformed
     version name)
  3  other errors: bad input data (malformed batch line, empty or oversized key),
     a version name already taken, a write to a snapshot, missing store, not a
     store, unsupported format version, store in use, I/O errors
  4  verify found problems
  5  the store is corrupted (a checksum or structure check failed)
  6  the change was committed and is durable, but a later step failed (closing
     the store, writing the output): a warning says which; do not retry";

/// What a command returns: its value, or the failure to report.
pub type CliResult<T = ()> = Result<T, CliError>;

/// A failure to report: a one-line message on stderr and an exit code.
#[derive(Debug)]
pub struct CliError {
    /// The process exit code.
    pub code: i32,
    /// A one-line message (empty: exit quietly).
    pub msg: String,
}

impl CliError {
    /// An error with this exit code and message.
    pub fn new(code: i32, msg: impl Into<String>) -> Self {
        CliError {
            code,
            msg: one_line(msg.into()),
        }
    }

    /// Exit 1: a key or version was not found.
    pub fn not_found(msg: impl Into<String>) -> Self {
        Self::new(EXIT_NOT_FOUND, msg)
    }

    /// Exit 2: a usage error found after argument parsing.
    pub fn usage(msg: impl Into<String>) -> Self {
        Self::new(EXIT_USAGE, msg)
    }

    /// Exit 3: bad input data or another failure.
    pub fn failure(msg: impl Into<String>) -> Self {
        Self::new(EXIT_FAILURE, msg)
    }

    /// The reader of our stdout went away (e.g. `cambium scan ... | head`): stop
    /// quietly, like other Unix tools do.
    pub fn broken_pipe() -> Self {
        CliError {
            code: EXIT_OK,
            msg: String::new(),
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

/// The exit code for a library error.
pub fn exit_code_for(e: &cambium::Error) -> i32 {
    match e {
        cambium::Error::VersionNotFound(_) | cambium::Error::VolumeNotFound(_) => EXIT_NOT_FOUND,
        cambium::Error::InvalidVersionName(_) => EXIT_USAGE,
        cambium::Error::VersionExists(_) | cambium::Error::ReadOnly(_) => EXIT_FAILURE,
        cambium::Error::Corrupted { .. } => EXIT_CORRUPTED,
        _ => EXIT_FAILURE,
    }
}

impl From<cambium::Error> for CliError {
    fn from(e: cambium::Error) -> Self {
        let msg = match &e {
            cambium::Error::Poisoned(cause) => poisoned(cause),
            _ => e.to_string(),
        };
        CliError::new(exit_code_for(&e), msg)
    }
}

/// The message for a store that stopped taking writes after a write failed
/// (`Error::Poisoned`, "reopen it" in library terms). A command's store lives only
/// as long as the command, so in CLI terms: what failed, that nothing acknowledged
/// is lost (recovery at the next open restores the last durable state), and what to
/// do. It reads right both as an error (the command's change was not acknowledged)
/// and inside the warning after a commit (it was, and must not be retried).
fn poisoned(cause: &str) -> String {
    format!(
        "a write to the store failed ({cause}), so this command stopped writing. Nothing \
         acknowledged is lost: what earlier commands did, every `committed` line printed \
         and every change reported committed are on disk, and the next command recovers \
         them. Fix the cause (free some space if the disk is full), then run again what \
         was not acknowledged"
    )
}

/// An error writing our own output.
pub fn output_error(e: std::io::Error) -> CliError {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        CliError::broken_pipe()
    } else {
        CliError::failure(format!("writing output: {e}"))
    }
}

/// Keeps a message on one line.
fn one_line(msg: String) -> String {
    if msg.contains(['\n', '\r']) {
        msg.replace("\r\n", " ").replace(['\n', '\r'], " ")
    } else {
        msg
    }
}
