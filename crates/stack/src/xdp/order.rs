//! The engine's lock order, checked.
//!
//! Four tiers (docs/architecture.md, "Locks"):
//!
//! | tier | locks |
//! |---|---|
//! | 0 | `Engine::tcp_clients` (the process's shared client stack being made) |
//! | 1 | a `TcpEngine`'s stack lock (`Core`, [`Owned`]) |
//! | 2 | the engine service's control lock (the control socket: one round trip at a time) |
//! | 3 (leaves) | RX (`RxPath`), TX (`TxPath`) (both [`Owned`]), program (`Prog`), neighbour tables, the control queue |
//!
//! A thread takes locks in increasing tier only, and never two leaves at
//! once: a TCP turn holds its stack lock and takes RX, then TX, each alone;
//! a UDP socket takes one leaf at a time. The control lock is the one lock
//! held across a blocking call (a request to the engine service and its
//! answer): below every leaf, so no thread waits for it while it holds a
//! leaf, and a TCP turn never takes it (what a turn releases on the
//! service waits in the control queue, `Engine::defer`). `try_lock` (the timer service)
//! never waits, so it is exempt from the order. Below every tier, the
//! UMEM's recycle list (crates/xdp, taken when a frame drops) is a leaf of
//! the leaves. With debug assertions on, every acquisition through
//! [`lock`] checks the order (a per-thread mask of tiers held) and panics
//! naming the lock that broke it; release builds compile the check away.

use std::sync::{Mutex, MutexGuard};

/// An engine lock its one owner thread takes without an atomic
/// read-modify-write (`nanowire_owner`: the RX and TX locks, a TCP stack's
/// lock), revoked for good when another thread takes it (for a while when
/// an engine thread, a visitor, does).
pub(crate) type Owned<T> = nanowire_owner::OwnedLock<T, nanowire_owner::Process>;

/// Lock tiers (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Tier {
    Clients = 0,
    Stack = 1,
    Control = 2,
    Leaf = 3,
}

#[cfg(any(debug_assertions, test))]
thread_local! {
    static HELD: std::cell::Cell<u8> = const { std::cell::Cell::new(0) };
}

/// A lock's guard `G` that also records its tier for the order check.
pub(crate) struct Held<G> {
    g: G,
    #[cfg(any(debug_assertions, test))]
    tier: Tier,
}

/// A mutex held.
pub(crate) type Guard<'a, T> = Held<MutexGuard<'a, T>>;
/// An [`Owned`] lock held (by its owner alone, or with its mutex).
pub(crate) type OwnedGuard<'a, T> = Held<nanowire_owner::Guard<'a, T, nanowire_owner::Process>>;

impl<G: std::ops::Deref> std::ops::Deref for Held<G> {
    type Target = G::Target;
    #[inline(always)]
    fn deref(&self) -> &G::Target {
        &self.g
    }
}

impl<G: std::ops::DerefMut> std::ops::DerefMut for Held<G> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut G::Target {
        &mut self.g
    }
}

#[cfg(any(debug_assertions, test))]
impl<G> Drop for Held<G> {
    fn drop(&mut self) {
        let bit = 1u8 << self.tier as u8;
        HELD.with(|h| h.set(h.get() & !bit));
    }
}

/// Take `m` (a lock of tier `tier`, named `name` in a violation), poison
/// ignored: the data is consistent between statements.
#[inline(always)]
pub(crate) fn lock<'a, T>(m: &'a Mutex<T>, tier: Tier, name: &'static str) -> Guard<'a, T> {
    held(tier, name, || m.lock().unwrap_or_else(|e| e.into_inner()))
}

/// Take the owned lock `m` (as [`lock`]): its owner thread with plain
/// stores and loads, any other thread through its mutex (revoking the
/// owner the first time).
#[inline(always)]
pub(crate) fn lock_owned<'a, T>(
    m: &'a Owned<T>,
    tier: Tier,
    name: &'static str,
) -> OwnedGuard<'a, T> {
    held(tier, name, || m.lock())
}

/// The order's check for `tier`, then `take`.
#[inline(always)]
fn held<G>(tier: Tier, name: &'static str, take: impl FnOnce() -> G) -> Held<G> {
    #[cfg(any(debug_assertions, test))]
    enter(tier, name, true);
    #[cfg(not(any(debug_assertions, test)))]
    let _ = (tier, name);
    Held {
        g: take(),
        #[cfg(any(debug_assertions, test))]
        tier,
    }
}

/// `try_lock`: never waits, so exempt from the order (but recorded).
#[inline]
pub(crate) fn try_lock<'a, T>(m: &'a Mutex<T>, tier: Tier) -> Option<Guard<'a, T>> {
    let g = match m.try_lock() {
        Ok(g) => g,
        Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
        Err(std::sync::TryLockError::WouldBlock) => return None,
    };
    Some(tried(tier, g))
}

/// [`try_lock`] of an owned lock ([`nanowire_owner::OwnedLock::try_lock`]:
/// the owner's plain take, or the free mutex of an owner not in a call).
#[inline]
pub(crate) fn try_lock_owned<'a, T>(m: &'a Owned<T>, tier: Tier) -> Option<OwnedGuard<'a, T>> {
    m.try_lock().map(|g| tried(tier, g))
}

/// A try's guard `g` of a lock of `tier`: recorded, not checked (a try
/// waits for nobody).
#[inline]
fn tried<G>(tier: Tier, g: G) -> Held<G> {
    #[cfg(any(debug_assertions, test))]
    enter(tier, "", false);
    #[cfg(not(any(debug_assertions, test)))]
    let _ = tier;
    Held {
        g,
        #[cfg(any(debug_assertions, test))]
        tier,
    }
}

#[cfg(any(debug_assertions, test))]
fn enter(tier: Tier, name: &str, check: bool) {
    let bit = 1u8 << tier as u8;
    HELD.with(|h| {
        let held = h.get();
        // Nothing of this tier or a later one may be held.
        if check && held & !(bit - 1) != 0 {
            panic!(
                "lock order: taking {name} (tier {tier:?}) while holding tiers {held:#05b} \
                 (docs/architecture.md, \"Locks\")"
            );
        }
        h.set(held | bit);
    });
}

// ------------------------------------------------------------ engine threads
//
// The other half of the order: the engine's own threads (the TCP timer
// service, the neighbour thread) hold engine locks while they close fds or
// call libc, so they must never enter the shim's interposed functions,
// whose locks application threads hold while they wait for engine locks.

/// How the engine's own threads run their bodies: the shim runs them as
/// engine code (its libc calls bypass the interposed functions).
static THREAD_WRAP: std::sync::OnceLock<fn(&mut dyn FnMut())> = std::sync::OnceLock::new();

/// Set how the engine's own threads run (the timer service and the
/// neighbour thread; once, before the first engine): [`as_engine_thread`].
pub fn set_tcp_service_wrapper(w: fn(&mut dyn FnMut())) {
    let _ = THREAD_WRAP.set(w);
}

/// Run the body of one of the engine's own threads (the TCP timer service,
/// the neighbour thread) inside the wrapper the shim registered: the
/// shim's exports then go straight to libc for everything the thread does.
/// Without it, an fd the thread closes (a dropped `OwnedFd`, a program
/// replaced by the lazy frags upgrade) went through the shim's `close`,
/// which takes the shim's epoll registry lock, while the thread held an
/// engine lock (the program lock) that an application thread, holding that
/// registry lock in `epoll_wait`, was waiting for: a deadlock (ab and wrk
/// under run hung in CI).
pub(crate) fn as_engine_thread(f: &mut dyn FnMut()) {
    // Its takes of the RX and TX locks are visits: the application thread
    // that owns them owns them again after (nanowire_owner::OwnerHost::
    // visitor; before, the timer service's first take, at the first
    // connection, left every TCP engine's locks to their mutex for good).
    nanowire_owner::Process::set_visitor(true);
    match THREAD_WRAP.get() {
        Some(w) => w(f),
        None => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_go_down_only_and_leaves_never_nest() {
        let stack = Mutex::new(());
        let (rx, tx) = (Mutex::new(()), Mutex::new(()));
        {
            let _s = lock(&stack, Tier::Stack, "stack");
            drop(lock(&rx, Tier::Leaf, "rx"));
            drop(lock(&tx, Tier::Leaf, "tx"));
        }
        let nest = std::panic::catch_unwind(|| {
            let _r = lock(&rx, Tier::Leaf, "rx");
            let _t = lock(&tx, Tier::Leaf, "tx");
        });
        assert!(nest.is_err(), "two leaves at once");
        let up = std::panic::catch_unwind(|| {
            let _r = lock(&rx, Tier::Leaf, "rx");
            let _s = lock(&stack, Tier::Stack, "stack");
        });
        assert!(up.is_err(), "a stack lock under a leaf");
        // The control lock (a round trip to the engine service) is below
        // every leaf: never waited for while a leaf is held.
        let ctl = Mutex::new(());
        {
            let _s = lock(&stack, Tier::Stack, "stack");
            let _c = lock(&ctl, Tier::Control, "control");
            drop(lock(&rx, Tier::Leaf, "the control queue"));
        }
        let under_leaf = std::panic::catch_unwind(|| {
            let _r = lock(&rx, Tier::Leaf, "rx");
            let _c = lock(&ctl, Tier::Control, "control");
        });
        assert!(under_leaf.is_err(), "the control lock under a leaf");
        // try_lock waits for nobody: allowed anywhere.
        let _r = lock(&rx, Tier::Leaf, "rx");
        assert!(try_lock(&stack, Tier::Stack).is_some());
    }

    #[test]
    fn an_engine_lock_is_its_owner_threads_until_another_thread_takes_it() {
        use nanowire_owner::{OwnerHost, Process, SHARED};
        use std::panic::{AssertUnwindSafe, catch_unwind};
        let rx = std::sync::Arc::new(Owned::new(0u64));
        drop(lock_owned(&rx, Tier::Leaf, "rx"));
        let bias = nanowire_owner::process::may_bias();
        if bias {
            assert_eq!(rx.owner(), Process::me(), "the first taker owns it");
        }
        for _ in 0..3 {
            *lock_owned(&rx, Tier::Leaf, "rx") += 1;
        }
        // The order holds for it as for a mutex: no two leaves at once.
        let tx = Mutex::new(());
        let nest = catch_unwind(AssertUnwindSafe(|| {
            let _r = lock_owned(&rx, Tier::Leaf, "rx");
            let _t = lock(&tx, Tier::Leaf, "tx");
        }));
        assert!(nest.is_err(), "two leaves at once");
        if bias {
            assert_eq!(rx.owner(), Process::me(), "still owned after the unwind");
        }
        // Another thread (the neighbour thread, the TCP timer service, a
        // second socket's thread) takes it: the owner is revoked, no
        // update is lost, and the former owner takes the mutex from then.
        let rx2 = rx.clone();
        std::thread::spawn(move || *lock_owned(&rx2, Tier::Leaf, "rx") += 10)
            .join()
            .unwrap();
        if bias {
            assert_eq!(rx.owner(), SHARED, "revoked");
        }
        *lock_owned(&rx, Tier::Leaf, "rx") += 100;
        assert_eq!(*lock_owned(&rx, Tier::Leaf, "rx"), 113);
    }

    /// A TCP stack's lock (session 35) is owned as the RX and TX locks:
    /// the timer service's `try_lock_owned` (an engine thread: a visitor)
    /// fails at once while the owner holds it, takes it when it does not,
    /// and leaves it to be owned again.
    #[test]
    fn a_stack_lock_is_owned_and_the_timer_services_try_never_waits_for_its_owner() {
        use nanowire_owner::{OwnerHost, Process, UNOWNED};
        use std::sync::Arc;
        let core = Arc::new(Owned::new(0u64));
        *lock_owned(&core, Tier::Stack, "a TCP stack lock") += 1;
        let bias = nanowire_owner::process::may_bias();
        if bias {
            assert_eq!(core.owner(), Process::me(), "the first taker owns it");
        }
        let visit = |core: &Arc<Owned<u64>>, add: u64| {
            let c = core.clone();
            std::thread::spawn(move || {
                let mut got = false;
                as_engine_thread(&mut || {
                    if let Some(mut g) = try_lock_owned(&c, Tier::Stack) {
                        *g += add;
                        got = true;
                    }
                });
                got
            })
            .join()
            .unwrap()
        };
        {
            let _g = lock_owned(&core, Tier::Stack, "a TCP stack lock");
            assert!(!visit(&core, 100), "held by its owner: the try fails");
        }
        if bias {
            assert_eq!(core.owner(), Process::me(), "a failed try revokes nothing");
        }
        assert!(visit(&core, 10), "not held: the visit takes it");
        if bias {
            assert_eq!(core.owner(), UNOWNED, "left to be owned again");
        }
        drop(lock_owned(&core, Tier::Stack, "a TCP stack lock"));
        if bias {
            assert_eq!(core.owner(), Process::me(), "owned again");
        }
        assert_eq!(*lock_owned(&core, Tier::Stack, "a TCP stack lock"), 11);
    }
}
