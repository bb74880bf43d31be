//! Behaviour of the server over real Unix sockets, driven by the test client.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use super::proto::{self, Request};
use super::test_client::{Client, TestServer};
use super::{Listen, Server, ServerOptions};

fn server() -> TestServer {
    TestServer::start(ServerOptions::default())
}

/// Reads until EOF (or error); true if the peer closed.
fn closed(s: &mut UnixStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut sink = Vec::new();
    s.read_to_end(&mut sink).is_ok()
}

#[test]
fn simple_write_read_round_trip() {
    let srv = server();
    let mut c = srv.client("disk1", false, false);
    let data = vec![0xabu8; 8192];
    assert_eq!(
        c.cmd(proto::CMD_WRITE, 0, 4096, 8192, &data).unwrap().error,
        0
    );
    let r = c.cmd(proto::CMD_READ, 0, 4096, 8192, &[]).unwrap();
    assert_eq!((r.error, r.cookie), (0, 42));
    assert_eq!(r.data, data);
    assert_eq!(c.cmd(proto::CMD_FLUSH, 0, 0, 0, &[]).unwrap().error, 0);
    assert_eq!(c.cmd(proto::CMD_CACHE, 0, 0, 4096, &[]).unwrap().error, 0);
}

#[test]
fn structured_read_error_and_block_status() {
    let srv = server();
    let mut c = srv.client("disk1", true, true);
    c.cmd(proto::CMD_WRITE, 0, 8192, 4096, &[1; 4096]).unwrap();
    let r = c
        .cmd(proto::CMD_READ, proto::CMD_FLAG_DF, 8192, 4096, &[])
        .unwrap();
    assert_eq!(r.chunks[0].0, proto::REPLY_TYPE_OFFSET_DATA);
    assert_eq!(r.data, vec![1; 4096]);
    let r = c.cmd(proto::CMD_READ, 0, 1 << 20, 1, &[]).unwrap();
    assert_eq!(r.error, 22);
    let r = c.cmd(proto::CMD_BLOCK_STATUS, 0, 0, 1 << 20, &[]).unwrap();
    let (id, descs) = proto::decode_block_status(&r.chunks[0].1).unwrap();
    assert_eq!(id, proto::BASE_ALLOCATION_ID);
    assert_eq!(descs, vec![(8192, 3), (4096, 0), ((1 << 20) - 12288, 3)]);
    let r = c
        .cmd(
            proto::CMD_BLOCK_STATUS,
            proto::CMD_FLAG_REQ_ONE,
            0,
            1 << 20,
            &[],
        )
        .unwrap();
    assert_eq!(
        proto::decode_block_status(&r.chunks[0].1).unwrap().1.len(),
        1
    );
    // Lengths past the end are capped; an offset past the end is EINVAL.
    let r = c.cmd(proto::CMD_BLOCK_STATUS, 0, (1 << 20) - 4096, u32::MAX, &[]);
    let (_, d) = proto::decode_block_status(&r.unwrap().chunks[0].1).unwrap();
    assert_eq!(d, vec![(4096, 3)]);
    let r = c.cmd(proto::CMD_BLOCK_STATUS, 0, 1 << 20, 1, &[]).unwrap();
    assert_eq!(r.error, 22);
}

#[test]
fn block_status_needs_meta_context() {
    let srv = server();
    let mut c = srv.client("disk1", true, false);
    assert_eq!(
        c.cmd(proto::CMD_BLOCK_STATUS, 0, 0, 4096, &[])
            .unwrap()
            .error,
        22
    );
}

#[test]
fn errors_keep_the_connection_usable() {
    let srv = server();
    let mut c = srv.client("ro", false, false);
    // EPERM after the payload is consumed: the next request parses fine.
    assert_eq!(
        c.cmd(proto::CMD_WRITE, 0, 0, 4096, &[9; 4096])
            .unwrap()
            .error,
        1
    );
    assert_eq!(c.cmd(proto::CMD_TRIM, 0, 0, 4096, &[]).unwrap().error, 1);
    assert_eq!(
        c.cmd(proto::CMD_WRITE_ZEROES, 0, 0, 1, &[]).unwrap().error,
        1
    );
    assert_eq!(c.cmd(proto::CMD_READ, 0, 0, 4, &[]).unwrap().data, [0; 4]);
    let mut c = srv.client("odd", false, false);
    assert_eq!(
        c.cmd(proto::CMD_WRITE, 0, 9999, 2, &[1, 2]).unwrap().error,
        28
    );
    assert_eq!(
        c.cmd(proto::CMD_WRITE_ZEROES, 0, 9999, 2, &[])
            .unwrap()
            .error,
        28
    );
    assert_eq!(
        c.cmd(proto::CMD_READ, 0, u64::MAX, 2, &[]).unwrap().error,
        22
    );
    assert_eq!(c.cmd(proto::CMD_TRIM, 0, 10000, 1, &[]).unwrap().error, 22);
    assert_eq!(c.cmd(99, 0, 0, 0, &[]).unwrap().error, 22);
    assert_eq!(c.cmd(proto::CMD_FLUSH, 0x100, 0, 0, &[]).unwrap().error, 22);
    assert_eq!(c.cmd(proto::CMD_READ, 0, 0, 0, &[]).unwrap().error, 0);
    assert_eq!(c.cmd(proto::CMD_WRITE, 0, 10000, 0, &[]).unwrap().error, 0);
    assert_eq!(c.cmd(proto::CMD_READ, 0, 9999, 1, &[]).unwrap().data, [0]);
}

#[test]
fn oversized_requests_get_einval() {
    let opts = ServerOptions {
        max_payload_bytes: 4096,
        ..ServerOptions::default()
    };
    let srv = TestServer::start(opts);
    let mut c = srv.client("disk1", false, false);
    assert_eq!(c.cmd(proto::CMD_READ, 0, 0, 4097, &[]).unwrap().error, 22);
    // Skippable oversized write: EINVAL, stream stays in sync, nothing written.
    assert_eq!(
        c.cmd(proto::CMD_WRITE, 0, 0, 8192, &[7; 8192])
            .unwrap()
            .error,
        22
    );
    assert_eq!(c.cmd(proto::CMD_READ, 0, 0, 4, &[]).unwrap().data, [0; 4]);
    // A write too large to skip closes the connection.
    let req = Request {
        flags: 0,
        command: proto::CMD_WRITE,
        cookie: 1,
        offset: 0,
        len: u32::MAX,
    };
    c.send(req, &[]).unwrap();
    assert!(closed(&mut c.s));
}

#[test]
fn trim_and_zero_make_holes() {
    let srv = server();
    let mut c = srv.client("disk1", true, true);
    c.cmd(proto::CMD_WRITE, 0, 0, 16384, &[5; 16384]).unwrap();
    assert_eq!(c.cmd(proto::CMD_TRIM, 0, 0, 4096, &[]).unwrap().error, 0);
    let flags = proto::CMD_FLAG_NO_HOLE | proto::CMD_FLAG_FAST_ZERO;
    assert_eq!(
        c.cmd(proto::CMD_WRITE_ZEROES, flags, 4096, 4096, &[])
            .unwrap()
            .error,
        0
    );
    assert_eq!(
        c.cmd(proto::CMD_WRITE_ZEROES, 0, 8192, 4096, &[])
            .unwrap()
            .error,
        0
    );
    let disk = srv.exports.get("disk1").unwrap();
    assert!(!disk.is_allocated(0) && disk.is_allocated(4096) && !disk.is_allocated(8192));
    assert!(disk.is_allocated(12288));
    assert_eq!(&disk.contents()[..12288], &[0; 12288][..]);
}

#[test]
fn option_haggling_errors_do_not_close() {
    let srv = server();
    let mut c = Client::connect(&srv.path).unwrap();
    let rep = |r: Vec<(u32, Vec<u8>)>| r.last().unwrap().0;
    assert_eq!(rep(c.opt(1000, b"junk").unwrap()), proto::REP_ERR_UNSUP);
    assert_eq!(
        rep(c.opt(proto::OPT_STARTTLS, &[]).unwrap()),
        proto::REP_ERR_UNSUP
    );
    assert_eq!(
        rep(c.opt(proto::OPT_EXTENDED_HEADERS, &[]).unwrap()),
        proto::REP_ERR_UNSUP
    );
    assert_eq!(
        rep(c.opt(proto::OPT_LIST, b"x").unwrap()),
        proto::REP_ERR_INVALID
    );
    assert_eq!(
        rep(c.opt(proto::OPT_GO, &[0, 0]).unwrap()),
        proto::REP_ERR_INVALID
    );
    let meta = proto::MetaRequest {
        export: "disk1".into(),
        queries: vec![proto::BASE_ALLOCATION.into()],
    };
    let r = c.opt(proto::OPT_SET_META_CONTEXT, &meta.encode()).unwrap();
    assert_eq!(rep(r), proto::REP_ERR_INVALID);
    let unknown = proto::InfoRequest {
        name: "nope".into(),
        infos: vec![],
    };
    assert_eq!(
        rep(c.opt(proto::OPT_INFO, &unknown.encode()).unwrap()),
        proto::REP_ERR_UNKNOWN
    );
    assert_eq!(
        rep(c.opt(proto::OPT_STRUCTURED_REPLY, &[]).unwrap()),
        proto::REP_ACK
    );
    let r = c.opt(proto::OPT_STRUCTURED_REPLY, &[]).unwrap();
    assert_eq!(rep(r), proto::REP_ERR_INVALID);
    let big = vec![0u8; proto::MAX_OPTION_LEN as usize + 1];
    assert_eq!(
        rep(c.opt(proto::OPT_LIST, &big).unwrap()),
        proto::REP_ERR_TOO_BIG
    );
    // Still usable.
    let r = c.opt(proto::OPT_LIST, &[]).unwrap();
    let names: Vec<_> = r
        .iter()
        .filter_map(|(_, d)| proto::decode_rep_server(d))
        .collect();
    assert_eq!(names, ["disk1", "odd", "ro"]);
}

#[test]
fn list_meta_context_queries() {
    let srv = server();
    let mut c = Client::connect(&srv.path).unwrap();
    for (queries, found) in [
        (vec![], true),
        (vec!["base:".to_string()], true),
        (vec!["base:allocation".to_string()], true),
        (vec!["qemu:dirty-bitmap:x".to_string()], false),
    ] {
        let q = proto::MetaRequest {
            export: "disk1".into(),
            queries,
        };
        let r = c.opt(proto::OPT_LIST_META_CONTEXT, &q.encode()).unwrap();
        let ctx = r.iter().find(|(t, _)| *t == proto::REP_META_CONTEXT);
        assert_eq!(ctx.is_some(), found);
        assert_eq!(r.last().unwrap().0, proto::REP_ACK);
    }
}

#[test]
fn info_reports_name_and_block_size() {
    let srv = server();
    let mut c = Client::connect(&srv.path).unwrap();
    let req = proto::InfoRequest {
        name: "ro".into(),
        infos: vec![proto::INFO_NAME, proto::INFO_BLOCK_SIZE, 77],
    };
    let r = c.opt(proto::OPT_INFO, &req.encode()).unwrap();
    let infos: Vec<_> = r
        .iter()
        .filter_map(|(_, d)| proto::Info::decode(d))
        .collect();
    let flags = super::handshake::transmission_flags(true, false);
    let writing = proto::TFLAG_SEND_TRIM
        | proto::TFLAG_SEND_WRITE_ZEROES
        | proto::TFLAG_SEND_FUA
        | proto::TFLAG_SEND_FAST_ZERO;
    assert_eq!(
        (flags & proto::TFLAG_READ_ONLY, flags & writing),
        (proto::TFLAG_READ_ONLY, 0),
        "a read-only export offers no writing command"
    );
    assert_eq!(
        infos,
        [
            proto::Info::Export {
                size: 64 << 10,
                flags
            },
            proto::Info::Name("ro".into()),
            proto::Info::BlockSize {
                min: 1,
                preferred: 4096,
                max: 32 << 20
            },
        ]
    );
    // INFO does not end haggling: GO still works on the same connection.
    assert_eq!(c.go("ro", false, false).unwrap().0, 64 << 10);
}

#[test]
fn meta_context_forgotten_when_go_names_another_export() {
    let srv = server();
    let mut c = Client::connect(&srv.path).unwrap();
    c.opt(proto::OPT_STRUCTURED_REPLY, &[]).unwrap();
    c.structured = true;
    let q = proto::MetaRequest {
        export: "odd".into(),
        queries: vec![proto::BASE_ALLOCATION.into()],
    };
    c.opt(proto::OPT_SET_META_CONTEXT, &q.encode()).unwrap();
    c.go("disk1", false, false).unwrap();
    assert_eq!(
        c.cmd(proto::CMD_BLOCK_STATUS, 0, 0, 4096, &[])
            .unwrap()
            .error,
        22
    );
}

#[test]
fn export_name_old_style_reply() {
    let srv = server();
    let mut s = UnixStream::connect(&srv.path).unwrap();
    let _: [u8; 18] = proto::read_array(&mut s).unwrap();
    s.write_all(&1u32.to_be_bytes()).unwrap(); // FIXED_NEWSTYLE only: zeroes expected
    let h = proto::OptionHeader {
        option: proto::OPT_EXPORT_NAME,
        len: 3,
    };
    s.write_all(&h.encode()).unwrap();
    s.write_all(b"odd").unwrap();
    let r: [u8; 134] = proto::read_array(&mut s).unwrap();
    assert_eq!(u64::from_be_bytes(r[..8].try_into().unwrap()), 10000);
    assert!(r[10..].iter().all(|&b| b == 0));
    let mut c = Client {
        s,
        structured: false,
    };
    assert_eq!(c.cmd(proto::CMD_READ, 0, 0, 3, &[]).unwrap().data, [0; 3]);
}

#[test]
fn bad_frames_close() {
    let srv = server();
    // Unknown client flag bits.
    let mut s = UnixStream::connect(&srv.path).unwrap();
    let _: [u8; 18] = proto::read_array(&mut s).unwrap();
    s.write_all(&0x80u32.to_be_bytes()).unwrap();
    assert!(closed(&mut s));
    // Unknown export via EXPORT_NAME.
    let mut c = Client::connect(&srv.path).unwrap();
    let h = proto::OptionHeader {
        option: proto::OPT_EXPORT_NAME,
        len: 2,
    };
    c.s.write_all(&h.encode()).unwrap();
    c.s.write_all(b"no").unwrap();
    assert!(closed(&mut c.s));
    // Bad request magic.
    let mut c = srv.client("disk1", false, false);
    c.s.write_all(&[0u8; 28]).unwrap();
    assert!(closed(&mut c.s));
}

#[test]
fn abort_acks_and_closes() {
    let srv = server();
    let mut c = Client::connect(&srv.path).unwrap();
    let r = c.opt(proto::OPT_ABORT, &[]).unwrap();
    assert_eq!(r[0].0, proto::REP_ACK);
    assert!(closed(&mut c.s));
}

#[test]
fn pipelined_requests_and_disc() {
    let srv = server();
    let mut c = srv.client("disk1", true, false);
    let mut batch = Vec::new();
    for i in 0..32u64 {
        let req = Request {
            flags: 0,
            command: proto::CMD_WRITE,
            cookie: i,
            offset: i * 4096,
            len: 4096,
        };
        batch.extend_from_slice(&req.encode());
        batch.extend_from_slice(&[i as u8; 4096]);
    }
    let disc = Request {
        flags: 0,
        command: proto::CMD_DISC,
        cookie: 99,
        offset: 0,
        len: 0,
    };
    batch.extend_from_slice(&disc.encode());
    c.s.write_all(&batch).unwrap();
    for i in 0..32u64 {
        let r = c.recv(0).unwrap();
        assert_eq!((r.cookie, r.error), (i, 0));
    }
    assert!(closed(&mut c.s));
    let data = srv.exports.get("disk1").unwrap().contents();
    assert!((0..32usize).all(|i| data[i * 4096] == i as u8));
}

/// Pipelined writes go to the export as one batch; a request in the middle that
/// is out of range, or carries a bad flag, is answered with its own error and the
/// rest are applied, overlapping ones in order.
#[test]
fn a_batch_answers_each_write_on_its_own() {
    let srv = server();
    let mut c = srv.client("disk1", false, false);
    let size = srv.exports.get("disk1").unwrap().contents().len() as u64;
    let write = |cookie: u64, flags: u16, offset: u64, byte: u8| {
        let req = Request {
            flags,
            command: proto::CMD_WRITE,
            cookie,
            offset,
            len: 4096,
        };
        let mut b = req.encode().to_vec();
        b.extend_from_slice(&[byte; 4096]);
        b
    };
    let mut stream = Vec::new();
    stream.extend(write(1, 0, 0, 1));
    stream.extend(write(2, 0, size - 100, 2)); // past the end: ENOSPC
    stream.extend(write(3, proto::CMD_FLAG_NO_HOLE, 8192, 3)); // not a write flag: EINVAL
    stream.extend(write(4, 0, 2048, 4)); // overlaps the first: later wins
    stream.extend(write(5, proto::CMD_FLAG_FUA, 16384, 5));
    c.s.write_all(&stream).unwrap();
    let replies: Vec<(u64, u32)> = (0..5)
        .map(|_| c.recv(0).unwrap())
        .map(|r| (r.cookie, r.error))
        .collect();
    assert_eq!(replies, [(1, 0), (2, 28), (3, 22), (4, 0), (5, 0)]);
    let data = srv.exports.get("disk1").unwrap().contents();
    assert!(data[..2048].iter().all(|&b| b == 1));
    assert!(data[2048..6144].iter().all(|&b| b == 4));
    assert!(data[8192..12288].iter().all(|&b| b == 0));
    assert!(data[16384..20480].iter().all(|&b| b == 5));
}

/// A client sends a write header and half its payload, with other requests
/// already answered before it, then vanishes: nothing of the half write is
/// applied and the server keeps serving.
#[test]
fn half_written_payload_applies_nothing() {
    let srv = server();
    let mut c = srv.client("disk1", false, false);
    let mut bytes = Vec::new();
    for (i, cmd) in [proto::CMD_READ, proto::CMD_FLUSH].into_iter().enumerate() {
        let req = Request {
            flags: 0,
            command: cmd,
            cookie: i as u64,
            offset: 0,
            len: if cmd == proto::CMD_READ { 512 } else { 0 },
        };
        bytes.extend_from_slice(&req.encode());
    }
    let write = Request {
        flags: 0,
        command: proto::CMD_WRITE,
        cookie: 7,
        offset: 65536,
        len: 65536,
    };
    bytes.extend_from_slice(&write.encode());
    bytes.extend_from_slice(&[0xee; 32768]);
    c.s.write_all(&bytes).unwrap();
    drop(c);
    std::thread::sleep(Duration::from_millis(100));
    let data = srv.exports.get("disk1").unwrap().contents();
    assert!(data.iter().all(|&b| b == 0));
    let mut c = srv.client("disk1", false, false);
    assert_eq!(c.cmd(proto::CMD_WRITE, 0, 0, 1, &[1]).unwrap().error, 0);
}

#[test]
fn handshake_timeout_drops_idle_client() {
    let opts = ServerOptions {
        handshake_timeout: Duration::from_millis(200),
        ..ServerOptions::default()
    };
    let srv = TestServer::start(opts);
    let mut s = UnixStream::connect(&srv.path).unwrap();
    let start = std::time::Instant::now();
    assert!(closed(&mut s));
    assert!(start.elapsed() < Duration::from_secs(3));
    // Transmission has no timeout: a client past GO may idle.
    let mut c = srv.client("disk1", false, false);
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(c.cmd(proto::CMD_FLUSH, 0, 0, 0, &[]).unwrap().error, 0);
}

#[test]
fn max_connections_closes_extra() {
    let opts = ServerOptions {
        max_connections: 1,
        evict_idle_after: Duration::from_secs(3600),
        ..ServerOptions::default()
    };
    let srv = TestServer::start(opts);
    let mut first = srv.client("disk1", false, false);
    let mut second = UnixStream::connect(&srv.path).unwrap();
    assert!(closed(&mut second));
    assert_eq!(first.cmd(proto::CMD_FLUSH, 0, 0, 0, &[]).unwrap().error, 0);
}

/// A server of at most `max` connections that ends one idle for `idle` to make way.
fn evicting_server(max: usize, idle: Duration) -> TestServer {
    TestServer::start(ServerOptions {
        max_connections: max,
        evict_idle_after: idle,
        ..ServerOptions::default()
    })
}

/// A full server makes room for a newcomer by ending the connection idle the
/// longest, so idle connections (or a flood of sockets that never say a word) cannot
/// lock clients out.
#[test]
fn a_newcomer_takes_the_place_of_the_connection_idle_the_longest() {
    let idle = Duration::from_millis(50);
    let srv = evicting_server(2, idle);
    let mut a = srv.client("disk1", false, false);
    std::thread::sleep(2 * idle);
    let mut b = srv.client("disk1", false, false);
    assert_eq!(b.cmd(proto::CMD_WRITE, 0, 0, 4, &[1; 4]).unwrap().error, 0);
    std::thread::sleep(2 * idle);
    let mut c = srv.client("disk1", false, false);
    assert!(closed(&mut a.s), "the idlest made way");
    assert_eq!(b.cmd(proto::CMD_READ, 0, 0, 4, &[]).unwrap().data, [1; 4]);
    assert_eq!(c.cmd(proto::CMD_FLUSH, 0, 0, 0, &[]).unwrap().error, 0);

    // Hundreds of sockets that never handshake, then a client: it gets in.
    let flood: Vec<UnixStream> = (0..300)
        .map(|_| UnixStream::connect(&srv.path).unwrap())
        .collect();
    std::thread::sleep(2 * idle);
    let mut d = srv.client("disk1", false, false);
    assert_eq!(d.cmd(proto::CMD_READ, 0, 0, 4, &[]).unwrap().data, [1; 4]);
    drop(flood);
}

/// Sockets that never say a word make way for each other before any session does:
/// a flood of them (more than the cap) leaves every idle session standing, and a
/// client still gets in.
#[test]
fn a_silent_flood_makes_way_for_itself_not_for_idle_sessions() {
    let idle = Duration::from_millis(50);
    let srv = evicting_server(4, idle);
    let mut sessions: Vec<_> = (0..3u8)
        .map(|i| {
            let mut c = srv.client("disk1", false, false);
            let at = u64::from(i) * 4096;
            assert_eq!(
                c.cmd(proto::CMD_WRITE, 0, at, 4, &[i + 1; 4])
                    .unwrap()
                    .error,
                0
            );
            c
        })
        .collect();
    std::thread::sleep(2 * idle);
    let mut flood = Vec::new();
    for _ in 0..5 {
        flood.extend((0..50).map(|_| UnixStream::connect(&srv.path).unwrap()));
        std::thread::sleep(2 * idle);
    }
    for (i, c) in (0u8..).zip(&mut sessions) {
        let r = c
            .cmd(proto::CMD_READ, 0, u64::from(i) * 4096, 4, &[])
            .unwrap();
        assert_eq!(r.data, [i + 1; 4], "session {i} outlived the flood");
    }
    let mut late = srv.client("disk1", false, false);
    assert_eq!(
        late.cmd(proto::CMD_READ, 0, 0, 4, &[]).unwrap().data,
        [1; 4]
    );
    drop(flood);
}

#[test]
fn shutdown_finishes_and_removes_socket() {
    let mut srv = server();
    let mut c = srv.client("disk1", false, false);
    assert_eq!(c.cmd(proto::CMD_WRITE, 0, 0, 1, &[1]).unwrap().error, 0);
    srv.stop().unwrap();
    assert!(closed(&mut c.s));
    assert!(!srv.path.exists());
}

#[test]
fn bind_replaces_stale_socket_but_not_live_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let listen = Listen::Unix(path.clone());
    let live = Server::bind(&listen, ServerOptions::default()).unwrap();
    let err = Server::bind(&listen, ServerOptions::default())
        .err()
        .unwrap();
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
    drop(live); // leaves the socket file, like a killed server
    assert!(path.exists());
    let again = Server::bind(&listen, ServerOptions::default()).unwrap();
    assert_eq!(again.local_addr(), path.display().to_string());
    // A regular file is never removed.
    let file = dir.path().join("f");
    std::fs::write(&file, b"x").unwrap();
    assert!(Server::bind(&Listen::Unix(file.clone()), ServerOptions::default()).is_err());
    assert!(file.exists());
}

#[test]
fn tcp_listen_serves_and_shuts_down() {
    let server =
        Server::bind(&Listen::Tcp("127.0.0.1:0".into()), ServerOptions::default()).unwrap();
    let addr = server.local_addr();
    let handle = server.shutdown_handle();
    let exports = std::sync::Arc::new(super::memory::MemExports::new());
    exports.add("t", 4096, false);
    let t = std::thread::spawn(move || server.run(exports));
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    let g: [u8; 18] = proto::read_array(&mut s).unwrap();
    assert_eq!(proto::decode_greeting(&g), Some(3));
    handle.shutdown();
    t.join().unwrap().unwrap();
}

/// Large writes that continue each other, their headers already in, land as one
/// write (one transaction in the engine), each still answered once; a header read
/// while looking for them that does not continue the run (a write elsewhere, a
/// read) is served next, in order; a FUA on one covers the landing.
#[test]
fn sequential_large_writes_join_one_landing() {
    const BIG: usize = 256 << 10;
    let srv = server();
    let disk = srv.exports.get("disk1").unwrap();
    let req = |cookie: u64, command: u16, offset: usize, len: usize, flags: u16| Request {
        flags,
        command,
        cookie,
        offset: offset as u64,
        len: len as u32,
    };
    let mut joined = 0;
    for attempt in 0..20u8 {
        let mut c = srv.client("disk1", true, false);
        let v = |n: u8| vec![n.wrapping_add(attempt); BIG];
        let mut stream = Vec::new();
        let mut add = |r: Request, payload: &[u8]| {
            stream.extend_from_slice(&r.encode());
            stream.extend_from_slice(payload);
        };
        add(req(1, proto::CMD_WRITE, 0, BIG, 0), &v(1));
        add(
            req(2, proto::CMD_WRITE, BIG, BIG, proto::CMD_FLAG_FUA),
            &v(2),
        );
        add(req(3, proto::CMD_WRITE, 2 * BIG, BIG, 0), &v(3));
        // Not a continuation: overlaps the run.
        add(req(4, proto::CMD_WRITE, BIG / 2, BIG, 0), &v(4));
        add(req(5, proto::CMD_READ, 0, 4 * BIG, 0), &[]);
        add(req(6, proto::CMD_WRITE, 3 * BIG, BIG, 0), &v(6));
        // Written by another thread while this one reads the answers, as a client
        // with requests in flight does.
        let mut w = c.s.try_clone().unwrap();
        let sender = std::thread::spawn(move || w.write_all(&stream));
        let mut replies = std::collections::BTreeMap::new();
        for _ in 0..6 {
            let r = c.recv(0).unwrap();
            assert_eq!(r.error, 0, "request {} failed", r.cookie);
            assert!(
                replies.insert(r.cookie, r).is_none(),
                "one reply per request"
            );
        }
        sender.join().unwrap().unwrap();
        let mut want = vec![0u8; 4 * BIG];
        want[..BIG].copy_from_slice(&v(1));
        want[BIG..2 * BIG].copy_from_slice(&v(2));
        want[2 * BIG..3 * BIG].copy_from_slice(&v(3));
        want[BIG / 2..BIG / 2 + BIG].copy_from_slice(&v(4));
        if attempt > 0 {
            // The last attempt's final write is still there until this one's.
            want[3 * BIG..].copy_from_slice(&vec![5u8.wrapping_add(attempt); BIG]);
        }
        assert!(
            replies[&5].data == want,
            "the read sees the writes before it"
        );
        want[3 * BIG..].copy_from_slice(&v(6));
        assert!(disk.contents() == want);
        if disk.take_largest_write() > BIG {
            joined += 1;
            if joined == 2 {
                return;
            }
        }
    }
    panic!("pipelined sequential large writes never joined a landing ({joined} of 20)");
}

/// The header behind a landing, deterministically (the client sends the end of a
/// 1 MiB payload and what follows it in one write, after the server has taken the
/// rest, so the read of that end brings it into the server's buffer): a continuing
/// write joins; a read is served next, after the write; a header only partly here
/// does not hold back the answer to the write before it.
#[test]
fn the_header_behind_a_landing_joins_it_or_is_served_next() {
    const MIB: usize = 1 << 20;
    const TAIL: usize = 100;
    let srv = server();
    let disk = srv.exports.add("big", 3 * MIB as u64, false);
    let write = |cookie: u64, offset: usize| Request {
        flags: 0,
        command: proto::CMD_WRITE,
        cookie,
        offset: offset as u64,
        len: MIB as u32,
    };
    let read = Request {
        flags: 0,
        command: proto::CMD_READ,
        cookie: 2,
        offset: 0,
        len: 4096,
    };
    // Sends write 1 but its last TAIL bytes, waits for the server to take them, then
    // sends those with `then` in one write.
    let open_landing = |c: &mut Client, fill: u8, then: &[u8]| {
        let mut first = write(1, 0).encode().to_vec();
        first.extend_from_slice(&vec![fill; MIB - TAIL]);
        c.s.write_all(&first).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let mut rest = vec![fill; TAIL];
        rest.extend_from_slice(then);
        c.s.write_all(&rest).unwrap();
    };

    // A continuing write: one landing. (A landing joins as many bytes as the one
    // before it held, plus its own: a stream's first landing takes one write.)
    let mut c = srv.client("big", false, false);
    let mut then = write(2, MIB).encode().to_vec();
    then.extend_from_slice(&vec![2u8; MIB]);
    open_landing(&mut c, 1, &then);
    let cookies: Vec<u64> = (0..2).map(|_| c.recv(0).unwrap().cookie).collect();
    assert_eq!(cookies, [1, 2]);
    assert_eq!(
        disk.take_largest_write(),
        MIB,
        "a first landing joins nothing"
    );
    let mut third = write(3, 2 * MIB).encode().to_vec();
    third.extend_from_slice(&vec![3u8; MIB]);
    // Write 1 again, then 2 and 3 behind it: the stream's third landing.
    let mut again = write(1, 0).encode().to_vec();
    again.extend_from_slice(&vec![1u8; MIB]);
    c.s.write_all(&again).unwrap();
    assert_eq!(c.recv(0).unwrap().cookie, 1);
    let mut both = write(2, MIB).encode().to_vec();
    both.extend_from_slice(&vec![2u8; MIB - TAIL]);
    c.s.write_all(&both).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let mut rest = vec![2u8; TAIL];
    rest.extend_from_slice(&third);
    c.s.write_all(&rest).unwrap();
    let cookies: Vec<u64> = (0..2).map(|_| c.recv(0).unwrap().cookie).collect();
    assert_eq!(cookies, [2, 3]);
    assert_eq!(
        disk.take_largest_write(),
        2 * MIB,
        "the third write joined the second"
    );
    let want: Vec<u8> = [vec![1u8; MIB], vec![2u8; MIB], vec![3u8; MIB]].concat();
    assert!(disk.contents() == want);

    // A read: served after the write.
    let mut c = srv.client("big", false, false);
    open_landing(&mut c, 5, &read.encode());
    assert_eq!(c.recv(0).unwrap().cookie, 1);
    let r = c.recv(4096).unwrap();
    assert_eq!((r.cookie, r.error), (2, 0));
    assert_eq!(r.data, vec![5u8; 4096], "the read sees the write before it");
    assert_eq!(disk.take_largest_write(), MIB);

    // Part of a header: the write is answered before the rest comes.
    let mut c = srv.client("big", false, false);
    let header = read.encode();
    open_landing(&mut c, 4, &header[..10]);
    c.s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(
        c.recv(0).unwrap().cookie,
        1,
        "answered with a header half in"
    );
    c.s.write_all(&header[10..]).unwrap();
    let r = c.recv(4096).unwrap();
    assert_eq!((r.cookie, r.data), (2, vec![4u8; 4096]));
}

/// A client gone in the middle of a write that would join a landing: nothing of
/// the unfinished write lands, the one before it lands whole or not at all (it was
/// never answered), and the server serves the next client.
#[test]
fn a_client_gone_mid_landing_leaves_no_part_of_it() {
    const BIG: usize = 256 << 10;
    let srv = server();
    let disk = srv.exports.get("disk1").unwrap();
    let req = |cookie: u64, offset: usize| Request {
        flags: 0,
        command: proto::CMD_WRITE,
        cookie,
        offset: offset as u64,
        len: BIG as u32,
    };
    for _ in 0..5 {
        let mut gone = srv.client("disk1", false, false);
        let mut stream = req(1, 0).encode().to_vec();
        stream.extend_from_slice(&vec![1u8; BIG]);
        stream.extend_from_slice(&req(2, BIG).encode());
        stream.extend_from_slice(&vec![2u8; BIG / 2]);
        gone.s.write_all(&stream).unwrap();
        drop(gone);
        let mut c = srv.client("disk1", false, false);
        let r = c.cmd(proto::CMD_READ, 0, 0, 2 * BIG as u32, &[]).unwrap();
        assert_eq!(r.error, 0);
        let first = &r.data[..BIG];
        assert!(
            first.iter().all(|&b| b == 0) || first.iter().all(|&b| b == 1),
            "the first write landed whole or not at all"
        );
        assert!(
            r.data[BIG..].iter().all(|&b| b == 0),
            "nothing of the second"
        );
    }
    // (Read after the connections ended: the first write may land after the read
    // above, its connection still settling.)
    let after = disk.contents();
    assert!(after[BIG..2 * BIG].iter().all(|&b| b == 0));
}

/// Large writes land on the connection's second thread while it reads on: pipelined
/// with small writes, a read, a refused one and a flush, each is answered once, in
/// an order that applies them as sent (overlapping ones included); a read-only
/// export refuses one without taking it; a client gone mid-payload changes nothing.
#[test]
fn large_writes_land_in_order_beside_the_reads() {
    const BIG: u32 = 256 << 10;
    let srv = server();
    let mut c = srv.client("disk1", true, false);
    let req = |cookie: u64, command: u16, offset: u64, len: u32| Request {
        flags: 0,
        command,
        cookie,
        offset,
        len,
    };
    let mut stream = Vec::new();
    let mut add = |r: Request, payload: &[u8]| {
        stream.extend_from_slice(&r.encode());
        stream.extend_from_slice(payload);
    };
    add(req(1, proto::CMD_WRITE, 0, BIG), &vec![1; BIG as usize]);
    add(
        req(2, proto::CMD_WRITE, 128 << 10, BIG),
        &vec![2; BIG as usize],
    );
    add(req(3, proto::CMD_WRITE, 0, 4096), &[3; 4096]);
    // Past the end of the 1 MiB export: refused, and the stream stays in sync.
    add(
        req(4, proto::CMD_WRITE, (1 << 20) - 4096, BIG),
        &vec![4; BIG as usize],
    );
    add(
        req(5, proto::CMD_WRITE, 512 << 10, BIG),
        &vec![5; BIG as usize],
    );
    add(req(6, proto::CMD_READ, 0, 1 << 20), &[]);
    add(req(7, proto::CMD_FLUSH, 0, 0), &[]);
    c.s.write_all(&stream).unwrap();
    let mut replies = std::collections::BTreeMap::new();
    for _ in 0..7 {
        let r = c.recv(0).unwrap();
        assert!(
            replies.insert(r.cookie, r).is_none(),
            "one reply per request"
        );
    }
    let errors: Vec<u32> = replies.values().map(|r| r.error).collect();
    assert_eq!(errors, [0, 0, 0, 28, 0, 0, 0]);
    let mut want = vec![0u8; 1 << 20];
    want[..128 << 10].fill(1);
    want[128 << 10..384 << 10].fill(2);
    want[..4096].fill(3);
    want[512 << 10..768 << 10].fill(5);
    assert!(
        replies[&6].data == want,
        "the read sees every write before it"
    );
    assert!(srv.exports.get("disk1").unwrap().contents() == want);

    let mut ro = srv.client("ro", false, false);
    let r = ro
        .cmd(proto::CMD_WRITE, 0, 0, BIG, &vec![9; BIG as usize])
        .unwrap();
    assert_eq!(r.error, 1, "EPERM: the read-only check comes first");

    // Half a large payload, then gone: nothing of it lands.
    let mut gone = srv.client("disk1", false, false);
    gone.s
        .write_all(&req(8, proto::CMD_WRITE, 0, BIG).encode())
        .unwrap();
    gone.s.write_all(&vec![8; BIG as usize / 2]).unwrap();
    drop(gone);
    let mut c2 = srv.client("disk1", false, false);
    let r = c2.cmd(proto::CMD_READ, 0, 0, 4096, &[]).unwrap();
    assert_eq!(r.data, vec![3; 4096]);
}

/// Large payloads come from one server-wide budget: a client holding it (a large
/// write whose payload stalls) makes another's large requests wait, then get ENOMEM
/// on a connection that stays usable; once the first lets go, they go through.
#[test]
fn a_full_payload_budget_answers_enomem_and_recovers() {
    let opts = ServerOptions {
        max_payload_bytes: 1 << 20,
        // Raised to one largest payload: the stalled 1 MiB write takes all of it.
        payload_budget_bytes: 0,
        payload_wait: Duration::from_millis(200),
        ..ServerOptions::default()
    };
    let srv = TestServer::start(opts);
    let mut hog = srv.client("disk1", false, false);
    let stalled = Request {
        flags: 0,
        command: proto::CMD_WRITE,
        cookie: 1,
        offset: 0,
        len: 1 << 20,
    };
    hog.send(stalled, &[9; 4096]).unwrap();
    std::thread::sleep(Duration::from_millis(100));

    let mut c = srv.client("disk1", true, false);
    let big = vec![3u8; 512 << 10];
    let r = c
        .cmd(proto::CMD_WRITE, 0, 0, big.len() as u32, &big)
        .unwrap();
    assert_eq!(r.error, 12, "ENOMEM for a large write");
    let r = c.cmd(proto::CMD_READ, 0, 0, 512 << 10, &[]).unwrap();
    assert_eq!(r.error, 12, "ENOMEM for a large read");
    // Small requests use the connection's own buffer; the stream stayed in sync
    // (the refused write's payload was skipped, not applied).
    assert_eq!(
        c.cmd(proto::CMD_WRITE, 0, 0, 4096, &[1; 4096])
            .unwrap()
            .error,
        0
    );
    let r = c.cmd(proto::CMD_READ, 0, 0, 8192, &[]).unwrap();
    assert_eq!(
        (r.error, &r.data[..4096], &r.data[4096..]),
        (0, &[1; 4096][..], &[0; 4096][..])
    );

    drop(hog); // its half-sent write is dropped, its buffer given back
    std::thread::sleep(Duration::from_millis(100));
    let r = c
        .cmd(proto::CMD_WRITE, 0, 0, big.len() as u32, &big)
        .unwrap();
    assert_eq!(r.error, 0);
    let r = c.cmd(proto::CMD_READ, 0, 0, 512 << 10, &[]).unwrap();
    assert_eq!((r.error, r.data == big), (0, true));
}

/// Many connections with large writes and reads in flight on a budget that holds one
/// landing at a time: every request waits its turn and succeeds.
#[test]
fn large_requests_on_many_connections_share_a_small_budget() {
    let opts = ServerOptions {
        max_payload_bytes: 1 << 20,
        payload_budget_bytes: 1 << 20,
        payload_wait: Duration::from_secs(60),
        ..ServerOptions::default()
    };
    let srv = TestServer::start(opts);
    const REGION: u64 = 256 << 10;
    let threads: Vec<_> = (0..4u8)
        .map(|t| {
            let mut c = srv.client("disk1", t % 2 == 0, false);
            std::thread::spawn(move || {
                let at = u64::from(t) * REGION;
                for round in 0..20u8 {
                    let data = vec![t.wrapping_mul(31).wrapping_add(round); REGION as usize];
                    let r = c
                        .cmd(proto::CMD_WRITE, 0, at, REGION as u32, &data)
                        .unwrap();
                    assert_eq!(r.error, 0);
                    // A whole-disk read: a large payload, the other regions racing.
                    let r = c.cmd(proto::CMD_READ, 0, 0, 1 << 20, &[]).unwrap();
                    assert_eq!(r.error, 0);
                    assert!(r.data[at as usize..(at + REGION) as usize] == data[..]);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

/// A client that stalls in the middle of a request (half a payload, half a header) is
/// disconnected after the stall timeout, nothing of the request applied; one that
/// waits between requests stays.
#[test]
fn a_client_stalled_mid_request_is_cut_off_an_idle_one_is_not() {
    let opts = ServerOptions {
        stall_timeout: Duration::from_millis(300),
        ..ServerOptions::default()
    };
    let srv = TestServer::start(opts);
    let mut idle = srv.client("disk1", false, false);
    for big in [false, true] {
        let mut c = srv.client("disk1", false, false);
        let len = if big { 512 << 10 } else { 8192 };
        let write = Request {
            flags: 0,
            command: proto::CMD_WRITE,
            cookie: 1,
            offset: 0,
            len,
        };
        c.send(write, &[7; 4096]).unwrap();
        let started = std::time::Instant::now();
        assert!(closed(&mut c.s), "cut off");
        assert!(started.elapsed() < Duration::from_secs(4));
    }
    let mut c = srv.client("disk1", false, false);
    c.s.write_all(
        &Request::encode(&Request {
            flags: 0,
            command: proto::CMD_READ,
            cookie: 1,
            offset: 0,
            len: 8,
        })[..10],
    )
    .unwrap();
    assert!(closed(&mut c.s), "half a header: cut off");
    std::thread::sleep(Duration::from_millis(600));
    let r = idle.cmd(proto::CMD_READ, 0, 0, 8, &[]).unwrap();
    assert_eq!(
        (r.error, r.data),
        (0, vec![0; 8]),
        "nothing applied; the idle client stays"
    );
}

/// A connection whose last request was a large write (landed on its second thread)
/// is idle like any other, and makes way for a newcomer.
#[test]
fn a_connection_idle_after_a_large_write_makes_way() {
    let idle = Duration::from_millis(50);
    let srv = evicting_server(1, idle);
    let mut a = srv.client("disk1", false, false);
    let big = vec![1u8; 256 << 10];
    let r = a
        .cmd(proto::CMD_WRITE, 0, 0, big.len() as u32, &big)
        .unwrap();
    assert_eq!(r.error, 0);
    std::thread::sleep(6 * idle);
    let mut b = srv.client("disk1", false, false);
    assert!(closed(&mut a.s), "the idle connection made way");
    let r = b.cmd(proto::CMD_READ, 0, 0, 4, &[]).unwrap();
    assert_eq!(r.data, [1; 4], "its write landed");
}

/// The join rule holds whatever buffer a landing is given: a kept buffer larger than
/// asked does not let a stream's first landing take more than its own write.
#[test]
fn a_kept_larger_buffer_does_not_widen_a_landing() {
    const MIB: usize = 1 << 20;
    const TAIL: usize = 100;
    let srv = server();
    let disk = srv.exports.add("big", 8 * MIB as u64, false);
    // One 4 MiB write: its buffer (4 MiB and a page) is kept for reuse.
    let mut c = srv.client("big", false, false);
    let r = c
        .cmd(
            proto::CMD_WRITE,
            0,
            4 * MIB as u64,
            4 * MIB as u32,
            &vec![7u8; 4 * MIB],
        )
        .unwrap();
    assert_eq!(r.error, 0);
    assert_eq!(disk.take_largest_write(), 4 * MIB);
    drop(c);
    let write = |cookie: u64, offset: usize| Request {
        flags: 0,
        command: proto::CMD_WRITE,
        cookie,
        offset: offset as u64,
        len: MIB as u32,
    };
    let mut c = srv.client("big", false, false);
    let mut first = write(1, 0).encode().to_vec();
    first.extend_from_slice(&vec![1u8; MIB - TAIL]);
    c.s.write_all(&first).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let mut rest = vec![1u8; TAIL];
    rest.extend_from_slice(&write(2, MIB).encode());
    rest.extend_from_slice(&vec![2u8; MIB]);
    c.s.write_all(&rest).unwrap();
    let cookies: Vec<u64> = (0..2).map(|_| c.recv(0).unwrap().cookie).collect();
    assert_eq!(cookies, [1, 2]);
    assert_eq!(
        disk.take_largest_write(),
        MIB,
        "a first landing joins nothing"
    );
}

/// Holds a disk's flushes until dropped (so a failing test releases them and its
/// server can stop).
struct FlushesHeld(std::sync::Arc<super::memory::MemDisk>);

impl FlushesHeld {
    fn new(disk: &std::sync::Arc<super::memory::MemDisk>) -> FlushesHeld {
        disk.hold_flushes(true);
        FlushesHeld(std::sync::Arc::clone(disk))
    }
}

impl Drop for FlushesHeld {
    fn drop(&mut self) {
        self.0.hold_flushes(false);
    }
}

fn request(command: u16, cookie: u64, offset: u64, len: u32) -> Request {
    Request {
        flags: 0,
        command,
        cookie,
        offset,
        len,
    }
}

/// A flush syncs on the connection's flush thread: the requests a client sends
/// behind it are read, applied and answered while it waits for the disk (a read
/// among them sees the write before it), and it is answered once its sync is done.
#[test]
fn the_requests_behind_a_flush_are_answered_while_it_syncs() {
    let srv = server();
    let disk = srv.exports.get("disk1").unwrap();
    let held = FlushesHeld::new(&disk);
    let mut c = srv.client("disk1", true, false);
    c.s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.send(request(proto::CMD_WRITE, 1, 0, 4096), &[1; 4096])
        .unwrap();
    c.send(request(proto::CMD_FLUSH, 2, 0, 0), &[]).unwrap();
    c.send(request(proto::CMD_WRITE, 3, 4096, 4096), &[3; 4096])
        .unwrap();
    c.send(request(proto::CMD_READ, 4, 4096, 4096), &[])
        .unwrap();
    for cookie in [1, 3, 4] {
        let r = c.recv(4096).unwrap();
        assert_eq!(
            (r.cookie, r.error),
            (cookie, 0),
            "answered before the flush"
        );
        if cookie == 4 {
            assert_eq!(r.data, vec![3; 4096], "the read sees the write before it");
        }
    }
    assert_eq!(disk.flushes_done(), 0);
    drop(held);
    let r = c.recv(0).unwrap();
    assert_eq!((r.cookie, r.error), (2, 0));
    assert_eq!(disk.flushes_done(), 1);
}

/// Flushes sent one after another while a sync is held are all answered once it
/// is released, and a client that says goodbye with a flush still syncing is
/// answered before the connection closes.
#[test]
fn flushes_queued_behind_a_sync_and_at_goodbye_are_answered() {
    let srv = server();
    let disk = srv.exports.get("disk1").unwrap();
    let held = FlushesHeld::new(&disk);
    let mut c = srv.client("disk1", false, false);
    c.s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    for cookie in 1..=3 {
        c.send(request(proto::CMD_FLUSH, cookie, 0, 0), &[])
            .unwrap();
    }
    c.send(request(proto::CMD_DISC, 9, 0, 0), &[]).unwrap();
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        drop(held);
    });
    let mut answered: Vec<u64> = (0..3)
        .map(|_| {
            let r = c.recv(0).unwrap();
            assert_eq!(r.error, 0);
            r.cookie
        })
        .collect();
    answered.sort_unstable();
    assert_eq!(answered, [1, 2, 3]);
    assert!(closed(&mut c.s));
    release.join().unwrap();
    assert!((1..=3).contains(&disk.flushes_done()));
}
