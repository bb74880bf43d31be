//! Commands that change the store (`put`, `del`, `batch`, `volume ...`, `snapshot`,
//! `branch`, `drop`, `checkpoint`, `clean`, `defrag`, `shrink`): each becomes a
//! [`Request`], run in this process on the store or, while `cambium serve` holds the
//! store, sent to the server over its control socket (`control.rs`) and run there,
//! with the same output and exit code.

use super::args::VolumeCommand;
use super::codec::Encoding;
use super::control::{self, Envelope, Outcome, Request};
use super::error::{output_error, CliError, CliResult};
use super::open::{
    in_use_hint, is_serve, lock_wait, open_read_only, open_writable_waiting, serve_starting, Target,
};
use super::output::print_json;
use super::{batch, data, space, versions, volume, Ctx};
use cambium::{check_key, Store, VersionKind};
use std::io::{BufRead, Write};
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
            size,
        } => {
            let block_size = block_size_arg(*block_size)?;
            // Name errors (exit 2) come before the image's (exit 3), as for the others.
            super::open::check_name(name)?;
            let (file, input) = image_source(file)?;
            let request = Request::VolumeImport {
                name: owned(name),
                file,
                block_size,
                size_bytes: *size,
            };
            return run(ctx, out, dir, request, input);
        }
        VolumeCommand::Export { dir, name, file } => {
            // Stdout (`-`, `/dev/stdout`) and this process's other descriptors
            // (`/dev/fd/N`) only this process can write to: the export runs here, on a
            // read-only open beside a running server (it then holds every write the
            // server has made durable).
            let own = match own_descriptor(file) {
                Some(1) => Some("-".to_owned()),
                Some(_) => Some(file.display().to_string()),
                None if file == Path::new("-") => Some("-".to_owned()),
                None => None,
            };
            if let Some(file) = own {
                let request = Request::VolumeExport {
                    name: owned(name),
                    file,
                };
                return run_here_read_only(ctx, out, dir, &request);
            }
            (
                dir,
                Request::VolumeExport {
                    name: owned(name),
                    file: absolute(file)?,
                },
            )
        }
    };
    run(ctx, out, dir, request, None)
}

/// The descriptor of this process that `path` names, if it names one: `/dev/stdin`,
/// `/dev/stdout`, `/dev/fd/N`, `/proc/self/fd/N` (following symbolic links, as
/// `/dev/stdout` is one). A server given such a path would open its own descriptor.
fn own_descriptor(path: &Path) -> Option<u32> {
    let mut path = std::path::absolute(path).ok()?;
    let pid = format!("/proc/{}/fd", std::process::id());
    for _ in 0..8 {
        for dir in [
            "/dev/fd",
            "/proc/self/fd",
            "/proc/thread-self/fd",
            pid.as_str(),
        ] {
            if let Ok(rest) = path.strip_prefix(dir) {
                return rest.to_str()?.parse().ok();
            }
        }
        let target = std::fs::read_link(&path).ok()?;
        path = match path.parent() {
            Some(parent) => parent.join(target),
            None => target,
        };
    }
    None
}

/// Runs a read-only `request` in this process even when a server holds the store. A
/// read-only open sees what the server has made durable, so a server there is asked
/// for a checkpoint first: the request then sees every write it answered before.
fn run_here_read_only(ctx: &Ctx, out: &mut impl Write, dir: &Path, request: &Request) -> CliResult {
    request.check()?;
    let checkpoint = Envelope {
        json: false,
        hex: false,
        dir: dir.to_str().map(str::to_owned),
        request: Request::Checkpoint,
    };
    // Its own context: a checkpoint is not this command's change (a failure after
    // it is still an error, not a warning).
    let quiet = Ctx::new(false, false, true);
    if let Err(e) = control::send(&quiet, dir, &checkpoint, &mut None, &mut std::io::sink()) {
        // What the server has made durable can still be read (a full disk refuses
        // the checkpoint, not the reading).
        eprintln!(
            "cambium: warning: the server's checkpoint failed ({}): reading what it has \
             made durable",
            e.msg
        );
    }
    let store = open_read_only(dir)?;
    execute(&store, dir, ctx, request, &mut std::io::empty(), out)
}

/// Where `volume import` reads its image: a regular file or a block device by its
/// (absolute) path, which a server opens itself (both have a length); or stdin (`-`),
/// one of this process's descriptors (`/dev/stdin`, `<(xz -dc image.xz)`: a server
/// would open its own), a pipe or a character device, read here as a stream: its bytes
/// become the request's input.
fn image_source(file: &Path) -> CliResult<(Option<String>, Option<Input>)> {
    use std::os::unix::fs::FileTypeExt;
    let own = match file == Path::new("-") {
        true => Some(0),
        false => own_descriptor(file),
    };
    match own {
        Some(0) => return Ok((None, Some(Box::new(std::io::stdin())))),
        Some(_) => {
            let stream = std::fs::File::open(file)
                .map_err(|e| CliError::failure(format!("open {}: {e}", file.display())))?;
            return Ok((None, Some(Box::new(stream))));
        }
        None => {}
    }
    let meta = std::fs::metadata(file)
        .map_err(|e| CliError::failure(format!("open {}: {e}", file.display())))?;
    if meta.is_file() || meta.file_type().is_block_device() {
        return Ok((Some(absolute(file)?), None));
    }
    if meta.is_dir() {
        return Err(CliError::failure(format!(
            "{} is a directory",
            file.display()
        )));
    }
    let stream = std::fs::File::open(file)
        .map_err(|e| CliError::failure(format!("open {}: {e}", file.display())))?;
    Ok((None, Some(Box::new(stream))))
}

/// What a request that takes input reads.
type Input = Box<dyn std::io::Read + Send>;

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

/// Runs `request` in the server that holds the store, if one does, or here. `input`
/// is what a request that takes input (`batch`, `volume import` of a stream) reads.
pub fn run(
    ctx: &Ctx,
    out: &mut impl Write,
    dir: &Path,
    request: Request,
    mut input: Option<Input>,
) -> CliResult {
    request.check()?;
    let envelope = Envelope {
        json: ctx.json,
        hex: ctx.enc == Encoding::Hex,
        dir: dir.to_str().map(str::to_owned),
        request,
    };
    if control::send(ctx, dir, &envelope, &mut input, out)? {
        return Ok(());
    }
    let request = &envelope.request;
    if request.is_read_only() {
        let store = open_read_only(dir)?;
        let mut input = local_input(input);
        return execute(&store, dir, ctx, request, &mut input, out);
    }
    let Some(store) = open_or_reach_server(ctx, dir, &envelope, &mut input, out)? else {
        // A server started while we waited, and ran the request.
        return Ok(());
    };
    let mut input = local_input(input);
    match execute(&store, dir, ctx, request, &mut input, out) {
        Ok(()) => Ok(store.close()?),
        Err(e) => {
            // The request's own error is the one to report.
            let _ = store.close();
            Err(e)
        }
    }
}

/// What a request run here reads.
fn local_input(input: Option<Input>) -> Box<dyn BufRead> {
    match input {
        Some(input) => Box::new(std::io::BufReader::with_capacity(1 << 16, input)),
        None => Box::new(std::io::empty()),
    }
}

/// Opens the store for writing; with `--wait`, while another process holds it, keeps
/// trying its control socket too (a `serve` that started meanwhile holds the store for
/// good, but answers there once it is up): `None` when the server ran the request.
fn open_or_reach_server(
    ctx: &Ctx,
    dir: &Path,
    envelope: &Envelope,
    input: &mut Option<Input>,
    out: &mut impl Write,
) -> CliResult<Option<Store>> {
    let Some(wait) = lock_wait() else {
        // The lock's record may still name the previous holder for a moment after a
        // new one took it: a holder that is not a starting server is looked at twice.
        let opened = match open_writable_waiting(dir, None) {
            Err(cambium::Error::Locked { pid: Some(pid) }) if serve_starting(pid).is_none() => {
                std::thread::sleep(LOCK_RECORD_LAG);
                open_writable_waiting(dir, None)
            }
            opened => opened,
        };
        return match opened {
            Err(cambium::Error::Locked { pid: Some(pid) }) => match serve_starting(pid) {
                Some(left) => wait_for_starting_server(ctx, dir, envelope, input, out, pid, left),
                None => Err(in_use_hint(cambium::Error::Locked { pid: Some(pid) })),
            },
            opened => opened.map(Some).map_err(in_use_hint),
        };
    };
    let deadline = std::time::Instant::now().checked_add(wait);
    loop {
        let left = deadline.map_or(LOCK_RETRY, |d| {
            d.saturating_duration_since(std::time::Instant::now())
        });
        match open_writable_waiting(dir, Some(left.min(LOCK_RETRY))) {
            Err(cambium::Error::Locked { .. }) if !left.is_zero() => {
                if control::send(ctx, dir, envelope, input, out)? {
                    return Ok(None);
                }
            }
            Err(e) => return Err(in_use_hint(e)),
            Ok(store) => return Ok(Some(store)),
        }
    }
}

/// How long after taking the writer lock its holder writes its pid into the lock's
/// record, at most, give or take a busy machine.
const LOCK_RECORD_LAG: std::time::Duration = std::time::Duration::from_millis(50);

/// Waits up to `left` for the starting `serve` (process `pid`) to answer on its
/// control socket, and has it run the request (`None`); once it is gone, or the time
/// is up, opens the store here as a command does without a server (waiting a moment
/// for the lock an exiting server still holds).
fn wait_for_starting_server(
    ctx: &Ctx,
    dir: &Path,
    envelope: &Envelope,
    input: &mut Option<Input>,
    out: &mut impl Write,
    pid: u32,
    left: std::time::Duration,
) -> CliResult<Option<Store>> {
    let deadline = std::time::Instant::now() + left;
    while std::time::Instant::now() < deadline && is_serve(pid) {
        std::thread::sleep(std::time::Duration::from_millis(20));
        if control::send(ctx, dir, envelope, input, out)? {
            return Ok(None);
        }
    }
    open_writable_waiting(dir, Some(std::time::Duration::from_secs(1)))
        .map(Some)
        .map_err(in_use_hint)
}

/// How long one try at the writer lock waits, between looks at the control socket.
const LOCK_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

/// Runs a request on an open store (the store in `dir`): in this process for a
/// command, or in `serve` for a command that reached it over the control socket.
/// What it prints goes to `out`; a change it commits is recorded in `ctx` (so that a
/// later failure is reported as a warning, exit 6).
pub fn execute(
    store: &Store,
    dir: &Path,
    ctx: &Ctx,
    request: &Request,
    input: &mut dyn BufRead,
    out: &mut dyn Write,
) -> CliResult {
    let target = |branch| Target { dir, branch };
    let mut catalog = |outcome: CliResult<Outcome>| print_outcome(ctx, request, out, outcome?);
    match request {
        Request::Put { branch, key, value } => data::put_in(ctx, store, target(branch), key, value),
        Request::Del { branch, key } => data::del_in(ctx, store, target(branch), key),
        Request::Batch {
            branch,
            commit_every,
        } => batch::batch_in(
            ctx,
            &mut &mut *out,
            input,
            store,
            target(branch),
            *commit_every,
            !ctx.local,
        ),
        Request::Checkpoint => Ok(store.checkpoint()?),
        Request::Clean { until_dead_below } => space::clean_in(ctx, out, store, *until_dead_below),
        Request::Defrag { version } => space::defrag_in(ctx, out, store, version.as_deref()),
        Request::Shrink => space::shrink_in(ctx, out, store),
        Request::Snapshot { source, name } => catalog(versions::make_in(
            store,
            ctx.json,
            source,
            name,
            VersionKind::Snapshot,
        )),
        Request::Branch { source, name } => catalog(versions::make_in(
            store,
            ctx.json,
            source,
            name,
            VersionKind::Branch,
        )),
        Request::Drop { name } => {
            catalog(versions::drop_in(store, name).map(|o| reclaimed(ctx, store, o)))
        }
        Request::VolumeDrop { .. } => {
            catalog(volume::execute(store, request, input, ctx).map(|o| reclaimed(ctx, store, o)))
        }
        _ => catalog(volume::execute(store, request, input, ctx)),
    }
}

/// A drop run by a server: its space comes back before the answer, as it does when
/// the command runs on its own (whose close reclaims it). A failure to (a full disk
/// the reserve did not cover) leaves the drop done and its space to the server's
/// background work, and says so.
fn reclaimed(ctx: &Ctx, store: &Store, mut outcome: Outcome) -> Outcome {
    if ctx.local {
        return outcome;
    }
    if let Err(e) = store.reclaim_dropped() {
        outcome.warn(format!("its space comes back later: {e}"));
    }
    outcome
}

/// Prints what a catalog request did, having recorded what it committed.
fn print_outcome(ctx: &Ctx, request: &Request, out: &mut dyn Write, outcome: Outcome) -> CliResult {
    if let Some(what) = describe(request) {
        ctx.committed(what);
    }
    if outcome.is_nothing() {
        Ok(())
    } else if ctx.json {
        print_json(&mut &mut *out, &outcome.json)
    } else {
        out.write_all(outcome.text.as_bytes()).map_err(output_error)
    }
}

/// What a catalog request changes, for the warning after its commit ("... and is
/// durable"); `None` for one that changes nothing, or records it itself.
fn describe(request: &Request) -> Option<String> {
    Some(match request {
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
        _ => return None,
    })
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
    run(ctx, out, dir, request, None)
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
    run(ctx, out, dir, request, None)
}

/// `cambium put DIR KEY VALUE [--branch B]`
pub fn put(
    ctx: &Ctx,
    out: &mut impl Write,
    dir: &Path,
    key: &str,
    value: &str,
    branch: &str,
) -> CliResult {
    let key = ctx.enc.decode_arg("key", key)?;
    let value = ctx.enc.decode_arg("value", value)?;
    check_key(&key)?;
    let request = Request::Put {
        branch: branch.to_owned(),
        key,
        value,
    };
    run(ctx, out, dir, request, None)
}

/// `cambium del DIR KEY [--branch B]`
pub fn del(ctx: &Ctx, out: &mut impl Write, dir: &Path, key: &str, branch: &str) -> CliResult {
    let key = ctx.enc.decode_arg("key", key)?;
    check_key(&key)?;
    let request = Request::Del {
        branch: branch.to_owned(),
        key,
    };
    run(ctx, out, dir, request, None)
}

/// `cambium batch DIR [--branch B] [--commit-every N]`: the operations are read
/// from stdin (and sent to the server, while one holds the store).
pub fn batch(
    ctx: &Ctx,
    out: &mut impl Write,
    dir: &Path,
    branch: &str,
    commit_every: Option<u64>,
) -> CliResult {
    let request = Request::Batch {
        branch: branch.to_owned(),
        commit_every,
    };
    run(ctx, out, dir, request, Some(Box::new(std::io::stdin())))
}

/// `cambium checkpoint DIR`
pub fn checkpoint(ctx: &Ctx, out: &mut impl Write, dir: &Path) -> CliResult {
    run(ctx, out, dir, Request::Checkpoint, None)
}

/// `cambium clean DIR [--until-dead-below PCT]`
pub fn clean(ctx: &Ctx, out: &mut impl Write, dir: &Path, until_dead_below: f64) -> CliResult {
    run(ctx, out, dir, Request::Clean { until_dead_below }, None)
}

/// `cambium defrag DIR [VERSION]`
pub fn defrag(ctx: &Ctx, out: &mut impl Write, dir: &Path, version: Option<&str>) -> CliResult {
    let version = version.map(str::to_owned);
    run(ctx, out, dir, Request::Defrag { version }, None)
}

/// `cambium shrink DIR`
pub fn shrink(ctx: &Ctx, out: &mut impl Write, dir: &Path) -> CliResult {
    run(ctx, out, dir, Request::Shrink, None)
}
