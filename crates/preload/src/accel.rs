//! UDP sockets served by the xdp engine.
//!
//! An application UDP socket (AF_INET) becomes a *candidate* at `socket()`
//! when the engine is `xdp`. It is put on the engine when its address is
//! known: at `bind`, or at `connect`/the first send of an unbound socket
//! (then on the interface the route to the peer leaves by). The engine
//! opens its own kernel socket bound to the same address (it reserves the
//! port and catches what the engine cannot: loopback, other interfaces,
//! fragments); the shim `dup3`s it onto the application's fd number, so
//! every fd-based call the shim does not serve (getsockname, getpeername,
//! getsockopt, epoll_ctl bookkeeping) is answered by a real kernel socket.
//! That kernel socket is non-blocking underneath; the application's own
//! view of O_NONBLOCK is kept here and reported by `fcntl(F_GETFL)`.
//!
//! Everything that touches the engine runs with a thread-local flag set,
//! so the engine's own libc calls (its kernel sockets, netlink, poll) go
//! straight to libc instead of into the shim.
//!
//! `Accel` records are type-stable (`nanowire_shimcore::pool`): never
//! freed, so a pointer read from the fd table stays valid even if another
//! thread closes the fd meanwhile; the record of a socket whose last fd
//! closed goes back to [`POOL`] and serves a later socket (memory is
//! bounded by the sockets open at once, not by the sockets ever made). A
//! call that moves data looks at the record under its lock only while
//! its fd still names it ([`Accel::lock_for`]): a record closed and reused
//! meanwhile is never reached through the old fd (the call then goes to
//! the kernel socket under the fd, which says EBADF for a closed one).
//!
//! fork: a child that keeps using an accelerated socket does not touch the
//! engine (its rings belong to the parent); it uses the kernel socket under
//! the fd, so it can send and receives what is not steered to the parent.

use crate::adapt::Turn;
use crate::log::log;
use crate::real;
use crate::spin::{self, errno, now_ns, set_errno};
use crate::table;
use libc::c_int;
use nanowire_options::Level;
use nanowire_probe::{self as probe, Mark};
use nanowire_shimcore::pool::{FdList, FdLists, Link, Pool, Pooled};
use nanowire_shimcore::sock::{Common, timeval_ns};
use nanowire_stack::sockaddr::sockaddr_in;
use nanowire_stack::xdp::{IdlePeek, OpenError, XdpSocket};
use nanowire_stack::{EngineKind, EngineOptions, UdpEndpoint, WaitPolicy};
use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};

pub use crate::sys::engine_call;

/// This process's pid, refreshed in the child after fork.
static PID: AtomicU32 = AtomicU32::new(0);

/// This process forked, or is a forked child (set before the fork, so the
/// child's copy has it too).
static FORKED: AtomicBool = AtomicBool::new(false);

/// Has this image forked (or been forked)? Then a socket it holds but did
/// not make may be shared with another process (`ops::adopt_unknown`).
pub fn forked() -> bool {
    FORKED.load(Ordering::Relaxed)
}

/// Mark this image as forked (`clone()` without CLONE_VM, which runs no
/// `pthread_atfork` handler: `spawn::clone_prepare`).
pub fn mark_forked() {
    FORKED.store(true, Ordering::Relaxed);
}

/// fork(), before the child exists: every accelerated socket of this
/// process and every candidate is about to be shared with the child. A
/// socket two processes share can only be served where both read it, the
/// kernel socket; but a child that never uses its copy (a worker pool, a
/// helper that execs with the socket close-on-exec) shares nothing. So
/// each engine socket gets a slot in the page shared with children
/// (`forkshare`) and stays on this engine until a child's first use of its
/// copy asks this process to take it off ([`inherited`], answered by
/// [`answer_child`]; the child waits, so none of its replies is steered
/// here). Without a slot it is taken off at once (queued datagrams kept
/// for the parent). Candidates stay kernel sockets, in both processes (an
/// unbound socket then autobinds once, to one port, as plainly).
/// (vfork/posix_spawn, which exec at once, do not run fork handlers:
/// `spawn.rs` prepares for them.)
extern "C" fn before_fork() {
    if crate::sys::in_engine() {
        return;
    }
    FORKED.store(true, Ordering::Relaxed);
    prepare_child(
        &|_| true,
        "fork(): the child shares this socket, so both use the kernel socket",
        true,
    );
}

/// A child process is about to share some of this process's fds (fork,
/// vfork, posix_spawn, exec: `inherits` says which): every accelerated
/// socket among them is taken off the engine (`why` says by what) — at
/// `fork` only once the child uses it, where the page shared with children
/// has room ([`share_at_fork`]) — and every candidate among them stays a
/// kernel socket. This process's copies of sockets its own parent shared
/// at fork are held by one more process at a fork; the program a spawn or
/// exec starts cannot ask the owner, so the owner takes them off first.
pub fn prepare_child(inherits: &dyn Fn(c_int) -> bool, why: &str, fork: bool) {
    let mut socks: Vec<(c_int, &'static Accel)> = Vec::new();
    let mut copies: Vec<(c_int, &'static Accel)> = Vec::new();
    table::each_record::<Accel>(|fd, r| {
        let a = r.record();
        if !inherits(fd) {
            return;
        }
        let list = if a.mine() && !a.detached.load(Ordering::Acquire) {
            &mut socks
        } else if a.shared_copy() {
            &mut copies
        } else {
            return;
        };
        if !list.iter().any(|&(_, b)| std::ptr::eq(a, b)) {
            list.push((fd, a));
        }
    });
    let e = errno();
    for (fd, a) in socks {
        if !(fork && share_at_fork(fd, a)) {
            detach_as(fd, why, true);
        }
    }
    for (fd, a) in copies {
        if fork {
            crate::forkshare::held_again(a.common.share());
        } else {
            // The program a spawn or exec starts inherits it: the owner
            // takes it off (nothing moves to an image about to go).
            inherited_as(fd, a, false);
        }
    }
    table::each_with(table::F_CAND, |fd| {
        if inherits(fd) {
            table::clear_flags(fd, table::F_CAND);
            log!(
                Level::Info,
                "fd {fd} udp: stays a kernel socket: a child process shares it"
            );
        }
    });
    set_errno(e);
}

/// The engine service an engine of this process was attached to is gone
/// (its XDP program and claims went with it; every frame reaches the
/// kernel again): every socket on such an engine is taken off it, its
/// queued datagrams delivered first, and its kernel socket carries on, each
/// said at the default log level. Runs on a thread of the engine's
/// (service/client.rs `Watch`), not the application's.
pub fn service_lost() {
    engine_call(|| {
        let mut socks = Vec::new();
        table::each_record::<Accel>(|fd, a| {
            if a.mine() && !a.detached.load(Ordering::Acquire) {
                socks.push(fd);
            }
        });
        for fd in socks {
            let lost = by_fd(fd).is_some_and(|a| {
                a.lock()
                    .xdp
                    .as_ref()
                    .is_some_and(|x| x.engine_handle().service_lost())
            });
            if lost {
                detach(
                    fd,
                    "the engine service is gone (its XDP program went with it)",
                );
            }
        }
    });
}

/// At fork: engine socket `a` (`fd` one of its numbers) stays on this
/// engine, shared with the child through its slot in the page shared with
/// children (said once per socket), or is off the engine already (an
/// earlier child took it). False: no slot (the caller takes it off the
/// engine now).
fn share_at_fork(fd: c_int, a: &'static Accel) -> bool {
    use nanowire_stack::xdp::forkpage::pack;
    // Under the socket's lock: an earlier child's claim may be taking it
    // off the engine right now (the owner's broker detaches under this
    // lock and then settles the slot); one already off is not shared.
    let g = a.lock();
    if a.detached.load(Ordering::Acquire) {
        return true;
    }
    let conn = (
        a.local.load(Ordering::Acquire),
        g.peer.map_or(0, pack),
        crate::sys::inode_of(fd),
    );
    let Some(h) = crate::forkshare::share(a.common.share(), conn) else {
        return false;
    };
    drop(g);
    if a.common.share() == 0 {
        a.owner_used.store(false, Ordering::Relaxed);
    }
    if a.common.swap_share(h) != h {
        log!(
            Level::Info,
            "fd {fd} udp: shared with the forked child: stays on the xdp engine until the child uses it too"
        );
    }
    true
}

/// A forked child's first use of its copy `a` (`fd` one of its numbers) of
/// a socket its parent shared at fork. On the engine service, while the
/// owner has not used it since the fork, it moves here: the owner takes
/// it off its engine (its queue requeued on the kernel socket, its claim
/// released) and this process puts the socket on its own engine (the
/// first move only; the owner's copy is a copy like a child's from then
/// on). An owner that left (exit) left it for the first holder that uses
/// it, on the service or on an engine of its own. Otherwise the owner
/// takes it off its engine and both read the kernel socket, as plainly.
/// Either way this process forgets its copy of the record under every
/// number (never acting on the owner's engine objects). `Some`: the
/// record that serves the fd here now.
#[cold]
pub fn inherited(fd: c_int, a: &'static Accel) -> Option<&'static Accel> {
    inherited_as(fd, a, true)
}

/// [`inherited`]; `may_take`: this image may take the socket onto its
/// engine (not when it is about to exec or spawn).
fn inherited_as(fd: c_int, a: &'static Accel, may_take: bool) -> Option<&'static Accel> {
    // One claim at a time in this process: a second thread finds the
    // copy forgotten (or replaced) by the first.
    static CLAIMING: Mutex<()> = Mutex::new(());
    let _g = CLAIMING.lock().unwrap_or_else(|e| e.into_inner());
    if !by_fd(fd).is_some_and(|b| std::ptr::eq(a, b)) {
        return lookup_mine(fd);
    }
    let e = errno();
    let h = a.common.share();
    // A bound socket without a peer (a server's: the kernel socket says;
    // the copy's lock may be held by a thread the fork left behind) can
    // go on an engine of this process.
    let take = may_take && spin::xdp_candidates() && peer_of(fd).is_none();
    let service = spin::STATE
        .get()
        .and_then(|s| s.cfg.as_ref())
        .is_some_and(|c| c.service);
    let mut claimed = crate::forkshare::claim_as(h, take && service, take);
    match claimed {
        crate::forkshare::Claimed::Moved { owner, .. } => {
            let b = take_here(fd, a, (owner, "moved from the xdp engine of pid"), false);
            if let Some(b) = b {
                // Before the slot names this process the owner: another
                // holder's request then finds the record (the broker).
                b.common.set_share(h);
            }
            crate::forkshare::moved_in(h, b.is_some());
            if let Some(b) = b {
                set_errno(e);
                return Some(b);
            }
            claimed = crate::forkshare::claim(h, false);
        }
        crate::forkshare::Claimed::Orphaned { owner } => {
            if !service {
                // An engine of its own: the interface is the leaving
                // owner's engine's until that process is gone.
                gone(owner);
            }
            let b = take_here(fd, a, (owner, "left to it by pid"), !service);
            if let Some(b) = b {
                b.common.set_share(h); // as for a move
            }
            let h2 = crate::forkshare::orphan_taken(h, b.is_some());
            set_errno(e);
            if let Some(b) = b {
                if h2 == 0 {
                    b.common.set_share(0);
                }
                return Some(b);
            }
            return None;
        }
        _ => {}
    }
    if matches!(claimed, crate::forkshare::Claimed::Mine) {
        set_errno(e);
        return lookup_mine(fd);
    }
    let _ = forget_copy(a);
    log!(
        Level::Info,
        "fd {fd} udp: inherited through fork(): the kernel's socket now, shared with the parent process"
    );
    set_errno(e);
    None
}

/// Puts a bound socket a forked child's owner gave up on this process's
/// engine with the checks of a bind (`ahooks::adopt_inherited`; the
/// bool: wait while the queue is busy).
pub static ADOPT_INHERITED: std::sync::OnceLock<fn(c_int, bool) -> Option<&'static Accel>> =
    std::sync::OnceLock::new();

/// Is the fd in an epoll set of this process's (`ready::registered`, set
/// by `handover::init`: ready sits above this module)?
pub static EPOLL_HOLDS: std::sync::OnceLock<fn(c_int) -> bool> = std::sync::OnceLock::new();

/// This process's own record on `fd`, if any.
fn lookup_mine(fd: c_int) -> Option<&'static Accel> {
    by_fd(fd).filter(|b| b.mine())
}

/// Forget this process's copy `a` of a socket shared at fork under every
/// number (the kernel socket answers them); returns those numbers.
fn forget_copy(a: &'static Accel) -> Vec<c_int> {
    let mut fds = Vec::new();
    table::each_record::<Accel>(|f, r| {
        if std::ptr::eq(r.record(), a) {
            fds.push(f);
        }
    });
    for &f in &fds {
        let _ = take_fd(f);
        table::clear_flags(f, table::F_ACCEL);
    }
    fds
}

/// The kernel socket's peer (a connected UDP socket), if any.
fn peer_of(fd: c_int) -> Option<SocketAddrV4> {
    // SAFETY: a zeroed sockaddr_in and its length, for getpeername.
    let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut l = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let e = errno();
    // SAFETY: our sockaddr buffer and its length.
    let r = unsafe { real::getpeername(fd, (&raw mut sa).cast(), &mut l) };
    set_errno(e);
    (r == 0).then(|| {
        SocketAddrV4::new(
            Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr)),
            u16::from_be(sa.sin_port),
        )
    })
}

/// Wait (at most 2 s) until process `pid` is gone: its fds closed, its
/// engine's hold on the interface with them.
pub fn gone(pid: u32) {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    let Some(p) = rustix::process::Pid::from_raw(pid as i32) else {
        return;
    };
    let Ok(pfd) = rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()) else {
        return; // gone already (ESRCH)
    };
    let mut fds = [PollFd::new(&pfd, PollFlags::IN)];
    let t = Timespec {
        tv_sec: 2,
        tv_nsec: 0,
    };
    let _ = poll(&mut fds, Some(&t));
}

/// Put the socket of this process's copy `a` (`fd` one of its numbers),
/// which its owner `owner` took off its engine for this process, on an
/// engine of this process's, under every number of the copy, with what
/// the kernel socket queued meanwhile first. `None`: it could not (said
/// why); the kernel socket answers the fd.
fn take_here(
    fd: c_int,
    a: &'static Accel,
    (owner, from): (u32, &str),
    busy_wait: bool,
) -> Option<&'static Accel> {
    let nonblock = a.common.nonblock();
    let fds = forget_copy(a);
    // `ahooks::adopt_inherited` (set by `handover::init`: ahooks sits
    // above this module).
    let b = ADOPT_INHERITED.get().and_then(|f| f(fd, busy_wait))?;
    b.common.set_nonblock(nonblock);
    for &f in fds.iter().filter(|&&f| f != fd) {
        if b.add_ref(fd) {
            set_fd(f, b);
            table::add_flags(f, table::F_ACCEL);
        }
    }
    {
        // What the kernel socket holds (the owner's queue, requeued, and
        // what arrived before this engine's claim) is older than anything
        // the engine will read: served first, in order.
        let mut g = b.lock();
        for _ in 0..4096 {
            let mut more = |p: &[u8], src| g.stash.push_back((p.to_vec(), src, 0));
            if !matches!(kernel_recv(fd, 0, &mut more), Some(Ok(_))) {
                break;
            }
        }
    }
    log!(
        Level::Info,
        "fd {fd} udp: inherited through fork(): on this process's xdp engine ({from} {owner})"
    );
    Some(b)
}

/// The owner's broker answers a forked child that uses the socket of
/// handle `h` (`forkshare`): moved to the child's engine if it asked
/// (`taker`: on the engine service) and this process has not used the
/// socket since the fork and no thread of it waits in it; else off this
/// engine, its queued datagrams back on the kernel socket both processes
/// read. `None`: no socket of this process has that handle.
pub fn answer_child(h: u64, taker: u32) -> Option<crate::forkshare::Answer> {
    const WHY: &str = "fork(): the forked child uses it too";
    let mut found = None;
    table::each_record::<Accel>(|fd, r| {
        let a = r.record();
        if found.is_none() && a.mine() && a.common.share() == h {
            found = Some((fd, a));
        }
    });
    let (fd, a) = found?;
    // A UDP socket moves once (its owner's use since the fork keeps it:
    // `idle_here`); a TCP connection moves up to `forkshare::MAX_MOVES`.
    if taker != 0 && crate::forkshare::moves(h) == 0 && idle_here(a) {
        match take_off(fd, None, true, After::Disown) {
            Some(0) => {
                if crate::forkshare::offer_moved(h, &[], taker) {
                    log!(
                        Level::Info,
                        "fd {fd} udp: moved to the xdp engine of pid {taker} (fork(): the forked child uses it); this process's copy is served by it"
                    );
                    return Some(crate::forkshare::Answer::Moved);
                }
                // Not taken: the kernel's, for every holder.
                let _ = forget_copy(a);
                log!(
                    Level::Warn,
                    "fd {fd} udp: taken off the xdp engine (kernel socket): {WHY}, and its engine could not take it"
                );
                return Some(crate::forkshare::Answer::Decided);
            }
            Some(_) => {
                // Datagrams this process could not requeue: it serves
                // them (its record stays, in kernel mode).
                log!(
                    Level::Warn,
                    "fd {fd} udp: taken off the xdp engine (kernel socket, spin engine): {WHY}"
                );
                return Some(crate::forkshare::Answer::Decided);
            }
            None => {}
        }
    }
    detach_as(fd, WHY, true);
    Some(crate::forkshare::Answer::Decided)
}

/// No call of this process's has reached socket `a` since its first fork
/// and none waits in it now (a thread inside a receive, asleep in one, an
/// epoll set holding it): moving it away changes nothing it can see.
fn idle_here(a: &'static Accel) -> bool {
    if a.owner_used.load(Ordering::Acquire) || a.sleepers.load(Ordering::Acquire) != 0 {
        return false;
    }
    let mut busy = false;
    table::each_record::<Accel>(|f, r| {
        if std::ptr::eq(r.record(), a)
            && (nanowire_shimcore::fdtable::spinners(table::get(f)) != 0
                || a.st.inside()
                || EPOLL_HOLDS.get().is_some_and(|held| held(f)))
        {
            busy = true;
        }
    });
    !busy
}

/// This process's engine sockets a forked child holds a copy of (their
/// slot says so) leave the engine before this image goes (`why`: exit or
/// exec), as the kernel socket outlives a closing process while another
/// holds it: what the engine had queued goes onto it for the child. At
/// exit the first holder to use it then takes it onto its engine
/// (`forkshare::orphan`); at exec (the new image may take it itself) and
/// where the queue could not be requeued, the child's use finds the
/// kernel's socket at once (no owner left to ask).
pub fn owner_leaving(why: &str, exiting: bool) {
    let mut socks: Vec<(c_int, &'static Accel)> = Vec::new();
    table::each_record::<Accel>(|fd, r| {
        let a = r.record();
        if a.mine()
            && !a.detached.load(Ordering::Acquire)
            && crate::forkshare::holders(a.common.share()).is_some_and(|n| n > 0)
            && !socks.iter().any(|&(_, b)| std::ptr::eq(a, b))
        {
            socks.push((fd, a));
        }
    });
    let e = errno();
    for (fd, a) in socks {
        let h = a.common.share();
        if exiting && crate::forkshare::decide(h) {
            if !a.mine() || a.detached.load(Ordering::Acquire) {
                // Moved or taken off meanwhile (the broker): not this
                // process's to decide any more.
                crate::forkshare::undecide(h);
                continue;
            }
            leave_to_holders(fd, h, why);
        } else {
            detach_as(fd, why, true);
        }
    }
    set_errno(e);
}

/// The owner, holding the decision on socket `fd` (handle `h`), lets go
/// of it while forked children hold copies (`why`: its exit, or its last
/// close on the engine service): off its engine with its queue on the
/// kernel socket, left to the first holder that uses it, which takes it
/// onto its engine (`forkshare::orphan`); where the queue could not all
/// be requeued, the kernel's for every holder.
fn leave_to_holders(fd: c_int, h: u64, why: &str) {
    match take_off(fd, None, true, After::Keep) {
        Some(0) => {
            crate::forkshare::orphan(h);
            log!(
                Level::Info,
                "fd {fd} udp: off this process's xdp engine: {why}; the first holder to use it takes it onto its engine"
            );
        }
        kept => {
            crate::forkshare::settle(h);
            log!(
                Level::Warn,
                "fd {fd} udp: taken off the xdp engine (kernel socket, spin engine): {why}{}",
                match kept {
                    Some(n) if n > 0 => format!(" ({n} queued datagrams are delivered first)"),
                    _ => String::new(),
                }
            );
        }
    }
}

/// Is socket `a` on an engine attached to the engine service?
fn on_service(a: &Accel) -> bool {
    a.lock()
        .xdp
        .as_ref()
        .is_some_and(|x| x.engine_handle().on_service())
}

/// This process's copies of sockets a parent shared at fork (their
/// handles, once each): an exiting child lets go of them.
pub fn shared_copies() -> Vec<u64> {
    let mut held = Vec::new();
    table::each_record::<Accel>(|_, r| {
        if r.shared_copy() && !held.contains(&r.common.share()) {
            held.push(r.common.share());
        }
    });
    held
}

/// exec is about to close the fds `closes` says: this process's copies of
/// sockets a parent shared at fork among them are no longer held by it.
pub fn held_until_exec(closes: &dyn Fn(c_int) -> bool) {
    let mut copies = Vec::new();
    table::each_record::<Accel>(|fd, r| {
        if r.shared_copy() {
            copies.push((fd, r.common.share()));
        }
    });
    crate::forkshare::held_until_exec(&copies, closes);
}

extern "C" fn after_fork_child() {
    PID.store(std::process::id(), Ordering::Relaxed);
    crate::owner::after_fork_child();
    crate::uaccess::after_fork_child();
}

pub fn init() {
    PID.store(std::process::id(), Ordering::Relaxed);
    crate::owner::init();
    // SAFETY: registering plain extern "C" handlers that take no locks the
    // forking thread could hold (before_fork takes socket locks the way any
    // call on the socket does, before the fork).
    unsafe { libc::pthread_atfork(Some(before_fork), None, Some(after_fork_child)) };
}

/// The record's lock held.
type Guard<'a> = crate::owner::Guard<'a, St>;

pub struct St {
    pub xdp: Option<XdpSocket>,
    /// Datagrams taken off the engine but not consumed (MSG_PEEK, FIONREAD,
    /// readiness checks: at most one), or still queued when the socket was
    /// taken off the engine (`detach`): served before the kernel socket.
    /// (payload, source, receive stamp: see `tstamp`).
    stash: VecDeque<(Vec<u8>, SocketAddrV4, u64)>,
    peer: Option<SocketAddrV4>,
}

/// One UDP socket's record (type-stable, reused: see the module doc).
/// Every field a later incarnation sets is an atomic or behind the lock:
/// a thread still holding an earlier incarnation may read it.
pub struct Accel {
    /// Owned by the thread that uses the socket, which then takes it with
    /// no atomic read-modify-write (`crate::owner`; issue 22).
    st: crate::owner::Lock<St>,
    /// The application's blocking mode and timeouts, shutdown(SHUT_RD),
    /// the fds referring to it (dup), the process that made it and the
    /// record's generation (its incarnation).
    pub common: Common,
    /// Its place in [`POOL`].
    link: Link,
    /// What a sleeping receive polls: the engine's AF_XDP sockets, the
    /// socket's wake-up eventfd and (last) the kernel socket under the fd
    /// (an interned list: [`WAIT_LISTS`]).
    wait_fds: FdList,
    /// Taken off the engine (`detach`): the engine's fds are gone.
    detached: AtomicBool,
    /// When a readiness call last saw the kernel twin empty (ns, 0 = not
    /// known): see [`twin_maybe`].
    twin_empty_at: AtomicU64,
    /// Private epoll fd for sleeping receivers (-1: not made yet, -2: could
    /// not be made); see `sleep`.
    sleep_ep: AtomicI32,
    /// Threads sleeping in a receive on this socket.
    sleepers: AtomicU32,
    /// The local address once known (1 << 48 | ip << 16 | port; 0 = not yet).
    local: AtomicU64,
    /// The fd number the engine adopted as the kernel twin: it must stay
    /// open while the engine socket lives (see `dispatch::close`).
    adopted: AtomicI32,
    /// SO_TIMESTAMP* state (crates/preload/src/tstamp.rs).
    pub ts: crate::tstamp::Ts,
    /// The owner used it (a call reached it) since it was first shared at
    /// fork: a child's use then takes it to the kernel, never away from
    /// this process ([`answer_child`]).
    owner_used: AtomicBool,
}

impl Accel {
    /// The socket's state, whichever incarnation the record is in: for
    /// what does not move data between the application and a socket (or
    /// for the incarnation's own start and end).
    #[inline]
    fn lock(&self) -> Guard<'_> {
        self.st.lock()
    }
    /// The socket's state if `fd` still names this record (then the
    /// record is in the incarnation `fd` names: a slot is cleared before
    /// its incarnation ends, which happens under this lock). `None`: the
    /// fd was closed (maybe reused) or taken off the record since the
    /// caller looked it up; the kernel socket under the fd answers.
    /// (Two loads and a compare under the lock the call takes anyway.)
    #[inline(always)]
    /// A send found the engine's ring full: EAGAIN for a call that does
    /// not wait; else the lock is given back for one spin (the engine's
    /// other users go on) and taken again (`Ok(None)`: the fd left the
    /// engine meanwhile, the kernel socket sends).
    fn after_full_ring<'a>(
        &'a self,
        fd: c_int,
        g: Guard<'a>,
        dontwait: bool,
    ) -> Result<Option<Guard<'a>>, c_int> {
        if dontwait {
            return Err(libc::EAGAIN);
        }
        drop(g);
        core::hint::spin_loop();
        Ok(self.lock_for(fd))
    }
    /// (Also `None` for a signal handler's call on the socket its thread
    /// was inside of when interrupted: the kernel socket answers it,
    /// where the std mutex this lock replaced waited forever.)
    fn lock_for(&self, fd: c_int) -> Option<Guard<'_>> {
        let g = self.st.lock_unless_nested()?;
        if by_fd(fd).is_some_and(|b| std::ptr::eq(self, b)) {
            Some(g)
        } else {
            None
        }
    }
    /// A receive's close guard on `fd` (`close` waits for it: see
    /// `fdlife::retire`): the owner thread's is an entry in the record
    /// lock's outer section (plain stores, `nanowire_owner::lock`),
    /// anyone else's the fd's shared count (a SeqCst add and sub).
    #[inline(always)]
    fn close_guard(&self, fd: c_int) -> CloseGuard<'_> {
        match self.st.enter_owned(fd as u32) {
            Some(i) => (Some(i), None),
            None => (None, Some(table::spin_enter(fd))),
        }
    }
    /// The fd number the engine adopted as the kernel twin.
    #[inline]
    pub fn adopted(&self) -> c_int {
        self.adopted.load(Ordering::Relaxed)
    }
    /// Usable by this process (not a forked child's inherited copy).
    #[inline(always)]
    pub fn mine(&self) -> bool {
        self.common.mine(PID.load(Ordering::Relaxed))
    }
    /// A forked child's copy of a socket its parent keeps on its engine
    /// until a child uses it ([`inherited`] claims it).
    #[inline(always)]
    pub fn shared_copy(&self) -> bool {
        self.common.share() != 0 && !self.mine()
    }
    /// A call of the owner's reached this socket, which a forked child
    /// holds a copy of (`share() != 0`): see `owner_used`.
    #[cold]
    pub fn owner_uses(&self) {
        if !self.owner_used.load(Ordering::Relaxed) {
            self.owner_used.store(true, Ordering::Relaxed);
        }
    }
    /// The fds a sleeping wait on this socket polls.
    pub fn wait_fds(&self) -> &'static [c_int] {
        let all = self.wait_fds.get();
        if self.detached.load(Ordering::Acquire) {
            &all[all.len().saturating_sub(1)..]
        } else {
            all
        }
    }
    /// One more fd refers to the incarnation `fd` names (dup of `fd`):
    /// `false` if it has none any more (`fd` closed meanwhile).
    pub fn add_ref(&self, fd: c_int) -> bool {
        let g = self.common.generation();
        by_fd(fd).is_some_and(|b| std::ptr::eq(self, b)) && self.common.add_ref_if(g)
    }
    /// A record for the pool, before its first incarnation.
    fn blank(link: Link) -> Accel {
        Accel {
            st: crate::owner::Lock::new(St {
                xdp: None,
                stash: VecDeque::new(),
                peer: None,
            }),
            common: Common::new(0, false, 0),
            link,
            wait_fds: FdList::empty(),
            detached: AtomicBool::new(false),
            twin_empty_at: AtomicU64::new(0),
            sleep_ep: AtomicI32::new(-1),
            sleepers: AtomicU32::new(0),
            local: AtomicU64::new(0),
            adopted: AtomicI32::new(-1),
            ts: Default::default(),
            owner_used: AtomicBool::new(false),
        }
    }
}

// SAFETY: `link` is the field `blank` fills with the pool's link.
unsafe impl Pooled for Accel {
    fn link(&self) -> &Link {
        &self.link
    }
}

/// The UDP records: reused, never freed.
static POOL: Pool<Accel> = Pool::new();

/// The wait-fd lists of the UDP records (each socket has its own wake-up
/// eventfd, so lists repeat when fd numbers do: a program that closes and
/// opens sockets reuses the numbers).
static WAIT_LISTS: FdLists<1024> = FdLists::new();

// SAFETY: the only type of the shim with kind Udp; aligned to 8 (atomics).
unsafe impl table::Record for Accel {
    const KIND: table::Kind = table::Kind::Udp;
    fn common(&self) -> &Common {
        &self.common
    }
}

/// The record behind `fd`, whichever process made it (after fork, a
/// child sees its parent's records: see [`inherited`]).
#[inline(always)]
pub fn by_fd(fd: c_int) -> Option<&'static Accel> {
    table::record_as::<Accel>(fd)
}

pub fn set_fd(fd: c_int, a: &'static Accel) {
    table::set_record(fd, a);
}

pub fn take_fd(fd: c_int) -> Option<&'static Accel> {
    table::take_record::<Accel>(fd).map(|r| r.record())
}

/// The engine socket behind `fd` if this process may use it.
#[inline(always)]
pub fn lookup(fd: c_int) -> Option<&'static Accel> {
    let a = by_fd(fd)?;
    if a.mine() {
        if a.common.share() != 0 {
            a.owner_uses();
        }
        Some(a)
    } else if a.common.share() != 0 {
        inherited(fd, a)
    } else {
        None
    }
}

/// [`lookup`] with the generation the record has while `fd` names it
/// (for holders that keep the record across calls: epoll interests).
pub fn lookup_gen(fd: c_int) -> Option<(&'static Accel, u32)> {
    let r = table::record_ref::<Accel>(fd)?;
    if r.shared_copy() {
        // Moved here: this process's record now.
        return inherited(fd, r.record()).and_then(|_| lookup_gen(fd));
    }
    if r.common.share() != 0 && r.mine() {
        r.record().owner_uses();
    }
    r.mine().then(|| (r.record(), r.generation()))
}

/// `fd` is a forked child's inherited accelerated fd: say so, once.
pub fn note_inherited(fd: c_int) {
    if table::first_time(fd, table::F_INHERIT_LOGGED) {
        log!(
            Level::Info,
            "fd {fd} udp: kernel socket only in this forked child (the xdp engine's rings stay with the parent)"
        );
    }
}

/// Read an AF_INET sockaddr; `Err(errno)` as the kernel would answer.
pub fn read_sockaddr(
    addr: *const libc::sockaddr,
    len: libc::socklen_t,
) -> Result<Option<SocketAddrV4>, c_int> {
    read_sockaddr_seen(addr, len, false)
}

/// [`read_sockaddr`]; `seen`: the caller found `len` bytes at `addr`
/// mapped readable already (`uaccess::all_cached`).
#[inline]
pub fn read_sockaddr_seen(
    addr: *const libc::sockaddr,
    len: libc::socklen_t,
    seen: bool,
) -> Result<Option<SocketAddrV4>, c_int> {
    if addr.is_null() {
        return Ok(None);
    }
    // move_addr_to_kernel: the length, then the copy (EFAULT).
    let len = nanowire_sockabi::addr::check_len(len)?;
    let bytes = if seen {
        // SAFETY: `len` (at most the caller's length) bytes at `addr`,
        // mapped readable (`seen`).
        unsafe { std::slice::from_raw_parts(addr.cast::<u8>(), len) }
    } else {
        crate::uaccess::buf(addr.cast(), len).ok_or(libc::EFAULT)?
    };
    nanowire_sockabi::addr::inet_addr(bytes).map(Some)
}

/// Write `src` to a caller's (addr, len) pair the way the kernel does.
pub fn write_sockaddr(src: SocketAddrV4, addr: *mut libc::sockaddr, len: *mut libc::socklen_t) {
    if addr.is_null() || len.is_null() {
        return;
    }
    let sin = sockaddr_in(src);
    let full = std::mem::size_of::<libc::sockaddr_in>();
    // SAFETY: the caller gave a buffer of *len bytes; we copy at most that.
    unsafe {
        let n = (*len as usize).min(full);
        std::ptr::copy_nonoverlapping((&raw const sin).cast::<u8>(), addr.cast::<u8>(), n);
        *len = full as libc::socklen_t;
    }
}

/// Why a socket was not put on the engine.
pub enum NotAccel {
    /// Leave the socket to the kernel (spin engine) and say why (warn).
    Engine(String),
    /// The socket cannot use the engine by its nature (loopback): info.
    Inapplicable(String),
    /// The address itself is bad or busy: let the real call answer.
    Socket,
}

/// The options a UDP socket's engine is opened with (`iface`: where an
/// unbound socket's traffic leaves, unless the options table names one).
fn engine_opts(iface: Option<String>) -> EngineOptions {
    let cfg = spin::STATE.get().and_then(|s| s.cfg.as_ref());
    let mut opts = EngineOptions::new(EngineKind::Xdp);
    opts.wait = WaitPolicy::Spin;
    opts.fallback = false;
    opts.ring_depth = cfg.map_or(16384, |c| c.ring_depth);
    opts.iface = cfg.and_then(|c| c.iface.clone()).or(iface);
    opts
}

/// The engine a decision will use, opened before [`DECIDE`] is taken
/// ([`engine_ahead`]): kept open while this lives, or why it could not be.
pub struct Ahead(Option<Result<nanowire_stack::xdp::EngineHold, String>>);

impl Ahead {
    /// Nothing opened ahead: [`accelerate`] opens the engine itself.
    pub const NONE: Ahead = Ahead(None);

    /// Why the open failed, once (the decision says it).
    fn failed(&mut self) -> Option<String> {
        match self.0.take_if(|r| r.is_err()) {
            Some(Err(why)) => Some(why),
            _ => None,
        }
    }
}

impl Drop for Ahead {
    /// A failed open that no decision said (the bind failed, another
    /// process's socket holds the port, another thread decided first): the
    /// engine's registry forgets it, so that the next socket's open tries
    /// again and says why at the default level (a remembered failure is
    /// said at info only, as said before).
    fn drop(&mut self) {
        if self.failed().is_some() {
            nanowire_stack::xdp::forget_failed_opens();
        }
    }
}

/// Open the engine a socket bound to `ip` (`iface`: as [`accelerate`]'s)
/// would go onto, before [`DECIDE`] is taken: the open (netlink, the
/// program's attach, an AF_XDP bind that may wait up to a second for a
/// queue a just-exited process leaves) runs with no shim lock held, and
/// the decision under the lock ([`accelerate`] with the result) finds the
/// engine open while the result lives, or says why it could not be. A
/// loopback address opens nothing (the decision says why).
pub fn engine_ahead(ip: Ipv4Addr, iface: Option<String>) -> Ahead {
    if ip.is_loopback() {
        return Ahead::NONE;
    }
    Ahead(Some(
        engine_call(|| XdpSocket::engine_ahead(ip, &engine_opts(iface))).map_err(|e| match e {
            OpenError::Engine(why) => why,
            OpenError::Socket(e) => e.to_string(),
        }),
    ))
}

/// Put `fd` on the xdp engine bound to `bind` (`iface`: where an unbound
/// socket's traffic leaves). On success the fd number now names the
/// engine's kernel socket. `ahead`: the engine opened before [`DECIDE`]
/// was taken ([`engine_ahead`]; [`Ahead::NONE`]: opened here).
pub fn accelerate(
    fd: c_int,
    iface: Option<String>,
    ahead: &mut Ahead,
) -> Result<&'static Accel, NotAccel> {
    let Some(local) = local_addr(fd) else {
        return Err(NotAccel::Socket);
    };
    if local.ip().is_loopback() {
        return Err(NotAccel::Inapplicable(
            "loopback address (no XDP-capable interface)".into(),
        ));
    }
    if let Some(why) = ahead.failed() {
        return Err(NotAccel::Engine(why));
    }
    let opts = engine_opts(iface);
    // SAFETY: the fd is only borrowed for fcntl calls.
    let b = unsafe { rustix::fd::BorrowedFd::borrow_raw(fd) };
    let fl = rustix::fs::fcntl_getfl(b).unwrap_or(rustix::fs::OFlags::empty());
    let nonblock = fl.contains(rustix::fs::OFlags::NONBLOCK);
    // The application's own socket becomes the engine's kernel twin: every
    // option it set before (bind, connect, first send) stays, and the
    // socket costs one more fd (its wake-up eventfd). Underneath it is
    // non-blocking; the application's mode is kept here.
    let _ = rustix::fs::fcntl_setfl(b, fl | rustix::fs::OFlags::NONBLOCK);
    let mut xs = match engine_call(|| XdpSocket::adopt(fd, &opts)) {
        Ok(x) => x,
        Err(e) => {
            let _ = rustix::fs::fcntl_setfl(b, fl);
            return Err(match e {
                OpenError::Engine(why) => NotAccel::Engine(why),
                OpenError::Socket(_) => NotAccel::Socket,
            });
        }
    };
    let mut tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 0,
    };
    let mut l = std::mem::size_of::<libc::timeval>() as libc::socklen_t;
    let mut rcvbuf: c_int = 0;
    let mut rl = std::mem::size_of::<c_int>() as libc::socklen_t;
    let e = errno();
    // SAFETY: two getsockopt calls into local buffers of the right sizes.
    let (tv_ok, rb_ok) = unsafe {
        (
            real::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&raw mut tv).cast(),
                &mut l,
            ) == 0,
            real::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&raw mut rcvbuf).cast(),
                &mut rl,
            ) == 0,
        )
    };
    set_errno(e);
    let rcvtimeo_ns = if tv_ok {
        timeval_ns(tv.tv_sec, tv.tv_usec)
    } else {
        0
    };
    if rb_ok && rcvbuf > 0 && rcvbuf as u64 != 2 * rmem_default() {
        // A receive buffer the application (or the profile) chose sizes the
        // engine queue too; the default leaves the engine's (its ring).
        // SO_RCVBUF reads back doubled; the engine takes the value set.
        engine_call(|| xs.set_rcvbuf(rcvbuf as usize / 2));
    }
    let mut wait_fds = xs.poll_fds();
    wait_fds.retain(|&f| f != fd);
    wait_fds.push(fd);
    let a = record(fd, xs, wait_fds, nonblock, rcvtimeo_ns);
    if let Some(st) = crate::tstamp::adopt(&a.ts, fd) {
        // Before any fd names the record: its first datagram is stamped.
        stamp(&mut a.lock(), st);
    }
    set_fd(fd, a);
    table::add_flags(fd, table::F_ACCEL);
    table::clear_flags(fd, table::F_CAND);
    if crate::log::enabled(Level::Info) {
        let g = a.lock();
        if let Some(x) = &g.xdp {
            let e = x.engine_handle();
            log!(
                Level::Info,
                "fd {fd} udp {local}: xdp (interface {}, {} XDP, {} AF_XDP, ring {})",
                e.iface().name,
                e.attach_mode().as_str(),
                e.bind_mode().as_str(),
                e.ring_depth()
            );
        }
    }
    Ok(a)
}

/// The record of a new engine socket on `fd`: a free one from [`POOL`]
/// (its next incarnation) or a new one, set up before any fd names it.
fn record(
    fd: c_int,
    xs: XdpSocket,
    wait_fds: Vec<c_int>,
    nonblock: bool,
    rcvtimeo_ns: u64,
) -> &'static Accel {
    let (a, _) = POOL.take(Accel::blank);
    // No fd names the record yet: the only readers are threads holding an
    // ended incarnation, which find their fd no longer naming it
    // (`lock_for`) before they move any data.
    a.common
        .reset(PID.load(Ordering::Relaxed), nonblock, rcvtimeo_ns);
    a.ts.reset();
    a.detached.store(false, Ordering::Relaxed);
    a.twin_empty_at.store(0, Ordering::Relaxed);
    a.sleep_ep.store(-1, Ordering::Relaxed);
    a.local.store(0, Ordering::Relaxed);
    a.adopted.store(fd, Ordering::Relaxed);
    a.owner_used.store(false, Ordering::Relaxed);
    if a.wait_fds() != &wait_fds[..] {
        a.wait_fds.set(WAIT_LISTS.intern(wait_fds));
    }
    let mut g = a.lock();
    // A new socket: the thread that uses it may own its lock again.
    g.unshare();
    g.xdp = Some(xs);
    g.stash.clear();
    g.peer = None;
    drop(g);
    a
}

/// The incarnation of `a` whose last fd went (closed, or taken off the
/// record): its engine socket closes and the record goes back to
/// [`POOL`]. The generation moves on under the record's lock.
fn recycle(a: &'static Accel) {
    let (x, ended) = {
        let mut g = a.lock();
        let x = g.xdp.take();
        // A detached socket's leftovers go with it (plainly, the kernel
        // socket's queue goes with its last fd too).
        g.stash = VecDeque::new();
        g.peer = None;
        (x, a.common.end(a.common.generation()))
    };
    engine_call(|| drop(x));
    let ep = a.sleep_ep.swap(-2, Ordering::AcqRel);
    if ep >= 0 {
        // SAFETY: our own epoll fd, unpublished now (a sleeper still in
        // it returns within 5 ms).
        drop(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(ep) });
    }
    if ended {
        POOL.put(a);
    }
}

/// net.core.rmem_default (what SO_RCVBUF is when nobody set it, halved).
fn rmem_default() -> u64 {
    static V: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *V.get_or_init(|| {
        engine_call(|| std::fs::read_to_string("/proc/sys/net/core/rmem_default"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(212_992)
    })
}

/// The local IPv4 address of `fd` (getsockname; raw libc, no hooks).
pub fn local_addr(fd: c_int) -> Option<SocketAddrV4> {
    // SAFETY: an all-zero sockaddr_in is a valid out-buffer.
    let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut l = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let e = errno();
    // SAFETY: our sockaddr_in and its length.
    let r = unsafe { real::getsockname(fd, (&raw mut sa).cast(), &mut l) };
    set_errno(e);
    (r == 0 && sa.sin_family == libc::AF_INET as libc::sa_family_t).then(|| {
        SocketAddrV4::new(
            Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr)),
            u16::from_be(sa.sin_port),
        )
    })
}

/// This process's sockets on the engine, with their local addresses.
pub fn live_sockets() -> Vec<(c_int, SocketAddrV4)> {
    let mut v = Vec::new();
    table::each_record::<Accel>(|fd, a| {
        if !a.mine() || a.detached.load(Ordering::Acquire) {
            return;
        }
        let w = a.local.load(Ordering::Relaxed);
        if w != 0 {
            v.push((
                fd,
                SocketAddrV4::new(Ipv4Addr::from_bits((w >> 16) as u32), w as u16),
            ));
        } else if let Some(l) = local_addr(fd) {
            // Cached: a bound UDP socket's address does not change (connect
            // keeps the port, and the checks look at the port first).
            let packed = (1u64 << 48) | (u64::from(l.ip().to_bits()) << 16) | u64::from(l.port());
            a.local.store(packed, Ordering::Relaxed);
            v.push((fd, l));
        }
    });
    v
}

/// Decide for a candidate that is about to talk to `dst` without a bind.
pub fn accelerate_for_peer(fd: c_int, dst: SocketAddrV4) -> Option<&'static Accel> {
    if table::get(fd) & table::F_CAND == 0 {
        return lookup(fd);
    }
    // The route (netlink) and the engine's open before the lock: no shim
    // lock is held across netlink or an open's wait (docs/architecture.md,
    // "Locks"). A thread that loses the race below looked them up for
    // nothing, once.
    let route = engine_call(|| {
        let r = nanowire_stack::xdp::host::route_get(*dst.ip())
            .map_err(|e| NotAccel::Engine(format!("no route to {}: {e}", dst.ip())))?;
        let src = r.prefsrc.ok_or_else(|| {
            NotAccel::Engine(format!("route to {} has no source address", dst.ip()))
        })?;
        if src.is_loopback() || dst.ip().is_loopback() {
            return Err(NotAccel::Inapplicable(format!(
                "no route through an XDP-capable interface (to {} via loopback)",
                dst.ip()
            )));
        }
        nanowire_stack::xdp::host::iface_for_addr(src)
            .map(|i| (src, i))
            .map_err(NotAccel::Engine)
    });
    let mut ahead = match &route {
        Ok((src, i)) => engine_ahead(*src, Some(i.clone())),
        Err(_) => Ahead::NONE,
    };
    let _g = DECIDE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(a) = lookup(fd) {
        return Some(a); // another thread won the race
    }
    if table::get(fd) & table::F_CAND == 0 {
        return None;
    }
    let res = route.and_then(|(_, ifname)| {
        // The kernel's autobind: 0.0.0.0 and an ephemeral port, on the
        // application's own socket, which the engine then adopts.
        let sa = sockaddr_in(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));
        let e = errno();
        // SAFETY: our sockaddr_in and its length.
        let r = unsafe {
            real::bind(
                fd,
                (&raw const sa).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        set_errno(e);
        if r != 0 {
            return Err(NotAccel::Engine(format!(
                "autobind failed: {}",
                std::io::Error::from_raw_os_error(errno())
            )));
        }
        accelerate(fd, Some(ifname), &mut ahead)
    });
    match res {
        Ok(a) => Some(a),
        Err(NotAccel::Engine(why)) => {
            table::clear_flags(fd, table::F_CAND);
            log_not(fd, &why);
            None
        }
        Err(NotAccel::Inapplicable(why)) => {
            table::clear_flags(fd, table::F_CAND);
            log_not_applicable(fd, &why);
            None
        }
        Err(NotAccel::Socket) => {
            table::clear_flags(fd, table::F_CAND);
            log_not(fd, "the engine could not take this address (in use?)");
            None
        }
    }
}

/// Serialises acceleration decisions (two threads may send first at once).
/// The candidate flag is cleared only after the engine socket is in the
/// table, so a thread waiting on a candidate never falls into a kernel
/// wait on the socket being replaced.
pub static DECIDE: Mutex<()> = Mutex::new(());

/// A socket meant for the xdp engine does not get it: one line at the
/// default level (warn; `NANOWIRE_LOG=quiet` silences it).
pub fn log_not(fd: c_int, why: &str) {
    // A failed engine open the engine remembered: said at the first.
    if why.contains(nanowire_stack::xdp::OPEN_REMEMBERED) {
        return log_not_applicable(fd, why);
    }
    log!(
        Level::Warn,
        "fd {fd} udp: spin (kernel socket); xdp not used: {why}"
    );
}

/// A socket that cannot use the xdp engine by its nature (loopback): info.
pub fn log_not_applicable(fd: c_int, why: &str) {
    log!(
        Level::Info,
        "fd {fd} udp: spin (kernel socket); xdp not used: {why}"
    );
}

/// [`Accel::close_guard`]: one of the two, held.
type CloseGuard<'a> = (
    Option<crate::owner::Inside<'a, St>>,
    Option<table::SpinGuard<'static>>,
);

/// `fd` was retired (its generation bumped, `fdlife::retire`): wait until
/// its record's owner thread, if inside a receive on `fd` (its close
/// guard), has seen that and left. Another thread closing revokes the
/// owner (a barrier) first; the owner closing waits for nobody.
pub fn wait_outside(fd: c_int) {
    if let Some(a) = by_fd(fd) {
        a.st.wait_outside(fd as u32, 100_000);
    }
}

/// What a receive produced.
pub enum Got {
    /// (full datagram length, source)
    Data(usize, SocketAddrV4),
    /// Read side shut down: 0 like the kernel.
    Eof,
}

/// Receive one datagram: `deliver` copies it out. Waits per the socket's
/// mode, the call's flags and the profile's spin budget.
pub fn recv_one(
    a: &'static Accel,
    fd: c_int,
    flags: c_int,
    mut deliver: impl FnMut(&[u8], SocketAddrV4),
) -> Result<Got, c_int> {
    let mut a = a;
    loop {
        let r = recv_on(a, fd, flags, &mut deliver);
        if !matches!(r, Err(MOVED_AWAY)) {
            return r;
        }
        // The socket moved to the engine of a process this one forked
        // (or was forked from) while this call was on its way in: this
        // process's record is a copy now, whose use asks that owner (it
        // takes it off, or it comes back here).
        if let Some(b) = inherited(fd, a) {
            a = b;
        }
    }
}

/// [`recv_on`]'s error when its record became a copy (moved away): never
/// an errno.
const MOVED_AWAY: c_int = c_int::MIN;

/// [`recv_one`] on record `a` ([`MOVED_AWAY`]: `a` became a copy).
fn recv_on(
    a: &Accel,
    fd: c_int,
    flags: c_int,
    deliver: &mut impl FnMut(&[u8], SocketAddrV4),
) -> Result<Got, c_int> {
    let peek = flags & libc::MSG_PEEK != 0;
    let dontwait = flags & libc::MSG_DONTWAIT != 0 || a.common.nonblock();
    let w0 = table::get(fd);
    let mut wait: Option<crate::adapt::Waiter<crate::adapt::ShimHost>> = None;
    let s0 = crate::signals::seq();
    // close() waits for us before the number can be reused; the generation
    // is re-read before every syscall on `fd`.
    let _spin = a.close_guard(fd);
    let ts_on = a.ts.on();
    if ts_on {
        // Kernel-path datagrams carry no engine stamp.
        crate::tstamp::set_last(0);
    }
    // The waiting turns' lock-free look (XdpSocket::idle_peek): made at
    // the second empty attempt, dropped before any other wait.
    let mut idle: Option<IdlePeek> = None;
    loop {
        // An idle turn of a spinning wait when nothing came for the socket
        // since its last attempt found its queue empty: a few loads of the
        // engine's delivery count and RX rings, no lock, no clock (the
        // floor's idle turn). Sound whatever other threads do: see
        // `IdlePeek::coast` (a datagram any thread polls makes it false)
        // and `Waiter::may_coast` (what the skipped turns defer: a close
        // racing the wait is seen at the next locked turn, at most
        // QUIET_LOOK_EVERY turns later, and close waits for this thread's
        // spin guard meanwhile; the peek makes no call on the fd).
        if let Some(p) = idle.as_mut()
            && wait.as_ref().is_some_and(|w| w.may_coast())
            && p.coast()
        {
            core::hint::spin_loop();
            continue;
        }
        {
            let Some(mut g) = a.lock_for(fd) else {
                // Closed (or taken off the engine and forgotten) since the
                // lookup: the kernel socket under the fd answers.
                drop(idle.take());
                return kernel_mode_recv(a, fd, flags, dontwait, s0, deliver);
            };
            if let Some((buf, src, at)) = g.stash.front() {
                let (n, src) = (buf.len(), *src);
                if ts_on {
                    crate::tstamp::set_last(*at);
                }
                deliver(buf, src);
                if !peek {
                    g.stash.pop_front();
                    if g.xdp.is_none() && g.stash.is_empty() {
                        drop(g);
                        retire_detached(fd, a);
                    }
                }
                return Ok(Got::Data(n, src));
            }
            let St { xdp, stash, peer } = &mut *g;
            let Some(x) = xdp.as_mut() else {
                // Taken off the engine (another thread detached it while
                // we waited): the kernel socket answers from now on.
                drop(g);
                drop(idle.take());
                if !a.mine() {
                    // Moved to another process's engine (`take_off`,
                    // `After::Disown`: off the engine first).
                    return Err(MOVED_AWAY);
                }
                retire_detached(fd, a);
                return kernel_mode_recv(a, fd, flags, dontwait, s0, deliver);
            };
            if idle.is_some() {
                // The turns it answered count as the socket's calls.
                x.idle_peek(&mut idle);
            }
            let mut got = None;
            let peer = *peer;
            engine_call(|| {
                x.recv_batch_ts(1, |p, src, at| {
                    if peer.is_some_and(|pe| pe != src) {
                        return; // connected: the kernel filters other sources
                    }
                    if peek {
                        stash.push_back((p.to_vec(), src, at));
                    }
                    if ts_on {
                        crate::tstamp::set_last(at);
                    }
                    deliver(p, src);
                    probe::mark(Mark::UdpCopied);
                    got = Some((p.len(), src));
                })
            });
            if let Some((n, src)) = got {
                return Ok(Got::Data(n, src));
            }
            if wait.is_some() {
                x.idle_peek(&mut idle);
            }
        }
        if a.common.rd_shut() {
            return Ok(Got::Eof);
        }
        if dontwait {
            // Before saying EAGAIN, look at the kernel socket under the fd
            // (traffic that took the kernel path: loopback, other
            // interfaces, fragments), unless a readiness call just saw it
            // empty (an event loop's last read before it waits again).
            // (close() waits for us, so the number is still this socket.)
            if !twin_maybe(a) {
                return Err(libc::EAGAIN);
            }
            return match kernel_recv(fd, flags, deliver) {
                Some(Ok(g)) => Ok(g),
                Some(Err(e)) => Err(e),
                None => Err(libc::EAGAIN),
            };
        }
        // The clock starts once the socket has to wait.
        let w = wait.get_or_insert_with(|| {
            let tmo = a.common.rcvtimeo_ns();
            crate::adapt::waiter(fd, w0, s0, tmo, 5_000_000)
        });
        match w.turn() {
            Turn::Spin | Turn::Woken => {}
            Turn::Closed => return Err(libc::EBADF),
            Turn::Interrupted => return Err(libc::EINTR),
            Turn::TimedOut => return Err(libc::EAGAIN),
            Turn::Sleep(ns) => {
                drop(idle.take());
                // Past the spin budget: traffic that took the kernel path is
                // taken at once; otherwise sleep until the engine's rings,
                // the socket's wake-up eventfd or the kernel socket say
                // something may be there (at most 5 ms: another thread may
                // have drained the rings for us, and close/shutdown are
                // looked at).
                if let Some(r) = kernel_recv(fd, flags, deliver) {
                    return r;
                }
                sleep(a, crate::adapt::slice_ms(ns));
            }
        }
    }
}

/// Sleep (at most `ms`) until the engine's rings, the socket's wake-up
/// eventfd or the kernel socket say something may be there.
///
/// The threads of a process that sleep on one socket share one private
/// epoll instance with the wait fds registered edge-triggered: threads
/// blocked in `epoll_wait` on one instance are woken one at a time (the
/// kernel queues them exclusively), so a datagram wakes one sleeper, as a
/// kernel socket wakes one of the threads blocked in `recv` — where a
/// `poll` on the fds would wake them all to fight over one datagram.
fn sleep(a: &Accel, ms: c_int) {
    // Only when threads actually share the socket's sleep: a socket that
    // one thread receives on never costs the application an extra fd.
    let others = a.sleepers.fetch_add(1, Ordering::AcqRel);
    let ep = if others > 0 || a.sleep_ep.load(Ordering::Acquire) >= 0 {
        a.sleep_ep()
    } else {
        -1
    };
    sleep_on(a, ep, ms);
    a.sleepers.fetch_sub(1, Ordering::AcqRel);
}

fn sleep_on(a: &Accel, ep: c_int, ms: c_int) {
    if ep < 0 {
        let mut pfds: [libc::pollfd; 8] = [libc::pollfd {
            fd: -1,
            events: libc::POLLIN,
            revents: 0,
        }; 8];
        let wf = a.wait_fds();
        let n = wf.len().min(8);
        for (p, &f) in pfds.iter_mut().zip(wf) {
            p.fd = f;
        }
        // SAFETY: `n` pollfds on our stack.
        unsafe { real::poll(pfds.as_mut_ptr(), n as libc::nfds_t, ms) };
        return;
    }
    let mut ev = [libc::epoll_event { events: 0, u64: 0 }; 4];
    let e = errno();
    // SAFETY: our own epoll fd and a stack array of 4 events.
    unsafe { real::epoll_wait(ep, ev.as_mut_ptr(), 4, ms) };
    set_errno(e);
}

impl Accel {
    /// The socket's private epoll instance for sleeping receivers (made on
    /// first use; -1 if it could not be made: then they `poll`).
    fn sleep_ep(&self) -> c_int {
        let cur = self.sleep_ep.load(Ordering::Acquire);
        if cur >= 0 || cur == -2 {
            return cur.max(-1);
        }
        let Ok(ep) = rustix::event::epoll::create(rustix::event::epoll::CreateFlags::CLOEXEC)
        else {
            self.sleep_ep.store(-2, Ordering::Release);
            return -1;
        };
        use std::os::fd::IntoRawFd;
        let ep = ep.into_raw_fd();
        for &f in self.wait_fds() {
            let mut ev = libc::epoll_event {
                events: (libc::EPOLLIN | libc::EPOLLET) as u32,
                u64: f as u64,
            };
            // SAFETY: our epoll fd, a valid event on the stack.
            unsafe { real::epoll_ctl(ep, libc::EPOLL_CTL_ADD, f, &mut ev) };
        }
        match self
            .sleep_ep
            .compare_exchange(-1, ep, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => ep,
            Err(other) => {
                // Another thread made one first.
                // SAFETY: ours, never published.
                drop(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(ep) });
                other.max(-1)
            }
        }
    }
}

/// The datagrams of `stash` (for `fd`, addressed to `to`) back on the
/// kernel socket, oldest first ([`detach_as`]); what the kernel refuses
/// stays in the stash, with one warn line.
fn requeue(fd: c_int, stash: &mut VecDeque<(Vec<u8>, SocketAddrV4, u64)>, to: SocketAddrV4) {
    const WHAT: &str = "the datagrams the engine had queued";
    if stash.is_empty() {
        return;
    }
    let kept = |n: usize, e: std::io::Error| {
        log!(
            Level::Warn,
            "fd {fd} udp: {n} datagrams the engine had queued stay with this process, not on the kernel socket the child shares ({e})"
        );
    };
    if let Err(e) = crate::inject::raw_socket(WHAT) {
        return kept(stash.len(), e);
    }
    // Those that reached the kernel socket since the steering stopped
    // arrived after the stash's: they go behind them, in order, as the
    // kernel would have queued them all (a bounded look: under a flood
    // the rest stay where they are).
    for _ in 0..4096 {
        let mut more = |p: &[u8], src| stash.push_back((p.to_vec(), src, 0));
        if !matches!(kernel_recv(fd, 0, &mut more), Some(Ok(_))) {
            break;
        }
    }
    let packets: Vec<Vec<u8>> = stash
        .iter()
        .map(|(p, src, _)| nanowire_stack::xdp::udp_packet(*src, to, p))
        .collect();
    let refs: Vec<&[u8]> = packets.iter().map(Vec::as_slice).collect();
    match crate::inject::inject(&refs, WHAT) {
        Ok(()) => {
            log!(
                Level::Info,
                "fd {fd} udp: {} datagrams the engine had queued are on the kernel socket the child shares (shown to the kernel again, in order)",
                stash.len()
            );
            stash.clear();
        }
        Err((n, e)) => {
            stash.drain(..n);
            kept(stash.len(), e);
        }
    }
}

/// A detached socket whose stash is empty: forget the record, so every
/// later call on `fd` takes the plain kernel path (with ancillary data).
/// (Kept while transmit stamps of the engine's sends are unread: they are
/// served from the record, see `tstamp::recv_err`.)
fn retire_detached(fd: c_int, a: &Accel) {
    // A record moved to another process's engine stays: this process's
    // copy, whose next use asks that owner (`take_off`, `After::Disown`).
    if a.mine() && !a.ts.err_pending() && by_fd(fd).is_some_and(|b| std::ptr::eq(a, b)) {
        let Some(r) = take_fd(fd) else { return };
        table::clear_flags(fd, table::F_ACCEL);
        // The fd's reference goes with its slot (its close will not find
        // the record): the last one ends the incarnation.
        if std::ptr::eq(r, a) {
            release(r);
        } else {
            // Replaced between the look and the take (closed and reused):
            // not ours to forget.
            set_fd(fd, r);
            table::add_flags(fd, table::F_ACCEL);
        }
    }
}

/// The engine of `a` stamps what its timestamp options ask for.
pub fn set_stamping(a: &Accel, fd: c_int, st: crate::tstamp::Stamping) {
    if let Some(mut g) = a.lock_for(fd) {
        stamp(&mut g, st);
    }
}

fn stamp(g: &mut St, st: crate::tstamp::Stamping) {
    if let Some(x) = g.xdp.as_mut() {
        engine_call(|| {
            x.set_rx_stamping(st.rx);
            x.set_tx_stamping(st.tx, st.frame);
        });
    }
}

/// `recvmsg(MSG_ERRQUEUE)` on `a`: `None` if the engine's queue of
/// transmit stamps is empty (the kernel socket's own queue answers: EAGAIN,
/// or stamps of datagrams that took the kernel path).
pub fn recv_err(a: &Accel, fd: c_int, m: &mut libc::msghdr, flags: c_int) -> Option<isize> {
    if !a.ts.err_pending() || !by_fd(fd).is_some_and(|b| std::ptr::eq(a, b)) {
        // (Or `fd` no longer names the record: its queue is another's.)
        return None;
    }
    let r = crate::tstamp::recv_err(&a.ts, m, flags);
    if !a.ts.err_pending() {
        errq_drained(fd, a);
    }
    r
}

/// The last engine transmit stamp of `a` was read: forget a detached
/// record that has nothing left to serve.
fn errq_drained(fd: c_int, a: &Accel) {
    let g = a.lock();
    if g.xdp.is_none() && g.stash.is_empty() {
        drop(g);
        retire_detached(fd, a);
    }
}

/// Receive from the kernel socket under `fd` with the application's
/// blocking mode and timeout (the socket was taken off the engine while a
/// receive was in progress).
/// (`dontwait`: as the call found the socket; the record may serve
/// another socket by now, its timeout is looked at on the way.)
fn kernel_mode_recv(
    a: &Accel,
    fd: c_int,
    flags: c_int,
    dontwait: bool,
    s0: u64,
    deliver: &mut impl FnMut(&[u8], SocketAddrV4),
) -> Result<Got, c_int> {
    let start = now_ns();
    loop {
        if let Some(r) = kernel_recv(fd, flags, deliver) {
            return r;
        }
        if dontwait {
            return Err(libc::EAGAIN);
        }
        if !a.mine() && by_fd(fd).is_some_and(|b| std::ptr::eq(a, b)) {
            // Moved to another process's engine meanwhile: ask it.
            return Err(MOVED_AWAY);
        }
        let tmo = a.common.rcvtimeo_ns();
        if crate::signals::interrupted_timed(s0, tmo != 0) {
            return Err(libc::EINTR);
        }
        let spent = now_ns().wrapping_sub(start);
        if tmo != 0 && spent >= tmo {
            return Err(libc::EAGAIN);
        }
        let ms = if tmo == 0 {
            5
        } else {
            (tmo - spent).div_ceil(1_000_000).min(5) as c_int
        };
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd on our stack, a bounded timeout.
        unsafe { real::poll(&mut p, 1, ms) };
    }
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One datagram straight from the kernel socket under `fd`, without
/// waiting. `None`: nothing there.
fn kernel_recv(
    fd: c_int,
    flags: c_int,
    deliver: &mut impl FnMut(&[u8], SocketAddrV4),
) -> Option<Result<Got, c_int>> {
    SCRATCH.with(|b| {
        let mut b = b.borrow_mut();
        if b.len() < 65536 {
            b.resize(65536, 0);
        }
        let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        let mut sl = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let e = errno();
        // SAFETY: our scratch buffer and sockaddr.
        let r = unsafe {
            real::recvfrom(
                fd,
                b.as_mut_ptr().cast(),
                b.len(),
                libc::MSG_DONTWAIT | (flags & libc::MSG_PEEK),
                (&raw mut sa).cast(),
                &mut sl,
            )
        };
        if r < 0 {
            let err = errno();
            set_errno(e);
            return if err == libc::EAGAIN {
                None
            } else {
                Some(Err(err))
            };
        }
        let src = SocketAddrV4::new(
            Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr)),
            u16::from_be(sa.sin_port),
        );
        deliver(&b[..r as usize], src);
        Some(Ok(Got::Data(r as usize, src)))
    })
}

/// Is a datagram waiting? Answers from the rings and the socket's queue
/// without taking anything (no copy, no allocation): what poll/epoll ask
/// on every turn of a spin.
pub fn readable(a: &Accel) -> bool {
    let g = a.lock();
    if !g.stash.is_empty() {
        return true;
    }
    let Some(x) = g.xdp.as_ref() else {
        return false;
    };
    engine_call(|| x.pending().0 > 0) || a.common.rd_shut()
}

/// How long the kernel's "nothing on the kernel twin" answer stays good
/// for skipping the twin's `recvfrom` before an EAGAIN.
const TWIN_FRESH_NS: u64 = 1_000_000;

/// A readiness call just asked the kernel about `fd`'s socket: `readable`
/// is the kernel's POLLIN/EPOLLIN for it (a datagram on the kernel twin:
/// loopback, other interfaces, fragments).
#[inline]
pub fn twin_seen(a: &Accel, readable: bool, now: u64) {
    a.twin_empty_at
        .store(if readable { 0 } else { now.max(1) }, Ordering::Relaxed);
}

/// May the kernel twin hold a datagram? No if a readiness call saw it
/// empty within TWIN_FRESH_NS: a datagram that arrived since is reported
/// by the next poll/epoll (the kernel's level-triggered answer for the
/// fd), or found by the next receive once the answer is stale.
#[inline]
fn twin_maybe(a: &Accel) -> bool {
    let t = a.twin_empty_at.load(Ordering::Relaxed);
    t == 0 || now_ns().wrapping_sub(t) >= TWIN_FRESH_NS
}

/// Is a datagram waiting? (Takes one into the stash if needed: FIONREAD
/// wants its length.)
fn readable_stash(a: &Accel) -> bool {
    let mut g = a.lock();
    if !g.stash.is_empty() {
        return true;
    }
    let St { xdp, stash, peer } = &mut *g;
    let Some(x) = xdp.as_mut() else {
        return false;
    };
    let peer = *peer;
    engine_call(|| {
        x.recv_batch_ts(1, |p, src, at| {
            if peer.is_none_or(|pe| pe == src) {
                stash.push_back((p.to_vec(), src, at));
            }
        })
    });
    !stash.is_empty() || a.common.rd_shut()
}

/// Length of the next datagram (FIONREAD), 0 if none.
pub fn next_len(a: &Accel) -> usize {
    if readable_stash(a) {
        a.lock().stash.front().map_or(0, |(b, _, _)| b.len())
    } else {
        0
    }
}

/// Send one datagram (to `dst`, or the connected peer).
#[inline]
pub fn send_one(
    a: &Accel,
    fd: c_int,
    data: &[u8],
    dst: Option<SocketAddrV4>,
    flags: c_int,
) -> Result<usize, c_int> {
    let Some(mut g) = a.lock_for(fd) else {
        // Closed or forgotten since the lookup: the kernel socket (if the
        // fd is still one) sends, or says EBADF.
        let Some(dst) = dst else {
            return Err(libc::EDESTADDRREQ);
        };
        return kernel_send(fd, data, dst, flags, None);
    };
    let Some(dst) = dst.or(g.peer) else {
        return Err(libc::EDESTADDRREQ);
    };
    if data.len() > 65507 {
        return Err(libc::EMSGSIZE);
    }
    let dontwait = flags & libc::MSG_DONTWAIT != 0 || a.common.nonblock();
    let stamps = a.ts.tx_on();
    let key = if stamps {
        crate::tstamp::next_key(&a.ts)
    } else {
        None
    };
    loop {
        let Some(x) = g.xdp.as_mut() else {
            drop(g);
            return kernel_send(fd, data, dst, flags, key);
        };
        if stamps {
            x.set_tx_key(key);
        }
        match engine_call(|| x.send_to(data, dst)) {
            Ok(n) => {
                if stamps {
                    crate::tstamp::sent(&a.ts, x, key);
                }
                return Ok(n);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                match a.after_full_ring(fd, g, dontwait)? {
                    Some(now) => g = now,
                    None => return kernel_send(fd, data, dst, flags, key),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
                // Larger than the interface MTU: the kernel socket under the
                // fd sends it (and fragments it), as a kernel socket would.
                drop(g);
                return kernel_send(fd, data, dst, flags, key);
            }
            Err(e) => return Err(e.raw_os_error().unwrap_or(libc::EIO)),
        }
    }
}

/// Send through the kernel socket under `fd` (datagrams above the MTU, or
/// a socket taken off the engine).
fn kernel_send(
    fd: c_int,
    data: &[u8],
    dst: SocketAddrV4,
    flags: c_int,
    key: Option<u32>,
) -> Result<usize, c_int> {
    let sa = sockaddr_in(dst);
    if let Some(k) = key {
        // Transmit stamps under the key the shim's counter gave (OPT_ID).
        let r =
            nanowire_stack::xdp::host::sendto_tskey(fd, data, flags | libc::MSG_NOSIGNAL, &sa, k);
        return if r < 0 { Err(errno()) } else { Ok(r as usize) };
    }
    // SAFETY: the caller's data (a valid slice), our sockaddr_in.
    let r = unsafe {
        real::sendto(
            fd,
            data.as_ptr().cast(),
            data.len(),
            flags | libc::MSG_NOSIGNAL,
            (&raw const sa).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if r < 0 { Err(errno()) } else { Ok(r as usize) }
}

/// Send several datagrams to one destination with one engine batch;
/// returns how many were queued (at least one, or an error).
pub fn send_batch(
    a: &Accel,
    fd: c_int,
    bufs: &[&[u8]],
    dst: Option<SocketAddrV4>,
    flags: c_int,
) -> Result<usize, c_int> {
    if bufs.len() == 1 || a.ts.tx_on() {
        // (One at a time with transmit stamps: one stamp per datagram.)
        return send_one(a, fd, bufs[0], dst, flags).map(|_| 1);
    }
    let Some(mut g) = a.lock_for(fd) else {
        return send_one(a, fd, bufs[0], dst, flags).map(|_| 1);
    };
    let Some(dst) = dst.or(g.peer) else {
        return Err(libc::EDESTADDRREQ);
    };
    let dontwait = flags & libc::MSG_DONTWAIT != 0 || a.common.nonblock();
    loop {
        let Some(x) = g.xdp.as_mut() else {
            drop(g);
            return send_one(a, fd, bufs[0], Some(dst), flags).map(|_| 1);
        };
        match engine_call(|| x.send_batch_to(bufs, dst)) {
            Ok(n) if n > 0 => return Ok(n),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
                // The first is larger than the MTU allows: the kernel sends it.
                drop(g);
                return send_one(a, fd, bufs[0], Some(dst), flags).map(|_| 1);
            }
            Err(e) => return Err(e.raw_os_error().unwrap_or(libc::EIO)),
        }
        match a.after_full_ring(fd, g, dontwait)? {
            Some(now) => g = now,
            None => return send_one(a, fd, bufs[0], Some(dst), flags).map(|_| 1),
        }
    }
}

/// connect(): the kernel socket is connected too (getpeername, and the
/// kernel path filters like a connected socket); AF_UNSPEC disconnects.
pub fn connect(a: &Accel, fd: c_int, peer: Option<SocketAddrV4>) -> Result<(), c_int> {
    let mut g = a.lock_for(fd).ok_or(libc::EBADF)?;
    if let (Some(p), Some(x)) = (peer, g.xdp.as_mut())
        && let Err(e) = engine_call(|| x.connect(p))
    {
        return Err(e.raw_os_error().unwrap_or(libc::EHOSTUNREACH));
    }
    g.peer = peer;
    Ok(())
}

/// Join (`join`) or leave `group` on the engine. Joining: `Err(0)` when
/// the socket is off the engine (the caller lets the kernel socket join).
/// Leaving (the kernel socket has left): done off the engine or for a group
/// the engine never steered; `Err` when the engine cannot, and the caller
/// takes the socket off the engine.
pub fn membership(
    a: &Accel,
    fd: c_int,
    (group, ifaddr): (Ipv4Addr, Ipv4Addr),
    join: bool,
) -> Result<(), c_int> {
    let mut g = a.lock_for(fd).ok_or(libc::EBADF)?;
    let Some(x) = g.xdp.as_mut() else {
        return if join { Err(0) } else { Ok(()) };
    };
    let r = engine_call(|| {
        if join {
            x.join_multicast(group, ifaddr)
        } else {
            x.leave_multicast(group, ifaddr)
        }
    });
    match r {
        Ok(()) => Ok(()),
        Err(e) if !join && e.kind() == std::io::ErrorKind::AddrNotAvailable => Ok(()),
        Err(e) => Err(e.raw_os_error().unwrap_or(libc::EINVAL)),
    }
}

/// The application's socket took IP_TTL / IP_TOS / IP_MULTICAST_TTL: the
/// engine's headers follow.
pub fn sync_ip_header(a: &Accel, fd: c_int) {
    if let Some(x) = a.lock_for(fd).as_mut().and_then(|g| g.xdp.as_mut()) {
        engine_call(|| x.sync_ip_header());
    }
}

pub fn set_rcvbuf(a: &Accel, fd: c_int, bytes: usize) {
    if let Some(x) = a.lock_for(fd).as_mut().and_then(|g| g.xdp.as_mut()) {
        engine_call(|| x.set_rcvbuf(bytes));
    }
}

/// The fd `fd` stops referring to `a` (close, or dup2 over it). The
/// engine socket goes when the last fd goes.
pub fn release(a: &'static Accel) {
    if !a.common.release() {
        return;
    }
    if a.mine() {
        recycle(a);
    } else if a.common.share() != 0 {
        // A forked child's last copy of a socket its parent shared.
        crate::forkshare::dropped(a.common.share());
    }
}

/// `fd` was closed behind the shim's back and its number may already name
/// something else: forget it without touching the number. If it was the
/// number the engine adopted and duplicates remain, the socket is taken off
/// the engine through one of them (the engine must never use the number).
pub fn release_stale(fd: c_int) {
    let Some(a) = take_fd(fd) else { return };
    if a.mine() && a.adopted() == fd && !a.detached.load(Ordering::Acquire) {
        let mut dup = None;
        table::each_record::<Accel>(|f, r| {
            if dup.is_none() && std::ptr::eq(r.record(), a) {
                dup = Some(f);
            }
        });
        if let Some(d) = dup {
            detach(
                d,
                "the fd the engine uses was closed behind the shim's back while duplicates of it remain",
            );
        }
    }
    release(a);
}

/// `fd` is about to be closed (close, or dup2/dup3 over it). If it is the
/// number the engine adopted and other fds still refer to the socket, the
/// engine must stop using that number first: the socket goes to the kernel
/// (its duplicates carry on there).
pub fn closing(fd: c_int) {
    if let Some(a) = by_fd(fd)
        && a.mine()
        && a.common.refs() == 1
        && !a.detached.load(Ordering::Acquire)
        && let h = a.common.share()
        && h != 0
        && matches!(
            crate::forkshare::owner_closing(h),
            crate::forkshare::Closing::HandOver
        )
    {
        // Its last fd here while a forked child holds a copy: the socket
        // lives on in the child, with what the engine had queued. On the
        // service the child's use takes it onto its engine (elsewhere
        // this process's engine keeps the interface: the kernel's).
        const WHY: &str = "fork(): this process closed it, its forked child holds it";
        if on_service(a) {
            leave_to_holders(fd, h, WHY);
        } else {
            detach_as(fd, WHY, true);
            crate::forkshare::settle(h);
        }
        return;
    }
    if let Some(a) = by_fd(fd)
        && a.mine()
        && a.adopted() == fd
        && !a.detached.load(Ordering::Acquire)
    {
        if a.common.refs() > 1 {
            detach(
                fd,
                "the fd the engine uses was closed while duplicates of it remain",
            );
        } else if !a.common.nonblock() {
            // The last fd the shim knows, but the socket may outlive it
            // under a number the shim never saw (inherited through exec
            // with another, received): that one must find the
            // application's blocking mode, not the engine's O_NONBLOCK
            // (issue 24: a forked child's blocking recv said EAGAIN).
            restore_mode(fd, a);
        }
    }
}

/// The application's blocking mode (`a`'s) back on the kernel socket under
/// `fd` (the engine keeps it non-blocking underneath).
fn restore_mode(fd: c_int, a: &Accel) {
    let nb = a.common.nonblock();
    // SAFETY: the fd is only borrowed for two fcntl calls.
    let b = unsafe { rustix::fd::BorrowedFd::borrow_raw(fd) };
    if let Ok(mut f) = rustix::fs::fcntl_getfl(b) {
        f.set(rustix::fs::OFlags::NONBLOCK, nb);
        let _ = rustix::fs::fcntl_setfl(b, f);
    }
}

/// Take a socket off the engine (an option the engine cannot honour was
/// set, a fork shares it, another socket on the host shares its port):
/// the kernel socket under the fd carries on alone. Datagrams the engine
/// had queued are kept and served first (never lost); while any are left
/// the record stays, in kernel mode; then it is forgotten. Safe while
/// other threads use the socket.
pub fn detach(fd: c_int, why: &str) {
    detach_as(fd, why, false);
}

/// [`detach`]; `shared`: a child process is about to share the socket
/// (fork, clone, vfork, exec). The kernel queues a datagram on the socket,
/// where any process sharing it reads it; a stash is this process's
/// memory, which a child does not read (the shim is off in a clone()d or
/// vfork()ed child, another program after exec, its own copy in a forked
/// one). So the stash goes back to the kernel socket, each datagram shown
/// to the kernel as the packet that carried it (`inject::inject`, a raw
/// socket: CAP_NET_RAW); where the kernel refuses, the rest stay in the
/// stash, served to this process first, and one warn line says so.
fn detach_as(fd: c_int, why: &str, shared: bool) {
    let _ = take_off(fd, Some(why), shared, After::Settle);
    table::clear_flags(fd, table::F_CAND);
}

/// What [`take_off`] does with a socket's fork-share slot and record.
#[derive(PartialEq)]
enum After {
    /// Settle the slot (decided: a child's use finds the kernel's socket).
    Settle,
    /// Leave the slot to the caller, who holds its decision.
    Keep,
    /// Leave the slot to the caller, and make the record a copy like a
    /// forked child's (not this process's: its next use asks the slot's
    /// owner) if nothing stays queued in it.
    Disown,
}

/// [`detach_as`]'s work: `Some(n)` if it took the socket off the engine,
/// `n` datagrams staying in this process's stash (not requeued on the
/// kernel socket); `None`: not an engine socket of this process's.
/// `why`: the warn line's reason (`None`: the caller says).
fn take_off(fd: c_int, why: Option<&str>, shared: bool, after: After) -> Option<usize> {
    // A socket already off the engine (still draining its stash) is not
    // taken off again: a second option says nothing more.
    let a = by_fd(fd).filter(|a| a.mine() && !a.detached.load(Ordering::Acquire))?;
    // Shared with a forked child at fork (its slot): the child reads the
    // kernel socket too from now on.
    let h = a.common.share();
    let shared = shared || h != 0;
    {
        // Under the socket's lock throughout: a concurrent receive finds
        // the stash complete before it reads the kernel socket.
        let mut g = a.lock();
        let St { xdp, stash, peer } = &mut *g;
        let peer = *peer;
        let to = xdp.as_ref().map(|x| x.delivered_to());
        if let Some(x) = xdp.take() {
            // Steering off first, then everything the engine holds (queue
            // and rings) into the stash (XdpSocket::hand_to_kernel).
            engine_call(|| {
                x.hand_to_kernel(|p, src, at| {
                    if peer.is_none_or(|pe| pe == src) {
                        stash.push_back((p.to_vec(), src, at));
                    }
                })
            });
        }
        if shared && let Some(to) = to {
            requeue(fd, stash, to);
        }
        // Restore the application's blocking mode on the kernel socket
        // before anyone can see the socket off the engine: another thread
        // may then retire the record at once and hand the fd to the
        // kernel, whose blocking recv must not say EAGAIN.
        restore_mode(fd, a);
        if after == After::Disown && stash.is_empty() {
            // Before it is seen off the engine: a thread of this process
            // then finds a copy and asks the slot's owner.
            a.common.disown();
        }
        a.detached.store(true, Ordering::Release);
    }
    if after == After::Settle {
        // Decided: a child's use finds the kernel's socket at once.
        crate::forkshare::settle(h);
    }
    let kept = a.lock().stash.len();
    if kept == 0 {
        retire_detached(fd, a);
    }
    if let Some(why) = why {
        log!(
            Level::Warn,
            "fd {fd} udp: taken off the xdp engine (kernel socket, spin engine): {why}{}",
            if kept > 0 {
                format!(" ({kept} queued datagrams are delivered first)")
            } else {
                String::new()
            }
        );
    }
    Some(kept)
}
