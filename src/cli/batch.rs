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
use std::io::{BufRead, Write};

/// Applies the batch read from `input` on an open store. When it fails, its
/// transaction is aborted when it is dropped (closing the store checkpoints only
/// what was committed); the batch's error is the one reported.
pub fn batch_in(
    ctx: &Ctx,
    out: &mut impl Write,
    input: impl BufRead,
    store: &Store,
    target: Target<'_>,
    commit_every: Option<u64>,
) -> CliResult {
    let pb = if ctx.progress {
        spinner("batch: operations applied")
    } else {
        indicatif::ProgressBar::hidden()
    };
    let result = run_batch(ctx, out, input, store, target, commit_every, &pb);
    pb.finish_and_clear();
    result
}

/// Applies every line of `input`, committing every `commit_every` operations and at
/// the end (an empty batch commits, and says so, too).
fn run_batch(
    ctx: &Ctx,
    out: &mut impl Write,
    mut input: impl BufRead,
    store: &Store,
    target: Target<'_>,
    commit_every: Option<u64>,
    pb: &indicatif::ProgressBar,
) -> CliResult {
    let mut txn = begin_immediate(store, target)?;
    let (mut total, mut pending, mut printed) = (0u64, 0u64, false);
    let mut line_no: u64 = 1;
    let mut buf = Vec::new();
    while let Some(line) = next_line(&mut input, &mut buf, ctx.enc, line_no)? {
        let this = line_no;
        line_no += 1;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        apply_line(&mut txn, ctx.enc, line, this)?;
        total += 1;
        pending += 1;
        pb.inc(1);
        if commit_every.is_some_and(|n| pending >= n) {
            txn.commit()?;
            pending = 0;
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
            txn = begin_immediate(store, target)?;
        }
    }
    if pending > 0 || !printed {
        txn.commit()?;
        ctx.committed(format!("the batch (committed {total}) was committed"));
        print_committed(ctx, out, total)?;
    } else {
        // The input ended on a commit boundary: all of it is acknowledged already.
        ctx.committed(format!("the batch (committed {total}) was committed"));
    }
    Ok(())
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
