//! What serves an fd, and the operations each kind of fd has.
//!
//! Every interposed receive and send normalises its arguments into one
//! [`Recv`] or [`Send`] (the caller's buffers, and which libc call it was,
//! so that the kernel path makes that same call) and makes one call here.
//! [`of`] is the one lookup: the fd's record in the one table of engine
//! sockets (`table::record`: a tagged pointer, two loads, no lock), read
//! as a [`Sock`]; then the fd's protocol serves the call through [`Ops`]:
//!
//! * [`Sock::Tcp`]: an engine TCP connection or listener of this process
//!   (`streamio.rs` over the caller's memory → `tcpx.rs` → the engine);
//! * [`Sock::Udp`]: an engine UDP socket, this process's or a forked
//!   child's inherited copy (`ahooks.rs` → `accel.rs` → the engine);
//! * [`Kernel`]: everything else: a UDP *candidate* (it may go onto the
//!   engine at its first send, or while a receive waits), a kernel socket
//!   whose blocking receives spin first (`kernelio.rs`, `spin.rs`), any
//!   other fd; and what an engine socket leaves to the kernel socket under
//!   its fd (MSG_OOB, MSG_ERRQUEUE without engine stamps, ancillary data).
//!
//! An operation of a protocol returns `None` when the kernel socket under
//! the fd must answer; the kernel's returns `None` when the fd went onto
//! the engine while it waited: the call then starts again from [`of`].

use crate::accel::{self, Accel};
use crate::ahooks;
use crate::handover;
use crate::kernelio::{self, Next};
use crate::log::log;
use crate::opts::{self, Opt};
use crate::ready::Ready;
use crate::real;
use crate::spin::{self, errno, recv_spin_word, set_errno};
use crate::streamio;
use crate::sys::engine_call;
use crate::table;
use crate::tcpx::{self, Inner, Tcp, TcpRef};
use crate::uaccess;
use libc::{c_int, c_uint, c_ulong, c_void, iovec, msghdr, size_t, sockaddr, socklen_t};
use nanowire_options::Level;
use nanowire_shimcore::sock::Common;
use nanowire_sockabi::iov::Call;

/// What serves an fd (see the module doc).
#[derive(Clone, Copy)]
pub enum Sock {
    Tcp(TcpRef),
    Udp(&'static Accel),
    Kernel,
}

/// The one lookup of an interposed call: what serves `fd`. In a process
/// that closed an engine fd behind the shim's back, the number's identity
/// is checked first (`fdlife::io_check`).
#[inline(always)]
pub fn of(fd: c_int) -> Sock {
    crate::fdlife::io_check(fd);
    serving(fd)
}

/// [`of`] without the identity check: the readiness calls' lookup
/// (poll/select look at every fd on every turn of a spin; in a suspect
/// process the check is a getsockopt, and a readiness answer acts on no
/// number: the I/O call that follows checks).
#[inline(always)]
pub fn serving(fd: c_int) -> Sock {
    serving_as(fd, || false)
}

/// [`of`] for a `sendto` or `sendmsg` (`to`: whether it names its
/// destination, asked only of a forked copy). A forked
/// process's copy of a UDP socket another process's engine serves sends
/// such a datagram through the kernel socket under the fd, without
/// claiming the socket: the datagram leaves from the same address and
/// port, as plainly, and the answers still come to the socket's owner,
/// whose engine holds the port's claim (plainly they come to the one
/// socket's queue, which the owner reads as well). So a child that only
/// answers on it (Python's `socketserver.ForkingUDPServer`: the parent
/// receives, a child per datagram sends the answer) leaves the socket on
/// its owner's engine; before, the first child's send moved it (or took it
/// off the engine for both), and the second's made it the kernel's.
#[inline(always)]
pub fn of_send(fd: c_int, to: impl FnOnce() -> bool) -> Sock {
    crate::fdlife::io_check(fd);
    serving_as(fd, to)
}

/// [`serving`]; `send_to`: for a send, whether it names its destination
/// ([`of_send`]; asked only of a forked copy).
#[inline(always)]
fn serving_as(fd: c_int, send_to: impl FnOnce() -> bool) -> Sock {
    let Some(r) = table::record(fd) else {
        return Sock::Kernel;
    };
    if let Some(a) = r.get::<Accel>() {
        if a.common.share() != 0 {
            if !a.mine() {
                if send_to() {
                    return Sock::Kernel;
                }
                // A forked child's first use of a socket its parent
                // shared: it moves here, or the kernel serves both.
                return accel::inherited(fd, a).map_or(Sock::Kernel, Sock::Udp);
            }
            a.owner_uses();
        }
        return Sock::Udp(a);
    }
    match table::checked::<Tcp>(fd, r).map(TcpRef::from) {
        Some(t) if t.mine() => Sock::Tcp(t),
        // A forked child's copy: a listener shared through the engine
        // service is served here; a connection stays with the parent.
        Some(t) => tcpx::inherited(fd, t).map_or(Sock::Kernel, Sock::Tcp),
        None => Sock::Kernel,
    }
}

/// [`serving`], for the calls that first show what a socket is used for
/// (a readiness registration or look): an fd the shim never saw is looked
/// at once first ([`unknown`]).
#[inline(always)]
pub fn serving_seen(fd: c_int) -> Sock {
    let s = serving(fd);
    if matches!(s, Sock::Kernel) && unknown(fd) {
        return serving(fd);
    }
    s
}

/// `fd` was never seen by this process's shim (its class is unknown: a
/// socket inherited through exec, received, or made by a raw system call)
/// and has just gone onto the engine ([`adopt_unknown`]). One table load
/// for a known fd; the look itself happens once per fd (its class is kept
/// until the number is closed).
#[inline(always)]
pub fn unknown(fd: c_int) -> bool {
    fd >= 0 && table::class(table::get(fd)) == table::C_UNKNOWN && adopt_unknown(fd)
}

/// Issue 24 item 2: what a fresh socket would have been, an inherited one
/// becomes: an IPv4 listening TCP socket is served on the engine
/// (`tcpx::adopt_listening`), a bound IPv4 UDP socket goes onto it
/// (`ahooks::adopt_bound`). The socket is asked what it is (SO_TYPE,
/// SO_DOMAIN; SO_ACCEPTCONN for an IPv4 stream) once; its class is
/// remembered whatever the answer. After a fork neither: it stays the
/// kernel's ([`shared_since_fork`]).
#[cold]
fn adopt_unknown(fd: c_int) -> bool {
    if !spin::xdp_candidates() {
        return false;
    }
    let e = errno();
    let (class, inet) = table::classify_inet(fd);
    // Unknown at a fork (nothing here made it, so the fork could not take
    // it off the engine or keep it a candidate): the other process may
    // hold and read it too, and a socket two processes share is served
    // by the kernel (as fork does with the engine's own sockets).
    let forked = accel::forked();
    if inet && !forked && matches!(class, table::C_UDP | table::C_TCP) {
        // The same socket under another number this process has put on
        // the engine already (one socket passed on two numbers, or
        // received again): share its record, as a dup does.
        if let Some(f) = engine_number_of(fd) {
            dup(f, fd);
            set_errno(e);
            return !matches!(record_of(fd), Sock::Kernel);
        }
    }
    let on = match class {
        table::C_UDP if inet && forked => shared_since_fork(fd, "udp"),
        table::C_UDP if inet => ahooks::adopt_bound(fd),
        table::C_TCP if inet => {
            if tcpx::get_int(fd, libc::SOL_SOCKET, libc::SO_ACCEPTCONN) == Some(1) {
                if forked {
                    shared_since_fork(fd, "tcp listener")
                } else {
                    tcpx::adopt_listening(fd)
                }
            } else {
                // A connection: only one the old image handed over at
                // exec while it alone held it (no other process can be
                // using the kernel's connection).
                !forked && crate::execnames::exec_named(fd) && handover::adopt_connected(fd)
            }
        }
        // An IPv6 socket: said as for a fresh one.
        table::C_UDP | table::C_TCP => {
            spin::log_socket(fd, class, libc::AF_INET6);
            false
        }
        _ => false,
    };
    set_errno(e);
    on
}

/// Another fd of this process whose engine record is for the socket `fd`
/// names (the same SO_COOKIE), if any.
#[cold]
fn engine_number_of(fd: c_int) -> Option<c_int> {
    let cookie = table::cookie_of(fd);
    let mut found = None;
    if cookie != 0 {
        table::each_identity(|f, id| {
            if found.is_none() && f != fd && id == cookie {
                found = Some(f);
            }
        });
    }
    found.filter(|&f| !matches!(record_of(f), Sock::Kernel))
}

/// [`adopt_unknown`] of a socket this process may share with one it forked
/// or was forked from: it stays the kernel's, said once (false).
#[cold]
fn shared_since_fork(fd: c_int, what: &str) -> bool {
    log!(
        Level::Warn,
        "fd {fd} {what}: kernel socket; xdp not used: this program did not make it and has forked since (the other process may share it; a shared socket is the kernel's)"
    );
    false
}

/// What holds `fd`'s record, whichever process made it (a forked child's
/// inherited copy too): for the operations on the record itself
/// ([`Ops::dup`], [`Ops::release`]), which count references across fork.
#[inline]
pub fn record_of(fd: c_int) -> Sock {
    let Some(r) = table::record(fd) else {
        return Sock::Kernel;
    };
    if let Some(a) = r.get::<Accel>() {
        return Sock::Udp(a);
    }
    table::checked::<Tcp>(fd, r).map_or(Sock::Kernel, |t| Sock::Tcp(t.into()))
}

/// A receive, normalised: the caller's buffers and the call it made.
#[derive(Clone, Copy)]
pub enum Recv {
    /// `recv(fd, buf, len, flags)`.
    Buf { buf: *mut c_void, len: size_t },
    /// `recvfrom(fd, buf, len, flags, addr, alen)`.
    From {
        buf: *mut c_void,
        len: size_t,
        addr: *mut sockaddr,
        alen: *mut socklen_t,
    },
    /// `read(fd, buf, len)` (on a socket: `recv(.., 0)`).
    Read { buf: *mut c_void, len: size_t },
    /// `recvmsg(fd, msg, flags)`.
    Msg(*mut msghdr),
    /// `readv(fd, iov, cnt)` (on a socket: `recvmsg(.., 0)`).
    Vec { iov: *const iovec, cnt: c_int },
}

/// A send, normalised: the caller's buffers and the call it made.
#[derive(Clone, Copy)]
pub enum Send {
    /// `send(fd, buf, len, flags)`.
    Buf { buf: *const c_void, len: size_t },
    /// `sendto(fd, buf, len, flags, addr, alen)`.
    To {
        buf: *const c_void,
        len: size_t,
        addr: *const sockaddr,
        alen: socklen_t,
    },
    /// `write(fd, buf, len)` (on a socket: `send(.., 0)`).
    Write { buf: *const c_void, len: size_t },
    /// `sendmsg(fd, msg, flags)`.
    Msg(*const msghdr),
    /// `writev(fd, iov, cnt)` (on a socket: `sendmsg(.., 0)`).
    Vec { iov: *const iovec, cnt: c_int },
}

/// The operations of one kind of fd (see the module doc for `None`); its
/// readiness operations (poll, select, epoll) are the supertrait
/// [`Ready`] (`ready.rs`, below this module).
pub trait Ops: Ready + Sized + Copy {
    fn recv(self, fd: c_int, r: Recv, flags: c_int) -> Option<isize>;
    fn send(self, fd: c_int, s: Send, flags: c_int) -> Option<isize>;
    fn setsockopt(self, fd: c_int, o: Opt) -> Option<c_int>;
    fn shutdown(self, fd: c_int, how: c_int) -> Option<c_int>;
    /// `fcntl`/`fcntl64` (`is64`), the optional argument as an integer.
    fn fcntl(self, fd: c_int, cmd: c_int, arg: c_ulong, is64: bool) -> Option<c_int>;
    /// `ioctl`, the optional argument as an integer.
    fn ioctl(self, fd: c_int, req: c_ulong, arg: c_ulong) -> Option<c_int>;
    /// `accept` (`flags` `None`) or `accept4`.
    fn accept(
        self,
        _fd: c_int,
        _addr: *mut sockaddr,
        _len: *mut socklen_t,
        _flags: Option<c_int>,
    ) -> Option<c_int> {
        None
    }
    fn connect(self, _fd: c_int, _addr: *const sockaddr, _len: socklen_t) -> Option<c_int> {
        None
    }
    /// `getsockname` or (`peer`) `getpeername`.
    fn name(
        self,
        _fd: c_int,
        _peer: bool,
        _addr: *mut sockaddr,
        _len: *mut socklen_t,
    ) -> Option<c_int> {
        None
    }
    fn getsockopt(
        self,
        _fd: c_int,
        _level: c_int,
        _name: c_int,
        _val: *mut c_void,
        _len: *mut socklen_t,
    ) -> Option<c_int> {
        None
    }
    fn bind(self, _fd: c_int, _addr: *const sockaddr, _len: socklen_t) -> Option<c_int> {
        None
    }
    fn listen(self, _fd: c_int, _backlog: c_int) -> Option<c_int> {
        None
    }
    /// `sendfile` / `sendfile64` (`is64`) onto `fd`.
    fn sendfile(
        self,
        _fd: c_int,
        _inp: c_int,
        _off: *mut i64,
        _count: size_t,
        _is64: bool,
    ) -> Option<isize> {
        None
    }
    /// `splice` with `fd` on one side and `other` on the other: `into`,
    /// `fd` is the destination. `offs`: whether each side (in, out) has an
    /// offset. `None`: the kernel's (the dispatcher makes the real call).
    fn splice(
        self,
        _fd: c_int,
        _other: c_int,
        _into: bool,
        _offs: (bool, bool),
        _len: size_t,
        _flags: c_uint,
    ) -> Option<isize> {
        None
    }
    /// `new` now names the socket of `old` (dup, dup2, dup3,
    /// fcntl(F_DUPFD)): it shares the record. Called on [`record_of`].
    fn dup(self, _old: c_int, _new: c_int) {}
    /// `fd` is about to be closed or replaced: let go of its record.
    /// Called on [`record_of`].
    fn release(self, _fd: c_int) {}
}

/// Operation `op` of whatever serves `sock`, the kernel's included.
macro_rules! each {
    ($sock:expr, $op:ident ( $($a:expr),* )) => {
        match $sock {
            Sock::Tcp(t) => t.$op($($a),*),
            Sock::Udp(a) => a.$op($($a),*),
            Sock::Kernel => Kernel.$op($($a),*),
        }
    };
}

/// Operation `op` of the protocol of `sock`; `None` for a kernel fd.
macro_rules! on {
    ($sock:expr, $op:ident ( $($a:expr),* )) => {
        match $sock {
            Sock::Tcp(t) => t.$op($($a),*),
            Sock::Udp(a) => a.$op($($a),*),
            Sock::Kernel => Default::default(),
        }
    };
}

/// Run operation `op` of whatever serves `fd`; the kernel's when the
/// protocol leaves it to the kernel socket under the fd.
macro_rules! through {
    ($fd:expr, $op:ident ( $($a:expr),* )) => {{
        let fd = $fd;
        through_from!(of(fd), fd, $op($($a),*))
    }};
}

/// [`through!`] with `first` (what [`of`] said for `fd`) for the first
/// attempt; [`of`] again when the kernel's operation says the fd moved.
macro_rules! through_from {
    ($first:expr, $fd:expr, $op:ident ( $($a:expr),* )) => {{
        let fd = $fd;
        let mut sock = $first;
        loop {
            let got = on!(sock, $op(fd, $($a),*));
            if let Some(n) = got.or_else(|| Kernel.$op(fd, $($a),*)) {
                break n;
            }
            sock = of(fd);
        }
    }};
}

/// `setsockopt` on `fd`.
pub fn setsockopt(fd: c_int, o: Opt) -> c_int {
    crate::opts::note_set(o.level, o.name);
    through!(fd, setsockopt(o))
}

/// `shutdown` on `fd`. A thread waiting on `fd` is woken (a generation
/// bump): its non-blocking attempts would only ever see EAGAIN, the kernel
/// reports the shutdown to blocking receives.
pub fn shutdown(fd: c_int, how: c_int) -> c_int {
    let r = through!(fd, shutdown(how));
    table::wake(fd);
    r
}

/// `fcntl`/`fcntl64` on `fd`.
pub fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong, is64: bool) -> c_int {
    if matches!(cmd, libc::F_GETFD | libc::F_SETFD) {
        // The fd's own flag (close-on-exec), nothing of the socket: not a
        // use of it (a forked child making its copy inheritable before it
        // execs does not claim the connection for this image).
        return Kernel.fcntl(fd, cmd, arg, is64).unwrap_or(-1);
    }
    through!(fd, fcntl(cmd, arg, is64))
}

/// `ioctl` on `fd`.
pub fn ioctl(fd: c_int, req: c_ulong, arg: c_ulong) -> c_int {
    if matches!(req, libc::FIOCLEX | libc::FIONCLEX) {
        // As F_SETFD (`fcntl`): the fd's own flag, not a use of the socket.
        return Kernel.ioctl(fd, req, arg).unwrap_or(-1);
    }
    through!(fd, ioctl(req, arg))
}

/// `accept` / `accept4` on `fd`.
pub fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: Option<c_int>) -> c_int {
    through!(fd, accept(addr, len, flags))
}

/// `connect` on `fd`.
pub fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    through!(fd, connect(addr, len))
}

/// `getsockname` / `getpeername` on `fd`.
pub fn name(fd: c_int, peer: bool, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    through!(fd, name(peer, addr, len))
}

/// `getsockopt` on `fd`.
pub fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    through!(fd, getsockopt(level, name, val, len))
}

/// `bind` on `fd`.
pub fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    through!(fd, bind(addr, len))
}

/// `listen` on `fd`.
pub fn listen(fd: c_int, backlog: c_int) -> c_int {
    through!(fd, listen(backlog))
}

/// `sendfile` / `sendfile64` (`is64`) onto `out`.
pub fn sendfile(out: c_int, inp: c_int, off: *mut i64, count: size_t, is64: bool) -> isize {
    through!(out, sendfile(inp, off, count, is64))
}

/// `splice`: served by the protocol of the destination, else of the
/// source, else the kernel. Two engine connections (which the kernel
/// refuses too, EINVAL) are handed over to it first.
pub fn splice(
    fd_in: c_int,
    off_in: *mut libc::loff_t,
    fd_out: c_int,
    off_out: *mut libc::loff_t,
    len: size_t,
    flags: c_uint,
) -> isize {
    let offs = (!off_in.is_null(), !off_out.is_null());
    let (si, so) = (of(fd_in), of(fd_out));
    if let (Sock::Tcp(_), Sock::Tcp(_)) = (si, so) {
        for fd in [fd_in, fd_out] {
            crate::handover::to_kernel(fd, "splice() between two sockets is the kernel's");
        }
    } else if let Some(r) = on!(so, splice(fd_out, fd_in, true, offs, len, flags))
        .or_else(|| on!(si, splice(fd_in, fd_out, false, offs, len, flags)))
    {
        return r;
    }
    // SAFETY: the caller's own arguments, unchanged, to libc's function of
    // the same signature, whose contract the caller upholds.
    unsafe { real::splice(fd_in, off_in, fd_out, off_out, len, flags) }
}

/// `new` is a duplicate of `old` (the call that made it succeeded): it
/// shares `old`'s record, or, for a kernel socket, what the table knows of
/// it. An `old` the shim never saw is looked at first ([`unknown`]), so
/// the two numbers share whatever it becomes: one socket, one record.
/// (Issue 24: a duplicate left unknown was taken for a socket this
/// program did not make and put on the engine by itself, a second claim on
/// a port its original had given back to the kernel at fork: the forked
/// child's datagram went to the parent's engine.)
pub fn dup(old: c_int, new: c_int) {
    if table::class(table::get(old)) == table::C_UNKNOWN {
        unknown(old);
    }
    match record_of(old) {
        Sock::Kernel => dup_kernel(old, new),
        s => on!(s, dup(old, new)),
    }
}

/// [`dup`] of a kernel fd: `new` is the same socket (or file), so it has
/// `old`'s class and its socket-wide flags (SO_RCVTIMEO set), never its
/// per-number ones (a candidate stays one number's: the engine takes the
/// socket through that number).
fn dup_kernel(old: c_int, new: c_int) {
    let w = table::get(old);
    let class = table::class(w);
    if matches!(class, table::C_OTHER | table::C_UDP | table::C_TCP) {
        table::set(new, class, w & table::F_RCVTIMEO);
    }
}

/// `fd` is about to be closed or replaced (close, dup2/dup3 over it,
/// close_range, closefrom, fclose, freopen): its number is retired
/// (`fdlife::retire`), then its protocol lets go of its record.
pub fn pre_close(fd: c_int) {
    // An accepted connection's release acts on the engine only: its close
    // needs no identity check (one getsockopt per connection less).
    crate::placeholder::number_closing(fd);
    let check = !matches!(record_of(fd), Sock::Tcp(t) if tcpx::release_spares_number(t));
    if crate::fdlife::retire(fd, check) {
        on!(record_of(fd), release(fd))
    }
}

/// [`pre_close`] for every tracked number in `[first, last]`.
pub fn pre_close_range(first: u32, last: u32) {
    let top = table::tracked_limit().min(last as usize + 1);
    for fd in first as usize..top {
        let fd = fd as c_int;
        if table::tracked(fd) || table::record(fd).is_some() {
            pre_close(fd);
        }
    }
    crate::placeholder::range_closing(first, last);
}

/// `recv`, `recvfrom`, `recvmsg`, `read`, `readv` on `fd`.
#[inline]
pub fn recv(fd: c_int, r: Recv, flags: c_int) -> isize {
    through!(fd, recv(r, flags))
}

/// [`recv`] on `fd`, which [`of`] just said `sock` serves (the interposed
/// `recv`/`recvfrom` looked first for the hot shape).
pub fn recv_on(sock: Sock, fd: c_int, r: Recv, flags: c_int) -> isize {
    through_from!(sock, fd, recv(r, flags))
}

/// `send`, `sendto`, `sendmsg`, `write`, `writev` on `fd`.
#[inline]
pub fn send(fd: c_int, s: Send, flags: c_int) -> isize {
    through!(fd, send(s, flags))
}

/// [`send`] on `fd`, which [`of`] just said `sock` serves.
pub fn send_on(sock: Sock, fd: c_int, s: Send, flags: c_int) -> isize {
    through_from!(sock, fd, send(s, flags))
}

/// A msghdr over the caller's iovec array (readv, writev on an engine
/// socket are recvmsg, sendmsg without flags), or the kernel's error for
/// its count.
fn vec_msg(iov: *const iovec, cnt: c_int) -> Result<msghdr, isize> {
    if let Err(e) = nanowire_sockabi::iov::check_count(cnt as isize as usize, Call::Vec) {
        return Err(uaccess::fault(e));
    }
    // SAFETY: msghdr is plain data; all-zero is a valid value.
    let mut m: msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = iov as *mut iovec;
    m.msg_iovlen = cnt as _;
    Ok(m)
}

/// Urgent data (MSG_OOB) is the kernel's: the engine connection behind
/// `fd` is handed over to it first (`handover.rs`). True: the kernel
/// socket under the fd now serves the call.
#[cold]
pub fn tcp_oob_to_kernel(fd: c_int) -> bool {
    crate::handover::to_kernel(fd, "MSG_OOB (urgent data) is served by the kernel")
}

impl Ops for TcpRef {
    #[inline]
    fn recv(self, fd: c_int, r: Recv, flags: c_int) -> Option<isize> {
        if flags & libc::MSG_OOB != 0 && tcp_oob_to_kernel(fd) {
            return None;
        }
        Some(match r {
            Recv::Buf { buf, len } => streamio::recv(self, fd, buf, len, flags),
            Recv::Read { buf, len } => streamio::recv(self, fd, buf, len, 0),
            Recv::From {
                buf,
                len,
                addr,
                alen,
            } => streamio::recv_from(self, fd, buf, len, flags, addr, alen),
            Recv::Msg(m) => streamio::recvmsg(self, fd, m, flags),
            Recv::Vec { iov, cnt } => streamio::rwv(self, fd, iov, cnt, false),
        })
    }

    #[inline]
    fn send(self, fd: c_int, s: Send, flags: c_int) -> Option<isize> {
        if flags & libc::MSG_OOB != 0 && tcp_oob_to_kernel(fd) {
            return None;
        }
        Some(match s {
            Send::Buf { buf, len } | Send::To { buf, len, .. } => {
                streamio::send(self, fd, buf, len, flags)
            }
            Send::Write { buf, len } => streamio::send(self, fd, buf, len, 0),
            Send::Msg(m) => streamio::sendmsg(self, fd, m, flags),
            Send::Vec { iov, cnt } => streamio::rwv(self, fd, iov, cnt, true),
        })
    }

    fn setsockopt(self, fd: c_int, o: Opt) -> Option<c_int> {
        // The kernel socket records the value (getsockopt reads it back, an
        // invalid value gets the kernel's error); what the engine does not
        // honour moves the connection to the kernel (`opts`); the engine
        // applies the rest.
        tcpx::own_placeholder(self, fd);
        // SAFETY: the caller's own arguments, unchanged, to libc's function
        // of the same signature, whose contract the caller upholds.
        let r = unsafe { real::setsockopt(fd, o.level, o.name, o.val, o.len) };
        if r != 0 {
            return Some(r);
        }
        if let Some(r) = tcp_engine_after(self, fd, o) {
            return Some(r);
        }
        Some(tcpx::setsockopt_applied(self, fd, o))
    }

    fn shutdown(self, _fd: c_int, how: c_int) -> Option<c_int> {
        Some(tcpx::shutdown(self, how))
    }

    fn fcntl(self, fd: c_int, cmd: c_int, arg: c_ulong, is64: bool) -> Option<c_int> {
        // The flags F_SETFL changes besides O_NONBLOCK (fs/fcntl.c SETFL_MASK).
        const OTHERS: c_ulong =
            (libc::O_APPEND | libc::O_ASYNC | libc::O_DIRECT | libc::O_NOATIME) as c_ulong;
        if cmd == libc::F_SETFL
            && arg & OTHERS == 0
            && tcpx::placeholder_mode(self, fd, arg & libc::O_NONBLOCK as c_ulong != 0)
        {
            // Moved to the shared placeholder of that mode (no socket made):
            // its flags are what this F_SETFL would have set.
            self.common.setfl_done(arg, libc::O_NONBLOCK as c_ulong);
            return Some(0);
        }
        if !matches!(
            cmd,
            libc::F_GETFD
                | libc::F_SETFD
                | libc::F_GETFL
                | libc::F_DUPFD
                | libc::F_DUPFD_CLOEXEC
                | libc::F_GETOWN
                | F_GETOWN_EX
                | F_GETSIG
        ) {
            // Changes the open file (its flags, owner, locks): not the
            // placeholder other connections share.
            tcpx::own_placeholder(self, fd);
        }
        // A listener is non-blocking underneath; a connection's mode is
        // recorded and passed on.
        fcntl_mode(fd, cmd, arg, is64, &self.common, self.listener())
    }

    fn ioctl(self, fd: c_int, req: c_ulong, arg: c_ulong) -> Option<c_int> {
        let r = tcp_ioctl(self, req, arg);
        if r.is_none()
            && req == libc::FIONBIO as c_ulong
            && arg != 0
            && tcpx::placeholder_mode(self, fd, self.common.nonblock())
        {
            // The shared placeholder of that mode (no socket made).
            return Some(0);
        }
        if r.is_none() {
            // The kernel's socket under the fd answers: one of its own.
            tcpx::own_placeholder(self, fd);
        }
        r
    }

    fn accept(
        self,
        fd: c_int,
        addr: *mut sockaddr,
        len: *mut socklen_t,
        flags: Option<c_int>,
    ) -> Option<c_int> {
        self.listener()
            .then(|| tcpx::accept(self, fd, addr, len, flags.unwrap_or(0)))
    }

    fn connect(self, fd: c_int, _addr: *const sockaddr, _len: socklen_t) -> Option<c_int> {
        Some(tcp_connected(fd, tcpx::connect_again(self, fd)))
    }

    fn name(
        self,
        _fd: c_int,
        peer: bool,
        addr: *mut sockaddr,
        len: *mut socklen_t,
    ) -> Option<c_int> {
        tcpx::name(self, peer, addr, len)
    }

    fn getsockopt(
        self,
        fd: c_int,
        level: c_int,
        name: c_int,
        val: *mut c_void,
        len: *mut socklen_t,
    ) -> Option<c_int> {
        let r = tcpx::getsockopt(self, level, name, val, len);
        if r.is_none() && (level, name) == (libc::SOL_SOCKET, libc::SO_COOKIE) {
            // Each socket's own cookie, not the shared placeholder's.
            tcpx::own_placeholder(self, fd);
        }
        r
    }

    fn bind(self, _fd: c_int, _addr: *const sockaddr, _len: socklen_t) -> Option<c_int> {
        // A connection is bound (accepted, or bound by its connect): the
        // kernel's EINVAL. A listener's kernel socket answers for itself.
        tcpx::is_stream(self).then(|| uaccess::fault::<c_int>(libc::EINVAL))
    }

    fn listen(self, fd: c_int, _backlog: c_int) -> Option<c_int> {
        if tcpx::is_accepted(self) {
            // A connected socket cannot listen: the kernel's EINVAL.
            return Some(uaccess::fault::<c_int>(libc::EINVAL));
        }
        tcpx::own_placeholder(self, fd);
        None
    }

    fn sendfile(
        self,
        fd: c_int,
        inp: c_int,
        off: *mut i64,
        count: size_t,
        _is64: bool,
    ) -> Option<isize> {
        // SAFETY: the caller's offset, null or valid (sendfile's contract).
        Some(tcpx::sendfile(
            self,
            fd,
            inp,
            unsafe { off.as_mut() },
            count,
        ))
    }

    fn splice(
        self,
        fd: c_int,
        other: c_int,
        into: bool,
        offs: (bool, bool),
        len: size_t,
        flags: c_uint,
    ) -> Option<isize> {
        // A pipe on the other side: served on the engine (`splice.rs`).
        Some(crate::splice::splice(
            self, fd, other, into, offs, len, flags,
        ))
    }

    fn dup(self, _old: c_int, new: c_int) {
        // Counted on the incarnation `old` named: if its last fd closed
        // meanwhile, `new` names no engine socket (as a dup racing the
        // close of its source).
        if self.add_ref() {
            table::set_record(new, self.record());
        }
    }

    fn release(self, fd: c_int) {
        tcpx::release(fd);
    }
}

/// fcntl commands libc does not name (linux/fcntl.h).
const F_GETSIG: c_int = 11;
const F_GETOWN_EX: c_int = 16;

/// An ioctl on an engine TCP socket the shim answers (FIONBIO on a
/// listener, FIONREAD, SIOCOUTQ); `None`: the kernel socket under the fd
/// answers (a connection's takes FIONBIO too).
fn tcp_ioctl(t: TcpRef, req: c_ulong, arg: c_ulong) -> Option<c_int> {
    if arg == 0 {
        return None;
    }
    if fionbio(&t.common, req, arg) {
        // A listener is non-blocking underneath, always; a
        // connection's kernel socket takes it too.
        return t.listener().then_some(0);
    }
    if req == libc::FIONREAD as c_ulong || req == libc::TIOCOUTQ as c_ulong {
        return tcpx::queue_len(t, req == libc::TIOCOUTQ as c_ulong).map(|n| put_int(arg, n));
    }
    None
}

/// After the kernel socket under an engine TCP socket took an option
/// (`setsockopt` returned 0 there). `Some(r)`: the answer to give instead
/// of 0 (the connection went to the kernel and the option was set on it
/// again, or it could not and the option does nothing: ENOPROTOOPT).
fn tcp_engine_after(t: TcpRef, fd: c_int, o: Opt) -> Option<c_int> {
    let (level, name, val, len) = o.parts();
    let inner = t.get()?;
    let kind = match &*inner {
        Inner::Listener(_) => opts::Kind::TcpListener,
        Inner::Stream(_) => opts::Kind::TcpConn,
    };
    let e = errno();
    if let Some(why) = opts::kernel_reason(kind, level, name, val, len) {
        match &*inner {
            Inner::Listener(l) => {
                // The kernel's listening socket has the option: new
                // connections go to it; those the engine made stay.
                if engine_call(|| l.release_to_kernel()) {
                    log!(
                        Level::Warn,
                        "fd {fd} tcp listener: new connections go to the kernel: {why}"
                    );
                }
                set_errno(e);
                return None;
            }
            Inner::Stream(_) => {
                drop(inner);
                if handover::to_kernel(fd, &why) {
                    // The fd is the kernel's connection now: it takes the
                    // option itself (and answers for it).
                    set_errno(e);
                    // SAFETY: the caller's option, unchanged.
                    return Some(unsafe { real::setsockopt(fd, level, name, val, len) });
                }
                log!(
                    Level::Warn,
                    "fd {fd} tcp: setsockopt {} refused (ENOPROTOOPT): the connection cannot leave the xdp engine, which does not honour it",
                    opts::name_of(level, name)
                );
                set_errno(libc::ENOPROTOOPT);
                return Some(-1);
            }
        }
    }
    if level == libc::IPPROTO_IP && matches!(name, libc::IP_TTL | libc::IP_TOS) {
        // The engine's headers follow the kernel socket's values.
        let (ttl, tos) = nanowire_stack::xdp::ip_header_of(fd);
        match &*inner {
            Inner::Listener(l) => engine_call(|| l.set_ip_header(ttl, tos)),
            Inner::Stream(s) => {
                let _ = engine_call(|| s.set_ip_header(ttl, tos));
            }
        }
    }
    set_errno(e);
    None
}

impl Ops for &'static Accel {
    #[inline]
    fn recv(self, fd: c_int, r: Recv, flags: c_int) -> Option<isize> {
        let (na, nl) = (std::ptr::null_mut(), std::ptr::null_mut());
        match r {
            Recv::Buf { buf, len } => ahooks::recvfrom(self, fd, buf, len, flags, na, nl),
            Recv::Read { buf, len } => ahooks::recvfrom(self, fd, buf, len, 0, na, nl),
            Recv::From {
                buf,
                len,
                addr,
                alen,
            } => ahooks::recvfrom(self, fd, buf, len, flags, addr, alen),
            Recv::Msg(m) => ahooks::recvmsg(self, fd, m, flags),
            Recv::Vec { iov, cnt } => match vec_msg(iov, cnt) {
                Ok(mut m) => ahooks::recvmsg(self, fd, &mut m, 0),
                Err(r) => Some(r),
            },
        }
    }

    #[inline]
    fn send(self, fd: c_int, s: Send, flags: c_int) -> Option<isize> {
        if !self.mine() {
            // A forked child's copy: the kernel socket sends.
            return None;
        }
        let a = Some(self);
        match s {
            Send::Buf { buf, len } => ahooks::sendto(a, fd, buf, len, flags, std::ptr::null(), 0),
            Send::Write { buf, len } => ahooks::sendto(a, fd, buf, len, 0, std::ptr::null(), 0),
            Send::To {
                buf,
                len,
                addr,
                alen,
            } => ahooks::sendto(a, fd, buf, len, flags, addr, alen),
            Send::Msg(m) => ahooks::sendmsg(a, fd, m, flags),
            Send::Vec { iov, cnt } => match vec_msg(iov, cnt) {
                Ok(m) => ahooks::sendmsg(a, fd, &m, 0),
                Err(r) => Some(r),
            },
        }
    }

    fn setsockopt(self, fd: c_int, o: Opt) -> Option<c_int> {
        // A forked child's copy: as any kernel socket.
        self.mine().then(|| ahooks::setsockopt(Some(self), fd, o))
    }

    fn shutdown(self, fd: c_int, how: c_int) -> Option<c_int> {
        // SAFETY: the caller's own arguments, unchanged, to libc's function
        // of the same signature, whose contract the caller upholds.
        let r = unsafe { real::shutdown(fd, how) };
        // Unconnected UDP answers ENOTCONN yet shuts down all the same.
        if (r == 0 || spin::errno() == libc::ENOTCONN)
            && (how == libc::SHUT_RD || how == libc::SHUT_RDWR)
        {
            self.common.shut_rd();
        }
        Some(r)
    }

    fn fcntl(self, fd: c_int, cmd: c_int, arg: c_ulong, is64: bool) -> Option<c_int> {
        // The kernel socket under the fd stays non-blocking (inherited
        // copies too).
        fcntl_mode(fd, cmd, arg, is64, &self.common, true)
    }

    fn ioctl(self, _fd: c_int, req: c_ulong, arg: c_ulong) -> Option<c_int> {
        if arg == 0 {
            return None;
        }
        if fionbio(&self.common, req, arg) {
            // The kernel socket stays non-blocking; the application's
            // choice is remembered. Inherited copies (after fork) too.
            return Some(0);
        }
        if req == libc::FIONREAD as c_ulong && self.mine() {
            let n = accel::next_len(self);
            if n == 0 {
                // Nothing on the engine: the kernel twin under the fd
                // answers (a datagram that took the kernel path, e.g. one
                // a MSG_PEEK left there).
                return None;
            }
            return Some(put_int(arg, n));
        }
        None
    }

    fn dup(self, old: c_int, new: c_int) {
        // Counted on the incarnation `old` names: if its last fd closed
        // meanwhile, `new` names no engine socket.
        if self.add_ref(old) {
            accel::set_fd(new, self);
            table::add_flags(new, table::F_ACCEL);
        }
    }

    fn release(self, fd: c_int) {
        // The number the engine uses, closed while duplicates remain: the
        // socket goes off the engine through one of them.
        accel::closing(fd);
        if let Some(a) = accel::take_fd(fd) {
            accel::release(a);
        }
    }
}

/// The kernel's operations: candidates, spinning kernel sockets, any fd.
#[derive(Clone, Copy)]
pub struct Kernel;

impl Ready for Kernel {
    /// A UDP candidate may go onto the engine while the call waits.
    fn polled(self, fd: c_int) -> bool {
        table::get(fd) & table::F_CAND != 0
    }
}

/// Readiness of whatever serves an fd: the readiness calls (`ready.rs`)
/// take [`of`] as their lookup.
impl Ready for Sock {
    #[inline]
    fn polled(self, fd: c_int) -> bool {
        each!(self, polled(fd))
    }
    #[inline]
    fn hides_kernel(self) -> bool {
        each!(self, hides_kernel())
    }
    #[inline]
    fn revents(
        self,
        events: i16,
        revents: i16,
        kernel: bool,
        now: u64,
        pass: &mut tcpx::Pass,
    ) -> i16 {
        each!(self, revents(events, revents, kernel, now, pass))
    }
    #[inline]
    fn arm(self, pass: &mut tcpx::Pass) -> Option<Option<nanowire_stack::xdp::Armed>> {
        each!(self, arm(pass))
    }
    #[inline]
    fn wait_fds(self) -> &'static [c_int] {
        each!(self, wait_fds())
    }
}

impl Ops for Kernel {
    fn recv(self, fd: c_int, r: Recv, flags: c_int) -> Option<isize> {
        if (!matches!(r, Recv::Read { .. } | Recv::Vec { .. }) || crate::execnames::exec_pending())
            && unknown(fd)
        {
            return None;
        }
        match r {
            Recv::Buf { buf, len } => wait_then(
                fd,
                flags,
                // SAFETY: the caller's buffer, a non-blocking attempt.
                || unsafe { real::recv(fd, buf, len, flags | libc::MSG_DONTWAIT) },
                // SAFETY: the caller's own arguments, unchanged, to libc's
                // function of the call it made, whose contract it upholds.
                || unsafe { real::recv(fd, buf, len, flags) },
            ),
            Recv::From {
                buf,
                len,
                addr,
                alen,
            } => wait_then(
                fd,
                flags,
                // SAFETY: the caller's buffers, a non-blocking attempt.
                || unsafe { real::recvfrom(fd, buf, len, flags | libc::MSG_DONTWAIT, addr, alen) },
                // SAFETY: as for Buf.
                || unsafe { real::recvfrom(fd, buf, len, flags, addr, alen) },
            ),
            Recv::Read { buf, len } => wait_then(
                fd,
                0,
                // SAFETY: the caller's buffer; read on a socket is recv(.., 0).
                || unsafe { real::recv(fd, buf, len, libc::MSG_DONTWAIT) },
                // SAFETY: as for Buf.
                || unsafe { real::read(fd, buf, len) },
            ),
            Recv::Msg(m) => wait_then(
                fd,
                flags,
                // SAFETY: the caller's message, a non-blocking attempt.
                || unsafe { real::recvmsg(fd, m, flags | libc::MSG_DONTWAIT) },
                // SAFETY: as for Buf.
                || unsafe { real::recvmsg(fd, m, flags) },
            ),
            Recv::Vec { iov, cnt } => {
                if cnt >= 0
                    && let Some(w) = recv_spin_word(fd)
                    && let Some(r) = spin::spin_recv(fd, w, || match vec_msg(iov, cnt) {
                        // SAFETY: a msghdr over the caller's iovec; readv on
                        // a socket is recvmsg(.., 0).
                        Ok(mut m) => unsafe { real::recvmsg(fd, &mut m, libc::MSG_DONTWAIT) },
                        Err(r) => r,
                    })
                {
                    return Some(r);
                }
                // SAFETY: as for Buf.
                Some(unsafe { real::readv(fd, iov, cnt) })
            }
        }
    }

    fn send(self, fd: c_int, s: Send, flags: c_int) -> Option<isize> {
        if (!matches!(s, Send::Write { .. } | Send::Vec { .. }) || crate::execnames::exec_pending())
            && unknown(fd)
        {
            return None;
        }
        Some(match s {
            // SAFETY: the caller's own arguments, unchanged, to libc's
            // function of the call it made, whose contract it upholds.
            Send::Buf { buf, len } => unsafe { real::send(fd, buf, len, flags) },
            // SAFETY: as for Buf.
            Send::Write { buf, len } => unsafe { real::write(fd, buf, len) },
            // SAFETY: as for Buf.
            Send::Vec { iov, cnt } => unsafe { real::writev(fd, iov, cnt) },
            Send::To {
                buf,
                len,
                addr,
                alen,
            } => match ahooks::sendto(None, fd, buf, len, flags, addr, alen) {
                // A candidate went onto the engine to send to its peer.
                Some(r) => r,
                // SAFETY: as for Buf.
                None => unsafe { real::sendto(fd, buf, len, flags, addr, alen) },
            },
            Send::Msg(m) => {
                // Engine connections it passes leave the shared placeholder.
                tcpx::own_passed(m);
                match ahooks::sendmsg(None, fd, m, flags) {
                    Some(r) => r,
                    // SAFETY: as for Buf.
                    None => unsafe { real::sendmsg(fd, m, flags) },
                }
            }
        })
    }

    fn setsockopt(self, fd: c_int, o: Opt) -> Option<c_int> {
        // A UDP or TCP candidate's options decide whether it may go onto
        // the engine (`ahooks::setsockopt`, `opts`).
        Some(ahooks::setsockopt(None, fd, o))
    }

    fn shutdown(self, fd: c_int, how: c_int) -> Option<c_int> {
        // SAFETY: the caller's own arguments, unchanged, to libc's function
        // of the same signature, whose contract the caller upholds.
        Some(unsafe { real::shutdown(fd, how) })
    }

    fn fcntl(self, fd: c_int, cmd: c_int, arg: c_ulong, is64: bool) -> Option<c_int> {
        // SAFETY: the caller's (possibly absent) argument register, passed
        // on: the real fcntl reads it only for commands that take one, as
        // the caller's own call would have.
        Some(unsafe {
            if is64 {
                real::fcntl64(fd, cmd, arg)
            } else {
                real::fcntl(fd, cmd, arg)
            }
        })
    }

    fn ioctl(self, fd: c_int, req: c_ulong, arg: c_ulong) -> Option<c_int> {
        // SAFETY: as for fcntl. FIONBIO needs no bookkeeping: the spin path
        // asks the kernel for the blocking mode before it spins.
        Some(unsafe { real::ioctl(fd, req, arg) })
    }

    fn accept(
        self,
        fd: c_int,
        addr: *mut sockaddr,
        len: *mut socklen_t,
        flags: Option<c_int>,
    ) -> Option<c_int> {
        if unknown(fd) {
            return None;
        }
        // SAFETY: the caller's own arguments, unchanged, to libc's function
        // of the call it made, whose contract it upholds.
        let r = unsafe {
            match flags {
                None => real::accept(fd, addr, len),
                Some(f) => real::accept4(fd, addr, len, f),
            }
        };
        crate::fdlife::created(r);
        if r >= 0 && table::class(table::get(fd)) == table::C_TCP {
            // A connection of a kernel listener: a stream socket, never a
            // listener (no look at its first use).
            table::set(r, table::C_TCP, 0);
        }
        Some(r)
    }

    fn connect(self, fd: c_int, addr: *const sockaddr, len: socklen_t) -> Option<c_int> {
        // A TCP candidate goes onto the engine here, a UDP one (or an
        // engine UDP socket) learns its peer.
        if table::get(fd) & table::F_TCAND != 0
            && let Some(r) = tcpx::connect(fd, addr, len)
        {
            return Some(tcp_connected(fd, r));
        }
        if table::get(fd) & (table::F_ACCEL | table::F_CAND) != 0
            && let Some(r) = ahooks::connect(fd, addr, len)
        {
            return Some(r);
        }
        // SAFETY: the caller's own arguments, unchanged, to libc's function
        // of the same signature, whose contract it upholds.
        Some(unsafe { real::connect(fd, addr, len) })
    }

    fn name(
        self,
        fd: c_int,
        peer: bool,
        addr: *mut sockaddr,
        len: *mut socklen_t,
    ) -> Option<c_int> {
        // SAFETY: as for connect.
        Some(unsafe {
            if peer {
                real::getpeername(fd, addr, len)
            } else {
                real::getsockname(fd, addr, len)
            }
        })
    }

    fn getsockopt(
        self,
        fd: c_int,
        level: c_int,
        name: c_int,
        val: *mut c_void,
        len: *mut socklen_t,
    ) -> Option<c_int> {
        // SAFETY: as for connect.
        Some(unsafe { real::getsockopt(fd, level, name, val, len) })
    }

    fn bind(self, fd: c_int, addr: *const sockaddr, len: socklen_t) -> Option<c_int> {
        // A UDP candidate goes onto the engine here.
        // SAFETY: as for connect.
        Some(ahooks::bind(fd, addr, len).unwrap_or_else(|| unsafe { real::bind(fd, addr, len) }))
    }

    fn listen(self, fd: c_int, backlog: c_int) -> Option<c_int> {
        // A TCP candidate becomes an engine listener here.
        // SAFETY: as for connect.
        Some(tcpx::listen(fd, backlog).unwrap_or_else(|| unsafe { real::listen(fd, backlog) }))
    }

    fn sendfile(
        self,
        fd: c_int,
        inp: c_int,
        off: *mut i64,
        count: size_t,
        is64: bool,
    ) -> Option<isize> {
        // SAFETY: as for connect (off_t and off64_t are both i64 here).
        Some(unsafe {
            if is64 {
                real::sendfile64(fd, inp, off, count)
            } else {
                real::sendfile(fd, inp, off, count)
            }
        })
    }
}

/// `ioctl(FIONBIO)` on an engine socket (`arg` non-null): the
/// application's blocking mode goes to `common`. False for another request.
fn fionbio(common: &Common, req: c_ulong, arg: c_ulong) -> bool {
    if req != libc::FIONBIO as c_ulong {
        return false;
    }
    // SAFETY: FIONBIO's argument is an int pointer (non-null: checked).
    let on = unsafe { *(arg as *const c_int) } != 0;
    common.set_nonblock(on);
    true
}

/// Answer an ioctl whose argument is an int pointer (FIONREAD, SIOCOUTQ;
/// `arg` non-null) with `n`: 0.
fn put_int(arg: c_ulong, n: usize) -> c_int {
    // SAFETY: the request's argument is an int pointer (non-null: checked).
    unsafe { *(arg as *mut c_int) = n.min(c_int::MAX as usize) as c_int };
    0
}

/// F_GETFL/F_SETFL on an engine socket, whose O_NONBLOCK the shim records
/// in `common`. `hidden`: the kernel socket under the fd stays
/// non-blocking whatever the application says (UDP on the engine, TCP
/// listeners), so F_GETFL reports the recorded mode and F_SETFL keeps
/// O_NONBLOCK set underneath; otherwise the mode is passed on. `None`:
/// another command, the real call answers.
fn fcntl_mode(
    fd: c_int,
    cmd: c_int,
    arg: c_ulong,
    is64: bool,
    common: &Common,
    hidden: bool,
) -> Option<c_int> {
    let call = |c: c_int, v: c_ulong| {
        // SAFETY: F_GETFL/F_SETFL with an int argument.
        unsafe {
            if is64 {
                real::fcntl64(fd, c, v)
            } else {
                real::fcntl(fd, c, v)
            }
        }
    };
    let bit = libc::O_NONBLOCK;
    match cmd {
        libc::F_GETFL if hidden => {
            let r = call(libc::F_GETFL, 0);
            Some(if r < 0 { r } else { common.getfl_view(r, bit) })
        }
        libc::F_SETFL => {
            let r = call(
                libc::F_SETFL,
                Common::setfl_under(arg, bit as c_ulong, hidden),
            );
            if r == 0 {
                common.setfl_done(arg, bit as c_ulong);
            }
            Some(r)
        }
        _ => None,
    }
}

/// A receive on an fd no engine record serves: wait the shim's way
/// (`kernelio::recv_wait`, with `attempt` the call made non-blocking),
/// then, if the wait says so, the caller's own (blocking) call `real`.
/// `None`: the fd went onto the engine meanwhile.
#[inline]
fn wait_then(
    fd: c_int,
    flags: c_int,
    attempt: impl FnMut() -> isize,
    real: impl FnOnce() -> isize,
) -> Option<isize> {
    match kernelio::recv_wait(fd, flags, attempt) {
        Next::Done(r) => Some(r),
        Next::Again => None,
        Next::Real => Some(real()),
    }
}

/// A connect on an engine TCP socket returned `r`: if it failed and the fd
/// went back to being a kernel candidate (its record gone, as the kernel
/// leaves a socket whose connect failed unconnected), the epoll interests
/// the shim kept for the engine connection become the kernel's.
fn tcp_connected(fd: c_int, r: c_int) -> c_int {
    if r != 0 && tcpx::lookup(fd).is_none() {
        let e = spin::errno();
        crate::ready::tcp_to_kernel(fd);
        spin::set_errno(e);
    }
    r
}
