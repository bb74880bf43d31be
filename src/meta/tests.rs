use super::codec::{decode, Blob, Link};
use super::*;
use crate::btree::node::Child;
use crate::catalog::Catalog;

fn r(seg: u32, off: u64, len: u32) -> BlockRef {
    BlockRef {
        addr: Addr::new(SegmentId(seg), off),
        len,
        crc: 7,
    }
}

fn sample() -> Meta {
    let mut meta = Meta {
        catalog: Catalog::initial(),
        ..Meta::default()
    };
    meta.catalog.versions[0].root = Some(Child::Disk(r(1, 32, 10)));
    meta.usage.insert(SegmentId(1), 10);
    meta.refcounts.insert(Addr::new(SegmentId(1), 32), 3);
    meta.drop_queue.push(r(1, 100, 20));
    meta.pending_deletes.push(PendingSegment {
        segment: SegmentId(0),
        generation: 4,
    });
    meta.backref_manifest = vec![1, 2, 3];
    meta
}

fn sample_delta() -> MetaDelta {
    let mut snap = Catalog::initial().versions.remove(0);
    snap.id = crate::catalog::VersionId(1);
    snap.name = "snap".into();
    snap.kind = crate::catalog::VersionKind::Snapshot;
    snap.root = Some(Child::Disk(r(1, 32, 10)));
    MetaDelta {
        next_id: 2,
        versions: vec![snap],
        removed: vec![],
        usage: vec![(SegmentId(1), 0), (SegmentId(2), 99)],
        refcounts: vec![
            (Addr::new(SegmentId(1), 32), 1),
            (Addr::new(SegmentId(2), 5), 2),
        ],
        drop_queue: Some(vec![]),
        pending_deletes: None,
        backref_manifest: Some(vec![9]),
    }
}

#[test]
fn base_round_trip_and_truncation() {
    let meta = sample();
    let buf = encode_base(&meta);
    let Blob::Base(back) = decode(&buf).unwrap() else {
        panic!("not a base")
    };
    assert_eq!(back.usage, meta.usage);
    assert_eq!(back.refcounts, meta.refcounts);
    assert_eq!(back.drop_queue, meta.drop_queue);
    assert_eq!(back.pending_deletes, meta.pending_deletes);
    assert_eq!(back.backref_manifest, meta.backref_manifest);
    assert_eq!(back.catalog.versions, meta.catalog.versions);
    for cut in 0..buf.len() {
        assert!(decode(&buf[..cut]).is_err(), "cut at {cut}");
    }
}

#[test]
fn delta_round_trip_link_and_apply() {
    let d = sample_delta();
    let mut buf = encode_delta(&d);
    let link = Link {
        chain_len: 3,
        base: r(1, 0, 50),
        prev: r(1, 60, 20),
    };
    link_delta(&mut buf, &link);
    let Blob::Delta(l, back) = decode(&buf).unwrap() else {
        panic!("not a delta")
    };
    assert_eq!(l, link);
    assert_eq!(back, d);
    for cut in 0..buf.len() {
        assert!(decode(&buf[..cut]).is_err(), "cut at {cut}");
    }
    // A delta without a link (chain length 0) is refused.
    assert!(decode(&encode_delta(&d)).is_err());

    let mut meta = sample();
    meta.apply(back).unwrap();
    assert_eq!(meta.catalog.versions.len(), 2);
    assert_eq!(meta.catalog.next_id, 2);
    assert!(!meta.usage.contains_key(&SegmentId(1)));
    assert_eq!(meta.usage.get(&SegmentId(2)), Some(&99));
    assert_eq!(meta.refcounts.len(), 1);
    assert!(meta.drop_queue.is_empty());
    assert_eq!(meta.pending_deletes.len(), 1, "absent part kept as it was");
    assert_eq!(meta.backref_manifest, vec![9]);
}

#[test]
fn apply_refuses_removing_an_unknown_version() {
    let mut meta = sample();
    let d = MetaDelta {
        removed: vec![crate::catalog::VersionId(42)],
        ..MetaDelta::default()
    };
    assert!(meta.apply(d).unwrap_err().is_corruption());
}

#[test]
fn catalog_changes_are_what_changed() {
    let old = sample();
    let mut new = old.catalog.clone();
    assert_eq!(old.catalog_changes(&new), (vec![], vec![]));
    let d = sample_delta();
    new.versions.push(d.versions[0].clone());
    new.next_id = 2;
    let (changed, removed) = old.catalog_changes(&new);
    assert_eq!(changed.len(), 1);
    assert!(removed.is_empty());
    new.versions.remove(0);
    let (_, removed) = old.catalog_changes(&new);
    assert_eq!(removed, vec![crate::catalog::VersionId(0)]);
}

#[test]
fn chain_decides_delta_or_base() {
    let chain = Chain::of_base(r(1, 0, 100));
    let link = chain.next_link(60).unwrap();
    assert_eq!(
        (link.chain_len, link.base, link.prev),
        (1, r(1, 0, 100), r(1, 0, 100))
    );
    let mut chain = chain;
    chain.blobs.push(r(1, 100, 60));
    assert_eq!(chain.next_link(40).unwrap().chain_len, 2);
    assert!(
        chain.next_link(41).is_none(),
        "deltas would outweigh the base"
    );
    let long = Chain {
        blobs: std::iter::once(r(1, 0, u32::MAX))
            .chain((0..MAX_CHAIN_BLOBS as u64).map(|i| r(2, i * 10, 1)))
            .collect(),
    };
    assert!(long.next_link(1).is_none(), "the chain is at its longest");
}

#[test]
fn header_layout_matches_the_document() {
    use super::codec::*;
    crate::format_tests::check_layout(
        "meta-header",
        &[
            ("magic", OFF_MAGIC),
            ("kind", OFF_KIND),
            ("reserved", OFF_RESERVED),
            ("chain_len", OFF_CHAIN_LEN),
            ("reserved", OFF_RESERVED2),
            ("base", OFF_BASE),
            ("prev", OFF_PREV),
        ],
        HEADER_LEN,
    );
}
