//! Engine connections shared across fork: the connection stays on an
//! engine, and moves to the one process that uses it (issue 24).
//!
//! A kernel socket survives fork: parent and child both hold it, either may
//! use it, the last close ends it. An engine connection lives in one
//! process's engine. At fork each engine connection gets a **slot** in a
//! page shared by the process tree (`MAP_SHARED`, inherited by every child)
//! and stays on the parent's engine:
//!
//! * the **owner** (the process whose engine serves it) goes on using it;
//! * a **child's first use** of its copy (any call that reaches the
//!   connection: recv, send, poll, epoll, getsockopt, ...) asks the owner
//!   (the slot's `want`, a futex wake; `taker`: the child's pid when it can
//!   serve the connection on an engine of its own, i.e. on the engine
//!   service). The owner's broker thread then either **moves** it to the
//!   child (up to [`MAX_MOVES`] times: `moves`): its engine exports the state and
//!   offers the 4-tuple to the service with the socket, the state goes in
//!   a memfd the child reads (`xfd`, `xlen`, state `MOVED`), the child's
//!   engine adopts it and takes the 4-tuple, and the child is the owner
//!   from then on (the old owner's copy is a copy like any child's); or it
//!   hands the connection over to the kernel *into the shared socket
//!   itself* (`handover::in_place`), so that every holder has the kernel's
//!   connection. A later use by another holder (the old owner too) asks
//!   the new owner, which moves it on the same way, so holders that use
//!   it in turns keep it on the engine; past [`MAX_MOVES`] moves (holders
//!   that use it at once pass it to and fro) the next request has it
//!   handed over to the kernel;
//! * the **owner's close** of its last fd while a child still holds its
//!   copy keeps the connection on the engine for the child on the engine
//!   service (`handover::Parked`: the fork-per-connection shape, whose
//!   parent closes its copy at once), moved at the child's first use, closed
//!   when every child let go, handed to the kernel after a second or at
//!   the owner's exit; elsewhere it hands the connection over in place.
//!   When no child holds it any more (each child's close or exit counts
//!   down `holders`) the close is the engine's ordinary close (FIN);
//! * the owner's **exit** closes its records, so the same rule holds,
//!   except that it keeps nothing parked: the connection goes to the kernel
//!   in the shared socket and the slot says `ORPHAN` ([`orphan`]); the first
//!   holder to use it that can serve it (on the engine service, or on an
//!   engine of its own once the owner is gone) takes it from the kernel
//!   onto its engine ([`Claimed::Orphaned`], `handover::adopt_orphan`) and
//!   owns the slot from then on (so does a connection a parked close
//!   handed to the kernel after a second, and on the service one a close
//!   handed over).
//!
//! A hand-over that cannot be done (no CAP_NET_ADMIN, a state other than
//! ESTABLISHED or CLOSE-WAIT) leaves the connection with the owner (one
//! warn line there) and the child's fd is an unconnected socket (ENOTCONN),
//! as before; a move that cannot be done (the child has no engine on the
//! service: all its process slots used) comes back to the owner, which
//! hands it over to the kernel. A child killed with SIGKILL never counts
//! down: the owner's close then hands over (correct, not accelerated).
//! `posix_spawn` and `exec` prepare what the new program inherits (it
//! cannot ask an owner: `spawn.rs`); `vfork` in a process with engine
//! sockets is a fork. Engine UDP sockets take slots too (`accel`): a
//! child's use moves the socket to the child's engine on the service when
//! the owner has not used it since the fork (once), else has the owner take
//! it off its engine (the kernel's for both); an owner that exits (or, on
//! the service, closes its last fd) leaves it to the first holder that
//! uses it (`ORPHAN`: [`orphan`], [`Claimed::Orphaned`]). A copy's
//! `sendto`, `sendmsg` or `sendmmsg` (every message) with a destination
//! is not a use: it goes out through the kernel socket under the fd, and
//! the socket stays where it is (`ops::of_send`).

use crate::log::log;
use nanowire_options::Level;
use rustix::thread::futex;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

use nanowire_stack::xdp::forkpage::{
    self as layout, BUSY, ENGINE, FREE, MOVED, ORPHAN, SLOTS, STATE,
};

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
    /// The child asking to take the connection onto its own engine (its
    /// pid; 0: it asks for the kernel's hand-over).
    taker: AtomicU32,
    /// While `MOVED`: the owner's memfd (its fd number) holding the
    /// exported state, and its length.
    xfd: AtomicU32,
    xlen: AtomicU32,
    /// Moves between engines so far ([`MAX_MOVES`] at most: a later
    /// request is a hand-over to the kernel, so two users do not pass it
    /// to and fro for ever).
    moves: AtomicU32,
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

/// How many times one connection may move between the engines of the
/// processes that hold it: processes using it in turns (a pipe passing the
/// turn, a parent that answers after its child) keep it on the engine;
/// processes using it at once would pass it to and fro (a move costs a
/// state export, a memfd and two round trips to the service, ~1 ms), so
/// past this the next request has it handed over to the kernel, which
/// serves concurrent holders as such.
pub const MAX_MOVES: u32 = 64;

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
    // Undecided, or being decided (a hand-over or a move under way): the
    // new child holds a copy of it too, whatever the decision.
    if let Some((s, _, _)) = live(existing) {
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
            s.taker.store(0, Ordering::Relaxed);
            s.moves.store(0, Ordering::Relaxed);
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

/// exec is about to close the fds `closes` says: of this process's copies
/// (`copies`: each fd number with its handle), a handle all of whose
/// numbers close is no longer held by this process ([`dropped`]).
pub fn held_until_exec(copies: &[(libc::c_int, u64)], closes: &dyn Fn(libc::c_int) -> bool) {
    let mut held: Vec<(u64, bool)> = Vec::new();
    for &(fd, h) in copies {
        match held.iter_mut().find(|(x, _)| *x == h) {
            // Every number of it must go for the copy to go.
            Some((_, all)) => *all &= closes(fd),
            None => held.push((h, closes(fd))),
        }
    }
    for (h, _) in held.into_iter().filter(|&(_, all)| all) {
        dropped(h);
    }
}

/// A holder (not the owner) let go of its copy (its last fd closed, or it
/// exits). The last one wakes the owner's broker (a connection the owner
/// closed and keeps for its children ends then).
pub fn dropped(h: u64) {
    if let Some((s, g, st)) = live(h)
        && s.holders
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            == Ok(1)
    {
        if st == ORPHAN {
            // Nobody left to take it: the kernel socket closes with the
            // last fd, as plainly.
            let _ =
                s.word
                    .compare_exchange(g | ORPHAN, g | FREE, Ordering::AcqRel, Ordering::Relaxed);
            return;
        }
        if let Some(p) = page() {
            p.req.fetch_add(1, Ordering::AcqRel);
            let _ = futex::wake(&p.req, futex::Flags::empty(), i32::MAX as u32);
        }
    }
}

/// Processes other than the owner holding handle `h`'s connection (`None`:
/// decided, nothing to hold).
pub fn holders(h: u64) -> Option<u32> {
    live(h).map(|(s, _, _)| s.holders.load(Ordering::Acquire))
}

/// The owner of handle `h`'s connection (`None`: decided).
pub fn owner_of(h: u64) -> Option<u32> {
    live(h).map(|(s, _, _)| s.owner.load(Ordering::Acquire))
}

/// The connection's addresses (local, remote) as the owner wrote them at
/// the first fork (`None`: not known, or decided).
pub fn addrs(h: u64) -> Option<(std::net::SocketAddrV4, std::net::SocketAddrV4)> {
    let (s, _, _) = live(h)?;
    let l = layout::unpack(s.local.load(Ordering::Acquire))?;
    let r = layout::unpack(s.remote.load(Ordering::Acquire))?;
    Some((l, r))
}

/// How many times handle `h`'s socket moved between engines (0: never,
/// or the handle is stale).
pub fn moves(h: u64) -> u32 {
    live(h).map_or(0, |(s, _, _)| s.moves.load(Ordering::Acquire))
}

/// The owner that [`decide`]d handle `h` keeps it on its engine after all
/// (its close parks it for the children): undecided again.
pub fn undecide(h: u64) {
    if let Some((s, g, BUSY)) = live(h) {
        s.word.store(g | ENGINE, Ordering::Release);
        let _ = futex::wake(&s.word, futex::Flags::empty(), i32::MAX as u32);
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
        if st == ORPHAN {
            return false; // left to the holders by an owner that left
        }
        if st != ENGINE {
            // Being decided, or moved and not yet taken: wait for it.
            let ts = futex::Timespec {
                tv_sec: 0,
                tv_nsec: 50_000_000,
            };
            let _ = futex::wait(&s.word, futex::Flags::empty(), g | st, Some(&ts));
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

/// What a child's first use of a shared connection found ([`claim`]).
pub enum Claimed {
    /// Decided: the kernel's connection (or, if it could not be handed
    /// over, an unconnected socket).
    Kernel,
    /// The owner moved it off its engine for this process to take: its
    /// state is in the owner's memfd `xfd` (`xlen` bytes). The caller
    /// adopts it and says how that went ([`moved_in`]).
    Moved { owner: u32, xfd: u32, xlen: u32 },
    /// This process owns it already (another thread's claim moved it
    /// here): look the fd up again.
    Mine,
    /// A socket whose owner `owner` left it to the holders ([`orphan`]; a
    /// connection: the kernel's, in the shared socket): this process holds
    /// the slot's decision and takes it onto an engine of its own, then
    /// says how that went ([`orphan_taken`]).
    Orphaned { owner: u32 },
}

/// A child's first use of handle `h`'s connection: ask the owner (the
/// process whose engine serves it) and wait until that is decided. `take`:
/// this process can serve it on an engine of its own (the engine service),
/// so it asks for the connection itself; the owner moves it if it can (up
/// to [`MAX_MOVES`] times), else hands it over to the kernel. While the owner
/// lives the wait goes on (its broker answers within one move).
pub fn claim(h: u64, take: bool) -> Claimed {
    claim_as(h, take, false)
}

/// [`claim`]; `orphan`: this process can take a socket whose owner left
/// onto an engine of its own ([`Claimed::Orphaned`]; else such a socket is
/// the kernel's for every holder).
pub fn claim_as(h: u64, take: bool, orphan: bool) -> Claimed {
    let Some(p) = page() else {
        return Claimed::Kernel;
    };
    let me = pid();
    // The owner this process asked (a move changes the owner: ask anew).
    let mut asked = 0;
    loop {
        let Some((s, g, st)) = live(h) else {
            return Claimed::Kernel;
        };
        let owner = s.owner.load(Ordering::Acquire);
        if st == ORPHAN {
            let to = if orphan { BUSY } else { FREE };
            if s.word
                .compare_exchange(g | ORPHAN, g | to, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            if !orphan {
                let _ = futex::wake(&s.word, futex::Flags::empty(), i32::MAX as u32);
                return Claimed::Kernel;
            }
            return Claimed::Orphaned { owner };
        }
        if st == MOVED && s.taker.load(Ordering::Acquire) == me {
            return Claimed::Moved {
                owner,
                xfd: s.xfd.load(Ordering::Acquire),
                xlen: s.xlen.load(Ordering::Acquire),
            };
        }
        if st == ENGINE && asked != owner {
            if owner == me {
                // Moved here meanwhile (by another thread's claim).
                return Claimed::Mine;
            }
            // A request for the kernel's hand-over wins over a move.
            let t = if take { me } else { 0 };
            if s.want.load(Ordering::Acquire) == 0 || t == 0 {
                s.taker.store(t, Ordering::Release);
            }
            s.want.store(1, Ordering::Release);
            p.req.fetch_add(1, Ordering::AcqRel);
            let _ = futex::wake(&p.req, futex::Flags::empty(), i32::MAX as u32);
            asked = owner;
        }
        let ts = futex::Timespec {
            tv_sec: 0,
            tv_nsec: 100_000_000,
        };
        let _ = futex::wait(&s.word, futex::Flags::empty(), g | st, Some(&ts));
        if !alive(owner) {
            // The owner is gone, its engine with it: nothing to hand over,
            // unless it decided before it went (an exiting owner leaves a
            // socket `ORPHAN` for this holder, then is gone before this
            // wait sees it): look at what it left.
            if s.word
                .compare_exchange(g | st, g | FREE, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            let _ = futex::wake(&s.word, futex::Flags::empty(), i32::MAX as u32);
            return Claimed::Kernel;
        }
    }
}

/// Is process `p` alive (0: nobody to wait for)?
fn alive(p: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    p == 0 || unsafe { libc::kill(p as i32, 0) } == 0 || crate::sys::errno() != libc::ESRCH
}

/// The taker of handle `h` (after [`Claimed::Moved`]) adopted the
/// connection (`ok`: it is on this process's engine now, which owns the
/// slot and answers the other holders from here on) or could not (the
/// owner takes it back and hands it over to the kernel).
pub fn moved_in(h: u64, ok: bool) {
    let Some((s, g, MOVED)) = live(h) else { return };
    if ok {
        // The old owner holds its copy still: the holders stay as many.
        s.owner.store(pid(), Ordering::Release);
        s.want.store(0, Ordering::Relaxed);
        s.moves.fetch_add(1, Ordering::AcqRel);
        let _ = ensure_broker();
        s.taker.store(0, Ordering::Release);
        s.word.store(g | ENGINE, Ordering::Release);
    } else {
        s.taker.store(0, Ordering::Release);
        s.word.store(g | BUSY, Ordering::Release);
    }
    let _ = futex::wake(&s.word, futex::Flags::empty(), i32::MAX as u32);
}

/// The owner leaves (exit, or its last close) holding the decision on
/// socket `h` ([`decide`]), off its engine: a UDP socket with its queue on
/// the kernel socket, a TCP connection handed over to the kernel in the
/// shared socket. The first holder to use it takes it
/// ([`Claimed::Orphaned`]); none left holding it: free.
pub fn orphan(h: u64) {
    let Some((s, g, BUSY)) = live(h) else { return };
    let to = if s.holders.load(Ordering::Acquire) == 0 {
        FREE
    } else {
        ORPHAN
    };
    s.want.store(0, Ordering::Relaxed);
    s.word.store(g | to, Ordering::Release);
    // A holder that let go meanwhile saw no orphan: look again.
    if to == ORPHAN && s.holders.load(Ordering::Acquire) == 0 {
        let _ = s
            .word
            .compare_exchange(g | ORPHAN, g | FREE, Ordering::AcqRel, Ordering::Relaxed);
    }
    let _ = futex::wake(&s.word, futex::Flags::empty(), i32::MAX as u32);
}

/// This process took (`ok`) the orphaned socket `h` onto its engine
/// or could not. Taken: it owns the slot while other holders remain (the
/// returned handle, for its record; their first use asks it, as the
/// owner's after a move), else the slot is free (0). Not taken: free, the
/// kernel's for every holder.
pub fn orphan_taken(h: u64, ok: bool) -> u64 {
    let Some((s, g, BUSY)) = live(h) else {
        return 0;
    };
    let others = s
        .holders
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
        .map_or(0, |n| n - 1);
    if !ok || others == 0 || ensure_broker().is_none() {
        free(s, g);
        return 0;
    }
    s.owner.store(pid(), Ordering::Release);
    s.want.store(0, Ordering::Relaxed);
    s.taker.store(0, Ordering::Relaxed);
    s.moves.fetch_add(1, Ordering::AcqRel);
    s.word.store(g | ENGINE, Ordering::Release);
    let _ = futex::wake(&s.word, futex::Flags::empty(), i32::MAX as u32);
    h
}

/// The owner's broker moved handle `h`'s connection off its engine for
/// `taker` (the slot is `BUSY`, held by this broker): `bytes`, its state,
/// go in a memfd the taker reads, and the slot says `MOVED` until the
/// taker has adopted it. True: taken (the slot is the taker's); false: not
/// (the taker could not, or died): the slot is `BUSY` again, for the
/// caller to take the connection back.
pub fn offer_moved(h: u64, bytes: &[u8], taker: u32) -> bool {
    let Some((s, g, BUSY)) = live(h) else {
        return false;
    };
    let Ok(fd) = rustix::fs::memfd_create("nanowire-moved", rustix::fs::MemfdFlags::CLOEXEC) else {
        return false;
    };
    if rustix::io::write(&fd, bytes).ok() != Some(bytes.len()) {
        return false;
    }
    s.xfd.store(
        std::os::fd::AsRawFd::as_raw_fd(&fd) as u32,
        Ordering::Relaxed,
    );
    s.xlen.store(bytes.len() as u32, Ordering::Relaxed);
    s.taker.store(taker, Ordering::Relaxed);
    s.word.store(g | MOVED, Ordering::Release);
    let _ = futex::wake(&s.word, futex::Flags::empty(), i32::MAX as u32);
    loop {
        let ts = futex::Timespec {
            tv_sec: 0,
            tv_nsec: 100_000_000,
        };
        let _ = futex::wait(&s.word, futex::Flags::empty(), g | MOVED, Some(&ts));
        let w = s.word.load(Ordering::Acquire);
        if w != g | MOVED {
            // Taken: the taker is the owner (and may have decided on it
            // since: closed, exited; the slot may even be free and given
            // to another connection since, a new generation: this owner's
            // next fork made one, its record still naming the connection);
            // not taken: it left the slot `BUSY` for this broker, the
            // owner unchanged (and only this broker moves it on).
            return w & !STATE != g || s.owner.load(Ordering::Acquire) == taker;
        }
        if w == g | MOVED
            && !alive(taker)
            && s.word
                .compare_exchange(g | MOVED, g | BUSY, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            return false;
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

/// What the owner's broker did for a child that uses a connection.
pub enum Answer {
    /// No fd of this process names it (nothing done).
    NotMine,
    /// Handed over to the kernel (or could not be): the slot is settled.
    Decided,
    /// Moved to the taker's engine ([`offer_moved`]): the slot is the taker's.
    Moved,
}

/// The broker's answer to a child that uses connection `h`, with the
/// taker that asked (0: the kernel's hand-over; `handover::answer_child`,
/// set once by `handover::init`: the hand-over sits above this module).
pub static ANSWER: std::sync::OnceLock<fn(u64, u32) -> Answer> = std::sync::OnceLock::new();

/// The broker's look, each turn, at the connections the owner closed and
/// keeps for its children (`handover::tend_parked`): true while some are
/// kept (the broker then looks again soon). Set once by `handover::init`.
pub static TEND: std::sync::OnceLock<fn() -> bool> = std::sync::OnceLock::new();

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
            let taker = if s.moves.load(Ordering::Acquire) < MAX_MOVES {
                s.taker.load(Ordering::Acquire)
            } else {
                0
            };
            let a = ANSWER
                .get()
                .map_or(Answer::NotMine, |answer| answer(h, taker));
            if matches!(a, Answer::Moved) {
                continue;
            }
            if matches!(a, Answer::Decided) || tries >= 3 {
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
        let kept = TEND.get().is_some_and(|tend| tend());
        let ts = if kept {
            futex::Timespec {
                tv_sec: 0,
                tv_nsec: 50_000_000,
            }
        } else {
            futex::Timespec {
                tv_sec: 1,
                tv_nsec: 0,
            }
        };
        let _ = futex::wait(&p.req, futex::Flags::empty(), seen, Some(&ts));
    }
}
