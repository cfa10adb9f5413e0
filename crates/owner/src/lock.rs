//! The owned lock: a mutex that the one thread using it takes with no
//! atomic read-modify-write (a biased lock; issue 22's single-owner fast
//! path, step 2: docs/architecture.md "The single-owner fast path").
//!
//! An engine socket's record is locked by every call that moves data, two
//! to four times a message; uncontended, each take and give of a mutex is
//! a locked instruction (a full barrier). Most sockets are used by one
//! thread all their life. So the record's lock remembers its first taker
//! as its *owner*, whose later takes are plain stores and loads:
//!
//! * **the owner's take** ([`OwnedLock::lock`]): store its token in the
//!   lock's `in_call` word (plain store), a compiler fence, then load the
//!   `owner` word: still its own token, the call goes on without the
//!   mutex; the give is a plain store of 0 to `in_call` (Release);
//! * **anyone else's take** (`lock_slow`): the mutex, and under it, if the
//!   lock is owned, the owner is *revoked* for good: `owner` becomes
//!   [`SHARED`], then every thread of the process is made to pass a full
//!   barrier ([`OwnerHost::barrier_all`]: `membarrier(PRIVATE_EXPEDITED)`
//!   in the shim, as user-space RCU does), then it waits until `in_call`
//!   is 0 (the owner's current call, if any, ended). From then on the
//!   former owner takes the mutex like everyone (its take finds `owner`
//!   changed, clears `in_call` and goes the slow way).
//!
//! Why that excludes each other (the asymmetric Dekker argument): the
//! barrier puts, in the owner thread's program order, a point before which
//! its accesses are visible to the revoker once the barrier returns and
//! after which it sees what the revoker stored before the barrier. If the
//! owner's load of `owner` is after that point it sees [`SHARED`] and does
//! not go on; if before, its store to `in_call` (earlier in program order)
//! is before the point too, so the revoker sees it and waits for the
//! owner's give (Release; the revoker's load is Acquire, so whatever the
//! owner wrote under the lock is visible to it). `owner` changes only under
//! the mutex (0 → a token, a token → SHARED, SHARED → 0 by [`Guard::unshare`]),
//! so two revokers cannot interleave, and a taker that finds SHARED under
//! the mutex knows the revocation finished.
//!
//! The cases where one thread is not enough:
//! * **a signal handler** on the owner thread whose call takes the lock
//!   the interrupted call holds: `in_call` already holds its own token.
//!   [`OwnedLock::lock_unless_nested`] says `None` (the caller answers from
//!   the kernel socket); [`OwnedLock::lock`] waits, as a std mutex taken
//!   twice by one thread does (the shim's behaviour before this lock).
//! * **fork**: a token is `pid << 32 | tid`, and the child's thread gets a
//!   fresh one (the host's fork handler), so no lock owned in the parent
//!   is owned by a thread of the child. Its `in_call` may hold a parent
//!   thread's token (copied mid-call): that thread does not exist in the
//!   child, so a revoker in the child does not wait for it, and needs no
//!   barrier (no thread of this process can be the owner), unless it is
//!   the forking thread's own earlier token ([`OwnerHost::me_before_fork`]:
//!   a handler that forked while its thread was inside a call; then the
//!   interrupted call is still running on this very thread, as above).
//! * **a token reused** (a thread ended and a new one got its tid): the old
//!   owner is gone, so the new thread being the owner is still one thread.
//! * **no barrier available** (an old kernel): [`OwnerHost::may_bias`]
//!   says so and no lock is ever owned: a plain mutex.
//!
//! **The outer section** ([`OwnedLock::enter_owned`], [`OwnedLock::wait_outside`]):
//! the same bias for a section outside the lock that a closer must wait
//! for (the shim's close guard: a receive's wait makes calls on its fd
//! between takes of the lock, so `close` must not let the number be reused
//! until the wait has seen the fd's new generation and left). The owner
//! enters with a plain store of its token in `inside` (and the section's
//! tag, the fd, in `inside_tag`), a compiler fence and a load of `owner`;
//! anyone else counts itself elsewhere (the caller's shared count). The
//! waiter (the closer), after making new entries stay out (the caller's
//! generation bump), takes the mutex and revokes a live owner that is not
//! itself (the barrier makes the owner's entry visible, as for the lock;
//! a revocation made earlier is followed by taking the mutex after it),
//! then waits until `inside` no longer holds this process's thread for its
//! tag. The revoker does not wait for the section (a lock take by another
//! thread must not wait for a blocked receive), only the closer does. A
//! closer that is the owner needs no barrier: no other thread enters the
//! owner's way, and its own token in `inside` is a signal handler's close
//! inside its own wait (not waited for, as the shared count's bound).

use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};

/// `owner`: nobody yet (the next slow take makes its taker the owner).
pub const UNOWNED: u64 = 0;
/// `owner`: revoked; every take is the mutex's.
pub const SHARED: u64 = u64::MAX;

/// What the lock needs from its process.
pub trait OwnerHost {
    /// This thread's token: `pid << 32 | tid` (never 0 or [`SHARED`]),
    /// fresh in a forked child.
    fn me() -> u64;
    /// The token this thread had in the parent if this process is a forked
    /// child and the thread the one that forked (else 0).
    fn me_before_fork() -> u64;
    /// This process's pid (the high half of its threads' tokens).
    fn pid() -> u32;
    /// May a lock be owned now ([`OwnerHost::barrier_all`] works here)?
    fn may_bias() -> bool;
    /// After the owner's store to `in_call`: at least a compiler fence
    /// (the shim: only that; a test host without `barrier_all`'s power: a
    /// full fence).
    fn owner_fence();
    /// Make every thread of the process pass a full memory barrier.
    fn barrier_all();
    /// Is this thread a visitor (a thread that takes the lock now and
    /// then, such as an engine's timer or neighbour thread)? Its take never
    /// makes it the owner, and a take that revoked an owner leaves the lock
    /// unowned, so the thread that uses it all the time owns it again at
    /// its next take (a re-bias), instead of every take being the mutex's
    /// for good. Asked on the slow path only.
    fn visitor() -> bool {
        false
    }
}

/// A mutex over `T` that its owner thread takes without an atomic
/// read-modify-write (see the module doc).
pub struct OwnedLock<T, H: OwnerHost> {
    mutex: Mutex<()>,
    /// The owner's token, [`UNOWNED`] or [`SHARED`]; changed only under
    /// `mutex`.
    owner: AtomicU64,
    /// The owner's token while it holds the lock without the mutex (or
    /// with it, when its take made it the owner), else 0. Stored only by
    /// the owner thread.
    in_call: AtomicU64,
    /// The owner's token while it is inside the outer section (see the
    /// module doc), else 0. Stored only by the owner thread.
    inside: AtomicU64,
    /// The tag it entered with (valid while `inside` holds a token).
    inside_tag: AtomicU32,
    data: UnsafeCell<T>,
    host: PhantomData<fn() -> H>,
}

// SAFETY: `data` is reached only through a `Guard`, and at most one exists
// at a time (the module doc's argument), as for `Mutex<T>`: `T: Send`
// suffices.
unsafe impl<T: Send, H: OwnerHost> Sync for OwnedLock<T, H> {}
// SAFETY: as for `Mutex<T>`: moving the lock moves `T`.
unsafe impl<T: Send, H: OwnerHost> Send for OwnedLock<T, H> {}

impl<T, H: OwnerHost> OwnedLock<T, H> {
    pub const fn new(v: T) -> Self {
        OwnedLock {
            mutex: Mutex::new(()),
            owner: AtomicU64::new(UNOWNED),
            in_call: AtomicU64::new(0),
            inside: AtomicU64::new(0),
            inside_tag: AtomicU32::new(0),
            data: UnsafeCell::new(v),
            host: PhantomData,
        }
    }

    /// The lock; waits as a mutex does. A signal handler that interrupted
    /// its own thread's holding of it waits forever (as a std mutex).
    #[inline(always)]
    pub fn lock(&self) -> Guard<'_, T, H> {
        let me = H::me();
        match self.try_owned(me) {
            Some(g) => g,
            None => self.lock_slow(me),
        }
    }

    /// [`OwnedLock::lock`], except `None` when the caller is the owner
    /// thread already holding it (a signal handler's call inside the
    /// interrupted one's).
    #[inline(always)]
    pub fn lock_unless_nested(&self) -> Option<Guard<'_, T, H>> {
        let me = H::me();
        if self.in_call.load(Ordering::Relaxed) == me {
            return None;
        }
        Some(match self.try_owned(me) {
            Some(g) => g,
            None => self.lock_slow(me),
        })
    }

    /// The owner's take (`None`: not the owner, or nested).
    #[inline(always)]
    fn try_owned(&self, me: u64) -> Option<Guard<'_, T, H>> {
        // (`then`, not `then_some`: a guard made and dropped gives back.)
        self.owner_enters(&self.in_call, me, || {}).then(|| Guard {
            lock: self,
            mutex: None,
            in_call: true,
            _not_send: PhantomData,
        })
    }

    /// The owner's entry through `word` (`in_call`: its take; `inside`:
    /// the outer section): if `me` owns the lock and is not in `word`
    /// already, `before` (what must be seen with the token), then its
    /// token in `word` (a plain store), a compiler fence and `owner` looked
    /// at again. False (and `word` cleared) when revoked meanwhile: the
    /// revoker may be waiting for it.
    #[inline(always)]
    fn owner_enters(&self, word: &AtomicU64, me: u64, before: impl FnOnce()) -> bool {
        if self.owner.load(Ordering::Relaxed) != me || word.load(Ordering::Relaxed) != 0 {
            return false;
        }
        before();
        // Release: whoever sees the token sees what `before` stored.
        word.store(me, Ordering::Release);
        H::owner_fence();
        if self.owner.load(Ordering::Relaxed) == me {
            return true;
        }
        word.store(0, Ordering::Release);
        false
    }

    /// The lock if it is to be had without waiting for another thread's
    /// hold: the owner's take; anyone else's, the mutex if it is free and
    /// the owner (if any) not inside a call now (then revoked as by
    /// [`OwnedLock::lock`], which may wait out a call the owner entered
    /// that moment). `None`: held (or this thread is inside its own hold,
    /// a signal handler's call).
    #[inline]
    pub fn try_lock(&self) -> Option<Guard<'_, T, H>> {
        let me = H::me();
        if let Some(g) = self.try_owned(me) {
            return Some(g);
        }
        if self.in_call.load(Ordering::Relaxed) == me {
            return None;
        }
        let m = match self.mutex.try_lock() {
            Ok(m) => m,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        let o = self.owner.load(Ordering::Relaxed);
        if o != UNOWNED && o != SHARED && self.in_call.load(Ordering::Acquire) != 0 {
            return None;
        }
        Some(self.under_mutex(m, me))
    }

    /// The lock's value, through exclusive access (no other holder can
    /// exist).
    pub fn get_mut(&mut self) -> &mut T {
        self.data.get_mut()
    }

    #[cold]
    #[inline(never)]
    fn lock_slow(&self, me: u64) -> Guard<'_, T, H> {
        let m = self.mutex.lock().unwrap_or_else(|e| e.into_inner());
        self.under_mutex(m, me)
    }

    /// A take by a thread holding the mutex `m` (not the owner's way): the
    /// first taker (not a visitor) becomes the owner; an owner is revoked.
    fn under_mutex<'a>(&'a self, m: MutexGuard<'a, ()>, me: u64) -> Guard<'a, T, H> {
        let o = self.owner.load(Ordering::Relaxed);
        let visitor = H::visitor();
        let first = o == UNOWNED && !visitor && H::may_bias();
        if first {
            // The first taker owns it. It holds the mutex this time, and
            // `in_call` too, so that its own signal handler counts as
            // nested (the owner's fast take checks `in_call`).
            self.in_call.store(me, Ordering::Relaxed);
            self.owner.store(me, Ordering::Relaxed);
        } else if o != UNOWNED && o != SHARED {
            self.revoke(o);
            if visitor {
                // Owned again by the next take of another kind: under the
                // mutex, with the owner revoked (SHARED, its call ended),
                // no thread holds the lock or can take it without the
                // mutex, as for `Guard::unshare`. A lock SHARED by two
                // threads of the usual kind stays SHARED.
                self.owner.store(UNOWNED, Ordering::Relaxed);
            }
        }
        Guard {
            lock: self,
            mutex: Some(m),
            in_call: first,
            _not_send: PhantomData,
        }
    }

    /// Under the mutex: owner `o` loses the lock for good; returns once
    /// its current call (if any) ended.
    fn revoke(&self, o: u64) {
        self.owner.store(SHARED, Ordering::SeqCst);
        if (o >> 32) as u32 == H::pid() {
            H::barrier_all();
            while self.in_call.load(Ordering::Acquire) != 0 {
                std::thread::yield_now();
            }
        } else {
            // Owned in the parent of this forked process: its `in_call`
            // is a thread that does not exist here, unless it is this
            // thread's own interrupted call.
            let before = H::me_before_fork();
            while before != 0 && self.in_call.load(Ordering::Acquire) == before {
                std::thread::yield_now();
            }
        }
    }

    /// Is the owner inside the outer section now (a snapshot: it may
    /// leave or enter the next moment)?
    pub fn inside(&self) -> bool {
        self.inside.load(Ordering::Acquire) != 0
    }

    /// The owner's token, [`UNOWNED`] or [`SHARED`] (for tests and stats).
    pub fn owner(&self) -> u64 {
        self.owner.load(Ordering::Relaxed)
    }

    /// The owner enters the outer section for `tag` (module doc): a plain
    /// store, a compiler fence and a load. `None`: not the owner, or this
    /// thread is inside already (a signal handler's call inside the
    /// interrupted one): the caller counts itself its shared way.
    #[inline(always)]
    pub fn enter_owned(&self, tag: u32) -> Option<Inside<'_, T, H>> {
        let tag_first = || self.inside_tag.store(tag, Ordering::Relaxed);
        self.owner_enters(&self.inside, H::me(), tag_first)
            .then(|| Inside {
                lock: self,
                _not_send: PhantomData,
            })
    }

    /// After new entries for `tag` were made to stay out (the caller's
    /// generation bump): wait until no thread of this process is inside
    /// the outer section for `tag` the owner's way (module doc). Gives up
    /// after `max_turns` turns (the mutex held by this very thread, which
    /// a signal handler interrupted) and when the one inside is this
    /// thread (a handler's call inside its own wait); returns whether none
    /// is inside.
    pub fn wait_outside(&self, tag: u32, max_turns: u32) -> bool {
        let me = H::me();
        let o = self.owner.load(Ordering::Acquire);
        if o == UNOWNED {
            // Nobody ever entered the owner's way since the lock was last
            // unshared (an owner is made under the mutex, whose release is
            // ordered before its first entry).
            return true;
        }
        if o == me {
            return !self.is_inside(me, tag);
        }
        let mut n = 0u32;
        let m = loop {
            match self.mutex.try_lock() {
                Ok(m) => break m,
                Err(TryLockError::Poisoned(e)) => break e.into_inner(),
                Err(TryLockError::WouldBlock) if n < max_turns => turn(&mut n),
                Err(TryLockError::WouldBlock) => return false,
            }
        };
        let o = self.owner.load(Ordering::Relaxed);
        if o != UNOWNED && o != SHARED {
            self.revoke(o);
        }
        drop(m);
        let pid = H::pid() as u64;
        loop {
            let i = self.inside.load(Ordering::Acquire);
            // A parent's thread copied by fork is not here.
            if i == 0 || i >> 32 != pid || !self.is_inside(i, tag) {
                return true;
            }
            if i == me || n >= max_turns {
                return false;
            }
            turn(&mut n);
        }
    }

    /// Is `who` inside the outer section for `tag`?
    fn is_inside(&self, who: u64, tag: u32) -> bool {
        self.inside.load(Ordering::Acquire) == who && self.inside_tag.load(Ordering::Relaxed) == tag
    }
}

/// One turn of a bounded wait: a spin hint, then yields.
fn turn(n: &mut u32) {
    if *n < 64 {
        core::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
    *n += 1;
}

/// The owner inside the outer section ([`OwnedLock::enter_owned`]); its
/// drop leaves. Not `Send`: the entry is its thread's.
pub struct Inside<'a, T, H: OwnerHost> {
    lock: &'a OwnedLock<T, H>,
    _not_send: PhantomData<*const ()>,
}

impl<T, H: OwnerHost> Drop for Inside<'_, T, H> {
    #[inline(always)]
    fn drop(&mut self) {
        // Release: a closer that sees 0 sees the section's calls done.
        self.lock.inside.store(0, Ordering::Release);
    }
}

/// The lock held: by the mutex, or by the owner alone. Not `Send`: the
/// owner's hold is its thread's.
pub struct Guard<'a, T, H: OwnerHost> {
    lock: &'a OwnedLock<T, H>,
    mutex: Option<MutexGuard<'a, ()>>,
    /// This hold stored the owner's token in `in_call`.
    in_call: bool,
    _not_send: PhantomData<*const ()>,
}

impl<T, H: OwnerHost> Guard<'_, T, H> {
    /// Held without the mutex (the owner's take)?
    pub fn owned(&self) -> bool {
        self.mutex.is_none()
    }

    /// A lock revoked for good may be owned again (a record's next
    /// incarnation, a new socket): under the mutex, with `owner` SHARED,
    /// no thread holds or can take it without the mutex, so 0 is safe.
    pub fn unshare(&self) {
        if self.mutex.is_some() && self.lock.owner.load(Ordering::Relaxed) == SHARED {
            self.lock.owner.store(UNOWNED, Ordering::Relaxed);
        }
    }
}

impl<T, H: OwnerHost> std::ops::Deref for Guard<'_, T, H> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: a guard is the one holder of the lock (module doc).
        unsafe { &*self.lock.data.get() }
    }
}

impl<T, H: OwnerHost> std::ops::DerefMut for Guard<'_, T, H> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` is the guard's only use.
        unsafe { &mut *self.lock.data.get() }
    }
}

impl<T, H: OwnerHost> Drop for Guard<'_, T, H> {
    #[inline(always)]
    fn drop(&mut self) {
        // The owner's give (also when its first take held the mutex):
        // Release, so a revoker that sees 0 sees what it wrote.
        if self.in_call {
            self.lock.in_call.store(0, Ordering::Release);
        }
        // The mutex (if held) is released when `self.mutex` drops.
    }
}

/// Test support (here and in the shim's tests): one thread takes a fresh
/// lock first (owning it where `H` may bias), then it and `others` more
/// threads each add 1 under it until `n` takes each. Returns the final
/// count (`(1 + others) * n` unless an update was lost), whether the first
/// thread owned the lock after its first take, and the owner word at the
/// end.
#[doc(hidden)]
pub fn hammer<H: OwnerHost + 'static>(others: usize, n: u64) -> (u64, bool, u64) {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    let l = Arc::new(OwnedLock::<u64, H>::new(0));
    let go = Arc::new(AtomicBool::new(false));
    let first = {
        let (l, go) = (l.clone(), go.clone());
        std::thread::spawn(move || {
            *l.lock() += 1;
            let owned = l.owner() == H::me();
            go.store(true, Ordering::SeqCst);
            for _ in 1..n {
                *l.lock() += 1;
            }
            owned
        })
    };
    let rest: Vec<_> = (0..others)
        .map(|_| {
            let (l, go) = (l.clone(), go.clone());
            std::thread::spawn(move || {
                while !go.load(Ordering::SeqCst) {
                    std::thread::yield_now();
                }
                for _ in 0..n {
                    *l.lock() += 1;
                }
            })
        })
        .collect();
    let owned = first.join().expect("first thread");
    for t in rest {
        t.join().expect("other thread");
    }
    let total = *l.lock();
    (total, owned, l.owner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU32, fence};

    static NEXT_TID: AtomicU32 = AtomicU32::new(1);
    thread_local! {
        static TID: Cell<u32> = const { Cell::new(0) };
        static BEFORE: Cell<u64> = const { Cell::new(0) };
    }
    static PID: AtomicU32 = AtomicU32::new(7);
    static BIAS: AtomicBool = AtomicBool::new(true);
    static BARRIERS: AtomicU32 = AtomicU32::new(0);
    thread_local! {
        static VISITOR: Cell<bool> = const { Cell::new(false) };
    }

    /// A host whose owner fence is a full fence (symmetric Dekker), so
    /// the logic is tested without membarrier.
    struct T1;
    impl OwnerHost for T1 {
        fn me() -> u64 {
            let t = TID.with(|t| {
                if t.get() == 0 {
                    t.set(NEXT_TID.fetch_add(1, Ordering::Relaxed));
                }
                t.get()
            });
            (PID.load(Ordering::Relaxed) as u64) << 32 | t as u64
        }
        fn me_before_fork() -> u64 {
            BEFORE.with(|b| b.get())
        }
        fn pid() -> u32 {
            PID.load(Ordering::Relaxed)
        }
        fn may_bias() -> bool {
            BIAS.load(Ordering::Relaxed)
        }
        fn owner_fence() {
            fence(Ordering::SeqCst);
        }
        fn barrier_all() {
            BARRIERS.fetch_add(1, Ordering::Relaxed);
            fence(Ordering::SeqCst);
        }
        fn visitor() -> bool {
            VISITOR.with(Cell::get)
        }
    }

    type L = OwnedLock<u64, T1>;

    /// A take of `l` by a new visitor thread, adding `n`.
    fn visit(l: &Arc<L>, n: u64) {
        let l = l.clone();
        std::thread::spawn(move || {
            VISITOR.with(|v| v.set(true));
            let mut g = l.lock();
            assert!(!g.owned(), "a visitor takes the mutex");
            *g += n;
        })
        .join()
        .unwrap();
    }

    /// `try_lock`: the owner's plain take; another thread's fails while
    /// the owner holds it and otherwise revokes as `lock` does (a visitor's
    /// leaves it to be owned again); it fails while the mutex is held.
    #[test]
    fn try_lock_takes_what_no_one_holds_and_never_waits() {
        let l = Arc::new(L::new(0));
        drop(l.lock());
        assert_eq!(l.owner(), T1::me());
        {
            let g = l.try_lock().expect("the owner's take");
            assert!(g.owned());
            // Held by the owner: another thread's try fails at once, a
            // nested try of the owner's too.
            assert!(l.try_lock().is_none(), "nested");
            let l2 = l.clone();
            let other = std::thread::spawn(move || {
                VISITOR.with(|v| v.set(true));
                l2.try_lock().is_none()
            });
            assert!(other.join().unwrap(), "held by the owner");
        }
        assert_eq!(l.owner(), T1::me(), "a failed try revokes nothing");
        // Not held: a visitor's try takes the mutex, revokes, and leaves
        // the lock to be owned again.
        let l2 = l.clone();
        std::thread::spawn(move || {
            VISITOR.with(|v| v.set(true));
            let mut g = l2.try_lock().expect("free");
            assert!(!g.owned());
            *g += 5;
        })
        .join()
        .unwrap();
        assert_eq!(l.owner(), UNOWNED);
        drop(l.lock());
        assert!(l.lock().owned(), "owned again");
        // The mutex held (a non-owner's take): a try fails.
        let l3 = l.clone();
        let (held, go) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let (h2, g2) = (held.clone(), go.clone());
        let t = std::thread::spawn(move || {
            let g = l3.lock();
            assert!(!g.owned());
            h2.store(true, Ordering::SeqCst);
            while !g2.load(Ordering::SeqCst) {
                std::thread::yield_now();
            }
        });
        while !held.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        assert!(l.try_lock().is_none(), "the mutex is held");
        go.store(true, Ordering::SeqCst);
        t.join().unwrap();
        assert_eq!(*l.try_lock().expect("free again"), 5);
        let mut m = L::new(3);
        *m.get_mut() += 1;
        assert_eq!(*m.lock(), 4);
    }

    #[test]
    fn a_visitor_revokes_and_the_owner_owns_it_again() {
        let l = Arc::new(L::new(0));
        // A visitor's first take does not make it the owner.
        visit(&l, 10);
        assert_eq!(l.owner(), UNOWNED, "a visitor never owns it");
        drop(l.lock());
        assert_eq!(l.owner(), T1::me(), "the usual thread owns it");
        let b0 = BARRIERS.load(Ordering::Relaxed);
        visit(&l, 10);
        assert!(BARRIERS.load(Ordering::Relaxed) > b0, "the visit revoked");
        assert_eq!(l.owner(), UNOWNED, "left to be owned again");
        {
            let g = l.lock();
            assert!(!g.owned(), "the re-bias take holds the mutex");
        }
        let g = l.lock();
        assert!(g.owned(), "owned again: the plain take");
        drop(g);
        assert_eq!(*l.lock(), 20);
        // Two threads of the usual kind: SHARED stays SHARED after a visit.
        let l3 = l.clone();
        std::thread::spawn(move || drop(l3.lock())).join().unwrap();
        assert_eq!(l.owner(), SHARED);
        visit(&l, 1);
        assert_eq!(l.owner(), SHARED, "a visit does not undo a sharing");
    }

    #[test]
    fn the_first_taker_owns_and_then_takes_without_the_mutex() {
        let l = L::new(0);
        assert_eq!(l.owner(), UNOWNED);
        {
            let mut g = l.lock();
            assert!(!g.owned(), "the first take holds the mutex");
            *g += 1;
        }
        assert_eq!(l.owner(), T1::me());
        for _ in 0..3 {
            let mut g = l.lock();
            assert!(g.owned());
            *g += 1;
        }
        assert_eq!(*l.lock(), 4);
        assert_eq!(l.in_call.load(Ordering::Relaxed), 0, "given back");
    }

    #[test]
    fn a_nested_take_on_the_owner_thread_is_refused() {
        let l = L::new(0);
        drop(l.lock());
        let g = l.lock();
        assert!(g.owned());
        assert!(
            l.lock_unless_nested().is_none(),
            "a handler's call inside the held lock"
        );
        drop(g);
        assert!(l.lock_unless_nested().is_some_and(|g| g.owned()));
        // Also while the first (owning) take still holds the mutex.
        let l = L::new(0);
        let g = l.lock();
        assert!(!g.owned());
        assert!(l.lock_unless_nested().is_none());
        drop(g);
        assert!(l.lock_unless_nested().is_some());
    }

    #[test]
    fn another_thread_revokes_waiting_for_the_owners_call() {
        let l = Arc::new(L::new(0));
        drop(l.lock());
        let g = l.lock();
        assert!(g.owned());
        let b0 = BARRIERS.load(Ordering::Relaxed);
        let l2 = l.clone();
        let done = Arc::new(AtomicBool::new(false));
        let d2 = done.clone();
        let t = std::thread::spawn(move || {
            let mut g = l2.lock();
            assert!(!g.owned());
            *g += 10;
            d2.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(
            !done.load(Ordering::SeqCst),
            "the revoker waits for the owner's call"
        );
        drop(g);
        t.join().unwrap();
        assert!(done.load(Ordering::SeqCst));
        assert_eq!(l.owner(), SHARED);
        assert!(BARRIERS.load(Ordering::Relaxed) > b0, "a barrier was made");
        // The former owner takes the mutex from now on.
        let g = l.lock();
        assert!(!g.owned());
        assert_eq!(*g, 10);
        // A new incarnation may be owned again.
        g.unshare();
        drop(g);
        assert_eq!(l.owner(), UNOWNED);
        drop(l.lock());
        assert_eq!(l.owner(), T1::me());
    }

    #[test]
    fn no_bias_where_the_host_cannot_barrier() {
        struct NoBias;
        impl OwnerHost for NoBias {
            fn me() -> u64 {
                T1::me()
            }
            fn me_before_fork() -> u64 {
                0
            }
            fn pid() -> u32 {
                T1::pid()
            }
            fn may_bias() -> bool {
                false
            }
            fn owner_fence() {}
            fn barrier_all() {
                unreachable!("never owned, never revoked")
            }
        }
        let l = OwnedLock::<u8, NoBias>::new(0);
        for _ in 0..3 {
            assert!(!l.lock().owned());
        }
        assert_eq!(l.owner(), UNOWNED);
    }

    #[test]
    fn owned_in_a_parent_process_is_revoked_without_waiting_for_its_threads() {
        let l = L::new(5);
        // As a fork copies it: owned by a parent's thread mid-call.
        let parent = (3u64 << 32) | 99;
        l.owner.store(parent, Ordering::Relaxed);
        l.in_call.store(parent, Ordering::Relaxed);
        // Returns (does not wait for the parent's thread), no barrier
        // needed (no thread of this process owned it).
        let g = l.lock();
        assert!(!g.owned());
        assert_eq!(*g, 5);
        drop(g);
        assert_eq!(l.owner(), SHARED);
    }

    #[test]
    fn the_owner_enters_the_outer_section_without_the_mutex() {
        let l = L::new(0);
        assert!(l.enter_owned(4).is_none(), "no owner yet");
        drop(l.lock());
        let i = l.enter_owned(4).expect("the owner's entry");
        assert_eq!(l.inside.load(Ordering::Relaxed), T1::me());
        assert!(
            l.enter_owned(4).is_none(),
            "a handler's entry inside its own wait counts the shared way"
        );
        // The lock is taken inside the section as usual.
        assert!(l.lock().owned());
        drop(i);
        assert_eq!(l.inside.load(Ordering::Relaxed), 0, "left");
        let l = Arc::new(l);
        let l2 = l.clone();
        let other = std::thread::spawn(move || l2.enter_owned(4).is_none());
        assert!(other.join().unwrap(), "another thread is not the owner");
    }

    #[test]
    fn a_closer_revokes_and_waits_for_the_owner_inside_its_tag_only() {
        let l = Arc::new(L::new(0));
        drop(l.lock());
        let inside = l.enter_owned(4).expect("the owner's entry");
        let b0 = BARRIERS.load(Ordering::Relaxed);
        // Another tag (a duplicate fd closed): revoked, not waited for.
        let l2 = l.clone();
        assert!(
            std::thread::spawn(move || l2.wait_outside(5, u32::MAX))
                .join()
                .unwrap()
        );
        assert_eq!(l.owner(), SHARED, "a closer that is not the owner revokes");
        assert!(BARRIERS.load(Ordering::Relaxed) > b0, "with a barrier");
        // Its tag: waited for until the owner leaves (also after the
        // revocation: it entered before it).
        let l2 = l.clone();
        let done = Arc::new(AtomicBool::new(false));
        let d2 = done.clone();
        let t = std::thread::spawn(move || {
            let r = l2.wait_outside(4, u32::MAX);
            d2.store(true, Ordering::SeqCst);
            r
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!done.load(Ordering::SeqCst), "the closer waits");
        assert!(l.enter_owned(4).is_none(), "revoked: no new owned entry");
        drop(inside);
        assert!(t.join().unwrap());
        // And the former owner's lock is the mutex's.
        assert!(!l.lock().owned());
    }

    #[test]
    fn the_owner_closing_waits_for_nobody_and_not_for_itself() {
        let l = L::new(0);
        assert!(l.wait_outside(4, 10), "never owned: nothing to wait for");
        drop(l.lock());
        assert!(l.wait_outside(4, 10));
        let i = l.enter_owned(4).unwrap();
        // A signal handler's close inside its own thread's wait: not
        // waited for (it cannot leave), said so.
        assert!(!l.wait_outside(4, u32::MAX));
        assert!(l.wait_outside(6, u32::MAX), "another fd");
        assert_eq!(l.owner(), T1::me(), "the owner closing keeps it");
        drop(i);
        assert!(l.wait_outside(4, u32::MAX));
    }

    #[test]
    fn a_parent_thread_inside_is_not_waited_for_in_the_child() {
        let l = L::new(0);
        // As a fork copies it: the parent's owner inside its wait on fd 4.
        let parent = (3u64 << 32) | 99;
        l.owner.store(parent, Ordering::Relaxed);
        l.inside_tag.store(4, Ordering::Relaxed);
        l.inside.store(parent, Ordering::Relaxed);
        assert!(l.enter_owned(4).is_none(), "the child's thread is not it");
        assert!(l.wait_outside(4, u32::MAX), "returns, does not wait");
        assert_eq!(l.owner(), SHARED);
    }

    #[test]
    fn a_closer_gives_up_when_the_mutex_stays_held() {
        // The mutex held by the closer's own interrupted thread (a signal
        // handler's close): bounded, as the shared count's wait.
        let l = Arc::new(L::new(0));
        drop(l.lock());
        let l2 = l.clone();
        let held = Arc::new(AtomicBool::new(false));
        let (h2, go) = (held.clone(), Arc::new(AtomicBool::new(false)));
        let g2 = go.clone();
        let t = std::thread::spawn(move || {
            let g = l2.lock(); // revokes, holds the mutex
            h2.store(true, Ordering::SeqCst);
            while !g2.load(Ordering::SeqCst) {
                std::thread::yield_now();
            }
            drop(g);
        });
        while !held.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        assert!(!l.wait_outside(4, 100), "gave up");
        go.store(true, Ordering::SeqCst);
        t.join().unwrap();
        assert!(l.wait_outside(4, 100));
    }

    #[test]
    fn threads_hammering_one_lock_lose_no_update() {
        // The owner takes it without the mutex until another thread comes;
        // every increment must survive the switch.
        const N: u64 = 200_000;
        let (total, owned, end) = hammer::<T1>(2, N);
        assert_eq!(total, 3 * N);
        assert!(owned);
        assert_eq!(end, SHARED);
    }
}
