//! The shim's side of the owned lock (`nanowire_owner`): each thread's
//! token, the barrier that makes a revocation safe and its registration
//! are the process's (`nanowire_owner::process`, shared with the engine's
//! locks: the token in its initial-exec words, the same for both). Where
//! membarrier is not available, or `NANOWIRE_SHIM_NO_OWNER=1` (a comparison
//! knob, [`init`]), no lock is owned, the shim's or the engine's.

use nanowire_owner::OwnerHost;
use std::sync::atomic::Ordering;

/// The shim's host of the owned lock.
pub struct Host;

/// An engine socket record's lock (`accel::Accel`).
pub type Lock<T> = nanowire_owner::OwnedLock<T, Host>;
/// It held.
pub type Guard<'a, T> = nanowire_owner::Guard<'a, T, Host>;
/// Its owner inside the outer section (a receive's close guard).
pub type Inside<'a, T> = nanowire_owner::Inside<'a, T, Host>;

impl OwnerHost for Host {
    // The thread's token is the engine's (`nanowire_owner::Process`: one
    // pair of words per thread in initial-exec TLS, made anew in a forked
    // child by `nanowire_owner::process::after_fork_child`).
    #[inline(always)]
    fn me() -> u64 {
        <nanowire_owner::Process as OwnerHost>::me()
    }
    fn me_before_fork() -> u64 {
        <nanowire_owner::Process as OwnerHost>::me_before_fork()
    }
    fn pid() -> u32 {
        (Self::me() >> 32) as u32
    }
    fn may_bias() -> bool {
        nanowire_owner::process::may_bias()
    }
    #[inline(always)]
    fn owner_fence() {
        // The revoker's barrier_all does the CPU's part (module doc of
        // nanowire_owner::lock); only the compiler must keep the store
        // before the load.
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
    }
    fn barrier_all() {
        // With neither barrier the revocation could not be made safe.
        if !nanowire_owner::process::barrier_all() {
            crate::log::log!(
                nanowire_options::Level::Error,
                "membarrier failed: cannot hand a socket's lock to a second thread"
            );
            std::process::abort();
        }
    }
}

/// At the shim's start: `NANOWIRE_SHIM_NO_OWNER=1` turns owning off for the
/// process (the shim's locks and the engine's).
///
/// Else the process registers for the expedited membarrier now, while it
/// has one thread: the kernel then only marks it, where a process with
/// threads waits for an RCU grace period (5-17 ms here; session 27: every
/// multi-threaded program's first engine socket paid it, when its first
/// owned lock asked).
pub fn init() {
    if std::env::var_os("NANOWIRE_SHIM_NO_OWNER").is_some_and(|v| v == "1") {
        nanowire_owner::process::forbid();
    } else {
        nanowire_owner::process::may_bias();
    }
}

/// In a forked child (its one thread, before anything else runs): this
/// thread's token is made anew (the pid changed), the old one kept so that
/// a lock this thread was inside of when it forked is recognised; the
/// registration is made again (it belongs to the parent's process), at
/// once: the child has one thread now, so it costs no grace period (see
/// [`init`]).
pub fn after_fork_child() {
    nanowire_owner::process::after_fork_child();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closer_waits_for_the_owner_inside_through_a_real_membarrier() {
        // The close guard: the owner thread inside its wait on fd 7; the
        // closing thread returns only after it left.
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        let l = Arc::new(Lock::new(0u32));
        let (inside, left) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let (l2, i2, f2) = (l.clone(), inside.clone(), left.clone());
        let owner = std::thread::spawn(move || {
            drop(l2.lock());
            let g = l2.enter_owned(7);
            let owned = g.is_some();
            i2.store(true, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(50));
            f2.store(true, Ordering::SeqCst);
            drop(g);
            owned
        });
        while !inside.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        assert!(l.wait_outside(7, u32::MAX));
        let owned = owner.join().unwrap();
        if Host::may_bias() {
            assert!(owned, "the owner's entry");
            assert!(left.load(Ordering::SeqCst), "waited until it left");
            assert_eq!(l.owner(), nanowire_owner::SHARED);
        }
    }
}
