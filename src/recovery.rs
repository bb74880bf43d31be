//! Opening a store: creating the initial durable state of a new one, and recovering
//! the newest durable state of an existing one.
//!
//! Recovery: read both superblock slots; take the newest valid one whose metadata chain
//! reads back (else the other): its blobs from the newest back to the base, the deltas
//! then applied forward (`meta::chain`). Open every segment (header checked). Replay every WAL
//! generation from the superblock's `wal_gen` on, in order, each up to its torn tail
//! (or up to a record whose value extents did not reach the disk: [`replay_wal`]),
//! through the same write kernel as live commits (`engine::apply_record`). New commits
//! go to a fresh generation (a torn file is never appended to). A value extent a
//! replayed record names that its segment lost but a group commit logged in the WAL
//! (a values record) is put back first ([`LoggedValues`]).
//!
//! A writable open then fsyncs every log and segment file it read (what recovery read
//! may sit only in the OS cache after a process crash: nothing must be built on records
//! a later power loss could take back), deletes WAL generations that no superblock
//! needs, deletes the segments a previous process left pending that neither slot can
//! reach, and rewrites an invalid superblock slot with an immediate checkpoint.

use crate::backref::{BackrefStore, WriteStore};
use crate::btree::cache::PageCache;
use crate::catalog::Catalog;
use crate::checkpoint;
use crate::engine::{self, Durable, Lender, PendingDelete, Shared, ViewRegistry, WriterState};
use crate::error::{Error, Result};
use crate::format::{now_unix_ms, BlockRef, Lsn, SegmentId};
use crate::io::{LockKind, StoreLock, VFile, Vfs};
use crate::meta::{self, Chain, Meta, PendingSegment};
use crate::options::Options;
use crate::space::{Segments, SpaceDelta};
use crate::superblock::{self, Superblock, SuperblockFile};
use crate::sync::lock;
use crate::wal::{self, Generations, Wal};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Present while a store is being created: a creation cut short (a crash, a full
/// disk) is recognised by it and started over by the next `create`.
pub(crate) const INIT_MARKER: &str = "init-in-progress";

/// Where the superblock is written before it is renamed into place: a store exists
/// (its `superblock` does) only once it is complete.
const SUPERBLOCK_TMP: &str = "superblock.tmp";

/// Whether `name` is one of the files a store keeps (other than `LOCK`).
fn is_store_file(name: &str) -> bool {
    let between = |prefix: &str, suffix: &str| {
        name.len() > prefix.len() + suffix.len()
            && name.starts_with(prefix)
            && name.ends_with(suffix)
    };
    between("seg-", ".dat")
        || between("spare-", ".dat")
        || between("wal-", ".log")
        || between("backref-", ".run")
        || between("txn-", ".run")
        || [
            SUPERBLOCK_TMP,
            "reserve",
            "reserve.tmp",
            "subtree-totals",
            INIT_MARKER,
        ]
        .contains(&name)
}

/// Writes the durable state of an empty store (one empty branch, `main`) into `vfs`,
/// atomically: the superblock is renamed into place last, so an interrupted creation
/// leaves no store, only files that the next `create` recognises by
/// [`INIT_MARKER`] and removes. A failed creation removes what it wrote.
pub(crate) fn create(vfs: &Arc<dyn Vfs>, label: &str) -> Result<()> {
    // Checked before the lock too, so that a refusal leaves the directory as it was
    // (the lock creates `LOCK`); and again under it, against a racing `create`.
    check_creatable(&**vfs, label)?;
    let guard = take_writer_lock(&**vfs, None)?;
    // A `LOCK` left by an earlier store in this directory speaks of another log:
    // nothing of this one is durable yet.
    guard.publish_synced(0)?;
    // Durable before the superblock makes this a store: a power loss must not bring
    // the old record back under the new store's short log.
    if vfs.exists(crate::io::LOCK_FILE)? {
        vfs.open(crate::io::LOCK_FILE)?.sync()?;
    }
    let names = check_creatable(&**vfs, label)?;
    let interrupted = names.iter().any(|n| n == INIT_MARKER);
    let leftovers: Vec<&String> = names.iter().filter(|n| is_store_file(n)).collect();
    if !interrupted {
        vfs.create(INIT_MARKER)?;
        vfs.sync_dir()?;
    }
    let written = write_initial_state(vfs, &leftovers);
    if written.is_err() {
        // Leave the directory as it was (the marker goes last: until then a crash
        // leaves a creation the next `create` recognises).
        for name in vfs.list().unwrap_or_default() {
            if is_store_file(&name) && name != INIT_MARKER {
                let _ = vfs.remove(&name);
            }
        }
        let _ = vfs.remove(INIT_MARKER);
        let _ = vfs.sync_dir();
    }
    written
}

/// Refuses to create a store where one is, or where store files lie that no
/// interrupted creation explains; returns the directory's file names.
fn check_creatable(vfs: &dyn Vfs, label: &str) -> Result<Vec<String>> {
    if vfs.exists(superblock::FILE_NAME)? {
        return Err(Error::AlreadyExists(label.to_owned()));
    }
    let names = vfs.list()?;
    if !names.iter().any(|n| n == INIT_MARKER) {
        let leftovers: Vec<&String> = names.iter().filter(|n| is_store_file(n)).collect();
        if let Some(first) = leftovers.first() {
            return Err(Error::InvalidArgument(format!(
                "{label} holds store files ({first} and {} more) but no superblock: a \
                 damaged store, not an interrupted init; move them away to create a store here",
                leftovers.len() - 1
            )));
        }
    }
    Ok(names)
}

/// The body of [`create`]: removes an interrupted creation's `leftovers`, then writes
/// the first segment, the superblock (renamed into place) and drops the marker.
fn write_initial_state(vfs: &Arc<dyn Vfs>, leftovers: &[&String]) -> Result<()> {
    for name in leftovers {
        if name.as_str() != INIT_MARKER {
            vfs.remove(name)?;
        }
    }
    let segments = Segments::open(vfs.clone(), false)?;
    let meta = Meta {
        catalog: Catalog::initial(),
        ..Meta::default()
    };
    let meta_ref = segments.append(&meta::encode_base(&meta))?;
    segments.sync()?;
    let sb_file = vfs.create(SUPERBLOCK_TMP)?;
    let created = now_unix_ms();
    // Both slots valid from the start: generation 1 in slot 1, then 2 in slot 0.
    for generation in [1, 2] {
        let sb = Superblock {
            generation,
            checkpoint_lsn: Lsn(0),
            wal_gen: 1,
            meta: meta_ref,
            created_unix_ms: created,
        };
        SuperblockFile::write(&*sb_file, &sb)?;
    }
    vfs.rename(SUPERBLOCK_TMP, superblock::FILE_NAME)?;
    vfs.sync_dir()?;
    vfs.remove(INIT_MARKER)?;
    vfs.sync_dir()?;
    Ok(())
}

/// Opens the store in `vfs`: the newest durable state plus the WAL after it.
pub(crate) fn open(
    vfs: Arc<dyn Vfs>,
    dir: &Path,
    label: String,
    opts: Options,
) -> Result<Arc<Shared>> {
    // A directory that is not a store is left as it was: nothing (not even the lock
    // file) is created before its superblock is found.
    if !vfs.exists(superblock::FILE_NAME)? {
        return Err(Error::NotAStore(label));
    }
    if opts.read_only {
        return open_reader(vfs, dir, label, opts);
    }
    let lock: Arc<dyn StoreLock> = take_writer_lock(&*vfs, opts.lock_wait)?.into();
    // What the last writer published as durable (kept until this one publishes):
    // every record up to it was acknowledged, with its extents durable, so replay
    // checks none of them (a damaged extent there is corruption, reported when read,
    // not a reason to end the log), and a log ending before it was damaged.
    let published = vfs.published_synced().map(Lsn);
    settle(load(
        vfs,
        dir,
        label,
        opts,
        lock,
        Replay::Writer { published },
    )?)
}

/// A read-only open, beside a writer in another process or not. It opens every
/// segment (an open file stays readable after the writer deletes it), loads the
/// metadata and replays the log up to what the writer has published as durable,
/// starting over if a checkpoint landed meanwhile
/// ([`superblock::read_between_checkpoints`]).
fn open_reader(vfs: Arc<dyn Vfs>, dir: &Path, label: String, opts: Options) -> Result<Arc<Shared>> {
    let lock: Arc<dyn StoreLock> = vfs.lock(LockKind::Reader)?.into();
    let loaded = superblock::read_between_checkpoints(&*vfs, &label, || {
        // Read before the log: the bound only grows, and what it covers is durable.
        let bound = vfs.published_synced().map(Lsn);
        load(
            vfs.clone(),
            dir,
            label.clone(),
            opts.clone(),
            lock.clone(),
            Replay::Reader { bound },
        )
    })?;
    loaded.map(|l| l.shared)
}

/// Takes the writer lock, waiting up to `wait` for another process to let it go.
fn take_writer_lock(vfs: &dyn Vfs, wait: Option<Duration>) -> Result<Box<dyn StoreLock>> {
    let start = Instant::now();
    loop {
        match vfs.lock(LockKind::Writer) {
            Ok(lock) => return Ok(lock),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let waited = start.elapsed();
                match wait {
                    Some(w) if waited < w => {
                        std::thread::sleep((w - waited).min(Duration::from_millis(20)));
                    }
                    _ => {
                        return Err(Error::Locked {
                            pid: vfs.lock_holder(),
                        })
                    }
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Loads the newest durable state and replays the log after it (no further than
/// `bound`, if given) into a new `Shared`. Writes nothing.
fn load(
    vfs: Arc<dyn Vfs>,
    dir: &Path,
    label: String,
    opts: Options,
    process_lock: Arc<dyn StoreLock>,
    replay: Replay,
) -> Result<Loaded> {
    let sb_file = SuperblockFile::read(&*vfs, &label)?;
    let segments = Segments::open(vfs.clone(), opts.read_only)?;
    segments.set_zeros_ahead(opts.data_zeros_ahead);
    segments.set_log_small_values(opts.log_small_values);
    segments.set_data_checkpoint_bytes(opts.checkpoint_data_bytes);
    let (sb, meta, chain) = load_newest(&sb_file, &segments)?;
    let fallback = sb_file
        .candidates()?
        .into_iter()
        .find(|c| c.generation < sb.generation);
    let fallback_chain = fallback.map_or_else(Chain::default, |f| {
        fallback_chain(&segments, &chain, f.meta)
    });
    let manifest = &meta.backref_manifest;
    let backrefs = BackrefStore::open(&segments, (!manifest.is_empty()).then_some(manifest))?;
    let run_segments = backrefs.segments();
    let fallback_run_segments = fallback.map_or_else(Vec::new, |_| {
        fallback_run_segments(&segments, &fallback_chain)
    });
    let cache = PageCache::new(opts.cache_bytes);
    let mut writer = WriterState {
        catalog: meta.catalog.clone(),
        epoch: 1,
        delta: SpaceDelta::default(),
        superseded: Vec::new(),
        refs: crate::btree::refcount::RefCounts::from_table(
            meta.refcounts.iter().map(|(a, c)| (*a, *c)),
        ),
        drop_queue: meta.drop_queue.clone(),
        last_lsn: sb.checkpoint_lsn,
        dirty_bytes: 0,
        backrefs: WriteStore::default(),
        unshared: Vec::new(),
        unshared_overflowed: false,
    };
    let loader = crate::btree::Loader {
        cache: &cache,
        segments: &segments,
    };
    let replayed = replay_wal(&*vfs, &sb, &mut writer, loader, replay)?;
    let cut = replayed.cut;
    let wal = Wal::new(
        vfs.clone(),
        process_lock.clone(),
        replayed.next_gen,
        writer.last_lsn,
        replayed.bytes,
    );
    let views = Arc::new(ViewRegistry::default());
    let view = Arc::new(engine::View::new(
        writer.last_lsn,
        &writer.catalog,
        views.clone(),
    ));
    let needs_heal = sb_file.has_invalid_slot();
    let durable_generation = sb.generation;
    // Deletions a previous process left pending (of segments still there).
    let existing: Vec<_> = segments.sizes()?.into_iter().map(|(id, _)| id).collect();
    let mut pending: Vec<PendingDelete> = meta
        .pending_deletes
        .iter()
        .filter(|p| existing.contains(&p.segment))
        .map(|p| PendingDelete::loaded(*p))
        .collect();
    // A segment the deletion vector names whose file is still there: an earlier
    // build named a segment there before its removal was durable, and a power loss
    // brought the file back. Empty, it is deleted again (and takes no appends until
    // then); holding live blocks (that build let it take appends again), it leaves
    // the vector, so that edges into it recorded from now on count. (The edges that
    // build already dropped stay missing: `verify` reports them, and the cleaner,
    // finding fewer parents than a block's count, plans its move from a walk.)
    let mut backrefs = backrefs;
    for segment in backrefs.deleted_segments().collect::<Vec<_>>() {
        if !existing.contains(&segment) || pending.iter().any(|p| p.segment == segment) {
            continue;
        }
        let live = meta.usage.get(&segment).copied().unwrap_or(0) > 0
            || writer.delta.per_segment.contains_key(&segment);
        if !live {
            pending.push(PendingDelete::loaded(PendingSegment {
                segment,
                generation: 0,
            }));
        } else {
            backrefs.undelete_segment(segment);
        }
    }
    // A segment waiting to be deleted must not take appends again.
    segments.do_not_resume(pending.iter().map(|p| p.segment));
    let durable = Durable {
        sb,
        fallback,
        sb_file: sb_file.file.clone(),
        meta,
        chain,
        fallback_chain,
        run_segments,
        fallback_run_segments,
        recorded_from_mem: Vec::new(),
        meta_bytes_last: 0,
        carried: None,
    };
    let shared = Arc::new(Shared {
        label,
        path: dir.to_path_buf(),
        opts,
        vfs,
        segments,
        backrefs: Mutex::new(backrefs),
        compact_backrefs: AtomicBool::new(false),
        cleaning: Mutex::new(()),
        making_room: Mutex::new(()),
        subtree_totals: Mutex::new(crate::format::AddrMap::default()),
        cache,
        wal,
        writer: Mutex::new(writer),
        lender: Lender::default(),
        durable: Mutex::new(durable),
        published: RwLock::new(view),
        views,
        pending_deletes: Mutex::new(pending),
        poisoned: Mutex::new(None),
        background: Arc::default(),
        durable_generation: AtomicU64::new(durable_generation),
        carried_dirty_bytes: AtomicU64::new(0),
        bg_thread: Mutex::new(None),
        closed: Mutex::new(false),
        _process_lock: process_lock,
    });
    Ok(Loaded {
        shared,
        replayed: replayed.files,
        cut,
        needs_heal,
    })
}

/// A loaded store, and what a writable open still has to settle.
struct Loaded {
    shared: Arc<Shared>,
    /// The log files read, to be fsynced before new commits build on them.
    replayed: Vec<Arc<dyn VFile>>,
    /// Records replay dropped, to erase before anything new is logged.
    cut: Option<Cut>,
    /// A superblock slot is invalid: rewrite it now.
    needs_heal: bool,
}

/// A writable open's work after replay: make what was read durable, publish it to
/// readers, drop the log no superblock needs, and rewrite an invalid superblock slot.
fn settle(loaded: Loaded) -> Result<Arc<Shared>> {
    let Loaded {
        shared,
        replayed,
        cut,
        needs_heal,
    } = loaded;
    if let Some(cut) = cut {
        cut.apply(&*shared.vfs)?;
    }
    for file in replayed {
        file.sync()?;
    }
    // Run files of an older layout (runs are blobs in the segments now): nothing
    // reads them, and they would only take space.
    for name in shared.vfs.list()? {
        if crate::backref::is_run_file_name(&name) {
            shared.vfs.remove(&name)?;
        }
    }
    if shared.vfs.exists(INIT_MARKER)? {
        // A creation cut short after its superblock was in place: it is complete.
        shared.vfs.remove(INIT_MARKER)?;
    }
    // The extents the replayed records name are durable before the lock file says
    // those records are (an open trusts records up to the published LSN without
    // checking their extents).
    shared.segments.sync_all()?;
    let first_live = {
        let d = lock(&shared.durable);
        // The superblock this open trusts may be one a killed process wrote and never
        // synced: durable before anything the other slot needs is deleted below, and
        // before the lock file says what it holds is durable.
        d.sb_file.sync()?;
        d.fallback
            .map_or(d.sb.wal_gen, |f| f.wal_gen.min(d.sb.wal_gen))
    };
    shared
        ._process_lock
        .publish_synced(shared.wal.last_lsn().0)?;
    wal::remove_below(&*shared.vfs, first_live)?;
    // Segments a previous process emptied and neither slot can reach any more (no
    // view of this process is older than the durable state): their space comes back
    // now; the others wait for a later checkpoint, as in a running store.
    checkpoint::delete_unreachable_segments(&shared);
    if needs_heal {
        // A torn or corrupt slot is rewritten by the next checkpoint (it is the slot
        // the next generation goes to); do it now.
        checkpoint::run(&shared, None)?;
    }
    Ok(shared)
}

/// Loads the newest superblock whose metadata chain reads back; falls back to the
/// other slot.
fn load_newest(sb_file: &SuperblockFile, segments: &Segments) -> Result<(Superblock, Meta, Chain)> {
    let mut last_err = None;
    for sb in sb_file.candidates()? {
        match meta::chain::load(segments, sb.meta) {
            Ok((meta, chain)) => return Ok((sb, meta, chain)),
            Err(e) => last_err = Some(e),
        }
    }
    Err(last_err.unwrap_or_else(|| Error::corrupted("superblock", "no valid slot")))
}

/// The blobs of the fallback superblock's chain, whose segments are kept as long as
/// it is the fallback. Usually a prefix of the newest chain; otherwise read (a chain
/// that does not read back protects only its newest blob: recovery could not use it).
fn fallback_chain(segments: &Segments, newest: &Chain, tip: BlockRef) -> Chain {
    newest.prefix_to(tip).unwrap_or_else(|| {
        meta::chain::load(segments, tip).map_or_else(|_| Chain::of_base(tip), |(_, c)| c)
    })
}

/// The segments holding the runs the fallback superblock's back-reference manifest
/// names, kept as long as it is the fallback. Empty when its metadata does not read
/// back (recovery could not use that slot either).
fn fallback_run_segments(segments: &Segments, fallback: &Chain) -> Vec<SegmentId> {
    meta::chain::backref_manifest(segments, fallback)
        .ok()
        .filter(|m| !m.is_empty())
        .and_then(|m| crate::backref::run_segments(&m).ok())
        .unwrap_or_default()
}

/// Who replays the log, and what is known acknowledged.
#[derive(Clone, Copy)]
enum Replay {
    /// A writable open; `published` is what the last writer published as durable.
    Writer { published: Option<Lsn> },
    /// A read-only open: replays up to `bound`, the writer's published LSN (every
    /// valid record when none is published).
    Reader { bound: Option<Lsn> },
}

struct Replayed {
    next_gen: u64,
    bytes: u64,
    /// The log files read, to be fsynced before new commits build on them.
    files: Vec<Arc<dyn VFile>>,
    /// Where the log ends short of its last valid record, for a writable open to
    /// make permanent.
    cut: Option<Cut>,
}

/// Replays WAL generations from the superblock's on, in order, into `w`.
///
/// A group commit syncs its records and the value extents they name at the same
/// time (`wal::Wal::sync_to`), so after a crash a record may be durable while an
/// extent it names is not. Such a record was never acknowledged: the group's
/// committers return only once both syncs have. So the log ends before the first
/// record that names an extent which does not read back whole (its checksum, its
/// segment's length), as it ends before a torn record. Only records no later record
/// says were synced need the check, those of the last group or two: a record's
/// `synced_lsn` says every record up to it, extents included, was durable before it
/// was written.
fn replay_wal(
    vfs: &dyn Vfs,
    sb: &Superblock,
    w: &mut WriterState,
    loader: crate::btree::Loader<'_>,
    replay: Replay,
) -> Result<Replayed> {
    let generations: Vec<wal::Generation> =
        Generations::read(vfs, sb.wal_gen, w.last_lsn)?.collect::<Result<_>>()?;
    let (bound, published) = match replay {
        Replay::Writer { published } => (None, published),
        Replay::Reader { bound } => (bound, bound),
    };
    let acknowledged = generations
        .iter()
        .map(|g| g.synced_through)
        .chain(published)
        .fold(w.last_lsn, Lsn::max);
    let logged_values = LoggedValues::read(&generations)?;
    let mut next_gen = sb.wal_gen;
    let mut bytes = 0;
    let mut files = Vec::new();
    let mut cut = None;
    'generations: for (i, generation) in generations.iter().enumerate() {
        next_gen = generation.gen + 1;
        files.push(generation.file.clone());
        for logged in &generation.records {
            if bound.is_some_and(|b| logged.lsn > b) {
                break;
            }
            let record = logged.record()?;
            logged_values.restore(loader.segments, &record)?;
            if logged.lsn > acknowledged && !extents_durable(loader.segments, &record)? {
                bytes += logged.offset;
                cut = Some(Cut {
                    file: generation.file.clone(),
                    from: logged.offset,
                    to: generation.valid_bytes,
                    later: generations[i + 1..].iter().map(|g| g.gen).collect(),
                });
                break 'generations;
            }
            engine::apply_record(w, loader, &record, logged.lsn)?;
            w.last_lsn = logged.lsn;
        }
        bytes += generation.valid_bytes;
    }
    // Every record up to `acknowledged` was durable once (a later record or the lock
    // file says so, and neither is written before that sync returns), so a log that
    // ends short of it lost acknowledged commits: a file cut short or removed from
    // outside. Replaying what is left would quietly open an older state and, at the
    // next checkpoint, make the loss permanent. A read-only open needs the records up
    // to its bound only.
    let required = bound.map_or(acknowledged, |b| b.min(acknowledged));
    if w.last_lsn < required {
        return Err(Error::corrupted(
            "wal",
            format!(
                "the log ends at LSN {}, but every record up to LSN {} was durable (the \
                 lock file or a later record says so): a log file was cut short or removed \
                 (if the store's files were put back from a copy without their LOCK file, \
                 remove LOCK to open what they hold)",
                w.last_lsn.0, required.0
            ),
        ));
    }
    Ok(Replayed {
        next_gen,
        bytes,
        files,
        cut,
    })
}

/// The value bytes group commits logged in place of syncing their data segment
/// (`wal::Wal::sync_to`, the values records of every generation read), by where
/// they were written: a record acknowledged through such a group may name an extent
/// whose segment lost it in a power failure, and recovery puts it back from here
/// before replaying the record.
struct LoggedValues<'g> {
    /// Each logged write's bytes, by its first byte's address.
    writes: std::collections::BTreeMap<crate::format::Addr, &'g [u8]>,
}

impl<'g> LoggedValues<'g> {
    fn read(generations: &'g [wal::Generation]) -> Result<LoggedValues<'g>> {
        let mut writes = std::collections::BTreeMap::new();
        for logged in generations.iter().flat_map(|g| &g.values) {
            let entries = wal::decode_values(&logged.payload).map_err(|e| match e {
                Error::Corrupted { what, detail } => Error::Corrupted {
                    what,
                    detail: format!("values record after LSN {}: {detail}", logged.lsn.0),
                },
                e => e,
            })?;
            writes.extend(entries);
        }
        Ok(LoggedValues { writes })
    }

    /// The logged bytes of `extent`, if a logged write holds them whole and they
    /// match its checksum.
    fn find(&self, extent: BlockRef) -> Option<&'g [u8]> {
        let (start, bytes) = self.writes.range(..=extent.addr).next_back()?;
        if start.segment() != extent.addr.segment() {
            return None;
        }
        let from = usize::try_from(extent.addr.offset() - start.offset()).ok()?;
        let found = bytes.get(from..from.checked_add(extent.len as usize)?)?;
        (crate::format::crc(found) == extent.crc).then_some(found)
    }

    /// Puts back every value extent `record` names that its segment does not hold
    /// whole but the log does ([`Segments::restore`]). An extent in a segment that
    /// is not there is left to [`extents_durable`] (or to the read) to report.
    fn restore(&self, segments: &Segments, record: &wal::Record<'_>) -> Result<()> {
        let wal::Record::Batch(batch) = record else {
            return Ok(());
        };
        if self.writes.is_empty() {
            return Ok(());
        }
        for op in batch.ops() {
            let wal::Op::PutExtent { extent, .. } = op? else {
                continue;
            };
            let Some(bytes) = self.find(extent) else {
                continue;
            };
            if !segments.contains(extent.addr.segment()) {
                continue;
            }
            match segments.read(extent, "value extent") {
                Ok(_) => {}
                Err(e) if e.is_corruption() => segments.restore(extent, bytes)?,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// Whether every value extent `record` names reads back with its checksum. An
/// extent that does not (a checksum mismatch, past its segment's end) is `false`.
/// An extent in a segment that is not there, or is a stray, is corruption: a data
/// segment's file and header are durable before anything is appended to it. An I/O
/// error is an error.
fn extents_durable(segments: &Segments, record: &wal::Record<'_>) -> Result<bool> {
    let wal::Record::Batch(batch) = record else {
        return Ok(true);
    };
    for op in batch.ops() {
        if let wal::Op::PutExtent { extent, .. } = op? {
            if !segments.contains(extent.addr.segment()) {
                return Err(Error::corrupted(
                    "wal",
                    format!(
                        "a record names an extent in segment {}, which is missing or not a segment of this store",
                        extent.addr.segment().file_name()
                    ),
                ));
            }
            match segments.read(extent, "value extent") {
                Ok(_) => {}
                Err(Error::Corrupted { .. }) => return Ok(false),
                Err(e) => return Err(e),
            }
        }
    }
    Ok(true)
}

/// The end of the log moved back to a record whose extents were not durable
/// ([`replay_wal`]). The records from there on are still valid in their file, and
/// later generations may follow: a writable open erases them before it logs
/// anything, or a later recovery would read them again, past what this one
/// replayed, or find the new records' LSNs repeating theirs.
struct Cut {
    file: Arc<dyn VFile>,
    /// The first record dropped, and the end of the file's valid records.
    from: u64,
    to: u64,
    /// Generations after the file's, whose records were all dropped.
    later: Vec<u64>,
}

impl Cut {
    /// Later generations go first: cut short between the two steps, the next open
    /// finds the same record to cut, where zeroes first would leave the file ending
    /// before later generations' records (a gap, which reads as corruption).
    fn apply(&self, vfs: &dyn Vfs) -> Result<()> {
        for gen in &self.later {
            vfs.remove(&wal::file_name(*gen))?;
        }
        if !self.later.is_empty() {
            vfs.sync_dir()?;
        }
        let zeros = vec![0u8; 1 << 20];
        let mut at = self.from;
        while at < self.to {
            let n = (self.to - at).min(zeros.len() as u64);
            self.file.write_all_at(&zeros[..n as usize], at)?;
            at += n;
        }
        self.file.sync()?;
        Ok(())
    }
}
