//! `cambium batch`: puts and deletes read from stdin, one tab-separated operation a
//! line, committed in one transaction or every N operations, each commit
//! acknowledged on stdout.

use super::codec::Encoding;
use super::error::{exit_code_for, output_error, CliError, CliResult};
use super::open::{begin, Target};
use super::output::spinner;
use super::Ctx;
use cambium::{check_key, Durability, Store, WriteTxn};
use std::borrow::Cow;
use std::io::{BufRead, Read, Seek, Write};

/// Applies the batch read from `input` on an open store. When it fails, its
/// transaction is aborted when it is dropped (closing the store checkpoints only
/// what was committed); the batch's error is the one reported.
///
/// With `spool`, each group of operations that one transaction commits is read in
/// full before the transaction begins: `serve` does so, because a transaction holds
/// the store's writer lock, which every volume write waits for, and a batch's input
/// comes at its producer's pace (a terminal, `tail -f`, a suspended command).
pub fn batch_in(
    ctx: &Ctx,
    out: &mut impl Write,
    input: impl BufRead,
    store: &Store,
    target: Target<'_>,
    commit_every: Option<u64>,
    spool: bool,
) -> CliResult {
    let pb = if ctx.local {
        spinner("batch: operations applied")
    } else {
        indicatif::ProgressBar::hidden()
    };
    let spool = spool.then(|| Spool::new(store.path()));
    let result = run_batch(ctx, out, input, store, target, commit_every, spool, &pb);
    pb.finish_and_clear();
    result
}

/// Applies every line of `input`, committing every `commit_every` operations and at
/// the end (an empty batch commits, and says so, too).
#[allow(clippy::too_many_arguments)]
fn run_batch(
    ctx: &Ctx,
    out: &mut impl Write,
    mut input: impl BufRead,
    store: &Store,
    target: Target<'_>,
    commit_every: Option<u64>,
    mut spool: Option<Spool>,
    pb: &indicatif::ProgressBar,
) -> CliResult {
    let (mut total, mut printed) = (0u64, false);
    let mut line_no: u64 = 1;
    let mut buf = Vec::new();
    loop {
        let (txn, applied, ended) = match &mut spool {
            None => {
                let mut txn = begin_immediate(store, target)?;
                let (applied, ended) = apply_lines(
                    &mut txn,
                    ctx.enc,
                    &mut input,
                    &mut buf,
                    &mut line_no,
                    commit_every,
                    pb,
                )?;
                (txn, applied, ended)
            }
            Some(spool) => {
                let first = line_no;
                let ended =
                    spool.fill(&mut input, ctx.enc, &mut buf, &mut line_no, commit_every)?;
                let mut txn = begin_immediate(store, target)?;
                let mut no = first;
                let mut group = spool.reader()?;
                let (applied, _) =
                    apply_lines(&mut txn, ctx.enc, &mut group, &mut buf, &mut no, None, pb)?;
                (txn, applied, ended)
            }
        };
        total += applied;
        if ended {
            if applied > 0 || !printed {
                txn.commit()?;
                ctx.committed(format!("the batch (committed {total}) was committed"));
                print_committed(ctx, out, total)?;
            } else {
                // The input ended on a commit boundary: all of it is acknowledged
                // already (the transaction begun for more is dropped unused).
                ctx.committed(format!("the batch (committed {total}) was committed"));
            }
            return Ok(());
        }
        txn.commit()?;
        // The rest of the input is not applied when an acknowledgement cannot be
        // given: say so (even for a closed pipe), and what is durable.
        print_committed(ctx, out, total).map_err(|e| {
            let why = if e.msg.is_empty() {
                "the reader of the output went away".to_owned()
            } else {
                e.msg
            };
            CliError::failure(format!(
                "committed {total} operations (durable), then could not acknowledge \
                 them ({why}); the rest of the input was not applied"
            ))
        })?;
        printed = true;
    }
}

/// Applies the lines of `input` (numbered from `line_no`) to `txn` until `limit`
/// operations are applied or the input ends; the operations applied, and whether
/// the input ended.
fn apply_lines(
    txn: &mut WriteTxn,
    enc: Encoding,
    input: &mut impl BufRead,
    buf: &mut Vec<u8>,
    line_no: &mut u64,
    limit: Option<u64>,
    pb: &indicatif::ProgressBar,
) -> CliResult<(u64, bool)> {
    let mut applied = 0u64;
    while limit.is_none_or(|n| applied < n) {
        let Some(line) = next_line(input, buf, enc, *line_no)? else {
            return Ok((applied, true));
        };
        let this = *line_no;
        *line_no += 1;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        apply_line(txn, enc, line, this)?;
        applied += 1;
        pb.inc(1);
    }
    Ok((applied, false))
}

/// The most bytes of a group [`Spool`] keeps in memory; the rest goes to a file.
const SPOOL_MEMORY_BYTES: usize = 64 << 20;

/// A group of batch lines read ahead of its transaction (`batch_in`): in memory, and
/// past [`SPOOL_MEMORY_BYTES`] in an unnamed file in the store directory (on the
/// store's file system, which has room for what the batch will write anyway).
struct Spool {
    dir: std::path::PathBuf,
    memory: Vec<u8>,
    file: Option<std::fs::File>,
    file_len: u64,
}

impl Spool {
    fn new(dir: &std::path::Path) -> Spool {
        Spool {
            dir: dir.to_path_buf(),
            memory: Vec::new(),
            file: None,
            file_len: 0,
        }
    }

    /// Reads the next group of `input` (up to `limit` operations, blank lines kept so
    /// that line numbers still match) in place of the last one; whether the input
    /// ended. A line too long to be valid is refused here, as it would be when
    /// applied.
    fn fill(
        &mut self,
        input: &mut impl BufRead,
        enc: Encoding,
        buf: &mut Vec<u8>,
        line_no: &mut u64,
        limit: Option<u64>,
    ) -> CliResult<bool> {
        self.memory.clear();
        self.file_len = 0;
        let mut ops = 0u64;
        while limit.is_none_or(|n| ops < n) {
            let Some(line) = next_line(input, buf, enc, *line_no)? else {
                return Ok(true);
            };
            *line_no += 1;
            if !line.iter().all(u8::is_ascii_whitespace) {
                ops += 1;
            }
            self.push(line)?;
        }
        Ok(false)
    }

    /// Appends `line` and a line ending.
    fn push(&mut self, line: &[u8]) -> CliResult {
        if self.file.is_none() && self.memory.len() + line.len() < SPOOL_MEMORY_BYTES {
            self.memory.extend_from_slice(line);
            self.memory.push(b'\n');
            return Ok(());
        }
        let file = match &mut self.file {
            Some(f) => f,
            none => none.insert(unnamed_file(&self.dir).map_err(spool_error)?),
        };
        use std::os::unix::fs::FileExt;
        file.write_all_at(line, self.file_len)
            .and_then(|()| file.write_all_at(b"\n", self.file_len + line.len() as u64))
            .map_err(spool_error)?;
        self.file_len += line.len() as u64 + 1;
        Ok(())
    }

    /// The group, to be read from its start.
    fn reader(&mut self) -> CliResult<impl BufRead + '_> {
        let rest: Box<dyn BufRead + '_> = match &mut self.file {
            Some(f) => {
                f.seek(std::io::SeekFrom::Start(0)).map_err(spool_error)?;
                let part = (&*f).take(self.file_len);
                Box::new(std::io::BufReader::with_capacity(1 << 16, part))
            }
            None => Box::new(std::io::empty()),
        };
        Ok(self.memory.as_slice().chain(rest))
    }
}

/// A file in `dir` that has no name (`O_TMPFILE`; where the file system cannot, one
/// made and unlinked at once): it goes with its last descriptor.
fn unnamed_file(dir: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let unnamed = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE)
        .open(dir);
    if let Ok(file) = unnamed {
        return Ok(file);
    }
    let path = dir.join(format!(".batch-spool-{}", std::process::id()));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)?;
    std::fs::remove_file(&path)?;
    Ok(file)
}

fn spool_error(e: std::io::Error) -> CliError {
    CliError::failure(format!("holding the batch's input: {e}"))
}

/// A write transaction whose commits are durable before they return, so that an
/// acknowledgement on stdout means the operations are on disk.
fn begin_immediate<'s>(store: &'s Store, target: Target<'_>) -> CliResult<WriteTxn<'s>> {
    let mut txn = begin(store, target)?;
    txn.set_durability(Durability::Immediate);
    Ok(txn)
}

/// The longest line `batch` accepts: `put`, a tab, the longest key, a tab, the
/// longest value and a CR LF ending; with `--hex` each key and value byte is two
/// digits. A longer line cannot be valid, so it is refused as soon as it passes
/// this, without buffering the rest of it.
fn max_line_len(enc: Encoding) -> usize {
    let digits = digits_per_byte(enc);
    "put\t".len() + digits * (cambium::MAX_KEY_LEN + cambium::MAX_VALUE_LEN) + "\t\r".len()
}

/// Input characters per key or value byte.
pub(super) fn digits_per_byte(enc: Encoding) -> usize {
    match enc {
        Encoding::Hex => 2,
        Encoding::Text => 1,
    }
}

/// The most bytes the line read so far into `buf` may have: once its key has ended
/// (a second tab within the longest operation and key), the value's start plus the
/// longest value and a CR; before that, `max`.
fn line_limit(buf: &[u8], max: usize, value_digits: usize) -> usize {
    let head = &buf[..buf.len().min(max - value_digits * cambium::MAX_VALUE_LEN)];
    match head.iter().enumerate().filter(|(_, &b)| b == b'\t').nth(1) {
        Some((tab, _)) => tab + 1 + value_digits * cambium::MAX_VALUE_LEN + 1,
        None => max,
    }
}

/// The next `batch` line of `input` (see [`read_bounded_line`]), refused once it is
/// longer than any valid operation can be.
fn next_line<'b>(
    input: &mut impl BufRead,
    buf: &'b mut Vec<u8>,
    enc: Encoding,
    line_no: u64,
) -> CliResult<Option<&'b [u8]>> {
    let (max, value_digits) = (max_line_len(enc), digits_per_byte(enc));
    let longest = format!(
        "{max} bytes: a {}-byte key and a {}-byte value",
        cambium::MAX_KEY_LEN,
        cambium::MAX_VALUE_LEN
    );
    read_bounded_line(
        input,
        buf,
        line_no,
        &|read| line_limit(read, max, value_digits),
        &longest,
    )
}

/// A line buffer this long grows straight to the line's limit (see
/// [`read_bounded_line`]).
const GROW_TO_LIMIT_FROM: usize = 16 << 20;

/// The next line of `input` without its line ending (`\n` or `\r\n`), read into
/// `buf`; `None` at the end of the input. `limit` gives, for the part of the line
/// read so far, the most bytes the whole line may have (the ending not counted); a
/// longer line is refused (naming it by `line_no`, and saying what the longest valid
/// line is: `longest`) as soon as it passes that: memory never holds more than one
/// valid line.
pub(super) fn read_bounded_line<'b>(
    input: &mut impl BufRead,
    buf: &'b mut Vec<u8>,
    line_no: u64,
    limit: &dyn Fn(&[u8]) -> usize,
    longest: &str,
) -> CliResult<Option<&'b [u8]>> {
    buf.clear();
    let mut ended = false;
    while !ended {
        let chunk = input
            .fill_buf()
            .map_err(|e| CliError::failure(format!("reading stdin: {e}")))?;
        if chunk.is_empty() {
            break;
        }
        let (take, newline) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (chunk.len(), false),
        };
        // The line ending does not count against the limit.
        if buf.len() + take - usize::from(newline) > limit(buf) {
            return Err(CliError::failure(format!(
                "line {line_no}: longer than the longest valid line ({longest})"
            )));
        }
        let needed = buf.len() + take;
        if needed > buf.capacity() && needed > GROW_TO_LIMIT_FROM {
            // Past a few MiB, grow once to what the line may still become: doubling
            // would copy the line at every step, and an allocator that cannot grow a
            // large block in place (mimalloc; glibc remaps it) holds the old copy and
            // the new one at once. Reserved pages take no memory until written.
            let most = limit(buf).saturating_add(2).max(needed);
            buf.reserve_exact(most - buf.len());
        }
        buf.extend_from_slice(&chunk[..take]);
        input.consume(take);
        ended = newline;
    }
    if buf.is_empty() {
        return Ok(None);
    }
    let mut line = buf.as_slice();
    if let Some(l) = line.strip_suffix(b"\n") {
        line = l;
    }
    if let Some(l) = line.strip_suffix(b"\r") {
        line = l;
    }
    Ok(Some(line))
}

/// Parses one non-blank line and applies it to `txn`; a failure names the line.
fn apply_line(txn: &mut WriteTxn, enc: Encoding, line: &[u8], line_no: u64) -> CliResult {
    let op = parse_batch_line(enc, line)
        .map_err(|e| CliError::failure(format!("line {line_no}: {e}")))?;
    let applied = match op {
        Op::Put(k, v) => txn.put(&k, &v),
        Op::Del(k) => txn.delete(&k).map(|_| ()),
    };
    applied.map_err(|e| CliError::new(exit_code_for(&e), format!("line {line_no}: {e}")))
}

/// Prints `committed N` (or `{"committed":N}`) and flushes, so a reader sees each
/// acknowledgement as soon as the commit has returned.
fn print_committed(ctx: &Ctx, out: &mut impl Write, ops: u64) -> CliResult {
    if ctx.json {
        writeln!(out, "{{\"committed\":{ops}}}").map_err(output_error)?;
    } else {
        writeln!(out, "committed {ops}").map_err(output_error)?;
    }
    out.flush().map_err(output_error)
}

/// One parsed batch line. Text fields borrow the line (a value may be as long as
/// the line itself: it is not copied); hex fields are decoded.
#[derive(Debug, PartialEq, Eq)]
enum Op<'l> {
    Put(Cow<'l, [u8]>, Cow<'l, [u8]>),
    Del(Cow<'l, [u8]>),
}

/// Parses one non-blank batch line (without its line ending): `put<TAB>KEY<TAB>VALUE`
/// or `del<TAB>KEY`.
fn parse_batch_line(enc: Encoding, line: &[u8]) -> Result<Op<'_>, String> {
    let text = std::str::from_utf8(line).map_err(|e| format!("not valid UTF-8 ({e})"))?;
    let fields: Vec<&str> = text.split('\t').collect();
    match fields[0] {
        "put" => {
            expect_fields(&fields, 3, "put, key, value")?;
            let key = decode_key(enc, fields[1])?;
            let value = decode_field(enc, fields[2]).map_err(|e| format!("bad value: {e}"))?;
            Ok(Op::Put(key, value))
        }
        "del" => {
            expect_fields(&fields, 2, "del, key")?;
            Ok(Op::Del(decode_key(enc, fields[1])?))
        }
        other => Err(format!(
            "unknown operation {other:?} (expected `put` or `del`)"
        )),
    }
}

/// Checks that an operation's line has its `n` fields, which `names` lists.
fn expect_fields(fields: &[&str], n: usize, names: &str) -> Result<(), String> {
    if fields.len() == n {
        return Ok(());
    }
    Err(format!(
        "`{}` takes {n} tab-separated fields ({names}), found {}",
        fields[0],
        fields.len()
    ))
}

/// A key or value field's bytes: the field itself in text mode, decoded with `--hex`.
fn decode_field(enc: Encoding, field: &str) -> Result<Cow<'_, [u8]>, String> {
    match enc {
        Encoding::Text => Ok(Cow::Borrowed(field.as_bytes())),
        Encoding::Hex => enc.decode(field.as_bytes()).map(Cow::Owned),
    }
}

/// Decodes and checks a key field.
fn decode_key(enc: Encoding, field: &str) -> Result<Cow<'_, [u8]>, String> {
    let key = decode_field(enc, field).map_err(|e| format!("bad key: {e}"))?;
    if key.is_empty() {
        return Err("empty key".to_string());
    }
    check_key(&key).map_err(|e| e.to_string())?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_put_and_del() {
        fn parse(line: &[u8]) -> Result<Op<'_>, String> {
            parse_batch_line(Encoding::Text, line)
        }
        assert_eq!(
            parse(b"put\tk\tv"),
            Ok(Op::Put(b"k"[..].into(), b"v"[..].into()))
        );
        assert_eq!(
            parse(b"put\tk\t"),
            Ok(Op::Put(b"k"[..].into(), b""[..].into()))
        );
        assert_eq!(parse(b"del\tk"), Ok(Op::Del(b"k"[..].into())));
        let hex = parse_batch_line(Encoding::Hex, b"put\t00ff\t0a");
        assert_eq!(hex, Ok(Op::Put(vec![0, 0xff].into(), vec![0x0a].into())));
    }

    #[test]
    fn explains_malformed_lines() {
        let err = |line: &[u8]| parse_batch_line(Encoding::Text, line).unwrap_err();
        assert_eq!(
            err(b"put\tk"),
            "`put` takes 3 tab-separated fields (put, key, value), found 2"
        );
        assert_eq!(
            err(b"del\tk\tv"),
            "`del` takes 2 tab-separated fields (del, key), found 3"
        );
        assert_eq!(
            err(b"frob\tk"),
            "unknown operation \"frob\" (expected `put` or `del`)"
        );
        assert_eq!(err(b"put\t\tv"), "empty key");
        assert!(err(b"put\t\xff\tv").starts_with("not valid UTF-8"));
        let long = format!("del\t{}", "k".repeat(cambium::MAX_KEY_LEN + 1));
        assert!(err(long.as_bytes()).contains("2049"));
    }

    #[test]
    fn a_line_is_limited_by_its_value_once_its_key_has_ended() {
        let max = max_line_len(Encoding::Text);
        assert_eq!(max, 4 + cambium::MAX_KEY_LEN + cambium::MAX_VALUE_LEN + 2);
        assert_eq!(line_limit(b"put\tkey", max, 1), max);
        let value_limit = 8 + cambium::MAX_VALUE_LEN + 1;
        assert_eq!(line_limit(b"put\tkey\tvalue", max, 1), value_limit);
        let hex_max = max_line_len(Encoding::Hex);
        assert_eq!(
            line_limit(b"put\t6b\t", hex_max, 2),
            7 + 2 * cambium::MAX_VALUE_LEN + 1
        );
    }

    #[test]
    fn an_over_long_line_is_refused_with_its_number() {
        let max = max_line_len(Encoding::Text);
        let mut input = std::io::Cursor::new(vec![b'k'; max + 2]);
        let mut buf = Vec::new();
        let err = next_line(&mut input, &mut buf, Encoding::Text, 7).unwrap_err();
        assert!(err.to_string().contains("line 7: longer than"), "{err}");
        assert!(buf.len() <= max);
    }
}
