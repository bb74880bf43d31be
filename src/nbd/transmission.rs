//! The transmission phase: requests are read and answered in order on one
//! thread, except that large writes are applied on a second one (and committed on
//! a third), and a flush synced on another, while the first reads on.
//!
//! Replies go into a `BufWriter` that is flushed only when the reader holds
//! no further complete request, so pipelined requests are answered in
//! batches while a lone request is answered at once. A write's payload is
//! read completely before anything is applied, so a client vanishing
//! mid-payload changes nothing.
//!
//! **Large writes land beside the reads.** A write of [`LAND_MIN_BYTES`] or more
//! (a 1 MiB sequential write, an image import's chunks) costs three things one
//! after the other when done in line: receiving its payload from the socket,
//! staging it, and writing it to the disk. So once its payload is in, it is handed
//! with the export to the connection's **lander** thread, which applies it and
//! answers it (through the same writer, under its lock), while this thread
//! receives the next request. The next large write is queued behind the landing
//! (one at most), so the lander starts it the moment it is done with the last,
//! with no round trip through this thread (two thread wake-ups, ~0.3 ms a landing
//! on a VM whose idle vCPUs halt; +5% for a QD8 stream of 1 MiB writes). The
//! export lies in a slot the two threads share: anything else that needs it waits
//! until every queued landing has been answered, so requests are still applied in
//! order. Small requests never touch the lander (a hand-off per 4 KiB request cost
//! random reads 30–60% when everything went through a second thread).
//!
//! **Landings in two steps.** An export with a [`Writer`] (a volume's) lands each
//! write as its data, put on disk out of sight, then a commit that makes it part of
//! the export. The lander writes one landing's data while a **committer** thread
//! commits the landing before it and answers it, so the disk is not idle while a
//! transaction maps the blocks in (for 2.6 MB landings, ~1.0 ms of data and ~0.3 ms
//! of commit; +14% for a QD8 stream of 1 MiB writes). Commits go in the order the
//! writes came, so a later write still wins where two overlap; a write that cannot
//! be split (not all whole blocks of data) is written in one step by the
//! committer, in its turn. A landing with nothing queued behind it, written while
//! the committer has nothing in hand, the lander commits itself: it would only wait
//! for the next, and the committer, woken, waits 0.1–0.2 ms for a CPU on a busy
//! 2-vCPU VM before it starts (a quarter of a QD8 stream's 2.4 MB landings, answered
//! in ~160 µs instead of ~320–380 µs).
//!
//! A large write that continues the one before it (a sequential stream's next
//! chunk), whose header is already in the reader's buffer, joins its landing: its
//! payload is received right behind the previous one in the same page-aligned
//! buffer, up to [`MAX_LANDING_BYTES`], and the lander writes them as one (one
//! transaction, one direct write of up to 8 MiB instead of one per request) and
//! answers each. Only a header already here is taken: one still to come could be a
//! client waiting for the answers to the writes held back. (The buffer is where the
//! next header is: a payload's last piece, shorter than the buffer, is read through
//! it, and that read takes whatever the client sent behind it.)
//!
//! **How much joins.** A landing joins at most as many bytes as the landing before it
//! held, plus its first write's (and at most [`MAX_LANDING_BYTES`]); the landing
//! before counts while the stream of large writes goes on unbroken (any other request
//! starts it over). A landing that took every write the client has in flight would
//! leave nothing to receive while it is written: the client sends more only once it
//! is answered, so receiving and writing would take turns (a QD8 stream of 1 MiB
//! writes landed 8 MiB at a time, each landing all the client had sent). With the
//! rule, a stream's first landing takes one write, the next up to two, and so on, and
//! the stream settles into landings that split the client's window about in half, one
//! written while the other is received; a client with one or two writes in flight
//! is never held back for a join.
//!
//! **Flushes sync beside the reads.** A flush is handed to the connection's flush
//! thread, if the export has a [`Flusher`], which syncs and answers it while this
//! thread reads and applies the requests behind it: a client that keeps writing
//! behind its flush (qemu's block layer, a guest's queue) would otherwise have those
//! writes wait for the disk's sync, so that each flush's sync and the next writes
//! took turns (`qemu-img bench --flush-interval 16 --no-drain`: +28%; a client that
//! waits for each flush, as fio does, neither gains nor loses). A flush covers the
//! writes answered before it, and those were applied (committed) before it was
//! handed over, so a sync that starts later covers them; flushes queued while a sync
//! runs are all answered by the next one. A large write landing is settled before,
//! as for any request but a large write.
//!
//! **Memory.** A landing's buffer, and a large read's, come from the server's
//! [`PayloadBudget`] (see its module) and go back as soon as the request is done:
//! the lander gives a landing's back before it hands the export back, so a reader
//! waiting for room never waits on a buffer its own connection holds. What a
//! connection keeps of its own is small: a payload buffer of at most
//! [`SMALL_PAYLOAD`] and a batch of at most [`MAX_BATCH_BYTES`] plus one.

use std::collections::VecDeque;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, SyncSender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use super::activity::Activity;
use super::budget::{PayloadBudget, PayloadBuf, SMALL_PAYLOAD};
use super::handshake::Session;
use super::proto::{self, ChunkHeader, Descriptor, Request, SimpleReply};
use super::stream::Stream;
use super::{Errno, Export, ExportError, Flusher, PendingWrite, ServerOptions, Writer, ZeroFlags};

/// Most flushes queued for a connection's flush thread: a client with more in
/// flight waits (its requests stay in the socket) until the running sync answers
/// the queued ones.
const MAX_QUEUED_FLUSHES: usize = 64;

/// Most extents asked of the export per NBD_CMD_BLOCK_STATUS.
const MAX_EXTENTS: usize = 1024;

/// Most writes, and payload bytes, applied as one batch (`Export::write_batch`).
/// (A batch is of writes under [`LAND_MIN_BYTES`]: 256 writes of 4 KiB fill it.)
const MAX_BATCH_WRITES: usize = 256;
const MAX_BATCH_BYTES: usize = 1 << 20;

/// A write at least this large lands on the lander thread (module docs): where the
/// engine starts writing past the page cache, so that the disk write is what the
/// next request's receiving overlaps. (Smaller writes use the connection's own
/// buffer, so this is at most [`SMALL_PAYLOAD`].)
const LAND_MIN_BYTES: u32 = SMALL_PAYLOAD as u32;

/// Most payload bytes one landing holds: the large writes that continue each other
/// (module docs) join a landing up to this.
const MAX_LANDING_BYTES: usize = 8 << 20;

/// Serves requests until the client disconnects (NBD_CMD_DISC or EOF) or
/// breaks the protocol. Errors only say why the connection ended.
pub(super) fn serve(
    r: &mut BufReader<Stream>,
    w: BufWriter<Stream>,
    session: Session,
    opts: &ServerOptions,
    budget: Arc<PayloadBudget>,
    activity: Arc<Activity>,
) -> io::Result<()> {
    let Session {
        export,
        structured,
        base_allocation,
    } = session;
    let mut conn = Conn {
        size: export.size(),
        read_only: export.read_only(),
        export: Some(export),
        structured,
        base_allocation,
        max_payload: opts.max_payload_bytes,
        budget,
        budget_wait: opts.payload_wait,
        buf: Vec::new(),
        batch: Vec::new(),
        out: Replies(Arc::new(Mutex::new(w))),
        lander: None,
        last_landing: 0,
        flushing: Flushing::NotYet,
        activity,
    };
    let result = conn.run(r);
    // A write still landing is answered, and so are flushes syncing; replies already
    // produced are owed to the client even if it then broke off.
    let landed = conn.settle();
    if let Some(lander) = conn.lander.take() {
        lander.stop();
    }
    if let Flushing::Beside(flushes) = std::mem::replace(&mut conn.flushing, Flushing::InLine) {
        flushes.stop();
    }
    let flushed = conn.out.lock().flush();
    result.and(landed).and(flushed)
}

/// Successful outcome of a command, before encoding.
enum Reply {
    /// No data (writes, flush, trim, ...).
    Empty,
    /// A small read: the data is `Conn::buf`.
    Data,
    /// A large read's data.
    LargeData(PayloadBuf),
    /// Block status descriptors for `base:allocation`.
    BlockStatus(Vec<Descriptor>),
}

struct Conn {
    /// The export, or `None` while a large write lands with it ([`Conn::settle`]
    /// brings it back).
    export: Option<Box<dyn Export>>,
    /// The export's size and read-only flag, fixed for the handle's life: checking a
    /// request must not wait for a landing.
    size: u64,
    read_only: bool,
    structured: bool,
    base_allocation: bool,
    max_payload: u32,
    /// Where large payloads' buffers come from, and how long a request waits for one.
    budget: Arc<PayloadBudget>,
    budget_wait: std::time::Duration,
    /// Reused payload buffer of small writes and reads; its length never exceeds
    /// `SMALL_PAYLOAD`.
    buf: Vec<u8>,
    /// Reused buffer of a batch of small writes' payloads, back to back; at most
    /// `MAX_BATCH_BYTES` plus one payload.
    batch: Vec<u8>,
    out: Replies,
    /// Started by the first large write.
    lander: Option<Lander>,
    /// Payload bytes of the last landing while a stream of large writes goes on; 0
    /// once anything else needed the export.
    last_landing: usize,
    /// How flushes run; decided at the first.
    flushing: Flushing,
    /// Set idle while waiting for a request with every reply sent (a landing may be
    /// in flight: ending the connection still lands and answers it).
    activity: Arc<Activity>,
}

/// The connection's reply writer, shared with its lander thread; each reply is
/// written whole under the lock.
#[derive(Clone)]
struct Replies(Arc<Mutex<BufWriter<Stream>>>);

impl Replies {
    fn lock(&self) -> MutexGuard<'_, BufWriter<Stream>> {
        // A panicking holder leaves at worst a partial reply, after which the client
        // cannot parse the stream anyway.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Large writes, each continuing the one before, handed to the lander.
struct Landing {
    /// In order; their payloads are `payload`, back to back.
    reqs: Vec<Request>,
    payload: PayloadBuf,
}

/// Starts a helper thread of the connection, named after the connection's thread
/// and its `role` ("nbd-conn-N-lander").
fn spawn_helper(role: &str, work: impl FnOnce() + Send + 'static) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(helper_name(role))
        .spawn(work)
}

/// The name of the current thread's helper in `role`: "<its name>-<role>".
fn helper_name(role: &str) -> String {
    let conn = std::thread::current()
        .name()
        .unwrap_or("nbd-conn")
        .to_owned();
    format!("{conn}-{role}")
}

/// A connection's lander thread (module docs).
struct Lander {
    shared: Arc<LanderShared>,
    thread: JoinHandle<()>,
}

/// What the connection's thread and its lander share.
struct LanderShared {
    state: Mutex<LanderState>,
    /// The lander waits here for a landing (or the stop).
    work: Condvar,
    /// The connection's thread waits here for room in the queue, or for the export.
    idle: Condvar,
}

/// The export lies here while landings are queued or in flight (a lander without a
/// [`Writer`] takes it for each landing and puts it back after), so the
/// connection's thread can queue the next landing without waiting for the last; it
/// takes the export back for anything else once every landing has been answered.
struct LanderState {
    export: Option<Box<dyn Export>>,
    /// Landings not started yet, in order: at most [`MAX_QUEUED_LANDINGS`].
    queue: VecDeque<Landing>,
    /// Landings taken from the queue and not answered yet.
    in_flight: usize,
    /// Set when a landing's replies could not be sent (the client is gone).
    unanswered: Option<io::Error>,
    stop: bool,
    /// The lander has ended (stopped, or a panic in the export).
    gone: bool,
}

/// Landings a connection may queue behind the one landing: one is enough to keep
/// the lander busy (it starts the next as soon as it is done with the last, without
/// a round trip through the connection's thread, which costs two thread wake-ups:
/// ~0.3 ms a landing on this kind of VM, whose idle vCPUs halt), and each holds up
/// to [`MAX_LANDING_BYTES`] of the payload budget.
const MAX_QUEUED_LANDINGS: usize = 1;

impl LanderShared {
    fn lock(&self) -> MutexGuard<'_, LanderState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Lander {
    fn start(
        out: Replies,
        structured: bool,
        writer: Option<Box<dyn Writer>>,
    ) -> io::Result<Lander> {
        let shared = Arc::new(LanderShared {
            state: Mutex::new(LanderState {
                export: None,
                queue: VecDeque::new(),
                in_flight: 0,
                unanswered: None,
                stop: false,
                gone: false,
            }),
            work: Condvar::new(),
            idle: Condvar::new(),
        });
        let lander = shared.clone();
        let thread = spawn_helper("lander", move || {
            land_all(&lander, &out, structured, writer);
        })?;
        Ok(Lander { shared, thread })
    }

    /// Queues `landing`, with the export if the connection's thread holds it (it
    /// lies in the shared slot otherwise), once the queue has room.
    fn queue(&self, export: Option<Box<dyn Export>>, landing: Landing) -> io::Result<()> {
        let mut st = self.shared.lock();
        while st.queue.len() >= MAX_QUEUED_LANDINGS && !st.gone {
            st = self
                .shared
                .idle
                .wait(st)
                .unwrap_or_else(PoisonError::into_inner);
        }
        if let Some(export) = export {
            st.export = Some(export);
        }
        if st.gone {
            return Err(io::Error::other("the lander thread is gone"));
        }
        st.queue.push_back(landing);
        drop(st);
        self.shared.work.notify_one();
        Ok(())
    }

    /// Waits until every queued landing has been answered and takes the export back; an
    /// error if a landing's replies could not be sent (the client is gone) or the
    /// lander died with the export.
    fn take_export(&self) -> io::Result<Box<dyn Export>> {
        let mut st = self.shared.lock();
        loop {
            if let Some(e) = st.unanswered.take() {
                return Err(e);
            }
            if st.queue.is_empty() && st.in_flight == 0 {
                if let Some(export) = st.export.take() {
                    return Ok(export);
                }
            }
            if st.gone {
                return Err(io::Error::other("the lander thread died"));
            }
            st = self
                .shared
                .idle
                .wait(st)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Stops the thread once the queue is empty, and waits for it.
    fn stop(self) {
        self.shared.lock().stop = true;
        self.shared.work.notify_one();
        // A panic in the export ends the thread; the connection ends anyway.
        let _ = self.thread.join();
    }
}

/// The lander thread: lands what is queued, in order, and answers each write; in
/// two steps if the export has a [`Writer`].
fn land_all(
    shared: &LanderShared,
    out: &Replies,
    structured: bool,
    writer: Option<Box<dyn Writer>>,
) {
    /// Tells the connection's thread, however this thread ends.
    struct Gone<'a>(&'a LanderShared);
    impl Drop for Gone<'_> {
        fn drop(&mut self) {
            self.0.lock().gone = true;
            self.0.idle.notify_all();
        }
    }
    let _gone = Gone(shared);
    let answer = Answer {
        shared,
        out,
        structured,
    };
    match writer {
        Some(writer) => land_in_two_steps(shared, &answer, &*writer),
        None => land_in_one_step(shared, &answer),
    }
}

/// Each landing is one [`Export::write`], with the export taken from the slot.
fn land_in_one_step(shared: &LanderShared, answer: &Answer<'_>) {
    while let Some(Landing { reqs, payload }) = next_landing(shared) {
        let Some(mut export) = shared.lock().export.take() else {
            unreachable!("queued with the export or behind one that put it back");
        };
        let applied = export.write(reqs[0].offset, payload.bytes(), fua(&reqs));
        shared.lock().export = Some(export);
        answer.landed(&reqs, payload, applied);
    }
}

/// Each landing's data goes to disk ([`Writer::write_ahead`]) while the landing
/// before it commits, on a committer thread that then answers it (module docs). The
/// export stays in the slot: the count of landings not yet answered keeps the
/// connection's thread from taking it meanwhile.
fn land_in_two_steps(shared: &LanderShared, answer: &Answer<'_>, writer: &dyn Writer) {
    // Commits a written landing and answers it.
    let commit = |Written {
                      reqs,
                      payload,
                      ahead,
                  }: Written<'_>| {
        let fua = fua(&reqs);
        let applied = match ahead {
            Ok(Some(pending)) => pending.commit(fua),
            Ok(None) => writer.write(reqs[0].offset, payload.bytes(), fua),
            Err(e) => Err(e),
        };
        answer.landed(&reqs, payload, applied);
    };
    // Landings handed to the committer that it has not answered yet.
    let handed = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        // Room for one written landing: the lander hands it over and starts on the
        // next without waiting for the committer to wake up and take it (a
        // rendezvous cost the lander ~0.1 ms a landing on this kind of VM, whose
        // idle vCPUs halt: 1 MiB writes at QD8 went ~5% faster without it). So one
        // landing commits, one waits for it, and one is written.
        let (to_commit, written) = mpsc::sync_channel::<Written<'_>>(1);
        let committer = std::thread::Builder::new()
            .name(helper_name("committer"))
            .spawn_scoped(scope, || {
                for landing in written {
                    commit(landing);
                    handed.fetch_sub(1, Ordering::Release);
                }
            });
        let Ok(committer) = committer else {
            // No thread to be had: both steps here.
            while let Some(Landing { reqs, payload }) = next_landing(shared) {
                let fua = fua(&reqs);
                let applied = writer.write(reqs[0].offset, payload.bytes(), fua);
                answer.landed(&reqs, payload, applied);
            }
            return;
        };
        while let Some(Landing { reqs, payload }) = next_landing(shared) {
            let ahead = writer.write_ahead(reqs[0].offset, payload.bytes());
            let written = Written {
                reqs,
                payload,
                ahead,
            };
            // With no landing queued behind this one, the lander would only wait for
            // the next: it commits this one itself, in order if the committer has
            // answered every landing handed to it (their commits are then visible:
            // `Acquire`), rather than wake the committer, which on a busy 2-vCPU VM
            // waits 0.1–0.2 ms for a CPU before it starts, while the client waits
            // for the answer to send more.
            if handed.load(Ordering::Acquire) == 0 && shared.lock().queue.is_empty() {
                commit(written);
                continue;
            }
            handed.fetch_add(1, Ordering::Relaxed);
            if to_commit.send(written).is_err() {
                break; // the committer panicked
            }
        }
        drop(to_commit);
        if let Err(panic) = committer.join() {
            std::panic::resume_unwind(panic);
        }
    });
}

/// A landing whose data is on disk, for the committer.
struct Written<'w> {
    reqs: Vec<Request>,
    payload: PayloadBuf,
    ahead: Result<Option<Box<dyn PendingWrite + 'w>>, ExportError>,
}

/// Whether any of a landing's writes asked for FUA (the landing is durable before
/// any is answered).
fn fua(reqs: &[Request]) -> bool {
    reqs.iter().any(|r| r.flags & proto::CMD_FLAG_FUA != 0)
}

/// The next landing queued, once there is one, counted as in flight; `None` once
/// the lander is to stop and the queue is empty.
fn next_landing(shared: &LanderShared) -> Option<Landing> {
    let mut st = shared.lock();
    loop {
        if let Some(landing) = st.queue.pop_front() {
            st.in_flight += 1;
            drop(st);
            // Room for the next landing.
            shared.idle.notify_one();
            return Some(landing);
        }
        if st.stop {
            return None;
        }
        st = shared.work.wait(st).unwrap_or_else(PoisonError::into_inner);
    }
}

/// Answers landings, through the connection's writer.
struct Answer<'a> {
    shared: &'a LanderShared,
    out: &'a Replies,
    structured: bool,
}

impl Answer<'_> {
    /// Answers each of a landing's writes with `applied`'s outcome, and counts the
    /// landing out.
    fn landed(&self, reqs: &[Request], payload: PayloadBuf, applied: Result<(), ExportError>) {
        // The budget back first: a reader waiting for room never waits on a buffer
        // its own connection holds.
        drop(payload);
        let mut w = self.out.lock();
        let answered = reqs
            .iter()
            .try_for_each(|&req| {
                status_reply(&mut *w, self.structured, req, applied.as_ref().err())
            })
            .and_then(|()| w.flush());
        drop(w);
        let mut st = self.shared.lock();
        st.in_flight -= 1;
        if let Err(e) = answered {
            st.unanswered.get_or_insert(e);
        }
        drop(st);
        self.shared.idle.notify_one();
    }
}

/// How a connection runs its flushes (module docs).
enum Flushing {
    /// No flush yet: the export has not been asked for a [`Flusher`].
    NotYet,
    /// The export has none: each flush runs on the connection's thread.
    InLine,
    /// On the connection's flush thread.
    Beside(FlushThread),
}

/// A connection's flush thread (module docs): syncs through the export's
/// [`Flusher`] and answers the flushes handed to it, through the connection's
/// writer.
struct FlushThread {
    to_flush: SyncSender<Request>,
    thread: JoinHandle<()>,
}

impl FlushThread {
    fn start(
        mut flusher: Box<dyn Flusher>,
        out: Replies,
        structured: bool,
    ) -> io::Result<FlushThread> {
        let (to_flush, flushes) = mpsc::sync_channel::<Request>(MAX_QUEUED_FLUSHES);
        let thread = spawn_helper("flush", move || {
            let mut answering = Vec::new();
            while let Ok(first) = flushes.recv() {
                // Every flush queued by now came after the writes it covers were
                // applied, so the sync that starts now answers all of them.
                answering.push(first);
                answering.extend(flushes.try_iter());
                let synced = flusher.flush();
                let mut w = out.lock();
                let answered = answering
                    .drain(..)
                    .try_for_each(|req| {
                        status_reply(&mut *w, structured, req, synced.as_ref().err())
                    })
                    .and_then(|()| w.flush());
                if answered.is_err() {
                    // The client is gone; the connection's thread finds out too,
                    // and its next hand-off fails.
                    return;
                }
            }
        })?;
        Ok(FlushThread { to_flush, thread })
    }

    /// Closes the queue and waits for the thread, which answers what was queued.
    fn stop(self) {
        drop(self.to_flush);
        // A panic in the export ends the thread; the connection ends anyway.
        let _ = self.thread.join();
    }
}

/// Runs `receive` with `r`'s reads polling before they sleep: a landing's payloads,
/// whose rest is on its way (`Stream::poll_payloads`).
fn polling_payloads<T>(
    r: &mut BufReader<Stream>,
    receive: impl FnOnce(&mut BufReader<Stream>) -> T,
) -> T {
    r.get_mut().poll_payloads(true);
    let received = receive(r);
    r.get_mut().poll_payloads(false);
    received
}

impl Conn {
    fn run(&mut self, r: &mut BufReader<Stream>) -> io::Result<()> {
        loop {
            let waits = !complete_request_buffered(r.buffer());
            if waits {
                self.out.lock().flush()?;
                // The client has all our answers; its next request is the wait.
                r.get_mut().poll_next_read();
                // Idle even with a landing in flight: ending the connection now (its
                // reading side shut) still lands and answers it (`serve` settles).
                self.activity.idle();
            }
            let header = proto::read_array::<_, { proto::REQUEST_LEN }>(r);
            if waits {
                self.activity.busy();
            }
            let header = match header {
                Ok(h) => h,
                // EOF between requests: the client left (or we shut down reads).
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            };
            let req = Request::decode(&header).ok_or_else(|| invalid("bad request magic"))?;
            if req.command == proto::CMD_WRITE
                && (LAND_MIN_BYTES..=self.max_payload).contains(&req.len)
            {
                self.land(r, req)?;
                continue;
            }
            self.last_landing = 0;
            self.settle()?;
            let result = match req.command {
                proto::CMD_DISC => return Ok(()),
                proto::CMD_WRITE => match self.read_payload(r, req)? {
                    Ok(()) if write_buffered(r.buffer(), self.max_payload) => {
                        self.write_batch(r, req)?;
                        continue;
                    }
                    Ok(()) => self.write(req),
                    Err(e) => Err(e),
                },
                proto::CMD_FLUSH if self.flush_beside(req)? => continue,
                _ => self.command(req),
            };
            self.reply(req, result)?;
        }
    }

    /// Receives a large write's payload (while the last one lands), then hands it
    /// to the lander with the export.
    fn land(&mut self, r: &mut BufReader<Stream>, req: Request) -> io::Result<()> {
        // Room for the writes that may join it (`join`): as many bytes as the landing
        // before held, and this write's (module docs, "How much joins").
        let len = req.len as usize;
        let room = (self.last_landing + len)
            .min(MAX_LANDING_BYTES)
            .min(self.budget.largest());
        let capacity = len.max(room);
        let Some(mut payload) = self.budget.take(capacity, self.budget_wait) else {
            proto::skip(r, u64::from(req.len))?;
            self.settle()?;
            return self.reply(req, Err(out_of_memory()));
        };
        match payload.extend(len) {
            Some(bytes) => polling_payloads(r, |r| r.read_exact(bytes))?,
            None => unreachable!("taken with room for {len} bytes"),
        }
        if let Err(e) = self.check(req, Errno::NoSpc, true) {
            drop(payload);
            self.settle()?;
            return self.reply(req, Err(e));
        }
        let mut reqs = vec![req];
        // A client gone while a write was joining: the writes before it, whole, still
        // land (never answered, but a shutdown that closes our reading side expects
        // what it had sent to be applied), then the error ends the connection.
        let joined = polling_payloads(r, |r| self.join(r, &mut reqs, &mut payload));
        let lander = match &mut self.lander {
            Some(lander) => lander,
            none => {
                let writer = self.export.as_ref().and_then(|export| export.writer());
                none.insert(Lander::start(self.out.clone(), self.structured, writer)?)
            }
        };
        self.last_landing = payload.len();
        // The export goes with the first landing of a stream; the next ones find it
        // in the lander's slot.
        lander.queue(self.export.take(), Landing { reqs, payload })?;
        joined
    }

    /// Adds to `reqs` (and their payloads to `payload`) the large writes that
    /// continue them whose headers are already in `r`'s buffer (module docs). On an
    /// error, what was added whole stays; the write being read is dropped.
    fn join(
        &self,
        r: &mut BufReader<Stream>,
        reqs: &mut Vec<Request>,
        payload: &mut PayloadBuf,
    ) -> io::Result<()> {
        let last = reqs[reqs.len() - 1];
        let mut end = last.offset + u64::from(last.len);
        while let Some(next) = self.next_joining(r, end, payload.room())? {
            let whole = payload.len();
            let read = match payload.extend(next.len as usize) {
                Some(bytes) => r.read_exact(bytes),
                None => unreachable!("joined only with room"),
            };
            if let Err(e) = read {
                payload.truncate(whole);
                return Err(e);
            }
            end += u64::from(next.len);
            reqs.push(next);
        }
        Ok(())
    }

    /// The next request, if its header is in `r`'s buffer and it is a valid large
    /// write starting at `end` whose payload fits in the `room` left in the landing;
    /// its header is consumed, its payload is not.
    fn next_joining(
        &self,
        r: &mut BufReader<Stream>,
        end: u64,
        room: usize,
    ) -> io::Result<Option<Request>> {
        match Request::decode(r.buffer()) {
            Some(req)
                if req.command == proto::CMD_WRITE
                    && (LAND_MIN_BYTES..=self.max_payload).contains(&req.len)
                    && req.offset == end
                    && req.len as usize <= room
                    && self.check(req, Errno::NoSpc, true).is_ok() =>
            {
                proto::read_array::<_, { proto::REQUEST_LEN }>(r)?;
                Ok(Some(req))
            }
            _ => Ok(None),
        }
    }

    /// Hands a flush to the connection's flush thread, which answers it (module
    /// docs); false if it is to run in line: the export has no [`Flusher`], or the
    /// request is invalid.
    fn flush_beside(&mut self, req: Request) -> io::Result<bool> {
        if check_flags(req).is_err() {
            return Ok(false);
        }
        if let Flushing::NotYet = self.flushing {
            self.flushing = match self.export().flusher() {
                Some(flusher) => Flushing::Beside(FlushThread::start(
                    flusher,
                    self.out.clone(),
                    self.structured,
                )?),
                None => Flushing::InLine,
            };
        }
        let Flushing::Beside(flushes) = &self.flushing else {
            return Ok(false);
        };
        flushes
            .to_flush
            .send(req)
            .map_err(|_| io::Error::other("the flush thread is gone"))?;
        Ok(true)
    }

    /// Waits for the write landing, if any, and takes the export back; an error if
    /// its reply could not be sent (the client is gone) or the lander died.
    fn settle(&mut self) -> io::Result<()> {
        if self.export.is_some() {
            return Ok(());
        }
        // The export is out only with a lander (`land`).
        let Some(lander) = &self.lander else {
            return Err(io::Error::other("the export is gone"));
        };
        let export = lander.take_export();
        self.export = Some(export?);
        Ok(())
    }

    fn export(&mut self) -> &mut dyn Export {
        present(&mut self.export)
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
    fn write_batch<R: Read>(&mut self, r: &mut BufReader<R>, first: Request) -> io::Result<()> {
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
            present(&mut self.export).write_batch(&writes, fua)
        };
        for (req, check) in reqs.into_iter().zip(checks) {
            let result = check.and_then(|()| applied.clone()).map(|()| Reply::Empty);
            self.reply(req, result)?;
        }
        Ok(())
    }

    fn write(&mut self, req: Request) -> Result<Reply, ExportError> {
        self.check(req, Errno::NoSpc, true)?;
        if req.len > 0 {
            let fua = req.flags & proto::CMD_FLAG_FUA != 0;
            present(&mut self.export).write(req.offset, &self.buf, fua)?;
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
                self.export().flush().map(|()| Reply::Empty)
            }
            proto::CMD_TRIM => {
                self.check(req, Errno::Inval, true)?;
                if len > 0 {
                    self.export().trim(req.offset, len, fua)?;
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
                    self.export().write_zeroes(req.offset, len, flags)?;
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
        if writes && self.read_only {
            return Err(ExportError::perm("export is read-only"));
        }
        let end = req.offset.checked_add(u64::from(req.len));
        match end {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(ExportError::new(past_end, "range beyond end of export")),
        }
    }

    fn read(&mut self, req: Request) -> Result<Reply, ExportError> {
        // The structured OFFSET_DATA length (8 + len) must fit in a u32.
        if req.len > self.max_payload || req.len > u32::MAX - 8 {
            return Err(ExportError::inval("read larger than maximum payload"));
        }
        self.check(req, Errno::Inval, false)?;
        let len = req.len as usize;
        if len > SMALL_PAYLOAD {
            let mut data = (self.budget)
                .take(len, self.budget_wait)
                .ok_or_else(out_of_memory)?;
            match data.extend(len) {
                Some(bytes) => present(&mut self.export).read(req.offset, bytes)?,
                None => unreachable!("taken with room for {len} bytes"),
            }
            return Ok(Reply::LargeData(data));
        }
        self.buf.resize(len, 0);
        if len > 0 {
            present(&mut self.export).read(req.offset, &mut self.buf)?;
        }
        Ok(Reply::Data)
    }

    fn block_status(&mut self, req: Request) -> Result<Reply, ExportError> {
        check_flags(req)?;
        if !self.base_allocation {
            return Err(ExportError::inval("base:allocation not negotiated"));
        }
        let size = self.size;
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
        let extents = self.export().block_status(req.offset, len, max)?;
        let descs = proto::extents_to_descriptors(&extents, len, max);
        if descs.is_empty() {
            return Err(ExportError::io("export reported no extents"));
        }
        Ok(Reply::BlockStatus(descs))
    }

    fn reply(&self, req: Request, result: Result<Reply, ExportError>) -> io::Result<()> {
        let mut w = self.out.lock();
        let w = &mut *w;
        let structured = self.structured;
        match result {
            Err(e) => status_reply(w, structured, req, Some(&e)),
            Ok(Reply::Empty) => status_reply(w, structured, req, None),
            Ok(Reply::Data) => data_reply(w, structured, req, &self.buf),
            Ok(Reply::LargeData(data)) => data_reply(w, structured, req, data.bytes()),
            // Only negotiated with structured replies (`block_status` checks).
            Ok(Reply::BlockStatus(d)) => {
                let payload = proto::encode_block_status(proto::BASE_ALLOCATION_ID, &d);
                let h = chunk(req, proto::REPLY_TYPE_BLOCK_STATUS, payload.len());
                w.write_all(&h.encode())?;
                w.write_all(&payload)
            }
        }
    }
}

/// The connection's export, which [`Conn::settle`] brought back before any request
/// that uses it (it is out only while a large write lands).
fn present(export: &mut Option<Box<dyn Export>>) -> &mut dyn Export {
    match export.as_deref_mut() {
        Some(e) => e,
        None => unreachable!("settled before every use"),
    }
}

/// Writes a successful read's reply, with its data.
fn data_reply<W: Write>(w: &mut W, structured: bool, req: Request, data: &[u8]) -> io::Result<()> {
    if !structured {
        status_reply(w, false, req, None)?;
        return w.write_all(data);
    }
    if data.is_empty() {
        return status_reply(w, true, req, None);
    }
    // Written in place to avoid copying the data.
    let h = chunk(req, proto::REPLY_TYPE_OFFSET_DATA, 8 + data.len());
    w.write_all(&h.encode())?;
    w.write_all(&req.offset.to_be_bytes())?;
    w.write_all(data)
}

/// The answer to a request whose buffer the payload budget had no room for in time.
fn out_of_memory() -> ExportError {
    ExportError::new(Errno::NoMem, "server payload memory busy; try again")
}

/// Writes the reply to a request whose answer carries no data: success, or `error`.
fn status_reply<W: Write>(
    w: &mut W,
    structured: bool,
    req: Request,
    error: Option<&ExportError>,
) -> io::Result<()> {
    if !structured {
        let error = error.map_or(0, |e| e.errno.code());
        let cookie = req.cookie;
        return w.write_all(&SimpleReply { error, cookie }.encode());
    }
    let (chunk_type, payload) = match error {
        None => (proto::REPLY_TYPE_NONE, Vec::new()),
        Some(e) => (
            proto::REPLY_TYPE_ERROR,
            proto::encode_error_payload(e.errno.code(), &e.message),
        ),
    };
    w.write_all(&chunk(req, chunk_type, payload.len()).encode())?;
    w.write_all(&payload)
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
