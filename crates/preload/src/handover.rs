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
    // SAFETY: a plain extern "C" handler that takes the locks any call on
    // the sockets takes, before the fork.
    unsafe { libc::pthread_atfork(Some(before_fork), None, None) };
    // The layers below reach the hand-over through these (no import
    // cycle): tcpx's close of a connection a forked child holds, and
    // forkshare's broker answering a child.
    tcpx::hand_over_in_place_with(owner_closing);
    forkshare::answer_with(answer_child);
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
    let h = t.share();
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

/// Hand the engine connection of `t` (`fd` one of its numbers) over to the
/// kernel *in* the application's own socket under the fd (the placeholder,
/// which a forked child's fd names too): no fd number changes, so every
/// process holding it has the kernel's connection. `all`: the record is
/// still in the table (its fds are forgotten here); else the caller is
/// closing it (its last fd is out of the table already) and drops it.
fn in_place(fd: c_int, t: tcpx::TcpRef, why: &str, all: bool) -> io::Result<bool> {
    let e0 = errno();
    let built = hand_over_with(t, |h| {
        let after = after_of(h)?;
        repair_on(fd, h)?;
        Ok(after)
    });
    let after = match built {
        Ok(Some(a)) => a,
        Ok(None) => return Ok(false),
        Err(e) => {
            // Nothing moved: the socket leaves repair mode (if it got there).
            let _ = repair::mode(real::setsockopt, fd, false);
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
/// holds the socket (`forkshare::owner_closing`): the connection goes to
/// the kernel in that socket, which the child keeps. False: it could not
/// be (said why): the caller closes it on the engine.
pub fn owner_closing(fd: c_int, t: tcpx::TcpRef) -> bool {
    const WHY: &str = "fork(): this process closed it, its forked child holds it";
    match in_place(fd, t, WHY, false) {
        Ok(moved) => moved,
        Err(e) => {
            log!(
                Level::Warn,
                "fd {fd} tcp: closed on the engine although a forked child holds it: cannot hand it over to the kernel: {e}; the child's fd is an unconnected socket (ENOTCONN)"
            );
            false
        }
    }
}

/// The broker's answer to a forked child that uses connection `h` (this
/// process owns it): hand it over to the kernel in place. False: no fd of
/// this process names it (nothing done).
pub fn answer_child(h: u64) -> bool {
    const WHY: &str = "fork(): the forked child uses it too";
    let mut found = None;
    crate::table::each_record::<tcpx::Tcp>(|fd, r| {
        let t = tcpx::TcpRef::from(r);
        if found.is_none() && t.mine() && t.share() == h {
            found = Some((fd, t));
        }
    });
    let Some((fd, t)) = found else { return false };
    if let Err(e) = in_place(fd, t, WHY, true) {
        log!(
            Level::Warn,
            "fd {fd} tcp: stays on the xdp engine although {WHY}: cannot hand it over to the kernel: {e}; the child's fd is an unconnected socket (ENOTCONN)"
        );
    }
    true
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
