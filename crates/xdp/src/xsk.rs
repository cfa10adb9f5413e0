//! AF_XDP sockets: UMEM, the four rings, bind (zero-copy first, then copy).
//!
//! One [`XskSocket`] serves one RX queue and owns its UMEM. Frames
//! `0..rx_frames` start in the fill ring (RX), the rest are TX frames on a
//! free list. RX descriptors point into a frame at an offset (headroom); the
//! frame base is `addr & !(frame_size - 1)` (aligned mode).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};

/// SOL_XDP option raising the frames a copy-mode TX kick may send (6.17+).
pub const XDP_MAX_TX_SKB_BUDGET: libc::c_int = 9;

pub type Desc = libc::xdp_desc;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XskConfig {
    /// RX frames: the depth of the fill and RX rings (power of two).
    pub rx_frames: u32,
    /// TX frames: the depth of the TX and completion rings (power of two).
    pub tx_frames: u32,
    /// UMEM frame size: 2048 or 4096.
    pub frame_size: u32,
    /// Try a zero-copy bind before copy mode.
    pub try_zero_copy: bool,
}

impl Default for XskConfig {
    fn default() -> Self {
        XskConfig {
            rx_frames: 16384,
            tx_frames: 2048,
            frame_size: 2048,
            try_zero_copy: true,
        }
    }
}

impl XskConfig {
    pub fn validate(&self) -> Result<(), String> {
        for (n, v) in [
            ("rx ring depth", self.rx_frames),
            ("tx ring depth", self.tx_frames),
        ] {
            if !v.is_power_of_two() || !(64..=(1 << 20)).contains(&v) {
                return Err(format!(
                    "{n} must be a power of two in 64..=1048576, got {v}"
                ));
            }
        }
        if self.frame_size != 2048 && self.frame_size != 4096 {
            return Err(format!(
                "frame size must be 2048 or 4096, got {}",
                self.frame_size
            ));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindMode {
    ZeroCopy,
    Copy,
}

impl BindMode {
    pub fn as_str(self) -> &'static str {
        match self {
            BindMode::ZeroCopy => "zero-copy",
            BindMode::Copy => "copy",
        }
    }
}

/// The kernel's XDP_STATISTICS for one socket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct XskStats {
    pub rx_dropped: u64,
    pub rx_invalid_descs: u64,
    pub tx_invalid_descs: u64,
    pub rx_ring_full: u64,
    pub rx_fill_ring_empty_descs: u64,
    pub tx_ring_empty_descs: u64,
}

struct Mmap {
    ptr: *mut u8,
    len: usize,
}

impl Mmap {
    fn map(len: usize, fd: Option<(RawFd, libc::off_t)>) -> io::Result<Mmap> {
        let (flags, fd, off) = match fd {
            Some((fd, off)) => (libc::MAP_SHARED | libc::MAP_POPULATE, fd, off),
            None => (
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            ),
        };
        // SAFETY: a fresh mapping; the kernel chooses the address; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                off,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mmap { ptr: p.cast(), len })
    }
}

const HUGE: usize = 2 << 20;

impl Mmap {
    /// Anonymous memory for a UMEM, backed by transparent huge pages when
    /// the kernel gives them (`madvise` mode): the RX frames cycle through
    /// the whole UMEM (the fill ring is FIFO), and with 4 KiB pages nearly
    /// every frame costs a TLB miss. Falls back to plain pages.
    fn map_umem(len: usize) -> io::Result<Mmap> {
        if len < HUGE {
            return Mmap::map(len, None);
        }
        let len = len.next_multiple_of(HUGE);
        let total = len + HUGE;
        // SAFETY: a fresh private anonymous mapping (not populated yet);
        // checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Mmap::map(len, None);
        }
        let base = p as usize;
        let start = base.next_multiple_of(HUGE);
        let head = start - base;
        let tail = total - head - len;
        // SAFETY: head/tail are the unaligned ends of the mapping just made
        // (page multiples, as both base and HUGE are page aligned); the
        // aligned middle [start, start+len) stays mapped and owned by Mmap.
        unsafe {
            if head > 0 {
                libc::munmap(p, head);
            }
            if tail > 0 {
                libc::munmap((start + len) as *mut libc::c_void, tail);
            }
        }
        let m = Mmap {
            ptr: start as *mut u8,
            len,
        };
        // SAFETY: advice and population on our own mapping; failures only
        // mean 4 KiB pages or faults populated below.
        unsafe {
            libc::madvise(m.ptr.cast(), len, libc::MADV_HUGEPAGE);
            if libc::madvise(m.ptr.cast(), len, libc::MADV_POPULATE_WRITE) != 0 {
                // Older kernel: touch every page so the hot path never faults.
                for off in (0..len).step_by(4096) {
                    m.ptr.add(off).write_volatile(0);
                }
            }
        }
        Ok(m)
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: ptr/len describe a mapping we created and unmap once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// A single-producer/single-consumer ring shared with the kernel.
pub struct Ring<T: Copy> {
    prod: *const AtomicU32,
    cons: *const AtomicU32,
    flags: *const AtomicU32,
    descs: *mut T,
    mask: u32,
    size: u32,
    cached_prod: u32,
    cached_cons: u32,
    _map: Mmap,
}

impl<T: Copy> Ring<T> {
    fn new(map: Mmap, off: &libc::xdp_ring_offset, size: u32) -> Ring<T> {
        // SAFETY: offsets come from XDP_MMAP_OFFSETS for this very mapping,
        // which is large enough (desc offset + size * sizeof(T)); the kernel
        // aligns producer/consumer/flags to 4 bytes.
        unsafe {
            let base = map.ptr;
            let prod = base.add(off.producer as usize) as *const AtomicU32;
            let cons = base.add(off.consumer as usize) as *const AtomicU32;
            Ring {
                prod,
                cons,
                flags: base.add(off.flags as usize) as *const AtomicU32,
                descs: base.add(off.desc as usize) as *mut T,
                mask: size - 1,
                size,
                cached_prod: (*prod).load(Ordering::Acquire),
                cached_cons: (*cons).load(Ordering::Acquire),
                _map: map,
            }
        }
    }

    #[inline]
    fn prod_ref(&self) -> &AtomicU32 {
        // SAFETY: the pointer stays valid while the mapping (self._map) lives.
        unsafe { &*self.prod }
    }
    #[inline]
    fn cons_ref(&self) -> &AtomicU32 {
        // SAFETY: as above.
        unsafe { &*self.cons }
    }

    pub fn size(&self) -> u32 {
        self.size
    }

    /// Kernel asks to be woken (XDP_RING_NEED_WAKEUP).
    #[inline]
    pub fn needs_wakeup(&self) -> bool {
        // SAFETY: flags pointer valid while the mapping lives.
        unsafe { (*self.flags).load(Ordering::Relaxed) & libc::XDP_RING_NEED_WAKEUP != 0 }
    }

    // ---- producer side (fill, tx) ----

    /// Free slots, refreshing the consumer index only when needed.
    #[inline]
    pub fn prod_free(&mut self, want: u32) -> u32 {
        let free = self.size - self.cached_prod.wrapping_sub(self.cached_cons);
        if free >= want {
            return free;
        }
        self.cached_cons = self.cons_ref().load(Ordering::Acquire);
        self.size - self.cached_prod.wrapping_sub(self.cached_cons)
    }

    /// Write entry `i` past the producer index (caller checked `prod_free`).
    #[inline]
    pub fn prod_write(&mut self, i: u32, v: T) {
        let idx = self.cached_prod.wrapping_add(i) & self.mask;
        // SAFETY: idx <= mask < size, inside the descriptor array.
        unsafe { self.descs.add(idx as usize).write(v) };
    }

    /// Publish `n` written entries.
    #[inline]
    pub fn prod_submit(&mut self, n: u32) {
        self.cached_prod = self.cached_prod.wrapping_add(n);
        self.prod_ref().store(self.cached_prod, Ordering::Release);
    }

    // ---- consumer side (rx, completion) ----

    /// Entries ready to read (up to `max`).
    #[inline]
    pub fn cons_avail(&mut self, max: u32) -> u32 {
        let mut n = self.cached_prod.wrapping_sub(self.cached_cons);
        if n == 0 {
            self.cached_prod = self.prod_ref().load(Ordering::Acquire);
            n = self.cached_prod.wrapping_sub(self.cached_cons);
        }
        n.min(max)
    }

    #[inline]
    pub fn cons_read(&self, i: u32) -> T {
        let idx = self.cached_cons.wrapping_add(i) & self.mask;
        // SAFETY: idx <= mask < size, inside the descriptor array.
        unsafe { self.descs.add(idx as usize).read() }
    }

    #[inline]
    pub fn cons_release(&mut self, n: u32) {
        self.cached_cons = self.cached_cons.wrapping_add(n);
        self.cons_ref().store(self.cached_cons, Ordering::Release);
    }

    /// Address of entry `idx` (absolute ring index) in the descriptor array.
    #[inline]
    fn slot_ptr(&self, idx: u32) -> *const T {
        // wrapping_add: no dereference here, and idx & mask < size anyway.
        self.descs.wrapping_add((idx & self.mask) as usize)
    }

    /// What the producer last wrote at absolute index `idx` (the slot may
    /// since have been consumed or rewritten: a hint, never a descriptor).
    #[inline]
    fn peek_written(&self, idx: u32) -> T {
        // SAFETY: idx & mask < size, inside the descriptor array; T is Copy.
        unsafe { self.slot_ptr(idx).read_volatile() }
    }

    /// Entries currently queued by the producer and not yet consumed.
    #[inline]
    pub fn occupancy(&self) -> u32 {
        self.prod_ref()
            .load(Ordering::Relaxed)
            .wrapping_sub(self.cons_ref().load(Ordering::Relaxed))
    }
}

/// One AF_XDP socket bound to (interface, queue), with its own UMEM.
pub struct XskSocket {
    // Rings before fd/umem so they are unmapped first.
    pub fill: Ring<u64>,
    pub comp: Ring<u64>,
    pub rx: Ring<Desc>,
    pub tx: Ring<Desc>,
    umem: Mmap,
    fd: OwnedFd,
    cfg: XskConfig,
    mode: BindMode,
    queue: u32,
    tx_free: Vec<u64>,
    tx_budget: Option<u32>,
    fatal: std::sync::atomic::AtomicI32,
    /// Fill-ring index of the frame the kernel most likely fills next: it
    /// takes fill entries in order, so after frame `fill[i]` comes
    /// `fill[i + 1]` (a prediction, resynchronised on every frame).
    fill_next: u32,
    /// Offset of the packet in its frame, as seen on the last RX frame.
    rx_off: u64,
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch<T>(p: *const T) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    // SAFETY: a prefetch never faults, whatever the address.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn prefetch<T>(_p: *const T) {}

// SAFETY: the raw pointers point into mappings owned by this value; nothing
// is shared with other threads except through the kernel's ring protocol.
unsafe impl Send for XskSocket {}

fn setsockopt<T>(fd: RawFd, level: libc::c_int, opt: libc::c_int, v: &T) -> io::Result<()> {
    // SAFETY: v points to a live T of size_of::<T>() bytes.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            (v as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl XskSocket {
    /// Open a socket on (ifindex, queue): zero-copy first, then copy mode.
    pub fn open(
        ifname: &str,
        ifindex: u32,
        queue: u32,
        cfg: XskConfig,
    ) -> Result<XskSocket, String> {
        cfg.validate()?;
        let mut zc_err = None;
        if cfg.try_zero_copy {
            match Self::open_mode(ifindex, queue, cfg, BindMode::ZeroCopy) {
                Ok(s) => return Ok(s),
                Err(e) => zc_err = Some(e),
            }
        }
        Self::open_mode(ifindex, queue, cfg, BindMode::Copy).map_err(|e| {
            let hint = match e.raw_os_error() {
                Some(libc::EINVAL) if queue > 0 => format!(
                    " (does {ifname} have queue {queue}? raise its channels with `ethtool -L {ifname} rx N tx N` / combined N)"
                ),
                Some(libc::EBUSY) => " (queue busy: another AF_XDP socket, e.g. another nanowire engine, is bound to it)".into(),
                Some(libc::EPERM) | Some(libc::EACCES) => {
                    " (AF_XDP needs root or CAP_NET_RAW+CAP_NET_ADMIN)".into()
                }
                Some(libc::EAFNOSUPPORT) => " (kernel without AF_XDP support)".into(),
                _ => String::new(),
            };
            match zc_err {
                Some(z) => format!(
                    "AF_XDP bind to {ifname} queue {queue} failed: copy mode: {e}{hint} (zero-copy: {z})"
                ),
                None => format!("AF_XDP bind to {ifname} queue {queue} failed: {e}{hint}"),
            }
        })
    }

    fn open_mode(
        ifindex: u32,
        queue: u32,
        cfg: XskConfig,
        mode: BindMode,
    ) -> io::Result<XskSocket> {
        // SAFETY: plain socket(2); checked below.
        let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: raw is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let frames = cfg.rx_frames as usize + cfg.tx_frames as usize;
        let umem = Mmap::map_umem(frames * cfg.frame_size as usize)?;
        // SAFETY: all-zero is a valid xdp_umem_reg; we fill the fields below.
        let mut reg: libc::xdp_umem_reg = unsafe { std::mem::zeroed() };
        reg.addr = umem.ptr as u64;
        reg.len = umem.len as u64;
        reg.chunk_size = cfg.frame_size;
        reg.headroom = 0;
        setsockopt(raw, libc::SOL_XDP, libc::XDP_UMEM_REG, &reg)?;
        setsockopt(raw, libc::SOL_XDP, libc::XDP_UMEM_FILL_RING, &cfg.rx_frames)?;
        setsockopt(
            raw,
            libc::SOL_XDP,
            libc::XDP_UMEM_COMPLETION_RING,
            &cfg.tx_frames,
        )?;
        setsockopt(raw, libc::SOL_XDP, libc::XDP_RX_RING, &cfg.rx_frames)?;
        setsockopt(raw, libc::SOL_XDP, libc::XDP_TX_RING, &cfg.tx_frames)?;
        // SAFETY: zeroed offsets struct is valid; getsockopt fills it.
        let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
        // SAFETY: off/len describe a writable buffer of the right size.
        if unsafe {
            libc::getsockopt(
                raw,
                libc::SOL_XDP,
                libc::XDP_MMAP_OFFSETS,
                (&mut off as *mut libc::xdp_mmap_offsets).cast(),
                &mut len,
            )
        } < 0
        {
            return Err(io::Error::last_os_error());
        }
        let map_ring = |o: &libc::xdp_ring_offset, n: u32, sz: usize, pgoff: u64| {
            Mmap::map(
                o.desc as usize + n as usize * sz,
                Some((raw, pgoff as libc::off_t)),
            )
        };
        let u64s = std::mem::size_of::<u64>();
        let descs = std::mem::size_of::<Desc>();
        let fill = Ring::new(
            map_ring(&off.fr, cfg.rx_frames, u64s, libc::XDP_UMEM_PGOFF_FILL_RING)?,
            &off.fr,
            cfg.rx_frames,
        );
        let comp = Ring::new(
            map_ring(
                &off.cr,
                cfg.tx_frames,
                u64s,
                libc::XDP_UMEM_PGOFF_COMPLETION_RING,
            )?,
            &off.cr,
            cfg.tx_frames,
        );
        let rx = Ring::new(
            map_ring(
                &off.rx,
                cfg.rx_frames,
                descs,
                libc::XDP_PGOFF_RX_RING as u64,
            )?,
            &off.rx,
            cfg.rx_frames,
        );
        let tx = Ring::new(
            map_ring(
                &off.tx,
                cfg.tx_frames,
                descs,
                libc::XDP_PGOFF_TX_RING as u64,
            )?,
            &off.tx,
            cfg.tx_frames,
        );
        let fs = u64::from(cfg.frame_size);
        let tx_free = (0..u64::from(cfg.tx_frames))
            .map(|i| (u64::from(cfg.rx_frames) + i) * fs)
            .rev()
            .collect();
        let mut s = XskSocket {
            fill,
            comp,
            rx,
            tx,
            umem,
            fd,
            cfg,
            mode,
            queue,
            tx_free,
            tx_budget: None,
            fatal: std::sync::atomic::AtomicI32::new(0),
            fill_next: 0,
            // Copy mode puts the packet XDP_PACKET_HEADROOM into the frame.
            rx_off: 256,
        };
        // Give every RX frame to the kernel.
        let n = s.fill.prod_free(cfg.rx_frames);
        for i in 0..n {
            s.fill.prod_write(i, u64::from(i) * fs);
        }
        s.fill.prod_submit(n);
        let flags = libc::XDP_USE_NEED_WAKEUP
            | match mode {
                BindMode::ZeroCopy => libc::XDP_ZEROCOPY,
                BindMode::Copy => libc::XDP_COPY,
            };
        let sa = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: flags,
            sxdp_ifindex: ifindex,
            sxdp_queue_id: queue,
            sxdp_shared_umem_fd: 0,
        };
        // SAFETY: sa is a valid sockaddr_xdp of the size passed.
        if unsafe {
            libc::bind(
                raw,
                (&sa as *const libc::sockaddr_xdp).cast(),
                std::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
            )
        } < 0
        {
            return Err(io::Error::last_os_error());
        }
        // Copy mode sends at most 32 frames per kick unless the kernel lets
        // us raise it (6.17+); older kernels answer ENOPROTOOPT/EINVAL.
        for b in [cfg.tx_frames.min(256), 64] {
            if setsockopt(raw, libc::SOL_XDP, XDP_MAX_TX_SKB_BUDGET, &b).is_ok() {
                s.tx_budget = Some(b);
                break;
            }
        }
        Ok(s)
    }

    pub fn mode(&self) -> BindMode {
        self.mode
    }
    pub fn queue(&self) -> u32 {
        self.queue
    }
    pub fn config(&self) -> XskConfig {
        self.cfg
    }
    /// XDP_MAX_TX_SKB_BUDGET in effect, if the kernel supports it.
    pub fn tx_budget(&self) -> Option<u32> {
        self.tx_budget
    }

    /// Base address of the frame holding UMEM address `addr`.
    #[inline]
    pub fn frame_base(&self, addr: u64) -> u64 {
        addr & !(u64::from(self.cfg.frame_size) - 1)
    }

    /// Bytes at UMEM `addr..addr+len`, or `None` when out of bounds (a bad
    /// descriptor; never trust the ring blindly).
    #[inline]
    pub fn data(&self, addr: u64, len: u32) -> Option<&[u8]> {
        let end = addr.checked_add(u64::from(len))?;
        if end > self.umem.len as u64 {
            return None;
        }
        // SAFETY: in bounds of the UMEM mapping; the frame belongs to us (it
        // came off the RX ring and is not in the fill ring) so the kernel does
        // not write it while borrowed.
        Some(unsafe { std::slice::from_raw_parts(self.umem.ptr.add(addr as usize), len as usize) })
    }

    /// Writable frame `addr` (a TX frame we own), `frame_size` bytes.
    #[inline]
    pub fn frame_mut(&mut self, addr: u64) -> &mut [u8] {
        let fs = self.cfg.frame_size as usize;
        let a = (self.frame_base(addr) as usize).min(self.umem.len - fs);
        // SAFETY: a + fs <= umem.len; &mut self guarantees exclusive access
        // and a TX frame off the free list is not owned by the kernel.
        unsafe { std::slice::from_raw_parts_mut(self.umem.ptr.add(a), fs) }
    }

    /// Return RX frames to the kernel; returns how many fitted.
    #[inline]
    pub fn fill(&mut self, addrs: &[u64]) -> usize {
        let n = self
            .fill
            .prod_free(addrs.len() as u32)
            .min(addrs.len() as u32);
        for (i, a) in addrs[..n as usize].iter().enumerate() {
            let b = self.frame_base(*a);
            self.fill.prod_write(i as u32, b);
        }
        if n > 0 {
            self.fill.prod_submit(n);
        }
        n as usize
    }

    /// While waiting for RX: pull in the next RX descriptor slot and the
    /// first two cache lines of the frame the kernel most likely fills next.
    /// The kernel writes both before it publishes the producer index, so a
    /// frame found by the next poll is usually already in this CPU's cache
    /// instead of costing two more cross-CPU misses in a row.
    #[inline]
    pub fn prefetch_rx(&self) {
        prefetch(self.rx.slot_ptr(self.rx.cached_cons));
        let a = self.fill.peek_written(self.fill_next) + self.rx_off;
        if a.saturating_add(128) <= self.umem.len as u64 {
            let p = self.umem.ptr.wrapping_add(a as usize);
            prefetch(p);
            prefetch(p.wrapping_add(64));
        }
    }

    /// Note that the frame at `addr` came off the RX ring (keeps the
    /// prediction of [`XskSocket::prefetch_rx`] in step with the kernel).
    #[inline]
    pub fn rx_taken(&mut self, addr: u64) {
        let base = self.frame_base(addr);
        self.rx_off = addr - base;
        // Usually the predicted slot; after the kernel recycled a frame out
        // of order (e.g. a drop) look a few slots either side.
        for d in [0u32, 1, u32::MAX, 2, u32::MAX - 1, 3, 4, 5, 6, 7, 8] {
            let i = self.fill_next.wrapping_add(d);
            if self.fill.peek_written(i) == base {
                self.fill_next = i.wrapping_add(1);
                return;
            }
        }
    }

    /// Wake the kernel for RX if the fill ring asks for it.
    #[inline]
    pub fn wake_rx_if_needed(&self) {
        if self.fill.needs_wakeup() {
            // SAFETY: zero-length recvfrom on our socket with MSG_DONTWAIT.
            unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    std::ptr::null_mut(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
        }
    }

    /// Reap the completion ring into the TX free list.
    #[inline]
    pub fn reap_completions(&mut self) -> u32 {
        let n = self.comp.cons_avail(u32::MAX);
        for i in 0..n {
            let a = self.comp.cons_read(i);
            let b = self.frame_base(a);
            self.tx_free.push(b);
        }
        if n > 0 {
            self.comp.cons_release(n);
        }
        n
    }

    /// A free TX frame address, reaping completions when the list is empty.
    #[inline]
    pub fn tx_alloc(&mut self) -> Option<u64> {
        if let Some(a) = self.tx_free.pop() {
            return Some(a);
        }
        self.reap_completions();
        self.tx_free.pop()
    }

    /// Put a frame we allocated but did not send back on the free list.
    pub fn tx_unalloc(&mut self, addr: u64) {
        self.tx_free.push(self.frame_base(addr));
    }

    /// Frames on the TX free list.
    pub fn tx_free_count(&self) -> usize {
        self.tx_free.len()
    }

    /// Queue `frames` (addr, len) on the TX ring and kick the kernel if it
    /// needs it. Returns how many were queued (the rest stay the caller's).
    #[inline]
    pub fn transmit(&mut self, frames: &[(u64, u32)]) -> usize {
        let n = self
            .tx
            .prod_free(frames.len() as u32)
            .min(frames.len() as u32);
        for (i, &(addr, len)) in frames[..n as usize].iter().enumerate() {
            self.tx.prod_write(
                i as u32,
                Desc {
                    addr,
                    len,
                    options: 0,
                },
            );
        }
        if n > 0 {
            self.tx.prod_submit(n);
            self.kick_tx_if_needed();
        }
        n as usize
    }

    /// sendto() kick when the TX ring asks for it.
    #[inline]
    pub fn kick_tx_if_needed(&self) {
        if self.tx.needs_wakeup() {
            self.kick_tx();
        }
    }

    /// Kick TX. Transient refusals (EAGAIN, EBUSY, ENOBUFS) are fine: the
    /// frames stay queued for the next kick. Errors that will not go away
    /// (interface down or gone) are returned by [`XskSocket::kick_error`].
    pub fn kick_tx(&self) {
        // SAFETY: zero-length sendto on our socket.
        let r = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null(),
                0,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error().raw_os_error().unwrap_or(0);
            if matches!(e, libc::ENETDOWN | libc::ENXIO | libc::ENODEV) {
                self.fatal.store(e, Ordering::Relaxed);
            }
        }
    }

    /// The last kick error that will not go away by retrying, if any.
    #[inline]
    pub fn kick_error(&self) -> Option<io::Error> {
        // A plain load first: the locked swap only when there is an error.
        if self.fatal.load(Ordering::Relaxed) == 0 {
            return None;
        }
        match self.fatal.swap(0, Ordering::Relaxed) {
            0 => None,
            e => Some(io::Error::from_raw_os_error(e)),
        }
    }

    /// XDP_STATISTICS from the kernel.
    pub fn stats(&self) -> XskStats {
        // SAFETY: zeroed struct is valid; getsockopt fills up to len bytes.
        let mut st: libc::xdp_statistics = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::xdp_statistics>() as libc::socklen_t;
        // SAFETY: st/len describe a writable buffer of the right size.
        let r = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_XDP,
                libc::XDP_STATISTICS,
                (&mut st as *mut libc::xdp_statistics).cast(),
                &mut len,
            )
        };
        if r < 0 {
            return XskStats::default();
        }
        XskStats {
            rx_dropped: st.rx_dropped,
            rx_invalid_descs: st.rx_invalid_descs,
            tx_invalid_descs: st.tx_invalid_descs,
            rx_ring_full: st.rx_ring_full,
            rx_fill_ring_empty_descs: st.rx_fill_ring_empty_descs,
            tx_ring_empty_descs: st.tx_ring_empty_descs,
        }
    }
}

impl AsFd for XskSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for XskSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_is_validated() {
        assert!(XskConfig::default().validate().is_ok());
        let bad = XskConfig {
            rx_frames: 1000,
            ..XskConfig::default()
        };
        assert!(bad.validate().is_err());
        let bad = XskConfig {
            frame_size: 1000,
            ..XskConfig::default()
        };
        assert!(bad.validate().is_err());
    }
}
