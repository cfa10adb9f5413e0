//! Bottom layer: the per-thread words every interposed call touches, in
//! one block of *initial-exec* thread-local storage.
//!
//! The shim is a shared object, so a Rust `thread_local!` in it is reached
//! through `__tls_get_addr`, once per function that touches one — several
//! times per datagram (the export's engine flag, the signal count, the
//! user-memory cache). The words here are one block of initial-exec TLS
//! (`nanowire_owner::initial_exec_block!`, whose module says how and at
//! what price): two instructions, no call, async-signal-safe (the signal
//! trampoline counts here). Every thread's block starts zeroed, which is
//! the initial value of each field (see [`ThreadState`]); nothing here has
//! a destructor.

use nanowire_sockabi::space::RangeCache;
use std::cell::{Cell, UnsafeCell};

/// This thread's shim words. All-zero bytes are the initial value of every
/// field ([`ThreadState::new`]; `RangeCache::new()` is all zeros), which
/// is what a thread's static TLS block starts as.
#[repr(C)]
pub struct ThreadState {
    /// This thread runs engine code (`sys::in_engine`).
    pub in_engine: Cell<bool>,
    /// The user-memory cache is borrowed (a signal handler's call that
    /// lands in the shim while the interrupted call looks at it finds it
    /// busy and takes the slow way).
    pub cache_busy: Cell<bool>,
    /// Handled signals delivered to this thread (`signals::seq`).
    pub sig_seq: Cell<u64>,
    /// Mappings this thread's buffers were found in (`uaccess`).
    pub cache: UnsafeCell<RangeCache>,
}

impl ThreadState {
    /// The initial value (all zeros).
    #[cfg_attr(all(target_arch = "x86_64", not(test)), allow(dead_code))]
    pub const fn new() -> ThreadState {
        ThreadState {
            in_engine: Cell::new(false),
            cache_busy: Cell::new(false),
            sig_seq: Cell::new(0),
            cache: UnsafeCell::new(RangeCache::new()),
        }
    }

    /// Run `f` on the user-memory cache; `None` if it is borrowed already
    /// (a signal handler interrupted a look at it).
    #[inline(always)]
    pub fn with_cache<R>(&self, f: impl FnOnce(&mut RangeCache) -> R) -> Option<R> {
        if self.cache_busy.replace(true) {
            return None;
        }
        // SAFETY: `cache_busy` was clear and is set until `f` returns: no
        // other reference to the cache exists on this thread (a handler
        // that interrupts `f` finds it busy), and no other thread can see
        // this thread's block.
        let r = f(unsafe { &mut *self.cache.get() });
        self.cache_busy.set(false);
        Some(r)
    }
}

// SAFETY: all-zero bytes are `ThreadState::new()` (the test below checks
// it field by field); `Cell` and `UnsafeCell` make it not `Sync`; no
// drop glue.
unsafe impl nanowire_owner::tls::ZeroInit for ThreadState {}

nanowire_owner::initial_exec_block!(
    /// This thread's block.
    pub fn me() -> ThreadState = ThreadState::new(),
    "nanowire_preload_tls"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_zeroed_block_is_the_initial_value() {
        // What a fresh thread's static TLS block holds.
        // SAFETY: every field is plain integers (bool as 0).
        let z: ThreadState = unsafe { std::mem::zeroed() };
        let n = ThreadState::new();
        assert_eq!(z.in_engine.get(), n.in_engine.get());
        assert_eq!(z.cache_busy.get(), n.cache_busy.get());
        assert_eq!(z.sig_seq.get(), n.sig_seq.get());
        // SAFETY: not borrowed (local values).
        let (zc, nc) = unsafe { (&*z.cache.get(), &*n.cache.get()) };
        assert_eq!(format!("{zc:?}"), format!("{nc:?}"));
    }

    #[test]
    fn each_thread_has_its_own_block_starting_zeroed() {
        me().sig_seq.set(7);
        me().in_engine.set(true);
        let other = std::thread::spawn(|| {
            let s = me();
            (
                s.sig_seq.get(),
                s.in_engine.get(),
                s as *const ThreadState as usize,
            )
        })
        .join()
        .unwrap();
        assert_eq!((other.0, other.1), (0, false));
        assert_ne!(other.2, me() as *const ThreadState as usize);
        assert_eq!(me().sig_seq.get(), 7);
        me().in_engine.set(false);
    }

    #[test]
    fn the_cache_is_refused_while_borrowed() {
        let s = me();
        let inner = s.with_cache(|_| s.with_cache(|_| ()).is_none());
        assert_eq!(inner, Some(true));
        assert!(s.with_cache(|_| ()).is_some());
    }
}
