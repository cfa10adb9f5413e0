//! AF_XDP sockets: bind (zero-copy first, then copy), and the two halves
//! the engine drives from different locks:
//!
//! * [`XskRx`]: the fill and RX rings. [`XskRx::poll`] hands out owned
//!   [`RxFrame`]s; frames come back through the UMEM's recycle list and are
//!   refilled inside the poll loop.
//! * [`XskTx`]: the TX and completion rings and the TX frame pool.
//!   [`XskTx::send_with`] lends frames from the pool to a closure that
//!   writes the packet; frames never leave the pool otherwise.
//!
//! The rings themselves are private to this crate. A descriptor the kernel
//! hands us that does not lie inside one of our frames is a counted drop
//! ([`XskRx::bad_descs`], [`XskTx::bad_descs`]), never clamped or trusted.

use crate::ctl::{Ctl, Geometry, REFILL_BATCH};
use crate::ring::Ring;
pub use crate::sock::{XDP_MAX_TX_SKB_BUDGET, XDP_USE_SG};
use crate::sock::{bind_xsk, map_ring, mmap_offsets, setsockopt};
use crate::umem::{Minter, RxFrame, UmemArea, UmemInfo, UmemShared};
use nanowire_probe::{self as probe, Mark};
use nanowire_wire::checksum;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Descriptor option: the packet continues in the next descriptor.
pub const XDP_PKT_CONTD: u32 = 1;
/// Bytes of TX metadata before each transmitted packet when the UMEM has
/// them (`struct xsk_tx_metadata`: flags, then the request: csum_start,
/// csum_offset and, from 6.15, launch_time). Every TX descriptor then
/// starts this far into its frame (the kernel reads the metadata right
/// before the packet and refuses a descriptor without room for it).
pub const TX_METADATA_LEN: u32 = 24;
/// Largest packet the engine gathers from several buffers: a 64 KiB IP
/// packet (the largest a TSO/GSO/GRO super-frame is without BIG TCP) and its
/// Ethernet header, with room for a VLAN tag.
pub const MAX_MULTI_BUFFER_PACKET: usize = 65535 + 18;
/// Most descriptors one packet may span: 64 KiB in copy mode's 1792-byte
/// pieces (2 KiB frames less the kernel's 256-byte headroom) is 37; a
/// longer chain is a counted drop.
pub const MAX_CHAIN_FRAMES: u32 = 48;

type Desc = libc::xdp_desc;

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
    /// Bind with XDP_USE_SG: packets larger than a frame arrive (and may be
    /// sent) in several descriptors.
    pub multi_buffer: bool,
    /// Register the UMEM with room for AF_XDP TX metadata (6.11+'s
    /// `XDP_UMEM_TX_METADATA_LEN`), so that transmitted packets may ask
    /// for checksum offload ([`XskTx::csum_offload`]); a kernel without
    /// it binds without.
    pub tx_metadata: bool,
}

impl Default for XskConfig {
    fn default() -> Self {
        XskConfig {
            rx_frames: 16384,
            tx_frames: 512,
            frame_size: 2048,
            try_zero_copy: true,
            multi_buffer: false,
            tx_metadata: false,
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

pub(crate) fn xsk_stats(fd: RawFd) -> XskStats {
    // SAFETY: zeroed struct is valid; getsockopt fills up to len bytes.
    let mut st: libc::xdp_statistics = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::xdp_statistics>() as libc::socklen_t;
    // SAFETY: st/len describe a writable buffer of the right size.
    let r = unsafe {
        libc::getsockopt(
            fd,
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

/// How many cache lines of the predicted next frame a waiter prefetches:
/// as many as the last frame taken on the ring filled, from two (the
/// headers) to four. A ping-pong's frames are alike: a UDP datagram of 64
/// bytes ends at byte 106 (two lines), a TCP segment's at 130 (its headers
/// with timestamps are 66 bytes: three lines). With two lines always, the
/// copy of a TCP ping-pong's payload into the reader's buffer paid a
/// cross-CPU miss on every segment (the kernel writes the frame on the
/// sender's CPU): ~80 ns of the receive (`scripts/probe.py --serial
/// --tcp`, session 37). Larger frames are left to the copy's own
/// prefetching (a waiter's look runs millions of times a second).
const FRAME_LINES: std::ops::RangeInclusive<usize> = 2..=4;

/// The lines of [`FRAME_LINES`] a frame of `len` bytes fills.
#[inline]
fn frame_lines(len: u32) -> usize {
    (len as usize)
        .div_ceil(64)
        .clamp(*FRAME_LINES.start(), *FRAME_LINES.end())
}

/// Prefetch `lines` cache lines at `p` (a frame's start, cache-line
/// aligned: `rx_off` is the kernel's 256-byte headroom).
#[inline(always)]
fn prefetch_frame(p: *const u8, lines: usize) {
    for i in 0..lines {
        prefetch(p.wrapping_add(i * 64));
    }
}

/// What one [`XskRx::poll`] did.
#[derive(Debug, Clone, Copy, Default)]
pub struct PollInfo {
    /// Descriptors taken off the RX ring.
    pub descs: u32,
    /// Largest RX ring occupancy seen.
    pub ring_peak: u32,
}

/// The receive half: fill and RX rings.
pub struct XskRx {
    fill: Ring<u64>,
    rx: Ring<Desc>,
    umem: Arc<UmemShared>,
    /// Makes the frames taken off the RX ring (their UMEM references).
    minter: Minter,
    fd: Arc<OwnedFd>,
    /// Frames waiting to go back into the fill ring.
    to_fill: Vec<u64>,
    bad_descs: u64,
    /// The multi-buffer packet being gathered.
    chain: Chain,
    /// Fill-ring index of the frame the kernel most likely fills next: it
    /// takes fill entries in order, so after frame `fill[i]` comes
    /// `fill[i + 1]` (a prediction, resynchronised on every frame).
    fill_next: u32,
    /// Offset of the packet in its frame, as seen on the last RX frame.
    rx_off: u64,
    /// The cache lines the last RX frame filled ([`frame_lines`]): what a
    /// waiter prefetches of the next.
    frame_lines: usize,
    /// A UMEM shared with other processes (shared.rs): the fill ring
    /// is used under the shared lock, frames are marked while ours.
    shared: Option<Arc<Ctl>>,
    /// Frames waiting in `to_fill` worth a `refill_now`: 1, or a whole
    /// [`REFILL_BATCH`] on a shared UMEM.
    fill_min: usize,
    /// [`XskRx::prefetch`]'s prediction, for lock-free waiters.
    next: Arc<NextRx>,
}

/// Where the next packet most likely lands, as [`XskRx::prefetch`] last
/// predicted it (addresses inside the RX ring's, the UMEM's and the fill
/// ring's mappings; 0: no prediction): published for waiters that do not
/// take the RX lock ([`RxPeek::prefetch`]). Written by the RX half's owner
/// only.
#[derive(Default)]
struct NextRx {
    slot: AtomicUsize,
    frame: AtomicUsize,
    /// The fill ring entry the prediction was read from, which the poll
    /// that takes the packet reads again (`XskRx::rx_taken`).
    fill: AtomicUsize,
    /// How many lines of the frame to prefetch ([`frame_lines`] of the
    /// last frame taken; 0 before the first: the least).
    lines: AtomicUsize,
}

/// A look at an RX ring from any thread, without the [`XskRx`] (which sits
/// behind its owner's lock): are there descriptors its owner has not taken
/// yet, frames to give back, and where will the next packet land? Keeps
/// the ring's and the UMEM's mappings alive.
pub struct RxPeek {
    ring: crate::ring::RingPeek,
    next: Arc<NextRx>,
    umem: Arc<UmemShared>,
}

impl RxPeek {
    /// Descriptors published by the kernel and not yet taken by a poll.
    #[inline]
    pub fn pending(&self) -> bool {
        let p = self.ring.pending();
        if p {
            probe::seen();
        }
        p
    }

    /// Frames dropped by their last owner wait to go back to the fill
    /// ring (the next poll's refill puts them there).
    #[inline]
    pub fn refill_due(&self) -> bool {
        self.umem.recycled_any.load(Ordering::Relaxed)
    }

    /// What a poll of an empty ring does to receive latency
    /// ([`XskRx::prefetch`]), for a waiter that looked without the lock:
    /// pull in the next RX descriptor slot and the first two cache lines of
    /// the predicted next frame, so that the packet the kernel writes there
    /// (on the sender's CPU, before it publishes the producer index) is
    /// read by the poll that finds it without three cross-CPU misses one
    /// after the other; and the fill ring entry the prediction came from,
    /// which that poll reads to keep the prediction in step
    /// (`XskRx::rx_taken`). The kernel reads that entry on the sender's CPU
    /// when it takes the frame; a poll that read it while waiting (an empty
    /// poll's prediction does) shares the line and reads it again from its
    /// own cache, but a waiter that only looked had let it go a ring's lap
    /// ago: a cross-CPU miss between the packet's arrival and its delivery
    /// on every segment of a TCP ping-pong (whose waits look, session 36:
    /// ~60-70 ns of the ~90 ns the take of a frame cost, against ~20 ns
    /// with the entry prefetched).
    #[inline]
    pub fn prefetch(&self) {
        let slot = self.next.slot.load(Ordering::Relaxed);
        if slot != 0 {
            prefetch(slot as *const u8);
        }
        let frame = self.next.frame.load(Ordering::Relaxed);
        if frame != 0 {
            let lines = self.next.lines.load(Ordering::Relaxed);
            prefetch_frame(frame as *const u8, lines.max(*FRAME_LINES.start()));
        }
        // A prefetch never faults: an entry of a fill ring unmapped since
        // (its socket closed) costs nothing.
        let fill = self.next.fill.load(Ordering::Relaxed);
        if fill != 0 {
            prefetch(fill as *const u8);
        }
    }
}

/// Attempts of one [`XskTx::kick`] while the kernel refuses for now.
const KICK_TRIES: u32 = 64;

/// Shared UMEM: a process reaps the completion ring once this many frames
/// went out since its last reap (not only once its pool is empty), so it
/// keeps sending from the same few frames, the most recently completed
/// first, as an own engine (which reaps after every kick) sends from one.
/// Rotating through all of a slot's frames instead cost a cache miss on
/// each line of every packet's frame (256 frames 2 KiB apart fall into a
/// few L1 sets). Not 1: each reap takes the shared lock, a line every
/// process of the UMEM writes.
pub const HOT_TX_FRAMES: u32 = 8;

/// The transmit half: TX and completion rings, TX frame pool.
pub struct XskTx {
    tx: Ring<Desc>,
    comp: Ring<u64>,
    umem: Arc<UmemShared>,
    fd: Arc<OwnedFd>,
    free: Vec<u64>,
    budget: Option<u32>,
    fatal: i32,
    /// Kicks tried again after a transient refusal.
    kick_retries: u64,
    /// Packets the kernel took off the TX ring and completed without
    /// sending them (a kick answered EBUSY: see [`XskTx::kernel_dropped`]).
    kernel_dropped: u64,
    bad_descs: u64,
    multi_buffer: bool,
    /// A UMEM shared with other processes: the completion ring is reaped
    /// under the shared lock and other slots' frames go to their mailboxes.
    shared: Option<Arc<Ctl>>,
    /// Frame indices `[lo, hi)` of our TX frames.
    tx_range: (u64, u64),
    /// TX metadata bytes before each packet (0: the UMEM has none).
    meta: u32,
    /// Packets may ask for checksum offload through their metadata.
    csum_offload: bool,
    /// Shared UMEM: frames taken from the pool since the completion ring
    /// was last reaped (`reap_shared` reaps at [`HOT_TX_FRAMES`]).
    since_reap: u32,
}

/// Where a transmitted packet's transport checksum is to be completed
/// (AF_XDP TX metadata's `XDP_TXMD_FLAGS_CHECKSUM`, as an skb's
/// CHECKSUM_PARTIAL): the sum from `start` to the end of the packet is
/// folded into the 16 bits at `start + offset`, which hold the
/// pseudo-header's sum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CsumRequest {
    pub start: u16,
    pub offset: u16,
}

/// One AF_XDP socket bound to (interface, queue), with its own UMEM.
pub struct XskSocket {
    rx: XskRx,
    tx: XskTx,
    cfg: XskConfig,
    mode: BindMode,
    queue: u32,
}

impl XskSocket {
    /// Open a socket on (ifindex, queue): zero-copy first, then copy mode.
    pub fn open(
        ifname: &str,
        ifindex: u32,
        queue: u32,
        cfg: XskConfig,
    ) -> Result<XskSocket, String> {
        Self::open_in(ifname, ifindex, queue, cfg, None)
    }

    /// [`XskSocket::open`] on UMEM memory mapped before (`area`, used if its
    /// geometry is `cfg`'s; the first bind attempt takes it).
    pub fn open_in(
        ifname: &str,
        ifindex: u32,
        queue: u32,
        cfg: XskConfig,
        mut area: Option<UmemArea>,
    ) -> Result<XskSocket, String> {
        cfg.validate()?;
        area = area.filter(|a| {
            (a.rx_frames, a.tx_frames, a.frame_size)
                == (cfg.rx_frames, cfg.tx_frames, cfg.frame_size)
        });
        let mut zc_err = None;
        if cfg.try_zero_copy {
            match Self::open_mode(ifindex, queue, cfg, BindMode::ZeroCopy, area.take()) {
                Ok(s) => return Ok(s),
                Err(e) => zc_err = Some(e),
            }
        }
        Self::open_mode(ifindex, queue, cfg, BindMode::Copy, area).map_err(|e| {
            let hint = match e.raw_os_error() {
                Some(libc::EINVAL) if queue > 0 => format!(
                    " (does {ifname} have queue {queue}? raise its channels with `ethtool -L {ifname} rx N tx N` / combined N)"
                ),
                Some(libc::EINVAL) if cfg.multi_buffer => {
                    " (multi-buffer AF_XDP (XDP_USE_SG) needs kernel 6.6 or later)".into()
                }
                Some(libc::EBUSY) => " (queue busy: another AF_XDP socket, e.g. another nanowire engine, is bound to it; the kernel frees the queue of a process that just exited a moment after it is gone)".into(),
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
        area: Option<UmemArea>,
    ) -> io::Result<XskSocket> {
        let raw = crate::sys::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0);
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: raw is a fresh descriptor we own. Kept for the engine's
        // life: above the program's numbers.
        let fd = crate::sys::above_floor(unsafe { OwnedFd::from_raw_fd(raw) });
        let raw = fd.as_raw_fd();
        let umem = Arc::new(match area {
            Some(a) => UmemShared::on(a),
            None => UmemShared::new(cfg.rx_frames, cfg.tx_frames, cfg.frame_size)?,
        });
        // SAFETY: all-zero is a valid xdp_umem_reg; we fill the fields below.
        let mut reg: libc::xdp_umem_reg = unsafe { std::mem::zeroed() };
        reg.addr = umem.map.ptr as u64;
        reg.len = umem.map.len as u64;
        reg.chunk_size = cfg.frame_size;
        reg.headroom = 0;
        let mut meta = 0;
        if cfg.tx_metadata {
            reg.flags = libc::XDP_UMEM_TX_METADATA_LEN;
            reg.tx_metadata_len = TX_METADATA_LEN;
            match setsockopt(raw, libc::SOL_XDP, libc::XDP_UMEM_REG, &reg) {
                Ok(()) => meta = TX_METADATA_LEN,
                // A kernel before 6.11 knows no such flag (EINVAL): the
                // registration failed whole, so it is made again without.
                Err(_) => {
                    reg.flags = 0;
                    reg.tx_metadata_len = 0;
                }
            }
        }
        if meta == 0 {
            setsockopt(raw, libc::SOL_XDP, libc::XDP_UMEM_REG, &reg)?;
        }
        setsockopt(raw, libc::SOL_XDP, libc::XDP_UMEM_FILL_RING, &cfg.rx_frames)?;
        setsockopt(
            raw,
            libc::SOL_XDP,
            libc::XDP_UMEM_COMPLETION_RING,
            &cfg.tx_frames,
        )?;
        setsockopt(raw, libc::SOL_XDP, libc::XDP_RX_RING, &cfg.rx_frames)?;
        setsockopt(raw, libc::SOL_XDP, libc::XDP_TX_RING, &cfg.tx_frames)?;
        let off = mmap_offsets(raw)?;
        let mut fill = map_ring(raw, &off.fr, cfg.rx_frames, libc::XDP_UMEM_PGOFF_FILL_RING)?;
        let comp = map_ring(
            raw,
            &off.cr,
            cfg.tx_frames,
            libc::XDP_UMEM_PGOFF_COMPLETION_RING,
        )?;
        let rx = map_ring(raw, &off.rx, cfg.rx_frames, libc::XDP_PGOFF_RX_RING as u64)?;
        let tx = map_ring(raw, &off.tx, cfg.tx_frames, libc::XDP_PGOFF_TX_RING as u64)?;
        let fs = u64::from(cfg.frame_size);
        // Give every RX frame to the kernel.
        let n = fill.prod_free(cfg.rx_frames);
        for i in 0..n {
            fill.prod_write(i, u64::from(i) * fs);
        }
        fill.prod_submit(n);
        let flags = libc::XDP_USE_NEED_WAKEUP
            | if cfg.multi_buffer { XDP_USE_SG } else { 0 }
            | match mode {
                BindMode::ZeroCopy => libc::XDP_ZEROCOPY,
                BindMode::Copy => libc::XDP_COPY,
            };
        bind_xsk(raw, ifindex, queue, flags, 0)?;
        // Copy mode sends at most 32 frames per kick unless the kernel lets
        // us raise it (6.17+); older kernels answer ENOPROTOOPT/EINVAL.
        let mut budget = None;
        for b in [cfg.tx_frames.min(256), 64] {
            if setsockopt(raw, libc::SOL_XDP, XDP_MAX_TX_SKB_BUDGET, &b).is_ok() {
                budget = Some(b);
                break;
            }
        }
        let free = (0..u64::from(cfg.tx_frames))
            .map(|i| (u64::from(cfg.rx_frames) + i) * fs)
            .rev()
            .collect();
        let tx_range = (
            u64::from(cfg.rx_frames),
            u64::from(cfg.rx_frames) + u64::from(cfg.tx_frames),
        );
        Ok(Self::from_parts(
            [fill, comp],
            rx,
            tx,
            umem,
            Arc::new(fd),
            free,
            (budget, meta, true),
            (None, tx_range),
            cfg,
            mode,
            queue,
        ))
    }

    /// The two halves around their rings: `fill_comp` = [fill, completion],
    /// `tx` = (the copy-mode TX budget set, TX metadata bytes per frame,
    /// whether packets may ask the kernel for their checksum through it),
    /// `shared` = (a shared UMEM's control area, our TX frame range).
    #[allow(clippy::too_many_arguments)]
    fn from_parts(
        fill_comp: [Ring<u64>; 2],
        rx: Ring<Desc>,
        tx: Ring<Desc>,
        umem: Arc<UmemShared>,
        fd: Arc<OwnedFd>,
        free: Vec<u64>,
        (budget, meta, csum): (Option<u32>, u32, bool),
        shared: (Option<Arc<Ctl>>, (u64, u64)),
        cfg: XskConfig,
        mode: BindMode,
        queue: u32,
    ) -> XskSocket {
        let [fill, comp] = fill_comp;
        XskSocket {
            rx: XskRx {
                fill,
                rx,
                minter: Minter::new(&umem),
                umem: umem.clone(),
                fd: fd.clone(),
                to_fill: Vec::with_capacity(cfg.rx_frames as usize),
                bad_descs: 0,
                chain: Chain::default(),
                fill_next: 0,
                // Copy mode puts the packet XDP_PACKET_HEADROOM into the frame.
                rx_off: 256,
                frame_lines: *FRAME_LINES.start(),
                fill_min: if shared.0.is_some() { REFILL_BATCH } else { 1 },
                shared: shared.0.clone(),
                next: Arc::default(),
            },
            tx: XskTx {
                tx,
                comp,
                umem,
                fd,
                free,
                budget,
                fatal: 0,
                kick_retries: 0,
                kernel_dropped: 0,
                bad_descs: 0,
                multi_buffer: cfg.multi_buffer,
                shared: shared.0,
                tx_range: shared.1,
                meta,
                // In copy mode the kernel builds an skb per packet and marks
                // it CHECKSUM_PARTIAL: the device's offload or the stack's
                // software fallback (skb_checksum_help) completes it, on
                // every device. A zero-copy driver honours the request only
                // if it offers it (netdev `xsk-features` tx-checksum), which
                // is not probed: software checksums there.
                csum_offload: csum && meta > 0 && mode == BindMode::Copy,
                since_reap: 0,
            },
            cfg,
            mode,
            queue,
        }
    }

    /// The attached process's half of a shared UMEM (shared.rs): `xsk`
    /// is the member socket the engine service made and bound for `slot`,
    /// `umem` the UMEM's file (on huge pages where the service could),
    /// `ctl` the control area's memfd. Maps the UMEM, the control area,
    /// the member's RX and TX rings and the pool's fill and completion rings
    /// (mapping a received socket's rings needs no capability).
    /// `tx_metadata`: the service registered the UMEM with
    /// [`TX_METADATA_LEN`] bytes of TX metadata (every member then writes
    /// its packets after them: the kernel checks descriptors against the
    /// pool's layout); `csum_offload`: this process lets the kernel
    /// complete checksums through it (the options table's
    /// `tx_csum_offload`).
    #[allow(clippy::too_many_arguments)]
    pub fn attach_shared(
        (umem_fd, ctl_fd): (OwnedFd, OwnedFd),
        xsk: OwnedFd,
        geo: Geometry,
        slot: u32,
        queue: u32,
        mode: BindMode,
        multi_buffer: bool,
        (budget, tx_metadata, csum_offload): (Option<u32>, bool, bool),
    ) -> Result<XskSocket, String> {
        geo.validate()?;
        if slot >= geo.slots {
            return Err(format!("shared UMEM: slot {slot} of {}", geo.slots));
        }
        let e = |what: &str, x: io::Error| format!("shared UMEM on queue {queue}: {what}: {x}");
        for (fd, what, need) in [
            (&umem_fd, "UMEM file", geo.umem_len()),
            (&ctl_fd, "control memfd", geo.ctl_len()),
        ] {
            // SAFETY: zeroed stat is valid; fstat fills it.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: our descriptor and a writable stat.
            if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
                return Err(e("fstat", io::Error::last_os_error()));
            }
            if (st.st_size as u64) < need as u64 {
                return Err(format!(
                    "shared UMEM on queue {queue}: {what} of {} bytes, the layout needs {need}",
                    st.st_size
                ));
            }
        }
        let map = crate::mmap::Mmap::map(geo.umem_len(), Some((umem_fd.as_raw_fd(), 0)))
            .map_err(|x| e("mmap UMEM", x))?;
        let umem = Arc::new(UmemShared::from_map(
            map,
            geo.rx_frames,
            geo.tx_frames(),
            geo.frame_size,
        ));
        let ctl = Arc::new(
            Ctl::map(ctl_fd.as_raw_fd(), geo, slot).map_err(|x| e("mmap control area", x))?,
        );
        drop((umem_fd, ctl_fd));
        let raw = xsk.as_raw_fd();
        let off = mmap_offsets(raw).map_err(|x| e("ring offsets", x))?;
        let fill = map_ring(raw, &off.fr, geo.rx_frames, libc::XDP_UMEM_PGOFF_FILL_RING)
            .map_err(|x| e("mmap fill ring", x))?;
        let comp = map_ring(
            raw,
            &off.cr,
            geo.tx_frames(),
            libc::XDP_UMEM_PGOFF_COMPLETION_RING,
        )
        .map_err(|x| e("mmap completion ring", x))?;
        let rx = map_ring(
            raw,
            &off.rx,
            geo.member_rx(),
            libc::XDP_PGOFF_RX_RING as u64,
        )
        .map_err(|x| e("mmap RX ring", x))?;
        let tx = map_ring(
            raw,
            &off.tx,
            geo.tx_per_slot,
            libc::XDP_PGOFF_TX_RING as u64,
        )
        .map_err(|x| e("mmap TX ring", x))?;
        let fs = u64::from(geo.frame_size);
        let tx_range = geo.tx_range(slot);
        let free = (tx_range.0..tx_range.1).rev().map(|f| f * fs).collect();
        let fd = Arc::new(xsk);
        let cfg = XskConfig {
            rx_frames: geo.rx_frames,
            tx_frames: geo.tx_per_slot,
            frame_size: geo.frame_size,
            try_zero_copy: mode == BindMode::ZeroCopy,
            multi_buffer,
            tx_metadata,
        };
        Ok(Self::from_parts(
            [fill, comp],
            rx,
            tx,
            umem,
            fd,
            free,
            (
                budget,
                if tx_metadata { TX_METADATA_LEN } else { 0 },
                csum_offload,
            ),
            (Some(ctl), tx_range),
            cfg,
            mode,
            queue,
        ))
    }

    pub fn mode(&self) -> BindMode {
        self.mode
    }
    /// The spinner registry of this socket's shared UMEM (`None`: an own
    /// UMEM).
    pub fn seats(&self) -> Option<crate::seats::Seats> {
        self.rx.shared.clone().map(crate::seats::Seats::new)
    }
    pub fn queue(&self) -> u32 {
        self.queue
    }
    pub fn config(&self) -> XskConfig {
        self.cfg
    }
    pub fn umem(&self) -> UmemInfo {
        self.rx.umem_info()
    }
    /// XDP_MAX_TX_SKB_BUDGET in effect, if the kernel supports it.
    pub fn tx_budget(&self) -> Option<u32> {
        self.tx.budget
    }
    /// Bytes of ring memory (the four ring mappings, approximately).
    pub fn ring_bytes(&self) -> usize {
        let c = self.cfg;
        (c.rx_frames as usize) * (8 + 16) + (c.tx_frames as usize) * (8 + 16) + 4 * 4096
    }
    /// XDP_STATISTICS from the kernel.
    pub fn stats(&self) -> XskStats {
        xsk_stats(self.rx.fd.as_raw_fd())
    }
    /// The two halves, for driving them under separate locks.
    pub fn split(self) -> (XskRx, XskTx) {
        (self.rx, self.tx)
    }
}

impl AsFd for XskSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.rx.fd.as_fd()
    }
}

impl AsRawFd for XskSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.rx.fd.as_raw_fd()
    }
}

impl AsRawFd for XskRx {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl XskRx {
    pub fn umem_info(&self) -> UmemInfo {
        UmemInfo {
            rx_frames: self.umem.rx_frames,
            tx_frames: self.umem.tx_frames,
            frame_size: self.umem.frame_size,
            bytes: self.umem.bytes(),
        }
    }

    /// Descriptors that did not lie inside one of our RX frames (dropped).
    pub fn bad_descs(&self) -> u64 {
        self.bad_descs
    }

    /// XDP_STATISTICS from the kernel.
    pub fn stats(&self) -> XskStats {
        xsk_stats(self.fd.as_raw_fd())
    }

    /// Put frames dropped by their last owner (and frames released by this
    /// half) back into the fill ring, and wake the kernel if it asks.
    #[inline]
    pub fn refill(&mut self) {
        // Most calls find nothing to do (a poll refills before each batch
        // and after the last): two loads, inline. On a shared UMEM frames
        // go back a batch at a time (`refill_shared`): fewer wait here.
        if self.umem.recycled_any.load(Ordering::Acquire) || self.to_fill.len() >= self.fill_min {
            self.refill_now();
        }
    }

    #[inline(never)]
    fn refill_now(&mut self) {
        if self.umem.recycled_any.load(Ordering::Acquire)
            && let Ok(mut r) = self.umem.recycled.try_lock()
        {
            // Cleared under the lock before taking: a push after this is
            // seen (it sets the hint again after pushing under the lock).
            self.umem.recycled_any.store(false, Ordering::Relaxed);
            self.minter.collect(&mut r);
            if self.to_fill.is_empty() {
                // The usual case (a frame or a few since the last poll):
                // trade the vectors instead of copying.
                std::mem::swap(&mut self.to_fill, &mut r.bases);
            } else {
                self.to_fill.append(&mut r.bases);
            }
        }
        if self.to_fill.is_empty() {
            return;
        }
        if self.shared.is_some() {
            self.refill_shared();
            return;
        }
        let want = self.to_fill.len() as u32;
        let n = self.fill.prod_free(want).min(want);
        if n == want {
            // All of them (the usual case): no drain of a remainder.
            for (i, &a) in self.to_fill.iter().enumerate() {
                self.fill.prod_write(i as u32, a);
            }
            self.to_fill.clear();
        } else {
            for (i, a) in self.to_fill.drain(..n as usize).enumerate() {
                self.fill.prod_write(i as u32, a);
            }
        }
        if n > 0 {
            self.fill.prod_submit(n);
        }
        self.wake_fill();
    }

    /// Wake the kernel if it asks for fill-ring entries.
    #[inline]
    fn wake_fill(&self) {
        if self.fill.needs_wakeup() {
            // SAFETY: zero-length recvfrom on our socket with MSG_DONTWAIT.
            unsafe {
                crate::sys::recvfrom(
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

    /// Shared UMEM: give frames back in batches, under the shared lock,
    /// journalled first (shared.rs). A busy lock only delays the batch.
    fn refill_shared(&mut self) {
        // Most calls (a poll with fewer than a batch of frames to give
        // back) end here.
        if self.to_fill.len() < REFILL_BATCH {
            return;
        }
        let Some(ctl) = self.shared.as_deref() else {
            return;
        };
        while self.to_fill.len() >= REFILL_BATCH {
            let Some(_held) = ctl.try_lock() else {
                return;
            };
            self.fill.resync();
            let n = self
                .fill
                .prod_free(REFILL_BATCH as u32)
                .min(REFILL_BATCH as u32) as usize;
            if n == 0 {
                return;
            }
            let start = self.to_fill.len() - n;
            ctl.journal(self.fill.cached_prod(), &self.to_fill[start..]);
            for a in &self.to_fill[start..] {
                ctl.mark(*a, false);
            }
            for (i, a) in self.to_fill.drain(start..).enumerate() {
                self.fill.prod_write(i as u32, a);
            }
            self.fill.prod_submit(n as u32);
            ctl.journal_done();
        }
        self.wake_fill();
    }

    /// A lock-free look at this RX ring (see [`RxPeek`]).
    pub fn peek(&self) -> RxPeek {
        RxPeek {
            ring: self.rx.peek(),
            next: self.next.clone(),
            umem: self.umem.clone(),
        }
    }

    /// Take at most `budget` descriptors off the RX ring, in batches of
    /// `batch`, refilling the fill ring before each batch. Each complete
    /// packet is handed to `f` as an owned frame.
    #[inline]
    pub fn poll(&mut self, budget: u32, batch: u32, mut f: impl FnMut(RxFrame)) -> PollInfo {
        let mut info = PollInfo::default();
        loop {
            // Before each batch, and after the last: frames dropped during
            // the poll (bad or unwanted) go back now.
            self.refill();
            probe::mark(Mark::Refilled);
            if info.descs >= budget {
                break;
            }
            let avail = self.rx.cons_avail(u32::MAX);
            if avail == 0 {
                self.prefetch();
                break;
            }
            probe::seen();
            probe::mark(Mark::Found);
            info.ring_peak = info.ring_peak.max(avail);
            let n = avail.min(batch).min(budget - info.descs);
            if let Some(ctl) = &self.shared {
                // Ours from here on (for the service, should we die before
                // giving them back): marked before the ring entries go.
                for i in 0..n {
                    ctl.mark(self.rx.cons_read(i).addr, true);
                }
            }
            for i in 0..n {
                let d = self.rx.cons_read(i);
                probe::mark(Mark::DescRead);
                if let Some(fr) = self.take(d) {
                    probe::mark(Mark::FrameTaken);
                    f(fr);
                }
            }
            self.rx.cons_release(n);
            info.descs += n;
        }
        info
    }

    /// One descriptor: an owned frame, a piece of a chained packet, or a
    /// counted drop.
    #[inline]
    fn take(&mut self, d: Desc) -> Option<RxFrame> {
        if d.options & XDP_PKT_CONTD == 0 && !self.chain.active() {
            let Some(idx) = self.umem.rx_index(d.addr, d.len) else {
                self.bad_descs += 1;
                recycle_bad(&self.umem, d.addr, &mut self.to_fill);
                return None;
            };
            self.rx_taken(d.addr);
            self.frame_lines = frame_lines(d.len);
            probe::mark(Mark::RxTaken);
            return Some(self.minter.mint(idx, d.addr, d.len));
        }
        if self.umem.rx_index(d.addr, d.len).is_some() {
            self.rx_taken(d.addr);
            self.frame_lines = frame_lines(d.len);
        }
        self.chain.push(&self.umem, d, &mut self.to_fill)
    }

    /// Packets dropped because their chain of descriptors was too long or
    /// had a descriptor outside our frames (every frame went back).
    pub fn chain_drops(&self) -> u64 {
        self.chain.drops
    }

    /// While waiting for RX: pull in the next RX descriptor slot and the
    /// first cache lines of the frame the kernel most likely fills next (as
    /// many as the last frame filled, [`FRAME_LINES`]).
    /// The kernel writes both before it publishes the producer index, so a
    /// frame found by the next poll is usually already in this CPU's cache
    /// instead of costing two more cross-CPU misses in a row. The addresses,
    /// and the fill ring entry the prediction was read from, are published
    /// for waiters that look without the lock ([`RxPeek::prefetch`]).
    #[inline]
    fn prefetch(&self) {
        let slot = self.rx.slot_ptr(self.rx.cached_cons());
        prefetch(slot);
        let a = self.fill.peek_written(self.fill_next) + self.rx_off;
        let mut frame = 0;
        let lines = self.frame_lines;
        if a.saturating_add(lines as u64 * 64) <= self.umem.map.len as u64 {
            let p = self.umem.map.ptr.wrapping_add(a as usize);
            prefetch_frame(p, lines);
            frame = p as usize;
        }
        self.next.lines.store(lines, Ordering::Relaxed);
        self.next.slot.store(slot as usize, Ordering::Relaxed);
        self.next.frame.store(frame, Ordering::Relaxed);
        let fill = self.fill.slot_ptr(self.fill_next);
        self.next.fill.store(fill as usize, Ordering::Relaxed);
    }

    /// Keep the prediction of [`XskRx::prefetch`] in step with the kernel.
    #[inline]
    fn rx_taken(&mut self, addr: u64) {
        let base = self.umem.frame_base(addr);
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
}

/// What a device's checksum offload does with a [`CsumRequest`], in
/// software: the ones' complement sum of `pkt[start..]` (the field at
/// `start + offset` holding the pseudo-header's sum) folded, inverted and
/// stored in that field. A request that does not fit `pkt` is left alone.
pub fn complete_checksum(pkt: &mut [u8], c: CsumRequest) {
    let (start, at) = (
        usize::from(c.start),
        usize::from(c.start) + usize::from(c.offset),
    );
    if at + 2 > pkt.len() {
        return;
    }
    let sum = checksum::fold(checksum::accumulate(0, &pkt[start..]));
    pkt[at..at + 2].copy_from_slice(&(!sum).to_be_bytes());
}

/// The TX metadata (`struct xsk_tx_metadata`, native endian) asking for
/// checksum offload, into the `TX_METADATA_LEN` bytes before a packet.
#[inline]
fn write_csum_metadata(m: &mut [u8], c: CsumRequest) {
    let mut w = [0u8; TX_METADATA_LEN as usize];
    w[0..8].copy_from_slice(&u64::from(libc::XDP_TXMD_FLAGS_CHECKSUM).to_ne_bytes());
    w[8..10].copy_from_slice(&c.start.to_ne_bytes());
    w[10..12].copy_from_slice(&c.offset.to_ne_bytes());
    // The head is TX_METADATA_LEN bytes (fixed-size stores, no memset).
    if let Ok(h) = <&mut [u8; TX_METADATA_LEN as usize]>::try_from(&mut *m) {
        *h = w;
    } else {
        m.fill(0);
        let n = w.len().min(m.len());
        m[..n].copy_from_slice(&w[..n]);
    }
}

/// A descriptor outside the frames it should lie in: its frame goes back
/// to the fill ring if it is one of our RX frames; anything else is not
/// ours to recycle.
fn recycle_bad(umem: &UmemShared, addr: u64, to_fill: &mut Vec<u64>) {
    let base = umem.frame_base(addr);
    if base >> umem.frame_shift < u64::from(umem.rx_frames) {
        to_fill.push(base);
    }
}

/// Collects one multi-buffer packet: descriptors chained by
/// `XDP_PKT_CONTD`, the last one without. The buffers are not copied: the
/// packet is handed out as a chain of the RX frames it arrived in
/// ([`RxFrame::pieces`]), which go back to the fill ring when it drops. A
/// chain longer than [`MAX_CHAIN_FRAMES`] or [`MAX_MULTI_BUFFER_PACKET`]
/// bytes, or with a descriptor outside our frames, is dropped whole and
/// counted once (`drops`) when its last descriptor comes, its frames
/// going straight back: nothing leaks whatever the kernel writes.
#[derive(Default)]
pub(crate) struct Chain {
    pieces: Vec<(u64, u32)>,
    bytes: usize,
    frames: u32,
    bad: bool,
    pub(crate) drops: u64,
}

impl Chain {
    /// A packet is being gathered (its last descriptor has not come yet).
    #[inline]
    pub(crate) fn active(&self) -> bool {
        self.frames > 0
    }

    /// One descriptor of a chain; the whole packet when it was the last.
    pub(crate) fn push(
        &mut self,
        umem: &Arc<UmemShared>,
        d: Desc,
        to_fill: &mut Vec<u64>,
    ) -> Option<RxFrame> {
        self.frames += 1;
        match umem.rx_index(d.addr, d.len) {
            None => {
                self.bad = true;
                recycle_bad(umem, d.addr, to_fill);
            }
            Some(_) => {
                if !self.bad
                    && self.frames <= MAX_CHAIN_FRAMES
                    && self.bytes + d.len as usize <= MAX_MULTI_BUFFER_PACKET
                {
                    if self.pieces.capacity() == 0 {
                        self.pieces.reserve_exact(MAX_CHAIN_FRAMES as usize);
                    }
                    self.pieces.push((d.addr, d.len));
                    self.bytes += d.len as usize;
                } else {
                    self.bad = true;
                    to_fill.push(umem.frame_base(d.addr));
                }
            }
        }
        if d.options & XDP_PKT_CONTD != 0 {
            return None;
        }
        self.frames = 0;
        self.bytes = 0;
        if std::mem::take(&mut self.bad) || self.pieces.is_empty() {
            to_fill.extend(self.pieces.drain(..).map(|(a, _)| umem.frame_base(a)));
            self.drops += 1;
            return None;
        }
        Some(RxFrame::chain(umem, std::mem::take(&mut self.pieces)))
    }
}

impl XskTx {
    /// XDP_MAX_TX_SKB_BUDGET in effect, if the kernel supports it.
    pub fn budget(&self) -> Option<u32> {
        self.budget
    }
    /// Bytes a packet may take in one frame (the frame less the TX
    /// metadata before it, if any).
    pub fn frame_size(&self) -> usize {
        (self.umem.frame_size - self.meta) as usize
    }
    /// Completion descriptors that did not name one of our TX frames.
    pub fn bad_descs(&self) -> u64 {
        self.bad_descs
    }
    /// Frames in the pool (free for the next send).
    pub fn free_count(&self) -> usize {
        self.free.len()
    }
    /// Frames queued on the TX ring, not yet taken by the kernel.
    pub fn occupancy(&self) -> u32 {
        self.tx.occupancy()
    }
    /// Can a packet of `len` bytes be sent in several buffers?
    pub fn multi_buffer(&self) -> bool {
        self.multi_buffer
    }

    /// Reap the completion ring into the pool.
    #[inline]
    pub fn reap(&mut self) -> u32 {
        if self.shared.is_some() {
            return self.reap_shared();
        }
        let n = self.comp.cons_avail(u32::MAX);
        let (lo, hi) = (
            u64::from(self.umem.rx_frames),
            u64::from(self.umem.rx_frames + self.umem.tx_frames),
        );
        for i in 0..n {
            let a = self.comp.cons_read(i);
            let f = a >> self.umem.frame_shift;
            if (lo..hi).contains(&f) {
                self.free.push(f << self.umem.frame_shift);
            } else {
                self.bad_descs += 1;
            }
        }
        if n > 0 {
            self.comp.cons_release(n);
        }
        n
    }

    /// Shared UMEM: nothing while frames are left in the pool and fewer
    /// than [`HOT_TX_FRAMES`] went out since the last reap; then our
    /// mailbox; then, unless that refilled an empty pool, the shared
    /// completion ring under the lock, routing other slots' frames to their
    /// mailboxes. The ring entries are released before they are routed: a
    /// process killed in between loses those frames (its slot's and
    /// others'), it never hands one out twice.
    ///
    /// This runs after every send's kick: between reaps it is two tests.
    /// Completions wait meanwhile without harm: the completion ring holds
    /// every slot's TX frames and a mailbox its slot's, so neither can
    /// overflow. Frames go back on top of the pool in completion order, so
    /// the next send takes the one completed last (still in this CPU's
    /// cache: it was written for the packet just sent).
    fn reap_shared(&mut self) -> u32 {
        if !self.free.is_empty() && self.since_reap < HOT_TX_FRAMES {
            return 0;
        }
        // Borrowed, not cloned: an Arc clone + drop is two atomic
        // read-modify-writes.
        let Some(ctl) = self.shared.as_deref() else {
            return 0;
        };
        let shift = self.umem.frame_shift;
        let (lo, hi) = self.tx_range;
        let mut got = 0;
        let mut bad = 0;
        ctl.mb_drain(|a| {
            let f = a >> shift;
            if (lo..hi).contains(&f) {
                self.free.push(f << shift);
                got += 1;
            } else {
                bad += 1;
            }
        });
        if got > 0 && self.since_reap < HOT_TX_FRAMES {
            // An empty pool refilled from the mailbox alone.
            self.bad_descs += bad;
            return got;
        }
        let Some(_held) = ctl.try_lock() else {
            self.bad_descs += bad;
            return got;
        };
        self.since_reap = 0;
        self.comp.resync();
        let all = (
            u64::from(self.umem.rx_frames),
            u64::from(self.umem.rx_frames) + u64::from(ctl.geo.tx_frames()),
        );
        let per = u64::from(ctl.geo.tx_per_slot);
        // Small: zeroed on every reap (a few entries each, now that reaps
        // come every HOT_TX_FRAMES sends); more are taken in turns.
        let mut buf = [0u64; 4 * HOT_TX_FRAMES as usize];
        loop {
            let n = self.comp.cons_avail(buf.len() as u32);
            if n == 0 {
                break;
            }
            for (i, b) in buf.iter_mut().enumerate().take(n as usize) {
                *b = self.comp.cons_read(i as u32);
            }
            self.comp.cons_release(n);
            for a in &buf[..n as usize] {
                let f = a >> shift;
                if (lo..hi).contains(&f) {
                    self.free.push(f << shift);
                    got += 1;
                } else if (all.0..all.1).contains(&f) {
                    if !ctl.mb_push(((f - all.0) / per) as u32, f << shift) {
                        bad += 1;
                    }
                } else {
                    bad += 1;
                }
            }
        }
        self.bad_descs += bad;
        got
    }

    #[inline]
    fn alloc(&mut self) -> Option<u64> {
        if let Some(a) = self.free.pop() {
            return Some(a);
        }
        self.reap();
        self.free.pop()
    }

    /// Whether packets may ask for checksum offload (`send_with_csum`):
    /// the UMEM has TX metadata and the kernel completes the checksum
    /// (copy mode; see `csum_offload`'s note in `open_mode`).
    #[inline]
    pub fn csum_offload(&self) -> bool {
        self.csum_offload
    }

    /// Send up to `max` packets: for packet `i`, `fill(i, frame)` writes it
    /// into a pool frame and returns its length, or `None` to stop (the
    /// frame goes back to the pool). Kicks the kernel if the ring asks.
    /// Returns how many packets were queued (fewer when the ring or the
    /// pool ran out).
    #[inline]
    pub fn send_with(
        &mut self,
        max: usize,
        mut fill: impl FnMut(usize, &mut [u8]) -> Option<usize>,
    ) -> usize {
        self.send_with_csum(max, |i, fr| fill(i, fr).map(|l| (l, None)))
    }

    /// [`XskTx::send_with`] where `fill` may also ask for the packet's
    /// checksum to be completed on the way out ([`CsumRequest`]): by the
    /// kernel where [`XskTx::csum_offload`] says so, else here, in
    /// software, before posting.
    #[inline]
    pub fn send_with_csum(
        &mut self,
        max: usize,
        mut fill: impl FnMut(usize, &mut [u8]) -> Option<(usize, Option<CsumRequest>)>,
    ) -> usize {
        let room = self.tx.prod_free(max as u32).min(max as u32);
        let meta = self.meta as usize;
        let fs = self.umem.frame_size as usize - meta;
        let mut n = 0u32;
        while n < room {
            let Some(base) = self.alloc() else { break };
            // SAFETY: `base` came off our pool (TX frames only, checked in
            // reap), so it is a frame inside the UMEM that neither the
            // kernel nor anyone else uses until we post it.
            let frame = unsafe { self.umem.frame_mut(base) };
            let (head, buf) = frame.split_at_mut(meta);
            match fill(n as usize, buf) {
                Some((len, csum)) if len <= fs => {
                    let mut options = 0;
                    if let Some(c) = csum {
                        if self.csum_offload {
                            write_csum_metadata(head, c);
                            options = libc::XDP_TX_METADATA;
                        } else {
                            complete_checksum(&mut buf[..len], c);
                        }
                    }
                    self.tx.prod_write(
                        n,
                        Desc {
                            addr: base + meta as u64,
                            len: len as u32,
                            options,
                        },
                    );
                    n += 1;
                }
                _ => {
                    self.free.push(base);
                    break;
                }
            }
        }
        if n > 0 {
            probe::mark(Mark::Submitted);
            self.tx.prod_submit(n);
            self.since_reap = self.since_reap.saturating_add(n);
            if self.tx.needs_wakeup() {
                self.kick();
            }
        }
        n as usize
    }

    /// Send one packet larger than a frame in several descriptors
    /// (multi-buffer). `false` when the bind has no multi-buffer, or the
    /// ring or pool has no room (nothing queued then).
    pub fn send_large(&mut self, pkt: &[u8]) -> bool {
        let meta = self.meta as usize;
        let fs = self.umem.frame_size as usize - meta;
        let parts = pkt.len().div_ceil(fs).max(1);
        if !self.multi_buffer || parts > 17 {
            return false;
        }
        if self.tx.prod_free(parts as u32) < parts as u32 {
            return false;
        }
        if self.free.len() < parts {
            self.reap();
            if self.free.len() < parts {
                return false;
            }
        }
        for (i, chunk) in pkt.chunks(fs).enumerate() {
            let base = self.free.pop().expect("checked above");
            // SAFETY: as in send_with: a pool frame we own until posted.
            let buf = unsafe { self.umem.frame_mut(base) };
            buf[meta..meta + chunk.len()].copy_from_slice(chunk);
            self.tx.prod_write(
                i as u32,
                Desc {
                    addr: base + meta as u64,
                    len: chunk.len() as u32,
                    options: if i + 1 < parts { XDP_PKT_CONTD } else { 0 },
                },
            );
        }
        probe::mark(Mark::Submitted);
        self.tx.prod_submit(parts as u32);
        self.since_reap = self.since_reap.saturating_add(parts as u32);
        if self.tx.needs_wakeup() {
            self.kick();
        }
        true
    }

    /// Kick TX. A transient refusal (EAGAIN, EBUSY, ENOBUFS) leaves the
    /// frames the kernel did not take in the ring, and in copy mode nothing
    /// but another kick ever sends them: the device queue was stopped (veth
    /// stops it while its peer's ring is full and answers NETDEV_TX_BUSY,
    /// more so under load), the completion ring was full, or the copy-mode
    /// budget ran out. A datagram left there is lost when its process exits
    /// or waits for an answer to it (a request never sent). So the kick
    /// frees completions and tries again, yielding the CPU to whoever must
    /// drain the queue, a bounded number of times (the kernel's own send
    /// would queue the packet in its qdisc); what is still left goes with
    /// the next kick (`flush`). Errors that will not go away (interface
    /// down or gone) are returned by [`XskTx::kick_error`].
    ///
    /// EBUSY is not only "for now": in copy mode it is the kernel saying
    /// that the device dropped the packet it was sending (`NET_XMIT_DROP`
    /// from `__dev_direct_xmit`: the device has no carrier, e.g. a veth
    /// whose peer is down, or the veth peer's backlog was full), after it
    /// took the packet off the ring and completed its frames: that packet
    /// is gone, and counted ([`XskTx::kernel_dropped`]); the kick goes on
    /// with the rest of the ring.
    pub fn kick(&mut self) {
        probe::kick();
        for attempt in 0..KICK_TRIES {
            // SAFETY: zero-length sendto on our socket.
            let r = unsafe {
                crate::sys::sendto(
                    self.fd.as_raw_fd(),
                    std::ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null(),
                    0,
                )
            };
            if r >= 0 {
                return;
            }
            let e = io::Error::last_os_error().raw_os_error().unwrap_or(0);
            if matches!(e, libc::ENETDOWN | libc::ENXIO | libc::ENODEV) {
                self.fatal = e;
                return;
            }
            if !matches!(e, libc::EAGAIN | libc::EBUSY | libc::ENOBUFS) {
                return;
            }
            if e == libc::EBUSY {
                self.kernel_dropped += 1;
            }
            self.kick_retries += 1;
            self.reap();
            if self.tx.occupancy() == 0 {
                return;
            }
            if attempt >= 4 {
                std::thread::yield_now();
            }
        }
    }

    /// Kicks tried again after a transient refusal (see [`XskTx::kick`]).
    pub fn kick_retries(&self) -> u64 {
        self.kick_retries
    }

    /// Packets the kernel completed without sending them: each kick the
    /// kernel answered EBUSY (copy mode: "SKB completed but not sent", the
    /// device's `NET_XMIT_DROP`). The frames came back on the completion
    /// ring; the data did not leave. The engine shows it as
    /// `xsk_tx_kernel_dropped`.
    #[inline]
    pub fn kernel_dropped(&self) -> u64 {
        self.kernel_dropped
    }

    /// The last kick error that will not go away by retrying, if any.
    #[inline]
    pub fn kick_error(&mut self) -> Option<io::Error> {
        match std::mem::take(&mut self.fatal) {
            0 => None,
            e => Some(io::Error::from_raw_os_error(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_metadata_is_the_kernel_struct_with_the_rest_zeroed() {
        let c = CsumRequest {
            start: 34,
            offset: 6,
        };
        for len in [TX_METADATA_LEN as usize, 32] {
            let mut m = vec![0xaau8; len];
            write_csum_metadata(&mut m, c);
            let mut want = vec![0u8; len];
            want[0..8].copy_from_slice(&u64::from(libc::XDP_TXMD_FLAGS_CHECKSUM).to_ne_bytes());
            want[8..10].copy_from_slice(&34u16.to_ne_bytes());
            want[10..12].copy_from_slice(&6u16.to_ne_bytes());
            assert_eq!(m, want, "{len}");
        }
    }

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

    fn desc(addr: u64, len: u32, more: bool) -> Desc {
        Desc {
            addr,
            len,
            options: if more { XDP_PKT_CONTD } else { 0 },
        }
    }

    /// An RX half over anonymous rings (the test plays the kernel): the
    /// fill ring holds every frame of `u` in order.
    fn rx_half(u: &Arc<UmemShared>) -> XskRx {
        let n = u.rx_frames;
        let mut fill: Ring<u64> = Ring::anon(n, 0);
        for i in 0..n {
            fill.prod_write(i, u64::from(i) * 2048);
        }
        fill.prod_submit(n);
        XskRx {
            fill,
            rx: Ring::anon(n, 0),
            minter: Minter::new(u),
            umem: u.clone(),
            fd: Arc::new(std::fs::File::open("/dev/null").unwrap().into()),
            to_fill: Vec::new(),
            bad_descs: 0,
            chain: Chain::default(),
            fill_next: 0,
            rx_off: 256,
            frame_lines: *FRAME_LINES.start(),
            shared: None,
            fill_min: 1,
            next: Arc::default(),
        }
    }

    #[test]
    fn a_waiter_without_the_lock_sees_the_predicted_frame_and_frames_to_give_back() {
        let u = umem(8);
        let mut x = rx_half(&u);
        let p = x.peek();
        let base = u.map.ptr as usize;
        // An empty poll predicts fill[0], at the copy-mode offset.
        assert_eq!(x.poll(16, 16, |_| ()).descs, 0);
        assert_eq!(p.next.frame.load(Ordering::Relaxed), base + 256);
        assert_eq!(
            p.next.slot.load(Ordering::Relaxed),
            x.rx.slot_ptr(0) as usize
        );
        // And the fill entry it read, which the take reads again.
        assert_eq!(
            p.next.fill.load(Ordering::Relaxed),
            x.fill.slot_ptr(0) as usize
        );
        assert!(!p.refill_due());
        p.prefetch(); // a hint: nothing to see but that it is harmless
        // The kernel fills fill[0]: the prediction moves on to fill[1].
        x.rx.prod_write(0, desc(256, 10, false));
        x.rx.prod_submit(1);
        assert!(p.pending());
        let mut got = Vec::new();
        assert_eq!(x.poll(16, 16, |f| got.push(f)).descs, 1);
        assert_eq!(got[0].data(), &[0u8; 10]);
        assert_eq!(p.next.frame.load(Ordering::Relaxed), base + 2048 + 256);
        assert_eq!(
            p.next.slot.load(Ordering::Relaxed),
            x.rx.slot_ptr(1) as usize
        );
        assert_eq!(
            p.next.fill.load(Ordering::Relaxed),
            x.fill.slot_ptr(1) as usize
        );
        // Its frame dropped: due to go back until a poll's refill takes it.
        assert!(!p.refill_due());
        got.clear();
        assert!(p.refill_due());
        x.poll(16, 16, |_| ());
        assert!(!p.refill_due());
        assert_eq!(x.to_fill, vec![0], "the full fill ring takes it later");
        // The lines prefetched of the next frame are what the last one
        // filled: two for the 10 bytes above, three for a TCP ping-pong's
        // 130, at most four.
        assert_eq!(p.next.lines.load(Ordering::Relaxed), 2);
        for (i, (len, lines)) in [(130, 3), (1500, 4), (64, 2)].into_iter().enumerate() {
            let i = i as u32 + 1;
            x.rx.prod_write(0, desc(u64::from(i) * 2048 + 256, len, false));
            x.rx.prod_submit(1);
            assert_eq!(x.poll(16, 16, |_| ()).descs, 1);
            x.poll(16, 16, |_| ());
            assert_eq!(p.next.lines.load(Ordering::Relaxed), lines, "{len} bytes");
        }
    }

    #[test]
    fn a_frame_fills_two_to_four_lines_for_the_prefetch() {
        assert_eq!(frame_lines(0), 2);
        assert_eq!(frame_lines(106), 2);
        assert_eq!(frame_lines(128), 2);
        assert_eq!(frame_lines(129), 3);
        assert_eq!(frame_lines(130), 3);
        assert_eq!(frame_lines(192), 3);
        assert_eq!(frame_lines(193), 4);
        assert_eq!(frame_lines(9000), 4);
    }

    #[test]
    fn frames_circulate_on_credits_and_the_umem_goes_after_its_last_frame() {
        let u = umem(8);
        let mut x = rx_half(&u);
        let owners = Arc::strong_count(&u);
        let mut next = 0u64;
        let mut take = |x: &mut XskRx| {
            let i = x.rx.cached_prod();
            x.rx.prod_write(0, desc(next * 2048 + 256, 10, false));
            x.rx.prod_submit(1);
            next += 1;
            let mut got = None;
            assert_eq!(x.poll(16, 16, |f| got = Some(f)).descs, 1, "descriptor {i}");
            got.unwrap()
        };
        // The first frame's reference is a fresh one; dropped, it stays
        // counted as a credit, which the next frame takes.
        let f = take(&mut x);
        assert_eq!(Arc::strong_count(&u), owners + 1);
        drop(f);
        assert_eq!(Arc::strong_count(&u), owners + 1, "kept as a credit");
        let f = take(&mut x);
        assert_eq!(Arc::strong_count(&u), owners + 1, "minted on the credit");
        assert_eq!(f.data(), &[1u8; 10]);
        drop(f);
        // Through a batch: three references (one credit, two fresh) come
        // back together.
        let fs: Vec<RxFrame> = (0..3).map(|_| take(&mut x)).collect();
        assert_eq!(Arc::strong_count(&u), owners + 3);
        let mut b = crate::umem::Recycler::default();
        fs.into_iter().for_each(|f| f.recycle_into(&mut b));
        drop(b);
        assert_eq!(Arc::strong_count(&u), owners + 3);
        // A frame outlives its ring: the ring's credits go with it, the
        // frame's reference when it drops.
        let f = take(&mut x);
        assert_eq!(Arc::strong_count(&u), owners + 3);
        drop(x);
        assert_eq!(Arc::strong_count(&u), 2, "u and the frame");
        assert_eq!(f.data(), &[5u8; 10]);
        drop(f);
        assert_eq!(Arc::strong_count(&u), 1);
    }

    /// The TX half of slot `slot` of a shared UMEM over anonymous rings
    /// (the test plays the kernel), as `attach_shared` builds it.
    fn shared_tx(u: &Arc<UmemShared>, ctl: Arc<Ctl>, comp: Ring<u64>) -> XskTx {
        let geo = ctl.geo;
        let tx_range = geo.tx_range(ctl.slot);
        XskTx {
            tx: Ring::anon(geo.tx_per_slot, 0),
            comp,
            umem: u.clone(),
            fd: Arc::new(std::fs::File::open("/dev/null").unwrap().into()),
            free: (tx_range.0..tx_range.1).rev().map(|f| f * 2048).collect(),
            budget: None,
            fatal: 0,
            kick_retries: 0,
            kernel_dropped: 0,
            bad_descs: 0,
            multi_buffer: false,
            shared: Some(ctl),
            tx_range,
            meta: TX_METADATA_LEN,
            csum_offload: true,
            since_reap: 0,
        }
    }

    /// The kernel's part of a copy-mode send: every descriptor on `tx`'s
    /// ring is completed onto `comp` (the shared completion ring).
    fn complete(tx: &mut XskTx, comp: &mut Ring<u64>) -> Vec<u64> {
        let n = tx.tx.cons_avail(u32::MAX);
        let done: Vec<u64> = (0..n).map(|i| tx.tx.cons_read(i).addr).collect();
        tx.tx.cons_release(n);
        comp.resync();
        let free = comp.prod_free(n);
        assert!(free >= n);
        for (i, a) in done.iter().enumerate() {
            comp.prod_write(i as u32, *a);
        }
        comp.prod_submit(n);
        done
    }

    #[test]
    fn a_process_on_a_shared_umem_sends_from_its_last_completed_frames() {
        let (fd, geo) = crate::ctl::test_area(2);
        let ctl = |slot| Arc::new(Ctl::map(fd.as_raw_fd(), geo, slot).unwrap());
        let u = Arc::new(UmemShared::new(geo.rx_frames, geo.tx_frames(), 2048).unwrap());
        // One completion ring, mapped by both slots (and the kernel).
        let ring: Ring<u64> = Ring::anon(geo.tx_frames(), 0);
        let view = || ring.clone_view();
        let mut a = shared_tx(&u, ctl(0), view());
        let mut b = shared_tx(&u, ctl(1), view());
        let mut kernel = view();
        let mut used = std::collections::BTreeSet::new();
        for i in 0..1000u32 {
            // B sends now and then: A's reaps route B's frames to B's mailbox.
            let (who, other) = if i % 10 == 9 {
                (&mut b, 1)
            } else {
                (&mut a, 0)
            };
            assert_eq!(
                who.send_with(1, |_, f| {
                    f[..60].fill(i as u8);
                    Some(60)
                }),
                1
            );
            let sent = complete(who, &mut kernel);
            assert_eq!(sent.len(), 1);
            who.reap(); // what flush does after the kick
            if other == 0 {
                used.insert(sent[0] >> 11);
            }
        }
        // A rotated through a handful of frames (the own engine's habit), not
        // through all 64 of its slot: at most the frames between two reaps.
        assert!(
            used.len() <= HOT_TX_FRAMES as usize + 1,
            "slot 0 sent from {} frames: {used:?}",
            used.len()
        );
        // Nothing lost or doubled: once every completion is reaped, each
        // slot's pool holds each of its frames exactly once.
        for (x, slot) in [(&mut a, 0u32), (&mut b, 1)] {
            for _ in 0..2 {
                // Twice: the first may route the other slot's frames here.
                x.since_reap = HOT_TX_FRAMES;
                x.reap();
            }
            let mut f: Vec<u64> = x.free.iter().map(|a| a >> 11).collect();
            f.sort_unstable();
            let (lo, hi) = geo.tx_range(slot);
            assert_eq!(f, (lo..hi).collect::<Vec<_>>(), "slot {slot}");
            assert_eq!(x.bad_descs, 0);
        }
    }

    /// A UMEM with RX frame `i` holding bytes `i` at offset 256.
    fn umem(frames: u32) -> Arc<UmemShared> {
        let u = Arc::new(UmemShared::new(frames, 4, 2048).unwrap());
        for i in 0..frames {
            // SAFETY: the test owns the whole UMEM (no socket, no kernel).
            let f = unsafe { u.frame_mut(u64::from(i) * 2048) };
            f[256..].fill(i as u8);
        }
        u
    }

    #[test]
    fn a_chain_becomes_one_packet_and_its_frames_go_back() {
        let u = umem(8);
        let mut c = Chain::default();
        let mut back = Vec::new();
        assert!(c.push(&u, desc(256, 1792, true), &mut back).is_none());
        assert!(c.active());
        assert!(
            c.push(&u, desc(2048 + 256, 1792, true), &mut back)
                .is_none()
        );
        let p = c
            .push(&u, desc(2 * 2048 + 256, 100, false), &mut back)
            .unwrap();
        assert!(!c.active());
        assert!(p.is_multi_buffer());
        assert_eq!(p.len(), 1792 + 1792 + 100);
        assert!(p.data()[..1792].iter().all(|&b| b == 0));
        assert!(p.data()[1792..3584].iter().all(|&b| b == 1));
        assert!(p.data()[3584..].iter().all(|&b| b == 2));
        let lens: Vec<usize> = p.pieces().map(<[u8]>::len).collect();
        assert_eq!(lens, [1792, 1792, 100], "read in place, piece by piece");
        assert_eq!(p.head().len(), 1792);
        assert_eq!(p.frames(), 3);
        assert!(back.is_empty(), "the packet holds its frames");
        let q = p.clone();
        drop(p);
        assert!(
            u.recycled.lock().unwrap().bases.is_empty(),
            "a clone holds them"
        );
        drop(q);
        assert_eq!(
            u.recycled.lock().unwrap().bases,
            vec![0, 2048, 4096],
            "every frame back, once"
        );
        assert_eq!(c.drops, 0);
    }

    #[test]
    fn a_chain_with_a_bad_descriptor_is_one_counted_drop_and_leaks_nothing() {
        let u = umem(8);
        let mut c = Chain::default();
        let mut back = Vec::new();
        assert!(c.push(&u, desc(256, 1792, true), &mut back).is_none());
        // Crosses its frame's end: the chain "ends early" for us.
        assert!(
            c.push(&u, desc(2048 + 1000, 1792, true), &mut back)
                .is_none()
        );
        assert!(
            c.push(&u, desc(2 * 2048 + 256, 10, false), &mut back)
                .is_none()
        );
        assert_eq!(c.drops, 1);
        back.sort_unstable();
        assert_eq!(back, vec![0, 2048, 4096]);
        // The next packet starts clean.
        let p = c
            .push(&u, desc(3 * 2048 + 256, 10, false), &mut back)
            .unwrap();
        assert_eq!(p.data(), &[3u8; 10]);
        // A descriptor outside the RX frames is not ours to recycle.
        assert!(c.push(&u, desc(1 << 30, 10, false), &mut back).is_none());
        assert_eq!(c.drops, 2);
        assert_eq!(back, vec![0, 2048, 4096]);
        drop(p);
        assert_eq!(u.recycled.lock().unwrap().bases, vec![3 * 2048]);
    }

    #[test]
    fn a_chain_beyond_the_limits_is_dropped_whole() {
        let u = umem(4);
        let mut c = Chain::default();
        let mut back = Vec::new();
        // More descriptors than MAX_CHAIN_FRAMES (the kernel never sends this).
        for i in 0..MAX_CHAIN_FRAMES + 5 {
            let a = u64::from(i % 4) * 2048 + 256;
            assert!(c.push(&u, desc(a, 10, true), &mut back).is_none());
        }
        assert!(c.push(&u, desc(256, 10, false), &mut back).is_none());
        assert_eq!(c.drops, 1);
        assert_eq!(back.len() as u32, MAX_CHAIN_FRAMES + 6, "every frame back");
        // More bytes than MAX_MULTI_BUFFER_PACKET.
        back.clear();
        for _ in 0..40 {
            assert!(c.push(&u, desc(256, 1792, true), &mut back).is_none());
        }
        assert!(c.push(&u, desc(256, 1792, false), &mut back).is_none());
        assert_eq!(c.drops, 2);
        assert_eq!(back.len(), 41);
        assert!(!c.active());
    }
}
