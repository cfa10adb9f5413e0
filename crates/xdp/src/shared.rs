//! A UMEM shared by several processes on one (interface, queue): the
//! engine service's half ([`SharedQueue`], [`Member`]) and the layout both
//! halves agree on ([`Geometry`]). The attached process's half is
//! `XskSocket::attach_shared` (xsk.rs); both build on [`crate::ctl`] (the
//! layout and control area) and `sock` (the AF_XDP socket calls).
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
//!   (`tx_per_slot` each). Whoever reaps the completion ring (a process
//!   every [`crate::xsk::HOT_TX_FRAMES`] packets sent or when out of TX
//!   frames, under the lock) keeps its own and posts the others' into their
//!   slot's mailbox (a ring in the control area, produced under the lock,
//!   consumed by its slot without it).
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
//!
//! **Pages**: the RX frames cycle through the whole UMEM (the fill ring is
//! FIFO), so on 4 KiB pages nearly every other frame a process reads is a
//! TLB miss (an own engine's anonymous UMEM is on transparent huge pages).
//! Shared memory gets huge pages from a memfd only where the host's
//! `shmem_enabled` allows it (often `never`); the service therefore puts
//! the UMEM in an unnamed file on a tmpfs of its own, mounted nowhere,
//! with `huge=always` (`sys::huge_tmpfs_file`), and falls back to a sealed
//! memfd where it cannot (no CAP_SYS_ADMIN, an old kernel). Such a file
//! cannot be sealed against truncation, and every member holds a writable
//! descriptor of it; so the control area is a sealed memfd of its own,
//! the service never touches the UMEM through its mapping (it wipes with
//! `pwrite`), and a UMEM whose file changed size is not handed to another
//! user (`wipe`). A member that truncates it hurts only its trust group.

use crate::ctl::{
    Ctl, MAGIC, O_LOCK, O_MAGIC, OWNER_OFF, S_J_ADDR, S_J_N, S_J_START, S_MB_CONS, S_MB_PROD,
    SERVICE_ID,
};
pub use crate::ctl::{Geometry, MAX_SLOTS, REFILL_BATCH};
use crate::mmap::Mmap;
use crate::ring::Ring;
use crate::sock::{bind_xsk, map_ring, mmap_offsets, xsk_socket};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

type Desc = libc::xdp_desc;

fn setsockopt<T>(fd: RawFd, opt: libc::c_int, v: &T) -> io::Result<()> {
    crate::sock::setsockopt(fd, libc::SOL_XDP, opt, v)
}

/// The service's half of one (interface, queue): the memfd, the socket that
/// registered the UMEM (it holds the fill and completion rings; it is in no
/// XSKMAP, so it never receives), and the service's view of the rings.
pub struct SharedQueue {
    /// The UMEM's file (huge tmpfs or memfd) and the control area's memfd.
    umem_fd: OwnedFd,
    ctl_fd: OwnedFd,
    /// Why the UMEM is on 4 KiB pages (`None`: on a huge tmpfs).
    small_pages: Option<String>,
    owner: OwnedFd,
    umem: Mmap,
    ctl: Ctl,
    fill: Ring<u64>,
    /// The completion ring, read by the service only when it gives a slot
    /// to a new process (`member`).
    comp: Ring<u64>,
    geo: Geometry,
    ifindex: u32,
    queue: u32,
    zero_copy: bool,
    multi_buffer: bool,
    /// The UMEM was registered with TX metadata (`TX_METADATA_LEN` bytes
    /// before each transmitted packet): members may ask the kernel to
    /// complete checksums, as an own engine does.
    tx_metadata: bool,
}

/// A member socket the service made for one process on one queue, and the
/// service's mapping of its RX ring (to take back what a dead process left
/// on it).
pub struct Member {
    fd: OwnedFd,
    rx: Ring<Desc>,
}

impl Member {
    /// RX frames on this member's RX ring, not yet taken by its process
    /// (its consumer index is the process's to write: bounded by the
    /// ring's size, never trusted).
    pub fn rx_waiting(&self) -> u32 {
        self.rx.occupancy().min(self.rx.size())
    }
    /// The kernel's XDP_STATISTICS of this member socket (its drops).
    pub fn stats(&self) -> crate::XskStats {
        crate::xsk::xsk_stats(self.fd.as_raw_fd())
    }
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

impl SharedQueue {
    /// Make the UMEM of (ifindex, queue) (on huge pages where the kernel
    /// lets us) and its control area, register the UMEM on a socket of the
    /// service's and bind that socket (zero-copy first when asked, then
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
        let (umem_fd, small_pages) = match crate::sys::huge_tmpfs_file(geo.umem_len()) {
            Ok(f) => (f, None),
            Err(x) => (
                crate::sys::sealed_memfd(c"nanowire-umem", geo.umem_len())
                    .map_err(|x| e("UMEM memfd", x))?,
                Some(format!("no huge tmpfs of its own: {x}")),
            ),
        };
        let ctl_fd = crate::sys::sealed_memfd(c"nanowire-ctl", geo.ctl_len())
            .map_err(|x| e("control memfd", x))?;
        let umem = if small_pages.is_none() {
            Mmap::map_new_shared_huge(geo.umem_len(), umem_fd.as_raw_fd())
        } else {
            Mmap::map(geo.umem_len(), Some((umem_fd.as_raw_fd(), 0)))
        }
        .map_err(|x| e("mmap UMEM", x))?;
        let ctl =
            Ctl::map(ctl_fd.as_raw_fd(), geo, SERVICE_ID).map_err(|x| e("mmap control area", x))?;
        ctl.word(O_MAGIC).store(MAGIC, Ordering::Release);
        let mut err = None;
        for zc in [true, false] {
            if zc && !try_zero_copy {
                continue;
            }
            match Self::register(&umem, geo, ifindex, queue, zc, multi_buffer) {
                Ok((owner, fill, comp, tx_metadata)) => {
                    let mut q = SharedQueue {
                        umem_fd,
                        ctl_fd,
                        small_pages,
                        owner,
                        umem,
                        ctl,
                        fill,
                        comp,
                        geo,
                        ifindex,
                        queue,
                        zero_copy: zc,
                        multi_buffer,
                        tx_metadata,
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
    ) -> io::Result<(OwnedFd, Ring<u64>, Ring<u64>, bool)> {
        let fd = xsk_socket()?;
        let raw = fd.as_raw_fd();
        // SAFETY: all-zero is a valid xdp_umem_reg; fields filled below.
        let mut reg: libc::xdp_umem_reg = unsafe { std::mem::zeroed() };
        reg.addr = umem.ptr as u64;
        reg.len = umem.len as u64;
        reg.chunk_size = geo.frame_size;
        reg.headroom = 0;
        // TX metadata, so that members' packets may ask the kernel for
        // their checksum (copy mode) as an own engine's do; a kernel
        // before 6.11 refuses the flag (EINVAL): registered without.
        reg.flags = libc::XDP_UMEM_TX_METADATA_LEN;
        reg.tx_metadata_len = crate::xsk::TX_METADATA_LEN;
        let tx_metadata = setsockopt(raw, libc::XDP_UMEM_REG, &reg).is_ok();
        if !tx_metadata {
            reg.flags = 0;
            reg.tx_metadata_len = 0;
            setsockopt(raw, libc::XDP_UMEM_REG, &reg)?;
        }
        setsockopt(raw, libc::XDP_UMEM_FILL_RING, &geo.rx_frames)?;
        setsockopt(raw, libc::XDP_UMEM_COMPLETION_RING, &geo.tx_frames())?;
        // A bind needs an RX or TX ring; this socket is in no XSKMAP and
        // never receives.
        let small = 64u32;
        setsockopt(raw, libc::XDP_RX_RING, &small)?;
        let off = mmap_offsets(raw)?;
        let fill = map_ring(raw, &off.fr, geo.rx_frames, libc::XDP_UMEM_PGOFF_FILL_RING)?;
        let comp = map_ring(
            raw,
            &off.cr,
            geo.tx_frames(),
            libc::XDP_UMEM_PGOFF_COMPLETION_RING,
        )?;
        let flags = libc::XDP_USE_NEED_WAKEUP
            | if multi_buffer {
                crate::sock::XDP_USE_SG
            } else {
                0
            }
            | if zero_copy {
                libc::XDP_ZEROCOPY
            } else {
                libc::XDP_COPY
            };
        bind_xsk(raw, ifindex, queue, flags, 0)?;
        Ok((fd, fill, comp, tx_metadata))
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

    /// The spinner registry (`seats.rs`): the CPUs with a spinner or a
    /// sleeper.
    pub fn seats(&self) -> Vec<crate::seats::CpuSeats> {
        crate::seats::view(&self.ctl)
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
    /// The UMEM has TX metadata (see the field).
    pub fn tx_metadata(&self) -> bool {
        self.tx_metadata
    }
    /// The UMEM's file (a member maps it whole).
    pub fn umem_fd(&self) -> BorrowedFd<'_> {
        self.umem_fd.as_fd()
    }
    /// The control area's sealed memfd.
    pub fn ctl_fd(&self) -> BorrowedFd<'_> {
        self.ctl_fd.as_fd()
    }
    /// Why the UMEM is on 4 KiB pages; `None`: on a huge tmpfs.
    pub fn small_pages(&self) -> Option<&str> {
        self.small_pages.as_deref()
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
            if setsockopt(raw, crate::sock::XDP_MAX_TX_SKB_BUDGET, &b).is_ok() {
                break;
            }
        }
        if !self.drain_completions(slot) {
            return Err(format!(
                "queue {}: the shared lock stayed busy (a process holds it)",
                self.queue
            ));
        }
        let base = self.geo.slot_off(slot);
        self.ctl.word(base + S_MB_PROD).store(0, Ordering::Relaxed);
        self.ctl.word(base + S_MB_CONS).store(0, Ordering::Relaxed);
        self.ctl.word(base + S_J_N).store(0, Ordering::Release);
        Ok(Member { fd, rx })
    }

    /// Before `slot` goes to a new process: empty the completion ring
    /// under the lock, posting the other slots' frames to their mailboxes
    /// (as a process reaping it would) and dropping `slot`'s. Those are
    /// completions of the slot's previous process (a process reaps only
    /// when its pool is empty, so up to all its TX frames may still be
    /// there when it exits or dies): routed to the new process they would
    /// be frames it already holds, two sends in one frame. `false` when
    /// the lock stayed busy.
    fn drain_completions(&mut self, slot: u32) -> bool {
        let lock = self.ctl.word(O_LOCK);
        let t0 = Instant::now();
        while lock
            .compare_exchange(0, SERVICE_ID, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            // A holder does a batch in microseconds; longer is a holder
            // preempted (or stopped) inside: wait a little, then refuse.
            if t0.elapsed() > Duration::from_millis(100) {
                return false;
            }
            std::thread::yield_now();
        }
        let shift = self.geo.frame_size.trailing_zeros();
        let (lo, per) = (
            u64::from(self.geo.rx_frames),
            u64::from(self.geo.tx_per_slot),
        );
        self.comp.resync();
        loop {
            let n = self.comp.cons_avail(256);
            if n == 0 {
                break;
            }
            for i in 0..n {
                let f = self.comp.cons_read(i) >> shift;
                let owner = f.checked_sub(lo).map(|x| x / per);
                if let Some(o) = owner.and_then(|o| u32::try_from(o).ok())
                    && o != slot
                {
                    // A slot out of range or a full mailbox: not a frame
                    // of ours to keep (mb_push refuses both).
                    self.ctl.mb_push(o, f << shift);
                }
            }
            self.comp.cons_release(n);
        }
        lock.store(0, Ordering::Release);
        true
    }

    /// The kernel's XDP_STATISTICS of the socket that registered the UMEM:
    /// its `rx_fill_ring_empty_descs` is the queue's (one fill ring for all
    /// members).
    pub fn stats(&self) -> crate::XskStats {
        crate::xsk::xsk_stats(self.owner.as_raw_fd())
    }

    /// RX frames each slot holds now, by slot (`nanowire stats`): the
    /// frames marked with its id (taken off its RX ring, not given back
    /// yet). One pass over the owner table (4 bytes a frame), relaxed
    /// loads: a snapshot, exact only while nobody moves frames.
    pub fn held_by_slot(&self) -> Vec<u32> {
        let mut held = vec![0u32; self.geo.slots as usize];
        for f in 0..self.geo.rx_frames as usize {
            let id = self.ctl.word(OWNER_OFF + 4 * f).load(Ordering::Relaxed);
            if let Some(h) = id.checked_sub(1).and_then(|s| held.get_mut(s as usize)) {
                *h += 1;
            }
        }
        held
    }

    /// Zero the packet memory (before the UMEM passes to another user),
    /// through the file (`pwrite`), never the mapping: a UMEM file on the
    /// huge tmpfs has no seals, and a process that kept its descriptor may
    /// have truncated it (a store through the mapping would then be a
    /// SIGBUS in the service). A file whose size changed is refused: its
    /// pages are no longer those the kernel writes packets into.
    pub fn wipe(&mut self) -> Result<(), String> {
        let fd = self.umem_fd.as_raw_fd();
        // SAFETY: zeroed stat is valid; fstat fills it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: our descriptor and a writable stat.
        if unsafe { libc::fstat(fd, &mut st) } < 0 || st.st_size as u64 != self.umem.len as u64 {
            return Err(format!(
                "the shared UMEM of queue {} was resized by a process that held it (size {}, made {}): \
                 restart the engine service",
                self.queue, st.st_size, self.umem.len
            ));
        }
        let zeros = vec![0u8; 1 << 20];
        let mut off = 0;
        while off < self.umem.len {
            let n = zeros.len().min(self.umem.len - off);
            // SAFETY: `zeros` is readable for n bytes; our own descriptor.
            let w = unsafe { libc::pwrite(fd, zeros.as_ptr().cast(), n, off as libc::off_t) };
            if w <= 0 {
                return Err(format!(
                    "wiping the shared UMEM of queue {}: {}",
                    self.queue,
                    io::Error::last_os_error()
                ));
            }
            off += w as usize;
        }
        Ok(())
    }

    /// Take back every RX frame of the dead process in `slot`: its marks,
    /// what is still on its RX ring (`member`, already out of every XSKMAP)
    /// and an unpublished refill journal. Returns the frames given back to
    /// the fill ring and whether the dead process held the lock (taken
    /// over), or `None` when the lock stayed busy (a live process holds it;
    /// retry later).
    pub fn reclaim(&mut self, slot: u32, member: &mut Member) -> Option<(u32, bool)> {
        // Its spinner seat and sleeper marks first (no lock: their own
        // atomics), so the members sharing its CPUs never yield to it again.
        crate::seats::clear_slot(&self.ctl, slot);
        let id = slot + 1;
        let lock = self.ctl.word(O_LOCK);
        let t0 = Instant::now();
        let mut took_over = false;
        loop {
            match lock.compare_exchange(0, SERVICE_ID, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => break,
                // The dead process held it: take it over.
                Err(h) if h == id => {
                    if lock
                        .compare_exchange(h, SERVICE_ID, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                    {
                        took_over = true;
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
        Some((n as u32, took_over))
    }

    fn fill_prod(&self) -> u32 {
        // After resync the cached producer is the shared one.
        self.fill.cached_prod()
    }
}
