//! Versions through the API: snapshots, branches, drop, diff and the space they use,
//! checked against a model (one `BTreeMap` per version, plus the parent links) with
//! checkpoints, reopens, power loss and `verify` (which recomputes reference counts and
//! live bytes from a full walk). Space accounting is checked against what dropping
//! actually frees: a dropped version's `exclusive_bytes` is what live bytes fall by,
//! clones made and all dropped again leave live bytes exactly where they were, and
//! each run ends by dropping every version down to zero live bytes.

mod common;

use cambium::io::sim::SimVfs;
use cambium::{Change, Error, Store, VersionKind};
use common::*;
use std::collections::BTreeMap;

type Versions = BTreeMap<String, (VersionKind, Model)>;

/// The version each version was made from, as `versions()` must report it: a drop
/// re-links the versions made from the dropped one to its parent.
type Parents = BTreeMap<String, Option<String>>;

fn check_all(store: &Store, model: &Versions, parents: &Parents, when: &str) -> Result<(), String> {
    let infos = ctx(store.versions(), "versions")?;
    let mut names: Vec<String> = infos.iter().map(|v| v.name.clone()).collect();
    names.sort();
    let want: Vec<String> = model.keys().cloned().collect();
    if names != want {
        return Err(format!("{when}: versions {names:?}, model has {want:?}"));
    }
    for v in &infos {
        let (kind, m) = &model[&v.name];
        if v.kind != *kind || v.keys != m.len() as u64 {
            return Err(format!(
                "{when}: version {}: {:?} with {} keys, model has {kind:?} with {}",
                v.name,
                v.kind,
                v.keys,
                m.len()
            ));
        }
        if v.parent != parents[&v.name] {
            return Err(format!(
                "{when}: version {}: parent {:?}, model has {:?}",
                v.name, v.parent, parents[&v.name]
            ));
        }
        if v.exclusive_bytes > v.referenced_bytes {
            return Err(format!(
                "{when}: version {}: {} bytes exclusive but only {} referenced",
                v.name, v.exclusive_bytes, v.referenced_bytes
            ));
        }
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
        Setup::SmallCache => {
            o.cache_bytes = 16 << 10;
            // Transactions spill their nodes (and some of them abort) all the time.
            o.txn_dirty_bytes = 2 << 10;
        }
        Setup::Background => {
            o.cache_bytes = 16 << 10;
            o.background_checkpoints = true;
            o.checkpoint_dirty_bytes = 32 << 10;
            o.checkpoint_interval = Some(std::time::Duration::from_millis(5));
        }
    }
    o
}

/// The store under test and its model.
struct Run {
    setup: Setup,
    rng: Rng,
    vfs: SimVfs,
    /// `None` only while it is being reopened.
    store: Option<Store>,
    model: Versions,
    parents: Parents,
    /// Versions made so far (the next one is named `v{made + 1}`).
    made: usize,
}

impl Run {
    fn store(&self) -> &Store {
        self.store.as_ref().expect("open")
    }

    fn open(&mut self, what: &str) -> Result<(), String> {
        let store = Store::open_with(SIM_PATH, options(&self.vfs, self.setup));
        self.store = Some(ctx(store, what)?);
        Ok(())
    }

    fn reopen(&mut self, when: &str) -> Result<(), String> {
        // The listing after a reopen (nothing remembered) equals the one before
        // (subtree totals remembered from earlier calls), once the close's
        // reclamation has run.
        ctx(self.store().finish_drops(), "finish_drops")?;
        ctx(self.store().checkpoint(), "checkpoint")?;
        let before = ctx(self.store().versions(), "versions")?;
        ctx(self.store.take().expect("open").close(), "close")?;
        self.open("reopen")?;
        let after = ctx(self.store().versions(), "versions")?;
        if before != after {
            return Err(format!(
                "{when}: versions() {before:?} before the reopen, {after:?} after"
            ));
        }
        check_all(self.store(), &self.model, &self.parents, when)
    }

    /// Power loss with the store open: unsynced writes are dropped or torn.
    fn power_loss(&mut self, when: &str) -> Result<(), String> {
        let crashed = self.vfs.crash(self.rng.next());
        drop(self.store.take());
        self.vfs = crashed;
        self.open("open after crash")?;
        check_all(self.store(), &self.model, &self.parents, when)?;
        verify_clean(self.store(), when)
    }

    /// Makes a snapshot or a branch of `source`; returns its name.
    fn clone_version(&mut self, source: &str) -> Result<String, String> {
        self.made += 1;
        let new = format!("v{}", self.made);
        let kind = if self.rng.chance(1, 2) {
            ctx(self.store().snapshot(source, &new), "snapshot")?;
            VersionKind::Snapshot
        } else {
            ctx(self.store().branch(source, &new), "branch")?;
            VersionKind::Branch
        };
        let m = self.model[source].1.clone();
        self.model.insert(new.clone(), (kind, m));
        self.parents.insert(new.clone(), Some(source.to_owned()));
        Ok(new)
    }

    /// A transaction of random puts and deletes on `name` (a branch), committed or
    /// (sometimes) aborted.
    fn write(&mut self, name: &str, step: usize) -> Result<(), String> {
        let rng = &mut self.rng;
        let store = self.store.as_ref().expect("open");
        let mut txn = ctx(store.begin_write_on(name), "begin")?;
        let m = &mut self.model.get_mut(name).expect("exists").1;
        let mut shadow = m.clone();
        for _ in 0..rng.usize(1, 40) {
            if rng.chance(3, 4) || shadow.is_empty() {
                let k = gen_key(rng, &shadow);
                let v = gen_value(rng);
                ctx(txn.put(&k, &v), "put")?;
                shadow.insert(k, v);
            } else {
                let k = gen_key(rng, &shadow);
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
        Ok(())
    }

    /// Drops `name`; for `main`, the default branch, checks that the drop is refused
    /// and changes nothing (returns `false`).
    fn drop_version(&mut self, name: &str, step: usize) -> Result<bool, String> {
        if name == cambium::MAIN_BRANCH {
            let listed = ctx(self.store().versions(), "versions")?;
            if !matches!(
                self.store().drop_version(name),
                Err(Error::DefaultBranch(_))
            ) {
                return Err(format!("step {step}: dropping main was not refused"));
            }
            if ctx(self.store().versions(), "versions")? != listed {
                return Err(format!(
                    "step {step}: a refused drop of main changed the versions"
                ));
            }
            return Ok(false);
        }
        ctx(self.store().drop_version(name), "drop")?;
        let parent = self.parents.remove(name).expect("exists");
        for p in self.parents.values_mut() {
            if p.as_deref() == Some(name) {
                p.clone_from(&parent);
            }
        }
        self.model.remove(name);
        if !matches!(self.store().read_at(name), Err(Error::VersionNotFound(_))) {
            return Err(format!(
                "step {step}: dropped version {name} still readable"
            ));
        }
        Ok(true)
    }

    fn live_bytes(&self) -> Result<u64, String> {
        Ok(ctx(self.store().stats(), "stats")?.live_bytes)
    }

    /// Drops `name` on a checkpointed store and checks that the space it frees is
    /// what `versions()` said it held alone, and that no other version's space
    /// figures moved except by sharing less.
    fn drop_and_account(&mut self, name: &str, step: usize) -> Result<(), String> {
        // Unwritten nodes count at the size they will be written at: a checkpoint
        // changes no figure.
        ctx(self.store().finish_drops(), "finish_drops")?;
        let unwritten = ctx(self.store().versions(), "versions")?;
        ctx(self.store().checkpoint(), "checkpoint")?;
        let before = ctx(self.store().versions(), "versions")?;
        if unwritten != before {
            return Err(format!(
                "step {step}: a checkpoint changed versions() from {unwritten:?} to {before:?}"
            ));
        }
        let live0 = self.live_bytes()?;
        let gone = before.iter().find(|v| v.name == name).expect("listed");
        if self.model.len() == 1 && (gone.exclusive_bytes, gone.referenced_bytes) != (live0, live0)
        {
            return Err(format!(
                "step {step}: {name}, the only version, has {} bytes exclusive and {} \
                 referenced, but the store holds {live0} live bytes",
                gone.exclusive_bytes, gone.referenced_bytes
            ));
        }
        if !self.drop_version(name, step)? {
            return Ok(());
        }
        ctx(self.store().finish_drops(), "finish_drops")?;
        ctx(self.store().checkpoint(), "checkpoint")?;
        let live1 = self.live_bytes()?;
        if live0.checked_sub(live1) != Some(gone.exclusive_bytes) {
            return Err(format!(
                "step {step}: dropping {name} took live bytes from {live0} to {live1}, \
                 but versions() said it held {} bytes alone",
                gone.exclusive_bytes
            ));
        }
        let after = ctx(self.store().versions(), "versions")?;
        for v in &after {
            let b = before.iter().find(|b| b.name == v.name).expect("listed");
            if v.referenced_bytes != b.referenced_bytes || v.exclusive_bytes < b.exclusive_bytes {
                return Err(format!(
                    "step {step}: dropping {name} changed {}'s space from {}/{} to {}/{} \
                     (referenced/exclusive)",
                    v.name,
                    b.referenced_bytes,
                    b.exclusive_bytes,
                    v.referenced_bytes,
                    v.exclusive_bytes
                ));
            }
        }
        Ok(())
    }

    /// Cleans, defragments or shrinks a checkpointed store, sometimes with a power
    /// loss in the middle, and checks that nothing a user can see changed: every
    /// version's data, its referenced and exclusive bytes (so no sharing was lost),
    /// the live bytes, and `verify` (which recomputes counts and live bytes from a
    /// walk, so no block is both referenced and free).
    fn relocate_and_check(&mut self, step: usize) -> Result<(), String> {
        ctx(self.store().finish_drops(), "finish_drops")?;
        ctx(self.store().checkpoint(), "checkpoint")?;
        let before = ctx(self.store().versions(), "versions")?;
        let live0 = self.live_bytes()?;
        let names: Vec<String> = self.model.keys().cloned().collect();
        let which = self.rng.below(4);
        let crash_at = self.rng.chance(1, 3).then(|| self.rng.range(1, 150));
        self.vfs.set_fail_after(crash_at);
        let store = self.store.as_ref().expect("open");
        let (what, result) = match which {
            0 => {
                #[expect(clippy::cast_precision_loss, reason = "a small percentage")]
                let pct = self.rng.below(60) as f64;
                ("clean", store.clean(pct).map(|_| ()))
            }
            1 => {
                let name = self.rng.pick(&names).clone();
                ("defrag one", store.defrag(Some(&name)).map(|_| ()))
            }
            2 => ("defrag all", store.defrag(None).map(|_| ())),
            _ => ("shrink", store.shrink().map(|_| ())),
        };
        let when = format!("step {step} after {what}");
        if crash_at.is_some() {
            // Whether or not the fault hit the relocation, power fails now.
            self.vfs.set_fail_after(None);
            self.power_loss(&format!("{when} and a power loss"))?;
            ctx(self.store().finish_drops(), "finish_drops")?;
            ctx(self.store().checkpoint(), "checkpoint")?;
        } else {
            ctx(result, what)?;
            if what == "shrink" {
                let stats = ctx(self.store().stats(), "stats")?;
                // Every segment with dead bytes was emptied: what is dead now is
                // only what the shrink's own last checkpoints superseded (metadata
                // blobs, back-reference runs), a few KiB. (Segments with no dead
                // bytes stay as they are: with data kept apart from nodes, a data
                // segment of values never overwritten is one.)
                if stats.dead_bytes > 256 << 10 {
                    return Err(format!(
                        "{when}: {} dead bytes left in {} segments for {} live bytes",
                        stats.dead_bytes, stats.segments, stats.live_bytes
                    ));
                }
            }
        }
        let after = ctx(self.store().versions(), "versions")?;
        if after != before {
            return Err(format!(
                "{when}: versions() went from {before:?} to {after:?}"
            ));
        }
        let live1 = self.live_bytes()?;
        if live1 != live0 {
            return Err(format!("{when}: live bytes went from {live0} to {live1}"));
        }
        check_all(self.store(), &self.model, &self.parents, &when)?;
        verify_clean(self.store(), &when)
    }

    /// Clones of the current versions (and clones of those), written to, maybe
    /// across a reopen or a power loss, then all dropped: once a checkpoint is
    /// durable the store's live bytes are exactly what they were before the clones.
    fn clone_and_drop_all(&mut self, step: usize) -> Result<(), String> {
        ctx(self.store().checkpoint(), "checkpoint")?;
        let live0 = self.live_bytes()?;
        let mut sources: Vec<String> = self.model.keys().cloned().collect();
        let mut clones = Vec::new();
        for _ in 0..self.rng.usize(1, 6) {
            let source = self.rng.pick(&sources).clone();
            let new = self.clone_version(&source)?;
            sources.push(new.clone());
            clones.push(new);
            let writable: Vec<String> = clones
                .iter()
                .filter(|c| self.model[*c].0 == VersionKind::Branch)
                .cloned()
                .collect();
            if !writable.is_empty() && self.rng.chance(2, 3) {
                let target = self.rng.pick(&writable).clone();
                self.write(&target, step)?;
            }
        }
        match self.rng.below(4) {
            0 => self.reopen(&format!("step {step} reopen with clones"))?,
            1 => self.power_loss(&format!("step {step} crash with clones"))?,
            2 => ctx(self.store().checkpoint(), "checkpoint")?,
            _ => {}
        }
        while !clones.is_empty() {
            let i = self.rng.below(clones.len() as u64) as usize;
            let name = clones.swap_remove(i);
            self.drop_version(&name, step)?;
        }
        ctx(self.store().checkpoint(), "checkpoint")?;
        let live1 = self.live_bytes()?;
        if live1 != live0 {
            return Err(format!(
                "step {step}: live bytes {live0} before the clones, {live1} after dropping them"
            ));
        }
        verify_clean(
            self.store(),
            &format!("step {step} after dropping the clones"),
        )
    }
}

fn random_ops(seed: u64, setup: Setup) -> Result<(), String> {
    let vfs = SimVfs::new();
    let store = ctx(Store::create_with(SIM_PATH, options(&vfs, setup)), "create")?;
    let mut run = Run {
        setup,
        rng: Rng::new(seed),
        vfs,
        store: Some(store),
        model: BTreeMap::from([("main".to_owned(), (VersionKind::Branch, Model::new()))]),
        parents: BTreeMap::from([("main".to_owned(), None)]),
        made: 0,
    };
    for step in 0..800 {
        let names: Vec<String> = run.model.keys().cloned().collect();
        let name = run.rng.pick(&names).clone();
        match run.rng.below(52) {
            0..=19 => {
                if run.model[&name].0 != VersionKind::Branch {
                    if !matches!(run.store().begin_write_on(&name), Err(Error::ReadOnly(_))) {
                        return Err(format!("step {step}: write to snapshot {name} allowed"));
                    }
                    continue;
                }
                run.write(&name, step)?;
            }
            20..=29 => {
                run.clone_version(&name)?;
            }
            30..=33 if run.model.len() > 1 => {
                run.drop_version(&name, step)?;
                if run.rng.chance(1, 2) {
                    ctx(run.store().finish_drops(), "finish_drops")?;
                }
            }
            34 if run.model.len() > 1 => run.drop_and_account(&name, step)?,
            35 | 36 => {
                let other = run.rng.pick(&names).clone();
                let got: Vec<Change> = ctx(run.store().diff(&name, &other), "diff")?
                    .collect::<Result<_, _>>()
                    .map_err(|e| format!("diff: {e}"))?;
                let want = model_diff(&run.model[&name].1, &run.model[&other].1);
                if got != want {
                    return Err(format!(
                        "step {step}: diff {name} {other}: {} changes, want {}",
                        got.len(),
                        want.len()
                    ));
                }
            }
            37 | 38 => {
                ctx(run.store().checkpoint(), "checkpoint")?;
                verify_clean(run.store(), &format!("step {step} after checkpoint"))?;
            }
            39 | 40 => run.reopen(&format!("step {step} after reopen"))?,
            41 | 42 => run.power_loss(&format!("step {step} after crash"))?,
            43 => run.clone_and_drop_all(step)?,
            48..=50 => run.relocate_and_check(step)?,
            _ => {
                let got = ctx(dump(&ctx(run.store().read_at(&name), "read_at")?), "dump")?;
                if let Some(d) = diff(&got, &run.model[&name].1) {
                    return Err(format!("step {step}: version {name}: {d}"));
                }
            }
        }
    }
    // Typically 200 to 250 made, 60 to 100 left at the end.
    if run.made < 150 {
        return Err(format!("only {} versions made", run.made));
    }
    check_all(run.store(), &run.model, &run.parents, "end")?;
    ctx(run.store().checkpoint(), "final checkpoint")?;
    verify_clean(run.store(), "end")?;
    // Take the store apart one version at a time, each drop freeing what the listing
    // said the version held alone; `main`, which cannot be dropped, is left holding
    // everything, and once its keys are deleted nothing is left.
    while let Some(name) = {
        let names: Vec<String> = run.model.keys().filter(|n| *n != "main").cloned().collect();
        (!names.is_empty()).then(|| run.rng.pick(&names).clone())
    } {
        run.drop_and_account(&name, 800)?;
    }
    ctx(run.store().finish_drops(), "finish_drops")?;
    ctx(run.store().checkpoint(), "checkpoint")?;
    let live = run.live_bytes()?;
    let listed = ctx(run.store().versions(), "versions")?;
    if listed.len() != 1 || (listed[0].exclusive_bytes, listed[0].referenced_bytes) != (live, live)
    {
        return Err(format!(
            "main, the only version left, is listed as {listed:?} with {live} live bytes"
        ));
    }
    let mut txn = ctx(run.store().begin_write(), "begin")?;
    for key in run.model["main"].1.keys() {
        ctx(txn.delete(key), "delete")?;
    }
    ctx(txn.commit(), "commit")?;
    if let Some((_, keys)) = run.model.get_mut("main") {
        keys.clear();
    }
    ctx(run.store().checkpoint(), "checkpoint")?;
    if run.live_bytes()? != 0 {
        return Err(format!(
            "{} live bytes left with every version dropped and main emptied",
            run.live_bytes()?
        ));
    }
    verify_clean(run.store(), "all dropped")?;
    run.reopen("all dropped, reopened")?;
    verify_clean(run.store(), "all dropped, reopened")
}

#[test]
fn random_versions_against_a_model() {
    run_seeds("random_versions_against_a_model", "versions", 8, |s| {
        random_ops(s, Setup::Pinned)
    });
}

/// Seeds of [`random_versions_against_a_model`] that found bugs when run at 200 seeds
/// (2026-11-27), run by default: seeds 20, 71, 79, 108, 136, 171 and 180 found back
/// references hidden by a deleted segment that came back after a power loss
/// ([`a_deleted_segment_does_not_come_back_after_a_power_loss`]), seed 48 empty
/// nodes left after deletes
/// ([`deleting_every_key_of_large_entries_leaves_no_empty_node`]).
#[test]
fn random_versions_seeds_that_found_bugs() {
    let failed: Vec<String> = [20, 48, 71, 79, 108, 136, 171, 180]
        .into_iter()
        .filter_map(|seed| {
            random_ops(seed, Setup::Pinned)
                .err()
                .map(|e| format!("seed {seed}: {e}"))
        })
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
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

/// Loads `n` keys into main in batches and checkpoints.
fn load(store: &Store, n: u32) {
    for chunk in (0..n).collect::<Vec<_>>().chunks(50_000) {
        let mut txn = store.begin_write().unwrap();
        for &i in chunk {
            txn.put(
                format!("key{i:09}").as_bytes(),
                format!("value {i}").as_bytes(),
            )
            .unwrap();
        }
        txn.commit().unwrap();
    }
    store.checkpoint().unwrap();
}

#[test]
fn diff_reads_only_the_paths_to_the_changes() {
    let vfs = SimVfs::new();
    // A cache far smaller than the tree: nothing stays pinned, so every node the diff
    // looks at is a read that `read_count` sees.
    let opts = cambium::Options {
        cache_bytes: 64 << 10,
        ..sim_options(&vfs)
    };
    let store = Store::create_with(SIM_PATH, opts.clone()).unwrap();
    load(&store, 300_000);
    store.snapshot("main", "before").unwrap();
    store.put(b"key000123456", b"changed").unwrap();
    store.checkpoint().unwrap();
    store.close().unwrap();

    let store = Store::open_with(SIM_PATH, opts).unwrap();
    let reads = vfs.read_count();
    let changes: Vec<Change> = store
        .diff("before", "main")
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let diff_reads = vfs.read_count() - reads;
    let (nodes_in_tree, depth) = {
        let s = store.stats().unwrap();
        (s.leaf_nodes + s.branch_nodes, s.depth)
    };
    assert_eq!(
        changes,
        vec![Change::Changed {
            key: b"key000123456".to_vec(),
            old: b"value 123456".to_vec(),
            new: b"changed".to_vec(),
        }]
    );
    // The two paths from the roots to the changed leaves, nothing else, in a tree of
    // over a thousand nodes (the load is in key order, so its leaves are full).
    assert!(
        nodes_in_tree > 1000 && depth >= 3,
        "{nodes_in_tree} nodes, depth {depth}"
    );
    assert!(
        diff_reads <= 2 * u64::from(depth),
        "a one-key diff read {diff_reads} blocks of a {nodes_in_tree}-node tree of depth {depth}"
    );

    // Equal versions share their root: nothing to read at all.
    store.snapshot("main", "again").unwrap();
    let reads = vfs.read_count();
    assert_eq!(store.diff("main", "again").unwrap().count(), 0);
    assert_eq!(vfs.read_count() - reads, 0);
}

#[test]
fn snapshot_branch_and_drop_cost_the_same_whatever_the_size() {
    // The I/O a snapshot, a branch and a drop do in the foreground (a WAL record and
    // its fsync; the drop's walk happens later, in steps) is the same for a store of
    // ten keys and one of 100 000, and none of them reads a node.
    let mut costs = Vec::new();
    for n in [10, 100_000] {
        let vfs = SimVfs::new();
        let opts = cambium::Options {
            cache_bytes: 64 << 10,
            ..sim_options(&vfs)
        };
        let store = Store::create_with(SIM_PATH, opts.clone()).unwrap();
        load(&store, n);
        store.close().unwrap();
        let store = Store::open_with(SIM_PATH, opts).unwrap();
        let mut cost = Vec::new();
        let mut measure = |what: &str, f: &dyn Fn()| {
            let (reads, ops) = (vfs.read_count(), vfs.op_count());
            f();
            assert_eq!(vfs.read_count(), reads, "{what} read nodes (n = {n})");
            cost.push((what.to_owned(), vfs.op_count() - ops));
        };
        measure("snapshot", &|| store.snapshot("main", "s").unwrap());
        measure("branch", &|| store.branch("s", "b").unwrap());
        measure("drop", &|| store.drop_version("b").unwrap());
        measure("drop of a snapshot", &|| store.drop_version("s").unwrap());
        assert_eq!(
            store.stats().unwrap().drop_pending_nodes,
            0,
            "the roots were shared: nothing to walk"
        );
        costs.push(cost);
        let report = store.verify().unwrap();
        assert!(report.is_clean(), "{:?}", report.problems);
    }
    assert_eq!(costs[0], costs[1]);
}

/// A listing in a new process reads only what changed since the last one: the subtree
/// totals a clean close saves (`subtree-totals`) spare it the walk of the store. The
/// figures are the same with and without the file.
#[test]
fn a_listing_after_a_reopen_reuses_the_saved_subtree_totals() {
    use cambium::io::Vfs;
    let vfs = SimVfs::new();
    let store = create_sim(&vfs);
    let mut rng = Rng::new(11);
    let mut txn = store.begin_write().unwrap();
    for i in 0..4000 {
        txn.put(format!("k{i:06}").as_bytes(), &rng.bytes(60))
            .unwrap();
    }
    txn.commit().unwrap();
    store.snapshot("main", "s").unwrap();
    store.put(b"k000001", b"changed").unwrap();
    store.checkpoint().unwrap();
    let first = store.versions().unwrap();
    store.close().unwrap();

    let reads_for_listing = |vfs: &SimVfs| {
        let store = open_sim(vfs).unwrap();
        let before = vfs.read_count();
        let listing = store.versions().unwrap();
        let reads = vfs.read_count() - before;
        store.close().unwrap();
        (listing, reads)
    };
    let (with_file, reads_with) = reads_for_listing(&vfs);
    vfs.remove("subtree-totals").unwrap();
    let (without_file, reads_without) = reads_for_listing(&vfs);
    assert_eq!(with_file, first);
    assert_eq!(without_file, first);
    eprintln!("listing reads: {reads_with} with the saved totals, {reads_without} without");
    assert!(
        reads_with * 4 < reads_without,
        "{reads_with} reads with the saved totals, {reads_without} without"
    );
}

/// 64 values of 40 KB (out of line, in the data stream), all of them `round`.
fn put_large(store: &Store, round: u8) {
    let mut txn = store.begin_write().unwrap();
    for i in 0..64u32 {
        txn.put(format!("key{i:04}").as_bytes(), &vec![round; 40_000])
            .unwrap();
    }
    txn.commit().unwrap();
}

/// Writes two rounds of [`put_large`], cleans every segment and checkpoints twice:
/// the cleaned segments are deleted after the first checkpoint, and the second's
/// back-reference manifest names them in its deletion vector. (No commit between:
/// a commit's new log file would sync the directory.) Returns the bytes of the data
/// segment's file as they were before the clean.
fn clean_all_and_name_the_deleted(vfs: &SimVfs, store: &Store) -> (String, Vec<u8>) {
    put_large(store, 1);
    store.checkpoint().unwrap();
    put_large(store, 2);
    // The only data segment so far: where appends of values resume after a reopen.
    let data_segment = "seg-00000002.dat".to_owned();
    let bytes = vfs.read_file(&data_segment).expect("the data segment");
    store.clean(0.0).unwrap();
    verify_clean(store, "after the clean").unwrap();
    store.checkpoint().unwrap();
    store.checkpoint().unwrap();
    assert!(
        vfs.read_file(&data_segment).is_none(),
        "the clean deleted it"
    );
    (data_segment, bytes)
}

/// After the segment that came back: new values land, their back references are
/// stored, and a second clean moves everything again.
fn write_and_clean_again(store: &Store) {
    put_large(store, 3);
    store.checkpoint().unwrap();
    verify_clean(store, "after new writes").unwrap();
    put_large(store, 4);
    store.shrink().unwrap();
    verify_clean(store, "after a shrink").unwrap();
    let got = dump(&store.read().unwrap()).unwrap();
    assert_eq!(got.len(), 64);
    assert!(got.values().all(|v| *v == vec![4u8; 40_000]));
}

/// A segment's removal is durable before the back references' deletion vector names
/// it. Before, a power loss could bring back a deleted segment's file while the
/// durable vector named it; the only data segment, it was where appends resumed,
/// and the vector then hid the new values' back references (`verify`: "pointers
/// have no stored back reference"; seeds 20, 71, 79, 108, 136, 171 and 180 of
/// `random_versions_against_a_model` at 200 seeds).
#[test]
fn a_deleted_segment_does_not_come_back_after_a_power_loss() {
    let vfs = SimVfs::new();
    let store = create_sim(&vfs);
    let (data_segment, _) = clean_all_and_name_the_deleted(&vfs, &store);
    // Every directory operation since the last directory sync is lost.
    let vfs = vfs.crash_drop_all();
    drop(store);
    assert!(
        vfs.read_file(&data_segment).is_none(),
        "the removal was durable"
    );
    let store = open_sim(&vfs).unwrap();
    write_and_clean_again(&store);
}

/// A store an older build left with a segment file its deletion vector names (the
/// state the power loss above used to leave): the open deletes the file again
/// instead of letting it take appends.
#[test]
fn a_segment_file_the_deletion_vector_names_is_deleted_at_open() {
    let vfs = SimVfs::new();
    let store = create_sim(&vfs);
    let (data_segment, bytes) = clean_all_and_name_the_deleted(&vfs, &store);
    store.close().unwrap();
    vfs.write_file(&data_segment, &bytes);
    let store = open_sim(&vfs).unwrap();
    write_and_clean_again(&store);
    assert!(
        vfs.read_file(&data_segment).is_none(),
        "the file came back and was deleted again"
    );
}

/// Deletes that empty a leaf of a few large entries, never thin before the last of
/// them goes, leave no empty node behind: a store whose keys are all deleted holds
/// nothing (seed 48 of `random_versions_against_a_model` at 200 seeds kept 129
/// bytes of empty nodes).
#[test]
fn deleting_every_key_of_large_entries_leaves_no_empty_node() {
    for order in ["ascending", "descending", "alternating"] {
        let vfs = SimVfs::new();
        let store = create_sim(&vfs);
        // 1,500-byte keys with 1,000-byte values: 2.5 KB entries, three to a leaf,
        // each leaf past the thin mark (2 KiB) until its last entry is deleted.
        let key = |i: usize| format!("{i:04}{}", "k".repeat(1496)).into_bytes();
        let n = 60;
        let mut txn = store.begin_write().unwrap();
        for i in 0..n {
            txn.put(&key(i), &[b'v'; 1000]).unwrap();
        }
        txn.commit().unwrap();
        store.checkpoint().unwrap();
        let mut indexes: Vec<usize> = (0..n).collect();
        match order {
            "descending" => indexes.reverse(),
            "alternating" => indexes.sort_by_key(|i| (i % 2, *i)),
            _ => {}
        }
        // One key per transaction (each delete's path is copied from the written
        // tree) and then the rest in one.
        for &i in &indexes[..n / 2] {
            let mut txn = store.begin_write().unwrap();
            assert!(txn.delete(&key(i)).unwrap());
            txn.commit().unwrap();
        }
        store.checkpoint().unwrap();
        verify_clean(&store, order).unwrap();
        let mut txn = store.begin_write().unwrap();
        for &i in &indexes[n / 2..] {
            assert!(txn.delete(&key(i)).unwrap());
        }
        txn.commit().unwrap();
        store.checkpoint().unwrap();
        verify_clean(&store, order).unwrap();
        let stats = store.stats().unwrap();
        assert_eq!(stats.live_bytes, 0, "{order}: live bytes left");
        let main = &store.versions().unwrap()[0];
        assert_eq!((main.keys, main.referenced_bytes), (0, 0), "{order}");
    }
}

/// A transaction changes reference counts as its edits are made (so that its commit
/// is short), and an abort takes them back. Here transactions copy leaves a snapshot
/// shares, each copy adding a parent to every extent and child under it, once while
/// the shared nodes are still in memory and once after a checkpoint wrote them, and
/// end without committing (aborted, or dropped): the shared-block count is as before
/// each, and after a checkpoint `verify` recomputes every count from a walk.
#[test]
fn an_aborted_transaction_takes_back_the_counts_its_edits_changed() {
    let vfs = SimVfs::new();
    let store = create_sim(&vfs);
    let mut rng = Rng::new(61);
    let key = |i: u64| format!("k{i:05}").into_bytes();
    let mut model = Model::new();
    let mut txn = store.begin_write().unwrap();
    for i in 0..3_000 {
        // Every third value is over 1 KiB: an extent, counted like a node.
        let value = rng.bytes(if i % 3 == 0 { 1_500 } else { 100 });
        txn.put(&key(i), &value).unwrap();
        model.insert(key(i), value);
    }
    txn.commit().unwrap();
    for written in [false, true] {
        if written {
            store.checkpoint().unwrap();
        }
        let snap = format!("snap-{written}");
        store.snapshot("main", &snap).unwrap();
        let shared = store.stats().unwrap().shared_blocks;
        for abort in [true, false] {
            let mut txn = store.begin_write().unwrap();
            for _ in 0..400 {
                let i = rng.below(3_000);
                if rng.chance(1, 5) {
                    txn.delete(&key(i)).unwrap();
                } else {
                    txn.put(&key(i), &rng.bytes(1_500)).unwrap();
                }
            }
            if abort {
                txn.abort();
            } else {
                drop(txn);
            }
            assert_eq!(
                store.stats().unwrap().shared_blocks,
                shared,
                "shared blocks after an {} transaction (nodes written: {written})",
                if abort { "aborted" } else { "dropped" }
            );
        }
        store.checkpoint().unwrap();
        verify_clean(
            &store,
            &format!("after the aborts (nodes written: {written})"),
        )
        .unwrap();
        assert!(dump(&store.read().unwrap()).unwrap() == model);
        assert!(dump(&store.read_at(&snap).unwrap()).unwrap() == model);
    }
    // The counts left are right for the writes that do commit.
    let mut txn = store.begin_write().unwrap();
    for _ in 0..400 {
        let (i, value) = (rng.below(3_000), rng.bytes(1_500));
        txn.put(&key(i), &value).unwrap();
        model.insert(key(i), value);
    }
    txn.commit().unwrap();
    store.close().unwrap();
    let store = open_sim(&vfs).unwrap();
    verify_clean(&store, "reopened after a commit").unwrap();
    assert!(dump(&store.read().unwrap()).unwrap() == model);
}
