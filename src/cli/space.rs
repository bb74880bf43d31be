//! The commands that give space back, `clean`, `defrag` and `shrink`, on an open store
//! (`requests.rs` runs them here or in a server), and `backrefs`, which says who
//! references the blocks of one segment.

use super::codec::human_bytes;
use super::error::{output_error, CliResult};
use super::open::{check_at, open_read_only};
use super::output::{plural, print_json};
use super::Ctx;
use cambium::{CleanReport, Store};
use std::io::{IsTerminal, Write};
use std::path::Path;

/// Cleans an open store and prints what it did.
pub fn clean_in(ctx: &Ctx, out: &mut dyn Write, store: &Store, dead_below: f64) -> CliResult {
    let report = with_progress(ctx, "cleaning", |progress| {
        Ok(store.clean_with_progress(dead_below, progress)?)
    })?;
    print_report(ctx, out, &report)
}

/// Defragments a version of an open store (or all of them) and prints what it did.
pub fn defrag_in(
    ctx: &Ctx,
    out: &mut dyn Write,
    store: &Store,
    version: Option<&str>,
) -> CliResult {
    let report = store.defrag(version)?;
    print_report(ctx, out, &report)
}

/// Shrinks an open store and prints what it did.
pub fn shrink_in(ctx: &Ctx, out: &mut dyn Write, store: &Store) -> CliResult {
    let report = with_progress(ctx, "shrinking", |progress| {
        Ok(store.shrink_with_progress(progress)?)
    })?;
    print_report(ctx, out, &report)
}

/// Runs `f` with a progress bar of bytes moved on stderr, when it is a terminal (and
/// the command runs in this process).
fn with_progress<T>(
    ctx: &Ctx,
    what: &str,
    f: impl FnOnce(&mut dyn FnMut(u64, u64)) -> CliResult<T>,
) -> CliResult<T> {
    if !ctx.local || !std::io::stderr().is_terminal() {
        return f(&mut |_, _| {});
    }
    let pb = indicatif::ProgressBar::new(1);
    if let Ok(style) = indicatif::ProgressStyle::with_template(&format!(
        "{what} {{bar:30}} {{bytes}}/{{total_bytes}} moved [{{elapsed}}]"
    )) {
        pb.set_style(style);
    }
    let result = f(&mut |done, total| {
        pb.set_length(total.max(1));
        pb.set_position(done);
    });
    pb.finish_and_clear();
    result
}

fn print_report(ctx: &Ctx, out: &mut dyn Write, r: &CleanReport) -> CliResult {
    if ctx.json {
        return print_json(&mut &mut *out, r);
    }
    writeln!(
        out,
        "moved {} ({}); freed {} ({} deleted)\nfootprint {} -> {}",
        human_bytes(r.bytes_moved),
        plural(r.blocks_moved, "block", "blocks"),
        human_bytes(r.bytes_freed),
        plural(r.segments_deleted, "segment file", "segment files"),
        human_bytes(r.footprint_before),
        human_bytes(r.footprint_after),
    )
    .map_err(output_error)
}

/// `cambium backrefs DIR --segment N [--at VERSION]`
pub fn backrefs(
    ctx: &Ctx,
    out: &mut impl Write,
    dir: &Path,
    segment: u32,
    at: Option<&str>,
) -> CliResult {
    check_at(at)?;
    let store = open_read_only(dir)?;
    let mut blocks = store.backrefs(segment)?;
    if let Some(version) = at {
        // An unknown version is "not found" (exit 1), as for reads.
        store.read_at(version)?;
        blocks.retain(|b| b.versions.iter().any(|v| v == version));
    }
    if ctx.json {
        return print_json(out, &JsonBlocks::new(ctx, segment, &blocks));
    }
    writeln!(
        out,
        "segment {segment}: {} referenced",
        plural(blocks.len() as u64, "live block", "live blocks")
    )
    .map_err(output_error)?;
    for b in &blocks {
        let parents: Vec<String> = b
            .parents
            .iter()
            .map(|p| format!("{}:{}", p.segment, p.offset))
            .collect();
        writeln!(
            out,
            "{}:{}\t{}\t{}\tkey {}\tparents {}\tversions {}",
            b.segment,
            b.offset,
            b.kind,
            human_bytes(u64::from(b.len)),
            ctx.enc.show(&b.key),
            if parents.is_empty() {
                "(root)".to_string()
            } else {
                parents.join(",")
            },
            b.versions.join(","),
        )
        .map_err(output_error)?;
    }
    Ok(())
}

/// `backrefs --json`: keys encoded as the other commands print them.
#[derive(serde::Serialize)]
struct JsonBlocks<'a> {
    segment: u32,
    blocks: Vec<JsonBlock<'a>>,
}

#[derive(serde::Serialize)]
struct JsonBlock<'a> {
    segment: u32,
    offset: u64,
    len: u32,
    kind: cambium::BlockKind,
    key: String,
    parents: &'a [cambium::BlockAddress],
    versions: &'a [String],
}

impl<'a> JsonBlocks<'a> {
    fn new(ctx: &Ctx, segment: u32, blocks: &'a [cambium::BlockRefs]) -> Self {
        JsonBlocks {
            segment,
            blocks: blocks
                .iter()
                .map(|b| JsonBlock {
                    segment: b.segment,
                    offset: b.offset,
                    len: b.len,
                    kind: b.kind,
                    key: ctx.enc.json_string(&b.key),
                    parents: &b.parents,
                    versions: &b.versions,
                })
                .collect(),
        }
    }
}
