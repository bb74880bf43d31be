//! The cleaner: moves the live blocks out of chosen segments so that the segments
//! empty and can be deleted, keeping every version's data and its sharing exactly as
//! they were. `defrag` and `shrink` are the same relocation with other choices of what
//! to move.
//!
//! Relocation (Backlog §5's use of back references; Rodeh §5 for why sharing is kept):
//! to move a block, every parent that points at it must be rewritten, and so must
//! their parents, up to the version roots. The set rewritten is the *closure* of the
//! moved blocks: every node on a path from a root to a moved block. Each node in it
//! gets exactly one copy, and every copied parent points at the copies of its
//! children, so a node shared by many parents (versions) stays shared by their copies:
//! its reference count simply moves from the old address to the copy. Nodes outside
//! the closure keep their addresses, and the copies' encoded sizes equal the
//! originals', so every version's referenced and exclusive bytes are unchanged.
//!
//! Protocol. First, without the writer lock, the value extents of the round's
//! segments are copied to the end of the store and synced, and the nodes the round
//! will copy are read into the cache (`read_ahead`): that is most of a round's I/O,
//! and commits go on meanwhile.
//! Then, under the writer lock, so no commit can interleave with a half-made
//! relocation (readers go on):
//! 1. finish the drop queue and checkpoint (or, with nothing to write, fold the last
//!    checkpoint's counts, which it may have left in memory): every node is now
//!    written and its count is in the table by address, so the only parents are
//!    written nodes and roots, and the back references are exact;
//! 2. find the closure upwards through the back references (`crate::backref`), walk
//!    each version only through it, post-order, and build the copies (dirty nodes;
//!    moved value extents take their copy made ahead, if its length and checksum are
//!    the pointer's, or are copied at once), moving reference counts, freeing the
//!    old addresses in the interval's space delta and ending their back references;
//!    before anything is applied, check that every moved block had as many pointers
//!    rewritten as its count says (else rebuild the plan from a walk of every version);
//! 3. commit by checkpoint, like a large transaction (the LSN advances, so reader
//!    views taken before the move keep the victims alive until they end): the copies
//!    are written, the victims' live bytes drop to zero, and they are deleted once no
//!    superblock slot and no view can reach them.
//!
//! No content is logged: relocation does not change any version's content, so a
//! crash before step 3's superblock simply leaves the old (still valid) addresses in
//! use, and the copies written so far are dead bytes. The relocation's LSN has a
//! record of its own (`Record::Relocation`, which replay skips) only so that version
//! operations lent during its checkpoint, logged after it, replay in order.
//!
//! One run of the cleaner, `defrag` or `shrink` at a time (`Shared::cleaning`;
//! automatic cleaning skips its turn): each counts on the extents it copied ahead
//! lying in a segment the other would see as dead bytes, free to clean and delete.

use crate::backref::{WriteStore, MAX_RUNS};
use crate::btree::end_backrefs;
use crate::btree::node::{Body, Child, Node, ValueRef, NODE_MAGIC};
use crate::btree::refcount::{CountTable, RcDelta, Target};
use crate::btree::walk::{walk, At, ReadAhead, Visitor};
use crate::checkpoint;
use crate::engine::{drop_step, LendingGuard, Shared, WriterState};
use crate::error::{Error, Result};
use crate::format::{crc, Addr, AddrMap, BlockRef, SegmentId};
use crate::space::{SpaceDelta, SEGMENT_HEADER_SIZE};
use crate::sync::lock;
use crate::wal::Record;
use serde::Serialize;
use std::collections::HashSet;
use std::ops::Range;
use std::sync::Arc;

/// Plans of a relocation round abandoned to serve a version operation (`relocate`)
/// before one is finished whatever waits.
const MAX_ABANDONED_PLANS: u32 = 4;

/// Live bytes moved per relocation round at most: the copies are dirty nodes in
/// memory until the round's checkpoint writes them.
const ROUND_BYTES: u64 = 16 << 20;

/// Live bytes moved per round by `shrink`: as much as the writer may hold dirty
/// (`Options::checkpoint_dirty_bytes`, an eighth of memory by default), at least
/// [`ROUND_BYTES`]. A round rewrites every node on the paths to the blocks it moves,
/// and blocks in address order belong to keys all over the tree: in 16 MiB rounds a
/// store of 55 MiB live, its values spread over its segments, had its leaves
/// rewritten by every round, so that a shrink moved 199 MiB and left 20% of the
/// segments dead for the next shrink to move again (in one round: 55 MiB moved,
/// 1% left dead, a second shrink moved nothing). The price is the writer lock, held
/// for the round's plan and checkpoint: a shrink beside a server pauses its writes
/// for longer rounds than the background cleaner's.
fn shrink_round_bytes(shared: &Shared) -> u64 {
    shared.opts.checkpoint_dirty_bytes.max(ROUND_BYTES)
}

/// The extents copied ahead of a relocation are appended in buffers of about this
/// size.
const AHEAD_CHUNK_BYTES: usize = 4 << 20;

/// `shrink` (and automatic cleaning) moves a segment only when at least 1 / this of
/// it is dead. Moving blocks rewrites their parents, so the segment taking the
/// copies always holds a little dead metadata afterwards; moving all of it again to
/// save that little made every shrink rewrite the whole store, three times (a
/// second shrink must move nothing). The footprint stays within this fraction of
/// the live data.
const SHRINK_MIN_DEAD_RATIO: u64 = 64;

/// `shrink` repeats the cleaner at most this many times (see there).
const SHRINK_PASSES: usize = 3;

/// Automatic cleaning starts only past this many dead bytes: below it, the space is
/// not worth the moves.
const AUTO_CLEAN_MIN_DEAD: u64 = 16 << 20;

/// Automatic cleaning moves at most this much per run, so that no single checkpoint
/// or close pays for a whole store's worth of cleaning.
const AUTO_CLEAN_MAX_MOVED: u64 = 128 << 20;

/// What one run of the cleaner, `defrag` or `shrink` did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CleanReport {
    /// Segments emptied by moving their live blocks elsewhere.
    pub segments_cleaned: u64,
    /// Segment files deleted (cleaned ones, and ones that were already empty).
    pub segments_deleted: u64,
    /// Bytes of live blocks copied (nodes and value extents).
    pub bytes_moved: u64,
    /// Bytes of segment files given back to the file system.
    pub bytes_freed: u64,
    /// Blocks copied: nodes in the closure of the moved blocks, plus value extents.
    pub blocks_moved: u64,
    /// Bytes of the store's files before.
    pub footprint_before: u64,
    /// Bytes of the store's files after.
    pub footprint_after: u64,
}

/// One segment as the cleaner sees it.
#[derive(Debug, Clone, Copy)]
struct SegmentUse {
    id: SegmentId,
    /// File size, header included.
    size: u64,
    live: u64,
}

impl SegmentUse {
    fn dead(&self) -> u64 {
        self.size
            .saturating_sub(SEGMENT_HEADER_SIZE)
            .saturating_sub(self.live)
    }
}

/// Runs the cleaner until dead bytes are below `dead_below` (a fraction, 0.0 to 1.0)
/// of the segment bytes, or nothing worth moving is left. `progress` is called with
/// the bytes moved so far and the bytes to move.
pub(crate) fn clean(
    shared: &Shared,
    dead_below: f64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<CleanReport> {
    let _one_at_a_time = lock(&shared.cleaning);
    let footprint_before = footprint(shared)?;
    // Asked for, the space it frees is given back, not kept as spare files (first,
    // so that a disk short of space has their room for the moves; and after, for
    // the segments it emptied). The first ones' bytes count as freed (emptied
    // segments' files); the others' were counted when their segments went.
    let spares_before = shared.segments.discard_spares()?;
    let mut report = clean_at_most(shared, dead_below, u64::MAX, None, ROUND_BYTES, progress)?;
    shared.segments.discard_spares()?;
    report.footprint_before = footprint_before;
    report.bytes_freed += spares_before;
    report.footprint_after = footprint(shared)?;
    Ok(report)
}

/// Cleans when [`crate::options::Options::auto_clean_dead_percent`] says it is due: dead bytes
/// past the threshold (and past `AUTO_CLEAN_MIN_DEAD`), down to half the threshold,
/// moving at most `AUTO_CLEAN_MAX_MOVED`. Returns whether it cleaned.
///
/// On a disk short of space it is due sooner: once the dead bytes are more than the
/// disk has left ([`Segments::room`]), down to half of what it has left. Writes that
/// kill blocks scattered over many segments (a volume overwritten by a client that
/// writes several regions at once) leave every segment partly dead, below the
/// threshold, and the disk would fill with dead bytes no checkpoint gives back.
pub(crate) fn auto_clean(shared: &Shared) -> Result<bool> {
    let Some(percent) = shared.opts.auto_clean_dead_percent else {
        return Ok(false);
    };
    // Another run (a user's `clean`, `defrag` or `shrink`) is at it already.
    let Ok(_one_at_a_time) = shared.cleaning.try_lock() else {
        return Ok(false);
    };
    // Its moves end in checkpoints, which would fail (and poison the store) on a
    // disk without room for their metadata: put off, as such checkpoints are.
    if !checkpoint::has_room(shared) {
        return Ok(false);
    }
    let segments = segment_uses(shared)?;
    let total: u64 = segments.iter().map(|s| s.size).sum();
    let dead: u64 = segments.iter().map(SegmentUse::dead).sum();
    #[expect(clippy::cast_precision_loss, reason = "a percentage")]
    let dead_percent = dead as f64 * 100.0 / total.max(1) as f64;
    let room = shared.segments.room().unwrap_or(u64::MAX);
    let short = dead > room;
    if dead < AUTO_CLEAN_MIN_DEAD || (dead_percent <= percent && !short) {
        return Ok(false);
    }
    #[expect(clippy::cast_precision_loss, reason = "a fraction")]
    let dead_below = match short {
        true => (room / 2) as f64 / total.max(1) as f64,
        false => 1.0,
    };
    clean_at_most(
        shared,
        (percent / 200.0).min(dead_below),
        AUTO_CLEAN_MAX_MOVED,
        Some(SHRINK_MIN_DEAD_RATIO),
        ROUND_BYTES,
        &mut |_, _| {},
    )?;
    Ok(true)
}

/// After a drop's space came back (its nodes freed, the segments it emptied
/// deleted): cleans the segments it left at least half dead, moving at most
/// `AUTO_CLEAN_MAX_MOVED`. A dropped volume whose blocks shared segments with other
/// volumes' (written at the same time) leaves them partly dead, which the
/// store-wide threshold of [`auto_clean`] may never reach; moving a segment at least
/// half dead costs at most the space it gives back.
pub(crate) fn clean_after_drop(shared: &Shared) -> Result<()> {
    // After any cleaner at it now (the background thread's): it may have cleaned
    // something else, not these.
    let _one_at_a_time = lock(&shared.cleaning);
    let _allowed = crate::io::allow_reserve();
    clean_at_most(
        shared,
        0.0,
        AUTO_CLEAN_MAX_MOVED,
        Some(HALF_DEAD),
        ROUND_BYTES,
        &mut |_, _| {},
    )?;
    Ok(())
}

/// `min_dead_ratio` for segments at least half dead.
const HALF_DEAD: u64 = 2;

/// [`clean`], stopping after the round that passes `max_moved` live bytes. On a disk
/// short of space it cleans only segments whose live bytes fit, together, in what
/// the disk has left (and, on a thread that may use the reserve, the part of it a
/// checkpoint does not need): a segment moved in part frees nothing, and the moves
/// would fill the disk.
fn clean_at_most(
    shared: &Shared,
    dead_below: f64,
    max_moved: u64,
    min_dead_ratio: Option<u64>,
    round_bytes: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<CleanReport> {
    let mut report = CleanReport {
        footprint_before: footprint(shared)?,
        ..CleanReport::default()
    };
    let before = shared.segments.sizes()?;
    shared.segments.seal_unless_newest();
    // Segments already empty go first: they need no move, only a durable checkpoint.
    settle_deletions(shared)?;
    let fit = shared.segments.room().map_or(u64::MAX, |room| {
        let total = before.iter().map(|(_, n)| n).sum();
        match crate::io::reserve_allowed_here() {
            true => room.saturating_add(crate::io::reserve_for(total) / 2),
            false => room,
        }
    });
    let victims = choose_victims(shared, dead_below, fit, min_dead_ratio)?;
    let total: u64 = victims.iter().map(|s| s.live).sum();
    let mut moved = 0;
    for victim in &victims {
        // The copies must go elsewhere, and new appends too.
        shared.segments.seal_if_active(victim.id);
    }
    for round in rounds(&victims, round_bytes) {
        let ranges: Vec<Range<Addr>> = round.iter().map(|p| p.range.clone()).collect();
        compact_ahead(shared, &round)?;
        let ahead = read_ahead(shared, &ranges)?;
        let done = relocate(shared, &Victims::Ranges(ranges), ahead)?;
        report.blocks_moved += done.blocks;
        report.bytes_moved += done.bytes;
        report.segments_cleaned += round.iter().filter(|p| p.last).count() as u64;
        moved += round.iter().map(|p| p.live).sum::<u64>();
        progress(moved, total);
        if moved >= max_moved {
            break;
        }
    }
    settle_deletions(shared)?;
    finish_report(shared, &mut report, &before)?;
    Ok(report)
}

/// Rewrites the nodes of `version` (every version when `None`) in key order, so that
/// scans read them sequentially. Sharing with other versions is kept: a node shared
/// with another version is moved once, for all of them.
pub(crate) fn defrag(shared: &Shared, version: Option<&str>) -> Result<CleanReport> {
    let _one_at_a_time = lock(&shared.cleaning);
    let mut report = CleanReport {
        footprint_before: footprint(shared)?,
        ..CleanReport::default()
    };
    let before = shared.segments.sizes()?;
    settle_deletions(shared)?;
    // Copies go to a fresh segment (so they lie together) and to those after it;
    // they are never moved again, so a node shared by several versions moves once.
    shared.segments.seal();
    let first_new = shared.segments.newest();
    let names: Vec<String> = match version {
        Some(name) => vec![name.to_string()],
        None => {
            let w = shared.lock_writer_checked()?;
            w.catalog
                .versions
                .iter()
                .map(|v| v.name.to_string())
                .collect()
        }
    };
    for name in names {
        // Which leaves to move: every written leaf reachable from the version, in key
        // order, as of a settled state (every node written). Branches move as the
        // leaves' parents.
        //
        // Only the settle and the taking of the root hold the writer lock: the walk
        // reads every node of the tree, tens of milliseconds for a large one, and
        // commits and snapshots must not wait for it. (Lending the lock during the walk
        // would serve snapshots but never commits, which are not lent.) Walking
        // without the lock is safe because what it reads cannot change under it:
        // - every node the root reaches is written, and a written node is never
        //   changed in place (`btree::write` edits only unwritten nodes of the current
        //   epoch; anything else is copied first); the root itself is our own clone;
        // - its blocks stay readable at their addresses: addresses are never reused
        //   (segments are only appended to, and ids are never reused), and `hold`, a
        //   view registered at this state's LSN, keeps every segment this state
        //   reaches from being deleted (`engine::view`): whatever frees one of these
        //   nodes later (a commit, a drop) has a later LSN, and so has the checkpoint
        //   that empties its segment, whose deletion waits for older views.
        // The list may be stale by the time a round uses it, as it always could be
        // between rounds: `relocate` settles again under the writer lock and walks
        // the versions as they are then, so a listed leaf that was rewritten or freed
        // meanwhile is reached by no version and simply not moved (`Victims::picks`
        // picks by address, only among the nodes that walk reaches).
        let (hold, root) = {
            let mut w = shared.lock_writer_lending()?;
            settle(shared, &mut w, false)?;
            let Some(v) = w.catalog.by_name(&name) else {
                if version.is_some() {
                    return Err(Error::VersionNotFound(name));
                }
                continue; // dropped meanwhile
            };
            (shared.hold_space(&w), v.root.clone())
        };
        let mut leaves = Leaves::default();
        if let Some(root) = &root {
            walk(&mut ReadAhead(shared.loader()), root, &mut leaves)?;
        }
        // The relocation's own settle and walk need no old state kept: let the
        // segments this one reached go as soon as nothing else reaches them.
        drop(hold);
        let leaves = leaves.in_order;
        // In rounds of about `ROUND_BYTES`, key range after key range: each round's
        // checkpoint writes its copies in key order, after the previous round's.
        for chunk in chunks_of_bytes(&leaves, ROUND_BYTES) {
            let done = relocate(
                shared,
                &Victims::Nodes {
                    nodes: chunk.iter().map(|r| r.addr).collect(),
                    below: first_new,
                },
                AddrMap::default(),
            )?;
            report.blocks_moved += done.blocks;
            report.bytes_moved += done.bytes;
        }
    }
    settle_deletions(shared)?;
    finish_report(shared, &mut report, &before)?;
    Ok(report)
}

/// Moves every live block out of every segment that has dead bytes, then deletes the
/// emptied segments: the footprint drops to about the live data (plus the WAL and the
/// metadata of the last checkpoints).
pub(crate) fn shrink(shared: &Shared, progress: &mut dyn FnMut(u64, u64)) -> Result<CleanReport> {
    // Moving a block rewrites its parents, which may lie in the segment taking the
    // copies and so leave dead bytes there: a few passes settle it (each pass moves
    // only what the previous one left behind).
    let _one_at_a_time = lock(&shared.cleaning);
    let mut report = CleanReport {
        footprint_before: footprint(shared)?,
        // The footprint drops to the live data: no spare files kept (first, so that
        // a disk short of space has their room for the moves).
        bytes_freed: shared.segments.discard_spares()?,
        ..CleanReport::default()
    };
    for _ in 0..SHRINK_PASSES {
        let done = clean_at_most(
            shared,
            0.0,
            u64::MAX,
            Some(SHRINK_MIN_DEAD_RATIO),
            shrink_round_bytes(shared),
            progress,
        )?;
        report.segments_cleaned += done.segments_cleaned;
        report.segments_deleted += done.segments_deleted;
        report.bytes_moved += done.bytes_moved;
        report.bytes_freed += done.bytes_freed;
        report.blocks_moved += done.blocks_moved;
        if done.bytes_moved == 0 {
            break;
        }
    }
    // The back references shrink too: every run merged into one, the records of
    // freed blocks and deleted segments purged.
    shared
        .compact_backrefs
        .store(true, std::sync::atomic::Ordering::Relaxed);
    settle_deletions(shared)?;
    // Counted when their segments went (`finish_report`).
    shared.segments.discard_spares()?;
    report.footprint_after = footprint(shared)?;
    Ok(report)
}

/// Collects the written leaves a walk reaches, in key order.
#[derive(Default)]
struct Leaves {
    /// Written leaves, in key order.
    in_order: Vec<BlockRef>,
}

impl Visitor for Leaves {
    fn visit(&mut self, at: &At<'_>, node: &Arc<Node>) -> Result<bool> {
        if node.level == 0 {
            if let Some(r) = at.child.disk_ref() {
                self.in_order.push(r);
            }
        }
        Ok(true)
    }
}

/// Consecutive runs of `blocks` of about `bytes` each (at least one block each).
fn chunks_of_bytes(blocks: &[BlockRef], bytes: u64) -> Vec<&[BlockRef]> {
    let mut chunks = Vec::new();
    let mut start = 0;
    let mut sum = 0;
    for (i, r) in blocks.iter().enumerate() {
        if sum > 0 && sum + u64::from(r.len) > bytes {
            chunks.push(&blocks[start..i]);
            start = i;
            sum = 0;
        }
        sum += u64::from(r.len);
    }
    if start < blocks.len() {
        chunks.push(&blocks[start..]);
    }
    chunks
}

/// Part of a victim segment, moved in one round.
#[derive(Debug, Clone, PartialEq)]
struct Piece {
    /// Addresses inside one segment.
    range: Range<Addr>,
    /// Its share of the segment's live bytes (an estimate: the segment's live bytes
    /// are known, not where they lie).
    live: u64,
    /// Whether it ends its segment (so the segment is cleaned with it).
    last: bool,
}

/// Splits the victims into rounds of about `round_bytes` live bytes: small segments
/// share a round, and a segment with more is cut into pieces of equal address range,
/// one round each, so that no round holds the writer lock much longer than another.
fn rounds(victims: &[SegmentUse], round_bytes: u64) -> Vec<Vec<Piece>> {
    let mut rounds: Vec<Vec<Piece>> = Vec::new();
    let mut bytes = 0;
    for s in victims {
        let pieces = s.live.div_ceil(round_bytes.max(1)).max(1);
        let span = s.size.div_ceil(pieces).max(1);
        for i in 0..pieces {
            let (lo, hi) = (i * span, ((i + 1) * span).min(s.size));
            let end = if i + 1 == pieces {
                // Through the end of the segment's address space: a block is never
                // past its file's end, but the file may have grown since `size`.
                Addr::new(SegmentId(s.id.0.saturating_add(1)), 0)
            } else {
                Addr::new(s.id, hi)
            };
            let piece = Piece {
                range: Addr::new(s.id, lo)..end,
                live: s.live / pieces,
                last: i + 1 == pieces,
            };
            match rounds.last_mut() {
                Some(r) if bytes + piece.live <= round_bytes => {
                    bytes += piece.live;
                    r.push(piece);
                }
                _ => {
                    bytes = piece.live;
                    rounds.push(vec![piece]);
                }
            }
        }
    }
    rounds
}

/// The segments to clean, best first, by Rosenblum's cost-benefit: the space a move
/// frees times the segment's age, over the cost of reading and rewriting its live
/// part, `(1 - u) * age / (1 + u)`. Age is by segment id (ids only grow), so
/// older, colder data is moved before data that may still die on its own. Segments
/// are taken until the dead bytes left would be below `dead_below` of the total;
/// with `min_dead_ratio`, only those at least 1 / it dead; and only as many as fit
/// in `fit` bytes of moves (only those at least half dead, when not all would).
fn choose_victims(
    shared: &Shared,
    dead_below: f64,
    mut fit: u64,
    min_dead_ratio: Option<u64>,
) -> Result<Vec<SegmentUse>> {
    let segments = segment_uses(shared)?;
    let newest = segments.iter().map(|s| s.id.0).max().unwrap_or(0);
    let total: u64 = segments.iter().map(|s| s.size).sum();
    let mut dead: u64 = segments.iter().map(SegmentUse::dead).sum();
    let mut candidates: Vec<(f64, SegmentUse)> = segments
        .into_iter()
        // Empty ones need no move, only a checkpoint.
        .filter(|s| s.live > 0 && s.dead() > 0)
        .filter(|s| min_dead_ratio.is_none_or(|r| s.dead() * r >= s.size))
        .map(|s| {
            #[expect(clippy::cast_precision_loss, reason = "a ranking score")]
            let u = s.live as f64 / s.size.max(1) as f64;
            let age = f64::from(newest - s.id.0 + 1);
            ((1.0 - u) * age / (1.0 + u), s)
        })
        .collect();
    // When the room left cannot take every candidate's live bytes, only segments at
    // least half dead: moving one then costs no more room than it gives back. (With
    // the room the only limit, a clean on a full disk took any segment that fit and
    // kept rewriting the small one its last run wrote, reporting space freed while
    // the footprint stayed.)
    if candidates.iter().map(|(_, s)| s.live).sum::<u64>() > fit {
        candidates.retain(|(_, s)| s.dead() >= s.live);
    }
    candidates.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut victims = Vec::new();
    for (_, s) in candidates {
        #[expect(clippy::cast_precision_loss, reason = "a fraction")]
        let fraction = dead as f64 / total.max(1) as f64;
        if fraction <= dead_below {
            break;
        }
        if s.live > fit {
            continue;
        }
        fit -= s.live;
        dead -= s.dead();
        victims.push(s);
    }
    Ok(victims)
}

/// A pause between two rounds that hold the writer lock: the lock is not fair, so
/// without it the cleaner takes it straight back and a waiting commit starves for the
/// whole run. One millisecond is about 1% of a 16 MiB round.
fn let_writers_in() {
    std::thread::sleep(std::time::Duration::from_millis(1));
}

/// Every segment with its file size and durable live bytes.
fn segment_uses(shared: &Shared) -> Result<Vec<SegmentUse>> {
    let usage = lock(&shared.durable).meta.usage.clone();
    Ok(shared
        .segments
        .sizes()?
        .into_iter()
        .map(|(id, size)| SegmentUse {
            id,
            size,
            live: usage.get(&id).copied().unwrap_or(0),
        })
        .collect())
}

fn finish_report(
    shared: &Shared,
    report: &mut CleanReport,
    before: &[(SegmentId, u64)],
) -> Result<()> {
    let after: HashSet<SegmentId> = shared.segments.sizes()?.into_iter().map(|s| s.0).collect();
    for (id, size) in before {
        if !after.contains(id) {
            report.segments_deleted += 1;
            report.bytes_freed += size;
        }
    }
    report.footprint_after = footprint(shared)?;
    Ok(())
}

/// Bytes of every file in the store directory: what the store takes on disk.
pub(crate) fn footprint(shared: &Shared) -> Result<u64> {
    let mut total = 0;
    for name in shared.vfs.list()? {
        if let Ok(file) = shared.vfs.open(&name) {
            total += file.len()?;
        }
    }
    Ok(total)
}

/// Makes the deletion of emptied segments happen now: a checkpoint (so the one that
/// emptied them is no longer the only durable one: the fallback slot cannot reach
/// them either), then the deletion of every pending segment nothing can reach.
fn settle_deletions(shared: &Shared) -> Result<()> {
    for _ in 0..2 {
        let_writers_in();
        {
            let mut w = shared.lock_writer_lending()?;
            settle(shared, &mut w, true)?;
        }
        checkpoint::delete_unreachable_segments(shared);
    }
    Ok(())
}

/// Brings the writer state to where relocation can start: no dropped version waiting
/// to be freed and every node written, with its count in the table by address. Runs
/// a checkpoint unless nothing happened since the last one (as between two rounds
/// that no commit came between), or always when `force`d (to advance the
/// generation, which pending deletions wait for).
///
/// Lends the writer lock to version operations between drop steps and while its
/// checkpoint writes (`engine::lend`).
fn settle(shared: &Shared, w: &mut LendingGuard<'_>, force: bool) -> Result<()> {
    while drop_step(w, shared.loader(), crate::versions::DROP_STEP_NODES)? {
        w.serve();
    }
    let idle = {
        let durable = checkpoint::lock_durable_lending(shared, w);
        checkpoint::nothing_to_write(&durable, w)
    };
    if force || !idle {
        checkpoint::run_lending(shared, w)?;
    } else {
        // No checkpoint is writing now (the durable lock was free), but the last one
        // may have ended while this thread held the writer lock, and so not folded
        // its nodes' counts into the table (`unpin_written_roots` only tries the
        // lock): fold them here, since the plan reads counts by address. (A snapshot
        // lent during that checkpoint's write counts its root in memory; a plan that
        // read the table saw one parent where eight versions pointed.)
        let written = w.epoch - 1;
        w.refs.merge_written(written);
    }
    Ok(())
}

/// What a relocation moved.
#[derive(Default)]
struct Moved {
    blocks: u64,
    bytes: u64,
}

/// What to move.
enum Victims {
    /// Every live block in these address ranges (parts of segments).
    Ranges(Vec<Range<Addr>>),
    /// These nodes, unless they already lie at or past segment `below` (where the
    /// copies of this run go).
    Nodes {
        nodes: HashSet<Addr>,
        below: SegmentId,
    },
}

impl Victims {
    fn picks(&self, r: BlockRef) -> bool {
        match self {
            Victims::Ranges(ranges) => ranges.iter().any(|x| x.contains(&r.addr)),
            Victims::Nodes { nodes, below } => r.addr.segment() < *below && nodes.contains(&r.addr),
        }
    }
}

/// Compacts the back references ahead of the round, with an ordinary checkpoint
/// whose writing (the compaction included) runs beside commits, when the round's own
/// checkpoints would otherwise compact with the writer lock held: because a segment
/// the round empties holds blobs of the current runs (which must move out before it
/// can go), or because the two runs the round may add (its settle's and its commit's)
/// would pass [`MAX_RUNS`].
fn compact_ahead(shared: &Shared, round: &[Piece]) -> Result<()> {
    let due = {
        let store = lock(&shared.backrefs);
        let runs = store.segments();
        store.run_count() + 2 > MAX_RUNS
            || round
                .iter()
                .any(|p| p.last && runs.contains(&p.range.start.segment()))
    };
    if due {
        shared
            .compact_backrefs
            .store(true, std::sync::atomic::Ordering::Relaxed);
        checkpoint::run(shared, None)?;
    }
    Ok(())
}

/// Does the I/O of a round before it takes the writer lock, so that commits go on
/// meanwhile: copies the value extents in `ranges` (parts of victim segments) to the
/// end of the store and makes the copies durable, and reads into the cache the tree
/// nodes among the victims and the nodes pointing at any victim (the leaves and
/// branches the relocation will copy). Returns old address → copy of each extent.
///
/// Only a guess, checked where it is used: the blocks and parents come from the
/// durable back references (without the writer's pending ones), and a block whose
/// bytes start as a tree node does is taken for one. The relocation uses an extent's
/// copy only if the pointer it rewrites has the copy's length and checksum (a copy it
/// does not use is dead space like any other), and a node read ahead is cached only
/// if it passes its own checksum and is used only if it also matches its pointer's.
fn read_ahead(shared: &Shared, ranges: &[Range<Addr>]) -> Result<AddrMap<Addr, BlockRef>> {
    let mut blocks: Vec<(Addr, u32)> = Vec::new();
    let mut parents: Vec<(Addr, u32)> = Vec::new();
    {
        let store = lock(&shared.backrefs);
        let none = WriteStore::default();
        let mut parent_addrs: Vec<Addr> = Vec::new();
        for range in ranges {
            for e in store.edges(range.clone(), &none) {
                blocks.push((e.child, e.len));
                parent_addrs.push(e.parent);
            }
        }
        parent_addrs.sort_unstable();
        parent_addrs.dedup();
        // A parent's length is on the edge from its own parent (a root has none: roots
        // are read often enough to be cached anyway).
        for p in parent_addrs {
            if let Some(e) = store.edges(p..Addr(p.0 + 1), &none).first() {
                parents.push((p, e.len));
            }
        }
    }
    blocks.sort_unstable();
    blocks.dedup_by_key(|b| b.0);
    // Node segments get no read-ahead of the OS's own: ask for what is read below.
    shared.segments.will_need_blocks(parents.iter().copied());
    shared.segments.will_need_blocks(blocks.iter().copied());
    let loader = shared.loader();
    for &(addr, len) in &parents {
        if !shared.cache.contains(addr) {
            if let Ok(bytes) = shared.segments.read_span(addr, len, "node") {
                loader.cache_read_ahead(addr, &bytes);
            }
        }
    }
    let node_magic = NODE_MAGIC.to_le_bytes();
    let mut copies = AddrMap::default();
    let mut buf: Vec<u8> = Vec::new();
    // (old address, length, checksum, offset in `buf`)
    let mut pending: Vec<(Addr, u32, u32, usize)> = Vec::new();
    let mut flush = |buf: &mut Vec<u8>, pending: &mut Vec<(Addr, u32, u32, usize)>| {
        if buf.is_empty() {
            return Ok::<(), Error>(());
        }
        let (base, _) = shared.segments.append_many(buf)?;
        for &(old, len, crc, offset) in pending.iter() {
            let addr = Addr(base.0 + offset as u64);
            copies.insert(old, BlockRef { addr, len, crc });
        }
        buf.clear();
        pending.clear();
        Ok(())
    };
    for (addr, len) in blocks {
        // A block that cannot be read now is the relocation's to report.
        let Ok(bytes) = shared.segments.read_span(addr, len, "block") else {
            continue;
        };
        if bytes.starts_with(&node_magic) && loader.cache_read_ahead(addr, &bytes) {
            continue;
        }
        pending.push((addr, len, crc(&bytes), buf.len()));
        buf.extend_from_slice(&bytes);
        if buf.len() >= AHEAD_CHUNK_BYTES {
            flush(&mut buf, &mut pending)?;
        }
    }
    flush(&mut buf, &mut pending)?;
    if !copies.is_empty() {
        shared.segments.sync()?;
    }
    Ok(copies)
}

/// Moves the victims (nodes and value extents), rewriting the closure of their
/// parents up to the roots, and commits the move by checkpoint.
///
/// The closure comes from the back references: the victims' parents, theirs, and so
/// on up to the roots, so the walk reads only the nodes it rewrites. The move is
/// checked before anything is applied: every block moved must have had each of its
/// parents rewritten (as many as its reference count says). If the back references
/// missed one, the move is retried with the closure found by walking every version,
/// rather than leave a parent pointing at a block about to be freed.
fn relocate(
    shared: &Shared,
    victims: &Victims,
    mut ahead: AddrMap<Addr, BlockRef>,
) -> Result<Moved> {
    let_writers_in();
    let mut guard = shared.lock_writer_lending()?;
    settle(shared, &mut guard, false)?;
    // A copy made ahead lies in a segment nothing counted live until now: if a
    // checkpoint meanwhile found that segment empty, it is to be deleted (or is
    // gone already), and the copy must not be used.
    {
        let pending = lock(&shared.pending_deletes);
        ahead.retain(|_, copy| {
            let segment = copy.addr.segment();
            shared.segments.contains(segment) && !pending.iter().any(|p| p.segment == segment)
        });
    }
    // Planning changes nothing, so a version operation waiting for the lock is served
    // by abandoning the plan and planning again: a snapshot waits for no round. But
    // only a few times a round: snapshots coming faster than a plan takes would
    // otherwise starve it, and every writer waiting for the round with it (a round
    // with snapshots every 5 ms was planned 169 times over 5 s); the last plan is
    // finished whatever waits, so a snapshot waits for at most one plan.
    let mut abandoned = 0;
    let plan = loop {
        guard.serve();
        let patient = abandoned >= MAX_ABANDONED_PLANS;
        abandoned += 1;
        let interrupted = || !patient && guard.requested();
        let Some(closure) = closure(shared, &guard, victims, &interrupted) else {
            continue;
        };
        let plan = match plan_moves(
            shared,
            &guard,
            victims,
            Some(&closure),
            &ahead,
            &interrupted,
        ) {
            Err(Error::Corrupted { .. }) => {
                plan_moves(shared, &guard, victims, None, &ahead, &interrupted)?
            }
            other => other?,
        };
        if let Some(plan) = plan {
            break plan;
        }
    };
    let w = &mut *guard;
    let Plan {
        copies,
        delta,
        rc,
        moved,
        dirtied,
        backrefs,
    } = plan;
    if moved.blocks == 0 {
        return Ok(moved);
    }
    // The relocation takes an LSN (so that reader views older than it keep the
    // victims alive) and logs a record for it that replay skips: the version
    // operations lent the lock while its checkpoint writes are logged after it, and
    // recovery from the superblock before that checkpoint must replay them.
    let lsn = w.last_lsn.next();
    shared.wal.append(
        lsn,
        &Record::Relocation {
            blocks: moved.blocks,
        },
    )?;
    for v in &mut w.catalog.versions {
        if let Some(Some(copy)) = v
            .root
            .as_ref()
            .and_then(Child::disk_ref)
            .and_then(|r| copies.get(&r.addr))
        {
            v.root = Some(Child::Mem(copy.clone()));
        }
    }
    w.delta.merge(delta);
    w.refs.apply(rc);
    w.dirty_bytes += dirtied;
    w.backrefs.merge(backrefs);
    // Commit by checkpoint: the copies are written and the victims' bytes freed.
    w.last_lsn = lsn;
    // What readers get once it is durable: the state as of the relocation, not the
    // writer's after the checkpoint, which may hold versions lent operations made
    // meanwhile that are not durable yet (each is published by its own caller).
    let relocated = shared.view_of(&guard);
    checkpoint::run_lending(shared, &mut guard)?;
    shared.publish(relocated);
    drop(guard);
    // The segments the settle made unreachable go now, with commits going on.
    checkpoint::delete_unreachable_segments(shared);
    Ok(moved)
}

/// The addresses a relocation must rewrite: the victims, and every node on a path
/// from a root to one, found upwards through the back references.
///
/// `None` when `interrupted` asks for the writer lock back before it is done: like the
/// plan, the lookup changes nothing, and it can take several milliseconds.
fn closure(
    shared: &Shared,
    w: &WriterState,
    victims: &Victims,
    interrupted: &dyn Fn() -> bool,
) -> Option<HashSet<Addr>> {
    let store = lock(&shared.backrefs);
    let ws = &w.backrefs;
    let mut closure: HashSet<Addr> = HashSet::new();
    let mut todo: Vec<Addr> = Vec::new();
    match victims {
        Victims::Ranges(ranges) => {
            for range in ranges {
                if interrupted() {
                    return None;
                }
                for e in store.edges(range.clone(), ws) {
                    closure.insert(e.child);
                    todo.push(e.parent);
                }
            }
            // Roots have no parent edge.
            for r in w.catalog.versions.iter().filter_map(|v| v.root.as_ref()) {
                if let Some(r) = r.disk_ref().filter(|r| victims.picks(*r)) {
                    closure.insert(r.addr);
                }
            }
        }
        Victims::Nodes { nodes, .. } => todo.extend(nodes.iter().copied()),
    }
    while let Some(a) = todo.pop() {
        if closure.len().is_multiple_of(64) && interrupted() {
            return None;
        }
        if closure.insert(a) {
            todo.extend(
                store
                    .parents(a, ws)
                    .into_iter()
                    .filter(|p| !closure.contains(p)),
            );
        }
    }
    Some(closure)
}

/// What a relocation would change, not yet applied.
struct Plan {
    copies: AddrMap<Addr, Option<Arc<Node>>>,
    delta: SpaceDelta,
    rc: RcDelta,
    moved: Moved,
    dirtied: u64,
    backrefs: WriteStore,
}

/// Walks the versions (only into `closure`, when given) and builds the copies. Fails
/// with `Corrupted` if a moved block would keep a parent that was not rewritten.
fn plan_moves(
    shared: &Shared,
    w: &WriterState,
    victims: &Victims,
    closure: Option<&HashSet<Addr>>,
    ahead: &AddrMap<Addr, BlockRef>,
    interrupted: &dyn Fn() -> bool,
) -> Result<Option<Plan>> {
    let pick = |r: BlockRef| victims.picks(r);
    let mut mover = Mover {
        shared,
        pick: &pick,
        interrupted,
        abandoned: false,
        closure,
        ahead,
        rewired: AddrMap::default(),
        w_epoch: w.epoch,
        merged_through: w.refs.merged_through,
        copies: AddrMap::default(),
        extents: AddrMap::default(),
        stack: Vec::new(),
        delta: SpaceDelta::default(),
        rc: RcDelta::default(),
        table: &w.refs.table,
        moved: Moved::default(),
        dirtied: 0,
        backrefs: WriteStore::default(),
    };
    let roots: Vec<Child> = w
        .catalog
        .versions
        .iter()
        .filter_map(|v| v.root.clone())
        .collect();
    for root in &roots {
        walk(&mut shared.loader(), root, &mut mover)?;
        if mover.abandoned {
            return Ok(None);
        }
        if let Some(r) = root.disk_ref() {
            if matches!(mover.copies.get(&r.addr), Some(Some(_))) {
                *mover.rewired.entry(r.addr).or_default() += 1;
            }
        }
    }
    // Every moved block must have had all its parents rewritten.
    let moved_blocks = mover
        .copies
        .iter()
        .filter(|(_, c)| c.is_some())
        .map(|(a, _)| *a)
        .chain(mover.extents.keys().copied());
    for addr in moved_blocks {
        let parents = mover.table.get(addr);
        let rewired = mover.rewired.get(&addr).copied().unwrap_or(0);
        if parents != rewired {
            return Err(Error::corrupted(
                "back references",
                format!("block {addr:?} has {parents} parents but {rewired} were rewritten"),
            ));
        }
    }
    Ok(Some(Plan {
        copies: mover.copies,
        delta: mover.delta,
        rc: mover.rc,
        moved: mover.moved,
        dirtied: mover.dirtied,
        backrefs: mover.backrefs,
    }))
}

/// The relocation walk. Post-order: a node is copied when it is picked, or when any of
/// its children or value extents was (so parents see their children's copies first).
/// Each address is decided once (`copies`), so a shared node gets one copy.
struct Mover<'a> {
    shared: &'a Shared,
    pick: &'a dyn Fn(BlockRef) -> bool,
    /// Whether to abandon the plan (a version operation waits for the writer lock).
    interrupted: &'a dyn Fn() -> bool,
    abandoned: bool,
    /// The only nodes that can need a copy (`None`: any; every node is walked).
    closure: Option<&'a HashSet<Addr>>,
    /// Value extents already copied, before the writer lock was taken: old address
    /// → copy (used only if the copy's length and checksum are the extent's).
    ahead: &'a AddrMap<Addr, BlockRef>,
    /// Moved block → how many pointers to it were rewritten to its copy.
    rewired: AddrMap<Addr, u32>,
    w_epoch: u64,
    merged_through: u64,
    /// Old address → its copy (`None`: decided, not moved).
    copies: AddrMap<Addr, Option<Arc<Node>>>,
    /// Old value extent address → its copy.
    extents: AddrMap<Addr, BlockRef>,
    /// Per node on the current path: whether it must be copied.
    stack: Vec<bool>,
    delta: SpaceDelta,
    rc: RcDelta,
    table: &'a CountTable,
    moved: Moved,
    dirtied: u64,
    /// Back references of the originals, ended (the copies' begin when written).
    backrefs: WriteStore,
}

impl Mover<'_> {
    fn count(&self, addr: Addr) -> i64 {
        i64::from(self.table.get(addr))
    }

    fn mark_parent(&mut self) {
        if let Some(top) = self.stack.last_mut() {
            *top = true;
        }
    }

    /// The copy of value extent `r`, made once.
    fn move_extent(&mut self, r: BlockRef) -> Result<BlockRef> {
        if let Some(new) = self.extents.get(&r.addr) {
            return Ok(*new);
        }
        let new = match self.ahead.get(&r.addr) {
            Some(copy) if copy.len == r.len && copy.crc == r.crc => *copy,
            _ => {
                let bytes = self.shared.segments.read(r, "value extent")?;
                self.shared.segments.append(&bytes)?
            }
        };
        // Every leaf pointing at `r` is copied to point at `new` instead.
        let others = self.count(r.addr) - 1;
        self.rc.add(&Target::Block(new), others);
        self.rc.add(&Target::Block(r), -others);
        self.delta.alloc(new);
        self.delta.free(r);
        self.extents.insert(r.addr, new);
        self.moved.blocks += 1;
        self.moved.bytes += u64::from(r.len);
        Ok(new)
    }

    fn copy(&mut self, old: BlockRef, node: &Node) -> Result<Arc<Node>> {
        let mut copy = node.dirty_copy(self.w_epoch, self.merged_through);
        match &mut copy.body {
            Body::Branch(entries) => {
                for e in entries {
                    let Some(r) = e.child.disk_ref() else {
                        return Err(unsettled());
                    };
                    if let Some(Some(n)) = self.copies.get(&r.addr) {
                        e.child = Child::Mem(n.clone());
                        *self.rewired.entry(r.addr).or_default() += 1;
                    }
                }
            }
            Body::Leaf(leaf) => {
                for i in 0..leaf.len() {
                    if let ValueRef::Extent(r) = leaf.value(i) {
                        if (self.pick)(r) || self.extents.contains_key(&r.addr) {
                            leaf.set_value(i, ValueRef::Extent(self.move_extent(r)?));
                            *self.rewired.entry(r.addr).or_default() += 1;
                        }
                    }
                }
            }
            Body::Packed(_) => unreachable!("dirty_copy unpacks"),
        }
        let copy = Arc::new(copy);
        // The copy takes over every parent of the original: the count moves.
        let others = self.count(old.addr) - 1;
        self.rc.add(&Target::Mem(&copy), others);
        self.rc.add(&Target::Block(old), -others);
        self.delta.free(old);
        end_backrefs(&mut self.backrefs, old);
        self.shared.cache.remove(old.addr);
        self.dirtied += copy.size as u64;
        self.moved.blocks += 1;
        self.moved.bytes += u64::from(old.len);
        Ok(copy)
    }
}

fn unsettled() -> Error {
    Error::InvalidArgument("relocation found an unwritten node after a checkpoint".into())
}

impl Visitor for Mover<'_> {
    fn enter(&mut self, at: &At<'_>) -> Result<bool> {
        if self.abandoned || (self.interrupted)() {
            self.abandoned = true;
            return Ok(false);
        }
        let r = at.child.disk_ref().ok_or_else(unsettled)?;
        if self.closure.is_some_and(|c| !c.contains(&r.addr)) {
            // Nothing below needs moving.
            return Ok(false);
        }
        match self.copies.get(&r.addr) {
            Some(copy) => {
                if copy.is_some() {
                    self.mark_parent();
                }
                Ok(false)
            }
            None => Ok(true),
        }
    }

    fn visit(&mut self, at: &At<'_>, node: &Arc<Node>) -> Result<bool> {
        let r = at.child.disk_ref().ok_or_else(unsettled)?;
        let mut moved = (self.pick)(r);
        moved |= node
            .extents()
            .any(|(_, x)| (self.pick)(x) || self.extents.contains_key(&x.addr));
        self.stack.push(moved);
        Ok(true)
    }

    fn leave(&mut self, at: &At<'_>, node: &Arc<Node>) -> Result<()> {
        let r = at.child.disk_ref().ok_or_else(unsettled)?;
        let moved = self.stack.pop().unwrap_or(false);
        if moved {
            let copy = self.copy(r, node)?;
            self.copies.insert(r.addr, Some(copy));
            self.mark_parent();
        } else {
            self.copies.insert(r.addr, None);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(id: u32, size: u64, live: u64) -> SegmentUse {
        SegmentUse {
            id: SegmentId(id),
            size,
            live,
        }
    }

    /// Every victim's address space is covered by its pieces exactly once, in order,
    /// each segment ends with one `last` piece, and no round carries much more than
    /// the round size.
    #[test]
    fn rounds_cover_every_victim_in_bounded_pieces() {
        let mib = 1 << 20;
        let victims = [
            segment(3, 64 * mib, 40 * mib),
            segment(4, 8 * mib, 3 * mib),
            segment(5, 8 * mib, 2 * mib),
            segment(7, 64 * mib, 16 * mib),
            segment(9, 4 * mib, 1),
        ];
        let rounds = rounds(&victims, 16 * mib);
        for round in &rounds {
            let live: u64 = round.iter().map(|p| p.live).sum();
            assert!(live <= 16 * mib, "a round of {live} bytes");
        }
        let pieces: Vec<&Piece> = rounds.iter().flatten().collect();
        for s in &victims {
            let mine: Vec<&&Piece> = pieces
                .iter()
                .filter(|p| p.range.start.segment() == s.id)
                .collect();
            assert_eq!(mine.first().unwrap().range.start, Addr::new(s.id, 0));
            for pair in mine.windows(2) {
                assert_eq!(pair[0].range.end, pair[1].range.start);
                assert!(!pair[0].last);
            }
            let last = mine.last().unwrap();
            assert!(last.last);
            assert_eq!(last.range.end, Addr::new(SegmentId(s.id.0 + 1), 0));
            assert_eq!(mine.len() as u64, s.live.div_ceil(16 * mib).max(1));
        }
        // The two small segments share a round.
        assert!(rounds.iter().any(|r| r.len() >= 2));
    }

    /// A checkpoint that ends while another thread holds the writer lock leaves its
    /// nodes' counts in memory (`unpin_written_roots` only tries the lock). If the
    /// cleaner then finds nothing to checkpoint, its plan must still see those counts
    /// by address: here the root four versions share, written by that checkpoint.
    /// (Before, the plan read one parent where four versions pointed, and the clean
    /// failed with "corruption in back references".)
    #[test]
    fn a_plan_after_a_checkpoint_that_could_not_fold_its_counts_sees_them() {
        let vfs = crate::io::sim::SimVfs::new();
        let opts = crate::Options {
            vfs: Some(Arc::new(vfs)),
            background_checkpoints: false,
            auto_clean_dead_percent: None,
            ..Default::default()
        };
        let store = crate::Store::create_with("/sim", opts).expect("create");
        let put = |i: u32, v: u8| {
            store
                .put(format!("key{i:05}").as_bytes(), &[v; 300])
                .expect("put");
        };
        (0..400).for_each(|i| put(i, 1));
        store.checkpoint().expect("checkpoint");
        // Half the leaves written are superseded: dead bytes beside live ones, which
        // the clean moves, rewriting their parents up to the roots.
        (0..200).for_each(|i| put(i, 2));
        // Main's root is dirty: three snapshots share it, its count kept in memory.
        for n in 0..3 {
            store.snapshot("main", &format!("s{n}")).expect("snapshot");
        }
        let shared = store.shared();
        checkpoint::run_leaving_counts_unfolded(shared).expect("checkpoint");
        // A round straight after it, as when that checkpoint ended after `clean`'s
        // own first one: everything in segment 1, the only one, copied to a new one.
        shared.segments.seal();
        let everything = Addr::new(SegmentId(1), 0)..Addr::new(SegmentId(2), 0);
        let moved = relocate(
            shared,
            &Victims::Ranges(vec![everything]),
            AddrMap::default(),
        )
        .expect("relocate");
        assert!(moved.blocks > 0, "the round moved nothing");
        let report = store.verify().expect("verify");
        assert!(report.is_clean(), "{:?}", report.problems);
    }
}
