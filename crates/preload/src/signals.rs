//! Signals while spinning. A blocking call interrupted by a signal whose
//! handler was installed without SA_RESTART returns EINTR (Python, for one,
//! runs its signal handlers only then). A spinning shim makes no blocking
//! call, so it must notice deliveries itself: `sigaction`/`signal` are
//! interposed to install a trampoline that counts deliveries of such
//! signals and then calls the application's handler; spin loops compare
//! the count before and after and answer EINTR like the kernel would.
//! SA_RESTART handlers are not counted (the kernel would restart the call,
//! and so does the spin). What the application reads back with
//! `sigaction(.., oldact)` is its own handler and flags.

use crate::real;
use libc::{c_int, c_void, siginfo_t};

type SigAction = libc::sigaction;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

const NSIG: usize = 65;
/// What the trampoline needs, as ONE atomic word per signal so that a
/// concurrent `sigaction` can never pair one handler with another's flags
/// (an SA_SIGINFO handler called with one argument): the handler address
/// in the low 56 bits (user-space addresses are below 2^56 on x86-64 and
/// AArch64 Linux), SA_SIGINFO and SA_RESTART as bits 62 and 63. 0 = none.
static APP: [AtomicU64; NSIG] = [const { AtomicU64::new(0) }; NSIG];
/// The application's full `sa_flags`, only for `sigaction(.., oldact)`.
static APP_FLAGS: [AtomicUsize; NSIG] = [const { AtomicUsize::new(0) }; NSIG];
const ADDR_MASK: u64 = (1 << 56) - 1;
const P_SIGINFO: u64 = 1 << 62;
const P_RESTART: u64 = 1 << 63;

fn pack(handler: usize, flags: c_int) -> u64 {
    let mut w = handler as u64 & ADDR_MASK;
    if flags & libc::SA_SIGINFO != 0 {
        w |= P_SIGINFO;
    }
    if flags & libc::SA_RESTART != 0 {
        w |= P_RESTART;
    }
    w
}

fn handler_of(w: u64) -> usize {
    (w & ADDR_MASK) as usize
}
/// Handled signals delivered to this thread, both counts in one word
/// (`tls::ThreadState::sig_seq`: one thread-local load per read, on every
/// receive and send): the low half counts those whose handler lacks
/// SA_RESTART (a signal interrupts only the thread it is delivered to),
/// the high half every handled signal (poll, select and epoll_wait are
/// never restarted, whatever SA_RESTART says). Readers compare for
/// equality only, so each half wrapping on its own is harmless.
#[inline(always)]
fn seq_word() -> &'static Cell<u64> {
    &crate::tls::me().sig_seq
}

/// For receives and sends: both counts (see [`seq_word`]).
#[inline(always)]
pub fn seq() -> u64 {
    seq_word().get()
}

/// EINTR if a signal whose handler lacks SA_RESTART was handled on this
/// thread since `s0` (a call without a timeout is restarted otherwise).
#[inline(always)]
pub fn interrupted(s0: u64) -> bool {
    (seq() ^ s0) & 0xffff_ffff != 0
}

/// EINTR for a wait bounded by SO_RCVTIMEO/SO_SNDTIMEO (`timed`): any
/// handled signal interrupts it, SA_RESTART or not (signal(7): "if a
/// timeout has been set on the socket ... the call fails with EINTR").
#[inline(always)]
pub fn interrupted_timed(s0: u64, timed: bool) -> bool {
    if timed { seq() != s0 } else { interrupted(s0) }
}

/// For poll/select/epoll waits (never restarted).
#[inline(always)]
pub fn seq_all() -> u64 {
    seq() >> 32
}

extern "C" fn trampoline(sig: c_int, info: *mut siginfo_t, ctx: *mut c_void) {
    let i = sig as usize;
    if i >= NSIG {
        return;
    }
    // One load: handler and flags always belong to the same sigaction.
    let w = APP[i].load(Ordering::Acquire);
    let h = handler_of(w);
    let c = seq_word();
    let (lo, hi) = (c.get() as u32, (c.get() >> 32) as u32);
    let lo = lo.wrapping_add(u32::from(w & P_RESTART == 0));
    c.set(u64::from(hi.wrapping_add(1)) << 32 | u64::from(lo));
    if h == libc::SIG_DFL || h == libc::SIG_IGN {
        return;
    }
    if w & P_SIGINFO != 0 {
        // SAFETY: the application installed this address with SA_SIGINFO
        // (read in the same atomic word as the address), so it takes
        // (int, siginfo_t *, void *); `info`/`ctx` are the kernel's.
        let f: extern "C" fn(c_int, *mut siginfo_t, *mut c_void) =
            unsafe { std::mem::transmute(h) };
        f(sig, info, ctx);
    } else {
        // SAFETY: the application installed this address without
        // SA_SIGINFO (same word as above), so it is a `void (*)(int)`.
        let f: extern "C" fn(c_int) = unsafe { std::mem::transmute(h) };
        f(sig);
    }
}

/// # Safety
/// libc's `sigaction`.
pub unsafe fn sigaction(sig: c_int, act: *const SigAction, oact: *mut SigAction) -> c_int {
    let i = sig as usize;
    if sig <= 0 || i >= NSIG || sig == libc::SIGKILL || sig == libc::SIGSTOP {
        // SAFETY: the caller's own arguments, unchanged, to libc's function of
        // the same signature, whose contract our caller upholds (# Safety).
        return unsafe { real::sigaction(sig, act, oact) };
    }
    let prev = APP[i].load(Ordering::Acquire);
    let prev_h = handler_of(prev);
    let prev_f = APP_FLAGS[i].load(Ordering::Acquire);
    let r = if act.is_null() {
        // SAFETY: a query: `oact` is the caller's (or null), `act` null.
        unsafe { real::sigaction(sig, act, oact) }
    } else {
        // SAFETY: the caller's sigaction, read once.
        let mut a = unsafe { std::ptr::read(act) };
        let h = a.sa_sigaction;
        if h == libc::SIG_DFL || h == libc::SIG_IGN {
            // SAFETY: the caller's own disposition, passed on unchanged.
            let r = unsafe { real::sigaction(sig, &a, oact) };
            if r == 0 {
                APP[i].store(0, Ordering::Release);
            }
            r
        } else {
            APP_FLAGS[i].store(a.sa_flags as usize, Ordering::Release);
            APP[i].store(pack(h, a.sa_flags), Ordering::Release);
            a.sa_sigaction = trampoline as *const () as usize;
            a.sa_flags |= libc::SA_SIGINFO;
            // SAFETY: our copy of the caller's struct, pointing at the
            // trampoline (which takes the SA_SIGINFO arguments).
            let r = unsafe { real::sigaction(sig, &a, oact) };
            if r != 0 {
                APP[i].store(prev, Ordering::Release);
                APP_FLAGS[i].store(prev_f, Ordering::Release);
            }
            r
        }
    };
    if r == 0 && !oact.is_null() {
        // SAFETY: the kernel filled the caller's oldact.
        let o = unsafe { &mut *oact };
        if o.sa_sigaction == trampoline as *const () as usize && prev_h != 0 {
            o.sa_sigaction = prev_h;
            o.sa_flags = prev_f as c_int;
        }
    }
    r
}

/// # Safety
/// libc's `signal` (BSD semantics, as glibc: SA_RESTART).
pub unsafe fn signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: zeroed sigaction is valid (empty mask).
    let mut a: SigAction = unsafe { std::mem::zeroed() };
    a.sa_sigaction = handler;
    a.sa_flags = libc::SA_RESTART;
    // SAFETY: an empty mask, then block `sig` itself during the handler
    // unless SIG_DFL/IGN (glibc does the same).
    unsafe {
        libc::sigemptyset(&mut a.sa_mask);
        if handler != libc::SIG_DFL && handler != libc::SIG_IGN {
            libc::sigaddset(&mut a.sa_mask, sig);
        }
    }
    // SAFETY: zeroed oldact.
    let mut o: SigAction = unsafe { std::mem::zeroed() };
    // SAFETY: our structs.
    if unsafe { sigaction(sig, &a, &mut o) } != 0 {
        return libc::SIG_ERR;
    }
    o.sa_sigaction
}
