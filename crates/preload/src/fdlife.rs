//! An fd is what the kernel says it is (issue 20, finding 1).
//!
//! The shim maps fd numbers to engine sockets. A number stops naming that
//! socket when it is closed or replaced; if the shim does not notice, the
//! next file that gets the number would be served as the engine socket
//! (its writes sent to the peer, its reads answered with network data).
//! Three layers keep that from happening:
//!
//! 1. **Every closer the shim can interpose runs `ops::pre_close`** first
//!    ([`retire`], then the protocol's release of the record):
//!    `close`, `dup2`/`dup3` over a number, `close_range`, `closefrom`,
//!    `fclose`, and `syscall(SYS_close | SYS_close_range | SYS_dup2 |
//!    SYS_dup3, ..)` (see `exports_fd`).
//! 2. **Every fd-creating call the shim interposes runs [`created`]** on
//!    the number it returns (socket, accept, dup, fcntl(F_DUPFD), open,
//!    openat, creat, fopen, tmpfile, mkstemp, opendir, pipe, socketpair,
//!    eventfd, timerfd, signalfd, memfd_create, inotify, epoll_create and
//!    the same system calls through `syscall()`): a number that still has
//!    an engine record proves it was closed behind the shim's back; the
//!    record is forgotten and the process becomes *suspect*.
//! 3. **Identity**: when a record is attached to a number, the kernel's
//!    SO_COOKIE of the socket is recorded (`table::identity`; cookies are
//!    never reused). In a suspect process (one that closed an engine fd
//!    behind the shim's back, or set up io_uring), every I/O call checks
//!    the number's cookie before it touches the engine ([`io_check`]);
//!    fork, vfork, posix_spawn and exec check every record ([`sweep`]).
//!    A check is one getsockopt (measured: docs/preload.md); a process
//!    that never closed an fd behind the shim's back pays one load.

use crate::accel;
use crate::log::log;
use crate::ready;
use crate::table;
use crate::tcpx;
use libc::c_int;
use nanowire_options::Level;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once the process closed an engine fd by a call the shim could not
/// see (or may do so: io_uring): from then on every I/O call on an fd with
/// an engine record checks its identity first.
static SUSPECT: AtomicBool = AtomicBool::new(false);

pub fn init() {
    // Registered after accel's and tcpx's handlers, so it runs before
    // them (prepare handlers run in reverse order): stale records are
    // gone before fork looks at the records.
    // SAFETY: a plain extern "C" handler.
    unsafe { libc::pthread_atfork(Some(before_fork), None, None) };
}

extern "C" fn before_fork() {
    if crate::sys::in_engine() {
        return;
    }
    sweep();
}

/// The process may close fds behind the shim's back from now on (io_uring):
/// every I/O call checks identity.
pub fn suspect(why: &str) {
    crate::placeholder::stop();
    if !SUSPECT.swap(true, Ordering::AcqRel) {
        log!(
            Level::Info,
            "{why}: fds may be closed by calls the shim cannot see; engine fds are checked against the kernel's socket identity before each call"
        );
    }
}

/// Is the process suspect (see [`SUSPECT`])?
#[inline(always)]
pub fn is_suspect() -> bool {
    SUSPECT.load(Ordering::Relaxed)
}

/// Before an I/O call on `fd`: in a suspect process, a number whose
/// identity changed is forgotten, so the call goes to the kernel (which
/// answers for whatever the number names now).
#[inline(always)]
pub fn io_check(fd: c_int) {
    if is_suspect() {
        io_check_slow(fd);
    }
}

#[cold]
fn io_check_slow(fd: c_int) {
    if !table::identity_ok(fd) {
        forget_stale(fd, "its number now names another file");
    }
}

/// Every record whose number no longer names its socket is forgotten
/// (fork, spawn, exec: rare events that act on every record).
pub fn sweep() {
    let mut stale = Vec::new();
    table::each_identity(|fd, id| {
        if table::cookie_of(fd) != id {
            stale.push(fd);
        }
    });
    for fd in stale {
        forget_stale(fd, "its number now names another file");
    }
}

/// `fd` was closed by a call the shim did not see, and the number may
/// already name something else: forget everything about it without acting
/// on the number. One warn line (a program that closes sockets behind the
/// shim loses their engine state: what was queued for it is dropped, as
/// the kernel drops a closed socket's queue).
pub fn forget_stale(fd: c_int, how: &str) {
    SUSPECT.store(true, Ordering::Release);
    crate::placeholder::stop();
    let engine = accel::by_fd(fd).is_some() || tcpx::by_fd(fd).is_some();
    ready::fd_closed(fd);
    retire_and_wait(fd);
    accel::release_stale(fd);
    tcpx::release_stale(fd);
    if engine {
        log!(
            Level::Warn,
            "fd {fd}: its engine socket was closed by a call the shim cannot see ({how}): the engine forgets it; the number is the kernel's"
        );
    }
}

/// `fd` is about to be closed or replaced (close, dup2/dup3 over it,
/// close_range, closefrom, fclose; through `ops::pre_close`): bump its
/// generation and wait until the threads spinning on it have left. True:
/// its protocol now lets go of its record (`ops::Ops::release`); false:
/// it had been closed and reused behind the shim's back already, and is
/// forgotten without acting on the number. `check`: false when the
/// release does nothing on the number (`tcpx::release_spares_number`):
/// then a stale number is harmless to it and the identity check (one
/// getsockopt) is skipped; the I/O checks and sweeps of a suspect process
/// are as before.
pub fn retire(fd: c_int, check: bool) -> bool {
    if check && table::identity(fd) != 0 && !table::identity_ok(fd) {
        // Closed and reused behind the shim's back already: the record
        // must not act on the number (detach would change the new file's
        // flags, a TCP close would keep a duplicate of it).
        forget_stale(fd, "closed again");
        return false;
    }
    ready::fd_closed(fd);
    retire_and_wait(fd);
    true
}

/// Bump `fd`'s generation, then wait for the threads whose close guard is
/// on it: the shared count's (`table::spin_enter`) and a UDP record
/// owner's (`accel::wait_outside`).
fn retire_and_wait(fd: c_int) {
    table::retire(fd);
    table::wait_spinners(fd);
    accel::wait_outside(fd);
}

/// A call the shim interposes returned the new fd `fd`. If the number
/// still has an engine record, it was closed behind the shim's back:
/// forget it. Either way the number starts unknown (classified on use).
#[inline]
pub fn created(fd: c_int) {
    if fd < 0 {
        return;
    }
    // A shared placeholder's number given to a new file: it was closed
    // unseen (the connections on it keep their duplicates).
    crate::placeholder::number_closing(fd);
    if table::identity(fd) != 0 || accel::by_fd(fd).is_some() || tcpx::by_fd(fd).is_some() {
        forget_stale(fd, "its number was given to a new file");
    }
    table::retire(fd);
}

/// `created` for both ends of a pipe or socket pair.
///
/// # Safety
/// `fds` is null or points to two ints the kernel just wrote.
pub unsafe fn created_pair(r: c_int, fds: *const c_int) {
    if r == 0 && !fds.is_null() {
        // SAFETY: per this function's contract.
        let (a, b) = unsafe { (*fds, *fds.add(1)) };
        created(a);
        created(b);
    }
}
