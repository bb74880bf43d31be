//! The volume commands: `volume create|list|snapshot|clone|drop|resize|import|export`.
//!
//! Each runs in this process on the store, or, while `cambium serve` holds the
//! store, in the server, over its control socket (`control.rs`), so that a volume
//! made or snapshotted while serving is exported at once.

use super::args::VolumeCommand;
use super::codec::human_bytes;
use super::control::{self, Request};
use super::error::{output_error, CliError, CliResult};
use super::open::{open_read_only, open_writable};
use super::output::print_json;
use super::Ctx;
use cambium::volume::{Volume, VolumeInfo};
use cambium::{Durability, Store};
use serde::Serialize;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// Bytes an import reads and writes per transaction.
const IMPORT_CHUNK_BYTES: usize = 1 << 20;

/// What a volume command did, as the server (or this process) reports it: the line
/// for people, and the object for `--json`.
#[derive(Debug, Serialize, serde::Deserialize)]
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

/// `cambium volume ...`
pub fn command(ctx: &Ctx, out: &mut impl Write, cmd: &VolumeCommand) -> CliResult {
    let owned = |s: &str| s.to_owned();
    let (dir, request) = match cmd {
        VolumeCommand::Create {
            dir,
            name,
            size,
            block_size,
        } => {
            let block_size = block_size_arg(*block_size)?;
            cambium::volume::check_geometry(*size, block_size)
                .map_err(|e| CliError::usage(e.to_string()))?;
            let request = Request::VolumeCreate {
                name: owned(name),
                size_bytes: *size,
                block_size,
            };
            (dir, request)
        }
        VolumeCommand::List { dir } => (dir, Request::VolumeList),
        VolumeCommand::Snapshot { dir, volume, name } => (
            dir,
            Request::VolumeSnapshot {
                volume: owned(volume),
                name: owned(name),
            },
        ),
        VolumeCommand::Clone { dir, source, name } => (
            dir,
            Request::VolumeClone {
                source: owned(source),
                name: owned(name),
            },
        ),
        VolumeCommand::Drop { dir, name } => (dir, Request::VolumeDrop { name: owned(name) }),
        VolumeCommand::Resize { dir, name, size } => (
            dir,
            Request::VolumeResize {
                name: owned(name),
                size_bytes: *size,
            },
        ),
        VolumeCommand::Import {
            dir,
            name,
            file,
            block_size,
        } => {
            let request = Request::VolumeImport {
                name: owned(name),
                file: absolute(file)?,
                block_size: block_size_arg(*block_size)?,
            };
            (dir, request)
        }
        VolumeCommand::Export { dir, name, file } => (
            dir,
            Request::VolumeExport {
                name: owned(name),
                file: absolute(file)?,
            },
        ),
    };
    run(ctx, out, dir, request)
}

/// A block size argument: a power of two from 512 B to 1 MiB (exit 2 otherwise).
fn block_size_arg(bytes: u64) -> CliResult<u32> {
    let ok = bytes.is_power_of_two()
        && (u64::from(cambium::volume::MIN_BLOCK_SIZE)
            ..=u64::from(cambium::volume::MAX_BLOCK_SIZE))
            .contains(&bytes);
    match u32::try_from(bytes) {
        Ok(b) if ok => Ok(b),
        _ => Err(CliError::usage(format!(
            "block size {bytes} is not a power of two from 512 to 1M"
        ))),
    }
}

/// A file argument as an absolute path (the server has its own working directory).
fn absolute(file: &Path) -> CliResult<String> {
    let path = std::path::absolute(file)
        .map_err(|e| CliError::usage(format!("{}: {e}", file.display())))?;
    path.to_str()
        .map(str::to_owned)
        .ok_or_else(|| CliError::usage(format!("{} is not UTF-8", path.display())))
}

/// Runs `request` in the server that holds the store, if one does, or here.
pub fn run(ctx: &Ctx, out: &mut impl Write, dir: &Path, request: Request) -> CliResult {
    request.check()?;
    let outcome = match control::send(dir, ctx.json, &request)? {
        Some(outcome) => outcome,
        None if request.is_read_only() => {
            let store = Arc::new(open_read_only(dir)?);
            control::execute(&store, ctx.json, &request)?
        }
        None => {
            let store = Arc::new(open_writable(dir)?);
            let result = control::execute(&store, ctx.json, &request);
            if result.is_ok() && request.changes_store() {
                ctx.committed(request.describe());
            }
            close(store)?;
            result?
        }
    };
    if ctx.json {
        print_json(out, &outcome.json)
    } else {
        out.write_all(outcome.text.as_bytes()).map_err(output_error)
    }
}

/// Closes a store the command opened (its close checkpoints).
pub fn close(store: Arc<Store>) -> CliResult {
    match Arc::into_inner(store) {
        Some(store) => Ok(store.close()?),
        None => Err(CliError::failure("the store is still in use at close")),
    }
}

/// Runs a volume request on an open store (see [`control::execute`]).
pub fn execute(store: &Arc<Store>, request: &Request) -> CliResult<Outcome> {
    match request {
        Request::VolumeCreate {
            name,
            size_bytes,
            block_size,
        } => {
            let vol =
                Volume::create(store, name, *size_bytes, *block_size).map_err(usage_if_invalid)?;
            Outcome::new(
                format!(
                    "created volume {name}: {} in {} blocks\n",
                    human_bytes(vol.size()),
                    human_bytes(u64::from(vol.block_size()))
                ),
                info(store, name)?,
            )
        }
        Request::VolumeList => list(store),
        Request::VolumeSnapshot { volume, name } => {
            let started = Instant::now();
            Volume::snapshot(store, volume, name)?;
            let took = started.elapsed();
            Outcome::new(
                format!(
                    "created snapshot {name} of volume {volume} in {:.3} ms\n",
                    took.as_secs_f64() * 1e3
                ),
                serde_json::json!({"snapshot": name, "volume": volume, "elapsed_us": took.as_micros() as u64}),
            )
        }
        Request::VolumeClone { source, name } => {
            let started = Instant::now();
            Volume::clone_volume(store, source, name)?;
            let took = started.elapsed();
            Outcome::new(
                format!(
                    "created volume {name} as a clone of {source} in {:.3} ms\n",
                    took.as_secs_f64() * 1e3
                ),
                serde_json::json!({"volume": name, "source": source, "elapsed_us": took.as_micros() as u64}),
            )
        }
        Request::VolumeDrop { name } => {
            Volume::drop_volume(store, name)?;
            Outcome::new(
                format!("dropped volume {name}\n"),
                serde_json::json!({ "dropped": name }),
            )
        }
        Request::VolumeResize { name, size_bytes } => {
            let mut vol = Volume::open(store, name)?;
            vol.resize(*size_bytes).map_err(usage_if_invalid)?;
            Outcome::new(
                format!("resized volume {name} to {}\n", human_bytes(*size_bytes)),
                info(store, name)?,
            )
        }
        Request::VolumeImport {
            name,
            file,
            block_size,
        } => import(store, name, Path::new(file), *block_size),
        Request::VolumeExport { name, file } => export(store, name, Path::new(file)),
        Request::Snapshot { .. } | Request::Branch { .. } | Request::Drop { .. } => Err(
            CliError::failure("not a volume request (a bug: control::execute routes it)"),
        ),
    }
}

/// A bad size or block size is a usage error (exit 2).
fn usage_if_invalid(e: cambium::Error) -> CliError {
    match e {
        cambium::Error::InvalidArgument(msg) => CliError::usage(msg),
        e => e.into(),
    }
}

/// One volume's listing entry.
fn info(store: &Arc<Store>, name: &str) -> CliResult<VolumeInfo> {
    Volume::list(store)?
        .into_iter()
        .find(|v| v.name == name)
        .ok_or_else(|| CliError::failure(format!("volume {name:?} is not listed")))
}

fn list(store: &Arc<Store>) -> CliResult<Outcome> {
    let volumes = Volume::list(store)?;
    let header = [
        "VOLUME",
        "KIND",
        "SIZE",
        "ALLOCATED",
        "EXCLUSIVE",
        "SHARED",
        "BLOCK",
        "PARENT",
    ];
    let rows: Vec<[String; 8]> = volumes
        .iter()
        .map(|v| {
            [
                v.name.clone(),
                if v.snapshot { "snapshot" } else { "volume" }.to_owned(),
                human_bytes(v.size_bytes),
                human_bytes(v.allocated_bytes),
                human_bytes(v.exclusive_bytes),
                human_bytes(v.shared_bytes),
                human_bytes(u64::from(v.block_size)),
                v.parent.clone().unwrap_or_else(|| "-".to_owned()),
            ]
        })
        .collect();
    Outcome::new(table(header, &rows), &volumes)
}

/// Columns two spaces apart; the numbers (columns 2 to 6) aligned right.
fn table<const N: usize>(header: [&str; N], rows: &[[String; N]]) -> String {
    let mut width = header.map(|h| h.chars().count());
    for row in rows {
        for (w, c) in width.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut text = String::new();
    let header = header.map(str::to_owned);
    for row in std::iter::once(&header).chain(rows) {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(col, cell)| match col {
                2..=6 => format!("{cell:>w$}", w = width[col]),
                _ => format!("{cell:<w$}", w = width[col]),
            })
            .collect();
        text.push_str(cells.join("  ").trim_end());
        text.push('\n');
    }
    text
}

/// `volume import`: a raw image into a new volume; zero blocks stay holes.
fn import(store: &Arc<Store>, name: &str, file: &Path, block_size: u32) -> CliResult<Outcome> {
    let mut input = std::fs::File::open(file)
        .map_err(|e| CliError::failure(format!("open {}: {e}", file.display())))?;
    let len = input
        .metadata()
        .map_err(|e| CliError::failure(format!("stat {}: {e}", file.display())))?
        .len();
    if len == 0 {
        return Err(CliError::failure(format!("{} is empty", file.display())));
    }
    let size = len.div_ceil(u64::from(block_size)) * u64::from(block_size);
    let vol = Volume::create(store, name, size, block_size).map_err(usage_if_invalid)?;
    let bar = progress(size, "importing");
    let mut chunk = vec![0u8; IMPORT_CHUNK_BYTES];
    let mut offset = 0u64;
    while offset < len {
        let want = ((len - offset) as usize).min(chunk.len());
        input
            .read_exact(&mut chunk[..want])
            .map_err(|e| CliError::failure(format!("read {}: {e}", file.display())))?;
        // A new volume is all holes: a zero chunk needs no write at all.
        if chunk[..want].iter().any(|&b| b != 0) {
            vol.write_at(offset, &chunk[..want], Durability::Deferred)?;
        }
        offset += want as u64;
        bar.set_position(offset);
    }
    vol.sync()?;
    bar.finish_and_clear();
    let allocated = vol.allocated_bytes()?;
    Outcome::new(
        format!(
            "imported {} into volume {name}: {}, {} allocated\n",
            file.display(),
            human_bytes(size),
            human_bytes(allocated)
        ),
        info(store, name)?,
    )
}

/// `volume export`: the volume into a sparse raw file (holes are not written).
fn export(store: &Arc<Store>, name: &str, file: &Path) -> CliResult<Outcome> {
    use std::os::unix::fs::FileExt;
    let vol = Volume::open(store, name)?;
    let fail = |what: &str, e: std::io::Error| {
        CliError::failure(format!("{what} {}: {e}", file.display()))
    };
    let output = std::fs::File::create(file).map_err(|e| fail("create", e))?;
    output.set_len(vol.size()).map_err(|e| fail("size", e))?;
    let bar = progress(vol.size(), "exporting");
    // Adjacent blocks go out in one write of up to 1 MiB.
    let mut run: Vec<u8> = Vec::with_capacity(IMPORT_CHUNK_BYTES);
    let mut run_at = 0u64;
    let mut written = 0u64;
    let mut flush = |run: &mut Vec<u8>, at: u64| -> Result<(), cambium::Error> {
        output.write_all_at(run, at).map_err(|e| {
            let what = format!("write {}: {e}", file.display());
            cambium::Error::Io(std::io::Error::new(e.kind(), what))
        })?;
        written += run.len() as u64;
        run.clear();
        Ok(())
    };
    vol.for_each_block(|offset, block| {
        let adjacent = run_at + run.len() as u64 == offset;
        if !run.is_empty() && (!adjacent || run.len() >= IMPORT_CHUNK_BYTES) {
            flush(&mut run, run_at)?;
        }
        if run.is_empty() {
            run_at = offset;
        }
        run.extend_from_slice(block);
        bar.set_position(offset);
        Ok(())
    })?;
    if !run.is_empty() {
        flush(&mut run, run_at)?;
    }
    output.sync_all().map_err(|e| fail("sync", e))?;
    bar.finish_and_clear();
    Outcome::new(
        format!(
            "exported volume {name} to {}: {}, {} of data\n",
            file.display(),
            human_bytes(vol.size()),
            human_bytes(written)
        ),
        serde_json::json!({"volume": name, "file": file, "size_bytes": vol.size(), "data_bytes": written}),
    )
}

/// A byte progress bar on stderr, only when stderr is a terminal.
fn progress(total: u64, what: &str) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    ) {
        bar.set_style(style);
    }
    bar.set_message(what.to_owned());
    bar
}
