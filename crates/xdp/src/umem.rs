//! The UMEM (the packet memory shared with the kernel) and the owned
//! received frame, [`RxFrame`].
//!
//! Frames `0..rx_frames` are RX frames: each is either in the fill ring or
//! RX ring (the kernel's), or held by one or more `RxFrame` values (ours).
//! Dropping the last `RxFrame` of a frame puts it on the UMEM's recycle
//! list, from which the receive path refills the fill ring. Every `RxFrame`
//! holds the UMEM alive (an `Arc`), so no frame can outlive the mapping.
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
    /// Frame base addresses whose last reference was dropped.
    pub(crate) recycled: Mutex<Vec<u64>>,
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

impl UmemArea {
    /// Map and populate the memory of a UMEM of this geometry.
    pub fn new(rx_frames: u32, tx_frames: u32, frame_size: u32) -> std::io::Result<UmemArea> {
        let len = (rx_frames as usize + tx_frames as usize) * frame_size as usize;
        Ok(UmemArea {
            map: Mmap::map_umem(len)?,
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
    /// bytes (a shared UMEM's memfd, crate::shared).
    pub(crate) fn from_map(map: Mmap, rx_frames: u32, tx_frames: u32, frame_size: u32) -> Self {
        assert!(map.len >= (rx_frames as usize + tx_frames as usize) * frame_size as usize);
        UmemShared {
            map,
            frame_size,
            frame_shift: frame_size.trailing_zeros(),
            rx_frames,
            tx_frames,
            refs: (0..rx_frames).map(|_| AtomicU32::new(0)).collect(),
            recycled: Mutex::new(Vec::with_capacity(rx_frames as usize)),
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
    /// A multi-buffer (jumbo) packet, gathered from its fragments (their
    /// frames went straight back to the fill ring).
    Heap(Arc<Vec<u8>>),
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
        }
    }

    #[inline]
    pub fn len(&self) -> usize {
        match &self.repr {
            Repr::Umem { len, .. } => *len as usize,
            Repr::Heap(v) => v.len(),
        }
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A packet gathered from several buffers (AF_XDP multi-buffer).
    pub fn is_multi_buffer(&self) -> bool {
        matches!(self.repr, Repr::Heap(_))
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
        }
    }
}

impl Drop for RxFrame {
    fn drop(&mut self) {
        if let Repr::Umem { umem, addr, .. } = &self.repr {
            let idx = (*addr >> umem.frame_shift) as usize;
            let r = &umem.refs[idx];
            // Sole owner (no other clone can appear: cloning needs one):
            // no read-modify-write needed.
            if r.load(Ordering::Acquire) == 1 || r.fetch_sub(1, Ordering::AcqRel) == 1 {
                let base = umem.frame_base(*addr);
                umem.recycled
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(base);
                umem.recycled_any.store(true, Ordering::Release);
            }
        }
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
        assert!(u.recycled.lock().unwrap().is_empty(), "still shared");
        assert_eq!(g.data().len(), 60);
        drop(g);
        assert_eq!(*u.recycled.lock().unwrap(), vec![2 * 2048]);
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
