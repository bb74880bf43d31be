//! The engines the version benchmarks drive: key-value stores that can make a
//! writable clone of a tree. cambium (branches) and Sanakirja (`fork_db`), behind
//! one small trait so every workload runs the same operations on both.
//!
//! Versions are numbered by the harness; version 0 is the first tree. Every write
//! method is one transaction, durable on return unless the cambium adapter was built
//! with `Durability::Deferred` (Sanakirja's commit always syncs).

use crate::workload::Res;
use std::collections::HashMap;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One operation of a write transaction.
pub enum Op<'a> {
    /// Insert or replace.
    Put(&'a [u8], &'a [u8]),
    /// Insert a key the caller knows is new (Sanakirja can skip its delete-first).
    Insert(&'a [u8], &'a [u8]),
    /// Remove if present.
    Del(&'a [u8]),
}

/// A key-value engine with writable clones.
pub trait Forkable: Sized {
    /// A fresh store in the empty directory `dir`, holding version 0 (empty).
    fn create(dir: &Path, cfg: &EngineCfg) -> Res<Self>;

    /// One transaction on version `v` applying every op in order.
    fn write(&mut self, v: u32, ops: &[Op<'_>]) -> Res<()>;

    /// A writable clone `dst` of version `src`.
    fn fork(&mut self, src: u32, dst: u32) -> Res<()>;

    /// A read-only snapshot `dst` of version `src`, where the engine has one that is
    /// cheaper than a fork; by default a fork.
    fn snapshot(&mut self, src: u32, dst: u32) -> Res<()> {
        self.fork(src, dst)
    }

    /// A snapshot that returns without waiting for durability, where the engine has
    /// one; false when it has not.
    fn snapshot_deferred(&mut self, _src: u32, _dst: u32) -> Res<bool> {
        Ok(false)
    }

    /// Point lookups at version `v`, in one read transaction; returns how many keys
    /// were found, plus the sum of their value lengths.
    fn get_many(&mut self, v: u32, keys: &mut dyn Iterator<Item = &[u8]>) -> Res<(u64, u64)>;

    /// Up to `n` entries of version `v` from `from` on, in one read transaction;
    /// calls `each` with every pair; returns how many were read.
    fn range(
        &mut self,
        v: u32,
        from: &[u8],
        n: usize,
        each: &mut dyn FnMut(&[u8], &[u8]),
    ) -> Res<u64>;

    /// Makes everything on disk current (cambium: a checkpoint; Sanakirja commits
    /// already are).
    fn settle(&mut self) -> Res<()> {
        Ok(())
    }

    /// Drops in-memory caches that a reopen would drop (cambium: close and reopen;
    /// Sanakirja has none of its own beyond the OS page cache).
    fn reopen(self) -> Res<Self> {
        Ok(self)
    }

    /// Bytes the engine's files take (file lengths, and allocated blocks).
    fn disk(&self) -> (u64, u64);

    /// Bytes the live data takes on disk, where the engine knows.
    fn live_bytes(&self) -> Option<u64> {
        None
    }

    /// The node cache budget for the next [`Forkable::reopen`], where the engine has
    /// one of its own.
    fn set_cache_bytes(&mut self, _bytes: usize) {}

    fn close(self) -> Res<()>;
}

/// Settings shared by the adapters.
#[derive(Clone, Debug)]
pub struct EngineCfg {
    /// cambium's node cache; `None` keeps the default.
    pub cambium_cache_bytes: Option<usize>,
    /// Whether cambium commits wait for the WAL fsync (Sanakirja's always sync).
    pub durable: bool,
}

/// Bytes in the files under `dir`: (sum of lengths, sum of allocated blocks).
pub fn dir_bytes(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let (mut len, mut blocks) = (0, 0);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(md) = e.metadata() else { continue };
            if md.is_dir() {
                stack.push(e.path());
            } else {
                len += md.len();
                blocks += md.blocks() * 512;
            }
        }
    }
    (len, blocks)
}

// ---------------------------------------------------------------- cambium

pub struct Cambium {
    store: cambium::Store,
    path: PathBuf,
    opts: cambium::Options,
    durability: cambium::Durability,
}

/// cambium's name for harness version `v`.
pub fn version_name(v: u32) -> String {
    if v == 0 {
        cambium::MAIN_BRANCH.to_string()
    } else {
        format!("v{v}")
    }
}

impl Cambium {
    pub fn store(&self) -> &cambium::Store {
        &self.store
    }
}

impl Forkable for Cambium {
    fn create(dir: &Path, cfg: &EngineCfg) -> Res<Self> {
        let mut opts = cambium::Options::default();
        if let Some(b) = cfg.cambium_cache_bytes {
            opts.cache_bytes = b;
        }
        let path = dir.join("store");
        let store = cambium::Store::create_with(&path, opts.clone())?;
        let durability = if cfg.durable {
            cambium::Durability::Immediate
        } else {
            cambium::Durability::Deferred
        };
        Ok(Cambium {
            store,
            path,
            opts,
            durability,
        })
    }

    fn write(&mut self, v: u32, ops: &[Op<'_>]) -> Res<()> {
        let mut txn = self.store.begin_write_on(&version_name(v))?;
        txn.set_durability(self.durability);
        for op in ops {
            match *op {
                Op::Put(k, val) | Op::Insert(k, val) => txn.put(k, val)?,
                Op::Del(k) => {
                    txn.delete(k)?;
                }
            }
        }
        txn.commit()?;
        Ok(())
    }

    fn fork(&mut self, src: u32, dst: u32) -> Res<()> {
        self.store
            .branch_with(&version_name(src), &version_name(dst), self.durability)?;
        Ok(())
    }

    fn snapshot(&mut self, src: u32, dst: u32) -> Res<()> {
        self.store
            .snapshot_with(&version_name(src), &version_name(dst), self.durability)?;
        Ok(())
    }

    fn snapshot_deferred(&mut self, src: u32, dst: u32) -> Res<bool> {
        self.store.snapshot_with(
            &version_name(src),
            &version_name(dst),
            cambium::Durability::Deferred,
        )?;
        Ok(true)
    }

    fn get_many(&mut self, v: u32, keys: &mut dyn Iterator<Item = &[u8]>) -> Res<(u64, u64)> {
        let r = self.store.read_at(&version_name(v))?;
        let (mut found, mut bytes) = (0, 0);
        for k in keys {
            if let Some(val) = r.get(k)? {
                found += 1;
                bytes += val.len() as u64;
            }
        }
        Ok((found, bytes))
    }

    fn range(
        &mut self,
        v: u32,
        from: &[u8],
        n: usize,
        each: &mut dyn FnMut(&[u8], &[u8]),
    ) -> Res<u64> {
        let r = self.store.read_at(&version_name(v))?;
        let mut read = 0;
        for kv in r.range((Bound::Included(from), Bound::Unbounded))?.take(n) {
            let (k, val) = kv?;
            each(&k, &val);
            read += 1;
        }
        Ok(read)
    }

    fn settle(&mut self) -> Res<()> {
        self.store.finish_drops()?;
        self.store.checkpoint()?;
        Ok(())
    }

    fn reopen(self) -> Res<Self> {
        let Cambium {
            store,
            path,
            opts,
            durability,
        } = self;
        store.close()?;
        let store = cambium::Store::open_with(&path, opts.clone())?;
        Ok(Cambium {
            store,
            path,
            opts,
            durability,
        })
    }

    fn disk(&self) -> (u64, u64) {
        dir_bytes(&self.path)
    }

    fn live_bytes(&self) -> Option<u64> {
        self.store.stats().ok().map(|s| s.live_bytes)
    }

    fn set_cache_bytes(&mut self, bytes: usize) {
        self.opts.cache_bytes = bytes;
    }

    fn close(self) -> Res<()> {
        self.store.close()?;
        Ok(())
    }
}

// ---------------------------------------------------------------- Sanakirja

type SDb = sanakirja::btree::UDb<[u8], [u8]>;
type SCatalog = sanakirja::btree::Db<u64, u64>;
type SPage = sanakirja::btree::page_unsized::Page<[u8], [u8]>;

/// Sanakirja 1.4 with one unsized-key B-tree per version. The root page has room for
/// about 500 roots, so the trees' roots live in a catalog tree (version → root page)
/// whose own root is root slot 0. Every write transaction updates the catalog and
/// commits, which syncs the memory map.
pub struct Sanakirja {
    env: Arc<sanakirja::Env>,
    path: PathBuf,
    /// The committed root page of each version's tree (mirrors the catalog).
    roots: HashMap<u32, u64>,
}

fn sk<E: std::fmt::Display>(e: E) -> crate::workload::BoxError {
    format!("sanakirja: {e}").into()
}

impl Sanakirja {
    fn db(&self, v: u32) -> Res<SDb> {
        let page = *self.roots.get(&v).ok_or("sanakirja: unknown version")?;
        // SAFETY: `page` is the root of a tree this adapter created and committed.
        Ok(unsafe { SDb::from_page(page) })
    }

    /// Records `db` as version `v`'s tree in the catalog of `txn`.
    fn file(txn: &mut sanakirja::MutTxn<Arc<sanakirja::Env>, ()>, v: u32, db: &SDb) -> Res<()> {
        use sanakirja::{btree, RootDb};
        let mut catalog: SCatalog = match txn.root_db::<u64, u64, _>(0) {
            Some(c) => c,
            // SAFETY: root 0 only ever holds this catalog type.
            None => unsafe { btree::create_db(txn).map_err(sk)? },
        };
        let key = v as u64;
        btree::del(txn, &mut catalog, &key, None).map_err(sk)?;
        btree::put(txn, &mut catalog, &key, &db.db.into()).map_err(sk)?;
        txn.set_root(0, catalog.db.into());
        Ok(())
    }
}

impl Forkable for Sanakirja {
    fn create(dir: &Path, _cfg: &EngineCfg) -> Res<Self> {
        let path = dir.join("sanakirja.db");
        // The file grows as needed; start at 64 MiB. Two roots: a writer and a reader.
        let env = Arc::new(sanakirja::Env::new(&path, 64 << 20, 2).map_err(sk)?);
        let mut txn = sanakirja::Env::mut_txn_begin(env.clone()).map_err(sk)?;
        // SAFETY: a fresh tree in a fresh environment; Sanakirja marks creation unsafe
        // because a tree of the wrong type could later be read from its root.
        let db: SDb = unsafe { sanakirja::btree::create_db_::<_, [u8], [u8], SPage>(&mut txn) }
            .map_err(sk)?;
        Self::file(&mut txn, 0, &db)?;
        use sanakirja::Commit;
        txn.commit().map_err(sk)?;
        let mut roots = HashMap::new();
        roots.insert(0, db.db.into());
        Ok(Sanakirja { env, path, roots })
    }

    fn write(&mut self, v: u32, ops: &[Op<'_>]) -> Res<()> {
        use sanakirja::{btree, Commit};
        let mut db = self.db(v)?;
        let mut txn = sanakirja::Env::mut_txn_begin(self.env.clone()).map_err(sk)?;
        for op in ops {
            match *op {
                // Sanakirja is a multimap: a put next to an existing key adds a second
                // binding, so a replace is a delete first.
                Op::Put(k, val) => {
                    btree::del(&mut txn, &mut db, k, None).map_err(sk)?;
                    btree::put(&mut txn, &mut db, k, val).map_err(sk)?;
                }
                Op::Insert(k, val) => {
                    btree::put(&mut txn, &mut db, k, val).map_err(sk)?;
                }
                Op::Del(k) => {
                    btree::del(&mut txn, &mut db, k, None).map_err(sk)?;
                }
            }
        }
        Self::file(&mut txn, v, &db)?;
        txn.commit().map_err(sk)?;
        self.roots.insert(v, db.db.into());
        Ok(())
    }

    fn fork(&mut self, src: u32, dst: u32) -> Res<()> {
        use sanakirja::Commit;
        let db = self.db(src)?;
        let mut txn = sanakirja::Env::mut_txn_begin(self.env.clone()).map_err(sk)?;
        let copy = sanakirja::btree::fork_db(&mut txn, &db).map_err(sk)?;
        Self::file(&mut txn, dst, &copy)?;
        txn.commit().map_err(sk)?;
        self.roots.insert(dst, copy.db.into());
        Ok(())
    }

    fn get_many(&mut self, v: u32, keys: &mut dyn Iterator<Item = &[u8]>) -> Res<(u64, u64)> {
        let db = self.db(v)?;
        let txn = sanakirja::Env::txn_begin(self.env.clone()).map_err(sk)?;
        let (mut found, mut bytes) = (0, 0);
        for k in keys {
            // `get` lands on the first binding at or after `k`.
            if let Some((got, val)) = sanakirja::btree::get(&txn, &db, k, None).map_err(sk)? {
                if got == k {
                    found += 1;
                    bytes += val.len() as u64;
                }
            }
        }
        Ok((found, bytes))
    }

    fn range(
        &mut self,
        v: u32,
        from: &[u8],
        n: usize,
        each: &mut dyn FnMut(&[u8], &[u8]),
    ) -> Res<u64> {
        let db = self.db(v)?;
        let txn = sanakirja::Env::txn_begin(self.env.clone()).map_err(sk)?;
        let mut read = 0;
        for kv in sanakirja::btree::iter(&txn, &db, Some((from, None)))
            .map_err(sk)?
            .take(n)
        {
            let (k, val) = kv.map_err(sk)?;
            each(k, val);
            read += 1;
        }
        Ok(read)
    }

    fn disk(&self) -> (u64, u64) {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&self.path)
            .map(|m| (m.len(), m.blocks() * 512))
            .unwrap_or((0, 0))
    }

    fn close(self) -> Res<()> {
        Ok(())
    }
}
