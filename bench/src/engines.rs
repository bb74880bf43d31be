//! Adapters for the three engines.

use crate::workload::{Engine, Key, Res, Tuning, Value, VALUE_SIZE};
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
impl Engine for Cambium {
    const NAME: &'static str = "cambium";

    fn create(dir: &Path, tuning: &Tuning) -> Res<Self> {
        // Default options (256 MiB cache, background checkpoints on) unless tuned.
        let mut opts = cambium::Options::default();
        if let Some(b) = tuning.cambium_cache_bytes {
            opts.cache_bytes = b;
        }
        let store = cambium::Store::create_with(dir.join("store"), opts)?;
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
            let got = r.get(&k)?.ok_or("missing key")?;
            check_value(&got, &v)?;
            sum += got.len() as u64;
        }
        Ok(sum)
    }

    fn range_txn(&mut self, keys: impl Iterator<Item = Key>, len: usize) -> Res<u64> {
        let r = self.store.read()?;
        let mut sum = 0u64;
        for k in keys {
            let it = r.range((Bound::Included(&k[..]), Bound::Unbounded))?;
            for kv in it.take(len) {
                let (k, v) = kv?;
                sum += (k.len() + v.len()) as u64;
            }
        }
        Ok(sum)
    }

    fn progress(&self) -> Option<String> {
        let s = self.store.stats().ok()?;
        Some(format!(
            "generation {} checkpoint_lsn {} last_lsn {} wal {} dirty_nodes {} cache hit rate {:.3}",
            s.generation,
            s.checkpoint_lsn,
            s.last_lsn,
            s.wal_bytes,
            s.dirty_nodes,
            s.cache_hit_rate
        ))
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

    fn create(dir: &Path, _: &Tuning) -> Res<Self> {
        let db = redb::Builder::new()
            .set_cache_size(4 << 30)
            .create(dir.join("bench.redb"))?;
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

    fn create(dir: &Path, _: &Tuning) -> Res<Self> {
        let path = dir.join("lmdb");
        std::fs::create_dir_all(&path)?;
        // SAFETY: a fresh directory only this process uses; default (durable) flags.
        let env = unsafe { heed::EnvOpenOptions::new().map_size(4 << 30).open(&path)? };
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

    fn close(self) -> Res<()> {
        let Lmdb { env, db: _ } = self;
        env.prepare_for_closing().wait();
        Ok(())
    }
}
