//! `cambium serve` end to end with real NBD clients: qemu-img, nbdinfo, nbdcopy
//! (libnbd) and fio's nbd engine, plus a hand-written raw client for the things real
//! clients will not do (writing to a read-only export, garbage, truncated requests).
//!
//! Every test has a store of its own and a server guarded by [`Server`], whose Drop
//! kills the process, so a failing test never leaks a server. A missing client is a
//! failure naming the Debian package to install, never a skip.

mod cli_common;

use cli_common::{fails, ok, run, run_stdin, s, stderr, stdout, TestStore, BIN};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

// ---------------------------------------------------------------------------
// Clients

/// The Debian package each client comes from.
fn package_of(tool: &str) -> &'static str {
    match tool {
        "qemu-img" | "qemu-nbd" => "qemu-utils",
        "nbdinfo" | "nbdcopy" => "libnbd-bin",
        "fio" => "fio",
        other => panic!("unknown client {other}"),
    }
}

/// A command for an NBD client; fails the test (naming the package) if the client
/// is not installed.
fn client(tool: &str) -> Command {
    match Command::new(tool)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "{tool} is not installed: these tests need it (Debian package {})",
            package_of(tool)
        ),
        Err(e) => panic!("cannot run {tool}: {e}"),
    }
    let mut cmd = Command::new(tool);
    cmd.stdin(Stdio::null());
    cmd
}

/// Runs a client to completion.
fn run_client(tool: &str, args: &[&str]) -> Output {
    client(tool).args(args).output().expect("spawn client")
}

/// Runs a client that must succeed; its stdout.
#[track_caller]
fn client_ok(tool: &str, args: &[&str]) -> String {
    let out = run_client(tool, args);
    assert!(
        out.status.success(),
        "{tool} {args:?} failed ({:?}); stdout: {}; stderr: {}",
        out.status,
        stdout(&out),
        stderr(&out)
    );
    stdout(&out)
}

/// One export as `nbdinfo --list --json` reports it.
#[derive(Debug)]
struct ListedExport {
    name: String,
    size: u64,
    read_only: bool,
}

/// `nbdinfo --list --json` on the socket, in the server's order.
fn nbdinfo_list(sock: &Path) -> Vec<ListedExport> {
    let uri = format!("nbd+unix:///?socket={}", s(sock));
    let json: serde_json::Value =
        serde_json::from_str(&client_ok("nbdinfo", &["--list", "--json", &uri]))
            .expect("nbdinfo --json output");
    json["exports"]
        .as_array()
        .expect("exports array")
        .iter()
        .map(|e| ListedExport {
            name: e["export-name"].as_str().unwrap().to_owned(),
            size: e["export-size"].as_u64().unwrap(),
            read_only: e["is_read_only"].as_bool().unwrap(),
        })
        .collect()
}

fn listed_names(sock: &Path) -> Vec<String> {
    nbdinfo_list(sock).into_iter().map(|e| e.name).collect()
}

/// The exit of a fio run that must have written and verified without error.
#[track_caller]
fn assert_fio_clean(out: &Output) {
    let (o, e) = (stdout(out), stderr(out));
    assert!(
        out.status.success(),
        "fio failed ({:?}); stdout: {o}; stderr: {e}",
        out.status
    );
    assert!(o.contains("err= 0"), "fio reported errors: {o}");
    for bad in ["verify failed", "bad magic", "crc32c: verify", "bad header"] {
        assert!(
            !o.contains(bad) && !e.contains(bad),
            "fio verify error {bad:?}: {o} {e}"
        );
    }
}

// ---------------------------------------------------------------------------
// The server

/// A running `cambium serve`, killed (SIGKILL) when dropped unless stopped first.
struct Server {
    child: Child,
    /// The NBD socket, as announced.
    sock: PathBuf,
    /// The export lines of the announcement (`  nbd+unix:///...`).
    exports: Vec<String>,
    stderr: Option<JoinHandle<String>>,
    /// Stdout, line by line (a thread reads it so the server never blocks on it).
    lines: Receiver<String>,
}

impl Server {
    /// Starts `cambium serve DIR` and waits for its announcement.
    fn start(dir: &Path) -> Server {
        let mut child = Command::new(BIN)
            .args(["serve", s(dir)])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn cambium serve");
        let (tx, rx) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut err = child.stderr.take().unwrap();
        let stderr = Some(std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        }));
        let mut server = Server {
            child,
            sock: PathBuf::new(),
            exports: Vec::new(),
            stderr,
            lines: rx,
        };
        let first = server.line();
        let (count, sock) = first
            .strip_prefix("serving ")
            .and_then(|r| r.split_once(" volume(s) on "))
            .unwrap_or_else(|| panic!("unexpected announcement {first:?}"));
        let count: usize = count.parse().expect("volume count");
        server.sock = PathBuf::from(sock);
        assert!(server.sock.is_absolute(), "{first}");
        for _ in 0..count {
            let line = server.line();
            assert!(line.starts_with("  nbd+unix:///"), "{line:?}");
            server.exports.push(line);
        }
        server
    }

    /// The next line of stdout (within 30 s), or a failure with the server's stderr.
    fn line(&mut self) -> String {
        match self.lines.recv_timeout(Duration::from_secs(30)) {
            Ok(line) => line,
            Err(e) => {
                let _ = self.child.kill();
                let status = self.child.wait();
                let err = self.stderr.take().map(|h| h.join().unwrap());
                panic!("cambium serve announced nothing ({e}; {status:?}); stderr: {err:?}")
            }
        }
    }

    fn uri(&self, name: &str) -> String {
        format!("nbd+unix:///{name}?socket={}", s(&self.sock))
    }

    fn pid(&self) -> String {
        self.child.id().to_string()
    }

    /// Sends SIGTERM (and returns at once).
    fn sigterm(&self) {
        let killed = Command::new("kill")
            .args(["-TERM", &self.pid()])
            .status()
            .expect("run kill");
        assert!(killed.success());
    }

    /// SIGTERM, then waits (at most 20 s) for the exit; its status and stderr.
    fn stop(mut self) -> (ExitStatus, String) {
        self.sigterm();
        let status = self
            .wait_for_exit(Duration::from_secs(20))
            .expect("cambium serve did not stop within 20 s of SIGTERM");
        let err = self.stderr.take().map(|h| h.join().unwrap()).unwrap();
        (status, err)
    }

    /// Stops with SIGTERM and asserts a clean exit: code 0, nothing on stderr, both
    /// socket files removed.
    #[track_caller]
    fn stop_clean(self, dir: &Path) {
        let sock = self.sock.clone();
        let (status, err) = self.stop();
        assert_eq!(status.code(), Some(0), "serve exit; stderr: {err}");
        assert_eq!(err, "", "serve stderr");
        assert!(!sock.exists(), "NBD socket left behind");
        assert!(!dir.join("control.sock").exists(), "control socket left");
    }

    /// Polls for the exit until `limit`.
    fn wait_for_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL.
    fn kill9(mut self) {
        self.child.kill().expect("SIGKILL serve");
        self.child.wait().unwrap();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A background client process, killed when dropped.
struct Background(Child);

impl Drop for Background {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

// ---------------------------------------------------------------------------
// Stores, data

impl TestStore {
    fn volume(&self, sub: &str, rest: &[&str]) -> Output {
        let mut args = vec!["volume", sub, self.d()];
        args.extend_from_slice(rest);
        run(&args)
    }

    fn create(&self, name: &str, size: &str) {
        let out = ok(self.volume("create", &[name, "--size", size]));
        assert!(
            out.starts_with(&format!("created volume {name}: ")),
            "{out}"
        );
    }

    /// `--json volume list`: one object per volume or snapshot.
    fn list_json(&self) -> Vec<serde_json::Value> {
        let out = ok(run(&["--json", "volume", "list", self.d()]));
        serde_json::from_str::<serde_json::Value>(&out)
            .unwrap()
            .as_array()
            .unwrap()
            .clone()
    }

    fn listed(&self, name: &str) -> serde_json::Value {
        self.list_json()
            .into_iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("volume {name} not listed"))
    }

    #[track_caller]
    fn verify_clean(&self) {
        let out = ok(self.run("verify", &[]));
        assert!(out.contains("clean"), "verify: {out}");
    }
}

/// xorshift64*: deterministic test data.
struct Rng(u64);

impl Rng {
    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            let v = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// A sparse raw image of `size` bytes with seeded random data in `regions`
/// (offset, length) and holes elsewhere; its contents.
fn make_image(path: &Path, size: u64, regions: &[(u64, u64)], seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed | 1);
    let f = std::fs::File::create(path).unwrap();
    f.set_len(size).unwrap();
    let mut all = vec![0u8; size as usize];
    for &(off, len) in regions {
        let piece = &mut all[off as usize..(off + len) as usize];
        rng.fill(piece);
        f.write_all_at(piece, off).unwrap();
    }
    all
}

/// Asserts two byte strings are equal, naming the first difference.
#[track_caller]
fn assert_same(what: &str, got: &[u8], want: &[u8]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!(
            "{what}: first difference at byte {i} (got {}, want {})",
            got[i], want[i]
        );
    }
}

/// nbdcopy of an export into a fresh file; its bytes.
fn nbd_read_all(uri: &str, tmp: &Path, name: &str) -> Vec<u8> {
    let out = tmp.join(name);
    client_ok("nbdcopy", &[uri, s(&out)]);
    std::fs::read(&out).unwrap()
}

// ---------------------------------------------------------------------------
// A raw NBD client (fixed newstyle, simple replies), written from the protocol
// document rather than from the server's own constants.

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const OPT_GO: u32 = 7;
const REP_ACK: u32 = 1;
const REP_INFO: u32 = 3;
const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;
const CMD_FLUSH: u16 = 3;
const EPERM: u32 = 1;

/// Connects and reads the greeting; the server's handshake flags.
fn greet(sock: &Path) -> (UnixStream, u16) {
    let mut c = UnixStream::connect(sock).expect("connect to the NBD socket");
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut g = [0u8; 18];
    c.read_exact(&mut g).expect("greeting");
    assert_eq!(u64::from_be_bytes(g[..8].try_into().unwrap()), NBDMAGIC);
    assert_eq!(u64::from_be_bytes(g[8..16].try_into().unwrap()), IHAVEOPT);
    (c, u16::from_be_bytes([g[16], g[17]]))
}

fn option_frame(option: u32, data: &[u8]) -> Vec<u8> {
    let mut f = IHAVEOPT.to_be_bytes().to_vec();
    f.extend(option.to_be_bytes());
    f.extend((data.len() as u32).to_be_bytes());
    f.extend(data);
    f
}

/// One option reply: (type, data).
fn option_reply(c: &mut UnixStream, option: u32) -> (u32, Vec<u8>) {
    let mut h = [0u8; 20];
    c.read_exact(&mut h).expect("option reply");
    assert_eq!(
        u64::from_be_bytes(h[..8].try_into().unwrap()),
        OPT_REPLY_MAGIC
    );
    assert_eq!(u32::from_be_bytes(h[8..12].try_into().unwrap()), option);
    let ty = u32::from_be_bytes(h[12..16].try_into().unwrap());
    let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
    let mut data = vec![0u8; len as usize];
    c.read_exact(&mut data).unwrap();
    (ty, data)
}

/// Handshakes into export `name` with NBD_OPT_GO; the connection, the export's
/// size and transmission flags.
fn go(sock: &Path, name: &str) -> (UnixStream, u64, u16) {
    let (mut c, flags) = greet(sock);
    assert_eq!(flags & 3, 3, "fixed newstyle and no zeroes offered");
    let mut out = 3u32.to_be_bytes().to_vec(); // FIXED_NEWSTYLE | NO_ZEROES
    let mut data = (name.len() as u32).to_be_bytes().to_vec();
    data.extend(name.as_bytes());
    data.extend(0u16.to_be_bytes()); // no information requests
    out.extend(option_frame(OPT_GO, &data));
    c.write_all(&out).unwrap();
    let mut export = None;
    loop {
        match option_reply(&mut c, OPT_GO) {
            (REP_ACK, _) => break,
            (REP_INFO, d) if u16::from_be_bytes([d[0], d[1]]) == 0 => {
                let size = u64::from_be_bytes(d[2..10].try_into().unwrap());
                let tflags = u16::from_be_bytes([d[10], d[11]]);
                export = Some((size, tflags));
            }
            (REP_INFO, _) => {}
            (ty, d) => panic!(
                "OPT_GO {name:?} refused: {ty:#x} {:?}",
                String::from_utf8_lossy(&d)
            ),
        }
    }
    let (size, tflags) = export.expect("NBD_INFO_EXPORT before the ACK");
    (c, size, tflags)
}

fn request(command: u16, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
    let mut r = REQUEST_MAGIC.to_be_bytes().to_vec();
    r.extend(0u16.to_be_bytes());
    r.extend(command.to_be_bytes());
    r.extend(cookie.to_be_bytes());
    r.extend(offset.to_be_bytes());
    r.extend(len.to_be_bytes());
    r
}

/// A simple reply: its error, after checking magic and cookie.
fn simple_reply(c: &mut UnixStream, cookie: u64) -> u32 {
    let mut h = [0u8; 16];
    c.read_exact(&mut h).expect("simple reply");
    assert_eq!(
        u32::from_be_bytes(h[..4].try_into().unwrap()),
        SIMPLE_REPLY_MAGIC
    );
    assert_eq!(u64::from_be_bytes(h[8..16].try_into().unwrap()), cookie);
    u32::from_be_bytes(h[4..8].try_into().unwrap())
}

/// A write; the reply's error (0 for success).
fn raw_write(c: &mut UnixStream, cookie: u64, offset: u64, data: &[u8]) -> u32 {
    let mut r = request(CMD_WRITE, cookie, offset, data.len() as u32);
    r.extend(data);
    c.write_all(&r).unwrap();
    simple_reply(c, cookie)
}

/// A read that must succeed.
fn raw_read(c: &mut UnixStream, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
    c.write_all(&request(CMD_READ, cookie, offset, len))
        .unwrap();
    assert_eq!(simple_reply(c, cookie), 0, "read error");
    let mut buf = vec![0u8; len as usize];
    c.read_exact(&mut buf).unwrap();
    buf
}

/// Whether the server closed the connection (EOF or reset) within 10 s.
fn closed_by_server(c: &mut UnixStream) -> bool {
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 256];
    loop {
        match c.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue, // replies to what we sent before the bad part
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

// ---------------------------------------------------------------------------
// Tests

/// qemu-img convert/compare/map, nbdinfo --list and nbdcopy both ways.
#[test]
fn qemu_img_and_nbdcopy_round_trip() {
    let t = TestStore::new();
    let tmp = tempfile::tempdir().unwrap();
    t.create("disk", "32M");
    t.create("copy", "32M");
    let server = Server::start(&t.dir);
    assert_eq!(server.sock, t.dir.join("nbd.sock"));
    assert_eq!(
        server.exports,
        [
            format!("  {}", server.uri("disk")),
            format!("  {}", server.uri("copy"))
        ]
    );

    // Data in a few places (one not block-aligned, one at the very end), holes
    // elsewhere, and one run of zeroes written out as data in the file.
    let size = 32 * MIB;
    let image = tmp.path().join("image.raw");
    let data = [
        (0, MIB),
        (5 * MIB, 3 * MIB),
        (20 * MIB + 100, 5000),
        (size - 4096, 4096),
    ];
    let want = make_image(&image, size, &data, 0x5eed);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&image)
        .unwrap()
        .write_all_at(&vec![0u8; 2 * MIB as usize], 24 * MIB)
        .unwrap();
    let zero = [
        (MIB, 4 * MIB),
        (8 * MIB, 12 * MIB),
        (20 * MIB + 8192, 4 * MIB - 8192),
        (24 * MIB, 2 * MIB), // written zeroes
        (26 * MIB, 6 * MIB - 4096),
    ];

    let disk = server.uri("disk");
    client_ok(
        "qemu-img",
        &["convert", "-n", "-f", "raw", "-O", "raw", s(&image), &disk],
    );
    let cmp = client_ok(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", s(&image), &disk],
    );
    assert!(cmp.contains("Images are identical"), "{cmp}");

    // Zeroes are holes: qemu-img map (NBD block status) says so, and they take no
    // space in the store.
    let map: serde_json::Value = serde_json::from_str(&client_ok(
        "qemu-img",
        &["map", "--output=json", "-f", "raw", &disk],
    ))
    .unwrap();
    let map: Vec<(u64, u64, bool)> = map
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["start"].as_u64().unwrap(),
                e["length"].as_u64().unwrap(),
                e["data"].as_bool().unwrap(),
            )
        })
        .collect();
    let mut end = 0;
    for &(start, len, _) in &map {
        assert_eq!(start, end, "map is contiguous: {map:?}");
        end += len;
    }
    assert_eq!(end, size, "map covers the export: {map:?}");
    let overlapping = |off: u64, len: u64| {
        map.iter()
            .filter(move |&&(start, l, _)| start < off + len && off < start + l)
    };
    for &(off, len) in &zero {
        for e in overlapping(off, len) {
            assert!(
                !e.2,
                "zero range {off}+{len} mapped as data: {e:?} in {map:?}"
            );
        }
    }
    for &(off, len) in &data {
        for e in overlapping(off, len) {
            assert!(
                e.2,
                "data range {off}+{len} mapped as hole: {e:?} in {map:?}"
            );
        }
    }
    let blocks_of = |&(off, len): &(u64, u64)| (off + len).div_ceil(4096) - off / 4096;
    let data_bytes: u64 = data.iter().map(blocks_of).sum::<u64>() * 4096;
    assert_eq!(t.listed("disk")["allocated_bytes"], data_bytes);

    // nbdinfo sees both exports with their sizes.
    let listed = nbdinfo_list(&server.sock);
    assert_eq!(listed.len(), 2, "{listed:?}");
    for (e, name) in listed.iter().zip(["disk", "copy"]) {
        assert_eq!((e.name.as_str(), e.size, e.read_only), (name, size, false));
    }

    // nbdcopy out gives the same bytes; nbdcopy in gives an identical volume.
    assert_same(
        "nbdcopy of disk",
        &nbd_read_all(&disk, tmp.path(), "out.raw"),
        &want,
    );
    let copy = server.uri("copy");
    client_ok("nbdcopy", &[s(&image), &copy]);
    let cmp = client_ok(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", s(&image), &copy],
    );
    assert!(cmp.contains("Images are identical"), "{cmp}");
    let cmp = client_ok(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", &disk, &copy],
    );
    assert!(cmp.contains("Images are identical"), "{cmp}");
    assert_same(
        "nbdcopy of copy",
        &nbd_read_all(&copy, tmp.path(), "copy.raw"),
        &want,
    );

    server.stop_clean(&t.dir);
    t.verify_clean();
    // What was written over NBD is in the store after a clean stop.
    let exported = tmp.path().join("exported.raw");
    ok(t.volume("export", &["copy", s(&exported)]));
    assert_same(
        "export after stop",
        &std::fs::read(&exported).unwrap(),
        &want,
    );
}

/// fio writes and verifies; a snapshot taken through the control socket while
/// serving keeps the content of its moment and is a read-only export.
#[test]
fn fio_verify_and_snapshot_while_serving() {
    let t = TestStore::new();
    let tmp = tempfile::tempdir().unwrap();
    t.create("disk", "32M");
    let server = Server::start(&t.dir);
    let disk = server.uri("disk");

    let uri_arg = format!("--uri={disk}");
    let fio = |extra: &[&str]| {
        let mut args = vec![
            "--name=t",
            "--ioengine=nbd",
            &uri_arg,
            "--bs=4k",
            "--iodepth=32",
            "--verify=crc32c",
            "--do_verify=1",
            // No verify state files left in the working directory.
            "--verify_state_save=0",
        ];
        args.extend_from_slice(extra);
        run_client("fio", &args)
    };
    assert_fio_clean(&fio(&["--rw=randwrite", "--size=16M", "--randseed=1234"]));
    // A second pass, mixed sizes over the whole volume, also verified.
    assert_fio_clean(&fio(&[
        "--rw=randwrite",
        "--size=32M",
        "--bsrange=4k-64k",
        "--randseed=99",
    ]));

    let pre = nbd_read_all(&disk, tmp.path(), "pre.raw");
    assert!(pre.iter().any(|&b| b != 0), "fio wrote something");

    // The snapshot goes through the control socket to the running server.
    let out = ok(t.volume("snapshot", &["disk", "snap"]));
    assert!(
        out.starts_with("created snapshot snap of volume disk in ") && out.ends_with(" ms)\n"),
        "{out}"
    );

    // Overwrite the volume with other content.
    let size = 32 * MIB;
    let next = tmp.path().join("next.raw");
    let want = make_image(&next, size, &[(0, 12 * MIB), (20 * MIB, 12 * MIB)], 77);
    client_ok("nbdcopy", &[s(&next), &disk]);
    assert_same(
        "volume after overwrite",
        &nbd_read_all(&disk, tmp.path(), "now.raw"),
        &want,
    );
    let snap = server.uri("snap");
    assert_same(
        "snapshot",
        &nbd_read_all(&snap, tmp.path(), "snap.raw"),
        &pre,
    );

    // nbdinfo: the snapshot is read-only.
    let listed = nbdinfo_list(&server.sock);
    let flags: Vec<(&str, u64, bool)> = listed
        .iter()
        .map(|e| (e.name.as_str(), e.size, e.read_only))
        .collect();
    assert_eq!(flags, [("disk", size, false), ("snap", size, true)]);

    // Writes to it are refused: by the clients (they see the read-only flag) and,
    // for a client that writes anyway, by the server with EPERM.
    let refused = run_client("nbdcopy", &[s(&next), &snap]);
    assert!(
        !refused.status.success(),
        "nbdcopy into a snapshot succeeded"
    );
    let refused = run_client(
        "qemu-img",
        &["convert", "-n", "-f", "raw", "-O", "raw", s(&next), &snap],
    );
    assert!(
        !refused.status.success(),
        "qemu-img into a snapshot succeeded"
    );
    let (mut c, snap_size, tflags) = go(&server.sock, "snap");
    assert_eq!(snap_size, size);
    assert_ne!(tflags & 2, 0, "READ_ONLY transmission flag");
    assert_eq!(raw_write(&mut c, 1, 0, &[0xEE; 4096]), EPERM);
    assert_eq!(raw_write(&mut c, 2, size - 512, &[0xEE; 512]), EPERM);
    assert_eq!(raw_read(&mut c, 3, 0, 4096), pre[..4096]);
    c.write_all(&request(CMD_DISC, 4, 0, 0)).unwrap();
    drop(c);
    assert_same(
        "snapshot after refused writes",
        &nbd_read_all(&snap, tmp.path(), "snap2.raw"),
        &pre,
    );

    server.stop_clean(&t.dir);
    t.verify_clean();
    let json = t.list_json();
    assert_eq!(json.len(), 2);
    assert_eq!(json[1]["name"], "snap");
    assert_eq!(json[1]["snapshot"], true);
    assert_eq!(json[1]["parent"], "disk");
}

/// kill -9 while fio writes: the server restarts over the stale sockets, flushed
/// data and control-socket changes survive, and the store verifies clean.
#[test]
fn kill9_while_writing_then_restart() {
    let t = TestStore::new();
    let tmp = tempfile::tempdir().unwrap();
    t.create("stable", "16M");
    t.create("busy", "64M");
    let server = Server::start(&t.dir);

    let image = tmp.path().join("stable.raw");
    let want = make_image(&image, 16 * MIB, &[(0, 16 * MIB)], 4242);
    client_ok("nbdcopy", &[s(&image), &server.uri("stable")]);
    // Made through the control socket before the crash.
    t.create("made", "4M");
    ok(t.volume("snapshot", &["made", "made.snap"]));
    let (mut c, _, _) = go(&server.sock, "made");
    assert_eq!(raw_write(&mut c, 1, 8192, &[0x5A; 4096]), 0);
    c.write_all(&request(CMD_FLUSH, 2, 0, 0)).unwrap();
    assert_eq!(simple_reply(&mut c, 2), 0, "flush");
    drop(c);

    let fio = Background(
        client("fio")
            .args([
                "--name=busy",
                "--ioengine=nbd",
                &format!("--uri={}", server.uri("busy")),
                "--rw=randwrite",
                "--bs=4k",
                "--iodepth=8",
                "--fsync=16",
                "--size=64M",
                "--time_based",
                "--runtime=30",
                "--randseed=7",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn fio"),
    );
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        t.dir.join("nbd.sock").exists(),
        "server still serving when killed"
    );
    server.kill9();
    drop(fio); // it fails on its own once the server is gone; do not wait 30 s

    // The killed server's socket files are stale; commands ignore the stale control
    // socket and open the store themselves.
    assert!(t.dir.join("nbd.sock").exists() && t.dir.join("control.sock").exists());
    let names: Vec<String> = t
        .list_json()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["stable", "busy", "made", "made.snap"]);

    let server = Server::start(&t.dir);
    assert_eq!(server.exports.len(), 4, "{:?}", server.exports);
    assert_eq!(
        server.exports[3],
        format!("  {} (read-only)", server.uri("made.snap"))
    );
    assert_same(
        "stable after kill -9",
        &nbd_read_all(&server.uri("stable"), tmp.path(), "stable.out"),
        &want,
    );
    let made = nbd_read_all(&server.uri("made"), tmp.path(), "made.out");
    assert!(
        made[8192..12288].iter().all(|&b| b == 0x5A),
        "flushed write lost"
    );
    assert!(made[..8192].iter().chain(&made[12288..]).all(|&b| b == 0));
    let snap = nbd_read_all(&server.uri("made.snap"), tmp.path(), "made.snap.out");
    assert!(
        snap.iter().all(|&b| b == 0),
        "snapshot taken before the write"
    );
    // Whatever of busy survived reads back whole.
    let busy = nbd_read_all(&server.uri("busy"), tmp.path(), "busy.out");
    assert_eq!(busy.len() as u64, 64 * MIB);
    // And it takes writes again.
    let again = run_client(
        "fio",
        &[
            "--name=again",
            "--ioengine=nbd",
            &format!("--uri={}", server.uri("busy")),
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=8",
            "--size=4M",
            "--verify=crc32c",
            "--do_verify=1",
            // No verify state files left in the working directory.
            "--verify_state_save=0",
        ],
    );
    assert_fio_clean(&again);

    server.stop_clean(&t.dir);
    t.verify_clean();
}

/// Volume commands while serving go through the control socket; a second server on
/// the same store is refused; SIGTERM stops cleanly.
#[test]
fn control_socket_and_lifecycle() {
    let t = TestStore::new();
    t.create("disk", "16M");
    let server = Server::start(&t.dir);
    assert_eq!(listed_names(&server.sock), ["disk"]);

    let out = ok(t.volume("create", &["new", "--size", "8M"]));
    assert_eq!(out, "created volume new: 8.0 MiB in 4.0 KiB blocks\n");
    let listed = nbdinfo_list(&server.sock);
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert_eq!((listed[1].name.as_str(), listed[1].size), ("new", 8 * MIB));
    assert!(!listed[1].read_only);

    let list = ok(t.volume("list", &[]));
    assert!(list.lines().any(|l| l.starts_with("new ")), "{list}");
    assert_eq!(t.listed("new")["size_bytes"], 8 * MIB);

    // A second server on the same store: refused (exit 3, in use), whatever its socket.
    for extra in [&[][..], &["--socket", "/tmp/never-bound.sock"][..]] {
        let mut args = vec!["serve", t.d()];
        args.extend_from_slice(extra);
        let out = run(&args);
        assert_eq!(out.status.code(), Some(3), "second serve: {}", stderr(&out));
        assert!(stderr(&out).contains("in use"), "{}", stderr(&out));
    }
    assert!(server.sock.exists() && t.dir.join("control.sock").exists());
    assert_eq!(listed_names(&server.sock), ["disk", "new"]);

    assert_eq!(ok(t.volume("drop", &["new"])), "dropped volume new\n");
    assert_eq!(listed_names(&server.sock), ["disk"]);
    let gone = run_client("nbdinfo", &[&server.uri("new")]);
    assert!(!gone.status.success(), "a dropped volume is still exported");
    // Errors come back through the control socket with their exit codes.
    let out = t.volume("drop", &["new"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let out = t.volume("create", &["disk", "--size", "1M"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));

    server.stop_clean(&t.dir);
    // Directly on the store afterwards.
    let names: Vec<String> = t
        .list_json()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["disk"]);
    t.verify_clean();
}

/// Garbage, bad magic, truncated and oversized writes, 200 idle connections: the
/// server stays up, real clients still work, nothing is half-written, and SIGTERM
/// still stops it promptly.
#[test]
fn hostile_clients() {
    let t = TestStore::new();
    let tmp = tempfile::tempdir().unwrap();
    t.create("disk", "8M");
    let server = Server::start(&t.dir);
    let sock = server.sock.clone();

    // Garbage instead of client flags.
    let (mut c, _) = greet(&sock);
    c.write_all(&[0xFF; 64]).unwrap();
    assert!(closed_by_server(&mut c), "garbage flags");
    // Good flags, then an option with a bad magic.
    let (mut c, _) = greet(&sock);
    let mut bad = 3u32.to_be_bytes().to_vec();
    bad.extend(option_frame(OPT_GO, b"whatever"));
    bad[4] ^= 0x80;
    c.write_all(&bad).unwrap();
    assert!(closed_by_server(&mut c), "bad option magic");
    // Pure noise before even reading the greeting, then hang up.
    let mut c = UnixStream::connect(&sock).unwrap();
    let mut noise = vec![0u8; 4096];
    Rng(99).fill(&mut noise);
    let _ = c.write_all(&noise);
    drop(c);
    // In transmission: a request with a bad magic.
    let (mut c, size, _) = go(&sock, "disk");
    assert_eq!(size, 8 * MIB);
    let mut req = request(CMD_READ, 1, 0, 4096);
    req[0] ^= 1;
    c.write_all(&req).unwrap();
    assert!(closed_by_server(&mut c), "bad request magic");
    // A write whose payload stops short: nothing of it may land.
    let (mut c, _, _) = go(&sock, "disk");
    let mut req = request(CMD_WRITE, 1, MIB, 65536);
    req.extend([0xAB; 1000]);
    c.write_all(&req).unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(closed_by_server(&mut c), "truncated write");
    // A write announcing 4 GiB - 1 of payload: too big to skip, the connection ends.
    let (mut c, _, _) = go(&sock, "disk");
    let mut req = request(CMD_WRITE, 1, 0, u32::MAX);
    req.extend([0xCD; 4096]);
    let _ = c.write_all(&req);
    assert!(closed_by_server(&mut c), "huge write");
    // An unknown export, and a write past the end on a good connection (ENOSPC),
    // which then still works.
    let (mut c, _) = greet(&sock);
    let mut go_bad = 3u32.to_be_bytes().to_vec();
    let mut data = 7u32.to_be_bytes().to_vec();
    data.extend(b"missing");
    data.extend(0u16.to_be_bytes());
    go_bad.extend(option_frame(OPT_GO, &data));
    c.write_all(&go_bad).unwrap();
    let (ty, _) = option_reply(&mut c, OPT_GO);
    assert_ne!(
        ty & 0x8000_0000,
        0,
        "OPT_GO of a missing export is an error"
    );
    drop(c);
    let (mut c, _, _) = go(&sock, "disk");
    assert_eq!(
        raw_write(&mut c, 1, 8 * MIB - 512, &[1; 1024]),
        28,
        "ENOSPC"
    );
    assert_eq!(raw_write(&mut c, 2, 3 * MIB, &[0x42; 512]), 0);
    assert_eq!(raw_read(&mut c, 3, 3 * MIB, 512), [0x42; 512]);
    drop(c);

    // 200 idle connections at once: half only connected (in the handshake), half
    // idle after choosing the export.
    let mut idle = Vec::new();
    for i in 0..200 {
        if i % 2 == 0 {
            idle.push(UnixStream::connect(&sock).expect("idle connect"));
        } else {
            idle.push(go(&sock, "disk").0);
        }
    }
    assert_eq!(listed_names(&sock), ["disk"]);
    let out = nbd_read_all(&server.uri("disk"), tmp.path(), "disk.raw");
    assert!(
        out[MIB as usize..MIB as usize + 65536]
            .iter()
            .all(|&b| b == 0),
        "truncated write landed"
    );
    assert!(
        out[..4096].iter().all(|&b| b == 0),
        "oversized write landed"
    );
    assert!(out[3 * MIB as usize..3 * MIB as usize + 512]
        .iter()
        .all(|&b| b == 0x42));
    // A control command still works beside them.
    t.create("other", "1M");

    // SIGTERM with all of them still open stops promptly and cleanly.
    let started = Instant::now();
    server.stop_clean(&t.dir);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "shutdown took {:?}",
        started.elapsed()
    );
    drop(idle);
    t.verify_clean();
}

// ---------------------------------------------------------------------------
// Regression tests for server bugs these tests found (both fixed).

/// A connection opened on a volume must not write into a volume that later takes
/// its name: after `volume drop disk` and `volume create disk --block-size 512`
/// (both through the control socket), the old connection's writes fail instead of
/// landing, at the old block numbering, in the newcomer (which made it unreadable).
#[test]
fn a_stale_connection_cannot_write_into_a_recreated_volume() {
    let t = TestStore::new();
    let tmp = tempfile::tempdir().unwrap();
    t.create("disk", "8M");
    let server = Server::start(&t.dir);
    let (mut c, _, _) = go(&server.sock, "disk");
    assert_eq!(raw_write(&mut c, 1, 0, &[0x11; 4096]), 0);
    ok(t.volume("drop", &["disk"]));
    ok(t.volume("create", &["disk", "--size", "8M", "--block-size", "512"]));
    let stale = raw_write(&mut c, 2, 0, &[0x22; 4096]);
    drop(c);
    // The new volume must stay readable (all zeroes) whatever the old connection did.
    let read = run_client("nbdcopy", &[&server.uri("disk"), s(&tmp.path().join("d"))]);
    assert!(
        read.status.success(),
        "the re-created volume is unreadable after a stale write (answered {stale}): {}",
        stderr(&read)
    );
    assert!(std::fs::read(tmp.path().join("d"))
        .unwrap()
        .iter()
        .all(|&b| b == 0));
    assert_ne!(
        stale, 0,
        "a write through a dropped volume's connection succeeded"
    );
    server.stop_clean(&t.dir);
}

/// Bytes of the files in a store directory (what `du` would count, holes aside).
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

/// `volume drop` through a running server returns with the volume's space free, as
/// it does on its own (it used to stay until the server stopped: the dropped blocks
/// were in the data segment taking appends, the newest file, never deleted).
#[test]
fn a_drop_through_the_server_gives_the_space_back() {
    let t = TestStore::new();
    let tmp = tempfile::tempdir().unwrap();
    t.create("big", "64M");
    t.create("other", "8M");
    let image = tmp.path().join("img");
    make_image(&image, 40 << 20, &[(0, 40 << 20)], 7);
    let server = Server::start(&t.dir);
    client_ok("nbdcopy", &[s(&image), &server.uri("big")]);
    let before = dir_bytes(&t.dir);
    assert!(before > 40 << 20, "{before}");
    ok(t.volume("drop", &["big"]));
    let after = dir_bytes(&t.dir);
    assert!(
        after < 16 << 20,
        "{before} bytes before the drop, {after} after"
    );
    // Writes go on, and the store is whole.
    let small = tmp.path().join("small");
    let want = make_image(&small, 8 << 20, &[(1 << 20, 2 << 20)], 9);
    client_ok("nbdcopy", &[s(&small), &server.uri("other")]);
    assert_same(
        "other",
        &nbd_read_all(&server.uri("other"), tmp.path(), "back"),
        &want,
    );
    server.stop_clean(&t.dir);
    let verified = ok(t.run("verify", &[]));
    assert!(verified.contains("clean"), "{verified}");
}

/// A connection to control.sock that sends nothing must not keep `cambium serve`
/// from stopping on SIGTERM (it used to wait for that request forever, holding the
/// store's lock).
#[test]
fn an_idle_control_connection_does_not_block_shutdown() {
    let t = TestStore::new();
    t.create("disk", "1M");
    let mut server = Server::start(&t.dir);
    let idle = UnixStream::connect(t.dir.join("control.sock")).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    server.sigterm();
    let exited = server.wait_for_exit(Duration::from_secs(15));
    drop(idle);
    assert!(
        exited.is_some(),
        "cambium serve still running 15 s after SIGTERM, waiting on an idle control connection"
    );
}

/// Control connections that send nothing do not keep commands out: at the limit of
/// requests in progress, the one silent the longest makes room (a black-box review
/// locked every command out for 10 s with 64 of them). A command's connection is
/// closed once it is answered.
#[test]
fn silent_control_connections_do_not_lock_commands_out() {
    let t = TestStore::new();
    t.create("disk", "1M");
    let server = Server::start(&t.dir);
    let silent: Vec<UnixStream> = (0..80)
        .map(|_| UnixStream::connect(t.dir.join("control.sock")).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..3 {
        let listed = ok(t.volume("list", &[]));
        assert!(listed.contains("disk"), "{listed}");
    }
    // The silent one that made room was closed (the rest past the limit were
    // refused at once, with an answer saying so).
    let closed = silent
        .iter()
        .filter(|c| {
            c.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            matches!((&**c).read(&mut [0u8; 1]), Ok(0))
        })
        .count();
    assert!(closed >= 1, "{closed} silent connections closed");
    drop(silent);
    server.stop_clean(&t.dir);
}

/// While `serve` holds the store, the key-value and space commands reach it over the
/// control socket with their usual output and exit codes; a batch's input cut short
/// (its command killed, or the server stopping) commits none of what it had not
/// acknowledged.
#[test]
fn every_writing_command_works_while_serving() {
    let t = TestStore::new();
    t.create("disk", "8M");
    let server = Server::start(&t.dir);

    t.put("k", "v1");
    assert_eq!(ok(t.run("get", &["k"])), "v1\n");
    assert_eq!(ok(t.run("del", &["k"])), "");
    fails(t.run("del", &["k"]), 1, &["key not found: \"k\""]);
    fails(t.run("put", &["k", "v", "--branch", "nope"]), 1, &["nope"]);
    fails(
        t.run("put", &["k", "v", "--branch", "disk"]),
        3,
        &["block volume"],
    );
    assert_eq!(
        t.run("put", &["k", "v", "--branch", "a b"]).status.code(),
        Some(2)
    );
    assert_eq!(ok(run(&["--hex", "put", t.d(), "00ff", "41"])), "");
    assert_eq!(ok(run(&["--hex", "get", t.d(), "00ff"])), "41\n");
    fails(run(&["--hex", "del", t.d(), "0102"]), 1, &["\"0102\""]);

    // batch: acknowledgements as it goes, --json, and a bad line that commits nothing.
    let out = ok(t.batch(&["--commit-every", "2"], "put\ta\t1\nput\tb\t2\ndel\ta\n"));
    assert_eq!(out, "committed 2\ncommitted 3\n");
    let out = ok(run_stdin(&["--json", "batch", t.d()], b"put\tc\t3\n"));
    assert_eq!(out, "{\"committed\":1}\n");
    fails(t.batch(&[], "put\tx\t1\nbogus\n"), 3, &["line 2", "bogus"]);
    assert_eq!(
        t.scan(&[]).lines().count(),
        3,
        "a deleted, x never committed"
    );
    assert_eq!(ok(t.run("get", &["b"])), "2\n");
    fails(t.run("get", &["x"]), 1, &[]);

    // A batch whose command is killed mid-input: what it acknowledged stays, the
    // rest is not committed as if the input had ended there.
    let mut child = Command::new(BIN)
        .args(["batch", t.d(), "--commit-every", "2"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut acks = BufReader::new(child.stdout.take().unwrap());
    stdin.write_all(b"put\tk1\t1\nput\tk2\t2\n").unwrap();
    let mut ack = String::new();
    acks.read_line(&mut ack).unwrap();
    assert_eq!(
        ack, "committed 2\n",
        "acknowledged while its input is still open"
    );
    stdin.write_all(b"put\tk3\t3\n").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(ok(t.run("get", &["k2"])), "2\n");
    fails(t.run("get", &["k3"]), 1, &[]);

    // An image on stdin goes to the server with the request, and is exported at once.
    let image: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let out = ok(run_stdin(
        &["volume", "import", t.d(), "streamed", "-"],
        &image,
    ));
    assert!(
        out.starts_with("imported the input into volume streamed: "),
        "{out}"
    );
    assert_eq!(listed_names(&server.sock), ["disk", "streamed"]);
    let mut pad = image.clone();
    pad.resize(image.len().div_ceil(4096) * 4096, 0);
    let tmp = tempfile::tempdir().unwrap();
    let back = tmp.path().join("back.raw");
    ok(run(&["volume", "export", t.d(), "streamed", s(&back)]));
    assert!(std::fs::read(&back).unwrap() == pad);

    // Stdout and stdin, by `-` or by their /dev names, are this command's, never the
    // server's: the image goes to (comes from) the command, the report to stderr.
    for target in ["-", "/dev/stdout"] {
        let exported = run(&["volume", "export", t.d(), "streamed", target]);
        assert!(exported.status.success(), "export to {target}");
        assert!(
            exported.stdout == pad,
            "export to {target}: the image on stdout"
        );
        let report = String::from_utf8_lossy(&exported.stderr);
        assert!(
            report.starts_with("exported volume streamed to stdout: "),
            "{report}"
        );
    }
    // A regular file on stdin: /dev/stdin resolves to it, a path the server could
    // open, but the server's /dev/stdin is another file.
    let image_file = tmp.path().join("image.raw");
    std::fs::write(&image_file, &image).unwrap();
    // A write the server answered but no client flushed is in such an export too
    // (the command asks the server for a checkpoint before it reads).
    t.create("unflushed", "1M");
    let (mut c, _, _) = go(&server.sock, "unflushed");
    assert_eq!(raw_write(&mut c, 7, 8192, &[0x5A; 4096]), 0);
    let exported = run(&["volume", "export", t.d(), "unflushed", "-"]);
    assert!(exported.status.success(), "{}", stderr(&exported));
    assert!(
        exported.stdout[8192..12288] == [0x5A; 4096],
        "the unflushed write"
    );
    assert!(exported.stdout[..8192].iter().all(|&b| b == 0));
    drop(c);
    ok(run(&["volume", "drop", t.d(), "unflushed"]));

    let out = ok(Command::new(BIN)
        .args(["volume", "import", t.d(), "from-dev-stdin", "/dev/stdin"])
        .stdin(std::fs::File::open(&image_file).unwrap())
        .output()
        .unwrap());
    assert!(
        out.starts_with("imported the input into volume from-dev-stdin: "),
        "{out}"
    );
    let back_stdin = tmp.path().join("back-stdin.raw");
    ok(run(&[
        "volume",
        "export",
        t.d(),
        "from-dev-stdin",
        s(&back_stdin),
    ]));
    assert!(std::fs::read(&back_stdin).unwrap() == pad);
    ok(run(&["volume", "drop", t.d(), "from-dev-stdin"]));

    // An image still being imported is not exported until it is whole.
    let mut slow = Command::new(BIN)
        .args(["volume", "import", t.d(), "slow", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut feed = slow.stdin.take().unwrap();
    feed.write_all(&vec![0x42; 2 << 20]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ok(run(&["volume", "list", t.d()])).contains("slow") {
        assert!(
            Instant::now() < deadline,
            "the importing volume never appeared"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        listed_names(&server.sock),
        ["disk", "streamed"],
        "exported mid-import"
    );
    let gone = run_client("nbdinfo", &[&server.uri("slow")]);
    assert!(
        !gone.status.success(),
        "a volume being imported can be opened"
    );
    feed.write_all(&vec![0x43; 1 << 20]).unwrap();
    drop(feed);
    let done = slow.wait_with_output().unwrap();
    assert!(ok(done).starts_with("imported the input into volume slow: 3.0 MiB"));
    assert_eq!(listed_names(&server.sock), ["disk", "streamed", "slow"]);

    // Space commands run in the server.
    assert_eq!(ok(t.run("checkpoint", &[])), "");
    for cmd in ["clean", "defrag", "shrink"] {
        let out = ok(run(&["--json", cmd, t.d()]));
        let report: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert!(
            report["footprint_after"].as_u64().unwrap() > 0,
            "{cmd}: {out}"
        );
    }
    assert!(ok(t.run("clean", &[])).starts_with("moved "));
    fails(t.run("defrag", &["nope"]), 1, &["nope"]);

    // The server stops while a batch is reading its input: the batch fails, commits
    // nothing, and the server still stops cleanly.
    let mut child = Command::new(BIN)
        .args(["batch", t.d()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"put\tstopped\t1\n").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    server.stop_clean(&t.dir);
    let out = child.wait_with_output().unwrap();
    drop(stdin);
    fails(out, 3, &["input ended before its end"]);
    fails(t.run("get", &["stopped"]), 1, &[]);
    assert_eq!(ok(t.run("get", &["k1"])), "1\n");
    t.verify_clean();
}

/// A store deep in the file system (its `control.sock` and `nbd.sock` paths longer
/// than a socket address holds): commands work on it with no server, `serve` starts
/// on it, and commands reach that server.
#[test]
fn a_store_whose_socket_paths_are_too_long_for_an_address() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d".repeat(100)).join("store");
    assert!(s(&dir).len() + "/control.sock".len() >= 108);
    let d = s(&dir);
    assert_eq!(ok(run(&["init", d])), "");
    ok(run(&["volume", "create", d, "disk", "--size", "1M"]));
    assert_eq!(ok(run(&["put", d, "k", "v"])), "");

    let server = Server::start(&dir);
    assert_eq!(server.sock, dir.join("nbd.sock"));
    assert_eq!(ok(run(&["put", d, "k", "w"])), "", "through the server");
    ok(run(&["volume", "snapshot", d, "disk", "snap"]));
    server.stop_clean(&dir);
    assert_eq!(ok(run(&["get", d, "k"])), "w\n");
    let listed = ok(run(&["volume", "list", d]));
    assert!(listed.contains("snap"), "{listed}");
}

/// A script that starts `serve` and runs a writing command at the same moment: both
/// succeed whichever takes the store first (the command waits for the starting
/// server's control socket; the server waits for the command to finish).
#[test]
fn serve_and_a_command_started_together_both_succeed() {
    let t = TestStore::new();
    t.create("disk", "1M");
    for round in 0..6 {
        let name = format!("v{round}");
        let command = {
            let (dir, name) = (t.d().to_owned(), name.clone());
            move || run(&["volume", "create", &dir, &name, "--size", "1M"])
        };
        // Alternately the command a little ahead of the server, and the other way.
        let (server, created) = if round % 2 == 0 {
            let cmd = std::thread::spawn(command);
            let server = Server::start(&t.dir);
            (server, cmd.join().unwrap())
        } else {
            let cmd = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(5));
                command()
            });
            let server = Server::start(&t.dir);
            (server, cmd.join().unwrap())
        };
        assert_eq!(
            created.status.code(),
            Some(0),
            "round {round}: {}",
            stderr(&created)
        );
        assert!(listed_names(&server.sock).contains(&name), "round {round}");
        server.stop_clean(&t.dir);
    }
    t.verify_clean();
}

/// A server whose control socket file was removed by hand still stops at once on
/// SIGTERM (its accept loop used to be woken only through that file).
#[test]
fn a_server_whose_control_socket_was_removed_still_stops() {
    let t = TestStore::new();
    t.create("disk", "1M");
    let server = Server::start(&t.dir);
    std::fs::remove_file(t.dir.join("control.sock")).unwrap();
    let started = Instant::now();
    server.stop_clean(&t.dir);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "stop took {:?}",
        started.elapsed()
    );
}

/// A file that is not a socket where `serve` would make one (the NBD socket or the
/// control socket) is never removed: the server refuses to start, exit 3, naming it.
#[test]
fn serve_does_not_remove_a_file_where_its_sockets_go() {
    let t = TestStore::new();
    t.create("disk", "1M");
    for name in ["nbd.sock", "control.sock"] {
        let path = t.dir.join(name);
        std::fs::write(&path, b"not a socket").unwrap();
        let out = Command::new(BIN)
            .args(["serve", t.d()])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(3), "{name}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("is not a socket"),
            "{name}: {}",
            stderr(&out)
        );
        assert_eq!(
            std::fs::read(&path).unwrap(),
            b"not a socket",
            "{name} kept"
        );
        std::fs::remove_file(&path).unwrap();
    }
    t.verify_clean();
}

/// An idle `cambium batch` (waiting on its stdin) run by the server must not stall
/// NBD writes, nor keep SIGTERM from stopping the server.
#[test]
fn an_idle_batch_does_not_stall_nbd_writes_or_shutdown() {
    let t = TestStore::new();
    t.create("disk", "1M");
    let mut server = Server::start(&t.dir);
    // A batch whose producer has not written anything yet (a terminal, a slow pipe).
    let _batch = Background(
        Command::new(BIN)
            .args(["batch", t.d()])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(500));
    let sock = server.sock.clone();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let (mut c, _, _) = go(&sock, "disk");
        c.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        let _ = tx.send(raw_write(&mut c, 1, 0, &[7u8; 4096]));
    });
    let answered = rx.recv_timeout(Duration::from_secs(5));
    server.sigterm();
    let exited = server.wait_for_exit(Duration::from_secs(25));
    assert!(
        answered.is_ok() && exited.is_some(),
        "NBD write answered within 5 s: {}; serve exited within 25 s of SIGTERM: {}",
        answered.is_ok(),
        exited.is_some()
    );
    assert!(
        exited.is_some(),
        "serve did not stop within 25 s of SIGTERM (NBD drain waits on the writer lock the batch holds)"
    );
}

/// `batch --commit-every` whose stdout reader goes away: in-process this is exit 3
/// ("committed N ..., then could not acknowledge them; the rest of the input was not
/// applied"); through the server it must be the same, not a silent exit 0.
#[test]
fn batch_whose_reader_goes_away_exits_the_same_through_the_server() {
    fn reader_gone(dir: &Path, tag: &str) -> (Option<i32>, String) {
        let mut child = Command::new(BIN)
            .args(["batch", s(dir), "--commit-every", "1"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let mut acks = BufReader::new(child.stdout.take().unwrap());
        stdin
            .write_all(format!("put\t{tag}1\t1\n").as_bytes())
            .unwrap();
        let mut ack = String::new();
        acks.read_line(&mut ack).unwrap();
        assert_eq!(ack, "committed 1\n");
        drop(acks); // like `| head -1`
        let _ = stdin.write_all(format!("put\t{tag}2\t2\n").as_bytes());
        std::thread::sleep(Duration::from_millis(500));
        let _ = stdin.write_all(format!("put\t{tag}3\t3\n").as_bytes());
        drop(stdin);
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        (child.wait().unwrap().code(), err)
    }
    let t = TestStore::new();
    t.create("disk", "1M");
    let (code, err) = reader_gone(&t.dir, "a");
    assert_eq!(code, Some(3), "in-process: {err}");
    assert!(err.contains("could not acknowledge"), "{err}");
    let server = Server::start(&t.dir);
    let (code, err) = reader_gone(&t.dir, "b");
    drop(server); // SIGKILL: crash-safe
    assert_eq!(
        ok(t.run("get", &["b2"])),
        "2\n",
        "b2 was committed and acknowledged"
    );
    fails(t.run("get", &["b3"]), 1, &[]); // the rest was not applied
    assert_eq!(
        code,
        Some(3),
        "through the server: exit {code:?}, stderr {err:?} (the rest of the input was not applied)"
    );
}

/// A committed change whose output cannot be written is exit 6 ("durable, do not
/// retry") in-process; through the server it must be too.
#[test]
fn output_failure_after_a_commit_is_exit_6_through_the_server() {
    fn to_full(args: &[&str], input: Option<&[u8]>) -> (Option<i32>, String) {
        let mut child = Command::new(BIN)
            .args(args)
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(std::fs::File::create("/dev/full").unwrap())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        if let Some(input) = input {
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(input).unwrap();
        }
        let out = child.wait_with_output().unwrap();
        (out.status.code(), stderr(&out))
    }
    let t = TestStore::new();
    t.create("disk", "1M");
    let (code, err) = to_full(&["snapshot", t.d(), "main", "s1"], None);
    assert_eq!(code, Some(6), "in-process snapshot: {err}");
    let (code, err) = to_full(&["batch", t.d()], Some(b"put\tk1\tv\n"));
    assert_eq!(code, Some(6), "in-process batch: {err}");
    let server = Server::start(&t.dir);
    let snap = to_full(&["snapshot", t.d(), "main", "s2"], None);
    let batch = to_full(&["batch", t.d()], Some(b"put\tk2\tv\n"));
    drop(server);
    eprintln!("through the server: snapshot {snap:?}; batch {batch:?}");
    assert_eq!(snap.0, Some(6), "snapshot through the server: {}", snap.1);
    assert_eq!(batch.0, Some(6), "batch through the server: {}", batch.1);
}

/// A control client that stops reading its answers (a stopped `cambium batch`, a
/// stdout nobody reads) must not keep the server from stopping on SIGTERM.
#[test]
fn a_control_client_that_does_not_read_does_not_block_shutdown() {
    let t = TestStore::new();
    t.create("disk", "1M");
    let mut server = Server::start(&t.dir);
    let mut c = UnixStream::connect(t.dir.join("control.sock")).unwrap();
    c.write_all(
        b"{\"json\":false,\"hex\":false,\"request\":{\"op\":\"batch\",\"branch\":\"main\",\"commit_every\":1}}\n",
    )
    .unwrap();
    let mut input = Vec::new();
    for i in 0..3000 {
        input.extend_from_slice(format!("put\tk{i}\tv\n").as_bytes());
    }
    for chunk in input.chunks(60000) {
        c.write_all(&(chunk.len() as u32).to_le_bytes()).unwrap();
        c.write_all(chunk).unwrap();
    }
    c.write_all(&0u32.to_le_bytes()).unwrap();
    // Let the server fill the socket with acknowledgements nobody reads.
    std::thread::sleep(Duration::from_secs(5));
    server.sigterm();
    let exited = server.wait_for_exit(Duration::from_secs(20));
    drop(c);
    assert!(
        exited.is_some(),
        "serve did not stop within 20 s of SIGTERM: blocked writing to a control client"
    );
}

/// `--wait` waits for the writer; when the writer is (or becomes) a server, the
/// command should reach it, not wait for a lock the server never gives back.
/// (control.sock is moved away briefly to stand for the window in which `serve`
/// holds the lock but has not bound the socket yet: its recovery.)
#[test]
fn wait_reaches_a_server_whose_socket_appears_while_waiting() {
    let t = TestStore::new();
    t.create("disk", "1M");
    let server = Server::start(&t.dir);
    let sock = t.dir.join("control.sock");
    let away = t.dir.join("control.sock.away");
    std::fs::rename(&sock, &away).unwrap();
    let child = Command::new(BIN)
        .args(["--wait=6", "put", t.d(), "k", "v"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    std::fs::rename(&away, &sock).unwrap();
    let started = Instant::now();
    let out = child.wait_with_output().unwrap();
    drop(server);
    assert_eq!(
        out.status.code(),
        Some(0),
        "after {:?}: {}",
        started.elapsed(),
        stderr(&out)
    );
}
