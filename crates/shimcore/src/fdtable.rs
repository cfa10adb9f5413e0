//! The fd table: per-fd slots in lazily allocated chunks indexed directly
//! by the fd number (O(1), no lock on any path), and on it the shim's
//! tables:
//!
//! * [`FdTable`]: one atomic word per fd: what the shim knows about the fd
//!   (its class, a few flags), the number of threads spinning on it, and a
//!   generation that `close`/`dup2` ([`FdTable::retire`]) and `shutdown`
//!   ([`FdTable::wake`]) bump, so that a thread waiting on an fd notices
//!   that another thread closed it (EBADF) or shut it down (the kernel
//!   answers);
//! * [`SockTable`]: per fd, the engine's socket record, UDP or TCP, as one
//!   tagged pointer (type-stable records, never freed: a reference read by
//!   one thread stays valid when another clears the slot; a record may be
//!   reused, so a lookup that must not reach a later socket reads the
//!   record's generation with it: [`SockTable::checked`], [`Ref`]): the one
//!   lookup an interposed call makes to learn what serves the fd.
//!
//! The layout of a word: bits 0..8 the class (`C_*`), 8..16 and 32.. flags
//! and generation, 16..32 the spinner count.

use crate::sock::Common;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};

/// Slots per chunk.
pub const CHUNK: usize = 4096;
/// Chunks per table.
pub const CHUNKS: usize = 256;
/// fds at or above this are not tracked (served by the kernel, unaccelerated).
pub const MAX_FD: usize = CHUNK * CHUNKS;

/// Per-fd slots of type `S` in chunks of [`CHUNK`], each allocated on first
/// use (a leaked box published with Release) and freed only when the table
/// is dropped (tables of the shim are statics: never).
pub struct Chunks<S: 'static> {
    /// Each non-null pointer is the first of [`CHUNK`] slots.
    chunks: [AtomicPtr<S>; CHUNKS],
}

impl<S: Default + Sync + 'static> Default for Chunks<S> {
    fn default() -> Self {
        Self::new()
    }
}

impl<S: Default + Sync + 'static> Chunks<S> {
    pub const fn new() -> Chunks<S> {
        Chunks {
            chunks: [const { AtomicPtr::new(std::ptr::null_mut()) }; CHUNKS],
        }
    }

    /// The slot of `fd` if its chunk exists (one load, one branch).
    #[inline(always)]
    pub fn get(&self, fd: i32) -> Option<&S> {
        let i = usize::try_from(fd).ok()?;
        if i >= MAX_FD {
            return None;
        }
        let p = self.chunks[i / CHUNK].load(Ordering::Acquire);
        if p.is_null() {
            return None;
        }
        // SAFETY: `p` is the first of CHUNK slots of a chunk published with
        // Release by `alloc` and freed only by `drop` (which `&self` rules
        // out); i % CHUNK < CHUNK.
        Some(unsafe { &*p.add(i % CHUNK) })
    }

    /// The slot of `fd`, allocating its chunk if needed (`None`: negative
    /// or too large).
    #[inline(always)]
    pub fn get_or_alloc(&self, fd: i32) -> Option<&S> {
        match self.get(fd) {
            Some(s) => Some(s),
            None => self.alloc(fd),
        }
    }

    #[cold]
    fn alloc(&self, fd: i32) -> Option<&S> {
        let i = usize::try_from(fd).ok()?;
        if i >= MAX_FD {
            return None;
        }
        let fresh: Box<[S]> = (0..CHUNK).map(|_| S::default()).collect();
        let fresh = Box::into_raw(fresh).cast::<S>();
        if self.chunks[i / CHUNK]
            .compare_exchange(
                std::ptr::null_mut(),
                fresh,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_err()
        {
            // SAFETY: `fresh` came from Box::into_raw of a CHUNK-long boxed
            // slice just above and was never published (we lost the race),
            // so we own it.
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(fresh, CHUNK)) });
        }
        self.get(fd)
    }

    /// Every slot of the allocated chunks, with its fd (for rare events:
    /// fork, spawn, close_range).
    pub fn each(&self, mut f: impl FnMut(i32, &S)) {
        for (c, chunk) in self.chunks.iter().enumerate() {
            let p = chunk.load(Ordering::Acquire);
            if p.is_null() {
                continue;
            }
            for i in 0..CHUNK {
                // SAFETY: as in `get`: a published chunk, i < CHUNK.
                f((c * CHUNK + i) as i32, unsafe { &*p.add(i) });
            }
        }
    }

    /// One past the highest fd an allocated chunk covers (0: none).
    pub fn limit(&self) -> usize {
        self.chunks
            .iter()
            .rposition(|c| !c.load(Ordering::Acquire).is_null())
            .map_or(0, |c| (c + 1) * CHUNK)
    }
}

impl<S: 'static> Drop for Chunks<S> {
    fn drop(&mut self) {
        for c in &mut self.chunks {
            let p = *c.get_mut();
            if !p.is_null() {
                // SAFETY: a chunk made by `alloc` from a CHUNK-long boxed
                // slice; `&mut self` means no slot is borrowed any more.
                drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, CHUNK)) });
            }
        }
    }
}

// ------------------------------------------------------------- words

pub const C_UNKNOWN: u64 = 0;
/// Not a socket, or a socket of a family the shim leaves alone.
pub const C_OTHER: u64 = 1;
/// IPv4/IPv6 datagram socket.
pub const C_UDP: u64 = 2;
/// IPv4/IPv6 stream socket.
pub const C_TCP: u64 = 3;
/// An epoll instance.
pub const C_EPOLL: u64 = 4;
const CLASS_MASK: u64 = 0xff;
/// SO_RCVTIMEO is set: blocking receives keep their own timeout, no spin.
pub const F_RCVTIMEO: u64 = 1 << 8;
/// An epoll instance with at least one UDP/TCP socket registered.
pub const F_EPOLL_INET: u64 = 1 << 9;
/// `shutdown` was called on this fd (set with a generation bump; `retire`
/// clears it): a generation change with this bit is a wake-up, without it
/// the fd was closed (and maybe reused).
pub const F_WOKEN: u64 = 1 << 10;
/// The fd is served by the xdp engine (its record is in the UDP table).
pub const F_ACCEL: u64 = 1 << 11;
/// A UDP socket that may still be put on the xdp engine (at bind, connect
/// or first send).
pub const F_CAND: u64 = 1 << 12;
/// An epoll instance with an accelerated socket registered.
pub const F_EPOLL_ACCEL: u64 = 1 << 13;
/// A forked child was told (once) that it uses an inherited accelerated
/// socket through the kernel only.
pub const F_INHERIT_LOGGED: u64 = 1 << 14;
/// An AF_INET stream socket that may still be put on the xdp engine (at
/// listen or connect).
pub const F_TCAND: u64 = 1 << 15;
const GEN_SHIFT: u32 = 32;
/// Threads currently spinning on the fd (bits 16..32): `close` waits for
/// them to leave before the number can be reused.
const SPIN_SHIFT: u32 = 16;
const SPIN_MASK: u64 = 0xffff << SPIN_SHIFT;
/// Class and flags (what `retire` forgets).
const STATE_MASK: u64 = ((1 << GEN_SHIFT) - 1) & !SPIN_MASK;

#[inline(always)]
pub fn class(w: u64) -> u64 {
    w & CLASS_MASK
}

#[inline(always)]
pub fn generation(w: u64) -> u64 {
    w >> GEN_SHIFT
}

/// Threads spinning on the fd the word belongs to.
#[inline(always)]
pub fn spinners(w: u64) -> u64 {
    (w & SPIN_MASK) >> SPIN_SHIFT
}

/// Did the fd change from `w0` (a waiter's first look) to `w` because it
/// was closed (or closed and reused), rather than only woken by `shutdown`?
/// `None`: the generation is the same.
#[inline(always)]
pub fn closed_since(w0: u64, w: u64) -> Option<bool> {
    if generation(w) == generation(w0) {
        return None;
    }
    Some(w & F_WOKEN == 0 || class(w) != class(w0))
}

/// One atomic word per fd (see the module doc).
pub struct FdTable {
    words: Chunks<AtomicU64>,
}

impl Default for FdTable {
    fn default() -> Self {
        Self::new()
    }
}

impl FdTable {
    pub const fn new() -> FdTable {
        FdTable {
            words: Chunks::new(),
        }
    }

    /// The word of `fd` (0 = unknown, generation 0).
    #[inline(always)]
    pub fn get(&self, fd: i32) -> u64 {
        self.words.get(fd).map_or(0, |s| s.load(Ordering::Acquire))
    }

    /// The word as a waiter must read it (after [`FdTable::spin_enter`]:
    /// sequentially consistent with `retire` + `wait_spinners`).
    #[inline(always)]
    pub fn get_now(&self, fd: i32) -> u64 {
        self.words.get(fd).map_or(0, |s| s.load(Ordering::SeqCst))
    }

    /// Generation of `fd` as a spinner must read it.
    #[inline(always)]
    pub fn generation_now(&self, fd: i32) -> u64 {
        generation(self.get_now(fd))
    }

    /// Set class and flags, keeping the generation and the spinners.
    pub fn set(&self, fd: i32, class: u64, flags: u64) {
        let Some(s) = self.words.get_or_alloc(fd) else {
            return;
        };
        let _ = s.fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
            Some((w & !STATE_MASK) | class | flags)
        });
    }

    /// Add flags, keeping class and generation.
    pub fn add_flags(&self, fd: i32, flags: u64) {
        if let Some(s) = self.words.get_or_alloc(fd) {
            s.fetch_or(flags, Ordering::AcqRel);
        }
    }

    /// Remove flags.
    pub fn clear_flags(&self, fd: i32, flags: u64) {
        if let Some(s) = self.words.get(fd) {
            s.fetch_and(!flags, Ordering::AcqRel);
        }
    }

    /// The fd was closed or replaced: forget it and bump its generation.
    pub fn retire(&self, fd: i32) {
        if let Some(s) = self.words.get(fd) {
            let _ = s.fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                Some(((generation(w) + 1) << GEN_SHIFT) | (w & SPIN_MASK) | C_UNKNOWN)
            });
        }
    }

    /// Something happened that a waiter must notice although the fd stays
    /// what it is (shutdown): bump the generation, keep the rest.
    pub fn wake(&self, fd: i32) {
        if let Some(s) = self.words.get(fd) {
            let _ = s.fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                Some(w.wrapping_add(1 << GEN_SHIFT) | F_WOKEN)
            });
        }
    }

    /// A thread starts a wait that makes syscalls on `fd`; the returned
    /// guard ends it. While any is active, `close` holds the number (see
    /// [`FdTable::wait_spinners`]), so a waiter never issues a call on a
    /// reused fd: it re-reads the generation before every attempt.
    #[inline]
    pub fn spin_enter(&self, fd: i32) -> SpinGuard<'_> {
        let s = self.words.get(fd);
        if let Some(s) = s {
            s.fetch_add(1 << SPIN_SHIFT, Ordering::SeqCst);
        }
        SpinGuard(s)
    }

    /// After `retire(fd)` and before the real close: wait (at most
    /// `max_turns` turns, in case close runs in a signal handler on the
    /// spinning thread) until every spinner on `fd` has left. Returns
    /// whether they all left.
    pub fn wait_spinners(&self, fd: i32, max_turns: u32) -> bool {
        let Some(s) = self.words.get(fd) else {
            return true;
        };
        let mut n = 0u32;
        while s.load(Ordering::SeqCst) & SPIN_MASK != 0 {
            if n >= max_turns {
                return false;
            }
            if n < 64 {
                core::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
            n += 1;
        }
        true
    }

    /// Every fd whose word has all of `flags` (allocated chunks only).
    pub fn each_with(&self, flags: u64, mut f: impl FnMut(i32)) {
        self.words.each(|fd, s| {
            if s.load(Ordering::Acquire) & flags == flags {
                f(fd);
            }
        });
    }

    /// Does any fd's word have any of `flags`?
    pub fn any_with(&self, flags: u64) -> bool {
        let mut any = false;
        self.words
            .each(|_, s| any |= s.load(Ordering::Acquire) & flags != 0);
        any
    }

    /// Is anything but the generation recorded for `fd`?
    pub fn tracked(&self, fd: i32) -> bool {
        self.get(fd) & ((1 << GEN_SHIFT) - 1) != 0
    }

    /// One past the highest fd an allocated chunk covers.
    pub fn limit(&self) -> usize {
        self.words.limit()
    }
}

/// A waiter on one fd (see [`FdTable::spin_enter`]).
pub struct SpinGuard<'a>(Option<&'a AtomicU64>);

impl Drop for SpinGuard<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.0 {
            s.fetch_sub(1 << SPIN_SHIFT, Ordering::SeqCst);
        }
    }
}

// ------------------------------------------------------------ records

/// The protocol of an engine socket record: which operations serve the fd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A UDP socket on the engine (or a forked child's inherited copy).
    Udp = 1,
    /// A TCP listener or connection on the engine.
    Tcp = 2,
}

const TAG_MASK: usize = 3;

/// A type of record the [`SockTable`] holds, with its [`Kind`].
///
/// # Safety
/// No two types of one program implement `Record` with the same `KIND`:
/// the table hands a pointer stored by `set::<R>` back as an `R` on the
/// strength of the kind alone. The type's alignment is at least 4 (checked
/// at compile time: the kind lives in the pointer's two low bits).
pub unsafe trait Record: Sync + 'static {
    const KIND: Kind;
    /// The state every record shares; its generation names the record's
    /// incarnation (records are reused: `crate::pool`).
    fn common(&self) -> &Common;
}

/// A record as one lookup found it: the record and the generation it had
/// while the fd named it ([`SockTable::checked`]). Whatever is done
/// through it is checked against that generation ([`Ref::live`]): after
/// the record was closed and reused for another socket, the holder sees a
/// closed fd, never the other socket.
pub struct Ref<R: 'static> {
    r: &'static R,
    generation: u32,
}

impl<R> Clone for Ref<R> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<R> Copy for Ref<R> {}

impl<R> std::ops::Deref for Ref<R> {
    type Target = R;
    #[inline(always)]
    fn deref(&self) -> &R {
        self.r
    }
}

impl<R: Record> Ref<R> {
    /// `r` at `generation` (which the caller read while an fd named it, or
    /// holds because it made that incarnation).
    #[inline(always)]
    pub fn new(r: &'static R, generation: u32) -> Ref<R> {
        Ref { r, generation }
    }

    /// The incarnation this lookup found.
    #[inline(always)]
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// The record (whichever incarnation it is in now).
    #[inline(always)]
    pub fn record(&self) -> &'static R {
        self.r
    }

    /// Is the record still the incarnation this lookup found?
    #[inline(always)]
    pub fn live(&self) -> bool {
        self.r.common().generation() == self.generation
    }

    /// The same record and incarnation?
    #[inline(always)]
    pub fn same(&self, o: &Ref<R>) -> bool {
        std::ptr::eq(self.r, o.r) && self.generation == o.generation
    }
}

/// What a slot of the [`SockTable`] holds: a record of some kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Raw(usize);

impl Raw {
    /// The record's protocol.
    #[inline(always)]
    pub fn kind(self) -> Kind {
        if self.0 & TAG_MASK == Kind::Udp as usize {
            Kind::Udp
        } else {
            Kind::Tcp
        }
    }

    /// The record, if it is an `R`.
    #[inline(always)]
    pub fn get<R: Record>(self) -> Option<&'static R> {
        if self.0 & TAG_MASK != R::KIND as usize {
            return None;
        }
        // SAFETY: a slot tagged R::KIND was stored by `SockTable::set::<R>`
        // from a `&'static R` (the kind names one type: `Record`'s
        // contract), with the tag in the low bits its alignment leaves
        // free.
        Some(unsafe { &*((self.0 & !TAG_MASK) as *const R) })
    }

    /// Is this the record `r`?
    pub fn is<R: Record>(self, r: &R) -> bool {
        self.get::<R>().is_some_and(|x| std::ptr::eq(x, r))
    }
}

/// The one table of the engine's socket records: per fd, a pointer to a
/// leaked record tagged with its [`Kind`] (one word: a lookup is two loads
/// and no lock, whatever the protocol). Records are `'static` (leaked,
/// never freed), so a reference read by one thread stays valid when
/// another thread clears the slot.
pub struct SockTable {
    slots: Chunks<AtomicUsize>,
}

impl Default for SockTable {
    fn default() -> Self {
        Self::new()
    }
}

impl SockTable {
    pub const fn new() -> SockTable {
        SockTable {
            slots: Chunks::new(),
        }
    }

    /// The record of `fd`, if any (two loads, no lock).
    #[inline(always)]
    pub fn get(&self, fd: i32) -> Option<Raw> {
        let w = self.slots.get(fd)?.load(Ordering::Acquire);
        if w == 0 { None } else { Some(Raw(w)) }
    }

    /// The record of `fd` if it is an `R`.
    #[inline(always)]
    pub fn get_as<R: Record>(&self, fd: i32) -> Option<&'static R> {
        self.get(fd)?.get::<R>()
    }

    /// Map `fd` to `r` (whatever it held before); `false` when `fd` cannot
    /// be tracked.
    pub fn set<R: Record>(&self, fd: i32, r: &'static R) -> bool {
        const { assert!(std::mem::align_of::<R>() > TAG_MASK) };
        match self.slots.get_or_alloc(fd) {
            Some(s) => {
                s.store(r as *const R as usize | R::KIND as usize, Ordering::Release);
                true
            }
            None => false,
        }
    }

    /// `raw` (which [`SockTable::get`] returned for `fd`) as an `R` with
    /// the generation it has while `fd` names it: the generation is read,
    /// then the slot again; `None` if the slot changed meanwhile (the fd
    /// was closed or replaced: the caller treats it as closed) or the
    /// record is not an `R`.
    ///
    /// Why that is enough: a slot names a record only while the
    /// incarnation it names has that fd (the slot is cleared before the
    /// incarnation ends). If the slot holds the same word after the
    /// generation was read, either nothing changed, or the record went
    /// through later incarnations and this fd names it again: then the
    /// generation read is an ended one (every use fails [`Ref::live`]) or
    /// the current one of this very fd.
    #[inline(always)]
    pub fn checked<R: Record>(&self, fd: i32, raw: Raw) -> Option<Ref<R>> {
        let r = raw.get::<R>()?;
        let g = r.common().generation();
        let s = self.slots.get(fd)?;
        (s.load(Ordering::Acquire) == raw.0).then_some(Ref::new(r, g))
    }

    /// The record of `fd` if it is an `R`, with its generation
    /// ([`SockTable::checked`]).
    #[inline(always)]
    pub fn get_ref<R: Record>(&self, fd: i32) -> Option<Ref<R>> {
        self.checked(fd, self.get(fd)?)
    }

    /// Unmap `fd` if it holds an `R`, returning it (a record of another
    /// kind stays). The fd's reference to the incarnation is the caller's
    /// now, so the generation returned stays until the caller lets go.
    pub fn take_as<R: Record>(&self, fd: i32) -> Option<Ref<R>> {
        let s = self.slots.get(fd)?;
        let mut w = s.load(Ordering::Acquire);
        loop {
            let r = Raw(w).get::<R>()?;
            match s.compare_exchange_weak(w, 0, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(Ref::new(r, r.common().generation())),
                Err(now) => w = now,
            }
        }
    }

    /// Every (fd, record) present (allocated chunks only; for rare events
    /// such as fork).
    pub fn each(&self, mut f: impl FnMut(i32, Raw)) {
        self.slots.each(|fd, s| {
            let w = s.load(Ordering::Acquire);
            if w != 0 {
                f(fd, Raw(w));
            }
        });
    }

    /// Every (fd, record) present that is an `R`, with its generation.
    pub fn each_as<R: Record>(&self, mut f: impl FnMut(i32, Ref<R>)) {
        self.slots.each(|fd, s| {
            let w = s.load(Ordering::Acquire);
            if w != 0
                && let Some(r) = self.checked::<R>(fd, Raw(w))
            {
                f(fd, r);
            }
        });
    }

    /// One past the highest fd an allocated chunk covers.
    pub fn limit(&self) -> usize {
        self.slots.limit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn unknown_and_untrackable_fds_read_as_zero() {
        let t = FdTable::new();
        assert_eq!(t.get(3), 0);
        assert_eq!(t.get(-1), 0);
        assert_eq!(t.get(MAX_FD as i32), 0);
        t.set(-1, C_UDP, 0);
        t.set(MAX_FD as i32, C_UDP, 0);
        assert_eq!(t.limit(), 0, "nothing allocated for untrackable fds");
        t.retire(7); // no chunk: a no-op
        assert_eq!(t.get(7), 0);
    }

    #[test]
    fn set_keeps_generation_and_replaces_class_and_flags() {
        let t = FdTable::new();
        t.set(5, C_UDP, F_CAND);
        let w = t.get(5);
        assert_eq!(class(w), C_UDP);
        assert_ne!(w & F_CAND, 0);
        t.retire(5);
        t.set(5, C_TCP, 0);
        let w = t.get(5);
        assert_eq!((class(w), generation(w), w & F_CAND), (C_TCP, 1, 0));
        t.add_flags(5, F_RCVTIMEO | F_TCAND);
        t.clear_flags(5, F_TCAND);
        let w = t.get(5);
        assert_eq!(w & (F_RCVTIMEO | F_TCAND), F_RCVTIMEO);
        assert_eq!(generation(w), 1);
        assert!(t.tracked(5) && !t.tracked(6));
    }

    #[test]
    fn retire_forgets_and_bumps_but_keeps_spinners() {
        let t = FdTable::new();
        t.set(9, C_UDP, F_ACCEL | F_WOKEN);
        let g = t.spin_enter(9);
        t.retire(9);
        let w = t.get(9);
        assert_eq!(class(w), C_UNKNOWN);
        assert_eq!(w & (F_ACCEL | F_WOKEN), 0);
        assert_eq!(generation(w), 1);
        assert_eq!(spinners(w), 1);
        drop(g);
        assert_eq!(spinners(t.get(9)), 0);
        // set() keeps a spinner count too.
        let _g = t.spin_enter(9);
        t.set(9, C_TCP, 0);
        assert_eq!(spinners(t.get(9)), 1);
    }

    #[test]
    fn wake_is_told_apart_from_close() {
        let t = FdTable::new();
        t.set(4, C_UDP, 0);
        let w0 = t.get(4);
        assert_eq!(closed_since(w0, t.get(4)), None);
        t.wake(4);
        let w = t.get(4);
        assert_eq!(closed_since(w0, w), Some(false), "shutdown wakes");
        assert_eq!(class(w), C_UDP);
        t.retire(4);
        assert_eq!(closed_since(w0, t.get(4)), Some(true), "close");
        // Closed and reused by a socket of another class, then woken.
        t.set(4, C_TCP, 0);
        t.wake(4);
        assert_eq!(closed_since(w0, t.get(4)), Some(true));
    }

    #[test]
    fn wait_spinners_returns_when_the_last_leaves() {
        let t = Arc::new(FdTable::new());
        t.set(11, C_UDP, 0);
        assert!(t.wait_spinners(11, 0), "nobody spins");
        assert!(t.wait_spinners(12_000, 0), "no chunk, nobody spins");
        let g = t.spin_enter(11);
        assert!(!t.wait_spinners(11, 10), "bounded while one spins");
        let t2 = Arc::clone(&t);
        let h = std::thread::spawn(move || t2.wait_spinners(11, u32::MAX));
        std::thread::sleep(std::time::Duration::from_millis(5));
        drop(g);
        assert!(h.join().unwrap());
    }

    #[test]
    fn sweeps_see_only_matching_words() {
        let t = FdTable::new();
        t.set(3, C_EPOLL, F_EPOLL_INET);
        t.set(5000, C_UDP, F_ACCEL | F_CAND);
        t.set(6000, C_UDP, F_ACCEL);
        let mut seen = Vec::new();
        t.each_with(F_ACCEL | F_CAND, |fd| seen.push(fd));
        assert_eq!(seen, [5000]);
        assert!(t.any_with(F_EPOLL_INET));
        assert!(!t.any_with(F_EPOLL_ACCEL));
        assert_eq!(t.limit(), 2 * CHUNK);
    }

    #[test]
    fn chunks_race_to_one_allocation() {
        let c: Arc<Chunks<AtomicU64>> = Arc::new(Chunks::new());
        let hs: Vec<_> = (0..4)
            .map(|k| {
                let c = Arc::clone(&c);
                std::thread::spawn(move || {
                    for fd in (k..CHUNK as i32).step_by(4) {
                        c.get_or_alloc(fd).unwrap().fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let mut sum = 0;
        c.each(|_, s| sum += s.load(Ordering::Relaxed));
        assert_eq!(sum, CHUNK as u64, "every increment landed in the one chunk");
        assert_eq!(c.limit(), CHUNK);
    }

    #[test]
    fn chunk_boundaries_map_to_their_own_slots() {
        let t = FdTable::new();
        let last = MAX_FD as i32 - 1;
        for (fd, c) in [
            (CHUNK as i32 - 1, C_UDP),
            (CHUNK as i32, C_TCP),
            (last, C_EPOLL),
        ] {
            t.set(fd, c, 0);
        }
        assert_eq!(class(t.get(CHUNK as i32 - 1)), C_UDP);
        assert_eq!(class(t.get(CHUNK as i32)), C_TCP);
        assert_eq!(class(t.get(last)), C_EPOLL);
        assert_eq!(t.limit(), MAX_FD);
    }

    #[test]
    fn reads_and_removals_never_allocate() {
        let t = FdTable::new();
        t.clear_flags(100, F_CAND);
        t.wake(100);
        let _ = t.get_now(100);
        assert_eq!(t.limit(), 0);
        t.add_flags(100, F_CAND);
        assert_eq!(t.limit(), CHUNK, "adding a flag allocates");
    }

    #[test]
    fn spin_guard_on_an_untracked_fd_is_harmless() {
        let t = FdTable::new();
        {
            let _g = t.spin_enter(-1);
            let _h = t.spin_enter(77);
        }
        assert!(t.wait_spinners(77, 0));
        assert_eq!(t.get(77), 0);
    }

    struct U(#[allow(dead_code)] u64, Common);
    struct T(#[allow(dead_code)] u64, Common);
    // SAFETY: the only types of this test program with these kinds; u64
    // alignment.
    unsafe impl Record for U {
        const KIND: Kind = Kind::Udp;
        fn common(&self) -> &Common {
            &self.1
        }
    }
    // SAFETY: as above.
    unsafe impl Record for T {
        const KIND: Kind = Kind::Tcp;
        fn common(&self) -> &Common {
            &self.1
        }
    }
    fn mk_u(v: u64) -> &'static U {
        Box::leak(Box::new(U(v, Common::new(1, false, 0))))
    }
    fn mk_t(v: u64) -> &'static T {
        Box::leak(Box::new(T(v, Common::new(1, false, 0))))
    }

    #[test]
    fn sock_table_maps_takes_and_lists() {
        let a = mk_u(1);
        let b = mk_t(2);
        let t = SockTable::new();
        assert!(t.get(3).is_none());
        assert!(t.set(3, a));
        assert!(t.set(CHUNK as i32 + 1, b));
        assert!(!t.set(-2, b));
        assert!(!t.set(MAX_FD as i32, b));
        assert!(t.get_as::<U>(3).is_some_and(|r| std::ptr::eq(r, a)));
        let mut all = Vec::new();
        t.each(|fd, r| all.push((fd, r.kind())));
        assert_eq!(all, [(3, Kind::Udp), (CHUNK as i32 + 1, Kind::Tcp)]);
        assert!(t.take_as::<U>(3).is_some());
        assert!(t.get(3).is_none());
        assert!(t.take_as::<U>(3).is_none());
        assert!(t.take_as::<U>(-1).is_none());
    }

    #[test]
    fn a_record_is_only_ever_read_as_its_own_kind() {
        let a = mk_u(7);
        let b = mk_t(8);
        let t = SockTable::new();
        t.set(5, a);
        let r = t.get(5).unwrap();
        assert_eq!(r.kind(), Kind::Udp);
        assert!(r.get::<T>().is_none());
        assert!(r.is(a));
        assert!(t.get_as::<T>(5).is_none());
        // Taking the other kind leaves it.
        assert!(t.take_as::<T>(5).is_none());
        assert!(t.get_as::<U>(5).is_some());
        // Replacing changes the kind.
        t.set(5, b);
        assert_eq!(t.get(5).unwrap().kind(), Kind::Tcp);
        assert!(t.get(5).unwrap().is(b));
        assert!(!t.get(5).unwrap().is(a));
        let mut n = 0;
        t.each_as::<U>(|_, _| n += 1);
        assert_eq!(n, 0);
        t.each_as::<T>(|fd, _| n += fd);
        assert_eq!(n, 5);
    }

    #[test]
    fn sock_table_lookups_never_allocate() {
        let t = SockTable::new();
        assert!(t.get(9).is_none());
        assert!(t.take_as::<U>(9).is_none());
        assert_eq!(t.limit(), 0);
        let a = mk_u(0);
        t.set(9, a);
        assert_eq!(t.limit(), CHUNK);
    }

    #[test]
    fn a_lookup_made_before_a_close_and_reuse_sees_a_closed_fd() {
        let t = SockTable::new();
        let r = mk_t(1);
        t.set(4, r);
        let old = t.get_ref::<T>(4).unwrap();
        assert!(old.live());
        // fd 4 closes: its slot goes first, then the incarnation ends.
        let taken = t.take_as::<T>(4).unwrap();
        assert!(taken.same(&old));
        assert!(r.common().release());
        assert!(r.common().end(taken.generation()));
        assert!(!old.live(), "the holder of the old lookup sees it ended");
        // Reused for fd 6, then for fd 4 again.
        r.common().reset(1, false, 0);
        t.set(6, r);
        let six = t.get_ref::<T>(6).unwrap();
        assert!(six.live() && !six.same(&old));
        assert!(!old.live(), "never the other socket");
        assert!(t.take_as::<T>(6).is_some() && r.common().release());
        assert!(r.common().end(six.generation()));
        r.common().reset(1, false, 0);
        t.set(4, r);
        let again = t.get_ref::<T>(4).unwrap();
        assert_eq!(again.generation(), old.generation() + 2);
        assert!(!old.live() && !six.live() && again.live());
    }

    #[test]
    fn a_slot_that_changed_after_the_generation_was_read_is_no_record() {
        let t = SockTable::new();
        let (a, b) = (mk_t(1), mk_t(2));
        t.set(3, a);
        let raw = t.get(3).unwrap();
        t.set(3, b); // replaced between the two loads of a lookup
        assert!(t.checked::<T>(3, raw).is_none());
        assert!(
            t.checked::<T>(3, t.get(3).unwrap())
                .is_some_and(|r| std::ptr::eq(r.record(), b))
        );
    }
}
