//! A minimal NBD client for unit tests, built on the `proto` codecs.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use super::proto::{self, ChunkHeader, OptionHeader, OptionReplyHeader, Request, SimpleReply};

/// A connected test client.
pub(crate) struct Client {
    pub s: UnixStream,
    pub structured: bool,
}

/// A decoded reply to one request.
#[derive(Debug, Default)]
pub(crate) struct Reply {
    pub cookie: u64,
    /// 0 on success.
    pub error: u32,
    /// Read data (simple replies or OFFSET_DATA chunks).
    pub data: Vec<u8>,
    /// Raw structured chunks: (type, payload).
    pub chunks: Vec<(u16, Vec<u8>)>,
}

impl Client {
    /// Connects and completes the greeting (client flags FIXED_NEWSTYLE|NO_ZEROES).
    pub fn connect(path: &Path) -> io::Result<Client> {
        let mut s = UnixStream::connect(path)?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        let g: [u8; proto::GREETING_LEN] = proto::read_array(&mut s)?;
        proto::decode_greeting(&g).ok_or(io::ErrorKind::InvalidData)?;
        s.write_all(&3u32.to_be_bytes())?;
        Ok(Client {
            s,
            structured: false,
        })
    }

    /// Sends an option and collects replies up to ACK or an error reply.
    pub fn opt(&mut self, option: u32, data: &[u8]) -> io::Result<Vec<(u32, Vec<u8>)>> {
        let len = data.len() as u32;
        self.s.write_all(&OptionHeader { option, len }.encode())?;
        self.s.write_all(data)?;
        let mut out = Vec::new();
        loop {
            let h: [u8; proto::OPTION_REPLY_HEADER_LEN] = proto::read_array(&mut self.s)?;
            let h = OptionReplyHeader::decode(&h).ok_or(io::ErrorKind::InvalidData)?;
            let mut d = vec![0; h.len as usize];
            self.s.read_exact(&mut d)?;
            let last = h.reply_type == proto::REP_ACK || h.reply_type & (1 << 31) != 0;
            out.push((h.reply_type, d));
            if last {
                return Ok(out);
            }
        }
    }

    /// Negotiates optionally structured replies and base:allocation, then GO.
    /// Returns the export size and transmission flags.
    pub fn go(&mut self, name: &str, structured: bool, meta: bool) -> io::Result<(u64, u16)> {
        if structured {
            self.opt(proto::OPT_STRUCTURED_REPLY, &[])?;
            self.structured = true;
        }
        if meta {
            let q = proto::MetaRequest {
                export: name.into(),
                queries: vec![proto::BASE_ALLOCATION.into()],
            };
            self.opt(proto::OPT_SET_META_CONTEXT, &q.encode())?;
        }
        let req = proto::InfoRequest {
            name: name.into(),
            infos: vec![proto::INFO_BLOCK_SIZE],
        };
        let replies = self.opt(proto::OPT_GO, &req.encode())?;
        for (t, d) in &replies {
            if *t == proto::REP_INFO {
                if let Some(proto::Info::Export { size, flags }) = proto::Info::decode(d) {
                    return Ok((size, flags));
                }
            }
        }
        Err(io::Error::other(format!("GO failed: {replies:?}")))
    }

    /// Sends one request (and payload).
    pub fn send(&mut self, req: Request, payload: &[u8]) -> io::Result<()> {
        let mut b = req.encode().to_vec();
        b.extend_from_slice(payload);
        self.s.write_all(&b)
    }

    /// Reads one reply; `read_len` is the data length a simple read reply carries.
    pub fn recv(&mut self, read_len: usize) -> io::Result<Reply> {
        let magic: [u8; 4] = proto::read_array(&mut self.s)?;
        let mut rep = Reply::default();
        if u32::from_be_bytes(magic) == proto::SIMPLE_REPLY_MAGIC {
            let mut b = [0u8; proto::SIMPLE_REPLY_LEN];
            b[..4].copy_from_slice(&magic);
            self.s.read_exact(&mut b[4..])?;
            let r = SimpleReply::decode(&b).ok_or(io::ErrorKind::InvalidData)?;
            (rep.cookie, rep.error) = (r.cookie, r.error);
            if r.error == 0 {
                rep.data = vec![0; read_len];
                self.s.read_exact(&mut rep.data)?;
            }
            return Ok(rep);
        }
        let mut magic = Some(magic);
        loop {
            let mut b = [0u8; proto::CHUNK_HEADER_LEN];
            match magic.take() {
                Some(m) => {
                    b[..4].copy_from_slice(&m);
                    self.s.read_exact(&mut b[4..])?;
                }
                None => self.s.read_exact(&mut b)?,
            }
            let h = ChunkHeader::decode(&b).ok_or(io::ErrorKind::InvalidData)?;
            let mut p = vec![0; h.len as usize];
            self.s.read_exact(&mut p)?;
            rep.cookie = h.cookie;
            match h.chunk_type {
                proto::REPLY_TYPE_OFFSET_DATA => rep.data.extend_from_slice(&p[8..]),
                proto::REPLY_TYPE_ERROR => {
                    rep.error = proto::decode_error_payload(&p).map_or(u32::MAX, |e| e.0)
                }
                _ => {}
            }
            rep.chunks.push((h.chunk_type, p));
            if h.flags & proto::REPLY_FLAG_DONE != 0 {
                return Ok(rep);
            }
        }
    }

    /// Sends one request and reads its reply.
    pub fn cmd(
        &mut self,
        command: u16,
        flags: u16,
        offset: u64,
        len: u32,
        payload: &[u8],
    ) -> io::Result<Reply> {
        let req = Request {
            flags,
            command,
            cookie: 42,
            offset,
            len,
        };
        self.send(req, payload)?;
        let read_len = if command == proto::CMD_READ { len } else { 0 };
        self.recv(read_len as usize)
    }
}

/// A server on a temporary Unix socket serving [`MemExports`], shut down on drop.
pub(super) struct TestServer {
    pub path: std::path::PathBuf,
    pub exports: std::sync::Arc<super::memory::MemExports>,
    pub handle: super::ShutdownHandle,
    thread: Option<std::thread::JoinHandle<io::Result<()>>>,
    _dir: tempfile::TempDir,
}

/// Panics seen on connection threads (named "nbd-conn-*") in this process.
pub(super) static CONN_PANICS: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// Counts connection-thread panics, which the server otherwise swallows.
fn install_panic_counter() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let name = std::thread::current().name().unwrap_or("").to_owned();
            if name.starts_with("nbd-conn-") {
                CONN_PANICS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            default(info);
        }));
    });
}

impl TestServer {
    /// Serves "disk1" (1 MiB), "ro" (64 KiB, read-only) and "odd" (10000 bytes).
    pub fn start(opts: super::ServerOptions) -> TestServer {
        install_panic_counter();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nbd.sock");
        let exports = std::sync::Arc::new(super::memory::MemExports::new());
        exports.add("disk1", 1 << 20, false);
        exports.add("ro", 64 << 10, true);
        exports.add("odd", 10000, false);
        let server = super::Server::bind(&super::Listen::Unix(path.clone()), opts).unwrap();
        let handle = server.shutdown_handle();
        let ex: std::sync::Arc<dyn super::Exports> = exports.clone();
        let thread = std::thread::spawn(move || server.run(ex));
        TestServer {
            path,
            exports,
            handle,
            thread: Some(thread),
            _dir: dir,
        }
    }

    /// A client that has done GO on `name`.
    pub fn client(&self, name: &str, structured: bool, meta: bool) -> Client {
        let mut c = Client::connect(&self.path).unwrap();
        c.go(name, structured, meta).unwrap();
        c
    }

    /// Shuts down and waits for `run` to return.
    pub fn stop(&mut self) -> io::Result<()> {
        self.handle.shutdown();
        match self.thread.take() {
            Some(t) => t.join().unwrap(),
            None => Ok(()),
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}
