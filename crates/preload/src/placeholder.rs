//! The shared placeholder under accepted engine connections (issue 24).
//!
//! An accepted engine connection's fd must name a TCP socket (so `fstat`,
//! `SO_TYPE`, `SO_DOMAIN`, `F_GETFL` answer as plainly) at the number the
//! kernel's accept would have given (the lowest free one). A socket of its
//! own per connection costs `socket()` at accept and the socket's teardown
//! at close: most of the kernel work of an nginx request that is not the
//! network's (measured: ~10 times a duplicate's). Instead, each process
//! keeps one unconnected AF_INET stream socket per blocking mode (the
//! *template*, close-on-exec, at a high number so it never takes a number
//! the application's next file would get), and an accepted connection's
//! number is `fcntl(F_DUPFD, 0)` of it: the same lowest free number, no
//! socket made or torn down, and its identity (`table::identity`: the
//! template's cookie) known without asking.
//!
//! Nothing ever changes a template: before a call would change or read
//! something of the file's own — an option (`setsockopt`), its status
//! flags or owner (`fcntl` other than reads and FD_CLOEXEC), an ioctl the
//! kernel answers, `bind`, `listen`, `SO_COOKIE`, a fork or spawn that
//! hands it on (`TCP_REPAIR` goes into the socket itself) — the
//! connection's numbers get a socket of their own (`tcpx::own_placeholder`:
//! `socket` + `dup3` per number + `close`), and the call goes on there.
//! What stays shared (a documented limit, docs/preload.md): `fstat`'s inode
//! and `/proc/self/fd`'s link (one per template, not per connection), and
//! `flock` locks (per open file).
//!
//! A process that may close fds behind the shim's back (`fdlife`'s
//! suspect) stops using templates: a template's number closed and reused
//! unseen would be duplicated as if it were one. The application closing a
//! template's number (close, dup2 over it, close_range) retires it; its
//! cookie stays known, so connections still on it are still told apart.

use crate::real;
use crate::table;
use libc::c_int;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};

/// The templates' numbers (index: O_NONBLOCK), -1: none yet.
static FD: [AtomicI32; 2] = [AtomicI32::new(-1), AtomicI32::new(-1)];
/// Their cookies (kept after a template's number is closed; see
/// [`RETIRED`]).
static COOKIE: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];
/// Cookies of templates whose numbers the application closed: connections
/// may still be on them.
static RETIRED: [AtomicU64; 8] = [const { AtomicU64::new(0) }; 8];
/// No more templates (suspect process, no room to retire one, or the
/// template could not be made): accepted connections get sockets of their
/// own.
static OFF: AtomicBool = AtomicBool::new(false);
/// Serialises making and retiring templates, and the replacements of the
/// numbers on them (`tcpx::own_placeholder`, `tcpx::placeholder_mode`). A
/// flag, not a mutex: a forked child, whose other threads are gone, frees
/// it ([`after_fork_child`]).
static LOCK: AtomicBool = AtomicBool::new(false);

/// Holds [`LOCK`] until dropped.
pub struct Held(());

impl Drop for Held {
    fn drop(&mut self) {
        LOCK.store(false, Ordering::Release);
    }
}

/// The lock under which templates change and numbers leave them (held for
/// a few system calls).
pub fn lock() -> Held {
    while LOCK
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        std::thread::yield_now();
    }
    Held(())
}

/// In a forked child: a thread of the parent's that held the lock at fork
/// does not exist here.
pub fn after_fork_child() {
    LOCK.store(false, Ordering::Release);
}

/// Accepted connections get sockets of their own from now on.
pub fn stop() {
    OFF.store(true, Ordering::Release);
}

/// A number for a new accepted connection: a duplicate of the template of
/// its mode (`nonblock`), close-on-exec if `cloexec`, at the lowest free
/// number (as socket(2)'s), with its identity. `None`: no template (the
/// caller makes a socket of its own). `Some((-1, 0))`: the duplicate
/// failed (errno set, e.g. EMFILE, as socket(2) would).
pub fn dup(nonblock: bool, cloexec: bool, floor: c_int) -> Option<(c_int, u64)> {
    if OFF.load(Ordering::Acquire) {
        return None;
    }
    let (t, cookie) = template(nonblock as usize, floor)?;
    let cmd = if cloexec {
        libc::F_DUPFD_CLOEXEC
    } else {
        libc::F_DUPFD
    };
    // SAFETY: a duplicate of our own template, to the lowest free number.
    let d = unsafe { real::fcntl(t, cmd, 0) };
    Some(if d < 0 { (-1, 0) } else { (d, cookie) })
}

/// The template of mode `i` (made on first use, at a number >= `floor`)
/// and its cookie.
fn template(i: usize, floor: c_int) -> Option<(c_int, u64)> {
    let fd = FD[i].load(Ordering::Acquire);
    if fd >= 0 {
        return Some((fd, COOKIE[i].load(Ordering::Acquire)));
    }
    let _g = lock();
    let fd = FD[i].load(Ordering::Acquire);
    if fd >= 0 {
        return Some((fd, COOKIE[i].load(Ordering::Acquire)));
    }
    if OFF.load(Ordering::Acquire) || COOKIE[i].load(Ordering::Acquire) != 0 {
        // A retired template's cookie still names connections: a new one
        // would need a slot of its own ([`forget`] keeps the old there).
        return None;
    }
    let nb = if i == 1 { libc::SOCK_NONBLOCK } else { 0 };
    // SAFETY: plain socket(2); ours until moved high and closed below.
    let s = unsafe {
        real::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | nb,
            0,
        )
    };
    if s < 0 {
        return None;
    }
    // SAFETY: a duplicate of our own socket at a high number.
    let mut t = unsafe { real::fcntl(s, libc::F_DUPFD_CLOEXEC, floor.max(0) as libc::c_ulong) };
    let cookie = table::cookie_of(if t >= 0 { t } else { s });
    // SAFETY: our own descriptors.
    unsafe {
        if t >= 0 {
            real::close(s);
        } else {
            t = s;
        }
    }
    if cookie == 0 {
        // SAFETY: ours.
        unsafe { real::close(t) };
        stop();
        return None;
    }
    COOKIE[i].store(cookie, Ordering::Release);
    FD[i].store(t, Ordering::Release);
    Some((t, cookie))
}

/// The current template of mode `nonblock` for a number now on the current
/// template `cookie` (its other mode, or itself), and its cookie; `None`
/// when `cookie` is not a current template or that one cannot be had.
/// Takes [`lock`] to make one: never call it holding that.
pub fn of_mode(cookie: u64, nonblock: bool, floor: c_int) -> Option<(c_int, u64)> {
    if cookie == 0
        || OFF.load(Ordering::Acquire)
        || !COOKIE.iter().any(|c| c.load(Ordering::Acquire) == cookie)
    {
        return None;
    }
    template(nonblock as usize, floor)
}

/// Is `fd` still the current template whose cookie is `cookie`?
pub fn current(fd: c_int, cookie: u64) -> bool {
    FD.iter()
        .zip(&COOKIE)
        .any(|(f, c)| f.load(Ordering::Acquire) == fd && c.load(Ordering::Acquire) == cookie)
}

/// Does `cookie` (a number's recorded identity) name a template, current
/// or retired?
pub fn is_template(cookie: u64) -> bool {
    cookie != 0
        && (COOKIE.iter().any(|c| c.load(Ordering::Acquire) == cookie)
            || RETIRED.iter().any(|c| c.load(Ordering::Acquire) == cookie))
}

/// `fd` is being closed or replaced by the application (or was given to a
/// new file behind the shim's back): if it is a template's number, the
/// template is retired (the connections on it keep their duplicates).
#[inline]
pub fn number_closing(fd: c_int) {
    if fd >= 0 && FD.iter().any(|f| f.load(Ordering::Relaxed) == fd) {
        forget(fd);
    }
}

/// [`number_closing`] for every number in `[first, last]` (close_range,
/// closefrom).
pub fn range_closing(first: u32, last: u32) {
    for f in &FD {
        let fd = f.load(Ordering::Relaxed);
        if fd >= 0 && (first..=last).contains(&(fd as u32)) {
            forget(fd);
        }
    }
}

#[cold]
fn forget(fd: c_int) {
    let _g = lock();
    for i in 0..2 {
        if FD[i].load(Ordering::Acquire) != fd {
            continue;
        }
        FD[i].store(-1, Ordering::Release);
        let c = COOKIE[i].load(Ordering::Acquire);
        match RETIRED.iter().find(|r| r.load(Ordering::Acquire) == 0) {
            Some(slot) => {
                slot.store(c, Ordering::Release);
                COOKIE[i].store(0, Ordering::Release);
            }
            // No room: the cookie stays in its slot (still recognised),
            // and no template is made again.
            None => stop(),
        }
    }
}
