//! TCP sockets served by the xdp engine (issue 11).
//!
//! An AF_INET stream socket becomes a *candidate* at `socket()` when the
//! engine is `xdp`. It goes on the engine at `listen()` (the application's
//! own fd, bound and listening in the kernel, keeps holding the port; the
//! steering program takes the port's segments) or at `connect()` (the fd is
//! bound to the route's source address and an ephemeral port the kernel
//! picks; the steering program takes the 4-tuple). A connection the engine
//! accepts gets a placeholder fd: an unconnected AF_INET stream socket, so
//! `fstat`, `SO_TYPE` and `SO_DOMAIN` answer as for a TCP socket (a
//! duplicate of one the process shares until a call would change it:
//! `placeholder`, [`own_placeholder`]); the shim maps the number to the
//! engine connection.
//!
//! Every call on the engine is one attempt (one engine turn at most); the
//! waiting (blocking sockets, MSG_WAITALL, connect, accept) is done here:
//! spin per the profile, then sleep on the engine's fds in slices, with
//! signals noticed (EINTR) between slices. The kernel answer of the fd
//! underneath is never used for readiness of a connection (an unconnected
//! socket polls HUP); for a listener the kernel's accept queue is merged in
//! (connections the engine cannot carry, e.g. over loopback).
//!
//! Records are type-stable (`nanowire_shimcore::pool`): a pointer read
//! from the table stays valid if another thread closes the fd, because a
//! record is never freed; the engine object inside is taken out on the
//! last close and the record goes back to its pool, to be reused for a
//! later socket. A lookup ([`lookup`], `ops::of`) returns a [`TcpRef`]: the
//! record with the generation it had while the fd named it. Everything
//! that reaches the connection goes through [`TcpRef::get`], which checks
//! that generation under the record's lock (the incarnation ends under the
//! same lock), so a call racing the close of its own fd gets the closed
//! fd's answer (EBADF), never the socket that reused the record. The few
//! per-connection flags a call stores after it reached the connection
//! (connect outcome, reset reported) are stored under that lock too
//! ([`TcpRef::locked`]). Left unchecked: the application's mode and
//! timeouts (`Common`: O_NONBLOCK, SO_RCVTIMEO/SNDTIMEO, SHUT_RD), which an
//! fcntl/setsockopt racing the close of its own fd and the reuse of the
//! record by a new socket, in the nanoseconds between its lookup and its
//! store, would set on the new socket (the kernel: EBADF or the old file).
//! Memory is bounded by the peak number of engine sockets open at once.

use crate::adapt::Turn;
use crate::log::log;
use crate::real;
use crate::spin::{self, errno, now_ns, set_errno};
use crate::sys::{Moved, engine_call};
use crate::table;
use crate::uaccess::fault;
use libc::{c_int, c_void, sockaddr, socklen_t};
use nanowire_options::Level;
use nanowire_shimcore::fdtable::Ref;
use nanowire_shimcore::pool::{FdLists, Link, Pool, Pooled};
use nanowire_shimcore::sock::Common;
use nanowire_stack::xdp::{
    Armed, COAST_TURNS, TcpIdle, XdpTcpError, XdpTcpListener, XdpTcpState, XdpTcpStream, tcp_ready,
};
use nanowire_stack::{EngineKind, EngineOptions, WaitPolicy};
use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// What the engine serves for one socket.
pub enum Inner {
    Listener(XdpTcpListener),
    Stream(XdpTcpStream),
}

/// One engine socket's record (type-stable: see the module doc). Every
/// field a later incarnation sets is an atomic or behind a lock: a thread
/// still holding an earlier incarnation may read it.
pub struct Tcp {
    /// The engine object; `None` once closed. Its generation is checked
    /// under this lock ([`TcpRef::get`]).
    inner: Mutex<Option<Arc<Inner>>>,
    listener: AtomicBool,
    /// The application's blocking mode and timeouts, shutdown(SHUT_RD),
    /// the fds referring to it (dup), the process that made it, and the
    /// record's generation.
    pub common: Common,
    /// Its place in [`POOL`].
    link: Link,
    /// connect() in progress (non-blocking): SO_ERROR and poll finish it.
    connecting: AtomicBool,
    /// The failed connect's errno, until SO_ERROR (or connect) reports it.
    connect_err: std::sync::atomic::AtomicI32,
    /// The connect failed (a later connect() says so, then starts afresh).
    connect_failed: AtomicBool,
    /// A connect() call has reported the connection established (the
    /// kernel's SS_CONNECTED: a further connect() is EISCONN; until then
    /// the connect() that finds it established returns 0).
    connect_reported: AtomicBool,
    /// An EPIPE after a reset: the first send reports ECONNRESET, later
    /// ones EPIPE (as Linux).
    reset_reported: AtomicBool,
    /// The application's fd is the kernel reservation (listener, client):
    /// on close a duplicate keeps the port until the engine is done.
    adopted: AtomicBool,
    /// The fds a sleeping wait polls: an interned list (never freed,
    /// see [`intern_fds`]).
    wait_fds: AtomicPtr<Box<[c_int]>>,
    /// Keepalive settings (SO_KEEPALIVE, TCP_KEEPIDLE/INTVL/CNT).
    ka: Mutex<(bool, u64, u64, u32)>,
    /// A hand-over to the kernel is under way (`handover::hand`): the
    /// stack may have forgotten the connection before the fds name the
    /// kernel socket; a call that meets the gap waits ([`handed_over`]).
    pub handing: AtomicBool,
    /// A listener's backlog (a forked child's copy listens with it).
    backlog: AtomicU32,
    /// A listener kept on the engine service across fork (issue 24): a
    /// forked child serves its copy on its own engine ([`adopt_inherited`]).
    shared: AtomicBool,
}

// SAFETY: the only type of the shim with kind Tcp; aligned to 8 (atomics).
unsafe impl table::Record for Tcp {
    const KIND: table::Kind = table::Kind::Tcp;
    fn common(&self) -> &Common {
        &self.common
    }
}

// SAFETY: `link` is the field `record` fills with the pool's link.
unsafe impl Pooled for Tcp {
    fn link(&self) -> &Link {
        &self.link
    }
}

/// The TCP records: reused, never freed.
static POOL: Pool<Tcp> = Pool::new();

/// A TCP record as a lookup found it (see the module doc): the record and
/// its generation then.
#[derive(Clone, Copy)]
pub struct TcpRef(Ref<Tcp>);

impl std::ops::Deref for TcpRef {
    type Target = Tcp;
    #[inline(always)]
    fn deref(&self) -> &Tcp {
        &self.0
    }
}

impl From<Ref<Tcp>> for TcpRef {
    fn from(r: Ref<Tcp>) -> TcpRef {
        TcpRef(r)
    }
}

impl TcpRef {
    /// The engine object, if this incarnation still has it (the record's
    /// generation is checked under its lock: a record closed and reused
    /// since the lookup answers `None`, as a closed one).
    pub(crate) fn get(self) -> Option<Arc<Inner>> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if !self.0.live() {
            return None;
        }
        g.clone()
    }

    /// Run `f` on the record under its lock if this incarnation is still
    /// alive (for flags a call stores after it reached the connection).
    fn locked(self, f: impl FnOnce(&Tcp)) -> bool {
        let _g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if !self.0.live() {
            return false;
        }
        f(&self);
        true
    }

    /// Run `f` on the engine connection under the record's lock, if this
    /// incarnation is still alive and is one (`None` otherwise): for ONE
    /// attempt of a call (never a wait), without the clone and release of
    /// the `Arc` that [`TcpRef::get`] pays (two atomic read-modify-writes
    /// of the four). Lock order: the record's lock, then the engine's
    /// (core, RX, TX); no engine lock is ever held while a record's is
    /// taken (engine code never enters the shim, and the hand-over's build
    /// takes none). A close waits for the attempt; another call on the
    /// same socket waits at its start for as long as it would have waited
    /// for the engine's core lock, which the attempt holds anyway.
    #[inline]
    fn with_stream<R>(self, f: impl FnOnce(&XdpTcpStream) -> R) -> Option<R> {
        self.with_inner(|i| match i {
            Some(Inner::Stream(s)) => Some(f(s)),
            _ => None,
        })
    }

    /// Run `f` on the engine object under the record's lock (`None`: this
    /// incarnation is closed or has none), as [`TcpRef::with_stream`]: for
    /// one step that never waits (an attempt, the arming before a sleep).
    #[inline]
    fn with_inner<R>(self, f: impl FnOnce(Option<&Inner>) -> R) -> R {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(if self.0.live() { g.as_deref() } else { None })
    }

    /// The engine connection, if this is one.
    pub fn stream_inner(self) -> Option<Arc<Inner>> {
        self.stream()
    }
    /// Is the connection's engine object on the engine service (`None`:
    /// the record has none, e.g. a copy whose connection moved out)?
    pub fn stream_on_service(self) -> Option<bool> {
        self.stream()
            .map(|i| matches!(&*i, Inner::Stream(s) if s.on_service()))
    }
    fn stream(self) -> Option<Arc<Inner>> {
        self.get().filter(|i| matches!(**i, Inner::Stream(_)))
    }

    /// The record (for the table: another fd names the same incarnation).
    pub fn record(self) -> &'static Tcp {
        self.0.record()
    }

    /// The same record and incarnation?
    pub fn same(self, o: TcpRef) -> bool {
        self.0.same(&o.0)
    }

    /// Take the engine object out, if this incarnation still has it.
    fn take(self) -> Option<Arc<Inner>> {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if !self.0.live() {
            return None;
        }
        g.take()
    }

    /// One more fd refers to this incarnation (dup); `false` if it has
    /// none any more (closed meanwhile).
    pub fn add_ref(self) -> bool {
        self.common.add_ref_if(self.0.generation())
    }
}

/// The interned wait-fd lists: records of one engine share one list
/// (`FdLists`: never freed; 256 distinct lists at most are interned
/// (engines × listeners), past that each is leaked).
static WAIT_LISTS: FdLists<256> = FdLists::new();

/// The interned list equal to `fds`.
fn intern_fds(fds: Vec<c_int>) -> *mut Box<[c_int]> {
    std::ptr::from_ref(WAIT_LISTS.intern(fds)).cast_mut()
}
static PID: AtomicU32 = AtomicU32::new(0);
/// The process the shim was loaded into (not updated at fork).
static OWNER: AtomicU32 = AtomicU32::new(0);

pub fn init() {
    PID.store(std::process::id(), Ordering::Relaxed);
    OWNER.store(std::process::id(), Ordering::Relaxed);
    nanowire_stack::xdp::set_tcp_service_wrapper(|f| engine_call(f));
    // SAFETY: plain extern "C" handlers; `before_fork` takes the locks any
    // call on the sockets takes, before the fork.
    unsafe { libc::pthread_atfork(None, None, Some(after_fork_child)) };
    // SAFETY: registering a plain extern "C" function.
    unsafe { libc::atexit(at_exit) };
}

/// How long exit() lets its closing connections go without any progress
/// (nothing acknowledged or received, no state change) before it resets
/// them (NANOWIRE_TCP_EXIT_LINGER_MS; default 10 s). While the peer makes
/// progress the exit waits, as the kernel's orphaned sockets would carry on.
fn exit_linger() -> std::time::Duration {
    let ms = std::env::var("NANOWIRE_TCP_EXIT_LINGER_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000u64);
    std::time::Duration::from_millis(ms)
}

/// exit(): the kernel closes every fd of a process that exits and then
/// finishes the connections on its own; the engine ends with the process.
/// So close this process's engine sockets now (FIN, or RST where close
/// would send one) and finish them while their peers make progress
/// (`tcp_drain`); those that stall are reset, said at the default level.
extern "C" fn at_exit() {
    exiting();
}

/// Set once this process has finished its engine connections for exit.
static EXITED: AtomicBool = AtomicBool::new(false);

/// The process is exiting (exit(), `_exit`, `_Exit`, `syscall(SYS_exit_group)`):
/// finish this process's engine connections as `at_exit` says, once. A
/// vfork child (which shares this memory but is another process; its exit
/// must not touch its parent's connections) does nothing.
pub fn exiting() {
    let me = PID.load(Ordering::Relaxed);
    // SAFETY: getpid has no preconditions (glibc does not cache it).
    if me == 0 || me != unsafe { libc::getpid() } as u32 {
        return;
    }
    // A forked child's engine is its parent's copy (a lock another thread
    // held at fork stays held in it): its connections went to the kernel
    // at fork, so there is nothing of its own to finish here.
    // Its copies of connections a parent shared at fork: no longer held
    // by this process (counted down once).
    static DROPPED: AtomicBool = AtomicBool::new(false);
    let mut held: Vec<u64> = Vec::new();
    table::each_record::<Tcp>(|_, t| {
        let t = TcpRef(t);
        if !t.mine() && t.common.share() != 0 && !t.listener() && !held.contains(&t.common.share())
        {
            held.push(t.common.share());
        }
    });
    crate::accel::owner_leaving("this process exits, its forked child holds it", true);
    for h in crate::accel::shared_copies() {
        if !held.contains(&h) {
            held.push(h);
        }
    }
    if !DROPPED.swap(true, Ordering::AcqRel) {
        for h in held {
            crate::forkshare::dropped(h);
        }
    }
    if me != OWNER.load(Ordering::Relaxed) && !ADOPTED.load(Ordering::Acquire) {
        return;
    }
    if EXITED.swap(true, Ordering::AcqRel) {
        return;
    }
    let e = errno();
    if let Some(f) = PARKED_EXIT.get() {
        f();
    }
    let mut fds = Vec::new();
    table::each_record::<Tcp>(|fd, t| {
        if t.common.mine(me) {
            fds.push(fd);
        }
    });
    for fd in fds {
        if let Some(t) = table::take_record::<Tcp>(fd) {
            close_record(t.into(), fd, true);
        }
    }
    let idle = exit_linger();
    let d = engine_call(|| nanowire_stack::xdp::tcp_drain(idle));
    if d.reset > 0 {
        log!(
            Level::Warn,
            "exit: {} tcp connection(s) made no progress for {} ms while closing: reset (RST)",
            d.reset,
            idle.as_millis()
        );
    }
    match d.time_wait_note {
        Some(note) => log!(Level::Info, "exit: {note}"),
        None => {
            // Nothing is left for this process's warden (an engine of its
            // own) to end: it lets the XDP link go now rather than once it
            // sees the death, so the next program on the interface (a
            // shell's next command) attaches at once instead of finding
            // it held (EBUSY).
            let _ = engine_call(|| {
                nanowire_stack::xdp::service::warden::release_link(
                    std::time::Duration::from_millis(100),
                )
            });
        }
    }
    if d.time_wait > 0 {
        log!(
            Level::Debug,
            "exit: {} tcp connection(s) in TIME-WAIT handed to the kernel",
            d.time_wait
        );
    }
    set_errno(e);
}

/// A child process is about to share some of this process's fds (fork,
/// vfork, posix_spawn, exec: `inherits` says which): engine listeners
/// among them go back to the kernel (`why` says by what), candidates among
/// them stay kernel sockets. Returns the engine connections among them,
/// which the caller hands over to the kernel (`handover::prepare_child`).
pub fn prepare_child(inherits: &dyn Fn(c_int) -> bool, why: &str, fork: bool) -> Vec<c_int> {
    let me = PID.load(Ordering::Relaxed);
    let mut ls: Vec<c_int> = Vec::new();
    table::each_record::<Tcp>(|fd, t| {
        if t.common.mine(me) && t.listener() && inherits(fd) {
            ls.push(fd);
        }
    });
    let e = errno();
    listeners_to_kernel(ls, why, fork);
    // Connections: both processes share each one, as plainly; only the
    // kernel can serve it to both. At fork the hand-over waits until the
    // child uses its copy (`forkshare`): until then the connection stays
    // on this process's engine.
    let mut conns: Vec<c_int> = Vec::new();
    let mut shared: Vec<(c_int, TcpRef)> = Vec::new();
    let mut inherited: Vec<(c_int, TcpRef)> = Vec::new();
    let mut placeholders: Vec<(c_int, TcpRef)> = Vec::new();
    table::each_record::<Tcp>(|fd, t| {
        let t = TcpRef(t);
        if t.listener() || !inherits(fd) {
            return;
        }
        if crate::placeholder::is_template(table::identity(fd)) {
            placeholders.push((fd, t));
        }
        if t.common.mine(me) {
            if fork && !shared.iter().any(|(_, o)| o.same(t)) {
                shared.push((fd, t));
            } else if !fork {
                conns.push(fd);
            }
        } else if t.common.share() != 0 && !inherited.iter().any(|(_, o)| o.same(t)) {
            inherited.push((fd, t));
        }
    });
    // The child's copy must be a socket of its own: a hand-over goes into
    // it (in place, for both processes), the child may set options on it.
    for (fd, t) in placeholders {
        own_placeholder(t, fd);
    }
    for (fd, t) in shared {
        match crate::forkshare::share(t.common.share(), shared_conn(fd, t)) {
            Some(h) => {
                if t.common.swap_share(h) != h {
                    log!(
                        Level::Info,
                        "fd {fd} tcp: shared with the forked child: stays on the xdp engine until the child uses it too"
                    );
                }
            }
            None => conns.push(fd),
        }
    }
    // A forked child's copies of its parent's shared connections: held by
    // one more process at fork; the program a spawn or exec starts gets
    // the kernel's connection (it cannot ask the owner).
    for (fd, t) in inherited {
        if fork {
            crate::forkshare::held_again(t.common.share());
        } else {
            // The new program cannot take it (this image goes): the kernel's.
            let h = t.common.share();
            // On an engine of its own the owner's engine holds the
            // interface: the new image could not take it back.
            let alone =
                t.stream_on_service() == Some(true) && crate::forkshare::holders(h) == Some(1);
            let owner = crate::forkshare::owner_of(h);
            claim_inherited(fd, t, false);
            // Its owner had closed it (kept it for this child) and no other
            // child holds it: this process alone has the kernel's
            // connection now, which the new image may take back.
            if alone && owner.is_some_and(|o| !holds_socket_long(o, fd)) {
                crate::execnames::note_sole(fd);
            }
        }
    }
    table::each_with(table::F_TCAND, |fd| {
        if inherits(fd) {
            table::clear_flags(fd, table::F_TCAND);
        }
    });
    set_errno(e);
    conns
}

/// Does process `pid` hold the socket `fd` names (an fd of its naming the
/// same inode)? Asked a few times over ~5 ms: an owner that kept a
/// connection for its child closes its last duplicate just after the
/// hand-over. A process that is gone holds nothing; one whose fds cannot
/// be read holds it, for all this process can tell.
fn holds_socket_long(pid: u32, fd: c_int) -> bool {
    // SAFETY: the fd is only borrowed for one fstat.
    let b = unsafe { rustix::fd::BorrowedFd::borrow_raw(fd) };
    let Ok(st) = rustix::fs::fstat(b) else {
        return true;
    };
    let want = format!("socket:[{}]", st.st_ino);
    for i in 0..5 {
        let dir = match std::fs::read_dir(format!("/proc/{pid}/fd")) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return false,
            Err(_) => return true,
        };
        let held = dir
            .flatten()
            .any(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.as_os_str() == want.as_str()));
        if !held {
            return false;
        }
        if i < 4 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    true
}

/// Engine listeners `ls` go back to their kernel sockets, which listen
/// already (`why` says why, at warn); at `fork` one on the engine service
/// stays on it, shared with the child ([`share_at_fork`]). A thread
/// blocked in accept on one keeps going: it takes the kernel's
/// connections (the listener object goes when it lets go).
fn listeners_to_kernel(ls: Vec<c_int>, why: &str, fork: bool) {
    for fd in ls {
        if fork && share_at_fork(fd) {
            continue;
        }
        // The record the fd names now (the application's other threads
        // run); it is left to the pool's care never (a listener's other
        // numbers, not inherited, may still name it).
        let Some(t) = table::take_record::<Tcp>(fd).map(TcpRef) else {
            continue;
        };
        if t.get().is_some() {
            close_record(t, fd, false);
            log!(
                Level::Warn,
                "fd {fd} tcp listener: back on the kernel: {why}"
            );
        }
        // The application's blocking mode, on the kernel socket.
        // SAFETY: the fd is only borrowed for fcntl calls.
        let b = unsafe { rustix::fd::BorrowedFd::borrow_raw(fd) };
        if let Ok(mut f) = rustix::fs::fcntl_getfl(b) {
            f.set(rustix::fs::OFlags::NONBLOCK, t.common.nonblock());
            let _ = rustix::fs::fcntl_setfl(b, f);
        }
    }
}

/// The engine service of an engine of this process is gone: its listeners
/// go back to their kernel sockets (`why`, at warn), and its connections
/// are returned (one fd per connection) for the caller to hand over to
/// the kernel or reset (`handover::service_lost`).
pub fn service_lost(why: &str) -> Vec<c_int> {
    let me = PID.load(Ordering::Relaxed);
    let (mut ls, mut conns): (Vec<c_int>, Vec<(c_int, TcpRef)>) = (Vec::new(), Vec::new());
    table::each_record::<Tcp>(|fd, t| {
        let t = TcpRef(t);
        if !t.common.mine(me) {
            return;
        }
        let lost = t.get().is_some_and(|i| match &*i {
            Inner::Listener(l) => l.service_lost(),
            Inner::Stream(s) => s.service_lost(),
        });
        if !lost {
            return;
        }
        if t.listener() {
            ls.push(fd);
        } else if !conns.iter().any(|(_, c)| c.same(t)) {
            conns.push((fd, t));
        }
    });
    let e = errno();
    listeners_to_kernel(ls, why, false);
    set_errno(e);
    conns.into_iter().map(|(fd, _)| fd).collect()
}

/// Reset (RST) the engine connection behind `fd`; a call waiting on it
/// returns the error at once (ECONNABORTED, as the kernel's abort).
pub fn abort(fd: c_int) {
    if let Some(t) = lookup(fd)
        && let Some(i) = t.stream()
        && let Inner::Stream(s) = &*i
    {
        engine_call(|| s.abort());
        for f in fds_of(t) {
            table::wake(f);
        }
    }
}

/// fork() with an engine listener on the engine service (issue 24): the
/// listener stays on the engine; this process stops accepting from it for
/// now (its workers will: the service spreads new connections over the
/// processes that accept, and steers none here until this process accepts
/// or polls the listener again), and the child serves its copy on an
/// engine of its own ([`adopt_inherited`]). False: not on the service (an
/// engine of its own cannot share the interface): back on the kernel.
fn share_at_fork(fd: c_int) -> bool {
    let Some(t) = by_fd(fd) else {
        return false;
    };
    let Some(i) = t.get() else {
        return false;
    };
    let Inner::Listener(l) = &*i else {
        return false;
    };
    if !engine_call(|| l.on_service()) {
        return false;
    }
    match engine_call(|| l.stop_accepting(fd)) {
        Ok(()) => {
            t.shared.store(true, Ordering::Release);
            log!(
                Level::Info,
                "fd {fd} tcp listener: shared with the forked child through the engine service (this process accepts again when it next accepts or polls it)"
            );
            true
        }
        Err(e) => {
            log!(
                Level::Warn,
                "fd {fd} tcp listener: cannot share it with the forked child through the engine service: {e}"
            );
            false
        }
    }
}

/// Set once this (forked) process serves an inherited listener on an
/// engine of its own: its exit finishes its connections.
static ADOPTED: AtomicBool = AtomicBool::new(false);

/// `fd` names a listener a parent shared at fork through the engine
/// service (issue 24): serve this process's copy on an engine of its own
/// that joins the listener's group (the service checks that `fd` is the
/// same listening socket); its new connections are then spread over this
/// process too. `None`: not such a listener, or the join failed (said
/// once, at warn): the fd is the kernel's listening socket here.
#[cold]
pub fn adopt_inherited(fd: c_int, t: TcpRef) -> Option<TcpRef> {
    if !t.listener() || !t.shared.load(Ordering::Acquire) {
        return None;
    }
    if table::get(fd) & table::F_INHERIT_LOGGED != 0 {
        return None;
    }
    let backlog = t.backlog.load(Ordering::Relaxed).max(1) as usize;
    let nonblock = t.common.nonblock();
    let e = errno();
    let o = opts_for(fd);
    match engine_call(|| XdpTcpListener::join(fd, backlog, &o)) {
        Ok(l) => {
            let local = l.local_addr();
            let t2 = record(fd, Inner::Listener(l), true, true, nonblock);
            t2.backlog.store(backlog as u32, Ordering::Relaxed);
            ADOPTED.store(true, Ordering::Release);
            log!(
                Level::Info,
                "fd {fd} tcp listener {local}: xdp, shared with the parent process through the engine service"
            );
            set_errno(e);
            Some(t2)
        }
        Err(err) => {
            table::add_flags(fd, table::F_INHERIT_LOGGED);
            log!(
                Level::Warn,
                "fd {fd} tcp listener inherited through fork: on the kernel in this process: {err}"
            );
            set_errno(e);
            None
        }
    }
}

extern "C" fn after_fork_child() {
    PID.store(std::process::id(), Ordering::Relaxed);
    crate::placeholder::after_fork_child();
}

/// The engine record of `fd`, if this process may use it.
#[inline(always)]
pub fn lookup(fd: c_int) -> Option<TcpRef> {
    let t = by_fd(fd)?;
    if t.mine() { Some(t) } else { inherited(fd, t) }
}

/// A forked child's inherited record: a shared listener is served here
/// ([`adopt_inherited`]); anything else stays the parent's (said once).
#[cold]
pub fn inherited(fd: c_int, t: TcpRef) -> Option<TcpRef> {
    if let Some(t2) = adopt_inherited(fd, t) {
        return Some(t2);
    }
    if t.common.share() != 0 && !t.listener() {
        return claim_inherited(fd, t, true);
    }
    note_inherited(fd);
    None
}

/// exec is about to close the fds `closes` says: this process's copies of
/// connections a parent shared at fork among them are no longer held by
/// it (if the exec fails, the owner may have closed the connection: the
/// fd is then an unconnected socket).
pub fn held_until_exec(closes: &dyn Fn(c_int) -> bool) {
    let mut copies = Vec::new();
    table::each_record::<Tcp>(|fd, t| {
        let t = TcpRef(t);
        if !t.mine() && t.common.share() != 0 && !t.listener() {
            copies.push((fd, t.common.share()));
        }
    });
    crate::forkshare::held_until_exec(&copies, closes);
}

/// A forked child's first use of a connection its parent shared at fork
/// (`forkshare`). On the engine service (and `may_take`: not for an exec,
/// whose image goes with its engine) the connection moves to this
/// process's own engine (the first user after the fork takes it: the
/// owner exports its state, this process adopts it and the service steers
/// it here; the returned record serves the call). Otherwise, or if that
/// cannot be, the owner hands it over to the kernel in the socket both
/// hold (or could not: then the fd is an unconnected socket, and the
/// owner said why): this process forgets its copy of the record (never
/// acting on the owner's engine objects) and the kernel answers the fd.
#[cold]
fn claim_inherited(fd: c_int, t: TcpRef, may_take: bool) -> Option<TcpRef> {
    // One claim at a time in this process: a second thread finds the
    // connection moved here by the first.
    static CLAIMING: Mutex<()> = Mutex::new(());
    let _g = CLAIMING.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(t2) = by_fd(fd).filter(|r| r.mine()) {
        return Some(t2);
    }
    let e = errno();
    // A child's copy names the owner's engine object (on the service or
    // not); a former owner's copy (it moved the connection out: on the
    // service) names none.
    let take = may_take && t.stream_on_service().unwrap_or(t.common.pid() == 0);
    let h = t.common.share();
    // This process must be able to serve it (an engine slot on the
    // service, the peer resolved) before it asks for it.
    let taker = crate::forkshare::addrs(h).filter(|_| take).and_then(|(l, r)| {
        let o = opts_for(fd);
        engine_call(|| XdpTcpStream::can_take(l, r, &o))
            .map_err(|err| {
                log!(
                    Level::Info,
                    "fd {fd} tcp: inherited through fork(): not taken onto this process's engine: {err}"
                )
            })
            .ok()
    });
    // An owner that left handed it over to the kernel in the shared socket
    // and left it to the first holder that can take it onto its engine: on
    // the service, or on an engine of its own once the owner is gone (its
    // engine held the interface).
    let own = may_take && t.stream_on_service() == Some(false);
    let mut claimed = crate::forkshare::claim_as(h, taker.is_some(), taker.is_some() || own);
    log!(
        Level::Debug,
        "fd {fd} tcp: claim of a shared connection (take {}, may {may_take}): {}",
        taker.is_some(),
        match &claimed {
            crate::forkshare::Claimed::Kernel => "kernel",
            crate::forkshare::Claimed::Moved { .. } => "moved",
            crate::forkshare::Claimed::Mine => "mine",
            crate::forkshare::Claimed::Orphaned { .. } => "orphaned",
        }
    );
    let mut taker = taker;
    if let crate::forkshare::Claimed::Moved { owner, xfd, xlen } = claimed
        && let Some(taker) = taker.take()
    {
        match take_moved(fd, t, (owner, xfd, xlen), taker) {
            Ok(t2) => {
                crate::forkshare::moved_in(h, true);
                log!(
                    Level::Info,
                    "fd {fd} tcp: inherited through fork(): moved to this process's xdp engine (engine service) from pid {owner}"
                );
                set_errno(e);
                return Some(t2);
            }
            Err(err) => {
                crate::forkshare::moved_in(h, false);
                log!(
                    Level::Warn,
                    "fd {fd} tcp: inherited through fork(): cannot take it onto this process's engine: {err}; the kernel's connection instead"
                );
                claimed = crate::forkshare::claim(h, false);
            }
        }
    }
    if let crate::forkshare::Claimed::Orphaned { owner } = claimed {
        let t2 = ADOPT_ORPHAN
            .get()
            .and_then(|f| f(fd, t, owner, taker.take()));
        // Taken: this process owns the slot while other holders remain
        // (their use asks it, as after a move); else the kernel's for all.
        let h2 = crate::forkshare::orphan_taken(h, t2.is_some());
        if let Some(t2) = t2 {
            if h2 == 0 {
                t2.common.set_share(0);
            }
            set_errno(e);
            return Some(t2);
        }
    }
    if matches!(claimed, crate::forkshare::Claimed::Mine) {
        set_errno(e);
        return by_fd(fd).filter(|r| r.mine());
    }
    for f in fds_of(t) {
        let _ = table::take_record::<Tcp>(f);
    }
    log!(
        Level::Info,
        "fd {fd} tcp: inherited through fork(): the kernel's connection now, shared with the parent process"
    );
    set_errno(e);
    None
}

/// The owner `owner` moved the connection of `t` (this process's copy,
/// `fd` one of its numbers) off its engine, its state in its memfd `xfd`
/// (`xlen` bytes): adopt it on this process's engine and put a record of
/// this process's on every number of `t`, with the application's modes,
/// timeouts and keepalive settings of the copy.
fn take_moved(
    fd: c_int,
    t: TcpRef,
    (owner, xfd, xlen): (u32, u32, u32),
    taker: nanowire_stack::xdp::Taker,
) -> std::io::Result<TcpRef> {
    use std::io::Read;
    let mut bytes = Vec::with_capacity(xlen as usize);
    std::fs::File::open(format!("/proc/{owner}/fd/{xfd}"))?
        .take(u64::from(xlen))
        .read_to_end(&mut bytes)?;
    if bytes.len() != xlen as usize {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the moved state is short",
        ));
    }
    let s = engine_call(|| XdpTcpStream::move_in(fd, &bytes, taker))?;
    Ok(succeed_copy(fd, t, s, None))
}

/// The connection of this process's copy `t` (`fd` one of its numbers) is
/// on this process's engine now, `s`: a record of this process's on every
/// number of `t`, with the application's modes, timeouts, shutdown and
/// keepalive settings of the copy, and its fork-share handle. `from_kernel`:
/// taken from the kernel (an adopted record), with the keepalive settings
/// the kernel had.
pub fn succeed_copy(
    fd: c_int,
    t: TcpRef,
    s: XdpTcpStream,
    from_kernel: Option<(bool, u64, u64, u32)>,
) -> TcpRef {
    let fds = fds_of(t);
    for &f in &fds {
        let _ = table::take_record::<Tcp>(f);
    }
    let t2 = record(
        fd,
        Inner::Stream(s),
        false,
        from_kernel.is_some(),
        t.common.nonblock(),
    );
    t2.common.set_rcvtimeo_ns(t.common.rcvtimeo_ns());
    t2.common.set_sndtimeo_ns(t.common.sndtimeo_ns());
    if t.common.rd_shut() {
        t2.common.shut_rd();
    }
    *t2.ka.lock().unwrap_or_else(|e| e.into_inner()) =
        from_kernel.unwrap_or(*t.ka.lock().unwrap_or_else(|e| e.into_inner()));
    t2.common.set_share(t.common.share());
    for &f in fds.iter().filter(|&&f| f != fd) {
        if t2.add_ref() {
            table::set_record(f, t2.record());
        }
    }
    ADOPTED.store(true, Ordering::Release);
    t2
}

/// The connection the engine took from the kernel socket `fd` (issue 24
/// item 2, `handover::adopt_connected`): a record on `fd` with the
/// application's blocking mode, timeouts and keepalive settings as the
/// kernel socket had them. The socket stays the fd's (unconnected now,
/// bound to the local address: it holds the port, as the kernel's
/// connection did).
pub fn adopted_stream(fd: c_int, s: XdpTcpStream, ka: (bool, u64, u64, u32)) -> TcpRef {
    let nonblock = app_nonblock(fd);
    let t = record(fd, Inner::Stream(s), false, true, nonblock);
    // SAFETY: the fd is only borrowed for two getsockopt calls.
    let b = unsafe { rustix::fd::BorrowedFd::borrow_raw(fd) };
    let ns = |w| match rustix::net::sockopt::socket_timeout(b, w) {
        Ok(Some(d)) => u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1),
        _ => 0,
    };
    t.common
        .set_rcvtimeo_ns(ns(rustix::net::sockopt::Timeout::Recv));
    t.common
        .set_sndtimeo_ns(ns(rustix::net::sockopt::Timeout::Send));
    *t.ka.lock().unwrap_or_else(|e| e.into_inner()) = ka;
    ADOPTED.store(true, Ordering::Release);
    t
}

/// [`opts_read`] of a socket this program did not make.
pub fn opts_unknown(fd: c_int) -> EngineOptions {
    opts_read(fd, true)
}

/// `fd` is a forked child's inherited engine connection: say so, once.
#[cold]
pub fn note_inherited(fd: c_int) {
    if table::first_time(fd, table::F_INHERIT_LOGGED) {
        log!(
            Level::Warn,
            "fd {fd} tcp: inherited through fork(): the connection stays with the parent's engine; in this process the fd is an unconnected kernel socket (ENOTCONN)"
        );
    }
}

/// Any record (this process's or an inherited one).
pub fn by_fd(fd: c_int) -> Option<TcpRef> {
    table::record_ref::<Tcp>(fd).map(TcpRef)
}

impl Tcp {
    /// Usable by this process (not a forked child's inherited copy).
    #[inline(always)]
    pub fn mine(&self) -> bool {
        self.common.mine(PID.load(Ordering::Relaxed))
    }
    /// A listener (else a connection).
    #[inline(always)]
    pub fn listener(&self) -> bool {
        self.listener.load(Ordering::Relaxed)
    }
    /// The fds a sleeping wait on the socket polls.
    pub fn wait_fds(&self) -> &'static [c_int] {
        let p = self.wait_fds.load(Ordering::Acquire);
        if p.is_null() {
            return &[];
        }
        // SAFETY: a list from `intern_fds`, published with Release by
        // `record` and never freed.
        unsafe { &*p }
    }
    /// The engine object, for the one thread that owns this incarnation's
    /// end (its last fd closed, or every fd was taken off it).
    fn take_inner(&self) -> Option<Arc<Inner>> {
        self.lock_inner().take()
    }
    fn lock_inner(&self) -> MutexGuard<'_, Option<Arc<Inner>>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// A record for the pool to keep: as a new socket's, before `record`
    /// fills it in.
    fn blank(link: Link) -> Tcp {
        Tcp {
            inner: Mutex::new(None),
            listener: AtomicBool::new(false),
            common: Common::new(0, false, 0),
            link,
            connecting: AtomicBool::new(false),
            connect_err: std::sync::atomic::AtomicI32::new(0),
            connect_failed: AtomicBool::new(false),
            connect_reported: AtomicBool::new(true),
            reset_reported: AtomicBool::new(false),
            adopted: AtomicBool::new(false),
            wait_fds: AtomicPtr::new(std::ptr::null_mut()),
            ka: Mutex::new((false, 7200, 75, 9)),
            handing: AtomicBool::new(false),
            backlog: AtomicU32::new(0),
            shared: AtomicBool::new(false),
        }
    }
}

fn opts() -> EngineOptions {
    let cfg = spin::STATE.get().and_then(|s| s.cfg.as_ref());
    let mut o = EngineOptions::new(EngineKind::Xdp);
    o.wait = WaitPolicy::Spin;
    o.fallback = false;
    o.ring_depth = cfg.map_or(16384, |c| c.ring_depth);
    o.iface = cfg.and_then(|c| c.iface.clone());
    o
}

/// `opts()`, with the buffer sizes the application gave the socket `fd`
/// (SO_RCVBUF/SO_SNDBUF before listen or connect; connections a listener
/// accepts inherit its sizes, as in the kernel). A size counts as given
/// when the kernel socket's differs from a fresh socket's: the kernel
/// reports twice what was asked for, and the engine's ring gets what was
/// asked for (at least 4 KiB).
fn opts_for(fd: c_int) -> EngineOptions {
    opts_read(fd, false)
}

/// [`opts_for`]; `unknown`: a socket made before this program (exec), whose
/// options this process never saw set: read them.
fn opts_read(fd: c_int, unknown: bool) -> EngineOptions {
    let mut o = opts();
    // Nothing set IP_TTL/IP_TOS: the engine's once-read defaults (no
    // getsockopt per connect).
    o.ip_header_default = !unknown && !crate::opts::set_any(crate::opts::SET_IP);
    o.reuseaddr_unset = !unknown && !crate::opts::set_any(crate::opts::SET_REUSE);
    if !unknown && !crate::opts::set_any(crate::opts::SET_BUFFERS) {
        // The kernel's defaults: nothing given (no getsockopt).
        return o;
    }
    let (drcv, dsnd) = fresh_buffer_sizes();
    for (name, slot, d) in [
        (libc::SO_RCVBUF, &mut o.rcvbuf, drcv),
        (libc::SO_SNDBUF, &mut o.sndbuf, dsnd),
    ] {
        if let (Some(v), Some(d)) = (get_int(fd, libc::SOL_SOCKET, name), d)
            && v != d
        {
            *slot = Some((v.max(0) as usize / 2).max(4096));
        }
    }
    o
}

/// SO_RCVBUF and SO_SNDBUF of a fresh TCP socket (the sysctl defaults),
/// read once per process: not a socket per connect.
fn fresh_buffer_sizes() -> (Option<c_int>, Option<c_int>) {
    static SIZES: std::sync::OnceLock<(Option<c_int>, Option<c_int>)> = std::sync::OnceLock::new();
    *SIZES.get_or_init(|| {
        // SAFETY: plain socket(2); closed below.
        let fresh =
            unsafe { real::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        if fresh < 0 {
            return (None, None);
        }
        let v = (
            get_int(fresh, libc::SOL_SOCKET, libc::SO_RCVBUF),
            get_int(fresh, libc::SOL_SOCKET, libc::SO_SNDBUF),
        );
        // SAFETY: the socket made above, ours.
        unsafe { real::close(fresh) };
        v
    })
}

/// Before sleeping on `t`'s wait fds: frames another thread queues for its
/// engine stack signal them until the sleep ends (drop what this returns
/// then; see `XdpTcpStream::sleep_arm`). `None`: frames are queued already;
/// turn instead of sleeping.
pub fn arm(t: TcpRef) -> Option<Option<Armed>> {
    // Under the record's lock (the arming never waits), without the
    // clone and release of the engine object's `Arc` (two atomic
    // read-modify-writes a sleep) that [`TcpRef::get`] pays.
    t.with_inner(|i| match i {
        Some(Inner::Stream(s)) => engine_call(|| s.sleep_arm()).map(Some),
        Some(Inner::Listener(l)) => engine_call(|| l.sleep_arm()).map(Some),
        None => Some(None),
    })
}

/// [`arm`] once per engine in `pass`: the sockets of one engine stack
/// (an event loop's listener and its connections) share its wake-up, so
/// the second and later ones have nothing to arm (`Some(None)`).
pub fn arm_in(t: TcpRef, pass: &mut Pass) -> Option<Option<Armed>> {
    let Some(i) = t.get() else {
        return Some(None);
    };
    match &*i {
        Inner::Stream(s) if pass.first(s.engine_key()) => engine_call(|| s.sleep_arm()).map(Some),
        Inner::Listener(l) if pass.first(l.engine_key()) => engine_call(|| l.sleep_arm()).map(Some),
        _ => Some(None),
    }
}

/// The lowest fd number for the duplicates that keep a closed
/// connection's port in the kernel until the engine has finished it:
/// high, so that they never take the small numbers an application's next
/// sockets get (as plainly: a connection in TIME-WAIT holds no fd; an
/// event loop sized for its connections, e.g. wrk's, fails past it).
pub fn keep_fd_floor() -> c_int {
    static FLOOR: std::sync::OnceLock<c_int> = std::sync::OnceLock::new();
    *FLOOR.get_or_init(|| {
        // SAFETY: an all-zero rlimit is valid; getrlimit writes it.
        let mut r: libc::rlimit = unsafe { std::mem::zeroed() };
        // SAFETY: a valid out-pointer.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
            return 0;
        }
        let cur = r.rlim_cur.min(1 << 20) as c_int;
        (cur - cur / 4).clamp(0, 4096)
    })
}

/// Size the process's fd table for the keep duplicates now, at load, while
/// the process has one thread: the kernel grows a table shared by several
/// threads only after a `synchronize_rcu` (fs/file.c `expand_fdtable`,
/// ~10 ms here), which the first close of an engine connection otherwise
/// paid inside the application's timing (its engine threads run by then).
/// Costs one table of `keep_fd_floor() + 1` slots (32 KiB at most) and
/// four syscalls per process.
pub fn size_fd_table() {
    let floor = keep_fd_floor();
    if floor <= 0 {
        return;
    }
    // SAFETY: plain eventfd(2); the fd is ours and closed below.
    let e = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if e < 0 {
        return;
    }
    // SAFETY: dup of our own fd to the first free number >= floor.
    let d = unsafe { real::fcntl(e, libc::F_DUPFD_CLOEXEC, floor as u64) };
    // SAFETY: both are fds this function made.
    unsafe {
        if d >= 0 {
            real::close(d);
        }
        real::close(e);
    }
}

fn err_no(e: XdpTcpError) -> c_int {
    match e {
        XdpTcpError::WouldBlock => libc::EAGAIN,
        XdpTcpError::ConnectionRefused => libc::ECONNREFUSED,
        XdpTcpError::ConnectionReset => libc::ECONNRESET,
        XdpTcpError::TimedOut => libc::ETIMEDOUT,
        XdpTcpError::Aborted => libc::ECONNABORTED,
        XdpTcpError::Shutdown => libc::EPIPE,
        XdpTcpError::NotConnected => libc::ENOTCONN,
        XdpTcpError::AddrInUse => libc::EADDRINUSE,
        XdpTcpError::InvalidHandle => libc::EBADF,
        XdpTcpError::TooManyConnections => libc::ENOBUFS,
    }
}

/// A type every bit pattern of which is a value (plain integers), which a
/// getsockopt may fill ([`get_plain`]).
///
/// # Safety
/// Only for types made of integers alone, with no padding that matters.
pub unsafe trait Plain: Copy {}
// SAFETY: an integer.
unsafe impl Plain for c_int {}
// SAFETY: an integer.
unsafe impl Plain for u32 {}
// SAFETY: two ints.
unsafe impl Plain for libc::linger {}
// SAFETY: u8, u32 and u64 fields only.
unsafe impl Plain for libc::tcp_info {}
// SAFETY: five u32 fields.
unsafe impl Plain for nanowire_stack::repair::Window {}

/// Socket option `name` at `level` of the kernel socket `fd` as a `T`
/// (`None`: getsockopt failed).
pub fn get_plain<T: Plain>(fd: c_int, level: c_int, name: c_int) -> Option<T> {
    // SAFETY: T is plain integers: all-zero bytes are a value.
    let mut v: T = unsafe { std::mem::zeroed() };
    let mut l = std::mem::size_of::<T>() as socklen_t;
    // SAFETY: an out-buffer of T and its length.
    let r = unsafe { real::getsockopt(fd, level, name, (&raw mut v).cast(), &mut l) };
    (r == 0).then_some(v)
}

/// An int socket option of the kernel socket `fd`.
pub fn get_int(fd: c_int, level: c_int, name: c_int) -> Option<c_int> {
    get_plain(fd, level, name)
}

/// TCP_INFO of the kernel socket `fd` (`None`: getsockopt failed).
pub fn tcp_info_of(fd: c_int) -> Option<libc::tcp_info> {
    get_plain(fd, libc::IPPROTO_TCP, libc::TCP_INFO)
}

/// Is SO_LINGER on with a zero timeout on the kernel socket `fd` (a close
/// that resets)?
pub fn linger0_of(fd: c_int) -> bool {
    get_plain::<libc::linger>(fd, libc::SOL_SOCKET, libc::SO_LINGER)
        .is_some_and(|lg| lg.l_onoff != 0 && lg.l_linger == 0)
}

/// Options the application set on the kernel socket `from` before the
/// engine took over, applied to the engine connection.
fn inherit_options(from: c_int, s: &XdpTcpStream, t: TcpRef) {
    if !crate::opts::set_any(crate::opts::SET_TCP) {
        // The kernel's defaults, which the engine's connection has.
        return;
    }
    let e = errno();
    if get_int(from, libc::IPPROTO_TCP, libc::TCP_NODELAY).is_some_and(|v| v != 0) {
        let _ = engine_call(|| s.set_nodelay(true));
    }
    if linger0_of(from) {
        let _ = engine_call(|| s.set_linger0(true));
    }
    if get_int(from, libc::SOL_SOCKET, libc::SO_KEEPALIVE).is_some_and(|v| v != 0) {
        let idle = get_int(from, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE).unwrap_or(7200);
        let intvl = get_int(from, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL).unwrap_or(75);
        let cnt = get_int(from, libc::IPPROTO_TCP, libc::TCP_KEEPCNT).unwrap_or(9);
        *t.ka.lock().unwrap_or_else(|e| e.into_inner()) =
            (true, idle as u64, intvl as u64, cnt as u32);
        let _ = engine_call(|| s.set_keepalive(true, idle as u64, intvl as u64, cnt as u32));
    }
    set_errno(e);
}

/// The record of a new engine socket on `fd`: a free one from [`POOL`]
/// (its next incarnation) or a new one.
fn record(fd: c_int, inner: Inner, listener: bool, adopted: bool, nonblock: bool) -> TcpRef {
    record_as(fd, inner, (listener, adopted, nonblock), None)
}

/// [`record`], with the identity of the socket `fd` names when the caller
/// knows it (`ident`: a duplicate of the shared placeholder; else it is
/// asked).
fn record_as(
    fd: c_int,
    inner: Inner,
    (listener, adopted, nonblock): (bool, bool, bool),
    ident: Option<u64>,
) -> TcpRef {
    let wait_fds = match &inner {
        Inner::Listener(l) => {
            let mut v = engine_call(|| l.poll_fds());
            v.push(fd);
            v
        }
        Inner::Stream(s) => engine_call(|| s.poll_fds()),
    };
    let (t, _) = POOL.take(Tcp::blank);
    // No fd names the record yet: the only readers are threads holding an
    // ended incarnation, which check the generation before they use what
    // is set here.
    t.common.reset(PID.load(Ordering::Relaxed), nonblock, 0);
    t.listener.store(listener, Ordering::Relaxed);
    t.adopted.store(adopted, Ordering::Relaxed);
    t.connecting.store(false, Ordering::Relaxed);
    t.connect_err.store(0, Ordering::Relaxed);
    t.connect_failed.store(false, Ordering::Relaxed);
    t.connect_reported.store(true, Ordering::Relaxed);
    t.reset_reported.store(false, Ordering::Relaxed);
    *t.ka.lock().unwrap_or_else(|e| e.into_inner()) = (false, 7200, 75, 9);
    t.handing.store(false, Ordering::Relaxed);
    t.shared.store(false, Ordering::Relaxed);
    if t.wait_fds() != &wait_fds[..] {
        t.wait_fds.store(intern_fds(wait_fds), Ordering::Release);
    }
    let r = TcpRef(Ref::new(t, t.common.generation()));
    *t.lock_inner() = Some(Arc::new(inner));
    match ident {
        Some(c) => table::set_record_as(fd, t, c),
        None => table::set_record(fd, t),
    }
    table::clear_flags(fd, table::F_TCAND);
    r
}

/// Incarnation `t` has no fd and no engine object any more (the caller
/// took every fd off it and closed or forgot its engine object): the
/// record goes back to [`POOL`]. Its generation moves on under the
/// record's lock, so a thread still holding `t` finds it closed.
fn recycle(t: TcpRef) {
    let left = {
        let mut g = t.lock_inner();
        if !t.common.end(t.0.generation()) {
            // Ended by another path already.
            return;
        }
        g.take()
    };
    if let Some(i) = left {
        engine_call(|| drop(i));
    }
    POOL.put(t.0.record());
}

fn app_nonblock(fd: c_int) -> bool {
    !spin::is_blocking(fd)
}

fn log_not(fd: c_int, e: &std::io::Error) {
    let why = e.to_string();
    // Loopback, or a failed engine open the engine remembered (said at
    // the default level at the first failure): info.
    if e.kind() == std::io::ErrorKind::Unsupported
        && (why.contains("loopback") || why.contains(nanowire_stack::xdp::OPEN_REMEMBERED))
    {
        log!(Level::Info, "fd {fd} tcp: kernel socket; xdp not used: {e}");
    } else {
        log!(Level::Warn, "fd {fd} tcp: kernel socket; xdp not used: {e}");
    }
}

// ------------------------------------------------------------- waiting

/// An engine attempt's answer, `None` while it would block.
#[inline(always)]
fn not_yet(r: Result<usize, XdpTcpError>) -> Option<Result<usize, XdpTcpError>> {
    match r {
        Err(XdpTcpError::WouldBlock) => None,
        r => Some(r),
    }
}

/// What a wait gives each attempt of its call.
#[derive(Clone, Copy, Default)]
struct Attempt {
    /// The clock as the wait's last spinning turn read it a moment ago
    /// (`None`: the first attempt, or one after a sleep).
    clock: Option<u64>,
    /// Polls the attempt may make with the engine's locks held before it
    /// answers nothing (`XdpTcpStream::recv_wait`): [`COAST_POLLS`] after a
    /// spinning turn whose next would not yield (`Waiter::may_coast`), 0
    /// otherwise.
    polls: u32,
}

/// An attempt's polls under the engine's locks after a spinning turn: the
/// idle turns a coasting wait answers without the waiter's turn, so that
/// what they defer is deferred as long.
const COAST_POLLS: u32 = COAST_TURNS;

/// One `attempt` of a call that does not wait (EAGAIN when it has no
/// answer), else [`wait_coasting`] for its answer with `timeo_ns`.
#[inline(always)]
fn now_or_wait<R>(
    t: TcpRef,
    fd: c_int,
    dontwait: bool,
    timeo_ns: u64,
    mut attempt: impl FnMut(Attempt) -> Option<R>,
    coast: impl FnMut() -> bool,
) -> Result<R, c_int> {
    if dontwait {
        attempt(Attempt::default()).ok_or(libc::EAGAIN)
    } else {
        wait_coasting(t, fd, timeo_ns, attempt, coast)
    }
}

/// Wait for `attempt` to give an answer: spin per the profile, then sleep
/// on the socket's engine fds in slices. `Err(errno)` on timeout (EAGAIN)
/// or signal (EINTR). An attempt right after a spinning turn is given the
/// clock as that turn read it a moment ago (`Waiter::now`), for the
/// engine's turn to use instead of reading it again when a segment came
/// (a clock read, ~25-35 ns here, between a spinning reader's segment and
/// its `recv` returning); `None` for the first attempt and after a sleep.
fn wait_for<R>(
    t: TcpRef,
    fd: c_int,
    timeo_ns: u64,
    attempt: impl FnMut(Attempt) -> Option<R>,
) -> Result<R, c_int> {
    wait_coasting(t, fd, timeo_ns, attempt, || false)
}

/// [`wait_for`] whose spinning idle turns are answered by `coast` while it
/// says so (a lock-free look: nothing came, `XdpTcpStream::coast`) and
/// the waiter allows it (`Waiter::may_coast`: what the skipped turns defer,
/// a signal, a close or shutdown by another thread, the timeout, the
/// yield, is seen at most `coast`'s bound of turns late, well under a µs
/// each). The attempt after them gets the clock of the last waiter turn,
/// those turns old.
fn wait_coasting<R>(
    t: TcpRef,
    fd: c_int,
    timeo_ns: u64,
    mut attempt: impl FnMut(Attempt) -> Option<R>,
    mut coast: impl FnMut() -> bool,
) -> Result<R, c_int> {
    if let Some(r) = attempt(Attempt::default()) {
        return Ok(r);
    }
    let s0 = crate::signals::seq();
    let mut w = crate::adapt::waiter(fd, table::get(fd), s0, timeo_ns, 5_000_000);
    loop {
        match w.turn() {
            Turn::Interrupted => return Err(libc::EINTR),
            Turn::TimedOut => return Err(libc::EAGAIN),
            Turn::Closed | Turn::Woken => {
                // Closed (or shut down) by another thread.
                return attempt(Attempt::default()).ok_or(libc::EBADF);
            }
            Turn::Spin => {
                while w.may_coast() && coast() {
                    core::hint::spin_loop();
                }
                let polls = if w.may_coast() { COAST_POLLS } else { 0 };
                let a = Attempt {
                    clock: Some(w.now()),
                    polls,
                };
                if let Some(r) = attempt(a) {
                    return Ok(r);
                }
                continue;
            }
            // Frames queued for the stack (arm() says no) are taken in
            // by the attempt first.
            Turn::Sleep(ns) => {
                if let Some(_armed) = arm(t) {
                    crate::adapt::sleep_on_fds(t.wait_fds(), ns);
                }
            }
        }
        if let Some(r) = attempt(Attempt::default()) {
            return Ok(r);
        }
    }
}

// -------------------------------------------------------------- setup

/// listen() on a candidate. The engine claims the port first, then the
/// kernel listens (it keeps the port and answers what the engine cannot
/// take, e.g. loopback): the other way round, the kernel completes the
/// handshakes that arrive between its listen and the claim, and the engine,
/// which has no such connection, resets them. A socket not bound yet
/// (listen binds it to an ephemeral port) listens first: nobody knows its
/// port before. `None`: not a candidate, the caller makes the real call.
pub fn listen(fd: c_int, backlog: c_int) -> Option<c_int> {
    if table::get(fd) & table::F_TCAND == 0 {
        return None;
    }
    let bound = bound_port(fd) != 0;
    if !bound {
        // SAFETY: the caller's arguments.
        let r = unsafe { real::listen(fd, backlog) };
        if r != 0 {
            return Some(r);
        }
    }
    let e = errno();
    let nonblock = app_nonblock(fd);
    // SAFETY: the fd is only borrowed for fcntl calls.
    let b = unsafe { rustix::fd::BorrowedFd::borrow_raw(fd) };
    let fl = rustix::fs::fcntl_getfl(b).unwrap_or(rustix::fs::OFlags::empty());
    let o = opts_for(fd);
    match engine_call(|| XdpTcpListener::adopt(fd, backlog.max(1) as usize, &o)) {
        Ok(l) => {
            if bound {
                // SAFETY: the caller's arguments.
                let r = unsafe { real::listen(fd, backlog) };
                if r != 0 {
                    // The kernel refuses (e.g. EADDRINUSE): so does listen.
                    let en = errno();
                    engine_call(|| l.close());
                    table::clear_flags(fd, table::F_TCAND);
                    set_errno(en);
                    return Some(r);
                }
            }
            let local = serve_listener(fd, l, backlog.max(1) as u32, nonblock, fl);
            log!(Level::Info, "fd {fd} tcp listener {local}: xdp");
        }
        Err(err) => {
            table::clear_flags(fd, table::F_TCAND);
            log_not(fd, &err);
            if bound {
                // SAFETY: the caller's arguments.
                return Some(unsafe { real::listen(fd, backlog) });
            }
        }
    }
    set_errno(e);
    Some(0)
}

/// Record the engine listener `l` serving the listening socket `fd`
/// (`fl`: its file status flags, `nonblock` the application's mode).
fn serve_listener(
    fd: c_int,
    l: XdpTcpListener,
    backlog: u32,
    nonblock: bool,
    fl: rustix::fs::OFlags,
) -> std::net::SocketAddrV4 {
    // SAFETY: the fd is only borrowed for an fcntl call.
    let b = unsafe { rustix::fd::BorrowedFd::borrow_raw(fd) };
    // Underneath non-blocking: the kernel's accept queue is looked at
    // without waiting; the application's mode is kept in the record.
    let _ = rustix::fs::fcntl_setfl(b, fl | rustix::fs::OFlags::NONBLOCK);
    let local = l.local_addr();
    let t = record(fd, Inner::Listener(l), true, true, nonblock);
    t.backlog.store(backlog, Ordering::Relaxed);
    local
}

/// An IPv4 listening socket this process's shim did not make (inherited
/// through exec, the systemd socket-activation shape, or received):
/// served on the engine as `listen` serves a fresh one (`inherit`). The
/// backlog is the kernel's (TCP_INFO of a listener reports it), the
/// buffer sizes and IP header the socket's own. False: it stays the
/// kernel's, with the reason said as for a fresh listener.
#[cold]
pub fn adopt_listening(fd: c_int) -> bool {
    // A listener's TCP_INFO: tcpi_sacked is its backlog (sk_max_ack_backlog).
    let backlog = tcp_info_of(fd).map_or(128, |ti| ti.tcpi_sacked.max(1));
    if get_int(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT).is_some_and(|v| v != 0) {
        log!(
            Level::Warn,
            "fd {fd} tcp listener: kernel socket; xdp not used: SO_REUSEPORT is set on it (the engine cannot honour it)"
        );
        return false;
    }
    let nonblock = app_nonblock(fd);
    // SAFETY: the fd is only borrowed for fcntl calls.
    let b = unsafe { rustix::fd::BorrowedFd::borrow_raw(fd) };
    let fl = rustix::fs::fcntl_getfl(b).unwrap_or(rustix::fs::OFlags::empty());
    let o = opts_read(fd, true);
    match engine_call(|| XdpTcpListener::adopt(fd, backlog as usize, &o)) {
        Ok(l) => {
            let local = serve_listener(fd, l, backlog, nonblock, fl);
            log!(
                Level::Info,
                "fd {fd} tcp listener {local}: xdp (a listening socket this program did not make: inherited through exec, or received)"
            );
            true
        }
        Err(err) => {
            log_not(fd, &err);
            false
        }
    }
}

/// The port `fd` is bound to (0: none, or not IPv4).
fn bound_port(fd: c_int) -> u16 {
    // SAFETY: an all-zero sockaddr_in is a valid out-buffer.
    let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as socklen_t;
    // SAFETY: sa/len are valid for writes of len bytes.
    let r = unsafe { real::getsockname(fd, (&raw mut sa).cast(), &mut len) };
    if r != 0 || sa.sin_family != libc::AF_INET as libc::sa_family_t {
        return 0;
    }
    u16::from_be(sa.sin_port)
}

/// connect() on a candidate. `None`: the engine does not take it (the
/// reason is logged); the caller makes the real call.
pub fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> Option<c_int> {
    if table::get(fd) & table::F_TCAND == 0 {
        return None;
    }
    let remote = match crate::accel::read_sockaddr(addr, len) {
        Ok(Some(r)) => r,
        _ => {
            table::clear_flags(fd, table::F_TCAND);
            return None;
        }
    };
    let e = errno();
    let nonblock = app_nonblock(fd);
    let o = opts_for(fd);
    let s = match engine_call(|| XdpTcpStream::connect_adopt(fd, remote, &o)) {
        Ok(s) => s,
        Err(err) => {
            table::clear_flags(fd, table::F_TCAND);
            log_not(fd, &err);
            set_errno(e);
            return None;
        }
    };
    let t = record(fd, Inner::Stream(s), false, true, nonblock);
    if let Some(i) = t.stream()
        && let Inner::Stream(s) = &*i
    {
        inherit_options(fd, s, t);
        log!(
            Level::Info,
            "fd {fd} tcp {} -> {remote}: xdp",
            engine_call(|| s.local_addr())
                .map(|a| a.to_string())
                .unwrap_or_default()
        );
    }
    t.connecting.store(true, Ordering::Release);
    t.connect_reported.store(false, Ordering::Release);
    set_errno(e);
    if nonblock {
        set_errno(libc::EINPROGRESS);
        return Some(-1);
    }
    match wait_for(t, fd, 0, |_| connect_outcome(t)) {
        Ok(Ok(())) => {
            t.locked(|t| t.connect_reported.store(true, Ordering::Release));
            Some(0)
        }
        Ok(Err(en)) => {
            t.locked(|t| t.connect_err.store(0, Ordering::Release));
            failed_connect_reported(t, fd);
            set_errno(en);
            Some(-1)
        }
        Err(en) => {
            // EINTR: the connection carries on (as the kernel's: a later
            // connect says EALREADY/EISCONN; poll + SO_ERROR finish it).
            set_errno(en);
            Some(-1)
        }
    }
}

/// A connect in progress: `None` while it runs, then Ok or its errno.
fn connect_outcome(t: TcpRef) -> Option<Result<(), c_int>> {
    let i = t.stream()?;
    let Inner::Stream(s) = &*i else { return None };
    let r = engine_call(|| s.connect_done())?;
    if r.is_err() {
        let _ = engine_call(|| s.take_error());
    }
    let live = t.locked(|t| {
        if let Err(e) = r {
            t.connect_err.store(err_no(e), Ordering::Release);
            t.connect_failed.store(true, Ordering::Release);
        }
        t.connecting.store(false, Ordering::Release);
    });
    // Closed (and maybe reused) meanwhile: no outcome for this fd.
    live.then_some(r.map_err(err_no))
}

/// connect() again on a socket already on the engine.
pub fn connect_again(t: TcpRef, fd: c_int) -> c_int {
    if t.listener() {
        set_errno(libc::EISCONN);
        return -1;
    }
    // As the kernel's __inet_stream_connect: while the handshake runs,
    // EALREADY; the first connect() that finds it established returns 0,
    // later ones EISCONN; after a failure, the pending error (or
    // ECONNABORTED once SO_ERROR took it) and the socket is unconnected
    // again (the next connect() starts afresh).
    if t.connecting.load(Ordering::Acquire) && connect_outcome(t).is_none() {
        set_errno(libc::EALREADY);
        return -1;
    }
    if t.connect_failed.load(Ordering::Acquire) {
        let mut pending = 0;
        t.locked(|t| pending = t.connect_err.swap(0, Ordering::AcqRel));
        failed_connect_reported(t, fd);
        set_errno(if pending != 0 {
            pending
        } else {
            libc::ECONNABORTED
        });
        return -1;
    }
    let mut reported = true;
    t.locked(|t| reported = t.connect_reported.swap(true, Ordering::AcqRel));
    if !reported {
        return 0;
    }
    set_errno(libc::EISCONN);
    -1
}

/// The application has been told that the connect of `fd` failed: as in
/// the kernel, whose socket is then closed (unconnected) and may connect
/// again, `fd` goes back to being a candidate (still bound to its port):
/// the next connect() starts afresh instead of reporting EISCONN.
fn failed_connect_reported(t: TcpRef, fd: c_int) {
    if t.common.refs() != 1 || !by_fd(fd).is_some_and(|r| r.same(t)) {
        return;
    }
    let Some(taken) = table::take_record::<Tcp>(fd).map(TcpRef) else {
        return;
    };
    if !taken.same(t) {
        // Replaced between the look and the take: not this record's fd.
        table::set_record(fd, taken.0.record());
        return;
    }
    // The record's engine object goes, and the record with it.
    recycle(t);
    // epoll interests the shim kept for the engine connection go to the
    // kernel: the caller (`dispatch::connect`) sees the record gone.
    table::add_flags(fd, table::F_TCAND);
}

// ------------------------------------------------------------- accept

/// accept/accept4 on an engine listener.
pub fn accept(
    t: TcpRef,
    fd: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
    flags: c_int,
) -> c_int {
    let Some(i) = t.get() else {
        set_errno(libc::EBADF);
        return -1;
    };
    let Inner::Listener(l) = &*i else {
        set_errno(libc::EINVAL);
        return -1;
    };
    enum Got {
        Engine(XdpTcpStream),
        Kernel(c_int),
        Err(c_int),
    }
    // The kernel's queue: connections the engine cannot carry (loopback).
    let kernel = || -> Option<Got> {
        // SAFETY: the caller's address buffers; the fd is non-blocking
        // underneath.
        let r = unsafe { real::accept4(fd, addr, alen, flags) };
        if r >= 0 {
            return Some(Got::Kernel(r));
        }
        match errno() {
            libc::EAGAIN => None,
            e => Some(Got::Err(e)),
        }
    };
    let e0 = errno();
    // An accept does not spin (a thread waiting for connections would
    // take the CPU from the threads serving them): it sleeps in the kernel
    // on the listening socket, the engine's accept eventfd (signalled by
    // whichever thread turns the engine when a connection is queued) and,
    // while no connection of this listener is open (nobody else turns the
    // engine), on the engine's fds.
    let tmo = t.common.rcvtimeo_ns();
    let start = now_ns();
    let s0 = crate::signals::seq();
    let gen0 = table::generation(table::get(fd));
    let mut look_kernel = true;
    let mut waiting = false;
    // The last sleep was without the engine's fds and ended by its slice:
    // a connection found now waited for it (`XdpTcpListener::note_late`).
    let mut slice_ended = false;
    let got = loop {
        if let Some(s) = engine_call(|| l.try_accept()) {
            if slice_ended {
                engine_call(|| l.note_late());
            }
            break Ok(Got::Engine(s));
        }
        if look_kernel && let Some(g) = kernel() {
            break Ok(g);
        }
        if t.common.nonblock() {
            break Err(libc::EAGAIN);
        }
        if crate::signals::interrupted_timed(s0, tmo != 0) {
            break Err(libc::EINTR);
        }
        if table::generation(table::get(fd)) != gen0 {
            break Err(libc::EBADF);
        }
        let spent = now_ns().wrapping_sub(start);
        if tmo != 0 && spent >= tmo {
            break Err(libc::EAGAIN);
        }
        if !waiting {
            // Counted, then one more try before the first sleep: a
            // connection queued after the count signals the accept fd (see
            // `XdpTcpListener::accept_waiting`); one queued before it, the
            // try finds.
            engine_call(|| l.accept_waiting(true));
            waiting = true;
            continue;
        }
        let busy = engine_call(|| l.busy());
        // The listening socket, then the accept fd (signalled by whichever
        // thread turns the engine when a connection reaches the accept
        // queue), then, while no connection of this listener is open, the
        // engine's fds.
        let own = [fd, l.accept_fd()];
        let engine = t.wait_fds().iter().copied().filter(|&f| f != fd);
        // With connections open, their threads turn the engine and signal the
        // accept fd; the slice is only a safety net then.
        let mut slice: u64 = 50_000_000;
        if tmo != 0 {
            slice = slice.min(tmo - spent);
        }
        let rev: [i16; 2] = crate::adapt::poll_in(
            own.into_iter()
                .chain(engine.take(if busy { 0 } else { usize::MAX })),
            slice,
        );
        look_kernel = rev[0] != 0;
        slice_ended = busy && rev == [0, 0];
        if rev[1] != 0 {
            engine_call(|| l.accept_drain());
        }
    };
    if waiting {
        engine_call(|| l.accept_waiting(false));
    }
    match got {
        Err(e) | Ok(Got::Err(e)) => {
            set_errno(e);
            -1
        }
        Ok(Got::Kernel(nfd)) => {
            table::retire(nfd);
            set_errno(e0);
            nfd
        }
        Ok(Got::Engine(s)) => {
            let ty = libc::SOCK_STREAM | (flags & (libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK));
            let nb = flags & libc::SOCK_NONBLOCK != 0;
            // The fd: a duplicate of the shared placeholder (`placeholder`),
            // unless the listener's options are carried onto it (the
            // accepted socket's own then).
            let carried = crate::opts::set_any(crate::opts::SET_CARRIED);
            let shared = (!carried)
                .then(|| {
                    crate::placeholder::dup(nb, flags & libc::SOCK_CLOEXEC != 0, keep_fd_floor())
                })
                .flatten();
            let (nfd, ident) = match shared {
                Some((d, c)) => (d, Some(c)),
                // SAFETY: plain socket(2).
                None => (unsafe { real::socket(libc::AF_INET, ty, 0) }, None),
            };
            if nfd < 0 {
                // No fd for it: the connection is reset (never silently
                // kept open for nobody).
                let en = errno();
                engine_call(|| {
                    s.abort();
                    drop(s)
                });
                set_errno(en);
                return -1;
            }
            table::retire(nfd);
            table::set(nfd, table::C_TCP, 0);
            let peer = engine_call(|| s.peer_addr()).ok();
            let t2 = record_as(nfd, Inner::Stream(s), (false, false, nb), ident);
            // As the kernel's accepted socket: the listener's options and
            // timeouts, read back from the placeholder as plainly.
            if carried {
                carry_options(fd, nfd);
            }
            t2.common.set_rcvtimeo_ns(t.common.rcvtimeo_ns());
            t2.common.set_sndtimeo_ns(t.common.sndtimeo_ns());
            if let Some(i2) = t2.stream()
                && let Inner::Stream(s) = &*i2
            {
                inherit_options(fd, s, t2);
            }
            if let Some(p) = peer {
                crate::accel::write_sockaddr(p, addr, alen);
            }
            set_errno(e0);
            nfd
        }
    }
}

// ---------------------------------------------------- receive and send

/// The connection of `t` for a receive or send with `flags`, or the errno
/// the kernel's socket gives: ENOTCONN for a listener (EBADF for a record
/// with no engine socket), `refused.1` for a flag in `refused.0` the
/// engine does not do, EAGAIN (non-blocking) or ENOTCONN while a connect
/// is still pending.
fn io_stream(t: TcpRef, flags: c_int, refused: (c_int, c_int)) -> Result<Arc<Inner>, c_int> {
    let Some(i) = t.stream() else {
        return Err(if t.listener() {
            libc::ENOTCONN
        } else {
            libc::EBADF
        });
    };
    if flags & refused.0 != 0 {
        return Err(refused.1);
    }
    if t.connecting.load(Ordering::Acquire) && connect_outcome(t).is_none() {
        return Err(if t.common.nonblock() || flags & libc::MSG_DONTWAIT != 0 {
            libc::EAGAIN
        } else {
            libc::ENOTCONN
        });
    }
    Ok(i)
}

/// Receive into `buf` with `flags` (MSG_PEEK, MSG_DONTWAIT, MSG_WAITALL).
pub fn recv(t: TcpRef, fd: c_int, buf: &mut [u8], flags: c_int) -> isize {
    // The first attempt under the record's lock, no `Arc` taken
    // (`with_stream`): bytes there (an event loop's read after its
    // readiness call) are answered from it, and so is a non-blocking call
    // that finds none. Anything else (an error, MSG_WAITALL, flags it does
    // not serve, a blocking call with nothing there) goes the full way
    // below; a blocking call that found nothing starts its wait without a
    // second attempt at once (`tried`).
    let e0 = errno();
    let mut tried = false;
    if flags & (libc::MSG_OOB | libc::MSG_ERRQUEUE | libc::MSG_WAITALL) == 0
        && !buf.is_empty()
        && !t.connecting.load(Ordering::Acquire)
        && !t.common.rd_shut()
    {
        let peek = flags & libc::MSG_PEEK != 0;
        match t.with_stream(|s| engine_call(|| s.recv_once(&mut *buf, peek, None))) {
            Some(Ok(n)) => {
                set_errno(e0);
                return n as isize;
            }
            Some(Err(XdpTcpError::WouldBlock))
                if flags & libc::MSG_DONTWAIT != 0 || t.common.nonblock() =>
            {
                return fault(libc::EAGAIN);
            }
            Some(Err(XdpTcpError::WouldBlock)) => tried = true,
            _ => {}
        }
        // The full way starts from the caller's errno.
        set_errno(e0);
    }
    // (MSG_OOB: `ops` hands the connection to the kernel first; here only
    // when that could not be done.)
    let i = match io_stream(t, flags, (libc::MSG_OOB | libc::MSG_ERRQUEUE, libc::EINVAL)) {
        Ok(i) => i,
        Err(en) => return fault(en),
    };
    let Inner::Stream(s) = &*i else {
        unreachable!()
    };
    if buf.is_empty() {
        return 0;
    }
    let peek = flags & libc::MSG_PEEK != 0;
    let dontwait = flags & libc::MSG_DONTWAIT != 0 || t.common.nonblock();
    let waitall = flags & libc::MSG_WAITALL != 0 && !peek && !dontwait;
    let mut m = Moved::start();
    // The wait's lock-free look, made by an attempt that found nothing.
    let idle = std::cell::Cell::new(None::<TcpIdle>);
    loop {
        let rest = &mut buf[m.done..];
        // An attempt after the first turns the stack before it reads the
        // ring (`recv_wait`): the ring was empty at the last one.
        let mut waiting = tried;
        let one = |a: Attempt| {
            if std::mem::take(&mut tried) {
                return None;
            }
            if t.common.rd_shut() {
                return Some(Ok(0));
            }
            let now = a.clock;
            if !std::mem::replace(&mut waiting, true) {
                return not_yet(engine_call(|| s.recv_once(&mut *rest, peek, now)));
            }
            let mut look = None;
            let r = engine_call(|| s.recv_wait(&mut *rest, peek, now, a.polls, &mut look));
            idle.set(look);
            not_yet(r)
        };
        let coast = || match idle.get() {
            Some(mut look) => {
                let on = s.coast(&mut look);
                idle.set(on.then_some(look));
                on
            }
            None => false,
        };
        match now_or_wait(t, fd, dontwait, t.common.rcvtimeo_ns(), one, coast) {
            Ok(Ok(0)) => break,
            Ok(Ok(n)) => {
                m.done += n;
                if !waitall || m.done == buf.len() {
                    break;
                }
            }
            Ok(Err(e)) if m.done == 0 && e == XdpTcpError::InvalidHandle => {
                // Handed over to the kernel (fork in another thread) or
                // moved to another holder while this call waited.
                let again = |to: Option<TcpRef>| match to {
                    Some(t2) => recv(t2, fd, buf, flags),
                    // SAFETY: the caller's buffer; fd is a kernel socket now.
                    None => unsafe { real::recv(fd, buf.as_mut_ptr().cast(), buf.len(), flags) },
                };
                return redo(t, fd, m.errno_found(), again).unwrap_or_else(|| m.fail(err_no(e)));
            }
            Ok(Err(e)) => return m.fail(err_no(e)),
            Err(en) => return m.fail(en),
        }
    }
    m.end()
}

fn sigpipe(flags: c_int) {
    if flags & libc::MSG_NOSIGNAL == 0 {
        // SAFETY: raising a signal on this thread, as the kernel does.
        unsafe { libc::raise(libc::SIGPIPE) };
    }
}

/// Send all of `data` (blocking) or what fits (non-blocking).
pub fn send(t: TcpRef, fd: c_int, data: &[u8], flags: c_int) -> isize {
    // The common call (the send buffer has room for all of it: a reply
    // right after its request was read): one attempt under the record's
    // lock, no `Arc` taken (`with_stream`), before the segment goes out.
    // Anything else (part of it or nothing queued, an error) goes on the
    // full way below from what was queued.
    let dontwait = flags & libc::MSG_DONTWAIT != 0 || t.common.nonblock();
    let mut first = 0usize;
    if flags & libc::MSG_OOB == 0 && !data.is_empty() && !t.connecting.load(Ordering::Acquire) {
        let e0 = errno();
        match t.with_stream(|s| engine_call(|| s.send_once(data))) {
            // All of it, or (non-blocking) what fitted.
            Some(Ok(n)) if n == data.len() || (n > 0 && dontwait) => {
                set_errno(e0);
                return n as isize;
            }
            Some(Ok(n)) => first = n,
            // Non-blocking and the send buffer full: what the full way answers.
            Some(Err(XdpTcpError::WouldBlock)) if dontwait => return fault(libc::EAGAIN),
            _ => {}
        }
        // The full way starts from the caller's errno.
        set_errno(e0);
    }
    // (MSG_OOB: as in `recv`.)
    let i = match io_stream(t, flags, (libc::MSG_OOB, libc::EOPNOTSUPP)) {
        Ok(i) => i,
        // Closed by another thread after the first attempt queued a part.
        Err(_) if first > 0 => return first as isize,
        Err(en) => return fault(en),
    };
    let Inner::Stream(s) = &*i else {
        unreachable!()
    };
    if data.is_empty() {
        return 0;
    }
    let mut m = Moved::start();
    m.done = first;
    while m.done < data.len() {
        let rest = &data[m.done..];
        let one = |_| not_yet(engine_call(|| s.send_once(rest)));
        match now_or_wait(t, fd, dontwait, t.common.sndtimeo_ns(), one, || false) {
            // A non-blocking send that filled the send buffer returns what
            // it queued, as the kernel's does (it does not wait for ACKs
            // to free room and go on: a fast reader would let one call
            // take any amount).
            Ok(Ok(n)) if dontwait && n < rest.len() => {
                m.done += n;
                break;
            }
            Ok(Ok(n)) => m.done += n,
            Ok(Err(_)) if m.done > 0 => break,
            Ok(Err(e)) => {
                let again = |to: Option<TcpRef>| match to {
                    Some(t2) => send(t2, fd, rest, flags),
                    // SAFETY: the caller's bytes; fd is a kernel socket now.
                    None => unsafe { real::send(fd, rest.as_ptr().cast(), rest.len(), flags) },
                };
                if e == XdpTcpError::InvalidHandle
                    && let Some(r) = redo(t, fd, m.errno_found(), again)
                {
                    return r;
                }
                // A reset after the peer's FIN (CLOSE-WAIT) is EPIPE in
                // Linux; otherwise the reset is reported once, then EPIPE.
                let after_fin = engine_call(|| s.poll_ready(false)) & tcp_ready::RDHUP != 0;
                let first_report = || {
                    let mut was = true;
                    t.locked(|t| was = t.reset_reported.swap(true, Ordering::AcqRel));
                    !was
                };
                let en = match e {
                    XdpTcpError::ConnectionReset | XdpTcpError::Aborted | XdpTcpError::TimedOut
                        if !after_fin && first_report() =>
                    {
                        err_no(e)
                    }
                    XdpTcpError::NotConnected => libc::ENOTCONN,
                    _ => libc::EPIPE,
                };
                if en == libc::EPIPE {
                    sigpipe(flags);
                }
                return m.fail(en);
            }
            Err(en) => return m.fail(en),
        }
    }
    m.end()
}

// readv/writev/recvmsg/sendmsg/recvmmsg/sendmmsg over the caller's
// iovecs: `streamio` (checked as the kernel checks them).

// ---------------------------------------------------------- readiness

/// The engines one pass of a readiness call over its fds has turned: an
/// engine is turned once per pass, for the first of its sockets, and the
/// others read the readiness that turn left (an epoll set of 20
/// connections on one engine turned it 20 times per look).
#[derive(Default)]
pub struct Pass {
    turned: [usize; 4],
    n: usize,
}

impl Pass {
    /// Turn engine `key` now? Yes the first time in this pass (and every
    /// time for engines past the fourth).
    fn first(&mut self, key: usize) -> bool {
        if self.turned[..self.n].contains(&key) {
            return false;
        }
        if self.n < self.turned.len() {
            self.turned[self.n] = key;
            self.n += 1;
        }
        true
    }
}

/// Poll bits of the socket now, with a count that grows whenever data
/// arrives on a connection (0 for a listener): an EPOLLET waiter is woken
/// by each arrival, as the kernel wakes it, even while the fd stays
/// readable. The socket's engine is turned first unless an earlier socket
/// of the same readiness pass turned it.
pub fn poll_bits_in(t: TcpRef, pass: &mut Pass) -> (i16, u64) {
    let Some(i) = t.get() else {
        return (libc::POLLNVAL, 0);
    };
    let turn = pass.first(match &*i {
        Inner::Listener(l) => l.engine_key(),
        Inner::Stream(s) => s.engine_key(),
    });
    match &*i {
        // The kernel's accept queue is reported by the kernel's own answer
        // for the fd (poll and epoll ask it too).
        Inner::Listener(l) => {
            if engine_call(|| l.acceptable(turn)) {
                (libc::POLLIN, 0)
            } else {
                (0, 0)
            }
        }
        Inner::Stream(s) => {
            if t.connecting.load(Ordering::Acquire) {
                match connect_outcome(t) {
                    None => return (0, 0),
                    Some(Ok(())) => {}
                    Some(Err(_)) => {
                        return (
                            libc::POLLOUT | libc::POLLERR | libc::POLLHUP | libc::POLLIN,
                            0,
                        );
                    }
                }
            }
            let (m, rx) = engine_call(|| s.poll_ready_edge(turn));
            let mut r = 0i16;
            if m & tcp_ready::IN != 0 {
                r |= libc::POLLIN | libc::POLLRDNORM;
            }
            if m & tcp_ready::OUT != 0 {
                r |= libc::POLLOUT | libc::POLLWRNORM;
            }
            if m & tcp_ready::RDHUP != 0 || t.common.rd_shut() {
                r |= libc::POLLRDHUP | libc::POLLIN;
            }
            if m & tcp_ready::HUP != 0 {
                r |= libc::POLLHUP;
            }
            if m & tcp_ready::ERR != 0 {
                r |= libc::POLLERR;
            }
            (r, rx)
        }
    }
}

// ------------------------------------------------------ shutdown/close

pub fn shutdown(t: TcpRef, how: c_int) -> c_int {
    let Some(i) = t.get() else {
        set_errno(libc::EBADF);
        return -1;
    };
    match &*i {
        Inner::Listener(_) => {
            set_errno(libc::ENOTCONN);
            -1
        }
        Inner::Stream(s) => {
            if !matches!(how, libc::SHUT_RD | libc::SHUT_WR | libc::SHUT_RDWR) {
                set_errno(libc::EINVAL);
                return -1;
            }
            match engine_call(|| s.state()) {
                None | Some(XdpTcpState::Closed) | Some(XdpTcpState::SynSent) => {
                    set_errno(libc::ENOTCONN);
                    return -1;
                }
                _ => {}
            }
            if how == libc::SHUT_RD || how == libc::SHUT_RDWR {
                t.common.shut_rd();
            }
            if how == libc::SHUT_WR || how == libc::SHUT_RDWR {
                let _ = engine_call(|| s.shut_write());
            }
            0
        }
    }
}

/// The fd `fd` stops referring to its record (close, dup2 over it); the
/// engine object goes with the last fd.
pub fn release(fd: c_int) {
    release_as(fd, false);
}

/// Does releasing `t` (its last fd closing) leave the fd number alone? An
/// accepted connection no forked child shares: its close is the engine's
/// (the FIN), no duplicate of the fd keeps a port (`close_record`: only an
/// adopted socket's does), nothing is handed over onto the number. Then a
/// number closed and reused behind the shim's back is safe from the
/// release, and `ops::pre_close` skips the identity check.
pub fn release_spares_number(t: TcpRef) -> bool {
    !t.adopted.load(Ordering::Relaxed) && !t.listener() && t.common.share() == 0
}

/// Is `t` a connection the engine accepted (not a listener, not a socket
/// the application bound or connected itself)?
pub fn is_accepted(t: TcpRef) -> bool {
    !t.adopted.load(Ordering::Relaxed) && !t.listener()
}

/// `fd` was closed behind the shim's back (a call it could not see) and
/// its number may already name something else: the record goes as at
/// close, but nothing is done on the number (no duplicate keeps the port:
/// the application's socket is gone already).
pub fn release_stale(fd: c_int) {
    release_as(fd, true);
}

fn release_as(fd: c_int, stale: bool) {
    let Some(t) = table::take_record::<Tcp>(fd).map(TcpRef) else {
        return;
    };
    if released_last_mine(t) {
        close_record(t, fd, stale);
        recycle(t);
    }
}

/// One fd of `t` lets go: true if it was the last and `t` is this
/// process's (close it). A forked child's last copy of a connection its
/// parent shared counts down the holders (`forkshare`).
fn released_last_mine(t: TcpRef) -> bool {
    if !t.common.release() {
        return false;
    }
    if t.mine() {
        return true;
    }
    if t.common.share() != 0 && !t.listener() {
        crate::forkshare::dropped(t.common.share());
    }
    false
}

/// What the owner's last close of a connection a forked child still holds
/// did with it ([`IN_PLACE`]).
pub enum OwnerClosed {
    /// Handed over to the kernel in the socket the child holds.
    Moved,
    /// Kept on the engine for the child (`handover::owner_closing`): the
    /// slot stays the owner's, the engine object is taken.
    Parked,
    /// Neither (said why): closed on the engine.
    Failed,
}

/// Takes a connection an owner left to the holders from the kernel onto
/// this process's engine (`handover::adopt_orphan`, set once by
/// `handover::init`: handover sits above this module).
#[allow(clippy::type_complexity)]
pub static ADOPT_ORPHAN: std::sync::OnceLock<
    fn(c_int, TcpRef, u32, Option<nanowire_stack::xdp::Taker>) -> Option<TcpRef>,
> = std::sync::OnceLock::new();

/// How the owner's last close of a connection a forked child still holds
/// hands it on (`handover::owner_closing`, set once by `handover::init`:
/// the hand-over sits above this layer).
pub static IN_PLACE: std::sync::OnceLock<fn(c_int, TcpRef) -> OwnerClosed> =
    std::sync::OnceLock::new();

/// What an exiting process does first with the connections it keeps for
/// forked children (`handover::parked_exit`, set once by `handover::init`).
pub static PARKED_EXIT: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// The engine object of `t`, taken out of the record (the record's last
/// fd is closing; the caller keeps the connection on the engine).
pub fn take_engine(t: TcpRef) -> Option<Arc<Inner>> {
    t.take()
}

/// Close the engine connection of `i` as a close of its last fd does
/// (FIN), without a record.
pub fn close_engine(i: Arc<Inner>) {
    match Arc::try_unwrap(i) {
        Ok(Inner::Stream(s)) => engine_call(|| s.close_keep(None)),
        Ok(Inner::Listener(l)) => engine_call(|| l.close()),
        Err(arc) => engine_call(|| drop(arc)),
    }
}

/// Close the engine object of `t` (its last fd `fd` is going).
fn close_record(t: TcpRef, fd: c_int, exiting: bool) {
    let h = t.common.share();
    if h != 0
        && !t.listener()
        && matches!(
            crate::forkshare::owner_closing(h),
            crate::forkshare::Closing::HandOver
        )
    {
        // A forked child holds the socket: the connection goes on in the
        // kernel there (no FIN: the kernel's socket is not closed yet), or
        // stays on the engine until the child uses it (the engine service).
        let svc = t.stream_on_service() == Some(true);
        match IN_PLACE
            .get()
            .map_or(OwnerClosed::Failed, |hand| hand(fd, t))
        {
            OwnerClosed::Parked => return,
            OwnerClosed::Moved => {
                // The kernel's in the shared socket now: the first holder
                // that can takes it onto its engine (`Claimed::Orphaned`):
                // on the service, or on an engine of its own once this
                // process is gone (at its exit; a live owner's engine
                // holds the interface, so not at a close).
                if svc || exiting {
                    crate::forkshare::orphan(h);
                } else {
                    crate::forkshare::settle(h);
                }
                if let Some(i) = t.take_inner() {
                    engine_call(|| drop(i));
                }
                return;
            }
            OwnerClosed::Failed => crate::forkshare::settle(h),
        }
    }
    let inner = t.take_inner();
    let Some(inner) = inner else { return };
    // Another thread may still hold the Arc inside a call: it finishes
    // that call; the object goes when it lets go.
    match Arc::try_unwrap(inner) {
        Ok(Inner::Listener(l)) => engine_call(|| l.close()),
        Ok(Inner::Stream(s)) => {
            // A duplicate of the application's fd keeps the port held in
            // the kernel until the engine has finished the connection.
            let keep = if t.adopted.load(Ordering::Relaxed) && !exiting && s.port_in_fd() {
                // SAFETY: dup of the application's fd, closed just after.
                let mut d =
                    unsafe { real::fcntl(fd, libc::F_DUPFD_CLOEXEC, keep_fd_floor() as u64) };
                if d < 0 {
                    // SAFETY: as above, any number.
                    d = unsafe { real::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
                }
                (d >= 0).then(|| {
                    // SAFETY: a fresh descriptor we own.
                    unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(d) }
                })
            } else {
                None
            };
            engine_call(|| s.close_keep(keep));
        }
        Err(arc) => engine_call(|| drop(arc)),
    }
}

/// Where a call under way on a connection goes once the connection left
/// this process's engine ([`handed_over`]).
enum Left {
    /// It did not: the call's error stands.
    Stays,
    /// The kernel's now: the call goes on there.
    Kernel,
    /// It moved to another holder and back here: the call goes on on this
    /// record.
    Back(TcpRef),
}

/// A call under way on `t` (`fd` its number) found the connection gone
/// from this engine ([`handed_over`]): `None` if it was not (the call's
/// error stands), else the call made again where the connection is now
/// (`again(None)`: on the kernel socket; `Some`: on this process's new
/// record), from errno `e0`.
fn redo(
    t: TcpRef,
    fd: c_int,
    e0: c_int,
    again: impl FnOnce(Option<TcpRef>) -> isize,
) -> Option<isize> {
    let to = match handed_over(t, fd) {
        Left::Stays => return None,
        Left::Kernel => None,
        Left::Back(t2) => Some(t2),
    };
    set_errno(e0);
    Some(again(to))
}

/// `fd` no longer names record `t`: its connection was handed over to the
/// kernel while a call on it was under way. A connection that moved to
/// another holder's engine meanwhile (`t` is no longer this process's):
/// this process asks for it back (a move here, or the kernel's).
fn handed_over(t: TcpRef, fd: c_int) -> Left {
    let names = || by_fd(fd).is_some_and(|r| r.same(t));
    // The stack forgets the connection before the fds are moved: wait for
    // the hand-over under way to finish (a few syscalls; bounded).
    let t0 = std::time::Instant::now();
    while t.handing.load(Ordering::Acquire)
        && names()
        && t0.elapsed() < std::time::Duration::from_secs(2)
    {
        std::thread::yield_now();
    }
    log!(
        Level::Debug,
        "fd {fd} tcp: a call under way lost its connection (names {}, mine {}, share {})",
        names(),
        t.mine(),
        t.common.share()
    );
    if names() && !t.mine() && t.common.share() != 0 {
        // The move made this process a holder of a copy: it asks the new
        // owner, which moves it back (up to `forkshare::MAX_MOVES`) or
        // hands it to the kernel.
        return match claim_inherited(fd, t, true) {
            Some(t2) => Left::Back(t2),
            None => Left::Kernel,
        };
    }
    if names() { Left::Stays } else { Left::Kernel }
}

/// The connection of `t` moved to a forked child's engine
/// (`handover::answer_child`): this process's record is a copy from now on
/// (a use asks the new owner) and its engine object goes (the engine
/// forgot the connection).
pub fn disown(t: TcpRef) {
    t.common.disown();
    drop_engine(t);
}

/// The connection of `t` came back to this process's engine (a move that
/// was not taken): `s` serves it.
pub fn restore(t: TcpRef, s: XdpTcpStream) {
    let old = t.lock_inner().replace(Arc::new(Inner::Stream(s)));
    if let Some(i) = old {
        engine_call(|| drop(i));
    }
}

/// `fd` (a number of `t`) may name the shared placeholder
/// (`placeholder`): before a call that would change or read something of
/// the file's own (an option, status flags, bind, listen, its cookie, a
/// child inheriting it), every number of `t` on a placeholder gets a
/// socket of its own (one file for them all, as they were), with the
/// placeholder's status flags and each number's FD_CLOEXEC. A number on
/// a socket of its own already: one load.
pub fn own_placeholder(t: TcpRef, fd: c_int) {
    if !crate::placeholder::is_template(table::identity(fd)) {
        return;
    }
    own_placeholder_slow(t, fd);
}

#[cold]
fn own_placeholder_slow(t: TcpRef, fd: c_int) {
    let _g = crate::placeholder::lock();
    if !crate::placeholder::is_template(table::identity(fd)) {
        return;
    }
    let e0 = errno();
    // SAFETY: F_GETFL on the application's fd (the placeholder's flags).
    let fl = unsafe { real::fcntl(fd, libc::F_GETFL, 0) };
    let nb = if fl >= 0 && fl & libc::O_NONBLOCK != 0 {
        libc::SOCK_NONBLOCK
    } else {
        0
    };
    // SAFETY: plain socket(2); closed below once every number has it.
    let s = unsafe {
        real::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | nb,
            0,
        )
    };
    if s < 0 {
        log!(
            Level::Warn,
            "fd {fd} tcp: no socket of its own for it (errno {}): the call acts on the placeholder it shares with other accepted connections",
            errno()
        );
        set_errno(e0);
        return;
    }
    let cookie = table::cookie_of(s);
    for f in fds_of(t) {
        if !crate::placeholder::is_template(table::identity(f)) {
            continue;
        }
        if replace_number(s, f) {
            table::set_identity(f, cookie);
        }
    }
    // SAFETY: ours; the numbers keep the socket.
    unsafe { real::close(s) };
    set_errno(e0);
}

/// Only the blocking mode of `fd` (a number of `t`) changes (F_SETFL with
/// no other flag, FIONBIO): if it is on a shared placeholder, the numbers
/// of `t` on it move to the placeholder of mode `nonblock` (dup3; no
/// socket made), which has the flags the change asks for. False: `fd` is
/// not on a current placeholder (the caller gives it a socket of its own).
pub fn placeholder_mode(t: TcpRef, fd: c_int, nonblock: bool) -> bool {
    let id = table::identity(fd);
    if !crate::placeholder::is_template(id) {
        return false;
    }
    // (Makes that template if need be, under the lock: before taking it.)
    let Some((to, cookie)) = crate::placeholder::of_mode(id, nonblock, keep_fd_floor()) else {
        return false;
    };
    if cookie == id {
        return true;
    }
    let _g = crate::placeholder::lock();
    if table::identity(fd) != id || !crate::placeholder::current(to, cookie) {
        // Moved or retired meanwhile: the caller gives it its own.
        return false;
    }
    let e0 = errno();
    let mut moved = true;
    for f in fds_of(t) {
        if table::identity(f) == id {
            if replace_number(to, f) {
                table::set_identity(f, cookie);
            } else {
                moved = false;
            }
        }
    }
    set_errno(e0);
    moved
}

/// `f` (the application's number) names the file of `with` from now on,
/// its FD_CLOEXEC kept: one dup3. False if that failed.
fn replace_number(with: c_int, f: c_int) -> bool {
    // SAFETY: F_GETFD on the application's fd.
    let cloexec = unsafe { real::fcntl(f, libc::F_GETFD, 0) } & libc::FD_CLOEXEC != 0;
    // SAFETY: dup3 onto a number of the application's record: what it
    // named is replaced in one step.
    unsafe { real::dup3(with, f, if cloexec { libc::O_CLOEXEC } else { 0 }) >= 0 }
}

/// A sendmsg on a kernel socket that may pass fds (SCM_RIGHTS in `m`'s
/// control data): engine connections among them that are on the shared
/// placeholder get a socket of their own first (the receiving process may
/// change the file it gets). No control data: one load.
pub fn own_passed(m: *const libc::msghdr) {
    let Some(h) = crate::uaccess::obj(m) else {
        return;
    };
    if h.msg_controllen == 0 {
        return;
    }
    let Some(ctl) = crate::uaccess::buf(h.msg_control, h.msg_controllen) else {
        return;
    };
    let hdr = std::mem::size_of::<libc::cmsghdr>();
    let mut off = 0;
    while off + hdr <= ctl.len() {
        // SAFETY: `hdr` readable bytes at `off` (checked); unaligned read.
        let c: libc::cmsghdr = unsafe { std::ptr::read_unaligned(ctl[off..].as_ptr().cast()) };
        let len = c.cmsg_len as usize;
        if len < hdr || off + len > ctl.len() {
            break;
        }
        if (c.cmsg_level, c.cmsg_type) == (libc::SOL_SOCKET, libc::SCM_RIGHTS) {
            for b in ctl[off + hdr..off + len].chunks_exact(4) {
                let fd = c_int::from_ne_bytes([b[0], b[1], b[2], b[3]]);
                if let Some(t) = by_fd(fd) {
                    own_placeholder(t, fd);
                }
            }
        }
        off += (len + 7) & !7;
    }
}

/// Every fd number of this process that names record `t` (dups share it).
pub fn fds_of(t: TcpRef) -> Vec<c_int> {
    let mut v = Vec::new();
    table::each_record::<Tcp>(|fd, r| {
        if TcpRef(r).same(t) {
            v.push(fd);
        }
    });
    v
}

/// The engine object of `t` goes (its connection was handed over while
/// the application closed its last fd: that close finds nothing to do).
pub fn drop_engine(t: TcpRef) {
    if let Some(i) = t.take() {
        engine_call(|| drop(i));
    }
}

/// The connection of `t` was handed over to the kernel (`fds` now name a
/// kernel socket): the shim forgets it, and the engine object goes (it
/// sends nothing: the engine already forgot the connection).
pub fn forget(t: TcpRef, fds: &[c_int]) {
    let mut all = true;
    for &fd in fds {
        match table::take_record::<Tcp>(fd).map(TcpRef) {
            Some(r) if !r.same(t) => {
                // Another socket's by now: it stays.
                table::set_record(fd, r.0.record());
            }
            Some(_) => {}
            None => all = false,
        }
    }
    if all && fds_of(t).is_empty() {
        // No fd names the record: it goes back to the pool.
        recycle(t);
    } else if let Some(i) = t.take() {
        engine_call(|| drop(i));
    }
}

// -------------------------------------------------------------- options

/// Options the application set on the fd's kernel socket (the engine
/// mirrored every setsockopt there), carried to the new socket.
const CARRIED: &[(c_int, c_int)] = &[
    (libc::SOL_SOCKET, libc::SO_KEEPALIVE),
    (libc::SOL_SOCKET, libc::SO_LINGER),
    (libc::SOL_SOCKET, libc::SO_RCVTIMEO_NEW),
    (libc::SOL_SOCKET, libc::SO_SNDTIMEO_NEW),
    (libc::SOL_SOCKET, libc::SO_PRIORITY),
    (libc::SOL_SOCKET, libc::SO_OOBINLINE),
    (libc::SOL_SOCKET, libc::SO_RCVLOWAT),
    (libc::IPPROTO_TCP, libc::TCP_NODELAY),
    (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE),
    (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL),
    (libc::IPPROTO_TCP, libc::TCP_KEEPCNT),
    (libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT),
    (libc::IPPROTO_IP, libc::IP_TOS),
    (libc::IPPROTO_IP, libc::IP_TTL),
];

pub(crate) fn carry_options(from: c_int, to: c_int) {
    for &(level, name) in CARRIED {
        let mut v = [0u8; 32];
        let mut l = v.len() as socklen_t;
        // SAFETY: a 32-byte out-buffer and its length.
        if unsafe { real::getsockopt(from, level, name, v.as_mut_ptr().cast(), &mut l) } == 0 {
            // SAFETY: the bytes just read, their length.
            unsafe { real::setsockopt(to, level, name, v.as_ptr().cast(), l) };
        }
    }
}

fn read_int(val: *const c_void, len: socklen_t) -> Option<c_int> {
    if val.is_null() || (len as usize) < std::mem::size_of::<c_int>() {
        return None;
    }
    // SAFETY: an int the caller passed.
    Some(unsafe { std::ptr::read_unaligned(val.cast::<c_int>()) })
}

/// setsockopt on an engine socket, after the kernel socket took the value
/// and `opts` found it one the engine honours: the engine applies it.
pub fn setsockopt_applied(t: TcpRef, fd: c_int, o: crate::opts::Opt) -> c_int {
    let (level, name, val, len) = o.parts();
    let e = errno();
    if let Some(i) = t.stream()
        && let Inner::Stream(s) = &*i
    {
        let v = read_int(val, len);
        match (level, name, v) {
            (libc::IPPROTO_TCP, libc::TCP_NODELAY, Some(v)) => {
                let _ = engine_call(|| s.set_nodelay(v != 0));
            }
            (libc::IPPROTO_TCP, libc::TCP_QUICKACK, Some(v)) => {
                let _ = engine_call(|| s.set_quickack(v != 0));
            }
            (libc::SOL_SOCKET, libc::SO_LINGER, _)
                if !val.is_null() && len as usize >= std::mem::size_of::<libc::linger>() =>
            {
                // SAFETY: a linger the kernel just accepted.
                let l = unsafe { std::ptr::read_unaligned(val.cast::<libc::linger>()) };
                let _ = engine_call(|| s.set_linger0(l.l_onoff != 0 && l.l_linger == 0));
            }
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE, Some(_))
            | (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, Some(_))
            | (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, Some(_))
            | (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, Some(_)) => {
                let on = get_int(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE).unwrap_or(0) != 0;
                let idle = get_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE).unwrap_or(7200);
                let intvl = get_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL).unwrap_or(75);
                let cnt = get_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT).unwrap_or(9);
                *t.ka.lock().unwrap_or_else(|e| e.into_inner()) =
                    (on, idle as u64, intvl as u64, cnt as u32);
                let _ = engine_call(|| s.set_keepalive(on, idle as u64, intvl as u64, cnt as u32));
            }
            _ => {}
        }
    }
    if level == libc::SOL_SOCKET && (name == libc::SO_RCVTIMEO || name == 66) {
        t.common
            .set_rcvtimeo_ns(crate::uaccess::timeval_opt_ns(val, len));
    }
    if level == libc::SOL_SOCKET && (name == libc::SO_SNDTIMEO || name == 67) {
        t.common
            .set_sndtimeo_ns(crate::uaccess::timeval_opt_ns(val, len));
    }
    set_errno(e);
    0
}

fn linux_state(s: XdpTcpState) -> u8 {
    match s {
        XdpTcpState::Established => 1,
        XdpTcpState::SynSent => 2,
        XdpTcpState::SynReceived => 3,
        XdpTcpState::FinWait1 => 4,
        XdpTcpState::FinWait2 => 5,
        XdpTcpState::TimeWait => 6,
        XdpTcpState::Closed => 7,
        XdpTcpState::CloseWait => 8,
        XdpTcpState::LastAck => 9,
        XdpTcpState::Closing => 11,
    }
}

/// getsockopt on an engine socket: `None` = the kernel socket answers.
pub fn getsockopt(
    t: TcpRef,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> Option<c_int> {
    if val.is_null() || len.is_null() {
        return None;
    }
    let i = t.stream()?;
    let Inner::Stream(s) = &*i else { return None };
    // SAFETY: the caller's length.
    let cap = unsafe { *len } as usize;
    let put = |bytes: &[u8]| {
        let n = bytes.len().min(cap);
        // SAFETY: the caller's buffer of *len bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), val.cast::<u8>(), n);
            *len = n as socklen_t;
        }
    };
    match (level, name) {
        (libc::SOL_SOCKET, libc::SO_ERROR) => {
            if t.connecting.load(Ordering::Acquire) {
                // Finishes the connect if its outcome is known.
                let _ = connect_outcome(t);
            }
            let pending = t.connect_err.swap(0, Ordering::AcqRel);
            if pending != 0 {
                put(&pending.to_ne_bytes());
                return Some(0);
            }
            let e = engine_call(|| s.take_error()).map_or(0, err_no);
            put(&e.to_ne_bytes());
            Some(0)
        }
        (libc::IPPROTO_TCP, libc::TCP_INFO) => {
            let info = engine_call(|| s.info()).ok()?;
            // SAFETY: tcp_info is plain integers; all-zero is valid.
            let mut ti: libc::tcp_info = unsafe { std::mem::zeroed() };
            ti.tcpi_state = linux_state(info.state);
            ti.tcpi_retransmits = info.retransmits.min(255) as u8;
            ti.tcpi_options = (if info.timestamps { 1 } else { 0 })
                | (if info.sack { 2 } else { 0 })
                | (if info.snd_wscale > 0 || info.rcv_wscale > 0 {
                    4
                } else {
                    0
                });
            ti.tcpi_snd_rcv_wscale = (info.snd_wscale & 0xf) | ((info.rcv_wscale & 0xf) << 4);
            ti.tcpi_rto = info.rto_us.min(u32::MAX as u64) as u32;
            ti.tcpi_snd_mss = info.snd_mss as u32;
            ti.tcpi_rcv_mss = info.rcv_mss as u32;
            ti.tcpi_unacked = info.unacked;
            ti.tcpi_rtt = info.rtt_us.min(u32::MAX as u64) as u32;
            ti.tcpi_rttvar = info.rttvar_us.min(u32::MAX as u64) as u32;
            ti.tcpi_snd_ssthresh = info.ssthresh;
            ti.tcpi_snd_cwnd = info.cwnd;
            ti.tcpi_total_retrans = info.total_retrans.min(u32::MAX as u64) as u32;
            ti.tcpi_bytes_acked = info.bytes_acked;
            ti.tcpi_bytes_received = info.bytes_received;
            // SAFETY: viewing a plain-integer struct as bytes.
            let b = unsafe {
                std::slice::from_raw_parts(
                    (&raw const ti).cast::<u8>(),
                    std::mem::size_of::<libc::tcp_info>(),
                )
            };
            put(b);
            Some(0)
        }
        _ => None,
    }
}

/// What `nanowire stats` shows of a connection shared at fork
/// (`forkshare::share`): its addresses (packed, 0: unknown) and the inode
/// of the socket under `fd` (0: unknown).
fn shared_conn(fd: c_int, t: TcpRef) -> (u64, u64, u64) {
    use nanowire_stack::xdp::forkpage::pack;
    let (l, r) = t.stream().map_or((None, None), |i| match &*i {
        Inner::Stream(s) => engine_call(|| (s.local_addr().ok(), s.peer_addr().ok())),
        _ => (None, None),
    });
    (
        l.map_or(0, pack),
        r.map_or(0, pack),
        crate::sys::inode_of(fd),
    )
}

/// getsockname/getpeername of an engine connection (`peer`).
pub fn name(t: TcpRef, peer: bool, addr: *mut sockaddr, len: *mut socklen_t) -> Option<c_int> {
    let i = t.stream()?;
    let Inner::Stream(s) = &*i else { return None };
    if peer && t.connecting.load(Ordering::Acquire) && connect_outcome(t).is_none() {
        set_errno(libc::ENOTCONN);
        return Some(-1);
    }
    let a: Option<SocketAddrV4> = if peer {
        engine_call(|| s.peer_addr()).ok()
    } else {
        engine_call(|| s.local_addr()).ok()
    };
    match a {
        Some(a) => {
            if addr.is_null() || len.is_null() {
                set_errno(libc::EFAULT);
                return Some(-1);
            }
            crate::accel::write_sockaddr(a, addr, len);
            Some(0)
        }
        None => {
            set_errno(libc::ENOTCONN);
            Some(-1)
        }
    }
}

/// FIONREAD / SIOCOUTQ.
pub fn queue_len(t: TcpRef, out: bool) -> Option<usize> {
    let i = t.stream()?;
    let Inner::Stream(s) = &*i else { return None };
    Some(if out {
        engine_call(|| s.send_queue())
    } else {
        engine_call(|| s.recv_queue())
    })
}

/// Is `fd` a connection whose kernel readiness must be ignored?
#[inline]
pub fn is_stream(t: TcpRef) -> bool {
    !t.listener()
}

// ---------------------------------------------------------- sendfile, mmsg

/// `sendfile(out, in, off, count)` onto an engine connection: the file's
/// bytes are read (`pread`, at `*off` or at the file position) into a
/// buffer and sent as by `send`, so the engine carries them; only what was
/// sent advances the offset (or the file position), as the kernel's
/// sendfile does. Returns bytes sent, or -1 with errno.
pub fn sendfile(t: TcpRef, out: c_int, inp: c_int, off: Option<&mut i64>, count: usize) -> isize {
    const CHUNK: usize = 64 * 1024;
    // The kernel moves at most MAX_RW_COUNT per call.
    let count = count.min(0x7fff_f000);
    let mut pos = match off.as_deref() {
        Some(o) => *o,
        // SAFETY: lseek on the caller's fd; no memory is touched.
        None => match unsafe { libc::lseek(inp, 0, libc::SEEK_CUR) } {
            -1 => {
                if errno() == libc::ESPIPE {
                    // A pipe or socket as the source: the kernel's EINVAL.
                    set_errno(libc::EINVAL);
                }
                return -1;
            }
            p => p,
        },
    };
    let mut buf = vec![0u8; count.clamp(1, CHUNK)];
    let mut total: usize = 0;
    while total < count {
        let want = (count - total).min(buf.len());
        // SAFETY: `buf` has at least `want` bytes; pread writes at most that.
        let n = unsafe { libc::pread(inp, buf.as_mut_ptr().cast(), want, pos) };
        if n < 0 {
            if total > 0 {
                break;
            }
            if errno() == libc::ESPIPE {
                // A pipe or socket as the source: the kernel's EINVAL.
                set_errno(libc::EINVAL);
            }
            return -1;
        }
        if n == 0 {
            break;
        }
        let s = send(t, out, &buf[..n as usize], 0);
        if s < 0 {
            if total > 0 {
                break;
            }
            return -1;
        }
        let s = s as usize;
        total += s;
        pos += s as i64;
        if s < n as usize {
            break;
        }
    }
    match off {
        Some(o) => *o = pos,
        None => {
            // SAFETY: lseek on the caller's fd to where the sent bytes end.
            unsafe { libc::lseek(inp, pos, libc::SEEK_SET) };
        }
    }
    total as isize
}
