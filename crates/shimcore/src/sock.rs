//! What every engine socket record of the shim keeps about its fd, whatever
//! the protocol: the application's view of the socket that the kernel
//! socket under the fd does not hold (it is non-blocking underneath, and
//! the engine, not the kernel, serves receives, timeouts and shutdown),
//! and who may use the record.
//!
//! The UDP record (`accel::Accel`) and the TCP record (`tcpx::Tcp`) each
//! embed one [`Common`]; `fcntl`, `ioctl(FIONBIO)`, `setsockopt(SO_RCVTIMEO
//! / SO_SNDTIMEO)`, `shutdown`, `dup` and `close` act on it the same way
//! for both. Every field is a plain load or store on the data path (no
//! read-modify-write except the reference count, which changes only at
//! `dup`/`close`).
//!
//! Records are type-stable (see [`crate::pool`]): a record whose last fd
//! closed is reused for a later socket, never returned to the allocator.
//! Its *generation* (bumped by [`Common::end`], in the same word as the
//! reference count) names one incarnation: a lookup reads it with the
//! record, and whatever the caller then does on the record is checked
//! against it, so a thread that still holds a record another thread
//! closed and reused sees the mismatch (the fd is closed, for it) instead
//! of the new socket.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// `MSG_DONTWAIT` (Linux, every architecture).
pub const MSG_DONTWAIT: i32 = 0x40;

/// The per-fd state every engine socket record shares (see the module doc).
pub struct Common {
    /// The application's O_NONBLOCK (the kernel socket under the fd is
    /// always non-blocking).
    nonblock: AtomicBool,
    /// SO_RCVTIMEO in ns (0: none).
    rcvtimeo_ns: AtomicU64,
    /// SO_SNDTIMEO in ns (0: none).
    sndtimeo_ns: AtomicU64,
    /// `shutdown(SHUT_RD)` was called: an empty receive returns 0.
    rd_shut: AtomicBool,
    /// The generation (bits 32..64: the record's incarnation) and the fds
    /// that refer to it (bits 0..32: `dup`, `dup2`, `F_DUPFD`), in one
    /// word: a duplicate is counted only on the incarnation it looked up
    /// ([`Common::add_ref_if`]).
    life: AtomicU64,
    /// The process that made the record (a forked child sees its parent's
    /// records and must not use the parent's engine through them).
    pid: AtomicU32,
    /// The socket's handle in the page shared with forked children (the
    /// shim's `forkshare`), 0 if it was never shared across fork.
    share: AtomicU64,
}

const REFS: u64 = 0xffff_ffff;

impl Common {
    /// A record made by process `pid` for one fd, with the application's
    /// blocking mode and receive timeout as the kernel socket had them.
    pub fn new(pid: u32, nonblock: bool, rcvtimeo_ns: u64) -> Common {
        Common {
            nonblock: AtomicBool::new(nonblock),
            rcvtimeo_ns: AtomicU64::new(rcvtimeo_ns),
            sndtimeo_ns: AtomicU64::new(0),
            rd_shut: AtomicBool::new(false),
            life: AtomicU64::new(1),
            pid: AtomicU32::new(pid),
            share: AtomicU64::new(0),
        }
    }

    /// A record ended by [`Common::end`] starts its next incarnation, as
    /// [`Common::new`] would make it (one ref, the generation kept). Only
    /// for the thread that took the record from its pool: no fd names it
    /// yet, so the only readers are threads that looked up an earlier
    /// incarnation, and they check the generation.
    pub fn reset(&self, pid: u32, nonblock: bool, rcvtimeo_ns: u64) {
        self.pid.store(pid, Ordering::Relaxed);
        self.set_nonblock(nonblock);
        self.set_rcvtimeo_ns(rcvtimeo_ns);
        self.set_sndtimeo_ns(0);
        self.rd_shut.store(false, Ordering::Relaxed);
        self.share.store(0, Ordering::Relaxed);
        let g = self.life.load(Ordering::Acquire) & !REFS;
        self.life.store(g | 1, Ordering::Release);
    }

    /// The record's generation (its incarnation; see the module doc).
    #[inline(always)]
    pub fn generation(&self) -> u32 {
        (self.life.load(Ordering::Acquire) >> 32) as u32
    }

    /// End incarnation `generation`: no fd refers to it any more (the last
    /// one closed, or the caller took every fd off it), so the record may
    /// be reused. The generation moves on and the count is 0: a thread
    /// that looked up this incarnation now sees a mismatch. Exactly one
    /// caller ends an incarnation: `false` when it was ended already (or
    /// is another one).
    pub fn end(&self, generation: u32) -> bool {
        let mut w = self.life.load(Ordering::Acquire);
        loop {
            if (w >> 32) as u32 != generation {
                return false;
            }
            let next = u64::from(generation.wrapping_add(1)) << 32;
            match self
                .life
                .compare_exchange_weak(w, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(now) => w = now,
            }
        }
    }

    /// Usable by process `pid_now` (not a forked child's inherited copy).
    #[inline(always)]
    pub fn mine(&self, pid_now: u32) -> bool {
        self.pid() == pid_now
    }

    /// No process uses the record any more (its connection moved to
    /// another process's engine): every lookup sees someone else's copy.
    pub fn disown(&self) {
        self.pid.store(0, Ordering::Release);
    }

    /// The process that made the record.
    #[inline(always)]
    pub fn pid(&self) -> u32 {
        self.pid.load(Ordering::Relaxed)
    }

    /// The socket's handle in the page shared with forked children, 0 if
    /// it was never shared across fork.
    #[inline(always)]
    pub fn share(&self) -> u64 {
        self.share.load(Ordering::Acquire)
    }

    pub fn set_share(&self, h: u64) {
        self.share.store(h, Ordering::Release);
    }

    /// Set the handle, returning the one it replaces.
    pub fn swap_share(&self, h: u64) -> u64 {
        self.share.swap(h, Ordering::AcqRel)
    }

    /// The application's O_NONBLOCK.
    #[inline(always)]
    pub fn nonblock(&self) -> bool {
        self.nonblock.load(Ordering::Relaxed)
    }

    pub fn set_nonblock(&self, on: bool) {
        self.nonblock.store(on, Ordering::Relaxed);
    }

    /// Does a call with `flags` return at once instead of waiting (the
    /// fd is non-blocking, or the call says MSG_DONTWAIT)?
    #[inline(always)]
    pub fn dontwait(&self, flags: i32) -> bool {
        flags & MSG_DONTWAIT != 0 || self.nonblock()
    }

    /// SO_RCVTIMEO in ns (0: none).
    #[inline(always)]
    pub fn rcvtimeo_ns(&self) -> u64 {
        self.rcvtimeo_ns.load(Ordering::Relaxed)
    }

    pub fn set_rcvtimeo_ns(&self, ns: u64) {
        self.rcvtimeo_ns.store(ns, Ordering::Relaxed);
    }

    /// SO_SNDTIMEO in ns (0: none).
    #[inline(always)]
    pub fn sndtimeo_ns(&self) -> u64 {
        self.sndtimeo_ns.load(Ordering::Relaxed)
    }

    pub fn set_sndtimeo_ns(&self, ns: u64) {
        self.sndtimeo_ns.store(ns, Ordering::Relaxed);
    }

    /// Copy the application's options (blocking mode, timeouts) from
    /// another record: a socket that moves from one record to another
    /// keeps them.
    pub fn take_options_from(&self, o: &Common) {
        self.set_nonblock(o.nonblock());
        self.set_rcvtimeo_ns(o.rcvtimeo_ns());
        self.set_sndtimeo_ns(o.sndtimeo_ns());
    }

    /// Has `shutdown(SHUT_RD)` been called?
    #[inline(always)]
    pub fn rd_shut(&self) -> bool {
        self.rd_shut.load(Ordering::Relaxed)
    }

    pub fn shut_rd(&self) {
        self.rd_shut.store(true, Ordering::Relaxed);
    }

    /// One more fd refers to the record (a record that is never reused).
    pub fn add_ref(&self) {
        self.life.fetch_add(1, Ordering::AcqRel);
    }

    /// One more fd refers to incarnation `generation` of the record (dup of
    /// an fd that names it). `false`: that incarnation has no fd any more
    /// (its last fd closed meanwhile, or it ended): the duplicate does not
    /// name it, as a dup racing the close of its source finds nothing.
    pub fn add_ref_if(&self, generation: u32) -> bool {
        let mut w = self.life.load(Ordering::Acquire);
        loop {
            if (w >> 32) as u32 != generation || w & REFS == 0 || w & REFS == REFS {
                return false;
            }
            match self
                .life
                .compare_exchange_weak(w, w + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(now) => w = now,
            }
        }
    }

    /// One fd stops referring to the record: was it the last one? (The
    /// caller took the fd's slot, so the record is the incarnation the fd
    /// named; a count already 0 stays 0.)
    pub fn release(&self) -> bool {
        let mut w = self.life.load(Ordering::Acquire);
        loop {
            if w & REFS == 0 {
                return false;
            }
            match self
                .life
                .compare_exchange_weak(w, w - 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return w & REFS == 1,
                Err(now) => w = now,
            }
        }
    }

    /// One fd stops referring to the record: is the engine object now to
    /// be closed by process `pid_now` (the last fd, and the record is this
    /// process's: a forked child never closes its parent's engine object)?
    pub fn release_last_mine(&self, pid_now: u32) -> bool {
        self.release() && self.mine(pid_now)
    }

    /// F_GETFL as the application sees it when the kernel socket under the
    /// fd stays non-blocking whatever it says: the kernel's flags `kernel`
    /// with O_NONBLOCK (`bit`) as the application set it.
    pub fn getfl_view(&self, kernel: i32, bit: i32) -> i32 {
        (kernel & !bit) | if self.nonblock() { bit } else { 0 }
    }

    /// F_SETFL with `arg`: the flags the kernel socket takes (O_NONBLOCK,
    /// `bit`, kept on when `hidden`: the kernel socket stays non-blocking).
    /// After the kernel took them, [`Common::setfl_done`] records the
    /// application's mode.
    pub fn setfl_under(arg: u64, bit: u64, hidden: bool) -> u64 {
        if hidden { arg | bit } else { arg }
    }

    /// The kernel took F_SETFL `arg`: the application's O_NONBLOCK is what
    /// it asked for.
    pub fn setfl_done(&self, arg: u64, bit: u64) {
        self.set_nonblock(arg & bit != 0);
    }

    /// fds referring to the record now.
    pub fn refs(&self) -> u32 {
        (self.life.load(Ordering::Acquire) & REFS) as u32
    }
}

/// A `struct timeval` (seconds, microseconds) as nanoseconds, as the kernel
/// reads SO_RCVTIMEO/SO_SNDTIMEO after accepting it: negative parts count
/// as 0, the result saturates.
pub fn timeval_ns(sec: i64, usec: i64) -> u64 {
    (sec.max(0) as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add((usec.max(0) as u64).saturating_mul(1000))
}

/// [`timeval_ns`] of the `struct timeval` in `bytes` (native byte order,
/// 64-bit `time_t` and `suseconds_t`, as on every 64-bit Linux); 0 when
/// `bytes` is shorter than one.
pub fn timeval_bytes_ns(bytes: &[u8]) -> u64 {
    let (Some(s), Some(u)) = (bytes.get(0..8), bytes.get(8..16)) else {
        return 0;
    };
    let word = |b: &[u8]| {
        let mut w = [0u8; 8];
        w.copy_from_slice(b);
        i64::from_ne_bytes(w)
    };
    timeval_ns(word(s), word(u))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_record_has_one_ref_and_the_kernels_mode() {
        let c = Common::new(7, true, 5_000);
        assert!(c.nonblock());
        assert_eq!(c.rcvtimeo_ns(), 5_000);
        assert_eq!(c.sndtimeo_ns(), 0);
        assert!(!c.rd_shut());
        assert_eq!(c.refs(), 1);
        assert_eq!(c.pid(), 7);
    }

    #[test]
    fn a_forked_child_does_not_use_its_parents_record() {
        let c = Common::new(100, false, 0);
        assert!(c.mine(100));
        assert!(!c.mine(101));
    }

    #[test]
    fn dontwait_is_the_flag_or_the_fds_mode() {
        let c = Common::new(1, false, 0);
        assert!(!c.dontwait(0));
        assert!(c.dontwait(MSG_DONTWAIT));
        assert!(!c.dontwait(0x100)); // MSG_WAITALL is not MSG_DONTWAIT
        c.set_nonblock(true);
        assert!(c.dontwait(0));
        c.set_nonblock(false);
        assert!(!c.dontwait(0));
    }

    #[test]
    fn the_last_fd_of_this_process_closes_the_engine_object() {
        let c = Common::new(9, false, 0);
        assert!(c.add_ref_if(0)); // dup
        assert_eq!(c.refs(), 2);
        assert!(!c.release_last_mine(9));
        assert!(c.release_last_mine(9));
    }

    #[test]
    fn a_childs_last_close_leaves_the_parents_engine_object() {
        let c = Common::new(9, false, 0);
        assert!(!c.release_last_mine(10));
        assert_eq!(c.refs(), 0);
    }

    #[test]
    fn an_ended_incarnation_takes_no_duplicate_and_no_second_end() {
        let c = Common::new(3, true, 7);
        c.shut_rd();
        let g = c.generation();
        assert!(c.release());
        assert!(
            !c.add_ref_if(g),
            "its last fd closed: a racing dup finds nothing"
        );
        assert!(c.end(g));
        assert!(!c.end(g), "ended once");
        assert_eq!(c.generation(), g + 1);
        assert_eq!(c.refs(), 0);
        assert!(!c.release(), "no count below 0");
        // Reused: a fresh record of the next generation.
        c.reset(4, false, 0);
        assert_eq!((c.refs(), c.generation(), c.pid()), (1, g + 1, 4));
        assert!(!c.nonblock() && !c.rd_shut() && c.rcvtimeo_ns() == 0);
        assert!(!c.add_ref_if(g), "a stale lookup's dup is refused");
        assert!(c.add_ref_if(g + 1));
        assert_eq!(c.refs(), 2);
    }

    #[test]
    fn an_incarnation_ended_while_fds_remain_forgets_them() {
        // A connection handed over to the kernel: its fds were taken off
        // the record, whatever the count said.
        let c = Common::new(1, false, 0);
        assert!(c.add_ref_if(0));
        assert!(c.end(0));
        assert_eq!((c.refs(), c.generation()), (0, 1));
    }

    #[test]
    fn generations_wrap() {
        let c = Common::new(1, false, 0);
        c.life.store(u64::from(u32::MAX) << 32, Ordering::Relaxed);
        assert!(c.end(u32::MAX));
        assert_eq!(c.generation(), 0);
    }

    #[test]
    fn shutdown_rd_sticks() {
        let c = Common::new(1, false, 0);
        c.shut_rd();
        assert!(c.rd_shut());
        c.set_nonblock(true);
        assert!(c.rd_shut());
    }

    #[test]
    fn options_move_with_the_socket() {
        let a = Common::new(1, true, 3);
        a.set_sndtimeo_ns(4);
        let b = Common::new(1, false, 0);
        b.take_options_from(&a);
        assert!(b.nonblock());
        assert_eq!((b.rcvtimeo_ns(), b.sndtimeo_ns()), (3, 4));
        assert_eq!(b.refs(), 1);
    }

    const O_NONBLOCK: i32 = 0o4000;
    const O_APPEND: i32 = 0o2000;

    #[test]
    fn getfl_reports_the_applications_mode_over_the_kernels() {
        let c = Common::new(1, false, 0);
        let kernel = 2 | O_NONBLOCK | O_APPEND; // O_RDWR, non-blocking underneath
        assert_eq!(c.getfl_view(kernel, O_NONBLOCK), 2 | O_APPEND);
        c.set_nonblock(true);
        assert_eq!(c.getfl_view(2, O_NONBLOCK), 2 | O_NONBLOCK);
    }

    #[test]
    fn setfl_keeps_a_hidden_kernel_socket_non_blocking() {
        let nb = O_NONBLOCK as u64;
        assert_eq!(
            Common::setfl_under(O_APPEND as u64, nb, true),
            (O_APPEND | O_NONBLOCK) as u64
        );
        assert_eq!(
            Common::setfl_under(O_APPEND as u64, nb, false),
            O_APPEND as u64
        );
        let c = Common::new(1, true, 0);
        c.setfl_done(O_APPEND as u64, nb);
        assert!(!c.nonblock());
        c.setfl_done(nb, nb);
        assert!(c.nonblock());
    }

    #[test]
    fn timevals_as_the_kernel_reads_them() {
        assert_eq!(timeval_ns(0, 0), 0);
        assert_eq!(timeval_ns(1, 500_000), 1_500_000_000);
        assert_eq!(timeval_ns(-1, 20), 20_000);
        assert_eq!(timeval_ns(2, -5), 2_000_000_000);
        assert_eq!(timeval_ns(i64::MAX, i64::MAX), u64::MAX);
    }

    #[test]
    fn timeval_bytes_need_a_whole_timeval() {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&3i64.to_ne_bytes());
        b[8..].copy_from_slice(&250i64.to_ne_bytes());
        assert_eq!(timeval_bytes_ns(&b), 3_000_250_000);
        assert_eq!(timeval_bytes_ns(&b[..15]), 0);
        assert_eq!(timeval_bytes_ns(&[]), 0);
    }
}
