//! NBD wire format: constants, and pure encode/decode functions for the
//! handshake, options, requests and replies (simple and structured).
//!
//! Every decoder takes untrusted bytes and returns `None`/an error on
//! malformed input; none of them can panic. All integers are big-endian.

use std::io::{self, Read, Write};

use super::Extent;

/// "NBDMAGIC": first 8 bytes the server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// "IHAVEOPT": newstyle negotiation; also prefixes every option request.
pub const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
/// Prefix of every option reply.
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Prefix of every transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Prefix of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Prefix of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flag: fixed newstyle.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1;
/// Handshake flag: no 124 zero bytes after NBD_OPT_EXPORT_NAME.
pub const FLAG_NO_ZEROES: u16 = 2;
/// Client flags the server understands; any other bit closes the connection.
pub const CLIENT_FLAGS_KNOWN: u32 = (FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES) as u32;

/// Option codes.
pub const OPT_EXPORT_NAME: u32 = 1;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const OPT_ABORT: u32 = 2;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const OPT_LIST: u32 = 3;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const OPT_STARTTLS: u32 = 5;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const OPT_INFO: u32 = 6;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const OPT_GO: u32 = 7;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const OPT_STRUCTURED_REPLY: u32 = 8;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const OPT_LIST_META_CONTEXT: u32 = 9;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const OPT_SET_META_CONTEXT: u32 = 10;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const OPT_EXTENDED_HEADERS: u32 = 11;

/// Option reply types; errors have bit 31 set.
pub const REP_ACK: u32 = 1;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const REP_SERVER: u32 = 2;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const REP_INFO: u32 = 3;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const REP_META_CONTEXT: u32 = 4;
const REP_ERR: u32 = 1 << 31;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const REP_ERR_UNSUP: u32 = REP_ERR | 1;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const REP_ERR_POLICY: u32 = REP_ERR | 2;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const REP_ERR_INVALID: u32 = REP_ERR | 3;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const REP_ERR_PLATFORM: u32 = REP_ERR | 4;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const REP_ERR_TLS_REQD: u32 = REP_ERR | 5;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const REP_ERR_UNKNOWN: u32 = REP_ERR | 6;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const REP_ERR_SHUTDOWN: u32 = REP_ERR | 7;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const REP_ERR_TOO_BIG: u32 = REP_ERR | 9;

/// NBD_INFO types inside NBD_REP_INFO.
pub const INFO_EXPORT: u16 = 0;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const INFO_NAME: u16 = 1;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const INFO_DESCRIPTION: u16 = 2;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const INFO_BLOCK_SIZE: u16 = 3;

/// Transmission flags.
pub const TFLAG_HAS_FLAGS: u16 = 1;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const TFLAG_READ_ONLY: u16 = 2;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const TFLAG_SEND_FLUSH: u16 = 4;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const TFLAG_SEND_FUA: u16 = 8;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const TFLAG_SEND_TRIM: u16 = 32;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const TFLAG_SEND_WRITE_ZEROES: u16 = 64;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const TFLAG_SEND_DF: u16 = 128;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const TFLAG_CAN_MULTI_CONN: u16 = 256;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const TFLAG_SEND_FAST_ZERO: u16 = 2048;

/// Command types.
pub const CMD_READ: u16 = 0;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const CMD_WRITE: u16 = 1;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const CMD_DISC: u16 = 2;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const CMD_FLUSH: u16 = 3;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const CMD_TRIM: u16 = 4;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const CMD_CACHE: u16 = 5;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const CMD_WRITE_ZEROES: u16 = 6;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const CMD_BLOCK_STATUS: u16 = 7;

/// Command flags.
pub const CMD_FLAG_FUA: u16 = 1;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const CMD_FLAG_NO_HOLE: u16 = 2;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const CMD_FLAG_DF: u16 = 4;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const CMD_FLAG_REQ_ONE: u16 = 8;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const CMD_FLAG_FAST_ZERO: u16 = 16;

/// Structured reply chunk flag: last chunk of the reply.
pub const REPLY_FLAG_DONE: u16 = 1;
/// Structured reply chunk types.
pub const REPLY_TYPE_NONE: u16 = 0;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const REPLY_TYPE_ERROR: u16 = 32769;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const REPLY_TYPE_ERROR_OFFSET: u16 = 32770;

/// `base:allocation` descriptor flags.
pub const STATE_HOLE: u32 = 1;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const STATE_ZERO: u32 = 2;

/// The only metadata context served, and the id it is given.
pub const BASE_ALLOCATION: &str = "base:allocation";
/// Context id of [`BASE_ALLOCATION`].
pub const BASE_ALLOCATION_ID: u32 = 1;

/// Largest option payload accepted, so option haggling has bounded memory.
pub const MAX_OPTION_LEN: u32 = 64 * 1024;
/// Longest string (error message) sent, per the spec's string limit.
pub const MAX_STRING_LEN: usize = 4096;

/// Sizes of the fixed-size wire structures.
pub const GREETING_LEN: usize = 18;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const OPTION_HEADER_LEN: usize = 16;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const OPTION_REPLY_HEADER_LEN: usize = 20;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const REQUEST_LEN: usize = 28;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const SIMPLE_REPLY_LEN: usize = 16;
#[allow(
    missing_docs,
    reason = "named as in the NBD spec, grouped under the doc line above"
)]
pub const CHUNK_HEADER_LEN: usize = 20;

/// Reads exactly N bytes.
pub fn read_array<R: Read, const N: usize>(r: &mut R) -> io::Result<[u8; N]> {
    let mut b = [0u8; N];
    r.read_exact(&mut b)?;
    Ok(b)
}

/// Discards exactly `len` bytes (an unusable payload) without buffering it.
pub fn skip<R: Read>(r: &mut R, len: u64) -> io::Result<()> {
    let copied = io::copy(&mut r.take(len), &mut io::sink())?;
    if copied == len {
        Ok(())
    } else {
        Err(io::ErrorKind::UnexpectedEof.into())
    }
}

/// Bounds-checked big-endian reader over an untrusted byte slice.
#[derive(Debug)]
pub struct Cursor<'a> {
    rest: &'a [u8],
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of `buf`.
    pub fn new(buf: &'a [u8]) -> Cursor<'a> {
        Cursor { rest: buf }
    }
    /// The next `n` bytes, or `None` if fewer remain.
    pub fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, tail) = self.rest.split_at_checked(n)?;
        self.rest = tail;
        Some(head)
    }
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.bytes(N)?.try_into().ok()
    }
    /// Next big-endian u16.
    pub fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_be_bytes)
    }
    /// Next big-endian u32.
    pub fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_be_bytes)
    }
    /// Next big-endian u64.
    pub fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_be_bytes)
    }
    /// A u32 length followed by that many bytes of UTF-8.
    pub fn string32(&mut self) -> Option<&'a str> {
        let len = usize::try_from(self.u32()?).ok()?;
        std::str::from_utf8(self.bytes(len)?).ok()
    }
    /// All remaining bytes.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.rest)
    }
    /// Whether everything was consumed.
    pub fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }
}

/// Appends a u32 length and the string (callers keep strings ≤ 4096 bytes).
fn put_string32(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Truncates `s` to at most `max` bytes on a char boundary.
pub fn truncate_str(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.get(..end).unwrap_or("")
}

// ---- handshake ----

/// The server's first message: NBDMAGIC, IHAVEOPT, handshake flags.
pub fn encode_greeting(flags: u16) -> [u8; GREETING_LEN] {
    let mut b = [0u8; GREETING_LEN];
    b[..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    b[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    b[16..].copy_from_slice(&flags.to_be_bytes());
    b
}

/// Handshake flags from a greeting, or `None` if the magics are wrong.
pub fn decode_greeting(b: &[u8; GREETING_LEN]) -> Option<u16> {
    let mut c = Cursor::new(b);
    (c.u64()? == NBDMAGIC && c.u64()? == IHAVEOPT).then_some(())?;
    c.u16()
}

/// Header of an option request (its data follows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionHeader {
    /// NBD_OPT_* code.
    pub option: u32,
    /// Length of the data that follows.
    pub len: u32,
}

impl OptionHeader {
    /// Wire form.
    pub fn encode(&self) -> [u8; OPTION_HEADER_LEN] {
        let mut b = [0u8; OPTION_HEADER_LEN];
        b[..8].copy_from_slice(&IHAVEOPT.to_be_bytes());
        b[8..12].copy_from_slice(&self.option.to_be_bytes());
        b[12..].copy_from_slice(&self.len.to_be_bytes());
        b
    }
    /// `None` if the magic is wrong.
    pub fn decode(b: &[u8; OPTION_HEADER_LEN]) -> Option<OptionHeader> {
        let mut c = Cursor::new(b);
        (c.u64()? == IHAVEOPT).then_some(())?;
        Some(OptionHeader {
            option: c.u32()?,
            len: c.u32()?,
        })
    }
}

/// Header of an option reply (its data follows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionReplyHeader {
    /// The option being answered.
    pub option: u32,
    /// NBD_REP_* type.
    pub reply_type: u32,
    /// Length of the data that follows.
    pub len: u32,
}

impl OptionReplyHeader {
    /// Wire form.
    pub fn encode(&self) -> [u8; OPTION_REPLY_HEADER_LEN] {
        let mut b = [0u8; OPTION_REPLY_HEADER_LEN];
        b[..8].copy_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
        b[8..12].copy_from_slice(&self.option.to_be_bytes());
        b[12..16].copy_from_slice(&self.reply_type.to_be_bytes());
        b[16..].copy_from_slice(&self.len.to_be_bytes());
        b
    }
    /// `None` if the magic is wrong.
    pub fn decode(b: &[u8; OPTION_REPLY_HEADER_LEN]) -> Option<OptionReplyHeader> {
        let mut c = Cursor::new(b);
        (c.u64()? == OPT_REPLY_MAGIC).then_some(())?;
        Some(OptionReplyHeader {
            option: c.u32()?,
            reply_type: c.u32()?,
            len: c.u32()?,
        })
    }
}

/// Writes one option reply: header plus data.
pub fn write_option_reply<W: Write>(
    w: &mut W,
    option: u32,
    reply_type: u32,
    data: &[u8],
) -> io::Result<()> {
    let len = u32::try_from(data.len()).map_err(|_| io::ErrorKind::InvalidInput)?;
    let h = OptionReplyHeader {
        option,
        reply_type,
        len,
    };
    w.write_all(&h.encode())?;
    w.write_all(data)
}

/// Data of NBD_OPT_INFO / NBD_OPT_GO.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InfoRequest {
    /// Export name ("" is the default export).
    pub name: String,
    /// NBD_INFO_* types the client asks for.
    pub infos: Vec<u16>,
}

impl InfoRequest {
    /// Wire form.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        put_string32(&mut out, &self.name);
        out.extend_from_slice(&(self.infos.len() as u16).to_be_bytes());
        for i in &self.infos {
            out.extend_from_slice(&i.to_be_bytes());
        }
        out
    }
    /// `None` if malformed (short, trailing bytes, or a non-UTF-8 name).
    pub fn decode(data: &[u8]) -> Option<InfoRequest> {
        let mut c = Cursor::new(data);
        let name = c.string32()?.to_owned();
        let count = c.u16()?;
        let infos = (0..count).map(|_| c.u16()).collect::<Option<Vec<_>>>()?;
        c.is_empty().then_some(InfoRequest { name, infos })
    }
}

/// Data of NBD_OPT_LIST_META_CONTEXT / NBD_OPT_SET_META_CONTEXT.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaRequest {
    /// Export name the contexts are for.
    pub export: String,
    /// Context queries, e.g. "base:allocation" or "base:".
    pub queries: Vec<String>,
}

impl MetaRequest {
    /// Wire form.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        put_string32(&mut out, &self.export);
        out.extend_from_slice(&(self.queries.len() as u32).to_be_bytes());
        for q in &self.queries {
            put_string32(&mut out, q);
        }
        out
    }
    /// `None` if malformed. Memory is bounded by `data.len()`: each query
    /// consumes at least 4 bytes, so a huge count fails when bytes run out.
    pub fn decode(data: &[u8]) -> Option<MetaRequest> {
        let mut c = Cursor::new(data);
        let export = c.string32()?.to_owned();
        let count = c.u32()?;
        let mut queries = Vec::new();
        for _ in 0..count {
            queries.push(c.string32()?.to_owned());
        }
        c.is_empty().then_some(MetaRequest { export, queries })
    }
}

/// One NBD_REP_INFO payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Info {
    /// NBD_INFO_EXPORT: size and transmission flags.
    Export {
        /// Export size in bytes.
        size: u64,
        /// Transmission flags.
        flags: u16,
    },
    /// NBD_INFO_NAME.
    Name(String),
    /// NBD_INFO_BLOCK_SIZE.
    BlockSize {
        /// Minimum block size.
        min: u32,
        /// Preferred block size.
        preferred: u32,
        /// Maximum payload.
        max: u32,
    },
}

impl Info {
    /// Wire form (the data of an NBD_REP_INFO reply).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Info::Export { size, flags } => {
                out.extend_from_slice(&INFO_EXPORT.to_be_bytes());
                out.extend_from_slice(&size.to_be_bytes());
                out.extend_from_slice(&flags.to_be_bytes());
            }
            Info::Name(name) => {
                out.extend_from_slice(&INFO_NAME.to_be_bytes());
                out.extend_from_slice(name.as_bytes());
            }
            Info::BlockSize {
                min,
                preferred,
                max,
            } => {
                out.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
                for v in [min, preferred, max] {
                    out.extend_from_slice(&v.to_be_bytes());
                }
            }
        }
        out
    }
    /// `None` for malformed or unknown info types.
    pub fn decode(data: &[u8]) -> Option<Info> {
        let mut c = Cursor::new(data);
        let info = match c.u16()? {
            INFO_EXPORT => Info::Export {
                size: c.u64()?,
                flags: c.u16()?,
            },
            INFO_NAME => Info::Name(String::from_utf8(c.rest().to_vec()).ok()?),
            INFO_BLOCK_SIZE => Info::BlockSize {
                min: c.u32()?,
                preferred: c.u32()?,
                max: c.u32()?,
            },
            _ => return None,
        };
        c.is_empty().then_some(info)
    }
}

/// Data of NBD_REP_SERVER: one export name.
pub fn encode_rep_server(name: &str) -> Vec<u8> {
    let mut out = Vec::new();
    put_string32(&mut out, name);
    out
}

/// The export name of an NBD_REP_SERVER (any trailing description ignored).
pub fn decode_rep_server(data: &[u8]) -> Option<String> {
    Cursor::new(data).string32().map(str::to_owned)
}

/// Data of NBD_REP_META_CONTEXT: context id and name.
pub fn encode_meta_context(id: u32, name: &str) -> Vec<u8> {
    let mut out = id.to_be_bytes().to_vec();
    out.extend_from_slice(name.as_bytes());
    out
}

/// Inverse of [`encode_meta_context`].
pub fn decode_meta_context(data: &[u8]) -> Option<(u32, String)> {
    let mut c = Cursor::new(data);
    let id = c.u32()?;
    Some((id, String::from_utf8(c.rest().to_vec()).ok()?))
}

/// The old-style reply to NBD_OPT_EXPORT_NAME: size, transmission flags,
/// and 124 zero bytes unless the client set NO_ZEROES.
pub fn encode_export_name_reply(size: u64, flags: u16, no_zeroes: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(134);
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    if !no_zeroes {
        out.resize(out.len() + 124, 0);
    }
    out
}

// ---- transmission ----

/// A transmission request header (a write's payload follows it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// NBD_CMD_FLAG_* bits.
    pub flags: u16,
    /// NBD_CMD_* type.
    pub command: u16,
    /// Opaque handle echoed in the reply.
    pub cookie: u64,
    /// Byte offset.
    pub offset: u64,
    /// Byte length.
    pub len: u32,
}

impl Request {
    /// Wire form.
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.command.to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..].copy_from_slice(&self.len.to_be_bytes());
        b
    }
    /// `None` if the magic is wrong (or fewer than 28 bytes are given).
    pub fn decode(b: &[u8]) -> Option<Request> {
        let mut c = Cursor::new(b);
        (c.u32()? == REQUEST_MAGIC).then_some(())?;
        Some(Request {
            flags: c.u16()?,
            command: c.u16()?,
            cookie: c.u64()?,
            offset: c.u64()?,
            len: c.u32()?,
        })
    }
    /// Payload bytes that follow this header on the wire.
    pub fn payload_len(&self) -> u32 {
        if self.command == CMD_WRITE {
            self.len
        } else {
            0
        }
    }
}

/// A simple reply header (a successful read's data follows it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimpleReply {
    /// 0 or an NBD errno value.
    pub error: u32,
    /// The request's cookie.
    pub cookie: u64,
}

impl SimpleReply {
    /// Wire form.
    pub fn encode(&self) -> [u8; SIMPLE_REPLY_LEN] {
        let mut b = [0u8; SIMPLE_REPLY_LEN];
        b[..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
        b[4..8].copy_from_slice(&self.error.to_be_bytes());
        b[8..].copy_from_slice(&self.cookie.to_be_bytes());
        b
    }
    /// `None` if the magic is wrong.
    pub fn decode(b: &[u8; SIMPLE_REPLY_LEN]) -> Option<SimpleReply> {
        let mut c = Cursor::new(b);
        (c.u32()? == SIMPLE_REPLY_MAGIC).then_some(())?;
        Some(SimpleReply {
            error: c.u32()?,
            cookie: c.u64()?,
        })
    }
}

/// A structured reply chunk header (its payload follows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkHeader {
    /// REPLY_FLAG_* bits.
    pub flags: u16,
    /// REPLY_TYPE_* value.
    pub chunk_type: u16,
    /// The request's cookie.
    pub cookie: u64,
    /// Payload length.
    pub len: u32,
}

impl ChunkHeader {
    /// Wire form.
    pub fn encode(&self) -> [u8; CHUNK_HEADER_LEN] {
        let mut b = [0u8; CHUNK_HEADER_LEN];
        b[..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.chunk_type.to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..].copy_from_slice(&self.len.to_be_bytes());
        b
    }
    /// `None` if the magic is wrong.
    pub fn decode(b: &[u8; CHUNK_HEADER_LEN]) -> Option<ChunkHeader> {
        let mut c = Cursor::new(b);
        (c.u32()? == STRUCTURED_REPLY_MAGIC).then_some(())?;
        Some(ChunkHeader {
            flags: c.u16()?,
            chunk_type: c.u16()?,
            cookie: c.u64()?,
            len: c.u32()?,
        })
    }
}

/// Payload of NBD_REPLY_TYPE_ERROR: errno, u16 message length, message
/// (truncated to [`MAX_STRING_LEN`] on a char boundary).
pub fn encode_error_payload(errno: u32, message: &str) -> Vec<u8> {
    let msg = truncate_str(message, MAX_STRING_LEN);
    let mut out = Vec::with_capacity(6 + msg.len());
    out.extend_from_slice(&errno.to_be_bytes());
    out.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    out.extend_from_slice(msg.as_bytes());
    out
}

/// Inverse of [`encode_error_payload`].
pub fn decode_error_payload(data: &[u8]) -> Option<(u32, String)> {
    let mut c = Cursor::new(data);
    let errno = c.u32()?;
    let len = usize::from(c.u16()?);
    let msg = std::str::from_utf8(c.bytes(len)?).ok()?.to_owned();
    c.is_empty().then_some((errno, msg))
}

/// One `base:allocation` descriptor: (length, STATE_* flags).
pub type Descriptor = (u32, u32);

/// Turns extents into descriptors covering at most `limit` bytes: runs
/// longer than u32::MAX are split, zero-length runs dropped, and at most
/// `max_descriptors` are produced (1 under REQ_ONE).
pub fn extents_to_descriptors(
    extents: &[Extent],
    limit: u64,
    max_descriptors: usize,
) -> Vec<Descriptor> {
    let mut out = Vec::new();
    let mut left = limit;
    for e in extents {
        let flags = (u32::from(e.hole) * STATE_HOLE) | (u32::from(e.zero) * STATE_ZERO);
        let mut run = e.len.min(left);
        left -= run;
        while run > 0 && out.len() < max_descriptors {
            let piece = run.min(u64::from(u32::MAX));
            out.push((piece as u32, flags));
            run -= piece;
        }
        if left == 0 || out.len() >= max_descriptors {
            break;
        }
    }
    out
}

/// Payload of NBD_REPLY_TYPE_BLOCK_STATUS.
pub fn encode_block_status(context_id: u32, descriptors: &[Descriptor]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + 8 * descriptors.len());
    out.extend_from_slice(&context_id.to_be_bytes());
    for (len, flags) in descriptors {
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&flags.to_be_bytes());
    }
    out
}

/// Inverse of [`encode_block_status`].
pub fn decode_block_status(data: &[u8]) -> Option<(u32, Vec<Descriptor>)> {
    let mut c = Cursor::new(data);
    let id = c.u32()?;
    let mut descs = Vec::new();
    while !c.is_empty() {
        descs.push((c.u32()?, c.u32()?));
    }
    Some((id, descs))
}

#[cfg(test)]
#[path = "proto_tests.rs"]
mod tests;
