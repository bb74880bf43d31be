//! Printing for every command: key/value pairs as text or JSON lines, JSON values,
//! counted nouns, and the spinner on stderr.

use super::error::{output_error, CliError, CliResult};
use super::Ctx;
use serde::Serialize;
use std::io::{IsTerminal, Write};
use std::time::Duration;

/// A key/value pair printed as JSON.
#[derive(Serialize)]
struct JsonPair {
    key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<String>,
}

/// Prints one pair (or just a key) as a line in the chosen format: `KEY<TAB>VALUE`,
/// or `{"key":...,"value":...}` with `--json`.
pub fn print_pair(ctx: &Ctx, out: &mut impl Write, key: &[u8], value: Option<&[u8]>) -> CliResult {
    if ctx.json {
        let pair = JsonPair {
            key: ctx.enc.json_string(key),
            value: value.map(|v| ctx.enc.json_string(v)),
        };
        return print_json(out, &pair);
    }
    print_key_value(ctx, out, key, value, b"\t")
}

/// Prints `key`, then `sep` and `value` when there is one, each encoded, as a line.
pub fn print_key_value(
    ctx: &Ctx,
    out: &mut impl Write,
    key: &[u8],
    value: Option<&[u8]>,
    sep: &[u8],
) -> CliResult {
    out.write_all(&ctx.enc.encode(key)).map_err(output_error)?;
    if let Some(v) = value {
        out.write_all(sep).map_err(output_error)?;
        out.write_all(&ctx.enc.encode(v)).map_err(output_error)?;
    }
    out.write_all(b"\n").map_err(output_error)
}

/// Prints a serialisable value as one line of JSON.
pub fn print_json(out: &mut impl Write, v: &impl Serialize) -> CliResult {
    let line = serde_json::to_string(v).map_err(|e| CliError::failure(e.to_string()))?;
    writeln!(out, "{line}").map_err(output_error)
}

/// "1 file", "2 files".
pub fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// A spinner on stderr, only when stderr is a terminal.
pub fn spinner(msg: &str) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new_spinner();
    if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} {msg} {pos} [{elapsed}]")
    {
        pb.set_style(style);
    }
    pb.set_message(msg.to_string());
    pb.enable_steady_tick(Duration::from_millis(120));
    pb
}

/// A byte progress bar on stderr (a count of bytes when the total is not known),
/// only when stderr is a terminal.
pub fn progress_bar(total: Option<u64>, what: &str) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let (bar, template) = match total {
        Some(total) => (
            indicatif::ProgressBar::new(total),
            "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        ),
        None => (
            indicatif::ProgressBar::new_spinner(),
            "{spinner} {msg} {bytes} {bytes_per_sec} [{elapsed}]",
        ),
    };
    if let Ok(style) = indicatif::ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar.set_message(what.to_owned());
    bar
}
