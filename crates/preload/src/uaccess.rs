//! The caller's memory, checked before the shim copies to or from it.
//!
//! The kernel answers EFAULT when a copy from or to user memory faults; a
//! shim that served a call from its engine and copied blindly would die of
//! SIGSEGV instead (issue 20, finding 9). Every buffer, iovec array,
//! msghdr and sockaddr the engine path reads or writes is first checked
//! here: is the range mapped with the access the copy needs?
//!
//! Cost: a thread remembers the mappings (whole VMAs, adjacent ones
//! joined) its buffers were found in ([`nanowire_sockabi::space::RangeCache`]),
//! so a buffer used again — a heap, a stack, a ring — costs one atomic
//! load and a few compares. A range not remembered by the thread is looked
//! up in the process's cache (the ranges any thread found: a new thread's
//! first calls use the heap the others already found), and only then costs
//! one read of `/proc/self/maps` (tens of microseconds, more with many
//! threads). The process's mapping epoch, bumped by the interposed
//! `munmap`/`mprotect`, makes a cache look at what changed since its own
//! epoch (the last [`LOG`] changes, a ring): it forgets the ranges those
//! touched and keeps the others (a thread-per-connection server unmaps each
//! finished thread's small mappings: every cache of every thread was
//! forgotten, and each new thread read the maps twice, session 27); past
//! the ring, it forgets everything. What the epoch does not see (raw
//! `munmap`/`mremap` syscalls, `mmap(MAP_FIXED)` over a buffer, memory
//! glibc's `free` returns by its internal `munmap` and that the program
//! then uses after freeing it) can still fault as before; see
//! docs/preload.md.
//!
//! The decisions (count limits, length rules, map parsing, the cache)
//! live in `nanowire-sockabi` as safe, unit-tested, fuzzed functions; this
//! module only reads the map file and turns checked pointers into slices.

use crate::real;
use libc::{c_int, c_void, iovec, size_t};
use nanowire_sockabi::Errno;
use nanowire_sockabi::iov::{self, Call, Seg};
use nanowire_sockabi::space::{Maps, RangeCache, UserSpace};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

pub use nanowire_sockabi::space::Access;

static EPOCH: AtomicU64 = AtomicU64::new(1);

/// The ranges the last [`LOG`] mapping changes touched: epoch `e`'s at
/// `CHANGES[e % LOG]` (start, end), written before `e` is published.
const LOG: usize = 32;
static CHANGES: [(AtomicUsize, AtomicUsize); LOG] =
    [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; LOG];
/// Serialises the writers of [`CHANGES`] and [`EPOCH`].
static LOG_LOCK: AtomicBool = AtomicBool::new(false);

/// The ranges any thread found (see [`RangeCache`]), behind [`SHARED_BUSY`]
/// (taken with a try: never waited for, also not from a signal handler).
struct Shared(std::cell::UnsafeCell<RangeCache>);
// SAFETY: the cache is only reached through `with_shared`, which holds
// `SHARED_BUSY` for the whole access: one thread at a time.
unsafe impl Sync for Shared {}
static SHARED: Shared = Shared(std::cell::UnsafeCell::new(RangeCache::new()));
static SHARED_BUSY: AtomicBool = AtomicBool::new(false);

fn with_shared<R>(f: impl FnOnce(&mut RangeCache) -> R) -> Option<R> {
    if SHARED_BUSY.swap(true, Ordering::Acquire) {
        return None;
    }
    // SAFETY: `SHARED_BUSY` was clear and is ours until the store below:
    // no other reference to the cache exists meanwhile.
    let r = f(unsafe { &mut *SHARED.0.get() });
    SHARED_BUSY.store(false, Ordering::Release);
    Some(r)
}

/// In a forked child (its one thread, before anything else runs): a lock
/// another thread of the parent held at the fork is nobody's now. The
/// process cache it was changing may be half-written: it starts empty.
pub fn after_fork_child() {
    if SHARED_BUSY.load(Ordering::Acquire) {
        // SAFETY: the child's only thread; the holder is not in this
        // process, and nothing else runs here yet.
        unsafe { *SHARED.0.get() = RangeCache::new() };
        SHARED_BUSY.store(false, Ordering::Release);
    }
    LOG_LOCK.store(false, Ordering::Release);
}

/// Bring `c` from its epoch to `ep`: it forgets what the changes since
/// touched (see [`RangeCache::catch_up`]). Changes older than the log
/// holds leave it as it was (at its old epoch: it misses, and the next
/// insert forgets all). Out of line: the hot paths only compare epochs.
#[cold]
#[inline(never)]
fn sync(c: &mut RangeCache, ep: u64) {
    let ce = c.epoch();
    if ce == 0 || ce >= ep || ep - ce >= LOG as u64 - 1 {
        return;
    }
    let mut changed = [(0usize, 0usize); LOG];
    for (k, slot) in (ce + 1..=ep).zip(changed.iter_mut()) {
        let (s, e) = &CHANGES[(k % LOG as u64) as usize];
        *slot = (s.load(Ordering::Relaxed), e.load(Ordering::Relaxed));
    }
    // The slots read were not rewritten meanwhile (epoch k's slot is
    // rewritten by epoch k + LOG, written before it is published).
    if EPOCH.load(Ordering::Acquire) - ce >= LOG as u64 - 1 {
        return;
    }
    c.catch_up(ep, &changed[..(ep - ce) as usize]);
}

/// The kernel's user-space limit for `access_ok` (found once).
fn space() -> &'static UserSpace {
    static S: std::sync::OnceLock<UserSpace> = std::sync::OnceLock::new();
    S.get_or_init(|| {
        if cfg!(target_arch = "x86_64") {
            let probe = 0u8;
            UserSpace::x86_64_for_stack(&raw const probe as usize)
        } else {
            UserSpace::LINUX_64
        }
    })
}

/// This thread's [`RangeCache`] (`tls`: an initial-exec thread-local, no
/// `__tls_get_addr`); `None` while borrowed already.
#[inline(always)]
fn with_cache<R>(f: impl FnOnce(&mut RangeCache) -> R) -> Option<R> {
    crate::tls::me().with_cache(f)
}

/// The process's mappings changed in `[addr, addr + len)` (munmap,
/// mprotect): the caches forget the ranges that overlap it. A writer that
/// cannot take the log's lock for long (it interrupted its own thread's
/// write, in a signal handler) makes every cache forget everything
/// (the epoch jumps by a whole log, keeping epoch `e`'s slot at `e % LOG`).
pub fn mappings_changed(addr: usize, len: usize) {
    let end = addr.saturating_add(len.max(1)).saturating_add(4095) & !4095;
    let mut spins = 0u32;
    while LOG_LOCK
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        spins += 1;
        if spins > 1 << 16 {
            EPOCH.fetch_add(LOG as u64, Ordering::AcqRel);
            return;
        }
        std::hint::spin_loop();
    }
    let e = EPOCH.load(Ordering::Relaxed) + 1;
    let (s, x) = &CHANGES[(e % LOG as u64) as usize];
    s.store(addr & !4095, Ordering::Relaxed);
    x.store(end, Ordering::Relaxed);
    EPOCH.fetch_add(1, Ordering::Release);
    LOG_LOCK.store(false, Ordering::Release);
}

/// May the shim copy `len` bytes at `base` with access `a` (as the kernel's
/// copy would succeed)? Zero bytes are always fine. Out of line: callers
/// ask only when an [`all_cached`] answer did not hold (a receive's copy).
#[inline(never)]
pub fn ok(base: usize, len: usize, a: Access) -> bool {
    if len == 0 {
        return true;
    }
    let ep = EPOCH.load(Ordering::Acquire);
    let hit = with_cache(|c| {
        if c.epoch() != ep {
            sync(c, ep);
        }
        c.hit(ep, base, len, a)
    })
    .unwrap_or(false);
    hit || slow(ep, base, len, a)
}

/// Are all of `ranges` (base, len) remembered as allowing `a`? One look
/// at the thread's cache for the several ranges of one call (buffer,
/// sockaddr, its length). A miss says nothing: check each with [`ok`], in
/// the order the kernel would. The answer holds while the mappings do not
/// change ([`Seen::still`]), so it may be taken before a wait and used
/// after it.
#[inline(always)]
pub fn all_cached<const N: usize>(ranges: &[(usize, usize); N], a: Access) -> Seen {
    let ep = EPOCH.load(Ordering::Acquire);
    let ok = with_cache(|c| {
        if c.epoch() != ep {
            sync(c, ep);
        }
        c.hit_all(ep, ranges, a)
    })
    .unwrap_or(false);
    Seen { ep, ok }
}

/// What [`all_cached`] found, at which mapping epoch.
#[derive(Clone, Copy)]
pub struct Seen {
    ep: u64,
    ok: bool,
}

impl Seen {
    /// Nothing was seen (check each range with [`ok`]).
    pub const NO: Seen = Seen { ep: 0, ok: false };

    /// Were the ranges found, and has no munmap/mprotect happened since?
    #[inline(always)]
    pub fn still(&self) -> bool {
        self.ok && EPOCH.load(Ordering::Acquire) == self.ep
    }
}

/// `ok` for a pointer.
#[inline]
pub fn ok_ptr<T>(p: *const T, len: usize, a: Access) -> bool {
    ok(p as usize, len, a)
}

#[cold]
#[inline(never)]
fn slow(ep: u64, base: usize, len: usize, a: Access) -> bool {
    if !space().access_ok(base, len) {
        return false;
    }
    // Found by another thread (at this epoch)?
    let found = with_shared(|g| {
        if g.epoch() != ep {
            sync(g, ep);
        }
        g.covering(ep, base, len, a)
    })
    .flatten();
    if let Some((s, e)) = found {
        with_cache(|c| c.insert(ep, s, e, a));
        return true;
    }
    let answer = match query_covering(base, len, a) {
        Some(r) => r,
        None => {
            let Some(text) = read_maps() else {
                // No /proc: the shim cannot tell and copies as it always did.
                return true;
            };
            Maps(&text).covering(base, len, a)
        }
    };
    match answer {
        Some((s, e)) => {
            with_cache(|c| c.insert(ep, s, e, a));
            // Not over a newer epoch's ranges (another thread caught up).
            with_shared(|g| {
                if g.epoch() <= ep {
                    g.insert(ep, s, e, a)
                }
            });
            true
        }
        None => false,
    }
}

/// `struct procmap_query` (linux/fs.h, Linux 6.11): one mapping of the
/// process asked of `/proc/self/maps` with an ioctl.
#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

/// `_IOWR('f', 17, struct procmap_query)`.
const PROCMAP_QUERY: libc::c_ulong = 0xC068_6611;
const PROCMAP_QUERY_VMA_READABLE: u64 = 1;
const PROCMAP_QUERY_VMA_WRITABLE: u64 = 2;
const _: () = assert!(std::mem::size_of::<ProcmapQuery>() == 0x68);

/// The kernel has no PROCMAP_QUERY (older than 6.11): the text is read.
static NO_QUERY: AtomicBool = AtomicBool::new(false);

/// [`Maps::covering`]'s answer from the kernel's mapping queries (a few
/// ioctls on `/proc/self/maps` instead of reading and parsing all of it:
/// a forked child's or a new thread's first buffers cost ~10 µs, not the
/// text of every mapping); `None`: the kernel cannot be asked (the caller
/// reads the text).
fn query_covering(base: usize, len: usize, a: Access) -> Option<Option<(usize, usize)>> {
    use rustix::fs::{Mode, OFlags, open};
    use std::os::fd::AsRawFd;
    if NO_QUERY.load(Ordering::Relaxed) {
        return None;
    }
    let fd = open(
        "/proc/self/maps",
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let mut unsupported = false;
    let mut ask = |at: usize| -> Option<nanowire_sockabi::space::Vma> {
        let mut q = ProcmapQuery {
            size: std::mem::size_of::<ProcmapQuery>() as u64,
            query_addr: at as u64,
            ..Default::default()
        };
        // SAFETY: PROCMAP_QUERY on our own open /proc/self/maps with a
        // zeroed struct of the size it names (no name or build-id buffer:
        // their sizes are 0); the kernel writes only into `q`.
        let r = unsafe { libc::ioctl(fd.as_raw_fd(), PROCMAP_QUERY, &raw mut q) };
        if r != 0 {
            // ENOENT: no mapping there; anything else: not supported.
            unsupported |= crate::sys::errno() != libc::ENOENT;
            return None;
        }
        Some(nanowire_sockabi::space::Vma {
            start: q.vma_start as usize,
            end: q.vma_end as usize,
            read: q.vma_flags & PROCMAP_QUERY_VMA_READABLE != 0,
            write: q.vma_flags & PROCMAP_QUERY_VMA_WRITABLE != 0,
        })
    };
    let r = nanowire_sockabi::space::covering_by(base, len, a, &mut ask);
    if unsupported {
        NO_QUERY.store(true, Ordering::Relaxed);
        return None;
    }
    Some(r)
}

fn read_maps() -> Option<Vec<u8>> {
    use rustix::fs::{Mode, OFlags, open};
    let fd = open(
        "/proc/self/maps",
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let mut buf = Vec::with_capacity(16 << 10);
    loop {
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(buf.capacity());
        }
        let n = rustix::io::read(&fd, buf.spare_capacity_mut())
            .ok()?
            .0
            .len();
        if n == 0 {
            break;
        }
        // SAFETY: `read` initialised the first `n` spare bytes.
        unsafe { buf.set_len(buf.len() + n) };
    }
    Some(buf)
}

/// The caller's iovec array after the kernel's import checks: the count
/// (EMSGSIZE for the msg calls, EINVAL for readv/writev), the array
/// readable (EFAULT), each length non-negative (EINVAL) and each range in
/// user space (EFAULT). Returns the array and its total (clamped like the
/// kernel's). The buffers themselves are checked when bytes are copied
/// ([`bufs_ok`]): the kernel too faults only on the bytes it copies.
pub fn iovecs<'a>(
    iov: *const iovec,
    cnt: usize,
    call: Call,
) -> Result<(&'a [iovec], usize), Errno> {
    iov::check_count(cnt, call)?;
    if cnt == 0 {
        return Ok((&[], 0));
    }
    let bytes = cnt * std::mem::size_of::<iovec>();
    if !ok_ptr(iov, bytes, Access::Read) || !iov.is_aligned() {
        return Err(libc::EFAULT);
    }
    // SAFETY: `cnt` iovecs are mapped readable at `iov` (checked above),
    // aligned, and the caller does not change them during its own call.
    let v = unsafe { std::slice::from_raw_parts(iov, cnt) };
    let total = iov::import(segs(v), space())?;
    Ok((v, total))
}

/// The iovecs as numbers.
pub fn segs(v: &[iovec]) -> impl Iterator<Item = Seg> + Clone + '_ {
    v.iter().map(|x| Seg {
        base: x.iov_base as usize,
        len: x.iov_len,
    })
}

/// Are the bytes that `n` bytes of data would occupy in `v` (in order)
/// all accessible with `a`?
pub fn bufs_ok(v: &[iovec], n: usize, a: Access) -> bool {
    iov::scatter(iov::clamped_lens_of(segs(v)), n).all(|p| ok(v[p.seg].iov_base as usize, p.len, a))
}

/// Copy `data` over the iovecs (as much as fits); returns bytes copied.
/// The caller checked the destinations with [`bufs_ok`].
pub fn scatter(v: &[iovec], data: &[u8]) -> usize {
    let mut n = 0;
    for p in iov::scatter(iov::clamped_lens_of(segs(v)), data.len()) {
        // SAFETY: the segment's first `p.len` bytes are mapped writable
        // (checked by `bufs_ok` for this data length); `data` is ours.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr().add(p.src_off),
                v[p.seg].iov_base.cast::<u8>(),
                p.len,
            )
        };
        n += p.len;
    }
    n
}

/// The caller's receive buffer as a slice, if it is mapped writable
/// (`Some(empty)` for zero bytes).
pub fn buf_mut<'a>(buf: *mut c_void, len: size_t) -> Option<&'a mut [u8]> {
    if len == 0 {
        return Some(&mut []);
    }
    if !ok_ptr(buf, len, Access::Write) {
        return None;
    }
    // SAFETY: `len` bytes at `buf` are mapped writable (checked); the
    // caller lent them to this call.
    Some(unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) })
}

/// The caller's data as a slice, if it is mapped readable.
pub fn buf<'a>(buf: *const c_void, len: size_t) -> Option<&'a [u8]> {
    if len == 0 {
        return Some(&[]);
    }
    if !ok_ptr(buf, len, Access::Read) {
        return None;
    }
    // SAFETY: `len` bytes at `buf` are mapped readable (checked).
    Some(unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) })
}

/// A caller's struct (msghdr, mmsghdr) as a reference, if it is mapped
/// writable (the shim writes lengths and flags back).
pub fn obj_mut<'a, T>(p: *mut T) -> Option<&'a mut T> {
    if p.is_null() || !p.is_aligned() || !ok_ptr(p, std::mem::size_of::<T>(), Access::Write) {
        return None;
    }
    // SAFETY: a mapped, writable, aligned T (checked), lent by the caller.
    Some(unsafe { &mut *p })
}

/// A caller's struct as a shared reference, if it is mapped readable.
pub fn obj<'a, T>(p: *const T) -> Option<&'a T> {
    if p.is_null() || !p.is_aligned() || !ok_ptr(p, std::mem::size_of::<T>(), Access::Read) {
        return None;
    }
    // SAFETY: a mapped, readable, aligned T (checked), lent by the caller.
    Some(unsafe { &*p })
}

/// The `struct timeval` of an option value the kernel just accepted
/// (SO_RCVTIMEO, SO_SNDTIMEO) as nanoseconds; 0 when shorter than one.
pub fn timeval_opt_ns(val: *const c_void, len: libc::socklen_t) -> u64 {
    buf(val, len as usize).map_or(0, nanowire_shimcore::sock::timeval_bytes_ns)
}

/// Set errno and return -1.
pub fn fault<T: From<i8>>(e: Errno) -> T {
    crate::sys::set_errno(e);
    T::from(-1)
}

/// # Safety
/// As libc's `munmap`.
pub unsafe fn munmap(addr: *mut c_void, len: size_t) -> c_int {
    // SAFETY: the caller's own arguments, unchanged, to libc's function.
    let r = unsafe { real::munmap(addr, len) };
    mappings_changed(addr as usize, len);
    r
}

/// # Safety
/// As libc's `mprotect`.
pub unsafe fn mprotect(addr: *mut c_void, len: size_t, prot: c_int) -> c_int {
    // SAFETY: the caller's own arguments, unchanged, to libc's function.
    let r = unsafe { real::mprotect(addr, len, prot) };
    mappings_changed(addr as usize, len);
    r
}
