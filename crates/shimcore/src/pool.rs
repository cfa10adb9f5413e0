//! Type-stable storage for the shim's engine socket records.
//!
//! A record is read by a thread that found it in the fd table while
//! another thread may close its fd at any moment; the reader never holds
//! a lock or a reference count on the data path. So a record's memory is
//! never returned to the allocator: when its last fd closes, the record
//! goes on its type's free list ([`Pool::put`]) and the next socket of that
//! type takes it from there ([`Pool::take`]), like the kernel's
//! `SLAB_TYPESAFE_BY_RCU` caches. Memory is bounded by the peak number of
//! records alive at once, not by the number ever made (a server doing a
//! million short connections keeps as many records as it had open
//! together). What makes reuse safe for a reader that still holds an old
//! incarnation is the record's generation (`sock::Common`): every use is
//! checked against the generation the lookup read.
//!
//! The free list is a lock-free stack of record indexes (a lock would be
//! held across `fork` by another thread, and the child would wait for it
//! forever): the head word holds the top index and a tag that every push
//! and pop changes, so a pop that read a stale top fails its
//! compare-exchange instead of linking a record that is in use (ABA).

use crate::fdtable::{Chunks, MAX_FD};
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

/// A record's place in its [`Pool`]: its index (fixed when it is made) and
/// the next free record while it is on the free list.
pub struct Link {
    /// 1 + the record's index in its pool (0: not indexed, never reused).
    index: u32,
    /// 1 + the index of the next free record (0: none), while free.
    next: AtomicU32,
}

impl Link {
    /// The link of a record that is made outside any pool (never reused).
    pub const fn none() -> Link {
        Link {
            index: 0,
            next: AtomicU32::new(0),
        }
    }
}

/// A type whose records a [`Pool`] keeps.
///
/// # Safety
/// `link` returns the [`Link`] the pool gave the record when it was made
/// (the one passed to [`Pool::take`]'s `make`), every time.
pub unsafe trait Pooled: Sync + 'static {
    fn link(&self) -> &Link;
}

const LOW: u64 = 0xffff_ffff;

/// The records of one type (see the module doc).
pub struct Pool<T: 'static> {
    /// Index → record, for every record ever made (leaked boxes).
    slots: Chunks<AtomicPtr<T>>,
    /// Tag (bits 32..64) and 1 + the top free index (bits 0..32; 0: empty).
    head: AtomicU64,
    /// Records made so far (the next index).
    made: AtomicU32,
}

impl<T: Pooled> Default for Pool<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Pooled> Pool<T> {
    pub const fn new() -> Pool<T> {
        Pool {
            slots: Chunks::new(),
            head: AtomicU64::new(0),
            made: AtomicU32::new(0),
        }
    }

    /// A record for a new socket: a free one, `(r, false)` (the caller
    /// starts its next incarnation), or, with none free, a new one that
    /// `make` builds around the link it is given, `(r, true)`.
    pub fn take(&self, make: impl FnOnce(Link) -> T) -> (&'static T, bool) {
        let mut h = self.head.load(Ordering::Acquire);
        loop {
            let top = (h & LOW) as u32;
            if top == 0 {
                break;
            }
            let r = self.record(top);
            let next = r.link().next.load(Ordering::Acquire);
            let nh = ((h >> 32).wrapping_add(1) << 32) | u64::from(next);
            match self
                .head
                .compare_exchange_weak(h, nh, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return (r, false),
                Err(now) => h = now,
            }
        }
        let i = self.made.fetch_add(1, Ordering::Relaxed);
        let slot = (i < MAX_FD as u32)
            .then(|| self.slots.get_or_alloc(i as i32))
            .flatten();
        let Some(slot) = slot else {
            // Past the index space: this one is never reused.
            return (Box::leak(Box::new(make(Link::none()))), true);
        };
        let r: &'static T = Box::leak(Box::new(make(Link {
            index: i + 1,
            next: AtomicU32::new(0),
        })));
        slot.store(std::ptr::from_ref(r).cast_mut(), Ordering::Release);
        (r, true)
    }

    /// `r`'s incarnation has ended (no fd names it, its engine object is
    /// gone): a later [`Pool::take`] may reuse it. Each incarnation is put
    /// once (`sock::Common::end` says which caller does it).
    pub fn put(&self, r: &'static T) {
        let link = r.link();
        if link.index == 0 {
            return;
        }
        let mut h = self.head.load(Ordering::Acquire);
        loop {
            link.next.store((h & LOW) as u32, Ordering::Relaxed);
            let nh = ((h >> 32).wrapping_add(1) << 32) | u64::from(link.index);
            match self
                .head
                .compare_exchange_weak(h, nh, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(now) => h = now,
            }
        }
    }

    /// Records made so far (free or in use).
    pub fn made(&self) -> u32 {
        self.made.load(Ordering::Relaxed)
    }

    /// The record of 1-based index `top` (on the free list, so made and
    /// published).
    fn record(&self, top: u32) -> &'static T {
        let p = self
            .slots
            .get(top as i32 - 1)
            .map_or(std::ptr::null_mut(), |s| s.load(Ordering::Acquire));
        assert!(!p.is_null(), "pool: a free index names no record");
        // SAFETY: `p` came from Box::leak of a record made by `take` and
        // published with Release before its index could reach the free
        // list; records are never freed, so it is valid for 'static.
        unsafe { &*p }
    }
}

/// Interned fd lists (what a sleeping wait on a record polls): records
/// that wait on the same fds share one list, and a list, once made, is
/// never freed (a thread holding an earlier incarnation of a record may
/// still read it). `N` distinct lists at most are interned; past that
/// each new one is leaked (the caller's records then grow with it).
pub struct FdLists<const N: usize> {
    lists: [AtomicPtr<Box<[i32]>>; N],
}

impl<const N: usize> Default for FdLists<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> FdLists<N> {
    pub const fn new() -> FdLists<N> {
        FdLists {
            lists: [const { AtomicPtr::new(std::ptr::null_mut()) }; N],
        }
    }

    /// The interned list equal to `fds` (valid for the life of the process).
    /// (`&Box`: a thin pointer to the list, what [`FdList`]'s `AtomicPtr`
    /// can hold.)
    #[allow(clippy::borrowed_box)]
    pub fn intern(&self, fds: Vec<i32>) -> &'static Box<[i32]> {
        for slot in &self.lists {
            let p = slot.load(Ordering::Acquire);
            let p = if p.is_null() {
                let fresh = Box::into_raw(Box::new(fds.clone().into_boxed_slice()));
                match slot.compare_exchange(
                    std::ptr::null_mut(),
                    fresh,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => fresh,
                    Err(now) => {
                        // SAFETY: `fresh` was never published (we lost the
                        // race): ours to free.
                        drop(unsafe { Box::from_raw(fresh) });
                        now
                    }
                }
            } else {
                p
            };
            // SAFETY: a published list: made by Box::into_raw above and
            // never freed, so valid for 'static.
            #[allow(clippy::borrowed_box)]
            let l: &'static Box<[i32]> = unsafe { &*p };
            if l[..] == fds[..] {
                return l;
            }
        }
        Box::leak(Box::new(Box::new(fds.into_boxed_slice())))
    }
}

/// A record's wait-fd list: one of the [`FdLists`] (or empty), swapped
/// whole, so a reader of an earlier incarnation still reads a valid list.
pub struct FdList(AtomicPtr<Box<[i32]>>);

impl Default for FdList {
    fn default() -> Self {
        Self::empty()
    }
}

impl FdList {
    pub const fn empty() -> FdList {
        FdList(AtomicPtr::new(std::ptr::null_mut()))
    }

    /// The list now.
    #[inline]
    pub fn get(&self) -> &'static [i32] {
        let p = self.0.load(Ordering::Acquire);
        if p.is_null() {
            return &[];
        }
        // SAFETY: only `set` stores here, and only 'static lists (never
        // freed), published with Release.
        unsafe { &*p }
    }

    /// Make `l` the list.
    #[allow(clippy::borrowed_box)]
    pub fn set(&self, l: &'static Box<[i32]>) {
        self.0
            .store(std::ptr::from_ref(l).cast_mut(), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sock::Common;
    use std::sync::Arc;

    struct R {
        link: Link,
        common: Common,
        /// Which socket the record serves now.
        owner: AtomicU32,
    }
    // SAFETY: `link` is the pool's link, as given to `make`.
    unsafe impl Pooled for R {
        fn link(&self) -> &Link {
            &self.link
        }
    }

    fn make(link: Link) -> R {
        R {
            link,
            common: Common::new(1, false, 0),
            owner: AtomicU32::new(0),
        }
    }

    #[test]
    fn a_closed_record_is_reused_with_the_next_generation() {
        let p: Pool<R> = Pool::new();
        let (a, fresh) = p.take(make);
        assert!(fresh);
        let g = a.common.generation();
        // The last fd closes: the incarnation ends, the record is free.
        assert!(a.common.release());
        assert!(a.common.end(g));
        p.put(a);
        let (b, fresh) = p.take(make);
        assert!(!fresh, "taken from the free list");
        assert!(std::ptr::eq(a, b));
        b.common.reset(1, false, 0);
        assert_eq!(b.common.generation(), g.wrapping_add(1));
        // A lookup made before the close holds (a, g): it sees the mismatch.
        assert_ne!(a.common.generation(), g);
        assert!(!a.common.add_ref_if(g));
        assert_eq!(p.made(), 1);
    }

    #[test]
    fn memory_is_bounded_by_the_records_alive_at_once() {
        let p: Pool<R> = Pool::new();
        for _ in 0..10_000 {
            let live: Vec<&'static R> = (0..3).map(|_| p.take(make).0).collect();
            for r in live {
                let g = r.common.generation();
                r.common.reset(1, false, 0);
                assert!(r.common.end(g));
                p.put(r);
            }
        }
        assert_eq!(p.made(), 3);
    }

    #[test]
    fn equal_fd_lists_are_interned_once() {
        let l: FdLists<2> = FdLists::new();
        let a = l.intern(vec![3, 4, 5]);
        assert!(
            std::ptr::eq(l.intern(vec![3, 4, 5]), a),
            "the same list again"
        );
        let b = l.intern(vec![6]);
        assert!(!std::ptr::eq(a, b));
        // Past the table: a fresh (leaked) list, still readable.
        let c = l.intern(vec![7]);
        assert_eq!(&c[..], &[7]);
        let w = FdList::empty();
        assert!(w.get().is_empty());
        w.set(b);
        assert_eq!(w.get(), &[6]);
    }

    #[test]
    fn an_unindexed_record_is_never_put_back() {
        let p: Pool<R> = Pool::new();
        static LONE: std::sync::OnceLock<R> = std::sync::OnceLock::new();
        let r = LONE.get_or_init(|| make(Link::none()));
        p.put(r);
        let (_, fresh) = p.take(make);
        assert!(fresh);
    }

    #[test]
    fn threads_never_share_a_record_they_took() {
        // Four threads take and put records as fast as they can; each
        // marks the record it holds and checks nobody else holds it.
        let p: Arc<Pool<R>> = Arc::new(Pool::new());
        let hs: Vec<_> = (1..=4u32)
            .map(|me| {
                let p = Arc::clone(&p);
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        let (r, fresh) = p.take(make);
                        if !fresh {
                            r.common.reset(1, false, 0);
                        }
                        assert_eq!(r.owner.swap(me, Ordering::AcqRel), 0, "held twice");
                        std::hint::spin_loop();
                        assert_eq!(r.owner.swap(0, Ordering::AcqRel), me);
                        let g = r.common.generation();
                        assert!(r.common.release());
                        assert!(r.common.end(g));
                        p.put(r);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert!(p.made() <= 4, "at most one record per thread: {}", p.made());
    }
}
