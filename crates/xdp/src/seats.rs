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

use crate::ctl::Ctl;
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
}

impl Seats {
    pub(crate) fn new(ctl: Arc<Ctl>) -> Seats {
        Seats {
            bit: 1u32.checked_shl(ctl.slot).unwrap_or(0),
            ctl,
            count: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU32::new(0))),
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
/// every CPU).
pub(crate) fn clear_slot(ctl: &Ctl, slot: u32) {
    let bit = 1u32.checked_shl(slot).unwrap_or(0);
    for cpu in 0..CPUS {
        for sleeping in [false, true] {
            ctl.word(off(cpu, sleeping))
                .fetch_and(!bit, Ordering::AcqRel);
        }
    }
}

/// One CPU of the registry as the service sees it: the slots spinning and
/// sleeping there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuSeats {
    pub cpu: u32,
    pub spinning: Vec<u32>,
    pub sleeping: Vec<u32>,
}

/// The CPUs with a member waiting on them.
pub(crate) fn view(ctl: &Ctl) -> Vec<CpuSeats> {
    let slots = |m: u32| (0..32).filter(|b| m & (1 << b) != 0).collect::<Vec<u32>>();
    (0..CPUS)
        .filter_map(|cpu| {
            let s = ctl.word(off(cpu, false)).load(Ordering::Acquire);
            let z = ctl.word(off(cpu, true)).load(Ordering::Acquire);
            (s | z != 0).then(|| CpuSeats {
                cpu,
                spinning: slots(s),
                sleeping: slots(z),
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
                sleeping: vec![1]
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
}
