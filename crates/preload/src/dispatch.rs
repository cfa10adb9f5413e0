//! The exported (interposed) functions.
//!
//! Each is a plain `extern "C"` function with glibc's prototype. Anything
//! the shim does not handle goes to the real function unchanged, so the
//! result and `errno` are the kernel's.
//!
//! Variadic `fcntl`, `fcntl64` and `ioctl`: stable Rust cannot define a C
//! variadic function, so each is a `#[naked]` function whose whole body is
//! a tail jump to a fixed-arity Rust function `(int, int|ulong, ulong)`.
//! On x86-64 SysV (and AArch64 Linux) the first variadic integer/pointer
//! argument travels in the same register as a named third argument (rdx /
//! x2), and the callee may ignore `al`; the jump leaves every register and
//! the stack exactly as the caller set them. When the caller passed no
//! third argument, the register holds garbage that we pass on to the real
//! function, which ignores it for such commands (as the kernel does).

use crate::accel;
use crate::ahooks;
use crate::ops::{self, Recv, Send, Sock};
use crate::ready::{self, Ready};
use crate::real;
pub use crate::signals::{sigaction, signal};
use crate::spin::{self, log_socket, recv_spin_word};
use crate::streamio;
use crate::table::{self, C_EPOLL, C_OTHER, C_TCP, C_UDP, F_EPOLL_INET};
pub use crate::uaccess::{mprotect, munmap};
use libc::{
    c_int, c_uint, c_ulong, c_void, epoll_event, fd_set, iovec, mmsghdr, msghdr, nfds_t, off_t,
    off64_t, pollfd, sigset_t, size_t, sockaddr, socklen_t, ssize_t, timespec, timeval,
};
use nanowire_probe::{self as probe, Mark};
use std::sync::atomic::Ordering;

// ---------------------------------------------------------------- sockets

/// # Safety
/// As libc's `socket`.
pub unsafe fn socket(domain: c_int, ty: c_int, proto: c_int) -> c_int {
    // SAFETY: the caller's own arguments, unchanged, to libc's function of
    // the same signature, whose contract our caller upholds (# Safety).
    let fd = unsafe { real::socket(domain, ty, proto) };
    if fd >= 0 {
        let base = ty & 0xf;
        let class = match (domain, base) {
            (libc::AF_INET | libc::AF_INET6, libc::SOCK_DGRAM) => C_UDP,
            (libc::AF_INET | libc::AF_INET6, libc::SOCK_STREAM) => C_TCP,
            _ => C_OTHER,
        };
        crate::fdlife::created(fd);
        let cand = class == C_UDP && domain == libc::AF_INET && spin::xdp_candidates();
        let tcand = class == C_TCP && domain == libc::AF_INET && spin::xdp_candidates();
        let flags = if cand {
            table::F_CAND
        } else if tcand {
            table::F_TCAND
        } else {
            0
        };
        table::set(fd, class, flags);
        if class == C_UDP {
            spin::apply_rcvbuf(fd);
        }
        if !cand && !tcand {
            log_socket(fd, class, domain);
        }
    }
    fd
}

/// # Safety
/// As libc's `accept`.
pub unsafe fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    ops::accept(fd, addr, len, None)
}

/// # Safety
/// As libc's `accept4`.
pub unsafe fn accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int {
    ops::accept(fd, addr, len, Some(flags))
}

/// # Safety
/// As libc's `setsockopt`.
pub unsafe fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    ops::setsockopt(
        fd,
        crate::opts::Opt {
            level,
            name,
            val,
            len,
        },
    )
}

/// # Safety
/// As libc's `shutdown`.
pub unsafe fn shutdown(fd: c_int, how: c_int) -> c_int {
    ops::shutdown(fd, how)
}

// ------------------------------------------------------------- fd changes

/// # Safety
/// As libc's `close`.
pub unsafe fn close(fd: c_int) -> c_int {
    // Bump the generation first, so a thread spinning on `fd` stops before
    // the number can be reused.
    ops::pre_close(fd);
    // SAFETY: the caller's own arguments, unchanged, to libc's function of
    // the same signature, whose contract our caller upholds (# Safety).
    unsafe { real::close(fd) }
}

/// # Safety
/// As libc's `dup`.
pub unsafe fn dup(fd: c_int) -> c_int {
    // SAFETY: the caller's own arguments, unchanged, to libc's function of
    // the same signature, whose contract our caller upholds (# Safety).
    let r = unsafe { real::dup(fd) };
    if r >= 0 {
        crate::fdlife::created(r);
        ops::dup(fd, r);
    }
    r
}

/// # Safety
/// As libc's `dup2`.
pub unsafe fn dup2(old: c_int, new: c_int) -> c_int {
    if old != new {
        // `new` is closed by the call: exactly what `close` does first
        // (bump the generation, wait until its spinners have left).
        ops::pre_close(new);
    }
    // SAFETY: the caller's own arguments, unchanged, to libc's function of
    // the same signature, whose contract our caller upholds (# Safety).
    let r = unsafe { real::dup2(old, new) };
    if r >= 0 && old != new {
        ops::dup(old, new);
    }
    r
}

/// # Safety
/// As libc's `dup3`.
pub unsafe fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    if old != new {
        // `new` is closed by the call: exactly what `close` does first
        // (bump the generation, wait until its spinners have left).
        ops::pre_close(new);
    }
    // SAFETY: the caller's own arguments, unchanged, to libc's function of
    // the same signature, whose contract our caller upholds (# Safety).
    let r = unsafe { real::dup3(old, new, flags) };
    if r >= 0 && old != new {
        ops::dup(old, new);
    }
    r
}

/// `fcntl` / `fcntl64` (`is64`), with the optional argument as an integer.
pub fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong, is64: bool) -> c_int {
    let r = ops::fcntl(fd, cmd, arg, is64);
    if r >= 0 && fd != r && (cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC) {
        crate::fdlife::created(r);
        ops::dup(fd, r);
    }
    r
}

/// `ioctl`, with the optional argument as an integer.
pub fn ioctl(fd: c_int, req: c_ulong, arg: c_ulong) -> c_int {
    ops::ioctl(fd, req, arg)
}

// --------------------------------------------------------------- receive

/// # Safety
/// As libc's `recv`.
pub unsafe fn recv(fd: c_int, buf: *mut c_void, len: size_t, flags: c_int) -> ssize_t {
    let sock = ops::of(fd);
    if let Sock::Udp(a) = sock
        && ahooks::engine_recv(a, flags)
    {
        let (na, nl) = (std::ptr::null_mut(), std::ptr::null_mut());
        return ahooks::recvfrom_engine(a, fd, buf, len, flags, na, nl);
    }
    ops::recv_on(sock, fd, Recv::Buf { buf, len }, flags)
}

/// # Safety
/// As libc's `recvfrom`.
pub unsafe fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    // The hot shape (an engine UDP socket of this process) in one piece;
    // everything else through the operations table.
    let sock = ops::of(fd);
    if let Sock::Udp(a) = sock
        && ahooks::engine_recv(a, flags)
    {
        let r = ahooks::recvfrom_engine(a, fd, buf, len, flags, addr, alen);
        probe::mark(Mark::RecvReturns);
        return r;
    }
    let r = ops::recv_on(
        sock,
        fd,
        Recv::From {
            buf,
            len,
            addr,
            alen,
        },
        flags,
    );
    probe::mark(Mark::RecvReturns);
    r
}

/// # Safety
/// As libc's `recvmsg`.
pub unsafe fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    ops::recv(fd, Recv::Msg(msg), flags)
}

/// # Safety
/// As libc's `recvmmsg`.
pub unsafe fn recvmmsg(
    fd: c_int,
    msgs: *mut mmsghdr,
    vlen: c_uint,
    flags: c_int,
    tmo: *mut timespec,
) -> c_int {
    match ops::of(fd) {
        Sock::Tcp(t)
            if flags & libc::MSG_ERRQUEUE == 0
                && !(flags & libc::MSG_OOB != 0 && ops::tcp_oob_to_kernel(fd)) =>
        {
            return streamio::recvmmsg(t, fd, msgs, vlen, flags);
        }
        Sock::Udp(a) => {
            if let Some(r) = ahooks::recvmmsg(a, fd, msgs, vlen, flags) {
                return r;
            }
        }
        _ => {}
    }
    if flags & (libc::MSG_DONTWAIT | libc::MSG_ERRQUEUE) == 0
        && table::get(fd) & table::F_CAND != 0
        && let Some(r) = ahooks::candidate(fd, || {
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd; readiness only, the real call follows.
            match unsafe { real::poll(&mut p, 1, 0) } {
                0 => {
                    spin::set_errno(libc::EAGAIN);
                    -1
                }
                _ => 0,
            }
        })
        && r.is_none()
    {
        // SAFETY: re-dispatch (the socket moved onto the engine).
        return unsafe { recvmmsg(fd, msgs, vlen, flags, tmo) };
    }
    if flags & (libc::MSG_DONTWAIT | libc::MSG_ERRQUEUE) == 0
        && let Some(w) = recv_spin_word(fd)
    {
        if vlen > 1 && flags & libc::MSG_WAITFORONE == 0 {
            // Blocking recvmmsg waits for all `vlen`: only the first wait spins.
            if spin::spin_until_readable(fd, w).is_some() {
                return -1;
            }
        } else if let Some(r) = spin::spin_recv(fd, w, || {
            // SAFETY: the caller's vector, a non-blocking attempt.
            unsafe { real::recvmmsg(fd, msgs, vlen, flags | libc::MSG_DONTWAIT, tmo) as isize }
        }) {
            return r as c_int;
        }
    }
    // SAFETY: the caller's own arguments, unchanged, to libc's function of
    // the same signature, whose contract our caller upholds (# Safety).
    unsafe { real::recvmmsg(fd, msgs, vlen, flags, tmo) }
}

/// # Safety
/// As libc's `read`.
pub unsafe fn read(fd: c_int, buf: *mut c_void, len: size_t) -> ssize_t {
    ops::recv(fd, Recv::Read { buf, len }, 0)
}

/// # Safety
/// As libc's `readv`.
pub unsafe fn readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    ops::recv(fd, Recv::Vec { iov, cnt }, 0)
}

/// # Safety
/// glibc's fortified `recv`.
pub unsafe fn __recv_chk(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    buflen: size_t,
    flags: c_int,
) -> ssize_t {
    if len > buflen {
        // SAFETY: glibc reports the overflow and aborts.
        return unsafe { real::__recv_chk(fd, buf, len, buflen, flags) };
    }
    // SAFETY: the caller's own arguments, unchanged, to libc's function of
    // the same signature, whose contract our caller upholds (# Safety).
    unsafe { recv(fd, buf, len, flags) }
}

/// # Safety
/// glibc's fortified `recvfrom`.
pub unsafe fn __recvfrom_chk(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    buflen: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    if len > buflen {
        // SAFETY: glibc reports the overflow and aborts.
        return unsafe { real::__recvfrom_chk(fd, buf, len, buflen, flags, addr, alen) };
    }
    // SAFETY: the caller's own arguments, unchanged, to libc's function of
    // the same signature, whose contract our caller upholds (# Safety).
    unsafe { recvfrom(fd, buf, len, flags, addr, alen) }
}

/// # Safety
/// glibc's fortified `read`.
pub unsafe fn __read_chk(fd: c_int, buf: *mut c_void, len: size_t, buflen: size_t) -> ssize_t {
    if len > buflen {
        // SAFETY: glibc reports the overflow and aborts.
        return unsafe { real::__read_chk(fd, buf, len, buflen) };
    }
    // SAFETY: the caller's own arguments, unchanged, to libc's function of
    // the same signature, whose contract our caller upholds (# Safety).
    unsafe { read(fd, buf, len) }
}

// ------------------------------------------------------------ readiness

/// Does a pollfd array hold a socket whose waits spin?
fn pollfds_spin(fds: *const pollfd, n: nfds_t) -> bool {
    if fds.is_null() {
        return false;
    }
    // SAFETY: the caller passed `n` pollfds (the kernel would EFAULT
    // otherwise; we only read them).
    let fds = unsafe { std::slice::from_raw_parts(fds, n as usize) };
    fds.iter()
        .any(|p| p.fd >= 0 && spin::spins_on(table::lookup(p.fd)))
}

/// # Safety
/// As libc's `poll`.
pub unsafe fn poll(fds: *mut pollfd, n: nfds_t, tmo: c_int) -> c_int {
    if ready::pollfds_accel(fds, n, ops::serving_seen) {
        let total = if tmo < 0 {
            None
        } else {
            Some(tmo as u64 * 1_000_000)
        };
        return ready::poll_mixed(fds, n, total, std::ptr::null(), ops::serving);
    }
    if let Some(budget) = spin::poll_budget(tmo as i64)
        && n <= 4096
        && pollfds_spin(fds, n)
    {
        // SAFETY: the caller's array, zero timeout.
        match spin::spin_wait(budget, 0, -1, || unsafe { real::poll(fds, n, 0) }) {
            Ok(r) => return r,
            Err(spent) => {
                // SAFETY: the caller's own arguments, unchanged, to libc's function of
                // the same signature, whose contract our caller upholds (# Safety).
                return unsafe { real::poll(fds, n, spin::remaining_ms(tmo, spent)) };
            }
        }
    }
    // SAFETY: the caller's own arguments, unchanged, to libc's function of
    // the same signature, whose contract our caller upholds (# Safety).
    unsafe { real::poll(fds, n, tmo) }
}

/// # Safety
/// glibc's fortified `poll`.
pub unsafe fn __poll_chk(fds: *mut pollfd, n: nfds_t, tmo: c_int, fdslen: size_t) -> c_int {
    if (fdslen / std::mem::size_of::<pollfd>()) < n as usize {
        // SAFETY: glibc reports the overflow and aborts.
        return unsafe { real::__poll_chk(fds, n, tmo, fdslen) };
    }
    // SAFETY: the caller's own arguments, unchanged, to libc's function of
    // the same signature, whose contract our caller upholds (# Safety).
    unsafe { poll(fds, n, tmo) }
}

fn ts_ns(ts: &timespec) -> Option<u64> {
    if ts.tv_sec < 0 || ts.tv_nsec < 0 || ts.tv_nsec >= 1_000_000_000 {
        return None;
    }
    Some(
        (ts.tv_sec as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(ts.tv_nsec as u64),
    )
}

fn ns_ts(ns: u64) -> timespec {
    timespec {
        tv_sec: (ns / 1_000_000_000) as _,
        tv_nsec: (ns % 1_000_000_000) as _,
    }
}

/// Spin budget for a call with an optional timespec timeout; `None` = do
/// not spin (zero or invalid timeout, spinning off).
fn ts_budget(tmo: *const timespec) -> Option<(u64, Option<u64>)> {
    let spin = spin::SPIN_NS.load(Ordering::Relaxed);
    if spin == 0 || !spin::SPIN_POLL.load(Ordering::Relaxed) {
        return None;
    }
    if tmo.is_null() {
        return Some((spin, None));
    }
    // SAFETY: non-null pointer from the caller, read once.
    let total = ts_ns(unsafe { &*tmo })?;
    if total == 0 {
        return None;
    }
    Some((spin.min(total), Some(total)))
}

/// # Safety
/// As libc's `ppoll`.
pub unsafe fn ppoll(
    fds: *mut pollfd,
    n: nfds_t,
    tmo: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    if ready::pollfds_accel(fds, n, ops::serving_seen) {
        let total = if tmo.is_null() {
            None
        } else {
            // SAFETY: the caller's timespec.
            match ts_ns(unsafe { &*tmo }) {
                Some(t) => Some(t),
                // SAFETY: the kernel answers EINVAL.
                None => return unsafe { real::ppoll(fds, n, tmo, mask) },
            }
        };
        return ready::poll_mixed(fds, n, total, mask, ops::serving);
    }
    if let Some((budget, total)) = ts_budget(tmo)
        && n <= 4096
        && pollfds_spin(fds, n)
    {
        let zero = ns_ts(0);
        // SAFETY: the caller's arguments with a zero timeout.
        match spin::spin_wait(budget, 0, -1, || unsafe {
            real::ppoll(fds, n, &zero, mask)
        }) {
            Ok(r) => return r,
            Err(spent) => {
                let rest = total.map(|t| ns_ts(t.saturating_sub(spent)));
                let p = rest
                    .as_ref()
                    .map_or(std::ptr::null(), |t| t as *const timespec);
                // SAFETY: the caller's own arguments, unchanged, to libc's function of
                // the same signature, whose contract our caller upholds (# Safety).
                return unsafe { real::ppoll(fds, n, p, mask) };
            }
        }
    }
    // SAFETY: the caller's own arguments, unchanged, to libc's function of
    // the same signature, whose contract our caller upholds (# Safety).
    unsafe { real::ppoll(fds, n, tmo, mask) }
}

/// # Safety
/// glibc's fortified `ppoll`.
pub unsafe fn __ppoll_chk(
    fds: *mut pollfd,
    n: nfds_t,
    tmo: *const timespec,
    mask: *const sigset_t,
    fdslen: size_t,
) -> c_int {
    if (fdslen / std::mem::size_of::<pollfd>()) < n as usize {
        // SAFETY: glibc reports the overflow and aborts.
        return unsafe { real::__ppoll_chk(fds, n, tmo, mask, fdslen) };
    }
    // SAFETY: the caller's own arguments, unchanged, to libc's function of
    // the same signature, whose contract our caller upholds (# Safety).
    unsafe { ppoll(fds, n, tmo, mask) }
}

/// Does any fd set of a select hold a socket whose waits spin?
fn fdsets_spin(n: c_int, sets: [*mut fd_set; 3]) -> bool {
    let n = n.clamp(0, libc::FD_SETSIZE as c_int);
    (0..n).any(|fd| {
        sets.iter().any(|s| {
            // SAFETY: non-null fd_set from the caller; fd < FD_SETSIZE.
            !s.is_null() && unsafe { libc::FD_ISSET(fd, *s) }
        }) && spin::spins_on(table::lookup(fd))
    })
}

struct SavedSets {
    sets: [*mut fd_set; 3],
    copy: [fd_set; 3],
}

impl SavedSets {
    fn new(sets: [*mut fd_set; 3]) -> SavedSets {
        // SAFETY: fd_set is plain bits; zeroed is a valid empty set.
        let mut copy: [fd_set; 3] = unsafe { std::mem::zeroed() };
        for (c, s) in copy.iter_mut().zip(sets) {
            if !s.is_null() {
                // SAFETY: the caller's fd_set.
                *c = unsafe { *s };
            }
        }
        SavedSets { sets, copy }
    }
    fn restore(&self) {
        for (c, s) in self.copy.iter().zip(self.sets) {
            if !s.is_null() {
                // SAFETY: the caller's fd_set.
                unsafe { *s = *c };
            }
        }
    }
}

/// # Safety
/// As libc's `select`.
pub unsafe fn select(
    n: c_int,
    r: *mut fd_set,
    w: *mut fd_set,
    e: *mut fd_set,
    tv: *mut timeval,
) -> c_int {
    let total = if tv.is_null() {
        None
    } else {
        // SAFETY: the caller's timeval.
        let t = unsafe { *tv };
        if t.tv_sec < 0 || t.tv_usec < 0 || t.tv_usec >= 1_000_000 {
            // SAFETY: the kernel answers EINVAL.
            return unsafe { real::select(n, r, w, e, tv) };
        }
        // Saturating: a huge tv_sec (a "forever" some programs use) must
        // not wrap into a short timeout.
        Some(
            (t.tv_sec as u64)
                .saturating_mul(1_000_000_000)
                .saturating_add(t.tv_usec as u64 * 1000),
        )
    };
    if ready::fdsets_accel(n, [r, w, e], ops::serving_seen) {
        return ready::select_mixed(n, [r, w, e], total, std::ptr::null(), ops::serving);
    }
    let spin = spin::SPIN_NS.load(Ordering::Relaxed);
    if spin != 0
        && spin::SPIN_POLL.load(Ordering::Relaxed)
        && total != Some(0)
        && fdsets_spin(n, [r, w, e])
    {
        let saved = SavedSets::new([r, w, e]);
        let budget = total.map_or(spin, |t| spin.min(t));
        let res = spin::spin_wait(budget, 0, -1, || {
            saved.restore();
            let mut zero = timeval {
                tv_sec: 0,
                tv_usec: 0,
            };
            // SAFETY: the caller's sets, zero timeout.
            unsafe { real::select(n, r, w, e, &mut zero) }
        });
        match res {
            Ok(x) => return x,
            Err(spent) => {
                saved.restore();
                if let Some(t) = total {
                    let left = t.saturating_sub(spent);
                    // SAFETY: the caller's timeval: Linux reports the time left in it.
                    unsafe {
                        (*tv).tv_sec = (left / 1_000_000_000) as _;
                        (*tv).tv_usec = ((left % 1_000_000_000) / 1000) as _;
                    }
                }
                // SAFETY: the caller's own arguments, unchanged, to libc's function of
                // the same signature, whose contract our caller upholds (# Safety).
                return unsafe { real::select(n, r, w, e, tv) };
            }
        }
    }
    // SAFETY: the caller's own arguments, unchanged, to libc's function of
    // the same signature, whose contract our caller upholds (# Safety).
    unsafe { real::select(n, r, w, e, tv) }
}

/// # Safety
/// As libc's `pselect`.
pub unsafe fn pselect(
    n: c_int,
    r: *mut fd_set,
    w: *mut fd_set,
    e: *mut fd_set,
    tmo: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    if ready::fdsets_accel(n, [r, w, e], ops::serving_seen) {
        let total = if tmo.is_null() {
            None
        } else {
            // SAFETY: the caller's timespec.
            match ts_ns(unsafe { &*tmo }) {
                Some(t) => Some(t),
                // SAFETY: the kernel answers EINVAL.
                None => return unsafe { real::pselect(n, r, w, e, tmo, mask) },
            }
        };
        return ready::select_mixed(n, [r, w, e], total, mask, ops::serving);
    }
    if let Some((budget, total)) = ts_budget(tmo)
        && fdsets_spin(n, [r, w, e])
    {
        let saved = SavedSets::new([r, w, e]);
        let zero = ns_ts(0);
        let res = spin::spin_wait(budget, 0, -1, || {
            saved.restore();
            // SAFETY: the caller's sets, zero timeout.
            unsafe { real::pselect(n, r, w, e, &zero, mask) }
        });
        match res {
            Ok(x) => return x,
            Err(spent) => {
                saved.restore();
                let rest = total.map(|t| ns_ts(t.saturating_sub(spent)));
                let p = rest
                    .as_ref()
                    .map_or(std::ptr::null(), |t| t as *const timespec);
                // SAFETY: the caller's own arguments, unchanged, to libc's function of
                // the same signature, whose contract our caller upholds (# Safety).
                return unsafe { real::pselect(n, r, w, e, p, mask) };
            }
        }
    }
    // SAFETY: the caller's own arguments, unchanged, to libc's function of
    // the same signature, whose contract our caller upholds (# Safety).
    unsafe { real::pselect(n, r, w, e, tmo, mask) }
}

// ----------------------------------------------------------------- epoll

/// # Safety
/// As libc's `epoll_create`.
pub unsafe fn epoll_create(size: c_int) -> c_int {
    // SAFETY: the caller's own arguments, unchanged, to libc's function of
    // the same signature, whose contract our caller upholds (# Safety).
    let r = unsafe { real::epoll_create(size) };
    if r >= 0 {
        crate::fdlife::created(r);
        table::set(r, C_EPOLL, 0);
    }
    r
}

/// # Safety
/// As libc's `epoll_create1`.
pub unsafe fn epoll_create1(flags: c_int) -> c_int {
    // SAFETY: the caller's own arguments, unchanged, to libc's function of
    // the same signature, whose contract our caller upholds (# Safety).
    let r = unsafe { real::epoll_create1(flags) };
    if r >= 0 {
        crate::fdlife::created(r);
        table::set(r, C_EPOLL, 0);
    }
    r
}

/// # Safety
/// As libc's `epoll_ctl`.
pub unsafe fn epoll_ctl(ep: c_int, op: c_int, fd: c_int, ev: *mut epoll_event) -> c_int {
    let sock = if fd >= 0 && op != libc::EPOLL_CTL_DEL {
        ops::serving_seen(fd)
    } else if fd >= 0 {
        ops::serving(fd)
    } else {
        Sock::Kernel
    };
    if sock.hides_kernel() {
        return ready::epoll_ctl_tcp(ep, op, fd, ev);
    }
    let shim_fd = fd >= 0
        && (table::get(fd) & (table::F_ACCEL | table::F_CAND | table::F_TCAND) != 0
            || matches!(sock, Sock::Tcp(_)));
    if shim_fd || ready::epoll_tagged(ep, fd) {
        // The kernel registration carries a tag naming `fd` (see
        // `ready::tagged`); the application's data is kept by the shim.
        let app = if ev.is_null() || op == libc::EPOLL_CTL_DEL {
            None
        } else {
            // SAFETY: the caller's event, read once (may be unaligned: packed on x86-64).
            Some(unsafe { std::ptr::read_unaligned(ev) })
        };
        let mut k = app.map(|e| ready::tagged(fd, &e));
        let kp = k.as_mut().map_or(ev, |e| e as *mut epoll_event);
        // SAFETY: the caller's op and fds, with our tagged copy of its event
        // (or its own pointer, for DEL and for the kernel's EFAULT).
        let r = unsafe { real::epoll_ctl(ep, op, fd, kp) };
        if r == 0 {
            ready::epoll_ctl_accel(ep, op, fd, app, accel::lookup_gen(fd));
            ready::epoll_changed(ep);
        }
        return r;
    }
    // SAFETY: the caller's own arguments, unchanged, to libc's function of
    // the same signature, whose contract our caller upholds (# Safety).
    let r = unsafe { real::epoll_ctl(ep, op, fd, ev) };
    if r == 0 && ready::epoll_has_accel(ep) {
        ready::epoll_changed(ep);
    }
    if r == 0
        && (op == libc::EPOLL_CTL_ADD || op == libc::EPOLL_CTL_MOD)
        && spin::spins_on(table::lookup(fd))
    {
        table::add_flags(ep, F_EPOLL_INET);
    }
    r
}

#[inline]
fn epoll_spins(ep: c_int) -> bool {
    table::get(ep) & F_EPOLL_INET != 0
}

/// # Safety
/// As libc's `epoll_wait`.
pub unsafe fn epoll_wait(ep: c_int, evs: *mut epoll_event, max: c_int, tmo: c_int) -> c_int {
    if ready::epoll_has_accel(ep) {
        let total = if tmo < 0 {
            None
        } else {
            Some(tmo as u64 * 1_000_000)
        };
        return ready::epoll_mixed(ep, evs, max, total, std::ptr::null());
    }
    if let Some(budget) = spin::poll_budget(tmo as i64)
        && epoll_spins(ep)
    {
        let gen0 = table::generation(table::get(ep));
        // SAFETY: the caller's buffer, zero timeout.
        match spin::spin_wait(budget, gen0, ep, || unsafe {
            real::epoll_wait(ep, evs, max, 0)
        }) {
            Ok(r) => return r,
            Err(spent) => {
                // SAFETY: the caller's own arguments, unchanged, to libc's function of
                // the same signature, whose contract our caller upholds (# Safety).
                return unsafe { real::epoll_wait(ep, evs, max, spin::remaining_ms(tmo, spent)) };
            }
        }
    }
    // SAFETY: the caller's own arguments, unchanged, to libc's function of
    // the same signature, whose contract our caller upholds (# Safety).
    unsafe { real::epoll_wait(ep, evs, max, tmo) }
}

/// # Safety
/// As libc's `epoll_pwait`.
pub unsafe fn epoll_pwait(
    ep: c_int,
    evs: *mut epoll_event,
    max: c_int,
    tmo: c_int,
    mask: *const sigset_t,
) -> c_int {
    if ready::epoll_has_accel(ep) {
        let total = if tmo < 0 {
            None
        } else {
            Some(tmo as u64 * 1_000_000)
        };
        return ready::epoll_mixed(ep, evs, max, total, mask);
    }
    if let Some(budget) = spin::poll_budget(tmo as i64)
        && epoll_spins(ep)
    {
        let gen0 = table::generation(table::get(ep));
        let res = spin::spin_wait(budget, gen0, ep, || {
            // SAFETY: the caller's buffer and mask, zero timeout.
            unsafe { real::epoll_pwait(ep, evs, max, 0, mask) }
        });
        match res {
            Ok(r) => return r,
            Err(spent) => {
                let rest = spin::remaining_ms(tmo, spent);
                // SAFETY: the caller's own arguments, unchanged, to libc's function of
                // the same signature, whose contract our caller upholds (# Safety).
                return unsafe { real::epoll_pwait(ep, evs, max, rest, mask) };
            }
        }
    }
    // SAFETY: the caller's own arguments, unchanged, to libc's function of
    // the same signature, whose contract our caller upholds (# Safety).
    unsafe { real::epoll_pwait(ep, evs, max, tmo, mask) }
}

/// # Safety
/// As libc's `epoll_pwait2`.
pub unsafe fn epoll_pwait2(
    ep: c_int,
    evs: *mut epoll_event,
    max: c_int,
    tmo: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    if ready::epoll_has_accel(ep) {
        let total = if tmo.is_null() {
            None
        } else {
            // SAFETY: the caller's timespec.
            match ts_ns(unsafe { &*tmo }) {
                Some(t) => Some(t),
                // SAFETY: the kernel answers EINVAL.
                None => return unsafe { real::epoll_pwait2(ep, evs, max, tmo, mask) },
            }
        };
        return ready::epoll_mixed(ep, evs, max, total, mask);
    }
    if let Some((budget, total)) = ts_budget(tmo)
        && epoll_spins(ep)
    {
        let gen0 = table::generation(table::get(ep));
        let zero = ns_ts(0);
        let res = spin::spin_wait(budget, gen0, ep, || {
            // SAFETY: the caller's buffer and mask, zero timeout.
            unsafe { real::epoll_pwait2(ep, evs, max, &zero, mask) }
        });
        match res {
            Ok(r) => return r,
            Err(spent) => {
                let rest = total.map(|t| ns_ts(t.saturating_sub(spent)));
                let p = rest
                    .as_ref()
                    .map_or(std::ptr::null(), |t| t as *const timespec);
                // SAFETY: the caller's own arguments, unchanged, to libc's function of
                // the same signature, whose contract our caller upholds (# Safety).
                return unsafe { real::epoll_pwait2(ep, evs, max, p, mask) };
            }
        }
    }
    // SAFETY: the caller's own arguments, unchanged, to libc's function of
    // the same signature, whose contract our caller upholds (# Safety).
    unsafe { real::epoll_pwait2(ep, evs, max, tmo, mask) }
}

/// # Safety
/// As libc's `listen`.
pub unsafe fn listen(fd: c_int, backlog: c_int) -> c_int {
    ops::listen(fd, backlog)
}

/// # Safety
/// As libc's `getsockname`.
pub unsafe fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    ops::name(fd, false, addr, len)
}

/// # Safety
/// As libc's `getpeername`.
pub unsafe fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    ops::name(fd, true, addr, len)
}

/// # Safety
/// As libc's `getsockopt`.
pub unsafe fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    ops::getsockopt(fd, level, name, val, len)
}

/// # Safety
/// As libc's `bind`.
pub unsafe fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    ops::bind(fd, addr, len)
}

/// # Safety
/// As libc's `connect`.
pub unsafe fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    ops::connect(fd, addr, len)
}

/// # Safety
/// As libc's `sendto`.
pub unsafe fn sendto(
    fd: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
    addr: *const sockaddr,
    alen: socklen_t,
) -> ssize_t {
    probe::mark(Mark::SendEntered);
    // As `recvfrom`: the hot shape in one piece.
    let sock = ops::of_send(fd, || !addr.is_null());
    if let Sock::Udp(a) = sock
        && ahooks::engine_send(a, flags)
    {
        return ahooks::sendto_engine(a, fd, buf, len, flags, addr, alen);
    }
    ops::send_on(
        sock,
        fd,
        Send::To {
            buf,
            len,
            addr,
            alen,
        },
        flags,
    )
}

/// # Safety
/// As libc's `send`.
pub unsafe fn send(fd: c_int, buf: *const c_void, len: size_t, flags: c_int) -> ssize_t {
    let sock = ops::of(fd);
    if let Sock::Udp(a) = sock
        && ahooks::engine_send(a, flags)
    {
        return ahooks::sendto_engine(a, fd, buf, len, flags, std::ptr::null(), 0);
    }
    ops::send_on(sock, fd, Send::Buf { buf, len }, flags)
}

/// # Safety
/// As libc's `sendmsg`.
pub unsafe fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    // A message that names its destination is a send "to" as `sendto`'s
    // (a forked copy's answer is not a use of the socket: `ops::of_send`;
    // the header is read only there); an unreadable header is the
    // kernel's EFAULT either way.
    let to = || crate::uaccess::obj(msg).is_some_and(|m| !m.msg_name.is_null());
    ops::send_on(ops::of_send(fd, to), fd, Send::Msg(msg), flags)
}

/// # Safety
/// As libc's `sendmmsg`.
pub unsafe fn sendmmsg(fd: c_int, msgs: *mut mmsghdr, vlen: c_uint, flags: c_int) -> c_int {
    // Messages that all name their destinations are sends "to" as
    // `sendmsg`'s (a forked copy's answers are not a use of the socket:
    // `ops::of_send`; the headers are read only there, at most the
    // kernel's 1,024); an unreadable one is the kernel's EFAULT either way.
    let to = || {
        (0..vlen.min(1024) as usize).all(|i| {
            crate::uaccess::obj(msgs.wrapping_add(i).cast_const())
                .is_some_and(|m| !m.msg_hdr.msg_name.is_null())
        })
    };
    let a = match ops::of_send(fd, to) {
        Sock::Tcp(t) if !(flags & libc::MSG_OOB != 0 && ops::tcp_oob_to_kernel(fd)) => {
            return streamio::sendmmsg(t, fd, msgs, vlen, flags);
        }
        Sock::Tcp(_) => None,
        Sock::Udp(a) => Some(a).filter(|a| a.mine()),
        Sock::Kernel => None,
    };
    if let Some(r) = ahooks::sendmmsg(a, fd, msgs, vlen, flags) {
        return r;
    }
    // SAFETY: the caller's own arguments, unchanged, to libc's function of
    // the same signature, whose contract our caller upholds (# Safety).
    unsafe { real::sendmmsg(fd, msgs, vlen, flags) }
}

/// # Safety
/// As libc's `write`.
pub unsafe fn write(fd: c_int, buf: *const c_void, len: size_t) -> ssize_t {
    ops::send(fd, Send::Write { buf, len }, 0)
}

/// # Safety
/// As libc's `writev`.
pub unsafe fn writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    ops::send(fd, Send::Vec { iov, cnt }, 0)
}

/// # Safety
/// As libc's `sendfile`.
pub unsafe fn sendfile(out: c_int, inp: c_int, off: *mut off_t, count: size_t) -> ssize_t {
    ops::sendfile(out, inp, off, count, false)
}

/// # Safety
/// As libc's `splice`. An engine TCP connection with a pipe on the other
/// side is served on the engine (`crate::splice`).
pub unsafe fn splice(
    fd_in: c_int,
    off_in: *mut libc::loff_t,
    fd_out: c_int,
    off_out: *mut libc::loff_t,
    len: size_t,
    flags: c_uint,
) -> ssize_t {
    ops::splice(fd_in, off_in, fd_out, off_out, len, flags)
}

/// # Safety
/// As libc's `sendfile64`.
pub unsafe fn sendfile64(out: c_int, inp: c_int, off: *mut off64_t, count: size_t) -> ssize_t {
    ops::sendfile(out, inp, off, count, true)
}
