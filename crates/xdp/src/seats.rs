//! The spinner registry of a shared UMEM (issue 23): processes on the
//! engine service that share CPUs know of each other and pass the CPU
//! along instead of each spinning as if alone.
//!
//! Four servers pinned to one CPU, each spinning in its receive: a datagram
//! for one of them waits until the scheduler has run the others' idle
//! turns, and the adaptive waiter, which takes a `sched_yield` or a gap
//! over 100 µs for a CPU-bound neighbour, stops spinning and sleeps for a
//! quiet period (1-64 ms) whenever its siblings' turns add up to that: the
//! four then wake through the kernel for every datagram (measured: 24-28 µs
//! p50 at load 12 against 11-13 µs while they spin, docs/benchmarks.md
//! "Session 16: the service's shared CPUs"). The registry lives in the
//! header page of the control area (`ctl.rs`, mapped by every member of the
//! UMEM's trust group and by the service), per CPU (the first [`CPUS`]) two
//! bitmasks of slots (`MAX_SLOTS` = 32 bits):
//!
//! * **spinning**: the members whose wait spins on that CPU (a thread's
//!   affinity: every CPU it may run on),
//! * **sleeping**: the members whose wait gave up spinning and sleeps.
//!
//! A wait is **crowded** when the other members on its CPUs are at least
//! as many as its CPUs ([`Seats::crowded`]). A crowded spinner hands the
//! CPU over at every idle turn (a sibling with a datagram runs next, a
//! sleeper the kernel just woke runs at once), and a yield or gap is
//! contention only beyond 100 µs per member waiting there (its siblings'
//! turns are not a CPU-bound neighbour's slice; the budget still bounds the
//! spin). A
//! member alone on its CPUs spins exactly as before. Threads of one process
//! count once (process-local counts). The service clears a dead process's
//! bits when its control socket closes (kill -9: [`clear_slot`]) and shows
//! the registry in its status ([`view`]). Writing garbage here hurts only
//! the trust group, as the lock word next to it always could.
//!
//! **Passing the CPU by hint** (session 17). A crowded spinner that yields
//! at every idle turn lets the scheduler pick who runs next: with four
//! members on one CPU a datagram waits for its owner's turn in the
//! rotation. With the steering program's per-socket count of frames
//! steered to it (steer.c `nw_ready`, mapped read-only here; counted as the
//! socket is chosen, so a frame then dropped or passed to the kernel costs
//! one spurious wake-up, after which the member's snapshot includes it) a
//! member pinned
//! to one CPU of a single-queue UMEM sees its siblings' frames arrive:
//!
//! * one member per CPU **watches** it ([`Seats::pass`], the per-CPU watch
//!   word): it spins without yielding while nobody has a frame, and when a
//!   parked sibling's count moved past what that sibling had seen, it wakes
//!   it (a futex wake on the sibling's park word, a wake-up on this CPU:
//!   no interrupt from the CPU the frame came in on) and yields to it:
//!   the only other runnable member;
//! * the others **park**: they note the count they had seen before their
//!   last look at their ring and sleep on their park word (at most
//!   [`PARK_NS`], then look again). A watcher whose heartbeat stopped for
//!   [`STALE_US`] (busy elsewhere, preempted, killed) is replaced by the
//!   next member that looks; one that stops spinning wakes every parked
//!   sibling ([`Seats::unwatch`]), as the service does for a dead one.
//!
//! The per-slot park counts (`parks`, `handoffs`) are in the status.

use crate::ctl::Ctl;
use crate::mmap::Mmap;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

/// CPUs in the registry (a thread allowed on a CPU beyond them spins as
/// alone).
pub const CPUS: u32 = 64;
/// Offset of the registry in the control area's header page: per CPU the
/// spinning mask (u32) then the sleeping mask (u32).
pub(crate) const O_SEATS: usize = 1024;

fn off(cpu: u32, sleeping: bool) -> usize {
    O_SEATS + 8 * cpu as usize + if sleeping { 4 } else { 0 }
}

/// Per CPU: slot + 1 of the member watching it (0: none).
const O_WATCH: usize = O_SEATS + 8 * CPUS as usize;
/// Per CPU: the watcher's heartbeat (µs of the monotonic clock, low 32 bits).
const O_BEAT: usize = O_WATCH + 4 * CPUS as usize;
/// Per slot, a line each: park word (+0: 1 = parked), the frame count it
/// had seen when it parked (+4), its parks (+8), the watcher's hand-offs to
/// it (+12). The header page holds [`crate::ctl::MAX_SLOTS`] of them.
const O_PARK: usize = 2048;
const PARK_LINE: usize = 64;
const _: () = assert!(O_BEAT + 4 * CPUS as usize <= O_PARK);
const _: () = assert!(O_PARK + PARK_LINE * crate::ctl::MAX_SLOTS as usize <= crate::ctl::PAGE);

fn park_off(slot: u32, field: usize) -> usize {
    O_PARK + PARK_LINE * slot as usize + 4 * field
}
const P_WORD: usize = 0;
const P_SEEN: usize = 1;
const P_PARKS: usize = 2;
const P_HANDOFFS: usize = 3;

/// The longest park: then the member looks at its ring (and at the
/// watcher's heartbeat) again.
pub const PARK_NS: u64 = 200_000;
/// A watcher whose heartbeat is older than this is replaced.
pub const STALE_US: u32 = 1_000;

/// Entries of steer.c's `nw_ready` (slot * 64 + queue), u32 values 8
/// bytes apart (an array map rounds its values up to 8 bytes).
const READY_KEYS: usize = 4096;
const READY_STRIDE: usize = 8;

/// What [`Seats::pass`] did on a crowded idle turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Passed {
    /// No hint here (no count map, several queues, several CPUs): yield as
    /// a crowded spinner does.
    Off,
    /// This member watches the CPU: it woke `woke` parked siblings with a
    /// frame (then yield to them) or none (spin on).
    Watching { woke: u32 },
    /// It slept on its park word: `woken` by the watcher (for a frame, or
    /// as its watch ended) or a frame came as it parked; else its park ran
    /// out.
    Parked { woken: bool },
}

/// The futex word at `w` (a shared mapping: not FUTEX_PRIVATE).
fn futex(w: &AtomicU32, op: libc::c_int, val: u32, ns: u64) -> libc::c_long {
    let ts = libc::timespec {
        tv_sec: (ns / 1_000_000_000) as _,
        tv_nsec: (ns % 1_000_000_000) as _,
    };
    // SAFETY: FUTEX_WAIT/FUTEX_WAKE on an aligned u32 of a live shared
    // mapping; the timeout is on the stack (ignored by FUTEX_WAKE).
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            w.as_ptr(),
            op,
            val,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0,
        )
    }
}

fn wake(w: &AtomicU32) {
    futex(w, libc::FUTEX_WAKE, 1, 0);
}

/// Wake every member parked on the CPUs of `cpus` except `but` (a mask of
/// slot bits): the watch ended.
fn wake_parked(ctl: &Ctl, cpus: impl Iterator<Item = u32>, but: u32) {
    let mut on = 0u32;
    for cpu in cpus {
        on |= ctl.word(off(cpu, false)).load(Ordering::Acquire);
    }
    for s in (0..32).filter(|s| (on & !but) & (1 << s) != 0) {
        let p = ctl.word(park_off(s, P_WORD));
        if p.swap(0, Ordering::AcqRel) == 1 {
            wake(p);
        }
    }
}

/// The CPUs of `mask`, lowest first.
fn cpus(mut mask: u64) -> impl Iterator<Item = u32> {
    std::iter::from_fn(move || {
        (mask != 0).then(|| {
            let c = mask.trailing_zeros();
            mask &= mask - 1;
            c
        })
    })
}

/// This process's view of the registry (one per attached engine).
pub struct Seats {
    ctl: Arc<Ctl>,
    /// This process's bit in the masks (its slot's).
    bit: u32,
    /// Threads of this process spinning / sleeping on each CPU.
    count: [[AtomicU32; CPUS as usize]; 2],
    /// steer.c's `nw_ready` (read-only), when the hint applies (one queue).
    ready: Option<Mmap>,
    /// The longest park ([`PARK_NS`]; longer in tests).
    park_ns: u64,
}

impl Seats {
    pub(crate) fn new(ctl: Arc<Ctl>) -> Seats {
        Seats {
            bit: 1u32.checked_shl(ctl.slot).unwrap_or(0),
            ctl,
            count: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU32::new(0))),
            ready: None,
            park_ns: PARK_NS,
        }
    }

    /// Read the frames redirected per socket from `ready` (steer.c's
    /// `nw_ready`, from the service) to pass the CPU by hint; `queues`: the
    /// UMEM's (the hint is for one queue only: a parked member is woken
    /// for its queue 0 only). Without it (an older service, several queues,
    /// a failed mapping) crowded waits yield as before.
    pub fn with_hint(mut self, ready: Option<BorrowedFd<'_>>, queues: usize) -> Seats {
        let slot = self.ctl.slot;
        if queues != 1 || slot >= crate::ctl::MAX_SLOTS {
            return self;
        }
        let len = READY_KEYS * READY_STRIDE;
        self.ready = ready.and_then(|fd| Mmap::map_read_only(len, fd.as_raw_fd()).ok());
        if self.ready.is_some() {
            // A new process in this slot: its counts start at zero.
            for f in [P_WORD, P_SEEN, P_PARKS, P_HANDOFFS] {
                self.ctl.word(park_off(slot, f)).store(0, Ordering::Relaxed);
            }
        }
        self
    }

    /// The frames redirected to `slot`'s socket on queue 0 so far.
    #[inline]
    fn ready_of(r: &Mmap, slot: u32) -> u32 {
        let o = READY_STRIDE * ((slot as usize) << 6);
        debug_assert!(o + 4 <= r.len);
        // SAFETY: slot < MAX_SLOTS, so the value is inside the mapping of
        // READY_KEYS values (8-byte aligned); it lives as long as self.
        unsafe { &*(r.ptr.add(o) as *const AtomicU32) }.load(Ordering::Acquire)
    }

    /// This process's count of frames redirected to it, when the hint
    /// applies: read before each look at the ring, handed to
    /// [`Seats::pass`] (a frame counted after it is one the watcher wakes
    /// this process for).
    #[inline]
    pub fn redirected(&self) -> Option<u32> {
        self.ready
            .as_ref()
            .map(|r| Self::ready_of(r, self.ctl.slot))
    }

    /// A crowded idle turn of a wait on the CPUs of `mask`: watch the CPU
    /// (wake a parked sibling that has a frame) or park until woken (see
    /// the module doc). `snap`: [`Seats::redirected`] before the last look
    /// at the ring; `now_us`: the monotonic clock in µs.
    pub fn pass(&self, mask: u64, snap: u32, now_us: u32) -> Passed {
        let Some(r) = self.ready.as_ref() else {
            return Passed::Off;
        };
        if mask.count_ones() != 1 {
            return Passed::Off;
        }
        let cpu = mask.trailing_zeros();
        let me = self.ctl.slot + 1;
        let w = self.ctl.word(O_WATCH + 4 * cpu as usize);
        let beat = self.ctl.word(O_BEAT + 4 * cpu as usize);
        let cur = w.load(Ordering::Acquire);
        let mine = cur == me
            || (cur == 0 || now_us.wrapping_sub(beat.load(Ordering::Relaxed)) > STALE_US)
                && w.compare_exchange(cur, me, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok();
        if mine {
            beat.store(now_us, Ordering::Relaxed);
            let on = self.ctl.word(off(cpu, false)).load(Ordering::Relaxed) & !self.bit;
            let mut woke = 0;
            for s in (0..32).filter(|s| on & (1 << s) != 0) {
                let p = self.ctl.word(park_off(s, P_WORD));
                if p.load(Ordering::Acquire) == 1
                    && Self::ready_of(r, s)
                        != self.ctl.word(park_off(s, P_SEEN)).load(Ordering::Relaxed)
                    && p.compare_exchange(1, 0, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                {
                    self.ctl
                        .word(park_off(s, P_HANDOFFS))
                        .fetch_add(1, Ordering::Relaxed);
                    wake(p);
                    woke += 1;
                }
            }
            return Passed::Watching { woke };
        }
        let slot = self.ctl.slot;
        let p = self.ctl.word(park_off(slot, P_WORD));
        self.ctl
            .word(park_off(slot, P_SEEN))
            .store(snap, Ordering::Relaxed);
        p.store(1, Ordering::SeqCst);
        if Self::ready_of(r, slot) != snap || w.load(Ordering::SeqCst) == 0 {
            p.store(0, Ordering::Relaxed);
            return Passed::Parked { woken: true };
        }
        self.ctl
            .word(park_off(slot, P_PARKS))
            .fetch_add(1, Ordering::Relaxed);
        futex(p, libc::FUTEX_WAIT, 1, self.park_ns);
        Passed::Parked {
            woken: p.swap(0, Ordering::AcqRel) == 0,
        }
    }

    /// This process's wait on `mask` stops spinning: if it watches a CPU of
    /// it, the watch ends and every sibling parked there is woken.
    pub fn unwatch(&self, mask: u64) {
        if self.ready.is_none() {
            return;
        }
        let me = self.ctl.slot + 1;
        for cpu in cpus(mask) {
            let w = self.ctl.word(O_WATCH + 4 * cpu as usize);
            if w.compare_exchange(me, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                wake_parked(&self.ctl, std::iter::once(cpu), self.bit);
            }
        }
    }

    /// A wait on the CPUs of `mask` (bits of CPUs below [`CPUS`]) spins
    /// (`sleeping` false) or sleeps from now on: marked on each.
    pub fn take(&self, mask: u64, sleeping: bool) {
        for cpu in cpus(mask) {
            if self.count[sleeping as usize][cpu as usize].fetch_add(1, Ordering::AcqRel) == 0 {
                self.ctl
                    .word(off(cpu, sleeping))
                    .fetch_or(self.bit, Ordering::AcqRel);
            }
        }
    }

    /// That wait ends (or stops spinning).
    pub fn leave(&self, mask: u64, sleeping: bool) {
        for cpu in cpus(mask) {
            // Never below 0 (marked on an earlier registry).
            let dec = |v: u32| v.checked_sub(1);
            let c = &self.count[sleeping as usize][cpu as usize];
            if c.fetch_update(Ordering::AcqRel, Ordering::Acquire, dec) == Ok(1) {
                self.ctl
                    .word(off(cpu, sleeping))
                    .fetch_and(!self.bit, Ordering::AcqRel);
            }
        }
    }

    /// How many other members wait on the CPUs of `mask`, when they are at
    /// least as many as those CPUs (0: not crowded)? Two loads per CPU of
    /// a line written only when a member's wait begins or ends.
    #[inline]
    pub fn crowded(&self, mask: u64) -> u32 {
        let mut others = 0u32;
        for cpu in cpus(mask) {
            others |= self.ctl.word(off(cpu, false)).load(Ordering::Relaxed)
                | self.ctl.word(off(cpu, true)).load(Ordering::Relaxed);
        }
        let n = (others & !self.bit).count_ones();
        if n >= mask.count_ones() { n } else { 0 }
    }
}

static SEATS: AtomicPtr<Seats> = AtomicPtr::new(std::ptr::null_mut());

/// The registry of this process's engine on the service, if any.
#[inline]
pub fn seats() -> Option<&'static Seats> {
    let p = SEATS.load(Ordering::Acquire);
    // SAFETY: a published `Seats` is leaked (never freed: a wait may hold
    // a reference across an unpublish), so a non-null pointer stays valid.
    unsafe { p.as_ref() }
}

/// Keeps a registry published while its engine lives.
pub struct Published(*mut Seats);

// SAFETY: only compared with the global pointer on drop; the `Seats` it
// names is leaked and itself Sync (atomics and an Arc<Ctl>).
unsafe impl Send for Published {}
// SAFETY: as above.
unsafe impl Sync for Published {}

/// Make `s` this process's registry (the last attached engine's).
pub fn publish(s: Seats) -> Published {
    let p = Box::into_raw(Box::new(s));
    SEATS.store(p, Ordering::Release);
    Published(p)
}

impl Drop for Published {
    fn drop(&mut self) {
        let _ = SEATS.compare_exchange(
            self.0,
            std::ptr::null_mut(),
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }
}

/// The service's half: forget the dead process in `slot` (its marks on
/// every CPU, its watch: the members it watched for are woken).
pub(crate) fn clear_slot(ctl: &Ctl, slot: u32) {
    let bit = 1u32.checked_shl(slot).unwrap_or(0);
    for cpu in 0..CPUS {
        for sleeping in [false, true] {
            ctl.word(off(cpu, sleeping))
                .fetch_and(!bit, Ordering::AcqRel);
        }
        let w = ctl.word(O_WATCH + 4 * cpu as usize);
        if w.compare_exchange(slot + 1, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            wake_parked(ctl, std::iter::once(cpu), bit);
        }
    }
    if slot < crate::ctl::MAX_SLOTS {
        ctl.word(park_off(slot, P_WORD)).store(0, Ordering::Release);
    }
}

/// One CPU of the registry as the service sees it: the slots spinning and
/// sleeping there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuSeats {
    pub cpu: u32,
    pub spinning: Vec<u32>,
    pub sleeping: Vec<u32>,
    /// The slot watching the CPU (passing it by hint), if any.
    pub watcher: Option<u32>,
    /// Per slot on the CPU: (slot, parks, hand-offs to it by a watcher).
    pub passes: Vec<(u32, u32, u32)>,
}

/// The CPUs with a member waiting on them.
pub(crate) fn view(ctl: &Ctl) -> Vec<CpuSeats> {
    let slots = |m: u32| (0..32).filter(|b| m & (1 << b) != 0).collect::<Vec<u32>>();
    (0..CPUS)
        .filter_map(|cpu| {
            let s = ctl.word(off(cpu, false)).load(Ordering::Acquire);
            let z = ctl.word(off(cpu, true)).load(Ordering::Acquire);
            let w = ctl.word(O_WATCH + 4 * cpu as usize).load(Ordering::Acquire);
            let count = |slot, f| ctl.word(park_off(slot, f)).load(Ordering::Relaxed);
            (s | z != 0).then(|| CpuSeats {
                cpu,
                spinning: slots(s),
                sleeping: slots(z),
                watcher: w.checked_sub(1),
                passes: slots(s | z)
                    .into_iter()
                    .map(|slot| (slot, count(slot, P_PARKS), count(slot, P_HANDOFFS)))
                    .collect(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctl::Geometry;

    fn area() -> (std::os::fd::OwnedFd, Geometry) {
        crate::ctl::test_area(4)
    }

    #[test]
    fn members_on_one_cpu_are_crowded_and_a_dead_ones_marks_go() {
        use std::os::fd::AsRawFd;
        let (fd, geo) = area();
        let map = |slot| Arc::new(Ctl::map(fd.as_raw_fd(), geo, slot).unwrap());
        let (a, b, c) = (Seats::new(map(0)), Seats::new(map(1)), Seats::new(map(2)));
        let svc = Ctl::map(fd.as_raw_fd(), geo, crate::ctl::SERVICE_ID).unwrap();
        let cpu1 = 1 << 1;
        a.take(cpu1, false);
        assert_eq!(a.crowded(cpu1), 0, "alone on CPU 1");
        assert_eq!(a.crowded(0b11), 0);
        b.take(cpu1, false);
        assert_eq!((a.crowded(cpu1), b.crowded(cpu1)), (1, 1), "two on one CPU");
        assert_eq!(c.crowded(0b11), 2, "two others on its two CPUs");
        assert_eq!(c.crowded(1 << 1), 2);
        assert_eq!(a.crowded(1 << 0), 0, "nobody on CPU 0");
        // A second thread of a: one mark, gone with the last thread.
        a.take(cpu1, false);
        a.leave(cpu1, false);
        assert_eq!(view(&svc)[0].spinning, vec![0, 1]);
        // b stops spinning and sleeps: still counted on the CPU.
        b.leave(cpu1, false);
        b.take(cpu1, true);
        assert_eq!(a.crowded(cpu1), 1);
        assert_eq!(
            view(&svc),
            vec![CpuSeats {
                cpu: 1,
                spinning: vec![0],
                sleeping: vec![1],
                watcher: None,
                passes: vec![(0, 0, 0), (1, 0, 0)],
            }]
        );
        // b dies (kill -9): the service clears its marks.
        clear_slot(&svc, 1);
        assert_eq!(a.crowded(cpu1), 0);
        a.leave(cpu1, false);
        a.leave(cpu1, false); // never below zero
        assert!(view(&svc).is_empty());
        a.take(cpu1, false);
        assert_eq!(view(&svc)[0].spinning, vec![0]);
    }

    /// Passing the CPU by hint, asserted by the counts the status shows: a
    /// watcher hands the CPU only to a parked sibling whose frame count
    /// moved, a frame counted as one parks stops the park, a stale watcher
    /// is replaced, and a watch that ends (or a killed watcher, cleared by
    /// the service) wakes the parked.
    #[test]
    fn a_watcher_wakes_only_the_parked_sibling_whose_frame_came_and_a_dead_one_leaves_no_watch() {
        use std::os::fd::{AsFd, AsRawFd};
        let (fd, geo) = area();
        let ready = crate::ctl::test_memfd(READY_KEYS * READY_STRIDE);
        let map = |slot| Arc::new(Ctl::map(fd.as_raw_fd(), geo, slot).unwrap());
        let hinted = |slot| {
            let mut s = Seats::new(map(slot)).with_hint(Some(ready.as_fd()), 1);
            s.park_ns = 60_000_000_000; // only a wake ends a park here
            s
        };
        let (a, b, c) = (hinted(0), hinted(1), hinted(2));
        let svc = Ctl::map(fd.as_raw_fd(), geo, crate::ctl::SERVICE_ID).unwrap();
        // The steering program's side: a frame for `slot` on queue 0.
        let counts = Mmap::map(READY_KEYS * READY_STRIDE, Some((ready.as_raw_fd(), 0))).unwrap();
        let frame_for = |slot: usize| {
            // SAFETY: inside the mapping, 8-byte aligned.
            let n = unsafe { &*(counts.ptr.add(READY_STRIDE * (slot << 6)) as *const AtomicU32) };
            n.fetch_add(1, Ordering::AcqRel);
        };
        let cpu1 = 1 << 1;
        let passes = |slot: u32| {
            let v = view(&svc);
            let p = v[0].passes.iter().find(|p| p.0 == slot).copied().unwrap();
            (p.1, p.2)
        };
        for s in [&a, &b, &c] {
            s.take(cpu1, false);
        }
        // Several CPUs, or no count map: no hint.
        assert_eq!(a.pass(0b11, 0, 0), Passed::Off);
        assert_eq!(Seats::new(map(3)).pass(cpu1, 0, 0), Passed::Off);
        // The first to look watches.
        assert_eq!(a.pass(cpu1, 0, 10), Passed::Watching { woke: 0 });
        assert_eq!(view(&svc)[0].watcher, Some(0));
        // A frame counted after b's snapshot: b does not park at all.
        let snap = b.redirected().unwrap();
        frame_for(1);
        assert_eq!(b.pass(cpu1, snap, 20), Passed::Parked { woken: true });
        assert_eq!(passes(1), (0, 0));
        std::thread::scope(|t| {
            let (b, c) = (&b, &c);
            let pb = t.spawn(move || b.pass(cpu1, b.redirected().unwrap(), 30));
            let pc = t.spawn(move || c.pass(cpu1, c.redirected().unwrap(), 30));
            while passes(1).0 + passes(2).0 < 2 {
                std::thread::yield_now();
            }
            // Nobody's frame: nobody woken.
            assert_eq!(a.pass(cpu1, 0, 40), Passed::Watching { woke: 0 });
            // c's frame: only c is handed the CPU.
            frame_for(2);
            assert_eq!(a.pass(cpu1, 0, 50), Passed::Watching { woke: 1 });
            assert_eq!(pc.join().unwrap(), Passed::Parked { woken: true });
            assert_eq!((passes(1), passes(2)), ((1, 0), (1, 1)));
            assert!(!pb.is_finished(), "b had no frame");
            // The watch ends (a stops spinning): b is woken.
            a.unwatch(cpu1);
            assert_eq!(pb.join().unwrap(), Passed::Parked { woken: true });
            assert_eq!(view(&svc)[0].watcher, None);
        });
        // c watches now; its heartbeat stops: b takes over after STALE_US.
        assert_eq!(c.pass(cpu1, 0, 100), Passed::Watching { woke: 0 });
        assert_eq!(view(&svc)[0].watcher, Some(2));
        assert_eq!(
            b.pass(cpu1, b.redirected().unwrap(), 100 + STALE_US + 1),
            Passed::Watching { woke: 0 }
        );
        assert_eq!(view(&svc)[0].watcher, Some(1));
        // b (the watcher) is killed with c parked: the service clears the
        // watch and wakes c.
        std::thread::scope(|t| {
            let c = &c;
            let pc = t.spawn(move || c.pass(cpu1, c.redirected().unwrap(), 2000));
            while passes(2).0 < 2 {
                std::thread::yield_now();
            }
            clear_slot(&svc, 1);
            assert_eq!(pc.join().unwrap(), Passed::Parked { woken: true });
        });
        assert_eq!(view(&svc)[0].watcher, None);
        assert_eq!(view(&svc)[0].spinning, vec![0, 2]);
    }
}
