//! Handing an engine TCP connection over to the kernel (TCP_REPAIR).
//!
//! Used where the engine cannot carry a connection any further but the
//! kernel can: two processes using one connection after `fork()` (only
//! the kernel can serve it to both; `forkshare` decides when, and the
//! connection then goes into the socket both hold: [`in_place`]). The kernel socket is
//! built in repair mode from the engine's state — sequence numbers, the
//! unread received bytes, the unacknowledged and unsent bytes, MSS, window
//! scaling, SACK, timestamps, windows — under the engine's lock; then the
//! steering program stops taking the 4-tuple, the engine forgets the
//! connection without sending anything, repair mode ends (the kernel sends a
//! window probe, which the peer answers) and the bytes never sent go out as
//! an ordinary send. In CLOSE-WAIT (the peer's FIN already in) the kernel
//! is then shown that FIN as a packet from the peer to our own address over
//! a raw socket (delivered locally; TCP_REPAIR has no way to set it). The
//! new socket replaces the application's fd number
//! (and every duplicate of it) with `dup3`, keeping FD_CLOEXEC, O_NONBLOCK,
//! the options set on the fd, and epoll registrations. Needs CAP_NET_ADMIN;
//! without it (or in a state other than ESTABLISHED) the connection stays
//! on the engine and one line says why.

use crate::forkshare;
use crate::log::log;
use crate::real;
use crate::spin::{errno, set_errno};
use crate::sys::engine_call;
use crate::tcpx;
use libc::{c_int, socklen_t};
use nanowire_options::Level;
use nanowire_stack::xdp::Handover;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use nanowire_stack::repair::{self, TCP_RECV_QUEUE, TCP_SEND_QUEUE};

fn last_err(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn setopt<T>(fd: c_int, level: c_int, name: c_int, v: &T, what: &str) -> io::Result<()> {
    repair::setopt(real::setsockopt, fd, level, name, v, what)
}

/// bind(2) or connect(2) (`call`) of `fd` to `a`.
fn to_addr(
    call: unsafe fn(c_int, *const libc::sockaddr, socklen_t) -> c_int,
    fd: c_int,
    a: std::net::SocketAddrV4,
    what: &str,
) -> io::Result<()> {
    let sa = nanowire_stack::sockaddr::sockaddr_in(a);
    // SAFETY: a sockaddr_in and its size, to bind or connect.
    let r = unsafe {
        call(
            fd,
            (&raw const sa).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as socklen_t,
        )
    };
    if r == 0 { Ok(()) } else { Err(last_err(what)) }
}

/// Write all of `data` to the repair queue selected on `fd`.
fn fill(fd: c_int, data: &[u8], what: &str) -> io::Result<()> {
    let mut off = 0;
    while off < data.len() {
        // SAFETY: a live slice.
        let n = unsafe {
            real::send(
                fd,
                data[off..].as_ptr().cast(),
                data.len() - off,
                libc::MSG_DONTWAIT,
            )
        };
        if n <= 0 {
            return Err(last_err(what));
        }
        off += n as usize;
    }
    Ok(())
}

/// Select the queue (receive or send) later repair calls act on.
fn repair_queue(fd: c_int, q: c_int) -> io::Result<()> {
    repair::queue(real::setsockopt, fd, q)
}

/// A kernel socket in repair mode holding the connection `h` describes
/// (the sequence of CRIU's TCP restore): queue sequences, bind, connect
/// (no SYN in repair mode), options, windows, queues, timestamp clock.
fn repair_socket(h: &Handover) -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the fd is owned at once.
    let raw = unsafe { real::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(last_err("socket"));
    }
    // SAFETY: a fresh descriptor nobody else owns.
    let s = unsafe { OwnedFd::from_raw_fd(raw) };
    repair_on(s.as_raw_fd(), h)?;
    Ok(s)
}

/// [`repair_socket`]'s work on socket `fd` (a fresh one, or the
/// application's own unconnected socket under an engine connection: the
/// placeholder every process holding the fd shares); a socket bound
/// already must be bound to the connection's local address.
fn repair_on(fd: c_int, h: &Handover) -> io::Result<()> {
    // Repair mode also forces reuse of the address (the listener or the
    // reservation holds it); SO_REUSEADDR after it would undo that.
    repair::mode(real::setsockopt, fd, true)?;
    // Room for the queues (the kernel charges them like any data).
    let need = (h.send.len().max(h.recv.len()) * 2 + 65536) as i32;
    for (name, force, what) in [
        (libc::SO_SNDBUF, libc::SO_SNDBUFFORCE, "SO_SNDBUFFORCE"),
        (libc::SO_RCVBUF, libc::SO_RCVBUFFORCE, "SO_RCVBUFFORCE"),
    ] {
        let mut cur: c_int = 0;
        let mut l = std::mem::size_of::<c_int>() as socklen_t;
        // SAFETY: an int out-buffer and its length.
        unsafe { real::getsockopt(fd, libc::SOL_SOCKET, name, (&raw mut cur).cast(), &mut l) };
        if cur < need {
            setopt(fd, libc::SOL_SOCKET, force, &need, what)?;
        }
    }
    let rseq = h.rcv_nxt.wrapping_sub(h.recv.len() as u32);
    repair::queue_seqs(real::setsockopt, fd, rseq, h.snd_una)?;
    match bound_to(fd) {
        Some(a) if a.port() != 0 && a != h.tuple.local => {
            return Err(io::Error::other(format!(
                "the socket is bound to {a}, the connection's address is {}",
                h.tuple.local
            )));
        }
        Some(a) if a.port() != 0 => {}
        _ => to_addr(real::bind, fd, h.tuple.local, "bind")?,
    }
    // In repair mode connect only sets the state (no SYN).
    to_addr(real::connect, fd, h.tuple.remote, "connect (repair)")?;
    repair::options(
        real::setsockopt,
        fd,
        h.mss,
        h.wscale,
        h.sack,
        h.tsval.is_some(),
    )?;
    repair_queue(fd, TCP_RECV_QUEUE)?;
    fill(fd, &h.recv, "the receive queue")?;
    // After the receive queue: it advanced the kernel's rcv_nxt to ours,
    // which the window must not lie beyond.
    let w = repair::Window {
        snd_wl1: h.snd_wl1,
        snd_wnd: h.snd_wnd,
        max_window: h.max_snd_wnd.max(h.snd_wnd),
        rcv_wnd: h.rcv_wnd,
        rcv_wup: h.rcv_nxt,
    };
    repair::window(real::setsockopt, fd, &w)?;
    // Bytes in flight go in as sent (the kernel retransmits them on its
    // RTO); the ones never sent are sent normally after repair mode.
    repair_queue(fd, TCP_SEND_QUEUE)?;
    fill(fd, &h.send[..h.sent], "the send queue")?;
    if let Some(ts) = h.tsval {
        repair::timestamp(real::setsockopt, fd, ts)?;
    }
    if h.nodelay {
        setopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            &1i32,
            "TCP_NODELAY",
        )?;
    }
    Ok(())
}

/// The local address socket `fd` is bound to (port 0: unbound).
fn bound_to(fd: c_int) -> Option<std::net::SocketAddrV4> {
    // SAFETY: an all-zero sockaddr_in is a valid out-buffer.
    let mut out: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as socklen_t;
    // SAFETY: out/len are valid for writes.
    if unsafe { real::getsockname(fd, (&raw mut out).cast(), &mut len) } < 0
        || out.sin_family != libc::AF_INET as libc::sa_family_t
    {
        return None;
    }
    Some(std::net::SocketAddrV4::new(
        u32::from_be(out.sin_addr.s_addr).into(),
        u16::from_be(out.sin_port),
    ))
}

pub fn init() {
    // Registered where tcpx's was, so fork's prepare handlers keep their
    // order (fdlife's sweep first, then TCP, then UDP).
    // SAFETY: plain extern "C" handlers: the prepare one takes the locks
    // any call on the sockets takes, before the fork; the child's only
    // tries one (a thread of the parent may have held it).
    unsafe { libc::pthread_atfork(Some(before_fork), None, Some(after_fork_child)) };
    // The layers below reach the hand-over through these (no import
    // cycle): tcpx's close of a connection a forked child holds, and
    // forkshare's broker answering a child.
    let _ = tcpx::IN_PLACE.set(owner_closing);
    let _ = tcpx::ADOPT_ORPHAN.set(adopt_orphan);
    let _ = tcpx::PARKED_EXIT.set(parked_exit);
    let _ = forkshare::ANSWER.set(answer_child);
    let _ = forkshare::TEND.set(tend_parked);
    let _ = crate::accel::ADOPT_INHERITED.set(crate::ahooks::adopt_inherited);
    let _ = crate::accel::EPOLL_HOLDS.set(crate::ready::registered);
}

/// In a forked child: the connections its parent keeps for earlier
/// children are not this process's (never touch the parent's engine
/// objects), and their socket duplicates must not keep those sockets open
/// here (a kernel connection would outlive its last real holder).
extern "C" fn after_fork_child() {
    // Held by a thread of the parent at the fork: left as it is (rare; the
    // duplicates then stay open in this child).
    let Ok(mut g) = PARKED.try_lock() else { return };
    for p in std::mem::take(&mut *g) {
        std::mem::forget(p.inner);
        drop(p.sock);
    }
}

/// fork(), before the child exists: a socket both processes share can only
/// be served where both can use it, the kernel. Every engine listener of
/// this process goes back to the kernel (on the engine service one stays
/// on the engine, shared with the child: `tcpx::share_at_fork`), every engine connection is handed
/// over to the kernel (one that cannot be stays with this process, and in
/// the child its fd is an unconnected kernel socket, see `tcpx::lookup`),
/// and TCP candidates stay kernel sockets in both. (vfork/posix_spawn run
/// no fork handlers.)
extern "C" fn before_fork() {
    if crate::sys::in_engine() {
        return;
    }
    prepare_child(&|_| true, "fork() shares it with the child", true);
}

/// A child process is about to share some of this process's fds (fork,
/// vfork, posix_spawn, exec: `inherits` says which): engine listeners
/// among them go back to the kernel, engine connections among them are
/// handed over to the kernel (`why` says by what), candidates among them
/// stay kernel sockets. `fork`: a fork (listeners on the engine service
/// stay on it, shared with the child).
pub fn prepare_child(inherits: &dyn Fn(c_int) -> bool, why: &str, fork: bool) {
    let conns = tcpx::prepare_child(inherits, why, fork);
    let e = errno();
    for fd in conns {
        if tcpx::lookup(fd).is_some() {
            to_kernel(fd, why);
        }
    }
    set_errno(e);
}

/// Hand the engine connection behind `fd` to the kernel (see the module
/// doc). True if `fd` (and its duplicates) is now a kernel connection;
/// false if it stays on the engine (said why, at warn).
pub fn to_kernel(fd: c_int, why: &str) -> bool {
    let e0 = errno();
    match hand(fd, why) {
        Ok(moved) => moved,
        Err(e) => {
            log!(
                Level::Warn,
                "fd {fd} tcp: stays on the xdp engine although {why}: cannot hand it over to the kernel: {e}"
            );
            set_errno(e0);
            false
        }
    }
}

/// The engine service is gone (see `accel::service_lost`): its program
/// went with it, so every segment reaches the kernel now, which has no
/// connection for an engine's 4-tuple and answers RST. As a host's stack
/// would carry on: each listener on a lost engine goes back to its kernel
/// socket, which listens already (new connections are the kernel's); each
/// connection is handed over to the kernel (TCP_REPAIR, as at fork) or,
/// where that cannot be done (not ESTABLISHED or CLOSE-WAIT, no
/// CAP_NET_ADMIN), reset (RST) with the reason; the connections the
/// application had closed and the engine was still finishing are reset.
/// Each said at warn. A call blocked on one returns: it goes on on the
/// kernel socket, or reports the reset. Runs on a thread of the engine's.
pub fn service_lost() {
    const WHY: &str = "the engine service is gone (its XDP program went with it)";
    let e0 = errno();
    for fd in tcpx::service_lost(WHY) {
        if let Err(e) = hand(fd, WHY) {
            tcpx::abort(fd);
            log!(
                Level::Warn,
                "fd {fd} tcp: reset (RST): {WHY}, and the connection cannot be handed over to the kernel: {e}"
            );
        }
    }
    let n = engine_call(nanowire_stack::xdp::tcp_service_lost);
    if n > 0 {
        log!(
            Level::Warn,
            "{n} tcp connection(s) the application had closed, still finishing on the engine: reset (RST): {WHY}"
        );
    }
    set_errno(e0);
}

/// [`to_kernel`]'s work: `Ok(false)` when `fd` is no engine connection
/// (any more), an error when it stays on the engine.
fn hand(fd: c_int, why: &str) -> io::Result<bool> {
    let Some(t) = tcpx::lookup(fd) else {
        return Ok(false);
    };
    let h = t.common.share();
    if h != 0 && forkshare::decide(h) {
        // Shared with a forked child (its fd names the same socket): the
        // connection goes into that socket, for both processes.
        let r = in_place(fd, t, why, true);
        forkshare::settle(h);
        return r;
    }
    let e0 = errno();
    let Some((new, after)) = hand_over_with(t, repair_socket_after)? else {
        return Ok(false);
    };
    let nfd = new.as_raw_fd();
    tcpx::carry_options(fd, nfd);
    finish_repair(fd, nfd, &after);
    crate::execnames::note_sole(nfd);
    // Every number of this socket now names the kernel connection.
    let fds = tcpx::fds_of(t);
    for &f in &fds {
        // SAFETY: fcntl on an fd of ours.
        let cloexec = unsafe { real::fcntl(f, libc::F_GETFD, 0) } & libc::FD_CLOEXEC != 0;
        // SAFETY: dup3 onto an fd number the application owns; the old
        // file (the placeholder or the port reservation) goes with it.
        unsafe { real::dup3(nfd, f, if cloexec { libc::O_CLOEXEC } else { 0 }) };
        crate::ready::tcp_to_kernel(f);
    }
    drop(new);
    done(t, &fds, fd, why);
    set_errno(e0);
    Ok(true)
}

/// The engine's hand-over of `t`'s connection to the owner `build` makes
/// (under the engine's lock), with `t.handing` set meanwhile (cleared
/// again if it fails). `Ok(None)`: `t` has no engine connection (any more).
fn hand_over_with<T>(
    t: tcpx::TcpRef,
    build: impl FnOnce(&Handover) -> io::Result<T>,
) -> io::Result<Option<T>> {
    let Some(inner) = t.stream_inner() else {
        return Ok(None);
    };
    let tcpx::Inner::Stream(s) = &*inner else {
        return Ok(None);
    };
    t.handing.store(true, std::sync::atomic::Ordering::Release);
    match engine_call(|| s.hand_over(build)) {
        Ok(x) => Ok(Some(x)),
        Err(e) => {
            t.handing.store(false, std::sync::atomic::Ordering::Release);
            Err(e)
        }
    }
}

/// After the kernel socket `nfd` took the connection of `fd`: leave repair
/// mode (the kernel owns the connection from here: the steering program no
/// longer takes its segments), send what was never sent, show the kernel
/// the peer's FIN.
fn finish_repair(fd: c_int, nfd: c_int, after: &After) {
    let _ = repair::mode(real::setsockopt, nfd, false);
    let _ = repair::reuse_again(real::setsockopt, nfd, after.reuseaddr);
    if !after.unsent.is_empty() {
        // Fits: the send buffer was sized for the whole queue.
        let _ = fill(nfd, &after.unsent, "unsent bytes");
    }
    if let Some(fin) = &after.fin
        && let Err((_, e)) = crate::inject::inject(&[fin], "the peer's FIN")
    {
        log!(
            Level::Warn,
            "fd {fd} tcp: handed over to the kernel, but the peer's FIN could not be given to it ({e}): reads will wait for data that never comes"
        );
    }
}

/// The fds `fds` of `t` name the kernel's connection now: the
/// application's blocking mode on it, the shim forgets the record. No fds:
/// the application is closing its last one meanwhile (its close finds
/// the engine object gone and leaves the record to the pool).
fn done(t: tcpx::TcpRef, fds: &[c_int], fd: c_int, why: &str) {
    if let Some(&f) = fds.first() {
        // SAFETY: F_GETFL on our fd.
        let fl = unsafe { real::fcntl(f, libc::F_GETFL, 0) };
        let nb = if t.common.nonblock() {
            fl | libc::O_NONBLOCK
        } else {
            fl & !libc::O_NONBLOCK
        };
        // SAFETY: F_SETFL on our fd.
        unsafe { real::fcntl(f, libc::F_SETFL, nb as libc::c_ulong) };
    }
    if fds.is_empty() {
        tcpx::drop_engine(t);
    } else {
        tcpx::forget(t, fds);
    }
    t.handing.store(false, std::sync::atomic::Ordering::Release);
    log!(
        Level::Warn,
        "fd {fd} tcp: moved to the kernel (TCP_REPAIR hand-over): {why}"
    );
}

/// The build of an in-place hand-over: the state goes into the socket `fd`
/// itself (repair mode), with what is left to do after it.
fn into_socket(fd: c_int) -> impl FnOnce(&Handover) -> io::Result<After> {
    move |h| {
        let after = after_of(h)?;
        repair_on(fd, h)?;
        Ok(after)
    }
}

/// An in-place hand-over failed: nothing moved, and the socket `fd` leaves
/// repair mode (if it got there).
fn not_repaired(fd: c_int) {
    let _ = repair::mode(real::setsockopt, fd, false);
}

/// Hand the engine connection of `t` (`fd` one of its numbers) over to the
/// kernel *in* the application's own socket under the fd (the placeholder,
/// which a forked child's fd names too): no fd number changes, so every
/// process holding it has the kernel's connection. `all`: the record is
/// still in the table (its fds are forgotten here); else the caller is
/// closing it (its last fd is out of the table already) and drops it.
fn in_place(fd: c_int, t: tcpx::TcpRef, why: &str, all: bool) -> io::Result<bool> {
    let e0 = errno();
    let after = match hand_over_with(t, into_socket(fd)) {
        Ok(Some(a)) => a,
        Ok(None) => return Ok(false),
        Err(e) => {
            not_repaired(fd);
            set_errno(e0);
            return Err(e);
        }
    };
    finish_repair(fd, fd, &after);
    let fds = if all { tcpx::fds_of(t) } else { vec![fd] };
    if all {
        for &f in &fds {
            crate::ready::tcp_to_kernel(f);
        }
        done(t, &fds, fd, why);
    } else {
        t.handing.store(false, std::sync::atomic::Ordering::Release);
        log!(
            Level::Warn,
            "fd {fd} tcp: moved to the kernel (TCP_REPAIR hand-over): {why}"
        );
    }
    set_errno(e0);
    Ok(true)
}

/// The owner closes its last fd `fd` of `t` while a forked child still
/// holds the socket (`forkshare::owner_closing`). On the engine service the
/// connection stays on this engine, kept for the child ([`Parked`]): the
/// child's first use moves it to the child's engine (the fork-per-connection
/// shape: the parent closes its copy at once, the child serves it).
/// Elsewhere, or if it cannot be kept, it goes to the kernel in that socket,
/// which the child keeps; if that cannot be either (said why), the caller
/// closes it on the engine.
pub fn owner_closing(fd: c_int, t: tcpx::TcpRef) -> tcpx::OwnerClosed {
    let why = if EXITING.load(std::sync::atomic::Ordering::Acquire) {
        "fork(): this process exits, its forked child holds it"
    } else {
        "fork(): this process closed it, its forked child holds it"
    };
    if park(fd, t) {
        return tcpx::OwnerClosed::Parked;
    }
    match in_place(fd, t, why, false) {
        Ok(true) => tcpx::OwnerClosed::Moved,
        Ok(false) => tcpx::OwnerClosed::Failed,
        Err(e) => {
            log!(
                Level::Warn,
                "fd {fd} tcp: closed on the engine although a forked child holds it: cannot hand it over to the kernel: {e}; the child's fd is an unconnected socket (ENOTCONN)"
            );
            tcpx::OwnerClosed::Failed
        }
    }
}

/// A connection on the engine service its owner closed while forked
/// children hold its socket: kept on the owner's engine (acknowledged,
/// retransmitted) with a duplicate of the socket, until a child uses it
/// (moved to the child's engine, [`answer_child`]), every child lets go
/// (closed on the engine: FIN, [`tend_parked`]), [`PARK_FOR`] passes
/// (handed over to the kernel in the socket, which the children hold: a
/// child killed by SIGKILL never lets go) or the owner exits (the same).
struct Parked {
    h: u64,
    sock: OwnedFd,
    inner: std::sync::Arc<tcpx::Inner>,
    at: std::time::Instant,
}

static PARKED: std::sync::Mutex<Vec<Parked>> = std::sync::Mutex::new(Vec::new());

/// How long a connection the owner closed waits for a child's first use.
const PARK_FOR: std::time::Duration = std::time::Duration::from_secs(1);

fn parked() -> std::sync::MutexGuard<'static, Vec<Parked>> {
    PARKED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Keep `t`'s connection (its last fd `fd` closing, its slot decided by
/// this close) on the engine for the forked children holding it. False:
/// not on the engine service, or no duplicate of the socket.
fn park(fd: c_int, t: tcpx::TcpRef) -> bool {
    let h = t.common.share();
    if h == 0
        || t.stream_on_service() != Some(true)
        || EXITING.load(std::sync::atomic::Ordering::Acquire)
    {
        return false;
    }
    // SAFETY: a duplicate of the application's fd, owned below.
    let d = unsafe { real::fcntl(fd, libc::F_DUPFD_CLOEXEC, tcpx::keep_fd_floor() as u64) };
    // SAFETY: as above, any number.
    let d = if d < 0 {
        unsafe { real::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) }
    } else {
        d
    };
    if d < 0 {
        return false;
    }
    // SAFETY: a fresh descriptor of ours.
    let sock = unsafe { OwnedFd::from_raw_fd(d) };
    let Some(inner) = tcpx::take_engine(t) else {
        return false;
    };
    parked().push(Parked {
        h,
        sock,
        inner,
        at: std::time::Instant::now(),
    });
    forkshare::undecide(h);
    log!(
        Level::Info,
        "fd {fd} tcp: closed by this process while its forked child holds it: kept on the xdp engine for the child"
    );
    true
}

/// The kept connection `p` goes to the kernel in its socket (the children
/// hold it); or, if it cannot, is closed on the engine (said why). True:
/// the kernel's.
fn park_to_kernel(p: Parked, why: &str) -> bool {
    let fd = p.sock.as_raw_fd();
    let tcpx::Inner::Stream(s) = &*p.inner else {
        return false;
    };
    let e0 = errno();
    match engine_call(|| s.hand_over(into_socket(fd))) {
        Ok(after) => {
            finish_repair(fd, fd, &after);
            log!(
                Level::Info,
                "tcp connection kept for a forked child: moved to the kernel (TCP_REPAIR hand-over): {why}"
            );
            engine_call(|| drop(p.inner));
            set_errno(e0);
            true
        }
        Err(e) => {
            not_repaired(fd);
            log!(
                Level::Warn,
                "tcp connection kept for a forked child: closed on the engine: {why}, and it cannot be handed over to the kernel: {e}; the child's fd is an unconnected socket (ENOTCONN)"
            );
            tcpx::close_engine(p.inner);
            set_errno(e0);
            false
        }
    }
}

/// The broker's turn over the kept connections: one no child holds any
/// more is closed on the engine (FIN), one kept for [`PARK_FOR`] goes to
/// the kernel. True while some are kept.
pub fn tend_parked() -> bool {
    let due: Vec<Parked> = {
        let mut g = parked();
        if g.is_empty() {
            return false;
        }
        let (due, kept) = std::mem::take(&mut *g).into_iter().partition(|p| {
            forkshare::holders(p.h).is_none_or(|n| n == 0) || p.at.elapsed() >= PARK_FOR
        });
        *g = kept;
        due
    };
    for p in due {
        end_parked(p, "no forked child used it in time");
    }
    !parked().is_empty()
}

/// Decide kept connection `p` now: closed on the engine if no child holds
/// it, else to the kernel (`why`).
fn end_parked(p: Parked, why: &str) {
    let h = p.h;
    if !forkshare::decide(h) {
        tcpx::close_engine(p.inner);
        return;
    }
    if forkshare::holders(h).is_none_or(|n| n == 0) {
        tcpx::close_engine(p.inner);
    } else if park_to_kernel(p, why) {
        // The first holder that can takes it from the kernel onto its
        // engine (`Claimed::Orphaned`).
        forkshare::orphan(h);
        return;
    }
    forkshare::settle(h);
}

/// Set when the process exits: its closes keep nothing more.
static EXITING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The owner exits: its kept connections are decided first (to the kernel
/// where a child holds one, closed on the engine otherwise).
pub fn parked_exit() {
    EXITING.store(true, std::sync::atomic::Ordering::Release);
    // An answer under way (the broker moving a connection to a child) ends
    // first: the child reads the state from this process's memfd, and a
    // connection it could not take would be nobody's (the child's data
    // then met a socket without it: RST; found in a clean-clone CI, a
    // fork-per-connection server exiting right after its last fork).
    // Bounded: the offer itself gives up on a child that died.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while OFFERING.load(std::sync::atomic::Ordering::Acquire) > 0
        && std::time::Instant::now() < until
    {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let all = std::mem::take(&mut *parked());
    for p in all {
        end_parked(p, "this process exits");
    }
}

/// The broker's answer to a forked child that uses connection `h` (this
/// process owns it): move it to the child's engine if the child asked
/// (`taker`, on the engine service) and that can be done, else hand it
/// over to the kernel in place.
pub fn answer_child(h: u64, taker: u32) -> forkshare::Answer {
    const WHY: &str = "fork(): the forked child uses it too";
    let _busy = Offering::start();
    let mut found = None;
    crate::table::each_record::<tcpx::Tcp>(|fd, r| {
        let t = tcpx::TcpRef::from(r);
        if found.is_none() && t.mine() && t.common.share() == h {
            found = Some((fd, t));
        }
    });
    let Some((fd, t)) = found else {
        // A UDP socket shared at fork: off the engine, for both.
        if let Some(a) = crate::accel::answer_child(h, taker) {
            return a;
        }
        return answer_parked(h, taker);
    };
    if taker != 0 && move_to(fd, t, h, taker) {
        return forkshare::Answer::Moved;
    }
    if let Err(e) = in_place(fd, t, WHY, true) {
        log!(
            Level::Warn,
            "fd {fd} tcp: stays on the xdp engine although {WHY}: cannot hand it over to the kernel: {e}; the child's fd is an unconnected socket (ENOTCONN)"
        );
    }
    // A move not taken left it set until this hand-over's end.
    t.handing.store(false, std::sync::atomic::Ordering::Release);
    forkshare::Answer::Decided
}

/// [`answer_child`] for a connection the owner closed and keeps
/// ([`Parked`]): moved to the child's engine if it asked, else to the
/// kernel.
fn answer_parked(h: u64, taker: u32) -> forkshare::Answer {
    let p = {
        let mut g = parked();
        let Some(i) = g.iter().position(|p| p.h == h) else {
            return forkshare::Answer::NotMine;
        };
        g.swap_remove(i)
    };
    let tcpx::Inner::Stream(s) = &*p.inner else {
        return forkshare::Answer::NotMine;
    };
    if taker != 0 {
        const WHAT: &str = "tcp connection kept for a forked child";
        match offer_to(s, p.sock.as_raw_fd(), (h, taker), false, WHAT) {
            Offered::Taken => {
                log!(
                    Level::Info,
                    "{WHAT}: moved to the xdp engine of pid {taker}"
                );
                engine_call(|| drop(p.inner));
                return forkshare::Answer::Moved;
            }
            Offered::Back(Some(s2)) => {
                let p2 = Parked {
                    inner: std::sync::Arc::new(tcpx::Inner::Stream(s2)),
                    ..p
                };
                park_to_kernel(p2, "fork(): the forked child could not take it");
                return forkshare::Answer::Decided;
            }
            Offered::Back(None) => return forkshare::Answer::Decided,
            Offered::NotMoved => {}
        }
    }
    park_to_kernel(p, "fork(): the forked child uses it");
    forkshare::Answer::Decided
}

/// Move the connection of `t` (`fd` one of its numbers, `h` its slot) to
/// the engine of the forked child `taker` (issue 24 item 1): the engine
/// exports it and offers it to the service with the socket
/// (`XdpTcpStream::move_out`), the child adopts it (`forkshare::
/// offer_moved`); this process's record is then a copy, as a child's was.
/// False: it stays here (not moved, or not taken and taken back): the
/// caller hands it over to the kernel (after a move not taken, `handing`
/// stays set for it: a call in flight on the old engine object waits for
/// the kernel's connection rather than failing in between).
fn move_to(fd: c_int, t: tcpx::TcpRef, h: u64, taker: u32) -> bool {
    let Some(inner) = t.stream_inner() else {
        return false;
    };
    let tcpx::Inner::Stream(s) = &*inner else {
        return false;
    };
    t.handing.store(true, std::sync::atomic::Ordering::Release);
    match offer_to(s, fd, (h, taker), true, &format!("fd {fd} tcp")) {
        Offered::Taken => {
            // Its readiness comes from the new owner now: the application's
            // epoll registrations go to the socket itself, whose first use
            // here asks for the connection back (as the kernel's).
            for f in tcpx::fds_of(t) {
                crate::ready::tcp_to_kernel(f);
            }
            tcpx::disown(t);
            t.handing.store(false, std::sync::atomic::Ordering::Release);
            log!(
                Level::Info,
                "fd {fd} tcp: moved to the xdp engine of pid {taker} (fork(): the forked child uses it); this process's copy is served by it"
            );
            true
        }
        Offered::Back(s2) => {
            if let Some(s2) = s2 {
                tcpx::restore(t, s2);
            }
            false
        }
        Offered::NotMoved => {
            t.handing.store(false, std::sync::atomic::Ordering::Release);
            false
        }
    }
}

/// Answers to children under way ([`answer_child`], on the broker's
/// thread): a move's exported state lives in a memfd of this process until
/// the child has read it, so the process's exit waits for them
/// ([`parked_exit`]).
static OFFERING: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// One answer under way, while it lives.
struct Offering;

impl Offering {
    fn start() -> Offering {
        OFFERING.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Offering
    }
}

impl Drop for Offering {
    fn drop(&mut self) {
        OFFERING.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// What became of a connection offered to a forked child ([`offer_to`]).
enum Offered {
    /// Still here, untouched (it could not be moved out; said why).
    NotMoved,
    /// The child took it.
    Taken,
    /// Not taken: back on this engine (a new handle), or lost if it
    /// could not come back (said why).
    Back(Option<nanowire_stack::xdp::XdpTcpStream>),
}

/// Move the connection of `s` out of this engine (its socket `sock`) and
/// offer it to the forked child `taker` through slot `h`
/// (`forkshare::offer_moved`); if the child does not take it, this engine
/// takes it back. `owner_holds`: this process still holds the socket
/// (else it stops counting as a holder once the taker owns it: counted
/// before the offer, since the taker may close at once). `what` names the
/// connection in the log lines.
fn offer_to(
    s: &nanowire_stack::xdp::XdpTcpStream,
    sock: c_int,
    (h, taker): (u64, u32),
    owner_holds: bool,
    what: &str,
) -> Offered {
    let m = match engine_call(|| s.move_out(sock)) {
        Ok(m) => m,
        Err(e) => {
            log!(
                Level::Info,
                "{what}: cannot move it to the engine of pid {taker}, which uses it too: {e}"
            );
            return Offered::NotMoved;
        }
    };
    if !owner_holds {
        forkshare::dropped(h);
    }
    if forkshare::offer_moved(h, &m.bytes, taker) {
        return Offered::Taken;
    }
    if !owner_holds {
        forkshare::held_again(h);
    }
    match engine_call(|| s.move_back(&m)) {
        Ok(s2) => Offered::Back(Some(s2)),
        Err(e) => {
            log!(
                Level::Warn,
                "{what}: the forked child pid {taker} did not take it and it cannot come back to this engine: {e}"
            );
            Offered::Back(None)
        }
    }
}

/// What the hand-over leaves to do once the kernel owns the connection.
struct After {
    /// Bytes never sent: sent normally after repair mode.
    unsent: Vec<u8>,
    /// The peer's FIN (CLOSE-WAIT), given to the kernel as a packet.
    fin: Option<Vec<u8>>,
    /// SO_REUSEADDR to set again (repair mode off clears it).
    reuseaddr: bool,
}

/// What is left to do after repair mode for the connection `h` describes
/// (fails before anything changed if the peer's FIN cannot be delivered).
fn after_of(h: &Handover) -> io::Result<After> {
    let fin = h.peer_fin.then(|| h.peer_fin_packet());
    if fin.is_some() {
        // The FIN needs a raw socket: fail before anything changed.
        drop(crate::inject::raw_socket("the peer's FIN")?);
    }
    Ok(After {
        unsent: h.send[h.sent..].to_vec(),
        fin,
        reuseaddr: h.reuseaddr,
    })
}

/// `repair_socket`, plus what is left to do after repair mode.
fn repair_socket_after(h: &Handover) -> io::Result<(OwnedFd, After)> {
    let after = after_of(h)?;
    Ok((repair_socket(h)?, after))
}

// ------------------------------------------- connections across exec
//
// Issue 24 item 2: the new image's half (which connections: `execnames`).

/// Take the kernel's connection on `fd` (ESTABLISHED or CLOSE-WAIT, one
/// this image's predecessor handed over at exec) onto the engine: the
/// engine claims its 4-tuple and adopts the state [`dump`] reads in repair
/// mode; the kernel socket then forgets the connection without a word and
/// stays the fd's, bound to the local address. False (said why): the
/// kernel keeps it.
#[cold]
pub fn adopt_connected(fd: c_int) -> bool {
    let e0 = errno();
    let done = match from_kernel(fd, None) {
        Ok((s, ka)) => {
            let (local, remote) = engine_call(|| (s.local_addr().ok(), s.peer_addr().ok()));
            tcpx::adopted_stream(fd, s, ka);
            log!(
                Level::Info,
                "fd {fd} tcp {} -> {}: xdp (a connection inherited across exec, taken from the kernel)",
                local.map(|a| a.to_string()).unwrap_or_default(),
                remote.map(|a| a.to_string()).unwrap_or_default()
            );
            true
        }
        Err(e) => {
            log!(
                Level::Warn,
                "fd {fd} tcp: kernel socket; xdp not used: a connection inherited across exec that cannot be taken from the kernel: {e}"
            );
            false
        }
    };
    set_errno(e0);
    done
}

/// Take the kernel's connection on `fd` (ESTABLISHED or CLOSE-WAIT) onto
/// this process's engine ([`adopt_connected`]'s work): the stream and the
/// keepalive settings the kernel had (on, idle, interval, count). On an
/// error the kernel keeps it (the socket is out of repair mode again).
fn from_kernel(
    fd: c_int,
    taker: Option<nanowire_stack::xdp::Taker>,
) -> io::Result<(nanowire_stack::xdp::XdpTcpStream, (bool, u64, u64, u32))> {
    let o = tcpx::opts_unknown(fd);
    let reuse = tcpx::get_int(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR).is_some_and(|v| v != 0);
    let mut ka = (false, 7200, 75, 9);
    let r = engine_call(|| {
        nanowire_stack::xdp::XdpTcpStream::adopt_kernel(fd, &o, taker, || {
            let h = dump(fd)?;
            if let Some((idle, intvl, cnt)) = h.engine.keepalive {
                ka = (true, idle, intvl, cnt);
            }
            Ok(h)
        })
    });
    let s = match r {
        Ok(s) => s,
        Err(e) => {
            // Out of repair mode (if it got there): the kernel's again.
            let _ = repair::mode(real::setsockopt, fd, false);
            let _ = repair::reuse_again(real::setsockopt, fd, reuse);
            return Err(e);
        }
    };
    let local = engine_call(|| s.local_addr().ok());
    let_go(fd, local, reuse);
    Ok((s, ka))
}

/// Take the connection an owner that left (exit, or its close while this
/// process held a copy) handed over to the kernel in the socket shared at
/// fork onto this process's engine (`forkshare::Claimed::Orphaned`; issue
/// 24 item 1), on `taker`'s engine (on the engine service), else on an
/// engine of this process's own once the owner `owner` is gone (its engine
/// held the interface): the copy `t` on `fd` gives way to a record of this
/// process's with the application's modes. `None` (said why): the kernel
/// keeps it.
#[cold]
pub fn adopt_orphan(
    fd: c_int,
    t: tcpx::TcpRef,
    owner: u32,
    taker: Option<nanowire_stack::xdp::Taker>,
) -> Option<tcpx::TcpRef> {
    let e0 = errno();
    if taker.is_none() {
        // An engine of its own: once the owner is gone (its engine held
        // the interface), and `Engine::open` waits for the owner's AF_XDP
        // queue, which the kernel frees a moment later.
        crate::accel::gone(owner);
    }
    let r = match from_kernel(fd, taker) {
        Ok((s, ka)) => {
            let t2 = tcpx::succeed_copy(fd, t, s, Some(ka));
            log!(
                Level::Info,
                "fd {fd} tcp: inherited through fork(): taken onto this process's xdp engine from the kernel (pid {owner}, which held it, left it)"
            );
            Some(t2)
        }
        Err(e) => {
            log!(
                Level::Warn,
                "fd {fd} tcp: inherited through fork(): the kernel's connection, shared with the parent process: it cannot be taken from the kernel: {e}"
            );
            None
        }
    };
    set_errno(e0);
    r
}

/// A socket option of `fd` (`what` names it in the error).
fn get_opt<T: tcpx::Plain>(fd: c_int, level: c_int, name: c_int, what: &str) -> io::Result<T> {
    tcpx::get_plain(fd, level, name).ok_or_else(|| last_err(what))
}

/// An ioctl of `fd` that answers an int.
fn ioctl_int(fd: c_int, req: libc::c_ulong, what: &str) -> io::Result<usize> {
    let mut v: c_int = 0;
    // SAFETY: the request writes one int to the address passed.
    let r = unsafe { real::ioctl(fd, req, (&raw mut v) as libc::c_ulong) };
    if r == 0 && v >= 0 {
        Ok(v as usize)
    } else {
        Err(last_err(what))
    }
}

/// Peek `n` bytes of the repair queue selected on `fd`.
fn peek(fd: c_int, n: usize, what: &str) -> io::Result<Vec<u8>> {
    let mut b = vec![0u8; n];
    if n == 0 {
        return Ok(b);
    }
    // SAFETY: a live buffer of n bytes.
    let r = unsafe {
        real::recv(
            fd,
            b.as_mut_ptr().cast(),
            n,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if r < 0 {
        return Err(last_err(what));
    }
    if r as usize != n {
        return Err(io::Error::other(format!("{what}: {r} of {n} bytes")));
    }
    Ok(b)
}

const SIOCOUTQNSD: libc::c_ulong = 0x894B;
const TCPI_OPT_TIMESTAMPS: u8 = 1;
const TCPI_OPT_SACK: u8 = 2;
const TCPI_OPT_WSCALE: u8 = 4;

/// The state of the kernel's connection on `fd` (CRIU's TCP dump): repair
/// mode on (silent from here; needs CAP_NET_ADMIN), the queues' sequence
/// numbers and bytes (unread; in flight and never sent), the windows, the
/// options as negotiated, the timestamp clock, the RTT estimate and
/// congestion window, the socket options. The socket is left in repair
/// mode (the caller ends it either way). ESTABLISHED or CLOSE-WAIT only.
fn dump(fd: c_int) -> io::Result<Handover> {
    // Segments that passed the steering program before the claim may still
    // be on their way into the kernel socket (softirq, or its backlog while
    // a dump call holds the socket): the dump counts once two readings of
    // the queues' ends 200 µs apart agree.
    let mut h = dump_once(fd)?;
    for _ in 0..5 {
        std::thread::sleep(std::time::Duration::from_micros(200));
        let (rcv, inq, snd, outq) = queue_marks(fd)?;
        let fin = u32::from(h.peer_fin);
        if rcv == h.rcv_nxt.wrapping_add(fin)
            && inq == h.recv.len()
            && snd == h.snd_una.wrapping_add(h.send.len() as u32)
            && outq == h.send.len()
        {
            return Ok(h);
        }
        h = dump_once(fd)?;
    }
    Err(io::Error::other(
        "the kernel's connection kept changing while it was read",
    ))
}

/// The ends of the queues of `fd` (in repair mode): the receive queue's
/// (rcv_nxt) and its unread bytes, the send queue's (write_seq) and its
/// bytes.
fn queue_marks(fd: c_int) -> io::Result<(u32, usize, u32, usize)> {
    let end = |q, what| -> io::Result<u32> {
        repair_queue(fd, q)?;
        get_opt(fd, libc::IPPROTO_TCP, libc::TCP_QUEUE_SEQ, what)
    };
    let rcv = end(TCP_RECV_QUEUE, "TCP_QUEUE_SEQ (receive)")?;
    let inq = ioctl_int(fd, libc::FIONREAD as libc::c_ulong, "SIOCINQ")?;
    let snd = end(TCP_SEND_QUEUE, "TCP_QUEUE_SEQ (send)")?;
    let outq = ioctl_int(fd, libc::TIOCOUTQ as libc::c_ulong, "SIOCOUTQ")?;
    repair_queue(fd, 0)?;
    Ok((rcv, inq, snd, outq))
}

/// One reading of [`dump`]'s state.
fn dump_once(fd: c_int) -> io::Result<Handover> {
    let ti = tcpx::tcp_info_of(fd).ok_or_else(|| last_err("TCP_INFO"))?;
    let peer_fin = match ti.tcpi_state {
        1 => false,
        8 => true,
        s => {
            return Err(io::Error::other(format!(
                "only an established connection is taken (it is {})",
                nanowire_xdp_state_name(s)
            )));
        }
    };
    let local = bound_to(fd).ok_or_else(|| io::Error::other("not an IPv4 socket"))?;
    let remote = peer_of(fd)?;
    let int = |level, name| tcpx::get_int(fd, level, name).unwrap_or(0);
    let nodelay = int(libc::IPPROTO_TCP, libc::TCP_NODELAY) != 0;
    let reuseaddr = int(libc::SOL_SOCKET, libc::SO_REUSEADDR) != 0;
    let keepalive = (int(libc::SOL_SOCKET, libc::SO_KEEPALIVE) != 0).then(|| {
        (
            int(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE).max(1) as u64,
            int(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL).max(1) as u64,
            int(libc::IPPROTO_TCP, libc::TCP_KEEPCNT).max(1) as u32,
        )
    });
    let (ttl, tos) = nanowire_stack::xdp::ip_header_of(fd);
    repair::mode(real::setsockopt, fd, true)?;
    let (rcv_nxt, inq, write_seq, outq) = queue_marks(fd)?;
    repair_queue(fd, TCP_RECV_QUEUE)?;
    let recv = peek(fd, inq, "the receive queue")?;
    repair_queue(fd, TCP_SEND_QUEUE)?;
    let unsent = ioctl_int(fd, SIOCOUTQNSD, "SIOCOUTQNSD")?.min(outq);
    let send = peek(fd, outq, "the send queue")?;
    repair_queue(fd, 0)?;
    let w: repair::Window = get_opt(
        fd,
        libc::IPPROTO_TCP,
        libc::TCP_REPAIR_WINDOW,
        "TCP_REPAIR_WINDOW",
    )?;
    let mss: c_int = get_opt(fd, libc::IPPROTO_TCP, libc::TCP_MAXSEG, "TCP_MAXSEG")?;
    let ts = ti.tcpi_options & TCPI_OPT_TIMESTAMPS != 0;
    let tsval = if ts {
        Some(get_opt::<u32>(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_TIMESTAMP,
            "TCP_TIMESTAMP",
        )?)
    } else {
        None
    };
    let ws = ti.tcpi_options & TCPI_OPT_WSCALE != 0;
    let rcv_nxt = rcv_nxt.wrapping_sub(u32::from(peer_fin));
    let snd_mss = ti.tcpi_snd_mss.max(64);
    let us = |v: u32| u64::from(v) * 1000;
    Ok(Handover {
        tuple: nanowire_stack::xdp::FourTuple { local, remote },
        snd_una: write_seq.wrapping_sub(outq as u32),
        sent: outq - unsent,
        send,
        rcv_nxt,
        recv,
        mss: mss.max(64) as u32,
        wscale: ws.then_some((ti.tcpi_snd_rcv_wscale & 0xf, ti.tcpi_snd_rcv_wscale >> 4)),
        sack: ti.tcpi_options & TCPI_OPT_SACK != 0,
        tsval,
        snd_wl1: w.snd_wl1,
        snd_wnd: w.snd_wnd,
        max_snd_wnd: w.max_window,
        // The window's right edge as the kernel advertised it, from rcv_nxt
        // (none left if the edge is behind it: never a wrapped huge window).
        rcv_wnd: {
            let left = w
                .rcv_wup
                .wrapping_add(w.rcv_wnd)
                .wrapping_sub(rcv_nxt.wrapping_add(u32::from(peer_fin)));
            if (left as i32) < 0 { 0 } else { left }
        },
        nodelay,
        peer_fin,
        ts_recent: 0,
        reuseaddr,
        engine: nanowire_stack::xdp::EngineState {
            srtt: us(ti.tcpi_rtt),
            rttvar: us(ti.tcpi_rttvar),
            rto: us(ti.tcpi_rto),
            cwnd: ti.tcpi_snd_cwnd.saturating_mul(snd_mss),
            ssthresh: if ti.tcpi_snd_ssthresh >= 0x7fff_ffff / 2 {
                u32::MAX
            } else {
                ti.tcpi_snd_ssthresh.saturating_mul(snd_mss)
            },
            sndbuf: 0,
            rcvbuf: 0,
            rcvbuf_max: 0,
            keepalive,
            ttl,
            tos,
            linger0: tcpx::linger0_of(fd),
        },
    })
}

/// The peer of a connected socket.
fn peer_of(fd: c_int) -> io::Result<std::net::SocketAddrV4> {
    // SAFETY: an all-zero sockaddr_in is a valid out-buffer.
    let mut out: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as socklen_t;
    // SAFETY: out/len are valid for writes.
    if unsafe { real::getpeername(fd, (&raw mut out).cast(), &mut len) } < 0 {
        return Err(last_err("getpeername"));
    }
    Ok(std::net::SocketAddrV4::new(
        u32::from_be(out.sin_addr.s_addr).into(),
        u16::from_be(out.sin_port),
    ))
}

fn nanowire_xdp_state_name(s: u8) -> &'static str {
    nanowire_stack::xdp::tcp_state_name(s)
}

/// The engine has the connection `fd` carried: the kernel socket forgets it
/// without a word (a disconnect in repair mode sends nothing), its pending
/// error (ECONNABORTED, from that disconnect) is cleared, it binds the
/// local address again (it holds the port, as the connection did; repair
/// mode lets it share it with a listener) and leaves repair mode.
fn let_go(fd: c_int, local: Option<std::net::SocketAddrV4>, reuse: bool) {
    // SAFETY: an all-zero sockaddr is AF_UNSPEC.
    let un: libc::sockaddr = unsafe { std::mem::zeroed() };
    // SAFETY: an AF_UNSPEC address and its size: connect() disconnects.
    unsafe {
        real::connect(
            fd,
            &raw const un,
            std::mem::size_of::<libc::sockaddr>() as socklen_t,
        )
    };
    let _ = get_opt::<c_int>(fd, libc::SOL_SOCKET, libc::SO_ERROR, "SO_ERROR");
    if let Some(a) = local {
        let _ = to_addr(real::bind, fd, a, "bind");
    }
    let _ = repair::mode(real::setsockopt, fd, false);
    let _ = repair::reuse_again(real::setsockopt, fd, reuse);
}
