//! The data commands on single keys and key ranges: `get` and `scan`, and the work of
//! `put` and `del` on an open store (`requests.rs` runs them here or in a server).

use super::args::ScanArgs;
use super::batch::{digits_per_byte, read_bounded_line};
use super::codec::Encoding;
use super::error::{output_error, CliError, CliResult};
use super::open::{check_at, open_read_only, read_view, write_one, Target};
use super::output::{print_key_value, print_pair};
use super::Ctx;
use cambium::{check_key, prefix_successor, Store};
use std::io::{BufRead, Write};
use std::ops::Bound;
use std::path::Path;

/// Puts one pair on an open store, in a transaction of its own.
pub fn put_in(ctx: &Ctx, store: &Store, target: Target<'_>, key: &[u8], value: &[u8]) -> CliResult {
    let what = format!("the put of {} on {}", ctx.enc.show(key), target.branch);
    write_one(ctx, store, target, &what, |txn| txn.put(key, value))
}

/// `cambium get DIR KEY [--at VERSION]`
pub fn get(ctx: &Ctx, out: &mut impl Write, dir: &Path, key: &str, at: Option<&str>) -> CliResult {
    let key = ctx.enc.decode_arg("key", key)?;
    check_key(&key)?;
    check_at(at)?;
    let store = open_read_only(dir)?;
    let read = read_view(&store, at)?;
    let printed = read.get_with(&key, |value| {
        if ctx.json {
            print_pair(ctx, out, &key, Some(value))
        } else {
            print_key_value(ctx, out, value, None, b"")
        }
    })?;
    printed.unwrap_or_else(|| Err(key_not_found(ctx, &key)))
}

/// `cambium get DIR --stdin [--at VERSION]`: every key read from `input`, looked up in
/// one read transaction; the pairs found are printed in input order.
pub fn get_stdin(
    ctx: &Ctx,
    out: &mut impl Write,
    input: &mut impl BufRead,
    dir: &Path,
    at: Option<&str>,
) -> CliResult {
    check_at(at)?;
    let store = open_read_only(dir)?;
    let read = read_view(&store, at)?;
    // A key of the longest length, in the input's encoding, and a CR.
    let max = digits_per_byte(ctx.enc) * cambium::MAX_KEY_LEN + 1;
    let longest = format!("{max} bytes: a {}-byte key", cambium::MAX_KEY_LEN);
    let (mut buf, mut line_no, mut looked_up, mut missing) = (Vec::new(), 0u64, 0u64, 0u64);
    while let Some(line) = read_bounded_line(input, &mut buf, line_no + 1, &|_| max, &longest)? {
        line_no += 1;
        if line.is_empty() {
            continue;
        }
        let bad = |why: String| CliError::failure(format!("line {line_no}: {why}"));
        if ctx.enc == Encoding::Text {
            std::str::from_utf8(line)
                .map_err(|e| bad(format!("not valid UTF-8 ({e}); use --hex for binary keys")))?;
        }
        let key = ctx
            .enc
            .decode(line)
            .map_err(|e| bad(format!("invalid key: {e}")))?;
        check_key(&key).map_err(|e| bad(e.to_string()))?;
        looked_up += 1;
        match read.get_with(&key, |value| print_pair(ctx, out, &key, Some(value)))? {
            Some(printed) => printed?,
            None => missing += 1,
        }
    }
    out.flush().map_err(output_error)?;
    if missing > 0 {
        return Err(CliError::not_found(format!(
            "{missing} of {looked_up} {} not found",
            if looked_up == 1 { "key" } else { "keys" }
        )));
    }
    Ok(())
}

/// Deletes one key on an open store, in a transaction of its own: exit 1 when it was
/// not there.
pub fn del_in(ctx: &Ctx, store: &Store, target: Target<'_>, key: &[u8]) -> CliResult {
    let what = format!("the delete of {} on {}", ctx.enc.show(key), target.branch);
    let existed = write_one(ctx, store, target, &what, |txn| txn.delete(key))?;
    if existed {
        Ok(())
    } else {
        ctx.changed_nothing();
        Err(key_not_found(ctx, key))
    }
}

/// Exit 1: `key not found: "KEY"`.
fn key_not_found(ctx: &Ctx, key: &[u8]) -> CliError {
    CliError::not_found(format!("key not found: {}", ctx.enc.show(key)))
}

/// The bounds of a scan.
type Range = (Bound<Vec<u8>>, Bound<Vec<u8>>);

/// `cambium scan DIR ...`
pub fn scan(ctx: &Ctx, out: &mut impl Write, a: &ScanArgs) -> CliResult {
    let (lower, upper) = scan_range(ctx, a)?;
    check_at(a.at.as_deref())?;
    let store = open_read_only(&a.dir)?;
    let read = read_view(&store, a.at.as_deref())?;
    if let (Bound::Included(l), Bound::Excluded(u)) = (&lower, &upper) {
        if l >= u {
            return Ok(()); // an empty range
        }
    }
    let limit = usize::try_from(a.limit.unwrap_or(u64::MAX)).unwrap_or(usize::MAX);
    let range = (
        lower.as_ref().map(Vec::as_slice),
        upper.as_ref().map(Vec::as_slice),
    );
    print_scan(ctx, out, read.range(range)?, a, limit)
}

/// The range `--prefix`, `--from` and `--to` ask for (bad hex in them is a usage
/// error): from the prefix or `--from` up to the prefix's end, cut at `--to`.
fn scan_range(ctx: &Ctx, a: &ScanArgs) -> CliResult<Range> {
    let decode = |what: &str, s: &Option<String>| -> CliResult<Option<Vec<u8>>> {
        s.as_deref()
            .map(|s| ctx.enc.decode_arg(what, s))
            .transpose()
    };
    let prefix = decode("prefix", &a.prefix)?;
    let from = decode("--from key", &a.from)?;
    let to = decode("--to key", &a.to)?;

    let (lower, mut upper) = match (prefix, from) {
        (Some(p), _) => {
            let upper = prefix_successor(&p).map_or(Bound::Unbounded, Bound::Excluded);
            (Bound::Included(p), upper)
        }
        (None, Some(f)) => (Bound::Included(f), Bound::Unbounded),
        (None, None) => (Bound::Unbounded, Bound::Unbounded),
    };
    if let Some(t) = to {
        upper = match upper {
            Bound::Excluded(u) if u <= t => Bound::Excluded(u),
            _ => Bound::Excluded(t),
        };
    }
    Ok((lower, upper))
}

/// Prints up to `limit` keys (with `--keys-only`) or pairs, one a line, in key order
/// or reversed. Entries are borrowed from the cached nodes, not copied.
fn print_scan(
    ctx: &Ctx,
    out: &mut impl Write,
    iter: cambium::Iter,
    a: &ScanArgs,
    limit: usize,
) -> CliResult {
    let mut printed = 0;
    if a.keys_only {
        let mut keys = iter.keys();
        while printed < limit {
            let next = if a.reverse {
                keys.next_back_ref()
            } else {
                keys.next_ref()
            };
            let Some(key) = next else { break };
            print_pair(ctx, out, key?, None)?;
            printed += 1;
        }
    } else {
        let mut pairs = iter;
        while printed < limit {
            let next = if a.reverse {
                pairs.next_back_ref()
            } else {
                pairs.next_ref()
            };
            let Some(pair) = next else { break };
            let (k, v) = pair?;
            print_pair(ctx, out, k, Some(v))?;
            printed += 1;
        }
    }
    Ok(())
}
