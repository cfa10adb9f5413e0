//! The single-producer/single-consumer rings AF_XDP shares with the kernel.
//!
//! A ring is a power-of-two array of entries plus a producer and a consumer
//! index (free-running u32 counters: the slot is `index & mask`, and
//! `prod - cons` with wrapping arithmetic is the occupancy even after the
//! counters wrap around 2^32). Private to this crate: the engine sees only
//! owned frames and the operations of [`crate::xsk`].

use crate::mmap::Mmap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

pub(crate) struct Ring<T: Copy> {
    prod: *const AtomicU32,
    cons: *const AtomicU32,
    flags: *const AtomicU32,
    descs: *mut T,
    mask: u32,
    size: u32,
    cached_prod: u32,
    cached_cons: u32,
    _map: Arc<Mmap>,
}

// SAFETY: the raw pointers point into `_map`, owned by the ring; the memory
// is shared only with the kernel, through the ring protocol (acquire loads
// of the other side's index, release stores of ours).
unsafe impl<T: Copy> Send for Ring<T> {}

impl<T: Copy> Ring<T> {
    /// A ring over `map` laid out as `off` says (from XDP_MMAP_OFFSETS).
    /// `size` must be a power of two and `map` at least
    /// `off.desc + size * size_of::<T>()` bytes, with the three indices
    /// 4-byte aligned inside it (both checked: a bad layout panics here,
    /// at open time, never later).
    pub(crate) fn new(map: Mmap, off: &libc::xdp_ring_offset, size: u32) -> Ring<T> {
        assert!(size.is_power_of_two(), "ring size {size}");
        let need = off.desc as usize + size as usize * std::mem::size_of::<T>();
        assert!(map.len >= need, "ring mapping too small");
        for o in [off.producer, off.consumer, off.flags] {
            assert!(o % 4 == 0 && o as usize + 4 <= map.len, "ring offsets");
        }
        // SAFETY: the offsets were checked against the mapping just above;
        // the mapping lives as long as the ring (it is moved into it).
        unsafe {
            let base = map.ptr;
            let prod = base.add(off.producer as usize) as *const AtomicU32;
            let cons = base.add(off.consumer as usize) as *const AtomicU32;
            Ring {
                prod,
                cons,
                flags: base.add(off.flags as usize) as *const AtomicU32,
                descs: base.add(off.desc as usize) as *mut T,
                mask: size - 1,
                size,
                cached_prod: (*prod).load(Ordering::Acquire),
                cached_cons: (*cons).load(Ordering::Acquire),
                _map: Arc::new(map),
            }
        }
    }

    #[inline]
    fn prod_ref(&self) -> &AtomicU32 {
        // SAFETY: the pointer stays valid while the mapping (self._map) lives.
        unsafe { &*self.prod }
    }
    #[inline]
    fn cons_ref(&self) -> &AtomicU32 {
        // SAFETY: as above.
        unsafe { &*self.cons }
    }

    /// Kernel asks to be woken (XDP_RING_NEED_WAKEUP).
    #[inline]
    pub(crate) fn needs_wakeup(&self) -> bool {
        // SAFETY: flags pointer valid while the mapping lives.
        unsafe { (*self.flags).load(Ordering::Relaxed) & libc::XDP_RING_NEED_WAKEUP != 0 }
    }

    /// Reload both indices from the shared ring: a ring with several
    /// producers or consumers in turn (the fill and completion rings of a
    /// shared UMEM, each used only under the shared lock, see
    /// `crate::shared`) must not trust its cached copies across turns.
    #[inline]
    pub(crate) fn resync(&mut self) {
        self.cached_prod = self.prod_ref().load(Ordering::Acquire);
        self.cached_cons = self.cons_ref().load(Ordering::Acquire);
    }

    // ---- producer side (fill, tx) ----

    /// Free slots, refreshing the consumer index only when needed.
    #[inline]
    pub(crate) fn prod_free(&mut self, want: u32) -> u32 {
        let free = self.size - self.cached_prod.wrapping_sub(self.cached_cons);
        if free >= want {
            return free;
        }
        self.cached_cons = self.cons_ref().load(Ordering::Acquire);
        self.size - self.cached_prod.wrapping_sub(self.cached_cons)
    }

    /// Write entry `i` past the producer index. Writing past the free
    /// space would overwrite entries the consumer has not read: a caller
    /// bug, refused (debug assertion) and harmless to memory safety (the
    /// slot index is always masked into the array).
    #[inline]
    pub(crate) fn prod_write(&mut self, i: u32, v: T) {
        debug_assert!(i < self.size - self.cached_prod.wrapping_sub(self.cached_cons));
        let idx = self.cached_prod.wrapping_add(i) & self.mask;
        // SAFETY: idx <= mask < size, inside the descriptor array.
        unsafe { self.descs.add(idx as usize).write(v) };
    }

    /// Publish `n` written entries.
    #[inline]
    pub(crate) fn prod_submit(&mut self, n: u32) {
        self.cached_prod = self.cached_prod.wrapping_add(n);
        self.prod_ref().store(self.cached_prod, Ordering::Release);
    }

    // ---- consumer side (rx, completion) ----

    /// Entries ready to read (up to `max`). A producer index further ahead
    /// than the ring size (a corrupt or hostile producer) is clamped to the
    /// size, so a reader never reads a slot twice in one pass.
    #[inline]
    pub(crate) fn cons_avail(&mut self, max: u32) -> u32 {
        let mut n = self.cached_prod.wrapping_sub(self.cached_cons);
        if n == 0 {
            self.cached_prod = self.prod_ref().load(Ordering::Acquire);
            n = self.cached_prod.wrapping_sub(self.cached_cons);
        }
        n.min(self.size).min(max)
    }

    #[inline]
    pub(crate) fn cons_read(&self, i: u32) -> T {
        let idx = self.cached_cons.wrapping_add(i) & self.mask;
        // SAFETY: idx <= mask < size, inside the descriptor array.
        unsafe { self.descs.add(idx as usize).read() }
    }

    #[inline]
    pub(crate) fn cons_release(&mut self, n: u32) {
        self.cached_cons = self.cached_cons.wrapping_add(n);
        self.cons_ref().store(self.cached_cons, Ordering::Release);
    }

    /// A look at the ring's two indices that needs neither the ring nor its
    /// owner's lock (it keeps the mapping alive).
    pub(crate) fn peek(&self) -> RingPeek {
        RingPeek {
            prod: self.prod,
            cons: self.cons,
            _map: self._map.clone(),
        }
    }

    /// The producer index as last cached.
    #[inline]
    pub(crate) fn cached_prod(&self) -> u32 {
        self.cached_prod
    }
    /// The consumer index as last cached.
    #[inline]
    pub(crate) fn cached_cons(&self) -> u32 {
        self.cached_cons
    }

    /// Address of entry `idx` (absolute ring index) in the descriptor array.
    #[inline]
    pub(crate) fn slot_ptr(&self, idx: u32) -> *const T {
        // wrapping_add: no dereference here, and idx & mask < size anyway.
        self.descs.wrapping_add((idx & self.mask) as usize)
    }

    /// What the producer last wrote at absolute index `idx` (the slot may
    /// since have been consumed or rewritten: a hint, never a descriptor).
    #[inline]
    pub(crate) fn peek_written(&self, idx: u32) -> T {
        // SAFETY: idx & mask < size, inside the descriptor array; T is Copy.
        unsafe { self.slot_ptr(idx).read_volatile() }
    }

    /// Entries the ring holds.
    #[inline]
    pub(crate) fn size(&self) -> u32 {
        self.size
    }

    /// Entries currently queued by the producer and not yet consumed.
    #[inline]
    pub(crate) fn occupancy(&self) -> u32 {
        self.prod_ref()
            .load(Ordering::Relaxed)
            .wrapping_sub(self.cons_ref().load(Ordering::Relaxed))
    }

    /// A ring over a fresh anonymous mapping with both indices at `start`
    /// (tests: both sides of the protocol in one value).
    #[cfg(test)]
    pub(crate) fn anon(size: u32, start: u32) -> Ring<T> {
        let desc = 64u64;
        let map = Mmap::map(
            desc as usize + size as usize * std::mem::size_of::<T>(),
            None,
        )
        .expect("anonymous mapping");
        let off = libc::xdp_ring_offset {
            producer: 0,
            consumer: 4,
            desc,
            flags: 8,
        };
        // SAFETY: the offsets lie inside the fresh mapping (checked in new).
        unsafe {
            (*(map.ptr as *const AtomicU32)).store(start, Ordering::Relaxed);
            (*(map.ptr.add(4) as *const AtomicU32)).store(start, Ordering::Relaxed);
        }
        Ring::new(map, &off, size)
    }

    /// Another party's view of the same ring (tests: the several users of
    /// a shared UMEM's completion ring, and the kernel).
    #[cfg(test)]
    pub(crate) fn clone_view(&self) -> Ring<T> {
        Ring {
            prod: self.prod,
            cons: self.cons,
            flags: self.flags,
            descs: self.descs,
            mask: self.mask,
            size: self.size,
            cached_prod: self.prod_ref().load(Ordering::Acquire),
            cached_cons: self.cons_ref().load(Ordering::Acquire),
            _map: self._map.clone(),
        }
    }
}

/// The producer and consumer indices of a ring, readable from any thread
/// without the ring's owner (see [`Ring::peek`]).
pub(crate) struct RingPeek {
    prod: *const AtomicU32,
    cons: *const AtomicU32,
    _map: Arc<Mmap>,
}

// SAFETY: the pointers point into `_map`, which this value keeps mapped;
// they are only read, with atomic loads (the kernel and the ring's owner
// write them with atomic stores).
unsafe impl Send for RingPeek {}
// SAFETY: as above: shared use is atomic loads only.
unsafe impl Sync for RingPeek {}

impl RingPeek {
    /// Entries published and not yet released by the consumer. The
    /// producer's index is loaded with Acquire (it pairs with the
    /// producer's release store after it wrote the entries, as
    /// `cons_avail` does); no entry is read here. The consumer's index is
    /// loaded after it, Relaxed: a stale value can only make entries look
    /// pending (see nanowire-stack's `Engine::rx_quiet` for the full
    /// argument).
    #[inline]
    pub(crate) fn pending(&self) -> bool {
        // SAFETY: both pointers stay valid while `_map` lives.
        unsafe { (*self.prod).load(Ordering::Acquire) != (*self.cons).load(Ordering::Relaxed) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Produce `n` values starting at `v`, consume them back, check order.
    fn round(r: &mut Ring<u64>, n: u32, v: u64) {
        assert!(r.prod_free(n) >= n);
        for i in 0..n {
            r.prod_write(i, v + u64::from(i));
        }
        r.prod_submit(n);
        assert_eq!(r.cons_avail(u32::MAX), n);
        for i in 0..n {
            assert_eq!(r.cons_read(i), v + u64::from(i));
        }
        r.cons_release(n);
        assert_eq!(r.cons_avail(u32::MAX), 0);
    }

    #[test]
    fn full_and_empty_boundaries() {
        let mut r: Ring<u64> = Ring::anon(8, 0);
        assert_eq!(r.cons_avail(u32::MAX), 0, "empty");
        assert_eq!(r.prod_free(1), 8);
        for i in 0..8 {
            r.prod_write(i, u64::from(i));
        }
        r.prod_submit(8);
        assert_eq!(r.prod_free(1), 0, "full: no free slot");
        assert_eq!(r.occupancy(), 8);
        assert_eq!(r.cons_avail(3), 3, "max respected");
        assert_eq!(r.cons_avail(u32::MAX), 8);
        r.cons_release(1);
        assert_eq!(r.prod_free(1), 1, "one slot after one release");
        r.cons_release(7);
        assert_eq!(r.cons_avail(u32::MAX), 0);
        assert_eq!(r.prod_free(8), 8);
    }

    #[test]
    fn a_peek_sees_what_is_published_and_not_released() {
        let mut r: Ring<u64> = Ring::anon(8, u32::MAX - 1);
        let p = r.peek();
        assert!(!p.pending(), "empty");
        r.prod_write(0, 1);
        assert!(!p.pending(), "written, not published");
        r.prod_submit(1);
        assert!(p.pending(), "published");
        assert_eq!(r.cons_avail(u32::MAX), 1);
        assert!(p.pending(), "read, not released");
        r.cons_release(1);
        assert!(!p.pending(), "released (across the wrap)");
        // The peek keeps the mapping: it outlives the ring.
        r.prod_write(0, 2);
        r.prod_submit(1);
        drop(r);
        assert!(p.pending());
    }

    #[test]
    fn indices_wrap_around_u32() {
        // Start 5 below 2^32: every round crosses the wrap at a new slot.
        for start in [u32::MAX - 4, u32::MAX, 0u32.wrapping_sub(8)] {
            let mut r: Ring<u64> = Ring::anon(8, start);
            for k in 0..40u64 {
                round(&mut r, (k % 8 + 1) as u32, k * 100);
            }
            // Fill completely across the wrap, then drain.
            round(&mut r, 8, 7);
            assert_eq!(r.occupancy(), 0);
        }
    }

    #[test]
    fn hostile_producer_index_is_bounded() {
        let mut r: Ring<u64> = Ring::anon(8, 0);
        // The other side claims 1000 entries in an 8-entry ring.
        r.prod_ref().store(1000, Ordering::Release);
        assert_eq!(r.cons_avail(u32::MAX), 8);
    }

    #[test]
    fn descriptor_rings_wrap_too() {
        let mut r: Ring<libc::xdp_desc> = Ring::anon(4, u32::MAX - 1);
        for k in 0..10u64 {
            assert_eq!(r.prod_free(2), 4);
            r.prod_write(
                0,
                libc::xdp_desc {
                    addr: k,
                    len: 1,
                    options: 0,
                },
            );
            r.prod_write(
                1,
                libc::xdp_desc {
                    addr: k + 1,
                    len: 2,
                    options: 0,
                },
            );
            r.prod_submit(2);
            assert_eq!(r.cons_avail(u32::MAX), 2);
            assert_eq!(r.cons_read(0).addr, k);
            assert_eq!(r.cons_read(1).len, 2);
            r.cons_release(2);
        }
    }
}
