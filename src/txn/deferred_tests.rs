//! The deferred-edit buffer and its runs against a sorted map: random edits with a
//! budget small enough for many runs, looked up and merged from random starts; and
//! damaged runs, which must fail with a corruption error, never give a wrong edit.

use super::*;
use crate::format::Addr;
use crate::io::sim::{SimVfs, SplitMix};
use std::collections::BTreeMap;

fn key(rng: &mut SplitMix, space: u64) -> Vec<u8> {
    // Variable lengths, so that keys of one length prefix others.
    let k = rng.next_u64() % space;
    format!("{k:0width$}", width = 1 + (k % 7) as usize).into_bytes()
}

fn edit(rng: &mut SplitMix) -> Edit {
    match rng.next_u64() % 4 {
        0 => Edit::Delete,
        1 => Edit::Extent(BlockRef {
            addr: Addr(rng.next_u64() >> 8),
            len: (rng.next_u64() % 70_000) as u32,
            crc: rng.next_u64() as u32,
        }),
        _ => {
            let len = (rng.next_u64() % 300) as usize;
            Edit::Put(vec![(rng.next_u64() % 251) as u8; len].into())
        }
    }
}

/// A buffer with a few KiB of budget, filled with `count` random edits, and the
/// model of what it must hold.
fn filled(seed: u64, count: usize, space: u64) -> (Arc<SimVfs>, Deferred, BTreeMap<Vec<u8>, Edit>) {
    let sim = Arc::new(SimVfs::new());
    let vfs: Arc<dyn Vfs> = sim.clone();
    let mut d = Deferred::new(vfs, 4 << 10);
    let mut model = BTreeMap::new();
    let mut rng = SplitMix(seed);
    for _ in 0..count {
        let (k, e) = (key(&mut rng, space), edit(&mut rng));
        d.push(&k, e.clone()).unwrap();
        model.insert(k, e);
    }
    (sim, d, model)
}

fn merged(d: &Deferred, start: &[u8]) -> Result<Vec<(Vec<u8>, Edit)>> {
    let mut m = d.merged_from(start)?;
    let mut out = Vec::new();
    while let Some((k, e)) = m.current() {
        out.push((k.to_vec(), e.to_owned()));
        m.advance()?;
    }
    Ok(out)
}

#[test]
fn lookups_and_merges_match_a_sorted_map() {
    for seed in 0..8 {
        let (_sim, d, model) = filled(seed, 3_000, 2_000);
        assert!(d.run_count() >= 5, "seed {seed}: {} runs", d.run_count());
        let mut rng = SplitMix(seed ^ 0xabc);
        for _ in 0..500 {
            let k = key(&mut rng, 2_500);
            assert_eq!(
                d.get(&k).unwrap(),
                model.get(&k).cloned(),
                "seed {seed} key {k:?}"
            );
        }
        for start in [
            Vec::new(),
            key(&mut rng, 2_500),
            key(&mut rng, 2_500),
            b"~".to_vec(),
        ] {
            let want: Vec<(Vec<u8>, Edit)> = model
                .range(start.clone()..)
                .map(|(k, e)| (k.clone(), e.clone()))
                .collect();
            assert_eq!(
                merged(&d, &start).unwrap(),
                want,
                "seed {seed} from {start:?}"
            );
        }
    }
}

#[test]
fn runs_are_removed_with_their_transaction_and_by_an_open() {
    let (sim, d, _) = filled(1, 2_000, 1_000);
    let runs = |sim: &SimVfs| {
        sim.list()
            .unwrap()
            .into_iter()
            .filter(|n| is_run_name(n))
            .count()
    };
    assert_eq!(runs(&sim), d.run_count());
    assert!(runs(&sim) > 0);
    drop(d);
    assert_eq!(runs(&sim), 0);

    // Left behind by a crash: removed by the next writable open, nothing else is.
    for name in ["txn-00000007.run", "txn-12.run"] {
        sim.create(name).unwrap().write_all_at(b"junk", 0).unwrap();
    }
    sim.create("txn-x.run").unwrap();
    remove_stale_runs(&*sim).unwrap();
    let mut left = sim.list().unwrap();
    left.sort();
    assert_eq!(left, ["txn-x.run"]);
}

#[test]
fn a_damaged_run_gives_a_corruption_error_never_a_wrong_edit() {
    let mut rng = SplitMix(99);
    for round in 0..40 {
        let (sim, d, model) = filled(round, 1_500, 800);
        let names: Vec<String> = sim
            .list()
            .unwrap()
            .into_iter()
            .filter(|n| is_run_name(n))
            .collect();
        let name = &names[(rng.next_u64() % names.len() as u64) as usize];
        let len = sim.open(name).unwrap().len().unwrap();
        let at = rng.next_u64() % len;
        assert!(sim.corrupt(name, at, 1 + (rng.next_u64() % 255) as u8));
        for (k, e) in &model {
            match d.get(k) {
                Ok(got) => assert_eq!(got.as_ref(), Some(e), "round {round} key {k:?}"),
                Err(err) => assert!(err.is_corruption(), "{err}"),
            }
        }
        // A merge reads every block: it must report the damage.
        match merged(&d, &[]) {
            Ok(all) => panic!(
                "round {round}: a merge over a damaged block read {} edits",
                all.len()
            ),
            Err(err) => assert!(err.is_corruption(), "{err}"),
        }
    }
}
