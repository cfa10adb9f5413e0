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

//!
//! The tables themselves (chunks, word layout, generations, spinner
//! counts, the one table of engine socket records) are
//! `nanowire_shimcore::fdtable`, unit-tested there; this module holds the process's instances and what needs system calls
//! (classification, socket identity).

pub use nanowire_shimcore::fdtable::{
    C_EPOLL, C_OTHER, C_TCP, C_UDP, C_UNKNOWN, F_ACCEL, F_CAND, F_EPOLL_ACCEL, F_EPOLL_INET,
    F_INHERIT_LOGGED, F_RCVTIMEO, F_TCAND, F_WOKEN, FdTable, SpinGuard, class, generation,
};
use nanowire_shimcore::fdtable::{Chunks, MAX_FD, SockTable};
use std::sync::atomic::{AtomicU64, Ordering};

/// The process's fd table (one word per fd).
pub static WORDS: FdTable = FdTable::new();

/// The word of `fd` (0 = unknown, generation 0).
#[inline(always)]
pub fn get(fd: i32) -> u64 {
    WORDS.get(fd)
}

/// Set class and flags, keeping the generation.
pub fn set(fd: i32, class: u64, flags: u64) {
    WORDS.set(fd, class, flags);
}

/// Add flags, keeping class and generation.
pub fn add_flags(fd: i32, flags: u64) {
    WORDS.add_flags(fd, flags);
}

/// Set `flag` on `fd`: true the first time (a once-per-fd note).
pub fn first_time(fd: i32, flag: u64) -> bool {
    let new = get(fd) & flag == 0;
    if new {
        add_flags(fd, flag);
    }
    new
}

/// Remove flags.
pub fn clear_flags(fd: i32, flags: u64) {
    WORDS.clear_flags(fd, flags);
}

/// The fd was closed or replaced: forget it and bump its generation.
pub fn retire(fd: i32) {
    WORDS.retire(fd);
}

/// Something happened that a spinning waiter must notice although the fd
/// stays what it is (shutdown): bump the generation, keep the rest.
pub fn wake(fd: i32) {
    WORDS.wake(fd);
}

/// Ask the kernel what `fd` is (raw syscalls: no errno change, no
/// recursion into the shim) and remember it. EBADF leaves it unknown.
#[cold]
pub fn classify(fd: i32) -> u64 {
    classify_inet(fd).0
}

/// [`classify`], also saying whether the socket is IPv4 (AF_INET).
#[cold]
pub fn classify_inet(fd: i32) -> (u64, bool) {
    use rustix::net::{AddressFamily, SocketType};
    if fd < 0 {
        return (C_UNKNOWN, false);
    }
    // SAFETY: the fd is only borrowed for two getsockopt calls; an invalid
    // fd makes them fail with EBADF, nothing else.
    let b = unsafe { rustix::fd::BorrowedFd::borrow_raw(fd) };
    let mut inet = false;
    let c = match rustix::net::sockopt::socket_type(b) {
        Err(rustix::io::Errno::BADF) => return (C_UNKNOWN, false),
        Err(_) => C_OTHER,
        Ok(t) => match rustix::net::sockopt::socket_domain(b) {
            Ok(d @ (AddressFamily::INET | AddressFamily::INET6)) => {
                inet = d == AddressFamily::INET;
                match t {
                    SocketType::DGRAM => C_UDP,
                    SocketType::STREAM => C_TCP,
                    _ => C_OTHER,
                }
            }
            _ => C_OTHER,
        },
    };
    set(fd, c, 0);
    (c, inet)
}

/// Every fd whose word has all of `flags` (allocated chunks only; for rare
/// events such as fork).
pub fn each_with(flags: u64, f: impl FnMut(i32)) {
    WORDS.each_with(flags, f);
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

// ------------------------------------------------ engine socket records

pub use nanowire_shimcore::fdtable::{Kind, Raw, Record, Ref};

/// The engine's socket records, UDP (`accel::Accel`) and TCP (`tcpx::Tcp`),
/// by fd: one tagged pointer per fd (`nanowire_shimcore::fdtable::
/// SockTable`). Attaching a record also records the kernel's identity of
/// the socket the number names (see [`identity_ok`]).
static RECORDS: SockTable = SockTable::new();

/// The record of `fd`, whatever its protocol (two loads, no lock): the one
/// lookup that says what serves an fd.
#[inline(always)]
pub fn record(fd: i32) -> Option<Raw> {
    RECORDS.get(fd)
}

/// The record of `fd` if it is an `R` (whichever incarnation: for records
/// that are never reused).
#[inline(always)]
pub fn record_as<R: Record>(fd: i32) -> Option<&'static R> {
    RECORDS.get_as::<R>(fd)
}

/// The record of `fd` if it is an `R`, with the generation it has while
/// `fd` names it (`SockTable::checked`): for records that are reused.
#[inline(always)]
pub fn record_ref<R: Record>(fd: i32) -> Option<Ref<R>> {
    RECORDS.get_ref::<R>(fd)
}

/// `raw`, which [`record`] returned for `fd`, as an `R` with its
/// generation (`None`: not an `R`, or `fd` changed meanwhile).
#[inline(always)]
pub fn checked<R: Record>(fd: i32, raw: Raw) -> Option<Ref<R>> {
    RECORDS.checked::<R>(fd, raw)
}

/// Map `fd` to `r`, and record the kernel's identity of the socket the
/// number names now (see [`identity_ok`]).
pub fn set_record<R: Record>(fd: i32, r: &'static R) {
    if usize::try_from(fd).is_ok_and(|i| i < MAX_FD) {
        set_identity(fd, cookie_of(fd));
        RECORDS.set(fd, r);
    }
}

/// [`set_record`] with the identity `cookie` the caller knows (the
/// socket's SO_COOKIE; no system call).
pub fn set_record_as<R: Record>(fd: i32, r: &'static R, cookie: u64) {
    if usize::try_from(fd).is_ok_and(|i| i < MAX_FD) {
        set_identity(fd, cookie);
        RECORDS.set(fd, r);
    }
}

/// Unmap `fd` if it holds an `R`, returning it (the incarnation `fd`
/// named).
pub fn take_record<R: Record>(fd: i32) -> Option<Ref<R>> {
    let p = RECORDS.take_as::<R>(fd);
    if p.is_some() {
        set_identity(fd, 0);
    }
    p
}

/// Every (fd, record) that is an `R` (allocated chunks only; for rare
/// events such as fork).
pub fn each_record<R: Record>(f: impl FnMut(i32, Ref<R>)) {
    RECORDS.each_as::<R>(f);
}

/// A thread starts a spin that makes syscalls on `fd`; the returned guard
/// ends it. While any is active, `close` holds the number (see
/// [`wait_spinners`]), so a spinner never issues a call on a reused fd: it
/// re-reads the generation (SeqCst) before every attempt.
#[inline]
pub fn spin_enter(fd: i32) -> SpinGuard<'static> {
    WORDS.spin_enter(fd)
}

/// After `retire(fd)` and before the real close: wait (at most ~100 ms,
/// in case close runs in a signal handler on the spinning thread) until
/// every spinner on `fd` has seen the new generation and left.
pub fn wait_spinners(fd: i32) {
    WORDS.wait_spinners(fd, 100_000);
}

// ------------------------------------------------------ fd identity

/// Per fd: the SO_COOKIE of the socket the number named when an engine
/// record was attached to it (0: no record). A socket cookie is unique for
/// the life of the system (a 64-bit counter), so a number that was closed
/// behind the shim's back and reused by a file, a pipe or another socket
/// never matches.
static IDENT: Chunks<AtomicU64> = Chunks::new();

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

/// Record `cookie` as the identity of `fd` (0: none).
pub fn set_identity(fd: i32, cookie: u64) {
    let s = if cookie != 0 {
        IDENT.get_or_alloc(fd)
    } else {
        IDENT.get(fd)
    };
    if let Some(s) = s {
        s.store(cookie, Ordering::Release);
    }
}

/// The identity recorded for `fd` (0: the shim maps no engine record there).
#[inline(always)]
pub fn identity(fd: i32) -> u64 {
    IDENT.get(fd).map_or(0, |s| s.load(Ordering::Acquire))
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
    IDENT.each(|fd, s| {
        let id = s.load(Ordering::Acquire);
        if id != 0 {
            f(fd, id);
        }
    });
}

/// Is anything recorded for `fd` (a word, an identity)? For sweeps over
/// ranges of numbers (close_range).
pub fn tracked(fd: i32) -> bool {
    WORDS.tracked(fd) || identity(fd) != 0
}

/// The highest fd number a sweep over [`tracked`] fds must look at (the
/// end of the last allocated chunk of any table).
pub fn tracked_limit() -> usize {
    WORDS.limit().max(IDENT.limit()).max(RECORDS.limit())
}

/// Does any fd's word have any of `flags`?
pub fn each_any(flags: u64) -> bool {
    WORDS.any_with(flags)
}
