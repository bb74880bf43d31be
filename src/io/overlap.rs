//! Overlapped fsyncs: a helper thread syncs one set of files while the caller does
//! other I/O (the WAL syncs the data a group commit names while it writes and syncs
//! the group's records). Two syncs that need no order between them then cost the
//! longer of the two instead of their sum.
//!
//! Only where the backend says syncs may overlap ([`Vfs::syncs_overlap`]): the
//! simulated file system keeps one deterministic order of operations, so there a
//! [`Pending`] sync runs when it is waited for, after the caller's other I/O: of the
//! orders an overlap allows, the one that leaves the most to recovery.

use super::{VFile, Vfs};
use std::io;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

/// One helper thread, started at the first overlapped sync and stopped when this is
/// dropped. It runs one set of syncs at a time: its callers are serialised (the
/// WAL's one sync leader), and a second caller waits for the first's set.
pub(crate) struct SyncHelper {
    overlap: bool,
    inner: Arc<Inner>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Default)]
struct Inner {
    slot: Mutex<Slot>,
    changed: Condvar,
}

#[derive(Default)]
struct Slot {
    /// Files to sync, handed to the helper.
    job: Option<Vec<Arc<dyn VFile>>>,
    /// The helper is syncing a job, or its result waits to be collected.
    busy: bool,
    /// The result of the last job, until its [`Pending`] collects it.
    done: Option<io::Result<()>>,
    stop: bool,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wait<'a>(&self, guard: MutexGuard<'a, Slot>) -> MutexGuard<'a, Slot> {
        self.changed
            .wait(guard)
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// A sync started by [`SyncHelper::start`]: [`Pending::wait`] returns once every file
/// is durable. Dropping it waits too, so a sync never outlives its caller's view of
/// it.
pub(crate) struct Pending<'h> {
    how: How<'h>,
}

enum How<'h> {
    /// Nothing to sync.
    Nothing,
    /// On the helper thread.
    Helper(&'h Inner),
    /// Here, when waited for.
    Deferred(Vec<Arc<dyn VFile>>),
}

impl SyncHelper {
    /// A helper for files of `vfs`; it overlaps syncs only if the backend allows.
    pub(crate) fn new(vfs: &dyn Vfs) -> SyncHelper {
        SyncHelper {
            overlap: vfs.syncs_overlap(),
            inner: Arc::default(),
            thread: Mutex::new(None),
        }
    }

    /// Starts syncing `files`, on the helper thread where syncs overlap; otherwise
    /// (or if the thread cannot be started) they are synced by [`Pending::wait`].
    pub(crate) fn start(&self, files: Vec<Arc<dyn VFile>>) -> Pending<'_> {
        if files.is_empty() {
            return Pending { how: How::Nothing };
        }
        if !self.overlap || !self.ensure_thread() {
            return Pending {
                how: How::Deferred(files),
            };
        }
        let mut slot = self.inner.lock();
        while slot.busy {
            slot = self.inner.wait(slot);
        }
        slot.job = Some(files);
        slot.busy = true;
        drop(slot);
        self.inner.changed.notify_all();
        Pending {
            how: How::Helper(&self.inner),
        }
    }

    fn ensure_thread(&self) -> bool {
        let mut thread = self.thread.lock().unwrap_or_else(PoisonError::into_inner);
        if thread.is_some() {
            return true;
        }
        let inner = self.inner.clone();
        match std::thread::Builder::new()
            .name("cambium-sync".into())
            .spawn(move || helper(&inner))
        {
            Ok(handle) => {
                *thread = Some(handle);
                true
            }
            Err(_) => false,
        }
    }
}

impl Drop for SyncHelper {
    fn drop(&mut self) {
        self.inner.lock().stop = true;
        self.inner.changed.notify_all();
        let handle = self
            .thread
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

fn helper(inner: &Inner) {
    let mut slot = inner.lock();
    loop {
        if let Some(files) = slot.job.take() {
            drop(slot);
            // A panic must not leave the waiter (the WAL's sync leader, holding
            // every committer up) waiting for a result that never comes.
            let result =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sync_all(&files)))
                    .unwrap_or_else(|_| Err(io::Error::other("a sync panicked")));
            slot = inner.lock();
            slot.done = Some(result);
            inner.changed.notify_all();
            continue;
        }
        if slot.stop {
            return;
        }
        slot = inner.wait(slot);
    }
}

fn sync_all(files: &[Arc<dyn VFile>]) -> io::Result<()> {
    files.iter().try_for_each(|f| f.sync())
}

impl Pending<'_> {
    /// Waits until every file is durable; the first error if one failed to sync.
    pub(crate) fn wait(mut self) -> io::Result<()> {
        self.finish()
    }

    fn finish(&mut self) -> io::Result<()> {
        match std::mem::replace(&mut self.how, How::Nothing) {
            How::Nothing => Ok(()),
            How::Deferred(files) => sync_all(&files),
            How::Helper(inner) => {
                let mut slot = inner.lock();
                loop {
                    if let Some(result) = slot.done.take() {
                        slot.busy = false;
                        drop(slot);
                        inner.changed.notify_all();
                        return result;
                    }
                    slot = inner.wait(slot);
                }
            }
        }
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::sim::SimVfs;
    use crate::io::{LockKind, StdVfs, StoreLock};

    /// The simulated file system, saying its syncs may overlap: the helper thread's
    /// path, with durability a simulated power loss can check.
    struct Overlapping(SimVfs);

    impl Vfs for Overlapping {
        fn readers_present(&self) -> bool {
            self.0.readers_present()
        }
        fn open(&self, name: &str) -> io::Result<Arc<dyn VFile>> {
            self.0.open(name)
        }
        fn create(&self, name: &str) -> io::Result<Arc<dyn VFile>> {
            self.0.create(name)
        }
        fn remove(&self, name: &str) -> io::Result<()> {
            self.0.remove(name)
        }
        fn rename(&self, from: &str, to: &str) -> io::Result<()> {
            self.0.rename(from, to)
        }
        fn exists(&self, name: &str) -> io::Result<bool> {
            self.0.exists(name)
        }
        fn list(&self) -> io::Result<Vec<String>> {
            self.0.list()
        }
        fn sync_dir(&self) -> io::Result<()> {
            self.0.sync_dir()
        }
        fn lock(&self, kind: LockKind) -> io::Result<Box<dyn StoreLock>> {
            self.0.lock(kind)
        }
        fn syncs_overlap(&self) -> bool {
            true
        }
    }

    #[test]
    fn the_real_file_system_overlaps_syncs() {
        let dir = tempfile::tempdir().unwrap();
        assert!(StdVfs::new(dir.path()).syncs_overlap());
        assert!(!SimVfs::new().syncs_overlap());
    }

    #[test]
    fn overlapped_syncs_make_writes_durable() {
        let sim = SimVfs::new();
        let vfs = Overlapping(sim.clone());
        let helper = SyncHelper::new(&vfs);
        let files: Vec<_> = (0..3)
            .map(|i| vfs.create(&format!("f{i}")).unwrap())
            .collect();
        vfs.sync_dir().unwrap();
        for round in 0..20u8 {
            for f in &files {
                f.write_all_at(&[round; 512], u64::from(round) * 512)
                    .unwrap();
            }
            helper.start(files.clone()).wait().unwrap();
            let image = sim.fork().crash_drop_all();
            for i in 0..3 {
                let got = image.read_file(&format!("f{i}")).unwrap();
                assert_eq!(got.len(), (usize::from(round) + 1) * 512, "round {round}");
                assert!(got[usize::from(round) * 512..].iter().all(|&b| b == round));
            }
        }
        assert!(
            helper.thread.lock().unwrap().is_some(),
            "synced on the helper thread"
        );
        // A dropped handle waits as well; the helper stops with its owner.
        files[0].write_all_at(b"last", 20 * 512).unwrap();
        drop(helper.start(files.clone()));
        drop(helper);
        assert_eq!(
            sim.fork().crash_drop_all().file_len("f0"),
            Some(20 * 512 + 4)
        );
    }

    #[test]
    fn without_overlap_the_sync_runs_when_waited_for() {
        let vfs = SimVfs::new();
        let helper = SyncHelper::new(&vfs);
        let f = vfs.create("f").unwrap();
        vfs.sync_dir().unwrap();
        f.write_all_at(b"data", 0).unwrap();
        let pending = helper.start(vec![f.clone()]);
        // Not yet synced: a crash now loses the write.
        assert_eq!(vfs.fork().crash_drop_all().file_len("f"), Some(0));
        pending.wait().unwrap();
        assert_eq!(vfs.fork().crash_drop_all().read_file("f").unwrap(), b"data");
        assert!(
            helper.thread.lock().unwrap().is_none(),
            "no thread in the simulation"
        );
    }

    #[test]
    fn a_failed_sync_is_reported_from_either_path() {
        for overlap in [false, true] {
            let sim = SimVfs::new();
            let f = sim.create("f").unwrap();
            f.write_all_at(b"data", 0).unwrap();
            sim.set_fail_after(Some(0));
            let helper = if overlap {
                SyncHelper::new(&Overlapping(sim.clone()))
            } else {
                SyncHelper::new(&sim)
            };
            assert!(
                helper.start(vec![f.clone()]).wait().is_err(),
                "overlap {overlap}"
            );
            // The helper is free for the next sync.
            sim.set_fail_after(None);
            helper.start(vec![f]).wait().unwrap();
        }
    }
}
