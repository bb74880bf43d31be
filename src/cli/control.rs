//! The control socket: how a command reaches the `cambium serve` that holds a store.
//!
//! `serve` holds the store's writer lock for as long as it runs, so a command that
//! changes the store (`put`, `batch`, `volume create`, `snapshot`, `clean`, ...)
//! cannot open it. Instead it finds `control.sock` in the store directory and sends
//! its request there, on a connection of its own. The server runs the request on its
//! open store (so a new volume or snapshot is exported at once) and the command
//! prints what the server printed, with the same exit code, as if it had done the
//! work itself.
//!
//! The conversation, in lines of JSON:
//! - the client sends one [`Envelope`] line; a request that reads input (`batch`)
//!   then sends that input in frames, each a little-endian `u32` length and that
//!   many bytes, ended by a frame of length 0 (so input cut short by a client that
//!   went away is told apart from input that ended, and is not committed as if whole);
//! - the server answers with [`Answer`] lines: any number of `output` lines (what the
//!   command prints, sent as it is printed: `batch` acknowledges each commit at once),
//!   then `done` or `failed`.
//!
//! A socket file nobody answers on (a killed server's) is ignored: the command opens
//! the store itself, and the next `serve` replaces the file.

use super::codec::{from_hex, to_hex};
use super::error::{output_error, CliError, CliResult, EXIT_USAGE};
use super::open::check_name;
use super::Ctx;
use cambium::io as crate_io;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// The control socket's file name in the store directory.
pub const SOCKET_NAME: &str = "control.sock";

/// The longest request or answer line accepted.
pub const MAX_LINE_BYTES: u64 = 1 << 20;

/// The most input bytes a client sends in one frame.
const MAX_FRAME_BYTES: usize = 1 << 16;

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
        /// The raw image, a regular file (an absolute path: the server has its own
        /// working directory); `None` when the image is the request's input (stdin,
        /// a pipe: read by the command and sent after the request).
        file: Option<String>,
        /// The block size.
        block_size: u32,
        /// `--size`: the volume's size, which the image must fit.
        #[serde(default)]
        size_bytes: Option<u64>,
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
    /// `put`
    Put {
        /// The branch written.
        branch: String,
        /// The key.
        #[serde(with = "hex_bytes")]
        key: Vec<u8>,
        /// The value.
        #[serde(with = "hex_bytes")]
        value: Vec<u8>,
    },
    /// `del`
    Del {
        /// The branch written.
        branch: String,
        /// The key.
        #[serde(with = "hex_bytes")]
        key: Vec<u8>,
    },
    /// `batch`: its input (the command's stdin) follows the request, in frames.
    Batch {
        /// The branch written.
        branch: String,
        /// `--commit-every`.
        commit_every: Option<u64>,
    },
    /// `checkpoint`
    Checkpoint,
    /// `clean`
    Clean {
        /// `--until-dead-below`.
        until_dead_below: f64,
    },
    /// `defrag`
    Defrag {
        /// The version defragmented (all of them when none is named).
        version: Option<String>,
    },
    /// `shrink`
    Shrink,
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
            Request::VolumeList
            | Request::Checkpoint
            | Request::Clean { .. }
            | Request::Shrink
            | Request::Defrag { version: None } => vec![],
            Request::VolumeCreate { name, .. }
            | Request::VolumeDrop { name }
            | Request::VolumeResize { name, .. }
            | Request::VolumeImport { name, .. }
            | Request::VolumeExport { name, .. }
            | Request::Drop { name }
            | Request::Defrag {
                version: Some(name),
            } => vec![name],
            Request::Put { branch, .. }
            | Request::Del { branch, .. }
            | Request::Batch { branch, .. } => vec![branch],
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

    /// Whether it is brief work whose latency someone watches: a snapshot or clone
    /// of a version that may be busy, which waits for the writer lock behind its
    /// writes and should run the moment it is handed the lock (`serve` gives its
    /// thread a short scheduler slice; long requests keep the default, which
    /// preempts them less often).
    pub fn wants_short_slice(&self) -> bool {
        matches!(
            self,
            Request::VolumeSnapshot { .. }
                | Request::VolumeClone { .. }
                | Request::Snapshot { .. }
                | Request::Branch { .. }
        )
    }

    /// Whether input follows the request (the command's stdin).
    pub fn takes_input(&self) -> bool {
        matches!(
            self,
            Request::Batch { .. } | Request::VolumeImport { file: None, .. }
        )
    }
}

/// What a catalog request did (a volume or version command): the text printed
/// without `--json`, and the value printed with it.
#[derive(Debug, Serialize, Deserialize)]
pub struct Outcome {
    /// The text printed without --json.
    pub text: String,
    /// The JSON printed with --json.
    pub json: serde_json::Value,
}

impl Outcome {
    /// An outcome of a text and a JSON value.
    pub fn new(text: String, json: impl Serialize) -> CliResult<Outcome> {
        let json = serde_json::to_value(json).map_err(|e| CliError::failure(e.to_string()))?;
        Ok(Outcome { text, json })
    }

    /// An outcome that prints nothing (a command whose output is its data).
    pub fn nothing() -> Outcome {
        Outcome {
            text: String::new(),
            json: serde_json::Value::Null,
        }
    }

    /// Whether it is [`Outcome::nothing`].
    pub fn is_nothing(&self) -> bool {
        self.text.is_empty() && self.json.is_null()
    }

    /// Adds a warning about a later step that failed (the command's own work done): a
    /// line of the text, and a `warning` field of a JSON object.
    pub fn warn(&mut self, warning: String) {
        self.text.push_str(&format!("warning: {warning}\n"));
        if let serde_json::Value::Object(fields) = &mut self.json {
            fields.insert("warning".into(), warning.into());
        }
    }
}

/// A request with how its answer is wanted.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Envelope {
    /// The command's `--json`.
    pub json: bool,
    /// The command's `--hex` (how keys and values in messages and output are shown).
    #[serde(default)]
    pub hex: bool,
    /// The store directory as the command was given it (for messages that name it).
    #[serde(default)]
    pub dir: Option<String>,
    /// The command.
    pub request: Request,
}

/// A line of the server's answer.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Answer {
    /// Some of what the command prints on stdout (whole lines, as they are printed).
    Output(String),
    /// What the request has made durable so far (`None`: nothing after all), so that
    /// the command reports a failure of its own afterwards (writing what the server
    /// sent) as a warning, exit 6, as it would have run in-process.
    Committed(Option<String>),
    /// How far a long request (a volume import or export) has got: the command
    /// draws its progress bar from these, as it would running alone.
    Progress {
        /// What is under way ("importing").
        what: String,
        /// Bytes done.
        done: u64,
        /// Bytes in all, if known.
        total: Option<u64>,
    },
    /// The request succeeded: exit 0.
    Done,
    /// The request failed: the exit code and message the command reports.
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

/// Sends `request` to the server holding the store in `dir`, sends `input` after it
/// when the request takes input (taking it), and prints what the server prints to
/// `out`: `Ok(false)` when no server answers there (no socket file, or a stale one),
/// so the caller does the work itself (with `input` still there). What the server
/// reports committed is recorded in `ctx`, as the command's own commits are.
pub fn send(
    ctx: &Ctx,
    dir: &Path,
    envelope: &Envelope,
    input: &mut Option<Box<dyn Read + Send>>,
    out: &mut impl Write,
) -> CliResult<bool> {
    let path = socket_path(dir);
    let stream = match crate_io::connect_unix(&path) {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound
                    | std::io::ErrorKind::ConnectionRefused
                    // DIR is a file: the open that follows says it is not a store.
                    | std::io::ErrorKind::NotADirectory
            ) =>
        {
            return Ok(false)
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
    let mut line = serde_json::to_string(envelope).map_err(|e| CliError::failure(e.to_string()))?;
    line.push('\n');
    (&stream).write_all(line.as_bytes()).map_err(lost)?;
    if let Some(input) = input.take().filter(|_| envelope.request.takes_input()) {
        // The input goes from a thread of its own, so that the server's output (which
        // it writes while it reads: batch acknowledgements) is read meanwhile. The
        // thread is not joined: after the final answer it may still wait on a
        // terminal's stdin, and the process ends without it.
        let stream = stream.try_clone().map_err(lost)?;
        std::thread::spawn(move || send_input(input, &stream));
    }
    // Set once writing the output failed: nothing more is printed, and what is still
    // to come is read only for how the request ended.
    let mut output_failed: Option<(CliError, String)> = None;
    let mut answers = BufReader::new(&stream);
    // The bar of a long request, drawn from its `Progress` answers, cleared before
    // anything else is printed.
    let mut bar: Option<indicatif::ProgressBar> = None;
    loop {
        let mut line = String::new();
        let read = answers
            .by_ref()
            .take(MAX_LINE_BYTES)
            .read_line(&mut line)
            .map_err(lost)?;
        if read == 0 {
            return Err(output_failed.map_or_else(
                || {
                    CliError::failure(format!(
                        "the server at {} went away before it answered (did it stop?): \
                         the request may have been carried out or not; look before retrying",
                        path.display()
                    ))
                },
                |(e, _)| e,
            ));
        }
        let answer = serde_json::from_str::<Answer>(&line);
        match (&answer, bar.take()) {
            (Ok(Answer::Progress { done, .. }), Some(shown)) => {
                shown.set_position(*done);
                bar = Some(shown);
            }
            (_, Some(shown)) => shown.finish_and_clear(),
            (_, None) => {}
        }
        match answer {
            Ok(Answer::Progress { what, done, total }) => {
                if bar.is_none() {
                    let shown = super::output::progress_bar(total, &what);
                    shown.set_position(done);
                    bar = Some(shown);
                }
            }
            Ok(Answer::Output(text)) => {
                if output_failed.is_some() {
                    continue;
                }
                if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
                    // As in-process: a batch stops at an acknowledgement it cannot give
                    // (its input is cut off, so the server commits nothing more).
                    if envelope.request.takes_input() {
                        let _ = stream.shutdown(std::net::Shutdown::Write);
                    }
                    output_failed = Some((output_error(e), text));
                }
            }
            Ok(Answer::Committed(Some(what))) => ctx.committed(what),
            Ok(Answer::Committed(None)) => ctx.changed_nothing(),
            Ok(Answer::Done) => {
                return match output_failed {
                    None => Ok(true),
                    Some((e, _)) => Err(e),
                }
            }
            Ok(Answer::Failed { code, msg }) => {
                return Err(match output_failed {
                    Some((e, text))
                        if matches!(envelope.request, Request::Batch { .. })
                            && !ctx.has_committed() =>
                    {
                        unacknowledged(e, &text)
                    }
                    Some((e, _)) => e,
                    None => {
                        // The server's message is whole already (a failure after a
                        // commit is its warning, exit 6).
                        ctx.changed_nothing();
                        CliError::new(code, msg)
                    }
                });
            }
            Err(e) => {
                return Err(CliError::failure(format!(
                    "the server at {} answered something unreadable ({e})",
                    path.display()
                )))
            }
        }
    }
}

/// A batch whose acknowledgement `ack` could not be written (`e`), which then
/// stopped: what the command says in-process.
fn unacknowledged(e: CliError, ack: &str) -> CliError {
    let why = if e.msg.is_empty() {
        "the reader of the output went away".to_owned()
    } else {
        e.msg
    };
    // `committed N` or `{"committed":N}`: the last such line written.
    let total = ack
        .lines()
        .filter_map(|l| {
            let digits: String = l.chars().filter(char::is_ascii_digit).collect();
            digits.parse::<u64>().ok()
        })
        .next_back();
    match total {
        Some(total) => CliError::failure(format!(
            "committed {total} operations (durable), then could not acknowledge them \
             ({why}); the rest of the input was not applied"
        )),
        None => CliError::failure(why),
    }
}

/// Copies `input` to the server in frames, then the end frame. When reading the input
/// fails, no end frame is sent: the server sees input cut short and applies none of
/// what it had not committed.
fn send_input(mut input: Box<dyn Read + Send>, mut stream: &UnixStream) {
    let mut buf = vec![0u8; MAX_FRAME_BYTES];
    loop {
        let n = match input.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let len = u32::try_from(n).unwrap_or(0).to_le_bytes();
        if stream.write_all(&len).is_err() || stream.write_all(&buf[..n]).is_err() || n == 0 {
            break;
        }
    }
    let _ = stream.shutdown(std::net::Shutdown::Write);
}

/// Reads the request line of a control connection (the server side), leaving what
/// follows it (input frames) in `conn`. A line that is not a request is a usage error.
pub fn read_request(conn: &mut impl BufRead) -> Result<Envelope, Answer> {
    let mut line = String::new();
    let read = conn.take(MAX_LINE_BYTES).read_line(&mut line);
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

/// Writes an answer line (the server side).
pub fn write_answer(mut stream: &UnixStream, answer: &Answer) -> std::io::Result<()> {
    let mut line = serde_json::to_string(answer).map_err(std::io::Error::other)?;
    line.push('\n');
    stream.write_all(line.as_bytes())
}

/// A request's input as the server reads it: the frames' bytes, ending at the end
/// frame. Input cut short (the client went away, or the server is stopping) is an
/// error, never an early end.
pub struct FramedInput<R> {
    inner: R,
    /// Bytes left in the current frame.
    left: usize,
    ended: bool,
}

impl<R: BufRead> FramedInput<R> {
    /// The input that follows the request line in `inner`.
    pub fn new(inner: R) -> Self {
        FramedInput {
            inner,
            left: 0,
            ended: false,
        }
    }
}

fn cut_short() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        "the input ended before its end (the command went away, or the server is stopping)",
    )
}

impl<R: BufRead> BufRead for FramedInput<R> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        while self.left == 0 && !self.ended {
            let mut len = [0u8; 4];
            self.inner.read_exact(&mut len).map_err(|e| {
                if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    cut_short()
                } else {
                    e
                }
            })?;
            let len = u32::from_le_bytes(len) as usize;
            if len > MAX_FRAME_BYTES {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("an input frame of {len} bytes (at most {MAX_FRAME_BYTES})"),
                ));
            }
            self.left = len;
            self.ended = len == 0;
        }
        if self.ended {
            return Ok(&[]);
        }
        let left = self.left;
        let buf = self.inner.fill_buf()?;
        if buf.is_empty() {
            return Err(cut_short());
        }
        Ok(&buf[..buf.len().min(left)])
    }

    fn consume(&mut self, n: usize) {
        self.inner.consume(n);
        self.left -= n;
    }
}

impl<R: BufRead> Read for FramedInput<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let available = self.fill_buf()?;
        let n = available.len().min(buf.len());
        buf[..n].copy_from_slice(&available[..n]);
        self.consume(n);
        Ok(n)
    }
}

/// What a request prints, as the server sends it: each whole line as soon as it is
/// written (a batch's acknowledgement reaches the command right after its commit),
/// the rest at `flush`.
pub struct AnswerWriter<'a> {
    stream: &'a UnixStream,
    pending: Vec<u8>,
}

impl<'a> AnswerWriter<'a> {
    /// Output to the client on `stream`.
    pub fn new(stream: &'a UnixStream) -> Self {
        AnswerWriter {
            stream,
            pending: Vec::new(),
        }
    }

    fn send(&mut self, upto: usize) -> std::io::Result<()> {
        if upto == 0 {
            return Ok(());
        }
        let text = String::from_utf8_lossy(&self.pending[..upto]).into_owned();
        self.pending.drain(..upto);
        write_answer(self.stream, &Answer::Output(text))
    }
}

impl Write for AnswerWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.pending.extend_from_slice(buf);
        if let Some(last) = self.pending.iter().rposition(|&b| b == b'\n') {
            self.send(last + 1)?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send(self.pending.len())
    }
}

/// Keys and values in a request, as hex text (JSON has no bytes).
mod hex_bytes {
    use super::{from_hex, to_hex};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&to_hex(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        from_hex(text.as_bytes()).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frames as `send_input` writes them.
    fn framed(chunks: &[&[u8]], end: bool) -> Vec<u8> {
        let mut v = Vec::new();
        for c in chunks {
            v.extend_from_slice(&(c.len() as u32).to_le_bytes());
            v.extend_from_slice(c);
        }
        if end {
            v.extend_from_slice(&0u32.to_le_bytes());
        }
        v
    }

    #[test]
    fn framed_input_reads_the_frames_up_to_the_end_frame() {
        let bytes = framed(&[b"put\tk\tv\n", b"del", b"\tk\n"], true);
        let mut tail = bytes.clone();
        tail.extend_from_slice(b"not input");
        let mut input = FramedInput::new(&tail[..]);
        let mut all = String::new();
        input.read_to_string(&mut all).unwrap();
        assert_eq!(all, "put\tk\tv\ndel\tk\n");
    }

    #[test]
    fn input_cut_short_is_an_error_not_an_end() {
        for cut in [2, 6, 16] {
            let bytes = framed(&[b"put\tk\tvalue\n"], true);
            let mut input = FramedInput::new(&bytes[..cut]);
            let err = input.read_to_end(&mut Vec::new()).unwrap_err();
            assert_eq!(
                err.kind(),
                std::io::ErrorKind::UnexpectedEof,
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn an_oversized_frame_is_refused() {
        let mut bytes = ((MAX_FRAME_BYTES + 1) as u32).to_le_bytes().to_vec();
        bytes.extend_from_slice(&[0; 8]);
        let err = FramedInput::new(&bytes[..])
            .read_to_end(&mut Vec::new())
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
    }

    #[test]
    fn keys_and_values_travel_as_hex() {
        let request = Request::Put {
            branch: "main".into(),
            key: vec![0, 0xff, b'k'],
            value: b"v\n".to_vec(),
        };
        let line = serde_json::to_string(&request).unwrap();
        assert!(line.contains("\"00ff6b\""), "{line}");
        match serde_json::from_str::<Request>(&line).unwrap() {
            Request::Put { key, value, .. } => {
                assert_eq!(key, vec![0, 0xff, b'k']);
                assert_eq!(value, b"v\n");
            }
            other => panic!("{other:?}"),
        }
        let bad = line.replace("00ff6b", "0g");
        assert!(serde_json::from_str::<Request>(&bad).is_err());
    }
}
