//! How `Segments::open` classifies files named like segments: valid segments, files
//! a crash left without a (whole) header, and strays, which are ignored.

use super::*;
use crate::io::sim::SimVfs;

fn name(id: u32) -> String {
    SegmentId(id).file_name()
}

/// A store directory with valid segments 1 and 2, one block in each.
fn two_segments() -> (SimVfs, BlockRef, BlockRef) {
    let sim = SimVfs::new();
    let vfs: Arc<dyn Vfs> = Arc::new(sim.clone());
    let segments = Segments::open(vfs, false).expect("open");
    let first = segments.append(b"in segment one").expect("append");
    segments.seal();
    let second = segments.append(b"in segment two").expect("append");
    segments.sync().expect("sync");
    assert_eq!(first.addr.segment(), SegmentId(1));
    assert_eq!(second.addr.segment(), SegmentId(2));
    (sim, first, second)
}

fn reopen(sim: &SimVfs) -> Segments {
    Segments::open(Arc::new(sim.clone()), false).expect("reopen")
}

#[test]
fn garbage_is_a_stray_ignored_and_its_id_never_reused() {
    let (sim, first, _) = two_segments();
    let garbage: Vec<u8> = (0..100u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
    sim.write_file(&name(7), &garbage);
    let segments = reopen(&sim);
    assert_eq!(
        segments.strays().get(&SegmentId(7)).map(String::as_str),
        Some("it has no segment header")
    );
    assert!(segments.sizes().unwrap().iter().all(|(id, _)| id.0 != 7));
    assert_eq!(segments.read(first, "node").unwrap(), b"in segment one");
    // Appends continue the newest valid segment; a new one is numbered after the stray.
    let r = segments.append(b"more").unwrap();
    assert_eq!(r.addr.segment(), SegmentId(2));
    segments.seal();
    let r = segments.append(b"more").unwrap();
    assert_eq!(r.addr.segment(), SegmentId(8));
    assert_eq!(sim.read_file(&name(7)).unwrap(), garbage, "never written");
}

#[test]
fn a_block_in_a_stray_fails_to_read_naming_it() {
    let (sim, _, second) = two_segments();
    // Segment 2's header damaged: a stray, whatever points into it.
    assert!(sim.corrupt(&name(2), 3, 0xff));
    let segments = reopen(&sim);
    let err = segments.read(second, "node").unwrap_err();
    assert!(err.is_corruption(), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("seg-00000002.dat") && text.contains("ignored"),
        "{text}"
    );
    // Never continued: appends go to the newest valid segment, new ones after it.
    assert_eq!(segments.append(b"x").unwrap().addr.segment(), SegmentId(1));
    segments.seal();
    assert_eq!(segments.append(b"x").unwrap().addr.segment(), SegmentId(3));
}

#[test]
fn strays_say_what_is_wrong() {
    let (sim, _, _) = two_segments();
    let one = sim.read_file(&name(1)).unwrap();
    // A copy of segment 1 under another name: a valid header, for another segment.
    sim.write_file(&name(4), &one);
    sim.write_file(&name(5), b"hello");
    let mut bad_crc = one.clone();
    bad_crc[OFF_RESERVED] ^= 1;
    sim.write_file(&name(6), &bad_crc);
    let segments = reopen(&sim);
    let why = |id| segments.strays().get(&SegmentId(id)).cloned();
    assert_eq!(
        why(4).as_deref(),
        Some("its header is that of seg-00000001.dat")
    );
    assert_eq!(
        why(5).as_deref(),
        Some("it is 5 bytes, too short for a segment header")
    );
    assert_eq!(
        why(6).as_deref(),
        Some("its segment header fails its checksum")
    );
    assert_eq!(segments.strays().len(), 3);
}

/// A crash during `roll` leaves a file with none, part or all of its header, and
/// nothing after it. It is an empty segment, not a stray, and never continued.
#[test]
fn a_torn_header_is_an_empty_segment_never_continued() {
    let header = Segments::header(SegmentId(3), Kind::Data);
    let cases: [&[u8]; 4] = [
        &[],
        &header[..10],
        &[0; HEADER_LEN],
        &[&header[..8], &[0; HEADER_LEN - 8][..]].concat(),
    ];
    for torn in cases {
        let (sim, _, _) = two_segments();
        sim.write_file(&name(3), torn);
        let segments = reopen(&sim);
        assert!(segments.strays().is_empty(), "{torn:?}");
        assert!(segments.sizes().unwrap().iter().any(|(id, _)| id.0 == 3));
        let r = segments.append(b"after").unwrap();
        assert_eq!(
            r.addr.segment(),
            SegmentId(2),
            "{torn:?}: the newest whole one"
        );
        let r = segments.append_value(&[7; 2000]).unwrap();
        assert_eq!(
            r.addr.segment(),
            SegmentId(4),
            "{torn:?}: a new data segment"
        );
        assert_eq!(sim.read_file(&name(3)).unwrap(), torn, "never written");
    }
}

#[test]
fn an_unknown_kind_is_a_stray() {
    let (sim, _, _) = two_segments();
    let mut header = Segments::header(SegmentId(3), Kind::Data);
    header[OFF_KIND] = 9;
    let c = crc(&header[..OFF_CRC]);
    header[OFF_CRC..].copy_from_slice(&c.to_le_bytes());
    sim.write_file(&name(3), &header);
    let segments = reopen(&sim);
    assert_eq!(
        segments.strays().get(&SegmentId(3)).map(String::as_str),
        Some("its header has an unknown segment kind 9")
    );
}

/// Value extents go to data segments, everything else to general ones; after a
/// reopen each stream continues the newest segment of its own kind.
#[test]
fn two_streams_keep_to_their_own_segments_across_reopen() {
    let sim = SimVfs::new();
    let segments = Segments::open(Arc::new(sim.clone()), false).unwrap();
    let node = segments.append(b"a node").unwrap();
    let value = segments.append_value(&[1; 3000]).unwrap();
    let node2 = segments.append(b"another node").unwrap();
    let values = segments.append_values(&[&[2; 5000], &[3; 1500]]).unwrap();
    assert_eq!(node.addr.segment(), node2.addr.segment());
    assert_ne!(node.addr.segment(), value.addr.segment());
    assert!(values
        .iter()
        .all(|r| r.addr.segment() == value.addr.segment()));
    assert_eq!(segments.read(values[1], "value").unwrap(), vec![3; 1500]);
    segments.sync().unwrap();
    drop(segments);
    let segments = reopen(&sim);
    let general = segments.append(b"third node").unwrap();
    let data = segments.append_value(&[4; 2000]).unwrap();
    assert_eq!(general.addr.segment(), node.addr.segment());
    assert_eq!(data.addr.segment(), value.addr.segment());
    assert!(
        data.addr.offset() >= values[1].addr.offset() + 1500,
        "after what was there"
    );
    for (r, want) in [(value, vec![1; 3000]), (data, vec![4; 2000])] {
        assert_eq!(segments.read(r, "value").unwrap(), want);
    }
    let files = sim.names();
    assert_eq!(
        files.iter().filter(|n| n.starts_with("seg-")).count(),
        2,
        "{files:?}"
    );
}

/// A large append of values is written from an aligned offset, padded to an aligned
/// length, and reads back whole; small appends after it pack on.
#[test]
fn large_value_appends_are_aligned_for_direct_writes() {
    let sim = SimVfs::new();
    let segments = Segments::open(Arc::new(sim.clone()), false).unwrap();
    let small = segments.append_value(&[9; 1100]).unwrap();
    let blocks: Vec<Vec<u8>> = (0..80u8).map(|i| vec![i; 4096 - 100]).collect();
    let refs: Vec<&[u8]> = blocks.iter().map(Vec::as_slice).collect();
    let large = segments.append_values(&refs).unwrap();
    assert_eq!(large[0].addr.offset() % DIRECT_ALIGN as u64, 0);
    for (r, b) in large.iter().zip(&blocks) {
        assert_eq!(&segments.read(*r, "value").unwrap(), b);
    }
    let after = segments.append_value(&[5; 1500]).unwrap();
    let large_end = large[79].addr.offset() + u64::from(large[79].len);
    assert_eq!(
        after.addr.offset(),
        large_end.next_multiple_of(DIRECT_ALIGN as u64)
    );
    assert_eq!(segments.read(small, "value").unwrap(), vec![9; 1100]);
}

/// What a checkpoint may delete: no segment an append can still reach.
#[test]
fn the_fence_holds_the_active_segments_and_every_later_id() {
    let (sim, first, second) = two_segments();
    let segments = reopen(&sim);
    let fence = segments.fence();
    // After reopen, before any append: segment 2 is where general appends resume.
    assert!(!fence.may_grow(first.addr.segment()));
    assert!(fence.may_grow(second.addr.segment()));
    assert!(fence.may_grow(SegmentId(3)));
    let v = segments.append_value(&[1; 2000]).unwrap();
    assert_eq!(v.addr.segment(), SegmentId(3));
    segments.seal();
    assert!(!segments.is_active(SegmentId(2)), "sealed");
    assert_eq!(segments.append(b"n").unwrap().addr.segment(), SegmentId(4));
    let fence = segments.fence();
    assert!(!fence.may_grow(SegmentId(2)), "sealed");
    assert!(fence.may_grow(SegmentId(3)), "the active data segment");
    assert!(fence.may_grow(SegmentId(4)), "the active general segment");
    assert!(fence.may_grow(SegmentId(5)), "not created yet");
    assert!(segments.is_active(SegmentId(3)) && segments.is_active(SegmentId(4)));
    segments.seal_if_active(SegmentId(3));
    assert!(!segments.is_active(SegmentId(3)));
    assert!(!segments.fence().may_grow(SegmentId(3)));
}

/// A data segment found at open is continued only by appends before the first fence:
/// after it, the data stream starts a new segment, so a checkpoint can delete the old
/// one once it is empty.
#[test]
fn a_fence_ends_the_data_streams_claim_on_its_old_segment() {
    let sim = SimVfs::new();
    let segments = Segments::open(Arc::new(sim.clone()), false).unwrap();
    let old = segments.append_value(&[1; 2000]).unwrap().addr.segment();
    segments.sync().unwrap();
    drop(segments);
    let segments = reopen(&sim);
    assert!(!segments.fence().may_grow(old));
    let next = segments.append_value(&[2; 2000]).unwrap().addr.segment();
    assert!(next > old);
}

/// The newest file keeps ids from being reused, whatever its kind.
#[test]
fn the_highest_id_is_the_newest_file_of_either_kind() {
    let sim = SimVfs::new();
    let segments = Segments::open(Arc::new(sim.clone()), false).unwrap();
    let general = segments.append(b"node").unwrap().addr.segment();
    let data = segments.append_value(&[1; 2000]).unwrap().addr.segment();
    assert!(segments.is_highest(data) && !segments.is_highest(general));
    segments.seal();
    let newer = segments.append(b"node").unwrap().addr.segment();
    assert!(segments.is_highest(newer) && !segments.is_highest(data));
}

/// A large append whose values lie back to back in an aligned run of the caller's
/// memory goes out from there (no copy); values that are not that run, or a run at an
/// unaligned address, are copied into the stream's buffer. Every way reads back whole.
#[test]
fn values_laid_out_in_an_aligned_run_are_written_in_place() {
    let sim = SimVfs::new();
    let segments = Segments::open(Arc::new(sim.clone()), false).unwrap();
    let mut run = AlignedBuf::default();
    for i in 0..(DIRECT_MIN_BYTES / 4096 + 1) as u32 {
        run.extend_from_slice(&[i as u8; 4096]);
    }
    let run = run.as_slice();
    let in_run: Vec<&[u8]> = run.chunks_exact(4096).collect();
    let copies: Vec<Vec<u8>> = in_run.iter().map(|v| v.to_vec()).collect();
    let elsewhere: Vec<&[u8]> = copies.iter().map(Vec::as_slice).collect();
    // The same bytes one past an aligned address.
    let mut shifted = vec![0u8; run.len() + 1];
    shifted[1..].copy_from_slice(run);
    let unaligned = &shifted[1..];
    let unaligned_values: Vec<&[u8]> = unaligned.chunks_exact(4096).collect();
    /// Values, the run hinted, whether they go out in place.
    type Case<'a> = (&'a [&'a [u8]], Option<&'a [u8]>, bool);
    let cases: [Case; 5] = [
        (&in_run, Some(run), true),
        (&elsewhere, Some(run), false),
        (&in_run, None, false),
        (&unaligned_values, Some(unaligned), false),
        (&in_run[1..], Some(run), false),
    ];
    for (values, hint, in_place) in cases {
        let mut staged = segments.stage_values(values, hint).unwrap();
        let went_in_place = matches!(&staged.payload, Payload::One(p) if p.len() > 4096);
        assert_eq!(went_in_place, in_place);
        let refs = std::mem::take(&mut staged.refs);
        segments.write_staged(staged).unwrap();
        for (r, v) in refs.iter().zip(values.iter()) {
            assert_eq!(segments.read(*r, "value").unwrap(), *v);
        }
    }
}

/// The data stream's next segment, made ahead by a committer: only once the active
/// one is three quarters full, counted by fences as one appends may reach before it
/// is active, taken by the roll (no file created under the lock); left unused by a
/// crash or a close, it is an empty segment like any other, which the data stream
/// continues after the reopen.
#[test]
fn a_data_segment_prepared_ahead_is_fenced_and_taken_by_the_roll() {
    let sim = SimVfs::new();
    let segments = Segments::open(Arc::new(sim.clone()), false).unwrap();
    let chunk = vec![7u8; 4 << 20];
    let first = segments.append_value(&chunk).unwrap().addr.segment();
    segments.prepare_data_segment().unwrap();
    assert_eq!(
        sim.names().len(),
        1,
        "not due while the active segment has room"
    );
    // Fill past three quarters of the target size.
    while segments.appender(Kind::Data).end < SEGMENT_TARGET_BYTES / 4 * 3 {
        assert_eq!(segments.append_value(&chunk).unwrap().addr.segment(), first);
    }
    segments.prepare_data_segment().unwrap();
    let prepared = SegmentId(first.0 + 1);
    assert_eq!(sim.file_len(&name(prepared.0)), Some(HEADER_LEN as u64));
    assert!(segments.fence().may_grow(prepared), "a fence counts it");
    // Once one is prepared, another call makes nothing more.
    segments.prepare_data_segment().unwrap();
    assert_eq!(sim.names().len(), 2);
    // A general segment made meanwhile takes the next id; the data stream's roll
    // takes the prepared one, which a fence then sees as active.
    let general = segments.append(b"node").unwrap().addr.segment();
    assert_eq!(general, SegmentId(prepared.0 + 1));
    let mut last = first;
    while last == first {
        last = segments.append_value(&chunk).unwrap().addr.segment();
    }
    assert_eq!(last, prepared);
    assert_eq!(sim.names().len(), 3, "the roll created no file");
    assert!(segments.fence().may_grow(prepared));
    segments.sync().unwrap();

    // Prepared and never used, then reopened: the newest data segment, continued.
    while segments.appender(Kind::Data).end < SEGMENT_TARGET_BYTES / 4 * 3 {
        segments.append_value(&chunk).unwrap();
    }
    segments.prepare_data_segment().unwrap();
    let unused = SegmentId(general.0 + 1);
    assert_eq!(sim.file_len(&name(unused.0)), Some(HEADER_LEN as u64));
    drop(segments);
    let segments = reopen(&sim);
    let next = segments.append_value(&[1; 2000]).unwrap();
    assert_eq!(next.addr.segment(), unused);
    assert_eq!(segments.read(next, "extent").unwrap(), vec![1; 2000]);
}

/// Values written ahead of their transaction pin their segment: a fence counts it as
/// one that may grow, even once the stream has moved on, until the pin is dropped.
#[test]
fn values_written_ahead_pin_their_segment_until_their_transaction_is_over() {
    let sim = SimVfs::new();
    let segments = Segments::open(Arc::new(sim.clone()), false).unwrap();
    let block = [5u8; 4096];
    let (refs, pin) = segments
        .write_values_pinned(&[&block, &block], None)
        .unwrap();
    assert_eq!(refs.len(), 2);
    let id = refs[0].addr.segment();
    assert_eq!(segments.read(refs[1], "extent").unwrap(), block);
    let (_, second) = segments.write_values_pinned(&[&block], None).unwrap();
    segments.seal_if_active(id);
    assert!(!segments.is_active(id));
    assert!(segments.fence().may_grow(id), "pinned twice");
    drop(pin);
    assert!(segments.fence().may_grow(id), "pinned once");
    drop(second);
    assert!(!segments.fence().may_grow(id), "no pin left");
}

/// What a [`Hints`] file was told, with the file's name.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Hint {
    Random(String),
    WillNeed(String, u64, u64),
}

/// A store directory that records the cache hints its files are given.
#[derive(Clone)]
struct Hints {
    sim: SimVfs,
    seen: Arc<Mutex<Vec<Hint>>>,
}

struct HintFile {
    inner: Arc<dyn VFile>,
    name: String,
    seen: Arc<Mutex<Vec<Hint>>>,
}

impl VFile for HintFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.inner.read_exact_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_all_at(buf, offset)
    }
    fn reads_are_random(&self) {
        lock(&self.seen).push(Hint::Random(self.name.clone()));
    }
    fn will_need(&self, offset: u64, len: u64) {
        lock(&self.seen).push(Hint::WillNeed(self.name.clone(), offset, len));
    }
    fn sync(&self) -> std::io::Result<()> {
        self.inner.sync()
    }
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.inner.set_len(len)
    }
}

impl Hints {
    fn new() -> Hints {
        Hints {
            sim: SimVfs::new(),
            seen: Arc::default(),
        }
    }
    fn wrap(&self, name: &str, inner: Arc<dyn VFile>) -> Arc<dyn VFile> {
        Arc::new(HintFile {
            inner,
            name: name.to_owned(),
            seen: self.seen.clone(),
        })
    }
    fn take(&self) -> Vec<Hint> {
        std::mem::take(&mut *lock(&self.seen))
    }
}

impl Vfs for Hints {
    fn readers_present(&self) -> bool {
        self.sim.readers_present()
    }
    fn open(&self, name: &str) -> std::io::Result<Arc<dyn VFile>> {
        Ok(self.wrap(name, self.sim.open(name)?))
    }
    fn create(&self, name: &str) -> std::io::Result<Arc<dyn VFile>> {
        Ok(self.wrap(name, self.sim.create(name)?))
    }
    fn remove(&self, name: &str) -> std::io::Result<()> {
        self.sim.remove(name)
    }
    fn rename(&self, from: &str, to: &str) -> std::io::Result<()> {
        self.sim.rename(from, to)
    }
    fn exists(&self, name: &str) -> std::io::Result<bool> {
        self.sim.exists(name)
    }
    fn list(&self) -> std::io::Result<Vec<String>> {
        self.sim.list()
    }
    fn sync_dir(&self) -> std::io::Result<()> {
        self.sim.sync_dir()
    }
    fn lock(&self, kind: crate::io::LockKind) -> std::io::Result<Box<dyn crate::io::StoreLock>> {
        self.sim.lock(kind)
    }
}

/// Node segments are read at random (no read-ahead of the OS's own), whether created
/// or found at open; data segments keep the OS's read-ahead (a volume read in order
/// is a stream).
#[test]
fn node_segments_are_read_at_random_and_data_segments_are_not() {
    let hints = Hints::new();
    let segments = Segments::open(Arc::new(hints.clone()), false).expect("open");
    let node = segments.append(b"a node").expect("append");
    let value = segments.append_value(b"a value").expect("append");
    segments.sync().expect("sync");
    let (general, data) = (
        node.addr.segment().file_name(),
        value.addr.segment().file_name(),
    );
    assert_eq!(hints.take(), vec![Hint::Random(general.clone())]);
    drop(segments);
    let _reopened = Segments::open(Arc::new(hints.clone()), false).expect("reopen");
    let seen = hints.take();
    assert_eq!(
        seen,
        vec![Hint::Random(general)],
        "{data} must keep read-ahead"
    );
}

/// Blocks asked for together go out as one request per run of neighbours (either
/// way round), split where a gap or another segment comes, and in pieces Linux
/// reads whole.
#[test]
fn will_need_asks_for_runs_of_neighbours_in_pieces() {
    let hints = Hints::new();
    let segments = Segments::open(Arc::new(hints.clone()), false).expect("open");
    let one = segments
        .append(b"segment one")
        .expect("append")
        .addr
        .segment();
    segments.seal();
    let two = segments
        .append(b"segment two")
        .expect("append")
        .addr
        .segment();
    hints.take();
    let at = |s: SegmentId, o: u64| Addr::new(s, o);
    segments.will_need_blocks([
        (at(one, 100), 10),
        (at(one, 110), 20),
        (at(one, 90), 10), // before the run: joins it
        (at(one, 200), 8), // a gap
        (at(two, 208), 8), // another segment
    ]);
    let (n1, n2) = (one.file_name(), two.file_name());
    assert_eq!(
        hints.take(),
        vec![
            Hint::WillNeed(n1.clone(), 90, 40),
            Hint::WillNeed(n1.clone(), 200, 8),
            Hint::WillNeed(n2, 208, 8),
        ]
    );
    // A run longer than one piece goes in pieces of at most `WILL_NEED_CHUNK`.
    let big = u32::try_from(WILL_NEED_CHUNK).expect("small");
    segments.will_need_blocks([(at(one, 4096), big), (at(one, 4096 + WILL_NEED_CHUNK), 100)]);
    assert_eq!(
        hints.take(),
        vec![
            Hint::WillNeed(n1.clone(), 4096, WILL_NEED_CHUNK),
            Hint::WillNeed(n1, 4096 + WILL_NEED_CHUNK, 100),
        ]
    );
}

/// With zeros ahead on, while the data stream's appends are small and synced often,
/// the segment prepared
/// ahead is filled with zeros one chunk per call and then synced, so that the small appends it takes
/// overwrite written blocks; the roll cuts the old segment back to its blocks' end,
/// sizes count blocks, not zeros, and a close cuts the zeros off. Large appends leave
/// the prepared segment as it is.
#[test]
fn a_prepared_data_segment_is_zeroed_ahead_of_small_appends() {
    let sim = SimVfs::new();
    let segments = Segments::open(Arc::new(sim.clone()), false).unwrap();
    segments.set_zeros_ahead(true);
    let large = vec![7u8; 4 << 20];
    let first = segments.append_value(&large).unwrap().addr.segment();
    while segments.appender(Kind::Data).end < SEGMENT_TARGET_BYTES / 4 * 3 {
        segments.append_value(&large).unwrap();
    }
    segments.prepare_data_segment().unwrap();
    let prepared = SegmentId(first.0 + 1);
    let prepared_len = || sim.file_len(&name(prepared.0)).unwrap();
    // After large appends: no zeros.
    segments.prepare_data_segment().unwrap();
    assert_eq!(prepared_len(), HEADER_LEN as u64);
    // After a small one, while syncs are rare: no zeros either.
    let small = vec![9u8; 4096];
    segments.append_value(&small).unwrap();
    segments.sync_values().unwrap();
    segments.prepare_data_segment().unwrap();
    assert_eq!(prepared_len(), HEADER_LEN as u64);
    // Small appends synced often: a chunk per call, at the appends' pace (only
    // when zeros ahead are on).
    segments.append_value(&small).unwrap();
    segments.sync_values().unwrap();
    segments.set_zeros_ahead(false);
    segments.prepare_data_segment().unwrap();
    assert_eq!(prepared_len(), HEADER_LEN as u64);
    segments.set_zeros_ahead(true);
    segments.prepare_data_segment().unwrap();
    assert_eq!(prepared_len(), ZERO_CHUNK as u64);
    // At the pace of the appends: two chunks ahead of eight times the last
    // quarter's fill.
    for _ in 0..5 {
        segments.prepare_data_segment().unwrap();
    }
    let paced = prepared_len();
    assert!(
        (2..=3).contains(&(paced / ZERO_CHUNK as u64)),
        "{paced} bytes zeroed"
    );
    while segments.appender(Kind::Data).end < SEGMENT_TARGET_BYTES - (1 << 20) {
        segments.append_value(&small).unwrap();
        segments.prepare_data_segment().unwrap();
    }
    for _ in 0..3 {
        segments.prepare_data_segment().unwrap();
    }
    assert_eq!(prepared_len(), SEGMENT_TARGET_BYTES);
    assert!(lock(&segments.prepared).as_ref().unwrap().synced);
    // Small appends fill the old segment, then land in the zeroed one from its start.
    let medium = vec![5u8; 200 << 10];
    let mut last = segments.append_value(&medium).unwrap();
    while last.addr.segment() == first {
        last = segments.append_value(&medium).unwrap();
    }
    assert_eq!(last.addr, Addr::new(prepared, DIRECT_ALIGN as u64));
    assert_eq!(segments.read(last, "extent").unwrap(), medium);
    let old_end = sim.file_len(&name(first.0)).unwrap();
    assert!(old_end <= SEGMENT_TARGET_BYTES && old_end > SEGMENT_TARGET_BYTES / 4 * 3);
    // The active segment's size is its blocks' end, not the file's.
    let end = segments.appender(Kind::Data).end;
    let sizes: BTreeMap<SegmentId, u64> = segments.sizes().unwrap().into_iter().collect();
    assert_eq!(sizes[&prepared], end);
    assert_eq!(sizes[&first], old_end);
    assert_eq!(prepared_len(), SEGMENT_TARGET_BYTES);
    // A close cuts the zeros off; a reopen continues after the blocks.
    segments.sync().unwrap();
    segments.trim_zeros();
    assert_eq!(prepared_len(), end);
    drop(segments);
    let segments = reopen(&sim);
    let next = segments.append_value(&small).unwrap();
    assert_eq!(next.addr, Addr::new(prepared, end));
    assert_eq!(segments.read(last, "extent").unwrap(), medium);
}

/// After a failed fsync the kernel may have dropped the pages it could not write, so
/// a later fsync of the same file can succeed without them: one failed segment fsync
/// fails every later sync of this process, whoever asks (the checkpoint's `sync`, or
/// a commit's `sync_values`), until a reopen recovers from what is durable.
#[test]
fn a_failed_fsync_fails_every_later_sync() {
    let sim = SimVfs::new();
    let segments = Segments::open(Arc::new(sim.clone()), false).expect("open");
    segments.append(b"a node").expect("append");
    segments.append_value(b"a value").expect("append");
    sim.set_fail_once_after(Some(0));
    assert!(segments.sync().is_err(), "the injected fsync failure");
    // The fault was transient: the file system would let these succeed.
    segments.append_value(b"another value").expect("append");
    assert!(matches!(segments.sync(), Err(Error::Poisoned(_))));
    assert!(matches!(segments.sync_values(), Err(Error::Poisoned(_))));
    // A failure seen by a commit's sync of values is as sticky.
    let sim = SimVfs::new();
    let segments = Segments::open(Arc::new(sim.clone()), false).expect("open");
    segments.append_value(b"a value").expect("append");
    sim.set_fail_once_after(Some(0));
    assert!(
        segments.sync_values().is_err(),
        "the injected fsync failure"
    );
    assert!(matches!(segments.sync(), Err(Error::Poisoned(_))));
}

/// A fence taken while the data stream rolls to a new segment holds that segment,
/// whichever side of the roll it lands on: it is growing, pinned, or at or past the
/// fence's next id.
#[test]
fn a_fence_taken_during_rolls_holds_every_segment_appends_reach() {
    let sim = SimVfs::new();
    let segments = Arc::new(Segments::open(Arc::new(sim), false).expect("open"));
    let value = vec![7u8; 1 << 20];
    let writer = {
        let segments = segments.clone();
        std::thread::spawn(move || {
            let mut ids = Vec::new();
            for _ in 0..200 {
                let r = segments.append_value(&value).expect("append");
                ids.push(r.addr.segment());
            }
            ids
        })
    };
    let mut fences = Vec::new();
    while !writer.is_finished() {
        fences.push(segments.fence());
    }
    let ids = writer.join().expect("writer");
    // Every fence must hold every segment appended to after it was taken: a fence
    // holds the segment growing at its time and every later id.
    for fence in &fences {
        let held = |id: SegmentId| fence.growing.contains(&Some(id)) || id >= fence.next;
        let first_after = ids.iter().position(|&id| held(id));
        if let Some(i) = first_after {
            assert!(
                ids[i..].iter().all(|&id| held(id)),
                "a fence missed a segment appended to after it: {fence:?}, {ids:?}"
            );
        }
    }
}

/// An emptied segment's file becomes a spare (up to the limit; past it, and if too
/// short, it is removed), and the data stream's next segment is made from the oldest
/// spare while its appends are of whole pages: the file keeps its length and its
/// blocks start on a page, its header and name are durable before the first append
/// (a power cut that drops everything unsynced finds the segment, whole), `sizes`
/// does not list it while it is only prepared, and the spare's old bytes are
/// cut off when the stream rolls past it. A writable open adopts the spares it finds
/// (a read-only one leaves them alone), `trim_spares` keeps as many files and bytes
/// as it is told, and `discard_spares` removes them all.
#[test]
fn emptied_segments_become_spares_and_the_data_stream_reuses_them() {
    let sim = SimVfs::new();
    let segments = Segments::open(Arc::new(sim.clone()), false).unwrap();
    segments.set_spare_limit(2);
    let mut chunk = AlignedBuf::default();
    chunk.extend_from_slice(&vec![7u8; 4 << 20]);
    let fill = |segments: &Segments| {
        let start = segments
            .append_value(chunk.as_slice())
            .unwrap()
            .addr
            .segment();
        let mut last = start;
        while last == start {
            last = segments
                .append_value(chunk.as_slice())
                .unwrap()
                .addr
                .segment();
        }
        start
    };
    // Three full data segments and a short general one, all emptied.
    let full: Vec<SegmentId> = (0..3).map(|_| fill(&segments)).collect();
    let short = segments.append(b"node").unwrap().addr.segment();
    segments.seal();
    segments.append(b"newer node").unwrap();
    segments.sync().unwrap();
    segments.delete(short).unwrap();
    for id in &full {
        segments.delete(*id).unwrap();
    }
    let spare_names: Vec<String> = sim
        .names()
        .into_iter()
        .filter(|n| is_spare_name(n))
        .collect();
    assert_eq!(
        spare_names,
        [spare_name(full[0]), spare_name(full[1])],
        "two kept, oldest first"
    );
    assert!(
        !sim.names().contains(&name(full[2].0)),
        "past the limit: removed"
    );
    assert!(!sim.names().contains(&name(short.0)), "too short: removed");
    let spare_len = sim.file_len(&spare_name(full[0])).unwrap();
    assert!(spare_len >= SPARE_MIN_BYTES);

    // The active data segment past three quarters: the next one is made from a spare.
    while segments.appender(Kind::Data).end < SEGMENT_TARGET_BYTES / 4 * 3 {
        segments.append_value(chunk.as_slice()).unwrap();
    }
    let active = segments.appender(Kind::Data).active.as_ref().unwrap().0;
    segments.prepare_data_segment().unwrap();
    let prepared = lock(&segments.prepared_id).expect("prepared");
    assert_eq!(
        sim.file_len(&name(prepared.0)),
        Some(spare_len),
        "the spare's file"
    );
    assert!(!sim.names().contains(&spare_name(full[0])));
    assert_eq!(segments.spare_count(), 1);
    let sizes = segments.sizes().unwrap();
    assert!(sizes.iter().all(|(id, _)| *id != prepared), "{sizes:?}");
    let cut = sim.fork().crash_drop_all();
    let reopened = Segments::open(Arc::new(cut.clone()), false).unwrap();
    assert!(
        reopened.contains(prepared),
        "renamed and durable before any append"
    );
    assert_eq!(
        lock(&reopened.spares).clone(),
        [(spare_name(full[1]), spare_len)],
        "the spare left adopted at the open"
    );
    let reader = Segments::open(Arc::new(cut.clone()), true).unwrap();
    assert_eq!(reader.spare_count(), 0, "a reader adopts none");
    drop(reader);
    reopened.trim_spares(1, spare_len).unwrap();
    assert_eq!(
        reopened.spare_bytes(),
        spare_len,
        "within both bounds: kept"
    );
    reopened.trim_spares(1, spare_len - 1).unwrap();
    assert_eq!(reopened.spare_count(), 0, "past the bytes: removed");
    assert!(
        cut.names().iter().all(|n| !is_spare_name(n)),
        "removed: {:?}",
        cut.names()
    );
    drop(reopened);

    // The roll takes it; blocks start on a page and read back.
    let mut r = segments.append_value(chunk.as_slice()).unwrap();
    while r.addr.segment() == active {
        r = segments.append_value(chunk.as_slice()).unwrap();
    }
    assert_eq!(r.addr, Addr::new(prepared, DIRECT_ALIGN as u64));
    assert_eq!(segments.read(r, "value").unwrap(), chunk.as_slice());
    // Rolling past it cuts its old bytes off at its last block.
    let end = segments.appender(Kind::Data).end;
    segments.seal_if_active(prepared);
    segments.append_value(chunk.as_slice()).unwrap();
    assert_eq!(sim.file_len(&name(prepared.0)), Some(end));

    segments.discard_spares().unwrap();
    assert_eq!(segments.spare_count(), 0);
    assert!(sim.names().iter().all(|n| !is_spare_name(n)));
}

/// A spare that fails to become a segment (here: the directory sync after its rename)
/// is removed under both names, and the segment is created new under its id instead.
#[test]
fn a_spare_that_fails_to_become_a_segment_gives_way_to_a_new_file() {
    let sim = SimVfs::new();
    let segments = Segments::open(Arc::new(sim.clone()), false).unwrap();
    segments.set_spare_limit(2);
    let mut chunk = AlignedBuf::default();
    chunk.extend_from_slice(&vec![3u8; 4 << 20]);
    let first = segments
        .append_value(chunk.as_slice())
        .unwrap()
        .addr
        .segment();
    while segments
        .append_value(chunk.as_slice())
        .unwrap()
        .addr
        .segment()
        == first
    {}
    segments.append(b"node").unwrap();
    segments.sync().unwrap();
    segments.delete(first).unwrap();
    assert_eq!(segments.spare_count(), 1);
    while segments.appender(Kind::Data).end < SEGMENT_TARGET_BYTES / 4 * 3 {
        segments.append_value(chunk.as_slice()).unwrap();
    }
    // The spare's header write, its sync and its rename go through; the directory
    // sync fails.
    sim.set_fail_once_after(Some(3));
    segments.prepare_data_segment().unwrap();
    let prepared = lock(&segments.prepared_id).expect("prepared");
    assert_eq!(
        sim.file_len(&name(prepared.0)),
        Some(HEADER_LEN as u64),
        "a new file"
    );
    assert_eq!(segments.spare_count(), 0);
    assert!(
        sim.names().iter().all(|n| !is_spare_name(n)),
        "the spare removed"
    );
}

/// Appends of data checked at once count each other's bytes until they are written:
/// two that each fit the free space, but not together, staged before either is
/// written, leave the second refused (16 clients writing 32 MiB each at once all
/// passed the check on a disk with 339 MB free, and filled it).
#[test]
fn appends_checked_together_count_each_others_bytes() {
    let sim = SimVfs::new();
    let segments = Segments::open(Arc::new(sim.clone()), false).expect("open");
    let block = vec![7u8; 8 << 20];
    // A first append sets the headroom from the free space.
    sim.set_capacity(Some(sim.used_bytes() + (1 << 30)));
    let first = segments.stage_values_for_overlap(&[&block], None).unwrap();
    segments.write_staged(first).unwrap();
    let headroom = segments.headroom.load(Ordering::Relaxed);
    sim.set_capacity(Some(sim.used_bytes() + headroom + (12 << 20)));
    let a = segments.stage_values_for_overlap(&[&block], None).unwrap();
    let refused = segments
        .stage_values_for_overlap(&[&block], None)
        .err()
        .expect("the second does not fit beside the first");
    assert!(refused.is_storage_full(), "{refused}");
    segments.write_staged(a).unwrap();
    // Written, the first shows in the free space, and the second is refused by it.
    assert!(segments.stage_values_for_overlap(&[&block], None).is_err());
    sim.set_capacity(Some(sim.used_bytes() + headroom + (12 << 20)));
    let b = segments.stage_values_for_overlap(&[&block], None).unwrap();
    segments.write_staged(b).unwrap();
}
