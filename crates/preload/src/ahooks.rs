//! The UDP operations (`ops.rs`): receives and sends on an fd whose record
//! is an xdp-engine UDP socket `a` (this process's, or a forked child's
//! inherited copy), and the candidate's side of the kernel path (a socket
//! that goes onto the engine at its first send). Each function returns
//! `Some(result)` when it served the call and `None` to let the kernel
//! socket under the fd answer.

use crate::accel::{self, Accel, Got};
use crate::adapt::Turn;
use crate::log::log;
use crate::opts::Opt;
use crate::real;
use crate::spin::{errno, set_errno};
use crate::table;
use crate::uaccess::{self, Access};
use libc::{c_int, c_uint, c_void, iovec, mmsghdr, msghdr, sockaddr, socklen_t, ssize_t};
use nanowire_options::Level;
use nanowire_sockabi::iov::{Call, UDP_MAX_PAYLOAD};
use std::sync::atomic::Ordering;

/// Flags the engine does not serve: the kernel socket under the fd answers
/// (error queue, out-of-band).
const KERNEL_ONLY: c_int = libc::MSG_ERRQUEUE | libc::MSG_OOB;

#[inline]
fn fail<T: From<i8>>(e: c_int) -> T {
    set_errno(e);
    T::from(-1)
}

/// A forked child's inherited accelerated fd: the kernel socket under it,
/// with the application's blocking mode emulated (the kernel socket is
/// non-blocking underneath).
fn inherited_recv(
    a: &Accel,
    fd: c_int,
    flags: c_int,
    mut attempt: impl FnMut(c_int) -> isize,
) -> isize {
    loop {
        let r = attempt(flags | libc::MSG_DONTWAIT);
        if r >= 0 || errno() != libc::EAGAIN {
            return r;
        }
        if flags & libc::MSG_DONTWAIT != 0 || a.common.nonblock() {
            return r;
        }
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let tmo = a.common.rcvtimeo_ns();
        let ms = if tmo == 0 {
            -1
        } else {
            tmo.div_ceil(1_000_000) as c_int
        };
        // SAFETY: one pollfd on our stack.
        if unsafe { real::poll(&mut p, 1, ms) } == 0 {
            set_errno(libc::EAGAIN);
            return -1;
        }
    }
}

pub fn recvfrom(
    a: &'static Accel,
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> Option<ssize_t> {
    if flags & KERNEL_ONLY != 0 {
        return None;
    }
    if a.mine() {
        return Some(recvfrom_engine(a, fd, buf, len, flags, addr, alen));
    }
    accel::note_inherited(fd);
    Some(inherited_recv(a, fd, flags, |f| {
        // SAFETY: the caller's arguments.
        unsafe { real::recvfrom(fd, buf, len, f, addr, alen) }
    }))
}

/// Does the engine serve a receive on `a` with `flags` itself (this
/// process's socket, no flag the kernel socket answers)? Then
/// [`recvfrom_engine`] is the whole call: the interposed `recv` and
/// `recvfrom` go straight there (`dispatch.rs`).
#[inline(always)]
pub fn engine_recv(a: &Accel, flags: c_int) -> bool {
    flags & KERNEL_ONLY == 0 && a.mine()
}

/// [`recvfrom`] on this process's engine socket with no kernel-only flag
/// ([`engine_recv`]). Inline: in the interposed `recvfrom` its thread-local
/// accesses share the export's one `__tls_get_addr`.
#[inline(always)]
pub fn recvfrom_engine(
    a: &'static Accel,
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    let mut copied = 0;
    let mut bad = false;
    // The common case: buffer, address and its length seen before, one
    // look at the thread's cache (valid after the wait while no mapping
    // changed); otherwise each is checked when its bytes are copied.
    let [al, ad] = name_range(addr, alen);
    let seen = uaccess::all_cached(&[(buf as usize, len), al, ad], Access::Write);
    let r = accel::recv_one(a, fd, flags, |p, _| {
        let n = p.len().min(len);
        // The kernel's copy faults: the datagram is consumed, EFAULT.
        bad = !(seen.still() || uaccess::ok_ptr(buf, n, Access::Write));
        if n > 0 && !bad {
            // SAFETY: `n` bytes of the caller's buffer, mapped writable.
            unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), buf.cast::<u8>(), n) };
        }
        copied = n;
    });
    match r {
        Ok(Got::Data(..)) if bad => fail(libc::EFAULT),
        Ok(Got::Data(full, src)) => {
            if let Err(e) = put_name(src, addr, alen, seen) {
                return fail(e);
            }
            if flags & libc::MSG_TRUNC != 0 {
                full as ssize_t
            } else {
                copied as ssize_t
            }
        }
        Ok(Got::Eof) => 0,
        Err(e) => fail(e),
    }
}

pub fn recvmsg(a: &'static Accel, fd: c_int, msg: *mut msghdr, flags: c_int) -> Option<ssize_t> {
    if flags & KERNEL_ONLY != 0 {
        if flags & libc::MSG_ERRQUEUE != 0 && !msg.is_null() && a.mine() {
            // Transmit stamps of the engine's sends; the kernel socket's
            // own queue when there are none.
            // SAFETY: the caller's msghdr.
            return accel::recv_err(a, fd, unsafe { &mut *msg }, flags);
        }
        return None;
    }
    if a.mine() {
        let Some(m) = uaccess::obj_mut(msg) else {
            return Some(fail(libc::EFAULT));
        };
        // The header's checks come before any wait (copy_msghdr).
        let (v, cap) = match uaccess::iovecs(m.msg_iov, m.msg_iovlen, Call::Msg) {
            Ok(x) => x,
            Err(e) => return Some(fail(e)),
        };
        let mut copied = 0;
        let mut bad = false;
        let r = accel::recv_one(a, fd, flags, |p, _| {
            bad = !uaccess::bufs_ok(v, p.len(), Access::Write);
            if !bad {
                copied = uaccess::scatter(v, p);
            }
        });
        return Some(match r {
            Ok(Got::Data(..)) if bad => fail(libc::EFAULT),
            Ok(Got::Data(full, src)) => {
                if !m.msg_name.is_null()
                    && let Err(e) = put_name(
                        src,
                        m.msg_name.cast(),
                        &mut m.msg_namelen,
                        uaccess::Seen::NO,
                    )
                {
                    return Some(fail(e));
                }
                if !uaccess::ok_ptr(m.msg_control, m.msg_controllen, Access::Write) {
                    // The kernel's put_cmsg would fault: no control data.
                    m.msg_controllen = 0;
                }
                m.msg_flags = if full > cap { libc::MSG_TRUNC } else { 0 };
                crate::tstamp::put_rx(&a.ts, m);
                if flags & libc::MSG_TRUNC != 0 {
                    full as ssize_t
                } else {
                    copied as ssize_t
                }
            }
            Ok(Got::Eof) => {
                m.msg_controllen = 0;
                m.msg_flags = 0;
                0
            }
            Err(e) => fail(e),
        });
    }
    accel::note_inherited(fd);
    Some(inherited_recv(a, fd, flags, |f| {
        // SAFETY: the caller's arguments.
        unsafe { real::recvmsg(fd, msg, f) }
    }))
}

pub fn recvmmsg(
    a: &'static Accel,
    fd: c_int,
    msgs: *mut mmsghdr,
    vlen: c_uint,
    flags: c_int,
) -> Option<c_int> {
    if flags & KERNEL_ONLY != 0 || !a.mine() {
        return None;
    }
    let vlen = vlen.min(1024) as usize;
    if vlen == 0 {
        return Some(0);
    }
    let mut n = 0;
    let mut f = flags & !libc::MSG_WAITFORONE;
    while n < vlen {
        let Some(mm) = uaccess::obj_mut(msgs.wrapping_add(n)) else {
            if n == 0 {
                return Some(fail(libc::EFAULT));
            }
            break;
        };
        match recvmsg(a, fd, &mut mm.msg_hdr, f) {
            Some(r) if r >= 0 => {
                mm.msg_len = r as c_uint;
                n += 1;
                if flags & libc::MSG_WAITFORONE != 0 || a.common.nonblock() {
                    f |= libc::MSG_DONTWAIT;
                }
            }
            _ => break,
        }
    }
    Some(if n > 0 { n as c_int } else { -1 })
}

/// A send on `fd`: `a` is its engine record of this process, or `None`
/// (a candidate goes onto the engine here when the call names a peer).
pub fn sendto(
    a: Option<&'static Accel>,
    fd: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
    addr: *const sockaddr,
    alen: socklen_t,
) -> Option<ssize_t> {
    if flags & libc::MSG_OOB != 0 {
        return None; // the kernel socket answers (EOPNOTSUPP for UDP)
    }
    let a = match a {
        Some(a) => a,
        None => {
            if table::get(fd) & table::F_CAND == 0 || addr.is_null() {
                return None;
            }
            let Ok(Some(dst)) = accel::read_sockaddr(addr, alen) else {
                return None;
            };
            promote_for_peer(fd, dst)?
        }
    };
    Some(sendto_engine(a, fd, buf, len, flags, addr, alen))
}

/// Does the engine serve a send on `a` with `flags` itself (this
/// process's socket, no MSG_OOB)? Then [`sendto_engine`] is the whole
/// call: the interposed `send` and `sendto` go straight there.
#[inline(always)]
pub fn engine_send(a: &Accel, flags: c_int) -> bool {
    flags & libc::MSG_OOB == 0 && a.mine()
}

/// [`sendto`] on this process's engine socket with no MSG_OOB
/// ([`engine_send`]). Inline, as [`recvfrom_engine`].
#[inline(always)]
pub fn sendto_engine(
    a: &'static Accel,
    fd: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
    addr: *const sockaddr,
    alen: socklen_t,
) -> ssize_t {
    if len > 0xffff {
        // udp_sendmsg's first check.
        return fail(libc::EMSGSIZE);
    }
    // The common case: the address and the data seen before, one look at
    // the thread's cache; otherwise each is checked on its own, in order.
    let seen = uaccess::all_cached(
        &[(addr as usize, alen as usize), (buf as usize, len)],
        Access::Read,
    )
    .still();
    let dst = match accel::read_sockaddr_seen(addr, alen, seen) {
        Ok(d) => d,
        Err(e) => return fail(e),
    };
    if len > UDP_MAX_PAYLOAD {
        return fail(libc::EMSGSIZE);
    }
    let data = if seen && len > 0 {
        // SAFETY: `len` bytes at `buf`, mapped readable (`seen`).
        unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) }
    } else {
        let Some(data) = uaccess::buf(buf, len) else {
            return fail(libc::EFAULT);
        };
        data
    };
    match accel::send_one(a, fd, data, dst, flags) {
        Ok(n) => n as ssize_t,
        Err(e) => fail(e),
    }
}

thread_local! {
    static GATHER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// As [`sendto`], with a message header.
pub fn sendmsg(
    a: Option<&'static Accel>,
    fd: c_int,
    msg: *const msghdr,
    flags: c_int,
) -> Option<ssize_t> {
    // An unreadable header: the kernel socket under the fd says EFAULT.
    let m = uaccess::obj(msg)?;
    if m.msg_controllen > 0 {
        // Ancillary data (IP_PKTINFO, ...): the kernel socket under the fd
        // sends it as is.
        return None;
    }
    if a.is_none() && (table::get(fd) & table::F_CAND == 0 || m.msg_name.is_null()) {
        return None;
    }
    let (v, total) = match uaccess::iovecs(m.msg_iov, m.msg_iovlen, Call::Msg) {
        Ok(x) => x,
        Err(e) => return Some(fail(e)),
    };
    if total > UDP_MAX_PAYLOAD {
        return Some(fail(libc::EMSGSIZE));
    }
    GATHER.with(|g| {
        let Ok(mut g) = g.try_borrow_mut() else {
            return Some(fail(libc::ENOBUFS));
        };
        if !gather_into(v, total, &mut g) {
            return Some(fail(libc::EFAULT));
        }
        sendto(
            a,
            fd,
            g.as_ptr().cast(),
            g.len(),
            flags,
            m.msg_name.cast(),
            m.msg_namelen,
        )
    })
}

/// As [`sendto`], with a vector of messages.
pub fn sendmmsg(
    a: Option<&'static Accel>,
    fd: c_int,
    msgs: *mut mmsghdr,
    vlen: c_uint,
    flags: c_int,
) -> Option<c_int> {
    if a.is_none() && table::get(fd) & table::F_CAND == 0 {
        return None;
    }
    let vlen = vlen.min(1024) as usize;
    if vlen == 0 {
        return Some(0);
    }
    let mut n = 0usize;
    if let Some(a) = a {
        // Runs of messages to one destination go out as one batch (one TX
        // kick for up to 64 frames).
        while n < vlen {
            match send_run(a, fd, msgs, n, vlen, flags) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) => {
                    if n == 0 {
                        set_errno(e);
                        return Some(-1);
                    }
                    break;
                }
            }
        }
        if n == vlen || n > 0 {
            return Some(n as c_int);
        }
    }
    while n < vlen {
        let Some(mm) = uaccess::obj_mut(msgs.wrapping_add(n)) else {
            if n == 0 {
                return Some(fail(libc::EFAULT));
            }
            break;
        };
        // A candidate that went onto the engine at the first message.
        let r = match sendmsg(a.or_else(|| accel::lookup(fd)), fd, &mm.msg_hdr, flags) {
            Some(r) => r,
            // SAFETY: this one needs the kernel (ancillary data).
            None => unsafe { real::sendmsg(fd, &mm.msg_hdr, flags) },
        };
        if r < 0 {
            break;
        }
        mm.msg_len = r as c_uint;
        n += 1;
    }
    Some(if n > 0 { n as c_int } else { -1 })
}

/// One datagram of an mmsghdr as bytes, if it can go through the engine
/// (no ancillary data, at most 65507 bytes); its destination.
fn gather(m: &msghdr, out: &mut Vec<u8>) -> Option<Option<std::net::SocketAddrV4>> {
    if m.msg_controllen > 0 {
        return None;
    }
    let dst = accel::read_sockaddr(m.msg_name.cast(), m.msg_namelen).ok()?;
    // Anything the kernel would refuse goes one by one through `sendmsg`,
    // which answers with the kernel's errno.
    let (v, total) = uaccess::iovecs(m.msg_iov, m.msg_iovlen, Call::Msg).ok()?;
    if total > UDP_MAX_PAYLOAD || !gather_into(v, total, out) {
        return None;
    }
    Some(dst)
}

/// Copy `total` bytes of checked iovecs into `out` (cleared first); false
/// if some byte is not mapped readable (the kernel's EFAULT).
fn gather_into(v: &[iovec], total: usize, out: &mut Vec<u8>) -> bool {
    out.clear();
    if !uaccess::bufs_ok(v, total, Access::Read) {
        return false;
    }
    for p in nanowire_sockabi::iov::scatter(
        nanowire_sockabi::iov::clamped_lens_of(uaccess::segs(v)),
        total,
    ) {
        // SAFETY: `p.len` bytes at this iovec's base are mapped readable
        // (`bufs_ok` covered every byte up to `total`).
        out.extend_from_slice(unsafe {
            std::slice::from_raw_parts(v[p.seg].iov_base.cast::<u8>(), p.len)
        });
    }
    true
}

thread_local! {
    static BATCH: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Send messages `from..` of the vector that share one destination as one
/// engine batch; returns how many went (their msg_len set).
fn send_run(
    a: &'static Accel,
    fd: c_int,
    msgs: *mut mmsghdr,
    from: usize,
    vlen: usize,
    flags: c_int,
) -> Result<usize, c_int> {
    BATCH.with(|b| {
        let mut b = b.borrow_mut();
        let mut dst0 = None;
        let mut k = 0;
        while from + k < vlen && k < 64 {
            if b.len() <= k {
                b.push(Vec::new());
            }
            let Some(mm) = uaccess::obj_mut(msgs.wrapping_add(from + k)) else {
                break;
            };
            let Some(dst) = gather(&mm.msg_hdr, &mut b[k]) else {
                break;
            };
            if k > 0 && dst != dst0 {
                break;
            }
            dst0 = dst;
            k += 1;
        }
        if k == 0 {
            // Not for the engine (ancillary data, too big): one by one.
            let Some(mm) = uaccess::obj_mut(msgs.wrapping_add(from)) else {
                return Err(libc::EFAULT);
            };
            let r = sendmsg(Some(a), fd, &mm.msg_hdr, flags)
                // SAFETY: the kernel socket under the fd sends it.
                .unwrap_or_else(|| unsafe { real::sendmsg(fd, &mm.msg_hdr, flags) });
            if r < 0 {
                return Err(errno());
            }
            mm.msg_len = r as c_uint;
            return Ok(1);
        }
        let bufs: Vec<&[u8]> = b[..k].iter().map(|v| v.as_slice()).collect();
        let sent = accel::send_batch(a, fd, &bufs, dst0, flags)?;
        for (i, buf) in bufs.iter().enumerate().take(sent) {
            if let Some(mm) = uaccess::obj_mut(msgs.wrapping_add(from + i)) {
                mm.msg_len = buf.len() as c_uint;
            }
        }
        Ok(sent)
    })
}

/// A candidate about to talk to `dst` without a bind goes onto the engine
/// (or is told why not); epoll interests follow it.
fn promote_for_peer(fd: c_int, dst: std::net::SocketAddrV4) -> Option<&'static Accel> {
    let a = accel::accelerate_for_peer(fd, dst)?;
    crate::share::watch();
    Some(a)
}

/// bind(): a candidate goes onto the engine here.
pub fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> Option<c_int> {
    if table::get(fd) & table::F_CAND == 0 {
        return None;
    }
    let Ok(Some(sa)) = accel::read_sockaddr(addr, len) else {
        return None;
    };
    // The engine opens before the lock (`accel::engine_ahead`).
    let mut ahead = accel::engine_ahead(*sa.ip(), None);
    let _g = accel::DECIDE.lock().unwrap_or_else(|e| e.into_inner());
    if table::get(fd) & table::F_CAND == 0 {
        return None;
    }
    if let Some(other) = crate::share::competitor(sa, 0) {
        table::clear_flags(fd, table::F_CAND);
        crate::share::TAKEN_OFF.fetch_add(1, Ordering::Relaxed);
        accel::log_not(fd, &crate::share::why(other));
        return None;
    }
    // The application's own socket binds (the kernel answers, errors
    // included), then the engine adopts it.
    // SAFETY: the caller's arguments, unchanged, to libc's bind.
    let r = unsafe { real::bind(fd, addr, len) };
    if r != 0 {
        table::clear_flags(fd, table::F_CAND);
        return Some(r);
    }
    let _ = took(fd, sa, accel::accelerate(fd, None, &mut ahead));
    Some(0)
}

/// What [`accel::accelerate`] of `fd` (bound to `sa`) answered: the record,
/// or `None` with why said.
fn took(
    fd: c_int,
    sa: std::net::SocketAddrV4,
    r: Result<&'static accel::Accel, accel::NotAccel>,
) -> Option<&'static accel::Accel> {
    table::clear_flags(fd, table::F_CAND);
    match r {
        Ok(a) => {
            crate::share::watch();
            return Some(a);
        }
        Err(accel::NotAccel::Engine(why)) => accel::log_not(fd, &why),
        Err(accel::NotAccel::Inapplicable(why)) => accel::log_not_applicable(fd, &why),
        Err(accel::NotAccel::Socket) => {
            accel::log_not(fd, &format!("the engine could not take {sa}"))
        }
    }
    None
}

/// A bound socket (port `sa`) onto the engine as `bind` puts a fresh one,
/// with the same checks (SO_REUSEPORT, another process's socket on the
/// port, the engine's own). `None`: it stays the kernel's (said why).
/// `busy_wait`: while the interface is busy (EBUSY: the engine of a
/// process that just exited, which the kernel frees a moment after it is
/// gone), try again every 20 ms for up to 1 s in all, `accel::DECIDE` let
/// go in between (other sockets' decisions need it). (The engine's open
/// waits for a busy AF_XDP queue itself, `xdp::while_busy`; this covers
/// the steering program's link too, and bounds the whole by time: a
/// count of tries, each with the open's own wait, could add up to 50 s.)
fn take_checked(
    fd: c_int,
    sa: std::net::SocketAddrV4,
    busy_wait: bool,
) -> Option<&'static accel::Accel> {
    let reuse = crate::tcpx::get_int(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT);
    if reuse.is_some_and(|v| v != 0) {
        accel::log_not(
            fd,
            "SO_REUSEPORT is set on it (the engine cannot honour it)",
        );
        return None;
    }
    let since = std::time::Instant::now();
    loop {
        // The engine opens before the lock (`accel::engine_ahead`): its
        // own wait for a busy queue, and this loop's, hold no shim lock.
        let mut ahead = accel::engine_ahead(*sa.ip(), None);
        let g = accel::DECIDE.lock().unwrap_or_else(|e| e.into_inner());
        // Bound already: the socket itself is not its competitor.
        if let Some(other) = crate::share::competitor(sa, crate::sys::inode_of(fd)) {
            crate::share::TAKEN_OFF.fetch_add(1, Ordering::Relaxed);
            accel::log_not(fd, &crate::share::why(other));
            return None;
        }
        let r = accel::accelerate(fd, None, &mut ahead);
        match &r {
            Err(accel::NotAccel::Engine(why))
                if busy_wait
                    && since.elapsed() < std::time::Duration::from_secs(1)
                    && nanowire_stack::xdp::queue_busy(why) =>
            {
                drop(g);
                drop(ahead);
                nanowire_stack::xdp::forget_failed_opens();
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            _ => return took(fd, sa, r),
        }
    }
}

/// A bound IPv4 UDP socket whose owner, a process this one was forked
/// from or forked, took it off its engine for this one (`accel::
/// inherited`): put on this process's engine ([`take_checked`];
/// `busy_wait`: an engine of its own, for the queue the owner's engine
/// leaves as it exits). `None`: it stays the kernel's (said why).
#[cold]
pub fn adopt_inherited(fd: c_int, busy_wait: bool) -> Option<&'static accel::Accel> {
    let sa = accel::local_addr(fd).filter(|sa| sa.port() != 0)?;
    take_checked(fd, sa, busy_wait)
}

/// A bound IPv4 UDP socket this process's shim did not make (inherited
/// through exec, or received): put on the engine as `bind` puts a fresh
/// one ([`take_checked`]). An unbound one becomes a candidate (its first
/// send decides). False: it stays the kernel's (said why).
#[cold]
pub fn adopt_bound(fd: c_int) -> bool {
    let Some(sa) = accel::local_addr(fd) else {
        return false;
    };
    if sa.port() == 0 {
        table::add_flags(fd, table::F_CAND);
        return false;
    }
    let on = take_checked(fd, sa, false).is_some();
    if on {
        log!(
            Level::Info,
            "fd {fd} udp {sa}: a bound socket this program did not make (inherited through exec, or received): on the xdp engine"
        );
    }
    on
}

pub fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> Option<c_int> {
    let a = match accel::lookup(fd) {
        Some(a) => a,
        None => {
            let Ok(Some(dst)) = accel::read_sockaddr(addr, len) else {
                return None;
            };
            promote_for_peer(fd, dst)?
        }
    };
    // The kernel socket under the fd is connected too.
    // SAFETY: the caller's own arguments, unchanged, to libc's function of
    // the same signature, whose contract our caller upholds (# Safety).
    let r = unsafe { real::connect(fd, addr, len) };
    if r != 0 {
        return Some(r);
    }
    let peer = accel::read_sockaddr(addr, len)
        .ok()
        .flatten()
        .filter(|p| !p.ip().is_unspecified() || p.port() != 0);
    Some(match accel::connect(a, fd, peer) {
        Ok(()) => 0,
        Err(e) => fail(e),
    })
}

/// A blocking receive on a candidate (a UDP socket that may move onto the
/// engine at any moment, e.g. when another thread sends first): never
/// sleep in the kernel, poll in 1 ms slices after the spin budget and
/// re-dispatch when the socket is accelerated. `None`: not a candidate.
/// `Some(Some(r))`: the answer; `Some(None)`: call the hook again.
pub fn candidate(fd: c_int, mut attempt: impl FnMut() -> isize) -> Option<Option<isize>> {
    let w = table::get(fd);
    if w & table::F_CAND == 0 {
        return None;
    }
    if w & table::F_WOKEN != 0 {
        table::clear_flags(fd, table::F_CAND);
        return Some(None);
    }
    let s0 = crate::signals::seq();
    // SO_RCVTIMEO on the kernel socket bounds the wait (and lets any
    // handled signal interrupt it, signal(7)).
    let tmo = if w & table::F_RCVTIMEO != 0 {
        rcvtimeo_ns(fd)
    } else {
        0
    };
    // After the spin budget: 1 ms slices in poll (never asleep in the
    // kernel's recv on a socket that may be replaced).
    let mut wait = crate::adapt::waiter(fd, w, s0, tmo, 1_000_000);
    let _g = table::spin_enter(fd);
    loop {
        if accel::by_fd(fd).is_some() {
            return Some(None);
        }
        let r = attempt();
        if r >= 0 || errno() != libc::EAGAIN {
            return Some(Some(r));
        }
        if accel::by_fd(fd).is_some() {
            return Some(None);
        }
        if !crate::spin::is_blocking(fd) {
            return Some(Some(r));
        }
        if table::get(fd) & table::F_CAND == 0 {
            // Decided against acceleration meanwhile: the normal path.
            return Some(None);
        }
        match wait.turn() {
            Turn::Closed => {
                set_errno(libc::EBADF);
                return Some(Some(-1));
            }
            Turn::Woken => {
                // shutdown(): no longer a candidate; the kernel answers.
                table::clear_flags(fd, table::F_CAND);
                return Some(None);
            }
            Turn::Interrupted => {
                set_errno(libc::EINTR);
                return Some(Some(-1));
            }
            Turn::TimedOut => {
                set_errno(libc::EAGAIN); // as the timed-out kernel call
                return Some(Some(-1));
            }
            Turn::Spin => {}
            Turn::Sleep(ns) => {
                let mut p = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one pollfd on our stack.
                unsafe { real::poll(&mut p, 1, crate::adapt::slice_ms(ns)) };
            }
        }
    }
}

/// The kernel socket's SO_RCVTIMEO in ns (0: none or unreadable).
fn rcvtimeo_ns(fd: c_int) -> u64 {
    // SAFETY: borrowed only for one getsockopt; a bad fd is an error.
    let b = unsafe { rustix::fd::BorrowedFd::borrow_raw(fd) };
    match rustix::net::sockopt::socket_timeout(b, rustix::net::sockopt::Timeout::Recv) {
        Ok(Some(d)) => u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1),
        _ => 0,
    }
}

/// Write a datagram's source to the caller's (name, namelen) as the
/// kernel's `move_addr_to_user`: nothing for a null name; an unreadable
/// length or an unwritable name is EFAULT, a negative length EINVAL.
/// The ranges [`put_name`] writes for a non-null `addr`: the length and
/// every address byte `writeback` can ask for (empty for a null `addr`,
/// or a length the shim cannot treat as a `socklen_t`).
fn name_range(addr: *mut sockaddr, alen: *mut socklen_t) -> [(usize, usize); 2] {
    if addr.is_null() || alen.is_null() || !alen.is_aligned() {
        return [(0, 0), (0, 0)];
    }
    [
        (alen as usize, std::mem::size_of::<socklen_t>()),
        (addr as usize, std::mem::size_of::<libc::sockaddr_in>()),
    ]
}

/// [`name_range`] looked up on its own (the receive's own look did not
/// hold). Out of line: inlined, the thread-local's `__tls_get_addr` would
/// be hoisted to `put_name`'s entry and paid on every receive.
#[inline(never)]
fn names_cached(r: &[(usize, usize); 2]) -> bool {
    uaccess::all_cached(r, Access::Write).still()
}

/// Write `src` to the caller's (addr, alen) as the kernel's `move_addr_to_user`.
/// `seen`: an [`uaccess::all_cached`] answer that covered [`name_range`].
fn put_name(
    src: std::net::SocketAddrV4,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
    seen: uaccess::Seen,
) -> Result<(), c_int> {
    if addr.is_null() {
        return Ok(());
    }
    if seen.still() && !alen.is_null() && alen.is_aligned() {
        // The common case: both ranges seen before (`name_range`), room for
        // the whole address: one 16-byte store and the length.
        // SAFETY: aligned, non-null and mapped writable (`seen` covered
        // `name_range`: the length and 16 bytes at `addr`).
        let l = unsafe { &mut *alen };
        if (*l as i32) >= nanowire_sockabi::addr::SOCKADDR_IN_LEN as i32 {
            let bytes = nanowire_sockabi::addr::encode_inet(src);
            // SAFETY: as above: 16 bytes at `addr`, mapped writable.
            unsafe { addr.cast::<[u8; 16]>().write_unaligned(bytes) };
            *l = nanowire_sockabi::addr::SOCKADDR_IN_LEN as socklen_t;
            return Ok(());
        }
    }
    let bytes = nanowire_sockabi::addr::encode_inet(src);
    // The common case: both seen before, one look at the thread's cache;
    // otherwise each is checked on its own, in the kernel's order.
    let r = name_range(addr, alen);
    let seen = r[0].1 != 0 && (seen.still() || names_cached(&r));
    let l = if seen {
        // SAFETY: aligned, non-null and mapped writable (`seen`).
        unsafe { &mut *alen }
    } else {
        uaccess::obj_mut(alen).ok_or(libc::EFAULT)?
    };
    let (n, full) = nanowire_sockabi::addr::writeback(*l, bytes.len())?;
    let out = if seen {
        // SAFETY: `n <= bytes.len()` bytes at `addr`, mapped writable
        // (`seen`), lent by the caller to this call.
        unsafe { std::slice::from_raw_parts_mut(addr.cast::<u8>(), n) }
    } else {
        uaccess::buf_mut(addr.cast(), n).ok_or(libc::EFAULT)?
    };
    out.copy_from_slice(&bytes[..n]);
    *l = full;
    Ok(())
}

// ----------------------------------------------------------- options

/// setsockopt on a UDP socket: `a` is its engine record of this process
/// (`None`: a candidate, or any other fd). The kernel socket under the fd
/// takes the option (and validates it); multicast membership, timestamp
/// options, SO_RCVBUF and SO_RCVTIMEO reach the engine; an option the
/// engine does not honour moves the socket to the kernel (`opts`).
pub fn setsockopt(a: Option<&'static Accel>, fd: c_int, o: Opt) -> c_int {
    let (level, name, val, len) = o.parts();
    if let Some(a) = a
        && let Some(r) = sockopt_accel(a, fd, o)
    {
        return r;
    }
    // SAFETY: the caller's own arguments, unchanged, to libc's function of
    // the same signature, whose contract the caller upholds.
    let r = unsafe { real::setsockopt(fd, level, name, val, len) };
    if r == 0 {
        sockopt_accel_after(fd, o);
        crate::opts::tcp_candidate_after(fd, level, name, val, len);
    }
    if r == 0
        && crate::tstamp::is_ts_opt(level, name)
        && let Some(a) = a
    {
        // The kernel socket under the fd took it (and validated it); the
        // engine stamps too (a candidate's options are read back when it
        // goes onto the engine).
        if let Some(st) = crate::tstamp::set(&a.ts, name, val, len) {
            accel::set_stamping(a, fd, st);
        }
    }
    if r == 0
        && level == libc::SOL_SOCKET
        && (name == libc::SO_RCVBUF || name == libc::SO_RCVBUFFORCE)
        && let Some(a) = a
        && !val.is_null()
        && len as usize >= std::mem::size_of::<c_int>()
    {
        // SAFETY: an int the kernel just read.
        let v = unsafe { std::ptr::read_unaligned(val.cast::<c_int>()) };
        accel::set_rcvbuf(a, fd, v.max(0) as usize);
    }
    if r == 0 && level == libc::SOL_SOCKET && (name == libc::SO_RCVTIMEO || name == 66) {
        if let Some(a) = a {
            a.common
                .set_rcvtimeo_ns(crate::uaccess::timeval_opt_ns(val, len));
        }
        // SO_RCVTIMEO(_NEW): a receive timeout of its own; such sockets
        // are not spun (the kernel keeps the timeout exact).
        let n = (len as usize).min(16);
        // SAFETY: the kernel just read `len` bytes from `val` successfully.
        let bytes = unsafe { std::slice::from_raw_parts(val.cast::<u8>(), n) };
        if bytes.iter().any(|b| *b != 0) {
            table::add_flags(fd, table::F_RCVTIMEO);
        } else {
            table::clear_flags(fd, table::F_RCVTIMEO);
        }
    }
    r
}

/// After the kernel socket of an accelerated UDP socket (or a candidate)
/// took an option (`crate::opts`): one the engine does not honour moves
/// the socket to the kernel; IP_TTL / IP_TOS / IP_MULTICAST_TTL reach the
/// engine's headers.
fn sockopt_accel_after(fd: c_int, o: Opt) {
    let (level, name, val, len) = o.parts();
    let w = table::get(fd);
    if w & (table::F_ACCEL | table::F_CAND) == 0 {
        return;
    }
    if let Some(why) = crate::opts::kernel_reason(crate::opts::Kind::Udp, level, name, val, len) {
        let e = errno();
        if w & table::F_CAND != 0 {
            table::clear_flags(fd, table::F_CAND);
            accel::log_not(fd, &why);
        } else {
            accel::detach(fd, &why);
        }
        set_errno(e);
        return;
    }
    if crate::opts::sets_ip_header(level, name)
        && let Some(a) = accel::lookup(fd)
    {
        // The engine's headers follow the kernel socket's values (a
        // candidate's are read when it goes onto the engine).
        accel::sync_ip_header(a, fd);
    }
}

/// setsockopt on an accelerated socket: multicast membership, which the
/// engine follows. `Some(r)`: answered.
fn sockopt_accel(a: &'static Accel, fd: c_int, o: Opt) -> Option<c_int> {
    let (level, name, val, len) = o.parts();
    if table::get(fd) & (table::F_ACCEL | table::F_CAND) == 0 {
        return None;
    }
    if level == libc::IPPROTO_IP && name == libc::IP_DROP_MEMBERSHIP {
        // The kernel socket leaves the group; the engine must stop
        // steering it too, or group traffic keeps arriving.
        // SAFETY: the caller's option, passed on unchanged.
        let r = unsafe { real::setsockopt(fd, level, name, val, len) };
        if r == 0 && len >= 8 && !val.is_null() {
            // SAFETY: at least 8 readable bytes (the kernel accepted them).
            let b = unsafe { std::slice::from_raw_parts(val.cast::<u8>(), 8) };
            let group = std::net::Ipv4Addr::new(b[0], b[1], b[2], b[3]);
            let ifaddr = std::net::Ipv4Addr::new(b[4], b[5], b[6], b[7]);
            let e = errno();
            if accel::membership(a, fd, (group, ifaddr), false).is_err() {
                accel::detach(
                    fd,
                    &format!("IP_DROP_MEMBERSHIP {group}: the engine cannot leave a group"),
                );
            }
            set_errno(e);
        }
        return Some(r);
    }
    if level == libc::IPPROTO_IP && name == libc::IP_ADD_MEMBERSHIP && !val.is_null() && len >= 8 {
        // ip_mreq / ip_mreqn: group, then interface address.
        // SAFETY: at least 8 readable bytes.
        let b = unsafe { std::slice::from_raw_parts(val.cast::<u8>(), 8) };
        let group = std::net::Ipv4Addr::new(b[0], b[1], b[2], b[3]);
        let ifaddr = std::net::Ipv4Addr::new(b[4], b[5], b[6], b[7]);
        // The application's own socket joins (the kernel answers), then
        // the engine steers the group to it.
        // SAFETY: the caller's option, unchanged, to libc's setsockopt.
        let r = unsafe { real::setsockopt(fd, level, name, val, len) };
        if r != 0 {
            return Some(r);
        }
        let e = errno();
        match accel::membership(a, fd, (group, ifaddr), true) {
            Ok(()) => {
                // Every receiver of the group on the host must get it:
                // another socket on this port means the kernel delivers.
                crate::share::check_now(fd);
            }
            Err(0) => {} // off the engine: the kernel socket alone
            Err(err) => accel::detach(
                fd,
                &format!(
                    "the engine cannot join {group}: {}",
                    std::io::Error::from_raw_os_error(err)
                ),
            ),
        }
        set_errno(e);
        return Some(0);
    }
    None
}
