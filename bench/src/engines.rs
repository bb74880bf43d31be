//! Adapters for the four engines.

use crate::workload::{Engine, Key, Res, Tuning, Value, EQUAL_BUDGET, VALUE_SIZE};
use std::ops::Bound;
use std::path::Path;

fn check_value(got: &[u8], want: &Value) -> Res<()> {
    if got.len() != VALUE_SIZE || got != want {
        return Err(format!("value mismatch: got {} bytes", got.len()).into());
    }
    Ok(())
}

// ---------------------------------------------------------------- cambium

#[cfg(feature = "engine-cambium")]
pub struct Cambium {
    store: cambium::Store,
}

#[cfg(feature = "engine-cambium")]
impl Cambium {
    /// Default options (a node cache of a quarter of memory; background checkpoints
    /// on); the equal configuration gives the node cache the peers' 4 GiB.
    fn options(tuning: &Tuning) -> cambium::Options {
        let mut opts = cambium::Options::default();
        if tuning.equal {
            opts.cache_bytes = EQUAL_BUDGET;
        }
        if let Some(b) = tuning.cambium_cache_bytes {
            opts.cache_bytes = b;
        }
        if let Some(b) = tuning.cambium_dirty_bytes {
            opts.checkpoint_dirty_bytes = b;
            opts.txn_dirty_bytes = b;
        }
        opts
    }
}

#[cfg(feature = "engine-cambium")]
impl Engine for Cambium {
    const NAME: &'static str = "cambium";

    fn create(dir: &Path, tuning: &Tuning) -> Res<Self> {
        let store = cambium::Store::create_with(dir.join("store"), Self::options(tuning))?;
        Ok(Cambium { store })
    }

    fn reopen(dir: &Path, tuning: &Tuning) -> Res<Self> {
        let store = cambium::Store::open_with(dir.join("store"), Self::options(tuning))?;
        Ok(Cambium { store })
    }

    fn insert_txn(&mut self, pairs: impl Iterator<Item = (Key, Value)>) -> Res<()> {
        let mut txn = self.store.begin_write()?;
        txn.set_durability(cambium::Durability::Immediate);
        for (k, v) in pairs {
            txn.put(&k, &v)?;
        }
        txn.commit()?;
        Ok(())
    }

    fn remove_txn(&mut self, keys: impl Iterator<Item = Key>) -> Res<u64> {
        let mut txn = self.store.begin_write()?;
        txn.set_durability(cambium::Durability::Immediate);
        let mut n = 0;
        for k in keys {
            n += txn.delete(&k)? as u64;
        }
        txn.commit()?;
        Ok(n)
    }

    fn read_txn(&mut self, pairs: impl Iterator<Item = (Key, Value)>) -> Res<u64> {
        let r = self.store.read()?;
        let mut sum = 0u64;
        for (k, v) in pairs {
            // The borrowing lookup, as redb's `AccessGuard` and LMDB's slices are.
            let got = r
                .get_with(&k, |got| check_value(got, &v).map(|()| got.len()))?
                .ok_or("missing key")??;
            sum += got as u64;
        }
        Ok(sum)
    }

    fn range_txn(&mut self, keys: impl Iterator<Item = Key>, len: usize) -> Res<u64> {
        let r = self.store.read()?;
        let mut sum = 0u64;
        for k in keys {
            let mut it = r.range((Bound::Included(&k[..]), Bound::Unbounded))?;
            for _ in 0..len {
                let Some(kv) = it.next_ref() else { break };
                let (k, v) = kv?;
                sum += (k.len() + v.len()) as u64;
            }
        }
        Ok(sum)
    }

    fn scan_txn(&mut self) -> Res<(u64, u64)> {
        // The borrowing iterator (`next_ref`): keys and inline values are slices of the
        // cached node, as redb's guards and LMDB's slices are; the owned `Iterator` would
        // allocate two `Vec`s per entry. The iterator holds the snapshot itself, so the
        // `ReadTxn` temporary may go.
        let mut it = self.store.read()?.iter()?;
        let (mut entries, mut sum) = (0u64, 0u64);
        while let Some(kv) = it.next_ref() {
            let (k, v) = kv?;
            entries += 1;
            sum += (k.len() + v.len()) as u64;
        }
        Ok((entries, sum))
    }

    fn progress(&self) -> Option<String> {
        let s = self.store.stats().ok()?;
        Some(format!(
            "generation {} checkpoint_lsn {} last_lsn {} wal {} dirty_nodes {} cache {} MiB, {} hits {} misses, {} leaves",
            s.generation,
            s.checkpoint_lsn,
            s.last_lsn,
            s.wal_bytes,
            s.dirty_nodes,
            s.cache_bytes >> 20,
            s.cache_hits,
            s.cache_misses,
            s.leaf_nodes,
        ))
    }

    fn checkpoint(&mut self) -> Res<()> {
        self.store.checkpoint()?;
        Ok(())
    }

    fn describe(&self) -> Option<String> {
        self.store
            .stats()
            .ok()
            .and_then(|s| serde_json::to_string(&s).ok())
            .map(|s| format!("cambium stats before close: {s}"))
    }

    fn close(self) -> Res<()> {
        self.store.checkpoint()?;
        self.store.close()?;
        Ok(())
    }
}

// ---------------------------------------------------------------- redb

const REDB_TABLE: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("bench");

pub struct Redb {
    db: redb::Database,
}

impl Engine for Redb {
    const NAME: &'static str = "redb";

    fn create(dir: &Path, tuning: &Tuning) -> Res<Self> {
        // Default: redb's 1 GiB cache.
        let mut b = redb::Builder::new();
        if tuning.equal {
            b.set_cache_size(EQUAL_BUDGET);
        }
        let db = b.create(dir.join("bench.redb"))?;
        Ok(Redb { db })
    }

    fn insert_txn(&mut self, pairs: impl Iterator<Item = (Key, Value)>) -> Res<()> {
        let txn = self.db.begin_write()?; // default durability: Immediate
        {
            let mut t = txn.open_table(REDB_TABLE)?;
            for (k, v) in pairs {
                t.insert(&k[..], &v[..])?;
            }
        }
        txn.commit()?;
        Ok(())
    }

    fn remove_txn(&mut self, keys: impl Iterator<Item = Key>) -> Res<u64> {
        let txn = self.db.begin_write()?;
        let mut n = 0;
        {
            let mut t = txn.open_table(REDB_TABLE)?;
            for k in keys {
                n += t.remove(&k[..])?.is_some() as u64;
            }
        }
        txn.commit()?;
        Ok(n)
    }

    fn read_txn(&mut self, pairs: impl Iterator<Item = (Key, Value)>) -> Res<u64> {
        use redb::ReadableDatabase;
        let txn = self.db.begin_read()?;
        let t = txn.open_table(REDB_TABLE)?;
        let mut sum = 0u64;
        for (k, v) in pairs {
            let got = t.get(&k[..])?.ok_or("missing key")?;
            let got = got.value();
            check_value(got, &v)?;
            sum += got.len() as u64;
        }
        Ok(sum)
    }

    fn range_txn(&mut self, keys: impl Iterator<Item = Key>, len: usize) -> Res<u64> {
        use redb::ReadableDatabase;
        let txn = self.db.begin_read()?;
        let t = txn.open_table(REDB_TABLE)?;
        let mut sum = 0u64;
        for k in keys {
            let it = t.range::<&[u8]>(&k[..]..)?;
            for kv in it.take(len) {
                let (k, v) = kv?;
                sum += (k.value().len() + v.value().len()) as u64;
            }
        }
        Ok(sum)
    }

    fn scan_txn(&mut self) -> Res<(u64, u64)> {
        use redb::{ReadableDatabase, ReadableTable};
        let txn = self.db.begin_read()?;
        let t = txn.open_table(REDB_TABLE)?;
        let (mut entries, mut sum) = (0u64, 0u64);
        for kv in t.iter()? {
            let (k, v) = kv?;
            entries += 1;
            sum += (k.value().len() + v.value().len()) as u64;
        }
        Ok((entries, sum))
    }

    fn close(self) -> Res<()> {
        drop(self.db);
        Ok(())
    }
}

// ---------------------------------------------------------------- LMDB (heed)

type HeedDb = heed::Database<'static, heed::types::Bytes, heed::types::Bytes>;

pub struct Lmdb {
    env: heed::Env,
    db: HeedDb,
}

impl Engine for Lmdb {
    const NAME: &'static str = "lmdb";

    fn create(dir: &Path, tuning: &Tuning) -> Res<Self> {
        let path = dir.join("lmdb");
        std::fs::create_dir_all(&path)?;
        // SAFETY: a fresh directory only this process uses; default (durable) flags.
        // The map is 4 GiB (more for more than 4M keys) in both configurations: LMDB's
        // default (10 MiB) cannot hold the data, and the map size is a limit, not memory
        // (the OS page cache is LMDB's).
        let env = unsafe {
            let mut options = heed::EnvOpenOptions::new();
            options.map_size(tuning.map_bytes);
            if tuning.lmdb_no_readahead {
                // SAFETY: a flag about read-ahead only, valid on any environment.
                options.flags(heed::EnvFlags::NO_READ_AHEAD);
            }
            options.open(&path)?
        };
        let wtxn = env.write_txn()?;
        let db = env
            .create_databases_and_commit(wtxn, |wdo, wtxn| -> Res<_> {
                let db: heed::Database<'_, heed::types::Bytes, heed::types::Bytes> =
                    wdo.create_database(wtxn, None)?;
                Ok(heed::CommitOrAbort::<_, ()>::Commit(db))
            })?
            .unwrap_commit();
        Ok(Lmdb { env, db })
    }

    /// `create` opens an existing environment and its unnamed database as well.
    fn reopen(dir: &Path, tuning: &Tuning) -> Res<Self> {
        Self::create(dir, tuning)
    }

    fn insert_txn(&mut self, pairs: impl Iterator<Item = (Key, Value)>) -> Res<()> {
        let mut txn = self.env.write_txn()?;
        for (k, v) in pairs {
            self.db.put(&mut txn, &k[..], &v[..])?;
        }
        txn.commit()?; // fsync (no MDB_NOSYNC)
        Ok(())
    }

    fn remove_txn(&mut self, keys: impl Iterator<Item = Key>) -> Res<u64> {
        let mut txn = self.env.write_txn()?;
        let mut n = 0;
        for k in keys {
            n += self.db.delete(&mut txn, &k[..])? as u64;
        }
        txn.commit()?;
        Ok(n)
    }

    fn read_txn(&mut self, pairs: impl Iterator<Item = (Key, Value)>) -> Res<u64> {
        let txn = self.env.read_txn()?;
        let mut sum = 0u64;
        for (k, v) in pairs {
            let got = self.db.get(&txn, &k[..])?.ok_or("missing key")?;
            check_value(got, &v)?;
            sum += got.len() as u64;
        }
        Ok(sum)
    }

    fn range_txn(&mut self, keys: impl Iterator<Item = Key>, len: usize) -> Res<u64> {
        let txn = self.env.read_txn()?;
        let mut sum = 0u64;
        for k in keys {
            let range: (Bound<&[u8]>, Bound<&[u8]>) = (Bound::Included(&k[..]), Bound::Unbounded);
            for kv in self.db.range(&txn, &range)?.take(len) {
                let (k, v) = kv?;
                sum += (k.len() + v.len()) as u64;
            }
        }
        Ok(sum)
    }

    fn scan_txn(&mut self) -> Res<(u64, u64)> {
        let txn = self.env.read_txn()?;
        let (mut entries, mut sum) = (0u64, 0u64);
        for kv in self.db.iter(&txn)? {
            let (k, v) = kv?;
            entries += 1;
            sum += (k.len() + v.len()) as u64;
        }
        Ok((entries, sum))
    }

    fn close(self) -> Res<()> {
        let Lmdb { env, db: _ } = self;
        env.prepare_for_closing().wait();
        Ok(())
    }
}

// ---------------------------------------------------------------- Sanakirja

type SDb = sanakirja::btree::UDb<[u8], [u8]>;
type SPage = sanakirja::btree::page_unsized::Page<[u8], [u8]>;

fn sk<E: std::fmt::Display>(e: E) -> crate::workload::BoxError {
    format!("sanakirja: {e}").into()
}

/// Sanakirja 1.4, one unsized-key B-tree whose root is root slot 0. Every write
/// transaction commits, which `msync`s the memory map.
pub struct Sanakirja {
    env: std::sync::Arc<sanakirja::Env>,
}

impl Sanakirja {
    fn db<T: sanakirja::RootDb>(txn: &T) -> Res<SDb> {
        txn.root_db::<[u8], [u8], SPage>(0)
            .ok_or_else(|| "sanakirja: no tree".into())
    }
}

impl Engine for Sanakirja {
    const NAME: &'static str = "sanakirja";

    fn create(dir: &Path, tuning: &Tuning) -> Res<Self> {
        use sanakirja::Commit;
        // The same initial map size as LMDB's map in both configurations (the file grows
        // as needed; Sanakirja has no default, and no cache of its own: the OS page cache).
        let env = std::sync::Arc::new(
            sanakirja::Env::new(dir.join("sanakirja.db"), tuning.map_bytes as u64, 2)
                .map_err(sk)?,
        );
        let mut txn = sanakirja::Env::mut_txn_begin(env.clone()).map_err(sk)?;
        // SAFETY: a fresh tree in a fresh environment, only ever read back as `SDb`.
        let db: SDb = unsafe { sanakirja::btree::create_db_::<_, [u8], [u8], SPage>(&mut txn) }
            .map_err(sk)?;
        txn.set_root(0, db.db.into());
        txn.commit().map_err(sk)?;
        Ok(Sanakirja { env })
    }

    fn insert_txn(&mut self, pairs: impl Iterator<Item = (Key, Value)>) -> Res<()> {
        use sanakirja::Commit;
        let mut txn = sanakirja::Env::mut_txn_begin(self.env.clone()).map_err(sk)?;
        let mut db = Self::db(&txn)?;
        for (k, v) in pairs {
            // A multimap: the keys are new (random 24-byte keys), so a plain put.
            sanakirja::btree::put(&mut txn, &mut db, &k[..], &v[..]).map_err(sk)?;
        }
        txn.set_root(0, db.db.into());
        txn.commit().map_err(sk)?;
        Ok(())
    }

    fn remove_txn(&mut self, keys: impl Iterator<Item = Key>) -> Res<u64> {
        use sanakirja::Commit;
        let mut txn = sanakirja::Env::mut_txn_begin(self.env.clone()).map_err(sk)?;
        let mut db = Self::db(&txn)?;
        let mut n = 0;
        for k in keys {
            n += sanakirja::btree::del(&mut txn, &mut db, &k[..], None).map_err(sk)? as u64;
        }
        txn.set_root(0, db.db.into());
        txn.commit().map_err(sk)?;
        Ok(n)
    }

    fn read_txn(&mut self, pairs: impl Iterator<Item = (Key, Value)>) -> Res<u64> {
        let txn = sanakirja::Env::txn_begin(self.env.clone()).map_err(sk)?;
        let db = Self::db(&txn)?;
        let mut sum = 0u64;
        for (k, v) in pairs {
            // `get` lands on the first binding at or after `k`.
            let (got_k, got) = sanakirja::btree::get(&txn, &db, &k[..], None)
                .map_err(sk)?
                .ok_or("missing key")?;
            if got_k != &k[..] {
                return Err("missing key".into());
            }
            check_value(got, &v)?;
            sum += got.len() as u64;
        }
        Ok(sum)
    }

    fn range_txn(&mut self, keys: impl Iterator<Item = Key>, len: usize) -> Res<u64> {
        let txn = sanakirja::Env::txn_begin(self.env.clone()).map_err(sk)?;
        let db = Self::db(&txn)?;
        let mut sum = 0u64;
        for k in keys {
            for kv in sanakirja::btree::iter(&txn, &db, Some((&k[..], None)))
                .map_err(sk)?
                .take(len)
            {
                let (k, v) = kv.map_err(sk)?;
                sum += (k.len() + v.len()) as u64;
            }
        }
        Ok(sum)
    }

    fn scan_txn(&mut self) -> Res<(u64, u64)> {
        let txn = sanakirja::Env::txn_begin(self.env.clone()).map_err(sk)?;
        let db = Self::db(&txn)?;
        let (mut entries, mut sum) = (0u64, 0u64);
        // No origin: from the first binding.
        for kv in sanakirja::btree::iter(&txn, &db, None).map_err(sk)? {
            let (k, v) = kv.map_err(sk)?;
            entries += 1;
            sum += (k.len() + v.len()) as u64;
        }
        Ok((entries, sum))
    }

    fn close(self) -> Res<()> {
        drop(self.env);
        Ok(())
    }
}
