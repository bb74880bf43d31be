//! The on-disk format, pinned by a checked-in store image.
//!
//! `tests/data/format-v4/` is a small store written by this crate at format version 4
//! (see docs/FORMAT.md). `image_opens_with_every_version_intact` copies it to a
//! temporary directory, opens it read-only and then writable, and checks every key and
//! value of every version against [`STEPS`], the script that made it, and that
//! `verify` finds nothing wrong. It also walks the checked-in WAL by the documented
//! record framing, independently of the crate's code.
//!
//! **If this test fails, the on-disk format changed** (or recovery no longer reads
//! what an earlier build wrote). Existing stores in the field look exactly like this
//! image. Do not just regenerate it: bump `FORMAT_VERSION` in src/format.rs, write a
//! migration or make open refuse the old version with a clear error, record the change
//! in docs/FORMAT.md's version history, and only then regenerate the image, on
//! purpose, in a commit of its own (keeping the old one if a migration reads it).
//!
//! Regenerating: `cargo test --release --test format_image -- --ignored regenerate_image`
//! runs [`STEPS`] against a new store and copies its files here. The image contains:
//! - `main`: 40 keys of 200-byte values (more than one leaf, so a branch node too), a
//!   3000-byte value (an out-of-line extent), later edits and a delete;
//! - `snap-a`, a snapshot of `main` taken before the edits, and `dev`, a branch of
//!   `main` with diverging puts (one of them a 2000-byte extent) and deletes;
//! - `gone` and `scratch`, dropped versions (one dropped after a checkpoint wrote its
//!   nodes, so the metadata's reference counts and drop queue are exercised);
//!   the last checkpoint, of one small change, writes a delta blob on the base the
//!   previous one wrote, so the metadata read at open is a chain;
//! - after the last checkpoint, WAL records that are not checkpointed: batches (one
//!   naming a 1500-byte extent), a snapshot `snap-b` of `dev`, and a branch `tmp`
//!   made, written and dropped, so replay of batch and version records is pinned too.
//!
//! The WAL files are cut right after their last valid record (a new log is 4 MiB of
//! preallocated zeros, and a recycled one holds records of an older generation after
//! its own; recovery stops at either), and `wal-spare.log` (a recycled file for the
//! next generation) and `LOCK` are left out, so the image stays small.

use cambium::{Options, Store, VersionKind};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The image's directory, relative to the crate root.
const IMAGE: &str = "tests/data/format-v4";

/// The previous format's image, kept to pin that this build refuses it clearly.
const OLD_IMAGE: &str = "tests/data/format-v3";

/// One step of the script that makes the image.
enum Step {
    /// One transaction on a branch: puts (`Some`) and deletes (`None`).
    Txn(&'static str, Vec<(Vec<u8>, Option<Vec<u8>>)>),
    /// `snapshot(source, name)`.
    Snapshot(&'static str, &'static str),
    /// `branch(source, name)`.
    Branch(&'static str, &'static str),
    /// `drop_version(name)`.
    Drop(&'static str),
    Checkpoint,
}

fn key(i: usize) -> Vec<u8> {
    format!("key-{i:03}").into_bytes()
}

/// A value of `len` bytes that depends on `seed`.
fn value(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (j as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn put(k: &[u8], v: Vec<u8>) -> (Vec<u8>, Option<Vec<u8>>) {
    (k.to_vec(), Some(v))
}

fn del(k: &[u8]) -> (Vec<u8>, Option<Vec<u8>>) {
    (k.to_vec(), None)
}

/// The script. Changing it changes the image: regenerate deliberately (see the top).
fn steps() -> Vec<Step> {
    use Step::*;
    let mut first: Vec<_> = (0..40).map(|i| put(&key(i), value(i as u8, 200))).collect();
    first.push(put(b"big-main", value(1, 3000)));
    vec![
        Txn("main", first),
        Checkpoint,
        Snapshot("main", "snap-a"),
        Snapshot("main", "gone"),
        Branch("main", "dev"),
        Txn(
            "dev",
            vec![
                put(&key(3), b"dev-3".to_vec()),
                del(&key(4)),
                put(b"dev-only", b"d".to_vec()),
                put(b"big-dev", value(2, 2000)),
            ],
        ),
        Txn(
            "main",
            vec![put(&key(5), b"main-5b".to_vec()), del(&key(6))],
        ),
        Drop("gone"),
        Branch("main", "scratch"),
        Txn("scratch", vec![put(b"scratch-key", b"s".to_vec())]),
        Drop("scratch"),
        Checkpoint,
        // A small change: this checkpoint's metadata is a delta on the previous base.
        Txn("dev", vec![put(&key(9), b"dev-9".to_vec())]),
        Checkpoint,
        // From here on, only in the WAL.
        Txn(
            "main",
            vec![
                put(b"wal-key", b"from-wal".to_vec()),
                put(b"big-wal", value(3, 1500)),
                del(&key(7)),
            ],
        ),
        Snapshot("dev", "snap-b"),
        Txn("dev", vec![put(&key(8), b"dev-8-wal".to_vec())]),
        Branch("dev", "tmp"),
        Txn("tmp", vec![put(b"tmp-key", b"t".to_vec())]),
        Drop("tmp"),
    ]
}

type Model = BTreeMap<String, (VersionKind, BTreeMap<Vec<u8>, Vec<u8>>)>;

/// What the image must hold: the script applied to a model.
fn expected() -> Model {
    let mut m: Model = BTreeMap::new();
    m.insert("main".into(), (VersionKind::Branch, BTreeMap::new()));
    for step in steps() {
        match step {
            Step::Txn(branch, ops) => {
                let (_, kv) = m.get_mut(branch).expect("script names a live branch");
                for (k, v) in ops {
                    match v {
                        Some(v) => kv.insert(k, v),
                        None => kv.remove(&k),
                    };
                }
            }
            Step::Snapshot(src, name) => {
                let kv = m[src].1.clone();
                m.insert(name.into(), (VersionKind::Snapshot, kv));
            }
            Step::Branch(src, name) => {
                let kv = m[src].1.clone();
                m.insert(name.into(), (VersionKind::Branch, kv));
            }
            Step::Drop(name) => {
                m.remove(name);
            }
            Step::Checkpoint => {}
        }
    }
    m
}

/// Checks every version of `store` against the model: the same versions, of the same
/// kinds, with exactly the same keys and values.
fn check(store: &Store, model: &Model, when: &str) {
    let versions = store.versions().expect("versions");
    let got: BTreeMap<String, VersionKind> =
        versions.iter().map(|v| (v.name.clone(), v.kind)).collect();
    let want: BTreeMap<String, VersionKind> = model
        .iter()
        .map(|(n, (kind, _))| (n.clone(), *kind))
        .collect();
    assert_eq!(got, want, "{when}: versions");
    for (name, (_, kv)) in model {
        let read = store.read_at(name).expect("read_at");
        let all: BTreeMap<Vec<u8>, Vec<u8>> = read
            .range(..)
            .expect("range")
            .collect::<Result<_, _>>()
            .expect("iterate");
        assert_eq!(all.len(), kv.len(), "{when}: number of keys in {name}");
        assert!(all == *kv, "{when}: contents of {name} differ");
        for (k, v) in kv {
            assert_eq!(
                read.get(k).expect("get").as_ref(),
                Some(v),
                "{when}: {name} {}",
                String::from_utf8_lossy(k)
            );
        }
    }
}

/// One WAL record, read by docs/FORMAT.md's framing.
struct Record {
    lsn: u64,
    kind: u8,
    end: usize,
}

/// The valid records at the start of log file `bytes` of generation `gen`, read with
/// the documented framing: `len u32 | crc u32 | lsn u64 | synced_lsn u64 | kind u8 |
/// 3 zero bytes | payload`, the crc being CRC-32C over the generation (u64 LE), header
/// bytes 8..28 and the payload.
fn wal_records(bytes: &[u8], gen: u64) -> Vec<Record> {
    const HEADER: usize = 28;
    let mut out = Vec::new();
    let mut pos = 0;
    while let Some(h) = bytes.get(pos..pos + HEADER) {
        let len = u32::from_le_bytes(h[0..4].try_into().unwrap()) as usize;
        let stored = u32::from_le_bytes(h[4..8].try_into().unwrap());
        let Some(payload) = bytes.get(pos + HEADER..pos + HEADER + len) else {
            break;
        };
        let c = crc32c::crc32c(&gen.to_le_bytes());
        let c = crc32c::crc32c_append(c, &h[8..]);
        let c = crc32c::crc32c_append(c, payload);
        if len < 8 || h[25..28] != [0, 0, 0] || c != stored {
            break;
        }
        pos += HEADER + len;
        out.push(Record {
            lsn: u64::from_le_bytes(h[8..16].try_into().unwrap()),
            kind: h[24],
            end: pos,
        });
    }
    out
}

/// The WAL generation of a log file name, `wal-<16 hex digits>.log`.
fn wal_gen(name: &str) -> Option<u64> {
    let hex = name.strip_prefix("wal-")?.strip_suffix(".log")?;
    u64::from_str_radix(hex, 16).ok()
}

fn image_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(IMAGE)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

#[test]
fn image_opens_with_every_version_intact() {
    let image = image_dir();
    assert!(
        image.join("superblock").exists(),
        "{} is missing (see the top of tests/format_image.rs)",
        image.display()
    );
    let model = expected();

    // The checked-in log, read by the documented framing: records past the last
    // checkpoint, consecutive LSNs, batches and version records among them.
    let mut logged = Vec::new();
    for entry in std::fs::read_dir(&image).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if let Some(gen) = wal_gen(&name) {
            let bytes = std::fs::read(image.join(&name)).unwrap();
            let records = wal_records(&bytes, gen);
            assert_eq!(
                records.last().map_or(0, |r| r.end),
                bytes.len(),
                "{name} holds bytes past its last valid record"
            );
            logged.extend(records.iter().map(|r| (r.lsn, r.kind)));
        }
    }
    logged.sort();
    assert!(
        logged.windows(2).all(|w| w[1].0 == w[0].0 + 1),
        "{logged:?}"
    );
    assert!(logged.iter().any(|&(_, kind)| kind == 1), "no batch record");
    assert!(
        logged.iter().any(|&(_, kind)| kind == 3),
        "no version record"
    );

    // The newest superblock slot names a delta blob (kind 2 at byte 4 of the metadata
    // header), read by the documented layouts: the chain is pinned, not just a base.
    let sb = std::fs::read(image.join("superblock")).unwrap();
    let slot = [0usize, 4096]
        .into_iter()
        .max_by_key(|&o| u64::from_le_bytes(sb[o + 16..o + 24].try_into().unwrap()))
        .unwrap();
    let addr = u64::from_le_bytes(sb[slot + 40..slot + 48].try_into().unwrap());
    let seg = std::fs::read(image.join(format!("seg-{:08x}.dat", addr >> 40))).unwrap();
    let at = (addr & ((1 << 40) - 1)) as usize;
    assert_eq!(&seg[at..at + 4], b"CMET");
    assert_eq!(seg[at + 4], 2, "the newest metadata blob is not a delta");

    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    copy_dir(&image, &store_dir);

    // Read-only first, so the checked-in files are read exactly as they are.
    {
        let opts = Options {
            read_only: true,
            ..Default::default()
        };
        let store = Store::open_with(&store_dir, opts).expect("read-only open of the image");
        check(&store, &model, "read-only");
        let report = store.verify().expect("verify");
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        assert!(!report.wal_torn_tail);
        assert!(report.wal_records > 0 && report.wal_records <= logged.len() as u64);
        store.close().unwrap();
    }
    // Writable: replay, then a checkpoint of the current code on top of the image.
    {
        let store = Store::open(&store_dir).expect("open of the image");
        check(&store, &model, "open");
        let report = store.verify().expect("verify");
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        store.checkpoint().unwrap();
        check(&store, &model, "after a checkpoint");
        store.close().unwrap();
    }
    let store = Store::open(&store_dir).expect("reopen");
    check(&store, &model, "reopen");
    let report = store.verify().expect("verify");
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

/// `tests/data/format-v3/`, written by the previous format, is refused with a
/// format-version error (not corruption, and nothing is changed on disk).
#[test]
fn previous_format_is_refused() {
    let old = Path::new(env!("CARGO_MANIFEST_DIR")).join(OLD_IMAGE);
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    copy_dir(&old, &store_dir);
    let before = std::fs::read(store_dir.join("superblock")).unwrap();
    for read_only in [true, false] {
        let opts = Options {
            read_only,
            ..Default::default()
        };
        let err = Store::open_with(&store_dir, opts).expect_err("a version-3 store opened");
        assert!(
            matches!(err, cambium::Error::FormatVersion { .. }),
            "{err:?}"
        );
    }
    assert_eq!(std::fs::read(store_dir.join("superblock")).unwrap(), before);
}

/// Rebuilds `tests/data/format-v4/` from [`steps`]. Run it only on purpose (see the
/// top of this file).
// Ignored on purpose: running it overwrites the checked-in image, which would make the
// format test pass against whatever the code writes today. Regenerate only after a
// deliberate format change (FORMAT_VERSION bumped, migration or refusal written):
// `cargo test --release --test format_image -- --ignored regenerate_image`.
#[test]
#[ignore = "rewrites the checked-in image; run on purpose only"]
fn regenerate_image() {
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    let opts = Options {
        background_checkpoints: false,
        checkpoint_on_close: false,
        checkpoint_interval: None,
        checkpoint_wal_bytes: u64::MAX,
        checkpoint_dirty_bytes: u64::MAX,
        ..Default::default()
    };
    let store = Store::create_with(&store_dir, opts).unwrap();
    for step in steps() {
        match step {
            Step::Txn(branch, ops) => {
                let mut txn = store.begin_write_on(branch).unwrap();
                for (k, v) in ops {
                    match v {
                        Some(v) => txn.put(&k, &v).unwrap(),
                        None => assert!(txn.delete(&k).unwrap()),
                    }
                }
                txn.commit().unwrap();
            }
            Step::Snapshot(src, name) => store.snapshot(src, name).unwrap(),
            Step::Branch(src, name) => store.branch(src, name).unwrap(),
            Step::Drop(name) => store.drop_version(name).unwrap(),
            Step::Checkpoint => store.checkpoint().unwrap(),
        }
    }
    check(&store, &expected(), "generated");
    // Every commit is durable already; closing without a checkpoint leaves the last
    // steps in the WAL only.
    store.close().unwrap();

    let image = image_dir();
    if image.exists() {
        std::fs::remove_dir_all(&image).unwrap();
    }
    std::fs::create_dir_all(&image).unwrap();
    for entry in std::fs::read_dir(&store_dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let bytes = std::fs::read(store_dir.join(&name)).unwrap();
        let bytes = if let Some(gen) = wal_gen(&name) {
            // Cut after the last valid record: what follows is preallocated zeros or,
            // in a recycled file, records of an older generation (another salt), and
            // recovery stops at either.
            let end = wal_records(&bytes, gen).last().map_or(0, |r| r.end);
            bytes[..end].to_vec()
        } else if name == "superblock" || name.starts_with("seg-") {
            bytes
        } else {
            continue; // LOCK, wal-spare.log, reserve
        };
        std::fs::write(image.join(&name), bytes).unwrap();
    }
}
