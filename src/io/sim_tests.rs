//! Tests of the crash simulator: what survives a crash under each mode, injected
//! failures, and a random-operation run checked against a model.

use super::*;

fn read_all(f: &Arc<dyn VFile>) -> Vec<u8> {
    let mut buf = vec![0; f.len().unwrap() as usize];
    f.read_exact_at(&mut buf, 0).unwrap();
    buf
}

fn content(vfs: &SimVfs, name: &str) -> Option<Vec<u8>> {
    vfs.read_file(name)
}

/// A durable file "a" holding `data`.
fn durable_file(vfs: &SimVfs, data: &[u8]) -> Arc<dyn VFile> {
    let f = vfs.create("a").unwrap();
    f.write_all_at(data, 0).unwrap();
    f.sync().unwrap();
    vfs.sync_dir().unwrap();
    f
}

#[test]
fn reads_see_writes() {
    let vfs = SimVfs::new();
    let f = vfs.create("a").unwrap();
    f.write_all_at(b"hello", 3).unwrap();
    assert_eq!(read_all(&f), b"\0\0\0hello");
    let mut buf = [0u8; 4];
    assert_eq!(
        f.read_exact_at(&mut buf, 6).unwrap_err().kind(),
        io::ErrorKind::UnexpectedEof
    );
    f.set_len(4).unwrap();
    assert_eq!(read_all(&f), b"\0\0\0h");
    assert!(vfs.exists("a").unwrap());
    assert_eq!(
        vfs.create("a").err().unwrap().kind(),
        io::ErrorKind::AlreadyExists
    );
    assert_eq!(vfs.open("b").err().unwrap().kind(), io::ErrorKind::NotFound);
    let g = vfs.open("a").unwrap();
    assert_eq!(read_all(&g), b"\0\0\0h");
}

#[test]
fn synced_data_survives_every_crash() {
    for seed in 0..200 {
        let vfs = SimVfs::new();
        let f = durable_file(&vfs, &[7u8; 3000]);
        f.write_all_at(&[9u8; 1500], 1000).unwrap();
        f.sync().unwrap();
        let after = vfs.crash(seed);
        let mut expect = vec![7u8; 3000];
        expect[1000..2500].fill(9);
        assert_eq!(content(&after, "a").unwrap(), expect, "seed {seed}");
    }
}

#[test]
fn unsynced_data_can_vanish() {
    let vfs = SimVfs::new();
    let f = durable_file(&vfs, b"base");
    f.write_all_at(b"more", 4).unwrap();
    let after = vfs.crash_drop_all();
    assert_eq!(content(&after, "a").unwrap(), b"base");

    // Across seeds, both outcomes occur, and nothing else.
    let (mut kept, mut lost) = (false, false);
    for seed in 0..100 {
        let vfs = SimVfs::new();
        let f = durable_file(&vfs, b"base");
        f.write_all_at(b"more", 4).unwrap();
        match content(&vfs.crash(seed), "a").unwrap().as_slice() {
            b"basemore" => kept = true,
            b"base" => lost = true,
            other => panic!("seed {seed}: unexpected {other:?}"),
        }
    }
    assert!(kept && lost);
}

#[test]
fn torn_write_keeps_a_sector_prefix() {
    let mut lengths = std::collections::BTreeSet::new();
    for seed in 0..300 {
        let vfs = SimVfs::new();
        let f = durable_file(&vfs, &[1u8; 100]);
        let data: Vec<u8> = (0..2000u32).map(|i| (i % 251) as u8 + 2).collect();
        f.write_all_at(&data, 100).unwrap();
        let got = content(&vfs.crash(seed), "a").unwrap();
        assert_eq!(&got[..100], &[1u8; 100][..]);
        let kept = got.len() - 100;
        assert!(
            kept == 2000 || kept.is_multiple_of(SECTOR),
            "seed {seed}: kept {kept}"
        );
        assert_eq!(&got[100..], &data[..kept], "seed {seed}");
        lengths.insert(kept);
    }
    // Whole, nothing, and torn prefixes all occur.
    for want in [0, 512, 1024, 1536, 2000] {
        assert!(lengths.contains(&want), "never kept {want}: {lengths:?}");
    }
}

#[test]
fn unsynced_writes_are_independent() {
    // Two unsynced writes to disjoint places: all four combinations occur.
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..400 {
        let vfs = SimVfs::new();
        let f = durable_file(&vfs, &[0u8; 2048]);
        f.write_all_at(&[1u8; 512], 0).unwrap();
        f.write_all_at(&[2u8; 512], 1024).unwrap();
        let got = content(&vfs.crash(seed), "a").unwrap();
        assert_eq!(got.len(), 2048);
        seen.insert((got[0], got[1024]));
    }
    assert_eq!(seen.len(), 4, "{seen:?}");
}

#[test]
fn dir_ops_need_sync_dir() {
    let vfs = SimVfs::new();
    let f = vfs.create("new").unwrap();
    f.write_all_at(b"data", 0).unwrap();
    f.sync().unwrap();
    let after = vfs.crash_drop_all();
    assert!(
        !after.exists("new").unwrap(),
        "undirsynced create must vanish"
    );

    let vfs = SimVfs::new();
    durable_file(&vfs, b"keep");
    vfs.remove("a").unwrap();
    assert!(!vfs.exists("a").unwrap());
    let after = vfs.crash_drop_all();
    assert_eq!(
        content(&after, "a").unwrap(),
        b"keep",
        "undirsynced remove must be undone"
    );

    let vfs = SimVfs::new();
    durable_file(&vfs, b"old");
    let t = vfs.create("tmp").unwrap();
    t.write_all_at(b"new", 0).unwrap();
    t.sync().unwrap();
    vfs.rename("tmp", "a").unwrap();
    assert_eq!(content(&vfs, "a").unwrap(), b"new");
    let after = vfs.crash_drop_all();
    assert_eq!(
        content(&after, "a").unwrap(),
        b"old",
        "undirsynced rename must be undone"
    );
    assert!(!after.exists("tmp").unwrap());

    let vfs = SimVfs::new();
    durable_file(&vfs, b"old");
    let t = vfs.create("tmp").unwrap();
    t.write_all_at(b"new", 0).unwrap();
    t.sync().unwrap();
    vfs.rename("tmp", "a").unwrap();
    vfs.sync_dir().unwrap();
    for seed in 0..50 {
        let v = vfs.fork();
        let after = v.crash(seed);
        assert_eq!(after.names(), vec!["a".to_string()]);
        assert_eq!(content(&after, "a").unwrap(), b"new");
    }
}

#[test]
fn undirsynced_ops_survive_only_as_a_prefix() {
    for seed in 0..200 {
        let vfs = SimVfs::new();
        vfs.sync_dir().unwrap();
        for name in ["x", "y", "z"] {
            let f = vfs.create(name).unwrap();
            f.write_all_at(name.as_bytes(), 0).unwrap();
            f.sync().unwrap();
        }
        let names = vfs.crash(seed).names();
        let all = ["x", "y", "z"];
        assert_eq!(names, all[..names.len()].to_vec(), "seed {seed}");
    }
}

#[test]
fn old_handles_fail_after_crash() {
    let vfs = SimVfs::new();
    let f = durable_file(&vfs, b"abc");
    let other = vfs.clone();
    let after = vfs.crash(1);
    let mut buf = [0u8; 1];
    assert!(f.read_exact_at(&mut buf, 0).is_err());
    assert!(f.write_all_at(b"x", 0).is_err());
    assert!(f.sync().is_err());
    assert!(f.len().is_err());
    assert!(f.set_len(0).is_err());
    assert!(other.open("a").is_err());
    assert!(other.create("b").is_err());
    assert!(other.list().is_err());
    assert!(other.exists("a").is_err());
    assert!(other.sync_dir().is_err());
    assert!(other.lock(super::LockKind::Writer).is_err());
    let err = f.sync().unwrap_err();
    assert!(err.to_string().contains("simulated power loss"));
    // The new image is independent and usable.
    let g = after.open("a").unwrap();
    assert_eq!(read_all(&g), b"abc");
    g.write_all_at(b"d", 3).unwrap();
    assert_eq!(read_all(&g), b"abcd");
}

#[test]
fn fault_injection_fires_at_the_right_op() {
    let vfs = SimVfs::new();
    let f = vfs.create("a").unwrap(); // op 0
    assert_eq!(vfs.op_count(), 1);
    vfs.set_fail_after(Some(2));
    f.write_all_at(b"1", 0).unwrap(); // op 1
    f.sync().unwrap(); // op 2
    assert!(f.write_all_at(b"2", 1).is_err()); // op 3: fails
    assert!(f.sync().is_err());
    assert!(vfs.sync_dir().is_err());
    assert!(vfs.create("b").is_err());
    // Reads still work and the failed write had no effect.
    assert_eq!(read_all(&f), b"1");
    assert_eq!(vfs.op_count(), 7);
    vfs.set_fail_after(None);
    f.write_all_at(b"2", 1).unwrap();
    assert_eq!(read_all(&f), b"12");

    vfs.set_fail_once_after(Some(1));
    f.write_all_at(b"3", 2).unwrap();
    assert!(f.write_all_at(b"4", 3).is_err());
    f.write_all_at(b"4", 3).unwrap();
    assert_eq!(read_all(&f), b"1234");
    assert!(f.set_len(0).is_ok());
}

#[test]
fn read_faults() {
    let vfs = SimVfs::new();
    let f = durable_file(&vfs, b"abc");
    let mut buf = [0u8; 1];
    vfs.set_read_fail_once_after(Some(1));
    f.read_exact_at(&mut buf, 0).unwrap();
    assert!(f.read_exact_at(&mut buf, 0).is_err());
    f.read_exact_at(&mut buf, 0).unwrap();
    vfs.set_read_fail_after(Some(0));
    assert!(f.read_exact_at(&mut buf, 0).is_err());
    assert!(f.write_all_at(b"x", 0).is_ok(), "writes are not affected");
    vfs.set_read_fail_after(None);
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(vfs.read_count(), 5);
}

#[test]
fn corrupt_and_fork() {
    let vfs = SimVfs::new();
    let f = durable_file(&vfs, b"abc");
    let copy = vfs.fork();
    assert!(vfs.corrupt("a", 1, 0xff));
    assert!(!vfs.corrupt("a", 10, 0xff));
    assert!(!vfs.corrupt("zz", 0, 0xff));
    assert_eq!(read_all(&f), [b'a', b'b' ^ 0xff, b'c']);
    assert_eq!(content(&copy, "a").unwrap(), b"abc");
    let after = vfs.crash_drop_all();
    assert_eq!(content(&after, "a").unwrap(), [b'a', b'b' ^ 0xff, b'c']);
    assert_eq!(copy.file_len("a"), Some(3));
    assert_eq!(copy.names(), vec!["a".to_string()]);
}

#[test]
fn crash_is_deterministic() {
    let build = || {
        let vfs = SimVfs::new();
        vfs.sync_dir().unwrap();
        for (i, name) in ["p", "q", "r"].iter().enumerate() {
            let f = vfs.create(name).unwrap();
            for j in 0..5u8 {
                f.write_all_at(&vec![j + i as u8; 700], j as u64 * 600)
                    .unwrap();
            }
        }
        vfs.sync_dir().unwrap();
        vfs
    };
    for seed in 0..50 {
        let a = build().crash(seed);
        let b = build().crash(seed);
        for n in a.names() {
            assert_eq!(a.read_file(&n), b.read_file(&n), "seed {seed}");
        }
        assert_eq!(a.names(), b.names());
    }
}

#[test]
fn keep_all_crash_equals_current_state() {
    let mut rng = SplitMix(42);
    for round in 0..50 {
        let vfs = SimVfs::new();
        let mut files = Vec::new();
        for name in ["a", "b", "c"] {
            files.push(vfs.create(name).unwrap());
        }
        for _ in 0..40 {
            let f = &files[rng.below(3) as usize];
            match rng.below(10) {
                0 => f.sync().unwrap(),
                1 => f.set_len(rng.below(3000)).unwrap(),
                2 => vfs.sync_dir().unwrap(),
                _ => {
                    let data = vec![rng.next_u64() as u8; rng.below(1500) as usize];
                    f.write_all_at(&data, rng.below(3000)).unwrap();
                }
            }
        }
        let before: Vec<_> = vfs.names().iter().map(|n| vfs.read_file(n)).collect();
        let names = vfs.names();
        let after = vfs.crash_keep_all();
        assert_eq!(after.names(), names, "round {round}");
        let got: Vec<_> = names.iter().map(|n| after.read_file(n)).collect();
        assert_eq!(got, before, "round {round}");
    }
}

#[test]
fn threads_share_one_file() {
    let vfs = SimVfs::new();
    let f = vfs.create("a").unwrap();
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let f = f.clone();
            s.spawn(move || {
                for i in 0..100u64 {
                    f.write_all_at(&[t], i * 4 + t as u64).unwrap();
                }
            });
        }
    });
    assert_eq!(f.len().unwrap(), 400);
    let all = read_all(&f);
    for (i, b) in all.iter().enumerate() {
        assert_eq!(*b as usize, i % 4);
    }
}
