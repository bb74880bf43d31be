//! Fixed-newstyle option haggling: from the greeting until the client picks
//! an export (NBD_OPT_GO / NBD_OPT_EXPORT_NAME) or leaves.
//!
//! Malformed option *data* gets an error reply and haggling goes on; a
//! broken *frame* (bad magic, unknown client flags, EOF) ends the connection,
//! because the byte stream can no longer be trusted.

use std::io::{self, Read, Write};

use super::proto::{self, Info, InfoRequest, MetaRequest, OptionHeader};
use super::{Errno, Export, ExportError, Exports, ServerOptions};

/// What transmission needs from the handshake.
pub(super) struct Session {
    /// The chosen export, opened for this connection.
    pub export: Box<dyn Export>,
    /// Structured replies were negotiated.
    pub structured: bool,
    /// `base:allocation` was selected for this export (implies `structured`).
    pub base_allocation: bool,
}

/// Runs the handshake. Ok(None): the client aborted or left politely;
/// Err: protocol violation or I/O error. Either way the connection closes.
pub(super) fn negotiate<R: Read, W: Write>(
    r: &mut R,
    w: &mut W,
    exports: &dyn Exports,
    opts: &ServerOptions,
) -> io::Result<Option<Session>> {
    w.write_all(&proto::encode_greeting(
        proto::FLAG_FIXED_NEWSTYLE | proto::FLAG_NO_ZEROES,
    ))?;
    w.flush()?;
    let client_flags = u32::from_be_bytes(proto::read_array(r)?);
    if client_flags & !proto::CLIENT_FLAGS_KNOWN != 0 {
        return Err(invalid("unknown client flags"));
    }
    let mut h = Haggle {
        w,
        exports,
        opts,
        no_zeroes: client_flags & u32::from(proto::FLAG_NO_ZEROES) != 0,
        structured: false,
        meta_export: None,
    };
    loop {
        h.w.flush()?;
        let header = OptionHeader::decode(&proto::read_array(r)?)
            .ok_or_else(|| invalid("bad option magic"))?;
        if header.len > proto::MAX_OPTION_LEN {
            if header.option == proto::OPT_EXPORT_NAME {
                return Err(invalid("export name too long"));
            }
            // Stay in sync by discarding; the handshake deadline bounds the time.
            proto::skip(r, u64::from(header.len))?;
            h.reply(
                header.option,
                proto::REP_ERR_TOO_BIG,
                b"option data too long",
            )?;
            continue;
        }
        let mut data = vec![0u8; header.len as usize];
        r.read_exact(&mut data)?;
        match h.option(header.option, &data)? {
            Step::Continue => {}
            Step::Done(session) => {
                h.w.flush()?;
                return Ok(session);
            }
        }
    }
}

/// Outcome of one option.
enum Step {
    Continue,
    Done(Option<Session>),
}

/// Handshake state between options.
struct Haggle<'a, W> {
    w: &'a mut W,
    exports: &'a dyn Exports,
    opts: &'a ServerOptions,
    no_zeroes: bool,
    structured: bool,
    /// The export whose SET_META_CONTEXT selected `base:allocation`.
    meta_export: Option<String>,
}

impl<W: Write> Haggle<'_, W> {
    fn option(&mut self, option: u32, data: &[u8]) -> io::Result<Step> {
        match option {
            proto::OPT_EXPORT_NAME => self.export_name(data).map(Step::Done),
            proto::OPT_ABORT => {
                // The client may already be gone; the ACK is a courtesy.
                let _ = self.reply(option, proto::REP_ACK, b"");
                let _ = self.w.flush();
                Ok(Step::Done(None))
            }
            proto::OPT_LIST => self.list(data).map(|()| Step::Continue),
            proto::OPT_INFO | proto::OPT_GO => self.info_or_go(option, data),
            proto::OPT_STRUCTURED_REPLY => self.structured_reply(data).map(|()| Step::Continue),
            proto::OPT_LIST_META_CONTEXT | proto::OPT_SET_META_CONTEXT => {
                self.meta_context(option, data).map(|()| Step::Continue)
            }
            _ => self
                .reply(option, proto::REP_ERR_UNSUP, b"option not supported")
                .map(|()| Step::Continue),
        }
    }

    fn reply(&mut self, option: u32, reply_type: u32, data: &[u8]) -> io::Result<()> {
        proto::write_option_reply(self.w, option, reply_type, data)
    }

    /// Replies with the option error that best matches an export failure.
    fn reply_export_error(&mut self, option: u32, e: &ExportError) -> io::Result<()> {
        let rep = match e.errno {
            Errno::Shutdown => proto::REP_ERR_SHUTDOWN,
            Errno::Perm => proto::REP_ERR_POLICY,
            Errno::Inval => proto::REP_ERR_INVALID,
            _ => proto::REP_ERR_UNKNOWN,
        };
        let msg = proto::truncate_str(&e.message, proto::MAX_STRING_LEN);
        self.reply(option, rep, msg.as_bytes())
    }

    /// Opens `name`, answering the option with an error if that fails.
    fn open(&mut self, option: u32, name: &str) -> io::Result<Option<Box<dyn Export>>> {
        match self.exports.open(name) {
            Ok(Some(e)) => Ok(Some(e)),
            Ok(None) => {
                self.reply(option, proto::REP_ERR_UNKNOWN, b"no such export")?;
                Ok(None)
            }
            Err(e) => {
                self.reply_export_error(option, &e)?;
                Ok(None)
            }
        }
    }

    fn session(&self, name: &str, export: Box<dyn Export>) -> Session {
        Session {
            export,
            structured: self.structured,
            base_allocation: self.structured && self.meta_export.as_deref() == Some(name),
        }
    }

    /// NBD_OPT_EXPORT_NAME: no error replies exist, so failure closes.
    fn export_name(&mut self, data: &[u8]) -> io::Result<Option<Session>> {
        let name = std::str::from_utf8(data).map_err(|_| invalid("export name not UTF-8"))?;
        let export = match self.exports.open(name) {
            Ok(Some(e)) => e,
            _ => return Err(invalid("unknown export")),
        };
        let flags = transmission_flags(export.read_only(), self.structured);
        let reply = proto::encode_export_name_reply(export.size(), flags, self.no_zeroes);
        self.w.write_all(&reply)?;
        Ok(Some(self.session(name, export)))
    }

    fn list(&mut self, data: &[u8]) -> io::Result<()> {
        let option = proto::OPT_LIST;
        if !data.is_empty() {
            return self.reply(option, proto::REP_ERR_INVALID, b"LIST takes no data");
        }
        match self.exports.list() {
            Ok(names) => {
                for name in names {
                    self.reply(option, proto::REP_SERVER, &proto::encode_rep_server(&name))?;
                }
                self.reply(option, proto::REP_ACK, b"")
            }
            Err(e) => self.reply_export_error(option, &e),
        }
    }

    fn info_or_go(&mut self, option: u32, data: &[u8]) -> io::Result<Step> {
        let Some(req) = InfoRequest::decode(data) else {
            self.reply(option, proto::REP_ERR_INVALID, b"malformed INFO/GO data")?;
            return Ok(Step::Continue);
        };
        let Some(export) = self.open(option, &req.name)? else {
            return Ok(Step::Continue);
        };
        let flags = transmission_flags(export.read_only(), self.structured);
        let mut infos = vec![Info::Export {
            size: export.size(),
            flags,
        }];
        if req.infos.contains(&proto::INFO_NAME) {
            infos.push(Info::Name(req.name.clone()));
        }
        if req.infos.contains(&proto::INFO_BLOCK_SIZE) {
            infos.push(self.block_size_info(export.block_size()));
        }
        for info in infos {
            self.reply(option, proto::REP_INFO, &info.encode())?;
        }
        self.reply(option, proto::REP_ACK, b"")?;
        if option == proto::OPT_GO {
            Ok(Step::Done(Some(self.session(&req.name, export))))
        } else {
            Ok(Step::Continue)
        }
    }

    /// Sanitises the export's preferred size: it must be a power of two
    /// within 512..=1 MiB and at most the maximum payload.
    fn block_size_info(&self, preferred: u32) -> Info {
        let max = self.opts.max_payload_bytes.max(1);
        let ok = preferred.is_power_of_two() && (512..=1 << 20).contains(&preferred);
        let preferred = if ok { preferred } else { 4096 };
        Info::BlockSize {
            min: 1,
            preferred: preferred.min(prev_power_of_two(max)),
            max,
        }
    }

    fn structured_reply(&mut self, data: &[u8]) -> io::Result<()> {
        let option = proto::OPT_STRUCTURED_REPLY;
        if !data.is_empty() {
            return self.reply(option, proto::REP_ERR_INVALID, b"takes no data");
        }
        if self.structured {
            return self.reply(option, proto::REP_ERR_INVALID, b"already negotiated");
        }
        self.structured = true;
        self.reply(option, proto::REP_ACK, b"")
    }

    fn meta_context(&mut self, option: u32, data: &[u8]) -> io::Result<()> {
        let set = option == proto::OPT_SET_META_CONTEXT;
        let Some(req) = MetaRequest::decode(data) else {
            return self.reply(
                option,
                proto::REP_ERR_INVALID,
                b"malformed meta context data",
            );
        };
        if set && !self.structured {
            return self.reply(option, proto::REP_ERR_INVALID, b"structured replies needed");
        }
        if self.open(option, &req.export)?.is_none() {
            return Ok(());
        }
        let matches = |q: &String| q == proto::BASE_ALLOCATION || (!set && q == "base:");
        let matched = (!set && req.queries.is_empty()) || req.queries.iter().any(matches);
        if matched {
            let ctx = proto::encode_meta_context(proto::BASE_ALLOCATION_ID, proto::BASE_ALLOCATION);
            self.reply(option, proto::REP_META_CONTEXT, &ctx)?;
        }
        if set {
            self.meta_export = matched.then_some(req.export);
        }
        self.reply(option, proto::REP_ACK, b"")
    }
}

/// Transmission flags for an export; DF only makes sense with structured replies,
/// and the writing commands' flags only on an export that can be written (the
/// commands are refused with EPERM on a read-only one anyway).
pub(super) fn transmission_flags(read_only: bool, structured: bool) -> u16 {
    let mut f = proto::TFLAG_HAS_FLAGS | proto::TFLAG_SEND_FLUSH | proto::TFLAG_CAN_MULTI_CONN;
    if read_only {
        f |= proto::TFLAG_READ_ONLY;
    } else {
        f |= proto::TFLAG_SEND_FUA
            | proto::TFLAG_SEND_TRIM
            | proto::TFLAG_SEND_WRITE_ZEROES
            | proto::TFLAG_SEND_FAST_ZERO;
    }
    if structured {
        f |= proto::TFLAG_SEND_DF;
    }
    f
}

fn prev_power_of_two(x: u32) -> u32 {
    if x == 0 {
        1
    } else {
        1 << (31 - x.leading_zeros())
    }
}

fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_owned())
}
