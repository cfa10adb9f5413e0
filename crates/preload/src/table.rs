//! The fd table: one atomic word per file descriptor, in lazily allocated
//! chunks indexed directly by the fd number (O(1), no lock on any path).
//!
//! A word holds what the shim knows about the fd (its class, a few flags)
//! and a generation that `close`/`dup2` bump, so that a thread spinning on
//! an fd notices that another thread closed it.
//!
//! The table may be stale for fds closed or created behind the shim's back
//! (libc-internal calls, raw system calls): every use is written so that
//! staleness costs speed, never semantics (a spin attempt on a stale
//! "socket" fails with ENOTSOCK and the entry is corrected; the blocking
//! mode is re-read from the kernel before each spin). An fd that names an
//! engine socket also has the kernel's identity of that socket recorded
//! (its SO_COOKIE, never reused while the system runs; see [`identity_ok`]),
//! so a number closed behind the shim's back and reused for a file is
//! recognised before any I/O on it reaches the engine (`fdlife`).

use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

const CHUNK: usize = 4096;
const CHUNKS: usize = 256;
/// fds at or above this are not tracked (served by the kernel, unaccelerated).
pub const MAX_FD: usize = CHUNK * CHUNKS;

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
const GEN_SHIFT: u32 = 32;
/// Threads currently spinning on the fd (bits 16..32): `close` waits for
/// them to leave before the number can be reused.
const SPIN_SHIFT: u32 = 16;
const SPIN_MASK: u64 = 0xffff << SPIN_SHIFT;

static TABLE: [AtomicPtr<[AtomicU64; CHUNK]>; CHUNKS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; CHUNKS];

#[inline(always)]
fn slot(fd: i32) -> Option<&'static AtomicU64> {
    let fd = usize::try_from(fd).ok()?;
    if fd >= MAX_FD {
        return None;
    }
    let p = TABLE[fd / CHUNK].load(Ordering::Acquire);
    if p.is_null() {
        return None;
    }
    // SAFETY: `p` is a chunk published with Release by `slot_alloc` and
    // never freed (leaked box), and fd % CHUNK is in bounds.
    Some(unsafe { &(*p)[fd % CHUNK] })
}

#[cold]
fn slot_alloc(fd: i32) -> Option<&'static AtomicU64> {
    let i = usize::try_from(fd).ok()?;
    if i >= MAX_FD {
        return None;
    }
    let fresh: Box<[AtomicU64; CHUNK]> = Box::new([const { AtomicU64::new(0) }; CHUNK]);
    let fresh = Box::into_raw(fresh);
    if TABLE[i / CHUNK]
        .compare_exchange(
            std::ptr::null_mut(),
            fresh,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_err()
    {
        // SAFETY: `fresh` came from Box::into_raw just above and was never
        // published (we lost the race), so we own it.
        drop(unsafe { Box::from_raw(fresh) });
    }
    slot(fd)
}

/// The word of `fd` (0 = unknown, generation 0).
#[inline(always)]
pub fn get(fd: i32) -> u64 {
    slot(fd).map_or(0, |s| s.load(Ordering::Acquire))
}

#[inline(always)]
pub fn class(w: u64) -> u64 {
    w & CLASS_MASK
}

#[inline(always)]
pub fn generation(w: u64) -> u64 {
    w >> GEN_SHIFT
}

/// Set class and flags, keeping the generation.
pub fn set(fd: i32, class: u64, flags: u64) {
    let Some(s) = slot(fd).or_else(|| slot_alloc(fd)) else {
        return;
    };
    let _ = s.fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
        Some((w & (!((1 << GEN_SHIFT) - 1) | SPIN_MASK)) | class | flags)
    });
}

/// Add flags, keeping class and generation.
pub fn add_flags(fd: i32, flags: u64) {
    if let Some(s) = slot(fd).or_else(|| slot_alloc(fd)) {
        s.fetch_or(flags, Ordering::AcqRel);
    }
}

/// Remove flags.
pub fn clear_flags(fd: i32, flags: u64) {
    if let Some(s) = slot(fd) {
        s.fetch_and(!flags, Ordering::AcqRel);
    }
}

/// The fd was closed or replaced: forget it and bump its generation.
pub fn retire(fd: i32) {
    if let Some(s) = slot(fd) {
        let _ = s.fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
            Some(((generation(w) + 1) << GEN_SHIFT) | (w & SPIN_MASK) | C_UNKNOWN)
        });
    }
}

/// Something happened that a spinning waiter must notice although the fd
/// stays what it is (shutdown): bump the generation, keep the rest.
pub fn wake(fd: i32) {
    if let Some(s) = slot(fd) {
        let _ = s.fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
            Some(w.wrapping_add(1 << GEN_SHIFT) | F_WOKEN)
        });
    }
}

/// Ask the kernel what `fd` is (raw syscalls: no errno change, no
/// recursion into the shim) and remember it. EBADF leaves it unknown.
#[cold]
pub fn classify(fd: i32) -> u64 {
    use rustix::net::{AddressFamily, SocketType};
    if fd < 0 {
        return C_UNKNOWN;
    }
    // SAFETY: the fd is only borrowed for two getsockopt calls; an invalid
    // fd makes them fail with EBADF, nothing else.
    let b = unsafe { rustix::fd::BorrowedFd::borrow_raw(fd) };
    let c = match rustix::net::sockopt::socket_type(b) {
        Err(rustix::io::Errno::BADF) => return C_UNKNOWN,
        Err(_) => C_OTHER,
        Ok(t) => match rustix::net::sockopt::socket_domain(b) {
            Ok(AddressFamily::INET) | Ok(AddressFamily::INET6) => match t {
                SocketType::DGRAM => C_UDP,
                SocketType::STREAM => C_TCP,
                _ => C_OTHER,
            },
            _ => C_OTHER,
        },
    };
    set(fd, c, 0);
    c
}

/// Every fd whose word has all of `flags` (allocated chunks only; for rare
/// events such as fork).
pub fn each_with(flags: u64, mut f: impl FnMut(i32)) {
    for (c, chunk) in TABLE.iter().enumerate() {
        let p = chunk.load(Ordering::Acquire);
        if p.is_null() {
            continue;
        }
        for i in 0..CHUNK {
            let fd = (c * CHUNK + i) as i32;
            if get(fd) & flags == flags {
                f(fd);
            }
        }
    }
}

/// The word of `fd`, classifying it first if unknown.
#[inline(always)]
pub fn lookup(fd: i32) -> u64 {
    let w = get(fd);
    if class(w) != C_UNKNOWN {
        return w;
    }
    classify(fd);
    get(fd)
}

// ------------------------------------------------ accelerated sockets

/// The fd is served by the xdp engine (its `Accel` is in the accel table).
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
/// listen or connect; see `tcpx`).
pub const F_TCAND: u64 = 1 << 15;

/// Per-fd pointers to leaked payloads (the accelerated sockets' records),
/// generic so that this layer knows nothing of what it stores: chunks of
/// [`CHUNK`] slots allocated on first use, a lookup is two loads, no lock.
/// Payloads are `'static` (leaked, never freed), so a reference read by one
/// thread stays valid when another thread clears the slot.
pub struct PtrTable<T: 'static> {
    chunks: [AtomicPtr<[AtomicPtr<T>; CHUNK]>; CHUNKS],
}

impl<T: Sync + 'static> PtrTable<T> {
    pub const fn new() -> PtrTable<T> {
        PtrTable {
            chunks: [const { AtomicPtr::new(std::ptr::null_mut()) }; CHUNKS],
        }
    }

    #[inline(always)]
    fn slot(&self, fd: i32, alloc: bool) -> Option<&AtomicPtr<T>> {
        let i = usize::try_from(fd).ok()?;
        if i >= MAX_FD {
            return None;
        }
        let mut p = self.chunks[i / CHUNK].load(Ordering::Acquire);
        if p.is_null() {
            if !alloc {
                return None;
            }
            let fresh: Box<[AtomicPtr<T>; CHUNK]> =
                Box::new([const { AtomicPtr::new(std::ptr::null_mut()) }; CHUNK]);
            let fresh = Box::into_raw(fresh);
            match self.chunks[i / CHUNK].compare_exchange(
                std::ptr::null_mut(),
                fresh,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => p = fresh,
                Err(other) => {
                    // SAFETY: `fresh` came from Box::into_raw just above and
                    // was never published (the CAS failed), so we own it.
                    drop(unsafe { Box::from_raw(fresh) });
                    p = other;
                }
            }
        }
        // SAFETY: `p` is a published chunk; chunks are never freed (the
        // table lives in a static), and i % CHUNK is in bounds.
        Some(unsafe { &(*p)[i % CHUNK] })
    }

    /// The payload of `fd`, if any (two loads, no lock).
    #[inline(always)]
    pub fn get(&self, fd: i32) -> Option<&'static T> {
        let p = self.slot(fd, false)?.load(Ordering::Acquire);
        // SAFETY: only `set` stores non-null pointers, always from a
        // `&'static T`; payloads are never freed.
        unsafe { p.as_ref() }
    }

    /// Map `fd` to `v`, and record the kernel's identity of the socket
    /// the number names now (see [`identity_ok`]).
    pub fn set(&self, fd: i32, v: &'static T) {
        if let Some(s) = self.slot(fd, true) {
            set_identity(fd, cookie_of(fd));
            s.store((v as *const T).cast_mut(), Ordering::Release);
        }
    }

    /// Every (fd, payload) present (allocated chunks only; for rare events
    /// such as fork).
    pub fn each(&self, mut f: impl FnMut(i32, &'static T)) {
        for (c, chunk) in self.chunks.iter().enumerate() {
            let p = chunk.load(Ordering::Acquire);
            if p.is_null() {
                continue;
            }
            for i in 0..CHUNK {
                let fd = (c * CHUNK + i) as i32;
                if let Some(v) = self.get(fd) {
                    f(fd, v);
                }
            }
        }
    }

    pub fn take(&self, fd: i32) -> Option<&'static T> {
        let p = self
            .slot(fd, false)?
            .swap(std::ptr::null_mut(), Ordering::AcqRel);
        if !p.is_null() {
            set_identity(fd, 0);
        }
        // SAFETY: as in `get`.
        unsafe { p.as_ref() }
    }
}

/// A thread starts a spin that makes syscalls on `fd`; the returned guard
/// ends it. While any is active, `close` holds the number (see
/// [`wait_spinners`]), so a spinner never issues a call on a reused fd: it
/// re-reads the generation (SeqCst) before every attempt.
pub struct SpinGuard(Option<&'static AtomicU64>);

pub fn spin_enter(fd: i32) -> SpinGuard {
    let s = slot(fd);
    if let Some(s) = s {
        s.fetch_add(1 << SPIN_SHIFT, Ordering::SeqCst);
    }
    SpinGuard(s)
}

impl Drop for SpinGuard {
    fn drop(&mut self) {
        if let Some(s) = self.0 {
            s.fetch_sub(1 << SPIN_SHIFT, Ordering::SeqCst);
        }
    }
}

/// Generation of `fd` as a spinner must read it (after `spin_enter`).
#[inline(always)]
pub fn generation_now(fd: i32) -> u64 {
    slot(fd).map_or(0, |s| generation(s.load(Ordering::SeqCst)))
}

/// After `retire(fd)` and before the real close: wait (at most ~100 ms,
/// in case close runs in a signal handler on the spinning thread) until
/// every spinner on `fd` has seen the new generation and left.
pub fn wait_spinners(fd: i32) {
    let Some(s) = slot(fd) else { return };
    let mut n = 0u32;
    while s.load(Ordering::SeqCst) & SPIN_MASK != 0 && n < 100_000 {
        if n < 64 {
            core::hint::spin_loop();
        } else {
            rustix::thread::sched_yield();
        }
        n += 1;
    }
}

// ------------------------------------------------------ fd identity

/// Per fd: the SO_COOKIE of the socket the number named when an engine
/// record was attached to it (0: no record). A socket cookie is unique for
/// the life of the system (a 64-bit counter), so a number that was closed
/// behind the shim's back and reused by a file, a pipe or another socket
/// never matches.
static IDENT: [AtomicPtr<[AtomicU64; CHUNK]>; CHUNKS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; CHUNKS];

fn ident_slot(fd: i32, alloc: bool) -> Option<&'static AtomicU64> {
    let i = usize::try_from(fd).ok()?;
    if i >= MAX_FD {
        return None;
    }
    let mut p = IDENT[i / CHUNK].load(Ordering::Acquire);
    if p.is_null() {
        if !alloc {
            return None;
        }
        let fresh = Box::into_raw(Box::new([const { AtomicU64::new(0) }; CHUNK]));
        match IDENT[i / CHUNK].compare_exchange(
            std::ptr::null_mut(),
            fresh,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => p = fresh,
            Err(other) => {
                // SAFETY: `fresh` came from Box::into_raw just above and was
                // never published (the CAS failed), so we own it.
                drop(unsafe { Box::from_raw(fresh) });
                p = other;
            }
        }
    }
    // SAFETY: a published chunk, never freed; i % CHUNK is in bounds.
    Some(unsafe { &(*p)[i % CHUNK] })
}

/// The kernel's SO_COOKIE of the socket `fd` names now (0: not a socket,
/// or no such fd). A raw system call: no errno change, no recursion.
pub fn cookie_of(fd: i32) -> u64 {
    if fd < 0 {
        return 0;
    }
    // SAFETY: the fd is only borrowed for one getsockopt; an invalid or
    // non-socket fd makes it fail, nothing else.
    let b = unsafe { rustix::fd::BorrowedFd::borrow_raw(fd) };
    rustix::net::sockopt::socket_cookie(b).unwrap_or(0)
}

fn set_identity(fd: i32, cookie: u64) {
    if let Some(s) = ident_slot(fd, cookie != 0) {
        s.store(cookie, Ordering::Release);
    }
}

/// The identity recorded for `fd` (0: the shim maps no engine record there).
#[inline(always)]
pub fn identity(fd: i32) -> u64 {
    ident_slot(fd, false).map_or(0, |s| s.load(Ordering::Acquire))
}

/// Does `fd` still name the socket its engine record was made for? One
/// getsockopt when a record exists, a load otherwise.
#[inline]
pub fn identity_ok(fd: i32) -> bool {
    let id = identity(fd);
    id == 0 || cookie_of(fd) == id
}

/// Every (fd, identity) recorded (allocated chunks only; for rare events
/// such as fork and spawn).
pub fn each_identity(mut f: impl FnMut(i32, u64)) {
    for (c, chunk) in IDENT.iter().enumerate() {
        let p = chunk.load(Ordering::Acquire);
        if p.is_null() {
            continue;
        }
        for i in 0..CHUNK {
            // SAFETY: a published chunk, never freed; i < CHUNK.
            let id = unsafe { &(*p)[i] }.load(Ordering::Acquire);
            if id != 0 {
                f((c * CHUNK + i) as i32, id);
            }
        }
    }
}

/// Is anything recorded for `fd` (a word, an identity)? For sweeps over
/// ranges of numbers (close_range).
pub fn tracked(fd: i32) -> bool {
    get(fd) & ((1 << GEN_SHIFT) - 1) != 0 || identity(fd) != 0
}

/// The highest fd number a sweep over [`tracked`] fds must look at (the
/// end of the last allocated chunk of either table).
pub fn tracked_limit() -> usize {
    let mut top = 0;
    for (c, chunk) in TABLE.iter().enumerate() {
        if !chunk.load(Ordering::Acquire).is_null() {
            top = top.max((c + 1) * CHUNK);
        }
    }
    for (c, chunk) in IDENT.iter().enumerate() {
        if !chunk.load(Ordering::Acquire).is_null() {
            top = top.max((c + 1) * CHUNK);
        }
    }
    top
}

/// Does any fd's word have any of `flags`?
pub fn each_any(flags: u64) -> bool {
    for (c, chunk) in TABLE.iter().enumerate() {
        if chunk.load(Ordering::Acquire).is_null() {
            continue;
        }
        for i in 0..CHUNK {
            if get((c * CHUNK + i) as i32) & flags != 0 {
                return true;
            }
        }
    }
    false
}
