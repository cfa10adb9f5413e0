//! Bottom layer: per-thread state every other layer needs (errno, the
//! clock, the "running engine code" flag, kept in `tls`). Depends only on
//! `tls`.

use crate::tls;
use libc::c_int;

/// True while this thread runs engine code: the exports then go straight
/// to libc (the engine's own sockets, netlink and poll are not the
/// application's).
#[inline(always)]
pub fn in_engine() -> bool {
    tls::me().in_engine.get()
}

/// Run engine code with the exports bypassed.
#[inline]
pub fn engine_call<R>(f: impl FnOnce() -> R) -> R {
    let t = tls::me();
    let prev = t.in_engine.replace(true);
    let r = f();
    t.in_engine.set(prev);
    r
}

/// Set or clear the flag by hand (vfork: the child, which shares this
/// thread's memory, must never run the shim; see `spawn`). Returns the
/// previous value.
#[inline]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub fn set_in_engine(v: bool) -> bool {
    tls::me().in_engine.replace(v)
}

#[inline(always)]
pub fn errno() -> c_int {
    // SAFETY: __errno_location returns this thread's errno, valid for the
    // life of the thread.
    unsafe { *libc::__errno_location() }
}

#[inline(always)]
pub fn set_errno(e: c_int) {
    // SAFETY: as in `errno`.
    unsafe { *libc::__errno_location() = e }
}

/// Bytes a stream call moved so far, by steps (engine attempts, iovecs,
/// chunks), under the kernel's rule for an error after some of them: the
/// call returns what it moved with errno as it found it (the next call
/// meets the error); only an error before any byte is the call's.
pub struct Moved {
    pub done: usize,
    e0: c_int,
}

impl Moved {
    #[inline(always)]
    pub fn start() -> Moved {
        Moved {
            done: 0,
            e0: errno(),
        }
    }

    /// The errno the call found (for a call that hands the rest of its
    /// work to the kernel).
    #[inline(always)]
    pub fn errno_found(&self) -> c_int {
        self.e0
    }

    /// A step failed with `en`: the call's return value.
    #[inline(always)]
    pub fn fail(self, en: c_int) -> isize {
        if self.done > 0 {
            return self.end();
        }
        set_errno(en);
        -1
    }

    /// A step's result `r` (bytes, or -1 with errno set): `Ok(bytes)`,
    /// or `Err(the call's return value)`.
    #[inline(always)]
    pub fn step(&mut self, r: isize) -> Result<usize, isize> {
        if r < 0 {
            return Err(if self.done > 0 { self.end_ref() } else { r });
        }
        self.done += r as usize;
        Ok(r as usize)
    }

    #[inline(always)]
    fn end_ref(&self) -> isize {
        set_errno(self.e0);
        self.done as isize
    }

    /// The call's return value when no step failed it.
    #[inline(always)]
    pub fn end(self) -> isize {
        self.end_ref()
    }
}

#[inline(always)]
pub fn now_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: CLOCK_MONOTONIC into a local timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    (t.tv_sec as u64).wrapping_mul(1_000_000_000) + t.tv_nsec as u64
}

/// The inode of the file `fd` names (a socket's, as `/proc/PID/fd` shows
/// it); 0 if `fd` is not open.
pub fn inode_of(fd: c_int) -> u64 {
    // SAFETY: the fd is only borrowed for fstat; a closed fd gives EBADF.
    let b = unsafe { rustix::fd::BorrowedFd::borrow_raw(fd) };
    rustix::fs::fstat(b).map_or(0, |st| st.st_ino)
}
