//! The UMEM (the packet memory shared with the kernel) and the owned
//! received frame, [`RxFrame`].
//!
//! Frames `0..rx_frames` are RX frames: each is either in the fill ring or
//! RX ring (the kernel's), or held by one or more `RxFrame` values (ours).
//! Dropping the last `RxFrame` of a frame puts it on the UMEM's recycle
//! list, from which the receive path refills the fill ring. Every `RxFrame`
//! holds the UMEM alive (an `Arc`), so no frame can outlive the mapping.
//! That reference is not counted afresh for every packet: a receive ring
//! ([`Minter`]) mints a frame with a reference its last owner handed back
//! with an earlier frame (a credit, carried with the frame's base through
//! the recycle list), so a frame's way from the RX ring to the fill ring
//! makes no atomic read-modify-write on the `Arc`'s count.
//! Frames `rx_frames..` are TX frames, owned by [`crate::xsk::XskTx`].

use crate::mmap::Mmap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

pub(crate) struct UmemShared {
    pub(crate) map: Mmap,
    pub(crate) frame_size: u32,
    pub(crate) frame_shift: u32,
    pub(crate) rx_frames: u32,
    pub(crate) tx_frames: u32,
    /// References per RX frame (valid while the frame is ours).
    refs: Box<[AtomicU32]>,
    /// Frame base addresses whose last reference was dropped (and the
    /// credits that came back with them).
    pub(crate) recycled: Mutex<Recycled>,
    /// `recycled` is not empty (a hint read without the lock: a spinning
    /// poller looks at it millions of times a second).
    pub(crate) recycled_any: AtomicBool,
}

/// The memory of a UMEM, mapped and populated ahead of the socket that
/// registers it ([`crate::xsk::XskSocket::open_in`]): zeroing tens of MB
/// is most of an engine's start, and can run on another thread while the
/// steering program is loaded and attached (whose link waits in the
/// kernel's `synchronize_rcu`).
pub struct UmemArea {
    map: Mmap,
    pub(crate) rx_frames: u32,
    pub(crate) tx_frames: u32,
    pub(crate) frame_size: u32,
}

/// TX frames of an own engine's UMEM.
pub const OWN_TX_FRAMES: u32 = 1024;

/// An own engine's UMEM on an interface of MTU `mtu` with RX rings of
/// `ring_depth`: (RX frames, TX frames, frame size). 2 KiB frames hold MTU
/// 1500 with the kernel's 256 B headroom; beyond, 4 KiB frames.
pub fn own_geometry(mtu: u32, ring_depth: u32) -> (u32, u32, u32) {
    let eth = mtu as usize + 14;
    let frame_size = if eth <= 2048 - 256 { 2048 } else { 4096 };
    (
        ring_depth.max(64).next_power_of_two(),
        OWN_TX_FRAMES,
        frame_size,
    )
}

impl UmemArea {
    /// The bytes of a UMEM of this geometry.
    pub fn len_of(rx_frames: u32, tx_frames: u32, frame_size: u32) -> usize {
        (rx_frames as usize + tx_frames as usize) * frame_size as usize
    }

    /// A UMEM's memory in a file of its own, populated (`nanowire run`,
    /// before it execs the program: prestart.rs): an unnamed file on a
    /// huge tmpfs of its own where the kernel lets us, else a memfd. The
    /// mapping that populated it is gone; the pages stay with the file.
    pub fn populated_file(
        rx_frames: u32,
        tx_frames: u32,
        frame_size: u32,
    ) -> std::io::Result<std::os::fd::OwnedFd> {
        use std::os::fd::AsRawFd;
        let len = Self::len_of(rx_frames, tx_frames, frame_size);
        let (fd, huge) = match crate::sys::huge_tmpfs_file(len) {
            Ok(f) => (f, true),
            Err(_) => (crate::sys::sealed_memfd(c"nanowire-umem", len)?, false),
        };
        // Populated by the mapping (dropped at the end of this statement).
        if huge {
            Mmap::map_new_shared_huge(len, fd.as_raw_fd())?;
        } else {
            Mmap::map(len, Some((fd.as_raw_fd(), 0)))?;
        }
        // Kept by the program exec'd next: above its numbers, as the
        // engine's other fds.
        Ok(crate::sys::above_floor(fd))
    }

    /// The memory of a UMEM of this geometry from a file made by
    /// [`UmemArea::populated_file`] (its pages exist: mapping them sets up
    /// page tables, no zeroing).
    pub fn from_file(
        fd: std::os::fd::RawFd,
        rx_frames: u32,
        tx_frames: u32,
        frame_size: u32,
    ) -> std::io::Result<UmemArea> {
        let len = Self::len_of(rx_frames, tx_frames, frame_size);
        Ok(UmemArea {
            map: Mmap::map(len, Some((fd, 0)))?,
            rx_frames,
            tx_frames,
            frame_size,
        })
    }

    /// Map and populate the memory of a UMEM of this geometry.
    pub fn new(rx_frames: u32, tx_frames: u32, frame_size: u32) -> std::io::Result<UmemArea> {
        let len = Self::len_of(rx_frames, tx_frames, frame_size);
        let mut map = Mmap::map_umem(len)?;
        map.dont_fork();
        Ok(UmemArea {
            map,
            rx_frames,
            tx_frames,
            frame_size,
        })
    }
}

impl UmemShared {
    pub(crate) fn new(rx_frames: u32, tx_frames: u32, frame_size: u32) -> std::io::Result<Self> {
        Ok(Self::on(UmemArea::new(rx_frames, tx_frames, frame_size)?))
    }

    /// A UMEM on memory mapped before.
    pub(crate) fn on(area: UmemArea) -> Self {
        let UmemArea {
            map,
            rx_frames,
            tx_frames,
            frame_size,
        } = area;
        Self::from_map(map, rx_frames, tx_frames, frame_size)
    }

    /// Over an existing mapping of `(rx_frames + tx_frames) * frame_size`
    /// bytes (a shared UMEM's memfd, shared.rs).
    pub(crate) fn from_map(map: Mmap, rx_frames: u32, tx_frames: u32, frame_size: u32) -> Self {
        assert!(map.len >= (rx_frames as usize + tx_frames as usize) * frame_size as usize);
        UmemShared {
            map,
            frame_size,
            frame_shift: frame_size.trailing_zeros(),
            rx_frames,
            tx_frames,
            refs: (0..rx_frames).map(|_| AtomicU32::new(0)).collect(),
            recycled: Mutex::new(Recycled {
                bases: Vec::with_capacity(rx_frames as usize),
                credits: 0,
                minters: 0,
            }),
            recycled_any: AtomicBool::new(false),
        }
    }

    /// Bytes of packet memory.
    pub(crate) fn bytes(&self) -> usize {
        self.map.len
    }

    /// RX frame index of `addr` if `addr..addr+len` lies inside one RX
    /// frame; `None` for anything else (a bad descriptor).
    #[inline]
    pub(crate) fn rx_index(&self, addr: u64, len: u32) -> Option<usize> {
        let f = addr >> self.frame_shift;
        if f >= u64::from(self.rx_frames) {
            return None;
        }
        let end = addr.checked_add(u64::from(len))?;
        if end > (f + 1) << self.frame_shift {
            return None;
        }
        Some(f as usize)
    }

    #[inline]
    pub(crate) fn frame_base(&self, addr: u64) -> u64 {
        addr & !(u64::from(self.frame_size) - 1)
    }

    /// Bytes at `addr..addr+len`.
    ///
    /// # Safety
    /// The range must lie inside the mapping, and nobody (kernel included)
    /// may write it while the returned slice lives.
    #[inline]
    pub(crate) unsafe fn slice(&self, addr: u64, len: u32) -> &[u8] {
        debug_assert!(addr + u64::from(len) <= self.map.len as u64);
        // SAFETY: per the contract above.
        unsafe { std::slice::from_raw_parts(self.map.ptr.add(addr as usize), len as usize) }
    }

    /// Writable frame at `base` (`frame_size` bytes).
    ///
    /// # Safety
    /// `base` must be the base of a frame inside the mapping that the
    /// caller owns exclusively (a TX frame off the free list, borrowed
    /// through `&mut XskTx`).
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn frame_mut(&self, base: u64) -> &mut [u8] {
        debug_assert!(base + u64::from(self.frame_size) <= self.map.len as u64);
        // SAFETY: per the contract above.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.map.ptr.add(base as usize),
                self.frame_size as usize,
            )
        }
    }

    fn recycled(&self) -> std::sync::MutexGuard<'_, Recycled> {
        self.recycled.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Give RX frames back (their bases go to the recycle list, and from
    /// there to the fill ring).
    fn recycle(&self, bases: impl IntoIterator<Item = u64>) {
        self.recycled().bases.extend(bases);
        self.recycled_any.store(true, Ordering::Release);
    }

    /// Give RX frames back with `credits` references to the UMEM (`this`
    /// and `credits - 1` more, forgotten by their holders): while a
    /// [`Minter`] is there to use them they stay counted, as credits on the
    /// recycle list (no atomic on the count); else they are dropped.
    fn give_back(this: Arc<Self>, bases: impl IntoIterator<Item = u64>, credits: usize) {
        debug_assert!(credits >= 1);
        let kept = {
            let mut r = this.recycled();
            r.bases.extend(bases);
            let kept = r.minters > 0;
            if kept {
                r.credits += credits;
            }
            kept
        };
        this.recycled_any.store(true, Ordering::Release);
        if kept {
            std::mem::forget(this);
            return;
        }
        for _ in 1..credits {
            // SAFETY: each of the `credits - 1` is a strong count of this
            // allocation whose `Arc` was forgotten (`Recycler::push`);
            // `this` keeps the count above zero until it drops below.
            unsafe { Arc::decrement_strong_count(Arc::as_ptr(&this)) };
        }
    }

    /// A fresh frame just taken off the RX ring: one reference.
    #[inline]
    pub(crate) fn mint(self: &Arc<Self>, idx: usize, addr: u64, len: u32) -> RxFrame {
        self.refs[idx].store(1, Ordering::Relaxed);
        RxFrame {
            repr: Repr::Umem {
                umem: self.clone(),
                addr,
                len,
            },
        }
    }
}

/// The recycle list: frames whose last reference was dropped, waiting for
/// the fill ring.
pub(crate) struct Recycled {
    pub(crate) bases: Vec<u64>,
    /// Strong counts of the UMEM's `Arc` that came back with frames, held
    /// for the [`Minter`]s (their `Arc`s forgotten); only while `minters`
    /// is not zero.
    credits: usize,
    /// Live [`Minter`]s of this UMEM.
    minters: u32,
}

/// A receive ring's maker of [`RxFrame`]s: each frame's reference to the
/// UMEM is a credit that came back with an earlier frame when there is
/// one (the usual case once frames circulate), a fresh clone otherwise.
/// Its credits go back to the recycle list (or are dropped, the last
/// minter gone) when it drops.
pub(crate) struct Minter {
    umem: Arc<UmemShared>,
    credits: usize,
}

impl Minter {
    pub(crate) fn new(umem: &Arc<UmemShared>) -> Minter {
        umem.recycled().minters += 1;
        Minter {
            umem: umem.clone(),
            credits: 0,
        }
    }

    /// A fresh frame just taken off the RX ring: one reference.
    #[inline]
    pub(crate) fn mint(&mut self, idx: usize, addr: u64, len: u32) -> RxFrame {
        if self.credits == 0 {
            return self.umem.mint(idx, addr, len);
        }
        self.credits -= 1;
        // SAFETY: a credit is a strong count of this allocation whose
        // `Arc` was forgotten (`UmemShared::give_back`); it becomes this
        // frame's.
        let umem = unsafe { Arc::from_raw(Arc::as_ptr(&self.umem)) };
        self.umem.refs[idx].store(1, Ordering::Relaxed);
        RxFrame {
            repr: Repr::Umem { umem, addr, len },
        }
    }

    /// Take the credits that came back with the frames being taken off
    /// the recycle list (under its lock).
    #[inline]
    pub(crate) fn collect(&mut self, r: &mut Recycled) {
        self.credits += std::mem::take(&mut r.credits);
    }
}

impl Drop for Minter {
    fn drop(&mut self) {
        let n = {
            let mut r = self.umem.recycled();
            r.minters -= 1;
            if r.minters == 0 {
                // Nobody left to use them: ours and the list's go.
                self.credits + std::mem::take(&mut r.credits)
            } else {
                r.credits += self.credits;
                0
            }
        };
        self.credits = 0;
        for _ in 0..n {
            // SAFETY: each is a strong count of this allocation whose `Arc`
            // was forgotten; `self.umem` keeps the count above zero.
            unsafe { Arc::decrement_strong_count(Arc::as_ptr(&self.umem)) };
        }
    }
}

/// A UMEM: its geometry (the memory itself is reached only through
/// [`RxFrame`] and [`crate::xsk::XskTx`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UmemInfo {
    pub rx_frames: u32,
    pub tx_frames: u32,
    pub frame_size: u32,
    /// Bytes mapped for packets.
    pub bytes: usize,
}

enum Repr {
    Umem {
        umem: Arc<UmemShared>,
        addr: u64,
        len: u32,
    },
    /// Heap bytes (a reassembled datagram, an injected fault, a test).
    Heap(Arc<Vec<u8>>),
    /// A multi-buffer packet: its buffers, in order, in the RX frames
    /// they arrived in (held until the last clone drops).
    Chain(Arc<ChainFrames>),
    /// Nothing: what a frame handed to a [`Recycler`] leaves behind for
    /// its own drop (never seen outside `RxFrame::recycle_into`).
    Gone,
}

/// The RX frames of one multi-buffer packet. Read in place, piece by
/// piece ([`RxFrame::pieces`]); gathered into one copy only for a reader
/// that wants the packet contiguous ([`RxFrame::data`]), once.
pub(crate) struct ChainFrames {
    umem: Arc<UmemShared>,
    /// (address, length) of each buffer, each checked to lie in one RX
    /// frame (`rx_index`).
    pieces: Vec<(u64, u32)>,
    len: usize,
    gathered: std::sync::OnceLock<Vec<u8>>,
}

impl ChainFrames {
    fn piece(&self, i: usize) -> &[u8] {
        let (addr, len) = self.pieces[i];
        // SAFETY: each piece was checked to lie in one RX frame when the
        // chain was made; the chain owns those frames (none is in the fill
        // ring until it drops), so the kernel does not write them; `umem`
        // keeps the mapping alive.
        unsafe { self.umem.slice(addr, len) }
    }
}

impl Drop for ChainFrames {
    fn drop(&mut self) {
        let umem = &self.umem;
        umem.recycle(self.pieces.iter().map(|&(a, _)| umem.frame_base(a)));
    }
}

/// A received packet, owned. Its bytes stay valid and unchanged while any
/// clone lives; dropping the last clone gives the frame back to the
/// kernel (through the fill ring).
pub struct RxFrame {
    repr: Repr,
}

impl RxFrame {
    /// The whole packet (Ethernet header first).
    #[inline]
    pub fn data(&self) -> &[u8] {
        match &self.repr {
            // SAFETY: addr..addr+len was checked to lie in one RX frame when
            // the frame was minted; the frame is not in the fill ring while
            // any RxFrame refers to it (it goes back only when the last one
            // drops), so the kernel does not write it; `umem` keeps the
            // mapping alive.
            Repr::Umem { umem, addr, len } => unsafe { umem.slice(*addr, *len) },
            Repr::Heap(v) => v,
            Repr::Gone => &[],
            Repr::Chain(c) => c.gathered.get_or_init(|| {
                let mut v = Vec::with_capacity(c.len);
                for i in 0..c.pieces.len() {
                    v.extend_from_slice(c.piece(i));
                }
                v
            }),
        }
    }

    /// The packet's first buffer (the whole packet unless it is a chain):
    /// its headers, without gathering a chain.
    #[inline]
    pub fn head(&self) -> &[u8] {
        match &self.repr {
            Repr::Chain(c) => c.piece(0),
            _ => self.data(),
        }
    }

    /// The packet's buffers in order (one unless it is a chain), read in
    /// place.
    pub fn pieces(&self) -> impl Iterator<Item = &[u8]> {
        let (chain, n) = match &self.repr {
            Repr::Chain(c) => (Some(&**c), c.pieces.len()),
            _ => (None, 1),
        };
        (0..n).map(move |i| match chain {
            Some(c) => c.piece(i),
            None => self.data(),
        })
    }

    /// RX frames of the UMEM this packet holds (what it costs the fill
    /// ring while it is queued).
    #[inline]
    pub fn frames(&self) -> usize {
        match &self.repr {
            Repr::Chain(c) => c.pieces.len(),
            _ => 1,
        }
    }

    /// Receive memory this packet pins while it is held: its frames times
    /// the UMEM's frame size (heap bytes: their length).
    #[inline]
    pub fn truesize(&self) -> usize {
        match &self.repr {
            Repr::Umem { umem, .. } => umem.frame_size as usize,
            Repr::Chain(c) => c.pieces.len() * c.umem.frame_size as usize,
            Repr::Heap(v) => v.len(),
            Repr::Gone => 0,
        }
    }

    /// A multi-buffer packet over `pieces` (each at most 3840 bytes), in
    /// a private UMEM of its own: for tests and tools, as `from_vec`.
    pub fn from_pieces(pieces: &[&[u8]]) -> std::io::Result<RxFrame> {
        const FS: u32 = 4096;
        const HEADROOM: usize = 256;
        if pieces.is_empty() || pieces.iter().any(|p| p.len() > FS as usize - HEADROOM) {
            return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
        }
        let umem = Arc::new(UmemShared::new(pieces.len() as u32, 0, FS)?);
        let mut at = Vec::with_capacity(pieces.len());
        for (i, p) in pieces.iter().enumerate() {
            let base = i as u64 * u64::from(FS);
            // SAFETY: a frame of the private UMEM just made; nothing else
            // (no socket, no kernel) refers to it.
            let f = unsafe { umem.frame_mut(base) };
            f[HEADROOM..HEADROOM + p.len()].copy_from_slice(p);
            at.push((base + HEADROOM as u64, p.len() as u32));
        }
        Ok(RxFrame::chain(&umem, at))
    }

    /// A chain over `pieces` of RX frames the caller owns (each checked
    /// with `rx_index`, at least one), handed over to the frame.
    pub(crate) fn chain(umem: &Arc<UmemShared>, pieces: Vec<(u64, u32)>) -> RxFrame {
        debug_assert!(!pieces.is_empty());
        let len = pieces.iter().map(|&(_, l)| l as usize).sum();
        RxFrame {
            repr: Repr::Chain(Arc::new(ChainFrames {
                umem: umem.clone(),
                pieces,
                len,
                gathered: std::sync::OnceLock::new(),
            })),
        }
    }

    #[inline]
    pub fn len(&self) -> usize {
        match &self.repr {
            Repr::Umem { len, .. } => *len as usize,
            Repr::Heap(v) => v.len(),
            Repr::Chain(c) => c.len,
            Repr::Gone => 0,
        }
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A packet of several buffers (AF_XDP multi-buffer), or heap bytes.
    pub fn is_multi_buffer(&self) -> bool {
        matches!(self.repr, Repr::Heap(_) | Repr::Chain(_))
    }

    /// A frame over heap bytes (tests and tools; no UMEM behind it).
    pub fn from_vec(v: Vec<u8>) -> RxFrame {
        RxFrame {
            repr: Repr::Heap(Arc::new(v)),
        }
    }
}

impl Clone for RxFrame {
    /// Another owner of the same bytes (e.g. one per socket of a multicast
    /// group); no copy.
    fn clone(&self) -> RxFrame {
        match &self.repr {
            Repr::Umem { umem, addr, len } => {
                let idx = (*addr >> umem.frame_shift) as usize;
                umem.refs[idx].fetch_add(1, Ordering::Relaxed);
                RxFrame {
                    repr: Repr::Umem {
                        umem: umem.clone(),
                        addr: *addr,
                        len: *len,
                    },
                }
            }
            Repr::Heap(v) => RxFrame {
                repr: Repr::Heap(v.clone()),
            },
            Repr::Chain(c) => RxFrame {
                repr: Repr::Chain(c.clone()),
            },
            Repr::Gone => RxFrame { repr: Repr::Gone },
        }
    }
}

impl RxFrame {
    /// Drop this frame's reference; its frame goes to `batch` (one lock
    /// of the recycle list per batch instead of one per frame: a bulk
    /// receiver drops a frame per segment) if this was the last one. A
    /// chain or heap bytes drop as usual.
    #[inline]
    pub fn recycle_into(mut self, batch: &mut Recycler) {
        if !matches!(self.repr, Repr::Umem { .. }) {
            return;
        }
        if let Repr::Umem { umem, addr, .. } = std::mem::replace(&mut self.repr, Repr::Gone)
            && umem.release_ref(addr)
        {
            batch.push(umem, addr);
        }
    }
}

impl UmemShared {
    /// Drop one reference to the RX frame holding `addr`: true if it was
    /// the last (the frame is free to recycle).
    #[inline]
    fn release_ref(&self, addr: u64) -> bool {
        let r = &self.refs[(addr >> self.frame_shift) as usize];
        // Sole owner (no other clone can appear: cloning needs one): no
        // read-modify-write needed.
        r.load(Ordering::Acquire) == 1 || r.fetch_sub(1, Ordering::AcqRel) == 1
    }
}

impl Drop for RxFrame {
    fn drop(&mut self) {
        if let Repr::Umem { umem, addr, .. } = &self.repr
            && umem.release_ref(*addr)
            && let Repr::Umem { umem, addr, .. } = std::mem::replace(&mut self.repr, Repr::Gone)
        {
            // The last reference: the frame's base and its count go back
            // together.
            let base = umem.frame_base(addr);
            UmemShared::give_back(umem, [base], 1);
        }
    }
}

/// Frames released together ([`RxFrame::recycle_into`]): they go to their
/// UMEM's recycle list in one locked step when the batch fills, changes
/// UMEM, or drops. Lives on the stack (no allocation).
pub struct Recycler {
    /// The UMEM of the frames gathered (one of their references).
    umem: Option<Arc<UmemShared>>,
    /// The other frames' references, their `Arc`s forgotten.
    forgotten: usize,
    bases: [u64; RECYCLE_BATCH],
    n: usize,
}

const RECYCLE_BATCH: usize = 64;

impl Default for Recycler {
    fn default() -> Self {
        Recycler {
            umem: None,
            forgotten: 0,
            bases: [0; RECYCLE_BATCH],
            n: 0,
        }
    }
}

impl Recycler {
    #[inline]
    fn push(&mut self, umem: Arc<UmemShared>, addr: u64) {
        if self.n == RECYCLE_BATCH || self.umem.as_ref().is_some_and(|u| !Arc::ptr_eq(u, &umem)) {
            self.flush();
        }
        self.bases[self.n] = umem.frame_base(addr);
        self.n += 1;
        if self.umem.is_none() {
            self.umem = Some(umem);
        } else {
            // Handed back with the batch (`UmemShared::give_back`).
            std::mem::forget(umem);
            self.forgotten += 1;
        }
    }

    /// No frames gathered since the last flush.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Hand the frames gathered so far to their UMEM.
    pub fn flush(&mut self) {
        if let Some(u) = self.umem.take() {
            let bases = self.bases[..self.n].iter().copied();
            UmemShared::give_back(u, bases, self.forgotten + 1);
        }
        self.n = 0;
        self.forgotten = 0;
    }
}

impl Drop for Recycler {
    fn drop(&mut self) {
        self.flush();
    }
}

impl std::fmt::Debug for RxFrame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RxFrame({} bytes)", self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_clone_recycles_once() {
        let u = Arc::new(UmemShared::new(4, 4, 2048).unwrap());
        let f = u.mint(2, 2 * 2048 + 256, 60);
        assert_eq!(f.len(), 60);
        let g = f.clone();
        let h = g.clone();
        drop(f);
        drop(h);
        assert!(u.recycled.lock().unwrap().bases.is_empty(), "still shared");
        assert_eq!(g.data().len(), 60);
        drop(g);
        assert_eq!(u.recycled.lock().unwrap().bases, vec![2 * 2048]);
    }

    #[test]
    fn a_batch_recycles_its_last_references_once_when_it_ends() {
        let u = Arc::new(UmemShared::new(80, 4, 2048).unwrap());
        let shared = u.mint(1, 2048 + 256, 60);
        let clone = shared.clone();
        let mut b = Recycler::default();
        shared.recycle_into(&mut b);
        assert!(b.is_empty(), "a shared frame is not the batch's");
        for i in 2..70u64 {
            u.mint(i as usize, i * 2048 + 256, 60).recycle_into(&mut b);
        }
        // 64 went in one step when the batch filled; the rest wait.
        assert_eq!(u.recycled.lock().unwrap().bases.len(), 64);
        RxFrame::from_vec(vec![1, 2]).recycle_into(&mut b);
        drop(b);
        let got = std::mem::take(&mut u.recycled.lock().unwrap().bases);
        assert_eq!(got, (2..70u64).map(|i| i * 2048).collect::<Vec<_>>());
        assert_eq!(clone.len(), 60, "a clone keeps its frame");
        drop(clone);
        assert_eq!(u.recycled.lock().unwrap().bases, vec![2048]);
    }

    #[test]
    fn a_chain_is_read_in_place_and_gathered_only_on_demand() {
        let f = RxFrame::from_pieces(&[b"abc", b"d", b"efgh"]).unwrap();
        assert_eq!(f.len(), 8);
        assert_eq!(f.frames(), 3);
        assert_eq!(f.truesize(), 3 * 4096);
        assert_eq!(f.head(), b"abc");
        let p: Vec<&[u8]> = f.pieces().collect();
        assert_eq!(p, [&b"abc"[..], b"d", b"efgh"]);
        assert_eq!(f.data(), b"abcdefgh");
        assert!(RxFrame::from_pieces(&[]).is_err());
        let one = RxFrame::from_vec(b"xyz".to_vec());
        assert_eq!((one.frames(), one.head()), (1, &b"xyz"[..]));
        assert_eq!(one.pieces().collect::<Vec<_>>(), [&b"xyz"[..]]);
    }

    #[test]
    fn descriptors_are_bounded_to_one_rx_frame() {
        let u = UmemShared::new(4, 4, 2048).unwrap();
        assert_eq!(u.rx_index(256, 1500), Some(0));
        assert_eq!(u.rx_index(3 * 2048 + 2000, 48), Some(3));
        assert_eq!(u.rx_index(3 * 2048 + 2000, 49), None, "crosses the frame");
        assert_eq!(u.rx_index(4 * 2048, 10), None, "a TX frame");
        assert_eq!(u.rx_index(u64::MAX - 3, 10), None, "overflow");
        assert_eq!(u.rx_index(1 << 40, 0), None, "outside the UMEM");
    }

    #[test]
    fn frames_outlive_nothing() {
        // The UMEM lives as long as any frame, even after its owner is gone.
        let u = Arc::new(UmemShared::new(2, 2, 2048).unwrap());
        let f = u.mint(1, 2048, 10);
        drop(u);
        assert_eq!(f.data(), &[0u8; 10]);
    }
}
