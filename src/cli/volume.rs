//! The volume commands: `volume create|list|snapshot|clone|drop|resize|import|export`.
//!
//! Each runs in this process on the store, or, while `cambium serve` holds the
//! store, in the server, over its control socket (`control.rs`), so that a volume
//! made or snapshotted while serving is exported at once.

use super::codec::human_bytes;
use super::control::{Outcome, Request};
use super::error::{CliError, CliResult};
use cambium::volume::{Volume, VolumeInfo};
use cambium::{Durability, Store};
use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

/// Bytes an import reads and writes per transaction.
const IMPORT_CHUNK_BYTES: usize = 1 << 20;

/// Runs a volume request on an open store (see `requests::execute`).
pub fn execute(store: &Store, request: &Request) -> CliResult<Outcome> {
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
            Outcome::new(
                format!(
                    "created snapshot {name} of volume {volume} in {} (durable in {})\n",
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
fn import(store: &Store, name: &str, file: &Path, block_size: u32) -> CliResult<Outcome> {
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
    if let Err(e) = copy_in(&vol, &mut input, len, file, &bar) {
        // Half an image is no image: the new volume goes again (best effort; a
        // failure to drop it leaves a volume the user can drop by name).
        let _ = Volume::drop_volume(store, name);
        return Err(e);
    }
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

/// Writes `len` bytes of `input` into the new volume `vol`, skipping zero chunks, and
/// makes them durable.
fn copy_in(
    vol: &Volume,
    input: &mut std::fs::File,
    len: u64,
    file: &Path,
    bar: &indicatif::ProgressBar,
) -> CliResult {
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
    Ok(vol.sync()?)
}

/// `volume export`: the volume into a sparse raw file (holes are not written).
fn export(store: &Store, name: &str, file: &Path) -> CliResult<Outcome> {
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
