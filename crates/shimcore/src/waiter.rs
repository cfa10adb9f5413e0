//! The one waiter of the shim: what a blocking call does between two
//! attempts.
//!
//! [`Waiter::turn`] is asked after every attempt that found nothing, and
//! answers, in this order: a handled signal interrupted the call
//! ([`Turn::Interrupted`]: EINTR), another thread closed the fd
//! ([`Turn::Closed`]: EBADF, never touch the number again) or shut it down
//! ([`Turn::Woken`], once), the caller's timeout passed ([`Turn::TimedOut`]:
//! EAGAIN, as SO_RCVTIMEO/SO_SNDTIMEO), spin on ([`Turn::Spin`]: attempt
//! again now) or sleep ([`Turn::Sleep`]: on the socket's fds for at most the
//! slice, then attempt again). The caller owns the attempt and the sleep
//! (which fds, poll or epoll); the waiter owns the order of the checks, the
//! clock and the spin policy, so every blocking call of the shim waits the
//! same way.
//!
//! [`Spin`] is the adaptive spin policy (docs/preload.md, "Spinning"):
//!
//! * **Yield, and notice who needed the CPU.** Every [`YIELD_EVERY_NS`] of
//!   spinning the thread calls `sched_yield()`. With nobody else runnable
//!   on its CPU that returns in well under a microsecond; if it took longer
//!   than [`BUSY_NS`], another thread ran meanwhile. A gap of more than
//!   `BUSY_NS` between two turns means the same (we were preempted).
//! * **Contended: sleep.** `balanced` and `throughput` stop spinning at the
//!   first sign of contention and sleep in the kernel (so the wake-up comes
//!   with the scheduler's preference), and do not spin again for a quiet
//!   period that doubles while contention persists (1 ms .. 64 ms).
//!   `latency` (a budget of `u64::MAX`: forever) keeps spinning but still
//!   yields.
//! * **Learn the budget from the gaps.** A wait that reached the sleep but
//!   got its data within the profile's budget would have been caught by
//!   spinning longer: the thread's budget doubles (up to the profile's). A
//!   wait that lasted longer anyway spun for nothing: it halves (down to
//!   [`MIN_BUDGET_NS`]).
//! * **Unpinned, yield at once.** A thread the scheduler may place
//!   anywhere, and the only one of its process spinning, yields on the
//!   first idle turn: the peer it just sent to (or the thread it just woke)
//!   is often queued right behind it (docs/perf-runtimes.md, session 4).
//! * **Processes that share CPUs pass them along** (issue 23,
//!   [`Host::seat`]: the engine service's registry, `nanowire_xdp::seats`).
//!   A wait marks itself spinning (or, once it gives up, sleeping) on its
//!   CPUs; when the other processes waiting there are at least as many as
//!   its CPUs it is *crowded*: it yields at every idle turn (whoever has a
//!   datagram, or was just woken for one, runs next), and a yield or gap is
//!   contention only beyond `BUSY_NS` per process waiting there (its
//!   siblings' turns are not a CPU-bound neighbour's slice), so it does not
//!   fall asleep for a quiet period because of them.
//!   A process alone on its CPUs (or with no registry) spins as before.
//! * **Pass it by hint** (session 17, [`Host::pass`]: the steering
//!   program's count of frames redirected to each process). A crowded wait
//!   that spins forever (`latency`) pinned to one CPU either watches the CPU
//!   (spins without yielding, and when a parked sibling's frame arrives
//!   wakes it and yields to it) or parks until the watcher wakes it; the
//!   park is no contention. A wait with a budget (`balanced`, `throughput`:
//!   it sleeps once the budget is spent or at contention), and any wait the
//!   hint does not apply to, yields at every crowded idle turn as above
//!   (session 19).

use crate::fdtable::closed_since;
use std::cell::Cell;
use std::sync::atomic::{AtomicU32, Ordering};

/// How often a spinning thread offers its CPU.
pub const YIELD_EVERY_NS: u64 = 20_000;
/// A `sched_yield` (or a gap between two turns) longer than this means
/// another thread held this CPU for a good while: a CPU-bound neighbour
/// (or the hypervisor) that takes whole slices.
pub const BUSY_NS: u64 = 100_000;
/// A `sched_yield` longer than this gave the CPU to another thread.
pub const SHARED_NS: u64 = 4_000;
/// Smallest learned budget: one look after a yield.
pub const MIN_BUDGET_NS: u64 = 5_000;
/// Quiet period after contention: starts at QUIET_MIN, doubles to QUIET_MAX.
pub const QUIET_MIN_NS: u64 = 1_000_000;
pub const QUIET_MAX_NS: u64 = 64_000_000;

/// What a wait needs of the process it runs in. The shim's is a zero-sized
/// type over the monotonic clock, `sched_yield`, its fd table and its
/// signal counts; tests use a scripted clock.
pub trait Host {
    /// Monotonic clock, ns.
    fn now_ns(&self) -> u64;
    fn sched_yield(&self);
    /// May this thread run on more than one CPU?
    fn unpinned(&self) -> bool;
    /// Threads of this process spinning right now.
    fn spinning(&self) -> &AtomicU32;
    /// The fd table word of `fd` (sequentially consistent: see
    /// `FdTable::get_now`).
    fn word(&self, fd: i32) -> u64;
    /// This thread's handled-signal counts: the low half counts signals
    /// whose handler lacks SA_RESTART, the high half every handled signal.
    fn signal_seq(&self) -> u64;
    /// A wait that spins (`spin`), or that sleeps from now on (`false`),
    /// on this thread's CPUs: marked in the registry of the processes
    /// sharing them (`None`: no registry, spin as alone).
    fn seat(&self, _spin: bool) -> Option<Seat> {
        None
    }
    /// How many other processes wait on the CPUs of `seat` when they are
    /// at least as many as those CPUs (0: not crowded).
    fn crowded(&self, _seat: Seat) -> u32 {
        0
    }
    /// The wait marked as `seat` ends or stops spinning.
    fn leave(&self, _seat: Seat) {}
    /// The count of frames redirected to this process, when the hint
    /// applies (read before each attempt; `None`: no hint).
    fn redirected(&self) -> Option<u32> {
        None
    }
    /// A crowded idle turn of a spinning `seat` by hint: watch its CPU or
    /// park (`snap`: [`Host::redirected`] before the last attempt).
    fn pass(&self, _seat: Seat, _snap: u32) -> Pass {
        Pass::Off
    }
    /// The wait marked as `seat` stops spinning: end its watch, if any.
    fn unwatch(&self, _seat: Seat) {}
}

/// What [`Host::pass`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// No hint here: a crowded spinner yields.
    Off,
    /// This wait watches its CPU; `true`: it woke a parked sibling with a
    /// frame (yield to it now).
    Watch(bool),
    /// It slept until woken (or its park ran out): no contention.
    Parked,
}

/// A wait's mark among the processes sharing its CPUs ([`Host::seat`]):
/// the thread's CPUs (a mask).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seat {
    /// Spinning on them.
    Spinner(u64),
    /// Asleep on them (a registry may also refuse a spin this way).
    Sleeper(u64),
}

#[derive(Clone, Copy)]
struct Learned {
    /// Learned budget in ns (0 = not yet initialised: the profile's).
    budget: u64,
    /// No spinning before this time (after contention).
    quiet_until: u64,
    /// Length of the current quiet period.
    quiet: u64,
}

/// A thread's [`Learned`].
#[repr(transparent)]
struct LearnedCell(Cell<Learned>);

// SAFETY: three integers in a cell: all zeros is the initial value
// (budget 0: not initialised yet); `Cell` is not `Sync`; no drop glue.
unsafe impl nanowire_owner::tls::ZeroInit for LearnedCell {}

nanowire_owner::initial_exec_block!(
    /// This thread's [`Learned`], in initial-exec TLS (two instructions; a
    /// `thread_local!` of a shared object is a `__tls_get_addr` call, which
    /// the compiler hoisted to the entry of a receive that may wait).
    fn learned_cell() -> LearnedCell =
        LearnedCell(Cell::new(Learned { budget: 0, quiet_until: 0, quiet: 0 })),
    "nanowire_shimcore_learned"
);

/// This thread's [`Learned`].
#[inline]
fn learned() -> Learned {
    learned_cell().0.get()
}

/// Store this thread's [`Learned`].
#[inline]
fn set_learned(l: Learned) {
    learned_cell().0.set(l);
}

/// One wait of one thread under the adaptive policy: ask [`Spin::spin`] on
/// every idle turn.
pub struct Spin<H: Host> {
    host: H,
    start: u64,
    last: u64,
    next_yield: u64,
    /// This wait's budget (the learned one, capped by the caller's).
    budget: u64,
    /// The profile's budget (`u64::MAX`: forever = the latency profile).
    max: u64,
    /// Gave up spinning (budget spent or contention).
    slept: bool,
    contended: bool,
    /// Began in a quiet period (no spinning at all): nothing to learn.
    quiet: bool,
    /// Counted in `Host::spinning` (until it stops spinning).
    counted: bool,
    /// Its place in the registry of the processes sharing its CPUs.
    seat: Option<Seat>,
    /// [`Host::redirected`] before the last attempt (crowded waits only).
    snap: Option<u32>,
    /// The last turn found the wait crowded or sharing its CPU turn by
    /// turn: the next one yields (no coasting, see [`Waiter::may_coast`]).
    yields_next: bool,
}

impl<H: Host> Spin<H> {
    /// Start a wait now. `max`: the profile's budget in ns (0: never spin,
    /// `u64::MAX`: forever); `cap`: the caller's own limit (its timeout).
    #[inline]
    pub fn new(host: H, max: u64, cap: u64) -> Spin<H> {
        let now = host.now_ns();
        let l = learned();
        let budget = if max == u64::MAX {
            u64::MAX
        } else if now < l.quiet_until {
            0
        } else if l.budget == 0 {
            max
        } else {
            l.budget.min(max)
        };
        let mut spins = budget != 0 && cap != 0;
        let seat = if spins { host.seat(true) } else { None };
        if let Some(Seat::Sleeper(_)) = seat {
            spins = false; // another process spins on every CPU it may use
        }
        // Yield at once only if no other thread of the process spins (the
        // thread that ran would be a sibling waiting for the same data).
        let alone = spins && host.spinning().fetch_add(1, Ordering::Relaxed) == 0;
        let next_yield = if alone && host.unpinned() {
            now
        } else {
            now + YIELD_EVERY_NS
        };
        Spin {
            host,
            start: now,
            last: now,
            next_yield,
            budget: budget.min(cap),
            max,
            slept: !spins,
            contended: false,
            quiet: !spins,
            counted: spins,
            seat,
            snap: None,
            yields_next: true,
        }
    }

    /// Stop spinning (from now on this wait sleeps).
    #[inline]
    fn stop(&mut self) {
        self.slept = true;
        if self.counted {
            self.counted = false;
            self.host.spinning().fetch_sub(1, Ordering::Relaxed);
        }
        if let Some(s @ Seat::Spinner(_)) = self.seat {
            // Marked asleep now (a crowded spinner yields to sleepers);
            // no longer watching its CPU for parked siblings.
            self.host.unwatch(s);
            self.host.leave(s);
            self.seat = self.host.seat(false);
        }
    }

    /// Other processes waiting on this one's CPUs, when as many as the
    /// CPUs (0: not crowded).
    #[inline]
    fn crowded(&self) -> u32 {
        self.seat.map_or(0, |s| self.host.crowded(s))
    }

    /// The time of the last turn (ns, the host's clock).
    #[inline]
    pub fn now(&self) -> u64 {
        self.last
    }

    /// When the wait began.
    #[inline]
    pub fn start(&self) -> u64 {
        self.start
    }

    /// ns since the wait began.
    #[inline]
    pub fn spent(&self) -> u64 {
        self.host.now_ns().wrapping_sub(self.start)
    }

    /// The host this wait asks.
    #[inline]
    pub fn host(&self) -> &H {
        &self.host
    }

    /// Another idle turn: `true` = spin on, `false` = sleep now (and from
    /// now on: once `false`, always `false`).
    #[inline]
    pub fn spin(&mut self) -> bool {
        if self.slept {
            return false;
        }
        let mut now = self.host.now_ns();
        // Crowded: pass the CPU at every turn; a gap or yield up to
        // BUSY_NS per sibling was their turns, not a CPU-bound neighbour's.
        let crowded = self.crowded();
        let busy = BUSY_NS * (1 + u64::from(crowded));
        if now.wrapping_sub(self.last) > busy {
            self.contention(now);
        } else {
            let pass = match (crowded, self.seat, self.snap) {
                (1.., Some(s @ Seat::Spinner(_)), Some(snap)) => self.host.pass(s, snap),
                _ => Pass::Off,
            };
            match pass {
                Pass::Parked => {
                    // Asleep until a frame (or the park's end): no one's
                    // slice, no contention.
                    now = self.host.now_ns();
                    self.next_yield = now + YIELD_EVERY_NS;
                }
                Pass::Watch(true) => now = self.yield_turn(now, busy),
                Pass::Watch(false) if now >= self.next_yield => now = self.yield_turn(now, busy),
                Pass::Off if now >= self.next_yield || crowded != 0 => {
                    now = self.yield_turn(now, busy)
                }
                Pass::Watch(false) | Pass::Off => {}
            }
        }
        self.last = now;
        self.yields_next = crowded != 0 || now >= self.next_yield;
        if self.contended && self.max != u64::MAX {
            self.stop();
            return false;
        }
        if self.budget != u64::MAX && now.wrapping_sub(self.start) >= self.budget {
            self.stop();
            return false;
        }
        // The count before the next attempt (a frame counted after it is
        // one a watcher wakes this wait for). Only a wait that spins
        // forever passes by hint: one with a budget sleeps when it is spent
        // (the kernel wakes it for its frame), and crowded it does better
        // yielding at every turn (docs/benchmarks.md, "Session 19: the
        // spin hint's default").
        self.snap = if crowded != 0 && self.max == u64::MAX {
            self.host.redirected()
        } else {
            None
        };
        core::hint::spin_loop();
        true
    }

    /// Offer the CPU: `sched_yield`, and notice who needed it. Returns the
    /// time after it.
    #[inline]
    fn yield_turn(&mut self, now: u64, busy: u64) -> u64 {
        self.host.sched_yield();
        let after = self.host.now_ns();
        let took = after.wrapping_sub(now);
        if took > busy {
            self.contention(after);
        }
        // Someone else ran: share the CPU turn by turn (whoever runs looks
        // once and passes); nobody did: look again later.
        self.next_yield = if took > SHARED_NS {
            after
        } else {
            after + YIELD_EVERY_NS
        };
        after
    }

    #[cold]
    fn contention(&mut self, now: u64) {
        self.contended = true;
        if self.max == u64::MAX {
            return;
        }
        let mut l = learned();
        l.quiet = if now < l.quiet_until.saturating_add(l.quiet) {
            (l.quiet * 2).clamp(QUIET_MIN_NS, QUIET_MAX_NS)
        } else {
            QUIET_MIN_NS
        };
        l.quiet_until = now + l.quiet;
        set_learned(l);
    }
}

impl<H: Host> Drop for Spin<H> {
    /// The wait is over (data, timeout or error): learn from how long it
    /// took.
    fn drop(&mut self) {
        if self.counted {
            self.host.spinning().fetch_sub(1, Ordering::Relaxed);
        }
        if let Some(s) = self.seat {
            self.host.leave(s);
        }
        if self.max == u64::MAX || self.max == 0 || self.contended || self.quiet || !self.slept {
            return; // forever, no spinning, contention handled, or caught while spinning
        }
        let waited = self.host.now_ns().wrapping_sub(self.start);
        let max = self.max;
        let mut l = learned();
        let cur = if l.budget == 0 { max } else { l.budget };
        l.budget = if waited <= max {
            (cur * 2).min(max)
        } else {
            (cur / 2).max(MIN_BUDGET_NS.min(max))
        };
        set_learned(l);
    }
}

/// What a blocking call does next (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Attempt again now.
    Spin,
    /// Sleep on the socket's fds for at most this many ns, then attempt.
    Sleep(u64),
    /// The fd was shut down by another thread since the wait began (said
    /// once): the caller decides (a receive returns what the shutdown
    /// means; a kernel socket's real call answers at once).
    Woken,
    /// The fd was closed by another thread (maybe reused): EBADF.
    Closed,
    /// A handled signal: EINTR.
    Interrupted,
    /// The caller's timeout passed: EAGAIN.
    TimedOut,
}

/// How a wait is bounded and told to stop.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The profile's spin budget in ns (0: never, `u64::MAX`: forever).
    pub spin_ns: u64,
    /// The caller's timeout in ns (0: none); also makes every handled
    /// signal interrupt the wait, SA_RESTART or not (signal(7): a socket
    /// with a timeout fails with EINTR).
    pub timeout_ns: u64,
    /// The longest sleep before the next attempt (close and shutdown by
    /// other threads, and data other threads took in for us, are seen at
    /// least this often).
    pub slice_ns: u64,
}

/// One blocking call's wait on one fd (see the module doc).
pub struct Waiter<H: Host> {
    spin: Spin<H>,
    fd: i32,
    w0: u64,
    s0: u64,
    sig_mask: u64,
    timeout_ns: u64,
    slice_ns: u64,
}

impl<H: Host> Waiter<H> {
    /// Begin waiting now on `fd`, whose table word was `w0` and the
    /// thread's signal count `s0` when the call began (a close or a signal
    /// between the call's start and its first wait counts).
    #[inline]
    pub fn new(host: H, fd: i32, w0: u64, s0: u64, l: Limits) -> Waiter<H> {
        let cap = if l.timeout_ns == 0 {
            u64::MAX
        } else {
            l.timeout_ns
        };
        Waiter {
            spin: Spin::new(host, l.spin_ns, cap),
            fd,
            w0,
            s0,
            sig_mask: if l.timeout_ns != 0 {
                u64::MAX
            } else {
                0xffff_ffff
            },
            timeout_ns: l.timeout_ns,
            slice_ns: l.slice_ns,
        }
    }

    /// The next step after an attempt that found nothing.
    #[inline]
    pub fn turn(&mut self) -> Turn {
        let host = self.spin.host();
        if (host.signal_seq() ^ self.s0) & self.sig_mask != 0 {
            return Turn::Interrupted;
        }
        let w = host.word(self.fd);
        if let Some(closed) = closed_since(self.w0, w) {
            if closed {
                return Turn::Closed;
            }
            self.w0 = w;
            return Turn::Woken;
        }
        let mut slice = self.slice_ns;
        if self.timeout_ns != 0 {
            let spent = self.spin.spent();
            if spent >= self.timeout_ns {
                return Turn::TimedOut;
            }
            slice = slice.min(self.timeout_ns - spent);
        }
        if self.spin.spin() {
            Turn::Spin
        } else {
            Turn::Sleep(slice)
        }
    }

    /// ns since the wait began.
    #[inline]
    pub fn spent(&self) -> u64 {
        self.spin.spent()
    }

    /// The host's clock as the last [`Waiter::turn`] read it: right after
    /// a turn that said [`Turn::Spin`], a reading of a moment ago (that
    /// turn read it, or after its yield), which the caller's next attempt
    /// may use instead of reading the clock again. Not after a sleep.
    #[inline]
    pub fn now(&self) -> u64 {
        self.spin.now()
    }

    /// The last [`Waiter::turn`] said spin and its next would not yield
    /// (neither crowded nor sharing the CPU turn by turn): the caller may
    /// answer a few idle turns from a lock-free look of its own without
    /// this turn (no clock, no signal count, no fd word), as long as it
    /// calls `turn` again after at most a few dozen (what it defers — a
    /// signal's EINTR, a close or shutdown by another thread, the timeout,
    /// the spin budget, the yield — is then seen that many turns late,
    /// well under a µs each).
    #[inline]
    pub fn may_coast(&self) -> bool {
        !self.spin.slept && !self.spin.yields_next
    }
}

/// A sleep slice in whole ms for `poll`/`epoll_wait`, rounded up (at least 1).
#[inline]
pub fn slice_ms(ns: u64) -> i32 {
    ns.div_ceil(1_000_000).clamp(1, i32::MAX as u64) as i32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fdtable::{C_UDP, FdTable};
    use std::cell::Cell as C;

    /// A scripted host: the clock advances `step` ns per reading, a yield
    /// takes `yield_ns`.
    struct Fake<'a> {
        now: &'a C<u64>,
        step: u64,
        yield_ns: u64,
        yields: &'a C<u32>,
        spinning: &'a AtomicU32,
        unpinned: bool,
        table: &'a FdTable,
        sig: &'a C<u64>,
        /// The registry: the seat a spinning wait gets, whether its CPU
        /// has a sleeper, and what was asked and left.
        seat: &'a C<Option<Seat>>,
        crowd: &'a C<bool>,
        log: &'a std::cell::RefCell<Vec<String>>,
        /// The hint: what `pass` answers (`None`: no hint) and how long a
        /// park sleeps.
        pass: &'a C<Option<Pass>>,
        park_ns: u64,
    }

    impl Host for &Fake<'_> {
        fn now_ns(&self) -> u64 {
            let t = self.now.get() + self.step;
            self.now.set(t);
            t
        }
        fn sched_yield(&self) {
            self.yields.set(self.yields.get() + 1);
            self.now.set(self.now.get() + self.yield_ns);
        }
        fn unpinned(&self) -> bool {
            self.unpinned
        }
        fn spinning(&self) -> &AtomicU32 {
            self.spinning
        }
        fn word(&self, fd: i32) -> u64 {
            self.table.get_now(fd)
        }
        fn signal_seq(&self) -> u64 {
            self.sig.get()
        }
        fn seat(&self, spin: bool) -> Option<Seat> {
            self.log.borrow_mut().push(format!("seat {spin}"));
            let s = self.seat.get()?;
            Some(if spin { s } else { Seat::Sleeper(1 << 1) })
        }
        fn crowded(&self, _seat: Seat) -> u32 {
            if self.crowd.get() { 3 } else { 0 }
        }
        fn leave(&self, seat: Seat) {
            self.log.borrow_mut().push(format!("leave {seat:?}"));
        }
        fn redirected(&self) -> Option<u32> {
            self.pass.get().map(|_| 7)
        }
        fn pass(&self, _seat: Seat, snap: u32) -> Pass {
            assert_eq!(snap, 7, "the count read before the last attempt");
            let p = self.pass.get().unwrap_or(Pass::Off);
            if p == Pass::Parked {
                self.now.set(self.now.get() + self.park_ns);
            }
            p
        }
        fn unwatch(&self, seat: Seat) {
            self.log.borrow_mut().push(format!("unwatch {seat:?}"));
        }
    }

    struct World {
        now: C<u64>,
        yields: C<u32>,
        spinning: AtomicU32,
        table: FdTable,
        sig: C<u64>,
        seat: C<Option<Seat>>,
        crowd: C<bool>,
        log: std::cell::RefCell<Vec<String>>,
        pass: C<Option<Pass>>,
    }

    impl World {
        fn new() -> World {
            let w = World {
                now: C::new(1_000_000_000),
                yields: C::new(0),
                spinning: AtomicU32::new(0),
                table: FdTable::new(),
                sig: C::new(0),
                seat: C::new(None),
                crowd: C::new(false),
                log: Default::default(),
                pass: C::new(None),
            };
            w.table.set(3, C_UDP, 0);
            w
        }
        fn host(&self, step: u64, yield_ns: u64) -> Fake<'_> {
            Fake {
                now: &self.now,
                step,
                yield_ns,
                yields: &self.yields,
                spinning: &self.spinning,
                unpinned: false,
                table: &self.table,
                sig: &self.sig,
                seat: &self.seat,
                crowd: &self.crowd,
                log: &self.log,
                pass: &self.pass,
                park_ns: 2_000_000,
            }
        }
    }

    fn limits(spin_ns: u64, timeout_ns: u64) -> Limits {
        Limits {
            spin_ns,
            timeout_ns,
            slice_ns: 5_000_000,
        }
    }

    #[test]
    fn no_budget_never_spins_and_learns_nothing() {
        let w = World::new();
        let h = w.host(100, 0);
        let mut s = Spin::new(&h, 0, u64::MAX);
        assert!(!s.spin());
        assert_eq!(w.spinning.load(Ordering::Relaxed), 0);
        drop(s);
        assert_eq!(learned_cell().0.get().budget, 0);
    }

    #[test]
    fn spins_until_the_budget_then_sleeps_for_good() {
        let w = World::new();
        let h = w.host(1_000, 0);
        let mut s = Spin::new(&h, 10_000, u64::MAX);
        assert_eq!(w.spinning.load(Ordering::Relaxed), 1);
        let mut turns = 0;
        while s.spin() {
            turns += 1;
        }
        assert!((8..=10).contains(&turns), "{turns}");
        assert_eq!(
            w.spinning.load(Ordering::Relaxed),
            0,
            "uncounted at the stop"
        );
        assert!(!s.spin(), "once false, always false");
    }

    #[test]
    fn the_callers_cap_bounds_the_budget() {
        let w = World::new();
        let h = w.host(1_000, 0);
        let mut s = Spin::new(&h, 1_000_000, 3_000);
        let mut turns = 0;
        while s.spin() {
            turns += 1;
        }
        assert!(turns <= 3, "{turns}");
        let mut s = Spin::new(&h, 1_000_000, 0);
        assert!(!s.spin(), "a zero cap never spins");
    }

    #[test]
    fn yields_every_20us_and_a_long_yield_is_contention() {
        let w = World::new();
        let h = w.host(1_000, 0);
        let mut s = Spin::new(&h, u64::MAX, u64::MAX);
        for _ in 0..100 {
            assert!(s.spin(), "forever spins");
        }
        let y = w.yields.get();
        assert!((3..=6).contains(&y), "{y} yields in ~100 us");
        drop(s);
        // balanced: a yield that took 200 us stops the spin and starts a
        // quiet period in which the next wait does not spin at all.
        let w = World::new();
        let h = w.host(1_000, 200_000);
        let mut s = Spin::new(&h, 500_000, u64::MAX);
        let mut turns = 0;
        while s.spin() {
            turns += 1;
        }
        assert!(turns <= 21, "{turns}");
        drop(s);
        let mut s = Spin::new(&h, 500_000, u64::MAX);
        assert!(!s.spin(), "quiet period after contention");
    }

    #[test]
    fn unpinned_alone_yields_on_the_first_turn() {
        let w = World::new();
        let mut h = w.host(1_000, 0);
        h.unpinned = true;
        let mut s = Spin::new(&h, 100_000, u64::MAX);
        assert!(s.spin());
        assert_eq!(w.yields.get(), 1);
        // A second spinner of the process does not.
        let mut s2 = Spin::new(&h, 100_000, u64::MAX);
        assert!(s2.spin());
        assert_eq!(w.yields.get(), 1);
        assert_eq!(w.spinning.load(Ordering::Relaxed), 2);
        drop((s, s2));
        assert_eq!(w.spinning.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn the_budget_halves_after_long_waits_and_doubles_after_short_ones() {
        let w = World::new();
        let h = w.host(1_000, 0);
        let max = 40_000;
        let mut s = Spin::new(&h, max, u64::MAX);
        while s.spin() {}
        w.now.set(w.now.get() + 10 * max); // slept long
        drop(s);
        assert_eq!(learned_cell().0.get().budget, max / 2);
        let mut s = Spin::new(&h, max, u64::MAX);
        let mut turns = 0;
        while s.spin() {
            turns += 1;
        }
        assert!(turns <= 20, "the learned budget applies: {turns}");
        drop(s); // woke soon after the spin: would have been caught
        assert_eq!(learned_cell().0.get().budget, max);
    }

    #[test]
    fn waiter_times_out_with_a_shrinking_slice() {
        let w = World::new();
        let h = w.host(1_000_000, 0);
        let w0 = w.table.get(3);
        let mut wt = Waiter::new(&h, 3, w0, 0, limits(0, 7_500_000));
        let mut slices = Vec::new();
        loop {
            match wt.turn() {
                Turn::Sleep(ns) => slices.push(ns),
                Turn::TimedOut => break,
                t => panic!("{t:?}"),
            }
        }
        assert!(slices.len() >= 3, "{slices:?}");
        assert!(slices.iter().all(|&s| s <= 5_000_000));
        assert!(slices.windows(2).all(|p| p[1] <= p[0]), "{slices:?}");
    }

    #[test]
    fn a_spin_turn_hands_its_clock_reading_to_the_next_attempt() {
        // After a turn that says Spin, `now` is the clock's last reading
        // (the turn's own, or the one after its yield): the attempt that
        // follows uses it instead of reading the clock again.
        let w = World::new();
        let mut h = w.host(1_000, 7_000);
        h.unpinned = true; // alone and unpinned: yields at once
        let mut wt = Waiter::new(&h, 3, w.table.get(3), 0, limits(u64::MAX, 0));
        for _ in 0..50 {
            assert_eq!(wt.turn(), Turn::Spin);
            assert_eq!(wt.now(), w.now.get());
        }
        assert!(w.yields.get() > 0, "some turns yielded");
    }

    #[test]
    fn waiter_without_timeout_sleeps_in_whole_slices() {
        let w = World::new();
        let h = w.host(1_000, 0);
        let mut wt = Waiter::new(&h, 3, w.table.get(3), 0, limits(2_000, 0));
        assert_eq!(wt.turn(), Turn::Spin);
        let mut n = 0;
        let t = loop {
            n += 1;
            match wt.turn() {
                Turn::Spin if n < 10 => {}
                t => break t,
            }
        };
        assert_eq!(t, Turn::Sleep(5_000_000));
    }

    #[test]
    fn waiter_tells_close_from_shutdown() {
        let w = World::new();
        let h = w.host(1_000, 0);
        let mut wt = Waiter::new(&h, 3, w.table.get(3), 0, limits(0, 0));
        assert!(matches!(wt.turn(), Turn::Sleep(_)));
        w.table.wake(3);
        assert_eq!(wt.turn(), Turn::Woken);
        assert!(matches!(wt.turn(), Turn::Sleep(_)), "woken is said once");
        w.table.retire(3);
        assert_eq!(wt.turn(), Turn::Closed);
        // A close between the call's start and its first wait counts.
        let w0 = w.table.get(3);
        w.table.retire(3);
        w.table.set(3, C_UDP, 0);
        let mut wt = Waiter::new(&h, 3, w0, 0, limits(0, 0));
        assert_eq!(wt.turn(), Turn::Closed);
    }

    #[test]
    fn waiter_interrupts_as_signal7_says() {
        let w = World::new();
        let h = w.host(1_000, 0);
        let w0 = w.table.get(3);
        // An SA_RESTART handler (high half only) restarts an untimed wait...
        let mut wt = Waiter::new(&h, 3, w0, 0, limits(0, 0));
        w.sig.set(1 << 32);
        assert!(matches!(wt.turn(), Turn::Sleep(_)));
        // ...but interrupts a timed one.
        let mut wt = Waiter::new(&h, 3, w0, 0, limits(0, 1_000_000_000));
        assert_eq!(wt.turn(), Turn::Interrupted);
        // A handler without SA_RESTART interrupts both.
        let mut wt = Waiter::new(&h, 3, w0, 1 << 32, limits(0, 0));
        w.sig.set((1 << 32) | 1);
        assert_eq!(wt.turn(), Turn::Interrupted);
    }

    #[test]
    fn coasting_only_between_turns_that_do_not_yield() {
        let w = World::new();
        w.seat.set(Some(Seat::Spinner(1 << 1)));
        let h = w.host(1_000, 0);
        let w0 = w.table.get(3);
        let mut wt = Waiter::new(&h, 3, w0, 0, limits(u64::MAX, 0));
        assert!(!wt.may_coast(), "not before the first turn");
        assert_eq!(wt.turn(), Turn::Spin);
        assert!(
            wt.may_coast(),
            "alone, pinned, its next turn does not yield"
        );
        // Crowded: every turn yields, none is skipped.
        w.crowd.set(true);
        assert_eq!(wt.turn(), Turn::Spin);
        assert!(!wt.may_coast());
        w.crowd.set(false);
        assert_eq!(wt.turn(), Turn::Spin);
        assert!(wt.may_coast());
        // A yield that gave the CPU away: turn by turn from then on.
        let h2 = w.host(1_000, 2 * SHARED_NS);
        let mut wt = Waiter::new(&h2, 3, w0, 0, limits(u64::MAX, 0));
        let mut shared = false;
        for _ in 0..100 {
            assert_eq!(wt.turn(), Turn::Spin);
            shared |= !wt.may_coast();
        }
        assert!(shared, "the turn after a shared yield yields too");
        // A budget spent: asleep, never coasting.
        let mut wt = Waiter::new(&h, 3, w0, 0, limits(3_000, 0));
        while wt.turn() == Turn::Spin {}
        assert!(!wt.may_coast());
    }

    #[test]
    fn latency_spins_through_contention() {
        let w = World::new();
        let h = w.host(1_000, 200_000);
        let mut s = Spin::new(&h, u64::MAX, u64::MAX);
        for _ in 0..200 {
            assert!(s.spin(), "forever keeps spinning (and yielding)");
        }
        assert!(w.yields.get() > 0);
    }

    #[test]
    fn the_quiet_period_doubles_while_contention_persists() {
        let w = World::new();
        let h = w.host(1_000, 0);
        let max = 500_000;
        let contend = |s: &mut Spin<&Fake<'_>>| {
            assert!(s.spin());
            w.now.set(w.now.get() + 2 * BUSY_NS); // preempted
            assert!(!s.spin());
        };
        let mut s = Spin::new(&h, max, u64::MAX);
        contend(&mut s);
        drop(s);
        let q1 = learned_cell().0.get().quiet;
        assert_eq!(q1, QUIET_MIN_NS);
        // The quiet period passes; contention again at once: twice as long.
        w.now.set(learned_cell().0.get().quiet_until);
        let mut s = Spin::new(&h, max, u64::MAX);
        contend(&mut s);
        drop(s);
        assert_eq!(learned_cell().0.get().quiet, 2 * QUIET_MIN_NS);
    }

    #[test]
    fn the_timeout_caps_the_spin() {
        let w = World::new();
        let h = w.host(1_000, 0);
        let mut wt = Waiter::new(&h, 3, w.table.get(3), 0, limits(u64::MAX / 2, 3_500));
        let mut spins = 0;
        let end = loop {
            match wt.turn() {
                Turn::Spin => spins += 1,
                t => break t,
            }
        };
        assert!(spins <= 2, "{spins}");
        assert!(matches!(end, Turn::Sleep(_) | Turn::TimedOut), "{end:?}");
    }

    #[test]
    fn a_wait_the_registry_refuses_sleeps_at_once_and_learns_nothing() {
        let w = World::new();
        w.seat.set(Some(Seat::Sleeper(1 << 1)));
        let h = w.host(1_000, 0);
        let before = learned();
        let mut s = Spin::new(&h, u64::MAX, u64::MAX);
        assert!(!s.spin());
        assert_eq!(w.spinning.load(Ordering::Relaxed), 0);
        assert_eq!(w.yields.get(), 0);
        drop(s);
        assert_eq!(*w.log.borrow(), ["seat true", "leave Sleeper(2)"]);
        let after = learned();
        assert_eq!((before.budget, before.quiet), (after.budget, after.quiet));
    }

    #[test]
    fn a_crowded_spinner_yields_at_every_turn_and_siblings_are_no_contention() {
        let w = World::new();
        w.seat.set(Some(Seat::Spinner(1 << 1)));
        let h = w.host(1_000, 0);
        let mut s = Spin::new(&h, 500_000, u64::MAX);
        for _ in 0..10 {
            assert!(s.spin());
        }
        assert_eq!(w.yields.get(), 0, "alone on its CPU: no yield in 10 us");
        w.crowd.set(true);
        for _ in 0..10 {
            assert!(s.spin());
        }
        assert_eq!(w.yields.get(), 10, "a yield per turn");
        // Three siblings took 350 us between two turns: spin on (balanced
        // stops at a gap over BUSY_NS when alone).
        w.now.set(w.now.get() + 350_000);
        assert!(s.spin());
        drop(s);
        assert_eq!(*w.log.borrow(), ["seat true", "leave Spinner(2)"]);
        let mut s = Spin::new(&h, 500_000, u64::MAX);
        assert!(s.spin(), "no quiet period after the siblings' turns");
        // More than BUSY_NS per sibling: a CPU-bound neighbour ran.
        w.now.set(w.now.get() + 450_000);
        assert!(!s.spin());
        drop(s);
        // Alone (after the quiet period): a gap over BUSY_NS is contention.
        w.crowd.set(false);
        w.now.set(learned().quiet_until);
        let mut s = Spin::new(&h, 500_000, u64::MAX);
        assert!(s.spin());
        w.now.set(w.now.get() + 150_000);
        assert!(!s.spin());
    }

    #[test]
    fn a_crowded_spinner_passes_by_hint_watching_without_yields_and_a_park_is_no_contention() {
        let w = World::new();
        w.seat.set(Some(Seat::Spinner(1 << 1)));
        w.crowd.set(true);
        w.pass.set(Some(Pass::Watch(false)));
        let h = w.host(1_000, 0);
        // A wait that spins forever (the latency profile) passes by hint.
        let mut s = Spin::new(&h, u64::MAX, u64::MAX);
        assert!(s.spin());
        assert_eq!(w.yields.get(), 1, "no count read yet: a crowded yield");
        for _ in 0..10 {
            assert!(s.spin());
        }
        assert_eq!(
            w.yields.get(),
            1,
            "watching, nobody's frame: no yield in 10 us"
        );
        for _ in 0..30 {
            assert!(s.spin());
        }
        let y = w.yields.get();
        assert!(
            (2..=3).contains(&y),
            "watching: a yield every 20 us as alone, {y} in 40 turns"
        );
        // It woke a parked sibling: it yields to it at once.
        w.pass.set(Some(Pass::Watch(true)));
        assert!(s.spin());
        assert_eq!(w.yields.get(), y + 1);
        // Parked for 2 ms (over BUSY_NS per sibling): no contention, no
        // yield.
        w.pass.set(Some(Pass::Parked));
        assert!(s.spin());
        assert!(s.spin());
        assert_eq!(w.yields.get(), y + 1);
        drop(s);
        // The caller's 5 ms timeout ends a forever wait: it stops, ending
        // its watch.
        let mut s = Spin::new(&h, u64::MAX, 5_000_000);
        assert!(s.spin());
        w.now.set(w.now.get() + 10_000_000);
        assert!(!s.spin());
        assert!(w.log.borrow().contains(&"unwatch Spinner(2)".to_string()));
        // Without a hint (pass Off): a yield at every crowded turn.
        drop(s);
        w.pass.set(Some(Pass::Off));
        let y = w.yields.get();
        let mut s = Spin::new(&h, u64::MAX, u64::MAX);
        for _ in 0..5 {
            assert!(s.spin());
        }
        assert_eq!(w.yields.get(), y + 5);
    }

    #[test]
    fn a_crowded_wait_with_a_budget_yields_at_every_turn_and_never_passes_by_hint() {
        let w = World::new();
        w.seat.set(Some(Seat::Spinner(1 << 1)));
        w.crowd.set(true);
        // The hint is there and would watch (no yield for 20 us)...
        w.pass.set(Some(Pass::Watch(false)));
        let h = w.host(1_000, 0);
        // ...but a wait with a budget (balanced: 500 us) does not ask it.
        let mut s = Spin::new(&h, 500_000, u64::MAX);
        for _ in 0..10 {
            assert!(s.spin());
        }
        assert_eq!(w.yields.get(), 10, "a yield at every crowded turn");
        // A 150 us gap is a sibling's turn (BUSY_NS per process waiting
        // there), not contention: it spins on.
        w.now.set(w.now.get() + 150_000);
        assert!(s.spin());
        // The budget still ends it.
        while s.spin() {}
        assert!(s.spent() >= 500_000);
    }

    #[test]
    fn a_spinner_that_stops_is_marked_asleep() {
        let w = World::new();
        w.seat.set(Some(Seat::Spinner(1 << 1)));
        let h = w.host(1_000, 0);
        let mut s = Spin::new(&h, 10_000, u64::MAX);
        while s.spin() {}
        drop(s);
        assert_eq!(
            *w.log.borrow(),
            [
                "seat true",
                "unwatch Spinner(2)",
                "leave Spinner(2)",
                "seat false",
                "leave Sleeper(2)"
            ]
        );
    }

    #[test]
    fn slices_round_up_to_whole_ms() {
        assert_eq!(slice_ms(0), 1);
        assert_eq!(slice_ms(1), 1);
        assert_eq!(slice_ms(5_000_000), 5);
        assert_eq!(slice_ms(5_000_001), 6);
        assert_eq!(slice_ms(u64::MAX), i32::MAX);
    }
}
