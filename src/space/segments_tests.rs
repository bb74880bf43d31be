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
    segments.seal().expect("seal");
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
    // Appends go to a new segment, after the stray.
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
    // Never continued: appends go to a new segment after it.
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
    let header = Segments::header(SegmentId(3));
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
        assert_eq!(r.addr.segment(), SegmentId(4), "{torn:?}");
        assert_eq!(sim.read_file(&name(3)).unwrap(), torn, "never written");
    }
}
