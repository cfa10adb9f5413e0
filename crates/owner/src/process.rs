//! The process host of the owned lock: each thread's token
//! (`pid << 32 | tid`, made on first use, made anew in a forked child), the
//! barrier that makes a revocation safe,
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` (registered once per
//! process, again in a forked child), and the switch that turns owning off
//! ([`forbid`]: the shim's `NANOWIRE_SHIM_NO_OWNER=1`, a comparison knob).
//! Where membarrier is not available, no lock is owned.
//!
//! [`Process`] is the engine's host (`nanowire-stack`); the shim has its
//! own (its tokens live in its initial-exec thread-local block) built on
//! [`may_bias`] and [`barrier_all`] here, so the registration and the
//! switch are one per process.

use crate::lock::OwnerHost;
use std::cell::Cell;
use std::sync::atomic::{AtomicU8, Ordering};

/// `membarrier(2)` commands (linux/membarrier.h).
const CMD_GLOBAL: libc::c_long = 1;
const CMD_PRIVATE_EXPEDITED: libc::c_long = 8;
const CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 16;

/// [`STATE`]: not asked yet in this process.
const ASK: u8 = 0;
/// Registered: locks may be owned.
const YES: u8 = 1;
/// membarrier refused: no lock is owned.
const NO: u8 = 2;
/// Turned off ([`forbid`]; kept across fork).
const OFF: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(ASK);

fn membarrier(cmd: libc::c_long) -> bool {
    // SAFETY: membarrier takes two integers and touches no memory of ours.
    unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            cmd,
            0 as libc::c_long,
            0 as libc::c_long,
        ) == 0
    }
}

/// May a lock be owned in this process ([`barrier_all`] works)? The first
/// call registers for the expedited barrier.
#[inline]
pub fn may_bias() -> bool {
    match STATE.load(Ordering::Acquire) {
        YES => true,
        NO | OFF => false,
        _ => {
            let ok = membarrier(CMD_REGISTER_PRIVATE_EXPEDITED);
            let _ = STATE.compare_exchange(
                ASK,
                if ok { YES } else { NO },
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            STATE.load(Ordering::Acquire) == YES
        }
    }
}

/// No lock is owned in this process (and its forked children) from now
/// on; call it before the first lock is taken (the shim's start).
pub fn forbid() {
    STATE.store(OFF, Ordering::Release);
}

/// Make every thread of the process pass a full memory barrier. Registered
/// before any lock was owned ([`may_bias`]), so this does not fail; the
/// global command (no registration) is the fallback all the same. False:
/// neither worked (the caller cannot make a revocation safe and aborts).
pub fn barrier_all() -> bool {
    membarrier(CMD_PRIVATE_EXPEDITED) || membarrier(CMD_GLOBAL)
}

/// This thread's words of the engine's owned locks, in initial-exec TLS
/// (`crate::tls`: every take of an owned lock reads the token). All zeros
/// is the initial value of each.
#[repr(C)]
struct Words {
    /// This thread's token (0: not made yet, or made anew after fork).
    token: Cell<u64>,
    /// The token this thread had in the parent (the forking thread of a
    /// forked child; else 0).
    before: Cell<u64>,
    /// This thread is a visitor of the locks ([`Process::set_visitor`]).
    visitor: Cell<bool>,
}

impl Words {
    /// The initial value (all zeros).
    #[cfg_attr(target_arch = "x86_64", allow(dead_code))]
    const fn new() -> Words {
        Words {
            token: Cell::new(0),
            before: Cell::new(0),
            visitor: Cell::new(false),
        }
    }
}

// SAFETY: integers and a bool in cells: all zeros is `Words::new()`;
// `Cell` is not `Sync`; no drop glue.
unsafe impl crate::tls::ZeroInit for Words {}

crate::initial_exec_block!(
    /// This thread's [`Words`].
    fn words() -> Words = Words::new(),
    "nanowire_owner_tls"
);

/// The calling thread's `pid << 32 | tid`, from the kernel.
pub fn fresh_token() -> u64 {
    // SAFETY: getpid and gettid take nothing and cannot fail.
    unsafe { ((libc::getpid() as u32 as u64) << 32) | libc::gettid() as u32 as u64 }
}

/// In a forked child (its one thread, from a `pthread_atfork` child
/// handler): the registration is asked again (it belongs to the parent's
/// process); this thread's token is made anew, the old one kept so that a
/// lock this thread was inside of when it forked is recognised. Several
/// handlers may call it: the second finds the token made in this process
/// (or not made yet) and changes nothing.
///
/// The registration (the parent's belongs to its own memory) is made again
/// at once when the parent had one: the child has one thread now, and a
/// registration then costs no RCU grace period, where a child that made
/// threads first would wait for one (5-17 ms) at its first owned lock.
pub fn after_fork_child() {
    let was = STATE.load(Ordering::Acquire);
    let _ = STATE.compare_exchange(YES, ASK, Ordering::AcqRel, Ordering::Acquire);
    let _ = STATE.compare_exchange(NO, ASK, Ordering::AcqRel, Ordering::Acquire);
    if was == YES {
        may_bias();
    }
    // SAFETY: getpid takes nothing and cannot fail.
    let pid = unsafe { libc::getpid() } as u32;
    let w = words();
    let t = w.token.get();
    if t != 0 && (t >> 32) as u32 != pid {
        w.before.set(t);
        w.token.set(0);
    }
}

/// The engine's host of the owned lock (tokens in an ordinary
/// thread-local).
pub struct Process;

impl Process {
    /// Mark the calling thread a visitor of the owned locks
    /// ([`crate::lock::OwnerHost::visitor`]): an engine's own threads (its
    /// timer service, its neighbour thread), whose takes now and then must
    /// not leave the application thread's lock to the mutex for good.
    pub fn set_visitor(on: bool) {
        words().visitor.set(on);
    }
}

impl OwnerHost for Process {
    #[inline(always)]
    fn me() -> u64 {
        let t = &words().token;
        let k = t.get();
        if k != 0 {
            return k;
        }
        let k = fresh_token();
        t.set(k);
        k
    }
    fn me_before_fork() -> u64 {
        words().before.get()
    }
    fn pid() -> u32 {
        (Self::me() >> 32) as u32
    }
    fn may_bias() -> bool {
        may_bias()
    }
    #[inline(always)]
    fn owner_fence() {
        // The revoker's barrier_all does the CPU's part (the lock's module
        // doc); only the compiler must keep the store before the load.
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
    }
    fn visitor() -> bool {
        words().visitor.get()
    }
    fn barrier_all() {
        if !barrier_all() {
            let m = b"nanowire: membarrier failed: cannot hand a lock to a second thread\n";
            // SAFETY: writes our own buffer to stderr; then the process ends.
            unsafe { libc::write(2, m.as_ptr().cast(), m.len()) };
            std::process::abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::{OwnedLock, SHARED, hammer};

    #[test]
    fn tokens_are_per_thread_and_carry_the_pid() {
        let me = Process::me();
        assert_eq!(Process::pid(), std::process::id());
        assert_eq!(me, fresh_token());
        assert_ne!(me, SHARED);
        let other = std::thread::spawn(Process::me).join().unwrap();
        assert_ne!(other, me);
        assert_eq!(other >> 32, me >> 32);
        // A second fork handler in the same process changes nothing.
        after_fork_child();
        assert_eq!(Process::me(), me);
        assert_eq!(Process::me_before_fork(), 0);
    }

    #[test]
    fn a_forked_child_gets_a_fresh_token_and_keeps_the_old_one() {
        let me = Process::me();
        let l = OwnedLock::<u32, Process>::new(0);
        drop(l.lock());
        // SAFETY: the child only reads and writes its own memory, asks
        // getpid/gettid and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            after_fork_child();
            after_fork_child();
            let ok = Process::me_before_fork() == me
                && Process::me() != me
                && Process::pid() == std::process::id()
                // The parent's lock: not owned by the child's thread, so
                // its take is the mutex's (and revokes the parent's owner).
                && !l.lock().owned()
                && l.owner() == SHARED;
            // SAFETY: ends the child at once (no test harness teardown).
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut st = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
        assert!(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0, "{st:#x}");
        if may_bias() {
            assert_eq!(l.owner(), me, "the parent's lock is still its own");
        }
    }

    #[test]
    fn the_owner_hands_over_through_a_real_membarrier_losing_no_update() {
        // The owner's take is a plain store and load (compiler fence only):
        // the revokers' membarrier is what makes the switch safe here.
        const N: u64 = 100_000;
        let (total, owned, end) = hammer::<Process>(2, N);
        assert_eq!(total, 3 * N);
        if may_bias() {
            assert!(owned, "the first taker owned it");
            assert_eq!(end, SHARED);
        }
    }
}
