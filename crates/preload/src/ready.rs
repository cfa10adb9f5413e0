//! poll/select/epoll over sets that hold xdp-engine sockets.
//!
//! The kernel answers for every fd (an accelerated fd is a real kernel
//! socket: writable, and readable when traffic took the kernel path); the
//! shim adds POLLIN/EPOLLIN for accelerated sockets whose engine queue
//! holds a datagram. Waiting spins per the profile, then sleeps in the real
//! call in slices of at most 1 ms so engine traffic is noticed.
//!
//! epoll: interests in accelerated fds are also kept here (the kernel
//! registration stays, so epoll_ctl's errors are the kernel's). Readiness
//! is level-triggered; with EPOLLET, EPOLLOUT is reported once per
//! ADD/MOD; EPOLLONESHOT disarms the interest after one report.

use crate::accel::{self, Accel};
use crate::adapt::Wait;
use crate::real;
use crate::spin::{self, now_ns};
use crate::table;
use crate::tcpx;
use libc::{c_int, epoll_event, fd_set, nfds_t, pollfd, sigset_t, timespec};
use std::sync::Mutex;
use std::sync::atomic::Ordering;

/// Longest sleep once the spin budget is spent: the sleep also wakes on
/// the engine's fds, this only bounds the cost of a wake-up that another
/// thread consumed.
const SLICE_NS: u64 = 5_000_000;

/// Where a poll or epoll wait goes after a turn that found nothing ready.
enum Then {
    /// A signal handler ran since the call began: EINTR (errno set).
    Interrupted,
    /// The caller's timeout is over.
    TimedOut,
    /// Spin on: another turn at once (the wait's clock now).
    Spun(u64),
    /// Sleep on the fds for at most this many ns.
    Sleep(u64),
}

/// The wait's next step after an empty turn (poll_mixed's and
/// epoll_mixed's): `wait` is made at the first one (the call's budget,
/// `total_ns`), `s0` the signal sequence when the call began.
#[inline(always)]
fn after_empty_turn(wait: &mut Option<Wait>, total_ns: Option<u64>, s0: u64) -> Then {
    if crate::signals::seq_all() != s0 {
        spin::set_errno(libc::EINTR);
        return Then::Interrupted;
    }
    let w = wait.get_or_insert_with(|| Wait::new(total_ns.unwrap_or(u64::MAX)));
    let spent = w.spent();
    if total_ns.is_some_and(|t| spent >= t) {
        Then::TimedOut
    } else if w.spin() {
        Then::Spun(w.now())
    } else {
        Then::Sleep(total_ns.map_or(SLICE_NS, |t| (t - spent).min(SLICE_NS)))
    }
}

/// Sleep until one of `fds` or the engine fds of accelerated sockets may
/// be ready, at most `ns`. Returns -1 (errno set) if a signal interrupted,
/// else 1 if the first of `pf` was ready when the poll returned, 0 if not.
fn sleep_on(
    mut pf: Vec<pollfd>,
    extra: impl Iterator<Item = c_int>,
    ns: u64,
    mask: *const sigset_t,
) -> c_int {
    for f in extra {
        if !pf.iter().any(|p| p.fd == f) {
            pf.push(pollfd {
                fd: f,
                events: libc::POLLIN,
                revents: 0,
            });
        }
    }
    let t = ts(ns);
    // SAFETY: our own array, a bounded timeout, the caller's mask.
    let r = unsafe { real::ppoll(pf.as_mut_ptr(), pf.len() as nfds_t, &t, mask) };
    if r < 0 {
        -1
    } else {
        c_int::from(pf.first().is_some_and(|p| p.revents != 0))
    }
}

fn ts(ns: u64) -> timespec {
    timespec {
        tv_sec: (ns / 1_000_000_000) as _,
        tv_nsec: (ns % 1_000_000_000) as _,
    }
}

/// The readiness operations of one kind of fd: a supertrait of
/// `ops::Ops`, so one per-fd table of operations serves poll, select and
/// epoll as it serves recv and send. The functions here take the lookup
/// (`ops::serving`: fd -> what serves it) from their caller. The defaults are
/// a kernel fd's: the kernel's answer stands alone.
pub trait Ready: Copy {
    /// Must a readiness call look at the fd itself, not only ask the
    /// kernel (an engine socket of this process, a UDP candidate)?
    fn polled(self, _fd: c_int) -> bool {
        false
    }
    /// The kernel socket under the fd says nothing about it (an engine TCP
    /// connection: its kernel socket is unconnected and polls HUP): hidden
    /// from the kernel's poll, answered by [`Ready::revents`] alone.
    fn hides_kernel(self) -> bool {
        false
    }
    /// The fd's poll `revents` for `events`: `revents` is the kernel's
    /// answer (0 while hidden or between kernel turns); `kernel`: the
    /// kernel was asked on this turn, at `now`; `pass`: the engines this
    /// look at the set turned already (one turn per engine per pass).
    fn revents(
        self,
        _events: i16,
        revents: i16,
        _kernel: bool,
        _now: u64,
        _pass: &mut tcpx::Pass,
    ) -> i16 {
        revents
    }
    /// Before the caller sleeps: arm the engine's wake-up (once per engine
    /// in `pass`) until the returned guard is dropped, when the sleep ends.
    /// `None`: frames are queued already; look again instead of sleeping.
    fn arm(self, _pass: &mut tcpx::Pass) -> Option<Option<nanowire_stack::xdp::Armed>> {
        Some(None)
    }
    /// Fds whose readiness wakes a sleeper waiting on the fd's engine.
    fn wait_fds(self) -> &'static [c_int] {
        &[]
    }
}

impl Ready for tcpx::TcpRef {
    fn polled(self, _fd: c_int) -> bool {
        true
    }
    fn hides_kernel(self) -> bool {
        tcpx::is_stream(self)
    }
    fn revents(
        self,
        events: i16,
        revents: i16,
        _kernel: bool,
        _now: u64,
        pass: &mut tcpx::Pass,
    ) -> i16 {
        let always = libc::POLLERR | libc::POLLHUP | libc::POLLNVAL;
        let bits = tcpx::poll_bits_in(self, pass).0 & (events | always);
        // A listener adds to the kernel's answer (its accept queue).
        if tcpx::is_stream(self) {
            bits
        } else {
            revents | bits
        }
    }
    fn arm(self, pass: &mut tcpx::Pass) -> Option<Option<nanowire_stack::xdp::Armed>> {
        tcpx::arm_in(self, pass)
    }
    fn wait_fds(self) -> &'static [c_int] {
        tcpx::Tcp::wait_fds(&self)
    }
}

/// An engine UDP socket; a forked child's copy is the kernel's alone.
impl Ready for &'static Accel {
    fn polled(self, _fd: c_int) -> bool {
        self.mine()
    }
    fn revents(
        self,
        events: i16,
        mut revents: i16,
        kernel: bool,
        now: u64,
        _pass: &mut tcpx::Pass,
    ) -> i16 {
        if !self.mine() {
            return revents;
        }
        if events & libc::POLLIN != 0 {
            if kernel {
                accel::twin_seen(self, revents & libc::POLLIN != 0, now);
            }
            if revents & libc::POLLIN == 0 && accel::readable(self) {
                revents |= libc::POLLIN;
            }
        }
        if self.ts.err_pending() {
            // Transmit stamps queued: POLLERR whatever was asked, as the
            // kernel reports a non-empty error queue.
            revents |= libc::POLLERR;
        }
        revents
    }
    fn wait_fds(self) -> &'static [c_int] {
        if self.mine() {
            Accel::wait_fds(self)
        } else {
            &[]
        }
    }
}

/// Does this pollfd array hold an fd the shim must look at itself
/// ([`Ready::polled`])?
pub fn pollfds_accel<R: Ready>(fds: *const pollfd, n: nfds_t, of: impl Fn(c_int) -> R) -> bool {
    if fds.is_null() || n == 0 || n > 65536 {
        return false;
    }
    // SAFETY: the caller's `n` pollfds.
    let s = unsafe { std::slice::from_raw_parts(fds, n as usize) };
    s.iter().any(|p| p.fd >= 0 && of(p.fd).polled(p.fd))
}

/// While a readiness call spins, the kernel is asked about the whole set
/// at most this often; accelerated sockets are looked at on every turn
/// (the rings and the socket queue are memory: no syscall).
const KERNEL_EVERY_NS: u64 = 10_000;

/// poll/ppoll with fds the shim looks at itself (`of`: what serves an
/// fd). `total_ns`: None = no timeout.
pub fn poll_mixed<R: Ready>(
    fds: *mut pollfd,
    n: nfds_t,
    total_ns: Option<u64>,
    mask: *const sigset_t,
    of: impl Fn(c_int) -> R,
) -> c_int {
    let start = now_ns();
    let s0 = crate::signals::seq_all();
    let zero = ts(0);
    let mut wait: Option<Wait> = None;
    let mut now = start;
    let mut next_kernel = 0u64;
    loop {
        let kernel = now >= next_kernel;
        if kernel {
            // Engine TCP connections are answered by the engine alone (the
            // kernel socket under such an fd is unconnected: it polls HUP):
            // hidden from the kernel for this call (poll ignores fd < 0).
            // SAFETY: the caller's array.
            let s = unsafe { std::slice::from_raw_parts_mut(fds, n as usize) };
            let mut hidden = false;
            for p in s.iter_mut() {
                if p.fd >= 0 && of(p.fd).hides_kernel() {
                    p.fd = !p.fd;
                    hidden = true;
                }
            }
            // Nothing left for the kernel to answer (every fd an engine
            // connection, hidden, or ignored) and no signal mask to apply:
            // no call (a spinning poll on engine connections made one every
            // KERNEL_EVERY_NS).
            let none = hidden && mask.is_null() && s.iter().all(|p| p.fd < 0);
            let r = if none {
                // As the kernel answers for fds it ignores.
                s.iter_mut().for_each(|p| p.revents = 0);
                0
            } else {
                // SAFETY: the caller's array, zero timeout.
                unsafe { real::ppoll(fds, n, &zero, mask) }
            };
            if hidden {
                // SAFETY: as above.
                let s = unsafe { std::slice::from_raw_parts_mut(fds, n as usize) };
                for p in s.iter_mut().filter(|p| p.fd < -1) {
                    p.fd = !p.fd;
                }
            }
            if r < 0 {
                return r;
            }
            next_kernel = now + KERNEL_EVERY_NS;
        }
        // Between kernel turns every revents is still 0: the last kernel
        // answer found nothing (or the call would have returned).
        // SAFETY: as above; the kernel filled revents.
        let s = unsafe { std::slice::from_raw_parts_mut(fds, n as usize) };
        let mut count = 0;
        let mut pass = tcpx::Pass::default();
        for p in s.iter_mut() {
            if p.fd >= 0 {
                p.revents = of(p.fd).revents(p.events, p.revents, kernel, now, &mut pass);
            }
            if p.revents != 0 {
                count += 1;
            }
        }
        if count > 0 {
            return count;
        }
        let slice = match after_empty_turn(&mut wait, total_ns, s0) {
            Then::Interrupted => return -1,
            Then::TimedOut => return 0,
            Then::Spun(t) => {
                now = t;
                continue;
            }
            Then::Sleep(slice) => slice,
        };
        // SAFETY: the caller's array (read only here).
        let s = unsafe { std::slice::from_raw_parts(fds, n as usize) };
        let pf: Vec<pollfd> = s
            .iter()
            .map(|p| pollfd {
                fd: if p.fd >= 0 && of(p.fd).hides_kernel() {
                    -1
                } else {
                    p.fd
                },
                events: p.events,
                revents: 0,
            })
            .collect();
        // Armed until dropped after the sleep.
        let mut pass = tcpx::Pass::default();
        let armed: Option<Vec<nanowire_stack::xdp::Armed>> = s
            .iter()
            .filter(|p| p.fd >= 0)
            .map(|p| of(p.fd).arm(&mut pass))
            .collect::<Option<Vec<_>>>()
            .map(|v| v.into_iter().flatten().collect());
        if armed.is_none() {
            // Frames queued for an engine socket: look again.
            now = now_ns();
            continue;
        }
        let extra: Vec<c_int> = s
            .iter()
            .filter(|p| p.fd >= 0)
            .flat_map(|p| of(p.fd).wait_fds().iter().copied())
            .collect();
        let r = sleep_on(pf, extra.into_iter(), slice, mask);
        drop(armed);
        if r < 0 {
            return -1;
        }
        now = now_ns();
        next_kernel = 0; // after a sleep, ask the kernel at once
    }
}

/// Does a select set hold an fd the shim must look at itself
/// ([`Ready::polled`])?
pub fn fdsets_accel<R: Ready>(n: c_int, sets: [*mut fd_set; 3], of: impl Fn(c_int) -> R) -> bool {
    let n = n.clamp(0, libc::FD_SETSIZE as c_int);
    (0..n).any(|fd| {
        sets.iter().any(|s| {
            // SAFETY: the caller's fd_set; fd < FD_SETSIZE.
            !s.is_null() && unsafe { libc::FD_ISSET(fd, *s) }
        }) && of(fd).polled(fd)
    })
}

/// select/pselect with fds the shim looks at itself, through `poll_mixed`.
pub fn select_mixed<R: Ready>(
    n: c_int,
    sets: [*mut fd_set; 3],
    total_ns: Option<u64>,
    mask: *const sigset_t,
    of: impl Fn(c_int) -> R,
) -> c_int {
    let n = n.clamp(0, libc::FD_SETSIZE as c_int);
    let mut pfds: Vec<pollfd> = Vec::new();
    for fd in 0..n {
        // SAFETY: the caller's fd_sets; fd < FD_SETSIZE.
        let is = |i: usize| !sets[i].is_null() && unsafe { libc::FD_ISSET(fd, sets[i]) };
        let mut ev = 0;
        if is(0) {
            ev |= libc::POLLIN;
        }
        if is(1) {
            ev |= libc::POLLOUT;
        }
        if is(2) {
            ev |= libc::POLLPRI;
        }
        if ev != 0 {
            pfds.push(pollfd {
                fd,
                events: ev,
                revents: 0,
            });
        }
    }
    let r = poll_mixed(pfds.as_mut_ptr(), pfds.len() as nfds_t, total_ns, mask, of);
    if r < 0 {
        return r;
    }
    if pfds.iter().any(|p| p.revents & libc::POLLNVAL != 0) {
        spin::set_errno(libc::EBADF);
        return -1;
    }
    for s in sets.iter().filter(|s| !s.is_null()) {
        // SAFETY: the caller's fd_set.
        unsafe { libc::FD_ZERO(*s) };
    }
    let mut count = 0;
    for p in &pfds {
        let rd = p.events & libc::POLLIN != 0
            && p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0;
        let wr = p.events & libc::POLLOUT != 0 && p.revents & (libc::POLLOUT | libc::POLLERR) != 0;
        let ex = p.events & libc::POLLPRI != 0 && p.revents & libc::POLLPRI != 0;
        for (i, on) in [rd, wr, ex].into_iter().enumerate() {
            if on {
                // SAFETY: the caller's fd_set; fd < FD_SETSIZE.
                unsafe { libc::FD_SET(p.fd, sets[i]) };
                count += 1;
            }
        }
    }
    count
}

struct Interest {
    ep: c_int,
    fd: c_int,
    events: u32,
    data: u64,
    /// `None` while the fd is a candidate, or since it fell back to the
    /// kernel; with the record's generation then (records are reused: an
    /// fd closed and opened again on the same record is another socket).
    acc: Option<(&'static Accel, u32)>,
    /// An engine TCP socket (connections are not registered in the kernel).
    tcp: Option<tcpx::TcpRef>,
    /// Bits last reported for `tcp` (EPOLLET: report only new ones).
    last: u32,
    /// Bytes `tcp` had received when last looked at (EPOLLET: an arrival
    /// is an edge even if the fd was readable already).
    last_rx: u64,
    out_done: bool,
}

static REG: Mutex<Vec<Interest>> = Mutex::new(Vec::new());

fn reg() -> std::sync::MutexGuard<'static, Vec<Interest>> {
    REG.lock().unwrap_or_else(|e| e.into_inner())
}

/// The kernel registration of an accelerated fd (or candidate) carries
/// `TAG | fd` instead of the application's `epoll_data`, so that a kernel
/// event is known to belong to that fd: the application may give the same
/// data to several fds, and events of different fds must never be merged.
/// (A non-canonical address with a 32-bit fd below it: no pointer, and no
/// small integer an application uses as data.)
const TAG: u64 = 0xfff7_4e57_0000_0000;
const TAG_MASK: u64 = 0xffff_ffff_0000_0000;

/// The event the kernel gets for `fd` in place of the application's.
pub fn tagged(fd: c_int, ev: &epoll_event) -> epoll_event {
    epoll_event {
        events: ev.events,
        u64: TAG | u64::from(fd as u32),
    }
}

/// After a successful epoll_ctl on an accelerated fd (the kernel got the
/// tagged event; `ev` is the application's).
pub fn epoll_ctl_accel(
    ep: c_int,
    op: c_int,
    fd: c_int,
    ev: Option<epoll_event>,
    acc: Option<(&'static Accel, u32)>,
) {
    let mut r = reg();
    r.retain(|i| !(i.ep == ep && i.fd == fd));
    if let (true, Some(e)) = (op == libc::EPOLL_CTL_ADD || op == libc::EPOLL_CTL_MOD, ev) {
        r.push(Interest {
            ep,
            fd,
            events: e.events,
            data: e.u64,
            acc,
            tcp: tcpx::lookup(fd),
            last: 0,
            last_rx: 0,
            out_done: false,
        });
        table::add_flags(ep, table::F_EPOLL_ACCEL);
    }
    REG_ANY.store(!r.is_empty(), Ordering::Relaxed);
}

/// epoll_ctl for an engine TCP connection: the shim alone keeps the
/// interest (the kernel socket under the fd would report HUP), with the
/// kernel's errors for a duplicate ADD or a missing MOD/DEL.
pub fn epoll_ctl_tcp(ep: c_int, op: c_int, fd: c_int, ev: *mut epoll_event) -> c_int {
    if table::class(table::get(ep)) != table::C_EPOLL {
        // Let the kernel answer EBADF/EINVAL for a non-epoll fd.
        // SAFETY: the caller's arguments.
        return unsafe { real::epoll_ctl(ep, op, fd, ev) };
    }
    let exists = reg().iter().any(|i| i.ep == ep && i.fd == fd);
    let err = match op {
        libc::EPOLL_CTL_ADD if exists => libc::EEXIST,
        libc::EPOLL_CTL_MOD | libc::EPOLL_CTL_DEL if !exists => libc::ENOENT,
        libc::EPOLL_CTL_ADD | libc::EPOLL_CTL_MOD if ev.is_null() => libc::EFAULT,
        libc::EPOLL_CTL_ADD | libc::EPOLL_CTL_MOD | libc::EPOLL_CTL_DEL => 0,
        _ => libc::EINVAL,
    };
    if err != 0 {
        spin::set_errno(err);
        return -1;
    }
    let app = if op == libc::EPOLL_CTL_DEL {
        None
    } else {
        // SAFETY: the caller's event (may be unaligned: packed on x86-64).
        Some(unsafe { std::ptr::read_unaligned(ev) })
    };
    epoll_ctl_accel(ep, op, fd, app, None);
    epoll_changed(ep);
    0
}

/// The engine connection behind `fd` became a kernel socket (TCP_REPAIR
/// hand-over): the kernel's epoll sets take over the shim's registrations
/// of it, with the application's events and data.
pub fn tcp_to_kernel(fd: c_int) {
    let mut r = reg();
    r.retain(|i| {
        if i.fd != fd || i.tcp.is_none() {
            return true;
        }
        let mut ev = epoll_event {
            events: i.events,
            u64: i.data,
        };
        // SAFETY: a live event; ep and fd are the application's.
        unsafe { real::epoll_ctl(i.ep, libc::EPOLL_CTL_ADD, fd, &mut ev) };
        false
    });
    REG_ANY.store(!r.is_empty(), Ordering::Relaxed);
}

/// Any interest registered (a cheap test for `fd_closed`).
static REG_ANY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `fd` was closed (or replaced by dup2): the kernel dropped its
/// registrations, and so does the shim.
pub fn fd_closed(fd: c_int) {
    if REG_ANY.load(Ordering::Relaxed) {
        let mut r = reg();
        r.retain(|i| i.fd != fd && i.ep != fd);
        REG_ANY.store(!r.is_empty(), Ordering::Relaxed);
    }
}

/// Is `fd` registered in an epoll set through the shim?
pub fn registered(fd: c_int) -> bool {
    REG_ANY.load(Ordering::Relaxed) && reg().iter().any(|i| i.fd == fd)
}

/// Is `fd` registered in `ep` through the shim (tagged kernel registration)?
pub fn epoll_tagged(ep: c_int, fd: c_int) -> bool {
    table::get(ep) & table::F_EPOLL_ACCEL != 0 && reg().iter().any(|i| i.ep == ep && i.fd == fd)
}

#[inline]
pub fn epoll_has_accel(ep: c_int) -> bool {
    table::get(ep) & table::F_EPOLL_ACCEL != 0
}

thread_local! {
    /// The fd of each event `synth` wrote (parallel to the output array).
    static SYNTH_FDS: std::cell::RefCell<Vec<c_int>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn synth(ep: c_int, out: &mut [epoll_event], fds: &mut Vec<c_int>) -> usize {
    let mut n = 0;
    fds.clear();
    let mut r = reg();
    for i in r.iter_mut().filter(|i| i.acc.is_none()) {
        i.acc = accel::lookup_gen(i.fd);
    }
    for i in r.iter_mut().filter(|i| i.tcp.is_none() && i.ep == ep) {
        i.tcp = tcpx::lookup(i.fd);
        if i.tcp.is_some_and(tcpx::is_stream) {
            // A candidate registered in the kernel that became an engine
            // connection: the kernel registration would report HUP.
            // SAFETY: removing our tagged registration.
            unsafe { real::epoll_ctl(ep, libc::EPOLL_CTL_DEL, i.fd, std::ptr::null_mut()) };
        }
    }
    let mut pass = tcpx::Pass::default();
    for i in r.iter_mut().filter(|i| i.ep == ep) {
        if let Some(t) = i.tcp {
            if tcpx::by_fd(i.fd).is_none_or(|b| !b.same(t)) {
                i.tcp = None;
                continue;
            }
            if n >= out.len() || i.events == 0 {
                continue;
            }
            let always = (libc::EPOLLERR | libc::EPOLLHUP) as u32;
            let (b, rx) = tcpx::poll_bits_in(t, &mut pass);
            let bits = b as u16 as u32 & (i.events | always);
            let ev = if i.events & libc::EPOLLET as u32 != 0 {
                // The kernel wakes an edge-triggered waiter on every change
                // (a bit set, data arriving while readable) and then reports
                // every ready bit it asked for.
                let woke =
                    bits & !i.last != 0 || (rx != i.last_rx && bits & libc::EPOLLIN as u32 != 0);
                i.last = bits;
                i.last_rx = rx;
                if woke { bits } else { 0 }
            } else {
                bits
            };
            report(out, &mut n, fds, i, ev);
            continue;
        }
        let Some((acc, g)) = i.acc else { continue };
        if accel::by_fd(i.fd).is_none_or(|a| !std::ptr::eq(a, acc)) || acc.common.generation() != g
        {
            i.acc = None; // taken off the engine: the kernel answers alone
            continue;
        }
        if n >= out.len() {
            break;
        }
        let mut ev = 0u32;
        if i.events & libc::EPOLLIN as u32 != 0 && accel::readable(acc) {
            ev |= libc::EPOLLIN as u32;
        }
        if acc.ts.err_pending() {
            ev |= libc::EPOLLERR as u32; // a non-empty error queue, as the kernel
        }
        if i.events & libc::EPOLLOUT as u32 != 0
            && !(i.events & libc::EPOLLET as u32 != 0 && i.out_done)
        {
            ev |= libc::EPOLLOUT as u32;
        }
        if ev & libc::EPOLLOUT as u32 != 0 {
            i.out_done = true;
        }
        report(out, &mut n, fds, i, ev);
    }
    n
}

/// Report `ev` (if any) for `i` as event `out[*n]`; a one-shot interest
/// is disarmed, as the kernel does.
fn report(out: &mut [epoll_event], n: &mut usize, fds: &mut Vec<c_int>, i: &mut Interest, ev: u32) {
    if ev == 0 {
        return;
    }
    out[*n] = epoll_event {
        events: ev,
        u64: i.data,
    };
    fds.push(i.fd);
    *n += 1;
    if i.events & libc::EPOLLONESHOT as u32 != 0 {
        i.events = 0;
    }
}

/// Kernel events `out[n..n + m]` after `n` synthesized ones (fds in
/// `fds`): tagged events get the application's data back and are merged
/// into the synthesized event of the same fd; nothing else is merged.
/// Returns the new total.
fn merge_kernel(ep: c_int, out: &mut [epoll_event], n: usize, m: usize, fds: &[c_int]) -> usize {
    let mut total = n;
    let mut r = None;
    for j in n..n + m {
        let e = out[j];
        let (ev, data) = (e.events, e.u64);
        if data & TAG_MASK != TAG {
            out[total] = e;
            total += 1;
            continue;
        }
        let fd = data as u32 as c_int;
        if let Some(k) = fds.iter().position(|&f| f == fd) {
            let cur = out[k].events;
            out[k].events = cur | ev;
            continue;
        }
        let r = r.get_or_insert_with(reg);
        let Some(i) = r.iter_mut().find(|i| i.ep == ep && i.fd == fd) else {
            continue; // a registration we no longer know: stale
        };
        if i.events == 0 {
            continue; // EPOLLONESHOT already reported by the shim
        }
        if i.events & libc::EPOLLONESHOT as u32 != 0 {
            i.events = 0;
        }
        out[total] = epoll_event {
            events: ev,
            u64: i.data,
        };
        total += 1;
    }
    total
}

thread_local! {
    /// (epoll fd, when this thread last asked the kernel about it, and
    /// whether the kernel's part of the set had nothing ready then).
    static LAST_KERNEL: std::cell::Cell<(c_int, u64, bool)> =
        const { std::cell::Cell::new((-1, 0, false)) };
}

/// The interest set of `ep` changed (epoll_ctl): the next wait asks the
/// kernel on its first turn (the "asked less than KERNEL_EVERY_NS ago"
/// shortcut holds only while nothing changed).
pub fn epoll_changed(ep: c_int) {
    LAST_KERNEL.with(|c| {
        if c.get().0 == ep {
            c.set((-1, 0, false));
        }
    });
}

/// The kernel just answered for `ep` (`kev`: its events): remember, for each
/// accelerated fd registered there, whether its kernel twin is readable.
fn twins_seen(ep: c_int, kev: &[epoll_event], now: u64) {
    let r = reg();
    for i in r
        .iter()
        .filter(|i| i.ep == ep && i.events & libc::EPOLLIN as u32 != 0)
    {
        let Some((acc, _)) = i.acc else { continue };
        let rd = kev.iter().any(|e| {
            let d = e.u64;
            d & TAG_MASK == TAG && d as u32 as c_int == i.fd && e.events & libc::EPOLLIN as u32 != 0
        });
        accel::twin_seen(acc, rd, now);
    }
}

/// epoll_wait/epoll_pwait/epoll_pwait2 on an instance with accelerated fds.
///
/// Accelerated sockets are looked at on every turn (memory only); the
/// kernel is asked on the first turn and then every KERNEL_EVERY_NS while
/// spinning, and skipped on the first turn too when accelerated events are
/// ready and this thread asked the kernel about `ep` less than
/// KERNEL_EVERY_NS ago (an event loop that comes straight back). One call
/// returns both kinds of events.
pub fn epoll_mixed(
    ep: c_int,
    evs: *mut epoll_event,
    max: c_int,
    total_ns: Option<u64>,
    mask: *const sigset_t,
) -> c_int {
    if max <= 0 || evs.is_null() {
        // SAFETY: the kernel answers EINVAL/EFAULT.
        return unsafe { real::epoll_pwait(ep, evs, max, 0, mask) };
    }
    // SAFETY: the caller's array of `max` events.
    let out = unsafe { std::slice::from_raw_parts_mut(evs, max as usize) };
    let s0 = crate::signals::seq_all();
    let mut fds = SYNTH_FDS.with(|v| std::mem::take(&mut *v.borrow_mut()));
    let mut wait: Option<Wait> = None;
    let mut now = now_ns();
    let (last_ep, last_t, last_empty) = LAST_KERNEL.with(|c| c.get());
    let recent = last_ep == ep && now.wrapping_sub(last_t) < KERNEL_EVERY_NS;
    let mut next_kernel = 0u64;
    // The kernel's part of the set was looked at in this call (asked, or
    // a sleep on `ep` came back with it not ready).
    let mut asked = false;
    let mut first = true;
    let r = loop {
        let n = synth(ep, out, &mut fds);
        let kernel = if first {
            // Nothing accelerated is ready and the kernel's part had
            // nothing either the last time (and the set has not changed
            // since): the spin asks it KERNEL_EVERY_NS after that last look
            // (never less often than while spinning), the sleep polls `ep`
            // itself (an event loop woken by its engine saves the
            // epoll_pwait(0) before each sleep).
            let idle = n == 0 && last_ep == ep && last_empty;
            if idle {
                next_kernel = last_t.saturating_add(KERNEL_EVERY_NS);
            }
            !(idle || (recent && n > 0))
        } else {
            now >= next_kernel
        };
        first = false;
        let mut m = 0;
        if kernel && n < out.len() {
            // SAFETY: the rest of the caller's array, zero timeout.
            let k = unsafe {
                real::epoll_pwait(ep, out[n..].as_mut_ptr(), (out.len() - n) as c_int, 0, mask)
            };
            if k < 0 {
                if n == 0 {
                    break k;
                }
            } else {
                m = k as usize;
            }
            asked = true;
            next_kernel = now + KERNEL_EVERY_NS;
            LAST_KERNEL.with(|c| c.set((ep, now, k == 0)));
            twins_seen(ep, &out[n..n + m], now);
        }
        let total = merge_kernel(ep, out, n, m, &fds);
        if total > 0 {
            break total as c_int;
        }
        let slice = match after_empty_turn(&mut wait, total_ns, s0) {
            Then::Interrupted => break -1,
            // Never asked the kernel yet: once before 0.
            Then::TimedOut if !asked => {
                next_kernel = 0;
                continue;
            }
            Then::TimedOut => break 0,
            Then::Spun(t) => {
                now = t;
                continue;
            }
            Then::Sleep(slice) => slice,
        };
        let tcps: Vec<tcpx::TcpRef> = reg()
            .iter()
            .filter(|i| i.ep == ep)
            .filter_map(|i| i.tcp)
            .collect();
        // One arm per engine: an event loop's listener and connections
        // share their engine's wake-up (one eventfd read at most, not
        // one per connection).
        // Armed until dropped after the sleep.
        let mut pass = tcpx::Pass::default();
        let armed: Option<Vec<nanowire_stack::xdp::Armed>> = tcps
            .iter()
            .map(|&t| tcpx::arm_in(t, &mut pass))
            .collect::<Option<Vec<_>>>()
            .map(|v| v.into_iter().flatten().collect());
        if armed.is_none() {
            // Frames queued for an engine TCP socket: look again.
            now = now_ns();
            continue;
        }
        let extra: Vec<c_int> = {
            let r = reg();
            let a: Vec<c_int> = r
                .iter()
                .filter(|i| i.ep == ep)
                .filter_map(|i| i.acc)
                .flat_map(|(a, _)| a.wait_fds().iter().copied())
                .chain(
                    r.iter()
                        .filter(|i| i.ep == ep)
                        .filter_map(|i| i.tcp)
                        .flat_map(|t| t.wait_fds().iter().copied()),
                )
                .collect();
            a
        };
        let pf = vec![pollfd {
            fd: ep,
            events: libc::POLLIN,
            revents: 0,
        }];
        let r = sleep_on(pf, extra.into_iter(), slice, mask);
        drop(armed);
        if r < 0 {
            break -1;
        }
        now = now_ns();
        if r == 0 {
            // The poll looked at `ep` itself: the kernel's part of the
            // set had nothing ready when it returned, which is what an
            // epoll_pwait(0) now would answer (woken by an engine fd:
            // one syscall per wake-up saved).
            asked = true;
            next_kernel = now + KERNEL_EVERY_NS;
            LAST_KERNEL.with(|c| c.set((ep, now, true)));
            twins_seen(ep, &[], now);
        } else {
            next_kernel = 0; // the kernel has events: ask it at once
        }
    };
    SYNTH_FDS.with(|v| *v.borrow_mut() = fds);
    r
}
