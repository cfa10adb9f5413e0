//! A UMEM shared by several processes on one (interface, queue): the
//! engine service's half ([`SharedQueue`], [`Member`]) and the layout both
//! halves agree on ([`Geometry`]). The attached process's half is
//! [`crate::xsk::XskSocket::attach_shared`].
//!
//! The kernel gives every socket bound to one (device, queue) with
//! `XDP_SHARED_UMEM` its own RX and TX ring but ONE fill ring and ONE
//! completion ring, each single-producer/single-consumer. Here every
//! process maps both and uses them only under a lock word in shared memory
//! (the "control area", after the UMEM in the same memfd):
//!
//! * **Fill**: a process gives back its received frames itself, in batches
//!   of [`REFILL_BATCH`], under the lock (`try_lock`: a busy lock only
//!   delays the batch, it never blocks the data path). No hop through the
//!   service, no wake-up.
//! * **Completion**: TX frames are split into per-slot ranges
//!   (`tx_per_slot` each). Whoever reaps the completion ring (a process out
//!   of TX frames, under the lock) keeps its own and posts the others'
//!   into their slot's mailbox (a ring in the control area, produced under
//!   the lock, consumed by its slot without it).
//! * **Ownership for kill -9**: a process marks each RX frame it takes off
//!   its RX ring with its slot (`owner[frame]`) before releasing the ring
//!   entry, and clears the mark when it gives the frame back. A refill
//!   batch is journalled (addresses, then the fill producer index it
//!   started from) before the fill ring is written. When a process dies
//!   the service (which keeps every socket it handed out) collects its
//!   frames: those marked with its slot, those still on its RX ring, and,
//!   if it died holding the lock in the middle of a refill that never got
//!   published, its journal. So a killed process gives back exactly its
//!   frames.
//!
//! Sharing a UMEM means reading each other's packets: the service shares
//! one only between processes of one user (or users a policy trusts).

use crate::mmap::Mmap;
use crate::ring::Ring;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

type Desc = libc::xdp_desc;

/// Frames a process gives back to the fill ring at once (one lock turn).
pub const REFILL_BATCH: usize = 32;
/// Most processes (slots) that may share one UMEM.
pub const MAX_SLOTS: u32 = 32;
/// Lock holder id of the service itself.
const SERVICE_ID: u32 = u32::MAX;
const MAGIC: u32 = 0x6e77_7531; // "nwu1"
const PAGE: usize = 4096;
/// Control area: header page, then the owner table, then per-slot areas.
const O_MAGIC: usize = 0;
const O_LOCK: usize = 64;
const OWNER_OFF: usize = PAGE;
/// Per slot: mailbox producer (+0), consumer (+64), journal count (+128),
/// journal start (+132), journal entries (+192, REFILL_BATCH u64s), mailbox
/// entries (+512, tx_per_slot u64s).
const S_MB_PROD: usize = 0;
const S_MB_CONS: usize = 64;
const S_J_N: usize = 128;
const S_J_START: usize = 132;
const S_J_ADDR: usize = 192;
const S_MB: usize = 512;

/// The layout every party of a shared UMEM agrees on (sent by the service
/// with the memfd; validated by the receiver before mapping anything).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// RX frames: the fill ring's depth (power of two).
    pub rx_frames: u32,
    /// TX frames of each slot (power of two).
    pub tx_per_slot: u32,
    /// Slots (processes) the UMEM has room for (power of two).
    pub slots: u32,
    /// Frame size: 2048 or 4096.
    pub frame_size: u32,
}

impl Geometry {
    pub fn validate(&self) -> Result<(), String> {
        let p2 = |n: &str, v: u32, lo: u32, hi: u32| {
            if v.is_power_of_two() && (lo..=hi).contains(&v) {
                Ok(())
            } else {
                Err(format!(
                    "shared UMEM: {n} {v} is not a power of two in {lo}..={hi}"
                ))
            }
        };
        p2("rx frames", self.rx_frames, 128, 1 << 18)?;
        p2("tx frames per slot", self.tx_per_slot, 64, 4096)?;
        p2("slots", self.slots, 1, MAX_SLOTS)?;
        if self.frame_size != 2048 && self.frame_size != 4096 {
            return Err(format!(
                "shared UMEM: frame size {} is not 2048 or 4096",
                self.frame_size
            ));
        }
        Ok(())
    }
    /// TX frames of all slots (the completion ring's depth).
    pub fn tx_frames(&self) -> u32 {
        self.tx_per_slot * self.slots
    }
    /// Depth of each member's RX ring: half the RX frames, so one stalled
    /// process can strand at most half of them on its ring (the kernel
    /// drops for that socket alone once its ring is full).
    pub fn member_rx(&self) -> u32 {
        self.rx_frames / 2
    }
    pub fn umem_len(&self) -> usize {
        (self.rx_frames as usize + self.tx_frames() as usize) * self.frame_size as usize
    }
    fn slot_stride(&self) -> usize {
        (S_MB + 8 * self.tx_per_slot as usize).next_multiple_of(64)
    }
    fn slot_off(&self, slot: u32) -> usize {
        (OWNER_OFF + 4 * self.rx_frames as usize).next_multiple_of(64)
            + slot as usize * self.slot_stride()
    }
    pub fn ctl_len(&self) -> usize {
        self.slot_off(self.slots).next_multiple_of(PAGE)
    }
    /// Bytes of the memfd: UMEM, then the control area.
    pub fn total_len(&self) -> usize {
        self.umem_len() + self.ctl_len()
    }
    /// Frame indices `[lo, hi)` of `slot`'s TX frames.
    pub fn tx_range(&self, slot: u32) -> (u64, u64) {
        let lo = u64::from(self.rx_frames) + u64::from(slot) * u64::from(self.tx_per_slot);
        (lo, lo + u64::from(self.tx_per_slot))
    }
}

/// The control area of a shared UMEM, as one party maps it.
pub(crate) struct Ctl {
    map: Mmap,
    pub(crate) geo: Geometry,
    /// This party's slot (`SERVICE_ID` for the service).
    pub(crate) slot: u32,
    frame_shift: u32,
}

// SAFETY: the mapping is shared memory reached only through atomics (lock,
// owner marks, indices) and the mailbox/journal protocol documented above.
unsafe impl Send for Ctl {}
// SAFETY: as above.
unsafe impl Sync for Ctl {}

/// The lock, released on drop.
pub(crate) struct Held<'a>(&'a Ctl);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.word(O_LOCK).store(0, Ordering::Release);
    }
}

impl Ctl {
    pub(crate) fn map(fd: RawFd, geo: Geometry, slot: u32) -> io::Result<Ctl> {
        let map = Mmap::map(geo.ctl_len(), Some((fd, geo.umem_len() as libc::off_t)))?;
        Ok(Ctl {
            map,
            geo,
            slot,
            frame_shift: geo.frame_size.trailing_zeros(),
        })
    }

    #[inline]
    fn word(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off + 4 <= self.map.len && off.is_multiple_of(4));
        // SAFETY: every offset used is inside the mapping (ctl_len covers the
        // header, the owner table and every slot area) and 4-byte aligned;
        // the mapping lives as long as self.
        unsafe { &*(self.map.ptr.add(off) as *const AtomicU32) }
    }
    #[inline]
    fn u64_at(&self, off: usize) -> *mut u64 {
        assert!(off + 8 <= self.map.len && off.is_multiple_of(8));
        // SAFETY: checked just above to lie inside the mapping, aligned.
        unsafe { self.map.ptr.add(off) as *mut u64 }
    }
    #[inline]
    fn id(&self) -> u32 {
        if self.slot == SERVICE_ID {
            SERVICE_ID
        } else {
            self.slot + 1
        }
    }

    pub(crate) fn try_lock(&self) -> Option<Held<'_>> {
        self.word(O_LOCK)
            .compare_exchange(0, self.id(), Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| Held(self))
    }

    /// Owner mark of the RX frame at `addr` (ignored outside the RX frames).
    #[inline]
    pub(crate) fn mark(&self, addr: u64, mine: bool) {
        let f = (addr >> self.frame_shift) as usize;
        if f < self.geo.rx_frames as usize {
            self.word(OWNER_OFF + 4 * f)
                .store(if mine { self.id() } else { 0 }, Ordering::Relaxed);
        }
    }

    /// Write the refill journal of this party's slot (under the lock).
    pub(crate) fn journal(&self, start: u32, addrs: &[u64]) {
        let base = self.geo.slot_off(self.slot);
        self.word(base + S_J_N).store(0, Ordering::Relaxed);
        for (i, a) in addrs.iter().take(REFILL_BATCH).enumerate() {
            // SAFETY: entry i < REFILL_BATCH of this slot's journal, inside
            // the mapping (u64_at asserts it).
            unsafe { self.u64_at(base + S_J_ADDR + 8 * i).write(*a) };
        }
        self.word(base + S_J_START).store(start, Ordering::Relaxed);
        self.word(base + S_J_N)
            .store(addrs.len().min(REFILL_BATCH) as u32, Ordering::Release);
    }
    pub(crate) fn journal_done(&self) {
        let base = self.geo.slot_off(self.slot);
        self.word(base + S_J_N).store(0, Ordering::Release);
    }

    /// Post a completed TX frame into `slot`'s mailbox (under the lock).
    pub(crate) fn mb_push(&self, slot: u32, addr: u64) -> bool {
        if slot >= self.geo.slots {
            return false;
        }
        let base = self.geo.slot_off(slot);
        let p = self.word(base + S_MB_PROD).load(Ordering::Relaxed);
        let c = self.word(base + S_MB_CONS).load(Ordering::Acquire);
        let t = self.geo.tx_per_slot;
        if p.wrapping_sub(c) >= t {
            return false;
        }
        let i = (p & (t - 1)) as usize;
        // SAFETY: slot < slots, i < tx_per_slot: inside this slot's mailbox.
        unsafe { self.u64_at(base + S_MB + 8 * i).write(addr) };
        self.word(base + S_MB_PROD)
            .store(p.wrapping_add(1), Ordering::Release);
        true
    }

    /// Take this party's mailbox (no lock: single consumer).
    pub(crate) fn mb_drain(&self, mut f: impl FnMut(u64)) -> u32 {
        let base = self.geo.slot_off(self.slot);
        let mut c = self.word(base + S_MB_CONS).load(Ordering::Relaxed);
        let p = self.word(base + S_MB_PROD).load(Ordering::Acquire);
        let t = self.geo.tx_per_slot;
        let n = p.wrapping_sub(c).min(t);
        for _ in 0..n {
            let i = (c & (t - 1)) as usize;
            // SAFETY: i < tx_per_slot: inside this slot's mailbox.
            f(unsafe { self.u64_at(base + S_MB + 8 * i).read() });
            c = c.wrapping_add(1);
        }
        if n > 0 {
            self.word(base + S_MB_CONS).store(c, Ordering::Release);
        }
        n
    }
}

/// The service's half of one (interface, queue): the memfd, the socket that
/// registered the UMEM (it holds the fill and completion rings; it is in no
/// XSKMAP, so it never receives), and the service's view of the rings.
pub struct SharedQueue {
    memfd: OwnedFd,
    owner: OwnedFd,
    umem: Mmap,
    ctl: Ctl,
    fill: Ring<u64>,
    geo: Geometry,
    ifindex: u32,
    queue: u32,
    zero_copy: bool,
    multi_buffer: bool,
}

/// A member socket the service made for one process on one queue, and the
/// service's mapping of its RX ring (to take back what a dead process left
/// on it).
pub struct Member {
    fd: OwnedFd,
    rx: Ring<Desc>,
}

impl AsFd for Member {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for Member {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

fn setsockopt<T>(fd: RawFd, opt: libc::c_int, v: &T) -> io::Result<()> {
    crate::xsk::setsockopt(fd, libc::SOL_XDP, opt, v)
}

pub(crate) fn mmap_offsets(fd: RawFd) -> io::Result<libc::xdp_mmap_offsets> {
    // SAFETY: zeroed offsets struct is valid; getsockopt fills it.
    let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
    // SAFETY: off/len describe a writable buffer of the right size.
    if unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_XDP,
            libc::XDP_MMAP_OFFSETS,
            (&mut off as *mut libc::xdp_mmap_offsets).cast(),
            &mut len,
        )
    } < 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(off)
}

pub(crate) fn map_ring<T: Copy>(
    fd: RawFd,
    o: &libc::xdp_ring_offset,
    n: u32,
    pgoff: u64,
) -> io::Result<Ring<T>> {
    let m = Mmap::map(
        o.desc as usize + n as usize * std::mem::size_of::<T>(),
        Some((fd, pgoff as libc::off_t)),
    )?;
    Ok(Ring::new(m, o, n))
}

fn xsk_socket() -> io::Result<OwnedFd> {
    let raw = crate::sys::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0);
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: raw is a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

pub(crate) fn bind_xsk(
    fd: RawFd,
    ifindex: u32,
    queue: u32,
    flags: u16,
    shared: u32,
) -> io::Result<()> {
    let sa = libc::sockaddr_xdp {
        sxdp_family: libc::AF_XDP as u16,
        sxdp_flags: flags,
        sxdp_ifindex: ifindex,
        sxdp_queue_id: queue,
        sxdp_shared_umem_fd: shared,
    };
    // SAFETY: sa is a valid sockaddr_xdp of the size passed.
    if unsafe {
        crate::sys::bind(
            fd,
            (&sa as *const libc::sockaddr_xdp).cast(),
            std::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
        )
    } < 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl SharedQueue {
    /// Make the memfd UMEM of (ifindex, queue), register it on a socket of
    /// the service's and bind that socket (zero-copy first when asked, then
    /// copy), then give every RX frame to the fill ring.
    pub fn create(
        ifindex: u32,
        queue: u32,
        geo: Geometry,
        try_zero_copy: bool,
        multi_buffer: bool,
    ) -> Result<SharedQueue, String> {
        geo.validate()?;
        let e = |what: &str, e: io::Error| format!("shared UMEM on queue {queue}: {what}: {e}");
        // SAFETY: a NUL-terminated name; the result is checked below.
        let raw = unsafe {
            libc::memfd_create(
                c"nanowire-umem".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if raw < 0 {
            return Err(e("memfd_create", io::Error::last_os_error()));
        }
        // SAFETY: raw is a fresh descriptor we own.
        let memfd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate/fcntl on our own descriptor.
        if unsafe { libc::ftruncate(raw, geo.total_len() as libc::off_t) } < 0 {
            return Err(e("ftruncate", io::Error::last_os_error()));
        }
        // The size is fixed from now on: a receiver's mapping can never
        // fault past the end (SIGBUS) because someone shrank the file.
        // SAFETY: as above.
        unsafe {
            libc::fcntl(
                raw,
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
            )
        };
        let fd = memfd.as_raw_fd();
        let umem = Mmap::map(geo.umem_len(), Some((fd, 0))).map_err(|x| e("mmap UMEM", x))?;
        let ctl = Ctl::map(fd, geo, SERVICE_ID).map_err(|x| e("mmap control area", x))?;
        ctl.word(O_MAGIC).store(MAGIC, Ordering::Release);
        let mut err = None;
        for zc in [true, false] {
            if zc && !try_zero_copy {
                continue;
            }
            match Self::register(&umem, geo, ifindex, queue, zc, multi_buffer) {
                Ok((owner, fill)) => {
                    let mut q = SharedQueue {
                        memfd,
                        owner,
                        umem,
                        ctl,
                        fill,
                        geo,
                        ifindex,
                        queue,
                        zero_copy: zc,
                        multi_buffer,
                    };
                    q.fill_all();
                    return Ok(q);
                }
                Err(x) => err = Some(x),
            }
        }
        let x = err.unwrap_or_else(|| io::Error::from_raw_os_error(libc::EINVAL));
        let hint = match x.raw_os_error() {
            Some(libc::EBUSY) => {
                " (queue busy: another AF_XDP socket or nanowire engine is bound to it)"
            }
            Some(libc::EINVAL) if multi_buffer => {
                " (multi-buffer AF_XDP (XDP_USE_SG) needs kernel 6.6 or later)"
            }
            _ => "",
        };
        Err(format!(
            "AF_XDP bind (shared UMEM) to queue {queue} failed: {x}{hint}"
        ))
    }

    fn register(
        umem: &Mmap,
        geo: Geometry,
        ifindex: u32,
        queue: u32,
        zero_copy: bool,
        multi_buffer: bool,
    ) -> io::Result<(OwnedFd, Ring<u64>)> {
        let fd = xsk_socket()?;
        let raw = fd.as_raw_fd();
        // SAFETY: all-zero is a valid xdp_umem_reg; fields filled below.
        let mut reg: libc::xdp_umem_reg = unsafe { std::mem::zeroed() };
        reg.addr = umem.ptr as u64;
        reg.len = umem.len as u64;
        reg.chunk_size = geo.frame_size;
        reg.headroom = 0;
        setsockopt(raw, libc::XDP_UMEM_REG, &reg)?;
        setsockopt(raw, libc::XDP_UMEM_FILL_RING, &geo.rx_frames)?;
        setsockopt(raw, libc::XDP_UMEM_COMPLETION_RING, &geo.tx_frames())?;
        // A bind needs an RX or TX ring; this socket is in no XSKMAP and
        // never receives.
        let small = 64u32;
        setsockopt(raw, libc::XDP_RX_RING, &small)?;
        let off = mmap_offsets(raw)?;
        let fill = map_ring(raw, &off.fr, geo.rx_frames, libc::XDP_UMEM_PGOFF_FILL_RING)?;
        let flags = libc::XDP_USE_NEED_WAKEUP
            | if multi_buffer {
                crate::xsk::XDP_USE_SG
            } else {
                0
            }
            | if zero_copy {
                libc::XDP_ZEROCOPY
            } else {
                libc::XDP_COPY
            };
        bind_xsk(raw, ifindex, queue, flags, 0)?;
        Ok((fd, fill))
    }

    /// Every RX frame into the fill ring (at creation).
    fn fill_all(&mut self) {
        let fs = u64::from(self.geo.frame_size);
        let n = self.fill.prod_free(self.geo.rx_frames);
        for i in 0..n {
            self.fill.prod_write(i, u64::from(i) * fs);
        }
        self.fill.prod_submit(n);
    }

    pub fn geometry(&self) -> Geometry {
        self.geo
    }
    pub fn queue(&self) -> u32 {
        self.queue
    }
    pub fn zero_copy(&self) -> bool {
        self.zero_copy
    }
    pub fn multi_buffer(&self) -> bool {
        self.multi_buffer
    }
    pub fn memfd(&self) -> BorrowedFd<'_> {
        self.memfd.as_fd()
    }
    /// Bytes of packet memory.
    pub fn umem_bytes(&self) -> usize {
        self.umem.len
    }

    /// A new socket bound to this queue with `XDP_SHARED_UMEM`, for `slot`:
    /// its own RX ring (half the RX frames) and TX ring (the slot's TX
    /// frames). The slot's mailbox and journal start empty.
    pub fn member(&mut self, slot: u32) -> Result<Member, String> {
        if slot >= self.geo.slots {
            return Err(format!("slot {slot} out of range"));
        }
        let e = |what: &str, x: io::Error| {
            format!("AF_XDP member socket on queue {}: {what}: {x}", self.queue)
        };
        let fd = xsk_socket().map_err(|x| e("socket", x))?;
        let raw = fd.as_raw_fd();
        setsockopt(raw, libc::XDP_RX_RING, &self.geo.member_rx()).map_err(|x| e("RX ring", x))?;
        setsockopt(raw, libc::XDP_TX_RING, &self.geo.tx_per_slot).map_err(|x| e("TX ring", x))?;
        let off = mmap_offsets(raw).map_err(|x| e("offsets", x))?;
        let rx = map_ring(
            raw,
            &off.rx,
            self.geo.member_rx(),
            libc::XDP_PGOFF_RX_RING as u64,
        )
        .map_err(|x| e("mmap RX ring", x))?;
        // Flags are the pool's (the kernel refuses any on a shared bind).
        bind_xsk(
            raw,
            self.ifindex,
            self.queue,
            libc::XDP_SHARED_UMEM,
            self.owner.as_raw_fd() as u32,
        )
        .map_err(|x| e("bind", x))?;
        // Copy-mode frames per TX kick, where the kernel has the option.
        for b in [self.geo.tx_per_slot.min(256), 64] {
            if setsockopt(raw, crate::xsk::XDP_MAX_TX_SKB_BUDGET, &b).is_ok() {
                break;
            }
        }
        let base = self.geo.slot_off(slot);
        self.ctl.word(base + S_MB_PROD).store(0, Ordering::Relaxed);
        self.ctl.word(base + S_MB_CONS).store(0, Ordering::Relaxed);
        self.ctl.word(base + S_J_N).store(0, Ordering::Release);
        Ok(Member { fd, rx })
    }

    /// Zero the packet memory (before the UMEM passes to another user).
    pub fn wipe(&mut self) {
        // SAFETY: our own mapping of the UMEM; no member is attached (the
        // caller's rule), so nobody else reads or writes it meanwhile.
        unsafe { std::ptr::write_bytes(self.umem.ptr, 0, self.umem.len) };
    }

    /// Take back every RX frame of the dead process in `slot`: its marks,
    /// what is still on its RX ring (`member`, already out of every XSKMAP)
    /// and an unpublished refill journal. Returns the frames given back to
    /// the fill ring, or `None` when the lock stayed busy (a live process
    /// holds it; retry later).
    pub fn reclaim(&mut self, slot: u32, member: &mut Member) -> Option<u32> {
        let id = slot + 1;
        let lock = self.ctl.word(O_LOCK);
        let t0 = Instant::now();
        loop {
            match lock.compare_exchange(0, SERVICE_ID, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => break,
                // The dead process held it: take it over.
                Err(h) if h == id => {
                    if lock
                        .compare_exchange(h, SERVICE_ID, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                    {
                        break;
                    }
                }
                Err(_) if t0.elapsed() > Duration::from_millis(20) => return None,
                Err(_) => std::thread::yield_now(),
            }
        }
        let geo = self.geo;
        let shift = geo.frame_size.trailing_zeros();
        let mut take = vec![false; geo.rx_frames as usize];
        for (f, t) in take.iter_mut().enumerate() {
            let w = self.ctl.word(OWNER_OFF + 4 * f);
            if w.load(Ordering::Relaxed) == id {
                w.store(0, Ordering::Relaxed);
                *t = true;
            }
        }
        member.rx.resync();
        let n = member.rx.cons_avail(u32::MAX);
        for i in 0..n {
            let f = (member.rx.cons_read(i).addr >> shift) as usize;
            if let Some(t) = take.get_mut(f) {
                *t = true;
            }
        }
        member.rx.cons_release(n);
        self.fill.resync();
        let base = geo.slot_off(slot);
        let jn = self.ctl.word(base + S_J_N).load(Ordering::Acquire) as usize;
        if jn > 0 {
            let start = self.ctl.word(base + S_J_START).load(Ordering::Relaxed);
            // Published means the dead process moved the producer index
            // past the batch: those frames are the kernel's now.
            if self.fill_prod() == start {
                for i in 0..jn.min(REFILL_BATCH) {
                    // SAFETY: journal entry i of this slot, inside the mapping.
                    let a = unsafe { self.ctl.u64_at(base + S_J_ADDR + 8 * i).read() };
                    if let Some(t) = take.get_mut((a >> shift) as usize) {
                        *t = true;
                    }
                }
            }
            self.ctl.word(base + S_J_N).store(0, Ordering::Relaxed);
        }
        let frames: Vec<u64> = take
            .iter()
            .enumerate()
            .filter(|(_, t)| **t)
            .map(|(f, _)| (f as u64) << shift)
            .collect();
        let room = self.fill.prod_free(frames.len() as u32) as usize;
        let n = frames.len().min(room);
        for (i, a) in frames[..n].iter().enumerate() {
            self.fill.prod_write(i as u32, *a);
        }
        self.fill.prod_submit(n as u32);
        lock.store(0, Ordering::Release);
        Some(n as u32)
    }

    fn fill_prod(&self) -> u32 {
        // After resync the cached producer is the shared one.
        self.fill.cached_prod()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memfd(len: usize) -> OwnedFd {
        // SAFETY: a NUL-terminated name; checked below.
        let raw = unsafe { libc::memfd_create(c"nw-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: a fresh descriptor we own; ftruncate on it.
        unsafe {
            assert_eq!(libc::ftruncate(raw, len as libc::off_t), 0);
            OwnedFd::from_raw_fd(raw)
        }
    }

    const GEO: Geometry = Geometry {
        rx_frames: 1024,
        tx_per_slot: 64,
        slots: 4,
        frame_size: 2048,
    };

    #[test]
    fn geometry_is_validated_and_laid_out_without_overlap() {
        assert!(GEO.validate().is_ok());
        assert!(Geometry { slots: 3, ..GEO }.validate().is_err());
        assert!(Geometry { slots: 64, ..GEO }.validate().is_err());
        assert!(
            Geometry {
                frame_size: 1000,
                ..GEO
            }
            .validate()
            .is_err()
        );
        assert!(
            Geometry {
                tx_per_slot: 32,
                ..GEO
            }
            .validate()
            .is_err()
        );
        assert_eq!(GEO.umem_len(), (1024 + 256) * 2048);
        assert!(GEO.slot_off(0) >= OWNER_OFF + 4 * 1024);
        assert!(GEO.slot_off(1) - GEO.slot_off(0) >= S_MB + 8 * 64);
        assert!(GEO.ctl_len() >= GEO.slot_off(4));
        assert_eq!(GEO.tx_range(0), (1024, 1088));
        assert_eq!(GEO.tx_range(3), (1024 + 192, 1024 + 256));
    }

    #[test]
    fn two_parties_share_the_lock_mailboxes_and_marks() {
        let fd = memfd(GEO.total_len());
        let a = Ctl::map(fd.as_raw_fd(), GEO, 0).unwrap();
        let b = Ctl::map(fd.as_raw_fd(), GEO, 1).unwrap();
        // One holder at a time, across mappings.
        let h = a.try_lock().unwrap();
        assert!(b.try_lock().is_none());
        assert!(a.try_lock().is_none(), "not reentrant");
        drop(h);
        let h = b.try_lock().unwrap();
        // a posts b's completed TX frames into b's mailbox (under the lock).
        assert!(a.mb_push(1, 0x1234_0000));
        assert!(a.mb_push(1, 0x1234_0800));
        assert!(!a.mb_push(4, 0), "no slot 4");
        drop(h);
        let mut got = Vec::new();
        assert_eq!(b.mb_drain(|x| got.push(x)), 2);
        assert_eq!(got, vec![0x1234_0000, 0x1234_0800]);
        assert_eq!(b.mb_drain(|_| panic!("empty")), 0);
        // A mailbox never holds more than the slot's frames.
        for i in 0..64 {
            assert!(a.mb_push(1, i));
        }
        assert!(!a.mb_push(1, 99), "full");
        assert_eq!(b.mb_drain(|_| {}), 64);
        // Marks are per frame, by slot; outside the RX frames ignored.
        a.mark(5 * 2048 + 256, true);
        b.mark(6 * 2048 + 256, true);
        a.mark(u64::MAX, true);
        let w = |f: usize| a.word(OWNER_OFF + 4 * f).load(Ordering::Relaxed);
        assert_eq!((w(5), w(6), w(7)), (1, 2, 0));
        a.mark(5 * 2048, false);
        assert_eq!(w(5), 0);
        // The journal of a's slot.
        a.journal(77, &[2048, 4096]);
        let base = GEO.slot_off(0);
        assert_eq!(a.word(base + S_J_N).load(Ordering::Relaxed), 2);
        assert_eq!(a.word(base + S_J_START).load(Ordering::Relaxed), 77);
        a.journal_done();
        assert_eq!(a.word(base + S_J_N).load(Ordering::Relaxed), 0);
    }
}
