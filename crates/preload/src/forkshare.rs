//! Engine connections shared across fork: the hand-over to the kernel is
//! deferred until a second process actually uses the connection (issue 24).
//!
//! A kernel socket survives fork: parent and child both hold it, either may
//! use it, the last close ends it. An engine connection lives in one
//! process's engine. Until session 13 every engine connection was handed
//! over to the kernel (TCP_REPAIR) at fork, before the child existed, so
//! that both processes share the kernel's socket; a child that never
//! touches the connection (a worker forked for something else, a child
//! that execs with the socket close-on-exec) cost the parent its
//! acceleration. Now, at fork, each engine connection gets a **slot** in a
//! page shared by the process tree (`MAP_SHARED`, inherited by every
//! child) and stays on the parent's engine:
//!
//! * the **owner** (the process whose engine serves it) goes on using it;
//! * a **child's first use** of its copy (any call that reaches the
//!   connection: recv, send, poll, epoll, getsockopt, ...) asks the owner
//!   (the slot's `want`, a futex wake): the owner's broker thread hands the
//!   connection over to the kernel *into the shared socket itself* (the
//!   application's fd in both processes names one open file, the
//!   placeholder socket: `handover::to_kernel_in_place`), so both
//!   processes now hold the kernel's connection; the child waits for that
//!   (while the owner lives) and goes on through the kernel;
//! * the **owner's close** of its last fd while a child still holds its
//!   copy hands the connection over in place too (the child keeps it);
//!   when no child holds it any more (each child's close or exit counts
//!   down `holders`) the close is the engine's ordinary close (FIN);
//! * the owner's **exit** closes its records, so the same rule holds.
//!
//! A hand-over that cannot be done (no CAP_NET_ADMIN, a state other than
//! ESTABLISHED or CLOSE-WAIT) leaves the connection with the owner (one
//! warn line there) and the child's fd is an unconnected socket (ENOTCONN),
//! as before. A child killed with SIGKILL never counts
//! down: the owner's close then hands over (correct, not accelerated).
//! `vfork`, `posix_spawn` and `exec` still prepare as before (the new
//! program may take any fd: `spawn.rs`).

use crate::log::log;
use nanowire_options::Level;
use rustix::thread::futex;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

use nanowire_stack::xdp::forkpage::{self as layout, BUSY, ENGINE, FREE, SLOTS, STATE};

#[repr(C)]
struct Slot {
    /// generation << 3 | state; waiters sleep on it (futex). The generation
    /// is bumped at each allocation: a handle whose generation no longer
    /// matches names a decision already made. States: `FREE`, `ENGINE` (on
    /// the owner's engine), `BUSY` (being decided: the owner's close or
    /// its broker is handing it over).
    word: AtomicU32,
    /// Processes other than the owner holding the socket (forked children
    /// that have not closed it).
    holders: AtomicU32,
    /// The owner's pid.
    owner: AtomicU32,
    /// A child asks the owner to hand the connection over (1).
    want: AtomicU32,
    /// For `nanowire stats` (written before the slot is published): the
    /// connection's addresses (`layout::pack`) and its socket's inode.
    local: AtomicU64,
    remote: AtomicU64,
    ino: AtomicU64,
}

#[repr(C)]
struct Page {
    /// Bumped (and woken) by a child that set a slot's `want`.
    req: AtomicU32,
    /// `layout::MAGIC` (the page is read by `nanowire stats`).
    magic: AtomicU32,
    slots: [Slot; SLOTS],
}

// The layout `nanowire stats` reads (nanowire_stack::xdp::forkpage).
const _: () = {
    assert!(std::mem::size_of::<Page>() == layout::PAGE_BYTES);
    assert!(std::mem::size_of::<Slot>() == layout::SLOT_BYTES);
    assert!(std::mem::offset_of!(Page, slots) == layout::HEADER_BYTES);
    assert!(std::mem::offset_of!(Slot, holders) == layout::OFF_HOLDERS);
    assert!(std::mem::offset_of!(Slot, owner) == layout::OFF_OWNER);
    assert!(std::mem::offset_of!(Slot, local) == layout::OFF_LOCAL);
    assert!(std::mem::offset_of!(Slot, remote) == layout::OFF_REMOTE);
    assert!(std::mem::offset_of!(Slot, ino) == layout::OFF_INO);
};

static PAGE: AtomicPtr<Page> = AtomicPtr::new(std::ptr::null_mut());
/// The process whose broker thread runs (threads do not cross fork).
static BROKER: AtomicU32 = AtomicU32::new(0);

fn page() -> Option<&'static Page> {
    let p = PAGE.load(Ordering::Acquire);
    // SAFETY: set once to a mapping that is never unmapped.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// A record's handle: generation << 32 | slot index + 1 (0: none).
fn parts(h: u64) -> Option<(&'static Slot, u32)> {
    let i = (h as u32 as usize).checked_sub(1)?;
    Some((page()?.slots.get(i)?, (h >> 32) as u32))
}

/// The slot of handle `h` while it is undecided: (slot, its word's
/// generation part, state); `None` once decided (freed or reused).
fn live(h: u64) -> Option<(&'static Slot, u32, u32)> {
    let (s, g) = parts(h)?;
    let w = s.word.load(Ordering::Acquire);
    let st = w & STATE;
    (w >> 3 == g & (u32::MAX >> 3) && st != FREE).then_some((s, w & !STATE, st))
}

fn pid() -> u32 {
    std::process::id()
}

/// Before a fork (in the owner): a slot for one of its engine connections
/// (`existing`: the handle it has from an earlier fork, 0 if none), held
/// by the child about to be made, and the broker thread that answers
/// children. `conn`: its addresses and its socket's inode, for `nanowire
/// stats`. `None`: no slot (the shared page cannot be mapped, all slots
/// used, no thread): the caller hands the connection over at once, as
/// before.
pub fn share(existing: u64, conn: (u64, u64, u64)) -> Option<u64> {
    if let Some((s, _, ENGINE)) = live(existing) {
        s.holders.fetch_add(1, Ordering::AcqRel);
        return Some(existing);
    }
    let p = map_page()?;
    ensure_broker()?;
    for (i, s) in p.slots.iter().enumerate() {
        let w = s.word.load(Ordering::Acquire);
        if w & STATE != FREE {
            continue;
        }
        let g = ((w >> 3) + 1) & (u32::MAX >> 3);
        if s.word
            .compare_exchange(w, g << 3 | BUSY, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            s.owner.store(pid(), Ordering::Relaxed);
            s.holders.store(1, Ordering::Relaxed);
            s.want.store(0, Ordering::Relaxed);
            s.local.store(conn.0, Ordering::Relaxed);
            s.remote.store(conn.1, Ordering::Relaxed);
            s.ino.store(conn.2, Ordering::Relaxed);
            s.word.store(g << 3 | ENGINE, Ordering::Release);
            return Some(u64::from(g) << 32 | (i as u64 + 1));
        }
    }
    None
}

/// A process holding a child's copy (handle `h`) forks again: one more
/// holder.
pub fn held_again(h: u64) {
    if let Some((s, _, _)) = live(h) {
        s.holders.fetch_add(1, Ordering::AcqRel);
    }
}

/// A holder (not the owner) let go of its copy (its last fd closed, or it
/// exits).
pub fn dropped(h: u64) {
    if let Some((s, _, _)) = live(h) {
        let _ = s
            .holders
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }
}

/// What the owner's close of its last fd of a shared connection does.
pub enum Closing {
    /// Nobody else holds it (or it was decided): close as usual.
    Close,
    /// A child holds it: hand it over in place, then [`settle`].
    HandOver,
}

/// The owner closes its last fd of handle `h`'s connection.
pub fn owner_closing(h: u64) -> Closing {
    if !decide(h) {
        return Closing::Close;
    }
    match live(h) {
        Some((s, g, _)) if s.holders.load(Ordering::Acquire) == 0 => {
            free(s, g);
            Closing::Close
        }
        Some(_) => Closing::HandOver,
        None => Closing::Close,
    }
}

/// The owner decides handle `h` itself (a hand-over for another reason:
/// vfork, exec, MSG_OOB, the service gone): true if this caller now holds
/// the decision (then it hands over in place and calls [`settle`]); false:
/// decided already.
pub fn decide(h: u64) -> bool {
    loop {
        let Some((s, g, st)) = live(h) else {
            return false;
        };
        if st == BUSY {
            let ts = futex::Timespec {
                tv_sec: 0,
                tv_nsec: 50_000_000,
            };
            let _ = futex::wait(&s.word, futex::Flags::empty(), g | BUSY, Some(&ts));
            continue;
        }
        if s.word
            .compare_exchange(g | ENGINE, g | BUSY, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return true;
        }
    }
}

fn free(s: &Slot, g: u32) {
    s.want.store(0, Ordering::Relaxed);
    s.word.store(g | FREE, Ordering::Release);
    let _ = futex::wake(&s.word, futex::Flags::empty(), i32::MAX as u32);
}

/// The decision on handle `h` is made (after [`Closing::HandOver`] or the
/// broker's hand-over, whatever its outcome): the slot is free again and
/// every waiting child wakes (each then lets the kernel answer its fd:
/// the connection, or, if it could not be handed over, an unconnected
/// socket).
pub fn settle(h: u64) {
    if let Some((s, g, _)) = live(h) {
        free(s, g);
    }
}

/// A child's first use of handle `h`'s connection: ask the owner to hand
/// it over to the kernel and wait until that is decided. While the owner
/// lives the wait goes on (its broker answers within one hand-over).
pub fn claim(h: u64) {
    let Some(p) = page() else { return };
    let mut asked = false;
    loop {
        let Some((s, g, st)) = live(h) else { return };
        if st == ENGINE && !asked {
            s.want.store(1, Ordering::Release);
            p.req.fetch_add(1, Ordering::AcqRel);
            let _ = futex::wake(&p.req, futex::Flags::empty(), i32::MAX as u32);
            asked = true;
        }
        let ts = futex::Timespec {
            tv_sec: 0,
            tv_nsec: 100_000_000,
        };
        let _ = futex::wait(&s.word, futex::Flags::empty(), g | st, Some(&ts));
        let owner = s.owner.load(Ordering::Relaxed);
        // SAFETY: signal 0 only checks that the process exists.
        if owner != 0
            && unsafe { libc::kill(owner as i32, 0) } != 0
            && crate::sys::errno() == libc::ESRCH
        {
            // The owner is gone, its engine with it: nothing to hand over.
            let _ = s
                .word
                .compare_exchange(g | st, g | FREE, Ordering::AcqRel, Ordering::Relaxed);
            return;
        }
    }
}

fn map_page() -> Option<&'static Page> {
    if let Some(p) = page() {
        return Some(p);
    }
    // A memfd (named: `nanowire stats` finds it in /proc/PID/maps), of the
    // page's size, mapped shared (zeroed by the kernel: every slot FREE),
    // never unmapped; its fd is closed once mapped.
    let m =
        rustix::fs::memfd_create(layout::NAME, rustix::fs::MemfdFlags::CLOEXEC).and_then(|fd| {
            rustix::fs::ftruncate(&fd, std::mem::size_of::<Page>() as u64)?;
            // SAFETY: a shared mapping of the whole memfd just sized.
            unsafe {
                rustix::mm::mmap(
                    std::ptr::null_mut(),
                    std::mem::size_of::<Page>(),
                    rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                    rustix::mm::MapFlags::SHARED,
                    &fd,
                    0,
                )
            }
        });
    let Ok(m) = m else {
        log!(
            Level::Warn,
            "fork: cannot map the page shared with children: engine connections are handed over to the kernel at fork"
        );
        return None;
    };
    // SAFETY: the mapping is the page's size and ours.
    unsafe { &*(m as *const Page) }
        .magic
        .store(layout::MAGIC, Ordering::Release);
    if PAGE
        .compare_exchange(
            std::ptr::null_mut(),
            m.cast(),
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_err()
    {
        // SAFETY: our own mapping, never published.
        let _ = unsafe { rustix::mm::munmap(m, std::mem::size_of::<Page>()) };
    }
    page()
}

/// The broker's answer to a child that uses connection `h`
/// (`handover::answer_child`, set by `handover::init`: the hand-over sits
/// above this module). False: no fd of this process names it.
static ANSWER: std::sync::OnceLock<fn(u64) -> bool> = std::sync::OnceLock::new();

/// Set [`ANSWER`] (once, at load).
pub fn answer_with(f: fn(u64) -> bool) {
    let _ = ANSWER.set(f);
}

fn ensure_broker() -> Option<()> {
    let me = pid();
    if BROKER.swap(me, Ordering::AcqRel) == me {
        return Some(());
    }
    if std::thread::Builder::new()
        .name("nw-forkshare".into())
        .spawn(broker)
        .is_err()
    {
        BROKER.store(0, Ordering::Release);
        return None;
    }
    Some(())
}

/// The owner's thread that answers children: a slot of this process whose
/// `want` is set and whose connection is still on the engine is handed
/// over to the kernel in place (`handover::answer_child`).
fn broker() {
    // The shim's exports pass this thread's calls straight to libc.
    crate::sys::set_in_engine(true);
    let me = pid();
    let Some(p) = page() else { return };
    loop {
        if BROKER.load(Ordering::Acquire) != me || pid() != me {
            return;
        }
        let seen = p.req.load(Ordering::Acquire);
        for (i, s) in p.slots.iter().enumerate() {
            let w = s.word.load(Ordering::Acquire);
            if w & STATE != ENGINE
                || s.owner.load(Ordering::Relaxed) != me
                || s.want.load(Ordering::Acquire) == 0
                || s.word
                    .compare_exchange(w, (w & !STATE) | BUSY, Ordering::AcqRel, Ordering::Relaxed)
                    .is_err()
            {
                continue;
            }
            let h = u64::from(w >> 3) << 32 | (i as u64 + 1);
            let tries = s.want.load(Ordering::Acquire);
            if ANSWER.get().is_some_and(|answer| answer(h)) || tries >= 3 {
                settle(h);
            } else {
                // No fd of this process names it: its last close is under
                // way (that close decides, once this lets go) or it was
                // closed behind the shim's back (settled after 3 passes).
                s.want.store(tries + 1, Ordering::Release);
                s.word.store(w, Ordering::Release);
                let _ = futex::wake(&s.word, futex::Flags::empty(), i32::MAX as u32);
            }
        }
        let ts = futex::Timespec {
            tv_sec: 1,
            tv_nsec: 0,
        };
        let _ = futex::wait(&p.req, futex::Flags::empty(), seen, Some(&ts));
    }
}
