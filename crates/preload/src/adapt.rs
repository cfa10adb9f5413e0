//! The waiter of this process: `nanowire_shimcore::waiter` (the adaptive
//! spin policy and the one wait loop, unit-tested there; docs/preload.md,
//! "Spinning") over this process's clock, `sched_yield`, fd table and
//! signal counts.
//!
//! Every blocking call of the shim waits through [`waiter`]: it attempts,
//! asks [`Waiter::turn`] what next (EINTR, EBADF by generation, the
//! caller's timeout, spin, or sleep for a slice on the socket's fds) and
//! attempts again. Readiness calls (poll/select/epoll, `ready`) spin with
//! [`Wait`] alone: their sleep is the real call with what is left of the
//! caller's timeout.

use crate::sys::now_ns;
use crate::table;
use nanowire_shimcore::waiter::{Host, Limits, Pass, Seat, Spin};
pub use nanowire_shimcore::waiter::{Turn, Waiter, slice_ms};
use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Spin budget in ns: 0 = no spinning, `u64::MAX` = forever (the profile's
/// `spin_us`, set once at load).
pub static SPIN_NS: AtomicU64 = AtomicU64::new(0);

/// Threads of this process spinning right now (in a wait that has not
/// given up spinning).
static SPINNING: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// This thread's affinity: 0 = not asked yet, 1 = one CPU, 2 = more.
    static AFFINITY: Cell<u8> = const { Cell::new(0) };
    /// Its CPUs as a mask (0: a CPU beyond the registry's, no seat);
    /// asked with AFFINITY.
    static CPU_MASK: Cell<u64> = const { Cell::new(0) };
}

/// This thread's affinity (asked once per thread): 1 = one CPU, 2 = more.
#[inline]
fn affinity() -> u8 {
    AFFINITY.with(|a| {
        if a.get() == 0 {
            let (n, mask) = match rustix::thread::sched_getaffinity(None) {
                Ok(s) => {
                    let cpus = nanowire_stack::xdp::seats::CPUS as usize;
                    let mask = (0..cpus)
                        .filter(|&c| s.is_set(c))
                        .fold(0u64, |m, c| m | 1 << c);
                    let n = s.count();
                    (n, if mask.count_ones() == n { mask } else { 0 })
                }
                Err(_) => (1, 0),
            };
            CPU_MASK.with(|m| m.set(mask));
            a.set(if n > 1 { 2 } else { 1 });
        }
        a.get()
    })
}

/// This process, as a waiter sees it.
#[derive(Clone, Copy)]
pub struct ShimHost;

impl Host for ShimHost {
    #[inline(always)]
    fn now_ns(&self) -> u64 {
        now_ns()
    }
    #[inline]
    fn sched_yield(&self) {
        rustix::thread::sched_yield();
    }
    /// Asked once per thread.
    #[inline]
    fn unpinned(&self) -> bool {
        affinity() == 2
    }
    #[inline(always)]
    fn spinning(&self) -> &AtomicU32 {
        &SPINNING
    }
    #[inline(always)]
    fn word(&self, fd: i32) -> u64 {
        table::WORDS.get_now(fd)
    }
    #[inline(always)]
    fn signal_seq(&self) -> u64 {
        crate::signals::seq()
    }
    /// The engine service's registry (`nanowire_xdp::seats`), when this
    /// process is attached to it.
    #[inline]
    fn seat(&self, spin: bool) -> Option<Seat> {
        let s = nanowire_stack::xdp::seats::seats()?;
        affinity();
        let mask = CPU_MASK.with(|m| m.get());
        if mask == 0 {
            return None;
        }
        s.take(mask, !spin);
        Some(if spin {
            Seat::Spinner(mask)
        } else {
            Seat::Sleeper(mask)
        })
    }
    #[inline]
    fn crowded(&self, seat: Seat) -> u32 {
        let (Seat::Spinner(m) | Seat::Sleeper(m)) = seat;
        nanowire_stack::xdp::seats::seats().map_or(0, |s| s.crowded(m))
    }
    #[inline]
    fn leave(&self, seat: Seat) {
        if let Some(s) = nanowire_stack::xdp::seats::seats() {
            match seat {
                Seat::Spinner(m) => s.leave(m, false),
                Seat::Sleeper(m) => s.leave(m, true),
            }
        }
    }
    /// The steering program's count of frames redirected to this process
    /// (`nanowire_xdp::seats`, passing the CPU by hint).
    #[inline]
    fn redirected(&self) -> Option<u32> {
        nanowire_stack::xdp::seats::seats()?.redirected()
    }
    fn pass(&self, seat: Seat, snap: u32) -> Pass {
        use nanowire_stack::xdp::seats::Passed;
        let (Seat::Spinner(m) | Seat::Sleeper(m)) = seat;
        let Some(s) = nanowire_stack::xdp::seats::seats() else {
            return Pass::Off;
        };
        match s.pass(m, snap, (now_ns() / 1000) as u32) {
            Passed::Off => Pass::Off,
            Passed::Watching { woke } => Pass::Watch(woke != 0),
            Passed::Parked { .. } => Pass::Parked,
        }
    }
    fn unwatch(&self, seat: Seat) {
        let (Seat::Spinner(m) | Seat::Sleeper(m)) = seat;
        if let Some(s) = nanowire_stack::xdp::seats::seats() {
            s.unwatch(m);
        }
    }
}

/// One wait of one thread under the adaptive policy (readiness calls and
/// the spin loops of kernel sockets): ask `spin()` on every idle turn.
pub struct Wait(Spin<ShimHost>);

impl Wait {
    /// Start a wait now; `cap`: the caller's own limit in ns (its timeout).
    #[inline]
    pub fn new(cap: u64) -> Wait {
        Wait(Spin::new(ShimHost, SPIN_NS.load(Ordering::Relaxed), cap))
    }

    /// The time of the last turn (ns, `now_ns()` clock).
    #[inline]
    pub fn now(&self) -> u64 {
        self.0.now()
    }

    /// ns since the wait began.
    #[inline]
    pub fn spent(&self) -> u64 {
        self.0.spent()
    }

    /// Another idle turn: `true` = spin on, `false` = sleep now (and from
    /// now on).
    #[inline]
    pub fn spin(&mut self) -> bool {
        self.0.spin()
    }
}

/// The wait of one blocking call on `fd`, begun now: `w0` and `s0` are the
/// fd's table word and the thread's signal count when the call began;
/// `timeout_ns` the socket's SO_RCVTIMEO/SO_SNDTIMEO (0: none); the sleep
/// slices are at most `slice_ns`.
#[inline]
pub fn waiter(fd: i32, w0: u64, s0: u64, timeout_ns: u64, slice_ns: u64) -> Waiter<ShimHost> {
    Waiter::new(
        ShimHost,
        fd,
        w0,
        s0,
        Limits {
            spin_ns: SPIN_NS.load(Ordering::Relaxed),
            timeout_ns,
            slice_ns,
        },
    )
}

/// Sleep (at most `ns`, at least 1 µs) until one of `fds` is readable
/// (on the stack for up to 16 fds); errno is kept.
pub fn sleep_on_fds(fds: &[i32], ns: u64) {
    let _: [i16; 0] = poll_in(fds.iter().copied(), ns);
}

/// Sleep (at most `ns`, at least 1 µs) until one of `fds` is readable; the
/// `revents` of the first `N` (the caller's own fds, put first). The
/// pollfds are on the stack for up to 16 fds (no allocation per wait: a
/// blocking `accept` waits once per call); errno is kept.
pub fn poll_in<const N: usize>(mut fds: impl Iterator<Item = i32>, ns: u64) -> [i16; N] {
    let pfd = |fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let mut stack = [pfd(-1); 16];
    let mut heap = Vec::new();
    let mut n = 0;
    for f in fds.by_ref() {
        if n == stack.len() {
            heap.extend_from_slice(&stack);
            heap.push(pfd(f));
            break;
        }
        stack[n] = pfd(f);
        n += 1;
    }
    let pfds: &mut [libc::pollfd] = if heap.is_empty() {
        &mut stack[..n]
    } else {
        heap.extend(fds.map(pfd));
        &mut heap
    };
    let ns = ns.max(1000);
    let ts = libc::timespec {
        tv_sec: (ns / 1_000_000_000) as _,
        tv_nsec: (ns % 1_000_000_000) as _,
    };
    let e = crate::sys::errno();
    // SAFETY: `pfds.len()` pollfds we own, a bounded timeout, no mask change.
    unsafe {
        crate::real::ppoll(
            pfds.as_mut_ptr(),
            pfds.len() as libc::nfds_t,
            &ts,
            std::ptr::null(),
        )
    };
    crate::sys::set_errno(e);
    std::array::from_fn(|i| pfds.get(i).map_or(0, |p| p.revents))
}
