//! Versions through the API: snapshots, branches, drop, diff and the space they use,
//! checked against a model (one `BTreeMap` per version) with checkpoints, reopens and
//! `verify` (which recomputes reference counts and live bytes from a full walk).

mod common;

use cambium::io::sim::SimVfs;
use cambium::{Change, Error, Store, VersionKind};
use common::*;
use std::collections::BTreeMap;

type Versions = BTreeMap<String, (VersionKind, Model)>;

fn check_all(store: &Store, model: &Versions, when: &str) -> Result<(), String> {
    let mut names: Vec<String> = ctx(store.versions(), "versions")?
        .into_iter()
        .map(|v| v.name)
        .collect();
    names.sort();
    let want: Vec<String> = model.keys().cloned().collect();
    if names != want {
        return Err(format!("{when}: versions {names:?}, model has {want:?}"));
    }
    for (name, (_, m)) in model {
        let got = ctx(dump(&ctx(store.read_at(name), "read_at")?), "dump")?;
        if let Some(d) = diff(&got, m) {
            return Err(format!("{when}: version {name}: {d}"));
        }
    }
    Ok(())
}

fn model_diff(a: &Model, b: &Model) -> Vec<Change> {
    let mut out = Vec::new();
    let keys: std::collections::BTreeSet<&Vec<u8>> = a.keys().chain(b.keys()).collect();
    for k in keys {
        match (a.get(k), b.get(k)) {
            (Some(o), None) => out.push(Change::Removed {
                key: k.clone(),
                old: o.clone(),
            }),
            (None, Some(v)) => out.push(Change::Added {
                key: k.clone(),
                value: v.clone(),
            }),
            (Some(o), Some(n)) if o != n => out.push(Change::Changed {
                key: k.clone(),
                old: o.clone(),
                new: n.clone(),
            }),
            _ => {}
        }
    }
    out
}

/// How the store under test is configured.
#[derive(Clone, Copy)]
enum Setup {
    /// Defaults: the tree stays pinned in memory (it fits the cache).
    Pinned,
    /// A tiny cache, so written trees are named by address and reloaded.
    SmallCache,
    /// A tiny cache and background checkpoints every few KiB of dirty nodes, so
    /// writes, clones and drops meet checkpoints in flight.
    Background,
}

fn options(vfs: &SimVfs, setup: Setup) -> cambium::Options {
    let mut o = sim_options(vfs);
    match setup {
        Setup::Pinned => {}
        Setup::SmallCache => o.cache_bytes = 16 << 10,
        Setup::Background => {
            o.cache_bytes = 16 << 10;
            o.background_checkpoints = true;
            o.checkpoint_dirty_bytes = 32 << 10;
            o.checkpoint_interval = Some(std::time::Duration::from_millis(5));
        }
    }
    o
}

fn random_ops(seed: u64, setup: Setup) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let mut vfs = SimVfs::new();
    let open = |vfs: &SimVfs| Store::open_with(SIM_PATH, options(vfs, setup));
    let mut store = ctx(Store::create_with(SIM_PATH, options(&vfs, setup)), "create")?;
    let mut model: Versions = BTreeMap::new();
    model.insert("main".into(), (VersionKind::Branch, Model::new()));
    let mut next = 0;
    for step in 0..600 {
        let names: Vec<String> = model.keys().cloned().collect();
        let name = rng.pick(&names).clone();
        match rng.below(20) {
            0..=9 => {
                if model[&name].0 != VersionKind::Branch {
                    let mut txn = ctx(store.begin_write_on(&name).map(|_| ()), "x").err();
                    if txn.take().is_none() {
                        return Err(format!("step {step}: write to snapshot {name} allowed"));
                    }
                    continue;
                }
                let mut txn = ctx(store.begin_write_on(&name), "begin")?;
                let m = &mut model.get_mut(&name).expect("exists").1;
                let mut shadow = m.clone();
                for _ in 0..rng.usize(1, 40) {
                    if rng.chance(3, 4) || shadow.is_empty() {
                        let k = gen_key(&mut rng, &shadow);
                        let v = gen_value(&mut rng);
                        ctx(txn.put(&k, &v), "put")?;
                        shadow.insert(k, v);
                    } else {
                        let k = gen_key(&mut rng, &shadow);
                        let existed = ctx(txn.delete(&k), "delete")?;
                        if existed != shadow.remove(&k).is_some() {
                            return Err(format!("step {step}: delete result wrong"));
                        }
                    }
                }
                if rng.chance(1, 8) {
                    txn.abort();
                } else {
                    ctx(txn.commit(), "commit")?;
                    *m = shadow;
                }
            }
            10..=12 => {
                next += 1;
                let new = format!("v{next}");
                let snapshot = rng.chance(1, 2);
                let kind = if snapshot {
                    ctx(store.snapshot(&name, &new), "snapshot")?;
                    VersionKind::Snapshot
                } else {
                    ctx(store.branch(&name, &new), "branch")?;
                    VersionKind::Branch
                };
                let m = model[&name].1.clone();
                model.insert(new, (kind, m));
            }
            13 | 14 if model.len() > 1 => {
                ctx(store.drop_version(&name), "drop")?;
                model.remove(&name);
                if rng.chance(1, 2) {
                    ctx(store.finish_drops(), "finish_drops")?;
                }
            }
            15 => {
                let other = rng.pick(&names).clone();
                let got: Vec<Change> = ctx(store.diff(&name, &other), "diff")?
                    .collect::<Result<_, _>>()
                    .map_err(|e| format!("diff: {e}"))?;
                let want = model_diff(&model[&name].1, &model[&other].1);
                if got != want {
                    return Err(format!(
                        "step {step}: diff {name} {other}: {} changes, want {}",
                        got.len(),
                        want.len()
                    ));
                }
            }
            16 => {
                ctx(store.checkpoint(), "checkpoint")?;
                verify_clean(&store, &format!("step {step} after checkpoint"))?;
            }
            17 => {
                ctx(store.close(), "close")?;
                store = ctx(open(&vfs), "reopen")?;
                check_all(&store, &model, &format!("step {step} after reopen"))?;
            }
            18 => {
                // Power loss with the store open: unsynced writes are dropped or torn.
                let crashed = vfs.crash(rng.next());
                drop(store);
                vfs = crashed;
                store = ctx(open(&vfs), "open after crash")?;
                check_all(&store, &model, &format!("step {step} after crash"))?;
                verify_clean(&store, &format!("step {step} after crash"))?;
            }
            _ => {
                let got = ctx(dump(&ctx(store.read_at(&name), "read_at")?), "dump")?;
                if let Some(d) = diff(&got, &model[&name].1) {
                    return Err(format!("step {step}: version {name}: {d}"));
                }
            }
        }
    }
    check_all(&store, &model, "end")?;
    ctx(store.checkpoint(), "final checkpoint")?;
    verify_clean(&store, "end")?;
    Ok(())
}

#[test]
fn random_versions_against_a_model() {
    run_seeds("random_versions_against_a_model", "versions", 8, |s| {
        random_ops(s, Setup::Pinned)
    });
}

#[test]
fn random_versions_small_cache() {
    run_seeds("random_versions_small_cache", "versions", 8, |s| {
        random_ops(s, Setup::SmallCache)
    });
}

#[test]
fn random_versions_with_background_checkpoints() {
    run_seeds(
        "random_versions_with_background_checkpoints",
        "versions",
        8,
        |s| random_ops(s, Setup::Background),
    );
}

#[test]
fn snapshot_is_isolated_and_drop_frees_everything() {
    let vfs = SimVfs::new();
    let store = create_sim(&vfs);
    let mut txn = store.begin_write().unwrap();
    for i in 0..5000u32 {
        txn.put(format!("k{i:06}").as_bytes(), &[7u8; 60]).unwrap();
    }
    txn.put(b"big", &vec![1u8; 5000]).unwrap();
    txn.commit().unwrap();
    store.checkpoint().unwrap();
    let live0 = store.stats().unwrap().live_bytes;

    store.snapshot("main", "s1").unwrap();
    store.branch("s1", "b1").unwrap();
    store.put(b"k000010", b"changed").unwrap();
    let mut txn = store.begin_write_on("b1").unwrap();
    txn.put(b"new", b"x").unwrap();
    txn.put(b"big", &vec![2u8; 5000]).unwrap();
    txn.delete(b"k000020").unwrap();
    txn.commit().unwrap();
    assert!(matches!(
        store.begin_write_on("s1").map(|_| ()),
        Err(Error::ReadOnly(_))
    ));
    assert!(matches!(
        store.snapshot("main", "s1"),
        Err(Error::VersionExists(_))
    ));
    assert!(matches!(
        store.snapshot("nope", "s2"),
        Err(Error::VersionNotFound(_))
    ));
    assert!(matches!(
        store.snapshot("main", "bad name"),
        Err(Error::InvalidVersionName(_))
    ));
    assert_eq!(
        store.read_at("s1").unwrap().get(b"k000010").unwrap(),
        Some(vec![7u8; 60])
    );
    let d: Vec<Change> = store
        .diff("s1", "b1")
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(d.len(), 3, "{d:?}");
    store.checkpoint().unwrap();
    let report = store.verify().unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    let infos = store.versions().unwrap();
    let s1 = infos.iter().find(|v| v.name == "s1").unwrap();
    assert_eq!(s1.keys, 5001);
    assert_eq!(s1.parent.as_deref(), Some("main"));

    store.drop_version("s1").unwrap();
    store.drop_version("b1").unwrap();
    store.checkpoint().unwrap();
    let report = store.verify().unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    // Only main's one changed leaf path differs from the start.
    let live1 = store.stats().unwrap().live_bytes;
    let main = &store.versions().unwrap()[0];
    assert_eq!(main.exclusive_bytes, main.referenced_bytes);
    assert_eq!(live1, main.referenced_bytes, "live {live0} -> {live1}");
}

#[test]
fn deferred_snapshot_is_durable_with_the_next_immediate_commit() {
    let vfs = SimVfs::new();
    let store = create_sim(&vfs);
    store.put(b"a", b"1").unwrap();
    store
        .snapshot_with("main", "quick", cambium::Durability::Deferred)
        .unwrap();
    // Visible at once.
    assert_eq!(
        store.read_at("quick").unwrap().get(b"a").unwrap(),
        Some(b"1".to_vec())
    );
    store.put(b"a", b"2").unwrap(); // Immediate: syncs the snapshot's record too
    let crashed = vfs.crash(7);
    drop(store);
    let store = open_sim(&crashed).unwrap();
    assert_eq!(
        store.read_at("quick").unwrap().get(b"a").unwrap(),
        Some(b"1".to_vec())
    );
    assert_eq!(store.get(b"a").unwrap(), Some(b"2".to_vec()));
    let report = store.verify().unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

#[test]
fn drop_interrupted_by_power_loss_resumes_without_leak_or_double_free() {
    for seed in 0..20 {
        let vfs = SimVfs::new();
        let opts = cambium::Options {
            cache_bytes: 16 << 10,
            ..sim_options(&vfs)
        };
        // Every commit runs a checkpoint inline (without finishing drops first, as an
        // explicit `checkpoint()` would).
        let eager = cambium::Options {
            checkpoint_dirty_bytes: 1,
            ..opts.clone()
        };
        let store = Store::create_with(SIM_PATH, opts.clone()).unwrap();
        let mut txn = store.begin_write().unwrap();
        for i in 0..3000u32 {
            txn.put(format!("key{i:05}").as_bytes(), &[3u8; 200])
                .unwrap();
        }
        txn.commit().unwrap();
        store.checkpoint().unwrap();
        let live_before = store.stats().unwrap().live_bytes;
        store.branch("main", "b").unwrap();
        let mut txn = store.begin_write_on("b").unwrap();
        for i in (0..3000u32).step_by(3) {
            txn.put(format!("key{i:05}").as_bytes(), &[4u8; 200])
                .unwrap();
        }
        txn.commit().unwrap();
        store.checkpoint().unwrap();
        store.close().unwrap();
        let store = Store::open_with(SIM_PATH, eager.clone()).unwrap();
        store.drop_version("b").unwrap();
        // Part of the walk, maybe a checkpoint with the queue half done (a commit on
        // main checkpoints), more of the walk, then power loss.
        for _ in 0..seed % 5 {
            store.drop_step(1).unwrap();
        }
        if seed % 2 == 0 {
            store.put(b"key00000", &[3u8; 200]).unwrap();
            assert!(store.stats().unwrap().drop_pending_nodes > 0, "seed {seed}");
        }
        store.drop_step(2).unwrap();
        let crashed = vfs.crash(seed);
        drop(store);
        let store = Store::open_with(
            SIM_PATH,
            cambium::Options {
                vfs: Some(std::sync::Arc::new(crashed)),
                ..opts.clone()
            },
        )
        .unwrap();
        let report = store.verify().unwrap();
        assert!(report.is_clean(), "seed {seed}: {:?}", report.problems);
        assert!(store.read_at("b").is_err(), "seed {seed}: b came back");
        store.checkpoint().unwrap();
        let report = store.verify().unwrap();
        assert!(report.is_clean(), "seed {seed}: {:?}", report.problems);
        assert_eq!(
            store.stats().unwrap().live_bytes,
            live_before,
            "seed {seed}"
        );
        assert_eq!(store.read().unwrap().count(..).unwrap(), 3000);
    }
}
