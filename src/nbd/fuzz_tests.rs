//! Property tests: random byte streams, and random prefixes of a valid
//! session followed by garbage, never panic the server, and a fresh valid
//! client is served correctly afterwards.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use proptest::prelude::*;

use super::proto::{self, Request};
use super::test_client::TestServer;
use super::ServerOptions;

/// The bytes a well-behaved client sends: flags, structured replies, meta
/// context, GO, then a write, a read and a block-status request.
fn valid_session() -> Vec<u8> {
    let mut b = 3u32.to_be_bytes().to_vec();
    let mut opt = |option: u32, data: &[u8]| {
        let len = data.len() as u32;
        b.extend_from_slice(&proto::OptionHeader { option, len }.encode());
        b.extend_from_slice(data);
    };
    opt(proto::OPT_STRUCTURED_REPLY, &[]);
    let meta = proto::MetaRequest {
        export: "disk1".into(),
        queries: vec![proto::BASE_ALLOCATION.into()],
    };
    opt(proto::OPT_SET_META_CONTEXT, &meta.encode());
    let go = proto::InfoRequest {
        name: "disk1".into(),
        infos: vec![proto::INFO_BLOCK_SIZE],
    };
    opt(proto::OPT_GO, &go.encode());
    for (command, len) in [
        (proto::CMD_WRITE, 16u32),
        (proto::CMD_READ, 16),
        (proto::CMD_BLOCK_STATUS, 8192),
    ] {
        let req = Request {
            flags: 0,
            command,
            cookie: 1,
            offset: 0,
            len,
        };
        b.extend_from_slice(&req.encode());
        if command == proto::CMD_WRITE {
            b.extend_from_slice(&[0x5a; 16]);
        }
    }
    b
}

/// Sends `bytes`, closes the write side, and drains whatever the server says
/// until it closes (bounded by a timeout).
fn throw_at(srv: &TestServer, bytes: &[u8]) {
    let mut s = UnixStream::connect(&srv.path).expect("server must still accept");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // The server may close early (bad magic); later writes then fail, which is fine.
    let _ = s.write_all(bytes);
    let _ = s.shutdown(Shutdown::Write);
    let _ = s.read_to_end(&mut Vec::new());
}

/// A fresh client still gets correct service.
fn check_alive(srv: &TestServer) {
    let mut c = srv.client("odd", true, true);
    let r = c.cmd(proto::CMD_WRITE, 0, 100, 3, &[1, 2, 3]).unwrap();
    assert_eq!(r.error, 0);
    let r = c.cmd(proto::CMD_READ, 0, 100, 3, &[]).unwrap();
    assert_eq!(r.data, [1, 2, 3]);
    let panics = super::test_client::CONN_PANICS.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(panics, 0, "a connection thread panicked");
}

fn fuzz_server() -> TestServer {
    TestServer::start(ServerOptions {
        handshake_timeout: Duration::from_secs(2),
        max_payload_bytes: 1 << 20,
        ..ServerOptions::default()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_break_the_server(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let srv = fuzz_server();
        throw_at(&srv, &bytes);
        check_alive(&srv);
    }

    #[test]
    fn valid_prefix_then_garbage(cut in 0usize..400, garbage in proptest::collection::vec(any::<u8>(), 0..512)) {
        let srv = fuzz_server();
        let mut bytes = valid_session();
        bytes.truncate(cut.min(bytes.len()));
        bytes.extend_from_slice(&garbage);
        throw_at(&srv, &bytes);
        check_alive(&srv);
    }

    /// Garbage that still frames correctly as option requests exercises the
    /// option parsers rather than just the magic check.
    #[test]
    fn well_framed_random_options(opts in proptest::collection::vec((1u32..14, proptest::collection::vec(any::<u8>(), 0..64)), 1..8)) {
        let srv = fuzz_server();
        let mut bytes = 3u32.to_be_bytes().to_vec();
        for (option, data) in &opts {
            let len = data.len() as u32;
            bytes.extend_from_slice(&proto::OptionHeader { option: *option, len }.encode());
            bytes.extend_from_slice(data);
        }
        throw_at(&srv, &bytes);
        check_alive(&srv);
    }

    /// Random well-framed requests after a valid GO.
    #[test]
    fn well_framed_random_requests(reqs in proptest::collection::vec((any::<u16>(), 0u16..10, any::<u64>(), 0u32..70000), 1..16)) {
        let srv = fuzz_server();
        let mut bytes = valid_session();
        for (flags, command, offset, len) in reqs {
            let offset = if offset % 2 == 0 { offset % (1 << 21) } else { offset };
            let req = Request { flags, command, cookie: 9, offset, len };
            bytes.extend_from_slice(&req.encode());
            if command == proto::CMD_WRITE {
                bytes.resize(bytes.len() + len as usize, 0x11);
            }
        }
        throw_at(&srv, &bytes);
        check_alive(&srv);
    }
}

#[test]
fn valid_session_is_valid() {
    let srv = fuzz_server();
    throw_at(&srv, &valid_session());
    let disk = srv.exports.get("disk1").unwrap();
    assert_eq!(&disk.contents()[..16], &[0x5a; 16]);
    check_alive(&srv);
}
