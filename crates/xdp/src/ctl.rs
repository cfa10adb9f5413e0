//! The layout of a UMEM shared by several processes on one (interface,
//! queue) and its control area ([`Ctl`]: the lock word, the RX frames'
//! owner marks, each slot's refill journal and TX-completion mailbox), as
//! every party maps it. The protocol is described in `shared.rs`;
//! both the service's half (`shared`) and the process's half
//! (`xsk::XskSocket::attach_shared`) build on this module.

use crate::mmap::Mmap;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU32, Ordering};

/// Frames a process gives back to the fill ring at once (one lock turn).
pub const REFILL_BATCH: usize = 32;
/// Most processes (slots) that may share one UMEM.
pub const MAX_SLOTS: u32 = 32;
/// Lock holder id of the service itself.
pub(crate) const SERVICE_ID: u32 = u32::MAX;
pub(crate) const MAGIC: u32 = 0x6e77_7531; // "nwu1"
pub(crate) const PAGE: usize = 4096;
/// Control area: header page (magic, lock word, the spinner registry at
/// `seats::O_SEATS`), then the owner table, then per-slot areas.
pub(crate) const O_MAGIC: usize = 0;
pub(crate) const O_LOCK: usize = 64;
pub(crate) const OWNER_OFF: usize = PAGE;
/// Per slot: mailbox producer (+0), consumer (+64), journal count (+128),
/// journal start (+132), journal entries (+192, REFILL_BATCH u64s), mailbox
/// entries (+512, tx_per_slot u64s).
pub(crate) const S_MB_PROD: usize = 0;
pub(crate) const S_MB_CONS: usize = 64;
pub(crate) const S_J_N: usize = 128;
pub(crate) const S_J_START: usize = 132;
pub(crate) const S_J_ADDR: usize = 192;
pub(crate) const S_MB: usize = 512;

/// The layout every party of a shared UMEM agrees on (sent by the service
/// with the UMEM's file and the control area's memfd; validated by the
/// receiver before mapping anything).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// RX frames: the fill ring's depth (power of two).
    pub rx_frames: u32,
    /// TX frames of each slot (power of two).
    pub tx_per_slot: u32,
    /// Slots (processes) the UMEM has room for (power of two).
    pub slots: u32,
    /// Frame size: 2048 or 4096.
    pub frame_size: u32,
}

impl Geometry {
    pub fn validate(&self) -> Result<(), String> {
        let p2 = |n: &str, v: u32, lo: u32, hi: u32| {
            if v.is_power_of_two() && (lo..=hi).contains(&v) {
                Ok(())
            } else {
                Err(format!(
                    "shared UMEM: {n} {v} is not a power of two in {lo}..={hi}"
                ))
            }
        };
        p2("rx frames", self.rx_frames, 128, 1 << 18)?;
        p2("tx frames per slot", self.tx_per_slot, 64, 4096)?;
        p2("slots", self.slots, 1, MAX_SLOTS)?;
        if self.frame_size != 2048 && self.frame_size != 4096 {
            return Err(format!(
                "shared UMEM: frame size {} is not 2048 or 4096",
                self.frame_size
            ));
        }
        Ok(())
    }
    /// TX frames of all slots (the completion ring's depth).
    pub fn tx_frames(&self) -> u32 {
        self.tx_per_slot * self.slots
    }
    /// Depth of each member's RX ring: half the RX frames, so one stalled
    /// process can strand at most half of them on its ring (the kernel
    /// drops for that socket alone once its ring is full).
    pub fn member_rx(&self) -> u32 {
        self.rx_frames / 2
    }
    pub fn umem_len(&self) -> usize {
        (self.rx_frames as usize + self.tx_frames() as usize) * self.frame_size as usize
    }
    fn slot_stride(&self) -> usize {
        (S_MB + 8 * self.tx_per_slot as usize).next_multiple_of(64)
    }
    pub(crate) fn slot_off(&self, slot: u32) -> usize {
        (OWNER_OFF + 4 * self.rx_frames as usize).next_multiple_of(64)
            + slot as usize * self.slot_stride()
    }
    /// Bytes of the control area: a sealed memfd of its own, apart from
    /// the UMEM's file (which may be on a huge tmpfs, where no seal keeps
    /// a holder from truncating it: the service maps only this one).
    pub fn ctl_len(&self) -> usize {
        self.slot_off(self.slots).next_multiple_of(PAGE)
    }
    /// Frame indices `[lo, hi)` of `slot`'s TX frames.
    pub fn tx_range(&self, slot: u32) -> (u64, u64) {
        let lo = u64::from(self.rx_frames) + u64::from(slot) * u64::from(self.tx_per_slot);
        (lo, lo + u64::from(self.tx_per_slot))
    }
}

/// The control area of a shared UMEM, as one party maps it.
pub(crate) struct Ctl {
    map: Mmap,
    pub(crate) geo: Geometry,
    /// This party's slot (`SERVICE_ID` for the service).
    pub(crate) slot: u32,
    frame_shift: u32,
    /// Test hook (issue 24, `NANOWIRE_TEST_STOP_IN_LOCK=N`, read at map
    /// time, never for the service): the Nth time this party takes the
    /// lock it stops itself (SIGSTOP) holding it, for a test to kill it
    /// there. 0: off (one branch per lock taken).
    stop_at: u32,
    taken: AtomicU32,
}

// SAFETY: the mapping is shared memory reached only through atomics (lock,
// owner marks, indices) and the mailbox/journal protocol documented above.
unsafe impl Send for Ctl {}
// SAFETY: as above.
unsafe impl Sync for Ctl {}

/// The lock, released on drop.
pub(crate) struct Held<'a>(&'a Ctl);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.word(O_LOCK).store(0, Ordering::Release);
    }
}

impl Ctl {
    pub(crate) fn map(fd: RawFd, geo: Geometry, slot: u32) -> io::Result<Ctl> {
        let map = Mmap::map(geo.ctl_len(), Some((fd, 0)))?;
        let stop_at = if slot == SERVICE_ID {
            0
        } else {
            std::env::var("NANOWIRE_TEST_STOP_IN_LOCK")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        Ok(Ctl {
            map,
            geo,
            slot,
            frame_shift: geo.frame_size.trailing_zeros(),
            stop_at,
            taken: AtomicU32::new(0),
        })
    }

    #[inline]
    pub(crate) fn word(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off + 4 <= self.map.len && off.is_multiple_of(4));
        // SAFETY: every offset used is inside the mapping (ctl_len covers the
        // header, the owner table and every slot area) and 4-byte aligned;
        // the mapping lives as long as self.
        unsafe { &*(self.map.ptr.add(off) as *const AtomicU32) }
    }
    #[inline]
    pub(crate) fn u64_at(&self, off: usize) -> *mut u64 {
        assert!(off + 8 <= self.map.len && off.is_multiple_of(8));
        // SAFETY: checked just above to lie inside the mapping, aligned.
        unsafe { self.map.ptr.add(off) as *mut u64 }
    }
    #[inline]
    pub(crate) fn id(&self) -> u32 {
        if self.slot == SERVICE_ID {
            SERVICE_ID
        } else {
            self.slot + 1
        }
    }

    pub(crate) fn try_lock(&self) -> Option<Held<'_>> {
        self.word(O_LOCK)
            .compare_exchange(0, self.id(), Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| {
                if self.stop_at != 0 {
                    self.test_stop();
                }
                Held(self)
            })
    }

    #[cold]
    fn test_stop(&self) {
        if self.taken.fetch_add(1, Ordering::Relaxed) + 1 == self.stop_at {
            // SAFETY: kill has no memory preconditions; it stops this
            // process until a SIGCONT or SIGKILL.
            unsafe { libc::kill(libc::getpid(), libc::SIGSTOP) };
        }
    }

    /// Owner mark of the RX frame at `addr` (ignored outside the RX frames).
    #[inline]
    pub(crate) fn mark(&self, addr: u64, mine: bool) {
        let f = (addr >> self.frame_shift) as usize;
        if f < self.geo.rx_frames as usize {
            self.word(OWNER_OFF + 4 * f)
                .store(if mine { self.id() } else { 0 }, Ordering::Relaxed);
        }
    }

    /// Write the refill journal of this party's slot (under the lock).
    pub(crate) fn journal(&self, start: u32, addrs: &[u64]) {
        let base = self.geo.slot_off(self.slot);
        self.word(base + S_J_N).store(0, Ordering::Relaxed);
        for (i, a) in addrs.iter().take(REFILL_BATCH).enumerate() {
            // SAFETY: entry i < REFILL_BATCH of this slot's journal, inside
            // the mapping (u64_at asserts it).
            unsafe { self.u64_at(base + S_J_ADDR + 8 * i).write(*a) };
        }
        self.word(base + S_J_START).store(start, Ordering::Relaxed);
        self.word(base + S_J_N)
            .store(addrs.len().min(REFILL_BATCH) as u32, Ordering::Release);
    }
    pub(crate) fn journal_done(&self) {
        let base = self.geo.slot_off(self.slot);
        self.word(base + S_J_N).store(0, Ordering::Release);
    }

    /// Post a completed TX frame into `slot`'s mailbox (under the lock).
    pub(crate) fn mb_push(&self, slot: u32, addr: u64) -> bool {
        if slot >= self.geo.slots {
            return false;
        }
        let base = self.geo.slot_off(slot);
        let p = self.word(base + S_MB_PROD).load(Ordering::Relaxed);
        let c = self.word(base + S_MB_CONS).load(Ordering::Acquire);
        let t = self.geo.tx_per_slot;
        if p.wrapping_sub(c) >= t {
            return false;
        }
        let i = (p & (t - 1)) as usize;
        // SAFETY: slot < slots, i < tx_per_slot: inside this slot's mailbox.
        unsafe { self.u64_at(base + S_MB + 8 * i).write(addr) };
        self.word(base + S_MB_PROD)
            .store(p.wrapping_add(1), Ordering::Release);
        true
    }

    /// Take this party's mailbox (no lock: single consumer).
    pub(crate) fn mb_drain(&self, mut f: impl FnMut(u64)) -> u32 {
        let base = self.geo.slot_off(self.slot);
        let mut c = self.word(base + S_MB_CONS).load(Ordering::Relaxed);
        let p = self.word(base + S_MB_PROD).load(Ordering::Acquire);
        let t = self.geo.tx_per_slot;
        let n = p.wrapping_sub(c).min(t);
        for _ in 0..n {
            let i = (c & (t - 1)) as usize;
            // SAFETY: i < tx_per_slot: inside this slot's mailbox.
            f(unsafe { self.u64_at(base + S_MB + 8 * i).read() });
            c = c.wrapping_add(1);
        }
        if n > 0 {
            self.word(base + S_MB_CONS).store(c, Ordering::Release);
        }
        n
    }
}

/// A memfd of `len` bytes (unit tests' control areas).
#[cfg(test)]
pub(crate) fn test_memfd(len: usize) -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    // SAFETY: a NUL-terminated name; checked below.
    let raw = unsafe { libc::memfd_create(c"nw-test".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(raw >= 0);
    // SAFETY: a fresh descriptor we own; ftruncate on it.
    unsafe {
        assert_eq!(libc::ftruncate(raw, len as libc::off_t), 0);
        std::os::fd::OwnedFd::from_raw_fd(raw)
    }
}

/// A control area of `slots` slots (128 RX frames, 64 TX frames a slot,
/// 2 KiB frames) in a memfd, and its geometry (unit tests').
#[cfg(test)]
pub(crate) fn test_area(slots: u32) -> (std::os::fd::OwnedFd, Geometry) {
    let geo = Geometry {
        rx_frames: 128,
        tx_per_slot: 64,
        slots,
        frame_size: 2048,
    };
    (test_memfd(geo.ctl_len()), geo)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    const GEO: Geometry = Geometry {
        rx_frames: 1024,
        tx_per_slot: 64,
        slots: 4,
        frame_size: 2048,
    };

    #[test]
    fn geometry_is_validated_and_laid_out_without_overlap() {
        assert!(GEO.validate().is_ok());
        assert!(Geometry { slots: 3, ..GEO }.validate().is_err());
        assert!(Geometry { slots: 64, ..GEO }.validate().is_err());
        assert!(
            Geometry {
                frame_size: 1000,
                ..GEO
            }
            .validate()
            .is_err()
        );
        assert!(
            Geometry {
                tx_per_slot: 32,
                ..GEO
            }
            .validate()
            .is_err()
        );
        assert_eq!(GEO.umem_len(), (1024 + 256) * 2048);
        assert!(GEO.slot_off(0) >= OWNER_OFF + 4 * 1024);
        assert!(GEO.slot_off(1) - GEO.slot_off(0) >= S_MB + 8 * 64);
        assert!(GEO.ctl_len() >= GEO.slot_off(4));
        assert_eq!(GEO.tx_range(0), (1024, 1088));
        assert_eq!(GEO.tx_range(3), (1024 + 192, 1024 + 256));
    }

    #[test]
    fn two_parties_share_the_lock_mailboxes_and_marks() {
        let fd = test_memfd(GEO.ctl_len());
        let a = Ctl::map(fd.as_raw_fd(), GEO, 0).unwrap();
        let b = Ctl::map(fd.as_raw_fd(), GEO, 1).unwrap();
        // One holder at a time, across mappings.
        let h = a.try_lock().unwrap();
        assert!(b.try_lock().is_none());
        assert!(a.try_lock().is_none(), "not reentrant");
        drop(h);
        let h = b.try_lock().unwrap();
        // a posts b's completed TX frames into b's mailbox (under the lock).
        assert!(a.mb_push(1, 0x1234_0000));
        assert!(a.mb_push(1, 0x1234_0800));
        assert!(!a.mb_push(4, 0), "no slot 4");
        drop(h);
        let mut got = Vec::new();
        assert_eq!(b.mb_drain(|x| got.push(x)), 2);
        assert_eq!(got, vec![0x1234_0000, 0x1234_0800]);
        assert_eq!(b.mb_drain(|_| panic!("empty")), 0);
        // A mailbox never holds more than the slot's frames.
        for i in 0..64 {
            assert!(a.mb_push(1, i));
        }
        assert!(!a.mb_push(1, 99), "full");
        assert_eq!(b.mb_drain(|_| {}), 64);
        // Marks are per frame, by slot; outside the RX frames ignored.
        a.mark(5 * 2048 + 256, true);
        b.mark(6 * 2048 + 256, true);
        a.mark(u64::MAX, true);
        let w = |f: usize| a.word(OWNER_OFF + 4 * f).load(Ordering::Relaxed);
        assert_eq!((w(5), w(6), w(7)), (1, 2, 0));
        a.mark(5 * 2048, false);
        assert_eq!(w(5), 0);
        // The journal of a's slot.
        a.journal(77, &[2048, 4096]);
        let base = GEO.slot_off(0);
        assert_eq!(a.word(base + S_J_N).load(Ordering::Relaxed), 2);
        assert_eq!(a.word(base + S_J_START).load(Ordering::Relaxed), 77);
        a.journal_done();
        assert_eq!(a.word(base + S_J_N).load(Ordering::Relaxed), 0);
    }
}
