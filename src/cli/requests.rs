//! Commands that change the store's catalog of volumes and versions (`volume ...`,
//! `snapshot`, `branch`, `drop`): each becomes a [`Request`], run in this process on
//! the store or, while `cambium serve` holds the store, sent to the server over its
//! control socket (`control.rs`) and run there, with the same output and exit code.

use super::args::VolumeCommand;
use super::control::{self, Outcome, Request};
use super::error::{output_error, CliError, CliResult};
use super::open::{open_read_only, open_writable};
use super::output::print_json;
use super::{versions, volume, Ctx};
use cambium::{Store, VersionKind};
use std::io::Write;
use std::path::Path;

/// `cambium volume ...`
pub fn volume(ctx: &Ctx, out: &mut impl Write, cmd: &VolumeCommand) -> CliResult {
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
            let store = open_read_only(dir)?;
            execute(&store, ctx.json, &request)?
        }
        None => {
            let store = open_writable(dir)?;
            match execute(&store, ctx.json, &request) {
                Ok(outcome) => {
                    if request.changes_store() {
                        ctx.committed(request.describe());
                    }
                    store.close()?;
                    outcome
                }
                Err(e) => {
                    // The request's own error is the one to report.
                    let _ = store.close();
                    return Err(e);
                }
            }
        }
    };
    if ctx.json {
        print_json(out, &outcome.json)
    } else {
        out.write_all(outcome.text.as_bytes()).map_err(output_error)
    }
}

/// Runs a request on an open store: in this process for a command, or in `serve`
/// for a command that reached it over the control socket.
pub fn execute(store: &Store, json: bool, request: &Request) -> CliResult<Outcome> {
    match request {
        Request::Snapshot { source, name } => {
            versions::make_in(store, json, source, name, VersionKind::Snapshot)
        }
        Request::Branch { source, name } => {
            versions::make_in(store, json, source, name, VersionKind::Branch)
        }
        Request::Drop { name } => versions::drop_in(store, name),
        _ => volume::execute(store, request),
    }
}

/// Makes a snapshot or a branch, then prints what it made: a short line, or with
/// `--json` the new version as `versions --json` lists it. While `serve` holds the
/// store, the server makes it.
fn make(
    ctx: &Ctx,
    out: &mut impl Write,
    dir: &Path,
    source: &str,
    name: &str,
    kind: VersionKind,
) -> CliResult {
    let (source, name) = (source.to_owned(), name.to_owned());
    let request = match kind {
        VersionKind::Snapshot => Request::Snapshot { source, name },
        VersionKind::Branch => Request::Branch { source, name },
    };
    run(ctx, out, dir, request)
}

/// `cambium snapshot DIR SOURCE NAME`
pub fn snapshot(
    ctx: &Ctx,
    out: &mut impl Write,
    dir: &Path,
    source: &str,
    name: &str,
) -> CliResult {
    make(ctx, out, dir, source, name, VersionKind::Snapshot)
}

/// `cambium branch DIR SOURCE NAME`
pub fn branch(ctx: &Ctx, out: &mut impl Write, dir: &Path, source: &str, name: &str) -> CliResult {
    make(ctx, out, dir, source, name, VersionKind::Branch)
}

/// `cambium drop DIR NAME`: removes the version, then reclaims its space before the
/// command exits (or, while `serve` holds the store, in the server's background).
pub fn drop(ctx: &Ctx, out: &mut impl Write, dir: &Path, name: &str) -> CliResult {
    let request = Request::Drop {
        name: name.to_owned(),
    };
    run(ctx, out, dir, request)
}
