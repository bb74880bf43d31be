//! The control socket: how a command reaches the `cambium serve` that holds a store.
//!
//! `serve` holds the store's writer lock for as long as it runs, so a command that
//! changes the store (`volume create`, `volume snapshot`, `snapshot`, `drop`, ...)
//! cannot open it. Instead it finds `control.sock` in the store directory and sends
//! its request there: one line of JSON, answered by one line of JSON, on a
//! connection of its own. The server runs the request on its open store (so a new
//! volume or snapshot is exported at once) and the command prints the answer as if
//! it had done the work itself, with the same output and exit code.
//!
//! A socket file nobody answers on (a killed server's) is ignored: the command opens
//! the store itself, and the next `serve` replaces the file.

use super::error::{CliError, CliResult, EXIT_USAGE};
use super::open::check_name;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// The control socket's file name in the store directory.
pub const SOCKET_NAME: &str = "control.sock";

/// The longest request or answer line accepted.
pub const MAX_LINE_BYTES: u64 = 1 << 20;

/// A command, as sent to the server.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Request {
    /// `volume create`
    VolumeCreate {
        /// The new volume.
        name: String,
        /// Its size.
        size_bytes: u64,
        /// Its block size.
        block_size: u32,
    },
    /// `volume list`
    VolumeList,
    /// `volume snapshot`
    VolumeSnapshot {
        /// The volume.
        volume: String,
        /// The snapshot.
        name: String,
    },
    /// `volume clone`
    VolumeClone {
        /// The volume or snapshot cloned.
        source: String,
        /// The clone.
        name: String,
    },
    /// `volume drop`
    VolumeDrop {
        /// The volume.
        name: String,
    },
    /// `volume resize`
    VolumeResize {
        /// The volume.
        name: String,
        /// Its new size.
        size_bytes: u64,
    },
    /// `volume import`
    VolumeImport {
        /// The new volume.
        name: String,
        /// The raw image (an absolute path: the server has its own working directory).
        file: String,
        /// The block size.
        block_size: u32,
    },
    /// `volume export`
    VolumeExport {
        /// The volume.
        name: String,
        /// The file to write (absolute).
        file: String,
    },
    /// `snapshot`
    Snapshot {
        /// The version copied.
        source: String,
        /// The snapshot.
        name: String,
    },
    /// `branch`
    Branch {
        /// The version copied.
        source: String,
        /// The branch.
        name: String,
    },
    /// `drop`
    Drop {
        /// The version.
        name: String,
    },
}

impl Request {
    /// Checks the names it carries (exit 2 for a malformed one).
    pub fn check(&self) -> CliResult {
        for name in self.names() {
            check_name(name)?;
        }
        Ok(())
    }

    fn names(&self) -> Vec<&str> {
        match self {
            Request::VolumeList => vec![],
            Request::VolumeCreate { name, .. }
            | Request::VolumeDrop { name }
            | Request::VolumeResize { name, .. }
            | Request::VolumeImport { name, .. }
            | Request::VolumeExport { name, .. }
            | Request::Drop { name } => vec![name],
            Request::VolumeSnapshot { volume, name } => vec![volume, name],
            Request::VolumeClone { source, name }
            | Request::Snapshot { source, name }
            | Request::Branch { source, name } => vec![source, name],
        }
    }

    /// Whether it only reads (it may then run beside a writer, on a read-only open).
    pub fn is_read_only(&self) -> bool {
        matches!(self, Request::VolumeList | Request::VolumeExport { .. })
    }

    /// What it changes, for the warning after a commit ("... and is durable").
    pub fn describe(&self) -> String {
        match self {
            Request::VolumeCreate { name, .. } | Request::VolumeImport { name, .. } => {
                format!("volume {name:?} was created")
            }
            Request::VolumeSnapshot { name, .. } | Request::Snapshot { name, .. } => {
                format!("snapshot {name:?} was created")
            }
            Request::VolumeClone { name, .. } => format!("volume {name:?} was created"),
            Request::Branch { name, .. } => format!("branch {name:?} was created"),
            Request::VolumeDrop { name } | Request::Drop { name } => {
                format!("{name:?} was dropped")
            }
            Request::VolumeResize { name, .. } => format!("volume {name:?} was resized"),
            Request::VolumeList | Request::VolumeExport { .. } => String::new(),
        }
    }

    /// Whether it changes the store.
    pub fn changes_store(&self) -> bool {
        !self.is_read_only()
    }
}

/// What a volume command did, as the server (or this process) reports it: the line
/// for people, and the object for `--json`.
#[derive(Debug, Serialize, Deserialize)]
pub struct Outcome {
    /// The line printed without --json.
    pub text: String,
    /// The JSON printed with --json.
    pub json: serde_json::Value,
}

impl Outcome {
    /// An outcome of a line and a JSON value.
    pub fn new(text: String, json: impl Serialize) -> CliResult<Outcome> {
        let json = serde_json::to_value(json).map_err(|e| CliError::failure(e.to_string()))?;
        Ok(Outcome { text, json })
    }
}

/// A request with how its answer is wanted.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Envelope {
    /// The command's `--json`.
    pub json: bool,
    /// The command.
    pub request: Request,
}

/// The server's answer.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Answer {
    /// Done: what to print.
    Done(Outcome),
    /// Failed: the exit code and message the command reports.
    Failed {
        /// The exit code.
        code: i32,
        /// The message.
        msg: String,
    },
}

/// The control socket of the store in `dir`.
pub fn socket_path(dir: &Path) -> PathBuf {
    dir.join(SOCKET_NAME)
}

/// Sends `request` to the server holding the store in `dir`: `Ok(None)` when no
/// server answers there (no socket file, or a stale one).
pub fn send(dir: &Path, json: bool, request: &Request) -> CliResult<Option<Outcome>> {
    let path = socket_path(dir);
    let stream = match UnixStream::connect(&path) {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(None)
        }
        Err(e) => {
            return Err(CliError::failure(format!(
                "connect to the server at {}: {e}",
                path.display()
            )))
        }
    };
    let lost = |e: std::io::Error| {
        CliError::failure(format!(
            "the server at {} did not answer: {e}",
            path.display()
        ))
    };
    let envelope = Envelope {
        json,
        request: request.clone(),
    };
    let mut line =
        serde_json::to_string(&envelope).map_err(|e| CliError::failure(e.to_string()))?;
    line.push('\n');
    (&stream).write_all(line.as_bytes()).map_err(lost)?;
    let mut answer = String::new();
    BufReader::new((&stream).take(MAX_LINE_BYTES))
        .read_line(&mut answer)
        .map_err(lost)?;
    match serde_json::from_str::<Answer>(&answer) {
        Ok(Answer::Done(outcome)) => Ok(Some(outcome)),
        Ok(Answer::Failed { code, msg }) => Err(CliError::new(code, msg)),
        Err(e) => Err(CliError::failure(format!(
            "the server at {} answered something unreadable ({e})",
            path.display()
        ))),
    }
}

/// Reads one request line from a control connection (the server side). A line that
/// is not a request is a usage error.
pub fn read_request(stream: &UnixStream) -> Result<Envelope, Answer> {
    let mut line = String::new();
    let read = BufReader::new(stream.take(MAX_LINE_BYTES)).read_line(&mut line);
    let failed = |msg: String| Answer::Failed {
        code: EXIT_USAGE,
        msg,
    };
    match read {
        Ok(0) => Err(failed("empty request".into())),
        Ok(_) => serde_json::from_str(&line).map_err(|e| failed(format!("bad request: {e}"))),
        Err(e) => Err(failed(format!("reading the request: {e}"))),
    }
}

/// Writes an answer line (the server side); a client that went away is not an error
/// worth more than ignoring.
pub fn write_answer(mut stream: &UnixStream, answer: &Answer) {
    if let Ok(mut line) = serde_json::to_string(answer) {
        line.push('\n');
        let _ = stream.write_all(line.as_bytes());
    }
}
