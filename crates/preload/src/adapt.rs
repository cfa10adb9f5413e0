//! Adaptive spinning: when a waiting thread busy-polls, and when it gives
//! the CPU up.
//!
//! Spinning removes the ~20 µs it costs to wake a sleeping vCPU, but only
//! while the spinner has a CPU nobody else needs. A spinner never sleeps,
//! so it never gets the scheduler's wake-up preference: when another thread
//! is runnable on its CPU (the peer it waits for, a JIT or GC thread, a
//! second spinner) that thread runs only when the spinner's slice ends
//! (EEVDF's base slice is 0.75 ms), and every round trip pays for it. That
//! is how a spinning program became up to 28x slower than plainly
//! (docs/perf-runtimes.md).
//!
//! The policy, per waiting thread:
//! * **Yield, and notice who needed the CPU.** Every `YIELD_EVERY_NS` of
//!   spinning the thread calls `sched_yield()`. With nobody else runnable
//!   on its CPU that returns in well under a microsecond; if it took longer
//!   than `BUSY_NS`, another thread ran meanwhile. A gap of more than
//!   `BUSY_NS` between two turns of the loop means the same (we were
//!   preempted: the hypervisor or the scheduler gave the CPU to someone).
//! * **Contended: sleep.** `balanced` and `throughput` stop spinning at the
//!   first sign of contention and sleep in the kernel (so the wake-up comes
//!   with the scheduler's preference), and do not spin again for a quiet
//!   period that doubles while contention persists (1 ms .. 64 ms).
//!   `latency` keeps spinning but still yields, so a runnable peer on the
//!   same CPU gets it within `YIELD_EVERY_NS`.
//! * **Learn the budget from the gaps.** A wait that reached the sleep but
//!   got its data within the profile's budget (`spin_us`) would have been
//!   caught by spinning longer: the thread's budget doubles (up to
//!   `spin_us`). A wait that lasted longer than `spin_us` anyway spun for
//!   nothing: the budget halves (down to `MIN_BUDGET_NS`). Spinning only as
//!   long as data usually comes keeps the CPU for the program's other
//!   threads.
//! * **Unpinned, yield at once.** A thread the scheduler may place anywhere,
//!   and the only one of its process spinning at the time, yields on the
//!   first idle turn of a wait, not after `YIELD_EVERY_NS`:
//!   the scheduler puts a task woken by a send on the sender's CPU, so the
//!   peer this thread just sent to (or the program's own thread it just
//!   woke) is often queued right behind it, and runs now instead of 20 µs
//!   later (unpinned JVM NIO at 1 in flight: run/plain 1.26-1.64 -> 0.68-1.05,
//!   docs/perf-runtimes.md, session 4). Pinned threads keep the 20 µs: on a
//!   loaded machine an early yield hands their CPU to unrelated work and
//!   turns short waits into sleeps (pinned Python asyncio and the C program
//!   at 1 in flight, 3-5x slower with it); threads that spin together (a
//!   pool sharing a socket) would only hand the CPU to each other (the
//!   unpinned C program at 1 in flight: 2.7x slower with it).

use crate::spin::{SPIN_NS, now_ns};
use std::cell::Cell;
use std::sync::atomic::{AtomicU32, Ordering};

/// Threads of this process spinning right now (in a `Wait` that has not
/// given up spinning).
static SPINNING: AtomicU32 = AtomicU32::new(0);

/// How often a spinning thread offers its CPU.
const YIELD_EVERY_NS: u64 = 20_000;
/// A `sched_yield` (or a gap between two turns) longer than this means
/// another thread held this CPU for a good while: a CPU-bound neighbour
/// (or the hypervisor) that takes whole slices, against which a spinner
/// loses, where a sleeper would be woken with the scheduler's preference.
/// Shorter yields are a peer or a sibling thread doing a little work
/// (sending, handing a socket over): spinning still pays then.
const BUSY_NS: u64 = 100_000;
/// A `sched_yield` longer than this gave the CPU to another thread (alone,
/// it returns in well under a microsecond).
const SHARED_NS: u64 = 4_000;
/// Smallest learned budget: one look after a yield.
const MIN_BUDGET_NS: u64 = 5_000;
/// Quiet period after contention: starts at QUIET_MIN, doubles to QUIET_MAX.
const QUIET_MIN_NS: u64 = 1_000_000;
const QUIET_MAX_NS: u64 = 64_000_000;

#[derive(Clone, Copy)]
struct Learned {
    /// Learned budget in ns (0 = not yet initialised: the profile's).
    budget: u64,
    /// No spinning before this time (after contention).
    quiet_until: u64,
    /// Length of the current quiet period.
    quiet: u64,
}

thread_local! {
    /// This thread's affinity: 0 = not asked yet, 1 = one CPU, 2 = more.
    static AFFINITY: Cell<u8> = const { Cell::new(0) };
    static LEARNED: Cell<Learned> = const {
        Cell::new(Learned { budget: 0, quiet_until: 0, quiet: 0 })
    };
}

/// May this thread run on more than one CPU (asked once per thread)?
#[inline]
fn unpinned() -> bool {
    AFFINITY.with(|a| {
        if a.get() == 0 {
            let n = rustix::thread::sched_getaffinity(None).map_or(1, |s| s.count());
            a.set(if n > 1 { 2 } else { 1 });
        }
        a.get() == 2
    })
}

/// One wait of one thread: ask `spin()` on every idle turn.
pub struct Wait {
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
    /// Counted in `SPINNING` (until it stops spinning).
    counted: bool,
}

impl Wait {
    /// Start a wait now; `cap`: the caller's own limit in ns (its timeout).
    #[inline]
    pub fn new(cap: u64) -> Wait {
        let now = now_ns();
        let max = SPIN_NS.load(Ordering::Relaxed);
        let l = LEARNED.with(|c| c.get());
        let budget = if max == u64::MAX {
            u64::MAX
        } else if now < l.quiet_until {
            0
        } else if l.budget == 0 {
            max
        } else {
            l.budget.min(max)
        };
        let spins = budget != 0 && cap != 0;
        // Yield at once only if no other thread of the process spins (the
        // thread that ran would be a sibling waiting for the same data).
        let alone = spins && SPINNING.fetch_add(1, Ordering::Relaxed) == 0;
        Wait {
            start: now,
            last: now,
            next_yield: if alone && unpinned() {
                now
            } else {
                now + YIELD_EVERY_NS
            },
            budget: budget.min(cap),
            max,
            slept: !spins,
            contended: false,
            quiet: !spins,
            counted: spins,
        }
    }

    /// Stop spinning (from now on this wait sleeps).
    #[inline]
    fn stop(&mut self) {
        self.slept = true;
        if self.counted {
            self.counted = false;
            SPINNING.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The time of the last turn (ns, `now_ns()` clock).
    #[inline]
    pub fn now(&self) -> u64 {
        self.last
    }

    /// ns since the wait began.
    #[inline]
    pub fn spent(&self) -> u64 {
        now_ns().wrapping_sub(self.start)
    }

    /// Another idle turn: `true` = spin on, `false` = sleep now (and from
    /// now on: once `false`, always `false`).
    #[inline]
    pub fn spin(&mut self) -> bool {
        if self.slept {
            return false;
        }
        let mut now = now_ns();
        if now.wrapping_sub(self.last) > BUSY_NS {
            self.contention(now);
        } else if now >= self.next_yield {
            rustix::thread::sched_yield();
            let after = now_ns();
            let took = after.wrapping_sub(now);
            if took > BUSY_NS {
                self.contention(after);
            }
            now = after;
            // Someone else ran: share the CPU turn by turn (a spinner that
            // looks once and yields is a cooperative scheduler for the
            // threads waiting on this CPU: whoever runs takes the datagram,
            // and the thread with work gets the CPU within a round);
            // nobody did: look again in YIELD_EVERY_NS.
            self.next_yield = if took > SHARED_NS {
                now
            } else {
                now + YIELD_EVERY_NS
            };
        }
        self.last = now;
        if self.contended && self.max != u64::MAX {
            self.stop();
            return false;
        }
        if self.budget != u64::MAX && now.wrapping_sub(self.start) >= self.budget {
            self.stop();
            return false;
        }
        core::hint::spin_loop();
        true
    }

    #[cold]
    fn contention(&mut self, now: u64) {
        self.contended = true;
        if self.max == u64::MAX {
            return;
        }
        LEARNED.with(|c| {
            let mut l = c.get();
            l.quiet = if now < l.quiet_until.saturating_add(l.quiet) {
                (l.quiet * 2).clamp(QUIET_MIN_NS, QUIET_MAX_NS)
            } else {
                QUIET_MIN_NS
            };
            l.quiet_until = now + l.quiet;
            c.set(l);
        });
    }
}

impl Drop for Wait {
    /// The wait is over (data, timeout or error): learn from how long it
    /// took.
    fn drop(&mut self) {
        if self.counted {
            SPINNING.fetch_sub(1, Ordering::Relaxed);
        }
        if self.max == u64::MAX || self.max == 0 || self.contended || self.quiet || !self.slept {
            return; // forever, no spinning, contention handled, or caught while spinning
        }
        let waited = now_ns().wrapping_sub(self.start);
        LEARNED.with(|c| {
            let mut l = c.get();
            let cur = if l.budget == 0 { self.max } else { l.budget };
            l.budget = if waited <= self.max {
                (cur * 2).min(self.max)
            } else {
                (cur / 2).max(MIN_BUDGET_NS.min(self.max))
            };
            c.set(l);
        });
    }
}
