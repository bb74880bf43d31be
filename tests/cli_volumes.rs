//! The `volume` commands end to end, through the binary: output, JSON, exit codes,
//! and a sparse raw image imported and exported byte for byte.

mod cli_common;

use cli_common::{fails, ok, s, usage_error, TestStore};
use std::os::unix::fs::{FileExt, MetadataExt};

impl TestStore {
    fn volume(&self, sub: &str, rest: &[&str]) -> std::process::Output {
        let mut args = vec!["volume", sub, self.d()];
        args.extend_from_slice(rest);
        cli_common::run(&args)
    }

    /// The names `volume list --json` gives, in its order.
    fn volume_names(&self) -> Vec<String> {
        self.volume_json("list", &[])
            .as_array()
            .expect("a list")
            .iter()
            .map(|v| v["name"].as_str().expect("a name").to_owned())
            .collect()
    }

    fn volume_json(&self, sub: &str, rest: &[&str]) -> serde_json::Value {
        let mut args = vec!["--json", "volume", sub, self.d()];
        args.extend_from_slice(rest);
        serde_json::from_str(&ok(cli_common::run(&args))).unwrap()
    }
}

/// Volume `name`'s entry in `volume list --json`'s output.
fn listed_as<'a>(listed: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    let all = listed.as_array().expect("a list");
    all.iter().find(|v| v["name"] == name).expect("listed")
}

#[test]
fn create_list_snapshot_clone_resize_drop() {
    let t = TestStore::new();
    assert_eq!(
        ok(t.volume("create", &["disk", "--size", "10G"])),
        "created volume disk: 10.0 GiB in 4.0 KiB blocks\n"
    );
    let out = ok(t.volume("snapshot", &["disk", "disk.1"]));
    assert!(
        out.starts_with("created snapshot disk.1 of volume disk in "),
        "{out}"
    );
    let out = ok(t.volume("clone", &["disk.1", "work"]));
    assert!(
        out.starts_with("created volume work as a clone of disk.1 in "),
        "{out}"
    );
    let list = ok(t.volume("list", &[]));
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(lines.len(), 4, "{list}");
    assert!(
        lines[0].starts_with("VOLUME") && lines[0].contains("ALLOCATED"),
        "{list}"
    );
    assert!(
        lines[2].starts_with("disk.1") && lines[2].contains("snapshot"),
        "{list}"
    );
    let json = t.volume_json("list", &[]);
    let names: Vec<&str> = json
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["disk", "disk.1", "work"]);
    assert_eq!(json[0]["size_bytes"], 10u64 << 30);
    assert_eq!(json[0]["provisioned_bytes"], 10u64 << 30);
    assert_eq!(
        json[0]["exclusive_bytes"].as_u64().map(|b| b < 4096),
        Some(true)
    );
    assert_eq!(
        json[1]["shared_bytes"].as_u64().map(|b| b < 4096),
        Some(true)
    );
    assert_eq!(json[0]["allocated_bytes"], 0);
    assert_eq!(json[1]["snapshot"], true);
    assert_eq!(json[2]["parent"], "disk.1");

    let resized = t.volume_json("resize", &["work", "--size", "20G"]);
    assert_eq!(resized["size_bytes"], 20u64 << 30);
    assert_eq!(ok(t.volume("drop", &["work"])), "dropped volume work\n");
    // The key-value branch is not a volume.
    assert_eq!(t.volume_json("list", &[]).as_array().unwrap().len(), 2);
    assert!(ok(t.run("verify", &[])).contains("clean"));
}

#[test]
fn errors_have_their_exit_codes() {
    let t = TestStore::new();
    ok(t.volume("create", &["disk", "--size", "1M", "--block-size", "512"]));
    // 1: unknown volume (main is a branch, not a volume).
    fails(
        t.volume("snapshot", &["nope", "s"]),
        1,
        &["no volume named \"nope\""],
    );
    fails(
        t.volume("drop", &["main"]),
        1,
        &["no volume named \"main\""],
    );
    fails(t.volume("resize", &["nope", "--size", "1M"]), 1, &["nope"]);
    fails(t.volume("export", &["nope", "/tmp/x/never"]), 1, &["nope"]);
    // 2: usage.
    usage_error(t.volume("create", &["v", "--size", "10Q"]));
    usage_error(t.volume("create", &["v", "--size", "1000", "--block-size", "4K"]));
    usage_error(t.volume("create", &["v", "--size", "1M", "--block-size", "3000"]));
    usage_error(t.volume("create", &["bad name", "--size", "1M"]));
    usage_error(t.volume("resize", &["disk", "--size", "1000"]));
    // 3: name taken, read-only.
    fails(
        t.volume("create", &["disk", "--size", "1M"]),
        3,
        &["already exists"],
    );
    ok(t.volume("snapshot", &["disk", "snap"]));
    fails(
        t.volume("resize", &["snap", "--size", "2M"]),
        3,
        &["read-only"],
    );
    // 3: a volume's keys are blocks; pairs written by hand would break it.
    for rest in [
        &["k", "v", "--branch", "disk"][..],
        &["k", "v", "--branch", "snap"][..],
    ] {
        fails(t.run("put", rest), 3, &["block volume"]);
    }
    fails(
        t.run("del", &["k", "--branch", "disk"]),
        3,
        &["block volume"],
    );
    fails(
        t.batch(&["--branch", "disk"], "k\tv\n"),
        3,
        &["block volume"],
    );
    ok(t.run("verify", &[]));
    // 2: --listen that is not an ADDR:PORT.
    usage_error(t.run("serve", &["--listen", "garbage"]));
    usage_error(t.run("serve", &["--listen", "127.0.0.1:99999"]));
}

#[test]
fn import_and_export_keep_holes_and_bytes() {
    let t = TestStore::new();
    let tmp = tempfile::tempdir().unwrap();
    let image = tmp.path().join("disk.raw");
    let len: u64 = 64 << 20;
    {
        let f = std::fs::File::create(&image).unwrap();
        f.set_len(len).unwrap();
        // Data at a few places, the rest holes; one write not block-aligned and one
        // reaching the very end.
        f.write_all_at(&[0xAB; 8192], 0).unwrap();
        f.write_all_at(b"hello, volumes", (5 << 20) + 100).unwrap();
        f.write_all_at(&[7; 3 << 20], 30 << 20).unwrap();
        f.write_all_at(&[9; 4096], len - 4096).unwrap();
    }
    let out = ok(t.volume("import", &["img", s(&image)]));
    assert!(out.starts_with("imported "), "{out}");
    let info = t.volume_json("list", &[]);
    assert_eq!(info[0]["size_bytes"], len);
    let data_blocks = 2 + 1 + (3 << 20) / 4096 + 1;
    assert_eq!(info[0]["allocated_bytes"], data_blocks * 4096);

    let back = tmp.path().join("back.raw");
    let out = ok(t.volume("export", &["img", s(&back)]));
    assert!(out.starts_with("exported volume img to "), "{out}");
    assert!(std::fs::read(&image).unwrap() == std::fs::read(&back).unwrap());
    // Sparse: far fewer bytes allocated than the size.
    let allocated = std::fs::metadata(&back).unwrap().blocks() * 512;
    assert!(allocated < 8 << 20, "export allocated {allocated} bytes");
    fails(
        t.volume("import", &["img", s(&image)]),
        3,
        &["already exists"],
    );
    fails(
        t.volume("import", &["other", "/nonexistent/file"]),
        3,
        &["/nonexistent/file"],
    );
}

#[test]
fn verify_checks_volume_blocks_against_the_header() {
    let t = TestStore::new();
    ok(t.volume("create", &["disk", "--size", "1M"]));
    assert!(ok(t.run("verify", &[])).contains("clean"));
    // A one-byte "block", written around the volume layer (the CLI's `put` refuses
    // a volume; the library's transactions do not look).
    {
        let store = cambium::Store::open(t.d()).unwrap();
        let mut txn = store.begin_write_on("disk").unwrap();
        txn.put(&[1, 0, 0, 0, 0, 0, 0, 0, 3], &[0xaa]).unwrap();
        txn.commit().unwrap();
        store.close().unwrap();
    }
    let out = cli_common::run(&["verify", t.d()]);
    assert_eq!(out.status.code(), Some(4), "{}", cli_common::stdout(&out));
    assert!(
        cli_common::stdout(&out).contains("block 3 holds 1 bytes, not 4096"),
        "{}",
        cli_common::stdout(&out)
    );
}

/// An image on stdin (`-`) or from a pipe: the volume takes the image's length,
/// rounded up to whole blocks (and says so); holes stay holes; an empty input makes
/// no volume.
#[test]
fn import_from_stdin_and_pipes() {
    let t = TestStore::new();
    // 2.5 MiB and 100 bytes: data, a 1 MiB hole, data to a ragged end.
    let mut image = vec![0u8; (5 << 19) + 100];
    image[..1 << 20].fill(0x5A);
    image[2 << 20..].fill(0xC3);
    let out = ok(cli_common::run_stdin(
        &["volume", "import", t.d(), "piped", "-"],
        &image,
    ));
    assert!(
        out.starts_with("imported the input into volume piped: ")
            && out.contains(&format!("the image's {} bytes rounded up", image.len())),
        "{out}"
    );
    let listed = t.volume_json("list", &[]);
    let size = image.len().div_ceil(4096) * 4096;
    assert_eq!(listed[0]["size_bytes"], size as u64);
    let data = (1 << 20) + (image.len() - (2 << 20)).div_ceil(4096) * 4096;
    assert_eq!(listed[0]["allocated_bytes"], data as u64);

    let tmp = tempfile::tempdir().unwrap();
    let back = tmp.path().join("back.raw");
    ok(t.volume("export", &["piped", s(&back)]));
    let mut expected = image.clone();
    expected.resize(size, 0);
    assert!(std::fs::read(&back).unwrap() == expected);

    // A named pipe is read as a stream too (it has no length to stat).
    let fifo = tmp.path().join("image.fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let writer = {
        let (fifo, image) = (fifo.clone(), image.clone());
        std::thread::spawn(move || std::fs::write(fifo, image).unwrap())
    };
    ok(t.volume("import", &["fifo", s(&fifo), "--block-size", "64K"]));
    writer.join().unwrap();
    let back2 = tmp.path().join("back2.raw");
    ok(t.volume("export", &["fifo", s(&back2)]));
    let mut expected = image.clone();
    expected.resize(image.len().div_ceil(65536) * 65536, 0);
    assert!(std::fs::read(&back2).unwrap() == expected);

    fails(
        cli_common::run_stdin(&["volume", "import", t.d(), "empty", "-"], b""),
        3,
        &["the input is empty"],
    );
    let names = t.volume_names();
    assert_eq!(
        names,
        ["piped", "fifo"],
        "no volume left by the empty import"
    );
    assert!(ok(t.run("verify", &[])).contains("clean"));
}

/// `--size` gives an import its volume's size: a larger one than the image reads as
/// zeroes past it, a smaller one is refused (before anything is made, for a file;
/// when the stream passes it, for a stream, whose volume then goes), and an endless
/// stream (`/dev/zero`) ends in that refusal instead of being read forever.
#[test]
fn import_with_a_size() {
    let t = TestStore::new();
    let tmp = tempfile::tempdir().unwrap();
    let image: Vec<u8> = (0..(3 << 20) + 100).map(|i| (i % 251) as u8 + 1).collect();
    let file = tmp.path().join("image.raw");
    std::fs::write(&file, &image).unwrap();

    for (name, out) in [
        (
            "from-file",
            t.volume("import", &["from-file", s(&file), "--size", "8M"]),
        ),
        (
            "from-stdin",
            cli_common::run_stdin(
                &["volume", "import", t.d(), "from-stdin", "-", "--size", "8M"],
                &image,
            ),
        ),
    ] {
        let out = ok(out);
        assert!(
            out.contains(&format!(
                "8.0 MiB, 3.0 MiB allocated (the image's {} bytes, then zeroes)",
                image.len()
            )),
            "{out}"
        );
        assert_eq!(
            listed_as(&t.volume_json("list", &[]), name)["size_bytes"],
            8u64 << 20
        );
        let back = tmp.path().join(format!("{name}.back"));
        ok(t.volume("export", &[name, s(&back)]));
        let mut expected = image.clone();
        expected.resize(8 << 20, 0);
        assert!(std::fs::read(&back).unwrap() == expected, "{name}");
    }

    fails(
        t.volume("import", &["small-file", s(&file), "--size", "3M"]),
        3,
        &["image.raw is longer than the volume's --size 3145728 (3.0 MiB)"],
    );
    fails(
        cli_common::run_stdin(
            &[
                "volume",
                "import",
                t.d(),
                "small-stdin",
                "-",
                "--size",
                "3M",
            ],
            &image,
        ),
        3,
        &["the input is longer than the volume's --size 3145728 (3.0 MiB)"],
    );
    fails(
        t.volume("import", &["endless", "/dev/zero", "--size", "16M"]),
        3,
        &["longer than the volume's --size 16777216 (16.0 MiB)"],
    );
    // An empty image with a size is a volume of zeroes.
    ok(cli_common::run_stdin(
        &["volume", "import", t.d(), "zeroes", "-", "--size", "1M"],
        b"",
    ));
    let names = t.volume_names();
    assert_eq!(
        names,
        ["from-file", "from-stdin", "zeroes"],
        "refused imports leave nothing"
    );
    assert!(ok(t.run("verify", &[])).contains("clean"));
}

/// A snapshot of a snapshot says what it was made of.
#[test]
fn a_snapshot_of_a_snapshot_says_so() {
    let t = TestStore::new();
    ok(t.volume("create", &["disk", "--size", "1M"]));
    ok(t.volume("snapshot", &["disk", "s1"]));
    let out = ok(t.volume("snapshot", &["s1", "s1b"]));
    assert!(
        out.starts_with("created snapshot s1b of snapshot s1 in "),
        "{out}"
    );
}

/// An export that fails removes the file it made (half an image is no image): a
/// 4 EiB volume is larger than most file systems take (ext4: 16 TiB); where one takes
/// it, the export of its holes succeeds.
#[test]
fn a_failed_export_leaves_no_file() {
    let t = TestStore::new();
    ok(t.volume("create", &["huge", "--size", "4E"]));
    let tmp = tempfile::tempdir().unwrap();
    let out_file = tmp.path().join("huge.raw");
    let out = t.volume("export", &["huge", s(&out_file)]);
    match out.status.code() {
        Some(0) => assert_eq!(std::fs::metadata(&out_file).unwrap().len(), 4 << 60),
        _ => {
            fails(out, 3, &["huge.raw"]);
            assert!(!out_file.exists(), "the failed export left its file");
        }
    }
}

/// A loop device over `image`, detached on drop; `None` where this machine does not
/// let the test make one (no root, no loop driver).
struct LoopDevice(String);

impl LoopDevice {
    fn attach(image: &std::path::Path) -> Option<LoopDevice> {
        let out = std::process::Command::new("losetup")
            .args(["--find", "--show", s(image)])
            .output()
            .ok()?;
        let dev = String::from_utf8(out.stdout).ok()?.trim().to_owned();
        (out.status.success() && !dev.is_empty()).then_some(LoopDevice(dev))
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup")
            .args(["--detach", &self.0])
            .status();
    }
}

/// A block device is imported by its length (a seek to its end: its `st_size` is 0),
/// named in the output, with its holes kept.
#[test]
fn import_from_a_block_device() {
    let tmp = tempfile::tempdir().unwrap();
    let backing = tmp.path().join("disk.img");
    let mut image = vec![0u8; 8 << 20];
    image[1 << 20..(1 << 20) + 5].copy_from_slice(b"hello");
    image[6 << 20..7 << 20].fill(0x77);
    std::fs::write(&backing, &image).unwrap();
    let Some(dev) = LoopDevice::attach(&backing) else {
        eprintln!("import_from_a_block_device: no loop device here (losetup failed); not run");
        return;
    };
    let t = TestStore::new();
    let out = ok(t.volume("import", &["disk", &dev.0]));
    assert_eq!(
        out,
        format!(
            "imported {} into volume disk: 8.0 MiB, 1.0 MiB allocated\n",
            dev.0
        )
    );
    let back = tmp.path().join("back.raw");
    ok(t.volume("export", &["disk", s(&back)]));
    assert!(std::fs::read(&back).unwrap() == image);
    assert!(ok(t.run("verify", &[])).contains("clean"));
}

/// An import killed halfway leaves a volume marked incomplete (never taken for the
/// image: listed so, not exported), and running the import again replaces it.
#[test]
fn an_import_cut_short_is_marked_and_replaced_by_the_next() {
    use std::io::Write;
    let t = TestStore::new();
    ok(t.volume("create", &["other", "--size", "1M"]));
    let mut child = std::process::Command::new(cli_common::BIN)
        .args(["volume", "import", t.d(), "img", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    // More than one copy chunk: once the pipe has taken it all, the import has
    // made the volume and is copying into it (the store is its own meanwhile).
    stdin.write_all(&vec![0x6Bu8; 12 << 20]).unwrap();
    stdin.flush().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    child.kill().unwrap();
    child.wait().unwrap();
    drop(stdin);

    let listed = t.volume_json("list", &[]);
    let img = listed_as(&listed, "img");
    assert_eq!(img["incomplete"], true);
    assert_eq!(listed[0]["incomplete"], false, "other volumes are whole");
    let text = ok(t.volume("list", &[]));
    assert!(
        text.lines()
            .any(|l| l.starts_with("img ") && l.contains(" incomplete ")),
        "{text}"
    );
    let verified = ok(t.run("verify", &[]));
    assert!(verified.contains("clean"), "{verified}");
    // No copy of half an image, nor an export of one (the file is not even made).
    fails(t.volume("snapshot", &["img", "img.s"]), 3, &["incomplete"]);
    fails(t.volume("clone", &["img", "img.c"]), 3, &["incomplete"]);
    let tmp = tempfile::tempdir().unwrap();
    let half = tmp.path().join("half.raw");
    fails(t.volume("export", &["img", s(&half)]), 3, &["incomplete"]);
    assert!(!half.exists());
    // Nor by the version commands, nor a resize (which the import would undo).
    fails(t.run("snapshot", &["img", "img.gs"]), 3, &["incomplete"]);
    fails(t.run("branch", &["img", "img.gb"]), 3, &["incomplete"]);
    fails(
        t.volume("resize", &["img", "--size", "16M"]),
        3,
        &["incomplete"],
    );
    assert_eq!(t.volume_json("list", &[]).as_array().map(Vec::len), Some(2));

    // The same import again, from a file: it replaces the remains.
    let image = tmp.path().join("img.raw");
    std::fs::write(&image, vec![0x2Fu8; 3 << 20]).unwrap();
    ok(t.volume("import", &["img", s(&image)]));
    let listed = t.volume_json("list", &[]);
    let img = listed_as(&listed, "img");
    assert_eq!(
        (img["incomplete"].as_bool(), img["size_bytes"].as_u64()),
        (Some(false), Some(3 << 20))
    );
    let back = tmp.path().join("back.raw");
    ok(t.volume("export", &["img", s(&back)]));
    assert!(std::fs::read(&back).unwrap() == vec![0x2Fu8; 3 << 20]);
    // A whole volume is not replaced: the name is taken.
    fails(t.volume("import", &["img", s(&image)]), 3, &["img"]);
}

/// `volume export` to stdout (`-`) and to a file that is not a regular one (here a
/// pipe): the whole image in order, holes as zeroes, nothing else on stdout.
#[test]
fn export_to_stdout_and_pipes() {
    let t = TestStore::new();
    let tmp = tempfile::tempdir().unwrap();
    let image = tmp.path().join("img.raw");
    let mut bytes = vec![0u8; 3 << 20];
    bytes[4096..8192].fill(0x11);
    bytes[(2 << 20) + 512..(2 << 20) + 4096].fill(0x22);
    std::fs::write(&image, &bytes).unwrap();
    ok(t.volume("import", &["img", s(&image)]));

    let out = t.volume("export", &["img", "-"]);
    assert!(out.status.success(), "{}", cli_common::stderr(&out));
    assert!(out.stdout == bytes, "stdout is the image");
    assert!(cli_common::stderr(&out).contains("exported volume img to stdout"));

    let fifo = tmp.path().join("out.fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(fifo).unwrap())
    };
    ok(t.volume("export", &["img", s(&fifo)]));
    assert!(reader.join().unwrap() == bytes, "the pipe got the image");
    assert!(fifo.exists(), "a pipe is written to, not replaced");
}
