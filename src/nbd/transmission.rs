//! The transmission phase: requests are read and answered strictly in order
//! on one thread.
//!
//! Replies go into a `BufWriter` that is flushed only when the reader holds
//! no further complete request, so pipelined requests are answered in
//! batches while a lone request is answered at once. A write's payload is
//! read completely before anything is applied, so a client vanishing
//! mid-payload changes nothing.

use std::io::{self, BufReader, BufWriter, Read, Write};

use super::handshake::Session;
use super::proto::{self, ChunkHeader, Descriptor, Request, SimpleReply};
use super::stream::Stream;
use super::{Errno, ExportError, ZeroFlags};

/// Most extents asked of the export per NBD_CMD_BLOCK_STATUS.
const MAX_EXTENTS: usize = 1024;

/// Most writes, and payload bytes, applied as one batch (`Export::write_batch`).
const MAX_BATCH_WRITES: usize = 256;
const MAX_BATCH_BYTES: usize = 8 << 20;

/// Serves requests until the client disconnects (NBD_CMD_DISC or EOF) or
/// breaks the protocol. Errors only say why the connection ended.
pub(super) fn serve<W: Write>(
    r: &mut BufReader<Stream>,
    w: &mut BufWriter<W>,
    session: Session,
    max_payload: u32,
) -> io::Result<()> {
    let mut conn = Conn {
        s: session,
        max_payload,
        buf: Vec::new(),
        batch: Vec::new(),
    };
    let result = conn.run(r, w);
    // Replies already produced are owed to the client even if it then broke off.
    let flushed = w.flush();
    result.and(flushed)
}

/// Successful outcome of a command, before encoding.
enum Reply {
    /// No data (writes, flush, trim, ...).
    Empty,
    /// A read: the data is `Conn::buf`.
    Data,
    /// Block status descriptors for `base:allocation`.
    BlockStatus(Vec<Descriptor>),
}

struct Conn {
    s: Session,
    max_payload: u32,
    /// Reused payload buffer; its length never exceeds `max_payload`.
    buf: Vec<u8>,
    /// Reused buffer of a batch of writes' payloads, back to back; at most
    /// `MAX_BATCH_BYTES` plus one payload.
    batch: Vec<u8>,
}

impl Conn {
    fn run<W: Write>(&mut self, r: &mut BufReader<Stream>, w: &mut W) -> io::Result<()> {
        loop {
            if !complete_request_buffered(r.buffer()) {
                w.flush()?;
                // The client has all our answers; its next request is the wait.
                r.get_mut().poll_next_read();
            }
            let header: [u8; proto::REQUEST_LEN] = match proto::read_array(r) {
                Ok(h) => h,
                // EOF between requests: the client left (or we shut down reads).
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            };
            let req = Request::decode(&header).ok_or_else(|| invalid("bad request magic"))?;
            let result = match req.command {
                proto::CMD_DISC => return Ok(()),
                proto::CMD_WRITE => match self.read_payload(r, req)? {
                    Ok(()) if write_buffered(r.buffer(), self.max_payload) => {
                        self.write_batch(r, w, req)?;
                        continue;
                    }
                    Ok(()) => self.write(req),
                    Err(e) => Err(e),
                },
                _ => self.command(req),
            };
            self.reply(w, req, result)?;
        }
    }

    /// Reads a write's payload into `buf`. An oversized payload is skipped
    /// (answered EINVAL) if it is small enough to be worth skipping; beyond
    /// that the stream is presumed garbage and the connection closes.
    fn read_payload<R: Read>(
        &mut self,
        r: &mut R,
        req: Request,
    ) -> io::Result<Result<(), ExportError>> {
        if req.len > self.max_payload {
            let skip_limit = u64::from(self.max_payload).saturating_mul(2).max(64 << 20);
            if u64::from(req.len) > skip_limit {
                return Err(invalid("write payload too large"));
            }
            proto::skip(r, u64::from(req.len))?;
            return Ok(Err(ExportError::inval("write larger than maximum payload")));
        }
        self.buf.resize(req.len as usize, 0);
        r.read_exact(&mut self.buf)?;
        Ok(Ok(()))
    }

    /// Applies the write in `buf` with the writes right behind it that are already
    /// buffered (whole, each within `max_payload`) as one batch, then answers each.
    /// Reads nothing beyond what is buffered, so it never waits on the client.
    fn write_batch<R: Read, W: Write>(
        &mut self,
        r: &mut BufReader<R>,
        w: &mut W,
        first: Request,
    ) -> io::Result<()> {
        self.batch.clear();
        self.batch.extend_from_slice(&self.buf);
        let mut reqs = vec![first];
        while reqs.len() < MAX_BATCH_WRITES
            && self.batch.len() < MAX_BATCH_BYTES
            && write_buffered(r.buffer(), self.max_payload)
        {
            let header: [u8; proto::REQUEST_LEN] = proto::read_array(r)?;
            let req = Request::decode(&header).ok_or_else(|| invalid("bad request magic"))?;
            let at = self.batch.len();
            self.batch.resize(at + req.len as usize, 0);
            r.read_exact(&mut self.batch[at..])?;
            reqs.push(req);
        }
        // Each request is checked on its own; the valid ones go to the export.
        let checks: Vec<Result<(), ExportError>> = reqs
            .iter()
            .map(|&req| self.check(req, Errno::NoSpc, true))
            .collect();
        let mut writes = Vec::with_capacity(reqs.len());
        let mut fua = false;
        let mut at = 0;
        for (req, check) in reqs.iter().zip(&checks) {
            let data = &self.batch[at..at + req.len as usize];
            at += req.len as usize;
            if check.is_ok() && req.len > 0 {
                writes.push((req.offset, data));
                fua |= req.flags & proto::CMD_FLAG_FUA != 0;
            }
        }
        let applied = if writes.is_empty() {
            Ok(())
        } else {
            self.s.export.write_batch(&writes, fua)
        };
        for (req, check) in reqs.into_iter().zip(checks) {
            let result = check.and_then(|()| applied.clone()).map(|()| Reply::Empty);
            self.reply(w, req, result)?;
        }
        Ok(())
    }

    fn write(&mut self, req: Request) -> Result<Reply, ExportError> {
        self.check(req, Errno::NoSpc, true)?;
        if req.len > 0 {
            let fua = req.flags & proto::CMD_FLAG_FUA != 0;
            self.s.export.write(req.offset, &self.buf, fua)?;
        }
        Ok(Reply::Empty)
    }

    /// Every command but WRITE and DISC (which carry or end the stream).
    fn command(&mut self, req: Request) -> Result<Reply, ExportError> {
        let fua = req.flags & proto::CMD_FLAG_FUA != 0;
        let len = u64::from(req.len);
        match req.command {
            proto::CMD_READ => self.read(req),
            proto::CMD_FLUSH => {
                check_flags(req)?;
                self.s.export.flush().map(|()| Reply::Empty)
            }
            proto::CMD_TRIM => {
                self.check(req, Errno::Inval, true)?;
                if len > 0 {
                    self.s.export.trim(req.offset, len, fua)?;
                }
                Ok(Reply::Empty)
            }
            proto::CMD_CACHE => self.check(req, Errno::Inval, false).map(|()| Reply::Empty),
            proto::CMD_WRITE_ZEROES => {
                self.check(req, Errno::NoSpc, true)?;
                let flags = ZeroFlags {
                    fua,
                    no_hole: req.flags & proto::CMD_FLAG_NO_HOLE != 0,
                    fast_zero: req.flags & proto::CMD_FLAG_FAST_ZERO != 0,
                };
                if len > 0 {
                    self.s.export.write_zeroes(req.offset, len, flags)?;
                }
                Ok(Reply::Empty)
            }
            proto::CMD_BLOCK_STATUS => self.block_status(req),
            _ => Err(ExportError::inval("unknown command")),
        }
    }

    /// Flags, then read-only (if `writes`), then range; `past_end` is the
    /// errno for a range beyond the export.
    fn check(&self, req: Request, past_end: Errno, writes: bool) -> Result<(), ExportError> {
        check_flags(req)?;
        if writes && self.s.export.read_only() {
            return Err(ExportError::perm("export is read-only"));
        }
        let end = req.offset.checked_add(u64::from(req.len));
        match end {
            Some(end) if end <= self.s.export.size() => Ok(()),
            _ => Err(ExportError::new(past_end, "range beyond end of export")),
        }
    }

    fn read(&mut self, req: Request) -> Result<Reply, ExportError> {
        // The structured OFFSET_DATA length (8 + len) must fit in a u32.
        if req.len > self.max_payload || req.len > u32::MAX - 8 {
            return Err(ExportError::inval("read larger than maximum payload"));
        }
        self.check(req, Errno::Inval, false)?;
        self.buf.resize(req.len as usize, 0);
        if req.len > 0 {
            self.s.export.read(req.offset, &mut self.buf)?;
        }
        Ok(Reply::Data)
    }

    fn block_status(&mut self, req: Request) -> Result<Reply, ExportError> {
        check_flags(req)?;
        if !self.s.base_allocation {
            return Err(ExportError::inval("base:allocation not negotiated"));
        }
        let size = self.s.export.size();
        if req.len == 0 || req.offset >= size {
            return Err(ExportError::inval("block status range empty or beyond end"));
        }
        // Capped to the export end, as clients may ask past it.
        let len = u64::from(req.len).min(size - req.offset);
        let max = if req.flags & proto::CMD_FLAG_REQ_ONE != 0 {
            1
        } else {
            MAX_EXTENTS
        };
        let extents = self.s.export.block_status(req.offset, len, max)?;
        let descs = proto::extents_to_descriptors(&extents, len, max);
        if descs.is_empty() {
            return Err(ExportError::io("export reported no extents"));
        }
        Ok(Reply::BlockStatus(descs))
    }

    fn reply<W: Write>(
        &self,
        w: &mut W,
        req: Request,
        result: Result<Reply, ExportError>,
    ) -> io::Result<()> {
        if self.s.structured {
            return self.structured_reply(w, req, result);
        }
        let error = match &result {
            Ok(_) => 0,
            Err(e) => e.errno.code(),
        };
        let cookie = req.cookie;
        w.write_all(&SimpleReply { error, cookie }.encode())?;
        if let Ok(Reply::Data) = result {
            w.write_all(&self.buf)?;
        }
        Ok(())
    }

    fn structured_reply<W: Write>(
        &self,
        w: &mut W,
        req: Request,
        result: Result<Reply, ExportError>,
    ) -> io::Result<()> {
        let (chunk_type, payload): (u16, Vec<u8>) = match result {
            Ok(Reply::Data) if !self.buf.is_empty() => {
                // Written in place to avoid copying the data.
                let h = chunk(req, proto::REPLY_TYPE_OFFSET_DATA, 8 + self.buf.len());
                w.write_all(&h.encode())?;
                w.write_all(&req.offset.to_be_bytes())?;
                return w.write_all(&self.buf);
            }
            Ok(Reply::Data | Reply::Empty) => (proto::REPLY_TYPE_NONE, Vec::new()),
            Ok(Reply::BlockStatus(d)) => (
                proto::REPLY_TYPE_BLOCK_STATUS,
                proto::encode_block_status(proto::BASE_ALLOCATION_ID, &d),
            ),
            Err(e) => (
                proto::REPLY_TYPE_ERROR,
                proto::encode_error_payload(e.errno.code(), &e.message),
            ),
        };
        w.write_all(&chunk(req, chunk_type, payload.len()).encode())?;
        w.write_all(&payload)
    }
}

/// A final (DONE) chunk header; `len` is bounded by the callers (payload
/// ≤ u32::MAX - 8, descriptors ≤ 1024, messages ≤ 4096).
fn chunk(req: Request, chunk_type: u16, len: usize) -> ChunkHeader {
    ChunkHeader {
        flags: proto::REPLY_FLAG_DONE,
        chunk_type,
        cookie: req.cookie,
        len: u32::try_from(len).unwrap_or(u32::MAX),
    }
}

/// EINVAL for flags the spec does not define for the command.
fn check_flags(req: Request) -> Result<(), ExportError> {
    let allowed = proto::CMD_FLAG_FUA
        | match req.command {
            proto::CMD_READ => proto::CMD_FLAG_DF,
            proto::CMD_WRITE_ZEROES => proto::CMD_FLAG_NO_HOLE | proto::CMD_FLAG_FAST_ZERO,
            proto::CMD_BLOCK_STATUS => proto::CMD_FLAG_REQ_ONE,
            _ => 0,
        };
    if req.flags & !allowed != 0 {
        return Err(ExportError::inval("flag not valid for this command"));
    }
    Ok(())
}

/// Whether `buf` starts with a whole write request whose payload the server
/// accepts, so that it can join a batch.
fn write_buffered(buf: &[u8], max_payload: u32) -> bool {
    match Request::decode(buf) {
        Some(req) if req.command == proto::CMD_WRITE && req.len <= max_payload => {
            buf.len() >= proto::REQUEST_LEN + req.len as usize
        }
        _ => false,
    }
}

/// Whether `buf` starts with a whole request (header and any payload), so a
/// flush can wait until it has been answered too.
fn complete_request_buffered(buf: &[u8]) -> bool {
    match Request::decode(buf) {
        Some(req) => buf.len() >= proto::REQUEST_LEN + req.payload_len() as usize,
        None => false,
    }
}

fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_owned())
}
