//! The volume commands: `volume create|list|snapshot|clone|drop|resize|import|export`.
//!
//! Each runs in this process on the store, or, while `cambium serve` holds the
//! store, in the server, over its control socket (`control.rs`), so that a volume
//! made or snapshotted while serving is exported at once.

use super::codec::human_bytes;
use super::control::{Outcome, Request};
use super::error::{CliError, CliResult};
use super::output::progress_bar;
use super::Ctx;
use cambium::volume::{FillError, Volume, VolumeInfo};
use cambium::{Durability, Error, Store};
use std::io::{BufRead, Read};
use std::path::Path;
use std::time::{Duration, Instant};

/// Bytes an import reads and writes per transaction.
const IMPORT_CHUNK_BYTES: usize = 1 << 20;

/// Runs a volume request on an open store (see `requests::execute`).
pub fn execute(
    store: &Store,
    request: &Request,
    input: &mut dyn BufRead,
    ctx: &Ctx,
) -> CliResult<Outcome> {
    let progress = Progress::of(ctx);
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
            let (pause, durable) = timed(store, || {
                Volume::snapshot_timed(store, volume, name, Durability::Deferred)
            })?;
            // A snapshot of a snapshot is one too (its blocks shared with it).
            let of = match Volume::open(store, volume).is_ok_and(|v| v.is_read_only()) {
                true => "snapshot",
                false => "volume",
            };
            Outcome::new(
                format!(
                    "created snapshot {name} of {of} {volume} in {} (durable in {})\n",
                    ms(pause),
                    ms(durable)
                ),
                serde_json::json!({"snapshot": name, "volume": volume,
                    "elapsed_us": pause.as_micros() as u64, "durable_us": durable.as_micros() as u64}),
            )
        }
        Request::VolumeClone { source, name } => {
            let (pause, durable) = timed(store, || {
                Volume::clone_timed(store, source, name, Durability::Deferred)
            })?;
            Outcome::new(
                format!(
                    "created volume {name} as a clone of {source} in {} (durable in {})\n",
                    ms(pause),
                    ms(durable)
                ),
                serde_json::json!({"volume": name, "source": source,
                    "elapsed_us": pause.as_micros() as u64, "durable_us": durable.as_micros() as u64}),
            )
        }
        Request::VolumeDrop { name } => {
            let kind = match Volume::open(store, name)?.is_read_only() {
                true => "snapshot",
                false => "volume",
            };
            Volume::drop_volume(store, name)?;
            Outcome::new(
                format!("dropped {kind} {name}\n"),
                serde_json::json!({ "dropped": name }),
            )
        }
        Request::VolumeResize { name, size_bytes } => {
            let mut vol = Volume::open(store, name)?;
            vol.check_complete()?;
            vol.resize(*size_bytes).map_err(usage_if_invalid)?;
            Outcome::new(
                format!("resized volume {name} to {}\n", human_bytes(*size_bytes)),
                info(store, name)?,
            )
        }
        Request::VolumeImport {
            name,
            file: Some(file),
            block_size,
            size_bytes,
        } => {
            let shape = ImportShape::new(*block_size, *size_bytes);
            import(store, name, Path::new(file), shape, &progress)
        }
        Request::VolumeImport {
            name,
            file: None,
            block_size,
            size_bytes,
        } => {
            let shape = ImportShape::new(*block_size, *size_bytes);
            import_stream(store, name, input, shape, &progress)
        }
        Request::VolumeExport { name, file } => {
            export(store, name, Path::new(file), ctx.local, &progress)
        }
        _ => Err(CliError::failure(
            "not a volume request (a bug: requests::execute routes it)",
        )),
    }
}

/// Runs `make` (a snapshot or clone made with deferred durability), then makes it
/// durable: returns the time until it existed (holding every write answered
/// before it: the moment it was made under the writer lock, which is what writers
/// may have waited for, not when this thread next ran) and the time until it was
/// durable (the fsync of everything written since the last flush, which writers do
/// not wait for).
fn timed(
    store: &Store,
    make: impl FnOnce() -> Result<(Volume, Instant), cambium::Error>,
) -> CliResult<(Duration, Duration)> {
    let started = Instant::now();
    let (_, existed) = make()?;
    let made = existed.saturating_duration_since(started);
    store.sync()?;
    Ok((made, started.elapsed()))
}

/// A duration for people, in milliseconds.
fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

/// A bad size or block size is a usage error (exit 2).
fn usage_if_invalid(e: cambium::Error) -> CliError {
    match e {
        cambium::Error::InvalidArgument(msg) => CliError::usage(msg),
        e => e.into(),
    }
}

/// One volume's listing entry.
fn info(store: &Store, name: &str) -> CliResult<VolumeInfo> {
    Volume::list(store)?
        .into_iter()
        .find(|v| v.name == name)
        .ok_or_else(|| CliError::failure(format!("volume {name:?} is not listed")))
}

fn list(store: &Store) -> CliResult<Outcome> {
    let volumes = Volume::list(store)?;
    let header = [
        "VOLUME",
        "KIND",
        "PROVISIONED",
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
                match (v.snapshot, v.incomplete) {
                    (true, _) => "snapshot",
                    // The remains of an import cut short (or one under way).
                    (false, true) => "incomplete",
                    (false, false) => "volume",
                }
                .to_owned(),
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

/// The volume an import makes: its block size, and its size if `--size` gave one
/// (otherwise the image's, rounded up to whole blocks).
#[derive(Clone, Copy)]
struct ImportShape {
    block_size: u32,
    size: Option<u64>,
}

impl ImportShape {
    fn new(block_size: u32, size: Option<u64>) -> ImportShape {
        ImportShape { block_size, size }
    }

    /// The image's length rounded up to whole blocks.
    fn rounded(&self, len: u64) -> u64 {
        len.div_ceil(u64::from(self.block_size)) * u64::from(self.block_size)
    }

    /// The error for an image of `len` bytes, if it is longer than `--size`.
    fn too_long(&self, source: &str, len: u64) -> Option<CliError> {
        let size = self.size.filter(|&size| len > size)?;
        Some(longer_than_size(source, size))
    }
}

fn longer_than_size(source: &str, size: u64) -> CliError {
    CliError::failure(format!(
        "{source} is longer than the volume's --size {size} ({})",
        human_bytes(size)
    ))
}

/// `volume import`: a raw image (a regular file or a block device) into a new volume;
/// zero blocks stay holes.
fn import(
    store: &Store,
    name: &str,
    file: &Path,
    shape: ImportShape,
    progress: &Progress<'_>,
) -> CliResult<Outcome> {
    let mut input = std::fs::File::open(file)
        .map_err(|e| CliError::failure(format!("open {}: {e}", file.display())))?;
    let len = image_len(&mut input)
        .map_err(|e| CliError::failure(format!("stat {}: {e}", file.display())))?;
    let source = file.display().to_string();
    if len == 0 && shape.size.is_none() {
        return Err(CliError::failure(format!("{source} is empty")));
    }
    if let Some(e) = shape.too_long(&source, len) {
        return Err(e);
    }
    let size = shape.size.unwrap_or(shape.rounded(len));
    let (mut vol, _filling) =
        Volume::create_filling(store, name, size, shape.block_size).map_err(usage_if_invalid)?;
    let bar = progress.bar(Some(len), "importing");
    let copied = fill(&vol, &mut (&mut input).take(len), &source, &bar).and_then(|n| {
        if n < len {
            return Err(CliError::failure(format!(
                "read {source}: it ended after {n} of its {len} bytes"
            )));
        }
        Ok(vol.complete()?)
    });
    if let Err(e) = copied {
        return Err(abandon(vol, e));
    }
    bar.finish_and_clear();
    imported(store, &vol, name, &source, len)
}

/// Fills the new volume `vol` from `input` (`source`, for messages) to the input's
/// end ([`Volume::fill_from`]); returns the bytes read. Input past the volume's end
/// is an error.
fn fill(vol: &Volume, input: &mut dyn Read, source: &str, bar: &Bar<'_>) -> CliResult<u64> {
    vol.fill_from(input, &mut |n| bar.set_position(n))
        .map_err(|e| match e {
            FillError::Write(e) => CliError::from(e),
            FillError::TooLong(size) => longer_than_size(source, size),
            FillError::Read(e) => CliError::failure(format!("read {source}: {e}")),
        })
}

/// The length of a regular file, or of a block device (its `st_size` is 0: the length
/// is where a seek to its end lands).
fn image_len(input: &mut std::fs::File) -> std::io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    let meta = input.metadata()?;
    if meta.is_file() {
        return Ok(meta.len());
    }
    let len = input.seek(SeekFrom::End(0))?;
    input.seek(SeekFrom::Start(0))?;
    Ok(len)
}

/// `volume import` of an image read as a stream (stdin, a pipe), whose length is known
/// only at its end: without `--size` the volume grows (doubling) as the bytes come,
/// then takes the image's length, rounded up to whole blocks; with it, the volume has
/// that size from the start, and a stream that goes on past it is refused (an endless
/// one, `/dev/zero`, would otherwise be read forever).
fn import_stream(
    store: &Store,
    name: &str,
    input: &mut dyn BufRead,
    shape: ImportShape,
    progress: &Progress<'_>,
) -> CliResult<Outcome> {
    let source = "the input";
    let initial = shape.size.unwrap_or(IMPORT_CHUNK_BYTES as u64);
    let (mut vol, _filling) =
        Volume::create_filling(store, name, initial, shape.block_size).map_err(usage_if_invalid)?;
    let bar = progress.bar(shape.size, "importing");
    let copied = match shape.size {
        // A known size: read, written and mapped at once, as a file's import.
        Some(_) => fill(&vol, input, source, &bar),
        None => copy_stream(&mut vol, input, source, &bar),
    };
    let copied = copied.and_then(|len| {
        if shape.size.is_none() {
            if len == 0 {
                return Err(CliError::failure("the input is empty"));
            }
            vol.resize(shape.rounded(len)).map_err(usage_if_invalid)?;
        }
        vol.complete()?;
        Ok(len)
    });
    let len = match copied {
        Ok(len) => len,
        Err(e) => return Err(abandon(vol, e)),
    };
    bar.finish_and_clear();
    imported(store, &vol, name, source, len)
}

/// An import that failed with `e`: half an image is no image, so the volume it was
/// filling goes again (best effort: one left behind is marked incomplete, and the next
/// import of its name replaces it), unless it is gone already (dropped meanwhile: a
/// volume made under its name since is not this import's to drop). Returns the error
/// to report.
fn abandon(vol: Volume, e: CliError) -> CliError {
    let name = vol.name().to_owned();
    match vol.drop_this() {
        Err(Error::VolumeNotFound(_)) => CliError::failure(format!(
            "volume {name} was dropped while the import was filling it"
        )),
        _ => e,
    }
}

/// Copies `input` (`source`, for messages) to its end into the new volume `vol`,
/// growing it as needed, and skipping zero chunks (a new volume is all holes: a zero
/// chunk needs no write at all); returns the bytes read. One chunk at a time: the
/// volume's size changes between writes, which [`Volume::fill_from`]'s writes in
/// flight do not allow.
fn copy_stream(
    vol: &mut Volume,
    input: &mut dyn Read,
    source: &str,
    bar: &Bar<'_>,
) -> CliResult<u64> {
    let block = u64::from(vol.block_size());
    let mut chunk = vec![0u8; IMPORT_CHUNK_BYTES];
    let mut offset = 0u64;
    loop {
        let n = read_full(input, &mut chunk)
            .map_err(|e| CliError::failure(format!("read {source}: {e}")))?;
        if n == 0 {
            return Ok(offset);
        }
        let end = offset + n as u64;
        if end > vol.size() {
            let grown = (vol.size().saturating_mul(2)).max(end.div_ceil(block) * block);
            vol.resize(grown).map_err(usage_if_invalid)?;
        }
        if chunk[..n].iter().any(|&b| b != 0) {
            vol.write_at(offset, &chunk[..n], Durability::Deferred)?;
        }
        offset = end;
        bar.set_position(offset);
    }
}

/// Reads until `buf` is full or the input ends; the bytes read.
fn read_full(input: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match input.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// What an import made: the new volume's size and allocation, and the rounding of an
/// image that did not end on a block boundary.
fn imported(store: &Store, vol: &Volume, name: &str, source: &str, len: u64) -> CliResult<Outcome> {
    let allocated = vol.allocated_bytes()?;
    let block = u64::from(vol.block_size());
    let rounded = if len == vol.size() {
        String::new()
    } else if len.div_ceil(block) * block == vol.size() {
        format!(
            " (the image's {len} bytes rounded up to whole {} blocks)",
            human_bytes(block)
        )
    } else {
        format!(" (the image's {len} bytes, then zeroes)")
    };
    Outcome::new(
        format!(
            "imported {source} into volume {name}: {}, {} allocated{rounded}\n",
            human_bytes(vol.size()),
            human_bytes(allocated)
        ),
        info(store, name)?,
    )
}

/// `volume export`: the volume into a sparse raw file (holes are not written).
fn export(
    store: &Store,
    name: &str,
    file: &Path,
    local: bool,
    progress: &Progress<'_>,
) -> CliResult<Outcome> {
    let vol = Volume::open(store, name)?;
    if vol.is_incomplete() {
        // Checked before the output is made: half an image is no image.
        return Err(CliError::failure(format!(
            "volume {name} is incomplete (an import is filling it, or was cut short): \
             import it again, or drop it"
        )));
    }
    let fail = |what: &str, e: std::io::Error| {
        CliError::failure(format!("{what} {}: {e}", file.display()))
    };
    // Whether this export made the output file (a failed one then removes it).
    let mut created = false;
    let mut sink = if file == Path::new("-") {
        if !local {
            return Err(CliError::failure(
                "volume export to stdout (-) needs the store to itself: a running server \
                 cannot write to this command's output; name a file",
            ));
        }
        ExportSink::Stream(Box::new(std::io::stdout().lock()), 0, None)
    } else {
        match std::fs::metadata(file) {
            // A device or a pipe: written in order, holes as zeroes (a device's old
            // contents must not show through; a pipe has no holes).
            Ok(meta) if !meta.is_file() => {
                let out = std::fs::OpenOptions::new()
                    .write(true)
                    .open(file)
                    .map_err(|e| fail("open", e))?;
                let sync = out.try_clone().ok();
                ExportSink::Stream(Box::new(out), 0, sync)
            }
            _ => {
                // Made here unless a name was there (a dangling link included: the
                // file made is its target, which removing the name would not remove).
                let existed = std::fs::symlink_metadata(file).is_ok();
                let out = std::fs::File::create(file).map_err(|e| fail("create", e))?;
                created = !existed;
                ExportSink::Sparse(out)
            }
        }
    };
    let result = export_to(&vol, name, file, &mut sink, progress);
    if result.is_err() && created {
        // Half an image is no image: a file this export made goes again.
        let _ = std::fs::remove_file(file);
    }
    result
}

/// The body of [`export`]: `vol`'s blocks into `sink`, and what to report.
fn export_to(
    vol: &Volume,
    name: &str,
    file: &Path,
    sink: &mut ExportSink,
    progress: &Progress<'_>,
) -> CliResult<Outcome> {
    let fail = |what: &str, e: std::io::Error| {
        CliError::failure(format!("{what} {}: {e}", file.display()))
    };
    if let ExportSink::Sparse(out) = sink {
        out.set_len(vol.size()).map_err(|e| fail("size", e))?;
    }
    let bar = progress.bar(Some(vol.size()), "exporting");
    // Adjacent blocks go out in one write of up to 1 MiB.
    let mut run: Vec<u8> = Vec::with_capacity(IMPORT_CHUNK_BYTES);
    let mut run_at = 0u64;
    let mut written = 0u64;
    let mut flush = |sink: &mut ExportSink, run: &mut Vec<u8>, at: u64| {
        sink.write_at(run, at).map_err(|e| {
            let what = format!("write {}: {e}", file.display());
            cambium::Error::Io(std::io::Error::new(e.kind(), what))
        })?;
        written += run.len() as u64;
        run.clear();
        Ok::<(), cambium::Error>(())
    };
    vol.for_each_block(|offset, block| {
        let adjacent = run_at + run.len() as u64 == offset;
        if !run.is_empty() && (!adjacent || run.len() >= IMPORT_CHUNK_BYTES) {
            flush(sink, &mut run, run_at)?;
        }
        if run.is_empty() {
            run_at = offset;
        }
        run.extend_from_slice(block);
        bar.set_position(offset);
        Ok(())
    })?;
    if !run.is_empty() {
        flush(sink, &mut run, run_at)?;
    }
    sink.finish(vol.size()).map_err(|e| fail("write", e))?;
    bar.finish_and_clear();
    let to = match &sink {
        ExportSink::Stream(..) if file == Path::new("-") => "stdout".to_owned(),
        _ => file.display().to_string(),
    };
    let text = format!(
        "exported volume {name} to {to}: {}, {} of data\n",
        human_bytes(vol.size()),
        human_bytes(written)
    );
    let json = serde_json::json!({"volume": name, "file": file, "size_bytes": vol.size(), "data_bytes": written});
    if file == Path::new("-") {
        // Stdout holds the image: the report goes to stderr.
        eprint!("{text}");
        return Ok(Outcome::nothing());
    }
    Outcome::new(text, json)
}

/// Where `volume export` writes: a regular file, sparse (only the blocks stored are
/// written); or a stream (stdout, a pipe, a device), written in order with holes as
/// zeroes, how far it has got, and the file to sync at the end (a device's).
enum ExportSink {
    Sparse(std::fs::File),
    Stream(Box<dyn std::io::Write>, u64, Option<std::fs::File>),
}

impl ExportSink {
    fn write_at(&mut self, data: &[u8], at: u64) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        match self {
            ExportSink::Sparse(f) => f.write_all_at(data, at),
            ExportSink::Stream(out, pos, _) => {
                write_zeroes(out, at - *pos)?;
                out.write_all(data)?;
                *pos = at + data.len() as u64;
                Ok(())
            }
        }
    }

    /// Ends the image at `size` and makes it durable where that means anything.
    fn finish(&mut self, size: u64) -> std::io::Result<()> {
        match self {
            ExportSink::Sparse(f) => f.sync_all(),
            ExportSink::Stream(out, pos, sync) => {
                write_zeroes(out, size - *pos)?;
                *pos = size;
                out.flush()?;
                match sync.as_ref().map(std::fs::File::sync_all) {
                    // A pipe or a character device has nothing to sync.
                    Some(Err(e)) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
                    Some(done) => done,
                    None => Ok(()),
                }
            }
        }
    }
}

/// Writes `n` zero bytes.
fn write_zeroes(out: &mut dyn std::io::Write, mut n: u64) -> std::io::Result<()> {
    let zeros = [0u8; 64 << 10];
    while n > 0 {
        let k = n.min(zeros.len() as u64) as usize;
        out.write_all(&zeros[..k])?;
        n -= k as u64;
    }
    Ok(())
}

/// Where a long volume command shows how far it has got: a bar on this process's
/// stderr (if it is a terminal), or, in the server, notices sent to the command's
/// process, which draws the bar there (`control::Answer::Progress`).
pub(super) enum Progress<'a> {
    Local,
    Remote(&'a super::ProgressNotice),
    Hidden,
}

impl<'a> Progress<'a> {
    fn of(ctx: &'a Ctx) -> Progress<'a> {
        match ctx.progress_notice() {
            _ if ctx.local => Progress::Local,
            Some(notice) => Progress::Remote(notice),
            None => Progress::Hidden,
        }
    }

    /// A bar for `what` ("importing"), of `total` bytes if known.
    fn bar(&self, total: Option<u64>, what: &'static str) -> Bar<'a> {
        match self {
            Progress::Local => Bar::Local(progress_bar(total, what)),
            Progress::Remote(notice) => {
                notice(what, 0, total);
                Bar::Remote {
                    notice,
                    what,
                    total,
                    sent: std::cell::Cell::new(Instant::now()),
                }
            }
            Progress::Hidden => Bar::Local(indicatif::ProgressBar::hidden()),
        }
    }
}

/// How often a server sends a command's process where its long work has got.
const PROGRESS_EVERY: Duration = Duration::from_millis(100);

/// One long piece of work's progress ([`Progress::bar`]).
pub(super) enum Bar<'a> {
    Local(indicatif::ProgressBar),
    Remote {
        notice: &'a super::ProgressNotice,
        what: &'static str,
        total: Option<u64>,
        sent: std::cell::Cell<Instant>,
    },
}

impl Bar<'_> {
    fn set_position(&self, done: u64) {
        match self {
            Bar::Local(bar) => bar.set_position(done),
            Bar::Remote {
                notice,
                what,
                total,
                sent,
            } => {
                let now = Instant::now();
                if now.duration_since(sent.get()) >= PROGRESS_EVERY {
                    sent.set(now);
                    notice(what, done, *total);
                }
            }
        }
    }

    /// The work is done: a local bar goes (the command's process clears a remote
    /// one when the answer comes).
    fn finish_and_clear(&self) {
        if let Bar::Local(bar) = self {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;

    /// An import run by the server (a `Ctx` that is not local) tells the command's
    /// process how far it has got, with the image's size, so that the command draws
    /// its bar as it would running alone; one run locally sends nothing.
    #[test]
    fn an_import_in_the_server_reports_its_progress() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::create(dir.path().join("store")).unwrap();
        let image = dir.path().join("image");
        let bytes: Vec<u8> = (0..3u32 << 20).map(|i| (i % 251) as u8 + 1).collect();
        std::fs::write(&image, &bytes).unwrap();
        let request = |name: &str| Request::VolumeImport {
            name: name.to_owned(),
            file: Some(image.to_str().unwrap().to_owned()),
            block_size: 4096,
            size_bytes: None,
        };
        let notices = Rc::new(RefCell::new(Vec::new()));
        let sink = notices.clone();
        let served = Ctx::new(false, false, false).on_progress(move |what, done, total| {
            sink.borrow_mut().push((what.to_owned(), done, total));
        });
        execute(&store, &request("served"), &mut std::io::empty(), &served).unwrap();
        let notices = notices.borrow();
        let size = bytes.len() as u64;
        assert_eq!(
            notices.first(),
            Some(&("importing".to_owned(), 0, Some(size)))
        );
        assert!(
            notices.iter().all(|(_, done, _)| *done <= size),
            "{notices:?}"
        );

        let local = Ctx::new(false, false, true).on_progress(|_, _, _| panic!("sent"));
        execute(&store, &request("local"), &mut std::io::empty(), &local).unwrap();
    }
}
