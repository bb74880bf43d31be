//! A volume served over NBD by the real server, driven by the test client.

use super::export::VolumeExports;
use super::Volume;
use crate::nbd::proto::{self, Request};
use crate::nbd::test_client::Client;
use crate::nbd::{Exports, Listen, Server, ServerOptions, ShutdownHandle};
use crate::store::Store;
use std::io::Write;

/// `store` served by the real server on a Unix socket, with a client that has done
/// GO on volume "vol" (structured replies).
struct Served {
    client: Client,
    handle: ShutdownHandle,
    serving: std::thread::JoinHandle<std::io::Result<()>>,
    _dir: tempfile::TempDir,
}

impl Served {
    fn start(store: &Store) -> Served {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nbd.sock");
        let server = Server::bind(&Listen::Unix(path.clone()), ServerOptions::default()).unwrap();
        let handle = server.shutdown_handle();
        let exports: std::sync::Arc<dyn Exports> =
            std::sync::Arc::new(VolumeExports::new(store.clone()));
        let serving = std::thread::spawn(move || server.run(exports));
        let mut client = Client::connect(&path).unwrap();
        client.go("vol", true, false).unwrap();
        Served {
            client,
            handle,
            serving,
            _dir: dir,
        }
    }

    /// Disconnects, shuts the server down and waits for it to end cleanly.
    fn stop(self) {
        drop(self.client);
        self.handle.shutdown();
        self.serving.join().unwrap().unwrap();
    }
}

/// A new store in a temporary directory, with a volume "vol" of `size` bytes.
fn store_with_volume(size: u64) -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::create(dir.path().join("store")).unwrap();
    Volume::create(&store, "vol", size, 4096).unwrap();
    (dir, store)
}

/// Reads volume "vol" whole from the store (the server gone) and checks it is `model`.
fn assert_volume_holds(store: &Store, model: &[u8]) {
    let mut stored = vec![0u8; model.len()];
    Volume::open(store, "vol")
        .unwrap()
        .read_at(0, &mut stored)
        .unwrap();
    assert!(stored == model, "the store holds what was answered");
}

/// A volume's large writes land in two steps (`Export::writer`): each one's data goes
/// to disk while the one before it commits. A pipelined stream of them, with rewrites
/// of earlier ones, one holding a block of zeroes (landed in one step), one with FUA
/// and one past the end, is answered write by write and reads back, over the wire
/// and from the store after the server is gone, as the writes say in their order.
#[test]
fn a_volumes_large_writes_land_in_two_steps_in_order() {
    const SIZE: usize = 4 << 20;
    const BIG: usize = 256 << 10;

    let (_dir, store) = store_with_volume(SIZE as u64);
    let mut served = Served::start(&store);
    let c = &mut served.client;
    let mut model = vec![0u8; SIZE];
    let mut stream = Vec::new();
    let mut want_errors = Vec::new();
    let mut add = |flags: u16, command: u16, offset: usize, payload: &[u8], error: u32| {
        let cookie = want_errors.len() as u64;
        let len = if command == proto::CMD_READ {
            SIZE
        } else {
            payload.len()
        };
        let req = Request {
            flags,
            command,
            cookie,
            offset: offset as u64,
            len: len as u32,
        };
        stream.extend_from_slice(&req.encode());
        stream.extend_from_slice(payload);
        want_errors.push(error);
    };
    let pattern = |seed: usize, len: usize| -> Vec<u8> {
        (0..len)
            .map(|i| ((i / 4096 * 31 + seed * 7) % 251 + 1) as u8)
            .collect()
    };
    // A sequential stream (landings joined and pipelined), then rewrites.
    let mut writes = Vec::new();
    for i in 0..SIZE / BIG {
        writes.push((0, i * BIG, pattern(i, BIG)));
    }
    writes.push((0, BIG / 2, pattern(100, 2 * BIG)));
    let mut with_zeroes = pattern(101, BIG);
    with_zeroes[4096..8192].fill(0);
    writes.push((0, 3 * BIG, with_zeroes));
    writes.push((proto::CMD_FLAG_FUA, 5 * BIG, pattern(102, BIG)));
    for (flags, offset, data) in &writes {
        add(*flags, proto::CMD_WRITE, *offset, data, 0);
        model[*offset..*offset + data.len()].copy_from_slice(data);
    }
    add(0, proto::CMD_WRITE, SIZE - 4096, &pattern(103, BIG), 28);
    add(0, proto::CMD_WRITE, 9 * BIG, &pattern(104, BIG), 0);
    model[9 * BIG..10 * BIG].copy_from_slice(&pattern(104, BIG));
    add(0, proto::CMD_READ, 0, &[], 0);
    add(0, proto::CMD_FLUSH, 0, &[], 0);
    let requests = want_errors.len();
    c.s.write_all(&stream).unwrap();
    let mut replies = std::collections::BTreeMap::new();
    for _ in 0..requests {
        let r = c.recv(SIZE).unwrap();
        assert!(
            replies.insert(r.cookie, r).is_none(),
            "one reply per request"
        );
    }
    let errors: Vec<u32> = replies.values().map(|r| r.error).collect();
    assert_eq!(errors, want_errors);
    let read = &replies[&(requests as u64 - 2)].data;
    assert!(
        *read == model,
        "the read sees every write before it, in order"
    );
    served.stop();

    assert_volume_holds(&store, &model);
}

/// Overlapping large writes sent in bursts (landings queue behind each other and go
/// through the committer) and one at a time with pauses (the lander, finding nothing
/// queued, commits them itself): whichever thread commits each, they apply in the
/// order sent, every one is answered, and a flush at the end covers them all.
#[test]
fn large_writes_in_bursts_and_trickles_apply_in_order() {
    const SIZE: usize = 16 << 20;
    let (_dir, store) = store_with_volume(SIZE as u64);
    let mut served = Served::start(&store);
    let c = &mut served.client;
    let mut model = vec![0u8; SIZE];
    let mut rng = 0x2545_F491_4F6C_DD1D_u64;
    let mut next = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let mut cookie = 0u64;
    for round in 0..12u64 {
        let burst = round % 2 == 0;
        let writes = 4 + next(8);
        let mut stream = Vec::new();
        for _ in 0..writes {
            // 256 KiB to 2 MiB, block-aligned: a burst's within its first 1 MiB, so
            // each overlaps the ones before it (any two applied out of order show).
            let len = (64 + next(449) as usize) * 4096;
            let offset = match burst {
                true => next(256) as usize * 4096,
                false => next(((SIZE - len) / 4096) as u64 + 1) as usize * 4096,
            };
            let fill = (cookie % 250 + 1) as u8;
            let req = Request {
                flags: 0,
                command: proto::CMD_WRITE,
                cookie,
                offset: offset as u64,
                len: len as u32,
            };
            cookie += 1;
            model[offset..offset + len].fill(fill);
            if burst {
                stream.extend_from_slice(&req.encode());
                stream.extend_from_slice(&vec![fill; len]);
            } else {
                c.s.write_all(&req.encode()).unwrap();
                c.s.write_all(&vec![fill; len]).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(next(3)));
            }
        }
        c.s.write_all(&stream).unwrap();
        for _ in 0..writes {
            let r = c.recv(0).unwrap();
            assert_eq!(r.error, 0, "write {} refused", r.cookie);
        }
    }
    let r = c.cmd(proto::CMD_FLUSH, 0, 0, 0, &[]).unwrap();
    assert_eq!(r.error, 0);
    let r = c.cmd(proto::CMD_READ, 0, 0, SIZE as u32, &[]).unwrap();
    assert!(r.data == model, "the writes applied out of order");
    served.stop();
    assert_volume_holds(&store, &model);
}

/// The disk fills while a stream of large writes lands in two steps: every write is
/// answered, with success or ENOSPC, nothing hangs, and afterwards each write
/// answered with success is there and each one refused left its range as it was.
#[test]
fn a_disk_filling_under_two_step_landings_refuses_whole_writes() {
    const SIZE: usize = 32 << 20;
    const WRITE: usize = 1 << 20;
    let (sim, store) = super::tests::sim_store();
    Volume::create(&store, "vol", SIZE as u64, 4096).unwrap();
    let mut served = Served::start(&store);
    let c = &mut served.client;
    sim.set_capacity(Some(sim.used_bytes() + (8 << 20)));
    let pattern = |i: usize| vec![(i % 250 + 1) as u8; WRITE];
    let mut stream = Vec::new();
    let writes = SIZE / WRITE;
    for i in 0..writes {
        let req = Request {
            flags: 0,
            command: proto::CMD_WRITE,
            cookie: i as u64,
            offset: (i * WRITE) as u64,
            len: WRITE as u32,
        };
        stream.extend_from_slice(&req.encode());
        stream.extend_from_slice(&pattern(i));
    }
    c.s.write_all(&stream).unwrap();
    let mut answered = vec![None; writes];
    for _ in 0..writes {
        let r = c.recv(0).unwrap();
        answered[r.cookie as usize] = Some(r.error);
    }
    let answered: Vec<u32> = answered.into_iter().map(Option::unwrap).collect();
    assert!(answered.iter().all(|&e| e == 0 || e == 28), "{answered:?}");
    assert!(answered.contains(&0), "nothing fit: {answered:?}");
    assert!(
        answered.contains(&28),
        "the disk never filled: {answered:?}"
    );

    sim.set_capacity(None);
    let r = c.cmd(proto::CMD_READ, 0, 0, SIZE as u32, &[]).unwrap();
    assert_eq!(r.error, 0);
    for (i, &error) in answered.iter().enumerate() {
        let got = &r.data[i * WRITE..(i + 1) * WRITE];
        if error == 0 {
            assert!(
                got == pattern(i).as_slice(),
                "write {i} answered but not there"
            );
        } else {
            assert!(
                got.iter().all(|&b| b == 0),
                "write {i} refused but (partly) there"
            );
        }
    }
    served.stop();
}
