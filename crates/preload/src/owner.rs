//! The process side of the owned lock (`nanowire_shimcore::owner`): each
//! thread's token, and the barrier that makes a revocation safe,
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` (registered once per
//! process, again in a forked child). Where membarrier is not available,
//! or `NANOWIRE_SHIM_NO_OWNER=1` (a comparison knob), no lock is owned.

use nanowire_shimcore::owner::OwnerHost;
use std::sync::atomic::{AtomicU8, Ordering};

/// `membarrier(2)` commands (linux/membarrier.h).
const CMD_GLOBAL: libc::c_long = 1;
const CMD_PRIVATE_EXPEDITED: libc::c_long = 8;
const CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 16;

/// 0: not asked yet in this process, 1: registered, 2: no owning.
static STATE: AtomicU8 = AtomicU8::new(0);

fn membarrier(cmd: libc::c_long) -> bool {
    // SAFETY: membarrier takes two integers and touches no memory of ours.
    unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            cmd,
            0 as libc::c_long,
            0 as libc::c_long,
        ) == 0
    }
}

/// The shim's host of the owned lock.
pub struct Host;

/// An engine socket record's lock (`accel::Accel`).
pub type Lock<T> = nanowire_shimcore::owner::OwnedLock<T, Host>;
/// It held.
pub type Guard<'a, T> = nanowire_shimcore::owner::Guard<'a, T, Host>;
/// Its owner inside the outer section (a receive's close guard).
pub type Inside<'a, T> = nanowire_shimcore::owner::Inside<'a, T, Host>;

impl OwnerHost for Host {
    #[inline(always)]
    fn me() -> u64 {
        let t = crate::tls::me();
        let k = t.owner_token.get();
        if k != 0 {
            return k;
        }
        // SAFETY: getpid and gettid take nothing and cannot fail.
        let k = unsafe { (libc::getpid() as u32 as u64) << 32 | libc::gettid() as u32 as u64 };
        t.owner_token.set(k);
        k
    }
    fn me_before_fork() -> u64 {
        crate::tls::me().token_before_fork.get()
    }
    fn pid() -> u32 {
        (Self::me() >> 32) as u32
    }
    fn may_bias() -> bool {
        match STATE.load(Ordering::Acquire) {
            1 => true,
            2 => false,
            _ => {
                let off = std::env::var_os("NANOWIRE_SHIM_NO_OWNER").is_some_and(|v| v == "1");
                let ok = !off && membarrier(CMD_REGISTER_PRIVATE_EXPEDITED);
                STATE.store(if ok { 1 } else { 2 }, Ordering::Release);
                ok
            }
        }
    }
    #[inline(always)]
    fn owner_fence() {
        // The revoker's barrier_all does the CPU's part (module doc of
        // nanowire_shimcore::owner); only the compiler must keep the store
        // before the load.
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
    }
    fn barrier_all() {
        // Registered before any lock was owned in this process (may_bias),
        // so this does not fail; the global command (no registration) is
        // the fallback all the same, and with neither the revocation could
        // not be made safe.
        if !membarrier(CMD_PRIVATE_EXPEDITED) && !membarrier(CMD_GLOBAL) {
            crate::log::log!(
                nanowire_options::Level::Error,
                "membarrier failed: cannot hand a socket's lock to a second thread"
            );
            std::process::abort();
        }
    }
}

/// In a forked child (its one thread, before anything else runs): this
/// thread's token is made anew (the pid changed), the old one kept so that
/// a lock this thread was inside of when it forked is recognised; the
/// registration is asked again (it belongs to the parent's process).
pub fn after_fork_child() {
    let t = crate::tls::me();
    t.token_before_fork.set(t.owner_token.get());
    t.owner_token.set(0);
    STATE.store(0, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_per_thread_and_carry_the_pid() {
        let me = Host::me();
        assert_eq!(Host::pid(), std::process::id());
        assert_eq!(me >> 32, std::process::id() as u64);
        assert_ne!(me, nanowire_shimcore::owner::SHARED);
        let other = std::thread::spawn(Host::me).join().unwrap();
        assert_ne!(other, me);
        assert_eq!(other >> 32, me >> 32);
    }

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
            assert_eq!(l.owner(), nanowire_shimcore::owner::SHARED);
        }
    }

    #[test]
    fn the_owner_hands_over_through_a_real_membarrier_losing_no_update() {
        // The owner's take is a plain store and load (compiler fence only):
        // the revokers' membarrier is what makes the switch safe here.
        const N: u64 = 100_000;
        let (total, owned, end) = nanowire_shimcore::owner::hammer::<Host>(2, N);
        assert_eq!(total, 3 * N);
        if Host::may_bias() {
            assert!(owned, "the first taker owned it");
            assert_eq!(end, nanowire_shimcore::owner::SHARED);
        }
    }
}
