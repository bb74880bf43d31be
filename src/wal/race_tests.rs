//! The group-commit leader makes a generation's file without the log's lock, so a
//! checkpoint's freeze can rotate the log while it does (`Wal::attach`). These tests
//! stop the leader inside that file's creation, with a VFS that blocks there, rotate
//! the log and append around it, let the leader go, and check after a crash that
//! every record synced is where replay reads it.

use super::*;
use crate::io::sim::SimVfs;
use crate::io::LockKind;
use std::sync::mpsc::{channel, Receiver, Sender};

/// A VFS that, once armed, stops the next creation of a log file until told to go on.
struct GateVfs {
    inner: SimVfs,
    gate: Mutex<Option<(Sender<()>, Receiver<()>)>>,
}

impl GateVfs {
    /// Arms the gate: returns the receiver told when a log file's creation is
    /// reached, and the sender that lets it go on.
    fn arm(&self) -> (Receiver<()>, Sender<()>) {
        let (reached_tx, reached_rx) = channel();
        let (go_tx, go_rx) = channel();
        *lock(&self.gate) = Some((reached_tx, go_rx));
        (reached_rx, go_tx)
    }

    fn pass(&self, name: &str) {
        if !name.starts_with("wal-") {
            return;
        }
        let armed = lock(&self.gate).take();
        if let Some((reached, go)) = armed {
            reached.send(()).expect("the test waits for the leader");
            go.recv().expect("the test lets the leader go");
        }
    }
}

impl Vfs for GateVfs {
    fn readers_present(&self) -> bool {
        self.inner.readers_present()
    }
    fn open(&self, name: &str) -> std::io::Result<Arc<dyn VFile>> {
        self.inner.open(name)
    }
    fn create(&self, name: &str) -> std::io::Result<Arc<dyn VFile>> {
        self.pass(name);
        self.inner.create(name)
    }
    fn remove(&self, name: &str) -> std::io::Result<()> {
        self.inner.remove(name)
    }
    fn rename(&self, from: &str, to: &str) -> std::io::Result<()> {
        self.pass(to);
        self.inner.rename(from, to)
    }
    fn exists(&self, name: &str) -> std::io::Result<bool> {
        self.inner.exists(name)
    }
    fn list(&self) -> std::io::Result<Vec<String>> {
        self.inner.list()
    }
    fn sync_dir(&self) -> std::io::Result<()> {
        self.inner.sync_dir()
    }
    fn lock(&self, kind: LockKind) -> std::io::Result<Box<dyn crate::io::StoreLock>> {
        self.inner.lock(kind)
    }
}

fn marker(wal: &Wal, lsn: u64) {
    wal.append_checkpoint_commit(Lsn(lsn), lsn)
        .expect("append a record");
}

/// The LSNs each generation's file holds, read as recovery reads them.
fn logged(vfs: &SimVfs) -> Vec<(u64, Vec<u64>)> {
    Generations::read(vfs, 1, Lsn(0))
        .expect("list the log")
        .map(|g| {
            let g = g.expect("read a generation");
            (g.gen, g.records.iter().map(|r| r.lsn.0).collect())
        })
        .collect()
}

/// Runs the race: record 1 is synced by a leader stopped while it makes
/// generation 1's file; meanwhile record 2 joins generation 1, the log rotates and
/// record 3 opens generation 2. `spare` first leaves a spare file, so the leader
/// renames it instead of creating a file.
fn rotate_while_the_leader_makes_the_file(spare: bool) {
    let sim = SimVfs::new();
    if spare {
        sim.write_file(SPARE_FILE, &vec![0u8; 1 << 16]);
    }
    let vfs = Arc::new(GateVfs {
        inner: sim.clone(),
        gate: Mutex::new(None),
    });
    let publisher: Arc<dyn StoreLock> = Arc::from(vfs.lock(LockKind::Writer).expect("lock"));
    let segments = Arc::new(Segments::open(vfs.clone(), false).expect("segments"));
    let wal = Arc::new(Wal::new(vfs.clone(), publisher, 1, Lsn(0), 0));

    marker(&wal, 1);
    let (reached, go) = vfs.arm();
    let leader = {
        let (wal, segments) = (Arc::clone(&wal), Arc::clone(&segments));
        std::thread::spawn(move || wal.sync_to(Lsn(1), &segments))
    };
    reached
        .recv()
        .expect("the leader reaches the file's creation");
    // The leader holds record 1 and no lock: a commit and a checkpoint's freeze go on.
    marker(&wal, 2);
    assert_eq!(wal.rotate().expect("rotate"), 1);
    marker(&wal, 3);
    go.send(()).expect("the leader waits");
    leader
        .join()
        .expect("leader thread")
        .expect("sync record 1");

    wal.sync_to(Lsn(3), &segments)
        .expect("sync records 2 and 3");
    let after = sim.crash_drop_all();
    assert_eq!(logged(&after), vec![(1, vec![1, 2]), (2, vec![3])]);
}

#[test]
fn a_rotation_while_the_leader_creates_the_file_keeps_every_record() {
    rotate_while_the_leader_makes_the_file(false);
}

#[test]
fn a_rotation_while_the_leader_renames_the_spare_keeps_every_record() {
    rotate_while_the_leader_makes_the_file(true);
}

/// Records written out (unsynced) just before a checkpoint's freeze rotates the log
/// must still be synced before any record of the next generation is: otherwise an
/// acknowledged commit of the next generation sits after a gap once the power goes.
#[test]
fn records_written_out_before_a_rotation_are_synced_with_the_next_group() {
    let sim = SimVfs::new();
    let vfs: Arc<dyn Vfs> = Arc::new(sim.clone());
    let publisher: Arc<dyn StoreLock> = Arc::from(vfs.lock(LockKind::Writer).expect("lock"));
    let segments = Segments::open(vfs.clone(), false).expect("segments");
    let wal = Wal::new(vfs.clone(), publisher, 1, Lsn(0), 0);
    // Generation 1's file exists (a first group commit made it).
    marker(&wal, 1);
    wal.sync_to(Lsn(1), &segments).expect("sync record 1");
    // Deferred commits past the write-out threshold, written out, not synced.
    let mut lsn = 1;
    while wal.lock().buf.len() < WRITE_OUT_BYTES {
        lsn += 1;
        wal.append(Lsn(lsn), &Record::Relocation { blocks: u64::MAX })
            .expect("append");
    }
    wal.write_out().expect("write out");
    assert!(wal.lock().buf.is_empty(), "the buffer was written out");
    assert_eq!(wal.rotate().expect("rotate"), 1);
    lsn += 1;
    marker(&wal, lsn);
    wal.sync_to(Lsn(lsn), &segments)
        .expect("an acknowledged commit");
    let after = sim.crash_drop_all();
    let gens = logged(&after);
    assert_eq!(
        gens.len(),
        2,
        "{:?}",
        gens.iter().map(|g| g.0).collect::<Vec<_>>()
    );
    assert_eq!(gens[0].1.len() as u64, lsn - 1, "generation 1 whole");
    assert_eq!(gens[1].1, vec![lsn]);
}
