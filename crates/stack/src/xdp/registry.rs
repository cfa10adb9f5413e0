//! One engine per (process, network namespace, interface).
//!
//! fork: a child process inherits the parent's memory, including its
//! engines, whose RX ring is a mapping shared with the parent and whose
//! locks may have been held by parent threads at the moment of the fork.
//! A child must never touch them. A `pthread_atfork` child handler bumps a
//! fork generation; every engine records the generation it was opened in
//! and refuses work (and cleanup) in any other ([`Engine::is_own`]). The
//! registry is keyed by pid as well, so a child's first socket opens a new
//! engine of its own (which may fail to attach while the parent's program
//! owns the interface: the caller falls back and says why). The registry's
//! own lock is a spin lock the child handler resets, so a fork while
//! another thread held it cannot deadlock the child; it is held for table
//! look-ups only, never while an engine opens (a key being opened is marked,
//! and a second caller for it waits outside the lock). The child handler
//! also replaces every inherited engine's privileged fds (XDP link,
//! program, maps, AF_XDP sockets) with /dev/null ([`Engine::disown`]): a
//! child never holds the engine, and a killed parent's program detaches
//! even while its children live.

use super::Engine;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Once, Weak};
use std::time::{Duration, Instant};

static FORK_GEN: AtomicU32 = AtomicU32::new(0);
static ATFORK: Once = Once::new();
/// This process's id (0: not read yet), reset in a forked child: the
/// steering program's claims carry it, once per connect (glibc does not
/// cache getpid).
static PID: AtomicU32 = AtomicU32::new(0);

/// This process's id, read once (and again in a forked child). Only an
/// engine's owner calls it, after [`get`] registered the fork handler.
pub(crate) fn pid() -> u32 {
    match PID.load(Ordering::Relaxed) {
        0 => {
            let p = rustix::process::getpid().as_raw_nonzero().get() as u32;
            PID.store(p, Ordering::Relaxed);
            p
        }
        p => p,
    }
}

/// What the layers above reset in a forked child, before the registry's
/// own work below (the TCP timer service's state:
/// `tcp::service_after_fork`); set by `Engine::get` before the first
/// engine, so the registry needs to know nothing of them.
static CHILD_HOOK: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

pub(crate) fn set_child_hook(f: fn()) {
    let _ = CHILD_HOOK.set(f);
}

extern "C" fn in_child() {
    FORK_GEN.fetch_add(1, Ordering::Relaxed);
    PID.store(0, Ordering::Relaxed);
    nanowire_owner::process::after_fork_child();
    REG.locked.store(false, Ordering::Release);
    if let Some(f) = CHILD_HOOK.get() {
        f();
    }
    // The parent's engines: their privileged fds (XDP link, program, maps,
    // AF_XDP sockets) must not live on in the child (issue 20, finding 3).
    let inert = rustix::fs::open(
        "/dev/null",
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    );
    if let Ok(inert) = inert {
        use std::os::fd::AsRawFd;
        with(|reg| {
            for (_, _, _, w) in reg.iter() {
                if let Some(e) = w.as_ref().and_then(Weak::upgrade) {
                    e.disown(inert.as_raw_fd());
                    // Dropping the last Arc here would run the engine's
                    // drop in the handler: keep it (it is the parent's).
                    std::mem::forget(e);
                }
            }
        });
    }
}

/// How many forks separate this process from the first one that used an
/// engine (0 in that one).
#[inline]
pub(crate) fn fork_gen() -> u32 {
    FORK_GEN.load(Ordering::Relaxed)
}

/// (pid, netns inode, interface, engine: `None` while it opens)
type Entry = (u32, u64, String, Option<Weak<Engine>>);

/// An open that failed: (pid, netns inode, interface, why, not before,
/// the wait after the next failure).
type Failed = (u32, u64, String, String, Instant, Duration);

/// The first wait before a failed open is tried again; each failure in a
/// row doubles it, up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(64);

/// How an error begins when it is a remembered failure (the caller said
/// the reason at the first, and may say this one more quietly).
pub const REMEMBERED: &str = "(as before, not tried again yet) ";

struct Reg {
    locked: AtomicBool,
    list: UnsafeCell<Vec<Entry>>,
    failed: UnsafeCell<Vec<Failed>>,
}

// SAFETY: `list` is only reached through `with`, which holds `locked`.
unsafe impl Sync for Reg {}

static REG: Reg = Reg {
    locked: AtomicBool::new(false),
    list: UnsafeCell::new(Vec::new()),
    failed: UnsafeCell::new(Vec::new()),
};

struct Held;
impl Drop for Held {
    fn drop(&mut self) {
        REG.locked.store(false, Ordering::Release);
    }
}

fn with<R>(f: impl FnOnce(&mut Vec<Entry>) -> R) -> R {
    with_both(|list, _| f(list))
}

fn with_both<R>(f: impl FnOnce(&mut Vec<Entry>, &mut Vec<Failed>) -> R) -> R {
    while REG.locked.swap(true, Ordering::Acquire) {
        std::thread::yield_now();
    }
    let _held = Held;
    // SAFETY: we hold the lock; the references do not escape `f`.
    f(unsafe { &mut *REG.list.get() }, unsafe {
        &mut *REG.failed.get()
    })
}

/// SO_NETNS_COOKIE (Linux 5.14+; the generic value, x86 and arm).
const SO_NETNS_COOKIE: libc::c_int = 71;

/// The network namespace of socket `fd`: its cookie (one getsockopt, where
/// [`netns_id`] resolves a /proc path, ~2 µs per connect). `None` on a
/// kernel without SO_NETNS_COOKIE.
pub(crate) fn sock_netns_cookie(fd: std::os::fd::RawFd) -> Option<u64> {
    let mut v = 0u64;
    let mut l = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: a u64 out-buffer and its length.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&raw mut v).cast(),
            &mut l,
        )
    };
    (r == 0 && l as usize == std::mem::size_of::<u64>()).then_some(v)
}

/// The calling thread's network namespace cookie (from a fresh socket).
pub(crate) fn netns_cookie() -> Option<u64> {
    // SAFETY: plain socket(2); checked, closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    let c = sock_netns_cookie(fd);
    // SAFETY: the socket made above, ours.
    unsafe { libc::close(fd) };
    c
}

/// Forget this process's remembered failed opens ([`get`]): the next
/// caller opens again at once (a forked child waiting for the queue of an
/// engine whose process just exited: the kernel frees it a moment later).
pub fn forget_failed_opens() {
    let pid = pid();
    with_both(|_, failed| failed.retain(|f| f.0 != pid));
}

/// The calling thread's network namespace (threads may setns).
pub(crate) fn netns_id() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/thread-self/ns/net")
        .map(|m| m.ino())
        .unwrap_or(0)
}

/// The process's engine on `ifname` in this thread's namespace: the one
/// opened, or `open`'s. An open that failed is remembered: until its
/// retry time (1 s after the first failure, doubling per failure in a row
/// up to 64 s) the next callers get its error (begun with [`REMEMBERED`])
/// without opening. Every connect of a process whose own engine cannot
/// attach (an engine service owns the interface) made the whole open
/// again before: UMEM, maps, two program loads, then EBUSY, ~19 ms of
/// CPU per connection. A later open (the interface freed) may succeed.
pub(crate) fn get(
    ifname: &str,
    open: impl FnOnce() -> Result<Engine, String>,
) -> Result<Arc<Engine>, String> {
    get_retrying(ifname, open, RETRY_FIRST)
}

fn get_retrying(
    ifname: &str,
    open: impl FnOnce() -> Result<Engine, String>,
    retry_first: Duration,
) -> Result<Arc<Engine>, String> {
    ATFORK.call_once(|| {
        // SAFETY: registers a plain extern "C" handler that only touches
        // atomics (async-signal-safe).
        unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
    });
    let pid = pid();
    let ns = netns_id();
    // The registry's lock is never held while an engine opens (XDP attach,
    // AF_XDP bind, netlink, a thread's start): the first caller marks the
    // key as opening and opens with no lock held; a concurrent caller for
    // the same key waits outside the lock for the outcome.
    let parent = loop {
        let step = with_both(|reg, failed| {
            if let Some(f) = failed
                .iter()
                .find(|f| f.0 == pid && f.1 == ns && f.2 == ifname)
                && Instant::now() < f.4
            {
                return Err(Err(format!("{REMEMBERED}{}", f.3)));
            }
            reg.retain(|(_, _, _, w)| w.as_ref().is_none_or(|w| w.strong_count() > 0));
            let mine = reg
                .iter()
                .find(|(p, i, n, _)| *p == pid && *i == ns && n == ifname);
            match mine {
                Some((_, _, _, Some(w))) => match w.upgrade() {
                    // Attached to an engine service that is gone: a new
                    // engine attaches to a restarted one (the lost one
                    // lives on only for the sockets not yet moved off it).
                    Some(e) if e.service_lost() => {
                        reg.retain(|(p, i, n, _)| !(*p == pid && *i == ns && n == ifname));
                        reg.push((pid, ns, ifname.to_string(), None));
                        Ok(Some(false))
                    }
                    Some(e) => Err(Ok(e)),
                    None => Ok(None),
                },
                Some((_, _, _, None)) => Ok(None), // another thread opens it
                None => {
                    let parent = reg
                        .iter()
                        .any(|(p, i, n, _)| *p != pid && *i == ns && n == ifname);
                    reg.push((pid, ns, ifname.to_string(), None));
                    Ok(Some(parent))
                }
            }
        });
        match step {
            Err(found) => return found,
            Ok(Some(parent)) => break parent,
            Ok(None) => std::thread::sleep(std::time::Duration::from_millis(1)),
        }
    };
    // Should `open` unwind, the mark goes with it (else waiters would wait
    // for ever).
    struct Mark<'a>(u32, u64, &'a str, bool);
    impl Drop for Mark<'_> {
        fn drop(&mut self) {
            if self.3 {
                let Mark(pid, ns, name, _) = *self;
                with(|reg| {
                    reg.retain(|(p, i, n, w)| !(*p == pid && *i == ns && n == name && w.is_none()))
                });
            }
        }
    }
    let mut mark = Mark(pid, ns, ifname, true);
    let mut opened = open().map(Arc::new).map_err(|e| {
        if parent {
            format!("forked child cannot open its own engine on {ifname} (the parent's engine owns it): {e}")
        } else {
            e
        }
    });
    mark.3 = false;
    with_both(|reg, failed| {
        let at = failed
            .iter()
            .position(|f| f.0 == pid && f.1 == ns && f.2 == ifname);
        let before = at.map(|k| failed.swap_remove(k));
        let wait = before.as_ref().map_or(retry_first, |f| f.5);
        if let Err(e) = &mut opened {
            failed.push((
                pid,
                ns,
                ifname.to_string(),
                e.clone(),
                Instant::now() + wait,
                (wait * 2).min(RETRY_MAX),
            ));
            // Tried again for the same reason: said at the first.
            if before.is_some_and(|f| f.3 == *e) {
                e.insert_str(0, REMEMBERED);
            }
        }
        let at = reg
            .iter()
            .position(|(p, i, n, w)| *p == pid && *i == ns && n == ifname && w.is_none());
        match (&opened, at) {
            (Ok(e), Some(k)) => reg[k].3 = Some(Arc::downgrade(e)),
            (Ok(e), None) => reg.push((pid, ns, ifname.to_string(), Some(Arc::downgrade(e)))),
            (Err(_), Some(k)) => {
                reg.swap_remove(k);
            }
            (Err(_), None) => {}
        }
    });
    opened
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    fn marks(name: &str) -> usize {
        with(|reg| reg.iter().filter(|e| e.2 == name).count())
    }

    /// A failed or unwinding open leaves no mark behind: the next caller
    /// opens again (once the failure's retry time has come) instead of
    /// waiting for ever.
    #[test]
    fn a_failed_or_panicking_open_leaves_the_key_free() {
        let no = Duration::ZERO;
        let r = get_retrying("nwreg-test0", || Err("no such thing".into()), no);
        assert_eq!(r.err().as_deref(), Some("no such thing"));
        assert_eq!(marks("nwreg-test0"), 0);
        let p = std::panic::catch_unwind(|| {
            get_retrying("nwreg-test1", || panic!("open failed hard"), no)
        });
        assert!(p.is_err());
        assert_eq!(marks("nwreg-test1"), 0);
        // Concurrent callers for one key: each waits outside the lock and
        // then opens itself (the first failed, its retry time is now),
        // never deadlocks.
        let calls = std::sync::atomic::AtomicU32::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    let r = get_retrying(
                        "nwreg-test2",
                        || {
                            calls.fetch_add(1, Ordering::Relaxed);
                            std::thread::sleep(std::time::Duration::from_millis(5));
                            Err("refused".into())
                        },
                        no,
                    );
                    assert!(r.is_err());
                });
            }
        });
        assert!(calls.load(Ordering::Relaxed) >= 1);
        assert_eq!(marks("nwreg-test2"), 0);
    }

    /// A failed open is not made again before its retry time: the callers
    /// in between get its error, marked as remembered; after it, the next
    /// caller opens again (the wait doubles per failure in a row).
    #[test]
    fn a_failed_open_is_remembered_until_its_retry_time() {
        // A claim "still remembered" holds only before its retry time: a run
        // in which this thread was held off the CPU past it (a loaded
        // machine: a 250 ms stall failed the test before) shows nothing and
        // is made again, on a fresh key.
        let wait = Duration::from_millis(300);
        let shown = (0..5).any(|i| remembered_until_retry(&format!("nwreg-test3-{i}"), wait));
        assert!(
            shown,
            "five runs in a row ran late past a 300 ms retry time"
        );
    }

    /// One run of the test above on `key`: false when the thread ran late
    /// past a retry time (a claim could not be checked).
    fn remembered_until_retry(key: &str, wait: Duration) -> bool {
        let calls = std::sync::atomic::AtomicU32::new(0);
        let fail = || -> Result<Engine, String> {
            calls.fetch_add(1, Ordering::Relaxed);
            Err("XDP attach refused (EBUSY)".into())
        };
        // The failure's retry time is at least `t0 + wait`: a call that
        // returned before that was made before it.
        let t0 = Instant::now();
        let first = get_retrying(key, fail, wait).err();
        assert_eq!(first.as_deref(), Some("XDP attach refused (EBUSY)"));
        for _ in 0..50 {
            let again = get_retrying(key, fail, wait).err().unwrap();
            if t0.elapsed() >= wait {
                return false;
            }
            assert_eq!(again, format!("{REMEMBERED}XDP attach refused (EBUSY)"));
        }
        assert_eq!(calls.load(Ordering::Relaxed), 1);
        assert_eq!(marks(key), 0);
        std::thread::sleep(wait + Duration::from_millis(50));
        // Opened again, failed for the same reason: marked as said.
        let t1 = Instant::now();
        let third = get_retrying(key, fail, wait).err().unwrap();
        assert_eq!(third, format!("{REMEMBERED}XDP attach refused (EBUSY)"));
        assert_eq!(calls.load(Ordering::Relaxed), 2);
        // Now twice the wait: still remembered after the first wait.
        std::thread::sleep(wait + Duration::from_millis(50));
        let fourth = get_retrying(key, fail, wait).err().unwrap();
        if t1.elapsed() >= 2 * wait {
            return false;
        }
        assert!(fourth.starts_with(REMEMBERED), "{fourth}");
        assert_eq!(calls.load(Ordering::Relaxed), 2);
        true
    }

    /// A socket's namespace cookie is the thread's (this kernel has
    /// SO_NETNS_COOKIE), and a fd that is no socket has none (the inode
    /// comparison is used then).
    #[test]
    fn a_sockets_netns_cookie_is_its_threads() {
        let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        let c = sock_netns_cookie(s.as_raw_fd());
        assert!(c.is_some());
        assert_eq!(c, netns_cookie());
        let f = std::fs::File::open("/proc/self/stat").unwrap();
        assert_eq!(sock_netns_cookie(f.as_raw_fd()), None);
    }
}
