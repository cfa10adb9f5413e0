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
use std::sync::atomic::{AtomicUsize, Ordering};

const NSIG: usize = 65;
static APP_HANDLER: [AtomicUsize; NSIG] = [const { AtomicUsize::new(0) }; NSIG];
static APP_FLAGS: [AtomicUsize; NSIG] = [const { AtomicUsize::new(0) }; NSIG];
thread_local! {
    /// Deliveries of non-SA_RESTART handled signals to this thread (a
    /// signal interrupts only the thread it is delivered to).
    static SEQ: Cell<u64> = const { Cell::new(0) };
    /// Deliveries of any handled signal to this thread: poll, select and
    /// epoll_wait are never restarted, whatever SA_RESTART says.
    static SEQ_ALL: Cell<u64> = const { Cell::new(0) };
}

/// For receives (restarted after SA_RESTART handlers).
#[inline(always)]
pub fn seq() -> u64 {
    SEQ.with(|c| c.get())
}

/// EINTR if a signal was handled on this thread since `s0`.
#[inline(always)]
pub fn interrupted(s0: u64) -> bool {
    seq() != s0
}

/// For poll/select/epoll waits (never restarted).
#[inline(always)]
pub fn seq_all() -> u64 {
    SEQ_ALL.with(|c| c.get())
}

extern "C" fn trampoline(sig: c_int, info: *mut siginfo_t, ctx: *mut c_void) {
    let i = sig as usize;
    if i >= NSIG {
        return;
    }
    let h = APP_HANDLER[i].load(Ordering::Acquire);
    let fl = APP_FLAGS[i].load(Ordering::Acquire) as c_int;
    SEQ_ALL.with(|c| c.set(c.get().wrapping_add(1)));
    if fl & libc::SA_RESTART == 0 {
        SEQ.with(|c| c.set(c.get().wrapping_add(1)));
    }
    if h == libc::SIG_DFL || h == libc::SIG_IGN {
        return;
    }
    if fl & libc::SA_SIGINFO != 0 {
        // SAFETY: the application installed this address as an
        // SA_SIGINFO handler.
        let f: extern "C" fn(c_int, *mut siginfo_t, *mut c_void) =
            unsafe { std::mem::transmute(h) };
        f(sig, info, ctx);
    } else {
        // SAFETY: the application installed this address as a plain handler.
        let f: extern "C" fn(c_int) = unsafe { std::mem::transmute(h) };
        f(sig);
    }
}

/// The real `sigaction`.
unsafe fn real_sigaction(sig: c_int, act: *const SigAction, oact: *mut SigAction) -> c_int {
    static SYM: real::Sym = real::Sym::new(b"sigaction\0");
    // SAFETY: libc's sigaction.
    let f: unsafe extern "C" fn(c_int, *const SigAction, *mut SigAction) -> c_int =
        unsafe { std::mem::transmute(SYM.get()) };
    // SAFETY: the caller's arguments.
    unsafe { f(sig, act, oact) }
}

/// # Safety
/// libc's `sigaction`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sigaction(
    sig: c_int,
    act: *const SigAction,
    oact: *mut SigAction,
) -> c_int {
    let i = sig as usize;
    if crate::accel::in_engine()
        || sig <= 0
        || i >= NSIG
        || sig == libc::SIGKILL
        || sig == libc::SIGSTOP
    {
        // SAFETY: forwarding.
        return unsafe { real_sigaction(sig, act, oact) };
    }
    let prev_h = APP_HANDLER[i].load(Ordering::Acquire);
    let prev_f = APP_FLAGS[i].load(Ordering::Acquire);
    let r = if act.is_null() {
        // SAFETY: forwarding a query.
        unsafe { real_sigaction(sig, act, oact) }
    } else {
        // SAFETY: the caller's sigaction, read once.
        let mut a = unsafe { std::ptr::read(act) };
        let h = a.sa_sigaction;
        if h == libc::SIG_DFL || h == libc::SIG_IGN {
            // SAFETY: forwarding.
            let r = unsafe { real_sigaction(sig, &a, oact) };
            if r == 0 {
                APP_HANDLER[i].store(0, Ordering::Release);
            }
            r
        } else {
            APP_FLAGS[i].store(a.sa_flags as usize, Ordering::Release);
            APP_HANDLER[i].store(h, Ordering::Release);
            a.sa_sigaction = trampoline as *const () as usize;
            a.sa_flags |= libc::SA_SIGINFO;
            // SAFETY: our copy with the trampoline.
            let r = unsafe { real_sigaction(sig, &a, oact) };
            if r != 0 {
                APP_HANDLER[i].store(prev_h, Ordering::Release);
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
#[unsafe(no_mangle)]
pub unsafe extern "C" fn signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
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
