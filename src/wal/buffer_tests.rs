//! The log's buffer is reused after each write, so appends under the writer lock
//! start from a buffer with room rather than growing one from nothing.

use super::*;
use crate::io::sim::SimVfs;
use crate::io::LockKind;

#[test]
fn a_written_buffer_is_reused_by_the_appends_after_it() {
    let sim = SimVfs::new();
    let vfs = Arc::new(sim.clone());
    let publisher: Arc<dyn StoreLock> = Arc::from(vfs.lock(LockKind::Writer).expect("lock"));
    let segments = Segments::open(vfs.clone(), false).expect("segments");
    let wal = Wal::new(vfs, publisher, 1, Lsn(0), 0);
    let mut lsn = 0;
    let mut append = |wal: &Wal| {
        lsn += 1;
        wal.append_checkpoint_commit(Lsn(lsn), lsn)
            .expect("append a record");
        lsn
    };
    while wal.lock().buf.len() < WRITE_OUT_BYTES {
        append(&wal);
    }
    let grown = wal.lock().buf.capacity();
    wal.write_out().expect("write out");
    assert!(wal.lock().buf.is_empty());
    assert_eq!(
        wal.lock().spare.capacity(),
        grown,
        "the written buffer is kept"
    );
    // The next write (a sync's) takes the kept buffer for the appends after it.
    let last = append(&wal);
    wal.sync_to(Lsn(last), &segments).expect("sync");
    assert!(
        wal.lock().buf.capacity() >= grown,
        "appends go on in the kept buffer"
    );
    let last = append(&wal);
    wal.sync_to(Lsn(last), &segments).expect("sync");
    // Every record is in the file, in order, as recovery reads it.
    let lsns: Vec<u64> = Generations::read(&sim, 1, Lsn(0))
        .expect("list the log")
        .flat_map(|g| g.expect("read a generation").records)
        .map(|r| r.lsn.0)
        .collect();
    assert_eq!(lsns, (1..=last).collect::<Vec<_>>());
}
