//! Bottom layer: per-thread state every other layer needs (errno, the
//! clock, the "running engine code" flag). Depends on nothing in the crate.

use libc::c_int;
use std::cell::Cell;

thread_local! {
    static IN_ENGINE: Cell<bool> = const { Cell::new(false) };
}

/// True while this thread runs engine code: the exports then go straight
/// to libc (the engine's own sockets, netlink and poll are not the
/// application's).
#[inline(always)]
pub fn in_engine() -> bool {
    IN_ENGINE.with(|c| c.get())
}

/// Run engine code with the exports bypassed.
#[inline]
pub fn engine_call<R>(f: impl FnOnce() -> R) -> R {
    // Two accesses, not one `with` around `f`: inlined into the caller,
    // both share the caller's one `__tls_get_addr` (local-dynamic), where
    // a `with` around `f` stays out of line with a call of its own.
    let prev = IN_ENGINE.with(|c| c.replace(true));
    let r = f();
    IN_ENGINE.with(|c| c.set(prev));
    r
}

/// Set or clear the flag by hand (vfork: the child, which shares this
/// thread's memory, must never run the shim; see `spawn`). Returns the
/// previous value.
#[inline]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub fn set_in_engine(v: bool) -> bool {
    IN_ENGINE.with(|c| c.replace(v))
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
